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
// (mm, bmm, addmm, baddbmm, addbmm, matmul, linear) and for the 1-D convolution (the
// Compressive Transformer's convolutional compressor: 14x float32's time emulated)
// under the AutocastCPU dispatch key,
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
#include <string>

#include "guard.h"
#include "lethe.h"

namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

at::ScalarType lower() { return at::autocast::get_autocast_dtype(at::kCPU); }

// Whether an argument lets the product be widened: a tensor autocast casts to the lower
// precision, no tensor, or anything that is not a tensor (a scalar, a size).
bool eligible(const at::Tensor& t) { return !t.defined() || at::autocast::is_eligible(t, kCpu); }
bool eligible(const std::optional<at::Tensor>& t) { return !t.has_value() || eligible(*t); }
template <class T>
bool eligible(const T&) {
  return true;
}

// An argument as autocast casts it (the cast of a weight cached for the region), for
// libtorch's own product in the lower precision; anything else as it is.
at::Tensor cast(const at::Tensor& t) { return at::autocast::cached_cast(lower(), t, kCpu); }
std::optional<at::Tensor> cast(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(cast(*t)) : std::nullopt;
}
template <class T>
const T& cast(const T& x) {
  return x;
}

// An argument as autocast casts it, widened to float32 (exact); anything else as it is.
at::Tensor widened(const at::Tensor& t) { return t.defined() ? cast(t).to(at::kFloat) : t; }
std::optional<at::Tensor> widened(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(widened(*t)) : std::nullopt;
}
template <class T>
const T& widened(const T& x) {
  return x;
}

// The guard autocast's own kernels hold while they call the product: inside, no
// operation is cast again.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::AutocastCPU};
};

// The kernel for the operation `Op` (one of ATen's `at::_ops` entries, whose `schema` is
// its C++ signature), as libtorch's autocast wraps its own: the product of the widened
// operands, rounded once, or libtorch's product of the cast ones where an operand is not
// eligible.
template <class Op, class Signature = typename Op::schema>
struct Widened;

template <class Op, class... Args>
struct Widened<Op, at::Tensor(Args...)> {
  static at::Tensor call(Args... args) {
    NoAutocast no;
    if (!(eligible(args) && ...)) return Op::call(cast(args)...);
    return Op::call(widened(args)...).to(lower());
  }
};

// Registers the widened kernel of `Op` under its schema's name (`aten::mm`, or with its
// overload, `aten::conv1d.padding`).
template <class Op>
void widen(torch::Library& lib) {
  const std::string overload = Op::overload_name;
  const std::string name = std::string(Op::name) + (overload.empty() ? "" : "." + overload);
  lib.impl(name.c_str(), TORCH_FN(Widened<Op>::call));
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
      widen<at::_ops::mm>(*lib);
      widen<at::_ops::bmm>(*lib);
      widen<at::_ops::matmul>(*lib);
      widen<at::_ops::addmm>(*lib);
      widen<at::_ops::baddbmm>(*lib);
      widen<at::_ops::addbmm>(*lib);
      widen<at::_ops::linear>(*lib);
      widen<at::_ops::conv1d>(*lib);
    });
  });
}

}  // extern "C"
