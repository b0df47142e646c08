// Attention kernels: softmax scaled dot-product attention and ridge (kernel-swapped)
// attention on the projected coordinate, both through one flash-style driver. Operands are
// stacks of row-major blocks (types.hpp); the ridge kernels psi are in kernels.hpp.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attngeom/bf16.hpp"
#include "attngeom/bf16_tiles.hpp"
#include "attngeom/parallel.hpp"
#include "attngeom/tiles.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

// Statistics of each query's weight row p_i (batch, n_q each), computed in the streaming pass
// from the score tiles, with no (n_q, n_k) buffer. With the running max m, the running sum
// l = sum_j exp(l_j - m) and a = sum_j exp(l_j - m) (l_j - m) (both rescaled by
// exp(m_old - m_new) when the max moves, a also shifted by l (m_old - m_new)):
//   entropy       H_i = -sum_j p_ij log p_ij = log l - a / l            (nats)
//   max_weight    max_j p_ij = 1 / l, at key `argmax` (the first key holding the max)
//   sink_weight   p_i0, the weight on key 0
//   mean_distance sum_j p_ij |pos_i - j|, pos_i = i + n_k - n_q under a bottom-right causal
//                 alignment and i otherwise (the query's position among the keys)
// A row with no visible key has entropy, max_weight, sink_weight and mean_distance 0 and
// argmax -1 (its y is 0 and its log Z -inf).
template <class T>
struct AttentionStatsOutput {
  T* entropy = nullptr;  // all five are given, or none
  T* max_weight = nullptr;
  int64_t* argmax = nullptr;
  T* sink_weight = nullptr;
  T* mean_distance = nullptr;
  bool active() const { return entropy != nullptr; }
};

template <class T>
struct AttentionOutput {
  T* y = nullptr;              // (batch, n_q, d_v), required; see y_heads
  T* weights = nullptr;        // (batch, n_q, n_k) routing matrix P, optional
  T* log_partition = nullptr;  // (batch, n_q) log Z in log-weight units, optional
  AttentionStatsOutput<T> stats;  // optional
  // y's layout: the batch in runs of y_heads entries (the heads of one sequence), written
  // token-major, (batch / y_heads, n_q, y_heads, d_v): each query's heads side by side, as an
  // output projection reads them. 1: (batch, n_q, d_v).
  int64_t y_heads = 1;
  T* y_row(int64_t b, int64_t n_q, int64_t i, int64_t d_v) const {
    return y + ((b / y_heads * n_q + i) * y_heads + b % y_heads) * d_v;
  }
};

// The tiling of the flash loops: query rows per unit of work and keys per step. A value of 0
// (the default) leaves the choice to `tiled`.
struct Blocking {
  int64_t query = 0;
  int64_t key = 0;
};

// The tiling a kernel runs with: the caller's where given, otherwise large tiles (192 queries
// x 384 keys) without a causal limit and 64 x 256 under one (64 x 128 for at most 512 keys).
// Larger tiles pack K and V fewer times (measured in one run, float32, AVX-512, d 64-128, one
// thread: 192 x 384 gave 3-6% more throughput than 64 x 256 forward and backward at
// n >= 1024). The backward's tiles that straddle the diagonal waste up to half their work,
// which cancels that gain, and at n_k = 256 128-key tiles make it 20% faster than 256-key
// ones; the forward trims each panel to the causal limit itself and asks with Causal::None.
// `units(bq, bk)` is the number of parallel units a tiling gives: large tiles are taken only
// when each processor still gets four. The choice depends on the processor count, not on the
// thread count, so results stay bitwise the same whatever set_num_threads says.
template <class Units>
Blocking tiled(Blocking b, Causal causal, int64_t n_k, Units&& units) {
  const Blocking small{64, n_k <= 512 ? 128 : 256}, large{192, 384};
  const bool big = causal == Causal::None && units(large.query, large.key) >= 4 * int64_t(processors());
  if (b.query <= 0) b.query = big ? large.query : small.query;
  if (b.key <= 0) b.key = big ? large.key : small.key;
  return b;
}

