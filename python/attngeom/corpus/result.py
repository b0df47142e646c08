"""The result of :func:`attngeom.corpus_statistics`: :class:`CorpusStatistics` (tables, summary,
JSON, cross-layer figures)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict

import numpy as np


def _plain(x):
    """JSON-ready values: arrays become lists, NumPy scalars numbers."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


@dataclass
class CorpusStatistics:
    """Corpus statistics of every head (see :func:`attngeom.corpus_statistics`).

    Attributes
    ----------
    model : dict
        path, family, n_layers, n_heads, d_model, d_head.
    n_texts : int
        Texts with at least one token.
    n_tokens : int
        Tokens seen (after truncation).
    n_partitions : int
        Partitions the corpus was split into (each one's state saved for a resume).
    statistics : dict
        name -> the statistic's ``result()``: arrays of shape (n_layers, n_heads[, ...]) per
        head, (n_layers,) per layer.
    states : dict
        name -> the merged mergeable state (merge it with another corpus' states).
    """

    model: dict
    n_texts: int
    n_tokens: int
    n_partitions: int
    statistics: Dict[str, dict]
    states: dict = field(default_factory=dict, repr=False)

    def per_head(self) -> Dict[str, np.ndarray]:
        """Every (n_layers, n_heads) scalar field, named ``<statistic>_<field>``."""
        L, H = self.model["n_layers"], self.model["n_heads"]
        out = {}
        for name, res in self.statistics.items():
            for key, v in res.items():
                if isinstance(v, np.ndarray) and v.shape == (L, H) and key not in ("count", "rows", "texts"):
                    out[f"{name}_{key}"] = v
        return out

    def table(self) -> list:
        """One dict per head: layer, head and every per-head scalar of :meth:`per_head`."""
        fields = self.per_head()
        L, H = self.model["n_layers"], self.model["n_heads"]
        return [{"layer": layer, "head": head, **{k: float(v[layer, head]) for k, v in fields.items()}}
                for layer in range(L) for head in range(H)]

    def summary(self) -> dict:
        """Named values: counts, the mean over heads of every per-head field, and the per-layer
        whiteness and stationarity (lists) when measured."""
        out = {"n_texts": self.n_texts, "n_tokens": self.n_tokens, "n_partitions": self.n_partitions,
               **{k: v for k, v in self.model.items()}}
        for k, v in self.per_head().items():
            out[f"mean_{k}"] = float(np.mean(v))
        white = self.statistics.get("whiteness")
        if white is not None and white.get("whiteness") is not None:
            out["whiteness_per_layer"] = _plain(white["whiteness"])
            out["stationarity_per_layer"] = _plain(white["stationarity"])
        return out

    def to_json(self, path) -> str:
        """Write {"summary": ..., "statistics": every result array as lists} to path; returns it."""
        with open(path, "w") as f:
            json.dump({"summary": self.summary(), "statistics": _plain(self.statistics)}, f, indent=1)
        return str(path)

    def write_table(self, path) -> str:
        """Write the per-head :meth:`table` as CSV; returns the path."""
        rows = self.table()
        with open(path, "w") as f:
            f.write(",".join(rows[0]) + "\n")
            for r in rows:
                f.write(",".join(f"{v:.10g}" if isinstance(v, float) else str(v) for v in r.values()) + "\n")
        return str(path)

    def plot_profile(self):
        """The profile statistic's figure: every head's mean entropy and sink mass against
        the query position (log axis), or None without it."""
        prof = self.statistics.get("profile")
        if prof is None:
            return None
        from ..plotting import attention_profiles

        return attention_profiles(prof["profile_entropy"], prof["profile_sink_weight"],
                                  positions=prof["profile_positions"],
                                  causal=self.model.get("family") != "bert",
                                  title=f"every query of {self.n_texts} texts ({self.n_tokens} tokens)")

    def plot_layers(self, fields=None):
        """Cross-layer figure: per field, the mean over heads against the layer, with the
        range over heads shaded (and whiteness / stationarity per layer when measured)."""
        import matplotlib.pyplot as plt

        data = self.per_head()
        names = list(fields) if fields is not None else [k for k in data if not k.endswith("_std")]
        white = self.statistics.get("whiteness")
        extra = [] if white is None or white.get("whiteness") is None else ["whiteness", "stationarity"]
        n = len(names) + len(extra)
        cols = min(4, max(n, 1))
        rows = -(-n // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
        layers = np.arange(self.model["n_layers"])
        for ax, name in zip(axes.ravel(), names + extra):
            if name in data:
                v = data[name]
                ax.plot(layers, v.mean(1), marker="o", ms=3)
                ax.fill_between(layers, v.min(1), v.max(1), alpha=0.25)
            else:
                ax.plot(layers, white[name], marker="o", ms=3)
            ax.set_title(name, fontsize=8)
            ax.set_xlabel("layer", fontsize=7)
            ax.tick_params(labelsize=7)
        for ax in axes.ravel()[n:]:
            ax.axis("off")
        fig.tight_layout()
        return fig
