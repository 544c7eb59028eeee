// The matrix-vector products of decoding, one token at a time through a pretrained
// decoder (crates/model/src/decode.rs wraps them): each weight matrix is read once per
// token with a few FLOPs per value, so the read rate is the limit. libtorch's product
// of one row by a large matrix reached about a third of this machine's read rate; this
// loop reads each row of the weights once, as a stream, and keeps sixteen partial sums
// so that the adds do not wait on each other, the rows spread over libtorch's threads.
// Weights in bfloat16 (a decoder read with `--precision bf16`) are streamed as they are,
// half the bytes, each value widened to float32 as it is read (a bfloat16 is the upper
// half of a float32) and the sums kept in float32, each output rounded to bfloat16 once.
//
// Attention of one token's queries over the cache is the same kind of product twice:
// scores from every key, the context from every value, each held row read once, keys and
// values read in place where the cache holds them (rows of a head contiguous). Over a
// bfloat16 or float16 cache it rounds where `transformers`' eager attention does: each
// score to the cache's precision, the softmax in float32, the weights to that precision
// before they meet the values, the context to it; the sums in float32.
// The conversions run eight values at a time where the CPU allows (F16C for float16,
// AVX2 for bfloat16's rounding), to the bit of c10's scalar ones.
//
// Also the read-rate probe of `lethe bench`: the same streaming read, summed.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "blas.h"
#include "guard.h"
#include "lethe.h"

namespace {

constexpr int64_t kLanes = 16;

// The dot product of `w` and `x` over `k` values, in kLanes partial sums.
inline float dot(const float* w, const float* x, int64_t k) {
  float acc[kLanes] = {0};
  int64_t j = 0;
  for (; j + kLanes <= k; j += kLanes)
    for (int64_t u = 0; u < kLanes; ++u) acc[u] += w[j + u] * x[j + u];
  float s = 0;
  for (; j < k; ++j) s += w[j] * x[j];
  for (int64_t u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

// The bfloat16 value `bits` as a float32: its sixteen bits become the upper half.
inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// The dot product of bfloat16 `w` and float32 `x` over `k` values, in kLanes partial sums.
inline float dot(const uint16_t* w, const float* x, int64_t k) {
  float acc[kLanes] = {0};
  int64_t j = 0;
  for (; j + kLanes <= k; j += kLanes)
    for (int64_t u = 0; u < kLanes; ++u) acc[u] += widen(w[j + u]) * x[j + u];
  float s = 0;
  for (; j < k; ++j) s += widen(w[j]) * x[j];
  for (int64_t u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

#if defined(__x86_64__)
// [`dot`] of bfloat16 weights with AVX2, for the CPUs that have it: eight weights widened
// at a time (zero-extended to 32 bits, shifted into the upper half), the same sixteen
// partial sums as two vectors of eight, multiplied and added apart (no fused multiply-add,
// as the build contracts none), so that it sums exactly as the loop above does.
__attribute__((target("avx2"))) inline __m256 widen8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

__attribute__((target("avx2"))) float dot_avx2(const uint16_t* w, const float* x, int64_t k) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + kLanes <= k; j += kLanes) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(widen8(w + j), _mm256_loadu_ps(x + j)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(widen8(w + j + 8), _mm256_loadu_ps(x + j + 8)));
  }
  float acc[kLanes];
  _mm256_storeu_ps(acc, lo);
  _mm256_storeu_ps(acc + 8, hi);
  float s = 0;
  for (; j < k; ++j) s += widen(w[j]) * x[j];
  for (int64_t u = 0; u < kLanes; ++u) s += acc[u];
  return s;
}

const bool kAvx2 = __builtin_cpu_supports("avx2");
#endif

// [`dot`] of bfloat16 weights, vectorised where the CPU allows.
inline float dot_bf16(const uint16_t* w, const float* x, int64_t k) {
#if defined(__x86_64__)
  if (kAvx2) return dot_avx2(w, x, k);
#endif
  return dot(w, x, k);
}

// gemv of bfloat16 weights, input and bias: the input widened once, each row of w read
// once as bfloat16, the sums in float32, each output rounded to bfloat16.
at::Tensor gemv_bf16(const at::Tensor& w_in, const at::Tensor& x_in, const at::Tensor* bias) {
  const int64_t n = w_in.size(0), k = w_in.size(1);
  TORCH_CHECK(x_in.scalar_type() == at::kBFloat16 && x_in.size(-1) == k,
              "decode product: the input must be bfloat16 (.., ", k, "), got ", x_in.sizes());
  const at::Tensor w = w_in.contiguous(), x = x_in.contiguous().view({-1, k}).to(at::kFloat);
  const int64_t m = x.size(0);
  auto out_shape = x_in.sizes().vec();
  out_shape.back() = n;
  at::Tensor y = at::empty({m, n}, x_in.options());
  const at::Tensor b = bias != nullptr ? bias->contiguous().to(at::kFloat) : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == n, "decode product: the bias must be (", n, ")");
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const float *xp = x.data_ptr<float>(), *bp = b.defined() ? b.data_ptr<float>() : nullptr;
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, n, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < m; ++i)
        yp[i * n + r] = at::BFloat16(dot_bf16(wp + r * k, xp + i * k, k) + (bp != nullptr ? bp[r] : 0.0f));
  });
  return y.view(out_shape);
}

