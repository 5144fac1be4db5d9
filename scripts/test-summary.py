#!/usr/bin/env python3
"""Counts TAP results in meson's testlog.json and prints `N passed, N failed,
N skipped`. A test program that failed without a `not ok` line (crash,
timeout, bad plan) counts as one failure. Exits 1 on any failure or when
nothing ran at all."""
import json
import re
import sys

passed = failed = skipped = 0
with open(sys.argv[1]) as log:
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
        print(f"  {status:4} {t['name']}: {p} passed, {f} failed, {s} skipped"
              + ("" if t["result"] == "OK" else f" [{t['result']}]"))
        passed, failed, skipped = passed + p, failed + f, skipped + s
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
