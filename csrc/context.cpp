// libtorch's process-wide settings that lethe's config chooses (src/device.rs).
#include <ATen/Context.h>

#include "guard.h"

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

}  // extern "C"
