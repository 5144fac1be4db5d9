"""A client's life beyond one thread's calls: fork(), exit while a thread
waits, close() during a wait, a cancel queued behind another call, huge
timeouts, Cancel.fire() against close().

A regression here would hang rather than fail, so every case bounds itself:
a child interpreter run with a timeout, or a daemon thread joined with one
(and the lock it waits for released in `finally`, which frees it).
"""

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dlock
import dlock._core
import dlock.aio


def run_py(code, *args, timeout=30):
    """Runs code in a fresh interpreter (same DLOCK_LIBRARY, PYTHONPATH);
    returns (exit code, stdout, seconds, stderr). A hang fails the case."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(args),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail("the child interpreter hung ({} s); its output: {!r} {!r}"
                    .format(timeout, e.stdout, e.stderr))
    el = time.monotonic() - t0
    return p.returncode, p.stdout, el, p.stderr


def needs_cancel(c):
    if not c.caps & dlock.CAP_CANCEL:
        pytest.skip("{} cannot cancel a wait".format(c.backend))


FORK_SCRIPT = """
import gc, os, sys, dlock
uri, name, keep, how = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
c = dlock.open(uri)
lock = c.acquire(name, blocking=False, ttl=60, keep=keep)
pid = os.fork()
if pid == 0 and how == "exit":
    # A child that does its own work and exits: the exit hook runs.
    sys.exit(0)
elif pid == 0:
    # The child: the client and lock are the parent's.
    try:
        lock.release()
        os._exit(3)
    except dlock.EINVAL as e:
        if "parent process" not in e.message:
            os._exit(4)
    try:
        c.acquire(name + "-child", blocking=False)
        os._exit(5)
    except dlock.EINVAL:
        pass
    if lock.held or not c.closed:
        os._exit(6)
    c.close()  # a no-op in the child
    del lock, c
    gc.collect()  # Client.__del__ must not close it either
    # Falls off the end of the script: the exit hook runs.
else:
    _, status = os.waitpid(pid, 0)
    print("child", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -status)
    other = dlock.open(uri)
    try:
        other.acquire(name, blocking=False).release()
        print("stolen")
    except dlock.EBUSY:
        print("held")
    print("parent", lock.held)
    lock.release()
    other.acquire(name, blocking=False).release()
    print("released")
"""


@pytest.mark.parametrize("keep", [False, True], ids=["plain", "keep"])
@pytest.mark.parametrize("how", ["exit", "return"])
def test_fork_child_leaves_parent_locks(store_uri, name, keep, how):
    """A child of fork() that exits normally (sys.exit, or the end of the
    script after trying the inherited client, which refuses every call there
    and is dropped) does not release the parent's locks, also kept ones, and
    does not hang."""
    rc, out, el, err = run_py(FORK_SCRIPT, store_uri, name, "1" if keep else "0", how)
    assert rc == 0, (out, err)
    assert out.split("\n")[:4] == ["child 0", "held", "parent True", "released"], (out, err)


EXIT_SCRIPT = """
import sys, threading, time, dlock
uri, name = sys.argv[1:3]
c = dlock.open(uri)
def wait():
    try:
        c.acquire(name)
    except dlock.DlockError as e:
        pass
# One waits in libdlock, the other for the client's mutex behind it.
for _ in range(2):
    threading.Thread(target=wait, daemon=True).start()
