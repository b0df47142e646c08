"""Everything the Laplace-Radon picture says about a head (or all heads of a model) in one call.

For each head: the spectrum of the bilinear form B = W_Q W_K^T and its parameter nulls
(Laplace-Radon s.5.3, s.6.1), the spectrum of the OV circuit W_V W_O (the notes' W_OV
spectra), and, given token data, the Laplace radii, the tilt coverage with its
limited-angle nulls in key and token space (s.6.2, s.12.1) and the routing ranks of the
attention matrices (s.6.3, s.13.7). All heavy steps are batched kernels of the core
(factored SVDs, attention with weights, batched SVDs) parallel over heads and sequences.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ._operands import broadcast_batch, choice, compute_dtype, finite_result, logit_scale, operand, rtol_arg, scalar
from .attention import softmax_attention
from .spectral import (
    ParameterNulls,
    TiltCoverageResult,
    effective_rank,
    parameter_nulls,
    product_svd,
    singular_values,
    spectrum_rank,
    tilt_coverage,
)

# Attention matrices of one chunk of heads are materialised; this bounds their size.
_CHUNK_BYTES = 1 << 28


@dataclass
class HeadDiagnostics:
    """Per-head geometry of a stack of heads with batch shape ``batch_shape`` (() for one head).

    Attributes
    ----------
    nulls : ParameterNulls
        ker W_Q^T, ker W_K^T, ker B, ker B^T; spectrum and rank of B (from the weights).
    bilinear_effective_rank : ndarray, shape (...)
        Entropy effective rank of B's spectrum.
    ov_singular_values : ndarray, shape (..., k), or None
        Spectrum of W_OV = W_V W_O (row convention); None without W_V, W_O.
    ov_rank, ov_effective_rank : ndarray or None
        Rank and energy effective rank (the notes' r_eff) of W_OV.
    radius_mean, radius_std : ndarray, shape (...), or None
        Statistics of tau = scale ``|q|`` (eq. 9, 16); None without x.
    tilt : TiltCoverageResult or ndarray of them, or None
        Tilt coverage per head; None without x.
    routing_singular_values : ndarray, shape (..., n_seq, n), or None
        Singular values of each attention matrix P; None without x.
    routing_rank, routing_effective_rank : ndarray, shape (..., n_seq), or None
        rank(P) and entropy rank_eff(P); None without x.
    """

    batch_shape: tuple
    d_model: int
    d_head: int
    nulls: ParameterNulls
    bilinear_effective_rank: np.ndarray
    ov_singular_values: Optional[np.ndarray] = None
    ov_rank: Optional[np.ndarray] = None
    ov_effective_rank: Optional[np.ndarray] = None
    radius_mean: Optional[np.ndarray] = None
    radius_std: Optional[np.ndarray] = None
    tilt: object = None
    routing_singular_values: Optional[np.ndarray] = field(default=None, repr=False)
    routing_rank: Optional[np.ndarray] = None
    routing_effective_rank: Optional[np.ndarray] = None

    # -- tables ------------------------------------------------------------------------
    def _at(self, value, idx):
        if value is None:
            return None
        return value if self.batch_shape == () else value[idx]

    def table(self) -> list:
        """One dict of named scalars per head (keys as in :meth:`summary`, plus ``head``)."""
        rows = []
        for idx in np.ndindex(*self.batch_shape):
            n = self.nulls
            row = {
                "head": list(idx),
                "bilinear_rank": int(self._at(np.asarray(n.rank), idx)),
                "bilinear_effective_rank": float(self._at(np.asarray(self.bilinear_effective_rank), idx)),
                "bilinear_sigma_max": float(self._at(n.singular_values, idx)[0]),
                "ker_WQ_T_dim": self._at(n.ker_WQ_T, idx).dim,
                "ker_WK_T_dim": self._at(n.ker_WK_T, idx).dim,
                "ker_B_dim": self._at(n.ker_B, idx).dim,
                "ker_BT_dim": self._at(n.ker_BT, idx).dim,
            }
            if self.ov_singular_values is not None:
                row["ov_rank"] = int(self._at(np.asarray(self.ov_rank), idx))
                row["ov_effective_rank"] = float(self._at(np.asarray(self.ov_effective_rank), idx))
                row["ov_sigma_max"] = float(self._at(self.ov_singular_values, idx)[0])
            if self.tilt is not None:
                n_k = self.routing_singular_values.shape[-1]
                t: TiltCoverageResult = self._at(self.tilt, idx)
                row.update(
                    radius_mean=float(self._at(np.asarray(self.radius_mean), idx)),
                    radius_std=float(self._at(np.asarray(self.radius_std), idx)),
                    tilt_effective_dim=t.effective_dim,
                    tilt_rank=t.rank,
                    tilt_null_dim=t.null.dim,
                    token_effective_dim=t.effective_dim_token,
                    token_null_dim=t.token_null.dim,
                    routing_rank_mean=float(np.mean(self._at(self.routing_rank, idx))),
                    routing_nullity_mean=float(np.mean(n_k - self._at(self.routing_rank, idx))),
                    routing_effective_rank_mean=float(np.mean(self._at(self.routing_effective_rank, idx))),
                )
            rows.append(row)
        return rows

    def summary(self) -> dict:
        """Named scalars: the head's values for one head; means over heads for a stack
        (with ``n_heads``). Keys: bilinear_rank, bilinear_effective_rank, ker_*_dim,
        ov_rank, ov_effective_rank, radius_mean, radius_std, tilt_effective_dim, tilt_rank,
        tilt_null_dim, token_effective_dim, token_null_dim, routing_rank_mean,
        routing_nullity_mean, routing_effective_rank_mean."""
        rows = self.table()
        out = {"n_heads": len(rows), "d_model": self.d_model, "d_head": self.d_head}
        for key in rows[0]:
            if key != "head":
                out[key] = float(np.mean([r[key] for r in rows])) if len(rows) > 1 else rows[0][key]
        return out

    def to_json(self, path) -> str:
        """Write {"summary": ..., "heads": [one row per head]} to path; returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"summary": self.summary(), "heads": self.table()}, f, indent=2)
        return str(path)

    # -- figures -----------------------------------------------------------------------
    def plot_spectra(self, which: str = "bilinear", ax=None):
        """Singular values of every head (log scale): which = "bilinear" (B), "ov" (W_OV)
        or "routing" (P, averaged over sequences)."""
        from . import plotting

        spectra = {"bilinear": self.nulls.singular_values, "ov": self.ov_singular_values,
                   "routing": None if self.routing_singular_values is None else self.routing_singular_values.mean(-2)}
        choice("which", which, tuple(spectra))
        if spectra[which] is None:
            raise ValueError(f"no {which} spectra: pass W_O for 'ov' and x for 'routing'")
        s = np.asarray(spectra[which]).reshape(-1, spectra[which].shape[-1])
        return plotting.head_spectra(s, title={"bilinear": r"$B = W_Q W_K^\top$", "ov": r"$W_{OV}$",
                                               "routing": r"routing $P$"}[which], ax=ax)

    def plot_map(self, metric: str = "bilinear_effective_rank", ax=None):
        """A (layer, head) heat map of one per-head metric of :meth:`table` (2-D stacks)."""
        from . import plotting

        rows = self.table()
        choice("metric", metric, tuple(k for k in rows[0] if k != "head"))
        shape = self.batch_shape if len(self.batch_shape) == 2 else (1, len(rows))
        values = np.array([r[metric] for r in rows], dtype=float).reshape(shape)
        return plotting.head_map(values, metric, ax=ax)


