// The gradient of the keys and values of a window `[cache, block]` with respect to its
// states, for the block's rows only (src/model/cache_grad.rs wraps it).
//
// Every memory mechanism projects the states it attends over, `(b, n, d)` = the cache of
// earlier blocks (no gradient: it was detached when it was stored) followed by the
// block's `m` new ones, into keys and values. libtorch's backward pass of that
// projection multiplies the gradient of all `n` rows by the weight, although only the
// last `m` rows reach anything: the cache's rows are thrown away by the concatenation's
// backward pass. At `enwik8-tiny` (a cache of 128 before a block of 64) two thirds of
// those two products are wasted; at a span of 16k nearly all.
//
// So the keys and values are projected from the states joined from the detached cache
// and a detached copy of the block (libtorch's own backward pass then computes only the
// weights' and biases' gradients, exactly as before), and this identity function on
// `(k, v)` hands the block itself `(b, m, d)` the gradient `gk[tail] W_k + gv[tail] W_v`:
// the rows the full products would give (a product's rows do not depend on the other
// rows), summed as libtorch sums the states' two gradients; nothing is computed for the
// cache's rows and no concatenation's backward pass cuts them away. Expire-Span's span
// predictor reads the states too (`s = states w`): its gradient `gs[tail] w^T` is added in
// the same function, last, as libtorch added it, so that training gives the same bits as
// before.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <torch/csrc/autograd/custom_function.h>

#include "guard.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `grad` `(b, n, e)` of a projection's output, rows `[n - fresh, n)` of every stream,
// times the projection's weight `(e, d)`: `(b * fresh, d)`.
at::Tensor tail_times(const at::Tensor& grad, const at::Tensor& weight, int64_t fresh) {
  const int64_t n = grad.size(1);
  return grad.narrow(1, n - fresh, fresh).reshape({-1, grad.size(2)}).mm(weight);
}

// `grad` `(b, n)` of `states w`, rows `[n - fresh, n)`: `(b * fresh)`.
at::Tensor tail_of(const at::Tensor& grad, int64_t fresh) {
  const int64_t n = grad.size(1);
  return grad.narrow(1, n - fresh, fresh).reshape({-1});
}

// `(tk + tv) + gs w^T` `(r, d)` of `tk` and `tv` `(r, d)`, `gs` `(r)` and `w` `(d)` in one
// pass, row by row, on the CPU (other devices take libtorch's three operations): what
// `tk + tv + gs.outer(w)` gives, bit for bit (each product and sum rounded on its own:
// csrc is compiled without contracting them into an FMA), without writing the outer
// product out and reading it back.
template <typename T>
void sum_tails_rows(const T* tk, const T* tv, const T* gs, const T* w, T* out, int64_t r0, int64_t r1, int64_t d) {
  for (int64_t r = r0; r < r1; ++r) {
    const T g = gs[r];
    const T* a = tk + r * d;
    const T* b = tv + r * d;
    T* o = out + r * d;
    for (int64_t c = 0; c < d; ++c) o[c] = (a[c] + b[c]) + g * w[c];
  }
}

at::Tensor sum_tails(const at::Tensor& tk, const at::Tensor& tv, const at::Tensor& gs, const at::Tensor& w) {
  const at::Tensor a = tk.contiguous(), b = tv.contiguous(), g = gs.contiguous(), ws = w.contiguous();
  auto out = at::empty_like(a);
  const int64_t rows = a.size(0), d = a.size(1);
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "sum_tails", [&] {
    const scalar_t *pa = a.data_ptr<scalar_t>(), *pb = b.data_ptr<scalar_t>(), *pg = g.data_ptr<scalar_t>(), *pw = ws.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(d, 1));
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) { sum_tails_rows(pa, pb, pg, pw, po, r0, r1, d); });
  });
  return out;
}