// y (m, n) = x (m, k) w^T (w: n, k) + bias (n), for a few rows of x: each row of w is
// read once and multiplied by every row of x. Float32 throughout, or bfloat16
// ([`gemv_bf16`]).
at::Tensor gemv(const at::Tensor& w_in, const at::Tensor& x_in, const at::Tensor* bias) {
  if (w_in.dim() == 2 && w_in.scalar_type() == at::kBFloat16 && w_in.device().is_cpu())
    return gemv_bf16(w_in, x_in, bias);
  TORCH_CHECK(w_in.dim() == 2 && w_in.scalar_type() == at::kFloat && w_in.device().is_cpu(),
              "decode product: the weights must be a float32 (n, k) matrix on the CPU, got ", w_in.sizes());
  const int64_t n = w_in.size(0), k = w_in.size(1);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.size(-1) == k, "decode product: the input must be float32 (.., ",
              k, "), got ", x_in.sizes());
  const at::Tensor w = w_in.contiguous(), x = x_in.contiguous().view({-1, k});
  const int64_t m = x.size(0);
  auto out_shape = x_in.sizes().vec();
  out_shape.back() = n;
  at::Tensor y = at::empty({m, n}, x.options());
  const at::Tensor b = bias != nullptr ? bias->contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || (b.numel() == n && b.scalar_type() == at::kFloat), "decode product: the bias must be (", n,
              ") float32");
  const float *wp = w.data_ptr<float>(), *xp = x.data_ptr<float>(), *bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < m; ++i) yp[i * n + r] = dot(wp + r * k, xp + i * k, k) + (bp != nullptr ? bp[r] : 0.0f);
  });
  return y.view(out_shape);
}

// `x` rounded to the precision of `E` (bfloat16's bits, float16) and widened back.
template <typename E>
inline float round_to(float x) {
  if constexpr (std::is_same_v<E, uint16_t>) return static_cast<float>(at::BFloat16(x));
  else return static_cast<float>(at::Half(x));
}

#if defined(__x86_64__)
// Float16 to and from float32 eight values at a time with F16C (every CPU with AVX2 has
// it), rounding to nearest even as c10's scalar conversion does; a float16 cache is
// otherwise widened one value at a time in software.
__attribute__((target("avx,f16c"))) void widen_half_f16c(const at::Half* rows, int64_t count, float* out) {
  int64_t j = 0;
  for (; j + 8 <= count; j += 8)
    _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + j))));
  for (; j < count; ++j) out[j] = static_cast<float>(rows[j]);
}

