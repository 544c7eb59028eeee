#pragma once

// Expire-Span's score rows on the CPU, shared by its two kernels: the fused scores
// (csrc/expire_scores.cpp) and the whole attention stream by stream
// (csrc/expire_attend.cpp). What a row computes:
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
// which is what crates/model/src/memory/expire.rs builds from a dozen (b, m, n) tensors and a
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
// position), so only they read a position; the keys before them add the mask's log alone.
// Float runs vector loops, 16 keys at a time with AVX-512 or 8 with AVX2, whichever the
// CPU has (Sleef's log, which libtorch ships, on the groups with a pair on the ramp), and
// plain loops elsewhere; double runs the plain loops. A score row is built, its maximum
// taken and its exps summed group by group, each pass reading a group at the offset and
// width the pass before stored it (a wide read of narrower, just-written stores waits
// for them to reach the cache). The AVX-512 loops keep the AVX2 loops' bits: the
// softmax adds each 16-key group's halves to 8 lanes in turn and the row's last keys one
// by one with the plain exp, as the AVX2 loops do (tested; a training run writes the
// same metrics and checkpoint as the kernel before these loops). Every sum runs in a
// fixed order: the results do not depend on the thread count.
//
// Each thread counts the ramp pairs of its rows of a stream in its own row of counts and
// adds them to the shared ones when it moves on (integer sums, in any order the same):
// one atomic per key and stream instead of one per pair. For the backward pass the
// forward pass keeps, per row, the key at each distance below P (at most one: one key per
// time step), so the positions' gradient is a gather of P values per score row instead of
// a scatter of its `P - 1 + m` near keys.
//
// Only the keys on a row's ramp give its spans a gradient, so the forward pass lists
// them per row (key and m R) and the backward pass sums the heads' gradient, divides and
// adds over queries at those keys only: at a span of 16k, where a row reads 1,900 keys
// and a ramp of 64 holds a few dozen, that was a dense (b, m, n) tensor written, divided
// and summed.
//
// `lethe_expire_attend` (further down, "The whole attention of a block") runs the whole
// attention with these rows, stream by stream over each stream's own keys: the content
// products, the rows and the weighted sum of one stream in one thread, the compacted
// cache's left padding left out.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.


// GCC 12 warns that its own AVX-512 intrinsics (the `_mm512_undefined_*` inside
// avx512fintrin.h) may be used uninitialised once they are inlined into this file's
// kernels (GCC bug 105593): a false positive about the compiler's header, silenced here
// before that header is read, for this file alone.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "blas.h"
#include "guard.h"
#include "shares.h"
#include "lethe.h"

// Sleef's 8-wide log for AVX2, exported by libtorch_cpu (sleef.h declares it only where
// the whole file is compiled for AVX).
extern "C" __m256 Sleef_logf8_u10avx2(__m256);
extern "C" __m512 Sleef_logf16_u10avx512f(__m512);

