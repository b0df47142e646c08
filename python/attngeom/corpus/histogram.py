"""Histograms with fixed bin edges: :class:`Histogram`, merged exactly by adding counts.

The edges are chosen before the run (never from the data), so the histograms of any
partitions of a corpus add up to the single-pass histogram bit for bit. Values below the
first edge and above the last are counted in ``underflow`` / ``overflow``, so nothing is lost.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


class Histogram:
    """Counts of values in fixed bins, for a stack of accumulators.

    Parameters
    ----------
    shape : tuple of int
        The stack (e.g. (n_layers, n_heads)).
    edges : array_like, shape (bins + 1,)
        Increasing bin edges; bin i is [edges[i], edges[i+1]) (the last one closed).

    Examples
    --------
    >>> h = ag.corpus.Histogram((), [0.0, 1.0, 2.0]).update(np.array([0.5, 1.5, 1.7, 3.0]))
    >>> h.counts.tolist(), int(h.overflow)
    ([1, 2], 1)
    """

    def __init__(self, shape: Tuple[int, ...], edges):
        e = np.asarray(edges, dtype=np.float64)
        if e.ndim != 1 or e.size < 2 or not np.all(np.isfinite(e)) or not np.all(np.diff(e) > 0):
            raise ValueError(f"edges must be a finite increasing 1-D array of at least 2 values, got {e!r}")
        self.shape, self.edges = tuple(shape), e
        self.counts = np.zeros(self.shape + (e.size - 1,), dtype=np.int64)
        self.underflow = np.zeros(self.shape, dtype=np.int64)
        self.overflow = np.zeros(self.shape, dtype=np.int64)

    def update(self, x, weight=None) -> "Histogram":
        """Count the values x, shape (\\*shape, n).

        Parameters
        ----------
        x : ndarray, shape (\\*shape, n)
            Values per accumulator.
        weight : ndarray of bool, shape (\\*shape, n), optional
            Which values to count (default all).

        Returns
        -------
        Histogram
            self, with x counted.

        Examples
        --------
        >>> ag.corpus.Histogram((), [0.0, 1.0]).update(np.array([0.2, 0.9])).counts
        array([2])
        """
        x = np.asarray(x, dtype=np.float64)
        if x.shape[:len(self.shape)] != self.shape or x.ndim != len(self.shape) + 1:
            raise ValueError(f"x must have shape {self.shape + ('n',)}, got {x.shape}")
        w = np.ones(x.shape, bool) if weight is None else np.broadcast_to(np.asarray(weight, bool), x.shape)
        bins = self.counts.shape[-1]
        idx = np.searchsorted(self.edges, x, side="right") - 1
        idx[x == self.edges[-1]] = bins - 1
        under, over = (idx < 0) & w, (idx >= bins) & w
        self.underflow += under.sum(-1)
        self.overflow += over.sum(-1)
        inside = w & ~(idx < 0) & ~(idx >= bins)
        flat = np.arange(int(np.prod(self.shape, dtype=np.int64))).reshape(self.shape + (1,)) * bins + idx
        self.counts += np.bincount(flat[inside], minlength=self.counts.size).reshape(self.counts.shape)
        return self

    def merge(self, other: "Histogram") -> "Histogram":
        """Add another histogram's counts (same shape and edges); returns self.

        Parameters
        ----------
        other : Histogram
            A histogram of other data.

        Returns
        -------
        Histogram
            self, with other's counts added.

        Examples
        --------
        >>> a = ag.corpus.Histogram((), [0.0, 1.0]).update(np.array([0.5]))
        >>> a.merge(ag.corpus.Histogram((), [0.0, 1.0]).update(np.array([0.1]))).counts
        array([2])
        """
        if not isinstance(other, Histogram):
            raise TypeError(f"other must be a Histogram, got {type(other).__name__}")
        if other.shape != self.shape or not np.array_equal(other.edges, self.edges):
            raise ValueError("other must have the same shape and edges")
        self.counts += other.counts
        self.underflow += other.underflow
        self.overflow += other.overflow
        return self

    def density(self) -> np.ndarray:
        """Counts divided by (total count x bin width): a probability density over the
        bins, shape (\\*shape, bins) (zero where nothing was counted).

        Returns
        -------
        ndarray
            The density.

        Examples
        --------
        >>> ag.corpus.Histogram((), [0.0, 0.5, 1.0]).update(np.array([0.1, 0.2, 0.7, 0.8])).density()
        array([1., 1.])
        """
        total = self.counts.sum(-1) + self.underflow + self.overflow
        t = np.where(total > 0, total, 1)[..., None]
        return self.counts / t / np.diff(self.edges)
