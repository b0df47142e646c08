// bfloat16 dot products (AVX512_BF16's VDPBF16PS) in register tiles: the instruction-set
// switch that bf16.cpp's products and the attention forward share, and the attention's two
// block products on bfloat16 operands.
//
// VDPBF16PS adds to each of 16 float32 lanes the products of one pair of bfloat16 values of
// each source (32 products per instruction, twice the float32 FMA's). So the operands are
// packed as pairs along the summed axis, one pair in each 32-bit word ("words" below): a
// query's pair of features (q[2t], q[2t + 1]), a key's (k[2t], k[2t + 1]), a weight row's pair
// of keys (p[2t], p[2t + 1]) and the matching pair of value rows (v[2t, c], v[2t + 1, c]).
// An odd length is padded with a zero. The word of a pair holds its first value in the low
// half. The words live in float32 buffers (the forward's own), as bits that are only copied,
// moved through registers and loaded, never computed with: pack_keys transposes them like
// floats.
//
// The tiles compile into every instruction-set level with function-level target attributes and
// run only where has_bf16_dot() finds the instructions at run time (AMD Zen 4 and later, Intel
// Cooper Lake, Sapphire Rapids and later). The instruction treats subnormal bfloat16 inputs
// as zero and flushes subnormal results. The tests' module attngeom._bf16_emulated
// (ATTNGEOM_BF16_EMULATED, cpp/emulation/) compiles them on SIMDe's portable definitions of
// the intrinsics instead, so that any CPU runs their code, though not at their speed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attngeom/bf16.hpp"

