#!/usr/bin/env python3
"""Sums the Chrome traces of `lethe bench --trace` per operation.

    scripts/trace-summary.py TRACE [TRACE2] [--steps N] [--top K]

For each trace: the self time of every libtorch operation (its time less that of the
operations it called), and the time of every autograd node of the backward pass (with
what it called), in ms per step (`--steps`, the bench's --bench-steps; default 1: the
whole trace). With two traces, side by side with their difference, largest first, so
that two mechanisms or two builds can be compared operation by operation.

Only the Python standard library; the trace is libtorch's legacy profiler's JSON, a
list of complete events ("ph": "X") with a name, a start "ts" and a "dur" in
microseconds, nested by time on each thread.
"""

import argparse
import collections
import json
import signal
import sys

BACKWARD = "autograd::engine::evaluate_function: "


def load(path):
    try:
        with open(path) as f:
            events = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{path}: not a readable trace: {e}")
    if not isinstance(events, list):
        sys.exit(f"{path}: not a trace (expected a list of events)")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    number = (int, float)
    for i, e in enumerate(complete):
        if not (isinstance(e.get("name"), str) and isinstance(e.get("ts"), number) and isinstance(e.get("dur"), number)):
            sys.exit(f"{path}: complete event {i} needs a name, a numeric ts and a numeric dur: {json.dumps(e)[:200]}")
    return complete


def self_times(events):
    """Self time (us) and calls per operation name: nesting by time on each thread."""
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[e.get("tid")].append(e)
    total, calls = collections.Counter(), collections.Counter()
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_events = []
        for e in thread:
            while open_events and open_events[-1]["ts"] + open_events[-1]["dur"] <= e["ts"]:
                open_events.pop()
            if open_events:
                total[open_events[-1]["name"]] -= e["dur"]
            total[e["name"]] += e["dur"]
            calls[e["name"]] += 1
            open_events.append(e)
    return total, calls


def backward_nodes(events):
    """Time (us, with what it called) and calls per autograd node."""
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e["name"].startswith(BACKWARD):
            node = e["name"][len(BACKWARD):]
            total[node] += e["dur"]
            calls[node] += 1
    return total, calls


def table(title, summaries, steps, top):
    print(f"\n{title} (ms per step; calls per step)")
    names = set().union(*(s[0] for s in summaries))
    if len(summaries) == 2:
        (a, ca), (b, cb) = summaries
        key = lambda n: -abs(b[n] - a[n])
        print(f"{'difference':>10} {'first':>16} {'second':>16}  name")
    else:
        (a, ca), = summaries
        key = lambda n: -a[n]
        print(f"{'ms':>10} {'calls':>8}  name")
    for name in sorted(names, key=key)[:top]:
        if len(summaries) == 2:
            print(f"{(b[name] - a[name]) / 1e3 / steps:+10.3f} {a[name] / 1e3 / steps:9.3f} ({ca[name] / steps:4.0f}) "
                  f"{b[name] / 1e3 / steps:9.3f} ({cb[name] / steps:4.0f})  {name}")
        else:
            print(f"{a[name] / 1e3 / steps:10.3f} {ca[name] / steps:8.1f}  {name}")
    totals = "  ".join(f"{sum(s[0].values()) / 1e3 / steps:.3f}" for s in summaries)
    print(f"total: {totals}")


def main():
    # Piped into `head`: stop quietly when the reader has enough.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="one trace, or two to compare")
    parser.add_argument("--steps", type=int, default=1, help="the profiled steps in each trace (bench's --bench-steps)")
    parser.add_argument("--top", type=int, default=30, help="rows per table")
    args = parser.parse_args()
    if len(args.traces) > 2:
        parser.error("one trace, or two to compare")
    if args.steps < 1 or args.top < 1:
        parser.error("--steps and --top must be at least 1")
    events = [load(p) for p in args.traces]
    print("traces: " + "  |  ".join(args.traces))
    table("self time per operation", [self_times(e) for e in events], args.steps, args.top)
    table("backward pass, per autograd node", [backward_nodes(e) for e in events], args.steps, args.top)


if __name__ == "__main__":
    main()
