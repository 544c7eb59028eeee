// Row-major matrix products through the Fortran BLAS that libtorch's CPU library exports
// (MKL's `sgemm_` and `dgemm_` on x86), for the kernels that multiply many small
// matrices, one stream at a time, inside a parallel loop: csrc/expire_attend.cpp's ragged
// attention and csrc/cache_grad.cpp's ragged projection. Called from within
// `at::parallel_for`, MKL runs each product on the calling thread.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

// Weak: a CPU library without them leaves these null, and `gemm_rows` then takes
// libtorch's matrix product over the same memory.
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
                       const float*, const int*, const float*, float*, const int*) __attribute__((weak));
extern "C" void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
                       const double*, const int*, const double*, double*, const int*) __attribute__((weak));

namespace lethe {

// Row-major c (m x n) = op(a) op(b) + beta c, through the column-major BLAS as
// c^T = op(b)^T op(a)^T; `beta` is 0 (c is overwritten) or 1 (accumulated into). Without
// `blas` (the tests' way to run the fallback) or where the library has no such symbol,
// libtorch's matrix product over the same memory.
template <typename T>
void gemm_rows(bool blas, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
               int64_t ldb, T* c, int64_t ldc, bool accumulate = false) {
  const char op_a = ta ? 'T' : 'N', op_b = tb ? 'T' : 'N';
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k), la = static_cast<int>(lda),
            lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  const T one = T(1), beta = accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>) {
    if (blas && sgemm_ != nullptr) return sgemm_(&op_b, &op_a, &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
  } else {
    if (blas && dgemm_ != nullptr) return dgemm_(&op_b, &op_a, &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
  }
  const auto kind = c10::CppTypeToScalarType<T>::value;
  const auto matrix = [&](const T* x, int64_t rows, int64_t cols, int64_t ld, bool t) {
    auto mat = at::from_blob(const_cast<T*>(x), {rows, cols}, {ld, 1}, at::TensorOptions(kind));
    return t ? mat.t() : mat;
  };
  auto out = at::from_blob(c, {m, n}, {ldc, 1}, at::TensorOptions(kind));
  const auto pa = matrix(a, ta ? k : m, ta ? m : k, lda, ta), pb = matrix(b, tb ? n : k, tb ? k : n, ldb, tb);
  if (accumulate) {
    out.addmm_(pa, pb);
  } else {
    at::mm_out(out, pa, pb);
  }
}

}  // namespace lethe
