// Types shared by the kernels: row-major matrices, stacks of blocks addressed through a
// batch index, attention masks and the causal alignment.
//
// Layout: every operand is a stack of contiguous row-major (rows, cols) blocks. The flat
// batch index b selects block `index[b]` of each operand, which is how NumPy broadcasting
// of the leading dimensions reaches the core without copies.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "attngeom/parallel.hpp"

namespace attngeom {

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Which keys a query may see. TopLeft (PyTorch's is_causal): key j <= query i.
// BottomRight (FlashAttention >= 2.1, a query block appended to a cache): j <= i + n_k - n_q.
enum class Causal { None, TopLeft, BottomRight };

// A stack of (rows, cols) row-major blocks addressed through a batch index.
template <class T>
struct Stack {
  const T* data = nullptr;
  const int64_t* index = nullptr;  // flat batch -> block; nullptr means identity
  int64_t rows = 0, cols = 0;
  const T* block(int64_t b) const { return data + (index ? index[b] : b) * rows * cols; }
};

// Boolean (True = attend) or additive mask, broadcast over (n_q, n_k) with zero strides.
template <class T>
struct Mask {
  const uint8_t* keep = nullptr;  // boolean mask, or
  const T* bias = nullptr;        // additive mask
  const int64_t* index = nullptr;
  int64_t block_size = 0, row_stride = 0, col_stride = 0;
  bool active() const { return keep != nullptr || bias != nullptr; }
};

// Largest Euclidean row norm over the blocks that batch indices 0..batch-1 reach, as a
// double. A row whose squared norm overflows, or is so small that underflowed squares could
// matter, is measured again with its entries scaled (stableNorm), so the result is an upper
// bound to rounding for any finite input.
template <class T>
double max_row_norm(int64_t batch, const Stack<T>& s) {
  const T exact_from = T(s.cols) * std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  double best = 0;
#pragma omp parallel for reduction(max : best) schedule(static) if (parallel_worth(double(batch) * s.rows * s.cols))
  for (int64_t b = 0; b < batch; ++b) {
    const Eigen::Map<const RowMatrix<T>> B(s.block(b), s.rows, s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      const T n2 = B.row(r).squaredNorm();
      const double n = (n2 >= exact_from && n2 <= std::numeric_limits<T>::max())
                           ? std::sqrt(double(n2))
                           : double(B.row(r).template cast<double>().stableNorm());
      best = std::max(best, n);
    }
  }
  return best;
}

// "float32" or "float64", for messages.
template <class T>
const char* dtype_name() {
  return sizeof(T) == 4 ? "float32" : "float64";
}

// A number for messages: three significant digits ("1e-160", "4e+400" stays "inf").
inline std::string number(double x) {
  std::ostringstream out;
  out.precision(3);
  out << x;
  return out.str();
}

// Throws std::invalid_argument (ValueError in Python) when `bound`, an upper bound of a
// quantity the kernel computes, may exceed `limit`; `what` names the quantity and `fix` says
// what to change.
inline void check_bound(double bound, double limit, const std::string& what, const std::string& fix) {
  if (bound <= limit) return;
  throw std::invalid_argument(what + " may reach " + number(bound) + ", beyond the float range (" + number(limit) +
                              "): " + fix);
}

}  // namespace attngeom
