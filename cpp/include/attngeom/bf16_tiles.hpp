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

}  // namespace detail
}  // namespace attngeom

// AMX (Intel's tile registers, AMX-TILE and AMX-BF16: Sapphire Rapids and later): eight tiles
// of 16 rows of 64 bytes, TDPBF16PS adding to a 16 x 16 float32 tile the products of a tile of
// 16 rows of 32 bfloat16 values (the row operand) with a tile of 16 rows of 16 pairs (the pair
// operand: row t holds pair t of each of 16 columns), 16,384 flops an instruction. The
// product (bf16.cpp) and the attention forward (attention.hpp) use them where amx_usable()
// (CPUID, and Linux's grant of the tile state to the process) and the chosen path allow. Each
// thread loads the tile configuration (amx_begin) before its tiles and releases them after
// (amx_end). The emulated module (ATTNGEOM_BF16_EMULATED) runs the same code on eight tiles
// in memory per thread, each TDPBF16PS an entry's float32 sums over the pairs in order.
#if defined(ATTNGEOM_BF16_EMULATED)
#define ATTNGEOM_AMX 1
#define ATTNGEOM_AMX_TARGET
#elif defined(ATTNGEOM_BF16_X86) && defined(__linux__)
#define ATTNGEOM_AMX 1
#define ATTNGEOM_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace attngeom {
namespace detail {

// Whether the CPU has AMX-BF16 and the operating system lets this process use the tiles
// (always, in the emulated module); bf16.cpp.
bool amx_usable();

#ifdef ATTNGEOM_AMX
#ifdef ATTNGEOM_BF16_EMULATED
// Tiles in memory, each thread its own eight.
inline thread_local uint32_t amx_tiles[8][16][16];
inline void tile_load(int t, const void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(amx_tiles[t][r], static_cast<const char*>(base) + r * stride, 64);
}
inline void tile_store(int t, void* base, int64_t stride) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(base) + r * stride, amx_tiles[t][r], 64);
}
inline void tile_zero(int t) { std::memset(amx_tiles[t], 0, sizeof amx_tiles[t]); }
// The two bfloat16 values of a 32-bit word: its low half first.
inline float low_half(uint32_t w) { return bf16_value(static_cast<uint16_t>(w)); }
inline float high_half(uint32_t w) { return bf16_value(static_cast<uint16_t>(w >> 16)); }
inline void tile_dpbf16(int d, int a, int b) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float acc;
      std::memcpy(&acc, &amx_tiles[d][i][j], 4);
      for (int t = 0; t < 16; ++t) {
        acc += low_half(amx_tiles[a][i][t]) * low_half(amx_tiles[b][t][j]);
        acc += high_half(amx_tiles[a][i][t]) * high_half(amx_tiles[b][t][j]);
      }
      std::memcpy(&amx_tiles[d][i][j], &acc, 4);
    }
}
#define AMX_LOAD(t, base, stride) ::attngeom::detail::tile_load(t, base, stride)
#define AMX_STORE(t, base, stride) ::attngeom::detail::tile_store(t, base, stride)
#define AMX_ZERO(t) ::attngeom::detail::tile_zero(t)
#define AMX_DOT(d, a, b) ::attngeom::detail::tile_dpbf16(d, a, b)
inline void amx_begin() {}
inline void amx_end() {}
#else
#define AMX_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DOT(d, a, b) _tile_dpbf16ps(d, a, b)
// Palette 1, the eight tiles 16 rows of 64 bytes. A constant, so every byte of it is written
// before LDTILECFG reads it (GCC's _tile_loadconfig names only its first 8 bytes as read).
struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
alignas(64) inline const TileConfig AMX_CONFIG = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
// Each thread configures its tiles at the start of a unit and releases them at its end.
ATTNGEOM_AMX_TARGET inline void amx_begin() { _tile_loadconfig(&AMX_CONFIG); }
ATTNGEOM_AMX_TARGET inline void amx_end() { _tile_release(); }
#endif

#endif

}  // namespace detail
}  // namespace attngeom

