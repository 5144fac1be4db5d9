"""ZooKeeper: dlock's layout=kazoo against kazoo's Lock, ReadLock and
WriteLock (Debian's python3-kazoo, 2.8), on the store of $DLOCK_ZK_URI.

kazoo is given the path dlock uses for a name: <root>/<name> (the URI's
path is the root; a name made of [A-Za-z0-9_.-] is its own node's name,
docs/zookeeper.md "Peer layout: kazoo"), on the same hosts.
"""

import os
import statistics
import subprocess

import pytest

import dlock
from conftest import (EXIT_BUSY, dlock_client, dlock_try, env_uri, handoff_dlock_to_peer,
                      handoff_peer_to_dlock, log, peer_module, python_peer, with_params)

# How many handoffs each way the handoff cases time (the p50 is printed).
HANDOFFS = int(os.environ.get("DLOCK_INTEROP_HANDOFFS", "10"))

# A kazoo client on the line protocol (conftest.py). PEER_ARGS: hosts, path,
# kind (lock, read, write), how (try, block), identifier.
KAZOO_PEER = r"""
from kazoo.client import KazooClient
hosts, path, kind, how, ident = PEER_ARGS
zk = KazooClient(hosts=hosts)
zk.start(timeout=10)
make = {"lock": zk.Lock, "read": zk.ReadLock, "write": zk.WriteLock}[kind]
lk = make(path, ident)
if how == "block":
    say("waiting")
got = lk.acquire(blocking=(how == "block"))
if not got:
    say("busy")
else:
    say("held", now())
    cmd = wait_cmd()
    lk.release()
    say("released", now())
    wait_cmd()
zk.stop()
zk.close()
"""


@pytest.fixture(scope="module")
def zk():
    """(URI, kazoo hosts, root) of $DLOCK_ZK_URI, kazoo importable."""
    uri = env_uri("DLOCK_ZK_URI")
    peer_module("kazoo.client")
    rest = uri.split("://", 1)[1].split("?", 1)[0]
    hosts, _, root = rest.partition("/")
    hosts = hosts.rsplit("@", 1)[-1]
    return uri, hosts, "/" + (root.rstrip("/") or "dlock")


def kazoo(peers, zk, name, kind="lock", how="try", ident="kazoo-peer"):
    """A kazoo peer on name's path; returns it once it has said where it is
    ("held", "busy" or, blocking, "waiting")."""
    _, hosts, root = zk
    p = peers(python_peer(KAZOO_PEER) + [hosts, root + "/" + name, kind, how, ident])
    return p


def kazoo_holds(peers, zk, name, kind="lock"):
    p = kazoo(peers, zk, name, kind)
    p.expect("held", 20)
    return p


def kazoo_try(peers, zk, name, kind="lock"):
    """'held' or 'busy': what a kazoo non-blocking acquire of name got (it
    releases at once)."""
    p = kazoo(peers, zk, name, kind)
    word = p.line(20).split(" ", 1)[0]
    p.close()
    return word


def kz(zk):
    return with_params(zk[0], layout="kazoo")


# ---- exclusion both ways -------------------------------------------------

@pytest.mark.parametrize("kind", ["lock", "write"])
def test_kazoo_holds_dlock_tries(zk, peers, name, kind):
    p = kazoo_holds(peers, zk, name, kind)
    assert dlock_try(kz(zk), name) == EXIT_BUSY, "dlock run -n held beside kazoo's " + kind
    c = dlock_client(kz(zk))
    with pytest.raises(dlock.EBUSY):
        c.acquire(name, blocking=False)
    with pytest.raises(dlock.EBUSY):
        c.acquire(name, blocking=False, shared=True)
    info = c.inspect(name)
    assert info["held"] is True
    # the kazoo holder's node is "<uuid hex>__lock__<seq>": its uuid; a
    # foreign holder has no token
    assert len(info.get("owner", "")) == 32, info
    assert "token" not in info, info
    assert [h.get("token") for h in c.inspect_holders(name)] == [None], c.inspect_holders(name)
    c.close()
    p.send("release")
    p.expect("released")
    assert dlock_try(kz(zk), name) == 0, "free once kazoo released"


