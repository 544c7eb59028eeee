#!/usr/bin/env python3
"""Adds to tests/fixtures/llama/<family>/ the logits Hugging Face `transformers` computes
for the fixture's ids with the model read in bfloat16 and in float16
(expected-bf16.safetensors, expected-f16.safetensors: `logits` of the `eager` attention
and `logits_sdpa` of the `sdpa` one, in float32, the values of the half-precision
logits). lethe's decoders read with `--precision bf16` or `f16` must
come close to them (tests/it/llama.rs), closer than float32's logits are.

The models are the committed ones (scripts/llama-fixture.py made them); this script only
reads them, so the float32 references stay as they are. transformers' `eager` attention
writes its weights out as lethe's does one token at a time or under a policy that reads
them (scores in the model's precision, the softmax in float32, its weights back in the
model's precision); its `sdpa` one calls libtorch's fused kernel, as lethe does for a
prompt under the full cache.

    .venv/bin/pip install transformers && .venv/bin/python scripts/llama-precision-fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llama"
FAMILIES = ["llama3", "smollm2", "mistral", "qwen2", "qwen3"]
PRECISIONS = {"bf16": torch.bfloat16, "f16": torch.float16}


def main():
    for name in FAMILIES:
        folder = FIXTURE / name
        ids = load_file(folder / "expected.safetensors")["ids"]
        for label, dtype in PRECISIONS.items():
            expected = {}
            for attention, key in [("eager", "logits"), ("sdpa", "logits_sdpa")]:
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attention).eval()
                with torch.no_grad():
                    logits = model(ids).logits
                assert logits.dtype == dtype, f"{name}: logits in {logits.dtype}, not {dtype}"
                expected[key] = logits.float().contiguous()
            out = folder / f"expected-{label}.safetensors"
            save_file(expected, out)
            gap = (expected["logits"] - expected["logits_sdpa"]).abs().max()
            print(f"wrote {out}: largest logit {expected['logits'].abs().max():.3f}, eager against sdpa {gap:.2e}")


if __name__ == "__main__":
    main()
