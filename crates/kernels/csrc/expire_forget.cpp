// Expire-Span's deletion after a block in one call (`lethe_expire_forget`): which memories
// of `[cache, block]` the next block still sees, every stream's kept ones right-aligned
// in a new cache, and the next block's counters and validity written after theirs (csrc/expire_forget.h gives the arithmetic). On a GPU it runs the two kernels of
// liblethe_cuda.so and reads back one number, the most any stream keeps; on the CPU the
// same element functions run in loops, which is how the tests check the kernels'
// arithmetic without a GPU (the CPU's own training path is csrc/compact.cpp).
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>

#include <vector>

#include "cuda_kernels.h"
#include "expire_forget.h"
#include "guard.h"
#include "lethe.h"

namespace {

void check(const at::Tensor& states, const at::Tensor& spans, const at::Tensor& counter, const at::Tensor& valid,
           int64_t m) {
  TORCH_CHECK(states.dim() == 3 && spans.dim() == 2 && counter.sizes() == spans.sizes() && valid.sizes() == spans.sizes() &&
                  states.size(0) == spans.size(0) && states.size(1) == spans.size(1),
              "expire forget: states (b, n, d), spans, counter and validity (b, n), got ", states.sizes(), ", ",
              spans.sizes(), ", ", counter.sizes(), ", ", valid.sizes());
  TORCH_CHECK(m >= 0, "expire forget: the block's length must be at least 0, got ", m);
  TORCH_CHECK(!states.requires_grad(), "expire forget: the states are copied without gradient; detach them first");
  TORCH_CHECK(states.element_size() % 4 == 0, "expire forget: states of 32 or 64-bit elements");
  TORCH_CHECK((spans.scalar_type() == at::kFloat || spans.scalar_type() == at::kDouble) &&
                  counter.scalar_type() == spans.scalar_type() && valid.scalar_type() == at::kBool,
              "expire forget: spans and counter in one float kind, validity bool");
  const auto device = states.device();
  TORCH_CHECK(spans.device() == device && counter.device() == device && valid.device() == device,
              "expire forget: every operand on one device");
}

void launch(lethe_cuda_forget_fn f, const lethe_cuda_forget_args& a) {
  char message[256] = {0};
  const int status = f(&a, message, sizeof message);
  TORCH_CHECK(status == 0, "expire forget: ", message);
}

// The CPU's loops: one stream at a time, each as one thread of the planning kernel would.
template <typename T>
int64_t plan_on_cpu(const lethe_forget::Shape& s, const lethe_forget::Operands<T>& o, int32_t* dest) {
  int64_t most = 0;
  for (int64_t stream = 0; stream < s.b; ++stream) {
    int64_t kept = 0;
    for (int64_t k = 0; k < s.n; ++k) kept += lethe_forget::keep_at(s, o, stream * s.n + k) ? 1 : 0;
    lethe_forget::place(s, o, stream, 0, s.n, kept, 0, dest);
    most = kept > most ? kept : most;
  }
  return most;
}

std::vector<at::Tensor> forget(const at::Tensor& states_in, const at::Tensor& spans_in, const at::Tensor& counter_in,
                               const at::Tensor& valid_in, double ramp, int64_t m) {
  const auto states = states_in.contiguous(), spans = spans_in.contiguous(), counter = counter_in.contiguous(),
             valid = valid_in.contiguous();
  check(states, spans, counter, valid, m);
  const int64_t b = states.size(0), n = states.size(1);
  const int64_t words = n == 0 || b == 0 ? 0 : states.numel() / (b * n) * states.element_size() / 4;
  const lethe_forget::Shape s{b, n, words, m};
  auto dest = at::empty({b, n}, spans.options().dtype(at::kInt));
  int64_t c = 0;
  lethe_cuda_forget_args a{};
  if (states.is_cuda()) {
    a.device = states.device().index();
    a.b = b, a.n = n, a.words = words, a.m = m;
    a.is_double = spans.scalar_type() == at::kDouble ? 1 : 0;
    a.spans = spans.data_ptr();
    a.counter = counter.data_ptr();
    a.valid = valid.data_ptr<bool>();
    a.ramp = ramp;
    auto most = at::zeros({1}, dest.options());
    a.dest = dest.data_ptr<int32_t>();
    a.most = most.data_ptr<int32_t>();
    launch(lethe::cuda_kernels().forget_plan, a);
    c = most.item<int32_t>();
  } else {
    AT_DISPATCH_FLOATING_TYPES(spans.scalar_type(), "expire_forget_plan", [&] {
      const lethe_forget::Operands<scalar_t> o{spans.data_ptr<scalar_t>(), counter.data_ptr<scalar_t>(),
                                               valid.data_ptr<bool>(), static_cast<scalar_t>(ramp)};
      c = plan_on_cpu(s, o, dest.data_ptr<int32_t>());
    });
  }
  std::vector<int64_t> sizes = states.sizes().vec();
  sizes[1] = c;
  auto states_out = at::empty(sizes, states.options());
  auto counter_out = at::empty({b, c + m}, counter.options());
  auto valid_out = at::empty({b, c + m}, valid.options());
  const auto* from = static_cast<const uint32_t*>(states.data_ptr());
  auto* to = static_cast<uint32_t*>(states_out.data_ptr());
  if (states.is_cuda()) {
    a.c = c;
    a.states = from;
    a.states_out = to;
    a.counter_out = counter_out.data_ptr();
    a.valid_out = valid_out.data_ptr<bool>();
    launch(lethe::cuda_kernels().forget_copy, a);
  } else {
    AT_DISPATCH_FLOATING_TYPES(spans.scalar_type(), "expire_forget_copy", [&] {
      const lethe_forget::Operands<scalar_t> o{spans.data_ptr<scalar_t>(), counter.data_ptr<scalar_t>(),
                                               valid.data_ptr<bool>(), static_cast<scalar_t>(ramp)};
      for (int64_t u = 0; u < b * (n + m); ++u)
        lethe_forget::copy_unit(s, o, dest.data_ptr<int32_t>(), c, u, 0, 1, from, to, counter_out.data_ptr<scalar_t>(),
                                valid_out.data_ptr<bool>());
    });
  }
  return {states_out, counter_out, valid_out};
}

}  // namespace

extern "C" {

// After a block of `m`: `states` (b, n, d) of `[cache, block]` (no gradient), the spans
// its memories were given, their counters and validity (b, n). Writes the new cache to
// `out`: states (b, c, d); counters and validity (b, c + m), the last m the next block's. On a GPU,
// lethe_cuda_kernels_load must have succeeded.
int lethe_expire_forget(lethe_tensor states, lethe_tensor spans, lethe_tensor counter, lethe_tensor valid, double ramp,
                        int64_t m, lethe_tensor* out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    auto result = forget(t(states), t(spans), t(counter), t(valid), ramp, m);
    for (size_t k = 0; k < result.size(); ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}

}  // extern "C"
