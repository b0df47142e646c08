// The whitening recursion of whitened self-attention ("Whitened Self-Attention", eq. 9):
// w_0 = L^{-1} x_0, w_i = L^{-1} (x_i - M w_{i-1}), for a batch of sequences x (B, T, D)
// stored row-major; vectors are rows, so each step is W_i = (X_i - W_{i-1} M^T) L^{-T}.
//
// whiten: sequential in time, one GEMM across a chunk of sequences per step (OpenMP over
// chunks of the batch); L^{-T} is applied by a triangular solve when L is lower triangular
// (a block Cholesky factor) or through one LU factorization of L otherwise (one per step
// for time-varying factors). For one steady-state pair the solves leave the loop:
// w_i = x_i L^{-T} - w_{i-1} (M^T L^{-T}), each sequence's x L^{-T} as one solve.
// whiten_scan: the same affine recursion w_i = A w_{i-1} + b_i (A = -L^{-1} M,
// b_i = L^{-1} x_i) by a blocked scan: (1) every time block run from zero, in parallel over
// blocks; (2) the block carries chained with A^S (repeated squaring); (3) every block re-run
// from its carry, in parallel.
#pragma once

#include <Eigen/Core>
#include <Eigen/LU>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attngeom/types.hpp"
#include "attngeom/parallel.hpp"

namespace attngeom {

namespace detail {

template <class T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

// Applies R <- R L^{-T} (transposed, the forward recursion) or R <- R L^{-1} (its adjoint,
// whitening_backward.hpp) to a block of row vectors: a triangular solve when L is lower
// triangular, one LU factorization otherwise.
template <class T>
struct InverseL {
  Eigen::Map<const RowMatrix<T>> L;
  bool lower, transposed;
  Eigen::PartialPivLU<ColMat<T>> lu;  // of L (transposed) or of L^T
  InverseL(const T* l, int64_t D, bool lower_triangular, bool transposed_ = true)
      : L(l, D, D), lower(lower_triangular), transposed(transposed_) {
    if (!lower) lu.compute(transposed ? ColMat<T>(L) : ColMat<T>(L.transpose()));
  }
  template <class R_>
  void apply(R_&& R) const {
    if (R.rows() == 0) return;
    if (!lower) {
      R = lu.solve(R.transpose()).transpose();
    } else if (transposed) {
      L.transpose().template triangularView<Eigen::Upper>().template solveInPlace<Eigen::OnTheRight>(R);
    } else {
      L.template triangularView<Eigen::Lower>().template solveInPlace<Eigen::OnTheRight>(R);
    }
  }
};

template <class T>
using Strided = Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using CStrided = Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>>;

// Runs the steady-state recursion r_i <- r_i - r_{i -/+ 1} C in place over the sequences
// b0 .. b0 + nb - 1 of a (B, Tn, D) array that holds r_i = y_i S (S the solve): first each
// sequence's rows are copied from y and solved as one block (per sequence, so a row's
// result does not depend on how sequences are split among threads), then one GEMM per step
// across the chunk, forward in time or (`reverse`) backward.
template <class T>
void steady_recursion(const InverseL<T>& solve, const RowMatrix<T>& C, const T* y, T* r, int64_t b0, int64_t nb,
                      int64_t Tn, int64_t D, bool reverse) {
  for (int64_t b = b0; b < b0 + nb; ++b) {
    std::copy(y + b * Tn * D, y + (b + 1) * Tn * D, r + b * Tn * D);
    solve.apply(Eigen::Map<RowMatrix<T>>(r + b * Tn * D, Tn, D));
  }
  const Eigen::OuterStride<> stride(Tn * D);
  for (int64_t s = 1; s < Tn; ++s) {
    const int64_t i = reverse ? Tn - 1 - s : s, prev = reverse ? i + 1 : i - 1;
    Strided<T>(r + (b0 * Tn + i) * D, nb, D, stride).noalias() -=
        CStrided<T>(r + (b0 * Tn + prev) * D, nb, D, stride) * C;
  }
}

// Splits B sequences into one contiguous chunk per processor and calls f(b0, nb) for each
// chunk (sequences b0 .. b0 + nb - 1), in parallel. The split follows the processor count,
// not the thread count: a sequence's place in its chunk decides the path the GEMM takes
// for it, so a split by threads rounded differently at 1, 2 and 3 threads.
template <class F>
void for_sequence_chunks(int64_t B, F&& f) {
  const int64_t chunks = std::min<int64_t>(B, std::max(1, processors()));
  const int64_t per = (B + chunks - 1) / chunks;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b0 = c * per, nb = std::min(per, B - b0);
    if (nb > 0) f(b0, nb);
  }
}

}  // namespace detail

