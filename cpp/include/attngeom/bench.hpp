// The machine's batched GEMM ceiling, computed the way the attention kernel computes its
// blocks (Eigen row-major products, OpenMP over the batch, Eigen itself single-threaded):
// the reference the attention benchmarks divide by.
#pragma once

#include <Eigen/Core>
#include <cstdint>

#include "attngeom/types.hpp"

namespace attngeom {

// c[i] = a[i] b[i] for contiguous a (batch, rows, inner), b (batch, inner, cols),
// c (batch, rows, cols).
template <class T>
void batched_gemm(int64_t batch, int64_t rows, int64_t inner, int64_t cols, const T* a, const T* b, T* c) {
  using CMap = Eigen::Map<const RowMatrix<T>>;
  using Map = Eigen::Map<RowMatrix<T>>;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < batch; ++i) {
    Map C(c + i * rows * cols, rows, cols);
    C.noalias() = CMap(a + i * rows * inner, rows, inner) * CMap(b + i * inner * cols, inner, cols);
  }
}

}  // namespace attngeom
