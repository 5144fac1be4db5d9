package dlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// nextLeader waits for the observer's next report that satisfies ok.
func nextLeader(t *testing.T, ch <-chan LeaderInfo, ok func(LeaderInfo) bool) LeaderInfo {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case li, open := <-ch:
			if !open {
				t.Fatal("the observer stopped")
			}
			if li.Err != nil {
				t.Fatalf("observer: %v", li.Err)
			}
			if ok(li) {
				return li
			}
		case <-timeout:
			t.Fatal("no such report from the observer in 10 s")
		}
	}
}

func TestElection(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a, b, c := openT(t, st.uri), openT(t, st.uri), openT(t, st.uri)
		name := lockName("elect")
		if a.Caps()&CapElection == 0 {
			if _, err := a.Campaign(context.Background(), name, nil, Try()); !errors.Is(err, ErrNotSup) {
				t.Fatalf("Campaign without elections: %v", err)
			}
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		obs, err := c.Observe(ctx, name)
		if err != nil {
			t.Fatalf("Observe: %v", err)
		}
		lead, err := a.Campaign(bounded(t, 10*time.Second), name, []byte("a:1"))
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		li, err := b.Leader(name)
		if err != nil || !li.Held || li.Term != lead.Token() || string(li.Value) != "a:1" {
			t.Fatalf("Leader: %v %+v (term %d)", err, li, lead.Token())
		}
		if err := lead.Proclaim([]byte("a:2")); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		nextLeader(t, obs, func(li LeaderInfo) bool { return string(li.Value) == "a:2" })

		next := make(chan *Lock, 1)
		go func() {
			l, err := b.Campaign(bounded(t, 10*time.Second), name, []byte("b"))
			if err != nil {
				t.Errorf("second Campaign: %v", err)
			}
			next <- l
		}()
		time.Sleep(50 * time.Millisecond)
		if err := lead.Resign(); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		l := <-next
		if l == nil {
			return
		}
		if l.Token() <= lead.Token() {
			t.Fatalf("term %d after %d", l.Token(), lead.Token())
		}
		li = nextLeader(t, obs, func(li LeaderInfo) bool { return li.Term == l.Token() })
		if string(li.Value) != "b" && len(li.Value) != 0 {
			t.Fatalf("the new leader's value: %q", li.Value)
		}
		l.Resign()
		cancel()
		for range obs {
		}
	})
}
