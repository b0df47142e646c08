"""One NumPy forward pass for every supported family: GPT-2, the Llama family, attngeom's own
checkpoints and the BERT encoder.

The network is parametrised by its :class:`Architecture` (no class per family). The pre-norm
decoders:

    h_0     = E[ids] (+ P[positions] for GPT-2's absolute positions)
    x_l     = Norm(h_l)                       LayerNorm (GPT-2) or RMSNorm (Llama family)
    q, k, v = x_l W_Q + b_Q, x_l W_K + b_K, x_l W_V + b_V   (per head; biases where stored)
    q, k    = RMSNorm_dh(q), RMSNorm_dh(k)    Qwen3's q_norm / k_norm only
    q, k    = q R(m), k R(m)                  rotary models (:mod:`.rotary`)
    a_l     = sum_h softmax(scale q_h k_h^T + causal/padding/window mask) v_h W_O[h] + b_O
    h'_l    = h_l + a_l
    h_{l+1} = h'_l + MLP(Norm(h'_l))          GELU (GPT-2), SwiGLU (down(silu(gate) * up)), or Mixtral's top-k SwiGLU experts
    logits  = Norm_f(h_L) W_U^T               W_U the lm_head or, tied, the embedding

DeepSeek-V2's multi-head latent attention replaces the q, k, v line (:mod:`.mla`: keys and
values expanded from a normed latent c_KV, a decoupled rotary key shared by the heads), and
its MLP is dense in the first layers and routed plus shared experts after (:mod:`.moe`).
BERT is the post-norm, bidirectional case: h_0 = LN(E[ids] + P[positions] + T[types]),
h'_l = LN_1(h_l + a_l) with a_l read from h_l itself, h_{l+1} = LN_2(h'_l + MLP(h'_l)), no
final norm and no logits. attngeom-gpt checkpoints (:mod:`attngeom.torch.gpt`) are the Llama
path with LayerNorm biases, a 4x GELU MLP (none in attention-only models) and RoPE or a learned
position table. Grouped-query keys and values are repeated for every query head of their group. Every
attention is one call of :func:`attngeom.softmax_attention` (causal, with a boolean key mask
for padding and a band for sliding-window layers). Weights stay as stored, memory-mapped
(:meth:`Checkpoint.mapped`: float16 kept, bfloat16 as a :class:`BFloat16Array`), and each
layer's weights are cast to the computation dtype (bfloat16 widened exactly) when the forward
pass reaches that layer; the embedding is read at the tokens' rows only and the unembedding
in blocks of the vocabulary, so no float32 copy of the whole model is ever made.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ...attention import softmax_attention
from ...attention_stats import AttentionStats
from ..io.architecture import ACTIVATION_FUNCTIONS, Architecture
from ..io.checkpoint import Checkpoint
from ..io.safetensors import release_pages
from ..io.weights import read_weights
from .forward import KEEP_DEFAULT, KEEPABLE, MLP_ROWS, Forward, ForwardPlan, Stacks
from .interventions import apply, sites_at
from .mla import mla_attention_inputs
from .moe import moe_mlp
from .norm import normalize
from .products import for_row_blocks, map_rows, product, product_threads
from .rotary import Rotary, rope_frequencies, yarn_factors


_UNEMBED_ROWS = 16384  # vocabulary rows cast at a time (16384 x 4096 float32 = 256 MiB at most)


def _unembed(final, W, dt):
    """final (..., d) @ W^T for W (vocab, d) as stored, cast in blocks of vocabulary rows."""
    V = W.shape[0]
    logits = np.empty(final.shape[:-1] + (V,), dt)
    for i in range(0, V, _UNEMBED_ROWS):
        logits[..., i:i + _UNEMBED_ROWS] = product(final, W[i:i + _UNEMBED_ROWS].astype(dt, copy=False).T)
        release_pages(W[i:i + _UNEMBED_ROWS])
    return logits


class Decoder:
    """The weights of a GPT-2 or Llama-family checkpoint and its forward pass (module docstring).

    Build with :meth:`from_checkpoint`; used through :class:`attngeom.models.Model`.

    Parameters
    ----------
    arch : Architecture
        The network.
    weights : dict
        Global tensors ("embed", "pos", "norm_w", "norm_b", "unembed") and "layers", a list of
        per-layer dicts, every matrix in (in, out) orientation (y = x W).

    Examples
    --------
    >>> dec = Decoder.from_checkpoint("tiny-llama")  # doctest: +SKIP
    >>> dec.forward(np.array([[1, 2, 3]])).logits.shape  # doctest: +SKIP
    (1, 3, 100)
    """

    def __init__(self, arch: Architecture, weights: dict):
        self.arch = arch
        self.w = weights
        self.rotary = None if arch.rope is None else Rotary(rope_frequencies(arch.rope, arch.rotary_dim),
                                                             interleaved=arch.mla is not None,
                                                             attention_factor=yarn_factors(arch.rope)[0])

    # -- loading -----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, ck: Checkpoint, arch: Architecture, prefix: str) -> "Decoder":
        """The Decoder of an opened checkpoint, its :class:`Architecture` and the layout prefix of
        its layer names ("model.", "transformer.", ""): every tensor read and checked by
        :func:`attngeom.models.io.weights.read_weights` (ValueError for a missing tensor or a
        shape config.json disagrees with).

        Example: ``dec = Decoder.from_checkpoint(ck, arch, "model.")``
        """
        return cls(arch, read_weights(ck, arch, prefix))

    @property
    def has_unembedding(self) -> bool:
        """Whether the checkpoint has an lm_head (or ties it to the embedding)."""
        return self.w["unembed"] is not None

    def final_norm(self, h: np.ndarray) -> np.ndarray:
        """The final norm N_f applied to residual streams h (..., d_model), in h's dtype.

        ``final_norm(h_L) @ W_U^T`` are the logits; on earlier layers it is the logit lens
        (:func:`attngeom.logit_lens`).

        Parameters
        ----------
        h : ndarray, shape (..., d_model)
            Residual streams (float32 or float64).

        Returns
        -------
        ndarray, shape (..., d_model)
            N_f(h).

        Examples
        --------
        >>> x = dec.final_norm(f.hidden_states[1])  # doctest: +SKIP
        """
        a, w = self.arch, self.w
        cast = [None if w[key] is None else np.asarray(w[key]).astype(h.dtype, copy=False) for key in ("norm_w", "norm_b")]
        return normalize(h, cast[0], cast[1], a.norm_eps, a.norm)

    # -- the forward pass ----------------------------------------------------------------
    def forward(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, dtype,
                plan: Optional[ForwardPlan] = None, resume=None, types: Optional[np.ndarray] = None) -> Forward:
        """The forward pass on a checked batch (see :meth:`attngeom.models.Model.forward`).

        Parameters
        ----------
        ids : ndarray of int, shape (batch, n)
            Token ids, already checked against the vocabulary.
        mask : ndarray of bool, shape (batch, n)
            True for real tokens.
        positions : ndarray of int, shape (batch, n)
            Position of every token.
        dtype : numpy dtype
            float32 or float64, the computation dtype.
        plan : ForwardPlan, optional
            What to keep and the interventions (:func:`plan_forward`); default today's fields
            of every layer.
        resume : (int, ndarray), optional
            (layer, h): start at that layer from the residual stream h (batch, n, d_model)
            entering it (a clean pass's hidden_states[layer]) instead of the embedding; the
            per-layer fields then start at that layer.
        types : ndarray of int, shape (batch, n), optional
            BERT's token types (segment ids), checked; default every token of segment 0.

        Returns
        -------
        Forward
            With a batch axis.

        Examples
        --------
        >>> f = dec.forward(ids, np.ones(ids.shape, bool), np.arange(ids.shape[1])[None], np.float32)  # doctest: +SKIP
        """
        with product_threads():  # NumPy's products and the attention kernel share the thread budget
            return self._forward(ids, mask, positions, dtype, plan, resume, types)

    def _forward(self, ids, mask, positions, dtype, plan, resume, types) -> Forward:
        a, w, dt = self.arch, self.w, np.dtype(dtype)
        plan = ForwardPlan(frozenset(KEEP_DEFAULT), tuple(range(a.n_layers))) if plan is None else plan
        b, n = ids.shape
        dh = a.d_head

        def cast(x):
            return None if x is None else x.astype(dt, copy=False)

        act = ACTIVATION_FUNCTIONS[a.activation]
        first = 0 if resume is None else int(resume[0])
        if resume is None:
            h = cast(w["embed"][ids])
            release_pages(w["embed"])
            if w.get("pos") is not None:  # an absolute position table
                h = h + cast(w["pos"][positions])
                release_pages(w["pos"])
            if a.family == "bert":  # the token types (default segment 0), then the embedding's norm
                h = normalize(h + cast(w["type"][[0] if types is None else types]), cast(w["embed_norm_w"]),
                              cast(w["embed_norm_b"]), a.norm_eps, a.norm)
        else:
            h = np.asarray(resume[1], dt)
        # (b n, 1, d_head), a row per token; MLA rotates its own rotary columns (:mod:`.mla`)
        cos_sin = (None if self.rotary is None or a.mla else
                   tuple(t[:, None] for t in self.rotary.cos_sin(positions.reshape(-1), dt)))
        # no key mask when every token is real: the kernel's result is bitwise the same, and faster
        key_mask = None if mask.all() else mask[:, None, None, :]
        window = None
        if a.sliding_layers:
            i = np.arange(n)
            window = mask[:, None, None, :] & ((i[:, None] - i[None, :]) < a.sliding_window)
        kept = sum(1 for i in plan.layers if i >= first)
        out = Stacks(plan, {"hidden_states": kept + 1, "router_logits": sum(i in a.moe_layers for i in plan.layers),
                            **{name: kept for name in KEEPABLE if name not in ("hidden_states", "router_logits")}})
        scales = []
        single = plan.single
        post = a.family == "bert"  # post-norm and bidirectional (module docstring)
        for li, stored in enumerate(w["layers"]):
            if li < first:
                continue
            if li > max(plan.layers[-1], max(plan.interventions, default=-1)) and not plan.wants("logits") \
                    and not plan.wants("hidden_states"):
                break  # nothing after the last kept (or intervened) layer is asked for
            here = li in plan.layers
            todo = plan.interventions.get(li, ())  # this layer's interventions (:mod:`.interventions`)
            sites = sites_at(todo)

            def at(site, x):
                """x after this layer's interventions at `site`, kept when the pass keeps it."""
                if site in sites:
                    x = apply(todo, site, x, single)
                if here and plan.wants(site):
                    out.put(site, x)
                return x

            if "resid_pre" in sites:
                h = apply(todo, "resid_pre", h, single)
            L = {key: cast(value) for key, value in stored.items()}
            x = h if post else None  # post-norm: attention reads the stream itself
            if "attn_in" in sites and post:
                x = apply(todo, "attn_in", x, single)
            elif a.mla or "attn_in" in sites:
                x = normalize(h, L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm)
                if "attn_in" in sites:
                    x = apply(todo, "attn_in", x, single)
            if a.mla:  # multi-head latent attention (:mod:`.mla`)
                parts = mla_attention_inputs(x, L, a, self.rotary, positions)
                parts["attention_inputs"] = x
            else:
                parts = self._attention_inputs(h, L, cos_sin, pre=here and (plan.wants("q_prerotary") or
                                                                           plan.wants("k_prerotary")), x=x)
            for site in ("q", "k", "v"):
                if site in sites:
                    parts[site] = apply(todo, site, parts[site], single)
            q, k, v = parts["q"], parts["k"], parts["v"]
            if here:
                parts.update(hidden_states=h, kv_latent=parts.get("latent"))
                for name in ("hidden_states", "attention_inputs", "q", "k", "v", "q_prerotary", "k_prerotary",
                             "kv_latent", "rope_keys"):
                    if plan.wants(name) and parts.get(name) is not None:
                        out.put(name, parts[name])
            scale = 1.0 / math.sqrt(dh) if a.scale_attn else 1.0
            if a.mla:
                scale *= yarn_factors(a.rope)[1]
            if a.scale_by_layer:
                scale /= li + 1
            want_s = here and plan.wants("attention_stats")
            want_p = here and plan.wants("attentions") or "pattern" in sites
            res = softmax_attention(q, k, v, mask=window if li in a.sliding_layers else key_mask, causal=not post,
                                    scale=scale, return_routing=want_p, return_stats=want_s, layout="bhnd")
            y = res[0] if want_p or want_s else res
            if "pattern" in sites:  # the changed weights give the heads' outputs (and the statistics)
                P = apply(todo, "pattern", res[1], single)
                y = P @ v
                res = (y, P) + ((AttentionStats.from_routing(P, log_z=res[-1].log_z),) if want_s else ())
            if here and plan.wants("attentions"):
                out.put("attentions", res[1])
            if want_s:
                out.put("attention_stats", res[-1])
            y = at("z", y)
            del q, k, v, parts, res
            o = product(y.transpose(0, 2, 1, 3).reshape(b, n, -1), L["o"])
            if L["b_o"] is not None:
                o = o + L["b_o"]
            o = at("attn_out", o)
            h = h + o
            if post:
                h = normalize(h, L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm)
            if "router" in L:  # mixture of experts (:mod:`.moe`)
                mlp, router = moe_mlp(normalize(h, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm), L, a, act)
                if here and plan.wants("router_logits"):
                    out.put("router_logits", router)
            elif "up" not in L:  # an attention-only model
                mlp = np.zeros_like(h)
            else:
                mlp = _dense_mlp(h, L, a, act, pre_norm=not post)
            mlp = at("mlp_out", mlp)
            h = h + mlp
            if post:
                h = normalize(h, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm)
            h = at("resid_post", h)
            if here:
                scales.append(scale)
            del L
            for value in stored.values():  # the layer is done: its mapped pages leave the resident set
                release_pages(value)
        final = None
        if post:
            final = h
        elif plan.wants("hidden_states") or plan.wants("logits"):
            final = normalize(h, cast(w["norm_w"]), cast(w["norm_b"]), a.norm_eps, a.norm)
        if plan.wants("hidden_states"):
            out.put("hidden_states", final)
        logits = None
        if w["unembed"] is not None and plan.wants("logits"):
            rows = final if plan.logits_at is None else final[np.arange(b)[:, None], plan.logits_at]
            logits = _unembed(rows, w["unembed"], dt)
        return Forward(logits=logits, scale=np.asarray(scales), positions=positions, attention_mask=mask,
                       layers=np.asarray([i for i in plan.layers if i >= first]), logits_positions=plan.logits_at,
                       **{name: out.get(name) for name in KEEPABLE if name != "logits"})

    def _attention_inputs(self, h, L, cos_sin, pre: bool, x=None) -> dict:
        """The normed residual stream x (b, n, d_model) and q, k, v (b, H, n, d_head) of a
        GPT-2 / Llama-family layer (module docstring), computed block of tokens by block of
        tokens on the thread budget (:func:`for_row_blocks`: norm, products, q_norm / k_norm and
        rotation of each token together); q_prerotary, k_prerotary too when `pre` (or the
        model has no rotation, where they are q and k). A given x (an intervened attention
        input) is used instead of the norm of h."""
        a = self.arch
        b, n, d = h.shape
        H, K, dh = a.n_heads, a.n_kv_heads, a.d_head
        rows = b * n
        flat = h.reshape(rows, d)
        given = None if x is None else x.reshape(rows, d)
        x = np.empty_like(flat) if given is None else given
        # heads-major over the token rows: one sequence gives contiguous (1, heads, n, d_head)
        q, k, v = (np.empty((heads, rows, dh), h.dtype) for heads in (H, K, K))
        before = (np.empty_like(q), np.empty_like(k)) if pre and cos_sin is not None else None

        def block(lo, hi):
            if given is None:
                xr = normalize(flat[lo:hi], L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm)
                x[lo:hi] = xr
            else:
                xr = given[lo:hi]
            if a.family == "gpt2":
                qkv = xr @ L["qkv"] if L["b_qkv"] is None else xr @ L["qkv"] + L["b_qkv"]
                qr, kr, vr = np.split(qkv, 3, axis=-1)
            else:
                qr, kr, vr = xr @ L["q"], xr @ L["k"], xr @ L["v"]
                qr = qr if L["b_q"] is None else qr + L["b_q"]
                kr = kr if L["b_k"] is None else kr + L["b_k"]
                vr = vr if L["b_v"] is None else vr + L["b_v"]
            qr, kr, vr = qr.reshape(-1, H, dh), kr.reshape(-1, K, dh), vr.reshape(-1, K, dh)
            if a.qk_norm:
                qr = normalize(qr, L["q_norm"], None, a.norm_eps, "rmsnorm")
                kr = normalize(kr, L["k_norm"], None, a.norm_eps, "rmsnorm")
            if before is not None:
                before[0][:, lo:hi], before[1][:, lo:hi] = qr.transpose(1, 0, 2), kr.transpose(1, 0, 2)
            if cos_sin is not None:
                c, s = cos_sin[0][lo:hi], cos_sin[1][lo:hi]
                qr, kr = self.rotary.rotate(qr, cos_sin=(c, s)), self.rotary.rotate(kr, cos_sin=(c, s))
            q[:, lo:hi], k[:, lo:hi], v[:, lo:hi] = (t.transpose(1, 0, 2) for t in (qr, kr, vr))

        for_row_blocks(block, rows)

        def heads(t):  # (heads, b n, d_head) -> (b, heads, n, d_head)
            return t.reshape(t.shape[0], b, n, dh).transpose(1, 0, 2, 3)

        def repeat(t):  # grouped-query keys and values, one per query head
            return t if H == K else np.repeat(t, H // K, axis=1)

        q, k, v = heads(q), repeat(heads(k)), repeat(heads(v))
        out = {"q": q, "k": k, "v": v, "attention_inputs": x.reshape(b, n, d)}
        if cos_sin is None:
            out.update(q_prerotary=q, k_prerotary=k)
        elif before is not None:
            out.update(q_prerotary=heads(before[0]), k_prerotary=repeat(heads(before[1])))
        return out


def _dense_mlp(h, L, a, act, pre_norm=True):
    """The dense MLP of residual streams h (b, n, d): Norm (when `pre_norm`), then
    down(act(gate) * up) or down(act(up)), biases where stored, block of tokens by block of
    tokens on the thread budget (norm, products and activation function together), at most MLP_ROWS
    tokens a block (the hidden units of a long input would otherwise take (n, d_ff) arrays
    several times over)."""
    def block(rows):
        x = normalize(rows, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm) if pre_norm else rows
        return _mlp_block(x, L, a.gated, act)

    return map_rows(block, h, h.shape[-1], max_rows=MLP_ROWS)


def _mlp_block(x, L, gated: bool, act):
    """The MLP of a block of rows (x, d) (called from the pool: plain products)."""
    if gated:
        g = x @ L["gate"] if L["b_gate"] is None else x @ L["gate"] + L["b_gate"]
        u = x @ L["up"] if L["b_up"] is None else x @ L["up"] + L["b_up"]
        mlp = (act(g) * u) @ L["down"]
    else:
        u = x @ L["up"] if L["b_up"] is None else x @ L["up"] + L["b_up"]
        mlp = act(u) @ L["down"]
    if L.get("b_down") is not None:
        mlp = mlp + L["b_down"]
    return mlp
