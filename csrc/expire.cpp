// Expire-Span's attention scores in one pass on the CPU, with their gradient: the soft
// mask of Eq. 5, the renormalised post-softmax mask of Eq. 4 as the additive bias ln m,
// the relative positions (A.1) and the span loss's ramp counts (4.2), fused into one
// custom autograd function that src/model/memory/expire_fused.rs wraps.
//
// For `m` queries of a block over `n` keys, with d = counter[b, j] + i the distance of
// key j to query i:
//
//   r   = e[b, j] - d                      remaining span
//   m   = clamp(r / R + 1, 0, 1)           soft mask (Eq. 5)
//   vis = usable[b, i, j] && d >= 0 && m > 0
//   out[b, h, i, j] = scores + (pq[b, h, i, d] if d < P else 0) + ln max(m, FLT_MIN)   where vis
//                   = -inf                                                          elsewhere
//
// which is what src/model/memory/expire.rs builds from a dozen (b, m, n) tensors and a
// gather. The backward pass gives `scores` the incoming gradient unchanged, `pq` its
// scatter by distance, and the spans `e` the sum over heads and queries of g / m / R
// where 0 < m and r / R + 1 <= 1 (the gradient the written-out path's clamp, log and
// division give). Also returned, without gradient: the ramp counts (queries that see
// key j on the ramp, 0 < m < 1, visible) and the sum of d over the ramp per stream, from
// which the span loss is built.
//
// With `softmax`, each score row is then replaced by its softmax over the keys while it
// is in cache (the attention weights, as libtorch's softmax computes them), and the
// backward pass takes the softmax's gradient row by row before the rest: one pass over
// the (b, h, m, n) tensor each way instead of two.
//
// The work is split by rows (b, i), one query of one stream: its mask row, its log and
// its h score rows are computed together while they are in cache. Only the last
// `P - 1 + m` keys can be nearer than P (the cache is in time order, one key per
// position), so only they read a position; the keys before them add the mask's log alone,
// a loop the compiler vectorises. The mask row is written with AVX2 where the CPU has it
// (float only; Sleef's log, which libtorch ships, on the pairs of the ramp) and as plain
// loops elsewhere. Every sum runs in a fixed order: the results do not depend on the
// thread count.
//
// Only the keys on a row's ramp give its spans a gradient, so the forward pass lists
// them per row (key and m R) and the backward pass sums the heads' gradient, divides and
// adds over queries at those keys only: at a span of 16k, where a row reads 1,900 keys
// and a ramp of 64 holds a few dozen, that was a dense (b, m, n) tensor written, divided
// and summed.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "guard.h"

// Sleef's 8-wide log for AVX2, exported by libtorch_cpu (sleef.h declares it only where
// the whole file is compiled for AVX).
extern "C" __m256 Sleef_logf8_u10avx2(__m256);

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The shapes of one call, checked once.
struct Dims {
  int64_t b, h, m, n, p, usable_rows;
  // How many of the last keys can be nearer than p to some query: those read a position.
  int64_t near() const { return std::min(n, p - 1 + m); }
};

Dims check(const at::Tensor& scores, const at::Tensor& pq, const at::Tensor& spans, const at::Tensor& counter,
           const at::Tensor& usable) {
  TORCH_CHECK(scores.dim() == 4, "expire scores: scores must be (b, h, m, n), got ", scores.sizes());
  Dims d{scores.size(0), scores.size(1), scores.size(2), scores.size(3), pq.size(-1), usable.size(1)};
  TORCH_CHECK(pq.dim() == 4 && pq.size(0) == d.b && pq.size(1) == d.h && pq.size(2) == d.m,
              "expire scores: positions must be (b, h, m, P), got ", pq.sizes());
  TORCH_CHECK(spans.dim() == 2 && spans.size(0) == d.b && spans.size(1) == d.n && counter.sizes() == spans.sizes(),
              "expire scores: spans and counter must be (b, n), got ", spans.sizes(), " and ", counter.sizes());
  TORCH_CHECK(usable.dim() == 3 && usable.size(0) == d.b && usable.size(2) == d.n && (d.usable_rows == 1 || d.usable_rows == d.m),
              "expire scores: usable must be (b, 1, n) or (b, m, n), got ", usable.sizes());
  TORCH_CHECK(usable.scalar_type() == at::kBool, "expire scores: usable must be bool");
  TORCH_CHECK(scores.device().is_cpu(), "expire scores: the fused kernel runs on the CPU");
  TORCH_CHECK(pq.scalar_type() == scores.scalar_type() && spans.scalar_type() == scores.scalar_type() &&
                  counter.scalar_type() == scores.scalar_type(),
              "expire scores: scores, positions, spans and counter must share one floating kind");
  return d;
}

