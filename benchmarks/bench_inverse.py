"""The inverse pipeline: matrix-pencil node recovery against a NumPy/SciPy implementation of
the same method, the node-error curve under noise, and filtered backprojection / SART against
scikit-image on the Shepp-Logan phantom.

  np/ours    time of a NumPy loop (Hankel SVD, pencil eigenvalues, Vandermonde least squares,
             one problem at a time) over ours (the batch in C++, OpenMP over problems)
  sk/ours    time of scikit-image over ours; err ratio = our RMS error / scikit-image's

  python benchmarks/bench_inverse.py [--out DIR] [--repeats R]
"""
from __future__ import annotations

import os
import platform
import statistics
import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import parse, parser, write



def numpy_pencil(tau, f, L):
    """The same method in NumPy for one problem: order by the largest log-gap."""
    N = len(f)
    Y = np.array([f[i:i + L + 1] for i in range(N - L)])
    _, sv, vh = np.linalg.svd(Y, full_matrices=False)
    floor = max(Y.shape) * np.finfo(float).eps * sv[0]
    r = int(np.sum(sv > floor))
    gaps = np.log(sv[:min(r, len(sv) - 1)]) - np.log(sv[1:min(r, len(sv) - 1) + 1])
    M = int(np.argmax(gaps)) + 1
    W = vh[:M].T
    z = np.linalg.eigvals(np.linalg.lstsq(W[:-1], W[1:], rcond=None)[0])
    s = np.sort((np.log(z) / (tau[1] - tau[0])).real)
    c = np.linalg.lstsq(np.exp(np.outer(tau, s)), f, rcond=None)[0]
    return s, c.real


