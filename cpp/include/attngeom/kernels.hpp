// Kernels psi(tau, s) on the projected coordinate s = u.k (Laplace-Radon s.10.5-10.6).
//
// Each kernel is a small functor that maps a block of projected coordinates S (one row per
// query, the row's radius tau) to log psi(tau, s) in place. Working in the log domain lets
// one online log-sum-exp serve every kernel: the exponential kernel needs it (logits of any
// size), the bounded ones lose nothing by it.
//
// `check_range(tau_max, s_max)` runs before a call (s_max bounds |s| = |u.k|): it throws
// std::invalid_argument when a log-weight of the call may overflow, so
// that an input whose weights the float type cannot represent is refused instead of being
// answered with NaN or with zeros as if every key were hidden.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "attngeom/types.hpp"

#include "attngeom/stable_density.hpp"

namespace attngeom {

// psi(tau, s) = exp(tau s): softmax (eq. 53).
template <class T>
struct ExpKernel {
  static constexpr bool direct = false;
  void check_range(double tau_max, double key_max) const {
    check_bound(tau_max * key_max, std::numeric_limits<T>::max(), "the logits tau s = scale q.k",
                "rescale q, k or scale");
  }
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r) S.row(r) *= tau[r];
  }
};

// The range check of a kernel of the scaled distance z = (tau - s) / width (Gaussian, Cauchy):
// |tau - s| must be finite and z^2 too, or the log-weights `log_weights` overflow.
// The message is built only when the check fails.
template <class T>
void check_scaled_distance(double tau_max, double key_max, const char* width_name, double width,
                           const char* log_weights) {
  const double limit = std::numeric_limits<T>::max();
  check_bound(tau_max + key_max, limit, "|tau - s|", "rescale q or k");
  const double z_max = (tau_max + key_max) / width;
  if (z_max <= std::sqrt(limit)) return;
  const std::string name = width_name;
  check_bound(z_max, std::sqrt(limit), "|tau - s| / " + name + " (" + name + " = " + number(width) + ")",
              name + " is too small for these inputs, its log-weights " + log_weights + " overflow");
}

// psi(tau, s) = exp(-(tau - s)^2 / (2 sigma^2)) (eq. 54).
// Computed as -((s - tau) / sigma)^2 / 2, which holds for any sigma whose inverse is finite.
template <class T>
struct GaussianKernel {
  static constexpr bool direct = false;  // exp(-z^2 / 2) underflows: needs the running max
  double sigma;
  T inv_sigma;
  explicit GaussianKernel(double sigma_) : sigma(sigma_), inv_sigma(T(1.0 / sigma_)) {}
  void check_range(double tau_max, double key_max) const {
    check_scaled_distance<T>(tau_max, key_max, "sigma", sigma, "-(|tau - s| / sigma)^2 / 2");
  }
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      S.row(r) = ((S.row(r).array() - tau[r]) * inv_sigma).square() * T(-0.5);
  }
};

// psi(tau, s) = 1 / (1 + ((tau - s) / gamma)^2) (eq. 56).
template <class T>
struct CauchyKernel {
  T inv_gamma;
  double gamma;
  explicit CauchyKernel(double gamma_) : inv_gamma(T(1.0 / gamma_)), gamma(gamma_) {}
  void check_range(double tau_max, double key_max) const {
    check_scaled_distance<T>(tau_max, key_max, "gamma", gamma, "-log(1 + (|tau - s| / gamma)^2)");
  }
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      S.row(r) = -((S.row(r).array() - tau[r]) * inv_gamma).square().log1p();
  }
  // The weights themselves: in (0, 1], and (with check_range) never below about 1e-308, so
  // they need no shift.
  static constexpr bool direct = true;
  template <class M>
  void psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      S.row(r) = (T(1) + ((S.row(r).array() - tau[r]) * inv_gamma).square()).inverse();
  }
};

// psi(tau, s) = f_alpha(tau - s), the symmetric alpha-stable density with Fourier
// multiplier exp(-c |w|^alpha) (eq. 57).
template <class T>
struct StableKernel {
  static constexpr bool direct = false;
  std::shared_ptr<const StableDensity> density;
  StableKernel(double alpha, double c) : density(StableDensity::shared(alpha, c)) {}
  // log f is evaluated in double for any finite argument (its tail in the log domain).
  void check_range(double tau_max, double key_max) const {
    check_bound(tau_max + key_max, std::numeric_limits<T>::max(), "|tau - s|", "rescale q or k");
  }
  template <class M>
  void log_psi(M&& S, const T* tau) const {
    for (Eigen::Index r = 0; r < S.rows(); ++r)
      for (Eigen::Index j = 0; j < S.cols(); ++j)
        S(r, j) = T(density->log_density(double(tau[r]) - double(S(r, j))));
  }
};

}  // namespace attngeom
