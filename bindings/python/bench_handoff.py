#!/usr/bin/env python3
"""Handoff latency as a Python user sees it: release in one client to grant
in another, the same ping-pong as `dlock bench` (its "handoff, ping-pong"
row), so the two compare and the difference is the binding's overhead.

    bench_handoff.py URI [N]

Two clients in one process take turns: the holder waits for the other to
be about to acquire, holds 1 ms more (it is queued by then), stamps t0 and
releases; the waiter's acquire returns at t1; t1 - t0 is one sample. Run
twice: with two threads (dlock.Client) and with two tasks on one asyncio
loop (dlock.aio, each client on its worker thread). First, 200
uncontended acquire+release pairs on one client, as `dlock bench
--iterations 200` has them.
"""

import asyncio
import os
import secrets
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlock  # noqa: E402
import dlock.aio  # noqa: E402

HOLD = 0.001
TIMEOUT = 10.0


def percentiles(samples_ns):
    s = sorted(samples_ns)

    def p(q):
        return s[min(len(s) - 1, int(q * len(s)))] / 1000.0

    return len(s), p(0.50), p(0.90), p(0.99), sum(s) / len(s) / 1000.0


def report(what, samples):
    n, p50, p90, p99, mean = percentiles(samples)
    print("{:<30} n={:<6} p50 {:9.1f} us  p90 {:9.1f} us  p99 {:9.1f} us  mean {:9.1f} us"
          .format(what, n, p50, p90, p99, mean), flush=True)


def uncontended(uri, n, name):
    """acquire+release on a free lock, as `dlock bench`'s "acquire+release,
    uncontended" row: the per-call cost of the binding on top of the store."""
    samples = []
    with dlock.open(uri) as c:
        for _ in range(n):
            t0 = time.monotonic_ns()
            c.acquire(name, timeout=TIMEOUT).release()
            samples.append(time.monotonic_ns() - t0)
    return samples


def threads(uri, n, name):
    clients = [dlock.open(uri), dlock.open(uri)]
    cv = threading.Condition()
    state = {"holding": 0, "announced": 0, "t0": 0}
    samples = []
    errors = []

    def wait_for(key, value):
        with cv:
            if not cv.wait_for(lambda: state[key] >= value or errors, TIMEOUT):
                raise RuntimeError("the other thread did not show up ({} {})".format(key, value))
            if errors:
                raise RuntimeError("the other thread failed")

    def bump(key, value):
        with cv:
            state[key] = value
            cv.notify_all()

    def main(me):
        c = clients[me]
        lock = None
        try:
            if me == 0:
                lock = c.acquire(name, timeout=TIMEOUT)
                bump("holding", 1)
            for k in range(n):
                if k % 2 == me:  # hand over
                    wait_for("announced", k + 1)
                    time.sleep(HOLD)
                    state["t0"] = time.monotonic_ns()
                    lock.release()
                    lock = None
                else:  # take
                    wait_for("holding", k + 1)
                    bump("announced", k + 1)
                    lock = c.acquire(name, timeout=TIMEOUT)
                    samples.append(time.monotonic_ns() - state["t0"])
                    bump("holding", k + 2)
            if lock:
                lock.release()
        except BaseException as e:
            with cv:
                errors.append(e)
                cv.notify_all()

    ts = [threading.Thread(target=main, args=(i,)) for i in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    return samples


async def tasks(uri, n, name):
    clients = [await dlock.aio.open(uri), await dlock.aio.open(uri)]
    cond = asyncio.Condition()
    state = {"holding": 0, "announced": 0, "t0": 0}
    samples = []

    async def wait_for(key, value):
        async with cond:
            await asyncio.wait_for(cond.wait_for(lambda: state[key] >= value), TIMEOUT)

    async def bump(key, value):
        async with cond:
            state[key] = value
            cond.notify_all()

    async def main(me):
        c = clients[me]
        lock = None
        if me == 0:
            lock = await c.acquire(name, timeout=TIMEOUT)
            await bump("holding", 1)
        for k in range(n):
            if k % 2 == me:
                await wait_for("announced", k + 1)
                await asyncio.sleep(HOLD)
                state["t0"] = time.monotonic_ns()
                await lock.release()
                lock = None
            else:
                await wait_for("holding", k + 1)
                await bump("announced", k + 1)
                lock = await c.acquire(name, timeout=TIMEOUT)
                samples.append(time.monotonic_ns() - state["t0"])
                await bump("holding", k + 2)
        if lock:
            await lock.release()

    try:
        await asyncio.gather(main(0), main(1))
    finally:
        for c in clients:
            await c.close()
    return samples


def main():
    if len(sys.argv) < 2:
        print("usage: bench_handoff.py URI [N]", file=sys.stderr)
        return 2
    uri = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    print("dlock {} (libdlock {}), Python {}, {} handoffs on {}".format(
        dlock.__version__, dlock.library_version, sys.version.split()[0], n, uri.split("://")[0]))
    base = "bench-py-{}-{}".format(os.getpid(), secrets.token_hex(3))
    report("acquire+release, uncontended", uncontended(uri, 200, base + "-u"))
    report("handoff, threads", threads(uri, n, base + "-t"))
    report("handoff, asyncio", asyncio.run(tasks(uri, n, base + "-a")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
