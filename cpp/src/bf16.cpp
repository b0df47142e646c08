// bfloat16 products (bf16.hpp): the AVX512_BF16 register tiles and the widened path.
#include "attngeom/bf16.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attngeom/bf16_tiles.hpp"
#include "attngeom/parallel.hpp"
#include "attngeom/tiles.hpp"

#if defined(ATTNGEOM_AMX) && !defined(ATTNGEOM_BF16_EMULATED)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attngeom {
namespace {

constexpr int64_t KV = 32;  // bfloat16 values in a 512-bit vector: A's rows are padded to a multiple

// Buffers that start on a cache line (64 bytes). A tile row is one line: loaded from an address
// off the line, each of its 16 rows spans two (measured on an Intel Xeon, family 6 model 167:
// the AMX product 800 against 1,300 GFLOP/s on one thread, 512 x 1,024 x 1,024).
template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t count) { return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  // resize leaves new entries as they are (default-initialized): the buffers are written
  // before they are read, and zeroing megabytes a call cost a few percent of a product
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const LineAllocator&, const LineAllocator&) { return true; }
  friend bool operator!=(const LineAllocator&, const LineAllocator&) { return false; }
};
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

// Scratch buffers up to this size stay with their thread from call to call; larger ones are
// released when the call ends.
constexpr size_t SCRATCH_KEEP = size_t(64) << 20;

// A thread's scratch buffer of at least `count` entries for one call, kept for the next call
// (not mapped and faulted in again every call) unless it exceeds SCRATCH_KEEP. Its entries
// are left as they were: every use writes what it reads.
template <class T>
class Scratch {
 public:
  Scratch(LineVector<T>& kept, size_t count) : v_(kept) {
    if (v_.size() < count) {
      LineVector<T>().swap(v_);
      v_.resize(count);
    }
  }
  ~Scratch() {
    if (v_.size() * sizeof(T) > SCRATCH_KEEP) LineVector<T>().swap(v_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* data() { return v_.data(); }

 private:
  LineVector<T>& v_;
};

// The contiguous loop the compiler vectorizes (shifts of 16-bit lanes widened to 32).
void widen_row(const uint16_t* bits, int64_t count, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] = bf16_value(bits[i]);
}

// Units of work: blocks of MB rows of A against panels of B's rows (C's columns) of about
// PANEL_BYTES, so that a panel stays in L2 while the block's row tiles pass over it (the
// widened path's units are larger: WIDE_ROWS, WIDE_PANEL).
constexpr int64_t MB = 96;
constexpr int64_t PANEL_BYTES = 256 * 1024;
constexpr int64_t NR = 4;  // columns of a register tile
constexpr int MR = 6;      // rows of a register tile

int64_t panel_columns(int64_t k) {
  const int64_t cols = PANEL_BYTES / (2 * std::max<int64_t>(k, 1)) / NR * NR;
  return std::clamp<int64_t>(cols, NR, 256);
}

#ifdef ATTNGEOM_BF16_X86
// The low and high 8 lanes of a added (AVX512F only: SIMDe has no _mm512_extractf32x8_ps).
ATTNGEOM_BF16_TARGET inline __m256 halves(__m512 a) {
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  return _mm256_add_ps(_mm512_castps512_ps256(a), high);
}

// The first `count` (< 32) bfloat16 values at p, zero above: a masked load, which reads no
// byte past them (SIMDe has no 16-bit masked load: a copy, for the tests' module).
ATTNGEOM_BF16_TARGET inline __m512i load_head(const uint16_t* p, int64_t count) {
#if defined(ATTNGEOM_BF16_EMULATED)
  alignas(64) uint16_t head[KV] = {};
  std::copy_n(p, count, head);
  return _mm512_loadu_si512(head);
#else
  return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t(1) << count) - 1), p);
#endif
}

// The four sums of a, b, c, d's lanes, one fixed tree: halves, then pairs (hadd) twice.
ATTNGEOM_BF16_TARGET inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 a8 = halves(a), b8 = halves(b), c8 = halves(c), d8 = halves(d);
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// R rows of the rounded A (row stride kp, zero past k) against the 4 rows B[0..3] of B over
// the whole depth k; writes the first `cols` columns of the R x 4 tile of C.
template <int R>
ATTNGEOM_BF16_TARGET void dot_tile(const uint16_t* A, int64_t kp, const uint16_t* const* B, int64_t k, float* C,
                                   int64_t ldc, int64_t cols) {
  __m512 acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t full = k / KV * KV;
  for (int64_t t = 0; t < full; t += KV) {
    __m512i b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_loadu_si512(B[c] + t);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_loadu_si512(A + r * kp + t);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, (__m512bh)b[c]);
    }
  }
  if (full < k) {  // B's ragged end through a masked load; A is zero there
    __m512i b[NR];
    for (int c = 0; c < NR; ++c) b[c] = load_head(B[c] + full, k - full);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_loadu_si512(A + r * kp + full);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, (__m512bh)b[c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m128 s = hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    if (cols == NR) {
      _mm_storeu_ps(C + r * ldc, s);
    } else {
      alignas(16) float tmp[NR];
      _mm_store_ps(tmp, s);
      std::copy(tmp, tmp + cols, C + r * ldc);
    }
  }
}

