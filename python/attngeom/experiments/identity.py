"""The exact Laplace-Radon identity on random heads (Lawrence, Laplace-Radon Theorem 1).

For random single heads (Gaussian tokens, weights scaled by 1 / sqrt(d_model)) compare
softmax attention with N / Z computed from the Radon projections s = u.k of the keys along
each query's tilt u and Laplace radius tau (eq. 14), and record the radii and one query's
transform for the figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import plotting
from ..attention import softmax_attention
from ..laplace_radon import laplace_radon_attention, laplace_radon_transform, radon_project, tilt_radius
from ._result import ExperimentConfig, ExperimentResult


@dataclass
class IdentityConfig(ExperimentConfig):
    n_heads: int = 8
    d_model: int = 96
    d_k: int = 32
    d_v: int = 48
    n_tokens: int = 64
    n_examples: int = 64
    causal: bool = False


@dataclass
class IdentityResult(ExperimentResult):
    config: IdentityConfig
    rel_error_per_head: np.ndarray  # (n_heads,) max |y_LR - y_softmax| / max |y_softmax|
    rel_error_float32: float  # the same identity computed in float32
    tau: np.ndarray  # (n_heads, n_examples, n_tokens) Laplace radii
    projection: np.ndarray = field(repr=False, default=None)  # s = u.k for one query, (n_tokens,)
    tau_query: float = 0.0
    tau_grid: np.ndarray = field(repr=False, default=None)
    Z_real: np.ndarray = field(repr=False, default=None)  # log Z(u, t) on the real grid
    omega: np.ndarray = field(repr=False, default=None)
    Z_imag: np.ndarray = field(repr=False, default=None)  # Z(u, i omega) (characteristic function)

    DESCRIPTIONS = (
        (r"laplace_radon_rel_error_max", "softmax vs Laplace-Radon N / Z, worst head (relative)"),
        (r"laplace_radon_rel_error_mean", "softmax vs Laplace-Radon N / Z, mean over heads"),
        (r"laplace_radon_rel_error_float32", "the same identity computed in float32"),
        (r"tau_mean", "mean Laplace radius tau = norm(q) / sqrt(d_k)"),
        (r"tau_std", "standard deviation of the radii"),
        (r"n_heads", "number of random heads"),
    )

    def summary(self) -> dict:
        return {
            "laplace_radon_rel_error_max": float(self.rel_error_per_head.max()),
            "laplace_radon_rel_error_mean": float(self.rel_error_per_head.mean()),
            "laplace_radon_rel_error_float32": float(self.rel_error_float32),
            "tau_mean": float(self.tau.mean()),
            "tau_std": float(self.tau.std()),
            "n_heads": int(self.config.n_heads),
        }

    def figures(self) -> dict:
        return {"identity_errors.png": self.plot_errors(), "radii.png": self.plot_radii(),
                "transform.png": self.plot_transform()}

    def plot_errors(self, ax=None):
        """Per-head relative error of the identity (bars), against float64 machine epsilon."""
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3))
        ax.bar(np.arange(len(self.rel_error_per_head)), np.maximum(self.rel_error_per_head, 1e-18), color="tab:blue")
        ax.axhline(np.finfo(np.float64).eps, color="k", ls="--", lw=1, label="float64 eps")
        ax.set_yscale("log")
        return plotting.finish(fig, ax, "head", "relative error", "Laplace-Radon identity: N/Z vs softmax", legend=True)

    def plot_radii(self, ax=None):
        """Histogram of the Laplace radii tau = ``|q|`` / sqrt(d_k) of every query."""
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3))
        ax.hist(np.ravel(self.tau), bins=60, color="tab:orange", alpha=0.85)
        return plotting.finish(fig, ax, r"radius $\tau = |q| / \sqrt{d_k}$", "queries", "Laplace radii")

    def plot_transform(self, axes=None):
        """Three panels for one query: the Radon projection s = u.k of the keys (a stem plot of
        the discrete measure), log Z(u, tau) on real tau (the CGF, the query's own tau marked),
        and ``|Z(u, i w)|``, the modulus of the characteristic function."""
        fig, axes = plotting.panel_row(axes, 3, 4.0)
        ax = axes[0]
        ax.stem(self.projection, np.ones_like(self.projection), basefmt=" ")
        ax.set_xlabel(r"$s = u \cdot k$")
        ax.set_yticks([])
        ax.set_title(r"Radon projection $(\mathcal{R}\mu)(u, s)$")
        ax = axes[1]
        ax.plot(self.tau_grid, self.Z_real)
        ax.axvline(self.tau_query, color="k", ls=":", lw=1, label=r"query's $\tau$")
        ax.set_xlabel(r"$\tau$")
        ax.set_ylabel(r"$\log Z(u, \tau)$")
        ax.set_title("Laplace transform (CGF)")
        ax.legend(frameon=False)
        ax = axes[2]
        ax.plot(self.omega, np.abs(self.Z_imag))
        ax.set_xlabel(r"$\omega$")
        ax.set_ylabel(r"$|Z(u, i\omega)|$")
        ax.set_title("characteristic function")
        fig.tight_layout()
        return fig


def run_identity(config: IdentityConfig = IdentityConfig()) -> IdentityResult:
    """Run the identity check; deterministic given ``config.seed``.

    Example: ``res = run_identity(IdentityConfig(seed=1)); res.summary()``
    """
    c = config.check()
    rng = np.random.default_rng(c.seed)
    x = rng.standard_normal((c.n_examples, c.n_tokens, c.d_model))
    s = 1 / np.sqrt(c.d_model)
    w_q = rng.standard_normal((c.n_heads, 1, c.d_model, c.d_k)) * s
    w_k = rng.standard_normal((c.n_heads, 1, c.d_model, c.d_k)) * s
    w_v = rng.standard_normal((c.n_heads, 1, c.d_model, c.d_v)) * s
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (n_heads, n_examples, n_tokens, d)
    y = softmax_attention(q, k, v, causal=c.causal)
    u, tau = tilt_radius(q)
    y_lr = laplace_radon_attention(u, tau, k, v, causal=c.causal)
    err = np.abs(y_lr - y).reshape(c.n_heads, -1).max(1) / np.abs(y).reshape(c.n_heads, -1).max(1)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    y32 = softmax_attention(q32, k32, v32, causal=c.causal)
    y32_lr = laplace_radon_attention(*tilt_radius(q32), k32, v32, causal=c.causal)
    err32 = float(np.abs(y32_lr - y32).max() / np.abs(y32).max())

    u0, k0 = u[0, 0, :1], k[0, 0]
    grid = np.linspace(-4, 4, 161)
    real = laplace_radon_transform(np.repeat(u0, grid.size, 0), grid, k0, log_domain=True).log_Z
    w = np.linspace(0, 12, 241)
    imag = laplace_radon_transform(np.repeat(u0, w.size, 0), 1j * w, k0).Z
    return IdentityResult(config=c, rel_error_per_head=err, rel_error_float32=err32, tau=tau,
                          projection=radon_project(u0, k0)[0], tau_query=float(tau[0, 0, 0]), tau_grid=grid,
                          Z_real=real, omega=w, Z_imag=imag)
