// pybind11 glue for whitening.hpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "attngeom/whitening.hpp"

namespace py = pybind11;
using namespace attngeom;
using namespace attngeom::bindings;

namespace {

template <class T>
void def_whitening(py::module_& m) {
  m.def(
      "whiten",
      [](const CArray<T>& x, const CArray<T>& L, const CArray<T>& M, bool lower, int64_t block, bool varying) {
        const int64_t B = x.shape(0), Tn = x.shape(1), D = x.shape(2);
        CArray<T> w({B, Tn, D});
        {
          py::gil_scoped_release release;
          if (block > 0) {
            whiten_scan<T>(B, Tn, D, x.data(), L.data(), M.data(), lower, block, w.mutable_data());
          } else {
            whiten<T>(B, Tn, D, x.data(), L.data(), M.data(), lower, varying, w.mutable_data());
          }
        }
        return w;
      },
      py::arg("x").noconvert(), py::arg("L").noconvert(), py::arg("M").noconvert(), py::arg("lower"),
      py::arg("block") = 0, py::arg("varying") = false, "block = 0: sequential recursion; block > 0: blocked scan with that block length.");
}

}  // namespace

void bind_whitening(py::module_& m) {
  def_whitening<double>(m);
  def_whitening<float>(m);
}
