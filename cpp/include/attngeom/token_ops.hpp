// The float32 token-wise steps of a forward pass, fused: one pass over a row where NumPy
// takes four or five (RMS norm, SwiGLU's gate and rounding to bfloat16 values in the bfloat16
// mode; the rotary embedding, bitwise NumPy's, in float32 and bfloat16 modes).
// Each works on the calling thread, or with `parallel` on OpenMP's threads (units of rows, or
// of entries); a row's (an entry's) result depends on that row (entry) only, so the bits do not
// follow the split.
#pragma once

#include <cstdint>

namespace attngeom {

// y[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) for `rows` rows of length d (y may be x). The
// mean square's float32 sums go in one order whatever the row's address.
void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y, bool parallel = false);

// u[i] = silu(g[i]) u[i], silu(g) = g / (1 + exp(-g)), in place (SwiGLU's hidden units).
// Every entry goes through the same vector code, so its result depends on its g and u only,
// not on its address.
void silu_mul(const float* g, float* u, int64_t count, bool parallel = false);

// y = x cos + rotate_half(x) sin for head vectors x (rows, heads, d) with one cos and sin row
// (rows, d) per token; rotate_half maps the halves (a, b) to (-b, a), or each neighbour pair
// when `interleaved`. Products, then the sum, each rounded as NumPy's expression rounds them:
// bitwise NumPy's result (y apart from x).
void rotate_half(const float* x, int64_t rows, int64_t heads, int64_t d, const float* cos, const float* sin,
                 bool interleaved, float* y);

// The last steps from a block of rows' q (or k, or v) products to what the attention reads, in
// one pass over each head vector: x (rows, heads, d), each vector RMS-normed with the gain w
// (when w is given; rms_norm's bits), rotated by its row's cos and sin (when cos is given;
// rotate_half's bits), rounded to bfloat16 values (when `round`), and written heads-major:
// vector (r, head) to out + head * head_stride + r * d.
void finish_heads(const float* x, int64_t rows, int64_t heads, int64_t d, const float* w, float eps,
                  const float* cos, const float* sin, bool interleaved, bool round, float* out, int64_t head_stride,
                  bool parallel = false);

}  // namespace attngeom
