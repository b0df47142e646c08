"""Whiteness and stationarity over a corpus (Whitened self-attention s.6, eq. 10-14).

:class:`SequenceMoments` accumulates the block covariances Lambda_{s,t} (D x D) between the
first T positions of each sequence (Chan-style merges); its :meth:`~SequenceMoments.whiteness`
and :meth:`~SequenceMoments.stationarity` equal :func:`attngeom.whiteness` and
:func:`attngeom.stationarity` of all the sequences seen, stacked into one (B, T, D) batch.
:class:`WhitenessStatistic` applies it to the input of every layer's attention.

Why the state is (T D)^2 and not O(D^2) per head: Psi (eq. 12) sums the magnitudes
``|Lambda_ij|`` of every entry of the TD x TD covariance of the stacked sequences, taken of
the pooled covariance after all the sequences are in. Changing one entry Lambda_ij (and
Lambda_ji) and no other changes Psi, so whatever is kept must determine every entry; and
the entries of two partitions combine before the magnitude is taken (``|a + b|`` is not a
function of ``|a|`` and ``|b|``), so each partition must carry every entry's co-moment. The
exact state is the symmetric co-moment, T (T + 1) / 2 blocks of D x D (the upper block
triangle is kept, a bit over half of the full TD x TD matrix). It is per layer, not per
head, because the paper's sequences are the layer's D = d_model-wide inputs. rho (eq.
13-14) reads only the lag-1 blocks.

``max_lag`` bounds the state to the band of blocks Lambda_{t,t+l} with l <= max_lag
((max_lag + 1) T D^2 numbers at most; max_lag = 1 is the block-tridiagonal band of the
paper's covariance model, s.4). Psi is then the mean magnitude of the off-diagonal entries
inside the band over the mean magnitude of the diagonal; with the full band (max_lag =
T - 1, the default) that is exactly eq. 12, and rho is exact for every max_lag >= 1.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .._operands import count as _count
from .protocol import Statistic


class SequenceMoments:
    """Block covariances across T positions of D-vectors, for a stack of accumulators.

    Keeps the count, the mean (T, D) and the co-moments of positions t and t + l for the lags
    l = 0 .. ``max_lag`` (the upper block triangle of the TD x TD co-moment, or a band of it):
    ``8 (T D + D^2 sum_{l <= max_lag} (T - l))`` bytes per accumulator (:attr:`nbytes`).

    Parameters
    ----------
    shape : tuple of int
        The stack (e.g. (n_layers,)).
    T : int
        Positions per sequence.
    D : int
        Width of each vector.
    max_lag : int, optional
        Keep the blocks Lambda_{t,t+l} with l <= max_lag only, in 1 .. T - 1 (default T - 1:
        every block, Psi of eq. 12 exactly).

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=50, T=3, seed=0)
    >>> acc = ag.corpus.SequenceMoments((), 3, 2).update(x[:20]).merge(ag.corpus.SequenceMoments((), 3, 2).update(x[20:]))
    >>> bool(np.isclose(acc.whiteness(), ag.whiteness(x)))
    True
    """

    def __init__(self, shape: Tuple[int, ...], T: int, D: int, *, max_lag: Optional[int] = None):
        self.shape = tuple(_count("shape", int(s), 0) for s in shape)
        self.T, self.D = _count("T", T), _count("D", D)
        self.max_lag = self.T - 1 if max_lag is None else _count("max_lag", max_lag, min(1, self.T - 1), self.T - 1)
        self.count = np.zeros(self.shape, dtype=np.int64)
        self.mean = np.zeros(self.shape + (self.T, self.D))
        self.lags = [np.zeros(self.shape + (self.T - lag, self.D, self.D)) for lag in range(self.max_lag + 1)]

    @property
    def nbytes(self) -> int:
        """Bytes held by the state (count, mean and the co-moment blocks).

        Returns
        -------
        int
            The sum of the arrays' sizes.

        Examples
        --------
        >>> ag.corpus.SequenceMoments((), 4, 8, max_lag=1).nbytes == 8 * (4 * 8 + 64 * (4 + 3)) + 8
        True
        """
        return int(self.count.nbytes + self.mean.nbytes + sum(m.nbytes for m in self.lags))

    def _combine(self, n_b, mean_b, lags_b) -> None:
        n_a = self.count.astype(np.float64)
        n = n_a + n_b
        safe = np.where(n > 0, n, 1.0)
        delta = mean_b - self.mean  # (*shape, T, D)
        self.mean = np.where(n[..., None, None] > 0, self.mean + delta * (n_b / safe)[..., None, None], 0.0)
        c = (n_a * n_b / safe)[..., None, None, None]
        for lag, (m, mb) in enumerate(zip(self.lags, lags_b)):
            m += mb
            m += (delta[..., :self.T - lag, :, None] * delta[..., lag:, None, :]) * c
        self.count = self.count + n_b.astype(np.int64)

    def update(self, x) -> "SequenceMoments":
        """Add sequences x, shape (\\*shape, B, T, D); returns self.

        Parameters
        ----------
        x : ndarray, shape (\\*shape, B, T, D)
            New sequences.

        Returns
        -------
        SequenceMoments
            self, with x counted.

        Examples
        --------
        >>> int(ag.corpus.SequenceMoments((), 2, 1).update(np.zeros((3, 2, 1))).count)
        3
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != len(self.shape) + 3 or x.shape[:len(self.shape)] != self.shape or x.shape[-2:] != (self.T, self.D):
            raise ValueError(f"x must have shape {self.shape + ('B', self.T, self.D)}, got {x.shape}")
        B = x.shape[-3]
        if B == 0:
            return self
        mean_b = x.mean(-3)
        c = np.moveaxis(x - mean_b[..., None, :, :], -3, -2)  # (*shape, T, B, D)
        ct = np.swapaxes(c, -1, -2)  # (*shape, T, D, B)
        lags_b = [ct[..., :self.T - lag, :, :] @ c[..., lag:, :, :] for lag in range(self.max_lag + 1)]
        self._combine(np.full(self.shape, float(B)), mean_b, lags_b)
        return self

    def merge(self, other: "SequenceMoments") -> "SequenceMoments":
        """Add another accumulator's sequences; returns self.

        Parameters
        ----------
        other : SequenceMoments
            An accumulator of other sequences (same shape, T, D and max_lag).

        Returns
        -------
        SequenceMoments
            self, with other's sequences added.

        Examples
        --------
        >>> a = ag.corpus.SequenceMoments((), 2, 1).merge(ag.corpus.SequenceMoments((), 2, 1))
        >>> int(a.count)
        0
        """
        if not isinstance(other, SequenceMoments):
            raise TypeError(f"other must be a SequenceMoments, got {type(other).__name__}")
        mine, theirs = (self.shape, self.T, self.D, self.max_lag), (other.shape, other.T, other.D, other.max_lag)
        if mine != theirs:
            raise ValueError(f"other has (shape, T, D, max_lag) {theirs}, this accumulator {mine}")
        self._combine(other.count.astype(np.float64), other.mean, other.lags)
        return self

    def result(self) -> dict:
        """whiteness and stationarity, each of shape ``shape``.

        Returns
        -------
        dict
            {"whiteness": Psi, "stationarity": rho, "count": B}.

        Examples
        --------
        >>> x = np.random.default_rng(0).standard_normal((10, 3, 2))
        >>> sorted(ag.corpus.SequenceMoments((), 3, 2).update(x).result())
        ['count', 'stationarity', 'whiteness']
        """
        return {"whiteness": self.whiteness(), "stationarity": self.stationarity(), "count": self.count}

    def _check_count(self) -> None:
        if np.any(self.count < 2):
            raise ValueError(f"whiteness needs at least 2 sequences of {self.T} tokens, got {int(np.min(self.count))}")

    def whiteness(self) -> np.ndarray:
        """Psi (eq. 10-12) of the sequences seen, shape ``shape``.

        Returns
        -------
        ndarray
            sum_{i != j} ``|Lambda_ij|`` / ((TD - 1) sum_i ``|Lambda_ii|``), 0 where undefined;
            with a ``max_lag`` below T - 1, the mean ``|Lambda_ij|`` over the off-diagonal
            entries of the band over the mean diagonal ``|Lambda_ii|``.

        Examples
        --------
        >>> x = np.random.default_rng(0).standard_normal((10, 3, 2))
        >>> bool(np.isclose(ag.corpus.SequenceMoments((), 3, 2).update(x).whiteness(), ag.whiteness(x)))
        True
        """
        self._check_count()
        T, D = self.T, self.D
        if T * D == 1:
            return np.zeros(self.shape)
        a0 = np.abs(self.lags[0])  # the ratio does not depend on the 1 / (B - 1) of the covariance
        diag = np.trace(a0, axis1=-2, axis2=-1).sum(-1)
        off = a0.sum((-3, -2, -1)) - diag
        for m in self.lags[1:]:
            off = off + 2.0 * np.abs(m).sum((-3, -2, -1))
        pairs = T * D * (D - 1) + 2 * D * D * sum(T - lag for lag in range(1, self.max_lag + 1))
        return np.where(diag > 0, off * (T * D) / (pairs * np.where(diag > 0, diag, 1.0)), 0.0)

    def stationarity(self) -> np.ndarray:
        """rho (eq. 13-14) of the sequences seen, shape ``shape``.

        Returns
        -------
        ndarray
            sum_t ``|Lambda_{t,t+1} - mean_t Lambda_{t,t+1}|_F``.

        Examples
        --------
        >>> x = np.random.default_rng(0).standard_normal((10, 3, 2))
        >>> bool(np.isclose(ag.corpus.SequenceMoments((), 3, 2).update(x).stationarity(), ag.stationarity(x)))
        True
        """
        if self.T < 2:
            raise ValueError(f"stationarity needs T >= 2 positions, got {self.T}")
        self._check_count()
        lag = self.lags[1] / (self.count.astype(np.float64) - 1.0)[..., None, None, None]
        return np.sum(np.linalg.norm(lag - lag.mean(-3, keepdims=True), axis=(-2, -1)), axis=-1)


