// pybind11 glue shared by the attention bindings (attention.cpp) and the tests' emulated
// module (cpp/emulation/bf16_emulated.cpp): the output arrays of a forward call and the
// softmax forward itself.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "arrays.hpp"
#include "attngeom/attention.hpp"

namespace attngeom::bindings {

// The per-query statistics (AttentionStatsOutput), each (batch, n_q).
template <class T>
struct StatsArrays {
  CArray<T> entropy, max_weight;
  CArray<int64_t> argmax;
  CArray<T> sink_weight, mean_distance;
};

template <class T>
struct Outputs {
  CArray<T> y;
  std::optional<CArray<T>> weights, log_partition;
  std::optional<StatsArrays<T>> stats;
  AttentionOutput<T> view() {
    AttentionOutput<T> o{y.mutable_data(), weights ? weights->mutable_data() : nullptr,
                         log_partition ? log_partition->mutable_data() : nullptr, {}};
    if (stats)
      o.stats = {stats->entropy.mutable_data(), stats->max_weight.mutable_data(), stats->argmax.mutable_data(),
                 stats->sink_weight.mutable_data(), stats->mean_distance.mutable_data()};
    return o;
  }
  // (y, weights or None, log Z or None, (entropy, max_weight, argmax, sink_weight,
  // mean_distance) or None)
  py::tuple result() {
    py::object st = py::none();
    if (stats)
      st = py::make_tuple(stats->entropy, stats->max_weight, stats->argmax, stats->sink_weight,
                          stats->mean_distance);
    return py::make_tuple(y, weights ? py::object(*weights) : py::none(),
                          log_partition ? py::object(*log_partition) : py::none(), st);
  }
};

template <class T>
Outputs<T> make_outputs(int64_t batch, int64_t n_q, int64_t n_k, int64_t d_v, bool want_weights, bool want_logz,
                        bool want_stats, int64_t y_heads = 1) {
  // y (batch, n_q, d_v), or (batch / y_heads, n_q, y_heads d_v) (AttentionOutput::y_heads)
  Outputs<T> o{CArray<T>({batch / y_heads, n_q, y_heads * d_v}), std::nullopt, std::nullopt, std::nullopt};
  if (want_weights) o.weights = CArray<T>({batch, n_q, n_k});
  if (want_logz || want_stats) o.log_partition = CArray<T>({batch, n_q});
  if (want_stats)
    o.stats = StatsArrays<T>{CArray<T>({batch, n_q}), CArray<T>({batch, n_q}), CArray<int64_t>({batch, n_q}),
                             CArray<T>({batch, n_q}), CArray<T>({batch, n_q})};
  return o;
}

template <class T>
void def_softmax_attention(py::module_& m) {
  m.def(
      "softmax_attention",
      [](const AttentionArgs<T>& a, double scale, bool want_weights, bool want_logz, int64_t block_q,
         int64_t block_k, bool want_stats, bool bf16, int64_t y_heads) {
        if (y_heads < 1 || a.batch % y_heads != 0)
          throw std::invalid_argument("softmax_attention: y_heads must divide the batch");
        auto out =
            make_outputs<T>(a.batch, a.q.rows, a.k.rows, a.v.cols, want_weights, want_logz, want_stats, y_heads);
        AttentionOutput<T> view = out.view();
        view.y_heads = y_heads;
        {
          py::gil_scoped_release release;
          softmax_attention<T>(a.batch, a.q, a.k, a.v, a.mask, a.causal, T(scale), view, Blocking{block_q, block_k},
                               bf16);
        }
        return out.result();
      },
      py::arg("operands"), py::arg("scale"), py::arg("want_weights"), py::arg("want_logz"), py::arg("block_q") = 0,
      py::arg("block_k") = 0, py::arg("want_stats") = false, py::arg("bf16") = false, py::arg("y_heads") = 1,
      "bf16 (float32 only): bfloat16 products (attention.hpp, attend). y_heads > 1: y (batch / y_heads, n_q, "
      "y_heads * d_v), the batch's runs of y_heads entries written side by side per query (AttentionOutput).");
}

}  // namespace attngeom::bindings
