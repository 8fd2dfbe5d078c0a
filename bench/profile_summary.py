#!/usr/bin/env python3
"""Totals a chrome trace from `bench_train_step --profile FILE` by op: self time (time not spent in
ops nested inside), total time and call count, top N by self time. Nesting is read from the
intervals of each thread.
Usage: bench/profile_summary.py TRACE [--top 25] [--steps N (divide counts and times by N)]"""
import argparse
import collections
import json

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--top", type=int, default=25)
ap.add_argument("--steps", type=int, default=1)
a = ap.parse_args()

events = [e for e in json.load(open(a.trace)) if e.get("ph") == "X"]
by_thread = collections.defaultdict(list)
for e in events:
    by_thread[(e.get("pid"), e.get("tid"))].append(e)

self_us = collections.Counter()
total_us = collections.Counter()
calls = collections.Counter()
wall = 0.0
for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []  # [end, name, child_time]
    def pop_until(t):
        while stack and stack[-1][0] <= t:
            end, name, child = stack.pop()
    for e in evs:
        start, dur = e["ts"], e["dur"]
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            stack[-1][2][0] += dur
        else:
            wall += dur
        rec = [start + dur, e["name"], [0.0]]
        stack.append(rec)
        total_us[e["name"]] += dur
        calls[e["name"]] += 1
        e["_child"] = rec[2]
    for e in evs:
        self_us[e["name"]] += e["dur"] - e["_child"][0]

n = a.steps
all_self = sum(self_us.values())
print(f"top-level op time {wall / n / 1e3:.2f} ms per step; {sum(calls.values()) / n:.0f} op calls per step")
print(f"{'op':44s} {'self ms':>8s} {'self %':>7s} {'total ms':>9s} {'calls':>7s}")
for name, s in self_us.most_common(a.top):
    print(f"{name[:44]:44s} {s / n / 1e3:8.3f} {100 * s / all_self:6.1f}% {total_us[name] / n / 1e3:9.3f} {calls[name] / n:7.0f}")
