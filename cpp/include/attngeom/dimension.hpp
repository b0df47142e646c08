// Deep self-attention networks in the weights W = (Q_i, K_i, V_i) of Henry-Marchetti-Kohn
// (Definitions 1-2, eq. 16) and the exact Jacobian of W -> phi_W(X) on sample inputs,
// computed in forward mode: one tangent pass per parameter, OpenMP over samples.
//
// Tokens are rows here: a sample x is (t, d_0) (the paper's X^T). Layer i has
// Q_i, K_i (a_i, d_{i-1}) and V_i (d_i, d_{i-1}); with q = x Q^T, k = x K^T, v = x V^T,
//   lightning (eq. 1):  y = (q k^T) v            weight of token j for i: (Q x_i).(K x_j)
//   softmax  (eq. 16):  y = softmax_rows(k q^T / T) v   weight exp(x_i^T K^T Q x_j / T).
// Parameters are flattened layer by layer, each layer as Q, K, V in row-major order.
// The forward pass here is only the base point of the tangents: the network's own forward
// pass is the attention kernels' (Python's deep_lightning), one path for both kinds.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "attngeom/parallel.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

struct NetworkShape {
  std::vector<int64_t> d;  // d_0 .. d_l
  std::vector<int64_t> a;  // a_1 .. a_l
  int64_t layers() const { return static_cast<int64_t>(a.size()); }
  // Offset of layer i's parameters (Q, K, V) in the flat vector, and the total count.
  int64_t offset(int64_t i) const {
    int64_t o = 0;
    for (int64_t j = 0; j < i; ++j) o += 2 * a[j] * d[j] + d[j + 1] * d[j];
    return o;
  }
  int64_t parameters() const { return offset(layers()); }
  void check() const {
    if (a.empty() || d.size() != a.size() + 1) throw std::invalid_argument("need len(d) == len(a) + 1 >= 2");
  }
};

namespace detail {

template <class T>
struct LayerView {
  Eigen::Map<const RowMatrix<T>> Q, K, V;
};

template <class T>
LayerView<T> layer_view(const NetworkShape& s, const T* params, int64_t i) {
  const T* p = params + s.offset(i);
  const int64_t a = s.a[i], din = s.d[i], dout = s.d[i + 1];
  return {Eigen::Map<const RowMatrix<T>>(p, a, din), Eigen::Map<const RowMatrix<T>>(p + a * din, a, din),
          Eigen::Map<const RowMatrix<T>>(p + 2 * a * din, dout, din)};
}

// What one layer's forward pass keeps for its tangents.
template <class T>
struct LayerCache {
  RowMatrix<T> x, q, k, v, S;  // S: scores q k^T (lightning) or the softmax matrix P
};

template <class T>
void layer_forward(const LayerView<T>& W, const RowMatrix<T>& x, bool softmax, T temperature, LayerCache<T>& c,
                   RowMatrix<T>& y) {
  c.x = x;
  c.q.noalias() = x * W.Q.transpose();
  c.k.noalias() = x * W.K.transpose();
  c.v.noalias() = x * W.V.transpose();
  if (softmax) {
    RowMatrix<T> L = (c.k * c.q.transpose()) / temperature;
    for (Eigen::Index r = 0; r < L.rows(); ++r) {
      auto row = L.row(r).array();
      row = (row - row.maxCoeff()).exp();
      row /= row.sum();
    }
    c.S = std::move(L);
  } else {
    c.S.noalias() = c.q * c.k.transpose();
  }
  y.noalias() = c.S * c.v;
}

// Tangent of one layer's output for an input tangent dx (null: zero) and weight tangents
// dQ, dK, dV (null: zero).
template <class T>
void layer_tangent(const LayerView<T>& W, const LayerCache<T>& c, bool softmax, T temperature, const RowMatrix<T>* dx,
                   const RowMatrix<T>* dQ, const RowMatrix<T>* dK, const RowMatrix<T>* dV, RowMatrix<T>& dy) {
  const int64_t t = c.x.rows();
  RowMatrix<T> dq = RowMatrix<T>::Zero(t, c.q.cols()), dk = RowMatrix<T>::Zero(t, c.k.cols()),
               dv = RowMatrix<T>::Zero(t, c.v.cols());
  if (dx) {
    dq.noalias() += *dx * W.Q.transpose();
    dk.noalias() += *dx * W.K.transpose();
    dv.noalias() += *dx * W.V.transpose();
  }
  if (dQ) dq.noalias() += c.x * dQ->transpose();
  if (dK) dk.noalias() += c.x * dK->transpose();
  if (dV) dv.noalias() += c.x * dV->transpose();
  RowMatrix<T> dS;
  if (softmax) {
    RowMatrix<T> dL = (dk * c.q.transpose() + c.k * dq.transpose()) / temperature;
    dS = c.S.cwiseProduct(dL);
    const Eigen::Matrix<T, Eigen::Dynamic, 1> mean = dS.rowwise().sum();
    dS -= c.S.cwiseProduct(mean.replicate(1, t));
  } else {
    dS.noalias() = dq * c.k.transpose() + c.q * dk.transpose();
  }
  dy.noalias() = dS * c.v + c.S * dv;
}

}  // namespace detail

