#!/usr/bin/env python3
"""Runs one libFuzzer target for a bounded time and reports it as TAP.

usage: run-fuzz.py TARGET SEED_DIR WORK_DIR [DICTIONARY]

The run starts from the seed corpus (never written to: new inputs go to
WORK_DIR/corpus, which is emptied first), lasts DLOCK_FUZZ_SECONDS seconds
(default DLOCK_FUZZ_DEFAULT_SECONDS, else 30), and fails on anything
libFuzzer stops for: a crash, a sanitizer report, a leak, an input slower
than 10 s, or more than 2 GB of memory. The reproducer lands in
WORK_DIR/artifacts/ (see docs/fuzzing.md to replay it). The figures go in a
TAP comment: executions, executions per second, coverage (edges) and
features, corpus size.
"""
import os
import re
import shutil
import subprocess
import sys
import time


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    target, seeds, work = (os.path.abspath(a) for a in sys.argv[1:4])
    name = os.path.basename(target)
    seconds = int(os.environ.get("DLOCK_FUZZ_SECONDS")
                  or os.environ.get("DLOCK_FUZZ_DEFAULT_SECONDS") or 30)
    shutil.rmtree(work, ignore_errors=True)
    corpus = os.path.join(work, "corpus")
    artifacts = os.path.join(work, "artifacts")
    os.makedirs(corpus)
    os.makedirs(artifacts)
    log_path = os.path.join(work, "fuzz.log")
    cmd = [target, f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
           "-print_final_stats=1", f"-artifact_prefix={artifacts}/"]
    if len(sys.argv) == 5:
        cmd.append(f"-dict={os.path.abspath(sys.argv[4])}")
    cmd += [corpus, seeds]
    print("1..1")
    print("# " + " ".join(cmd), flush=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    elapsed = time.monotonic() - start
    with open(log_path, errors="replace") as log:
        text = log.read()
    stats = dict(re.findall(r"^stat::(\w+):\s*(\d+)", text, re.M))
    cov = re.findall(r"^#\d+\s+\w+\s+cov: (\d+) ft: (\d+)", text, re.M)
    found = sorted(os.listdir(artifacts))
    execs = int(stats.get("number_of_executed_units", 0))
    summary = (f"{name}: {execs} execs in {elapsed:.1f} s "
               f"({stats.get('average_exec_per_sec', '?')}/s), "
               f"cov {cov[-1][0] if cov else '?'} ft {cov[-1][1] if cov else '?'}, "
               f"corpus {len(os.listdir(corpus))} new inputs, "
               f"peak rss {stats.get('peak_rss_mb', '?')} MB")
    if rc == 0 and not found and execs > 0:
        print(f"ok 1 - {name}: no crash, leak or timeout in {seconds} s")
        print("# " + summary)
        return 0
    print(f"not ok 1 - {name}: libFuzzer exit {rc}, artifacts: {found or 'none'}")
    print("# " + summary)
    print(f"# full log: {log_path}")
    # The report: from the sanitizer's or libFuzzer's first line of it.
    lines = text.splitlines()
    first = next((i for i, l in enumerate(lines)
                  if re.search(r"ERROR: |runtime error:|==\d+==|deadly signal|timeout", l)),
                 max(0, len(lines) - 60))
    for l in lines[first:first + 80]:
        print("# " + l)
    for f in found:
        print(f"# reproduce: {target} {os.path.join(artifacts, f)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
