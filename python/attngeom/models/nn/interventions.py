"""Interventions in the forward pass: ablate, project out, patch or hook an activation.

``Model.forward(token_ids, interventions=[...])`` changes the activations at named sites as
the pass runs, in the order given, and everything downstream sees the changed values (the
kept sites of the :class:`Forward` hold the intervened values). The sites and their names
are those of :mod:`attngeom.models.nn.sites`: a short name with a layer
(``Ablate("z", 3, heads=[1])``) or TransformerLens' full hook name, which carries the layer
(``Ablate("blocks.3.attn.hook_z", heads=[1])``). The global sites (``embed``, ``pos_embed``,
``ln_final``) take no layer. Every site's value passes through one gate (:class:`Gate`),
which applies that site's interventions and keeps the value.

For one sequence (1-D token ids) a :class:`Hook` function sees the value without its batch
axis, as the Forward holds it. Kinds:

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
kept the site (``keep=(site, ...)``) at that layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..._docstrings import filler
from ...subspace import Subspace
from .sites import BEFORE, GLOBAL_SITES, HEAD_SITES, model_sites, parse_site

_fill_doc = filler(site_layer="""\
    site : str
        The site: a short name with `layer` (``"z"``, ``"resid_pre"``, ``"pattern"``; the
        names of :mod:`attngeom.models.nn.sites`) or TransformerLens' full hook name, which
        carries the layer (``"blocks.3.attn.hook_z"``).
    layer : int, optional
        The layer (0..n_layers - 1); None for a full hook name and for the global sites
        ``embed``, ``pos_embed`` and ``ln_final``.""")

ABLATIONS = ("zero", "mean", "resample")


@_fill_doc
@dataclass(frozen=True)
class Ablate:
    """Replace a site's values by zeros, the reference's mean, or resampled reference values.

    An intervention for ``Model.forward(ids, interventions=[...])``: as the pass reaches the
    site, the selected values are replaced and everything downstream sees the replacement.

    Parameters
    ----------
    %(site_layer)s
    heads : int or sequence of int, optional
        Heads to change, for per-head sites (q, k, v, z, pattern and their variants);
        default all.
    positions : int or sequence of int, optional
        Token positions to change (query positions for ``pattern``); default all.
    mode : {"zero", "mean", "resample"}, default "zero"
        "zero": zeros. "mean": the mean of the reference pass's values at the site over its
        real tokens (per head; for ``pattern`` the mean weights over its sequences, of the
        same length). "resample": per sequence, the values of a sequence of the reference
        batch drawn at random (seeded), at the same positions.
    reference : Forward, optional
        A pass that kept the site at that layer (``keep=(site,)``); needed by "mean" and
        "resample".
    seed : int, default 0
        Seed of the draws of "resample".

    Raises
    ------
    ValueError or TypeError
        When the pass checks it (before anything runs), naming the intervention and the
        field: an unknown site, a layer, head or position out of range, heads on a residual
        site, an unknown mode, a missing or mismatched reference.

    See Also
    --------
    Project, Patch, Hook : the other interventions.
    attngeom.models.head_ablation_effects : every head ablated in turn.

    Examples
    --------
    >>> from attngeom.models import Ablate, planted_induction_model
    >>> model = ag.load_model(planted_induction_model("planted"))
    >>> ids = np.tile(np.arange(1, 9), 2)
    >>> clean = model.forward(ids, keep=("z", "logits"))
    >>> f = model.forward(ids, keep=("z",), interventions=[Ablate("z", 1, heads=[0])])
    >>> float(np.abs(f.z[1, 0]).max())  # head 0 of layer 1 outputs nothing (z: layer, head, token, d_head)
    0.0
    >>> mean = Ablate("blocks.1.attn.hook_z", heads=[0], mode="mean", reference=clean)
    >>> model.forward(ids, interventions=[mean]).logits.shape
    (16, 48)
    """

    site: Any
    layer: Optional[int] = None
    heads: Any = None
    positions: Any = None
    mode: str = "zero"
    reference: Any = None
    seed: int = 0


@_fill_doc
@dataclass(frozen=True)
class Project:
    """Remove (``remove=True``) or keep only the component of a site's vectors in a subspace.

    Every vector at the site (a residual-stream vector, or one head's q, k, v or z) is
    replaced by its projection onto the orthogonal complement of `subspace` (remove) or onto
    `subspace` itself (keep).

    Parameters
    ----------
    %(site_layer)s
    subspace : attngeom.Subspace
        The subspace, of the site's vector dimension (d_model for residual sites, d_head for
        per-head q, k, v, z).
    heads : int or sequence of int, optional
        Heads to change, for per-head sites (q, k, v, z, pattern and their variants);
        default all.
    remove : bool, default True
        True: remove the component in the subspace; False: keep only that component.

    Raises
    ------
    ValueError or TypeError
        When the pass checks it: a subspace of another dimension or not a Subspace, the
        ``pattern`` site (a matrix, not vectors), and the checks of :class:`Ablate`.

    See Also
    --------
    attngeom.Subspace : spans, null spaces and singular directions to project on.

    Examples
    --------
    >>> from attngeom.models import Project, planted_induction_model
    >>> model = ag.load_model(planted_induction_model("planted"))
    >>> ids = np.tile(np.arange(1, 9), 2)
    >>> first = ag.Subspace.span(np.eye(model.heads.d_head)[:1])  # the first axis of the head
    >>> f = model.forward(ids, keep=("q",), interventions=[Project("q", 1, first, heads=[0])])
    >>> float(np.abs(f.q[1, 0, :, 0]).max())  # that component of head 0's queries is gone
    0.0
    """

    site: Any
    layer: Optional[int] = None
    subspace: Optional[Subspace] = None
    heads: Any = None
    remove: bool = True


@_fill_doc
@dataclass(frozen=True)
class Patch:
    """Replace a site's values by those of another pass (a Forward that kept the site).

    Activation patching: the source pass (say, on a clean prompt) supplies the values at the
    selected heads and positions of this pass (say, on a corrupted one).

    Parameters
    ----------
    %(site_layer)s
    source : Forward
        A pass of the same batch and length that kept the site at that layer
        (``keep=(site,)``).
    heads : int or sequence of int, optional
        Heads to change, for per-head sites (q, k, v, z, pattern and their variants);
        default all.
    positions : int or sequence of int, optional
        Token positions to change (query positions for ``pattern``); default all.

    Raises
    ------
    ValueError or TypeError
        When the pass checks it: a source that is not a Forward, lacks the site or has
        another batch or length, and the checks of :class:`Ablate`.

    See Also
    --------
    attngeom.models.activation_patching : every layer and position patched in turn.

    Examples
    --------
    >>> from attngeom.models import Patch, planted_induction_model
    >>> model = ag.load_model(planted_induction_model("planted"))
    >>> clean, corrupt = np.tile(np.arange(1, 9), 2), np.tile(np.arange(11, 19), 2)
    >>> source = model.forward(clean, keep=("resid_pre", "logits"))
    >>> f = model.forward(corrupt, interventions=[Patch("resid_pre", 0, source)])
    >>> bool(np.allclose(f.logits, source.logits))  # the whole stream patched: the clean pass
    True
    """

    site: Any
    layer: Optional[int] = None
    source: Any = None
    heads: Any = None
    positions: Any = None


@_fill_doc
@dataclass(frozen=True)
class Hook:
    """Replace a site's values by ``fn(values)`` (same shape, finite).

    The general intervention: `fn` reads the site's values and returns the values the pass
    continues with.

    Parameters
    ----------
    %(site_layer)s
    fn : callable
        ``fn(values) -> values``: an ndarray of the site's shape in, one of the same shape
        and finite entries out. For one sequence (1-D token ids) it sees the values without
        the batch axis, as the Forward holds them; for a batch, with it first.

    Raises
    ------
    ValueError or TypeError
        When the pass checks it: `fn` not callable, and the checks of :class:`Ablate`;
        while the pass runs, a result of another shape or with NaN or inf.

    Examples
    --------
    >>> from attngeom.models import Hook, planted_induction_model
    >>> model = ag.load_model(planted_induction_model("planted"))
    >>> ids = np.tile(np.arange(1, 9), 2)
    >>> f = model.forward(ids, keep=("v",), interventions=[Hook("v", 0, lambda v: 2 * v)])
    >>> plain = model.forward(ids, keep=("v",))
    >>> bool(np.allclose(f.v[0], 2 * plain.v[0]))
    True
    """

    site: Any
    layer: Optional[int] = None
    fn: Optional[Callable] = None


KINDS = (Ablate, Project, Patch, Hook)


def _name(i: int, iv, site: str, layer) -> str:
    where = "" if layer is None else f", layer {layer}"
    return f"interventions[{i}] ({type(iv).__name__} at {site!r}{where})"


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
    site: str
    layer: Optional[int]
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
        try:
            site, layer = parse_site(iv.site, iv.layer, what=f"interventions[{i}] ({type(iv).__name__}): site")
        except ValueError as e:
            raise ValueError(str(e)) from None
        label = _name(i, iv, site, layer)
        if site not in model_sites(arch):
            raise ValueError(f"{label}: site: a {arch.model_type} model has no site {site!r}")
        if site in GLOBAL_SITES:
            if layer is not None:
                raise ValueError(f"{label}: layer: the site {site!r} has no layer (it is global), got {layer!r}")
        elif isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) \
                or not 0 <= layer < arch.n_layers:
            raise ValueError(f"{label}: layer must be an integer in 0..{arch.n_layers - 1}, got {layer!r}")
        heads = getattr(iv, "heads", None)
        if heads is not None and site not in HEAD_SITES:
            raise ValueError(f"{label}: heads: the site {site!r} is not per head (per-head sites: "
                             f"{', '.join(HEAD_SITES)})")
        r = Resolved(i, iv, label, site, layer, _indices(label, heads, H, "heads"),
                     _indices(label, getattr(iv, "positions", None), n, "positions"))
        if isinstance(iv, Ablate):
            if iv.mode not in ABLATIONS:
                raise ValueError(f"{label}: mode must be one of {', '.join(ABLATIONS)}, got {iv.mode!r}")
            if iv.mode != "zero":
                ref, real = _field(label, "reference", iv.reference, site, layer)
                if ref.shape[1:] != _site_shape(arch, site, *ref.shape[:1], _length(site, ref))[1:]:
                    raise ValueError(f"{label}: reference holds {ref.shape} at the site, not values of this model")
                r.values = _ablation_values(label, iv, site, ref, real, (b, n))
        elif isinstance(iv, Patch):
            src, _ = _field(label, "source", iv.source, site, layer)
            if src.shape != _site_shape(arch, site, b, n):
                raise ValueError(f"{label}: source holds {src.shape} at the site, this pass "
                                 f"{_site_shape(arch, site, b, n)} (batch {b}, {n} tokens)")
            r.values = src
        elif isinstance(iv, Project):
            if not isinstance(iv.subspace, Subspace):
                raise TypeError(f"{label}: subspace must be an attngeom.Subspace, got {type(iv.subspace).__name__}")
            if site == "pattern":
                raise ValueError(f"{label}: site: Project acts on vectors; 'pattern' holds the routing matrix P")
            want = _width(arch, site)
            if iv.subspace.ambient_dim != want:
                raise ValueError(f"{label}: subspace lives in R^{iv.subspace.ambient_dim}, the site's vectors in "
                                 f"R^{want}")
        elif isinstance(iv, Hook):
            if not callable(iv.fn):
                raise TypeError(f"{label}: fn must be callable, got {type(iv.fn).__name__}")
        key = BEFORE if site in ("embed", "pos_embed") else arch.n_layers if site == "ln_final" else int(layer)
        out.setdefault(key, []).append(r)
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
    return (b, n, _width(arch, site))


def _width(arch, site: str) -> int:
    """The width of a site's vectors."""
    if site in ("q", "k", "q_prerotary", "k_prerotary"):
        return arch.d_head
    if site in ("v", "z"):
        return arch.mla["v_head_dim"] if arch.mla else arch.d_head
    widths = {"mlp_post": arch.d_ff, "router_logits": arch.n_experts,
              "kv_latent": arch.mla and arch.mla["kv_lora_rank"], "rope_keys": arch.mla and arch.mla["qk_rope_head_dim"]}
    return widths.get(site, arch.d_model)


