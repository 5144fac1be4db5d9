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

import pytest

from conftest import (env_uri, log, peer_module, python_peer, rolling_migration, with_params)

REDIS_PY_LOOP = """
import redis
r = redis.Redis.from_url(PEER_ARGS[0])
lk = r.lock(PEER_ARGS[1], timeout=30, blocking_timeout=20, sleep=0.005)
while True:
    cmd = wait_cmd()
    if cmd == "acquire":
        if not lk.acquire():
            say("error", "not acquired within 20 s")
            continue
        say("held", now())
    elif cmd == "release":
        lk.release()
        say("released", now())
    else:
        break
"""


def redis_case(name):
    peer_module("redis")
    uri = env_uri("DLOCK_REDIS_URI")
    plain = uri.split("?", 1)[0]
    return python_peer(REDIS_PY_LOOP) + [plain, name], with_params(uri, layout="plain"), uri


CASES = {"redis-py": redis_case}


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
    argv, peer_uri, native_uri = CASES[peer](name)
    check(rolling_migration(argv, peer_uri, native_uri, name))


@pytest.mark.parametrize("peer", sorted(CASES))
def test_rolling_control_without_peer_layout(name, peer):
    """Phase 2 with dlock on the native layout alone: the peer and dlock
    share nothing, and the counter's overlap check must see it."""
    argv, peer_uri, native_uri = CASES[peer](name)
    state = rolling_migration(argv, peer_uri, native_uri, name, list_uri=native_uri)
    check(state, control=True)
    assert state["overlaps"] > 0, "no overlap seen without the peer layout"
