"""Broadcasting of checked operands: the core takes contiguous (blocks, rows, cols) stacks and,
per operand, an index array mapping each flat batch position to the operand's own block."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .validation import (causal_code, check_finite, check_nonempty, compute_dtype, cotangent, query_key_value,
                         real_array)


@dataclass
class Operand:
    """A (blocks, *core) contiguous array and the index of its block for each batch position."""

    array: np.ndarray
    index: Optional[np.ndarray]


def batch_operands(batch_shape: tuple, arrays: Sequence[np.ndarray], core_ndims: Sequence[int], dtypes) -> list:
    """Flatten each array's batch axes and build its broadcast index over `batch_shape`."""
    total = int(np.prod(batch_shape, dtype=np.int64))
    out = []
    for a, core, dt in zip(arrays, core_ndims, dtypes):
        lead = a.shape[: a.ndim - core]
        flat = np.ascontiguousarray(a.reshape((int(np.prod(lead, dtype=np.int64)),) + a.shape[a.ndim - core:]), dtype=dt)
        if core == 1:
            flat = flat.reshape(flat.shape[0], 1, flat.shape[1])
        if tuple(lead) == tuple(batch_shape):
            index = None
        else:
            pad = (1,) * (len(batch_shape) - len(lead)) + tuple(lead)
            ids = np.arange(flat.shape[0], dtype=np.int64).reshape(pad)
            index = np.ascontiguousarray(np.broadcast_to(ids, batch_shape).reshape(total))
        out.append(Operand(flat, index))
    return out


def broadcast_batch(named: Sequence[tuple]) -> tuple:
    """Broadcast the leading (batch) shapes of (name, array, core_ndim) triples."""
    shapes = [a.shape[: a.ndim - core] for _, a, core in named]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        desc = ", ".join(f"{n} {s}" for (n, _, _), s in zip(named, shapes))
        raise ValueError(f"batch dimensions do not broadcast: {desc}") from None