// Checks the shapes and saves what the backward pass needs; `ws` `(d)` may be undefined
// (no third projection). `block` `(b, m, d)` is what the last `m` rows of the states
// were copied from: the gradient's receiver.
void save(AutogradContext* ctx, const at::Tensor& k, const at::Tensor& v, const at::Tensor& block, const at::Tensor& wk,
          const at::Tensor& wv, const at::Tensor& ws) {
  TORCH_CHECK(block.dim() == 3 && k.dim() == 3 && v.dim() == 3, "the block, keys and values must be (b, n, d), got ",
              block.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.size(0) == block.size(0) && block.size(1) > 0 && block.size(1) <= k.size(1) && v.sizes() == k.sizes(),
              "keys ", k.sizes(), " and values ", v.sizes(), " must be one per state of a window ending with the block ",
              block.sizes());
  TORCH_CHECK(wk.dim() == 2 && wk.size(0) == k.size(2) && wk.size(1) == block.size(2) && wv.sizes() == wk.sizes(),
              "the weights ", wk.sizes(), " and ", wv.sizes(), " must map the block ", block.sizes(), " to the keys ", k.sizes());
  ctx->save_for_backward(ws.defined() ? variable_list{wk.detach(), wv.detach(), ws.detach()} : variable_list{wk.detach(), wv.detach()});
  ctx->saved_data["block"] = block.sizes().vec();
}

// The block's gradient: the sum of what the keys, values and scores pass back to its rows.
at::Tensor block_grad(AutogradContext* ctx, const at::Tensor& gk, const at::Tensor& gv, const at::Tensor& gs) {
  const auto saved = ctx->get_saved_variables();
  const auto size = ctx->saved_data["block"].toIntVector();
  const int64_t fresh = size[1];
  at::Tensor tk = gk.defined() ? tail_times(gk, saved[0], fresh) : at::Tensor();
  at::Tensor tv = gv.defined() ? tail_times(gv, saved[1], fresh) : at::Tensor();
  auto add = [](const at::Tensor& a, const at::Tensor& b) { return !a.defined() ? b : !b.defined() ? a : a + b; };
  // In the order libtorch's backward pass sums the three where the scores are computed
  // first (tests::it_computes_what_the_plain_projection_does; other orders round
  // differently).
  at::Tensor tail;
  const bool loop = tk.defined() && tv.defined() && gs.defined() && tk.device().is_cpu() &&
                    (tk.scalar_type() == at::kFloat || tk.scalar_type() == at::kDouble);
  if (loop) {
    tail = sum_tails(tk, tv, tail_of(gs, fresh), saved[2]);
  } else {
    at::Tensor ts = gs.defined() ? tail_of(gs, fresh).outer(saved[2]) : at::Tensor();
    tail = add(add(tk, tv), ts);
  }
  return tail.defined() ? tail.view(size) : at::Tensor();
}

// Keys and values.
struct KeysValues : public torch::autograd::Function<KeysValues> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& k, const at::Tensor& v, const at::Tensor& block,
                               const at::Tensor& wk, const at::Tensor& wv) {
    save(ctx, k, v, block, wk, wv, at::Tensor());
    return {k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], grads[1], block_grad(ctx, grads[0], grads[1], at::Tensor()), at::Tensor(), at::Tensor()};
  }
};

// Keys, values and the scores `s = states ws` `(b, n)` of a vector `ws` `(d)`.
struct KeysValuesScores : public torch::autograd::Function<KeysValuesScores> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& k, const at::Tensor& v, const at::Tensor& s,
                               const at::Tensor& block, const at::Tensor& wk, const at::Tensor& wv, const at::Tensor& ws) {
    TORCH_CHECK(s.dim() == 2 && s.size(0) == k.size(0) && s.size(1) == k.size(1) && ws.dim() == 1 && ws.size(0) == block.size(2),
                "the scores ", s.sizes(), " of the weight ", ws.sizes(), " must be one per state of a window of ", block.sizes());
    save(ctx, k, v, block, wk, wv, ws);
    return {k, v, s};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], grads[1], grads[2], block_grad(ctx, grads[0], grads[1], grads[2]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `k` and `v` `(b, n, e)` unchanged, with the gradient of the projections
// `k = states W_k^T + b_k`, `v = states W_v^T + b_v` of their last `m` rows to `block`
// `(b, m, d)`, the tensor those rows of the states were copied from; with `s` `(b, n)`
// and `ws` `(d)` (else null), the scores `s = states ws` too. Writes the two (or three)
// new tensors to `out`.
int lethe_cache_tail_grad(void* k, void* v, void* s, void* block, void* wk, void* wv, void* ws, void** out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> at::Tensor { return x == nullptr ? at::Tensor() : *static_cast<at::Tensor*>(x); };
    auto result = s == nullptr ? KeysValues::apply(t(k), t(v), t(block), t(wk), t(wv))
                               : KeysValuesScores::apply(t(k), t(v), t(s), t(block), t(wk), t(wv), t(ws));
    for (size_t i = 0; i < result.size(); ++i) out[i] = new at::Tensor(std::move(result[i]));
  });
}

}  // extern "C"
