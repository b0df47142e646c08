"""The result of a model's forward pass (:class:`Forward`) and what a pass keeps (:class:`ForwardPlan`).

Every per-layer quantity is stacked over the kept layers on the first axis, so ``f.q[i]`` is
the queries of layer ``f.layers[i]`` (layer i when every layer is kept, the default). Shapes
are for one sequence of n tokens; a batch of sequences (2-D token ids) adds a batch axis after
the layer axis (``f.q[i]`` is then (batch, n_heads, n, d_head), ``f.logits`` (batch, m, vocab)).

What a pass keeps is chosen by ``Model.forward(keep=, layers=, logits_at=)``: the fields not
kept are None and are never allocated, so a pass that keeps only the streaming attention
statistics and the last position's logits runs at lengths where the (n_heads, n, n) attention
of one layer would not fit in memory. Before anything is allocated, :func:`forward_bytes`
estimates what the kept fields and the working arrays need; a request beyond the memory
available (or beyond ``MAX_ARRAY_BYTES`` for one field) is refused with a ValueError naming
the field, its size and ``keep=``.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..._config import get_num_threads
from ..._operands import MAX_ARRAY_BYTES
from ..._deprecation import deprecated, renamed_field
from ...attention_stats import FIELDS as STATS_FIELDS, AttentionStats
from .sites import GLOBAL_SITES, SITES, model_sites, parse_site

_LAYER = {"axes": "layer"}   # (layers, [batch,] ...): the batch axis is axis 1
_BATCH = {"axes": "batch"}   # ([batch,] ...): the batch axis is axis 0


@dataclass(repr=False)
class Forward:
    """What one forward pass computed, in the library's layout (tokens are rows), keyed by site.

    Every site of :mod:`attngeom.models.nn.sites` is a field; the sites the pass was asked
    not to keep (``Model.forward(keep=...)``) are None. A site is read three ways:
    ``f.z`` (stacked over the kept layers), ``f["z"]`` (the same), and one layer by either
    spelling of its name, ``f["z", 3]`` or ``f["blocks.3.attn.hook_z"]``, as a
    TransformerLens cache is read.

    Attributes
    ----------
    logits : ndarray, shape ([batch,] m, vocab) or None
        The next-token logits at the m positions ``logits_positions`` (every position by
        default, m = n); None for a checkpoint without an unembedding (BERT).
    embed, pos_embed : ndarray, shape ([batch,] n, d_model) or None
        The token embeddings and the position table's rows (models with one).
    resid_pre : ndarray, shape (n_kept, [batch,] n, d_model)
        The residual stream entering each kept layer ([0] the embeddings when layer 0 is kept).
    attn_in : ndarray, shape (n_kept, [batch,] n, d_model)
        What each layer's attention reads: the normed residual stream of pre-norm models,
        the stream itself in post-norm BERT (the ``x`` of ModelHeads' diagnostics).
    q, k, v : ndarray, shape (n_kept, [batch,] n_heads, n, d_head)
        Queries, keys and values as the attention uses them: after q_norm / k_norm and the
        rotary embedding, biases included, keys and values repeated for every query head
        of a grouped-query model, so ``softmax_attention(q[i], k[i], v[i], causal=True,
        mask=...)`` reproduces layer ``layers[i]`` (with ``scale[i]``). Under multi-head
        latent attention (DeepSeek-V2) q and k have width qk_nope_head_dim +
        qk_rope_head_dim, the rotary columns last, and v has width v_head_dim.
    q_prerotary, k_prerotary : ndarray, shape (n_kept, [batch,] n_heads, n, d_head)
        The same before the rotary embedding (equal to q, k for models without one).
    pattern : ndarray, shape (n_kept, [batch,] n_heads, n, n)
        The routing matrices P of every head.
    z : ndarray, shape (n_kept, [batch,] n_heads, n, d_head) or None
        Each head's output P v before W_O (TransformerLens' hook_z).
    attn_out, mlp_out : ndarray, shape (n_kept, [batch,] n, d_model) or None
        The attention block's output (after W_O and its bias) and the MLP block's output.
    resid_mid, resid_post : ndarray, shape (n_kept, [batch,] n, d_model) or None
        The residual stream between attention and the MLP, and leaving each layer (before
        any final norm).
    mlp_in : ndarray, shape (n_kept, [batch,] n, d_model) or None
        What each MLP reads (the normed stream; post-norm: the stream).
    mlp_post : ndarray, shape (n_kept, [batch,] n, d_ff) or None
        The MLP's hidden units after the activation (models with dense MLPs).
    ln_final : ndarray, shape ([batch,] n, d_model) or None
        The model's output: the final norm of the last stream (BERT: the last layer's output).
    router_logits : ndarray, shape (n_kept_moe, [batch,] n, n_experts) or None
        The router logits of mixture-of-experts models (:mod:`.moe`), for the kept
        layers among ``arch.moe_layers`` (all layers of Mixtral; DeepSeek-V2's first layers
        are dense); None otherwise.
    kv_latent : ndarray, shape (n_kept, [batch,] n, kv_lora_rank) or None
        Multi-head latent attention (:mod:`.mla`): the latent c_KV every layer caches, after
        its kv_a_layernorm; None for other models.
    rope_keys : ndarray, shape (n_kept, [batch,] n, qk_rope_head_dim) or None
        MLA's decoupled rotary key k_R (before the rotation), shared by every head.
    attention_stats : AttentionStats or None
        Per-query statistics of every head's routing matrix (log Z, entropy, largest
        weight and its key, weight on key 0, mean query-key distance), each of shape
        (n_kept, [batch,] n_heads, n), computed inside the streaming attention kernel without
        the (n, n) matrix: kept only when asked for (``keep=("attention_stats", ...)``).
        Keys and distances are array positions: in a left-padded sequence key 0 is a pad
        (its sink_weight is 0); pad on the right, or pass one sequence, for the sink mass.
    scale : ndarray, shape (n_kept,)
        The logit scale of every kept layer (1 / sqrt(d_head) except GPT-2 options).
    positions : ndarray of int, shape ([batch,] n)
        The position of every token (cumulative count of unpadded tokens minus one).
    attention_mask : ndarray of bool, shape ([batch,] n)
        True for real tokens, False for padding. Rows and columns of padded tokens are
        not meaningful (a padded query row of P may be all zeros).
    layers : ndarray of int, shape (n_kept,)
        The layers the per-layer sites hold, increasing (every layer by default).
    logits_positions : ndarray of int, shape ([batch,] m)
        The token index of every row of ``logits`` in its sequence.

    The transformers names of the fields ``hidden_states`` (now ``resid_pre`` and
    ``ln_final``), ``attentions`` (``pattern``) and ``attention_inputs`` (``attn_in``) work
    for one release, with a DeprecationWarning.

    Examples
    --------
    >>> from attngeom.models import Forward
    >>> f = Forward(None, scale=np.ones(2) / 2, positions=np.arange(4), attention_mask=np.ones(4, bool),
    ...             z=np.zeros((2, 2, 4, 8)))
    >>> f.n_layers, f.n_tokens, f.layers.tolist(), f["blocks.1.attn.hook_z"].shape, list(f.keys())
    (2, 4, [0, 1], (2, 4, 8), ['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z'])
    """

    logits: Optional[np.ndarray] = field(metadata=_BATCH)
    scale: np.ndarray = None
    positions: np.ndarray = field(default=None, metadata=_BATCH)
    attention_mask: np.ndarray = field(default=None, metadata=_BATCH)
    embed: Optional[np.ndarray] = field(default=None, metadata=_BATCH)
    pos_embed: Optional[np.ndarray] = field(default=None, metadata=_BATCH)
    resid_pre: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    attn_in: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    q_prerotary: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    k_prerotary: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    v: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    q: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    k: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    pattern: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    z: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    attn_out: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    resid_mid: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    mlp_in: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    mlp_post: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    mlp_out: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    resid_post: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    ln_final: Optional[np.ndarray] = field(default=None, metadata=_BATCH)
    router_logits: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    kv_latent: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    rope_keys: Optional[np.ndarray] = field(default=None, metadata=_LAYER)
    attention_stats: Optional[AttentionStats] = field(default=None, metadata=_LAYER)
    layers: Optional[np.ndarray] = None
    logits_positions: Optional[np.ndarray] = field(default=None, metadata=_BATCH)

    attentions = renamed_field("pattern")
    attention_inputs = renamed_field("attn_in")

    @property
    def hidden_states(self) -> Optional[np.ndarray]:
        """Deprecated: transformers' hidden states, ``resid_pre`` of the kept layers and then
        ``ln_final`` stacked (None unless both were kept)."""
        deprecated("Forward", "the field", "hidden_states", "resid_pre (and ln_final for the output)")
        if self.resid_pre is None or self.ln_final is None:
            return None
        return np.concatenate([self.resid_pre, self.ln_final[None]])

    # -- by site name ------------------------------------------------------------------
    def get(self, name, default=None):
        """A site's value by name (:meth:`__getitem__`), or `default` when it was not kept."""
        try:
            return self[name]
        except KeyError:
            return default

    def __getitem__(self, name):
        """A site's value: ``f["z"]`` (stacked over the kept layers), ``f["z", 3]`` or
        ``f["blocks.3.attn.hook_z"]`` (one layer). KeyError for a site not kept, or a layer
        not kept; ValueError for an unknown name."""
        site, layer = parse_site(name, what="Forward[...]")
        value = getattr(self, site)
        if value is None:
            raise KeyError(f"Forward: the site {site!r} was not kept (keep=({site!r}, ...))")
        if layer is None or site in GLOBAL_SITES:
            return value
        layers = self._site_layers(site)
        if layer not in layers:
            raise KeyError(f"Forward: the site {site!r} was not kept at layer {layer} (kept: {layers})")
        i = layers.index(layer)
        return value.map(lambda a: a[i]) if isinstance(value, AttentionStats) else value[i]

    def __contains__(self, name) -> bool:
        """Whether the site `name` was kept; False for a name that is no site, as ``in`` is
        for a dict."""
        try:
            return self.get(name) is not None
        except (ValueError, TypeError):
            return False

    def _site_layers(self, site: str) -> list:
        """The layers a per-layer site's stack holds."""
        layers = [int(i) for i in self.layers]
        if site == "router_logits" and self.router_logits is not None and len(self.router_logits) != len(layers):
            return layers[len(layers) - len(self.router_logits):]  # the kept layers with experts: the last ones
        return layers

    def keys(self):
        """The TransformerLens names of every kept value, in the order the pass reaches them
        (the embeddings, then layer by layer, then the final norm)."""
        from .sites import SITES, full_name

        kept = [site for site in SITES if getattr(self, site) is not None]
        for site in kept:
            if site in ("embed", "pos_embed"):
                yield full_name(site)
        per_layer = {site: self._site_layers(site) for site in kept if site not in GLOBAL_SITES}
        for layer in (int(i) for i in self.layers):
            for site, layers in per_layer.items():
                if layer in layers:
                    yield full_name(site, layer)
        if "ln_final" in kept:
            yield full_name("ln_final")

    def items(self):
        """(TransformerLens name, value) of every kept value, in pass order."""
        for name in self.keys():
            yield name, self[name]

    def __post_init__(self):
        if self.layers is None:
            self.layers = np.arange(len(self.scale))
        if self.logits_positions is None and self.logits is not None:
            n = self.positions.shape[-1]
            self.logits_positions = np.broadcast_to(np.arange(n), self.positions.shape).copy()

    def __repr__(self) -> str:
        """A few lines: the batch, the layers held, each kept field's shape, what was not kept."""
        shape = self.positions.shape
        lines = [f"Forward({'x'.join(map(str, shape))} tokens, layers {self.layers.tolist()}"]
        missing = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("positions", "attention_mask", "layers"):
                continue
            if value is None:
                missing.append(f.name)
            else:
                lines.append(f"  {f.name}: {tuple(value.shape)}" + ("" if isinstance(value, AttentionStats)
                                                                      else f" {value.dtype}"))
        if missing:
            lines.append(f"  not kept: {', '.join(missing)}")
        return "\n".join(lines) + ")"

    @property
    def n_layers(self) -> int:
        """The number of layers the per-layer fields hold (``len(layers)``)."""
        return len(self.layers)

    @property
    def n_tokens(self) -> int:
        """n, the (padded) sequence length."""
        return self.positions.shape[-1]

    @property
    def last_hidden_state(self) -> Optional[np.ndarray]:
        """([batch,] n, d_model) the model's output, ``ln_final`` (None when it was not kept)."""
        return self.ln_final

    def sequence(self, index: int) -> "Forward":
        """The pass of one sequence of a batch: every field without its batch axis.

        Parameters
        ----------
        index : int
            The sequence, 0 <= index < batch.

        Returns
        -------
        Forward
            Views of this pass's arrays, with the shapes of a one-sequence pass.

        Examples
        --------
        >>> f0 = model.forward(ids_batch).sequence(0)  # doctest: +SKIP
        """
        changes = {}
        for f in dataclasses.fields(self):
            value, axes = getattr(self, f.name), f.metadata.get("axes")
            if value is None or axes is None:
                continue
            take = (lambda a: a[index]) if axes == "batch" else (lambda a: a[:, index])
            changes[f.name] = value.map(take) if isinstance(value, AttentionStats) else take(value)
        return dataclasses.replace(self, **changes)


