"""What every peer test needs: store URIs, the dlock CLI, peer processes.

A peer runs as a process of its own (a Python snippet on Debian's
/usr/bin/python3, or node for npm's clients) that speaks a line protocol
on its stdin and stdout:
    it prints  "held <t>"      once it holds (t: CLOCK_MONOTONIC seconds)
               "busy"          when a try found the lock taken
               "released <t>"  once its release returned
               "error <text>"  on failure
    it reads   "release"       release and print "released <t>"
               (end of input)  release if held, then exit
Python's time.monotonic() and libdlock's dlock_monotonic_ns() read the same
CLOCK_MONOTONIC, so a peer's "released t" and a dlock grant in this process
measure a handoff across processes.

A store or a peer package that is missing fails under
DLOCK_STORES_REQUIRED=1 (CI) and skips otherwise.
"""

import os
import secrets
import select
import subprocess
import sys
import time

import pytest

import dlock

PYTHON = "/usr/bin/python3"  # Debian's: it sees python3-redis, -kazoo, -tooz
RUN = "ia-{}-{}".format(os.getpid(), secrets.token_hex(3))
# dlock run's exit status when the lock is held elsewhere (tools: 75).
EXIT_BUSY = 75


def stores_required():
    return os.environ.get("DLOCK_STORES_REQUIRED") == "1"


def missing(why):
    if stores_required():
        pytest.fail(why + " (DLOCK_STORES_REQUIRED=1)")
    pytest.skip(why)


def env_uri(var):
    """The store URI in var (from scripts/stores/start.sh), or missing()."""
    uri = os.environ.get(var)
    if not uri:
        missing("{} is not set".format(var))
    return uri


def with_params(uri, **params):
    """uri with query parameters added (key=value, in order)."""
    extra = "&".join("{}={}".format(k, v) for k, v in params.items())
    if not extra:
        return uri
    return uri + ("&" if "?" in uri else "?") + extra


def peer_module(module):
    """Imports a peer's Python package in Debian's interpreter, or missing()."""
    r = subprocess.run([PYTHON, "-c", "import " + module], capture_output=True, text=True)
    if r.returncode != 0:
        missing("{} cannot import {}: {}".format(PYTHON, module, r.stderr.strip()[-200:]))


@pytest.fixture
def name(request):
    """A lock name no other run or case uses (letters, digits, '-')."""
    return "{}-{}".format(RUN, secrets.token_hex(4))


def dlock_cli():
    cli = os.environ.get("DLOCK_CLI")
    if not cli or not os.access(cli, os.X_OK):
        pytest.fail("DLOCK_CLI does not name the dlock program: {!r}".format(cli))
    return cli


