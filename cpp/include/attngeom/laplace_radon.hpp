// The Laplace-Radon picture of one head (Laplace-Radon s.4, s.9, s.10): the transforms
// Z(u, tau) and N(u, tau) at complex tau, and the Gibbs-reweighted statistics of the
// projected coordinate S = u.k (cumulants, key covariance).
//
// Real-tau transforms and normalised outputs come from ridge_attention (attention.hpp),
// which returns y = N / Z and log Z; this header holds what that driver cannot express.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>

#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

// Tilt u_i = q_i / |q_i| and radius tau_i = scale |q_i| of each row of q (rows, d), row-major
// (Laplace-Radon eq. 9, 15-16). A zero row gets u = 0, tau = 0. Each row is divided by its
// largest entry before the norm (as hypot does), so |q_i| is exact to rounding for any
// finite q: no square overflows or underflows. Throws std::invalid_argument when a radius
// scale |q_i| is beyond T's range. OpenMP over rows.
template <class T>
void tilt_radius(int64_t rows, int64_t d, const T* q, double scale, T* u, T* tau) {
  using Row = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;
  using Out = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
  const double limit = std::numeric_limits<T>::max();
  double worst = 0;  // the largest radius that overflowed (0 if none)
#pragma omp parallel for schedule(static) reduction(max : worst) if (parallel_worth(double(rows) * d * 4))
  for (int64_t i = 0; i < rows; ++i) {
    const Row x(q + i * d, d);
    Out w(u + i * d, d);
    const T big = d ? x.abs().maxCoeff() : T(0);
    if (!(big > T(0))) {
      w.setZero();
      tau[i] = T(0);
      continue;
    }
    const T len = (x / big).matrix().norm();  // in [1, sqrt(d)]
    const T norm = big * len;
    if (std::isfinite(norm) && norm >= std::numeric_limits<T>::min())
      w = x / norm;
    else
      w = (x / big) / len;
    const double radius = double(big) * std::abs(scale) * double(len);
    if (radius > limit) worst = std::max(worst, radius);
    tau[i] = T(double(big) * scale * double(len));
  }
  check_bound(worst, limit, "the radius scale |q|", "rescale q or scale");
}

namespace detail {

// For a block of query rows (tilts U, radii tau) fills S with s = u.k over all keys and
// P with the normalised Gibbs weights p_i proportional to psi(tau, s_i).
template <class T, class Kernel, class QB, class KB>
void gibbs_rows(const QB& U, const KB& K, const T* tau_rows, const Kernel& kernel, RowMatrix<T>& S,
                RowMatrix<T>& P) {
  S.noalias() = U * K.transpose();
  P = S;
  kernel.log_psi(P, tau_rows);
  for (Eigen::Index r = 0; r < P.rows(); ++r) {
    const T mx = P.row(r).maxCoeff();
    P.row(r) = (P.row(r).array() - mx).exp();
    P.row(r) /= P.row(r).sum();
  }
}

}  // namespace detail

// Cumulants kappa_1..kappa_order (order <= 4) of S = u.k under the Gibbs weights
// p_i proportional to psi(tau, s_i). For the exponential kernel these are the derivatives
// d^m/dtau^m log Z(u, tau) (eq. 51). Output: (batch, n_q, order).
template <class T, class Kernel>
void projected_cumulants(int64_t batch, const Stack<T>& u, const T* tau, const int64_t* tau_index,
                         const Stack<T>& k, const Kernel& kernel, int order, T* out, int64_t block = 16) {
  const int64_t n_q = u.rows, d_k = u.cols, n_k = k.rows;
  const int64_t q_blocks = (n_q + block - 1) / block;
  using CMap = Eigen::Map<const RowMatrix<T>>;
#pragma omp parallel if (parallel_worth(double(batch) * n_q * n_k * d_k))
  {
    RowMatrix<T> S, P;
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * q_blocks; ++unit) {
      const int64_t b = unit / q_blocks, i0 = (unit % q_blocks) * block, rows = std::min(block, n_q - i0);
      const T* tau_rows = tau + (tau_index ? tau_index[b] : b) * n_q + i0;
      S.resize(rows, n_k);
      P.resize(rows, n_k);
      detail::gibbs_rows(CMap(u.block(b) + i0 * d_k, rows, d_k), CMap(k.block(b), n_k, d_k), tau_rows, kernel, S, P);
      for (int64_t r = 0; r < rows; ++r) {
        T* o = out + (b * n_q + i0 + r) * order;
        const T mean = (P.row(r).array() * S.row(r).array()).sum();
        o[0] = mean;
        if (order < 2) continue;
        const auto c = (S.row(r).array() - mean).eval();
        const auto p = P.row(r).array();
        const T m2 = (p * c.square()).sum();
        o[1] = m2;
        if (order >= 3) o[2] = (p * c.cube()).sum();
        if (order >= 4) o[3] = (p * c.square().square()).sum() - T(3) * m2 * m2;
      }
    }
  }
}

