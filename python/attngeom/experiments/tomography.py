"""Synthetic attention tomography (Lawrence, Laplace-Radon s.13, Table 1, Figures 1-10).

One random head on Gaussian tokens (weights scaled by 1 / sqrt(d_model)): the exact
Laplace-Radon reconstruction, the projection-only dependence of the logits, the gauge
symmetry, the radius distribution against its chi prediction, the logit distribution against
the Gaussian mean-field prediction, tilt coverage in key and token space, the routing
spectrum, and the temperature sweep l -> alpha l with two mean-field baselines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict

import numpy as np

from .. import plotting
from ..attention import softmax_attention
from ..attention_stats import AttentionStats
from ..corpus.radius import chi_moments
from ..laplace_radon import laplace_radon_attention, tilt_radius
from ..spectral import effective_rank, gauge_invariance_error, singular_values, tilt_coverage
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult


# Table 1 of the paper (run_20251217_190709), for the side-by-side comparison.
PAPER_TABLE_1 = {
    "var_q": 1.0706, "var_k": 0.9665, "logit_std_predicted": 1.0172, "logit_std_empirical": 1.0125,
    "tau_mean": 1.0242, "tau_mean_chi": 1.0267, "laplace_radon_rel_error": 5.94e-16,
    "projection_logit_rel_error": 2.89e-16, "gauge_rel_error_B": 2.31e-15, "gauge_rel_error_logits": 3.11e-15,
    "gauge_rel_error_Y": 3.03e-15, "dim_eff_span_U": 24.53, "dim_eff_span_N": 19.93, "effective_rank_P": 37.14,
}
# s.13.7: the sweep's end points and peak.
PAPER_SWEEP = {"entropy_alpha_0.1": 4.15, "entropy_alpha_10": 0.48, "max_prob_alpha_0.1": 0.0197,
               "max_prob_alpha_10": 0.836, "effective_rank_peak": 40.49, "effective_rank_peak_alpha": 2.0}


@dataclass
class TomographyConfig(ExperimentConfig):
    d_model: int = 96
    d_k: int = 32
    d_v: int = 48
    n_tokens: int = 64
    n_examples: int = 256
    n_alpha: int = 25  # temperature sweep points, log-spaced on [0.1, 10]
    baseline_draws: int = 64  # Monte Carlo examples per alpha for each mean-field baseline


def _row_stats(logits):
    """Mean row entropy, mean max probability and mean entropy effective rank of softmax(logits)."""
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    stats = AttentionStats.from_routing(p)
    er = effective_rank(singular_values(p), kind="entropy", spectrum=True)
    return float(stats.entropy.mean()), float(stats.max_weight.mean()), float(np.mean(er))


@dataclass
class TomographyResult(ExperimentResult):
    config: TomographyConfig
    scalars: Dict[str, float]
    alpha: np.ndarray
    sweep: Dict[str, np.ndarray]  # entropy, max_prob, effective_rank (+ _iid, _bilinear baselines)
    y: np.ndarray = field(repr=False)
    y_hat: np.ndarray = field(repr=False)
    tau: np.ndarray = field(repr=False)
    logits: np.ndarray = field(repr=False)
    row_entropy: np.ndarray = field(repr=False)
    tilt_eigenvalues: np.ndarray = field(repr=False)
    token_eigenvalues: np.ndarray = field(repr=False)
    routing_singular_values: np.ndarray = field(repr=False)

    def summary(self) -> dict:
        """Every row of Table 1 by name, plus the sweep (lists under "sweep") and the paper's values."""
        out = dict(self.scalars)
        out["sweep"] = {"alpha": self.alpha.tolist(), **{k: v.tolist() for k, v in self.sweep.items()}}
        out["paper"] = {**PAPER_TABLE_1, **PAPER_SWEEP}
        return out

    DESCRIPTIONS = (
        (r"var_q", "variance of the query entries"),
        (r"var_k", "variance of the key entries"),
        (r"logit_std_predicted", "mean-field logit std sqrt(Var q Var k)"),
        (r"logit_std_empirical", "std of the logits q.k / sqrt(d_k)"),
        (r"tau_mean", "mean Laplace radius tau = norm(q) / sqrt(d_k) (eq. 9)"),
        (r"tau_mean_chi", "mean radius predicted by the scaled chi(d_k) law"),
        (r"laplace_radon_rel_error", "softmax vs N / Z, relative error (Thm 1, Fig. 1)"),
        (r"projection_logit_rel_error", "logits vs tau (u.k), relative error (eq. 15)"),
        (r"gauge_rel_error_B", "change of B = W_Q W_K^T under the gauge (s.9.4)"),
        (r"gauge_rel_error_logits", "change of the logits under the gauge"),
        (r"gauge_rel_error_Y", "change of the outputs under the gauge"),
        (r"dim_eff_span_U", "effective angular dimension of the tilts (Fig. 5)"),
        (r"dim_eff_span_N", "effective dimension of the normals W_K u (Fig. 6)"),
        (r"effective_rank_P", "entropy effective rank of P, mean over examples (s.13.7)"),
        (r"entropy_alpha_(.*)", "mean row entropy of P at logit scale alpha = {0} (Fig. 8)"),
        (r"max_prob_alpha_(.*)", "mean largest weight of a row at alpha = {0} (Fig. 9)"),
        (r"effective_rank_peak", "largest effective rank of P over the alpha sweep (Fig. 10)"),
        (r"effective_rank_peak_alpha", "alpha where the effective rank peaks"),
    )

    def table(self) -> str:
        """Markdown table: each Table 1 quantity, ours beside the paper's, and what it measures."""
        lines = ["| quantity | attngeom | paper | description |", "|---|---|---|---|"]
        for key, theirs in PAPER_TABLE_1.items():
            lines.append(f"| {key} | {self.scalars[key]:.4g} | {theirs:.4g} | {self.describe(key)} |")
        peak = int(np.argmax(self.sweep["effective_rank"]))
        ours = {"entropy_alpha_0.1": self.sweep["entropy"][0], "entropy_alpha_10": self.sweep["entropy"][-1],
                "max_prob_alpha_0.1": self.sweep["max_prob"][0], "max_prob_alpha_10": self.sweep["max_prob"][-1],
                "effective_rank_peak": self.sweep["effective_rank"][peak], "effective_rank_peak_alpha": self.alpha[peak]}
        for key, theirs in PAPER_SWEEP.items():
            lines.append(f"| {key} | {ours[key]:.4g} | {theirs:.4g} | {self.describe(key)} |")
        return "\n".join(lines)

    # -- figures (numbered as in the paper) ----------------------------------------------
    def plot_reconstruction(self, ax=None):
        """Figure 1: Y (softmax) against Y_hat (Laplace-Radon)."""
        return plotting.identity_scatter(self.y, self.y_hat, self.scalars["laplace_radon_rel_error"],
                                         "Y (softmax attention), every entry", r"$\hat Y$ (Laplace-Radon N / Z)", ax=ax)

    def plot_radius_density(self, ax=None):
        """Figure 2: density of tau against the scaled chi prediction."""
        return plotting.radius_vs_chi(self.tau.ravel(), self.config.d_k, self.scalars["var_q"], ax=ax)

    def plot_raw_distributions(self, axes=None):
        """Figure 3: histograms of tau and of row entropies at alpha = 1."""
        fig, axes = plotting.panel_row(axes, 2, 4.0, 3.0)
        for ax, data, label in zip(axes, (self.tau, self.row_entropy), (r"$\tau$", "row entropy")):
            ax.hist(data.ravel(), bins=60, alpha=0.8)
            ax.set_xlabel(label)
        axes[0].set_ylabel("count")
        fig.tight_layout()
        return fig

    def plot_logits(self, ax=None):
        """Figure 4: the empirical logit density against N(0, Var(q) Var(k)), the Gaussian mean field."""
        logits, std = self.logits.ravel(), self.scalars["logit_std_predicted"]
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3.2))
        ax.hist(logits, bins=100, density=True, alpha=0.6, label="empirical logits")
        t = np.linspace(logits.min(), logits.max(), 400)
        ax.plot(t, np.exp(-t * t / (2 * std * std)) / (std * np.sqrt(2 * np.pi)), "k--", label="Gaussian mean field")
        return plotting.finish(fig, ax, r"$\ell = q \cdot k / \sqrt{d_k}$", "density", legend=True)

    def plot_tilt_spectrum(self, ax=None):
        """Figure 5: eigenvalues of Cov(u)."""
        return plotting.eigen_spectrum(self.tilt_eigenvalues,
                                       rf"Cov(u): dim$_{{eff}}$ = {self.scalars['dim_eff_span_U']:.2f}", ax=ax)

    def plot_token_spectrum(self, ax=None):
        """Figure 6: eigenvalues of Cov(n), n = W_K u."""
        return plotting.eigen_spectrum(self.token_eigenvalues,
                                       rf"Cov(n), n = W_K u: dim$_{{eff}}$ = {self.scalars['dim_eff_span_N']:.2f}",
                                       ax=ax, n_total=self.config.d_model)

    def plot_routing_spectrum(self, ax=None):
        """Figure 7: singular values of a representative P (the first example) at alpha = 1."""
        return plotting.eigen_spectrum(self.routing_singular_values,
                                       f"P of example 0: effective rank "
                                       f"{self.scalars['effective_rank_P_representative']:.2f}\n"
                                       f"(mean over examples {self.scalars['effective_rank_P']:.2f})", ax=ax,
                                       ylabel="singular value")

    def _sweep_plot(self, key, ylabel, ax):
        """The sweep of `key` against the logit scale alpha (log axis): empirical (solid), the two baselines dashed."""
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3.2))
        curves = {"empirical": self.sweep[key], "iid Gaussian logits": self.sweep[key + "_iid"],
                  "bilinear Gaussian Q, K": self.sweep[key + "_bilinear"]}
        for i, (label, values) in enumerate(curves.items()):
            ax.semilogx(self.alpha, values, "-" if i == 0 else "--", marker="o" if i == 0 else None, ms=3, label=label)
        return plotting.finish(fig, ax, r"logit scale $\alpha$", ylabel, legend=True)

    def plot_entropy_sweep(self, ax=None):
        """Figure 8: mean row entropy against alpha, with the two baselines."""
        return self._sweep_plot("entropy", "mean row entropy", ax)

    def plot_max_prob_sweep(self, ax=None):
        """Figure 9: mean max row probability against alpha."""
        return self._sweep_plot("max_prob", "mean max probability", ax)

    def plot_effective_rank_sweep(self, ax=None):
        """Figure 10: effective rank of P against alpha."""
        return self._sweep_plot("effective_rank", "effective rank of P", ax)

    def figures(self) -> dict:
        """{file name: Figure} for all ten figures."""
        return {"fig01_reconstruction.png": self.plot_reconstruction(), "fig02_radius_chi.png": self.plot_radius_density(),
                "fig03_raw_distributions.png": self.plot_raw_distributions(), "fig04_logits.png": self.plot_logits(),
                "fig05_tilt_spectrum.png": self.plot_tilt_spectrum(), "fig06_token_spectrum.png": self.plot_token_spectrum(),
                "fig07_routing_spectrum.png": self.plot_routing_spectrum(),
                "fig08_entropy_sweep.png": self.plot_entropy_sweep(), "fig09_max_prob_sweep.png": self.plot_max_prob_sweep(),
                "fig10_effective_rank_sweep.png": self.plot_effective_rank_sweep()}


