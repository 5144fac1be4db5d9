"""Cancelling a wait from another thread; kept locks and their loss."""

import os
import threading
import time

import pytest

import dlock


def test_cancel_from_another_thread(clients, name):
    holder, w1, w2 = clients(3)
    held = holder.acquire(name, blocking=False)
    k, k2 = dlock.Cancel(), dlock.Cancel()
    assert not k.fired
    # Every built-in backend can cancel a wait: one that stopped declaring
    # it fails here (its cancellable waits would be refused).
    assert w1.caps & dlock.CAP_CANCEL, "{} declares DLOCK_CAP_CANCEL".format(w1.backend)
    results = {}

    def wait(key, c, cancel, **kw):
        try:
            results[key] = c.acquire(name, cancel=cancel, **kw)
        except dlock.DlockError as e:
            results[key] = e
        results[key + "-end"] = time.monotonic()

    t1 = threading.Thread(target=wait, args=("forever", w1, k))
    t1.start()
    time.sleep(0.3)
    t2 = threading.Thread(target=wait, args=("behind", w2, k2), kwargs={"timeout": 30})
    t2.start()
    time.sleep(0.3)
    # Both still wait, neither flag raised: what follows is the fire's doing.
    assert t1.is_alive() and "forever" not in results, results.get("forever")
    assert t2.is_alive() and "behind" not in results, results.get("behind")
    assert not k.fired and not k2.fired
    t0 = time.monotonic()
    k.fire()
    t1.join(10)
    assert isinstance(results.get("forever"), dlock.ECANCELED), results.get("forever")
    el = results["forever-end"] - t0
    assert 0 <= el < 5, "the wait ended {:.3f} s after the fire".format(el)
    assert "cancel" in results["forever"].message
    # The flag stays raised after the wait it ended; the other one is not.
    assert k.fired and not k2.fired
    assert t2.is_alive() and "behind" not in results, results.get("behind")
    k.fire()  # twice is harmless
    held.release()
    t2.join(30)
    got = results.get("behind")
    assert isinstance(got, dlock.Lock), "the waiter behind the cancelled one is served: {}".format(got)
    got.release()
    # A fired flag refuses at once; the cancelled client is usable.
    with pytest.raises(dlock.ECANCELED):
        w1.acquire(name, blocking=False, cancel=k)
    w1.acquire(name, blocking=False).release()
    k.close()
    k2.close()


def test_cancel_object():
    with dlock.Cancel() as k, dlock.Cancel() as other:
        assert not k.fired
        k.fire()
        assert k.fired and not other.fired, "fire() raises its own flag only"
    assert not k.fired  # closed
    k.fire()  # harmless after close


def _lock_files(d):
    return [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".lock")]


def test_keep_on_lost_file(tmp_path, name):
    """A kept lock whose lock file is moved away is reported lost (as
    test_file_loss in the C suite)."""
    d = tmp_path / "locks"
    events = []
    lost = threading.Event()

    def on_lost(lock, err):
        events.append((lock, err, threading.current_thread()))
        lost.set()

    with dlock.open("file://" + str(d)) as c:
        lock = c.acquire(name, keep=True, ttl=3, on_lost=on_lost)
        assert not lock.lost and lock.lost_error is None
        files = _lock_files(str(d))
        assert len(files) == 1
        t0 = time.monotonic()
        os.rename(files[0], files[0] + ".gone")
        assert lost.wait(5), "on_lost within 5 s"
        el = time.monotonic() - t0
        assert el < 2, "reported {:.2f} s after the file moved (checked every 0.5 s)".format(el)
        got, err, thread = events[0]
        assert got is lock
        assert isinstance(err, dlock.ELOST), err
        assert thread is not threading.main_thread()
        assert lock.lost and isinstance(lock.lost_error, dlock.ELOST)
        time.sleep(0.3)
        assert len(events) == 1, "called once"
        with pytest.raises(dlock.ELOST):
            lock.release()
        assert not lock.held


def test_on_lost_needs_keep(clients, name):
    c = clients()
    with pytest.raises(ValueError):
        c.acquire(name, on_lost=lambda lock, err: None)


def test_keep_renews(clients, name):
    """keep=True holds a lease past its TTL (the keeper renews it)."""
    a, b = clients(2)
    if not a.caps & dlock.CAP_LEASE:
        pytest.skip("{} has no leases".format(a.backend))
    with a.lock(name, ttl=1, keep=True) as lock:
        time.sleep(1.6)
        with pytest.raises(dlock.EBUSY):
            b.acquire(name, blocking=False)
        assert not lock.lost


def test_on_lost_exception_is_reported(tmp_path, name, monkeypatch):
    """An exception from on_lost goes to sys.unraisablehook, and the keeper
    goes on (the lock still reads as lost)."""
    import sys
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    d = tmp_path / "locks"

    def bad(lock, err):
        raise RuntimeError("boom in on_lost")

    with dlock.open("file://" + str(d)) as c:
        lock = c.acquire(name, keep=True, ttl=3, on_lost=bad)
        f = _lock_files(str(d))[0]
        os.rename(f, f + ".gone")
        end = time.monotonic() + 5
        while not seen and time.monotonic() < end:
            time.sleep(0.05)
        assert seen and "boom in on_lost" in str(seen[0])
        assert lock.lost
