"""dlock for asyncio: the same client, with its blocking calls off the loop.

    client = await dlock.aio.open(uri)
    async with client.lock("name", ttl=10, timeout=5) as lock:
        ...

Each client runs its calls on a worker thread of its own (one thread, so
they stay serialised as libdlock requires; never the loop's default
executor, which other code may fill). A waiting acquire therefore never
blocks the loop, but it does hold up the client's later calls until it
ends: use one client per concurrent waiter.

Cancelling the task that awaits an acquire takes the acquire off the
worker's queue if it has not started (it may be queued behind another call
of the client): CancelledError goes on at once. One that has started gets
the dlock.Cancel made for it fired, is waited for (promptly: libdlock ends
the wait), has a grant that won the race released, and then CancelledError
goes on. On a backend without DLOCK_CAP_CANCEL a started wait cannot be
interrupted: the CancelledError goes on at once and the acquire is left
to finish on the worker, which releases whatever it is granted.

Loss of a kept lock is watched from the loop (loop.add_reader on
dlock_lock_lost_fd()): lock.lost_event is set and on_lost(lock, error) is
called on the loop's thread, not on a keeper thread.
"""

import asyncio
import concurrent.futures
import functools

from . import _core, _lib
from ._errors import error


async def open(uri):  # noqa: A001 - the name the issue fixes
    """Opens a client (dlock.open() on the client's own worker thread)."""
    ex = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlock-client")
    loop = asyncio.get_running_loop()
    try:
        sync = await loop.run_in_executor(ex, _core.Client, uri)
    except BaseException:
        ex.shutdown(wait=False)
        raise
    return Client(sync, ex, loop)


