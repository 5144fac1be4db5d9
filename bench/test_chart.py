#!/usr/bin/python3
"""TAP test: `dlock bench --chart` draws a chart from a short run.

    test_chart.py DLOCK_EXE WORKDIR

Runs a short bench on a file:// store, and on $DLOCK_REDIS_URI too when it
is set (a Redis that does not answer then fails the test), with --json and
--chart; checks the JSON record (percentiles, machine, store versions), that
the chart parses as SVG (xml.etree) and carries its titles and every axis
label with its unit, and that plot.py also writes a PNG from the same JSON.
"""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "tests"))
from tap import Tap  # noqa: E402

SVG_NS = "{http://www.w3.org/2000/svg}"
EXPECTED_TEXT = [
    "latency (µs, log scale)",
    "handoff latency (µs, log scale)",
    "waiters queued on one lock (count, log scale; 1 = ping-pong)",
    "acquisitions per second (log scale)",
    "store round trip (ping)",
    "acquire + release, uncontended",
    "handoff, ping-pong (1 waiter)",
    "p50", "p90", "p99", "max",
]

tap = Tap()
check = tap.ok


def svg_texts(path):
    root = ET.parse(path).getroot()
    texts = []
    for el in root.iter():
        if el.tag in (SVG_NS + "text", SVG_NS + "tspan"):
            texts.append("".join(el.itertext()))
    return root, "\n".join(texts)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("1..1")
        check(False, "matplotlib importable by " + sys.executable,
              "install Debian's python3-matplotlib (scripts/install-deps.sh)")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    uris = ["file://" + os.path.join(work, "locks")]
    redis = os.environ.get("DLOCK_REDIS_URI")
    if redis:
        uris.append(redis)
    print("1..%d" % (11 + (1 if redis else 0)))
    chart = os.path.join(work, "chart.svg")
    cmd = [exe, "bench", "--json", "--chart", chart, "--iterations", "50",
           "--handoffs", "20", "--contenders", "2", "--seconds", "0.1",
           "--waiters", "2,4"] + uris
    print("# " + " ".join(cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=150)
    if not check(p.returncode == 0, "dlock bench --chart exits 0",
                 "status %d\n%s" % (p.returncode, p.stderr)):
        return 1
    data = json.loads(p.stdout)
    res = data["results"]
    check(len(res) == len(uris), "one result per URI")
    check(all("p90" in r["uncontended_us"] for r in res), "JSON has p90")
    # The modes' rows: measured where the store has the mode, null where not.
    bad = []
    for r in res:
        for cap, key in (("shared", "shared_uncontended_us"),
                         ("semaphore", "semaphore_handoff_pingpong_us")):
            st = r.get(key, "missing")
            if (st is None) == (cap in r["caps"]) or (st is not None and not (
                    isinstance(st, dict) and st.get("n", 0) > 0 and st.get("p50", 0) > 0)):
                bad.append((r["uri"], key, st))
        if r.get("semaphore_limit") != 2:
            bad.append((r["uri"], "semaphore_limit", r.get("semaphore_limit")))
    check(not bad, "shared acquire+release and semaphore handoff measured where the "
          "store has the mode, null where not", bad)
    m = data["machine"]
    check(m.get("cpu_model") and m.get("kernel") and m.get("nproc"),
          "JSON names the machine (cpu_model, kernel, nproc)", m)
    check([w["waiters"] for w in res[0]["handoff_waiters"]] == [2, 4],
          "handoff measured at each --waiters count", res[0]["handoff_waiters"])
    if redis:
        check(str(res[1].get("store_version", "")).startswith("Redis "),
              "the Redis server version is in the JSON", res[1].get("store_version"))
    check(os.path.getsize(chart) > 1000, "chart written", chart)
    try:
        root, text = svg_texts(chart)
        ok = root.tag == SVG_NS + "svg"
    except ET.ParseError as e:
        ok, text = False, str(e)
    check(ok, "chart parses as SVG", text[:500])
    missing = [t for t in EXPECTED_TEXT if t not in text]
    check(not missing, "chart carries titles, axis labels with units and "
          "the percentile legend", "missing: %r" % missing)
    wanted = ["Machine: " + m["cpu_model"], m["kernel"], "Command: dlock bench"]
    wanted += [r["uri"] for r in res]
    wanted += [r["store_version"] for r in res if r.get("store_version")]
    missing = [t for t in wanted if t not in text]
    check(not missing, "caption names the machine, the stores and the command",
          "missing: %r" % missing)
    png = os.path.join(work, "chart.png")
    plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.py")
    q = subprocess.run([sys.executable, plot, "-o", png], input=p.stdout,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    ok = q.returncode == 0 and os.path.exists(png)
    if ok:
        with open(png, "rb") as f:
            ok = f.read(8) == b"\x89PNG\r\n\x1a\n"
    check(ok, "plot.py writes a PNG from the JSON on stdin", q.stderr)
    return tap.status()


if __name__ == "__main__":
    sys.exit(main())
