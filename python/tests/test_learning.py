"""A small model built from lethe's modules, trained by a plain PyTorch loop."""

import pytest
import torch
from torch import nn

import lethe

VOCAB, DELAY, BLOCK = 8, 24, 16


class Model(nn.Module):
    """Pre-norm transformer layers around lethe's Expire-Span attention."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(2 * layers))
        self.attn = nn.ModuleList(lethe.ExpireSpan(d, heads, max_span=64, ramp=8, init_fraction=0.5, block=BLOCK) for _ in range(layers))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d)) for _ in range(layers))
        self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, VOCAB))

    def forward(self, tokens, states):
        h = self.embed(tokens)
        states = states or [None] * len(self.attn)
        after, aux = [], 0.0
        for i, (attn, ffn) in enumerate(zip(self.attn, self.ffn)):
            a, s = attn(self.norms[2 * i](h), states[i])
            h = h + a
            h = h + ffn(self.norms[2 * i + 1](h))
            after.append(s)
            aux = aux + attn.aux_loss
        return self.out(h), after, aux


def copy_streams(batch, length, generator):
    """Random tokens; the target at t is the token DELAY positions back, further than a block."""
    x = torch.randint(0, VOCAB, (batch, length), generator=generator)
    return x, torch.roll(x, DELAY, dims=1)


@pytest.mark.slow
def test_a_plain_pytorch_loop_learns_to_copy_across_blocks():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    length = 8 * BLOCK

    def run(x, y, train):
        model.train(train)
        states, losses, hits, count = None, [], 0, 0
        for start in range(0, length, BLOCK):
            logits, states, aux = model(x[:, start : start + BLOCK], states)
            scored = slice(max(DELAY - start, 0), BLOCK)  # a target exists from DELAY on
            lg, tg = logits[:, scored], y[:, start : start + BLOCK][:, scored]
            if tg.numel():
                losses.append(nn.functional.cross_entropy(lg.reshape(-1, VOCAB), tg.reshape(-1)) + aux)
                hits += (lg.argmax(-1) == tg).sum().item()
                count += tg.numel()
        return torch.stack(losses).mean(), hits / count

    for _ in range(150):
        x, y = copy_streams(16, length, g)
        loss, _ = run(x, y, True)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y = copy_streams(32, length, g)
        _, accuracy = run(x, y, False)
    assert accuracy > 0.9, f"copied {accuracy:.2f} of the tokens (chance {1 / VOCAB:.2f})"
