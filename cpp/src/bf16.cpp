// bfloat16 products (bf16.hpp): the AVX512_BF16 register tiles and the widened path.
#include "attngeom/bf16.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <vector>

#include "attngeom/parallel.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTNGEOM_BF16_X86 1
// Function-level targets: the tiles compile into every level's module and run only where
// dot_path() found the instructions.
#define ATTNGEOM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace attngeom {
namespace {

constexpr int64_t KV = 32;  // bfloat16 values in a 512-bit vector: A's rows are padded to a multiple

uint16_t round_one(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  u += 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even (carries into the exponent as it should)
  return static_cast<uint16_t>(u >> 16);
}

float widen_one(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool has_dot() {
#ifdef ATTNGEOM_BF16_X86
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

// Units of work: blocks of MB rows of A against panels of B's rows (C's columns) of about
// PANEL_BYTES, so that a panel stays in L2 while the block's row tiles pass over it.
constexpr int64_t MB = 96;
constexpr int64_t PANEL_BYTES = 256 * 1024;
constexpr int64_t NR = 4;  // columns of a register tile
constexpr int MR = 6;      // rows of a register tile

int64_t panel_columns(int64_t k) {
  const int64_t cols = PANEL_BYTES / (2 * std::max<int64_t>(k, 1)) / NR * NR;
  return std::clamp<int64_t>(cols, NR, 256);
}

#ifdef ATTNGEOM_BF16_X86
// The four sums of a, b, c, d's lanes, one fixed tree: halves, then pairs (hadd) twice.
ATTNGEOM_BF16_TARGET inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
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
    const __mmask32 mask = static_cast<__mmask32>((uint64_t(1) << (k - full)) - 1);
    __m512i b[NR];
    for (int c = 0; c < NR; ++c) b[c] = _mm512_maskz_loadu_epi16(mask, B[c] + full);
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

// The widened path for the same unit, in the same shape: the rounded rows and the panel of B
// widened to float32 (exactly, zero past k), register tiles of R rows x NR columns whose
// accumulators are packets along the depth, each reduced by Eigen's fixed tree (predux). An
// entry's sums again depend on its row and column only.
template <int R>
void widened_tile(const float* A, int64_t kp, const float* B, float* C, int64_t ldc, int64_t cols) {
  namespace ei = Eigen::internal;
  using P = ei::packet_traits<float>::type;
  constexpr int W = ei::packet_traits<float>::size;
  P acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = ei::pset1<P>(0.0f);
  for (int64_t t = 0; t < kp; t += W) {
    P b[NR];
    for (int c = 0; c < NR; ++c) b[c] = ei::ploadu<P>(B + c * kp + t);
    for (int r = 0; r < R; ++r) {
      const P a = ei::ploadu<P>(A + r * kp + t);
      for (int c = 0; c < NR; ++c) acc[r][c] = ei::pmadd(a, b[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < cols; ++c) C[r * ldc + c] = ei::predux(acc[r][c]);
}

void widened_block(const uint16_t* A, int64_t kp, int64_t rows, const uint16_t* B, int64_t ldb, int64_t j0,
                   int64_t j1, int64_t k, float* C, int64_t ldc) {
  // 16 vector registers (SSE, AVX2): 2 x 4 accumulators; 32 (AVX-512): 6 x 4
  constexpr int RW = Eigen::internal::packet_traits<float>::size >= 16 ? MR : 2;
  const int64_t cols = (j1 - j0 + NR - 1) / NR * NR;  // whole tiles: zero rows past j1
  std::vector<float> a(static_cast<size_t>(rows * kp)), b(static_cast<size_t>(cols * kp), 0.0f);
  for (int64_t i = 0; i < rows * kp; ++i) a[i] = widen_one(A[i]);
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t t = 0; t < k; ++t) b[(j - j0) * kp + t] = widen_one(B[j * ldb + t]);
  for (int64_t i = 0; i < rows; i += RW) {
    const int64_t R = std::min<int64_t>(RW, rows - i);
    for (int64_t j = 0; j < j1 - j0; j += NR) {
      const int64_t used = std::min<int64_t>(NR, j1 - j0 - j);
      const float *At = a.data() + i * kp, *Bt = b.data() + j * kp;
      float* Ct = C + i * ldc + j0 + j;
      switch (R) {
        case 6: widened_tile<6>(At, kp, Bt, Ct, ldc, used); break;
        case 5: widened_tile<5>(At, kp, Bt, Ct, ldc, used); break;
        case 4: widened_tile<4>(At, kp, Bt, Ct, ldc, used); break;
        case 3: widened_tile<3>(At, kp, Bt, Ct, ldc, used); break;
        case 2: widened_tile<2>(At, kp, Bt, Ct, ldc, used); break;
        default: widened_tile<1>(At, kp, Bt, Ct, ldc, used); break;
      }
    }
  }
}

}  // namespace

std::string dot_path() { return has_dot() ? "avx512_bf16" : "widened"; }

void widen_bf16(const uint16_t* bits, int64_t count, float* x) {
  constexpr int64_t BLOCK = 1 << 16;
  const int64_t blocks = (count + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (parallel_worth(double(count)))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(count, (b + 1) * BLOCK);
    for (int64_t i = b * BLOCK; i < end; ++i) x[i] = widen_one(bits[i]);
  }
}

void round_to_bf16(const float* x, int64_t count, uint16_t* bits) {
  for (int64_t i = 0; i < count; ++i) bits[i] = round_one(x[i]);
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
  const int64_t nc = panel_columns(k);
  const int64_t row_blocks = (m + MB - 1) / MB, panels = (n + nc - 1) / nc;
  const bool dot = has_dot() && !widened;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t u = 0; u < row_blocks * panels; ++u) {
    errors.run([&] {
      const int64_t i0 = (u / panels) * MB, rows = std::min(MB, m - i0);
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
