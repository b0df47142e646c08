"""Radius statistics per head: moments and a fixed-edge histogram of tau = scale ``|q|``, with
the chi prediction of Laplace-Radon s.13.4 (eq. 62).

If a head's queries were Gaussian with per-coordinate variance sigma^2, tau / (scale sigma)
would follow a chi distribution with d_head degrees of freedom; sigma^2 is fitted from the
corpus as E[tau^2] / (scale^2 d_head), and the predicted mean and standard deviation of tau
are reported beside the measured ones.
"""
from __future__ import annotations

import math

import numpy as np

from .histogram import Histogram
from .moments import Moments
from .protocol import Statistic

DEFAULT_RADIUS_EDGES = np.linspace(0.0, 16.0, 129)


def chi_moments(dof: int) -> tuple:
    """Mean and standard deviation of the chi distribution with ``dof`` degrees of freedom.

    Parameters
    ----------
    dof : int
        Degrees of freedom (>= 1).

    Returns
    -------
    mean, std : float
        sqrt(2) Gamma((k+1)/2) / Gamma(k/2) and sqrt(k - mean^2).

    Examples
    --------
    >>> [round(v, 4) for v in ag.corpus.chi_moments(3)]
    [1.5958, 0.6734]
    """
    mean = math.sqrt(2.0) * math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2))
    return mean, math.sqrt(max(dof - mean * mean, 0.0))


class RadiusStatistic(Statistic):
    """tau = scale ``|q|`` of every query of every head: count, mean, std, histogram, chi prediction.

    Parameters
    ----------
    edges : array_like, optional
        Histogram bin edges (default 128 bins on [0, 16]); values outside are counted in
        ``overflow`` fractions.
    """

    name = "radius"
    fields = ("q",)

    def __init__(self, edges=None):
        super().__init__()
        self.edges = np.asarray(DEFAULT_RADIUS_EDGES if edges is None else edges, dtype=np.float64)
        Histogram((), self.edges)  # checks the edges now

    def config(self) -> dict:
        return {"edges": self.edges}

    def _new(self, batch) -> dict:
        L, _, H = batch.forward.q.shape[:3]
        return {"moments": Moments((L, H), 1, full=False), "histogram": Histogram((L, H), self.edges)}

    def _update(self, batch) -> None:
        q = batch.head_tokens(batch.forward.q)  # (L, H, N, d)
        tau = batch.forward.scale[:, None, None] * np.linalg.norm(q.astype(np.float64), axis=-1)
        self.state["moments"].update(tau)
        self.state["histogram"].update(tau)

    def result(self, *, d_head=None) -> dict:
        """count, mean, std, histogram (density), edges, overflow (fraction), and with d_head
        chi_mean, chi_std (the chi prediction), each of shape (n_layers, n_heads[, bins])."""
        self._require()
        m, h = self.state["moments"], self.state["histogram"]
        d = None if d_head is None else int(d_head)
        mean, var = m.mean[..., 0], m.variance()[..., 0]
        out = {"count": m.count, "mean": mean, "std": np.sqrt(var), "histogram": h.density(),
               "edges": h.edges, "overflow": h.overflow / np.maximum(m.count, 1)}
        if d:
            c_mean, c_std = chi_moments(d)
            sigma = np.sqrt((var + mean * mean) / d)  # tau = scale |q| ~ scale sigma chi_d
            out["chi_mean"] = sigma * c_mean
            out["chi_std"] = sigma * c_std
        return out
