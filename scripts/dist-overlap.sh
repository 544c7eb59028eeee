#!/usr/bin/env bash
# Two data-parallel ranks of enwik8-tiny on this machine with the gradients' all-reduce
# during the backward pass (train.dist_overlap = true) and after it (false), in
# alternating runs: each run STEPS steps on data/demo.txt, one thread a rank; prints rank
# 0's training rate at the last step and the run's wall time, and checks that both ways
# end at the same loss.
#
#   scripts/dist-overlap.sh [ROUNDS] [STEPS] [OUT]     (defaults: 3, 60, a temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ROUNDS=${1:-3}
STEPS=${2:-60}
OUT=${3:-$(mktemp -d)}
scripts/demo-corpus.sh
cargo build --release --quiet
mkdir -p "$OUT"
for ROUND in $(seq "$ROUNDS"); do
  for OVERLAP in true false; do
    START=$(date +%s.%N)
    LINE=$(torchrun --nproc-per-node 2 --master-port $((29650 + ROUND)) --no-python target/release/lethe train \
      -p enwik8-tiny --data data/demo.txt --steps "$STEPS" --set train.threads=1 --set train.eval_every=0 \
      --set train.log_every="$STEPS" --set train.dist_overlap="$OVERLAP" --name "overlap-$OVERLAP-$ROUND" \
      --out "$OUT" --overwrite 2>&1 | grep -E "^step +$STEPS/")
    WALL=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$START" "$(date +%s.%N)")
    RATE=$(grep -o '[0-9.]*k tok/s' <<<"$LINE")
    LOSS=$(grep -o 'loss [0-9.]*' <<<"$LINE")
    echo "round $ROUND overlap=$OVERLAP: $RATE, $LOSS, $WALL s"
  done
done
