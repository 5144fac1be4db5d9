"""Leader election: campaign, leader, proclaim, resign, observers, and the
asyncio forms, on every store (a networked store whose backend has no
elections skips them; file:// must have them)."""

import asyncio
import gc
import os
import threading
import time

import pytest

import dlock
import dlock.aio


@pytest.fixture
def elect(clients, store_uri):
    """elect(n): n clients of a store with elections."""
    def make(n=1):
        made = clients(n)
        first = made if n == 1 else made[0]
        if not first.caps & dlock.CAP_ELECTION:
            assert not store_uri.startswith("file://"), "file:// declares DLOCK_CAP_ELECTION"
            pytest.skip("{} has no elections".format(first.backend))
        return made
    return make


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_campaign_leader_proclaim_resign(elect, name):
    a, b = elect(2)
    none = b.leader(name)
    assert isinstance(none, dlock.Leader)
    assert (none.name, none.held, none.value, none.term, none.error) == (name, False, b"", 0,
                                                                          None)

    lead = a.campaign(name, "host-a:8080", ttl=10)
    assert isinstance(lead, dlock.Leadership) and isinstance(lead, dlock.Lock)
    assert lead.term > 0 and lead.term == lead.token
    assert lead.value == b"host-a:8080"
    assert lead.name == name and lead.held and not lead.lost
    now = b.leader(name)
    assert now.held and now.term == lead.term and now.value == b"host-a:8080"
    assert now.lease is None or now.lease > 0
    assert now.owner is None or len(now.owner) > 0
    with pytest.raises(dlock.EBUSY):
        b.campaign(name, "b", blocking=False)
    with pytest.raises(dlock.EBUSY):
        b.acquire(name, blocking=False)

    raw = bytes([0, 1, 2, 255, 0])  # bytes as given, NUL included
    lead.proclaim(raw)
    assert lead.value == raw
    now = b.leader(name)
    assert now.value == raw and now.term == lead.term, "proclaim keeps the term"
    lead.proclaim(bytearray(b"hi"))
    assert b.leader(name).value == b"hi"

    lead.resign()
    assert not lead.held
    after = b.leader(name)
    assert not after.held and after.value == b"" and after.term == 0
    with pytest.raises(dlock.EINVAL):
        lead.proclaim("late")
    lead.resign()  # twice does nothing


def test_leadership_context_manager_resigns(elect, name):
    a, b = elect(2)
    with a.campaign(name, value="x") as lead:
        assert b.leader(name).term == lead.term
    assert not lead.held
    assert not b.leader(name).held
    with pytest.raises(RuntimeError):
        with a.campaign(name, value="y"):
            raise RuntimeError("boom")
    assert not b.leader(name).held, "resigned also when the block raised"


def test_second_candidate_leads_after_resign(elect, name):
    a, b = elect(2)
    first = a.campaign(name, b"a")
    got = {}

    def candidate():
        got["lead"] = b.campaign(name, b"b", timeout=20)
    t = threading.Thread(target=candidate)
    t.start()
    time.sleep(0.4)
    assert "lead" not in got, "the second waits while the first leads"
    assert a.leader(name).value == b"a"
    first.resign()
    t.join(20)
    second = got["lead"]
    assert second.term > first.term
    now = a.leader(name)
    assert now.term == second.term and now.value == b"b"
    second.release()  # a leadership's release() resigns
    assert not a.leader(name).held


def _next(obs, what):
    change = obs.get(timeout=10)
    assert change is not None, "no {} within 10 s".format(what)
    assert change.error is None, change.error
    return change


def test_observer_sees_changes_in_order(elect, name):
    a, b, c = elect(3)
    with c.observe(name) as obs:
        assert isinstance(obs, dlock.Observer)
        assert obs.name == name
        assert not _next(obs, "the first state").held
        la = a.campaign(name, "v1")
        ch = _next(obs, "the first leader")
        assert (ch.held, ch.term, ch.value, ch.name) == (True, la.term, b"v1", name)
        la.proclaim("v2")
        ch = _next(obs, "the proclaimed value")
        assert (ch.held, ch.term, ch.value) == (True, la.term, b"v2")
        la.resign()
        ch = _next(obs, "no leader after resign")
        assert (ch.held, ch.value, ch.term) == (False, b"", 0)
        lb = b.campaign(name, "v3")
        ch = _next(obs, "the second leader")
        assert (ch.held, ch.term, ch.value) == (True, lb.term, b"v3")
        assert ch.term > la.term
        lb.resign()
        assert not _next(obs, "no leader after the second resign").held
        assert obs.get(timeout=0.3) is None, "nothing more happened"
        assert obs.reads >= 1


