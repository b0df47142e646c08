// Backward pass of the attention kernels of attention.hpp: softmax attention and ridge
// (kernel-swapped) attention, flash-style (FlashAttention-2 backward, Dao 2023, alg. 2).
//
// With log-weights l_ij (scale q_i.k_j, or log psi(tau_i, s_ij) with s_ij = u_i.k_j, plus an
// additive mask), P_ij = exp(l_ij - log Z_i) and y_i = sum_j P_ij v_j, the cotangent dy gives
//
//     dv_j = sum_i P_ij dy_i,   dP_ij = dy_i . v_j,   D_i = dy_i . y_i = sum_j P_ij dP_ij,
//     dl_ij = P_ij (dP_ij - D_i),
//
// and dl flows into q (or u and tau) and k through the kernel's derivative. P is recomputed
// block by block from the saved log Z: no n_q x n_k buffer.
//
// Parallel layout: one OpenMP loop over (batch x key block). A unit owns its keys, so dk and
// dv are written, never accumulated across threads; the dq (and dtau) contributions of a key
// block go to a per-key-block partial buffer that a second loop sums in key-block order. The
// arithmetic of every unit and the order of every sum are fixed, so results do not depend on
// the thread count (bitwise).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "attngeom/attention.hpp"
#include "attngeom/kernels.hpp"
#include "attngeom/parallel.hpp"
#include "attngeom/tiles.hpp"
#include "attngeom/types.hpp"

