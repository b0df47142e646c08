// pybind11 glue for attention.hpp: softmax and ridge (kernel) attention.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.hpp"
#include "attngeom/attention.hpp"
#include "kernel_dispatch.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
struct Outputs {
  CArray<T> y;
  std::optional<CArray<T>> weights, log_partition;
  AttentionOutput<T> view() {
    return {y.mutable_data(), weights ? weights->mutable_data() : nullptr,
            log_partition ? log_partition->mutable_data() : nullptr};
  }
  py::tuple result() {
    return py::make_tuple(y, weights ? py::object(*weights) : py::none(),
                          log_partition ? py::object(*log_partition) : py::none());
  }
};

template <class T>
Outputs<T> make_outputs(int64_t batch, int64_t n_q, int64_t n_k, int64_t d_v, bool want_weights, bool want_logz) {
  Outputs<T> o{CArray<T>({batch, n_q, d_v}), std::nullopt, std::nullopt};
  if (want_weights) o.weights = CArray<T>({batch, n_q, n_k});
  if (want_logz) o.log_partition = CArray<T>({batch, n_q});
  return o;
}

template <class T>
void def_attention(py::module_& m) {
  m.def(
      "softmax_attention",
      [](int64_t batch, const CArray<T>& q, const Index& qi, const CArray<T>& k, const Index& ki, const CArray<T>& v,
         const Index& vi, const std::optional<CArray<uint8_t>>& keep, const std::optional<CArray<T>>& bias,
         const Index& mi, int causal, double scale, bool want_weights, bool want_logz, int64_t block_q,
         int64_t block_k) {
        const auto Q = stack(q, qi), K = stack(k, ki), V = stack(v, vi);
        const auto M = mask<T>(keep, bias, mi, Q.rows, K.rows);
        auto out = make_outputs<T>(batch, Q.rows, K.rows, V.cols, want_weights, want_logz);
        {
          py::gil_scoped_release release;
          softmax_attention<T>(batch, Q, K, V, M, static_cast<Causal>(causal), T(scale), out.view(),
                               Blocking{block_q, block_k});
        }
        return out.result();
      },
      py::arg("batch"), py::arg("q").noconvert(), py::arg("q_index"), py::arg("k").noconvert(), py::arg("k_index"),
      py::arg("v").noconvert(), py::arg("v_index"), py::arg("mask_keep"), py::arg("mask_bias").noconvert(),
      py::arg("mask_index"), py::arg("causal"), py::arg("scale"), py::arg("want_weights"), py::arg("want_logz"),
      py::arg("block_q") = 64, py::arg("block_k") = 256);

  m.def(
      "ridge_attention",
      [](int64_t batch, const CArray<T>& u, const Index& ui, const CArray<T>& tau, const Index& ti, const CArray<T>& k,
         const Index& ki, const CArray<T>& v, const Index& vi, const std::optional<CArray<uint8_t>>& keep,
         const std::optional<CArray<T>>& bias, const Index& mi, int causal, const std::string& kernel,
         const py::dict& params, bool want_weights, bool want_logz) {
        const auto U = stack(u, ui), K = stack(k, ki), V = stack(v, vi);
        const auto M = mask<T>(keep, bias, mi, U.rows, K.rows);
        auto out = make_outputs<T>(batch, U.rows, K.rows, V.cols, want_weights, want_logz);
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          ridge_attention<T>(batch, U, tau.data(), index_ptr(ti), K, V, M, static_cast<Causal>(causal), psi,
                             out.view());
        });
        return out.result();
      },
      py::arg("batch"), py::arg("u").noconvert(), py::arg("u_index"), py::arg("tau").noconvert(),
      py::arg("tau_index"), py::arg("k").noconvert(), py::arg("k_index"), py::arg("v").noconvert(),
      py::arg("v_index"), py::arg("mask_keep"), py::arg("mask_bias").noconvert(), py::arg("mask_index"),
      py::arg("causal"), py::arg("kernel"), py::arg("params"), py::arg("want_weights"), py::arg("want_logz"));
}

}  // namespace

void bind_attention(py::module_& m) {
  def_attention<double>(m);
  def_attention<float>(m);
}
