"""A rolling migration from a peer library to dlock, through the runbook's
phases (docs/migration.md, "From another lock library"): conftest's
rolling_migration() with each peer's real client as the phase-1 workers.

Asserted: no overlap, no lost section (the counter equals the sections),
every phase completed, both kinds of worker ran in phases 2 and 4, and
dlock's tokens strictly increase in grant order from phase 3 on (where no
peer holder is left). The negative control runs phase 2's dlock workers on
the native layout alone (no peer layout in their list) and must see an
overlap: the check can fail.
"""

import contextlib

import pytest

from conftest import (env_uri, log, peer_module, python_peer, rolling_migration, with_params)

REDIS_PY_LOOP = """
import redis
r = redis.Redis.from_url(PEER_ARGS[0])
# Retrying every 10 ms (redis-py's default is 0.1 s), to keep the phases
# short; with keyspace notifications on (redis_case) dlock's waiters are
# woken by the DEL and do not depend on when they look.
lk = r.lock(PEER_ARGS[1], timeout=30, blocking_timeout=20, sleep=0.01)
serve(lk.acquire, lk.release)
"""


@contextlib.contextmanager
def keyspace_notifications(plain_url):
    """notify-keyspace-events Kgx on the server for the block, as the
    runbook asks for the migration (docs/migration.md): dlock's waiters in
    layout=plain are then woken by the peer's DEL, where its 25 ms look
    could keep missing a peer that takes the key again at once."""
    import redis
    r = redis.Redis.from_url(plain_url)
    was = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    r.config_set("notify-keyspace-events", "Kgx")
    try:
        yield
    finally:
        r.config_set("notify-keyspace-events", was)
        r.close()


def redis_case(name):
    peer_module("redis")
    # The password-protected server: no other suite changes its
    # notify-keyspace-events while this runs (interop-redis turns them on
    # and off on the other one).
    uri = env_uri("DLOCK_REDIS_AUTH_URI")
    plain = uri.split("?", 1)[0]
    return (python_peer(REDIS_PY_LOOP) + [plain, name], with_params(uri, layout="plain"), uri,
            name, keyspace_notifications(plain))


KAZOO_LOOP = """
from kazoo.client import KazooClient
zk = KazooClient(hosts=PEER_ARGS[0])
zk.start(timeout=10)
lk = zk.Lock(PEER_ARGS[1], "rolling-peer")
serve(lambda: lk.acquire(timeout=20), lk.release)
zk.stop()
"""


def kazoo_case(name):
    peer_module("kazoo")
    uri = env_uri("DLOCK_ZK_URI")
    hosts, _, root = uri.split("://", 1)[1].split("?", 1)[0].partition("/")
    path = "/" + (root.rstrip("/") or "dlock") + "/" + name
    return python_peer(KAZOO_LOOP) + [hosts.rsplit("@", 1)[-1], path], \
        with_params(uri, layout="kazoo"), uri


PG_INT_LOOP = """
import psycopg2
conn = psycopg2.connect(PEER_ARGS[0])
conn.autocommit = True
cur = conn.cursor()
n = int(PEER_ARGS[1])
def take():
    cur.execute("SELECT pg_advisory_lock(%s)", (n,))
    return True
def give():
    cur.execute("SELECT pg_advisory_unlock(%s)", (n,))
serve(take, give)
"""


def pg_int_case(name):
    peer_module("psycopg2")
    uri = env_uri("DLOCK_POSTGRES_URI")
    # layout=int takes names that are integers: one of this run's own.
    number = str(int.from_bytes(name.encode()[-6:], "big") % (1 << 40) + (1 << 41))
    return python_peer(PG_INT_LOOP) + [uri.split("?", 1)[0], number], \
        with_params(uri, layout="int"), uri, number


GET_LOCK_LOOP = """
import urllib.parse
import pymysql
u = urllib.parse.urlsplit(PEER_ARGS[0])
conn = pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username,
                       password=urllib.parse.unquote(u.password or ""), database=u.path[1:],
                       autocommit=True)
cur = conn.cursor()
def take():
    cur.execute("SELECT GET_LOCK(%s, 20)", (PEER_ARGS[1],))
    return cur.fetchone()[0] == 1
def give():
    cur.execute("SELECT RELEASE_LOCK(%s)", (PEER_ARGS[1],))
serve(take, give)
"""


def get_lock_case(name):
    peer_module("pymysql")
    uri = env_uri("DLOCK_MYSQL_URI")
    return python_peer(GET_LOCK_LOOP) + [uri.split("?", 1)[0], name], \
        with_params(uri, layout="plain"), uri


CASES = {"redis-py": redis_case, "kazoo": kazoo_case, "psycopg2-int": pg_int_case,
         "GET_LOCK": get_lock_case}


def case(peer, name):
    """(peer argv, peer-layout URI, native URI, lock name, the context to
    run in) of one case."""
    got = CASES[peer](name)
    if len(got) == 3:
        got += (name,)
    return got if len(got) == 5 else got + (contextlib.nullcontext(),)


def check(state, control=False):
    sections = state["sections"]
    by_phase = {}
    for phase, _, kind, _ in sections:
        by_phase.setdefault(phase, {}).setdefault(kind, 0)
        by_phase[phase][kind] += 1
    log("sections by phase and kind:", by_phase, "overlaps:", state["overlaps"],
        "errors:", state["errors"])
    if control:
        return
    assert not state["errors"], state["errors"]
    assert state["phases_done"] == [1, 2, 3, 4, 5], state["phases_done"]
    assert state["overlaps"] == 0, "{} overlaps".format(state["overlaps"])
    assert state["counter"] == len(sections), "sections lost: counter {} of {}".format(
        state["counter"], len(sections))
    assert by_phase[2].get("peer") and by_phase[2].get("list"), by_phase[2]
    assert by_phase[4].get("list") and by_phase[4].get("native"), by_phase[4]
    tokens = [t for phase, _, kind, t in sections if phase >= 3 and kind != "peer"]
    assert all(a < b for a, b in zip(tokens, tokens[1:])), \
        "tokens from phase 3 on not increasing: {}".format(tokens)


@pytest.mark.parametrize("peer", sorted(CASES))
def test_rolling_migration(name, peer):
    argv, peer_uri, native_uri, name, setting = case(peer, name)
    with setting:
        check(rolling_migration(argv, peer_uri, native_uri, name, phase_s=0.5))


@pytest.mark.parametrize("peer", sorted(CASES))
def test_rolling_control_without_peer_layout(name, peer):
    """Phase 2 with dlock on the native layout alone: the peer and dlock
    share nothing, and the counter's overlap check must see it."""
    argv, peer_uri, native_uri, name, setting = case(peer, name)
    with setting:
        state = rolling_migration(argv, peer_uri, native_uri, name, list_uri=native_uri)
    check(state, control=True)
    assert state["overlaps"] > 0, "no overlap seen without the peer layout"
