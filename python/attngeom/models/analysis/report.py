"""The per-head report of a model (``attngeom heads``): tables, figures, an HTML page.

For every head: the spectrum of B = W_Q W_K^T (rank, entropy effective rank, the number of
singular values holding 90% and 99% of the energy E_k) and its parameter nulls
(Laplace-Radon s.5.3, s.6.1), the spectrum of W_OV (the notes' r_eff and E_k); with
activations of one or several texts, the Laplace radii (eq. 9, 16), tilt coverage and
limited-angle nulls (s.6.2, s.12.1), routing ranks (s.6.3) and attention entropies, each a
mean over the texts with its spread. Figures: per-layer distributions over heads and a
layer x head grid of the main quantities (:data:`CROSS_LAYER`), and for chosen heads the two
spectra, the attention heat map labelled with the tokens and the Laplace-Radon diagnostics
(radii against the chi prediction, the tilt covariance and routing spectra, as in the
tomography figures). :meth:`HeadReport.save` writes heads.json (with a glossary of its
fields, :data:`FIELDS`), attention.npz, the PNGs, summary.md and a self-contained report.html.

The report leads: for a causal decoder its table holds every head's induction, previous-token
and duplicate-token scores (:func:`attngeom.models.induction_scores`), the page opens with the
heads that stand out (:meth:`HeadReport.leads`: the induction head, the previous-token head,
the heads whose ablation matters most, the direct logit attribution) and an interactive view
of where every head looks (:func:`attngeom.models.head_view`), and the heads drawn in detail
are the top ones by ablation effect, else by induction and previous-token score, else the
spectral extremes (:func:`detail_heads`, which states its criterion).
"""
from __future__ import annotations

import io
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ... import _operands
from ..._deprecation import renamed_field
from ...attention import softmax_attention
from ...errors import NonFiniteOperand
from ...head_diagnostics import HeadDiagnostics
from ...spectral import cumulative_energy
from ..nn.heads import ModelHeads
from .prompt import resolve_heads


def _energy_count(s: np.ndarray, level: float) -> np.ndarray:
    """Smallest k with E_k >= level, per spectrum (..., K) -> (...)."""
    e = cumulative_energy(s, spectrum=True)
    return np.argmax(e >= level - 1e-12, axis=-1) + 1


# The per-head quantities of the cross-layer figures and the per-layer table: (table key, label).
CROSS_LAYER = (
    ("bilinear_effective_rank", "B effective rank (entropy)"),
    ("ov_effective_rank", r"$W_{OV}$ effective rank (energy)"),
    ("radius_mean", r"radius $\tau$ (mean)"),
    ("tilt_effective_dim", "tilt effective dimension"),
    ("routing_effective_rank_mean", "routing effective rank of P"),
    ("attention_entropy", "attention row entropy (nats)"),
    ("sink_weight", "attention-sink mass (weight on key 0)"),
)

# What every field of the table means (heads.json "fields", the HTML glossary).
FIELDS = {
    "layer": "layer index, from 0",
    "head": "head index within the layer, from 0",
    "bilinear_rank": "rank of B = W_Q W_K^T (Laplace-Radon s.5.3), from the weights",
    "bilinear_effective_rank": "entropy effective rank exp(H(sigma / sum sigma)) of B's singular values (s.12.1)",
    "bilinear_sigma_max": "largest singular value of B",
    "ker_WQ_T_dim": "dimension of ker W_Q^T in token space, a parameter null (eq. 18)",
    "ker_WK_T_dim": "dimension of ker W_K^T in token space, a parameter null (eq. 18)",
    "ker_B_dim": "dimension of ker B: token directions no query can see (eq. 18-19)",
    "ker_BT_dim": "dimension of ker B^T: token directions no key can show (eq. 18-19)",
    "ov_rank": "rank of W_OV = W_V W_O (row convention x -> x W_V W_O)",
    "ov_effective_rank": "energy effective rank of W_OV (the notes' r_eff = (sum s^2)^2 / sum s^4)",
    "ov_sigma_max": "largest singular value of W_OV",
    "bilinear_k90": "singular values of B holding 90% of the energy (smallest k with E_k >= 0.9)",
    "bilinear_k99": "singular values of B holding 99% of the energy",
    "ov_k90": "singular values of W_OV holding 90% of the energy",
    "ov_k99": "singular values of W_OV holding 99% of the energy",
    "radius_mean": "mean Laplace radius tau = |q| / sqrt(d_head) over the tokens (eq. 9, 16)",
    "radius_std": "standard deviation of the radii over the tokens",
    "tilt_effective_dim": "participation ratio of the eigenvalues of the uncentred E[u u^T], u = q / |q| the tilts "
                          "(s.6.2, eq. 58), per text (mean over the texts); the detail figures' 'centred Cov(u), "
                          "tokens pooled' is another quantity",
    "tilt_rank": "dimension of the span of the tilts in key space",
    "tilt_null_dim": "dimension of the key-space limited-angle null span(U)^perp (eq. 21)",
    "token_effective_dim": "participation ratio of the token-space normals n = W_K u (eq. 22)",
    "token_null_dim": "dimension of the token-space limited-angle null span(N)^perp (eq. 23)",
    "token_space_dim": "dimension of token space with the biases in homogeneous coordinates, d_model + 1",
    "routing_rank_mean": "rank of the routing matrix P (s.6.3)",
    "routing_nullity_mean": "n - rank(P): the routing null of the keys (s.6.3)",
    "routing_effective_rank_mean": "entropy effective rank of P's singular values (s.13.7)",
    "attention_entropy": "row entropy of P in nats, mean over every query of the text (log n for uniform rows, 0 for "
                         "one-hot; streaming statistics, no P formed)",
    "sink_weight": "weight on the first token (key 0), mean over every query: the attention-sink mass",
    "mean_distance": "expected query-key distance sum_j p_ij |i - j| in positions, mean over every query",
    "log_z_min": "smallest log partition log sum_j exp(s_ij) over the queries (s_ij the scaled logits)",
    "log_z_max": "largest log partition over the queries",
    "induction_score": "attention from a repeated token to the token after its earlier occurrence, mean over the "
                       "induction probe's queries (repeated random tokens; the page names the probe): 1 for an "
                       "induction head",
    "previous_token_score": "attention to the previous position, mean over the induction probe's positions: 1 for "
                            "a previous-token head",
    "duplicate_token_score": "attention from a repeated token to its own earlier occurrence, mean over the induction "
                             "probe's queries: 1 for a duplicate-token head",
    "direct_logit_attribution": "the head's direct part of the logit of the text's last token, read at the position "
                                "before it through the final norm with its scale frozen "
                                "(attngeom.models.logit_attribution)",
}
#: The table's fields from :func:`attngeom.models.induction_scores` (causal decoders).
SCORE_FIELDS = (("induction_score", "induction"), ("previous_token_score", "previous_token"),
                ("duplicate_token_score", "duplicate_token"))
