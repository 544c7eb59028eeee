#!/usr/bin/env bash
# Regenerates the measured results the guide and the README quote. Each section trains
# what it needs under OUT (default runs/docs) and writes one results record,
# docs/results/RECORD/: its figures, the machine.json of one of its runs (the CPU, the
# thread count and the fingerprint of how that CPU rounds) and record.md (the date, the
# command, the machine, the time taken). The same seed trains to the same figures only on
# a CPU with the same fingerprint. Run from anywhere; all seeds and thread counts are
# fixed, so a section run twice on the same machine gives the same figures (timings and
# tokens/s aside).
#
#   scripts/docs.sh [SECTION...]        (default: every section, in this order)
#   DOCS_OUT=/tmp/docs scripts/docs.sh default sweep
#
# A sweep skips the runs it finds finished under OUT with an unchanged config, and a
# config does not record the code that trained it: after a change to the code, give a
# fresh DOCS_OUT (or remove runs/docs) so that every figure is trained again.
#
# Sections (the record each writes under docs/results/, and its time on 2 cores):
#   default   the default run's output                      default/default-run.txt           1 min
#   sweep     the copy sweep example (--seeds 1,2)          sweep/sweep-copy-tiny.{csv,svg,png} 1 min
#   gpt2      scripts/gpt2-demo.sh, seeds 1 2 3             gpt2/gpt2-demo.txt                3 min
#   words     scripts/words-demo.sh, seeds 1 2 3            words/words-demo.txt              2 min
#   dialogue  scripts/dialogue-demo.sh, seed 1              dialogue/dialogue-demo.md        30 min
#   corridor  the corridor sweep, 3 seeds; agent spans      corridor/sweep-corridor-small.*,
#                                                           corridor/agent-spans-corridor.*  35 min
#   ablation  the corridor's Expire-Span ablations          ablation/ablation-corridor.csv   35 min
#   portal    the 5-room portal sweep; agent spans          portal/sweep-portal-small.*,
#                                                           portal/agent-spans-portal.*      60 min
#   portal8   the 8-room portal sweep; its spans            portal8/sweep-portal-8-rooms.*   60 min
#   enwik8    the Table-4 analogue: sweep and bench on a    enwik8/sweep-enwik8-tiny.*,
#             10 MB stand-in corpus (Rust's HTML docs)      enwik8/bench-enwik8-tiny.txt     25 min
#   enwik8bench  its efficiency columns alone (the bench)   enwik8/bench-enwik8-tiny.txt      5 min
#   scaling   time and memory against span and context,     scaling/bench-scaling.txt         7 min
#             in turns
#   trained   equal memory after training: a trained        trained/bench-trained.txt         3 min
#             Expire-Span on its text against Transformer-XL
#   longctx   scripts/longctx-compare.sh, seeds 1 2 3       longctx/longctx-compare.txt,
#                                                           longctx/accuracy.{svg,png,csv}   25 min
# In all about 5 hours; the sections that time (enwik8, scaling, trained) want the CPU to
# themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
cargo build --release --quiet
LETHE=target/release/lethe
OUT=${DOCS_OUT:-runs/docs}
THREADS=2
mkdir -p "$OUT"
SECTIONS=("$@")
ALL=(default sweep gpt2 words dialogue corridor ablation portal portal8 enwik8 scaling trained longctx)  # enwik8 runs enwik8bench
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=("${ALL[@]}")

# Keeps the machine a section's runs trained on: RUN's machine.json in the record.
keep_machine() { # RUN
  cp "$1/machine.json" "$DIR/machine.json"
}

# Copies a sweep's table, chart and PNG to the record as NAME.{csv,svg,png}.
keep_sweep() { # SWEEP_DIR NAME
  cp "$1/sweep.csv" "$DIR/$2.csv"
  cp "$1/sweep.svg" "$DIR/$2.svg"
  cp "$1/sweep.png" "$DIR/$2.png"
}

# Plays an Expire-Span agent and keeps its spans picture as NAME.{svg,png} in the record.
keep_spans() { # CHECKPOINT NAME EPISODES SEED
  $LETHE play --checkpoint "$1" --episodes "$3" --seed "$4" --spans "$OUT/$2"
  cp "$OUT/$2/agent-spans.svg" "$DIR/$2.svg"
  cp "$OUT/$2/agent-spans.png" "$DIR/$2.png"
}

# Plays 64 episodes with each seed's Expire-Span agent of a sweep (runs RUNS/PREFIX-s1..3)
# and keeps the span summaries, seed by seed, as NAME-64-episodes.txt in the record.
keep_span_summaries() { # RUNS PREFIX NAME
  local seed
  for seed in 1 2 3; do
    echo "seed $seed ($2-s$seed):"
    $LETHE play --checkpoint "$1/$2-s$seed" --episodes 64 --seed 1 --spans "$OUT/$3-64-s$seed" | tail -n +2 | grep -v '^wrote '
  done > "$DIR/$3-64-episodes.txt"
  cat "$DIR/$3-64-episodes.txt"
}

