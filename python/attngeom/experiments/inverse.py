"""The inverse pipeline (Laplace-Radon s.9): node recovery, densities, point sets, keys, missing wedge.

Z(u, tau) is the Laplace transform of the Radon projection of the key measure along u
(eq. 34), an exponential sum sum_i exp(tau s_i) for discrete keys (eq. 36). Six parts.
(1) Node recovery by the matrix pencil (``ag.fit_exponential_sum``, order chosen by the
singular-value gap) against the node count n = 1..max_nodes, from real tau (uniform on
[-real_tau_max, real_tau_max]) and from imaginary tau = i imag_step k, k = 0..imag_samples - 1
(the characteristic function); nodes uniform on [-1, 1] with a minimum spacing. Real tau is
exact only up to about 6-8 nodes, imaginary tau far beyond. (2) The same with complex
Gaussian noise of relative size eta on imaginary samples at n = noise_nodes: the node error
against eta and the estimated order (it must stay n: no invented nodes). (3) Point clouds
in d = 2, 3, 8 recovered from their projections along d + 2 random directions
(``ag.reconstruct_points``, candidate intersection): error and time. (4) A random head's keys
and values recovered from its unnormalised transforms Z and N alone (``ag.recover_keys``).
(5) The uniform density on [-1, 1] and N(0, 0.5^2) recovered from their Laplace transforms
on real tau (``ag.invert_laplace_density``), noiseless and at relative noise density_noise:
Wasserstein-1 errors. (6) The Shepp-Logan phantom reconstructed by filtered backprojection
and SART from 180-degree data with a missing wedge of 0..max_wedge degrees (the image-space
analogue of the tilt null span(U)^perp, s.6.2): RMS errors and the images.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Tuple

import numpy as np

from .. import plotting
from ..inverse import fit_exponential_sum, invert_laplace_density, wasserstein1
from ..laplace_radon import head_probe
from ..point_sets import reconstruct_points, recover_keys
from ..radon import iradon, iradon_sart, limited_angle, radon, rms_error, shepp_logan_phantom
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult, check_config
from .timing import timed


TAU_KINDS = ("real", "imaginary")
POINT_DIMS = (2, 3, 8)
DENSITIES = ("uniform", "gaussian")
GAUSSIAN_SIGMA = 0.5
METHODS = ("fbp", "sart")
SUMMARY_NODE_COUNTS = (4, 6, 8, 16, 24, 32)


@dataclass
class InverseConfig(ExperimentConfig):
    max_nodes: int = 32  # node counts n = 1..max_nodes
    node_draws: int = 5  # random node sets per n
    node_gap: float = 0.3  # smallest node spacing, as a fraction of the mean spacing 2 / n
    real_tau_max: float = 10.0  # real tau = linspace(-real_tau_max, real_tau_max, real_samples)
    real_samples: int = 64
    imag_step: float = 2.5  # imaginary tau = 1j * imag_step * arange(imag_samples); no aliasing on [-1, 1]
    imag_samples: int = 128
    noise_nodes: int = 8  # n of the noise sweep (imaginary tau)
    eta_min: float = 1e-8
    eta_max: float = 1e-2
    n_eta: int = 7  # log-spaced relative noise levels
    noise_draws: int = 10
    points_n_d2: int = 200  # points of the random clouds in d = 2, 3, 8
    points_n_d3: int = 40
    points_n_d8: int = 8
    point_extra_directions: int = 2  # m = d + this many directions (d base directions, the rest confirm)
    head_keys: int = 16  # recover_keys: n keys in dimension head_dim with values of width head_value_dim
    head_dim: int = 8
    head_value_dim: int = 4
    head_directions: int = 12
    head_samples: int = 64  # imaginary tau samples per direction
    density_samples: int = 81  # tau = linspace(-real_tau_max, real_tau_max, density_samples)
    density_grid: int = 201  # points of the s grid
    density_noise: float = 1e-3  # relative noise of the noisy density inversion
    phantom_size: int = 160
    n_angles: int = 160  # evenly spaced on [0, 180)
    max_wedge: float = 90.0  # missing wedges linspace(0, max_wedge, n_wedges) degrees, centred at 90
    n_wedges: int = 4
    sart_iterations: int = 2
    timing_repeats: int = 3

    def check(self) -> "InverseConfig":
        """check_config, with n_eta, n_wedges >= 2, node_gap in (0, 1) and max_wedge in [0, 180)."""
        c = check_config(self, n_eta=2, n_wedges=2)
        if not 0 < c.node_gap < 1:
            raise ValueError(f"node_gap must lie in (0, 1) (a fraction of the mean spacing), got {c.node_gap}")
        if not 0 <= c.max_wedge < 180:
            raise ValueError(f"max_wedge must lie in [0, 180) degrees, got {c.max_wedge}")
        return c


def _spaced_nodes(rng, n, gap_fraction):
    """n sorted nodes uniform on [-1, 1] among the sets whose spacing is at least
    gap_fraction * 2 / n (sorted uniforms on a shortened interval, shifted by i * gap)."""
    gap = gap_fraction * 2.0 / n
    u = np.sort(rng.uniform(0.0, 2.0 - (n - 1) * gap, n))
    return -1.0 + u + gap * np.arange(n)


def _hausdorff(a, b) -> float:
    """Hausdorff distance between two point sets (n, d) and (m, d) (or (n,), (m,)); inf if one is empty."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    if len(a) == 0 or len(b) == 0:
        return math.inf
    dist = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    return float(max(dist.min(0).max(), dist.min(1).max()))


