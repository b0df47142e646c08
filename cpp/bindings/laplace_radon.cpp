// pybind11 glue for laplace_radon.hpp.
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <complex>
#include <vector>

#include "arrays.hpp"
#include "attngeom/laplace_radon.hpp"
#include "kernel_dispatch.hpp"

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
      "projected_cumulants",
      [](int64_t batch, const CArray<T>& u, const Index& ui, const CArray<T>& tau, const Index& ti, const CArray<T>& k,
         const Index& ki, const std::string& kernel, const py::dict& params, int order) {
        const auto U = stack(u, ui), K = stack(k, ki);
        CArray<T> out({batch, U.rows, int64_t(order)});
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          projected_cumulants<T>(batch, U, tau.data(), index_ptr(ti), K, psi, order, out.mutable_data());
        });
        return out;
      },
      py::arg("batch"), py::arg("u").noconvert(), py::arg("u_index"), py::arg("tau").noconvert(),
      py::arg("tau_index"), py::arg("k").noconvert(), py::arg("k_index"), py::arg("kernel"), py::arg("params"),
      py::arg("order"));

  m.def(
      "gibbs_key_moments",
      [](int64_t batch, const CArray<T>& u, const Index& ui, const CArray<T>& tau, const Index& ti, const CArray<T>& k,
         const Index& ki, const std::string& kernel, const py::dict& params, bool want_cov) {
        const auto U = stack(u, ui), K = stack(k, ki);
        CArray<T> mean({batch, U.rows, U.cols});
        std::optional<CArray<T>> cov;
        if (want_cov) cov = CArray<T>({batch, U.rows, U.cols, U.cols});
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          gibbs_key_moments<T>(batch, U, tau.data(), index_ptr(ti), K, psi, mean.mutable_data(),
                               cov ? cov->mutable_data() : nullptr);
        });
        return py::make_tuple(mean, cov ? py::object(*cov) : py::none());
      },
      py::arg("batch"), py::arg("u").noconvert(), py::arg("u_index"), py::arg("tau").noconvert(),
      py::arg("tau_index"), py::arg("k").noconvert(), py::arg("k_index"), py::arg("kernel"), py::arg("params"),
      py::arg("want_cov"));

  m.def(
      "laplace_transform_complex",
      [](int64_t batch, const CArray<T>& u, const Index& ui, const CArray<std::complex<T>>& tau, const Index& ti,
         const CArray<T>& k, const Index& ki, const CArray<T>& v, const Index& vi) {
        const auto U = stack(u, ui), K = stack(k, ki), V = stack(v, vi);
        CArray<T> shift({batch, U.rows});
        CArray<std::complex<T>> Zs({batch, U.rows}), Ns({batch, U.rows, V.cols});
        {
          py::gil_scoped_release release;
          laplace_transform_complex<T>(batch, U, tau.data(), index_ptr(ti), K, V, shift.mutable_data(),
                                       Zs.mutable_data(), Ns.mutable_data());
        }
        return py::make_tuple(shift, Zs, Ns);
      },
      py::arg("batch"), py::arg("u").noconvert(), py::arg("u_index"), py::arg("tau").noconvert(),
      py::arg("tau_index"), py::arg("k").noconvert(), py::arg("k_index"), py::arg("v").noconvert(),
      py::arg("v_index"));
}

}  // namespace

void bind_laplace_radon(py::module_& m) {
  def_laplace_radon<double>(m);
  def_laplace_radon<float>(m);
}
