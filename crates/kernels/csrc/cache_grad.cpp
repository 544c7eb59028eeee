// The gradient of the keys and values of a window `[cache, block]` with respect to its
// states, for the block's rows only (crates/model/src/cache_grad.rs wraps it).
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
#include <utility>
#include <vector>

#include "blas.h"
#include "guard.h"
#include "shares.h"
#include "lethe.h"

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

// The block's gradient `(b, m, d)` (`size`) from the gradients of the window's keys and
// values `(b, n, e)` and scores `(b, n)` (each may be undefined) and the projections'
// weights `wk`, `wv` `(e, d)` and `ws` `(d)`: the sum of what they pass back to its rows.
at::Tensor block_grad_of(const at::Tensor& gk_in, const at::Tensor& gv_in, const at::Tensor& gs_in, const at::Tensor& wk,
                         const at::Tensor& wv, const at::Tensor& ws, const std::vector<int64_t>& size) {
  // Under bfloat16 autocast the keys, values and scores (and their gradients) are in a
  // lower precision than the weights: the products run in the weights' (autograd casts
  // the block's gradient to the block's own).
  auto in_weights = [&](const at::Tensor& g) { return g.defined() ? g.to(wk.scalar_type()) : g; };
  const at::Tensor gk = in_weights(gk_in), gv = in_weights(gv_in), gs = in_weights(gs_in);
  const int64_t fresh = size[1];
  at::Tensor tk = gk.defined() ? tail_times(gk, wk, fresh) : at::Tensor();
  at::Tensor tv = gv.defined() ? tail_times(gv, wv, fresh) : at::Tensor();
  auto add = [](const at::Tensor& a, const at::Tensor& b) { return !a.defined() ? b : !b.defined() ? a : a + b; };
  // In the order libtorch's backward pass sums the three where the scores are computed
  // first (tests::it_computes_what_the_plain_projection_does; other orders round
  // differently).
  at::Tensor tail;
  const bool loop = tk.defined() && tv.defined() && gs.defined() && tk.device().is_cpu() &&
                    (tk.scalar_type() == at::kFloat || tk.scalar_type() == at::kDouble);
  if (loop) {
    tail = sum_tails(tk, tv, tail_of(gs, fresh), ws);
  } else {
    at::Tensor ts = gs.defined() ? tail_of(gs, fresh).outer(ws) : at::Tensor();
    tail = add(add(tk, tv), ts);
  }
  return tail.defined() ? tail.view(size) : at::Tensor();
}

