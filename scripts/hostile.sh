#!/usr/bin/env bash
# Hostile-input campaign: runs the lethe binary on inputs a careless or hostile user
# might give and classifies each outcome:
#   error   non-zero exit, no panic (then check the message by eye in the log)
#   ok      exit 0 (accepted: check by eye that accepting it is right)
#   PANIC   the process panicked, or died of a signal (an abort)
#   running it ran past the time limit, still writing output, and stopped on SIGTERM
#           (expected only of `generate --bytes` with a huge count, which streams until
#           stopped, and of a long bench given a short limit)
#   HANG    it ran past the time limit with no output, or ignored SIGTERM
#   LOST    a file it was told to keep changed (a run's own files, an input)
#   WRONG   it succeeded where it must refuse (a setting that makes no sense, a flag
#           it would ignore)
#   MISLEAD its message shows a Rust type, a Debug rendering or a C++ stack
# A case may name files that must not change (--keep "FILES"), whether it must be
# refused (--must-fail) and its time limit in seconds (--limit N, default 60).
# Usage: scripts/hostile.sh [LOG]   (build first: cargo build --release)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh >/dev/null
BIN="$PWD/target/release/lethe"
FIX="$PWD/tests/fixtures/gpt2-tiny"   # a tiny GPT-2 in the Hugging Face layout
LOG="${1:-/tmp/lethe-hostile.log}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
: > "$LOG"
TINY=(--set model.layers=1 --set model.d_model=16 --set model.heads=2 --set model.d_ffn=32
      --set train.block=8 --set memory.span=16 --set train.batch=2 --set train.eval_tokens=64 --set data.copy.eval_tokens=128 --set data.copy.distance_min=5 --set data.copy.distance_max=20)
