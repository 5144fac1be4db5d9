"""Shared locks and semaphores through the package, on every store: the
arguments reach libdlock, its refusals arrive as their exceptions, and
inspect_holders() lists the holders. A store without a mode must refuse it
(dlock.ENOTSUP); one with it is checked for what it grants."""

import asyncio
import time

import pytest

import dlock
import dlock.aio


@pytest.mark.parametrize("limit", [0, -1, 65536, 2**32, 2**64, 1.5, "3", True])
def test_bad_limit_refused(tmp_path, limit):
    # Refused before the store is asked: one store is enough.
    with dlock.open("file://" + str(tmp_path)) as c:
        with pytest.raises(dlock.EINVAL) as e:
            c.acquire("n", blocking=False, limit=limit)
        assert isinstance(e.value, ValueError) and "limit" in e.value.message


def test_shared_with_limit_refused(clients, name):
    c = clients()
    with pytest.raises(dlock.EINVAL) as e:
        c.acquire(name, blocking=False, shared=True, limit=3)
    assert "limit" in e.value.message
    # Nothing was taken.
    c.acquire(name, blocking=False).release()


def test_inspect_holders_exclusive(clients, name):
    a = clients()
    assert a.inspect_holders(name) == []
    with a.lock(name, blocking=False) as lock:
        assert lock.mode == "exclusive" and lock.limit == 0
        hs = a.inspect_holders(name)
        assert len(hs) == 1
        if "token" in hs[0]:
            assert hs[0]["token"] == lock.token
        if "mode" in hs[0]:
            assert hs[0]["mode"] == "exclusive" and hs[0]["limit"] == 0
        if "owner" in hs[0]:
            assert hs[0]["owner"] == lock.owner
    assert a.inspect_holders(name) == []


def test_shared(clients, name):
    a, b, w = clients(3)
    if not a.caps & dlock.CAP_SHARED:
        with pytest.raises(dlock.ENOTSUP):
            a.acquire(name, blocking=False, shared=True)
        return
    r1 = a.acquire(name, blocking=False, shared=True)
    r2 = b.acquire(name, timeout=10, shared=True)
    assert r1.mode == r2.mode == "shared" and r1.limit == r2.limit == 0
    assert r2.token > r1.token
    with pytest.raises(dlock.EBUSY):
        w.acquire(name, blocking=False)
    t0 = time.monotonic()
    # a semaphore on a read-write name: DLOCK_EMODE, or DLOCK_ENOTSUP on a
    # store without semaphores; either way at once
    with pytest.raises(dlock.EMODE if a.caps & dlock.CAP_SEMAPHORE else dlock.ENOTSUP):
        w.acquire(name, timeout=5, limit=2)
    assert time.monotonic() - t0 < 2.5, "a semaphore on a read-write name is refused at once"
    hs = a.inspect_holders(name)
    assert [h.get("mode") for h in hs] == ["shared", "shared"]
    assert [h.get("token") for h in hs] == [r1.token, r2.token]
    assert {h.get("owner") for h in hs} <= {r1.owner, r2.owner, None}
    r1.release()
    r2.release()
    with w.lock(name, blocking=False) as x:
        assert x.token > r2.token, "an exclusive token is above every earlier shared one"


def test_semaphore(clients, name):
    a, b, c = clients(3)
    if not a.caps & dlock.CAP_SEMAPHORE:
        with pytest.raises(dlock.ENOTSUP):
            a.acquire(name, blocking=False, limit=2)
        return
    p1 = a.acquire(name, blocking=False, limit=2)
    p2 = b.acquire(name, blocking=False, limit=2)
    assert p1.limit == p2.limit == 2 and p1.mode == "exclusive"
    with pytest.raises(dlock.EBUSY):
        c.acquire(name, blocking=False, limit=2)
    for other in ({"limit": 3}, {}, {"shared": True}):
        t0 = time.monotonic()
        with pytest.raises(dlock.EMODE):
            c.acquire(name, timeout=5, **other)
        assert time.monotonic() - t0 < 2.5, "{} refused at once".format(other)
    hs = c.inspect_holders(name)
    assert [h.get("limit") for h in hs] == [2, 2]
    assert [h.get("token") for h in hs] == [p1.token, p2.token]
    p1.release()
    with c.lock(name, timeout=10, limit=2) as p3:
        assert p3.token > p2.token and p2.held
    p2.release()


def test_aio_modes(store_uri, name):
    async def main():
        a = await dlock.aio.open(store_uri)
        try:
            if not a.caps & dlock.CAP_SHARED:
                with pytest.raises(dlock.ENOTSUP):
                    await a.acquire(name, blocking=False, shared=True)
            else:
                async with a.lock(name, blocking=False, shared=True) as lock:
                    assert lock.mode == "shared"
                    hs = await a.inspect_holders(name)
                    assert [h.get("token") for h in hs] == [lock.token]
            if not a.caps & dlock.CAP_SEMAPHORE:
                with pytest.raises(dlock.ENOTSUP):
                    await a.acquire(name + "-s", blocking=False, limit=3)
            else:
                async with a.lock(name + "-s", blocking=False, limit=3) as lock:
                    assert lock.limit == 3
            with pytest.raises(dlock.EINVAL):
                await a.acquire(name, blocking=False, limit=0)
        finally:
            await a.close()

    asyncio.run(asyncio.wait_for(main(), 60))
