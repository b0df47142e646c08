// pybind11 glue for stable_density.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "attngeom/stable_density.hpp"

namespace py = pybind11;

void bind_stable_density(py::module_& m) {
  m.def(
      "stable_density",
      [](const py::array_t<double, py::array::c_style>& x, double alpha, double c, bool log) {
        const auto density = attngeom::StableDensity::shared(alpha, c);
        py::array_t<double> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        {
          py::gil_scoped_release release;
          density->evaluate(x.data(), x.size(), log, out.mutable_data());
        }
        return out;
      },
      py::arg("x").noconvert(), py::arg("alpha"), py::arg("c"), py::arg("log"));
  m.def("stable_log_density_integral", &attngeom::StableDensity::log_density_integral, py::arg("alpha"),
        py::arg("x"));
  m.def("stable_log_density_direct", &attngeom::StableDensity::log_density_direct, py::arg("alpha"), py::arg("x"));
}
