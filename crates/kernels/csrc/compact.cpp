// The per-stream compaction of Expire-Span's cache on the CPU, in one call
// (crates/model/src/memory/compact.rs wraps it): after a block, every stream keeps the slots
// whose flag is set, in order, right-aligned in `c` slots (the most any stream keeps),
// and is padded on the left with its last dropped slots, in order. That is the order a
// stable sort of the flags gives (dropped first, then kept, each in order, the last `c`
// of them), which the libtorch-operation path uses: the two give the same tensors, to
// the padding.
//
// One pass over the flags plans every stream's source slots; each tensor to compact
// (b, n, ...) is then copied whole slot by whole slot (`memcpy` of a row of `d` floats
// for the states). The copies may leave room after each stream's slots, where the next
// block's rows are then written instead of joining the cache and the block in a copy.
// The libtorch path takes a stable sort, a sum, a maximum read back, a dozen small
// tensors and an `index_select` per tensor for the same result.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "guard.h"
#include "lethe.h"

namespace {

// Where every new slot comes from: `index[s * c + i]` is the old slot of stream `s`'s new
// slot `i`, and `valid[s * c + i]` whether it holds a kept memory (not padding).
struct Plan {
  int64_t b, n, c;
  std::vector<int64_t> index;
  std::vector<bool> valid;
};

Plan plan_of(const at::Tensor& keep) {
  TORCH_CHECK(keep.dim() == 2 && keep.scalar_type() == at::kBool && keep.device().is_cpu(),
              "compaction: the flags must be a (b, n) bool tensor on the CPU, got ", keep.sizes(), " ", keep.scalar_type());
  const at::Tensor flags = keep.contiguous();
  const bool* f = flags.data_ptr<bool>();
  Plan p{flags.size(0), flags.size(1), 0, {}, {}};
  std::vector<int64_t> kept(static_cast<size_t>(p.b), 0);
  for (int64_t s = 0; s < p.b; ++s) kept[s] = std::count(f + s * p.n, f + (s + 1) * p.n, true);
  p.c = p.b == 0 ? 0 : *std::max_element(kept.begin(), kept.end());
  p.index.assign(static_cast<size_t>(p.b * p.c), 0);
  p.valid.assign(static_cast<size_t>(p.b * p.c), false);
  for (int64_t s = 0; s < p.b; ++s) {
    const int64_t pad = p.c - kept[s];
    int64_t* to = p.index.data() + s * p.c;
    // Of the stream's `n - kept` dropped slots, the last `pad` are its padding.
    int64_t skip = p.n - kept[s] - pad, padding = 0, next = pad;
    for (int64_t j = 0; j < p.n; ++j) {
      if (f[s * p.n + j]) {
        to[next++] = j;
      } else if (skip > 0) {
        --skip;
      } else {
        to[padding++] = j;
      }
    }
    for (int64_t i = pad; i < p.c; ++i) p.valid[s * p.c + i] = true;
  }
  return p;
}

// `x` (b, n, ...) at the plan's slots: (b, c + room, ...), whole slots copied, the last
// `room` slots of every stream left unwritten.
at::Tensor gather(const at::Tensor& x, const Plan& p, int64_t room) {
  TORCH_CHECK(x.dim() >= 2 && x.size(0) == p.b && x.size(1) == p.n && x.device().is_cpu(),
              "compaction: every tensor must be (b, n, ...) on the CPU with (b, n) = (", p.b, ", ", p.n, "), got ", x.sizes());
  TORCH_CHECK(!x.requires_grad(), "compaction: the tensors are copied without gradient; detach them first");
  const at::Tensor src = x.contiguous();
  std::vector<int64_t> sizes = src.sizes().vec();
  sizes[1] = p.c + room;
  at::Tensor out = at::empty(sizes, src.options());
  const int64_t slot = src.numel() / std::max<int64_t>(p.b * p.n, 1) * static_cast<int64_t>(src.element_size());  // bytes
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  // Streams in parallel where a stream's copy is worth a thread (the states, not the
  // counters); copies do not depend on the thread count.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(p.c * slot, 1));
  at::parallel_for(0, p.b, grain, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      for (int64_t i = 0; i < p.c; ++i) {
        std::memcpy(to + (s * (p.c + room) + i) * slot, from + (s * p.n + p.index[s * p.c + i]) * slot, static_cast<size_t>(slot));
      }
    }
  });
  return out;
}

at::Tensor validity(const Plan& p) {
  at::Tensor valid = at::empty({p.b, p.c}, at::TensorOptions().dtype(at::kBool));
  bool* v = valid.data_ptr<bool>();
  for (size_t k = 0; k < p.valid.size(); ++k) v[k] = p.valid[k];
  return valid;
}

}  // namespace

extern "C" {

// Compacts `count` tensors (b, n, ...) by the flags `keep` (b, n). Writes `count + 1` new
// tensors to `out`: the new slots' validity (b, c), then each tensor at its new slots
// with `room` free slots after them (b, c + room, ...), in the order given.
int lethe_compact(void* keep, void** tensors, int64_t count, int64_t room, void** out, char** error) {
  return lethe::guarded(error, [&] {
    auto t = [](void* x) -> const at::Tensor& { return *static_cast<at::Tensor*>(x); };
    TORCH_CHECK(room >= 0, "compaction: the room after the kept slots must be at least 0, got ", room);
    const Plan p = plan_of(t(keep));
    std::vector<at::Tensor> result{validity(p)};
    for (int64_t k = 0; k < count; ++k) result.push_back(gather(t(tensors[k]), p, room));
    for (size_t k = 0; k < result.size(); ++k) out[k] = new at::Tensor(std::move(result[k]));
  });
}

}  // extern "C"
