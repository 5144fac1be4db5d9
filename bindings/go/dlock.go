// Package dlock is a Go package over libdlock, dlock's C library of
// distributed locks over a lock directory (file://), Redis, Redlock,
// PostgreSQL, MariaDB/MySQL, ZooKeeper and etcd. Every rule about locking
// (queues, leases, fencing tokens, the keeper that renews kept locks, what a
// cancelled waiter leaves behind) is the library's: this package only
// carries Go's values and contexts to it and its results back.
//
//	c, err := dlock.Open("redis://127.0.0.1:6379/0")
//	if err != nil { ... }
//	defer c.Close()
//	l, err := c.Acquire(ctx, "nightly-report", dlock.WithTTL(30*time.Second), dlock.Keep())
//	if err != nil { ... }
//	defer l.Release()
//	writeReport(l.Token()) // the resource refuses tokens below the last it saw
//
// # Threads
//
// Calls into libdlock are cgo calls: while one blocks (an Acquire waiting
// for its lock, a Release reaching the store), it occupies an OS thread of
// its own, and the Go scheduler starts another thread for the goroutines
// that can run meanwhile. No runtime.LockOSThread is needed; a program with
// many goroutines blocked in Acquire has as many threads blocked in
// libdlock. One Client's calls are serialised (libdlock requires it): a
// goroutine calling a Client while another's Acquire waits on it queues
// behind it (its context still ends its own wait); use one Client per
// concurrent waiter, as with a database connection. Token, Lost, Err and
// ExpiresAt never wait.
//
// # Lifetimes
//
// Client.Close releases every lock the client still holds and ends a wait in
// flight (with ErrCanceled). A Client that becomes unreachable together with
// all its Locks is closed by a finalizer, so a forgotten Lock is released
// then at the latest; a held Lock keeps its Client reachable.
//
// A process that forks (os/exec does not, syscall.ForkExec execs at once)
// keeps its clients in the parent.
package dlock

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -ldlock
#include <stdlib.h>
#include <dlock.h>
*/
import "C"

