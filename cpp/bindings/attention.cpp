// pybind11 glue for attention.hpp: softmax and ridge (kernel) attention.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attention_outputs.hpp"
#include "attngeom/attention.hpp"
#include "attngeom/attention_backward.hpp"
#include "kernel_dispatch.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_attention(py::module_& m) {
  def_softmax_attention<T>(m);

  m.def(
      "ridge_attention",
      [](const AttentionArgs<T>& a, const std::string& kernel, const py::dict& params, bool want_weights,
         bool want_logz, bool want_stats, int64_t block_q, int64_t block_k) {
        auto out = make_outputs<T>(a.batch, a.q.rows, a.k.rows, a.v.cols, want_weights, want_logz, want_stats);
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          ridge_attention<T>(a.batch, a.q, a.radii(), a.tau_index, a.k, a.v, a.mask, a.causal, psi,
                             out.view(), Blocking{block_q, block_k});
        });
        return out.result();
      },
      py::arg("operands"), py::arg("kernel"), py::arg("params"), py::arg("want_weights"), py::arg("want_logz"),
      py::arg("want_stats") = false, py::arg("block_q") = 0, py::arg("block_k") = 0,
      "The operands' q holds the tilts u, their tau the radii.");
}

// Gradient arrays of one backward call; dtau and dkey_bias only when asked for.
template <class T>
struct Gradients {
  CArray<T> dq, dk, dv;
  std::optional<CArray<T>> dtau, dkey_bias;
  AttentionGradients<T> view() {
    return {dq.mutable_data(), dk.mutable_data(), dv.mutable_data(), dtau ? dtau->mutable_data() : nullptr,
            dkey_bias ? dkey_bias->mutable_data() : nullptr};
  }
  py::tuple result() {
    return py::make_tuple(dq, dk, dv, dtau ? py::object(*dtau) : py::none(),
                          dkey_bias ? py::object(*dkey_bias) : py::none());
  }
};

template <class T>
Gradients<T> make_gradients(int64_t batch, int64_t n_q, int64_t n_k, int64_t d_k, int64_t d_v, bool want_dtau,
                            bool want_dkey_bias) {
  Gradients<T> g{CArray<T>({batch, n_q, d_k}), CArray<T>({batch, n_k, d_k}), CArray<T>({batch, n_k, d_v}),
                 std::nullopt, std::nullopt};
  if (want_dtau) g.dtau = CArray<T>({batch, n_q});
  if (want_dkey_bias) g.dkey_bias = CArray<T>({batch, n_k});
  return g;
}

// y, log Z and dy are indexed by the flat batch: (batch, n_q, d_v), (batch, n_q), (batch, n_q, d_v).
template <class T>
void check_saved(int64_t batch, int64_t n_q, int64_t d_v, const CArray<T>& y, const CArray<T>& log_z,
                 const CArray<T>& dy) {
  auto same = [&](const CArray<T>& a) {
    return a.ndim() == 3 && a.shape(0) == batch && a.shape(1) == n_q && a.shape(2) == d_v;
  };
  if (!same(y) || !same(dy) || log_z.ndim() != 2 || log_z.shape(0) != batch || log_z.shape(1) != n_q)
    throw std::invalid_argument("internal: y, log_partition and dy must be (batch, n_q, d_v), (batch, n_q)");
}

template <class T>
void def_attention_backward(py::module_& m) {
  m.def(
      "softmax_attention_backward",
      [](const AttentionArgs<T>& a, double scale, const CArray<T>& y, const CArray<T>& log_z, const CArray<T>& dy,
         bool want_dkey_bias, int64_t block_q, int64_t block_k) {
        check_saved(a.batch, a.q.rows, a.v.cols, y, log_z, dy);
        auto g = make_gradients<T>(a.batch, a.q.rows, a.k.rows, a.q.cols, a.v.cols, false, want_dkey_bias);
        {
          py::gil_scoped_release release;
          softmax_attention_backward<T>(a.batch, a.q, a.k, a.v, a.mask, a.causal, T(scale), y.data(), log_z.data(),
                                        dy.data(), g.view(), Blocking{block_q, block_k});
        }
        return g.result();
      },
      py::arg("operands"), py::arg("scale"), py::arg("y").noconvert(), py::arg("log_partition").noconvert(),
      py::arg("dy").noconvert(), py::arg("want_dkey_bias"), py::arg("block_q") = 0, py::arg("block_k") = 0,
      "Returns (dq, dk, dv, None, dkey_bias or None), each over the flat batch.");

  m.def(
      "ridge_attention_backward",
      [](const AttentionArgs<T>& a, const std::string& kernel, const py::dict& params, const CArray<T>& y,
         const CArray<T>& log_z, const CArray<T>& dy) {
        check_saved(a.batch, a.q.rows, a.v.cols, y, log_z, dy);
        auto g = make_gradients<T>(a.batch, a.q.rows, a.k.rows, a.q.cols, a.v.cols, true, false);
        with_kernel<T>(kernel, params, [&](const auto& psi) {
          py::gil_scoped_release release;
          ridge_attention_backward<T>(a.batch, a.q, a.radii(), a.tau_index, a.k, a.v, a.mask, a.causal, psi, y.data(),
                                      log_z.data(), dy.data(), g.view());
        });
        return g.result();
      },
      py::arg("operands"), py::arg("kernel"), py::arg("params"), py::arg("y").noconvert(),
      py::arg("log_partition").noconvert(), py::arg("dy").noconvert(),
      "Returns (du, dk, dv, dtau, None), each over the flat batch.");
}

}  // namespace

void bind_attention(py::module_& m) {
  def_attention<double>(m);
  def_attention<float>(m);
  def_attention_backward<double>(m);
  def_attention_backward<float>(m);
}
