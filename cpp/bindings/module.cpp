// The extension module attngeom._core_<level> (one per instruction-set level, same sources):
// one bind_<concept> per bindings file. attngeom/_core.py imports the best level.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_config(py::module_& m);
void bind_attention(py::module_& m);
void bind_laplace_radon(py::module_& m);
void bind_stable_density(py::module_& m);
void bind_spectral(py::module_& m);
void bind_lightning(py::module_& m);
void bind_random_features(py::module_& m);
void bind_dimension(py::module_& m);
void bind_whitening(py::module_& m);
void bind_inverse(py::module_& m);
void bind_radon(py::module_& m);
void bind_bench(py::module_& m);

PYBIND11_MODULE(ATTNGEOM_MODULE_NAME, m) {
  m.doc() = "attngeom C++ core (Eigen, OpenMP); use the attngeom package, not this module.";
  bind_config(m);
  bind_attention(m);
  bind_laplace_radon(m);
  bind_stable_density(m);
  bind_spectral(m);
  bind_lightning(m);
  bind_random_features(m);
  bind_dimension(m);
  bind_whitening(m);
  bind_inverse(m);
  bind_radon(m);
  bind_bench(m);
}