// Whether this CPU runs the AVX2 mask row.
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// One mask row's inputs: the stream's spans and counters, the row's usable keys, the
// query's index and the ramp R.
template <typename T>
struct MaskRow {
  const T* e;
  const T* c;
  const bool* u;
  T fi;
  T ramp;
};

// The keys of one mask row whose span has a gradient (0 < m, r / R + 1 <= 1: the ramp,
// and rarely its top end), in key order, each with its slope m R: the backward pass
// divides the row's gradient by it there and gives the spans nothing elsewhere. Most
// keys of a row are off the ramp, so the list is short; `key` and `slope` have room
// for the whole row.
template <typename T>
struct RampList {
  int32_t* key;
  T* slope;
  int32_t count;
  void add(int64_t j, T s) {
    key[count] = static_cast<int32_t>(j);
    slope[count] = s;
    ++count;
  }
};

// A ramp pair at key j: counted for the key (rows of one stream run in parallel, and
// integer sums do not depend on their order).
inline void count_ramp(int32_t* key_ramp, int64_t j) { __atomic_fetch_add(key_ramp + j, 1, __ATOMIC_RELAXED); }

// Keys [j0, n) of a mask row, one at a time: ln max(m, floor) where the key is seen, -inf
// where not; the keys whose span has a gradient into `sl` with m R; the ramp pairs
// counted. Returns how many of the row's pairs are on the ramp. The same float
// operations, in the same order, as the written-out path's.
template <typename T>
int32_t mask_row_scalar(const MaskRow<T>& x, int64_t j0, int64_t n, T* lm, RampList<T>& sl, int32_t* key_ramp) {
  const T floor = std::numeric_limits<T>::min(), minus_inf = -std::numeric_limits<T>::infinity();
  int32_t on_row = 0;
  for (int64_t j = j0; j < n; ++j) {
    const T d = x.c[j] + x.fi;
    const T pre = (x.e[j] - d) / x.ramp + T(1);
    const T mask = std::min(std::max(pre, T(0)), T(1));
    const bool vis = x.u[j] && d >= T(0) && mask > T(0);
    lm[j] = vis ? std::log(std::max(mask, floor)) : minus_inf;
    if (vis && pre <= T(1) && mask >= floor) sl.add(j, mask * x.ramp);
    if (vis && mask < T(1)) {
      count_ramp(key_ramp, j);
      ++on_row;
    }
  }
  return on_row;
}

