"""The exact Laplace-Radon identity on random heads (Lawrence, Laplace-Radon Theorem 1).

For random single heads (Gaussian tokens, weights scaled by 1 / sqrt(d_model)) compare
softmax attention with N / Z computed from the Radon projections s = u.k of the keys along
each query's tilt u and Laplace radius tau (eq. 14), and record the radii and one query's
transform for the figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..attention import softmax_attention
from ..laplace_radon import laplace_radon_attention, laplace_radon_transform, radon_project, tilt_radius
from ._result import ExperimentResult


@dataclass
class IdentityConfig:
    n_heads: int = 8
    d_model: int = 96
    d_k: int = 32
    d_v: int = 48
    n_tokens: int = 64
    n_examples: int = 64
    causal: bool = False
    seed: int = 0


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

    def summary(self) -> dict:
        return {
            "laplace_radon_rel_error_max": float(self.rel_error_per_head.max()),
            "laplace_radon_rel_error_mean": float(self.rel_error_per_head.mean()),
            "laplace_radon_rel_error_float32": float(self.rel_error_float32),
            "tau_mean": float(self.tau.mean()),
            "tau_std": float(self.tau.std()),
            "n_heads": int(self.config.n_heads),
        }

    def table(self) -> str:
        lines = ["| quantity | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in self.summary().items()]
        return "\n".join(lines)

    def figures(self) -> dict:
        return {"identity_errors.png": self.plot_errors(), "radii.png": self.plot_radii(),
                "transform.png": self.plot_transform()}

    def plot_errors(self, ax=None):
        """Per-head relative error of the identity, against float64 machine epsilon."""
        from .. import plotting

        return plotting.identity_errors(self.rel_error_per_head, ax=ax)

    def plot_radii(self, ax=None):
        """Histogram of the Laplace radii tau = |q| / sqrt(d_k) of every query."""
        from .. import plotting

        return plotting.radius_histogram(self.tau, ax=ax)

    def plot_transform(self, axes=None):
        """One query: its Radon projection, log Z on real tau and |Z| on imaginary tau."""
        from .. import plotting

        return plotting.transform_panels(self.projection, self.tau_query, self.tau_grid, self.Z_real, self.omega, self.Z_imag,
                                         axes=axes)


def run_identity(config: IdentityConfig = IdentityConfig()) -> IdentityResult:
    """Run the identity check; deterministic given ``config.seed``.

    Example: ``res = run_identity(IdentityConfig(seed=1)); res.summary()``
    """
    c = config
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
