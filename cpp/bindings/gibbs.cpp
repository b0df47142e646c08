// pybind11 glue for the Gibbs-reweighted statistics of laplace_radon.hpp: the cumulants of the
// projected coordinate and the key moments (the log-partition's gradient and Hessian).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "arrays.hpp"
#include "attngeom/laplace_radon.hpp"
#include "kernel_dispatch.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_gibbs(py::module_& m) {
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
}

}  // namespace

void bind_gibbs(py::module_& m) {
  def_gibbs<double>(m);
  def_gibbs<float>(m);
}
