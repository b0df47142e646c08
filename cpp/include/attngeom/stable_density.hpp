// The symmetric alpha-stable density (Laplace-Radon eq. 57): the kernel with Fourier
// multiplier exp(-c |w|^alpha), supported for 0.1 <= alpha <= 2 (see kAlphaMin),
//
//     f(x) = (1/pi) int_0^inf exp(-c w^alpha) cos(w x) dw,   f_c(x) = c^(-1/alpha) f_1(x c^(-1/alpha)).
//
// alpha = 2 is the Gaussian exp(-x^2 / (4c)) / (2 sqrt(pi c)), alpha = 1 the Cauchy density
// c / (pi (c^2 + x^2)).
//
// Construction builds a table of log f_1 for the given alpha: piecewise Chebyshev
// interpolation in z = asinh(x / h) (h = 1 / f_1(0), the width of the core; 1e-3 h for
// alpha < 1) of values computed by the small-x or tail series where they converge to full
// precision and otherwise by Zolotarev's integral representation (Nolan 1997), a finite integral of a positive
// function, so that small densities keep their relative accuracy; within 0.05 of alpha = 1,
// where that representation degenerates, by the Fourier integral itself. Beyond the table the
// power-law tail series f_1(x) = (1/pi) sum_k (-1)^(k+1) Gamma(alpha k + 1) / k!
// sin(k pi alpha / 2) x^-(alpha k + 1) takes over (convergent for alpha < 1, asymptotic for
// alpha > 1); the table ends where that series matches the integral to 1e-13. Exceptions:
// alpha = 1 exactly is the Cauchy law, whose Zolotarev representation degenerates to the
// closed form; alpha = 2 has no power-law tail and uses the exact Gaussian log-density
// beyond the table.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace attngeom {

class StableDensity {
 public:
  // Throws std::invalid_argument naming alpha or c when alpha is not in [0.1, 2] or c <= 0.
  explicit StableDensity(double alpha, double c = 1.0);
  // f(x); const and allocation-free, safe to call from many threads.
  double operator()(double x) const;
  // log f(x), accurate where f underflows.
  double log_density(double x) const;
  // out[i] = f(x[i]) (or log f(x[i])) for i < n; OpenMP over i.
  void evaluate(const double* x, int64_t n, bool log, double* out) const;
  // d/dx log f(x): the exact derivative of what log_density evaluates (the same Chebyshev
  // table, tail series or closed form), so values and gradients are consistent.
  double d_log_density(double x) const;
  // A shared instance for (alpha, c): tables are built once per process (at most 64 kept).
  static std::shared_ptr<const StableDensity> shared(double alpha, double c = 1.0);

  // Reference evaluation of log f_1 (c = 1) straight from the integral representation,
  // without the table (slow; for tests and the table itself).
  static double log_density_direct(double alpha, double x);
  // Zolotarev's integral alone (alpha != 1, x > 0).
  static double log_density_integral(double alpha, double x);

 private:
  double log_f1(double x) const;  // x >= 0, c = 1
  double d_log_f1(double x) const;  // its derivative

  double alpha_, c_;
  double log_scale_;  // log c / alpha
  double inv_scale_;  // c^(-1/alpha)
  double h_, z_unit_, z_max_, x_max_, log_f0_;
  int pieces_ = 0;
  std::vector<double> coef_;  // pieces_ x (kDegree + 1) Chebyshev coefficients
};

}  // namespace attngeom
