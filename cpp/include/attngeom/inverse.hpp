// Inverse Laplace for the Laplace-Radon picture (Laplace-Radon s.9, eqs. 34-37).
//
// matrix_pencil: the Hua-Sarkar matrix pencil method for exponential sums
//   f_k = sum_m c_m z_m^k,  k = 0..N-1  (vector-valued: C channels share the nodes z_m),
// batched over independent problems (OpenMP over the batch). The C Hankel matrices
// H_c[i, j] = f_c[i + j] (i < N - L, j <= L) are stacked, the SVD H = U S V^* gives the
// signal row space span(conj V_M) = span{(z_m^j)_j}, and the nodes are the eigenvalues of
// the shift pencil pinv(W[0:L]) W[1:L+1] with W = conj(V_M).
// exp_sum_weights: least-squares weights c of f(tau_k) = sum_m c_m exp(tau_k s_m) for given
// nodes s (column-pivoted QR of the exponential Vandermonde matrix).
// nnls: Lawson-Hanson active-set non-negative least squares, min |A x - b|, x >= 0.
#pragma once

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <Eigen/SVD>
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <vector>

#include "attngeom/parallel.hpp"

namespace attngeom {

using cd = std::complex<double>;
using CMatrix = Eigen::Matrix<cd, Eigen::Dynamic, Eigen::Dynamic>;

// The model order from singular values s (descending): with rtol > 0 the number of
// s_k > rtol s_0; otherwise the position of the largest log-gap s_k / s_{k+1} among the
// values above the rounding floor (max(rows, cols) eps s_0), so the noise tail of a noisy
// signal is never counted as nodes. Capped at `cap`.
inline int64_t pencil_order(const Eigen::VectorXd& s, double rtol, int64_t rows, int64_t cap) {
  const int64_t K = s.size();
  if (K == 0 || !(s(0) > 0)) return 0;
  const double eps = std::numeric_limits<double>::epsilon();
  const double floor = (rtol > 0 ? rtol : double(std::max<int64_t>(rows, K)) * eps) * s(0);
  int64_t r = 0;
  while (r < K && s(r) > floor) ++r;
  if (rtol > 0) return std::min(r, cap);
  int64_t best = std::min<int64_t>(r, 1);
  double best_gap = -1;
  for (int64_t k = 1; k <= std::min(r, K - 1); ++k) {
    const double gap = std::log(s(k - 1)) - std::log(std::max(s(k), std::numeric_limits<double>::min()));
    if (gap > best_gap) {
      best_gap = gap;
      best = k;
    }
  }
  return std::min(best, cap);
}

// f: (B, C, N) row-major. Writes z (B, L) (first order[b] entries valid, rest 0), order (B)
// and the singular values (B, min(C (N - L), L + 1)). order_in > 0 fixes the order.
inline void matrix_pencil(int64_t B, int64_t C, int64_t N, const cd* f, int64_t L, int64_t order_in, double rtol,
                          cd* z_out, int64_t* order_out, double* sv_out) {
  const int64_t rows = C * (N - L), cols = L + 1, K = std::min(rows, cols);
  FirstException errors;  // the Hankel matrix and its SVD: a failed allocation must reach Python
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) errors.run([&] {
    CMatrix H(rows, cols);
    for (int64_t c = 0; c < C; ++c) {
      const cd* fc = f + (b * C + c) * N;
      for (int64_t i = 0; i < N - L; ++i)
        for (int64_t j = 0; j <= L; ++j) H(c * (N - L) + i, j) = fc[i + j];
    }
    Eigen::BDCSVD<CMatrix> svd(H, Eigen::ComputeThinV);
    const Eigen::VectorXd s = svd.singularValues();
    for (int64_t k = 0; k < K; ++k) sv_out[b * K + k] = s(k);
    const int64_t M = order_in > 0 ? std::min<int64_t>(order_in, std::min(K, L)) : pencil_order(s, rtol, rows, L);
    order_out[b] = M;
    cd* z = z_out + b * L;
    std::fill(z, z + L, cd(0));
    if (M == 0) return;
    const CMatrix W = svd.matrixV().leftCols(M).conjugate();
    const CMatrix F = W.topRows(L).colPivHouseholderQr().solve(W.bottomRows(L));
    Eigen::ComplexEigenSolver<CMatrix> es(F, false);
    for (int64_t m = 0; m < M; ++m) z[m] = es.eigenvalues()(m);
  });
  errors.rethrow();
}

