"""Differentiable tensor functions over the core kernels, registered as torch custom ops.

Each function is a ``torch.library.custom_op`` whose forward and backward call the NumPy API
of attngeom (the C++ core); ``register_fake`` gives their output shapes to ``torch.compile``
and ``register_autograd`` connects the backward kernels. The backward is itself a custom op,
so a compiled graph traces through it without running NumPy.

Hand-over: a contiguous CPU tensor reaches the core without a copy (``tensor.numpy()``
shares its memory), a non-contiguous one is made contiguous once, and results come back
through ``torch.from_numpy`` (no copy). Tensors must be on the CPU and float32, float64 or
bfloat16; CUDA tensors raise ValueError. bfloat16 inputs are widened exactly to float32 (a
differentiable cast, so gradients reach them in bfloat16), the kernels compute in float32, and
the output returns in bfloat16 (statistics stay float32). Leading (batch) axes broadcast as
in the NumPy API.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import attention as _attention
from .._operands import causal_code, logit_scale, scalar
from ..attention_stats import AttentionStats
from .. import lightning as _lightning
from .. import projection as _projection
from .. import whitening as _whitening
from ..kernels import kernel_params

_CAUSAL = ("none", "top_left", "bottom_right")  # by the core's code (causal_code)
_CAUSAL_NUMPY = {"none": False, "top_left": True, "bottom_right": "bottom_right"}


def _cpu_tensor(name: str, t) -> None:
    """A torch.Tensor on the CPU: TypeError or ValueError naming the argument otherwise."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on device {t.device}: attngeom.torch runs on CPU tensors only "
                         f"(the C++ core has no GPU kernels); move it with {name}.cpu()")


def _array(name: str, t: Optional[Tensor], *, allow_bool: bool = False) -> Optional[np.ndarray]:
    """A CPU tensor as a NumPy array sharing its memory (one copy if it is not contiguous)."""
    if t is None:
        return None
    _cpu_tensor(name, t)
    allowed = (torch.float32, torch.float64) + ((torch.bool,) if allow_bool else ())
    if t.dtype not in allowed:
        raise ValueError(f"{name} must be a float32 or float64 tensor{' (or bool)' if allow_bool else ''}, "
                         f"got {t.dtype}")
    return t.detach().contiguous().numpy()


def _tensor(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _check_tensors(**tensors) -> None:
    """The checks of every public function, before dispatch: CPU tensors of one float dtype
    (the operands' shapes and values are checked by the NumPy API the ops call)."""
    for name, t in tensors.items():
        if t is not None:
            _cpu_tensor(name, t)
    dtypes = {name: t.dtype for name, t in tensors.items() if t is not None}
    if len(set(dtypes.values())) > 1:
        raise ValueError(f"inputs must share one dtype (float32 or float64), got {dtypes}")


def _bfloat16_as_float32(fn):
    """fn with bfloat16 tensor arguments widened to float32 (exact, differentiable) and, when
    any was bfloat16, its tensor output (the first of a pair) rounded back to bfloat16."""
    def widen(t):
        return t.float() if isinstance(t, Tensor) and t.dtype == torch.bfloat16 else t

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]
        if not any(t.dtype == torch.bfloat16 for t in tensors):
            return fn(*args, **kwargs)
        out = fn(*(widen(a) for a in args), **{key: widen(a) for key, a in kwargs.items()})
        if isinstance(out, tuple):
            return (out[0].to(torch.bfloat16),) + out[1:]
        return out.to(torch.bfloat16)
    return wrapper


def _causal(causal) -> str:
    """The causal argument as the ops take it (a string), checked as the NumPy API checks it."""
    return _CAUSAL[causal_code(causal)]


def _batch(*shapes) -> Tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*(torch.Size(s) for s in shapes)))


def _out_shape(q, k, v, mask) -> Tuple[Tuple[int, ...], int, int]:
    lead = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    if mask is not None and mask.dim() > 2:
        lead.append(mask.shape[:-2])
    return _batch(*lead), q.shape[-2], v.shape[-1]


# ---- softmax attention ----------------------------------------------------------------

