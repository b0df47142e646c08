// pybind11 glue for random_features.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "attngeom/random_features.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_random_features(py::module_& m) {
  m.def(
      "positive_features",
      [](const CArray<T>& x, const CArray<T>& W, double root, bool per_row) {
        if (x.ndim() != 3 || W.ndim() != 2 || W.shape(1) != x.shape(2))
          throw std::invalid_argument("internal: positive_features expects x (B, n, d) and W (m, d)");
        const int64_t batch = x.shape(0), n = x.shape(1), features = W.shape(0);
        CArray<T> phi({batch, n, features});
        CArray<T> shift({batch, n});
        {
          py::gil_scoped_release release;
          positive_features<T>(batch, stack(x, std::nullopt), W.data(), features, T(root), per_row,
                               phi.mutable_data(), shift.mutable_data());
        }
        return py::make_tuple(phi, shift);
      },
      py::arg("x").noconvert(), py::arg("W").noconvert(), py::arg("root"), py::arg("per_row"));
}

}  // namespace

void bind_random_features(py::module_& m) {
  def_random_features<double>(m);
  def_random_features<float>(m);
}
