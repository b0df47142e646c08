// Positive random features for FAVOR+ (Laplace-Radon s.7.3; Choromanski et al., Performer):
// phi(x) = exp(W x - |x|^2 / 2) / sqrt(m), with a stabilising shift so exp never overflows.
//
// One pass per block of rows: the GEMM X W^T, the norm correction, the shift and the exp,
// without the (n, m) logits ever leaving the cache. OpenMP over batch x row blocks.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attngeom/types.hpp"
#include "attngeom/parallel.hpp"

namespace attngeom {

// x: stack of (n, d) blocks, scaled by `root` on the fly; W: (m, d) row-major.
// phi: (batch, n, m) output. shift: (batch, n) output, the log of the factor removed from
// each row: its own maximum (per_row) or the maximum over the whole (n, m) block (per
// block: every row of a block gets the same value). Unshifted features are phi * exp(shift).
template <class T>
void positive_features(int64_t batch, const Stack<T>& x, const T* W, int64_t m, T root, bool per_row, T* phi,
                       T* shift) {
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  using Map = Eigen::Map<Mat>;
  const int64_t n = x.rows, d = x.cols;
  if (n == 0 || m == 0) return;
  const CMap Wm(W, m, d);
  const T norm = T(1) / std::sqrt(T(m));
  const int64_t rows_per_block = 64, blocks = (n + rows_per_block - 1) / rows_per_block;
  const bool par = parallel_worth(double(batch) * n * m * d);
  // Pass 1: logits L = root x W^T - root^2 |x|^2 / 2 into phi, with each row's max.
#pragma omp parallel if (par)
  {
    Mat X(rows_per_block, d);
#pragma omp for schedule(static)
    for (int64_t unit = 0; unit < batch * blocks; ++unit) {
      const int64_t b = unit / blocks, i0 = (unit % blocks) * rows_per_block;
      const int64_t rows = std::min(rows_per_block, n - i0);
      auto Xs = X.topRows(rows);
      Xs.noalias() = CMap(x.block(b) + i0 * d, rows, d) * root;
      Map L(phi + (b * n + i0) * m, rows, m);
      L.noalias() = Xs * Wm.transpose();
      L.colwise() -= (Xs.rowwise().squaredNorm() * T(0.5));
      for (int64_t r = 0; r < rows; ++r) shift[b * n + i0 + r] = L.row(r).maxCoeff();
    }
  }
  // Per-block shift: the maximum over the block's rows.
  if (!per_row) {
    for (int64_t b = 0; b < batch; ++b) {
      T* s = shift + b * n;
      std::fill(s, s + n, *std::max_element(s, s + n));
    }
  }
  // Pass 2: phi = exp(L - shift) / sqrt(m), through an aligned scratch row: Eigen evaluates
  // the unaligned head of a row with the scalar exp and the rest with the vectorised one, so
  // exp straight into phi would make the last bit depend on where NumPy put the array.
#pragma omp parallel if (par)
  {
    Eigen::Array<T, 1, Eigen::Dynamic> row(m);
#pragma omp for schedule(static)
    for (int64_t unit = 0; unit < batch * blocks; ++unit) {
      const int64_t b = unit / blocks, i0 = (unit % blocks) * rows_per_block;
      const int64_t rows = std::min(rows_per_block, n - i0);
      for (int64_t r = 0; r < rows; ++r) {
        auto out = Map(phi + (b * n + i0 + r) * m, 1, m).array();
        row = out;
        row = (row - shift[b * n + i0 + r]).exp() * norm;
        out = row;
      }
    }
  }
}

}  // namespace attngeom
