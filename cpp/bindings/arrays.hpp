// NumPy <-> core views shared by the bindings. The Python layer has already checked shapes
// and dtypes and made every operand C-contiguous; here arrays only become Stack/Mask views.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <stdexcept>

#include "attngeom/types.hpp"

namespace attngeom::bindings {

namespace py = pybind11;

template <class T>
using CArray = py::array_t<T, py::array::c_style>;
using Index = std::optional<CArray<int64_t>>;

inline const int64_t* index_ptr(const Index& idx) { return idx ? idx->data() : nullptr; }

// A stack of (rows, cols) blocks from an array of shape (blocks, rows, cols).
template <class T>
Stack<T> stack(const CArray<T>& a, const Index& idx) {
  if (a.ndim() != 3) throw std::invalid_argument("internal: expected a 3-d operand");
  return Stack<T>{a.data(), index_ptr(idx), a.shape(1), a.shape(2)};
}

// Mask of shape (blocks, mq, mk) with mq in {1, n_q}, mk in {1, n_k}; either boolean
// (stored as uint8) or additive.
template <class T>
Mask<T> mask(const std::optional<CArray<uint8_t>>& keep, const std::optional<CArray<T>>& bias, const Index& idx,
             int64_t n_q, int64_t n_k) {
  Mask<T> m;
  const py::array* a = nullptr;
  if (keep) {
    m.keep = keep->data();
    a = &*keep;
  } else if (bias) {
    m.bias = bias->data();
    a = &*bias;
  } else {
    return m;
  }
  if (a->ndim() != 3) throw std::invalid_argument("internal: expected a 3-d mask");
  const int64_t mq = a->shape(1), mk = a->shape(2);
  m.index = index_ptr(idx);
  m.block_size = mq * mk;
  m.row_stride = (mq == n_q && n_q > 1) ? mk : 0;
  m.col_stride = (mk == n_k && n_k > 1) ? 1 : 0;
  return m;
}

}  // namespace attngeom::bindings
