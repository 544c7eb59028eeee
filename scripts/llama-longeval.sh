#!/usr/bin/env bash
# The long-context suite at equal memory on a pretrained decoder (guide: Pretrained
# decoders, "The long-context suite at equal memory"): for each seed, a Llama-shaped model
# pretrained by lethe on the passkey task (preset llama-tiny-passkey), written as a
# Hugging Face folder; Expire-Span fitted onto it with the pretrained weights frozen at
# each span-loss weight in ALPHAS (on passkey samples of FIT_LENGTHS tokens, only the
# answers scored; FIT_STEPS steps), with low-rank adapters on the attention maps too at
# each weight in LORA_ALPHAS; the ∞-former fitted the same way at each size in INFINITY
# (WINDOW:BLOCK:BASIS); then `lethe longeval --init-from` reads passkey at LENGTHS under
# every key-value cache policy at each of BUDGETS entries a layer, with the learned runs
# beside them. Then the mean over seeds of each policy's accuracy by length, with the
# memory each held when the answer began: OUT/llama-longeval.csv and .md.
#
#   scripts/llama-longeval.sh [OUT] [SEEDS] [BUDGETS] [LENGTHS] [ALPHAS] [INFINITY] [SAMPLES]
#   (defaults: runs/llama-longeval, "1 2 3", 64, 224,288,352, "1e-4 1e-3", "16:16:32", 8;
#   the lengths are the pretraining's, the only ones at which the model retrieves)
#
# FIT_STEPS (default 200) and INF_STEPS (default 400) set the fits' steps, LORA_ALPHAS
# (default 1e-3) the span-loss weights of the fits with adapters of rank 8, HEAD_ALPHAS
# (default none) those of frozen fits with a span predictor per key-value head
# (memory.expire.per_head). Every seed
# fits and evaluates on the one model pretrained with seed BASE_SEED (default 1; a user's
# pretrained model is one), the seeds varying the fits and the samples read; BASE_SEED=
# (empty) pretrains a model for each seed. LETHE, when set, is the binary run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs/llama-longeval}
SEEDS=${2:-1 2 3}
BUDGETS=${3:-64}
LENGTHS=${4:-224,288,352}
ALPHAS=${5:-1e-4 1e-3}
INFINITY=${6:-16:16:32}
SAMPLES=${7:-8}
BASE_SEED=${BASE_SEED-1}
FIT_STEPS=${FIT_STEPS:-200}
LORA_ALPHAS=${LORA_ALPHAS:-1e-3}
HEAD_ALPHAS=${HEAD_ALPHAS:-}
INF_STEPS=${INF_STEPS:-400}
FIT_LENGTHS=${FIT_LENGTHS:-[224, 288, 352]}
# LETHE names a lethe binary to run instead of building this checkout's.
if [ -z "${LETHE:-}" ]; then
  cargo build --release --quiet
  LETHE=target/release/lethe
fi
mkdir -p "$OUT"
for SEED in $SEEDS; do
  PRETRAIN_SEED=${BASE_SEED:-$SEED}
  BASE="passkey-s$PRETRAIN_SEED"
  RUN="$OUT/$BASE"
  if [ ! -f "$RUN/finished" ]; then
    START=$(date +%s)
    $LETHE train --preset llama-tiny-passkey --seed "$PRETRAIN_SEED" --out "$OUT" --name "$BASE" --overwrite --quiet
    echo "$BASE: pretrained in $(( $(date +%s) - START )) s" | tee -a "$OUT/cost.txt"
    touch "$RUN/finished"
  fi
  [ -f "$RUN-hf/config.json" ] && [ "$RUN-hf/config.json" -nt "$RUN/checkpoint.safetensors" ] ||
    { rm -rf "$RUN-hf" && $LETHE export --checkpoint "$RUN" --out "$RUN-hf"; }
  FIT=(--preset llama-tiny-passkey --init-from "$RUN-hf" --seed "$SEED" --out "$OUT" --overwrite --quiet
    --set train.freeze_base=true --set model.dropout=0
    --set "data.longctx.lengths=$FIT_LENGTHS" --set train.eval_every=0 --set train.checkpoint_every=0)
  LEARNED=()
  for ALPHA in $ALPHAS; do
    NAME="expire-a$ALPHA-s$SEED"
    START=$(date +%s)
    $LETHE train "${FIT[@]}" --name "$NAME" --steps "$FIT_STEPS" \
      --set 'memory.mechanism="expire"' --set memory.span=512 --set train.block=64 --set memory.expire.ramp=16 \
      --set memory.expire.alpha="$ALPHA" --set memory.expire.init_fraction=0.5 --set train.lr=1e-2 --set train.warmup=10
    echo "$NAME: $FIT_STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  for ALPHA in $HEAD_ALPHAS; do
    NAME="expire-heads-a$ALPHA-s$SEED"
    START=$(date +%s)
    $LETHE train "${FIT[@]}" --name "$NAME" --steps "$FIT_STEPS" \
      --set 'memory.mechanism="expire"' --set memory.span=512 --set train.block=64 --set memory.expire.ramp=16 \
      --set memory.expire.alpha="$ALPHA" --set memory.expire.init_fraction=0.5 --set train.lr=1e-2 --set train.warmup=10 \
      --set memory.expire.per_head=true
    echo "$NAME: $FIT_STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  for ALPHA in $LORA_ALPHAS; do
    NAME="expire-lora-a$ALPHA-s$SEED"
    START=$(date +%s)
    $LETHE train "${FIT[@]}" --name "$NAME" --steps "$FIT_STEPS" \
      --set 'memory.mechanism="expire"' --set memory.span=512 --set train.block=64 --set memory.expire.ramp=16 \
      --set memory.expire.alpha="$ALPHA" --set memory.expire.init_fraction=0.5 --set train.lr=1e-3 \
      --set train.memory_lr=1e-2 --set train.lora_rank=8 --set train.warmup=10
    echo "$NAME: $FIT_STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  for SIZE in $INFINITY; do
    IFS=: read -r WINDOW BLOCK BASIS <<<"$SIZE"
    NAME="infinity-w$WINDOW-b$BLOCK-n$BASIS-s$SEED"
    START=$(date +%s)
    $LETHE train "${FIT[@]}" --name "$NAME" --steps "$INF_STEPS" \
      --set 'memory.mechanism="infinity"' --set memory.span="$WINDOW" --set train.block="$BLOCK" \
      --set memory.infinity.basis="$BASIS" --set memory.infinity.zero_output=true \
      --set train.batch=16 --set train.lr=1e-3 --set train.warmup=20
    echo "$NAME: $INF_STEPS steps in $(( $(date +%s) - START )) s" | tee -a "$OUT/cost.txt"
    LEARNED+=("$OUT/$NAME")
  done
  $LETHE longeval --init-from "$RUN-hf" --policies full,window,streaming,h2o,tova,snapkv:window=16 \
    --budgets "$BUDGETS" --learned "$(IFS=,; echo "${LEARNED[*]}")" --suite passkey --lengths "$LENGTHS" \
    --depths 0,50,100 --samples "$SAMPLES" --seed "$SEED" --out "$OUT/eval-s$SEED" | tail -n 40
done
# The mean over seeds of each policy's accuracy by length (runs named without the seed).
python3 scripts/seed-means.py "$OUT/eval-s{seed}/compare.csv" $SEEDS --name group --key length \
  --value accuracy --memory memory --digits 2 --out "$OUT/llama-longeval" \
  --title "Passkey accuracy by length (tokens)" --bracket "entries a layer held when the answer began"