# Fields from the streaming statistics of every query (the others that need data use the window).
_STREAM_KEYS = ("attention_entropy", "sink_weight", "mean_distance", "log_z_min", "log_z_max")
#: Texts longer than this many tokens: the fields that need the routing matrix P or the
#: radii (routing ranks, radii, tilt coverage, the heat maps, attention.npz) use their first
#: WINDOW tokens (for a causal model the first WINDOW rows of P exactly).
WINDOW = 512
_SPREAD = "_spread"
# The routing matrices of every head are kept (and saved) up to this many bytes in float32.
_ROUTING_BYTES = 1 << 28


@dataclass
class HeadReport:
    """The report of one model (module docstring).

    Attributes
    ----------
    model : dict
        The model's dimensions and layout (:meth:`ModelHeads.summary`).
    diagnostics : HeadDiagnostics
        Every head's diagnostics: the weights and, with activations, the first text.
    chosen : list of (int, int)
        The (layer, head) pairs drawn in detail.
    routing : dict
        {(layer, head): (n, n) routing matrix of the first text} for the chosen heads.
    tokens : list of list of str, or None
        The token strings of every text (None when unknown).
    source : str
        Where the activations came from.
    seconds : dict
        Timings.
    text_values : dict
        {data field: (n_texts, n_layers, n_heads) array}: the data fields of :meth:`table`
        per text, before the mean and spread over texts.
    text_routing : list of ndarray or None
        Per text, the (n_layers, n_heads, n, n) float32 routing matrices of every head;
        None when they would exceed 256 MB (then only ``routing`` is kept). ``attention`` is
        its deprecated old name.
    queries : dict
        {(layer, head): (m, d_head) queries} of the chosen heads, pooled over the texts (the
        Laplace-Radon panels: radii and tilts).
    profiles : dict or None
        {"entropy", "sink_weight"}: (n_layers, n_heads, n) float32 per query of the first
        text, from the streaming statistics (the attention_profile.png figure).
    window : int or None
        The tokens per text the P- and radius-based fields use (None when no text is longer).
    effects : CausalEffects or None
        Ablation effects, singular-direction curves and invariance checks
        (:func:`attngeom.models.causal_effects`; ``attngeom heads --effects``).
    scores : InductionScores or None
        Induction, previous-token and duplicate-token scores (the table's ``*_score`` fields).
    view : HeadView or None
        The interactive head view report.html embeds (:func:`attngeom.models.head_view`).
    attribution : dict or None
        Direct logit attribution of the drawn text's last token (:func:`report_attribution`).
    criterion : str
        How the heads drawn in detail were chosen (:func:`detail_heads`).
    map_text : int
        The text whose maps and profile are drawn.
    """

    model: dict
    diagnostics: HeadDiagnostics
    chosen: List[Tuple[int, int]]
    routing: Dict[Tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    tokens: Optional[List[List[str]]] = None
    source: str = "weights"
    seconds: dict = field(default_factory=dict)
    text_values: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    text_routing: Optional[List[np.ndarray]] = field(default=None, repr=False)
    queries: Dict[Tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)
    profiles: Optional[Dict[str, np.ndarray]] = field(default=None, repr=False)
    window: Optional[int] = None
    effects: Any = field(default=None, repr=False)
    scores: Any = field(default=None, repr=False)
    view: Any = field(default=None, repr=False)
    attribution: Any = field(default=None, repr=False)
    criterion: str = ""
    map_text: int = 0
    attention = renamed_field("text_routing")

    @property
    def n_texts(self) -> int:
        """Number of texts (sequences) the data fields are aggregated over (0 without data)."""
        return len(next(iter(self.text_values.values()))) if self.text_values else 0

    def table(self) -> list:
        """One dict of named scalars per head, layer-major.

        The fields of :meth:`attngeom.HeadDiagnostics.table` plus bilinear_k90/k99,
        ov_k90/k99 (singular values needed for 90% / 99% of the energy) and, with data,
        attention_entropy; each data field is the mean over the texts, and with several
        texts ``<field>_spread`` is its standard deviation over them (:data:`FIELDS`).
        """
        d = self.diagnostics
        k = {"bilinear_k90": _energy_count(d.nulls.singular_values, 0.90),
             "bilinear_k99": _energy_count(d.nulls.singular_values, 0.99)}
        if d.ov_singular_values is not None:
            k["ov_k90"] = _energy_count(d.ov_singular_values, 0.90)
            k["ov_k99"] = _energy_count(d.ov_singular_values, 0.99)
        several = self.n_texts > 1
        mean = {key: v.mean(0) for key, v in self.text_values.items()}
        spread = {key: v.std(0) for key, v in self.text_values.items()} if several else {}
        rows = []
        for row in d.table():
            layer, head = row.pop("head")
            out = {"layer": layer, "head": head}
            out.update(row)
            out.update({name: int(v[layer, head]) for name, v in k.items()})
            for key in self.text_values:
                if several or key not in out:
                    out[key] = float(mean[key][layer, head])
            for key in spread:
                out[key + _SPREAD] = float(spread[key][layer, head])
            if "token_null_dim" in out and self.model.get("homogeneous"):
                out["token_space_dim"] = self.model["d_model"] + 1
            if self.attribution is not None:
                out["direct_logit_attribution"] = float(self.attribution["heads"][layer, head])
            if self.scores is not None:
                for key, name in SCORE_FIELDS:
                    if getattr(self.scores, name, None) is not None:
                        out[key] = float(getattr(self.scores, name)[layer, head])
            rows.append(out)
        return rows

    def fields(self) -> dict:
        """{field: description} for every field of :meth:`table` (the glossary of heads.json)."""
        out = {}
        for key in self.table()[0]:
            if key.endswith(_SPREAD):
                out[key] = f"standard deviation over the {self.n_texts} texts of {key[:-len(_SPREAD)]}"
            else:
                out[key] = FIELDS.get(key, "")
        return out

    def leads(self) -> List[str]:
        """The heads that stand out, one sentence each (the first screen of report.html and of
        summary.md): the best induction, previous-token and duplicate-token heads with their
        scores and the probe, the heads whose ablation changes the loss most, the direct logit
        attribution's largest heads, and which heads are drawn in detail and why."""
        out = []
        if self.scores is not None:
            sc = self.scores
            (l, h, v), = sc.top(1)
            (lp, hp, vp), = sc.top(1, by="previous_token")
            if v >= 0.3:
                lead = f"Induction head: L{l}H{h} (induction score {v:.3f})."
            else:  # the highest score is named, not called an induction head
                lead = f"No induction head: the highest induction score is L{l}H{h}'s, {v:.3f} (below 0.3)."
            out.append(f"{lead} Highest previous-token score: L{lp}H{hp} ({vp:.3f}).")
            if getattr(sc, "duplicate_token", None) is not None:
                (ld, hd, vd), = sc.top(1, by="duplicate_token")
                out[-1] += f" Highest duplicate-token score: L{ld}H{hd} ({vd:.3f})."
            if getattr(sc, "probe", ""):
                out.append(f"Scores on the induction probe: {sc.probe} (another probe gives other numbers: scores "
                           f"are those of their probe).")
        if self.effects is not None:
            h = self.effects.heads
            out.append(f"Largest {h.mode}-ablation effects on the {h.metric} of text 0 ({self.effects.n_tokens} "
                       f"tokens, baseline {h.baseline:.4g}): "
                       + ", ".join(f"L{a}H{b} {e:+.3g}" for a, b, e in h.top(3)) + ".")
        if self.attribution is not None:
            a = self.attribution
            top = ", ".join(f"{name} {v:+.3g}" for name, v in a["top"])
            out.append(f"Direct logit attribution {a['description']}: {top}.")
        if self.chosen:
            out.append("Drawn in detail: " + ", ".join(f"L{l}H{h}" for l, h in self.chosen)
                       + (f" ({self.criterion})." if self.criterion else "."))
        return out

    def summary(self) -> dict:
        """The model's dimensions, the source of the activations, and means over heads."""
        rows = self.table()
        means = {key: float(np.mean([r[key] for r in rows])) for key in rows[0] if key not in ("layer", "head")}
        lengths = None if self.tokens is None else [len(t) for t in self.tokens]
        return {**self.model, "source": self.source, "n_texts": self.n_texts,
                "n_tokens": None if lengths is None else int(sum(lengths)), "text_lengths": lengths,
                "window": self.window, "chosen": [list(c) for c in self.chosen], "criterion": self.criterion,
                "map_text": self.map_text, "leads": self.leads(), "seconds": self.seconds, "mean": means}

    def binned_profiles(self) -> Optional[dict]:
        """The per-position profiles of the first text in geometric position bins (the JSON's
        "profiles"): {"positions": bin centres (position + 1), "entropy", "sink_weight":
        (n_layers, n_heads, bins) means within the bins as nested lists}; None without data."""
        if self.profiles is None:
            return None
        from ...plotting import log_position_bins

        n = self.profiles["entropy"].shape[-1]
        edges, centers = log_position_bins(n)
        out = {"positions": centers.tolist(), "bin_edges": edges.tolist()}
        for key, a in self.profiles.items():
            out[key] = np.stack([a[..., lo:hi].mean(-1) for lo, hi in zip(edges[:-1], edges[1:])],
                                axis=-1).round(6).tolist()
        return out

    def layer_means(self) -> list:
        """Per layer, the mean over its heads of the cross-layer quantities (:data:`CROSS_LAYER`).

        Returns a list of {"layer": l, field: mean, ...}, one dict per layer, with the fields
        of :data:`CROSS_LAYER` present in :meth:`table` (the data fields need activations).
        """
        keys = [k for k, _ in CROSS_LAYER if k in self.table()[0]]
        grids = {k: self.grid(k) for k in keys}
        return [{"layer": layer, **{k: float(g[layer].mean()) for k, g in grids.items()}}
                for layer in range(self.model["n_layers"])]

    def to_json(self, path) -> str:
        """Write {"summary", "fields", "tokens", "heads"} to path; returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"summary": self.summary(), "fields": self.fields(), "tokens": self.tokens,
                       "heads": self.table(), "profiles": self.binned_profiles(),
                       "effects": None if self.effects is None else self.effects.to_dict()}, f, indent=2)
        return str(path)

    def to_dataframe(self):
        """The table as a pandas DataFrame, one row per head (pandas is optional).

        Returns
        -------
        pandas.DataFrame
            Columns ``layer``, ``head`` and the fields of :meth:`table`.
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("HeadReport.to_dataframe needs pandas, which is not installed: pip install pandas "
                              "(or use HeadReport.table(), a list of dicts)") from None
        return pd.DataFrame(self.table())

    def grid(self, metric: str) -> np.ndarray:
        """(n_layers, n_heads) values of one metric of :meth:`table`."""
        rows = self.table()
        if metric not in rows[0] or metric in ("layer", "head"):
            raise ValueError(f"metric must be one of {[k for k in rows[0] if k not in ('layer', 'head')]}, "
                             f"got {metric!r}")
        out = np.zeros((self.model["n_layers"], self.model["n_heads"]))
        for r in rows:
            out[r["layer"], r["head"]] = r[metric]
        return out

    def _cross_layer_maps(self) -> dict:
        first = self.table()[0]
        return {label: self.grid(key) for key, label in CROSS_LAYER if key in first}

    def plot_cross_layer(self, axes=None, *, kind: str = "box"):
        """Per layer, the distribution over heads of each quantity of :data:`CROSS_LAYER`."""
        from ... import plotting

        return plotting.layer_distributions(self._cross_layer_maps(), axes, kind=kind)

    def plot_laplace_radon(self, layer: int, head: int, axes=None):
        """One chosen head's Laplace-Radon diagnostics, as in the tomography figures.

        Radius histogram against the scaled chi prediction (Fig. 2), the spectrum of the tilt
        covariance Cov(u) (Fig. 5) over the pooled tokens of every text, and the singular
        values of the routing matrix P on the first text (Fig. 7).
        """
        from ... import plotting
        from ...spectral import effective_rank, singular_values, tilt_coverage

        if (layer, head) not in self.queries:
            raise ValueError(f"(layer, head) must be a chosen head with activations {sorted(self.queries)}, "
                             f"got ({layer}, {head})")
        q = self.queries[layer, head]
        d_head = q.shape[-1]
        tau = np.linalg.norm(q, axis=-1) / np.sqrt(d_head)
        cov = tilt_coverage(q, centered=True)
        fig, axes = plotting.panel_row(axes, 3, 4.2, 3.3)
        plotting.radius_vs_chi(tau, d_head, float(np.mean(q * q)), ax=axes[0],
                               title=f"L{layer}H{head} radii ({tau.size} tokens)")
        # Not the table's tilt_effective_dim (uncentred E[u u^T], per text, averaged): a name of its own.
        plotting.eigen_spectrum(cov.eigenvalues, f"L{layer}H{head} centred Cov(u), tokens pooled: "
                                                 f"participation {cov.effective_dim:.2f}", ax=axes[1])
        P = self.routing[layer, head]
        s = singular_values(P)
        plotting.eigen_spectrum(s, f"L{layer}H{head} P (text 0): eff. rank "
                                   f"{float(effective_rank(s, kind='entropy', spectrum=True)):.2f} of {P.shape[0]}",
                                ax=axes[2], ylabel="singular value")
        for ax in axes:
            ax.title.set_fontsize(9)
        fig.tight_layout()
        return fig

    def figures(self) -> dict:
        """{file name: matplotlib figure}.

        layer_head_grids.png (a layer x head grid per quantity), cross_layer.png (box plots
        over heads per layer), spectra_L<l>_H<h>.png for every chosen head and, with
        activations, attention_L<l>_H<h>.png (tokens on the axes) and laplace_radon_L<l>_H<h>.png.
        """
        from ... import plotting

        maps = self._cross_layer_maps()
        figs = {"layer_head_grids.png": plotting.layer_head_grids(maps),
                "cross_layer.png": plotting.layer_distributions(maps)}
        if self.profiles is not None:
            n = self.profiles["entropy"].shape[-1]
            figs["attention_profile.png"] = plotting.attention_profiles(
                self.profiles["entropy"], self.profiles["sink_weight"], causal=bool(self.model.get("causal", True)),
                title=f"every head over {n} tokens" + (f" (text {self.map_text})" if self.n_texts > 1 else ""))
        d = self.diagnostics
        tokens = None if self.tokens is None else self.tokens[self.map_text]
        which = f" (text {self.map_text})" if self.n_texts > 1 else ""
        for layer, head in self.chosen:
            ov = None if d.ov_singular_values is None else d.ov_singular_values[layer, head]
            figs[f"spectra_L{layer}_H{head}.png"] = plotting.head_spectrum_pair(
                d.nulls.singular_values[layer, head], ov, title=f"L{layer}H{head}")
            if (layer, head) in self.routing:
                figs[f"attention_L{layer}_H{head}.png"] = plotting.attention_heatmap(
                    self.routing[layer, head], tokens,
                    title=f"L{layer}H{head} attention" + which)
            if (layer, head) in self.queries:
                figs[f"laplace_radon_L{layer}_H{head}.png"] = self.plot_laplace_radon(layer, head)
        if self.effects is not None:
            figs.update(self.effects.figures())
        return figs

    def markdown(self, figure_names: Sequence[str] = ()) -> str:
        """summary.md: the model, the per-layer table (:meth:`layer_means`), the chosen heads."""
        s = self.summary()
        lines = [f"# Heads report: {self.model.get('name') or 'model'}", "",
                 f"{s.get('model_type') or s['layout']} model, {s['n_layers']} layers x {s['n_heads']} heads (kv heads {s['n_kv_heads']}), "
                 f"d_model {s['d_model']}, d_head {s['d_head']}.", "", f"Source: {self.source}."]
        if self.tokens is not None:
            lines.append(f"{self.n_texts} text(s), {s['n_tokens']} tokens ({', '.join(map(str, s['text_lengths']))})"
                         + ("; data fields are means over the texts, *_spread their standard deviations."
                            if self.n_texts > 1 else "."))
            if self.window is not None:
                lines.append(f"Routing ranks, radii, tilt coverage and the attention heat maps use the first "
                             f"{self.window} tokens of each text; attention_entropy, sink_weight, mean_distance and "
                             f"log_z_* every query (streaming statistics, attention_profile.png).")
        leads = self.leads()
        if leads:
            lines += ["", "## What stands out", ""] + [f"- {x}" for x in leads]
        lines += ["", "## Per layer: mean over heads", "", _markdown_table(self.layer_means()), ""]
        rows = {(r["layer"], r["head"]): r for r in self.table()}
        lines += ["## Heads drawn in detail", ""]
        for layer, head in self.chosen:
            r = rows[layer, head]
            text = ", ".join(f"{k} {r[k]:.4g}" for k, _ in CROSS_LAYER if k in r)
            lines.append(f"- L{layer}H{head}: {text}")
        if self.effects is not None:
            lines += ["", self.effects.markdown().rstrip()]
        if figure_names:
            lines += ["", "## Files", "", "heads.json (table, field glossary, tokens), attention.npz (tokens and "
                      "routing matrices), report.html (everything in one page), "
                      + ", ".join(figure_names)]
        return "\n".join(lines) + "\n"

    def html(self, pngs: Optional[Dict[str, bytes]] = None) -> str:
        """report.html: one self-contained page (figures inlined as base64 PNG, a sortable
        table of heads, the glossary); ``pngs`` are the rendered figures (rendered here if None)."""
        if pngs is None:
            pngs = {name: _png(fig) for name, fig in self.figures().items()}
        return _html_page(self, pngs)

    def save(self, folder) -> list:
        """Write the report into folder; returns the written paths.

        heads.json (summary, field glossary, tokens, one row per head), attention.npz
        (``tokens_<t>`` and ``attention_<t>``, (n_layers, n_heads, n, n) float32, for every
        text t; when those exceed 256 MB, ``routing_L<l>_H<h>`` of the chosen heads on the
        first text instead), every figure as PNG, summary.md and report.html.
        """
        os.makedirs(folder, exist_ok=True)
        paths = [self.to_json(os.path.join(folder, "heads.json"))]
        if self.tokens is not None or self.routing:
            arrays = {}
            for t, toks in enumerate(self.tokens or []):
                arrays[f"tokens_{t}"] = np.array(toks, dtype=str)
            if self.text_routing is not None:
                arrays.update({f"attention_{t}": a for t, a in enumerate(self.text_routing)})
            else:
                arrays.update({f"routing_L{l}_H{h}": p.astype(np.float32) for (l, h), p in self.routing.items()})
            path = os.path.join(folder, "attention.npz")
            np.savez_compressed(path, **arrays)
            paths.append(path)
        pngs = {}
        for name, fig in self.figures().items():
            pngs[name] = _png(fig)
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(pngs[name])
            paths.append(path)
        for name, text in (("summary.md", self.markdown(list(pngs))), ("report.html", _html_page(self, pngs))):
            path = os.path.join(folder, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            paths.append(path)
        return paths


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _fmt(v) -> str:
    return str(v) if isinstance(v, (int, np.integer)) else f"{v:.4g}"


def _markdown_table(rows: list) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out)


_SORT_JS = """document.querySelectorAll("table.sortable th").forEach(function (th, i) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0], rows = Array.from(body.rows), up = th.dataset.up !== "1";
    rows.sort(function (a, b) { return (parseFloat(a.cells[i].dataset.v) - parseFloat(b.cells[i].dataset.v)) * (up ? 1 : -1); });
    th.closest("tr").querySelectorAll("th").forEach(function (h) { h.dataset.up = ""; });
    th.dataset.up = up ? "1" : "0";
    rows.forEach(function (r) { body.appendChild(r); });
  });
});"""

_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:12px}
.wide{overflow-x:auto;max-width:100%}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee;cursor:pointer;position:sticky;top:0}
img{max-width:100%;border:1px solid #eee;margin:4px 0}dt{font-weight:bold}.tokens{font-family:monospace;font-size:12px}
.leads{background:#f6f8fa;border:1px solid #ddd;padding:0 1em;font-size:14px}"""


def constant_fields(rows: List[dict]) -> Dict[str, float]:
    """{field: value} of the table's fields that are equal for every head (layer, head and the
    spreads aside): a report states them once, above the table, instead of in a column."""
    if len(rows) < 2:
        return {}
    return {k: rows[0][k] for k in rows[0]
            if k not in ("layer", "head") and not k.endswith(_SPREAD)
            and isinstance(rows[0][k], (int, float)) and all(r.get(k) == rows[0][k] for r in rows)}


def _html_page(report: HeadReport, pngs: Dict[str, bytes]) -> str:
    import base64
    from html import escape

    s = report.summary()
    rows = report.table()
    title = f"attngeom heads: {escape(str(report.model.get('name') or 'model'))}"
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style></head><body>",
           f"<h1>{title}</h1>",
           f"<p>{escape(s.get('model_type') or s['layout'])} model, {s['n_layers']} layers x {s['n_heads']} heads (kv heads {s['n_kv_heads']}), "
           f"d_model {s['d_model']}, d_head {s['d_head']}. Source: {escape(report.source)}.</p>"]
    leads = report.leads()
    if leads:
        out.append("<div class='leads'><h2>What stands out</h2><ul>" + "".join(f"<li>{escape(x)}</li>" for x in leads)
                   + "</ul></div>")
    if report.view is not None:
        out.append(f"<h2>Where each head looks</h2><p>Text {report.map_text}: hover a token to see the chosen head's "
                   "weights from it (click pins it), beside the head's entropy, sink weight and mean distance.</p>"
                   + report.view.html("head-view"))

    def img(name):
        if name in pngs:
            out.append(f"<figure><img alt='{escape(name)}' src='data:image/png;base64,"
                       f"{base64.b64encode(pngs[name]).decode('ascii')}'><figcaption>{escape(name)}</figcaption></figure>")

    layer_rows = report.layer_means()
    out.append("<h2>Per layer: mean over heads</h2><table class='sortable'><thead><tr>"
               + "".join(f"<th title='{escape(FIELDS.get(k, ''))}'>{escape(k)}</th>" for k in layer_rows[0])
               + "</tr></thead><tbody>")
    for r in layer_rows:
        out.append("<tr>" + "".join(f"<td data-v='{r[k]}'>{_fmt(r[k])}</td>" for k in r) + "</tr>")
    out.append("</tbody></table><h2>Across layers</h2>")
    if "attention_profile.png" in pngs:
        out.append("<h3>Every query: entropy and sink mass against position</h3>"
                   + (f"<p>Routing ranks, radii, tilt coverage and the heat maps use the first {report.window} "
                      f"tokens of each text; the profile and the streaming fields every query.</p>"
                      if report.window is not None else ""))
        img("attention_profile.png")
    img("cross_layer.png")
    img("layer_head_grids.png")
    fields = report.fields()
    constant = constant_fields(rows)
    keys = [k for k in rows[0] if not k.endswith(_SPREAD) and k not in constant]
    out.append("<h2>Heads</h2>")
    if constant:
        out.append("<p>The same for every head: " + "; ".join(
            f"<span title='{escape(fields[k])}'>{escape(k)} {_fmt(v)}</span>" for k, v in constant.items())
            + f". The kernels ker_* live in the model's space R^{report.model['d_model']}"
            + (f"; the token-space nulls in R^{report.model['d_model'] + 1}: the keys are affine in x "
               "(x W_K + b_K), so they are read in homogeneous coordinates [x, 1]" if "token_space_dim" in rows[0]
               else "") + ".</p>")
    out.append("<p>Click a column to sort; hover a column name for its meaning."
               + (" Data fields: mean &plusmn; standard deviation over the texts." if report.n_texts > 1 else "")
               + "</p><div class='wide'><table class='sortable'><thead><tr>"
               + "".join(f"<th title='{escape(fields[k])}'>{escape(k)}</th>" for k in keys) + "</tr></thead><tbody>")
    for r in rows:
        cells = []
        for k in keys:
            text = _fmt(r[k]) + (f" &plusmn; {_fmt(r[k + _SPREAD])}" if k + _SPREAD in r else "")
            cells.append(f"<td data-v='{float(r[k])}'>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div><h2>Heads drawn in detail</h2>"
               + (f"<p>Chosen by {escape(report.criterion)}.</p>" if report.criterion else ""))
    for layer, head in report.chosen:
        out.append(f"<h3>L{layer}H{head}</h3>")
        for prefix in ("spectra", "attention", "laplace_radon"):
            img(f"{prefix}_L{layer}_H{head}.png")
    if report.effects is not None:
        _html_effects(report.effects, out, img)
    if report.tokens is not None:
        out.append("<h2>Tokens</h2>")
        for t, toks in enumerate(report.tokens):
            out.append(f"<p class='tokens'>text {t} ({len(toks)} tokens): " + " ".join(escape(x) for x in toks) + "</p>")
    out.append("<h2>Fields</h2><dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in fields.items())
               + f"</dl><script>{_SORT_JS}</script></body></html>")
    return "\n".join(out)


def _html_effects(effects, out: list, img) -> None:
    """The causal section of report.html: the ablation map, the ranked heads, the direction
    curves, the spectrum-vs-effect scatter and the invariance checks."""
    from html import escape

    h = effects.heads
    out.append(f"<h2>Causal effects</h2><p>{escape(h.mode)}-ablating each head's output z on the first text "
               f"({effects.n_tokens} tokens); baseline {escape(h.metric)} {h.baseline:.4g}.</p>")
    img("ablation_effects.png")
    out.append("<table class='sortable'><thead><tr><th>rank</th><th>layer</th><th>head</th><th>effect</th></tr>"
               "</thead><tbody>")
    for r in sorted(h.table(), key=lambda r: r["rank"]):
        out.append("<tr>" + "".join(f"<td data-v='{r[k]}'>{_fmt(r[k])}</td>"
                                    for k in ("rank", "layer", "head", "effect")) + "</tr>")
    out.append("</tbody></table><h3>Singular directions of the heads that matter most</h3>")
    img("spectrum_vs_effect.png")
    for d in effects.directions:
        img(f"directions_L{d.layer}_H{d.head}.png")
    out.append("<h3>Invariances (Laplace-Radon s.5-6)</h3><table><thead><tr>"
               + "".join(f"<th>{k}</th>" for k in ("layer", "head", "check", "expected", "measured", "other heads"))
               + "</tr></thead><tbody>")
    for r in effects.invariances:
        others = "" if r["others"] is None else f"{r['others']:.3g}"
        out.append(f"<tr><td>{r['layer']}</td><td>{r['head']}</td><td>{escape(r['check'])}</td>"
                   f"<td>{escape(r['expected'])}</td><td>{r['measured']:.3g}</td><td>{others}</td></tr>")
    out.append("</tbody></table>")


def detail_heads(d: HeadDiagnostics, *, effects=None, scores=None, n: int = 3) -> Tuple[List[Tuple[int, int]], str]:
    """The heads drawn in detail and the criterion that picked them, in words.

    With ablation effects (``effects``, :class:`CausalEffects`), the `n` heads whose ablation
    changes the loss most; else, with induction scores, the best induction, previous-token and
    duplicate-token heads; else the spectral extremes (lowest and highest bilinear effective
    rank, lowest W_OV effective rank).
    """
    if effects is not None:
        return ([(l, h) for l, h, _ in effects.heads.top(n)],
                f"the {n} largest {effects.heads.mode}-ablation effects on the {effects.heads.metric}")
    if scores is not None:
        out = []
        for by in ("induction", "previous_token", "duplicate_token"):
            if getattr(scores, by, None) is not None:
                lh = tuple(scores.top(1, by=by)[0][:2])
                if lh not in out:
                    out.append(lh)
        return out, "the best induction, previous-token and duplicate-token heads"
    return _default_chosen(d), "the lowest and highest B effective rank and the lowest W_OV effective rank"


def report_attribution(model, ids, tokens=None) -> Optional[dict]:
    """Direct logit attribution of a text's last token at the position before it, for the report:
    {"description", "top" (component, part) x 3, "heads" (n_layers, n_heads), "total"}; None for a
    model without an unembedding or per-head W_V, W_O (or a text of one token)."""
    from .attribution import logit_attribution

    if len(ids) < 2 or not model.has_unembedding or model.arch.bidirectional or model.arch.mla:
        return None
    try:
        a = logit_attribution(model, ids, answer=int(ids[-1]), position=-2)
    except ValueError:  # no final norm, no per-head circuits
        return None
    word = repr(tokens[-1]) if tokens is not None else f"id {int(ids[-1])}"
    return {"description": f"of the text's last token {word} (its logit at the position before it, "
                           f"{a.total:.3g})", "top": a.top(3), "heads": a.heads, "total": a.total}


def _default_chosen(d: HeadDiagnostics) -> List[Tuple[int, int]]:
    """The heads with the lowest and highest bilinear effective rank and the lowest W_OV one."""
    shape = d.batch_shape
    picks = [np.argmin(d.bilinear_effective_rank), np.argmax(d.bilinear_effective_rank)]
    if d.ov_effective_rank is not None:
        picks.append(np.argmin(d.ov_effective_rank))
    out = []
    for p in picks:
        lh = tuple(int(i) for i in np.unravel_index(int(p), shape))
        if lh not in out:
            out.append(lh)
    return out


def _texts(x, tokens, heads: ModelHeads):
    """x and tokens -> a list of (n_layers, n_i, d_model) float64 arrays and a list of token lists."""
    if x is None:
        if tokens is not None:
            raise ValueError("tokens need activations x")
        return [], None
    if isinstance(x, (list, tuple)) and x and all(np.ndim(e) >= 3 for e in x):
        items = [np.asarray(e, dtype=np.float64) for e in x]
    else:
        a = np.asarray(x, dtype=np.float64)
        items = [a] if a.ndim == 3 else ([a[:, i] for i in range(a.shape[1])] if a.ndim == 4 else [a])
    shape = f"({heads.n_layers}, n, {heads.d_model})"
    texts = []
    for i, a in enumerate(items):
        if a.ndim == 4 and a.shape[1] == 1:
            a = a[:, 0]
        if a.ndim != 3 or a.shape[0] != heads.n_layers or a.shape[-1] != heads.d_model or a.shape[1] == 0:
            raise ValueError(f"x must have shape {shape} or ({heads.n_layers}, n_seq, n, {heads.d_model}), or be "
                             f"a list of {shape} arrays (one per text); got {a.shape}" + (f" for text {i}" if i else ""))
        if not np.all(np.isfinite(a)):
            raise NonFiniteOperand("x holds non-finite values" + (f" (text {i})" if len(items) > 1 else ""))
        texts.append(a)
    if tokens is None:
        return texts, None
    if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)):
        raise TypeError(f"tokens must be a list of str (one text) or a list of such lists, got {type(tokens).__name__}")
    lists = [list(tokens)] if all(isinstance(t, str) for t in tokens) else [list(t) for t in tokens]
    if len(lists) != len(texts):
        raise ValueError(f"tokens must have one list per text ({len(texts)}), got {len(lists)}")
    for i, (t, a) in enumerate(zip(lists, texts)):
        if len(t) != a.shape[1]:
            raise ValueError(f"tokens must have {a.shape[1]} entries (the activations' n), got {len(t)}"
                             + (f" for text {i}" if len(texts) > 1 else ""))
    return texts, [[str(w) for w in t] for t in lists]


