#!/usr/bin/env bash
# Perplexity under a key-value cache budget (guide: Pretrained decoders): a Llama-shaped
# model pretrained by lethe on the demonstration corpus (preset llama-tiny), written as
# a Hugging Face folder (lethe export), then scored on the corpus's test split (its last
# 5% of bytes, which training never reads) in windows of CONTEXT tokens, under every
# policy at 1/2, 1/4, 1/8 and 1/16 of the window, token by token (SnapKV observing the
# last 16 queries, as its default 64 would not fit under the smallest budget).
#
#   scripts/llama-budget.sh [OUT] [SEED] [CONTEXT] [TOKENS]
#   (defaults: runs, 1, 512, 4096 scored tokens)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEED=${2:-1}
CONTEXT=${3:-512}
TOKENS=${4:-4096}
scripts/demo-corpus.sh
cargo build --release --quiet
LETHE=target/release/lethe
RUN="$OUT/llama-tiny-s$SEED"
if [ ! -f "$RUN/checkpoint.safetensors" ]; then
  $LETHE train --preset llama-tiny --data data/demo.txt --seed "$SEED" --out "$OUT" --name "llama-tiny-s$SEED" --overwrite --quiet
fi
rm -rf "$RUN-hf"
$LETHE export --checkpoint "$RUN" --out "$RUN-hf"
# The test split as lethe's file source cuts it: the bytes from round(0.95 n) on.
python3 - "$OUT/demo-test.txt" <<'PY'
import sys
data = open("data/demo.txt", "rb").read()
open(sys.argv[1], "w").write(data[round(0.95 * len(data)):].decode("utf-8", "ignore"))
PY
$LETHE eval --init-from "$RUN-hf" --data "$OUT/demo-test.txt" --context "$CONTEXT" --max-tokens "$TOKENS" \
  --policies window,streaming,h2o,tova,snapkv:window=16 --budgets 1/2,1/4,1/8,1/16 --out "$OUT/llama-budget-s$SEED"
