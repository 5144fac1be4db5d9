package dlock

/*
#include <stdint.h>
#include <stdlib.h>
#include <dlock.h>

extern void goDlockLost(dlock_lock *lock, int code, void *user);

// The lock's state travels as an integer handle, never as a Go pointer.
static void dlock_go_set_lost(dlock_acquire_opts *o, uintptr_t state)
{
    o->on_lost = goDlockLost;
    o->on_lost_user = (void *)state;
}
*/
import "C"

import (
	"context"
	"math"
	"runtime/cgo"
	"sync"
	"time"
	"unsafe"
)

// The dlock_acquire_opts version this package fills (modes: shared, limit).
const acquireOptsVersion = 4

// Option is one option of Client.Acquire.
type Option func(*options)

type options struct {
	ttl       time.Duration
	try       bool
	keep      bool
	reentrant bool
	shared    bool
	limit     uint32
	names     []string
}

// WithTTL sets the lease (30 s by default): a holder that neither renews nor
// releases loses the lock after this long, on stores with leases. Whole
// milliseconds, at least one.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// Try makes one attempt: ErrBusy at once if the lock is held.
func Try() Option { return func(o *options) { o.try = true } }

// Keep hands the lease to the client's keeper, which renews (or checks) it
// until Release; Lost() is closed if the keeper reports it lost.
func Keep() Option { return func(o *options) { o.keep = true } }

// Reentrant makes an acquire of a name the client already holds return the
// same grant held once more (one more Release needed) instead of
// ErrAlready.
func Reentrant() Option { return func(o *options) { o.reentrant = true } }

// Names adds more names to the acquire: one lock of all the names, taken
// all or nothing in byte order under one deadline, with a token above every
// token any of them had.
func Names(more ...string) Option {
	return func(o *options) { o.names = append(o.names, more...) }
}

// Shared asks for a shared (reader) hold of a read-write lock: shared holds
// go together and exclude, and are excluded by, exclusive ones.
func Shared() Option { return func(o *options) { o.shared = true } }

// Limit makes the name a counting semaphore: at most n holders at once
// (1 to 65535; exclusive mode only).
func Limit(n uint32) Option { return func(o *options) { o.limit = n } }

// Lock is a held lock, from Client.Acquire.
type Lock struct {
	c *Client // keeps the Client (and its finalizer) away while held
	s *lockState
}

// lockState is one grant; a reentrant acquire returns a new Lock over the
// same state.
type lockState struct {
	in     *client
	mu     sync.RWMutex  // guards h against Release and Close
	h      *C.dlock_lock // nil once released
	token  uint64
	names  []string
	kept   bool
	handle cgo.Handle // on_lost's user pointer, 0 when not kept

	once sync.Once
	lost chan struct{}
	err  error // set before lost is closed
}

func (s *lockState) markLost(code Errno, detail string) {
	s.once.Do(func() {
		s.err = &Error{Code: code, Detail: detail}
		close(s.lost)
	})
}

// gone forgets the handle: released, or freed by the client's close. Once
// libdlock has freed the lock, on_lost is never called again.
func (s *lockState) gone() {
	s.mu.Lock()
	s.h = nil
	s.mu.Unlock()
	if s.handle != 0 {
		s.handle.Delete()
		s.handle = 0
	}
}

// Acquire takes the lock called name (1 to 4096 bytes, no NUL). It waits
// until the lock is granted, or ctx is done: ctx's deadline is the wait's
// deadline (ErrTimedOut), and its cancellation ends the wait through
// libdlock's cancel flag (ErrCanceled), leaving the store's queue as a
// waiter past its deadline leaves it; both errors also match ctx.Err()
// with errors.Is. A grant that reached the client before the wait could be
// withdrawn is kept (check ctx.Err() if a late grant is unwanted).
//
// The calling goroutine's OS thread is blocked in libdlock while it waits.
func (c *Client) Acquire(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	names := append([]string{name}, o.names...)
	cnames := make([]*C.char, len(names))
	for i, n := range names {
		cnames[i] = C.CString(n)
	}
	defer func() {
		for _, p := range cnames {
			C.free(unsafe.Pointer(p))
		}
	}()
	return c.take(ctx, &o, names, func(p *C.dlock_client, co *C.dlock_acquire_opts,
		h **C.dlock_lock) C.int {
		if len(cnames) == 1 {
			return C.dlock_acquire(p, cnames[0], co, h)
		}
		arr := (**C.char)(C.malloc(C.size_t(len(cnames)) * C.size_t(unsafe.Sizeof(cnames[0]))))
		defer C.free(unsafe.Pointer(arr))
		copy(unsafe.Slice(arr, len(cnames)), cnames)
		return C.dlock_acquire_names(p, arr, C.size_t(len(cnames)), co, h)
	})
}

