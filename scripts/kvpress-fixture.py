#!/usr/bin/env python3
"""Makes tests/fixtures/llama/kvpress.safetensors: which entries NVIDIA's kvpress keeps
when its presses compress the key-value cache of a prompt, on two models of the Llama
fixture (llama3: grouped queries, llama3 RoPE scaling; qwen3: query and key norms).
lethe's policies must keep the same entries (tests/it/kv_policies.rs): an independent
implementation run on the same model and ids.

For each model, press and budget, the tensor `{model}.{policy}.{budget}` holds the kept
entries' positions `(1, kv_heads, budget)`, ascending per head, found by matching the
pressed cache's keys with the whole cache's (the rows are distinct floats). `ids` holds
the prompt, `(1, 48)`. StreamingLLM re-assigns positions inside the cache: the tensor
`{model}.streaming_keys.{budget}.{layer}` holds the keys kvpress's KeyRerotationPress
gives (the kept keys rotated again to the positions 0, 1, ... of the cache).

| lethe            | kvpress                                     |
|------------------|---------------------------------------------|
| window           | StreamingLLMPress(n_sink=0)                 |
| streaming        | StreamingLLMPress(n_sink=4)                 |
| tova             | TOVAPress()                                 |
| snapkv:window=8  | SnapKVPress(window_size=8, kernel_size=5)   |

kvpress 0.5.5 pins transformers below 5.3, so it runs beside the fixture's transformers:
    pip install --target /tmp/kvdeps kvpress==0.5.5 transformers==5.2.0
    PYTHONPATH=/tmp/kvdeps .venv/bin/python scripts/kvpress-fixture.py
"""
from pathlib import Path

import kvpress
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, DynamicCache

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llama"
MODELS = ["llama3", "qwen3"]
PROMPT = 48
BUDGETS = [24, 12]
PRESSES = {
    "window": lambda ratio: kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=0),
    "streaming": lambda ratio: kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4),
    "tova": lambda ratio: kvpress.TOVAPress(compression_ratio=ratio),
    "snapkv": lambda ratio: kvpress.SnapKVPress(compression_ratio=ratio, window_size=8, kernel_size=5),
}


def prefill(model, ids, press=None):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        if press is None:
            model(ids, past_key_values=cache)
        else:
            with press(model):
                model(ids, past_key_values=cache)
    return [layer.keys for layer in cache.layers]


def kept(full, pressed):
    """The positions of `pressed`'s rows `(1, kv_heads, m, hd)` among `full`'s, sorted."""
    out = torch.empty(pressed.shape[:3], dtype=torch.int64)
    for h in range(full.shape[1]):
        for j in range(pressed.shape[2]):
            match = (full[0, h] == pressed[0, h, j]).all(-1).nonzero().flatten()
            assert len(match) == 1, "a pressed key matches no single row"
            out[0, h, j] = match[0]
    return out.sort(-1).values


def main():
    print(f"transformers {transformers.__version__}")
    torch.manual_seed(0)
    ids = torch.randint(0, 300, (1, PROMPT))
    out = {"ids": ids}
    for name in MODELS:
        model = AutoModelForCausalLM.from_pretrained(FIXTURE / name, dtype=torch.float32).eval()
        full = prefill(model, ids)
        for policy, press in PRESSES.items():
            for budget in BUDGETS:
                pressed = prefill(model, ids, press(1 - budget / PROMPT))
                assert pressed[0].shape[2] == budget, (policy, budget, pressed[0].shape)
                for layer, (f, p) in enumerate(zip(full, pressed)):
                    out[f"{name}.{policy}.{budget}.{layer}"] = kept(f, p)
        for budget in BUDGETS:
            rerotation = kvpress.KeyRerotationPress(press=PRESSES["streaming"](1 - budget / PROMPT))
            for layer, keys in enumerate(prefill(model, ids, rerotation)):
                out[f"{name}.streaming_keys.{budget}.{layer}"] = keys.contiguous()
    save_file(out, FIXTURE / "kvpress.safetensors")
    print(f"wrote {FIXTURE / 'kvpress.safetensors'}")


if __name__ == "__main__":
    main()
