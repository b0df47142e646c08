// pybind11 glue for laplace_radon.hpp: tilts, radii and the complex transforms (the Gibbs
// statistics are in gibbs.cpp).
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <complex>
#include <vector>

#include "arrays.hpp"
#include "attngeom/laplace_radon.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_laplace_radon(py::module_& m) {
  m.def(
      "tilt_radius",
      [](const CArray<T>& q, double scale) {
        if (q.ndim() != 2) throw std::invalid_argument("internal: expected a 2-d operand");
        const int64_t rows = q.shape(0), d = q.shape(1);
        CArray<T> u({rows, d}), tau(std::vector<int64_t>{rows});
        {
          py::gil_scoped_release release;
          tilt_radius<T>(rows, d, q.data(), scale, u.mutable_data(), tau.mutable_data());
        }
        return py::make_tuple(u, tau);
      },
      py::arg("q").noconvert(), py::arg("scale"));

  m.def(
      "laplace_transform_complex",
      [](const AttentionArgs<T>& a, const CArray<std::complex<T>>& tau) {
        CArray<T> shift({a.batch, a.q.rows});
        CArray<std::complex<T>> Zs({a.batch, a.q.rows}), Ns({a.batch, a.q.rows, a.v.cols});
        {
          py::gil_scoped_release release;
          laplace_transform_complex<T>(a.batch, a.q, tau.data(), a.tau_index, a.k, a.v, shift.mutable_data(),
                                       Zs.mutable_data(), Ns.mutable_data());
        }
        return py::make_tuple(shift, Zs, Ns);
      },
      py::arg("operands"), py::arg("tau").noconvert(),
      "tau: the complex radii (blocks, n_q), addressed through the operands' tau index.");
}

}  // namespace

void bind_laplace_radon(py::module_& m) {
  def_laplace_radon<double>(m);
  def_laplace_radon<float>(m);
}
