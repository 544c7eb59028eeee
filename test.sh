#!/usr/bin/env bash
# Sets up lethe if needed (see run.sh) and runs the whole test suite: the Rust crates'
# tests, then the Python package's (scripts/python-test.sh). Tests build in release mode:
# the training tests run tiny models, and libtorch does the arithmetic. Arguments go to
# `cargo test`; with --include-ignored the slow tier of both runs.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/env.sh
# The NCCL group's library, which the distributed tests load (a C++ build of a few seconds).
[ target/release/liblethe_nccl.so -nt crates/kernels/csrc/nccl/process_group_nccl.cpp ] || scripts/build-nccl.sh
cargo test --release --workspace "$@"
slow=()
for arg in "$@"; do
    [ "$arg" = "--include-ignored" ] && slow=(--slow)
done
scripts/python-test.sh "${slow[@]}"
