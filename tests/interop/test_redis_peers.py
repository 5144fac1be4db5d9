"""Redis layout=plain against the peers' real clients (issue 28).

Peers: redis-py's Lock (Debian's python3-redis: SET name token NX PX,
compare-and-delete), node-redlock 4 over the Redlock hosts, and
redis-semaphore's Mutex (key "mutex:<name>", dlock with prefix=mutex:).
For each: the peer holds and dlock is refused (the CLI's exit 75 and the
Python binding's EBUSY), dlock holds and the peer is refused; the same with
layout=dlock, where both hold (the negative control); handoffs both ways
with the server's keyspace notifications on and off (CONFIG SET, the
original value restored after); dlock's tokens strictly increasing with
peer grants between; bad input; and redis-py through a Sentinel when
DLOCK_REDIS_SENTINEL_URI is set (skipped otherwise). DLOCK_INTEROP_ROUNDS=N (default 3) runs N
handoffs each way per case and logs their median (the benchmark: 30).
"""

import os
import random
import shutil
import socket
import statistics
import time
from urllib.parse import urlsplit

import pytest

import dlock
from conftest import (EXIT_BUSY, dlock_client, dlock_try, env_uri, handoff_dlock_to_peer,
                      handoff_peer_to_dlock, log, missing, peer_module, python_peer,
                      with_params)

ROUNDS = int(os.environ.get("DLOCK_INTEROP_ROUNDS", "3"))
# The peers' retry interval while they wait (ms): their own poll, which
# bounds a dlock → peer handoff whatever dlock does.
PEER_RETRY_MS = 5
# dlock's poll without keyspace notifications (docs/redis.md).
PLAIN_POLL_MS = 25


def hosts_of(uri):
    """[(host, port)] of a redis:// URI, and its db."""
    u = urlsplit(uri)
    hostpart = u.netloc.rsplit("@", 1)[-1]
    out = []
    for hp in hostpart.split(","):
        h, _, p = hp.rpartition(":")
        out.append((h, int(p)))
    db = int(u.path.strip("/") or "0")
    return out, db


def resp(host, port, *args):
    """One command over RESP on a socket of its own; the reply (bytes,
    int, list or an Exception for an error reply)."""
    with socket.create_connection((host, port), timeout=5) as s:
        msg = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            msg += b"$%d\r\n%s\r\n" % (len(a), a)
        s.sendall(msg)
        f = s.makefile("rb")

        def read():
            line = f.readline().rstrip(b"\r\n")
            t, rest = line[:1], line[1:]
            if t == b"+":
                return rest
            if t == b"-":
                return Exception(rest.decode())
            if t == b":":
                return int(rest)
            if t == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2]
            if t == b"*":
                return [read() for _ in range(int(rest))]
            raise AssertionError("bad reply {!r}".format(line))

        return read()


class notifications:
    """CONFIG SET notify-keyspace-events on every host (value), the
    original values restored on exit (the servers are shared)."""

    def __init__(self, uri, value):
        self.hosts, _ = hosts_of(uri)
        self.value = value
        self.saved = []

    def __enter__(self):
        for h, p in self.hosts:
            old = resp(h, p, "CONFIG", "GET", "notify-keyspace-events")[1]
            self.saved.append((h, p, old))
            assert resp(h, p, "CONFIG", "SET", "notify-keyspace-events", self.value) == b"OK"
        return self

    def __exit__(self, *exc):
        for h, p, old in self.saved:
            resp(h, p, "CONFIG", "SET", "notify-keyspace-events", old)


def redis_uri():
    return env_uri("DLOCK_REDIS_URI")


def plain(uri, **params):
    return with_params(uri, layout="plain", **params)


# ---- the peers --------------------------------------------------------------

REDIS_PY = """
import redis
host, port, db, key, mode, sleep = PEER_ARGS
r = redis.Redis(host=host, port=int(port), db=int(db))
lk = r.lock(key, timeout=30, sleep=float(sleep))
if mode == 'wait':
    say('waiting')
hold(lk.acquire(blocking=mode != 'try', blocking_timeout=20), lk.release)
"""


