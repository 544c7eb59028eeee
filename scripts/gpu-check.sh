#!/usr/bin/env bash
# lethe on a GPU, checked end to end on a machine that has a GPU and PyTorch but no Rust
# toolchain (build here, run there).
#
#   scripts/gpu-check.sh pack DIR        here: build the release `lethe`, the GPU test
#                                        binary (tests/gpu.rs), the GPU kernels
#                                        (scripts/build-cuda.sh) and the NCCL group
#                                        (scripts/build-nccl.sh) and put them in DIR, with
#                                        the shared libraries they need beyond libtorch
#   scripts/gpu-check.sh run DIR OUT     there, from the repository's root: the GPU tests
#                                        (LETHE_REQUIRE_GPU=1, so none can skip), a run
#                                        trained on the GPU then evaluated and resumed on
#                                        the CPU, and `lethe bench` on the GPU; logs in OUT
#   scripts/gpu-check.sh presets DIR OUT there: two steps of each paper-size preset that
#                                        follows an official script and has not run on a
#                                        GPU yet (collision, one-GPU enwik8, Table 1's
#                                        copy), with the GPU's memory sampled; a few minutes
#   scripts/gpu-check.sh table4 DIR OUT  there: the GPU tests, enwik8-tiny at equal
#                                        memory in turns (Expire-Span through its bias
#                                        kernels, then written out) and profiled, and the
#                                        paper's Table 4 at its size (Transformer-XL,
#                                        Expire-Span both ways, Compressive, Adaptive-Span;
#                                        time, the allocator's peak beside nvidia-smi's);
#                                        about 8 minutes
#   scripts/gpu-check.sh deletion DIR BEFORE OUT
#                                        there: the GPU tests, then enwik8-tiny at
#                                        equal memory in turns with the binaries of DIR
#                                        and of BEFORE (another pack, its lethe and
#                                        liblethe_cuda.so) alternately, three times,
#                                        each build's steps profiled, DIR's traced
#                                        (OUT/trace-tiny.txt), the Table-4 analogue's
#                                        Transformer-XL and Expire-Span rows with DIR's
#                                        and Expire-Span's with BEFORE's; 4 minutes
#   scripts/gpu-check.sh scale-out DIR OUT
#                                        there: bfloat16 against float32 (the GPU test of
#                                        every mechanism's losses, then their steps in
#                                        turns), NCCL with one rank and two ranks sharing
#                                        the GPU over Gloo against one process, two NCCL
#                                        ranks on one GPU refused, a pretrained decoder
#                                        under every cache policy against the CPU and in
#                                        bfloat16 and float16 against transformers, and the
#                                        paper's enwik8 models in float32 and bfloat16 (the
#                                        allocator's peak beside nvidia-smi's); about 8
#                                        minutes
#
# `run` uses the libtorch of the `python3` there (torch 2.11.0, the version lethe is
# built against; a CUDA build of it) through LD_LIBRARY_PATH. A GPU's memory in use is
# sampled with nvidia-smi into OUT/gpu-memory.csv; bench reports the allocator's peak too.
# It writes every figure the README's "On a GPU" quotes; about 10 minutes on an H100
# (the paper-size benches most of it).
set -uo pipefail

pack() {
    local dir=$1
    . scripts/env.sh || exit 1
    cargo build --release --quiet || exit 1
    local test_bin
    test_bin=$(cargo test --release --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])') || exit 1
    mkdir -p "$dir/lib"
    # The GPU kernels, beside the binaries that load them.
    scripts/build-cuda.sh "$dir/liblethe_cuda.so" || exit 1
    scripts/build-nccl.sh "$dir/liblethe_nccl.so" || exit 1
    # The Python package as `pip install .` builds it (scripts/python-test.sh), for its GPU test.
    scripts/python-test.sh --collect-only -q >/dev/null || exit 1
    rm -rf "$dir/python" && mkdir -p "$dir/python"
    cp -r "$(python -c 'import os, lethe; print(os.path.dirname(lethe.__file__))')" "$dir/python/lethe"
    cp target/release/lethe "$dir/lethe"
    cp "$test_bin" "$dir/gpu-tests"
    strip "$dir/lethe" "$dir/gpu-tests"
    # What the binaries link beyond libtorch and the C library (fontconfig for plots).
    ldd target/release/lethe | awk '/=> \// {print $3}' |
        grep -E 'fontconfig|freetype|expat|png16|brotli|libz\.' | xargs -I{} cp -L {} "$dir/lib/"
    ls -la "$dir" "$dir/lib"
}

