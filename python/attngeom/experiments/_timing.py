"""Wall-clock timing for drivers and benchmarks: the median of repeated runs after a warm-up
(timings on shared machines are noisy; results are reported as ratios of times measured in the
same run, never as absolute numbers to assert on)."""
from __future__ import annotations

import statistics
import time


def median_time(f, repeats: int) -> float:
    """Median wall-clock seconds of ``f()`` over `repeats` runs (>= 1), after one warm-up call."""
    f()
    times = []
    for _ in range(max(1, int(repeats))):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
