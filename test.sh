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
# One test at a time: every test's libtorch already uses each core, and two side by side
# (each with its own threads spinning at their barriers) ran the slow tier 3-5x slower
# than one after another (the integration tests: 553 s alone against 1300-2800 s in
# pairs, on 2 cores). RUST_TEST_THREADS set by the caller wins.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-1}
cargo test --release --workspace "$@"
slow=()
for arg in "$@"; do
    [ "$arg" = "--include-ignored" ] && slow=(--slow)
done
scripts/python-test.sh "${slow[@]}"
