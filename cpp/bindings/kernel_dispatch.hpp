// Maps a kernel name and its parameters (already validated in Python) to a kernel functor.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "attngeom/kernels.hpp"

namespace attngeom::bindings {

template <class T, class F>
void with_kernel(const std::string& name, const pybind11::dict& params, F&& f) {
  auto get = [&params](const char* key) { return params[key].cast<double>(); };
  if (name == "exp") {
    f(ExpKernel<T>{});
  } else if (name == "gaussian") {
    f(GaussianKernel<T>(get("sigma")));
  } else if (name == "cauchy") {
    f(CauchyKernel<T>(get("gamma")));
  } else if (name == "stable") {
    f(StableKernel<T>(get("alpha"), get("c")));
  } else {
    throw std::invalid_argument("kernel must be one of 'exp', 'gaussian', 'cauchy', 'stable', got '" + name + "'");
  }
}

}  // namespace attngeom::bindings