namespace detail {

// Scores of softmax attention: the dot products themselves (the scale is folded into the
// query block), so log psi leaves them as they are.
template <class T>
struct DotScores {
  static constexpr bool direct = false;
  // tau_max is here the largest scaled query norm |scale| |q_i|.
  void check_range(double tau_max, double key_max) const {
    const double limit = std::numeric_limits<T>::max();
    check_bound(tau_max, limit, "scale |q_i|", "rescale q or scale");
    check_bound(tau_max * key_max, limit, "the logits scale q.k", "rescale q, k or scale");
  }
  template <class M>
  void log_psi(M&&, const T*) const {}
};

// Refuses a call before any work: NonFiniteOperand for a NaN or infinite entry in the
// queries (q, or tilts u and radii tau) or the keys, in that order; std::invalid_argument
// when the log-weights may overflow the float type, bounded from the largest radius (or
// scaled query norm) and the largest |s| (the key norm, times the tilt norm for ridge
// kernels: Cauchy-Schwarz). One pass over q (or tau and u) and k. The values are checked
// through the output (attend).
//
// `bf16` (attend's bfloat16 products): rounding to bfloat16 moves an entry up by at most a
// factor 1 + 2^-8 (a value near the float maximum would round to inf), and the dot tiles sum
// q . k before they apply the scale; so the rounded norms and their product without the scale
// must stay finite too. Both bfloat16 paths refuse the same inputs, whichever the CPU runs.
template <class T, class Kernel>
void check_range(int64_t batch, const Stack<T>& q, const T* tau, const int64_t* tau_index, const Stack<T>& k,
                 T query_scale, const Kernel& kernel, bool bf16 = false) {
  const double q_max = max_row_norm(batch, q);
  if (std::isnan(q_max)) throw NonFiniteOperand(tau ? "u" : "q");
  double tau_max = 0;
  if (tau) {
    for (int64_t b = 0; b < batch; ++b) {
      const T* t = tau + (tau_index ? tau_index[b] : b) * q.rows;
      for (int64_t i = 0; i < q.rows; ++i) {
        if (!std::isfinite(t[i])) throw NonFiniteOperand("tau");
        tau_max = std::max(tau_max, std::abs(double(t[i])));
      }
    }
  } else {
    tau_max = std::abs(double(query_scale)) * q_max;
  }
  double s_max = max_row_norm(batch, k);
  if (std::isnan(s_max)) throw NonFiniteOperand("k");
  if (bf16) {
    const double limit = std::numeric_limits<T>::max(), up = 1.0 + std::ldexp(1.0, -8);
    check_bound(up * q_max, limit, "|q_i| rounded to bfloat16", "rescale q");
    check_bound(up * s_max, limit, "|k_j| rounded to bfloat16", "rescale k");
    check_bound(up * q_max * up * s_max, limit, "the bfloat16 products q.k (before the scale)", "rescale q or k");
  }
  if (tau) s_max *= q_max;  // |s| = |u.k| <= |u| |k|: tilts given directly need not be unit
  kernel.check_range(tau_max, s_max);
}

// Row primitives of the online softmax: one pass each over a row of the score block (a row
// of at most a key block, resident in L1), written with Eigen's packet functions so that every
// instruction-set level vectorises them. (Eigen's expression templates evaluate a
// column-broadcast expression such as (L.colwise() - shift).exp() coefficient by coefficient,
// through libm's scalar exp.) Two accumulators hide the latency of the reductions.

// max_j x_j of a row of n >= 1 entries.
template <class T>
T row_max(const T* x, int64_t n) {
  namespace ei = Eigen::internal;
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::packet_traits<T>::size;
  T best = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  if constexpr (W > 1) {
    if (n >= 2 * W) {
      P a = ei::ploadu<P>(x), b = ei::ploadu<P>(x + W);
      for (j = 2 * W; j + 2 * W <= n; j += 2 * W) {
        a = ei::pmax(a, ei::ploadu<P>(x + j));
        b = ei::pmax(b, ei::ploadu<P>(x + j + W));
      }
      best = ei::predux_max(ei::pmax(a, b));
    }
  }
  for (; j < n; ++j) best = std::max(best, x[j]);
  return best;
}

// sum_j x_j of a row of n >= 1 entries, in the lanes and order of exp_shift_row: packets
// in pairs into two accumulators, the last pair with the lanes at n and past it set to 0
// (x is read up to n rounded up to two packets: a panel row of the forward). Zeros appended
// to the row leave the sum's bits as they are, so a row summed to a panel's limit gives the
// bits of the row summed to its own.
template <class T>
T row_sum(const T* x, int64_t n) {
  namespace ei = Eigen::internal;
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::packet_traits<T>::size;
  if constexpr (W > 1) {
    const P zero = ei::pset1<P>(T(0));
    P a = zero, b = zero;
    int64_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W) {
      a = ei::padd(a, ei::ploadu<P>(x + j));
      b = ei::padd(b, ei::ploadu<P>(x + j + W));
    }
    if (j < n) {
      const P lane = ei::plset<P>(T(0)), left = ei::pset1<P>(T(n - j)), width = ei::pset1<P>(T(W));
      a = ei::padd(a, ei::pselect(ei::pcmp_lt(lane, left), ei::ploadu<P>(x + j), zero));
      b = ei::padd(b, ei::pselect(ei::pcmp_lt(ei::padd(lane, width), left), ei::ploadu<P>(x + j + W), zero));
    }
    return ei::predux(ei::padd(a, b));
  } else {
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += x[j];
    return sum;
  }
}

