"""Every query of every head over a corpus, from the streaming attention statistics.

The model's forward pass computes each query's statistics inside the attention kernel
(``Model.forward(keep=("attention_stats",))``: entropy, weight on key 0, mean query-key
distance and log Z, with no (n, n) matrix), so this statistic costs memory linear in the
text length and reads texts of any length the model takes. Per head it keeps the moments of
the four over every real query, and their sums in fixed geometric position bins (the
entropy and sink-mass profile against position). From an activation store the statistics
come from the stored weights and log Z (:func:`stats_from_weights`).
"""
from __future__ import annotations

import numpy as np

from ..attention_stats import AttentionStats
from .moments import Moments
from .protocol import Statistic

#: Position bins: [0, 1), [1, 2), ... geometric beyond 8, up to 2^20 (fixed, so states merge).
POSITION_EDGES = np.unique(np.concatenate([np.arange(9), np.round(np.geomspace(8, 2 ** 20, 57))])).astype(np.int64)
_PARTS = ("entropy", "sink_weight", "mean_distance", "log_z")


class ProfileStatistic(Statistic):
    """Per head: entropy, sink weight, mean distance and log Z of every query (mean and std),
    and the mean entropy and sink weight per position bin (:data:`POSITION_EDGES`)."""

    name = "profile"
    fields = ("attention_stats",)

    def _new(self, batch) -> dict:
        if batch.forward.attention_stats is None:
            raise ValueError("the profile statistic needs the forward pass's attention_stats")
        L, _, H = batch.forward.attention_stats.entropy.shape[:3]
        bins = POSITION_EDGES.size - 1
        return {"moments": Moments((L, H), len(_PARTS), full=False),
                "entropy_sum": np.zeros((L, H, bins)), "sink_sum": np.zeros((L, H, bins)),
                "count": np.zeros(bins, np.int64)}

    def _update(self, batch) -> None:
        st = batch.forward.attention_stats  # fields (L, b, H, n)
        values = np.stack([np.asarray(getattr(st, p), np.float64) for p in _PARTS], axis=-1)  # (L, b, H, n, 4)
        self.state["moments"].update(batch.head_tokens(values))  # (L, H, N, 4)
        n = values.shape[3]
        positions = np.broadcast_to(np.arange(n), batch.mask.shape)[batch.mask]  # (N,), text after text
        idx = np.minimum(np.searchsorted(POSITION_EDGES, positions, side="right") - 1, POSITION_EDGES.size - 2)
        onehot = np.zeros((positions.size, POSITION_EDGES.size - 1))
        onehot[np.arange(positions.size), idx] = 1.0
        self.state["entropy_sum"] += batch.head_tokens(values[..., 0]) @ onehot
        self.state["sink_sum"] += batch.head_tokens(values[..., 1]) @ onehot
        self.state["count"] += onehot.sum(0).astype(np.int64)

    def result(self) -> dict:
        """``<part>_mean`` and ``<part>_std`` (n_layers, n_heads) for entropy, sink_weight,
        mean_distance and log_z; ``profile_positions`` (bins,) the first position of every
        occupied bin, ``profile_entropy`` and ``profile_sink_weight`` (n_layers, n_heads, bins)
        their means there, ``profile_count`` the queries per bin; ``count`` the queries."""
        self._require()
        m = self.state["moments"]
        std = np.sqrt(m.variance())
        out = {"count": m.count}
        for i, p in enumerate(_PARTS):
            out[p + "_mean"], out[p + "_std"] = m.mean[..., i], std[..., i]
        used = self.state["count"] > 0
        out["profile_positions"] = POSITION_EDGES[:-1][used]
        out["profile_count"] = self.state["count"][used]
        out["profile_entropy"] = self.state["entropy_sum"][..., used] / out["profile_count"]
        out["profile_sink_weight"] = self.state["sink_sum"][..., used] / out["profile_count"]
        return out


def stats_from_weights(attentions, log_z) -> AttentionStats:
    """The statistics of stored weights P (..., n, n) and log partitions (..., n) (an activation
    store holds both: P does not determine log Z)."""
    return AttentionStats.from_routing(attentions, log_z=log_z)
