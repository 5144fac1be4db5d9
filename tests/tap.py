"""TAP for the project's Python tests: numbered results with diagnostics,
and the exit status (tests/tap.h is the C side)."""
import sys


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, desc, detail="", tail=None):
        """Prints one result; when it failed, detail (text or bytes; its
        last `tail` lines if given) as "#" lines. Returns cond."""
        self.n += 1
        print(("ok" if cond else "not ok") + " %d - %s" % (self.n, desc))
        if not cond:
            self.failed += 1
            if isinstance(detail, bytes):
                detail = detail.decode(errors="replace").replace("\r", "")
            lines = str(detail).splitlines()
            for line in lines[-tail:] if tail else lines:
                print("# " + line)
        sys.stdout.flush()
        return cond

    def plan_now(self):
        print("1..%d" % self.n)

    def status(self):
        return 1 if self.failed else 0
