// Kernels psi(tau, s) on the projected coordinate s = u.k (Laplace-Radon s.10.5-10.6).
//
// Each kernel is a small functor that maps a block of projected coordinates S (one row per
// query, the row's radius tau) to log psi(tau, s) in place. Working in the log domain lets
// one online log-sum-exp serve every kernel: the exponential kernel needs it (logits of any
// size), the bounded ones lose nothing by it.
#pragma once

#include <Eigen/Core>
#include <memory>

#include "attngeom/stable_density.hpp"

namespace attngeom {

// psi(tau, s) = exp(tau s): softmax (eq. 53).
template <class T>
struct ExpKernel {
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r) S.row(r) *= tau[r];
  }
};

// psi(tau, s) = exp(-(tau - s)^2 / (2 sigma^2)) (eq. 54).
template <class T>
struct GaussianKernel {
  T inv_two_sigma2;
  explicit GaussianKernel(double sigma) : inv_two_sigma2(T(1.0 / (2.0 * sigma * sigma))) {}
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      S.row(r) = -(S.row(r).array() - tau[r]).square() * inv_two_sigma2;
  }
};

// psi(tau, s) = 1 / (1 + ((tau - s) / gamma)^2) (eq. 56).
template <class T>
struct CauchyKernel {
  T inv_gamma;
  explicit CauchyKernel(double gamma) : inv_gamma(T(1.0 / gamma)) {}
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      S.row(r) = -((S.row(r).array() - tau[r]) * inv_gamma).square().log1p();
  }
};

// psi(tau, s) = f_alpha(tau - s), the symmetric alpha-stable density with Fourier
// multiplier exp(-c |w|^alpha) (eq. 57).
template <class T>
struct StableKernel {
  std::shared_ptr<const StableDensity> density;
  StableKernel(double alpha, double c) : density(StableDensity::shared(alpha, c)) {}
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      for (Eigen::Index j = 0; j < S.cols(); ++j)
        S(r, j) = T(density->log_density(double(tau[r]) - double(S(r, j))));
  }
};

}  // namespace attngeom
