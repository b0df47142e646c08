"""Routing statistics per head over a corpus: the entropy and the largest weight of every
attention row, and the entropy effective rank of every text's routing matrix P
(Laplace-Radon s.6.3, s.13.4 Figure 3), as moments and fixed-edge histograms.
"""
from __future__ import annotations

import numpy as np

from ..spectral import effective_rank
from .histogram import Histogram
from .moments import Moments
from .protocol import Statistic

DEFAULT_ENTROPY_EDGES = np.linspace(0.0, 8.0, 81)
DEFAULT_MAX_WEIGHT_EDGES = np.linspace(0.0, 1.0, 51)
DEFAULT_RANK_EDGES = np.arange(0.0, 129.0)


class RoutingStatistic(Statistic):
    """Row entropy -sum_i p_ji log p_ji (nats), max_i p_ji, and rank_eff(P) per text (``rank``), per head.

    Parameters
    ----------
    entropy_edges, max_weight_edges, rank_edges : array_like, optional
        Histogram bin edges (defaults: [0, 8] nats in 80 bins, [0, 1] in 50 bins, unit bins
        on [0, 128]).
    """

    name = "routing"
    fields = ("pattern",)
    _PARTS = ("entropy", "max_weight", "rank")

    def __init__(self, entropy_edges=None, max_weight_edges=None, rank_edges=None):
        super().__init__()
        given = (entropy_edges, max_weight_edges, rank_edges)
        defaults = (DEFAULT_ENTROPY_EDGES, DEFAULT_MAX_WEIGHT_EDGES, DEFAULT_RANK_EDGES)
        self.edges = {p: np.asarray(d if e is None else e, dtype=np.float64)
                      for p, e, d in zip(self._PARTS, given, defaults)}
        for e in self.edges.values():
            Histogram((), e)

    def config(self) -> dict:
        return {f"{p}_edges": e for p, e in self.edges.items()}

    def _new(self, batch) -> dict:
        L, _, H = batch.forward.pattern.shape[:3]
        state = {}
        for p in self._PARTS:
            state[p] = Moments((L, H), 1, full=False)
            state[p + "_histogram"] = Histogram((L, H), self.edges[p])
        return state

    def _update(self, batch) -> None:
        P = np.asarray(batch.forward.pattern, dtype=np.float64)  # (L, b, H, n, n)
        rows = batch.head_tokens(P)  # (L, H, N, n): every real query row (padded keys carry 0)
        plogp = np.where(rows > 0, rows * np.log(np.where(rows > 0, rows, 1.0)), 0.0)
        values = {"entropy": -plogp.sum(-1), "max_weight": rows.max(-1)}
        ranks = []
        for s, n in enumerate(batch.lengths):
            sv = np.linalg.svd(P[:, s, :, :n, :n], compute_uv=False)  # (L, H, n)
            ranks.append(np.asarray(effective_rank(sv, kind="entropy", spectrum=True)))
        values["rank"] = np.stack(ranks, axis=-1)  # (L, H, b)
        for p, v in values.items():
            self.state[p].update(v)
            self.state[p + "_histogram"].update(v)

    def result(self) -> dict:
        """For each of entropy, max_weight, rank (the entropy effective rank of P): ``<part>_mean``, ``<part>_std``
        (n_layers, n_heads), ``<part>_histogram`` (n_layers, n_heads, bins, a density) and
        ``<part>_edges``; ``rows`` and ``texts`` counts."""
        self._require()
        out = {"rows": self.state["entropy"].count, "texts": self.state["rank"].count}
        for p in self._PARTS:
            m, h = self.state[p], self.state[p + "_histogram"]
            out[p + "_mean"], out[p + "_std"] = m.mean[..., 0], np.sqrt(m.variance()[..., 0])
            out[p + "_histogram"], out[p + "_edges"] = h.density(), h.edges
        return out
