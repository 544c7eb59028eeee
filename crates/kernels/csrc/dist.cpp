// lethe's bridge to PyTorch's distributed engine (c10d): a TCPStore for the rendezvous
// and a process group for the collectives, Gloo's or, for GPU ranks, NCCL's (from
// liblethe_nccl.so, csrc/nccl/, loaded at run time), behind a C interface that
// crates/core/src/dist.rs wraps. Every entry point catches C++ exceptions and hands back
// their message, so that a dead peer or a timeout becomes a Rust error, never an abort.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "guard.h"
#include "lethe.h"

struct lethe_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  int device;          // the CUDA device of an NCCL group, -1 for Gloo
  bool failed = false;  // a collective failed: the group is aborted, not shut down
};

using lethe::guarded;

namespace {

// liblethe_nccl.so's constructor of an NCCL group (csrc/nccl/process_group_nccl.cpp), once loaded.
using NcclBackend = void* (*)(void* store, int rank, int world, int device, int64_t timeout_ms, char** error);
std::atomic<NcclBackend> nccl_backend{nullptr};
std::mutex nccl_loading;
constexpr int kNcclAbi = 1;

// The group's collectives: NCCL's on `device` through the loaded library, else Gloo's.
c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                                               int device, std::chrono::milliseconds timeout) {
  if (device < 0) {
    // As torch.distributed does: the devices GLOO_SOCKET_IFNAME names, or the one
    // this host's name resolves to.
    auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  }
  NcclBackend make = nccl_backend.load();
  TORCH_CHECK(make != nullptr, "NCCL asked for before liblethe_nccl.so was loaded");
  char* message = nullptr;
  void* raw = make(store.get(), rank, world, device, timeout.count(), &message);
  if (raw == nullptr) {
    std::string text = message != nullptr ? message : "no reason given";
    std::free(message);
    TORCH_CHECK(false, text);
  }
  return c10::intrusive_ptr<c10d::Backend>::reclaim(static_cast<c10d::Backend*>(raw));
}

// Runs one collective of `pg`, marking the group failed if it throws.
template <typename F>
int collective(lethe_pg* pg, char** error, F body) {
  const int status = guarded(error, body);
  if (status != 0) pg->failed = true;
  return status;
}

// DDP's communication hook with the bucket's sum over the ranks: the default divides by
// the ranks, and lethe's loss is already normalised over the whole batch.
class SumHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  using CppCommHookInterface::CppCommHookInterface;
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }
};

}  // namespace

// c10d's Reducer (DDP's engine) over a group's parameters.
struct lethe_reducer {
  std::unique_ptr<c10d::Reducer> reducer;
};

extern "C" {

// Loads liblethe_nccl.so from `path` (kept for the life of the process); refuses one of
// another interface version. Loading again once loaded does nothing.
int lethe_dist_nccl_load(const char* path, char** error) {
  return guarded(error, [&] {
    std::lock_guard<std::mutex> lock(nccl_loading);
    if (nccl_backend.load() != nullptr) return;
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(handle != nullptr, "cannot load ", path, ": ", dlerror());
    auto abi = reinterpret_cast<int (*)()>(dlsym(handle, "lethe_nccl_abi"));
    auto make = reinterpret_cast<NcclBackend>(dlsym(handle, "lethe_nccl_backend"));
    if (abi == nullptr || make == nullptr || abi() != kNcclAbi) {
      dlclose(handle);
      TORCH_CHECK(false, path, " is not a liblethe_nccl.so of this lethe (rebuild it with scripts/build-nccl.sh)");
    }
    nccl_backend.store(make);
  });
}

// Joins the group: connects to (or, when `store_server`, hosts) the TCPStore at
// host:port, under `prefix`, then builds a process group whose collectives give up after
// `timeout_ms`: Gloo's when `device` is -1, else NCCL's on that CUDA device (after
// lethe_dist_nccl_load). Returns null and sets `error` on failure.
lethe_pg* lethe_dist_init(const lethe_dist_options* o, char** error) {
  lethe_pg* pg = nullptr;
  guarded(error, [&] {
    const char* host = o->host;
    const char* prefix = o->prefix;
    const int port = o->port, rank = o->rank, world = o->world, store_server = o->store_server, device = o->device;
    const int64_t timeout_ms = o->timeout_ms;
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = store_server != 0;
    options.numWorkers = world;
    options.waitWorkers = true;  // every rank counts itself in; the host waits for all
    options.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), options);
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    auto backend = make_backend(store, rank, world, device, timeout);
    pg = new lethe_pg{store, backend, device};
  });
  return pg;
}

