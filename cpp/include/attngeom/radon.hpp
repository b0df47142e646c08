// The 2D Radon transform of images and its inverses, in scikit-image's geometry so results
// can be compared directly (Laplace-Radon s.9: the inverse Radon step of the pipeline).
//
// Geometry: a square image of size n (row-major, rows = y, columns = x) with rotation
// centre c = n // 2. The projection at angle theta (radians) and detector position p sums
// the bilinearly interpolated image (zero outside) along the line
//   x = c + cos(theta) (p - c) + sin(theta) (r - c),  y = c - sin(theta) (p - c) + cos(theta) (r - c),
// for r = 0..n-1: this is scikit-image's radon (rotate by warp, then sum the rows).
// radon_forward: OpenMP over angles. radon_adjoint: the exact transpose (bilinear splatting).
// backproject: the filtered-backprojection sum of scikit-image's iradon (linear
// interpolation of each filtered projection, zero outside), OpenMP over image rows.
// sart: Andersen-Kak SART with the same projector, one angle at a time in the given order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attngeom/parallel.hpp"

namespace attngeom {

namespace detail {

// Calls f(flat pixel index, weight) for the bilinear footprint of (x, y) inside an n x n image.
template <class F>
inline void bilinear_footprint(int64_t n, double x, double y, F&& f) {
  const double fx = std::floor(x), fy = std::floor(y);
  const int64_t x0 = static_cast<int64_t>(fx), y0 = static_cast<int64_t>(fy);
  const double ax = x - fx, ay = y - fy;
  if (x0 >= -1 && x0 < n && y0 >= -1 && y0 < n) {
    const bool xa = x0 >= 0, xb = x0 + 1 < n, ya = y0 >= 0, yb = y0 + 1 < n;
    if (ya && xa) f(y0 * n + x0, (1 - ay) * (1 - ax));
    if (ya && xb) f(y0 * n + x0 + 1, (1 - ay) * ax);
    if (yb && xa) f((y0 + 1) * n + x0, ay * (1 - ax));
    if (yb && xb) f((y0 + 1) * n + x0 + 1, ay * ax);
  }
}

// Sum of the image along the ray (angle cos/sin, detector p).
template <class T>
inline double ray_sum(int64_t n, const T* image, double cs, double sn, double center, int64_t p) {
  double acc = 0;
  const double dp = p - center;
  for (int64_t r = 0; r < n; ++r) {
    const double dr = r - center;
    bilinear_footprint(n, center + cs * dp + sn * dr, center - sn * dp + cs * dr,
                       [&](int64_t i, double w) { acc += w * image[i]; });
  }
  return acc;
}

// Splats every detector of one angle: rays three apart never share a pixel (a footprint is
// within sqrt(2) of its ray), so each residue class mod 3 runs in parallel, deterministically.
// `visit(p, pixel, weight)` is called for every footprint entry of ray p.
template <class Visit>
inline void splat_angle(int64_t n, double cs, double sn, double center, Visit&& visit) {
  const bool par = parallel_worth(4.0 * n * n);
  for (int64_t phase = 0; phase < 3; ++phase) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t p = phase; p < n; p += 3) {
      const double dp = p - center;
      for (int64_t r = 0; r < n; ++r) {
        const double dr = r - center;
        bilinear_footprint(n, center + cs * dp + sn * dr, center - sn * dp + cs * dr,
                           [&](int64_t i, double w) { visit(p, i, w); });
      }
    }
  }
}

}  // namespace detail

// image (n, n) -> sinogram (n, A) row-major (detector, angle).
template <class T>
void radon_forward(int64_t n, const T* image, int64_t A, const double* theta, T* sino) {
  const double center = static_cast<double>(n / 2);
#pragma omp parallel for schedule(dynamic)
  for (int64_t a = 0; a < A; ++a) {
    const double cs = std::cos(theta[a]), sn = std::sin(theta[a]);
    for (int64_t p = 0; p < n; ++p) sino[p * A + a] = static_cast<T>(detail::ray_sum(n, image, cs, sn, center, p));
  }
}

