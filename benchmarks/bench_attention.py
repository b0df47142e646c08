"""Softmax attention: attngeom against PyTorch CPU SDPA, NumPy and the batched-GEMM ceiling.

For float32/float64 and bfloat16 products, causal off/on, 1 and 2 threads and four
(batch, heads, n, d) shapes,
every contender runs on the same inputs, interleaved round by round after a warm-up; the
table reports medians and ratios measured in this run (never absolute-time assertions):

  torch/o   time of torch.nn.functional.scaled_dot_product_attention over ours (above 1 =
            attngeom faster). torch gets 4-D (batch, heads, n, d) tensors: that is what
            reaches its flash kernel (3-D tensors take its slower math path).
  o/numpy   our time over the plain NumPy reference (small shapes only)
  %ceil     our GFLOP/s as a fraction of the GEMM ceiling's: _core.batched_gemm of
            (n, n) @ (n, d) products doing the same flop count (flops = 4 B H n^2 d, or
            2 B H n^2 d when causal: the work needed)
  gauss/o, cauchy/o   kernel_attention (Gaussian, Cauchy) time over softmax attention's
  stats/o   softmax attention with return_stats=True (entropy, max weight, sink weight and
            mean distance of every query, in the same pass) over the plain call

The bfloat16 rows: ours is softmax_attention(..., products="bfloat16") on float32 arrays of
bfloat16 values (the CPU's bfloat16 dot products where it has them: show_config's
bf16_products), torch's SDPA takes the same values as torch.bfloat16 tensors (its bfloat16
flash path), and y is checked against the float64 reference at 1e-2 (both round the weights
to bfloat16: about 4e-3 measured), the statistics at 1e-4 (float32 softmax). The kernel
columns are float32 kernels and are left out of these rows.

Every output timed is checked so the benchmark never times wrong code (harness.agree; the
exit status is 1 beyond a tolerance): softmax attention against torch's SDPA and against a
float64 NumPy reference (computed head by head, so at every shape; its timing only where a
call takes under 5 s), the Gaussian and Cauchy kernels and the statistics of return_stats
(entropy, largest and sink weight, mean distance) against the same float64 NumPy reference
built from the formed weights, and each tiling of --blocks against the default one. The
tolerance, relative to the anchor's largest entry, is 1e-4 in float32 and 1e-11 in float64:
a clear factor above the agreement measured (about 1e-6 and 1e-15; torch's float32 SDPA
rounds like ours) and far below what a wrong scale, mask or normalisation gives. The
batched-GEMM ceiling computes no attention output and has nothing to compare. The JSON
records the build (instruction-set level, compiled levels) so a table always names what it
measured. --quick: one small shape, 3 rounds.

  python benchmarks/bench_attention.py [--out DIR] [--threads N ...] [--repeats R] [--blocks] [--dtype T] [--quick]

--blocks adds a sweep over the kernel's (block_q, block_k) tiling and reports the best.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time

import numpy as np

import attngeom as ag
from attngeom import _core
from harness import agree, finish, machine, parser, print_threads

SHAPES = [(2, 8, 1024, 64), (1, 4, 4096, 64), (8, 12, 256, 64), (1, 8, 2048, 128)]
DTYPES = [np.float32, np.float64, "bfloat16"]
NUMPY_LIMIT_S = 5.0  # skip the NumPy reference when one call would take longer
TOLERANCE = {np.float32: 1e-4, np.float64: 1e-11, "bfloat16": 1e-2}  # relative; see the docstring
BLOCK_SWEEP = [(bq, bk) for bq in (32, 64, 128, 256) for bk in (64, 128, 256, 512)]
KERNELS = {"gaussian": {"sigma": 4.0}, "cauchy": {"gamma": 4.0}}

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the benchmark extra is optional
    torch = None


def numpy_attention(q, k, v, causal):
    """Plain reference: softmax(q k^T / sqrt(d) [+ causal mask]) v."""
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.tril(np.ones((n_q, n_k), dtype=bool)), s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return s @ v


def reference(q, k, v, causal, kernel="exp", **params):
    """The float64 reference of (kernel) attention and of its statistics, one (batch, head)
    at a time from the formed weights P: y, and entropy, max_weight, sink_weight and
    mean_distance of every query (attngeom.attention_stats), each of q's leading shape + (n,)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    lead, n = q.shape[:-2], q.shape[-2]
    y = np.empty((int(np.prod(lead)), n, v.shape[-1]))
    stats = {f: np.empty((y.shape[0], n)) for f in ("entropy", "max_weight", "sink_weight", "mean_distance")}
    scale = 1.0 / math.sqrt(q.shape[-1])
    for b, (qb, kb, vb) in enumerate(zip(*(a.reshape(-1, *a.shape[-2:]) for a in (q, k, v)))):
        if kernel == "exp":
            logits = scale * qb @ kb.T
        else:  # psi(tau_i, s_ij) with tau_i = scale |q_i|, s_ij = u_i . k_j (attngeom.kernels)
            norm = np.linalg.norm(qb, axis=-1, keepdims=True)
            tau, s = scale * norm, (qb / norm) @ kb.T
            logits = (-(s - tau) ** 2 / (2 * params["sigma"] ** 2) if kernel == "gaussian"
                      else -np.log1p(((s - tau) / params["gamma"]) ** 2))
        if causal:
            logits = np.where(np.tri(n, dtype=bool), logits, -np.inf)
        P = np.exp(logits - logits.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        y[b] = P @ vb
        stats["entropy"][b] = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), axis=-1)
        stats["max_weight"][b] = P.max(-1)
        stats["sink_weight"][b] = P[:, 0]
        stats["mean_distance"][b] = np.sum(P * np.abs(np.arange(n)[:, None] - np.arange(n)), axis=-1)
    return y.reshape(lead + (n, v.shape[-1])), {f: a.reshape(lead + (n,)) for f, a in stats.items()}


