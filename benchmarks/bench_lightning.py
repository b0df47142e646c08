"""Lightning attention: linear cost in n, and the speed-up over the quadratic form.

For d_k = d_v = 64, 8 heads, float32 and float64, causal and not: the time of
ag.lightning_attention at n = 1024, 2048, 4096, 8192, the ratio t(8192) / t(1024) (about 8
for linear cost, 64 for quadratic), and the speed-up over the quadratic form
(q k^T [* causal mask]) v in NumPy at each n, all measured in this run: medians of --repeats
calls (default 3) after a warm-up, for both.

The anchor is that quadratic form: every output is compared with it (the largest difference
relative to the largest output); the tolerance is 1e-4 in float32 and 1e-11 in float64, a
clear factor above the agreement measured (about 1e-6 and 1e-15: the two sum the same terms
in another order), and the exit status is 1 beyond it. --quick: n = 256 and 512.

  python benchmarks/bench_lightning.py [--out DIR] [--threads N] [--repeats R] [--quick]
"""
from __future__ import annotations

import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import agree, attention_inputs, finish, machine, parse, parser, print_threads

NS = [1024, 2048, 4096, 8192]



def quadratic(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2)
    if causal:
        s *= np.tri(s.shape[-2], s.shape[-1], dtype=s.dtype)
    return s @ v


TOLERANCE = {"float32": 1e-4, "float64": 1e-11}  # relative to the largest output; see the docstring


def main(argv=None):
    p = parser(__doc__, threads=True)
    p.add_argument("--heads", type=int, default=8)
    args = parse(p, argv)
    ns = [256, 512] if args.quick else NS
    rng = np.random.default_rng(0)
    rows = []
    print(f"lightning attention, {args.heads} heads, d = 64; quad/ours = time of the NumPy quadratic form over ours; "
          f"medians of {args.repeats} calls after a warm-up")
    threads = print_threads()
    print(f"  dtype  causal      n   ours [ms]  t(n)/t({ns[0]})  quad/ours  maxrel")
    for dtype, causal, n, (q, k, v) in attention_inputs(rng, args.heads, 64, ns):
        t = median_time(lambda: ag.lightning_attention(q, k, v, causal=causal), args.repeats)
        t_quad = median_time(lambda: quadratic(q, k, v, causal), args.repeats)
        check = agree(f"{dtype} causal={causal} n={n}", ag.lightning_attention(q, k, v, causal=causal),
                      quadratic(q, k, v, causal), rtol=TOLERANCE[dtype], show=False)
        base = t if n == ns[0] else base
        row = {"dtype": dtype, "causal": causal, "n": n, "t_ours": t, "t_quadratic": t_quad,
               "scaling_vs_first": t / base, "speedup_over_quadratic": t_quad / t,
               "max_rel_error": check["max_rel_error"], "correct": check["ok"]}
        rows.append(row)
        print(f"{dtype:>7}  {str(causal):>6}  {n:>5}  {t * 1e3:>10.2f}  {t / base:>12.2f}"
              f"  {t_quad / t:>9.1f}  {check['max_rel_error']:.1e}" + ("" if check["ok"] else "  DISAGREES"),
              flush=True)
    return finish(args.out, "bench_lightning", meta=machine(heads=args.heads, d=64, repeats=args.repeats),
                  threads=threads, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
