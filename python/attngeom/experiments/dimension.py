"""Figure 4 of Henry-Marchetti-Kohn: estimated and expected neuromanifold dimensions.

A deep network with l layers of width d_i = width and query/key dimension a_i = a in every
layer (the paper's a, the rank bound of A_i = K_i^T Q_i; one head per layer), a = 1..width,
for the lightning and softmax kinds: every draw's Jacobian-rank estimate beside the closed form
(Corollary 3.14, eq. 17), and the singular-value gaps the estimates rest on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from .. import plotting
from ..dimension import DimensionResult, neuromanifold_dimension
from ._progress import progress
from ._result import ExperimentConfig, ExperimentResult

PAPER_FIGURE_4 = {"softmax": [37, 52, 61, 64], "lightning": [34, 49, 58, 61]}


@dataclass
class DimensionConfig(ExperimentConfig):
    layers: int = 3
    width: int = 4
    t: int = 3
    n_samples: int = 100
    n_draws: int = 5


@dataclass
class DimensionSweepResult(ExperimentResult):
    config: DimensionConfig
    results: Dict[str, List[DimensionResult]] = field(repr=False)

    def summary(self) -> dict:
        out = {}
        for kind, rs in self.results.items():
            out[f"{kind}_dims"] = [r.dims.tolist() for r in rs]
            out[f"{kind}_expected"] = [r.expected for r in rs]
            out[f"{kind}_min_gap_ratio"] = float(min(r.gap_ratios.min() for r in rs))
        if (self.config.layers, self.config.width, self.config.t) == (3, 4, 3):
            out["paper"] = PAPER_FIGURE_4
        return out

    def table(self) -> str:
        lines = ["| kind | a (query/key dim.) | estimated (every draw) | expected (closed form) | paper (Fig. 4) |",
                 "|---|---|---|---|---|"]
        for kind, rs in self.results.items():
            for a, r in enumerate(rs, start=1):
                paper = PAPER_FIGURE_4[kind][a - 1] if self.summary().get("paper") else "-"
                lines.append(f"| {kind} | {a} | {r.dims.tolist()} | {r.expected} | {paper} |")
        return "\n".join(lines)

    def plot_dimensions(self, ax=None):
        """Figure 4: estimated (every draw) and expected dimension against a."""
        fig, ax = plotting.axes_or_new(ax, figsize=(5, 3.2))
        # the two kinds side by side around each a; the closed form beside its estimates
        for kind, color, dx in (("softmax", "tab:blue", -0.1), ("lightning", "tab:orange", 0.1)):
            for a, r in enumerate(self.results[kind], start=1):
                ax.scatter([a + dx] * len(r.dims), r.dims, color=color, s=18,
                           label=f"{kind}, estimated (every draw)" if a == 1 else None, zorder=3)
                if r.expected is not None:
                    ax.scatter([a + 2.5 * dx], [r.expected], marker="x", color=color, s=40, zorder=2)
        ax.scatter([], [], marker="x", color="0.3", s=40, label="closed form (Cor. 3.14, eq. 17)")
        ax.set_xticks(range(1, len(self.results["softmax"]) + 1))
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        return plotting.finish(fig, ax, r"query/key dimension $a$ ($a_i = a$ in every layer)",
                               "dimension of the neuromanifold", f"{self.config.layers} layers of width "
                               f"{self.config.width}: estimated and expected", legend=True)

    def plot_gaps(self, ax=None):
        """Normalised Jacobian spectra for the widest a (softmax), estimated rank marked."""
        return self.results["softmax"][-1].plot_spectrum(ax=ax)

    def figures(self) -> dict:
        return {"fig4_dimensions.png": self.plot_dimensions(), "jacobian_spectrum.png": self.plot_gaps()}


def run_dimension(config: DimensionConfig = DimensionConfig()) -> DimensionSweepResult:
    """Estimate the dimensions of Figure 4. Example: ``print(run_dimension().table())``"""
    c = config.check()
    d = (c.width,) * (c.layers + 1)
    results = {kind: [neuromanifold_dimension(d, (a,) * c.layers, kind=kind, t=c.t, n_samples=c.n_samples,
                                              n_draws=c.n_draws, seed=c.seed + a)
                      for a in progress(range(1, c.width + 1), desc=f"{kind} a")]
               for kind in ("softmax", "lightning")}
    return DimensionSweepResult(c, results)
