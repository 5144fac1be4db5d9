#!/usr/bin/env python3
"""Runs the Go package's tests (`go test -json`) with TAP on stdout, for
`meson test`.

usage: run_tap.py [GO] [go test arguments...]

One `ok` / `not ok` line per test that has no subtests (a test per store:
TestContext/redis), a skip as `ok ... # SKIP why`; a failure is followed by
its output as `#` lines. A package that does not build, a test binary that
dies outside any test, or a run that tests nothing fails. Go's own output
goes to stderr, which meson keeps in its log. Offline: GOPROXY=off, and
the module has no dependency outside Go's standard library.
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT_LINES = 30  # lines of a failed test's output shown after `not ok`


def main():
    args = sys.argv[1:]
    go = args.pop(0) if args and os.path.basename(args[0]) == "go" else shutil.which("go")
    if not go or not os.path.exists(go):
        print("Bail out! go was not found (Debian: apt-get install golang-go)")
        return 1
    env = dict(os.environ, GOFLAGS="-mod=readonly", GOPROXY="off", GOTOOLCHAIN="local",
               GOTELEMETRY="off", CGO_ENABLED="1")
    cmd = [go, "test", "-json", "-count=1"] + (args or ["./..."])
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, text=True)
    order, result, output, skip_why = [], {}, {}, {}
    loose = []  # output that belongs to no test (build errors, a crash)
    pkg_failed = []
    for line in proc.stdout:
        try:
            ev = json.loads(line)
        except ValueError:
            loose.append(line.rstrip("\n"))
            sys.stderr.write(line)
            continue
        test, action = ev.get("Test"), ev.get("Action")
        if action == "output":
            sys.stderr.write(ev.get("Output", ""))
            if test:
                output.setdefault(test, []).append(ev["Output"].rstrip("\n"))
            else:
                loose.append(ev["Output"].rstrip("\n"))
            continue
        if test is None:
            if action == "fail":
                pkg_failed.append(ev.get("Package", "?"))
            continue
        if action == "run" and test not in result:
            order.append(test)
            result[test] = None
        elif action in ("pass", "fail", "skip"):
            result[test] = action
    rc = proc.wait()
    parents = {t.rpartition("/")[0] for t in order if "/" in t}
    leaves = [t for t in order if t not in parents]
    print("1..{}".format(len(leaves) + (1 if pkg_failed and not any(
        result[t] == "fail" for t in leaves) else 0)))
    n = 0
    for t in leaves:
        n += 1
        r = result[t]
        if r == "pass":
            print("ok {} - {}".format(n, t))
        elif r == "skip":
            why = [x.strip() for x in output.get(t, []) if x.strip().startswith("dlock_test") or
                   x.strip().startswith("helpers_test")]
            print("ok {} - {} # SKIP {}".format(n, t, why[-1] if why else ""))
        else:
            print("not ok {} - {}{}".format(n, t, "" if r else " (did not finish)"))
            lines = output.get(t, [])
            for x in lines[-OUTPUT_LINES:]:
                print("# " + x)
    if pkg_failed and not any(result[t] == "fail" for t in leaves):
        n += 1
        print("not ok {} - package {} (build failure or a crash outside a test)".format(
            n, " ".join(pkg_failed)))
        for x in loose[-OUTPUT_LINES:]:
            print("# " + x)
    if not leaves and not pkg_failed:
        print("Bail out! go test ran no test (go exited {})".format(rc))
        return 1
    return 1 if rc or pkg_failed else 0


if __name__ == "__main__":
    sys.exit(main())