class Lock:
    """A held lock (asyncio form). .token, .name, .names, .mode, .limit,
    .lost, .lost_event as the sync Lock; release() and renew() are coroutines."""

    def __init__(self, client, sync, on_lost):
        self._client = client
        self._sync = sync
        self._on_lost = on_lost
        self.token = sync.token
        self.name = sync.name
        self.names = sync.names
        self.mode = sync.mode
        self.limit = sync.limit
        self.lost_event = asyncio.Event()
        self._fd = None

    def _watch(self, loop):
        fd = self._sync.lost_fd()
        self._fd = fd
        loop.add_reader(fd, self._lost_ready)

    def _unwatch(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            self._client._loop.remove_reader(fd)

    def _lost_ready(self):
        # Readable for good once lost: stop watching, or it fires forever.
        self._unwatch()
        self.lost_event.set()
        if self._on_lost is not None:
            err = self._sync.lost_error or error(-9)
            self._on_lost(self, err)

    @property
    def lost(self):
        return self._sync.lost

    @property
    def lost_error(self):
        return self._sync.lost_error

    @property
    def held(self):
        return self._sync.held

    @property
    def expires(self):
        return self._sync.expires

    async def wait_lost(self):
        """Returns (the loss's error) once the kept lock is known lost."""
        await self.lost_event.wait()
        return self._sync.lost_error

    async def release(self):
        """Releases the lock; dlock.ELOST if it was no longer ours."""
        # The last release closes the descriptor, so the loop must stop
        # watching it first. Whether this is the last hold is only known on
        # the worker (the count is read under the client's mutex, which a
        # wait may hold), so stop now and watch again if a hold remains.
        watched = self._fd is not None
        self._unwatch()
        try:
            await self._client._call(self._sync.release)
        finally:
            if self._sync.held:
                if watched:
                    self._watch(self._client._loop)
            else:
                self._client._locks.pop(self._sync, None)

    async def renew(self, ttl=None):
        await self._client._call(self._sync.renew, ttl)

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if exc_type is None:
            await self.release()
        else:
            try:
                await self.release()
            except Exception:
                pass

    def __repr__(self):
        return "<dlock.aio.Lock {!r} token={} {}>".format(
            self.name, self.token, "held" if self.held else "released")


class _LockContext:
    def __init__(self, client, name, kwargs):
        self._client = client
        self._name = name
        self._kwargs = kwargs
        self._lock = None

    async def __aenter__(self):
        self._lock = await self._client.acquire(self._name, **self._kwargs)
        return self._lock

    async def __aexit__(self, *exc):
        lock, self._lock = self._lock, None
        return await lock.__aexit__(*exc)


class Client:
    """A client whose calls run on its own worker thread."""

    def __init__(self, sync, executor, loop):
        self._sync = sync
        self._ex = executor
        self._loop = loop
        self._locks = {}  # sync Lock -> aio Lock (a reentrant grant is one)
        self.backend = sync.backend
        self.caps = sync.caps

    @property
    def sync(self):
        """The underlying dlock.Client (its calls block: not from the loop)."""
        return self._sync

    def _call(self, fn, *args, **kwargs):
        return self._loop.run_in_executor(self._ex, lambda: fn(*args, **kwargs))

    async def acquire(self, name, *, ttl=None, blocking=True, timeout=None, deadline=None,
                      keep=False, on_lost=None, reentrant=False, shared=False, limit=None):
        """As dlock.Client.acquire() (same arguments but cancel: cancel the
        task instead). on_lost(lock, error) runs on the loop's thread."""
        if on_lost is not None and not keep:
            raise ValueError("on_lost needs keep=True (only kept locks are watched)")
        can_cancel = blocking and bool(self.caps & _lib.CAP_CANCEL)
        cancel = _core.Cancel() if can_cancel else None
        # The concurrent future, not only the loop's: while the job is still
        # queued, only it can take the job back.
        cf = self._ex.submit(functools.partial(
            self._sync.acquire, name, ttl=ttl, blocking=blocking, timeout=timeout,
            deadline=deadline, keep=keep, reentrant=reentrant, cancel=cancel, shared=shared,
            limit=limit))
        fut = asyncio.wrap_future(cf, loop=self._loop)
        try:
            sync = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if cf.cancel():
                # It never started (queued behind another call): firing the
                # flag and waiting for the job would wait for that call.
                raise
            if not fut.done():
                if cancel is None:
                    fut.add_done_callback(_release_late_grant(self))
                    raise
                cancel.fire()
                # Wait for the call to return, however often we are
                # cancelled meanwhile: a grant must not be left behind.
                while not fut.done():
                    try:
                        await asyncio.shield(fut)
                    except BaseException:  # noqa: B036 - cancelled again, or the acquire failed
                        pass
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                late = fut.result()
                try:
                    await self._call(late.release)
                except Exception:
                    pass
            raise
        finally:
            if cancel is not None and cf.done():
                cancel.close()
        lock = self._locks.get(sync)
        if lock is not None:
            return lock  # reentrant: the same grant once more
        lock = Lock(self, sync, on_lost)
        if keep:
            lock._watch(self._loop)
        self._locks[sync] = lock
        return lock

    def lock(self, name, **kwargs):
        """`async with client.lock(name, ...) as lock:` acquires on entering
        and releases on leaving, also when the block raises."""
        return _LockContext(self, name, kwargs)

    async def ping(self):
        await self._call(self._sync.ping)

    async def inspect(self, name):
        return await self._call(self._sync.inspect, name)

    async def inspect_holders(self, name):
        return await self._call(self._sync.inspect_holders, name)

    def metrics(self):
        return self._sync.metrics()

    def metrics_text(self, labels=None):
        return self._sync.metrics_text(labels)

    async def close(self):
        """Closes the client (releasing its locks) and its worker thread."""
        for lock in list(self._locks.values()):
            lock._unwatch()
        self._locks.clear()
        # The close job is queued behind any wait on the worker: end that
        # wait first (it raises dlock.ECANCELED to its task).
        self._sync._interrupt()
        try:
            await self._call(self._sync.close)
        finally:
            self._ex.shutdown(wait=False)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def _release_late_grant(client):
    def done(fut):
        if fut.cancelled() or fut.exception() is not None:
            return
        # Released on the worker: the loop never blocks. A closed client
        # released it already.
        try:
            client._ex.submit(_quiet_release, fut.result())
        except RuntimeError:
            pass
    return done


def _quiet_release(lock):
    try:
        lock.release()
    except Exception:
        pass
