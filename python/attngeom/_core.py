"""The C++ core, compiled once per x86-64 instruction-set level and chosen at import.

A portable build (``pip install .``) holds up to three extension modules built from the
same sources: ``_core_baseline`` (x86-64, SSE2), ``_core_avx2`` (x86-64-v3: AVX2, FMA) and
``_core_avx512`` (x86-64-v4: AVX-512). A native build (``make NATIVE=ON``) holds one,
``_core_native``. This module imports the best level the CPU supports, asked of the CPU
through the baseline module (CPUID via the compiler's builtins), and re-exports its
functions, so the rest of the package calls ``_core.<kernel>`` whatever level runs. The
AVX2 and AVX-512 modules hold the hot kernels only; the rest comes from the baseline.

``ATTNGEOM_ISA=baseline|avx2|avx512|native`` forces one level; a level that was not
compiled, or that the CPU cannot run, raises ImportError instead of crashing later.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Iterator

#: Levels from the most to the least capable; ``native`` only exists in a native build.
PREFERENCE = ("native", "avx512", "avx2", "baseline")
ENV = "ATTNGEOM_ISA"


def _compiled() -> tuple[str, ...]:
    return tuple(
        level for level in PREFERENCE if importlib.util.find_spec(f"{__package__}._core_{level}") is not None
    )


def _load(level: str) -> ModuleType:
    return importlib.import_module(f"{__package__}._core_{level}")


def _supported(compiled: tuple[str, ...]) -> tuple[str, ...]:
    """Levels this CPU runs, asked of the least demanding module that was compiled."""
    probe = _load("baseline" if "baseline" in compiled else compiled[-1])
    cpu = set(probe.supported_levels())
    # A native build runs on the machine that compiled it; it is chosen only if present.
    return tuple(level for level in compiled if level in cpu or level == "native")


def _choose(compiled: tuple[str, ...], supported: tuple[str, ...], forced: str | None) -> str:
    if not compiled:
        raise ImportError(
            "attngeom's C++ core is missing (no attngeom._core_<level> module): reinstall with `pip install .`"
        )
    if forced:
        if forced not in PREFERENCE:
            raise ImportError(f"{ENV} must be one of {', '.join(PREFERENCE)}, got {forced!r}")
        if forced not in compiled:
            raise ImportError(f"{ENV}={forced}: this build has only {', '.join(compiled)}")
        if forced not in supported:
            raise ImportError(f"{ENV}={forced}: this CPU supports only {', '.join(supported)}")
        return forced
    return supported[0]


COMPILED: tuple[str, ...] = _compiled()
SUPPORTED: tuple[str, ...] = _supported(COMPILED) if COMPILED else ()
LEVEL: str = _choose(COMPILED, SUPPORTED, os.environ.get(ENV, "").strip().lower() or None)
_names: list[str] = []


def _activate(level: str) -> None:
    """Re-export the functions of ``_core_<level>`` as this module's attributes.

    The AVX2 and AVX-512 modules hold only the hot kernels; the concepts compiled into the
    baseline module alone (the SVD-based spectra, the inverse Laplace solvers, the Radon
    projector, the network Jacobians and the Gibbs statistics, which dominate the compile time
    and are not hot kernels) are taken from it.
    """
    global LEVEL
    module = _load(level)
    for name in _names:
        globals().pop(name, None)
    exported = {name: getattr(module, name) for name in vars(module) if not name.startswith("_")}
    if level != "baseline" and "baseline" in COMPILED:
        base = _load("baseline")
        exported.update({name: getattr(base, name) for name in vars(base)
                         if not name.startswith("_") and name not in exported})
    _names[:] = list(exported)
    globals().update(exported)
    LEVEL = level


@contextlib.contextmanager
def use_level(level: str) -> Iterator[None]:
    """Run the enclosed calls on another compiled level (for the cross-level tests).

    Not thread-safe: the package's kernels look ``_core.<name>`` up at call time.
    """
    if level not in SUPPORTED:
        raise ValueError(f"level must be one of {SUPPORTED} (compiled and supported here), got {level!r}")
    previous = LEVEL
    _activate(level)
    try:
        yield
    finally:
        _activate(previous)


_activate(LEVEL)
