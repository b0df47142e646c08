#include "attngeom/stable_density.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace attngeom {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int kNodes = 17;         // Chebyshev nodes per piece
constexpr double kPieceWidth = 0.125;  // in z = asinh(x / h)
// Below this alpha the table loses accuracy (2e-10 at 0.07, NaN at 0.03) and f_1(0) =
// Gamma(1 + 1 / alpha) / pi overflows near 0.006: the supported range is [kAlphaMin, 2].
constexpr double kAlphaMin = 0.1;
// Within this distance of alpha = 1 the Fourier integral replaces Zolotarev's where the
// series fail.
constexpr double kFourierBand = 0.05;

// Adaptive Gauss-Kronrod (7-15) on [a, b], relative tolerance on the total.
template <class F>
double integrate(F&& f, double a, double b, double rtol, double atol) {
  static const double xk[8] = {0.991455371120812639, 0.949107912342758525, 0.864864423359769073,
                               0.741531185599394440, 0.586087235467691130, 0.405845151377397167,
                               0.207784955007898468, 0.0};
  static const double wk[8] = {0.022935322010529225, 0.063092092629978553, 0.104790010322250184,
                               0.140653259715525919, 0.169004726639267903, 0.190350578064785410,
                               0.204432940075298892, 0.209482141084727828};
  static const double wg[4] = {0.129484966168869693, 0.279705391489276668, 0.381830050505118945,
                               0.417959183673469388};
  struct Seg {
    double a, b, val, err;
  };
  auto rule = [&](double lo, double hi) {
    const double c = 0.5 * (lo + hi), h = 0.5 * (hi - lo);
    double fc = f(c), k = wk[7] * fc, g = wg[3] * fc;
    for (int j = 0; j < 7; ++j) {
      const double f1 = f(c - h * xk[j]), f2 = f(c + h * xk[j]);
      k += wk[j] * (f1 + f2);
      if (j % 2 == 1) g += wg[j / 2] * (f1 + f2);
    }
    return Seg{lo, hi, k * h, std::abs((k - g) * h)};
  };
  std::vector<Seg> segs{rule(a, b)};
  for (int iter = 0; iter < 300; ++iter) {
    double total = 0, err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
      total += segs[i].val;
      err += segs[i].err;
      if (segs[i].err > segs[worst].err) worst = i;
    }
    if (err <= std::max(rtol * std::abs(total), atol) || err < 1e-300) return total;
    const Seg s = segs[worst];
    const double mid = 0.5 * (s.a + s.b);
    segs[worst] = rule(s.a, mid);
    segs.push_back(rule(mid, s.b));
  }
  double total = 0;
  for (const auto& s : segs) total += s.val;
  return total;
}

// log g(theta) for Zolotarev's representation with beta = 0, alpha != 1, x > 0:
// g = x^zeta V(theta), V = (cos t / sin(alpha t))^zeta cos((alpha - 1) t) / cos t, zeta = alpha / (alpha - 1),
// f(x) = alpha / (pi |alpha - 1| x) int_0^{pi/2} g exp(-g) dtheta.
double log_g(double alpha, double zeta, double log_x, double t) {
  return zeta * (log_x + std::log(std::cos(t)) - std::log(std::sin(alpha * t))) + std::log(std::cos((alpha - 1) * t)) -
         std::log(std::cos(t));
}

// log(1 / (pi (1 + x^2))), written so that x^2 never overflows.
double log_cauchy(double x) {
  x = std::abs(x);
  return x > 1e150 ? -std::log(kPi) - 2 * std::log(x) : -std::log(kPi) - std::log1p(x * x);
}

// Sums a series when it is usable at full precision: term(k) returns {t_k, m_k} with
// |t_k| <= m_k (m_k without the oscillating factor, which may vanish); summation stops
// when m_k < 1e-17 |sum|; NaN when the bounds grow first (an asymptotic series past its
// smallest term) or the sum cancels more than two digits.
template <class Term>
double series(Term&& term, int k0) {
  double sum = 0, biggest = 0, prev = std::numeric_limits<double>::infinity();
  for (int k = k0; k < k0 + 400; ++k) {
    const auto [t, m] = term(k);
    if (!std::isfinite(t) || m > prev) return std::nan("");
    prev = m;
    sum += t;
    biggest = std::max(biggest, m);
    if (m < 1e-17 * std::abs(sum)) return (biggest <= 1e2 * std::abs(sum) && sum > 0) ? sum : std::nan("");
  }
  return std::nan("");
}

// Small-x series (convergent for alpha > 1, asymptotic for alpha < 1):
// f_1(x) = 1 / (pi alpha) sum_k (-1)^k Gamma((2k + 1) / alpha) x^(2k) / (2k)!.
double small_x_series(double alpha, double x) {
  const double lx = std::log(x);
  return series([&](int k) {
    const double m = std::exp(std::lgamma((2 * k + 1) / alpha) - std::lgamma(2 * k + 1.0) + 2 * k * lx);
    return std::pair<double, double>((k % 2) ? -m : m, m);
  }, 0) / (kPi * alpha);
}

