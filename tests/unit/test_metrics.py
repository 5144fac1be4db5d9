#!/usr/bin/env python3
"""The metrics text parses as Prometheus exposition format (with the
Prometheus client library's own parser, Debian's python3-prometheus-client)
and says what tests/unit/metrics_text.c did. TAP output.
Usage: test_metrics.py PATH/TO/metrics_text"""
import os
import subprocess
import sys
import tempfile

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
from tap import Tap  # noqa: E402

tap = Tap()
ok = tap.ok


def run(labels=None):
    with tempfile.TemporaryDirectory(prefix="dlock-metrics.") as d:
        args = [sys.argv[1], d] + ([labels] if labels else [])
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print("# " + r.stderr.strip().replace("\n", "\n# "))
    return r.returncode, r.stdout


rc, text = run()
ok(rc == 0, "metrics_text ran")
try:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    parsed = True
except Exception as e:  # the parser's own complaint
    print("# parse error: %s" % e)
    fams, parsed = {}, False
ok(parsed, "the text parses as Prometheus exposition format")


def value(fam, **labels):
    f = fams.get(fam)
    for s in f.samples if f else []:
        if s.name == fam + "_total" and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def samples(fam, suffix):
    f = fams.get(fam)
    return [s for s in (f.samples if f else []) if s.name == fam + suffix]


ok(fams.get("dlock_acquires") and fams["dlock_acquires"].type == "counter",
   "dlock_acquires_total is a counter")
ok(value("dlock_acquires", result="granted") == 3, "3 acquires granted")
ok(value("dlock_acquires", result="busy") == 1, "1 busy")
ok(value("dlock_acquires", result="timed_out") == 1, "1 timed out")
ok(value("dlock_acquires", result="failed") == 0, "none failed")
ok(value("dlock_releases", result="ok") == 3, "3 released")
ok(value("dlock_renewals", result="ok") == 0,
   "dlock_renew on a store without leases is a check: no renewal counted (%s)"
   % value("dlock_renewals", result="ok"))
for h, count in (("dlock_acquire_seconds", 5), ("dlock_hold_seconds", 3)):
    f = fams.get(h)
    ok(f is not None and f.type == "histogram", "%s is a histogram" % h)
    buckets = samples(h, "_bucket")
    les = [float(s.labels["le"]) for s in buckets]
    vals = [s.value for s in buckets]
    ok(les == sorted(les) and les[-1] == float("inf") and vals == sorted(vals),
       "%s: buckets ascending and cumulative, up to +Inf" % h)
    c = samples(h, "_count")
    ok(c and c[0].value == count and vals and vals[-1] == count,
       "%s: %d observations (+Inf bucket = count)" % (h, count))
    s = samples(h, "_sum")
    ok(s and s[0].value > 0, "%s: a positive sum (%s s)" % (h, s[0].value if s else None))
t = [s.value for s in samples("dlock_acquire_seconds", "_bucket")
     if float(s.labels["le"]) >= 0.016384]
ok(t and t[0] >= 1, "the 20 ms timeout is in a bucket of 16 ms or more")

rc, text = run('service="billing",zone="a\\"b"')
try:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    every = all(s.labels.get("service") == "billing" and s.labels.get("zone") == 'a"b'
                for f in fams.values() for s in f.samples)
except Exception as e:
    print("# parse error: %s" % e)
    every = False
ok(rc == 0 and every and fams, "labels given are on every sample, escapes kept")
rc, text = run('bad label')
ok(rc != 0, "labels that are not name=\"value\" pairs are refused")

tap.plan_now()
sys.exit(tap.status())
