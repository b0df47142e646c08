// Lightning (unnormalized, linear) attention y_i = sum_j (q_i . k_j) v_j (Henry-Marchetti-
// Kohn, Definition 1, eq. 1-2), in O(n d_k d_v) time and without any n_q x n_k buffer.
//
// Non-causal: Y = Q (K^T V). Causal: queries are cut into chunks of C rows; chunk c sees a
// prefix state S_c = sum of k_j^T v_j over the keys every query of the chunk sees, plus one
// diagonal block of at most C keys under the causal mask. Three passes, each parallel:
// per-chunk key states D_c = K_c^T V_c (over batch x chunk), their prefix sums (per batch,
// O(n/C d_k d_v)), and the outputs Y_c = Q_c S_c + mask(Q_c K_c^T) V_c (over batch x chunk).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

// Keys visible to query i as Visibility (types.hpp) says: all, j <= i or j <= i + n_k - n_q.
template <class T>
void lightning_attention(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v, Causal causal,
                         int64_t chunk, T* y) {
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  using Map = Eigen::Map<Mat>;
  const int64_t n_q = q.rows, d_k = q.cols, n_k = k.rows, d_v = v.cols;
  if (n_q == 0 || d_v == 0) return;
  const bool par = parallel_worth(double(batch) * (n_q + n_k) * d_k * d_v);
  const Visibility vis(causal, n_q, n_k);
  if (!vis.limited()) {
    std::vector<Mat> kv(batch);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < batch; ++b)
      kv[b].noalias() = CMap(k.block(b), n_k, d_k).transpose() * CMap(v.block(b), n_k, d_v);
    const int64_t rows = std::max<int64_t>(1, chunk), chunks = (n_q + rows - 1) / rows;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t unit = 0; unit < batch * chunks; ++unit) {
      const int64_t b = unit / chunks, i0 = (unit % chunks) * rows, m = std::min(rows, n_q - i0);
      Map(y + (b * n_q + i0) * d_v, m, d_v).noalias() = CMap(q.block(b) + i0 * d_k, m, d_k) * kv[b];
    }
    return;
  }
  const int64_t C = std::max<int64_t>(1, chunk);
  const int64_t chunks = (n_q + C - 1) / C;
  // Key boundary of chunk c: keys [0, bound(c)) are visible to every query of chunk c.
  auto bound = [&](int64_t c) { return vis.end(c * C - 1); };
  // state[b][c] = K[0:bound(c)]^T V[0:bound(c)], c = 0..chunks-1.
  std::vector<Mat> state(batch * chunks);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t unit = 0; unit < batch * chunks; ++unit) {
    const int64_t b = unit / chunks, c = unit % chunks;
    // Chunk 0 starts from the keys before its first boundary; chunk c > 0 holds the block
    // [bound(c - 1), bound(c)) until the prefix sum below.
    const int64_t j0 = c == 0 ? 0 : bound(c - 1), j1 = bound(c);
    state[unit].noalias() = CMap(k.block(b) + j0 * d_k, j1 - j0, d_k).transpose() *
                            CMap(v.block(b) + j0 * d_v, j1 - j0, d_v);
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t c = 1; c < chunks; ++c) state[b * chunks + c] += state[b * chunks + c - 1];
#pragma omp parallel if (par)
  {
    Mat S(C, C);
#pragma omp for schedule(static)
    for (int64_t unit = 0; unit < batch * chunks; ++unit) {
      const int64_t b = unit / chunks, c = unit % chunks, i0 = c * C, m = std::min(C, n_q - i0);
      const int64_t j0 = bound(c), j1 = vis.end(i0 + m - 1);
      const CMap Q(q.block(b) + i0 * d_k, m, d_k);
      Map Y(y + (b * n_q + i0) * d_v, m, d_v);
      Y.noalias() = Q * state[unit];
      if (j1 > j0) {
        auto L = S.topLeftCorner(m, j1 - j0);
        L.noalias() = Q * CMap(k.block(b) + j0 * d_k, j1 - j0, d_k).transpose();
        for (int64_t r = 0; r < m; ++r)
          for (int64_t col = vis.seen(i0 + r, j0, j1 - j0); col < j1 - j0; ++col) L(r, col) = T(0);
        Y.noalias() += L * CMap(v.block(b) + j0 * d_v, j1 - j0, d_v);
      }
    }
  }
}

}  // namespace attngeom
