"""Progress bars for the long sweeps of the experiment drivers.

A sweep is wrapped in a tqdm bar written to stderr when stderr is a terminal, and left
bare otherwise (pytest, notebooks executed by nbclient, redirected CLI output), or when
tqdm is not installed (it comes with the plot, test and notebooks extras).
"""
from __future__ import annotations

import sys
from typing import Iterable, Optional


def progress(iterable: Iterable, *, desc: Optional[str] = None, total: Optional[int] = None) -> Iterable:
    """`iterable` under a tqdm progress bar on an interactive stderr, else unchanged.

    Example: ``for a in progress(alphas, desc="alpha"): ...``
    """
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    stream = sys.stderr
    isatty = getattr(stream, "isatty", None)
    return tqdm(iterable, desc=desc, total=total, leave=False, file=stream, disable=not (isatty and isatty()))
