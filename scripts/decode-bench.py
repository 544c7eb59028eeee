#!/usr/bin/env python3
"""Decoding on this CPU, lethe against Hugging Face `transformers`, side by side.

Makes a model of SmolLM2-135M's shape with random weights (seeded, float32, saved by
`transformers` into FOLDER if it is not there), then for each context length, in turns:
`transformers` reading a prompt of that many random ids and greedily generating
--decode tokens with its full cache (`generate`, as a new user would), and `lethe bench
--init-from FOLDER` doing the same with the full cache; then lethe under each --kv policy
(e.g. h2o@1024) at each --budget-contexts length. Each measurement runs in a process of
its own, so that its peak resident memory is its own. Prints one table and writes it as
JSON to OUT. `--precision bf16` runs both tools in bfloat16 (`transformers` with
`dtype=torch.bfloat16`, lethe with `--precision bf16`).

    .venv/bin/python scripts/decode-bench.py --folder /tmp/smollm2-135m-random \\
        --contexts 1024,4096,16384 --kv window@1024 --budget-contexts 1024,65536 --out results.json
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=65536 + 1024,
             rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)


def make_folder(folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if (folder / "config.json").is_file():
        return
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model.save_pretrained(folder)
    print(f"made {folder}", file=sys.stderr)


DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def transformers_run(folder, context, decode, precision):
    """In a child process: prefill and decode times and the peak RSS of `generate`."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, DTYPES[precision])).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, context))
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=decode + 1, min_new_tokens=decode + 1, do_sample=False)
        both = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(tool="transformers", policy="full", precision=precision, context=context, prefill_tok_s=context / prefill,
                decode_tok_s=decode / max(both - prefill, 1e-9), peak_rss_bytes=rss)


def lethe_run(folder, context, decode, kv, precision):
    out = Path("/tmp/lethe-decode-bench")
    cmd = [str(ROOT / "target/release/lethe"), "bench", "--init-from", str(folder), "--contexts", str(context),
           "--decode-tokens", str(decode), "--kv", kv, "--precision", precision, "--out", str(out), "--name", "one"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "one" / "bench.json").read_text())
    r = report["results"][0]
    return dict(tool="lethe", policy=kv, precision=precision, context=context, prefill_tok_s=r["prefill_tok_s"],
                decode_tok_s=r["decode_tok_s"], peak_rss_bytes=r["peak_rss_bytes"],
                read_bytes_per_token=r["read_bytes_per_token"], bandwidth_share=r["bandwidth_share"],
                read_rate_bytes_s=r["read_rate_bytes_s"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--folder", type=Path, required=True)
    p.add_argument("--contexts", default="1024,4096,16384")
    p.add_argument("--kv", action="append", default=[])
    p.add_argument("--budget-contexts", default="1024,65536")
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--precision", choices=sorted(DTYPES), default="f32")
    p.add_argument("--out", type=Path)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(transformers_run(a.folder, int(a.child[0]), int(a.child[1]), a.precision)))
        return
    make_folder(a.folder)
    rows = []

    def show(r):
        rows.append(r)
        share = f"{100 * r['bandwidth_share']:.0f}% of the read rate" if "bandwidth_share" in r else ""
        print(f"{r['tool']:<12} {r['policy']:<14} {r['precision']:<4} context {r['context']:>6} | prefill {r['prefill_tok_s']:8.1f} tok/s"
              f" | decode {r['decode_tok_s']:6.2f} tok/s {share} | peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB",
              flush=True)

    for context in map(int, a.contexts.split(",")):
        child = subprocess.run([sys.executable, __file__, "--folder", str(a.folder), "--precision", a.precision,
                                "--child", str(context), str(a.decode)],
                               check=True, capture_output=True, text=True, env=os.environ)
        theirs = json.loads(child.stdout.strip().splitlines()[-1])
        ours = lethe_run(a.folder, context, a.decode, "full", a.precision)
        # The same model and cache: a token reads the same bytes; the rate lethe measured.
        theirs["read_bytes_per_token"] = ours["read_bytes_per_token"]
        theirs["bandwidth_share"] = ours["read_bytes_per_token"] * theirs["decode_tok_s"] / ours["read_rate_bytes_s"]
        show(theirs)
        show(ours)
    for kv in a.kv:
        for context in map(int, a.budget_contexts.split(",")):
            show(lethe_run(a.folder, context, a.decode, kv, a.precision))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
