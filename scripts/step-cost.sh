#!/usr/bin/env bash
# The training step of the memories against Transformer-XL's (guide: Efficiency), in
# turns so that a machine whose speed drifts slows them alike: on the byte backbone at
# `enwik8-tiny` (Transformer-XL's window of 256, the ∞-former and the Compressive
# Transformer as the preset sizes them), and on a Llama-shaped decoder (`llama-tiny`'s
# shape, blocks of 128) at equal memory, 384 entries a layer. Random tokens; the
# bench's own output is written to OUT.
#
#   scripts/step-cost.sh [OUT] [ROUNDS]
#   (defaults: docs/results/cpu-step-cost, 12)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-docs/results/cpu-step-cost}
ROUNDS=${2:-12}
cargo build --release --quiet
LETHE=target/release/lethe
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
$LETHE bench -p enwik8-tiny --mechanism fixed:256 --mechanism infinity --mechanism compressive \
  --rounds "$ROUNDS" --bench-steps 10 --out "$WORK" 2>&1 | tee "$OUT/bench-enwik8-tiny.txt"
$LETHE bench -p llama-tiny --set train.block=128 --mechanism fixed:384 --mechanism infinity:384 \
  --mechanism expire:384 --rounds "$ROUNDS" --bench-steps 3 --out "$WORK" 2>&1 | tee "$OUT/bench-llama-tiny.txt"
