#!/usr/bin/env bash
# Sets up lethe if needed (see run.sh) and runs the whole test suite. Tests build in
# release mode: the training tests run tiny models, and libtorch does the arithmetic.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/env.sh
cargo test --release --workspace "$@"