namespace {

using lethe::gemm_rows;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The shapes of one call, checked once.
struct Dims {
  int64_t b, h, m, n, p, usable_rows;
  // How many of the last keys can be nearer than p to some query: those read a position.
  int64_t near() const { return std::min(n, p - 1 + m); }
};

// The shapes of the other inputs, given the scores' (b, h, m, n) and kind.
inline Dims check_against(at::IntArrayRef sizes, at::ScalarType kind, const at::Tensor& pq, const at::Tensor& spans,
                   const at::Tensor& counter, const at::Tensor& usable) {
  Dims d{sizes[0], sizes[1], sizes[2], sizes[3], pq.size(-1), usable.size(1)};
  TORCH_CHECK(pq.dim() == 4 && pq.size(0) == d.b && pq.size(1) == d.h && pq.size(2) == d.m,
              "expire scores: positions must be (b, h, m, P), got ", pq.sizes());
  TORCH_CHECK(spans.dim() == 2 && spans.size(0) == d.b && spans.size(1) == d.n && counter.sizes() == spans.sizes(),
              "expire scores: spans and counter must be (b, n), got ", spans.sizes(), " and ", counter.sizes());
  TORCH_CHECK(usable.dim() == 3 && usable.size(0) == d.b && usable.size(2) == d.n && (d.usable_rows == 1 || d.usable_rows == d.m),
              "expire scores: usable must be (b, 1, n) or (b, m, n), got ", usable.sizes());
  TORCH_CHECK(usable.scalar_type() == at::kBool, "expire scores: usable must be bool");
  TORCH_CHECK(pq.device().is_cpu() && spans.device().is_cpu(), "expire scores: the fused kernel runs on the CPU");
  TORCH_CHECK(pq.scalar_type() == kind && spans.scalar_type() == kind && counter.scalar_type() == kind,
              "expire scores: scores, positions, spans and counter must share one floating kind");
  return d;
}

inline Dims check(const at::Tensor& scores, const at::Tensor& pq, const at::Tensor& spans, const at::Tensor& counter,
           const at::Tensor& usable) {
  TORCH_CHECK(scores.dim() == 4, "expire scores: scores must be (b, h, m, n), got ", scores.sizes());
  TORCH_CHECK(scores.device().is_cpu(), "expire scores: the fused kernel runs on the CPU");
  return check_against(scores.sizes(), scores.scalar_type(), pq, spans, counter, usable);
}

// Which vector loops run: 0 the plain ones, 8 AVX2 where the CPU has it, 16 AVX-512 where
// it has that (else AVX2). AVX-512 gives the AVX2 loops' bits; the plain loops agree with
// them to float rounding. The tests run every width this CPU has.
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

inline bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

inline int lanes_of(int width) {
  if (width >= 16 && cpu_has_avx512()) return 16;
  if (width >= 8 && cpu_has_avx2()) return 8;
  return 0;
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
  int32_t p;
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

// Keys [j0, n) of a mask row, one at a time: ln max(m, floor) where the key is seen, -inf
// where not; the keys whose span has a gradient into `sl` with m R; the ramp pairs
// counted into `key_ramp`, the counts of this thread's rows of the stream; each key's
// position slot into `slot`: its distance d where it is seen and d < p, else p (no
// position). Returns how many of the row's pairs are on the ramp. The same float
// operations, in the same order, as the written-out path's.
template <typename T>
int32_t mask_row_scalar(const MaskRow<T>& x, int64_t j0, int64_t n, T* lm, int32_t* slot, RampList<T>& sl, int32_t* key_ramp) {
  const T floor = std::numeric_limits<T>::min(), minus_inf = -std::numeric_limits<T>::infinity();
  int32_t on_row = 0;
  for (int64_t j = j0; j < n; ++j) {
    const T d = x.c[j] + x.fi;
    const T pre = (x.e[j] - d) / x.ramp + T(1);
    const T mask = std::min(std::max(pre, T(0)), T(1));
    const bool vis = x.u[j] && d >= T(0) && mask > T(0);
    lm[j] = vis ? std::log(std::max(mask, floor)) : minus_inf;
    slot[j] = vis && d < static_cast<T>(x.p) ? static_cast<int32_t>(d) : x.p;
    if (vis && pre <= T(1) && mask >= floor) sl.add(j, mask * x.ramp);
    if (vis && mask < T(1)) {
      ++key_ramp[j];
      ++on_row;
    }
  }
  return on_row;
}

// mask_row_scalar for float, 8 keys at a time. The log (Sleef's, within 1 ulp) runs only
// on groups with a pair on the ramp: elsewhere a seen key's mask is 1 and its log 0.
__attribute__((target("avx2"))) int32_t mask_row_avx2(const MaskRow<float>& x, int64_t n, float* lm, int32_t* slot,
                                                     RampList<float>& sl, int32_t* key_ramp) {
  const __m256 limit = _mm256_set1_ps(static_cast<float>(x.p));
  const __m256i none = _mm256_set1_epi32(x.p);
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
      // A lane on the ramp is all ones, -1 as an integer: subtracting it counts the pair.
      __m256i* counts = reinterpret_cast<__m256i*>(key_ramp + j);
      _mm256_storeu_si256(counts, _mm256_sub_epi32(_mm256_loadu_si256(counts), _mm256_castps_si256(on_ramp)));
    }
    _mm256_storeu_ps(lm + j, _mm256_blendv_ps(minus_inf, log_mask, vis));
    const __m256 has_slot = _mm256_and_ps(vis, _mm256_cmp_ps(d, limit, _CMP_LT_OQ));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot + j), _mm256_blendv_epi8(none, _mm256_cvttps_epi32(d), _mm256_castps_si256(has_slot)));
    const __m256 has_slope =
        _mm256_and_ps(vis, _mm256_and_ps(_mm256_cmp_ps(pre, one, _CMP_LE_OQ), _mm256_cmp_ps(mask, floor, _CMP_GE_OQ)));
    const int slope_bits = _mm256_movemask_ps(has_slope);
    if (slope_bits != 0) {
      alignas(32) float slopes[8];
      _mm256_store_ps(slopes, _mm256_mul_ps(mask, ramp));
      for (unsigned bits = static_cast<unsigned>(slope_bits); bits != 0; bits &= bits - 1) {
        const int k = __builtin_ctz(bits);
        sl.add(j + k, slopes[k]);
      }
    }
  }
  return on_row + mask_row_scalar(x, j, n, lm, slot, sl, key_ramp);
}