def head_report(heads, x=None, *, tokens=None, chosen=None, bias: bool = True,
                rtol=None, n_heads: Optional[int] = None, source: Optional[str] = None,
                window: int = WINDOW, scores=None, effects=None, map_text: int = 0) -> HeadReport:
    """Every head's geometry: weights-only, or with the activations of one or several texts.

    The per-head diagnostics of Laplace-Radon s.12.1 (spectra of B = W_Q W_K^T and W_OV,
    parameter nulls, with activations radii, tilt coverage, routing ranks and attention
    entropies) behind the ``attngeom heads`` command. With several texts each data field is
    computed per text, then averaged, with its standard deviation over the texts as
    ``<field>_spread``. Cost: weights only, one factored SVD per head (B and W_OV never
    formed), about a second for 144 heads of d_model 768; per text, one routing matrix and
    its SVD per head.

    Parameters
    ----------
    heads : ModelHeads or Model or str or path-like
        Heads, a loaded :class:`Model` (its heads), or a checkpoint path / packaged-model name
        whose heads :func:`load_heads` reads
        (:func:`attngeom.models.analysis.prompt.resolve_heads`).
    x : array_like or list of array_like, optional
        Activations, the input of each layer's attention (see
        :mod:`attngeom.models.analysis.activations`): shape (n_layers, n, d_model) for one text,
        (n_layers, n_seq, n, d_model) for n_seq texts of one length, or a list of
        (n_layers, n_i, d_model) arrays, one per text.
    tokens : list of str, or list of list of str, optional
        The token strings of the text (or of every text), for the figures and the saved files.
    chosen : sequence of (layer, head), optional
        Heads drawn in detail; default :func:`detail_heads`: the largest ablation effects with
        `effects`, else the best induction, previous-token and duplicate-token heads with
        `scores`, else the heads with the lowest and highest bilinear effective rank and the
        lowest W_OV effective rank.
    bias : bool, default True
        As in :meth:`ModelHeads.diagnostics`.
    rtol : float, optional
        Rank threshold, as in :meth:`ModelHeads.diagnostics`.
    n_heads : int, optional
        Needed for a checkpoint without config.json.
    source : str, optional
        A description of where the heads came from, stored in the report.
    window : int, default WINDOW (512)
        Texts longer than this: routing ranks, radii, tilt coverage, the heat maps and the
        saved routing matrices use their first `window` tokens (for a causal model exactly
        the first rows of P); attention_entropy, sink_weight, mean_distance, log_z_min /
        log_z_max and the per-position profile (attention_profile.png) every query, from the
        streaming attention statistics (no (n, n) matrix), so a long document costs memory
        linear in its length.
    scores : InductionScores, optional
        :func:`attngeom.models.induction_scores` of the model: the table's induction,
        previous-token and duplicate-token scores and the page's leads.
    effects : CausalEffects, optional
        :func:`attngeom.models.causal_effects`: the causal section, and the detail heads.
    map_text : int, default 0
        The text whose attention maps and per-position profile are drawn.

    Returns
    -------
    HeadReport
        The diagnostics, a table per head (``table()``, ``to_dataframe()``), per-layer means
        (``layer_means()``), figures, and ``save(folder)`` for heads.json, attention.npz,
        the PNGs, summary.md and report.html.

    Raises
    ------
    ValueError
        For activations, tokens or chosen heads that do not fit the heads;
        :class:`attngeom.errors.NonFiniteOperand` (a ValueError) for activations holding NaN or
        infinity.

    Examples
    --------
    >>> from attngeom.models import head_report
    >>> r = head_report("all-MiniLM-L6-v2")  # needs the models extra
    >>> len(r.table())
    72
    """
    t0 = time.perf_counter()
    heads = resolve_heads(heads, n_heads=n_heads)
    window = _operands.count("window", window)
    t1 = time.perf_counter()
    texts, token_lists = _texts(x, tokens, heads)
    cut = [a[:, :window] for a in texts]  # the P- and radius-based fields: the first `window` tokens
    d = heads.diagnostics(None if not texts else cut[0][:, None], bias=bias, rtol=rtol)
    criterion = "chosen by the caller"
    if chosen is None:
        chosen, criterion = detail_heads(d, effects=effects, scores=scores)
    chosen = [(int(l), int(h)) for l, h in chosen]
    map_text = _operands.count("map_text", map_text, 0)
    if texts and map_text >= len(texts):
        raise ValueError(f"map_text must name one of the {len(texts)} texts (0..{len(texts) - 1}), got {map_text}")
    for l, h in chosen:
        if not (0 <= l < heads.n_layers and 0 <= h < heads.n_heads):
            raise ValueError(f"chosen head ({l}, {h}) is outside {heads.n_layers} layers x {heads.n_heads} heads")
    data_keys = ("radius_mean", "radius_std", "tilt_effective_dim", "tilt_rank", "tilt_null_dim",
                 "token_effective_dim", "token_null_dim", "routing_rank_mean", "routing_nullity_mean",
                 "routing_effective_rank_mean")
    shape = (heads.n_layers, heads.n_heads)
    values = {key: np.zeros((len(texts),) + shape) for key in data_keys + _STREAM_KEYS} if texts else {}
    keep = 4 * heads.n_layers * heads.n_heads * sum(a.shape[1] ** 2 for a in cut) <= _ROUTING_BYTES
    text_routing = [] if texts and keep else None
    routing, queries = {}, {c: [] for c in chosen} if texts else {}
    profiles = None
    for t, (a, w) in enumerate(zip(texts, cut)):
        dt = d if t == 0 else heads.diagnostics(w[:, None], bias=bias, rtol=rtol)
        for row in dt.table():
            layer, head = row["head"]
            for key in data_keys:
                values[key][t, layer, head] = row[key]
        maps = np.empty(shape + (w.shape[1],) * 2, np.float32) if text_routing is not None else None
        if t == map_text:
            profiles = {key: np.empty(shape + (a.shape[1],), np.float32) for key in ("entropy", "sink_weight")}
        for layer in range(heads.n_layers):
            q, k = heads.queries_keys(a[layer], layer, bias=bias)
            # every query's statistics in the streaming kernel (no (n, n) matrix), P on the window only
            _, st = softmax_attention(q, k, None, causal=heads.causal, return_stats=True, layout="bhnd")
            for key, v in (("attention_entropy", st.entropy.mean(-1)), ("sink_weight", st.sink_weight.mean(-1)),
                           ("mean_distance", st.mean_distance.mean(-1)), ("log_z_min", st.log_z.min(-1)),
                           ("log_z_max", st.log_z.max(-1))):
                values[key][t, layer] = v
            if t == map_text:
                profiles["entropy"][layer], profiles["sink_weight"][layer] = st.entropy, st.sink_weight
            m = w.shape[1]
            _, P = softmax_attention(q[:, :m], k[:, :m], None, causal=heads.causal, return_routing=True,
                                     layout="bhnd")
            if maps is not None:
                maps[layer] = P
            for l, h in chosen:
                if l == layer:
                    queries[l, h].append(q[h, :m])
                    if t == map_text:
                        routing[l, h] = P[h]
        if text_routing is not None:
            text_routing.append(maps)
    t2 = time.perf_counter()
    model = heads.summary()
    model["causal"] = bool(heads.causal)
    model["homogeneous"] = bool(texts and bias and (heads.b_Q is not None or heads.b_K is not None))
    longest = max((a.shape[1] for a in texts), default=0)
    return HeadReport(model, d, chosen, routing, token_lists,
                      source or ("weights" if not texts else "activations"),
                      {"load": t1 - t0, "diagnostics": t2 - t1}, values, text_routing,
                      {c: np.concatenate(qs) for c, qs in queries.items()}, profiles,
                      window if longest > window else None, effects=effects, scores=scores, criterion=criterion,
                      map_text=map_text)
