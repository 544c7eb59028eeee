#!/usr/bin/env bash
# lethe against the official Expire-Span code (facebookresearch/transformer-sequential)
# on this machine's CPU, as the efficiency comparison measures them: the same model (2 layers, d 256,
# 4 heads, FFN 1024, batch 8 x 256, pre-norm, Adam 3e-4, clip 0.3, no dropout), the
# same byte corpus, the same number of training steps, the two programs alternating,
# whole-process wall time; medians over the rounds.
#
#   scripts/vs-official.sh OFFICIAL_CHECKOUT [ARM...]
#
# ARM is `expire:L` (Expire-Span, maximum span L; ramp 64, loss 1e-6, initial
# fraction 0.1, pre-div 1), `adaptive:L` (Adaptive-Span, ramp 32, loss 2e-6, initial
# ratio 0, the official `--adapt-span-cache`) or `fixed:L` (Transformer-XL span L). Default: expire:512
# expire:2048 expire:16384. Environment: ROUNDS (3), STEPS (80), THREADS (2),
# OUT (runs/vs-official), LETHE (target/release/lethe), PYTHON (.venv/bin/python, which
# has torch 2.11), CORPUS (a text file; default: the first 1.2 MB of the HTML of four
# books shipped with the Rust toolchain, as docs.sh's enwik8 stand-in, so that the same
# toolchain gives the same bytes every time), PARTS (1: the steps in PARTS equal parts,
# each program's mean loss reported for each, so that the last part shows where
# training ends; STEPS must divide by it), LETHE_INIT (official: lethe's `model.init`,
# `official` as the official code initialises, or `kaiming`, lethe's default).
#
# Round r trains lethe with `--seed r`; the official code has no seed flag and draws its
# initialisation and starting offset afresh every run, so the rounds are also seeds and
# the loss columns are medians over them. The loss is the mean training loss of all the
# steps, and of the last of PARTS parts; with STEPS=500 (one pass over the corpus's
# training split: 8 x 256 bytes a step) every byte is scored before it is trained on, so
# these are held-out figures too:
#
#   ROUNDS=3 STEPS=500 PARTS=4 scripts/vs-official.sh OFFICIAL_CHECKOUT expire:512 expire:2048
#
# The official code is copied to $OUT/official and patched to run as one CPU process
# (its own files are not touched):
# - distributed.py: no process group, rank 0 of 1, no CUDA device; the model wrapper
#   is a plain module with `.module`; the statistics are not reduced;
# - main.py: `torch.cuda.max_memory_allocated` reads 0, the thread count is $THREADS;
# - data.py: its cached corpus is read with `weights_only=False` (torch >= 2.6);
# - utils/logger.py: tensorboard and matplotlib are not imported (nothing is plotted),
#   the training loss is printed with 4 decimals instead of 2;
# - trainer.py: validation is skipped (lethe runs with --no-eval), so both programs
#   run the training steps and nothing else.
# Its corpus is the same bytes written as space-separated integers, one line per line
# of text (the enwik8 preparation of the official data script), each line's newline
# byte (10) written too: the official reader drops the line breaks themselves, and
# otherwise the official code reads no newlines (1.2% fewer tokens than lethe).
set -euo pipefail