#: What ``Model.forward(keep=...)`` chooses among: the logits, every site, the attention
#: statistics (scale, positions, attention_mask, layers and logits_positions are always kept).
KEEPABLE = ("logits",) + SITES + ("attention_stats",)
#: What ``keep=None`` keeps: the logits, the stream entering each layer and the output, and
#: the attention's inputs, queries, keys, values and weights (with the router's and the
#: latent's sites where the model has them). The other sites are kept when named;
#: ``keep="all"`` keeps every site.
KEEP_DEFAULT = ("logits", "resid_pre", "ln_final", "attn_in", "q_prerotary", "k_prerotary", "v", "q", "k", "pattern",
                "router_logits", "kv_latent", "rope_keys")
#: The transformers names ``keep=`` still takes for one release, and the sites they keep.
RENAMED_KEEP = {"hidden_states": ("resid_pre", "ln_final"), "attentions": ("pattern",),
                "attention_inputs": ("attn_in",)}


@dataclass(frozen=True)
class ForwardPlan:
    """What a forward pass keeps, checked: built by :func:`plan_forward`.

    Attributes
    ----------
    keep : frozenset of str
        The kept fields (of :data:`KEEPABLE`).
    layers : tuple of int
        The layers whose per-layer fields are kept, increasing.
    logits_at : ndarray of int, shape (batch, m), or None
        The token index of every logits row per sequence (None: every position).
    interventions : dict
        {layer: checked interventions} (:func:`attngeom.models.nn.interventions.check_interventions`).
    single : bool
        Whether the input was one sequence (Hook functions then see no batch axis).
    """

    keep: frozenset
    layers: tuple
    logits_at: Optional[np.ndarray] = None
    interventions: dict = field(default_factory=dict)
    single: bool = False

    def wants(self, name: str, layer: Optional[int] = None) -> bool:
        """Whether field `name` is kept (at `layer`, for a per-layer field)."""
        return name in self.keep and (layer is None or layer in self.layers)


