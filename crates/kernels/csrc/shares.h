// Streams of unequal lengths shared out over libtorch's threads: each stream is one
// thread's from start to end, and each thread gets about as much of the work
// (`at::parallel_for` would give each as many streams, whatever their lengths). Used by
// the ragged attention (csrc/expire_attend.cpp) and the ragged projection (csrc/cache_grad.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace lethe {

// Streams [first, last) of share t of `shares`, given `offset` (streams + 1 entries): the
// running total of the streams' work. A share takes the streams whose middle falls in
// its part of the total; the last share takes the rest (streams without work at the end
// too: their middle is the total).
inline std::pair<int64_t, int64_t> streams_of(const std::vector<int64_t>& offset, int64_t t, int64_t shares) {
  const int64_t streams = static_cast<int64_t>(offset.size()) - 1, total = offset.back();
  const auto at = [&](int64_t k) {
    int64_t s = 0;
    while (s < streams && 2 * offset[s] + (offset[s + 1] - offset[s]) < 2 * total * k / shares) ++s;
    return s;
  };
  return {at(t), t + 1 == shares ? streams : at(t + 1)};
}

// How many shares the streams of `offset` go in: one per thread, at most one per stream.
inline int64_t shares_of(const std::vector<int64_t>& offset) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(offset.size()) - 1));
}

// `task(share, first, last)` for each share of the streams of `offset`, in parallel.
template <typename F>
void each_share(const std::vector<int64_t>& offset, const F& task) {
  const int64_t shares = shares_of(offset);
  at::parallel_for(0, shares, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [first, last] = streams_of(offset, t, shares);
      task(t, first, last);
    }
  });
}

}  // namespace lethe
