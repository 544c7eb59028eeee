// The optimiser's update of every parameter in one call (crates/core/src/optim.rs): Adam (Kingma &
// Ba 2015, Algorithm 1, with decoupled weight decay) or RMSProp, element by element.
//
// crates/core/src/optim.rs writes the same update as a dozen libtorch operations per parameter
// (multiply, add, square, square root, divide...), each a pass over the tensor and a
// new temporary; at `enwik8-tiny` (30 tensors, 0.46 M parameters) that was 2.3 ms of a
// 29 ms step. Here it is two passes and libtorch's square root: each element goes
// through the same operations, in the same order, with the same constants rounded to
// the tensor's type as libtorch rounds a double scalar, so the parameters and moments
// come out bitwise the same (tests in crates/core/src/optim.rs compare the two). libtorch's own fused Adam (`at::_fused_adam_`)
// rounds differently (it moves the first moment with `lerp` and divides by the step
// size in another order), which would change every figure lethe has published.
//
// Each operation rounds on its own: a multiply and an add are never fused into one
// rounding, which is what libtorch's element-wise kernels do (an add with alpha 1 is
// exact through their fused multiply-add).
#include <ATen/ATen.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "guard.h"
#include "lethe.h"

// For this file's own functions only (after the headers): no product and sum fused.
#pragma GCC optimize("fp-contract=off")

namespace {

// The constants of one update, as crates/core/src/optim.rs computes them in double precision.
struct Constants {
  double beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps;
  bool rmsprop, decay;
};

// Per parameter: Adam's step size `lr / bc1` (RMSProp: `lr`) and the decay factor
// `1 - lr wd`.
struct Rates {
  double step, decay;
};

// The moments on elements [i0, i1): `m = m beta1 + g (1 - beta1)` (Adam only) and
// `v = v beta2 + g^2 (1 - beta2)`, each product and sum rounded on its own, with the
// constants rounded to `T` first, as libtorch's `mul_`, `add_` and `square` do.
template <typename T>
void moments_range(const T* g, T* m, T* v, int64_t i0, int64_t i1, const Constants& c) {
  const T b1 = static_cast<T>(c.beta1), ob1 = static_cast<T>(c.one_minus_beta1), b2 = static_cast<T>(c.beta2),
          ob2 = static_cast<T>(c.one_minus_beta2);
  for (int64_t i = i0; i < i1; ++i) {
    const T gi = g[i];
    if (!c.rmsprop) {
      const T mi = m[i] * b1;
      m[i] = mi + gi * ob1;
    }
    const T vi = v[i] * b2;
    const T sq = gi * gi;
    v[i] = vi + sq * ob2;
  }
}

// The parameters on elements [i0, i1), from `root` = sqrt(v): Adam
// `p = p decay - m / (root / sqrt(bc2) + eps) (lr / bc1)`, RMSProp
// `p = p decay - g / (root + eps) lr`, in the order of crates/core/src/optim.rs's operations.
template <typename T>
void params_range(T* p, const T* g, const T* m, const T* root, int64_t i0, int64_t i1, const Constants& c, const Rates& r) {
  const T bc2 = static_cast<T>(c.bc2_sqrt), eps = static_cast<T>(c.eps), step = static_cast<T>(r.step),
          decay = static_cast<T>(r.decay);
  for (int64_t i = i0; i < i1; ++i) {
    T update;
    if (c.rmsprop) {
      const T denom = root[i] + eps;
      update = g[i] / denom * step;
    } else {
      const T scaled = root[i] / bc2;
      const T denom = scaled + eps;
      update = m[i] / denom * step;
    }
    const T pi = c.decay ? p[i] * decay : p[i];
    p[i] = pi - update;
  }
}

void check(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  for (const at::Tensor* t : {&p, &m, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->scalar_type() == p.scalar_type(),
                "optimiser: parameters and moments must be contiguous CPU tensors of one type");
  }
  TORCH_CHECK(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble,
              "optimiser: the fused update takes float or double parameters, got ", p.scalar_type());
  TORCH_CHECK(g.sizes() == p.sizes() && m.sizes() == p.sizes() && v.sizes() == p.sizes() &&
                  g.scalar_type() == p.scalar_type() && g.device().is_cpu(),
              "optimiser: gradient and moments must match the parameter's shape ", p.sizes());
}

// One parameter: elements split over libtorch's threads (each element is on its own,
// so the split does not change a bit).
void update(at::Tensor& p, const at::Tensor& g_in, at::Tensor& m, at::Tensor& v, const Constants& c, const Rates& r) {
  check(p, g_in, m, v);
  const at::Tensor g = g_in.contiguous();
  constexpr int64_t grain = 1 << 14;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "lethe_optimiser", [&] {
    scalar_t *pp = p.data_ptr<scalar_t>(), *mp = m.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    at::parallel_for(0, p.numel(), grain, [&](int64_t i0, int64_t i1) { moments_range(gp, mp, vp, i0, i1, c); });
    // libtorch's own square root: on the CPU it is MKL's vector function, which is not
    // always the correctly rounded one, so it is called rather than written here.
    const at::Tensor root = v.sqrt();
    const scalar_t* rp = root.data_ptr<scalar_t>();
    at::parallel_for(0, p.numel(), grain, [&](int64_t i0, int64_t i1) { params_range(pp, gp, mp, rp, i0, i1, c, r); });
  });
  // In place, as libtorch's in-place operations: autograd sees a new version.
  for (at::Tensor* t : {&p, &m, &v}) t->unsafeGetTensorImpl()->bump_version();
}

}  // namespace