def keep_names(keep, where: str = "Model.forward()", stacklevel: int = 3) -> frozenset:
    """A ``keep=`` argument as the set of kept names: None (:data:`KEEP_DEFAULT`), "all"
    (everything), or a name or a sequence of names of :data:`KEEPABLE` (sites by their short
    names: a site is kept at every kept layer, chosen by ``layers=``). The transformers names of :data:`RENAMED_KEEP` warn once and keep their sites
    (`stacklevel` 3: the caller of the public function calling this one)."""
    if keep is None:
        return frozenset(KEEP_DEFAULT)
    if isinstance(keep, str) and keep == "all":
        return frozenset(KEEPABLE)
    names = (keep,) if isinstance(keep, str) else keep
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"keep must be a site name or a sequence of them, got {type(keep).__name__}") from None
    out = set()
    for name in names:
        if isinstance(name, str) and name in RENAMED_KEEP:
            deprecated(where, "the keep name", name, " and ".join(RENAMED_KEEP[name]), stacklevel=stacklevel)
            out.update(RENAMED_KEEP[name])
        elif not isinstance(name, str) or name not in KEEPABLE:
            raise ValueError(f"keep: unknown site {name!r}; keep takes {', '.join(KEEPABLE)} (or 'all')")
        else:
            out.add(name)
    return frozenset(out)