namespace attngeom {

template <class T>
struct AttentionGradients {
  T* dq = nullptr;        // (batch, n_q, d_k): cotangent of q (or of the tilt u), required
  T* dk = nullptr;        // (batch, n_k, d_k), required
  T* dv = nullptr;        // (batch, n_k, d_v), required
  T* dtau = nullptr;      // (batch, n_q): cotangent of the radius (ridge kernels), optional
  T* dkey_bias = nullptr; // (batch, n_k): cotangent of an additive bias constant along queries, optional
};

namespace detail {

// d log psi / ds and d log psi / dtau for each kernel. `R` holds the raw projected
// coordinates s of the block, `G` enters as dl and leaves as ds; dtau_rows[r] receives
// sum_j dl_rj d(log psi)/dtau.
template <class T, class R, class G>
void log_psi_grad(const DotScores<T>&, const R&, G&&, const T*, T*) {}  // l = s

template <class T, class R, class G>
void log_psi_grad(const ExpKernel<T>&, const R& S, G&& dL, const T* tau, T* dtau) {
  // l = tau s
  for (Eigen::Index r = 0; r < dL.rows(); ++r) {
    dtau[r] += (dL.row(r).array() * S.row(r).array()).sum();
    dL.row(r) *= tau[r];
  }
}

template <class T, class R, class G>
void log_psi_grad(const GaussianKernel<T>& psi, const R& S, G&& dL, const T* tau, T* dtau) {
  // l = -(s - tau)^2 / (2 sigma^2): dl/ds = -(s - tau) / sigma^2 = -dl/dtau
  for (Eigen::Index r = 0; r < dL.rows(); ++r) {
    dL.row(r).array() *= ((S.row(r).array() - tau[r]) * psi.inv_sigma) * (-psi.inv_sigma);
    dtau[r] -= dL.row(r).sum();
  }
}

template <class T, class R, class G>
void log_psi_grad(const CauchyKernel<T>& psi, const R& S, G&& dL, const T* tau, T* dtau) {
  // l = -log(1 + z^2), z = (s - tau) / gamma: dl/ds = -2 z / (gamma (1 + z^2)) = -dl/dtau
  for (Eigen::Index r = 0; r < dL.rows(); ++r) {
    const auto z = (S.row(r).array() - tau[r]) * psi.inv_gamma;
    dL.row(r).array() *= (T(-2) * psi.inv_gamma) * z / (T(1) + z.square());
    dtau[r] -= dL.row(r).sum();
  }
}

template <class T, class R, class G>
void log_psi_grad(const StableKernel<T>& psi, const R& S, G&& dL, const T* tau, T* dtau) {
  // l = log f(tau - s): dl/ds = -(log f)'(tau - s) = -dl/dtau, from the same table as f.
  for (Eigen::Index r = 0; r < dL.rows(); ++r) {
    T acc = 0;
    for (Eigen::Index j = 0; j < dL.cols(); ++j) {
      const T g = dL(r, j) * T(psi.density->d_log_density(double(tau[r]) - double(S(r, j))));
      acc += g;
      dL(r, j) = -g;
    }
    dtau[r] += acc;
  }
}

// The backward driver. `y`, `log_z` are the forward's outputs, `dy` the output cotangent, all
// indexed by the flat batch. dq (and dtau) are cotangents of the query operand as the kernel
// sees it (before `query_scale`).
template <class T, class Kernel>
void attend_backward(int64_t batch, const Stack<T>& q, const T* tau, const int64_t* tau_index, const Stack<T>& k,
                     const Stack<T>& v, const Mask<T>& mask, Causal causal, T query_scale, const Kernel& kernel,
                     const T* y, const T* log_z, const T* dy, const AttentionGradients<T>& grad, Blocking blocking) {
  using Mat = RowMatrix<T>;
  using CMap = Eigen::Map<const Mat>;
  using Map = Eigen::Map<Mat>;
  using Vec = Eigen::Array<T, Eigen::Dynamic, 1>;
  const int64_t n_q = q.rows, d_k = q.cols, n_k = k.rows, d_v = v.cols;
  blocking = tiled(blocking, causal, n_k, [&](int64_t, int64_t bk_) { return batch * ((n_k + bk_ - 1) / bk_); });
  const int64_t bq = blocking.query, bk = blocking.key;
  const int64_t q_blocks = (n_q + bq - 1) / bq, k_blocks = (n_k + bk - 1) / bk;
  const Visibility vis(causal, n_q, n_k);
  const bool ridge = tau != nullptr;
  const double work = double(batch) * n_q * n_k * (2 * d_k + 2 * d_v);
  const bool par = parallel_worth(work);
  check_range(batch, q, tau, tau_index, k, query_scale, kernel);

  // D_i = dy_i . y_i
  std::vector<T> Drow(size_t(batch * n_q));
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < batch; ++b) {
    const CMap Y(y + b * n_q * d_v, n_q, d_v), dY(dy + b * n_q * d_v, n_q, d_v);
    Eigen::Map<Vec>(Drow.data() + b * n_q, n_q) = (Y.array() * dY.array()).rowwise().sum();
  }
  // Per key block contributions to dq (and dtau); a single key block writes dq directly. A
  // key block's unit writes every row of the query blocks it visits, from the block holding
  // its first visible row (`first_block`) on; the sum below reads only those, so the partial
  // buffers need no zeroing. dtau is accumulated into, so it is zeroed.
  const bool direct = k_blocks == 1;
  std::unique_ptr<T[]> dq_part(direct ? nullptr : new T[size_t(batch * k_blocks * n_q * d_k)]);
  std::vector<T> dtau_part(ridge ? size_t(batch * k_blocks * n_q) : 0, T(0));
  if (direct) std::fill(grad.dq, grad.dq + batch * n_q * d_k, T(0));
  auto first_block = [&](int64_t j0) {
    return (vis.first_query(j0) / bq) * bq;
  };

#pragma omp parallel if (par)
  {
    // S holds whole score tiles (ld columns); Kt the key block packed for them (tiles.hpp).
    const int64_t ld = Tile<T>::padded(bk);
    Mat Qs(bq, d_k), S(bq, ld), Raw(ridge ? bq : 0, ridge ? bk : 0), dP(bq, bk), dK(bk, d_k), dV(bk, d_v);
    Vec colsum(bk), Kt(ld * d_k);
#pragma omp for schedule(dynamic)
    for (int64_t unit = 0; unit < batch * k_blocks; ++unit) {
      const int64_t b = unit / k_blocks, jb = unit % k_blocks;
      const int64_t j0 = jb * bk, cols = std::min(bk, n_k - j0);
      const CMap K(k.block(b) + j0 * d_k, cols, d_k), V(v.block(b) + j0 * d_v, cols, d_v);
      auto dKa = dK.topRows(cols);
      auto dVa = dV.topRows(cols);
      dKa.setZero();
      dVa.setZero();
      colsum.head(cols).setZero();
      T* dq_out = direct ? grad.dq + b * n_q * d_k : dq_part.get() + (b * k_blocks + jb) * n_q * d_k;
      T* dtau_out = ridge ? dtau_part.data() + (b * k_blocks + jb) * n_q : nullptr;
      pack_keys(K.data(), d_k, cols, Kt.data());
      for (int64_t i0 = first_block(j0); i0 < n_q; i0 += bq) {
        const int64_t rows = std::min(bq, n_q - i0);
        const T* tau_rows = ridge ? tau + (tau_index ? tau_index[b] : b) * n_q + i0 : nullptr;
        const T* lz = log_z + b * n_q + i0;
        const T* Di = Drow.data() + b * n_q + i0;
        auto Q = Qs.topRows(rows);
        Q.noalias() = CMap(q.block(b) + i0 * d_k, rows, d_k) * query_scale;
        // The forward's score tiles: every logit is bitwise the forward's, so P = exp(l - log Z)
        // is normalised however large the logits (an ulp of l is then far above 1).
        for (int64_t p0 = 0; p0 < rows; p0 += Tile<T>::MR) {
          with_rows<T>(int(std::min<int64_t>(Tile<T>::MR, rows - p0)), [&](auto R) {
            score_tile<T, R()>(Qs.data() + p0 * d_k, d_k, d_k, Kt.data(), Tile<T>::padded(cols), S.data() + p0 * ld,
                               ld);
          });
        }
        auto L = S.topLeftCorner(rows, cols);
        if (ridge) Raw.topLeftCorner(rows, cols) = L;
        kernel.log_psi(S.topLeftCorner(rows, Tile<T>::padded(cols)), tau_rows);  // whole packets, as forward
        hide(L, mask, vis, b, i0, j0);
        // P = exp(l - log Z), flushed below min/epsilon as the forward does, so hidden (-inf)
        // entries are exactly zero; rows with no visible key (log Z = -inf) are shifted by
        // +inf and become zero.
        for (int64_t r = 0; r < rows; ++r)
          exp_shift_row(S.data() + r * S.cols(), cols, std::isfinite(lz[r]) ? lz[r] : std::numeric_limits<T>::infinity());
        const CMap dY(dy + (b * n_q + i0) * d_v, rows, d_v);
        dVa.noalias() += L.transpose() * dY;
        auto dPa = dP.topLeftCorner(rows, cols);
        dPa.noalias() = dY * V.transpose();
        for (int64_t r = 0; r < rows; ++r) dPa.row(r).array() = L.row(r).array() * (dPa.row(r).array() - Di[r]);
        if (grad.dkey_bias) colsum.head(cols) += dPa.colwise().sum().transpose().array();
        if (ridge) {
          T* dt = dtau_out + i0;
          log_psi_grad(kernel, Raw.topLeftCorner(rows, cols), dPa, tau_rows, dt);
        } else {
          log_psi_grad(kernel, L, dPa, tau_rows, static_cast<T*>(nullptr));
        }
        dKa.noalias() += dPa.transpose() * Q;
        Map(dq_out + i0 * d_k, rows, d_k).noalias() = dPa * K;
      }
      Map(grad.dk + (b * n_k + j0) * d_k, cols, d_k) = dKa;
      Map(grad.dv + (b * n_k + j0) * d_v, cols, d_v) = dVa;
      if (grad.dkey_bias)
        Eigen::Map<Vec>(grad.dkey_bias + b * n_k + j0, cols) = colsum.head(cols);
    }
  }