// acquireCall is one of libdlock's acquiring calls with its arguments but
// the options and the result.
type acquireCall func(p *C.dlock_client, co *C.dlock_acquire_opts, h **C.dlock_lock) C.int

// take makes an acquiring call (an acquire, a campaign) with o and ctx as
// libdlock's options, and gives its grant as a Lock.
func (c *Client) take(ctx context.Context, o *options, names []string, call acquireCall) (*Lock, error) {
	in := c.c
	var co C.dlock_acquire_opts
	if rc := C.dlock_acquire_opts_init_version(&co, acquireOptsVersion); rc != 0 {
		return nil, &Error{Code: Errno(rc), Detail: "this libdlock does not know acquire options version 4"}
	}
	if o.ttl != 0 {
		ms := o.ttl.Milliseconds()
		if ms <= 0 || ms > math.MaxUint32 {
			return nil, &Error{Code: ErrInval, Detail: "the TTL must be 1 ms to 49 days"}
		}
		co.ttl_ms = C.uint32_t(ms)
	}
	if o.shared {
		co.mode = C.DLOCK_MODE_SHARED
	}
	co.limit = C.uint32_t(o.limit)
	if o.reentrant {
		co.reentrant = 1
	}
	if err := ctx.Err(); err != nil {
		code := ErrCanceled
		if err == context.DeadlineExceeded {
			code = ErrTimedOut
		}
		return nil, &Error{Code: code, Detail: "the context ended before the acquire", ctx: err}
	}
	if o.try {
		co.wait = C.DLOCK_WAIT_TRY
	} else if dl, ok := ctx.Deadline(); ok {
		co.wait = C.DLOCK_WAIT_DEADLINE
		left := time.Until(dl)
		if left < 0 {
			left = 0
		}
		co.deadline_ns = C.dlock_monotonic_ns() + C.uint64_t(left)
	}
	s := &lockState{in: in, lost: make(chan struct{}), kept: o.keep}
	if o.keep {
		co.keep = 1
		s.handle = cgo.NewHandle(s)
		C.dlock_go_set_lost(&co, C.uintptr_t(s.handle))
	}

	if !in.enter(ctx.Done()) {
		s.gone()
		e := &Error{Code: ErrCanceled, ctx: ctx.Err(),
			Detail: "the wait was cancelled (queued behind another call on this client)"}
		if e.ctx == context.DeadlineExceeded {
			e.Code, e.Detail = ErrTimedOut, "the deadline passed (queued behind another call on this client)"
		}
		return nil, e
	}
	h, err := in.acquire(ctx, &co, call, !o.try)
	if err != nil {
		in.leave()
		s.gone()
		return nil, err
	}
	in.mu.Lock()
	same := in.locks[h]
	if same == nil {
		s.h = h
		s.token = uint64(C.dlock_lock_token(h))
		s.names = names
		if len(names) > 1 {
			s.names = lockNames(h)
		}
		in.locks[h] = s
	}
	in.mu.Unlock()
	in.leave()
	if same != nil {
		// Held once more: libdlock keeps the first grant's on_lost.
		s.gone()
		s = same
	}
	return &Lock{c: c, s: s}, nil
}

func lockNames(h *C.dlock_lock) []string {
	n := int(C.dlock_lock_name_count(h))
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		var ln C.size_t
		p := C.dlock_lock_name_at(h, C.size_t(i), &ln)
		out = append(out, C.GoStringN(p, C.int(ln)))
	}
	return out
}

// acquire makes the call, under sem, with a cancel flag that ctx and Close
// fire when the wait may block.
func (in *client) acquire(ctx context.Context, co *C.dlock_acquire_opts, call acquireCall,
	blocking bool) (*C.dlock_lock, error) {
	if in.p == nil {
		return nil, errClosed()
	}
	var k *C.dlock_cancel
	if blocking && in.caps&CapCancel != 0 {
		if k = in.spare; k != nil {
			in.spare = nil
		} else if rc := C.dlock_cancel_new(&k); rc != 0 {
			return nil, newError(rc, "no cancel flag could be made")
		}
		in.mu.Lock()
		closing := in.closing
		if !closing {
			in.waits[k] = struct{}{}
		}
		in.mu.Unlock()
		if closing {
			in.spare = k
			return nil, errClosed()
		}
		co.cancel = k
	}
	var stop chan struct{}
	var watching sync.WaitGroup
	if k != nil && ctx.Done() != nil {
		stop = make(chan struct{})
		watching.Add(1)
		go func() {
			defer watching.Done()
			select {
			case <-ctx.Done():
				// A deadline is libdlock's own (ErrTimedOut): only a
				// cancellation raises the flag.
				if ctx.Err() != context.DeadlineExceeded {
					C.dlock_cancel_fire(k)
				}
			case <-stop:
			}
		}()
	}
	var h *C.dlock_lock
	rc := call(in.p, co, &h)
	if stop != nil {
		close(stop)
		watching.Wait()
	}
	closing := false
	if k != nil {
		in.mu.Lock()
		delete(in.waits, k)
		closing = in.closing
		in.mu.Unlock()
		if C.dlock_cancel_fired(k) != 0 {
			C.dlock_cancel_free(k) // stays raised: the next wait needs a new one
		} else {
			in.spare = k
		}
	}
	if rc != 0 {
		err := in.fail(rc)
		if Errno(rc) == ErrCanceled && closing && ctx.Err() == nil {
			err.(*Error).Detail = "the wait was cancelled: the client is being closed"
		}
		return nil, ctxError(err, ctx)
	}
	return h, nil
}