class WhitenessStatistic(Statistic):
    """Psi and rho of the first ``window`` tokens of every text, at the input of every layer's
    attention (texts shorter than the window are left out). Memory per layer
    ``8 d_model^2 sum_{l <= max_lag} (window - l)`` bytes: the upper block triangle of the
    (window d_model)^2 covariance, or its band (see :class:`SequenceMoments`).

    Parameters
    ----------
    window : int, default 4
        T, the positions per sequence.
    max_lag : int, optional
        Keep only the blocks of lags up to max_lag (1 .. window - 1; default window - 1, every
        block). rho is exact for any max_lag; Psi becomes the band's (see
        :meth:`SequenceMoments.whiteness`).
    """

    name = "whiteness"
    fields = ("attn_in",)

    def __init__(self, window: int = 4, max_lag: Optional[int] = None):
        super().__init__()
        self.window = _count("window", window, 2)
        self.max_lag = None if max_lag is None else _count("max_lag", max_lag, 1, self.window - 1)

    def config(self) -> dict:
        return {"window": self.window, "max_lag": self.max_lag}

    def _new(self, batch) -> dict:
        x = batch.forward.attn_in
        return {"sequences": SequenceMoments((x.shape[0],), self.window, x.shape[-1], max_lag=self.max_lag)}

    def _update(self, batch) -> None:
        keep = np.flatnonzero(batch.lengths >= self.window)
        if keep.size:
            x = np.asarray(batch.forward.attn_in, np.float64)[:, keep, :self.window]
            self.state["sequences"].update(x)

    def result(self) -> dict:
        """whiteness (Psi) and stationarity (rho) per layer (n_layers,), the number of texts
        used (None for both when fewer than 2 texts reach the window) and the band's max_lag."""
        self._require()
        seq = self.state["sequences"]
        count = int(seq.count.flat[0])
        if count < 2:
            return {"texts": count, "max_lag": seq.max_lag, "whiteness": None, "stationarity": None}
        return {"texts": count, "max_lag": seq.max_lag, "whiteness": seq.whiteness(),
                "stationarity": seq.stationarity()}