// mask_row_scalar for float, 8 keys at a time. The log (Sleef's, within 1 ulp) runs only
// on groups with a pair on the ramp: elsewhere a seen key's mask is 1 and its log 0.
__attribute__((target("avx2"))) int32_t mask_row_avx2(const MaskRow<float>& x, int64_t n, float* lm, RampList<float>& sl,
                                                     int32_t* key_ramp) {
  const __m256 fi = _mm256_set1_ps(x.fi), ramp = _mm256_set1_ps(x.ramp), one = _mm256_set1_ps(1.0f),
               zero = _mm256_setzero_ps(), floor = _mm256_set1_ps(std::numeric_limits<float>::min()),
               minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int32_t on_row = 0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 d = _mm256_add_ps(_mm256_loadu_ps(x.c + j), fi);
    const __m256 pre = _mm256_add_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x.e + j), d), ramp), one);
    const __m256 mask = _mm256_min_ps(_mm256_max_ps(pre, zero), one);
    const __m256i used = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.u + j)));
    const __m256 vis = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(used, _mm256_setzero_si256())),
                                     _mm256_and_ps(_mm256_cmp_ps(d, zero, _CMP_GE_OQ), _mm256_cmp_ps(mask, zero, _CMP_GT_OQ)));
    const __m256 on_ramp = _mm256_and_ps(vis, _mm256_cmp_ps(mask, one, _CMP_LT_OQ));
    const int ramp_bits = _mm256_movemask_ps(on_ramp);
    __m256 log_mask = zero;
    if (ramp_bits != 0) {
      log_mask = _mm256_blendv_ps(zero, Sleef_logf8_u10avx2(_mm256_max_ps(mask, floor)), on_ramp);
      on_row += __builtin_popcount(ramp_bits);
      for (int k = 0; k < 8; ++k) {
        if (ramp_bits & (1 << k)) count_ramp(key_ramp, j + k);
      }
    }
    _mm256_storeu_ps(lm + j, _mm256_blendv_ps(minus_inf, log_mask, vis));
    const __m256 has_slope =
        _mm256_and_ps(vis, _mm256_and_ps(_mm256_cmp_ps(pre, one, _CMP_LE_OQ), _mm256_cmp_ps(mask, floor, _CMP_GE_OQ)));
    const int slope_bits = _mm256_movemask_ps(has_slope);
    if (slope_bits != 0) {
      alignas(32) float slopes[8];
      _mm256_store_ps(slopes, _mm256_mul_ps(mask, ramp));
      for (int k = 0; k < 8; ++k) {
        if (slope_bits & (1 << k)) sl.add(j + k, slopes[k]);
      }
    }
  }
  return on_row + mask_row_scalar(x, j, n, lm, sl, key_ramp);
}

template <typename T>
int32_t mask_row(const MaskRow<T>& x, int64_t n, T* lm, RampList<T>& sl, int32_t* key_ramp, bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector && cpu_has_avx2()) return mask_row_avx2(x, n, lm, sl, key_ramp);
  }
  return mask_row_scalar(x, 0, n, lm, sl, key_ramp);
}

// The near keys' scores of one row: the score plus (the position at the key's slot plus
// the mask's log), as the written-out path adds its bias.
template <typename T>
void near_row_scalar(int64_t k0, int64_t w, const int32_t* near, const T* positions, const T* s, const T* l, T* y) {
  for (int64_t k = k0; k < w; ++k) y[k] = s[k] + (positions[near[k]] + l[k]);
}

// near_row_scalar for float, 8 keys at a time through AVX2's gather.
__attribute__((target("avx2"))) void near_row_avx2(int64_t w, const int32_t* near, const float* positions,
                                                  const float* s, const float* l, float* y) {
  int64_t k = 0;
  for (; k + 8 <= w; k += 8) {
    const __m256i slot = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(near + k));
    const __m256 position = _mm256_i32gather_ps(positions, slot, 4);
    _mm256_storeu_ps(y + k, _mm256_add_ps(_mm256_loadu_ps(s + k), _mm256_add_ps(position, _mm256_loadu_ps(l + k))));
  }
  near_row_scalar(k, w, near, positions, s, l, y);
}

template <typename T>
void near_row(int64_t w, const int32_t* near, const T* positions, const T* s, const T* l, T* y, bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector && cpu_has_avx2()) return near_row_avx2(w, near, positions, s, l, y);
  }
  near_row_scalar(0, w, near, positions, s, l, y);
}

// A score row's softmax in place, as libtorch's softmax over the last dimension computes
// it: y = exp(y - max) * (1 / sum). Keys at -inf get 0.
template <typename T>
void softmax_row_scalar(T* y, int64_t n) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) top = std::max(top, y[j]);
  T sum = T(0);
  for (int64_t j = 0; j < n; ++j) {
    y[j] = std::exp(y[j] - top);
    sum += y[j];
  }
  const T scale = T(1) / sum;
  for (int64_t j = 0; j < n; ++j) y[j] *= scale;
}

// The sum of a vector's 8 lanes.
__attribute__((target("avx2"))) inline float lane_sum(__m256 x) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}