// Token is the grant's fencing token: strictly greater than every token
// granted earlier for the name on the store. Pass it to the resource the
// lock protects, which refuses a token below the highest it has seen.
func (l *Lock) Token() uint64 { return l.s.token }

// Name is the lock's name (of a lock of several names, the first in byte
// order); Names is all of them.
func (l *Lock) Name() string { return l.s.names[0] }

// Names is the lock's names, in byte order when more than one.
func (l *Lock) Names() []string { return append([]string(nil), l.s.names...) }

// Lost is closed when the lock is known lost: for a kept lock (Keep), as
// soon as the keeper knows or must assume it (a refused renewal, a lease
// about to end without a confirmed renewal, a session gone); for any lock
// when Renew or Release reports the loss. It is never closed by Release.
func (l *Lock) Lost() <-chan struct{} { return l.s.lost }

// Err is nil until Lost() is closed, then why: an *Error matching ErrLost
// (the store said so) or ErrExpired (the lease ran out unconfirmed), with
// the library's detail.
func (l *Lock) Err() error {
	select {
	case <-l.s.lost:
		return l.s.err
	default:
		return nil
	}
}

// ExpiresAt is the latest instant until which the lock is surely still
// ours (the lease's end as libdlock measures it); the zero Time when the
// store has no lease (file; ZooKeeper until a kept lock's first check) or
// the lock was released; a past instant once the lock is known lost.
func (l *Lock) ExpiresAt() time.Time {
	l.s.mu.RLock()
	defer l.s.mu.RUnlock()
	if l.s.h == nil {
		return time.Time{}
	}
	ns := uint64(C.dlock_lock_expires_ns(l.s.h))
	if ns == math.MaxUint64 {
		return time.Time{}
	}
	now := uint64(C.dlock_monotonic_ns())
	return time.Now().Add(time.Duration(int64(ns - now)))
}

func errReleased() error { return &Error{Code: ErrInval, Detail: "the lock was released"} }

// held enters the lock's client (the caller defers l.s.in.leave(), also
// on an error) and returns the lock's handle, or errReleased once it was
// released.
func (l *Lock) held() (*C.dlock_lock, error) {
	s := l.s
	s.in.enter(nil)
	s.mu.RLock()
	h := s.h
	s.mu.RUnlock()
	if h == nil {
		return nil, errReleased()
	}
	return h, nil
}

// Release releases the lock (one hold of a reentrant lock). ErrLost if it
// was no longer ours: the store was left as it was. Releasing a released
// lock does nothing.
func (l *Lock) Release() error { return l.release(false) }

func (l *Lock) release(resign bool) error {
	s := l.s
	in := s.in
	in.enter(nil)
	defer in.leave()
	s.mu.Lock()
	h := s.h
	if h == nil {
		s.mu.Unlock()
		return nil
	}
	last := resign || C.dlock_lock_holds(h) <= 1
	if last {
		s.h = nil
	}
	s.mu.Unlock()
	var rc C.int
	if resign {
		rc = C.dlock_resign(h)
	} else {
		rc = C.dlock_release(h)
	}
	var err error
	if rc != 0 {
		err = in.fail(rc)
	}
	if last {
		in.mu.Lock()
		delete(in.locks, h)
		in.mu.Unlock()
		s.gone()
	}
	if Errno(rc) == ErrLost || Errno(rc) == ErrExpired {
		s.markLost(Errno(rc), err.(*Error).Detail)
	}
	return err
}

// Renew resets the lease to ttl from now (never adds to what is left, never
// re-creates an expired lock). ErrLost if the lock is no longer ours.
func (l *Lock) Renew(ttl time.Duration) error {
	ms := ttl.Milliseconds()
	if ms <= 0 || ms > math.MaxUint32 {
		return &Error{Code: ErrInval, Detail: "the TTL must be 1 ms to 49 days"}
	}
	s, in := l.s, l.s.in
	h, err := l.held()
	defer in.leave()
	if err != nil {
		return err
	}
	rc := C.dlock_renew(h, C.uint32_t(ms))
	if rc == 0 {
		return nil
	}
	err = in.fail(rc)
	if Errno(rc) == ErrLost || Errno(rc) == ErrExpired {
		s.markLost(Errno(rc), err.(*Error).Detail)
	}
	return err
}
