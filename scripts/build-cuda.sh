#!/usr/bin/env bash
# Builds liblethe_cuda.so, lethe's GPU kernels (crates/kernels/csrc/cuda/: Expire-Span's attention
# bias), which `lethe` loads at run time from beside its executable or from the file
# LETHE_CUDA_KERNELS names. Without it a GPU runs the same numbers through libtorch's
# operations, slower.
#
#   scripts/build-cuda.sh [OUT]     default OUT: target/release/liblethe_cuda.so
#
# The compiler is CUDA's nvcc: the one on PATH, else PyPI's nvidia-cuda-nvcc,
# nvidia-cuda-crt and nvidia-nvvm (13.0.x, the CUDA of torch 2.11.0's cu130 build),
# installed once into .cuda-toolkit/. The library links the CUDA runtime of lethe's torch
# (libcudart.so.13 from its nvidia/cu13 folder), which libtorch's CUDA backend has
# loaded by the time lethe loads the kernels. LETHE_CUDA_ARCH picks the GPUs it is
# built for (default sm_90: the H100 and H200).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/release/liblethe_cuda.so}
arch=${LETHE_CUDA_ARCH:-sm_90}
. scripts/env.sh

toolkit=.cuda-toolkit
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ]; then
    nvcc=$toolkit/nvidia/cu13/bin/nvcc
    if [ ! -x "$nvcc" ]; then
        echo "build-cuda: installing CUDA's compiler from PyPI into $toolkit (one time)" >&2
        python -m pip install --quiet --target "$toolkit" \
            "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*"
    fi
fi
cuda=$(python -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
[ -e "$cuda/lib/libcudart.so.13" ] || { echo "build-cuda: no libcudart.so.13 in $cuda/lib (a CUDA build of torch is needed)" >&2; exit 1; }
headers=$(dirname "$(dirname "$nvcc")")/include
mkdir -p "$(dirname "$out")"
# No fused multiply-adds, as the CPU's C++ (crates/kernels/build.rs): the kernels round as its loops do.
"$nvcc" -arch="$arch" -O3 --fmad=false -std=c++17 -shared -Werror all-warnings \
    -Xcompiler -fPIC,-Wall,-Wextra -I"$headers" -I"$cuda/include" \
    -L"$cuda/lib" -cudart none -l:libcudart.so.13 \
    -o "$out" crates/kernels/csrc/cuda/*.cu
echo "build-cuda: wrote $out ($arch)"
