#!/usr/bin/env python3
"""Makes tests/fixtures/gpt2-tiny: a tiny, randomly initialised GPT-2 saved by Hugging Face
`transformers` in its own layout (config.json, model.safetensors), with a byte-level BPE
tokenizer (tokenizer.json, and the older vocab.json + merges.txt) trained by Hugging
Face `tokenizers` on a paragraph, a batch of token ids and the logits `transformers`
computes for them, and the ids the tokenizer gives a sample text (expected.safetensors,
sample.txt). lethe must give the same logits and the same ids (tests/gpt2.rs): an
independent implementation read from the same files.

The fixture is committed, so the tests need no Python. To make it again:
    . scripts/env.sh && pip install transformers && python3 scripts/gpt2-fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpt2-tiny"

CORPUS = """Expire-Span learns to keep what matters and to forget the rest. The memory holds
each past state for a span it predicts; a state whose span has run out is deleted. The
infinity-former keeps an unbounded memory as a continuous signal: sticky memories give
more room to the regions the model attends to. Café, naïve, 東京, emoji 🙂 and tabs\tall round-trip."""
SAMPLE = "The memory keeps what matters: spans, sticky memories, and 東京 🙂 too.\n  Two spaces, a tab\tand a newline."

OUT.mkdir(parents=True, exist_ok=True)
tokenizer = ByteLevelBPETokenizer()
tokenizer.train_from_iterator([CORPUS], vocab_size=300, min_frequency=2, special_tokens=["<|endoftext|>"])
tokenizer.save(str(OUT / "tokenizer.json"))
tokenizer.save_model(str(OUT))  # vocab.json and merges.txt, the older layout
(OUT / "sample.txt").write_text(SAMPLE, encoding="utf-8")
sample_ids = torch.tensor(tokenizer.encode(SAMPLE).ids, dtype=torch.int64)
assert tokenizer.decode(sample_ids.tolist()) == SAMPLE

torch.manual_seed(0)
config = GPT2Config(
    vocab_size=tokenizer.get_vocab_size(), n_positions=32, n_embd=24, n_layer=2, n_head=3, layer_norm_epsilon=1e-5,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
)
model = GPT2LMHeadModel(config).eval()
with torch.no_grad():
    # Away from the initial values (LayerNorm 1 and 0, zero biases), so that a weight read
    # into the wrong place, or a missing bias, changes the logits.
    for name, p in model.named_parameters():
        if "ln" in name or name.endswith("bias"):
            p.add_(0.2 * torch.randn_like(p))
model.save_pretrained(OUT, safe_serialization=True)
ids = torch.randint(0, config.vocab_size, (2, 20))
with torch.no_grad():
    logits = model(ids).logits
save_file({"ids": ids, "logits": logits.contiguous(), "sample_ids": sample_ids}, OUT / "expected.safetensors")
print(f"wrote {OUT}: {sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}, vocabulary {config.vocab_size}, sample of {len(sample_ids)} tokens")
