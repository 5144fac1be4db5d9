package dlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Every code of the library's table has its Err value, with its text.
func TestErrorTable(t *testing.T) {
	mine := map[Errno]bool{}
	for _, e := range []Errno{ErrInval, ErrBadURI, ErrScheme, ErrNoBackend, ErrConnect,
		ErrAuth, ErrBusy, ErrTimedOut, ErrLost, ErrNotOwner, ErrNotSup, ErrProto, ErrNoMem,
		ErrIO, ErrAlready, ErrDeadlock, ErrIntr, ErrStore, ErrVersion, ErrExist, ErrExpired,
		ErrCanceled, ErrMode} {
		mine[e] = true
	}
	n := 0
	for code := -1; Errno(code).Name() != "DLOCK_UNKNOWN"; code-- {
		n++
		if !mine[Errno(code)] {
			t.Errorf("%s (%d) has no Err value", Errno(code).Name(), code)
		}
		if Errno(code).Error() == "unknown error" {
			t.Errorf("%d has no text", code)
		}
	}
	if n != len(mine) {
		t.Errorf("the library has %d codes, the package %d", n, len(mine))
	}
	_, err := Open("nosuch://x")
	var e *Error
	if !errors.Is(err, ErrScheme) || !errors.As(err, &e) || e.Detail == "" {
		t.Fatalf("Open(nosuch://x) = %v, want ErrScheme with a detail", err)
	}
	if errors.Is(err, ErrBusy) {
		t.Fatal("ErrScheme matches ErrBusy")
	}
}

func TestTryBusy(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a, b := openT(t, st.uri), openT(t, st.uri)
		name := lockName("try")
		l := mustAcquire(t, a, name, Try())
		if l.Name() != name || l.Token() == 0 {
			t.Fatalf("name %q token %d", l.Name(), l.Token())
		}
		_, err := b.Acquire(context.Background(), name, Try())
		var e *Error
		if !errors.Is(err, ErrBusy) || !errors.As(err, &e) || e.Code != ErrBusy {
			t.Fatalf("second Try: %v, want ErrBusy", err)
		}
		if _, err := a.Acquire(context.Background(), name, Try()); !errors.Is(err, ErrAlready) {
			t.Fatalf("same client again: %v, want ErrAlready", err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		l2 := mustAcquire(t, b, name, Try())
		if l2.Token() <= l.Token() {
			t.Fatalf("token %d after %d", l2.Token(), l.Token())
		}
		l2.Release()
	})
}

// Goroutines of three clients take turns; nobody is ever inside twice and
// tokens strictly increase in grant order.
func TestExclusionGoroutines(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		name := lockName("excl")
		var inside atomic.Int32
		var mu sync.Mutex
		var tokens []uint64
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for i := 0; i < 3; i++ {
			c := openT(t, st.uri)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 8; j++ {
					l, err := c.Acquire(bounded(t, 20*time.Second), name)
					if err != nil {
						errs <- err
						return
					}
					if !inside.CompareAndSwap(0, 1) {
						errs <- fmt.Errorf("two holders at once")
					}
					mu.Lock()
					tokens = append(tokens, l.Token())
					mu.Unlock()
					time.Sleep(time.Millisecond)
					inside.Store(0)
					if err := l.Release(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		checkIncreasing(t, tokens)
	})
}

func checkIncreasing(t *testing.T, tokens []uint64) {
	t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d (grant %d of %v)", tokens[i], tokens[i-1], i, tokens)
		}
	}
}

