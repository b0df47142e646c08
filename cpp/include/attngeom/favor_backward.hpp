// The FAVOR+ backward pass (favor.hpp), fused: the (n, m) feature matrices are never formed,
// and every query is differentiated at the key shift its forward used, so the gradients hold
// wherever the forward's estimate does (a shift by the maximum over all keys underflows the
// early queries of a causal sequence whose key norms fall along it).
//
// With phi_i the query features (row shift s_i), psi_j the key features, a_ij = phi_i . psi_j
// over the keys query i sees, Z_i = sum_j a_ij, y_i = sum_j a_ij v_j / Z_i, and D_i = dy_i . y_i:
//
//   dv_j   = sum_i (a_ij / Z_i) dy_i = psi_j G_j,           G_j = sum_{i sees j} phi_i dy_i^T / Z_i
//   dl^k_j = psi_j o (G_j v_j - h_j),                        h_j = sum_{i sees j} phi_i D_i / Z_i
//   dl^q_i = phi_i o (S_i dy_i - z_i D_i) / Z_i,             S_i, z_i the forward's key state of query i
//   dx     = root ((dl W) - x' rowsum(dl)),                  x' = root x, through l = W x' - |x'|^2 / 2.
//
// Queries are walked as the forward walks them (the same state, shifts and chunks; dq there);
// keys then in reverse, against a query state (G, h) summed over the queries after them. Its
// shift T is the smallest key shift t_i of the queries folded in: G = sum_i phi_i dy_i^T
// exp(T - t_i) / den_i, every factor <= 1, and key j meets it as psi_j exp(kappa_j - T) with
// kappa_j <= T (every query after key j saw it when setting its shift). Without a causal limit
// every query has the forward's one shift M and the query state needs none.
//
// One batch element per thread, its rows walked in order (the result does not depend on the
// thread count); products write into aligned scratch, as in the forward.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attngeom/favor.hpp"

