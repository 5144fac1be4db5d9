"""PostgreSQL: dlock's layout=tooz against tooz's PostgreSQL driver, and
layout=int against an application's plain pg_advisory_lock(N) (psycopg2).

tooz takes pg_advisory_lock(b0, b1) with the first two bytes of MD5(name)
as two int4 arguments (psycopg2 passes the 2-byte key as a sequence of two
ints); its names are bytes (a str name is a TypeError in tooz's md5). An
application takes pg_advisory_lock(N), or pg_advisory_lock_shared(N), on a
bigint. Each pair: both directions excluded in the peer's layout, both
holding with layout=dlock (the negative control), handoffs both ways timed,
tokens increasing across peer grants, and the refusals.

DLOCK_INTEROP_HANDOFFS (default 5) handoffs each way per peer; their p50
is logged.
"""

import os
import secrets
import statistics

import pytest

import dlock
from conftest import (EXIT_BUSY, dlock_client, dlock_try, env_uri,
                      handoff_dlock_to_peer, handoff_peer_to_dlock, log, peer_module, python_peer,
                      with_params)

HANDOFFS = int(os.environ.get("DLOCK_INTEROP_HANDOFFS", "5"))

# PEER_ARGS: kind (tooz, int, int-shared), store URI, name, how (try, block).
PEER = r'''
kind, uri, name, how = PEER_ARGS
if kind == "tooz":
    from tooz import coordination
    coord = coordination.get_coordinator(uri, b"peer")
    coord.start()
    lk = coord.get_lock(name.encode("utf-8"))
    def take(block):
        return lk.acquire(blocking=block)
    def give():
        assert lk.release()
else:
    import psycopg2
    n = int(name)
    conn = psycopg2.connect(uri)
    conn.autocommit = True
    cur = conn.cursor()
    sh = "_shared" if kind == "int-shared" else ""
    def take(block):
        f = "pg_advisory_lock" if block else "pg_try_advisory_lock"
        cur.execute("SELECT " + f + sh + "(%s)", (n,))
        got = cur.fetchone()[0]
        return True if block else got
    def give():
        cur.execute("SELECT pg_advisory_unlock" + sh + "(%s)", (n,))
        assert cur.fetchone()[0]
if how == "block":
    say("waiting")
    take(True)
elif not take(False):
    say("busy")
    sys.exit(0)
say("held", now())
wait_cmd()
give()
say("released", now())
'''


@pytest.fixture
def pg():
    uri = env_uri("DLOCK_POSTGRES_URI")
    return uri


@pytest.fixture
def tooz_ok():
    peer_module("tooz.drivers.pgsql")


@pytest.fixture
def psycopg_ok():
    peer_module("psycopg2")


def peer(peers, kind, uri, name, how="try"):
    return peers(python_peer(PEER) + [kind, uri, name, how])


def peer_takes_and_releases(peers, kind, uri, name):
    """A peer's try holds name (fails otherwise), then it releases."""
    p = peer(peers, kind, uri, name)
    p.expect("held")
    p.send("release")
    p.expect("released")


def int_name():
    """A bigint no other run uses, negative half the time."""
    v = secrets.randbits(62) + 1
    return str(-v if secrets.randbits(1) else v)


def tooz_name(name):
    # Not ASCII: the bytes are the UTF-8 both sides hash.
    return name + "-\u00e9t\u00e9"


CASES = [
    # (peer kind, layout, name maker)
    pytest.param("tooz", "tooz", tooz_name, id="tooz", marks=pytest.mark.usefixtures("tooz_ok")),
    pytest.param("int", "int", lambda n: int_name(), id="int",
                 marks=pytest.mark.usefixtures("psycopg_ok")),
]


@pytest.mark.parametrize("kind,layout,make", CASES)
def test_peer_holds_dlock_tries(pg, peers, name, kind, layout, make):
    n = make(name)
    p = peer(peers, kind, pg, n)
    p.expect("held")
    assert dlock_try(with_params(pg, layout=layout), n) == EXIT_BUSY
    c = dlock_client(with_params(pg, layout=layout))
    try:
        with pytest.raises(dlock.EBUSY):
            c.acquire(n, blocking=False)
        info = c.inspect(n)
        assert info["held"] is True, info
        assert "token" not in info, "a foreign holder has no token: {}".format(info)
        assert info.get("owner", "").startswith("pid "), info
        log("{}: inspect of a peer-held name: {}".format(kind, info))
    finally:
        c.close()
    # The negative control: layout=dlock takes another key, so both hold.
    assert dlock_try(pg, n) == 0
    p.send("release")
    p.expect("released")


@pytest.mark.parametrize("kind,layout,make", CASES)
def test_dlock_holds_peer_tries(pg, peers, name, kind, layout, make):
    n = make(name)
    c = dlock_client(with_params(pg, layout=layout))
    try:
        lk = c.acquire(n, blocking=False)
        peer(peers, kind, pg, n).expect("busy")
        lk.release()
        peer_takes_and_releases(peers, kind, pg, n)
    finally:
        c.close()
    # The negative control: held with layout=dlock, the peer gets it too.
    c = dlock_client(pg)
    try:
        lk = c.acquire(n, blocking=False)
        peer_takes_and_releases(peers, kind, pg, n)
        lk.release()
    finally:
        c.close()


