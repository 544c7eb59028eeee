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
    for field, value in record.items():
        values = value if isinstance(value, list) else [value]
        for i, v in enumerate(values):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and field not in ("step", "split"):
                tag = f"{split}/{field}/{i}" if isinstance(value, list) else f"{split}/{field}"
                want.setdefault(tag, {})[step] = v
bad = 0
for tag, points in sorted(want.items()):
    got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
    for step, v in points.items():
        if step not in got or not math.isclose(got[step], v, rel_tol=1e-6, abs_tol=1e-6):
            print(f"MISMATCH {tag} step {step}: metrics {v}, tensorboard {got.get(step)}")
            bad += 1
print(f"{len(tags)} scalar tags in TensorBoard, {sum(len(p) for p in want.values())} points of metrics.jsonl checked, {bad} mismatches")
sys.exit(1 if bad else 0)
