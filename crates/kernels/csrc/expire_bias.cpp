// Expire-Span's attention bias as one autograd node (`lethe_expire_bias`): the soft mask's
// log and the relative positions for `scaled_dot_product_attention`, the span loss beside
// them (its ramp parts, and the loss itself, whose gradient to the spans the same
// backward pass adds), and a backward pass of its own (csrc/expire_bias.h gives the
// arithmetic). On a GPU it runs the kernels of liblethe_cuda.so, loaded at run time by
// `lethe_cuda_kernels_load` (lethe links no CUDA library itself, so that one binary runs
// with or without a GPU); on the CPU the same element functions run in loops, which is
// how the tests check the kernels' arithmetic without a GPU.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <mutex>
#include <tuple>
#include <utility>
#include <string>

#include "cuda_kernels.h"
#include "expire_bias.h"
#include "guard.h"
#include "lethe.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The CUDA library's entry points, once loaded.
std::atomic<const lethe::CudaKernels*> loaded{nullptr};

lethe_bias::Shape shape_of(const at::Tensor& pq, const at::Tensor& spans, const at::Tensor& usable) {
  return {pq.size(0), pq.size(1), pq.size(2), spans.size(1), pq.size(3), usable.size(1)};
}

void check(const at::Tensor& pq, const at::Tensor& spans, const at::Tensor& counter, const at::Tensor& usable) {
  TORCH_CHECK(pq.dim() == 4 && spans.dim() == 2 && counter.sizes() == spans.sizes() && usable.dim() == 3,
              "expire bias: positions (b, h, m, P), spans and counter (b, n), usable (b, 1 or m, n)");
  const int64_t b = spans.size(0), m = pq.size(2), n = spans.size(1);
  TORCH_CHECK(pq.size(0) == b && usable.size(0) == b && usable.size(2) == n && (usable.size(1) == 1 || usable.size(1) == m),
              "expire bias: the operands' batch, queries or keys disagree");
  TORCH_CHECK(pq.scalar_type() == spans.scalar_type() && counter.scalar_type() == spans.scalar_type() &&
                  (spans.scalar_type() == at::kFloat || spans.scalar_type() == at::kDouble) &&
                  usable.scalar_type() == at::kBool,
              "expire bias: positions, spans and counter in one float kind, usable bool");
  const auto device = pq.device();
  TORCH_CHECK(spans.device() == device && counter.device() == device && usable.device() == device,
              "expire bias: every operand on one device");
}

template <typename T>
lethe_bias::Operands<T> operands_of(const at::Tensor& pq, const at::Tensor& spans, const at::Tensor& counter,
                                    const at::Tensor& usable, double ramp) {
  return {pq.defined() ? pq.data_ptr<T>() : nullptr, spans.data_ptr<T>(), counter.data_ptr<T>(),
          usable.data_ptr<bool>(), static_cast<T>(ramp)};
}

// The arguments of a kernel call over `spans`' device memory.
lethe_cuda_bias_args cuda_args(const lethe_bias::Shape& s, const at::Tensor& pq, const at::Tensor& spans,
                               const at::Tensor& counter, const at::Tensor& usable, double ramp) {
  lethe_cuda_bias_args a{};
  a.device = spans.device().index();
  a.b = s.b, a.h = s.h, a.m = s.m, a.n = s.n, a.p = s.p, a.u = s.u;
  a.is_double = spans.scalar_type() == at::kDouble ? 1 : 0;
  a.pq = pq.defined() ? pq.data_ptr() : nullptr;
  a.spans = spans.data_ptr();
  a.counter = counter.data_ptr();
  a.usable = usable.data_ptr<bool>();
  a.ramp = ramp;
  return a;
}

// Rows of the bias this far apart: libtorch's memory-efficient attention copies a bias
// whose strides are not multiples of 16 elements (into this layout), so the bias is
// written so from the start.
constexpr int64_t ROW_ALIGNMENT = 16;

int64_t aligned_row(int64_t n) { return (n + ROW_ALIGNMENT - 1) / ROW_ALIGNMENT * ROW_ALIGNMENT; }

// `grad` as rows of n elements a fixed stride apart (the layout the attention's backward
// pass gives a bias's gradient, or a contiguous one), and that stride.
std::pair<at::Tensor, int64_t> rows_of(const at::Tensor& grad) {
  const bool rowed = grad.stride(3) == 1 && grad.stride(1) == grad.size(2) * grad.stride(2) &&
                     grad.stride(0) == grad.size(1) * grad.stride(1) && grad.stride(2) >= grad.size(3);
  if (rowed) return {grad, grad.stride(2)};
  return {grad.contiguous(), grad.size(3)};
}