def check_layers(layers, n_layers: int) -> tuple:
    """A layers argument (None: all; an index; a sequence of indices, negative from the end) as
    increasing unique layer indices; TypeError / ValueError naming ``layers`` otherwise."""
    if layers is None:
        return tuple(range(n_layers))
    items = [layers] if np.ndim(layers) == 0 else list(np.asarray(layers, dtype=object).reshape(-1))
    if any(isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) for i in items):
        raise TypeError(f"layers must be an integer or a sequence of integers, got {layers!r}")
    items = [int(i) for i in items]
    bad = [i for i in items if not -n_layers <= i < n_layers]
    if bad:
        raise ValueError(f"layers: {bad[0]} is out of range for a model of {n_layers} layers (0..{n_layers - 1}, "
                         f"or negative from the end)")
    if not items:
        raise ValueError("layers must name at least one layer")
    return tuple(sorted({i % n_layers for i in items}))


def _logits_at_arg(logits_at, mask: np.ndarray) -> Optional[np.ndarray]:
    b, n = mask.shape
    if logits_at is None:
        return None
    if isinstance(logits_at, str):
        if logits_at == "all":
            return None
        if logits_at != "last":
            raise ValueError(f"logits_at must be 'last', 'all', None or token indices, got {logits_at!r}")
        last = n - 1 - np.argmax(mask[:, ::-1], axis=1)  # the last real token of each sequence
        return last[:, None].astype(np.int64)
    idx = np.asarray(logits_at)
    if idx.dtype.kind not in "iu" or idx.ndim > 1 or idx.size == 0:
        raise ValueError(f"logits_at must be 'last', 'all', None or a non-empty 1-D array of token indices, got "
                         f"{logits_at!r}")
    bad = idx[(idx < -n) | (idx >= n)]
    if bad.size:
        raise ValueError(f"logits_at: token index {int(bad[0])} is out of range for sequences of {n} tokens")
    idx = idx.reshape(-1).astype(np.int64) % n
    return np.broadcast_to(idx, (b, idx.size)).copy()