// mask_row_avx2 16 keys at a time with AVX-512; the keys with a slope go into the list
// by a compress in a register and a whole store (the list has room for the row, and
// never holds more keys than were read before the group).
__attribute__((target("avx512f"))) int32_t mask_row_avx512(const MaskRow<float>& x, int64_t n, float* lm, int32_t* slot,
                                                         RampList<float>& sl, int32_t* key_ramp) {
  const __m512 limit = _mm512_set1_ps(static_cast<float>(x.p));
  const __m512i none = _mm512_set1_epi32(x.p);
  const __m512 fi = _mm512_set1_ps(x.fi), ramp = _mm512_set1_ps(x.ramp), one = _mm512_set1_ps(1.0f),
               zero = _mm512_setzero_ps(), floor = _mm512_set1_ps(std::numeric_limits<float>::min()),
               minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t on_row = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 d = _mm512_add_ps(_mm512_loadu_ps(x.c + j), fi);
    const __m512 pre = _mm512_add_ps(_mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(x.e + j), d), ramp), one);
    const __m512 mask = _mm512_min_ps(_mm512_max_ps(pre, zero), one);
    const __m512i used = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.u + j)));
    const __mmask16 vis = _mm512_test_epi32_mask(used, used) & _mm512_cmp_ps_mask(d, zero, _CMP_GE_OQ) &
                          _mm512_cmp_ps_mask(mask, zero, _CMP_GT_OQ);
    const __mmask16 on_ramp = vis & _mm512_cmp_ps_mask(mask, one, _CMP_LT_OQ);
    __m512 log_mask = zero;
    if (on_ramp != 0) {
      log_mask = _mm512_maskz_mov_ps(on_ramp, Sleef_logf16_u10avx512f(_mm512_max_ps(mask, floor)));
      on_row += __builtin_popcount(on_ramp);
      const __m512i counts = _mm512_loadu_si512(key_ramp + j);
      _mm512_storeu_si512(key_ramp + j, _mm512_mask_add_epi32(counts, on_ramp, counts, _mm512_set1_epi32(1)));
    }
    _mm512_storeu_ps(lm + j, _mm512_mask_mov_ps(minus_inf, vis, log_mask));
    const __mmask16 has_slot = vis & _mm512_cmp_ps_mask(d, limit, _CMP_LT_OQ);
    _mm512_storeu_si512(slot + j, _mm512_mask_mov_epi32(none, has_slot, _mm512_cvttps_epi32(d)));
    const __mmask16 has_slope = vis & _mm512_cmp_ps_mask(pre, one, _CMP_LE_OQ) & _mm512_cmp_ps_mask(mask, floor, _CMP_GE_OQ);
    if (has_slope != 0) {
      const __m512i keys = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j)), lane);
      _mm512_storeu_si512(sl.key + sl.count, _mm512_maskz_compress_epi32(has_slope, keys));
      _mm512_storeu_ps(sl.slope + sl.count, _mm512_maskz_compress_ps(has_slope, _mm512_mul_ps(mask, ramp)));
      sl.count += __builtin_popcount(has_slope);
    }
  }
  return on_row + mask_row_scalar(x, j, n, lm, slot, sl, key_ramp);
}

template <typename T>
int32_t mask_row(const MaskRow<T>& x, int64_t n, T* lm, int32_t* slot, RampList<T>& sl, int32_t* key_ramp, int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes == 16) return mask_row_avx512(x, n, lm, slot, sl, key_ramp);
    if (lanes >= 8) return mask_row_avx2(x, n, lm, slot, sl, key_ramp);
  }
  return mask_row_scalar(x, 0, n, lm, slot, sl, key_ramp);
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

// One score row of n keys: y = s + (position + l), the position `pq[slot]` for the keys
// whose slot is below p, zero elsewhere (the written-out path's bias, added in its
// order; a log is never -0, so adding a zero position changes no bit); then, with
// `softmax`, its softmax in place.
template <typename T>
void score_row_scalar(int64_t n, const T* s, const T* l, const int32_t* slot, const T* pq, int32_t p, bool softmax, T* y) {
  for (int64_t j = 0; j < n; ++j) y[j] = s[j] + ((slot[j] < p ? pq[slot[j]] : T(0)) + l[j]);
  if (softmax) softmax_row_scalar(y, n);
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

// exp8_u20 on 16 floats with AVX-512: the same operations lane by lane, so the same bits.
__attribute__((target("avx512f"))) inline __m512 exp16_u20(__m512 x) {
  const __m512 ln_min = _mm512_castsi512_ps(_mm512_set1_epi32(0xc2aeac50)),
               ln_max = _mm512_castsi512_ps(_mm512_set1_epi32(0x42b17218)),
               log2e = _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b)),
               ln2 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218)), one = _mm512_set1_ps(1.0f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, ln_min, _CMP_LT_OS);
  const __m512 clamped = _mm512_max_ps(_mm512_min_ps(x, ln_max), ln_min);
  const __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(clamped, log2e, _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(k, ln2, clamped);
  __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(0.00828929059f), _mm512_set1_ps(0.0418978221f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.166676521f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.499991506f));
  p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.999999701f));
  p = _mm512_fmadd_ps(r, p, one);
  const __m512i biased = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_sub_ps(k, one)), _mm512_set1_epi32(127));
  const __m512 scale = _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)));
  return _mm512_mul_ps(_mm512_mul_ps(p, scale), _mm512_set1_ps(2.0f));
}

