"""FAVOR+ against exact softmax attention: the sequence length where random features win.

d = 64, m = 256 features, 8 heads, float32 and float64, non-causal and causal: the time of
ag.random_feature_attention over that of ag.softmax_attention (same inputs, this run) for
n from 128 to 8192, the crossover n (first n with ratio < 1) and the flop-count theory:
exact attention costs about 4 n^2 d, FAVOR+ about 8 n m d (features of q and k: 2 n m d
each; phi_k^T v and phi_q (phi_k^T v): 2 n m d each), so they meet near n = 2 m.
The backward passes (each recomputing its forward) are timed the same way: ratio_bwd is
ag.random_feature_attention_backward over ag.softmax_attention_backward. Every time is the
median of --repeats calls (default 3) after a warm-up.

Both timed contenders are attngeom's, so each is checked against PyTorch computing the same
thing in float64 (per head; autograd for the backward): softmax attention against
torch.nn.functional.scaled_dot_product_attention, FAVOR+ against the FAVOR+ formula
y_i = phi(q_i) S / phi(q_i) z with the same feature matrix W (ag.feature_matrix, seed 0),
written in torch (causal: chunks of keys with their prefix sums). Tolerances, relative to
the reference's largest entry: float64 1e-11, float32 1e-4, a clear factor above the
agreement measured at n <= 512 (about 3e-15 and 2e-6, forward and gradients alike; sums over
more keys round a little more) and far below what a wrong W, scale or mask would give.
Beyond them the exit status is 1. --quick: n = 128 and 512.

  python benchmarks/bench_random_features.py [--out DIR] [--repeats R] [--quick]
"""
from __future__ import annotations

import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import agree, attention_inputs, finish, machine, parse, parser, print_threads

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the bench extra brings torch
    torch = None

NS = [128, 256, 512, 768, 1024, 2048, 4096, 8192]
TOLERANCE = {"float32": 1e-4, "float64": 1e-11}  # relative to the reference's largest entry; see the docstring
CHUNK = 256  # keys per step of the causal FAVOR+ reference


def favor_reference(q, k, v, W, causal):
    """FAVOR+ of one head in float64 torch: phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) with
    x' = x / d^(1/4); y_i = phi(q_i) S_i / phi(q_i) z_i, S_i and z_i summed over the keys query i
    sees (causal: the prefix before its chunk plus the masked diagonal chunk)."""
    root = q.shape[-1] ** -0.25

    def phi(x):
        x = root * x
        return torch.exp(x @ W.T - 0.5 * (x * x).sum(-1, keepdim=True)) / W.shape[0] ** 0.5

    pq, pk = phi(q), phi(k)
    if not causal:
        return (pq @ (pk.T @ v)) / (pq @ pk.sum(0))[:, None]
    S, z, out = torch.zeros(W.shape[0], v.shape[-1], dtype=v.dtype), torch.zeros(W.shape[0], dtype=v.dtype), []
    for a in range(0, q.shape[0], CHUNK):
        b = min(a + CHUNK, q.shape[0])
        block = torch.tril(pq[a:b] @ pk[a:b].T)
        out.append((pq[a:b] @ S + block @ v[a:b]) / (pq[a:b] @ z + block.sum(-1))[:, None])
        S, z = S + pk[a:b].T @ v[a:b], z + pk[a:b].sum(0)
    return torch.cat(out)


def reference(q, k, v, dy, causal, W=None):
    """y and (dq, dk, dv) of softmax attention (W None: torch's SDPA) or of FAVOR+ with
    features W, in float64, one head at a time, the gradients by autograd for the cotangent dy."""
    ys, grads = [], []
    for h in range(q.shape[0]):
        qh, kh, vh = (torch.from_numpy(np.asarray(a[h], np.float64)).requires_grad_() for a in (q, k, v))
        y = (F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal) if W is None
             else favor_reference(qh, kh, vh, W, causal))
        y.backward(torch.from_numpy(np.asarray(dy[h], np.float64)))
        ys.append(y.detach().numpy())
        grads.append([t.grad.numpy() for t in (qh, kh, vh)])
    return np.stack(ys), [np.stack(g) for g in zip(*grads)]


