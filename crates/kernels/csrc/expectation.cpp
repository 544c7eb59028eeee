// The ∞-former's attention densities against its basis, r = E[ψ(t)], as one autograd node
// (crates/model/src/memory/infinity/signal.rs, `Basis::expectation`, wraps it).
//
// A query's density N(t; μ, σ²) against the basis functions ψ_j(t) = N(t; c_j, w_j²) gives,
// in closed form (∞-former Eq. 11),
//
//   r_j = N(μ; c_j, s_j) = exp(-d_j² / (2 s_j)) / sqrt(2π s_j),  d_j = μ - c_j,  s_j = σ² + w_j².
//
// Written with tensors, that is some ten passes over the (b, h, m, N) scores forward, and
// the backward pass of each (a division's alone is three): on `enwik8-tiny`'s ∞-former a
// fifth of the step in a trace. Here each pass writes each row once. The gradients
// reduce over the basis,
//
//   ∂L/∂μ = Σ_j g_j r_j (-d_j / s_j),   ∂L/∂σ² = Σ_j g_j r_j (d_j² - s_j) / (2 s_j²),
//
// from the saved output r (no exponential again), summed in double precision. The
// centres and widths are constants: they get no gradient.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "guard.h"
#include "lethe.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kInvSqrt2Pi = 0.398942280401432677939946059934;

// Rows of the densities handed to one thread at a time.
constexpr int64_t kGrain = 64;

struct Expectation : public torch::autograd::Function<Expectation> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& mu_in, const at::Tensor& var_in,
                            const at::Tensor& centres_in, const at::Tensor& widths2_in) {
    TORCH_CHECK(mu_in.device().is_cpu() && var_in.device().is_cpu(), "expectation: the densities must be on the CPU");
    TORCH_CHECK(mu_in.sizes() == var_in.sizes(), "expectation: means ", mu_in.sizes(), " and variances ",
                var_in.sizes(), " differ in shape");
    TORCH_CHECK(mu_in.scalar_type() == var_in.scalar_type(), "expectation: means and variances differ in kind");
    TORCH_CHECK(centres_in.dim() == 1 && centres_in.sizes() == widths2_in.sizes(), "expectation: centres ",
                centres_in.sizes(), " and squared widths ", widths2_in.sizes(), " must be one (N) each");
    const at::Tensor mu = mu_in.contiguous(), var = var_in.contiguous();
    const at::Tensor centres = centres_in.to(at::kCPU, mu.scalar_type()).contiguous();
    const at::Tensor widths2 = widths2_in.to(at::kCPU, mu.scalar_type()).contiguous();
    const int64_t rows = mu.numel(), n = centres.size(0);
    std::vector<int64_t> sizes = mu.sizes().vec();
    sizes.push_back(n);
    at::Tensor out = at::empty(sizes, mu.options());
    AT_DISPATCH_FLOATING_TYPES(mu.scalar_type(), "lethe_expectation", [&] {
      const scalar_t *m = mu.data_ptr<scalar_t>(), *v = var.data_ptr<scalar_t>();
      const scalar_t *c = centres.data_ptr<scalar_t>(), *w2 = widths2.data_ptr<scalar_t>();
      scalar_t* r = out.data_ptr<scalar_t>();
      at::parallel_for(0, rows, kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          scalar_t* row = r + i * n;
          for (int64_t j = 0; j < n; ++j) {
            const scalar_t s = v[i] + w2[j], d = m[i] - c[j];
            row[j] = std::exp(-d * d / (s * scalar_t(2))) * scalar_t(kInvSqrt2Pi) / std::sqrt(s);
          }
        }
      });
    });
    ctx->save_for_backward({mu, var, centres, widths2, out});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &mu = saved[0], &var = saved[1], &centres = saved[2], &widths2 = saved[3], &out = saved[4];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t rows = mu.numel(), n = centres.size(0);
    at::Tensor grad_mu = at::empty_like(mu), grad_var = at::empty_like(var);
    AT_DISPATCH_FLOATING_TYPES(mu.scalar_type(), "lethe_expectation_backward", [&] {
      const scalar_t *m = mu.data_ptr<scalar_t>(), *v = var.data_ptr<scalar_t>();
      const scalar_t *c = centres.data_ptr<scalar_t>(), *w2 = widths2.data_ptr<scalar_t>();
      const scalar_t *r = out.data_ptr<scalar_t>(), *g = grad.data_ptr<scalar_t>();
      scalar_t *gm = grad_mu.data_ptr<scalar_t>(), *gv = grad_var.data_ptr<scalar_t>();
      at::parallel_for(0, rows, kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          double sum_mu = 0, sum_var = 0;
          for (int64_t j = 0; j < n; ++j) {
            const scalar_t s = v[i] + w2[j], d = m[i] - c[j];
            const scalar_t gr = g[i * n + j] * r[i * n + j], inv = scalar_t(1) / s;
            sum_mu -= gr * d * inv;
            sum_var += gr * (d * d - s) * (inv * inv * scalar_t(0.5));
          }
          gm[i] = scalar_t(sum_mu);
          gv[i] = scalar_t(sum_var);
        }
      });
    });
    return {grad_mu, grad_var, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// r = N(mu; centres, var + widths2) for densities `mu`, `var` (...) on the CPU against the
// basis `centres`, `widths2` (N), written to `out` as a new `at::Tensor*` (..., N).
int lethe_expectation(void* mu, void* var, void* centres, void* widths2, void** out, char** error) {
  return lethe::guarded(error, [&] {
    *out = new at::Tensor(Expectation::apply(*static_cast<at::Tensor*>(mu), *static_cast<at::Tensor*>(var),
                                             *static_cast<at::Tensor*>(centres), *static_cast<at::Tensor*>(widths2)));
  });
}

}  // extern "C"
