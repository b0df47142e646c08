// TEMPORARY placeholder (not to be committed)
#include "attngeom/stable_density.hpp"
#include <cmath>
#include <stdexcept>
namespace attngeom {
StableDensity::StableDensity(double alpha, double c) : alpha_(alpha), c_(c) {}
double StableDensity::operator()(double x) const { return std::exp(log_density(x)); }
double StableDensity::log_density(double x) const { return -std::log1p(x * x / (c_ * c_)); }
}
