// pybind11 glue for bf16.hpp's product and its path, shared by the core's modules
// (products.cpp) and the tests' emulated module (cpp/emulation/bf16_emulated.cpp).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "attngeom/bf16.hpp"

namespace attngeom::bindings {

// The path of a name ('' the best), checked: a name of no path, or of one this CPU lacks, is
// refused.
inline DotPath dot_path_named(const std::string& path, const char* who) {
  const DotPath chosen = path.empty()               ? DotPath::best
                         : path == "amx_bf16"    ? DotPath::amx_bf16
                         : path == "avx512_bf16" ? DotPath::avx512_bf16
                         : path == "widened"     ? DotPath::widened
                                                 : throw std::invalid_argument(std::string(who) + ": unknown path " + path);
  if (!has_dot_path(chosen)) throw std::invalid_argument(std::string(who) + ": this CPU has no " + path + " path");
  return chosen;
}

inline void def_dot_products(py::module_& m) {
  m.def("dot_path", &dot_path,
        "The bfloat16 products' path: 'amx_bf16' where the CPU has AMX-BF16 tiles, 'avx512_bf16' where it has "
        "bfloat16 dot products, 'widened' elsewhere, unless set_dot_path chose another.");
  m.def(
      "set_dot_path",
      [](const std::string& path) { set_dot_path(dot_path_named(path, "set_dot_path")); }, py::arg("path"),
      "Chooses the bfloat16 products' path for the process ('' the fastest this CPU has, 'amx_bf16', 'avx512_bf16' "
      "or 'widened'; for tests and benchmarks).");
  m.def(
      "matmul_bf16",
      [](const CArray<float>& x, const CArray<uint16_t>& w, bool parallel, const std::string& path,
         std::optional<py::array_t<float>> out, std::optional<CArray<float>> add) {
        if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(1))
          throw std::invalid_argument("matmul_bf16: x (m, k) and w (n, k) expected");
        const DotPath chosen = dot_path_named(path, "matmul_bf16");
        const int64_t m_ = x.shape(0), k = x.shape(1), n = w.shape(0);
        py::array_t<float> c = out ? *out : line_aligned(m_, n);
        // out: rows of contiguous entries at any row stride (a block of columns of a larger
        // array), written in place
        const auto entry = py::ssize_t(sizeof(float));
        if (out && (c.ndim() != 2 || c.shape(0) != m_ || c.shape(1) != n || !c.writeable() ||
                    (m_ > 1 && n > 0 && (c.strides(0) % entry || c.strides(0) < n * entry)) ||
                    (n > 1 && m_ > 0 && c.strides(1) != entry)))
          throw std::invalid_argument("matmul_bf16: out must be a writable float32 (m, n) array of contiguous rows");
        const int64_t ldc = m_ > 1 && n > 0 ? int64_t(c.strides(0) / entry) : n;
        float* dst = c.mutable_data();
        if (add) {
          if (add->ndim() != 2 || add->shape(0) != m_ || add->shape(1) != n)
            throw std::invalid_argument("matmul_bf16: add must be a C-contiguous float32 (m, n) array");
          const auto bytes = [](const float* p, int64_t rows, int64_t cols, int64_t ld) {
            return std::pair<const char*, const char*>{reinterpret_cast<const char*>(p),
                                                       reinterpret_cast<const char*>(p + (rows - 1) * ld + cols)};
          };
          if (m_ > 0 && n > 0) {
            const auto [a0, a1] = bytes(add->data(), m_, n, n);
            const auto [c0, c1] = bytes(dst, m_, n, ldc);
            if (a0 < c1 && c0 < a1) throw std::invalid_argument("matmul_bf16: out and add overlap");
          }
        }
        {
          py::gil_scoped_release release;
          matmul_bf16(m_, k, x.data(), k, {BF16Factor{w.data(), n, k, dst, ldc, add ? add->data() : nullptr, n}},
                      parallel, chosen);
        }
        return c;
      },
      py::arg("x").noconvert(), py::arg("w").noconvert(), py::arg("parallel") = true, py::arg("path") = "",
      py::arg("out").noconvert() = py::none(), py::arg("add").noconvert() = py::none(),
      "bf16(x) @ w.T for C-contiguous float32 x (m, k) and bfloat16 bits w (n, k); float32 sums. path: '' (the "
      "best, dot_path()), 'amx_bf16', 'avx512_bf16' or 'widened'; out: a float32 (m, n) array of contiguous rows to "
      "write into (returned); add: a C-contiguous float32 (m, n) array added to the product, each block as its unit "
      "finishes it (the bits of the product plus add).");
  m.def(
      "matmul_bf16_many",
      [](const CArray<float>& x, const std::vector<py::array>& ws, bool parallel, const std::string& path) {
        if (x.ndim() != 2) throw std::invalid_argument("matmul_bf16_many: x (m, k) expected");
        const int64_t m_ = x.shape(0), k = x.shape(1);
        std::vector<py::array_t<float>> outs;
        std::vector<BF16Factor> factors;
        outs.reserve(ws.size());
        for (const py::array& a : ws) {
          if (!py::isinstance<CArray<uint16_t>>(a))
            throw std::invalid_argument("matmul_bf16_many: weights must be C-contiguous uint16 arrays of bfloat16 bits");
          const auto w = py::reinterpret_borrow<CArray<uint16_t>>(a);
          if (w.ndim() != 2 || w.shape(1) != k)
            throw std::invalid_argument("matmul_bf16_many: x (m, k) and weights (n_i, k) expected");
          outs.push_back(line_aligned(m_, w.shape(0)));
          factors.push_back({w.data(), w.shape(0), k, outs.back().mutable_data(), w.shape(0)});
        }
        const DotPath chosen = dot_path_named(path, "matmul_bf16_many");
        {
          py::gil_scoped_release release;
          matmul_bf16(m_, k, x.data(), k, factors, parallel, chosen);
        }
        return outs;
      },
      py::arg("x").noconvert(), py::arg("ws"), py::arg("parallel") = true, py::arg("path") = "",
      "[bf16(x) @ w.T for w in ws], as matmul_bf16 computes each (the same bits), with x rounded once for all of "
      "them and the threads spread over every product's columns: float32 x (m, k), C-contiguous bfloat16 bits w "
      "(n_i, k).");
}

}  // namespace attngeom::bindings
