"""The matrix products of a forward pass, on the library's one thread budget.

A forward pass alternates products (projections, MLP, unembedding) with the core's OpenMP
kernels (attention). :func:`product` splits a product's rows into contiguous blocks computed
by a pool of Python threads of :func:`attngeom.get_num_threads` (the core and NumPy release
the GIL in a product), which sleep when idle; each block is one single-thread product
(:func:`block_product`): the core's GEMM (Eigen's kernels for the CPU's instruction-set
level, ahead of NumPy's OpenBLAS where that runs its AVX2 kernels, as on AMD Zen 4 and 5),
or NumPy's for a single row. NumPy's BLAS keeps its own worker threads, which spin for tens
of milliseconds after each product before they sleep (OpenBLAS: 2^28 cycles unless
OPENBLAS_THREAD_TIMEOUT was set before NumPy was imported); on a few cores they take the
cores the attention kernel's threads need, which then runs 2-4x slower. Inside
:func:`product_threads` NumPy's BLAS runs on one thread (it starts no workers). So
:func:`attngeom.set_num_threads` sets the threads of both, and the two never compete.

The blocks are set by the number of processors the process may run on, not by the thread
count, so a product gives the same bits at any thread count (the pool only distributes the
same block products; tested bitwise). A linear layer's weight, stored as (out, in) rows, is
split by columns instead (:func:`column_products`): each thread then reads only its chunks
of the weight, where split by rows every thread would read all of it. Its units too follow
the processor count, not the thread count.

In the bfloat16 mode of a forward pass (``Model.forward(..., dtype="bfloat16")``) the right
factors are :class:`BFloat16Weight`: the weights' bfloat16 bits as stored, read by the
core's bfloat16 product (``x @ W`` rounds x to bfloat16 and sums in float32; AMX tiles or
AVX512_BF16 dot products where the CPU has them). That product partitions rows and columns itself on the
thread budget, and an entry of it depends on its row of x and column of W only, so it too
gives the same bits at any thread count and any split of the rows.
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from ... import _core
from ..._config import blas_controller, get_num_threads
from ..io.safetensors import BFloat16Array

#: The forward's bfloat16 compute mode (``dtype="bfloat16"``).
BFLOAT16 = "bfloat16"

#: Blocks have at least this many rows (fewer rows: one product on the calling thread).
MIN_ROWS_PER_BLOCK = 32


def _processors() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity masks
        return os.cpu_count() or 1


# One pool of the thread budget's size, replaced (never shut down under a caller) when
# ag.set_num_threads changes the budget; dropped in a forked child, whose copy has no threads.
_pool = None
_pool_size = 0
_pool_lock = threading.Lock()
_in_pool = threading.local()  # set in the pool's threads: a nested use runs inline


def _forget_pool() -> None:
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _mark():
    _in_pool.active = True


def _workers(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != n:  # the old pool finishes what it holds, then its threads exit
            _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix="attngeom-product", initializer=_mark), n
        return _pool


@contextlib.contextmanager
def product_threads():
    """Inside the block NumPy's BLAS uses one thread and :func:`product` the thread budget.

    Examples
    --------
    >>> with product_threads():  # doctest: +SKIP
    ...     y = product(x, W)
    """
    controller = blas_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):
        yield


def in_pool() -> bool:
    """Whether the calling thread is one of the pool's: the core's OpenMP calls made from it
    run on that thread alone (the pool already holds the thread budget)."""
    return getattr(_in_pool, "active", False)


def for_row_blocks(fn, rows: int, *, max_rows: Optional[int] = None) -> None:
    """Run fn(lo, hi) for contiguous blocks [lo, hi) of range(rows) on the thread budget.

    As many blocks as the processors (more when a block would exceed `max_rows` rows; one
    when there are fewer than MIN_ROWS_PER_BLOCK rows per block), computed by the pool. The
    blocks depend on the row count and the processor count only, never on the thread count,
    so a row-wise computation gives the same bits at any thread count. fn writes its rows'
    results where they belong; the first exception of a block is raised here.

    Parameters
    ----------
    fn : callable
        (lo, hi) -> None.
    rows : int
        The number of rows.
    max_rows : int, optional
        The largest block (bounds fn's temporaries).

    Examples
    --------
    >>> from attngeom.models.nn.products import for_row_blocks
    >>> out = np.zeros(100)
    >>> for_row_blocks(lambda lo, hi: out.__setitem__(slice(lo, hi), np.arange(lo, hi)), 100)
    >>> bool(np.all(out == np.arange(100)))
    True
    """
    blocks = max(1, min(_processors(), rows // MIN_ROWS_PER_BLOCK))
    if max_rows is not None:
        blocks = max(blocks, -(-rows // max_rows))
    step = rows / blocks  # the edges of np.linspace(0, rows, blocks + 1), truncated, without its cost
    edges = [int(i * step) for i in range(blocks)] + [rows]
    for_tasks(lambda i: fn(edges[i], edges[i + 1]), blocks)


def for_tasks(fn, count: int) -> None:
    """Run fn(i) for i in range(count) on the thread budget's pool.

    Inline, in order, on one thread, for one task, or when called from a pool thread (a
    nested use). What a task computes must depend on i only, never on the thread that runs
    it; then the results are the same bits at any thread count. The first exception of a
    task is raised here.

    Parameters
    ----------
    fn : callable
        i -> None, writing its results where they belong.
    count : int
        The number of tasks.

    Examples
    --------
    >>> from attngeom.models.nn.products import for_tasks
    >>> out = [0] * 4
    >>> for_tasks(lambda i: out.__setitem__(i, i * i), 4)
    >>> out
    [0, 1, 4, 9]
    """
    threads = get_num_threads()
    if threads <= 1 or count <= 1 or getattr(_in_pool, "active", False):  # nested use: inline
        for i in range(count):
            fn(i)
        return
    for _ in _workers(threads).map(fn, range(count)):
        pass  # re-raises a task's exception


def map_rows(fn, x: np.ndarray, width: int, *, max_rows: Optional[int] = None, dtype=None) -> np.ndarray:
    """fn applied to blocks of the rows of x on the thread budget (:func:`for_row_blocks`).

    Parameters
    ----------
    fn : callable
        (rows, k) -> (rows, width), applied to each block; it must treat rows independently.
    x : ndarray, shape (..., k)
        The input (its last axis holds a row's entries).
    width : int
        The width of fn's output rows.
    max_rows : int, optional
        The largest block (bounds fn's temporaries, e.g. an MLP's hidden units).
    dtype : numpy dtype, optional
        The dtype of fn's output (default x's).

    Returns
    -------
    ndarray, shape (..., width)
        fn of every row, the same at any thread count.

    Examples
    --------
    >>> from attngeom.models.nn.products import map_rows
    >>> map_rows(lambda r: 2 * r, np.arange(6.0).reshape(3, 2), 2).tolist()
    [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]
    """
    flat = x.reshape(-1, x.shape[-1])
    out = np.empty((flat.shape[0], width), x.dtype if dtype is None else dtype)

    def block(lo, hi):
        out[lo:hi] = fn(flat[lo:hi])

    for_row_blocks(block, flat.shape[0], max_rows=max_rows)
    return out.reshape(x.shape[:-1] + (width,))


#: The columns of a product unit (:func:`column_products`) start at multiples of this many:
#: whole register tiles at every instruction-set level.
COLUMN_ALIGN = 64


def column_units(widths, processors: Optional[int] = None) -> list:
    """The units (product, first column, end column) that :func:`column_products` splits
    products of these output widths into: chunks of one width, a multiple of COLUMN_ALIGN,
    about one chunk per processor over all the products together. They depend on the widths
    and the processor count only.

    Examples
    --------
    >>> from attngeom.models.nn.products import column_units
    >>> column_units([2048, 1024, 1024], processors=2)
    [(0, 0, 2048), (1, 0, 1024), (2, 0, 1024)]
    """
    processors = _processors() if processors is None else processors
    per = -(-sum(widths) // max(1, processors))
    chunk = max(COLUMN_ALIGN, -(-per // COLUMN_ALIGN) * COLUMN_ALIGN)
    return [(i, lo, min(lo + chunk, n)) for i, n in enumerate(widths) for lo in range(0, n, chunk)]


def splits_columns(x: np.ndarray, weights) -> bool:
    """Whether :func:`column_products` splits x @ W over columns for these weights: a block of
    at least MIN_ROWS_PER_BLOCK rows (fewer: one product on the calling thread), and weights
    stored as linear layers store them, (out, in) rows whose column chunks are contiguous:
    all BFloat16Weight with float32 x, or all arrays of x's dtype whose transpose is
    C-contiguous."""
    if x.ndim != 2 or x.shape[0] < MIN_ROWS_PER_BLOCK or not weights:
        return False
    if all(isinstance(W, BFloat16Weight) for W in weights):
        return x.dtype == np.float32
    return all(_core_float(W, x.dtype) and W.T.flags.c_contiguous for W in weights)


def _core_float(W, dtype) -> bool:
    """Whether the core's float GEMM takes W as a right factor for rows of this dtype."""
    return (isinstance(W, np.ndarray) and W.ndim == 2 and W.dtype == dtype and min(W.shape) > 0
            and dtype in (np.dtype(np.float32), np.dtype(np.float64)))


def column_product(x: np.ndarray, W, lo: int, hi: int, out=None) -> np.ndarray:
    """x @ W[:, lo:hi] on the calling thread, for weights :func:`splits_columns` accepts
    (x C-contiguous, float32 for a BFloat16Weight): the core's GEMM or bfloat16 product;
    `out` (rows, hi - lo), rows contiguous: written with the result (the bfloat16 product
    writes its entries there directly) and returned."""
    if isinstance(W, BFloat16Weight):
        return _core.matmul_bf16(x, W.bits[lo:hi], False, "", out)
    y = _core.matmul(x, W.T[lo:hi], True)
    if out is None:
        return y
    out[...] = y
    return out


def column_products(x: np.ndarray, weights, finish=None) -> list:
    """[x @ W for W in weights] for a block of rows x on the thread budget, the products'
    columns split into units (:func:`column_units`) that the pool computes; bfloat16 weights
    in one core call (``matmul_bf16_many``: x rounded once, its OpenMP units over every
    product's columns).

    Split by rows, every thread would read every weight (its packed copy per block of rows)
    while the threads run at once; split by columns each reads its chunks only: on AMD Zen 3, 2
    threads, 512 x 1,024 x 3,072 float32 products of 28 weights read from memory, 1.65x the
    one-thread speed split by rows against 1.83x by columns. The units depend on the widths
    and the processor count only, so the results are the same bits at any thread count. A
    bfloat16 product's entry depends on its row and column only, so it is bitwise the
    unsplit product; a float GEMM's last bits can follow the columns of its call (Eigen
    blocks the rows by the size of the call when the depth needs no blocking).

    Parameters
    ----------
    x : ndarray, shape (rows, k)
        float32 or float64 (float32 for bfloat16 weights).
    weights : sequence of ndarray or BFloat16Weight, each shape (k, n_i)
        Weights :func:`splits_columns` accepts; others are multiplied by row blocks
        (:func:`product`).
    finish : callable, optional
        finish(i, block, lo, hi) -> array: applied to each unit's result block (rows, hi -
        lo) of product i before it is stored (a bias, an activation), on the unit's thread
        (unsplit: to each whole product, lo = 0, hi = n_i).

    Returns
    -------
    list of ndarray, shapes (rows, n_i)

    Examples
    --------
    >>> from attngeom.models.nn.products import column_products
    >>> a, b = column_products(np.ones((4, 3)), [np.ones((2, 3)).T, np.ones((5, 3)).T])
    >>> a.shape, b.shape, float(b[0, 0])
    ((4, 2), (4, 5), 3.0)
    """
    if not splits_columns(x, weights):
        outs = [product(x, W) for W in weights]
        return outs if finish is None else [finish(i, o, 0, o.shape[1]) for i, o in enumerate(outs)]
    x = np.ascontiguousarray(x)
    if isinstance(weights[0], BFloat16Weight):  # one core call: x rounded once, the threads over every product's columns
        outs = _core.matmul_bf16_many(x, [W.bits for W in weights], not in_pool())
        return outs if finish is None else [finish(i, o, 0, o.shape[1]) for i, o in enumerate(outs)]
    outs = [np.empty((x.shape[0], W.shape[1]), x.dtype) for W in weights]
    units = column_units([W.shape[1] for W in weights])

    def unit(u):
        i, lo, hi = units[u]
        if finish is None:
            column_product(x, weights[i], lo, hi, out=outs[i][:, lo:hi])
        else:
            outs[i][:, lo:hi] = finish(i, column_product(x, weights[i], lo, hi), lo, hi)

    for_tasks(unit, len(units))
    return outs


def product(x: np.ndarray, W) -> np.ndarray:
    """x @ W on the thread budget, split by columns or by rows (module docstring).

    Parameters
    ----------
    x : ndarray, shape (..., k)
        The left factor (float32 or float64).
    W : ndarray or BFloat16Weight, shape (k, m)
        The right factor, x's dtype (or bfloat16 weights, whose core product partitions rows
        and columns itself).

    Returns
    -------
    ndarray, shape (..., m)
        x @ W: a linear layer's stored weight split by columns (:func:`column_products`),
        other weights by blocks of rows, each block a single-thread product (the core's GEMM,
        or NumPy's for a single row or a strided W); the same at any thread count (a row's
        last bits may depend on its block's size, which follows the processor count).

    Examples
    --------
    >>> from attngeom.models.nn.products import product
    >>> product(np.ones((4, 3)), np.ones((3, 2))).tolist()
    [[3.0, 3.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
    """
    if isinstance(W, BFloat16Weight):
        return W.__rmatmul__(x)
    if x.dtype != np.result_type(x, W):
        x = x.astype(np.result_type(x, W))
    flat = x.reshape(-1, x.shape[-1])
    if splits_columns(flat, [W]):
        return column_products(flat, [W])[0].reshape(x.shape[:-1] + (W.shape[-1],))
    return map_rows(lambda rows: block_product(rows, W), x, W.shape[-1])


def residual_sum(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """h + x, a residual stream and a block's output (..., d), by blocks of rows on the thread
    budget (an entry's sum depends on its two entries only: the same bits).

    Examples
    --------
    >>> from attngeom.models.nn.products import residual_sum
    >>> residual_sum(np.ones((2, 3)), np.full((2, 3), 2.0)).tolist()
    [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]
    """
    if h.shape != x.shape or h.dtype != x.dtype or not (h.flags.c_contiguous and x.flags.c_contiguous):
        return h + x
    out = np.empty_like(h)
    hf, xf, of = (t.reshape(-1, t.shape[-1]) for t in (h, x, out))
    for_row_blocks(lambda lo, hi: np.add(hf[lo:hi], xf[lo:hi], out=of[lo:hi]), of.shape[0])
    return out


def residual_product(h: np.ndarray, x: np.ndarray, W, out: Optional[np.ndarray] = None) -> np.ndarray:
    """h + x @ W: a residual stream h (..., n) and a layer's output, the bits of
    ``residual_sum(h, product(x, W))`` (a NaN's payload aside).

    For bfloat16 weights, float32 C-contiguous h and x's rows, the product's units add their
    blocks of h as they finish them (``matmul_bf16``'s `add`), while the blocks are in cache:
    no separate pass reads the product and h again. Other operands take the two steps.

    Parameters
    ----------
    h : ndarray, shape (..., n)
        The residual stream.
    x : ndarray, shape (..., k)
        The left factor (h's leading shape).
    W : ndarray or BFloat16Weight, shape (k, n)
    out : ndarray, optional
        A float32 (rows, n) array of contiguous rows to write into (the fused path; returned
        reshaped to h's shape).

    Returns
    -------
    ndarray, h's shape

    Examples
    --------
    >>> from attngeom.models.nn.products import BFloat16Weight, residual_product
    >>> W = BFloat16Weight.of(np.ones((2, 3), np.float32))
    >>> residual_product(np.ones((1, 3), np.float32), np.ones((1, 2), np.float32), W).tolist()
    [[3.0, 3.0, 3.0]]
    """
    k, n = W.shape
    if (isinstance(W, BFloat16Weight) and h.dtype == np.float32 and h.flags.c_contiguous
            and h.shape == x.shape[:-1] + (n,)):
        flat = np.ascontiguousarray(x.reshape(-1, k), dtype=np.float32)
        y = _core.matmul_bf16(flat, W.bits, not in_pool(), "", out, h.reshape(-1, n))
        return y.reshape(h.shape)
    y = residual_sum(h, product(x, W))
    if out is None:
        return y
    out[...] = y.reshape(out.shape)
    return out.reshape(h.shape)


#: Rows of a block from which a float product is the core's (Eigen's GEMM for the CPU's
#: instruction-set level: on AMD Zen 5 1.75x the float32 and 1.5x the float64 throughput of
#: NumPy's OpenBLAS, which runs its AVX2 kernels there); a single row (the last token's
#: logits, a decoding step) stays NumPy's matrix-vector product. The choice follows the
#: shapes only, so the bits stay the same at any thread count.
CORE_PRODUCT_ROWS = 2


def block_product(rows: np.ndarray, W) -> np.ndarray:
    """rows @ W for one block of rows on the calling thread (the forward's row blocks call it
    from the pool).

    Parameters
    ----------
    rows : ndarray, shape (r, k)
        float32 or float64.
    W : ndarray (rows' dtype) or BFloat16Weight, shape (k, m)

    Returns
    -------
    ndarray, shape (r, m)
        The core's GEMM for at least CORE_PRODUCT_ROWS rows and a W whose transpose or itself
        is C-contiguous; NumPy's product otherwise; the bfloat16 product for a BFloat16Weight.

    Examples
    --------
    >>> from attngeom.models.nn.products import block_product
    >>> block_product(np.ones((2, 3)), np.ones((3, 2))).tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    if isinstance(W, BFloat16Weight):
        return rows @ W
    if rows.ndim == 2 and rows.shape[0] >= CORE_PRODUCT_ROWS and _core_float(W, rows.dtype):
        if W.T.flags.c_contiguous:  # a linear layer's stored (out, in) weight, transposed
            return _core.matmul(np.ascontiguousarray(rows), W.T, True)
        if W.flags.c_contiguous:
            return _core.matmul(np.ascontiguousarray(rows), W, False)
    return rows @ W



def compute_dtype(dtype) -> tuple:
    """The activations' dtype of a forward's `dtype` and whether its products are bfloat16.

    Parameters
    ----------
    dtype : numpy dtype or "bfloat16"
        float32 or float64 (everything in that dtype), or "bfloat16" (also
        ``ml_dtypes.bfloat16``): products in bfloat16 with float32 sums, everything else in
        float32.

    Returns
    -------
    (numpy dtype, bool)

    Raises
    ------
    ValueError
        For any other dtype.

    Examples
    --------
    >>> from attngeom.models.nn.products import compute_dtype
    >>> compute_dtype("bfloat16")
    (dtype('float32'), True)
    """
    name = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", None)
    if isinstance(name, str) and name.lower() in ("bfloat16", "bf16"):
        return np.dtype(np.float32), True
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is not None and dt.name == "bfloat16":  # ml_dtypes.bfloat16
        return np.dtype(np.float32), True
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32, float64 or 'bfloat16', got {dtype!r}")
    return dt, False


class BFloat16Weight:
    """The right factor W (k, n) of a product, held as bfloat16 bits in (n, k) order.

    The (n, k) order is a linear layer's stored (out_features, in_features) weight: a mapped
    bfloat16 checkpoint's weight is used where it lies, without a copy. ``x @ W`` (x float,
    shape (..., k)) rounds x to bfloat16 (nearest, ties to even) and sums the exact products
    in float32 in the core (module docstring); the result is float32, shape (..., n). Each
    entry is one dot product of a row of x with a row of the bits, its sums in an order that
    depends on the shapes only: the same bits at any thread count and any split of the rows.

    Parameters
    ----------
    bits : ndarray of uint16, shape (n, k)
        C-contiguous bfloat16 bit patterns of W's transpose.

    Attributes
    ----------
    bits : ndarray of uint16, shape (n, k)
        The bits given.
    shape : (k, n), as W's.

    Examples
    --------
    >>> from attngeom.models.nn.products import BFloat16Weight
    >>> W = BFloat16Weight.of(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    >>> (np.array([[1.0, 1.0]], np.float32) @ W).tolist()
    [[4.0, 6.0]]
    """

    __slots__ = ("bits",)
    __array_ufunc__ = None  # ``ndarray @ BFloat16Weight`` defers to __rmatmul__

    def __init__(self, bits: np.ndarray):
        if not isinstance(bits, np.ndarray) or bits.dtype != np.uint16 or bits.ndim != 2 or \
                not bits.flags.c_contiguous:
            raise TypeError("the weights must be a C-contiguous 2-d uint16 ndarray (n, k) of bfloat16 bits")
        self.bits = bits

    @classmethod
    def of(cls, W) -> "BFloat16Weight":
        """W (k, n) as bfloat16 weights: a :class:`BFloat16Array` keeps its bits (a view when its
        transpose is C-contiguous, as for a linear layer's stored weight), other arrays are
        rounded to bfloat16."""
        if isinstance(W, BFloat16Array):
            return cls(np.ascontiguousarray(W.bits.T))
        return cls(_core.round_bf16(np.ascontiguousarray(np.asarray(W).T, dtype=np.float32)))

    @property
    def shape(self) -> tuple:
        return self.bits.shape[::-1]

    @property
    def ndim(self) -> int:
        return 2

    def __rmatmul__(self, x) -> np.ndarray:
        x = np.asarray(x)
        k, n = self.shape
        if x.ndim < 1 or x.shape[-1] != k:
            raise ValueError(f"x @ W: x has shape {x.shape}, W has shape {self.shape}")
        flat = np.ascontiguousarray(x.reshape(-1, k), dtype=np.float32)
        return _core.matmul_bf16(flat, self.bits, not in_pool()).reshape(x.shape[:-1] + (n,))

    def __repr__(self) -> str:
        return f"BFloat16Weight(shape={self.shape})"


def bfloat16_values(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest, ties to even), as float32 values.

    Parameters
    ----------
    x : ndarray
        Any shape, float.

    Returns
    -------
    ndarray of float32, x's shape

    Examples
    --------
    >>> from attngeom.models.nn.products import bfloat16_values
    >>> bfloat16_values(np.array([1.0 + 2.0 ** -9, 3.0])).tolist()
    [1.0, 3.0]
    """
    out = np.array(x, dtype=np.float32, order="C", copy=True)
    _core.round_bf16_values(out)
    return out
