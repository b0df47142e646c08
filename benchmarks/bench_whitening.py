"""The whitening recursion: attngeom against a NumPy loop, the blocked scan against the
sequential recursion, GFLOP/s against the GEMM ceiling; and how well the block-tridiagonal
model whitens vector AR(1) processes as their correlation grows.

For T in {1024, 4096}, D in {16, 64, 256}, batch in {1, 32} (float64):
  np/ours     time of a NumPy/SciPy loop (one GEMM and one triangular solve per step) over ours
  scan/seq    time of whiten_scan (best of blocks 64, 256) over whiten (below 1: the scan wins)
  GF/s        our rate, counting 3 B T D^2 flops (GEMM + triangular solve per step)
  %ceil       against one (B T, D) x (D, D) GEMM of the core (the same work in a single product)

Times are medians of --repeats calls (default 3) after a warm-up. whiten and whiten_scan
(each block size timed) are compared with the NumPy loop (harness.agree, relative to the
loop's largest entry) with tolerance 1e-10: the measured agreement is about 1e-15 (a
stable filter, so rounding does not grow along the sequence) and a wrong step gives O(1);
beyond it the exit status is 1. The GEMM ceiling computes no whitened output and has
nothing to compare. The AR(1) table has no second answer to compare with: it reports how
white the filter's output is, next to white noise of the same size as the reference value.
--quick: T = 256, D in {16, 64}, batch in {1, 4}.

  python benchmarks/bench_whitening.py [--out DIR] [--repeats R] [--threads N] [--quick]
"""
from __future__ import annotations

import sys

import numpy as np
import scipy.linalg as sl

import attngeom as ag
from attngeom.experiments.timing import median_time
from attngeom import _core
from harness import agree, finish, machine, parse, parser, print_threads

TOLERANCE = 1e-10  # float64, relative to the NumPy loop's largest entry; see the docstring

def numpy_whiten(x, L, M):
    w = np.empty_like(x)
    prev = None
    for i in range(x.shape[1]):
        r = x[:, i] if prev is None else x[:, i] - prev @ M.T
        prev = sl.solve_triangular(L, r.T, lower=True).T
        w[:, i] = prev
    return w


def ar1_report(rng):
    """Psi of vector AR(1) inputs and of their whitened outputs as the correlation grows."""
    B, T, D = 2000, 16, 4
    Q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    white = float(np.mean([ag.whiteness(np.random.default_rng(s).standard_normal((B, T, D))) for s in range(3)]))
    rows = []
    for phi in (0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.6, 0.8):
        x = ag.vector_ar1(phi * Q, B, T, seed=1)
        row = {"phi": phi, "psi_x": ag.whiteness(x), "psi_white_noise": white}
        try:
            Ls, Ms = ag.block_cholesky_factors(*ag.block_covariances(x), T)
            row["psi_w"] = ag.whiteness(ag.whiten(x, Ls, Ms))
        except ValueError as exc:
            row["psi_w"] = None
            row["error"] = str(exc).split(":")[0]
        rows.append(row)
    return rows


def main(argv=None):
    args = parse(parser(__doc__, threads=True), argv)
    rng = np.random.default_rng(0)
    rows = []
    print(f"whitening recursion, float64, medians of {args.repeats} calls after a warm-up; rel = largest error of "
          "whiten / whiten_scan relative to the NumPy loop")
    threads = print_threads()
    print("     T    D   B   ours [ms]   np/ours  scan/seq (block)   GF/s  %ceil       rel")
    sizes = ((256,), (16, 64), (1, 4)) if args.quick else ((1024, 4096), (16, 64, 256), (1, 32))
    for T in sizes[0]:
        for D in sizes[1]:
            for B in sizes[2]:
                x = rng.standard_normal((B, T, D))
                G = rng.standard_normal((D, D))
                L = np.linalg.cholesky(np.eye(D) * D + G @ G.T)
                M = rng.standard_normal((D, D))
                M *= 0.8 / np.max(np.abs(np.linalg.eigvals(np.linalg.solve(L, M))))  # a stable filter
                t_ours = median_time(lambda: ag.whiten(x, L, M), args.repeats)
                t_np = median_time(lambda: numpy_whiten(x, L, M), args.repeats)
                scans = {blk: median_time(lambda: ag.whiten_scan(x, L, M, block=blk), args.repeats)
                         for blk in (64, 256)}
                blk, t_scan = min(scans.items(), key=lambda kv: kv[1])
                a = np.ascontiguousarray(x.reshape(1, B * T, D))
                b = np.ascontiguousarray(L.T[None])
                t_gemm = median_time(lambda: _core.batched_gemm(a, b), args.repeats)
                want = numpy_whiten(x, L, M)
                case = f"T={T} D={D} B={B}"
                err = max(agree(f"{name} {case}", w, want, rtol=TOLERANCE, show=False)["max_rel_error"]
                          for name, w in [("whiten", ag.whiten(x, L, M))]
                          + [(f"whiten_scan block {k}", ag.whiten_scan(x, L, M, block=k)) for k in scans])
                ok = err <= TOLERANCE
                gf = 3 * B * T * D * D / t_ours / 1e9
                gf_gemm = 2 * B * T * D * D / t_gemm / 1e9
                row = {"T": T, "D": D, "B": B, "t_ours": t_ours, "t_numpy": t_np, "np/ours": t_np / t_ours,
                       "t_scan": t_scan, "scan_block": blk, "scan/seq": t_scan / t_ours, "gflops": gf,
                       "gflops_gemm": gf_gemm, "fraction_of_ceiling": gf / gf_gemm, "max_rel_error": err,
                       "correct": ok}
                rows.append(row)
                print(f"{T:>6} {D:>4} {B:>3}  {t_ours * 1e3:>10.2f}  {t_np / t_ours:>8.1f}  {t_scan / t_ours:>8.2f}"
                      f" ({blk:>3})  {gf:>6.2f}  {100 * gf / gf_gemm:>4.0f}%  {err:.1e}"
                      + ("" if ok else "  DISAGREES"), flush=True)
    print("vector AR(1) (Phi = phi Q, Q orthogonal), B = 2000, T = 16, D = 4: whiteness before / after the")
    print("exact block-tridiagonal filter (white noise of the same size for reference; no second answer to gate on)")
    ar = ar1_report(rng)
    for r in ar:
        after = f"{r['psi_w']:.4f}" if r["psi_w"] is not None else r["error"]
        print(f"  phi {r['phi']:.2f}: Psi_X {r['psi_x']:.4f}  Psi_W {after}  (white noise {r['psi_white_noise']:.4f})")
    return finish(args.out, "bench_whitening", meta=machine(repeats=args.repeats), threads=threads, rows=rows, ar1=ar,
                  ar1_note="no second answer: whiteness of the filter's output, white noise as the reference value")


if __name__ == "__main__":
    sys.exit(main())