@pytest.mark.parametrize("kind,layout,make", CASES)
def test_handoffs(pg, peers, name, kind, layout, make):
    n = make(name)
    c = dlock_client(with_params(pg, layout=layout))
    watcher = dlock_client(with_params(pg, layout=layout))
    to_dlock, to_peer = [], []
    try:
        for _ in range(HANDOFFS):
            p = peer(peers, kind, pg, n)
            p.expect("held")
            ms, lk = handoff_peer_to_dlock(p, c, n, watcher=watcher)
            to_dlock.append(ms)
            w = peer(peers, kind, pg, n, "block")
            w.expect("waiting")
            to_peer.append(handoff_dlock_to_peer(lk, w))
            w.send("release")
            w.expect("released")
    finally:
        watcher.close()
        c.close()
    log("{}: peer release → dlock grant: p50 {:.1f} ms, max {:.1f} ms over {}".format(
        kind, statistics.median(to_dlock), max(to_dlock), len(to_dlock)))
    log("{}: dlock release → peer grant: p50 {:.1f} ms, max {:.1f} ms over {}".format(
        kind, statistics.median(to_peer), max(to_peer), len(to_peer)))
    assert max(to_dlock) < 2000 and max(to_peer) < 2000, (to_dlock, to_peer)


@pytest.mark.parametrize("kind,layout,make", CASES)
def test_tokens_increase_across_peer_grants(pg, peers, name, kind, layout, make):
    n = make(name)
    c = dlock_client(with_params(pg, layout=layout))
    tokens = []
    try:
        for _ in range(4):
            lk = c.acquire(n, blocking=False)
            tokens.append(lk.token)
            lk.release()
            peer_takes_and_releases(peers, kind, pg, n)
    finally:
        c.close()
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    assert tokens[0] > 0, tokens


@pytest.mark.usefixtures("psycopg_ok")
def test_int_shared(pg, peers):
    """layout=int's shared mode is pg_advisory_lock_shared(N): an
    application's readers and dlock's share it, writers exclude both."""
    n = int_name()
    uri = with_params(pg, layout="int")
    r = peer(peers, "int-shared", pg, n)
    r.expect("held")
    assert dlock_try(uri, n, "--shared") == 0
    assert dlock_try(uri, n) == EXIT_BUSY
    c = dlock_client(uri)
    try:
        lk = c.acquire(n, blocking=False, shared=True)
        peer(peers, "int", pg, n).expect("busy")
        r.send("release")
        r.expect("released")
        peer(peers, "int-shared", pg, n).expect("held")
        lk.release()
    finally:
        c.close()


def test_bad_input(pg, name):
    with pytest.raises(dlock.EBADURI):
        dlock.open(with_params(pg, layout="nonsense"))
    with pytest.raises(dlock.EBADURI):
        dlock.open(with_params(pg, layout="tooz", namespace="a"))
    c = dlock_client(with_params(pg, layout="tooz"))
    try:
        for how in ({"shared": True}, {"limit": 2}):
            with pytest.raises(dlock.ENOTSUP) as e:
                c.acquire(name, blocking=False, **how)
            assert "layout=tooz" in e.value.message, e.value.message
    finally:
        c.close()
    c = dlock_client(with_params(pg, layout="int"))
    try:
        with pytest.raises(dlock.ENOTSUP) as e:
            c.acquire("42", blocking=False, limit=2)
        assert "layout=int" in e.value.message, e.value.message
        for bad in (name, "12x", "+5", "007", "-0", "", "9223372036854775808",
                    "-9223372036854775809", " 5"):
            if not bad:
                continue
            with pytest.raises(dlock.EINVAL) as e:
                c.acquire(bad, blocking=False)
            assert "layout=int" in e.value.message, e.value.message
            with pytest.raises(dlock.EINVAL):
                c.inspect(bad)
        for good in ("9223372036854775807", "-9223372036854775808", "0"):
            c.acquire(good, blocking=False).release()
    finally:
        c.close()


@pytest.mark.parametrize("kind,layout,make", CASES)
def test_list_of_both_layouts(pg, peers, name, kind, layout, make):
    """The migration's middle phase: a list holding the same database in
    the peer's layout and in dlock's takes both locks, so it excludes the
    peer and the processes already on layout=dlock."""
    n = make(name)
    both = "{} {}".format(with_params(pg, layout=layout), pg)
    p = peer(peers, kind, pg, n)
    p.expect("held")
    assert dlock_try(both, n) == EXIT_BUSY
    p.send("release")
    p.expect("released")
    native = dlock_client(pg)
    try:
        lk = native.acquire(n, blocking=False)
        assert dlock_try(both, n) == EXIT_BUSY
        lk.release()
    finally:
        native.close()
    c = dlock_client(both)
    try:
        lk = c.acquire(n, blocking=False)
        peer(peers, kind, pg, n).expect("busy")
        assert dlock_try(pg, n) == EXIT_BUSY
        lk.release()
    finally:
        c.close()
    peer_takes_and_releases(peers, kind, pg, n)
