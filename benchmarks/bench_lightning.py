"""Lightning attention: linear cost in n, and the speed-up over the quadratic form.

For d_k = d_v = 64, 8 heads, float32 and float64, causal and not: the time of
ag.lightning_attention at n = 1024, 2048, 4096, 8192, the ratio t(8192) / t(1024) (about 8
for linear cost, 64 for quadratic), and the speed-up over the quadratic form
(q k^T [* causal mask]) v in NumPy at each n, all measured in this run.

  python benchmarks/bench_lightning.py [--out DIR] [--threads N] [--repeats R]
"""
from __future__ import annotations

import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import attention_inputs, machine, parse, parser, write

NS = [1024, 2048, 4096, 8192]



def quadratic(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2)
    if causal:
        s *= np.tri(s.shape[-2], s.shape[-1], dtype=s.dtype)
    return s @ v


def main(argv=None):
    p = parser(__doc__, threads=True)
    p.add_argument("--heads", type=int, default=8)
    args = parse(p, argv)
    rng = np.random.default_rng(0)
    rows, bad = [], 0
    print(f"lightning attention, {args.heads} heads, d = 64, {ag.get_num_threads()} threads; "
          "quad/ours = time of the NumPy quadratic form over ours")
    print("  dtype  causal      n   ours [ms]  t(n)/t(1024)  quad/ours  maxrel")
    for dtype, causal, n, (q, k, v) in attention_inputs(rng, args.heads, 64, NS):
        t = median_time(lambda: ag.lightning_attention(q, k, v, causal=causal), args.repeats)
        t_quad = median_time(lambda: quadratic(q, k, v, causal), 1)
        y, yq = ag.lightning_attention(q, k, v, causal=causal), quadratic(q, k, v, causal)
        err = float(np.max(np.abs(y - yq)) / np.max(np.abs(yq)))
        ok = err <= (1e-4 if dtype == "float32" else 1e-11)
        bad += not ok
        base = t if n == NS[0] else base
        row = {"dtype": dtype, "causal": causal, "n": n, "t_ours": t, "t_quadratic": t_quad,
               "scaling_vs_1024": t / base, "speedup_over_quadratic": t_quad / t, "max_rel_error": err,
               "correct": ok}
        rows.append(row)
        print(f"{dtype:>7}  {str(causal):>6}  {n:>5}  {t * 1e3:>10.2f}  {t / base:>12.2f}"
              f"  {t_quad / t:>9.1f}  {err:.1e}" + ("" if ok else "  MISMATCH"), flush=True)
    write(args.out, "bench_lightning", meta=machine(heads=args.heads, d=64), rows=rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