// exp of 8 floats, within 20 ulp: exp(x) = 2^k exp(r), k = floor(x log2(e) + 1/2),
// r = x - k ln 2, exp(r) by a degree-5 polynomial. The algorithm and constants of
// libtorch's own `Vectorized<float>::exp_u20` (ATen/cpu/vec/vec256/vec256_float.h), which
// is what its softmax uses; about 3 times faster than Sleef's 1-ulp exp here. Below
// ln(FLT_MIN), -inf included, it gives 0.
__attribute__((target("avx2,fma"))) inline __m256 exp8_u20(__m256 x) {
  const __m256 ln_min = _mm256_castsi256_ps(_mm256_set1_epi32(0xc2aeac50)),
               ln_max = _mm256_castsi256_ps(_mm256_set1_epi32(0x42b17218)),
               log2e = _mm256_castsi256_ps(_mm256_set1_epi32(0x3fb8aa3b)),
               ln2 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3f317218)), one = _mm256_set1_ps(1.0f);
  const __m256 underflow = _mm256_cmp_ps(x, ln_min, _CMP_LT_OS);
  const __m256 clamped = _mm256_max_ps(_mm256_min_ps(x, ln_max), ln_min);
  const __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(clamped, log2e, _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fnmadd_ps(k, ln2, clamped);
  __m256 p = _mm256_fmadd_ps(r, _mm256_set1_ps(0.00828929059f), _mm256_set1_ps(0.0418978221f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.166676521f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.499991506f));
  p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(0.999999701f));
  p = _mm256_fmadd_ps(r, p, one);
  // 2^(k - 1), then times 2: k = 128 (x near ln_max) stays a finite float.
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_sub_ps(k, one)), _mm256_set1_epi32(127));
  const __m256 scale = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)), _mm256_setzero_ps(), underflow);
  return _mm256_mul_ps(_mm256_mul_ps(p, scale), _mm256_set1_ps(2.0f));
}

// softmax_row_scalar for float, 8 keys at a time.
__attribute__((target("avx2,fma"))) void softmax_row_avx2(float* y, int64_t n) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  __m256 top8 = _mm256_set1_ps(minus_inf);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(y + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float top = minus_inf;
  for (float lane : lanes) top = std::max(top, lane);
  for (int64_t k = j; k < n; ++k) top = std::max(top, y[k]);
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp8_u20(_mm256_sub_ps(_mm256_loadu_ps(y + j), shift));
    _mm256_storeu_ps(y + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = lane_sum(sum8);
  for (int64_t k = j; k < n; ++k) {
    y[k] = std::exp(y[k] - top);
    sum += y[k];
  }
  const __m256 scale = _mm256_set1_ps(1.0f / sum);
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), scale));
  for (int64_t k = j; k < n; ++k) y[k] *= 1.0f / sum;
}

// Whether this CPU runs the AVX2 softmax row (its exp needs FMA as well).
bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

template <typename T>
void softmax_row(T* y, int64_t n, bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector && cpu_has_avx2_fma()) return softmax_row_avx2(y, n);
  }
  softmax_row_scalar(y, n);
}

// The softmax's backward pass for one row, as libtorch's: gs = p (g - sum(g p)).
template <typename T>
void softmax_backward_row_scalar(const T* p, const T* g, T* gs, int64_t n) {
  T dot = T(0);
  for (int64_t j = 0; j < n; ++j) dot += g[j] * p[j];
  for (int64_t j = 0; j < n; ++j) gs[j] = p[j] * (g[j] - dot);
}

// softmax_backward_row_scalar for float, 8 keys at a time.
__attribute__((target("avx2"))) void softmax_backward_row_avx2(const float* p, const float* g, float* gs, int64_t n) {
  __m256 dot8 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) dot8 = _mm256_add_ps(dot8, _mm256_mul_ps(_mm256_loadu_ps(g + j), _mm256_loadu_ps(p + j)));
  float dot = lane_sum(dot8);
  for (int64_t k = j; k < n; ++k) dot += g[k] * p[k];
  const __m256 dot_all = _mm256_set1_ps(dot);
  for (j = 0; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(gs + j, _mm256_mul_ps(_mm256_loadu_ps(p + j), _mm256_sub_ps(_mm256_loadu_ps(g + j), dot_all)));
  }
  for (int64_t k = j; k < n; ++k) gs[k] = p[k] * (g[k] - dot);
}

template <typename T>
void softmax_backward_row(const T* p, const T* g, T* gs, int64_t n, bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector && cpu_has_avx2()) return softmax_backward_row_avx2(p, g, gs, n);
  }
  softmax_backward_row_scalar(p, g, gs, n);
}

