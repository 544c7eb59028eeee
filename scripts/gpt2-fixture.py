#!/usr/bin/env python3
"""Makes tests/fixtures/gpt2-tiny: a tiny, randomly initialised GPT-2 saved by Hugging Face
`transformers` in its own layout (config.json, model.safetensors), with a batch of token
ids and the logits `transformers` computes for them (expected.safetensors). lethe's GPT-2
must give the same logits (tests/gpt2.rs): an independent implementation of the same
architecture, read from the same files.

The fixture is committed, so the tests need no Python. To make it again:
    . scripts/env.sh && pip install transformers && python3 scripts/gpt2-fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpt2-tiny"

torch.manual_seed(0)
config = GPT2Config(
    vocab_size=96, n_positions=32, n_embd=24, n_layer=2, n_head=3, layer_norm_epsilon=1e-5,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)
model = GPT2LMHeadModel(config).eval()
with torch.no_grad():
    # Away from the initial values (LayerNorm 1 and 0, zero biases), so that a weight read
    # into the wrong place, or a missing bias, changes the logits.
    for name, p in model.named_parameters():
        if "ln" in name or name.endswith("bias"):
            p.add_(0.2 * torch.randn_like(p))
OUT.mkdir(parents=True, exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)
ids = torch.randint(0, config.vocab_size, (2, 20))
with torch.no_grad():
    logits = model(ids).logits
save_file({"ids": ids, "logits": logits.contiguous()}, OUT / "expected.safetensors")
print(f"wrote {OUT}: {sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}")
