// Backward pass of the steady-state whitening recursion (whitening.hpp, "Whitened
// Self-Attention" eq. 9): w_0 = L^{-1} x_0, w_i = L^{-1} (x_i - M w_{i-1}).
//
// With z_i = x_i - M w_{i-1} and the cotangent dw, the adjoint runs backwards in time:
//
//     g_{T-1} = dw_{T-1},   g_i = dw_i - M^T dz_{i+1},   dz_i = L^{-T} g_i,   dx_i = dz_i,
//     dL = -sum_i dz_i w_i^T,   dM = -sum_{i >= 1} dz_i w_{i-1}^T
//
// (summed over the batch of sequences as well). Rows are vectors, so each reverse step is
// dZ_i = (dW_i - dZ_{i+1} M) L^{-1} = dW_i L^{-1} - dZ_{i+1} (M L^{-1}): one solve per
// sequence, then one GEMM per step across a chunk of sequences, OpenMP over chunks as in
// the forward. dL and dM are then two GEMMs
// over all (sequence, time) rows, split into fixed column slabs of the output so the
// summation order never depends on the thread count.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>

#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"
#include "attngeom/whitening.hpp"

namespace attngeom {

// From the forward output w (B, Tn, D) (x itself is not needed) and the cotangent dw
// (B, Tn, D), writes dx (B, Tn, D), dL and dM (D, D).
template <class T>
void whiten_backward(int64_t B, int64_t Tn, int64_t D, const T* L, const T* M, bool lower_triangular, const T* w,
                     const T* dw, T* dx, T* dL, T* dM) {
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  using Map = Eigen::Map<Mat>;
  Map(dL, D, D).setZero();
  Map(dM, D, D).setZero();
  if (B == 0 || Tn == 0 || D == 0) return;
  const detail::InverseL<T> solve(L, D, lower_triangular, /*transposed=*/false);
  const CMap Mm(M, D, D);
  // dZ_i = dW_i L^{-1} - dZ_{i+1} (M L^{-1}): each sequence's dW L^{-1} as one solve, then one
  // GEMM per reverse step (as the forward).
  Mat C = Mm;
  solve.apply(C);
  detail::for_sequence_chunks(B, [&](int64_t b0, int64_t nb) {
    detail::steady_recursion(solve, C, dw, dx, b0, nb, Tn, D, /*reverse=*/true);
  });
  // dL = -dX^T W over all rows; dM = -sum_b dX[b, 1:]^T W[b, :-1], i.e. the product of the
  // flat arrays shifted by one row minus the B - 1 pairs that straddle two sequences.
  const int64_t rows = B * Tn, slab = 32, slabs = (D + slab - 1) / slab;
  const CMap dX(dx, rows, D), W(w, rows, D);
  const bool par = parallel_worth(double(rows) * D * D * 2);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t s = 0; s < 2 * slabs; ++s) {
    const int64_t c0 = (s % slabs) * slab, width = std::min(slab, D - c0);
    if (s < slabs) {
      Map(dL, D, D).middleCols(c0, width).noalias() = -dX.transpose() * W.middleCols(c0, width);
    } else if (rows > 1) {
      auto out = Map(dM, D, D).middleCols(c0, width);
      out.noalias() = -dX.bottomRows(rows - 1).transpose() * W.topRows(rows - 1).middleCols(c0, width);
      for (int64_t b = 1; b < B; ++b)
        out.noalias() += dX.row(b * Tn).transpose() * W.row(b * Tn - 1).segment(c0, width);
    }
  }
}

}  // namespace attngeom
