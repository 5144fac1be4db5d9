#!/usr/bin/python3
"""Draws the JSON record of `dlock bench --json` as one chart.

    dlock bench --json URI... | python3 bench/plot.py -o chart.svg
    python3 bench/plot.py run.json -o chart.png
    dlock bench --chart chart.svg URI...        (runs this script itself)

One figure, the stores side by side in every panel:
  top     latency percentiles (p50, p90, p99, max) of the store round trip,
          the uncontended acquire+release and the ping-pong handoff
  bottom  handoff latency (p50 and p99) against the number of waiters
          queued on the lock, and throughput (acquisitions per second)
The caption names the machine (CPU model, CPU count, kernel), dlock's
version, each store's URI and server version, and the command line.
SVG (text kept as text) or PNG, by the output's extension. Needs only
matplotlib (Debian: python3-matplotlib); no network.
"""
import argparse
import json
import os
import sys
import textwrap

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

PERCENTILES = ["p50", "p90", "p99", "max"]
PCT_COLORS = {"p50": "#9ecae1", "p90": "#4292c6", "p99": "#08519c", "max": "#08306b"}
OPERATIONS = [
    ("ping_us", "store round trip (ping)"),
    ("uncontended_us", "acquire + release, uncontended"),
    ("handoff_pingpong_us", "handoff, ping-pong (1 waiter)"),
]
# Colours of the stores in the handoff panel (matplotlib's tab10).
STORE_COLORS = plt.get_cmap("tab10").colors


def fail(msg):
    print("plot.py: " + msg, file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        if path == "-":
            data = json.load(sys.stdin)
        else:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
    except (OSError, ValueError) as e:
        fail("cannot read the bench JSON from %s: %s" % (path, e))
    if not isinstance(data, dict) or data.get("tool") != "dlock bench" \
            or not data.get("results"):
        fail("%s is not the output of `dlock bench --json`" % path)
    return data


def hosts_of(uri):
    rest = uri.split("://", 1)[-1]
    auth = rest.split("/", 1)[0].split("?", 1)[0]
    return auth.rsplit("@", 1)[-1].split(",")


def short_labels(results):
    """One short, distinct name per URI: its backend, the number of hosts
    when more than one (Redlock, an ensemble) and its query string."""
    labels = []
    for r in results:
        uri, backend = r["uri"], r.get("backend", "?")
        n = len(hosts_of(uri))
        label = backend
        if n > 1:
            label = ("redlock" if backend == "redis" else backend) + " (%d hosts)" % n
        if "?" in uri:
            label += " ?" + uri.split("?", 1)[1]
        labels.append(label)
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            labels[i] = "%s #%d" % (label, i + 1)
    return labels


def us_format(v, _pos=None):
    """Microseconds for a log axis: 10, 100, 1k, 10k... (µs)."""
    if v <= 0:
        return "0"
    if v >= 1000:
        s = "%gk" % (v / 1000)
    else:
        s = "%g" % v
    return s


def count_format(v, _pos=None):
    if v >= 1e6:
        return "%gM" % (v / 1e6)
    if v >= 1e3:
        return "%gk" % (v / 1e3)
    return "%g" % v


def log_axis(ax, fmt, axis="y"):
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(LogLocator(base=10))
    a.set_major_formatter(FuncFormatter(fmt))
    a.set_minor_formatter(NullFormatter())


def decades(values):
    """Log-axis limits on whole decades around values, so that every bar
    starts from the same floor and the smallest is still visible."""
    vals = [v for v in values if v and v > 0] or [1]
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals) * 1.01))
    return lo, hi


def latency_values(results, pcts):
    return [(r.get(k) or {}).get(p) for r in results for k, _ in OPERATIONS
            for p in pcts]