def _field(label, name, value, site, layer):
    """A site's values at one layer (or a global site's) in a reference / source Forward, batch
    axis first, and its (batch, n) mask of real tokens."""
    if not all(hasattr(value, a) for a in ("layers", "positions", "attention_mask", "get")):  # a Forward
        raise TypeError(f"{label}: {name} must be a Forward (model.forward(..., keep=({site!r},))), got "
                        f"{type(value).__name__}")
    data = value.get(site)
    # the layers the site's stack holds (router logits: the kept layers with experts only)
    layers = value._site_layers(site) if hasattr(value, "_site_layers") else [int(i) for i in value.layers]
    if data is None or (layer is not None and layer not in layers):
        at = "" if layer is None else f" at layer {layer}"
        raise ValueError(f"{label}: {name} did not keep {site!r}{at} (pass keep=({site!r}, ...) and layers covering "
                         f"it)")
    a = np.asarray(data if layer is None else data[layers.index(layer)])
    real = np.asarray(value.attention_mask, bool)
    if value.positions.ndim == 1:  # one sequence: add the batch axis
        a, real = a[None], real[None]
    return a, real


def _ablation_values(label, iv, site, ref: np.ndarray, real: np.ndarray, shape) -> np.ndarray:
    b, n = shape
    if iv.mode == "mean" and site != "pattern":  # over the reference's real tokens
        if site in HEAD_SITES:
            return ref.transpose(0, 2, 1, 3)[real].mean(axis=0)  # (H, d)
        return ref[real].mean(axis=0)  # (d,)
    if _length(site, ref) != n:
        raise ValueError(f"{label}: reference has {_length(site, ref)} tokens, this pass {n}: "
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
        if r.site != site:
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


class Gate:
    """The one site gate of a forward pass: every site's value passes through it.

    ``gate(site, x)`` applies the interventions of the current layer at that site (in order)
    and keeps the value when the pass keeps the site at this layer; it returns the value the
    pass goes on with. :meth:`enter` moves it to a layer (``BEFORE`` for the embedding's
    sites, n_layers for the final norm's).

    Parameters
    ----------
    plan : ForwardPlan
        What the pass keeps and its checked interventions.
    out : Stacks
        Where kept values are written.
    """

    def __init__(self, plan, out):
        self.plan, self.out = plan, out
        self.enter(BEFORE)

    def enter(self, layer: int) -> None:
        """Move to a layer: its interventions, and whether its sites are kept."""
        self.todo = self.plan.interventions.get(layer, ())
        self.sites = frozenset(r.site for r in self.todo)
        self.here = layer in self.plan.layers

    def touches(self, site: str) -> bool:
        """Whether an intervention changes `site` here."""
        return site in self.sites

    def wants(self, site: str) -> bool:
        """Whether the pass keeps `site` here."""
        return (self.here or site in GLOBAL_SITES) and self.plan.wants(site)

    def needs(self, site: str) -> bool:
        """Whether `site`'s value must be formed here (kept or changed)."""
        return self.touches(site) or self.wants(site)

    def __call__(self, site: str, x):
        if site in self.sites:
            x = apply(self.todo, site, x, self.plan.single)
        if self.wants(site):
            self.out.put(site, x)
        return x
