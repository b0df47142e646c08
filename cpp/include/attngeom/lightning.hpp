// Lightning (unnormalized, linear) attention y_i = sum_j (q_i . k_j) v_j (Henry-Marchetti-
// Kohn, Definition 1, eq. 1-2), in O(n d_k d_v) time and without any n_q x n_k buffer.
//
// Non-causal: Y = Q (K^T V). Causal: queries are cut into chunks of C rows; chunk c sees a
// prefix state S_c = sum of k_j^T v_j over the keys every query of the chunk sees, plus one
// diagonal block of at most C keys under the causal mask. Three passes, each parallel:
// per-chunk key states D_c = K_c^T V_c (over batch x chunk), their prefix sums (per batch,
// O(n/C d_k d_v)), and the outputs Y_c = Q_c S_c + mask(Q_c K_c^T) V_c (over batch x chunk),
// a group of chunks at a time so that the states of only one group are kept and a group's
// operands stay in cache from the first pass to the last.
//
// NaN / inf operands raise NonFiniteOperand naming q, k or v (the first of them in that order
// holding one). The causal passes check each chunk's rows while they are in cache for the
// products (a separate pass over operands beyond the last-level cache costs a quarter of the
// call at 16k tokens); the non-causal form checks its operands first. For finite operands an
// output beyond the float range raises ResultOverflow: each chunk of y is checked as it is
// written (a pass over y after the call cost 7% of it at 16k tokens, (4, n, 64) float64).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

inline constexpr const char* OUTPUT_OVERFLOW = "lightning_attention: the output is beyond the float range";

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
    check_finite(batch, q, "q");
    check_finite(batch, k, "k");
    check_finite(batch, v, "v");
    std::vector<Mat> kv(batch);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < batch; ++b)
      kv[b].noalias() = CMap(k.block(b), n_k, d_k).transpose() * CMap(v.block(b), n_k, d_v);
    const int64_t rows = std::max<int64_t>(1, chunk), chunks = (n_q + rows - 1) / rows;
    bool y_ok = true;
#pragma omp parallel for schedule(static) if (par) reduction(&& : y_ok)
    for (int64_t unit = 0; unit < batch * chunks; ++unit) {
      const int64_t b = unit / chunks, i0 = (unit % chunks) * rows, m = std::min(rows, n_q - i0);
      Map Y(y + (b * n_q + i0) * d_v, m, d_v);
      Y.noalias() = CMap(q.block(b) + i0 * d_k, m, d_k) * kv[b];
      y_ok = y_ok && Y.allFinite();
    }
    if (!y_ok) throw ResultOverflow(OUTPUT_OVERFLOW);
    return;
  }
  const int64_t C = std::max<int64_t>(1, chunk);
  const int64_t chunks = (n_q + C - 1) / C;
  // Key boundary of chunk c: keys [0, bound(c)) are visible to every query of chunk c.
  auto bound = [&](int64_t c) { return vis.end(c * C - 1); };
  // The chunks go in groups whose keys, values and states (over the batch) take about 1 MB,
  // what two cores' L2 halves hold; the three passes of a group run before the next, so the
  // outputs find the group's keys, values and states still in cache, and only one group's
  // states are kept (the last prefix state of a batch element carries into its next group).
  // The grouping changes only when each sum is formed, not its terms or their order: y is the
  // same bits for any grouping. The group follows the sizes alone, never the thread count.
  const double chunk_bytes = (double(C) * (d_k + d_v) + double(d_k) * d_v) * sizeof(T) * batch;
  const int64_t group = std::min(chunks, std::max<int64_t>(1, int64_t(double(1 << 20) / chunk_bytes)));
  // state[b * group + c - c0] = K[0:bound(c)]^T V[0:bound(c)] for the group's chunks c.
  std::vector<Mat> state(batch * group), carry(chunks > group ? batch : 0);
  // Whether every row of q, and of k and v up to the last chunk's boundary, is finite (rows
  // past it are checked after the passes).
  bool q_ok = true, k_ok = true, v_ok = true, y_ok = true;
#pragma omp parallel if (par) reduction(&& : q_ok, k_ok, v_ok, y_ok)
  {
    Mat S(C, C);
    for (int64_t c0 = 0; c0 < chunks; c0 += group) {
      const int64_t width = std::min(group, chunks - c0);
#pragma omp for schedule(static)
      for (int64_t unit = 0; unit < batch * width; ++unit) {
        const int64_t b = unit / width, c = c0 + unit % width;
        // Chunk 0 starts from the keys before its first boundary; chunk c > 0 holds the block
        // [bound(c - 1), bound(c)) until the prefix sum below.
        const int64_t j0 = c == 0 ? 0 : bound(c - 1), j1 = bound(c);
        const CMap K(k.block(b) + j0 * d_k, j1 - j0, d_k), V(v.block(b) + j0 * d_v, j1 - j0, d_v);
        state[b * group + c - c0].noalias() = K.transpose() * V;
        k_ok = k_ok && K.allFinite();
        v_ok = v_ok && V.allFinite();
      }
      // Prefix sums, from the state carried out of the batch element's previous group.
#pragma omp for schedule(static)
      for (int64_t b = 0; b < batch; ++b) {
        if (c0 > 0) state[b * group] += carry[b];
        for (int64_t c = 1; c < width; ++c) state[b * group + c] += state[b * group + c - 1];
        if (c0 + width < chunks) carry[b] = state[b * group + width - 1];
      }
#pragma omp for schedule(static)
      for (int64_t unit = 0; unit < batch * width; ++unit) {
        const int64_t b = unit / width, c = c0 + unit % width, i0 = c * C, m = std::min(C, n_q - i0);
        const int64_t j0 = bound(c), j1 = vis.end(i0 + m - 1);
        const CMap Q(q.block(b) + i0 * d_k, m, d_k);
        q_ok = q_ok && Q.allFinite();
        Map Y(y + (b * n_q + i0) * d_v, m, d_v);
        Y.noalias() = Q * state[b * group + c - c0];
        if (j1 > j0) {
          auto L = S.topLeftCorner(m, j1 - j0);
          L.noalias() = Q * CMap(k.block(b) + j0 * d_k, j1 - j0, d_k).transpose();
          for (int64_t r = 0; r < m; ++r)
            for (int64_t col = vis.seen(i0 + r, j0, j1 - j0); col < j1 - j0; ++col) L(r, col) = T(0);
          Y.noalias() += L * CMap(v.block(b) + j0 * d_v, j1 - j0, d_v);
        }
        y_ok = y_ok && Y.allFinite();
      }
    }
  }
  // The keys and values from the last chunk's boundary on: its diagonal block and the keys no
  // query sees.
  const int64_t tail = bound(chunks - 1);
  auto rest_finite = [&](const Stack<T>& s) {
    bool ok = true;
    for (int64_t b = 0; b < batch && ok; ++b) ok = CMap(s.block(b) + tail * s.cols, s.rows - tail, s.cols).allFinite();
    return ok;
  };
  if (!q_ok) throw NonFiniteOperand("q");
  if (!k_ok || !rest_finite(k)) throw NonFiniteOperand("k");
  if (!v_ok || !rest_finite(v)) throw NonFiniteOperand("v");
  if (!y_ok) throw ResultOverflow(OUTPUT_OVERFLOW);
}

}  // namespace attngeom
