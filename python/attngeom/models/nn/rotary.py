"""The rotary position embedding (RoPE) of Llama-family checkpoints, in NumPy.

Su et al. (RoFormer), in the "rotate_half" convention of Hugging Face checkpoints: a head
vector x (d_head even) is split into halves (a, b) = (x[:d/2], x[d/2:]); at position m pair p
rotates by the angle m theta_p,

    a'_p = a_p cos(m theta_p) - b_p sin(m theta_p),   b'_p = b_p cos(m theta_p) + a_p sin(m theta_p),

i.e. x' = x R(m) with R(m) orthogonal and R(i) R(j)^T = R(i - j). Queries and keys are both
rotated, so the logit of query position i and key position j is q_i R(i - j) k_j^T: the
bilinear form of a rotary head depends on the offset i - j and equals the position-free
W_Q W_K^T only at offset 0.

Frequencies theta_p = rope_theta^(-2p / d_head), with the ``linear`` (divide by factor),
``llama3`` (Llama 3.1: low frequencies divided by factor, high ones kept, a smooth
interpolation between) and ``yarn`` (YaRN, Peng et al.: frequencies below the correction
range divided by factor, above it kept, a linear ramp between, in rotary-pair index; the
rotated vectors are multiplied by an attention factor, 0.1 ln(factor) + 1 or the mscale
ratio DeepSeek-V2 configures, :func:`yarn_factors`) rescalings. DeepSeek-V2 (:mod:`.mla`)
pairs neighbours instead, (x[2p], x[2p + 1]) (the complex-number convention,
``Rotary(..., interleaved=True)``); the rotation by m theta_p of each pair is the same.
Angles are computed in float64 (transformers computes
them in float32; the difference is below the float32 tolerance).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Tuple

import numpy as np

from ... import _core


def rope_frequencies(rope: dict, d_head: int) -> np.ndarray:
    """The rotation frequencies theta_p of a rotary model, float64 (d_head / 2,).

    Parameters
    ----------
    rope : dict
        {"rope_type": "default" | "linear" | "llama3" | "yarn", "rope_theta": base, and
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
        "beta_fast", "beta_slow", "truncate" as the type needs} (as :attr:`Architecture.rope`).
    d_head : int
        Head width (even).

    Returns
    -------
    ndarray, shape (d_head // 2,)
        theta_p in radians per position, float64.

    Examples
    --------
    >>> from attngeom.models.nn.rotary import rope_frequencies
    >>> rope_frequencies({"rope_type": "default", "rope_theta": 10000.0}, 4)
    array([1.  , 0.01])
    """
    if d_head % 2:
        raise ValueError(f"rotary embedding needs an even d_head, got {d_head}")
    base = float(rope["rope_theta"])
    inv = 1.0 / base ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(rope["factor"])
    elif kind == "llama3":
        factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        factor, old = float(rope["factor"]), float(rope["original_max_position_embeddings"])
        beta_fast, beta_slow = float(rope.get("beta_fast") or 32), float(rope.get("beta_slow") or 1)

        def correction(rotations):  # the pair index whose wavelength makes `rotations` turns in `old`
            return d_head * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction(beta_fast), correction(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d_head - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d_head // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        inv = inv / factor * ramp + inv * (1 - ramp)
    elif kind != "default":
        raise ValueError(f"rope_type must be 'default', 'linear', 'llama3' or 'yarn', got {kind!r}")
    return inv


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_factors(rope: dict) -> Tuple[float, float]:
    """YaRN's two scalars: the factor rotated queries and keys are multiplied by, and
    DeepSeek-V2's extra logit scale (both 1 for the other rope types).

    The attention factor is ``attention_factor`` when the config gives it, else
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set (DeepSeek-V2),
    else mscale(factor), with mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1). The logit scale
    mscale(factor, mscale_all_dim)^2 multiplies 1 / sqrt(d_qk) of multi-head latent
    attention when ``mscale_all_dim`` is set (transformers' ``yarn_apply_mscale``; the other
    families do not use it). As transformers computes them.

    Parameters
    ----------
    rope : dict
        As :attr:`Architecture.rope`.

    Returns
    -------
    attention_factor, logit_scale : float
        The two factors.

    Examples
    --------
    >>> from attngeom.models.nn.rotary import yarn_factors
    >>> [round(f, 4) for f in yarn_factors({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})]
    [1.1386, 1.0]
    >>> [round(f, 4) for f in yarn_factors({"rope_type": "yarn", "factor": 40.0, "mscale": 0.707,
    ...                                     "mscale_all_dim": 0.707})]
    [1.0, 1.5896]
    >>> yarn_factors({"rope_type": "default", "rope_theta": 1e4})
    (1.0, 1.0)
    """
    if rope.get("rope_type", "default") != "yarn":
        return 1.0, 1.0
    factor, mscale, all_dim = float(rope["factor"]), rope.get("mscale"), rope.get("mscale_all_dim")
    logit_scale = _yarn_mscale(factor, float(all_dim)) ** 2 if all_dim else 1.0
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"]), logit_scale
    if mscale and all_dim:
        return _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(all_dim)), logit_scale
    return _yarn_mscale(factor), logit_scale


@dataclass(frozen=True)
class Rotary:
    """A rotary embedding: its frequencies (module docstring) and how it rotates.

    Attributes
    ----------
    inv_freq : ndarray, shape (d_head // 2,)
        theta_p, float64.
    interleaved : bool, default False
        Pairs (x[2p], x[2p + 1]) (DeepSeek-V2) instead of rotate_half's (x[p], x[p + d/2]).
    attention_factor : float, default 1.0
        Multiplies cos and sin, so rotated vectors are scaled by it (YaRN,
        :func:`yarn_factors`); :meth:`matrix` is the rotation alone.

    Examples
    --------
    >>> from attngeom.models.nn.rotary import Rotary
    >>> r = Rotary(np.array([1.0, 0.01]))
    >>> x = np.array([[1.0, 0.0, 0.0, 0.0]])
    >>> np.round(r.rotate(x, np.array([1])), 4)
    array([[0.5403, 0.    , 0.8415, 0.    ]])
    >>> np.round(Rotary(np.array([1.0, 0.01]), interleaved=True).rotate(x, np.array([1])), 4)
    array([[0.5403, 0.8415, 0.    , 0.    ]])
    """

    inv_freq: np.ndarray
    interleaved: bool = False
    attention_factor: float = 1.0

    @property
    def d_head(self) -> int:
        """The head width, 2 * len(inv_freq)."""
        return 2 * self.inv_freq.shape[0]

    def cos_sin(self, positions, dtype=np.float64):
        """cos and sin of the angles m theta_p, each (..., d_head) for positions (...).

        Parameters
        ----------
        positions : array_like of int
            Token positions, any shape.
        dtype : numpy dtype, default float64
            dtype of the result (the angles are computed in float64).

        Returns
        -------
        cos, sin : ndarray, shape positions.shape + (d_head,)
            The halves repeated: [cos(m theta), cos(m theta)] (interleaved: each angle twice
            in a row).

        Examples
        --------
        >>> from attngeom.models.nn.rotary import Rotary
        >>> c, s = Rotary(np.array([1.0])).cos_sin(np.array([0, 1]))
        >>> c.shape
        (2, 2)
        """
        angles = np.asarray(positions, dtype=np.float64)[..., None] * self.inv_freq
        angles = np.repeat(angles, 2, axis=-1) if self.interleaved else np.concatenate([angles, angles], axis=-1)
        a = self.attention_factor
        cos, sin = (np.cos(angles), np.sin(angles)) if a == 1 else (a * np.cos(angles), a * np.sin(angles))
        return cos.astype(dtype, copy=False), sin.astype(dtype, copy=False)

    def rotate(self, x, positions=None, *, cos_sin=None) -> np.ndarray:
        """x R(m): rotate head vectors x (..., n, d_head) at positions (..., n) (broadcasting).

        Parameters
        ----------
        x : ndarray, shape (..., n, d_head)
            Queries or keys, one per row.
        positions : array_like of int, shape broadcastable to (..., n)
            The position of every row.
        cos_sin : (ndarray, ndarray), optional
            :meth:`cos_sin` of the positions in x's dtype, computed once for many calls at
            the same positions (`positions` is then not read).

        Returns
        -------
        ndarray
            The rotated vectors, x's shape and dtype (float32 stays float32).

        Examples
        --------
        >>> from attngeom.models.nn.rotary import Rotary
        >>> Rotary(np.array([0.5])).rotate(np.array([[1.0, 0.0]]), np.array([0])).tolist()
        [[1.0, 0.0]]
        """
        x = np.asarray(x)
        if x.shape[-1] != self.d_head:
            raise ValueError(f"x must have shape (..., n, {self.d_head}), got {x.shape}")
        cos, sin = self.cos_sin(positions, x.dtype if x.dtype.kind == "f" else np.float64) if cos_sin is None else cos_sin
        if (x.ndim == 3 and x.dtype == cos.dtype == sin.dtype == np.float32 and
                cos.shape == sin.shape == (x.shape[0], 1, x.shape[2])):  # a block of tokens' heads: one pass of the core
            return _core.rotate_half(np.ascontiguousarray(x), np.ascontiguousarray(cos[:, 0]),
                                     np.ascontiguousarray(sin[:, 0]), self.interleaved)
        if self.interleaved:  # (a, b) -> (-b, a) within each neighbour pair
            rotated_half = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
        else:
            h = self.d_head // 2
            rotated_half = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return x * cos + rotated_half * sin

    def matrix(self, offset) -> np.ndarray:
        """R(offset), the (d_head, d_head) orthogonal matrix with rotate(x, m) = x @ R(m)
        (times attention_factor).

        Parameters
        ----------
        offset : int or float
            A position or a position difference (R(i) R(j)^T = R(i - j)).

        Returns
        -------
        ndarray, shape (d_head, d_head)
            float64.

        Examples
        --------
        >>> from attngeom.models.nn.rotary import Rotary
        >>> R = Rotary(np.array([1.0, 0.01])).matrix(3)
        >>> bool(np.allclose(R @ R.T, np.eye(4)))
        True
        """
        c, s = np.cos(float(offset) * self.inv_freq), np.sin(float(offset) * self.inv_freq)
        h = self.d_head // 2
        R = np.zeros((self.d_head, self.d_head))
        p = np.arange(h)
        a, b = (2 * p, 2 * p + 1) if self.interleaved else (p, p + h)
        R[a, a] = c
        R[b, b] = c
        R[a, b] = s
        R[b, a] = -s
        return R


class RotaryPairs(NamedTuple):
    """A rotary head's bilinear form split by frequency pair (see :func:`rotary_pairs`).

    Attributes
    ----------
    frequencies : ndarray, shape (P,)
        theta_p, P = d_head / 2.
    W_Q, W_K : ndarray, shape (P, d_model, 2)
        The columns (p, p + P) of W_Q and W_K: B_p(delta) = W_Q[p] R_2(delta theta_p) W_K[p]^T.
    singular_values : ndarray, shape (P, 2)
        The singular values of B_p(delta), descending.
    offset : float
        delta.
    """

    frequencies: np.ndarray
    W_Q: np.ndarray
    W_K: np.ndarray
    singular_values: np.ndarray
    offset: float


def rotary_pairs(W_Q, W_K, inv_freq, *, offset: float = 0) -> RotaryPairs:
    """The bilinear form of a rotary head as a sum over RoPE's 2x2 rotation blocks.

    B(delta) = W_Q R(delta) W_K^T = sum_p W_Q[:, (p, p+P)] R_2(delta theta_p) W_K[:, (p, p+P)]^T,
    R_2(a) = [[cos a, sin a], [-sin a, cos a]], one rank <= 2 term per frequency pair (P =
    d_head / 2, the rotate_half pairing). Low-frequency pairs barely change with the offset
    (position-free content matching), high-frequency ones oscillate (positional heads).

    Parameters
    ----------
    W_Q, W_K : array_like, shape (d_model, d_head)
        One head's query and key weights (q = x W_Q).
    inv_freq : array_like, shape (d_head / 2,)
        The frequencies theta_p (:func:`rope_frequencies`).
    offset : float, default 0
        delta = i - j, query position minus key position.

    Returns
    -------
    RotaryPairs
        Frequencies, per-pair factors and the singular values of each B_p(delta).

    Examples
    --------
    >>> from attngeom.models.nn.rotary import rotary_pairs
    >>> rng = np.random.default_rng(0)
    >>> wq, wk = rng.standard_normal((2, 8, 4))
    >>> r = rotary_pairs(wq, wk, np.array([1.0, 0.1]), offset=3)
    >>> r.singular_values.shape
    (2, 2)
    """
    wq, wk = np.asarray(W_Q, dtype=np.float64), np.asarray(W_K, dtype=np.float64)
    theta = np.asarray(inv_freq, dtype=np.float64)
    P = theta.shape[0]
    if wq.ndim != 2 or wq.shape != wk.shape or wq.shape[1] != 2 * P:
        raise ValueError(f"W_Q and W_K must both have shape (d_model, {2 * P}), got {wq.shape} and {wk.shape}")
    idx = np.stack([np.arange(P), np.arange(P) + P], axis=1)  # (P, 2)
    fq = np.ascontiguousarray(wq[:, idx].transpose(1, 0, 2))  # (P, d_model, 2)
    fk = np.ascontiguousarray(wk[:, idx].transpose(1, 0, 2))
    c, s = np.cos(offset * theta), np.sin(offset * theta)
    rot = np.stack([np.stack([c, s], -1), np.stack([-s, c], -1)], -2)  # (P, 2, 2)
    # singular values of (Qq Rq) rot (Qk Rk)^T are those of the 2x2 core Rq rot Rk^T
    rq, rk = np.linalg.qr(fq)[1], np.linalg.qr(fk)[1]
    sv = np.linalg.svd(rq @ rot @ np.swapaxes(rk, -1, -2), compute_uv=False)
    return RotaryPairs(theta, fq, fk, sv, float(offset))
