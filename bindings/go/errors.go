package dlock

/*
#include <dlock.h>
*/
import "C"

import "context"

// Errno is a code of libdlock's error table (DLOCK_EINVAL is -1, and so
// on). The Err* values are Errnos: comparable, and matched by errors.Is
// against every error this package returns. Its text is the library's
// (dlock_strerror()).
type Errno int

func (e Errno) Error() string { return C.GoString(C.dlock_strerror(C.int(e))) }

// Name is the code's name in the library, e.g. "DLOCK_EBUSY".
func (e Errno) Name() string { return C.GoString(C.dlock_err_name(C.int(e))) }

// libdlock's error table, by code (include/dlock.h).
const (
	ErrInval     = Errno(C.DLOCK_EINVAL)     // invalid argument
	ErrBadURI    = Errno(C.DLOCK_EBADURI)    // malformed URI
	ErrScheme    = Errno(C.DLOCK_ESCHEME)    // unknown URI scheme
	ErrNoBackend = Errno(C.DLOCK_ENOBACKEND) // backend not built into this library
	ErrConnect   = Errno(C.DLOCK_ECONNECT)   // cannot connect to the store
	ErrAuth      = Errno(C.DLOCK_EAUTH)      // authentication failed
	ErrBusy      = Errno(C.DLOCK_EBUSY)      // lock is held by another owner (Try)
	ErrTimedOut  = Errno(C.DLOCK_ETIMEDOUT)  // the context's deadline passed
	ErrLost      = Errno(C.DLOCK_ELOST)      // lock was lost
	ErrNotOwner  = Errno(C.DLOCK_ENOTOWNER)  // not the owner of the lock
	ErrNotSup    = Errno(C.DLOCK_ENOTSUP)    // operation not supported by this backend
	ErrProto     = Errno(C.DLOCK_EPROTO)     // protocol error
	ErrNoMem     = Errno(C.DLOCK_ENOMEM)     // out of memory
	ErrIO        = Errno(C.DLOCK_EIO)        // input/output error
	ErrAlready   = Errno(C.DLOCK_EALREADY)   // lock already held by this client
	ErrDeadlock  = Errno(C.DLOCK_EDEADLK)    // deadlock detected
	ErrIntr      = Errno(C.DLOCK_EINTR)      // interrupted by a signal
	ErrStore     = Errno(C.DLOCK_ESTORE)     // the store reported an error
	ErrVersion   = Errno(C.DLOCK_EVERSION)   // incompatible ABI version
	ErrExist     = Errno(C.DLOCK_EEXIST)     // already registered
	ErrExpired   = Errno(C.DLOCK_EEXPIRED)   // lease ran out without a confirmed renewal
	ErrCanceled  = Errno(C.DLOCK_ECANCELED)  // the wait was cancelled (the context was)
	ErrMode      = Errno(C.DLOCK_EMODE)      // the name is held in another mode or limit
)

// Error is what a failed call returns: the code, with the detail the
// library gave (dlock_errmsg(), the lost lock's detail). errors.Is(err,
// ErrBusy) compares the code; an acquire ended by its context also matches
// the context's error (context.Canceled, context.DeadlineExceeded).
type Error struct {
	Code   Errno
	Detail string // the library's detail, "" when it gave none
	ctx    error  // the context's error when the context ended the wait
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "dlock: " + e.Code.Error()
	}
	return "dlock: " + e.Detail
}

// Unwrap gives the code, so errors.Is and errors.As reach it.
func (e *Error) Unwrap() error { return e.Code }

// Is matches the context's error as well as the code.
func (e *Error) Is(target error) bool {
	return target == e.Code || (e.ctx != nil && target == e.ctx)
}

func newError(rc C.int, detail string) error {
	if rc == 0 {
		return nil
	}
	return &Error{Code: Errno(rc), Detail: detail}
}

// ctxError makes an acquire's error that its context ended match the
// context's error too. The only deadline an acquire has is its context's,
// which libdlock may see pass a moment before the context's own timer.
func ctxError(err error, ctx context.Context) error {
	e, ok := err.(*Error)
	if !ok {
		return err
	}
	if _, has := ctx.Deadline(); has && e.Code == ErrTimedOut {
		e.ctx = context.DeadlineExceeded
	} else if e.Code == ErrCanceled && ctx.Err() != nil {
		e.ctx = ctx.Err()
	}
	return err
}
