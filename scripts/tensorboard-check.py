#!/usr/bin/env python3
"""Reads a lethe run folder's TensorBoard event files with TensorBoard's own reader
(tensorboard.backend.event_processing.EventAccumulator) and checks every scalar against
metrics.jsonl: same steps, same values (to float32), for every numeric field.

    pip install tensorboard && python3 scripts/tensorboard-check.py runs/NAME
"""
import json
import math
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run = Path(sys.argv[1])
acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
want = {}
for line in (run / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    step, split = record.get("step"), record.get("split")
    if step is None or split is None:
        continue
    def numbers(tag, v, depth):
        # As lethe tags them: lists by index and objects by key, two levels down.
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            want.setdefault(tag, {})[step] = v
        elif isinstance(v, list) and depth > 0:
            for i, item in enumerate(v):
                numbers(f"{tag}/{i}", item, depth - 1)
        elif isinstance(v, dict) and depth > 0:
            for key, item in v.items():
                numbers(f"{tag}/{key}", item, depth - 1)
    for field, value in record.items():
        if field not in ("step", "split"):
            numbers(f"{split}/{field}", value, 2)
bad = 0
for tag, points in sorted(want.items()):
    got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
    for step, v in points.items():
        if step not in got or not math.isclose(got[step], v, rel_tol=1e-6, abs_tol=1e-6):
            print(f"MISMATCH {tag} step {step}: metrics {v}, tensorboard {got.get(step)}")
            bad += 1
for tag in acc.Tags()["histograms"]:
    h = acc.Histograms(tag)[-1].histogram_value
    if abs(sum(h.bucket) - h.num) > 1e-6 * max(1.0, h.num) or len(h.bucket) != len(h.bucket_limit):
        print(f"MISMATCH histogram {tag}: {sum(h.bucket)} counted, num {h.num}")
        bad += 1
print(f"histograms: {', '.join(acc.Tags()['histograms']) or 'none'}")
print(f"{len(tags)} scalar tags in TensorBoard, {sum(len(p) for p in want.values())} points of metrics.jsonl checked, {bad} mismatches")
sys.exit(1 if bad else 0)
