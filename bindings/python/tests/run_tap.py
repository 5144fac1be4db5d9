#!/usr/bin/env python3
"""Runs the package's pytest suite with TAP on stdout, for `meson test`.

One `ok` / `not ok` line per test case (a skip is `ok ... # SKIP why`);
pytest's own report goes to stderr, which meson keeps in its log. Extra
arguments go to pytest (e.g. -k fifo). A run that tests nothing (pytest's
"no tests collected", or every test deselected) fails with a `Bail out!`.
"""

import os
import sys


class TapPlugin:
    def __init__(self, out):
        self.out = out
        self.n = 0
        self.reports = {}

    def emit(self, line):
        self.out.write(line + "\n")
        self.out.flush()

    def pytest_collection_finish(self, session):
        # After -k and the like deselected theirs.
        self.emit("1..{}".format(len(session.items)))

    def pytest_collectreport(self, report):
        if report.failed:
            self.emit("Bail out! cannot collect {}".format(report.nodeid))

    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        self.n += 1
        reports = self.reports.pop(nodeid, [])
        failed = [r for r in reports if r.failed]
        skipped = [r for r in reports if r.skipped]
        if failed:
            self.emit("not ok {} - {}".format(self.n, nodeid))
            for r in failed:
                for line in str(r.longrepr).splitlines()[-15:]:
                    self.emit("# " + line)
        elif skipped:
            why = skipped[0].longrepr
            why = why[2] if isinstance(why, tuple) else str(why)
            self.emit("ok {} - {} # SKIP {}".format(self.n, nodeid, why.replace("Skipped: ", "")))
        else:
            self.emit("ok {} - {}".format(self.n, nodeid))


def main():
    try:
        import pytest
    except ImportError:
        print("Bail out! pytest is not importable by {} (Debian: apt-get install python3-pytest)"
              .format(sys.executable))
        return 1
    # TAP keeps the real stdout; everything else printed goes to stderr.
    tap = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    here = os.path.dirname(os.path.abspath(__file__))
    extra = sys.argv[1:]
    # A first argument that is a path is the tests to run (tests/interop
    # runs its files through this too); else this package's tests.
    if extra and os.path.exists(extra[0]):
        here, extra = extra[0], extra[1:]
    args = [here, "-p", "no:cacheprovider", "-rs", "-v"] + extra
    plugin = TapPlugin(tap)
    rc = pytest.main(args, plugins=[plugin])
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED or (rc == 0 and plugin.n == 0):
        # A run that tested nothing has proven nothing: it fails.
        plugin.emit("Bail out! pytest ran no tests (exit status {})".format(int(rc)))
        rc = 1
    tap.flush()
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
