// The FAVOR+ backward pass (favor.hpp), fused: the (n, m) feature matrices are never formed,
// and every term is taken at the shifts its forward used, per feature, so the gradients hold
// wherever the forward's estimate does, for any spread of the logits.
//
// With l^q_if, l^k_jf the logits, Z_i = sum_{j seen, f} exp(l^q_if + l^k_jf), y_i = sum_j a_ij
// v_j / Z_i (a_ij = sum_f exp(l^q_if + l^k_jf)), D_i = dy_i . y_i and c_ij = dy_i . v_j - D_i:
//
//   dv_j   = sum_{i sees j} (a_ij / Z_i) dy_i      = sum_f exp(l^k_jf + T_f) G_f
//   dl^k_jf = sum_{i sees j} exp(l^q_if + l^k_jf) c_ij / Z_i = exp(l^k_jf + T_f) (G_f . v_j - h_f)
//   dl^q_if = sum_{j seen} exp(l^q_if + l^k_jf) c_ij / Z_i
//   dx     = root ((dl W) - x' rowsum(dl)),        x' = root x, through l = W x' - |x'|^2 / 2,
//
// G_f = sum_i exp(w_if - T_f) dy_i and h_f = sum_i exp(w_if - T_f) D_i the query state over the
// queries that see key j, w_if = l^q_if - log Z_i and T_f their running maximum in feature f.
// Every query in the state sees key j, so l^k_jf + w_if <= 0 and every factor is <= 1.
//
// Queries are walked as the forward walks them (the same state, shifts, chunks and exact rows;
// dq there): dl^q is L o (dy S^T - D z) against the key state plus, for the diagonal block,
// g o Ld o (B K) with B_ij = c_ij on the keys a row sees (the exact rows term by term), over
// den_i. Keys then in reverse, against the query state of the queries after them and the
// chunk's own rows: K o (B^T (g o Ld)). In the diagonal products B is brought to [1, 2) by a
// power of two per row (dq) or per key (dk), taken back after the product: the factors
// Ld, K and g span up to fast_gap nats, and with cotangents near either end of the float range
// their products would otherwise leave it.
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

// The query state of the reverse walk: G (m, d_v), h (m) at the shifts T (m; -inf: empty).
template <class T>
struct QueryState {
  RowMatrix<T> G;
  Row<T> h, T_;
  QueryState(int64_t m, int64_t d_v) : G(m, d_v), h(m), T_(m) {}
  void clear() {
    G.setZero();
    h.setZero();
    T_.setConstant(-std::numeric_limits<T>::infinity());
  }
  bool empty() const { return T_(0) == -std::numeric_limits<T>::infinity(); }
};

// Scratch of the backward beyond the forward's: dY (rows, d_v), P and B (rows, rows), dL, KB
// (rows, m), D (rows, d), dV, VG and KG (rows, d_v or m), rows e and acc (m), per row D_i and
// 1 / den_i, and the powers of two of B's rows or columns.
template <class T>
struct BackScratch {
  RowMatrix<T> dY, P, B, dL, KB, VG, D, dV, KG;
  Row<T> e, acc;
  Col<T> Dy, inv, sigma;
  BackScratch(int64_t rows, int64_t d, int64_t m, int64_t d_v)
      : dY(rows, d_v), P(rows, rows), B(rows, rows), dL(rows, m), KB(rows, m), VG(rows, m), D(rows, d),
        dV(rows, d_v), KG(rows, d_v), e(m), acc(m), Dy(rows), inv(rows), sigma(rows) {}
};

// The power of two at or below x >= 0, or 1 when x is 0, subnormal or not finite: dividing by
// it is exact and brings x to [1, 2).
template <class T>
T power_of_two(T x) {
  return x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max() ? std::ldexp(T(1), std::ilogb(x))
                                                                                     : T(1);
}