def redis_py(peers, uri, key, mode):
    peer_module("redis")
    (h, p), db = hosts_of(uri)[0][0], hosts_of(uri)[1]
    return peers(python_peer(REDIS_PY) + [h, str(p), str(db), key, mode,
                                           str(PEER_RETRY_MS / 1000.0)])


def node_dir():
    d = os.environ.get("DLOCK_INTEROP_NODE")
    if not d or not shutil.which("node"):
        missing("node or DLOCK_INTEROP_NODE is missing")
    for pkg in ("redlock", "redis-semaphore", "ioredis"):
        if not os.path.isdir(os.path.join(d, "node_modules", pkg)):
            missing("{} is not installed in {} (npm ci there)".format(pkg, d))
    return d


def node_peer(peers, kind, uri, name, mode):
    d = node_dir()
    hosts, _ = hosts_of(uri)
    hl = ",".join("{}:{}".format(h, p) for h, p in hosts)
    return peers(["node", os.path.join(d, "redis_peer.js"), kind, mode, name, hl,
                  str(PEER_RETRY_MS)], cwd=d)


# Each case: (peer id, the dlock URI of the plain layout, the same with
# layout=dlock, start(peers, name, mode) → Peer, the peer's key of name).
def cases():
    return ["redis-py", "node-redlock", "redis-semaphore"]


def peer_case(which, peers):
    """(plain URI, dlock-layout URI, start(name, mode), key(name))"""
    if which == "redis-py":
        uri = redis_uri()
        return (plain(uri), uri, lambda n, m: redis_py(peers, uri, n, m), lambda n: n)
    if which == "node-redlock":
        uri = env_uri("DLOCK_REDLOCK_URI")
        return (plain(uri), uri, lambda n, m: node_peer(peers, "redlock", uri, n, m),
                lambda n: n)
    uri = redis_uri()
    return (plain(uri, prefix="mutex:"), with_params(uri, prefix="mutex:"),
            lambda n, m: node_peer(peers, "mutex", uri, n, m), lambda n: "mutex:" + n)


# ---- 1. excluded both ways --------------------------------------------------

@pytest.mark.parametrize("which", cases())
def test_peer_holds_dlock_refused(which, peers, name):
    puri, _, start, key = peer_case(which, peers)
    p = start(name, "hold")
    p.expect("held")
    assert dlock_try(puri, name) == EXIT_BUSY
    with dlock_client(puri) as c:
        with pytest.raises(dlock.EBUSY):
            c.acquire(name, blocking=False)
        info = c.inspect(name)
        assert info.get("held") is True, info
        assert "token" not in info, info  # a peer's grant has none
        assert info.get("lease", 0) > 0, info
        hosts, _ = hosts_of(puri)
        value = resp(hosts[0][0], hosts[0][1], "GET", key(name)).decode()
        assert info.get("owner") == value, (info, value)
    p.send("release")
    p.expect("released")
    assert dlock_try(puri, name) == 0


@pytest.mark.parametrize("which", cases())
def test_dlock_holds_peer_refused(which, peers, name):
    puri, _, start, key = peer_case(which, peers)
    with dlock_client(puri) as c:
        lk = c.acquire(name, ttl=30)
        hosts, _ = hosts_of(puri)
        for h, p in hosts:  # the plain key, with dlock's unique value
            v = resp(h, p, "GET", key(name))
            assert v and v.decode().startswith(lk.owner), v
        start(name, "try").expect("busy")
        lk.release()
        for h, p in hosts:
            assert resp(h, p, "EXISTS", key(name)) == 0
    p = start(name, "try")
    p.expect("held")
    p.send("release")
    p.expect("released")


# ---- 2. the negative control: layout=dlock does not see the peer ------------

@pytest.mark.parametrize("which", cases())
def test_layout_dlock_both_hold(which, peers, name):
    _, duri, start, _ = peer_case(which, peers)
    p = start(name, "hold")
    p.expect("held")
    assert dlock_try(duri, name) == 0, "layout=dlock should not see the peer's key"
    p.send("release")
    p.expect("released")
    with dlock_client(duri) as c:
        lk = c.acquire(name, ttl=30)
        q = start(name, "try")
        q.expect("held")  # both hold: the overlap the plain layout removes
        q.send("release")
        q.expect("released")
        lk.release()