def check(name, tol, y, grads, ref):
    """agree() on the forward and on the three cotangents; the largest relative error."""
    ry, rgrads = ref
    worst = agree(f"{name} forward", y, ry, rtol=tol, show=False)["max_rel_error"]
    for label, g, rg in zip(("dq", "dk", "dv"), grads, rgrads):
        worst = max(worst, agree(f"{name} {label}", g, rg, rtol=tol, show=False)["max_rel_error"])
    return worst


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--features", type=int, default=256)
    args = parse(p, argv)
    if torch is None:
        print("bench_random_features needs torch for its reference (pip install 'attngeom[bench]')")
        return 1
    torch.set_num_threads(ag.get_num_threads())
    m, d, heads = args.features, 64, 8
    ns = [128, 512] if args.quick else NS
    W = torch.from_numpy(ag.feature_matrix(d, m, seed=0))  # the W of random_feature_attention(..., seed=0)
    rng = np.random.default_rng(0)
    rows, crossings = [], {}
    print(f"FAVOR+ (m = {m}) vs exact softmax attention, d = {d}, {heads} heads;"
          f" ratio = time_favor / time_exact (below 1: random features faster); medians of {args.repeats} calls "
          "after a warm-up; err = largest relative error of the exact / FAVOR+ forward and gradients against "
          "PyTorch float64")
    threads = print_threads()
    print("  dtype  causal      n  exact [ms]  favor [ms]   ratio  | backward: exact [ms]  favor [ms]   ratio"
          "  | err exact  favor")
    crossings_bwd = {}
    for dtype, causal, n, (q, k, v) in attention_inputs(rng, heads, d, ns):
        dy = rng.standard_normal(v.shape).astype(v.dtype)
        exact = lambda: ag.softmax_attention(q, k, v, causal=causal)  # noqa: E731
        favor = lambda: ag.random_feature_attention(q, k, v, num_features=m, causal=causal)  # noqa: E731
        exact_bwd = lambda: ag.softmax_attention_backward(q, k, v, dy, causal=causal)  # noqa: E731
        favor_bwd = lambda: ag.random_feature_attention_backward(q, k, v, dy, num_features=m,  # noqa: E731
                                                                  causal=causal)
        t_exact, t_favor = median_time(exact, args.repeats), median_time(favor, args.repeats)
        t_exact_bwd, t_favor_bwd = median_time(exact_bwd, args.repeats), median_time(favor_bwd, args.repeats)
        case = f"{dtype} causal={causal} n={n}"
        err_exact = check(f"exact {case}", TOLERANCE[dtype], exact(), exact_bwd(), reference(q, k, v, dy, causal))
        err_favor = check(f"favor {case}", TOLERANCE[dtype], favor(), favor_bwd(), reference(q, k, v, dy, causal, W))
        ratio, ratio_bwd = t_favor / t_exact, t_favor_bwd / t_exact_bwd
        case = f"{dtype}, causal={causal}"
        if crossings.get(case) is None:
            crossings[case] = n if ratio < 1 else None
        if crossings_bwd.get(case) is None:
            crossings_bwd[case] = n if ratio_bwd < 1 else None
        rows.append({"dtype": dtype, "causal": causal, "n": n, "t_exact": t_exact, "t_favor": t_favor, "ratio": ratio,
                     "t_exact_bwd": t_exact_bwd, "t_favor_bwd": t_favor_bwd, "ratio_bwd": ratio_bwd,
                     "max_rel_error_exact": err_exact, "max_rel_error_favor": err_favor})
        print(f"{dtype:>7}  {str(causal):>6}  {n:>5}  {t_exact * 1e3:>10.2f}  {t_favor * 1e3:>10.2f}  {ratio:>6.2f}"
              f"  |  {t_exact_bwd * 1e3:>18.2f}  {t_favor_bwd * 1e3:>10.2f}  {ratio_bwd:>6.2f}"
              f"  |  {err_exact:.1e}  {err_favor:.1e}", flush=True)
    print("crossover n (first n where FAVOR+ is faster):", crossings, f"; flop theory ~2 m = {2 * m}")
    print("backward crossover n:", crossings_bwd)
    return finish(args.out, "bench_random_features", meta=machine(features=m, d=d, heads=heads, repeats=args.repeats,
                                                                    torch=torch.__version__),
                  threads=threads, rows=rows, crossover=crossings, crossover_backward=crossings_bwd)


if __name__ == "__main__":
    sys.exit(main())
