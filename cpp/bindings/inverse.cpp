// pybind11 glue for inverse.hpp.
#include <pybind11/complex.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "arrays.hpp"
#include "attngeom/inverse.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

void bind_inverse(py::module_& m) {
  m.def(
      "matrix_pencil",
      [](const CArray<cd>& f, int64_t L, int64_t order, double rtol) {
        if (f.ndim() != 3) throw std::invalid_argument("f must have shape (B, C, N)");
        const int64_t B = f.shape(0), C = f.shape(1), N = f.shape(2);
        if (L < 1 || L > N - 2) throw std::invalid_argument("pencil L must lie in [1, N - 2]");
        const int64_t K = std::min(C * (N - L), L + 1);
        CArray<cd> z({B, L});
        CArray<int64_t> orders({B});
        CArray<double> sv({B, K});
        {
          py::gil_scoped_release release;
          matrix_pencil(B, C, N, f.data(), L, order, rtol, z.mutable_data(), orders.mutable_data(), sv.mutable_data());
        }
        return py::make_tuple(z, orders, sv);
      },
      py::arg("f").noconvert(), py::arg("L"), py::arg("order"), py::arg("rtol"),
      "f (B, C, N) complex128 -> (z (B, L), order (B), singular values (B, K)).");
  m.def(
      "exp_sum_weights",
      [](const CArray<cd>& tau, const CArray<cd>& s, const CArray<int64_t>& order, const CArray<cd>& f) {
        if (f.ndim() != 3 || s.ndim() != 2 || tau.ndim() != 1 || order.ndim() != 1)
          throw std::invalid_argument("expected tau (N,), s (B, M), order (B,), f (B, C, N)");
        const int64_t B = f.shape(0), C = f.shape(1), N = f.shape(2), Mmax = s.shape(1);
        if (tau.shape(0) != N || s.shape(0) != B || order.shape(0) != B)
          throw std::invalid_argument("tau, s, order and f disagree in N or B");
        for (int64_t b = 0; b < B; ++b)
          if (order.data()[b] < 0 || order.data()[b] > Mmax) throw std::invalid_argument("order out of range");
        CArray<cd> w({B, Mmax, C});
        {
          py::gil_scoped_release release;
          exp_sum_weights(B, C, N, Mmax, tau.data(), s.data(), order.data(), f.data(), w.mutable_data());
        }
        return w;
      },
      py::arg("tau").noconvert(), py::arg("s").noconvert(), py::arg("order").noconvert(), py::arg("f").noconvert());
  m.def(
      "nnls",
      [](const CArray<double>& A, const CArray<double>& b, int64_t max_iter) {
        if (A.ndim() != 2 || b.ndim() != 1 || b.shape(0) != A.shape(0))
          throw std::invalid_argument("nnls expects A (m, n) and b (m,)");
        const int64_t rows = A.shape(0), cols = A.shape(1);
        CArray<double> x({cols});
        int64_t it;
        {
          py::gil_scoped_release release;
          it = nnls(rows, cols, A.data(), b.data(), x.mutable_data(), max_iter);
        }
        return py::make_tuple(x, it);
      },
      py::arg("A").noconvert(), py::arg("b").noconvert(), py::arg("max_iter"),
      "Lawson-Hanson NNLS; the iteration count is negative when max_iter was reached.");
}
