// pybind11 glue for random_features.hpp and favor.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attngeom/favor.hpp"
#include "attngeom/favor_backward.hpp"
#include "attngeom/random_features.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

// The feature matrix W (m, d): a C-contiguous array of dtype T, possibly read-only (the Python
// layer caches W and hands out a read-only view; array_t refuses those).
template <class T>
const T* feature_matrix(const py::array& W, int64_t d) {
  if (!py::isinstance<CArray<T>>(W) || W.ndim() != 2 || W.shape(1) != d)
    throw std::invalid_argument("internal: W must be a C-contiguous (m, d) array of the inputs' dtype");
  return static_cast<const T*>(W.data());
}

template <class T>
void def_random_features(py::module_& m) {
  m.def(
      "positive_features",
      [](const CArray<T>& x, const py::array& W, double root, bool per_row) {
        if (x.ndim() != 3) throw std::invalid_argument("internal: positive_features expects x (B, n, d)");
        const T* w = feature_matrix<T>(W, x.shape(2));
        const int64_t batch = x.shape(0), n = x.shape(1), features = W.shape(0);
        CArray<T> phi({batch, n, features});
        CArray<T> shift({batch, n});
        {
          py::gil_scoped_release release;
          positive_features<T>(batch, stack(x, std::nullopt), w, features, T(root), per_row,
                               phi.mutable_data(), shift.mutable_data());
        }
        return py::make_tuple(phi, shift);
      },
      py::arg("x").noconvert(), py::arg("W"), py::arg("root"), py::arg("per_row"));

  m.def(
      "favor_attention",
      [](const AttentionArgs<T>& a, const py::array& W, double root, int64_t chunk) {
        if (a.k.cols != a.q.cols || a.v.rows != a.k.rows)
          throw std::invalid_argument("internal: favor_attention expects q (B, n_q, d), k (B, n_k, d) and "
                                      "v (B, n_k, d_v)");
        const T* w = feature_matrix<T>(W, a.q.cols);
        CArray<T> y({a.batch, a.q.rows, a.v.cols});
        CArray<T> log_z({a.batch, a.q.rows});
        {
          py::gil_scoped_release release;
          favor_attention<T>(a.batch, a.q, a.k, a.v, w, W.shape(0), T(root), a.causal, chunk, y.mutable_data(),
                             log_z.mutable_data());
        }
        return py::make_tuple(y, log_z);
      },
      py::arg("operands"), py::arg("W"), py::arg("root"), py::arg("chunk") = 64,
      "Returns (y, log Z) over the flat batch.");

  m.def(
      "favor_attention_backward",
      [](const AttentionArgs<T>& a, const py::array& W, double root, int64_t chunk, const CArray<T>& dy) {
        if (a.k.cols != a.q.cols || a.v.rows != a.k.rows || dy.ndim() != 3 || dy.shape(0) != a.batch ||
            dy.shape(1) != a.q.rows || dy.shape(2) != a.v.cols)
          throw std::invalid_argument("internal: favor_attention_backward expects q (B, n_q, d), k (B, n_k, d), "
                                      "v (B, n_k, d_v) and dy (batch, n_q, d_v)");
        const T* w = feature_matrix<T>(W, a.q.cols);
        CArray<T> dq({a.batch, a.q.rows, a.q.cols}), dk({a.batch, a.k.rows, a.k.cols}),
            dv({a.batch, a.v.rows, a.v.cols});
        {
          py::gil_scoped_release release;
          favor_attention_backward<T>(a.batch, a.q, a.k, a.v, w, W.shape(0), T(root), a.causal, chunk, dy.data(),
                                      dq.mutable_data(), dk.mutable_data(), dv.mutable_data());
        }
        return py::make_tuple(dq, dk, dv);
      },
      py::arg("operands"), py::arg("W"), py::arg("root"), py::arg("chunk"), py::arg("dy").noconvert(),
      "Returns (dq, dk, dv) over the flat batch.");
}

}  // namespace

void bind_random_features(py::module_& m) {
  def_random_features<double>(m);
  def_random_features<float>(m);
}
