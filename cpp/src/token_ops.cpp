// Fused token-wise steps of the bfloat16 mode (token_ops.hpp), with Eigen's vector exp.
#include "attngeom/token_ops.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attngeom/bf16.hpp"
#include "attngeom/parallel.hpp"

namespace attngeom {

namespace {

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t LANES = Eigen::internal::unpacket_traits<Packet>::size;

// The sum of x[i]^2 over a row in one order whatever its address, spelled out: packets of
// LANES entries added lane by lane in order, the lanes then summed by Eigen's fixed tree
// (predux), the last d % LANES entries one by one.
float sum_of_squares(const float* x, int64_t d) {
  using namespace Eigen::internal;
  Packet acc = pset1<Packet>(0.0f);
  int64_t i = 0;
  for (; i + LANES <= d; i += LANES) {
    const Packet p = ploadu<Packet>(x + i);
    acc = padd(acc, pmul(p, p));
  }
  float sum = predux(acc);
  for (; i < d; ++i) sum += x[i] * x[i];
  return sum;
}

// One row of rms_norm (y may be x).
void rms_row(const float* x, int64_t d, const float* w, float eps, float* y) {
  const float inv = 1.0f / std::sqrt(sum_of_squares(x, d) / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * inv);
}

// One head vector of rotate_half (yv apart from xv, c and s: the loops vectorize without checks).
void rotate_row(const float* __restrict xv, int64_t d, const float* __restrict c, const float* __restrict s,
                bool interleaved, float* __restrict yv) {
  const int64_t h = d / 2;
  if (interleaved) {
    for (int64_t i = 0; i < h; ++i) {
      const float a = xv[2 * i], b = xv[2 * i + 1];
      yv[2 * i] = a * c[2 * i] + (-b) * s[2 * i];
      yv[2 * i + 1] = b * c[2 * i + 1] + a * s[2 * i + 1];
    }
  } else {
    for (int64_t i = 0; i < h; ++i) {
      const float a = xv[i], b = xv[i + h];
      yv[i] = a * c[i] + (-b) * s[i];
      yv[i + h] = b * c[i + h] + a * s[i + h];
    }
  }
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y, bool parallel) {
#pragma omp parallel for schedule(static) if (parallel && parallel_worth(double(rows) * d))
  for (int64_t r = 0; r < rows; ++r) rms_row(x + r * d, d, w, eps, y + r * d);
}

namespace {
// silu_mul on entries [0, count): packets from the first, the last count % LANES entries in a
// padded packet. An entry goes through the same vector code wherever it falls, so its result
// depends on its g and u only.
void silu_mul_run(const float* g, float* u, int64_t count) {
  // Packets by hand: Eigen's expression over an unaligned Map peels the entries before the
  // first aligned address off to scalar code (libm's exp), so their bits followed the address.
  using namespace Eigen::internal;
  const Packet one = pset1<Packet>(1.0f);
  const auto gated = [&](const Packet& gp, const Packet& up) { return pmul(pdiv(gp, padd(one, pexp(pnegate(gp)))), up); };
  int64_t i = 0;
  for (; i + LANES <= count; i += LANES) pstoreu(u + i, gated(ploadu<Packet>(g + i), ploadu<Packet>(u + i)));
  if (i < count) {  // the last entries in a packet padded with zeros
    float gt[LANES] = {}, ut[LANES] = {};
    std::copy(g + i, g + count, gt);
    std::copy(u + i, u + count, ut);
    pstoreu(ut, gated(ploadu<Packet>(gt), ploadu<Packet>(ut)));
    std::copy(ut, ut + (count - i), u + i);
  }
}
}  // namespace

void silu_mul(const float* g, float* u, int64_t count, bool parallel) {
  constexpr int64_t CHUNK = 1 << 14;  // entries a unit, a whole number of packets
  const int64_t chunks = (count + CHUNK - 1) / CHUNK;
  if (!parallel || !parallel_worth(16.0 * count)) {  // serial: no OpenMP region to enter
    for (int64_t c = 0; c < chunks; ++c) silu_mul_run(g + c * CHUNK, u + c * CHUNK, std::min(CHUNK, count - c * CHUNK));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) silu_mul_run(g + c * CHUNK, u + c * CHUNK, std::min(CHUNK, count - c * CHUNK));
}

void rotate_half(const float* x, int64_t rows, int64_t heads, int64_t d, const float* cos, const float* sin,
                 bool interleaved, float* y) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t head = 0; head < heads; ++head)
      rotate_row(x + (r * heads + head) * d, d, cos + r * d, sin + r * d, interleaved, y + (r * heads + head) * d);
}

void finish_heads(const float* x, int64_t rows, int64_t heads, int64_t d, const float* w, float eps,
                  const float* cos, const float* sin, bool interleaved, bool round, float* out, int64_t head_stride,
                  bool parallel) {
  FirstException errors;
#pragma omp parallel if (parallel && parallel_worth(4.0 * rows * heads * d))
  {
    std::vector<float> normed;
    errors.run([&] { normed.resize(static_cast<size_t>(d)); });
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      errors.run([&] {
        for (int64_t head = 0; head < heads; ++head) {
          const float* v = x + (r * heads + head) * d;
          float* o = out + head * head_stride + r * d;
          if (w) {
            rms_row(v, d, w, eps, normed.data());
            v = normed.data();
          }
          if (cos) {
            rotate_row(v, d, cos + r * d, sin + r * d, interleaved, o);
          } else {
            std::copy_n(v, d, o);
          }
          if (round) round_to_bf16_values(o, d);
        }
      });
  }
  errors.rethrow();
}

}  // namespace attngeom