# There, before a stage: checks that DIR holds the packed binaries, sets `dir` (DIR's
# full path) and `out` (OUT, created), and points the binaries at that machine's torch.
on_gpu_machine() {
    [ -x "$1/lethe" ] && [ -x "$1/gpu-tests" ] || { echo "$0: $1 holds no lethe and gpu-tests: run '$0 pack $1' on the build machine first" >&2; exit 2; }
    dir=$(realpath "$1") out=$2
    mkdir -p "$out"
    local torch_lib
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || exit 1
    export LD_LIBRARY_PATH="$torch_lib:$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run() {
    local dir out
    on_gpu_machine "$1" "$2"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 250 >"$out/gpu-memory.csv" &
    local sampler=$!
    local lethe=$dir/lethe work
    work=$(mktemp -d)
    stage() { echo; echo "== $(date +%T) $*"; }

    stage "GPU tests (tests/gpu.rs)"
    LETHE_REQUIRE_GPU=1 timeout 240 "$dir/gpu-tests" --nocapture --test-threads 1 2>&1 | tee "$out/gpu-tests.txt"

    stage "copy-tiny trained 300 steps on the GPU, evaluated on both, resumed to 400 on the CPU"
    timeout 120 "$lethe" train -p copy-tiny --device cuda --steps 300 --out "$work" --name on-gpu 2>&1 | tail -n 6
    for device in cuda cpu; do
        echo "eval on $device:"
        timeout 60 "$lethe" eval --checkpoint "$work/on-gpu" --device $device 2>&1 | tail -n 4
    done
    timeout 120 "$lethe" train -p copy-tiny --device cpu --steps 400 --out "$work" --name on-gpu --resume 2>&1 | tail -n 3

    stage "bench: enwik8-tiny on the GPU, every mechanism in turns"
    timeout 150 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 5 --rounds 10 \
        --mechanism fixed:108 --mechanism expire:1024 --mechanism fixed:256 --mechanism adaptive:1024 \
        --mechanism compressive:512 --mechanism infinity:512 --out "$work/bench-tiny" 2>&1 |
        grep -v '^round ' | tee "$out/bench-tiny.txt"

    stage "bench: spans on the GPU in turns"
    timeout 150 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 2 --rounds 5 \
        --mechanism expire --scale span=1024,16384,65536 --out "$work/bench-expire" 2>&1 | grep -v '^round ' | tee "$out/bench-spans.txt"
    timeout 150 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 2 --rounds 5 \
        --mechanism fixed --scale span=256,1024,4096,16384 --out "$work/bench-fixed" 2>&1 | grep -v '^round ' | tee -a "$out/bench-spans.txt"

    stage "bench: where the step goes (--profile), Transformer-XL and Expire-Span at equal memory"
    for mechanism in fixed:108 expire:1024; do
        timeout 100 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 20 --profile --mechanism $mechanism \
            --out "$work/profile" 2>&1 | grep -v '^wrote ' | tee -a "$out/bench-profile.txt"
    done

    stage "bench: the paper's enwik8 models (12 layers x 512, batch 512 in the presets' 32 micro-batches), float32 then TF32"
    for tf32 in false true; do
        for preset in enwik8-12l enwik8-expire-12l; do
            timeout 240 "$lethe" bench -p $preset --device cuda --bench-steps 3 --set train.tf32=$tf32 \
                --out "$work/bench-$preset" 2>&1 | tee -a "$out/bench-12l.txt"
        done
    done

    stage "a GPU out of memory: enwik8-expire-12l in micro-batches of 64 streams (one line and the advice, exit 1)"
    timeout 240 "$lethe" bench -p enwik8-expire-12l --device cuda --bench-steps 1 --set train.accum=8 --out "$work/oom" 2>&1 |
        tee "$out/out-of-memory.txt"
    local status=${PIPESTATUS[0]}
    echo "exit status $status" | tee -a "$out/out-of-memory.txt"

    stage "done"
    kill $sampler 2>/dev/null
}

# Two timed steps of each preset at its own batch and micro-batches, on the GPU.
presets() {
    local dir out
    on_gpu_machine "$1" "$2"
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 250 >"$out/gpu-memory-presets.csv" &
    local sampler=$! work
    work=$(mktemp -d)
    for preset in collision-expire-16k collision-expire-64k enwik8-expire-8l copy-expire-16k copy-expire-128k; do
        echo "== $(date +%T) $preset"
        timeout 120 "$dir/lethe" bench -p $preset --device cuda --bench-steps 2 --out "$work/$preset" 2>&1 | tee -a "$out/bench-presets.txt"
    done
    kill $sampler 2>/dev/null
}

