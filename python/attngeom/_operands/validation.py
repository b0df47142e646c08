"""Array and scalar arguments checked into operands: every error names the argument, the
expected shape or values and those received, in one wording."""
from __future__ import annotations

import math
import numbers
from typing import Optional

import numpy as np

from .. import _core
from ..errors import NonFiniteOperand

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
    """x as a real ndarray (no dtype change yet, except that bfloat16 is widened exactly to
    float32); TypeError for complex, object, string input."""
    hint = _foreign_dtype_hint(name, x)
    if hint is not None:
        raise TypeError(hint)
    a = as_array(name, x, "a real array")
    if a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16, NumPy's bfloat16 (exact in float32)
        return a.astype(np.float32)
    if a.dtype.kind == "b" and allow_bool:
        return a
    if a.dtype.kind not in _FLOAT_KINDS:
        raise TypeError(f"{name} must be a real floating or integer array, got dtype {a.dtype}")
    return a


def shape_of(name: str, x) -> tuple:
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


# Entries from which the core's finite check (one parallel pass, no temporary) is used; below
# it NumPy's isfinite pass costs no more than the call.
_CORE_CHECK_SIZE = 1 << 16


def all_finite(a) -> bool:
    """Whether every entry of `a` is finite. A C-contiguous float32 or float64 array of at least
    _CORE_CHECK_SIZE entries is checked by the core in one parallel pass with no temporary;
    anything else by NumPy (np.isfinite's boolean array)."""
    if (isinstance(a, np.ndarray) and a.size >= _CORE_CHECK_SIZE and a.flags.c_contiguous
            and a.dtype in (np.dtype(np.float32), np.dtype(np.float64))):
        return _core.all_finite(a)
    return bool(np.all(np.isfinite(a)))


def check_finite(name: str, a) -> None:
    if not all_finite(a):
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


def scalar(name: str, x, *, positive: bool = False, nonnegative: bool = False,
           allow_none: bool = False) -> Optional[float]:
    """A finite real scalar (strictly positive, or >= 0, when asked)."""
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
    if nonnegative and x < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


def logit_scale(scale, d_k: int, *, positive: bool = False) -> float:
    """The logit scale: `scale` checked, or 1 / sqrt(d_k) by default (d_k >= 1 then)."""
    if scale is not None:
        return scalar("scale", scale, positive=positive)
    if d_k < 1:
        raise ValueError("q and k have d_k = 0 features: the default scale 1 / sqrt(d_k) needs d_k >= 1")
    return 1.0 / math.sqrt(d_k)


def count(name: str, value, minimum: int = 1, maximum: Optional[int] = None, *, allow_none: bool = False,
          type_error: bool = False, bound: Optional[str] = None) -> Optional[int]:
    """An integer argument in [minimum, maximum] (bool is not an integer here; neither is a
    float, even inf or 3.0); None too with allow_none. A ValueError otherwise, or a TypeError
    with type_error where the value is not an integer at all. `bound` is the message's range
    where it says where the maximum comes from (e.g. "in [1, n_experts = 8]")."""
    if value is None and allow_none:
        return None
    bound = bound or (f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}")
    not_int = isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
    if not_int or value < minimum or (maximum is not None and value > maximum):
        raise (TypeError if not_int and type_error else ValueError)(f"{name} must be an integer {bound}, got {value!r}")
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


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int, note: str = "") -> None:
    """Refuse integer token ids outside the vocabulary 0..vocab_size - 1, naming the argument
    (`note`, e.g. " (config.json vocab_size 97)", follows the range in the message)."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name} must lie in 0..{vocab_size - 1}{note}, got {ids.min()}..{ids.max()}")


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
    return scalar("rtol", rtol, nonnegative=True, allow_none=True)


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


def query_key_value(q, k, v, *, qname: str = "q", width: str = "d_k", finite: bool = True,
                    v_optional: bool = True) -> tuple:
    """Checked queries (..., n_q, d_k), keys (..., n_k, d_k) and values (..., n_k, d_v) (v may
    be None unless v_optional is False: then None is refused like any non-array, TypeError
    naming v), dtypes kept: the keys share the queries' width, the values the keys' count."""
    q = operand(qname, q, f"(..., n_q, {width})", dtype=None, finite=finite)
    k = operand("k", k, f"(..., n_k, {width})", dtype=None, finite=finite)
    if v is not None or not v_optional:
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
