"""Regenerate the figures the README and the API reference show.

    python docs/make_figures.py            # writes docs/*.png

Every figure comes from the library itself, with a fixed seed, so the PNGs in the
repository are reproducible.
"""
import os

import numpy as np

import attngeom as ag

HERE = os.path.dirname(os.path.abspath(__file__))


def laplace_radon_identity(path):
    """Left: softmax attention against the Laplace-Radon transform N / Z (the same numbers by
    two code paths). Right: one query's weights over its keys, ordered by the projected
    coordinate s = u.k, for the exponential kernel (softmax) and two swapped kernels."""
    plt = ag.plotting.pyplot()
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((64, 16)), rng.standard_normal((96, 16)), rng.standard_normal((96, 8))
    y = ag.softmax_attention(q, k, v)
    u, tau = ag.tilt_radius(q)
    y_lr = ag.laplace_radon_attention(u, tau, k, v)
    rel = float(np.abs(y_lr - y).max() / np.abs(y).max())

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.8))
    ag.plotting.identity_scatter(y, y_lr, rel, "softmax attention  y = softmax(q k^T / sqrt(d)) v",
                                 "Laplace-Radon  y = N(u, tau) / Z(u, tau)", ax=ax0)
    ax0.set_title(f"the identity (Laplace-Radon Thm 1): max rel. error {rel:.1e}", fontsize="medium")

    s = ag.radon_project(u[:1], k)[0]
    order = np.argsort(s)
    for kernel, params, style in [("exp", {}, "-"), ("gaussian", {"sigma": 0.5}, "--"), ("cauchy", {"gamma": 0.5}, ":")]:
        _, P = ag.laplace_radon_attention(u[:1], tau[:1], k, v, kernel=kernel, return_routing=True, **params)
        label = kernel if not params else f"{kernel} ({', '.join(f'{a}={b}' for a, b in params.items())})"
        ax1.plot(s[order], P[0, order], style, lw=1.5, label=label)
    ax1.set_xlabel("projected coordinate s = u . k of each key (query 0)")
    ax1.set_ylabel("attention weight of the key")
    ax1.set_title(f"one query (radius tau = {tau[0]:.2f}): kernels on s", fontsize="medium")
    ax1.legend(frameon=False, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")
    laplace_radon_identity(os.path.join(HERE, "tomography_identity.png"))
    print("wrote", os.path.join(HERE, "tomography_identity.png"))