// One register tile: rows [i, i + R) of the rounded A against B's rows [j, j + NR) (columns
// past j1 repeat B's row j1 - 1, never stored).
ATTNGEOM_BF16_TARGET inline void dot_at(const uint16_t* A, int64_t kp, int64_t rows, const uint16_t* B, int64_t ldb,
                                        int64_t i, int64_t j, int64_t j1, int64_t k, float* C, int64_t ldc) {
  const int64_t R = std::min<int64_t>(MR, rows - i);
  const int64_t cols = std::min<int64_t>(NR, j1 - j);
  const uint16_t* Bt[NR];
  for (int64_t c = 0; c < NR; ++c) Bt[c] = B + std::min(j + c, j1 - 1) * ldb;
  const uint16_t* At = A + i * kp;
  float* Ct = C + i * ldc + j;
  switch (R) {
    case 6: dot_tile<6>(At, kp, Bt, k, Ct, ldc, cols); break;
    case 5: dot_tile<5>(At, kp, Bt, k, Ct, ldc, cols); break;
    case 4: dot_tile<4>(At, kp, Bt, k, Ct, ldc, cols); break;
    case 3: dot_tile<3>(At, kp, Bt, k, Ct, ldc, cols); break;
    case 2: dot_tile<2>(At, kp, Bt, k, Ct, ldc, cols); break;
    default: dot_tile<1>(At, kp, Bt, k, Ct, ldc, cols); break;
  }
}

// Rows [0, rows) of the rounded A against B's rows [j0, j1). While a tile of A (MR rows over
// the whole depth) fits in L1, row tiles go outer (the A tile stays in L1 across the panel,
// B's tiles come from L2); past that depth, column tiles go outer, so that the smaller B tile
// (NR rows) stays in L1 while A's tiles stream from L2 (measured on Zen 5: at depth 4,096
// 600 against 510 GFLOP/s on 2 threads; at 3,072 row tiles outer stay faster). Each tile
// computes the same sums in either order.
ATTNGEOM_BF16_TARGET void dot_block(const uint16_t* A, int64_t kp, int64_t rows, const uint16_t* B, int64_t ldb,
                                    int64_t j0, int64_t j1, int64_t k, float* C, int64_t ldc) {
  constexpr int64_t L1_TILE_BYTES = 40 * 1024;
  if (MR * kp * 2 <= L1_TILE_BYTES) {
    for (int64_t i = 0; i < rows; i += MR)
      for (int64_t j = j0; j < j1; j += NR) dot_at(A, kp, rows, B, ldb, i, j, j1, k, C, ldc);
  } else {
    for (int64_t j = j0; j < j1; j += NR)
      for (int64_t i = 0; i < rows; i += MR) dot_at(A, kp, rows, B, ldb, i, j, j1, k, C, ldc);
  }
}
#endif

// A factor's panel of columns as the units take them: factor f's B rows [j0, j1).
struct Panel {
  size_t f;
  int64_t j0, j1;
};

// A unit's last step: its block of C (rows [i0, i0 + rows), columns [j0, j1)) plus the
// factor's addend, where it has one (the vectorized loop the compiler makes; x + y is y + x
// bit for bit, so the sum is NumPy's add of the two).
void add_block(const BF16Factor& F, int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
  if (!F.add) return;
  for (int64_t i = i0; i < i0 + rows; ++i) {
    float* c = F.C + i * F.ldc;
    const float* a = F.add + i * F.ld_add;
    for (int64_t j = j0; j < j1; ++j) c[j] += a[j];
  }
}

// The factors' panels of at most `width` columns each, in order.
std::vector<Panel> panels_of(const std::vector<BF16Factor>& factors, int64_t width) {
  std::vector<Panel> out;
  for (size_t f = 0; f < factors.size(); ++f)
    for (int64_t j0 = 0; j0 < factors[f].n; j0 += width) out.push_back({f, j0, std::min(factors[f].n, j0 + width)});
  return out;
}

#ifdef ATTNGEOM_AMX
// The AMX path: Intel's tile registers (AMX-TILE, AMX-BF16; Sapphire Rapids and later). TDPBF16PS
// adds to a 16 x 16 float32 tile the products of a tile of 16 rows of 32 bfloat16 values (the
// row operand) with a tile of 16 rows of 16 pairs (the pair operand, "VNNI" layout: row t holds
// pair t of each of 16 columns), 16,384 flops an instruction.
//
// A's rows, rounded, are the row operand, packed once a call: for each block of 16 rows (the
// rows past m zero) and each step of 32 along the depth, the block's 16 rows of 32 values, one
// tile (pack_rows_amx). The weights are the pair operand, copied once a call in the order the
// tiles read them (pack_panel): for each group of B's rows and each step, 16 x 16 words, word
// [t, c] = the pair (B[j + c, 32 s + 2 t], B[j + c, 32 s + 2 t + 1]). A result tile is a
// 16 x 16 block of C, stored into C as it is, or through a scratch block at C's edges.
//
// An entry C[i, j] is one tile lane's chain of TDPBF16PS over the depth steps in order, from
// zero: it depends on row i of A and row j of B only, not on the tiles' places, the units or
// the thread count. B's last rows short of a tile are taken by a tile that ends at row n - 1
// (its first columns, already written, are computed again and not stored). A tile row is 32
// values, so a depth short of whole tile rows (which would read past a weight row) or n < 16
// takes a copy of B padded with zeros.
//
// The emulated module (ATTNGEOM_BF16_EMULATED) runs the same code on tiles in memory, each
// TDPBF16PS an entry's float32 sums over the pairs in order (cpp/emulation/ for the tests).
constexpr int64_t AMX_DEPTH = 32;  // bfloat16 values in a tile row
constexpr int64_t AMX_WORDS = 256;  // 32-bit words of a tile (16 rows of 64 bytes)
// A unit: at most AMX_ROWS of A's rows (whole pairs of 16-row blocks) against a panel of at
// most AMX_COLUMNS of B's rows.
constexpr int64_t AMX_ROWS = 512;
constexpr int64_t AMX_COLUMNS = 256;

