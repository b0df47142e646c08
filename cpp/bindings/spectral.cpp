// pybind11 glue for spectral.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "arrays.hpp"
#include "attngeom/spectral.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

// (S, U, Vh) as a tuple; U and Vh are None when only singular values were asked for.
template <class T>
py::tuple svd_result(int64_t batch, int64_t rows, int64_t cols, int64_t k, bool vectors,
                     const std::function<void(const SvdOutput<T>&)>& run) {
  CArray<T> s({batch, k});
  std::optional<CArray<T>> u, vh;
  SvdOutput<T> out{s.mutable_data()};
  if (vectors) {
    u = CArray<T>({batch, rows, k});
    vh = CArray<T>({batch, k, cols});
    out.u = u->mutable_data();
    out.vh = vh->mutable_data();
  }
  {
    py::gil_scoped_release release;
    run(out);
  }
  return py::make_tuple(s, u ? py::object(*u) : py::none(), vh ? py::object(*vh) : py::none());
}

template <class T>
void def_spectral(py::module_& m) {
  m.def(
      "batched_svd",
      [](int64_t batch, const CArray<T>& a, const Index& ai, bool vectors) {
        const auto A = stack(a, ai);
        return svd_result<T>(batch, A.rows, A.cols, std::min(A.rows, A.cols), vectors,
                             [&](const SvdOutput<T>& out) { batched_svd<T>(batch, A, out); });
      },
      py::arg("batch"), py::arg("a").noconvert(), py::arg("a_index"), py::arg("vectors"));

  m.def(
      "factored_svd",
      [](int64_t batch, const CArray<T>& a, const Index& ai, const CArray<T>& b, const Index& bi, bool vectors) {
        const auto A = stack(a, ai), B = stack(b, bi);
        if (A.cols != B.rows) throw std::invalid_argument("internal: inner dimensions differ");
        const int64_t k = std::min({A.rows, A.cols, B.cols});
        return svd_result<T>(batch, A.rows, B.cols, k, vectors,
                             [&](const SvdOutput<T>& out) { factored_svd<T>(batch, A, B, out); });
      },
      py::arg("batch"), py::arg("a").noconvert(), py::arg("a_index"), py::arg("b").noconvert(),
      py::arg("b_index"), py::arg("vectors"));
}

}  // namespace

void bind_spectral(py::module_& m) {
  def_spectral<double>(m);
  def_spectral<float>(m);
}