section_default() {
  # The README's "What the default run prints": the copy-tiny preset, as ./run.sh runs it
  # (from OUT, so that the run folder reads runs/copy-tiny), without the progress lines.
  local root=$PWD
  (cd "$OUT" && "$root/$LETHE" train --overwrite --set train.threads=$THREADS 2>&1) | grep -v '^step ' > "$DIR/default-run.txt"
  # The machine it ran on: the test of the quoted lines checks only where one rounds alike.
  keep_machine "$OUT/runs/copy-tiny"
  cat "$DIR/default-run.txt"
}

section_sweep() {
  $LETHE sweep --preset copy-sweep-tiny --mechanism fixed:8,16,32,64 --mechanism compressive:16,32,64 \
    --mechanism adaptive:64 --mechanism expire:64 --seeds 1,2 --set train.threads=$THREADS --out "$OUT/copy"
  keep_sweep "$OUT/copy/copy-sweep-tiny-sweep" sweep-copy-tiny
  keep_machine "$OUT/copy/copy-sweep-tiny-sweep/runs/expire-64-s1"
}

section_gpt2() {
  scripts/gpt2-demo.sh "$OUT" "1 2 3" | tee "$DIR/gpt2-demo.txt"
  keep_machine "$OUT/demo-infinity-s1"
}

section_words() {
  scripts/words-demo.sh "$OUT" "1 2 3" | tee "$DIR/words-demo.txt"
  keep_machine "$OUT/demo-words-tiny-s1"
}

section_longctx() {
  scripts/longctx-compare.sh "$OUT/longctx" "1 2 3" 2>/dev/null | grep -v '^wrote ' | tee "$DIR/longctx-compare.txt"
  cp "$OUT/longctx/eval/accuracy.svg" "$OUT/longctx/eval/accuracy.png" "$DIR/"
  cp "$OUT/longctx/eval/compare.csv" "$DIR/accuracy.csv"
  keep_machine "$OUT/longctx/runs/expire-s1"
}

section_dialogue() {
  scripts/dialogue-demo.sh "$OUT" 1 | tee "$DIR/dialogue-demo.md"
  keep_machine "$OUT/demo-dialogue-tiny-infinity-s1"
}

section_corridor() {
  $LETHE sweep --preset corridor-small --mechanism fixed:4,8,16,32,64 --mechanism expire:64 --seeds 1,2,3 \
    --set train.threads=$THREADS --out "$OUT/corridor"
  keep_sweep "$OUT/corridor/corridor-small-sweep" sweep-corridor-small
  keep_machine "$OUT/corridor/corridor-small-sweep/runs/expire-64-s1"
  keep_spans "$OUT/corridor/corridor-small-sweep/runs/expire-64-s3" agent-spans-corridor 3 2
  keep_span_summaries "$OUT/corridor/corridor-small-sweep/runs" expire-64 agent-spans-corridor
}

section_ablation() {
  # The corridor sweep's Expire-Span row (L = 64) with one setting of the preset's
  # (ramp 4, span loss warmed up over 750 updates) changed, 3 seeds each; one CSV with
  # the ablation's name in front of each sweep row.
  local name settings first=1
  while read -r name settings; do
    # shellcheck disable=SC2086 # the settings are words
    $LETHE sweep --preset corridor-small --mechanism expire:64 --seeds 1,2,3 $settings \
      --set train.threads=$THREADS --out "$OUT/ablation/$name" < /dev/null >&2
    local csv="$OUT/ablation/$name/corridor-small-sweep/sweep.csv"
    [ $first -eq 0 ] || { echo "ablation,$(head -1 "$csv")"; first=0; }
    tail -n +2 "$csv" | sed "s/^/$name,/"
  done > "$OUT/ablation.csv" <<'ROWS'
r16-no-warmup --set memory.expire.ramp=16 --set memory.expire.alpha_warmup=0
r16-no-warmup-pre-div-16 --set memory.expire.ramp=16 --set memory.expire.alpha_warmup=0 --set memory.expire.pre_div=16
r16-warmup-300 --set memory.expire.ramp=16 --set memory.expire.alpha_warmup=300
r16-warmup-750 --set memory.expire.ramp=16
r8-warmup-750 --set memory.expire.ramp=8
r4-no-warmup --set memory.expire.alpha_warmup=0
ROWS
  cp "$OUT/ablation.csv" "$DIR/ablation-corridor.csv"
  keep_machine "$OUT/ablation/r4-no-warmup/corridor-small-sweep/runs/expire-64-s1"
  cat "$DIR/ablation-corridor.csv"
}

