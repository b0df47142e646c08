// FAVOR+ attention in one pass over the rows (Laplace-Radon s.7.3; Choromanski et al.,
// Performer): y_i = phi(q_i) S / phi(q_i) z with S = sum_j phi(k_j) v_j^T (m, d_v) and
// z = sum_j phi(k_j) (m), phi(x) = exp(W x - |x|^2 / 2), x = root * input. The (n, m) feature
// matrices are never formed: each thread computes the feature logits of one block of rows in
// its scratch (feature_logits, shared with positive_features) and folds them into a key state
// or straight into the outputs. The 1/sqrt(m) of positive_features cancels in y; log Z takes it
// back as -log m.
//
// Every shift is per feature, so the estimate is the log-domain one (every term
// exp(l^q_if + l^k_jf) summed) to rounding for any logits, however far they spread.
//
// Key state (S, z, M): S_f = sum_j exp(l_jf - M_f) v_j^T and z_f = sum_j exp(l_jf - M_f) over
// the keys seen, l_jf the logit of key j in feature f and M_f its running maximum over them:
// when a block raises M_f, row f of S and z_f are rescaled by exp(M_f,old - M_f,new), so exp
// never overflows, and the largest key of each feature keeps the factor 1 (a single shift for
// all features would underflow every term of the features whose keys lie far below the top).
// Two states combine feature by feature at the larger shift.
//
// A query row i meets the state through L_if = exp(l^q_if + M_f - t_i), t_i its shift:
// Y = L S and den = L z. Without a causal limit t_i = max_f (l^q_if + M_f), the log of its
// largest term, so den >= 1 and nothing it needs underflows.
//
// Non-causal: per batch element the keys are cut into at most kMaxSpans spans of whole
// kRows-row blocks (the cut depends on n_k only, never on the thread count); one state per span
// (OpenMP over batch x span), combined in span order; then the queries in kRows-row blocks
// (OpenMP over batch x block).
//
// Causal: queries in chunks of C rows, as in lightning_attention: chunk c sees the state of the
// keys before its boundary plus one masked diagonal block of at most C keys, whose features are
// K_jf = exp(l^k_jf - kappa_f), kappa_f the block's column maximum. A row's shift t_i is its
// largest visible term, max_f (l^q_if + max(M_f, max over its visible keys of l^k_jf)), as
// without a causal limit. Its products with the block, Ld_if = exp(l^q_if + kappa_f - r_i),
// take r_i = max_f (l^q_if + max(M_f, kappa_f)) >= t_i so that every factor is <= 1;
// A = (Ld K^T) masked to the keys the row sees, then its row times g_i = exp(r_i - t_i), which
// puts it at the row's shift before it meets the values (so small values lose nothing). A key
// hidden from the row can raise kappa_f above every key it sees, and r_i above t_i; while
// r_i - t_i <= fast_gap the terms that matter stay normal numbers. A row past that (logits
// spread over hundreds of nats in float64, tens in float32) is summed exactly instead: its row
// of A is sum_f exp(l^q_if + l^k_jf - t_i) over its visible keys (m exponentials per key). The chunks of a
// batch element are walked in order, carrying the state. For parallelism inside long
// sequences the chunks are grouped into segments (their number set by batch and n_q only):
// the keys of each segment are summed first (OpenMP over batch x segment), prefix-combined in
// order, and each segment then walks its chunks from its prefix state.
//
// log Z_i = log den_i - log m + t_i. A query that sees no key gets y = 0 and log Z = -inf.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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

// How far a row's product shift r_i may lie above its largest term on the fast path: a term
// within a factor epsilon^2 of the largest (one epsilon for the term, one for the backward's
// cotangents it meets; e^8 of headroom for their number) then has every factor above the
// smallest normal number. 628 nats in float64, 47 in float32.
template <class T>
T fast_gap() {
  return -std::log(std::numeric_limits<T>::min()) + T(2) * std::log(std::numeric_limits<T>::epsilon()) - T(8);
}

// dst(r, :) = exp(src(r, :) + offset - shift(r)) for every row r, offset an array of m and
// shift(r) a number per row (dst may be src): each row one vectorised expression, where a
// broadcast over the whole block would make Eigen take exp one coefficient at a time.
template <class Dst, class Src, class Off, class Shift>
void exp_rows(Dst&& dst, const Src& src, const Off& offset, Shift shift) {
  for (int64_t r = 0; r < src.rows(); ++r) dst.row(r).array() = (src.row(r).array() + offset - shift(r)).exp();
}
template <class T>
T no_shift(int64_t) {
  return T(0);
}

