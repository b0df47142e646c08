// Positive random features for FAVOR+ (Laplace-Radon s.7.3; Choromanski et al., Performer):
// phi(x) = exp(W x - |x|^2 / 2) / sqrt(m), with a stabilising shift so exp never overflows.
//
// Per-row shifts (queries): one pass per block of rows, the GEMM X W^T, the norm
// correction, the shift and the exp while the block is in cache. Per-block shifts (keys)
// need the block's maximum first, so the exp is a second pass. OpenMP over batch x row blocks.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attngeom/types.hpp"
#include "attngeom/parallel.hpp"

namespace attngeom {

// Feature logits of one block of rows: L (rows, m) = root x W^T - root^2 |x|^2 / 2 for the rows
// x (rows, d) (row-major, contiguous), W (m, d). X is scratch with at least `rows` rows and d
// columns; L is any writable (rows, m) Eigen expression (a Map of the output or scratch).
// The one feature-block routine of positive_features and favor_attention.
template <class T, class Dst>
void feature_logits(const T* x, int64_t rows, int64_t d, const Eigen::Map<const RowMatrix<T>>& W, T root,
                    RowMatrix<T>& X, Dst&& L) {
  auto Xs = X.topRows(rows);
  Xs.noalias() = Eigen::Map<const RowMatrix<T>>(x, rows, d) * root;
  L.noalias() = Xs * W.transpose();
  L.colwise() -= (Xs.rowwise().squaredNorm() * T(0.5));
}

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
  // phi = exp(L - s) / sqrt(m) for one row, through an aligned scratch row: Eigen evaluates
  // the unaligned head of a row with the scalar exp and the rest with the vectorised one, so
  // exp straight into phi would make the last bit depend on where NumPy put the array.
  auto exponentiate = [&](T* out_row, T s, Eigen::Array<T, 1, Eigen::Dynamic>& scratch) {
    auto out = Map(out_row, 1, m).array();
    scratch = out;
    scratch = (scratch - s).exp() * norm;
    out = scratch;
  };
  // Pass 1: logits L = root x W^T - root^2 |x|^2 / 2 into phi and each row's max; with
  // per-row shifts the row is exponentiated right away.
#pragma omp parallel if (par)
  {
    Mat X(rows_per_block, d);
    Eigen::Array<T, 1, Eigen::Dynamic> scratch(m);
#pragma omp for schedule(static)
    for (int64_t unit = 0; unit < batch * blocks; ++unit) {
      const int64_t b = unit / blocks, i0 = (unit % blocks) * rows_per_block;
      const int64_t rows = std::min(rows_per_block, n - i0);
      Map L(phi + (b * n + i0) * m, rows, m);
      feature_logits(x.block(b) + i0 * d, rows, d, Wm, root, X, L);
      for (int64_t r = 0; r < rows; ++r) {
        T& s = shift[b * n + i0 + r];
        s = L.row(r).maxCoeff();
        if (per_row) exponentiate(&L(r, 0), s, scratch);
      }
    }
  }
  if (per_row) return;
  // Per-block shift: the maximum over the block's rows, then pass 2 exponentiates.
  for (int64_t b = 0; b < batch; ++b) {
    T* s = shift + b * n;
    std::fill(s, s + n, *std::max_element(s, s + n));
  }
#pragma omp parallel if (par)
  {
    Eigen::Array<T, 1, Eigen::Dynamic> scratch(m);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < batch * n; ++r) exponentiate(phi + r * m, shift[r], scratch);
  }
}

}  // namespace attngeom