namespace attngeom {
namespace detail {

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

// round_pairs for the dot tiles and AMX: where the CPU has them, by VCVTNE2PS2BF16, 32 values
// an instruction (round_pairs, scalar, was 3-4% of a bfloat16 forward's time at 2,048 tokens,
// rounding each key block's rows again for every block of queries, and every weight panel).
// The same words as round_pairs (nearest, ties to even; a NaN quieted as bf16_bits does),
// except that a subnormal float gives a zero of its sign: the dot products and the tiles take
// subnormal bfloat16 inputs as zero, so the sums are the same. The emulated module rounds with
// round_pairs.
#if defined(ATTNGEOM_BF16_X86) && !defined(ATTNGEOM_BF16_EMULATED)
ATTNGEOM_BF16_TARGET inline void round_pairs_vector(const float* x, int64_t n, float* words) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(words + i / 2, _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
  }
  if (i < n) {  // the last values under masks, zeros past n; the words of their pairs written
    const int64_t left = n - i;
    const auto mask = [](int64_t count) {
      return static_cast<__mmask16>(count >= 16 ? 0xffffu : count > 0 ? (1u << count) - 1u : 0u);
    };
    const __m512 lo = _mm512_maskz_loadu_ps(mask(left), x + i), hi = _mm512_maskz_loadu_ps(mask(left - 16), x + i + 16);
    _mm512_mask_storeu_ps(words + i / 2, mask((left + 1) / 2),
                          _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
  }
}
#endif

inline void round_pairs_dot(const float* x, int64_t n, float* words) {
#if defined(ATTNGEOM_BF16_X86) && !defined(ATTNGEOM_BF16_EMULATED)
  round_pairs_vector(x, n, words);
#else
  round_pairs(x, n, words);
#endif
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


#ifdef ATTNGEOM_AMX
// The attention's AMX tiles: panels of 16 query rows. Words as for the dot tiles, with the
// query and key rows padded with zero words to whole tile rows of 16 (AmxTile::words).
struct AmxTile {
  static constexpr int ROWS = 16;  // query rows of a panel
  static int64_t words(int64_t d_k) { return (DotTile::pairs(d_k) + 15) / 16 * 16; }
};

// S[r, c] = scale * sum_t Q[r, t] . Kt[t, c] for the panel's 16 rows and c < padded keys
// (columns past `keys` up to `fill` set to zero): Q's rows are d2 words of pairs (d2 a multiple of
// 16, row stride d2), Kt the keys' words packed in groups of 16 keys (pack_keys<float, 16> on
// the words: Kt[(g d2 + t) 16 + c] is key 16 g + c's pair t). Each entry is one tile lane's
// chain over the pairs in order, then one multiply by the scale: its bits depend on its row of
// Q and column of Kt only.
ATTNGEOM_AMX_TARGET inline void score_tile_amx(const float* Q, int64_t d2, const float* Kt, int64_t keys,
                                                float scale, float* S, int64_t lds, int64_t fill) {
  const int64_t groups = (keys + 15) / 16, steps = d2 / 16, stride = lds * int64_t(sizeof(float));
  for (int64_t g = 0; g < groups; g += 2) {
    const float* K0 = Kt + g * d2 * 16;
    AMX_ZERO(0);
    if (g + 1 < groups) {
      AMX_ZERO(1);
      for (int64_t s = 0; s < steps; ++s) {
        AMX_LOAD(2, Q + 16 * s, d2 * 4);
        AMX_LOAD(3, K0 + 16 * s * 16, 64);
        AMX_DOT(0, 2, 3);
        AMX_LOAD(4, K0 + d2 * 16 + 16 * s * 16, 64);
        AMX_DOT(1, 2, 4);
      }
      AMX_STORE(1, S + 16 * (g + 1), stride);
    } else {
      for (int64_t s = 0; s < steps; ++s) {
        AMX_LOAD(2, Q + 16 * s, d2 * 4);
        AMX_LOAD(3, K0 + 16 * s * 16, 64);
        AMX_DOT(0, 2, 3);
      }
    }
    AMX_STORE(0, S + 16 * g, stride);
  }
  const int64_t done = 16 * groups;
  for (int r = 0; r < AmxTile::ROWS; ++r) {
    float* row = S + r * lds;
    for (int64_t c = 0; c < done; ++c) row[c] *= scale;
    std::fill(row + done, row + std::max(done, fill), 0.0f);
  }
}

// A[r, :d_v] = alpha[r] A[r, :d_v] + sum_{t < pairs(keys)} Pw[r, t] . V[t, :d_v] for r < rows
// (at most 16; alpha == nullptr means 1): Pw the panel's 16 weight rows of words (row stride
// ldp words, zero from pairs(keys) to a multiple of 16, ldp at least that), Vp the values
// packed by pack_values_bf16 with kp = pairs of the key block (the rows read past kp, up to a
// multiple of 16, are weighted by zeros: the next group's values, or zeros past the last
// group: Vp holds 16 DotTile::NC words beyond its values). Column chunks of 16, two at a time,
// go through the tiles from alpha A scaled in place (a whole panel of 16 rows and d_v a
// multiple of 16), or else from a scratch block (alpha A, zero past the rows and columns). Each
// entry is one tile lane's chain over the key pairs in order after alpha A (the same float32
// product either way): its bits depend on its row of weights and its column of values only.
ATTNGEOM_AMX_TARGET inline void value_panel_amx(const float* Pw, int64_t ldp, int64_t keys, const float* Vp,
                                                 int64_t kp, int64_t d_v, float* A, const float* alpha,
                                                 int64_t rows) {
  constexpr int64_t W = 16, NC = DotTile::NC;
  const int64_t steps = (DotTile::pairs(keys) + 15) / 16, packed = DotTile::packed_values(d_v);
  const bool in_place = rows == 16 && d_v % W == 0;
  if (in_place && alpha) {
    for (int64_t r = 0; r < 16; ++r) {
      const float a = alpha[r];
      float* row = A + r * d_v;
      for (int64_t j = 0; j < d_v; ++j) row[j] *= a;
    }
  }
  alignas(64) float scratch[2][16 * W];
  for (int64_t c0 = 0; c0 < packed; c0 += 2 * W) {
    const int chunks = c0 + W < packed ? 2 : 1;
    const float* V[2];
    int64_t vstride[2];
    for (int h = 0; h < chunks; ++h) {
      const int64_t c = c0 + h * W, g0 = c / NC * NC, w = std::min(NC, packed - g0);
      V[h] = Vp + g0 * kp + (c - g0);
      vstride[h] = w * int64_t(sizeof(float));
      if (in_place) continue;
      const int64_t used = std::max<int64_t>(0, std::min(W, d_v - c));
      for (int64_t r = 0; r < 16; ++r) {
        const float a = r < rows ? (alpha ? alpha[r] : 1.0f) : 0.0f;
        for (int64_t j = 0; j < W; ++j) scratch[h][r * W + j] = r < rows && j < used ? a * A[r * d_v + c + j] : 0.0f;
      }
    }
    float* acc[2] = {in_place ? A + c0 : scratch[0], in_place ? A + c0 + W : scratch[1]};
    const int64_t stride = in_place ? d_v * int64_t(sizeof(float)) : 64;
    AMX_LOAD(0, acc[0], stride);
    if (chunks == 2) AMX_LOAD(1, acc[1], stride);
    for (int64_t s = 0; s < steps; ++s) {
      AMX_LOAD(2, Pw + 16 * s, ldp * 4);
      AMX_LOAD(3, V[0] + 16 * s * (vstride[0] / 4), vstride[0]);
      AMX_DOT(0, 2, 3);
      if (chunks == 2) {
        AMX_LOAD(4, V[1] + 16 * s * (vstride[1] / 4), vstride[1]);
        AMX_DOT(1, 2, 4);
      }
    }
    AMX_STORE(0, acc[0], stride);
    if (chunks == 2) AMX_STORE(1, acc[1], stride);
    if (in_place) continue;
    for (int h = 0; h < chunks; ++h) {
      const int64_t c = c0 + h * W, used = std::max<int64_t>(0, std::min(W, d_v - c));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < used; ++j) A[r * d_v + c + j] = scratch[h][r * W + j];
    }
  }
}
#endif

}  // namespace detail
}  // namespace attngeom