def pencil_rows(rng, repeats):
    rows = []
    for n, B in ((8, 256), (16, 256), (32, 64)):
        tau = 1j * 2.5 * np.arange(128)
        S = np.sort(rng.uniform(-1, 1, (B, n)), axis=1)
        F = np.exp(np.einsum("k,bn->bkn", tau, S)).sum(-1)
        ours = ag.fit_exponential_sum(tau, F)
        ref = [numpy_pencil(tau, F[b], 64) for b in range(B)]
        ok = ours.order == n
        err_ours = float(np.max(np.abs(ours.nodes[ok] - S[ok]))) if ok.any() else float("nan")
        ref_ok = [b for b in range(B) if len(ref[b][0]) == n]
        err_np = float(max(np.max(np.abs(ref[b][0] - S[b])) for b in ref_ok)) if ref_ok else float("nan")
        t_ours = median_time(lambda: ag.fit_exponential_sum(tau, F), repeats)
        t_np = median_time(lambda: [numpy_pencil(tau, F[b], 64) for b in range(B)], max(1, repeats // 2))
        rows.append({"n": n, "batch": B, "ours_ms": 1e3 * t_ours, "np_over_ours": t_np / t_ours,
                     "order_correct_ours": float(ok.mean()), "order_correct_np": len(ref_ok) / B,
                     "max_node_error_ours": err_ours, "max_node_error_np": err_np})
        print(f"  n={n:3d} B={B:4d}  ours {1e3 * t_ours:8.1f} ms  np/ours {t_np / t_ours:6.1f}  "
              f"order ok {ok.mean():.2f}/{len(ref_ok) / B:.2f}  node err {err_ours:.1e} / {err_np:.1e}")
    return rows


def noise_rows(rng):
    rows = []
    tau = 1j * 2.5 * np.arange(128)
    for eta in (1e-8, 1e-6, 1e-4, 1e-3, 1e-2):
        errs, orders = [], []
        for _ in range(20):
            s = np.sort(rng.uniform(-1, 1, 8))
            while np.diff(s).min() < 0.05:  # resolvable nodes: a merged pair is not a noise effect
                s = np.sort(rng.uniform(-1, 1, 8))
            f = np.exp(np.outer(tau, s)).sum(1)
            noise = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / np.sqrt(2)
            fit = ag.fit_exponential_sum(tau, f + eta * np.linalg.norm(f) / np.sqrt(f.size) * noise)
            orders.append(int(fit.order))
            if fit.order == 8:
                errs.append(float(np.max(np.abs(fit.nodes - s))))
        rows.append({"eta": eta, "median_node_error": statistics.median(errs) if errs else None,
                     "max_node_error": max(errs) if errs else None, "max_order": max(orders), "min_order": min(orders)})
        print(f"  eta {eta:7.0e}: node error median {rows[-1]['median_node_error']:.1e} max "
              f"{rows[-1]['max_node_error']:.1e}; order in [{min(orders)}, {max(orders)}] (true 8)")
    return rows


def tomography_rows(repeats):
    try:
        from skimage import transform
    except ImportError:
        print("  scikit-image not installed: the anchor columns are skipped (pip install scikit-image)")
        return []
    rows = []
    for size in (160, 256):
        img = ag.shepp_logan_phantom(size)
        theta = np.linspace(0, 180, size, endpoint=False)
        sino = ag.radon(img, theta)
        cases = {
            "radon": (lambda: ag.radon(img, theta), lambda: transform.radon(img, theta), None, None),
            "fbp ramp": (lambda: ag.iradon(sino, theta), lambda: transform.iradon(sino, theta), 1, 1),
            "sart x2": (lambda: ag.iradon_sart(sino, theta, iterations=2),
                        lambda: transform.iradon_sart(sino, theta, image=transform.iradon_sart(sino, theta)), 1, 1),
        }
        for name, (ours, theirs, _, _) in cases.items():
            t_ours = median_time(ours, repeats)
            t_sk = median_time(theirs, max(1, repeats // 2))
            row = {"size": size, "case": name, "ours_ms": 1e3 * t_ours, "sk_over_ours": t_sk / t_ours}
            if name != "radon":
                e_ours, e_sk = ag.rms_error(ours(), img), ag.rms_error(theirs(), img)
                row.update({"rms_ours": e_ours, "rms_skimage": e_sk, "error_ratio": e_ours / e_sk})
            rows.append(row)
            extra = (f"  rms {row['rms_ours']:.4f} vs {row['rms_skimage']:.4f} (ratio {row['error_ratio']:.2f})"
                     if "rms_ours" in row else "")
            print(f"  {size:4d} {name:9s} ours {1e3 * t_ours:8.1f} ms  sk/ours {t_sk / t_ours:6.2f}{extra}")
    for wedge in (30, 60, 90):
        img = ag.shepp_logan_phantom(160)
        theta = np.linspace(0, 180, 160, endpoint=False)
        keep = ag.limited_angle(theta, wedge)
        sino = ag.radon(img, theta[keep])
        row = {"size": 160, "case": f"missing wedge {wedge}", "fbp_rms": ag.rms_error(ag.iradon(sino, theta[keep]), img),
               "sart2_rms": ag.rms_error(ag.iradon_sart(sino, theta[keep], iterations=2), img)}
        rows.append(row)
        print(f"  missing wedge {wedge:2d} deg: FBP rms {row['fbp_rms']:.4f}, SART x2 rms {row['sart2_rms']:.4f}")
    return rows


def main(argv=None):
    args = parse(parser(__doc__), argv)
    rng = np.random.default_rng(0)
    print(f"inverse Laplace (matrix pencil), imaginary tau, 128 samples, {ag.get_num_threads()} threads")
    pencil = pencil_rows(rng, args.repeats)
    print("node error vs relative noise eta (n = 8 nodes at least 0.05 apart, 20 draws)")
    noise = noise_rows(rng)
    print("inverse Radon on the Shepp-Logan phantom (angles = size)")
    tomo = tomography_rows(args.repeats)
    write(args.out, "bench_inverse", machine=platform.machine(), threads=ag.get_num_threads(), cpus=os.cpu_count(),
          pencil=pencil, noise=noise, tomography=tomo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
