// Expire-Span's deletion after a block (paper 4.1, physical deletion), element by element:
// what the GPU's two kernels (csrc/cuda/expire_forget.cu) and the CPU's loops
// (csrc/expire_forget.cpp, the same functions over the same indices) compute, so that the
// CPU checks the kernels' arithmetic and indexing where no GPU is at hand.
//
// Over `[cache, block]`, n slots a stream, a memory is kept when it holds one (`valid`)
// and the next block's first query still sees it (docs/design/algorithms.md,
// Expire-Span):
//   counter_next = counter + m           its distance to the next block's first query
//   keep         = valid and e + R - counter_next > 0
// in float, in the order the libtorch path computes it, so that both keep the same
// memories. Every stream's kept slots go after its dropped ones, each in order (what a
// stable sort of the flags gives); the last `c` of that arrangement, `c` the most any
// stream keeps, are the new cache: right-aligned, padded on the left with the stream's
// last dropped slots. The counters and validity have `m` slots of room after them for the
// next block, its counters `-q` and validity written already (the states have none: a
// cache held between steps, one per micro-batch, would hold the room too).
//
// The planning pass gives each slot its place in the arrangement; the copying pass moves
// every slot that lands in the last `c` (states word by word, counter, validity).
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define LETHE_FORGET_HD __host__ __device__ __forceinline__
#else
#define LETHE_FORGET_HD inline
#endif

#ifdef __cplusplus
namespace lethe_forget {

// b streams of n slots, each state `words` 32-bit words long; blocks of m.
struct Shape {
  int64_t b, n, words, m;
};

template <typename T>
struct Operands {
  const T* spans;      // (b, n), the spans the memories were given
  const T* counter;    // (b, n), distances to the block's first query
  const bool* valid;   // (b, n)
  T ramp;
};

// Whether slot `i` of (b, n) is kept.
template <typename T>
LETHE_FORGET_HD bool keep_at(const Shape& s, const Operands<T>& o, int64_t i) {
  const T next = o.counter[i] + T(s.m);
  return o.valid[i] && o.spans[i] + o.ramp - next > T(0);
}

// The places of slots [first, last) of stream `stream` in its arrangement, given how many
// of the stream's slots are kept in all (`kept`) and before `first` (`kept_before`).
template <typename T>
LETHE_FORGET_HD void place(const Shape& s, const Operands<T>& o, int64_t stream, int64_t first, int64_t last,
                           int64_t kept, int64_t kept_before, int32_t* dest) {
  int64_t dropped_before = first - kept_before;
  for (int64_t k = first; k < last; ++k) {
    const int64_t i = stream * s.n + k;
    dest[i] = static_cast<int32_t>(keep_at(s, o, i) ? s.n - kept + kept_before++ : dropped_before++);
  }
}

// Copies unit `u` of (b, n + m): for u's slot k < n of its stream, the slot into the new
// cache if it lands there (states (b, c, words), counters and validity (b, c + m)); for
// k >= n, the room's counter and validity.
// `word` and `stride` split a state's words among the threads of one unit.
template <typename T>
LETHE_FORGET_HD void copy_unit(const Shape& s, const Operands<T>& o, const int32_t* dest, int64_t c, int64_t u,
                               int64_t word, int64_t stride, const uint32_t* states, uint32_t* states_out,
                               T* counter_out, bool* valid_out) {
  const int64_t stream = u / (s.n + s.m), k = u % (s.n + s.m), row = stream * (c + s.m);
  if (k >= s.n) {
    const int64_t q = k - s.n;
    if (word == 0) {
      counter_out[row + c + q] = -T(q);
      valid_out[row + c + q] = true;
    }
    return;
  }
  const int64_t i = stream * s.n + k, j = dest[i] - (s.n - c);
  if (j < 0) return;
  for (int64_t w = word; w < s.words; w += stride) states_out[(stream * c + j) * s.words + w] = states[i * s.words + w];
  if (word == 0) {
    counter_out[row + j] = o.counter[i] + T(s.m);
    valid_out[row + j] = keep_at(s, o, i);
  }
}

}  // namespace lethe_forget
#endif

// ---- the CUDA library's entry points for it (liblethe_cuda.so) --------------------------

#ifdef __cplusplus
extern "C" {
#endif

// One call's shape and device pointers, `spans` and `counter` float (`is_double` 0) or
// double. Plan: `dest` (b, n) int32 out, `most` (1) int32, zero on entry, out: the most
// slots a stream keeps. Copy: `dest` in, `c` (that most), `states` (b, n, words) in,
// `states_out` (b, c, words), `counter_out` and `valid_out` (b, c + m) out.
typedef struct lethe_cuda_forget_args {
  int device;
  int64_t b, n, words, m;
  int is_double;
  const void* spans;
  const void* counter;
  const bool* valid;
  double ramp;
  int32_t* dest;
  int32_t* most;
  int64_t c;
  const uint32_t* states;
  uint32_t* states_out;
  void* counter_out;
  bool* valid_out;
} lethe_cuda_forget_args;

typedef int (*lethe_cuda_forget_fn)(const lethe_cuda_forget_args* args, char* message, int64_t size);

int lethe_cuda_expire_forget_plan(const lethe_cuda_forget_args* args, char* message, int64_t size);
int lethe_cuda_expire_forget_copy(const lethe_cuda_forget_args* args, char* message, int64_t size);

#ifdef __cplusplus
}
#endif
