// pybind11 glue for lightning.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "attngeom/lightning.hpp"
#include "attngeom/lightning_backward.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_lightning(py::module_& m) {
  m.def(
      "lightning_attention",
      [](int64_t batch, const CArray<T>& q, const Index& qi, const CArray<T>& k, const Index& ki, const CArray<T>& v,
         const Index& vi, int causal, int64_t chunk) {
        const auto Q = stack(q, qi), K = stack(k, ki), V = stack(v, vi);
        CArray<T> y({batch, Q.rows, V.cols});
        {
          py::gil_scoped_release release;
          lightning_attention<T>(batch, Q, K, V, static_cast<Causal>(causal), chunk, y.mutable_data());
        }
        return y;
      },
      py::arg("batch"), py::arg("q").noconvert(), py::arg("q_index"), py::arg("k").noconvert(), py::arg("k_index"),
      py::arg("v").noconvert(), py::arg("v_index"), py::arg("causal"), py::arg("chunk") = 64);

  m.def(
      "lightning_attention_backward",
      [](int64_t batch, const CArray<T>& q, const Index& qi, const CArray<T>& k, const Index& ki, const CArray<T>& v,
         const Index& vi, int causal, const CArray<T>& dy, int64_t chunk) {
        const auto Q = stack(q, qi), K = stack(k, ki), V = stack(v, vi);
        if (dy.ndim() != 3 || dy.shape(0) != batch || dy.shape(1) != Q.rows || dy.shape(2) != V.cols)
          throw std::invalid_argument("internal: dy must be (batch, n_q, d_v)");
        CArray<T> dq({batch, Q.rows, Q.cols}), dk({batch, K.rows, K.cols}), dv({batch, V.rows, V.cols});
        {
          py::gil_scoped_release release;
          lightning_attention_backward<T>(batch, Q, K, V, static_cast<Causal>(causal), chunk, dy.data(),
                                          dq.mutable_data(), dk.mutable_data(), dv.mutable_data());
        }
        return py::make_tuple(dq, dk, dv);
      },
      py::arg("batch"), py::arg("q").noconvert(), py::arg("q_index"), py::arg("k").noconvert(), py::arg("k_index"),
      py::arg("v").noconvert(), py::arg("v_index"), py::arg("causal"), py::arg("dy").noconvert(),
      py::arg("chunk") = 64, "Returns (dq, dk, dv) over the flat batch.");
}

}  // namespace

void bind_lightning(py::module_& m) {
  def_lightning<double>(m);
  def_lightning<float>(m);
}
