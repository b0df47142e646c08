"""Latent rank of a model's key cache and its Eckart-Young reconstruction error (MLA).

The notes' "multi-head latent attention" section reads MLA as a factorisation of the key
matrix K = U Z through a latent code of width d_latent, and states the **Proposition
(spectral error bound)**: for the best rank-r approximation K_r of K,

    ||K - K_r||_F^2 = sum_{i > r} sigma_i^2,

the tail energy of K's singular values (Eckart-Young-Mirsky). DeepSeek-V2 learns such a
factorisation; here it is measured on the key cache of any supported model: for each layer,
K stacks the keys of every token of a prompt over the key/value heads, K (n, n_kv_heads *
d_head) (the cache a decoder stores; grouped-query heads counted once). Its singular values
give the latent rank (numerical rank, and the energy effective rank), the tail energies
``errors[l, r]`` = ||K - K_r||_F^2 for every r, and, for a chosen rank, the factorisation
itself from :func:`attngeom.latent_factorization`, whose error is computed from U Z and
equals the tail (the proposition, checked in the tests).

**Multi-head latent attention** (DeepSeek-V2, :mod:`.mla`): the model's cache is the
latent c_KV (n, d_c) itself, and the expanded key cache is K = [c_KV W_UK,h | k_R]_h (the
content keys of every head, and the shared rotary key). The result then also holds c_KV,
its singular values, numerical and effective rank, and ``latent_errors[l, r]`` =
||K - K^_r||_F^2, the error of the key cache rebuilt from the best rank-r latent c_r
(K^_r = [c_r W_UK,h | k_R]_h). With c = sum_i s_i u_i v_i^T it is
sum_{i > r} s_i^2 ||v_i^T W_UK||^2, so it is 0 for r >= rank(c_KV), at most
||W_UK||_2^2 sum_{i > r} s_i^2, and, K^_r having rank <= r + qk_rope_head_dim, at least
the Eckart-Young error ``errors[l, r + qk_rope_head_dim]`` (all three checked in the tests).
rank(K) <= rank(c_KV) + qk_rope_head_dim, with or without the rotation: the decoupled RoPE
keeps the cache's latent rank.

``rotary=False`` takes the keys before the rotary embedding: the notes' practice-agenda
challenge compares the latent rank with and without the position rotation (the rotation
mixes positions into K and raises its rank; DeepSeek-V2 keeps a separate rotary part for
this reason). Keys include their bias (K = x W_K + b_K), so a rank-r W_K gives rank <= r + 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..._docstrings import fill_doc
from ..._operands import count, rtol_arg
from ...circuits import LatentFactorization, latent_factorization
from ...spectral import effective_rank, singular_values, spectrum_rank
from .prompt import encode_prompt, resolve_model


@dataclass
class LatentKeyCache:
    """Spectra and Eckart-Young errors of every layer's key cache (module docstring).

    Attributes
    ----------
    keys : ndarray, shape (n_layers, n, n_kv_heads * d_head)
        The key cache K of every layer.
    singular_values : ndarray, shape (n_layers, k)
        Singular values of K, k = min(n, n_kv_heads * d_head).
    rank : ndarray of int, shape (n_layers,)
        Numerical rank (singular values > rtol * sigma_max).
    effective_rank : ndarray, shape (n_layers,)
        Energy effective rank of the spectrum.
    errors : ndarray, shape (n_layers, k + 1)
        errors[l, r] = sum_{i > r} sigma_i^2 = ||K - K_r||_F^2 (r = 0 .. k).
    relative_errors : ndarray, shape (n_layers, k + 1)
        errors / ||K||_F^2.
    factorizations : list of LatentFactorization or None
        The rank-``latent_rank`` factorisation K ~ U Z of every layer, when a rank was given.
    latent_rank : int or None
        That rank.
    rotary : bool
        Whether the keys are rotated (the cache of a rotary model) or taken before RoPE.
    tokens : list of str or None
        The prompt's token strings.
    kv_latent : ndarray, shape (n_layers, n, kv_lora_rank) or None
        MLA models: the latent c_KV each layer caches (None for other models).
    kv_latent_singular_values : ndarray, shape (n_layers, min(n, kv_lora_rank)) or None
        Its singular values.
    kv_latent_rank : ndarray of int, shape (n_layers,) or None
        Its numerical rank (same rtol rule as ``rank``).
    kv_latent_effective_rank : ndarray, shape (n_layers,) or None
        Its energy effective rank.
    latent_errors : ndarray, shape (n_layers, min(n, kv_lora_rank) + 1) or None
        latent_errors[l, r] = ||K - K^_r||_F^2, the key cache rebuilt from the rank-r
        truncation of c_KV (module docstring).
    """

    keys: np.ndarray = field(repr=False)
    singular_values: np.ndarray = field(repr=False)
    rank: np.ndarray
    effective_rank: np.ndarray
    errors: np.ndarray = field(repr=False)
    relative_errors: np.ndarray = field(repr=False)
    factorizations: Optional[List[LatentFactorization]] = field(default=None, repr=False)
    latent_rank: Optional[int] = None
    rotary: bool = True
    tokens: Optional[List[str]] = field(default=None, repr=False)
    kv_latent: Optional[np.ndarray] = field(default=None, repr=False)
    kv_latent_singular_values: Optional[np.ndarray] = field(default=None, repr=False)
    kv_latent_rank: Optional[np.ndarray] = None
    kv_latent_effective_rank: Optional[np.ndarray] = None
    latent_errors: Optional[np.ndarray] = field(default=None, repr=False)

    def rank_for(self, relative_error: float) -> np.ndarray:
        """The smallest latent rank per layer whose relative error is <= relative_error.

        Parameters
        ----------
        relative_error : float
            Target ||K - K_r||_F^2 / ||K||_F^2, in [0, 1].

        Returns
        -------
        ndarray of int, shape (n_layers,)
            The rank r per layer.

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> cache = ag.latent_key_cache(planted_induction_model("planted"), np.arange(1, 21))
        >>> cache.rank_for(0.0).tolist() == cache.rank.tolist()
        True
        """
        if isinstance(relative_error, bool) or not isinstance(relative_error, (int, float, np.floating)) \
                or not 0 <= relative_error <= 1:
            raise ValueError(f"relative_error must be a number in [0, 1], got {relative_error!r}")
        eps = 64 * np.finfo(self.relative_errors.dtype).eps
        return np.argmax(self.relative_errors <= relative_error + eps, axis=-1)

    def summary(self) -> dict:
        """Named scalars per layer: rank, effective rank, and the rank for 1% relative error."""
        out = {"n_layers": int(self.rank.size), "rotary": self.rotary}
        r1 = self.rank_for(0.01)
        for layer in range(self.rank.size):
            out[f"rank_L{layer}"] = int(self.rank[layer])
            out[f"effective_rank_L{layer}"] = float(self.effective_rank[layer])
            out[f"rank_1pct_L{layer}"] = int(r1[layer])
            if self.kv_latent_rank is not None:
                out[f"kv_latent_rank_L{layer}"] = int(self.kv_latent_rank[layer])
                out[f"kv_latent_effective_rank_L{layer}"] = float(self.kv_latent_effective_rank[layer])
        return out

    @fill_doc
    def plot(self, ax=None):
        """Relative reconstruction error ||K - K_r||_F^2 / ||K||_F^2 against r, one curve a layer.

        Parameters
        ----------
        %(ax)s

        %(figure_returns)s

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> cache = ag.latent_key_cache(planted_induction_model("planted"), np.arange(1, 21))
        >>> cache.plot().axes[0].get_yscale()
        'log'
        """
        from ... import plotting

        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3.4))
        r = np.arange(self.errors.shape[1])
        for layer, e in enumerate(self.relative_errors):
            shown, _ = plotting.log_floor(e)
            ax.semilogy(r, shown, lw=1, label=f"layer {layer}")
        ax.set_xlabel("latent rank r")
        ax.set_ylabel(r"$\|K - K_r\|_F^2 / \|K\|_F^2$")
        ax.set_title("key cache: Eckart-Young error" + ("" if self.rotary else " (before RoPE)"), fontsize=9)
        if self.errors.shape[0] <= 12:
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


def latent_key_cache(model, prompt, *, rank: Optional[int] = None, rotary: bool = True, rtol=None) -> LatentKeyCache:
    """Latent rank and Eckart-Young reconstruction error of every layer's key cache.

    The notes' MLA section and "Proposition (spectral error bound)" (module docstring):
    ||K - K_r||_F^2 = sum_{i > r} sigma_i^2 for K (n, n_kv_heads * d_head), the keys of
    the prompt's tokens stacked over key/value heads. For multi-head latent attention
    (DeepSeek-V2) also the latent rank of the cached c_KV and the error of the key cache
    rebuilt from its truncations (``latent_errors``).

    Parameters
    ----------
    model : Model or str or path-like
        A model (decoder or BERT) or its checkpoint.
    prompt : str or array_like of int, shape (n,)
        A text or token ids.
    rank : int, optional
        A latent rank r: the rank-r factorisation K ~ U Z of every layer
        (:func:`attngeom.latent_factorization`) is returned too.
    rotary : bool, default True
        Keys after the rotary embedding (the cache); False takes them before it.
    rtol : float, optional
        Rank threshold relative to sigma_max (default max(n, width) * eps).

    Returns
    -------
    LatentKeyCache
        keys, singular values, rank, effective rank, errors and relative errors for every
        r, and the factorisations for ``rank``; for MLA models c_KV, its spectrum and ranks,
        and latent_errors.

    Raises
    ------
    ValueError
        For a bad prompt, rank outside 1..min(n, width), a bad rtol.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> cache = ag.latent_key_cache(planted_induction_model("planted"), np.arange(1, 21), rank=4)
    >>> cache.keys.shape, cache.singular_values.shape
    ((2, 20, 256), (2, 20))
    >>> f = cache.factorizations[1]
    >>> bool(abs(f.error - cache.errors[1, 4]) <= 1e-9 * cache.errors[1, 0])
    True
    """
    m = resolve_model(model)
    if not isinstance(rotary, (bool, np.bool_)):
        raise TypeError(f"rotary must be True or False, got {type(rotary).__name__}")
    rtol = rtol_arg(rtol)
    ids, tokens = encode_prompt(m, prompt)
    f = m.forward(ids, dtype=np.float64)
    k = f.k if rotary else f.k_prerotary  # (L, H, n, d_head), kv heads repeated per query head
    a = m.arch
    group = a.n_heads // a.n_kv_heads
    k = k[:, ::group]  # one copy per key/value head
    L, Hk, n, dh = k.shape
    keys = np.ascontiguousarray(np.transpose(k, (0, 2, 1, 3)).reshape(L, n, Hk * dh))
    s = singular_values(keys)
    ranks = spectrum_rank(s, rtol, n, Hk * dh)
    energy = s * s
    tail = np.concatenate([np.cumsum(energy[:, ::-1], axis=-1)[:, ::-1], np.zeros((L, 1))], axis=-1)
    total = tail[:, :1]
    relative = np.divide(tail, total, out=np.zeros_like(tail), where=total > 0)
    facts = None
    if rank is not None:
        rank = count("rank", rank, 1, min(n, Hk * dh))
        facts = [latent_factorization(keys[layer], rank) for layer in range(L)]
    out = LatentKeyCache(keys, s, ranks, effective_rank(s, kind="energy", spectrum=True), tail, relative, facts,
                         rank, bool(rotary), tokens)
    if a.mla:
        _latent_analysis(out, f.kv_latent, m, rtol)
    return out


def _latent_analysis(out: LatentKeyCache, latent: np.ndarray, model, rtol) -> None:
    """Fill the MLA fields of ``out`` from the cached latents c_KV (n_layers, n, d_c)."""
    m = model.arch.mla
    nope, dv, H = m["qk_nope_head_dim"], m["v_head_dim"], model.arch.n_heads
    L, n, dc = latent.shape
    _, s, vh = np.linalg.svd(latent, full_matrices=False)  # c = U diag(s) Vh
    energy = np.empty((L, s.shape[-1]))
    for layer in range(L):
        kv_b = np.asarray(model.layer_weights(layer)["kv_b"], dtype=np.float64)  # (d_c, H (nope + dv))
        W_UK = kv_b.reshape(dc, H, nope + dv)[:, :, :nope].reshape(dc, H * nope)
        energy[layer] = np.sum((vh[layer] @ W_UK) ** 2, axis=-1)  # ||v_i^T W_UK||^2
    weighted = s * s * energy
    out.latent_errors = np.concatenate([np.cumsum(weighted[:, ::-1], axis=-1)[:, ::-1], np.zeros((L, 1))], axis=-1)
    out.kv_latent = latent
    out.kv_latent_singular_values = s
    out.kv_latent_rank = spectrum_rank(s, rtol, n, dc)
    out.kv_latent_effective_rank = effective_rank(s, kind="energy", spectrum=True)