#if defined(ATTNGEOM_BF16_EMULATED)
#define SIMDE_ENABLE_NATIVE_ALIASES
// Clang 16 and later declare __m128bh and __m256bh in their own SSE and AVX headers, which
// SIMDe 0.7's aliases would declare again: its aliases of those two (unused here) take other
// names. Where the compiler's AVX512_BF16 header came first (immintrin.h included earlier),
// SIMDe builds its types on the compiler's and its aliases name the same types: no renaming.
#if !defined(_AVX512BF16INTRIN_H_INCLUDED) && !defined(__AVX512BF16INTRIN_H)
#define __m128bh attngeom_simde_m128bh
#define __m256bh attngeom_simde_m256bh
#include <simde/x86/avx512.h>
#undef __m128bh
#undef __m256bh
#else
#include <simde/x86/avx512.h>
#endif
#define ATTNGEOM_BF16_X86 1
#define ATTNGEOM_BF16_TARGET
#elif (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTNGEOM_BF16_X86 1
#define ATTNGEOM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace attngeom {
namespace detail {

// Whether this CPU has the bfloat16 dot products and the AVX-512 subsets the tiles use
// (always, in the emulated module).
inline bool has_bf16_dot() {
#if defined(ATTNGEOM_BF16_EMULATED)
  return true;
#elif defined(ATTNGEOM_BF16_X86)
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return yes;
#else
  return false;
#endif
}

// The attention's dot tiles: 16 float32 lanes a packet, 4 packets a tile row, so a score tile
// covers 64 keys and a value tile 64 columns; 6 query rows (24 accumulators, 4 key or value
// packets and a broadcast: 29 of the 32 registers).
struct DotTile {
  static constexpr int W = 16;
  static constexpr int NP = 4;
  static constexpr int64_t NC = NP * W;
  static constexpr int MR = 6;
  static int64_t padded(int64_t n) { return (n + NC - 1) / NC * NC; }
  // words of one row of n values in pairs
  static int64_t pairs(int64_t n) { return (n + 1) / 2; }
  // value columns of pack_values_bf16: d_v rounded up to whole packets
  static int64_t packed_values(int64_t d_v) { return (d_v + W - 1) / W * W; }
};

// The word of the pair (a, b) stored in a float32 slot (its bits).
inline void store_pair(float* slot, uint16_t a, uint16_t b) {
  const uint32_t word = uint32_t(a) | uint32_t(b) << 16;
  std::memcpy(slot, &word, sizeof word);
}

// words[t] = the pair (bf16(x[2t]), bf16(x[2t + 1])) for t < pairs(n), the value past an odd
// n zero. Rounded to nearest, ties to even (bf16_bits); a bfloat16 value stays as it is.
inline void round_pairs(const float* x, int64_t n, float* words) {
  const int64_t whole = n / 2;
  for (int64_t t = 0; t < whole; ++t) store_pair(words + t, bf16_bits(x[2 * t]), bf16_bits(x[2 * t + 1]));
  if (n % 2) store_pair(words + whole, bf16_bits(x[n - 1]), 0);
}

// Values V (keys rows of d_v, row-major float32) rounded and packed for value_tile_bf16: pairs
// of rows (V[2t], V[2t + 1]; a zero row past an odd count) in groups of DotTile::NC columns,
// the last group the whole packets left, the columns past d_v zero up to a packet. The group of
// columns g0 .. g0 + w - 1 starts at Vp + g0 pairs(keys) and holds
// Vp[g0 pairs(keys) + t w + c] = (V[2t, g0 + c], V[2t + 1, g0 + c]).
// Vp holds DotTile::pairs(keys) * DotTile::packed_values(d_v) words.
inline void pack_values_bf16(const float* V, int64_t d_v, int64_t keys, float* Vp) {
  const int64_t kp = DotTile::pairs(keys), packed = DotTile::packed_values(d_v);
  for (int64_t g0 = 0; g0 < packed; g0 += DotTile::NC) {
    const int64_t w = std::min(DotTile::NC, packed - g0), used = std::min(w, d_v - g0);
    for (int64_t t = 0; t < kp; ++t) {
      const float* a = V + 2 * t * d_v + g0;
      const float* b = 2 * t + 1 < keys ? a + d_v : nullptr;
      float* dst = Vp + g0 * kp + t * w;
      if (b) {
        for (int64_t c = 0; c < used; ++c) store_pair(dst + c, bf16_bits(a[c]), bf16_bits(b[c]));
      } else {
        for (int64_t c = 0; c < used; ++c) store_pair(dst + c, bf16_bits(a[c]), 0);
      }
      std::fill(dst + used, dst + w, 0.0f);  // +0.0f: the word of two zeros
    }
  }
}

#ifdef ATTNGEOM_BF16_X86
// 16 words of pairs as the instruction's operand type: loaded, or one word broadcast.
ATTNGEOM_BF16_TARGET inline __m512bh load_pairs(const float* words) { return (__m512bh)_mm512_loadu_si512(words); }
// (A broadcast of _mm512_set1_ps / _mm512_set1_epi32 cast to __m512bh crashes Clang 16's code
// generator at -O1 and above; the broadcast of a scalar load does not.)
ATTNGEOM_BF16_TARGET inline __m512bh broadcast_pair(const float* word) {
  return (__m512bh)_mm512_castps_si512(_mm512_broadcastss_ps(_mm_load_ss(word)));
}

// The register tile's loop, shared by the score and value tiles: acc[r][p] += X[r, t] .
// B[t, p W .. (p + 1) W) for t < pairs in order, X's rows of words at stride ldx, B's rows of
// NP packets of pairs at stride ldb words.
template <int MR, int NP>
ATTNGEOM_BF16_TARGET inline void accumulate_pairs(__m512 (&acc)[MR][NP], const float* X, int64_t ldx, int64_t pairs,
                                                  const float* B, int64_t ldb) {
  constexpr int W = DotTile::W;
  for (int64_t t = 0; t < pairs; ++t, B += ldb) {
    __m512bh b[NP];
    for (int p = 0; p < NP; ++p) b[p] = load_pairs(B + p * W);
    for (int r = 0; r < MR; ++r) {
      const __m512bh x = broadcast_pair(X + r * ldx + t);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], x, b[p]);
    }
  }
}

