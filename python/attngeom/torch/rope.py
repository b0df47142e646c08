"""Rotary position embedding (RoPE, Su et al. 2024), rotate-half convention."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def rotary_embedding(x: Tensor, *, positions: Optional[Tensor] = None, base: float = 10000.0) -> Tensor:
    """Rotate pairs (x_i, x_{i + d/2}) of each row by the angle p theta_i, theta_i = base^(-2i/d).

        rope(x)_p = x_p cos(p theta) + rotate_half(x_p) sin(p theta),
        rotate_half([a, b]) = [-b, a],

    the rotate-half layout of GPT-NeoX / Llama (not the interleaved pairs of the paper's
    eq. 34): q.k after rotation depends on the positions only through their difference.

    Parameters
    ----------
    x : (..., n, d) with d even, any float dtype and device.
    positions : (n,) positions of the rows, default 0..n-1.
    base : the frequency base.

    Returns a tensor of x's shape and dtype (differentiable: a plain torch expression).

    Example: ``q = attngeom.torch.rotary_embedding(q)``
    """
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"x must have an even last dimension for rotary embedding, got shape {tuple(x.shape)}")
    n = x.shape[-2]
    if positions is None:
        positions = torch.arange(n, device=x.device, dtype=torch.float64)
    elif positions.shape != (n,):
        raise ValueError(f"positions must have shape ({n},), got {tuple(positions.shape)}")
    inv_freq = base ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float64) * 2 / d)
    angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-b, a], dim=-1) * sin
