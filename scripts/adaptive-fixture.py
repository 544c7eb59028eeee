#!/usr/bin/env python3
"""Makes tests/fixtures/adaptive-softmax.safetensors: PyTorch's own adaptive softmax
(torch.nn.AdaptiveLogSoftmaxWithLoss, Grave et al.) with random weights, a batch of
hidden vectors, and the log-probabilities PyTorch computes for every word. With zero
output biases lethe's adaptive softmax is the same function: its head is PyTorch's head
(the words of the first cluster, then one entry per tail cluster, in order), and tail
cluster i is PyTorch's two maps d -> d / div^i -> n_i, which lethe names P_i and E_i
(tests/it/words.rs reads the weights into lethe's layout and compares).

The fixture is committed, so the tests need no Python. To make it again:
    . scripts/env.sh && python3 scripts/adaptive-fixture.py
"""
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "adaptive-softmax.safetensors"

torch.manual_seed(0)
D, VOCAB, CUTOFFS, DIV = 16, 30, [5, 12], 2.0
asm = torch.nn.AdaptiveLogSoftmaxWithLoss(D, VOCAB, CUTOFFS, div_value=DIV, head_bias=False).double()
with torch.no_grad():
    for p in asm.parameters():
        p.normal_(0.0, 0.5)
hidden = torch.randn(7, D, dtype=torch.float64)
tensors = {
    "head.weight": asm.head.weight,  # (5 + 2, 16)
    "hidden": hidden,
    "log_probs": asm.log_prob(hidden),  # (7, 30)
}
for i, tail in enumerate(asm.tail):
    tensors[f"tail.{i}.proj"] = tail[0].weight  # (d_i, 16)
    tensors[f"tail.{i}.out"] = tail[1].weight  # (n_i, d_i)
save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(OUT))
print(f"wrote {OUT}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))
