"""Generation with a key/value cache in the NumPy forward pass.

``Model.generate(ids, n_new)`` runs the prompt once (prefill), keeping every layer's keys and
values as the attention uses them (rotated, one per query head under grouped-query attention;
for multi-head latent attention the keys and values expanded from the latent), then one token
at a time: :meth:`attngeom.models.Decoder.step` computes only the new position's queries, keys,
values and MLP, attending to the cache (the causal band aligned at the end, sliding-window
layers seeing the last ``sliding_window`` positions), with positions continuing the prompt's.

The next token is the argmax of the last logits at temperature 0 (ties to the lowest id), or
drawn from softmax(logits / T) with ``np.random.default_rng(seed)``.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np


class KVCache:
    """The keys and values of every layer for the tokens run so far.

    Buffers of ``capacity`` positions are allocated at each layer's first write (batch, heads,
    capacity, d), so appending a token copies nothing already cached.

    Parameters
    ----------
    n_layers : int
        Number of layers.
    capacity : int
        The most tokens the cache will hold (prompt plus new tokens).

    Attributes
    ----------
    length : int
        Tokens cached (the position of the next token).

    Examples
    --------
    >>> import numpy as np
    >>> from attngeom.models.nn.generate import KVCache
    >>> cache = KVCache(n_layers=1, capacity=4)
    >>> k, v = cache.extend(0, np.ones((1, 2, 3, 8)), np.ones((1, 2, 3, 8)))
    >>> cache.advance(3)
    >>> k, v = cache.extend(0, np.zeros((1, 2, 1, 8)), np.zeros((1, 2, 1, 8)))
    >>> k.shape, cache.length
    ((1, 2, 4, 8), 3)
    """

    def __init__(self, n_layers: int, capacity: int):
        self.capacity = int(capacity)
        self.length = 0
        self._k: List[Optional[np.ndarray]] = [None] * n_layers
        self._v: List[Optional[np.ndarray]] = [None] * n_layers

    def extend(self, layer: int, k: np.ndarray, v: np.ndarray):
        """Write the new tokens' keys and values of one layer after the cached ones.

        Parameters
        ----------
        layer : int
            The layer.
        k, v : ndarray, shapes (batch, heads, m, d_k), (batch, heads, m, d_v)
            The new tokens' keys and values as the attention uses them.

        Returns
        -------
        k, v : ndarray, shapes (batch, heads, length + m, d_k), (batch, heads, length + m, d_v)
            Every cached token's keys and values, the new ones last (views of the buffers).
        """
        start, end = self.length, self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KVCache: {end} tokens, beyond its capacity of {self.capacity}")
        if self._k[layer] is None:
            self._k[layer] = np.empty(k.shape[:2] + (self.capacity, k.shape[3]), k.dtype)
            self._v[layer] = np.empty(v.shape[:2] + (self.capacity, v.shape[3]), v.dtype)
        self._k[layer][:, :, start:end] = k
        self._v[layer][:, :, start:end] = v
        return self._k[layer][:, :, :end], self._v[layer][:, :, :end]

    def advance(self, m: int) -> None:
        """Count m more tokens as cached (after every layer's :meth:`extend`)."""
        self.length += int(m)


def next_tokens(logits: np.ndarray, temperature: float, rng: Optional[np.random.Generator]) -> np.ndarray:
    """The next token of each sequence from its last logits.

    Parameters
    ----------
    logits : ndarray, shape (batch, vocab)
        The logits at the last position.
    temperature : float
        0: the argmax (ties to the lowest id); > 0: a draw from softmax(logits / temperature).
    rng : numpy.random.Generator, optional
        The draws' generator (needed when temperature > 0).

    Returns
    -------
    ndarray of int64, shape (batch,)
        The chosen ids.

    Examples
    --------
    >>> import numpy as np
    >>> from attngeom.models.nn.generate import next_tokens
    >>> next_tokens(np.array([[0.0, 2.0, 2.0]]), 0.0, None)
    array([1])
    >>> int(next_tokens(np.array([[0.0, 50.0, 0.0]]), 1.0, np.random.default_rng(0))[0])
    1
    """
    if temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    c = np.cumsum(p, axis=-1)
    u = rng.random(logits.shape[0]) * c[:, -1]
    picks = [np.searchsorted(c[i], u[i], side="right") for i in range(logits.shape[0])]
    return np.minimum(np.asarray(picks, dtype=np.int64), logits.shape[-1] - 1)


def generate(decoder, ids: np.ndarray, n_new: int, dtype, temperature: float = 0.0,
             seed=None) -> np.ndarray:
    """Greedy or sampled continuation of checked prompts with a key/value cache.

    Parameters
    ----------
    decoder : Decoder
        The network (a causal decoder with an unembedding).
    ids : ndarray of int, shape (batch, n)
        The prompts, checked against the vocabulary, every token real.
    n_new : int
        Tokens to generate, >= 1 (checked by the caller against the context).
    dtype : numpy dtype or "bfloat16"
        float32 or float64, the computation dtype, or "bfloat16" (:meth:`Model.forward`).
    temperature : float, default 0.0
        0: greedy; > 0: sampling from softmax(logits / temperature).
    seed : int or None
        Seed of ``np.random.default_rng`` for sampling.

    Returns
    -------
    ndarray of int64, shape (batch, n + n_new)
        The prompts followed by the generated tokens.

    Examples
    --------
    >>> out = generate(model.decoder, np.array([[1, 2, 3]]), 5, np.float32)  # doctest: +SKIP
    >>> out.shape  # doctest: +SKIP
    (1, 8)
    """
    b, n = ids.shape
    rng = np.random.default_rng(seed) if temperature > 0 else None
    cache = KVCache(decoder.arch.n_layers, n + n_new)
    out = np.empty((b, n + n_new), dtype=np.int64)
    out[:, :n] = ids
    logits = decoder.step(ids.astype(np.int64), cache, dtype)  # prefill: the whole prompt
    for t in range(n, n + n_new):
        out[:, t] = next_tokens(logits, temperature, rng)
        if t + 1 < n + n_new:
            logits = decoder.step(out[:, t:t + 1], cache, dtype)
    return out