time.sleep(0.5)
print("exiting", flush=True)
"""


def test_exit_while_a_daemon_thread_waits(clients, store_uri, name):
    """The interpreter exits promptly while daemon threads wait on a client
    (the exit hook closes it). The holder is in this process, so that
    nothing the child does at exit frees the lock."""
    holder = clients()
    needs_cancel(holder)
    held = holder.acquire(name, blocking=False)
    try:
        rc, out, el, err = run_py(EXIT_SCRIPT, store_uri, name, timeout=30)
    finally:
        held.release()
    assert rc == 0 and "exiting" in out, (out, err)
    assert el < 10, "exit took {:.1f} s".format(el)
    assert "still busy" not in err, err


def test_close_ends_a_wait_in_flight(clients, name):
    holder, w = clients(2)
    needs_cancel(w)
    held = holder.acquire(name, blocking=False)
    k = dlock.Cancel()
    got = {}

    def wait():
        try:
            got["r"] = w.acquire(name, cancel=k)
        except dlock.DlockError as e:
            got["r"] = e

    t = threading.Thread(target=wait, daemon=True)
    closer = threading.Thread(target=w.close, daemon=True)
    try:
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        closer.start()
        closer.join(10)
        t.join(10)
        assert not closer.is_alive(), "close() waited for the wait in flight"
        assert time.monotonic() - t0 < 5
        assert isinstance(got.get("r"), dlock.ECANCELED), got
        assert "closed" in got["r"].message
        assert w.closed
        assert not k.fired, "the caller's Cancel is left alone"
        with pytest.raises(dlock.EINVAL):
            w.acquire(name, blocking=False)
    finally:
        held.release()
        t.join(10)
        closer.join(10)
        k.close()


def test_cancel_queued_behind_another_wait(clients, name):
    """fire() ends an acquire that waits for the client's mutex, held by
    another thread's wait on the same client."""
    holder, w = clients(2)
    needs_cancel(w)
    held = holder.acquire(name, blocking=False)
    k = dlock.Cancel()
    got = {}

    def first():
        try:
            got["first"] = w.acquire(name, timeout=30)
        except dlock.DlockError as e:
            got["first"] = e

    def queued():
        try:
            got["queued"] = w.acquire(name + "-free", cancel=k)
        except dlock.DlockError as e:
            got["queued"] = e

    t1 = threading.Thread(target=first, daemon=True)
    t2 = threading.Thread(target=queued, daemon=True)
    try:
        t1.start()
        time.sleep(0.3)
        t2.start()
        time.sleep(0.3)
        assert "queued" not in got
        t0 = time.monotonic()
        k.fire()
        t2.join(5)
        assert not t2.is_alive(), "the queued acquire still waits for the mutex"
        assert time.monotonic() - t0 < 2
        assert isinstance(got["queued"], dlock.ECANCELED), got
        assert t1.is_alive(), "the other wait goes on"
    finally:
        held.release()
        t1.join(30)
        t2.join(30)
        k.close()
    assert isinstance(got["first"], dlock.Lock), got
    got["first"].release()


def test_aio_cancel_queued_acquire(clients, store_uri, name):
    """Cancelling an aio acquire queued behind another call on the client's
    worker ends it at once (asyncio.wait_for), and the client goes on."""
    holder = clients()
    needs_cancel(holder)
    held = holder.acquire(name, blocking=False)
    got = {}

    async def main():
        c = await dlock.aio.open(store_uri)
        try:
            first = asyncio.ensure_future(c.acquire(name))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(c.acquire(name + "-free"), 0.5)
            except asyncio.TimeoutError:
                got["timed out"] = time.monotonic() - t0
            first.cancel()
            try:
                await first
            except asyncio.CancelledError:
                got["first"] = "cancelled"
            lock = await c.acquire(name + "-free", blocking=False)
            await lock.release()
            got["usable"] = True
        finally:
            await c.close()

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    try:
        t.start()
        t.join(15)
        assert not t.is_alive(), "the cancelled queued acquire hung: {}".format(got)
    finally:
        held.release()
        t.join(30)
    assert got.get("timed out", 99) < 3, got
    assert got.get("first") == "cancelled" and got.get("usable"), got


