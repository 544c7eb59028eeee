#!/usr/bin/env bash
# Builds liblethe_nccl.so, lethe's NCCL process group for data-parallel ranks on GPUs
# (crates/kernels/csrc/nccl/: c10d's ProcessGroupNCCL from the libtorch lethe uses), which
# `lethe` loads at run time from beside its executable or from the file LETHE_NCCL names.
# Without it, GPU ranks reduce their gradients over Gloo (train.dist_backend = "gloo").
#
#   scripts/build-nccl.sh [OUT]     default OUT: target/release/liblethe_nccl.so
#
# The compiler is the system's C++ compiler; no GPU and no CUDA compiler are needed. The
# headers are the torch wheel's (with its nvidia-nccl and CUDA runtime packages) and two
# header-only PyPI packages of CUDA 13.0 (nvidia-cuda-crt, nvidia-cuda-cccl) that the
# wheel leaves out, installed once into .cuda-headers/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/release/liblethe_nccl.so}
. scripts/env.sh

toolkit=.cuda-headers
if [ ! -e "$toolkit/nvidia/cu13/include/crt/host_config.h" ] || [ ! -d "$toolkit/nvidia/cu13/include/nv" ]; then
    echo "build-nccl: installing CUDA's host headers from PyPI into $toolkit (one time)" >&2
    python -m pip install --quiet --upgrade --no-deps --target "$toolkit" \
        "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
fi
site=$(python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
torch=$site/torch
for need in "$site/nvidia/nccl/include/nccl.h" "$site/nvidia/cu13/include/cuda_runtime_api.h" "$torch/lib/libtorch_cuda.so"; do
    [ -e "$need" ] || { echo "build-nccl: no $need (a CUDA build of torch 2.11.0 is needed)" >&2; exit 1; }
done
mkdir -p "$(dirname "$out")"
# The same flags as lethe's other C++ (crates/kernels/build.rs); the headers of libtorch,
# CUDA and NCCL are system headers, their warnings not ours.
"${CXX:-c++}" -std=c++17 -O2 -shared -fPIC -Wall -Wextra -Werror \
    -DUSE_C10D_NCCL -DUSE_CUDA -D_GLIBCXX_USE_CXX11_ABI=1 \
    -isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include" \
    -isystem "$toolkit/nvidia/cu13/include" -isystem "$site/nvidia/cu13/include" \
    -isystem "$site/nvidia/nccl/include" \
    -o "$out" crates/kernels/csrc/nccl/process_group_nccl.cpp \
    -L"$torch/lib" -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -ltorch_cpu -lc10 -Wl,-rpath,"$torch/lib"
echo "build-nccl: wrote $out"
