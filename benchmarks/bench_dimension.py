"""Neuromanifold dimension: our analytic Jacobian + rank against reverse-mode autograd.

At the paper's Figure 4 scale (l = 3, t = 3, d_i = 4, a_i = 4, N = 100 samples) for the
lightning and softmax networks: the time of ag.parametrization_jacobian + numerical_rank
against PyTorch (optional `bench` extra) computing the same Jacobian (a) with one backward
pass per output scalar, as the paper's public code does, and (b) with torch.func.jacrev,
in float32 and float64, and whether each gets the right rank (the closed form) in every
draw. Then the largest bottleneck network (d_i = a_i = delta, l = 3) whose estimate
finishes within --budget seconds.

Times are medians over --draws draws (default 3: each a new network and input, every
contender on the same ones) after a warm-up call of each on the first draw. The sweep of
bottleneck sizes runs each size once: it looks for the largest size that fits the budget,
so its times are single calls (said in its output).

Gates (harness.agree; the exit status is 1 beyond a tolerance): attngeom's rank equals the
closed form (ag.expected_dimension) in every draw; its Jacobian agrees with PyTorch's
(backward loop and jacrev) to 1e-10 relative to the largest entry in float64 (measured
about 3e-15: the same products in another order) and 1e-4 in float32 (PyTorch's float32
rounding: measured about 2e-6); PyTorch's ranks are printed, not gated (in float32 its
rounding noise fills the rank up: that is what the table shows). In the sweep the
estimated dimension must equal the closed form wherever the estimate finds a clear
singular-value gap (where it finds none it says "unreliable": that is the method's limit,
not a disagreement, and it is printed).

  python benchmarks/bench_dimension.py [--out DIR] [--draws K] [--budget S] [--threads N] [--quick]

--quick: a 5 s budget for the sweep.
"""
from __future__ import annotations

import sys
import time

import numpy as np

import attngeom as ag
from harness import agree, finish, machine, parse, parser, print_threads

TOLERANCE = {"float64": 1e-10, "float32": 1e-4}  # Jacobians against PyTorch's, relative; see the docstring

try:
    import torch
except ImportError:
    torch = None


def torch_network(d, a, kind, X, dtype):
    """phi(params) in torch with the same flat parameter order as attngeom."""
    Xt = torch.tensor(X, dtype=dtype)

    def f(p):
        x, off = Xt, 0
        for i in range(len(a)):
            shapes = [(a[i], d[i]), (a[i], d[i]), (d[i + 1], d[i])]
            Q, K, V = [], [], []
            mats = []
            for r, c in shapes:
                mats.append(p[off:off + r * c].reshape(r, c))
                off += r * c
            Q, K, V = mats
            q, k, v = x @ Q.T, x @ K.T, x @ V.T
            if kind == "softmax":
                S = torch.softmax(k @ q.transpose(-1, -2), dim=-1)
            else:
                S = q @ k.transpose(-1, -2)
            x = S @ v
        return x.reshape(-1)

    return f


def torch_loop_jacobian(f, p):
    p = p.clone().requires_grad_(True)
    out = f(p)
    rows = []
    for i in range(out.numel()):
        (g,) = torch.autograd.grad(out[i], p, retain_graph=True)
        rows.append(g)
    return torch.stack(rows).detach().numpy()


