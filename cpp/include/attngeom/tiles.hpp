// Register tiles of the attention forward: the two block products of a flash step, written
// with Eigen's packet functions so that every instruction-set level compiles them to its own
// vector width.
//
// A panel is up to MR query rows against one key block. Scores: S = Q K^T with K^T packed once
// per key block into groups of NC keys (packets along the keys, each group contiguous), an
// MR x NC accumulator tile in registers, one broadcast of q[r, t] per row and step. Values:
// A = alpha A + P V with V packed once per key block into groups of NC columns (each group's
// keys contiguous, so a tile streams one contiguous block instead of a stripe of V's rows) and P
// the panel's weights, the rescaling of the online softmax folded into the load of the
// accumulator tile. Neither Q nor P is packed, and every operand of a panel stays in L1 or L2.
//
// Measured (float32, AVX-512 level, one thread, d 64-128, n 1024-2048, against an FMA peak of
// 117 GFLOP/s per core): score tiles including the key packing at 86-89 % of the peak, value
// tiles at 96 %; the forward 5-17 % faster than with Eigen's block products in the same
// driver, which pack Q, K, P and V anew for every block product. Packing V took the forward
// 2-8 % faster (float32, AVX2 level, AMD Zen 3, d 64-128; the most at d_v 128, where V's
// rows lie 512 bytes apart) and 2 % slower at (8, 12, 256, 64) causal, whose short units
// pack a key block for few rows.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace attngeom {
namespace detail {

// Tile sizes for scalar type T at the compiled packet width: 6 x 4 packets (24 accumulators)
// with 32 vector registers (AVX-512), 6 x 2 with 16 (12 accumulators; with two key packets
// and a broadcast, 15 of the 16 registers). Twelve chains of fused multiply-adds hide the FMA
// latency with a margin; 4 x 2 gave eight, and the forward took 3-12 % longer (float32, AVX2
// level, d 64-128, n 256-4096, AMD Zen 3; 5-8 % longer at the baseline level).
template <class T>
struct Tile {
  using Packet = typename Eigen::internal::packet_traits<T>::type;
  static constexpr int W = Eigen::internal::packet_traits<T>::size;
  static constexpr bool wide = W * sizeof(T) >= 64;
  static constexpr int MR = 6;              // query rows of a panel
  static constexpr int NP = wide ? 4 : 2;   // packets per row of a tile
  static constexpr int64_t NC = NP * W;     // keys of a score tile
  static int64_t padded(int64_t keys) { return (keys + NC - 1) / NC * NC; }
  // Values per key of pack_values: d_v rounded up to whole packets.
  static int64_t packed_values(int64_t d_v) { return (d_v + W - 1) / W * W; }
};

// PacketBlock<P, W> drops the packet type's vector attributes in a template argument, as in
// Eigen's own kernels; GCC's warning about it is silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
// Packs keys K (cols rows of d, row-major) transposed into groups of NC keys (the score
// tile's, or another multiple of the packet width):
// Kt[(g d + t) NC + c] = K[g NC + c, t], zero past `cols` up to a whole group. W x W blocks go
// through registers (Eigen's ptranspose), ragged edges coefficient by coefficient; values are
// only moved, so their bits are kept whatever they are (the bfloat16 tiles pack words of
// pairs with it). Kt holds (cols rounded up to NC) * d values.
template <class T, int64_t NC = Tile<T>::NC>
void pack_keys(const T* K, int64_t d, int64_t cols, T* Kt) {
  namespace ei = Eigen::internal;
  using P = typename Tile<T>::Packet;
  constexpr int W = Tile<T>::W;
  static_assert(NC % W == 0, "groups of whole packets");
  if (const int64_t used = cols % NC) {  // the last group's keys past `cols` are zero
    T* last = Kt + (cols / NC) * d * NC;
    for (int64_t t = 0; t < d; ++t) std::fill(last + t * NC + used, last + (t + 1) * NC, T(0));
  }
  const int64_t c_full = cols / W * W, t_full = W > 1 ? d / W * W : 0;
  for (int64_t c = 0; c < c_full; c += W) {
    T* dst = Kt + (c / NC) * d * NC + c % NC;
    if constexpr (W > 1) {
      for (int64_t t = 0; t < t_full; t += W) {
        ei::PacketBlock<P, W> block;
        for (int i = 0; i < W; ++i) block.packet[i] = ei::ploadu<P>(K + (c + i) * d + t);
        ei::ptranspose(block);
        for (int i = 0; i < W; ++i) ei::pstoreu(dst + (t + i) * NC, block.packet[i]);
      }
    }
    for (int64_t t = t_full; t < d; ++t)
      for (int i = 0; i < W; ++i) dst[t * NC + i] = K[(c + i) * d + t];
  }
  for (int64_t c = c_full; c < cols; ++c) {
    T* dst = Kt + (c / NC) * d * NC + c % NC;
    for (int64_t t = 0; t < d; ++t) dst[t * NC] = K[c * d + t];
  }
}
#pragma GCC diagnostic pop

// S[r, c] = sum_t Q[r, t] Kt[t, c] for r < MR and c < keys (a multiple of NC), Kt packed by
// pack_keys; Q and S row-major with leading dimensions ldq and lds. Each entry is one chain of
// fused multiply-adds over t in order, from zero; with Accumulate the chain starts from S's
// value instead, so that a depth split into blocks (S holding the sum so far) gives the bits
// of one pass. An entry's bits depend on its row of Q and column of Kt only.
template <class T, int MR, bool Accumulate = false>
void score_tile(const T* Q, int64_t ldq, int64_t d, const T* Kt, int64_t keys, T* S, int64_t lds) {
  namespace ei = Eigen::internal;
  using P = typename Tile<T>::Packet;
  constexpr int NP = Tile<T>::NP, W = Tile<T>::W;
  for (int64_t c0 = 0; c0 < keys; c0 += Tile<T>::NC) {
    P acc[MR][NP];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p)
        acc[r][p] = Accumulate ? ei::ploadu<P>(S + r * lds + c0 + p * W) : ei::pset1<P>(T(0));
    const T* kt = Kt + c0 * d;
    for (int64_t t = 0; t < d; ++t, kt += Tile<T>::NC) {
      P kp[NP];
      for (int p = 0; p < NP; ++p) kp[p] = ei::ploadu<P>(kt + p * W);
      for (int r = 0; r < MR; ++r) {
        const P qb = ei::pset1<P>(Q[r * ldq + t]);
        for (int p = 0; p < NP; ++p) acc[r][p] = ei::pmadd(qb, kp[p], acc[r][p]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) ei::pstoreu(S + r * lds + c0 + p * W, acc[r][p]);
  }
}

// A[r, :NP W] = alpha[r] A[r, :NP W] + sum_{t < keys} Pm[r, t] V[t, :NP W] for r < MR;
// alpha == nullptr means 1.
template <class T, int MR, int NP>
void value_tile(const T* Pm, int64_t ldp, int64_t keys, const T* V, int64_t ldv, T* A, int64_t lda, const T* alpha) {
  namespace ei = Eigen::internal;
  using P = typename Tile<T>::Packet;
  constexpr int W = Tile<T>::W;
  P acc[MR][NP];
  for (int r = 0; r < MR; ++r) {
    const P a = ei::pset1<P>(alpha ? alpha[r] : T(1));
    for (int p = 0; p < NP; ++p) acc[r][p] = ei::pmul(a, ei::ploadu<P>(A + r * lda + p * W));
  }
  const T* v = V;
  for (int64_t t = 0; t < keys; ++t, v += ldv) {
    P vp[NP];
    for (int p = 0; p < NP; ++p) vp[p] = ei::ploadu<P>(v + p * W);
    for (int r = 0; r < MR; ++r) {
      const P pb = ei::pset1<P>(Pm[r * ldp + t]);
      for (int p = 0; p < NP; ++p) acc[r][p] = ei::pmadd(pb, vp[p], acc[r][p]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) ei::pstoreu(A + r * lda + p * W, acc[r][p]);
}

// Packs values V (keys rows of d_v, row-major) into groups of NC columns, each group's rows
// contiguous: the group of columns g0 .. g0 + w - 1 starts at Vp + g0 keys and holds
// Vp[g0 keys + t w + c] = V[t, g0 + c]. Every group is NC wide but the last, which takes the
// whole packets left (w < NC when they are not a multiple of NP); the columns past the last
// whole packet form one more group of one packet, zero past d_v. A value tile then streams
// one contiguous group (keys x w) instead of a stripe of V's rows one row length apart. Vp
// holds keys * Tile<T>::packed_values(d_v) values.
template <class T>
void pack_values(const T* V, int64_t d_v, int64_t keys, T* Vp) {
  namespace ei = Eigen::internal;
  using P = typename Tile<T>::Packet;
  constexpr int W = Tile<T>::W, NP = Tile<T>::NP;
  constexpr int64_t NC = Tile<T>::NC;
  const int64_t whole = d_v / W * W;
  for (int64_t g0 = 0; g0 < whole; g0 += NC) {
    T* dst = Vp + g0 * keys;
    const T* src = V + g0;
    if (g0 + NC <= whole) {
      for (int64_t t = 0; t < keys; ++t)
        for (int p = 0; p < NP; ++p) ei::pstoreu(dst + t * NC + p * W, ei::ploadu<P>(src + t * d_v + p * W));
    } else {
      const int64_t width = whole - g0;
      for (int64_t t = 0; t < keys; ++t) std::copy_n(src + t * d_v, width, dst + t * width);
    }
  }
  if (const int64_t rest = d_v - whole) {
    T* dst = Vp + whole * keys;
    for (int64_t t = 0; t < keys; ++t) {
      std::copy_n(V + t * d_v + whole, rest, dst + t * W);
      std::fill(dst + t * W + rest, dst + (t + 1) * W, T(0));
    }
  }
}

// The same for all d_v columns of A (leading dimension d_v), from Vp (the values of `packed`
// keys packed by pack_values; the first `keys` of them are used): tiles of NP packets, a
// narrower one for the whole packets left, and the columns past the last whole packet as one
// packet through a copy of A's rows padded with zeros. So every entry is computed as a packet
// lane: its bits depend on its row of Pm and its column of V only, not on the panel's row
// count or on where its column falls.
template <class T, int MR>
void value_panel(const T* Pm, int64_t ldp, int64_t keys, const T* Vp, int64_t packed, int64_t d_v, T* A,
                 const T* alpha) {
  constexpr int W = Tile<T>::W, NP = Tile<T>::NP;
  static_assert(NP <= 4, "value_panel dispatches narrower tiles up to 3 packets");
  const int64_t packets = d_v / W;
  int64_t p0 = 0;
  for (; p0 + NP <= packets; p0 += NP)
    value_tile<T, MR, NP>(Pm, ldp, keys, Vp + p0 * W * packed, Tile<T>::NC, A + p0 * W, d_v, alpha);
  const T* Vg = Vp + p0 * W * packed;
  T* Ap = A + p0 * W;
  switch (packets - p0) {
    case 1: value_tile<T, MR, 1>(Pm, ldp, keys, Vg, W, Ap, d_v, alpha); break;
    case 2: if constexpr (NP > 2) value_tile<T, MR, 2>(Pm, ldp, keys, Vg, 2 * W, Ap, d_v, alpha); break;
    case 3: if constexpr (NP > 3) value_tile<T, MR, 3>(Pm, ldp, keys, Vg, 3 * W, Ap, d_v, alpha); break;
    default: break;
  }
  const int64_t done = packets * W, rest = d_v - done;
  if (rest > 0) {
    T tile[MR * W];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < W; ++c) tile[r * W + c] = c < rest ? A[r * d_v + done + c] : T(0);
    value_tile<T, MR, 1>(Pm, ldp, keys, Vp + done * packed, W, tile, W, alpha);
    for (int r = 0; r < MR; ++r) std::copy_n(tile + r * W, rest, A + r * d_v + done);
  }
}

// Calls f(std::integral_constant<int, rows>) for 1 <= rows <= MR (default Tile<T>::MR): the
// tile functions take the panel's row count as a template argument.
template <class T, int MR = Tile<T>::MR, class F>
void with_rows(int rows, F&& f) {
  static_assert(MR <= 6, "with_rows dispatches up to 6 rows");
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: if constexpr (MR >= 5) f(std::integral_constant<int, 5>{}); break;
    case 6: if constexpr (MR >= 6) f(std::integral_constant<int, 6>{}); break;
    default: break;
  }
}

}  // namespace detail
}  // namespace attngeom