usage() { echo "usage: $0 OFFICIAL_CHECKOUT [expire:L|adaptive:L|fixed:L ...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
SRC=$1; shift
[ -f "$SRC/main.py" ] && [ -f "$SRC/models/expire_span.py" ] || { echo "$SRC is not a transformer-sequential checkout" >&2; exit 2; }
ARMS=("$@"); [ ${#ARMS[@]} -gt 0 ] || ARMS=(expire:512 expire:2048 expire:16384)
for arm in "${ARMS[@]}"; do [[ $arm =~ ^(expire|adaptive|fixed):[0-9]+$ ]] || { echo "bad arm '$arm': expire:L, adaptive:L or fixed:L" >&2; exit 2; }; done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-80}; THREADS=${THREADS:-2}; PARTS=${PARTS:-1}; LETHE_INIT=${LETHE_INIT:-official}
for n in ROUNDS STEPS THREADS PARTS; do [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "$0: $n=${!n}: a positive whole number" >&2; exit 2; }; done
[ $((STEPS % PARTS)) -eq 0 ] || { echo "$0: STEPS=$STEPS does not divide into PARTS=$PARTS" >&2; exit 2; }
[[ $LETHE_INIT =~ ^(official|kaiming)$ ]] || { echo "$0: LETHE_INIT=$LETHE_INIT: official or kaiming" >&2; exit 2; }
OUT=${OUT:-runs/vs-official}; LETHE=${LETHE:-$ROOT/target/release/lethe}; PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)

# The corpus, split 90 / 5 / 5 (lethe by bytes, the official code by lines).
. "$ROOT/scripts/rust-html.sh"
[ -n "${CORPUS:-}" ] || { CORPUS=$OUT/corpus.txt; rust_html "$CORPUS" 1200000; }
[ -s "$CORPUS" ] || { echo "$0: CORPUS=$CORPUS is empty or missing" >&2; exit 2; }
CORPUS=$(cd "$(dirname "$CORPUS")" && pwd)/$(basename "$CORPUS")
echo "corpus: $CORPUS ($(stat -c %s "$CORPUS") bytes, sha256 $(sha256sum "$CORPUS" | cut -c1-16))"

# The patched copy of the official code and its corpus.
OFF=$OUT/official
# (Built again when the corpus or the patches change.)
PATCHED="patches 3, corpus $CORPUS"
if [ ! -f "$OFF/.patched" ] || [ "$(cat "$OFF/.patched")" != "$PATCHED" ]; then
    rm -rf "$OFF"; mkdir -p "$OFF"; cp -r "$SRC"/. "$OFF"/; rm -rf "$OFF/.git"
    "$PYTHON" - "$OFF" "$CORPUS" <<'EOF'
import pathlib, sys
off, corpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def patch(name, old, new):
    p = off / name
    s = p.read_text()
    assert old in s, (name, old)
    p.write_text(s.replace(old, new))
patch("distributed.py", 'torch.distributed.init_process_group(backend="nccl", init_method="env://")\n    args.rank = args.local_rank = torch.distributed.get_rank()\n    args.world_size = torch.distributed.get_world_size()\n    torch.cuda.set_device(args.local_rank)',
      'args.rank = args.local_rank = 0\n    args.world_size = 1')
patch("distributed.py", 'def wrap_model(args, model):\n    model = model.to(args.device)',
      'class Single(nn.Module):\n    def __init__(self, module):\n        super().__init__()\n        self.module = module\n\n    def forward(self, *a, **k):\n        return self.module(*a, **k)\n\n\ndef wrap_model(args, model):\n    return Single(model.to(args.device))\n    model = model.to(args.device)')
patch("distributed.py", 'def collect_stat(args, stat_train, stat_val, gpu_mem):\n', 'def collect_stat(args, stat_train, stat_val, gpu_mem):\n    return stat_train, stat_val, gpu_mem\n')
patch("main.py", "torch.cuda.max_memory_allocated()", "0")
patch("main.py", "torch.cuda.reset_max_memory_allocated()", "pass")
patch("main.py", "def main(args):\n", "def main(args):\n    import os\n    torch.set_num_threads(int(os.environ['THREADS']))\n")
patch("utils/logger.py", "from torch.utils.tensorboard import SummaryWriter\n\nimport matplotlib\nimport matplotlib.pyplot as plt\n\nmatplotlib.use(\"Agg\")\n", "")
patch("utils/logger.py", "train: {:.2f}bpc", "train: {:.4f}bpc")
patch("data.py", "corpus = torch.load(corpus_path)", "corpus = torch.load(corpus_path, weights_only=False)")
patch("trainer.py", "    labels = None\n", "    if test_only:\n        return {'loss': 0.0}, train_pos, h_cache\n    labels = None\n")
text = corpus.read_bytes()
lines = text.split(b"\n")
cut1, cut2 = int(len(lines) * 0.9), int(len(lines) * 0.95)
data = off / "data" / "bytes"
data.mkdir(parents=True, exist_ok=True)
for name, part in (("train", lines[:cut1]), ("valid", lines[cut1:cut2]), ("test", lines[cut2:])):
    (data / f"{name}.txt").write_text("\n".join(" ".join(str(b) for b in line + b"\n") for line in part) + "\n")
EOF
    echo "$PATCHED" > "$OFF/.patched"
fi

# Wall seconds and peak RSS (MiB) of a command, its output in a log.
timed() { # LOG CMD...
    local log=$1; shift
    /usr/bin/time -f "%e %M" -o "$log.time" "$@" > "$log" 2>&1 || { echo "failed: $*; see $log" >&2; exit 1; }
    awk '{printf "%s %.0f", $1, $2 / 1024}' "$log.time"
}

official() { # LOG ARM
    local log=$1; shift
    local kind=${1%%:*} span=${1##*:} extra=()
    if [ "$kind" = expire ]; then
        extra=(--expire-span --attn-lim "$span" --mem-sz 256 --expire-span-loss 0.000001 --expire-span-ramp 64 --expire-span-init-percentage 0.1 --expire-span-pre-div 1)
    elif [ "$kind" = adaptive ]; then
        extra=(--mem-sz 256 --attn-lim "$span" --adapt-span --adapt-span-loss 0.000002 --adapt-span-len 32 --adapt-span-init 0 --adapt-span-cache)
    else
        extra=(--mem-sz 256 --attn-lim "$span")
    fi
    timed "$log" env -C "$OFF" THREADS="$THREADS" "$PYTHON" main.py --no-cuda --data data/bytes --nepochs "$PARTS" --nbatches $((STEPS / PARTS)) \
        --hid-sz 256 --inner-hid-sz 1024 --nlayers 2 --nheads 4 --batch-sz 8 --dropout 0 --pre-norm \
        --lr 0.0003 --momentum 0 --optim adam --grad-clip 0.3 "${extra[@]}"
}

lethe() { # LOG ARM RUN SEED
    local log=$1; shift
    local kind=${1%%:*} span=${1##*:} extra=()
    if [ "$kind" = expire ]; then
        extra=(--set memory.mechanism=expire --set memory.expire.ramp=64 --set memory.expire.alpha=1e-6 --set memory.expire.init_fraction=0.1 --set memory.expire.pre_div=1)
    elif [ "$kind" = adaptive ]; then
        extra=(--set memory.mechanism=adaptive --set memory.adaptive.ramp=32 --set memory.adaptive.loss_coef=2e-6 --set memory.adaptive.init_ratio=0)
    else
        extra=(--set memory.mechanism=fixed)
    fi
    timed "$log" "$LETHE" train -p enwik8-tiny --data "$CORPUS" --out "$OUT/lethe" --name "$2" --overwrite --no-eval --steps "$STEPS" --seed "$3" \
        --set model.layers=2 --set model.d_model=256 --set model.heads=4 --set model.d_ffn=1024 --set model.pre_norm=true --set model.dropout=0 \
        --set train.batch=8 --set train.block=256 --set train.accum=1 --set train.threads="$THREADS" --set train.lr=3e-4 --set train.warmup=0 \
        --set train.grad_clip=0.3 --set train.schedule=constant --set train.log_every=$((STEPS / PARTS)) --set model.init="$LETHE_INIT" \
        --set memory.span="$span" "${extra[@]}"
}

echo "official corpus build (untimed)"; STEPS=$PARTS official "$OUT/warmup.log" "${ARMS[0]}" > /dev/null
RESULTS=$OUT/results.txt; : > "$RESULTS"
for round in $(seq "$ROUNDS"); do
    for arm in "${ARMS[@]}"; do
        tag=${arm/:/-}
        l=$(lethe "$OUT/lethe-$tag-$round.log" "$arm" "$tag-$round" "$round")
        o=$(official "$OUT/official-$tag-$round.log" "$arm")
        echo "$arm $round lethe $l official $o" | tee -a "$RESULTS"
    done
done
echo
"$PYTHON" - "$RESULTS" "$OUT" "$PARTS" <<'EOF'
# Medians over the rounds; the training loss is each program's mean over all its steps
# (lethe: its logged windows, one per part; the official code: its epochs' means, one
# per part), and over the last part, bits per byte.
import json, pathlib, re, sys, statistics
out, parts = pathlib.Path(sys.argv[2]), int(sys.argv[3])
rows = {}
for line in open(sys.argv[1]):
    arm, rnd, _, lt, lm, _, ot, om = line.split()
    tag = arm.replace(":", "-")
    windows = [json.loads(l)["bpb"] for l in open(out / "lethe" / f"{tag}-{rnd}" / "metrics.jsonl") if '"split":"train"' in l]
    epochs = [float(x) for x in re.findall(r"train: ([0-9.]+)bpc", (out / f"official-{tag}-{rnd}.log").read_text())]
    assert len(windows) == parts and len(epochs) == parts, (arm, rnd, len(windows), len(epochs))
    rows.setdefault(arm, []).append((float(lt), float(lm), float(ot), float(om), statistics.mean(windows), statistics.mean(epochs), windows[-1], epochs[-1]))
print("| arm | lethe s | official s | lethe / official | lethe MiB | official MiB | lethe bpb | official bpb |" + (" last part: lethe | official |" if parts > 1 else ""))
print("|---|---|---|---|---|---|---|---|" + ("---|---|" if parts > 1 else ""))
for arm, r in rows.items():
    med = lambda i: statistics.median(x[i] for x in r)
    last = f" {med(6):.3f} | {med(7):.3f} |" if parts > 1 else ""
    print(f"| {arm} | {med(0):.1f} | {med(2):.1f} | {med(0) / med(2):.2f} | {med(1):.0f} | {med(3):.0f} | {med(4):.3f} | {med(5):.3f} |{last}")
print()
for arm, r in rows.items():
    for i, what in ((4, "mean"), (6, "last part")):
        each = lambda j: " ".join(f"{x[j]:.3f}" for x in r)
        mean = lambda j: statistics.mean(x[j] for x in r)
        if i == 4 or parts > 1:
            print(f"{arm} bpb ({what}) by round: lethe {each(i)} (mean {mean(i):.3f}); official {each(i + 1)} (mean {mean(i + 1):.3f})")
EOF
