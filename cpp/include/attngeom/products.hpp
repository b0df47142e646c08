// Float products of a forward pass: C (m, n) = A (m, k) B through Eigen's packed GEMM,
// compiled for each instruction-set level (its AVX-512 kernels where the CPU has them, where
// NumPy's OpenBLAS runs its AVX2 Haswell kernels on AMD Zen 4 and 5: 1.75x the float32
// throughput measured on Zen 5). B is given as a linear layer stores its weight, (n, k) rows
// (B = W^T), or as (k, n) rows. One thread: the caller splits the rows or the columns (units
// fixed by the processor count), so an entry depends on the shapes and its operands only.
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "attngeom/types.hpp"

namespace attngeom {

template <class T>
void matmul(int64_t m, int64_t n, int64_t k, const T* A, const T* B, bool b_rows_are_outputs, T* C) {
  using Mat = RowMatrix<T>;
  const Eigen::Map<const Mat> a(A, m, k);
  Eigen::Map<Mat> c(C, m, n);
  if (b_rows_are_outputs) {
    c.noalias() = a * Eigen::Map<const Mat>(B, n, k).transpose();
  } else {
    c.noalias() = a * Eigen::Map<const Mat>(B, k, n);
  }
}

}  // namespace attngeom
