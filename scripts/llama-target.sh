#!/usr/bin/env bash
# Expire-Span fitted to a memory target (memory.expire.target) rather than at a span-loss
# weight: on each seed's llama-tiny of scripts/llama-learned.sh (OUT/llama-tiny-s<SEED>-hf),
# frozen fits as that script's, the weight starting at ALPHA and steered so that a layer
# keeps about TARGET memories, for each target in TARGETS; then the runs scored as there
# (test split, windows of CONTEXT tokens, token by token, uncapped and at 1/8 and 1/16
# beside the window). Writes OUT/expire-target<TARGET>-s<SEED>/, OUT/llama-target-s<SEED>/
# and the mean over seeds, OUT/llama-target.csv and .md.
#
#   scripts/llama-target.sh [OUT] [SEEDS] [TARGETS] [ALPHA] [STEPS] [CONTEXT] [TOKENS]
#   (defaults: runs, "1 2 3", "39 27", 1e-5, 200 steps, 512, 4096 tokens)
#
# LETHE, when set, is the binary run instead of this checkout's build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1 2 3}
TARGETS=${3:-39 27}
ALPHA=${4:-1e-5}
STEPS=${5:-200}
CONTEXT=${6:-512}
TOKENS=${7:-4096}
if [ -z "${LETHE:-}" ]; then
  cargo build --release --quiet
  LETHE=target/release/lethe
fi
for SEED in $SEEDS; do
  BASE="$OUT/llama-tiny-s$SEED-hf"
  if [ ! -f "$BASE/model.safetensors" ] || [ ! -f "$OUT/demo-test.txt" ]; then
    echo "$BASE: no pretrained model; run scripts/llama-learned.sh $OUT \"$SEED\" first" >&2
    exit 1
  fi
  LEARNED=()
  for TARGET in $TARGETS; do
    NAME="expire-target$TARGET-s$SEED"
    START=$(date +%s)
    $LETHE train --preset llama-tiny --init-from "$BASE" --data data/demo.txt --seed "$SEED" \
      --out "$OUT" --name "$NAME" --overwrite --quiet --steps "$STEPS" \
      --set 'memory.mechanism="expire"' --set memory.span="$CONTEXT" --set memory.expire.ramp=16 \
      --set memory.expire.alpha="$ALPHA" --set memory.expire.target="$TARGET" \
      --set memory.expire.init_fraction=0.5 --set train.freeze_base=true --set train.lr=1e-2 \
      --set train.warmup=10 --set model.dropout=0 --set train.eval_every=0 \
      --set train.checkpoint_every=0 --set train.eval_tokens=8192
    echo "$NAME: $STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/llama-target-cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  $LETHE eval --init-from "$BASE" --data "$OUT/demo-test.txt" --context "$CONTEXT" --max-tokens "$TOKENS" \
    --policies window --budgets 1/8,1/16 --learned "$(IFS=,; echo "${LEARNED[*]}")" \
    --out "$OUT/llama-target-s$SEED"
done
python3 scripts/seed-means.py "$OUT/llama-target-s{seed}/budget.csv" $SEEDS --name policy --key budget \
  --value ppl --memory mean_entries --out "$OUT/llama-target" \
  --title "Test-split perplexity, Expire-Span fitted to a memory target" --bracket "mean entries a layer held"
