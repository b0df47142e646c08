"""Whiteness and stationarity over a corpus (Whitened self-attention s.6, eq. 10-14).

:class:`SequenceMoments` accumulates the TD x TD covariance of the first T vectors of each
sequence (Chan-style merges); its :meth:`~SequenceMoments.whiteness` and
:meth:`~SequenceMoments.stationarity` equal :func:`attngeom.whiteness` and
:func:`attngeom.stationarity` of all the sequences seen, stacked into one (B, T, D) batch.
:class:`WhitenessStatistic` applies it to the input of every layer's attention.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .moments import Moments
from .protocol import Statistic


class SequenceMoments:
    """Block covariances across T positions of D-vectors, for a stack of accumulators.

    Parameters
    ----------
    shape : tuple of int
        The stack (e.g. (n_layers,)).
    T : int
        Positions per sequence.
    D : int
        Width of each vector.

    Examples
    --------
    >>> x = ag.vector_ma1(0.5 * np.eye(2), B=50, T=3, seed=0)
    >>> acc = ag.corpus.SequenceMoments((), 3, 2).update(x[:20]).merge(ag.corpus.SequenceMoments((), 3, 2).update(x[20:]))
    >>> bool(np.isclose(acc.whiteness(), ag.whiteness(x)))
    True
    """

    def __init__(self, shape: Tuple[int, ...], T: int, D: int):
        self.shape, self.T, self.D = tuple(shape), int(T), int(D)
        self.moments = Moments(self.shape, self.T * self.D)

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
        >>> int(ag.corpus.SequenceMoments((), 2, 1).update(np.zeros((3, 2, 1))).moments.count)
        3
        """
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-2:] != (self.T, self.D):
            raise ValueError(f"x must have shape {self.shape + ('B', self.T, self.D)}, got {x.shape}")
        self.moments.update(x.reshape(x.shape[:-2] + (self.T * self.D,)))
        return self

    def merge(self, other: "SequenceMoments") -> "SequenceMoments":
        """Add another accumulator's sequences; returns self.

        Parameters
        ----------
        other : SequenceMoments
            An accumulator of other sequences (same shape, T, D).

        Returns
        -------
        SequenceMoments
            self, with other's sequences added.

        Examples
        --------
        >>> a = ag.corpus.SequenceMoments((), 2, 1).merge(ag.corpus.SequenceMoments((), 2, 1))
        >>> int(a.moments.count)
        0
        """
        if not isinstance(other, SequenceMoments):
            raise TypeError(f"other must be a SequenceMoments, got {type(other).__name__}")
        self.moments.merge(other.moments)
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
        return {"whiteness": self.whiteness(), "stationarity": self.stationarity(), "count": self.moments.count}

    def _covariance(self) -> np.ndarray:
        if np.any(self.moments.count < 2):
            raise ValueError(f"whiteness needs at least 2 sequences of {self.T} tokens, got "
                             f"{int(np.min(self.moments.count))}")
        return self.moments.covariance(ddof=1)

    def whiteness(self) -> np.ndarray:
        """Psi (eq. 10-12) of the sequences seen, shape ``shape``.

        Returns
        -------
        ndarray
            sum_{i != j} ``|Lambda_ij|`` / ((TD - 1) sum_i ``|Lambda_ii|``), 0 where undefined.

        Examples
        --------
        >>> x = np.random.default_rng(0).standard_normal((10, 3, 2))
        >>> bool(np.isclose(ag.corpus.SequenceMoments((), 3, 2).update(x).whiteness(), ag.whiteness(x)))
        True
        """
        lam = np.abs(self._covariance())
        diag = np.trace(lam, axis1=-2, axis2=-1)
        n = self.T * self.D
        if n == 1:
            return np.zeros(self.shape)
        off = lam.sum((-2, -1)) - diag
        return np.where(diag > 0, off / ((n - 1) * np.where(diag > 0, diag, 1.0)), 0.0)

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
        c = self._covariance()
        D = self.D
        lag = np.stack([c[..., t * D:(t + 1) * D, (t + 1) * D:(t + 2) * D] for t in range(self.T - 1)], axis=-3)
        return np.sum(np.linalg.norm(lag - lag.mean(-3, keepdims=True), axis=(-2, -1)), axis=-1)


class WhitenessStatistic(Statistic):
    """Psi and rho of the first ``window`` tokens of every text, at the input of every layer's
    attention (texts shorter than the window are left out). Memory (window d_model)^2 per
    layer.

    Parameters
    ----------
    window : int, default 4
        T, the positions per sequence.
    """

    name = "whiteness"

    def __init__(self, window: int = 4):
        super().__init__()
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 2:
            raise ValueError(f"window must be an integer >= 2, got {window!r}")
        self.window = int(window)

    def config(self) -> dict:
        return {"window": self.window}

    def _new(self, batch) -> dict:
        x = batch.forward.attention_inputs
        return {"sequences": SequenceMoments((x.shape[0],), self.window, x.shape[-1])}

    def _update(self, batch) -> None:
        keep = np.flatnonzero(batch.lengths >= self.window)
        if keep.size:
            x = np.asarray(batch.forward.attention_inputs, np.float64)[:, keep, :self.window]
            self.state["sequences"].update(x)

    def result(self) -> dict:
        """whiteness (Psi) and stationarity (rho) per layer (n_layers,), and the number of texts
        used (None for both when fewer than 2 texts reach the window)."""
        self._require()
        seq = self.state["sequences"]
        count = int(seq.moments.count.flat[0])
        if count < 2:
            return {"texts": count, "whiteness": None, "stationarity": None}
        return {"texts": count, "whiteness": seq.whiteness(), "stationarity": seq.stationarity()}