section_portal() {
  $LETHE sweep --preset portal-small --mechanism fixed:4,8,16,128 --mechanism expire:128 --seeds 1,2,3 \
    --set train.threads=$THREADS --out "$OUT/portal"
  keep_sweep "$OUT/portal/portal-small-sweep" sweep-portal-small
  keep_machine "$OUT/portal/portal-small-sweep/runs/expire-128-s1"
  keep_spans "$OUT/portal/portal-small-sweep/runs/expire-128-s1" agent-spans-portal 2 4
  keep_span_summaries "$OUT/portal/portal-small-sweep/runs" expire-128 agent-spans-portal
}

section_portal8() {
  $LETHE sweep --preset portal-small --mechanism fixed:8,16,32 --mechanism expire:128 --seeds 1,2,3 \
    --length 8 --set data.portal.max_steps=200 --set train.threads=$THREADS --out "$OUT/portal-8"
  keep_sweep "$OUT/portal-8/portal-small-sweep" sweep-portal-8-rooms
  keep_machine "$OUT/portal-8/portal-small-sweep/runs/expire-128-s1"
  keep_span_summaries "$OUT/portal-8/portal-small-sweep/runs" expire-128 agent-spans-portal-8-rooms
}

section_enwik8() {
  # The stand-in for enwik8: the HTML of four of the books shipped with the Rust
  # toolchain, in path order, cut at 10 MB (markup and English, like enwik8's).
  local corpus="$OUT/rust-html.txt"
  . scripts/rust-html.sh
  rust_html "$corpus" 10000000
  $LETHE sweep --preset enwik8-tiny --data "$corpus" --steps 1500 --mechanism fixed:256 --mechanism adaptive:1024 \
    --mechanism expire:1024 --mechanism compressive:512 --mechanism infinity:512 --seeds 1,2,3 \
    --set train.threads=$THREADS --out "$OUT/enwik8"
  keep_sweep "$OUT/enwik8/enwik8-tiny-sweep" sweep-enwik8-tiny
  keep_machine "$OUT/enwik8/enwik8-tiny-sweep/runs/expire-1024-s1"
  section_enwik8bench
}

section_enwik8bench() {
  # The Table-4 analogue's efficiency columns: the five configs of the sweep in turns,
  # 40 rounds of one timed step each, so that the machine's drift falls on all of them;
  # the peak resident memory, which needs a config to itself, from a short pass of each
  # alone first. The steps read random tokens, as the cost does not depend on the text.
  local bench=($LETHE bench --preset enwik8-tiny --mechanism fixed --mechanism adaptive:1024
    --mechanism expire:1024 --mechanism compressive:512 --mechanism infinity:512 --set train.threads=$THREADS)
  {
    echo "## peak memory, each alone"
    "${bench[@]}" --bench-steps 2 --out "$OUT/bench-alone"
    echo "## in turns"
    "${bench[@]}" --bench-steps 1 --rounds 40 --out "$OUT/bench"
  } 2>&1 | grep -v '^wrote \|^streamed \|^round ' | tee "$DIR/bench-enwik8-tiny.txt"
}

section_scaling() {
  # The README's Scaling tables: untrained enwik8-tiny models on the bench's own data,
  # each config with its memory filled first (the bench streams `span` tokens, or
  # `context`, before the timed steps). The configs of a table take turns (`--rounds`),
  # 10 rounds of 2 timed steps each, so that the machine's drift falls on all of them;
  # the peak resident memory, which needs a config to itself, comes from a short pass of
  # each config alone first (the two tables that show it).
  local bench=($LETHE bench --preset enwik8-tiny --set train.threads=$THREADS --out "$OUT/scaling")
  local turns=(--bench-steps 2 --rounds 10) alone=(--bench-steps 2)
  {
    echo "## Transformer-XL, span L: peak memory, each alone"
    "${bench[@]}" "${alone[@]}" --mechanism fixed --scale span=256,512,1024,2048,4096
    echo "## Transformer-XL, span L: in turns"
    "${bench[@]}" "${turns[@]}" --mechanism fixed --scale span=256,512,1024,2048,4096
    echo "## Expire-Span, maximum span L (spans start at 0.1 L): peak memory, each alone"
    "${bench[@]}" "${alone[@]}" --mechanism expire --scale span=256,1024,4096,16384
    echo "## Expire-Span, maximum span L: in turns"
    "${bench[@]}" "${turns[@]}" --mechanism expire --scale span=256,1024,4096,16384
    # (Two calls: the two need different fractions for the same starting span.)
    echo "## Expire-Span, spans starting at 128 tokens, maximum span 1024 and 65536"
    "${bench[@]}" --bench-steps 20 --mechanism expire --set memory.span=1024 --set memory.expire.init_fraction=0.125
    "${bench[@]}" --bench-steps 20 --mechanism expire --set memory.span=65536 --set memory.expire.init_fraction=0.001953125
    echo "## equal memory over the timed steps: Transformer-XL L = 108 and Expire-Span L = 1024, in turns"
    "${bench[@]}" --bench-steps 1 --rounds 100 --mechanism fixed:108 --mechanism expire:1024
    echo "## context streamed first: the ∞-former (STM 256 + N 256) and Transformer-XL (L = 256), in turns"
    "${bench[@]}" "${turns[@]}" --mechanism infinity:512 --mechanism fixed --scale context=512,8192,32768,131072
  } 2>&1 | grep -v '^matrix multiply\|^wrote \|^streamed \|^round ' | tee "$DIR/bench-scaling.txt"
}

