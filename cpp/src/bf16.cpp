// bfloat16 products (bf16.hpp): the AVX512_BF16 register tiles and the widened path.
#include "attngeom/bf16.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <vector>

#include "attngeom/bf16_tiles.hpp"
#include "attngeom/parallel.hpp"
#include "attngeom/tiles.hpp"

namespace attngeom {
namespace {

constexpr int64_t KV = 32;  // bfloat16 values in a 512-bit vector: A's rows are padded to a multiple

float widen_one(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The contiguous loop the compiler vectorizes (shifts of 16-bit lanes widened to 32).
void widen_row(const uint16_t* bits, int64_t count, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] = widen_one(bits[i]);
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

std::string dot_path() { return detail::has_bf16_dot() ? "avx512_bf16" : "widened"; }

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

void matmul_bf16(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                 float* C, int64_t ldc, bool parallel, bool widened) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(C + i * ldc, C + i * ldc + n, 0.0f);
    return;
  }
  const int64_t kp = (k + KV - 1) / KV * KV;
  std::vector<uint16_t> rounded(static_cast<size_t>(m * kp));
  const bool par = parallel && parallel_worth(double(m) * double(n) * double(k));
  FirstException errors;
#pragma omp parallel for schedule(static) if (par && m >= 2 * MB)
  for (int64_t i = 0; i < m; ++i) {
    round_to_bf16(A + i * lda, k, rounded.data() + i * kp);
    std::fill(rounded.data() + i * kp + k, rounded.data() + (i + 1) * kp, uint16_t(0));
  }
  const bool dot = detail::has_bf16_dot() && !widened;
  const int64_t nc = dot ? panel_columns(k) : WIDE_PANEL;
  const int64_t panels = (n + nc - 1) / nc;
  // The widened path widens and packs B's panel once per unit, so its units take more rows:
  // the fewest equal row blocks of at most WIDE_ROWS, more (down to MB rows) while there are
  // fewer units than twice the threads. An entry does not depend on the units, so neither do
  // the bits.
  int64_t mb = MB;
  if (!dot) {
    const int64_t want = 2 * (par ? int64_t(get_num_threads()) : 1);
    int64_t blocks = (m + WIDE_ROWS - 1) / WIDE_ROWS;
    while (blocks * panels < want && (blocks + 1) * MB <= m) ++blocks;
    mb = (m + blocks - 1) / blocks;
  }
  const int64_t row_blocks = (m + mb - 1) / mb;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < row_blocks * panels; ++u) {
    errors.run([&] {
      const int64_t i0 = (u / panels) * mb, rows = std::min(mb, m - i0);
      const int64_t j0 = (u % panels) * nc, j1 = std::min(n, j0 + nc);
      const uint16_t* a = rounded.data() + i0 * kp;
      float* c = C + i0 * ldc;
#ifdef ATTNGEOM_BF16_X86
      if (dot) {
        dot_block(a, kp, rows, B, ldb, j0, j1, k, c, ldc);
        return;
      }
#endif
      (void)dot;
      widened_block(a, kp, rows, B, ldb, j0, j1, k, c, ldc);
    });
  }
  errors.rethrow();
}

}  // namespace attngeom
