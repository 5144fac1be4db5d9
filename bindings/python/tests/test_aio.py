"""The asyncio form: the loop keeps running while a lock is awaited, task
cancellation ends the wait, loss arrives through the loop."""

import asyncio
import os
import threading
import time

import pytest

import dlock
import dlock.aio


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_aio_lock_and_loop_keeps_running(store_uri, name):
    async def main():
        a = await dlock.aio.open(store_uri)
        b = await dlock.aio.open(store_uri)
        try:
            ticks = 0
            stop = asyncio.Event()

            async def ticker():
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            held = await a.acquire(name)
            tick = asyncio.ensure_future(ticker())
            loop = asyncio.get_running_loop()
            loop.call_later(0.5, lambda: asyncio.ensure_future(held.release()))
            t0 = time.monotonic()
            async with b.lock(name, timeout=20) as lock:
                waited = time.monotonic() - t0
                assert lock.token > held.token
                assert lock.name == name
            stop.set()
            await tick
            assert waited >= 0.4
            # 0.5 s at one tick per 10 ms: the loop ran throughout.
            # (A blocked loop ticks once or twice; 10 leaves room for load.)
            assert ticks >= 10, "the loop ticked {} times in {:.2f} s".format(ticks, waited)
            with pytest.raises(dlock.EBUSY):
                async with a.lock(name, blocking=False):
                    await b.acquire(name, blocking=False)
            # Released on leaving, also through the exception.
            free = await b.acquire(name, blocking=False)
            await free.release()
        finally:
            await a.close()
            await b.close()
    run(main())


def test_aio_task_cancellation(store_uri, name):
    async def main():
        holder = await dlock.aio.open(store_uri)
        w1 = await dlock.aio.open(store_uri)
        w2 = await dlock.aio.open(store_uri)
        try:
            held = await holder.acquire(name, blocking=False)
            t1 = asyncio.ensure_future(w1.acquire(name))
            await asyncio.sleep(0.3)
            t2 = asyncio.ensure_future(w2.acquire(name, timeout=30))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            t1.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t1
            assert time.monotonic() - t0 < 5, "the cancelled wait returned within 5 s"
            await held.release()
            lock = await t2
            assert lock.token > held.token, "the waiter behind is still served"
            await lock.release()
            if w1.caps & dlock.CAP_CANCEL:
                # The cancelled client is free at once and holds nothing.
                again = await asyncio.wait_for(w1.acquire(name, blocking=False), 5)
                await again.release()
            else:
                # Without DLOCK_CAP_CANCEL the detached wait got the lock
                # after the holder left, then released it on its own.
                for _ in range(100):
                    try:
                        got = await holder.acquire(name, blocking=False)
                        await got.release()
                        break
                    except dlock.EBUSY:
                        await asyncio.sleep(0.1)
                else:
                    pytest.fail("the late grant of a cancelled acquire was never released")
        finally:
            for c in (holder, w1, w2):
                await c.close()
    run(main())


def test_aio_cancel_releases_a_late_grant(tmp_path, name, monkeypatch):
    """A grant that arrives as the task is cancelled is released before the
    CancelledError goes on."""
    uri = "file://" + str(tmp_path)

    async def main():
        c = await dlock.aio.open(uri)
        other = dlock.open(uri)
        started = threading.Event()
        real = c.sync.acquire

        def granted_late(*a, **kw):
            # Granted, but returning only after the task was cancelled: the
            # grant won the race with the cancel.
            lock = real(*a, **kw)
            started.set()
            time.sleep(0.3)
            return lock

        monkeypatch.setattr(c.sync, "acquire", granted_late)
        t = asyncio.ensure_future(c.acquire(name, timeout=10))
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # Released before the CancelledError reached us.
        other.acquire(name, blocking=False).release()
        other.close()
        await c.close()
    run(main())


def test_aio_keep_lost_event(tmp_path, name):
    d = str(tmp_path / "locks")

    async def main():
        c = await dlock.aio.open("file://" + d)
        seen = []
        loop_thread = threading.current_thread()
        lock = await c.acquire(name, keep=True, ttl=3,
                               on_lost=lambda l, e: seen.append((l, e, threading.current_thread())))
        assert not lock.lost_event.is_set()
        f = [os.path.join(d, x) for x in os.listdir(d) if x.endswith(".lock")][0]
        os.rename(f, f + ".gone")
        err = await asyncio.wait_for(lock.wait_lost(), 5)
        assert isinstance(err, dlock.ELOST)
        assert lock.lost
        assert seen and seen[0][0] is lock and isinstance(seen[0][1], dlock.ELOST)
        assert seen[0][2] is loop_thread, "on_lost runs on the loop's thread"
        with pytest.raises(dlock.ELOST):
            await lock.release()
        await c.close()
    run(main())


def test_aio_calls_are_serialised_on_one_worker(tmp_path):
    async def main():
        c = await dlock.aio.open("file://" + str(tmp_path))
        names = set()

        def who():
            names.add(threading.current_thread().name)

        await asyncio.gather(*(c._call(who) for _ in range(20)))
        assert len(names) == 1 and next(iter(names)).startswith("dlock-client")
        locks = await asyncio.gather(*(c.acquire("n{}".format(i)) for i in range(10)))
        assert len({lk.token for lk in locks}) == 10
        for lk in locks:
            await lk.release()
        await c.close()
    run(main())