// The block's gradient: the sum of what the keys, values and scores pass back to its rows.
at::Tensor block_grad(AutogradContext* ctx, const at::Tensor& gk, const at::Tensor& gv, const at::Tensor& gs) {
  const auto saved = ctx->get_saved_variables();
  return block_grad_of(gk, gv, gs, saved[0], saved[1], gs.defined() ? saved[2] : at::Tensor(),
                       ctx->saved_data["block"].toIntVector());
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

// ---------------------------------------------------------------------------------------
// The projection of a ragged window (`lethe_ragged_project`).
//
// With Expire-Span's per-stream deletion each stream's cache is right-aligned and padded
// on the left to the longest stream's (csrc/compact.cpp): a trained model at enwik8-tiny
// keeps 47-111 memories a stream in 111 slots, so a fifth of the rows that `states W^T`
// projects, forward and in the weights' gradient, are padding that no query may use.
// Here each stream's rows from its first valid one on are projected by their own BLAS
// products, the streams shared out over the threads by their rows; the padding's keys,
// values and scores are zero (its consumer, the ragged attention of csrc/expire_attend.cpp,
// starts each stream at its first usable key and reads none of them). The backward pass
// sums the weights' gradients over the same rows only, each thread its streams', the
// threads' sums added in their order (the same numbers for the same thread count):
// g_W = sum_b g[b, start_b:]^T states[b, start_b:], g_bias the column sums of those rows
// of g, g_w = sum_b states[b, start_b:]^T g_s[b, start_b:]. The block's gradient is
// block_grad_of's, as for the padded window.

// Each stream's first projected row (its first valid one; n where it has none) and the
// running total of the rows, for the shares.
struct Rows {
  int64_t b, n, d, e;
  std::vector<int64_t> start, offset;
  bool blas = true;  // the products through BLAS (else libtorch's mm)
  int64_t rows(int64_t s) const { return n - start[s]; }
};

// The rows of `states` (b, n, d) from each stream's `start` on, projected to `e` columns.
Rows rows_from(const at::Tensor& states, std::vector<int64_t> start, int64_t e, bool blas) {
  const int64_t b = states.size(0);
  Rows r{b, states.size(1), states.size(2), e, std::move(start), std::vector<int64_t>(b + 1, 0), blas};
  for (int64_t s = 0; s < b; ++s) r.offset[s + 1] = r.offset[s] + r.rows(s);
  return r;
}

// Each stream's first valid row of `valid` (b, n), n where it has none.
std::vector<int64_t> first_valid(const at::Tensor& valid) {
  const int64_t b = valid.size(0), n = valid.size(1);
  const at::Tensor v = valid.contiguous();
  const bool* pv = v.data_ptr<bool>();
  std::vector<int64_t> start(b, n);
  for (int64_t s = 0; s < b; ++s) {
    const bool* row = pv + s * n;
    start[s] = std::find(row, row + n, true) - row;
  }
  return start;
}

// The shapes, kinds and devices `lethe_ragged_project` takes.
void check_ragged(const at::Tensor& states, const at::Tensor& block, const at::Tensor& valid, const at::Tensor& wk,
                  const at::Tensor& bk, const at::Tensor& wv, const at::Tensor& bv, const at::Tensor& ws) {
  TORCH_CHECK(states.dim() == 3 && block.dim() == 3 && block.size(0) == states.size(0) && block.size(2) == states.size(2) &&
                  block.size(1) > 0 && block.size(1) <= states.size(1),
              "the states ", states.sizes(), " must be (b, n, d) ending with the block ", block.sizes());
  TORCH_CHECK(!states.requires_grad(), "the states must carry no gradient of their own (detach them): only the block gets one");
  TORCH_CHECK(valid.scalar_type() == at::kBool && valid.dim() == 2 && valid.size(0) == states.size(0) &&
                  valid.size(1) == states.size(1),
              "the validity ", valid.sizes(), " must be one bool per state ", states.sizes());
  TORCH_CHECK(wk.dim() == 2 && wk.size(1) == states.size(2) && wv.sizes() == wk.sizes() && ws.dim() == 1 &&
                  ws.size(0) == states.size(2),
              "the weights ", wk.sizes(), ", ", wv.sizes(), " and ", ws.sizes(), " must project states of ", states.size(2));
  for (const at::Tensor* bias : {&bk, &bv}) {
    TORCH_CHECK(bias->dim() == 1 && (bias->size(0) == wk.size(0) || bias->size(0) == 0), "a bias ", bias->sizes(),
                " must have one entry per output ", wk.size(0), " (or none)");
  }
  for (const at::Tensor* t : {&states, &block, &valid, &wk, &bk, &wv, &bv, &ws}) {
    TORCH_CHECK(t->device().is_cpu(), "the ragged projection runs on the CPU only");
  }
  for (const at::Tensor* t : {&block, &wk, &bk, &wv, &bv, &ws}) {
    TORCH_CHECK(t->scalar_type() == states.scalar_type(), "every tensor must be of the states' kind ", states.scalar_type());
  }
  TORCH_CHECK(states.scalar_type() == at::kFloat || states.scalar_type() == at::kDouble,
              "the ragged projection takes float or double, got ", states.scalar_type());
}

// Rows [start, n) of stream s: `out` (b, n, e) = states w^T + bias, zero before them.
template <typename T>
void project_stream(const Rows& r, int64_t s, const T* x, const T* w, const T* bias, T* out) {
  const int64_t start = r.start[s], rows = r.rows(s);
  T* o = out + s * r.n * r.e;
  std::fill(o, o + start * r.e, T(0));
  o += start * r.e;
  if (rows == 0) return;
  if (bias != nullptr) {
    for (int64_t i = 0; i < rows; ++i) std::copy(bias, bias + r.e, o + i * r.e);
  }
  lethe::gemm_rows<T>(r.blas, false, true, rows, r.e, r.d, x + (s * r.n + start) * r.d, r.d, w, r.d, o, r.e, bias != nullptr);
}

// Rows [start, n) of stream s: the scores `out` (b, n) = states ws, zero before them.
template <typename T>
void score_stream(const Rows& r, int64_t s, const T* x, const T* ws, T* out) {
  T* o = out + s * r.n;
  std::fill(o, o + r.start[s], T(0));
  if (r.rows(s) == 0) return;
  lethe::gemm_rows<T>(r.blas, false, false, r.rows(s), 1, r.d, x + (s * r.n + r.start[s]) * r.d, r.d, ws, 1, o + r.start[s], 1);
}

// The weights' gradients of one thread's streams [first, last), added into its partial
// sums: `gw` (e, d) += g^T states and `gb` (e) += the column sums of g over each stream's
// rows, for g the keys' or values' gradient (b, n, e).
template <typename T>
void weight_grads(const Rows& r, int64_t first, int64_t last, const T* x, const T* g, T* gw, T* gb) {
  for (int64_t s = first; s < last; ++s) {
    const int64_t rows = r.rows(s);
    if (rows == 0) continue;
    const T* gs = g + (s * r.n + r.start[s]) * r.e;
    lethe::gemm_rows<T>(r.blas, true, false, r.e, r.d, rows, gs, r.e, x + (s * r.n + r.start[s]) * r.d, r.d, gw, r.d, true);
    if (gb == nullptr) continue;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < r.e; ++c) gb[c] += gs[i * r.e + c];
    }
  }
}

