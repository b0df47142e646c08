"""A small decoder-only GPT over the attngeom kernels, with one attention variant per model.

The architecture of "Whitened Self-Attention" (seed 004) s.5 and Fig. 2: token embedding,
``n_blocks`` pre-LN decoder blocks, a final LayerNorm and an (untied) unembedding. A block is

    standard (and every other variant):  h = x + W_O attn(LN_1(x)),          y = h + MLP(LN_2(h))
    whitened (seed 004 eq. 4, 9, Fig. 2): w = whiten(LN_1(x); L0, M),
                                          h = w + W_O WSA(w),                 y = h + MLP(LN_2(h))

so the whitened sequence is what the attention reads (queries and keys from w, values the w_j
themselves: no W_V) and what the residual stream carries on. The MLP is Linear(d, 4d), GELU,
Linear(4d, d) with biases; LayerNorms have weight and bias; attention projections have no
bias. Queries and keys are rotated with RoPE (rotate-half). With d_model 256, context 256,
vocabulary 93, 2 blocks and 2 heads this gives 1,625,600 (standard) and 1,887,744 (whitened:
+ 2 d_model^2 per block for L0 and M) parameters, the paper's 1.62m and 1.88m (truncated).

Attention variants (all causal, heads of width d_head = d_model / n_heads):

* ``standard``   softmax(q k^T / sqrt(d_head)) v (:func:`attngeom.torch.softmax_attention`).
* ``whitened``   the whitened block above; the whitening is :func:`attngeom.torch.whiten` with
  a lower-triangular L0 (``tril`` of the parameter) initialised to I and M initialised to 0,
  so training starts from the unwhitened block. Head outputs are d_model wide (the w_j) and
  W_O maps the n_heads * d_model concatenation back to d_model, as
  :class:`attngeom.torch.nn.MultiheadSelfAttention` with ``variant="whitened"`` (both are
  :class:`attngeom.torch.nn.HeadProjections`: parameters ``qk``, ``out``, ``L0``, ``M``).
* ``projection`` Sanger's projection SDPA (eq. 14 with the squared distance): weights
  exp(-|q_i - k_j|^2 / (2 sigma^2)) on the raw (RoPE-rotated) queries and keys, values v as
  in standard attention (the paper's y = z k is the case W_V = W_K; its s.2 notes a linear
  map at the output makes the two equivalent).
* ``cauchy``, ``stable``  kernel-swapped attention (Laplace-Radon eq. 40-44) with
  parameters ``gamma`` and ``alpha`` (and ``c``).
* ``lightning``  unnormalised linear attention y_i = sum_{j <= i} (q_i . k_j) v_j
  (Henry-Marchetti-Kohn eq. 1, :func:`attngeom.torch.lightning_attention`), here divided by
  sqrt(d_head) (i + 1), the number of visible keys, so that the output does not grow with the
  position; the dimension module studies the unnormalised map, this normalisation is a
  per-query rescaling and leaves the function class per position unchanged.

Two options make the attention-only models of Olsson et al. (2022) that ``attngeom run
induction`` trains: ``mlp=False`` drops the blocks' MLPs (and LN_2), ``positions="learned"``
replaces RoPE by a learned position table added to the token embedding.

Everything runs on CPU tensors in float32 or float64 (the core's kernels).
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .._operands import choice, count
from . import functional as F
from .nn import HeadProjections
from .rope import rotary_embedding

VARIANTS = ("standard", "whitened", "projection", "cauchy", "stable", "lightning")
POSITIONS = ("rope", "learned")  # rotary queries and keys, or a learned table added to the embedding

# the variant parameters each variant reads, with their defaults
VARIANT_PARAMS = {"projection": {"sigma": 0.01}, "cauchy": {"gamma": 1.0}, "stable": {"alpha": 1.5, "c": 1.0}}


def count_parameters(module: nn.Module) -> int:
    """Number of trainable scalars of a module.

    Parameters
    ----------
    module : torch.nn.Module
        Any module.

    Returns
    -------
    int
        Sum of ``p.numel()`` over the parameters that require a gradient.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> count_parameters(torch.nn.Linear(3, 2))
    8
    """
    return int(sum(p.numel() for p in module.parameters() if p.requires_grad))


class CausalSelfAttention(HeadProjections):
    """The attention sub-layer of a block: ``forward(a)`` -> (residual base, W_O attn).

    Parameters
    ----------
    d_model : int
        Model width (a multiple of 2 * n_heads, for RoPE's pairs).
    n_heads : int
        Heads; each has queries and keys of width d_head = d_model / n_heads.
    variant : str
        One of :data:`VARIANTS` (see the module docstring).
    **params
        The variant's parameters (``sigma``, ``gamma``, ``alpha``, ``c``); unknown names raise
        ValueError.

    Notes
    -----
    ``forward(a)`` takes the layer-normed stream a (batch, n, d_model) and returns (base,
    delta), both (batch, n, d_model): delta = W_O attn(...), base = w = whiten(a) for
    "whitened" and None otherwise (the block then adds delta to its input x).

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> att = CausalSelfAttention(16, 2, variant="whitened")
    >>> base, delta = att(torch.zeros(1, 5, 16))
    >>> tuple(delta.shape)
    (1, 5, 16)
    """

    def __init__(self, d_model: int, n_heads: int, variant: str = "standard", *, rotary: bool = True, **params):
        choice("variant", variant, VARIANTS)
        if not (d_model >= 2 and n_heads >= 1 and d_model % (2 * n_heads) == 0):
            raise ValueError(f"d_model must be a positive multiple of 2 * n_heads (even head width for RoPE), "
                             f"got d_model={d_model}, n_heads={n_heads}")
        wanted = VARIANT_PARAMS.get(variant, {})
        unknown = set(params) - set(wanted)
        if unknown:
            raise ValueError(f"variant {variant!r} takes parameters {sorted(wanted) or 'none'}, "
                             f"got unexpected {sorted(unknown)}")
        super().__init__(d_model, n_heads, whitened=variant == "whitened")
        self.params = {**wanted, **{k: float(v) for k, v in params.items()}}
        self.variant = variant
        self.rotary = rotary

    def forward(self, a: Tensor):
        """(base, delta) for the layer-normed stream a (batch, n, d_model); see the class docstring."""
        n = a.shape[1]
        stream, q, k, v = self.heads(a)  # whitened: v is the whitened stream (seed eq. 4: no W_V)
        base = stream if self.variant == "whitened" else None
        if self.rotary:
            q, k = rotary_embedding(q), rotary_embedding(k)
        p = self.params
        if self.variant in ("standard", "whitened"):
            y = F.softmax_attention(q, k, v, causal=True)
        elif self.variant == "projection":
            y = F.projection_attention(q, k, v, sigma=p["sigma"], causal=True)
        elif self.variant == "cauchy":
            y = F.kernel_attention(q, k, v, kernel="cauchy", gamma=p["gamma"], causal=True)
        elif self.variant == "stable":
            y = F.kernel_attention(q, k, v, kernel="stable", alpha=p["alpha"], c=p["c"], causal=True)
        else:  # lightning, divided by sqrt(d_head) (i + 1)
            y = F.lightning_attention(q, k, v, causal=True)
            count = torch.arange(1, n + 1, dtype=y.dtype)[:, None] * math.sqrt(self.d_head)
            y = y / count
        return base, self.merge(y)


class Block(nn.Module):
    """One pre-LN decoder block (attention sub-layer, then a 4x GELU MLP); see the module docstring.

    Parameters
    ----------
    d_model, n_heads, variant, **params
        As in :class:`CausalSelfAttention`.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> tuple(Block(16, 2)(torch.zeros(2, 5, 16)).shape)
    (2, 5, 16)
    """

    def __init__(self, d_model: int, n_heads: int, variant: str = "standard", *, mlp: bool = True,
                 rotary: bool = True, **params):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, variant, rotary=rotary, **params)
        self.ln2 = nn.LayerNorm(d_model) if mlp else None
        self.mlp = (nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
                    if mlp else None)

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, n, d_model) -> the block's output, same shape."""
        base, delta = self.attn(self.ln1(x))
        h = (x if base is None else base) + delta
        return h if self.mlp is None else h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    """Decoder-only character GPT: embedding, pre-LN blocks, final LN, unembedding.

    Parameters
    ----------
    vocab_size : int
        Number of tokens (characters).
    d_model : int, default 64
        Width; a multiple of 2 * n_heads.
    n_blocks : int, default 2
        Decoder blocks.
    n_heads : int, default 2
        Heads per block.
    context : int, default 64
        Longest sequence ``forward`` accepts (RoPE needs no position table; the limit is kept
        for sampling and checkpoints).
    variant : str, default "standard"
        Attention variant, one of :data:`VARIANTS`.
    mlp : bool, default True
        Whether the blocks have MLPs (False: an attention-only model).
    positions : {"rope", "learned"}, default "rope"
        Rotary queries and keys, or a learned (context, d_model) table added to the embedding.
    **params
        The variant's parameters (``sigma`` for projection, ``gamma`` for cauchy, ``alpha``
        and ``c`` for stable).

    Notes
    -----
    ``forward(idx)`` maps token ids (batch, n) (int64, n <= context) to logits (batch, n,
    vocab_size) in the parameters' dtype. Initialisation as GPT-2: N(0, 0.02) weights, the
    residual output projections scaled by 1 / sqrt(2 n_blocks), zero biases; the whitening
    filter starts at L0 = I, M = 0.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> model = GPT(10, d_model=16, n_blocks=1, n_heads=2, context=8, variant="whitened")
    >>> tuple(model(torch.zeros(3, 8, dtype=torch.long)).shape)
    (3, 8, 10)
    """

    def __init__(self, vocab_size: int, d_model: int = 64, n_blocks: int = 2, n_heads: int = 2, context: int = 64,
                 variant: str = "standard", *, mlp: bool = True, positions: str = "rope", **params):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("n_blocks", n_blocks), ("context", context)):
            count(name, value)
        choice("positions", positions, POSITIONS)
        self.vocab_size, self.d_model, self.n_blocks, self.n_heads = vocab_size, d_model, n_blocks, n_heads
        self.context, self.variant, self.mlp, self.positions = context, variant, bool(mlp), positions
        self.embed = nn.Embedding(vocab_size, d_model)
        self.embed_positions = nn.Embedding(context, d_model) if positions == "learned" else None
        self.blocks = nn.ModuleList([Block(d_model, n_heads, variant, mlp=self.mlp, rotary=positions == "rope", **params)
                                     for _ in range(n_blocks)])
        self.params = dict(self.blocks[0].attn.params)
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:
            for proj in (block.attn.out,) + (() if block.mlp is None else (block.mlp[2],)):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.n_blocks))

    def forward(self, idx: Tensor, *, return_block_inputs: bool = False):
        """Logits (batch, n, vocab) of token ids idx (batch, n); optionally the blocks' attention inputs.

        With ``return_block_inputs`` also a list of (a, w) per block: a = LN_1(x), the input of
        the attention sub-layer (and of the whitening filter), and w = whiten(a) for the
        whitened variant (None otherwise), both (batch, n, d_model), detached.
        """
        if idx.dim() != 2 or idx.shape[1] > self.context:
            raise ValueError(f"idx must have shape (batch, n) with n <= context = {self.context}, "
                             f"got {tuple(idx.shape)}")
        x = self.embed(idx)
        if self.embed_positions is not None:
            x = x + self.embed_positions.weight[:idx.shape[1]]
        inputs = []
        for block in self.blocks:
            if return_block_inputs:
                a = block.ln1(x).detach()
                w = block.attn.whitened(a).detach() if self.variant == "whitened" else None
                inputs.append((a, w))
            x = block(x)
        logits = self.unembed(self.ln_f(x))
        return (logits, inputs) if return_block_inputs else logits

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy (nats per character) of next-token targets (batch, n) given idx (batch, n).

        Parameters
        ----------
        idx : Tensor, shape (batch, n), int64
            Input token ids.
        targets : Tensor, shape (batch, n), int64
            The next token at every position.

        Returns
        -------
        Tensor
            Scalar mean cross-entropy.

        Examples
        --------
        >>> import torch; from attngeom.torch.gpt import *
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(5, d_model=8, n_blocks=1, n_heads=1, context=4)
        >>> ids = torch.zeros(2, 4, dtype=torch.long)
        >>> bool(abs(model.loss(ids, ids).item() - math.log(5)) < 0.25)  # near-uniform at initialisation
        True
        """
        logits = self(idx)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def generate(self, idx: Tensor, n_new: int, *, temperature: float = 1.0,
                 generator: Optional[torch.Generator] = None) -> Tensor:
        """Sample n_new tokens after the prompt idx (batch, n); returns (batch, n + n_new) ids.

        Parameters
        ----------
        idx : Tensor, shape (batch, n), int64
            Prompt.
        n_new : int
            Tokens to sample (the model sees at most the last ``context`` tokens).
        temperature : float, default 1.0
            Logits are divided by it.
        generator : torch.Generator, optional
            For reproducible samples.

        Returns
        -------
        Tensor, shape (batch, n + n_new)
            The prompt followed by the samples.

        Examples
        --------
        >>> import torch; from attngeom.torch.gpt import *
        >>> model = GPT(5, d_model=8, n_blocks=1, n_heads=1, context=4)
        >>> tuple(model.generate(torch.zeros(1, 1, dtype=torch.long), 6).shape)
        (1, 7)
        """
        for _ in range(n_new):
            logits = self(idx[:, -self.context:])[:, -1] / temperature
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


# -- checkpoints ----------------------------------------------------------------------------------

def _np(t: Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def checkpoint_tensors(model: GPT) -> Dict[str, np.ndarray]:
    """The model's weights under Llama-style names, readable by :func:`attngeom.load_heads`.

    Layout (every matrix stored (out, in) as torch.nn.Linear, y = x W^T + b), float32:

    * ``embed_tokens.weight`` (vocab, d_model); ``norm.{weight,bias}``; ``lm_head.weight``
      (vocab, d_model); ``embed_positions.weight`` (context, d_model) for learned positions.
    * ``layers.N.input_layernorm.{weight,bias}`` (LN_1), ``layers.N.post_attention_layernorm.
      {weight,bias}`` (LN_2), ``layers.N.mlp.fc_in.{weight,bias}`` (4d, d) and
      ``layers.N.mlp.fc_out.{weight,bias}`` (d, 4d); the last three absent in an attention-only
      model (``mlp=False``).
    * ``layers.N.self_attn.{q,k,v,o}_proj.weight``: for every variant but whitened, q, k, v
      (d_model, d_model) and o (d_model, d_model) with head h in rows (of q, k, v) / columns
      (of o) h d_head .. (h + 1) d_head. For whitened, whose heads read and return d_model-wide
      w_j, the head width in the file is d_model (config ``head_dim``): head h's query and key
      rows are its d_head trained rows followed by zeros (so B = W_Q W_K^T is unchanged), its
      v_proj block is the identity (no W_V), and o_proj (d_model, n_heads d_model) is the
      trained W_O, so W_OV of head h is exactly W_O's block h. The heads of a whitened layer
      read w = whiten(LN_1(x)), stored as ``layers.N.self_attn.whitening_L0`` (lower
      triangle of the parameter) and ``layers.N.self_attn.whitening_M``.

    RoPE is not a weight: B = W_Q W_K^T is the position-free part of the bilinear form.
    Logits are scaled by 1 / sqrt(qk_head_dim) with qk_head_dim = d_model / n_heads in
    config.json (also for whitened, whose ``head_dim`` is the padded d_model).

    Parameters
    ----------
    model : GPT
        A model.

    Returns
    -------
    dict of str to ndarray
        Tensor name -> float32 array.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> t = checkpoint_tensors(GPT(7, d_model=8, n_blocks=1, n_heads=2, context=4))
    >>> t["layers.0.self_attn.q_proj.weight"].shape
    (8, 8)
    """
    d, h, dh = model.d_model, model.n_heads, model.d_model // model.n_heads
    out = {"embed_tokens.weight": _np(model.embed.weight), "norm.weight": _np(model.ln_f.weight),
           "norm.bias": _np(model.ln_f.bias), "lm_head.weight": _np(model.unembed.weight)}
    if model.embed_positions is not None:
        out["embed_positions.weight"] = _np(model.embed_positions.weight)
    for i, block in enumerate(model.blocks):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"], out[p + "input_layernorm.bias"] = _np(block.ln1.weight), _np(block.ln1.bias)
        if block.mlp is not None:
            out[p + "post_attention_layernorm.weight"] = _np(block.ln2.weight)
            out[p + "post_attention_layernorm.bias"] = _np(block.ln2.bias)
            out[p + "mlp.fc_in.weight"], out[p + "mlp.fc_in.bias"] = _np(block.mlp[0].weight), _np(block.mlp[0].bias)
            out[p + "mlp.fc_out.weight"], out[p + "mlp.fc_out.bias"] = _np(block.mlp[2].weight), _np(block.mlp[2].bias)
        att = block.attn
        a = p + "self_attn."
        if model.variant == "whitened":
            q, k = (_np(w) for w in att.qk.weight.chunk(2, dim=0))  # (d, d) each, head h in rows h dh ..
            pad = lambda w: np.concatenate([np.vstack([w[j * dh:(j + 1) * dh], np.zeros((d - dh, d), np.float32)])
                                            for j in range(h)])  # noqa: E731
            out[a + "q_proj.weight"], out[a + "k_proj.weight"] = pad(q), pad(k)
            out[a + "v_proj.weight"] = np.tile(np.eye(d, dtype=np.float32), (h, 1))
            out[a + "o_proj.weight"] = _np(att.out.weight)
            out[a + "whitening_L0"] = _np(torch.tril(att.L0))
            out[a + "whitening_M"] = _np(att.M)
        else:
            q, k, v = (_np(w) for w in att.qkv.weight.chunk(3, dim=0))
            out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = q, k, v
            out[a + "o_proj.weight"] = _np(att.out.weight)
    return out


def save_checkpoint(model: GPT, folder, *, vocab: Optional[Sequence[str]] = None, extra: Optional[dict] = None) -> str:
    """Write ``model.safetensors`` and ``config.json`` into folder (layout: :func:`checkpoint_tensors`).

    Parameters
    ----------
    model : GPT
        The model.
    folder : str or path-like
        Created if needed; ``ag.load_heads(folder)`` reads it.
    vocab : sequence of str, optional
        The characters of the token ids, stored in config.json.
    extra : dict, optional
        More JSON-serialisable entries for config.json (e.g. the training step).

    Returns
    -------
    str
        The folder.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> folder = save_checkpoint(GPT(5, d_model=8, n_blocks=1, n_heads=2, context=4), "ckpt")
    >>> load_checkpoint(folder).d_model
    8
    """
    from ..models import write_safetensors

    os.makedirs(folder, exist_ok=True)
    d, h = model.d_model, model.n_heads
    config = {"model_type": "attngeom-gpt", "architectures": ["attngeom.torch.gpt.GPT"], "variant": model.variant,
              "variant_params": model.params, "vocab_size": model.vocab_size, "hidden_size": d,
              "num_hidden_layers": model.n_blocks, "num_attention_heads": h, "num_key_value_heads": h,
              "head_dim": d if model.variant == "whitened" else d // h, "qk_head_dim": d // h,
              "max_position_embeddings": model.context, "mlp": model.mlp, "positions": model.positions,
              "position_embedding": ("rope (rotate-half, base 10000)" if model.positions == "rope" else
                                     "learned (embed_positions, added to the token embedding)"),
              "causal": True, "vocab": None if vocab is None else list(vocab), **(extra or {})}
    write_safetensors(os.path.join(folder, "model.safetensors"), checkpoint_tensors(model),
                      metadata={"format": "attngeom-gpt", "variant": model.variant})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return str(folder)


def load_checkpoint(folder) -> GPT:
    """Rebuild the float32 :class:`GPT` written by :func:`save_checkpoint`.

    Parameters
    ----------
    folder : str or path-like
        A folder with ``model.safetensors`` and ``config.json``.

    Returns
    -------
    GPT
        The model in eval mode, with the saved weights.

    Examples
    --------
    >>> import torch; from attngeom.torch.gpt import *
    >>> folder = save_checkpoint(GPT(5, d_model=8, n_blocks=1, n_heads=2, context=4), "ckpt")
    >>> load_checkpoint(folder).variant
    'standard'
    """
    from ..models import read_safetensors

    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "attngeom-gpt":
        raise ValueError(f"{folder!r} does not hold an attngeom GPT checkpoint (config.json model_type "
                         f"{cfg.get('model_type')!r})")
    model = GPT(cfg["vocab_size"], d_model=cfg["hidden_size"], n_blocks=cfg["num_hidden_layers"],
                n_heads=cfg["num_attention_heads"], context=cfg["max_position_embeddings"], variant=cfg["variant"],
                mlp=cfg.get("mlp", True), positions=cfg.get("positions", "rope"), **cfg.get("variant_params", {}))
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
         read_safetensors(os.path.join(folder, "model.safetensors")).items()}
    d, h, dh = model.d_model, model.n_heads, model.d_model // model.n_heads
    state = {"embed.weight": t["embed_tokens.weight"], "ln_f.weight": t["norm.weight"], "ln_f.bias": t["norm.bias"],
             "unembed.weight": t["lm_head.weight"]}
    if model.embed_positions is not None:
        state["embed_positions.weight"] = t["embed_positions.weight"]
    for i in range(model.n_blocks):
        p, s = f"layers.{i}.", f"blocks.{i}."
        parts = (("ln1", "input_layernorm"),) + ((("ln2", "post_attention_layernorm"), ("mlp.0", "mlp.fc_in"),
                                                  ("mlp.2", "mlp.fc_out")) if model.mlp else ())
        for ours, theirs in parts:
            state[f"{s}{ours}.weight"], state[f"{s}{ours}.bias"] = t[f"{p}{theirs}.weight"], t[f"{p}{theirs}.bias"]
        a = p + "self_attn."
        state[s + "attn.out.weight"] = t[a + "o_proj.weight"]
        if model.variant == "whitened":
            unpad = lambda w: torch.cat([w[j * d:j * d + dh] for j in range(h)])  # noqa: E731
            state[s + "attn.qk.weight"] = torch.cat([unpad(t[a + "q_proj.weight"]), unpad(t[a + "k_proj.weight"])])
            state[s + "attn.L0"], state[s + "attn.M"] = t[a + "whitening_L0"], t[a + "whitening_M"]
        else:
            state[s + "attn.qkv.weight"] = torch.cat([t[a + n + "_proj.weight"] for n in "qkv"])
    model.load_state_dict(state)
    return model.eval()
