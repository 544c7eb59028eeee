"""What several test files share: the ``lethe`` binary the command-line comparisons run,
and the two ways a module is copied."""

import copy
import io
import os
import pathlib
import subprocess

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("LETHE_BIN", REPO / "target" / "release" / "lethe"))

needs_binary = pytest.mark.skipif(
    not BINARY.is_file(), reason=f"needs the lethe binary ({BINARY}): cargo build --release"
)


def lethe_cli(*args, cwd):
    """What `lethe ARGS` printed, as bytes."""
    done = subprocess.run([str(BINARY), *args], cwd=cwd, capture_output=True)
    assert done.returncode == 0, f"lethe {' '.join(args)}: {done.stderr.decode(errors='replace')}"
    return done.stdout


def copies(module):
    """``module`` copied by ``copy.deepcopy`` and through ``torch.save``/``torch.load``."""
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return {"deepcopy": copy.deepcopy(module), "torch.save": torch.load(buffer, weights_only=False)}
