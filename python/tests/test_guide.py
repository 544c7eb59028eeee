"""The guide's Python page runs as written: each of its ```python blocks, in order, in a
folder where `runs/enwik8-tiny` is a run that `lethe train` made and `SmolLM2-135M` a
SmolLM2-shaped fixture."""

import pathlib
import re

import pytest

import lethe
from test_cli import BINARY, REPO, lethe_cli

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "src" / "python.md"


@pytest.mark.skipif(not BINARY.is_file(), reason=f"needs the lethe binary ({BINARY}): cargo build --release")
def test_the_python_page_runs_as_written(tmp_path, monkeypatch):
    (tmp_path / "text.txt").write_text("The memory of a stream keeps what it needs. " * 200)
    lethe_cli("train", "-p", "enwik8-tiny", "--data", "text.txt", "--steps", "2", "--out", "runs",
              "--name", "enwik8-tiny", "-q", "--no-eval", cwd=tmp_path)
    # The decoder example's folder: the SmolLM2-shaped fixture.
    (tmp_path / "SmolLM2-135M").symlink_to(REPO / "tests" / "fixtures" / "llama" / "smollm2")
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
    assert scope["cache"].entries() == [256] * len(scope["cache"].entries())
