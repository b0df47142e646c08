"""The per-head report of a model (``attngeom heads``): a JSON table and figures.

For every head: the spectrum of B = W_Q W_K^T (rank, entropy effective rank, the number of
singular values holding 90% and 99% of the energy E_k) and its parameter nulls
(Laplace-Radon s.5.3, s.6.1), the spectrum of W_OV (the notes' r_eff and E_k); with
activations, the Laplace radii (eq. 9, 16), tilt coverage and limited-angle nulls (s.6.2,
s.12.1) and routing ranks (s.6.3). Figures: a layer x head grid of effective ranks, the two
spectra of chosen heads and, with activations, their attention heat maps (as in the notes).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..attention import softmax_attention
from ..head_diagnostics import HeadDiagnostics
from ..spectral import cumulative_energy
from .heads import ModelHeads, load_heads


def _energy_count(s: np.ndarray, level: float) -> np.ndarray:
    """Smallest k with E_k >= level, per spectrum (..., K) -> (...)."""
    e = cumulative_energy(s, spectrum=True)
    return np.argmax(e >= level - 1e-12, axis=-1) + 1


@dataclass
class HeadReport:
    """The report of one model. ``table()`` has one row per head (layer, head and the metrics
    of :meth:`attngeom.HeadDiagnostics.table` plus bilinear_k90/k99, ov_k90/k99: singular
    values needed for 90% / 99% of the energy); ``summary()`` the model's dimensions and the
    means over heads; ``chosen`` the (layer, head) pairs drawn in detail; ``routing`` their
    attention matrices on the first sequence, ``tokens`` its token strings (when known)."""

    model: dict
    diagnostics: HeadDiagnostics
    chosen: List[Tuple[int, int]]
    routing: Dict[Tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    tokens: Optional[List[str]] = None
    source: str = "weights"
    seconds: dict = field(default_factory=dict)

    def table(self) -> list:
        """One dict of named scalars per head, layer-major."""
        d = self.diagnostics
        k = {"bilinear_k90": _energy_count(d.nulls.singular_values, 0.90),
             "bilinear_k99": _energy_count(d.nulls.singular_values, 0.99)}
        if d.ov_singular_values is not None:
            k["ov_k90"] = _energy_count(d.ov_singular_values, 0.90)
            k["ov_k99"] = _energy_count(d.ov_singular_values, 0.99)
        rows = []
        for row in d.table():
            layer, head = row.pop("head")
            out = {"layer": layer, "head": head}
            out.update(row)
            out.update({name: int(v[layer, head]) for name, v in k.items()})
            if "token_null_dim" in out and self.model.get("homogeneous"):
                out["token_space_dim"] = self.model["d_model"] + 1
            rows.append(out)
        return rows

    def summary(self) -> dict:
        """The model's dimensions, the source of the activations, and means over heads."""
        rows = self.table()
        means = {key: float(np.mean([r[key] for r in rows])) for key in rows[0] if key not in ("layer", "head")}
        return {**self.model, "source": self.source, "n_tokens": None if self.tokens is None else len(self.tokens),
                "chosen": [list(c) for c in self.chosen], "seconds": self.seconds, "mean": means}

    def to_json(self, path) -> str:
        """Write {"summary": ..., "heads": [one row per head]} to path; returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"summary": self.summary(), "heads": self.table()}, f, indent=2)
        return str(path)

    def grid(self, metric: str) -> np.ndarray:
        """(n_layers, n_heads) values of one metric of :meth:`table`."""
        rows = self.table()
        if metric not in rows[0] or metric in ("layer", "head"):
            raise ValueError(f"metric must be one of {[k for k in rows[0] if k not in ('layer', 'head')]}, "
                             f"got {metric!r}")
        out = np.zeros((self.model["n_layers"], self.model["n_heads"]))
        for r in rows:
            out[r["layer"], r["head"]] = r[metric]
        return out

    def figures(self) -> dict:
        """{file name: matplotlib figure}: effective_ranks.png, spectra_L<l>_H<h>.png for every
        chosen head and, with activations, attention_L<l>_H<h>.png."""
        from .. import plotting

        maps = {"bilinear effective rank (entropy)": self.grid("bilinear_effective_rank"),
                r"$W_{OV}$ effective rank (energy)": self.grid("ov_effective_rank")}
        if self.diagnostics.routing_rank is not None:
            maps["routing effective rank (mean)"] = self.grid("routing_effective_rank_mean")
            maps["radius mean"] = self.grid("radius_mean")
        figs = {"effective_ranks.png": plotting.layer_head_grids(maps)}
        d = self.diagnostics
        for layer, head in self.chosen:
            ov = None if d.ov_singular_values is None else d.ov_singular_values[layer, head]
            figs[f"spectra_L{layer}_H{head}.png"] = plotting.head_spectrum_pair(
                d.nulls.singular_values[layer, head], ov, title=f"L{layer}H{head}")
            if (layer, head) in self.routing:
                figs[f"attention_L{layer}_H{head}.png"] = plotting.attention_heatmap(
                    self.routing[layer, head], self.tokens, title=f"L{layer}H{head} attention")
        return figs

    def save(self, folder) -> list:
        """Write heads.json and every figure into folder; returns the written paths."""
        os.makedirs(folder, exist_ok=True)
        paths = [self.to_json(os.path.join(folder, "heads.json"))]
        for name, fig in self.figures().items():
            path = os.path.join(folder, name)
            fig.savefig(path, dpi=110)
            paths.append(path)
        return paths


def _default_chosen(d: HeadDiagnostics) -> List[Tuple[int, int]]:
    """The heads with the lowest and highest bilinear effective rank and the lowest W_OV one."""
    shape = d.batch_shape
    picks = [np.argmin(d.bilinear_effective_rank), np.argmax(d.bilinear_effective_rank)]
    if d.ov_effective_rank is not None:
        picks.append(np.argmin(d.ov_effective_rank))
    out = []
    for p in picks:
        lh = tuple(int(i) for i in np.unravel_index(int(p), shape))
        if lh not in out:
            out.append(lh)
    return out


def head_report(heads, x=None, *, tokens: Optional[Sequence[str]] = None, chosen=None, bias: bool = True,
                rtol=None, n_heads: Optional[int] = None, source: Optional[str] = None) -> HeadReport:
    """Every head's geometry: weights-only, or with activations.

    The per-head diagnostics of Laplace-Radon s.12.1 (spectra of B = W_Q W_K^T and W_OV,
    parameter nulls, with activations radii, tilt coverage and routing ranks) behind the
    ``attngeom heads`` command. Cost: weights only, one factored SVD per head (B and W_OV
    never formed); about a second for 144 heads of d_model 768.

    Parameters
    ----------
    heads : ModelHeads or str
        Heads, or a checkpoint path / packaged-model name for :func:`load_heads`.
    x : array_like, shape (n_layers, [n_seq,] n, d_model), optional
        Activations, the input of each layer's attention (see
        :mod:`attngeom.models.activations`).
    tokens : sequence of str, optional
        The n token strings (for the figures).
    chosen : sequence of (layer, head), optional
        Heads drawn in detail; default the heads with the lowest and highest bilinear
        effective rank and the lowest W_OV effective rank.
    bias : bool, default True
        As in :meth:`ModelHeads.diagnostics`.
    rtol : float, optional
        Rank threshold, as in :meth:`ModelHeads.diagnostics`.
    n_heads : int, optional
        Needed for a checkpoint without config.json.
    source : str, optional
        A description of where the heads came from, stored in the report.

    Returns
    -------
    HeadReport
        The diagnostics, a table per head, ``save(folder)`` for JSON and figures.

    Examples
    --------
    >>> from attngeom.models import head_report
    >>> r = head_report("all-MiniLM-L6-v2")  # needs the models extra
    >>> len(r.table())
    72
    """
    t0 = time.perf_counter()
    if not isinstance(heads, ModelHeads):
        heads = load_heads(heads, n_heads=n_heads)
    t1 = time.perf_counter()
    xs = None
    if x is not None:
        xs = np.asarray(x, dtype=np.float64)
        if xs.ndim == 3:
            xs = xs[:, None]
    d = heads.diagnostics(xs, bias=bias, rtol=rtol)
    t2 = time.perf_counter()
    if chosen is None:
        chosen = _default_chosen(d)
    chosen = [(int(l), int(h)) for l, h in chosen]
    for l, h in chosen:
        if not (0 <= l < heads.n_layers and 0 <= h < heads.n_heads):
            raise ValueError(f"chosen head ({l}, {h}) is outside {heads.n_layers} layers x {heads.n_heads} heads")
    routing = {}
    if xs is not None:
        if tokens is not None and len(tokens) != xs.shape[-2]:
            raise ValueError(f"tokens must have {xs.shape[-2]} entries (the activations' n), got {len(tokens)}")
        for l, h in chosen:
            q, k = heads.queries_keys(xs[l, 0], l, bias=bias)
            _, P = softmax_attention(q[h], k[h], None, causal=heads.causal, return_weights=True, layout="bhnd")
            routing[l, h] = P
    model = heads.summary()
    model["homogeneous"] = bool(xs is not None and bias and (heads.b_Q is not None or heads.b_K is not None))
    return HeadReport(model, d, chosen, routing, None if tokens is None else list(tokens),
                      source or ("weights" if xs is None else "activations"),
                      {"load": t1 - t0, "diagnostics": t2 - t1})
