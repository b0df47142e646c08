// Benchmark-only helpers: the machine's batched GEMM ceiling, computed the way the
// attention kernel computes its blocks (Eigen row-major products, OpenMP over the batch,
// Eigen itself single-threaded).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <Eigen/Core>
#include <cstdint>
#include <stdexcept>

#include "arrays.hpp"
#include "attngeom/kernels.hpp"

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
        const T* pa = a.data();
        const T* pb = b.data();
        T* pc = c.mutable_data();
        {
          py::gil_scoped_release release;
          using CMap = Eigen::Map<const RowMatrix<T>>;
          using Map = Eigen::Map<RowMatrix<T>>;
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < batch; ++i) {
            Map C(pc + i * rows * cols, rows, cols);
            C.noalias() = CMap(pa + i * rows * inner, rows, inner) * CMap(pb + i * inner * cols, inner, cols);
          }
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
