// Expire-Span's attention bias, element by element: what the GPU's kernels
// (csrc/cuda/expire_bias.cu, one thread per element) and the CPU's loops
// (csrc/expire_bias.cpp, the same functions over the same indices) compute, so that the
// CPU checks the kernels' arithmetic and indexing where no GPU is at hand.
//
// For query q of a block and key k (paper 4.1 and Eq. 4-5; docs/design/algorithms.md,
// Expire-Span):
//   dist = counter[k] + q                 the key's distance t - i to the query
//   r    = e[k] - dist                    the remaining span
//   m    = clamp(r / R + 1, 0, 1)         the soft mask (Eq. 5)
//   bias = ln max(m, FLT_MIN) + pq[q, dist]   where the key is seen (usable, dist >= 0,
//                                             m > 0); the position term only for dist < P
//        = -inf                               elsewhere
// `scaled_dot_product_attention` then adds the content scores and takes the softmax:
// the mask applied after the softmax with renormalisation (Eq. 4) as one additive bias.
//
// The backward pass gives the positions' gradient (each seen pair's to its distance's
// row; a stream's keys have distinct distances, so no two pairs of a row share one) and
// the spans' (g / m / R where the key is seen and r / R + 1 <= 1, as the clamp's and the
// log's gradients do), summed over heads and queries. The span loss's ramp counts (pairs
// seen with m < 1) and their distances come from the same pairs.
//
// The second half of this header is the C ABI of the CUDA library (liblethe_cuda.so,
// built by scripts/build-cuda.sh), which csrc/expire_bias.cpp loads at run time.
#pragma once

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LETHE_HD __host__ __device__ __forceinline__
#else
#define LETHE_HD inline
#endif

#ifdef __cplusplus
namespace lethe_bias {

// Queries per thread in the backward pass: each thread sums its spans' gradient over
// this many queries of one head; the partial sums are added up afterwards.
constexpr int64_t QUERY_CHUNK = 32;

// (b, h, m, n) pairs, P position rows, u rows of `usable` (1 or m).
struct Shape {
  int64_t b, h, m, n, p, u;
  LETHE_HD int64_t query_chunks() const { return (m + QUERY_CHUNK - 1) / QUERY_CHUNK; }
};

template <typename T>
struct Operands {
  const T* pq;         // (b, h, m, P)
  const T* spans;      // (b, n)
  const T* counter;    // (b, n)
  const bool* usable;  // (b, u, n)
  T ramp;
};

template <typename T>
struct Pair {
  bool seen;
  T raw;   // r / R + 1, before the clamp
  T mask;  // m
  T dist;
};

// The smallest normal float, the floor of `m` under the log (in either kind, as the
// written-out path has it).
template <typename T>
LETHE_HD T mask_floor() {
  return T(1.17549435082228750797e-38);
}

LETHE_HD float log_of(float x) { return logf(x); }
LETHE_HD double log_of(double x) { return log(x); }

template <typename T>
LETHE_HD Pair<T> pair_of(const Shape& s, const Operands<T>& o, int64_t b, int64_t q, int64_t k) {
  const int64_t key = b * s.n + k;
  const T dist = o.counter[key] + T(q);
  const T raw = (o.spans[key] - dist) / o.ramp + T(1);
  const T mask = raw < T(0) ? T(0) : (raw > T(1) ? T(1) : raw);
  const bool usable = o.usable[(b * s.u + (s.u == 1 ? 0 : q)) * s.n + k];
  return {usable && dist >= T(0) && mask > T(0), raw, mask, dist};
}

// The bias of element `i` of (b, h, m, n).
template <typename T>
LETHE_HD T bias_at(const Shape& s, const Operands<T>& o, int64_t i) {
  const int64_t k = i % s.n, row = i / s.n;  // row: (b, h, m)
  const int64_t q = row % s.m, b = row / s.m / s.h;
  const Pair<T> p = pair_of(s, o, b, q, k);
  if (!p.seen) return T(-INFINITY);
  const T log_mask = log_of(p.mask < mask_floor<T>() ? mask_floor<T>() : p.mask);
  if (p.dist < T(s.p)) return o.pq[row * s.p + static_cast<int64_t>(p.dist)] + log_mask;
  return log_mask;
}

// The span loss's parts for key `i` of (b, n): how many queries see it on the ramp
// (0 < m < 1) and the sum of their distances. The loss (4.2) is then
//   scale * mean over streams of sum over keys of (e[k] counts[k] - distances[k]),
// scale = alpha / (R M), the sums in double: [`loss_term`] of every key, added up.
template <typename T>
LETHE_HD void ramp_at(const Shape& s, const Operands<T>& o, int64_t i, T* counts, double* distances) {
  const int64_t b = i / s.n, k = i % s.n;
  int64_t count = 0;
  double total = 0.0;
  for (int64_t q = 0; q < s.m; ++q) {
    const Pair<T> p = pair_of(s, o, b, q, k);
    if (p.seen && p.mask < T(1)) {
      ++count;
      total += static_cast<double>(p.dist);
    }
  }
  counts[i] = T(count);
  distances[i] = total;
}

// Key `i`'s share of the span loss's sum: `e counts` (in T, as the written-out path
// multiplies) less its distances, in double.
template <typename T>
LETHE_HD double loss_term(const T* spans, const T* counts, const double* distances, int64_t i) {
  return static_cast<double>(spans[i] * counts[i]) - distances[i];
}

// What the span loss adds to the spans' gradient in the backward pass: `grad` (one value,
// the loss's gradient; null when the loss is not taken) times `scale`, over the streams,
// times each key's ramp count, added by the first head's first query chunk of the key.
template <typename T>
struct LossGrad {
  const T* counts;  // (b, n)
  const T* grad;
  double scale;
};

template <typename T>
LETHE_HD void add_to(T* at, T value) {
#ifdef __CUDA_ARCH__
  atomicAdd(at, value);
#else
  *at += value;
#endif
}

// The backward pass of element `i` of (b, h, query chunks, n): key k, head h, the
// queries of one chunk. Adds each seen pair's gradient `grad` (b, h, m, n; rows
// `grad_row` apart) to its distance's entry of `grad_pq` (b, h, m, P), zero at the start,
// and writes the span's gradient summed over the chunk's queries to `partial[i]`, the
// span loss's (`loss`) in the first head's first chunk.
template <typename T>
LETHE_HD void backward_at(const Shape& s, const Operands<T>& o, const T* grad, int64_t grad_row, T* grad_pq, T* partial,
                          const LossGrad<T>& loss, int64_t i) {
  const int64_t k = i % s.n, rest = i / s.n;
  const int64_t chunk = rest % s.query_chunks(), bh = rest / s.query_chunks(), b = bh / s.h;
  const int64_t first = chunk * QUERY_CHUNK, last = first + QUERY_CHUNK < s.m ? first + QUERY_CHUNK : s.m;
  T span_grad = T(0);
  for (int64_t q = first; q < last; ++q) {
    const Pair<T> p = pair_of(s, o, b, q, k);
    if (!p.seen) continue;
    const int64_t row = bh * s.m + q;
    const T g = grad[row * grad_row + k];
    if (p.dist < T(s.p)) add_to(grad_pq + row * s.p + static_cast<int64_t>(p.dist), g);
    if (p.raw <= T(1) && p.mask >= mask_floor<T>()) span_grad += g / p.mask / o.ramp;
  }
  if (loss.grad != nullptr && chunk == 0 && bh % s.h == 0) {
    // As the written-out loss's backward pass rounds: (g scale) / b in double, then in T.
    const T per_count = T(static_cast<double>(*loss.grad) * loss.scale / static_cast<double>(s.b));
    span_grad += loss.counts[b * s.n + k] * per_count;
  }
  partial[i] = span_grad;
}

}  // namespace lethe_bias
#endif