// Tail series (convergent for alpha < 1, asymptotic for alpha > 1), in log form so that
// it holds for any x (alpha < 2):
// f_1(x) = (1/pi) sum_{k>=1} (-1)^(k+1) Gamma(alpha k + 1) / k! sin(k pi alpha / 2) x^-(alpha k + 1)
//        = t_1 sum_k t_k / t_1.
// Takes log x, so that it also serves points whose x itself overflows (scale far from 1).
double log_tail_series_at_log(double alpha, double lx) {
  const double s1 = std::sin(kPi * alpha / 2);
  const double log_t1 = std::lgamma(alpha + 1) + std::log(s1) - (alpha + 1) * lx - std::log(kPi);
  const double rel = series([&](int k) {
    // |sin(k theta)| <= k |sin(theta)|: the bound m stays tight near alpha = 2, where s1 -> 0.
    const double base = std::exp(std::lgamma(alpha * k + 1) - std::lgamma(k + 1.0) - std::lgamma(alpha + 1) -
                                 alpha * (k - 1) * lx);
    const double m = base * std::min(1.0 / s1, double(k));
    return std::pair<double, double>(((k % 2) ? 1.0 : -1.0) * base * std::sin(k * kPi * alpha / 2) / s1, m);
  }, 1);
  return log_t1 + std::log(rel);
}

double log_tail_series(double alpha, double x) { return log_tail_series_at_log(alpha, std::log(x)); }

// d/dx of log_tail_series: with f_1 = t_1 rel, t_1 ~ x^-(alpha + 1) and the k-th term of rel
// ~ x^-(alpha (k - 1)), d log f_1 / dx = -(alpha + 1) / x - (alpha / x) sum_k (k - 1) r_k / sum_k r_k.
// Summed term by term with the same stopping rule as the value.
double d_log_tail_series(double alpha, double x) {
  const double lx = std::log(x), s1 = std::sin(kPi * alpha / 2);
  double sum = 0, wsum = 0, prev = std::numeric_limits<double>::infinity();
  for (int k = 1; k < 401; ++k) {
    const double base = std::exp(std::lgamma(alpha * k + 1) - std::lgamma(k + 1.0) - std::lgamma(alpha + 1) -
                                 alpha * (k - 1) * lx);
    const double m = base * std::min(1.0 / s1, double(k));  // as in log_tail_series_at_log
    const double t = ((k % 2) ? 1.0 : -1.0) * base * std::sin(k * kPi * alpha / 2) / s1;
    if (!std::isfinite(t) || m > prev) break;
    prev = m;
    sum += t;
    wsum += (k - 1) * t;
    if (m < 1e-17 * std::abs(sum)) break;
  }
  return -(alpha + 1) / x - alpha * wsum / (x * sum);
}

// log f_1(x) from the Fourier integral itself, (1/pi) int_0^W exp(-w^alpha) cos(w x) dw, cut
// where exp(-w^alpha) < 5e-18 (W^alpha = 40) and summed over unit segments. Used near
// alpha = 1 for moderate x, where both series stop converging (at alpha = 1 both have radius
// 1) and Zolotarev's representation degenerates (zeta = alpha / (alpha - 1) is huge); there
// the integrand decays like exp(-w) and the density is of order 1/pi, so the cut and the
// oscillation cost nothing in relative accuracy.
double log_fourier_integral(double alpha, double x) {
  const double end = std::pow(40.0, 1.0 / alpha);
  auto integrand = [&](double w) { return std::exp(-std::pow(w, alpha)) * std::cos(w * x); };
  double total = 0;
  for (double a = 0; a < end; a += 1.0) total += integrate(integrand, a, std::min(a + 1.0, end), 1e-15, 1e-18);
  return std::log(total / kPi);
}

}  // namespace

double StableDensity::log_density_direct(double alpha, double x) {
  x = std::abs(x);
  if (alpha == 1.0) return log_cauchy(x);
  if (x == 0.0) return std::lgamma(1.0 + 1.0 / alpha) - std::log(kPi);
  // Where a series is usable at full precision it is cheaper and (near alpha = 1, where the
  // integral representation degenerates) more accurate than the integral.
  if (x <= 2.0) {
    const double s = small_x_series(alpha, x);
    if (std::isfinite(s)) return std::log(s);
  }
  if (alpha < 2.0 && x >= 0.5) {
    const double s = log_tail_series(alpha, x);
    if (std::isfinite(s)) return s;
  }
  if (std::abs(alpha - 1.0) <= kFourierBand && x <= 8.0) return log_fourier_integral(alpha, x);
  return log_density_integral(alpha, x);
}