def latency_panel(ax, key, title, results, labels, pcts, ylim):
    x = range(len(results))
    width = 0.8 / len(pcts)
    for j, p in enumerate(pcts):
        xs, ys = [], []
        for i, r in enumerate(results):
            s = r.get(key)
            if s and s.get("n") and s.get(p) is not None:
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(max(s[p], 0.1))
        ax.bar(xs, ys, width, color=PCT_COLORS[p], label=p, zorder=2)
    for i, r in enumerate(results):
        if not r.get(key):
            ax.text(i, 0.5, "n/a\n(no ping)", transform=ax.get_xaxis_transform(),
                    ha="center", va="center", fontsize=8, color="0.4")
    ax.set_title(title, fontsize=10)
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.set_xlim(-0.5, len(results) - 0.5)
    log_axis(ax, us_format)
    ax.set_ylabel("latency (µs, log scale)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("store")
    ax.grid(axis="y", which="major", color="0.88", zorder=0)


def handoff_panel(ax, results, labels):
    all_w = set()
    for i, r in enumerate(results):
        color = STORE_COLORS[i % len(STORE_COLORS)]
        pts = []
        pp = r.get("handoff_pingpong_us")
        if pp and pp.get("n"):
            pts.append((1, pp, 0))
        for w in r.get("handoff_waiters") or []:
            if w["handoff_us"].get("n"):
                pts.append((w["waiters"], w["handoff_us"], w.get("timeouts", 0)))
        if not pts:
            continue
        xs = [p[0] for p in pts]
        all_w.update(xs)
        ax.plot(xs, [max(p[1]["p50"], 0.1) for p in pts], "-o", color=color,
                ms=4, lw=1.6, zorder=3)
        ax.plot(xs, [max(p[1]["p99"], 0.1) for p in pts], "--", color=color,
                lw=0.9, alpha=0.5, zorder=2)
        for x, s, timeouts in pts:
            if timeouts:  # waits that gave up: the figure is a lower bound
                ax.plot([x], [s["p50"]], "x", color="black", ms=7, zorder=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_axis(ax, us_format)
    ax.set_xticks(sorted(all_w))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: "%d" % v))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("waiters queued on one lock (count, log scale; 1 = ping-pong)")
    ax.set_ylabel("handoff latency (µs, log scale)")
    ax.set_title("handoff: release → next holder, against waiters", fontsize=10)
    ax.grid(which="major", color="0.88", zorder=0)
    handles = [Line2D([], [], color=STORE_COLORS[i % len(STORE_COLORS)], lw=2,
                      label=labels[i]) for i in range(len(results))]
    handles += [Line2D([], [], color="0.3", ls="-", marker="o", ms=4, label="p50"),
                Line2D([], [], color="0.3", ls="--", label="p99")]
    if any(w.get("timeouts") for r in results for w in r.get("handoff_waiters") or []):
        handles.append(Line2D([], [], color="black", ls="", marker="x",
                              label="some waits timed out"))
    ax.legend(handles=handles, fontsize=7, loc="best", ncol=2, framealpha=0.9)


