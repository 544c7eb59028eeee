#!/usr/bin/env bash
# The control for Expire-Span fitted with low-rank adapters (scripts/llama-learned.sh's
# LORA_ALPHAS): the adapters also tune the pretrained model on the corpus, so the same
# adapters are fitted with a fixed window over the whole context (no memory of its own,
# the same steps, rank and learning rate), folded into a Hugging Face folder by `lethe
# export`, and the key-value cache policies swept on that model as on the pretrained one.
# Reads the pretrained models llama-learned.sh left in OUT (llama-tiny-s<SEED>-hf);
# writes OUT/llama-lora-control-s<SEED>/ and the mean over seeds,
# OUT/llama-lora-control.csv and .md.
#
#   scripts/llama-lora-control.sh [OUT] [SEEDS] [STEPS] [CONTEXT] [TOKENS]
#   (defaults: runs, "1 2 3", 100 steps, 512, 4096 tokens, as llama-learned.sh's)
#
# LETHE, when set, is the binary run instead of this checkout's build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1 2 3}
STEPS=${3:-100}
CONTEXT=${4:-512}
TOKENS=${5:-4096}
if [ -z "${LETHE:-}" ]; then
  cargo build --release --quiet
  LETHE=target/release/lethe
fi
for SEED in $SEEDS; do
  BASE="$OUT/llama-tiny-s$SEED-hf"
  if [ ! -f "$BASE/model.safetensors" ]; then
    echo "$BASE: no pretrained model; run scripts/llama-learned.sh $OUT \"$SEED\" first" >&2
    exit 1
  fi
  NAME="window-lora-s$SEED"
  START=$(date +%s)
  $LETHE train --preset llama-tiny --init-from "$BASE" --data data/demo.txt --seed "$SEED" \
    --out "$OUT" --name "$NAME" --overwrite --quiet --steps "$STEPS" \
    --set 'memory.mechanism="fixed"' --set memory.span="$CONTEXT" \
    --set train.freeze_base=true --set train.lora_rank=8 --set train.lr=1e-3 --set train.warmup=10 \
    --set model.dropout=0 --set train.eval_every=0 --set train.checkpoint_every=0 --set train.eval_tokens=8192
  echo "$NAME: $STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/llama-lora-control-cost.txt"
  rm -rf "$OUT/$NAME-hf"
  $LETHE export --checkpoint "$OUT/$NAME" --out "$OUT/$NAME-hf"
  $LETHE eval --init-from "$OUT/$NAME-hf" --data "$OUT/demo-test.txt" --context "$CONTEXT" --max-tokens "$TOKENS" \
    --policies window,streaming,h2o,tova,snapkv:window=16 --budgets 1/2,1/4,1/8,1/16 \
    --out "$OUT/llama-lora-control-s$SEED"
done
python3 scripts/seed-means.py "$OUT/llama-lora-control-s{seed}/budget.csv" $SEEDS --name policy --key budget \
  --value ppl --memory mean_entries --out "$OUT/llama-lora-control" \
  --title "Test-split perplexity of the model tuned by the adapters" --bracket "mean entries a layer held"
