"""The private operand layer: how arguments become checked operands of the C++ core.

Every public module checks its arguments here, so that every error names the argument, the
expected shape and the one received (DESIGN "Errors"), in one wording:

* :func:`operand` turns an array argument into a real ndarray in one pass: real ->
  number of axes -> non-empty -> finite -> computation dtype. The expected-shape string,
  e.g. ``"(..., n_q, d_k)"``, is both the message and the rule for the number of axes.
* :func:`scalar`, :func:`count`, :func:`rtol_arg`, :func:`causal_code` check scalar
  arguments.
* :class:`AttentionOperands` checks and broadcasts the (q, k, v, tau, mask) operands of one
  attention-like call; its ``cotangent``, ``saved`` and ``gradients`` serve the backward
  passes, with :func:`cotangent` (a checked cotangent or saved forward output) and
  :func:`reduce_to_shape` (a gradient summed back over broadcast axes).
* :func:`to_bhnd` and :func:`from_bhnd` are the activation layouts: every function taking
  per-head q / k / v converts "bnhd" (..., n, heads, d) operands to the library's "bhnd"
  (..., heads, n, d) with the first and its results back with the second; without a layout
  argument :func:`looks_token_major` decides whether to warn (:class:`LayoutWarning`).

Conventions (see the package docstring): tokens are rows, the last one or two axes are
the core axes, every leading axis is a batch axis that broadcasts like NumPy. The core
works on contiguous (blocks, rows, cols) stacks; broadcasting reaches it as an index array
mapping each flat batch position to the operand's own block, so no operand is copied to
broadcast it. An operand is copied once only when it is not C-contiguous or not of the
computation dtype.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

_FLOAT_KINDS = "fiu"


def _foreign_dtype_hint(name: str, x) -> Optional[str]:
    """A hint for array types NumPy cannot read, found without importing their library.

    A torch bfloat16 (or other NumPy-less) tensor makes ``np.asarray`` fail with "Got
    unsupported ScalarType BFloat16"; the user should convert it to float32 first.
    """
    module = type(x).__module__ or ""
    dtype = str(getattr(x, "dtype", ""))
    if module.split(".")[0] == "torch" and "bfloat16" in dtype:
        return (f"{name} is a torch bfloat16 tensor, which NumPy cannot read; pass {name}.float() "
                f"(float32) instead")
    return None


def as_array(name: str, x, what: str = "an array") -> np.ndarray:
    """np.asarray(x), or a TypeError naming the argument where NumPy cannot make one array of
    it (ragged lists and the like)."""
    try:
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{name} must be {what}, got {type(x).__name__}: {exc}") from None


def real_array(name: str, x, *, allow_bool: bool = False) -> np.ndarray:
    """x as a real ndarray (no dtype change yet); TypeError for complex, object, string input."""
    hint = _foreign_dtype_hint(name, x)
    if hint is not None:
        raise TypeError(hint)
    a = as_array(name, x, "a real array")
    if a.dtype.kind == "b" and allow_bool:
        return a
    if a.dtype.kind not in _FLOAT_KINDS:
        raise TypeError(f"{name} must be a real floating or integer array, got dtype {a.dtype}")
    return a


def _shape(name: str, x) -> tuple:
    """np.shape(x), or real_array's error naming the argument (a ragged list has no shape)."""
    try:
        return np.shape(x)
    except ValueError:
        real_array(name, x)
        raise


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """float32 if every operand is float32 (or float16), else float64 (integers become float64)."""
    if arrays and all(a.dtype in (np.float32, np.float16) for a in arrays):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def check_finite(name: str, a) -> None:
    if not np.all(np.isfinite(a)):
        raise NonFiniteOperand(f"{name} contains NaN or infinite values")


def check_nonempty(name: str, a: np.ndarray, expected: str) -> None:
    if a.size == 0:
        raise ValueError(f"{name} must be non-empty with shape {expected}, got {a.shape}")


def check_min_ndim(name: str, a: np.ndarray, ndim: int, expected: str) -> None:
    if a.ndim < ndim:
        raise ValueError(f"{name} must have shape {expected} (at least {ndim} dimensions), got {a.shape}")


def _axes_rule(expected: str) -> tuple:
    """(ndim, min_ndim) read from an expected-shape string: "(m, n)" -> exactly 2 axes,
    "(..., n, d)" -> at least 2; anything else (e.g. "broadcastable to ...") -> no rule."""
    text = expected.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return None, None
    parts = [p.strip() for p in text[1:-1].split(",") if p.strip()]
    if "..." in parts:
        return None, len(parts) - 1
    return len(parts), None


