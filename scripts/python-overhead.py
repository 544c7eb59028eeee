#!/usr/bin/env python3
"""A training step of one model through Python and through the command line, in turns.

The model is a preset's (default enwik8-tiny: 2 layers x 128, span 256, blocks of 64,
16 streams), made by `lethe train --steps 1`. Each round times STEPS training steps of
`lethe.load(run)` in a plain PyTorch loop (forward with the memory carried, cross
entropy plus the auxiliary loss, backward, gradient clipping at the config's
`train.grad_clip`, torch.optim.Adam), then STEPS steps of `lethe bench` on the same preset
(forward, backward, clip, lethe's Adam), both on random tokens with the memory already
full. Prints the median step of each side over the rounds, and their ratio.

    . scripts/env.sh && scripts/python-test.sh -k nothing   # builds and installs lethe
    python scripts/python-overhead.py [--preset enwik8-tiny] [--rounds 5] [--steps 20] [--out DIR]
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import lethe

REPO = pathlib.Path(__file__).resolve().parents[1]


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="enwik8-tiny")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps a round and side")
    p.add_argument("--lethe", default=str(REPO / "target" / "release" / "lethe"), help="the lethe binary")
    p.add_argument("--out", help="a folder for overhead.json (default: none written)")
    a = p.parse_args()
    if a.rounds < 1 or a.steps < 1:
        p.error("--rounds and --steps must be at least 1")
    if not pathlib.Path(a.lethe).is_file():
        p.error(f"--lethe {a.lethe}: no such binary (cargo build --release)")
    return a


def lethe_cli(binary, *args, cwd):
    done = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"lethe {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def python_steps(model, steps, clip, generator):
    """Median seconds of `steps` training steps of `model`, after as many to fill its memory."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = model.config["train"]["batch"]
    state, times = None, []
    for i in range(2 * steps):
        tokens = torch.randint(0, model.vocab, (batch, model.block + 1), generator=generator)
        start = time.perf_counter()
        logits, state = model(tokens[:, :-1], state)
        loss = nn.functional.cross_entropy(logits.reshape(-1, model.vocab), tokens[:, 1:].reshape(-1)) + model.aux_loss
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if i >= steps:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli_steps(binary, preset, steps, folder, round_):
    out = folder / f"bench-{round_}"
    lethe_cli(binary, "bench", "-p", preset, "--rounds", "1", "--bench-steps", str(steps),
              "--out", str(out), cwd=folder)
    (result,) = json.loads(next(out.rglob("bench.json")).read_text())["results"]
    return result["median_s"]


def main():
    a = arguments()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        data = folder / "text.txt"
        data.write_bytes(bytes(torch.randint(32, 127, (200_000,), generator=torch.Generator().manual_seed(0)).tolist()))
        lethe_cli(a.lethe, "train", "-p", a.preset, "--data", str(data), "--steps", "1", "--out", str(folder),
                  "--name", "run", "-q", "--no-eval", cwd=folder)
        model = lethe.load(folder / "run").train()
        clip = model.config["train"]["grad_clip"]
        g = torch.Generator().manual_seed(1)
        rows = []
        for r in range(a.rounds):
            py = python_steps(model, a.steps, clip, g)
            cli = cli_steps(a.lethe, a.preset, a.steps, folder, r)
            rows.append({"round": r, "python_s": py, "cli_s": cli})
            print(f"round {r + 1}/{a.rounds}: python {py * 1e3:.1f} ms, lethe bench {cli * 1e3:.1f} ms, ratio {py / cli:.3f}",
                  flush=True)
    py = statistics.median(r["python_s"] for r in rows)
    cli = statistics.median(r["cli_s"] for r in rows)
    print(f"{a.preset}: a training step {py * 1e3:.1f} ms through Python, {cli * 1e3:.1f} ms through lethe bench: "
          f"{py / cli:.3f}x (median of {a.rounds} rounds of {a.steps} steps)")
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        summary = {"preset": a.preset, "steps": a.steps, "rounds": rows, "python_s": py, "cli_s": cli, "ratio": py / cli,
                   "threads": torch.get_num_threads(), "torch": torch.__version__}
        (out / "overhead.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
