// libtorch's profiler for `lethe bench --trace`: every libtorch operation of the steps
// between start and stop, forward and backward (each autograd node of the backward pass
// with the operations it ran), written as a Chrome trace (JSON) when it stops. This is
// the legacy CPU profiler (torch/csrc/autograd/profiler_legacy.h), which writes the
// file itself; on a GPU its times are the CPU's (kernel launches), not the kernels'.

#include <torch/csrc/autograd/profiler_legacy.h>

#include <string>

#include "guard.h"
#include "lethe.h"

using torch::autograd::profiler::RecordProfile;

extern "C" {

// Starts recording on this thread (and the autograd engine's CPU work it starts) into
// `path`, written by `lethe_trace_stop`. Writes the recorder's handle to `out`.
int lethe_trace_start(const char* path, void** out, char** error) {
  return lethe::guarded(error, [&] { *out = new RecordProfile(std::string(path)); });
}

// Stops the recording `handle` and writes its file.
int lethe_trace_stop(void* handle, char** error) {
  return lethe::guarded(error, [&] { delete static_cast<RecordProfile*>(handle); });
}

}  // extern "C"
