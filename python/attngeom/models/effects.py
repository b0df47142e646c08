"""Causal effects of heads as tables: ablate each head and measure the model's output.

:func:`head_ablation_effects` ablates every head's output ``z`` in turn (zero or mean over the
batch's tokens, :mod:`.interventions`) and reports the change in a metric of the model's
output: the next-token cross-entropy (``"loss"``) or the logit difference of a right and a
wrong answer at the last position (``"logit_diff"``). The clean pass is run once; each
ablation restarts from the clean residual stream entering the ablated layer, so an
ablation in layer l costs the layers l..L-1 only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .forward import check_layers
from .interventions import Ablate

METRICS = ("loss", "logit_diff")


@dataclass
class HeadEffects:
    """The change in a metric when each head is ablated.

    Attributes
    ----------
    effects : ndarray, shape (n_layers, n_heads)
        metric(ablated) - baseline, per head.
    baseline : float
        The metric of the clean pass.
    metric : str
        "loss" (mean next-token cross-entropy, nats) or "logit_diff".
    mode : str
        The ablation ("zero" or "mean").
    """

    effects: np.ndarray
    baseline: float
    metric: str
    mode: str
    seconds: dict = field(default_factory=dict)

    def table(self) -> list:
        """One dict per head: layer, head, effect, rank (1 = largest change of the metric)."""
        L, H = self.effects.shape
        order = np.argsort(-np.abs(self.effects), axis=None, kind="stable")
        rank = np.empty(L * H, int)
        rank[order] = np.arange(1, L * H + 1)
        return [{"layer": l, "head": h, "effect": float(self.effects[l, h]), "rank": int(rank[l * H + h])}
                for l in range(L) for h in range(H)]

    def to_json(self, path) -> str:
        """Write {"metric", "mode", "baseline", "effects", "heads"} to path; returns the path."""
        with open(path, "w") as f:
            json.dump({"metric": self.metric, "mode": self.mode, "baseline": self.baseline,
                       "effects": self.effects.tolist(), "heads": self.table()}, f, indent=1)
        return str(path)

    def plot(self, ax=None):
        """A layer x head map of the effects (diverging colours, zero white).

        Returns the matplotlib figure.
        """
        from ..plotting import axes_or_new

        fig, ax = axes_or_new(ax, figsize=(1.2 + 0.45 * self.effects.shape[1], 1.0 + 0.4 * self.effects.shape[0]))
        top = float(np.abs(self.effects).max()) or 1.0
        im = ax.imshow(self.effects, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{self.mode}-ablation effect on {self.metric} (baseline {self.baseline:.4g})", fontsize=9)
        fig.colorbar(im, ax=ax)
        return fig


def _metric(logits: np.ndarray, ids: np.ndarray, metric: str, answers) -> float:
    """metric of logits (b, n, V) for token ids (b, n)."""
    z = np.asarray(logits, np.float64)
    if metric == "loss":
        z = z[:, :-1]
        top = z.max(-1, keepdims=True)
        logp = z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))
        target = ids[:, 1:]
        return float(-np.take_along_axis(logp, target[..., None], -1).mean())
    right, wrong = answers
    last = z[:, -1]
    return float(np.mean(last[np.arange(len(last)), right] - last[np.arange(len(last)), wrong]))


def head_ablation_effects(model, token_ids, *, mode: str = "mean", metric: str = "loss", answers=None,
                          layers=None, dtype=np.float64) -> HeadEffects:
    """The change in the model's loss (or logit difference) when each head's output is ablated.

    Parameters
    ----------
    model : Model
        A decoder (:func:`attngeom.load_model`).
    token_ids : array_like of int, shape (n,) or (batch, n)
        The prompts (equal lengths, no padding).
    mode : {"mean", "zero"}, default "mean"
        Replace the head's z by its mean over this batch's tokens, or by zeros.
    metric : {"loss", "logit_diff"}, default "loss"
        Mean next-token cross-entropy over the positions 0..n-2, or the mean over the batch
        of logits[right] - logits[wrong] at the last position.
    answers : (array_like, array_like), optional
        (right, wrong) token ids per sequence, for "logit_diff".
    layers : sequence of int, optional
        The layers whose heads are ablated (default all).
    dtype : {np.float64, np.float32}, default np.float64
        The computation dtype.

    Returns
    -------
    HeadEffects
        ``effects`` (n_layers, n_heads): metric(ablated) - metric(clean); NaN for layers not
        ablated.

    Raises
    ------
    ValueError
        For an unknown mode or metric, "logit_diff" without answers, and what
        :meth:`Model.forward` refuses.

    Examples
    --------
    >>> eff = ag.models.head_ablation_effects(model, ids)  # doctest: +SKIP
    >>> eff.table()[0]  # doctest: +SKIP
    {'layer': 0, 'head': 0, 'effect': 0.31, 'rank': 2}
    """
    import time

    if mode not in ("mean", "zero"):
        raise ValueError(f"mode must be 'mean' or 'zero', got {mode!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    ids = np.asarray(token_ids)
    ids = ids[None] if ids.ndim == 1 else ids
    if metric == "logit_diff":
        if answers is None or len(answers) != 2:
            raise ValueError("answers must be (right, wrong) token ids for metric='logit_diff'")
        answers = tuple(np.broadcast_to(np.asarray(a, np.int64), (ids.shape[0],)) for a in answers)
    elif answers is not None:
        raise ValueError("answers are used by metric='logit_diff' only")
    if ids.ndim == 2 and ids.shape[1] < 2 and metric == "loss":
        raise ValueError("metric='loss' needs at least 2 tokens per sequence")
    t0 = time.perf_counter()
    L, H = model.arch.n_layers, model.arch.n_heads
    chosen = check_layers(layers, L)
    keep = ("logits", "hidden_states") + (("z",) if mode == "mean" else ())
    clean = model.forward(ids, dtype=dtype, keep=keep)
    baseline = _metric(clean.logits, ids, metric, answers)
    effects = np.full((L, H), np.nan)
    for layer in chosen:
        for head in range(H):
            iv = Ablate("z", layer, heads=[head], mode=mode, reference=clean if mode == "mean" else None)
            f = model._resume(ids, layer, clean.hidden_states[layer], [iv], dtype)
            effects[layer, head] = _metric(f.logits, ids, metric, answers) - baseline
    return HeadEffects(effects, baseline, metric, mode, {"total": time.perf_counter() - t0})