// tau (N), s (B, Mmax) with order[b] valid nodes, f (B, C, N) -> w (B, Mmax, C) (0 beyond order).
inline void exp_sum_weights(int64_t B, int64_t C, int64_t N, int64_t Mmax, const cd* tau, const cd* s,
                            const int64_t* order, const cd* f, cd* w) {
  FirstException errors;
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) errors.run([&] {
    const int64_t M = order[b];
    std::fill(w + b * Mmax * C, w + (b + 1) * Mmax * C, cd(0));
    if (M == 0) return;
    CMatrix V(N, M), R(N, C);
    for (int64_t k = 0; k < N; ++k) {
      for (int64_t m = 0; m < M; ++m) V(k, m) = std::exp(tau[k] * s[b * Mmax + m]);
      for (int64_t c = 0; c < C; ++c) R(k, c) = f[(b * C + c) * N + k];
    }
    const CMatrix X = V.colPivHouseholderQr().solve(R);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c) w[(b * Mmax + m) * C + c] = X(m, c);
  });
  errors.rethrow();
}

// Lawson-Hanson NNLS for A (m, n) row-major; returns the iteration count (negative when the
// iteration limit was reached).
inline int64_t nnls(int64_t m, int64_t n, const double* a, const double* b, double* x_out, int64_t max_iter) {
  using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMat> A(a, m, n);
  const Eigen::Map<const Eigen::VectorXd> y(b, m);
  Eigen::VectorXd x = Eigen::VectorXd::Zero(n), z(n);
  std::vector<char> passive(n, 0);
  // Scale-free tolerances: the gradient A^T (b - A x) is measured against |A| |b|, and a
  // variable leaves the passive set when it falls to rounding level relative to max |x|.
  const double eps = std::numeric_limits<double>::epsilon();
  const double tol = 10 * eps * std::max(m, n) * A.cwiseAbs().colwise().sum().maxCoeff() * y.cwiseAbs().maxCoeff();
  auto solve_passive = [&](Eigen::VectorXd& out) {
    std::vector<int64_t> idx;
    for (int64_t j = 0; j < n; ++j)
      if (passive[j]) idx.push_back(j);
    Eigen::MatrixXd Ap(m, idx.size());
    for (size_t t = 0; t < idx.size(); ++t) Ap.col(t) = A.col(idx[t]);
    const Eigen::VectorXd zp = Ap.householderQr().solve(y);  // no rank truncation: a truncated column would cycle
    out.setZero();
    for (size_t t = 0; t < idx.size(); ++t) out(idx[t]) = zp(t);
  };
  // A variable whose unconstrained solution is not positive right after it enters (a
  // rounding-level gradient) is blocked until x next changes, the usual guard against cycling.
  std::vector<char> blocked(n, 0);
  int64_t iter = 0;
  while (true) {
    const Eigen::VectorXd w = A.transpose() * (y - A * x);
    int64_t j_max = -1;
    double w_max = tol;
    for (int64_t j = 0; j < n; ++j)
      if (!passive[j] && !blocked[j] && w(j) > w_max) {
        w_max = w(j);
        j_max = j;
      }
    if (j_max < 0) {
      Eigen::Map<Eigen::VectorXd>(x_out, n) = x;
      return iter;
    }
    passive[j_max] = 1;
    bool first = true;
    while (true) {
      if (++iter > max_iter) {
        Eigen::Map<Eigen::VectorXd>(x_out, n) = x;
        return -iter;
      }
      solve_passive(z);
      if (first && z(j_max) <= 0) {
        passive[j_max] = 0;
        blocked[j_max] = 1;
        break;
      }
      first = false;
      double alpha = 1;
      bool feasible = true;
      for (int64_t j = 0; j < n; ++j)
        if (passive[j] && z(j) <= 0) {
          feasible = false;
          alpha = std::min(alpha, x(j) / (x(j) - z(j)));
        }
      if (feasible) {
        x = z;
        std::fill(blocked.begin(), blocked.end(), 0);
        break;
      }
      x += alpha * (z - x);
      const double x_floor = 10 * eps * x.cwiseAbs().maxCoeff();
      for (int64_t j = 0; j < n; ++j)
        if (passive[j] && x(j) <= x_floor) {
          passive[j] = 0;
          x(j) = 0;
        }
    }
  }
}

}  // namespace attngeom
