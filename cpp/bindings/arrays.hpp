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

// A new C-contiguous float32 (rows, cols) array whose data start on a cache line (64 bytes):
// a view of a NumPy array 15 floats longer, from its first entry on a line. NumPy's own start
// 16 bytes into one, so that each 64-byte row of a product's AMX result tile would straddle
// two lines. (NumPy's allocator, not an aligned operator new: glibc maps and faults in
// afresh, every call, a block past its 32 MB threshold, which NumPy's arrays of up to 32 MB
// stay under; a product of 2,048 x 4,096 took 1.7x as long.)
inline py::array_t<float> line_aligned(py::ssize_t rows, py::ssize_t cols) {
  py::array_t<float> whole(rows * cols + 15);
  float* first = whole.mutable_data();
  const auto at = reinterpret_cast<std::uintptr_t>(first);
  first += (64 - at % 64) % 64 / sizeof(float);  // NumPy's data start on 16 bytes at least
  const auto entry = py::ssize_t(sizeof(float));
  return py::array_t<float>({rows, cols}, {cols * entry, entry}, first, whole);
}

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

// The operands of one attention-like call over the flat batch, as the Python layer checked and
// broadcast them: q (or the tilts u), k and v, the radii tau (ridge attention and the
// Laplace-Radon statistics), the mask and the causal alignment. Python passes them as one dict,
// made by AttentionOperands.core_args() (python/attngeom/_operands/broadcast.py); the kernels' bindings take it first.
template <class T>
struct AttentionArgs {
  int64_t batch = 0;
  Stack<T> q, k, v;
  const T* tau = nullptr;  // (blocks, n_q) radii, or nullptr
  const int64_t* tau_index = nullptr;
  Mask<T> mask;
  Causal causal = Causal::None;
  // tau, for the kernels that need radii.
  const T* radii() const {
    if (!tau) throw std::invalid_argument("internal: the operands hold no radii tau");
    return tau;
  }
};

}  // namespace attngeom::bindings

namespace pybind11::detail {

// AttentionArgs<T> from the dict of AttentionOperands.core_args() (keys batch, q, q_index, k,
// k_index, v, v_index, tau, tau_index, mask_keep, mask_bias, mask_index, causal). It takes only
// C-contiguous arrays of dtype T (uint8 for a boolean mask, int64 for the batch indices), so
// the float32 and float64 overloads of a binding tell the operands apart, and it holds the
// arrays for the call.
template <class T>
struct type_caster<attngeom::bindings::AttentionArgs<T>> {
  PYBIND11_TYPE_CASTER(attngeom::bindings::AttentionArgs<T>, const_name("dict"));

 public:
  bool load(handle src, bool) {
    using namespace attngeom::bindings;
    if (!isinstance<dict>(src)) return false;
    const auto d = reinterpret_borrow<dict>(src);
    if (!(take(d, "q", q_) && q_ && take(d, "k", k_) && k_ && take(d, "v", v_) && v_ && take(d, "tau", tau_) &&
          take(d, "mask_keep", keep_) && take(d, "mask_bias", bias_) && take(d, "q_index", qi_) &&
          take(d, "k_index", ki_) && take(d, "v_index", vi_) && take(d, "tau_index", ti_) &&
          take(d, "mask_index", mi_)))
      return false;
    value.batch = d["batch"].cast<int64_t>();
    value.q = stack(*q_, qi_);
    value.k = stack(*k_, ki_);
    value.v = stack(*v_, vi_);
    value.tau = tau_ ? tau_->data() : nullptr;
    value.tau_index = index_ptr(ti_);
    value.mask = mask<T>(keep_, bias_, mi_, value.q.rows, value.k.rows);
    value.causal = static_cast<attngeom::Causal>(d["causal"].cast<int>());
    return true;
  }

 private:
  // d[key] into `out` when it is None (left empty) or an array of type A.
  template <class A>
  static bool take(const dict& d, const char* key, std::optional<A>& out) {
    const object a = d[key];
    if (a.is_none()) return true;
    if (!isinstance<A>(a)) return false;
    out = reinterpret_borrow<A>(a);
    return true;
  }
  std::optional<attngeom::bindings::CArray<T>> q_, k_, v_, tau_, bias_;
  std::optional<attngeom::bindings::CArray<uint8_t>> keep_;
  attngeom::bindings::Index qi_, ki_, vi_, ti_, mi_;
};

}  // namespace pybind11::detail