void launch(lethe_cuda_bias_fn f, const lethe_cuda_bias_args& a) {
  char message[256] = {0};
  const int status = f(&a, message, sizeof message);
  TORCH_CHECK(status == 0, "expire bias: ", message);
}

struct ExpireBias : public torch::autograd::Function<ExpireBias> {
  // `loss_scale` > 0 (with `stats`): the span loss times it too, as a fourth output.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& pq_in, const at::Tensor& spans_in,
                               const at::Tensor& counter_in, const at::Tensor& usable_in, double ramp, bool stats,
                               double loss_scale) {
    const auto pq = pq_in.contiguous(), spans = spans_in.contiguous(), counter = counter_in.contiguous(),
               usable = usable_in.contiguous();
    check(pq, spans, counter, usable);
    const lethe_bias::Shape s = shape_of(pq, spans, usable);
    const bool loss = stats && loss_scale > 0.0;
    const int64_t row = aligned_row(s.n);
    auto rows = at::empty({s.b, s.h, s.m, row}, pq.options());
    if (row > s.n) rows.narrow(3, s.n, row - s.n).zero_();  // never read, but not garbage
    auto bias = rows.narrow(3, 0, s.n);
    auto counts = at::empty({stats ? s.b : 0, s.n}, spans.options());
    auto distances = at::empty({stats ? s.b : 0, s.n}, spans.options().dtype(at::kDouble));
    auto loss_out = loss ? at::empty({}, spans.options()) : at::empty({0}, spans.options());
    if (pq.is_cuda()) {
      auto a = cuda_args(s, pq, spans, counter, usable, ramp);
      a.bias = bias.data_ptr();
      a.bias_row = row;
      a.counts = stats ? counts.data_ptr() : nullptr;
      a.distances = stats ? distances.data_ptr<double>() : nullptr;
      a.loss = loss ? loss_out.data_ptr() : nullptr;
      a.loss_scale = loss_scale;
      launch(lethe::cuda_kernels().bias_forward, a);
    } else {
      AT_DISPATCH_FLOATING_TYPES(spans.scalar_type(), "expire_bias", [&] {
        const auto o = operands_of<scalar_t>(pq, spans, counter, usable, ramp);
        scalar_t* out = bias.data_ptr<scalar_t>();
        at::parallel_for(0, s.b * s.h * s.m, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t i = r0 * s.n; i < r1 * s.n; ++i) out[i / s.n * row + i % s.n] = lethe_bias::bias_at(s, o, i);
        });
        if (!stats) return;
        scalar_t* c = counts.data_ptr<scalar_t>();
        double* d = distances.data_ptr<double>();
        at::parallel_for(0, s.b * s.n, 64, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) lethe_bias::ramp_at(s, o, i, c, d);
        });
        if (!loss) return;
        double total = 0.0;
        for (int64_t i = 0; i < s.b * s.n; ++i) total += lethe_bias::loss_term(o.spans, c, d, i);
        *loss_out.data_ptr<scalar_t>() = scalar_t(total / static_cast<double>(s.b) * loss_scale);
      });
    }
    ctx->save_for_backward({spans, counter, usable, counts});
    ctx->saved_data["h"] = s.h;
    ctx->saved_data["p"] = s.p;
    ctx->saved_data["ramp"] = ramp;
    ctx->saved_data["loss_scale"] = loss ? loss_scale : 0.0;
    ctx->mark_non_differentiable({counts, distances});
    return {bias, counts, distances, loss_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &spans = saved[0], &counter = saved[1], &usable = saved[2], &counts = saved[3];
    at::Tensor grad;
    int64_t grad_row = 0;
    std::tie(grad, grad_row) = rows_of(grads[0]);
    const double ramp = ctx->saved_data["ramp"].toDouble(), loss_scale = ctx->saved_data["loss_scale"].toDouble();
    // The span loss's gradient, when the loss was computed and taken.
    const at::Tensor loss_grad = loss_scale > 0.0 && grads[3].defined() ? grads[3].contiguous() : at::Tensor();
    const lethe_bias::Shape s{grad.size(0), grad.size(1), grad.size(2), grad.size(3),
                              ctx->saved_data["p"].toInt(), usable.size(1)};
    auto grad_pq = at::zeros({s.b, s.h, s.m, s.p}, grad.options());
    auto partial = at::empty({s.b, s.h * s.query_chunks(), s.n}, grad.options());
    if (grad.is_cuda()) {
      auto a = cuda_args(s, at::Tensor(), spans, counter, usable, ramp);
      a.grad = grad.data_ptr();
      a.grad_row = grad_row;
      a.grad_pq = grad_pq.data_ptr();
      a.partial = partial.data_ptr();
      a.counts = loss_grad.defined() ? counts.data_ptr() : nullptr;
      a.loss_grad = loss_grad.defined() ? loss_grad.data_ptr() : nullptr;
      a.loss_scale = loss_scale;
      launch(lethe::cuda_kernels().bias_backward, a);
    } else {
      AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "expire_bias_backward", [&] {
        const auto o = operands_of<scalar_t>(at::Tensor(), spans, counter, usable, ramp);
        const lethe_bias::LossGrad<scalar_t> loss{loss_grad.defined() ? counts.data_ptr<scalar_t>() : nullptr,
                                                  loss_grad.defined() ? loss_grad.data_ptr<scalar_t>() : nullptr,
                                                  loss_scale};
        const scalar_t* g = grad.data_ptr<scalar_t>();
        scalar_t *gp = grad_pq.data_ptr<scalar_t>(), *part = partial.data_ptr<scalar_t>();
        // One task per (stream, head, query chunk): the rows of grad_pq it adds to are its own.
        at::parallel_for(0, s.b * s.h * s.query_chunks(), 1, [&](int64_t t0, int64_t t1) {
          for (int64_t i = t0 * s.n; i < t1 * s.n; ++i) lethe_bias::backward_at(s, o, g, grad_row, gp, part, loss, i);
        });
      });
    }
    return {grad_pq, partial.sum(1), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::mutex loading;

}  // namespace

