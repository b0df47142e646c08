// pybind11 glue for bf16.hpp and products.hpp: the forward's bfloat16 and float products
// (attngeom.models.nn.products checks operands).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "dot_products.hpp"
#include "attngeom/bf16.hpp"
#include "attngeom/products.hpp"
#include "attngeom/token_ops.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

using Floats = py::array_t<float, py::array::c_style>;

float* writable(Floats& a, const char* name) {
  if (!a.writeable()) throw std::invalid_argument(std::string(name) + " must be writable");
  return a.mutable_data();
}

template <class T>
CArray<T> float_matmul(const CArray<T>& x, const CArray<T>& w, bool w_rows_are_outputs) {
  if (x.ndim() != 2 || w.ndim() != 2 || x.shape(1) != w.shape(w_rows_are_outputs ? 1 : 0))
    throw std::invalid_argument("matmul: x (m, k) and w (n, k) or (k, n) expected");
  const int64_t m = x.shape(0), k = x.shape(1), n = w.shape(w_rows_are_outputs ? 0 : 1);
  CArray<T> c({m, n});
  {
    py::gil_scoped_release release;
    matmul(m, n, k, x.data(), w.data(), w_rows_are_outputs, c.mutable_data());
  }
  return c;
}

}  // namespace

void bind_products(py::module_& m) {
  m.def(
      "rms_norm",
      [](const Floats& x, const Floats& w, float eps, std::optional<Floats> out, bool parallel) {
        const int64_t d = x.ndim() ? x.shape(x.ndim() - 1) : 0;
        if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != d) throw std::invalid_argument("rms_norm: x (..., d), w (d,)");
        Floats y = out ? *out : Floats(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        if (out && (y.ndim() != x.ndim() || !std::equal(x.shape(), x.shape() + x.ndim(), y.shape())))
          throw std::invalid_argument("rms_norm: out must have x's shape");
        float* dst = writable(y, "out");
        {
          py::gil_scoped_release release;
          rms_norm(x.data(), d ? x.size() / d : 0, d, w.data(), eps, dst, parallel);
        }
        return y;
      },
      py::arg("x").noconvert(), py::arg("w").noconvert(), py::arg("eps"), py::arg("out").noconvert() = py::none(),
      py::arg("parallel") = false,
      "w * x / sqrt(mean(x^2, -1) + eps) of C-contiguous float32 x (..., d); out: a C-contiguous float32 array of "
      "x's shape to write into (returned; it may be x); parallel: rows on the core's threads (the same bits).");
  m.def(
      "finish_heads",
      [](const Floats& x, Floats out, int64_t row0, std::optional<Floats> w, float eps, std::optional<Floats> cos,
         std::optional<Floats> sin, bool interleaved, bool round, bool parallel) {
        if (x.ndim() != 3 || out.ndim() != 3 || out.shape(0) != x.shape(1) || out.shape(2) != x.shape(2) || row0 < 0 ||
            row0 + x.shape(0) > out.shape(1))
          throw std::invalid_argument("finish_heads: x (rows, heads, d), out (heads, total, d) with rows from row0");
        const int64_t rows = x.shape(0), heads = x.shape(1), d = x.shape(2);
        if (w && (w->ndim() != 1 || w->shape(0) != d)) throw std::invalid_argument("finish_heads: w (d,)");
        if (bool(cos) != bool(sin) || (cos && (cos->ndim() != 2 || cos->shape(0) != rows || cos->shape(1) != d ||
                                               sin->ndim() != 2 || sin->shape(0) != rows || sin->shape(1) != d || d % 2)))
          throw std::invalid_argument("finish_heads: cos and sin (rows, d) with even d, both or neither");
        float* dst = writable(out, "out") + row0 * d;
        py::gil_scoped_release release;
        finish_heads(x.data(), rows, heads, d, w ? w->data() : nullptr, eps, cos ? cos->data() : nullptr,
                     sin ? sin->data() : nullptr, interleaved, round, dst, out.shape(1) * d, parallel);
      },
      py::arg("x").noconvert(), py::arg("out").noconvert(), py::arg("row0"), py::arg("w").noconvert() = py::none(),
      py::arg("eps") = 0.0f, py::arg("cos").noconvert() = py::none(), py::arg("sin").noconvert() = py::none(),
      py::arg("interleaved") = false, py::arg("round") = false, py::arg("parallel") = false,
      "Head vectors x (rows, heads, d) RMS-normed by w (if given), rotated by cos and sin (rows, d) (if given), "
      "rounded to bfloat16 values (round) and written to out[:, row0:row0 + rows] (heads, total, d), in one pass: "
      "rms_norm's, rotate_half's and round_bf16_values' bits. C-contiguous float32 arrays; parallel: rows on the "
      "core's threads (the same bits).");
  m.def(
      "silu_mul",
      [](const Floats& g, Floats u, bool parallel) {
        if (g.size() != u.size()) throw std::invalid_argument("silu_mul: g and u differ in size");
        float* out = writable(u, "u");
        py::gil_scoped_release release;
        silu_mul(g.data(), out, u.size(), parallel);
      },
      py::arg("g").noconvert(), py::arg("u").noconvert(), py::arg("parallel") = false,
      "u *= silu(g), in place (C-contiguous float32); parallel: on the core's threads (the same bits).");
  m.def(
      "rotate_half",
      [](const Floats& x, const Floats& cos, const Floats& sin, bool interleaved) {
        if (x.ndim() != 3 || cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(0) != x.shape(0) ||
            cos.shape(1) != x.shape(2) || sin.shape(0) != x.shape(0) || sin.shape(1) != x.shape(2) || x.shape(2) % 2)
          throw std::invalid_argument("rotate_half: x (rows, heads, d) with even d, cos and sin (rows, d)");
        Floats y({x.shape(0), x.shape(1), x.shape(2)});
        {
          py::gil_scoped_release release;
          rotate_half(x.data(), x.shape(0), x.shape(1), x.shape(2), cos.data(), sin.data(), interleaved,
                      y.mutable_data());
        }
        return y;
      },
      py::arg("x").noconvert(), py::arg("cos").noconvert(), py::arg("sin").noconvert(), py::arg("interleaved"),
      "x cos + rotate_half(x) sin for C-contiguous float32 x (rows, heads, d), cos and sin (rows, d).");
  m.def(
      "round_bf16_values",
      [](Floats x) {
        float* out = writable(x, "x");
        py::gil_scoped_release release;
        round_to_bf16_values(out, x.size());
      },
      py::arg("x").noconvert(), "x = bfloat16(x) as float32 values, in place (C-contiguous float32).");
  m.def("matmul", &float_matmul<float>, py::arg("x").noconvert(), py::arg("w").noconvert(),
        py::arg("w_rows_are_outputs"));
  m.def("matmul", &float_matmul<double>, py::arg("x").noconvert(), py::arg("w").noconvert(),
        py::arg("w_rows_are_outputs"),
        "x @ w.T (w_rows_are_outputs) or x @ w for C-contiguous x (m, k) and w of x's dtype (float32 or "
        "float64), on the calling thread (Eigen's GEMM).");
  m.def(
      "widen_bf16",
      [](const CArray<uint16_t>& bits) {
        CArray<float> x(std::vector<py::ssize_t>(bits.shape(), bits.shape() + bits.ndim()));
        {
          py::gil_scoped_release release;
          widen_bf16(bits.data(), bits.size(), x.mutable_data());
        }
        return x;
      },
      py::arg("bits").noconvert(), "float32 values of a C-contiguous array of bfloat16 bits (exact).");
  m.def(
      "round_bf16",
      [](const CArray<float>& x) {
        py::array_t<uint16_t> bits(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        {
          py::gil_scoped_release release;
          round_to_bf16(x.data(), x.size(), bits.mutable_data());
        }
        return bits;
      },
      py::arg("x").noconvert(), "bfloat16 bits of a C-contiguous float32 array (nearest, ties to even).");
  def_dot_products(m);
}
