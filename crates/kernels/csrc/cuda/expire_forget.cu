// Expire-Span's deletion after a block on a GPU: the element functions of
// csrc/expire_forget.h in two kernels, where the libtorch path takes a dozen operations
// for the flags, a stable sort, a sum and an `index_select` per tensor, and two
// concatenations at the next block. The planning kernel runs one block of threads per
// stream (each thread a run of its slots, their kept counts added up in shared memory)
// and raises the most any stream keeps, which csrc/expire_forget.cpp reads back to size
// the new cache; the copying kernel moves one slot per block of threads.

#include "../expire_forget.h"
#include "launch.cuh"

namespace {

using lethe_cuda::THREADS;

// Threads that copy one slot's words.
constexpr int COPY_THREADS = 64;

lethe_forget::Shape shape_of(const lethe_cuda_forget_args* a) { return {a->b, a->n, a->words, a->m}; }

template <typename T>
lethe_forget::Operands<T> operands_of(const lethe_cuda_forget_args* a) {
  return {static_cast<const T*>(a->spans), static_cast<const T*>(a->counter), a->valid, static_cast<T>(a->ramp)};
}

// Block `stream`: thread t places the slots [t run, (t + 1) run) of the stream.
template <typename T>
__global__ void plan_kernel(lethe_forget::Shape s, lethe_forget::Operands<T> o, int32_t* dest, int32_t* most) {
  __shared__ int64_t before[THREADS];
  __shared__ int64_t kept;
  const int64_t stream = blockIdx.x, t = threadIdx.x;
  const int64_t run = (s.n + THREADS - 1) / THREADS;
  const int64_t first = t * run < s.n ? t * run : s.n, last = first + run < s.n ? first + run : s.n;
  int64_t count = 0;
  for (int64_t k = first; k < last; ++k) count += lethe_forget::keep_at(s, o, stream * s.n + k) ? 1 : 0;
  before[t] = count;
  __syncthreads();
  if (t == 0) {
    int64_t total = 0;
    for (int u = 0; u < THREADS; ++u) {
      const int64_t c = before[u];
      before[u] = total;
      total += c;
    }
    kept = total;
    atomicMax(most, static_cast<int32_t>(total));
  }
  __syncthreads();
  lethe_forget::place(s, o, stream, first, last, kept, before[t], dest);
}

template <typename T>
__global__ void copy_kernel(lethe_forget::Shape s, lethe_forget::Operands<T> o, const int32_t* dest, int64_t c,
                            const uint32_t* states, uint32_t* states_out, T* counter_out, bool* valid_out) {
  lethe_forget::copy_unit(s, o, dest, c, static_cast<int64_t>(blockIdx.x), threadIdx.x, blockDim.x, states,
                          states_out, counter_out, valid_out);
}

template <typename T>
void plan(const lethe_cuda_forget_args* a) {
  if (a->b == 0 || a->n == 0) return;
  plan_kernel<T><<<static_cast<unsigned>(a->b), THREADS>>>(shape_of(a), operands_of<T>(a), a->dest, a->most);
}

template <typename T>
void copy(const lethe_cuda_forget_args* a) {
  const int64_t units = a->b * (a->n + a->m);
  if (units == 0) return;
  copy_kernel<T><<<static_cast<unsigned>(units), COPY_THREADS>>>(shape_of(a), operands_of<T>(a), a->dest, a->c,
                                                                  a->states, a->states_out,
                                                                  static_cast<T*>(a->counter_out), a->valid_out);
}

}  // namespace

extern "C" {

int lethe_cuda_expire_forget_plan(const lethe_cuda_forget_args* a, char* message, int64_t size) {
  return lethe_cuda::on_device(a->device, message, size, [&] { a->is_double ? plan<double>(a) : plan<float>(a); });
}

int lethe_cuda_expire_forget_copy(const lethe_cuda_forget_args* a, char* message, int64_t size) {
  return lethe_cuda::on_device(a->device, message, size, [&] { a->is_double ? copy<double>(a) : copy<float>(a); });
}

}  // extern "C"
