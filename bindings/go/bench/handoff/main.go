// Command handoff measures a handoff as a Go user sees it: release in one
// client to grant in another, the same ping-pong as `dlock bench` (its
// "handoff, ping-pong" row), so that the two compare and the difference is
// the Go package's cost.
//
//	go run ./bench/handoff URI [HANDOFFS [ITERATIONS]]
//
// Two clients, one goroutine each, take turns: the holder waits for the
// other to be about to acquire, holds 1 ms more (it is queued by then),
// stamps t0 and releases; the waiter's Acquire returns at t1; t1 - t0 is
// one sample. First, ITERATIONS uncontended Acquire+Release pairs on one
// client, as `dlock bench --iterations` has them. Every acquire has a 10 s
// deadline (a context.WithTimeout), as `dlock bench --wait deadline` has;
// HANDOFF_BACKGROUND=1 acquires with context.Background() instead.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"dlock.dev/dlock"
)

const hold = time.Millisecond

func report(what string, s []time.Duration) {
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	p := func(q float64) float64 {
		i := int(q * float64(len(s)))
		if i >= len(s) {
			i = len(s) - 1
		}
		return float64(s[i].Nanoseconds()) / 1000
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	fmt.Printf("%-30s n=%-6d p50 %9.1f us  p90 %9.1f us  p99 %9.1f us  mean %9.1f us\n",
		what, len(s), p(0.5), p(0.9), p(0.99), float64(sum.Nanoseconds())/float64(len(s))/1000)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "handoff:", err)
	os.Exit(1)
}

// timeout bounds every wait, so that a lost handoff fails instead of hanging.
const timeout = 10 * time.Second

// noDeadline: acquires with context.Background() (no deadline, no
// goroutine watching the context), to tell the context's cost apart.
var noDeadline = os.Getenv("HANDOFF_BACKGROUND") == "1"

func bounded() (context.Context, context.CancelFunc) {
	if noDeadline {
		return context.Background(), func() {}
	}
	return context.WithTimeout(context.Background(), timeout)
}

func uncontended(uri, name string, n int) []time.Duration {
	c, err := dlock.Open(uri)
	if err != nil {
		fail(err)
	}
	defer c.Close()
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		ctx, cancel := bounded()
		t0 := time.Now()
		l, err := c.Acquire(ctx, name)
		if err != nil {
			fail(err)
		}
		if err := l.Release(); err != nil {
			fail(err)
		}
		out = append(out, time.Since(t0))
		cancel()
	}
	return out
}

func pingPong(uri, name string, n int) []time.Duration {
	var clients [2]*dlock.Client
	for i := range clients {
		c, err := dlock.Open(uri)
		if err != nil {
			fail(err)
		}
		defer c.Close()
		clients[i] = c
	}
	// holds[i]: the other holds the lock; announced[i]: the other is about
	// to acquire it.
	var holds, announced [2]chan struct{}
	for i := range holds {
		holds[i], announced[i] = make(chan struct{}, 1), make(chan struct{}, 1)
	}
	// When the holder released: written before a release, read after the
	// grant it causes (ordered by the store, not by Go: hence atomic).
	base := time.Now()
	var t0 atomic.Int64
	samples := make([]time.Duration, 0, n)
	done := make(chan error, 2)
	run := func(me int) {
		other := 1 - me
		c := clients[me]
		var l *dlock.Lock
		var err error
		acquire := func() (*dlock.Lock, error) {
			ctx, cancel := bounded()
			defer cancel()
			return c.Acquire(ctx, name)
		}
		if me == 0 {
			l, err = acquire()
			if err != nil {
				done <- err
				return
			}
			holds[other] <- struct{}{}
		}
		for k := 0; k < n; k++ {
			if k%2 == me {
				<-announced[me]
				time.Sleep(hold)
				t0.Store(int64(time.Since(base)))
				if err := l.Release(); err != nil {
					done <- err
					return
				}
				l = nil
			} else {
				<-holds[me]
				announced[other] <- struct{}{}
				l, err = acquire()
				if err != nil {
					done <- err
					return
				}
				samples = append(samples, time.Since(base)-time.Duration(t0.Load()))
				holds[other] <- struct{}{}
			}
		}
		if l != nil {
			l.Release()
		}
		done <- nil
	}
	go run(0)
	go run(1)
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			fail(err)
		}
	}
	return samples
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: handoff URI [HANDOFFS [ITERATIONS]]")
		os.Exit(2)
	}
	uri, handoffs, iterations := os.Args[1], 300, 1000
	if len(os.Args) > 2 {
		handoffs, _ = strconv.Atoi(os.Args[2])
	}
	if len(os.Args) > 3 {
		iterations, _ = strconv.Atoi(os.Args[3])
	}
	name := fmt.Sprintf("go-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	report("acquire+release, uncontended", uncontended(uri, name+"-solo", iterations))
	report("handoff, ping-pong", pingPong(uri, name, handoffs))
}
