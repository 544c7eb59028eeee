"""The guide's Python page runs as written: each of its ```python blocks, in order."""

import pathlib
import re

import torch

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "src" / "python.md"


def test_the_python_page_runs_as_written(capsys):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 2, f"{PAGE}: no python examples found"
    scope = {}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), scope)
    # The training example learned: its last step's loss far below chance (ln 8 = 2.08).
    loss = scope["loss"].item() / 7
    assert loss < 0.5, f"the guide's model ended at loss {loss:.3f}"
    assert isinstance(scope["state"], __import__("lethe").State)
    assert torch.is_tensor(scope["y"])