#ifdef ATTNGEOM_BF16_EMULATED
// (SIMDe 0.7 has no 128-bit lane shuffles or masked stores of AVX-512: entry by entry.)
// C[t, skip .. cols) (row stride ldc) = in[t, skip .. cols) for t < rows (in: row stride 32).
void store_block(const float* in, int64_t rows, int64_t skip, int64_t cols, float* C, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = skip; j < cols; ++j) C[i * ldc + j] = in[32 * i + j];
}

// C[t, skip .. cols) (row stride ldc) = in[skip .. cols, t] for t < rows (in: row stride 32).
void store_transposed(const float* in, int64_t rows, int64_t skip, int64_t cols, float* C, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = skip; j < cols; ++j) C[i * ldc + j] = in[32 * j + i];
}

// out (16 x 16 words) = the transpose of 16 rows of 16 words (B: 16 rows of 32 bfloat16
// values, row stride ldb values): word [t, c] = the pair t of row c.
void transpose_pairs(const uint16_t* B, int64_t ldb, uint32_t* out) {
  for (int c = 0; c < 16; ++c)
    for (int t = 0; t < 16; ++t) std::memcpy(out + 16 * t + c, B + c * ldb + 2 * t, 4);
}
#else
// r = the transpose of the 16 x 16 block r (row i in r[i]) of 32-bit lanes.
ATTNGEOM_AMX_TARGET inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// C[t, skip .. cols) (row stride ldc) = in[t, skip .. cols) for t < rows (in: row stride 32),
// row by row under a mask.
ATTNGEOM_AMX_TARGET void store_block(const float* in, int64_t rows, int64_t skip, int64_t cols, float* C,
                                     int64_t ldc) {
  const __mmask16 mask = static_cast<__mmask16>(((1u << cols) - 1u) & ~((1u << skip) - 1u));
  for (int64_t i = 0; i < rows; ++i) _mm512_mask_storeu_ps(C + i * ldc, mask, _mm512_load_ps(in + 32 * i));
}

// C[t, skip .. cols) (row stride ldc) = in[skip .. cols, t] for t < rows (in: a 16 x 16 block,
// row stride 32), row by row under a mask.
ATTNGEOM_AMX_TARGET void store_transposed(const float* in, int64_t rows, int64_t skip, int64_t cols, float* C,
                                          int64_t ldc) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(in + 32 * i);
  transpose16(r);
  const __mmask16 mask = static_cast<__mmask16>(((1u << cols) - 1u) & ~((1u << skip) - 1u));
  for (int64_t i = 0; i < rows; ++i) _mm512_mask_storeu_ps(C + i * ldc, mask, r[i]);
}

// out (16 x 16 words, on a cache line) = the transpose of 16 rows of 16 words (B: 16 rows of
// 32 bfloat16 values, row stride ldb values): word [t, c] = the pair t of row c. The lanes'
// bits are moved, never computed on.
ATTNGEOM_AMX_TARGET void transpose_pairs(const uint16_t* B, int64_t ldb, uint32_t* out) {
  __m512 r[16];
  for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_ps(reinterpret_cast<const float*>(B + c * ldb));
  transpose16(r);
  for (int t = 0; t < 16; ++t) _mm512_store_ps(reinterpret_cast<float*>(out + 16 * t), r[t]);
}