// Three processes (this test binary run again) take turns.
func TestExclusionProcesses(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		out := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(out, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		name := lockName("proc")
		var cmds []*exec.Cmd
		for i := 0; i < 3; i++ {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "DLOCK_GO_CHILD=exclusion", "DLOCK_GO_URI="+st.uri,
				"DLOCK_GO_NAME="+name, "DLOCK_GO_OUT="+out)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, cmd)
		}
		for _, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("child: %v", err)
			}
		}
		data, _ := os.ReadFile(out)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != 30 {
			t.Fatalf("%d lines, want 30:\n%s", len(lines), data)
		}
		var tokens []uint64
		for i := 0; i < len(lines); i += 2 {
			s, e := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if s[0] != "s" || e[0] != "e" || s[1] != e[1] || s[2] != e[2] {
				t.Fatalf("overlap at line %d:\n%s", i+1, data)
			}
			tok, _ := strconv.ParseUint(s[2], 10, 64)
			tokens = append(tokens, tok)
		}
		checkIncreasing(t, tokens)
	})
}

// A context's cancellation ends the wait with ErrCanceled (and
// context.Canceled); its deadline with ErrTimedOut (and
// context.DeadlineExceeded); the waiter leaves nothing behind.
func TestContext(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a, b := openT(t, st.uri), openT(t, st.uri)
		name := lockName("ctx")
		l := mustAcquire(t, a, name)

		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		t0 := time.Now()
		_, err := b.Acquire(ctx, name)
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v", err)
		}
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("the cancel took %v", d)
		}

		ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		t0 = time.Now()
		_, err = b.Acquire(ctx, name)
		if !errors.Is(err, ErrTimedOut) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("deadline: %v", err)
		}
		if d := time.Since(t0); d < 150*time.Millisecond || d > 3*time.Second {
			t.Fatalf("the deadline took %v", d)
		}
		if _, err := b.Acquire(ctx, name); !errors.Is(err, ErrTimedOut) {
			t.Fatalf("past deadline: %v", err)
		}

		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		l2 := mustAcquire(t, b, name, Try())
		l2.Release()
	})
}

func TestLeaseInspectMetrics(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a := openT(t, st.uri)
		name := lockName("lease")
		l := mustAcquire(t, a, name, WithTTL(5*time.Second))
		exp := l.ExpiresAt()
		if a.Caps()&CapLease != 0 {
			if left := time.Until(exp); left <= 0 || left > 5100*time.Millisecond {
				t.Fatalf("ExpiresAt in %v", left)
			}
		}
		if err := l.Renew(5 * time.Second); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		info, err := a.Inspect(name)
		switch {
		case errors.Is(err, ErrNotSup):
		case err != nil:
			t.Fatalf("Inspect: %v", err)
		default:
			if info.Known&KnowsHeld != 0 && !info.Held {
				t.Fatalf("Inspect: not held: %+v", info)
			}
			if info.Known&KnowsToken != 0 && info.Token != l.Token() {
				t.Fatalf("Inspect: token %d, lock's %d", info.Token, l.Token())
			}
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if err := l.Renew(time.Second); !errors.Is(err, ErrInval) {
			t.Fatalf("Renew after Release: %v", err)
		}
		m, err := a.Metrics()
		if err != nil || m.Granted != 1 || m.Releases != 1 || m.Wait.Count != 1 {
			t.Fatalf("Metrics: %v %+v", err, m)
		}
		text, err := m.Prometheus(`service="test"`)
		if err != nil || !strings.Contains(text, "dlock_") || !strings.Contains(text, `service="test"`) {
			t.Fatalf("Prometheus: %v\n%s", err, text)
		}
	})
}

