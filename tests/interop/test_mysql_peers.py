"""MariaDB: dlock's layout=plain against the clients that take GET_LOCK on
the plain name (issue 28): tooz's MySQL driver (`SELECT GET_LOCK(name, 0)`,
retried, and `RELEASE_LOCK(name)`) and hand-written GET_LOCK code on
pymysql (`GET_LOCK(name, timeout)`, blocking in the server).

Each peer runs as a process on Debian's python3 and takes commands on its
stdin: "try" (prints "held t" or "busy"), "wait" (prints "waiting", then
"held t" once granted), "release" (prints "released t"); at the end of its
input it releases what it holds and exits.

DLOCK_INTEROP_HANDOFFS=N (default 3) sets how many handoffs each handoff
case times; the p50 is logged (docs/mysql.md, "Peer layout: plain", quotes
a run with N = 40).
"""

import os
import statistics

import pytest

import dlock

from conftest import (EXIT_BUSY, dlock_client, dlock_try, env_uri, handoff_dlock_to_peer,
                      handoff_peer_to_dlock, log, peer_module, python_peer, with_params)

PEERS = ["tooz", "pymysql"]

PEER = r"""
import urllib.parse
kind, uri, name = PEER_ARGS
if kind == "tooz":
    from tooz import coordination
    coord = coordination.get_coordinator(uri, b"member")
    coord.start()
    lock = coord.get_lock(name)
    def take(blocking):
        return lock.acquire(blocking=blocking)
    def let_go():
        lock.release()
else:
    import pymysql
    u = urllib.parse.urlsplit(uri)
    conn = pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username,
                           password=u.password, database=u.path[1:], autocommit=True)
    def one(sql, *args):
        cur = conn.cursor()
        cur.execute(sql, args)
        return cur.fetchone()[0]
    def take(blocking):
        return one("SELECT GET_LOCK(%s, %s)", name, 60 if blocking else 0) == 1
    def let_go():
        if one("SELECT RELEASE_LOCK(%s)", name) != 1:
            raise RuntimeError("RELEASE_LOCK did not release")
held = False
while True:
    cmd = wait_cmd()
    if not cmd:
        break
    try:
        if cmd == "try":
            held = take(False)
            say("held", now()) if held else say("busy")
        elif cmd == "wait":
            say("waiting")
            held = take(True)
            say("held", now()) if held else say("error", "not granted")
        elif cmd == "release":
            let_go()
            held = False
            say("released", now())
    except Exception as e:
        say("error", repr(e).replace("\n", " "))
if held:
    let_go()
"""


def uri():
    return env_uri("DLOCK_MYSQL_URI")


def plain_uri():
    return with_params(uri(), layout="plain")


def peer_of(peers, kind, name):
    peer_module("tooz.drivers.mysql" if kind == "tooz" else "pymysql")
    return peers(python_peer(PEER) + [kind, uri(), name])


def peer_try(p):
    """The peer's non-blocking try: True if it holds."""
    p.send("try")
    word = p.line()
    if word.startswith("held"):
        return True
    if word == "busy":
        return False
    p.fail("printed {!r} after try".format(word))


def peer_release(p):
    """The peer releases what it holds."""
    p.send("release")
    p.expect("released")


def handoffs():
    return int(os.environ.get("DLOCK_INTEROP_HANDOFFS", "3"))


def report(direction, ms):
    """Logs the handoffs' p50 and bounds them loosely (a benchmark)."""
    log("mysql plain {}: handoff p50 {:.1f} ms over {} (min {:.1f}, max {:.1f})".format(
        direction, statistics.median(ms), len(ms), min(ms), max(ms)))
    assert statistics.median(ms) < 2000


@pytest.mark.parametrize("kind", PEERS)
def test_peer_holds_dlock_excluded(peers, name, kind):
    p = peer_of(peers, kind, name)
    assert peer_try(p), "the peer could not take a free name"
    assert dlock_try(plain_uri(), name) == EXIT_BUSY
    c = dlock_client(plain_uri())
    try:
        with pytest.raises(dlock.EBUSY):
            c.acquire(name, blocking=False)
        info = c.inspect(name)
        assert info.get("held") is True, info
        assert "token" not in info, info  # a foreign holder has none
        assert info.get("owner", "").startswith("session "), info
        peer_release(p)
        assert c.inspect(name).get("held") is False
        assert dlock_try(plain_uri(), name) == 0
    finally:
        c.close()


@pytest.mark.parametrize("kind", PEERS)
def test_dlock_holds_peer_excluded(peers, name, kind):
    c = dlock_client(plain_uri())
    try:
        lk = c.acquire(name, blocking=False)
        p = peer_of(peers, kind, name)
        assert not peer_try(p), "the peer took {} while dlock held it".format(name)
        lk.release()
        assert peer_try(p), "the peer could not take {} after dlock's release".format(name)
    finally:
        c.close()


