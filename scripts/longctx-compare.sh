#!/usr/bin/env bash
# The long-context comparison at CPU size (guide: Long-context evaluation, "At CPU
# size"): Transformer-XL, Expire-Span, Adaptive-Span, the Compressive Transformer and
# the ∞-former at equal memory (about 64 memories a layer), each trained on the suite's
# passkey source at 320-512 bytes (the longctx-cpu presets) for every seed, then
# evaluated side by side by `lethe longeval` at up to 16x the longest training length.
# A reference run with a window of 512 (the whole of a training sample, eight times the
# memory) is trained once (seed 1) beside them: it says whether the task can be learnt
# at this size and budget at all. A finished run is kept: a rerun trains only what is missing and resumes the evaluation.
#
#   scripts/longctx-compare.sh [OUT] [SEEDS]   (default OUT: runs/longctx-compare, SEEDS: "1 2 3")
#
# JOBS (default 2) trainings run at once, one thread each.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs/longctx-compare}
SEEDS=${2:-1 2 3}
JOBS=${JOBS:-2}
cargo build --release --quiet
export LETHE=target/release/lethe OUT
MECHANISMS="xl expire adaptive compressive infinity"

# Trains mechanism $1 with seed $2 into $OUT/runs/$1-s$2, unless a finished run is there
# (`full512`: Transformer-XL with a window of 512).
train_one() {
  local preset=longctx-cpu-$1 name=$1-s$2 extra=()
  [ "$1" = full512 ] && preset=longctx-cpu-xl extra=(--set memory.span=512)
  [ -f "$OUT/runs/$name/finished" ] && return 0
  "$LETHE" train -q -p "$preset" --seed "$2" --out "$OUT/runs" --name "$name" --overwrite --set train.threads=1 "${extra[@]}"
  touch "$OUT/runs/$name/finished"
  echo "trained $name"
}
export -f train_one

start=$(date +%s)
{ echo "full512 1"; for seed in $SEEDS; do for m in $MECHANISMS; do echo "$m $seed"; done; done; } |
  xargs -P "$JOBS" -n 2 bash -c 'train_one "$@"' _
echo "training took $(( $(date +%s) - start )) s"

runs=("$OUT/runs/full512-s1")
for m in $MECHANISMS; do for seed in $SEEDS; do runs+=("$OUT/runs/$m-s$seed"); done; done
"$LETHE" longeval --checkpoint "${runs[0]}" --compare "${runs[@]:1}" --out "$OUT/eval" \
  --suite passkey --lengths 512,1k,2k,4k,8k --depths 0,50,100 --samples 8 --seed 0
