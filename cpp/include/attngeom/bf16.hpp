// bfloat16 products: C = bf16(A) B^T with A in float32, B stored as bfloat16 bits and every
// sum accumulated in float32.
//
// B is (n, k) row-major, the layout in which checkpoints store a linear layer's weight
// (out_features, in_features), so a product reads the weights as they lie in a mapped file,
// with no widened or packed copy. A's rows are rounded to bfloat16 (nearest, ties to even,
// the rounding of PyTorch and of float32_to_bfloat16 in Python) once per call.
//
// Three paths, chosen at run time (dot_path()):
// - "amx_bf16": Intel's AMX tiles (TDPBF16PS, 16 x 16 float32 results of 16 x 32 bfloat16
//   rows an instruction; Sapphire Rapids and later), where the CPU has AMX-BF16 and Linux
//   grants the process the tiles' state. A's rounded rows are packed once a call as the
//   tiles' row operand, B's rows as the pair operand (bf16.cpp); the result tiles are stored
//   into C as they are.
// - "avx512_bf16": the CPU's bfloat16 dot products (VDPBF16PS: 32 products of bfloat16 pairs
//   added into 16 float32 lanes per instruction). Register tiles of 6 rows of A against 4
//   rows of B, each of the 24 accumulators one (i, j) entry's 16 partial sums over the whole
//   depth, reduced at the end by one fixed tree. Compiled with function-level target
//   attributes into every instruction-set level, used where CPUID reports AVX512_BF16 (AMD
//   Zen 4 and later, Intel Cooper Lake, Sapphire Rapids and later). The instruction treats
//   subnormal bfloat16 inputs as zero.
// - "widened": elsewhere, blocks of A's rounded rows and panels of B widened to float32
//   (exactly) and multiplied by the attention's score tiles (tiles.hpp: the level's vector
//   width, FMA), each entry one chain of multiply-adds over the depth in order: the same
//   mathematics at about the float32 GEMM's speed.
//
// Determinism: within a path, an entry C[i, j] depends on row i of A and row j of B only
// (the tiling changes which registers hold it, never the order of its sums), so results are
// bitwise the same at any thread count and any split of the rows. The two paths agree to
// float32 rounding, not bitwise.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace attngeom {

// The bfloat16 bits of x: nearest, ties to even (carrying into the exponent as it should, so
// the largest floats round to infinity); a NaN stays a quiet NaN.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The float32 value of bfloat16 bits (exact: the bits are a float32's upper half).
inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// x[i] = bfloat16(x[i]) as float32 (bf16_bits), in place.
inline void round_to_bf16_values(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    x[i] = bf16_value(bf16_bits(x[i]));
  }
}

// The paths of the product; `best` is the fastest this CPU has (dot_path()).
enum class DotPath { best, amx_bf16, avx512_bf16, widened };

// The path the products and the attention's bfloat16 products take: the one set_dot_path
// chose, else the fastest this CPU has: amx_bf16 where it has AMX-BF16 tiles and the system
// lets the process use them, avx512_bf16 where it has bfloat16 dot products, widened
// elsewhere. dot_path() is its name.
DotPath chosen_dot_path();
std::string dot_path();
// Chooses the path for the whole process (tests, benchmarks; `best` returns to the fastest);
// a path this CPU lacks throws std::invalid_argument.
void set_dot_path(DotPath path);
// Whether this CPU (and system) can take `path`.
bool has_dot_path(DotPath path);

// x[i] = the float32 value of bfloat16 bits[i] (exact); OpenMP over blocks when worth it.
void widen_bf16(const uint16_t* bits, int64_t count, float* x);

// bits[i] = bfloat16 of x[i], rounded to nearest, ties to even; NaN stays a (quiet) NaN.
void round_to_bf16(const float* x, int64_t count, uint16_t* bits);

// C (m, n, row stride ldc) = bf16(A) (m, k, row stride lda) @ B^T, B (n, k, row stride ldb)
// bfloat16 bits; float32 accumulation. `parallel`: OpenMP over (row block, column panel)
// units on the core's thread budget; false runs on the calling thread (for callers that are
// themselves one of several threads). `path` chooses a path (tests, benchmarks): a path this
// CPU lacks throws std::invalid_argument.
void matmul_bf16(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                 float* C, int64_t ldc, bool parallel, DotPath path = DotPath::best);

// One right factor of products that share their left factor A: B (n, k) bfloat16 bits, row
// stride ldb, and the result C (m, n), row stride ldc. With `add` (m, n), row stride ld_add,
// C = bf16(A) B^T + add: each unit adds its block of `add` to its block of C as it finishes
// it, while the block is in cache (a residual stream's sum with the layer's output, the same
// bits as the product plus add in a separate pass; C may not overlap add).
struct BF16Factor {
  const uint16_t* B;
  int64_t n, ldb;
  float* C;
  int64_t ldc;
  const float* add = nullptr;
  int64_t ld_add = 0;
};

// C_f = bf16(A) @ B_f^T for each factor f, as matmul_bf16 computes each (the same bits), with
// A rounded (and packed) once for all of them and the units spread over every factor's
// columns: the q, k and v projections of a block of tokens in one call.
void matmul_bf16(int64_t m, int64_t k, const float* A, int64_t lda, const std::vector<BF16Factor>& factors,
                 bool parallel, DotPath path = DotPath::best);

}  // namespace attngeom
