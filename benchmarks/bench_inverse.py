"""The inverse pipeline: matrix-pencil node recovery against a NumPy/SciPy implementation of
the same method, the node-error curve under noise, and filtered backprojection / SART against
scikit-image on the Shepp-Logan phantom.

  np/ours    time of a NumPy loop (Hankel SVD, pencil eigenvalues, Vandermonde least squares,
             one problem at a time) over ours (the batch in C++, OpenMP over problems)
  sk/ours    time of scikit-image over ours; err ratio = our RMS error / scikit-image's

Times are medians of --repeats calls (default 3) after a warm-up, the anchors' too. The
outputs are gated against the anchors (harness.agree; the exit status is 1 beyond a
tolerance): the order found for each problem equals the NumPy loop's, its nodes agree to
1e-6 relative (measured: 2e-12 at 8 nodes, 3e-8 at 32, where the Hankel matrix is
ill-conditioned; a wrong node is off by O(0.01)) and its weights (all 1) to 1e-2 (measured:
1e-4 at 16 and 32 nodes, the node error amplified by the Vandermonde least squares; a
wrong or missing node moves a weight by O(1)); radon and FBP agree with
scikit-image's to 1e-10 relative (the same projector and filter: measured 2e-14). SART uses
another projector than scikit-image's, so its images differ; the gate is its RMS error
against the phantom, which may not exceed scikit-image's by more than 10% (measured: 0.7x
of it). The noise table has no second answer to compare (node error against the truth as
the noise grows); the missing-wedge rows gate FBP against scikit-image as above.
--quick: fewer and smaller problems.

  python benchmarks/bench_inverse.py [--out DIR] [--repeats R] [--threads N] [--quick]
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

import attngeom as ag
from attngeom.experiments.timing import median_time
from harness import agree, finish, machine, parse, parser, print_threads

NODE_TOLERANCE = 1e-6    # nodes against the NumPy loop, relative; see the docstring
WEIGHT_TOLERANCE = 1e-2  # weights against the NumPy loop, relative
IMAGE_TOLERANCE = 1e-10  # radon and FBP against scikit-image, relative
SART_TOLERANCE = 0.1     # SART's RMS error may exceed scikit-image's by this fraction

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


def pencil_rows(rng, repeats, sizes):
    rows = []
    for n, B in sizes:
        tau = 1j * 2.5 * np.arange(128)
        S = np.sort(rng.uniform(-1, 1, (B, n)), axis=1)
        F = np.exp(np.einsum("k,bn->bkn", tau, S)).sum(-1)
        ours = ag.fit_exponential_sum(tau, F)
        ref = [numpy_pencil(tau, F[b], 64) for b in range(B)]
        ok = ours.order == n
        err_ours = float(np.max(np.abs(ours.nodes[ok] - S[ok]))) if ok.any() else float("nan")
        ref_ok = [b for b in range(B) if len(ref[b][0]) == n]
        err_np = float(max(np.max(np.abs(ref[b][0] - S[b])) for b in ref_ok)) if ref_ok else float("nan")
        both = [b for b in ref_ok if ok[b]]
        agree(f"pencil n={n} B={B} order", ours.order, [len(r[0]) for r in ref], rtol=0)
        agree(f"pencil n={n} B={B} nodes", ours.nodes[both], [ref[b][0] for b in both], rtol=NODE_TOLERANCE)
        agree(f"pencil n={n} B={B} weights", ours.weights[both].real, [ref[b][1] for b in both],
              rtol=WEIGHT_TOLERANCE)
        t_ours = median_time(lambda: ag.fit_exponential_sum(tau, F), repeats)
        t_np = median_time(lambda: [numpy_pencil(tau, F[b], 64) for b in range(B)], repeats)
        rows.append({"n": n, "batch": B, "ours_ms": 1e3 * t_ours, "np_over_ours": t_np / t_ours,
                     "order_correct_ours": float(ok.mean()), "order_correct_np": len(ref_ok) / B,
                     "max_node_error_ours": err_ours, "max_node_error_np": err_np})
        print(f"  n={n:3d} B={B:4d}  ours {1e3 * t_ours:8.1f} ms  np/ours {t_np / t_ours:6.1f}  "
              f"order ok {ok.mean():.2f}/{len(ref_ok) / B:.2f}  node err vs truth {err_ours:.1e} / {err_np:.1e}")
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


def tomography_rows(repeats, sizes):
    try:
        from skimage import transform
    except ImportError:
        print("  scikit-image is not installed: it is this table's anchor (pip install scikit-image)")
        raise
    rows = []
    for size in sizes:
        img = ag.shepp_logan_phantom(size)
        theta = np.linspace(0, 180, size, endpoint=False)
        sino = ag.radon(img, theta)
        cases = {
            "radon": (lambda: ag.radon(img, theta), lambda: transform.radon(img, theta)),
            "fbp ramp": (lambda: ag.iradon(sino, theta), lambda: transform.iradon(sino, theta)),
            "sart x2": (lambda: ag.iradon_sart(sino, theta, iterations=2),
                        lambda: transform.iradon_sart(sino, theta, image=transform.iradon_sart(sino, theta))),
        }
        for name, (ours, theirs) in cases.items():
            t_ours = median_time(ours, repeats)
            t_sk = median_time(theirs, repeats)
            row = {"size": size, "case": name, "ours_ms": 1e3 * t_ours, "sk_over_ours": t_sk / t_ours}
            mine, anchor = ours(), theirs()
            if name != "radon":
                e_ours, e_sk = ag.rms_error(mine, img), ag.rms_error(anchor, img)
                row.update({"rms_ours": e_ours, "rms_skimage": e_sk, "error_ratio": e_ours / e_sk})
            if name == "sart x2":
                check = agree(f"{name} {size}: RMS error vs scikit-image's", e_ours, e_sk, rtol=SART_TOLERANCE,
                              above_only=True, show=False)
            else:
                check = agree(f"{name} {size} vs scikit-image", mine, anchor, rtol=IMAGE_TOLERANCE, show=False)
            row["agreement"] = check
            rows.append(row)
            extra = (f"  rms {row['rms_ours']:.4f} vs {row['rms_skimage']:.4f} (ratio {row['error_ratio']:.2f})"
                     if "rms_ours" in row else "")
            print(f"  {size:4d} {name:9s} ours {1e3 * t_ours:8.1f} ms  sk/ours {t_sk / t_ours:6.2f}{extra}  "
                  f"{'excess' if name == 'sart x2' else 'diff'} rel {check['max_rel_error']:.1e}"
                  + ("" if check["ok"] else "  DISAGREES"))
    size = sizes[0]
    for wedge in (30, 60, 90):
        img = ag.shepp_logan_phantom(size)
        theta = np.linspace(0, 180, size, endpoint=False)
        keep = ag.limited_angle(theta, wedge)
        sino = ag.radon(img, theta[keep])
        fbp = ag.iradon(sino, theta[keep])
        check = agree(f"fbp {size} missing wedge {wedge} vs scikit-image", fbp, transform.iradon(sino, theta[keep]),
                      rtol=IMAGE_TOLERANCE, show=False)
        row = {"size": size, "case": f"missing wedge {wedge}", "fbp_rms": ag.rms_error(fbp, img),
               "sart2_rms": ag.rms_error(ag.iradon_sart(sino, theta[keep], iterations=2), img), "agreement": check}
        rows.append(row)
        print(f"  missing wedge {wedge:2d} deg: FBP rms {row['fbp_rms']:.4f}, SART x2 rms {row['sart2_rms']:.4f}; "
              f"FBP vs scikit-image rel {check['max_rel_error']:.1e}" + ("" if check["ok"] else "  DISAGREES"))
    return rows


def main(argv=None):
    args = parse(parser(__doc__, threads=True), argv)
    rng = np.random.default_rng(0)
    print(f"inverse Laplace (matrix pencil), imaginary tau, 128 samples; medians of {args.repeats} calls after a "
          "warm-up")
    threads = print_threads()
    pencil = pencil_rows(rng, args.repeats, ((8, 32), (32, 16)) if args.quick else ((8, 256), (16, 256), (32, 64)))
    print("node error vs relative noise eta (n = 8 nodes at least 0.05 apart, 20 draws; no anchor: the error "
          "against the true nodes)")
    noise = noise_rows(rng)
    print("inverse Radon on the Shepp-Logan phantom (angles = size)")
    tomo = tomography_rows(args.repeats, (64,) if args.quick else (160, 256))
    return finish(args.out, "bench_inverse", meta=machine(repeats=args.repeats), threads=threads, pencil=pencil,
                  noise=noise, tomography=tomo)


if __name__ == "__main__":
    sys.exit(main())