# ---- 3. handoffs both ways, notifications on and off ------------------------

class _Timed:
    """The peer, for conftest's handoff_peer_to_dlock(), with the moment it
    was asked to release kept (asked) and a random phase before asking."""

    def __init__(self, peer):
        self.peer, self.asked, self.released = peer, None, None

    def send(self, text):
        # A random phase: conftest waits a fixed time, which would keep a
        # polling waiter's attempts in step with the release.
        time.sleep(random.uniform(0, 2.5 * PLAIN_POLL_MS / 1000.0))
        self.asked = time.monotonic()
        self.peer.send(text)

    def expect(self, word, timeout=10.0):
        v = self.peer.expect(word, timeout)
        if word == "released":
            self.released = v
        return v


def peer_to_dlock(peer, client, looker, name):
    """(ms from the peer's "released", taken after its release call
    returned: a polling waiter may be granted before it, so this can be
    negative; ms from asking the peer to release, an upper bound adding the
    peer's wake-up and its release's round trip), and the lock."""
    sp = _Timed(peer)
    ms, lk = handoff_peer_to_dlock(sp, client, name, watcher=looker)
    return (ms, ms + (sp.released - sp.asked) * 1000.0), lk


def handoffs(which, peers, name, notify):
    puri, _, start, _ = peer_case(which, peers)
    p2d, p2d_up, d2p = [], [], []
    with notifications(puri, notify):
        with dlock_client(puri) as c, dlock_client(puri) as looker:
            for i in range(ROUNDS):
                n = "{}-{}".format(name, i)
                p = start(n, "hold")
                p.expect("held")
                (ms, up), lk = peer_to_dlock(p, c, looker, n)
                p2d.append(ms)
                p2d_up.append(up)
                q = start(n, "wait")
                q.expect("waiting")
                d2p.append(handoff_dlock_to_peer(lk, q))
                q.send("release")
                q.expect("released")
    return p2d, p2d_up, d2p


@pytest.mark.parametrize("notify", ["Kgx", ""], ids=["notify-on", "notify-off"])
@pytest.mark.parametrize("which", cases())
def test_handoffs(which, notify, peers, name):
    p2d, p2d_up, d2p = handoffs(which, peers, name, notify)
    log("{} notify-keyspace-events={!r}: peer→dlock p50 {:.1f} ms (max {:.1f}; from asking "
        "the peer to release: p50 {:.1f}, max {:.1f}), dlock→peer p50 {:.1f} ms (max {:.1f}; "
        "the peer retries every {} ms), n={}".format(
            which, notify, statistics.median(p2d), max(p2d), statistics.median(p2d_up),
            max(p2d_up), statistics.median(d2p), max(d2p), PEER_RETRY_MS, len(p2d)))
    assert max(p2d_up) < 2000 and max(d2p) < 2000


def evalsha_on(host, port, key, seconds):
    """How many EVALSHA calls naming key the server runs in the next
    seconds (MONITOR: other clients' calls on other keys do not count, so
    suites sharing the server do not disturb it)."""
    n, buf, needle = 0, b"", b'"' + key.encode() + b'"'
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            s.settimeout(max(0.001, end - time.monotonic()))
            try:
                data = s.recv(65536)
            except socket.timeout:
                break
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\r\n")
            n += sum(1 for ln in lines if b'"evalsha"' in ln.lower() and needle in ln)
    return n


def test_notifications_wake_without_poll(peers, name):
    """With notifications on, a dlock waiter behind redis-py is woken by
    the server: the wait made no retry between (no EVALSHA on the key while
    waiting, seen by MONITOR), unlike with them off (the 25 ms poll)."""
    uri = redis_uri()
    (h, port), = hosts_of(uri)[0]
    seen = {}
    for notify in ("Kgx", ""):
        with notifications(uri, notify):
            with dlock_client(plain(uri)) as c:
                p = redis_py(peers, uri, name, "hold")
                p.expect("held")
                import threading
                got = {}
                th = threading.Thread(target=lambda: got.setdefault("l", c.acquire(name)))
                th.start()
                time.sleep(0.3)
                seen[notify] = evalsha_on(h, port, name, 0.5)
                p.send("release")
                p.expect("released")
                th.join(10)
                got["l"].release()
    log("EVALSHA calls on the key in 0.5 s of waiting: notifications on {}, off {}".format(
        seen["Kgx"], seen[""]))
    assert seen["Kgx"] <= 1, seen
    assert seen[""] >= 5, seen  # the 25 ms poll