section_trained() {
  # Equal memory where it matters: Expire-Span (`enwik8-expire-tiny`, seed 1) trained
  # 1500 steps on the stand-in corpus of the enwik8 section, then timed on that corpus
  # (`--train-data`) with its parameters held (`--frozen`), so that its memory is what it
  # learned to keep and stays so while timed; beside it, in turns, Transformer-XL windows
  # of the same mean memory (read from a first pass) and of Expire-Span's mean cache
  # length (the longest stream's, which the batch pads every stream to).
  local corpus="$OUT/rust-html.txt" run="$OUT/trained/expire-1024"
  . scripts/rust-html.sh
  rust_html "$corpus" 10000000
  rm -rf "$run"
  $LETHE train --preset enwik8-expire-tiny --data "$corpus" --steps 1500 --seed 1 --set train.threads=$THREADS \
    --set train.eval_every=1500 --set train.checkpoint_every=1500 --out "$OUT/trained" --name expire-1024 > /dev/null
  local bench=($LETHE bench --preset enwik8-expire-tiny --data "$corpus" --init-from "$run" --train-data --frozen
    --set train.threads=$THREADS)
  "${bench[@]}" --bench-steps 20 --out "$OUT/trained-alone" > /dev/null 2>&1
  local sizes
  sizes=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(round(sum(r["mem_size"]) / len(r["mem_size"])), round(sum(r["held"]) / len(r["held"])))' "$OUT/trained-alone/enwik8-expire-tiny/bench.json")
  local mem=${sizes% *} held=${sizes#* }
  {
    echo "## Expire-Span L = 1024 trained 1500 steps, on its corpus, parameters frozen: about $mem memories a query, a cache of $held slots"
    echo "## in turns with Transformer-XL at L = $mem (equal memory) and L = $held (equal cache)"
    "${bench[@]}" --bench-steps 1 --rounds 60 --mechanism expire:1024 --mechanism "fixed:$mem" --mechanism "fixed:$held" --out "$OUT/trained-bench"
  } 2>&1 | grep -v '^wrote \|^streamed \|^round ' | tee "$DIR/bench-trained.txt"
}

for s in "${SECTIONS[@]}"; do
  if ! declare -F "section_$s" > /dev/null; then
    echo "docs.sh: no section \`$s\` (sections: ${ALL[*]})" >&2
    exit 2
  fi
done
# The record a section writes: enwik8bench rewrites a part of enwik8's.
record_of() { # SECTION
  case "$1" in enwik8bench) echo enwik8 ;; *) echo "$1" ;; esac
}

# record.md: when, how and where the record's figures were made.
write_record() { # SECTION SECONDS
  python3 - "$DIR" "$1" "$2" "$(date -u +%Y-%m-%d)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, os, sys
folder, section, took, day, commit = sys.argv[1:]
path = os.path.join(folder, "machine.json")
machine = json.load(open(path)) if os.path.exists(path) else {}
lines = [f"# Results record: `{section}`", "",
         f"- made: {day}, by `scripts/docs.sh {section}` at commit {commit}, in {took} s",
         f"- machine: {machine.get('cpu', 'not recorded')}, {machine.get('threads', '?')} threads" +
         (f", numerics {machine['numerics']}" if "numerics" in machine else "")]
lines += ["- files: " + ", ".join(sorted(f for f in os.listdir(folder) if f != "record.md"))]
open(os.path.join(folder, "record.md"), "w").write("\n".join(lines) + "\n")
PY
}

for s in "${SECTIONS[@]}"; do
  start=$(date +%s)
  DIR="docs/results/$(record_of "$s")"
  mkdir -p "$DIR"
  echo "== docs.sh: $s"
  "section_$s"
  write_record "$s" $(( $(date +%s) - start ))
  echo "== docs.sh: $s took $(( $(date +%s) - start )) s, recorded in $DIR/record.md"
done