namespace attngeom {

namespace favor_detail {

// dx rows (rows, d) = root ((dl W) - x' rowsum(dl)) for the rows x of one block, x' = root x;
// the result goes through scratch D (rows, d) into dx.
template <class T, class DL>
void through_features(const DL& dl, const T* x, int64_t rows, int64_t d, const Eigen::Map<const RowMatrix<T>>& W,
                      T root, RowMatrix<T>& X, RowMatrix<T>& D, T* dx) {
  auto Xs = X.topRows(rows);
  Xs.noalias() = Eigen::Map<const RowMatrix<T>>(x, rows, d) * root;
  auto Ds = D.topRows(rows);
  Ds.noalias() = dl * W;
  Ds -= (Xs.array().colwise() * dl.rowwise().sum().array()).matrix();
  Ds *= root;
  std::copy_n(Ds.data(), rows * d, dx);
}

// The query state of the reverse walk: G (m, d_v), h (m) at shift T (+inf: empty).
template <class T>
struct QueryState {
  RowMatrix<T> G;
  Row<T> h;
  T shift = std::numeric_limits<T>::infinity();
  QueryState(int64_t m, int64_t d_v) : G(m, d_v), h(m) {}
  void clear() {
    G.setZero();
    h.setZero();
    shift = std::numeric_limits<T>::infinity();
  }
  bool empty() const { return shift == std::numeric_limits<T>::infinity(); }
};

// Scratch of the backward beyond the forward's: dY (rows, d_v), P (rows, rows), dL, KB, VG
// (rows, m), D (rows, d), dV and KG (rows, d_v), and per-row D_i, 1 / den_i and factors.
template <class T>
struct BackScratch {
  RowMatrix<T> dY, P, dL, KB, VG, D, dV, KG;
  Col<T> Dy, inv, g;
  BackScratch(int64_t rows, int64_t d, int64_t m, int64_t d_v)
      : dY(rows, d_v), P(rows, rows), dL(rows, m), KB(rows, m), VG(rows, m), D(rows, d), dV(rows, d_v),
        KG(rows, d_v), Dy(rows), inv(rows), g(rows) {}
};

// Keys of one block (features K (nk, m) with row shifts kappa, values V) against the query
// state: dV += diag(e) K G and dL += diag(e) K o (V G^T - h), e_j = exp(kappa_j - T).
template <class T, class KB, class VB, class DV, class DL>
void keys_against_state(const KB& K, const Col<T>& kappa, int64_t nk, const VB& V, const QueryState<T>& qs,
                        BackScratch<T>& bs, DV&& dV, DL&& dL) {
  if (qs.empty()) return;
  auto e = bs.g.head(nk);
  e = (kappa.head(nk).array() - qs.shift).exp().matrix();
  auto VG = bs.VG.topRows(nk);
  VG.noalias() = V * qs.G.transpose();
  VG.rowwise() -= qs.h;
  dL.array() += (K.array() * VG.array()).colwise() * e.array();
  auto KG = bs.KG.topRows(nk);
  KG.noalias() = K * qs.G;
  dV.array() += KG.array().colwise() * e.array();
}

}  // namespace favor_detail

// Cotangents of favor_attention (same arguments) for dy (batch, n_q, d_v): dq (batch, n_q, d),
// dk (batch, n_k, d), dv (batch, n_k, d_v), over the flat batch. Queries whose estimate is 0
// (y = 0) pass no gradient.
template <class T>
void favor_attention_backward(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v, const T* W,
                              int64_t m, T root, Causal causal, int64_t chunk, const T* dy, T* dq, T* dk, T* dv) {
  using namespace favor_detail;
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  const int64_t n_q = q.rows, d = q.cols, n_k = k.rows, d_v = v.cols;
  std::fill(dq, dq + batch * n_q * d, T(0));
  std::fill(dk, dk + batch * n_k * d, T(0));
  std::fill(dv, dv + batch * n_k * d_v, T(0));
  if (batch == 0 || n_q == 0 || n_k == 0 || m == 0) return;
  const CMap Wm(W, m, d);
  const bool par = parallel_worth(3.0 * double(batch) * (n_q + n_k) * m * (d + d_v));
  const Visibility vis(causal, n_q, n_k);
  const int64_t C = vis.limited() ? std::max<int64_t>(1, chunk) : kRows;

#pragma omp parallel if (par)
  {
    Scratch<T> s(C, d, m, d_v, true);
    BackScratch<T> bs(C, d, m, d_v);
    Col<T> key_data(m * d_v + m);
    T key_shift_M;
    State<T> own(key_data.data(), key_shift_M, m, d_v);
    QueryState<T> qs(m, d_v);
    // Per query of the batch element: its key shift t_i, 1 / den_i (0: no gradient) and D_i.
    Col<T> tops(n_q), invs(n_q), Ds(n_q);

    // Query rows [i0, i0 + r) of batch element b: features L (row-shifted), their forward
    // (Y, den against the state `own`, plus the diagonal block A when nk > 0 keys from j0),
    // then y, D, 1 / den and dq. Leaves K (diagonal key features) and E in the scratch.
    auto query_rows = [&](int64_t b, int64_t i0, int64_t r, int64_t j0, int64_t nk) {
      const T* vb = v.block(b);
      chunk_forward(q.block(b) + i0 * d, i0, r, k.block(b) + j0 * d, vb + j0 * d_v, j0, nk, vis, d, d_v, Wm, root,
                    own, s);
      const auto L = s.L.topRows(r);
      const auto Y = s.Y.topRows(r);
      const auto den = s.den.head(r);
      auto dY = bs.dY.topRows(r);
      dY = CMap(dy + (b * n_q + i0) * d_v, r, d_v);
      auto inv = bs.inv.head(r);
      auto Dv = bs.Dy.head(r);
      for (int64_t row = 0; row < r; ++row) {
        inv(row) = den(row) > T(0) ? T(1) / den(row) : T(0);
        Dv(row) = inv(row) > T(0) ? dY.row(row).dot(Y.row(row)) * inv(row) : T(0);  // dy . y
      }
      // dl^q = phi o [ (f (dY S^T - D z) + B K) / den ], B_ij = E_ij (dy_i . v_j - D_i).
      auto dL = bs.dL.topRows(r);
      dL.noalias() = dY * own.S.transpose();
      dL -= Dv * own.z;
      dL.array().colwise() *= s.f.head(r).array();
      if (nk > 0) {
        auto P = bs.P.topLeftCorner(r, nk);
        P.noalias() = dY * CMap(vb + j0 * d_v, nk, d_v).transpose();
        P.array().colwise() -= Dv.array();
        P.array() *= s.E.topLeftCorner(r, nk).array();
        dL.noalias() += P * s.K.topRows(nk);
      }
      dL.array().colwise() *= inv.array();
      dL.array() *= L.array();
      through_features(dL, q.block(b) + i0 * d, r, d, Wm, root, s.X, bs.D, dq + (b * n_q + i0) * d);
      tops.segment(i0, r) = s.top.head(r);
      invs.segment(i0, r) = inv;
      Ds.segment(i0, r) = Dv;
    };

    // Keys [j0, j0 + nk) of batch element b, features in s.K (row shifts s.key_shift): dk and dv
    // from the query state and, with a diagonal block (r > 0), from the chunk's query rows
    // [i0, i0 + r), whose features are recomputed into s.L.
    auto key_rows = [&](int64_t b, int64_t j0, int64_t nk, int64_t i0, int64_t r) {
      auto K = s.K.topRows(nk);
      const CMap V(v.block(b) + j0 * d_v, nk, d_v);
      auto dL = bs.dL.topRows(nk);
      dL.setZero();
      auto dV = bs.dV.topRows(nk);
      dV.setZero();
      keys_against_state(K, s.key_shift, nk, V, qs, bs, dV, dL);
      if (r > 0) {
        auto L = s.L.topRows(r);
        feature_logits(q.block(b) + i0 * d, r, d, Wm, root, s.X, L);
        row_features(L, r, s.shift);
        // E_ij = exp(kappa_j - t_i) at the forward's key shift t_i of each row, 0 where hidden.
        auto E = s.E.topLeftCorner(r, nk);
        for (int64_t row = 0; row < r; ++row) {
          const int64_t seen = vis.seen(i0 + row, j0, nk);
          E.row(row).head(seen).array() = (s.key_shift.head(seen).transpose().array() - tops(i0 + row)).exp();
          E.row(row).segment(seen, nk - seen).setZero();
        }
        const auto inv = invs.segment(i0, r);
        auto dY = bs.dY.topRows(r);
        dY = CMap(dy + (b * n_q + i0) * d_v, r, d_v);
        // P_ij = (phi_i . K_j) E_ij / den_i: dv += P^T dY.
        auto P = bs.P.topLeftCorner(r, nk);
        P.noalias() = L * K.transpose();
        P.array() *= E.array();
        P.array().colwise() *= inv.array();
        dV.noalias() += P.transpose() * dY;
        // dl^k += K o (B^T phi), B_ij = E_ij (dy_i . v_j - D_i) / den_i.
        P.noalias() = dY * V.transpose();
        P.array().colwise() -= Ds.segment(i0, r).array();
        P.array() *= E.array();
        P.array().colwise() *= inv.array();
        auto KB = bs.KB.topRows(nk);
        KB.noalias() = P.transpose() * L;
        dL.array() += K.array() * KB.array();
      }
      std::copy_n(dV.data(), nk * d_v, dv + (b * n_k + j0) * d_v);
      through_features(dL, k.block(b) + j0 * d, nk, d, Wm, root, s.X, bs.D, dk + (b * n_k + j0) * d);
    };

    // Features of keys [j0, j0 + nk) of batch element b into s.K, row shifts into s.key_shift.
    auto key_features = [&](int64_t b, int64_t j0, int64_t nk) {
      auto K = s.K.topRows(nk);
      feature_logits(k.block(b) + j0 * d, nk, d, Wm, root, s.X, K);
      row_features(K, nk, s.key_shift);
    };

    // Folds query rows [i0, i0 + r) (features in s.L) into the query state.
    auto fold_queries = [&](int64_t b, int64_t i0, int64_t r) {
      T lowest = qs.shift;
      for (int64_t row = 0; row < r; ++row)
        if (invs(i0 + row) > T(0)) lowest = std::min(lowest, tops(i0 + row));
      if (lowest == std::numeric_limits<T>::infinity()) return;  // no live row
      if (!qs.empty() && lowest < qs.shift) {
        const T f = std::exp(lowest - qs.shift);
        qs.G *= f;
        qs.h *= f;
      }
      qs.shift = lowest;
      auto g = bs.g.head(r);
      for (int64_t row = 0; row < r; ++row)
        g(row) = invs(i0 + row) > T(0) ? std::exp(lowest - tops(i0 + row)) * invs(i0 + row) : T(0);
      auto Lg = bs.KB.topRows(r);
      Lg = s.L.topRows(r).array().colwise() * g.array();
      auto dY = bs.dY.topRows(r);
      dY = CMap(dy + (b * n_q + i0) * d_v, r, d_v);
      qs.G.noalias() += Lg.transpose() * dY;
      qs.h.noalias() += Ds.segment(i0, r).transpose() * Lg;
    };

#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < batch; ++b) {
      own.clear();
      qs.clear();
      if (!vis.limited()) {
        add_keys(k.block(b), v.block(b), 0, n_k, d, d_v, Wm, root, C, s, own);
        for (int64_t i0 = 0; i0 < n_q; i0 += C) {
          const int64_t r = std::min(C, n_q - i0);
          query_rows(b, i0, r, 0, 0);
          fold_queries(b, i0, r);  // every query has the shift M: the state's factors are 1
        }
        for (int64_t j0 = 0; j0 < n_k; j0 += C) {
          const int64_t nk = std::min(C, n_k - j0);
          key_features(b, j0, nk);
          key_rows(b, j0, nk, 0, 0);
        }
        continue;
      }
      const int64_t chunks = (n_q + C - 1) / C;
      auto bound = [&](int64_t c) { return vis.end(c * C - 1); };
      // Forward order: the keys every query sees, then chunk by chunk as favor_attention.
      add_keys(k.block(b), v.block(b), 0, bound(0), d, d_v, Wm, root, C, s, own);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i0 = c * C, r = std::min(C, n_q - i0);
        const int64_t j0 = bound(c), nk = vis.end(i0 + r - 1) - j0;
        query_rows(b, i0, r, j0, nk);
        if (nk > 0 && c + 1 < chunks) fold_diagonal(nk, v.block(b) + j0 * d_v, d_v, s, own);
      }
      // Reverse order: each chunk's diagonal keys against the later queries and its own rows.
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t i0 = c * C, r = std::min(C, n_q - i0);
        const int64_t j0 = bound(c), nk = vis.end(i0 + r - 1) - j0;
        if (nk > 0) {
          key_features(b, j0, nk);
          key_rows(b, j0, nk, i0, r);
        } else {
          auto L = s.L.topRows(r);
          feature_logits(q.block(b) + i0 * d, r, d, Wm, root, s.X, L);
          row_features(L, r, s.shift);
        }
        fold_queries(b, i0, r);
      }
      // The keys before the first chunk's boundary: seen by every query.
      for (int64_t j0 = 0; j0 < bound(0); j0 += C) {
        const int64_t nk = std::min(C, bound(0) - j0);
        key_features(b, j0, nk);
        key_rows(b, j0, nk, 0, 0);
      }
    }
  }
}

}  // namespace attngeom
