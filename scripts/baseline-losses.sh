#!/usr/bin/env bash
# Behaviour fingerprint for refactors: trains every mechanism and every task for
# a few steps (fixed seed, 1 thread) and prints each logged training loss and validation
# loss with full precision. Run it before and after a change that must not change
# behaviour, and diff the two outputs: they must be identical.
# Usage: scripts/baseline-losses.sh > before.txt
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh >/dev/null
BIN="$PWD/target/release/lethe"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
SMALL=(--set model.layers=2 --set model.d_model=32 --set model.heads=2 --set model.d_ffn=64
       --set train.threads=1 --set train.log_every=1 --set train.eval_every=3 --set train.checkpoint_every=3 --seed 7)
python3 -c "import random; r = random.Random(0); w = ['the', 'memory', 'span', 'of', 'a', 'model', 'keeps', 'forgets', 'what', 'it', 'needs', '.', ',']
print(' '.join(r.choice(w) for _ in range(40000)))" > corpus.bin     # a seeded byte file for the `file` source
mkdir books && for i in $(seq 1 40); do head -c $((5000 * i)) corpus.bin | tail -c 5000 > books/b$i.txt; done
losses() { # run name, then its losses: train per step, valid at each evaluation
  python3 - "$1" <<'PY'
import json, sys
for line in open(f"runs/{sys.argv[1]}/metrics.jsonl"):
    r = json.loads(line)
    keys = [k for k in ("loss", "aux_loss", "grad_norm", "return", "success", "policy_loss", "value_loss") if k in r and r[k] is not None]
    print(sys.argv[1], r.get("split"), r.get("step"), " ".join(f"{k}={r[k]!r}" for k in keys))
PY
}
run() { # name, then train flags
  local name="$1"; shift
  "$BIN" train -q --out runs --name "$name" "${SMALL[@]}" "$@" > /dev/null
  losses "$name"
}
for m in fixed expire adaptive compressive infinity; do
  run "copy-$m" --steps 6 --set memory.mechanism=$m --set train.block=16 --set memory.span=32 --set train.batch=8 --set data.copy.distance_min=4 --set data.copy.distance_max=12 \
    --set memory.compressive.slots=8 --set memory.infinity.basis=8 --set train.eval_tokens=256 --set data.copy.eval_tokens=512
done
run collision   -p collision-tiny   --steps 4 --set train.eval_tokens=256 --set data.collision.eval_tokens=512 --set data.collision.steps=200
run instruction -p instruction-tiny --steps 4 --set train.eval_tokens=256
run sorting     -p sorting-infinity-tiny --steps 4 --set train.eval_tokens=256 --set data.sorting.length=24
run file        -p enwik8-tiny --data corpus.bin --steps 4 --set train.eval_tokens=256
run books       -p books-tiny  --data books --steps 4 --set train.eval_tokens=256
run corridor    -p corridor-small --steps 4 --set rl.eval_episodes=4
run portal      -p portal-expire-small --steps 4 --set rl.eval_episodes=4
# Resume reproduces the straight run.
"$BIN" train -q --out runs --name resumed "${SMALL[@]}" --steps 6 --stop-after 3 > /dev/null
"$BIN" train -q --out runs --name resumed "${SMALL[@]}" --steps 6 --resume > /dev/null
losses resumed
