// The extension module attngeom._core: one bind_<concept> per bindings file.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_config(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "attngeom C++ core (Eigen, OpenMP); use the attngeom package, not this module.";
  bind_config(m);
}
