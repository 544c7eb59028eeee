// Expire-Span's attention bias on a GPU: the element functions of csrc/expire_bias.h,
// one thread per element, in three kernels (the bias, the span loss's ramp parts, the
// backward pass) where the written-out path takes about thirty libtorch operations on
// (b, m, n) and (b, h, m, n) tensors. Built into liblethe_cuda.so by
// scripts/build-cuda.sh; csrc/expire_bias.cpp loads it and calls the two entry points
// below with tensors libtorch allocated.

#include "../expire_bias.h"
#include "launch.cuh"

namespace {

using lethe_cuda::blocks_for;
using lethe_cuda::THREADS;

template <typename T>
lethe_bias::Operands<T> operands_of(const lethe_cuda_bias_args* a) {
  return {static_cast<const T*>(a->pq), static_cast<const T*>(a->spans), static_cast<const T*>(a->counter), a->usable,
          static_cast<T>(a->ramp)};
}

lethe_bias::Shape shape_of(const lethe_cuda_bias_args* a) { return {a->b, a->h, a->m, a->n, a->p, a->u}; }

template <typename T>
__global__ void bias_kernel(lethe_bias::Shape s, lethe_bias::Operands<T> o, T* bias, int64_t row, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) bias[i / s.n * row + i % s.n] = lethe_bias::bias_at(s, o, i);
}

template <typename T>
__global__ void ramp_kernel(lethe_bias::Shape s, lethe_bias::Operands<T> o, T* counts, double* distances,
                            int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) lethe_bias::ramp_at(s, o, i, counts, distances);
}

template <typename T>
__global__ void backward_kernel(lethe_bias::Shape s, lethe_bias::Operands<T> o, const T* grad, int64_t grad_row,
                                T* grad_pq, T* partial, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) lethe_bias::backward_at(s, o, grad, grad_row, grad_pq, partial, i);
}

template <typename T>
void forward(const lethe_cuda_bias_args* a) {
  const lethe_bias::Shape s = shape_of(a);
  const auto o = operands_of<T>(a);
  const int64_t pairs = s.b * s.h * s.m * s.n;
  if (pairs > 0) bias_kernel<T><<<blocks_for(pairs), THREADS>>>(s, o, static_cast<T*>(a->bias), a->bias_row, pairs);
  const int64_t keys = s.b * s.n;
  if (a->counts != nullptr && keys > 0)
    ramp_kernel<T><<<blocks_for(keys), THREADS>>>(s, o, static_cast<T*>(a->counts), a->distances, keys);
}

template <typename T>
void backward(const lethe_cuda_bias_args* a) {
  const lethe_bias::Shape s = shape_of(a);
  const int64_t count = s.b * s.h * s.query_chunks() * s.n;
  if (count == 0) return;
  backward_kernel<T><<<blocks_for(count), THREADS>>>(s, operands_of<T>(a), static_cast<const T*>(a->grad),
                                                     a->grad_row, static_cast<T*>(a->grad_pq),
                                                     static_cast<T*>(a->partial), count);
}

}  // namespace

extern "C" {

int lethe_cuda_abi(void) { return LETHE_CUDA_ABI; }

int lethe_cuda_expire_bias_forward(const lethe_cuda_bias_args* a, char* message, int64_t size) {
  return lethe_cuda::on_device(a->device, message, size, [&] { a->is_double ? forward<double>(a) : forward<float>(a); });
}

int lethe_cuda_expire_bias_backward(const lethe_cuda_bias_args* a, char* message, int64_t size) {
  return lethe_cuda::on_device(a->device, message, size, [&] { a->is_double ? backward<double>(a) : backward<float>(a); });
}

}  // extern "C"
