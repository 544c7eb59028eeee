// Several narrows of one tensor as one autograd node (crates/model/src/chunks.rs wraps it).
//
// On the CPU the attention takes a block's queries in chunks, each over its own range of
// the keys (crates/model/src/memory/window.rs): every chunk narrows the queries, the keys and
// the values. libtorch's backward pass of a `narrow` (`slice_backward`) fills a zero
// tensor of the whole input's size and copies the chunk's gradient into it, and the
// engine then adds those whole-size tensors up: for `c` chunks, `c` fills and `c - 1`
// additions of the whole tensor, where the chunks' own gradients cover little more than
// it once. Here the `c` narrows are the outputs of one node, whose backward pass fills
// one zero tensor and adds each chunk's gradient into its own range.
//
// The chunks' gradients are added last chunk first, the order in which the engine ran
// the narrows' backward passes (each chunk's graph was built after the one before), so
// that the sums round exactly as before (tests::it_gives_what_the_narrows_give).
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "guard.h"
#include "lethe.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Chunks : public torch::autograd::Function<Chunks> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& t, int64_t dim, std::vector<int64_t> starts,
                               std::vector<int64_t> lens) {
    TORCH_CHECK(dim >= 0 && dim < t.dim(), "dimension ", dim, " of a tensor of ", t.dim());
    TORCH_CHECK(!starts.empty() && starts.size() == lens.size(), "one length per start, got ", starts.size(), " and ",
                lens.size());
    variable_list out;
    out.reserve(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) {
      TORCH_CHECK(starts[i] >= 0 && lens[i] >= 0 && starts[i] + lens[i] <= t.size(dim), "chunk ", i, " (", starts[i],
                  " + ", lens[i], ") out of the ", t.size(dim), " rows of dimension ", dim);
      // Views, as `narrow` gives (autograd marks them as made in a custom function:
      // they must not be modified in place, and nothing here does).
      out.push_back(t.narrow(dim, starts[i], lens[i]));
    }
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["starts"] = starts;
    ctx->saved_data["lens"] = lens;
    ctx->saved_data["sizes"] = t.sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const auto starts = ctx->saved_data["starts"].toIntVector();
    const auto lens = ctx->saved_data["lens"].toIntVector();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    at::Tensor grad;
    for (size_t j = grads.size(); j-- > 0;) {
      if (!grads[j].defined()) continue;
      if (!grad.defined()) grad = at::zeros(sizes, grads[j].options());
      grad.narrow(dim, starts[j], lens[j]).add_(grads[j]);
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// The `count` narrows `t.narrow(dim, starts[i], lens[i])` as one autograd node, written
// to `out[0..count)` as new `at::Tensor*`.
int lethe_chunks(void* t, int64_t dim, const int64_t* starts, const int64_t* lens, int64_t count, void** out, char** error) {
  return lethe::guarded(error, [&] {
    TORCH_CHECK(count > 0, "no chunks");
    std::vector<int64_t> s(starts, starts + count), l(lens, lens + count);
    auto result = Chunks::apply(*static_cast<at::Tensor*>(t), dim, s, l);
    for (size_t i = 0; i < result.size(); ++i) out[i] = new at::Tensor(std::move(result[i]));
  });
}

}  // extern "C"
