#!/usr/bin/python3
"""dlock beside the lock libraries users would pick instead, on the same
stores, interleaved in rounds, as one Markdown table.

    bench/peers/run.py [--rounds 3] [--samples 300] [--handoffs 200]
        [--stores redis,redlock,postgres,mysql,zookeeper,etcd] [--dlock PATH]
        [--client-cpu 0] [--store-cpu 1|-1] [--stores-dir DIR] [--json] [--quick]

The stores are the test command's: URIs from DLOCK_REDIS_URI,
DLOCK_REDLOCK_URI, DLOCK_POSTGRES_URI, DLOCK_MYSQL_URI, DLOCK_ZK_URI,
DLOCK_ETCD_URI (scripts/stores/start.sh prints them). Per store and round:
`dlock bench --json` (its ping, uncontended and ping-pong handoff p50), then
each peer (worker.py, worker.js: two client processes each, driven on pipes)
measured the way dlock bench measures: uncontended = one client, try mode,
acquire+release; handoff = ping-pong, the waiter says it is about to
acquire, the holder sleeps 1 ms, stamps t0 and releases, the waiter stamps
t1 when its acquire returns (CLOCK_MONOTONIC in every process). Each cell is
the median over the rounds of the round's p50. A peer that is missing or
fails gets "n/a (reason)", never a crash; each measurement has a time cap.

Placement: this process, dlock bench and every worker run on --client-cpu;
every store process (pidfiles under --stores-dir) is moved to --store-cpu,
as bench/compare.py does; the placement is printed. Exit status: 0, or 1
when a dlock cell failed.
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
import urllib.parse
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from compare import pin_stores, shown  # noqa: E402

PY = "/usr/bin/python3"  # Debian's, with Debian's peer packages
NODE_PATH = os.environ.get('DLOCK_NODE_PATH') or os.path.join(ROOT, 'tests', 'interop', 'node', 'node_modules')
CAP_S = 60  # one measurement of one peer
HANDOFF_CAP_S = 20  # a polling peer's handoffs stop here (at least 5 taken)

# store -> (env variable, peers [(label, runtime, kind)], round trips
# [(label, kind)], the round trip the handoff is compared with: a label, or
# several, of which the fastest). kind "floor:..." is dlock-floor's (C).
STORES = {
    "redis": ("DLOCK_REDIS_URI",
              [("redis-py Lock", "py", "redis-py"), ("tooz", "py", "tooz"),
               ("node-redlock", "js", "redlock"), ("redis-semaphore", "js", "redis-semaphore")],
              [("bare PUBLISH handoff", "floor:redis-handoff"),
               ("bare SET NX + delete", "floor:redis-solo"), ("PING", "redis-ping")],
              "bare PUBLISH handoff"),
    "redlock": ("DLOCK_REDLOCK_URI", [("node-redlock", "js", "redlock")], [], None),
    "postgres": ("DLOCK_POSTGRES_URI", [("tooz", "py", "tooz")], [("SELECT 1", "select1")],
                 "SELECT 1"),
    "mysql": ("DLOCK_MYSQL_URI", [("tooz", "py", "tooz")], [("SELECT 1", "select1")],
              "SELECT 1"),
    "zookeeper": ("DLOCK_ZK_URI", [("tooz", "py", "tooz"), ("kazoo Lock", "py", "kazoo")],
                  [("create+delete", "zk-create")], "create+delete"),
    "etcd": ("DLOCK_ETCD_URI", [("python-etcd3 lock", "py", "etcd3"), ("tooz", "py", "tooz")],
             [("put (JSON gateway, C)", "floor:etcd-put"), ("put (gRPC, python-etcd3)", "etcd-put"),
              ("range (gRPC, python-etcd3)", "etcd-range")],
             ("put (JSON gateway, C)", "put (gRPC, python-etcd3)")),
}


class Failed(Exception):
    pass


class Worker:
    def __init__(self, runtime, kind, uri):
        if runtime == "js":
            cmd = ["node", os.path.join(HERE, "worker.js"), kind, uri]
        else:
            cmd = [PY, os.path.join(HERE, "worker.py"), kind, uri]
        env = dict(os.environ, NODE_PATH=NODE_PATH)
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
        self.read(30)

    def send(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def read(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            raise Failed("no answer within %d s" % timeout)
        line = self.p.stdout.readline()
        if not line:
            err = self.p.stderr.read().strip().splitlines()
            raise Failed("exited: " + (err[-1] if err else "status %s" % self.p.wait()))
        msg = json.loads(line)
        if not msg.get("ok"):
            raise Failed(msg.get("error", "error"))
        return msg

    def close(self):
        try:
            self.send(op="quit")
            self.p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            self.p.kill()
            self.p.wait()


def p50(ns):
    return statistics.median_low(sorted(ns)) / 1000.0 if ns else None


def solo(runtime, kind, uri, n):
    w = Worker(runtime, kind, uri)
    try:
        w.send(op="solo", name=uuid.uuid4().hex[:12], n=n)
        return p50(w.read(CAP_S)["ns"])
    finally:
        w.close()


def floor(kind, uri, n, dlock):
    """dlock-floor (bench/peers/floor.c, built beside dlock) -> p50 in µs."""
    exe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(dlock))), "bench",
                       "dlock-floor")
    if not os.access(exe, os.X_OK):
        raise Failed("no %s (built with the Redis backend)" % exe)
    u = urllib.parse.urlsplit(uri)
    hp = u.netloc.rsplit("@", 1)[-1].split(",")[0]
    host, _, port = hp.rpartition(":")
    if kind.startswith("redis-"):
        args = [kind, host, port, str(n)]
    else:
        args = [kind, "http://" + hp, urllib.parse.unquote(u.username or ""),
                urllib.parse.unquote(u.password or ""), str(n)]
    out = subprocess.run([exe] + args, capture_output=True, text=True, timeout=CAP_S)
    if out.returncode != 0:
        raise Failed(out.stderr.strip()[-200:] or "exit %d" % out.returncode)
    return float(out.stdout.split()[1])


def handoff(runtime, kind, uri, n):
    a, b = Worker(runtime, kind, uri), None
    try:
        b = Worker(runtime, kind, uri)
        name = uuid.uuid4().hex[:12]
        a.send(op="hold", name=name)
        a.read(30)
        holder, waiter = a, b
        ns = []
        end = time.monotonic() + HANDOFF_CAP_S
        for _ in range(n):
            if len(ns) >= 5 and time.monotonic() > end:
                break
            waiter.send(op="wait", name=name)
            waiter.read(30)
            time.sleep(0.001)  # the waiter is in its acquire
            holder.send(op="release")
            t0 = holder.read(30)["t0"]
            t1 = waiter.read(30)["t1"]
            ns.append(t1 - t0)
            holder, waiter = waiter, holder
        holder.send(op="release")
        holder.read(30)
        return p50(ns)
    finally:
        a.close()
        if b:
            b.close()


def dlock_bench(dlock, uri, a):
    cmd = [dlock, "bench", "--json", "--iterations", str(a.samples), "--handoffs",
           str(a.handoffs), "--waiters", "2", "--contenders", "2", "--seconds", "0.1", uri]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise Failed("exit %d: %s" % (out.returncode, out.stderr.strip()[-200:]))
    r = json.loads(out.stdout)["results"][0]
    return {"ping": (r.get("ping_us") or {}).get("p50"),
            "solo": r["uncontended_us"]["p50"], "handoff": r["handoff_pingpong_us"]["p50"],
            "placement": r.get("placement")}


def measure(label, fn, cells, key):
    """Runs fn, appending its figure to cells[key] or the reason it failed."""
    try:
        v = fn()
        cells.setdefault(key, []).append(v)
    except Exception as e:  # noqa: BLE001 - a peer's failure is a cell
        lines = [ln.strip() for ln in str(e).splitlines() if len(ln.strip()) > 3]
        why = lines[0] if lines else type(e).__name__
        cells.setdefault(key + "!", why[:120])
        print("# %s: %s" % (label, why[:300]), file=sys.stderr)


def fig(vals):
    vals = [v for v in (vals or []) if v is not None]
    return statistics.median(vals) if vals else None


def run_store(store, uri, a):
    env, peers, rts, rt_for = STORES[store]
    cells, placement = {}, None
    for rnd in range(a.rounds):
        print("# %s: round %d" % (store, rnd + 1), file=sys.stderr)
        try:
            d = dlock_bench(a.dlock, uri, a)
            placement = d["placement"] or placement
            cells.setdefault("dlock solo", []).append(d["solo"])
            cells.setdefault("dlock handoff", []).append(d["handoff"])
            cells.setdefault("dlock ping", []).append(d["ping"])
        except Exception as e:  # noqa: BLE001
            cells.setdefault("dlock!", str(e)[:200])
        for label, runtime, kind in peers:
            measure(label, lambda: solo(runtime, kind, uri, a.samples), cells, label + " solo")
            measure(label, lambda: handoff(runtime, kind, uri, a.handoffs), cells,
                    label + " handoff")
        for label, kind in rts:
            if kind.startswith("floor:"):
                n = a.handoffs if kind.endswith("handoff") else a.samples
                measure(label, lambda: floor(kind[6:], uri, n, a.dlock), cells, label + " rt")
            else:
                measure(label, lambda: solo("py", kind, uri, a.samples), cells, label + " rt")
    return cells, placement


def best(cells, peers, what):
    got = [(fig(cells.get(label + " " + what)), label) for label, _, _ in peers
]
    got = [g for g in got if g[0] is not None]
    return min(got) if got else (None, None)


def num(v):
    return "n/a" if v is None else ("%.0f" % v if v >= 100 else "%.1f" % v)


def ratio(x, y):
    return "n/a" if x is None or y is None or y == 0 else "%.2f ×" % (x / y)


def row(store, uri, cells, placement):
    env, peers, rts, rt_for = STORES[store]
    ds, dh = fig(cells.get("dlock solo")), fig(cells.get("dlock handoff"))
    bs, bs_l = best(cells, peers, "solo")
    bh, bh_l = best(cells, peers, "handoff")
    # Several ways to the same round trip: the fastest is the floor.
    rt = None
    for label in ((rt_for,) if isinstance(rt_for, str) else rt_for or ()):
        v = fig(cells.get(label + " rt"))
        if v is not None and (rt is None or v < rt):
            rt, rt_for = v, label
    out = {"store": store, "uri": shown(uri), "placement": placement,
           "dlock_uncontended_us": ds, "dlock_handoff_us": dh,
           "best_peer_uncontended": bs_l, "best_peer_uncontended_us": bs,
           "best_peer_handoff": bh_l, "best_peer_handoff_us": bh,
           "round_trip": rt_for, "round_trip_us": rt,
           "cells": {k: (fig(v) if isinstance(v, list) else v) for k, v in cells.items()}}
    return out


def table(rows):
    lines = ["| store | uncontended p50: dlock / best peer (µs) | ratio | handoff p50: dlock / "
             "best peer (µs) | ratio | handoff / store round trip |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        rt = ("%s × %s (%s µs)" % (ratio(r["dlock_handoff_us"], r["round_trip_us"]).replace(" ×", ""),
                                   r["round_trip"], num(r["round_trip_us"]))
              if r["round_trip"] else "–")
        lines.append("| %s | %s / %s (%s) | %s | %s / %s (%s) | %s | %s |" % (
            r["store"], num(r["dlock_uncontended_us"]), num(r["best_peer_uncontended_us"]),
            r["best_peer_uncontended"] or "none",
            ratio(r["dlock_uncontended_us"], r["best_peer_uncontended_us"]),
            num(r["dlock_handoff_us"]), num(r["best_peer_handoff_us"]),
            r["best_peer_handoff"] or "none",
            ratio(r["dlock_handoff_us"], r["best_peer_handoff_us"]), rt))
    lines += ["", "Every cell (median of the rounds' p50, µs; n/a with the reason):", ""]
    for r in rows:
        parts = []
        for k, v in sorted(r["cells"].items()):
            if k.endswith("!"):
                parts.append("%s: n/a (%s)" % (k[:-1], v))
            else:
                parts.append("%s %s" % (k, num(v)))
        lines.append("- %s: %s" % (r["store"], "; ".join(parts)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--handoffs", type=int, default=200)
    ap.add_argument("--stores", default=",".join(STORES))
    ap.add_argument("--dlock", default=os.path.join(ROOT, "build", "tools", "dlock"))
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--store-cpu", type=int, default=1,
                    help="CPU for every store process; -1: leave them where they are")
    ap.add_argument("--stores-dir", default=os.environ.get("DLOCK_STORES_DIR", "/tmp/dlock-stores"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="one round, 30 samples, 20 handoffs (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.samples, a.handoffs = 1, 30, 20
    stores = [s for s in a.stores.split(",") if s]
    bad = [s for s in stores if s not in STORES]
    if bad or a.rounds < 1 or a.samples < 1 or a.handoffs < 1:
        ap.error("unknown store %s (known: %s)" % (",".join(bad), ",".join(STORES))
                 if bad else "--rounds, --samples and --handoffs want at least 1")
    if not os.access(a.dlock, os.X_OK):
        ap.error("no dlock at %s (--dlock PATH)" % a.dlock)
    ncpu = os.cpu_count() or 1
    if not 0 <= a.client_cpu < ncpu or not -1 <= a.store_cpu < ncpu:
        ap.error("--client-cpu and --store-cpu want CPUs below %d" % ncpu)
    os.sched_setaffinity(0, {a.client_cpu})
    if a.store_cpu >= 0:
        pinned = pin_stores(a.stores_dir, a.store_cpu)
        print("# placement: driver, dlock bench and peers on CPU %d; %d store processes "
              "(pidfiles under %s) on CPU %d" % (a.client_cpu, pinned, a.stores_dir, a.store_cpu),
              file=sys.stderr)
    else:
        print("# placement: driver, dlock bench and peers on CPU %d; stores left where they are"
              % a.client_cpu, file=sys.stderr)
    rows, failed = [], 0
    for store in stores:
        uri = os.environ.get(STORES[store][0])
        if not uri:
            print("# %s: no %s: left out" % (store, STORES[store][0]), file=sys.stderr)
            continue
        cells, placement = run_store(store, uri, a)
        failed += "dlock!" in cells
        rows.append(row(store, uri, cells, placement))
    if a.json:
        json.dump({"rounds": a.rounds, "samples": a.samples, "handoffs": a.handoffs,
                   "client_cpu": a.client_cpu, "store_cpu": a.store_cpu, "stores": rows},
                  sys.stdout, indent=1)
        print()
    else:
        print(table(rows))
        print()
        for r in rows:
            if r["placement"]:
                print("%s placement (dlock bench): %s" % (r["store"], r["placement"]["summary"]))
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
