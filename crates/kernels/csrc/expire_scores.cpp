// Expire-Span's attention scores in one pass on the CPU, with their gradient: the soft
// mask of Eq. 5, the renormalised post-softmax mask of Eq. 4 as the additive bias ln m,
// the relative positions (A.1) and the span loss's ramp counts (4.2), fused into one
// custom autograd function that crates/model/src/memory/expire_fused.rs wraps; the rows it is
// computed by, and what they compute, are in csrc/expire_rows.h.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include "expire_rows.h"

namespace {

struct ExpireScores : public torch::autograd::Function<ExpireScores> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores_in, const at::Tensor& pq_in,
                               const at::Tensor& spans_in, const at::Tensor& counter_in, const at::Tensor& usable_in,
                               double ramp, int64_t width, bool softmax) {
    const auto scores = scores_in.contiguous(), pq = pq_in.contiguous(), spans = spans_in.contiguous(),
               counter = counter_in.contiguous(), usable = usable_in.contiguous();
    const Dims dm = check(scores, pq, spans, counter, usable);
    const int lanes = lanes_of(static_cast<int>(width));
    auto out = at::empty_like(scores);
    auto counts = at::empty({dm.b, dm.n}, spans.options());
    auto ramp_dist = at::empty({dm.b}, spans.options().dtype(at::kDouble));
    auto key_ramp = at::zeros({dm.b, dm.n}, spans.options().dtype(at::kInt));
    auto query_weighted = at::zeros({dm.b}, spans.options().dtype(at::kLong));
    // For the backward pass: the key at each distance below P (b, m, P), and each row's
    // ramp list: its keys and their m R (b, m, n; the first `count` of each row), and
    // its count (b, m).
    auto by_slot = at::empty({dm.b, dm.m, dm.p}, scores.options().dtype(at::kInt));
    auto slope = at::empty({dm.b, dm.m, dm.n}, scores.options());
    auto ramp_key = at::empty({dm.b, dm.m, dm.n}, scores.options().dtype(at::kInt));
    auto ramp_count = at::empty({dm.b, dm.m}, scores.options().dtype(at::kInt));
    AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "expire_scores", [&] {
      const Forward<scalar_t> f{scores.data_ptr<scalar_t>(), pq.data_ptr<scalar_t>(), spans.data_ptr<scalar_t>(),
                                counter.data_ptr<scalar_t>(), usable.data_ptr<bool>(), static_cast<scalar_t>(ramp),
                                lanes, softmax, out.data_ptr<scalar_t>(), slope.data_ptr<scalar_t>(), by_slot.data_ptr<int32_t>(),
                                key_ramp.data_ptr<int32_t>(), ramp_key.data_ptr<int32_t>(), ramp_count.data_ptr<int32_t>(),
                                query_weighted.data_ptr<int64_t>()};
      forward_kernel<scalar_t>(dm, f);
      ramp_totals<scalar_t>(dm, key_ramp.data_ptr<int32_t>(), query_weighted.data_ptr<int64_t>(),
                            counter.data_ptr<scalar_t>(), counts.data_ptr<scalar_t>(), ramp_dist.data_ptr<double>());
    });
    // With the softmax, its output too (its gradient is computed from it).
    variable_list saved{by_slot, slope, ramp_key, ramp_count};
    if (softmax) saved.push_back(out);
    ctx->save_for_backward(saved);
    ctx->saved_data["p"] = dm.p;
    ctx->saved_data["h"] = dm.h;
    ctx->saved_data["lanes"] = static_cast<int64_t>(lanes);
    ctx->mark_non_differentiable({counts, ramp_dist});
    return {out, counts, ramp_dist};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &by_slot = saved[0], &slope = saved[1];
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
                                 slope.data_ptr<scalar_t>(), by_slot.data_ptr<int32_t>(), ramp_key.data_ptr<int32_t>(),
                                 ramp_count.data_ptr<int32_t>(), static_cast<int>(ctx->saved_data["lanes"].toInt()),
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
// without. `width` is the widest vector loops to run: 0 the plain ones, 8 AVX2, 16
// AVX-512 (each only where the CPU has it; narrower ones otherwise).
int lethe_expire_scores(lethe_tensor scores, const lethe_expire_operands* o, int softmax, lethe_tensor* out,
                        char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    auto result = ExpireScores::apply(t(scores), t(o->pq), t(o->spans), t(o->counter), t(o->usable), o->ramp,
                                      static_cast<int64_t>(o->width), softmax != 0);
    for (size_t k = 0; k < 3; ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}
}  // extern "C"
