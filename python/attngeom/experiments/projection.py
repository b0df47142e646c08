"""Projection SDPA (Sanger): softmax vs Gaussian-distance attention, the sigma sweep, flattening.

Three parts. (1) The identity: on unit-norm queries and keys, softmax attention with logits
q.k / sigma^2 equals projection attention with weights exp(-``|q - k|^2`` / (2 sigma^2)) (Sanger
eq. 3-14 with the squared distance; with the paper's unsquared ``|q - k|`` the weights differ, and
the driver reports by how much). (2) The sigma sweep of self-attention (q = k = v, unit-norm
tokens): mean row entropy, mean largest weight and how far the layer moves the tokens, from
sigma = 0.01 (the paper's self-attention setting) to sigma = 10. (3) Flattening: a noisy cloud
near a plane passed through one and several self-attention layers; the local dimension of
each point's neighbourhood (``ag.local_flatness``) and the variance left off the plane.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import plotting
from ..attention import softmax_attention
from ..attention_stats import AttentionStats
from ..projection import local_flatness, projection_attention
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult


@dataclass
class ProjectionConfig(ExperimentConfig):
    n_tokens: int = 64  # tokens per sequence (identity and sigma sweep)
    d: int = 16  # token dimension (unit-norm tokens on the sphere S^{d-1})
    n_examples: int = 32  # sequences
    sigma_min: float = 0.01
    sigma_max: float = 10.0
    n_sigma: int = 25  # log-spaced sweep points
    n_points: int = 300  # flattening: points of the cloud
    ambient_dim: int = 6
    plane_dim: int = 2
    plane_scale: float = 2.0  # standard deviation of the cloud along the plane
    noise: float = 0.3  # isotropic noise around the plane
    flatten_sigma: float = 0.5  # sigma of the flattening layers
    n_layers: int = 5
    n_neighbors: int = 15

    MINIMUMS = {"n_sigma": 2}


def _unit(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@dataclass
class ProjectionResult(ExperimentResult):
    config: ProjectionConfig
    identity_rel_error: float  # max |y_proj - y_softmax| / max |y_softmax| at sigma = 1
    weight_abs_error: float  # max |z_proj - P_softmax| at sigma = 1
    identity_rel_error_sweep: np.ndarray  # (n_sigma,) the same identity at every sigma
    unsquared_weight_error: float  # max |z(|q - k|) - P_softmax|: the paper's unsquared distance
    sigma: np.ndarray  # (n_sigma,)
    entropy: np.ndarray  # (n_sigma,) mean row entropy of the self-attention weights
    max_prob: np.ndarray  # (n_sigma,) mean largest weight of a row
    output_change: np.ndarray  # (n_sigma,) |y - x|_F / |x|_F
    local_dim_before: np.ndarray  # (n_points,)
    local_dim_after: np.ndarray  # (n_layers, n_points)
    off_plane: np.ndarray  # (n_layers + 1,) fraction of the centred variance off the plane
    spread: np.ndarray  # (n_layers + 1,) |y - mean|_F / |x - mean|_F
    y_softmax: np.ndarray = field(repr=False, default=None)  # (n_examples, n_tokens, d) at sigma = 1
    y_projection: np.ndarray = field(repr=False, default=None)
    cloud_views: dict = field(repr=False, default=None)  # {title: (n_points, 2)} side views of the cloud

    DESCRIPTIONS = (
        (r"identity_rel_error", "softmax (unit q, k) vs projection attention at sigma = 1, relative"),
        (r"identity_weight_abs_error", "largest difference of the two weight matrices"),
        (r"identity_rel_error_max_over_sigma", "the identity with scale 1 / sigma^2, worst sigma"),
        (r"unsquared_distance_weight_error", "weight error with the paper's unsquared distance norm(q - k)"),
        (r"entropy_sigma_(min|max)", "mean row entropy of self-attention at the {0} sigma"),
        (r"entropy_log_n", "log n, the entropy of uniform weights"),
        (r"max_prob_sigma_(min|max)", "mean largest weight of a row at the {0} sigma"),
        (r"output_change_sigma_(min|max)", "norm(Y - X) / norm(X) (Frobenius) at the {0} sigma"),
        (r"sigma_half_entropy", "sigma where the mean entropy reaches log(n) / 2"),
        (r"local_dim_before", "mean local dimension of the cloud before the layers"),
        (r"local_dim_after_1", "mean local dimension after one layer"),
        (r"local_dim_after_last", "mean local dimension after the last layer"),
        (r"off_plane_before", "variance fraction off the plane before the layers"),
        (r"off_plane_after_1", "variance fraction off the plane after one layer"),
        (r"off_plane_after_last", "variance fraction off the plane after the last layer"),
        (r"spread_after_last", "cloud size after the last layer over its size before"),
    )

    def summary(self) -> dict:
        """Named scalars, and the sweeps as lists under "sweep"."""
        n = self.config.n_tokens
        half = 0.5 * math.log(n)
        # sigma at which the mean entropy reaches half its maximum log n (interpolated in log sigma;
        # the entropy of a Gibbs family rises with the temperature, up to rounding at saturation)
        sigma_half = float(np.exp(np.interp(half, np.maximum.accumulate(self.entropy), np.log(self.sigma))))
        return {
            "identity_rel_error": self.identity_rel_error,
            "identity_weight_abs_error": self.weight_abs_error,
            "identity_rel_error_max_over_sigma": float(self.identity_rel_error_sweep.max()),
            "unsquared_distance_weight_error": self.unsquared_weight_error,
            "entropy_sigma_min": float(self.entropy[0]),
            "entropy_sigma_max": float(self.entropy[-1]),
            "entropy_log_n": math.log(n),
            "max_prob_sigma_min": float(self.max_prob[0]),
            "max_prob_sigma_max": float(self.max_prob[-1]),
            "output_change_sigma_min": float(self.output_change[0]),
            "output_change_sigma_max": float(self.output_change[-1]),
            "sigma_half_entropy": sigma_half,
            "local_dim_before": float(self.local_dim_before.mean()),
            "local_dim_after_1": float(self.local_dim_after[0].mean()),
            "local_dim_after_last": float(self.local_dim_after[-1].mean()),
            "off_plane_before": float(self.off_plane[0]),
            "off_plane_after_1": float(self.off_plane[1]),
            "off_plane_after_last": float(self.off_plane[-1]),
            "spread_after_last": float(self.spread[-1]),
            "sweep": {"sigma": self.sigma.tolist(), "entropy": self.entropy.tolist(), "max_prob": self.max_prob.tolist(),
                      "output_change": self.output_change.tolist(),
                      "identity_rel_error": self.identity_rel_error_sweep.tolist()},
            "layers": {"local_dim": [float(self.local_dim_before.mean())] + self.local_dim_after.mean(1).tolist(),
                       "off_plane": self.off_plane.tolist(), "spread": self.spread.tolist()},
        }

    def plot_identity(self, ax=None):
        """Softmax (logits q.k, unit-norm q and k) against projection attention at sigma = 1."""
        return plotting.identity_scatter(self.y_softmax, self.y_projection, self.identity_rel_error,
                                         "softmax attention, logits q.k", r"projection attention, $\sigma = 1$", ax=ax)

    def plot_sigma_sweep(self, axes=None):
        """Entropy, largest weight and output change of self-attention against sigma."""
        c = self.config
        return plotting.curve_panels(self.sigma, [
            ("mean row entropy", {"self-attention": self.entropy,
                                  r"$\log n$ (uniform)": np.full(self.sigma.shape, math.log(c.n_tokens))}, "linear"),
            ("mean largest weight", {"self-attention": self.max_prob}, "linear"),
            (r"$|Y - X|_F / |X|_F$", {"self-attention": self.output_change}, "linear"),
        ], r"$\sigma$", axes=axes, title=f"projection self-attention on unit-norm tokens (n = {c.n_tokens}, d = {c.d})")

    def plot_flattening(self, axes=None):
        """Local dimension of the cloud under repeated layers (Sanger's "flattening"). Left: histograms of the local
        dimension (participation ratio) of each point's neighbourhood before, after one layer and after the last;
        right: the means and the fraction of the cloud's variance off its plane against the number of layers."""
        before, after = self.local_dim_before, np.atleast_2d(self.local_dim_after)
        fig, axes = plotting.panel_row(axes, 2, 4.5)
        n_layers = after.shape[0]
        ax = axes[0]
        bins = np.linspace(min(before.min(), after.min()), max(before.max(), after.max()), 40)
        ax.hist(before, bins=bins, alpha=0.6, label="before")
        ax.hist(after[0], bins=bins, alpha=0.6, label="after 1 layer")
        if n_layers > 1:
            ax.hist(after[-1], bins=bins, alpha=0.6, label=f"after {n_layers} layers")
        ax.set_xlabel("local dimension (participation ratio)")
        ax.set_ylabel("points")
        ax.legend(frameon=False, fontsize=8)
        ax = axes[1]
        layers = np.arange(n_layers + 1)
        ax.plot(layers, np.concatenate([[before.mean()], after.mean(1)]), "o-", label="mean local dimension")
        ax.set_xlabel("layers")
        ax.set_ylabel("mean local dimension")
        twin = ax.twinx()
        twin.semilogy(layers, self.off_plane, "s--", color="tab:red", ms=4)
        twin.set_ylabel("variance fraction off the plane", color="tab:red")
        ax.set_xticks(layers)
        fig.tight_layout()
        return fig

    def plot_cloud(self, axes=None):
        """Side view of the cloud (an in-plane against an off-plane direction) before and after, one panel each,
        sharing the axis limits."""
        fig, axes = plotting.panel_row(axes, len(self.cloud_views), 3.3, sharex=True, sharey=True)
        for ax, (title, pts) in zip(axes, self.cloud_views.items()):
            ax.plot(pts[:, 0], pts[:, 1], ".", ms=3, alpha=0.6)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("in-plane direction")
        axes[0].set_ylabel("off-plane direction")
        fig.tight_layout()
        return fig

    def figures(self) -> dict:
        return {"identity.png": self.plot_identity(), "sigma_sweep.png": self.plot_sigma_sweep(),
                "flattening.png": self.plot_flattening(), "cloud.png": self.plot_cloud()}


def run_projection(config: ProjectionConfig = ProjectionConfig()) -> ProjectionResult:
    """Run the projection-SDPA experiment; deterministic given ``config.seed``.

    Example: ``res = run_projection(ProjectionConfig(n_examples=4)); res.summary()["identity_rel_error"]``
    """
    c = config.check()
    rng = np.random.default_rng(c.seed)
    # (1) the identity on unit-norm queries and keys (cross-attention, separate values)
    q = _unit(rng, (c.n_examples, c.n_tokens, c.d))
    k = _unit(rng, (c.n_examples, c.n_tokens, c.d))
    v = rng.standard_normal((c.n_examples, c.n_tokens, c.d))
    y_s, P = softmax_attention(q, k, v, scale=1.0, return_routing=True)
    y_p, z = projection_attention(q, k, v, sigma=1.0, return_routing=True)
    rel = float(np.abs(y_p - y_s).max() / np.abs(y_s).max())
    w_err = float(np.abs(z - P).max())
    dot = q @ np.swapaxes(k, -1, -2)
    dist = np.sqrt(np.maximum(2.0 - 2.0 * dot, 0.0))  # |q - k| for unit vectors
    z = np.exp(-dist / 2.0 - (-dist / 2.0).max(-1, keepdims=True))  # softmax of the unsquared-distance logits
    unsquared = float(np.abs(z / z.sum(-1, keepdims=True) - P).max())

    # (2) the sigma sweep: self-attention q = k = v on unit-norm tokens
    x = _unit(rng, (c.n_examples, c.n_tokens, c.d))
    sigma = np.geomspace(c.sigma_min, c.sigma_max, c.n_sigma)
    ident = np.empty(c.n_sigma)
    entropy, max_prob, change = np.empty(c.n_sigma), np.empty(c.n_sigma), np.empty(c.n_sigma)
    for i, s in enumerate(progress(sigma, desc="sigma")):
        y, w = projection_attention(x, x, sigma=s, return_routing=True)
        ys = softmax_attention(q, k, v, scale=1.0 / s ** 2)
        ident[i] = np.abs(projection_attention(q, k, v, sigma=s) - ys).max() / np.abs(ys).max()
        stats = AttentionStats.from_routing(w)
        entropy[i], max_prob[i] = stats.entropy.mean(), stats.max_weight.mean()
        change[i] = np.linalg.norm(y - x) / np.linalg.norm(x)

    # (3) flattening: a noisy cloud near a plane through repeated self-attention layers
    basis = np.linalg.qr(rng.standard_normal((c.ambient_dim, c.plane_dim)))[0]  # (ambient, plane) orthonormal
    cloud = c.plane_scale * rng.standard_normal((c.n_points, c.plane_dim)) @ basis.T
    cloud += c.noise * rng.standard_normal((c.n_points, c.ambient_dim))
    normal = np.linalg.svd(np.eye(c.ambient_dim) - basis @ basis.T)[0][:, 0]  # one off-plane direction

    def off_plane(y):
        yc = y - y.mean(0)
        return float(np.sum((yc - yc @ basis @ basis.T) ** 2) / np.sum(yc ** 2))

    def spread(y):
        return float(np.linalg.norm(y - y.mean(0)) / np.linalg.norm(cloud - cloud.mean(0)))

    def side(y):
        return np.stack([y @ basis[:, 0], y @ normal], axis=1)

    after = np.empty((c.n_layers, c.n_points))
    off, spr = [off_plane(cloud)], [1.0]
    views = {"before": side(cloud)}
    y = cloud
    before = None
    for layer in progress(range(c.n_layers), desc="layers"):
        y = projection_attention(y, y, sigma=c.flatten_sigma)
        flat = local_flatness(cloud, y, n_neighbors=c.n_neighbors)
        before = flat.before
        after[layer] = flat.after
        off.append(off_plane(y))
        spr.append(spread(y))
        if layer == 0:
            views["after 1 layer"] = side(y)
    if c.n_layers > 1:
        views[f"after {c.n_layers} layers"] = side(y)
    return ProjectionResult(c, rel, w_err, ident, unsquared, sigma, entropy, max_prob, change, before, after,
                            np.array(off), np.array(spr), y_s, y_p, views)