declare -A COUNT
run_case() {
  local name="$1"; shift
  local out rc class
  local keep=() before=""
  if [ "$1" = "--keep" ]; then keep=($2); shift 2; before=$(cat "${keep[@]}" 2>/dev/null | md5sum); fi
  local must_fail=0 limit=60
  if [ "$1" = "--must-fail" ]; then must_fail=1; shift; fi
  if [ "$1" = "--limit" ]; then limit=$2; shift 2; fi
  # SIGTERM at the limit, then SIGKILL 10 s later: a command that ignores the first
  # signal ends with 137 and counts as a hang.
  timeout -k 10 "$limit" "$@" > case.out 2>&1 < /dev/null; rc=$?
  out="$(tail -c 4000 case.out | tr -d '\0')"
  if grep -q "panicked" <<<"$out" || { [ $rc -ge 128 ] && [ $rc -ne 137 ] && [ $rc -ne 130 ] && [ $rc -ne 143 ]; }; then class=PANIC  # panic, or abort/crash by signal
  elif [ ${#keep[@]} -gt 0 ] && [ "$(cat "${keep[@]}" 2>/dev/null | md5sum)" != "$before" ]; then class=LOST
  elif [ $rc -eq 137 ]; then class=HANG
  elif [ $rc -eq 124 ] && [ -n "$out" ]; then class=running   # still producing output
  elif [ $rc -eq 124 ]; then class=HANG
  elif [ $rc -eq 0 ] && [ $must_fail = 1 ]; then class=WRONG
  elif grep -qE "struct [A-Z]|Os \{|ImageError|frame #[0-9]|Exception raised from" <<<"$out"; then class=MISLEAD
  elif [ $rc -eq 0 ]; then class=ok
  else class=error; fi
  COUNT[$class]=$(( ${COUNT[$class]:-0} + 1 ))
  printf '%-6s %-44s %s\n' "$class" "$name" "$(tail -n 1 <<<"$out" | cut -c1-150)" | tee -a "$LOG"
}
# A small trained run to aim eval, generate and resume at.
"$BIN" train -q "${TINY[@]}" --steps 4 --name base --set train.checkpoint_every=2 >/dev/null 2>&1
printf 'hello world\n' > prompt.txt
head -c 3000000 /dev/urandom > big.bin
: > empty.txt
printf 'ab' > short.txt
printf '[model\nlayers=' > broken.toml
printf '[model]\nlayers = "two"\n' > typed.toml
printf '[model]\nlayerz = 2\n' > unknown.toml
mkdir emptydir
cp runs/base/checkpoint.safetensors trunc.safetensors && truncate -s 1000 trunc.safetensors
printf 'not a checkpoint' > junk.safetensors
cp runs/base/checkpoint.safetensors flipped.safetensors
size=$(stat -c %s flipped.safetensors)
printf '\x55' | dd of=flipped.safetensors bs=1 seek=$((size - 100)) conv=notrunc status=none
"$BIN" train -q -p corridor-small --steps 2 --set rl.eval_episodes=4 --name rl >/dev/null 2>&1
"$BIN" train -q "${TINY[@]}" --steps 4 --set memory.mechanism=expire --name exp >/dev/null 2>&1
# A run killed by SIGKILL after its first checkpoint.
"$BIN" train -q "${TINY[@]}" --steps 100000 --set train.checkpoint_every=2 --name killed >/dev/null 2>&1 &
pid=$!; while [ ! -f runs/killed/checkpoint.safetensors ]; do sleep 0.2; done; kill -9 $pid; wait $pid 2>/dev/null
# A run that holds its folder's lock while the campaign tries a second training there.
"$BIN" train -q "${TINY[@]}" --steps 100000 --name locked >/dev/null 2>&1 &
locked=$!; while [ ! -f runs/locked/.lethe.lock ]; do sleep 0.2; done

run_case "train --steps 0"                 "$BIN" train -q "${TINY[@]}" --steps 0 --name a1
run_case "train --steps -1"                "$BIN" train -q "${TINY[@]}" --steps -1 --name a2
run_case "train --set model.layers=0"      "$BIN" train -q "${TINY[@]}" --set model.layers=0 --name a3
run_case "train --set model.heads=3"       "$BIN" train -q "${TINY[@]}" --set model.heads=3 --name a4
run_case "train --set train.lr=nan"        "$BIN" train -q "${TINY[@]}" --set train.lr=nan --name a5
run_case "train --set train.lr=-1"         "$BIN" train -q "${TINY[@]}" --set train.lr=-1 --name a6
run_case "train --set train.lr=1e30"       "$BIN" train -q "${TINY[@]}" --set train.lr=1e30 --steps 3 --name a7
run_case "train --set train.batch=0"       "$BIN" train -q "${TINY[@]}" --set train.batch=0 --name a8
run_case "train --set train.block=0"        "$BIN" train -q "${TINY[@]}" --set train.block=0 --name a9
run_case "train --set memory.span=0"       "$BIN" train -q "${TINY[@]}" --set memory.span=0 --name a10
run_case "train --set memory.span=1e12"    "$BIN" train -q "${TINY[@]}" --set memory.span=1000000000000 --name a11
run_case "train --set model.dropout=1.5"   "$BIN" train -q "${TINY[@]}" --set model.dropout=1.5 --name a12
run_case "train --set nosuch.field=1"      "$BIN" train -q "${TINY[@]}" --set nosuch.field=1 --name a13
run_case "train --set model.layers"        "$BIN" train -q "${TINY[@]}" --set model.layers --name a14
run_case "train --set model.layers=two"    "$BIN" train -q "${TINY[@]}" --set model.layers=two --name a15
run_case "train --preset nosuch"           "$BIN" train --preset nosuch --name a16
run_case "train --config missing.toml"     "$BIN" train -q "${TINY[@]}" --config missing.toml --name a17
run_case "train --config broken.toml"      "$BIN" train -q "${TINY[@]}" --config broken.toml --name a18
run_case "train --config typed.toml"       "$BIN" train -q "${TINY[@]}" --config typed.toml --name a19
run_case "train --config unknown.toml"     "$BIN" train -q "${TINY[@]}" --config unknown.toml --name a20
run_case "train --data empty.txt"          "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data empty.txt --name a21
run_case "train --data short.txt"          "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data short.txt --name a22
run_case "train --data emptydir"           "$BIN" train -q -p books-tiny "${TINY[@]}" --data emptydir --name a23
run_case "train --data missing"            "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data missing --name a24
run_case "train --device cuda (no GPU)"    "$BIN" train -q "${TINY[@]}" --device cuda --name a25
run_case "train --device tpu"              "$BIN" train -q "${TINY[@]}" --device tpu --name a26
run_case "train --distance 100-10"         "$BIN" train -q "${TINY[@]}" --distance 100-10 --name a27
run_case "train --distance x"              "$BIN" train -q "${TINY[@]}" --distance x --name a28
run_case "train --length 0"                "$BIN" train -q "${TINY[@]}" --length 0 --name a29
run_case "train --name ../x"               "$BIN" train -q "${TINY[@]}" --name ../x
run_case "train --name ''"                 "$BIN" train -q "${TINY[@]}" --name ''
run_case "train --out /proc/x"             "$BIN" train -q "${TINY[@]}" --out /proc/x --name a30
run_case "train again without --resume"    "$BIN" train -q "${TINY[@]}" --steps 4 --name base
run_case "train --resume, no run"          "$BIN" train -q "${TINY[@]}" --resume --name nosuch
run_case "train --resume --seed 9"         "$BIN" train -q "${TINY[@]}" --steps 4 --resume --seed 9 --name base
run_case "train --resume --overwrite"      "$BIN" train -q "${TINY[@]}" --resume --overwrite --name base
run_case "train --stop-after 0"            "$BIN" train -q "${TINY[@]}" --stop-after 0 --name a31
run_case "train --stop-after 99 (steps 4)" "$BIN" train -q "${TINY[@]}" --steps 4 --stop-after 99 --name a32
run_case "train --set train.threads=999"   "$BIN" train -q "${TINY[@]}" --set train.threads=999 --name a33
run_case "train --set memory.mechanism=nosuch"  "$BIN" train -q "${TINY[@]}" --set memory.mechanism=nosuch --name a34
run_case "train --set memory.expire.ramp=0" "$BIN" train -q "${TINY[@]}" --set memory.mechanism=expire --set memory.expire.ramp=0 --name a35
run_case "train expire init_fraction=1"    "$BIN" train -q "${TINY[@]}" --set memory.mechanism=expire --set memory.expire.init_fraction=1 --name a36
run_case "train expire init_fraction=0"    "$BIN" train -q "${TINY[@]}" --set memory.mechanism=expire --set memory.expire.init_fraction=0 --name a37
run_case "train compressive rate=0"        "$BIN" train -q "${TINY[@]}" --set memory.mechanism=compressive --set memory.compressive.rate=0 --name a38
run_case "train infinity basis=0"          "$BIN" train -q -p sorting-infinity-tiny "${TINY[@]}" --set memory.infinity.basis=0 --name a39
run_case "train infinity tau=2"            "$BIN" train -q -p sorting-infinity-tiny "${TINY[@]}" --set memory.infinity.tau=2 --name a40
run_case "eval --checkpoint missing"       "$BIN" eval --checkpoint nosuch
run_case "eval --checkpoint trunc"         "$BIN" eval --checkpoint trunc.safetensors
run_case "eval --checkpoint junk"          "$BIN" eval --checkpoint junk.safetensors
run_case "eval --checkpoint emptydir"      "$BIN" eval --checkpoint emptydir
run_case "eval --split nosuch"             "$BIN" eval --checkpoint runs/base --split nosuch
run_case "eval --block 0"                  "$BIN" eval --checkpoint runs/base --block 0
run_case "eval --max-tokens 0"             "$BIN" eval --checkpoint runs/base --max-tokens 0
run_case "eval --max-span -5"              "$BIN" eval --checkpoint runs/base --max-span -5
run_case "eval --set model.layers=3"       "$BIN" eval --checkpoint runs/base --set model.layers=3
run_case "eval --episodes 0 (LM ckpt)"     "$BIN" eval --checkpoint runs/base --episodes 0
run_case "generate --bytes 0"              "$BIN" generate --checkpoint runs/base --prompt hi --bytes 0
run_case "generate --bytes huge"           "$BIN" generate --checkpoint runs/base --prompt hi --bytes 18446744073709551615
run_case "generate --top-k -1"             "$BIN" generate --checkpoint runs/base --prompt hi --top-k -1
run_case "generate --temperature inf"      "$BIN" generate --checkpoint runs/base --prompt hi --temperature inf
run_case "generate --prompt ''"            "$BIN" generate --checkpoint runs/base --prompt '' --bytes 5
run_case "generate prompt and prompt-file" "$BIN" generate --checkpoint runs/base --prompt a --prompt-file prompt.txt
run_case "generate --prompt-file missing"  "$BIN" generate --checkpoint runs/base --prompt-file nosuch
run_case "generate --prompt-file 3MB"      "$BIN" generate --checkpoint runs/base --prompt-file big.bin --bytes 1
run_case "bench --bench-steps 0"           "$BIN" bench "${TINY[@]}" --bench-steps 0 --name b1
run_case "bench --mechanism nosuch"        "$BIN" bench "${TINY[@]}" --mechanism nosuch --name b2
run_case "bench --mechanism expire:0"      "$BIN" bench "${TINY[@]}" --mechanism expire:0 --name b3
run_case "bench --mechanism expire:huge"   "$BIN" bench "${TINY[@]}" --mechanism expire:99999999999 --name b4
run_case "bench --scale span="             "$BIN" bench "${TINY[@]}" --scale span= --name b5
run_case "bench --scale nosuch=1"          "$BIN" bench "${TINY[@]}" --scale nosuch=1 --name b6
run_case "bench --context -1"              "$BIN" bench "${TINY[@]}" --context -1 --name b7
run_case "bench --data without --train-data" --must-fail "$BIN" bench "${TINY[@]}" --data prompt.txt --name b8
run_case "stdout on a full disk"           bash -c '"$0" train --list-presets > /dev/full' "$BIN"
run_case "stderr on a full disk"           bash -c '"$0" eval --checkpoint nosuch 2> /dev/full; echo "exit $?"' "$BIN"
run_case "sweep --sizes 0"                 "$BIN" sweep "${TINY[@]}" --sizes 0 --name s1
run_case "sweep --sizes ''"                "$BIN" sweep "${TINY[@]}" --sizes '' --name s2
run_case "sweep --seeds 1,,2"              "$BIN" sweep "${TINY[@]}" --seeds 1,,2 --name s3
run_case "sweep --mechanism fixed:x"       "$BIN" sweep "${TINY[@]}" --mechanism fixed:x --name s4
run_case "play --episodes 0"               "$BIN" play -p corridor-small --episodes 0
run_case "play --checkpoint LM run"        "$BIN" play --checkpoint runs/base --episodes 1
run_case "play -p copy-tiny (not RL)"      "$BIN" play -p copy-tiny --episodes 1
run_case "inspect (no subcommand)"         "$BIN" inspect
run_case "eval flipped bit in tensor data"  "$BIN" eval --checkpoint flipped.safetensors
run_case "eval --checkpoint a directory file" "$BIN" eval --checkpoint /
run_case "eval --data empty.txt"           "$BIN" eval --checkpoint runs/base --data empty.txt
run_case "eval --batch 100000"             "$BIN" eval --checkpoint runs/base --batch 100000
run_case "eval --set memory.span=1e12"     "$BIN" eval --checkpoint runs/base --set memory.span=1000000000000
run_case "eval --device cuda:7"            "$BIN" eval --checkpoint runs/base --device cuda:7
run_case "generate from RL checkpoint"     "$BIN" generate --checkpoint runs/rl --prompt hi
run_case "generate --max-span 0"           "$BIN" generate --checkpoint runs/base --prompt hi --max-span 0
run_case "inspect spans on an XL model"    "$BIN" inspect spans --checkpoint runs/base --text hello --out insp
run_case "inspect ltm on an XL model"      "$BIN" inspect ltm --checkpoint runs/base --text hello --out insp
run_case "inspect spans --text ''"         "$BIN" inspect spans --checkpoint runs/exp --text '' --out insp
run_case "inspect spans --out a file"      "$BIN" inspect spans --checkpoint runs/exp --text hello --out prompt.txt
run_case "eval RL --split nosuch"          "$BIN" eval --checkpoint runs/rl --split nosuch
run_case "eval RL --block 0"               "$BIN" eval --checkpoint runs/rl --block 0
run_case "eval RL --max-tokens 5"          "$BIN" eval --checkpoint runs/rl --max-tokens 5
run_case "play --checkpoint RL, episodes 2" "$BIN" play --checkpoint runs/rl --episodes 2 --summary
run_case "play --spans on an XL agent"     "$BIN" play --checkpoint runs/rl --spans sp
run_case "train corridor --distance 5-2"   "$BIN" train -q -p corridor-small --distance 5-2 --name r1
run_case "train corridor --length 1"       "$BIN" train -q -p corridor-small --length 1 --name r2
run_case "train portal --length 0"         "$BIN" train -q -p portal-small --length 0 --name r3
run_case "train rl.gamma=1.5"              "$BIN" train -q -p corridor-small --set rl.gamma=1.5 --name r4
run_case "train rl.reset=nosuch"           "$BIN" train -q -p corridor-small --set rl.reset=nosuch --name r5
run_case "train data.split=[0.5,0.5,0.5]"  "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data prompt.txt --set 'data.split=[0.5,0.5,0.5]' --name a41
run_case "train train.accum=0"             "$BIN" train -q "${TINY[@]}" --set train.accum=0 --name a42
run_case "train train.grad_clip=-1"        "$BIN" train -q "${TINY[@]}" --set train.grad_clip=-1 --name a43
run_case "train train.warmup > steps"      "$BIN" train -q "${TINY[@]}" --set train.warmup=100 --steps 3 --name a44
run_case "train train.beta1=1"             "$BIN" train -q "${TINY[@]}" --set train.beta1=1 --name a45
run_case "train train.optimizer=sgdx"      "$BIN" train -q "${TINY[@]}" --set train.optimizer=sgdx --name a46
run_case "train model.vocab=10 (bytes)"    "$BIN" train -q "${TINY[@]}" --set model.vocab=10 --name a47
run_case "train model.d_model=1e9"         "$BIN" train -q "${TINY[@]}" --set model.d_model=1000000000 --name a48
run_case "train train.batch=1e9"           "$BIN" train -q "${TINY[@]}" --set train.batch=1000000000 --name a49
run_case "train copy count_min=0"          "$BIN" train -q "${TINY[@]}" --set data.copy.count_min=0 --name a50
run_case "train collision speed=-1"        "$BIN" train -q -p collision-tiny "${TINY[@]}" --set data.collision.speed=-1 --name a51
run_case "train infinity widths=[]"        "$BIN" train -q -p sorting-infinity-tiny "${TINY[@]}" --set 'memory.infinity.widths=[]' --name a52
run_case "train infinity ridge=0"          "$BIN" train -q -p sorting-infinity-tiny "${TINY[@]}" --set memory.infinity.ridge=0 --name a53
run_case "train infinity samples=0"        "$BIN" train -q -p sorting-infinity-tiny "${TINY[@]}" --set memory.infinity.samples=0 --name a54
run_case "train --set seed=-5"             "$BIN" train -q "${TINY[@]}" --set seed=-5 --name a55
run_case "train --resume on a killed run"  "$BIN" train -q "${TINY[@]}" --steps 8 --resume --name killed
run_case "train while another trains"      "$BIN" train -q "${TINY[@]}" --steps 4 --name locked
kill $locked; wait
# GPT-2, tokenizers and their options.
G=(-p gpt2-tiny --set model.layers=1 --set model.d_model=16 --set model.heads=2 --set model.d_ffn=32 --set train.batch=2 --set train.block=8 --steps 2 --set "data.tokenizer=$FIX")
for i in $(seq 400); do echo "line $i of a small text, with words enough to fill a few blocks"; done > text.txt
mkdir -p wt wt-bad hf-bad tok-bad && printf '{"version": ' > tok-bad/tokenizer.json && for s in train valid test; do printf ' = T = \n hello world \n' > wt/wiki.$s.tokens; done
cp wt/* wt-bad/ && printf '\xff\xfe hello\n' > wt-bad/wiki.train.tokens
cp "$FIX"/* hf-bad/ && printf '{"model_type": "gpt2", "n_embd": ' > hf-bad/config.json
run_case "train gpt2 memory_lr=NaN"          "$BIN" train -q "${G[@]}" --set train.memory_lr=nan --data text.txt --name g1
run_case "train gpt2 memory_lr=-1"           "$BIN" train -q "${G[@]}" --set train.memory_lr=-1 --data text.txt --name g2
run_case "train --init-from a missing path"  "$BIN" train -q "${G[@]}" --init-from nosuch --data text.txt --name g3
run_case "train --init-from a text file"     "$BIN" train -q "${G[@]}" --init-from prompt.txt --data text.txt --name g4
run_case "train --init-from a bad config"    "$BIN" train -q "${G[@]}" --init-from hf-bad --data text.txt --name g5
run_case "train --init-from an XL run"       "$BIN" train -q "${G[@]}" --init-from runs/base --data text.txt --name g6
run_case "train gpt2 positions=1e12"         "$BIN" train -q "${G[@]}" --set model.positions=1000000000000 --data text.txt --name g7
run_case "train gpt2 block > positions"      "$BIN" train -q "${G[@]}" --set model.positions=4 --data text.txt --name g8
run_case "train gpt2 expire"                 "$BIN" train -q "${G[@]}" --set memory.mechanism=expire --data text.txt --name g9
run_case "train gpt2 vocab=10"               "$BIN" train -q "${G[@]}" --set model.vocab=10 --data text.txt --name g10
run_case "train gpt2 tokenizer missing"      "$BIN" train -q "${G[@]}" --set data.tokenizer=nosuch --data text.txt --name g11
run_case "train gpt2 tokenizer corrupt"      "$BIN" train -q "${G[@]}" --set data.tokenizer=tok-bad --data text.txt --name g12
run_case "train copy with a tokenizer"       "$BIN" train -q "${TINY[@]}" --set "data.tokenizer=$FIX" --name g13
run_case "train gpt2 threshold=0"            "$BIN" train -q "${G[@]}" --set memory.mechanism=infinity --set memory.infinity.threshold=0 --data text.txt --name g14
run_case "train gpt2 wikitext non-UTF-8"     "$BIN" train -q "${G[@]}" --data wt-bad --name g15
run_case "train gpt2 wikitext tiny"          "$BIN" train -q "${G[@]}" --data wt --name g16
run_case "train gpt2 on empty.txt"           "$BIN" train -q "${G[@]}" --data empty.txt --name g17
run_case "train gpt2 norm_eps=0"             "$BIN" train -q "${G[@]}" --set model.norm_eps=0 --data text.txt --name g18
run_case "train gpt2 schedule=linear"        "$BIN" train -q "${G[@]}" --set train.schedule=linear --data text.txt --name g19
# Word vocabularies, the adaptive softmax, tokenised generation.
run_case "tokenizer words empty.txt"         "$BIN" tokenizer words empty.txt --out tw1
run_case "tokenizer words nosuch.txt"        "$BIN" tokenizer words nosuch.txt --out tw2
run_case "tokenizer words big.bin"           "$BIN" tokenizer words big.bin --out tw3
run_case "tokenizer words --out /proc/x"     "$BIN" tokenizer words text.txt --out /proc/lethe-x
run_case "tokenizer words --min-count 1e9"   "$BIN" tokenizer words text.txt --out tw4 --min-count 1000000000
run_case "tokenizer bpe --vocab 1e9"         "$BIN" tokenizer bpe text.txt --out tw5 --vocab 1000000000
run_case "tokenizer bpe --vocab -1"          "$BIN" tokenizer bpe text.txt --out tw6 --vocab -1
"$BIN" tokenizer words text.txt --out tw >/dev/null 2>&1
W=(-p words-tiny --set model.layers=1 --set model.d_model=16 --set model.heads=2 --set model.d_ffn=32 --set train.batch=2 --set train.block=8 --set memory.span=8 --steps 2 --data text.txt --set data.tokenizer=tw)
run_case "train words vocab=5"               "$BIN" train -q "${W[@]}" --set model.vocab=5 --name w1
run_case "train words cutoffs=[]"            "$BIN" train -q "${W[@]}" --set 'model.cutoffs=[]' --name w2
run_case "train words cutoffs=[5000]"        "$BIN" train -q "${W[@]}" --set 'model.cutoffs=[5000]' --name w3
run_case "train words cutoffs=[10,10]"       "$BIN" train -q "${W[@]}" --set 'model.cutoffs=[10,10]' --name w4
run_case "train words div_val=1e9"           "$BIN" train -q "${W[@]}" --set model.div_val=1000000000 --name w5
run_case "train words cutoffs=\"x\""          "$BIN" train -q "${W[@]}" --set 'model.cutoffs="x"' --name w6
run_case "train words max_documents=3"       "$BIN" train -q "${W[@]}" --set data.max_documents=3 --name w7
run_case "train words"                       "$BIN" train -q "${W[@]}" --name w8
run_case "generate words --tokens 0"         "$BIN" generate --checkpoint runs/w8 --prompt "line 1" --tokens 0
run_case "generate words unknown prompt"     "$BIN" generate --checkpoint runs/w8 --prompt "zzz qqq" --tokens 5
run_case "generate words prompt file latin1" "$BIN" generate --checkpoint runs/w8 --prompt-file wt-bad/wiki.train.tokens --tokens 5
run_case "generate words empty prompt"       "$BIN" generate --checkpoint runs/w8 --prompt "" --tokens 5
run_case "generate words whitespace prompt"  "$BIN" generate --checkpoint runs/w8 --prompt "   " --tokens 5
run_case "inspect ltm on words xl"           "$BIN" inspect ltm --checkpoint runs/w8 --text text.txt --out iw
# Outputs, sizes, signals and settings: the general causes, each through several commands.
BASE="runs/base/checkpoint.safetensors runs/base/config.toml runs/base/metrics.jsonl runs/base/machine.json"
mkfifo fifo
mkdir -p loop/sub && printf 'some text to read %.0s' $(seq 200) > loop/sub/a.txt && ln -s .. loop/sub/back
ln -s runs/base/checkpoint.safetensors link.safetensors
printf 'a b c\n' > pred.txt && printf 'a b d\n' > ref.txt
mkdir -p huge && python3 -c "
import json
print('\n'.join(json.dumps({'step': i, 'split': 'train', 'loss': v}) for i, v in enumerate([1e308, -1e308, 3.0])))" > huge/metrics.jsonl
run_case "eval --per-token the checkpoint"   --keep "$BASE" "$BIN" eval --checkpoint runs/base --per-token runs/base/checkpoint.safetensors
run_case "eval --per-token the config"       --keep "$BASE" "$BIN" eval --checkpoint runs/base --per-token runs/base/config.toml
run_case "eval --per-token a link to it"     --keep "$BASE" "$BIN" eval --checkpoint runs/base --per-token link.safetensors
run_case "eval --per-token /dev/null"        "$BIN" eval --checkpoint runs/base --per-token /dev/null
run_case "eval --per-token a FIFO"           "$BIN" eval --checkpoint runs/base --per-token fifo
run_case "score --csv the references"        --keep "ref.txt pred.txt" "$BIN" score pred.txt ref.txt --csv ref.txt
run_case "tokenizer --out a run's folder"    --keep "runs/w8/tokenizer.json" "$BIN" tokenizer words text.txt --out runs/w8 --overwrite
run_case "tokenizer reads a FIFO"            "$BIN" tokenizer words fifo --out tw9
run_case "plot --out the metrics' run"       --keep "$BASE" "$BIN" plot runs/base --out runs/base/metrics
run_case "plot values near 1e308"            "$BIN" plot huge --out huge/p
run_case "train --data /dev/zero"            "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data /dev/zero --name u1
run_case "train --data a FIFO"               "$BIN" train -q -p enwik8-tiny "${TINY[@]}" --data fifo --name u2
run_case "train --data a folder with a loop" "$BIN" train -q -p books-tiny "${TINY[@]}" --data loop --steps 2 --name u3
run_case "train --config a FIFO"             "$BIN" train -q "${TINY[@]}" --config fifo --name u4
run_case "generate --prompt-file a FIFO"     "$BIN" generate --checkpoint runs/base --prompt-file fifo --bytes 2
run_case "eval --checkpoint /dev/urandom"    "$BIN" eval --checkpoint /dev/urandom
run_case "train copy --length 1e11"          "$BIN" train -q "${TINY[@]}" --length 99999999999 --name u5
run_case "train copy eval_tokens 1e14"       "$BIN" train -q "${TINY[@]}" --set data.copy.eval_tokens=99999999999999 --name u6
run_case "train collision --length 1e12"     "$BIN" train -q -p collision-tiny --length 999999999999 --name u7
run_case "train sorting length 1e12"         "$BIN" train -q -p sorting-tiny --set data.sorting.length=999999999999 --name u8
run_case "train portal --length 1e12"        "$BIN" train -q -p portal-small --length 999999999999 --name u9
run_case "train --length 2^64-1"             "$BIN" train -q "${TINY[@]}" --length 18446744073709551615 --name u10
run_case "train --seed 2^64-1"               "$BIN" train -q "${TINY[@]}" --seed 18446744073709551615 --name u11
run_case "bench --warmup 2^64-1"             "$BIN" bench "${TINY[@]}" --warmup 18446744073709551615 --name u12
run_case "bench --bench-steps 2^64-1"        "$BIN" bench "${TINY[@]}" --bench-steps 18446744073709551615 --name u13
run_case "bench --rounds 10^5"               "$BIN" bench "${TINY[@]}" --rounds 100000 --name u14
run_case "bench --context 2^64-1"            "$BIN" bench "${TINY[@]}" --context 18446744073709551615 --name u15
run_case "bench --warmup 9999 (SIGTERM)"     --limit 5 "$BIN" bench "${TINY[@]}" --set model.layers=4 --set model.d_model=256 --set model.d_ffn=1024 --warmup 9999 --name u16
run_case "eval RL --episodes 2^64-1"         "$BIN" eval --checkpoint runs/rl --episodes 18446744073709551615
run_case "play --episodes 2^64-1"            "$BIN" play --checkpoint runs/rl --episodes 18446744073709551615 --summary
run_case "train 10^5 layers"                 "$BIN" train -q "${TINY[@]}" --set model.layers=100000 --set model.d_model=1024 --name u17
run_case "train min_lr_ratio=50"             --must-fail "$BIN" train -q "${TINY[@]}" --set train.min_lr_ratio=50 --steps 2 --name u18
run_case "train eps=0"                       --must-fail "$BIN" train -q "${TINY[@]}" --set train.eps=0 --steps 2 --name u19
run_case "train --resume --init-from"        --must-fail "$BIN" train -q "${TINY[@]}" --steps 8 --resume --init-from runs/exp --name base
run_case "eval --set data.tokenizer"         --must-fail "$BIN" eval --checkpoint runs/base --set data.tokenizer=tw
run_case "play --checkpoint -p portal"       --must-fail "$BIN" play --checkpoint runs/rl -p portal-small --episodes 1
run_case "play --checkpoint --steps 5"       --must-fail "$BIN" play --checkpoint runs/rl --steps 5 --episodes 1
run_case "sweep --sizes 16,16"               --must-fail "$BIN" sweep "${TINY[@]}" --sizes 16,16 --steps 2 --name u20
run_case "sweep fixed twice"                 --must-fail "$BIN" sweep "${TINY[@]}" --mechanism fixed:16 --mechanism fixed:32 --steps 2 --name u21
run_case "bench --scale context --context"   --must-fail "$BIN" bench "${TINY[@]}" --scale context=64,128 --context 64 --name u22
run_case "train --set model=3"               "$BIN" train -q "${TINY[@]}" --set model=3 --name u23
run_case "train --config typed table"        "$BIN" train -q "${TINY[@]}" --config typed.toml --name u24
run_case "train a rank with no store"        env MASTER_ADDR=127.0.0.1 MASTER_PORT=1 WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 "$BIN" train -q "${TINY[@]}" --set train.dist_timeout=2 --name u25
"$BIN" sweep "${TINY[@]}" --mechanism fixed:16 --steps 2 --name sw >/dev/null 2>&1
run_case "sweep again with other steps"      --keep "runs/sw-sweep/runs/fixed-16-s1/checkpoint.safetensors" "$BIN" sweep "${TINY[@]}" --mechanism fixed:16 --steps 3 --name sw
FIXL="$(dirname "$FIX")/llama"
L="$FIXL/llama3"
LT=(--init-from "$L" --data text.txt --set train.batch=2 --set train.block=16 --set train.eval_tokens=64 --steps 2)
"$BIN" train -q "${LT[@]}" --set memory.mechanism=expire --set memory.span=32 --set train.freeze_base=true --name lexp >/dev/null 2>&1
"$BIN" train -q "${LT[@]}" --name lft >/dev/null 2>&1
# Pretrained decoders (Hugging Face folders), long-context evaluation, export, dialogue.
mkdir -p hf-empty hf-noheads hf-nan hf-shape hf-vocab0 hf-notok
for d in hf-noheads hf-nan hf-shape hf-vocab0 hf-notok; do cp "$L"/* $d/; done
rm hf-notok/tokenizer.json
python3 - <<'PY'
import json
def edit(d, **kw):
    c = json.load(open(f"{d}/config.json")); c.update(kw); json.dump(c, open(f"{d}/config.json", "w"))
edit("hf-noheads", num_attention_heads=0)
edit("hf-nan", rms_norm_eps=float("nan"))
edit("hf-shape", hidden_size=48)
edit("hf-vocab0", vocab_size=0)
PY
mkdir -p hf-lies && cp "$L"/config.json "$L"/tokenizer.json hf-lies/ && python3 -c "
import json, struct
h = json.dumps({'model.embed_tokens.weight': {'dtype': 'F32', 'shape': [320, 32], 'data_offsets': [0, 10**12]}}).encode()
open('hf-lies/model.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + bytes(100))"
run_case "generate hf weights past the file"  "$BIN" generate --init-from hf-lies --prompt hi
run_case "generate hf empty folder"          "$BIN" generate --init-from hf-empty --prompt hi
run_case "generate hf heads=0"               "$BIN" generate --init-from hf-noheads --prompt hi
run_case "generate hf eps=nan"               "$BIN" generate --init-from hf-nan --prompt hi
run_case "generate hf hidden mismatch"       "$BIN" generate --init-from hf-shape --prompt hi
run_case "generate hf vocab=0"               "$BIN" generate --init-from hf-vocab0 --prompt hi
run_case "generate hf no tokenizer, text"    "$BIN" generate --init-from hf-notok --prompt hi
run_case "generate hf no tokenizer, ids"     "$BIN" generate --init-from hf-notok --prompt-ids 1,2,3
run_case "generate hf a lethe XL run"        "$BIN" generate --init-from runs/base --prompt hi
run_case "generate hf --policy nosuch"       "$BIN" generate --init-from "$L" --prompt hi --policy nosuch --budget 4
run_case "generate hf --budget 0"            "$BIN" generate --init-from "$L" --prompt hi --policy window --budget 0
run_case "generate hf --budget -1"           "$BIN" generate --init-from "$L" --prompt hi --policy window --budget -1
run_case "generate hf --budget 2^64-1"       "$BIN" generate --init-from "$L" --prompt hi --policy window --budget 18446744073709551615
run_case "generate hf --budget 1/0"          "$BIN" generate --init-from "$L" --prompt hi --policy window --budget 1/0
run_case "generate hf --budget 3/2"          "$BIN" generate --init-from "$L" --prompt hi --policy window --budget 3/2
run_case "generate hf h2o without budget"    "$BIN" generate --init-from "$L" --prompt hi --policy h2o
run_case "generate hf full with budget"      "$BIN" generate --init-from "$L" --prompt hi --policy full --budget 4
run_case "generate hf snapkv:window=0"       "$BIN" generate --init-from "$L" --prompt hi --policy snapkv:window=0 --budget 4
run_case "generate hf snapkv:nosuch=1"       "$BIN" generate --init-from "$L" --prompt hi --policy snapkv:nosuch=1 --budget 4
run_case "generate hf streaming:sinks=99"    "$BIN" generate --init-from "$L" --prompt hi --policy streaming:sinks=99 --budget 4
run_case "generate hf --prompt-ids 1,,2"     "$BIN" generate --init-from "$L" --prompt-ids 1,,2
run_case "generate hf --prompt-ids 999999"   "$BIN" generate --init-from "$L" --prompt-ids 999999
run_case "generate hf --prompt-ids -1"       "$BIN" generate --init-from "$L" --prompt-ids -1
run_case "generate hf --prompt-ids ''"       "$BIN" generate --init-from "$L" --prompt-ids ''
run_case "generate hf --tokens huge"         --limit 20 "$BIN" generate --init-from "$L" --prompt hi --tokens 18446744073709551615
run_case "generate hf past positions"        "$BIN" generate --init-from "$L" --prompt-file text.txt --tokens 2
run_case "generate hf --prompt-file fifo"    "$BIN" generate --init-from "$L" --prompt-file fifo
run_case "generate --checkpoint and --init-from" "$BIN" generate --init-from "$L" --checkpoint runs/base --prompt hi
run_case "eval hf --data empty.txt"          "$BIN" eval --init-from "$L" --data empty.txt
run_case "eval hf --data fifo"               "$BIN" eval --init-from "$L" --data fifo
run_case "eval hf --policies nosuch"         "$BIN" eval --init-from "$L" --data text.txt --policies nosuch --budgets 1/2 --out e1
run_case "eval hf --budgets ''"              "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets '' --out e2
run_case "eval hf --budgets 1/2,1/2"         --must-fail "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2,1/2 --out e3
run_case "eval hf --policies without --out"  "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2
run_case "eval hf --out a run folder"        --keep "runs/base/checkpoint.safetensors runs/base/config.toml" "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2 --out runs/base
run_case "eval hf --out a file"              --keep "prompt.txt" "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2 --out prompt.txt
run_case "eval hf --learned an XL run"       "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2 --out e4 --learned runs/base
run_case "eval hf --learned nosuch"          "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2 --out e5 --learned nosuch
run_case "eval hf --learned other model"     "$BIN" eval --init-from "$FIXL/qwen2" --data text.txt --policies window --budgets 1/2 --out e6 --learned runs/lexp
run_case "eval hf --learned fine-tuned run"  "$BIN" eval --init-from "$L" --data text.txt --policies window --budgets 1/2 --out e7 --learned runs/lft
run_case "eval hf --context 0"               "$BIN" eval --init-from "$L" --data text.txt --context 0
run_case "bench hf --kv nosuch@4"            "$BIN" bench --init-from "$L" --kv nosuch@4 --contexts 32
run_case "bench hf --kv window"              "$BIN" bench --init-from "$L" --kv window --contexts 32
run_case "bench hf --kv window@0"            "$BIN" bench --init-from "$L" --kv window@0 --contexts 32
run_case "bench hf --contexts 0"             "$BIN" bench --init-from "$L" --contexts 0
run_case "bench hf --contexts 2^60"          "$BIN" bench --init-from "$L" --contexts 1152921504606846976
run_case "bench hf --decode-tokens 0"        "$BIN" bench --init-from "$L" --contexts 32 --decode-tokens 0
run_case "bench hf --learned XL run"         "$BIN" bench --init-from "$L" --contexts 32 --learned runs/base
run_case "bench hf --learned lexp@0"         "$BIN" bench --init-from "$L" --contexts 32 --learned runs/lexp@0
run_case "bench hf --out a run folder file"  --keep "runs/base/config.toml" "$BIN" bench --init-from "$L" --contexts 32 --out runs/base/config.toml
run_case "bench hf --precision f32,f32"      --must-fail "$BIN" bench --init-from "$L" --contexts 32 --precision f32,f32
run_case "bench hf --scale span=8"           --must-fail "$BIN" bench --init-from "$L" --contexts 32 --scale span=8
run_case "generate hf --precision bf17"      --must-fail "$BIN" generate --init-from "$L" --prompt-ids 1,2 --precision bf17
run_case "eval run --precision bf16"         --must-fail "$BIN" eval --checkpoint runs/base --precision bf16
run_case "bench hf --kv window@8 twice"      --must-fail "$BIN" bench --init-from "$L" --contexts 32 --kv window@8 --kv window@8
# longeval.
run_case "longeval --lengths 0"              "$BIN" longeval --checkpoint runs/base --out le1 --lengths 0 --suite passkey
run_case "longeval --lengths 2^60"           "$BIN" longeval --checkpoint runs/base --out le2 --lengths 1152921504606846976 --suite passkey
run_case "longeval --lengths 1x"             "$BIN" longeval --checkpoint runs/base --out le3 --lengths 1x --suite passkey
run_case "longeval --depths 101"             "$BIN" longeval --checkpoint runs/base --out le4 --depths 101 --suite passkey --lengths 320
run_case "longeval --depths -1"              "$BIN" longeval --checkpoint runs/base --out le5 --depths=-1 --suite passkey --lengths 320
run_case "longeval --depths nan"             "$BIN" longeval --checkpoint runs/base --out le5b --depths nan --suite passkey --lengths 320
run_case "longeval --samples 0"              "$BIN" longeval --checkpoint runs/base --out le6 --samples 0 --suite passkey --lengths 320
run_case "longeval --samples 1e6"            "$BIN" longeval --checkpoint runs/base --out le20 --samples 1000000 --suite passkey --lengths 320 --depths 50
run_case "longeval --samples 2^60"           "$BIN" longeval --checkpoint runs/base --out le7 --samples 1152921504606846976 --suite passkey --lengths 320
run_case "longeval --suite nosuch"           "$BIN" longeval --checkpoint runs/base --out le8 --suite nosuch
run_case "longeval --suite ''"               "$BIN" longeval --checkpoint runs/base --out le9 --suite ''
run_case "longeval --haystack empty.txt"     "$BIN" longeval --checkpoint runs/base --out le10 --suite niah_single_2 --lengths 320 --samples 1 --depths 50 --haystack empty.txt
run_case "longeval --haystack /dev/zero"     "$BIN" longeval --checkpoint runs/base --out le11 --suite niah_single_2 --lengths 320 --samples 1 --depths 50 --haystack /dev/zero
run_case "longeval --haystack fifo"          "$BIN" longeval --checkpoint runs/base --out le12 --suite niah_single_2 --lengths 320 --samples 1 --depths 50 --haystack fifo
run_case "longeval --out a run folder"       --keep "runs/base/checkpoint.safetensors runs/base/config.toml runs/base/metrics.jsonl" "$BIN" longeval --checkpoint runs/base --out runs/base --suite passkey --lengths 320 --samples 1 --depths 50
run_case "longeval --out a file"             --keep "prompt.txt" "$BIN" longeval --checkpoint runs/base --out prompt.txt --suite passkey --lengths 320 --samples 1 --depths 50
run_case "longeval --compare nosuch"         "$BIN" longeval --checkpoint runs/base --out le13 --suite passkey --lengths 320 --samples 1 --depths 50 --compare nosuch
run_case "longeval --compare itself"         "$BIN" longeval --checkpoint runs/base --out le14 --suite passkey --lengths 320 --samples 1 --depths 50 --compare runs/base
run_case "longeval --init-from without policies" "$BIN" longeval --init-from "$L" --out le15 --suite passkey --lengths 320 --samples 1 --depths 50
run_case "longeval hf --budgets 1/0"         "$BIN" longeval --init-from "$L" --out le16 --policies window --budgets 1/0 --suite passkey --lengths 320 --samples 1 --depths 50
run_case "longeval hf --block 0"             "$BIN" longeval --init-from "$L" --out le17 --policies window --budgets 8 --block 0 --suite passkey --lengths 320 --samples 1 --depths 50
run_case "longeval --checkpoint and --init-from" "$BIN" longeval --init-from "$L" --checkpoint runs/base --out le18 --suite passkey --lengths 320
"$BIN" longeval --checkpoint runs/base --out le19 --suite passkey --lengths 320 --samples 1 --depths 50 >/dev/null 2>&1
run_case "longeval rerun other samples"      "$BIN" longeval --checkpoint runs/base --out le19 --suite passkey --lengths 320 --samples 2 --depths 50
run_case "longeval rerun other checkpoint"   --keep "le19/longeval.csv" --must-fail "$BIN" longeval --checkpoint runs/lft --out le19 --suite passkey --lengths 320 --samples 1 --depths 50
printf 'garbage' > le19/longeval.json
run_case "longeval rerun corrupt json"       "$BIN" longeval --checkpoint runs/base --out le19 --suite passkey --lengths 320 --samples 1 --depths 50
# export.
run_case "export an XL run"                  "$BIN" export --checkpoint runs/base --out x1
run_case "export into an existing folder"    --keep "prompt.txt" "$BIN" export --checkpoint runs/lft --out .
run_case "export into the run folder"        --keep "runs/lft/checkpoint.safetensors runs/lft/config.toml" "$BIN" export --checkpoint runs/lft --out runs/lft
run_case "export an expire llama run"        "$BIN" export --checkpoint runs/lexp --out x2
run_case "export --out /proc/x"              "$BIN" export --checkpoint runs/lft --out /proc/x
run_case "export --out ''"                   "$BIN" export --checkpoint runs/lft --out ''
# Dialogue.
run_case "dialogue-data --conversations 0"   "$BIN" dialogue-data --out dd1 --conversations 0
run_case "dialogue-data --conversations 2^60" "$BIN" dialogue-data --out dd2 --conversations 1152921504606846976
run_case "dialogue-data --out a run folder"  --keep "runs/base/config.toml runs/base/checkpoint.safetensors" "$BIN" dialogue-data --out runs/base --conversations 20
run_case "dialogue-data --out a file"        --keep "prompt.txt" "$BIN" dialogue-data --out prompt.txt --conversations 20
run_case "dialogue-eval an XL copy run"      "$BIN" dialogue-eval --checkpoint runs/base
run_case "chat an XL copy run"               --must-fail "$BIN" chat --checkpoint runs/base --document prompt.txt
run_case "chat --document fifo"              "$BIN" chat --checkpoint runs/base --document fifo
run_case "score empty files"                 "$BIN" score empty.txt empty.txt
run_case "score unequal lines"               "$BIN" score text.txt prompt.txt
yes word | head -n 60000 | tr '\n' ' ' > oneline.txt
run_case "score a 60,000-word line"          "$BIN" score oneline.txt oneline.txt
run_case "score --wordnet nosuch"            "$BIN" score prompt.txt prompt.txt --wordnet nosuch
run_case "score --wordnet empty folder"      "$BIN" score prompt.txt prompt.txt --wordnet hf-empty
# Training a decoder.
run_case "train llama lora_rank 2^40"        "$BIN" train -q "${LT[@]}" --set train.lora_rank=1099511627776 --name t1
run_case "train llama lora_alpha nan"        "$BIN" train -q "${LT[@]}" --set train.lora_rank=2 --set train.lora_alpha=nan --name t1b
run_case "train llama precision=bf17"        "$BIN" train -q "${LT[@]}" --set train.precision=bf17 --name t2
run_case "train llama span 2^40"             "$BIN" train -q "${LT[@]}" --set memory.mechanism=expire --set memory.span=1099511627776 --name t4
run_case "train llama infinity"              "$BIN" train -q "${LT[@]}" --set memory.mechanism=infinity --name t5
run_case "train llama compressive"           "$BIN" train -q "${LT[@]}" --set memory.mechanism=compressive --name t6
run_case "train llama freeze_base, fixed"    "$BIN" train -q "${LT[@]}" --set train.freeze_base=true --name t7
run_case "train --init-from hf, no tokenizer" "$BIN" train -q --init-from hf-notok --data text.txt --steps 2 --name t8
run_case "train --init-from hf heads=0"      "$BIN" train -q --init-from hf-noheads --data text.txt --steps 2 --name t9
# LT without its --init-from and --steps: the run continued from its own checkpoint.
run_case "train --resume a llama run"        "$BIN" train -q "${LT[@]:2:8}" --resume --steps 4 --name lft
for c in "${!COUNT[@]}"; do echo "$c: ${COUNT[$c]}"; done | sort | tee -a "$LOG"
