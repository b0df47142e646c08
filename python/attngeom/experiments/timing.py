"""Wall-clock timing for the drivers and the benchmarks: the median of repeated runs
(timings on shared machines are noisy; results are reported as ratios of times measured in
the same run, never as absolute numbers to assert on)."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Tuple


def timed(f: Callable[[], Any], repeats: int, *, warm_up: bool = False) -> Tuple[Any, float]:
    """(the last result of ``f()``, median wall-clock seconds over `repeats` runs (>= 1)),
    after one untimed call when `warm_up`."""
    if warm_up:
        f()
    times, out = [], None
    for _ in range(max(1, int(repeats))):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def median_time(f: Callable[[], Any], repeats: int) -> float:
    """Median wall-clock seconds of ``f()`` over `repeats` runs (>= 1), after one warm-up call.

    Example: ``t = median_time(lambda: ag.softmax_attention(q, k, v), 5)``
    """
    return timed(f, repeats, warm_up=True)[1]