@pytest.mark.parametrize("kind", ["lock", "write", "read"])
def test_dlock_holds_kazoo_tries(zk, peers, name, kind):
    c = dlock_client(kz(zk))
    lk = c.acquire(name, blocking=False)
    assert kazoo_try(peers, zk, name, kind) == "busy", "kazoo's {} held beside dlock".format(kind)
    lk.release()
    assert kazoo_try(peers, zk, name, kind) == "held", "kazoo's {} after dlock's release".format(
        kind)
    c.close()


def test_kazoo_sees_dlock_contender(zk, name):
    """kazoo's contenders() lists dlock's node, by the owner id it writes as
    the node's data."""
    c = dlock_client(kz(zk))
    lk = c.acquire(name, blocking=False)
    owner = lk.owner
    script = ("from kazoo.client import KazooClient\n"
              "import sys\n"
              "zk = KazooClient(hosts=sys.argv[1]); zk.start(timeout=10)\n"
              "print(zk.Lock(sys.argv[2]).contenders())\n"
              "print(zk.get_children(sys.argv[2]))\n"
              "zk.stop()\n")
    r = subprocess.run(["/usr/bin/python3", "-c", script, zk[1], zk[2] + "/" + name],
                       capture_output=True, text=True, timeout=30)
    lk.release()
    c.close()
    assert r.returncode == 0, r.stderr
    log("kazoo sees:", r.stdout.strip())
    assert repr([owner]) in r.stdout, r.stdout
    assert "{}__lock__".format(owner) in r.stdout


# ---- the negative control ------------------------------------------------

def test_layout_dlock_both_hold(zk, peers, name):
    """layout=dlock does not see kazoo's nodes, nor kazoo dlock's: both hold."""
    p = kazoo_holds(peers, zk, name)
    assert dlock_try(zk[0], name) == 0, "layout=dlock did not hold beside kazoo (control)"
    p.send("release")
    p.expect("released")
    c = dlock_client(zk[0])
    lk = c.acquire(name, blocking=False)
    assert kazoo_try(peers, zk, name) == "held", "kazoo did not hold beside layout=dlock"
    lk.release()
    c.close()


def test_mixed_layouts(zk, name):
    """layout=kazoo counts the dlock layout's nodes; layout=dlock does not
    count kazoo's: a layout=dlock holder excludes a layout=kazoo try, not
    the reverse (docs: take both layouts together while migrating)."""
    d = dlock_client(zk[0])
    k = dlock_client(kz(zk))
    lk = d.acquire(name, blocking=False)
    with pytest.raises(dlock.EBUSY):
        k.acquire(name, blocking=False)
    lk.release()
    lk = k.acquire(name, blocking=False)
    both = d.acquire(name, blocking=False)  # the one-way limit, stated in the docs
    both.release()
    lk.release()
    d.close()
    k.close()


# ---- read-write locks ------------------------------------------------------

def test_readers_together_writers_out(zk, peers, name):
    """kazoo's ReadLock and dlock's shared lock hold together; kazoo's
    WriteLock and dlock's exclusive lock are excluded while they do."""
    r = kazoo_holds(peers, zk, name, "read")
    c = dlock_client(kz(zk))
    s = c.acquire(name, blocking=False, shared=True)
    assert kazoo_try(peers, zk, name, "read") == "held", "a second kazoo reader"
    assert kazoo_try(peers, zk, name, "write") == "busy", "kazoo's WriteLock beside two readers"
    other = dlock_client(kz(zk))
    with pytest.raises(dlock.EBUSY):
        other.acquire(name, blocking=False)
    other.close()
    assert dlock_try(kz(zk), name) == EXIT_BUSY
    assert dlock_try(kz(zk), name, "--shared") == 0
    r.send("release")
    r.expect("released")
    assert kazoo_try(peers, zk, name, "write") == "busy", "kazoo's WriteLock beside dlock's reader"
    s.release()
    assert kazoo_try(peers, zk, name, "write") == "held"
    c.close()