// The upper 8 floats of 16 (AVX-512F alone has no float extract of a half).
__attribute__((target("avx512f"))) inline __m256 high_half(__m512 x) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
}

// The lanes below `count` (0..8) of a vector, all ones, the others zero.
__attribute__((target("avx2"))) inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Runs of consecutive slots. A row's near keys are mostly a run, one key per distance
// (the block's own keys and the kept ones just before them): their slots, and the keys
// at a run of distances, descend one by one along the lanes. Such a group is read as one
// load of the run reversed instead of a gather (slow on some CPUs: a third of the score
// rows' time on an AMD EPYC), the same values.

// Whether lane i of `v` holds `first - i` for every lane, `first` being lane 0's value,
// with first - 7 >= 0.
__attribute__((target("avx2"))) inline bool descending_run8(__m256i v, int32_t* first) {
  *first = _mm_cvtsi128_si32(_mm256_castsi256_si128(v));
  const __m256i run = _mm256_sub_epi32(_mm256_set1_epi32(*first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return *first >= 7 && _mm256_movemask_epi8(_mm256_cmpeq_epi32(v, run)) == -1;
}

// x[first - i] in lane i (i < 8): x[first - 7 .. first] reversed.
__attribute__((target("avx2"))) inline __m256 reversed8(const float* x, int32_t first) {
  return _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + first - 7), _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0));
}

// descending_run8 for 16 lanes.
__attribute__((target("avx512f"))) inline bool descending_run16(__m512i v, int32_t* first) {
  *first = _mm_cvtsi128_si32(_mm512_castsi512_si128(v));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return *first >= 15 && _mm512_cmpeq_epi32_mask(v, _mm512_sub_epi32(_mm512_set1_epi32(*first), lane)) == 0xffff;
}

// reversed8 for 16 lanes.
__attribute__((target("avx512f"))) inline __m512 reversed16(const float* x, int32_t first) {
  const __m512i back = _mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_permutexvar_ps(back, _mm512_loadu_ps(x + first - 15));
}

// Keys j..j+7 of a score row (see score_row_scalar), `in_row` the lanes before its end;
// the lanes past it are -inf. The slots are read at the offset and width the mask row
// stored them.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 score_group_avx2(int64_t j, __m256i in_row, const float* s,
                                                                                const float* l, const int32_t* slot,
                                                                                const float* pq, int32_t p) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 lf = _mm256_maskload_ps(l + j, in_row);
  const __m256i slots = _mm256_maskload_epi32(slot + j, in_row);
  const __m256i has = _mm256_and_si256(in_row, _mm256_cmpgt_epi32(_mm256_set1_epi32(p), slots));
  __m256 position = zero;
  if (!_mm256_testz_si256(has, has)) {
    int32_t first = 0;
    const bool run = _mm256_movemask_ps(_mm256_castsi256_ps(has)) == 0xff && descending_run8(slots, &first);
    position = run ? reversed8(pq, first) : _mm256_mask_i32gather_ps(zero, pq, slots, _mm256_castsi256_ps(has), 4);
  }
  const __m256 v = _mm256_add_ps(_mm256_maskload_ps(s + j, in_row), _mm256_add_ps(position, lf));
  return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), v, _mm256_castsi256_ps(in_row));
}

// The softmax of a row's last `count` (< 8) keys `v`, after its 8-key groups: each
// y[k] = exp(v[k] - top), added to `sum` in key order, then scaled by 1 / sum in the
// caller. The plain exp and order of the kernel before its rows were vectorised whole,
// so that the weights keep their bits.
inline void softmax_tail(const float* v, int64_t count, float top, float* e, float& sum) {
  for (int64_t k = 0; k < count; ++k) {
    e[k] = std::exp(v[k] - top);
    sum += e[k];
  }
}

