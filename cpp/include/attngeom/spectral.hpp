// Spectral kernels: batched thin SVDs and the SVD of a low-rank product A B computed from
// its factors (Laplace-Radon s.5.3, s.6, app. B; the W_OV / W_QK spectra of the notes).
//
// Both loop over a batch of independent matrices (heads, sequences) with one OpenMP loop;
// each matrix is decomposed by single-threaded Eigen, so results do not depend on the
// thread count. Singular values are returned in descending order.
#pragma once

#include <Eigen/Core>
#include <Eigen/QR>
#include <Eigen/SVD>
#include <algorithm>
#include <cstdint>

#include "attngeom/types.hpp"

namespace attngeom {

// Outputs of a batch of thin SVDs M = U diag(S) Vh with k = min(rows, cols) (factored:
// k = min(m, r, p)). U (batch, rows, k), S (batch, k), Vh (batch, k, cols), all row-major;
// U and Vh may be null (singular values only).
template <class T>
struct SvdOutput {
  T* s = nullptr;
  T* u = nullptr;
  T* vh = nullptr;
};

namespace detail {

template <class T>
using ColMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;

// Thin SVD of one matrix into the output slots of batch element b.
template <class T, class M>
void svd_into(const M& a, int64_t b, const SvdOutput<T>& out) {
  const int64_t rows = a.rows(), cols = a.cols(), k = std::min(rows, cols);
  if (k == 0) return;
  const bool vectors = out.u != nullptr;
  Eigen::BDCSVD<ColMatrix<T>> svd(a, vectors ? (Eigen::ComputeThinU | Eigen::ComputeThinV) : 0);
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(out.s + b * k, k) = svd.singularValues();
  if (vectors) {
    Eigen::Map<RowMatrix<T>>(out.u + b * rows * k, rows, k) = svd.matrixU();
    Eigen::Map<RowMatrix<T>>(out.vh + b * k * cols, k, cols) = svd.matrixV().transpose();
  }
}

// Householder QR of a (rows, cols) matrix and its factor R (min(rows, cols), cols), upper
// trapezoidal: a = Q R with Q's first min(rows, cols) columns orthonormal.
template <class T, class M>
void thin_qr(const M& a, Eigen::HouseholderQR<ColMatrix<T>>& qr, ColMatrix<T>& R) {
  qr.compute(a);
  R = qr.matrixQR().topRows(std::min(a.rows(), a.cols())).template triangularView<Eigen::Upper>();
}

// Q X for the thin Q of a QR (rows, k) and X (k, c): the Householder reflectors are applied
// to X padded with zeros, so Q is never formed.
template <class T, class X>
ColMatrix<T> apply_q(const Eigen::HouseholderQR<ColMatrix<T>>& qr, const X& x) {
  ColMatrix<T> out = ColMatrix<T>::Zero(qr.rows(), x.cols());
  out.topRows(x.rows()) = x;
  out.applyOnTheLeft(qr.householderQ());
  return out;
}

}  // namespace detail

// Thin SVDs of the batch of (rows, cols) matrices a.block(b), b < batch.
template <class T>
void batched_svd(int64_t batch, const Stack<T>& a, const SvdOutput<T>& out) {
  using CMap = Eigen::Map<const RowMatrix<T>>;
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < batch; ++b) detail::svd_into(CMap(a.block(b), a.rows, a.cols), b, out);
}

// SVD of each product A B (A (m, r), B (r, p)) without forming it: thin QR factorizations
// A = Qa Ra and B^T = Qb Rb, the SVD of the small core Ra Rb^T = Uc S Vc^T, then
// U = Qa Uc and Vh = (Qb Vc)^T. Cost O((m + p) r^2) instead of O(m p min(m, p)); the QR
// step is backward stable, so small singular values of the product are kept to working
// precision relative to |A| |B|.
template <class T>
void factored_svd(int64_t batch, const Stack<T>& a, const Stack<T>& b, const SvdOutput<T>& out) {
  using CMap = Eigen::Map<const RowMatrix<T>>;
  const int64_t m = a.rows, r = a.cols, p = b.cols;
  const int64_t ka = std::min(m, r), kb = std::min(p, r), k = std::min(ka, kb);
  if (k == 0) return;
#pragma omp parallel
  {
    Eigen::HouseholderQR<detail::ColMatrix<T>> qa, qb;
    detail::ColMatrix<T> Ra, Rb, core;
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < batch; ++i) {
      detail::thin_qr<T>(CMap(a.block(i), m, r), qa, Ra);
      detail::thin_qr<T>(CMap(b.block(i), r, p).transpose(), qb, Rb);
      core.noalias() = Ra * Rb.transpose();
      Eigen::BDCSVD<detail::ColMatrix<T>> svd(core, out.u ? (Eigen::ComputeThinU | Eigen::ComputeThinV) : 0);
      Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(out.s + i * k, k) = svd.singularValues();
      if (out.u) {
        Eigen::Map<RowMatrix<T>>(out.u + i * m * k, m, k) = detail::apply_q(qa, svd.matrixU());
        Eigen::Map<RowMatrix<T>>(out.vh + i * k * p, k, p) = detail::apply_q(qb, svd.matrixV()).transpose();
      }
    }
  }
}

}  // namespace attngeom