COMPUTE = "compute"  # operand(dtype=COMPUTE): float32 stays float32 (float16 too), else float64


def operand(name: str, x, expected: str, *, ndim: Optional[int] = None, min_ndim: Optional[int] = None,
            dtype=COMPUTE, nonempty: bool = True, finite: bool = True, contiguous: bool = False) -> np.ndarray:
    """The checked array argument `name`: real -> axes -> non-empty -> finite -> dtype.

    expected : the shape in the message, e.g. "(..., n_q, d_k)"; unless ndim / min_ndim are
        given it also sets the rule: "(m, n)" needs exactly 2 axes, "(..., n, d)" at least 2.
    dtype : COMPUTE (float32 for float32 / float16 input, float64 otherwise), a dtype, or
        None to keep the input's dtype.
    contiguous : return a C-contiguous array.
    """
    a = real_array(name, x)
    if ndim is None and min_ndim is None:
        ndim, min_ndim = _axes_rule(expected)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have shape {expected}, got {a.shape}")
    if min_ndim is not None:
        check_min_ndim(name, a, min_ndim, expected)
    if nonempty:
        check_nonempty(name, a, expected)
    if finite:
        check_finite(name, a)
    if dtype is COMPUTE:
        dtype = compute_dtype(a)
    if contiguous:
        return np.ascontiguousarray(a, dtype=dtype)
    return a if dtype is None else a.astype(dtype, copy=False)


def scalar(name: str, x, *, positive: bool = False, allow_none: bool = False) -> Optional[float]:
    """A finite real scalar (strictly positive when asked)."""
    if x is None and allow_none:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, np.floating, np.integer)):
        if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in _FLOAT_KINDS:
            x = x.item()
        else:
            raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return x


def logit_scale(scale, d_k: int, *, positive: bool = False) -> float:
    """The logit scale: `scale` checked, or 1 / sqrt(d_k) by default (d_k >= 1 then)."""
    if scale is not None:
        return scalar("scale", scale, positive=positive)
    if d_k < 1:
        raise ValueError("q and k have d_k = 0 features: the default scale 1 / sqrt(d_k) needs d_k >= 1")
    return 1.0 / math.sqrt(d_k)


def count(name: str, value, minimum: int = 1, maximum: Optional[int] = None) -> int:
    """An integer argument in [minimum, maximum] (bool is not an integer here; neither is a
    float, even inf or 3.0)."""
    bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum
            or (maximum is not None and value > maximum)):
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def choice(name: str, value, options, expected: Optional[str] = None):
    """`value` when it is one of `options` (strings, None); a ValueError naming the argument
    otherwise, an array or another unhashable value included. `expected` is the message's
    text after "must be" (default: "one of <options>")."""
    if isinstance(value, (str, type(None))) and value in options:
        return value
    text = f"{name} must be {expected or f'one of {tuple(options)}'}, got {value!r}"
    raise ValueError(text if len(text) <= 300 else text[:300] + "...")


