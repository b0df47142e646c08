// Build configuration and thread control.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Eigen/Core>
#include <string>

#include "attngeom/isa.hpp"
#include "attngeom/parallel.hpp"

namespace py = pybind11;

namespace {

std::string simd_flags() {
  std::string s;
  auto add = [&s](const char* f) {
    if (!s.empty()) s += " ";
    s += f;
  };
#ifdef __SSE2__
  add("SSE2");
#endif
#ifdef __SSE4_2__
  add("SSE4.2");
#endif
#ifdef __AVX__
  add("AVX");
#endif
#ifdef __AVX2__
  add("AVX2");
#endif
#ifdef __FMA__
  add("FMA");
#endif
#ifdef __AVX512F__
  add("AVX512F");
#endif
#ifdef __ARM_NEON
  add("NEON");
#endif
  return s.empty() ? "none" : s;
}

}  // namespace

void bind_config(py::module_& m) {
  m.def("get_num_threads", &attngeom::get_num_threads);
  m.def("set_num_threads", &attngeom::set_num_threads, py::arg("n"));
  m.def("max_threads", &attngeom::max_threads);
  m.def("supported_levels", &attngeom::supported_levels);
  m.def("build_config", []() {
    py::dict d;
    d["version"] = ATTNGEOM_VERSION;
    d["eigen_version"] = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
                         "." + std::to_string(EIGEN_MINOR_VERSION);
    d["openmp"] = attngeom::has_openmp();
    d["isa"] = attngeom::compiled_level();
    d["simd"] = simd_flags();
    // Non-empty only in a `make sanitize` build (address,undefined): lets a test run check
    // that the instrumented core is the one it loaded.
    d["sanitizers"] = std::string(ATTNGEOM_SANITIZERS);
    d["eigen_simd"] = std::string(Eigen::SimdInstructionSetsInUse());
#if defined(__VERSION__)
    d["compiler"] = std::string(__VERSION__);
#endif
    return d;
  });
}
