#!/usr/bin/env python3
"""Counts TAP results in meson's testlog.json files and prints
`N passed, N failed, N skipped`.

usage: test-summary.py [LABEL=]testlog.json ...

Each log is one run (a build, or a build under a test setup such as
valgrind); LABEL names it in the per-test lines and its subtotal. A test
program that failed without a `not ok` line (crash, sanitizer report,
timeout, bad plan) counts as one failure; a log that is missing (the build
or the run did not happen) counts as one failure. Under each failed test it
repeats the `not ok` lines with the diagnostics that follow them (or, for a
failure without one, the output's last lines), so the closing lines alone
say what failed. Exits 1 on any failure or when nothing ran at all."""
import json
import os
import re
import sys


DETAIL_LINES = 8     # diagnostic lines shown after each `not ok`
DETAIL_FAILS = 5     # `not ok` lines shown per test


def failure_detail(t):
    """The lines that say why test run t failed, indented for the summary."""
    lines = t.get("stdout", "").splitlines()
    shown, fails = [], 0
    for i, out in enumerate(lines):
        if not re.match(r"^not ok\b", out):
            continue
        fails += 1
        if fails > DETAIL_FAILS:
            continue
        shown.append(out)
        for diag in lines[i + 1:i + 1 + DETAIL_LINES]:
            if not diag.startswith("#"):
                break
            shown.append(diag)
    if fails > DETAIL_FAILS:
        shown.append(f"... and {fails - DETAIL_FAILS} more `not ok`")
    if not fails:
        tail = (t.get("stdout", "") + "\n" + t.get("stderr", "")).strip().splitlines()
        shown = tail[-DETAIL_LINES:]
    return ["       | " + line[:300] for line in shown]


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
            if f:
                print("\n".join(failure_detail(t)))
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