def flops(batch, n, d, causal):
    return (2 if causal else 4) * batch * n * n * d


def gemm_ceiling(batch, n, d, causal, dtype, rng):
    """The GEMM ceiling: batched (n, n) @ (n, d) products with attention's flop count.

    One product per batch element is 2 n^2 d flops, the work of causal attention; the
    non-causal count (S = q k^T, then P v) is two of them. Operands are allocated once, so
    only the products and their small (n, d) outputs are timed.
    """
    p = rng.random((batch, n, n)).astype(dtype)
    v = rng.standard_normal((batch, n, d)).astype(dtype)
    calls = 1 if causal else 2
    return lambda: [_core.batched_gemm(p, v) for _ in range(calls)]


def time_interleaved(contenders, repeats):
    """Median seconds per contender; one warm-up call each, then `repeats` rounds."""
    for f in contenders.values():
        f()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, f in contenders.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def once(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def core_attention(q, k, v, causal, block_q, block_k):
    """The kernel with an explicit (block_q, block_k) tiling, bypassing the Python layer."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v = (a.reshape(-1, *a.shape[-2:]) for a in (q, k, v))
    args = {"batch": q.shape[0], "q": q, "q_index": None, "k": k, "k_index": None, "v": v, "v_index": None,
            "tau": None, "tau_index": None, "mask_keep": None, "mask_bias": None, "mask_index": None,
            "causal": int(causal)}
    return lambda: _core.softmax_attention(args, scale, False, False, block_q, block_k)[0]


def bench_case(dtype, causal, shape, repeats, sweep, rng):
    B, H, n, d = shape
    bf16 = dtype == "bfloat16"
    if bf16:  # float32 arrays of bfloat16 values, as the models' bfloat16 mode passes them
        q, k, v = (ag.models.bfloat16_to_float32(ag.models.float32_to_bfloat16(
            rng.standard_normal(shape).astype(np.float32))) for _ in range(3))
    else:
        q, k, v = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    products = "bfloat16" if bf16 else "float"
    row = {"dtype": "bfloat16" if bf16 else np.dtype(dtype).name, "causal": causal, "shape": list(shape),
           "flops": flops(B * H, n, d, causal), "threads": ag.get_num_threads()}
    notes = []

    ours = lambda: ag.softmax_attention(q, k, v, causal=causal, products=products)  # noqa: E731
    contenders = {"ours": ours, "gemm": gemm_ceiling(B * H, n, d, causal, q.dtype, rng),
                  "stats": lambda: ag.softmax_attention(q, k, v, causal=causal, return_stats=True, products=products)}
    for name, params in ({} if bf16 else KERNELS).items():
        contenders[name] = (lambda p=params, kn=name:
                            ag.kernel_attention(q, k, v, kernel=kn, causal=causal, **p))
    y = ours()
    tol = TOLERANCE[dtype]
    stats_tol = TOLERANCE[np.float32] if bf16 else tol  # the statistics come from float32 scores
    case = f"{row['threads']} threads {row['dtype']} causal={causal} {tuple(shape)}"
    checks = []
    ref_y, ref_stats = reference(q, k, v, causal)
    checks.append(agree(f"softmax vs numpy, {case}", y, ref_y, rtol=tol, show=False))
    y_stats, stats = contenders["stats"]()
    checks.append(agree(f"softmax return_stats y vs numpy, {case}", y_stats, ref_y, rtol=tol, show=False))
    for field, want in ref_stats.items():
        checks.append(agree(f"stats {field} vs numpy, {case}", getattr(stats, field), want, rtol=stats_tol,
                            show=False))
    for name, params in ({} if bf16 else KERNELS).items():
        want = reference(q, k, v, causal, name, **params)[0]
        checks.append(agree(f"{name} vs numpy, {case}", contenders[name](), want, rtol=tol, show=False))

    if torch is not None:
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))  # 4-D: torch's flash path
        if bf16:
            tq, tk, tv = (t.to(torch.bfloat16) for t in (tq, tk, tv))
        sdpa = lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
        contenders["torch"] = sdpa
        checks.append(agree(f"softmax vs torch, {case}", y, (sdpa().float() if bf16 else sdpa()).numpy(), rtol=tol,
                            show=False))
        row["maxrel_torch"] = checks[-1]["max_rel_error"]
    row["maxrel_numpy"] = max(c["max_rel_error"] for c in checks)

    med = time_interleaved(contenders, repeats)

    # The NumPy reference is timed on its own, after the others: OpenBLAS's worker threads
    # keep spinning for a while after each call and would slow whatever runs next.
    # Estimate it from one (batch, head) before committing to the full call.
    _, t_one = once(lambda: numpy_attention(q[:1, :1], k[:1, :1], v[:1, :1], causal))
    if t_one * B * H > NUMPY_LIMIT_S:
        notes.append("numpy not timed")
    else:
        med.update(time_interleaved({"numpy": lambda: numpy_attention(q, k, v, causal)}, max(3, repeats // 2)))
        time.sleep(0.5)
    row.update({f"t_{name}": t for name, t in med.items()})
    if "numpy" in med:
        row["ours/numpy"] = med["ours"] / med["numpy"]
    if "torch" in med:
        row["torch/ours"] = med["torch"] / med["ours"]
    for name in KERNELS:
        if name in med:
            row[f"{name}/ours"] = med[name] / med["ours"]
    row["stats/ours"] = med["stats"] / med["ours"]
    row["gflops_ours"] = row["flops"] / med["ours"] / 1e9
    row["gflops_gemm"] = row["flops"] / med["gemm"] / 1e9
    row["fraction_of_ceiling"] = row["gflops_ours"] / row["gflops_gemm"]

    if sweep:
        tiled = {(bq, bk): core_attention(q, k, v, causal, bq, bk) for bq, bk in BLOCK_SWEEP}
        for (bq, bk), f in tiled.items():
            checks.append(agree(f"blocks {bq}x{bk} vs default, {case}", f().reshape(y.shape), y, rtol=tol, show=False))
        swept = time_interleaved(tiled, max(3, repeats // 2))
        (bq, bk), t = min(swept.items(), key=lambda kv: kv[1])
        row["best_blocks"] = {"block_q": bq, "block_k": bk, "t": t, "gflops": row["flops"] / t / 1e9}
        row["block_times"] = {f"{a}x{b}": s for (a, b), s in swept.items()}

    row["correct"] = all(c["ok"] for c in checks)
    if not row["correct"]:
        notes.append(f"DISAGREES (tolerance {tol:g} relative)")
    row["notes"] = notes
    return row


def fmt(x, spec, width):
    return (format(x, spec) if x is not None else "-").rjust(width)


def print_row(row, sweep):
    cells = [
        f"{row['threads']:>2}", f"{row['dtype']:>7}", f"{str(row['causal']):>6}",
        f"{str(tuple(row['shape'])):>18}", f"{row['t_ours'] * 1e3:>9.1f}",
        fmt(row.get("torch/ours"), ".2f", 7), fmt(row.get("ours/numpy"), ".3f", 7),
        f"{row['gflops_ours']:>6.1f}", f"{row['gflops_gemm']:>6.1f}", f"{100 * row['fraction_of_ceiling']:>4.0f}%",
        fmt(row.get("gaussian/ours"), ".2f", 7), fmt(row.get("cauchy/ours"), ".2f", 8), f"{row['stats/ours']:>7.2f}",
        fmt(row.get("maxrel_torch"), ".1e", 8), fmt(row.get("maxrel_numpy"), ".1e", 8),
    ]
    if sweep:
        b = row["best_blocks"]
        cells.append(f"{b['block_q']:>4}x{b['block_k']:<4} {b['gflops']:>6.1f}")
    print("  ".join(cells) + ("   " + "; ".join(row["notes"]) if row["notes"] else ""), flush=True)


def main(argv=None):
    p = parser(__doc__, repeats=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="thread counts for attngeom and torch, each measured in turn (default: 1 2)")
    p.add_argument("--blocks", action="store_true", help="also sweep (block_q, block_k) of the kernel")
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], action="append",
                   help="restrict to this dtype (repeatable; default both)")
    p.add_argument("--shape", type=int, nargs=4, action="append", metavar=("B", "H", "N", "D"),
                   help="restrict to this (batch, heads, n, d) shape (repeatable)")
    args = p.parse_args(argv)

    if torch is None:
        print("torch is not importable: the PyTorch SDPA column is skipped (install the 'bench' extra)")
    config = ag.show_config(file=open(os.devnull, "w"))
    meta = machine(repeats=args.repeats, torch=torch.__version__ if torch is not None else None,
                   machine=platform.machine(), attngeom=config,
                   gemm_ceiling="batched (n, n) @ (n, d) products with the same flop count")
    print(f"softmax attention, attngeom level {config['isa']} (compiled: {config['isa_compiled']}), "
          f"median of {args.repeats} interleaved rounds after a warm-up; rel = largest error relative to the "
          "anchor's largest entry (numpy: the worst of every check of the row)")
    header = ["th", "  dtype", "causal", "     (B, H, n, d)", "ours [ms]", "torch/o", "o/numpy",
              "  GF/s", "gemmGF", "%ceil", "gauss/o", "cauchy/o", "stats/o", "rel:torch", "   numpy"]
    if args.blocks:
        header.append("best blocks  GF/s")

    shapes = [tuple(s) for s in args.shape] if args.shape else [(1, 2, 256, 32)] if args.quick else SHAPES
    rng = np.random.default_rng(0)
    rows, threads = [], {}
    for n_threads in args.threads:
        ag.set_num_threads(n_threads)
        if torch is not None:
            torch.set_num_threads(n_threads)
        threads[n_threads] = print_threads()
        print("  ".join(header))
        for dtype in [t for t in DTYPES if not args.dtype or (t if t == "bfloat16" else np.dtype(t).name) in args.dtype]:
            for causal in (False, True):
                for shape in shapes:
                    row = bench_case(dtype, causal, shape, args.repeats, args.blocks, rng)
                    print_row(row, args.blocks)
                    rows.append(row)

    return finish(args.out, "bench_attention", meta=meta, threads=threads, rows=rows)


if __name__ == "__main__":
    sys.exit(main())