// score_row_scalar for float, 8 keys at a time with AVX2. Each pass stores a group at the
// offset where the next pass reads it, 8 keys wide: a read that spans several
// just-written narrower stores would wait for them to reach the cache. The row's last
// keys (a masked group; lanes past the row are -inf) stay in a register. The softmax
// sums 8 lanes over the groups in key order, then the last keys one by one with the
// plain exp: the bits of the kernel's earlier loops.
__attribute__((target("avx2,fma"))) void score_row_avx2(int64_t n, const float* s, const float* l, const int32_t* slot,
                                                       const float* pq, int32_t p, bool softmax, float* y) {
  const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t whole = n / 8 * 8, rest = n - whole;
  const __m256i all = _mm256_set1_epi32(-1), tail = first_lanes(rest);
  __m256 top8 = minus_inf;
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 v = score_group_avx2(j, all, s, l, slot, pq, p);
    _mm256_storeu_ps(y + j, v);
    top8 = _mm256_max_ps(top8, v);
  }
  const __m256 last = score_group_avx2(whole, tail, s, l, slot, pq, p);
  if (!softmax) {
    _mm256_maskstore_ps(y + whole, tail, last);
    return;
  }
  alignas(32) float lanes[8], v_last[8], e_last[8];
  _mm256_store_ps(lanes, _mm256_max_ps(top8, last));
  _mm256_store_ps(v_last, last);
  float top = lanes[0];
  for (float x : lanes) top = std::max(top, x);
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 e = exp8_u20(_mm256_sub_ps(_mm256_loadu_ps(y + j), shift));
    _mm256_storeu_ps(y + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  float sum = lane_sum(sum8);
  softmax_tail(v_last, rest, top, e_last, sum);
  const float inverse = 1.0f / sum;
  const __m256 scale = _mm256_set1_ps(inverse);
  for (int64_t j = 0; j < whole; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), scale));
  for (int64_t k = 0; k < rest; ++k) y[whole + k] = e_last[k] * inverse;
}

// score_group_avx2 for keys j..j+15 with AVX-512.
__attribute__((target("avx512f"), always_inline)) inline __m512 score_group_avx512(int64_t j, __mmask16 in_row, const float* s,
                                                                                 const float* l, const int32_t* slot,
                                                                                 const float* pq, int32_t p) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 lf = _mm512_maskz_loadu_ps(in_row, l + j);
  const __m512i none = _mm512_set1_epi32(p);
  const __m512i slots = _mm512_mask_loadu_epi32(none, in_row, slot + j);
  const __mmask16 has = _mm512_mask_cmplt_epi32_mask(in_row, slots, none);
  __m512 position = zero;
  if (has != 0) {
    int32_t first = 0;
    const bool run = has == 0xffff && descending_run16(slots, &first);
    position = run ? reversed16(pq, first) : _mm512_mask_i32gather_ps(zero, has, slots, pq, 4);
  }
  const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(in_row, s + j), _mm512_add_ps(position, lf));
  return _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), in_row, v);
}

// score_row_avx2 16 keys at a time with AVX-512, to the same bits: the softmax's sum
// adds each 16-key group's two halves to 8 lanes in turn (the order of 8-key groups),
// then a last 8-key group, then the last keys one by one.
__attribute__((target("avx512f"))) void score_row_avx512(int64_t n, const float* s, const float* l, const int32_t* slot,
                                                        const float* pq, int32_t p, bool softmax, float* y) {
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t whole = n / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - whole)) - 1u);
  __m512 top16 = minus_inf;
  for (int64_t j = 0; j < whole; j += 16) {
    const __m512 v = score_group_avx512(j, static_cast<__mmask16>(0xffff), s, l, slot, pq, p);
    _mm512_storeu_ps(y + j, v);
    top16 = _mm512_max_ps(top16, v);
  }
  const __m512 last = score_group_avx512(whole, tail, s, l, slot, pq, p);
  if (!softmax) {
    _mm512_mask_storeu_ps(y + whole, tail, last);
    return;
  }
  const float top = _mm512_reduce_max_ps(_mm512_max_ps(top16, last));
  const __m512 shift = _mm512_set1_ps(top);
  __m256 sum8 = _mm256_setzero_ps();
  for (int64_t j = 0; j < whole; j += 16) {
    const __m512 e = exp16_u20(_mm512_sub_ps(_mm512_loadu_ps(y + j), shift));
    _mm512_storeu_ps(y + j, e);
    sum8 = _mm256_add_ps(sum8, _mm512_castps512_ps256(e));
    sum8 = _mm256_add_ps(sum8, high_half(e));
  }
  // The last keys: a group of 8 if there is one (the low half of `last`), then the rest.
  const int64_t eight = (n - whole) >= 8 ? 8 : 0, rest = n - whole - eight;
  alignas(64) float v_last[16], e_last[16];
  _mm512_store_ps(v_last, last);
  const __m512 e_group = exp16_u20(_mm512_sub_ps(last, shift));
  if (eight != 0) sum8 = _mm256_add_ps(sum8, _mm512_castps512_ps256(e_group));
  float sum = lane_sum(sum8);
  softmax_tail(v_last + eight, rest, top, e_last + eight, sum);
  const float inverse = 1.0f / sum;
  const __m512 scale = _mm512_set1_ps(inverse);
  for (int64_t j = 0; j < whole; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), scale));
  if (eight != 0) _mm256_storeu_ps(y + whole, _mm256_mul_ps(_mm512_castps512_ps256(e_group), _mm512_castps512_ps256(scale)));
  for (int64_t k = 0; k < rest; ++k) y[whole + eight + k] = e_last[eight + k] * inverse;
}