// With `varying`, L and M hold Tn blocks (the time-varying block Cholesky factor: step i
// uses L_i, M_i; M_0 is unused); otherwise one (D, D) pair serves every step.
template <class T>
void whiten(int64_t B, int64_t Tn, int64_t D, const T* x, const T* L, const T* M, bool lower_triangular,
            bool varying, T* w) {
  if (B == 0 || Tn == 0 || D == 0) return;
  if (!varying) {
    // Steady state: w_i = x_i L^{-T} - w_{i-1} C with C = M^T L^{-T}. The solves leave the
    // time loop (one per sequence); the sequential part is one GEMM per step.
    const detail::InverseL<T> solve(L, D, lower_triangular);
    RowMatrix<T> C = Eigen::Map<const RowMatrix<T>>(M, D, D).transpose();
    solve.apply(C);
    detail::for_sequence_chunks(B, [&](int64_t b0, int64_t nb) {
      detail::steady_recursion(solve, C, x, w, b0, nb, Tn, D, /*reverse=*/false);
    });
    return;
  }
  std::vector<detail::InverseL<T>> solvers;
  const int64_t n_factors = varying ? Tn : 1;
  solvers.reserve(n_factors);
  for (int64_t i = 0; i < n_factors; ++i) solvers.emplace_back(L + i * D * D, D, lower_triangular);
  const Eigen::OuterStride<> stride(Tn * D);
  detail::for_sequence_chunks(B, [&](int64_t b0, int64_t nb) {
    RowMatrix<T> R(nb, D);
    for (int64_t i = 0; i < Tn; ++i) {
      const int64_t f = varying ? i : 0;
      R = detail::CStrided<T>(x + (b0 * Tn + i) * D, nb, D, stride);
      if (i > 0)
        R.noalias() -= detail::CStrided<T>(w + (b0 * Tn + i - 1) * D, nb, D, stride) *
                       Eigen::Map<const RowMatrix<T>>(M + f * D * D, D, D).transpose();
      solvers[f].apply(R);
      detail::Strided<T>(w + (b0 * Tn + i) * D, nb, D, stride) = R;
    }
  });
}

// A lower bound of the largest 2-norm condition number over `count` (D, D) row-major blocks
// L: kappa_1 / D with kappa_1 = ||L||_1 ||L^{-1}||_1 (kappa_2 >= kappa_1 / D), in double
// precision; +inf when a block is singular or its inverse overflows. The filter's check
// runs on every call of a training step: one LU (a triangular inverse when L is lower
// triangular) per block costs a fraction of an SVD, single-threaded on the calling thread.
template <class T>
double condition_bound(int64_t count, int64_t D, const T* L, bool lower_triangular) {
  const double inf = std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t f = 0; f < count; ++f) {
    const detail::ColMat<double> A = Eigen::Map<const RowMatrix<T>>(L + f * D * D, D, D).template cast<double>();
    detail::ColMat<double> inv;
    if (lower_triangular) {
      if ((A.diagonal().array() == 0.0).any()) return inf;
      inv = detail::ColMat<double>::Identity(D, D);
      A.template triangularView<Eigen::Lower>().solveInPlace(inv);
    } else {
      Eigen::PartialPivLU<detail::ColMat<double>> lu(A);
      if ((lu.matrixLU().diagonal().array() == 0.0).any()) return inf;
      inv = lu.inverse();
    }
    const double kappa = A.cwiseAbs().colwise().sum().maxCoeff() * inv.cwiseAbs().colwise().sum().maxCoeff() / double(D);
    if (!std::isfinite(kappa)) return inf;
    worst = std::max(worst, kappa);
  }
  return worst;
}

template <class T>
void whiten_scan(int64_t B, int64_t Tn, int64_t D, const T* x, const T* L, const T* M, bool lower_triangular,
                 int64_t block, T* w) {
  if (B == 0 || Tn == 0 || D == 0) return;
  const detail::InverseL<T> solve(L, D, lower_triangular);
  const int64_t S = std::max<int64_t>(1, std::min(block, Tn));
  const int64_t K = (Tn + S - 1) / S;
  const Eigen::OuterStride<> stride(Tn * D);
  // Row form: w_i = w_{i-1} A^T + b_i with A^T = -M^T L^{-T}, b_i = x_i L^{-T}.
  RowMatrix<T> At = -Eigen::Map<const RowMatrix<T>>(M, D, D).transpose();
  solve.apply(At);
  // (A^T)^S by repeated squaring.
  RowMatrix<T> power = RowMatrix<T>::Identity(D, D), base = At;
  for (int64_t e = S; e > 0; e >>= 1) {
    if (e & 1) power = power * base;
    if (e > 1) base = base * base;
  }
  // Runs block k from the carry `start` (B, D), writing every step into w; returns the last.
  auto run = [&](int64_t k, const RowMatrix<T>& start, RowMatrix<T>& cur) {
    const int64_t i0 = k * S, i1 = std::min(Tn, i0 + S);
    RowMatrix<T> b(B, D);
    cur = start;
    for (int64_t i = i0; i < i1; ++i) {
      b = detail::CStrided<T>(x + i * D, B, D, stride);
      solve.apply(b);
      RowMatrix<T> next = b;
      next.noalias() += cur * At;
      cur.swap(next);
      detail::Strided<T>(w + i * D, B, D, stride) = cur;
    }
  };
  std::vector<RowMatrix<T>> last(K), carry(K);
  const RowMatrix<T> zero = RowMatrix<T>::Zero(B, D);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) run(k, zero, last[k]);  // phase 1: from zero
  carry[0] = zero;
  for (int64_t k = 1; k < K; ++k) carry[k] = last[k - 1] + carry[k - 1] * power;  // phase 2
#pragma omp parallel for schedule(static)
  for (int64_t k = 1; k < K; ++k) run(k, carry[k], last[k]);  // phase 3: from the carries
}

}  // namespace attngeom