// The tensors behind `count` `at::Tensor*`, as a list for the `_foreach_` operations
// (handles to the same storage: an in-place operation on the list updates them).
static std::vector<at::Tensor> tensor_list(void** ts, int64_t count) {
  std::vector<at::Tensor> list;
  list.reserve(count);
  for (int64_t i = 0; i < count; ++i) list.push_back(*static_cast<at::Tensor*>(ts[i]));
  return list;
}

// The same update as `update`, for parameters on a GPU: libtorch's multi-tensor
// `_foreach_` operations, each a few kernel launches for every parameter at once
// (PyTorch's Adam on a GPU takes this path by default), where
// the per-parameter operations of crates/core/src/optim.rs launch a dozen kernels per parameter
// (3.9 ms of an 11.7 ms step at `enwik8-tiny` on an H100). A product and a sum may be
// rounded once here (`addcmul`, `addcdiv`), so the values agree with the CPU's to
// rounding, not to the bit.
static void update_foreach(void** params, void** grads, void** exp_avg, void** exp_avg_sq, int64_t count,
                           const double* steps, const double* decays, const double* constants, int rmsprop, int decay) {
  const double beta1 = constants[0], one_minus_beta1 = constants[1], beta2 = constants[2],
               one_minus_beta2 = constants[3], bc2_sqrt = constants[4], eps = constants[5];
  auto p = tensor_list(params, count), g = tensor_list(grads, count), v = tensor_list(exp_avg_sq, count);
  at::_foreach_mul_(v, beta2);
  at::_foreach_addcmul_(v, g, g, one_minus_beta2);  // v = beta2 v + (1 - beta2) g^2
  auto denom = at::_foreach_sqrt(v);
  if (rmsprop == 0) at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, eps);  // sqrt(v) / sqrt(bc2) + eps (RMSProp: sqrt(v) + eps)
  if (decay != 0) at::_foreach_mul_(p, std::vector<at::Scalar>(decays, decays + count));
  std::vector<at::Scalar> minus_steps;
  for (int64_t i = 0; i < count; ++i) minus_steps.emplace_back(-steps[i]);
  if (rmsprop != 0) {
    at::_foreach_addcdiv_(p, g, denom, minus_steps);  // p -= lr g / denom
    return;
  }
  auto m = tensor_list(exp_avg, count);
  at::_foreach_mul_(m, beta1);
  at::_foreach_add_(m, g, one_minus_beta1);         // m = beta1 m + (1 - beta1) g
  at::_foreach_addcdiv_(p, m, denom, minus_steps);  // p -= lr / bc1 m / denom
}

extern "C" {

// Updates `count` parameters in place. `params`, `grads`, `exp_avg`, `exp_avg_sq`:
// `at::Tensor*` each (`exp_avg` unused by RMSProp); `steps` and `decays`: per parameter,
// Adam's `lr / bc1` (RMSProp: `lr`) and `1 - lr wd`; `constants`: beta1, 1 - beta1,
// beta2, 1 - beta2, sqrt(bc2), eps. `rmsprop` 1 for RMSProp, `decay` 1 when the weight
// decay is on, `multi_tensor` 1 for libtorch's multi-tensor operations (a GPU's path,
// `update_foreach`) instead of the element loop (CPU tensors).
int lethe_optimiser_step(const lethe_optimiser_args* args, char** error) {
  return lethe::guarded(error, [&] {
    void** params = args->params;
    void** grads = args->grads;
    void** exp_avg = args->exp_avg;
    void** exp_avg_sq = args->exp_avg_sq;
    const int64_t count = args->count;
    const double* steps = args->steps;
    const double* decays = args->decays;
    const double* constants = args->constants;
    const int rmsprop = args->rmsprop, decay = args->decay, multi_tensor = args->multi_tensor;
    if (multi_tensor != 0) {
      at::NoGradGuard no_grad;
      update_foreach(params, grads, exp_avg, exp_avg_sq, count, steps, decays, constants, rmsprop, decay);
      return;
    }
    const Constants c{constants[0], constants[1], constants[2], constants[3], constants[4], constants[5],
                      rmsprop != 0, decay != 0};
    at::NoGradGuard no_grad;
    for (int64_t i = 0; i < count; ++i) {
      auto& p = *static_cast<at::Tensor*>(params[i]);
      auto& m = *static_cast<at::Tensor*>(exp_avg[i]);
      auto& v = *static_cast<at::Tensor*>(exp_avg_sq[i]);
      update(p, *static_cast<at::Tensor*>(grads[i]), m, v, c, Rates{steps[i], decays[i]});
    }
  });
}

// The global L2 norm of `count` gradients on a GPU, with one read back to the host
// (`_foreach_norm`, then the norm of the norms in double precision); when `max` > 0
// and the norm exceeds it, every gradient is scaled by max / (norm + 1e-6), as
// crates/core/src/optim.rs clips on the CPU.
int lethe_clip_foreach(void** grads, int64_t count, double max, double* norm, char** error) {
  return lethe::guarded(error, [&] {
    at::NoGradGuard no_grad;
    auto g = tensor_list(grads, count);
    auto norms = at::_foreach_norm(g, 2);
    *norm = at::stack(norms).to(at::kDouble).norm().item<double>();
    if (max > 0.0 && *norm > max) at::_foreach_mul_(g, max / (*norm + 1e-6));
  });
}

}  // extern "C"