def plan_forward(arch, mask: np.ndarray, dtype, *, keep=None, layers=None, logits_at=None,
                 available: Optional[int] = None, interventions=None, single: bool = False) -> ForwardPlan:
    """Check ``keep``, ``layers`` and ``logits_at`` and refuse a pass beyond memory.

    Parameters
    ----------
    arch : Architecture
        The model.
    mask : ndarray of bool, shape (batch, n)
        The checked attention mask.
    dtype : numpy dtype
        The computation dtype.
    keep, layers, logits_at, interventions
        As :meth:`attngeom.models.Model.forward`.
    available : int, optional
        Bytes of memory the pass may use (default: what the system reports available).

    Returns
    -------
    ForwardPlan

    Raises
    ------
    ValueError
        An unknown field in `keep`, a layer or token index out of range, `logits_at` without
        logits kept, and a pass whose estimate (:func:`forward_bytes`) exceeds `available`
        (or one field beyond ``MAX_ARRAY_BYTES``): the message names the largest kept field,
        its size and ``keep=``.
    """
    from .interventions import check_interventions

    kept = keep if isinstance(keep, frozenset) else keep_names(keep, stacklevel=4)
    kept = kept & frozenset(("logits", "attention_stats") + model_sites(arch))  # the sites this model has
    plan = ForwardPlan(kept, check_layers(layers, arch.n_layers), _logits_at_arg(logits_at, mask),
                       check_interventions(interventions, arch, mask.shape, single), single)
    if plan.logits_at is not None and "logits" not in kept:
        raise ValueError("logits_at was given but keep does not hold 'logits'")
    sizes = forward_bytes(arch, mask.shape, dtype, plan)
    fields = {name: size for name, size in sizes.items() if name != "working"}
    total = sum(sizes.values())
    limit = available_bytes() if available is None else int(available)
    big = max(fields, key=fields.get) if fields else "working"
    big_size = sizes[big]
    if big_size > MAX_ARRAY_BYTES or total > limit:
        b, n = mask.shape
        where = (f"{big_size / 2 ** 30:.3g} GiB for {big!r}" if big != "working"
                 else f"{big_size / 2 ** 30:.3g} GiB of working arrays")
        why = (f"beyond the limit of {MAX_ARRAY_BYTES / 2 ** 30:.0f} GiB for one array" if big_size > MAX_ARRAY_BYTES
               else f"{total / 2 ** 30:.3g} GiB in all, more than the {limit / 2 ** 30:.3g} GiB of memory available")
        hint = ("keep only what is needed, e.g. keep=('attention_stats', 'logits') with logits_at='last'"
                if big != "working" else "use a shorter input or a smaller batch")
        raise ValueError(f"Model.forward on {b} x {n} tokens would need {where} ({why}); {hint}, "
                         f"or fewer layers=")
    return plan