def test_aio_close_ends_a_wait(clients, store_uri, name):
    """await client.close() while a task waits on that client: the wait
    raises dlock.ECANCELED and the close returns (it was queued behind the
    wait on the client's worker)."""
    holder = clients()
    needs_cancel(holder)
    held = holder.acquire(name, blocking=False)
    got = {}

    async def main():
        c = await dlock.aio.open(store_uri)
        waiting = asyncio.ensure_future(c.acquire(name))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(c.close(), 5)
            got["closed"] = time.monotonic() - t0
        except asyncio.TimeoutError:
            got["closed"] = "timed out"
        try:
            got["wait"] = await waiting
        except dlock.DlockError as e:
            got["wait"] = e

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    try:
        t.start()
        t.join(15)
        assert not t.is_alive(), got
    finally:
        held.release()
        t.join(30)
    assert isinstance(got.get("closed"), float) and got["closed"] < 3, got
    assert isinstance(got.get("wait"), dlock.ECANCELED), got


def test_huge_timeouts_wait_forever(clients, name):
    holder, w = clients(2)
    held = holder.acquire(name, blocking=False)
    # Past 2^64 ns from now: wrapped in the uint64 field, this was a
    # deadline in the past (an instant ETIMEDOUT).
    wrap = (2**64 - dlock._core.lib.dlock_monotonic_ns()) / 1e9 + 0.05
    cases = [{"timeout": wrap}, {"timeout": float("inf")}, {"timeout": 1e11},
             {"deadline": 1e30}]
    try:
        for kw in cases:
            got = {}

            def wait():
                try:
                    got["r"] = w.acquire(name, **kw)
                except Exception as e:  # noqa: BLE001 - any failure is the finding
                    got["r"] = e

            t = threading.Thread(target=wait, daemon=True)
            t.start()
            t.join(0.4)
            assert t.is_alive(), "{}: returned {!r} instead of waiting".format(kw, got.get("r"))
            held.release()
            t.join(15)
            assert isinstance(got.get("r"), dlock.Lock), (kw, got)
            got["r"].release()
            held = holder.acquire(name, blocking=False)
    finally:
        held.release()


def test_huge_ttl_refused(clients, name):
    c = clients()
    for ttl in (2**32 / 1000, 1e12, float("inf")):
        with pytest.raises(dlock.EINVAL) as e:
            c.acquire(name, ttl=ttl, blocking=False)
        assert "2^32-1 ms" in e.value.message
        assert isinstance(e.value, ValueError)
    with c.lock(name, blocking=False) as lock:
        with pytest.raises(dlock.EINVAL):
            lock.renew(ttl=1e10)
    for ttl in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            c.acquire(name, ttl=ttl, blocking=False)


class _SlowFireLib:
    """libdlock with a slow dlock_cancel_fire, recording a free that
    overlaps a fire (use after free) instead of doing it."""

    def __init__(self, real):
        self._real = real
        self.firing = 0
        self.freed = set()
        self.bad = []
        self.fires = 0

    def __getattr__(self, attr):
        return getattr(self._real, attr)

    def dlock_cancel_fire(self, p):
        self.fires += 1
        self.firing += 1
        try:
            time.sleep(0.3)
            if p in self.freed:
                self.bad.append("fire after free")
                return
            self._real.dlock_cancel_fire(p)
        finally:
            self.firing -= 1

    def dlock_cancel_free(self, p):
        if self.firing:
            self.bad.append("free during fire")
        self.freed.add(p)
        self._real.dlock_cancel_free(p)


def test_cancel_fire_against_close(monkeypatch):
    slow = _SlowFireLib(dlock._core.lib)
    monkeypatch.setattr(dlock._core, "lib", slow)
    k = dlock.Cancel()
    t = threading.Thread(target=k.fire, daemon=True)
    t.start()
    time.sleep(0.1)
    k.close()  # waits for the fire in progress
    t.join(5)
    assert not slow.bad, slow.bad
    fires = slow.fires
    k.fire()  # after close: nothing to fire
    assert slow.fires == fires and not slow.bad
    assert not k.fired


def test_reentrant_keep_keeps_one_callback(clients, name):
    c = clients()
    lock = c.acquire(name, keep=True, blocking=False)
    for _ in range(5):
        assert c.acquire(name, keep=True, reentrant=True, blocking=False) is lock
    assert lock.holds == 6
    assert len(lock._callbacks) == 1
    for _ in range(6):
        lock.release()
    assert not lock.held
