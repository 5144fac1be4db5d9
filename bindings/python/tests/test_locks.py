"""The C conformance cases that apply to a binding, on every store."""

import socket
import threading
import time

import pytest

import dlock


def test_try_wait_timeout(clients, name):
    holder, other = clients(2)
    held = holder.acquire(name, blocking=False)
    assert held.token > 0 and held.name == name

    t0 = time.monotonic()
    with pytest.raises(dlock.EBUSY) as e:
        other.acquire(name, blocking=False)
    assert time.monotonic() - t0 < 1.0, "a try returns at once"
    assert e.value.code == "DLOCK_EBUSY"

    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        other.acquire(name, timeout=0.3)
    el = time.monotonic() - t0
    assert isinstance(e.value, dlock.ETIMEDOUT)
    assert 0.29 <= el < 3.0, "timed out near the deadline ({:.3f} s for 0.3 s)".format(el)

    with pytest.raises(dlock.ETIMEDOUT):
        other.acquire(name, deadline=dlock.monotonic() - 0.001)

    # Forever: the holder lets go 0.2 s into the wait.
    threading.Timer(0.2, held.release).start()
    t0 = time.monotonic()
    got = other.acquire(name)
    el = time.monotonic() - t0
    assert el >= 0.15, "it waited for the release ({:.3f} s)".format(el)
    assert got.token > held.token
    got.release()
    assert not got.held


def test_context_manager_releases_on_exception(clients, name):
    a, b = clients(2)
    with pytest.raises(KeyError):
        with a.lock(name, ttl=10) as lock:
            assert lock.held
            with pytest.raises(dlock.EBUSY):
                b.acquire(name, blocking=False)
            raise KeyError("boom")
    assert not lock.held
    b.acquire(name, blocking=False).release()
    # The Lock itself is a context manager too.
    with a.acquire(name, blocking=False) as l2:
        assert l2.held
    assert not l2.held


def test_tokens_strictly_increase(clients, name):
    a, b = clients(2)
    last = 0
    for i in range(6):
        with (a if i % 2 else b).lock(name, blocking=False) as lock:
            assert isinstance(lock.token, int)
            assert lock.token > last, "token {} after {}".format(lock.token, last)
            last = lock.token


def test_same_client_twice(clients, name):
    a = clients()
    with a.lock(name, blocking=False):
        with pytest.raises(dlock.EALREADY):
            a.acquire(name, blocking=False)
        l1 = a.acquire(name, reentrant=True)
        assert l1.holds == 2
        l1.release()
        assert l1.held and l1.holds == 1


def test_renew(clients, name):
    a = clients()
    with a.lock(name, ttl=5) as lock:
        lock.renew(10)
        if a.caps & dlock.CAP_LEASE:
            assert lock.expires - dlock.monotonic() > 5


def test_fifo_handoff(store_uri, clients, name):
    n = 4
    holder = clients()
    if not holder.caps & dlock.CAP_FIFO:
        pytest.skip("{} does not declare DLOCK_CAP_FIFO".format(holder.backend))
    waiters = clients(n)
    held = holder.acquire(name, keep=True)  # counting waiters may take seconds (MySQL)
    order, errors = [], []

    def wait(i, c):
        try:
            with c.lock(name, timeout=30):
                order.append(i)
                time.sleep(0.02)
        except Exception as e:  # reported below
            errors.append(e)

    threads = []
    for i, c in enumerate(waiters):
        t = threading.Thread(target=wait, args=(i, c))
        t.start()
        threads.append(t)
        wait_queued(holder, name, i + 1)  # queued before the next one comes
    held.release()
    for t in threads:
        t.join(60)
    assert not errors
    assert order == list(range(n)), "served in arrival order"


def wait_queued(client, name, n):
    """Until the store counts n waiters on name (where it can tell), then a
    little more; else 0.3 s."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            waiters = client.inspect(name).get("waiters")
        except dlock.ENOTSUP:
            waiters = None
        if waiters is None:
            break
        if waiters >= n:
            time.sleep(0.05)
            return
        # Not faster: MySQL's waiter views are a snapshot that InnoDB only
        # refreshes once nobody has read it for 0.1 s.
        time.sleep(0.2)
    time.sleep(0.3)


def test_fencing_across_handoff(clients, name):
    a, b = clients(2)
    la = a.acquire(name)
    got = []
    t = threading.Thread(target=lambda: got.append(b.acquire(name, timeout=20)))
    t.start()
    time.sleep(0.2)
    la.release()
    t.join(30)
    assert got and got[0].token > la.token
    got[0].release()


def test_several_names(clients, name):
    a, b = clients(2)
    names = [name + "-2", name + "-1"]
    with a.lock(names, blocking=False) as lock:
        assert lock.names == tuple(sorted(names))
        with pytest.raises(dlock.EBUSY):
            b.acquire(name + "-1", blocking=False)
    b.acquire(name + "-1", blocking=False).release()


def test_bad_uri():
    with pytest.raises(dlock.EBADURI) as e:
        dlock.open("redis://[nowhere")
    assert e.value.code == "DLOCK_EBADURI" and e.value.errno == -2
    assert isinstance(e.value, ValueError)
    with pytest.raises(dlock.ESCHEME):
        dlock.open("nosuchstore://x/y")


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_store(store_uri):
    import re
    m = re.match(r"^([a-z+]+)://(?:([^@/]*)@)?([^/?]+)(.*)$", store_uri)
    if store_uri.startswith("file:") or not m:
        pytest.skip("the store has no network endpoint")
    scheme, cred, _hosts, rest = m.groups()
    uri = "{}://{}127.0.0.1:{}{}".format(scheme, cred + "@" if cred else "", _closed_port(), rest)
    t0 = time.monotonic()
    with pytest.raises(dlock.ECONNECT) as e:
        dlock.open(uri)
    assert time.monotonic() - t0 < 10
    assert isinstance(e.value, ConnectionError)
    assert e.value.code == "DLOCK_ECONNECT"
    assert "127.0.0.1" in e.value.message, e.value.message


def test_closed_client(clients, name):
    a = clients()
    lock = a.acquire(name, blocking=False)
    a.close()
    assert not lock.held and not lock.lost
    lock.release()  # already released by the close: nothing to do
    with pytest.raises(dlock.EINVAL):
        a.acquire(name)


def test_one_client_from_many_threads(clients, name):
    """The client serialises its calls itself (libdlock requires it): eight
    threads sharing one client each take and release their own names."""
    c = clients()
    errors = []
    tokens = []

    def work(i):
        try:
            for k in range(10):
                with c.lock("{}-{}".format(name, i), timeout=30) as lock:
                    tokens.append(lock.token)
                    assert lock.name == "{}-{}".format(name, i)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(tokens) == 80


def test_names_str_and_bytes(tmp_path):
    with dlock.open("file://" + str(tmp_path)) as c:
        with c.lock("näme/ü") as a, c.lock(b"\xff\xfe-raw") as b:
            assert a.name == "näme/ü" and b.name == b"\xff\xfe-raw"
        with c.lock([b"\xff-1", "n-2"]) as m:
            assert m.names == ("n-2", b"\xff-1")  # byte order; bytes where not UTF-8
        for bad in ("", "a\0b", "x" * 4097):
            with pytest.raises(ValueError):
                c.acquire(bad)
        with pytest.raises(TypeError):
            c.acquire(42)
