// The extension module attngeom._core_<level> (one per instruction-set level, same sources):
// one bind_<concept> per bindings file. attngeom/_core.py imports the best level. The AVX2
// and AVX-512 modules (ATTNGEOM_HOT_ONLY) leave out spectral, inverse, radon, dimension and
// gibbs, which _core.py takes from the baseline module (see CMakeLists.txt).
#include <pybind11/pybind11.h>

#include "attngeom/types.hpp"

namespace py = pybind11;

void bind_config(py::module_& m);
void bind_attention(py::module_& m);
void bind_laplace_radon(py::module_& m);
void bind_gibbs(py::module_& m);
void bind_stable_density(py::module_& m);
void bind_spectral(py::module_& m);
void bind_lightning(py::module_& m);
void bind_random_features(py::module_& m);
void bind_dimension(py::module_& m);
void bind_whitening(py::module_& m);
void bind_inverse(py::module_& m);
void bind_radon(py::module_& m);
void bind_bench(py::module_& m);
void bind_products(py::module_& m);
void bind_checks(py::module_& m);

PYBIND11_MODULE(ATTNGEOM_MODULE_NAME, m) {
  m.doc() = "attngeom C++ core (Eigen, OpenMP); use the attngeom package, not this module.";
  // The kernels' NonFiniteOperand and ResultOverflow become the Python classes of the same
  // names (ValueError subclasses), so a check made in the core reads as the Python layer's.
  py::register_local_exception_translator([](std::exception_ptr p) {
    const auto raise = [](const char* cls, const char* what) {
      py::object type = py::module_::import("attngeom.errors").attr(cls);
      PyErr_SetString(type.ptr(), what);
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attngeom::NonFiniteOperand& e) {
      raise("NonFiniteOperand", e.what());
    } catch (const attngeom::ResultOverflow& e) {
      raise("ResultOverflow", e.what());
    }
  });
  bind_config(m);
  bind_attention(m);
  bind_laplace_radon(m);
  bind_stable_density(m);
#ifndef ATTNGEOM_HOT_ONLY
  bind_spectral(m);
#endif
  bind_lightning(m);
  bind_random_features(m);
  bind_whitening(m);
#ifndef ATTNGEOM_HOT_ONLY
  bind_dimension(m);
  bind_inverse(m);
  bind_radon(m);
  bind_gibbs(m);
#endif
  bind_products(m);
  bind_checks(m);
  bind_bench(m);
}