double StableDensity::log_density_integral(double alpha, double x) {
  const double zeta = alpha / (alpha - 1.0), log_x = std::log(x);
  const double lo = 0.0, hi = kPi / 2;
  // log g is monotone in theta (decreasing for alpha > 1, increasing for alpha < 1): the
  // integrand g e^-g peaks where log g = 0. Locate it by bisection in log theta.
  const bool decreasing = alpha > 1.0;
  double a = std::log(1e-300), b = std::log(hi);
  for (int i = 0; i < 200 && b - a > 1e-13; ++i) {
    const double m = 0.5 * (a + b);
    const double lg = log_g(alpha, zeta, log_x, std::exp(m));
    if ((lg > 0) == decreasing) a = m; else b = m;
  }
  const double peak = std::exp(0.5 * (a + b));
  auto integrand = [&](double t) {
    if (t <= 0.0 || t >= hi) return 0.0;
    const double lg = log_g(alpha, zeta, log_x, t);
    if (!std::isfinite(lg)) return 0.0;
    return std::exp(lg - std::exp(lg));
  };
  // The peak can be very narrow and its tails long: integrate outward from it over
  // segments that double in length, each to an absolute tolerance set by the running total.
  const double w0 = 1e-3 * std::max(std::min(peak, hi - peak), 1e-12);
  double total = 0;
  for (int side = 0; side < 2; ++side) {
    double inner = peak, w = w0;
    for (int j = 0; j < 2000; ++j, w *= 2) {
      const double outer = side == 0 ? std::max(lo, peak - w) : std::min(hi, peak + w);
      const double part = side == 0 ? integrate(integrand, outer, inner, 1e-13, 1e-16 * total)
                                    : integrate(integrand, inner, outer, 1e-13, 1e-16 * total);
      total += part;
      inner = outer;
      if (outer == lo || outer == hi) break;
    }
  }
  return std::log(alpha / (kPi * std::abs(alpha - 1.0))) - log_x + std::log(total);
}

StableDensity::StableDensity(double alpha, double c) : alpha_(alpha), c_(c) {
  if (!(alpha >= kAlphaMin && alpha <= 2.0))
    throw std::invalid_argument("alpha must lie in [0.1, 2], got " + std::to_string(alpha));
  if (!(c > 0.0) || !std::isfinite(c)) throw std::invalid_argument("c must be finite and > 0, got " + std::to_string(c));
  log_scale_ = std::log(c) / alpha;
  inv_scale_ = std::exp(-log_scale_);
  log_f0_ = std::lgamma(1.0 + 1.0 / alpha) - std::log(kPi);
  h_ = std::exp(-log_f0_);
  // Cauchy and Gaussian: closed forms everywhere (log_density handles alpha = 2 itself).
  if (alpha == 1.0 || alpha == 2.0) return;
  // The table's unit: the core width h, or the scale x_c on which the curvature at 0 acts
  // (the x where the first two terms of the small-x series are equal) when that is finer.
  // For small alpha the density has a cusp-like peak and x_c << h (alpha = 0.1: 3e-13 vs 9e-7).
  const double x_c = std::exp(0.5 * (std::log(2.0) + std::lgamma(1 / alpha) - std::lgamma(3 / alpha)));
  z_unit_ = std::min(h_, 0.1 * x_c);

  // End of the table: the first x = h 2^m where the tail series has converged (or, for an
  // asymptotic series, its smallest term is negligible) and matches the integral.
  x_max_ = 0;
  for (int m = 2; m <= 40 && x_max_ == 0; ++m) {
    const double x = h_ * std::ldexp(1.0, m);
    const double t = log_tail_series(alpha, x);
    if (std::isfinite(t) && std::abs(t - log_density_integral(alpha, x)) < 1e-13) x_max_ = x;
  }
  if (x_max_ == 0) x_max_ = h_ * std::ldexp(1.0, 40);
  z_max_ = std::asinh(x_max_ / z_unit_);
  pieces_ = std::max(1, int(std::ceil(z_max_ / kPieceWidth)));
  coef_.assign(size_t(pieces_) * kNodes, 0.0);
  double vals[kNodes];
  for (int p = 0; p < pieces_; ++p) {
    const double z0 = p * kPieceWidth;
    for (int j = 0; j < kNodes; ++j) {
      const double t = std::cos(kPi * (j + 0.5) / kNodes);
      const double z = z0 + 0.5 * kPieceWidth * (t + 1);
      vals[j] = log_density_direct(alpha, z_unit_ * std::sinh(z));
    }
    for (int k = 0; k < kNodes; ++k) {
      double s = 0;
      for (int j = 0; j < kNodes; ++j) s += vals[j] * std::cos(kPi * k * (j + 0.5) / kNodes);
      coef_[size_t(p) * kNodes + k] = (k == 0 ? 1.0 : 2.0) * s / kNodes;
    }
  }
}

