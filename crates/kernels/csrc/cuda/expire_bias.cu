// Expire-Span's attention bias on a GPU: the element functions of csrc/expire_bias.h,
// one thread per element, in four kernels (the bias, the span loss's ramp parts, the
// loss itself, the backward pass) where the written-out path takes about thirty libtorch operations on
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

// One block: every key's loss term, each thread a stride of them, then added up in a
// fixed tree, so that the same operands give the same loss.
template <typename T>
__global__ void loss_kernel(int64_t b, int64_t n, const T* spans, const T* counts, const double* distances,
                            double scale, T* loss) {
  __shared__ double part[THREADS];
  double total = 0.0;
  for (int64_t i = threadIdx.x; i < b * n; i += blockDim.x) total += lethe_bias::loss_term(spans, counts, distances, i);
  part[threadIdx.x] = total;
  __syncthreads();
  for (int stride = THREADS / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) part[threadIdx.x] += part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = T(part[0] / static_cast<double>(b) * scale);
}

template <typename T>
__global__ void backward_kernel(lethe_bias::Shape s, lethe_bias::Operands<T> o, const T* grad, int64_t grad_row,
                                T* grad_pq, T* partial, lethe_bias::LossGrad<T> loss, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) lethe_bias::backward_at(s, o, grad, grad_row, grad_pq, partial, loss, i);
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
  if (a->counts != nullptr && a->loss != nullptr && keys > 0)
    loss_kernel<T><<<1, THREADS>>>(s.b, s.n, o.spans, static_cast<const T*>(a->counts), a->distances, a->loss_scale,
                                   static_cast<T*>(a->loss));
}

template <typename T>
void backward(const lethe_cuda_bias_args* a) {
  const lethe_bias::Shape s = shape_of(a);
  const int64_t count = s.b * s.h * s.query_chunks() * s.n;
  if (count == 0) return;
  const lethe_bias::LossGrad<T> loss{static_cast<const T*>(a->counts), static_cast<const T*>(a->loss_grad),
                                     a->loss_scale};
  backward_kernel<T><<<blocks_for(count), THREADS>>>(s, operands_of<T>(a), static_cast<const T*>(a->grad),
                                                     a->grad_row, static_cast<T*>(a->grad_pq),
                                                     static_cast<T*>(a->partial), loss, count);
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
