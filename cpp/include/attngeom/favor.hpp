// FAVOR+ attention in one pass over the rows (Laplace-Radon s.7.3; Choromanski et al.,
// Performer): y_i = phi(q_i) S / phi(q_i) z with S = sum_j phi(k_j) v_j^T (m, d_v) and
// z = sum_j phi(k_j) (m), phi(x) = exp(W x - |x|^2 / 2), x = root * input. The (n, m) feature
// matrices are never formed: each thread computes the features of one block of rows in its
// scratch (feature_logits, shared with positive_features) and folds them into a key state or
// straight into the outputs. The 1/sqrt(m) of positive_features cancels in y; log Z takes it
// back as -log m.
//
// Key state (S, z, M): S = sum_j exp(l_j - M) v_j^T and z = sum_j exp(l_j - M) over the keys
// seen, l_j the m logits of key j and M their running maximum: when a block raises the maximum,
// S and z are rescaled by exp(M_old - M_new), so exp never overflows. Two states combine at the
// larger shift.
//
// Non-causal: per batch element the keys are cut into at most kMaxSpans spans of whole
// kRows-row blocks (the cut depends on n_k only, never on the thread count); one state per span
// (OpenMP over batch x span), combined in span order; then the queries in kRows-row blocks
// (OpenMP over batch x block): per-row shifted features, y = phi_q S / phi_q z.
//
// Causal: queries in chunks of C rows, as in lightning_attention: chunk c sees the state of the
// keys before its boundary plus one masked diagonal block of at most C keys. The diagonal
// block's key features are shifted per key row, and each query takes as its key shift the
// maximum over the state and the block keys it sees, so a key hidden from a query never sets
// its scale (no underflow of its visible terms). The chunks of a batch element are walked in
// order, carrying the state. For parallelism inside long sequences the chunks are grouped into
// segments (their number set by batch and n_q only): the keys of each segment are summed first
// (OpenMP over batch x segment), prefix-combined in order, and each segment then walks its
// chunks from its prefix state.
//
// log Z_i = log(phi_q(i) z) - log m + s_i + M_i, s_i the query's own shift (the maximum of its
// logits), M_i its key shift (M when non-causal). A query whose estimate underflows to 0, or
// that sees no key, gets y = 0 and log Z = -inf.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attngeom/parallel.hpp"
#include "attngeom/random_features.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

