// Mixed precision's matrix products on a CPU without instructions for half precision
// (x86 without AVX512-BF16, or without AVX512-FP16 for float16). There libtorch
// emulates its bfloat16 and float16 products, about ten times slower than float32's:
// a training step under autocast to bfloat16 took 8.8-9.5x its float32 time on a 2-core
// AVX2 CPU. libtorch's emulated products sum in float32 and round each output once, so
// the same product is computed here on the values widened to float32 (exact) and
// rounded once: the operands are cast to the autocast dtype as autocast casts them (a
// weight's cast cached for the region), widened, multiplied by float32's kernels, and
// the result rounded to the autocast dtype. The backward pass is float32's too: the
// gradient reaches each operand through the casts, rounded to the autocast dtype as
// libtorch's half-precision backward products round theirs.
//
// These kernels take the place of libtorch's own for the products autocast lists
// (mm, bmm, addmm, baddbmm, addbmm, matmul, linear) under the AutocastCPU dispatch key,
// for the rest of the process, from the first time lethe enters autocast on such a CPU
// (crates/core/src/device.rs). They run only on a thread with autocast on the CPU
// enabled; an operand autocast would not cast (float64) leaves the product to libtorch's
// kernel in the autocast dtype, as before.

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>
#include <optional>

#include "guard.h"
#include "lethe.h"

namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

at::ScalarType lower() { return at::autocast::get_autocast_dtype(at::kCPU); }

// Whether every defined operand is one autocast casts to the lower precision.
bool widenable(std::initializer_list<const at::Tensor*> operands) {
  for (const at::Tensor* t : operands)
    if (t->defined() && !at::autocast::is_eligible(*t, kCpu)) return false;
  return true;
}

// An operand as autocast casts it (the cast of a weight cached for the region), widened.
at::Tensor widened(const at::Tensor& t) { return at::autocast::cached_cast(lower(), t, kCpu).to(at::kFloat); }

// An operand as autocast casts it, for libtorch's own product in the lower precision.
at::Tensor cast(const at::Tensor& t) { return at::autocast::cached_cast(lower(), t, kCpu); }

// The guard autocast's own kernels hold while they call the product: inside, no
// operation is cast again.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::AutocastCPU};
};

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  NoAutocast no;
  if (!widenable({&a, &b})) return at::mm(cast(a), cast(b));
  return at::mm(widened(a), widened(b)).to(lower());
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  NoAutocast no;
  if (!widenable({&a, &b})) return at::bmm(cast(a), cast(b));
  return at::bmm(widened(a), widened(b)).to(lower());
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  NoAutocast no;
  if (!widenable({&a, &b})) return at::matmul(cast(a), cast(b));
  return at::matmul(widened(a), widened(b)).to(lower());
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  NoAutocast no;
  if (!widenable({&self, &a, &b})) return at::addmm(cast(self), cast(a), cast(b), beta, alpha);
  return at::addmm(widened(self), widened(a), widened(b), beta, alpha).to(lower());
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                   const at::Scalar& alpha) {
  NoAutocast no;
  if (!widenable({&self, &a, &b})) return at::baddbmm(cast(self), cast(a), cast(b), beta, alpha);
  return at::baddbmm(widened(self), widened(a), widened(b), beta, alpha).to(lower());
}

at::Tensor addbmm(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                  const at::Scalar& alpha) {
  NoAutocast no;
  if (!widenable({&self, &a, &b})) return at::addbmm(cast(self), cast(a), cast(b), beta, alpha);
  return at::addbmm(widened(self), widened(a), widened(b), beta, alpha).to(lower());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  NoAutocast no;
  const at::Tensor none;
  const at::Tensor& b = bias.has_value() ? *bias : none;
  if (!widenable({&x, &w, &b}))
    return at::linear(cast(x), cast(w), b.defined() ? std::optional<at::Tensor>(cast(b)) : std::nullopt);
  return at::linear(widened(x), widened(w), b.defined() ? std::optional<at::Tensor>(widened(b)) : std::nullopt)
      .to(lower());
}

// Drops libtorch's warning that a kernel replaces one registered before: that is the point.
struct Silent : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

std::once_flag registered;

}  // namespace

extern "C" {

// Puts the widened products in the place of libtorch's for autocast on the CPU, once
// for the process; later calls do nothing.
int lethe_autocast_widen_products(char** error) {
  return lethe::guarded(error, [&] {
    std::call_once(registered, [] {
      Silent silent;
      c10::WarningUtils::WarningHandlerGuard quiet(&silent);
      // Never freed: freeing it would hand the products back to libtorch's kernels, and
      // at the process's exit the dispatcher it registers with may be gone first.
      auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
      lib->impl("mm", TORCH_FN(mm));
      lib->impl("bmm", TORCH_FN(bmm));
      lib->impl("matmul", TORCH_FN(matmul));
      lib->impl("addmm", TORCH_FN(addmm));
      lib->impl("baddbmm", TORCH_FN(baddbmm));
      lib->impl("addbmm", TORCH_FN(addbmm));
      lib->impl("linear", TORCH_FN(linear));
    });
  });
}

}  // extern "C"
