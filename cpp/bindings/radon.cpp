// pybind11 glue for radon.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>

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
        if (image.ndim() != 2 || image.shape(0) != image.shape(1) || theta.ndim() != 1)
          throw std::invalid_argument("radon_forward expects a square image (n, n) and theta (A,)");
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
        if (sino.ndim() != 2 || theta.ndim() != 1 || sino.shape(1) != theta.shape(0))
          throw std::invalid_argument("radon_adjoint expects sino (n, A) and theta (A,)");
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
        if (filtered.ndim() != 2 || theta.ndim() != 1 || filtered.shape(1) != theta.shape(0) || filtered.shape(0) < 2)
          throw std::invalid_argument("backproject expects filtered (P >= 2, A) and theta (A,)");
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
        if (sino.ndim() != 2 || sino.shape(1) != A || order.ndim() != 1 || order.shape(0) != A || mask.ndim() != 2 ||
            mask.shape(0) != n || mask.shape(1) != n || image.ndim() != 2 || image.shape(0) != n || image.shape(1) != n)
          throw std::invalid_argument("sart expects sino (n, A), theta (A,), order (A,), mask and image (n, n)");
        for (int64_t o = 0; o < A; ++o)
          if (order.data()[o] < 0 || order.data()[o] >= A) throw std::invalid_argument("order out of range");
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
