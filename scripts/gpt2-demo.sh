#!/usr/bin/env bash
# The CPU demonstration of issue 22 (README, "Pretrained GPT-2 with long-term memory"):
# a tiny GPT-2-shaped model pretrained by lethe itself on a corpus that ships with
# Python (the standard library's reference topics, pydoc_data/topics.py, in Debian's
# libpython3.11-stdlib), then fine-tuned with and without the ∞-former's long-term
# memory, both evaluated on the test split. Prints the perplexities side by side.
#
#   scripts/gpt2-demo.sh [OUT]    (default OUT: runs)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
mkdir -p data
python3 - <<'PY'
from pydoc_data.topics import topics
with open("data/demo.txt", "w") as f:
    for key in sorted(topics):
        f.write(topics[key].strip() + "\n\n")
PY
cargo build --release --quiet
LETHE=target/release/lethe
$LETHE train --preset gpt2-tiny --data data/demo.txt --out "$OUT" --name demo-pretrain --overwrite --quiet
for run in finetune infinity; do
  $LETHE train --preset gpt2-tiny-$run --data data/demo.txt --init-from "$OUT/demo-pretrain" --out "$OUT" --name demo-$run --overwrite --quiet
done
for run in pretrain finetune infinity; do
  echo "demo-$run: $($LETHE eval --checkpoint "$OUT/demo-$run" --split test | head -1)"
done