// The forward pass's inputs and outputs, as pointers.
template <typename T>
struct Forward {
  const T *scores, *pq, *spans, *counter;
  const bool* usable;
  T ramp;
  bool vector, softmax;
  T *out, *slope;
  int32_t *near_row, *key_ramp, *ramp_key, *ramp_count;
  int64_t* query_weighted;
};

// Row (b, i): the mask row (into `lm`, n long), then the h score rows. `positions` holds
// P + 1 slots, the last one zero.
template <typename T>
void forward_row(const Dims& dm, const Forward<T>& f, int64_t b, int64_t i, T* lm, std::vector<T>& positions) {
  const int64_t n = dm.n, w = dm.near(), far = n - w, mask_row_at = (b * dm.m + i) * n;
  const MaskRow<T> x{f.spans + b * n, f.counter + b * n, f.usable + (b * dm.usable_rows + (dm.usable_rows == 1 ? 0 : i)) * n,
                     static_cast<T>(i), f.ramp};
  RampList<T> ramp{f.ramp_key + mask_row_at, f.slope + mask_row_at, 0};
  const int32_t on_row = mask_row(x, n, lm, ramp, f.key_ramp + b * n, f.vector);
  f.ramp_count[b * dm.m + i] = ramp.count;
  if (on_row > 0) __atomic_fetch_add(f.query_weighted + b, static_cast<int64_t>(on_row) * i, __ATOMIC_RELAXED);
  // The near keys' position slots (p: none; a hidden key's -inf comes from its log).
  int32_t* __restrict near = f.near_row + (b * dm.m + i) * w;
  for (int64_t k = 0; k < w; ++k) {
    const T d = x.c[far + k] + x.fi;
    near[k] = std::isfinite(lm[far + k]) && d < static_cast<T>(dm.p) ? static_cast<int32_t>(d) : static_cast<int32_t>(dm.p);
  }
  for (int64_t h = 0; h < dm.h; ++h) {
    const int64_t r = (b * dm.h + h) * dm.m + i;
    std::copy(f.pq + r * dm.p, f.pq + (r + 1) * dm.p, positions.begin());
    const T* __restrict s = f.scores + r * n;
    const T* __restrict l = lm;
    T* __restrict y = f.out + r * n;
    for (int64_t j = 0; j < far; ++j) y[j] = s[j] + l[j];
    near_row(w, near, positions.data(), s + far, l + far, y + far, f.vector);
    if (f.softmax) softmax_row(y, n, f.vector);
  }
}

template <typename T>
void forward_kernel(const Dims& dm, const Forward<T>& f) {
  at::parallel_for(0, dm.b * dm.m, 4, [&](int64_t r0, int64_t r1) {
    std::vector<T> lm(dm.n), positions(dm.p + 1, T(0));
    for (int64_t r = r0; r < r1; ++r) forward_row(dm, f, r / dm.m, r % dm.m, lm.data(), positions);
  });
}

// Per stream, from the ramp pairs counted: the counts per key, and the sum of the
// distances d = counter[j] + i over the pairs (whole numbers: exact in double).
template <typename T>
void ramp_totals(const Dims& dm, const int32_t* key_ramp, const int64_t* query_weighted, const T* counter, T* counts,
                 double* ramp_dist) {
  for (int64_t b = 0; b < dm.b; ++b) {
    double by_key = 0.0;
    for (int64_t j = 0; j < dm.n; ++j) {
      counts[b * dm.n + j] = static_cast<T>(key_ramp[b * dm.n + j]);
      by_key += static_cast<double>(key_ramp[b * dm.n + j]) * static_cast<double>(counter[b * dm.n + j]);
    }
    ramp_dist[b] = by_key + static_cast<double>(query_weighted[b]);
  }
}

// The backward pass's inputs and outputs, as pointers. With the softmax in the kernel,
// `probs` are its outputs, `g` their gradient and `gs` the scores' (written here);
// without, `g` is the scores' gradient and `probs` and `gs` are null.
template <typename T>
struct Backward {
  const T *g, *probs, *slope;
  const int32_t *near_row, *ramp_key, *ramp_count;
  bool vector;
  T *gs, *gp;
};

