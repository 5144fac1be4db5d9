#!/usr/bin/env python3
"""dlock run on a terminal (a pseudo-terminal this test drives): the
command, in a process group of its own, gets the terminal's foreground, so
it reads the terminal and the interrupt character reaches it; under an
interactive bash, suspending the command (^Z) stops the job, fg resumes
it, and a command started in the background that reads the terminal is
stopped until fg, as any shell job. File store, in a fresh directory.

TAP output. Usage: test_cli_tty.py PATH/TO/dlock
"""
import os
import pty
import re
import select
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from tap import Tap  # noqa: E402

DLOCK = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(prefix="dlock-cli-tty.")
URI = "file://" + TMP + "/locks"
tap = Tap()


def ok(cond, desc, out=b""):
    return tap.ok(cond, desc, out, tail=15)


class Term:
    """A program on a new pseudo-terminal, as its session leader."""

    def __init__(self, argv, env=None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(argv[0], argv, env or os.environ)
        self.out = b""
        self.status = None

    def read(self, seconds):
        r, _, _ = select.select([self.fd], [], [], seconds)
        if r:
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                data = b""
            self.out += data
            return bool(data)
        return True

    def expect(self, pattern, seconds=10):
        """Waits up to seconds for pattern in the output after self.mark."""
        end = time.monotonic() + seconds
        while not re.search(pattern, self.out[self.mark:]):
            left = end - time.monotonic()
            if left <= 0 or not self.read(min(left, 0.1)):
                return bool(re.search(pattern, self.out[self.mark:]))
        return True

    mark = 0

    def send(self, data):
        self.mark = len(self.out)
        os.write(self.fd, data)

    def wait(self, seconds=10):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                break
            self.read(0.05)
        return self.status

    def close(self):
        if self.status is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def dlock_direct(name, script):
    return Term([DLOCK, "run", URI, name, "--", "sh", "-c", script])


try:
    # 1. The command leads its own group, which has the terminal's
    #    foreground, so it can read the terminal (no SIGTTIN).
    t = dlock_direct("read", 'echo "ids:$$:$(ps -o pgid=,tpgid= -p $$ | tr -s " " :)"; '
                             'echo "ready$((1+1))"; read x; echo "got:$x"')
    t.expect(rb"ready2")
    m = re.search(rb"ids:(\d+)::?(\d+):(\d+)", t.out)
    ok(m and m.group(1) == m.group(2) == m.group(3),
       "the command leads a process group of its own, the terminal's foreground (%s)"
       % (m.group(0).decode() if m else "?"), t.out)
    t.send(b"hello\n")
    got = t.expect(rb"got:hello")
    ok(got and t.wait() == 0, "the command reads the terminal (exit %s)" % t.status, t.out)
    t.close()

    # 2. The interrupt character reaches the command (and its children).
    t = dlock_direct("intr", 'trap "echo caught-INT; exit 3" INT; echo "ready$((1+1))"; '
                             'while :; do sleep 0.05; done')
    t.expect(rb"ready2")
    t.send(b"\x03")
    got = t.expect(rb"caught-INT")
    ok(got and t.wait() == 3, "^C reaches the command, dlock exits with its status (%s)"
       % t.status, t.out)
    t.close()

    # 3. Job control under an interactive bash.
    env = dict(os.environ, PS1="PROMPT$ ", TERM="dumb")
    t = Term(["bash", "--norc", "--noprofile", "-i"], env)
    t.expect(rb"PROMPT\$ ")
    t.send(("%s run %s jobs -- sh -c 'echo \"ready$((1+1))\"; read x; echo \"got:$x\"'\n"
            % (DLOCK, URI)).encode())
    t.expect(rb"ready2")
    t.send(b"\x1a")
    stopped = t.expect(rb"Stopped")
    ok(stopped, "^Z stops the job: bash reports it stopped", t.out)
    t.send(b"fg\n")
    t.expect(rb"fg\r?\n.*jobs")  # bash echoes the job's command line
    t.send(b"after\n")
    got = t.expect(rb"got:after")
    t.send(b"echo rc=$?\n")
    rc = t.expect(rb"rc=0")
    ok(got and rc, "fg resumes it with the terminal: it reads it and exits 0", t.out)

    # 4. Started in the background, it stops when it reads the terminal;
    #    fg gives it the terminal.
    t.send(("%s run %s bg -- sh -c 'read x; echo \"got$((1+1)):$x\"' &\n"
            % (DLOCK, URI)).encode())
    t.expect(rb"PROMPT\$ ")
    end = time.monotonic() + 10
    stopped = False
    while not stopped and time.monotonic() < end:
        t.send(b"jobs\n")
        stopped = t.expect(rb"Stopped.*bg", 0.5)
    ok(stopped, "in the background, reading the terminal stops the job", t.out)
    t.send(b"fg\n")
    t.expect(rb"fg\r?\n.*bg")
    t.send(b"later\n")
    got = t.expect(rb"got2:later")
    t.send(b"echo rc=$?\n")
    rc = t.expect(rb"rc=0")
    ok(got and rc, "fg gives it the terminal: it reads it and exits 0", t.out)

    # 5. Brought to the foreground before it reads: dlock hands the
    #    terminal on at once (SIGCONT from fg), the command never stops.
    t.send(("%s run %s fg -- sh -c 'echo \"ready$((1+2))\"; sleep 1; read x; echo \"got3:$x\"' &\n"
            % (DLOCK, URI)).encode())
    t.expect(rb"ready3")
    t.send(b"fg\n")
    t.expect(rb"fg\r?\n.*fg")
    t.send(b"now\n")
    got = t.expect(rb"got3:now")
    t.send(b"echo rc=$?\n")
    rc = t.expect(rb"rc=0")
    ok(got and rc and b"Stopped" not in t.out[t.out.rfind(b"ready3"):],
       "fg while it runs gives it the terminal without a stop", t.out)
    t.send(b"exit\n")
    t.wait(5)
    t.close()
finally:
    shutil.rmtree(TMP, ignore_errors=True)

tap.plan_now()
sys.exit(tap.status())
