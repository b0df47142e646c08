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
#include <cstdio>
#include <stdexcept>
#include <string>

#include "attngeom/parallel.hpp"

namespace attngeom {

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Which keys a query may see. TopLeft (PyTorch's is_causal): key j <= query i.
// BottomRight (FlashAttention >= 2.1, a query block appended to a cache): j <= i + n_k - n_q.
enum class Causal { None, TopLeft, BottomRight };

// The keys each query of an (n_q, n_k) call sees: query i sees keys j < end(i), which is
// j <= i + offset under a causal limit (offset n_k - n_q for BottomRight, 0 for TopLeft) and
// every key without one. The one statement of the alignment for every kernel.
struct Visibility {
  Causal causal;
  int64_t n_q, n_k, offset;
  Visibility(Causal causal, int64_t n_q, int64_t n_k)
      : causal(causal), n_q(n_q), n_k(n_k), offset(causal == Causal::BottomRight ? n_k - n_q : 0) {}
  bool limited() const { return causal != Causal::None; }
  // Keys [0, end(i)) are visible to query i; i = i0 - 1 gives the keys every query from i0 on sees.
  int64_t end(int64_t i) const { return limited() ? std::clamp<int64_t>(i + 1 + offset, 0, n_k) : n_k; }
  // How many keys of the block [j0, j0 + cols) query i sees (a prefix of the block).
  int64_t seen(int64_t i, int64_t j0, int64_t cols) const {
    return limited() ? std::clamp<int64_t>(i + 1 + offset - j0, 0, cols) : cols;
  }
  // The first query that sees key j (n_q when none does).
  int64_t first_query(int64_t j) const { return limited() ? std::clamp<int64_t>(j - offset, 0, n_q) : 0; }
};

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

// An operand holds NaN or inf (NonFiniteOperand in Python), or a result is beyond the float
// range for finite operands (ResultOverflow): the bindings raise the Python classes of
// attngeom.errors, so the kernels' own checks read as the Python layer's.
struct NonFiniteOperand : std::invalid_argument {
  explicit NonFiniteOperand(const std::string& name)
      : std::invalid_argument(name + " contains NaN or infinite values") {}
};
struct ResultOverflow : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Largest Euclidean row norm over the blocks that batch indices 0..batch-1 reach, as a
// double; NaN when an entry is NaN or infinite. A row whose squared norm overflows, or is so
// small that underflowed squares could matter, is measured again with its entries scaled
// (stableNorm), so the result is an upper bound to rounding for any finite input. The check
// for non-finite entries is free: only a row whose squared norm is not finite is read again.
template <class T>
double max_row_norm(int64_t batch, const Stack<T>& s) {
  const T exact_from = T(s.cols) * std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  double best = 0;
  bool finite = true;
#pragma omp parallel for reduction(max : best) reduction(&& : finite) schedule(static) \
    if (parallel_worth(double(batch) * s.rows * s.cols))
  for (int64_t b = 0; b < batch; ++b) {
    const Eigen::Map<const RowMatrix<T>> B(s.block(b), s.rows, s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      const T n2 = B.row(r).squaredNorm();
      if (n2 >= exact_from && n2 <= std::numeric_limits<T>::max()) {
        best = std::max(best, std::sqrt(double(n2)));
      } else if (!(n2 <= std::numeric_limits<T>::infinity()) || !B.row(r).allFinite()) {
        finite = false;  // NaN, or an infinite entry
      } else {
        best = std::max(best, double(B.row(r).template cast<double>().stableNorm()));
      }
    }
  }
  return finite ? best : std::numeric_limits<double>::quiet_NaN();
}

// Whether every x[0:n] is finite: one pass in blocks of 16k entries, parallel over them, with
// no temporary (the validation layer's check of large operands and results).
template <class T>
bool all_finite(const T* x, int64_t n) {
  constexpr int64_t BLOCK = int64_t(1) << 14;
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static) if (parallel_worth(double(n)))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * BLOCK;
    finite = finite && Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x + i, std::min(BLOCK, n - i)).allFinite();
  }
  return finite;
}

// Throws NonFiniteOperand naming the stack unless every entry that batch indices
// 0..batch-1 reach is finite. One pass, parallel over the blocks.
template <class T>
void check_finite(int64_t batch, const Stack<T>& s, const std::string& name) {
  bool finite = true;
#pragma omp parallel for reduction(&& : finite) schedule(static) if (parallel_worth(double(batch) * s.rows * s.cols))
  for (int64_t b = 0; b < batch; ++b)
    finite = finite && Eigen::Map<const RowMatrix<T>>(s.block(b), s.rows, s.cols).allFinite();
  if (!finite) throw NonFiniteOperand(name);
}

// "float32" or "float64", for messages.
template <class T>
const char* dtype_name() {
  return sizeof(T) == 4 ? "float32" : "float64";
}

// A number for messages: three significant digits ("1e-160", "4e+400" stays "inf"). C's
// formatting, not a string stream: the kernels use no iostream or locale object.
inline std::string number(double x) {
  char text[32];
  const int n = std::snprintf(text, sizeof text, "%.3g", x);
  return std::string(text, n > 0 ? std::min<size_t>(size_t(n), sizeof text - 1) : 0);
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
