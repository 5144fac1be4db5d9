#!/usr/bin/env python3
"""Counts TAP results in meson's testlog.json files and prints
`N passed, N failed, N skipped`.

usage: test-summary.py [--since EPOCH] [--expect LABELS=BUILD[:SUITES]] ...
                       [LABEL=]testlog.json ...

Each log is one run (a build, or a build under a test setup such as
valgrind); LABEL names it in the per-test lines and its subtotal. Under
each failed test the summary repeats the `not ok` lines with the
diagnostics that follow them (or, for a failure without one, the output's
last lines and what is wrong with it), so the closing lines alone say what
failed. Exits 1 on any failure or when nothing ran at all, 2 on a usage
error (such as an --expect naming a label that no log has).

What fails, besides a `not ok` line (each counted once per test program):
- a test program that failed without a `not ok` line (crash, sanitizer
  report, timeout, non-zero exit);
- a test program with no results at all: every test here speaks TAP, and
  one that ran nothing (pytest collecting no tests, a plan `1..0`) has
  proven nothing, so it is not a skip; a test that skips as a whole says
  so with one `ok 1 # SKIP why` line;
- a missing plan, more than one plan, or a plan `1..N` whose N differs from
  the number of results (short: the program stopped early; long: it ran
  more than it announced), and a `Bail out!` line;
- a log that is missing (its build or its run did not happen), unreadable,
  or, with --since, written before the run began: an earlier run's log is
  never counted again, so its tests count as absent;
- a log holding no test at all, unless an --expect names it (an empty lane
  is judged by what was expected of the lanes together);
- with --expect, a test that the build defines but that is in none of the
  logs named (see below).

The expected list. `--expect LABELS=BUILD[:SUITES]` says: every test that
the meson build directory BUILD defines (`meson introspect --tests BUILD`)
in one of SUITES (comma-separated, without the project prefix; all suites
when left out), and in none of the suites SUITES names with a leading `!`
(a run that leaves a suite out: `unit,conformance,!layouts`), must appear in at least one of the logs whose labels are in
LABELS (comma-separated). The list comes from the build itself, as
configured, so a test that exists in the build but was not run, or whose
log was lost, fails by name; a test the build could not define at all
must be defined anyway as a failing one (bindings/node/meson.build does
this when `node` is missing, bindings/python/meson.build when pytest is,
bindings/go/run_tap.py when `go` is).
What a run deliberately leaves out is said by SUITES: a run of only some
suites of a build (the sanitizer build runs unit, conformance, fuzz and
faults) expects only those; a suite run in other logs (the lanes of the
fault suite) is expected of all those logs together. A SUITE with no test
in BUILD fails too (a suite that was renamed or is no longer built). BUILD
may also be a JSON file holding that introspection output.
"""
import json
import os
import re
import subprocess
import sys


DETAIL_LINES = 8     # diagnostic lines shown after each `not ok`
DETAIL_FAILS = 5     # `not ok` lines shown per test
MISSING_SHOWN = 20   # absent tests named per --expect (each counts)
INDENT = "       | "

RE_NOT_OK = re.compile(r"^not ok\b")
RE_OK = re.compile(r"^ok\b")
RE_SKIP = re.compile(r"#\s*SKIP", re.I)
RE_PLAN = re.compile(r"^1\.\.(\d+)\s*(#.*)?$")
RE_BAIL = re.compile(r"^Bail out!(.*)")


def failure_detail(t):
    """The lines that say why test run t failed, indented for the summary."""
    lines = t.get("stdout", "").splitlines()
    shown, fails = [], 0
    for i, out in enumerate(lines):
        if not RE_NOT_OK.match(out):
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
    return [INDENT + line[:300] for line in shown]


def tap_counts(stdout):
    """(passed, failed, skipped, problems) of one TAP output: problems are
    the lines saying what is wrong with its structure (plan, bail out, no
    results)."""
    p = f = s = 0
    plans, problems = [], []
    for out in stdout.splitlines():
        if RE_NOT_OK.match(out):
            f += 1
        elif RE_OK.match(out):
            if RE_SKIP.search(out):
                s += 1
            else:
                p += 1
        elif RE_PLAN.match(out):
            plans.append(int(RE_PLAN.match(out).group(1)))
        elif RE_BAIL.match(out):
            problems.append("bailed out: " + out[:200])
    results = p + f + s
    if results == 0:
        problems.append("no results: a test program that ran nothing fails")
    if not plans:
        problems.append("no TAP plan (`1..N`)")
    elif len(plans) > 1:
        problems.append("more than one TAP plan: " + ", ".join(f"1..{n}" for n in plans))
    elif plans[0] != results:
        kind = "short" if results < plans[0] else "long"
        problems.append(f"{kind} plan: 1..{plans[0]} but {results} results")
    return p, f, s, problems


def short_name(name):
    """A test's name as `meson introspect` gives it: the log says
    `project:suite / name` when the project has more than one suite."""
    return name.rpartition(" / ")[2]