// pack_rows_amx for a whole block of 16 rows (A: its first row): each row's 32 values of a
// step rounded by VCVTNE2PS2BF16 (nearest, ties to even, as bf16_bits; it flushes subnormal
// floats to zero, which the tiles take as zero anyway) into one row of the step's tile. The
// ragged end of the depth through masked loads.
ATTNGEOM_AMX_TARGET void pack_block_amx(const float* A, int64_t lda, int64_t k, int64_t S, uint32_t* P) {
  for (int64_t s = 0; s < S; ++s) {
    const int64_t there = std::min<int64_t>(k - s * AMX_DEPTH, AMX_DEPTH);
    const __mmask16 lo = static_cast<__mmask16>(there >= 16 ? 0xffffu : (1u << there) - 1u);
    const __mmask16 hi = static_cast<__mmask16>(there >= 32 ? 0xffffu : there > 16 ? (1u << (there - 16)) - 1u : 0u);
    for (int c = 0; c < 16; ++c) {
      const float* a = A + c * lda + s * AMX_DEPTH;
      const __m512 x0 = _mm512_maskz_loadu_ps(lo, a), x1 = _mm512_maskz_loadu_ps(hi, a + 16);
      _mm512_store_si512(P + s * AMX_WORDS + 16 * c, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
  }
}
#endif

// Block b of A's rows rounded and packed as the row operand (above): blocks of 16 rows, row
// block b's depth step s at P + (b S + s) AMX_WORDS, S = ceil(k / 32); zeros past m and past k.
void pack_rows_amx(const float* A, int64_t lda, int64_t m, int64_t k, int64_t b, uint32_t* P) {
  const int64_t S = (k + AMX_DEPTH - 1) / AMX_DEPTH;
#ifndef ATTNGEOM_BF16_EMULATED
  if (16 * b + 16 <= m) {
    pack_block_amx(A + 16 * b * lda, lda, k, S, P + b * S * AMX_WORDS);
    return;
  }
#endif
  for (int64_t c = 0; c < 16; ++c) {
    const int64_t i = 16 * b + c;
    for (int64_t s = 0; s < S; ++s) {
      uint32_t* dst = P + (b * S + s) * AMX_WORDS + 16 * c;
      const int64_t there = i < m ? std::clamp<int64_t>(k - s * AMX_DEPTH, 0, AMX_DEPTH) : 0;
      const float* a = A + i * lda + s * AMX_DEPTH;
      for (int64_t t = 0; t < 16; ++t) {
        const uint32_t lo = 2 * t < there ? bf16_bits(a[2 * t]) : 0;
        const uint32_t hi = 2 * t + 1 < there ? bf16_bits(a[2 * t + 1]) : 0;
        dst[t] = lo | hi << 16;
      }
    }
  }
}

// The tiles of TT blocks of packed rows (Y; the next block S AMX_WORDS words on) against a
// group of WT tiles of B's rows (Bg, packed by pack_group: step s's WT tiles one after another
// at Bg + (s - s0) WT AMX_WORDS words) over depth steps [s0, s1): a 16 TT x 16 WT block of C's
// sums, added to those at `from` (row stride ldf) or to zero (from null), stored at `to` (row
// stride ldt). A tile's sums are stored and loaded as they are, so an entry is the same chain
// of TDPBF16PS over the depth in order however the steps are split. Both operands stream in
// order from buffers that start on a cache line, which the hardware prefetchers follow:
// software prefetches (of B's tiles some steps ahead into L1, or of the next group's rows into
// L2) measured no faster.
template <int WT, int TT>
ATTNGEOM_AMX_TARGET void amx_tiles_at(const uint16_t* Bg, const uint32_t* Y, int64_t S, int64_t s0, int64_t s1,
                                      const float* from, int64_t ldf, float* to, int64_t ldt) {
  constexpr int64_t bstep = 16 * WT * AMX_DEPTH;  // bfloat16 values of a step's B tiles
  if (from) {
    AMX_LOAD(0, from, 4 * ldf);
    if constexpr (TT > 1) AMX_LOAD(1, from + 16 * ldf, 4 * ldf);
    if constexpr (WT > 1) AMX_LOAD(2, from + 16, 4 * ldf);
    if constexpr (WT > 1 && TT > 1) AMX_LOAD(3, from + 16 * ldf + 16, 4 * ldf);
  } else {
    AMX_ZERO(0);
    if constexpr (TT > 1) AMX_ZERO(1);
    if constexpr (WT > 1) AMX_ZERO(2);
    if constexpr (WT > 1 && TT > 1) AMX_ZERO(3);
  }
  for (int64_t s = s0; s < s1; ++s) {
    const uint16_t* b = Bg + (s - s0) * bstep;
    AMX_LOAD(4, b, 64);
    AMX_LOAD(6, Y + s * AMX_WORDS, 64);
    AMX_DOT(0, 6, 4);
    if constexpr (TT > 1) {
      AMX_LOAD(7, Y + (S + s) * AMX_WORDS, 64);
      AMX_DOT(1, 7, 4);
    }
    if constexpr (WT > 1) {
      AMX_LOAD(5, b + 16 * AMX_DEPTH, 64);
      AMX_DOT(2, 6, 5);
      if constexpr (TT > 1) AMX_DOT(3, 7, 5);
    }
  }
  AMX_STORE(0, to, 4 * ldt);
  if constexpr (TT > 1) AMX_STORE(1, to + 16 * ldt, 4 * ldt);
  if constexpr (WT > 1) AMX_STORE(2, to + 16, 4 * ldt);
  if constexpr (WT > 1 && TT > 1) AMX_STORE(3, to + 16 * ldt + 16, 4 * ldt);
}

// Bg = B's rows [0, 16 wt) (row stride ldb) over the S depth steps as the pair operand: step
// s's wt tiles (transpose_pairs) one after another (64 KB for 32 rows over a depth of 1,024,
// which the row blocks then read from L1 and L2 instead of from rows 2 k bytes apart, whose
// lines fall in few cache sets). Step by step, so the writes go in order.
void pack_group(const uint16_t* B, int64_t ldb, int wt, int64_t S, uint16_t* Bg) {
  uint32_t* out = reinterpret_cast<uint32_t*>(Bg);
  for (int64_t s = 0; s < S; ++s)
    for (int w = 0; w < wt; ++w) transpose_pairs(B + 16 * w * ldb + s * AMX_DEPTH, ldb, out + (s * wt + w) * AMX_WORDS);
}

// f(at, wt, skip, cols) for the groups of B's rows [j0, j1) in the tiles' order: 32 rows from
// row `at` (wt = 2), or 16 at the end (wt = 1); a short end takes the tile of B's last 16 rows
// (B has nb >= 16), of which the first `skip` are already computed: a group's first tile
// stores its columns [skip, cols).
template <class F>
void for_groups(int64_t nb, int64_t j0, int64_t j1, F&& f) {
  for (int64_t j = j0; j < j1;) {
    const int64_t left = j1 - j;
    const int wt = left >= 32 ? 2 : 1;
    const int64_t at = left >= 16 || j + 16 <= nb ? j : nb - 16;
    f(at, wt, j - at, std::min<int64_t>(16, j1 - at));
    j = at + 16 * wt;
  }
}

// The values a packing of B's rows [j0, j1) takes (pack_panel): at most whole tiles of 16 rows.
int64_t panel_values(int64_t j0, int64_t j1, int64_t S) { return (j1 - j0 + 15) / 16 * 16 * S * AMX_DEPTH; }

// B's rows [j0, j1) packed for amx_block: its groups (for_groups) one after another, each over
// the whole depth (pack_group), so that a unit reads them in order from one buffer.
void pack_panel(const uint16_t* B, int64_t ldb, int64_t nb, int64_t j0, int64_t j1, int64_t S, uint16_t* out) {
  for_groups(nb, j0, j1, [&](int64_t at, int wt, int64_t, int64_t) {
    pack_group(B + at * ldb, ldb, wt, S, out);
    out += 16 * wt * S * AMX_DEPTH;
  });
}

// Depth steps a pass of a unit takes at most: over a deeper depth (the MLP's down projection,
// an attention output projection of 2,048 inputs) a pass's two row blocks and its group of B
// (2 x 64 KB each at a depth of 2,048) both stream from L2, so the unit goes in blocks of
// AMX_STEPS steps, each group's 16 KB staying in L1 while the row blocks pass, the tiles'
// sums stored and loaded between blocks (amx_tiles_at). Up to AMX_WHOLE steps a pass takes
// the whole depth: the store and reload drain the tiles' pipeline, which costs more than the
// streaming saves there. Measured on an Intel Xeon, family 6 model 167, one thread, best of
// 40: 512 x 1,024 x 3,072 at 850-880 GFLOP/s against 680-690 over the whole depth, 2,048 x
// 1,024 x 2,048 at 710-730 against 660-680 (blocks of 4 steps the same, of 16 slower), and
// no gain at a depth of 1,024.
constexpr int64_t AMX_STEPS = 8;
constexpr int64_t AMX_WHOLE = 48;

// C's rows [i0, i0 + rows) and columns [j0, j1) on the tiles: the groups of B's rows
// (for_groups), packed in Bp (pack_panel), each passed by pairs of row blocks of the packed A
// (P: its block i0 / 16 on), over the whole depth or in blocks of AMX_STEPS steps (above).
// The last depth block's tiles go straight into C where they lie whole inside it, through a
// scratch block at its edges. sums: a pass's tiles' sums between depth blocks (resized here).
ATTNGEOM_AMX_TARGET void amx_block(const uint32_t* P, int64_t S, int64_t i0, int64_t rows, const uint16_t* Bp,
                                   int64_t nb, int64_t j0, int64_t j1, float* C, int64_t ldc,
                                   LineVector<float>& sums) {
  alignas(64) float out[32 * 32];
  const int64_t steps = S <= AMX_WHOLE ? S : AMX_STEPS, passes = (rows + 31) / 32;
  if (steps < S) {
    const int64_t groups = (j1 - j0 + 31) / 32 + 1;
    if (sums.size() < size_t(groups * passes * 1024)) sums.resize(size_t(groups * passes * 1024));
  }
  detail::amx_begin();
  for (int64_t s0 = 0; s0 < S; s0 += steps) {
    const int64_t s1 = std::min(S, s0 + steps);
    int64_t g = 0;
    const uint16_t* group = Bp;
    for_groups(nb, j0, j1, [&](int64_t at, int wt, int64_t skip, int64_t cols) {
      const uint16_t* Bg = group + s0 * 16 * wt * AMX_DEPTH;
      for (int64_t i = 0; i < rows; i += 32) {
        const int tt = rows - i > 16 ? 2 : 1;
        const uint32_t* Y = P + ((i0 + i) / 16) * S * AMX_WORDS;
        float* kept = steps == S ? nullptr : sums.data() + (g * passes + i / 32) * 1024;
        const bool direct = s1 == S && skip == 0 && cols == 16 && rows - i >= 16 * tt;
        float* to = s1 < S ? kept : direct ? C + (i0 + i) * ldc + at : out;
        const int64_t ldt = direct ? ldc : 32;
        const float* from = s0 > 0 ? kept : nullptr;
        if (wt == 2 && tt == 2) amx_tiles_at<2, 2>(Bg, Y, S, s0, s1, from, 32, to, ldt);
        else if (wt == 2) amx_tiles_at<2, 1>(Bg, Y, S, s0, s1, from, 32, to, ldt);
        else if (tt == 2) amx_tiles_at<1, 2>(Bg, Y, S, s0, s1, from, 32, to, ldt);
        else amx_tiles_at<1, 1>(Bg, Y, S, s0, s1, from, 32, to, ldt);
        if (s1 < S || direct) continue;
        for (int h = 0; h < tt; ++h)
          for (int w = 0; w < wt; ++w) {
            const int64_t r = std::min<int64_t>(16, rows - i - 16 * h);
            store_block(out + 16 * 32 * h + 16 * w, r, w ? 0 : skip, w ? 16 : cols,
                        C + (i0 + i + 16 * h) * ldc + at + 16 * w, ldc);
          }
      }
      group += 16 * wt * S * AMX_DEPTH;
      ++g;
    });
  }
  detail::amx_end();
}

// Rows of A up to which the product takes the few-rows path (amx_few).
constexpr int64_t AMX_FEW = 16;

// A's m <= 16 rows rounded as the pair operand: step s's 16 x 16 words at Q + s AMX_WORDS,
// word [t, c] = the pair (A[c, 32 s + 2 t], A[c, 32 s + 2 t + 1]), zeros past m and past k.
void pack_pairs_amx(const float* A, int64_t lda, int64_t m, int64_t k, uint32_t* Q) {
  const int64_t S = (k + AMX_DEPTH - 1) / AMX_DEPTH;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t t = 0; t < 16; ++t)
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t at = s * AMX_DEPTH + 2 * t;
        const float* a = A + c * lda;
        const uint32_t lo = c < m && at < k ? bf16_bits(a[at]) : 0;
        const uint32_t hi = c < m && at + 1 < k ? bf16_bits(a[at + 1]) : 0;
        Q[s * AMX_WORDS + 16 * t + c] = lo | hi << 16;
      }
}