// The score weight's gradient of streams [first, last), added into `gws` (d): g_s^T states.
template <typename T>
void score_weight_grad(const Rows& r, int64_t first, int64_t last, const T* x, const T* g, T* gws) {
  for (int64_t s = first; s < last; ++s) {
    if (r.rows(s) == 0) continue;
    const int64_t j0 = s * r.n + r.start[s];
    lethe::gemm_rows<T>(r.blas, true, false, 1, r.d, r.rows(s), g + j0, 1, x + j0 * r.d, r.d, gws, r.d, true);
  }
}

struct RaggedProjection : public torch::autograd::Function<RaggedProjection> {
  // `states` (b, n, d) without gradient whose last m rows were copied from `block`
  // (b, m, d), `valid` (b, n); weights `wk`, `wv` (e, d), biases `bk`, `bv` (e) or empty
  // (none), the score vector `ws` (d). Returns k, v (b, n, e) and s (b, n).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& states, const at::Tensor& block,
                               const at::Tensor& valid, const at::Tensor& wk, const at::Tensor& bk, const at::Tensor& wv,
                               const at::Tensor& bv, const at::Tensor& ws, bool blas) {
    check_ragged(states, block, valid, wk, bk, wv, bv, ws);
    const at::Tensor x = states.contiguous();
    const Rows rows = rows_from(x, first_valid(valid), wk.size(0), blas);
    auto k = at::empty({rows.b, rows.n, rows.e}, x.options()), v = at::empty_like(k);
    auto s = at::empty({rows.b, rows.n}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ragged_project", [&] {
      const at::Tensor wkc = wk.contiguous(), wvc = wv.contiguous(), wsc = ws.contiguous();
      const at::Tensor bkc = bk.contiguous(), bvc = bv.contiguous();
      const auto ptr = [](const at::Tensor& t) { return t.numel() > 0 ? t.data_ptr<scalar_t>() : nullptr; };
      const scalar_t* px = x.data_ptr<scalar_t>();
      lethe::each_share(rows.offset, [&](int64_t, int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          project_stream<scalar_t>(rows, b, px, ptr(wkc), ptr(bkc), k.data_ptr<scalar_t>());
          project_stream<scalar_t>(rows, b, px, ptr(wvc), ptr(bvc), v.data_ptr<scalar_t>());
          score_stream<scalar_t>(rows, b, px, ptr(wsc), s.data_ptr<scalar_t>());
        }
      });
    });
    ctx->save_for_backward({x, wk.detach(), wv.detach(), ws.detach()});
    ctx->saved_data["block"] = block.sizes().vec();
    ctx->saved_data["start"] = rows.start;
    ctx->saved_data["blas"] = blas;
    ctx->saved_data["bk"] = bk.numel() > 0;
    ctx->saved_data["bv"] = bv.numel() > 0;
    return {k, v, s};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &wk = saved[1], &wv = saved[2], &ws = saved[3];
    const Rows r = rows_from(x, ctx->saved_data["start"].toIntVector(), wk.size(0), ctx->saved_data["blas"].toBool());
    const bool biases[2] = {ctx->saved_data["bk"].toBool(), ctx->saved_data["bv"].toBool()};
    const at::Tensor gk = grads[0].defined() ? grads[0].contiguous() : grads[0];
    const at::Tensor gv = grads[1].defined() ? grads[1].contiguous() : grads[1];
    const at::Tensor gs = grads[2].defined() ? grads[2].contiguous() : grads[2];
    const int64_t shares = lethe::shares_of(r.offset);
    const auto opts = x.options();
    const bool need_k = gk.defined() && ctx->needs_input_grad(3), need_v = gv.defined() && ctx->needs_input_grad(5);
    const bool need_s = gs.defined() && ctx->needs_input_grad(7);
    at::Tensor pwk = need_k ? at::zeros({shares, r.e, r.d}, opts) : at::Tensor();
    at::Tensor pbk = need_k && biases[0] ? at::zeros({shares, r.e}, opts) : at::Tensor();
    at::Tensor pwv = need_v ? at::zeros({shares, r.e, r.d}, opts) : at::Tensor();
    at::Tensor pbv = need_v && biases[1] ? at::zeros({shares, r.e}, opts) : at::Tensor();
    at::Tensor pws = need_s ? at::zeros({shares, r.d}, opts) : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ragged_project_backward", [&] {
      const auto part = [](const at::Tensor& t, int64_t i) { return t.defined() ? t[i].data_ptr<scalar_t>() : nullptr; };
      const scalar_t* px = x.data_ptr<scalar_t>();
      lethe::each_share(r.offset, [&](int64_t t, int64_t first, int64_t last) {
        if (need_k) weight_grads<scalar_t>(r, first, last, px, gk.data_ptr<scalar_t>(), part(pwk, t), part(pbk, t));
        if (need_v) weight_grads<scalar_t>(r, first, last, px, gv.data_ptr<scalar_t>(), part(pwv, t), part(pbv, t));
        if (need_s) score_weight_grad<scalar_t>(r, first, last, px, gs.data_ptr<scalar_t>(), part(pws, t));
      });
    });
    // The threads' partial sums `(shares, ...)` added.
    const auto total = [](const at::Tensor& p) { return p.defined() ? p.sum(0) : at::Tensor(); };
    const at::Tensor gblock = ctx->needs_input_grad(1)
                                  ? block_grad_of(gk, gv, gs, wk, wv, gs.defined() ? ws : at::Tensor(),
                                                  ctx->saved_data["block"].toIntVector())
                                  : at::Tensor();
    return {at::Tensor(), gblock,     at::Tensor(), total(pwk), total(pbk), total(pwv),
            total(pbv),   total(pws), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `k` and `v` `(b, n, e)` unchanged, with the gradient of the projections
// `k = states W_k^T + b_k`, `v = states W_v^T + b_v` of their last `m` rows to `block`
// `(b, m, d)`, the tensor those rows of the states were copied from; with `s` `(b, n)`
// and `ws` `(d)` (else null), the scores `s = states ws` too. Writes the two (or three)
// new tensors to `out`.
int lethe_cache_tail_grad(const lethe_cache_tail_args* a, lethe_tensor* out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> at::Tensor { return x == nullptr ? at::Tensor() : *static_cast<at::Tensor*>(x); };
    auto result = a->s == nullptr
                      ? KeysValues::apply(t(a->k), t(a->v), t(a->block), t(a->wk), t(a->wv))
                      : KeysValuesScores::apply(t(a->k), t(a->v), t(a->s), t(a->block), t(a->wk), t(a->wv), t(a->ws));
    for (size_t i = 0; i < result.size(); ++i) out[i] = new at::Tensor(std::move(result[i]));
  });
}

// The keys, values and span scores of a ragged window (see RaggedProjection): `states`
// (b, n, d) without gradient whose last rows were copied from `block` (b, m, d), `valid`
// (b, n) bool, weights `wk`, `wv` (e, d), biases `bk`, `bv` (e) or null, the score vector
// `ws` (d); `blas` 0 takes libtorch's matrix products (the tests' way to run that path).
// Writes k, v (b, n, e) and s (b, n) to `out`.
int lethe_ragged_project(const lethe_ragged_project_args* a, lethe_tensor* out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> at::Tensor { return x == nullptr ? at::Tensor() : *static_cast<at::Tensor*>(x); };
    // No bias: an empty one (autograd takes no undefined input to a function it records).
    const auto bias = [&](void* x) { return x == nullptr ? at::empty({0}, t(a->states).options()) : t(x); };
    auto result = RaggedProjection::apply(t(a->states), t(a->block), t(a->valid), t(a->wk), bias(a->bk), t(a->wv),
                                          bias(a->bv), t(a->ws), a->blas != 0);
    for (size_t i = 0; i < result.size(); ++i) out[i] = new at::Tensor(std::move(result[i]));
  });
}

}  // extern "C"
