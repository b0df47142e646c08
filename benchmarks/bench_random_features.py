"""FAVOR+ against exact softmax attention: the sequence length where random features win.

d = 64, m = 256 features, 8 heads, float32 and float64, non-causal and causal: the time of
ag.random_feature_attention over that of ag.softmax_attention (same inputs, this run) for
n from 128 to 8192, the crossover n (first n with ratio < 1) and the flop-count theory:
exact attention costs about 4 n^2 d, FAVOR+ about 8 n m d (features of q and k: 2 n m d
each; phi_k^T v and phi_q (phi_k^T v): 2 n m d each), so they meet near n = 2 m.
The backward passes (each recomputing its forward) are timed the same way: ratio_bwd is
ag.random_feature_attention_backward over ag.softmax_attention_backward.

  python benchmarks/bench_random_features.py [--out DIR] [--repeats R]
"""
from __future__ import annotations

import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import attention_inputs, machine, parse, parser, write

NS = [128, 256, 512, 768, 1024, 2048, 4096, 8192]



def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--features", type=int, default=256)
    args = parse(p, argv)
    m, d, heads = args.features, 64, 8
    rng = np.random.default_rng(0)
    rows, crossings = [], {}
    print(f"FAVOR+ (m = {m}) vs exact softmax attention, d = {d}, {heads} heads, {ag.get_num_threads()} threads;"
          " ratio = time_favor / time_exact (below 1: random features faster)")
    print("  dtype  causal      n  exact [ms]  favor [ms]   ratio  | backward: exact [ms]  favor [ms]   ratio")
    crossings_bwd = {}
    for dtype, causal, n, (q, k, v) in attention_inputs(rng, heads, d, NS):
        dy = rng.standard_normal(v.shape).astype(v.dtype)
        t_exact = median_time(lambda: ag.softmax_attention(q, k, v, causal=causal), args.repeats)
        t_favor = median_time(lambda: ag.random_feature_attention(q, k, v, num_features=m, causal=causal),
                              args.repeats)
        t_exact_bwd = median_time(lambda: ag.softmax_attention_backward(q, k, v, dy, causal=causal), args.repeats)
        t_favor_bwd = median_time(
            lambda: ag.random_feature_attention_backward(q, k, v, dy, num_features=m, causal=causal), args.repeats)
        ratio, ratio_bwd = t_favor / t_exact, t_favor_bwd / t_exact_bwd
        case = f"{dtype}, causal={causal}"
        if crossings.get(case) is None:
            crossings[case] = n if ratio < 1 else None
        if crossings_bwd.get(case) is None:
            crossings_bwd[case] = n if ratio_bwd < 1 else None
        rows.append({"dtype": dtype, "causal": causal, "n": n, "t_exact": t_exact, "t_favor": t_favor, "ratio": ratio,
                     "t_exact_bwd": t_exact_bwd, "t_favor_bwd": t_favor_bwd, "ratio_bwd": ratio_bwd})
        print(f"{dtype:>7}  {str(causal):>6}  {n:>5}  {t_exact * 1e3:>10.2f}  {t_favor * 1e3:>10.2f}  {ratio:>6.2f}"
              f"  |  {t_exact_bwd * 1e3:>18.2f}  {t_favor_bwd * 1e3:>10.2f}  {ratio_bwd:>6.2f}", flush=True)
    print("crossover n (first n where FAVOR+ is faster):", crossings, f"; flop theory ~2 m = {2 * m}")
    print("backward crossover n:", crossings_bwd)
    write(args.out, "bench_random_features", meta=machine(features=m, d=d, heads=heads), rows=rows, crossover=crossings,
          crossover_backward=crossings_bwd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
