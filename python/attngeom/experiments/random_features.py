"""Monte Carlo softmax attention (Laplace-Radon s.7.3): random features and importance sampling.

One random head (Gaussian tokens, weights scaled by 1 / sqrt(d_model)). (1) FAVOR+ positive
random features: the mean squared relative error of the partition estimate Z_hat and the
output error ``|y_hat - y|`` against the number of features m, for iid and orthogonal features
(the variance falls like 1/m; orthogonal blocks lower it). The queries and keys are scaled by
``feature_gain`` because the estimator's variance grows like exp(``|q + k|^2``) scale: at the
s.13 head's own radii (tau ~ 1) it needs far more features. (2) Importance sampling of Z
with S keys per query: the queries rescaled so that the mean Laplace radius tau runs from
tau_min to tau_max; the mean squared relative error of Z_hat for the uniform and the tilted
(low-rank sketch of the Gibbs weights) proposal, and the exact uniform value
(n_k sum_j P_ij^2 - 1) / S, which grows as the Gibbs weights P concentrate with tau.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict

import numpy as np

from .. import plotting
from ..attention import softmax_attention
from ..laplace_radon import tilt_radius
from ..random_features import random_feature_attention
from ..sampling import sampled_attention
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult, check_config

FEATURE_KINDS = ("iid", "orthogonal")
PROPOSALS = ("uniform", "tilted")


@dataclass
class RandomFeaturesConfig(ExperimentConfig):
    d_model: int = 64
    d_k: int = 16
    d_v: int = 16
    n_tokens: int = 64
    feature_gain: float = 0.5  # q and k multiplied by this for the feature sweep
    min_features: int = 8  # m = powers of two from min_features to max_features
    max_features: int = 1024
    feature_draws: int = 200  # independent feature matrices per m (the error is heavy-tailed)
    tau_min: float = 0.25
    tau_max: float = 4.0
    n_tau: int = 9  # log-spaced mean radii
    num_samples: int = 16  # S keys per query
    sampling_draws: int = 100

    def check(self) -> "RandomFeaturesConfig":
        """check_config, with max_features >= min_features and n_tau >= 2."""
        return check_config(self, max_features=self.min_features, n_tau=2)


def _slope(x, y):
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


@dataclass
class RandomFeaturesResult(ExperimentResult):
    config: RandomFeaturesConfig
    num_features: np.ndarray  # (n_m,)
    z_mse: Dict[str, np.ndarray]  # "iid"/"orthogonal" -> (n_m,) mean (Z_hat / Z - 1)^2
    output_error: Dict[str, np.ndarray]  # -> (n_m,) mean |y_hat - y|_F / |v|_F
    tau_features: float  # mean Laplace radius of the feature sweep's queries
    tau: np.ndarray  # (n_tau,) mean radius at each sampling point
    sampling_mse: Dict[str, np.ndarray]  # "uniform"/"tilted" -> (n_tau,) mean (Z_hat / Z - 1)^2
    uniform_exact: np.ndarray  # (n_tau,) exact mean (n_k sum_j P_ij^2 - 1) / S of the uniform proposal

    DESCRIPTIONS = (
        (r"tau_features", "mean Laplace radius of the feature sweep's queries"),
        (r"z_mse_slope_(\w+)", "slope of log MSE(Z_hat / Z) against log m, {0} features (-1 expected)"),
        (r"output_error_slope_(\w+)", "slope of log output error against log m, {0} features"),
        (r"z_mse_max_features_(\w+)", "MSE of Z_hat / Z at the most features, {0}"),
        (r"output_error_max_features_(\w+)", "output error norm(y_hat - y) / norm(v) at the most features, {0}"),
        (r"orthogonal_over_iid_z_mse", "orthogonal over iid MSE of Z (geometric mean over m)"),
        (r"orthogonal_over_iid_output_error", "orthogonal over iid output error (geometric mean over m)"),
        (r"sampling_mse_(\w+)_tau_(min|max)", "MSE of the sampled Z, {0} proposal, at the {1} radius"),
        (r"uniform_exact_tau_(min|max)", "exact MSE of the uniform proposal at the {0} radius"),
        (r"tilted_over_uniform_tau_max", "tilted over uniform MSE at the largest radius"),
    )

    def summary(self) -> dict:
        """Named scalars (slopes, values at the ends of the sweeps, ratios); curves under "sweep"."""
        m = self.num_features
        big = m >= self.config.d_k  # at least one full orthogonal block
        big = big if big.any() else np.ones_like(big)
        out = {"tau_features": self.tau_features}
        for kind in FEATURE_KINDS:
            out[f"z_mse_slope_{kind}"] = _slope(m, self.z_mse[kind])
            out[f"output_error_slope_{kind}"] = _slope(m, self.output_error[kind])
            out[f"z_mse_max_features_{kind}"] = float(self.z_mse[kind][-1])
            out[f"output_error_max_features_{kind}"] = float(self.output_error[kind][-1])
        # geometric means over the m with complete orthogonal blocks
        out["orthogonal_over_iid_z_mse"] = float(np.exp(np.mean(np.log(self.z_mse["orthogonal"][big] / self.z_mse["iid"][big]))))
        out["orthogonal_over_iid_output_error"] = float(np.exp(np.mean(np.log(
            self.output_error["orthogonal"][big] / self.output_error["iid"][big]))))
        for p in PROPOSALS:
            out[f"sampling_mse_{p}_tau_min"] = float(self.sampling_mse[p][0])
            out[f"sampling_mse_{p}_tau_max"] = float(self.sampling_mse[p][-1])
        out["uniform_exact_tau_min"] = float(self.uniform_exact[0])
        out["uniform_exact_tau_max"] = float(self.uniform_exact[-1])
        out["tilted_over_uniform_tau_max"] = float(self.sampling_mse["tilted"][-1] / self.sampling_mse["uniform"][-1])
        out["sweep"] = {"num_features": m.tolist(), **{f"z_mse_{k}": v.tolist() for k, v in self.z_mse.items()},
                        **{f"output_error_{k}": v.tolist() for k, v in self.output_error.items()},
                        "tau": self.tau.tolist(), **{f"sampling_mse_{k}": v.tolist() for k, v in self.sampling_mse.items()},
                        "uniform_exact": self.uniform_exact.tolist()}
        return out

    def plot_feature_error(self, axes=None):
        """Z's mean squared relative error and the output error against m, iid vs orthogonal."""
        m = self.num_features.astype(float)
        ref = self.z_mse["iid"][0] * m[0] / m
        return plotting.curve_panels(m, [
            (r"mean $(\hat Z / Z - 1)^2$", {**{k: v for k, v in self.z_mse.items()}, r"$\propto 1/m$": ref}, "log"),
            (r"$|\hat y - y|_F / |v|_F$", dict(self.output_error), "log"),
        ], "features m", axes=axes, title=rf"FAVOR+ positive random features (mean $\tau$ = {self.tau_features:.2f})")

    def plot_sampling_variance(self, ax=None):
        """Mean squared relative error of the importance-sampled Z against tau, per proposal."""
        curves = {**dict(self.sampling_mse), "uniform, exact": self.uniform_exact}
        return plotting.curve_panels(self.tau, [(r"mean $(\hat Z / Z - 1)^2$", curves, "log")],
                                     r"mean Laplace radius $\tau$", axes=None if ax is None else [ax],
                                     title=f"importance sampling, S = {self.config.num_samples} keys")

    def figures(self) -> dict:
        return {"feature_error.png": self.plot_feature_error(), "sampling_variance.png": self.plot_sampling_variance()}


