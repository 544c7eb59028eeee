#!/usr/bin/env bash
# Sets up lethe (first time: a local .venv with the pinned torch==2.11.0 wheel, then a
# release build) and runs it. With no arguments it runs the main job: training the
# default `copy-tiny` preset on the synthetic copy task (no download, a minute or two on
# 2 cores), starting over if runs/copy-tiny exists. Any arguments go to `lethe`:
#   ./run.sh train --preset enwik8-tiny --data data/enwik8
#   ./run.sh eval --checkpoint runs/copy-tiny
set -euo pipefail
cd "$(dirname "$0")"
. scripts/env.sh
cargo build --release --quiet
if [ $# -eq 0 ]; then
    set -- train --overwrite
fi
exec target/release/lethe "$@"
