"""PyTorch bridge (optional: ``pip install 'attngeom[torch]'``).

Differentiable tensor functions over the C++ kernels, registered as ``torch.library``
custom ops (they work under ``torch.compile`` and pass ``torch.autograd.gradcheck``),
rotary embedding, and attention modules in :mod:`attngeom.torch.nn`. The core package never
imports torch; this subpackage does.

Example::

    import attngeom.torch as agt
    y = agt.softmax_attention(q, k, v, causal=True)
    y.sum().backward()
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("attngeom.torch needs PyTorch: pip install 'attngeom[torch]'") from exc

from . import nn
from .functional import kernel_attention, lightning_attention, projection_attention, softmax_attention, whiten
from .rope import rotary_embedding

__all__ = ["softmax_attention", "kernel_attention", "projection_attention", "lightning_attention", "whiten",
           "rotary_embedding", "nn"]
