"""Client, Lock and Cancel over libdlock's handles.

libdlock requires one client's calls (and its locks') to be serialised;
ctypes lets go of the GIL during every call, so each Client serialises them
itself with a mutex. The calls libdlock allows from any thread at any time
(token, name, lost, cancel fire) do not take it. Nothing about locking is
decided here: every rule is libdlock's.

Each wait on a backend that can cancel runs with a flag of the client's own
(an internal Cancel, linked to the caller's cancel= if any), so that close()
and the exit hook can end a wait in flight: otherwise they would wait for the
mutex that the wait holds, for ever. A child made by fork() shares the
parent's connections, lock files and sessions, so its inherited clients are
disowned there and never reach libdlock again: closing one would release the
parent's locks.
"""

import atexit
import collections
import ctypes
import math
import os
import sys
import threading
import time
import weakref

from . import _errors, _lib
from ._errors import error
from ._lib import lib

_DEFAULT_TTL = 30.0

_errno = {cls.__name__: code for code, cls in _errors.by_errno.items()}
_EINVAL = _errno["EINVAL"]
_ECANCELED = _errno["ECANCELED"]
_EBUSY = _errno["EBUSY"]
_ENOTSUP = _errno["ENOTSUP"]

# Deadlines are nanoseconds on CLOCK_MONOTONIC in a uint64; libdlock's
# arithmetic on them is signed in places, so anything from 2^63 on means
# never (some 292 years of uptime).
_NEVER_NS = 2**63
_TTL_MAX_MS = 2**32 - 1

# How often an acquire queued behind another call on its client looks at
# its cancel= flag. The mutex cannot also wait for the flag's descriptor,
# and a fire() from a signal handler cannot safely notify a condition.
_QUEUED_POLL_S = 0.05

# At exit, how long the hook waits for the calls it cancelled to return.
_EXIT_GRACE_S = 5.0

# An observer's wait for a change is cut in slices this long, so that
# close() from another thread and Ctrl-C are seen between them.
_OBSERVE_SLICE_MS = 100


def monotonic():
    """Now on the clock every dlock deadline uses (CLOCK_MONOTONIC), in
    seconds: the same clock as time.monotonic() on Linux."""
    return lib.dlock_monotonic_ns() / 1e9


def _encode_name(name):
    if isinstance(name, str):
        name = name.encode("utf-8")
    elif not isinstance(name, (bytes, bytearray)):
        raise TypeError("a lock name is str or bytes, not {}".format(type(name).__name__))
    name = bytes(name)
    if not name or len(name) > _lib.NAME_MAX or b"\0" in name:
        raise ValueError("a lock name is 1 to {} bytes without NUL".format(_lib.NAME_MAX))
    return name


