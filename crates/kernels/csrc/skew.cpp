// The relative positions' skew as one autograd node (crates/model/src/skew.rs wraps it).
//
// Window attention lays the position scores `q·key_pe` out by distance with a skew
// (crates/model/src/attention.rs, `window_positions`): the scores of the `p` distances of
// every query row, flipped, padded with `m + 1` columns of `-inf`, viewed flat, cut,
// viewed again and narrowed to the `n` keys. The forward pass is views, but libtorch's
// backward pass of the two narrows fills a zero tensor of the whole padded size for
// each and copies the gradient in, and the pad's backward pass copies it out again:
// on `enwik8-tiny`'s Transformer-XL a tenth of the backward pass in a trace.
//
// Row i of the result holds, at key j, the flipped score of column
// `c = j + (p - 1 - cached) - i` when `0 <= c < p`, else `-inf`; each score lands in one
// place, so the backward pass is a copy too, column c of row i from key j, zero where j
// is outside the window. Both passes write each row once. Every value is copied, never
// summed, so the outputs and gradients are the skew's to the bit.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

#include "guard.h"
#include "lethe.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The window of row i: keys [j0, j1) read columns [j0 + shift, j1 + shift), where
// shift = off - i and off = p - 1 - cached.
struct Window {
  int64_t j0, j1, shift;
};

Window window_of(int64_t i, int64_t off, int64_t p, int64_t n) {
  const int64_t shift = off - i;
  const int64_t j0 = std::clamp<int64_t>(-shift, 0, n), j1 = std::clamp<int64_t>(p - shift, j0, n);
  return {j0, j1, shift};
}

struct Skew : public torch::autograd::Function<Skew> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& flipped_in, int64_t cached, int64_t n) {
    TORCH_CHECK(flipped_in.dim() == 4 && flipped_in.device().is_cpu(), "skew: the scores must be (b, h, m, p) on the CPU, got ",
                flipped_in.sizes());
    const at::Tensor flipped = flipped_in.contiguous();
    const int64_t b = flipped.size(0), h = flipped.size(1), m = flipped.size(2), p = flipped.size(3);
    TORCH_CHECK(cached >= 0 && cached < p && n == cached + m, "skew: ", cached, " cached keys and ", m, " queries make ",
                cached + m, " keys, not ", n, " (", p, " distances)");
    const int64_t off = p - 1 - cached;
    at::Tensor out = at::empty({b, h, m, n}, flipped.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, flipped.scalar_type(), "lethe_skew", [&] {
      const scalar_t* f = flipped.data_ptr<scalar_t>();
      scalar_t* y = out.data_ptr<scalar_t>();
      const scalar_t hidden = -std::numeric_limits<scalar_t>::infinity();
      at::parallel_for(0, b * h * m, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const Window w = window_of(r % m, off, p, n);
          scalar_t* row = y + r * n;
          std::fill(row, row + w.j0, hidden);
          std::copy(f + r * p + w.j0 + w.shift, f + r * p + w.j1 + w.shift, row + w.j0);
          std::fill(row + w.j1, row + n, hidden);
        }
      });
    });
    ctx->saved_data["p"] = p;
    ctx->saved_data["off"] = off;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor grad = grads[0].contiguous();
    const int64_t p = ctx->saved_data["p"].toInt(), off = ctx->saved_data["off"].toInt();
    const int64_t b = grad.size(0), h = grad.size(1), m = grad.size(2), n = grad.size(3);
    at::Tensor out = at::empty({b, h, m, p}, grad.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad.scalar_type(), "lethe_skew_backward", [&] {
      const scalar_t* g = grad.data_ptr<scalar_t>();
      scalar_t* y = out.data_ptr<scalar_t>();
      at::parallel_for(0, b * h * m, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const Window w = window_of(r % m, off, p, n);
          scalar_t* row = y + r * p;
          // Columns [j0 + shift, j1 + shift) come from keys [j0, j1); the rest is zero.
          std::fill(row, row + w.j0 + w.shift, scalar_t(0));
          std::copy(g + r * n + w.j0, g + r * n + w.j1, row + w.j0 + w.shift);
          std::fill(row + w.j1 + w.shift, row + p, scalar_t(0));
        }
      });
    });
    return {out, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// The skew of `flipped` (b, h, m, p) to `n = cached + m` keys, written to `out` as a new
// `at::Tensor*` (b, h, m, n).
int lethe_skew(void* flipped, int64_t cached, int64_t n, void** out, char** error) {
  return lethe::guarded(error, [&] {
    *out = new at::Tensor(Skew::apply(*static_cast<at::Tensor*>(flipped), cached, n));
  });
}

}  // extern "C"