import (
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Capability bits of a client's backend (Client.Caps): DLOCK_CAP_* of
// dlock_backend.h, whose numbers are ABI (this package uses dlock.h only).
const (
	CapLease       uint = 1 << 0  // locks expire after their TTL unless renewed
	CapRenew       uint = 1 << 1  // renew resets the lease
	CapFencing     uint = 1 << 2  // tokens strictly increase per name
	CapFIFO        uint = 1 << 3  // waiters are served first come, first served
	CapBlocking    uint = 1 << 4  // the store wakes waiters: no polling
	CapShared      uint = 1 << 5  // Shared()
	CapDeadline    uint = 1 << 6  // waits honour a deadline
	CapHolderDeath uint = 1 << 7  // a dead holder's lock is freed at once
	CapRaise       uint = 1 << 8  // a holder can raise its name's later tokens
	CapCancel      uint = 1 << 9  // waits end when the cancel flag is raised
	CapSemaphore   uint = 1 << 10 // Limit()
	CapElection    uint = 1 << 11 // Campaign, Leader, Observe
)

// Version is the version of the libdlock actually linked, e.g. "0.1.0".
func Version() string { return C.GoString(C.dlock_version()) }

// Client is a connection to one store, or to a list of stores (see Open).
// Its methods may be called from any goroutine; they are serialised.
type Client struct {
	c *client
}

// client is what a Lock refers to, so that the finalizer of the Client the
// user holds can run while nothing else refers to the Client.
type client struct {
	sem     chan struct{} // one token: the right to call libdlock on p
	p       *C.dlock_client
	spare   *C.dlock_cancel // an unraised cancel flag for the next wait; under sem
	backend string
	caps    uint

	mu      sync.Mutex                   // guards the fields below
	closing bool                         // Close began: no new wait starts
	waits   map[*C.dlock_cancel]struct{} // cancel flags of waits in flight
	locks   map[*C.dlock_lock]*lockState
}

// Open opens a client for the store named by uri ("file:///run/myapp/locks",
// "redis://host:6379/0", "postgresql://...", "mysql://...", "zk://...",
// "etcd://...", a Redlock list "redlock://..."; the options are libdlock's,
// docs/uri.md), or several URIs separated by whitespace: each lock is then
// held in every store of the list. The URI is checked before anything is
// contacted.
func Open(uri string) (*Client, error) {
	curi := C.CString(uri)
	defer C.free(unsafe.Pointer(curi))
	var p *C.dlock_client
	rc := C.dlock_client_open(curi, &p)
	if rc != 0 {
		err := newError(rc, C.GoString(C.dlock_errmsg(p)))
		C.dlock_client_close(p)
		return nil, err
	}
	in := &client{
		sem:     make(chan struct{}, 1),
		p:       p,
		backend: C.GoString(C.dlock_client_backend(p)),
		caps:    uint(C.dlock_client_caps(p)),
		waits:   map[*C.dlock_cancel]struct{}{},
		locks:   map[*C.dlock_lock]*lockState{},
	}
	c := &Client{c: in}
	runtime.SetFinalizer(c, func(c *Client) { go c.c.close() })
	return c, nil
}

// Backend is the backend's name, e.g. "file" or "redis".
func (c *Client) Backend() string { return c.c.backend }

// Caps is the backend's capability bits (Cap*).
func (c *Client) Caps() uint { return c.c.caps }

// Close ends a wait in flight on the client (its Acquire fails with
// ErrCanceled), releases every lock the client still holds, and closes the
// connection. Locks of the client must not be used afterwards (their
// Release does nothing). Closing a closed client does nothing.
func (c *Client) Close() error {
	c.c.close()
	runtime.SetFinalizer(c, nil)
	return nil
}

func (in *client) close() {
	in.mu.Lock()
	in.closing = true
	for k := range in.waits {
		C.dlock_cancel_fire(k)
	}
	in.mu.Unlock()
	in.sem <- struct{}{}
	defer func() { <-in.sem }()
	in.mu.Lock()
	p := in.p
	in.p = nil // p is written under sem and mu, read under either
	in.mu.Unlock()
	if p == nil {
		return
	}
	C.dlock_client_close(p)
	C.dlock_cancel_free(in.spare)
	in.spare = nil
	in.mu.Lock()
	for h, s := range in.locks {
		s.gone()
		delete(in.locks, h)
	}
	in.mu.Unlock()
}

// enter takes the client for one call, or gives up when done is closed.
func (in *client) enter(done <-chan struct{}) bool {
	select {
	case in.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case in.sem <- struct{}{}:
		return true
	case <-done:
		return false
	}
}

func (in *client) leave() { <-in.sem }

// fail is the error of rc with the client's detail; under sem.
func (in *client) fail(rc C.int) error {
	return newError(rc, C.GoString(C.dlock_errmsg(in.p)))
}

// errClosed and errReleased are made anew: an *Error is the caller's to keep.
func errClosed() error { return &Error{Code: ErrInval, Detail: "the client is closed"} }

// call runs f on the open client's handle, serialised.
func (in *client) call(f func(p *C.dlock_client) C.int) error {
	in.enter(nil)
	defer in.leave()
	if in.p == nil {
		return errClosed()
	}
	return in.fail(f(in.p))
}

// Ping makes one round trip to the store (ErrNotSup on file://).
func (c *Client) Ping() error {
	return c.c.call(func(p *C.dlock_client) C.int { return C.dlock_client_ping(p) })
}

// Info is what a store knows about one lock name (Client.Inspect). Known
// has a Knows* bit for every field the store filled; the others are zero
// and unknown, not zero.
type Info struct {
	Known     uint
	Held      bool
	Token     uint64        // the holder's fencing token
	Owner     string        // the holder's owner id, or what the store knows it by
	Lease     time.Duration // the holder's lease left
	Waiters   uint64        // clients waiting
	Queue     []string      // the first waiters, in the order they will be served
	LastToken uint64        // the last token granted for the name (0: none yet)
}

// Bits of Info.Known.
const (
	KnowsHeld      = uint(C.DLOCK_KNOWS_HELD)
	KnowsToken     = uint(C.DLOCK_KNOWS_TOKEN)
	KnowsOwner     = uint(C.DLOCK_KNOWS_OWNER)
	KnowsLease     = uint(C.DLOCK_KNOWS_LEASE)
	KnowsWaiters   = uint(C.DLOCK_KNOWS_WAITERS)
	KnowsOrder     = uint(C.DLOCK_KNOWS_ORDER)
	KnowsLastToken = uint(C.DLOCK_KNOWS_LAST_TOKEN)
)

// Inspect reads what the store knows about the lock called name without
// taking, waiting for or changing it (ErrNotSup when the backend cannot).
func (c *Client) Inspect(name string) (Info, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ci C.dlock_info
	err := c.c.call(func(p *C.dlock_client) C.int { return C.dlock_inspect(p, cname, &ci) })
	if err != nil {
		return Info{}, err
	}
	info := Info{
		Known:     uint(ci.known),
		Held:      ci.held != 0,
		Token:     uint64(ci.token),
		Owner:     C.GoString(&ci.owner[0]),
		Lease:     time.Duration(ci.lease_ms) * time.Millisecond,
		Waiters:   uint64(ci.waiters),
		LastToken: uint64(ci.last_token),
	}
	for i := 0; i < int(ci.listed) && i < len(ci.waiter); i++ {
		info.Queue = append(info.Queue, C.GoString(&ci.waiter[i][0]))
	}
	return info, nil
}

// Histogram of durations: Le[k] counts the observations of at most 2^k
// microseconds (cumulative, as Prometheus has them); Count is all of them.
type Histogram struct {
	Count uint64
	Sum   time.Duration
	Le    [C.DLOCK_METRICS_BUCKETS]uint64
}

// Metrics are the counters a client keeps of its own locks since Open.
type Metrics struct {
	Granted, Busy, TimedOut, Failed   uint64 // acquires that reached the store, by result
	Errors                            map[Errno]uint64
	Releases, ReleasesLost            uint64
	Renewals, RenewalFailures, Losses uint64
	Reconnects                        uint64
	Wait, Hold                        Histogram
	raw                               C.dlock_metrics
}

func histogram(h *C.dlock_histogram) Histogram {
	out := Histogram{Count: uint64(h.count), Sum: time.Duration(h.sum_ns)}
	for i := range out.Le {
		out.Le[i] = uint64(h.le[i])
	}
	return out
}

// Metrics reads the client's counters (a snapshot; it never waits for a
// call in flight on the client).
func (c *Client) Metrics() (Metrics, error) {
	var m Metrics
	m.raw.version = C.DLOCK_METRICS_VERSION
	c.c.mu.Lock()
	defer c.c.mu.Unlock()
	// Readable from any thread, also during a call: only the handle's
	// lifetime matters, and close() clears it under mu before freeing it.
	if c.c.p == nil {
		return m, errClosed()
	}
	if rc := C.dlock_client_metrics(c.c.p, &m.raw); rc != 0 {
		return m, newError(rc, "")
	}
	r := &m.raw
	m.Granted, m.Busy, m.TimedOut, m.Failed = uint64(r.granted), uint64(r.busy),
		uint64(r.timed_out), uint64(r.failed)
	m.Errors = map[Errno]uint64{}
	for i := 1; i < len(r.errors); i++ {
		if r.errors[i] != 0 {
			m.Errors[Errno(-i)] = uint64(r.errors[i])
		}
	}
	m.Releases, m.ReleasesLost = uint64(r.releases), uint64(r.releases_lost)
	m.Renewals, m.RenewalFailures = uint64(r.renewals), uint64(r.renewal_failures)
	m.Losses, m.Reconnects = uint64(r.losses), uint64(r.reconnects)
	m.Wait, m.Hold = histogram(&r.wait), histogram(&r.hold)
	return m, nil
}

// Prometheus is the metrics in Prometheus' text format (0.0.4), with labels
// (`service="billing"`, "" for none) on every sample.
func (m *Metrics) Prometheus(labels string) (string, error) {
	var cl *C.char
	if labels != "" {
		cl = C.CString(labels)
		defer C.free(unsafe.Pointer(cl))
	}
	n := C.dlock_metrics_format(&m.raw, cl, nil, 0)
	if n < 0 {
		return "", newError(n, "")
	}
	buf := make([]byte, int(n)+1)
	C.dlock_metrics_format(&m.raw, cl, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return string(buf[:n]), nil
}
