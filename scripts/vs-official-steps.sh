#!/usr/bin/env bash
# Does lethe compute what the official Expire-Span code computes? Both train the comparison
# model (2 layers, d 256, 4 heads, FFN 1024, pre-norm, batch 8 x 256, Adam 3e-4, clip
# 0.3; Expire-Span max span SPAN, ramp 64, loss 1e-6, initial fraction 0.1) from the same
# weights on the same streams, and each step's training loss and gradient norm are
# printed side by side (with STEPS of 4 or more, the mean loss of the last quarter too).
#
#   scripts/vs-official-steps.sh OFFICIAL_CHECKOUT
#
# lethe runs with `memory.expire.as_official = true`: no attention to oneself, a first
# cache of zero states, raw states in the cache normalised by the current pre-norm, and
# `pre_div` outside the bias, as the official code. Its initial weights (`model.init =
# official`, seed SEED) come from a one-step run at a learning rate of 1e-30, which
# leaves them as they were to float32 (the span predictors' zero `w` moves by 1e-30);
# scripts/official-steps.py loads them into the official model (its own files
# untouched, nothing patched: only the model and its loss are used) and trains it with
# the official trainer's step. TORCH_SEED=N keeps the official model's own PyTorch
# initialisation (seed N) instead, with lethe's vocabulary (256 byte outputs; the
# official data reader makes one output per symbol of the corpus): a seed of the
# official code on lethe's streams, for comparing learning curves rather than steps.
# Environment: STEPS (5), SEED (1), SPAN (512), PRE_DIV (1),
# THREADS (2), OUT (runs/vs-official-steps), LETHE (target/release/lethe), PYTHON
# (.venv/bin/python, which has torch 2.11), CORPUS (as scripts/vs-official.sh: the first
# 1.2 MB of the Rust toolchain's HTML books).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 OFFICIAL_CHECKOUT" >&2; exit 2; }
SRC=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: $1: no such folder (a transformer-sequential checkout)" >&2; exit 2; }
[ -f "$SRC/models/expire_span.py" ] || { echo "$SRC is not a transformer-sequential checkout" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS=${STEPS:-5}; SEED=${SEED:-1}; SPAN=${SPAN:-512}; PRE_DIV=${PRE_DIV:-1}; THREADS=${THREADS:-2}
for n in STEPS SEED SPAN THREADS ${TORCH_SEED:+TORCH_SEED}; do [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "$0: $n=${!n}: a positive whole number" >&2; exit 2; }; done
[[ $PRE_DIV =~ ^[0-9]+(\.[0-9]+)?$ && ! $PRE_DIV =~ ^0+(\.0+)?$ ]] || { echo "$0: PRE_DIV=$PRE_DIV: a positive number" >&2; exit 2; }
OUT=${OUT:-runs/vs-official-steps}; LETHE=${LETHE:-$ROOT/target/release/lethe}; PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)

. "$ROOT/scripts/rust-html.sh"
[ -n "${CORPUS:-}" ] || { CORPUS=$OUT/corpus.txt; rust_html "$CORPUS" 1200000; }
[ -s "$CORPUS" ] || { echo "$0: CORPUS=$CORPUS is empty or missing" >&2; exit 2; }
# One pass at most: 8 streams of the training split (90%), 256 bytes a step, plus a target.
per=$(( $(stat -c %s "$CORPUS") * 9 / 10 / 8 ))
[ $((STEPS * 256 + 1)) -le "$per" ] || { echo "$0: STEPS=$STEPS needs $((STEPS * 256 + 1)) bytes per stream; $CORPUS gives $per (at most $(( (per - 1) / 256 )) steps)" >&2; exit 2; }

lethe() { # NAME STEPS LR
    "$LETHE" train -p enwik8-tiny --data "$CORPUS" --out "$OUT" --name "$1" --overwrite --no-eval --steps "$2" --seed "$SEED" \
        --set model.layers=2 --set model.d_model=256 --set model.heads=4 --set model.d_ffn=1024 --set model.pre_norm=true \
        --set model.dropout=0 --set model.init=official --set train.batch=8 --set train.block=256 --set train.accum=1 \
        --set train.threads="$THREADS" --set train.lr="$3" --set train.warmup=0 --set train.grad_clip=0.3 \
        --set train.schedule=constant --set train.log_every=1 --set memory.mechanism=expire --set memory.span="$SPAN" \
        --set memory.expire.ramp=64 --set memory.expire.alpha=1e-6 --set memory.expire.init_fraction=0.1 \
        --set memory.expire.pre_div="$PRE_DIV" --set memory.expire.as_official=true > "$OUT/$1.log" 2>&1 \
        || { echo "$0: lethe failed; see $OUT/$1.log" >&2; exit 1; }
}
lethe init 1 1e-30
lethe steps "$STEPS" 3e-4
"$PYTHON" "$ROOT/scripts/official-steps.py" "$SRC" "$OUT/init/checkpoint.safetensors" "$CORPUS" "$STEPS" "$SPAN" "$PRE_DIV" ${TORCH_SEED:-} \
    > "$OUT/official.txt" 2> "$OUT/official.log" || { echo "$0: the official code failed; see $OUT/official.log" >&2; exit 1; }
"$PYTHON" - "$OUT/steps/metrics.jsonl" "$OUT/official.txt" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
ours = {r["step"]: r for r in ours if r.get("split") == "train"}
theirs = {int(s): (float(l), float(g)) for s, l, g in (line.split() for line in open(sys.argv[2]))}
print("| step | lethe loss | official loss | difference | lethe grad norm | official grad norm |")
print("|---|---|---|---|---|---|")
worst = 0.0
for step in sorted(theirs):
    l, g = theirs[step]
    r = ours[step]
    worst = max(worst, abs(r["loss"] - l))
    print(f"| {step} | {r['loss']:.6f} | {l:.6f} | {r['loss'] - l:+.1e} | {r['grad_norm']:.6f} | {g:.6f} |")
print(f"largest loss difference: {worst:.1e} nats")
if len(theirs) >= 4:
    import math
    last = sorted(theirs)[-(len(theirs) // 4):]
    mean = lambda xs: sum(xs) / len(xs) / math.log(2)
    print(f"mean of the last quarter of the steps, bits per byte: lethe {mean([ours[s]['loss'] for s in last]):.4f}, "
          f"official {mean([theirs[s][0] for s in last]):.4f}")
PY