def test_campaign_timeout_try_and_cancel(elect, name):
    a, b, c = elect(3)
    held = a.campaign(name, "a")
    t0 = time.monotonic()
    with pytest.raises(dlock.ETIMEDOUT):
        b.campaign(name, "b", timeout=0.3)
    took = time.monotonic() - t0
    assert 0.25 <= took < 5, "timeout=0.3 took {:.2f} s".format(took)
    with pytest.raises(dlock.EBUSY):
        b.campaign(name, blocking=False)

    cancel = dlock.Cancel()
    out = {}

    def candidate():
        try:
            b.campaign(name, "b", cancel=cancel)
        except dlock.DlockError as e:
            out["err"] = e
    t = threading.Thread(target=candidate)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    cancel.fire()
    t.join(10)
    assert isinstance(out.get("err"), dlock.ECANCELED), out
    assert time.monotonic() - t0 < 5
    cancel.close()
    # Nothing left behind: the next candidate leads once a resigns.
    held.resign()
    nxt = c.campaign(name, "c", timeout=10)
    assert a.leader(name).value == b"c"
    assert nxt.term > held.term
    nxt.resign()


def test_observer_close(elect, name, store_uri):
    a, b = elect(2)
    obs = b.observe(name)
    assert not obs.closed
    assert obs.fileno() >= 0
    assert not _next(obs, "the first state").held
    seen = []

    def consume():
        for ch in obs:
            seen.append(ch)
    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    obs.close()
    t.join(5)
    assert not t.is_alive(), "an iteration on another thread ends at close()"
    assert time.monotonic() - t0 < 2
    assert obs.closed
    assert seen == []
    obs.close()  # twice does nothing
    with pytest.raises(dlock.EINVAL):
        obs.get(timeout=0)
    with pytest.raises(dlock.EINVAL):
        obs.fileno()
    assert list(obs) == []

    # An observer outlives its client.
    c = dlock.open(store_uri)
    obs2 = c.observe(name)
    c.close()
    assert not _next(obs2, "the first state").held
    lead = a.campaign(name, "x")
    assert _next(obs2, "the leader").term == lead.term
    obs2.close()
    lead.resign()


def test_leadership_lost(elect, name, store_uri):
    if not store_uri.startswith("file://"):
        pytest.skip("the lock file is removed on the file store only")
    a, b = elect(2)
    told = threading.Event()
    got = []

    def on_lost(lead, err):
        got.append((lead, err))
        told.set()
    lead = a.campaign(name, "v", ttl=1, on_lost=on_lost)
    path = os.path.join(store_uri[len("file://"):], name + ".lock")
    assert os.path.exists(path), path
    os.remove(path)  # the lock is no longer ours
    assert told.wait(10), "on_lost was not called within 10 s"
    assert got[0][0] is lead
    assert isinstance(got[0][1], dlock.ELOST)
    assert lead.lost
    assert isinstance(lead.lost_error, dlock.ELOST)
    with pytest.raises(dlock.ELOST):
        lead.proclaim("late")
    nxt = b.campaign(name, "w", timeout=5)
    assert nxt.term > lead.term
    with pytest.raises(dlock.ELOST):
        lead.resign()
    nxt.resign()

    async def main():
        c = await dlock.aio.open(store_uri)
        try:
            lead = await c.campaign(name, "x", ttl=1)
            os.remove(path)
            err = await asyncio.wait_for(lead.wait_lost(), 10)
            assert isinstance(err, dlock.ELOST)
            assert lead.lost_event.is_set()
            with pytest.raises(dlock.ELOST):
                await lead.proclaim("late")
        finally:
            await c.close()
    run(main())


def _threads():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_observer_dropped_is_closed(elect, name):
    a = elect(1)
    before = _threads()
    observers = [a.observe(name) for _ in range(5)]
    assert _threads() >= before + 5, "each observer has a thread"
    del observers
    gc.collect()
    for _ in range(50):
        if _threads() <= before:
            break
        time.sleep(0.05)
    assert _threads() <= before, "the dropped observers' threads ended"


