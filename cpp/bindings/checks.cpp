// pybind11 glue for the whole-array checks of types.hpp that the validation layer runs in the
// core (attngeom._operands): one parallel pass, no temporary.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attngeom/types.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
bool finite(const CArray<T>& a) {
  py::gil_scoped_release release;
  return all_finite(a.data(), a.size());
}

}  // namespace

void bind_checks(py::module_& m) {
  m.def("all_finite", &finite<float>, py::arg("a").noconvert());
  m.def("all_finite", &finite<double>, py::arg("a").noconvert(),
        "Whether every entry of a C-contiguous float32 or float64 array is finite.");
}
