// Backward pass of lightning attention (lightning.hpp), y_i = sum_{j visible to i} (q_i . k_j) v_j.
//
// With the visibility pattern C (C_ij = 1 when query i sees key j) and Y = (Q K^T o C) V, a
// cotangent dY gives
//
//     dQ = (dY V^T o C) K,   dK = (V dY^T o C^T) Q,   dV = (K Q^T o C^T) dY,
//
// three lightning products again, each O(n d^2) by the chunked forward kernel: dQ is the
// forward with (queries, keys, values) = (dY, V, K) and the same pattern; dK and dV see the
// transposed (anti-causal) pattern, which is the causal one on the time-reversed sequences
// with the other alignment (j <= i + off  <=>  i' <= j' + n_q - n_k + off for i' = n_q - 1 - i,
// j' = n_k - 1 - j: top-left becomes bottom-right and vice versa).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attngeom/lightning.hpp"
#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

namespace detail {

// Rows of every block of `s` (batch blocks through its index) in reverse order, into `out`.
template <class T>
void reverse_rows(int64_t batch, const Stack<T>& s, std::vector<T>& out, bool par) {
  const int64_t n = s.rows, d = s.cols;
  out.resize(size_t(batch * n * d));
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < batch; ++b) {
    const T* src = s.block(b);
    T* dst = out.data() + b * n * d;
    for (int64_t i = 0; i < n; ++i) std::copy(src + (n - 1 - i) * d, src + (n - i) * d, dst + i * d);
  }
}

}  // namespace detail

// dq (batch, n_q, d_k), dk (batch, n_k, d_k), dv (batch, n_k, d_v) over the flat batch, for the
// output cotangent dy (batch, n_q, d_v).
template <class T>
void lightning_attention_backward(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v,
                                  Causal causal, int64_t chunk, const T* dy, T* dq, T* dk, T* dv) {
  const int64_t n_q = q.rows, d_k = q.cols, n_k = k.rows, d_v = v.cols;
  const Stack<T> dY{dy, nullptr, n_q, d_v};
  if (d_v == 0) {
    std::fill(dq, dq + batch * n_q * d_k, T(0));
    std::fill(dk, dk + batch * n_k * d_k, T(0));
    return;
  }
  lightning_attention<T>(batch, dY, v, k, causal, chunk, dq);
  if (causal == Causal::None) {
    lightning_attention<T>(batch, v, dY, q, causal, chunk, dk);
    lightning_attention<T>(batch, k, q, dY, causal, chunk, dv);
    return;
  }
  const bool par = parallel_worth(double(batch) * (n_q + n_k) * (d_k + d_v));
  std::vector<T> qr, kr, vr, dyr, dkr(size_t(batch * n_k * d_k)), dvr(size_t(batch * n_k * d_v));
  detail::reverse_rows(batch, q, qr, par);
  detail::reverse_rows(batch, k, kr, par);
  detail::reverse_rows(batch, v, vr, par);
  detail::reverse_rows(batch, dY, dyr, par);
  const Causal flipped = causal == Causal::TopLeft ? Causal::BottomRight : Causal::TopLeft;
  const Stack<T> Qr{qr.data(), nullptr, n_q, d_k}, Kr{kr.data(), nullptr, n_k, d_k}, Vr{vr.data(), nullptr, n_k, d_v},
      dYr{dyr.data(), nullptr, n_q, d_v};
  lightning_attention<T>(batch, Vr, dYr, Qr, flipped, chunk, dkr.data());
  lightning_attention<T>(batch, Kr, Qr, dYr, flipped, chunk, dvr.data());
  std::vector<T> tmp;
  detail::reverse_rows(batch, Stack<T>{dkr.data(), nullptr, n_k, d_k}, tmp, par);
  std::copy(tmp.begin(), tmp.end(), dk);
  detail::reverse_rows(batch, Stack<T>{dvr.data(), nullptr, n_k, d_v}, tmp, par);
  std::copy(tmp.begin(), tmp.end(), dv);
}

}  // namespace attngeom