@torch.library.custom_op("attngeom::softmax_attention", mutates_args=())
def _softmax_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str,
                scale: float) -> Tuple[Tensor, Tensor]:
    y, log_z = _attention.softmax_attention(_array("q", q), _array("k", k), _array("v", v),
                                            mask=_array("mask", mask, allow_bool=True),
                                            causal=_CAUSAL_NUMPY[causal], scale=scale, return_log_partition=True,
                                            layout="bhnd")
    return _tensor(y), _tensor(log_z)


@_softmax_op.register_fake
def _(q, k, v, mask, causal, scale):
    batch, n_q, d_v = _out_shape(q, k, v, mask)
    return q.new_empty(batch + (n_q, d_v)), q.new_empty(batch + (n_q,))


@torch.library.custom_op("attngeom::softmax_attention_backward", mutates_args=())
def _softmax_backward_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, scale: float,
                         y: Tensor, log_z: Tensor, dy: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    g = _attention.softmax_attention_backward(_array("q", q), _array("k", k), _array("v", v), _array("dy", dy),
                                              mask=_array("mask", mask, allow_bool=True),
                                              causal=_CAUSAL_NUMPY[causal], scale=scale, y=_array("y", y),
                                              log_partition=_array("log_partition", log_z), layout="bhnd")
    return tuple(_tensor(a) for a in g)


@_softmax_backward_op.register_fake
def _(q, k, v, mask, causal, scale, y, log_z, dy):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _softmax_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale = inputs
    y, log_z = output
    ctx.mark_non_differentiable(log_z)
    ctx.save_for_backward(q, k, v, mask, y, log_z)
    ctx.causal, ctx.scale = causal, scale


def _softmax_backward(ctx, dy, dlog_z):
    q, k, v, mask, y, log_z = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None, None
    dq, dk, dv = _softmax_backward_op(q, k, v, mask, ctx.causal, ctx.scale, y, log_z, dy)
    return dq, dk, dv, None, None, None


_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@_bfloat16_as_float32
def softmax_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Tensor] = None, causal=False,
                      scale: Optional[float] = None, return_stats: bool = False):
    """Differentiable softmax attention y = softmax(scale q k^T + mask) v on CPU tensors.

    Laplace-Radon eq. (2)-(3); forward and backward are the flash-style C++ kernels of
    :func:`attngeom.softmax_attention` and :func:`attngeom.softmax_attention_backward`.

    q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), one dtype (float32 or float64),
    leading axes broadcast; mask bool (True = attend) or additive, broadcastable to
    (..., n_q, n_k), no gradient; causal False | True ("top_left") | "bottom_right";
    scale default 1 / sqrt(d_k). Returns y (..., n_q, d_v) in the inputs' dtype; with
    `return_stats`, the pair (y, :class:`attngeom.AttentionStats` of tensors (..., n_q)),
    computed in the same pass (no gradient flows through the statistics).

    Example: ``y = attngeom.torch.softmax_attention(q, k, v, causal=True)``
    """
    _check_tensors(q=q, k=k, v=v)
    _check_tensors(mask=mask)
    scale = logit_scale(scale, q.shape[-1])
    if return_stats:
        return _with_stats(_softmax_stats_op(q, k, v, mask, _causal(causal), scale))
    return _softmax_op(q, k, v, mask, _causal(causal), scale)[0]


# ---- statistics ---------------------------------------------------------------------------
# The forward with AttentionStats: one more custom op per attention kind, whose outputs are y,
# log Z and the five statistics; only y is differentiable, and its backward is the plain op's.

def _stats_tensors(y, stats) -> Tuple[Tensor, ...]:
    return (_tensor(y),) + tuple(_tensor(np.ascontiguousarray(getattr(stats, f))) for f in
                                 ("log_z", "entropy", "max_weight", "argmax", "sink_weight", "mean_distance"))


def _stats_fake(q, k, v, mask) -> Tuple[Tensor, ...]:
    batch, n_q, d_v = _out_shape(q, k, v, mask)
    row = batch + (n_q,)
    return (q.new_empty(batch + (n_q, d_v)), q.new_empty(row), q.new_empty(row), q.new_empty(row),
            q.new_empty(row, dtype=torch.int64), q.new_empty(row), q.new_empty(row))


def _stats_setup(setup):
    def stats_setup(ctx, inputs, output):
        setup(ctx, inputs, output[:2])
        ctx.mark_non_differentiable(*output[1:])  # replaces the setup's own (log Z only)
    return stats_setup


def _stats_backward(backward):
    def stats_backward(ctx, dy, dlog_z, *_):
        return backward(ctx, dy, dlog_z)
    return stats_backward


