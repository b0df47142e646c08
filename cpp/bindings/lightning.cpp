// pybind11 glue for lightning.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

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
      [](const AttentionArgs<T>& a, int64_t chunk) {
        CArray<T> y({a.batch, a.q.rows, a.v.cols});
        {
          py::gil_scoped_release release;
          lightning_attention<T>(a.batch, a.q, a.k, a.v, a.causal, chunk, y.mutable_data());
        }
        return y;
      },
      py::arg("operands"), py::arg("chunk") = 64);

  m.def(
      "lightning_attention_backward",
      [](const AttentionArgs<T>& a, const CArray<T>& dy, int64_t chunk) {
        if (dy.ndim() != 3 || dy.shape(0) != a.batch || dy.shape(1) != a.q.rows || dy.shape(2) != a.v.cols)
          throw std::invalid_argument("internal: dy must be (batch, n_q, d_v)");
        CArray<T> dq({a.batch, a.q.rows, a.q.cols}), dk({a.batch, a.k.rows, a.k.cols}),
            dv({a.batch, a.v.rows, a.v.cols});
        {
          py::gil_scoped_release release;
          lightning_attention_backward<T>(a.batch, a.q, a.k, a.v, a.causal, chunk, dy.data(), dq.mutable_data(),
                                          dk.mutable_data(), dv.mutable_data());
        }
        return py::make_tuple(dq, dk, dv);
      },
      py::arg("operands"), py::arg("dy").noconvert(), py::arg("chunk") = 64,
      "Returns (dq, dk, dv) over the flat batch.");
}

}  // namespace

void bind_lightning(py::module_& m) {
  def_lightning<double>(m);
  def_lightning<float>(m);
}
