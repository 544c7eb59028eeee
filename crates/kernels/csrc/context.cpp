// libtorch's process-wide settings that lethe's config chooses (crates/core/src/device.rs).
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Logging.h>

#include "guard.h"
#include "lethe.h"

extern "C" {

// Float32 matrix products on a GPU in TensorFloat-32 (`tf32` 1) or in full float32 (0),
// as PyTorch's `torch.backends.cuda.matmul.allow_tf32` sets them.
int lethe_set_tf32(int tf32, char** error) {
  return lethe::guarded(error, [&] { at::globalContext().setAllowTF32CuBLAS(tf32 != 0); });
}

// 1 when float32 matrix products on a GPU are in TensorFloat-32.
int lethe_tf32() {
  try {
    return at::globalContext().allowTF32CuBLAS() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

// Autocast (mixed precision) on the thread for `device_type` (0 the CPU, 1 a GPU):
// `enabled` 1 turns it on in the dtype `dtype` (a c10::ScalarType), 0 off; the state it
// replaces goes to `saved` (enabled, dtype) for lethe_autocast_exit. As PyTorch's
// `torch.autocast` on entering: nested entries share the cast weights' cache.
int lethe_autocast_enter(int device_type, int enabled, int dtype, int* saved, char** error) {
  return lethe::guarded(error, [&] {
    const auto device = device_type == 1 ? at::kCUDA : at::kCPU;
    saved[0] = at::autocast::is_autocast_enabled(device) ? 1 : 0;
    saved[1] = static_cast<int>(at::autocast::get_autocast_dtype(device));
    at::autocast::set_autocast_dtype(device, static_cast<at::ScalarType>(dtype));
    at::autocast::set_autocast_enabled(device, enabled != 0);
    at::autocast::increment_nesting();
  });
}

// Restores the state lethe_autocast_enter saved; the outermost exit empties the cache of
// weights cast to the lower precision.
int lethe_autocast_exit(int device_type, const int* saved, char** error) {
  return lethe::guarded(error, [&] {
    const auto device = device_type == 1 ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(device, saved[0] != 0);
    at::autocast::set_autocast_dtype(device, static_cast<at::ScalarType>(saved[1]));
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
  });
}

// The least severity of libtorch's own log lines that reach stderr (0 info, 1 warning,
// 2 error, 3 fatal), as the environment variable TORCH_CPP_LOG_LEVEL sets it.
void lethe_set_cpp_log_level(int level) {
  FLAGS_caffe2_log_level = level;
}

// The bytes that libtorch's caching allocator has handed out on GPU `device`, now and
// at most since its last reset (PyTorch's `torch.cuda.memory_allocated` and
// `max_memory_allocated`); with `reset` 1 the peak starts again from now
// (`reset_peak_memory_stats`). The allocator is the one the CUDA backend registers,
// reached through c10's device-allocator interface, so nothing here links CUDA.
int lethe_gpu_memory(int device, int reset, int64_t* current, int64_t* peak, char** error) {
  return lethe::guarded(error, [&] {
    // The allocator sizes its per-GPU tables when CUDA is first initialised: before any
    // tensor is on a GPU, its statistics are not there yet.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::DeviceAllocator* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    const auto index = static_cast<c10::DeviceIndex>(device);
    const auto stats = allocator->getDeviceStats(index);
    const auto& bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    *current = bytes.current;
    *peak = bytes.peak;
    if (reset != 0) allocator->resetPeakStats(index);
  });
}

}  // extern "C"
