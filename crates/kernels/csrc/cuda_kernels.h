// The entry points of liblethe_cuda.so, once `lethe_cuda_kernels_load` (expire_bias.cpp)
// has loaded it; shared by the C++ that launches them.
#pragma once

#include "expire_bias.h"
#include "expire_forget.h"

namespace lethe {

struct CudaKernels {
  lethe_cuda_bias_fn bias_forward = nullptr;
  lethe_cuda_bias_fn bias_backward = nullptr;
  lethe_cuda_forget_fn forget_plan = nullptr;
  lethe_cuda_forget_fn forget_copy = nullptr;
};

// The loaded library's entry points; throws (a TORCH_CHECK) when it is not loaded.
const CudaKernels& cuda_kernels();

}  // namespace lethe