def throughput_panel(ax, results, labels, opts):
    x = range(len(results))
    series = [("one_name", "all on one name", "#e6550d"),
              ("own_names", "each on its own name", "#fdae6b")]
    for j, (key, what, color) in enumerate(series):
        xs = [i - 0.2 + 0.4 * j for i in x]
        ys = [max(r["throughput"][key]["per_second"], 0.1) for r in results]
        bars = ax.bar(xs, ys, 0.4, color=color, label=what, zorder=2)
        for b, v in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, v * 1.08, count_format(float("%.3g" % v)),
                    ha="center", va="bottom", fontsize=6.5, rotation=90)
    ax.set_yscale("log")
    log_axis(ax, count_format)
    lo, hi = decades([r["throughput"][k]["per_second"] for r in results
                      for k in ("one_name", "own_names")])
    ax.set_ylim(lo, hi * 3)  # room for the value labels
    ax.set_xlim(-0.5, len(results) - 0.5)
    ax.set_ylabel("acquisitions per second (log scale)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("store")
    ax.set_title("throughput, %s contenders for %gs" % (opts.get("contenders", "?"),
                                                        opts.get("seconds", 0)),
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", which="major", color="0.88", zorder=0)


def command_line(data):
    o = data.get("options", {})
    parts = ["dlock bench"]
    for k in ("iterations", "handoffs", "contenders", "seconds", "wait"):
        if k in o:
            parts.append("--%s %s" % (k, o[k]))
    if o.get("waiters"):
        parts.append("--waiters " + ",".join(str(w) for w in o["waiters"]))
    parts += [r["uri"] for r in data["results"]]
    return " ".join(parts)


def caption(data, labels):
    m = data.get("machine", {})
    uname = m.get("uname", "unknown").split()
    kernel = m.get("kernel") or (uname[1] if len(uname) > 1 else "unknown")
    osname = uname[0] if uname else "unknown"
    arch = uname[2] if len(uname) > 2 else ""
    lines = ["Machine: %s, %s CPUs, %s %s %s; libdlock %s." % (
        m.get("cpu_model", "CPU model unknown"), m.get("nproc", "?"), osname,
        kernel, arch, m.get("dlock_version", "?"))]
    stores = []
    for label, r in zip(labels, data["results"]):
        v = r.get("store_version", "unknown")
        if v is None or r.get("backend") == "file":
            v = "local lock files, no server" if r.get("backend") == "file" else "unknown"
        stores.append("%s: %s" % (label, v))
    lines += textwrap.wrap("Stores (server versions as they report them): " +
                           "; ".join(stores) + ".", 200)
    lines += textwrap.wrap("Command: " + command_line(data), 200,
                           subsequent_indent="    ", break_on_hyphens=False,
                           break_long_words=False)
    lines.append("Latencies are microseconds (one sample: one operation); "
                 "handoff = release to the next holder's acquire returning. "
                 "Bars and lines are per store, same run, same machine.")
    return "\n".join(lines)


def draw(data, out, title):
    results = data["results"]
    labels = short_labels(results)
    pcts = [p for p in PERCENTILES
            if any((r.get(k) or {}).get(p) is not None
                   for r in results for k, _ in OPERATIONS)]
    cap = caption(data, labels)
    cap_lines = cap.count("\n") + 1
    width = min(20.0, max(15.0, 11.0 + 0.8 * len(results)))
    height = 9.5 + 0.17 * cap_lines
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "dlock-bench",
                         "font.size": 9})
    fig = plt.figure(figsize=(width, height))
    bottom = (0.3 + 0.17 * cap_lines) / height
    gs = fig.add_gridspec(2, 6, left=0.055, right=0.985, top=1 - 1.25 / height,
                          bottom=bottom + 0.9 / height, hspace=0.45, wspace=0.9)
    ylim = decades(latency_values(results, pcts))
    for n, (key, name) in enumerate(OPERATIONS):
        ax = fig.add_subplot(gs[0, 2 * n:2 * n + 2])
        latency_panel(ax, key, name, results, labels, pcts, ylim)
    handles = [matplotlib.patches.Patch(color=PCT_COLORS[p], label=p) for p in pcts]
    fig.legend(handles=handles, loc="upper center", ncol=len(pcts), fontsize=8,
               bbox_to_anchor=(0.5, 1 - 0.42 / height), frameon=False,
               title="latency percentiles (one bar each, per store)",
               title_fontsize=8)
    handoff_panel(fig.add_subplot(gs[1, 0:3]), results, labels)
    throughput_panel(fig.add_subplot(gs[1, 3:6]), results, labels,
                     data.get("options", {}))
    fig.suptitle(title, fontsize=13, fontweight="bold")
    fig.text(0.01, 0.25 / height, cap, fontsize=7.5, va="bottom", ha="left",
             family="DejaVu Sans", linespacing=1.45)
    ext = os.path.splitext(out)[1].lower()
    fmt = "png" if ext == ".png" else "svg"
    fig.savefig(out, format=fmt, dpi=110 if fmt == "png" else None,
                metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default="-",
                    help="the output of dlock bench --json (default: stdin)")
    ap.add_argument("-o", "--output", required=True,
                    help="the chart to write: .svg (default) or .png")
    ap.add_argument("--title", default="dlock bench: lock latency, handoff and "
                    "throughput per store")
    a = ap.parse_args()
    data = load(a.json)
    tmp = a.output + ".tmp" + os.path.splitext(a.output)[1]
    try:
        draw(data, tmp, a.title)
        os.replace(tmp, a.output)
    except (OSError, ValueError, KeyError, TypeError) as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail("cannot draw %s: %s: %s" % (a.output, type(e).__name__, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