// The index of the first x_j equal to `value`, which the row holds: one pass with no
// branch on the data (an early exit mispredicts once per row, which costs more than the
// rest of the pass in rows of a few packets). Each packet's matching positions, the others
// set to n, go into a running minimum; positions are carried as T, exact below 2^digits.
template <class T>
int64_t first_equal(const T* x, int64_t n, T value) {
  namespace ei = Eigen::internal;
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::packet_traits<T>::size;
  int64_t j = 0, at = n;
  if constexpr (W > 1) {
    if (n < int64_t(1) << std::numeric_limits<T>::digits) {
      const P target = ei::pset1<P>(value), none = ei::pset1<P>(T(n)), step = ei::pset1<P>(T(2 * W));
      P pa = ei::plset<P>(T(0)), pb = ei::plset<P>(T(W)), a = none, b = none;
      for (; j + 2 * W <= n; j += 2 * W) {
        a = ei::pmin(a, ei::pselect(ei::pcmp_eq(ei::ploadu<P>(x + j), target), pa, none));
        b = ei::pmin(b, ei::pselect(ei::pcmp_eq(ei::ploadu<P>(x + j + W), target), pb, none));
        pa = ei::padd(pa, step);
        pb = ei::padd(pb, step);
      }
      at = int64_t(ei::predux_min(ei::pmin(a, b)));
    }
  }
  for (; j < at && j < n; ++j)
    if (x[j] == value) return j;
  return at;
}

// exp(x) for a packet of float x <= 88, exactly 0 where x < log_tiny (log_tiny > -87; -inf
// gives 0). The arguments of the online softmax are scores minus a running max or a log
// partition, so they lie below a few ulps above 0: Cody-Waite reduction with the rounding
// done by a magic-number add, the Cephes polynomial that Eigen's pexp uses, and 2^n added to
// the exponent bits directly (the result is normal above log_tiny). Eigen's pexp clamps and
// rebuilds 2^n for the whole float range: this does the same work in 20 instead of 30
// instructions. Error against a correctly rounded exp: 1.25 ulp at most (every 61st float
// in [-75, 0], AVX-512, AVX2 and SSE2).
template <class P>
P exp_below(P x, P log_tiny) {
  namespace ei = Eigen::internal;
  using PI = typename ei::unpacket_traits<P>::integer_packet;
  x = ei::pmin(x, ei::pset1<P>(88.0f));
  const P t = ei::pmadd(x, ei::pset1<P>(1.44269504088896341f), ei::pset1<P>(12582912.0f));  // 1.5 2^23
  const P n = ei::psub(t, ei::pset1<P>(12582912.0f));  // round(x / ln 2); t's low bits hold n
  P r = ei::pmadd(n, ei::pset1<P>(-0.693359375f), x);
  r = ei::pmadd(n, ei::pset1<P>(2.12194440e-4f), r);
  const P r2 = ei::pmul(r, r);
  P y = ei::pmadd(ei::pset1<P>(1.9875691500e-4f), r, ei::pset1<P>(1.3981999507e-3f));
  P y1 = ei::pmadd(ei::pset1<P>(4.1665795894e-2f), r, ei::pset1<P>(1.6666665459e-1f));
  y = ei::pmadd(y, r, ei::pset1<P>(8.3334519073e-3f));
  y1 = ei::pmadd(y1, r, ei::pset1<P>(5.0000001201e-1f));
  y = ei::pmadd(y, ei::pmul(r2, r), y1);
  y = ei::pmadd(y, r2, ei::padd(r, ei::pset1<P>(1.0f)));
  const PI scaled = ei::padd(ei::preinterpret<PI>(y), ei::plogical_shift_left<23>(ei::preinterpret<PI>(t)));
  return ei::pselect(ei::pcmp_lt(x, log_tiny), ei::pset1<P>(0.0f), ei::preinterpret<P>(scaled));
}

// The weights of the online softmax are flushed to exactly 0 below min / epsilon (2^-103
// in float, 2^-970 in double).
template <class T>
constexpr T flush_below() {
  return std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
}

// The first moments of a row of new weights x'_j = exp(x_j - shift) that the attention
// statistics need: es = sum_j x'_j (x_j - shift) and dist = sum_j x'_j |pos - j| (pos is the
// query's position relative to the row's first key).
template <class T>
struct RowMoments {
  T pos = 0, es = 0, dist = 0;
};