// The tiles of one group of wt tiles of B's rows (b: its first row, read in place, a step's
// tile 16 rows of 64 bytes ldb values apart) against few rows (Q, pack_pairs_amx) over the S
// depth steps, stored to out (wt 16 x 16 floats, row stride 32, tile w 512 floats on): C's
// transpose. Two chains go at once (tiles 0 and 1) to keep the tiles busy. (A function, not
// amx_few's lambda: clang compiles the intrinsics only in a function with the target.)
ATTNGEOM_AMX_TARGET void amx_few_group(const uint32_t* Q, int64_t S, const uint16_t* b, int64_t ldb, int wt,
                                       float* out) {
  AMX_ZERO(0);
  if (wt > 1) AMX_ZERO(1);
  for (int64_t s = 0; s < S; ++s) {
    AMX_LOAD(6, Q + s * AMX_WORDS, 64);
    AMX_LOAD(4, b + s * AMX_DEPTH, 2 * ldb);
    AMX_DOT(0, 4, 6);
    if (wt > 1) {
      AMX_LOAD(5, b + 16 * ldb + s * AMX_DEPTH, 2 * ldb);
      AMX_DOT(1, 5, 6);
    }
  }
  AMX_STORE(0, out, 128);
  if (wt > 1) AMX_STORE(1, out + 16 * 32, 128);
}

