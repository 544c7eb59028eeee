#!/usr/bin/env bash
# The word-level CPU demonstration (README, "Word-level models"): the
# ∞-former paper's appendix D at CPU size. A word vocabulary is built from a corpus that
# ships with Python (the standard library's reference topics, pydoc_data/topics.py, in
# Debian's libpython3.11-stdlib; words seen fewer than 3 times read as <unk>), then a
# Transformer-XL with the adaptive input and softmax is trained from scratch on it, with
# and without the ∞-former's long-term memory, for each of SEEDS; both are evaluated on
# the test split. Prints each run's test perplexity (per word, as the paper's Table 3).
#
#   scripts/words-demo.sh [OUT] [SEEDS]    (default OUT: runs, SEEDS: "1")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1}
scripts/demo-corpus.sh
cargo build --release --quiet
LETHE=target/release/lethe
$LETHE tokenizer words data/demo.txt --out data/demo-words --min-count 3 --overwrite
for seed in $SEEDS; do
  for run in words-tiny words-tiny-infinity; do
    $LETHE train --preset $run --data data/demo.txt --seed "$seed" --out "$OUT" --name "demo-$run-s$seed" --overwrite --quiet
    echo "$run seed $seed: $($LETHE eval --checkpoint "$OUT/demo-$run-s$seed" --split test | head -1)"
  done
done
