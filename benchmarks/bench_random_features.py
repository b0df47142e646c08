"""FAVOR+ against exact softmax attention: the sequence length where random features win.

d = 64, m = 256 features, 8 heads, float32 and float64, non-causal and causal: the time of
ag.random_feature_attention over that of ag.softmax_attention (same inputs, this run) for
n from 128 to 8192, the crossover n (first n with ratio < 1) and the flop-count theory:
exact attention costs about 4 n^2 d, FAVOR+ about 6 n m d (features for q and k, then the
two lightning products), so they meet near n = 1.5 m (about 2 m once exp is counted).

  python benchmarks/bench_random_features.py [--out DIR] [--repeats R]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time

NS = [128, 256, 512, 1024, 2048, 4096, 8192]



def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--features", type=int, default=256)
    args = p.parse_args(argv)
    m, d, heads = args.features, 64, 8
    rng = np.random.default_rng(0)
    rows, crossings = [], {}
    print(f"FAVOR+ (m = {m}) vs exact softmax attention, d = {d}, {heads} heads, {ag.get_num_threads()} threads;"
          " ratio = time_favor / time_exact (below 1: random features faster)")
    print("  dtype  causal      n  exact [ms]  favor [ms]   ratio")
    for dtype in (np.float32, np.float64):
        for causal in (False, True):
            crossing = None
            for n in NS:
                q, k, v = (rng.standard_normal((heads, n, d)).astype(dtype) for _ in range(3))
                t_exact = median_time(lambda: ag.softmax_attention(q, k, v, causal=causal), args.repeats)
                t_favor = median_time(lambda: ag.random_feature_attention(q, k, v, num_features=m, causal=causal),
                                      args.repeats)
                ratio = t_favor / t_exact
                if crossing is None and ratio < 1:
                    crossing = n
                rows.append({"dtype": np.dtype(dtype).name, "causal": causal, "n": n, "t_exact": t_exact,
                             "t_favor": t_favor, "ratio": ratio})
                print(f"{np.dtype(dtype).name:>7}  {str(causal):>6}  {n:>5}  {t_exact * 1e3:>10.2f}  "
                      f"{t_favor * 1e3:>10.2f}  {ratio:>6.2f}", flush=True)
            crossings[f"{np.dtype(dtype).name}, causal={causal}"] = crossing
    print("crossover n (first n where FAVOR+ is faster):", crossings, f"; flop theory ~1.5 m to 2 m = {int(1.5 * m)}"
          f" to {2 * m}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"threads": ag.get_num_threads(), "features": m, "d": d, "heads": heads, "numpy": np.__version__,
            "python": platform.python_version(), "cpu_count": os.cpu_count()}
    path = out / "bench_random_features.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows, "crossover": crossings}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