template <typename T>
void score_row(int64_t n, const T* s, const T* l, const int32_t* slot, const T* pq, int32_t p, bool softmax, T* y,
               int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes == 16) return score_row_avx512(n, s, l, slot, pq, p, softmax, y);
    if (lanes == 8) return score_row_avx2(n, s, l, slot, pq, p, softmax, y);
  }
  score_row_scalar(n, s, l, slot, pq, p, softmax, y);
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

// softmax_backward_row_avx2 16 keys at a time with AVX-512, to the same bits: the
// products of each 16-key group are added to 8 lanes half by half (the order of 8-key
// groups), then a last 8-key group, then the last keys one by one. The file is compiled
// with -ffp-contract=off: with FMA in the target, the compiler would otherwise fuse a
// product and its addition into one rounding (why an earlier 16-wide loop lost the bits).
__attribute__((target("avx512f"))) void softmax_backward_row_avx512(const float* p, const float* g, float* gs, int64_t n) {
  __m256 dot8 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 product = _mm512_mul_ps(_mm512_loadu_ps(g + j), _mm512_loadu_ps(p + j));
    dot8 = _mm256_add_ps(dot8, _mm512_castps512_ps256(product));
    dot8 = _mm256_add_ps(dot8, high_half(product));
  }
  if (j + 8 <= n) {
    dot8 = _mm256_add_ps(dot8, _mm256_mul_ps(_mm256_loadu_ps(g + j), _mm256_loadu_ps(p + j)));
    j += 8;
  }
  float dot = lane_sum(dot8);
  for (int64_t k = j; k < n; ++k) dot += g[k] * p[k];
  const __m512 dot_all = _mm512_set1_ps(dot);
  for (j = 0; j + 16 <= n; j += 16) {
    _mm512_storeu_ps(gs + j, _mm512_mul_ps(_mm512_loadu_ps(p + j), _mm512_sub_ps(_mm512_loadu_ps(g + j), dot_all)));
  }
  for (int64_t k = j; k < n; ++k) gs[k] = p[k] * (g[k] - dot);
}

template <typename T>
void softmax_backward_row(const T* p, const T* g, T* gs, int64_t n, int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes == 16) return softmax_backward_row_avx512(p, g, gs, n);
    if (lanes >= 8) return softmax_backward_row_avx2(p, g, gs, n);
  }
  softmax_backward_row_scalar(p, g, gs, n);
}

// The forward pass's inputs and outputs, as pointers.
template <typename T>
struct Forward {
  const T *scores, *pq, *spans, *counter;
  const bool* usable;
  T ramp;
  int lanes;
  bool softmax;
  T *out, *slope;
  int32_t *by_slot, *key_ramp, *ramp_key, *ramp_count;
  int64_t* query_weighted;
};

// The key at each distance below p of a row, from its keys' slots (from `j0` on; the keys
// before it are too far for a position): by_slot[slot[j]] = j where slot[j] < p, -1 at
// the distances no key is at. A seen key is the only one at its distance (one key per
// time step), so no slot is written twice.
inline void key_by_slot_scalar(int64_t j0, int64_t n, const int32_t* slot, int32_t p, int32_t* by_slot) {
  for (int64_t j = j0; j < n; ++j) {
    if (slot[j] < p) by_slot[slot[j]] = static_cast<int32_t>(j);
  }
}

// key_by_slot_scalar 16 keys at a time through AVX-512's scatter, from the group that
// holds `j0` (the slots read at the offsets the mask row stored them).
__attribute__((target("avx512f"))) void key_by_slot_avx512(int64_t j0, int64_t n, const int32_t* slot, int32_t p,
                                                         int32_t* by_slot) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), none = _mm512_set1_epi32(p);
  int64_t j = j0 / 16 * 16;
  for (; j + 16 <= n; j += 16) {
    const __m512i slots = _mm512_loadu_si512(slot + j);
    const __mmask16 near = _mm512_cmplt_epi32_mask(slots, none);
    int32_t first = 0;
    if (near == 0xffff && descending_run16(slots, &first)) {
      // Keys j..j+15 at distances first..first-15: by_slot[first - 15 + t] = j + 15 - t.
      const __m512i keys = _mm512_sub_epi32(_mm512_set1_epi32(static_cast<int32_t>(j + 15)), lane);
      _mm512_storeu_si512(by_slot + first - 15, keys);
    } else if (near != 0) {
      const __m512i key = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j)), lane);
      _mm512_mask_i32scatter_epi32(by_slot, near, slots, key, 4);
    }
  }
  key_by_slot_scalar(j, n, slot, p, by_slot);
}

inline void key_by_slot(int64_t j0, int64_t n, const int32_t* slot, int32_t p, int32_t* by_slot, int lanes) {
  std::fill(by_slot, by_slot + p, -1);
  if (lanes == 16) return key_by_slot_avx512(j0, n, slot, p, by_slot);
  key_by_slot_scalar(j0, n, slot, p, by_slot);
}