def flag(name: str, value) -> bool:
    """A True / False argument (NumPy's bool too); TypeError naming it otherwise (an array's
    truth value is ambiguous, and 0 / 1 are not read as flags)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}"[:200])
    return bool(value)


def sequence(name: str, value, *, length: Optional[int] = None, nonempty: bool = True) -> list:
    """A list or tuple argument (of matrices, layers, ...), as a list; TypeError naming the
    argument otherwise, ValueError when empty or of the wrong length."""
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        value = list(value)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list or tuple, got {type(value).__name__}")
    if nonempty and len(value) == 0:
        raise ValueError(f"{name} must not be empty")
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must hold {length} items, got {len(value)}")
    return list(value)


#: The largest array a call may allocate (16 GiB): sizes beyond it are refused before any
#: allocation, naming the argument, instead of a MemoryError or a swap storm.
MAX_ARRAY_BYTES = 2 ** 34


def check_size(names: str, elements, itemsize: int = 8) -> None:
    """Refuse a call whose array of `elements` entries (named by the arguments `names` that
    set its size) would exceed MAX_ARRAY_BYTES. Python integers: no overflow."""
    total = int(elements) * int(itemsize)
    if total > MAX_ARRAY_BYTES:
        raise ValueError(f"{names} ask for an array of {total / 2 ** 30:.3g} GiB, beyond the limit of "
                         f"{MAX_ARRAY_BYTES / 2 ** 30:.0f} GiB")


def generator(seed, name: str = "seed") -> np.random.Generator:
    """A NumPy Generator from a seed: None, an integer >= 0, a SeedSequence or a Generator."""
    if seed is None or isinstance(seed, (np.random.Generator, np.random.SeedSequence)):
        return np.random.default_rng(seed)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= 0, None, a SeedSequence or a Generator, got "
                        f"{type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"{name} must be >= 0, got {seed}")
    return np.random.default_rng(int(seed))


def float_dtype(name: str, dtype) -> np.dtype:
    """A dtype argument naming float32 or float64 (a type, a np.dtype or its name)."""
    try:
        dt = np.dtype(dtype) if isinstance(dtype, (type, np.dtype, str)) else None
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{name} must be float32 or float64, got {dtype!r}")
    return dt


def rtol_arg(rtol) -> Optional[float]:
    """The rank tolerance of every rank decision: None (the matrix_rank rule) or a float >= 0."""
    if rtol is None:
        return None
    rtol = scalar("rtol", rtol)
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    return rtol


_CAUSAL = {None: 0, False: 0, True: 1, "top_left": 1, "bottom_right": 2}


def causal_code(causal) -> int:
    """The core's code for a causal argument: 0 none, 1 top-left, 2 bottom-right."""
    try:
        return _CAUSAL[causal]
    except (KeyError, TypeError):
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}") from None


def uniform_grid(name: str, tau, minimum: int = 3) -> tuple:
    """A uniformly spaced real or purely imaginary 1-D grid: (grid as complex128, step, kind)
    with kind "real" or "imaginary"."""
    t = as_array(name, tau, "a real or complex array")
    if t.dtype.kind not in "fiuc":
        raise TypeError(f"{name} must be a real or complex array, got dtype {t.dtype}")
    if t.ndim != 1 or t.size < minimum:
        raise ValueError(f"{name} must have shape (N,) with N >= {minimum} samples, got {t.shape}")
    check_finite(name, t)
    # Spacing checked to the grid's own precision: a float32 linspace is uniform to its ulps.
    tol = max(1e-9, 16 * float(np.finfo(t.dtype).eps)) if t.dtype.kind in "fc" else 1e-9
    t = t.astype(np.complex128)
    step = t[1] - t[0]
    if step == 0 or np.max(np.abs(np.diff(t) - step)) > tol * max(abs(step), np.max(np.abs(t))):
        raise ValueError(f"{name} must be uniformly spaced")
    if np.all(t.imag == 0):
        kind = "real"
    elif np.all(t.real == 0):
        kind = "imaginary"
    else:
        raise ValueError(f"{name} must be real or purely imaginary (uniformly spaced on a line through 0)")
    return t, step, kind


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

    def mask_args(self):
        """(keep, bias, index) as the core takes them."""
        if self.mask is None:
            return None, None, None
        if self.mask_kind == "keep":
            return self.mask.array, None, self.mask.index
        return None, self.mask.array, self.mask.index

    def shaped(self, a: Optional[np.ndarray], *core):
        """A core output (batch, *core) with the broadcast batch shape restored."""
        return None if a is None else a.reshape(self.batch_shape + core)

    def attention_outputs(self, y, weights, log_partition, return_weights: bool, return_log_partition: bool):
        """y (..., n_q, d_v), or the tuple (y, [P (..., n_q, n_k)], [log Z (..., n_q)]) asked for."""
        out = (self.shaped(y, self.n_q, self.d_v),)
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


