#!/usr/bin/env python3
"""Makes tests/fixtures/llama/: one tiny, randomly initialised model of each Llama-family
architecture lethe reads, saved by Hugging Face `transformers` in its own layout, with the
logits `transformers` computes for a batch of token ids and the six ids its greedy
`generate` continues the first row's first eight with (expected.safetensors). lethe must
give the same logits (tests/it/llama.rs): an independent implementation read from the
same files.

- llama3:  Llama 3.x, RoPE theta 500000 with the `llama3` frequency scaling, grouped
           queries (4 heads, 2 key-value heads), untied output map
- smollm2: SmolLM2 (a Llama), tied embeddings, saved in bfloat16
- mistral: Mistral with a sliding window of 6 (shorter than the ids), saved in shards
           with model.safetensors.index.json
- qwen2:   Qwen2/2.5, biases on the query, key and value maps
- qwen3:   Qwen3, RMSNorm on queries and keys, head_dim 16 (not hidden / heads)

Each folder also holds one byte-level BPE tokenizer trained by Hugging Face `tokenizers`
with Llama 3's pre-tokenizer (tokenizer.json), a sample text and the ids it gives
(sample.txt; `sample_ids` in llama3/expected.safetensors).

The fixture is committed, so the tests need no Python. To make it again:
    .venv/bin/pip install transformers && .venv/bin/python scripts/llama-fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "llama"

CORPUS = """Expire-Span learns to keep what matters and to forget the rest. The memory holds
each past state for a span it predicts; a state whose span has run out is deleted. StreamingLLM
keeps the first tokens and a window; H2O the heavy hitters; TOVA what the last query needs;
SnapKV what a window of queries at the end of the prompt attends to. 1234 + 5678 = 6912.
Café, naïve, 東京, emoji 🙂 and tabs\tall round-trip."""
SAMPLE = "  The cache keeps 1024 entries: 東京 🙂, naïve café!\n\tTabs, 3.14159 and   spaces.\n"
# Llama 3's pre-tokenizer: its split pattern, then bytes.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
VOCAB = 320  # the models' rows, more than the tokenizer's ids, as released models pad


def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    return tok


SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
MODELS = {
    "llama3": (LlamaConfig, LlamaForCausalLM, dict(
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
    "smollm2": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=100000.0, tie_word_embeddings=True)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(rope_theta=1000000.0, sliding_window=6)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(rope_theta=1000000.0, head_dim=16, tie_word_embeddings=False)),
}


def main():
    tok = tokenizer()
    sample_ids = torch.tensor(tok.encode(SAMPLE).ids, dtype=torch.int64)
    assert tok.decode(sample_ids.tolist()) == SAMPLE
    assert tok.get_vocab_size() <= VOCAB
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 20))
    for name, (config_class, model_class, extra) in MODELS.items():
        out = OUT / name
        out.mkdir(parents=True, exist_ok=True)
        config = config_class(**SHAPE, **extra, attention_dropout=0.0, bos_token_id=0, eos_token_id=1)
        config._attn_implementation = "eager"
        model = model_class(config).eval()
        with torch.no_grad():
            # Away from the initial values (RMSNorm weights 1, zero biases), so that a weight
            # read into the wrong place, or a missing bias, changes the logits.
            for pname, p in model.named_parameters():
                if "norm" in pname or pname.endswith("bias"):
                    p.add_(0.3 * torch.randn_like(p))
                else:
                    p.mul_(4.0)
            if name == "smollm2":
                # Weights a bfloat16 file holds exactly; the logits are float32's over them.
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).to(torch.float32))
        with torch.no_grad():
            logits = model(ids).logits
            # What greedy decoding continues the first row's first 8 ids with.
            # (Every id attended: generate would otherwise take those equal to the padding id for padding.)
            prompt = ids[:1, :8]
            greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False,
                                    pad_token_id=0)[0, 8:]
        if name == "smollm2":
            model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        elif name == "mistral":
            model.save_pretrained(out, safe_serialization=True, max_shard_size="40KB")
        else:
            model.save_pretrained(out, safe_serialization=True)
        tok.save(str(out / "tokenizer.json"))
        expected = {"ids": ids, "logits": logits.contiguous(), "greedy": greedy.contiguous()}
        if name == "llama3":
            expected["sample_ids"] = sample_ids
            (out / "sample.txt").write_text(SAMPLE, encoding="utf-8")
        save_file(expected, out / "expected.safetensors")
        files = sorted(p.name for p in out.iterdir())
        print(f"wrote {out}: {sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}; {files}")


if __name__ == "__main__":
    main()