// The ramp pairs that one thread has counted in one stream: per key, and the sum of the
// query indices over the pairs. Added to the shared totals when the thread moves on to
// another stream: one atomic per key and stream instead of one per pair, and none per
// row (a locked addition waits for every store before it, a score row's included).
struct StreamTally {
  std::vector<int32_t> counts;
  int64_t weighted = 0;

  // Adds the tally into stream b's totals (integer sums: the order of the threads
  // changes nothing) and clears it.
  void flush(int32_t* key_ramp, int64_t* query_weighted) {
    for (size_t j = 0; j < counts.size(); ++j) {
      if (counts[j] != 0) __atomic_fetch_add(key_ramp + j, counts[j], __ATOMIC_RELAXED);
    }
    std::fill(counts.begin(), counts.end(), 0);
    if (weighted != 0) __atomic_fetch_add(query_weighted, weighted, __ATOMIC_RELAXED);
    weighted = 0;
  }
};

// Row (b, i): the mask row (into `lm` and `slot`, n long each; its ramp pairs counted
// into `tally`, this thread's of the stream) and, for the backward pass, the key at each
// distance below p (`by_slot`), then the h score rows.
template <typename T>
void forward_row(const Dims& dm, const Forward<T>& f, int64_t b, int64_t i, T* lm, int32_t* slot, StreamTally& tally) {
  const int64_t n = dm.n, mask_row_at = (b * dm.m + i) * n;
  const MaskRow<T> x{f.spans + b * n, f.counter + b * n, f.usable + (b * dm.usable_rows + (dm.usable_rows == 1 ? 0 : i)) * n,
                     static_cast<T>(i), f.ramp, static_cast<int32_t>(dm.p)};
  RampList<T> ramp{f.ramp_key + mask_row_at, f.slope + mask_row_at, 0};
  const int32_t on_row = mask_row(x, n, lm, slot, ramp, tally.counts.data(), f.lanes);
  f.ramp_count[b * dm.m + i] = ramp.count;
  tally.weighted += static_cast<int64_t>(on_row) * i;
  // Only the last `P - 1 + m` keys can be nearer than P (the cache is in time order).
  key_by_slot(n - dm.near(), n, slot, static_cast<int32_t>(dm.p), f.by_slot + (b * dm.m + i) * dm.p, f.lanes);
  for (int64_t h = 0; h < dm.h; ++h) {
    const int64_t r = (b * dm.h + h) * dm.m + i;
    score_row(n, f.scores + r * n, lm, slot, f.pq + r * dm.p, static_cast<int32_t>(dm.p), f.softmax, f.out + r * n, f.lanes);
  }
}

template <typename T>
void forward_kernel(const Dims& dm, const Forward<T>& f) {
  at::parallel_for(0, dm.b * dm.m, 4, [&](int64_t r0, int64_t r1) {
    std::vector<T> lm(dm.n);
    std::vector<int32_t> slot(dm.n);
    StreamTally tally{std::vector<int32_t>(dm.n, 0)};
    int64_t stream = r0 / dm.m;
    for (int64_t r = r0; r < r1; ++r) {
      if (r / dm.m != stream) {
        tally.flush(f.key_ramp + stream * dm.n, f.query_weighted + stream);
        stream = r / dm.m;
      }
      forward_row(dm, f, stream, r % dm.m, lm.data(), slot.data(), tally);
    }
    tally.flush(f.key_ramp + stream * dm.n, f.query_weighted + stream);
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
  const int32_t *by_slot, *ramp_key, *ramp_count;
  int lanes;
  T *gs, *gp;
};

// sum[k] += g[keys[k]] for k < count: one head's gradient at a row's ramp keys.
template <typename T>
void add_at_scalar(int32_t k0, int32_t count, const int32_t* keys, const T* g, T* sum) {
  for (int32_t k = k0; k < count; ++k) sum[k] += g[keys[k]];
}

// add_at_scalar for float, 8 keys at a time through AVX2's gather (each sum gets the
// same addition as in the plain loop).
__attribute__((target("avx2"))) void add_at_avx2(int32_t count, const int32_t* keys, const float* g, float* sum) {
  int32_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256 at = _mm256_i32gather_ps(g, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + k)), 4);
    _mm256_storeu_ps(sum + k, _mm256_add_ps(_mm256_loadu_ps(sum + k), at));
  }
  add_at_scalar(k, count, keys, g, sum);
}

template <typename T>
void add_at(int32_t count, const int32_t* keys, const T* g, T* sum, int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes >= 8) return add_at_avx2(count, keys, g, sum);
  }
  add_at_scalar(0, count, keys, g, sum);
}

