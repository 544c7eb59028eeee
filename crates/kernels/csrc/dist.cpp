// lethe's bridge to PyTorch's distributed engine (c10d): a TCPStore for the rendezvous
// and a Gloo process group for the collectives, behind a C interface that crates/core/src/dist.rs
// wraps. Every entry point catches C++ exceptions and hands back their message, so that
// a dead peer or a timeout becomes a Rust error, never an abort.
//
// Tensors cross as `at::Tensor*`, which is what tch's `Tensor::as_mut_ptr` holds.

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "guard.h"
#include "lethe.h"

struct lethe_pg {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
};

using lethe::guarded;

extern "C" {

// Joins the group: connects to (or, when `store_server`, hosts) the TCPStore at
// host:port, under `prefix`, then builds a Gloo process group whose collectives give up
// after `timeout_ms`. Returns null and sets `error` on failure.
lethe_pg* lethe_dist_init(const lethe_dist_options* o, char** error) {
  lethe_pg* pg = nullptr;
  guarded(error, [&] {
    const char* host = o->host;
    const char* prefix = o->prefix;
    const int port = o->port, rank = o->rank, world = o->world, store_server = o->store_server;
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
    // As torch.distributed does: the devices GLOO_SOCKET_IFNAME names, or the one
    // this host's name resolves to.
    auto gloo_options = c10d::ProcessGroupGloo::Options::create_default(timeout);
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
    pg = new lethe_pg{store, gloo};
  });
  return pg;
}

// Reduces `tensor` over the ranks, in place: the sum (`max` = 0) or the maximum.
int lethe_dist_all_reduce(lethe_pg* pg, void* tensor, int max, char** error) {
  return guarded(error, [&] {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions options;
    options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    pg->gloo->allreduce(tensors, options)->wait();
  });
}

// Overwrites `tensor` on every rank with rank `root`'s.
int lethe_dist_broadcast(lethe_pg* pg, void* tensor, int root, char** error) {
  return guarded(error, [&] {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    pg->gloo->broadcast(tensors, options)->wait();
  });
}

// Returns once every rank has called it.
int lethe_dist_barrier(lethe_pg* pg, char** error) {
  return guarded(error, [&] { pg->gloo->barrier(c10d::BarrierOptions())->wait(); });
}

// Leaves the group.
void lethe_dist_free(lethe_pg* pg) {
  try {
    delete pg;
  } catch (...) {
  }
}

void lethe_free_error(char* error) { std::free(error); }

}  // extern "C"