  // dq = query_scale * sum over key blocks (in order) of the partials; dtau likewise.
#pragma omp parallel for schedule(static) if (par)
  for (int64_t unit = 0; unit < batch * q_blocks; ++unit) {
    const int64_t b = unit / q_blocks, i0 = (unit % q_blocks) * bq, rows = std::min(bq, n_q - i0);
    Map dQ(grad.dq + (b * n_q + i0) * d_k, rows, d_k);
    if (!direct) {
      // Key blocks in order; those whose first visited query block lies past this one (under
      // the causal limit) contribute nothing and are skipped.
      dQ.setZero();
      for (int64_t jb = 0; jb < k_blocks && first_block(jb * bk) <= i0; ++jb)
        dQ += CMap(dq_part.get() + (b * k_blocks + jb) * n_q * d_k + i0 * d_k, rows, d_k);
    }
    if (query_scale != T(1)) dQ *= query_scale;
    if (ridge && grad.dtau) {
      for (int64_t r = 0; r < rows; ++r) {
        T s = 0;
        for (int64_t jb = 0; jb < k_blocks; ++jb) s += dtau_part[(b * k_blocks + jb) * n_q + i0 + r];
        grad.dtau[b * n_q + i0 + r] = s;
      }
    }
  }
}

}  // namespace detail

// Cotangents of softmax attention y = softmax(scale q k^T + mask) v: dq, dk, dv (and the
// cotangent of a query-constant additive key bias when grad.dkey_bias is set).
template <class T>
void softmax_attention_backward(int64_t batch, const Stack<T>& q, const Stack<T>& k, const Stack<T>& v,
                                const Mask<T>& mask, Causal causal, T scale, const T* y, const T* log_z, const T* dy,
                                const AttentionGradients<T>& grad, Blocking blocking = {}) {
  detail::attend_backward(batch, q, static_cast<const T*>(nullptr), nullptr, k, v, mask, causal, scale,
                          detail::DotScores<T>{}, y, log_z, dy, grad, blocking);
}

// Cotangents of ridge attention with tilt u and radius tau: du (in grad.dq), dtau, dk, dv.
template <class T, class Kernel>
void ridge_attention_backward(int64_t batch, const Stack<T>& u, const T* tau, const int64_t* tau_index,
                              const Stack<T>& k, const Stack<T>& v, const Mask<T>& mask, Causal causal,
                              const Kernel& kernel, const T* y, const T* log_z, const T* dy,
                              const AttentionGradients<T>& grad, Blocking blocking = {}) {
  detail::attend_backward(batch, u, tau, tau_index, k, v, mask, causal, T(1), kernel, y, log_z, dy, grad, blocking);
}

}  // namespace attngeom
