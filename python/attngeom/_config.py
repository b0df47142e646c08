"""Version, build configuration and thread control."""
from __future__ import annotations

from . import _core

__version__: str = _core.build_config()["version"]


def get_num_threads() -> int:
    """Number of OpenMP threads the kernels use (1 when built without OpenMP)."""
    return int(_core.get_num_threads())


def set_num_threads(n: int) -> None:
    """Set the number of OpenMP threads for subsequent kernels.

    OMP_NUM_THREADS sets the initial value. Results do not depend on the thread count
    beyond rounding (<= 1e-12 relative in float64): every unit of work is computed the same
    way whichever thread runs it. n is at most ``max_threads()``: the OpenMP thread limit,
    capped at 16 threads per processor (larger teams fail to start).

    Example: ``ag.set_num_threads(1)``
    """
    if isinstance(n, bool) or not isinstance(n, (int,)) and not hasattr(n, "__index__"):
        raise TypeError(f"n must be an integer >= 1, got {type(n).__name__}")
    n = int(n.__index__()) if not isinstance(n, int) else n
    limit = int(_core.max_threads())
    if not 1 <= n <= limit:
        raise ValueError(f"n must be an integer in [1, {limit}], got {n}")
    _core.set_num_threads(n)


def show_config(file=None) -> dict:
    """Print and return the build configuration.

    Keys: version, Eigen version, OpenMP, compiler, ``isa`` (the instruction-set level in
    use), ``isa_compiled`` (levels this build holds), ``isa_supported`` (those this CPU
    runs), ``simd`` (the compiler's flags of the level in use) and ``threads``. Set
    ``ATTNGEOM_ISA=baseline|avx2|avx512`` before the import to force a level.

    Example: ``ag.show_config()["isa"]`` is ``'avx512'`` on a CPU with AVX-512.
    """
    cfg = dict(_core.build_config())
    cfg["isa_compiled"] = " ".join(_core.COMPILED)
    cfg["isa_supported"] = " ".join(_core.SUPPORTED)
    cfg["threads"] = get_num_threads()
    lines = [f"attngeom {cfg['version']}"]
    lines += [f"  {k:12s} {v}" for k, v in cfg.items() if k != "version"]
    print("\n".join(lines), file=file)
    return cfg
