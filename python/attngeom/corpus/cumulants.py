"""Laplace-Radon cumulants per head over a corpus (eq. 45, 51): for every query j, the mean
kappa_1 and variance kappa_2 of the projected keys S = u_j . k_i under the head's own Gibbs
weights p_ji (its attention row; causal models see keys i <= j), then their corpus means and
standard deviations per head.
"""
from __future__ import annotations

import numpy as np

from .moments import Moments
from .protocol import Statistic


class CumulantStatistic(Statistic):
    """kappa_1 = E_p[u.k] and kappa_2 = Var_p(u.k) of every query row of every head.

    The weights are the attention rows the model computes, so this equals
    :func:`attngeom.projected_cumulants` (exponential kernel, tau = scale ``|q|``) on the keys
    each query sees.
    """

    name = "cumulants"
    fields = ("q", "k", "pattern")

    def _new(self, batch) -> dict:
        L, _, H = batch.forward.q.shape[:3]
        return {"kappa": Moments((L, H), 2, full=False)}

    def _update(self, batch) -> None:
        f = batch.forward
        q, k = np.asarray(f.q, np.float64), np.asarray(f.k, np.float64)
        norm = np.linalg.norm(q, axis=-1, keepdims=True)
        u = np.divide(q, norm, out=np.zeros_like(q), where=norm > 0)
        s = u @ np.swapaxes(k, -1, -2)  # (L, b, H, n, n) projected keys
        P = np.asarray(f.pattern, np.float64)
        k1 = np.sum(P * s, axis=-1)
        k2 = np.sum(P * (s - k1[..., None]) ** 2, axis=-1)
        kappa = np.stack([batch.head_tokens(k1), batch.head_tokens(k2)], axis=-1)  # (L, H, N, 2)
        self.state["kappa"].update(kappa)

    def result(self) -> dict:
        """kappa1_mean, kappa1_std, kappa2_mean, kappa2_std (n_layers, n_heads) and count."""
        self._require()
        m = self.state["kappa"]
        std = np.sqrt(m.variance())
        return {"count": m.count, "kappa1_mean": m.mean[..., 0], "kappa1_std": std[..., 0],
                "kappa2_mean": m.mean[..., 1], "kappa2_std": std[..., 1]}