// C's m <= 16 rows at B's rows [j0, j1) for few rows (the last token's logits, a decoding
// step): B's rows are the row operand, read in place, and A's rows the pair operand (Q,
// pack_pairs_amx), so that the weights are read once, as they lie, instead of packed. A
// result tile is then C's transpose, stored through a scratch block. The entries are the
// same bits as amx_block's: the same pairs' products in the same order (TDPBF16PS's products
// do not depend on which operand holds which factor).
ATTNGEOM_AMX_TARGET void amx_few(const uint32_t* Q, int64_t S, int64_t m, const uint16_t* B, int64_t ldb,
                                 int64_t nb, int64_t j0, int64_t j1, float* C, int64_t ldc) {
  alignas(64) float out[2 * 16 * 32];
  detail::amx_begin();
  for_groups(nb, j0, j1, [&](int64_t at, int wt, int64_t skip, int64_t cols) {
    amx_few_group(Q, S, B + at * ldb, ldb, wt, out);
    for (int w = 0; w < wt; ++w)
      store_transposed(out + 16 * 32 * w, m, w ? 0 : skip, w ? 16 : cols, C + at + 16 * w, ldc);
  });
  detail::amx_end();
}
#endif

// The widened path for the same unit: GotoBLAS-style blocks through the attention kernel's
// register tiles (tiles.hpp), in float32 on values widened exactly. The depth goes in blocks of
// KC; for each, the panel of B is widened and packed into groups of NC columns (the packed
// keys' layout) and the block's rounded rows widened. Column groups go outer, so a group
// (NC x KC floats) stays in L1 while the rows' register tiles pass over it. Each entry is one
// chain of fused multiply-adds over the whole depth in order (the tile's sums carried from
// one depth block to the next through the unit's float32 accumulator), so again an entry
// depends on its row and column only.
//
// The widening and packing of B's panel costs a few cycles per entry of B, against 2 x rows
// flops per entry in the unit's products, so a unit takes up to WIDE_ROWS rows (with MB's 96
// it was a large share of the time), and the register tile is the attention's, 6 rows at
// every level (6 x 2 packets on 16 registers: 12 accumulators). Measured on AMD Zen 3
// (family 25 model 1, AVX2 level, 512 x 1,024 x 3,072, best of 15; this host's single-thread
// figures vary by a quarter from run to run): 40-44 GFLOP/s with units of 96 rows, 56-75 with
// these, the float32 GEMM 58-78; on 2 threads 74-88 against 111-123.
constexpr int64_t KC = 128;
// Columns of a widened unit: whole groups of NC at every level (8, 16, 64 floats), 128 KB of
// packed float32 per depth block.
constexpr int64_t WIDE_PANEL = 256;
// Rows of a widened unit at most (its float32 accumulator: 288 KB).
constexpr int64_t WIDE_ROWS = 288;

