// pybind11 glue for whitening.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attngeom/whitening.hpp"
#include "attngeom/whitening_backward.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_whitening(py::module_& m) {
  m.def(
      "whiten",
      [](const CArray<T>& x, const CArray<T>& L, const CArray<T>& M, bool lower, int64_t block, bool varying) {
        const int64_t B = x.shape(0), Tn = x.shape(1), D = x.shape(2);
        CArray<T> w({B, Tn, D});
        {
          py::gil_scoped_release release;
          if (block > 0) {
            whiten_scan<T>(B, Tn, D, x.data(), L.data(), M.data(), lower, block, w.mutable_data());
          } else {
            whiten<T>(B, Tn, D, x.data(), L.data(), M.data(), lower, varying, w.mutable_data());
          }
        }
        return w;
      },
      py::arg("x").noconvert(), py::arg("L").noconvert(), py::arg("M").noconvert(), py::arg("lower"),
      py::arg("block") = 0, py::arg("varying") = false, "block = 0: sequential recursion; block > 0: blocked scan with that block length.");

  m.def(
      "condition_bound",
      [](const CArray<T>& L, bool lower) {
        const int64_t D = L.shape(L.ndim() - 1), count = L.ndim() == 3 ? L.shape(0) : 1;
        py::gil_scoped_release release;
        return condition_bound<T>(count, D, L.data(), lower);
      },
      py::arg("L").noconvert(), py::arg("lower"), "kappa_1 / D of L (D, D) or (T, D, D), a lower bound of kappa_2.");

  m.def(
      "whiten_backward",
      [](const CArray<T>& L, const CArray<T>& M, bool lower, const CArray<T>& w, const CArray<T>& dw) {
        const int64_t B = w.shape(0), Tn = w.shape(1), D = w.shape(2);
        if (dw.ndim() != 3 || dw.shape(0) != B || dw.shape(1) != Tn || dw.shape(2) != D || L.ndim() != 2 ||
            L.shape(0) != D || L.shape(1) != D || M.ndim() != 2 || M.shape(0) != D || M.shape(1) != D)
          throw std::invalid_argument("internal: w, dw must be (B, T, D) and L, M (D, D)");
        CArray<T> dx({B, Tn, D}), dL({D, D}), dM({D, D});
        {
          py::gil_scoped_release release;
          whiten_backward<T>(B, Tn, D, L.data(), M.data(), lower, w.data(), dw.data(), dx.mutable_data(),
                             dL.mutable_data(), dM.mutable_data());
        }
        return py::make_tuple(dx, dL, dM);
      },
      py::arg("L").noconvert(), py::arg("M").noconvert(), py::arg("lower"), py::arg("w").noconvert(),
      py::arg("dw").noconvert(), "Returns (dx, dL, dM) of the steady-state recursion.");
}

}  // namespace

void bind_whitening(py::module_& m) {
  def_whitening<double>(m);
  def_whitening<float>(m);
}
