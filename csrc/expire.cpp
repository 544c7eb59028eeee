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
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "guard.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The shapes of one call, checked once.
struct Dims {
  int64_t b, h, m, n, p, usable_rows;
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

// The first pass, per stream, query and key: the mask clamped for its log (1 where the
// key is not seen), the index of the key's position row: `p`, a slot that holds 0,
// where it has none, `p + 1`, a slot that holds -inf, where it is not seen (log 0 would
// give the -inf too, but libtorch's log takes a slow path on zeros); and the ramp
// figures.
template <typename T>
void mask_pass(const Dims& dm, const at::Tensor& spans, const at::Tensor& counter, const at::Tensor& usable, T ramp,
               at::Tensor& clamped, at::Tensor& row, at::Tensor& slope, at::Tensor& counts, at::Tensor& ramp_dist) {
  const T floor = std::numeric_limits<T>::min();
  const T* sp = spans.data_ptr<T>();
  const T* ct = counter.data_ptr<T>();
  const bool* us = usable.data_ptr<bool>();
  T* cl = clamped.data_ptr<T>();
  int32_t* rw = row.data_ptr<int32_t>();
  T* sl = slope.data_ptr<T>();
  at::parallel_for(0, dm.b, 1, [&](int64_t b0, int64_t b1) {
    // Ramp pairs per key and per query, as integers: the distance sum below is exact
    // from them.
    std::vector<int32_t> key_ramp(dm.n);
    const int32_t p = static_cast<int32_t>(dm.p), n = static_cast<int32_t>(dm.n);
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(key_ramp.begin(), key_ramp.end(), 0);
      int64_t query_weighted = 0;  // sum over ramp pairs of the query's index
      const T* __restrict e = sp + b * dm.n;
      const T* __restrict c = ct + b * dm.n;
      int32_t* __restrict kr = key_ramp.data();
      for (int64_t i = 0; i < dm.m; ++i) {
        const bool* __restrict u = us + (b * dm.usable_rows + (dm.usable_rows == 1 ? 0 : i)) * dm.n;
        T* __restrict cli = cl + (b * dm.m + i) * dm.n;
        int32_t* __restrict rwi = rw + (b * dm.m + i) * dm.n;
        T* __restrict sli = sl + (b * dm.m + i) * dm.n;
        const T fi = static_cast<T>(i);
        int32_t on_row = 0;
        // Branch-free: whether a key is seen follows no pattern a predictor learns. The
        // same float operations, in the same order, as the written-out path's.
        for (int32_t j = 0; j < n; ++j) {
          const T d = c[j] + fi;
          const T pre = (e[j] - d) / ramp + T(1);
          const T mask = std::min(std::max(pre, T(0)), T(1));
          const bool vis = u[j] & (d >= T(0)) & (mask > T(0));
          const int32_t di = static_cast<int32_t>(d);
          cli[j] = vis ? std::max(mask, floor) : T(1);
          rwi[j] = vis ? (di < p ? di : p) : p + 1;
          // d ln max(m, floor) / d e = 1 / (m R) through clamp(r / R + 1, 0, 1), the
          // floor and the log, where the key is seen; kept as m R, 0 where none.
          sli[j] = vis & (pre <= T(1)) & (mask >= floor) ? mask * ramp : T(0);
          const int32_t ramp_pair = vis & (mask < T(1));
          kr[j] += ramp_pair;
          on_row += ramp_pair;
        }
        query_weighted += on_row * i;
      }
      T* cnt = counts.data_ptr<T>() + b * dm.n;
      double by_key = 0.0;
      for (int64_t j = 0; j < dm.n; ++j) {
        cnt[j] = static_cast<T>(key_ramp[j]);
        by_key += static_cast<double>(key_ramp[j]) * static_cast<double>(c[j]);
      }
      // Sum over ramp pairs of d = counter[j] + i, whole numbers: exact in double.
      ramp_dist.data_ptr<double>()[b] = by_key + static_cast<double>(query_weighted);
    }
  });
}

template <typename T>
void forward_kernel(const Dims& dm, const at::Tensor& scores, const at::Tensor& pq, const at::Tensor& spans,
                    const at::Tensor& counter, const at::Tensor& usable, double ramp, at::Tensor& out,
                    at::Tensor& counts, at::Tensor& ramp_dist, at::Tensor& row, at::Tensor& slope) {
  auto clamped = at::empty({dm.b, dm.m, dm.n}, scores.options());
  mask_pass<T>(dm, spans, counter, usable, static_cast<T>(ramp), clamped, row, slope, counts, ramp_dist);
  // The mask's log, shared by the heads: libtorch's vectorised log.
  clamped.log_();
  const T* lm = clamped.data_ptr<T>();
  const int32_t* rw = row.data_ptr<int32_t>();
  const T* sc = scores.data_ptr<T>();
  const T* pos = pq.data_ptr<T>();
  T* o = out.data_ptr<T>();
  // Rows (b, h, i): the position is added to the mask's log first, then to the score,
  // as the written-out path adds its bias; a key without a position reads the zero slot,
// a hidden one the -inf slot.
  at::parallel_for(0, dm.b * dm.h * dm.m, 16, [&](int64_t r0, int64_t r1) {
    std::vector<T> positions(dm.p + 2, T(0));
    positions[dm.p + 1] = -std::numeric_limits<T>::infinity();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (dm.h * dm.m), i = r % dm.m;
      const int64_t mask_row = (b * dm.m + i) * dm.n;
      std::copy(pos + r * dm.p, pos + (r + 1) * dm.p, positions.begin());
      const T* s = sc + r * dm.n;
      const T* l = lm + mask_row;
      const int32_t* w = rw + mask_row;
      T* y = o + r * dm.n;
      for (int64_t j = 0; j < dm.n; ++j) y[j] = s[j] + (positions[w[j]] + l[j]);
    }
  });
}

