#!/usr/bin/python3
"""TAP test: `dlock bench --scale` on a file:// store.

    test_scale.py DLOCK_EXE WORKDIR

Runs --scale 10,100 with a few samples, as JSON and as the table, and checks
the shape and that every figure is plausible: each N fully held and released,
a fill rate, heap bytes per lock above zero (mallinfo2: the handles and names
the library allocates), latencies above zero with the asked number of
samples. Then checks that bad --scale lists, and --scale with an option of
the contended runs, are usage errors (exit 64) naming --scale.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "tests"))
from tap import Tap  # noqa: E402

BAD_LISTS = ["0", "abc", "10,,100", "", "10,", ",10", "-5", "10000001",
             "1,2,3,4,5,6,7,8,9", "10;100", "1e3"]
SAMPLES = 50

tap = Tap()
check = tap.ok


def run(args):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def check_entry(e, want):
    problems = []
    if e.get("locks") != want or e.get("held") != want:
        problems.append("locks/held %r/%r, want %d" % (e.get("locks"),
                                                        e.get("held"), want))
    if e.get("error") is not None:
        problems.append("error %r" % e.get("error"))
    if e.get("released") != want:
        problems.append("released %r" % e.get("released"))
    for key in ("fill_per_second", "release_per_second", "heap_bytes_per_lock"):
        v = e.get(key)
        if not isinstance(v, (int, float)) or v <= 0:
            problems.append("%s = %r, want > 0" % (key, v))
    # The resident set grows by whole pages: zero for a few locks is fine.
    if not isinstance(e.get("rss_bytes_per_lock"), (int, float)):
        problems.append("rss_bytes_per_lock missing")
    for key in ("acquire_release_us", "renew_us"):
        s = e.get(key) or {}
        if s.get("n") != SAMPLES:
            problems.append("%s.n = %r, want %d" % (key, s.get("n"), SAMPLES))
        if not (0 < s.get("p50", 0) <= s.get("p99", 0) <= s.get("max", 0)):
            problems.append("%s percentiles not 0 < p50 <= p99 <= max: %r"
                            % (key, s))
        if not 0 < s.get("mean", 0) < 1e6:
            problems.append("%s.mean = %r" % (key, s.get("mean")))
    return problems


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    uri = "file://" + os.path.join(work, "locks")
    print("1..%d" % (6 + len(BAD_LISTS) + 2))

    cmd = [exe, "bench", "--scale", "10,100", "--iterations", str(SAMPLES),
           "--json", uri]
    print("# " + " ".join(cmd))
    p = run(cmd)
    if not check(p.returncode == 0, "--scale --json exits 0",
                 "status %d\n%s" % (p.returncode, p.stderr)):
        return 1
    try:
        data = json.loads(p.stdout)
    except ValueError as e:
        check(False, "output is JSON", "%s\n%s" % (e, p.stdout[:2000]))
        return 1
    check(data.get("options", {}).get("scale") == [10, 100],
          "options.scale lists the counts", data.get("options"))
    res = data.get("results", [])
    scale = res[0].get("scale", []) if len(res) == 1 else []
    check(len(res) == 1 and len(scale) == 2 and "uncontended_us" not in res[0],
          "one result with one entry per N and no other measurement", res)
    for want, e in zip((10, 100), scale + [{}, {}]):
        problems = check_entry(e, want)
        check(not problems, "N = %d: held, released, figures plausible" % want,
              "\n".join(problems) + "\n" + json.dumps(e))

    cmd = [exe, "bench", "--scale", "10,100", "--iterations", str(SAMPLES), uri]
    p = run(cmd)
    rows = ["N = 10 ", "N = 100 ", "H = 10, acq+rel 1 more",
            "H = 100, renew a held one", "heap B/lock", "RSS B/lock"]
    missing = [r for r in rows if r not in p.stdout]
    check(p.returncode == 0 and not missing,
          "the table has a row per N and per latency",
          "status %d, missing %r\n%s%s" % (p.returncode, missing, p.stdout,
                                           p.stderr))

    for bad in BAD_LISTS:
        p = run([exe, "bench", "--scale", bad, uri])
        check(p.returncode == 64 and "--scale" in p.stderr,
              "--scale %r is a usage error (64)" % bad,
              "status %d\n%s" % (p.returncode, p.stderr))
    p = run([exe, "bench", uri, "--scale"])
    check(p.returncode == 64, "--scale without a list is a usage error",
          "status %d\n%s" % (p.returncode, p.stderr))
    p = run([exe, "bench", "--scale", "10", "--waiters", "2", uri])
    check(p.returncode == 64 and "--waiters" in p.stderr,
          "--scale with --waiters is a usage error naming it",
          "status %d\n%s" % (p.returncode, p.stderr))
    return tap.status()


if __name__ == "__main__":
    sys.exit(main())