void widened_block(const uint16_t* A, int64_t kp, int64_t rows, const uint16_t* B, int64_t ldb, int64_t j0,
                   int64_t j1, int64_t k, float* C, int64_t ldc) {
  using detail::Tile;
  constexpr int64_t NC = Tile<float>::NC;
  constexpr int RM = Tile<float>::MR;  // rows of a register tile: 6 at every level (above)
  const int64_t cols = j1 - j0, padded = Tile<float>::padded(cols);
  std::vector<float> a(static_cast<size_t>(rows * KC)), b(static_cast<size_t>(cols * KC)),
      bt(static_cast<size_t>(padded * KC)), acc(static_cast<size_t>(rows * padded));
  for (int64_t t0 = 0; t0 < k; t0 += KC) {
    const int64_t depth = std::min(KC, k - t0);
    for (int64_t i = 0; i < rows; ++i) widen_row(A + i * kp + t0, depth, a.data() + i * KC);
    // bt[(g depth + t) NC + c] = B[j0 + g NC + c, t0 + t], zero past the panel's columns
    for (int64_t j = 0; j < cols; ++j) widen_row(B + (j0 + j) * ldb + t0, depth, b.data() + j * depth);
    detail::pack_keys(b.data(), depth, cols, bt.data());
    const bool first = t0 == 0;
    for (int64_t c0 = 0; c0 < padded; c0 += NC) {
      const float* group = bt.data() + c0 * depth;
      for (int64_t i = 0; i < rows; i += RM) {
        float* out = acc.data() + i * padded + c0;
        detail::with_rows<float, RM>(int(std::min<int64_t>(RM, rows - i)), [&](auto R) {
          if (first) {
            detail::score_tile<float, R()>(a.data() + i * KC, KC, depth, group, NC, out, padded);
          } else {
            detail::score_tile<float, R(), true>(a.data() + i * KC, KC, depth, group, NC, out, padded);
          }
        });
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) std::copy_n(acc.data() + i * padded, cols, C + i * ldc + j0);
}

}  // namespace

namespace {
std::atomic<int> chosen_path{int(DotPath::best)};  // set_dot_path's choice
}  // namespace

DotPath chosen_dot_path() {
  const auto chosen = DotPath(chosen_path.load(std::memory_order_relaxed));
  if (chosen != DotPath::best) return chosen;
  if (detail::amx_usable()) return DotPath::amx_bf16;
  return detail::has_bf16_dot() ? DotPath::avx512_bf16 : DotPath::widened;
}

void set_dot_path(DotPath path) {
  if (!has_dot_path(path)) throw std::invalid_argument("set_dot_path: this CPU has no such bfloat16 path");
  chosen_path.store(int(path), std::memory_order_relaxed);
}

std::string dot_path() {
  switch (chosen_dot_path()) {
    case DotPath::amx_bf16: return "amx_bf16";
    case DotPath::avx512_bf16: return "avx512_bf16";
    default: return "widened";
  }
}

void widen_bf16(const uint16_t* bits, int64_t count, float* x) {
  constexpr int64_t BLOCK = 1 << 16;
  const int64_t blocks = (count + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (parallel_worth(double(count)))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(count, (b + 1) * BLOCK);
    widen_row(bits + b * BLOCK, end - b * BLOCK, x + b * BLOCK);
  }
}

void round_to_bf16(const float* x, int64_t count, uint16_t* bits) {
  for (int64_t i = 0; i < count; ++i) bits[i] = bf16_bits(x[i]);
}

#ifdef ATTNGEOM_AMX

void matmul_amx(int64_t m, int64_t k, const float* A, int64_t lda, std::vector<BF16Factor> factors, bool par) {
  const int64_t S = (k + AMX_DEPTH - 1) / AMX_DEPTH, blocks = (m + 15) / 16;
  // A depth short of whole tile rows, or fewer than 16 rows of B: B's rows copied with zeros
  // past k, at least 16 of them (the weights of a model need neither). nb: B's rows there.
  std::vector<LineVector<uint16_t>> padded(factors.size());
  std::vector<int64_t> nb(factors.size());
  for (size_t f = 0; f < factors.size(); ++f) {
    BF16Factor& F = factors[f];
    nb[f] = F.n;
    if (k % AMX_DEPTH == 0 && F.n >= 16) continue;
    nb[f] = std::max<int64_t>(F.n, 16);
    padded[f].assign(static_cast<size_t>(nb[f] * S * AMX_DEPTH), 0);
    for (int64_t j = 0; j < F.n; ++j) std::copy_n(F.B + j * F.ldb, k, padded[f].data() + j * S * AMX_DEPTH);
    F.B = padded[f].data();
    F.ldb = S * AMX_DEPTH;
  }
  const std::vector<Panel> panels = panels_of(factors, AMX_COLUMNS);
  const int64_t units_across = int64_t(panels.size());
  if (m <= AMX_FEW) {  // few rows: the weights read in place (amx_few)
    thread_local LineVector<uint32_t> kept_pairs;
    Scratch<uint32_t> Q(kept_pairs, static_cast<size_t>(S * AMX_WORDS));
    pack_pairs_amx(A, lda, m, k, Q.data());
    FirstException errors;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t p = 0; p < units_across; ++p)
      errors.run([&] {
        const Panel& q = panels[size_t(p)];
        const BF16Factor& F = factors[q.f];
        amx_few(Q.data(), S, m, F.B, F.ldb, nb[q.f], q.j0, q.j1, F.C, F.ldc);
        add_block(F, 0, m, q.j0, q.j1);
      });
    errors.rethrow();
    return;
  }
  std::vector<int64_t> offset(panels.size() + 1, 0);  // of each panel's packing
  for (size_t p = 0; p < panels.size(); ++p) offset[p + 1] = offset[p] + panel_values(panels[p].j0, panels[p].j1, S);
  // Smaller row blocks (down to 32 rows) while there are fewer units than twice the threads.
  const int64_t want = 2 * (par ? int64_t(get_num_threads()) : 1);
  int64_t mb = std::min<int64_t>(AMX_ROWS, (m + 31) / 32 * 32);
  while (mb > 32 && ((m + mb - 1) / mb) * units_across < want) mb -= 32;
  const int64_t row_blocks = (m + mb - 1) / mb;
  // Several row blocks read each panel: the panels are packed once, before the units. One row
  // block: each unit packs its panel just before it reads it, from L2 (packed ahead, the
  // panels of a few megabytes were read back from memory: 4% slower at 512 tokens).
  const bool ahead = row_blocks > 1;
  thread_local LineVector<uint32_t> kept_rows;
  thread_local LineVector<uint16_t> kept_weights;
  Scratch<uint32_t> P(kept_rows, static_cast<size_t>(blocks * S * AMX_WORDS));
  Scratch<uint16_t> Bp(kept_weights, static_cast<size_t>(ahead ? offset.back() : 0));
  FirstException errors;
#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) errors.run([&] { pack_rows_amx(A, lda, m, k, b, P.data()); });
    if (ahead) {
#pragma omp for schedule(static)
      for (int64_t p = 0; p < units_across; ++p)
        errors.run([&] {
          const Panel& q = panels[size_t(p)];
          const BF16Factor& F = factors[q.f];
          pack_panel(F.B, F.ldb, nb[q.f], q.j0, q.j1, S, Bp.data() + offset[size_t(p)]);
        });
    }
#pragma omp for schedule(static)
    for (int64_t u = 0; u < row_blocks * units_across; ++u) {
      errors.run([&] {
        const size_t p = size_t(u % units_across);
        const Panel& q = panels[p];
        const BF16Factor& F = factors[q.f];
        const int64_t i0 = (u / units_across) * mb;
        thread_local LineVector<float> sums;
        thread_local LineVector<uint16_t> panel;  // the unit's own packing (one row block)
        Scratch<uint16_t> own(panel, ahead ? 0 : static_cast<size_t>(offset[p + 1] - offset[p]));
        if (!ahead) pack_panel(F.B, F.ldb, nb[q.f], q.j0, q.j1, S, own.data());
        amx_block(P.data(), S, i0, std::min(mb, m - i0), ahead ? Bp.data() + offset[p] : own.data(), nb[q.f], q.j0,
                  q.j1, F.C, F.ldc, sums);
        add_block(F, i0, std::min(mb, m - i0), q.j0, q.j1);
      });
    }
  }
  errors.rethrow();
}
#endif