def _decode(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def _encode_value(value):
    """A leader's value as bytes: str as UTF-8. Its length is libdlock's to
    check (dlock.EINVAL over 1024 bytes)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError("a leader's value is bytes or str, not {}".format(type(value).__name__))


def _check_elections():
    if not _lib.ELECTION:
        raise error(_ENOTSUP, "the libdlock at {} has no elections (too old for them)"
                    .format(getattr(lib, "_name", "?")))


Leader = collections.namedtuple("Leader", "name held value term lease owner error")
Leader.__doc__ = """Who leads an election (Client.leader(), an Observer's changes).

name    the election's name (str, or bytes if it is not UTF-8)
held    True while a leader exists
value   the leader's published value (bytes; b"" for none, or not yet published)
term    the leader's term (its grant's fencing token); 0 without a leader
lease   the leader's lease left when read, seconds; None where unknown
owner   the leader's owner id (32 hex digits) where the store keeps it, or None
error   observers only: a dlock.DlockError when the store could not be read
        (held, term, lease and owner are then as last known); None otherwise
"""

_VALUE_OFFSET = _lib.LeaderInfo.value.offset


def _leader(name, info):
    n = min(info.value_len, _lib.VALUE_MAX)
    # The bytes themselves: .value would stop at a NUL.
    raw = ctypes.string_at(ctypes.addressof(info) + _VALUE_OFFSET, n)
    err = None
    if info.err:
        err = error(info.err, raw.decode("utf-8", "replace") or None)
        raw = b""
    held = bool(info.held)
    return Leader(name=name, held=held, value=raw, term=info.term if held else 0,
                  lease=info.lease_ms / 1000.0 if held and info.known & _lib.KNOWS_LEASE
                  else None,
                  owner=info.owner.decode("utf-8", "replace")
                  if held and info.known & _lib.KNOWS_OWNER else None,
                  error=err)


def _ttl_ms(ttl):
    if ttl is None:
        ttl = _DEFAULT_TTL
    ttl = float(ttl)
    if math.isnan(ttl) or ttl <= 0:
        raise ValueError("ttl is seconds, more than 0 (got {!r})".format(ttl))
    # Compared before rounding: round(inf) raises, and a uint32 field
    # would silently wrap a larger value.
    if ttl * 1000 >= _TTL_MAX_MS + 0.5:
        raise error(_EINVAL, "ttl {!r} s is beyond libdlock's 2^32-1 ms (about 49.7 days)"
                    .format(ttl))
    ms = round(ttl * 1000)
    if ms <= 0:
        raise ValueError("ttl is seconds, at least 1 ms (got {!r})".format(ttl))
    return ms


def _limit(shared, limit):
    """The request's (mode, limit): a limit is a count, checked here because
    the C field would silently wrap a larger one."""
    mode = _lib.MODE_SHARED if shared else _lib.MODE_EXCLUSIVE
    if limit is None:
        return mode, 0
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _lib.LIMIT_MAX:
        raise error(_EINVAL, "limit is a count of 1 to {} (None: a read-write lock), not {!r}"
                    .format(_lib.LIMIT_MAX, limit))
    return mode, limit


def _known(s, out):
    """The token, owner and lease of a dlock_info or dlock_holder into out,
    those the store filled (s.known)."""
    k = s.known
    if k & _lib.KNOWS_TOKEN:
        out["token"] = s.token
    if k & _lib.KNOWS_OWNER:
        out["owner"] = s.owner.decode("utf-8", "replace")
    if k & _lib.KNOWS_LEASE:
        out["lease"] = s.lease_ms / 1000.0
    return out


def _holder(h):
    """One dlock_holder as a dict of the keys the store filled."""
    out = {}
    if h.known & _lib.KNOWS_MODE:
        out["mode"] = "shared" if h.mode == _lib.MODE_SHARED else "exclusive"
        out["limit"] = h.limit
    return _known(h, out)


def _deadline_ns(timeout, deadline):
    """The deadline for opts.deadline_ns, or None for a wait without end (a
    deadline at or past 2^63 ns: a uint64 must not wrap to a near one)."""
    if timeout is not None:
        timeout = float(timeout)
        if math.isnan(timeout) or timeout < 0:
            raise ValueError("timeout must be >= 0 (None waits forever)")
        now = lib.dlock_monotonic_ns()
        if timeout * 1e9 >= _NEVER_NS - now:
            return None
        return now + round(timeout * 1e9)
    deadline = float(deadline)
    if math.isnan(deadline):
        raise ValueError("deadline must be a number")
    if deadline * 1e9 >= _NEVER_NS:
        return None
    return max(0, round(deadline * 1e9))


def _forked_error():
    return error(_EINVAL, "this client belongs to the parent process (inherited through "
                          "fork()); open a new client in the child")


_cancels = weakref.WeakSet()  # every Cancel, for the fork hook


class Cancel:
    """A flag that cancels the waits it is passed to (cancel=) when fired.

    fire() may be called from any thread, also while another thread waits
    with it; the wait then raises dlock.ECANCELED. (From a signal handler it
    only ends waits on threads other than the main one: see the README.)
    Once fired it stays fired: make a new Cancel for the next wait. One
    Cancel may cancel several waits at once, of any clients.
    """

    def __init__(self):
        self._p = None
        # Reentrant: fire() from a signal handler runs on the main thread,
        # maybe while that thread is inside close() or a link below. Every
        # use of _p is under it, so close() waits for a fire() in progress
        # and a fire() after close() finds nothing to fire.
        self._mu = threading.RLock()
        self._users = 0
        self._closing = False
        self._links = set()  # internal Cancels of the waits using this one
        p = ctypes.c_void_p()
        rc = lib.dlock_cancel_new(ctypes.byref(p))
        if rc:
            raise error(rc)
        self._p = p.value
        _cancels.add(self)

    def fire(self):
        """Raises the flag; harmless when raised already, or closed."""
        with self._mu:
            if self._p:
                lib.dlock_cancel_fire(self._p)
            for k in tuple(self._links):
                k.fire()

    @property
    def fired(self):
        """True once fire() was called (False once closed)."""
        with self._mu:
            return bool(self._p) and lib.dlock_cancel_fired(self._p) == 1

    def _use(self):
        with self._mu:
            if not self._p:
                raise ValueError("this Cancel was closed")
            self._users += 1
            return self._p

    def _done(self):
        with self._mu:
            self._users -= 1
            if self._closing and self._users == 0:
                self._free()

    def _link(self, k):
        # k, a client's own flag for one wait, is fired with this one; at
        # once if this one is fired already (the wait must not start).
        with self._mu:
            self._links.add(k)
            if self._p and lib.dlock_cancel_fired(self._p):
                k.fire()

    def _unlink(self, k):
        with self._mu:
            self._links.discard(k)

    def _free(self):
        with self._mu:
            p, self._p = self._p, None
            if p:
                lib.dlock_cancel_free(p)

    def _after_fork(self):
        # In the child: a parent's thread may have held the mutex, and the
        # links are the parent's waits (their eventfds are shared with the
        # parent: firing one here would cancel the parent's wait).
        self._mu = threading.RLock()
        self._links = set()
        self._users = 0
        if self._closing:
            self._free()

    def close(self):
        """Frees the flag now, or when the last wait using it ends."""
        with self._mu:
            self._closing = True
            if self._users == 0:
                self._free()

    def __del__(self):
        # No wait can be using it: each holds a reference while it runs.
        if getattr(self, "_p", None):
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Lock:
    """A held lock. Released by release(), by leaving its `with` block, or
    by closing its client.

    .token   fencing token (int): pass it to the resource you protect
    .name    the name (str, or bytes if it is not UTF-8); for a lock of several
             names, the first in byte order (all are in .names)
    .lost    True once the kept lock is known lost (keep=True only)
    .held    True until released
    .mode    "exclusive" or "shared"
    .limit   the semaphore's limit, 0 for a read-write lock
    """

    def __init__(self, client, on_lost):
        self._client = client
        self._h = None
        self._user_on_lost = on_lost
        self._callbacks = []  # CFUNCTYPE objects: must live as long as the C lock
        self._guard = threading.Lock()  # handle vs. readers from other threads
        self.token = 0
        self.name = None
        self.names = ()
        self.kept = False
        self.mode = "exclusive"
        self.limit = 0

    def _fill(self, h, kept, single, opts):
        self._h = h
        self.kept = kept
        self.token = lib.dlock_lock_token(h)
        # As asked: a grant is always of the mode and limit requested.
        self.mode = "shared" if opts.mode == _lib.MODE_SHARED else "exclusive"
        self.limit = opts.limit
        if single is not None:
            # The name asked for: three foreign calls fewer per acquire.
            self.names = (single,)
            self.name = single
            return
        names = []
        n = lib.dlock_lock_name_count(h)
        for i in range(n):
            ln = ctypes.c_size_t()
            p = lib.dlock_lock_name_at(h, i, ctypes.byref(ln))
            names.append(_decode(ctypes.string_at(p, ln.value)))
        self.names = tuple(names)
        self.name = names[0] if names else None

    def _lost_cb(self, h, err, _user):
        # On a keeper thread: must return quickly and must not release. The
        # handle is valid for the callback's duration (libdlock lets it read
        # the lock), whatever a release on another thread is doing.
        # An exception fn raises stops at ctypes, which reports it through
        # sys.unraisablehook: nothing unwinds into the keeper.
        fn = self._user_on_lost
        if fn is None:
            return
        detail = lib.dlock_lock_lost_detail(h).decode("utf-8", "replace")
        fn(self, error(err, detail or None))

    @property
    def held(self):
        return self._h is not None

    @property
    def lost(self):
        with self._guard:
            h = self._h
            return bool(h) and lib.dlock_lock_lost(h) != 0

    @property
    def lost_error(self):
        """The error the loss was reported with (dlock.ELOST or
        dlock.EEXPIRED, with libdlock's detail), or None while not known lost."""
        with self._guard:
            h = self._h
            if not h:
                return None
            rc = lib.dlock_lock_lost(h)
            if rc == 0:
                return None
            return error(rc, lib.dlock_lock_lost_detail(h).decode("utf-8", "replace") or None)

    @property
    def expires(self):
        """Until when (dlock.monotonic() seconds) the lock is surely still
        ours; float('inf') on stores without leases (file; ZooKeeper until
        a kept lock's first check dates its session's lease), 0.0 once
        known lost."""
        with self._guard:
            h = self._h
            if not h:
                return 0.0
            ns = lib.dlock_lock_expires_ns(h)
        return float("inf") if ns == 2**64 - 1 else ns / 1e9

    @property
    def holds(self):
        """How many times this client holds the lock (reentrant=True)."""
        if self._client._forked:
            return 0
        with self._client._mu:
            return lib.dlock_lock_holds(self._h) if self._h else 0

    @property
    def owner(self):
        """This grant's owner id (32 hex digits), as inspect() names holders."""
        if self._client._forked:
            return None
        with self._client._mu:
            if not self._h:
                return None
            o = lib.dlock_lock_owner(self._h)
            return o.decode() if o else None

    def lost_fd(self):
        """A descriptor that becomes readable when the kept lock is lost, for
        select/poll/event loops. Owned by the lock: do not read or close it;
        it is closed by release()."""
        if self._client._forked:
            raise _forked_error()
        with self._guard:
            if not self._h:
                raise error(-1, "the lock was released")
            rc = lib.dlock_lock_lost_fd(self._h)
        if rc < 0:
            raise error(rc)
        return rc

    def release(self):
        """Releases the lock (one hold of a reentrant lock). Raises
        dlock.ELOST if it was no longer ours: the store was not changed then.
        Releasing a lock that is already released does nothing."""
        self._release(lib.dlock_release)

    def _release(self, fn):
        c = self._client
        if c._forked:
            # Before the mutex: a thread of the parent may have held it.
            raise _forked_error()
        with c._mu:
            h = self._h
            if not h:
                return
            last = lib.dlock_lock_holds(h) <= 1
            if last:
                with self._guard:
                    self._h = None
            rc = fn(h)
            if last:
                c._forget(h)
            if rc:
                raise error(rc, lib.dlock_errmsg(c._p).decode("utf-8", "replace") or None)

    def renew(self, ttl=None):
        """Resets the lease to ttl seconds from now (default 30). Raises
        dlock.ELOST if the lock is no longer ours."""
        self._on_held(lib.dlock_renew, _ttl_ms(ttl))

    def raise_token(self, floor):
        """Makes every later grant of this name on this store carry a token
        above floor (dlock_lock_raise_token)."""
        self._on_held(lib.dlock_lock_raise_token, floor)

    def _on_held(self, fn, arg):
        """fn(handle, arg) on the lock still held, under the client's mutex."""
        c = self._client
        if c._forked:
            raise _forked_error()
        with c._mu:
            if not self._h:
                raise error(-1, "the lock was released")
            c._check(fn(self._h, arg))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.release()
        else:
            # The body's exception is the one to see; a release error
            # would only hide it.
            try:
                self.release()
            except Exception:
                pass

    def __repr__(self):
        state = "held" if self._h else "released"
        return "<dlock.Lock {!r} token={} {}>".format(self.name, self.token, state)


class Leadership(Lock):
    """A won election (Client.campaign()): a kept Lock that publishes a value.
    Resigned by resign() (or release()), by leaving its `with` block, or by
    closing its client.

    .term    the term (int): the grant's fencing token, above every earlier
             leader's; pass it to the resource you protect
    .value   the value published (bytes)
    .lost, .lost_error, .lost_fd(), on_lost: as a kept Lock's
    """

    def __init__(self, client, on_lost, value):
        super().__init__(client, on_lost)
        self.value = value

    @property
    def term(self):
        return self.token

    def proclaim(self, value):
        """Publishes a new value (bytes, or str as UTF-8) while still
        leading; dlock.ELOST if no longer the leader (nothing changed)."""
        v = _encode_value(value)
        c = self._client
        if c._forked:
            raise _forked_error()
        with c._mu:
            if not self._h:
                raise error(_EINVAL, "the leadership was resigned")
            c._check(lib.dlock_proclaim(self._h, v, len(v)))
        self.value = v

    def resign(self):
        """Gives up leadership: the next candidate leads at once. Raises
        dlock.ELOST if it was lost already; resigning twice does nothing."""
        self._release(lib.dlock_resign)

    release = resign

    def __repr__(self):
        state = "leading" if self._h else "resigned"
        return "<dlock.Leadership {!r} term={} {}>".format(self.name, self.token, state)


_observers = weakref.WeakSet()  # every open Observer, for the fork hook


class Observer:
    """Each change of an election's leader (Client.observe()), the current
    state first, as dlock.Leader tuples, in order. Iterating waits for each
    change until close(); get(timeout) waits at most timeout seconds.
    fileno() is readable while changes are queued (select/poll/asyncio).
    It has a thread and a connection of its own and may outlive its client.
    """

    def __init__(self, p, name):
        self._p = p
        self.name = name
        self._mu = threading.Lock()  # the handle vs. close() from another thread
        _observers.add(self)

    def _next(self, wait_ms):
        """(change or None, closed): one dlock_observer_next()."""
        info = _lib.LeaderInfo()
        with self._mu:
            if not self._p:
                return None, True
            rc = lib.dlock_observer_next(self._p, ctypes.byref(info), wait_ms)
        if rc == 0:
            return _leader(self.name, info), False
        if rc != _EBUSY:
            raise error(rc)
        return None, False

    def get(self, timeout=None):
        """The next change, waiting at most timeout seconds (None: until one
        comes); None when none came in time. dlock.EINVAL once closed."""
        end = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
        while True:
            left = _OBSERVE_SLICE_MS if end is None else \
                min(_OBSERVE_SLICE_MS, max(0, round((end - time.monotonic()) * 1000)))
            change, closed = self._next(left)
            if closed:
                raise error(_EINVAL, "the observer is closed")
            if change is not None:
                return change
            if end is not None and time.monotonic() >= end:
                return None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            change, closed = self._next(_OBSERVE_SLICE_MS)
            if closed:
                raise StopIteration
            if change is not None:
                return change

    def fileno(self):
        """Readable while changes are queued; owned by the observer."""
        with self._mu:
            if not self._p:
                raise error(_EINVAL, "the observer is closed")
            return lib.dlock_observer_fd(self._p)

    @property
    def reads(self):
        """How many times the observer read the store."""
        with self._mu:
            return lib.dlock_observer_reads(self._p) if self._p else 0

    @property
    def closed(self):
        return self._p is None

    def close(self):
        """Stops the observer (its thread and connection); an iteration in
        progress on another thread ends. Closing again does nothing."""
        with self._mu:
            p, self._p = self._p, None
        if p:
            lib.dlock_observer_close(p)
        _observers.discard(self)

    def _disown(self):
        # In a child of fork(): the observer's thread is the parent's.
        self._mu = threading.Lock()
        self._p = None
        _observers.discard(self)

    def __del__(self):
        if getattr(self, "_p", None):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<dlock.Observer {!r} {}>".format(self.name, "closed" if self.closed else "open")


class _LockContext:
    """What client.lock() returns: acquires on entering, releases on leaving."""

    def __init__(self, client, names, kwargs):
        self._client = client
        self._names = names
        self._kwargs = kwargs
        self._lock = None

    def __enter__(self):
        self._lock = self._client.acquire(self._names, **self._kwargs)
        return self._lock

    def __exit__(self, *exc):
        lock, self._lock = self._lock, None
        return lock.__exit__(*exc)


_open_clients = weakref.WeakSet()


@atexit.register
def _close_all():
    # Before the interpreter goes: a keeper thread must never call back into
    # a Python that is being torn down. A daemon thread may still wait on a
    # client: cancel every wait first, then close each client, never
    # waiting without end for one whose call does not return.
    clients = list(_open_clients)
    for c in clients:
        c._interrupt()
    end = time.monotonic() + _EXIT_GRACE_S
    for c in clients:
        if not c._close(max(0.0, end - time.monotonic())):
            sys.stderr.write("dlock: {!r} still busy in a call at exit: left open (its locks "
                             "end with their leases or connections)\n".format(c))


def _after_fork_in_child():
    # The child has one thread; the parent's clients are not its own.
    for c in list(_open_clients):
        c._disown()
    for k in list(_cancels):
        k._after_fork()
    for o in list(_observers):
        o._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Client:
    """A connection to one store (or a list of stores), from dlock.open()."""

    def __init__(self, uri):
        if isinstance(uri, str):
            uri = uri.encode("utf-8")
        p = ctypes.c_void_p()
        self._mu = threading.RLock()  # serialises the calls libdlock requires serialised
        self._pmu = threading.Lock()  # held briefly: the handle's lifetime, _closing, _wait
        self._locks = {}  # C handle -> Lock: a reentrant grant is one Lock
        self._closed = True  # until it is open
        self._closing = False  # close() began: no new wait may start
        self._forked = False  # inherited by a child of fork(): never call libdlock for it
        self._wait = None  # the internal Cancel of the wait in flight (under _pmu)
        self._spare = None  # an unfired internal Cancel for the next wait (under _mu)
        rc = lib.dlock_client_open(uri, ctypes.byref(p))
        if rc:
            msg = lib.dlock_errmsg(p.value).decode("utf-8", "replace")
            lib.dlock_client_close(p.value)
            raise error(rc, msg or None)
        self._p = p.value
        self._closed = False
        self.backend = lib.dlock_client_backend(self._p).decode()
        self.caps = lib.dlock_client_caps(self._p)
        _open_clients.add(self)

    @staticmethod
    def _check_init(rc):
        if rc:
            raise error(rc, "this libdlock does not know acquire options version {}"
                        .format(_lib.ACQUIRE_OPTS_VERSION))

    def _check(self, rc):
        if rc:
            raise error(rc, lib.dlock_errmsg(self._p).decode("utf-8", "replace") or None)

    def _forget(self, h):
        self._locks.pop(h, None)

    def _live(self):
        if self._forked:
            raise _forked_error()
        if self._closed:
            raise error(_EINVAL, "the client is closed")

    def _enter(self, cancel):
        """Takes the client's mutex; with a cancel, gives up (ECANCELED) when
        it is fired while another thread's call holds the mutex."""
        if self._forked:
            # Before the mutex: a thread of the parent may have held it.
            raise _forked_error()
        if cancel is None:
            self._mu.acquire()
            return
        while not self._mu.acquire(timeout=_QUEUED_POLL_S):
            if cancel.fired:
                raise error(_ECANCELED, "the wait was cancelled (queued behind another call "
                                        "on this client)")

    def _disown(self):
        # In a child of fork(): the handles are the parent's (its connections,
        # lock files, sessions), and the keeper's threads did not survive the
        # fork. Drop them without a call: closing would release the parent's
        # locks. The mutexes may have been held by a parent's thread.
        self._forked = True
        self._closed = True
        self._p = None
        self._mu = threading.RLock()
        self._pmu = threading.Lock()
        for lock in self._locks.values():
            lock._guard = threading.Lock()
            lock._h = None
        self._locks = {}
        self._wait = None
        spare, self._spare = self._spare, None
        if spare is not None:
            spare._after_fork()  # not linked to any client: freeing it is the child's own
        _open_clients.discard(self)

    def acquire(self, name, *, ttl=None, blocking=True, timeout=None, deadline=None,
                keep=False, on_lost=None, reentrant=False, cancel=None, shared=False,
                limit=None):
        """Takes the lock called name (str or bytes; a list or tuple of names
        takes them all as one lock) and returns a Lock.

        ttl       lease in seconds (default 30) on stores with leases
        blocking  False: one attempt, dlock.EBUSY if held
        timeout   seconds to wait at most, then dlock.ETIMEDOUT (a TimeoutError);
                  None (default) waits until granted
        deadline  instead of timeout: a dlock.monotonic() / time.monotonic() instant
        keep      True: the client's keeper renews the lease until release
        on_lost   with keep: fn(lock, error) called once if the lock is lost,
                  on a keeper thread (return quickly; do not release there)
        reentrant True: taking a name this client holds returns the same Lock
                  with one more hold (else dlock.EALREADY)
        cancel    a dlock.Cancel whose fire() ends the wait (dlock.ECANCELED)
        shared    True: a shared (read) lock, held together with other shared
                  holders, excluded by an exclusive one (dlock.ENOTSUP where
                  the store has none)
        limit     N (1 to 65535): a permit of the counting semaphore name, at
                  most N holders at once; not with shared
        A name held in another mode, or with another limit, raises
        dlock.EMODE at once.
        """
        multi = isinstance(name, (list, tuple))
        enc = [_encode_name(n) for n in name] if multi else [_encode_name(name)]
        if multi and not enc:
            raise ValueError("no names")
        if on_lost is not None and not keep:
            raise ValueError("on_lost needs keep=True (only kept locks are watched)")
        mode, lim = _limit(shared, limit)
        opts = self._wait_opts(ttl, blocking, timeout, deadline)
        opts.mode = mode
        opts.limit = lim
        opts.keep = 1 if keep else 0
        opts.reentrant = 1 if reentrant else 0
        lock = Lock(self, on_lost)
        if multi:
            def call(out):
                arr = (ctypes.c_char_p * len(enc))(*enc)
                return lib.dlock_acquire_names(self._p, arr, len(enc), ctypes.byref(opts),
                                               ctypes.byref(out))
        else:
            def call(out):
                return lib.dlock_acquire_n(self._p, enc[0], len(enc[0]), ctypes.byref(opts),
                                           ctypes.byref(out))
        return self._take(call, opts, lock, keep, cancel, blocking,
                          None if multi else _decode(enc[0]))

    def campaign(self, name, value=b"", *, ttl=None, blocking=True, timeout=None,
                 deadline=None, on_lost=None, cancel=None):
        """Campaigns for the election name until this client leads, then
        publishes value (bytes, or str as UTF-8; at most 1024 bytes, else
        dlock.EINVAL) and returns the Leadership, a kept lock whose token is
        the term. Waits as acquire() does (ttl, blocking, timeout, deadline,
        cancel); on_lost(leadership, error) as a kept lock's.

            with client.campaign("scheduler", "host-a:8080", timeout=30) as lead:
                run_scheduler(fence=lead.term)
        """
        enc = _encode_name(name)
        v = _encode_value(value)
        _check_elections()
        opts = self._wait_opts(ttl, blocking, timeout, deadline)
        opts.keep = 1
        lock = Leadership(self, on_lost, v)

        def call(out):
            return lib.dlock_campaign(self._p, enc, v, len(v), ctypes.byref(opts),
                                      ctypes.byref(out))
        return self._take(call, opts, lock, True, cancel, blocking, _decode(enc))

    def leader(self, name):
        """Who leads the election name, without campaigning: a dlock.Leader
        (name, held, value, term, lease, owner, error)."""
        enc = _encode_name(name)
        _check_elections()
        info = _lib.LeaderInfo()
        self._enter(None)
        try:
            self._live()
            self._check(lib.dlock_leader(self._p, enc, ctypes.byref(info)))
        finally:
            self._mu.release()
        return _leader(_decode(enc), info)

    def observe(self, name):
        """Starts observing the election name: an Observer, iterated for
        each change (the current state first) until closed.

            with client.observe("scheduler") as changes:
                for change in changes:
                    print(change.held, change.term, change.value)
        """
        enc = _encode_name(name)
        _check_elections()
        p = ctypes.c_void_p()
        self._enter(None)
        try:
            self._live()
            self._check(lib.dlock_observe(self._p, enc, None, None, ctypes.byref(p)))
        finally:
            self._mu.release()
        return Observer(p.value, _decode(enc))

    def _wait_opts(self, ttl, blocking, timeout, deadline):
        """Acquire options with the lease and the wait asked for."""
        opts = _lib.AcquireOpts()
        self._check_init(lib.dlock_acquire_opts_init_version(ctypes.byref(opts),
                                                             _lib.ACQUIRE_OPTS_VERSION))
        opts.ttl_ms = _ttl_ms(ttl)
        if not blocking:
            if timeout is not None or deadline is not None:
                raise ValueError("a non-blocking acquire takes no timeout or deadline")
            opts.wait = _lib.WAIT_TRY
        elif timeout is not None or deadline is not None:
            if timeout is not None and deadline is not None:
                raise ValueError("timeout or deadline, not both")
            dl = _deadline_ns(timeout, deadline)
            if dl is None:
                opts.wait = _lib.WAIT_FOREVER
            else:
                opts.wait = _lib.WAIT_DEADLINE
                opts.deadline_ns = dl
        else:
            opts.wait = _lib.WAIT_FOREVER
        return opts

    def _take(self, call, opts, lock, keep, cancel, blocking, single):
        """call(out) (an acquire or a campaign with opts) for lock, waiting
        as asked: single is the one name asked for, None for several."""
        cb = None
        if keep:
            cb = _lib.LOST_FN(lock._lost_cb)
            opts.on_lost = cb
        out = ctypes.c_void_p()
        cp = cancel._use() if cancel is not None else None
        try:
            self._enter(cancel)
            try:
                return self._acquire(call, opts, out, lock, cb, keep, cancel, cp, blocking,
                                     single)
            finally:
                self._mu.release()
        finally:
            if cancel is not None:
                cancel._done()

    def _acquire(self, call, opts, out, lock, cb, keep, cancel, cp, blocking, single):
        # Under _mu.
        self._live()
        k = None
        if self.caps & _lib.CAP_CANCEL and (blocking or cancel is not None):
            # The client's own flag, so that close() can end this wait; the
            # caller's cancel fires it too.
            k, self._spare = self._spare or Cancel(), None
            if cancel is not None:
                cancel._link(k)
            with self._pmu:
                closing = self._closing
                if not closing:
                    self._wait = k
            if closing:
                if cancel is not None:
                    cancel._unlink(k)
                self._spare = k
                raise error(_EINVAL, "the client is closed")
            opts.cancel = k._p
        else:
            # A backend that cannot cancel refuses a cancel (DLOCK_ENOTSUP).
            opts.cancel = cp
        try:
            rc = call(out)
        finally:
            if k is not None:
                with self._pmu:
                    self._wait = None
                if cancel is not None:
                    cancel._unlink(k)
                if k.fired:
                    k.close()  # stays fired: the next wait needs a new one
                else:
                    self._spare = k
        if (rc == _ECANCELED and self._closing
                and not (cancel is not None and cancel.fired)):
            raise error(_ECANCELED, "the wait was cancelled: the client is being closed")
        self._check(rc)
        h = out.value
        same = self._locks.get(h)
        if same is not None:
            # Reentrant: the same grant, held once more. libdlock keeps the
            # first acquire's on_lost, so this one's callback is not needed.
            return same
        if cb is not None:
            lock._callbacks.append(cb)
        lock._fill(h, bool(keep), single, opts)
        self._locks[h] = lock
        return lock

    def lock(self, name, **kwargs):
        """A context manager: `with client.lock(name, ttl=10) as l: ...`
        acquires on entering (same arguments as acquire()) and releases on
        leaving, also when the block raises."""
        return _LockContext(self, name, kwargs)

    def ping(self):
        """One round trip to the store (dlock.ENOTSUP for file://)."""
        self._enter(None)
        try:
            self._live()
            self._check(lib.dlock_client_ping(self._p))
        finally:
            self._mu.release()

    def inspect(self, name):
        """What the store knows about a lock, without taking it: a dict with
        the keys the store filled (held, token, owner, lease, waiters,
        queue, last_token); a missing key is unknown, not zero."""
        enc = _encode_name(name)
        info = _lib.Info()
        self._enter(None)
        try:
            self._live()
            self._check(lib.dlock_inspect(self._p, enc, ctypes.byref(info)))
        finally:
            self._mu.release()
        k = info.known
        out = {}
        if k & _lib.KNOWS_HELD:
            out["held"] = bool(info.held)
        _known(info, out)
        if k & _lib.KNOWS_WAITERS:
            out["waiters"] = info.waiters
        if k & _lib.KNOWS_ORDER:
            out["queue"] = [info.waiter[i].value.decode("utf-8", "replace")
                            for i in range(min(info.listed, _lib.INFO_LISTED))]
        if k & _lib.KNOWS_LAST_TOKEN:
            out["last_token"] = info.last_token
        return out

    def inspect_holders(self, name):
        """Every holder of a lock, without taking it, in grant order (token
        ascending): a list of dicts with the keys the store filled (mode
        "exclusive" or "shared", limit (0: a read-write lock), token,
        owner, lease); [] when free."""
        enc = _encode_name(name)
        room = 8
        for tries in range(4):
            arr = (_lib.Holder * room)()
            count = ctypes.c_size_t()
            self._enter(None)
            try:
                self._live()
                self._check(lib.dlock_inspect_holders(self._p, enc, arr, room,
                                                      ctypes.byref(count)))
            finally:
                self._mu.release()
            if count.value <= room or tries == 3:
                break
            # More hold than fit: ask again with room for them all (holders
            # may come and go meanwhile; the last try keeps those that fit).
            room = count.value
        return [_holder(arr[i]) for i in range(min(count.value, room))]

    def _metrics(self):
        # Readable while another thread is inside a call (libdlock keeps
        # them with atomics), so not under _mu; _pmu only keeps close() from
        # freeing the client meanwhile.
        m = _lib.Metrics()
        with self._pmu:
            self._live()
            rc = lib.dlock_client_metrics(self._p, ctypes.byref(m))
        if rc:
            raise error(rc)
        return m

    def metrics(self):
        """The client's counters and histograms (dlock_client_metrics) as a
        dict; histograms as {count, sum (s), buckets: [(le seconds, n)]}."""
        m = self._metrics()
        out = {f: getattr(m, f) for f in ("granted", "busy", "timed_out", "failed", "releases",
                                          "releases_lost", "renewals", "renewal_failures",
                                          "losses", "reconnects")}
        out["errors"] = {lib.dlock_err_name(-i).decode(): m.errors[i]
                         for i in range(1, _lib.METRICS_ERRORS) if m.errors[i]}
        for f in ("wait", "hold"):
            hgm = getattr(m, f)
            out[f] = {"count": hgm.count, "sum": hgm.sum_ns / 1e9,
                      "buckets": [(2**b / 1e6, hgm.le[b]) for b in range(_lib.METRICS_BUCKETS)]}
        return out

    def metrics_text(self, labels=None):
        """The metrics in Prometheus' text format (dlock_metrics_format)."""
        m = self._metrics()
        lb = labels.encode() if labels else None
        n = lib.dlock_metrics_format(ctypes.byref(m), lb, None, 0)
        if n < 0:
            raise error(n)
        buf = ctypes.create_string_buffer(n + 1)
        lib.dlock_metrics_format(ctypes.byref(m), lb, buf, n + 1)
        return buf.value.decode()

    def close(self):
        """Closes the client, releasing every lock it still holds. A wait in
        progress on another thread is cancelled (it raises dlock.ECANCELED);
        another call in progress is waited for."""
        self._close(None)

    def _interrupt(self):
        """Refuses new waits and fires the one in flight; does not block."""
        with self._pmu:
            if self._closed:
                return
            self._closing = True
            k = self._wait
        if k is not None:
            k.fire()  # a no-op if the wait ended and closed it meanwhile

    def _close(self, timeout):
        """close(), waiting at most timeout seconds (None: no limit) for the
        call in progress; False if it did not return in time."""
        if self._forked:
            return True  # the parent's to close
        self._interrupt()
        if not self._mu.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if self._closed:
                return True
            self._closed = True
            for lock in self._locks.values():
                with lock._guard:
                    lock._h = None
            locks, self._locks = self._locks, {}
            with self._pmu:
                lib.dlock_client_close(self._p)
                self._p = None
            # The keeper is gone: the callbacks may be freed with their locks.
            del locks
            spare, self._spare = self._spare, None
            if spare is not None:
                spare.close()
        finally:
            self._mu.release()
        _open_clients.discard(self)
        return True

    @property
    def closed(self):
        return self._closed

    def __del__(self):
        # Locks keep their client alive, so none of this client's is in use.
        # A forked child's copy is the parent's: _close() leaves it.
        if not getattr(self, "_closed", True):
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<dlock.Client {} {}>".format(self.backend if not self._closed else "-",
                                             "closed" if self._closed else "open")


def open(uri):  # noqa: A001 - the name the issue fixes
    """Opens a client for the store named by uri ("file:///run/app/locks",
    "redis://host:6379/0", ...; a whitespace-separated list of URIs holds
    every lock in each store). Raises dlock.EBADURI, dlock.ECONNECT, ..."""
    return Client(uri)