def _with_stats(outputs) -> Tuple[Tensor, AttentionStats]:
    return outputs[0], AttentionStats(*outputs[1:])


@torch.library.custom_op("attngeom::softmax_attention_stats", mutates_args=())
def _softmax_stats_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str,
                      scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    y, stats = _attention.softmax_attention(_array("q", q), _array("k", k), _array("v", v),
                                            mask=_array("mask", mask, allow_bool=True),
                                            causal=_CAUSAL_NUMPY[causal], scale=scale, return_stats=True,
                                            layout="bhnd")
    return _stats_tensors(y, stats)


@_softmax_stats_op.register_fake
def _(q, k, v, mask, causal, scale):
    return _stats_fake(q, k, v, mask)


_softmax_stats_op.register_autograd(_stats_backward(_softmax_backward), setup_context=_stats_setup(_softmax_setup))


# ---- kernel attention -------------------------------------------------------------------

def _kernel_dict(kernel: str, values: List[float]) -> dict:
    names = list(kernel_params(kernel, {})[1])
    return dict(zip(names, values))


@torch.library.custom_op("attngeom::kernel_attention", mutates_args=())
def _kernel_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, scale: float, kernel: str,
               params: List[float]) -> Tuple[Tensor, Tensor]:
    y, log_z = _attention.kernel_attention(_array("q", q), _array("k", k), _array("v", v), kernel=kernel,
                                           mask=_array("mask", mask, allow_bool=True), causal=_CAUSAL_NUMPY[causal],
                                           scale=scale, return_log_partition=True, layout="bhnd",
                                           **_kernel_dict(kernel, params))
    return _tensor(y), _tensor(log_z)


@_kernel_op.register_fake
def _(q, k, v, mask, causal, scale, kernel, params):
    batch, n_q, d_v = _out_shape(q, k, v, mask)
    return q.new_empty(batch + (n_q, d_v)), q.new_empty(batch + (n_q,))


@torch.library.custom_op("attngeom::kernel_attention_backward", mutates_args=())
def _kernel_backward_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, scale: float,
                        kernel: str, params: List[float], y: Tensor, log_z: Tensor,
                        dy: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    g = _attention.kernel_attention_backward(_array("q", q), _array("k", k), _array("v", v), _array("dy", dy),
                                             kernel=kernel, mask=_array("mask", mask, allow_bool=True),
                                             causal=_CAUSAL_NUMPY[causal], scale=scale, y=_array("y", y),
                                             log_partition=_array("log_partition", log_z),
                                             layout="bhnd", **_kernel_dict(kernel, params))
    return tuple(_tensor(a) for a in g)


@_kernel_backward_op.register_fake
def _(q, k, v, mask, causal, scale, kernel, params, y, log_z, dy):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _kernel_setup(ctx, inputs, output):
    q, k, v, mask, causal, scale, kernel, params = inputs
    y, log_z = output
    ctx.mark_non_differentiable(log_z)
    ctx.save_for_backward(q, k, v, mask, y, log_z)
    ctx.args = (causal, scale, kernel, params)


def _kernel_backward(ctx, dy, dlog_z):
    q, k, v, mask, y, log_z = ctx.saved_tensors
    if dy is None:
        return (None,) * 8
    dq, dk, dv = _kernel_backward_op(q, k, v, mask, *ctx.args, y, log_z, dy)
    return dq, dk, dv, None, None, None, None, None


_kernel_op.register_autograd(_kernel_backward, setup_context=_kernel_setup)


@torch.library.custom_op("attngeom::kernel_attention_stats", mutates_args=())
def _kernel_stats_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, scale: float,
                     kernel: str, params: List[float]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    y, stats = _attention.kernel_attention(_array("q", q), _array("k", k), _array("v", v), kernel=kernel,
                                           mask=_array("mask", mask, allow_bool=True), causal=_CAUSAL_NUMPY[causal],
                                           scale=scale, return_stats=True, layout="bhnd",
                                           **_kernel_dict(kernel, params))
    return _stats_tensors(y, stats)


@_kernel_stats_op.register_fake
def _(q, k, v, mask, causal, scale, kernel, params):
    return _stats_fake(q, k, v, mask)


_kernel_stats_op.register_autograd(_stats_backward(_kernel_backward), setup_context=_stats_setup(_kernel_setup))


