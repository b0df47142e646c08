"""Interventions in the forward pass: ablate, project out, patch or hook an activation.

``Model.forward(token_ids, interventions=[...])`` changes the activations at named sites as
the pass runs, in the order given, and everything downstream sees the changed values (the
kept fields of the :class:`Forward` are the intervened ones). Sites are named as
TransformerLens names its hook points, one per layer:

==============  ===============================  =========================================
site            value (one layer, batch axis)    what it is
==============  ===============================  =========================================
``resid_pre``   (b, n, d_model)                  the residual stream entering the layer
``attn_in``     (b, n, d_model)                  what attention reads (the normed stream)
``q k v``       (b, n_heads, n, d_head)          per head, as the attention uses them
                                                 (after rotation; k, v per query head)
``pattern``     (b, n_heads, n, n)               the routing matrix P
``z``           (b, n_heads, n, d_head)          each head's output P v, before W_O
``attn_out``    (b, n, d_model)                  the attention block's output (after W_O)
``mlp_out``     (b, n, d_model)                  the MLP block's output
``resid_post``  (b, n, d_model)                  the residual stream leaving the layer
==============  ===============================  =========================================

For one sequence (1-D token ids) a :class:`Hook` function sees the value without its batch
axis, as the Forward holds it. Unlike TransformerLens' hook_q / hook_k (before the rotation,
its rotated ones are hook_rot_q / hook_rot_k; one per key/value head under grouped-query
attention), ``q`` and ``k`` here are after the rotation and per query head, as
:class:`Forward` holds them. Kinds:

* :class:`Ablate` ``(site, layer, heads=None, positions=None, mode="zero" | "mean" |
  "resample", reference=None, seed=0)``: zeros; the mean of the reference pass's values over
  its real tokens (per head; for ``pattern`` the mean weights over its sequences, same
  length); or, per sequence, the values of a sequence of the reference batch drawn at random
  (seeded) at the same positions.
* :class:`Project` ``(site, layer, subspace, heads=None, remove=True)``: remove the component
  of every vector in a :class:`attngeom.Subspace` (or keep only it), for residual sites
  (ambient dimension d_model) and per-head q, k, v, z (d_head).
* :class:`Patch` ``(site, layer, source, heads=None, positions=None)``: the values of another
  pass (a :class:`Forward` that kept the site's field, same batch and length).
* :class:`Hook` ``(site, layer, fn)``: ``fn(value) -> value`` of the same shape, finite.

``heads`` select heads of per-head sites, ``positions`` token positions (query positions
for ``pattern``); both default to all. The reference and source passes are Forwards that
kept the site's field (``keep=`` with the names in :data:`SITE_FIELDS`) at that layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ...subspace import Subspace

SITES = ("resid_pre", "attn_in", "q", "k", "v", "pattern", "z", "attn_out", "mlp_out", "resid_post")
HEAD_SITES = ("q", "k", "v", "pattern", "z")
#: The Forward field that holds each site's values (``keep=`` it in a reference or source pass).
SITE_FIELDS = {"resid_pre": "hidden_states", "attn_in": "attention_inputs", "q": "q", "k": "k", "v": "v",
               "pattern": "attentions", "z": "z", "attn_out": "attn_out", "mlp_out": "mlp_out",
               "resid_post": "resid_post"}
ABLATIONS = ("zero", "mean", "resample")


@dataclass(frozen=True)
class Ablate:
    """Replace a site's values by zeros, the reference's mean, or resampled reference values."""

    site: str
    layer: int
    heads: Any = None
    positions: Any = None
    mode: str = "zero"
    reference: Any = None
    seed: int = 0


@dataclass(frozen=True)
class Project:
    """Remove (``remove=True``) or keep only the component of a site's vectors in a subspace."""

    site: str
    layer: int
    subspace: Subspace
    heads: Any = None
    remove: bool = True


@dataclass(frozen=True)
class Patch:
    """Replace a site's values by those of another pass (a Forward that kept the site)."""

    site: str
    layer: int
    source: Any
    heads: Any = None
    positions: Any = None


@dataclass(frozen=True)
class Hook:
    """Replace a site's values by ``fn(values)`` (same shape, finite)."""

    site: str
    layer: int
    fn: Callable


KINDS = (Ablate, Project, Patch, Hook)


def _name(i: int, iv) -> str:
    return f"interventions[{i}] ({type(iv).__name__} at {iv.site!r}, layer {iv.layer})"


def _indices(label: str, value, size: int, what: str) -> Optional[np.ndarray]:
    if value is None:
        return None
    idx = np.asarray([value] if np.ndim(value) == 0 else value)
    if idx.dtype.kind not in "iu" or idx.ndim != 1 or idx.size == 0:
        raise ValueError(f"{label}: {what} must be an index or a non-empty sequence of indices, got {value!r}")
    bad = idx[(idx < -size) | (idx >= size)]
    if bad.size:
        raise ValueError(f"{label}: {what} {int(bad[0])} is out of range for {size} {what}")
    return idx % size