def test_kazoo_writer_excludes_dlock_reader(zk, peers, name):
    w = kazoo_holds(peers, zk, name, "write")
    assert dlock_try(kz(zk), name, "--shared") == EXIT_BUSY
    w.send("release")
    w.expect("released")
    c = dlock_client(kz(zk))
    lk = c.acquire(name, blocking=False)
    assert kazoo_try(peers, zk, name, "read") == "busy", "kazoo's ReadLock beside dlock's writer"
    lk.release()
    c.close()


# ---- handoffs --------------------------------------------------------------

def handoffs_seen(what, times):
    """Logs the handoff times (a benchmark: only a 2 s bound is asserted)."""
    log("{}, ms: p50 {:.1f}, max {:.1f}, n {}: {}".format(
        what, statistics.median(times), max(times), len(times),
        " ".join("%.1f" % t for t in times)))
    assert max(times) < 2000, "a handoff took {:.0f} ms".format(max(times))


def test_handoff_kazoo_to_dlock(zk, peers, name):
    c, watcher = dlock_client(kz(zk)), dlock_client(kz(zk))
    times = []
    for i in range(HANDOFFS):
        p = kazoo_holds(peers, zk, name)
        ms, lk = handoff_peer_to_dlock(p, c, name, watcher=watcher)
        times.append(ms)
        lk.release()
        p.close()
    c.close()
    watcher.close()
    handoffs_seen("kazoo release -> dlock grant", times)


def test_handoff_dlock_to_kazoo(zk, peers, name):
    c = dlock_client(kz(zk))
    times = []
    for i in range(HANDOFFS):
        lk = c.acquire(name, blocking=False)
        p = kazoo(peers, zk, name, how="block")
        p.expect("waiting", 20)
        ms = handoff_dlock_to_peer(lk, p)
        times.append(ms)
        with pytest.raises(dlock.EBUSY):
            c.acquire(name, blocking=False)
        p.send("release")
        p.expect("released")
        p.close()
    c.close()
    handoffs_seen("dlock release -> kazoo grant", times)


# ---- tokens ----------------------------------------------------------------

def test_tokens_increase_with_kazoo_between(zk, peers, name):
    c = dlock_client(kz(zk))
    tokens = []
    for i in range(4):
        lk = c.acquire(name, blocking=False)
        tokens.append(lk.token)
        info = c.inspect(name)
        assert info.get("token") == lk.token and info.get("owner") == lk.owner, info
        lk.release()
        p = kazoo_holds(peers, zk, name, "write" if i % 2 else "lock")
        p.send("release")
        p.expect("released")
        p.close()
    s = c.acquire(name, blocking=False, shared=True)
    tokens.append(s.token)
    s.release()
    c.close()
    log("tokens:", tokens)
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens


# ---- bad input -------------------------------------------------------------

def test_bad_layout(zk):
    with pytest.raises(dlock.EBADURI) as e:
        dlock.open(with_params(zk[0], layout="nonsense"))
    assert "dlock or kazoo" in str(e.value)
    with pytest.raises(dlock.EBADURI):
        dlock.open(with_params(zk[0], layout="Kazoo"))


def test_limit_refused(zk, name):
    c = dlock_client(kz(zk))
    assert not c.caps & dlock.CAP_SEMAPHORE and c.caps & dlock.CAP_SHARED
    with pytest.raises(dlock.ENOTSUP):
        c.acquire(name, blocking=False, limit=3)
    # shared is kazoo's ReadLock: allowed
    c.acquire(name, blocking=False, shared=True).release()
    c.close()
    r = subprocess.run(
        [os.environ["DLOCK_CLI"], "run", "-n", "--limit", "2", kz(zk), name, "--", "true"],
        capture_output=True, text=True, timeout=20)
    assert r.returncode not in (0, EXIT_BUSY), r
    assert "semaphore" in r.stderr, r.stderr