double StableDensity::log_f1(double x) const {
  if (alpha_ == 1.0) return log_cauchy(x);
  if (x >= x_max_) return log_tail_series(alpha_, x);
  const double z = std::asinh(x / z_unit_);
  const int p = std::min(pieces_ - 1, int(z / kPieceWidth));
  const double t = 2 * (z - p * kPieceWidth) / kPieceWidth - 1;
  const double* c = &coef_[size_t(p) * kNodes];
  double b1 = 0, b2 = 0;
  for (int k = kNodes - 1; k >= 1; --k) {
    const double b0 = 2 * t * b1 - b2 + c[k];
    b2 = b1;
    b1 = b0;
  }
  return t * b1 - b2 + c[0];
}

double StableDensity::d_log_f1(double x) const {
  if (alpha_ == 1.0) return x == 0.0 ? 0.0 : -2 / (x + 1 / x);
  if (x >= x_max_) return d_log_tail_series(alpha_, x);
  // d/dx of the Chebyshev sum in t(z(x)): sum_k c_k k U_{k-1}(t) * dt/dz * dz/dx.
  const double z = std::asinh(x / z_unit_);
  const int p = std::min(pieces_ - 1, int(z / kPieceWidth));
  const double t = 2 * (z - p * kPieceWidth) / kPieceWidth - 1;
  const double* c = &coef_[size_t(p) * kNodes];
  double u_prev = 1, u = 2 * t, sum = c[1];  // U_0, U_1
  for (int k = 2; k < kNodes; ++k) {
    sum += c[k] * k * u;
    const double u_next = 2 * t * u - u_prev;
    u_prev = u;
    u = u_next;
  }
  return sum * (2 / kPieceWidth) / std::sqrt(x * x + z_unit_ * z_unit_);
}

namespace {

// |x| c^(-1/alpha), in the log domain when c^(-1/alpha) itself overflows or underflows.
double unit(double x, double inv_scale, double log_scale) {
  const double ax = std::abs(x);
  if (std::isfinite(inv_scale) && inv_scale > 0) return ax * inv_scale;
  return ax == 0.0 ? 0.0 : std::exp(std::log(ax) - log_scale);
}

}  // namespace

double StableDensity::d_log_density(double x) const {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return 0.0;  // the tail's -(alpha + 1) / x
  if (x == 0.0) return 0.0;  // f is even and smooth
  if (alpha_ == 2.0) return -x / (2 * c_);  // the Gaussian of variance 2c
  // f(x) = f_1(u) / s with u = |x| / s: d log f / dx = u f_1'(u) / (f_1(u) |x|), which stays
  // finite when s = c^(1/alpha) under- or overflows. Beyond the table u (log f_1)'(u) tends
  // to -(alpha + 1), the power-law tail.
  const double u = unit(x, inv_scale_, log_scale_);
  const double ug = std::isfinite(u) ? u * d_log_f1(u) : -(alpha_ + 1);
  const double g = ug / std::abs(x);
  return x > 0 ? g : -g;
}

double StableDensity::log_density(double x) const {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return -std::numeric_limits<double>::infinity();  // f -> 0 at +-inf
  if (alpha_ == 2.0) {  // -x^2 / (4c), with z = x / (2 sqrt c) so that x^2 cannot overflow first
    const double z = x / (2 * std::sqrt(c_));
    return -z * z - std::log(2 * std::sqrt(kPi * c_));
  }
  const double u = unit(x, inv_scale_, log_scale_);
  if (std::isinf(u)) {
    // u = |x| / s beyond the float range (s = c^(1/alpha) tiny): the tail, evaluated at log u.
    const double lu = std::log(std::abs(x)) - log_scale_;
    if (alpha_ == 1.0) return -std::log(kPi) - 2 * lu - log_scale_;
    return log_tail_series_at_log(alpha_, lu) - log_scale_;
  }
  return log_f1(u) - log_scale_;
}

double StableDensity::operator()(double x) const { return std::exp(log_density(x)); }

void StableDensity::evaluate(const double* x, int64_t n, bool log, double* out) const {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = log ? log_density(x[i]) : (*this)(x[i]);
}

std::shared_ptr<const StableDensity> StableDensity::shared(double alpha, double c) {
  static std::mutex mutex;
  static std::map<std::pair<double, double>, std::shared_ptr<const StableDensity>> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find({alpha, c});
    if (it != cache.end()) return it->second;
  }
  auto made = std::make_shared<const StableDensity>(alpha, c);  // may throw; built unlocked
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() >= 64) cache.clear();
  cache.emplace(std::make_pair(alpha, c), made);
  return made;
}

}  // namespace attngeom