@pytest.mark.parametrize("kind", PEERS)
def test_layout_dlock_both_hold(peers, name, kind):
    """The negative control: dlock's own layout takes another lock, so both
    hold the same name at once, each way round."""
    native = with_params(uri(), layout="dlock")
    p = peer_of(peers, kind, name)
    assert peer_try(p)
    assert dlock_try(native, name) == 0, "layout=dlock was excluded by the peer"
    assert dlock_try(with_params(uri(), lock="named", layout="dlock"), name) == 0
    peer_release(p)
    c = dlock_client(native)
    try:
        lk = c.acquire(name, blocking=False)
        assert peer_try(p), "the peer was excluded by layout=dlock"
        lk.release()
    finally:
        c.close()


def test_names_compare_as_bytes(peers, name):
    """MariaDB compares user lock names byte for byte: case and trailing
    spaces make other locks (as dlock's own layout does)."""
    c = dlock_client(plain_uri())
    try:
        lk = c.acquire(name + "-Case", blocking=False)
        for other in (name + "-case", name + "-Case "):
            p = peer_of(peers, "pymysql", other)
            assert peer_try(p), "{!r} was excluded by {!r}".format(other, name + "-Case")
        p = peer_of(peers, "pymysql", name + "-Case")
        assert not peer_try(p)
        lk.release()
        lk = c.acquire(name + "-caf\u00e9", blocking=False)
        p = peer_of(peers, "pymysql", name + "-caf\u00e9")
        assert not peer_try(p), "a UTF-8 name is not the peer's"
        lk.release()
    finally:
        c.close()


@pytest.mark.parametrize("kind", PEERS)
def test_handoff_peer_to_dlock(peers, name, kind):
    c = dlock_client(plain_uri())
    watcher = dlock_client(plain_uri())
    p = peer_of(peers, kind, name)
    ms = []
    try:
        for _ in range(handoffs()):
            assert peer_try(p)
            took, lk = handoff_peer_to_dlock(p, c, name, watcher=watcher)
            ms.append(took)
            lk.release()
    finally:
        c.close()
        watcher.close()
    report("{} → dlock".format(kind), ms)


@pytest.mark.parametrize("kind", PEERS)
def test_handoff_dlock_to_peer(peers, name, kind):
    c = dlock_client(plain_uri())
    p = peer_of(peers, kind, name)
    ms = []
    try:
        for _ in range(handoffs()):
            lk = c.acquire(name, blocking=False)
            p.send("wait")
            p.expect("waiting")
            took = handoff_dlock_to_peer(lk, p)
            assert took > 0, "the peer held {} {:.1f} ms before dlock's release".format(name, -took)
            ms.append(took)
            peer_release(p)
    finally:
        c.close()
    report("dlock → {}".format(kind), ms)


@pytest.mark.parametrize("kind", PEERS)
def test_tokens_increase(peers, name, kind):
    p = peer_of(peers, kind, name)
    tokens = []
    with dlock_client(plain_uri()) as c:
        for _ in range(4):
            with c.acquire(name, blocking=False) as lk:
                tokens.append(lk.token)
                assert not peer_try(p), "the peer took {} while dlock held it".format(name)
            assert peer_try(p), "the peer could not take {} after dlock's release".format(name)
            peer_release(p)
    log("mysql plain tokens with {} grants between: {}".format(kind, tokens))
    assert all(t > 0 for t in tokens)
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens


def test_bad_input(name):
    for params in ({"layout": "nonsense"}, {"layout": "Plain"},
                   {"layout": "plain", "lock": "row"}, {"layout": "plain", "token": "table"}):
        with pytest.raises(dlock.EBADURI):
            dlock.open(with_params(uri(), **params))
    c = dlock_client(with_params(uri(), layout="plain", lock="named", token="sequence"))
    try:
        ok = c.acquire("a" * 64, blocking=False)  # 64 characters: the limit
        ok.release()
        with pytest.raises(dlock.EINVAL):
            c.acquire("a" * 65, blocking=False)
        with pytest.raises(dlock.EINVAL):
            c.inspect("a" * 65)
        ok = c.acquire("\u00e9" * 64, blocking=False)  # 64 characters, 128 bytes
        ok.release()
        with pytest.raises(dlock.EINVAL):  # 49 characters, 196 bytes: MariaDB's 192
            c.acquire("\U0001f600" * 49, blocking=False)
        with pytest.raises(dlock.ENOTSUP):
            c.acquire(name, blocking=False, shared=True)
        with pytest.raises(dlock.ENOTSUP):
            c.acquire(name, blocking=False, limit=3)
    finally:
        c.close()


@pytest.mark.parametrize("kind", PEERS)
def test_list_plain_and_native(peers, name, kind):
    """A migration's middle phase: a list of the same server in the plain
    layout and in dlock's own excludes the peer and a native-only holder,
    and is excluded by each."""
    native = with_params(uri(), layout="dlock")
    both = "{} {}".format(plain_uri(), native)
    p = peer_of(peers, kind, name)
    with dlock_client(both) as c:
        with c.acquire(name, blocking=False):
            assert not peer_try(p), "the peer took {} while the list held it".format(name)
            assert dlock_try(native, name) == EXIT_BUSY
        assert peer_try(p)
        with pytest.raises(dlock.EBUSY):
            c.acquire(name, blocking=False)
        peer_release(p)
        with dlock_client(native) as n:
            with n.acquire(name, blocking=False):
                with pytest.raises(dlock.EBUSY):
                    c.acquire(name, blocking=False)