def _weights(name, w):
    return None if w is None else operand(name, w, "(..., d_model, d_head)", dtype=None)


@finite_result
def head_diagnostics(W_Q, W_K, W_V=None, W_O=None, x=None, *, scale=None, causal=False, rtol=None, q=None,
                     k=None) -> HeadDiagnostics:
    """The geometry of one head or a stack of heads, from weights and optionally tokens.

    Laplace-Radon s.12.1 (all diagnostics of s.5-6 and app. B for each head): spectra and
    nulls of B = W_Q W_K^T and of the OV circuit, and with tokens the radii, tilt coverage and
    routing ranks. Cost: O(d_model d_head^2) per head for the weights; with data, one attention
    matrix (n x n) per head and sequence plus its singular values, O(n^3) each.

    Parameters
    ----------
    W_Q, W_K : array_like, shape (..., d_model, d_head)
        q = x W_Q (TransformerLens layout for stacks, e.g. (n_layers, n_heads, d_model,
        d_head)); leading axes broadcast.
    W_V : array_like, shape (..., d_model, d_v), optional
        Value weights.
    W_O : array_like, shape (..., d_v, d_model), optional
        Output weights. With W_V, the OV circuit W_V W_O (never formed) is analysed.
    x : array_like, optional
        Tokens: (n, d_model) one sequence, (n_seq, n, d_model) several, or
        (..., n_seq, n, d_model) with leading axes broadcasting against the heads'.
    scale : float, optional
        Logit scale, default 1 / sqrt(d_head).
    causal : bool or str, default False
        Passed to :func:`attngeom.softmax_attention` for the routing matrices.
    rtol : float, optional
        Rank threshold (relative to sigma_max) for every rank decision; default the
        matrix_rank rule of each matrix.
    q, k : array_like, shape (..., n_seq, n, d_head), optional
        Instead of x: the queries and keys as the model computes them, for heads whose
        logits are not x W_Q (x W_K)^T (rotary embeddings, q/k norms, biases). Radii,
        routing matrices and key-space tilts use them; the token-space normals are W_K u
        with the given queries u (for a rotary head, the normals of a key at position 0).

    Returns
    -------
    HeadDiagnostics
        Per-head results with ``summary()``, ``table()``, ``to_json()`` and plots.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K = rng.standard_normal((2, 3, 16, 4))  # 3 heads
    >>> d = ag.head_diagnostics(W_Q, W_K, x=rng.standard_normal((10, 16)))
    >>> [int(r) for r in d.nulls.rank]
    [4, 4, 4]
    """
    wq = operand("W_Q", W_Q, "(..., d_model, d_head)", dtype=None)
    wk = operand("W_K", W_K, "(..., d_model, d_head)", dtype=None)
    wv = _weights("W_V", W_V)
    wo = _weights("W_O", W_O)
    rtol = rtol_arg(rtol)
    d_model, d_head = wq.shape[-2:]
    for name, w in (("W_K", wk), ("W_V", wv)):
        if w is not None and w.shape[-2] != d_model:
            raise ValueError(f"{name} must have shape (..., {d_model}, d), got {w.shape}")
    if wk.shape[-1] != d_head:
        raise ValueError(f"W_K must have shape (..., {d_model}, {d_head}), got {wk.shape}")
    if wo is not None:
        if wv is None:
            raise ValueError("W_O needs W_V (the OV circuit is W_V W_O)")
        if wo.shape[-2] != wv.shape[-1] or wo.shape[-1] != d_model:
            raise ValueError(f"W_O must have shape (..., {wv.shape[-1]}, {d_model}), got {wo.shape}")
    named = [("W_Q", wq, 2), ("W_K", wk, 2)] + [(n, w, 2) for n, w in (("W_V", wv), ("W_O", wo)) if w is not None]
    batch = broadcast_batch(named)
    dt = compute_dtype(*[w for _, w, _ in named])

    # Every head gets its own result even when some weights are shared across the stack.
    wq = np.broadcast_to(wq, batch + wq.shape[-2:])
    wk = np.broadcast_to(wk, batch + wk.shape[-2:])
    nulls = parameter_nulls(wq, wk, rtol=rtol)
    out = HeadDiagnostics(batch, d_model, d_head, nulls,
                          np.asarray(effective_rank(nulls.singular_values, kind="entropy", spectrum=True)))
    if wo is not None:
        s = product_svd(wv, wo).S
        s = np.broadcast_to(s, batch + s.shape[-1:])
        out.ov_singular_values = s
        out.ov_rank = spectrum_rank(s, rtol, d_model, d_model)
        out.ov_effective_rank = np.asarray(effective_rank(s, kind="energy", spectrum=True))
    if (q is None) != (k is None):
        raise ValueError("q and k must be given together")
    if q is not None and x is not None:
        raise ValueError("give x or (q, k), not both")
    if x is not None or q is not None:
        _data_diagnostics(out, wq.astype(dt, copy=False), wk.astype(dt, copy=False), x, dt, scale, causal, rtol, q, k)
    return out