def timed(f):
    """(f(), the seconds it took): one call."""
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def main(argv=None):
    p = parser(__doc__, repeats=None, threads=True)
    p.add_argument("--draws", type=int, default=3, help="draws, each timed once after a warm-up (default 3)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds a size of the sweep may take (default 60)")
    args = parse(p, argv)
    budget = min(args.budget, 5.0) if args.quick else args.budget
    if torch is None:
        print("torch is not importable: the autograd columns are skipped (install the 'bench' extra)")
    else:
        torch.set_num_threads(ag.get_num_threads())
    threads = print_threads()
    d, a, t, N = (4, 4, 4, 4), (4, 4, 4), 3, 100
    rows = []
    print(f"Figure 4 scale: d = {d}, a = {a}, t = {t}, N = {N}; times per Jacobian + rank, medians over {args.draws} "
          "draws after a warm-up; rel = largest difference of our Jacobian from PyTorch's (loop, jacrev), relative")
    print("(attngeom's Jacobian is always float64; the dtype column is PyTorch's)")
    print("     kind    dtype  ours [ms]  loop/ours  jacrev/ours  rank ours / loop / jacrev (expected)   rel")
    for kind in ("lightning", "softmax"):
        expected = ag.expected_dimension(d, a, kind)
        for dtype_name in ("float64", "float32"):
            t_ours, t_loop, t_jacrev, r_ours, r_loop, r_jac, errs = [], [], [], [], [], [], []
            for i, draw in enumerate([0] + list(range(args.draws))):
                warm_up = i == 0  # every contender once on the first draw, untimed
                rng = np.random.default_rng(draw)
                weights = ag.random_weights(d, a, seed=draw)
                X = rng.standard_normal((N, t, d[0]))
                J, dt = timed(lambda: ag.parametrization_jacobian(weights, X, kind=kind))
                (r, _, _), dt_rank = timed(lambda: ag.numerical_rank(J, block_rows=t * d[-1]))
                if torch is not None:
                    tdt = torch.float64 if dtype_name == "float64" else torch.float32
                    flat = torch.tensor(np.concatenate([w.ravel() for tr in weights for w in tr]), dtype=tdt)
                    f = torch_network(d, a, kind, X, tdt)
                    Jl, dt_l = timed(lambda: torch_loop_jacobian(f, flat))
                    Jr, dt_r = timed(lambda: torch.func.jacrev(f)(flat).numpy())
                if warm_up:
                    continue
                t_ours.append(dt + dt_rank)
                r_ours.append(r)
                if torch is not None:
                    t_loop.append(dt_l + dt_rank)
                    t_jacrev.append(dt_r + dt_rank)
                    r_loop.append(ag.numerical_rank(Jl.astype(np.float64), block_rows=t * d[-1])[0])
                    r_jac.append(ag.numerical_rank(Jr.astype(np.float64), block_rows=t * d[-1])[0])
                    for name, Jt in (("loop", Jl), ("jacrev", Jr)):
                        errs.append(agree(f"{kind} Jacobian vs torch {name} {dtype_name}, draw {draw}", J, Jt,
                                          rtol=TOLERANCE[dtype_name], show=False)["max_rel_error"])
            agree(f"{kind} rank vs the closed form ({dtype_name} pass)", r_ours, [expected] * len(r_ours), rtol=0,
                  show=False)
            row = {"kind": kind, "dtype": dtype_name, "expected": expected, "t_ours": float(np.median(t_ours)),
                   "ranks_ours": r_ours, "ranks_loop": r_loop, "ranks_jacrev": r_jac,
                   "max_rel_error_vs_torch": max(errs) if errs else None}
            if t_loop:
                row["loop/ours"] = float(np.median(t_loop)) / row["t_ours"]
                row["jacrev/ours"] = float(np.median(t_jacrev)) / row["t_ours"]
            rows.append(row)
            print(f"{kind:>9}  {dtype_name:>7}  {row['t_ours'] * 1e3:>9.1f}  {row.get('loop/ours', float('nan')):>9.1f}"
                  f"  {row.get('jacrev/ours', float('nan')):>11.1f}  {r_ours} / {r_loop} / {r_jac} ({expected})"
                  f"   {max(errs) if errs else float('nan'):.1e}", flush=True)

    print(f"largest bottleneck network (l = 3, d_i = a_i = delta, t = 3, N = 100) within {budget:.0f} s "
          "(one call per size: the sweep stops at the first size over the budget):")
    sizes = []
    for delta in (4, 8, 12, 16, 20, 24, 28, 32):
        r, dt = timed(lambda: ag.neuromanifold_dimension((delta,) * 4, (delta,) * 3, kind="softmax", n_draws=1))
        ok = dt <= budget
        sizes.append({"delta": delta, "parameters": r.parameters, "seconds": dt, "dim": int(r.dims[0]),
                      "expected": r.expected, "gap_ratio": float(r.gap_ratios[0]), "reliable": bool(r.reliable),
                      "within_budget": ok})
        if r.reliable:
            agree(f"sweep delta {delta}: dimension vs the closed form", int(r.dims[0]), r.expected, rtol=0, show=False)
        print(f"  delta {delta:>2}: P = {r.parameters:>5}, {dt:7.2f} s, dim {r.dims[0]} (expected {r.expected}),"
              f" gap ratio {r.gap_ratios[0]:.1e}" + ("" if r.reliable else " (unreliable: no clear gap; not gated)")
              + ("" if not r.reliable or r.dims[0] == r.expected else "  DISAGREES"), flush=True)
        if not ok:
            break
    return finish(args.out, "bench_dimension", meta=machine(torch=torch.__version__ if torch else None,
                                                           draws=args.draws, budget=budget),
                  threads=threads, figure4=rows, sizes=sizes)


if __name__ == "__main__":
    sys.exit(main())
