// pybind11 glue for laplace_radon.hpp.
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

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
      [](const AttentionArgs<T>& a, const std::string& kernel, const py::dict& params, int order) {
        CArray<T> out({a.batch, a.q.rows, int64_t(order)});
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          projected_cumulants<T>(a.batch, a.q, a.radii(), a.tau_index, a.k, psi, order, out.mutable_data());
        });
        return out;
      },
      py::arg("operands"), py::arg("kernel"), py::arg("params"), py::arg("order"));

  m.def(
      "gibbs_key_moments",
      [](const AttentionArgs<T>& a, const std::string& kernel, const py::dict& params, bool want_cov) {
        CArray<T> mean({a.batch, a.q.rows, a.q.cols});
        std::optional<CArray<T>> cov;
        if (want_cov) cov = CArray<T>({a.batch, a.q.rows, a.q.cols, a.q.cols});
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          gibbs_key_moments<T>(a.batch, a.q, a.radii(), a.tau_index, a.k, psi, mean.mutable_data(),
                               cov ? cov->mutable_data() : nullptr);
        });
        return py::make_tuple(mean, cov ? py::object(*cov) : py::none());
      },
      py::arg("operands"), py::arg("kernel"), py::arg("params"), py::arg("want_cov"));

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
