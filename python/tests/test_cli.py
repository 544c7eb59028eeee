"""The Python modules compute what the ``lethe`` command computes, on the same checkpoint.

For every mechanism, a tiny run trained by ``lethe train``:
- ``lethe.load(run)`` scores the validation text as ``lethe eval --per-token`` does, token
  by token, to float32 rounding;
- a model of the user's own, built from ``lethe.MemoryAttention`` layers and PyTorch's
  LayerNorm, Linear and Embedding with the run's weights, gives the logits and the
  gradients of ``lethe.load(run)``, its layers' parameters each equal to the run's.
"""

import copy
import csv
import random
import subprocess

import pytest
import torch
from torch import nn

import lethe
from helpers import BINARY, copies, lethe_cli, needs_binary

BLOCK = 16
MECHANISMS = {
    "fixed": ["memory.span=32"],
    "expire": ["memory.span=64", "memory.expire.ramp=8"],
    "adaptive": ["memory.span=32", "memory.adaptive.ramp=8"],
    "compressive": ["memory.span=16", "memory.compressive.slots=8", "memory.compressive.rate=2"],
    "infinity": ["memory.span=16", "memory.infinity.basis=8"],
}

pytestmark = needs_binary


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A text file and one run folder per mechanism, trained 4 steps by `lethe train`."""
    folder = tmp_path_factory.mktemp("runs")
    rng = random.Random(0)
    words = "the of memory span keeps forgets long stream token past attention learns what to keep and expire".split()
    (folder / "words.txt").write_text(" ".join(rng.choice(words) for _ in range(1200)))
    for mechanism, sets in MECHANISMS.items():
        settings = [f"memory.mechanism={mechanism}", "model.layers=2", "model.d_model=32", "model.heads=4"]
        settings += ["model.d_ffn=64", "model.dropout=0", "train.batch=2", f"train.block={BLOCK}", *sets]
        args = ["train", "-p", "enwik8-tiny", "--data", "words.txt", "--steps", "4", "--out", ".", "--name", mechanism]
        lethe_cli(*args, *[a for s in settings for a in ("--set", s)], "-q", cwd=folder)
    return folder


def per_token(folder, mechanism):
    """`lethe eval --per-token` of one stream in blocks of BLOCK: (inputs, losses)."""
    lethe_cli(
        "eval", "--checkpoint", mechanism, "--data", "words.txt", "--batch", "1", "--block", str(BLOCK),
        "--per-token", f"{mechanism}.csv", cwd=folder,
    )
    with open(folder / f"{mechanism}.csv") as f:
        rows = list(csv.DictReader(f))
    targets = bytes(int(r["target"]) for r in rows)
    text = (folder / "words.txt").read_bytes()
    at = text.find(targets)  # the split's targets; each input is the byte before its target
    assert at > 0 and text.find(targets, at + 1) < 0, "the split's text is not unique in the file"
    inputs = torch.tensor(list(text[at - 1 : at - 1 + len(targets)]))
    return inputs, torch.tensor([float(r["loss"]) for r in rows])


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_load_scores_every_token_as_lethe_eval(runs, mechanism):
    inputs, expected = per_token(runs, mechanism)
    model = lethe.load(runs / mechanism).eval()
    state, losses = None, []
    with torch.no_grad():
        for start in range(0, len(inputs), BLOCK):
            block = inputs[start : start + BLOCK]
            logits, state = model(block.unsqueeze(0), state)
            targets = inputs[start + 1 : start + 1 + BLOCK]
            if start + BLOCK >= len(inputs):  # the last target is the byte after the inputs
                targets = torch.cat([targets, torch.tensor([0])])[: len(block)]
            losses.append(nn.functional.cross_entropy(logits[0], targets, reduction="none"))
    got = torch.cat(losses)[: len(expected) - 1]  # the last target lies beyond `inputs`
    torch.testing.assert_close(got, expected[: len(got)], rtol=1e-5, atol=2e-5)


class Composed(nn.Module):
    """lethe's pre-norm backbone from lethe.MemoryAttention and PyTorch's own modules."""

    def __init__(self, config):
        super().__init__()
        m, memory = config["model"], config["memory"]
        d, mechanism = m["d_model"], memory["mechanism"]
        settings = memory.get(mechanism, {})
        self.embed = nn.Embedding(m["vocab"], d)
        self.layers = nn.ModuleList()
        for _ in range(m["layers"]):
            layer = nn.Module()
            layer.norm1, layer.norm2 = nn.LayerNorm(d, eps=m["norm_eps"]), nn.LayerNorm(d, eps=m["norm_eps"])
            layer.attn = lethe.MemoryAttention(
                mechanism, d, m["heads"], memory["span"], block=BLOCK, dropout=0.0, settings=settings
            )
            layer.ff1, layer.ff2 = nn.Linear(d, m["d_ffn"]), nn.Linear(m["d_ffn"], d)
            self.layers.append(layer)
        self.final_norm = nn.LayerNorm(d, eps=m["norm_eps"])
        self.head = nn.Linear(d, m["vocab"])

    def load_run(self, run):
        """The run's weights: `layers.<i>.attn.*` into each layer, `key_pe` into every one."""
        theirs = dict(run.named_parameters())
        for name, p in self.named_parameters():
            source = "key_pe" if name.endswith("attn.key_pe") else name
            with torch.no_grad():
                p.copy_(theirs[source])

    def forward(self, tokens, states):
        h, after, aux = self.embed(tokens), [], 0.0
        for layer, state in zip(self.layers, states):
            a, state = layer.attn(layer.norm1(h), state)
            h = h + a
            h = h + layer.ff2(torch.relu(layer.ff1(layer.norm2(h))))
            after.append(state)
            aux = aux + layer.attn.aux_loss
        return self.head(self.final_norm(h)), after, aux


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_model_of_lethes_layers_computes_what_load_computes(runs, mechanism):
    run = lethe.load(runs / mechanism)
    assert run.config["model"]["pre_norm"] and run.config["model"]["arch"] == "lethe"
    ours = Composed(run.config)
    ours.load_run(run)
    run.train(), ours.train()  # the auxiliary losses are training's; dropout is 0
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, run.vocab, (2, 5 * BLOCK), generator=g)
    weights = torch.randn(2, BLOCK, run.vocab, generator=g)
    state, states, loss_run, loss_ours = None, [None] * len(ours.layers), 0.0, 0.0
    for start in range(0, tokens.shape[1], BLOCK):
        block = tokens[:, start : start + BLOCK]
        logits_run, state = run(block, state)
        logits_ours, states, aux = ours(block, states)
        torch.testing.assert_close(logits_ours, logits_run, rtol=1e-5, atol=1e-5)
        loss_run = loss_run + (logits_run * weights).sum() + run.aux_loss
        loss_ours = loss_ours + (logits_ours * weights).sum() + aux
    torch.testing.assert_close(loss_ours, loss_run, rtol=1e-5, atol=1e-4)
    loss_run.backward()
    loss_ours.backward()
    theirs = dict(run.named_parameters())
    key_pe = sum(layer.attn.key_pe.grad for layer in ours.layers)
    torch.testing.assert_close(key_pe, theirs["key_pe"].grad, rtol=1e-4, atol=1e-5)
    for name, p in ours.named_parameters():
        if not name.endswith("attn.key_pe"):
            torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_continues_as_lethe_generate(runs, temperature):
    args = ["--prompt", "the memory", "--bytes", "24", "--temperature", str(temperature), "--seed", "3"]
    said = lethe_cli("generate", "--checkpoint", "expire", *args, cwd=runs)
    model = lethe.load(runs / "expire")
    ours = bytes(model.generate("the memory", 24, temperature=temperature, seed=3))  # byte-level: ids are bytes
    assert said == b"the memory" + ours + b"\n", f"lethe generate said {said!r}; lethe.Model.generate {ours!r}"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_copy_of_a_model_computes_and_learns_apart_from_it(runs, mechanism):
    model = lethe.load(runs / mechanism)
    tokens = torch.randint(0, model.vocab, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    first, state = model(tokens)
    want, _ = model(tokens, state)
    for how, twin in copies(model).items():
        assert twin.config == model.config and twin.encode("the span") == model.encode("the span"), how
        got, _ = twin(tokens, state)
        assert torch.equal(got, want), how
        opt = torch.optim.SGD(twin.parameters(), lr=1.0)
        (got.square().mean() + twin.aux_loss).backward()
        opt.step()
        assert not torch.allclose(twin(tokens, state)[0], want), how
        assert torch.equal(model(tokens, state)[0], want), how
    # The copy holds everything it needs: the run folder is no longer read.
    twin = copy.deepcopy(model)
    assert twin.generate("the memory", 8) == model.generate("the memory", 8)
    # Loading and copying draw nothing from the caller's random stream.
    torch.manual_seed(4)
    lethe.load(runs / mechanism), copy.deepcopy(model)
    after = torch.rand(3)
    torch.manual_seed(4)
    assert torch.equal(after, torch.rand(3)), mechanism


def test_load_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="neither a Hugging Face model folder"):
        lethe.load(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        lethe.load(tmp_path / "missing")


def test_the_package_runs_lethes_command_line(tmp_path):
    """`python -m lethe` (the installed `lethe` command) is the lethe binary's program."""
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "lethe", *args], cwd=tmp_path, capture_output=True, text=True)

    assert run("--version").stdout.strip() == subprocess.run([str(BINARY), "--version"], capture_output=True, text=True).stdout.strip()
    refused = run("nosuch")
    assert refused.returncode == 2 and "unrecognized subcommand" in refused.stderr
    bad = run("train", "--steps", "0")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    done = run("train", "-p", "copy-sweep-tiny", "--steps", "3", "--out", ".", "--name", "r", "-q", "--no-eval")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "checkpoint.safetensors").is_file()
    assert lethe.load(tmp_path / "r").config["name"] == "r"


