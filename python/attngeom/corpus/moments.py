"""Mergeable means and covariances: :class:`Moments` (Chan, Golub and LeVeque pairwise updates).

A stack of accumulators (one per head, shape ``shape``) of vectors of length ``dim`` keeps the
count n, the mean and the co-moment M2 = sum_j (x_j - mean)(x_j - mean)^T (or only its
diagonal). Two accumulators combine exactly up to rounding:

    n = n_a + n_b,  delta = mean_b - mean_a,
    mean = mean_a + delta n_b / n,
    M2 = M2_a + M2_b + delta delta^T n_a n_b / n,

so a corpus split into any partitions gives the single-pass mean and covariance to a few ulps
(no sum-of-squares cancellation). A batch is added as a merge of its own two-pass moments.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np


class Moments:
    """Count, mean and co-moment of vectors, for a stack of accumulators.

    Parameters
    ----------
    shape : tuple of int
        The stack (e.g. (n_layers, n_heads)).
    dim : int
        The vector length (1 for scalars).
    full : bool, default True
        Keep the full (dim, dim) co-moment; False keeps its diagonal (variances only).

    Examples
    --------
    >>> m = ag.corpus.Moments((2,), 3).update(np.ones((2, 5, 3)))
    >>> m.count.tolist(), m.covariance().shape
    ([5, 5], (2, 3, 3))
    """

    def __init__(self, shape: Tuple[int, ...], dim: int, *, full: bool = True):
        self.shape, self.dim, self.full = tuple(shape), int(dim), bool(full)
        self.count = np.zeros(self.shape, dtype=np.int64)
        self.mean = np.zeros(self.shape + (self.dim,))
        self.m2 = np.zeros(self.shape + ((self.dim, self.dim) if self.full else (self.dim,)))

    def _combine(self, n_b, mean_b, m2_b) -> None:
        n_a = self.count.astype(np.float64)
        n_b = np.asarray(n_b)
        n = n_a + n_b
        safe = np.where(n > 0, n, 1.0)
        delta = mean_b - self.mean
        w = (n_b / safe)[..., None]
        self.mean = np.where(n[..., None] > 0, self.mean + delta * w, 0.0)
        c = (n_a * n_b / safe)[..., None]
        if self.full:
            self.m2 = self.m2 + m2_b + (delta[..., :, None] * delta[..., None, :]) * c[..., None]
        else:
            self.m2 = self.m2 + m2_b + delta * delta * c
        self.count = self.count + n_b.astype(np.int64)

    def update(self, x, weight=None) -> "Moments":
        """Add the rows of x, shape (\\*shape, n, dim) (or (\\*shape, n) when dim is 1).

        Parameters
        ----------
        x : ndarray, shape (\\*shape, n, dim)
            The new vectors of every accumulator.
        weight : ndarray of bool, shape (\\*shape, n), optional
            Which rows to count (default all).

        Returns
        -------
        Moments
            self, with the rows of x counted.

        Examples
        --------
        >>> ag.corpus.Moments((), 1).update(np.array([1.0, 2.0, 3.0])).variance(ddof=1)
        array([1.])
        """
        x = np.asarray(x, dtype=np.float64)
        if self.dim == 1 and x.shape == self.shape + x.shape[len(self.shape):] and x.ndim == len(self.shape) + 1:
            x = x[..., None]
        if x.shape[:len(self.shape)] != self.shape or x.ndim != len(self.shape) + 2 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape {self.shape + ('n', self.dim)}, got {x.shape}")
        if weight is None:
            w = np.ones(x.shape[:-1], dtype=bool)
        else:
            w = np.broadcast_to(np.asarray(weight, dtype=bool), x.shape[:-1])
        n_b = w.sum(-1).astype(np.float64)
        if not np.any(n_b):
            return self
        xw = np.where(w[..., None], x, 0.0)
        mean_b = xw.sum(-2) / np.where(n_b > 0, n_b, 1.0)[..., None]
        c = np.where(w[..., None], x - mean_b[..., None, :], 0.0)
        m2_b = np.swapaxes(c, -1, -2) @ c if self.full else np.sum(c * c, axis=-2)
        self._combine(n_b, mean_b, m2_b)
        return self

    def merge(self, other: "Moments") -> "Moments":
        """Add another accumulator of the same shape; returns self.

        Parameters
        ----------
        other : Moments
            Moments of other data.

        Returns
        -------
        Moments
            self, with other's data added.

        Examples
        --------
        >>> a = ag.corpus.Moments((), 1).update(np.array([1.0, 2.0]))
        >>> a.merge(ag.corpus.Moments((), 1).update(np.array([3.0]))).mean
        array([2.])
        """
        if not isinstance(other, Moments):
            raise TypeError(f"other must be a Moments, got {type(other).__name__}")
        if (other.shape, other.dim, other.full) != (self.shape, self.dim, self.full):
            raise ValueError(f"other has shape {other.shape}, dim {other.dim}, full {other.full}; this accumulator "
                             f"{self.shape}, {self.dim}, {self.full}")
        self._combine(other.count.astype(np.float64), other.mean, other.m2)
        return self

    def covariance(self, ddof: int = 0) -> np.ndarray:
        """The covariance M2 / (n - ddof), shape (\\*shape, dim, dim) (or (\\*shape, dim));
        zero where n <= ddof.

        Parameters
        ----------
        ddof : int, default 0
            Delta degrees of freedom.

        Returns
        -------
        ndarray
            The covariances (variances when ``full`` is False).

        Examples
        --------
        >>> ag.corpus.Moments((), 2).update(np.array([[0.0, 0.0], [2.0, 2.0]])).covariance()
        array([[1., 1.],
               [1., 1.]])
        """
        d = self.count.astype(np.float64) - ddof
        scale = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
        return self.m2 * scale.reshape(scale.shape + (1,) * (self.m2.ndim - scale.ndim))

    def variance(self, ddof: int = 0) -> np.ndarray:
        """The variances, shape (\\*shape, dim).

        Parameters
        ----------
        ddof : int, default 0
            As for :meth:`covariance`.

        Returns
        -------
        ndarray
            The diagonal of :meth:`covariance`.

        Examples
        --------
        >>> ag.corpus.Moments((), 1).update(np.array([0.0, 2.0])).variance()
        array([1.])
        """
        c = self.covariance(ddof)
        return np.diagonal(c, axis1=-2, axis2=-1).copy() if self.full else c
