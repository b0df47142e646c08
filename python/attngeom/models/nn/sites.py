"""The sites of a forward pass: one name for every activation, kept, cached or intervened on.

Every value the pass computes at a site goes through one gate (:class:`Gate`), which applies
that site's interventions and keeps the value when the pass keeps it. A site has one name in
two spellings: TransformerLens' full hook name (``"blocks.3.attn.hook_z"``) and a short form,
the site and its layer (``("z", 3)``; the global sites have no layer: ``"embed"``).
``Model.forward(keep=...)`` takes the short names (every kept layer), and
``Forward[...]`` and the interventions take either spelling.

=================  =====================================  ==============================  ========================
site               full name (layer 3)                    value (one layer, batch axis)   what it is
=================  =====================================  ==============================  ========================
``embed``          ``hook_embed``                         (b, n, d_model)                 the token embeddings
``pos_embed``      ``hook_pos_embed``                     (b, n, d_model)                 the position table's rows
                                                                                          (absolute positions)
``resid_pre``      ``blocks.3.hook_resid_pre``            (b, n, d_model)                 the stream entering the
                                                                                          layer
``attn_in``        ``blocks.3.ln1.hook_out``              (b, n, d_model)                 what attention reads
                                                                                          (the normed stream;
                                                                                          post-norm: the stream)
``q_prerotary``    ``blocks.3.attn.hook_q``               (b, n_heads, n, d_head)         queries and keys before
``k_prerotary``    ``blocks.3.attn.hook_k``                                               the rotary embedding
``v``              ``blocks.3.attn.hook_v``               (b, n_heads, n, d_v)            values
``q``, ``k``       ``blocks.3.attn.hook_rot_q``, ``_k``   (b, n_heads, n, d_head)         as attention uses them
                                                                                          (rotated)
``pattern``        ``blocks.3.attn.hook_pattern``         (b, n_heads, n, n)              the routing matrix P
``z``              ``blocks.3.attn.hook_z``               (b, n_heads, n, d_v)            each head's output P v
``attn_out``       ``blocks.3.hook_attn_out``             (b, n, d_model)                 attention's output
                                                                                          (after W_O and its bias)
``resid_mid``      ``blocks.3.hook_resid_mid``            (b, n, d_model)                 the stream between the
                                                                                          attention and the MLP
``mlp_in``         ``blocks.3.ln2.hook_out``              (b, n, d_model)                 what the MLP reads
``mlp_post``       ``blocks.3.mlp.hook_post``             (b, n, d_ff)                    the MLP's hidden units
                                                                                          (after the activation;
                                                                                          gated: act(gate) * up)
``mlp_out``        ``blocks.3.hook_mlp_out``              (b, n, d_model)                 the MLP's output
``resid_post``     ``blocks.3.hook_resid_post``           (b, n, d_model)                 the stream leaving the
                                                                                          layer
``ln_final``       ``ln_final.hook_out``                  (b, n, d_model)                 the model's output: the
                                                                                          final norm of the stream
``router_logits``  ``blocks.3.mlp.hook_router_logits``    (b, n, n_experts)               mixture of experts: the
                                                                                          router's logits
``kv_latent``      ``blocks.3.attn.hook_kv_latent``       (b, n, kv_lora_rank)            multi-head latent
                                                                                          attention: the latent
``rope_keys``      ``blocks.3.attn.hook_rope_keys``       (b, n, qk_rope_head_dim)        MLA's shared rotary key
                                                                                          (before its rotation)
=================  =====================================  ==============================  ========================

The full names are TransformerLens 4's (its TransformerBridge); its earlier HookedTransformer
names the three norms' outputs ``ln1.hook_normalized``, ``ln2.hook_normalized`` and
``ln_final.hook_normalized``, which TransformerLens 4 uses for the value before the norm's
weight and bias. Where the layout differs from TransformerLens': per-head values hold heads before positions,
and under grouped-query attention keys and values hold one copy per query head (as the
attention uses them). ``q`` and ``k`` are the rotated vectors (TransformerLens' hook_rot_q,
hook_rot_k); without a rotary embedding they equal ``q_prerotary`` and ``k_prerotary``
(hook_q, hook_k). In models with q_norm / k_norm (Qwen3), ``q_prerotary`` and
``k_prerotary`` hold the vectors after those norms, which TransformerLens names
hook_q_normed and hook_k_normed (its hook_q and hook_k are the vectors before the norms,
which have no site here). In the post-norm BERT encoder the stream is normed inside the layer:
``resid_mid`` and ``resid_post`` are the streams after the layer's first and second
LayerNorm (what the next step reads), and ``ln_final`` is the last layer's output.
``mlp_post`` exists in models whose every layer has a dense MLP.
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

#: short name -> the TransformerLens hook name ("{}" is the layer).
SITE_NAMES = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "resid_pre": "blocks.{}.hook_resid_pre",
    "attn_in": "blocks.{}.ln1.hook_out",
    "q_prerotary": "blocks.{}.attn.hook_q",
    "k_prerotary": "blocks.{}.attn.hook_k",
    "v": "blocks.{}.attn.hook_v",
    "q": "blocks.{}.attn.hook_rot_q",
    "k": "blocks.{}.attn.hook_rot_k",
    "pattern": "blocks.{}.attn.hook_pattern",
    "z": "blocks.{}.attn.hook_z",
    "attn_out": "blocks.{}.hook_attn_out",
    "resid_mid": "blocks.{}.hook_resid_mid",
    "mlp_in": "blocks.{}.ln2.hook_out",
    "mlp_post": "blocks.{}.mlp.hook_post",
    "mlp_out": "blocks.{}.hook_mlp_out",
    "resid_post": "blocks.{}.hook_resid_post",
    "ln_final": "ln_final.hook_out",
    "router_logits": "blocks.{}.mlp.hook_router_logits",
    "kv_latent": "blocks.{}.attn.hook_kv_latent",
    "rope_keys": "blocks.{}.attn.hook_rope_keys",
}
#: Every site, in the order the pass reaches it.
SITES = tuple(SITE_NAMES)
#: The sites with no layer (one value per pass).
GLOBAL_SITES = ("embed", "pos_embed", "ln_final")
#: The sites whose values are per head (heads on axis 1 of a batch's value).
HEAD_SITES = ("q_prerotary", "k_prerotary", "v", "q", "k", "pattern", "z")
#: The interventions' keys of the global sites: before layer 0, and after the last layer.
BEFORE = -1

_MATCHERS = [(re.compile(re.escape(template).replace(re.escape("{}"), r"(\d+)")), site)
             for site, template in SITE_NAMES.items()]


def full_name(site: str, layer: Optional[int] = None) -> str:
    """TransformerLens' hook name of a site (``full_name("z", 3)`` is ``"blocks.3.attn.hook_z"``)."""
    template = SITE_NAMES[site]
    return template.format(layer) if "{}" in template else template