def count(path, label, since, expected_labels, seen):
    """Counts one log; adds the names of its tests to seen[label]."""
    if not os.path.exists(path):
        print(f"  FAIL {label}: no test log ({path}): the build or the run failed")
        return 0, 1, 0
    if since is not None and os.path.getmtime(path) < since:
        print(f"  FAIL {label}: stale test log ({path}): written before this run began,"
              " so the run that should have written it did not")
        return 0, 1, 0
    passed = failed = skipped = tests = 0
    with open(path) as log:
        for n, line in enumerate(log, 1):
            if not line.strip():
                continue
            try:
                t = json.loads(line)
            except ValueError as e:
                print(f"  FAIL {label}: {path} line {n} is not a test record ({e})")
                failed += 1
                continue
            tests += 1
            seen.setdefault(label, set()).add(short_name(t["name"]))
            p, f, s, problems = tap_counts(t.get("stdout", ""))
            if (t["result"] not in ("OK", "SKIP") or problems) and f == 0:
                f = 1
            status = "FAIL" if f else "ok"
            print(f"  {status:4} {label}: {t['name']}: {p} passed, {f} failed, {s} skipped"
                  + ("" if t["result"] == "OK" else f" [{t['result']}]"))
            if f:
                print("\n".join([INDENT + x for x in problems] + failure_detail(t)))
            passed, failed, skipped = passed + p, failed + f, skipped + s
    if tests == 0 and label not in expected_labels:
        print(f"  FAIL {label}: no test in the log ({path})")
        failed += 1
    return passed, failed, skipped


def build_tests(build):
    """{name: [suite, ...]} of the tests BUILD defines, or an error string."""
    try:
        if build.endswith(".json") and os.path.isfile(build):
            with open(build) as f:
                tests = json.load(f)
        else:
            out = subprocess.run(["meson", "introspect", "--tests", build],
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                return (out.stderr or out.stdout).strip().splitlines()[-1:] or ["failed"]
            tests = json.loads(out.stdout)
        return {t["name"]: [s.rpartition(":")[2] for s in t["suite"]] for t in tests}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [str(e)]


def check_expected(spec, seen):
    """Failures of one --expect: the tests of the build in none of its logs."""
    labels, _, rest = spec.partition("=")
    labels = [x for x in labels.split(",") if x]
    build, suites = rest, None
    if ":" in rest:
        build, _, suites = rest.rpartition(":")
        suites = [x for x in suites.split(",") if x]
    what = f"{build}" + (f" ({', '.join(suites)})" if suites else "")
    tests = build_tests(build)
    if isinstance(tests, list):
        print(f"  FAIL expected tests of {what}: cannot list them: {' '.join(tests)}")
        return 1
    failed = 0
    left_out = [s[1:] for s in suites or [] if s.startswith("!")]
    suites = [s for s in suites if not s.startswith("!")] if suites else None
    for suite in (suites or []) + left_out:
        if not any(suite in ss for ss in tests.values()):
            print(f"  FAIL expected tests of {what}: no test of suite {suite} in {build}")
            failed += 1
    ran = set().union(*(seen.get(x, set()) for x in labels))
    absent = [(name, ss) for name, ss in sorted(tests.items())
              if (suites is None or set(ss) & set(suites)) and not set(ss) & set(left_out)
              and name not in ran]
    for name, ss in absent[:MISSING_SHOWN]:
        print(f"  FAIL {'+'.join(labels)}: {name} ({'+'.join(ss)}): defined in {build}"
              " but in none of these logs: not run, or its log was lost")
    if len(absent) > MISSING_SHOWN:
        print(f"  FAIL {'+'.join(labels)}: ... and {len(absent) - MISSING_SHOWN} more tests"
              f" of {build} in none of these logs")
    return failed + len(absent)


def usage(why=""):
    print((f"test-summary.py: {why}\n" if why else "") + __doc__, file=sys.stderr)
    sys.exit(2)


def parse_args(args):
    since, expects, logs = None, [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--since", "--expect"):
            if i + 1 == len(args):
                usage(f"{arg} needs a value")
            if arg == "--since":
                try:
                    since = float(args[i + 1])
                except ValueError:
                    usage(f"--since {args[i + 1]!r} is not a time in seconds")
            else:
                expects.append(args[i + 1])
            i += 2
            continue
        label, sep, path = arg.partition("=")
        if not sep or not path.endswith(".json"):
            label, path = os.path.basename(os.path.dirname(os.path.dirname(arg))) or arg, arg
        logs.append((label, path))
        i += 1
    if not logs:
        usage()
    known = {label for label, _ in logs}
    for spec in expects:
        labels, sep, build = spec.partition("=")
        missing = [x for x in labels.split(",") if x and x not in known]
        if not sep or not build or not labels or missing:
            usage(f"bad --expect {spec!r}"
                  + (f": no log labelled {', '.join(missing)}" if missing else ""))
    return since, expects, logs


def main(args):
    since, expects, logs = parse_args(args)
    expected_labels = {x for spec in expects for x in spec.partition("=")[0].split(",")}
    total = [0, 0, 0]
    subtotals = []
    seen = {}
    for label, path in logs:
        c = count(path, label, since, expected_labels, seen)
        subtotals.append((label, c))
        total = [a + b for a, b in zip(total, c)]
    for spec in expects:
        total[1] += check_expected(spec, seen)
    if len(subtotals) > 1:
        for label, (p, f, s) in subtotals:
            print(f"  {label}: {p} passed, {f} failed, {s} skipped")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] or total[0] == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
