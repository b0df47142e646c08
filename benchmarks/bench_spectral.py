"""Spectral diagnostics: attngeom against SciPy / a plain NumPy loop, ratios measured in one run.

1. parameter_nulls for one head with d_model = 4096, d_k = 128 against
   scipy.linalg.null_space on the formed B = W_Q W_K^T (and on B^T for ker(B^T)); the
   subspaces are compared by their largest principal angle.
2. head_diagnostics on n_layers x n_heads random heads (default 12 x 12, d_model 768,
   d_head 64) with 4096 tokens (16 sequences of 256) against a plain NumPy loop doing the
   same work head by head (formed B and W_OV with dense SVDs, NumPy softmax, dense SVDs of
   P). The loop is timed on the first --numpy-heads heads and compared per head.

  python benchmarks/bench_spectral.py [--out DIR] [--threads N] [--numpy-heads H] [--repeats R] [--quick]

Timings are medians of --repeats calls (default 3) after a warm-up, for attngeom and the
anchors alike; the ratios (ours / anchor, lower = attngeom faster) are what to read, not the
absolute times.

The outputs are gated against the anchors (harness.agree; the exit status is 1 beyond a
tolerance): the nullities and ranks must be equal; the null spaces' largest principal angle
to SciPy's must be under 1e-8 rad (measured: about 1e-13); on the heads the NumPy loop
runs, the spectra (W_OV's singular values, the tilt and token eigenvalues, every routing
matrix's singular values) and the mean radius must agree to 1e-8 relative to the anchor's
largest entry (float64 throughout; measured: about 1e-14; the factored SVDs and the
streamed statistics take other paths to the same numbers, and a wrong head differs in the
first digit). --quick: smaller problems (d_model 1024; 3 x 4 heads of width 32).
"""
from __future__ import annotations

import math
import sys

import numpy as np
import scipy.linalg as sl

import attngeom as ag
from attngeom import _core
from attngeom.experiments.timing import timed
from harness import agree, finish, machine, parse, parser, print_threads

ANGLE_TOLERANCE = 1e-8     # radians, the null spaces' largest principal angle to SciPy's
SPECTRUM_TOLERANCE = 1e-8  # relative to the NumPy loop's largest entry; see the docstring


def bench_parameter_nulls(d_model, d_k, repeats, rng):
    W_Q = rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    W_K = rng.standard_normal((d_model, d_k)) / math.sqrt(d_model)
    ours, t_ours = timed(lambda: ag.parameter_nulls(W_Q, W_K), repeats, warm_up=True)

    def scipy_nulls():
        B = W_Q @ W_K.T
        return sl.null_space(B), sl.null_space(B.T)

    (ker_b, ker_bt), t_scipy = timed(scipy_nulls, repeats, warm_up=True)
    agree("parameter_nulls nullity of B", [ours.ker_B.dim, ours.ker_BT.dim], [ker_b.shape[1], ker_bt.shape[1]],
          rtol=0)
    angle_b = ours.ker_B.distance(ag.Subspace(ker_b))
    angle_bt = ours.ker_BT.distance(ag.Subspace(ker_bt))
    agree("parameter_nulls largest principal angle [rad]", [angle_b, angle_bt], [0.0, 0.0], rtol=0,
          atol=ANGLE_TOLERANCE)
    return {
        "d_model": d_model, "d_k": d_k, "t_ours": t_ours, "t_scipy": t_scipy, "ours/scipy": t_ours / t_scipy,
        "speedup": t_scipy / t_ours, "nullity_ours": ours.ker_B.dim, "nullity_scipy": ker_b.shape[1],
        "max_angle_ker_B": angle_b, "max_angle_ker_BT": angle_bt,
    }


