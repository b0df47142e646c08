#pragma once
namespace attngeom {
class StableDensity {
 public:
  StableDensity(double alpha, double c = 1.0);
  double operator()(double x) const;
  double log_density(double x) const;
  double alpha() const { return alpha_; }
  double c() const { return c_; }
 private:
  double alpha_, c_;
};
}  // namespace attngeom