// The Jacobian d phi_W(x) / dW for n samples: jac (n, t, d_l, P), P = s.parameters().
template <class T>
void network_jacobian(const NetworkShape& s, const T* params, int64_t n, int64_t t, const T* x, bool softmax,
                      T temperature, T* jac) {
  s.check();
  const int64_t l = s.layers(), d0 = s.d[0], dl = s.d[l], P = s.parameters();
  FirstException errors;  // each sample holds t x t matrices: a failed allocation must reach Python
#pragma omp parallel for schedule(dynamic)
  for (int64_t m = 0; m < n; ++m) errors.run([&] {
    std::vector<detail::LayerCache<T>> caches(l);
    RowMatrix<T> cur = Eigen::Map<const RowMatrix<T>>(x + m * t * d0, t, d0), next;
    for (int64_t i = 0; i < l; ++i) {
      detail::layer_forward(detail::layer_view(s, params, i), cur, softmax, temperature, caches[i], next);
      cur.swap(next);
    }
    Eigen::Map<RowMatrix<T>> J(jac + m * t * dl * P, t * dl, P);
    RowMatrix<T> dy, dnext;
    for (int64_t i = 0; i < l; ++i) {
      const auto W = detail::layer_view(s, params, i);
      const int64_t a = s.a[i], din = s.d[i], dout = s.d[i + 1], base = s.offset(i);
      RowMatrix<T> dQ = RowMatrix<T>::Zero(a, din), dK = dQ, dV = RowMatrix<T>::Zero(dout, din);
      const int64_t sizes[3] = {a * din, a * din, dout * din};
      RowMatrix<T>* slots[3] = {&dQ, &dK, &dV};
      int64_t col = base;
      for (int which = 0; which < 3; ++which) {
        RowMatrix<T>& D = *slots[which];
        for (int64_t e = 0; e < sizes[which]; ++e, ++col) {
          D.data()[e] = T(1);
          detail::layer_tangent<T>(W, caches[i], softmax, temperature, nullptr, which == 0 ? &dQ : nullptr,
                                which == 1 ? &dK : nullptr, which == 2 ? &dV : nullptr, dy);
          D.data()[e] = T(0);
          for (int64_t j = i + 1; j < l; ++j) {
            detail::layer_tangent<T>(detail::layer_view(s, params, j), caches[j], softmax, temperature, &dy, nullptr,
                                  nullptr, nullptr, dnext);
            dy.swap(dnext);
          }
          J.col(col) = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(dy.data(), t * dl);
        }
      }
    }
  });
  errors.rethrow();
}

}  // namespace attngeom