__attribute__((target("avx,f16c"))) inline __m256 round_half8(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// [`round_scaled`] for float16 with F16C.
__attribute__((target("avx,f16c"))) void round_scaled_f16c(float* x, int64_t count, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8)
    _mm256_storeu_ps(x + j, round_half8(_mm256_mul_ps(round_half8(_mm256_loadu_ps(x + j)), s)));
  for (; j < count; ++j) x[j] = round_to<at::Half>(round_to<at::Half>(x[j]) * scale);
}

const bool kF16c = __builtin_cpu_supports("f16c");

// Eight float32 values rounded to bfloat16 and widened back, as c10's conversion rounds:
// to nearest even (the bias 0x7fff plus the lowest bit kept), NaN to its quiet NaN.
__attribute__((target("avx2"))) inline __m256 round_bf16x8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(bits, _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7fff)));
  const __m256 rounded = _mm256_castsi256_ps(_mm256_and_si256(biased, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  return _mm256_blendv_ps(rounded, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// [`round_scaled`] for bfloat16 with AVX2.
__attribute__((target("avx2"))) void round_scaled_bf16_avx2(float* x, int64_t count, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8)
    _mm256_storeu_ps(x + j, round_bf16x8(_mm256_mul_ps(round_bf16x8(_mm256_loadu_ps(x + j)), s)));
  for (; j < count; ++j) x[j] = round_to<uint16_t>(round_to<uint16_t>(x[j]) * scale);
}
#endif

// Each of `count` scores `x` becomes `round(round(x) * scale)`, rounded to the precision
// of `E` as eager attention rounds the product and then the scaled scores.
template <typename E>
void round_scaled(float* x, int64_t count, float scale) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<E, at::Half>)
    if (kF16c) return round_scaled_f16c(x, count, scale);
  if constexpr (std::is_same_v<E, uint16_t>)
    if (kAvx2) return round_scaled_bf16_avx2(x, count, scale);
#endif
  for (int64_t j = 0; j < count; ++j) x[j] = round_to<E>(round_to<E>(x[j]) * scale);
}

// `count` rows' values of a head as float32: a float32 cache's where it holds them, a
// bfloat16 or float16 cache's widened into `buffer` (which the chunk's product then reads
// from cache).
inline const float* as_float(const float* rows, int64_t, std::vector<float>&) { return rows; }
inline const float* as_float(const uint16_t* rows, int64_t count, std::vector<float>& buffer) {
  buffer.resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) buffer[j] = widen(rows[j]);
  return buffer.data();
}
inline const float* as_float(const at::Half* rows, int64_t count, std::vector<float>& buffer) {
  buffer.resize(static_cast<size_t>(count));
#if defined(__x86_64__)
  if (kF16c) {
    widen_half_f16c(rows, count, buffer.data());
    return buffer.data();
  }
#endif
  for (int64_t j = 0; j < count; ++j) buffer[j] = static_cast<float>(rows[j]);
  return buffer.data();
}

// The element type `E` of the cache's keys and values as held: float for float32,
// uint16_t for bfloat16's bits, at::Half for float16.
template <typename E>
const E* held(const at::Tensor& t) {
  if constexpr (std::is_same_v<E, float>) return t.data_ptr<float>();
  else if constexpr (std::is_same_v<E, at::Half>) return t.data_ptr<at::Half>();
  else return reinterpret_cast<const E*>(t.data_ptr<at::BFloat16>());
}

