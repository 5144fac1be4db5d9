#!/usr/bin/env python3
"""Negative controls of scripts/test-summary.py (TAP): hand-made testlog.json
files with no results, a short, long, missing or repeated plan, a bail out,
a configured test absent, a missing, stale or empty log, each of which must
fail the summary with the line that says why; a good set must pass. Also
the expected list taken from this very build (`meson introspect`), and
the build's own `python` test (bindings/python/tests/run_tap.py, run as
meson runs it) failing a run that collects no test.

usage: test_summary.py SUMMARY BUILD_ROOT
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

summary, build_root = sys.argv[1:3]
work = tempfile.mkdtemp(prefix="dlock-summary-")
n = 0
failed = 0


def check(ok, name, detail=""):
    global n, failed
    n += 1
    print(f"{'ok' if ok else 'not ok'} {n} - {name}")
    if not ok:
        failed += 1
        for line in detail.splitlines()[-25:]:
            print("# " + line)


def log(name, records):
    """Writes a testlog.json of records (test name, TAP stdout[, result])."""
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        for r in records:
            name_, out = r[0], r[1]
            result = r[2] if len(r) > 2 else "OK"
            f.write(json.dumps({"name": name_, "stdout": out, "stderr": "",
                                "result": result, "returncode": 0}) + "\n")
    return path


def tests_json(name, tests):
    """An expected list in `meson introspect --tests` form: (name, suites)."""
    path = os.path.join(work, name + ".tests.json")
    with open(path, "w") as f:
        json.dump([{"name": t, "suite": ["dlock:" + s for s in ss]} for t, ss in tests], f)
    return path


def summary_run(*args):
    r = subprocess.run([sys.executable, summary] + list(args),
                       capture_output=True, text=True, check=False)
    return r.returncode, r.stdout + r.stderr


def expect_fail(name, args, *needles):
    rc, out = summary_run(*args)
    missing = [x for x in needles if x not in out]
    check(rc == 1 and not missing, f"{name}: fails"
          + (f" saying {needles[0]!r}" if needles else ""),
          f"exit {rc}, missing {missing}\n{out}")


def expect_pass(name, args, *needles):
    rc, out = summary_run(*args)
    missing = [x for x in needles if x not in out]
    check(rc == 0 and not missing, f"{name}: passes", f"exit {rc}, missing {missing}\n{out}")


GOOD = "1..2\nok 1 - a\nok 2 - b # SKIP not here\n"
good = log("good", [("dlock:unit / t1", GOOD), ("dlock:cli / t2", "ok 1 - x\n1..1\n")])
expect_pass("a good log", ["good=" + good], "1 passed, 0 failed, 1 skipped")

nothing = log("nothing", [("dlock:unit / t1", GOOD), ("dlock:bindings / python", "1..0\n", "SKIP")])
expect_fail("a test with no results (plan 1..0, meson's SKIP)", ["l=" + nothing],
            "no results", "dlock:bindings / python: 0 passed, 1 failed")
silent = log("silent", [("dlock:unit / t1", "", "OK")])
expect_fail("a test that exits 0 printing nothing", ["l=" + silent], "no results", "no TAP plan")

short = log("short", [("dlock:unit / t1", "1..3\nok 1\nok 2\n")])
expect_fail("a short plan", ["l=" + short], "short plan: 1..3 but 2 results")
long_ = log("long", [("dlock:unit / t1", "1..1\nok 1\nok 2\n")])
expect_fail("a long plan", ["l=" + long_], "long plan: 1..1 but 2 results")
noplan = log("noplan", [("dlock:unit / t1", "ok 1\nok 2\n")])
expect_fail("a missing plan", ["l=" + noplan], "no TAP plan")
twoplans = log("twoplans", [("dlock:unit / t1", "1..1\nok 1\n1..1\n")])
expect_fail("two plans", ["l=" + twoplans], "more than one TAP plan")
bail = log("bail", [("dlock:unit / t1", "1..1\nok 1\nBail out! store gone\n")])
expect_fail("a bail out", ["l=" + bail], "bailed out: Bail out! store gone")
crash = log("crash", [("dlock:unit / t1", "1..2\nok 1\n", "ERROR")])
expect_fail("a crash after some results", ["l=" + crash], "[ERROR]")
notok = log("notok", [("dlock:unit / t1", "1..2\nok 1\nnot ok 2 - broke\n# why\n")])
expect_fail("a not ok", ["l=" + notok], "not ok 2 - broke", "# why")

expected = tests_json("three", [("t1", ["unit"]), ("t2", ["cli"]), ("t3", ["faults", "stores"])])
expect_fail("a configured test in no log", ["--expect", "good=" + expected, "good=" + good],
            "t3 (faults+stores): defined in", "failed")
expect_pass("the suites a run chose (unit, cli) all present",
            ["--expect", "good=" + expected + ":unit,cli", "good=" + good])
lane = log("lane", [("dlock:faults+stores / t3", "1..1\nok 1\n")])
expect_pass("a test found in another log of the same --expect",
            ["--expect", "good,lane=" + expected, "good=" + good, "lane=" + lane])
expect_fail("a test found only in a log outside the --expect",
            ["--expect", "good=" + expected, "good=" + good, "lane=" + lane],
            "t3 (faults+stores): defined in")
expect_pass("a suite the run left out (!faults) is not expected",
            ["--expect", "good=" + expected + ":unit,cli,faults,!stores", "good=" + good])
expect_fail("a suite left out spares only its own tests",
            ["--expect", "good=" + expected + ":unit,cli,faults,!cli", "good=" + good],
            "t3 (faults+stores): defined in")
expect_fail("a suite left out that the build does not have",
            ["--expect", "good=" + expected + ":unit,!nosuch", "good=" + good],
            "no test of suite nosuch")
expect_fail("an expected suite the build does not have",
            ["--expect", "good=" + expected + ":unit,nosuch", "good=" + good],
            "no test of suite nosuch")
expect_fail("an expected list that cannot be read",
            ["--expect", "good=" + os.path.join(work, "absent-build"), "good=" + good],
            "cannot list them")
rc, out = summary_run("--expect", "nolabel=" + expected, "good=" + good)
check(rc not in (0, 1) and "no log labelled nolabel" in out,
      "an --expect naming no given log is a usage error", out)

expect_fail("a missing log", ["good=" + good, "gone=" + os.path.join(work, "gone.json")],
            "no test log")
stale = log("stale", [("dlock:unit / t1", GOOD)])
os.utime(stale, (time.time() - 3600, time.time() - 3600))
expect_fail("a stale log (written before --since)",
            ["--since", str(int(time.time()) - 60), "good=" + good, "stale=" + stale],
            "stale test log")
expect_pass("a log written after --since", ["--since", str(int(time.time()) - 60), "good=" + good])
stale_lane = log("stale-lane", [("dlock:faults+stores / t3", "1..1\nok 1\n")])
os.utime(stale_lane, (time.time() - 3600, time.time() - 3600))
expect_fail("a stale lane log does not satisfy the expected list",
            ["--since", str(int(time.time()) - 60), "--expect", "good,lane=" + expected,
             "good=" + good, "lane=" + stale_lane], "stale test log", "t3 (faults+stores)")
empty = log("empty", [])
expect_fail("an empty log no --expect judges", ["good=" + good, "empty=" + empty],
            "no test in the log")
expect_pass("an empty lane whose tests another lane holds",
            ["--expect", "good,lane,empty=" + expected, "good=" + good, "lane=" + lane,
             "empty=" + empty])

# The expected list of this build, from meson introspect: a log with one
# unit test lacks the others.
one = log("one", [("dlock:unit / test_errors", GOOD)])
expect_fail("this build's unit suite against a log of one of its tests",
            ["--expect", "one=" + build_root + ":unit", "one=" + one],
            "test_uri (unit): defined in")
expect_pass("this build's summary suite against a log of its one test",
            ["--expect", "one=" + build_root + ":summary",
             "one=" + log("one-summary", [("dlock:summary / summary", GOOD)])])

# pytest collecting nothing must fail, not exit 0 with nothing: the build's
# `python` test as meson runs it (interpreter, script, environment), told
# to select no test.
listed = subprocess.run(["meson", "introspect", "--tests", build_root],
                        capture_output=True, text=True, check=False)
py = [t for t in json.loads(listed.stdout or "[]") if t["name"] == "python"]
check(len(py) == 1, "this build defines the python test", listed.stderr)
py = py[0] if py else {"cmd": [sys.executable, "-c", "exit(3)"], "env": {}}
r = subprocess.run(py["cmd"] + ["-k", "no_test_is_named_like_this"],
                   env=dict(os.environ, **py["env"]), cwd=py.get("workdir") or None,
                   capture_output=True, text=True, check=False)
check(r.returncode == 1 and "Bail out! pytest ran no tests" in r.stdout,
      "run_tap.py fails a run that collects no test",
      f"exit {r.returncode}\n{r.stdout}\n{r.stderr}")
# And its log fails the summary, even were the exit status 0 (meson's SKIP).
rc, out = summary_run("l=" + log("pytest-none", [("dlock:bindings / python", r.stdout, "SKIP")]))
check(rc == 1 and "no results" in out, "and the summary fails its log", out)

shutil.rmtree(work, ignore_errors=True)
print(f"1..{n}")
sys.exit(1 if failed else 0)
