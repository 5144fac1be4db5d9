#!/usr/bin/env python3
"""Counts TAP results in meson's testlog.json files and prints
`N passed, N failed, N skipped`.

usage: test-summary.py [LABEL=]testlog.json ...

Each log is one run (a build, or a build under a test setup such as
valgrind); LABEL names it in the per-test lines and its subtotal. A test
program that failed without a `not ok` line (crash, sanitizer report,
timeout, bad plan) counts as one failure; a log that is missing (the build
or the run did not happen) counts as one failure. Exits 1 on any failure or
when nothing ran at all."""
import json
import os
import re
import sys


def count(path, label):
    passed = failed = skipped = 0
    if not os.path.exists(path):
        print(f"  FAIL {label}: no test log ({path}): the build or the run failed")
        return 0, 1, 0
    with open(path) as log:
        for line in log:
            t = json.loads(line)
            p = f = s = 0
            for out in t.get("stdout", "").splitlines():
                if re.match(r"^not ok\b", out):
                    f += 1
                elif re.match(r"^ok\b", out):
                    if re.search(r"#\s*SKIP", out, re.I):
                        s += 1
                    else:
                        p += 1
            if t["result"] not in ("OK", "SKIP") and f == 0:
                f = 1
            status = "FAIL" if f else "ok"
            print(f"  {status:4} {label}: {t['name']}: {p} passed, {f} failed, {s} skipped"
                  + ("" if t["result"] == "OK" else f" [{t['result']}]"))
            passed, failed, skipped = passed + p, failed + f, skipped + s
    return passed, failed, skipped


def main(args):
    if not args:
        sys.exit(__doc__)
    total = [0, 0, 0]
    subtotals = []
    for arg in args:
        label, sep, path = arg.partition("=")
        if not sep or not path.endswith(".json"):
            label, path = os.path.basename(os.path.dirname(os.path.dirname(arg))) or arg, arg
        c = count(path, label)
        subtotals.append((label, c))
        total = [a + b for a, b in zip(total, c)]
    if len(subtotals) > 1:
        for label, (p, f, s) in subtotals:
            print(f"  {label}: {p} passed, {f} failed, {s} skipped")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] or total[0] == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
