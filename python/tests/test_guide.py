"""The guide's Python page runs as written: each of its ```python blocks, in order, in a
folder where `runs/enwik8-tiny` is a run that `lethe train` made, `SmolLM2-135M` a
SmolLM2-shaped fixture and `runs/smollm2-expire` an Expire-Span run fitted onto it."""

import pathlib
import re

import lethe
from helpers import REPO, lethe_cli, needs_binary

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "src" / "python.md"


@needs_binary
def test_the_python_page_runs_as_written(tmp_path, monkeypatch):
    (tmp_path / "text.txt").write_text("The memory of a stream keeps what it needs. " * 200)
    lethe_cli("train", "-p", "enwik8-tiny", "--data", "text.txt", "--steps", "2", "--out", "runs",
              "--name", "enwik8-tiny", "-q", "--no-eval", cwd=tmp_path)
    # The decoder example's folder: the SmolLM2-shaped fixture; an Expire-Span run fitted onto it.
    (tmp_path / "SmolLM2-135M").symlink_to(REPO / "tests" / "fixtures" / "llama" / "smollm2")
    sets = ["train.block=8", "train.batch=2", "train.warmup=1", "train.freeze_base=true"]
    sets += ['memory.mechanism="expire"', "memory.span=32"]
    lethe_cli("train", "--init-from", "SmolLM2-135M", "--data", "text.txt", "--steps", "1", "--out", "runs",
              "--name", "smollm2-expire", "-q", "--no-eval", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 3, f"{PAGE}: no python examples found"
    scope = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), scope)
    # The training example learned: its last step's loss far below chance (ln 8 = 2.08).
    loss = scope["loss"].item() / 7
    assert loss < 0.5, f"the guide's model ended at loss {loss:.3f}"
    assert isinstance(scope["state"], lethe.State)
    assert scope["tokens"].shape == (1, 22)
    assert scope["logits"].shape == (1, 1, scope["decoder"].vocab)
    assert len(scope["ids"]) == 40
    assert scope["cache"].entries() == [256] * len(scope["cache"].entries())  # its copies read apart
    assert [a.shape for a in scope["answers"]] == [(1, 12, scope["decoder"].vocab)] * 3
    assert scope["fitted"].learned and sorted(scope["losses"]) == ["h2o", "learned", "snapkv"]