const lethe::CudaKernels& lethe::cuda_kernels() {
  const CudaKernels* k = loaded.load();
  TORCH_CHECK(k != nullptr,
              "Expire-Span's GPU kernels are not loaded (liblethe_cuda.so, built by scripts/build-cuda.sh)");
  return *k;
}

extern "C" {

// Expire-Span's attention bias (b, h, m, n) from the operands (`width` unused), with
// gradient to the positions and the spans; with `stats` 1 the ramp counts (b, n) and each
// key's ramp distances (b, n, double), else both empty; with `stats` 1 and `loss_scale`
// > 0 the span loss times `loss_scale` (one value, with gradient to the spans), else
// empty. Writes the four to `out`. On a GPU, lethe_cuda_kernels_load must have succeeded.
int lethe_expire_bias(const lethe_expire_operands* o, int stats, double loss_scale, lethe_tensor* out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    auto result =
        ExpireBias::apply(t(o->pq), t(o->spans), t(o->counter), t(o->usable), o->ramp, stats != 0, loss_scale);
    for (size_t k = 0; k < 4; ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}

// Loads the CUDA library at `path` (its handle is kept for the life of the process);
// refuses one of another ABI. Loading again once loaded does nothing.
int lethe_cuda_kernels_load(const char* path, char** error) {
  return lethe::guarded(error, [&] {
    std::lock_guard<std::mutex> lock(loading);
    if (loaded.load() != nullptr) return;
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(handle != nullptr, "cannot load ", path, ": ", dlerror());
    auto abi = reinterpret_cast<lethe_cuda_abi_fn>(dlsym(handle, "lethe_cuda_abi"));
    TORCH_CHECK(abi != nullptr && abi() == LETHE_CUDA_ABI, path, " is not a liblethe_cuda.so of this lethe (ABI ",
                abi != nullptr ? abi() : -1, ", expected ", LETHE_CUDA_ABI, "): build it again with scripts/build-cuda.sh");
    auto* k = new lethe::CudaKernels{
        reinterpret_cast<lethe_cuda_bias_fn>(dlsym(handle, "lethe_cuda_expire_bias_forward")),
        reinterpret_cast<lethe_cuda_bias_fn>(dlsym(handle, "lethe_cuda_expire_bias_backward")),
        reinterpret_cast<lethe_cuda_forget_fn>(dlsym(handle, "lethe_cuda_expire_forget_plan")),
        reinterpret_cast<lethe_cuda_forget_fn>(dlsym(handle, "lethe_cuda_expire_forget_copy"))};
    TORCH_CHECK(k->bias_forward != nullptr && k->bias_backward != nullptr && k->forget_plan != nullptr &&
                    k->forget_copy != nullptr,
                path, " lacks Expire-Span's kernels");
    loaded.store(k);
  });
}

// 1 once lethe_cuda_kernels_load has succeeded, else 0.
int lethe_cuda_kernels_ready(void) { return loaded.load() != nullptr ? 1 : 0; }

}  // extern "C"
