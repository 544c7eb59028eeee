// lethe's NCCL process group, for data-parallel ranks on GPUs: c10d's ProcessGroupNCCL
// built on the store that dist.cpp has joined. ProcessGroupNCCL lives in libtorch_cuda,
// which lethe does not link (one binary runs with or without CUDA), so this file is a
// library of its own, liblethe_nccl.so, built apart by scripts/build-nccl.sh; dist.cpp
// loads it (lethe_dist_nccl_load) when a GPU rank asks for NCCL and hands its collectives
// to the c10d::Backend this returns.

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "../guard.h"

extern "C" {

// The interface's version: dist.cpp refuses a library of another.
int lethe_nccl_abi() { return 1; }

// Builds the NCCL group of `world` ranks through `store` (a borrowed c10d::Store*), this
// rank on CUDA device `device`. The communicator is made here (eager: a missing peer or
// a device fault is an error now, not at the first all-reduce). Collectives wait
// `timeout_ms` and then throw (TORCH_NCCL_BLOCKING_WAIT, unless the environment sets it
// otherwise), so a dead peer becomes an error rather than the watchdog ending the
// process. Returns a new c10d::Backend* the caller owns, or null and `error`.
void* lethe_nccl_backend(void* store, int rank, int world, int device, int64_t timeout_ms, char** error) {
  c10d::Backend* backend = nullptr;
  lethe::guarded(error, [&] {
    const int visible = c10::cuda::device_count();
    TORCH_CHECK(device >= 0 && device < visible, "NCCL needs a CUDA device for each rank: device ", device,
                " asked for, ", visible, " visible");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    const c10::Device gpu(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    auto borrowed = c10::intrusive_ptr<c10d::Store>::reclaim_copy(static_cast<c10d::Store*>(store));
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(borrowed, rank, world, options);
    group->setBoundDeviceId(gpu);
    group->eagerConnectSingleDevice(gpu);
    backend = group.release();
  });
  return backend;
}

}  // extern "C"
