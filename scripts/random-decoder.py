#!/usr/bin/env python3
"""Writes a folder of random weights in the shape of a pretrained decoder a preset names
(SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B), in Hugging Face's layout: its config.json
and a model.safetensors of normal(0, 0.02) matrices and unit norms. `lethe train --preset
P --init-from FOLDER` reads it as it reads the real model, so that a preset's peak memory
can be measured without fetching the weights (the presets guide's memory table).

    .venv/bin/pip install safetensors
    .venv/bin/python scripts/random-decoder.py llama3.2-1b /tmp/llama3.2-1b-random

The configs are the published ones (the models' config.json on the Hugging Face hub).
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", attention_bias=False)
SHAPES = {
    "smollm2-135m": dict(LLAMA, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=8192),
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                         hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         max_position_embeddings=32768),
    "llama3.2-1b": dict(LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                        tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
                        max_position_embeddings=131072,
                        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
}


def weights(c):
    """The model's tensors by their Hugging Face names."""
    d, f = c["hidden_size"], c["intermediate_size"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // heads)
    normal = lambda *shape: torch.randn(*shape) * 0.02
    t = {"model.embed_tokens.weight": normal(c["vocab_size"], d), "model.norm.weight": torch.ones(d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = normal(heads * hd, d)
        t[p + "self_attn.k_proj.weight"] = normal(kv * hd, d)
        t[p + "self_attn.v_proj.weight"] = normal(kv * hd, d)
        t[p + "self_attn.o_proj.weight"] = normal(d, heads * hd)
        if c["model_type"] == "qwen2":
            for name, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                t[p + f"self_attn.{name}_proj.bias"] = torch.zeros(rows)
        t[p + "mlp.gate_proj.weight"] = normal(f, d)
        t[p + "mlp.up_proj.weight"] = normal(f, d)
        t[p + "mlp.down_proj.weight"] = normal(d, f)
        t[p + "input_layernorm.weight"] = torch.ones(d)
        t[p + "post_attention_layernorm.weight"] = torch.ones(d)
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = normal(c["vocab_size"], d)
    return t


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: random-decoder.py {{{','.join(SHAPES)}}} OUT")
    name, out = sys.argv[1], Path(sys.argv[2])
    config = dict(SHAPES[name], torch_dtype="float32")
    torch.manual_seed(0)
    tensors = weights(config)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    count = sum(v.numel() for v in tensors.values())
    print(f"{out}: {name}'s shape, {count / 1e6:.1f}M parameters, random")


if __name__ == "__main__":
    main()
