// Expire-Span's whole attention of a block on the CPU, stream by stream over each
// stream's own keys, with its gradient (`lethe_expire_attend`, wrapped by
// crates/model/src/memory/expire_fused.rs); its score rows are those of csrc/expire_rows.h.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include "expire_rows.h"

namespace {

// ---------------------------------------------------------------------------------------
// The whole attention of a block, stream by stream, over each stream's own keys
// (`lethe_expire_attend`).
//
// With per-stream deletion each stream's cache is right-aligned and padded on the left
// to the longest stream's (csrc/compact.cpp). The padding is masked in every row, yet a
// batched product over (b, h, m, n) computes it: a trained model at enwik8-tiny keeps
// 44-113 memories a stream in 113 slots. Here each stream's keys start at the first one
// any of its rows may use, and each stream is one task for one thread: per head the
// content scores q k^T over its keys (one BLAS product), then the rows as above (mask,
// positions, softmax, ramp lists), written as the attention weights w, then per head
// the context w v. Its scores stay in the thread's cache from the product to the rows
// to the next product instead of crossing memory as a (b, h, m, n) tensor three times.
// The backward pass goes stream by stream the same way: per head g_w = g v^T, the rows'
// softmax, position and span gradients as above, then g_q = g_s k, g_k = g_s^T q and
// g_v = w^T g (zero at the skipped keys).

// A (b, h, rows, cols) tensor's data and strides; its last stride is 1.
template <typename T>
struct Mats {
  T* data;
  int64_t sb, sh, sr;
  T* at(int64_t b, int64_t h) const { return data + b * sb + h * sh; }
};

template <typename T>
Mats<T> mats_of(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

// A tensor whose last stride is 1 (a view when it has one), for the BLAS products.
at::Tensor rows_of(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Where each stream's keys begin (its first key some row may use) and where its weights
// (h, m, keys) begin in the saved buffer.
struct Ragged {
  Dims dm;
  int64_t dh;
  std::vector<int64_t> start, offset;
  bool blas = true;  // the products through BLAS (else libtorch's mm)
  int64_t keys(int64_t s) const { return dm.n - start[s]; }
  // How many of the stream's last keys can be nearer than p to some query.
  int64_t near(int64_t s) const { return std::min(keys(s), dm.p - 1 + dm.m); }
  int64_t total() const { return offset.back(); }

  // `task(first, last)` for each share of the streams, shared out over libtorch's
  // threads by their weights' sizes (csrc/shares.h).
  template <typename F>
  void each_share(const F& task) const {
    lethe::each_share(offset, [&](int64_t, int64_t first, int64_t last) { task(first, last); });
  }
};

Ragged ragged_of(const Dims& dm, int64_t dh, const at::Tensor& usable) {
  Ragged rg{dm, dh, std::vector<int64_t>(dm.b), std::vector<int64_t>(dm.b + 1, 0)};
  const bool* u = usable.data_ptr<bool>();
  for (int64_t s = 0; s < dm.b; ++s) {
    // At least one key: a stream that may use none gives its rows what the padded
    // kernel gives a row that sees nothing.
    int64_t first = dm.n - 1;
    for (int64_t r = 0; r < dm.usable_rows; ++r) {
      const bool* row = u + (s * dm.usable_rows + r) * dm.n;
      first = std::min(first, static_cast<int64_t>(std::find(row, row + first, true) - row));
    }
    rg.start[s] = first;
    rg.offset[s + 1] = rg.offset[s] + dm.h * dm.m * rg.keys(s);
  }
  return rg;
}

template <typename T>
struct AttendForward {
  Mats<T> q, k, v;
  Forward<T> f;      // scores: unused; out: the weights, ragged
  Mats<T> context;   // (b, h, m, dh)
};

// Stream s of the forward pass; `scores` has room for h m n, `tally` n counts.
template <typename T>
void attend_stream(const Ragged& rg, const AttendForward<T>& a, int64_t s, T* scores, T* lm, int32_t* slot, StreamTally& tally) {
  const Dims& dm = rg.dm;
  const int64_t ns = rg.keys(s), j0 = rg.start[s], n = dm.n;
  T* w = a.f.out + rg.offset[s];  // (h, m, ns)
  for (int64_t h = 0; h < dm.h; ++h) {
    gemm_rows<T>(rg.blas, false, true, dm.m, ns, rg.dh, a.q.at(s, h), a.q.sr, a.k.at(s, h) + j0 * a.k.sr, a.k.sr,
                 scores + h * dm.m * ns, ns);
  }
  tally.counts.assign(static_cast<size_t>(ns), 0);
  for (int64_t i = 0; i < dm.m; ++i) {
    const int64_t row = s * dm.m + i;
    const MaskRow<T> x{a.f.spans + s * n + j0, a.f.counter + s * n + j0,
                       a.f.usable + (s * dm.usable_rows + (dm.usable_rows == 1 ? 0 : i)) * n + j0, static_cast<T>(i),
                       a.f.ramp, static_cast<int32_t>(dm.p)};
    RampList<T> ramp{a.f.ramp_key + row * n, a.f.slope + row * n, 0};
    const int32_t on_row = mask_row(x, ns, lm, slot, ramp, tally.counts.data(), a.f.lanes);
    a.f.ramp_count[row] = ramp.count;
    tally.weighted += static_cast<int64_t>(on_row) * i;
    key_by_slot(ns - rg.near(s), ns, slot, static_cast<int32_t>(dm.p), a.f.by_slot + row * dm.p, a.f.lanes);
    for (int64_t h = 0; h < dm.h; ++h) {
      const int64_t at = (h * dm.m + i) * ns;
      score_row(ns, scores + at, lm, slot, a.f.pq + ((s * dm.h + h) * dm.m + i) * dm.p, static_cast<int32_t>(dm.p), true,
                w + at, a.f.lanes);
    }
  }
  tally.flush(a.f.key_ramp + s * n + j0, a.f.query_weighted + s);
  for (int64_t h = 0; h < dm.h; ++h) {
    gemm_rows<T>(rg.blas, false, false, dm.m, rg.dh, ns, w + h * dm.m * ns, ns, a.v.at(s, h) + j0 * a.v.sr, a.v.sr,
                 a.context.at(s, h), a.context.sr);
  }
}

template <typename T>
void attend_forward(const Ragged& rg, const AttendForward<T>& a) {
  const Dims& dm = rg.dm;
  rg.each_share([&](int64_t first, int64_t last) {
    std::vector<T> scores(static_cast<size_t>(dm.h * dm.m * dm.n)), lm(dm.n);
    std::vector<int32_t> slot(dm.n);
    StreamTally tally{};
    for (int64_t s = first; s < last; ++s) attend_stream(rg, a, s, scores.data(), lm.data(), slot.data(), tally);
  });
}

template <typename T>
struct AttendBackward {
  Mats<T> q, k, v, g;     // g: the context's gradient
  Mats<T> gq, gk, gv;     // laid out as q, k and v
  const T *weights, *slope;
  const int32_t *by_slot, *ramp_key, *ramp_count;
  int lanes;
  T *gp, *ge;  // gp (b, h, m, p), ge (b, n) zeros
};

// Stream s of the backward pass; `gw` has room for h m n, `by_query` for n.
template <typename T>
void attend_stream_backward(const Ragged& rg, const AttendBackward<T>& a, int64_t s, T* gw, T* by_query) {
  const Dims& dm = rg.dm;
  const int64_t ns = rg.keys(s), j0 = rg.start[s], n = dm.n, dh = rg.dh;
  const T* w = a.weights + rg.offset[s];  // (h, m, ns)
  for (int64_t h = 0; h < dm.h; ++h) {
    gemm_rows<T>(rg.blas, false, true, dm.m, ns, dh, a.g.at(s, h), a.g.sr, a.v.at(s, h) + j0 * a.v.sr, a.v.sr,
                 gw + h * dm.m * ns, ns);
  }
  // Row by row as backward_row, the scores' gradient in place of the weights'.
  T* total = a.ge + s * n + j0;
  for (int64_t i = 0; i < dm.m; ++i) {
    const int64_t row = s * dm.m + i;
    const int32_t count = a.ramp_count[row];
    const int32_t* keys = a.ramp_key + row * n;
    std::fill(by_query, by_query + count, T(0));
    for (int64_t h = 0; h < dm.h; ++h) {
      T* gr = gw + (h * dm.m + i) * ns;
      softmax_backward_row(w + (h * dm.m + i) * ns, gr, gr, ns, a.lanes);
      positions_grad(dm.p, a.by_slot + row * dm.p, gr, a.gp + ((s * dm.h + h) * dm.m + i) * dm.p, a.lanes);
      add_at(count, keys, gr, by_query, a.lanes);
    }
    divide(count, by_query, a.slope + row * n, a.lanes);
    for (int32_t k = 0; k < count; ++k) total[keys[k]] += by_query[k];
  }
  for (int64_t h = 0; h < dm.h; ++h) {
    const T* gs = gw + h * dm.m * ns;
    T *gk = a.gk.at(s, h), *gv = a.gv.at(s, h);
    for (int64_t j = 0; j < j0; ++j) {
      std::fill(gk + j * a.gk.sr, gk + j * a.gk.sr + dh, T(0));
      std::fill(gv + j * a.gv.sr, gv + j * a.gv.sr + dh, T(0));
    }
    gemm_rows<T>(rg.blas, false, false, dm.m, dh, ns, gs, ns, a.k.at(s, h) + j0 * a.k.sr, a.k.sr, a.gq.at(s, h), a.gq.sr);
    gemm_rows<T>(rg.blas, true, false, ns, dh, dm.m, gs, ns, a.q.at(s, h), a.q.sr, gk + j0 * a.gk.sr, a.gk.sr);
    gemm_rows<T>(rg.blas, true, false, ns, dh, dm.m, w + h * dm.m * ns, ns, a.g.at(s, h), a.g.sr, gv + j0 * a.gv.sr, a.gv.sr);
  }
}

template <typename T>
void attend_backward(const Ragged& rg, const AttendBackward<T>& a) {
  const Dims& dm = rg.dm;
  rg.each_share([&](int64_t first, int64_t last) {
    std::vector<T> gw(static_cast<size_t>(dm.h * dm.m * dm.n)), by_query(dm.n);
    for (int64_t s = first; s < last; ++s) attend_stream_backward(rg, a, s, gw.data(), by_query.data());
  });
}

// Expire-Span's span loss over the ramp from the kernel's ramp figures:
// `loss_scale * mean_b(sum_k e_bk c_bk - D_b)` for spans `e` and ramp counts `c` (b, n)
// and the ramp's distance sums `D` (b), in double: the sum over the pairs on the ramp of
// their remaining spans, `r = e - dist` (crates/model/src/memory/expire.rs, `ramp_loss`), with
// `loss_scale` = alpha / (R M). Its gradient to `e_bk` is `loss_scale c_bk / b`.
double span_loss(const at::Tensor& spans, const at::Tensor& counts, const at::Tensor& ramp_dist, double loss_scale) {
  if (loss_scale == 0.0) return 0.0;
  const at::Tensor e = spans.to(at::kDouble), c = counts.to(at::kDouble);
  const int64_t b = e.size(0), n = e.size(1);
  const double *pe = e.data_ptr<double>(), *pc = c.data_ptr<double>(), *pd = ramp_dist.data_ptr<double>();
  double total = 0.0;
  for (int64_t s = 0; s < b; ++s) {
    double by_span = 0.0;
    for (int64_t k = 0; k < n; ++k) by_span += pe[s * n + k] * pc[s * n + k];
    total += by_span - pd[s];
  }
  return loss_scale * total / static_cast<double>(b);
}

struct ExpireAttend : public torch::autograd::Function<ExpireAttend> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               const at::Tensor& pq_in, const at::Tensor& spans_in, const at::Tensor& counter_in,
                               const at::Tensor& usable_in, double ramp, double loss_scale, int64_t width, bool blas) {
    const auto q = rows_of(q_in), k = rows_of(k_in), v = rows_of(v_in);
    const auto pq = pq_in.contiguous(), spans = spans_in.contiguous(), counter = counter_in.contiguous(),
               usable = usable_in.contiguous();
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                    q.size(3) == k.size(3),
                "expire attention: queries must be (b, h, m, dh), keys and values (b, h, n, dh), got ", q.sizes(), ", ",
                k.sizes(), " and ", v.sizes());
    TORCH_CHECK(q.scalar_type() == k.scalar_type() && v.scalar_type() == k.scalar_type(),
                "expire attention: queries, keys and values must share one floating kind");
    TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "expire attention: runs on the CPU");
    const Dims dm = check_against({q.size(0), q.size(1), q.size(2), k.size(2)}, q.scalar_type(), pq, spans, counter, usable);
    Ragged rg = ragged_of(dm, q.size(3), usable);
    rg.blas = blas;
    const int lanes = lanes_of(static_cast<int>(width));
    // The context (b, h, m, dh) as a view of (b, m, h, dh): merging the heads copies nothing.
    auto context = at::empty({dm.b, dm.m, dm.h, rg.dh}, q.options()).transpose(1, 2);
    auto weights = at::empty({rg.total()}, q.options());
    auto counts = at::empty({dm.b, dm.n}, spans.options());
    auto ramp_dist = at::empty({dm.b}, spans.options().dtype(at::kDouble));
    auto key_ramp = at::zeros({dm.b, dm.n}, spans.options().dtype(at::kInt));
    auto query_weighted = at::zeros({dm.b}, spans.options().dtype(at::kLong));
    auto by_slot = at::empty({dm.b, dm.m, dm.p}, q.options().dtype(at::kInt));
    auto slope = at::empty({dm.b, dm.m, dm.n}, q.options());
    auto ramp_key = at::empty({dm.b, dm.m, dm.n}, q.options().dtype(at::kInt));
    auto ramp_count = at::empty({dm.b, dm.m}, q.options().dtype(at::kInt));
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "expire_attend", [&] {
      const Forward<scalar_t> f{nullptr, pq.data_ptr<scalar_t>(), spans.data_ptr<scalar_t>(), counter.data_ptr<scalar_t>(),
                                usable.data_ptr<bool>(), static_cast<scalar_t>(ramp), lanes, true, weights.data_ptr<scalar_t>(),
                                slope.data_ptr<scalar_t>(), by_slot.data_ptr<int32_t>(), key_ramp.data_ptr<int32_t>(),
                                ramp_key.data_ptr<int32_t>(), ramp_count.data_ptr<int32_t>(), query_weighted.data_ptr<int64_t>()};
      attend_forward<scalar_t>(rg, {mats_of<scalar_t>(q), mats_of<scalar_t>(k), mats_of<scalar_t>(v), f, mats_of<scalar_t>(context)});
      ramp_totals<scalar_t>(dm, key_ramp.data_ptr<int32_t>(), query_weighted.data_ptr<int64_t>(), counter.data_ptr<scalar_t>(),
                            counts.data_ptr<scalar_t>(), ramp_dist.data_ptr<double>());
    });
    // Through a double: a loss beyond float's range becomes inf (the trainer's check of
    // the loss then names it), not a conversion error.
    const auto loss = at::scalar_tensor(span_loss(spans, counts, ramp_dist, loss_scale), spans.options().dtype(at::kDouble))
                          .to(spans.scalar_type());
    auto starts = at::tensor(rg.start, at::kLong);
    ctx->save_for_backward({q, k, v, weights, by_slot, slope, ramp_key, ramp_count, starts, counts});
    ctx->saved_data["p"] = dm.p;
    ctx->saved_data["lanes"] = static_cast<int64_t>(lanes);
    ctx->saved_data["blas"] = blas;
    ctx->saved_data["loss_scale"] = loss_scale;
    ctx->mark_non_differentiable({counts, ramp_dist});
    return {context, counts, ramp_dist, loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &weights = saved[3], &by_slot = saved[4], &slope = saved[5],
               &ramp_key = saved[6], &ramp_count = saved[7], &starts = saved[8], &counts = saved[9];
    const auto g = rows_of(grads[0]);
    const Dims dm{q.size(0), q.size(1), q.size(2), k.size(2), ctx->saved_data["p"].toInt(), 1};
    Ragged rg{dm, q.size(3), std::vector<int64_t>(starts.data_ptr<int64_t>(), starts.data_ptr<int64_t>() + dm.b),
              std::vector<int64_t>(dm.b + 1, 0)};
    for (int64_t s = 0; s < dm.b; ++s) rg.offset[s + 1] = rg.offset[s] + dm.h * dm.m * rg.keys(s);
    rg.blas = ctx->saved_data["blas"].toBool();
    // Each gradient laid out as its input (a head-split view of a (b, n, h dh) projection
    // stays one: its backward pass then copies nothing).
    auto gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
    auto gp = at::empty({dm.b, dm.h, dm.m, dm.p}, q.options());
    auto ge = at::zeros({dm.b, dm.n}, slope.options());
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "expire_attend_backward", [&] {
      const AttendBackward<scalar_t> a{mats_of<scalar_t>(q),  mats_of<scalar_t>(k),  mats_of<scalar_t>(v),
                                       mats_of<scalar_t>(g),  mats_of<scalar_t>(gq), mats_of<scalar_t>(gk),
                                       mats_of<scalar_t>(gv), weights.data_ptr<scalar_t>(), slope.data_ptr<scalar_t>(),
                                       by_slot.data_ptr<int32_t>(), ramp_key.data_ptr<int32_t>(), ramp_count.data_ptr<int32_t>(),
                                       static_cast<int>(ctx->saved_data["lanes"].toInt()), gp.data_ptr<scalar_t>(),
                                       ge.data_ptr<scalar_t>()};
      attend_backward<scalar_t>(rg, a);
    });
    // The span loss's: its scale over the streams per ramp pair, times the loss's gradient.
    const double loss_scale = ctx->saved_data["loss_scale"].toDouble();
    // (A factor beyond float's range gives inf, as libtorch's own product would, not an error.)
    if (grads[3].defined() && loss_scale != 0.0) {
      const double factor = grads[3].item<double>() * loss_scale / static_cast<double>(dm.b);
      ge.add_(counts * at::scalar_tensor(factor, counts.options().dtype(at::kDouble)));
    }
    return {gq, gk, gv, gp, ge, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {


// The whole attention of a block, stream by stream over each stream's own keys (see
// ExpireAttend): q (b, h, m, dh) divided by sqrt(dh) already, k and v (b, h, n, dh), the
// positions, spans, counter and usable keys as lethe_expire_scores takes them. Writes the
// context (b, h, m, dh), with gradient to q, k, v, the positions and the spans, and the
// ramp counts and distance sums, without, and the span loss with `loss_scale` = alpha /
// (R M) (see span_loss; zero when `loss_scale` is 0), with gradient to the spans. `blas`
// 0 takes libtorch's matrix products instead of the BLAS library's (tests).
int lethe_expire_attend(const lethe_expire_attend_args* a, lethe_tensor* out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    const lethe_expire_operands& o = a->ops;
    auto result = ExpireAttend::apply(t(a->q), t(a->k), t(a->v), t(o.pq), t(o.spans), t(o.counter), t(o.usable),
                                      o.ramp, a->loss_scale, static_cast<int64_t>(o.width), a->blas != 0);
    for (size_t i = 0; i < 4; ++i) out[i] = new at::Tensor(std::move(result[i]));
  });
}

// How many threads `at::parallel_for` spreads 64 items over (into `seen`), and
// libtorch's thread count (into `threads`): the two are equal only where this file is
// compiled with OpenMP, as libtorch is (crates/kernels/build.rs). Without it the kernel above runs on
// one thread.
void lethe_parallel_threads(int64_t* seen, int64_t* threads) {
  std::vector<int> used(static_cast<size_t>(at::get_num_threads()), 0);
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) { used[static_cast<size_t>(at::get_thread_num())] = 1; });
  *seen = std::count(used.begin(), used.end(), 1);
  *threads = at::get_num_threads();
}

}  // extern "C"