def _draw_seed(seed: int, stream: int, draw: int) -> int:
    """Independent integer seeds per (run seed, stream, draw): no two runs share a stream."""
    return int(np.random.SeedSequence([seed, stream, draw]).generate_state(1)[0])


def run_random_features(config: RandomFeaturesConfig = RandomFeaturesConfig()) -> RandomFeaturesResult:
    """Run the Monte Carlo attention experiment; deterministic given ``config.seed``.

    Example: ``res = run_random_features(RandomFeaturesConfig(feature_draws=10)); res.table()``
    """
    c = config.check()
    rng = np.random.default_rng(c.seed)
    s = 1 / math.sqrt(c.d_model)
    W_Q, W_K, W_V = (rng.standard_normal((c.d_model, d)) * s for d in (c.d_k, c.d_k, c.d_v))
    x = rng.standard_normal((c.n_tokens, c.d_model))
    q, k, v = x @ W_Q, x @ W_K, x @ W_V

    # (1) random features against m
    qf, kf = c.feature_gain * q, c.feature_gain * k
    y, log_z = softmax_attention(qf, kf, v, return_log_partition=True)
    m_grid = 2 ** np.arange(int(math.ceil(math.log2(c.min_features))), int(math.floor(math.log2(c.max_features))) + 1)
    if m_grid.size < 2:
        raise ValueError(f"[min_features, max_features] = [{c.min_features}, {c.max_features}] must hold at least two "
                         "powers of two")
    z_mse = {kind: np.empty(m_grid.size) for kind in FEATURE_KINDS}
    out_err = {kind: np.empty(m_grid.size) for kind in FEATURE_KINDS}
    v_norm = np.linalg.norm(v)
    for i, m in enumerate(progress(m_grid, desc="features")):
        for kind in FEATURE_KINDS:
            zs, es = [], []
            for draw in range(c.feature_draws):
                y_hat, lz_hat = random_feature_attention(qf, kf, v, num_features=int(m), orthogonal=kind == "orthogonal",
                                                         seed=_draw_seed(c.seed, 1, draw), return_log_partition=True)
                zs.append(np.mean(np.expm1(lz_hat - log_z) ** 2))
                es.append(np.linalg.norm(y_hat - y) / v_norm)
            z_mse[kind][i], out_err[kind][i] = np.mean(zs), np.mean(es)
    tau_features = float(tilt_radius(qf)[1].mean())

    # (2) importance sampling against the Laplace radius
    tau0 = float(tilt_radius(q)[1].mean())
    targets = np.geomspace(c.tau_min, c.tau_max, c.n_tau)
    mse = {p: np.empty(c.n_tau) for p in PROPOSALS}
    exact = np.empty(c.n_tau)
    taus = np.empty(c.n_tau)
    for i, t in enumerate(progress(targets, desc="tau")):
        qt = q * (t / tau0)
        taus[i] = tilt_radius(qt)[1].mean()
        _, P, lz = softmax_attention(qt, k, v, return_routing=True, return_log_partition=True)
        exact[i] = np.mean((c.n_tokens * np.sum(P * P, axis=-1) - 1) / c.num_samples)
        for p in PROPOSALS:
            est = np.stack([sampled_attention(qt, k, v, num_samples=c.num_samples, proposal=p,
                                              seed=_draw_seed(c.seed, 2, draw)).log_Z for draw in range(c.sampling_draws)])
            mse[p][i] = np.mean(np.expm1(est - lz) ** 2)
    return RandomFeaturesResult(c, m_grid, z_mse, out_err, tau_features, taus, mse, exact)
