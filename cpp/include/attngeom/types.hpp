// Types shared by the kernels: row-major matrices, stacks of blocks addressed through a
// batch index, attention masks and the causal alignment.
//
// Layout: every operand is a stack of contiguous row-major (rows, cols) blocks. The flat
// batch index b selects block `index[b]` of each operand, which is how NumPy broadcasting
// of the leading dimensions reaches the core without copies.
#pragma once

#include <Eigen/Core>
#include <cstdint>

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

}  // namespace attngeom