template <typename T>
void backward_kernel(const Dims& dm, const at::Tensor& grad, const at::Tensor& row, const at::Tensor& slope,
                     at::Tensor& grad_pq, at::Tensor& grad_spans) {
  const T* g = grad.data_ptr<T>();
  const int32_t* rw = row.data_ptr<int32_t>();
  const T* sl = slope.data_ptr<T>();
  T* gp = grad_pq.data_ptr<T>();
  T* ge = grad_spans.data_ptr<T>();
  // Streams in parallel: a stream's span gradient sums over its queries and heads.
  at::parallel_for(0, dm.b, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> by_mask(dm.n);  // sum over heads of the gradient
    const int32_t p = static_cast<int32_t>(dm.p);
    for (int64_t b = b0; b < b1; ++b) {
      T* __restrict geb = ge + b * dm.n;
      for (int64_t i = 0; i < dm.m; ++i) {
        const int32_t* __restrict w = rw + (b * dm.m + i) * dm.n;
        const T* __restrict s = sl + (b * dm.m + i) * dm.n;
        T* __restrict bm = by_mask.data();
        std::fill(by_mask.begin(), by_mask.end(), T(0));
        for (int64_t h = 0; h < dm.h; ++h) {
          const int64_t r = (b * dm.h + h) * dm.m + i;
          const T* __restrict gr = g + r * dm.n;
          T* __restrict gpr = gp + r * dm.p;
          std::fill(gpr, gpr + dm.p, T(0));
          // Keys seen at a distance below p, each at its own distance: the scatter of
          // the positions' gather. (Hidden keys have a zero gradient: the softmax gives
          // them none.)
          for (int64_t j = 0; j < dm.n; ++j) {
            if (w[j] < p) gpr[w[j]] += gr[j];
          }
          for (int64_t j = 0; j < dm.n; ++j) bm[j] += gr[j];
        }
        for (int64_t j = 0; j < dm.n; ++j) geb[j] += s[j] > T(0) ? bm[j] / s[j] : T(0);
      }
    }
  });
}

struct ExpireScores : public torch::autograd::Function<ExpireScores> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores_in, const at::Tensor& pq_in,
                               const at::Tensor& spans_in, const at::Tensor& counter_in, const at::Tensor& usable_in,
                               double ramp) {
    const auto scores = scores_in.contiguous(), pq = pq_in.contiguous(), spans = spans_in.contiguous(),
               counter = counter_in.contiguous(), usable = usable_in.contiguous();
    const Dims dm = check(scores, pq, spans, counter, usable);
    auto out = at::empty_like(scores);
    auto counts = at::zeros({dm.b, dm.n}, spans.options());
    auto ramp_dist = at::zeros({dm.b}, spans.options().dtype(at::kDouble));
    // For the backward pass, per (b, i, j): the key's position row, and m R (0: none).
    auto row = at::empty({dm.b, dm.m, dm.n}, scores.options().dtype(at::kInt));
    auto slope = at::empty({dm.b, dm.m, dm.n}, scores.options());
    AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "expire_scores", [&] {
      forward_kernel<scalar_t>(dm, scores, pq, spans, counter, usable, ramp, out, counts, ramp_dist, row, slope);
    });
    ctx->save_for_backward({row, slope});
    ctx->saved_data["p"] = dm.p;
    ctx->saved_data["h"] = dm.h;
    ctx->mark_non_differentiable({counts, ramp_dist});
    return {out, counts, ramp_dist};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &row = saved[0], &slope = saved[1];
    const auto grad = grads[0].contiguous();
    const int64_t p = ctx->saved_data["p"].toInt(), h = ctx->saved_data["h"].toInt();
    const Dims dm{row.size(0), h, row.size(1), row.size(2), p, 1};
    auto grad_pq = at::empty({dm.b, dm.h, dm.m, dm.p}, grad.options());
    auto grad_spans = at::zeros({dm.b, dm.n}, grad.options());
      AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "expire_scores_backward", [&] {
      backward_kernel<scalar_t>(dm, grad, row, slope, grad_pq, grad_spans);
    });
    return {grad, grad_pq, grad_spans, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// The fused scores (see the top of this file). Writes three new tensors to `out`:
// the scores (b, h, m, n), with gradient; the ramp counts (b, n) and the ramp's
// distance sum per stream (b, double), without.
int lethe_expire_scores(void* scores, void* pq, void* spans, void* counter, void* usable, double ramp, void** out,
                        char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    auto result = ExpireScores::apply(t(scores), t(pq), t(spans), t(counter), t(usable), ramp);
    for (size_t k = 0; k < 3; ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}

}  // extern "C"