func TestModes(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a, b, c := openT(t, st.uri), openT(t, st.uri), openT(t, st.uri)
		n1, n2 := lockName("names-b"), lockName("names-a")
		l := mustAcquire(t, a, n1, Names(n2))
		if got := l.Names(); len(got) != 2 || got[0] != n2 || got[1] != n1 {
			t.Fatalf("Names: %v", got)
		}
		if _, err := b.Acquire(context.Background(), n2, Try()); !errors.Is(err, ErrBusy) {
			t.Fatalf("one of the names: %v", err)
		}
		l.Release()

		r1 := mustAcquire(t, a, n1, Reentrant())
		r2 := mustAcquire(t, a, n1, Reentrant())
		if r1.Token() != r2.Token() {
			t.Fatalf("reentrant tokens %d %d", r1.Token(), r2.Token())
		}
		r2.Release()
		if _, err := b.Acquire(context.Background(), n1, Try()); !errors.Is(err, ErrBusy) {
			t.Fatalf("held once more: %v", err)
		}
		r1.Release()
		mustAcquire(t, b, n1, Try()).Release()

		if a.Caps()&CapShared != 0 {
			name := lockName("shared")
			s1 := mustAcquire(t, a, name, Shared(), Try())
			s2 := mustAcquire(t, b, name, Shared(), Try())
			if _, err := c.Acquire(context.Background(), name, Try()); !errors.Is(err, ErrBusy) {
				t.Fatalf("exclusive beside shared: %v", err)
			}
			s1.Release()
			s2.Release()
		}
		if a.Caps()&CapSemaphore != 0 {
			name := lockName("sem")
			s1 := mustAcquire(t, a, name, Limit(2), Try())
			s2 := mustAcquire(t, b, name, Limit(2), Try())
			if _, err := c.Acquire(context.Background(), name, Limit(2), Try()); !errors.Is(err, ErrBusy) {
				t.Fatalf("third permit: %v", err)
			}
			if _, err := c.Acquire(context.Background(), name, Limit(3), Try()); !errors.Is(err, ErrMode) {
				t.Fatalf("another limit: %v", err)
			}
			s1.Release()
			s2.Release()
		}
	})
}

