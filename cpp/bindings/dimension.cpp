// pybind11 glue for dimension.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "arrays.hpp"
#include "attngeom/dimension.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_dimension(py::module_& m) {
  m.def(
      "network_jacobian",
      [](const std::vector<int64_t>& d, const std::vector<int64_t>& a, const CArray<T>& params, const CArray<T>& x,
         bool softmax, double temperature) {
        const NetworkShape s{d, a};
        s.check();
        if (params.size() != s.parameters()) throw std::invalid_argument("internal: parameter count");
        const int64_t n = x.shape(0), t = x.shape(1);
        CArray<T> jac({n, t, d.back(), s.parameters()});
        {
          py::gil_scoped_release release;
          network_jacobian<T>(s, params.data(), n, t, x.data(), softmax, T(temperature), jac.mutable_data());
        }
        return jac;
      },
      py::arg("d"), py::arg("a"), py::arg("params").noconvert(), py::arg("x").noconvert(), py::arg("softmax"),
      py::arg("temperature"));
}

}  // namespace

void bind_dimension(py::module_& m) {
  def_dimension<double>(m);
  def_dimension<float>(m);
}