// [`attend`] over a cache of element type `E`. In half precision (`E` = uint16_t for
// bfloat16, at::Half for float16) it rounds where eager attention does: each score
// `(q k^T) * scale` to that precision, the weights to it before they meet the values, the
// context to it; the sums in float32.
template <typename E>
std::pair<at::Tensor, at::Tensor> attend_held(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                                              const at::Tensor* bias, double scale) {
  constexpr bool half = !std::is_same_v<E, float>;
  const at::ScalarType kind = keys.scalar_type();
  // In float32 the scale goes on the queries: a power of two for the usual head sizes,
  // so exactly the scores scaled.
  const at::Tensor q = half ? q_in.to(at::kFloat).contiguous() : (q_in * scale).contiguous();
  const int64_t b = q.size(0), kv = q.size(1), g = q.size(2), hd = q.size(3), n = keys.size(2);
  at::Tensor weights = at::empty({b, kv, g, n}, q.options());
  const float* qp = q.data_ptr<float>();
  const E *kp = held<E>(keys), *vp = held<E>(values);
  float* wp = weights.data_ptr<float>();
  const auto head_k = [&](int64_t bh) { return kp + (bh / kv) * keys.stride(0) + (bh % kv) * keys.stride(1); };
  const auto head_v = [&](int64_t bh) { return vp + (bh / kv) * values.stride(0) + (bh % kv) * values.stride(1); };
  // Chunks of 256 to 2048 rows, about four per thread: large enough that each small
  // product's call costs little, enough of them to keep the threads busy.
  const int64_t threads = at::get_num_threads();
  const int64_t rows = std::clamp<int64_t>((b * kv * n + 4 * threads - 1) / (4 * threads), 256, 2048);
  const int64_t chunks = (n + rows - 1) / rows;
  // Scores, a chunk of keys at a time (a small product on the calling thread), then
  // their softmax.
  const float s = static_cast<float>(scale);
  at::parallel_for(0, b * kv * chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> buffer;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t bh = c / chunks, r0 = (c % chunks) * rows, r1 = std::min(n, r0 + rows);
      const float* k = as_float(head_k(bh) + r0 * hd, (r1 - r0) * hd, buffer);
      float* out = wp + bh * g * n + r0;
      lethe::gemm_rows<float>(true, false, true, g, r1 - r0, hd, qp + bh * g * hd, hd, k, hd, out, n);
      if constexpr (half)
        for (int64_t i = 0; i < g; ++i) round_scaled<E>(out + i * n, r1 - r0, s);
    }
  });
  // A policy's bias on the scores (b, 1 or kv, 1, n), then libtorch's softmax:
  // vectorised exponentials, rows over the threads.
  if (bias != nullptr) {
    TORCH_CHECK(bias->dim() == 4 && bias->size(0) == b && (bias->size(1) == 1 || bias->size(1) == kv) &&
                    bias->size(2) == 1 && bias->size(3) == n && bias->scalar_type() == at::kFloat,
                "decode attention: a bias (b, 1 or kv, 1, n) in float32 for ", weights.sizes(), ", got ", bias->sizes());
    weights.add_(*bias);
  }
  weights = weights.softmax(-1);
  const at::Tensor weighing = half ? weights.to(kind).to(at::kFloat) : weights;
  const float* rp = weighing.data_ptr<float>();
  // The context: each chunk of values weighted into its own partial sum.
  at::Tensor partial = at::empty({b * kv * chunks, g, hd}, q.options());
  float* pp = partial.data_ptr<float>();
  at::parallel_for(0, b * kv * chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> buffer;
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t bh = c / chunks, r0 = (c % chunks) * rows, r1 = std::min(n, r0 + rows);
      const float* v = as_float(head_v(bh) + r0 * hd, (r1 - r0) * hd, buffer);
      lethe::gemm_rows<float>(true, false, false, g, hd, r1 - r0, rp + bh * g * n + r0, n, v, hd, pp + c * g * hd, hd);
    }
  });
  at::Tensor context = partial.view({b * kv, chunks, g, hd}).sum(1).view({b, kv, g, hd});
  return {half ? context.to(kind) : context, weights};
}