// x_j <- exp(x_j - shift), set to exactly 0 where it falls below flush_below<T>(); returns
// the sum of the new x_j. The flush keeps hidden (-inf) entries exactly zero, and keeps
// subnormals out of the products that follow (they slow them down several-fold). x_j - shift
// must not exceed a few ulps above 0 (shift is the row's max or its log partition). With
// `moments`, also accumulates its RowMoments in the same pass; the weights and their sum are
// the same bits either way (a flushed weight adds nothing to es, so hidden -inf entries never
// make 0 * inf). `padded`: x may be read and written up to n rounded up to two packets (a
// panel row of the forward, Tile<T>::padded); the last pair of packets then goes through the
// vector path with the lanes past n hidden, instead of one scalar exp per entry.
template <class T>
T exp_shift_row(T* x, int64_t n, T shift, RowMoments<T>* moments = nullptr, bool padded = false) {
  constexpr T tiny = flush_below<T>();
  namespace ei = Eigen::internal;
  using P = typename ei::packet_traits<T>::type;
  constexpr int64_t W = ei::packet_traits<T>::size;
  T sum = 0, es = 0, dist = 0;
  int64_t j = 0;
  if constexpr (W > 1) {
    // float: exp_below; double: Eigen's pexp, which clamps its argument, so exp(-inf) comes
    // out as the smallest normal number until the flush.
    static const T log_tiny = std::log(tiny);
    const P s = ei::pset1<P>(shift), lo = ei::pset1<P>(tiny), log_lo = ei::pset1<P>(log_tiny);
    const P zero = ei::pset1<P>(T(0));
    auto exp_flushed = [&](P arg) {
      if constexpr (std::is_same_v<T, float>) {
        return exp_below(arg, log_lo);
      } else {
        const P e = ei::pexp(arg);
        return ei::pselect(ei::pcmp_lt(e, lo), zero, e);
      }
    };
    P a = zero, b = zero;
    // the moments: t is -inf only where e is 0, so clamped to the lowest finite value e t is 0
    const P width = ei::pset1<P>(T(W)), lowest = ei::pset1<P>(std::numeric_limits<T>::lowest());
    // two accumulators of each moment, one per packet of the unrolled pair, as for the sum
    P es_a = zero, es_b = zero, dist_a = zero, dist_b = zero;
    P gap = ei::psub(ei::pset1<P>(moments ? moments->pos : T(0)), ei::plset<P>(T(0)));  // pos - j by lane
    const P width2 = ei::padd(width, width);
    auto step = [&](P t0, P t1) {
      const P e0 = exp_flushed(t0), e1 = exp_flushed(t1);
      ei::pstoreu(x + j, e0);
      ei::pstoreu(x + j + W, e1);
      a = ei::padd(a, e0);
      b = ei::padd(b, e1);
      if (moments) {
        es_a = ei::pmadd(e0, ei::pmax(t0, lowest), es_a);
        es_b = ei::pmadd(e1, ei::pmax(t1, lowest), es_b);
        dist_a = ei::pmadd(e0, ei::pabs(gap), dist_a);
        dist_b = ei::pmadd(e1, ei::pabs(ei::psub(gap, width)), dist_b);
        gap = ei::psub(gap, width2);
      }
    };
    for (; j + 2 * W <= n; j += 2 * W)
      step(ei::psub(ei::ploadu<P>(x + j), s), ei::psub(ei::ploadu<P>(x + j + W), s));
    if (padded && j < n) {  // lanes at n and past it get -inf, whose weight is exactly 0
      const P lane = ei::plset<P>(T(0)), inf = ei::pset1<P>(-std::numeric_limits<T>::infinity());
      const P left = ei::pset1<P>(T(n - j));
      const P t0 = ei::pselect(ei::pcmp_lt(lane, left), ei::psub(ei::ploadu<P>(x + j), s), inf);
      const P t1 = ei::pselect(ei::pcmp_lt(ei::padd(lane, width), left), ei::psub(ei::ploadu<P>(x + j + W), s), inf);
      step(t0, t1);
      j = n;
    }
    sum = ei::predux(ei::padd(a, b));
    if (moments) {
      es = ei::predux(ei::padd(es_a, es_b));
      dist = ei::predux(ei::padd(dist_a, dist_b));
    }
  }
  for (; j < n; ++j) {
    const T t = x[j] - shift;
    const T e = std::exp(t);
    x[j] = e < tiny ? T(0) : e;
    sum += x[j];
    if (moments) {
      es += x[j] * std::max(t, std::numeric_limits<T>::lowest());
      dist += x[j] * std::abs(moments->pos - T(j));
    }
  }
  if (moments) {
    moments->es += es;
    moments->dist += dist;
  }
  return sum;
}