@dataclass
class Resolved:
    """A checked intervention with its selections and, for Ablate / Patch, its values."""

    index: int
    item: Any
    label: str
    heads: Optional[np.ndarray]
    positions: Optional[np.ndarray]
    values: Optional[np.ndarray] = None  # what Ablate(mean / resample) and Patch write


def check_interventions(interventions, arch, shape, single: bool) -> dict:
    """Check every intervention against the model and the batch; {layer: [Resolved, ...]} in order.

    Parameters
    ----------
    interventions : sequence
        Ablate, Project, Patch and Hook objects.
    arch : Architecture
        The model.
    shape : tuple of int
        (batch, n) of the token ids.
    single : bool
        Whether the input was one sequence (Hook functions then see no batch axis).

    Returns
    -------
    dict
        {layer: list of Resolved}.

    Raises
    ------
    ValueError
        Naming the intervention (its index, kind, site and layer) and the field at fault: an
        unknown site, a layer, head or position out of range, heads on a residual site, an
        unknown ablation mode, a subspace of the wrong dimension, a reference or source pass
        without the site's field at that layer or of another batch or length.
    TypeError
        For an object of another kind, a Project without a Subspace, a Hook without a callable.
    """
    if interventions is None:
        return {}
    items = [interventions] if isinstance(interventions, KINDS) else list(interventions)
    b, n = shape
    H = arch.n_heads
    out: dict = {}
    for i, iv in enumerate(items):
        if not isinstance(iv, KINDS):
            raise TypeError(f"interventions[{i}] must be an Ablate, Project, Patch or Hook, got {type(iv).__name__}")
        if iv.site not in SITES:
            raise ValueError(f"interventions[{i}] ({type(iv).__name__}): site: unknown site {iv.site!r}; the sites are "
                             f"{', '.join(SITES)}")
        label = _name(i, iv)
        if isinstance(iv.layer, (bool, np.bool_)) or not isinstance(iv.layer, (int, np.integer)) \
                or not 0 <= iv.layer < arch.n_layers:
            raise ValueError(f"{label}: layer must be an integer in 0..{arch.n_layers - 1}, got {iv.layer!r}")
        heads = getattr(iv, "heads", None)
        if heads is not None and iv.site not in HEAD_SITES:
            raise ValueError(f"{label}: heads: the site {iv.site!r} is not per head (per-head sites: "
                             f"{', '.join(HEAD_SITES)})")
        r = Resolved(i, iv, label, _indices(label, heads, H, "heads"),
                     _indices(label, getattr(iv, "positions", None), n, "positions"))
        if isinstance(iv, Ablate):
            if iv.mode not in ABLATIONS:
                raise ValueError(f"{label}: mode must be one of {', '.join(ABLATIONS)}, got {iv.mode!r}")
            if iv.mode != "zero":
                ref, real = _field(label, "reference", iv.reference, iv)
                if ref.shape[1:] != _site_shape(arch, iv.site, *ref.shape[:1], _length(iv.site, ref))[1:]:
                    raise ValueError(f"{label}: reference holds {ref.shape} at the site, not values of this model")
                r.values = _ablation_values(label, iv, ref, real, (b, n))
        elif isinstance(iv, Patch):
            src, _ = _field(label, "source", iv.source, iv)
            if src.shape != _site_shape(arch, iv.site, b, n):
                raise ValueError(f"{label}: source holds {src.shape} at the site, this pass "
                                 f"{_site_shape(arch, iv.site, b, n)} (batch {b}, {n} tokens)")
            r.values = src
        elif isinstance(iv, Project):
            if not isinstance(iv.subspace, Subspace):
                raise TypeError(f"{label}: subspace must be an attngeom.Subspace, got {type(iv.subspace).__name__}")
            if iv.site == "pattern":
                raise ValueError(f"{label}: site: Project acts on vectors; 'pattern' holds the routing matrix P")
            want = _width(arch, iv.site)
            if iv.subspace.ambient_dim != want:
                raise ValueError(f"{label}: subspace lives in R^{iv.subspace.ambient_dim}, the site's vectors in "
                                 f"R^{want}")
        elif isinstance(iv, Hook):
            if not callable(iv.fn):
                raise TypeError(f"{label}: fn must be callable, got {type(iv.fn).__name__}")
        out.setdefault(int(iv.layer), []).append(r)
    return out


def _length(site: str, a: np.ndarray) -> int:
    """The token count of a site's values (batch axis first)."""
    return a.shape[-2] if site in HEAD_SITES else a.shape[1]


def _site_shape(arch, site: str, b: int, n: int) -> tuple:
    """The shape of a site's values in a pass of b sequences of n tokens."""
    if site == "pattern":
        return (b, arch.n_heads, n, n)
    if site in HEAD_SITES:
        return (b, arch.n_heads, n, _width(arch, site))
    return (b, n, arch.d_model)


