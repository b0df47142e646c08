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

from .._operands import choice, count, scalar
from ..kernels import kernel_params
from . import functional as F
from .rope import rotary_embedding

VARIANTS = ("softmax", "kernel", "projection", "lightning", "whitened")


class HeadProjections(nn.Module):
    """The projections of a multi-head self-attention layer, shared by its variants.

    Standard: ``qkv`` (d_model -> 3 d_model: the heads' queries, keys and values) and ``out``
    (W_O, d_model -> d_model). Whitened ("Whitened Self-Attention", seed 004 eq. 4 and 9): a
    learned steady-state pair ``L0`` (its lower triangle is used) and ``M``, starting as the
    identity filter L0 = I, M = 0; ``qk`` (d_model -> 2 d_model) and no W_V (the values are
    the whitened tokens), and ``out`` maps the n_heads concatenated d_model-wide head outputs
    back to d_model. The parameter names are those of the checkpoints.

    Parameters
    ----------
    d_model : int
        Model width.
    n_heads : int
        Heads; queries and keys have width d_head = d_model / n_heads.
    whitened : bool, default False
        The whitened layer's parameters instead of the standard ones.

    Examples
    --------
    >>> import torch; from attngeom.torch.nn import HeadProjections
    >>> w, q, k, v = HeadProjections(8, 2, whitened=True).heads(torch.ones(3, 5, 8))
    >>> tuple(q.shape), tuple(v.shape)  # values: the whitened tokens, for every head
    ((3, 2, 5, 4), (3, 1, 5, 8))
    """

    def __init__(self, d_model: int, n_heads: int, *, whitened: bool = False):
        super().__init__()
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        if whitened:
            self.qk = nn.Linear(d_model, 2 * d_model, bias=False)
            self.out = nn.Linear(n_heads * d_model, d_model, bias=False)
            self.L0 = nn.Parameter(torch.eye(d_model))  # the identity filter at initialisation
            self.M = nn.Parameter(torch.zeros(d_model, d_model))
        else:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.out = nn.Linear(d_model, d_model, bias=False)

    @property
    def is_whitened(self) -> bool:
        """Whether the layer whitens its input (it has ``L0`` and ``M``)."""
        return hasattr(self, "L0")

    def whitened(self, a: Tensor) -> Tensor:
        """The whitening recursion of a (batch, n, d_model) with this layer's (tril L0, M) (seed eq. 9).

        Parameters
        ----------
        a : Tensor, shape (batch, n, d_model)
            The layer's input.

        Returns
        -------
        Tensor, shape (batch, n, d_model)
            w_0 = L0^{-1} a_0, w_i = L0^{-1}(a_i - M w_{i-1}).

        Examples
        --------
        >>> import torch; from attngeom.torch.nn import HeadProjections
        >>> layer = HeadProjections(4, 1, whitened=True)
        >>> bool(torch.equal(layer.whitened(torch.ones(1, 3, 4)), torch.ones(1, 3, 4)))  # L0 = I, M = 0
        True
        """
        return F.whiten(a, torch.tril(self.L0), self.M)

    def heads(self, x: Tensor):
        """(stream, q, k, v) for x (batch, n, d_model): per-head tensors (batch, heads, n, width).

        The stream is what the heads read: x, or its whitening for the whitened layer, whose
        values are the whitened tokens themselves (v of shape (batch, 1, n, d_model)).

        Parameters
        ----------
        x : Tensor, shape (batch, n, d_model)
            The layer's input.

        Returns
        -------
        tuple of Tensor
            The stream (batch, n, d_model), then q, k (batch, heads, n, d_head) and v.

        Examples
        --------
        >>> import torch; from attngeom.torch.nn import HeadProjections
        >>> x, q, k, v = HeadProjections(8, 2).heads(torch.ones(3, 5, 8))
        >>> tuple(q.shape), tuple(v.shape)
        ((3, 2, 5, 4), (3, 2, 5, 4))
        """
        if self.is_whitened:
            w = self.whitened(x)
            q, k = (self._split(t) for t in self.qk(w).chunk(2, dim=-1))
            return w, q, k, w[:, None]
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        return x, q, k, v

    def merge(self, y: Tensor) -> Tensor:
        """W_O applied to the concatenated head outputs y (batch, heads, n, width) -> (batch, n, d_model).

        Parameters
        ----------
        y : Tensor, shape (batch, heads, n, width)
            The heads' outputs.

        Returns
        -------
        Tensor, shape (batch, n, d_model)
            ``out`` of the heads concatenated along the width.

        Examples
        --------
        >>> import torch; from attngeom.torch.nn import HeadProjections
        >>> tuple(HeadProjections(8, 2).merge(torch.ones(3, 2, 5, 4)).shape)
        (3, 5, 8)
        """
        b, _, n, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, n, -1))

    def _split(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, -1).transpose(1, 2)  # (batch, heads, n, width)


class MultiheadSelfAttention(HeadProjections):
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
        d_model, n_heads = count("d_model", d_model), count("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model must be a positive multiple of n_heads, got d_model={d_model!r}, "
                             f"n_heads={n_heads!r}")
        choice("variant", variant, VARIANTS)
        kernel = sigma = None
        if variant == "kernel":
            kernel = kernel_params(params.pop("kernel", "exp"), params)
        elif variant == "projection":
            unknown = set(params) - {"sigma"}
            if unknown:
                raise ValueError(f"variant 'projection' takes parameter sigma, got unexpected {sorted(unknown)}")
            sigma = scalar("sigma", params.get("sigma", 1.0), positive=True)
        elif params:
            raise ValueError(f"variant {variant!r} takes no parameters, got {sorted(params)}")
        super().__init__(d_model, n_heads, whitened=variant == "whitened")
        if kernel is not None:
            self.kernel, self.kernel_params = kernel
        if sigma is not None:
            self.sigma = sigma
        self.variant, self.rope, self.causal = variant, rope, causal

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, n, {self.d_model}), got {tuple(x.shape)}")
        resid, q, k, v = self.heads(x)
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
        return resid + self.merge(y)