namespace favor_detail {

constexpr int64_t kRows = 128;     // rows per feature block (non-causal keys and queries)
constexpr int64_t kMaxSpans = 8;   // key spans per batch element (non-causal)
constexpr int64_t kUnits = 8;      // causal: segments are added until batch x segments reaches this

template <class T>
using Row = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T>
using Col = Eigen::Matrix<T, Eigen::Dynamic, 1>;

// Per-thread scratch, allocated once per parallel region: X (rows, d) scaled inputs, L (rows, m)
// query features and their row shifts, K (rows, m) key features and their row shifts, A and E
// (rows, rows) the causal diagonal block and its shift factors, Y (rows, d_v) the output rows,
// den, top (the key shift of each query row) and f (the factor on the state's sums). Every product and reduction writes into Eigen-aligned storage:
// Eigen peels an unaligned head off a destination with scalar code (no FMA), so writing into
// the caller's arrays directly would make the last bit depend on where they were allocated.
template <class T>
struct Scratch {
  RowMatrix<T> X, L, K, A, E, Y;
  Col<T> shift, key_shift, den, top, f;
  Scratch(int64_t rows, int64_t d, int64_t m, int64_t d_v, bool causal)
      : X(rows, d), L(rows, m), K(causal ? rows : 0, m), A(causal ? rows : 0, causal ? rows : 0),
        E(causal ? rows : 0, causal ? rows : 0), Y(rows, d_v), shift(rows), key_shift(rows), den(rows), top(rows),
        f(rows) {}
};

// A key state stored flat: S (m, d_v) row-major followed by z (m); the shift M beside it.
template <class T>
struct State {
  Eigen::Map<RowMatrix<T>> S;
  Eigen::Map<Row<T>> z;
  T& M;
  State(T* data, T& shift, int64_t m, int64_t d_v) : S(data, m, d_v), z(data + m * d_v, m), M(shift) {}
  void clear() {
    S.setZero();
    z.setZero();
    M = -std::numeric_limits<T>::infinity();
  }
  bool empty() const { return M == -std::numeric_limits<T>::infinity(); }
  // Raise the shift to `to` (if larger), rescaling the sums.
  void raise(T to) {
    if (!(to > M)) return;
    if (!empty()) {
      const T f = std::exp(M - to);
      S *= f;
      z *= f;
    }
    M = to;
  }
  // this += other, both at the larger shift.
  void add(const State& other) {
    if (other.empty()) return;
    raise(other.M);
    const T f = std::exp(other.M - M);
    S.noalias() += f * other.S;
    z.noalias() += f * other.z;
  }
  // S += F^T V, z += column sums of F, for features F (rows, m) at this state's shift and
  // values V (rows, d_v).
  template <class F, class VMap>
  void fold(const F& features, const VMap& V) {
    S.noalias() += features.transpose() * V;
    for (int64_t r = 0; r < features.rows(); ++r) z += features.row(r);
  }
};

// K (rows, m) logits -> exp(K - M), and S += K^T V, z += column sums of K, for the key rows
// whose values are V (rows, d_v).
template <class T, class Blk>
void fold_keys(Blk& K, const T* v, int64_t rows, int64_t d_v, State<T>& st) {
  K = (K.array() - st.M).exp().matrix();
  st.fold(K, Eigen::Map<const RowMatrix<T>>(v, rows, d_v));
}

// Adds keys [j0, j1) of one batch element (k (n_k, d) and v (n_k, d_v) blocks) to the state,
// in blocks of at most `rows` rows, raising the shift to each block's maximum logit.
template <class T>
void add_keys(const T* k, const T* v, int64_t j0, int64_t j1, int64_t d, int64_t d_v,
              const Eigen::Map<const RowMatrix<T>>& W, T root, int64_t rows, Scratch<T>& s, State<T>& st) {
  for (int64_t a = j0; a < j1; a += rows) {
    const int64_t r = std::min(rows, j1 - a);
    auto K = s.K.rows() >= r ? s.K.topRows(r) : s.L.topRows(r);
    feature_logits(k + a * d, r, d, W, root, s.X, K);
    st.raise(K.maxCoeff());
    fold_keys(K, v + a * d_v, r, d_v, st);
  }
}

// Row-shifted features of `rows` rows in L: shift(r) = max of row r's logits, L = exp(L - shift).
template <class T, class Blk>
void row_features(Blk& L, int64_t rows, Col<T>& shift) {
  for (int64_t r = 0; r < rows; ++r) shift(r) = L.row(r).maxCoeff();
  L.array().colwise() -= shift.head(rows).array();
  L = L.array().exp().matrix();
}

// The causal diagonal block of query rows [i0, i0 + r) against the nk keys from j0 with row shifts
// kappa: row `row` sees the first vis.seen(i0 + row, j0, nk) of them. Its key shift
// becomes t = max(M, kappa_j over the keys it sees), so keys hidden from it never set its scale;
// E(row, j) = exp(kappa_j - t) for the keys it sees and 0 for the others, and f(row) = exp(M - t)
// rescales the state's sums (1 when t = M, 0 when the state is empty).
template <class T>
void diagonal_shifts(const Visibility& vis, int64_t i0, int64_t r, int64_t j0, int64_t nk, T M, const Col<T>& kappa,
                     RowMatrix<T>& E, Col<T>& top, Col<T>& f) {
  for (int64_t row = 0; row < r; ++row) {
    const int64_t seen = vis.seen(i0 + row, j0, nk);
    const T t = seen > 0 ? std::max(M, kappa.head(seen).maxCoeff()) : M;
    top(row) = t;
    f(row) = t > M ? std::exp(M - t) : T(1);
    E.row(row).head(seen).array() = (kappa.head(seen).transpose().array() - t).exp();
    E.row(row).segment(seen, nk - seen).setZero();
  }
}

// One causal chunk against the state `st` of the keys before it: the r query rows x (rows
// i0.. of the sequence; features into s.L, row shifts s.shift) give Y = L S and den = L z at
// the state's shift, and with nk > 0 the diagonal block of keys kx (keys j0..; features s.K,
// row shifts s.key_shift), values vx, each row seeing the keys `vis` gives it
// (diagonal_shifts): rows whose key shift rises above the state's are rescaled by f, and
// A = (L K^T) o E adds A V and its row sums. Leaves s.top, s.f and s.E for the backward.
template <class T>
void chunk_forward(const T* x, int64_t i0, int64_t r, const T* kx, const T* vx, int64_t j0, int64_t nk,
                   const Visibility& vis, int64_t d, int64_t d_v, const Eigen::Map<const RowMatrix<T>>& W, T root,
                   const State<T>& st, Scratch<T>& s) {
  auto L = s.L.topRows(r);
  feature_logits(x, r, d, W, root, s.X, L);
  row_features(L, r, s.shift);
  auto Y = s.Y.topRows(r);
  Y.noalias() = L * st.S;
  auto den = s.den.head(r);
  den.noalias() = L * st.z.transpose();
  s.top.head(r).setConstant(st.M);
  s.f.head(r).setOnes();
  if (nk == 0) return;
  auto K = s.K.topRows(nk);
  feature_logits(kx, nk, d, W, root, s.X, K);
  row_features(K, nk, s.key_shift);
  diagonal_shifts(vis, i0, r, j0, nk, st.M, s.key_shift, s.E, s.top, s.f);
  Y.array().colwise() *= s.f.head(r).array();
  den.array() *= s.f.head(r).array();
  auto A = s.A.topLeftCorner(r, nk);
  A.noalias() = L * K.transpose();
  A.array() *= s.E.topLeftCorner(r, nk).array();
  Y.noalias() += A * Eigen::Map<const RowMatrix<T>>(vx, nk, d_v);
  den += A.rowwise().sum();
}

// Folds the diagonal keys of chunk_forward (s.K, row shifts s.key_shift, values vx) into the
// state at the shift max(M, kappa).
template <class T>
void fold_diagonal(int64_t nk, const T* vx, int64_t d_v, Scratch<T>& s, State<T>& st) {
  auto K = s.K.topRows(nk);
  st.raise(s.key_shift.head(nk).maxCoeff());
  K.array().colwise() *= (s.key_shift.head(nk).array() - st.M).exp();
  st.fold(K, Eigen::Map<const RowMatrix<T>>(vx, nk, d_v));
}

// y rows /= den and log Z = log den - log m + shift + top (the key shift of the row); y = 0,
// log Z = -inf where den = 0.
// The rows are copied from the scratch Y into y (rows, d_v).
template <class T>
void finish_rows(RowMatrix<T>& Y, int64_t rows, const Col<T>& den, const Col<T>& shift, const Col<T>& top, T log_m,
                 T* y, T* log_z) {
  const int64_t d_v = Y.cols();
  for (int64_t r = 0; r < rows; ++r) {
    const T dr = den(r);
    if (dr > T(0)) {
      Y.row(r) /= dr;
      log_z[r] = ((std::log(dr) - log_m) + shift(r)) + top(r);
    } else {
      Y.row(r).setZero();
      log_z[r] = -std::numeric_limits<T>::infinity();
    }
    std::copy_n(Y.row(r).data(), d_v, y + r * d_v);
  }
}

}  // namespace favor_detail

