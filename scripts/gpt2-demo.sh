#!/usr/bin/env bash
# The CPU demonstration (README, "Pretrained GPT-2 with long-term memory"):
# a tiny GPT-2-shaped model pretrained by lethe itself on a corpus that ships with
# Python (the standard library's reference topics, pydoc_data/topics.py, in Debian's
# libpython3.11-stdlib), then fine-tuned with and without the ∞-former's long-term
# memory, all evaluated on the test split, for each of SEEDS (pretraining included).
# Prints the perplexities side by side.
#
#   scripts/gpt2-demo.sh [OUT] [SEEDS]    (default OUT: runs, SEEDS: "1")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1}
scripts/demo-corpus.sh
cargo build --release --quiet
LETHE=target/release/lethe
for seed in $SEEDS; do
  $LETHE train --preset gpt2-tiny --data data/demo.txt --seed "$seed" --out "$OUT" --name "demo-pretrain-s$seed" --overwrite --quiet
  for run in finetune infinity; do
    $LETHE train --preset gpt2-tiny-$run --data data/demo.txt --seed "$seed" --init-from "$OUT/demo-pretrain-s$seed" --out "$OUT" --name "demo-$run-s$seed" --overwrite --quiet
  done
  for run in pretrain finetune infinity; do
    echo "demo-$run seed $seed: $($LETHE eval --checkpoint "$OUT/demo-$run-s$seed" --split test | head -1)"
  done
done
