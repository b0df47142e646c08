// pybind11 glue for random_features.hpp and favor.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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
      [](int64_t batch, const CArray<T>& q, const Index& qi, const CArray<T>& k, const Index& ki, const CArray<T>& v,
         const Index& vi, const py::array& W, double root, int causal, int64_t chunk) {
        const auto Q = stack(q, qi), K = stack(k, ki), V = stack(v, vi);
        if (K.cols != Q.cols || V.rows != K.rows)
          throw std::invalid_argument("internal: favor_attention expects q (B, n_q, d), k (B, n_k, d) and "
                                      "v (B, n_k, d_v)");
        const T* w = feature_matrix<T>(W, Q.cols);
        CArray<T> y({batch, Q.rows, V.cols});
        CArray<T> log_z({batch, Q.rows});
        {
          py::gil_scoped_release release;
          favor_attention<T>(batch, Q, K, V, w, W.shape(0), T(root), static_cast<Causal>(causal), chunk,
                             y.mutable_data(), log_z.mutable_data());
        }
        return py::make_tuple(y, log_z);
      },
      py::arg("batch"), py::arg("q").noconvert(), py::arg("q_index"), py::arg("k").noconvert(), py::arg("k_index"),
      py::arg("v").noconvert(), py::arg("v_index"), py::arg("W"), py::arg("root"), py::arg("causal"),
      py::arg("chunk") = 64, "Returns (y, log Z) over the flat batch.");

  m.def(
      "favor_attention_backward",
      [](int64_t batch, const CArray<T>& q, const Index& qi, const CArray<T>& k, const Index& ki, const CArray<T>& v,
         const Index& vi, const py::array& W, double root, int causal, int64_t chunk, const CArray<T>& dy) {
        const auto Q = stack(q, qi), K = stack(k, ki), V = stack(v, vi);
        if (K.cols != Q.cols || V.rows != K.rows || dy.ndim() != 3 || dy.shape(0) != batch || dy.shape(1) != Q.rows ||
            dy.shape(2) != V.cols)
          throw std::invalid_argument("internal: favor_attention_backward expects q (B, n_q, d), k (B, n_k, d), "
                                      "v (B, n_k, d_v) and dy (batch, n_q, d_v)");
        const T* w = feature_matrix<T>(W, Q.cols);
        CArray<T> dq({batch, Q.rows, Q.cols}), dk({batch, K.rows, K.cols}), dv({batch, V.rows, V.cols});
        {
          py::gil_scoped_release release;
          favor_attention_backward<T>(batch, Q, K, V, w, W.shape(0), T(root), static_cast<Causal>(causal), chunk,
                                      dy.data(), dq.mutable_data(), dk.mutable_data(), dv.mutable_data());
        }
        return py::make_tuple(dq, dk, dv);
      },
      py::arg("batch"), py::arg("q").noconvert(), py::arg("q_index"), py::arg("k").noconvert(), py::arg("k_index"),
      py::arg("v").noconvert(), py::arg("v_index"), py::arg("W"), py::arg("root"), py::arg("causal"),
      py::arg("chunk"), py::arg("dy").noconvert(), "Returns (dq, dk, dv) over the flat batch.");
}

}  // namespace

void bind_random_features(py::module_& m) {
  def_random_features<double>(m);
  def_random_features<float>(m);
}