// Row (b, i) of the backward pass: each head's scores gradient (through the softmax,
// when the kernel took it), its positions gradient (the near keys', each at its own
// distance: nothing collides), and into `by_query` the spans' share of this query at
// the row's ramp keys (in the order of its ramp list), the sum over heads of the
// scores' gradient divided by m R. The other keys' share is zero.
template <typename T>
void backward_row(const Dims& dm, const Backward<T>& f, int64_t b, int64_t i, T* by_query) {
  const int64_t n = dm.n, w = dm.near(), far = n - w, row = b * dm.m + i;
  const int32_t p = static_cast<int32_t>(dm.p);
  const int32_t* __restrict near = f.near_row + row * w;
  const int32_t count = f.ramp_count[row];
  const int32_t* __restrict keys = f.ramp_key + row * n;
  T* __restrict sum = by_query;
  std::fill(sum, sum + count, T(0));
  for (int64_t h = 0; h < dm.h; ++h) {
    const int64_t r = (b * dm.h + h) * dm.m + i;
    const T* gr = f.g + r * n;
    if (f.probs != nullptr) {
      softmax_backward_row(f.probs + r * n, gr, f.gs + r * n, n, f.vector);
      gr = f.gs + r * n;
    }
    T* __restrict gpr = f.gp + r * dm.p;
    std::fill(gpr, gpr + dm.p, T(0));
    for (int64_t k = 0; k < w; ++k) {
      if (near[k] < p) gpr[near[k]] += gr[far + k];
    }
    for (int32_t k = 0; k < count; ++k) sum[k] += gr[keys[k]];
  }
  const T* __restrict s = f.slope + row * n;
  for (int32_t k = 0; k < count; ++k) sum[k] = sum[k] / s[k];
}

template <typename T>
void backward_kernel(const Dims& dm, const Backward<T>& f, at::Tensor& grad_spans) {
  // Each query's share of the spans' gradient at its ramp keys, then their sum over
  // queries in query order, key by key (adding the zeros of the keys off a row's ramp,
  // as a dense sum would, changes no bit: the totals start at +0).
  auto by_query = at::empty({dm.b, dm.m, dm.n}, grad_spans.options());
  T* bq = by_query.data_ptr<T>();
  at::parallel_for(0, dm.b * dm.m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) backward_row(dm, f, r / dm.m, r % dm.m, bq + r * dm.n);
  });
  T* ge = grad_spans.data_ptr<T>();
  at::parallel_for(0, dm.b, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* __restrict total = ge + b * dm.n;
      for (int64_t r = b * dm.m; r < (b + 1) * dm.m; ++r) {
        const int32_t* __restrict keys = f.ramp_key + r * dm.n;
        const T* __restrict q = bq + r * dm.n;
        for (int32_t k = 0; k < f.ramp_count[r]; ++k) total[keys[k]] += q[k];
      }
    }
  });
}