// How a query row of a causal chunk is summed: through the masked product (fast), term by
// term (exact), or not at all (it sees no key).
enum class RowKind : unsigned char { Fast, Exact, Dead };

// Per-thread scratch, allocated once per parallel region: X (rows, d) scaled inputs, Lq (rows, m)
// query logits, L (rows, m) query features against the state, Klog (rows, m) key logits, and
// for causal chunks Ld (rows, m) query features against the diagonal keys, K (rows, m) their
// features, R (rows, m) their running column maxima, A (rows, rows) the masked block; Y (rows,
// d_v) the output rows; kappa (m) the diagonal keys' column maxima, hi (m) max(M, kappa);
// per row t (its shift), r (its product shift on the fast path), g = exp(r - t), den, seen and
// kind. Every product and reduction writes into Eigen-aligned
// storage: Eigen peels an unaligned head off a destination with scalar code (no FMA), so
// writing into the caller's arrays directly would make the last bit depend on where they were
// allocated.
template <class T>
struct Scratch {
  RowMatrix<T> X, Lq, L, Klog, Ld, K, R, A, Y;
  Row<T> kappa, hi;
  Col<T> t, rs, g, den;
  std::vector<int64_t> seen;
  std::vector<RowKind> kind;
  Scratch(int64_t rows, int64_t d, int64_t m, int64_t d_v, bool causal)
      : X(rows, d), Lq(rows, m), L(rows, m), Klog(rows, m), Ld(causal ? rows : 0, m), K(causal ? rows : 0, m),
        R(causal ? rows : 0, m), A(causal ? rows : 0, causal ? rows : 0), Y(rows, d_v), kappa(m), hi(m), t(rows),
        rs(rows), g(rows), den(rows), seen(rows), kind(rows) {}
};

// A key state stored flat: S (m, d_v) row-major, then z (m), then the shifts M (m).
template <class T>
struct State {
  Eigen::Map<RowMatrix<T>> S;
  Eigen::Map<Row<T>> z, M;
  static int64_t width(int64_t m, int64_t d_v) { return m * d_v + 2 * m; }
  State(T* data, int64_t m, int64_t d_v) : S(data, m, d_v), z(data + m * d_v, m), M(data + m * d_v + m, m) {}
  void clear() {
    S.setZero();
    z.setZero();
    M.setConstant(-std::numeric_limits<T>::infinity());
  }
  // Every feature sees every key, so the shifts are all finite or all -inf.
  bool empty() const { return M(0) == -std::numeric_limits<T>::infinity(); }
  void assign(const State& other) {
    S = other.S;
    z = other.z;
    M = other.M;
  }
  // Raise each shift M_f to to_f (where larger), rescaling row f of the sums.
  template <class V>
  void raise(const V& to) {
    for (int64_t f = 0; f < M.size(); ++f) {
      if (!(to(f) > M(f))) continue;
      if (M(f) != -std::numeric_limits<T>::infinity()) {
        const T g = std::exp(M(f) - to(f));
        S.row(f) *= g;
        z(f) *= g;
      }
      M(f) = to(f);
    }
  }
  // this += other, feature by feature at the larger shift.
  void add(const State& other) {
    if (other.empty()) return;
    raise(other.M);
    for (int64_t f = 0; f < M.size(); ++f) {
      const T g = std::exp(other.M(f) - M(f));
      S.row(f).noalias() += g * other.S.row(f);
      z(f) += g * other.z(f);
    }
  }
  // S += F^T V, z += column sums of F, for features F (rows, m) at this state's shifts and
  // values V (rows, d_v).
  template <class F, class VMap>
  void fold(const F& features, const VMap& V) {
    S.noalias() += features.transpose() * V;
    for (int64_t r = 0; r < features.rows(); ++r) z += features.row(r);
  }
};