def numpy_head(wq, wk, wv, wo, x, scale):
    """One head's diagnostics the plain way: formed matrices, dense SVDs, NumPy softmax; a
    dict named like ours's fields (see :func:`ours_head`)."""
    d_model = wq.shape[0]
    B = wq @ wk.T
    _, sb, vbh = np.linalg.svd(B)
    rank_b = int(np.sum(sb > d_model * np.finfo(float).eps * sb[0]))
    ker_b = vbh[rank_b:].T
    ker_wk = sl.null_space(wk.T)
    ker_wq = sl.null_space(wq.T)
    s_ov = np.linalg.svd(wv @ wo, compute_uv=False)
    q, k = x @ wq, x @ wk
    tau = scale * np.linalg.norm(q, axis=-1)
    u = (q / np.linalg.norm(q, axis=-1, keepdims=True)).reshape(-1, q.shape[-1])
    lam = np.linalg.eigvalsh(u.T @ u / len(u))
    n = u @ wk.T
    lam_n = np.linalg.eigvalsh(n.T @ n / len(n))
    logits = scale * q @ np.swapaxes(k, -1, -2)
    P = np.exp(logits - logits.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    sp = np.linalg.svd(P, compute_uv=False)
    return {"nullities": [ker_b.shape[1], ker_wk.shape[1], ker_wq.shape[1]], "ov_singular_values": s_ov[:wq.shape[1]],
            "radius_mean": tau.mean(), "tilt_eigenvalues": lam[::-1],
            "token_eigenvalues": lam_n[::-1][:wq.shape[1]], "routing_singular_values": sp}


def ours_head(d, l, h):
    """The fields of head (l, h) of head_diagnostics' result that :func:`numpy_head` computes."""
    tilt = d.tilt[l, h]
    return {"nullities": [d.nulls.ker_B[l, h].dim, d.nulls.ker_WK_T[l, h].dim, d.nulls.ker_WQ_T[l, h].dim],
            "ov_singular_values": d.ov_singular_values[l, h], "radius_mean": d.radius_mean[l, h],
            "tilt_eigenvalues": tilt.eigenvalues, "token_eigenvalues": tilt.token_eigenvalues,
            "routing_singular_values": d.routing_singular_values[l, h]}


def bench_head_diagnostics(n_layers, n_heads, d_model, d_head, n_seq, n, numpy_heads, repeats, rng):
    s = 1 / math.sqrt(d_model)
    shape = (n_layers, n_heads, d_model, d_head)
    W_Q, W_K, W_V = (rng.standard_normal(shape) * s for _ in range(3))
    W_O = rng.standard_normal((n_layers, n_heads, d_head, d_model)) * s
    x = rng.standard_normal((n_layers, 1, n_seq, n, d_model))
    ours, t_ours = timed(lambda: ag.head_diagnostics(W_Q, W_K, W_V, W_O, x), repeats, warm_up=True)
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)][:numpy_heads]
    scale = 1 / math.sqrt(d_head)
    theirs, t_numpy = timed(lambda: [numpy_head(W_Q[l, h], W_K[l, h], W_V[l, h], W_O[l, h], x[l, 0], scale)
                                     for l, h in heads], repeats, warm_up=True)
    mine = [ours_head(ours, l, h) for l, h in heads]
    errors = {}
    for key in theirs[0]:
        exact = key == "nullities"
        check = agree(f"head_diagnostics {key} ({len(heads)} heads)", [m[key] for m in mine],
                      [t[key] for t in theirs], rtol=0 if exact else SPECTRUM_TOLERANCE)
        errors[key] = check["max_rel_error"]
    total = n_layers * n_heads
    per_ours, per_numpy = t_ours / total, t_numpy / len(heads)
    return {
        "n_layers": n_layers, "n_heads": n_heads, "d_model": d_model, "d_head": d_head, "tokens": n_seq * n,
        "n_seq": n_seq, "n": n, "t_ours_all_heads": t_ours, "t_numpy_heads_timed": len(heads), "t_numpy": t_numpy,
        "per_head_ours": per_ours, "per_head_numpy": per_numpy, "ours/numpy": per_ours / per_numpy,
        "max_rel_error": errors, "summary": ours.summary(),
    }


def main(argv=None):
    p = parser(__doc__, threads=True)
    p.add_argument("--numpy-heads", type=int, default=12, help="heads the NumPy loop is timed on")
    args = parse(p, argv)
    rng = np.random.default_rng(0)
    meta = machine(attngeom=dict(_core.build_config()), repeats=args.repeats)
    print(f"medians of {args.repeats} calls after a warm-up, attngeom and anchors alike")
    threads = print_threads()

    d_model, d_k = (1024, 64) if args.quick else (4096, 128)
    print(f"parameter_nulls, d_model {d_model}, d_k {d_k}: attngeom (factored) vs scipy.linalg.null_space on B",
          flush=True)
    pn = bench_parameter_nulls(d_model, d_k, args.repeats, rng)
    print(f"  ours {pn['t_ours'] * 1e3:.1f} ms, scipy {pn['t_scipy']:.2f} s: ours/scipy = {pn['ours/scipy']:.2e}"
          f" ({pn['speedup']:.0f}x faster); nullity {pn['nullity_ours']} vs {pn['nullity_scipy']}, "
          f"largest principal angle ker(B) {pn['max_angle_ker_B']:.1e}, ker(B^T) {pn['max_angle_ker_BT']:.1e}",
          flush=True)

    cfg = (3, 4, 256, 32, 8, 128) if args.quick else (12, 12, 768, 64, 16, 256)
    print(f"head_diagnostics, {cfg[0]} x {cfg[1]} heads, d_model {cfg[2]}, d_head {cfg[3]}, "
          f"{cfg[4] * cfg[5]} tokens ({cfg[4]} x {cfg[5]}): attngeom vs a NumPy loop", flush=True)
    hd = bench_head_diagnostics(*cfg, args.numpy_heads, args.repeats, rng)
    print(f"  ours {hd['t_ours_all_heads']:.2f} s for all {cfg[0] * cfg[1]} heads ({hd['per_head_ours'] * 1e3:.1f} ms"
          f"/head); NumPy loop {hd['per_head_numpy'] * 1e3:.1f} ms/head (timed on {hd['t_numpy_heads_timed']} heads):"
          f" ours/numpy = {hd['ours/numpy']:.3f}", flush=True)

    return finish(args.out, "bench_spectral", meta=meta, threads=threads, parameter_nulls=pn, head_diagnostics=hd)


if __name__ == "__main__":
    sys.exit(main())
