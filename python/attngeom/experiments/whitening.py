"""Whitened self-attention (s.6): whiteness Psi and stationarity rho of vector AR(1) sequences.

For x_i = Phi x_{i-1} + e_i with Phi = phi Q (Q a fixed random rotation, so phi is the
correlation between neighbours), phi = 0..phi_max: the whiteness Psi_X of the sequences
(eq. 10-12), Psi_W after the block-tridiagonal whitening filter fitted to them (the exact
time-varying block Cholesky factors, and the steady-state factor of eq. 9), Psi_W / Psi_X,
and the first-order stationarity rho (eq. 13-14). The same for a non-stationary process whose
Phi_i = phi (1/2 + i / (T - 1)) Q drifts along the sequence (the same mean correlation;
stable while 3 phi / 2 < 1). A vector
AR(1) is not block-tridiagonal: its lag-1 truncation stops being positive definite beyond a
critical correlation, where Psi_W is reported as NaN ("breakdown"). White noise of the same
B, T, D gives the sampling floor of Psi. Finally the time of the blocked scan
(``whiten_scan``) over the sequential recursion (``whiten``) on the same inputs, in one run,
for one long sequence and for a batch of them, and their agreement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np

from .. import plotting
from ..whitening import (
    block_cholesky_factors,
    block_covariances,
    stationarity,
    steady_state_factor,
    vector_ar1,
    whiten,
    whiten_scan,
    whiteness,
)
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult
from .timing import median_time


KINDS = ("stationary", "drifting")


@dataclass
class WhiteningConfig(ExperimentConfig):
    batch: int = 2000  # B sequences (Psi and rho are statistics over the batch)
    T: int = 16
    D: int = 4
    phi_max: float = 0.6
    n_phi: int = 13  # phi = linspace(0, phi_max, n_phi)
    phi_ref: float = 0.3  # the summary's reference correlation (nearest grid point)
    white_draws: int = 3  # white-noise draws for the Psi floor
    timing_T: int = 4096
    timing_D: int = 16
    timing_batch: int = 32  # the "many sequences" case (the other is one sequence)
    timing_block: int = 64
    timing_repeats: int = 5

    MINIMUMS = {"n_phi": 2, "T": 2}


@dataclass
class WhiteningResult(ExperimentResult):
    config: WhiteningConfig
    phi: np.ndarray  # (n_phi,)
    psi_x: Dict[str, np.ndarray]  # kind -> (n_phi,) whiteness of the input
    psi_w: Dict[str, np.ndarray]  # kind -> (n_phi,) after the exact (time-varying) filter; NaN: no model
    psi_w_steady: Dict[str, np.ndarray]  # kind -> (n_phi,) after the steady-state filter
    rho: Dict[str, np.ndarray]  # kind -> (n_phi,) first-order stationarity of the input
    psi_white: float  # whiteness of white noise of the same (B, T, D)
    timing: Dict[str, Dict[str, float]]  # "B=1", "B=<timing_batch>" -> {"recursion", "scan"} seconds
    scan_rel_error: float  # max |scan - recursion| / max |recursion| over the timing inputs

    DESCRIPTIONS = (
        (r"phi_ref", "AR(1) coefficient where the scalars below are read"),
        (r"psi_white_noise", "whiteness Psi of white noise of the same size (the noise floor)"),
        (r"psi_x_(\w+)", "whiteness Psi of the input x, {0} process (eq. 10-12)"),
        (r"psi_w_(\w+)", "whiteness Psi after whitening, {0} process"),
        (r"relative_whiteness_min_(\w+)", "smallest Psi_W / Psi_X over the grid, {0} process"),
        (r"relative_whiteness_(\w+)", "Psi_W / Psi_X (below 1: whiter), {0} process"),
        (r"rho_(\w+)", "first-order stationarity rho (eq. 13-14), {0} process"),
        (r"breakdown_phi_(\w+)", "smallest phi where the lag-1 model is not positive definite, {0}"),
        (r"recursion_ms_(\w+)", "time of the sequential recursion in ms, {0}"),
        (r"scan_over_recursion_(\w+)", "time of the blocked scan over the recursion's, {0}"),
        (r"scan_rel_error", "scan vs recursion, relative difference"),
    )

    def relative_whiteness(self, kind="stationary") -> np.ndarray:
        """Psi_W / Psi_X (n_phi,): below 1 where the filter whitens."""
        return self.psi_w[kind] / self.psi_x[kind]

    def breakdown_phi(self, kind="stationary") -> float:
        """Smallest phi of the grid where the lag-1 model is not positive definite (NaN if none)."""
        bad = np.flatnonzero(np.isnan(self.psi_w[kind]))
        return float(self.phi[bad[0]]) if bad.size else float("nan")

    def summary(self) -> dict:
        """Named scalars at phi_ref, the breakdown points, the timing ratios; the curves under "sweep"."""
        i = int(np.argmin(np.abs(self.phi - self.config.phi_ref)))  # the grid point nearest phi_ref
        out = {"phi_ref": float(self.phi[i]), "psi_white_noise": self.psi_white}
        for kind in KINDS:
            rel = self.relative_whiteness(kind)
            out[f"psi_x_{kind}"] = float(self.psi_x[kind][i])
            out[f"psi_w_{kind}"] = float(self.psi_w[kind][i])
            out[f"relative_whiteness_{kind}"] = float(rel[i])
            out[f"rho_{kind}"] = float(self.rho[kind][i])
            out[f"relative_whiteness_min_{kind}"] = float(np.nanmin(rel[1:])) if np.any(np.isfinite(rel[1:])) else float("nan")
            out[f"breakdown_phi_{kind}"] = self.breakdown_phi(kind)
        for case, t in self.timing.items():
            tag = case.replace("=", "")
            out[f"recursion_ms_{tag}"] = 1e3 * t["recursion"]
            out[f"scan_over_recursion_{tag}"] = t["scan"] / t["recursion"]
        out["scan_rel_error"] = self.scan_rel_error
        out["sweep"] = {"phi": self.phi.tolist(),
                        **{f"{name}_{kind}": [None if np.isnan(v) else float(v) for v in getattr(self, name)[kind]]
                           for name in ("psi_x", "psi_w", "psi_w_steady", "rho") for kind in KINDS}}
        return out

    def plot_whiteness(self, axes=None):
        """Psi_X, Psi_W (exact and steady-state filter) and Psi_W / Psi_X against phi."""
        floor = np.full(self.phi.shape, self.psi_white)
        curves = {}
        for kind in KINDS:
            curves[rf"$\Psi_X$ {kind}"] = self.psi_x[kind]
            curves[rf"$\Psi_W$ {kind}"] = self.psi_w[kind]
        curves[r"$\Psi_W$ steady-state filter, stationary"] = self.psi_w_steady["stationary"]
        curves["white noise"] = floor
        rel = {kind: self.relative_whiteness(kind) for kind in KINDS}
        return plotting.curve_panels(self.phi, [("whiteness $\\Psi$", curves, "log"),
                                                (r"$\Psi_W / \Psi_X$", rel, "linear")],
                                     r"AR(1) correlation $\phi$", xscale="linear", axes=axes,
                                     title="block-tridiagonal whitening of vector AR(1) sequences (NaN: no model)")

    def plot_stationarity(self, ax=None):
        """rho (eq. 14) of the stationary and the drifting process against phi."""
        return plotting.curve_panels(self.phi, [(r"stationarity $\rho$", dict(self.rho), "log")],
                                     r"AR(1) correlation $\phi$", xscale="linear", axes=None if ax is None else [ax])

    def plot_timing(self, ax=None):
        """Milliseconds of the recursion and the blocked scan on the same inputs, grouped by batch size."""
        c = self.config
        groups = list(self.timing)
        series = {"recursion (whiten)": [1e3 * self.timing[g]["recursion"] for g in groups],
                  f"blocked scan (block {c.timing_block})": [1e3 * self.timing[g]["scan"] for g in groups]}
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3.2))
        x = np.arange(len(groups))
        width = 0.8 / len(series)
        for i, (name, values) in enumerate(series.items()):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
        ax.set_xticks(x)
        ax.set_xticklabels(groups)
        ax.set_ylabel("time [ms]")
        ax.set_title(f"T = {c.timing_T}, D = {c.timing_D}", fontsize=10)
        ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return fig

    def figures(self) -> dict:
        return {"whiteness.png": self.plot_whiteness(), "stationarity.png": self.plot_stationarity(),
                "scan_timing.png": self.plot_timing()}


def run_whitening(config: WhiteningConfig = WhiteningConfig()) -> WhiteningResult:
    """Run the whitening experiment; deterministic given ``config.seed`` (except the timings).

    Example: ``res = run_whitening(WhiteningConfig(batch=500)); res.summary()["relative_whiteness_stationary"]``
    """
    c = config.check()
    rng = np.random.default_rng(c.seed)
    Q = np.linalg.qr(rng.standard_normal((c.D, c.D)))[0]
    phi = np.linspace(0.0, c.phi_max, c.n_phi)
    ramp = np.linspace(0.5, 1.5, c.T)[:, None, None]  # drifting: Phi_i = phi (1/2 + i / (T - 1)) Q
    psi_x = {kind: np.empty(c.n_phi) for kind in KINDS}
    psi_w = {kind: np.full(c.n_phi, np.nan) for kind in KINDS}
    psi_ss = {kind: np.full(c.n_phi, np.nan) for kind in KINDS}
    rho = {kind: np.empty(c.n_phi) for kind in KINDS}
    for i, p in enumerate(progress(phi, desc="phi")):
        for kind in KINDS:
            Phi = p * Q if kind == "stationary" else p * ramp * Q
            x = vector_ar1(Phi, c.batch, c.T, seed=int(np.random.SeedSequence([c.seed, 1, i]).generate_state(1)[0]))
            psi_x[kind][i] = whiteness(x)
            rho[kind][i] = stationarity(x)
            lam0, lam1 = block_covariances(x)
            try:
                Ls, Ms = block_cholesky_factors(lam0, lam1, c.T)
                psi_w[kind][i] = whiteness(whiten(x, Ls, Ms))
                ss = steady_state_factor(lam0, lam1)
                psi_ss[kind][i] = whiteness(whiten(x, ss.L, ss.M))
            except ValueError:  # the lag-1 model is not positive definite: no whitening filter
                pass
    noise_rng = np.random.default_rng(c.seed + 10 ** 6)
    psi_white = float(np.mean([whiteness(noise_rng.standard_normal((c.batch, c.T, c.D)))
                               for _ in range(c.white_draws)]))

    # the scan against the recursion on the same inputs: a stable filter (spectral radius 0.8)
    G = rng.standard_normal((c.timing_D, c.timing_D))
    L = np.linalg.cholesky(c.timing_D * np.eye(c.timing_D) + G @ G.T)
    M = rng.standard_normal((c.timing_D, c.timing_D))
    M *= 0.8 / np.max(np.abs(np.linalg.eigvals(np.linalg.solve(L, M))))
    timing, err = {}, 0.0
    for B in progress((1, c.timing_batch), desc="timing"):
        x = rng.standard_normal((B, c.timing_T, c.timing_D))
        w_rec = whiten(x, L, M)
        w_scan = whiten_scan(x, L, M, block=c.timing_block)
        err = max(err, float(np.abs(w_scan - w_rec).max() / np.abs(w_rec).max()))
        timing[f"B={B}"] = {"recursion": median_time(lambda: whiten(x, L, M), c.timing_repeats),
                            "scan": median_time(lambda: whiten_scan(x, L, M, block=c.timing_block), c.timing_repeats)}
    return WhiteningResult(c, phi, psi_x, psi_w, psi_ss, rho, psi_white, timing, err)

