"""Attention modules over the differentiable core kernels.

``MultiheadSelfAttention`` is one residual attention sub-block with a choice of attention
variant. For the standard variants it maps the residual stream x to x + attn(x). The
whitened variant follows "Whitened Self-Attention" (seed 004) Fig. 2: the block whitens its
input, w = whiten(x, L0, M) with a learned steady-state pair (L0 lower triangular, M), the
heads attend over w with no value matrix (eq. 4: the values are the w_j themselves), and the
whitened sequence is carried on the residual stream: the block returns w + attn(w).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..kernels import kernel_params
from . import functional as F
from .rope import rotary_embedding

VARIANTS = ("softmax", "kernel", "projection", "lightning", "whitened")


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention sub-block x (batch, n, d_model) -> residual + attention.

    Parameters
    ----------
    d_model, n_heads : model width and head count (d_model divisible by n_heads; each head
        has width d_head = d_model / n_heads for queries and keys).
    variant : "softmax" (scaled dot product), "kernel" (kernel-swapped, params kernel=...,
        sigma / gamma / alpha, c), "projection" (Gaussian distance, param sigma), "lightning"
        (unnormalised, linear time: no 1/n or softmax, so the output grows with n, as in
        Henry-Marchetti-Kohn eq. 1), or "whitened" (seed 004 eq. 4 and 9: learned L0, M;
        softmax over the whitened sequence, no W_V; the output projection maps the n_heads
        concatenated d_model-wide head outputs back to d_model).
    rope : rotary embedding (rotate-half) of queries and keys.
    causal : each token sees itself and the past.
    **params : the variant's parameters, e.g. ``kernel="gaussian", sigma=0.7``.

    forward(x) returns x + W_O attn(x) (w + W_O attn(w) for "whitened"), x's shape and dtype.
    CPU float32 / float64 tensors (the core's kernels).

    Example: ``block = attngeom.torch.nn.MultiheadSelfAttention(256, 4, variant="whitened")``
    """

    def __init__(self, d_model: int, n_heads: int, *, variant: str = "softmax", rope: bool = True,
                 causal: bool = True, **params):
        super().__init__()
        if not (isinstance(d_model, int) and isinstance(n_heads, int) and n_heads >= 1 and d_model >= 1
                and d_model % n_heads == 0):
            raise ValueError(f"d_model must be a positive multiple of n_heads, got d_model={d_model!r}, "
                             f"n_heads={n_heads!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "kernel":
            kernel = params.pop("kernel", "exp")
            self.kernel, self.kernel_params = kernel_params(kernel, params)
        elif variant == "projection":
            unknown = set(params) - {"sigma"}
            if unknown:
                raise ValueError(f"variant 'projection' takes parameter sigma, got unexpected {sorted(unknown)}")
            self.sigma = float(params.get("sigma", 1.0))
        elif params:
            raise ValueError(f"variant {variant!r} takes no parameters, got {sorted(params)}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.variant, self.rope, self.causal = variant, rope, causal
        if variant == "whitened":
            self.qk = nn.Linear(d_model, 2 * d_model, bias=False)
            self.out = nn.Linear(n_heads * d_model, d_model, bias=False)
            # whitening starts as the identity filter: L0 = I, M = 0
            self.L0 = nn.Parameter(torch.eye(d_model))
            self.M = nn.Parameter(torch.zeros(d_model, d_model))
        else:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.out = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, -1).transpose(1, 2)  # (batch, heads, n, d)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, n, {self.d_model}), got {tuple(x.shape)}")
        b, n, _ = x.shape
        if self.variant == "whitened":
            resid = F.whiten(x, torch.tril(self.L0), self.M)
            q, k = (self._heads(t) for t in self.qk(resid).chunk(2, dim=-1))
            v = resid[:, None]  # every head's values are the whitened tokens (no W_V)
        else:
            resid = x
            q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        if self.rope:
            q, k = rotary_embedding(q), rotary_embedding(k)
        if self.variant in ("softmax", "whitened"):
            y = F.softmax_attention(q, k, v, causal=self.causal)
        elif self.variant == "kernel":
            y = F.kernel_attention(q, k, v, kernel=self.kernel, causal=self.causal, **self.kernel_params)
        elif self.variant == "projection":
            y = F.projection_attention(q, k, v, sigma=self.sigma, causal=self.causal)
        else:
            y = F.lightning_attention(q, k, v, causal=self.causal)
        return resid + self.out(y.transpose(1, 2).reshape(b, n, -1))