# Paper-size configs read from stdin, one a line (NAME PRESET MECHANISM [FLAGS...]): two
# frozen steps of each with LETHE, one process each within LIMIT seconds, the bench's
# figures (the allocator's peak among them) and nvidia-smi's largest reading while it
# ran, appended to LOG; WORK holds the samples and bench folders.
paper_rows() {
    local lethe=$1 log=$2 limit=$3 work=$4 name preset mechanism extra sampler
    while read -r name preset mechanism extra; do
        echo "== $(date +%T) $name: -p $preset --mechanism $mechanism $extra" | tee -a "$log"
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 </dev/null >"$work/smi-$name.csv" &
        sampler=$!
        # shellcheck disable=SC2086
        timeout "$limit" "$lethe" bench -p "$preset" --device cuda --bench-steps 2 --warmup 1 --frozen \
            --mechanism "$mechanism" $extra --out "$work/bench" </dev/null 2>&1 | grep -v '^streamed ' | tee -a "$log"
        kill $sampler 2>/dev/null
        echo "nvidia-smi at most: $(sort -n "$work/smi-$name.csv" | tail -n 1) MiB" | tee -a "$log"
    done
}

# The paper's Table 4 at its size, one config per process so that each has its own
# peak: the allocator's (bench's "GPU" figure) beside nvidia-smi's largest reading while
# the process ran (the allocator's cache and the CUDA context on top). Expire-Span's
# spans are frozen at 5% of L = 16k (about 820 memories a layer, under Transformer-XL's
# 1024), through its bias kernels and written out (memory.expire.fused=false). Before
# them: every GPU test, and Transformer-XL and Expire-Span at equal memory at
# enwik8-tiny, in turns, both ways, then Expire-Span's step profiled.
table4() {
    local dir out
    on_gpu_machine "$1" "$2"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/table4.txt"
    local work
    work=$(mktemp -d)
    echo "== $(date +%T) the GPU tests (tests/gpu.rs), Expire-Span's bias kernels among them" | tee -a "$out/table4.txt"
    LETHE_REQUIRE_GPU=1 timeout 120 "$dir/gpu-tests" --nocapture --test-threads 1 2>&1 | tee -a "$out/table4.txt"
    local way extra
    for way in kernels written-out; do
        extra=""
        [ $way = written-out ] && extra="--set memory.expire.fused=false"
        echo "== $(date +%T) enwik8-tiny at equal memory, in turns, Expire-Span $way" | tee -a "$out/table4.txt"
        # shellcheck disable=SC2086
        timeout 90 "$dir/lethe" bench -p enwik8-tiny --device cuda --bench-steps 5 --rounds 10 \
            --mechanism fixed:108 --mechanism expire:1024 $extra --out "$work/tiny" 2>&1 | grep -v '^round ' | tee -a "$out/table4.txt"
    done
    echo "== $(date +%T) where an Expire-Span step goes at enwik8-tiny (--profile), with the kernels" | tee -a "$out/table4.txt"
    timeout 60 "$dir/lethe" bench -p enwik8-tiny --device cuda --bench-steps 20 --profile --mechanism expire:1024 \
        --out "$work/profile" 2>&1 | grep -v '^wrote ' | tee -a "$out/table4.txt"
    paper_rows "$dir/lethe" "$out/table4.txt" 170 "$work" <<'CONFIGS'
xl-1024 enwik8-12l fixed:1024
expire-16k enwik8-expire-12l expire:16384 --set memory.expire.init_fraction=0.05
expire-16k-written-out enwik8-expire-12l expire:16384 --set memory.expire.init_fraction=0.05 --set memory.expire.fused=false
compressive-2k enwik8-12l compressive:2048
adaptive-16k enwik8-12l adaptive:16384
CONFIGS
    echo "== $(date +%T) done" | tee -a "$out/table4.txt"
}