def _finite_list(values):
    """A list for JSON with non-finite entries as None."""
    return [float(v) if np.isfinite(v) else None for v in np.ravel(values)]


def _max_exact(n_nodes, errors, tol) -> int:
    """Largest n such that every draw at every count up to n has error <= tol (0 if none)."""
    ok = np.all(errors <= tol, axis=1)
    bad = np.flatnonzero(~ok)
    return int(n_nodes[bad[0] - 1]) if bad.size and bad[0] > 0 else (0 if bad.size else int(n_nodes[-1]))


@dataclass
class DensityCase:
    """One density inversion: the grid s (G,), the true density (G,), the densities recovered
    from noiseless and noisy transforms (G,) and their Wasserstein-1 errors."""

    s: np.ndarray
    truth: np.ndarray
    clean: np.ndarray
    noisy: np.ndarray
    w1_clean: float
    w1_noisy: float


@dataclass
class InverseResult(ExperimentResult):
    config: InverseConfig
    n_nodes: np.ndarray  # (n_counts,) 1..max_nodes
    node_error: Dict[str, np.ndarray]  # "real"/"imaginary" -> (n_counts, node_draws) Hausdorff node error
    node_order: Dict[str, np.ndarray]  # -> (n_counts, node_draws) estimated order
    eta: np.ndarray  # (n_eta,)
    noise_error: np.ndarray  # (n_eta, noise_draws) node error at noise_nodes (Hausdorff)
    noise_order: np.ndarray  # (n_eta, noise_draws) estimated order
    points_n: Dict[int, int]  # d -> number of points
    points_error: Dict[int, float]  # d -> Hausdorff error of the recovered cloud
    points_time: Dict[int, float]  # d -> seconds (median over timing_repeats)
    keys_error: float  # recover_keys: largest |k_hat - k| entry over matched keys
    values_error: float  # largest |v_hat - v| entry
    multiplicity_error: float  # largest |multiplicity - 1|
    keys_time: float  # seconds, probe and inversion
    densities: Dict[str, DensityCase]  # "uniform"/"gaussian"
    wedges: np.ndarray  # (n_wedges,) degrees
    angles_kept: np.ndarray  # (n_wedges,) number of projection angles outside the wedge
    rms: Dict[str, np.ndarray]  # "fbp"/"sart" -> (n_wedges,) RMS error against the phantom
    phantom: np.ndarray = field(repr=False, default=None)  # (S, S)
    sinogram: np.ndarray = field(repr=False, default=None)  # (S, n_angles)
    images: Dict[str, np.ndarray] = field(repr=False, default=None)  # method -> (n_wedges, S, S)
    cloud_2d: Tuple[np.ndarray, np.ndarray] = field(repr=False, default=None)  # true, recovered (n, 2)

    DESCRIPTIONS = (
        (r"node_error_(real|imaginary)_n(\d+)", "median node error, {0} tau, {1} nodes (matrix pencil)"),
        (r"max_nodes_real_tau_error_1e-7", "most nodes recovered to 1e-7 from real tau"),
        (r"max_nodes_imaginary_tau_error_1e-10", "most nodes recovered to 1e-10 from imaginary tau"),
        (r"order_correct_fraction_(\w+)", "fraction of fits with the right number of nodes, {0} tau"),
        (r"noise_nodes", "nodes in the noise sweep"),
        (r"noise_order_(min|max)", "{0} number of nodes found over the noise sweep"),
        (r"noise_error_slope", "slope of log node error against log noise level eta"),
        (r"noise_error_over_eta", "node error per unit of noise (median)"),
        (r"noise_error_eta_max", "node error at the largest noise level"),
        (r"points_error_d(\d+)", "largest point error, points from projections in {0} dimensions"),
        (r"points_time_ms_d(\d+)", "time of that reconstruction in ms, {0} dimensions"),
        (r"recover_keys_key_error", "largest key error of recover_keys (s.9.1)"),
        (r"recover_keys_value_error", "largest value error of recover_keys"),
        (r"recover_keys_multiplicity_error", "largest multiplicity error of recover_keys"),
        (r"recover_keys_time_ms", "time of recover_keys in ms"),
        (r"density_w1_(\w+?)_noisy", "Wasserstein-1 error of the {0} density, noisy transform (eq. 35)"),
        (r"density_w1_(\w+)", "Wasserstein-1 error of the {0} density, exact transform (eq. 35)"),
        (r"fbp_rms_error", "RMS error of filtered backprojection, all angles"),
        (r"(sart\d*)_rms_error", "RMS error of {0} (SART sweeps), all angles"),
        (r"wedge_fbp_rms_error_(.*)", "RMS error of FBP with a {0} degree missing wedge"),
        (r"wedge_(sart\d*)_rms_error_(.*)", "RMS error of {0} with a {1} degree missing wedge"),
    )

    def summary(self) -> dict:
        """Named scalars (medians over the draws at a few node counts, the largest exact node
        counts, noise slope and orders, point, key, density and wedge errors); curves under "sweep"."""
        c = self.config
        out = {}
        for n in SUMMARY_NODE_COUNTS:
            if n <= c.max_nodes:
                for kind in TAU_KINDS:
                    out[f"node_error_{kind}_n{n}"] = float(np.median(self.node_error[kind][n - 1]))
        out["max_nodes_real_tau_error_1e-7"] = _max_exact(self.n_nodes, self.node_error["real"], 1e-7)
        out["max_nodes_imaginary_tau_error_1e-10"] = _max_exact(self.n_nodes, self.node_error["imaginary"], 1e-10)
        for kind in TAU_KINDS:
            out[f"order_correct_fraction_{kind}"] = float(np.mean(self.node_order[kind] == self.n_nodes[:, None]))
        med = np.median(self.noise_error, axis=1)
        out["noise_nodes"] = c.noise_nodes
        out["noise_order_min"] = int(self.noise_order.min())
        out["noise_order_max"] = int(self.noise_order.max())
        out["noise_error_slope"] = float(np.polyfit(np.log(self.eta), np.log(med), 1)[0])
        out["noise_error_over_eta"] = float(np.median(self.noise_error / self.eta[:, None]))
        out["noise_error_eta_max"] = float(med[-1])
        for d in POINT_DIMS:
            out[f"points_error_d{d}"] = self.points_error[d]
            out[f"points_time_ms_d{d}"] = 1e3 * self.points_time[d]
        out["recover_keys_key_error"] = self.keys_error
        out["recover_keys_value_error"] = self.values_error
        out["recover_keys_multiplicity_error"] = self.multiplicity_error
        out["recover_keys_time_ms"] = 1e3 * self.keys_time
        for name, case in self.densities.items():
            out[f"density_w1_{name}"] = case.w1_clean
            out[f"density_w1_{name}_noisy"] = case.w1_noisy
        sart = f"sart{c.sart_iterations}"
        out["fbp_rms_error"] = float(self.rms["fbp"][0])
        out[f"{sart}_rms_error"] = float(self.rms["sart"][0])
        for i, w in enumerate(self.wedges):
            if w > 0:
                out[f"wedge_fbp_rms_error_{w:g}"] = float(self.rms["fbp"][i])
                out[f"wedge_{sart}_rms_error_{w:g}"] = float(self.rms["sart"][i])
        out["sweep"] = {"n_nodes": self.n_nodes.tolist(),
                        **{f"node_error_{k}": _finite_list(np.median(v, axis=1)) for k, v in self.node_error.items()},
                        **{f"node_order_{k}": np.median(v, axis=1).tolist() for k, v in self.node_order.items()},
                        "eta": self.eta.tolist(), "noise_error": _finite_list(med),
                        "noise_order_max": self.noise_order.max(axis=1).tolist(),
                        "wedge": self.wedges.tolist(), "angles_kept": self.angles_kept.tolist(),
                        "fbp_rms_error": self.rms["fbp"].tolist(), f"{sart}_rms_error": self.rms["sart"].tolist()}
        return out

    def plot_node_recovery(self, axes=None):
        """Node error (median and range over the draws) and estimated order against the node count,
        real vs imaginary tau."""
        c = self.config
        n = self.n_nodes.astype(float)
        title = (f"matrix pencil: real tau on [-{c.real_tau_max:g}, {c.real_tau_max:g}] ({c.real_samples} samples) "
                 f"vs tau = i {c.imag_step:g} k ({c.imag_samples} samples)")
        return _band_panels(n, [
            ("node error (Hausdorff)", {f"{k} tau": self.node_error[k] for k in TAU_KINDS}, "log"),
            ("estimated order", {**{f"{k} tau": self.node_order[k] for k in TAU_KINDS}, "n (true)": n}, "linear"),
        ], "nodes n", axes=axes, title=title)

    def plot_noise(self, axes=None):
        """Node error and estimated order against the relative noise eta (imaginary tau)."""
        c = self.config
        ref = np.median(self.noise_error / self.eta[:, None]) * self.eta
        return _band_panels(self.eta, [
            ("node error", {"matrix pencil": self.noise_error, r"$\propto \eta$": ref}, "log"),
            ("estimated order", {"matrix pencil": self.noise_order,
                                 "n (true)": np.full(self.eta.shape, float(c.noise_nodes))}, "linear"),
        ], r"relative noise $\eta$", xscale="log", axes=axes,
            title=f"imaginary tau, n = {c.noise_nodes} nodes, {c.noise_draws} draws")

    def plot_densities(self, axes=None):
        """Recovered projected densities over the true ones (noiseless and noisy transforms)."""
        eta = self.config.density_noise
        titles = {"uniform": "uniform on [-1, 1]", "gaussian": f"N(0, {GAUSSIAN_SIGMA:g}$^2$)"}
        panels = [(f"{titles[k]}: W1 {v.w1_clean:.3f} / {v.w1_noisy:.3f}", v.s, v.truth,
                   {"recovered, noiseless": v.clean, f"recovered, noise {eta:g}": v.noisy})
                  for k, v in self.densities.items()]
        fig, axes = plotting.panel_row(axes, len(panels), 4.3)
        for ax, (title, s, truth, recovered) in zip(axes, panels):
            ax.plot(s, truth, "k-", lw=2, alpha=0.5, label="true")  # the truth black, the recoveries over it
            for i, (label, p) in enumerate(recovered.items()):
                ax.plot(s, p, "-" if i == 0 else "--", lw=1.2, label=label)
            ax.set_xlabel("$s$")
            ax.set_ylabel("density")
            ax.set_title(title, fontsize=9)
            ax.legend(frameon=False, fontsize=7)
        fig.tight_layout()
        return fig

    def plot_points(self, axes=None):
        """A planar cloud (true points as circles, recovered ones as crosses) and the largest point error of every
        cloud and of the head's keys (bars on a log scale, exact zeros at 1e-17)."""
        errors = {f"d={d}, n={self.points_n[d]}": self.points_error[d] for d in POINT_DIMS}
        errors[f"head keys\nd={self.config.head_dim}, n={self.config.head_keys}"] = self.keys_error
        truth, found = (np.asarray(a, dtype=float) for a in self.cloud_2d)
        fig, axes = plotting.panel_row(axes, 2, 4.75, 3.6, gridspec_kw={"width_ratios": [1, 1.3]})
        ax = axes[0]
        ax.plot(truth[:, 0], truth[:, 1], "o", mfc="none", ms=5, alpha=0.7, label="true")
        ax.plot(found[:, 0], found[:, 1], "x", ms=4, color="tab:red", label="recovered")
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.legend(frameon=False, fontsize=8)
        ax = axes[1]
        labels = list(errors)
        ax.bar(np.arange(len(labels)), np.maximum(np.asarray([errors[k] for k in labels], dtype=float), 1e-17))
        ax.set_xticks(np.arange(len(labels)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("largest point error")
        fig.suptitle("points from their projections (inverse Radon of a point set)", fontsize=10)
        fig.tight_layout()
        return fig

    def plot_missing_wedge(self, axes=None):
        """The phantom, its sinogram with the largest wedge removed, and the FBP and SART
        reconstructions for every wedge: a grid of images without ticks, one row each."""
        sino = self.sinogram.copy()
        theta = np.linspace(0.0, 180.0, sino.shape[1], endpoint=False)
        sino[:, ~limited_angle(theta, self.wedges[-1])] = 0.0
        unit = (0.0, 1.0)
        rows = [[("phantom", self.phantom, unit)], [(f"sinogram, {self.wedges[-1]:g} deg missing", sino, None)]]
        names = {"fbp": "FBP", "sart": f"SART ({self.config.sart_iterations})"}
        for row, method in zip(rows, METHODS):
            for i, w in enumerate(self.wedges):
                row.append((f"{names[method]}, wedge {w:g}: {self.rms[method][i]:.3f}", self.images[method][i], unit))
        nrows, ncols = len(rows), max(len(r) for r in rows)
        if axes is None:
            fig, grid = plotting.new_figure(nrows, ncols, figsize=(2.3 * ncols, 2.6 * nrows), squeeze=False)
        else:
            grid = np.asarray(axes, dtype=object).reshape(nrows, ncols)
            fig = grid[0, 0].figure
        for i, row in enumerate(rows):
            for j in range(ncols):
                ax = grid[i, j]
                if j >= len(row):
                    ax.set_visible(False)
                    continue
                name, img, vrange = row[j]  # vrange: (vmin, vmax), or None for the image's own range
                vmin, vmax = vrange if vrange is not None else (None, None)
                ax.imshow(img, cmap="gray", vmin=vmin, vmax=vmax,
                          aspect="auto" if img.shape[0] != img.shape[1] else "equal", interpolation="nearest")
                ax.set_title(name, fontsize=8)
                ax.set_xticks([])
                ax.set_yticks([])
        fig.tight_layout()
        return fig

    def plot_wedge_errors(self, ax=None):
        """RMS error against the missing wedge, FBP and SART."""
        c = self.config
        curves = {"FBP": self.rms["fbp"], f"SART ({c.sart_iterations})": self.rms["sart"]}
        return plotting.curve_panels(self.wedges, [("RMS error", curves, "linear")], "missing wedge [degrees]",
                                     xscale="linear", axes=None if ax is None else [ax],
                                     title=f"Shepp-Logan {c.phantom_size}, {c.n_angles} angles")

    def figures(self) -> dict:
        return {"node_recovery.png": self.plot_node_recovery(), "node_noise.png": self.plot_noise(),
                "densities.png": self.plot_densities(), "points.png": self.plot_points(),
                "missing_wedge.png": self.plot_missing_wedge(), "wedge_errors.png": self.plot_wedge_errors()}


def _node_sweep(c, rng):
    n_nodes = np.arange(1, c.max_nodes + 1)
    taus = {"real": np.linspace(-c.real_tau_max, c.real_tau_max, c.real_samples),
            "imaginary": 1j * c.imag_step * np.arange(c.imag_samples)}
    err = {k: np.empty((n_nodes.size, c.node_draws)) for k in TAU_KINDS}
    order = {k: np.empty((n_nodes.size, c.node_draws), dtype=np.int64) for k in TAU_KINDS}
    for i, n in enumerate(progress(n_nodes, desc="nodes")):
        for draw in range(c.node_draws):
            s = _spaced_nodes(rng, n, c.node_gap)
            for kind, tau in taus.items():
                fit = fit_exponential_sum(tau, np.exp(np.outer(tau, s)).sum(1))
                order[kind][i, draw] = int(fit.order)
                err[kind][i, draw] = _hausdorff(fit.nodes[: fit.order], s)
    return n_nodes, err, order


def _noise_sweep(c, rng):
    eta = np.geomspace(c.eta_min, c.eta_max, c.n_eta)
    tau = 1j * c.imag_step * np.arange(c.imag_samples)
    err = np.empty((c.n_eta, c.noise_draws))
    order = np.empty((c.n_eta, c.noise_draws), dtype=np.int64)
    for i, e in enumerate(progress(eta, desc="noise")):
        for draw in range(c.noise_draws):
            s = _spaced_nodes(rng, c.noise_nodes, c.node_gap)
            f = np.exp(np.outer(tau, s)).sum(1)
            noise = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / math.sqrt(2)
            fit = fit_exponential_sum(tau, f + e * np.linalg.norm(f) / math.sqrt(f.size) * noise)
            order[i, draw] = int(fit.order)
            err[i, draw] = _hausdorff(fit.nodes[: fit.order], s)
    return eta, err, order


def _unit_rows(rng, m, d):
    u = rng.standard_normal((m, d))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def _points(c, rng):
    sizes = {2: c.points_n_d2, 3: c.points_n_d3, 8: c.points_n_d8}
    err, times, cloud = {}, {}, None
    for d in progress(POINT_DIMS, desc="points"):
        X = rng.standard_normal((sizes[d], d))
        U = _unit_rows(rng, d + c.point_extra_directions, d)
        nodes = [rng.permutation(U[j] @ X.T) for j in range(len(U))]  # each direction's nodes in any order
        ps, times[d] = timed(lambda: reconstruct_points(U, nodes), c.timing_repeats)
        err[d] = _hausdorff(ps.points, X)
        if d == 2:
            cloud = (X, ps.points)
    return sizes, err, times, cloud


def _keys(c, rng):
    k = rng.standard_normal((c.head_keys, c.head_dim))
    v = rng.standard_normal((c.head_keys, c.head_value_dim))
    U = _unit_rows(rng, c.head_directions, c.head_dim)
    step = 2.5 / np.abs(U @ k.T).max()  # |s| step < pi: no aliasing
    tau = 1j * step * np.arange(c.head_samples)
    head, seconds = timed(lambda: recover_keys(head_probe(k, v), U, tau), c.timing_repeats)
    dist = np.linalg.norm(head.keys[:, None, :] - k[None, :, :], axis=2)
    match = dist.argmin(axis=1)
    if len(head.keys) != c.head_keys or len(np.unique(match)) != c.head_keys:
        return math.inf, math.inf, math.inf, seconds
    return (float(np.abs(head.keys - k[match]).max()), float(np.abs(head.values - v[match]).max()),
            float(np.abs(head.multiplicities - 1).max()), seconds)


def _densities(c, rng):
    tau = np.linspace(-c.real_tau_max, c.real_tau_max, c.density_samples)
    safe = np.where(tau == 0, 1.0, tau)
    cases = {}
    for name in DENSITIES:
        if name == "uniform":
            Z = np.where(tau == 0, 1.0, np.sinh(safe) / safe)
            s = np.linspace(-2.0, 2.0, c.density_grid)
            truth = np.where(np.abs(s) <= 1, 0.5, 0.0)
        else:
            Z = np.exp(GAUSSIAN_SIGMA ** 2 * tau ** 2 / 2)
            half = GAUSSIAN_SIGMA ** 2 * c.real_tau_max + 3 * GAUSSIAN_SIGMA  # where e^{tau s} p(s) carries mass
            s = np.linspace(-half, half, c.density_grid)
            truth = np.exp(-s ** 2 / (2 * GAUSSIAN_SIGMA ** 2)) / (GAUSSIAN_SIGMA * math.sqrt(2 * math.pi))
        clean = invert_laplace_density(tau, Z, s).density
        noisy = invert_laplace_density(tau, Z * (1 + c.density_noise * rng.standard_normal(tau.shape)), s).density
        cases[name] = DensityCase(s, truth, clean, noisy, wasserstein1(s, clean, truth), wasserstein1(s, noisy, truth))
    return cases


def _missing_wedge(c):
    phantom = shepp_logan_phantom(c.phantom_size)
    theta = np.linspace(0.0, 180.0, c.n_angles, endpoint=False)
    sino = radon(phantom, theta)
    wedges = np.linspace(0.0, c.max_wedge, c.n_wedges)
    kept = np.empty(c.n_wedges, dtype=np.int64)
    rms = {m: np.empty(c.n_wedges) for m in METHODS}
    images = {m: np.empty((c.n_wedges,) + phantom.shape) for m in METHODS}
    for i, w in enumerate(progress(wedges, desc="wedge")):
        keep = limited_angle(theta, w)
        kept[i] = keep.sum()
        images["fbp"][i] = iradon(sino[:, keep], theta[keep])
        images["sart"][i] = iradon_sart(sino[:, keep], theta[keep], iterations=c.sart_iterations)
        for m in METHODS:
            rms[m][i] = rms_error(images[m][i], phantom)
    return phantom, sino, wedges, kept, rms, images


def run_inverse(config: InverseConfig = InverseConfig()) -> InverseResult:
    """Run the inverse-pipeline experiment; deterministic given ``config.seed`` (except the timings).

    Example: ``res = run_inverse(InverseConfig(max_nodes=12, phantom_size=64, n_angles=64)); res.table()``
    """
    c = config.check()
    # independent streams per part: changing one part's sizes leaves the others' draws alone
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(c.seed).spawn(5)]
    n_nodes, node_error, node_order = _node_sweep(c, rngs[0])
    eta, noise_error, noise_order = _noise_sweep(c, rngs[1])
    sizes, p_err, p_time, cloud = _points(c, rngs[2])
    k_err, v_err, m_err, k_time = _keys(c, rngs[3])
    densities = _densities(c, rngs[4])
    phantom, sino, wedges, kept, rms, images = _missing_wedge(c)
    return InverseResult(c, n_nodes, node_error, node_order, eta, noise_error, noise_order, sizes, p_err, p_time,
                         k_err, v_err, m_err, k_time, densities, wedges, kept, rms, phantom, sino, images, cloud)


# -- figures of this driver ---------------------------------------------------------------
def _band_panels(x, panels, xlabel, *, xscale="linear", axes=None, title=None):
    """Side-by-side panels of repeated measurements against one parameter x (n,).

    panels : list of (ylabel, {label: values}, yscale). A (n, draws) array is drawn as its
    median over the draws (solid, markers) inside the band between its smallest and largest
    draw; a (n,) array as a dashed reference line. On a log y axis values are drawn no lower
    than 1e-17 (exact zeros, e.g. a recovery exact to the last bit, sit on that floor).
    Returns the figure.
    """
    fig, axes = plotting.panel_row(axes, len(panels), 4.6, 3.3)
    x = np.asarray(x, dtype=float)
    for ax, (ylabel, curves, yscale) in zip(axes, panels):
        for label, values in curves.items():
            values = np.asarray(values, dtype=float)
            if yscale == "log":
                values = np.maximum(values, 1e-17)
            if values.ndim == 2:
                line, = ax.plot(x, np.median(values, axis=1), "o-", ms=3, label=label)
                ax.fill_between(x, values.min(axis=1), values.max(axis=1), color=line.get_color(), alpha=0.2, lw=0)
            else:
                ax.plot(x, values, "k--" if len(curves) > 1 else "-", lw=1, label=label)
        plotting.finish_curves(ax, xlabel, ylabel, xscale, yscale, len(curves))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig

