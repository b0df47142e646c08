// pybind11 glue for radon.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attngeom/radon.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_radon(py::module_& m) {
  m.def(
      "radon_forward",
      [](const CArray<T>& image, const CArray<double>& theta) {
        const int64_t n = image.shape(0), A = theta.shape(0);
        CArray<T> sino({n, A});
        {
          py::gil_scoped_release release;
          radon_forward<T>(n, image.data(), A, theta.data(), sino.mutable_data());
        }
        return sino;
      },
      py::arg("image").noconvert(), py::arg("theta").noconvert());
  m.def(
      "radon_adjoint",
      [](const CArray<T>& sino, const CArray<double>& theta) {
        const int64_t n = sino.shape(0), A = theta.shape(0);
        CArray<T> image({n, n});
        {
          py::gil_scoped_release release;
          radon_adjoint<T>(n, sino.data(), A, theta.data(), image.mutable_data());
        }
        return image;
      },
      py::arg("sino").noconvert(), py::arg("theta").noconvert());
  m.def(
      "backproject",
      [](const CArray<T>& filtered, const CArray<double>& theta, int64_t out, bool circle) {
        const int64_t P = filtered.shape(0), A = theta.shape(0);
        CArray<T> image({out, out});
        {
          py::gil_scoped_release release;
          backproject<T>(P, A, filtered.data(), theta.data(), out, circle, image.mutable_data());
        }
        return image;
      },
      py::arg("filtered").noconvert(), py::arg("theta").noconvert(), py::arg("out"), py::arg("circle"));
  m.def(
      "sart",
      [](const CArray<T>& sino, const CArray<double>& theta, const CArray<int64_t>& order, const CArray<T>& mask,
         CArray<T> image, int64_t iterations, double relaxation, bool clip, double lo, double hi) {
        const int64_t n = sino.shape(0), A = theta.shape(0);
        {
          py::gil_scoped_release release;
          sart<T>(n, sino.data(), A, theta.data(), order.data(), mask.data(), iterations, relaxation, clip, lo, hi,
                  image.mutable_data());
        }
        return image;
      },
      py::arg("sino").noconvert(), py::arg("theta").noconvert(), py::arg("order").noconvert(), py::arg("mask").noconvert(),
      py::arg("image").noconvert(), py::arg("iterations"), py::arg("relaxation"), py::arg("clip"), py::arg("lo"),
      py::arg("hi"), "Updates `image` in place and returns it.");
}

}  // namespace

void bind_radon(py::module_& m) {
  def_radon<double>(m);
  def_radon<float>(m);
}