@_bfloat16_as_float32
def kernel_attention(q: Tensor, k: Tensor, v: Tensor, *, kernel: str = "exp", mask: Optional[Tensor] = None,
                     causal=False, scale: Optional[float] = None, return_stats: bool = False, **params):
    """Differentiable kernel-swapped attention with weights psi(tau_i, u_i.k_j) (Laplace-Radon eq. 40-44).

    As :func:`attngeom.kernel_attention` (kernel "exp", "gaussian" (sigma), "cauchy" (gamma),
    "stable" (alpha, c)); backward by :func:`attngeom.kernel_attention_backward`. Shapes,
    dtypes, mask, causal and `return_stats` as in :func:`softmax_attention`. The kernel
    parameters are fixed (no gradient).

    Example: ``y = attngeom.torch.kernel_attention(q, k, v, kernel="cauchy", gamma=0.5)``
    """
    _check_tensors(q=q, k=k, v=v)
    _check_tensors(mask=mask)
    name, p = kernel_params(kernel, params)
    scale = logit_scale(scale, q.shape[-1])
    if return_stats:
        return _with_stats(_kernel_stats_op(q, k, v, mask, _causal(causal), scale, name, list(p.values())))
    return _kernel_op(q, k, v, mask, _causal(causal), scale, name, list(p.values()))[0]


# ---- projection attention ---------------------------------------------------------------

@torch.library.custom_op("attngeom::projection_attention", mutates_args=())
def _projection_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, sigma: float) -> Tensor:
    return _tensor(_projection.projection_attention(_array("q", q), _array("k", k), _array("v", v), sigma=sigma,
                                                    causal=_CAUSAL_NUMPY[causal],
                                                    mask=_array("mask", mask, allow_bool=True), layout="bhnd"))


@_projection_op.register_fake
def _(q, k, v, mask, causal, sigma):
    batch, n_q, d_v = _out_shape(q, k, v, mask)
    return q.new_empty(batch + (n_q, d_v))


@torch.library.custom_op("attngeom::projection_attention_backward", mutates_args=())
def _projection_backward_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: str, sigma: float,
                            dy: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    g = _projection.projection_attention_backward(_array("q", q), _array("k", k), _array("v", v), _array("dy", dy),
                                                  sigma=sigma, causal=_CAUSAL_NUMPY[causal],
                                                  mask=_array("mask", mask, allow_bool=True), layout="bhnd")
    return tuple(_tensor(a) for a in g)


@_projection_backward_op.register_fake
def _(q, k, v, mask, causal, sigma, dy):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _projection_setup(ctx, inputs, output):
    q, k, v, mask, causal, sigma = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.args = (causal, sigma)


def _projection_backward(ctx, dy):
    q, k, v, mask = ctx.saved_tensors
    if dy is None:
        return (None,) * 6
    dq, dk, dv = _projection_backward_op(q, k, v, mask, *ctx.args, dy)
    return dq, dk, dv, None, None, None


_projection_op.register_autograd(_projection_backward, setup_context=_projection_setup)


@_bfloat16_as_float32
def projection_attention(q: Tensor, k: Tensor, v: Optional[Tensor] = None, *, sigma: float = 1.0,
                         mask: Optional[Tensor] = None, causal=False) -> Tensor:
    """Differentiable Gaussian-distance attention, weights ~ exp(-|q_i - k_j|^2 / (2 sigma^2)).

    Sanger eq. (3)-(14) with the squared distance, as :func:`attngeom.projection_attention`;
    backward by :func:`attngeom.projection_attention_backward` (sigma fixed). v defaults to
    k (then k receives both gradients). Shapes and dtypes as in :func:`softmax_attention`.

    Example: ``y = attngeom.torch.projection_attention(x, x, sigma=0.5)``
    """
    v = k if v is None else v
    _check_tensors(q=q, k=k, v=v)
    _check_tensors(mask=mask)
    return _projection_op(q, k, v, mask, _causal(causal), scalar("sigma", sigma, positive=True))


# ---- lightning attention ----------------------------------------------------------------

@torch.library.custom_op("attngeom::lightning_attention", mutates_args=())
def _lightning_op(q: Tensor, k: Tensor, v: Tensor, causal: str) -> Tensor:
    return _tensor(_lightning.lightning_attention(_array("q", q), _array("k", k), _array("v", v),
                                                  causal=_CAUSAL_NUMPY[causal], layout="bhnd"))