def test_load_refuses_bad_tokens_with_one_line(runs):
    model = lethe.load(runs / "fixed")
    for tokens, words in [
        (torch.zeros(1, BLOCK + 1, dtype=torch.long), "block = 16"),
        (torch.zeros(BLOCK, dtype=torch.long), "(batch, length)"),
        (torch.zeros(1, 4), "int64"),
        (torch.full((1, 4), model.vocab), "vocabulary"),
        (torch.zeros(1, 4, dtype=torch.long).to_sparse(), "tokens: a torch.sparse_coo tensor"),
        (torch.zeros(1, 4, dtype=torch.long, device="meta"), "tokens: on meta"),
    ]:
        with pytest.raises(ValueError) as caught:
            model(tokens)
        assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    # A tensor that fails inside lethe's own checks leaves the model usable.
    with pytest.raises(RuntimeError) as caught:
        model._model.forward(torch.zeros(1, 4, dtype=torch.long).to_sparse(), [], False)
    assert "\n" not in str(caught.value).strip(), str(caught.value)
    assert model(torch.zeros(1, 4, dtype=torch.long))[0].shape == (1, 4, model.vocab)
    _, state = model(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="streams"):
        model(torch.zeros(3, 4, dtype=torch.long), state)
    d_model = model.config["model"]["d_model"]
    wider = lethe.State(state.owner, [(n, torch.zeros(*t.shape[:2], d_model + 1) if t.dim() == 3 else t) for n, t in state.tensors])
    with pytest.raises(ValueError, match=f"holds states of width {d_model + 1}, where this module's d_model is {d_model}"):
        model(torch.zeros(2, 4, dtype=torch.long), wider)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.generate([model.vocab], 3)
    with pytest.raises(ValueError, match="count = 1000000000000: the list of ids would not fit"):
        model.generate([1], 10**12)
    with pytest.raises(ValueError, match="count must be a whole number, 0 or more, got -1"):
        model.generate([1], -1)
    with pytest.raises(ValueError, match="temperature -1: must be a finite number"):
        model.generate([1], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k = -1: must be from 0"):
        model.generate([1], 2, top_k=-1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.decode([-1])