class AttentionOperands:
    """Checked and broadcast operands of one attention-like call (queries given as q, or as
    tilts u with radii tau).

    Shapes: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v) or None (no values: a
    zero-width value block), tau (..., n_q) or (..., 1), mask broadcastable to
    (..., n_q, n_k) (boolean: True = attend; float: additive). Fields: ``q, k, v, tau, mask``
    as :class:`Operand`, ``batch_shape``, ``batch``, ``n_q, n_k, d_k, d_v``, ``dtype``,
    ``causal`` (the core's code), ``mask_kind`` ("keep", "bias" or None).

    ``finite=False`` leaves the NaN / inf checks of q, k, v and tau to the core: the attention
    forward finds them in the passes it makes anyway (the range check over q and k, the
    output rows for v) and raises the same NonFiniteOperand, while three NumPy passes here
    cost about a tenth of an attention call at n = 256.
    """

    def __init__(self, q, k, v, *, qname="q", tau=None, mask=None, causal=False, finite=True):
        q, k, v = query_key_value(q, k, v, qname=qname, finite=False)
        if v is None:  # no values, only the partition: a zero-width value block
            v = np.empty(k.shape[:-1] + (0,), k.dtype)
        n_q, d_k = q.shape[-2:]
        n_k = k.shape[-2]
        named = [(qname, q, 2), ("k", k, 2), ("v", v, 2)]
        arrays = [q, k, v]
        if tau is not None:
            tau = real_array("tau", tau)
            if tau.ndim < 1 or tau.shape[-1] not in (n_q, 1):
                raise ValueError(f"tau must have shape (..., n_q) with n_q = {n_q} (from {qname}), got {tau.shape}")
            check_nonempty("tau", tau, "(..., n_q)")
            if tau.shape[-1] == 1 and n_q != 1:
                tau = np.broadcast_to(tau, tau.shape[:-1] + (n_q,))
            named.append(("tau", tau, 1))
            arrays.append(tau)
        self.dtype = compute_dtype(*arrays)
        if finite:
            for name, a, _ in named:
                check_finite(name, a)
        self.mask_kind = None
        if mask is not None:
            mask = real_array("mask", mask, allow_bool=True)
            check_nonempty("mask", mask, "broadcastable to (..., n_q, n_k)")
            if mask.ndim < 2:
                mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
            if mask.shape[-2] not in (1, n_q) or mask.shape[-1] not in (1, n_k):
                raise ValueError(
                    f"mask must be broadcastable to (..., n_q, n_k) = (..., {n_q}, {n_k}), got {mask.shape}")
            if mask.dtype.kind == "b":
                self.mask_kind = "keep"
            else:
                if np.any(np.isnan(mask)) or np.any(mask == np.inf):
                    raise ValueError("mask (additive) must not contain NaN or +inf; use -inf to hide a key")
                self.mask_kind = "bias"
            named.append(("mask", mask, 2))
        self.batch_shape = broadcast_batch(named)
        dtypes = [self.dtype] * len(named)
        if self.mask_kind == "keep":
            dtypes[-1] = np.uint8
        ops = batch_operands(self.batch_shape, [a for _, a, _ in named], [c for _, _, c in named], dtypes)
        self.q, self.k, self.v = ops[:3]
        self.tau = ops[3] if tau is not None else None
        self.mask = ops[-1] if mask is not None else None
        self.batch = int(np.prod(self.batch_shape, dtype=np.int64))
        self.n_q, self.n_k, self.d_k, self.d_v = n_q, n_k, d_k, v.shape[-1]
        self.causal = causal_code(causal)

    def core_args(self) -> dict:
        """The first argument of the core's attention kernels (``AttentionArgs`` in
        cpp/bindings/arrays.hpp): q (or the tilts u), k, v and the radii tau over the flat batch
        with their batch indices, the mask (keep or additive bias) and the causal code."""
        mask = None if self.mask is None else self.mask.array
        tau = self.tau
        return {"batch": self.batch, "q": self.q.array, "q_index": self.q.index,
                "k": self.k.array, "k_index": self.k.index, "v": self.v.array, "v_index": self.v.index,
                "tau": None if tau is None else tau.array, "tau_index": None if tau is None else tau.index,
                "mask_keep": mask if self.mask_kind == "keep" else None,
                "mask_bias": mask if self.mask_kind != "keep" else None,
                "mask_index": None if self.mask is None else self.mask.index, "causal": self.causal}

    def shaped(self, a: Optional[np.ndarray], *core):
        """A core output (batch, *core) with the broadcast batch shape restored."""
        return None if a is None else a.reshape(self.batch_shape + core)

    def attention_outputs(self, y, weights, log_partition, return_weights: bool, return_log_partition: bool,
                          y_merged: bool = False):
        """y (..., n_q, d_v), or the tuple (y, [P (..., n_q, n_k)], [log Z (..., n_q)]) asked for;
        `y_merged`: y as the core wrote it with its heads merged, (batch, n_q, heads * d_v)."""
        out = (y if y_merged else self.shaped(y, self.n_q, self.d_v),)
        if return_weights:
            out += (self.shaped(weights, self.n_q, self.n_k),)
        if return_log_partition:
            out += (self.shaped(log_partition, self.n_q),)
        return out[0] if len(out) == 1 else out

    def cotangent(self, dy):
        """The output cotangent dy (..., n_q, d_v), checked, over the flat batch."""
        out = self.batch_shape + (self.n_q, self.d_v)
        return cotangent("dy", dy, out, self.dtype).reshape(self.batch, self.n_q, self.d_v)

    def saved(self, dy, y, log_partition, forward):
        """Checked (dy, y, log Z) over the flat batch; y and log Z from `forward()` (which
        returns the core's (y, weights, log Z)) unless both are given."""
        out = self.batch_shape + (self.n_q, self.d_v)
        dy = self.cotangent(dy)
        if y is None or log_partition is None:
            y, _, log_z = forward()[:3]
        else:
            y = cotangent("y", y, out, self.dtype).reshape(self.batch, self.n_q, self.d_v)
            log_z = cotangent("log_partition", log_partition, self.batch_shape + (self.n_q,), self.dtype,
                              allow_neg_inf=True).reshape(self.batch, self.n_q)
        return dy, y, log_z

    def gradients(self, dq, dk, dv, shapes):
        """Core cotangents (batch, n, d) of q, k, v reshaped to the broadcast batch and summed
        back to the inputs' `shapes` (three tuples)."""
        return (reduce_to_shape(self.shaped(dq, self.n_q, self.d_k), shapes[0]),
                reduce_to_shape(self.shaped(dk, self.n_k, self.d_k), shapes[1]),
                reduce_to_shape(self.shaped(dv, self.n_k, self.d_v), shapes[2]))



def reduce_to_shape(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient of a broadcast shape back to an operand's `shape` (NumPy broadcasting rules)."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, g.shape)) if s == 1 and t != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)