def run_tomography(config: TomographyConfig = TomographyConfig()) -> TomographyResult:
    """Run the synthetic tomography experiment; deterministic given ``config.seed``.

    Example: ``res = run_tomography(TomographyConfig(n_examples=64)); print(res.table())``
    """
    c = config.check()
    rng = np.random.default_rng(c.seed)
    s = 1 / math.sqrt(c.d_model)
    W_Q, W_K, W_V = (rng.standard_normal((c.d_model, d)) * s for d in (c.d_k, c.d_k, c.d_v))
    x = rng.standard_normal((c.n_examples, c.n_tokens, c.d_model))
    q, k, v = x @ W_Q, x @ W_K, x @ W_V
    scale = 1 / math.sqrt(c.d_k)

    y, P = softmax_attention(q, k, v, return_routing=True)
    u, tau = tilt_radius(q)
    y_hat = laplace_radon_attention(u, tau, k, v)
    logits = scale * q @ np.swapaxes(k, -1, -2)
    logits_projection = tau[..., None] * (u @ np.swapaxes(k, -1, -2))
    A = rng.standard_normal((c.d_k, c.d_k)) + 2 * np.eye(c.d_k)
    gauge = gauge_invariance_error(W_Q, W_K, A, x, W_V=W_V)

    var_q, var_k = float(q.var()), float(k.var())
    cov = tilt_coverage(u, W_K=W_K, centered=True)
    entropy, max_prob, _ = _row_stats(logits)
    p_ent = AttentionStats.from_routing(P).entropy
    sv_P = singular_values(P)
    scalars = {
        "var_q": var_q, "var_k": var_k,
        "logit_std_predicted": math.sqrt(var_q * var_k), "logit_std_empirical": float(logits.std()),
        "tau_mean": float(tau.mean()), "tau_mean_chi": math.sqrt(var_q) * chi_moments(c.d_k)[0] / math.sqrt(c.d_k),
        "laplace_radon_rel_error": float(np.linalg.norm(y - y_hat) / np.linalg.norm(y)),
        "projection_logit_rel_error": float(np.linalg.norm(logits - logits_projection) / np.linalg.norm(logits)),
        "gauge_rel_error_B": gauge.bilinear, "gauge_rel_error_logits": gauge.logits, "gauge_rel_error_Y": gauge.outputs,
        "dim_eff_span_U": cov.effective_dim, "dim_eff_span_N": cov.effective_dim_token,
        "effective_rank_P": float(np.mean(effective_rank(sv_P, kind="entropy", spectrum=True))),
        "effective_rank_P_representative": float(effective_rank(sv_P[0], kind="entropy", spectrum=True)),
        "row_entropy_alpha_1": entropy, "max_prob_alpha_1": max_prob,
    }

    alpha = np.geomspace(0.1, 10, c.n_alpha)
    sweep = {key: np.empty(c.n_alpha) for key in
             ("entropy", "max_prob", "effective_rank", "entropy_iid", "max_prob_iid", "effective_rank_iid",
              "entropy_bilinear", "max_prob_bilinear", "effective_rank_bilinear")}
    base_rng = np.random.default_rng(c.seed + 1)
    iid = base_rng.standard_normal((c.baseline_draws, c.n_tokens, c.n_tokens)) * scalars["logit_std_predicted"]
    Qg = base_rng.standard_normal((c.baseline_draws, c.n_tokens, c.d_k)) * math.sqrt(var_q)
    Kg = base_rng.standard_normal((c.baseline_draws, c.n_tokens, c.d_k)) * math.sqrt(var_k)
    bilinear = scale * Qg @ np.swapaxes(Kg, -1, -2)
    for i, a in enumerate(progress(alpha, desc="alpha")):
        for suffix, base in (("", logits), ("_iid", iid), ("_bilinear", bilinear)):
            e, m, r = _row_stats(a * base)
            sweep["entropy" + suffix][i], sweep["max_prob" + suffix][i], sweep["effective_rank" + suffix][i] = e, m, r
    return TomographyResult(c, scalars, alpha, sweep, y, y_hat, tau, logits, p_ent, cov.eigenvalues,
                            cov.token_eigenvalues, sv_P[0])

