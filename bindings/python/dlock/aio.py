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

Elections: `await client.campaign(name, value)` waits (and is cancelled) as
acquire does and returns a Leadership (`async with` resigns on leaving);
`async for change in client.observe(name)` waits for each change with
loop.add_reader on the observer's descriptor, never on a thread.
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


class Leadership(Lock):
    """A won election (asyncio form): .term, .value, and the kept Lock's
    .lost, .lost_event, on_lost; proclaim() and resign() are coroutines."""

    @property
    def term(self):
        return self._sync.term

    @property
    def value(self):
        return self._sync.value

    async def proclaim(self, value):
        """Publishes a new value while still leading (dlock.ELOST if not)."""
        await self._client._call(self._sync.proclaim, value)

    async def resign(self):
        """Gives up leadership; the next candidate leads at once."""
        await self.release()

    def __repr__(self):
        return "<dlock.aio.Leadership {!r} term={} {}>".format(
            self.name, self.term, "leading" if self.held else "resigned")


class Observer:
    """An election's observer (asyncio form), from client.observe(name):
    `async for change in observer` (dlock.Leader tuples, the current state
    first), `async with`, or `await` it to have it started. The wait for a
    change is loop.add_reader on the observer's descriptor. close() stops
    it and ends an iteration in progress."""

    def __init__(self, client, name):
        self._client = client
        self.name = name
        self._sync = None
        self._opening = None
        self._closed = False
        self._waiter = None
        self._fd = None

    async def _open(self):
        if self._sync is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(
                    self._client._call(self._client._sync.observe, self.name))
            sync = await asyncio.shield(self._opening)
            if self._closed:  # closed while it was opening
                sync.close()
            elif self._sync is None:
                self._sync = sync
                self._fd = sync.fileno()
        return self

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self):
        return await self._open()

    async def __aexit__(self, *exc):
        self.close()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._closed:
            await self._open()
        while not self._closed:
            change, closed = self._sync._next(0)
            if closed:
                break
            if change is not None:
                return change
            await self._readable()
        raise StopAsyncIteration

    async def get(self, timeout=None):
        """The next change, waiting at most timeout seconds (None: until
        one comes); None when none came in time. dlock.EINVAL once closed."""
        if self._closed:
            raise error(_core._EINVAL, "the observer is closed")
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except asyncio.TimeoutError:
            return None
        except StopAsyncIteration:
            raise error(_core._EINVAL, "the observer is closed") from None

    async def _readable(self):
        loop = self._client._loop
        fut = loop.create_future()
        self._waiter = fut

        def ready():
            if not fut.done():
                fut.set_result(None)
        loop.add_reader(self._fd, ready)
        try:
            await fut
        finally:
            self._waiter = None
            if not self._closed:
                loop.remove_reader(self._fd)

    @property
    def closed(self):
        return self._closed

    @property
    def reads(self):
        return self._sync.reads if self._sync is not None else 0

    def close(self):
        """Stops the observer (joining its thread: at most one read of the
        store in flight); an iteration in progress ends."""
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            self._client._loop.remove_reader(self._fd)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._sync is not None:
            self._sync.close()

    async def aclose(self):
        self.close()

    def __repr__(self):
        return "<dlock.aio.Observer {!r} {}>".format(self.name,
                                                     "closed" if self._closed else "open")


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
        sync = await self._wait(self._sync.acquire, name, ttl=ttl, blocking=blocking,
                                timeout=timeout, deadline=deadline, keep=keep,
                                reentrant=reentrant, shared=shared, limit=limit)
        lock = self._locks.get(sync)
        if lock is not None:
            return lock  # reentrant: the same grant once more
        lock = Lock(self, sync, on_lost)
        if keep:
            lock._watch(self._loop)
        self._locks[sync] = lock
        return lock

    async def campaign(self, name, value=b"", *, ttl=None, blocking=True, timeout=None,
                       deadline=None, on_lost=None):
        """As dlock.Client.campaign() (cancel the task instead of cancel=):
        a Leadership, whose loss is watched from the loop."""
        sync = await self._wait(self._sync.campaign, name, value, ttl=ttl,
                                blocking=blocking, timeout=timeout, deadline=deadline)
        lock = Leadership(self, sync, on_lost)
        lock._watch(self._loop)
        self._locks[sync] = lock
        return lock

    async def leader(self, name):
        """Who leads the election name: a dlock.Leader."""
        return await self._call(self._sync.leader, name)

    def observe(self, name):
        """An Observer of the election name: `async for change in
        client.observe(name)`; started on first use."""
        return Observer(self, name)

    async def _wait(self, fn, *args, **kwargs):
        """fn(*args, cancel=..., **kwargs), a sync acquire or campaign, on
        the worker; cancelling the task cancels it, and a grant that won the
        race is released."""
        can_cancel = kwargs["blocking"] and bool(self.caps & _lib.CAP_CANCEL)
        cancel = _core.Cancel() if can_cancel else None
        # The concurrent future, not only the loop's: while the job is still
        # queued, only it can take the job back.
        cf = self._ex.submit(functools.partial(fn, *args, cancel=cancel, **kwargs))
        fut = asyncio.wrap_future(cf, loop=self._loop)
        try:
            return await asyncio.shield(fut)
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
