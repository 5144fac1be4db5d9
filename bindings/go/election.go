package dlock

/*
#include <stdlib.h>
#include <dlock.h>
*/
import "C"

import (
	"context"
	"time"
	"unsafe"
)

// Elections. An election is a name: its leader holds the exclusive lock of
// that name, kept by the client's keeper, and the leader's term is that
// grant's fencing token, so terms strictly increase from leader to leader.
// The leader publishes a value (its address, its id: at most 1024 bytes)
// that anyone may read (Leader) or be told of at each change (Observe).
// Losing leadership is losing the lock: Lost() is closed. Backends without
// elections (no CapElection) refuse them with ErrNotSup. docs/election.md.

// LeaderInfo is who leads an election.
type LeaderInfo struct {
	Known uint          // Knows* bits: what the store told
	Held  bool          // a leader exists
	Term  uint64        // the leader's term (its grant's fencing token)
	Lease time.Duration // the leader's lease left when read
	Owner string        // as Info.Owner
	Value []byte        // the published value (empty: none yet)
	// An observer that cannot read the store: why (the other fields are
	// as last known). nil otherwise.
	Err error
}

func leaderInfo(li *C.dlock_leader_info) LeaderInfo {
	out := LeaderInfo{
		Known: uint(li.known),
		Held:  li.held != 0,
		Term:  uint64(li.term),
		Lease: time.Duration(li.lease_ms) * time.Millisecond,
		Owner: C.GoString(&li.owner[0]),
		Value: C.GoBytes(unsafe.Pointer(&li.value[0]), C.int(li.value_len)),
	}
	if li.err != 0 {
		out.Err = &Error{Code: Errno(li.err), Detail: string(out.Value)}
		out.Value = nil
	}
	return out
}

// cValue is value in C memory (libdlock copies it), nil when empty.
func cValue(value []byte) unsafe.Pointer {
	if len(value) == 0 {
		return nil
	}
	return C.CBytes(value)
}

// Campaign waits (as Acquire: ctx's deadline and cancellation, Try) until
// this client leads the election name, publishes value, and returns the
// leadership as a kept Lock whose Token is the term. Only WithTTL and Try
// apply; other options are ErrInval.
func (c *Client) Campaign(ctx context.Context, name string, value []byte, opts ...Option) (*Lock, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	o.keep = true
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	cv := cValue(value)
	defer C.free(cv)
	return c.take(ctx, &o, []string{name}, func(p *C.dlock_client, co *C.dlock_acquire_opts,
		h **C.dlock_lock) C.int {
		if len(o.names) > 0 {
			return C.DLOCK_EINVAL
		}
		return C.dlock_campaign(p, cname, cv, C.size_t(len(value)), co, h)
	})
}

// Proclaim replaces the value the leader publishes, while it still leads
// (ErrLost otherwise, nothing changed). Observers are told.
func (l *Lock) Proclaim(value []byte) error {
	cv := cValue(value)
	defer C.free(cv)
	h, err := l.held()
	defer l.s.in.leave()
	if err != nil {
		return err
	}
	return l.s.in.fail(C.dlock_proclaim(h, cv, C.size_t(len(value))))
}

// Resign gives up leadership: the lock is released and observers are told,
// so the next candidate leads at once.
func (l *Lock) Resign() error { return l.release(true) }

// Leader reads who leads the election name, without campaigning or
// disturbing it (ErrNotSup without elections).
func (c *Client) Leader(name string) (LeaderInfo, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	li := (*C.dlock_leader_info)(C.calloc(1, C.size_t(unsafe.Sizeof(C.dlock_leader_info{}))))
	defer C.free(unsafe.Pointer(li))
	err := c.c.call(func(p *C.dlock_client) C.int { return C.dlock_leader(p, cname, li) })
	if err != nil {
		return LeaderInfo{}, err
	}
	return leaderInfo(li), nil
}

// observeSlice is how long one wait of an observer's goroutine lasts, so
// that it sees its context end between waits.
const observeSlice = 100

// Observe reports each change of the election name's leader on the
// returned channel: first the current state, then every change libdlock
// reads, in order (changes faster than one read may be seen as one). The
// observer has a connection of its own, and a goroutine that occupies an
// OS thread while it waits for a change; it stops, and the channel is
// closed, when ctx is done. A receiver that falls behind misses nothing
// libdlock still queues (its last 64 changes).
func (c *Client) Observe(ctx context.Context, name string) (<-chan LeaderInfo, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var obs *C.dlock_observer
	err := c.c.call(func(p *C.dlock_client) C.int {
		return C.dlock_observe(p, cname, nil, nil, &obs)
	})
	if err != nil {
		return nil, err
	}
	out := make(chan LeaderInfo)
	go func() {
		defer close(out)
		defer C.dlock_observer_close(obs)
		li := (*C.dlock_leader_info)(C.calloc(1, C.size_t(unsafe.Sizeof(C.dlock_leader_info{}))))
		defer C.free(unsafe.Pointer(li))
		for ctx.Err() == nil {
			rc := C.dlock_observer_next(obs, li, observeSlice)
			if rc == C.DLOCK_EBUSY {
				continue
			}
			if rc != 0 {
				// Not a change: the observer itself failed.
				select {
				case out <- LeaderInfo{Err: newError(rc, "")}:
				case <-ctx.Done():
				}
				return
			}
			select {
			case out <- leaderInfo(li):
			case <-ctx.Done():
			}
		}
	}()
	return out, nil
}