// Attention of the queries q (b, kv, g, hd) of one token over keys and values (b, kv, n,
// hd) whose rows are contiguous, in float32, bfloat16 or float16 alike: the weights softmax(q k^T
// scale) (b, kv, g, n) in float32 and the context (b, kv, g, hd). Keys and values are
// read once, in chunks of rows spread over the threads; each chunk's share of the
// context is summed in chunk order.
std::pair<at::Tensor, at::Tensor> attend(const at::Tensor& q_in, const at::Tensor& keys, const at::Tensor& values,
                                         const at::Tensor* bias, double scale) {
  TORCH_CHECK(q_in.dim() == 4 && keys.dim() == 4 && values.sizes() == keys.sizes() && q_in.size(0) == keys.size(0) &&
                  q_in.size(1) == keys.size(1) && q_in.size(3) == keys.size(3),
              "decode attention: queries (b, kv, g, hd) over keys and values (b, kv, n, hd), got ", q_in.sizes(), " and ",
              keys.sizes());
  TORCH_CHECK(keys.stride(3) == 1 && keys.stride(2) == keys.size(3) && values.stride(3) == 1 &&
                  values.stride(2) == values.size(3),
              "decode attention: each head's keys and values must be contiguous rows");
  const auto all = [&](at::ScalarType t) {
    return q_in.scalar_type() == t && keys.scalar_type() == t && values.scalar_type() == t;
  };
  TORCH_CHECK(keys.device().is_cpu() && (all(at::kFloat) || all(at::kBFloat16) || all(at::kHalf)),
              "decode attention: float32, bfloat16 or float16 on the CPU");
  if (all(at::kBFloat16)) return attend_held<uint16_t>(q_in, keys, values, bias, scale);
  if (all(at::kHalf)) return attend_held<at::Half>(q_in, keys, values, bias, scale);
  return attend_held<float>(q_in, keys, values, bias, scale);
}

// The sum of a float32 tensor's values, read as one stream per thread.
double read_sum(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(), "read probe: a float32 tensor on the CPU");
  const at::Tensor x = x_in.contiguous();
  const float* p = x.data_ptr<float>();
  const int64_t count = x.numel(), chunk = 1 << 16, chunks = (count + chunk - 1) / chunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t start = c * chunk, len = std::min(chunk, count - start);
      float acc[kLanes] = {0};
      int64_t j = 0;
      for (; j + kLanes <= len; j += kLanes)
        for (int64_t u = 0; u < kLanes; ++u) acc[u] += p[start + j + u];
      double s = 0;
      for (; j < len; ++j) s += p[start + j];
      for (int64_t u = 0; u < kLanes; ++u) s += acc[u];
      partial[static_cast<size_t>(c)] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

extern "C" {

// y = x w^T + bias (bias may be null), written to `out` as a new `at::Tensor*`.
int lethe_decode_linear(void* x, void* w, void* bias, void** out, char** error) {
  return lethe::guarded(error, [&] {
    const at::Tensor* b = static_cast<at::Tensor*>(bias);
    *out = new at::Tensor(gemv(*static_cast<at::Tensor*>(w), *static_cast<at::Tensor*>(x), b));
  });
}

// One token's attention over the cache, a bias (may be null) on its scores: writes the
// context and the weights to `out` (two new `at::Tensor*`).
int lethe_decode_attention(void* q, void* keys, void* values, void* bias, double scale, void** out, char** error) {
  return lethe::guarded(error, [&] {
    auto [context, weights] = attend(*static_cast<at::Tensor*>(q), *static_cast<at::Tensor*>(keys),
                                     *static_cast<at::Tensor*>(values), static_cast<at::Tensor*>(bias), scale);
    out[0] = new at::Tensor(context);
    out[1] = new at::Tensor(weights);
  });
}

// The sum of `x`'s values, read once, to `sum`.
int lethe_read_sum(void* x, double* sum, char** error) {
  return lethe::guarded(error, [&] { *sum = read_sum(*static_cast<at::Tensor*>(x)); });
}

}  // extern "C"