// A score row's gradient at each distance d < p: gp[d] = g[by_slot[d]] (plus 0, as the
// sum into zeros that it replaces: a -0 becomes +0), 0 where no key is at d.
template <typename T>
void positions_grad_scalar(int64_t d0, int64_t p, const int32_t* by_slot, const T* g, T* gp) {
  for (int64_t d = d0; d < p; ++d) gp[d] = by_slot[d] >= 0 ? g[by_slot[d]] + T(0) : T(0);
}

// positions_grad_scalar for float, 8 distances at a time through AVX2's masked gather.
__attribute__((target("avx2"))) void positions_grad_avx2(int64_t p, const int32_t* by_slot, const float* g, float* gp) {
  const __m256 zero = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= p; d += 8) {
    const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(by_slot + d));
    int32_t first = 0;
    if (descending_run8(key, &first)) {
      _mm256_storeu_ps(gp + d, _mm256_add_ps(reversed8(g, first), zero));
      continue;
    }
    const __m256 has = _mm256_castsi256_ps(_mm256_cmpgt_epi32(key, _mm256_set1_epi32(-1)));
    _mm256_storeu_ps(gp + d, _mm256_add_ps(_mm256_mask_i32gather_ps(zero, g, key, has, 4), zero));
  }
  positions_grad_scalar(d, p, by_slot, g, gp);
}

// positions_grad_scalar for float, 16 distances at a time with AVX-512.
__attribute__((target("avx512f"))) void positions_grad_avx512(int64_t p, const int32_t* by_slot, const float* g, float* gp) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= p; d += 16) {
    const __m512i key = _mm512_loadu_si512(by_slot + d);
    int32_t first = 0;
    if (descending_run16(key, &first)) {
      _mm512_storeu_ps(gp + d, _mm512_add_ps(reversed16(g, first), zero));
      continue;
    }
    const __mmask16 has = _mm512_cmpge_epi32_mask(key, _mm512_setzero_si512());
    _mm512_storeu_ps(gp + d, _mm512_add_ps(_mm512_mask_i32gather_ps(zero, has, key, g, 4), zero));
  }
  positions_grad_scalar(d, p, by_slot, g, gp);
}

template <typename T>
void positions_grad(int64_t p, const int32_t* by_slot, const T* g, T* gp, int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes == 16) return positions_grad_avx512(p, by_slot, g, gp);
    if (lanes == 8) return positions_grad_avx2(p, by_slot, g, gp);
  }
  positions_grad_scalar(0, p, by_slot, g, gp);
}

// sum[k] /= slope[k] for k < count.
template <typename T>
void divide_scalar(int32_t k0, int32_t count, T* sum, const T* slope) {
  for (int32_t k = k0; k < count; ++k) sum[k] = sum[k] / slope[k];
}

// divide_scalar for float, 16 at a time with AVX-512 (the same division, lane by lane).
__attribute__((target("avx512f"))) void divide_avx512(int32_t count, float* sum, const float* slope) {
  int32_t k = 0;
  for (; k + 16 <= count; k += 16) _mm512_storeu_ps(sum + k, _mm512_div_ps(_mm512_loadu_ps(sum + k), _mm512_loadu_ps(slope + k)));
  divide_scalar(k, count, sum, slope);
}

template <typename T>
void divide(int32_t count, T* sum, const T* slope, int lanes) {
  if constexpr (std::is_same_v<T, float>) {
    if (lanes == 16) return divide_avx512(count, sum, slope);
  }
  divide_scalar(0, count, sum, slope);
}

// Row (b, i) of the backward pass: each head's scores gradient (through the softmax,
// when the kernel took it), its positions gradient (gathered from the key at each
// distance below P: at most one), and into `by_query` the spans' share of this query at
// the row's ramp keys (in the order of its ramp list), the sum over heads of the
// scores' gradient divided by m R. The other keys' share is zero.
template <typename T>
void backward_row(const Dims& dm, const Backward<T>& f, int64_t b, int64_t i, T* by_query) {
  const int64_t n = dm.n, row = b * dm.m + i;
  const int32_t* __restrict by_slot = f.by_slot + row * dm.p;
  const int32_t count = f.ramp_count[row];
  const int32_t* __restrict keys = f.ramp_key + row * n;
  T* __restrict sum = by_query;
  std::fill(sum, sum + count, T(0));
  for (int64_t h = 0; h < dm.h; ++h) {
    const int64_t r = (b * dm.h + h) * dm.m + i;
    const T* gr = f.g + r * n;
    if (f.probs != nullptr) {
      softmax_backward_row(f.probs + r * n, gr, f.gs + r * n, n, f.lanes);
      gr = f.gs + r * n;
    }
    positions_grad(dm.p, by_slot, gr, f.gp + r * dm.p, f.lanes);
    add_at(count, keys, gr, sum, f.lanes);
  }
  divide(count, sum, f.slope + row * n, f.lanes);
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

}  // namespace
