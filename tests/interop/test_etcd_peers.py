"""dlock on etcd against the peers' real clients (issue 28).

etcdctl lock (etcd's own concurrency.Mutex, Debian's etcd-client 3.4):
layout=dlock, the default. etcdctl's NAME is dlock's key prefix, '/',
the name escaped ('%' and '/' as %25 and %2F): the lock "jobs" of
etcd://h/dlock is `etcdctl lock /dlock/jobs`. Both write NAME/<lease id>
and the lowest create revision under NAME/ holds.

python-etcd3 (Debian's python3-etcd3 0.12, Lock): layout=etcd3, the one
key <prefix>/<name> (prefix "/locks" by default, python-etcd3's), put if
absent. Debian's python-etcd3 cannot wait with its own acquire (its retry
callback has the signature of an older tenacity: a TypeError once it
waits), so the waiting peer below does what locks.py means to do: a try,
then watch_once on the key, and again.

Handoff times print with log(): peer -> dlock from the peer's release
(etcdctl: the signal that makes it unlock) to dlock's grant; dlock -> peer
from dlock's release call to the peer holding.
"""

import os
import subprocess
import time
import urllib.parse

import pytest

import dlock
from conftest import (EXIT_BUSY, dlock_client, dlock_try, env_uri, grant_after,
                      handoff_dlock_to_peer, handoff_peer_to_dlock, log, missing, peer_module,
                      python_peer, with_params)

HANDOFFS = int(os.environ.get("DLOCK_INTEROP_HANDOFFS", "5"))


def etcd_uri():
    return env_uri("DLOCK_ETCD_URI")


def parts(uri):
    """(host:port list, user, password, prefix) of an etcd:// URI."""
    u = urllib.parse.urlsplit(uri)
    auth, _, hosts = u.netloc.rpartition("@")
    user, _, pw = auth.partition(":")
    prefix = u.path.rstrip("/") or "/dlock"
    return hosts, urllib.parse.unquote(user), urllib.parse.unquote(pw), prefix


def with_path(uri, path):
    """uri with its path (the key prefix) replaced; "" for none."""
    u = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, ""))


def escaped(name):
    return name.replace("%", "%25").replace("/", "%2F")


# ---- etcdctl lock -----------------------------------------------------------

ETCDCTL_PEER = r"""
import os, select, signal, subprocess
hosts, user, pw, lockname, mode, bound, ttl = PEER_ARGS
argv = ["etcdctl", "--endpoints=" + hosts, "lock", "--ttl=" + ttl, lockname]
if user:
    argv[2:2] = ["--user=" + user + ":" + pw]
env = dict(os.environ, ETCDCTL_API="3")
p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
# etcdctl lock NAME (no command) prints the key it holds, then holds until
# SIGINT or SIGTERM, on which it unlocks (deletes its key) and exits.
if mode != "hold":
    say("waiting")
ready, _, _ = select.select([p.stdout], [], [], float(bound))
if not ready and mode == "probe":  # not held within bound: say so, wait on
    say("notyet")
    ready, _, _ = select.select([p.stdout], [], [], 30.0)
if not ready:
    say("busy")
    p.send_signal(signal.SIGTERM)
    p.wait()
    wait_cmd()
    sys.exit(0)
line = p.stdout.readline()
if not line:
    say("error", "etcdctl:", p.stderr.read().decode()[-300:].replace("\n", " "))
    sys.exit(1)
say("held", now())
cmd = wait_cmd()
t = now()
if cmd == "kill":  # dies holding: its key goes when its session's lease ends
    p.kill()
    p.wait()
    say("killed", t)
    wait_cmd()
    sys.exit(0)
p.send_signal(signal.SIGTERM)
rc = p.wait()
if rc != 0:
    say("error", "etcdctl exited", rc, p.stderr.read().decode()[-300:].replace("\n", " "))
    sys.exit(1)
if cmd == "release":
    say("released", t)
"""