@_lightning_op.register_fake
def _(q, k, v, causal):
    batch, n_q, d_v = _out_shape(q, k, v, None)
    return q.new_empty(batch + (n_q, d_v))


@torch.library.custom_op("attngeom::lightning_attention_backward", mutates_args=())
def _lightning_backward_op(q: Tensor, k: Tensor, v: Tensor, causal: str, dy: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    g = _lightning.lightning_attention_backward(_array("q", q), _array("k", k), _array("v", v), _array("dy", dy),
                                                causal=_CAUSAL_NUMPY[causal], layout="bhnd")
    return tuple(_tensor(a) for a in g)


@_lightning_backward_op.register_fake
def _(q, k, v, causal, dy):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _lightning_setup(ctx, inputs, output):
    q, k, v, causal = inputs
    ctx.save_for_backward(q, k, v)
    ctx.causal = causal


def _lightning_backward(ctx, dy):
    q, k, v = ctx.saved_tensors
    if dy is None:
        return None, None, None, None
    dq, dk, dv = _lightning_backward_op(q, k, v, ctx.causal, dy)
    return dq, dk, dv, None


_lightning_op.register_autograd(_lightning_backward, setup_context=_lightning_setup)


@_bfloat16_as_float32
def lightning_attention(q: Tensor, k: Tensor, v: Tensor, *, causal=False) -> Tensor:
    """Differentiable lightning attention y_i = sum_{j visible} (q_i.k_j) v_j, O(n) (Henry-Marchetti-Kohn eq. 1).

    As :func:`attngeom.lightning_attention`; backward by
    :func:`attngeom.lightning_attention_backward` (chunked, O(n d_k d_v)). Shapes and dtypes
    as in :func:`softmax_attention`.

    Example: ``y = attngeom.torch.lightning_attention(q, k, v, causal=True)``
    """
    _check_tensors(q=q, k=k, v=v)
    return _lightning_op(q, k, v, _causal(causal))


# ---- whitening ------------------------------------------------------------------------------

@torch.library.custom_op("attngeom::whiten", mutates_args=())
def _whiten_op(x: Tensor, L0: Tensor, M: Tensor) -> Tensor:
    return _tensor(_whitening.whiten(_array("x", x), _array("L0", L0), _array("M", M)))


@_whiten_op.register_fake
def _(x, L0, M):
    return torch.empty_like(x)


@torch.library.custom_op("attngeom::whiten_backward", mutates_args=())
def _whiten_backward_op(x: Tensor, L0: Tensor, M: Tensor, w: Tensor, dw: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    g = _whitening.whiten_backward(_array("x", x), _array("L0", L0), _array("M", M), _array("dw", dw),
                                   w=_array("w", w))
    return tuple(_tensor(a) for a in g)


@_whiten_backward_op.register_fake
def _(x, L0, M, w, dw):
    return torch.empty_like(x), torch.empty_like(L0), torch.empty_like(M)


def _whiten_setup(ctx, inputs, output):
    x, L0, M = inputs
    ctx.save_for_backward(x, L0, M, output)


def _whiten_backward(ctx, dw):
    x, L0, M, w = ctx.saved_tensors
    if dw is None:
        return None, None, None
    return _whiten_backward_op(x, L0, M, w, dw)


_whiten_op.register_autograd(_whiten_backward, setup_context=_whiten_setup)


@_bfloat16_as_float32
def whiten(x: Tensor, L0: Tensor, M: Tensor) -> Tensor:
    """Differentiable whitening recursion w_0 = L0^{-1} x_0, w_i = L0^{-1}(x_i - M w_{i-1}).

    "Whitened Self-Attention" eq. (9), steady-state pair (L0, M), both (D, D) and learnable;
    x (..., T, D). As :func:`attngeom.whiten`; backward by :func:`attngeom.whiten_backward`
    (reverse-time adjoint recursion). dL0 is the full-matrix gradient: a lower-triangular
    parametrisation passes ``torch.tril(P)`` and autograd keeps the lower triangle.

    Example: ``w = attngeom.torch.whiten(x, torch.tril(L0), M)``
    """
    _check_tensors(x=x, L0=L0, M=M)
    return _whiten_op(x, L0, M)
