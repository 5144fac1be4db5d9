#!/usr/bin/env python3
"""Negative and positive controls of check_calls.py: tiny objects under
backends/- and core/-like names, built here with the project's C compiler,
on which the checker must catch a back-call between two backend files, a
cycle in core other than client <-> composite <-> keeper, a core file
other than the registry calling a backend, and a backend calling ppoll;
and must pass one-way calls, the registry's edge, the core recursion and
libcurl's own wait.

With --real LIBRARY (and --build DIR, --enforce), it then runs the
checker's two real checks (calls, poll) on the library, their results
numbered on after the controls', so that one test shows both.

usage: controls.py --checker check_calls.py [--cc "CC ARGS"] [--nm NM] [--ar AR]
                   [--real LIBRARY [--build DIR] [--enforce]]
Output is TAP."""
import os
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from tap import Tap  # noqa: E402

# Source file -> its text. Each defines the functions named after it and
# calls the ones it declares. "file@variant" is another version of file
# (the same object name, built in a directory of its own).
FIXTURES = {
    # one way: up -> down -> core base
    "backends/fix_up.c":
        "int fix_down(int);\n"
        "int fix_up(int x) { return fix_down(x) + 1; }\n",
    "backends/fix_down.c":
        "int fix_base(int);\n"
        "int fix_down(int x) { return fix_base(x) * 2; }\n",
    "core/fix_base.c":
        "int fix_base(int x) { return x - 1; }\n",
    # the back-call: fix_down calling back up
    "backends/fix_down.c@back":
        "int fix_base(int);\nint fix_up(int);\n"
        "int fix_down(int x) { return x ? fix_up(x - 1) : fix_base(x); }\n",
    # a poll loop of its own, and libcurl's wait with the core's one
    "backends/fix_loop.c":
        "int ppoll(void *, unsigned long, const void *, const void *);\n"
        "int fix_loop(void *p) { return ppoll(p, 1, 0, 0); }\n",
    "backends/fix_wait.c":
        "int curl_multi_poll(void *, void *, unsigned, int, int *);\n"
        "int dlock_poll_until(int);\n"
        "int fix_wait(void *m) { return curl_multi_poll(m, 0, 0, 10, 0)"
        " + dlock_poll_until(1); }\n",
    "core/poll.c":
        "int dlock_poll_until(int x) { return x; }\n",
    # the registry registers a backend, which calls the registry back
    "core/registry.c":
        "int fix_up(int);\n"
        "int fix_register(int x) { return x ? fix_up(x) : 0; }\n",
    "backends/fix_registered.c":
        "int fix_register(int);\n"
        "int fix_reg(int x) { return fix_register(x); }\n",
    # the core's one allowed recursion
    "core/client.c":
        "int composite_open(int);\nint keeper_add(int);\n"
        "int client_open(int x) { return x ? composite_open(x - 1) + keeper_add(x) : 0; }\n",
    "core/composite.c":
        "int client_open(int);\n"
        "int composite_open(int x) { return client_open(x); }\n",
    "core/keeper.c":
        "int client_open(int);\n"
        "int keeper_add(int x) { return client_open(x - 1); }\n",
    # core edges that are not allowed: uri <-> client, keeper -> a backend
    "core/fix_uri.c":
        "int client_seterr(int);\n"
        "int uri_parse(int x) { return client_seterr(x); }\n",
    "core/client.c@err":
        "int uri_parse(int);\nint composite_open(int);\nint keeper_add(int);\n"
        "int client_seterr(int x) { return x; }\n"
        "int client_open(int x) { return x ? composite_open(x - 1) + keeper_add(x)"
        " + uri_parse(x) : 0; }\n",
    "core/keeper.c@up":
        "int client_open(int);\nint fix_up(int);\n"
        "int keeper_add(int x) { return client_open(x - 1) + fix_up(x); }\n",
}