def parse_site(name, layer=None, *, what: str = "site") -> Tuple[str, Optional[int]]:
    """(short name, layer or None) of a site given as a short name, a full hook name, or a
    (short name, layer) tuple; `layer` given beside a name must agree with it.

    Raises
    ------
    ValueError
        For an unknown name (the message names `what` and lists the short names), or a
        layer that disagrees with the full name's.

    Examples
    --------
    >>> from attngeom.models.nn.sites import parse_site
    >>> parse_site("blocks.3.attn.hook_z"), parse_site(("z", 3)), parse_site("ln_final")
    (('z', 3), ('z', 3), ('ln_final', None))
    """
    given = layer
    if isinstance(name, tuple) and len(name) == 2 and isinstance(name[0], str):
        name, layer = name
        if given is not None and given != layer:
            raise ValueError(f"{what}: {name!r} at layer {layer} and layer {given} disagree")
    if not isinstance(name, str):
        raise ValueError(f"{what} must be a site name (e.g. 'z' or 'blocks.3.attn.hook_z'), got {name!r}")
    if name in SITE_NAMES:
        return name, layer
    for rx, site in _MATCHERS:
        match = rx.fullmatch(name)
        if match is not None:
            break
    else:
        raise ValueError(f"{what}: unknown site {name!r}; the sites are {', '.join(SITES)} (or their "
                         f"TransformerLens names, e.g. 'blocks.0.attn.hook_z')")
    found = int(match.group(1)) if match.groups() else None
    if given is not None and found is not None and given != found:
        raise ValueError(f"{what}: {name!r} names layer {found}, but layer {given} was given")
    return site, found if found is not None else layer


def model_sites(arch) -> tuple:
    """The sites a model has (its position table, experts and latent attention decide)."""
    dense = arch.n_experts == 0 and arch.d_ff > 0
    absent = {"pos_embed": arch.max_positions is None,
              "mlp_post": not dense,
              "router_logits": arch.n_experts == 0,
              "kv_latent": arch.mla is None,
              "rope_keys": arch.mla is None}
    return tuple(s for s in SITES if not absent.get(s, False))
