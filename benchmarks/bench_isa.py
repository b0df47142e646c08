"""Instruction-set levels: each compiled level of the core against the one in use.

The portable build holds the core compiled for baseline x86-64, x86-64-v3 (AVX2, FMA) and
x86-64-v4 (AVX-512); a native build (``make NATIVE=ON``) holds a -march=native one. Every
level this CPU runs is timed on the same inputs, interleaved round by round, on the hot
kernels; the table gives each level's time over the time of the level chosen at import
(below 1 = faster than the chosen one). A ``_core_native`` module placed beside the others
(built with -DATTNGEOM_NATIVE=ON) is picked up, which is how the portable build is compared
with a native one in the same run.

  python benchmarks/bench_isa.py [--out DIR] [--threads N] [--repeats R]
"""
from __future__ import annotations

import os
import platform
import sys

import numpy as np

import attngeom as ag
from attngeom import _core
from bench_attention import time_interleaved  # contenders timed round by round
from harness import parse, parser, write


def cases(rng):
    """(name, callable) pairs of hot kernels on moderately sized inputs."""
    out = []
    for dt in (np.float32, np.float64):
        name = np.dtype(dt).name
        q, k, v = (rng.standard_normal((2, 8, 1024, 64)).astype(dt) for _ in range(3))
        out += [
            (f"softmax {name}", lambda q=q, k=k, v=v: ag.softmax_attention(q, k, v)),
            (f"softmax causal {name}", lambda q=q, k=k, v=v: ag.softmax_attention(q, k, v, causal=True)),
            (f"gaussian {name}", lambda q=q, k=k, v=v: ag.kernel_attention(q, k, v, kernel="gaussian", sigma=4.0)),
            (f"cauchy {name}", lambda q=q, k=k, v=v: ag.kernel_attention(q, k, v, kernel="cauchy", gamma=4.0)),
            (f"projection {name}", lambda q=q, k=k, v=v: ag.projection_attention(q, k, v, sigma=2.0)),
            (f"lightning causal {name}", lambda q=q, k=k, v=v: ag.lightning_attention(q, k, v, causal=True)),
        ]
    image = ag.shepp_logan_phantom(192)
    theta = np.linspace(0.0, 180.0, 180, endpoint=False)
    sino = ag.radon(image, theta)
    out += [("radon", lambda: ag.radon(image, theta)), ("iradon", lambda: ag.iradon(sino, theta)),
            ("sart", lambda: ag.iradon_sart(sino, theta))]
    x = rng.standard_normal((64, 512, 32))
    L = np.tril(rng.standard_normal((32, 32))) + 6 * np.eye(32)
    M = 0.2 * rng.standard_normal((32, 32))
    out.append(("whiten", lambda: ag.whiten(x, L, M)))
    weights = ag.random_weights([8, 6, 8], [6, 6], seed=1)
    X = rng.standard_normal((200, 5, 8))  # (samples, tokens, d_0)
    out.append(("jacobian", lambda: ag.parametrization_jacobian(weights, X)))
    s = np.linspace(-40, 40, 200_000)
    out.append(("stable density", lambda: ag.stable_density(s, 1.3)))
    return out


def at_level(level, f):
    with _core.use_level(level):
        return f()


def main(argv=None):
    args = parse(parser(__doc__, repeats=5, threads=True), argv)
    chosen = _core.LEVEL
    levels = list(_core.SUPPORTED)
    print(f"levels compiled: {' '.join(_core.COMPILED)}; supported here: {' '.join(levels)}; chosen: {chosen}; "
          f"{ag.get_num_threads()} threads; time over the chosen level's (median of {args.repeats} interleaved rounds)")
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'kernel':>24}  {chosen + ' [ms]':>12}  " + "  ".join(f"{lv:>9}" for lv in levels))
    for name, f in cases(rng):
        med = time_interleaved({lv: (lambda lv=lv, f=f: at_level(lv, f)) for lv in levels}, args.repeats)
        row = {"kernel": name, "t": med, "ratio": {lv: med[lv] / med[chosen] for lv in levels}}
        rows.append(row)
        print(f"{name:>24}  {med[chosen] * 1e3:>12.2f}  " + "  ".join(f"{row['ratio'][lv]:>9.2f}" for lv in levels),
              flush=True)
    meta = {"chosen": chosen, "levels": levels, "threads": ag.get_num_threads(), "repeats": args.repeats,
            "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "attngeom": ag.show_config(file=open(os.devnull, "w"))}
    write(args.out, "bench_isa", meta=meta, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
