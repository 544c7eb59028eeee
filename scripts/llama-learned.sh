#!/usr/bin/env bash
# Learned forgetting against the key-value cache policies at equal memory (guide:
# Pretrained decoders): for each seed, the llama-tiny model pretrained by lethe
# (scripts/llama-budget.sh's, trained here when missing), Expire-Span fitted onto it with
# the pretrained weights frozen (train.freeze_base: only the span predictors learn) at
# each span-loss weight in ALPHAS, then every policy and every Expire-Span run scored on
# the corpus's test split in windows of CONTEXT tokens, token by token, at 1/2 to 1/16 of
# the window (Expire-Span capped there, its least remaining spans deleted first) and
# uncapped (the memory its spans keep). The ∞-former fitted the same way at each size in
# INFINITY (WINDOW:BLOCK:BASIS, its long-term memory's output starting at zero; INF_STEPS
# steps of 16 streams of BLOCK tokens at 1e-3), scored once, at the memory it holds (the
# window, a block waiting to be absorbed, the basis), in blocks of BLOCK. Then the mean
# over seeds, by policy and budget, with the mean entries each layer held:
# OUT/llama-learned.csv and .md.
#
#   scripts/llama-learned.sh [OUT] [SEEDS] [ALPHAS] [STEPS] [CONTEXT] [TOKENS] [INFINITY] [INF_STEPS]
#   (defaults: runs, "1 2 3", "3e-5 1e-4 3e-4", 100 fine-tuning steps, 512, 4096 tokens,
#   "16:16:32 8:8:16", 400 steps)
#
# LORA_ALPHAS (default none) adds, at each span-loss weight, Expire-Span fitted with
# low-rank adapters of rank 8 on the attention maps beside the predictors (adapters at
# 1e-3, predictors at 1e-2), and HEAD_ALPHAS (default none) frozen fits with a span
# predictor per key-value head (memory.expire.per_head). LETHE, when set, is the binary run
# instead of this checkout's build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1 2 3}
ALPHAS=${3:-3e-5 1e-4 3e-4}
STEPS=${4:-100}
CONTEXT=${5:-512}
TOKENS=${6:-4096}
INFINITY=${7:-16:16:32 8:8:16}
INF_STEPS=${8:-400}
LORA_ALPHAS=${LORA_ALPHAS:-}
HEAD_ALPHAS=${HEAD_ALPHAS:-}
scripts/demo-corpus.sh
if [ -z "${LETHE:-}" ]; then
  cargo build --release --quiet
  LETHE=target/release/lethe
fi
mkdir -p "$OUT"
# The test split as lethe's file source cuts it: the bytes from round(0.95 n) on.
python3 - "$OUT/demo-test.txt" <<'PY'
import sys
data = open("data/demo.txt", "rb").read()
open(sys.argv[1], "w").write(data[round(0.95 * len(data)):].decode("utf-8", "ignore"))
PY
for SEED in $SEEDS; do
  RUN="$OUT/llama-tiny-s$SEED"
  if [ ! -f "$RUN/checkpoint.safetensors" ]; then
    $LETHE train --preset llama-tiny --data data/demo.txt --seed "$SEED" --out "$OUT" --name "llama-tiny-s$SEED" --overwrite --quiet
  fi
  rm -rf "$RUN-hf"
  $LETHE export --checkpoint "$RUN" --out "$RUN-hf"
  LEARNED=()
  # Expire-Span fitted as NAME at span-loss weight ALPHA, with the further settings given.
  fit_expire() {
    local NAME=$1 ALPHA=$2 START
    shift 2
    START=$(date +%s)
    $LETHE train --preset llama-tiny --init-from "$RUN-hf" --data data/demo.txt --seed "$SEED" \
      --out "$OUT" --name "$NAME" --overwrite --quiet --steps "$STEPS" \
      --set 'memory.mechanism="expire"' --set memory.span="$CONTEXT" --set memory.expire.ramp=16 \
      --set memory.expire.alpha="$ALPHA" --set memory.expire.init_fraction=0.5 \
      --set train.freeze_base=true --set train.warmup=10 --set model.dropout=0 \
      --set train.eval_every=0 --set train.checkpoint_every=0 --set train.eval_tokens=8192 "$@"
    echo "$NAME: $STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/llama-learned-cost.txt"
    LEARNED+=("$OUT/$NAME")
  }
  for ALPHA in $ALPHAS; do
    fit_expire "expire-a$ALPHA-s$SEED" "$ALPHA" --set train.lr=1e-2
  done
  for ALPHA in $LORA_ALPHAS; do
    fit_expire "expire-lora-a$ALPHA-s$SEED" "$ALPHA" --set train.lr=1e-3 --set train.memory_lr=1e-2 \
      --set train.lora_rank=8
  done
  for ALPHA in $HEAD_ALPHAS; do
    fit_expire "expire-heads-a$ALPHA-s$SEED" "$ALPHA" --set train.lr=1e-2 --set memory.expire.per_head=true
  done
  for SIZE in $INFINITY; do
    IFS=: read -r WINDOW BLOCK BASIS <<<"$SIZE"
    NAME="infinity-w$WINDOW-b$BLOCK-n$BASIS-s$SEED"
    START=$(date +%s)
    $LETHE train --preset llama-tiny --init-from "$RUN-hf" --data data/demo.txt --seed "$SEED" \
      --out "$OUT" --name "$NAME" --overwrite --quiet --steps "$INF_STEPS" \
      --set 'memory.mechanism="infinity"' --set memory.span="$WINDOW" --set train.block="$BLOCK" \
      --set memory.infinity.basis="$BASIS" --set memory.infinity.zero_output=true \
      --set train.batch=16 --set train.freeze_base=true --set train.lr=1e-3 --set train.warmup=20 \
      --set model.dropout=0 --set train.eval_every=0 --set train.checkpoint_every=0 --set train.eval_tokens=8192
    echo "$NAME: $INF_STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/llama-learned-cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  $LETHE eval --init-from "$RUN-hf" --data "$OUT/demo-test.txt" --context "$CONTEXT" --max-tokens "$TOKENS" \
    --policies window,streaming,h2o,tova,snapkv:window=16 --budgets 1/2,1/4,1/8,1/16 \
    --learned "$(IFS=,; echo "${LEARNED[*]}")" --out "$OUT/llama-learned-s$SEED"
done
# The mean over seeds of each policy at each budget (Expire-Span runs named by alpha).
python3 scripts/seed-means.py "$OUT/llama-learned-s{seed}/budget.csv" $SEEDS --name policy --key budget \
  --value ppl --memory mean_entries --out "$OUT/llama-learned" --title "Test-split perplexity" \
  --bracket "mean entries a layer held"
