// Fused token-wise steps of the bfloat16 mode (token_ops.hpp), with Eigen's vector exp.
#include "attngeom/token_ops.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

namespace attngeom {

void rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* y) {
  using Row = Eigen::Array<float, 1, Eigen::Dynamic>;
  const Eigen::Map<const Row> gain(w, d);
  for (int64_t r = 0; r < rows; ++r) {
    const Eigen::Map<const Row> xr(x + r * d, d);
    const float mean_square = xr.square().sum() / static_cast<float>(d);
    const float inv = 1.0f / std::sqrt(mean_square + eps);
    Eigen::Map<Row>(y + r * d, d) = gain * (xr * inv);
  }
}

void silu_mul(const float* g, float* u, int64_t count) {
  // Packets by hand: Eigen's expression over an unaligned Map peels the entries before the
  // first aligned address off to scalar code (libm's exp), so their bits followed the address.
  using namespace Eigen::internal;
  using Packet = packet_traits<float>::type;
  constexpr int64_t W = unpacket_traits<Packet>::size;
  const Packet one = pset1<Packet>(1.0f);
  const auto gated = [&](const Packet& gp, const Packet& up) { return pmul(pdiv(gp, padd(one, pexp(pnegate(gp)))), up); };
  int64_t i = 0;
  for (; i + W <= count; i += W) pstoreu(u + i, gated(ploadu<Packet>(g + i), ploadu<Packet>(u + i)));
  if (i < count) {  // the last entries in a packet padded with zeros
    float gt[W] = {}, ut[W] = {};
    std::copy(g + i, g + count, gt);
    std::copy(u + i, u + count, ut);
    pstoreu(ut, gated(ploadu<Packet>(gt), ploadu<Packet>(ut)));
    std::copy(ut, ut + (count - i), u + i);
  }
}

void rotate_half(const float* x, int64_t rows, int64_t heads, int64_t d, const float* cos, const float* sin,
                 bool interleaved, float* y) {
  const int64_t h = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * d;
    const float* s = sin + r * d;
    for (int64_t head = 0; head < heads; ++head) {
      const float* xv = x + (r * heads + head) * d;
      float* yv = y + (r * heads + head) * d;
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
  }
}

}  // namespace attngeom
