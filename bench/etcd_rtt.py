#!/usr/bin/env python3
"""An etcd member's round trips through its JSON gateway, for the ratios in
docs/benchmarks.md: a put (one raft write) and a range read, each over one
kept-alive HTTP/1.1 connection, as dlock's calls go.

    bench/etcd_rtt.py [--count 300] [--cpu N] etcd://[user:password@]host:port[/prefix]

Prints the p50 and p90 of each in microseconds. The put writes one key,
<prefix>/!rtt, again and again (deleted at the end)."""
import argparse
import base64
import http.client
import json
import os
import statistics
import time
import urllib.parse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--count', type=int, default=300)
    ap.add_argument('--cpu', type=int, default=None, help='pin this process to a CPU')
    ap.add_argument('uri')
    a = ap.parse_args()
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    u = urllib.parse.urlsplit(a.uri)
    host = u.netloc.rsplit('@', 1)[-1].split(',')[0]
    hostname, _, port = host.partition(':')
    conn = http.client.HTTPConnection(hostname, int(port or 2379))
    headers = {'Content-Type': 'application/json'}

    def call(path, body):
        conn.request('POST', path, json.dumps(body), headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit('%s: %d %s' % (path, r.status, data[:200]))
        return json.loads(data)

    if u.username:
        tok = call('/v3/auth/authenticate', {'name': urllib.parse.unquote(u.username),
                                             'password': urllib.parse.unquote(u.password or '')})
        headers['Authorization'] = tok['token']
    key = base64.b64encode(((u.path or '/dlock').rstrip('/') + '/!rtt').encode()).decode()
    val = base64.b64encode(b'x').decode()
    for what, path, body in (('put', '/v3/kv/put', {'key': key, 'value': val}),
                             ('range', '/v3/kv/range', {'key': key})):
        times = []
        for _ in range(a.count):
            t = time.perf_counter()
            call(path, body)
            times.append((time.perf_counter() - t) * 1e6)
        times.sort()
        print('%-5s p50 %6.0f us  p90 %6.0f us  (%d calls)'
              % (what, statistics.median(times), times[int(len(times) * 0.9)], a.count))
    call('/v3/kv/deleterange', {'key': key})


if __name__ == '__main__':
    main()
