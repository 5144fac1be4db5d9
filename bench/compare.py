#!/usr/bin/env python3
"""Before/after: two dlock builds, the same stores, alternating rounds.

    bench/compare.py --before OLD/dlock --after NEW/dlock [--rounds 3]
        [--client-cpu 0] [--store-cpu 1] [--stores-dir DIR] URI...

Each round runs `dlock bench --json` once with each binary (before, then
after, then the next round), the bench on --client-cpu and every store
process found under --stores-dir (pidfiles) moved to --store-cpu, so that
placement does not differ between runs. Prints, per URI, the median over
the rounds of the uncontended and ping-pong handoff p50 for each binary and
the change, as a Markdown table; then, where both binaries measured them
(stores with shared locks or semaphores), the shared acquire+release and the
semaphore handoff. Exit 1 when a run fails or a change exceeds --limit
percent (default 10) in the slower direction."""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys


def pin_stores(stores_dir, cpu):
    pinned = 0
    for pidfile in glob.glob(os.path.join(stores_dir, '*', 'pid')):
        try:
            pid = int(open(pidfile).read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        # -a: every thread of the process (a JVM's, etcd's goroutines).
        if subprocess.run(['taskset', '-a', '-p', '-c', str(cpu), str(pid)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            pinned += 1
    return pinned


def shown(uri):
    """uri with its passwords (userinfo, *_password=) masked."""
    shown = re.sub(r'(//[^/@:]*:)[^@/]*@', r'\1***@', uri)
    return re.sub(r'(password=)[^&]*', r'\1***', shown)


# What each row compares: the JSON's p50 of each.
KEYS = ('uncontended_us', 'handoff_pingpong_us', 'shared_uncontended_us',
        'semaphore_handoff_pingpong_us')
TITLES = ('uncontended', 'handoff', 'shared uncontended', 'semaphore handoff')


def run(binary, uri, cpu, extra):
    cmd = ['taskset', '-c', str(cpu), binary, 'bench', '--json'] + extra + [uri]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError('%s: exit %d: %s' % (' '.join(cmd), out.returncode, out.stderr.strip()))
    r = json.loads(out.stdout)['results'][0]
    if r.get('placement'):  # binaries that report it (issue 30 on)
        print('%s: %s: placement %s' % (os.path.basename(os.path.dirname(os.path.dirname(binary)))
                                        or binary, shown(uri), json.dumps(r['placement'])),
              file=sys.stderr)
    # None where this binary or the store has no such measurement.
    return tuple((r.get(k) or {}).get('p50') for k in KEYS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--before', required=True)
    ap.add_argument('--after', required=True)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--client-cpu', type=int, default=0)
    ap.add_argument('--store-cpu', type=int, default=1)
    ap.add_argument('--stores-dir', default=os.environ.get('DLOCK_STORES_DIR', '/tmp/dlock-stores'))
    ap.add_argument('--limit', type=float, default=10.0)
    ap.add_argument('--bench-args', default='--iterations 1000 --handoffs 300 --waiters 2 '
                    '--contenders 2 --seconds 1')
    ap.add_argument('uris', nargs='+')
    a = ap.parse_args()
    print('stores pinned to CPU %d: %d processes' % (a.store_cpu, pin_stores(a.stores_dir, a.store_cpu)),
          file=sys.stderr)
    extra = a.bench_args.split()
    bad = 0
    print('| store | ' + ' | '.join('%s p50 before / after (µs) | change' % t for t in TITLES) + ' |')
    print('|---|' + '---|---|' * len(TITLES))
    for uri in a.uris:
        got = {'before': [], 'after': []}
        for _ in range(a.rounds):
            for which in ('before', 'after'):
                got[which].append(run(getattr(a, which), uri, a.client_cpu, extra))
        cells = []
        for i in range(len(KEYS)):
            vals = {w: [x[i] for x in got[w]] for w in got}
            if any(v is None for w in vals for v in vals[w]):
                cells.append('n/a | n/a')
                continue
            b, f = (statistics.median(vals[w]) for w in ('before', 'after'))
            ch = (f - b) / b * 100 if b else 0.0
            bad += ch > a.limit
            cells.append('%.1f / %.1f | %+.1f %%' % (b, f, ch))
        print('| `%s` | %s |' % (shown(uri), ' | '.join(cells)))
        sys.stdout.flush()
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