// sinogram (n, A) -> image (n, n): the transpose of radon_forward.
template <class T>
void radon_adjoint(int64_t n, const T* sino, int64_t A, const double* theta, T* image) {
  const double center = static_cast<double>(n / 2);
  std::fill(image, image + n * n, T(0));
  for (int64_t a = 0; a < A; ++a) {
    const double cs = std::cos(theta[a]), sn = std::sin(theta[a]);
    detail::splat_angle(n, cs, sn, center, [&](int64_t p, int64_t i, double w) {
      image[i] += static_cast<T>(w * static_cast<double>(sino[p * A + a]));
    });
  }
}

// filtered (P, A) -> image (out, out): sum over angles of the filtered projection at
// t = (j - R) cos(theta) - (i - R) sin(theta), R = out // 2, detector grid p - P // 2,
// linear interpolation, zero outside the grid; pixels outside the circle of radius R are
// zeroed when `circle`. No final scaling (the caller multiplies by pi / (2 A)).
template <class T>
void backproject(int64_t P, int64_t A, const T* filtered, const double* theta, int64_t out, bool circle, T* image) {
  const double R = static_cast<double>(out / 2), half = static_cast<double>(P / 2);
  std::vector<double> cs(A), sn(A);
  for (int64_t a = 0; a < A; ++a) {
    cs[a] = std::cos(theta[a]);
    sn[a] = std::sin(theta[a]);
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < out; ++i) {
    const double xi = i - R;
    for (int64_t j = 0; j < out; ++j) {
      const double yj = j - R;
      if (circle && xi * xi + yj * yj > R * R) {
        image[i * out + j] = T(0);
        continue;
      }
      double acc = 0;
      for (int64_t a = 0; a < A; ++a) {
        const double t = yj * cs[a] - xi * sn[a] + half;  // position on the detector grid
        if (t < 0 || t > P - 1) continue;
        const int64_t k = std::min<int64_t>(static_cast<int64_t>(t), P - 2);
        const double w = t - k;
        acc += (1 - w) * filtered[k * A + a] + w * filtered[(k + 1) * A + a];
      }
      image[i * out + j] = static_cast<T>(acc);
    }
  }
}

// SART (Andersen-Kak): for each angle in `order`, with a the projector of that angle
// restricted to the pixels where mask != 0,
//   x <- x + relaxation * a^T ((b - a x) / a 1) / (a^T 1),
// the ray lengths a 1 and the pixel weights a^T 1 being taken over rays of non-zero length.
// `iterations` sweeps; optional clipping of the whole image to [lo, hi] after each angle.
// The image must be zero outside the mask on entry (it stays so unless clipping moves it).
template <class T>
void sart(int64_t n, const T* sino, int64_t A, const double* theta, const int64_t* order, const T* mask,
          int64_t iterations, double relaxation, bool clip, double lo, double hi, T* image) {
  const double center = static_cast<double>(n / 2);
  std::vector<T> lengths(n * A);
  radon_forward<T>(n, mask, A, theta, lengths.data());  // ray lengths through the mask, once
  std::vector<double> num(n * n), den(n * n), resid(n);
  const bool par = parallel_worth(4.0 * n * n);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int64_t o = 0; o < A; ++o) {
      const int64_t a = order[o];
      const double cs = std::cos(theta[a]), sn = std::sin(theta[a]);
#pragma omp parallel for schedule(static) if (par)
      for (int64_t p = 0; p < n; ++p) {
        const double len = lengths[p * A + a];
        resid[p] = len > 1e-8 ? (sino[p * A + a] - detail::ray_sum(n, image, cs, sn, center, p)) / len : 0.0;
      }
      std::fill(num.begin(), num.end(), 0.0);
      std::fill(den.begin(), den.end(), 0.0);
      detail::splat_angle(n, cs, sn, center, [&](int64_t p, int64_t i, double w) {
        if (lengths[p * A + a] > 1e-8) {
          num[i] += w * resid[p];
          den[i] += w;
        }
      });
#pragma omp parallel for schedule(static) if (par)
      for (int64_t i = 0; i < n * n; ++i) {
        T v = image[i];
        if (mask[i] != 0 && den[i] > 1e-8) v += static_cast<T>(relaxation * num[i] / den[i]);
        if (clip) v = std::min(std::max(v, static_cast<T>(lo)), static_cast<T>(hi));  // every pixel, as skimage
        image[i] = v;
      }
    }
  }
}

}  // namespace attngeom