def main(argv):
    opt = {"--checker": None, "--cc": os.environ.get("CC", "cc"), "--nm": "nm", "--ar": "ar",
           "--real": None, "--build": None}
    enforce = False
    i = 0
    while i < len(argv):
        if argv[i] in opt and i + 1 < len(argv):
            opt[argv[i]] = argv[i + 1]
            i += 2
        elif argv[i] == "--enforce":
            enforce = True
            i += 1
        else:
            sys.exit(__doc__)
    checker, nm = opt["--checker"], opt["--nm"]
    if not checker:
        sys.exit(__doc__)
    tap = Tap()
    with tempfile.TemporaryDirectory(prefix="dlock-layering-") as tmp:
        controls(tap, tmp, checker, opt["--cc"], nm, opt["--ar"])
    if opt["--real"]:
        for check in ("calls", "poll"):
            real(tap, checker, check, nm, opt["--build"], enforce, opt["--real"])
    tap.plan_now()
    return tap.status()


def real(tap, checker, check, nm, build, enforce, lib):
    """The checker's real check on lib, its TAP lines numbered on."""
    args = [sys.executable, checker, "--check", check, "--nm", nm]
    args += ["--build", build] if build else []
    args += ["--enforce"] if enforce else []
    r = subprocess.run(args + [lib], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    print("# ---- the real check: %s" % " ".join(args[1:] + [lib]))
    seen = bad_seen = 0
    for line in r.stdout.splitlines():
        bad = line.startswith("not ok ")
        if bad or line.startswith("ok "):
            rest = line[7 if bad else 3:].lstrip("0123456789")
            tap.n += 1
            tap.failed += bad
            bad_seen += bad
            seen += 1
            print("%sok %d%s" % ("not " if bad else "", tap.n, rest))
        elif not line.startswith("1.."):
            print(line if line.startswith("#") else "# " + line)
    tap.ok(seen > 0 and r.returncode == (1 if bad_seen else 0),
           "the real %s check ran to its end (exit %d, %d results)" % (check, r.returncode, seen))


def controls(tap, tmp, checker, cc, nm, ar):
    objs = {}
    for key, text in sorted(FIXTURES.items()):
        src, _, variant = key.partition("@")
        # meson's object name for src, as the checker reads it
        where = os.path.join(tmp, variant or "base")
        os.makedirs(where, exist_ok=True)
        obj = os.path.join(where, src.replace("/", "_") + ".o")
        path = obj[:-2]
        with open(path, "w") as f:
            f.write(text)
        r = subprocess.run(shlex.split(cc) + ["-c", "-O0", "-o", obj, path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            tap.ok(False, "compile the fixture %s with %s" % (key, cc), r.stdout)
            tap.plan_now()
            return 1
        objs[key] = obj
    tap.ok(True, "compiled %d fixtures with %s" % (len(objs), cc))

    def run(what, srcs, *extra, archive=False):
        paths = [objs[s] for s in srcs]
        if archive:
            lib = os.path.join(tmp, "lib%s.a" % what)
            if os.path.exists(lib):
                os.unlink(lib)
            r = subprocess.run([ar, "rcs", lib] + paths, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            if r.returncode != 0:
                return 99, "ar failed: " + r.stdout.decode(errors="replace")
            paths = [lib]
        # the controls say --enforce themselves, whatever the environment says
        env = {k: v for k, v in os.environ.items() if k != "DLOCK_LAYERING_ENFORCE"}
        r = subprocess.run([sys.executable, checker, "--nm", nm] + list(extra) + paths,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, env=env)
        return r.returncode, r.stdout

    def expect(what, rc, out, want_rc, needles, absent=()):
        missing = [n for n in needles if n not in out]
        present = [n for n in absent if n in out]
        tap.ok(rc == want_rc and not missing and not present,
               "%s: the checker exits %d%s" % (what, want_rc, (
                   " and names what it found" if want_rc else "") if needles else ""),
               "exit %d%s%s\n%s" % (rc, "; missing: " + "; ".join(missing) if missing else "",
                                    "; unexpected: " + "; ".join(present) if present else "", out),
               tail=40)

    one_way = ["backends/fix_up.c", "backends/fix_down.c", "core/fix_base.c", "core/registry.c",
               "backends/fix_registered.c", "core/client.c", "core/composite.c", "core/keeper.c",
               "backends/fix_wait.c", "core/poll.c"]

    # Positive: one-way calls, the registry's edge, the core recursion.
    rc, out = run("positive", one_way, "--check", "calls", "--enforce", archive=True)
    expect("positive fixture (one-way calls, registry edge, client <-> composite <-> keeper), "
           "from an archive", rc, out, 0, ["ok 2 - no call cycle among backends/ files (4 files)",
            "ok 3 - core/: no call cycle but client <-> composite <-> keeper"],
           ["not ok", "# SKIP"])
    rc, out = run("positive-poll", one_way, "--check", "poll", "--enforce",
                  "--expect", "dlock_poll_until=core/poll.c")
    expect("positive fixture, poll check (curl_multi_poll and dlock_poll_until)", rc, out, 0,
           ["ok 2 - core/poll.c defines dlock_poll_until",
            "backends/fix_wait.c: no poll loop of its own"], ["not ok", "# SKIP"])

    # Negative: a back-call between two backend files.
    back = [s if s != "backends/fix_down.c" else "backends/fix_down.c@back" for s in one_way]
    rc, out = run("backcall", back, "--check", "calls", "--enforce", archive=True)
    expect("back-call fix_down.c -> fix_up.c -> fix_down.c, from an archive", rc, out, 1,
           ["not ok 2 - no call cycle among backends/ files",
            "both ways: backends/fix_down.c <-> backends/fix_up.c",
            "cycle: backends/fix_down.c -> backends/fix_up.c -> backends/fix_down.c",
            "backends/fix_down.c -> backends/fix_up.c: fix_up",
            "backends/fix_up.c -> backends/fix_down.c: fix_down"],
           ["not ok 3", "not ok 4", "not ok 5"])
    # Not enforced: the same cycle listed, reported as skipped.
    rc, out = run("backcall-report", back, "--check", "calls")
    expect("back-call, not enforced: listed under a SKIP", rc, out, 0,
           ["# SKIP not enforced yet",
            "cycle: backends/fix_down.c -> backends/fix_up.c -> backends/fix_down.c"],
           ["not ok"])

    # Negative: a poll loop in a backend.
    rc, out = run("loop", one_way + ["backends/fix_loop.c"], "--check", "poll", "--enforce")
    expect("a backend calling ppoll", rc, out, 1,
           ["not ok", "backends/fix_loop.c: no poll loop of its own", "calls ppoll",
            "backends/fix_loop.c calls ppoll"],
           ["fix_wait.c: no poll loop of its own (no poll/select/epoll call): calls"])

    # Negative: a core cycle beside the allowed one (uri <-> client).
    core_cycle = [s for s in one_way if s != "core/client.c"] + ["core/client.c@err",
                                                                 "core/fix_uri.c"]
    rc, out = run("corecycle", core_cycle, "--check", "calls", "--enforce")
    expect("core cycle client.c <-> fix_uri.c beside client <-> composite <-> keeper", rc, out, 1,
           ["not ok 3 - core/: no call cycle but client <-> composite <-> keeper",
            "both ways: core/client.c <-> core/fix_uri.c",
            "core/fix_uri.c -> core/client.c: client_seterr"],
           ["not ok 2", "not ok 4", "not ok 5"])

    # Negative: core calling a backend from elsewhere than the registry.
    up_from_core = [s for s in one_way if s != "core/keeper.c"] + ["core/keeper.c@up"]
    rc, out = run("coreup", up_from_core, "--check", "calls", "--enforce")
    expect("core/keeper.c calling backends/fix_up.c", rc, out, 1,
           ["not ok 4 - core/ calls backends/ only from the registry",
            "core/keeper.c -> backends/fix_up.c: fix_up"])

    # The checker fails when it reads nothing it can use.
    rc, out = run("nobackends", ["core/fix_base.c"], "--check", "calls", "--enforce")
    expect("no backends/ object at all", rc, out, 1, ["not ok 1 - read 1 objects (0 of them"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