// Close releases what the client holds and ends its wait in flight.
func TestClose(t *testing.T) {
	forStores(t, func(t *testing.T, st store) {
		a, b := openT(t, st.uri), openT(t, st.uri)
		name := lockName("close")
		l := mustAcquire(t, a, name)
		done := make(chan error, 1)
		go func() {
			_, err := b.Acquire(context.Background(), name)
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		b.Close()
		select {
		case err := <-done:
			if !errors.Is(err, ErrCanceled) && !errors.Is(err, ErrInval) {
				t.Fatalf("wait ended by Close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not end the wait")
		}
		a.Close()
		if err := l.Release(); err != nil {
			t.Fatalf("Release after Close: %v", err)
		}
		c := openT(t, st.uri)
		mustAcquire(t, c, name, Try()).Release()
	})
}

// A kept lock whose store goes silent (a blackholed loopback proxy) is
// reported lost before its lease ends (ZooKeeper: its session's).
func TestLostSilentNetwork(t *testing.T) {
	for _, st := range stores() {
		st := st
		if st.label == "file" || st.label == "redlock" {
			continue // no network; five servers (redis covers its keeper)
		}
		t.Run(st.label, func(t *testing.T) {
			if st.uri == "" {
				if os.Getenv("DLOCK_STORES_REQUIRED") == "1" {
					t.Fatalf("%s must be set", st.env)
				}
				t.Skipf("%s is not set", st.env)
			}
			// The store's loopback host:port (rediss:// names localhost,
			// which its certificate shares with 127.0.0.1).
			at := strings.Index(st.uri, "127.0.0.1:")
			if at < 0 {
				at = strings.Index(st.uri, "localhost:")
			}
			end := -1
			if at >= 0 {
				end = strings.IndexByte(st.uri[at:], '/')
			}
			if at < 0 || end < 0 {
				t.Fatalf("no 127.0.0.1:port or localhost:port in %s", st.label)
			}
			target := st.uri[at : at+end]
			p := newProxy(t, target)
			uri := st.uri[:at] + p.addr() + st.uri[at+end:]
			a := openT(t, uri)
			l := mustAcquire(t, a, lockName("silent"), Keep(), WithTTL(1500*time.Millisecond))
			select {
			case <-l.Lost():
				t.Fatalf("lost before the cut: %v", l.Err())
			case <-time.After(600 * time.Millisecond): // a first renewal or check
			}
			if l.Err() != nil {
				t.Fatal("Err before Lost")
			}
			p.hole.Store(true)
			// Nothing is confirmed from now on: the lease ends here.
			leaseEnd := l.ExpiresAt()
			select {
			case <-l.Lost():
			case <-time.After(10 * time.Second):
				t.Fatal("Lost() not closed 10 s after the cut")
			}
			// ZooKeeper's lease end is the session's, as libdlock last dated
			// it: at its checks, every 500 ms (DLOCK_KEEP_CHECK_MAX_MS), so
			// read at the cut it may be a check behind the one reported on.
			if st.label == "zookeeper" && !leaseEnd.IsZero() {
				leaseEnd = leaseEnd.Add(500 * time.Millisecond)
			}
			if now := time.Now(); !leaseEnd.IsZero() && now.After(leaseEnd) {
				t.Fatalf("reported %v after the lease end", now.Sub(leaseEnd))
			}
			if err := l.Err(); !errors.Is(err, ErrExpired) && !errors.Is(err, ErrLost) {
				t.Fatalf("Err: %v", err)
			}
			if !l.ExpiresAt().IsZero() && l.ExpiresAt().After(time.Now()) {
				t.Fatalf("ExpiresAt %v after the loss", l.ExpiresAt())
			}
			t0 := time.Now()
			l.Release()
			if d := time.Since(t0); d > 2*time.Second {
				t.Fatalf("Release of a lost lock took %v", d)
			}
		})
	}
}

// A process stopped past its lease learns the loss when it resumes, and
// the store gave the lock to another meanwhile with a higher token.
func TestLostPaused(t *testing.T) {
	st := stores()[1]
	if st.uri == "" {
		if os.Getenv("DLOCK_STORES_REQUIRED") == "1" {
			t.Fatalf("%s must be set", st.env)
		}
		t.Skipf("%s is not set", st.env)
	}
	name := lockName("pause")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DLOCK_GO_CHILD=pause", "DLOCK_GO_URI="+st.uri,
		"DLOCK_GO_NAME="+name)
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "held ") {
		t.Fatalf("child: %q", lines.Text())
	}
	childToken, _ := strconv.ParseUint(strings.TrimPrefix(lines.Text(), "held "), 10, 64)
	cmd.Process.Signal(syscall.SIGSTOP)
	a := openT(t, st.uri)
	l, err := a.Acquire(bounded(t, 5*time.Second), name)
	cmd.Process.Signal(syscall.SIGCONT)
	if err != nil {
		t.Fatalf("acquire while the holder is stopped: %v", err)
	}
	if l.Token() <= childToken {
		t.Fatalf("token %d after the stopped holder's %d", l.Token(), childToken)
	}
	if !lines.Scan() || lines.Text() != "lost DLOCK_EEXPIRED" && lines.Text() != "lost DLOCK_ELOST" {
		t.Fatalf("child after resuming: %q", lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// A client dropped with its locks is closed by its finalizer: the locks do
// not outlive it.
func TestFinalizerReleases(t *testing.T) {
	uri := stores()[0].uri
	name := lockName("gc")
	func() {
		c, err := Open(uri)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Acquire(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}()
	b := openT(t, uri)
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		l, err := b.Acquire(context.Background(), name, Try())
		if err == nil {
			l.Release()
			return
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("the dropped client's lock: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A goroutine queued behind another's wait on the same client is ended by
// its own context.
func TestQueuedOnClient(t *testing.T) {
	uri := stores()[0].uri
	a, b := openT(t, uri), openT(t, uri)
	name := lockName("queued")
	l := mustAcquire(t, a, name)
	defer l.Release()
	waiting := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := b.Acquire(ctx, name)
		waiting <- err
	}()
	time.Sleep(50 * time.Millisecond)
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	if _, err := b.Acquire(dctx, lockName("other")); !errors.Is(err, ErrTimedOut) ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued past its deadline: %v", err)
	}
	cancel()
	if err := <-waiting; !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the wait: %v", err)
	}
}
