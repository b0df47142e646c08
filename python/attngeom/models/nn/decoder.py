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

from ... import _core
from ...activation_functions import silu
from ...attention import softmax_attention
from ...attention_stats import AttentionStats
from ..io.architecture import ACTIVATION_FUNCTIONS, Architecture
from ..io.checkpoint import Checkpoint
from ..io.safetensors import release_pages
from ..io.weights import read_weights
from .forward import (KEEP_DEFAULT, KEEPABLE, MLP_ROWS, Forward, ForwardPlan, Stacks, available_bytes,
                      retain_freed_memory)
from .interventions import Gate
from .mla import mla_attention_inputs
from .moe import moe_mlp
from .norm import normalize
from .products import (BFLOAT16, MIN_ROWS_PER_BLOCK, BFloat16Weight, bfloat16_values, block_product, column_product,
                       column_products, column_units, compute_dtype, for_row_blocks, for_tasks, in_pool, map_rows,
                       product, product_threads, residual_product, residual_sum, splits_columns)
from .sites import BEFORE, GLOBAL_SITES
from .rotary import Rotary, rope_frequencies, yarn_factors


_UNEMBED_ROWS = 16384  # vocabulary rows cast at a time (16384 x 4096 float32 = 256 MiB at most)


def cast(x, dt):
    """A stored tensor in the computation dtype (None stays None)."""
    return None if x is None else x.astype(dt, copy=False)


#: The layer weights that are a product's right factor: bfloat16 weights in the bfloat16 mode.
PRODUCT_WEIGHTS = frozenset({"q", "k", "v", "o", "qkv", "up", "gate", "down", "q_a", "q_b", "kv_a", "kv_b",
                             "shared_gate", "shared_up", "shared_down"})


def layer_in(stored: dict, dt, bf16: bool) -> dict:
    """A layer's stored weights for the pass: cast to the computation dtype, or, in the
    bfloat16 mode, the product weights as :class:`BFloat16Weight` (the stored bits where they
    are bfloat16) and the rest (norms, biases, router, the experts' stacks) in float32."""
    return {key: None if value is None else
            BFloat16Weight.of(value) if bf16 and key in PRODUCT_WEIGHTS and value.ndim == 2 else
            value.astype(dt, copy=False) for key, value in stored.items()}