# A change to Expire-Span's GPU path against the pack before it, on one machine: enwik8-tiny
# at equal memory (Transformer-XL 108 and Expire-Span 1024, in turns within each bench)
# with the two builds alternately, each build's steps profiled and the new one's traced,
# then the paper-size Transformer-XL and Expire-Span rows of the Table-4 analogue with
# the new build, and Expire-Span's with the old.
deletion() {
    local dir out before
    on_gpu_machine "$1" "$3"
    [ -x "$2/lethe" ] && [ -f "$2/liblethe_cuda.so" ] || { echo "$0: $2 holds no lethe and liblethe_cuda.so" >&2; exit 2; }
    before=$(realpath "$2")
    local log=$out/deletion.txt work
    work=$(mktemp -d)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$log"
    echo "== $(date +%T) the GPU tests (tests/gpu.rs)" | tee -a "$log"
    LETHE_REQUIRE_GPU=1 timeout 150 "$dir/gpu-tests" --nocapture --test-threads 1 2>&1 | tee -a "$log"
    local round build lethe
    for round in 1 2 3; do
        for build in before after; do
            lethe=$dir/lethe
            [ $build = before ] && lethe=$before/lethe
            echo "== $(date +%T) round $round, $build: enwik8-tiny at equal memory, in turns" | tee -a "$log"
            timeout 60 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 20 --rounds 10 \
                --mechanism fixed:108 --mechanism expire:1024 --out "$work/tiny-$build" </dev/null 2>&1 |
                grep -v '^round ' | tee -a "$log"
        done
    done
    local mechanism
    for build in before after; do
        lethe=$dir/lethe
        [ $build = before ] && lethe=$before/lethe
        for mechanism in fixed:108 expire:1024; do
            echo "== $(date +%T) $build: where a $mechanism step goes at enwik8-tiny (--profile)" | tee -a "$log"
            timeout 45 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 20 --profile --mechanism $mechanism \
                --out "$work/profile-$build" </dev/null 2>&1 | grep -v '^wrote ' | tee -a "$log"
        done
    done
    echo "== $(date +%T) after: both steps traced, summed per operation (scripts/trace-summary.py)" | tee -a "$log"
    for mechanism in fixed:108 expire:1024; do
        timeout 60 "$dir/lethe" bench -p enwik8-tiny --device cuda --bench-steps 10 --profile --trace \
            --mechanism $mechanism --out "$work/trace" </dev/null >/dev/null 2>&1
    done
    python3 scripts/trace-summary.py "$work"/trace/enwik8-tiny/trace-fixed-108-s1.json \
        "$work"/trace/enwik8-tiny/trace-expire-1024-s1.json --steps 10 --top 70 >"$out/trace-tiny.txt" 2>&1
    head -n 40 "$out/trace-tiny.txt" | tee -a "$log"
    paper_rows "$dir/lethe" "$log" 120 "$work" <<'CONFIGS'
xl-1024 enwik8-12l fixed:1024
expire-16k enwik8-expire-12l expire:16384 --set memory.expire.init_fraction=0.05
CONFIGS
    echo "== $(date +%T) before: expire-16k" | tee -a "$log"
    timeout 120 "$before/lethe" bench -p enwik8-expire-12l --device cuda --bench-steps 2 --warmup 1 --frozen \
        --mechanism expire:16384 --set memory.expire.init_fraction=0.05 --out "$work/bench-before" </dev/null 2>&1 |
        grep -v '^streamed ' | tee -a "$log"
    echo "== $(date +%T) done" | tee -a "$log"
}

# The losses of the runs named on the command line (their metrics.jsonl), step by step,
# and the largest relative gap of each to the first: "same" when every gap is below 1e-5.
compare_losses() {
    python3 - "$@" <<'PY'
import json, sys
runs = [[json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if json.loads(l).get("split") == "train"] for d in sys.argv[1:]]
for d, losses in zip(sys.argv[1:], runs):
    gap = max(abs(a - b) / abs(a) for a, b in zip(runs[0], losses)) if len(losses) == len(runs[0]) else float("inf")
    print(f"{d}: {len(losses)} steps, loss {losses[0]:.5f} -> {losses[-1]:.5f}, largest gap to the first {gap:.2e} ({'same' if gap < 1e-5 else 'DIFFERENT'})")
PY
}