// S[r, c] = scale * sum_t Q[r, t] . Kt[t, c] for r < MR and c < keys (a multiple of
// DotTile::NC): Q's rows are d2 words of pairs (row stride ldq words), Kt the keys' words
// packed in groups of NC keys (pack_keys on the words: Kt[(g d2 + t) NC + c] is key g NC + c's
// pair t). Each entry is one lane's chain of dot products over t in order, then one multiply
// by the scale: its bits depend on its row of Q and column of Kt only.
template <int MR>
ATTNGEOM_BF16_TARGET void score_tile_bf16(const float* Q, int64_t ldq, int64_t d2, const float* Kt, int64_t keys,
                                          float scale, float* S, int64_t lds) {
  constexpr int NP = DotTile::NP, W = DotTile::W;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t c0 = 0; c0 < keys; c0 += DotTile::NC) {
    __m512 acc[MR][NP];
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
    accumulate_pairs<MR, NP>(acc, Q, ldq, d2, Kt + c0 * d2, DotTile::NC);
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) _mm512_storeu_ps(S + r * lds + c0 + p * W, _mm512_mul_ps(acc[r][p], sc));
  }
}

// A[r, :NP W] = alpha[r] A[r, :NP W] + sum_{t < pairs} Pw[r, t] . V[t, :NP W] for r < MR, Pw
// the weight rows' words (row stride ldp words), V a group of packed value words (ldv words a
// pair of keys); alpha == nullptr means 1. Past an odd count of keys the weight is 0 and the
// value that of the next key of the block, which a later row of the unit sees (a value that is
// not finite there makes the call fail whichever rows it reaches, as in the float32 tiles).
template <int MR, int NP>
ATTNGEOM_BF16_TARGET void value_tile_bf16(const float* Pw, int64_t ldp, int64_t pairs, const float* V,
                                          int64_t ldv, float* A, int64_t lda, const float* alpha) {
  constexpr int W = DotTile::W;
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r) {
    const __m512 a = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_mul_ps(a, _mm512_loadu_ps(A + r * lda + p * W));
  }
  accumulate_pairs<MR, NP>(acc, Pw, ldp, pairs, V, ldv);
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(A + r * lda + p * W, acc[r][p]);
}

// The same for all d_v columns of A (row stride d_v) against the keys' values packed by
// pack_values_bf16 (kp words of pairs a column; the first pairs(keys) used): tiles of NP
// packets, a narrower one for the packets left, and the columns past the last whole packet as
// one packet through a copy of A's rows padded with zeros. So every entry is a packet lane's
// chain: its bits depend on its row of weights and its column of values only.
template <int MR>
void value_panel_bf16(const float* Pw, int64_t ldp, int64_t keys, const float* Vp, int64_t kp, int64_t d_v,
                      float* A, const float* alpha) {
  constexpr int W = DotTile::W, NP = DotTile::NP;
  const int64_t pairs = DotTile::pairs(keys);
  const int64_t packets = d_v / W;
  int64_t p0 = 0;
  for (; p0 + NP <= packets; p0 += NP)
    value_tile_bf16<MR, NP>(Pw, ldp, pairs, Vp + p0 * W * kp, DotTile::NC, A + p0 * W, d_v, alpha);
  const float* Vg = Vp + p0 * W * kp;
  const int64_t left = DotTile::packed_values(d_v) / W - p0;  // the last group's packets, a ragged one too
  float* Ap = A + p0 * W;
  switch (packets - p0) {
    case 1: value_tile_bf16<MR, 1>(Pw, ldp, pairs, Vg, left * W, Ap, d_v, alpha); break;
    case 2: value_tile_bf16<MR, 2>(Pw, ldp, pairs, Vg, left * W, Ap, d_v, alpha); break;
    case 3: value_tile_bf16<MR, 3>(Pw, ldp, pairs, Vg, left * W, Ap, d_v, alpha); break;
    default: break;
  }
  const int64_t done = packets * W, rest = d_v - done;
  if (rest > 0) {
    float tile[MR * W];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < W; ++c) tile[r * W + c] = c < rest ? A[r * d_v + done + c] : 0.0f;
    value_tile_bf16<MR, 1>(Pw, ldp, pairs, Vg + (packets - p0) * W, left * W, tile, W, alpha);
    for (int r = 0; r < MR; ++r) std::copy_n(tile + r * W, rest, A + r * d_v + done);
  }
}
#endif

}  // namespace detail
}  // namespace attngeom
