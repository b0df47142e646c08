"""The matrix products of a forward pass, on the library's one thread budget.

A forward pass alternates NumPy products (projections, MLP, unembedding) with the core's
OpenMP kernels (attention). NumPy's BLAS keeps its own worker threads, which spin for tens of
milliseconds after each product before they sleep (OpenBLAS: 2^28 cycles unless
OPENBLAS_THREAD_TIMEOUT was set before NumPy was imported); on a few cores they take the
cores the attention kernel's threads need, which then runs 2-4x slower. Inside
:func:`product_threads` NumPy's BLAS runs on one thread (it starts no workers) and
:func:`product` splits a product's rows into :func:`attngeom.get_num_threads` contiguous
blocks computed by a pool of Python threads (NumPy releases the GIL in a product), which
sleep when idle. So :func:`attngeom.set_num_threads` sets the threads of both, and the two
never compete.

The blocks are set by the number of processors the process may run on, not by the thread
count, so a product gives the same bits at any thread count (the pool only distributes the
same block products; tested bitwise).
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._config import blas_controller, get_num_threads

#: Blocks have at least this many rows (fewer rows: one product on the calling thread).
MIN_ROWS_PER_BLOCK = 32


def _processors() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity masks
        return os.cpu_count() or 1

_pool = None
_pool_size = 0
_pool_lock = threading.Lock()


def _workers(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix="attngeom-product"), n
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


def product(x: np.ndarray, W) -> np.ndarray:
    """x @ W with the rows of x split over the thread budget (module docstring).

    Parameters
    ----------
    x : ndarray, shape (..., k)
        The left factor (float32 or float64).
    W : ndarray, shape (k, m)
        The right factor, x's dtype.

    Returns
    -------
    ndarray, shape (..., m)
        x @ W, bitwise as NumPy's single-thread product.

    Examples
    --------
    >>> from attngeom.models.products import product
    >>> product(np.ones((4, 3)), np.ones((3, 2))).tolist()
    [[3.0, 3.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
    """
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    blocks = min(_processors(), rows // MIN_ROWS_PER_BLOCK)
    if blocks <= 1:
        return x @ W
    out = np.empty((rows, W.shape[-1]), np.result_type(x, W))
    edges = np.linspace(0, rows, blocks + 1).astype(int)

    def block(i):
        np.matmul(flat[edges[i]:edges[i + 1]], W, out=out[edges[i]:edges[i + 1]])

    threads = min(get_num_threads(), blocks)
    if threads == 1:
        for i in range(blocks):
            block(i)
    else:
        for _ in _workers(threads).map(block, range(blocks)):  # re-raises a block's exception
            pass
    return out.reshape(x.shape[:-1] + (W.shape[-1],))