def forward_bytes(arch, shape, dtype, plan: ForwardPlan) -> dict:
    """Bytes a forward pass allocates: each kept field's size, and "working" for the arrays
    one layer needs while it runs (queries, keys and values, the MLP's hidden units of the
    blocks running at once, the residual stream, P where it is kept or intervened on, a
    sliding window's mask).

    Parameters
    ----------
    arch : Architecture
        The model.
    shape : tuple of int
        (batch, n) of the token ids.
    dtype : numpy dtype
        The computation dtype.
    plan : ForwardPlan
        What is kept.

    Returns
    -------
    dict
        {field name: bytes} for the kept fields the model has, and "working".

    Examples
    --------
    >>> sizes = forward_bytes(model.arch, (1, 4096), np.float32, plan)  # doctest: +SKIP
    """
    b, n = (int(s) for s in shape)
    item = np.dtype(dtype).itemsize
    a = arch
    L = len(plan.layers)
    H, d = a.n_heads, a.d_model
    d_qk, d_v = a.d_head, (a.mla["v_head_dim"] if a.mla else a.d_head)
    m = n if plan.logits_at is None else plan.logits_at.shape[1]
    moe = sum(1 for i in plan.layers if i in a.moe_layers)
    n_ff = a.d_ff
    per_layer = L * b * n
    elements = {
        "logits": b * m * a.vocab_size if not a.bidirectional else 0,
        "embed": b * n * d, "pos_embed": b * n * d if a.max_positions is not None else 0,
        "resid_pre": per_layer * d, "attn_in": per_layer * d,
        "q_prerotary": per_layer * H * d_qk, "k_prerotary": per_layer * H * d_qk, "v": per_layer * H * d_v,
        "q": per_layer * H * d_qk, "k": per_layer * H * d_qk,
        "pattern": L * b * H * n * n, "z": per_layer * H * d_v, "attn_out": per_layer * d,
        "resid_mid": per_layer * d, "mlp_in": per_layer * d, "mlp_post": per_layer * n_ff if not a.n_experts else 0,
        "mlp_out": per_layer * d, "resid_post": per_layer * d, "ln_final": b * n * d,
        "router_logits": moe * b * n * a.n_experts,
        "kv_latent": per_layer * a.mla["kv_lora_rank"] if a.mla else 0,
        "rope_keys": per_layer * a.mla["qk_rope_head_dim"] if a.mla else 0,
        "attention_stats": L * b * H * n * (len(STATS_FIELDS) - 1 + 8 / item),
    }
    out = {name: int(elements[name] * item) for name in KEEPABLE if name in plan.keep and elements[name]}
    rows = min(b * n, MLP_ROWS * get_num_threads())  # the MLP blocks the pool runs at once when split by rows
    # split by columns: one block of at most MLP_ROWS tokens' q, k, v products at a time
    qkv_block = min(b * n, MLP_ROWS) * (H + 2 * a.n_kv_heads) * max(d_qk, d_v)
    weights = b * H * n * n  # one layer's P, formed when kept or changed by an intervention
    touched = {r.site for todo in plan.interventions.values() for r in todo}
    hidden = "mlp_post" in plan.keep or "mlp_post" in touched  # the MLP's hidden units of the whole pass
    working = item * (6 * b * H * n * max(d_qk, d_v) + qkv_block + 4 * rows * n_ff + 4 * b * n * d
                      + (weights if "pattern" in plan.keep else 0) + (2 * weights if "pattern" in touched else 0)
                      + (b * n * n_ff if hidden else 0))
    if a.sliding_layers:  # the window's (b, 1, n, n) boolean mask
        working += b * n * n
    out["working"] = int(working)
    return out


