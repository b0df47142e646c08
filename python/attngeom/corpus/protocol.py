"""The protocol of corpus statistics: :class:`Batch` (what a statistic sees) and :class:`Statistic`.

A corpus statistic is a small state with three methods,

* ``update(batch)`` adds one forward pass over a batch of texts,
* ``merge(other)`` adds the state of other texts (associative and commutative, exact up to
  rounding: :class:`Moments` for means and covariances, :class:`Histogram` for counts),
* ``result()`` gives named arrays,

and is pickleable and small: O(d_head^2) per head, never O(tokens). :class:`Mergeable` is that
protocol as a runtime-checkable type (``ag.TiltCoverage`` fits it too); :class:`Statistic`
implements ``merge`` once for states made of such parts, allocated on the first update
(when the model's shape is known).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, Optional, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Mergeable(Protocol):
    """Anything with ``update``, ``merge`` and ``result`` (a mergeable streaming statistic)."""

    def update(self, batch): ...  # pragma: no cover

    def merge(self, other): ...  # pragma: no cover

    def result(self): ...  # pragma: no cover


@dataclass
class Batch:
    """One forward pass over right-padded texts, in the layout of :class:`attngeom.models.Forward`.

    Attributes
    ----------
    forward : Forward
        The model's outputs with a batch axis: q, k (n_layers, b, n_heads, n, d_head),
        pattern (n_layers, b, n_heads, n, n), attn_in (n_layers, b, n, d_model).
    lengths : ndarray of int, shape (b,)
        Tokens of each text (positions 0 .. length - 1 are real, the rest padding).
    """

    forward: object
    lengths: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """(b, n) True at real tokens."""
        n = self.forward.positions.shape[-1]
        return np.arange(n)[None, :] < self.lengths[:, None]

    @property
    def n_tokens(self) -> int:
        """The number of real tokens."""
        return int(self.lengths.sum())

    def head_tokens(self, a: np.ndarray) -> np.ndarray:
        """(n_layers, b, n_heads, n, ...) -> (n_layers, n_heads, n_tokens, ...): the real tokens of
        every head, text after text."""
        return np.moveaxis(a, 2, 1)[:, :, self.mask]


def _merge_value(a, b):
    """a merged with b: parts with a merge method, object arrays of them, or numbers."""
    if hasattr(a, "merge"):
        return a.merge(b)
    if isinstance(a, np.ndarray) and a.dtype == object:
        for x, y in zip(a.ravel(), b.ravel()):
            x.merge(y)
        return a
    return a + b


class Statistic:
    """Base of the corpus statistics: configuration, lazy state, generic merge.

    Subclasses set ``name`` and ``fields`` (the :class:`attngeom.models.Forward` fields they
    read: the forward pass keeps only those), keep their settings in ``__init__`` (returned by
    :meth:`config`), build their state in ``_new(batch)`` (a dict of :class:`Moments`,
    :class:`Histogram`, object arrays of mergeables, or numbers), add a batch in
    ``_update(batch)`` and compute named arrays in ``result()``.
    """

    name = "statistic"
    #: The Forward fields ``update`` reads; None (a statistic that does not say) keeps the
    #: forward pass's default fields.
    fields = None

    def __init__(self):
        self.state: Optional[Dict[str, object]] = None

    def config(self) -> dict:
        """The settings the statistic was made with (a new empty one is ``type(s)(**s.config())``)."""
        return {}

    def empty(self) -> "Statistic":
        """A new statistic with the same settings and no data."""
        return type(self)(**self.config())

    def _new(self, batch: Batch) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _update(self, batch: Batch) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, batch: Batch) -> "Statistic":
        """Add one :class:`Batch`; returns self."""
        if not isinstance(batch, Batch):
            raise TypeError(f"batch must be a Batch, got {type(batch).__name__}")
        if self.state is None:
            self.state = self._new(batch)
        self._update(batch)
        return self

    def merge(self, other: "Statistic") -> "Statistic":
        """Add another state of the same statistic and settings; returns self."""
        if type(other) is not type(self):
            raise TypeError(f"other must be a {type(self).__name__}, got {type(other).__name__}")
        if not _same(other.config(), self.config()):
            raise ValueError(f"other has settings {other.config()}, this {self.name} statistic {self.config()}")
        if other.state is None:
            return self
        if self.state is None:
            self.state = copy.deepcopy(other.state)
            return self
        self.state = {k: _merge_value(v, other.state[k]) for k, v in self.state.items()}
        return self

    def result(self, **context) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _require(self):
        if self.state is None:
            raise ValueError(f"the {self.name} statistic has seen no tokens")


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