struct ExpireScores : public torch::autograd::Function<ExpireScores> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores_in, const at::Tensor& pq_in,
                               const at::Tensor& spans_in, const at::Tensor& counter_in, const at::Tensor& usable_in,
                               double ramp, bool vector, bool softmax) {
    const auto scores = scores_in.contiguous(), pq = pq_in.contiguous(), spans = spans_in.contiguous(),
               counter = counter_in.contiguous(), usable = usable_in.contiguous();
    const Dims dm = check(scores, pq, spans, counter, usable);
    auto out = at::empty_like(scores);
    auto counts = at::empty({dm.b, dm.n}, spans.options());
    auto ramp_dist = at::empty({dm.b}, spans.options().dtype(at::kDouble));
    auto key_ramp = at::zeros({dm.b, dm.n}, spans.options().dtype(at::kInt));
    auto query_weighted = at::zeros({dm.b}, spans.options().dtype(at::kLong));
    // For the backward pass: the near keys' position slots (b, m, near), and each row's
    // ramp list: its keys and their m R (b, m, n; the first `count` of each row), and
    // its count (b, m).
    auto near_row = at::empty({dm.b, dm.m, dm.near()}, scores.options().dtype(at::kInt));
    auto slope = at::empty({dm.b, dm.m, dm.n}, scores.options());
    auto ramp_key = at::empty({dm.b, dm.m, dm.n}, scores.options().dtype(at::kInt));
    auto ramp_count = at::empty({dm.b, dm.m}, scores.options().dtype(at::kInt));
    AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "expire_scores", [&] {
      const Forward<scalar_t> f{scores.data_ptr<scalar_t>(), pq.data_ptr<scalar_t>(), spans.data_ptr<scalar_t>(),
                                counter.data_ptr<scalar_t>(), usable.data_ptr<bool>(), static_cast<scalar_t>(ramp),
                                vector, softmax, out.data_ptr<scalar_t>(), slope.data_ptr<scalar_t>(), near_row.data_ptr<int32_t>(),
                                key_ramp.data_ptr<int32_t>(), ramp_key.data_ptr<int32_t>(), ramp_count.data_ptr<int32_t>(),
                                query_weighted.data_ptr<int64_t>()};
      forward_kernel<scalar_t>(dm, f);
      ramp_totals<scalar_t>(dm, key_ramp.data_ptr<int32_t>(), query_weighted.data_ptr<int64_t>(),
                            counter.data_ptr<scalar_t>(), counts.data_ptr<scalar_t>(), ramp_dist.data_ptr<double>());
    });
    // With the softmax, its output too (its gradient is computed from it).
    variable_list saved{near_row, slope, ramp_key, ramp_count};
    if (softmax) saved.push_back(out);
    ctx->save_for_backward(saved);
    ctx->saved_data["p"] = dm.p;
    ctx->saved_data["h"] = dm.h;
    ctx->saved_data["vector"] = vector;
    ctx->mark_non_differentiable({counts, ramp_dist});
    return {out, counts, ramp_dist};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &near_row = saved[0], &slope = saved[1];
    const auto &ramp_key = saved[2], &ramp_count = saved[3];
    const bool softmax = saved.size() == 5;
    const auto grad = grads[0].contiguous();
    const int64_t p = ctx->saved_data["p"].toInt(), h = ctx->saved_data["h"].toInt();
    const Dims dm{slope.size(0), h, slope.size(1), slope.size(2), p, 1};
    auto grad_scores = softmax ? at::empty_like(grad) : grad;
    auto grad_pq = at::empty({dm.b, dm.h, dm.m, dm.p}, grad.options());
    auto grad_spans = at::zeros({dm.b, dm.n}, grad.options());
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "expire_scores_backward", [&] {
      const Backward<scalar_t> f{grad.data_ptr<scalar_t>(), softmax ? saved[4].data_ptr<scalar_t>() : nullptr,
                                 slope.data_ptr<scalar_t>(), near_row.data_ptr<int32_t>(), ramp_key.data_ptr<int32_t>(),
                                 ramp_count.data_ptr<int32_t>(), ctx->saved_data["vector"].toBool(),
                                 softmax ? grad_scores.data_ptr<scalar_t>() : nullptr, grad_pq.data_ptr<scalar_t>()};
      backward_kernel<scalar_t>(dm, f, grad_spans);
    });
    return {grad_scores, grad_pq, grad_spans, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// The fused scores (see the top of this file). Writes three new tensors to `out`:
// the scores (b, h, m, n), or with `softmax` 1 their softmax over the keys, with
// gradient; the ramp counts (b, n) and the ramp's distance sum per stream (b, double),
// without. `vector` 0 keeps to the plain loops (the AVX2 ones are used only where the
// CPU has AVX2 either way).
int lethe_expire_scores(void* scores, void* pq, void* spans, void* counter, void* usable, double ramp, int vector,
                        int softmax, void** out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    auto result = ExpireScores::apply(t(scores), t(pq), t(spans), t(counter), t(usable), ramp, vector != 0, softmax != 0);
    for (size_t k = 0; k < 3; ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}

// How many threads `at::parallel_for` spreads 64 items over (into `seen`), and
// libtorch's thread count (into `threads`): the two are equal only where this file is
// compiled with OpenMP, as libtorch is (build.rs). Without it the kernel above runs on
// one thread.
void lethe_parallel_threads(int64_t* seen, int64_t* threads) {
  std::vector<int> used(static_cast<size_t>(at::get_num_threads()), 0);
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) { used[static_cast<size_t>(at::get_thread_num())] = 1; });
  *seen = std::count(used.begin(), used.end(), 1);
  *threads = at::get_num_threads();
}

}  // extern "C"
