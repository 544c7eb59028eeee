#!/usr/bin/env bash
# Builds the Python package `lethe` into lethe's environment (`pip install .`, which runs
# maturin on python/Cargo.toml against the environment's torch) and runs its tests:
# the fast ones, and with --slow the learning ones too. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
pip install --quiet "maturin>=1.5,<2" pytest numpy
echo "python: building and installing the package (pip install --no-build-isolation .)" >&2
pip install --quiet --no-build-isolation .
# From the tests' folder, so that `import lethe` is the installed package, not python/lethe.
cd python/tests
exec python -m pytest -q . "$@"