// Keys of one block (logits s.Klog, nk rows, values V) against the query state:
// Ks = exp(l^k + T), dV += Ks G and dL += Ks o (V G^T - h). Uses bs.KB for Ks.
template <class T, class VB, class DV, class DL>
void keys_against_state(const Scratch<T>& s, int64_t nk, const VB& V, const QueryState<T>& qs, BackScratch<T>& bs,
                        DV&& dV, DL&& dL) {
  if (qs.empty()) return;
  auto Ks = bs.KB.topRows(nk);
  exp_rows(Ks, s.Klog.topRows(nk), qs.T_.array(), no_shift<T>);
  auto VG = bs.VG.topRows(nk);
  VG.noalias() = V * qs.G.transpose();
  VG.rowwise() -= qs.h;
  dL.array() += Ks.array() * VG.array();
  auto KG = bs.KG.topRows(nk);
  KG.noalias() = Ks * qs.G;
  dV += KG;
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
    Col<T> key_data(State<T>::width(m, d_v));
    State<T> own(key_data.data(), m, d_v);
    QueryState<T> qs(m, d_v);
    // Per query of the batch element: its shift t_i, product shift r_i and g_i = exp(r_i - t_i),
    // 1 / den_i (0: no gradient), D_i, its log Z_i (unnormalised: t_i + log den_i) and how its
    // diagonal block was summed.
    Col<T> tops(n_q), rss(n_q), gs(n_q), invs(n_q), Ds(n_q), logz(n_q);
    std::vector<RowKind> kinds(n_q);

    // Query rows [i0, i0 + r) of batch element b: their forward (against the state `own`,
    // plus the diagonal block when nk > 0 keys from j0), then y, D, 1 / den and dq. Leaves the
    // diagonal keys' logits and features (Klog, K, kappa) in the scratch.
    auto query_rows = [&](int64_t b, int64_t i0, int64_t r, int64_t j0, int64_t nk) {
      const T* vb = v.block(b);
      chunk_forward(q.block(b) + i0 * d, i0, r, k.block(b) + j0 * d, vb + j0 * d_v, j0, nk, vis, d, d_v, Wm, root,
                    own, s);
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
      // dl^q = [L o (dY S^T - D z) + g o Ld o (B K) + exact rows] / den, B_ij = dy_i . v_j - D_i on
      // the seen keys, each row of B divided by its power of two sigma_i (taken back after).
      auto dL = bs.dL.topRows(r);
      dL.noalias() = dY * own.S.transpose();
      dL -= Dv * own.z;
      dL.array() *= s.L.topRows(r).array();
      if (nk > 0) {
        auto B = bs.B.topLeftCorner(r, nk);
        B.noalias() = dY * CMap(vb + j0 * d_v, nk, d_v).transpose();
        B.array().colwise() -= Dv.array();
        for (int64_t row = 0; row < r; ++row) {
          B.row(row).segment(s.seen[row], nk - s.seen[row]).setZero();
          bs.sigma(row) = power_of_two(B.row(row).cwiseAbs().maxCoeff());
          B.row(row) *= T(1) / bs.sigma(row);
        }
        auto BK = bs.KB.topRows(r);
        BK.noalias() = B * s.K.topRows(nk);
        for (int64_t row = 0; row < r; ++row) {
          if (s.kind[row] == RowKind::Fast) {
            dL.row(row).array() += ((s.Ld.row(row).array() * BK.row(row).array()) * s.g(row)) * bs.sigma(row);
          } else if (s.kind[row] == RowKind::Exact) {
            bs.acc.setZero();
            for (int64_t j = 0; j < s.seen[row]; ++j) {
              bs.e = (s.Lq.row(row).array() + s.Klog.row(j).array() - s.t(row)).exp().matrix();
              bs.acc += B(row, j) * bs.e;
            }
            dL.row(row) += bs.acc * bs.sigma(row);
          }
        }
      }
      dL.array().colwise() *= inv.array();
      through_features(dL, q.block(b) + i0 * d, r, d, Wm, root, s.X, bs.D, dq + (b * n_q + i0) * d);
      for (int64_t row = 0; row < r; ++row) {
        tops(i0 + row) = s.t(row);
        rss(i0 + row) = s.rs(row);
        gs(i0 + row) = s.g(row);
        invs(i0 + row) = inv(row);
        Ds(i0 + row) = Dv(row);
        logz(i0 + row) = inv(row) > T(0) ? s.t(row) + std::log(den(row)) : T(0);
        kinds[i0 + row] = s.kind[row];
      }
    };

    // Logits of query rows [i0, i0 + r) of batch element b into s.Lq, their forward shifts into
    // s.t, s.rs and s.g, their visible counts against the diagonal keys from j0 (nk of them) into s.seen.
    auto query_logits = [&](int64_t b, int64_t i0, int64_t r, int64_t j0, int64_t nk) {
      feature_logits(q.block(b) + i0 * d, r, d, Wm, root, s.X, s.Lq.topRows(r));
      for (int64_t row = 0; row < r; ++row) {
        s.t(row) = tops(i0 + row);
        s.rs(row) = rss(i0 + row);
        s.g(row) = gs(i0 + row);
        s.seen[row] = nk > 0 ? vis.seen(i0 + row, j0, nk) : 0;
        s.kind[row] = kinds[i0 + row];
      }
    };

    // Keys [j0, j0 + nk) of batch element b (logits already in s.Klog): dk and dv from the
    // query state and, with a diagonal block (r > 0), from the chunk's query rows [i0, i0 + r)
    // (query_logits already run for them).
    auto key_rows = [&](int64_t b, int64_t j0, int64_t nk, int64_t i0, int64_t r) {
      const CMap V(v.block(b) + j0 * d_v, nk, d_v);
      auto dL = bs.dL.topRows(nk);
      dL.setZero();
      auto dV = bs.dV.topRows(nk);
      dV.setZero();
      keys_against_state(s, nk, V, qs, bs, dV, dL);
      if (r > 0) {
        s.kappa = s.Klog.topRows(nk).colwise().maxCoeff();
        auto K = s.K.topRows(nk);
        exp_rows(K, s.Klog.topRows(nk), -s.kappa.array(), no_shift<T>);
        // The forward's r_i >= l^q_if + kappa_f on the fast rows: every factor of Ld is <= 1.
        auto Ld = s.Ld.topRows(r);
        for (int64_t row = 0; row < r; ++row) {
          if (s.kind[row] == RowKind::Fast)
            Ld.row(row) = (s.Lq.row(row).array() + s.kappa.array() - s.rs(row)).exp().matrix();
          else
            Ld.row(row).setZero();
        }
        const auto inv = invs.segment(i0, r);
        auto dY = bs.dY.topRows(r);
        dY = CMap(dy + (b * n_q + i0) * d_v, r, d_v);
        // P_ij = a_ij / Z_i on the seen keys (exact rows term by term): dv += P^T dY.
        auto P = bs.P.topLeftCorner(r, nk);
        P.noalias() = Ld * K.transpose();
        for (int64_t row = 0; row < r; ++row) {
          P.row(row).segment(s.seen[row], nk - s.seen[row]).setZero();
          if (s.kind[row] == RowKind::Fast) P.row(row) *= s.g(row);
          if (s.kind[row] == RowKind::Exact) exact_row(s, row, P.row(row));
        }
        P.array().colwise() *= inv.array();
        dV.noalias() += P.transpose() * dY;
        // dl^k += K o (B^T (g o Ld)) + exact rows, B_ij = (dy_i . v_j - D_i) / den_i on the seen
        // keys, each column of B divided by its power of two sigma_j (taken back after).
        auto B = bs.B.topLeftCorner(r, nk);
        B.noalias() = dY * V.transpose();
        B.array().colwise() -= Ds.segment(i0, r).array();
        B.array().colwise() *= inv.array();
        for (int64_t row = 0; row < r; ++row) B.row(row).segment(s.seen[row], nk - s.seen[row]).setZero();
        auto sigma = bs.sigma.head(nk);
        for (int64_t j = 0; j < nk; ++j) sigma(j) = power_of_two(B.col(j).cwiseAbs().maxCoeff());
        for (int64_t row = 0; row < r; ++row) B.row(row).array() /= sigma.transpose().array();
        auto Lg = bs.VG.topRows(r);
        for (int64_t row = 0; row < r; ++row) Lg.row(row) = Ld.row(row) * s.g(row);
        auto KB = bs.KB.topRows(nk);
        KB.noalias() = B.transpose() * Lg;
        for (int64_t j = 0; j < nk; ++j) dL.row(j).array() += (K.row(j).array() * KB.row(j).array()) * sigma(j);
        for (int64_t row = 0; row < r; ++row) {
          if (s.kind[row] != RowKind::Exact) continue;
          for (int64_t j = 0; j < s.seen[row]; ++j) {
            bs.e = (s.Lq.row(row).array() + s.Klog.row(j).array() - s.t(row)).exp().matrix();
            dL.row(j) += (B(row, j) * bs.e) * sigma(j);
          }
        }
      }
      std::copy_n(dV.data(), nk * d_v, dv + (b * n_k + j0) * d_v);
      through_features(dL, k.block(b) + j0 * d, nk, d, Wm, root, s.X, bs.D, dk + (b * n_k + j0) * d);
    };

    // Logits of keys [j0, j0 + nk) of batch element b into s.Klog.
    auto key_logits = [&](int64_t b, int64_t j0, int64_t nk) {
      feature_logits(k.block(b) + j0 * d, nk, d, Wm, root, s.X, s.Klog.topRows(nk));
    };

    // Folds query rows [i0, i0 + r) (logits in s.Lq) into the query state: w_if = l^q_if -
    // log Z_i, the shifts T_f raised to their column maximum over the live rows.
    auto fold_queries = [&](int64_t b, int64_t i0, int64_t r) {
      auto W_ = bs.KB.topRows(r);
      bool live = false;
      for (int64_t row = 0; row < r; ++row) {
        if (invs(i0 + row) > T(0)) {
          W_.row(row) = s.Lq.row(row).array() - logz(i0 + row);
          live = true;
        } else {
          W_.row(row).setConstant(-std::numeric_limits<T>::infinity());
        }
      }
      if (!live) return;
      s.hi = W_.colwise().maxCoeff();
      for (int64_t f = 0; f < m; ++f) {
        if (!(s.hi(f) > qs.T_(f))) continue;
        if (qs.T_(f) != -std::numeric_limits<T>::infinity()) {
          const T g = std::exp(qs.T_(f) - s.hi(f));
          qs.G.row(f) *= g;
          qs.h(f) *= g;
        }
        qs.T_(f) = s.hi(f);
      }
      exp_rows(W_, W_, -qs.T_.array(), no_shift<T>);
      auto dY = bs.dY.topRows(r);
      dY = CMap(dy + (b * n_q + i0) * d_v, r, d_v);
      qs.G.noalias() += W_.transpose() * dY;
      qs.h.noalias() += Ds.segment(i0, r).transpose() * W_;
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
          fold_queries(b, i0, r);
        }
        for (int64_t j0 = 0; j0 < n_k; j0 += C) {
          const int64_t nk = std::min(C, n_k - j0);
          key_logits(b, j0, nk);
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
        query_logits(b, i0, r, j0, nk);
        if (nk > 0) {
          key_logits(b, j0, nk);
          key_rows(b, j0, nk, i0, r);
        }
        fold_queries(b, i0, r);
      }
      // The keys before the first chunk's boundary: seen by every query.
      for (int64_t j0 = 0; j0 < bound(0); j0 += C) {
        const int64_t nk = std::min(C, bound(0) - j0);
        key_logits(b, j0, nk);
        key_rows(b, j0, nk, 0, 0);
      }
    }
  }
}

}  // namespace attngeom
