// What every kernel file of liblethe_cuda.so shares: the block size, the grid for a
// count of elements, and how an entry point reports a failed launch and runs on the
// tensors' GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace lethe_cuda {

constexpr int THREADS = 256;

inline unsigned blocks_for(int64_t count) { return static_cast<unsigned>((count + THREADS - 1) / THREADS); }

// 0, or the last launch's error code with its message.
inline int status(char* message, int64_t size) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  std::snprintf(message, static_cast<size_t>(size), "CUDA: %s", cudaGetErrorString(e));
  return static_cast<int>(e);
}

// Runs `launch` with `device` the current GPU (libtorch's guards restore theirs after
// each operation, so the calling thread's may be another), then restores the caller's.
template <typename F>
int on_device(int device, char* message, int64_t size, F launch) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || (previous != device && cudaSetDevice(device) != cudaSuccess))
    return status(message, size);
  launch();
  const int result = status(message, size);
  if (previous != device) cudaSetDevice(previous);
  return result;
}

}  // namespace lethe_cuda