#: Rows of the residual stream the MLP takes at a time beyond which a pass splits it into blocks.
MLP_ROWS = 4096


def available_bytes() -> int:
    """The memory the system reports available (MemAvailable; all physical memory when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2 ** 62


#: glibc's malloc settings under keep_weights (retain_freed_memory): its largest mmap
#: threshold (32 MiB; a larger value is refused) and a trim threshold of 1 GiB.
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 1 << 30
_retaining = None  # None: not asked yet; then whether glibc took the settings


def retain_freed_memory() -> bool:
    """Let the process keep freed memory for the next allocation (glibc's malloc), once.

    A pass allocates and frees its activations layer by layer. glibc's defaults return a freed
    block of more than 128 kB (a threshold that adapts up to 32 MiB) and the free top of a
    heap beyond twice that to the system, so each layer and each pass faults the same memory
    in again, zeroed by the kernel, and the faults of the pool's threads serialize in the
    kernel. Measured on a Qwen3-0.6B-shaped forward of 512 tokens in float32 (AMD Zen 3, 2
    threads): 302,000 minor faults and 1.2 s of system time a pass, against 500 faults and
    0.02 s with the thresholds raised. This raises, for the whole process, the mmap threshold
    to 32 MiB and the trim threshold to 1 GiB (``mallopt``): blocks up to 32 MiB come from the
    heap, and up to 1 GiB of free heap stays with the process. It is what
    :attr:`attngeom.models.Model.keep_weights` asks for, besides the weights; with another
    C library (musl, macOS, Windows) nothing changes.

    Returns
    -------
    bool
        Whether glibc took the settings (False elsewhere).
    """
    global _retaining
    if _retaining is None:
        _retaining = False
        try:
            libc = ctypes.CDLL(None)  # the C library the process runs on
            libc.gnu_get_libc_version  # glibc's own symbol: another library's mallopt means other things
            mallopt = libc.mallopt
        except (OSError, AttributeError, TypeError):
            return False
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
        _retaining = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                         TRIM_THRESHOLD))
    return _retaining


class Stacks:
    """Per-layer arrays written into one preallocated (count, ...) array per field, allocated
    at the first write (no list of arrays and np.stack copy: half the peak memory)."""

    def __init__(self, plan: ForwardPlan, counts: dict):
        self._plan, self._counts, self._arrays, self._next = plan, counts, {}, {}

    def put(self, name: str, value) -> None:
        """Write the next slot of field `name` (an ndarray, or an AttentionStats)."""
        i = self._next.get(name, 0)
        if name not in self._arrays:
            count = self._counts[name]
            if isinstance(value, AttentionStats):
                self._arrays[name] = value.map(lambda a: np.empty((count,) + a.shape, a.dtype))
            else:
                self._arrays[name] = np.empty((count,) + value.shape, value.dtype)
        target = self._arrays[name]
        if isinstance(target, AttentionStats):
            for f in STATS_FIELDS:
                getattr(target, f)[i] = getattr(value, f)
        else:
            target[i] = value
        self._next[name] = i + 1

    def get(self, name: str):
        """The stacked field, or None when nothing was written."""
        return self._arrays.get(name)