def _unembed(final, W, dt, bf16=False, release=True):
    """final (..., d) @ W^T for W (vocab, d) as stored, cast in blocks of vocabulary rows
    (in the bfloat16 mode read as bfloat16 weights, the stored bits where they are bfloat16)."""
    V = W.shape[0]
    logits = np.empty(final.shape[:-1] + (V,), dt)

    def chunk(c):
        i = c * _UNEMBED_ROWS
        rows = W[i:i + _UNEMBED_ROWS]
        logits[..., i:i + _UNEMBED_ROWS] = product(final, BFloat16Weight.of(rows.T) if bf16 else
                                                   rows.astype(dt, copy=False).T)
        if release:
            release_pages(rows)

    chunks = -(-V // _UNEMBED_ROWS)
    # Few rows (the last token's logits): the float chunks are the tasks instead, each cast and
    # multiplied whole on one thread, the same chunks and products as on one thread (the same
    # bits). The bfloat16 product splits its columns itself.
    if not bf16 and int(np.prod(final.shape[:-1])) < 2 * MIN_ROWS_PER_BLOCK:
        for_tasks(chunk, chunks)
    else:
        for c in range(chunks):
            chunk(c)
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
        self._keep_weights = False
        self._kept = {}  # (dtype, bf16) -> the layers' weights as the pass reads them
        self._kept_unembedding = {}  # dtype -> the unembedding in that float dtype
        self.rotary = None if arch.rope is None else Rotary(rope_frequencies(arch.rope, arch.rotary_dim),
                                                             interleaved=arch.mla is not None,
                                                             attention_factor=yarn_factors(arch.rope)[0])

    # -- weights kept across passes ------------------------------------------------------
    @property
    def keep_weights(self) -> bool:
        """Whether passes keep the layers' weights as they read them (cast to the computation
        dtype, or the bfloat16 mode's weights with their mapped pages) for the next pass,
        instead of casting them again and releasing a mapped checkpoint's pages after each
        layer (:meth:`attngeom.models.Model.keep_weights`)."""
        return self._keep_weights

    @keep_weights.setter
    def keep_weights(self, on: bool) -> None:
        if not isinstance(on, (bool, np.bool_)):
            raise TypeError(f"keep_weights must be True or False, got {on!r}")
        self._keep_weights = bool(on)
        if on:
            retain_freed_memory()  # and the activations' memory, for the whole process
        else:
            self._kept.clear()
            self._kept_unembedding.clear()

    def kept_bytes(self, dtype) -> int:
        """The memory the layers' weights and the unembedding take when kept in the computation
        dtype `dtype` (float32, float64 or "bfloat16": bfloat16 product weights and unembedding
        as stored, the rest float32)."""
        dt, bf16 = compute_dtype(dtype)
        total = 0
        for stored in self.w["layers"]:
            for key, value in stored.items():
                if value is None:
                    continue
                two = bf16 and key in PRODUCT_WEIGHTS and value.ndim == 2
                total += value.size * (2 if two else dt.itemsize)
        if self.w["unembed"] is not None:
            total += self.w["unembed"].size * (2 if bf16 else dt.itemsize)
        return total

    def _layers_for(self, dt, bf16) -> Optional[dict]:
        """The kept layers of this computation mode (created empty, after the size check), or
        None when weights are not kept."""
        if not self._keep_weights:
            return None
        key = (dt.str, bf16)
        if key not in self._kept:
            need, have = self.kept_bytes(BFLOAT16 if bf16 else dt), available_bytes()
            if need > 0.8 * have:
                raise ValueError(f"keep_weights: the layers' weights take {need / 2 ** 30:.1f} GiB in this dtype, more "
                                 f"than 80% of the {have / 2 ** 30:.1f} GiB available; set keep_weights = False")
            self._kept[key] = {}
        return self._kept[key]

    def _unembedding_for(self, dt, bf16):
        """The unembedding (vocab, d) as :func:`_unembed` reads it. With weights kept, in a
        float mode, it is cast to `dt` once (one parallel widening of a bfloat16 table) and kept
        for the next pass: each pass would otherwise widen the whole table again, in fresh
        memory whose page faults serialize the threads (Qwen3-0.6B: 311 MB of bfloat16, 0.2 s a
        pass at 2 threads, AMD Zen 3). The bfloat16 mode reads the stored bits as they are."""
        W = self.w["unembed"]
        if bf16 or not self._keep_weights:
            return W
        kept = self._kept_unembedding.get(dt.str)
        if kept is None:
            kept = self._kept_unembedding[dt.str] = W.astype(dt, copy=False)
        return kept

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
        >>> x = dec.final_norm(f.resid_pre[1])  # doctest: +SKIP
        """
        a, w = self.arch, self.w
        cast = [None if w[key] is None else np.asarray(w[key]).astype(h.dtype, copy=False) for key in ("norm_w", "norm_b")]
        return normalize(h, cast[0], cast[1], a.norm_eps, a.norm)

    # -- the forward pass ----------------------------------------------------------------
    def forward(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, dtype,
                plan: Optional[ForwardPlan] = None, resume=None, types: Optional[np.ndarray] = None,
                cache=None) -> Forward:
        """The forward pass on a checked batch (see :meth:`attngeom.models.Model.forward`).

        Parameters
        ----------
        ids : ndarray of int, shape (batch, n)
            Token ids, already checked against the vocabulary.
        mask : ndarray of bool, shape (batch, n)
            True for real tokens.
        positions : ndarray of int, shape (batch, n)
            Position of every token.
        dtype : numpy dtype or "bfloat16"
            float32 or float64, the computation dtype, or "bfloat16" (bfloat16 products with
            float32 sums, the rest in float32; :func:`attngeom.models.nn.products.compute_dtype`).
        plan : ForwardPlan, optional
            What to keep and the interventions (:func:`plan_forward`); default today's fields
            of every layer.
        resume : (int, ndarray), optional
            (layer, h): start at that layer from the residual stream h (batch, n, d_model)
            entering it (a clean pass's resid_pre at that layer) instead of the embedding; the
            per-layer fields then start at that layer.
        types : ndarray of int, shape (batch, n), optional
            BERT's token types (segment ids), checked; default every token of segment 0.
        cache : KVCache, optional
            A key/value cache (:class:`attngeom.models.nn.generate.KVCache`): the tokens
            attend to the cached keys and values before their own (causal from the end, the
            window counted in absolute positions), and every layer's keys and values are
            appended to it. Every token real; `positions` continue the cached ones.

        Returns
        -------
        Forward
            With a batch axis.

        Examples
        --------
        >>> f = dec.forward(ids, np.ones(ids.shape, bool), np.arange(ids.shape[1])[None], np.float32)  # doctest: +SKIP
        """
        with product_threads():  # NumPy's products and the attention kernel share the thread budget
            return self._forward(ids, mask, positions, dtype, plan, resume, types, cache)

    def step(self, ids: np.ndarray, cache, dtype) -> np.ndarray:
        """The logits after the tokens `ids`, run after the ones in `cache` (and added to it).

        On an empty cache this is the prompt's pass (prefill); then one token at a time,
        each computing only its own queries, keys, values and MLP against the cached keys and
        values of every layer (as the attention uses them: rotated, one per query head; MLA's
        expanded keys and values). Positions continue from the cached tokens.

        Parameters
        ----------
        ids : ndarray of int, shape (batch, m)
            New token ids, checked against the vocabulary.
        cache : KVCache
            The keys and values of the tokens before (:class:`attngeom.models.nn.generate.KVCache`),
            extended in place by m tokens.
        dtype : numpy dtype
            float32 or float64, the dtype of the cache, or "bfloat16" (a float32 cache of the
            keys and values the products give).

        Returns
        -------
        ndarray, shape (batch, vocab)
            The logits at the last of the new tokens.

        Examples
        --------
        >>> cache = KVCache(dec.arch.n_layers, capacity=8)  # doctest: +SKIP
        >>> logits = dec.step(np.array([[1, 2, 3]]), cache, np.float32)  # prefill  # doctest: +SKIP
        >>> logits = dec.step(logits.argmax(-1)[:, None], cache, np.float32)  # doctest: +SKIP
        >>> cache.length  # doctest: +SKIP
        4
        """
        b, m = ids.shape
        positions = np.broadcast_to(cache.length + np.arange(m), (b, m))
        plan = ForwardPlan(frozenset(("logits",)), (), logits_at=np.full((b, 1), m - 1))
        out = self.forward(ids, np.ones((b, m), dtype=bool), positions, dtype, plan, cache=cache)
        return out.logits[:, 0]

    def _forward(self, ids, mask, positions, dtype, plan, resume, types, cache=None) -> Forward:
        """The pass as a few block steps (embedding, each layer's attention and MLP, the final
        norm and unembedding), each chosen by Architecture fields; every site's value goes
        through one :class:`Gate`."""
        a, w = self.arch, self.w
        dt, bf16 = compute_dtype(dtype)
        held = self._layers_for(dt, bf16)
        plan = ForwardPlan(frozenset(KEEP_DEFAULT), tuple(range(a.n_layers))) if plan is None else plan
        first = 0 if resume is None else int(resume[0])
        kept = sum(1 for i in plan.layers if i >= first)
        counts = {name: 1 if name in GLOBAL_SITES else kept for name in KEEPABLE}
        counts["router_logits"] = sum(1 for i in plan.layers if i >= first and i in a.moe_layers)
        out = Stacks(plan, counts)
        gate = Gate(plan, out)
        ctx = self._attention_context(mask, positions, dt, cache)
        gate.enter(BEFORE)
        h = self._embed(ids, positions, types, gate, dt, release=held is None) if resume is None else \
            np.asarray(resume[1], dt)
        act = ACTIVATION_FUNCTIONS[a.activation]
        finish = plan.wants("logits") or plan.wants("ln_final") or a.n_layers in plan.interventions
        last = a.n_layers - 1 if finish else max(plan.layers[-1], max(plan.interventions, default=-1))
        scales = []
        for li, stored in enumerate(w["layers"]):
            if li < first:
                continue
            if li > last:
                break  # nothing after the last kept (or intervened) layer is asked for
            gate.enter(li)
            h = gate("resid_pre", h)
            L = None if held is None else held.get(li)
            if L is None:
                L = layer_in(stored, dt, bf16)
                if held is not None:
                    held[li] = L
            h, scale = self._attention(li, h, L, gate, ctx, bf16)
            h = self._mlp(h, L, gate, act, bf16)
            h = gate("resid_post", h)
            if gate.here:
                scales.append(scale)
            del L
            if held is None:
                for value in stored.values():  # the layer is done: its mapped pages leave the resident set
                    release_pages(value)
        if cache is not None:
            cache.advance(ids.shape[1])
        logits = None
        if finish:
            gate.enter(a.n_layers)
            final = h if a.post_norm else normalize(h, cast(w["norm_w"], dt), cast(w["norm_b"], dt), a.norm_eps, a.norm)
            final = gate("ln_final", final)
            if w["unembed"] is not None and plan.wants("logits"):
                b = ids.shape[0]
                rows = final if plan.logits_at is None else final[np.arange(b)[:, None], plan.logits_at]
                logits = _unembed(rows, self._unembedding_for(dt, bf16), dt, bf16, release=held is None)
        sites = {name: out.get(name) for name in KEEPABLE if name != "logits"}
        for name in GLOBAL_SITES:
            sites[name] = None if sites[name] is None else sites[name][0]
        return Forward(logits=logits, scale=np.asarray(scales), positions=positions, attention_mask=mask,
                       layers=np.asarray([i for i in plan.layers if i >= first]), logits_positions=plan.logits_at,
                       **sites)

    # -- the block steps -------------------------------------------------------------------
    def _embed(self, ids, positions, types, gate, dt, release=True) -> np.ndarray:
        """The stream entering layer 0: token embeddings (+ the position table's rows) (+ the
        token types), normed in post-norm models. `release`: the tables' mapped pages leave the
        resident set afterwards (not while the weights are kept: releasing a table of 311 MB
        took 7 ms a pass)."""
        a, w = self.arch, self.w
        h = gate("embed", cast(w["embed"][ids], dt))
        if release:
            release_pages(w["embed"])
        if w.get("pos") is not None:  # an absolute position table
            h = h + gate("pos_embed", cast(w["pos"][positions], dt))
            if release:
                release_pages(w["pos"])
        if a.token_types:  # the token types (default segment 0)
            h = h + cast(w["type"][[0] if types is None else types], dt)
        if a.post_norm:  # the embedding's norm
            h = normalize(h, cast(w["embed_norm_w"], dt), cast(w["embed_norm_b"], dt), a.norm_eps, a.norm)
        return h

    def _attention_context(self, mask, positions, dt, cache=None) -> dict:
        """What every layer's attention shares: the rotary angles, the key mask, the window,
        and the key/value cache (its keys come before the new tokens', every token real)."""
        a = self.arch
        n = mask.shape[1]
        # (b n, 1, d_head), a row per token; MLA rotates its own rotary columns (:mod:`.mla`)
        cos_sin = (None if self.rotary is None or a.mla else
                   tuple(t[:, None] for t in self.rotary.cos_sin(positions.reshape(-1), dt)))
        past = 0 if cache is None else cache.length
        # no key mask when every token is real: the kernel's result is bitwise the same, and faster
        key_mask = None if mask.all() else mask[:, None, None, :]
        window = None
        if a.sliding_layers:  # query i (absolute past + i) sees key j when past + i - j < window
            i, j = np.arange(n), np.arange(-past, n)
            window = ((i[:, None] - j[None, :]) < a.sliding_window) if past else \
                mask[:, None, None, :] & ((i[:, None] - i[None, :]) < a.sliding_window)
        # after cached keys the causal band is aligned at the end (query i sees keys up to past + i)
        causal = False if a.bidirectional else ("bottom_right" if past else True)
        return {"cos_sin": cos_sin, "key_mask": key_mask, "window": window, "positions": positions, "cache": cache,
                "causal": causal}

    def _attention(self, li, h, L, gate, ctx, bf16=False):
        """The attention block of layer li on the stream h: (the stream after it, the logit scale).
        In the bfloat16 mode the kernel reads q, k, v rounded to bfloat16 (the values the q, k, v
        sites hold; an intervention's values are read as it gives them, in float32 products) and
        computes scores, softmax and statistics in float32, with the CPU's AMX tiles or bfloat16
        dot products where it has them (``softmax_attention(..., products="bfloat16")``)."""
        a = self.arch
        b, n, _ = h.shape
        given = None  # the attention's input, when it is formed before the heads' products
        if a.post_norm or a.mla or gate.touches("attn_in"):
            given = gate("attn_in", h if a.post_norm else normalize(h, L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm))
        grouped = False
        if a.mla:  # multi-head latent attention (:mod:`.mla`)
            parts = mla_attention_inputs(given, L, a, self.rotary, ctx["positions"], gate)
        else:
            pre = gate.needs("q_prerotary") or gate.needs("k_prerotary")
            split = gate.touches("q_prerotary") or gate.touches("k_prerotary")
            # grouped-query keys and values stay one per key head (the kernel broadcasts them
            # over their query heads) unless a site of theirs is kept or changed
            grouped = (a.n_heads != a.n_kv_heads and ctx["cache"] is None and not split and
                       not any(gate.needs(site) for site in ("k", "v", "k_prerotary")) and
                       not gate.touches("pattern"))
            parts = self._attention_inputs(h, L, None if split else ctx["cos_sin"], pre=pre, x=given,
                                           bf16=bf16 and not split, grouped=grouped)
            if given is None:
                gate("attn_in", parts["attention_inputs"])
            if split or ctx["cos_sin"] is None:
                parts["q_prerotary"] = gate("q_prerotary", parts["q_prerotary"])
                parts["k_prerotary"] = gate("k_prerotary", parts["k_prerotary"])
            else:
                for site in ("q_prerotary", "k_prerotary"):
                    if parts.get(site) is not None:
                        gate(site, parts[site])
            if split and ctx["cos_sin"] is not None:  # rotate the intervened vectors
                c, s = (t.reshape(b, 1, n, -1) for t in ctx["cos_sin"])
                parts["q"], parts["k"] = (self.rotary.rotate(parts[site], cos_sin=(c, s))
                                          for site in ("q_prerotary", "k_prerotary"))
            elif ctx["cos_sin"] is None:
                parts["q"], parts["k"] = parts["q_prerotary"], parts["k_prerotary"]
        if bf16 and not parts.get("rounded"):  # multi-head latent attention, split rotations
            for site in ("q", "k", "v"):  # rounded before their sites, as _attention_inputs rounds
                parts[site] = bfloat16_values(parts[site])
        q, k, v = gate("q", parts["q"]), gate("k", parts["k"]), gate("v", parts["v"])
        if ctx["cache"] is not None:  # attend to the cached keys and values too
            k, v = ctx["cache"].extend(li, k, v)
        scale = 1.0 / math.sqrt(a.d_head) if a.scale_attn else 1.0
        if a.mla:
            scale *= yarn_factors(a.rope)[1]
        if a.scale_by_layer:
            scale /= li + 1
        want_s = gate.wants("attention_stats")
        want_p = gate.needs("pattern")
        mask = ctx["window"] if li in a.sliding_layers else ctx["key_mask"]
        if grouped:  # (b, K, G, n, d) queries against (b, K, 1, n, d) keys and values
            K = a.n_kv_heads
            q, k, v = q.reshape((b, K, -1) + q.shape[2:]), k[:, :, None], v[:, :, None]
            mask = mask[:, :, None] if mask is not None and mask.ndim == 4 else mask
        # q, k and v hold bfloat16 values here unless an intervention gave them: the CPU's AMX
        # tiles or bfloat16 dot products take them where it has them. Elsewhere the float32 kernel's
        # products of bfloat16 values are the bfloat16 products bit for bit, without the rounding
        # passes (5-9% of the attention's time); and an intervention's values are read as given.
        products = "bfloat16" if (bf16 and _core.dot_path() != "widened" and
                                  not any(gate.touches(site) for site in ("q", "k", "v"))) else "float"
        # y comes token-major, (b, n, heads d_head) as the output projection reads it, unless
        # changed weights give it (below)
        merged = not gate.touches("pattern")
        res = softmax_attention(q, k, v, mask=mask, causal=ctx["causal"], scale=scale, return_routing=want_p,
                                return_stats=want_s, layout="bhnd", products=products, merge_heads=merged)
        if grouped:  # back to one axis of query heads (free reshapes of contiguous results)
            def heads(t, i=1):  # (y, the first item, is merged already)
                return t if merged and i == 0 else t.reshape((b, a.n_heads) + t.shape[3:])

            res = heads(res, 0) if not (want_p or want_s) else tuple(
                r.map(heads) if isinstance(r, AttentionStats) else heads(r, i) for i, r in enumerate(res))
        y = res[0] if want_p or want_s else res
        if want_p:
            P = gate("pattern", res[1])
            if gate.touches("pattern"):  # the changed weights give the heads' outputs (and the statistics)
                y = P @ v
                if want_s:
                    res = (y, P, AttentionStats.from_routing(P, log_z=res[-1].log_z))
        if want_s:
            gate.out.put("attention_stats", res[-1])
        if merged:  # the z site sees the heads' outputs (b, heads, n, d_head), a view
            z = y.reshape(b, n, a.n_heads, -1).transpose(0, 2, 1, 3)
            y = _token_major(gate("z", z)) if gate.touches("z") else (gate("z", z), y)[1]
        else:
            y = _token_major(gate("z", y))
        del q, k, v, parts, res
        if L["b_o"] is None and not gate.needs("attn_out"):  # the stream's sum made by the product (the same bits)
            h = residual_product(h, y, L["o"])
        else:
            o = product(y, L["o"])
            if L["b_o"] is not None:
                o = o + L["b_o"]
            h = residual_sum(h, gate("attn_out", o))
        if a.post_norm:
            h = normalize(h, L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm)
        return gate("resid_mid", h), scale

    def _mlp(self, h, L, gate, act, bf16=False) -> np.ndarray:
        """The MLP block on the stream h (after attention): the stream after it (`bf16`: the
        bfloat16 mode's fused RMSNorm and SwiGLU gate)."""
        a = self.arch
        if "router" not in L and "up" not in L:  # an attention-only model
            mlp = gate("mlp_out", np.zeros_like(h))
        elif "router" not in L:  # block by block; mlp_in and mlp_post through the gate where needed
            sites = gate if gate.needs("mlp_in") or gate.needs("mlp_post") else None
            if not gate.needs("mlp_out"):  # the stream's sum made by the down product (the same bits)
                h = _dense_mlp(h, L, a, act, pre_norm=not a.post_norm, fused=bf16, gate=sites, residual=True)
                return normalize(h, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm) if a.post_norm else h
            mlp = gate("mlp_out", _dense_mlp(h, L, a, act, pre_norm=not a.post_norm, fused=bf16, gate=sites))
        else:  # mixture of experts (:mod:`.moe`)
            x = gate("mlp_in", h if a.post_norm else normalize(h, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm))
            mlp, _ = moe_mlp(x, L, a, act, gate)
            mlp = gate("mlp_out", mlp)
        h = residual_sum(h, mlp)
        if a.post_norm:
            h = normalize(h, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm)
        return h

    def _attention_inputs(self, h, L, cos_sin, pre: bool, x=None, bf16=False, grouped=False) -> dict:
        """The normed residual stream x (b, n, d_model) and q, k, v (b, H, n, d_head) of a
        GPT-2 / Llama-family layer (module docstring), computed on the thread budget in blocks
        of at most MLP_ROWS tokens: the norms by rows, the products by columns
        (:func:`column_products`), then biases, q_norm / k_norm and rotation by rows (with a
        fused (in, out) qkv weight, as GPT-2's, all of it by rows: :func:`for_row_blocks`);
        q_prerotary, k_prerotary too when `pre` (or the
        model has no rotation, where they are q and k). A given x (an intervened attention
        input) is used instead of the norm of h. `bf16`: the bfloat16 mode's fused RMSNorms,
        and q, k, v rounded to bfloat16 in their blocks (``"rounded"`` in the result).
        `grouped`: grouped-query keys and values (and k_prerotary) stay one per key head,
        (b, n_kv_heads, n, d_head), instead of repeated for each query head."""
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

        def normed(lo, hi, parallel=False):
            if given is None:
                normalize(flat[lo:hi], L["ln1_w"], L["ln1_b"], a.norm_eps, a.norm, fused=bf16, out=x[lo:hi],
                          parallel=parallel)
            return x[lo:hi]

        def block(lo, hi):  # the products by blocks of rows (GPT-2's fused (in, out) c_attn)
            xr = normed(lo, hi)
            if "qkv" in L:  # one fused product (GPT-2's c_attn)
                qkv = block_product(xr, L["qkv"]) if L["b_qkv"] is None else block_product(xr, L["qkv"]) + L["b_qkv"]
                qr, kr, vr = np.split(qkv, 3, axis=-1)
            else:
                qr, kr, vr = (block_product(xr, L[name]) for name in "qkv")
            finish(lo, hi, qr, kr, vr, biases="qkv" not in L)

        def finish(lo, hi, qr, kr, vr, biases=True, parallel=False):  # biases, q/k norms, rotation, rounding, heads-major
            if biases:
                qr = qr if L["b_q"] is None else qr + L["b_q"]
                kr = kr if L["b_k"] is None else kr + L["b_k"]
                vr = vr if L["b_v"] is None else vr + L["b_v"]
            qr, kr, vr = qr.reshape(-1, H, dh), kr.reshape(-1, K, dh), vr.reshape(-1, K, dh)
            if bf16 and before is None:  # norms, rotation, rounding and the heads-major copy: one pass of the core
                c, s = (None, None) if cos_sin is None else (np.ascontiguousarray(t[lo:hi, 0]) for t in cos_sin)
                interleaved = self.rotary is not None and self.rotary.interleaved
                for t, out, norm in ((qr, q, "q_norm"), (kr, k, "k_norm"), (vr, v, None)):
                    _core.finish_heads(np.ascontiguousarray(t, dtype=np.float32), out, lo,
                                       L[norm] if norm and a.qk_norm else None, a.norm_eps,
                                       c if norm else None, s if norm else None, interleaved, True, parallel)
                return
            if a.qk_norm:
                qr = normalize(qr, L["q_norm"], None, a.norm_eps, "rmsnorm", fused=bf16)
                kr = normalize(kr, L["k_norm"], None, a.norm_eps, "rmsnorm", fused=bf16)
            if before is not None:
                before[0][:, lo:hi], before[1][:, lo:hi] = qr.transpose(1, 0, 2), kr.transpose(1, 0, 2)
            if cos_sin is not None:
                c, s = cos_sin[0][lo:hi], cos_sin[1][lo:hi]
                qr, kr = self.rotary.rotate(qr, cos_sin=(c, s)), self.rotary.rotate(kr, cos_sin=(c, s))
            if bf16:  # what the attention reads
                qr, kr, vr = (np.ascontiguousarray(t, dtype=np.float32) for t in (qr, kr, vr))
                for t in (qr, kr, vr):
                    _core.round_bf16_values(t)
            q[:, lo:hi], k[:, lo:hi], v[:, lo:hi] = (t.transpose(1, 0, 2) for t in (qr, kr, vr))

        if "qkv" in L or not splits_columns(flat[:MLP_ROWS], [L["q"], L["k"], L["v"]]):
            for_row_blocks(block, rows)
        else:  # blocks of at most MLP_ROWS tokens: norms by rows, products by columns, the rest by rows
            # the bfloat16 mode's steps take the core's threads themselves (no pool round trips)
            whole = bf16 and before is None and not in_pool()
            for start in range(0, rows, MLP_ROWS):
                end = min(rows, start + MLP_ROWS)
                if whole:
                    normed(start, end, parallel=True)
                else:
                    for_row_blocks(lambda lo, hi: normed(start + lo, start + hi), end - start)
                qa, ka, va = column_products(x[start:end], [L["q"], L["k"], L["v"]])
                if whole:
                    finish(start, end, qa, ka, va, parallel=True)
                else:
                    for_row_blocks(lambda lo, hi: finish(start + lo, start + hi, qa[lo:hi], ka[lo:hi], va[lo:hi]),
                                   end - start)

        def heads(t):  # (heads, b n, d_head) -> (b, heads, n, d_head)
            return t.reshape(t.shape[0], b, n, dh).transpose(1, 0, 2, 3)

        def repeat(t):  # grouped-query keys and values, one per query head
            return t if H == K or grouped else np.repeat(t, H // K, axis=1)

        q, k, v = heads(q), repeat(heads(k)), repeat(heads(v))
        out = {"q": q, "k": k, "v": v, "attention_inputs": x.reshape(b, n, d), "rounded": bf16}
        if cos_sin is None:
            out.update(q_prerotary=q, k_prerotary=k)
        elif before is not None:
            out.update(q_prerotary=heads(before[0]), k_prerotary=repeat(heads(before[1])))
        return out


def _token_major(y: np.ndarray) -> np.ndarray:
    """The heads' outputs y (b, heads, n, d_head) as the output projection reads them,
    (b, n, heads d_head), copied by blocks of tokens on the thread budget."""
    b, H, n, dh = y.shape
    out = np.empty((b, n, H * dh), y.dtype)
    for i in range(b):
        def rows(lo, hi, i=i):
            out[i, lo:hi].reshape(hi - lo, H, dh)[...] = y[i, :, lo:hi].transpose(1, 0, 2)
        for_row_blocks(rows, n)
    return out


def _dense_mlp(h, L, a, act, pre_norm=True, fused=False, gate=None, residual=False):
    """The dense MLP of residual streams h (b, n, d): Norm (when `pre_norm`), then
    down(act(gate) * up) or down(act(up)), biases where stored, at most MLP_ROWS tokens a block
    (the hidden units of a long input would otherwise take (n, d_ff) arrays several times
    over), on the thread budget: the norms by rows, the products by columns
    (:func:`column_products`, weights stored as (out, in) rows), or, for other weights, norm,
    products and activation together by rows. `fused`: the bfloat16 mode's fused RMSNorm and
    SwiGLU gate. `gate`: the pass's site gate, where mlp_in or mlp_post is kept or intervened
    on: the normed input (b, n, d) and the hidden units (b, n, d_ff) then pass through it
    whole, and the blocks and products are the ones computed without it, so that keeping a
    site leaves the bits of the pass as they are. `residual`: h plus the MLP's output, the
    sum made by the down product's units as they finish (:func:`residual_product`), the same
    bits as the two steps."""
    def normed(rows, out=None):
        return normalize(rows, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm, fused=fused, out=out) if pre_norm else rows

    def plus(y):  # h + the MLP's output, when `residual`
        return residual_sum(h, y.reshape(h.shape)) if residual else y

    d, d_ff = h.shape[-1], L["down"].shape[0]
    flat = stream = h.reshape(-1, d)
    inner = [L["gate"], L["up"]] if a.gated else [L["up"]]
    split = splits_columns(flat[:MLP_ROWS], inner + [L["down"]])
    if gate is not None:  # the normed rows at once (a norm acts on each row alone: the same bits)
        flat = gate("mlp_in", map_rows(normed, h, d)).reshape(-1, d)
    if not split:  # norm, products and activation together by rows, in the same row blocks either way
        if gate is None:
            return plus(map_rows(lambda rows: _mlp_block(normed(rows), L, a.gated, act, fused), h, d,
                                 max_rows=MLP_ROWS))
        hidden = map_rows(lambda rows: _mlp_hidden(rows, L, a.gated, act, fused), flat, d_ff, max_rows=MLP_ROWS)
        if gate.needs("mlp_post"):
            hidden = gate("mlp_post", hidden.reshape(h.shape[:-1] + (d_ff,))).reshape(-1, d_ff)
        return plus(map_rows(lambda rows: _mlp_down(rows, L), hidden, d, max_rows=MLP_ROWS).reshape(h.shape))
    b_down = L.get("b_down")

    def down(hidden, start, out=None):  # the block's output rows (plus the stream's, `residual`)
        rows = stream[start:start + hidden.shape[0]]
        if residual and b_down is None:
            return residual_product(rows, hidden, L["down"], out=out)
        y = column_products(hidden, [L["down"]],
                            finish=None if b_down is None else lambda _, y, lo, hi: y + b_down[lo:hi])[0]
        y = residual_sum(rows, y) if residual else y
        if out is None:
            return y
        out[...] = y
        return out

    blocks = range(0, flat.shape[0], MLP_ROWS)  # blocks of tokens: norms by rows, products by columns
    if gate is None and pre_norm:
        def block_x(start):  # the block's normed rows, each written where it goes
            rows = flat[start:start + MLP_ROWS]
            x = np.empty(rows.shape, rows.dtype)
            if fused and not in_pool():  # the core's threads take the rows
                normalize(rows, L["ln2_w"], L["ln2_b"], a.norm_eps, a.norm, fused=True, out=x, parallel=True)
            else:
                for_row_blocks(lambda lo, hi: normed(rows[lo:hi], out=x[lo:hi]), rows.shape[0])
            return x
    else:
        block_x = lambda start: flat[start:start + MLP_ROWS]  # noqa: E731
    if len(blocks) == 1 and not (gate is not None and gate.needs("mlp_post")):  # one block: its result as it is
        return down(_mlp_hidden_columns(block_x(0), L, a.gated, act, fused), 0).reshape(h.shape)
    out = np.empty(flat.shape, flat.dtype)
    if gate is not None and gate.needs("mlp_post"):
        hidden = np.empty((flat.shape[0], d_ff), flat.dtype)
        for start in blocks:
            hidden[start:start + MLP_ROWS] = _mlp_hidden_columns(block_x(start), L, a.gated, act, fused)
        hidden = gate("mlp_post", hidden.reshape(h.shape[:-1] + (d_ff,))).reshape(-1, d_ff)
        for start in blocks:
            down(np.ascontiguousarray(hidden[start:start + MLP_ROWS]), start, out=out[start:start + MLP_ROWS])
    else:
        for start in blocks:
            down(_mlp_hidden_columns(block_x(start), L, a.gated, act, fused), start, out=out[start:start + MLP_ROWS])
    return out.reshape(h.shape)


def _mlp_hidden_columns(x, L, gated: bool, act, fused=False):
    """:func:`_mlp_hidden` of a block of rows with its products split by columns
    (:func:`column_products`; weights it accepts). bfloat16 weights: both products in one
    core call (x rounded once), then biases and activation by rows; other weights: each pool
    unit takes its chunk of the up (and gate) columns, their biases and the activation,
    which act on each entry alone."""
    x = np.ascontiguousarray(x)
    names = ("gate", "up") if gated else ("up",)
    if all(isinstance(L[name], BFloat16Weight) for name in names):
        ys = column_products(x, [L[name] for name in names])
        if gated and L["b_gate"] is None and L["b_up"] is None and _fuses(ys[1], ys[0], act, fused) and not in_pool():
            _core.silu_mul(ys[0], ys[1], True)  # the fused gate on the core's threads, in place
            return ys[1]

        def rows(lo, hi):
            parts = [y[lo:hi] if L["b_" + name] is None else y[lo:hi] + L["b_" + name] for y, name in zip(ys, names)]
            h = _activated(parts[-1], parts[0] if gated else None, act, fused)
            if not np.may_share_memory(h, ys[-1]):  # (the fused gate writes its rows in place)
                ys[-1][lo:hi] = h

        for_row_blocks(rows, x.shape[0])
        return ys[-1]
    hidden = np.empty((x.shape[0], L["up"].shape[1]), x.dtype)
    units = column_units([L["up"].shape[1]])

    def unit(i):
        _, lo, hi = units[i]
        hidden[:, lo:hi] = _mlp_hidden(x, L, gated, act, fused, columns=(lo, hi))

    for_tasks(unit, len(units))
    return hidden


def _mlp_hidden(x, L, gated: bool, act, fused=False, columns=None):
    """The MLP's hidden units of a block of rows (x, d): act(gate) * up, or act(up), on the
    calling thread (:func:`_activated`); `columns` (lo, hi): those hidden units only (x
    C-contiguous, weights :func:`column_products` accepts)."""
    def linear(name):
        W, bias = L[name], L["b_" + name]
        if columns is None:
            y = block_product(x, W)
        else:
            y = column_product(x, W, *columns)
            bias = None if bias is None else bias[columns[0]:columns[1]]
        return y if bias is None else y + bias

    u = linear("up")
    return _activated(u, linear("gate") if gated else None, act, fused)


def _fuses(u, g, act, fused) -> bool:
    """Whether act(g) * u is the core's fused SiLU gate (silu_mul): `fused`, SiLU, float32
    C-contiguous rows."""
    return (fused and act is silu and g.dtype == u.dtype == np.float32 and g.flags.c_contiguous and
            u.flags.c_contiguous)


def _activated(u, g, act, fused=False):
    """act(g) * u (a gated MLP's hidden units), or act(u) where g is None. `fused`, SiLU on
    float32 rows: silu(g) * u in one pass of the core, written into u (C-contiguous rows)."""
    if g is None:
        return act(u)
    if _fuses(u, g, act, fused):
        _core.silu_mul(g, u)
        return u
    return act(g) * u


def _mlp_down(hidden, L):
    """The MLP's output of a block of hidden rows (hidden, d_ff)."""
    mlp = block_product(hidden, L["down"])
    return mlp if L.get("b_down") is None else mlp + L["b_down"]


def _mlp_block(x, L, gated: bool, act, fused=False):
    """The MLP of a block of rows (x, d) (called from the pool: plain products)."""
    return _mlp_down(_mlp_hidden(x, L, gated, act, fused), L)