// q: stack of (n_q, d) blocks, k: (n_k, d), v: (n_k, d_v); W (m, d) row-major; inputs scaled by
// `root` on the fly (root^2 is the logit scale). y: (batch, n_q, d_v) output; log_z: (batch, n_q)
// output, the log of the estimated partition Z_i = phi_q(i) . sum_j phi_k(j) / m. Keys visible
// to query i as in lightning_attention; `chunk` is the causal chunk length C.
template <class T>
void favor_attention(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v, const T* W, int64_t m,
                     T root, Causal causal, int64_t chunk, T* y, T* log_z) {
  using namespace favor_detail;
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  const int64_t n_q = q.rows, d = q.cols, n_k = k.rows, d_v = v.cols;
  if (batch == 0 || n_q == 0 || m == 0) return;
  const CMap Wm(W, m, d);
  const int64_t width = m * d_v + m;  // one state
  const T log_m = std::log(T(m));
  const bool par = parallel_worth(double(batch) * (n_q + n_k) * m * (d + d_v));
  const Visibility vis(causal, n_q, n_k);

  if (!vis.limited()) {
    const int64_t blocks = (n_k + kRows - 1) / kRows;
    const int64_t per = std::max<int64_t>(1, (blocks + kMaxSpans - 1) / kMaxSpans);
    const int64_t spans = std::max<int64_t>(1, (blocks + per - 1) / per), span_rows = per * kRows;
    const int64_t qblocks = (n_q + kRows - 1) / kRows;
    Col<T> store(batch * spans * width), shifts(batch * spans);
    auto state = [&](int64_t slot) { return State<T>(store.data() + slot * width, shifts[slot], m, d_v); };
#pragma omp parallel if (par)
    {
      Scratch<T> s(kRows, d, m, d_v, false);
      // One state per key span.
#pragma omp for schedule(dynamic)
      for (int64_t unit = 0; unit < batch * spans; ++unit) {
        const int64_t b = unit / spans, j0 = (unit % spans) * span_rows, j1 = std::min(n_k, j0 + span_rows);
        State<T> st = state(unit);
        st.clear();
        add_keys(k.block(b), v.block(b), j0, j1, d, d_v, Wm, root, kRows, s, st);
      }
      // Combined in span order into the batch element's first slot.
#pragma omp for schedule(static)
      for (int64_t b = 0; b < batch; ++b) {
        State<T> total = state(b * spans);
        for (int64_t u = 1; u < spans; ++u) total.add(state(b * spans + u));
      }
      // Queries.
#pragma omp for schedule(dynamic)
      for (int64_t unit = 0; unit < batch * qblocks; ++unit) {
        const int64_t b = unit / qblocks, i0 = (unit % qblocks) * kRows, r = std::min(kRows, n_q - i0);
        chunk_forward<T>(q.block(b) + i0 * d, i0, r, nullptr, nullptr, 0, 0, vis, d, d_v, Wm, root, state(b * spans),
                         s);
        finish_rows(s.Y, r, s.den, s.shift, s.top, log_m, y + (b * n_q + i0) * d_v, log_z + b * n_q + i0);
      }
    }
    return;
  }

  const int64_t C = std::max<int64_t>(1, chunk), chunks = (n_q + C - 1) / C;
  // Keys [0, bound(c)) are visible to every query of chunk c.
  auto bound = [&](int64_t c) { return vis.end(c * C - 1); };
  const int64_t want = std::min<int64_t>(std::max<int64_t>(1, (kUnits + batch - 1) / batch),
                                         std::max<int64_t>(1, chunks / 8));
  const int64_t G = (chunks + want - 1) / want, segments = (chunks + G - 1) / G;
  Col<T> store(batch * segments * width), shifts(batch * segments);
  auto state = [&](int64_t slot) { return State<T>(store.data() + slot * width, shifts[slot], m, d_v); };
#pragma omp parallel if (par)
  {
    Scratch<T> s(C, d, m, d_v, true);
    Col<T> own_data(width);
    T own_shift;
    State<T> own(own_data.data(), own_shift, m, d_v);
    // Slot (b, g) gets the keys of segment g - 1, slot (b, 0) the keys every query sees
    // (those before bound(0), when bottom-right alignment has more keys than queries) ...
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * segments; ++unit) {
      const int64_t b = unit / segments, g = unit % segments;
      State<T> st = state(unit);
      st.clear();
      add_keys(k.block(b), v.block(b), g > 0 ? bound((g - 1) * G) : 0, bound(g * G), d, d_v, Wm, root, C, s, st);
    }
    // ... then the prefix combination in order: slot (b, g) holds the keys before segment g.
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t g = 1; g < segments; ++g) {
        State<T> st = state(b * segments + g);
        st.add(state(b * segments + g - 1));
      }
    // Each segment walks its chunks from its prefix state.
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * segments; ++unit) {
      const int64_t b = unit / segments, g = unit % segments;
      const T* kb = k.block(b);
      const T* vb = v.block(b);
      {
        const State<T> prefix = state(unit);
        own.S = prefix.S;
        own.z = prefix.z;
        own.M = prefix.M;
      }
      const int64_t c_end = std::min(chunks, (g + 1) * G);
      for (int64_t c = g * G; c < c_end; ++c) {
        const int64_t i0 = c * C, r = std::min(C, n_q - i0);
        const int64_t j0 = bound(c), nk = vis.end(i0 + r - 1) - j0;
        // Queries against the state (the keys before the chunk, all visible) and the diagonal.
        chunk_forward(q.block(b) + i0 * d, i0, r, kb + j0 * d, vb + j0 * d_v, j0, nk, vis, d, d_v, Wm, root, own, s);
        if (nk > 0 && c + 1 < c_end) fold_diagonal(nk, vb + j0 * d_v, d_v, s, own);
        finish_rows(s.Y, r, s.den, s.shift, s.top, log_m, y + (b * n_q + i0) * d_v, log_z + b * n_q + i0);
      }
    }
  }
}

}  // namespace attngeom