def test_bad_input(elect, name):
    a = elect(1)
    with pytest.raises(dlock.EINVAL):
        a.campaign(name, b"x" * 1025)
    with pytest.raises(dlock.EINVAL):
        a.campaign(name, "\u00e9" * 513)  # 1026 bytes in UTF-8
    assert not a.leader(name).held, "a refused campaign leaves no leader"
    lead = a.campaign(name, b"a" * 1024)
    assert a.leader(name).value == b"a" * 1024
    with pytest.raises(dlock.EINVAL):
        lead.proclaim(b"x" * 1025)
    assert a.leader(name).value == b"a" * 1024, "a refused proclaim changes nothing"
    lead.resign()
    for bad in ("", "a\0b", "x" * 5000):
        with pytest.raises(ValueError):
            a.campaign(bad, "x")
        with pytest.raises(ValueError):
            a.leader(bad)
        with pytest.raises(ValueError):
            a.observe(bad)
    with pytest.raises(TypeError):
        a.campaign(name, 42)
    with pytest.raises(TypeError):
        a.leader(42)
    with pytest.raises(ValueError):
        a.campaign(name, "x", ttl=0)


def test_aio_campaign_and_observe(elect, name, store_uri):
    elect(1)  # skips a store without elections

    async def main():
        a = await dlock.aio.open(store_uri)
        b = await dlock.aio.open(store_uri)
        c = await dlock.aio.open(store_uri)
        try:
            obs = c.observe(name)
            changes = []
            got = asyncio.Event()

            async def watch():
                async for ch in obs:
                    changes.append(ch)
                    got.set()

            async def wait_for(n, what):
                while len(changes) < n:
                    got.clear()
                    try:
                        await asyncio.wait_for(got.wait(), 10)
                    except asyncio.TimeoutError:
                        pytest.fail("no {} within 10 s".format(what))
                return changes[n - 1]

            task = asyncio.ensure_future(watch())
            assert not (await wait_for(1, "first state")).held
            ticks = 0

            async def tick():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)
            ticker = asyncio.ensure_future(tick())
            async with await a.campaign(name, "v1", ttl=10) as lead:
                assert isinstance(lead, dlock.aio.Leadership)
                assert lead.value == b"v1"
                ch = await wait_for(2, "the first leader")
                assert (ch.held, ch.term, ch.value) == (True, lead.term, b"v1")
                second = asyncio.ensure_future(b.campaign(name, "v3", timeout=20))
                await lead.proclaim("v2")
                assert lead.value == b"v2"
                ch = await wait_for(3, "the proclaimed value")
                assert (ch.held, ch.term, ch.value) == (True, lead.term, b"v2")
                await asyncio.sleep(0.3)
                assert not second.done(), "the second waits while the first leads"
            ticker.cancel()
            assert ticks >= 10, "the loop ticked {} times".format(ticks)
            assert not lead.held, "async with resigned"
            lb = await second
            assert lb.term > lead.term
            # "no leader" may be folded into the next leader when the second
            # takes over faster than one read: the last change is the second.
            ch = await wait_for(4, "the next change")
            if not ch.held:
                ch = await wait_for(5, "the second leader")
            assert (ch.held, ch.term, ch.value) == (True, lb.term, b"v3")
            assert (await b.leader(name)).value == b"v3"
            seen = len(changes)
            await lb.resign()
            ch = await wait_for(seen + 1, "no leader")
            assert not ch.held

            # Cancelling the task cancels the campaign; nothing is left behind.
            held = await a.campaign(name, "a")
            t = asyncio.ensure_future(b.campaign(name, "b"))
            await asyncio.sleep(0.3)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            with pytest.raises(dlock.ETIMEDOUT):
                await b.campaign(name, "b", timeout=0.2)
            await held.resign()
            lc = await b.campaign(name, "c", blocking=False)
            await lc.resign()

            obs.close()
            await asyncio.wait_for(task, 5)  # the async for ends at close()
            assert obs.closed
            n = len(changes)
            lz = await a.campaign(name, "z")
            await asyncio.sleep(0.3)
            assert len(changes) == n, "no change after close()"
            await lz.resign()

            # await observe(): started; get(timeout).
            obs2 = await c.observe(name)
            assert not (await obs2.get(timeout=10)).held
            assert await obs2.get(timeout=0.2) is None
            obs2.close()
            with pytest.raises(dlock.EINVAL):
                await obs2.get(timeout=0)
        finally:
            for x in (a, b, c):
                await x.close()
    run(main())
