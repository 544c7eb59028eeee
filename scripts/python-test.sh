#!/usr/bin/env bash
# Builds the Python package `lethe` into lethe's environment (`pip install .`, which runs
# maturin on python/Cargo.toml against the environment's torch) and runs its tests:
# the fast ones, and with --slow the learning ones too. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
pip install --quiet "maturin>=1.5,<2" pytest numpy
# The extension builds in the crates' target folder: the dependencies it shares with them,
# built alike, are not built twice (26 crates left to build after the crates' tests, not
# 280: on 2 cores, 2.5 minutes instead of 8). Its own crates and those whose features
# differ (tch with libtorch's Python bindings) build beside theirs under other names.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
echo "python: building and installing the package (pip install --no-build-isolation .)" >&2
pip install --quiet --no-build-isolation .
# From the tests' folder, so that `import lethe` is the installed package, not python/lethe.
cd python/tests
exec python -m pytest -q . "$@"