# ---- 4. tokens ---------------------------------------------------------------

@pytest.mark.parametrize("which", cases())
def test_tokens_increase(which, peers, name):
    puri, _, start, _ = peer_case(which, peers)
    tokens = []
    with dlock_client(puri) as c:
        for _ in range(4):
            lk = c.acquire(name, ttl=30)
            tokens.append(lk.token)
            lk.release()
            p = start(name, "try")
            p.expect("held")
            p.send("release")
            p.expect("released")
    assert all(t > 0 for t in tokens), tokens
    assert tokens == sorted(set(tokens)), tokens


def test_tokens_shared_with_layout_dlock(name):
    """The plain layout's counter is layout=dlock's ("dlock:<name>:fence"
    with the default prefixes): tokens increase across the two layouts."""
    uri = redis_uri()
    tokens = []
    with dlock_client(plain(uri)) as a, dlock_client(uri) as b:
        for c in (a, b, a, b):
            lk = c.acquire(name, ttl=30)
            tokens.append(lk.token)
            lk.release()
    assert tokens == sorted(set(tokens)), tokens


# ---- 5. bad input ------------------------------------------------------------

def test_bad_input(name):
    uri = redis_uri()
    with pytest.raises(dlock.EBADURI) as e:
        with dlock_client(with_params(uri, layout="nonsense")) as c:
            c.ping()
    assert "plain" in str(e.value)
    with dlock_client(plain(uri)) as c:
        with pytest.raises(dlock.ENOTSUP):
            c.acquire(name, shared=True)
        with pytest.raises(dlock.ENOTSUP):
            c.acquire(name, limit=3)
    with pytest.raises(dlock.ENOTSUP) as e:
        dlock.open("redis+cluster://127.0.0.1:1?layout=plain")
    assert "layout=plain" in str(e.value)
    with pytest.raises(dlock.EBADURI):
        dlock.open(plain(uri, wait_replicas=1))


# ---- Sentinel: the same code on the primary the sentinels name --------------

SENTINEL_PY = """
import redis
from redis.sentinel import Sentinel
host, port, service, password, key, mode = PEER_ARGS
s = Sentinel([(host, int(port))], sentinel_kwargs={'password': password or None},
             password=password or None)
lk = s.master_for(service).lock(key, timeout=30)
hold(lk.acquire(blocking=mode != 'try', blocking_timeout=20), lk.release)
"""


def test_sentinel_redis_py(peers, name):
    """redis+sentinel://...?layout=plain against redis-py's Sentinel
    master_for().lock(), both ways (skipped without a Sentinel store)."""
    uri = os.environ.get("DLOCK_REDIS_SENTINEL_URI")
    if not uri:
        pytest.skip("DLOCK_REDIS_SENTINEL_URI is not set")
    peer_module("redis")
    u = urlsplit(uri)
    password = u.password or ""
    h, _, p = u.netloc.rsplit("@", 1)[-1].split(",")[0].rpartition(":")
    service = u.path.strip("/").split("/")[0]
    start = lambda mode: peers(python_peer(SENTINEL_PY) + [h, p, service, password, name, mode])
    puri = plain(uri)
    q = start("hold")
    q.expect("held")
    assert dlock_try(puri, name) == EXIT_BUSY
    assert dlock_try(uri, name) == 0  # layout=dlock: both hold
    q.send("release")
    q.expect("released")
    with dlock_client(puri) as c:
        lk = c.acquire(name, ttl=30)
        start("try").expect("busy")
        lk.release()
    q = start("try")
    q.expect("held")
    q.send("release")
    q.expect("released")
