#!/usr/bin/python3
"""TAP test: bench/peers/run.py runs from the repo (a smoke run).

    test_peers.py DLOCK_EXE

One quick round (--quick) on the test Redis and PostgreSQL, as JSON: exit 0,
and for each store a dlock figure for both measurements, a best peer named
with its figure for both, and the store's round trip. Without the stores it
fails when DLOCK_STORES_REQUIRED=1 (CI) and is skipped otherwise.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "tests"))
from tap import Tap  # noqa: E402

tap = Tap()
check = tap.ok


def main():
    exe = sys.argv[1]
    if not (os.environ.get("DLOCK_REDIS_URI") and os.environ.get("DLOCK_POSTGRES_URI")):
        if os.environ.get("DLOCK_STORES_REQUIRED") == "1":
            check(False, "the test Redis and PostgreSQL (DLOCK_STORES_REQUIRED=1)")
        else:
            check(True, "peers smoke run # SKIP no DLOCK_REDIS_URI or DLOCK_POSTGRES_URI")
        tap.plan_now()
        return tap.status()
    cmd = ["/usr/bin/python3", os.path.join(HERE, "run.py"), "--quick", "--json",
           "--stores", "redis,postgres", "--dlock", exe,
           "--store-cpu", "-1"]  # the suite's stores serve other tests meanwhile
    print("# " + " ".join(cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=240)
    if not check(p.returncode == 0, "run.py --quick exits 0",
                 "status %d\n%s" % (p.returncode, p.stderr), tail=20):
        tap.plan_now()
        return tap.status()
    rows = {r["store"]: r for r in json.loads(p.stdout)["stores"]}
    check(sorted(rows) == ["postgres", "redis"], "one row per store", repr(sorted(rows)))
    for store, rt in (("redis", "bare PUBLISH handoff"), ("postgres", "SELECT 1")):
        r = rows.get(store, {})

        def pos(k):
            return isinstance(r.get(k), (int, float)) and r[k] > 0
        check(pos("dlock_uncontended_us") and pos("dlock_handoff_us"),
              "%s: dlock's uncontended and handoff figures" % store, repr(r))
        check(pos("best_peer_uncontended_us") and pos("best_peer_handoff_us") and
              r.get("best_peer_uncontended") and r.get("best_peer_handoff"),
              "%s: a best peer named, with figures" % store, repr(r.get("cells")))
        check(r.get("round_trip") == rt and pos("round_trip_us"),
              "%s: the round trip (%s)" % (store, rt), repr(r.get("cells")))
    tap.plan_now()
    return tap.status()


if __name__ == "__main__":
    sys.exit(main())
