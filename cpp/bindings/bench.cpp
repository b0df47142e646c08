// pybind11 glue for bench.hpp (benchmark-only: the batched GEMM ceiling).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#include "arrays.hpp"
#include "attngeom/bench.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_bench(py::module_& m) {
  m.def(
      "batched_gemm",
      [](const CArray<T>& a, const CArray<T>& b) {
        if (a.ndim() != 3 || b.ndim() != 3) throw std::invalid_argument("batched_gemm: a and b must be 3-d");
        const int64_t batch = a.shape(0), rows = a.shape(1), inner = a.shape(2), cols = b.shape(2);
        if (b.shape(0) != batch || b.shape(1) != inner)
          throw std::invalid_argument("batched_gemm: shapes (B, m, k) and (B, k, n) do not match");
        CArray<T> c({batch, rows, cols});
        {
          py::gil_scoped_release release;
          batched_gemm<T>(batch, rows, inner, cols, a.data(), b.data(), c.mutable_data());
        }
        return c;
      },
      py::arg("a").noconvert(), py::arg("b").noconvert(),
      "C[i] = A[i] @ B[i] for C-contiguous (B, m, k) and (B, k, n) arrays; OpenMP over B.");
}

}  // namespace

void bind_bench(py::module_& m) {
  def_bench<double>(m);
  def_bench<float>(m);
}