def cotangent(name: str, x, shape: tuple, dtype, *, allow_neg_inf: bool = False) -> np.ndarray:
    """A cotangent or saved forward output of a backward pass, as a C-contiguous array of `dtype`.

    ValueError names the argument for a non-real dtype, a shape other than `shape`, or NaN / inf
    values (-inf allowed with allow_neg_inf: the log-partition of a fully masked row).
    """
    try:
        a = np.asarray(x)
    except Exception as exc:
        raise ValueError(f"{name} must be a real array of shape {shape}, got {type(x).__name__}: {exc}") from None
    if a.dtype.kind not in _FLOAT_KINDS:
        raise ValueError(f"{name} must be a real floating array of shape {shape}, got dtype {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    bad = np.isnan(a) | (a == np.inf) if allow_neg_inf else ~np.isfinite(a)
    if np.any(bad):
        raise ValueError(f"{name} contains NaN or infinite values")
    return np.ascontiguousarray(a, dtype=dtype)


def reduce_to_shape(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a gradient of a broadcast shape back to an operand's `shape` (NumPy broadcasting rules)."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, g.shape)) if s == 1 and t != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def query_key_value(q, k, v, *, qname: str = "q", width: str = "d_k", finite: bool = True) -> tuple:
    """Checked queries (..., n_q, d_k), keys (..., n_k, d_k) and values (..., n_k, d_v) (v may
    be None), dtypes kept: the keys share the queries' width, the values the keys' count."""
    q = operand(qname, q, f"(..., n_q, {width})", dtype=None, finite=finite)
    k = operand("k", k, f"(..., n_k, {width})", dtype=None, finite=finite)
    if v is not None:
        v = operand("v", v, "(..., n_k, d_v)", dtype=None, finite=finite)
    check_shared_width(qname, q, "k", k, width)
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have shape (..., n_k, d_v) with n_k = {k.shape[-2]} (from k), got {v.shape}")
    return q, k, v


def check_shared_width(qname: str, q: np.ndarray, kname: str, k: np.ndarray, width: str = "d_k") -> None:
    """Queries (..., n_q, d_k) and keys (..., n_k, d_k) must share their last axis.

    The message blames the argument whose shape is wrong: the keys, unless the queries look
    transposed (their row count equals the keys' width), then the queries."""
    d_q, d_k = q.shape[-1], k.shape[-1]
    if d_q == d_k:
        return
    if q.ndim >= 2 and q.shape[-2] == d_k:
        raise ValueError(f"{qname} must have shape (..., n_q, {width}) with {width} = {d_k} (from {kname}), got "
                         f"{q.shape}: is {qname} transposed?")
    raise ValueError(f"{kname} must have shape (..., n_k, {width}) with {width} = {d_q} (from {qname}), "
                     f"got {k.shape}")


def renamed_arguments(**renames):
    """Decorator: keyword arguments renamed in this release are still accepted under their
    old names for one release, with a DeprecationWarning naming the new one.

    ``@renamed_arguments(P="routing")`` lets ``f(P=x)`` mean ``f(routing=x)``."""

    def wrap(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{func.__name__}() got both {old!r} (deprecated) and {new!r}")
                    warnings.warn(f"{func.__name__}(): the argument {old!r} is deprecated, use {new!r}",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return inner

    return wrap


def max_row_norm(a: np.ndarray) -> float:
    """Largest Euclidean norm along the last axis of `a`, in float64 and overflow-safe (the
    entries are divided by the largest one before squaring); 0 for an empty array."""
    if a.size == 0:
        return 0.0
    big = float(np.max(np.abs(a)))
    if big == 0.0 or not math.isfinite(big):
        return big
    return big * float(np.max(np.linalg.norm(a / big, axis=-1)))


def check_bound(bound: float, dtype, what: str, fix: str) -> None:
    """Refuse an input for which `what`, bounded above by `bound`, may overflow `dtype`.

    The same rule as the core's check_bound (types.hpp): a quantity a kernel computes that
    the float type cannot represent is a ValueError saying what overflows and what to change,
    never a NaN or an answer as if the overflowing terms were absent."""
    limit = float(np.finfo(dtype).max)
    if not bound <= limit:
        raise ValueError(f"{what} may reach {bound:.3g}, beyond the float range ({limit:.3g}): {fix}")


def _finite_values(obj) -> bool:
    """Whether every floating value in a result (arrays, scalars, tuples, named tuples,
    dataclasses, lists) is finite; other values (ints, strings, None, objects) count as finite."""
    if isinstance(obj, np.ndarray):
        return not np.issubdtype(obj.dtype, np.inexact) or bool(np.all(np.isfinite(obj)))
    if isinstance(obj, (float, complex, np.inexact)):
        return bool(np.isfinite(obj))
    if isinstance(obj, (tuple, list)):
        return all(_finite_values(o) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return all(_finite_values(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return True


def _largest(value) -> float:
    """Largest magnitude among the floating values of an argument (inf when one is not
    finite, 0 when it holds none)."""
    if isinstance(value, (tuple, list)):
        return max((_largest(v) for v in value), default=0.0)
    try:
        arr = np.asarray(value)
    except Exception:  # an object NumPy cannot take is not a numeric input
        return 0.0
    if not arr.size or not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_):
        return 0.0
    with np.errstate(invalid="ignore"):
        m = float(np.max(np.abs(arr)))
    return m if m == m else math.inf


class ResultOverflow(ValueError):
    """A public function's result (or an intermediate operand) is beyond the float range for
    finite inputs; the message names the argument with the largest entries."""


class NonFiniteOperand(ValueError):
    """An operand holds NaN or inf (raised by check_finite, and by the core's own checks)."""


def finite_result(func=None, *, name=None):
    """Decorator for a public function whose result can overflow: when the inputs are finite
    and the result is not (a product or sum beyond the float range, or an operand computed on
    the way), raise ResultOverflow (a ValueError) naming the argument with the largest
    entries, instead of returning inf or NaN. Costs one pass over the result. `name` is the
    function the messages name (default: the decorated one's), for a private function that
    computes a public one's result."""
    if func is None:
        return functools.partial(finite_result, name=name)
    signature = inspect.signature(func)
    label = name or func.__name__

    def culprit(args, kwargs):
        """(name, largest entry) of the argument with the largest entries, or None when an
        argument itself is not finite (then the function's own checks apply)."""
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None
        sizes = {name: _largest(value) for name, value in bound.arguments.items()}
        if not sizes or not all(math.isfinite(v) for v in sizes.values()):
            return None
        return max(sizes.items(), key=lambda item: item[1])

    def refuse(found, cause):
        name, big = found
        raise ResultOverflow(f"{label}: {cause} for these inputs: {name} has entries up to {big:.3g} "
                             f"(overflow, or a degenerate input); rescale it") from None

    @functools.wraps(func)
    def inner(*args, **kwargs):
        try:
            # NumPy's overflow warnings would only repeat what the refusal below says.
            with np.errstate(over="ignore", invalid="ignore"):
                out = func(*args, **kwargs)
        except (ResultOverflow, NonFiniteOperand, np.linalg.LinAlgError) as e:
            found = culprit(args, kwargs)
            if found is None:
                raise
            if isinstance(e, np.linalg.LinAlgError):
                refuse(found, f"a decomposition failed ({e})")
            refuse(found, "an intermediate result is beyond the float range" if isinstance(e, NonFiniteOperand)
                   else "the result is beyond the float range")
        if _finite_values(out):
            return out
        found = culprit(args, kwargs)
        if found is None:
            return out
        refuse(found, "the result is not finite")

    return inner


# -- activation layouts ------------------------------------------------------------------
#: The layouts of per-head activations: "bhnd" (..., heads, n, d), the library's, tokens are
#: the rows of each head; "bnhd" (..., n, heads, d), TransformerLens ``hook_q`` / ``hook_k`` /
#: ``hook_v`` / ``hook_z`` and Hugging Face's (batch, pos, head, d_head) before the transpose.
ACTIVATION_LAYOUTS = ("bhnd", "bnhd")

# What "bnhd" does to each kind of array, as the pair of axes it swaps with respect to "bhnd":
# "v" per-token vectors (..., n, d) per head (q, k, v, y, dy, gradients, tilts);
# "s" per-token scalars (..., n) per head (tau, log Z);
# "m" per-token matrices (..., n, d, d) per head (Hessians);
# "-" arrays over pairs of tokens (routing matrices, masks, projected coordinates): unchanged.
_SWAPS = {"v": (-3, -2), "s": (-2, -1), "m": (-4, -3)}
_KIND_SHAPES = {"v": "(..., n, heads, d)", "s": "(..., n, heads)", "m": "(..., n, heads, d, d)"}


class LayoutWarning(UserWarning):
    """4-D activations that look like (batch, pos, head, d_head) were passed without a layout
    argument and are read as (batch, heads, n, d)."""


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside this package, for warnings that should point
    at the user's line whatever the depth of decorators and internal calls."""
    import sys
    frame, level = sys._getframe(1), 1
    package = __name__.rsplit(".", 1)[0]
    while frame is not None and (frame.f_globals.get("__name__", "") + ".").startswith(package + "."):
        frame, level = frame.f_back, level + 1
    return level


def looks_token_major(q_shape: tuple, *others: tuple) -> bool:
    """Whether 4-D queries (and keys, values) look like (batch, pos, head, d_head).

    The rule: q and every other operand given (k, v) have 4 axes; q's third axis is shorter
    than its second (read as "bhnd" that would be fewer tokens than heads; read as "bnhd",
    fewer heads than tokens); every other operand has q's second axis (the tokens of
    self-attention, or the heads in "bhnd") and a third axis that divides q's (its key/value
    heads: grouped-query attention, or equal). So (2, 8, 1024, 64) is not flagged and
    (1, 128, 12, 64) is; a "bhnd" batch of sequences shorter than their head count, e.g.
    (2, 12, 5, 64), is flagged too (pass layout="bhnd" to say so).
    """
    if len(q_shape) != 4 or any(len(s) != 4 for s in others):
        return False
    if not q_shape[2] < q_shape[1]:
        return False
    return all(s[1] == q_shape[1] and s[2] >= 1 and q_shape[2] % s[2] == 0 for s in others)


def to_bhnd(layout, func: str, operands: Sequence[tuple]) -> tuple:
    """Per-head activations in the library's layout: (layout, [arrays]).

    The helper every function taking q / k / v calls first (:func:`from_bhnd` restores its
    results).

    Parameters
    ----------
    layout : {None, "bhnd", "bnhd"}
        None is "bhnd", checked by :func:`looks_token_major` on the first operands of kind
        "v" (queries, keys, values): when they look like (batch, pos, head, d_head) a
        :class:`LayoutWarning` says so. An explicit "bhnd" is never checked.
    func : str
        The public function's name, for the messages.
    operands : sequence of (name, value, kind)
        kind "v", "s", "m" or "-" (see ``_SWAPS``); a None value passes through. With
        "bnhd", each array's (n, heads) axes are swapped to (heads, n) and made contiguous
        (the one copy the core makes of a non-contiguous operand anyway), so the call
        computes exactly what it computes on the same values given in "bhnd".

    Returns
    -------
    layout : str
        "bhnd" or "bnhd", for :func:`from_bhnd`.
    arrays : list
        The operands in "bhnd" (unchanged for "bhnd").

    Raises
    ------
    ValueError
        Naming ``layout`` for a value other than the two, and naming the operand when a
        "bnhd" operand has too few axes to hold both n and heads.
    """
    if layout is not None and (not isinstance(layout, str) or layout not in ACTIVATION_LAYOUTS):
        raise ValueError(f"{func}: layout must be 'bhnd' (..., heads, n, d) or 'bnhd' (..., n, heads, d), "
                         f"got {layout!r}")
    if layout is None:
        shapes = [_shape(name, x) for name, x, kind in operands if kind == "v" and x is not None][:3]
        if shapes and looks_token_major(*shapes):
            name = next(n for n, x, kind in operands if kind == "v" and x is not None)
            warnings.warn(f"{func}: {name} has shape {shapes[0]}, which looks like (batch, pos, head, d_head) "
                          f"(TransformerLens hook_q, Hugging Face before the transpose) but is read as "
                          f"(batch, heads, n, d); pass layout='bnhd' for the former, layout='bhnd' to keep "
                          f"this reading without the warning", LayoutWarning, stacklevel=_caller_stacklevel())
        layout = "bhnd"
    if layout == "bhnd":
        return layout, [x for _, x, _ in operands]
    out = []
    for name, x, kind in operands:
        if x is None or kind == "-":
            out.append(x)
            continue
        a = real_array(name, x)
        axes = _SWAPS[kind]
        if a.ndim < -axes[0]:
            raise ValueError(f"{func}: with layout='bnhd', {name} must have shape {_KIND_SHAPES[kind]} "
                             f"(at least {-axes[0]} dimensions), got {a.shape}")
        out.append(np.ascontiguousarray(np.swapaxes(a, *axes)))  # the copy the core would make anyway
    return layout, out


def from_bhnd(layout: str, result, kinds: str):
    """A result of a function that took per-head activations, back in the caller's `layout`.

    result : an array (``kinds`` one letter), or a tuple / named tuple with one letter of
    ``kinds`` per item ("v", "s", "m", "-" as in :func:`to_bhnd`; None items pass through).
    "bnhd" results are views of the computed "bhnd" arrays with the axes swapped.
    """
    if layout == "bhnd":
        return result

    def swap(a, kind):
        return a if a is None or kind == "-" else np.swapaxes(a, *_SWAPS[kind])

    if isinstance(result, tuple):
        items = [swap(a, kind) for a, kind in zip(result, kinds)]
        return type(result)(*items) if hasattr(result, "_fields") else tuple(items)
    return swap(result, kinds)


def attention_kinds(return_weights: bool, return_log_partition: bool) -> str:
    """The kinds (for :func:`from_bhnd`) of an attention call's result (y, [P], [log Z])."""
    return "v" + ("-" if return_weights else "") + ("s" if return_log_partition else "")