def _width(arch, site: str) -> int:
    if site in ("q", "k"):
        return arch.d_head
    if site in ("v", "z"):
        return arch.mla["v_head_dim"] if arch.mla else arch.d_head
    return arch.d_model


def _field(label, name, value, iv):
    """The site's values of layer iv.layer in a reference / source Forward, batch axis first,
    and its (batch, n) mask of real tokens."""
    field = SITE_FIELDS[iv.site]
    if not all(hasattr(value, a) for a in ("layers", "positions", "attention_mask", field)):  # a Forward
        raise TypeError(f"{label}: {name} must be a Forward (model.forward(..., keep=({field!r},))), got "
                        f"{type(value).__name__}")
    data = getattr(value, field)
    layers = list(np.asarray(value.layers))
    if data is None or iv.layer not in layers:
        raise ValueError(f"{label}: {name} did not keep {field!r} at layer {iv.layer} (pass keep=({field!r}, ...) "
                         f"and layers covering it)")
    a = np.asarray(data[layers.index(iv.layer)])  # hidden_states too: [i] enters layers[i]
    real = np.asarray(value.attention_mask, bool)
    if value.positions.ndim == 1:  # one sequence: add the batch axis
        a, real = a[None], real[None]
    return a, real


def _ablation_values(label, iv, ref: np.ndarray, real: np.ndarray, shape) -> np.ndarray:
    b, n = shape
    if iv.mode == "mean" and iv.site != "pattern":  # over the reference's real tokens
        if iv.site in HEAD_SITES:
            return ref.transpose(0, 2, 1, 3)[real].mean(axis=0)  # (H, d)
        return ref[real].mean(axis=0)  # (d,)
    if _length(iv.site, ref) != n:
        raise ValueError(f"{label}: reference has {_length(iv.site, ref)} tokens, this pass {n}: "
                         f"{'mean weights' if iv.mode == 'mean' else 'resampling'} keep positions")
    if iv.mode == "mean":
        return ref.mean(axis=0)  # (H, n, n): the mean weights per head
    pick = np.random.default_rng(iv.seed).integers(0, ref.shape[0], size=b)
    return ref[pick]


def apply(resolved, site: str, value: np.ndarray, single: bool) -> np.ndarray:
    """The value of `site` after the interventions of one layer at that site (in order).

    Parameters
    ----------
    resolved : list of Resolved
        The layer's interventions (:func:`check_interventions`).
    site : str
        The site.
    value : ndarray
        Its values (batch axis first).
    single : bool
        One sequence: Hook functions see the value without the batch axis.

    Returns
    -------
    ndarray
        A new array when something changed (the input is never written).
    """
    for r in resolved:
        iv = r.item
        if iv.site != site:
            continue
        if isinstance(iv, Hook):
            value = _hook(r, value, single)
            continue
        value = value.copy()
        per_head = site in HEAD_SITES
        sel = _selection(value.ndim, per_head, r.heads, r.positions)
        if isinstance(iv, Project):
            x = value[sel]
            inside = iv.subspace.project(x)
            value[sel] = x - inside if iv.remove else inside
        elif isinstance(iv, Ablate) and iv.mode == "zero":
            value[sel] = 0
        elif isinstance(iv, Ablate) and iv.mode == "mean":
            fill = r.values
            if site == "pattern":
                fill = fill[None]
            elif per_head:
                fill = fill[None, :, None, :]
            value[sel] = np.broadcast_to(fill.astype(value.dtype, copy=False), value.shape)[sel]
        else:  # Patch, resample
            value[sel] = np.asarray(r.values, value.dtype)[sel]
    return value


def _selection(ndim: int, per_head: bool, heads, positions):
    sel = [slice(None)] * ndim
    if heads is not None:
        sel[1] = heads
    if positions is not None:
        sel[2 if per_head else 1] = positions
    if heads is not None and positions is not None:  # outer product of the two index lists
        sel[1], sel[2] = heads[:, None], positions[None, :]
    return tuple(sel)


def _hook(r: Resolved, value: np.ndarray, single: bool) -> np.ndarray:
    given = value[0] if single else value
    out = r.item.fn(given.copy())
    out = np.asarray(out)
    if out.shape != given.shape:
        raise ValueError(f"{r.label}: fn returned shape {out.shape}, the site holds {given.shape}")
    if out.dtype.kind not in "fiu" or not np.all(np.isfinite(out)):
        raise ValueError(f"{r.label}: fn returned non-finite or non-real values")
    out = out.astype(value.dtype, copy=False)
    return out[None] if single else out


def sites_at(resolved) -> frozenset:
    """The sites one layer's interventions touch."""
    return frozenset(r.item.site for r in resolved)