namespace detail {
// Whether the CPU has AMX-BF16 and the operating system lets this process use the tiles
// (Linux grants their state on request, once per process, from kernel 5.16).
bool amx_usable() {
#if defined(ATTNGEOM_BF16_EMULATED)
  return true;
#elif !defined(ATTNGEOM_AMX)
  return false;
#else
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tiles = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;  // AMX-TILE, AMX-BF16
    if (!tiles || !bf16 || !detail::has_bf16_dot()) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return yes;
#endif
}
}  // namespace detail

bool has_dot_path(DotPath path) {
  switch (path) {
    case DotPath::best:
    case DotPath::widened: return true;
    case DotPath::avx512_bf16: return detail::has_bf16_dot();
    case DotPath::amx_bf16:
#ifdef ATTNGEOM_AMX
      return detail::amx_usable();
#else
      return false;
#endif
  }
  return false;
}

void matmul_bf16(int64_t m, int64_t k, const float* A, int64_t lda, const std::vector<BF16Factor>& factors,
                 bool parallel, DotPath path) {
  if (!has_dot_path(path)) throw std::invalid_argument("matmul_bf16: this CPU has no such bfloat16 path");
  std::vector<BF16Factor> some;  // the factors with columns
  double flops = 0;
  for (const BF16Factor& F : factors)
    if (F.n > 0) {
      some.push_back(F);
      flops += double(m) * double(F.n) * double(k);
    }
  if (m <= 0 || some.empty()) return;
  if (k <= 0) {
    for (const BF16Factor& F : some) {
      for (int64_t i = 0; i < m; ++i) std::fill(F.C + i * F.ldc, F.C + i * F.ldc + F.n, 0.0f);
      add_block(F, 0, m, 0, F.n);
    }
    return;
  }
  const bool par = parallel && parallel_worth(flops);
  if (path == DotPath::best) path = chosen_dot_path();
#ifdef ATTNGEOM_AMX
  if (path == DotPath::amx_bf16) {
    matmul_amx(m, k, A, lda, some, par);
    return;
  }
#endif
  const bool widened = path == DotPath::widened;
  const int64_t kp = (k + KV - 1) / KV * KV;
  thread_local LineVector<uint16_t> kept_rows;
  Scratch<uint16_t> rounded(kept_rows, static_cast<size_t>(m * kp));
  FirstException errors;
#pragma omp parallel for schedule(static) if (par && m >= 2 * MB)
  for (int64_t i = 0; i < m; ++i) {
    round_to_bf16(A + i * lda, k, rounded.data() + i * kp);
    std::fill(rounded.data() + i * kp + k, rounded.data() + (i + 1) * kp, uint16_t(0));
  }
  const bool dot = !widened;
  const std::vector<Panel> panels = panels_of(some, dot ? panel_columns(k) : WIDE_PANEL);
  const int64_t units_across = int64_t(panels.size());
  // The widened path widens and packs B's panel once per unit, so its units take more rows:
  // the fewest equal row blocks of at most WIDE_ROWS, more (down to MB rows) while there are
  // fewer units than twice the threads. An entry does not depend on the units, so neither do
  // the bits.
  int64_t mb = MB;
  if (!dot) {
    const int64_t want = 2 * (par ? int64_t(get_num_threads()) : 1);
    int64_t blocks = (m + WIDE_ROWS - 1) / WIDE_ROWS;
    while (blocks * units_across < want && (blocks + 1) * MB <= m) ++blocks;
    mb = (m + blocks - 1) / blocks;
  }
  const int64_t row_blocks = (m + mb - 1) / mb;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < row_blocks * units_across; ++u) {
    errors.run([&] {
      const Panel& q = panels[size_t(u % units_across)];
      const BF16Factor& F = some[q.f];
      const int64_t i0 = (u / units_across) * mb, rows = std::min(mb, m - i0);
      const uint16_t* a = rounded.data() + i0 * kp;
      float* c = F.C + i0 * F.ldc;
#ifdef ATTNGEOM_BF16_X86
      if (dot) {
        dot_block(a, kp, rows, F.B, F.ldb, q.j0, q.j1, k, c, F.ldc);
        add_block(F, i0, rows, q.j0, q.j1);
        return;
      }
#endif
      (void)dot;
      widened_block(a, kp, rows, F.B, F.ldb, q.j0, q.j1, k, c, F.ldc);
      add_block(F, i0, rows, q.j0, q.j1);
    });
  }
  errors.rethrow();
}

void matmul_bf16(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                 float* C, int64_t ldc, bool parallel, DotPath path) {
  matmul_bf16(m, k, A, lda, {BF16Factor{B, n, ldb, C, ldc}}, parallel, path);
}

}  // namespace attngeom