// ---- the CUDA library's C ABI ----------------------------------------------------------

#ifdef __cplusplus
extern "C" {
#endif

// The version of this ABI: the loader refuses a library built from another.
#define LETHE_CUDA_ABI 2

// One call's shape, operands and outputs, all device pointers, in float (`is_double` 0)
// or double. Forward: `bias` (b, h, m, n; rows `bias_row` elements apart), and `counts`
// (b, n) and `distances` (b, n, double) when not null, and with them the span loss times
// `loss_scale` in `loss` (one value) when not null. Backward: `grad` (b, h, m, n; rows
// `grad_row` apart) in, `grad_pq` (b, h, m, P), zero on entry, and `partial` (b, h, query
// chunks, n) out; with `loss_grad` (one value) not null, the span loss's part from it,
// `counts` and `loss_scale`.
typedef struct lethe_cuda_bias_args {
  int device;  // the GPU the tensors are on
  int64_t b, h, m, n, p, u;
  int is_double;
  const void* pq;
  const void* spans;
  const void* counter;
  const bool* usable;
  double ramp;
  void* bias;
  int64_t bias_row;
  void* counts;
  double* distances;
  const void* grad;
  int64_t grad_row;
  void* grad_pq;
  void* partial;
  void* loss;
  const void* loss_grad;
  double loss_scale;
} lethe_cuda_bias_args;

// Each launches its kernels on `device`'s default stream (libtorch's) and returns 0, or a CUDA
// error code with its message in `message` (`size` bytes).
typedef int (*lethe_cuda_abi_fn)(void);
typedef int (*lethe_cuda_bias_fn)(const lethe_cuda_bias_args* args, char* message, int64_t size);

int lethe_cuda_abi(void);
int lethe_cuda_expire_bias_forward(const lethe_cuda_bias_args* args, char* message, int64_t size);
int lethe_cuda_expire_bias_backward(const lethe_cuda_bias_args* args, char* message, int64_t size);

#ifdef __cplusplus
}
#endif
