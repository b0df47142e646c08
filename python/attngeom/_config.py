"""Version, build configuration and thread control."""
from __future__ import annotations

import operator

import numpy as np

from . import _core

__version__: str  # bound by __getattr__ on first use (an annotation only, for type checkers)


def __getattr__(name):
    # The one version is pyproject.toml's, read from the installed distribution's metadata (the
    # core records the same number at its build: build_config()["version"]). Read on first use:
    # importlib.metadata is a tenth of the package's import time.
    if name == "__version__":
        from importlib import metadata

        globals()["__version__"] = version = metadata.version("attngeom")
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_num_threads() -> int:
    """Number of OpenMP threads the kernels use.

    Returns
    -------
    int
        The thread count of the next parallel kernel (1 when built without OpenMP).

    Examples
    --------
    >>> ag.get_num_threads() >= 1
    True
    """
    return int(_core.get_num_threads())


def set_num_threads(n: int) -> None:
    """Set the number of threads of the core's kernels and of NumPy's BLAS.

    One budget for both: a model's forward pass alternates NumPy products and core kernels,
    and two pools sized independently oversubscribe the cores. The core's OpenMP threads are
    set directly; NumPy's BLAS through threadpoolctl (a dependency; a BLAS it cannot control
    is left as it is). OMP_NUM_THREADS sets the core's initial value. Results do not depend
    on the thread count: every unit of work is computed the same way whichever thread runs
    it (the core's kernels give the same bits at any thread count).

    Parameters
    ----------
    n : int
        Thread count, from 1 to the OpenMP thread limit capped at 16 threads per processor
        (larger teams fail to start).

    Raises
    ------
    TypeError
        When n is not an integer.
    ValueError
        When n is outside that range (the message gives the range).

    Examples
    --------
    >>> import io
    >>> before = ag.get_num_threads()
    >>> ag.set_num_threads(1)
    >>> ag.get_num_threads(), ag.show_config(file=io.StringIO())["blas_threads"] in (1, None)
    (1, True)
    >>> ag.set_num_threads(before)
    """
    try:
        if isinstance(n, (bool, np.bool_)):
            raise TypeError
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be an integer >= 1, got {type(n).__name__}") from None
    limit = int(_core.max_threads())
    if not 1 <= n <= limit:
        raise ValueError(f"n must be an integer in [1, {limit}], got {n}")
    _core.set_num_threads(n)
    controller = blas_controller()
    if controller is not None:
        controller.limit(limits=n, user_api="blas")


def blas_controller():
    """threadpoolctl's controller of the BLAS libraries loaded (None without threadpoolctl)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - a dependency; a bare install without it keeps BLAS as it is
        return None
    return ThreadpoolController().select(user_api="blas")


def _blas_info() -> dict:
    """The BLAS NumPy uses and its thread count, as threadpoolctl reports them."""
    controller = blas_controller()
    libs = [] if controller is None else controller.info()
    if not libs:
        return {"blas": None, "blas_threads": None}
    return {"blas": " ".join(f"{lib.get('internal_api')} {lib.get('version') or ''}".strip() for lib in libs),
            "blas_threads": libs[0].get("num_threads")}


def show_config(file=None) -> dict:
    """Print and return the build configuration.

    The portable build holds the C++ core compiled per x86-64 level (baseline, AVX2,
    AVX-512) and imports the best one this CPU supports; set
    ``ATTNGEOM_ISA=baseline|avx2|avx512`` before the import to force a level.

    Parameters
    ----------
    file : file-like, optional
        Where to print (default sys.stdout).

    Returns
    -------
    dict
        version, eigen_version, openmp, compiler, ``isa`` (the level in use),
        ``isa_compiled`` (levels this build holds), ``isa_supported`` (those this CPU
        runs), ``simd`` (the compiler's SIMD flags of the level in use), ``eigen_simd``,
        ``bf16_products`` (the bfloat16 mode's products: "amx_bf16", the CPU's AMX tiles,
        "avx512_bf16", its bfloat16 dot products, or "widened"),
        ``sanitizers`` (empty except in a ``make sanitize`` build, e.g.
        "address,undefined"), ``threads``, and ``blas`` / ``blas_threads`` (NumPy's BLAS and
        its thread count, which :func:`set_num_threads` sets too; None when unknown).

    Examples
    --------
    >>> import io
    >>> cfg = ag.show_config(file=io.StringIO())
    >>> cfg["isa"] in cfg["isa_supported"].split()
    True
    """
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"file must be a writable file-like object or None, got {type(file).__name__}")
    cfg = dict(_core.build_config())
    cfg["isa_compiled"] = " ".join(_core.COMPILED)
    cfg["isa_supported"] = " ".join(_core.SUPPORTED)
    cfg["bf16_products"] = _core.dot_path()
    cfg["threads"] = get_num_threads()
    cfg.update(_blas_info())
    lines = [f"attngeom {cfg['version']}"]
    lines += [f"  {k:12s} {v}" for k, v in cfg.items() if k != "version"]
    print("\n".join(lines), file=file)
    return cfg