// Adds keys [j0, j1) of one batch element (k (n_k, d) and v (n_k, d_v) blocks) to the state,
// in blocks of at most `rows` rows, raising each shift to the block's column maximum.
template <class T>
void add_keys(const T* k, const T* v, int64_t j0, int64_t j1, int64_t d, int64_t d_v,
              const Eigen::Map<const RowMatrix<T>>& W, T root, int64_t rows, Scratch<T>& s, State<T>& st) {
  for (int64_t a = j0; a < j1; a += rows) {
    const int64_t r = std::min(rows, j1 - a);
    auto K = s.Klog.topRows(r);
    feature_logits(k + a * d, r, d, W, root, s.X, K);
    s.kappa = K.colwise().maxCoeff();
    st.raise(s.kappa);
    exp_rows(K, K, -st.M.array(), no_shift<T>);
    st.fold(K, Eigen::Map<const RowMatrix<T>>(v + a * d_v, r, d_v));
  }
}

// The diagonal keys kx (nk rows) of a causal chunk: logits into s.Klog, column maxima into
// s.kappa, features exp(l - kappa) into s.K.
template <class T>
void diagonal_keys(const T* kx, int64_t nk, int64_t d, const Eigen::Map<const RowMatrix<T>>& W, T root,
                   Scratch<T>& s) {
  auto Kl = s.Klog.topRows(nk);
  feature_logits(kx, nk, d, W, root, s.X, Kl);
  s.kappa = Kl.colwise().maxCoeff();
  exp_rows(s.K.topRows(nk), Kl, -s.kappa.array(), no_shift<T>);
}

// Row `row` of the exact sum: out_j = sum_f exp(l^q_f + l^k_jf - t) for its `seen` keys.
template <class T, class Out>
void exact_row(const Scratch<T>& s, int64_t row, Out&& out) {
  for (int64_t j = 0; j < s.seen[row]; ++j)
    out(j) = (s.Lq.row(row).array() + s.Klog.row(j).array() - s.t(row)).exp().sum();
}

// Query rows x (rows i0.. of the sequence, r of them) against the state `st` of the keys
// before them and, with nk > 0, the diagonal block of keys kx (keys j0..), values vx, each row
// seeing the keys `vis` gives it: Y and den at each row's shift t (see the top of the file).
// Leaves in the scratch what the backward needs: Lq, L, Ld, Klog, K, kappa, t, rs, g, seen, kind.
template <class T>
void chunk_forward(const T* x, int64_t i0, int64_t r, const T* kx, const T* vx, int64_t j0, int64_t nk,
                   const Visibility& vis, int64_t d, int64_t d_v, const Eigen::Map<const RowMatrix<T>>& W, T root,
                   const State<T>& st, Scratch<T>& s) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  auto Lq = s.Lq.topRows(r);
  feature_logits(x, r, d, W, root, s.X, Lq);
  if (nk > 0) {
    diagonal_keys(kx, nk, d, W, root, s);
    auto R = s.R.topRows(nk);  // running column maxima of the key logits
    R.row(0) = s.Klog.row(0);
    for (int64_t j = 1; j < nk; ++j) R.row(j) = R.row(j - 1).cwiseMax(s.Klog.row(j));
    s.hi = st.M.cwiseMax(s.kappa);
  }
  const T gap = fast_gap<T>();
  for (int64_t row = 0; row < r; ++row) {
    const int64_t seen = nk > 0 ? vis.seen(i0 + row, j0, nk) : 0;
    const auto q = Lq.row(row).array();
    const T u = seen > 0 ? (q + st.M.array().max(s.R.row(seen - 1).array())).maxCoeff()
                         : (q + st.M.array()).maxCoeff();
    const T rr = nk > 0 ? (q + s.hi.array()).maxCoeff() : u;
    s.seen[row] = seen;
    s.kind[row] = u == -inf ? RowKind::Dead : rr - u > gap ? RowKind::Exact : RowKind::Fast;
    const bool fast = s.kind[row] == RowKind::Fast;
    s.t(row) = s.kind[row] == RowKind::Dead ? T(0) : u;
    s.rs(row) = fast ? rr : s.t(row);
    s.g(row) = fast ? std::exp(rr - u) : T(1);
  }
  // A dead row has M = -inf (an empty state): its L row is exp(-inf) = 0.
  auto L = s.L.topRows(r);
  exp_rows(L, Lq, st.M.array(), [&](int64_t row) { return s.t(row); });
  auto Y = s.Y.topRows(r);
  Y.noalias() = L * st.S;
  auto den = s.den.head(r);
  den.noalias() = L * st.z.transpose();
  if (nk == 0) return;
  auto Ld = s.Ld.topRows(r);
  for (int64_t row = 0; row < r; ++row) {
    if (s.kind[row] == RowKind::Fast)
      Ld.row(row) = (Lq.row(row).array() + s.kappa.array() - s.rs(row)).exp().matrix();
    else
      Ld.row(row).setZero();
  }
  auto A = s.A.topLeftCorner(r, nk);
  A.noalias() = Ld * s.K.topRows(nk).transpose();
  for (int64_t row = 0; row < r; ++row) {
    A.row(row).segment(s.seen[row], nk - s.seen[row]).setZero();
    if (s.kind[row] == RowKind::Fast) A.row(row) *= s.g(row);
    if (s.kind[row] == RowKind::Exact) exact_row(s, row, A.row(row));
  }
  Y.noalias() += A * Eigen::Map<const RowMatrix<T>>(vx, nk, d_v);
  den += A.rowwise().sum();
}