// Mean and covariance of the keys under the Gibbs weights (eq. 48): E_p[k] (batch, n_q, d_k)
// and Cov_p(k) (batch, n_q, d_k, d_k). With u = q, tau = scale and the exponential kernel
// these are the gradient / scale and Hessian / scale^2 of log Z(q) (eq. 48-49).
template <class T, class Kernel>
void gibbs_key_moments(int64_t batch, const Stack<T>& u, const T* tau, const int64_t* tau_index, const Stack<T>& k,
                       const Kernel& kernel, T* mean, T* cov, int64_t block = 16) {
  const int64_t n_q = u.rows, d_k = u.cols, n_k = k.rows;
  const int64_t q_blocks = (n_q + block - 1) / block;
  using CMap = Eigen::Map<const RowMatrix<T>>;
#pragma omp parallel if (parallel_worth(double(batch) * n_q * n_k * d_k))
  {
    RowMatrix<T> S, P, Kc;
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * q_blocks; ++unit) {
      const int64_t b = unit / q_blocks, i0 = (unit % q_blocks) * block, rows = std::min(block, n_q - i0);
      const T* tau_rows = tau + (tau_index ? tau_index[b] : b) * n_q + i0;
      const CMap K(k.block(b), n_k, d_k);
      S.resize(rows, n_k);
      P.resize(rows, n_k);
      detail::gibbs_rows(CMap(u.block(b) + i0 * d_k, rows, d_k), K, tau_rows, kernel, S, P);
      for (int64_t r = 0; r < rows; ++r) {
        Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> mu(mean + (b * n_q + i0 + r) * d_k, d_k);
        mu.noalias() = P.row(r) * K;
        if (!cov) continue;
        Kc = K.rowwise() - mu;
        Eigen::Map<RowMatrix<T>> C(cov + (b * n_q + i0 + r) * d_k * d_k, d_k, d_k);
        C.noalias() = Kc.transpose() * (P.row(r).transpose().asDiagonal() * Kc);
      }
    }
  }
}

// Z(u, tau) = sum_i exp(tau s_i) and N(u, tau) = sum_i exp(tau s_i) v_i at complex tau
// (eq. 34; at imaginary tau the characteristic function of the projected measure), in
// shifted form: Z = exp(shift) * Zs, N = exp(shift) * Ns with shift = max_i Re(tau) s_i.
// Outputs: shift (batch, n_q), Zs (batch, n_q), Ns (batch, n_q, d_v) (d_v may be 0).
template <class T>
void laplace_transform_complex(int64_t batch, const Stack<T>& u, const std::complex<T>* tau,
                               const int64_t* tau_index, const Stack<T>& k, const Stack<T>& v, T* shift,
                               std::complex<T>* Zs, std::complex<T>* Ns, int64_t block = 32) {
  const int64_t n_q = u.rows, d_k = u.cols, n_k = k.rows, d_v = v.cols;
  const int64_t q_blocks = (n_q + block - 1) / block;
  using CMap = Eigen::Map<const RowMatrix<T>>;
#pragma omp parallel if (parallel_worth(double(batch) * n_q * n_k * (d_k + 2 * d_v)))
  {
    RowMatrix<T> S, Wr, Wi, Nr, Ni;
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * q_blocks; ++unit) {
      const int64_t b = unit / q_blocks, i0 = (unit % q_blocks) * block, rows = std::min(block, n_q - i0);
      const std::complex<T>* tr = tau + (tau_index ? tau_index[b] : b) * n_q + i0;
      S.noalias() = CMap(u.block(b) + i0 * d_k, rows, d_k) * CMap(k.block(b), n_k, d_k).transpose();
      Wr.resize(rows, n_k);
      Wi.resize(rows, n_k);
      for (int64_t r = 0; r < rows; ++r) {
        // |exp(tau s)| = exp(a s) relative to its largest, exp(a (s - s_top)): the exponent is
        // formed from the exact-ish difference s - s_top, so the top term is exactly 1 and the
        // others carry a relative error. a s - a s_top instead (fused into one FMA by the
        // compiler) is off by the rounding of a s: exp(+-8192) at |a s| ~ 1e20.
        const T a = tr[r].real(), w = tr[r].imag();
        const T top = a >= T(0) ? S.row(r).maxCoeff() : S.row(r).minCoeff();
        const T mx = a * top;
        const auto mag = ((S.row(r).array() - top) * a).exp().eval();
        const auto ph = (S.row(r).array() * w).eval();
        Wr.row(r) = mag * ph.cos();
        Wi.row(r) = mag * ph.sin();
        shift[b * n_q + i0 + r] = mx;
        Zs[b * n_q + i0 + r] = std::complex<T>(Wr.row(r).sum(), Wi.row(r).sum());
      }
      if (d_v > 0) {
        const CMap V(v.block(b), n_k, d_v);
        Nr.noalias() = Wr * V;
        Ni.noalias() = Wi * V;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < d_v; ++c) Ns[(b * n_q + i0 + r) * d_v + c] = std::complex<T>(Nr(r, c), Ni(r, c));
      }
    }
  }
}

}  // namespace attngeom