// Applies the mask and the causal limit to the log-weights L of batch b, query rows from i0
// and keys from j0: hidden entries become `hidden` (-inf; 0 when L holds weights), an additive
// mask is added.
template <class T, class M>
void hide(M&& L, const Mask<T>& mask, const Visibility& vis, int64_t b, int64_t i0, int64_t j0,
          T hidden = -std::numeric_limits<T>::infinity()) {
  const int64_t rows = L.rows(), cols = L.cols();
  const T neg_inf = hidden;
  if (mask.active()) {
    const int64_t mb = (mask.index ? mask.index[b] : b) * mask.block_size;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = mb + (i0 + r) * mask.row_stride;
      if (mask.keep) {
        for (int64_t c = 0; c < cols; ++c)
          if (!mask.keep[base + (j0 + c) * mask.col_stride]) L(r, c) = neg_inf;
      } else {
        for (int64_t c = 0; c < cols; ++c) L(r, c) += mask.bias[base + (j0 + c) * mask.col_stride];
      }
    }
  }
  if (vis.seen(i0, j0, cols) < cols) {  // the first row, which sees the fewest, misses a key
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = vis.seen(i0 + r, j0, cols); c < cols; ++c) L(r, c) = neg_inf;
  }
}

// The flash driver. `query_scale` multiplies the query block once (1 for ridge scores);
// `kernel.log_psi(S, tau_rows)` turns raw dot products into log-weights in place. A kernel
// with `direct = true` is bounded and never underflows to zero (Cauchy): without an additive
// or boolean mask its weights `kernel.psi(S, tau_rows)` are summed as they are, with no
// running max, exp or rescaling.
//
// A unit is a block of query rows of one batch element; for each key block its keys are
// packed once and the rows go through in panels of Tile<T>::MR (tiles.hpp): scores, log psi,
// mask, online softmax and the value product while the panel's scores are in L1. Under a
// causal limit a panel stops at the last key its last row sees, so the diagonal costs at
// most MR - 1 rows of waste and the tiling need not shrink.
//
// `bf16` (float32 softmax scores only): q, k and v are rounded to bfloat16 (nearest, ties to
// even; a bfloat16 value stays as it is), and the scores, the online softmax, log Z and the
// statistics stay float32. Where the chosen path has bfloat16 dot products (chosen_dot_path) the two
// block products are bf16_tiles.hpp's (its dot tiles, or its AMX tiles on panels of 16 query
// rows): S = scale (q . k) summed in float32, and each panel's weights
// rounded to bfloat16 for the value product (as PyTorch's bfloat16 flash attention rounds
// them; l sums the float32 weights). Elsewhere the float32 tiles run on the rounded values,
// with the weights unrounded and the scale in the query block as without `bf16`.
template <class T, class Kernel>
void attend(int64_t batch, const Stack<T>& q, const T* tau, const int64_t* tau_index, const Stack<T>& k,
            const Stack<T>& v, const Mask<T>& mask, Causal causal, T query_scale, const Kernel& kernel,
            const AttentionOutput<T>& out, Blocking blocking, bool bf16 = false) {
  using Mat = RowMatrix<T>;
  using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
  using CMap = Eigen::Map<const Mat>;
  using PanelMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  constexpr int MR = Tile<T>::MR;
  const int64_t n_q = q.rows, d_k = q.cols, n_k = k.rows, d_v = v.cols;
  const auto units_of = [&](int64_t bq_, int64_t) { return batch * ((n_q + bq_ - 1) / bq_); };
  const bool query_given = blocking.query > 0;
  blocking = tiled(blocking, Causal::None, n_k, units_of);
  constexpr bool dot_able = std::is_same_v<T, float> && std::is_same_v<Kernel, DotScores<T>>;
  if (bf16 && !dot_able) throw std::invalid_argument("internal: bfloat16 products need float32 softmax scores");
  bool dot = false;  // the bfloat16 dot tiles (or AMX tiles)
  bool amx = false;  // the AMX tiles: panels of AmxTile::ROWS rows
#ifdef ATTNGEOM_BF16_X86
  if constexpr (dot_able) {
    const DotPath path = chosen_dot_path();
    dot = bf16 && path != DotPath::widened;
#ifdef ATTNGEOM_AMX
    amx = dot && path == DotPath::amx_bf16;
#endif
  }
#endif
  // The dot and AMX tiles compute a block so fast that rounding and packing each key block
  // for a unit's queries weighs: they take units of DOT_QUERIES queries where each processor
  // still gets four (Intel Xeon family 6 model 167, AMX, (16, n, 128) causal with statistics,
  // 2 threads: 15-20% faster than 192 at n = 512, 2,048 and 8,192; 1,536 no faster).
  constexpr int64_t DOT_QUERIES = 768;
  if (dot && !query_given && units_of(DOT_QUERIES, 0) >= 4 * int64_t(processors())) blocking.query = DOT_QUERIES;
  const int64_t bq = blocking.query, bk = blocking.key;
  const int64_t ld = dot ? DotTile::padded(bk) : Tile<T>::padded(bk);  // the score rows' stride
  // words of a query or key in the dot tiles (whole tile rows for AMX, the words past the pairs
  // zero)
  const int64_t d2 = amx ? AmxTile::words(d_k) : DotTile::pairs(d_k);
  const int PH = amx ? AmxTile::ROWS : MR;  // rows of a panel
  const int64_t bq_panels = (bq + PH - 1) / PH * PH;
  const int64_t q_blocks = (n_q + bq - 1) / bq;
  const Visibility vis(causal, n_q, n_k);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t units = batch * q_blocks;
  const double work = double(batch) * n_q * n_k * (d_k + d_v);
  check_range(batch, q, tau, tau_index, k, query_scale, kernel, bf16);
  const bool stats = out.stats.active();
  // Statistics need the log-weights: bounded kernels then take the log-domain path too.
  const bool direct = Kernel::direct && !mask.active() && !stats;
  bool finite = true;  // every output row; a NaN or inf in v reaches the rows that see it

#pragma omp parallel if (parallel_worth(work)) reduction(&& : finite)
  {
    Mat Qs(bq, d_k), acc(bq, d_v);
    // l and log_l run to whole packets, so that every row's log goes through the vector path
    // (a row in the scalar tail would round differently from one in a packet).
    constexpr int64_t LW = Eigen::internal::packet_traits<T>::size;
    const int64_t bq_whole = (bq + LW - 1) / LW * LW;
    Vec Kt(ld * std::max(d_k, amx ? d2 : 0)), Vp(dot ? 0 : bk * Tile<T>::packed_values(d_v)), S(PH * ld), m(bq),
        l(bq_whole), log_l(bq_whole), alpha(PH);
    // The dot tiles' words (bf16_tiles.hpp): the unit's query rows, the key block's rows before
    // packing, its packed values and a panel's weight rows. Zero where never written: the
    // words past a row's pairs and the rows past the unit's (the AMX tiles read whole tiles),
    // and the values' slack that the AMX value tiles read past the last group.
    Vec Qw(dot ? bq_panels * d2 : 0), Kw(dot ? bk * d2 : 0),
        Vw(dot ? DotTile::pairs(bk) * DotTile::packed_values(d_v) + (amx ? 16 * DotTile::NC : 0) : 0),
        Pw(dot ? PH * ld / 2 : 0);
    if (amx) {
      Qw.setZero();
      Kw.setZero();
      Vw.setZero();
      Pw.setZero();
      amx_begin();
    }
    // The statistics' running sums (AttentionStatsOutput): a, the distance sum, the weight on
    // key 0 (all relative to the running max, like l) and the key that holds the running max.
    Vec ent(stats ? bq : 0), dist(stats ? bq : 0), sink(stats ? bq : 0);
    Eigen::Array<int64_t, Eigen::Dynamic, 1> best_key(stats ? bq : 0);
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < units; ++unit) {
      const int64_t b = unit / q_blocks;
      const int64_t i0 = (unit % q_blocks) * bq;
      const int64_t rows = std::min(bq, n_q - i0);
      const T* tau_rows = tau ? tau + (tau_index ? tau_index[b] : b) * n_q + i0 : nullptr;
      if (dot) {
        if constexpr (dot_able)
          for (int64_t r = 0; r < rows; ++r) round_pairs_dot(q.block(b) + (i0 + r) * d_k, d_k, Qw.data() + r * d2);
      } else if (bf16) {
        if constexpr (dot_able) {
          Qs.topRows(rows) = CMap(q.block(b) + i0 * d_k, rows, d_k);
          round_to_bf16_values(Qs.data(), rows * d_k);
          Qs.topRows(rows) *= query_scale;
        }
      } else {
        Qs.topRows(rows).noalias() = CMap(q.block(b) + i0 * d_k, rows, d_k) * query_scale;
      }
      const T *K = k.block(b), *V = v.block(b);
      acc.topRows(rows).setZero();
      m.head(rows).setConstant(neg_inf);
      l.head(rows).setZero();
      if (stats) {
        ent.head(rows).setZero();
        dist.head(rows).setZero();
        sink.head(rows).setZero();
        best_key.head(rows).setConstant(-1);
      }
      // Keys past the causal limit of the block's last row are never visited.
      const int64_t key_end = vis.end(i0 + rows - 1);
      T* W = out.weights ? out.weights + (b * n_q + i0) * n_k : nullptr;

      for (int64_t j0 = 0; j0 < key_end; j0 += bk) {
        const int64_t cols = std::min(bk, key_end - j0);
        if (dot) {
          if constexpr (dot_able) {
            for (int64_t c = 0; c < cols; ++c) round_pairs_dot(K + (j0 + c) * d_k, d_k, Kw.data() + c * d2);
            if (amx) {
              pack_keys<float, 16>(Kw.data(), d2, cols, Kt.data());
            } else {
              pack_keys<float, DotTile::NC>(Kw.data(), d2, cols, Kt.data());
            }
            pack_values_bf16(V + j0 * d_v, d_v, cols, Vw.data());
          }
        } else {
          pack_keys(K + j0 * d_k, d_k, cols, Kt.data());
          pack_values(V + j0 * d_v, d_v, cols, Vp.data());
          if constexpr (dot_able) {
            if (bf16) {
              round_to_bf16_values(Kt.data(), Tile<T>::padded(cols) * d_k);
              round_to_bf16_values(Vp.data(), cols * Tile<T>::packed_values(d_v));
            }
          }
        }
        for (int64_t p0 = 0; p0 < rows; p0 += PH) {
          const int mr = int(std::min<int64_t>(PH, rows - p0));
          const int64_t seen = vis.seen(i0 + p0 + mr - 1, j0, cols);  // keys of the block the panel's last row sees
          if (seen == 0) continue;
#ifdef ATTNGEOM_AMX
          if constexpr (dot_able) {
            if (amx)
              score_tile_amx(Qw.data() + p0 * d2, d2, Kt.data(), seen, query_scale, S.data(), ld,
                             Tile<T>::padded(seen));
          }
#endif
          if (!amx) with_rows<T>(mr, [&](auto R) {
#ifdef ATTNGEOM_BF16_X86
            if constexpr (dot_able) {
              if (dot) {
                score_tile_bf16<R()>(Qw.data() + p0 * d2, d2, d2, Kt.data(), DotTile::padded(seen), query_scale,
                                     S.data(), ld);
                return;
              }
            }
#endif
            score_tile<T, R()>(Qs.data() + p0 * d_k, d_k, d_k, Kt.data(), Tile<T>::padded(seen), S.data(), ld);
          });
          PanelMap L(S.data(), mr, seen, Eigen::OuterStride<>(ld));
          // The kernel maps whole packets of each row (the score tile's padded(seen) columns, the
          // ones past `seen` unused; rows start packet-aligned): a log-weight is computed the same
          // way (the packet path, where the kernel has one) whatever the panel's key limit, and
          // equals the backward's bit for bit.
          PanelMap Lw(S.data(), mr, Tile<T>::padded(seen), Eigen::OuterStride<>(ld));
          const T* tau_panel = tau_rows ? tau_rows + p0 : nullptr;
          T* A = acc.data() + p0 * d_v;
          if constexpr (Kernel::direct) {
            if (direct) {
              kernel.psi(Lw, tau_panel);
              hide(L, mask, vis, b, i0 + p0, j0, T(0));
              for (int r = 0; r < mr; ++r) {
                if (W) std::copy_n(&L(r, 0), seen, W + (p0 + r) * n_k + j0);
                l[p0 + r] += row_sum(&L(r, 0), seen);
              }
              with_rows<T>(mr, [&](auto R) {
                value_panel<T, R()>(S.data(), ld, seen, Vp.data(), cols, d_v, A, nullptr);
              });
              continue;
            }
          }
          kernel.log_psi(Lw, tau_panel);
          hide(L, mask, vis, b, i0 + p0, j0);
          // Online softmax: running max m, running sum l, accumulator rescaled by alpha.
          // Weights below min/epsilon are flushed to exactly 0 (exp_shift_row): hidden keys and
          // rows that have seen no visible key stay exactly empty. Every row holds a 1 (its
          // max), so the flushed mass is below n_k * min / epsilon relative: far under rounding.
          for (int r = 0; r < mr; ++r) {
            T* row = &L(r, 0);
            if (W) std::copy_n(row, seen, W + (p0 + r) * n_k + j0);
            const int64_t i = p0 + r;
            const T block_max = row_max(row, seen);
            const T m_new = std::max(m[i], block_max);
            const T shift = std::isfinite(m_new) ? m_new : T(0);
            alpha[r] = std::exp(m[i] - shift);
            if (!stats) {
              m[i] = m_new;
              l[i] = alpha[r] * l[i] + exp_shift_row<T>(row, seen, shift, nullptr, true);
              continue;
            }
            if (block_max > m[i]) {  // the max moves to this block: its first key holding it
              best_key[i] = j0 + first_equal(row, seen, block_max);
            }
            // a_new = alpha (a + l (m_old - m_new)) + block terms; a and l are 0 until a key shows
            const T carried = l[i] > T(0) ? alpha[r] * (ent[i] + l[i] * (m[i] - shift)) : T(0);
            RowMoments<T> mo{T(i0 + i + vis.offset - j0)};
            const T e_sum = exp_shift_row(row, seen, shift, &mo, true);
            ent[i] = carried + mo.es;
            dist[i] = alpha[r] * dist[i] + mo.dist;
            sink[i] = alpha[r] * sink[i] + (j0 == 0 ? row[0] : T(0));
            m[i] = m_new;
            l[i] = alpha[r] * l[i] + e_sum;
          }
#ifdef ATTNGEOM_AMX
          if constexpr (dot_able) {
            if (amx) {  // as below, in AMX tiles: the words past the rows' pairs zero to a whole tile row
              const int64_t pairs = DotTile::pairs(seen), whole = (pairs + 15) / 16 * 16;
              for (int r = 0; r < mr; ++r) {
                float* words = Pw.data() + r * (ld / 2);
                round_pairs_dot(&L(r, 0), seen, words);
                std::fill(words + pairs, words + whole, 0.0f);
              }
              value_panel_amx(Pw.data(), ld / 2, seen, Vw.data(), DotTile::pairs(cols), d_v, A, alpha.data(), mr);
              continue;
            }
          }
#endif
          with_rows<T>(mr, [&](auto R) {
#ifdef ATTNGEOM_BF16_X86
            if constexpr (dot_able) {
              if (dot) {  // the weights rounded to bfloat16 pairs, after l took them in float32
                for (int r = 0; r < mr; ++r) round_pairs_dot(&L(r, 0), seen, Pw.data() + r * (ld / 2));
                value_panel_bf16<R()>(Pw.data(), ld / 2, seen, Vw.data(), DotTile::pairs(cols), d_v, A,
                                      alpha.data());
                return;
              }
            }
#endif
            value_panel<T, R()>(S.data(), ld, seen, Vp.data(), cols, d_v, A, alpha.data());
          });
        }
      }

      // Fully masked rows (l = 0) give zeros and log Z = -inf. Direct weights have no shift.
      // Weights were written up to the panel's limit; past a row's own causal limit they are
      // hidden (-inf, or 0 for direct weights) or never written, and come out 0.
      if (direct) m.head(rows).setZero();
      if (out.log_partition || stats) {  // one vector log over the block's rows, padded with ones
        const int64_t whole = (rows + LW - 1) / LW * LW;
        l.segment(rows, whole - rows).setOnes();
        log_l.head(whole) = l.head(whole).log();
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
        Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> y(out.y_row(b, n_q, i0 + r, d_v), d_v);
        y = acc.row(r) * inv;
        finite = finite && (y.array() * T(0)).sum() == T(0);  // NaN iff an entry is not finite; vectorised
        if (out.log_partition) out.log_partition[b * n_q + i0 + r] = l[r] > T(0) ? m[r] + log_l[r] : neg_inf;
        if (stats) {
          const int64_t o = b * n_q + i0 + r;
          const bool seen_any = l[r] > T(0);
          out.stats.entropy[o] = seen_any ? std::max(T(0), log_l[r] - ent[r] * inv) : T(0);
          out.stats.max_weight[o] = inv;
          out.stats.argmax[o] = seen_any ? best_key[r] : -1;
          out.stats.sink_weight[o] = sink[r] * inv;
          out.stats.mean_distance[o] = dist[r] * inv;
        }
        if (W) {
          T* w = W + r * n_k;
          const int64_t visible = vis.end(i0 + r);
          if (l[r] > T(0) && direct) {
            for (int64_t c = 0; c < visible; ++c) w[c] *= inv;
          } else if (l[r] > T(0)) {
            for (int64_t c = 0; c < visible; ++c) w[c] = std::exp(w[c] - m[r]) * inv;
          } else {
            std::fill(w, w + visible, T(0));
          }
          std::fill(w + visible, w + n_k, T(0));
        }
      }
    }
#ifdef ATTNGEOM_AMX
    if (amx) amx_end();
#endif
  }
  // q, k (and tau) are finite and the logits bounded, so a non-finite output comes from v,
  // or from a sum beyond the float range (|y| <= max |v|, but the running sum may not be).
  if (!finite) {
    check_finite(batch, v, "v");
    throw ResultOverflow("the attention output is beyond the float range (the weighted sum of v overflows, or an "
                         "additive mask reaches the float limit); rescale v or the mask");
  }
}

}  // namespace detail

// Softmax attention y = softmax(scale * q k^T + mask) v (Laplace-Radon eq. 2-3).
// `bf16` (float32 only): bfloat16 products, as attend describes.
template <class T>
void softmax_attention(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v, const Mask<T>& mask,
                       Causal causal, T scale, const AttentionOutput<T>& out, Blocking blocking = {},
                       bool bf16 = false) {
  detail::attend(batch, q, static_cast<const T*>(nullptr), nullptr, k, v, mask, causal, scale,
                 detail::DotScores<T>{}, out, blocking, bf16);
}

// Ridge attention: weights psi(tau_j, u_j . k_i) normalised per row (eq. 40-44), for a
// query given by its tilt u (a stack like q) and radius tau ((blocks, n_q), own index).
template <class T, class Kernel>
void ridge_attention(int64_t batch, const Stack<T>& u, const T* tau, const int64_t* tau_index, const Stack<T>& k,
                     const Stack<T>& v, const Mask<T>& mask, Causal causal, const Kernel& kernel,
                     const AttentionOutput<T>& out, Blocking blocking = {}) {
  detail::attend(batch, u, tau, tau_index, k, v, mask, causal, T(1), kernel, out, blocking);
}

}  // namespace attngeom