// Folds the diagonal keys of chunk_forward (features s.K at the shifts s.kappa, values vx)
// into the state, raising its shifts to max(M, kappa).
template <class T>
void fold_diagonal(int64_t nk, const T* vx, int64_t d_v, Scratch<T>& s, State<T>& st) {
  auto K = s.K.topRows(nk);
  st.raise(s.kappa);
  s.hi = (s.kappa - st.M).array().exp().matrix();
  for (int64_t j = 0; j < nk; ++j) K.row(j).array() *= s.hi.array();
  st.fold(K, Eigen::Map<const RowMatrix<T>>(vx, nk, d_v));
}

// y rows /= den and log Z = log den - log m + t; y = 0, log Z = -inf where den = 0.
// The rows are copied from the scratch Y into y (rows, d_v).
template <class T>
void finish_rows(RowMatrix<T>& Y, int64_t rows, const Col<T>& den, const Col<T>& t, T log_m, T* y, T* log_z) {
  const int64_t d_v = Y.cols();
  for (int64_t r = 0; r < rows; ++r) {
    const T dr = den(r);
    if (dr > T(0)) {
      Y.row(r) /= dr;
      log_z[r] = (std::log(dr) - log_m) + t(r);
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
  const int64_t width = State<T>::width(m, d_v);
  const T log_m = std::log(T(m));
  const bool par = parallel_worth(double(batch) * (n_q + n_k) * m * (d + d_v));
  const Visibility vis(causal, n_q, n_k);

  if (!vis.limited()) {
    const int64_t blocks = (n_k + kRows - 1) / kRows;
    const int64_t per = std::max<int64_t>(1, (blocks + kMaxSpans - 1) / kMaxSpans);
    const int64_t spans = std::max<int64_t>(1, (blocks + per - 1) / per), span_rows = per * kRows;
    const int64_t qblocks = (n_q + kRows - 1) / kRows;
    Col<T> store(batch * spans * width);
    auto state = [&](int64_t slot) { return State<T>(store.data() + slot * width, m, d_v); };
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
        finish_rows(s.Y, r, s.den, s.t, log_m, y + (b * n_q + i0) * d_v, log_z + b * n_q + i0);
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
  Col<T> store(batch * segments * width);
  auto state = [&](int64_t slot) { return State<T>(store.data() + slot * width, m, d_v); };
#pragma omp parallel if (par)
  {
    Scratch<T> s(C, d, m, d_v, true);
    Col<T> own_data(width);
    State<T> own(own_data.data(), m, d_v);
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
      own.assign(state(unit));
      const int64_t c_end = std::min(chunks, (g + 1) * G);
      for (int64_t c = g * G; c < c_end; ++c) {
        const int64_t i0 = c * C, r = std::min(C, n_q - i0);
        const int64_t j0 = bound(c), nk = vis.end(i0 + r - 1) - j0;
        // Queries against the state (the keys before the chunk, all visible) and the diagonal.
        chunk_forward(q.block(b) + i0 * d, i0, r, kb + j0 * d, vb + j0 * d_v, j0, nk, vis, d, d_v, Wm, root, own, s);
        if (nk > 0 && c + 1 < c_end) fold_diagonal(nk, vb + j0 * d_v, d_v, s, own);
        finish_rows(s.Y, r, s.den, s.t, log_m, y + (b * n_q + i0) * d_v, log_z + b * n_q + i0);
      }
    }
  }
}

}  // namespace attngeom