def dlock_try(uri, name, *extra, timeout=20):
    """`dlock run -n URI NAME -- true`: 0 when it held, EXIT_BUSY when the
    lock was taken, anything else a failure (its stderr in the message)."""
    argv = [dlock_cli(), "run", "-n"] + list(extra) + [uri, name, "--", "true"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode not in (0, EXIT_BUSY):
        pytest.fail("{} → exit {}: {}".format(" ".join(argv[1:]), r.returncode,
                                              r.stderr.strip()[-300:]))
    return r.returncode


class Peer:
    """A process holding or trying a lock by the protocol above."""

    def __init__(self, argv, env=None, cwd=None):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=env,
                                     cwd=cwd)
        self.lines = []

    def line(self, timeout=10.0):
        """The next line it prints, within timeout seconds (fails if none)."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                self.fail("no line within {:.1f} s".format(timeout))
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                text = self.proc.stdout.readline()
                if not text:
                    self.fail("exited (status {})".format(self.proc.wait(5)))
                self.lines.append(text.rstrip("\n"))
                return self.lines[-1]

    def expect(self, word, timeout=10.0):
        """Waits for a line starting with word; its value (a float after
        the word, when there is one)."""
        text = self.line(timeout)
        if text.split(" ", 1)[0] != word:
            self.fail("printed {!r} where {!r} was expected".format(text, word))
        rest = text[len(word):].strip()
        try:
            return float(rest) if rest else None
        except ValueError:
            return rest

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def fail(self, why):
        err = ""
        if self.proc.poll() is not None:
            err = self.proc.stderr.read()[-600:]
        pytest.fail("peer {}: {} (stderr: {})".format(os.path.basename(self.argv[-1])
                                                     if len(self.argv[-1]) < 60 else
                                                     self.argv[0], why, err.strip()))

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture
def peers():
    """Starts peers (peers(argv) → Peer); every one is closed at the end."""
    started = []

    def start(argv, **kw):
        p = Peer(argv, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def python_peer(script):
    """argv running script (the protocol's body) on Debian's python3. The
    script gets PEER_ARGS = sys.argv[1:] and the helpers say(), now(),
    wait_cmd(), hold(took, give) (held until "release") and serve(take,
    give) (the loop protocol)."""
    prelude = (
        "import sys, time\n"
        "PEER_ARGS = sys.argv[1:]\n"
        "def say(*words):\n"
        "    print(*words, flush=True)\n"
        "def now():\n"
        "    return '{:.6f}'.format(time.monotonic())\n"
        "def wait_cmd():\n"
        "    return sys.stdin.readline().strip()\n"
        "def hold(took, give):\n"  # a try or a wait's result, then the protocol
        "    if not took:\n"
        "        say('busy')\n"
        "        sys.exit(0)\n"
        "    say('held', now())\n"
        "    while wait_cmd() not in ('release', ''):\n"
        "        pass\n"
        "    give()\n"
        "    say('released', now())\n"
        "def serve(take, give):\n"  # the loop protocol (rolling_migration)
        "    while True:\n"
        "        cmd = wait_cmd()\n"
        "        if cmd == 'acquire':\n"
        "            if not take():\n"
        "                say('error', 'not acquired within 20 s')\n"
        "                continue\n"
        "            say('held', now())\n"
        "        elif cmd == 'release':\n"
        "            give()\n"
        "            say('released', now())\n"
        "        else:\n"
        "            break\n"
    )
    return [PYTHON, "-c", prelude + script]


def dlock_client(uri):
    """A dlock client in this process (libdlock through the Python package)."""
    try:
        return dlock.open(uri)
    except dlock.ENOBACKEND:
        missing("libdlock was built without the backend of " + uri.split(":", 1)[0])


def grant_after(release_at, granted_at):
    """Milliseconds from a peer's release to a grant here (monotonic s)."""
    return (granted_at - release_at) * 1000.0


def log(*words):
    print(*words, file=sys.stderr, flush=True)


def wait_until_waiting(client, name, n=1, timeout=5.0):
    """Waits until the store counts n dlock waiters on name where it can
    tell, else gives a waiter 0.3 s to queue."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            info = client.inspect(name)
        except dlock.DlockError:
            break
        waiters = info.get("waiters")  # (absent where the store cannot count them)
        if waiters is None:
            break
        if waiters >= n:
            return
        time.sleep(0.02)
    time.sleep(0.3)


def handoff_peer_to_dlock(peer, client, name, timeout=10.0, watcher=None):
    """peer holds name (it printed "held"); a dlock acquire of name waits in
    a thread of this process; the peer releases. Milliseconds from the
    peer's release (its "released t") to the dlock grant, and the lock
    (the caller releases it). watcher: a second client of the store, whose
    inspect tells when the wait is queued (a client runs one call at a
    time: the waiting one cannot be asked); without one, 0.3 s."""
    import threading

    got = {}

    def wait():
        try:
            lk = client.acquire(name, timeout=timeout)
            got["t"] = time.monotonic()
            got["lock"] = lk
        except Exception as e:  # reported below
            got["error"] = e

    th = threading.Thread(target=wait)
    th.start()
    if watcher is not None:
        wait_until_waiting(watcher, name)
    else:
        time.sleep(0.3)
    assert "t" not in got, "dlock was granted {} while the peer held it".format(name)
    peer.send("release")
    released = peer.expect("released")
    th.join(timeout + 5)
    if "error" in got:
        pytest.fail("the dlock waiter failed: {!r}".format(got["error"]))
    assert "t" in got, "the dlock waiter was not granted within {} s".format(timeout)
    return grant_after(released, got["t"]), got["lock"]


def handoff_dlock_to_peer(lock, peer, timeout=10.0):
    """A dlock lock is held; peer was started blocking on the same name and
    has printed "waiting" (it must, just before its blocking acquire).
    Milliseconds from dlock's release call to the peer's "held t"."""
    time.sleep(0.3)  # the peer's blocking acquire reaches the store
    t0 = time.monotonic()
    lock.release()
    held = peer.expect("held", timeout)
    return grant_after(t0, held)


# ---- a rolling migration from a peer library to dlock (docs/migration.md,
# "From another lock library") ------------------------------------------
#
# WORKERS workers take one lock name over and over; each critical section,
# under the lock, counts itself in (finding another inside is an overlap),
# reads a shared counter, sleeps 10 ms and writes it back + 1. The workers
# move through the runbook's phases, the first half first:
#   1. all peer                       2. half on the list, half peer
#   3. all on the list "PEER_URI NATIVE_URI" (the peer is gone)
#   4. half native, half on the list  5. all native
# where PEER_URI is the peer layout (e.g. redis://h/0?layout=plain) and a
# peer worker is a process of the peer library (peer_argv: the loop
# protocol below). A phase ends once every worker ran a section in it.
# Returns a dict of what was seen; the caller asserts.
#
# Loop protocol of a peer worker: reads "acquire" → takes the lock
# (blocking) and prints "held <t>"; reads "release" → releases it and
# prints "released <t>"; end of input: exit.

ROLL_PHASES = {1: ("peer", "peer"), 2: ("list", "peer"), 3: ("list", "list"),
               4: ("native", "list"), 5: ("native", "native")}


def rolling_migration(peer_argv, peer_uri, native_uri, name, workers=4, phase_s=1.0,
                      list_uri=None):
    import threading

    state = {"inside": 0, "counter": 0, "sections": [], "overlaps": 0, "errors": [],
             "phase": 1, "acked": {}, "stop": False}
    mu = threading.Lock()
    if list_uri is None:  # (a negative control gives another)
        list_uri = peer_uri + " " + native_uri

    def section(worker, phase, kind, token):
        # phase: the one the worker chose its kind in (a section that
        # started before the phase moved on does not count for the next).
        with mu:
            if state["inside"]:
                state["overlaps"] += 1
            state["inside"] += 1  # how many are inside (one, unless they overlap)
            c = state["counter"]
        time.sleep(0.01)
        with mu:
            state["counter"] = c + 1
            state["inside"] -= 1
            state["sections"].append((phase, worker, kind, token))
            state["acked"][worker] = phase

    def run(worker):
        clients = {}
        peer = None
        try:
            while not state["stop"]:
                with mu:
                    phase = state["phase"]
                first = worker < workers // 2
                kind = ROLL_PHASES[phase][0 if first else 1]
                if kind == "peer":
                    if peer is None:
                        peer = Peer(peer_argv)
                    peer.send("acquire")
                    peer.expect("held", 20)
                    section(worker, phase, kind, None)
                    peer.send("release")
                    peer.expect("released", 20)
                    continue
                if peer is not None:  # this worker moved off the peer library
                    peer.close()
                    peer = None
                uri = list_uri if kind == "list" else native_uri
                if kind not in clients:
                    clients[kind] = dlock.open(uri)
                lk = clients[kind].acquire(name, timeout=20)
                try:
                    section(worker, phase, kind, lk.token)
                finally:
                    lk.release()
        except BaseException as e:  # the caller reports it
            with mu:
                state["errors"].append("worker {}: {!r}".format(worker, e))
        finally:
            if peer is not None:
                peer.close()
            for c in clients.values():
                c.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for th in threads:
        th.start()
    phases_done = []
    try:
        for phase in range(1, 6):
            with mu:
                state["phase"] = phase
            time.sleep(phase_s)
            end = time.monotonic() + 25
            while time.monotonic() < end and not state["errors"]:
                with mu:
                    if all(state["acked"].get(w, 0) >= phase for w in range(workers)):
                        phases_done.append(phase)
                        break
                time.sleep(0.05)
            if state["errors"]:
                break
    finally:
        state["stop"] = True
        for th in threads:
            th.join(60)
    state["phases_done"] = phases_done
    return state
