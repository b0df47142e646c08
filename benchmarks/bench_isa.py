"""Instruction-set levels: each compiled level of the core against the one in use.

The portable build holds the core compiled for baseline x86-64, x86-64-v3 (AVX2, FMA) and
x86-64-v4 (AVX-512); a native build (``make NATIVE=ON``) holds a -march=native one. Every
level this CPU runs is timed on the same inputs, interleaved round by round, on the hot
kernels; the table gives each level's time over the time of the level chosen at import
(below 1 = faster than the chosen one). A ``_core_native`` module placed beside the others
(built with -DATTNGEOM_NATIVE=ON) is picked up, which is how the portable build is compared
with a native one in the same run. Times are medians of --repeats rounds (default 5) after
a warm-up.

There is no external anchor: each level's output is compared with the chosen level's
(harness.agree, relative to the latter's largest entry), the answer every ratio is taken
against. The levels round differently (FMA contraction, vector widths, the order of
partial sums), so the tolerance is 1e-4 for float32 kernels and 1e-10 for float64 ones, a
clear factor above the differences measured (under 1e-6 and 1e-15) and far below a wrong
result; beyond it the exit status is 1. --quick: smaller inputs.

  python benchmarks/bench_isa.py [--out DIR] [--threads N] [--repeats R] [--quick]
"""
from __future__ import annotations

import os
import platform
import sys

import numpy as np

import attngeom as ag
from attngeom import _core
from bench_attention import time_interleaved  # contenders timed round by round
from harness import agree, finish, machine, parse, parser, print_threads

TOLERANCE = {"float32": 1e-4, "float64": 1e-10}  # relative, between levels; see the docstring


def cases(rng, quick=False):
    """(name, dtype name, callable) of hot kernels on moderately sized inputs (small ones when
    `quick`)."""
    n, size, tokens, samples = (256, 64, 128, 20) if quick else (1024, 192, 512, 200)
    out = []
    for dt in (np.float32, np.float64):
        name = np.dtype(dt).name
        q, k, v = (rng.standard_normal((2, 8, n, 64)).astype(dt) for _ in range(3))
        out += [
            (f"softmax {name}", name, lambda q=q, k=k, v=v: ag.softmax_attention(q, k, v)),
            (f"softmax causal {name}", name, lambda q=q, k=k, v=v: ag.softmax_attention(q, k, v, causal=True)),
            (f"gaussian {name}", name,
             lambda q=q, k=k, v=v: ag.kernel_attention(q, k, v, kernel="gaussian", sigma=4.0)),
            (f"cauchy {name}", name, lambda q=q, k=k, v=v: ag.kernel_attention(q, k, v, kernel="cauchy", gamma=4.0)),
            (f"projection {name}", name, lambda q=q, k=k, v=v: ag.projection_attention(q, k, v, sigma=2.0)),
            (f"lightning causal {name}", name, lambda q=q, k=k, v=v: ag.lightning_attention(q, k, v, causal=True)),
        ]
    image = ag.shepp_logan_phantom(size)
    theta = np.linspace(0.0, 180.0, 180, endpoint=False)
    sino = ag.radon(image, theta)
    out += [("radon", "float64", lambda: ag.radon(image, theta)), ("iradon", "float64", lambda: ag.iradon(sino, theta)),
            ("sart", "float64", lambda: ag.iradon_sart(sino, theta))]
    x = rng.standard_normal((64, tokens, 32))
    L = np.tril(rng.standard_normal((32, 32))) + 6 * np.eye(32)
    M = 0.2 * rng.standard_normal((32, 32))
    out.append(("whiten", "float64", lambda: ag.whiten(x, L, M)))
    weights = ag.random_weights([8, 6, 8], [6, 6], seed=1)
    X = rng.standard_normal((samples, 5, 8))  # (samples, tokens, d_0)
    out.append(("jacobian", "float64", lambda: ag.parametrization_jacobian(weights, X)))
    s = np.linspace(-40, 40, 200_000)
    out.append(("stable density", "float64", lambda: ag.stable_density(s, 1.3)))
    return out


def at_level(level, f):
    with _core.use_level(level):
        return f()


def main(argv=None):
    args = parse(parser(__doc__, repeats=5, threads=True), argv)
    chosen = _core.LEVEL
    levels = list(_core.SUPPORTED)
    print(f"levels compiled: {' '.join(_core.COMPILED)}; supported here: {' '.join(levels)}; chosen: {chosen}; "
          f"time over the chosen level's (median of {args.repeats} interleaved rounds after a warm-up); rel = the "
          f"largest difference of any level's output from the chosen level's, relative")
    threads = print_threads()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'kernel':>24}  {chosen + ' [ms]':>12}  " + "  ".join(f"{lv:>9}" for lv in levels) + "        rel")
    for name, dtype, f in cases(rng, args.quick):
        med = time_interleaved({lv: (lambda lv=lv, f=f: at_level(lv, f)) for lv in levels}, args.repeats)
        want = at_level(chosen, f)
        err = max(agree(f"{name} {lv} vs {chosen}", at_level(lv, f), want, rtol=TOLERANCE[dtype],
                        show=False)["max_rel_error"] for lv in levels)
        row = {"kernel": name, "t": med, "ratio": {lv: med[lv] / med[chosen] for lv in levels}, "max_rel_error": err}
        rows.append(row)
        print(f"{name:>24}  {med[chosen] * 1e3:>12.2f}  " + "  ".join(f"{row['ratio'][lv]:>9.2f}" for lv in levels)
              + f"    {err:.1e}" + ("" if err <= TOLERANCE[dtype] else "  DISAGREES"), flush=True)
    meta = machine(chosen=chosen, levels=levels, repeats=args.repeats, machine=platform.machine(),
                   attngeom=ag.show_config(file=open(os.devnull, "w")))
    return finish(args.out, "bench_isa", meta=meta, threads=threads, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