// Reduces `tensor` over the ranks, in place: the sum (`max` = 0) or the maximum.
int lethe_dist_all_reduce(lethe_pg* pg, void* tensor, int max, char** error) {
  return collective(pg, error, [&] {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions options;
    options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    pg->backend->allreduce(tensors, options)->wait();
  });
}

// Overwrites `tensor` on every rank with rank `root`'s.
int lethe_dist_broadcast(lethe_pg* pg, void* tensor, int root, char** error) {
  return collective(pg, error, [&] {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    pg->backend->broadcast(tensors, options)->wait();
  });
}

// Returns once every rank has called it.
int lethe_dist_barrier(lethe_pg* pg, char** error) {
  return collective(pg, error, [&] {
    c10d::BarrierOptions options;
    if (pg->device >= 0) options.device_ids = {static_cast<int64_t>(pg->device)};
    pg->backend->barrier(options)->wait();
  });
}

// c10d's Reducer over the `n` parameters `params` (at::Tensor*, on the group's device):
// hooks on their gradients' accumulation that all-reduce (sum) buckets of about
// `bucket_bytes` (the first `first_bytes`, so that communication starts early) as soon as a bucket's gradients are all there, during the backward pass,
// and copy the sums back when it ends. The buckets follow the parameters in reverse, the
// order the backward pass produces their gradients in. Parameters without a gradient on a
// rank count as zeros there.
lethe_reducer* lethe_dist_reducer_new(lethe_pg* pg, void* const* params, int n, int64_t first_bytes,
                                      int64_t bucket_bytes, char** error) {
  lethe_reducer* out = nullptr;
  guarded(error, [&] {
    std::vector<at::Tensor> tensors;
    for (int i = n - 1; i >= 0; --i) tensors.push_back(*static_cast<at::Tensor*>(params[i]));
    const bool nccl = pg->device >= 0;
    const auto type = nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
    auto group = c10::make_intrusive<c10d::ProcessGroup>(pg->store, pg->backend->getRank(), pg->backend->getSize());
    group->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type, pg->backend);
    group->setDefaultBackend(type);
    const std::vector<bool> dense(tensors.size(), false);
    auto buckets = std::get<0>(
        c10d::compute_bucket_assignment_by_size(
            tensors, {static_cast<size_t>(first_bytes), static_cast<size_t>(bucket_bytes)}, dense));
    auto reducer = std::make_unique<c10d::Reducer>(tensors, std::move(buckets), group, dense, bucket_bytes,
                                                   /*find_unused_parameters=*/true,
                                                   /*gradient_as_bucket_view=*/false,
                                                   std::unordered_map<size_t, std::string>{}, first_bytes,
                                                   /*skip_all_reduce_unused_params=*/false,
                                                   /*use_python_reducer=*/false, std::vector<int64_t>{});
    reducer->register_comm_hook(std::make_unique<SumHook>(group));
    out = new lethe_reducer{std::move(reducer)};
  });
  return out;
}

// Before the backward pass of `loss` whose gradients are to be reduced (the last
// micro-batch's): the next backward pass all-reduces as it goes.
int lethe_dist_reducer_prepare(lethe_reducer* r, void* loss, char** error) {
  return guarded(error, [&] { r->reducer->prepare_for_backward({*static_cast<at::Tensor*>(loss)}); });
}

void lethe_dist_reducer_free(lethe_reducer* r) {
  try {
    delete r;
  } catch (...) {
  }
}

// Leaves the group: shuts it down (NCCL destroys its communicators), or after a failed
// collective aborts it, which does not wait for peers that may be gone.
void lethe_dist_free(lethe_pg* pg) {
  try {
    if (pg->failed) {
      pg->backend->abort();
    } else {
      pg->backend->shutdown();
    }
  } catch (...) {
  }
  try {
    delete pg;
  } catch (...) {
  }
}

void lethe_free_error(char* error) { std::free(error); }

}  // extern "C"
