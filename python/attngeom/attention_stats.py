"""Per-query statistics of the rows of routing matrices, computed inside the streaming kernels.

``softmax_attention(..., return_stats=True)`` and ``kernel_attention(..., return_stats=True)``
return an :class:`AttentionStats` computed in the same pass as y, from the same score tiles,
with no (n_q, n_k) buffer: what a long-context analysis of every head needs (attention sinks,
long-range heads, how peaked each query's weights are) at lengths where P itself would not fit.
:meth:`AttentionStats.from_routing` computes the same statistics from a materialised P (for
routing matrices from elsewhere, and as the reference the kernels are tested against).

For the weight row p_i of query i over keys j (log-weights l_ij, log Z_i = log sum_j e^l_ij):

    entropy_i       = -sum_j p_ij log p_ij = log Z_i - E_p[l_ij]           (nats)
    max_weight_i    = max_j p_ij,  argmax_i its key (the first such key)
    sink_weight_i   = p_i0                                                 (the weight on key 0)
    mean_distance_i = sum_j p_ij abs(pos_i - j)

pos_i is the query's position among the keys: i + n_k - n_q under ``causal="bottom_right"``
(a block of queries appended to a cache), i otherwise. The kernels keep the running max m,
the running sum l = sum_j e^(l_ij - m) and a = sum_j e^(l_ij - m) (l_ij - m); when the max
moves from m to m', l and a are rescaled by e^(m - m') and a is shifted by l (m - m'), and at
the end entropy = log l - a / l and max_weight = 1 / l. A query with no visible key has
entropy, max_weight, sink_weight and mean_distance 0, argmax -1 and log Z -inf.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ._deprecation import deprecated
from ._operands import attention_kinds, from_bhnd, real_array

FIELDS = ("log_z", "entropy", "max_weight", "argmax", "sink_weight", "mean_distance")


@dataclasses.dataclass(frozen=True)
class AttentionStats:
    """Statistics of each query's attention weights, arrays of shape (..., heads, n_q).

    Attributes
    ----------
    log_z : ndarray
        log Z_i = log sum_j psi_ij, the log partition (-inf for a query that sees no key).
    entropy : ndarray
        -sum_j p_ij log p_ij, in nats: 0 for one-hot weights, log n for uniform ones.
    max_weight : ndarray
        The largest weight of the row.
    argmax : ndarray of int64
        The key holding it (the first such key); -1 for a query that sees no key.
    sink_weight : ndarray
        p_i0, the weight on key 0 (the attention-sink mass).
    mean_distance : ndarray
        sum_j p_ij abs(pos_i - j), the expected distance in positions from the query to the keys
        it reads (pos_i = i + n_k - n_q under a bottom-right causal alignment, i otherwise).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 2, 6, 4))
    >>> y, stats = ag.softmax_attention(q, k, v, causal=True, return_stats=True)
    >>> stats.shape, stats.argmax[:, 0].tolist()   # query 0 sees key 0 only
    ((2, 6), [0, 0])
    >>> bool(np.all(stats.entropy <= np.log(np.arange(1, 7))))   # at most log(visible keys)
    True
    """

    log_z: np.ndarray
    entropy: np.ndarray
    max_weight: np.ndarray
    argmax: np.ndarray
    sink_weight: np.ndarray
    mean_distance: np.ndarray

    def __repr__(self) -> str:
        """A few lines: the shape, then each field's dtype, mean and range."""
        from ._summary import array_summary

        shape = str(tuple(self.shape))
        return "\n".join([f"AttentionStats(shape {shape} (..., heads, n_q)"]
                         + [f"  {name}: {array_summary(getattr(self, name)).split(' ', len(self.shape))[-1]}"
                            for name in FIELDS]) + ")"

    @property
    def shape(self) -> tuple:
        """The shape of every field, (..., heads, n_q)."""
        return self.entropy.shape

    def map(self, fn) -> "AttentionStats":
        """The statistics with `fn` applied to every field (e.g. ``lambda a: a[:, 0]`` to index
        leading axes, which all fields share).

        Parameters
        ----------
        fn : callable
            ndarray -> ndarray, applied to log_z, entropy, max_weight, argmax, sink_weight and
            mean_distance in turn.

        Returns
        -------
        AttentionStats

        Examples
        --------
        >>> st = ag.AttentionStats.from_routing(np.eye(3)[None])
        >>> st.map(lambda a: a[0]).shape
        (3,)
        """
        return AttentionStats(*(fn(getattr(self, name)) for name in FIELDS))

    @classmethod
    def from_routing(cls, routing, *, causal=False, log_z=None) -> "AttentionStats":
        """The statistics of a materialised routing matrix P (..., n_q, n_k), in NumPy.

        Parameters
        ----------
        routing : array_like, shape (..., n_q, n_k)
            Routing matrices P: rows of weights (each sums to 1, or is all 0 for a query that
            sees no key), e.g. from ``return_routing=True`` or transformers' ``output_attentions``.
        causal : {False, True, "top_left", "bottom_right"}, default False
            Only "bottom_right" matters: it places query i at key position i + n_k - n_q.
        log_z : array_like, shape (..., n_q), optional
            Carried into the result; NaN when not given (P does not determine it).

        Returns
        -------
        AttentionStats
            Fields of shape (..., n_q), in P's dtype (float64 for other input).

        Examples
        --------
        >>> P = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
        >>> st = ag.AttentionStats.from_routing(P)
        >>> st.entropy.round(4).tolist(), st.argmax.tolist(), st.mean_distance.tolist()
        ([0.0, 0.6931, 1.0397], [0, 0, 2], [0.0, 0.5, 0.75])
        """
        return cls._of_routing("routing", routing, causal, log_z)

    @classmethod
    def from_weights(cls, weights, *, causal=False, log_z=None) -> "AttentionStats":
        """Deprecated name of :meth:`from_routing` (its messages name ``weights``)."""
        deprecated("AttentionStats", "the method", "from_weights", "from_routing")
        return cls._of_routing("weights", weights, causal, log_z)

    @classmethod
    def _of_routing(cls, name, routing, causal, log_z) -> "AttentionStats":
        """:meth:`from_routing`, its messages naming the argument `name`."""
        P = real_array(name, routing)
        if P.ndim < 2:
            raise ValueError(f"{name} must have shape (..., n_q, n_k), got {P.shape}")
        if P.dtype not in (np.float32, np.float64):
            P = P.astype(np.float64)
        n_q, n_k = P.shape[-2:]
        offset = n_k - n_q if causal == "bottom_right" else 0
        seen = P.sum(-1) > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0)
        entropy = np.where(seen, 0.0 - plogp.sum(-1), 0).astype(P.dtype)  # 0, not -0, for one-hot rows
        pos = np.arange(n_q)[:, None] + offset
        distance = np.abs(pos - np.arange(n_k)[None, :]).astype(P.dtype)
        lz = np.full(P.shape[:-1], np.nan, P.dtype) if log_z is None else np.asarray(log_z, P.dtype)
        if n_k == 0:
            zeros = np.zeros(P.shape[:-1], P.dtype)
            return cls(lz, zeros, zeros, np.full(P.shape[:-1], -1, np.int64), zeros, zeros)
        return cls(log_z=lz, entropy=entropy, max_weight=P.max(-1),
                   argmax=np.where(seen, P.argmax(-1), -1).astype(np.int64), sink_weight=P[..., 0],
                   mean_distance=(P * distance).sum(-1))


def with_stats(layout, out, return_routing: bool, return_log_partition: bool, return_stats: bool,
               y_merged: bool = False):
    """An attention call's result in the caller's layout: `out` (the bhnd result) as
    from_bhnd gives it, followed by the AttentionStats when asked for (out is then the pair
    (result, stats)); the statistics stay (..., heads, n_q) in every layout, as P does, and a
    y with its heads merged (`y_merged`) stays as it is."""
    kinds = attention_kinds(return_routing, return_log_partition)
    if y_merged:
        kinds = "-" + kinds[1:]
    if not return_stats:
        return from_bhnd(layout, out, kinds)
    result, stats = out
    result = from_bhnd(layout, result, kinds)
    return (result if isinstance(result, tuple) else (result,)) + (stats,)


def core_stats(shaped, log_z, stats) -> AttentionStats:
    """The AttentionStats of a core call: `stats` the core's (entropy, max_weight, argmax,
    sink_weight, mean_distance), each (batch, n_q), and `shaped(a)` the function that restores
    the broadcast batch shape (AttentionOperands.shaped with n_q)."""
    return AttentionStats(*(shaped(a) for a in (log_z,) + tuple(stats)))