def have_etcdctl():
    try:
        subprocess.run(["etcdctl", "version"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        missing("etcdctl (Debian's etcd-client) is not installed")


def etcdctl_peer(peers, uri, lockname, mode="hold", bound=10.0, ttl=10):
    """etcdctl lock --ttl=ttl lockname in a peer; mode "hold" (it expects
    to hold within bound s) or "wait" (prints "waiting" first; "busy" if it
    did not hold within bound s) or "probe" (as "wait", but "notyet" after
    bound s, and it waits on). Sent "kill", it is killed holding."""
    have_etcdctl()
    hosts, user, pw, _ = parts(uri)
    return peers(python_peer(ETCDCTL_PEER) + [hosts, user, pw, lockname, mode, str(bound),
                                              str(ttl)])


def etcdctl_name(uri, name):
    """The NAME an etcdctl user passes to meet dlock's lock name on uri."""
    return parts(uri)[3] + "/" + escaped(name)


def test_etcdctl_holds_dlock_busy(peers, name):
    uri = etcd_uri()
    p = etcdctl_peer(peers, uri, etcdctl_name(uri, name))
    p.expect("held")
    assert dlock_try(uri, name) == EXIT_BUSY
    assert dlock_try(with_params(uri, layout="dlock"), name) == EXIT_BUSY
    c = dlock_client(uri)
    with pytest.raises(dlock.EBUSY):
        c.acquire(name, blocking=False)
    info = c.inspect(name)
    assert info["held"] is True
    assert "token" not in info and "owner" not in info  # a foreign holder: no token
    assert 0 < info["lease"] <= 10  # etcdctl's session lease (--ttl, 10 s)
    holders = c.inspect_holders(name)
    assert len(holders) == 1 and "token" not in holders[0]
    c.close()


def test_etcdctl_escaped_name(peers):
    """A dlock name with '/' and '%' meets etcdctl's NAME escaped."""
    uri = etcd_uri()
    name = "ia-{}-a/b%c".format(os.getpid())
    p = etcdctl_peer(peers, uri, etcdctl_name(uri, name))
    p.expect("held")
    hosts, user, pw, prefix = parts(uri)
    argv = ["etcdctl", "--endpoints=" + hosts, "get", "--prefix", "--keys-only", prefix + "/"]
    if user:
        argv.insert(2, "--user=" + user + ":" + pw)
    keys = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                          env=dict(os.environ, ETCDCTL_API="3")).stdout
    assert etcdctl_name(uri, name) + "/" in keys  # .../a%2Fb%25c/<lease id>
    assert dlock_try(uri, name) == EXIT_BUSY
    p.send("release")
    p.expect("released")
    assert dlock_try(uri, name) == 0


def test_dlock_holds_etcdctl_waits(peers, name):
    uri = etcd_uri()
    c = dlock_client(uri)
    lk = c.acquire(name, ttl=30)
    p = etcdctl_peer(peers, uri, etcdctl_name(uri, name), mode="probe", bound=1.5)
    p.expect("waiting")
    assert p.expect("notyet", timeout=10) is None  # not held while dlock holds
    lk.release()
    p.expect("held")  # and this waiter holds once dlock released
    c.close()


def granted_at_expiry(uri, name, dead_at, ttl):
    """A dlock waiter on name (the holder died at dead_at, its lease of
    ttl s left to run out) is granted once the store deletes the key:
    within ttl + 1.5 s (etcd's lessor: every 500 ms)."""
    c = dlock_client(uri)
    lk = c.acquire(name, timeout=ttl + 10)
    after = time.monotonic() - dead_at
    log("granted {:.2f} s after the holder died (lease {} s)".format(after, ttl))
    assert after < ttl + 1.5
    lk.release()
    c.close()


def test_etcdctl_killed_holder(peers, name):
    """etcdctl dies holding (never unlocks): dlock's waiter is granted when
    its session's lease runs out, told by its watch."""
    uri = etcd_uri()
    p = etcdctl_peer(peers, uri, etcdctl_name(uri, name), ttl=2)
    p.expect("held")
    assert dlock_try(uri, name) == EXIT_BUSY
    p.send("kill")
    granted_at_expiry(uri, name, p.expect("killed"), 2)


def test_etcdctl_negative_control(peers, name):
    """dlock on another prefix: the keys differ and both hold (the test
    sees an overlap when there is one)."""
    uri = etcd_uri()
    p = etcdctl_peer(peers, uri, etcdctl_name(uri, name))
    p.expect("held")
    other = with_path(uri, parts(uri)[3] + "-other")
    assert dlock_try(other, name) == 0
    c = dlock_client(other)
    c.acquire(name, blocking=False).release()
    c.close()


def handoffs(uri, name, peer, who):
    """HANDOFFS rounds of: peer(mode, bound) holds, a dlock waiter is
    granted at its release; a peer waiter is granted at dlock's release.
    Asserts the handoffs happened, dlock's tokens strictly increase (peer
    grants between), and logs the times."""
    c, watcher = dlock_client(uri), dlock_client(uri)
    to_dlock, to_peer, tokens = [], [], []
    for _ in range(HANDOFFS):
        p = peer("hold", 10)
        p.expect("held")
        ms, lk = handoff_peer_to_dlock(p, c, name, watcher=watcher)
        to_dlock.append(ms)
        tokens.append(lk.token)
        w = peer("wait", 15)
        w.expect("waiting")
        to_peer.append(handoff_dlock_to_peer(lk, w))
        w.send("release")
        w.expect("released")
    c.close()
    watcher.close()
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    for what, ms in (("{} -> dlock".format(who), to_dlock), ("dlock -> {}".format(who), to_peer)):
        ms = sorted(ms)
        log("{} handoff ms: p50 {:.1f} p90 {:.1f} max {:.1f} ({})".format(
            what, ms[len(ms) // 2], ms[len(ms) * 9 // 10], ms[-1], len(ms)))
        assert ms[-1] < 2000


def test_etcdctl_handoffs(peers, name):
    uri = etcd_uri()
    handoffs(uri, name, lambda mode, bound: etcdctl_peer(peers, uri, etcdctl_name(uri, name),
                                                         mode, bound), "etcdctl")


# ---- python-etcd3, layout=etcd3 ---------------------------------------------

ETCD3_PEER = r"""
import etcd3
from etcd3 import exceptions
hosts, user, pw, name, mode, bound, ttl = PEER_ARGS
host, _, port = hosts.split(",")[0].rpartition(":")
c = etcd3.client(host=host, port=int(port), user=user or None, password=pw or None)
if user:
    # grpc sends call credentials only over TLS: the token goes as the
    # metadata python-etcd3 also sets.
    c.call_credentials = None
    c.watcher._credentials = None
lock = c.lock(name, ttl=int(ttl))
if mode != "hold":
    say("waiting")
end = time.monotonic() + float(bound)
held = lock.acquire(timeout=0)
while not held and mode != "hold":
    if time.monotonic() >= end:
        if mode != "probe":
            break
        say("notyet")  # not held within bound: say so, wait on
        mode, end = "wait", time.monotonic() + 30.0
    # locks.py's wait (its acquire cannot wait on Debian's tenacity): a
    # watch on the key, then a try again.
    try:
        c.watch_once(lock.key, timeout=min(1.0, max(end - time.monotonic(), 0.01)))
    except exceptions.WatchTimedOut:
        pass
    held = lock.acquire(timeout=0)
if not held:
    say("busy")
    wait_cmd()
    sys.exit(0)
say("held", now())
cmd = wait_cmd()
ok = lock.release()
t = now()
if not ok:
    say("error", "release found the key not ours")
    sys.exit(1)
if cmd == "release":
    say("released", t)
"""


def etcd3_peer(peers, uri, name, mode="hold", bound=0.0, ttl=30):
    """python-etcd3's client.lock(name, ttl=ttl) in a peer: mode "hold"
    (one try: "held" or "busy") or "wait" ("waiting", then "held", or
    "busy" after bound s) or "probe" (as "wait", but "notyet" after bound
    s, and it waits on)."""
    peer_module("etcd3")
    hosts, user, pw, _ = parts(uri)
    return peers(python_peer(ETCD3_PEER) + [hosts, user, pw, name, mode, str(bound), str(ttl)])


def etcd3_uri():
    """The test store with layout=etcd3 and its default prefix ("/locks",
    python-etcd3's)."""
    return with_params(with_path(etcd_uri(), ""), layout="etcd3")


def test_etcd3_holds_dlock_busy(peers, name):
    uri = etcd3_uri()
    p = etcd3_peer(peers, uri, name)
    p.expect("held")
    assert dlock_try(uri, name) == EXIT_BUSY
    explicit = with_params(with_path(etcd_uri(), "/locks"), layout="etcd3")
    assert dlock_try(explicit, name) == EXIT_BUSY
    c = dlock_client(uri)
    with pytest.raises(dlock.EBUSY):
        c.acquire(name, blocking=False)
    info = c.inspect(name)
    assert info["held"] is True
    assert "token" not in info  # a foreign holder has none
    assert info["owner"].startswith("value ")  # python-etcd3's uuid, in hex
    assert 0 < info["lease"] <= 30
    c.close()


def test_dlock_holds_etcd3_busy(peers, name):
    uri = etcd3_uri()
    c = dlock_client(uri)
    lk = c.acquire(name, ttl=30)
    info = c.inspect(name)
    assert info["held"] is True and info["token"] == lk.token and info["owner"] == lk.owner
    p = etcd3_peer(peers, uri, name)
    assert p.expect("busy") is None
    w = etcd3_peer(peers, uri, name, mode="probe", bound=1.5)
    w.expect("waiting")
    assert w.expect("notyet", timeout=10) is None  # not held while dlock holds
    lk.release()
    w.expect("held")  # and this waiter holds once dlock released
    c.close()


def test_etcd3_lease_runs_out(peers, name):
    """python-etcd3 never refreshes its lease by itself: its key goes when
    the lease ends, with no release; dlock's waiter is granted then."""
    uri = etcd3_uri()
    p = etcd3_peer(peers, uri, name, ttl=2)
    held = p.expect("held")
    assert dlock_try(uri, name) == EXIT_BUSY
    granted_at_expiry(uri, name, held, 2)


def test_etcd3_negative_control(peers, name):
    """layout=dlock on python-etcd3's prefix: dlock's keys are
    /locks/<name>/<lease>, python-etcd3's /locks/<name>: both hold."""
    uri = with_path(etcd_uri(), "/locks")
    p = etcd3_peer(peers, uri, name)
    p.expect("held")
    assert dlock_try(uri, name) == 0
    c = dlock_client(uri)
    lk = c.acquire(name, blocking=False)
    p2 = etcd3_peer(peers, uri, name)
    p2.expect("busy")  # python-etcd3 sees its own peer, not dlock
    lk.release()
    c.close()


def test_etcd3_handoffs_and_tokens(peers, name):
    uri = etcd3_uri()
    handoffs(uri, name, lambda mode, bound: etcd3_peer(peers, uri, name, mode, bound),
             "python-etcd3")


def test_etcd3_dlock_waiters(name):
    """dlock's own waiters in layout=etcd3: woken by the holder's release
    (the watch), each grant with a higher token; a deadline still ends a
    wait."""
    uri = etcd3_uri()
    a, b = dlock_client(uri), dlock_client(uri)
    lk = a.acquire(name, ttl=10)
    with pytest.raises(dlock.ETIMEDOUT):
        b.acquire(name, timeout=0.3)
    import threading
    got = {}

    def wait():
        got["lock"] = b.acquire(name, timeout=10)
        got["t"] = time.monotonic()

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    lk.release()
    th.join(15)
    assert "lock" in got
    log("dlock -> dlock handoff in layout=etcd3: {:.1f} ms".format(grant_after(t0, got["t"])))
    assert got["lock"].token > lk.token
    got["lock"].release()
    a.close()
    b.close()


def test_bad_input(name):
    uri = etcd_uri()
    with pytest.raises(dlock.EBADURI) as e:
        dlock.open(with_params(uri, layout="nonsense"))
    assert "dlock" in str(e.value) and "etcd3" in str(e.value)
    with pytest.raises(dlock.EBADURI):
        dlock.open(with_params(uri, layout="ETCD3"))
    c = dlock_client(etcd3_uri())
    with pytest.raises(dlock.ENOTSUP):
        c.acquire(name, shared=True, blocking=False)
    with pytest.raises(dlock.ENOTSUP):
        c.acquire(name, limit=3, blocking=False)
    c.close()
    r = subprocess.run([os.environ["DLOCK_CLI"], "run", "-n", with_params(uri, layout="x"),
                        name, "--", "true"], capture_output=True, text=True, timeout=20)
    assert r.returncode not in (0, EXIT_BUSY) and "layout" in r.stderr
