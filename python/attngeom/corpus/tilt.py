"""Tilt coverage per head over a corpus (Laplace-Radon s.6.2, eq. 20-23): a grid of
:class:`attngeom.TiltCoverage`, which already is a mergeable statistic (its triangular factor
merges exactly), and the token covariance of the numerator directions n = W_K u (eq. 22).
"""
from __future__ import annotations

import numpy as np

from ..spectral import TiltCoverage
from .protocol import Statistic


class TiltStatistic(Statistic):
    """The tilts u = q / ``|q|`` of every head: E[u u^T] spectra, effective dimension, rank, and
    with W_K the spectrum of Cov(n), n = W_K u (the token-space normals of eq. 22).

    Tilts are of the queries as the attention uses them (after the rotary embedding of
    Llama-family models); the token-space part needs a model without rotary embedding,
    where n = W_K u is the token-space direction the query measures along.
    """

    name = "tilt"
    fields = ("q",)

    def _new(self, batch) -> dict:
        L, _, H, _, d = batch.forward.q.shape
        grid = np.empty((L, H), dtype=object)
        for idx in np.ndindex(L, H):
            grid[idx] = TiltCoverage(d)
        return {"coverage": grid}

    def _update(self, batch) -> None:
        q = batch.head_tokens(batch.forward.q)
        for idx, acc in np.ndenumerate(self.state["coverage"]):
            acc.update(q[idx])

    def result(self, *, W_K=None) -> dict:
        """effective_dim, rank, eigenvalues (n_layers, n_heads[, d_head]); with W_K
        (n_layers, n_heads, d_model, d_head) also token_effective_dim and token_eigenvalues
        (eigenvalues of Cov(W_K u), the numerator directions' token covariance)."""
        self._require()
        grid = self.state["coverage"]
        L, H = grid.shape
        d = grid[0, 0].dim
        out = {"count": np.zeros((L, H), np.int64), "effective_dim": np.zeros((L, H)),
               "rank": np.zeros((L, H), np.int64), "eigenvalues": np.zeros((L, H, d))}
        if W_K is not None:
            out["token_effective_dim"] = np.zeros((L, H))
            out["token_eigenvalues"] = np.zeros((L, H, min(d, W_K.shape[-2])))
        for idx, acc in np.ndenumerate(grid):
            if acc.count == 0:
                continue
            r = acc.result()
            out["count"][idx], out["effective_dim"][idx] = r.count, r.effective_dim
            out["rank"][idx], out["eigenvalues"][idx] = r.rank, r.eigenvalues
            if W_K is not None:
                t = acc.result(W_K=W_K[idx], centered=True)
                out["token_effective_dim"][idx] = t.effective_dim_token
                out["token_eigenvalues"][idx] = t.token_eigenvalues
        return out