def _data_diagnostics(out: HeadDiagnostics, wq, wk, x, dt, scale, causal, rtol, q_given=None, k_given=None):
    d_model, d_head = out.d_model, out.d_head
    if q_given is not None:
        qs = operand("q", q_given, f"(..., n, {d_head})", dtype=None)
        ks = operand("k", k_given, f"(..., n, {d_head})", dtype=None)
        if qs.shape[-1] != d_head or qs.shape != ks.shape:
            raise ValueError(f"q and k must have one shape (..., n_seq, n, {d_head}), got {qs.shape} and {ks.shape}")
        dt = np.result_type(dt, qs.dtype, ks.dtype)
        xs = qs.astype(dt, copy=False)
        if xs.ndim == 2:
            xs, ks = xs[None], ks[None]
    else:
        xs = operand("x", x, f"(..., n, {d_model})", dtype=None)
        if xs.shape[-1] != d_model:
            raise ValueError(f"x must have shape (..., n, {d_model}), got {xs.shape}")
        if xs.ndim == 2:
            xs = xs[None]
        xs = xs.astype(dt, copy=False)
    scale = logit_scale(scale, d_head, positive=True)
    batch = out.batch_shape
    x_lead = xs.shape[:-3]
    try:
        fits = np.broadcast_shapes(x_lead, batch) == batch
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"x's leading axes {x_lead} must broadcast to the heads' batch shape {batch}")
    n_seq, n = xs.shape[-3:-1]
    heads = int(np.prod(batch, dtype=np.int64))
    xb = np.broadcast_to(xs, batch + xs.shape[-3:]).reshape((heads,) + xs.shape[-3:])
    kb = None if q_given is None else np.broadcast_to(ks.astype(dt, copy=False), batch + xs.shape[-3:]).reshape(
        (heads,) + xs.shape[-3:])
    wqb = np.broadcast_to(wq, batch + wq.shape[-2:]).reshape(heads, d_model, d_head)
    wkb = np.broadcast_to(wk, batch + wk.shape[-2:]).reshape(heads, d_model, d_head)

    tau_mean, tau_std = np.empty(heads), np.empty(heads)
    tilts = np.empty(heads, dtype=object)
    sv = np.empty((heads, n_seq, n), dtype=dt)
    chunk = max(1, _CHUNK_BYTES // max(1, n_seq * n * n * np.dtype(dt).itemsize))
    for h0 in range(0, heads, chunk):
        sl = slice(h0, min(heads, h0 + chunk))
        if kb is None:
            q = xb[sl] @ wqb[sl, None]  # (c, n_seq, n, d_head)
            k = xb[sl] @ wkb[sl, None]
        else:
            q, k = xb[sl], kb[sl]
        if not np.all(np.any(q.reshape(q.shape[0], -1) != 0, axis=-1)):
            raise ValueError(("q" if kb is not None else "x @ W_Q") + " is zero for every token of a head: "
                             "its tilts are undefined")
        tau = scale * np.linalg.norm(q, axis=-1)
        tau_mean[sl] = tau.reshape(tau.shape[0], -1).mean(-1)
        tau_std[sl] = tau.reshape(tau.shape[0], -1).std(-1)
        tilts[sl] = tilt_coverage(q, W_K=wkb[sl], rtol=rtol, batch_ndim=1)
        _, P = softmax_attention(q, k, None, causal=causal, scale=scale, return_routing=True, layout="bhnd")
        sv[sl] = singular_values(P)
    out.radius_mean = tau_mean.reshape(batch)
    out.radius_std = tau_std.reshape(batch)
    out.tilt = tilts[0] if batch == () else tilts.reshape(batch)
    out.routing_singular_values = sv.reshape(batch + (n_seq, n))
    out.routing_rank = spectrum_rank(out.routing_singular_values, rtol, n, n)
    out.routing_effective_rank = np.asarray(effective_rank(out.routing_singular_values, kind="entropy", spectrum=True))
