#!/usr/bin/python3
"""TAP test: `dlock bench` reports and pins its placement.

    test_place.py DLOCK_EXE WORKDIR

On a file:// store the placement is "in process". On the test Redis
($DLOCK_REDIS_URI, with the pidfile under $DLOCK_STORES_DIR/redis/pid), a
short run with --client-cpu 0 --store-cpu 0 reports the Redis process as the
server, both on CPU 0, "same CPU"; with 0 and 1 (when the machine has two
CPUs) "different CPUs"; the table has the placement line. The Redis
server's CPUs are put back as they were at the end. Bad CPU lists, and
--store-cpu with a store that has no server here, are usage errors (64).
Without a Redis the Redis cases fail when DLOCK_STORES_REQUIRED=1 (CI) and
are skipped otherwise.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "tests"))
from tap import Tap  # noqa: E402

SHORT = ["--iterations", "20", "--handoffs", "10", "--contenders", "2",
         "--seconds", "0.05", "--waiters", "2"]
BAD_LISTS = ["", "x", "0-", "-1", "1-0", "0,,1", "0,", "4096", "0;1", "0 1"]

tap = Tap()
check = tap.ok


def run(args):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def placement(exe, uri, extra):
    p = run([exe, "bench", "--json"] + SHORT + extra + [uri])
    if p.returncode != 0:
        return None, "status %d\n%s" % (p.returncode, p.stderr)
    return json.loads(p.stdout)["results"][0].get("placement"), p.stderr


def affinity(pid):
    p = run(["taskset", "-pc", str(pid)])
    return p.stdout.strip().rsplit(" ", 1)[-1] if p.returncode == 0 else None


def redis_cases(exe, uri, pidfile):
    pid = int(open(pidfile).read().split()[0])
    before = affinity(pid)
    try:
        pl, err = placement(exe, uri, ["--client-cpu", "0", "--store-cpu", "0"])
        check(pl is not None and pl["summary"] == "same CPU" and
              pl["client_cpus"] == [0] and pl["server_cpus"] == [0],
              "Redis on CPU 0 with the bench: \"same CPU\"", "%r %s" % (pl, err))
        check(pl is not None and pid in pl["server_pids"],
              "the server found is the Redis process of the pidfile (%d)" % pid,
              "%r" % (pl,))
        if os.cpu_count() >= 2:
            pl, err = placement(exe, uri, ["--client-cpu", "0", "--store-cpu", "1"])
            check(pl is not None and pl["summary"] == "different CPUs" and
                  pl["server_cpus"] == [1], "bench on 0, Redis on 1: \"different CPUs\"",
                  "%r %s" % (pl, err))
        else:
            check(True, "one CPU: no \"different CPUs\" run # SKIP one CPU")
        p = run([exe, "bench"] + SHORT + ["--client-cpu", "0", "--store-cpu", "0", uri])
        line = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("placement:")]
        check(p.returncode == 0 and len(line) == 1 and "server pid %d" % pid in line[0]
              and line[0].endswith(": same CPU"),
              "the table has the placement line", p.stdout + p.stderr)
    finally:
        if before:
            run(["taskset", "-apc", before, str(pid)])
    check(affinity(pid) == before, "Redis's CPUs are put back (%s)" % before)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    store = "file://" + os.path.join(work, "locks")

    pl, err = placement(exe, store, [])
    check(pl is not None and pl["summary"] == "in process" and pl["server_pids"] == []
          and len(pl["client_cpus"]) >= 1, "file://: \"in process\"", "%r %s" % (pl, err))
    pl, err = placement(exe, store, ["--client-cpu", "0"])
    check(pl is not None and pl["client_cpus"] == [0], "--client-cpu 0 runs the bench on CPU 0",
          "%r %s" % (pl, err))
    for bad in BAD_LISTS:
        for opt in ("--client-cpu", "--store-cpu"):
            p = run([exe, "bench", opt, bad, store])
            check(p.returncode == 64 and opt in p.stderr,
                  "%s %r: exit 64 naming the option" % (opt, bad),
                  "status %d\n%s" % (p.returncode, p.stderr))
    p = run([exe, "bench", "--store-cpu", "0"] + SHORT + [store])
    check(p.returncode == 64 and "no server process" in p.stderr,
          "--store-cpu with a store that has no server here: exit 64",
          "status %d\n%s" % (p.returncode, p.stderr))

    uri = os.environ.get("DLOCK_REDIS_URI")
    pidfile = os.path.join(os.environ.get("DLOCK_STORES_DIR", ""), "redis", "pid")
    if uri and os.path.exists(pidfile):
        redis_cases(exe, uri, pidfile)
    elif os.environ.get("DLOCK_STORES_REQUIRED") == "1":
        check(False, "a test Redis and its pidfile (DLOCK_STORES_REQUIRED=1)",
              "DLOCK_REDIS_URI=%r, %s" % (uri, pidfile))
    else:
        check(True, "Redis placement # SKIP no DLOCK_REDIS_URI or pidfile")
    tap.plan_now()
    return tap.status()


if __name__ == "__main__":
    sys.exit(main())