# What training on GPUs the way users do needs checked on a GPU: bfloat16 against
# float32 (losses and steps, every mechanism), the NCCL group (one rank; two ranks on
# one GPU refused), two ranks sharing the GPU over Gloo, and the paper-size enwik8 models
# in both precisions with the allocator's peak beside nvidia-smi's.
scale_out() {
    local dir out
    on_gpu_machine "$1" "$2"
    local log=$out/scale-out.txt work lethe=$dir/lethe
    work=$(mktemp -d)
    export LETHE_NCCL=$dir/liblethe_nccl.so
    local run=(python3 -m torch.distributed.run --nproc-per-node)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$log"
    echo "== $(date +%T) GPU tests: bfloat16 against float32, the allocator, the pretrained decoder" | tee -a "$log"
    LETHE_REQUIRE_GPU=1 timeout 150 "$dir/gpu-tests" bfloat16 allocator decoder --nocapture --test-threads 1 2>&1 | tee -a "$log"
    echo "== $(date +%T) lethe generate --init-from on the GPU and on the CPU, in f32 and bf16 (the same ids)" | tee -a "$log"
    for precision in f32 bf16; do
        for device in cuda cpu; do
            timeout 60 "$lethe" generate --init-from tests/fixtures/llama/llama3 --device $device --prompt-ids 5,17,99,3,42 \
                --tokens 16 --policy h2o --budget 8 --precision $precision --print-ids </dev/null 2>&1 | tail -n 2 | tee -a "$log"
        done
    done
    echo "== $(date +%T) enwik8-tiny, every mechanism in float32 and bfloat16, in turns" | tee -a "$log"
    timeout 120 "$lethe" bench -p enwik8-tiny --device cuda --bench-steps 5 --rounds 4 --precision f32,bf16 \
        --mechanism fixed:256 --mechanism expire:1024 --mechanism adaptive:1024 --mechanism compressive:512 \
        --mechanism infinity:512 --out "$work/bench" </dev/null 2>&1 | grep -v '^round ' | tee -a "$log"
    echo "== $(date +%T) NCCL: dist-check with one rank" | tee -a "$log"
    timeout 60 "${run[@]}" 1 --master-port 29611 --no-python "$lethe" dist-check --backend nccl --elements 4194304 \
        </dev/null 2>&1 | tee -a "$log"
    echo "== $(date +%T) copy-tiny 100 steps on the GPU: one process, one NCCL rank, two Gloo ranks sharing the GPU (against accum 2)" | tee -a "$log"
    local train=(train -p copy-tiny --device cuda --steps 100 --set train.log_every=5 --out "$work/runs")
    timeout 60 "$lethe" "${train[@]}" --name plain </dev/null 2>&1 | tail -n 2 | tee -a "$log"
    timeout 60 "${run[@]}" 1 --master-port 29612 --no-python "$lethe" "${train[@]}" --name nccl-1 </dev/null 2>&1 | tail -n 2 | tee -a "$log"
    timeout 60 "$lethe" "${train[@]}" --name plain-accum2 --set train.accum=2 </dev/null 2>&1 | tail -n 2 | tee -a "$log"
    timeout 90 "${run[@]}" 2 --master-port 29613 --no-python "$lethe" "${train[@]}" --name gloo-2 \
        --set train.dist_backend='"gloo"' </dev/null 2>&1 | tail -n 2 | tee -a "$log"
    compare_losses "$work/runs/plain" "$work/runs/nccl-1" | tee -a "$log"
    compare_losses "$work/runs/plain-accum2" "$work/runs/gloo-2" | tee -a "$log"
    echo "== $(date +%T) two NCCL ranks on one GPU (refused in one line each)" | tee -a "$log"
    timeout 60 "${run[@]}" 2 --master-port 29614 --no-python "$lethe" "${train[@]}" --name nccl-2 </dev/null 2>&1 |
        grep -E '^error|exit' | tee -a "$log"
    echo "== $(date +%T) the Python package's GPU tests (python/tests/test_layers.py, test_decoder.py)" | tee -a "$log"
    if python3 -c 'import pytest' 2>/dev/null; then
        PYTHONPATH=$dir/python timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_layers.py \
            python/tests/test_decoder.py -k gpu 2>&1 |
            tail -n 5 | tee -a "$log"
    else
        echo "no pytest for this machine's python3: skipped" | tee -a "$log"
    fi
    paper_rows "$lethe" "$log" 150 "$work" <<'CONFIGS'
xl-1024-f32 enwik8-12l fixed:1024
xl-1024-bf16 enwik8-12l fixed:1024 --set train.precision="bf16"
expire-16k-f32 enwik8-expire-12l expire:16384 --set memory.expire.init_fraction=0.05
expire-16k-bf16 enwik8-expire-12l expire:16384 --set memory.expire.init_fraction=0.05 --set train.precision="bf16"
CONFIGS
    echo "== $(date +%T) done" | tee -a "$log"
}

case "${1:-}" in
    pack) pack "${2:?pack DIR}" ;;
    run) run "${2:?run DIR OUT}" "${3:?run DIR OUT}" ;;
    presets) presets "${2:?presets DIR OUT}" "${3:?presets DIR OUT}" ;;
    table4) table4 "${2:?table4 DIR OUT}" "${3:?table4 DIR OUT}" ;;
    scale-out) scale_out "${2:?scale-out DIR OUT}" "${3:?scale-out DIR OUT}" ;;
    deletion) deletion "${2:?deletion DIR BEFORE OUT}" "${3:?deletion DIR BEFORE OUT}" "${4:?deletion DIR BEFORE OUT}" ;;
    *) sed -n '2,42p' "$0"; exit 2 ;;
esac
