"""Causal effects of heads and of their singular directions, as tables.

:func:`head_ablation_effects` ablates every head's output ``z`` in turn (zero or mean over the
batch's tokens, :mod:`.interventions`) and reports the change in a metric of the model's
output: the next-token cross-entropy (``"loss"``) or the logit difference of a right and a
wrong answer at the last position (``"logit_diff"``). :func:`direction_effects` removes each
singular direction of one head's OV (or QK) circuit, and keeps only the top k for every k.
The clean pass is run once; each intervened pass restarts from the clean residual stream
entering the intervened layer (:meth:`Model.run_from`), so an intervention in layer l costs
the layers l..L-1 only. Every function takes its model as a :class:`Model` or a checkpoint
path or name (:func:`attngeom.models.analysis.prompt.resolve_model`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np

from ..._operands import check_token_ids, choice, count
from ...spectral import factored_svd, null_space
from ..nn.forward import check_layers
from ..nn.interventions import HEAD_SITES, Ablate, Hook, Patch, Project
from .prompt import prompt_pair, resolve_model
from .saved import SavedResult, json_floats

METRICS = ("loss", "logit_diff")


@dataclass
class HeadEffects(SavedResult):
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

    def top(self, n: int = 5) -> List[Tuple[int, int, float]]:
        """The n heads whose ablation changes the metric most, as (layer, head, effect),
        largest ``|effect|`` first (heads not ablated, NaN, are left out)."""
        n = count("n", n)
        flat = np.where(np.isnan(self.effects), -1.0, np.abs(self.effects)).ravel()
        order = [i for i in np.argsort(-flat, kind="stable") if flat[i] >= 0][:n]
        H = self.effects.shape[1]
        return [(int(i // H), int(i % H), float(self.effects.flat[i])) for i in order]

    def __repr__(self) -> str:
        top = ", ".join(f"L{l}H{h} {e:+.3g}" for l, h, e in self.top(3))
        return (f"HeadEffects({self.mode}-ablation of {self.effects.size} heads on {self.metric}, baseline "
                f"{self.baseline:.4g}; largest changes: {top})")

    def table(self) -> list:
        """One dict per head: layer, head, effect, rank (1 = largest change of the metric)."""
        L, H = self.effects.shape
        order = np.argsort(-np.abs(self.effects), axis=None, kind="stable")
        rank = np.empty(L * H, int)
        rank[order] = np.arange(1, L * H + 1)
        return [{"layer": l, "head": h, "effect": float(self.effects[l, h]), "rank": int(rank[l * H + h])}
                for l in range(L) for h in range(H)]

    def to_dict(self) -> dict:
        """{"metric", "mode", "baseline", "effects" (n_layers x n_heads, null where not ablated),
        "heads" (:meth:`table`)}."""
        return {"metric": self.metric, "mode": self.mode, "baseline": self.baseline,
                "effects": json_floats(self.effects), "heads": self.table()}

    def plot(self, ax=None):
        """A layer x head map of the effects (diverging colours, zero white), one integer tick
        per layer and head (every k-th for many), the axes and colour bar labelled.

        Returns the matplotlib figure.
        """
        from ...plotting import axes_or_new

        from ...plotting import index_ticks

        L, H = self.effects.shape
        own = ax is None
        # wide and tall enough for the two-line title, the labels and the colour bar at any size
        fig, ax = axes_or_new(ax, figsize=(max(4.2, 1.6 + 0.45 * H), max(2.8, 1.6 + 0.4 * L)))
        top = float(np.nanmax(np.abs(self.effects), initial=0.0)) or 1.0
        im = ax.imshow(self.effects, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        index_ticks(ax, H, "x")
        index_ticks(ax, L, "y")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{self.mode}-ablation effect on {self.metric}\n(baseline {self.baseline:.4g})", fontsize=9)
        fig.colorbar(im, ax=ax, label=f"change in {self.metric}")
        if own:
            fig.tight_layout()
        return fig


def next_token_losses(logits, token_ids) -> np.ndarray:
    """The cross-entropy of each next token: -log softmax(logits[:, i])[token_ids[:, i + 1]].

    Parameters
    ----------
    logits : array_like, shape (batch, n, vocab)
        A forward pass's logits (:meth:`Model.forward`), float32 or float64.
    token_ids : array_like of int, shape (batch, n)
        The tokens the logits were computed on.

    Returns
    -------
    ndarray, shape (batch, n - 1), float64
        Loss at positions 0..n-2 (nats), in the logits' dtype with float64 sums (no float64
        copy of the logits). Their mean is the loss of :func:`head_ablation_effects`; the
        mean at a late minus an early position is Olsson et al.'s in-context-learning score.

    Raises
    ------
    ValueError
        For shapes that do not match, or token ids that are not integers in 0..vocab-1.

    Examples
    --------
    >>> ag.models.next_token_losses(np.zeros((1, 3, 4)), [[0, 1, 2]]).round(4)
    array([[1.3863, 1.3863]])
    """
    z = np.asarray(logits)
    ids = np.asarray(token_ids)
    if z.ndim != 3 or ids.shape != z.shape[:2]:
        raise ValueError(f"logits must be (batch, n, vocab) and token_ids (batch, n), got {z.shape} and {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"token_ids must be integers, got dtype {ids.dtype}")
    check_token_ids("token_ids", ids, z.shape[2], " (the logits' vocabulary)")
    z = z[:, :-1]
    top = z.max(-1, keepdims=True)
    mass = np.exp(z - top).sum(-1, dtype=np.float64)  # (b, n - 1)
    target = np.take_along_axis(z, ids[:, 1:, None], -1)[..., 0]
    return -(target.astype(np.float64) - top[..., 0] - np.log(mass))


def _metric(logits: np.ndarray, ids: np.ndarray, metric: str, answers) -> float:
    """metric of logits (b, n, V) for token ids (b, n)."""
    if metric == "loss":
        return float(next_token_losses(logits, ids).mean())
    z = np.asarray(logits)
    right, wrong = answers
    last = z[:, -1].astype(np.float64)
    return float(np.mean(last[np.arange(len(last)), right] - last[np.arange(len(last)), wrong]))


def head_ablation_effects(model, token_ids, *, mode: str = "mean", metric: str = "loss", answers=None,
                          layers=None, dtype=np.float32) -> HeadEffects:
    """The change in the model's loss (or logit difference) when each head's output is ablated.

    Parameters
    ----------
    model : Model or str or path-like
        A decoder, or a checkpoint folder / file / model name (:func:`attngeom.load_model`).
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
    dtype : {np.float32, np.float64}, default np.float32
        The computation dtype (float64 where effects are compared at rounding level).

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

    model = resolve_model(model)
    _needs_logits(model, "head_ablation_effects")
    choice("mode", mode, ("mean", "zero"), "'mean' or 'zero'")
    choice("metric", metric, METRICS, f"one of {', '.join(METRICS)}")
    ids = np.asarray(token_ids)
    ids = ids[None] if ids.ndim == 1 else ids
    answers = _answers(metric, answers, ids, model.arch.vocab_size)
    if ids.ndim == 2 and ids.shape[1] < 2 and metric == "loss":
        raise ValueError("metric='loss' needs at least 2 tokens per sequence")
    t0 = time.perf_counter()
    L, H = model.arch.n_layers, model.arch.n_heads
    chosen = check_layers(layers, L)
    keep = ("logits", "resid_pre") + (("z",) if mode == "mean" else ())
    clean = model.forward(ids, dtype=dtype, keep=keep)
    baseline = _metric(clean.logits, ids, metric, answers)
    effects = np.full((L, H), np.nan)
    for layer in chosen:
        for head in range(H):
            iv = Ablate("z", layer, heads=[head], mode=mode, reference=clean if mode == "mean" else None)
            f = model.run_from(layer, clean.resid_pre[layer], ids, interventions=[iv], dtype=dtype)
            effects[layer, head] = _metric(f.logits, ids, metric, answers) - baseline
    return HeadEffects(effects, baseline, metric, mode, {"total": time.perf_counter() - t0})


@dataclass
class DirectionEffects(SavedResult):
    """The effect of each singular direction of one head's OV or QK circuit.

    Attributes
    ----------
    layer, head : int
        The head.
    circuit : str
        "OV" (W_V W_O) or "QK" (W_Q W_K^T).
    singular_values : ndarray, shape (r,)
        The circuit's nonzero singular values, descending.
    removed : ndarray, shape (r,)
        metric(direction i removed) - baseline.
    kept : ndarray, shape (r + 1,)
        The metric when only the top k directions are kept, k = 0..r (kept[r] is the
        baseline up to rounding; kept[0] is the head's circuit removed entirely).
    baseline : float
        The metric of the clean pass.
    metric : str
        "loss" or "logit_diff".
    """

    layer: int
    head: int
    circuit: str
    singular_values: np.ndarray
    removed: np.ndarray
    kept: np.ndarray
    baseline: float
    metric: str

    def __repr__(self) -> str:
        """A few lines: the head and circuit, the singular values, the largest single-direction
        effects and the metric with none and all directions kept."""
        from ..._summary import leading

        r = self.singular_values.size
        order = [i for i in np.argsort(-np.nan_to_num(np.abs(self.removed), nan=-1.0), kind="stable")[:3]]
        top = ", ".join(f"{i} {float(self.removed[i]):+.3g}" for i in order) or "none"
        return (f"DirectionEffects({self.circuit} circuit of L{self.layer}H{self.head}, {r} directions, "
                f"{self.metric} baseline {self.baseline:.4g}\n"
                f"  singular values {leading(self.singular_values)}\n"
                f"  largest effects of removing one direction (index, change): {top}\n"
                f"  {self.metric} with none kept {float(self.kept[0]):.4g}, with all {r} kept "
                f"{float(self.kept[-1]):.4g})")

    def table(self) -> list:
        """One dict per direction: index, singular_value, removed (its effect), kept (the metric
        with the top index + 1 directions)."""
        return [{"direction": i, "singular_value": float(s), "removed": float(self.removed[i]),
                 "kept": float(self.kept[i + 1])} for i, s in enumerate(self.singular_values)]

    def to_dict(self) -> dict:
        """{"layer", "head", "circuit", "metric", "baseline", "singular_values", "removed",
        "kept"}."""
        return {"layer": self.layer, "head": self.head, "circuit": self.circuit, "metric": self.metric,
                "baseline": self.baseline, "singular_values": json_floats(self.singular_values),
                "removed": json_floats(self.removed), "kept": json_floats(self.kept)}

    def plot(self, axes=None):
        """The effect of removing each direction beside its singular value, and the metric with
        the top k directions kept against k. Returns the matplotlib figure."""
        from ...plotting import panel_row

        fig, axes = panel_row(axes, 2, 4.2)
        i = np.arange(len(self.singular_values))
        rel = self.singular_values / (self.singular_values[0] if i.size else 1.0)
        axes[0].scatter(rel, self.removed, s=12)
        axes[0].ticklabel_format(axis="x", useOffset=False)
        if i.size and rel.min() > 1 - 1e-6:  # equal singular values (an isotropic circuit)
            axes[0].set_xlim(0.9, 1.1)
        axes[0].set_xlabel("singular value / largest")
        axes[0].set_ylabel(f"change in {self.metric} when removed")
        axes[1].plot(np.arange(len(self.kept)), self.kept, marker="o", ms=3)
        axes[1].axhline(self.baseline, color="k", lw=0.8, ls="--", label="clean")
        axes[1].set_xlabel("top directions kept")
        axes[1].set_ylabel(self.metric)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"L{self.layer}H{self.head} {self.circuit} circuit ({i.size} directions)", fontsize=9)
        fig.tight_layout()
        return fig


def _circuit_maps(A: np.ndarray, B: np.ndarray):
    """For a circuit A B (A (d, dh), B (dh, d)) with SVD U S V^T: the singular values and, per
    direction i, a_i = B v_i and c_i with c_i^T B = v_i^T, so that z -> z (I - a_i c_i^T) maps
    z B to z B (I - v_i v_i^T): the direction removed from what the head writes (reads).
    The SVD comes from the factors (:func:`attngeom.factored_svd`): the d x d product is never
    formed."""
    _, s, vt = factored_svd(A, B)
    r = int(np.count_nonzero(s > max(A.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0)))
    v = vt[:r].T  # (d, r)
    return s[:r], B @ v, np.linalg.pinv(B).T @ v  # (r,), a (dh, r), c (dh, r)


def direction_effects(model, token_ids, layer: int, head: int, *, circuit: str = "OV", metric: str = "loss",
                      answers=None, dtype=np.float32) -> DirectionEffects:
    """The causal effect of every singular direction of one head's OV or QK circuit.

    For the OV circuit W_OV = W_V W_O = U S V^T, removing direction i removes the component
    along v_i of what the head writes: the head's output z W_O becomes z W_O (I - v_i v_i^T),
    applied to z as z (I - a_i c_i^T) with a_i = W_O v_i and c_i^T W_O = v_i^T (a
    :class:`Hook` on z). For the QK circuit W_QK = W_Q W_K^T the same acts on the queries,
    removing the direction v_i of key space the head's queries read (models without rotary
    embedding: with rotation the circuit depends on the offset). Biases pass through the same
    maps. Each pass restarts from the clean residual stream entering the layer.

    Parameters
    ----------
    model : Model or str or path-like
        A decoder with per-head weights (:attr:`Model.heads`), or its checkpoint.
    token_ids : array_like of int, shape (n,) or (batch, n)
        The prompts.
    layer, head : int
        The head.
    circuit : {"OV", "QK"}, default "OV"
    metric : {"loss", "logit_diff"}, default "loss"
        As :func:`head_ablation_effects`.
    answers : (array_like, array_like), optional
        (right, wrong) token ids for "logit_diff".
    dtype : {np.float32, np.float64}, default np.float32
        The computation dtype (float64 where effects are compared at rounding level).

    Returns
    -------
    DirectionEffects
        singular values, the effect of removing each direction, and the metric keeping the
        top k for every k (the "SVD circuit" curve).

    Raises
    ------
    ValueError
        For a layer or head out of range, an unknown circuit or metric, "QK" on a rotary model.

    Examples
    --------
    >>> d = ag.models.direction_effects(model, ids, 1, 0)  # doctest: +SKIP
    >>> d.kept[-1] == pytest.approx(d.baseline)  # doctest: +SKIP
    True
    """
    model = resolve_model(model)
    _needs_logits(model, "direction_effects")
    choice("circuit", circuit, ("OV", "QK"), "'OV' or 'QK'")
    choice("metric", metric, METRICS, f"one of {', '.join(METRICS)}")
    _check_head(model, layer, head)
    if circuit == "QK" and model.arch.rope is not None:
        raise ValueError("circuit='QK': a rotary model's W_Q R(i - j) W_K^T depends on the offset; use 'OV', or a "
                         "model without rotary embedding")
    ids = np.asarray(token_ids)
    ids = ids[None] if ids.ndim == 1 else ids
    answers = _answers(metric, answers, ids, model.arch.vocab_size)
    heads = model.heads
    if circuit == "OV":
        A, B, site = np.asarray(heads.W_V[layer, head], np.float64), np.asarray(heads.W_O[layer, head], np.float64), "z"
    else:
        A, B, site = np.asarray(heads.W_Q[layer, head], np.float64), np.asarray(heads.W_K[layer, head], np.float64).T, "q"
    s, a, c = _circuit_maps(A, B)
    clean = model.forward(ids, dtype=dtype, keep=("logits", "resid_pre"))
    baseline = _metric(clean.logits, ids, metric, answers)
    start = clean.resid_pre[layer]

    def run(M):
        def fn(value):
            out = value.copy()
            out[..., head, :, :] = value[..., head, :, :] @ M.astype(value.dtype)
            return out
        f = model.run_from(layer, start, ids, interventions=[Hook(site, layer, fn)], dtype=dtype)
        return _metric(f.logits, ids, metric, answers)

    eye = np.eye(A.shape[1])
    removed = np.array([run(eye - np.outer(a[:, i], c[:, i])) for i in range(s.size)]) - baseline
    kept = np.array([run(a[:, :k] @ c[:, :k].T) for k in range(s.size + 1)])
    return DirectionEffects(int(layer), int(head), circuit, s, removed, kept, baseline, metric)


def _check_head(model, layer, head) -> None:
    for name, value, size in (("layer", layer, model.arch.n_layers), ("head", head, model.arch.n_heads)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
            raise ValueError(f"{name} must be an integer in 0..{size - 1}, got {value!r}")


def _needs_logits(model, what: str) -> None:
    if not model.has_unembedding:
        raise ValueError(f"model: {what} measures the model's next-token output, and this {model.arch.model_type} "
                         f"checkpoint has no unembedding (lm_head)")


def _answers(metric, answers, ids, vocab_size: int):
    """The (right, wrong) token ids of metric='logit_diff', each one id or one per sequence of
    ids (batch, n), as (batch,) int64 arrays; refused unless integers in the vocabulary."""
    if metric == "logit_diff":
        if answers is None or len(answers) != 2:
            raise ValueError("answers must be (right, wrong) token ids for metric='logit_diff'")
        out = []
        for name, a in zip(("answers[0] (right)", "answers[1] (wrong)"), answers):
            ids_a = np.asarray(a)
            if ids_a.dtype.kind not in "iu":
                raise ValueError(f"{name} must be token ids (integers), got {a!r}")
            if ids_a.ndim > 1 or (ids_a.ndim == 1 and len(ids_a) != ids.shape[0]):
                raise ValueError(f"{name} must be one token id or one per sequence ({ids.shape[0]}), got shape "
                                 f"{ids_a.shape}")
            check_token_ids(name, ids_a, vocab_size)
            out.append(np.broadcast_to(ids_a.astype(np.int64), (ids.shape[0],)))
        return tuple(out)
    if answers is not None:
        raise ValueError("answers are used by metric='logit_diff' only")
    return None


@dataclass
class PatchingResult(SavedResult):
    """Activation patching: how much of the clean metric each patched activation restores.

    Attributes
    ----------
    site : str
        The patched site.
    restored : ndarray, shape (n_layers, n) or (n_layers, n, n_heads)
        (metric(patched) - metric(corrupt)) / (metric(clean) - metric(corrupt)) per layer and
        position (and head, per-head sites with ``heads=True``); NaN for layers not patched.
    clean, corrupt : float
        The metric of the clean and the corrupted pass.
    metric : str
    """

    site: str
    restored: np.ndarray
    clean: float
    corrupt: float
    metric: str

    def table(self) -> list:
        """One dict per patched (layer, position[, head]) with its restored fraction."""
        out = []
        for index in zip(*np.nonzero(np.isfinite(self.restored))):
            row = {"layer": int(index[0]), "position": int(index[1])}
            if len(index) == 3:
                row["head"] = int(index[2])
            row["restored"] = float(self.restored[index])
            out.append(row)
        return out

    def to_dict(self) -> dict:
        """{"site", "metric", "clean", "corrupt", "restored" (null where not patched)}."""
        return {"site": self.site, "metric": self.metric, "clean": self.clean, "corrupt": self.corrupt,
                "restored": json_floats(self.restored)}

    def plot(self, ax=None, tokens=None):
        """A layer x position map of the restored fraction (the mean over heads for per-head
        grids). Returns the matplotlib figure."""
        from ...plotting import axes_or_new, index_ticks

        grid = self.restored if self.restored.ndim == 2 else self.restored.mean(axis=-1)  # NaN rows stay NaN
        own = ax is None
        fig, ax = axes_or_new(ax, figsize=(max(4.2, 1.8 + 0.3 * grid.shape[1]), max(2.6, 1.4 + 0.35 * grid.shape[0])))
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set_xlabel("position")
        ax.set_ylabel("layer")
        index_ticks(ax, grid.shape[0], "y")
        if tokens is not None:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
        else:
            index_ticks(ax, grid.shape[1], "x")
        ax.set_title(f"patching {self.site}:\nrestored fraction of {self.metric}", fontsize=9)
        fig.colorbar(im, ax=ax, label="restored fraction")
        if own:
            fig.tight_layout()
        return fig


def activation_patching(model, clean_ids, corrupt_ids, site: str = "resid_pre", *, metric: str = "logit_diff",
                        answers=None, layers=None, heads: bool = False, dtype=np.float32) -> PatchingResult:
    """Patch the clean pass's activation at one site, layer by layer and position by position
    (and head by head), into the corrupted pass, and measure how much of the metric returns.

    Parameters
    ----------
    model : Model or str or path-like
        A decoder, or its checkpoint.
    clean_ids, corrupt_ids : array_like of int, shape (n,) or (batch, n)
        Two prompts of one shape (no padding).
    site : str, default "resid_pre"
        A site of :mod:`.interventions` (not "pattern").
    metric : {"logit_diff", "loss"}, default "logit_diff"
        As :func:`head_ablation_effects` ("logit_diff" needs ``answers``). "loss" is the
        cross-entropy of the clean prompt's next tokens in all three passes (clean,
        corrupted, patched), so that a patch that gives the clean logits restores 1.
    answers : (array_like, array_like), optional
        (right, wrong) token ids per sequence.
    layers : sequence of int, optional
        The layers patched (default all).
    heads : bool, default False
        For per-head sites, patch one head at a time (a (layers, n, heads) grid).
    dtype : {np.float32, np.float64}, default np.float32
        The computation dtype (float64 where effects are compared at rounding level).

    Returns
    -------
    PatchingResult
        ``restored``: 0 where the patch changes nothing, 1 where it restores the clean metric.

    Raises
    ------
    ValueError
        For prompts of different shapes, an unknown site, "pattern", or what
        :meth:`Model.forward` refuses; a metric equal on the clean and corrupted prompts.

    Examples
    --------
    >>> r = ag.models.activation_patching(model, clean, corrupt, answers=(right, wrong))  # doctest: +SKIP
    >>> r.restored.shape  # doctest: +SKIP
    (12, 15)
    """
    model = resolve_model(model)
    _needs_logits(model, "activation_patching")
    clean_ids, corrupt_ids = prompt_pair(model, clean_ids, corrupt_ids)
    sites = ("resid_pre", "attn_in", "q", "k", "v", "z", "attn_out", "mlp_out", "resid_post")
    choice("site", site, sites, f"one of {', '.join(sites)}")
    choice("metric", metric, METRICS, f"one of {', '.join(METRICS)}")
    answers = _answers(metric, answers, clean_ids, model.arch.vocab_size)
    L, H, n = model.arch.n_layers, model.arch.n_heads, clean_ids.shape[1]
    chosen = check_layers(layers, L)
    source = model.forward(clean_ids, dtype=dtype, keep=("logits", site))
    corrupt = model.forward(corrupt_ids, dtype=dtype, keep=("logits", "resid_pre"))
    # every pass is scored on the clean prompt's next tokens, so a patch that gives the clean
    # logits restores exactly 1
    m_clean, m_corrupt = _metric(source.logits, clean_ids, metric, answers), _metric(corrupt.logits, clean_ids,
                                                                                     metric, answers)
    if m_clean == m_corrupt:
        raise ValueError(f"the {metric} is the same on the clean and the corrupted prompts: nothing to restore")
    per_head = heads and site in HEAD_SITES
    restored = np.full((L, n, H) if per_head else (L, n), np.nan)
    for layer in chosen:
        for p in range(n):
            for h in (range(H) if per_head else (None,)):
                iv = Patch(site, layer, source, positions=[p], heads=None if h is None else [h])
                f = model.run_from(layer, corrupt.resid_pre[layer], corrupt_ids, interventions=[iv], dtype=dtype)
                value = (_metric(f.logits, clean_ids, metric, answers) - m_corrupt) / (m_clean - m_corrupt)
                restored[(layer, p) if h is None else (layer, p, h)] = value
    return PatchingResult(site, restored, m_clean, m_corrupt, metric)


def _gauge_matrix(arch, rng) -> np.ndarray:
    """A random invertible d_head x d_head gauge (singular values in [0.5, 2]): generic without
    rotary embedding; with it, one commuting with every rotation (a complex scalar a I + b J on
    each frequency's pair of coordinates, rotate-half pairs (i, i + d_head/2))."""
    dh = arch.d_head
    if arch.rope is None:
        u, _ = np.linalg.qr(rng.standard_normal((dh, dh)))
        v, _ = np.linalg.qr(rng.standard_normal((dh, dh)))
        return u @ np.diag(rng.uniform(0.5, 2.0, dh)) @ v.T
    half, A = dh // 2, np.zeros((dh, dh))
    for i in range(half):
        r, t = rng.uniform(0.5, 2.0), rng.uniform(0.0, 2.0 * np.pi)
        A[i, i] = A[i + half, i + half] = r * np.cos(t)
        A[i, i + half], A[i + half, i] = r * np.sin(t), -r * np.sin(t)
    return A


def head_invariances(model, token_ids, layer: int, head: int, *, dtype=np.float64, seed: int = 0) -> list:
    """Exact invariances of one head (Laplace-Radon s.5-6, s.9.4) measured on the model.

    Three checks, each a dict {"layer", "head", "check", "expected", "measured", "others"}:

    * ``gauge``: (q, k) -> (q A, k A^{-T}) for the head's queries and keys with a random
      invertible A (without rotary embedding or q/k norm this is the parameter gauge W_Q A,
      W_K A^{-T}; under rotation A commutes with every rotation). ``measured``: the largest
      change of the logits relative to their largest magnitude; expected at rounding level.
    * ``unread removed``: remove from what attention reads (attn_in) its component in
      ker W_Q^T and ker W_K^T's intersection, which the head's logits never see.
      ``measured``: the largest change of the head's routing matrix (rounding level);
      ``others``: that of the other heads of the layer (which read that component).
    * ``ker B complement removed``: remove the complement of ker B = ker W_K^T (the span of
      W_K's columns, everything the head's keys read). ``measured``: the largest change of
      the head's routing matrix (order one).

    Parameters
    ----------
    model : Model or str or path-like
        A model with per-head weights and an unembedding, or its checkpoint.
    token_ids : array_like of int, shape (n,) or (batch, n)
        The prompts (no padding).
    layer, head : int
        The head.
    dtype : {np.float64, np.float32}, default np.float64
    seed : int, default 0
        Seed of the gauge matrix.

    Returns
    -------
    list of dict
        The three checks.

    Examples
    --------
    >>> rows = ag.models.head_invariances(model, ids, 1, 0)  # doctest: +SKIP
    >>> [r["check"] for r in rows]  # doctest: +SKIP
    ['gauge', 'unread removed', 'ker B complement removed']
    """
    model = resolve_model(model)
    _needs_logits(model, "head_invariances")
    _check_head(model, layer, head)
    ids = np.asarray(token_ids)
    ids = ids[None] if ids.ndim == 1 else ids
    W_Q, W_K = (np.asarray(w[layer, head], np.float64) for w in (model.heads.W_Q, model.heads.W_K))
    A = _gauge_matrix(model.arch, np.random.default_rng(seed))
    inv_t = np.linalg.inv(A).T
    clean = model.forward(ids, dtype=dtype, keep=("logits", "resid_pre", "pattern"), layers=[layer])

    def on_head(M):
        def fn(value):
            out = value.copy()
            out[..., head, :, :] = value[..., head, :, :] @ M.astype(value.dtype)
            return out
        return fn

    # resid_pre[0] enters the one kept layer
    gauged = model.run_from(layer, clean.resid_pre[0], ids, dtype=dtype,
                            interventions=[Hook("q", layer, on_head(A)), Hook("k", layer, on_head(inv_t))])
    top = float(np.abs(clean.logits).max()) or 1.0
    rows = [{"layer": int(layer), "head": int(head), "check": "gauge", "expected": "unchanged (rounding)",
             "measured": float(np.abs(gauged.logits - clean.logits).max()) / top, "others": None}]
    P = clean.pattern[0]
    others = [h for h in range(model.arch.n_heads) if h != head]
    unread, _ = null_space(np.hstack([W_Q, W_K]).T)
    ker_b, _ = null_space(W_K.T)
    for check, space, expected in (("unread removed", unread, "head's weights unchanged (rounding)"),
                                   ("ker B complement removed", ker_b.complement(), "head's weights change")):
        f = model.forward(ids, dtype=dtype, keep=("pattern",), layers=[layer],
                          interventions=[Project("attn_in", layer, space)])
        change = np.abs(f.pattern[0] - P)
        rows.append({"layer": int(layer), "head": int(head), "check": check, "expected": expected,
                     "measured": float(change[:, head].max()),
                     "others": float(change[:, others].max()) if others else None})
    return rows


@dataclass
class CausalEffects(SavedResult):
    """The causal part of the heads report (``attngeom heads --effects``).

    Attributes
    ----------
    heads : HeadEffects
        Every head's ablation effect on the loss.
    directions : list of DirectionEffects
        The OV circuit's singular directions of the most important heads.
    invariances : list of dict
        :func:`head_invariances` of those heads.
    n_tokens : int
        Tokens of the text the effects were measured on.
    """

    heads: HeadEffects
    directions: list
    invariances: list
    n_tokens: int

    def to_dict(self) -> dict:
        """{"n_tokens", "heads" (:meth:`HeadEffects.to_dict`), "directions", "invariances"}."""
        return {"n_tokens": self.n_tokens, "heads": self.heads.to_dict(),
                "directions": [d.to_dict() for d in self.directions], "invariances": self.invariances}

    def plot_spectrum_vs_effect(self, ax=None):
        """Each singular direction of the chosen heads' OV circuits: its singular value (x,
        relative to the head's largest) against the change in loss when it is removed (y).
        Returns the matplotlib figure."""
        from ...plotting import axes_or_new

        fig, ax = axes_or_new(ax, figsize=(5.0, 3.6))
        for d in self.directions:
            s = d.singular_values / (d.singular_values[0] if d.singular_values.size else 1.0)
            ax.scatter(s, d.removed, s=12, label=f"L{d.layer}H{d.head}")
        ax.set_xscale("log")
        ax.set_xlabel("singular value / largest (OV circuit)")
        ax.set_ylabel(f"change in {self.heads.metric} when removed")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.legend(fontsize=7)
        ax.set_title("does the spectrum predict the effect?", fontsize=9)
        fig.tight_layout()
        return fig

    def figures(self) -> dict:
        """{file name: figure}: ablation_effects.png, directions_L<l>_H<h>.png per chosen head,
        spectrum_vs_effect.png."""
        figs = {"ablation_effects.png": self.heads.plot()}
        for d in self.directions:
            figs[f"directions_L{d.layer}_H{d.head}.png"] = d.plot()
        if self.directions:
            figs["spectrum_vs_effect.png"] = self.plot_spectrum_vs_effect()
        return figs

    def markdown(self) -> str:
        """The summary.md section: the heads that matter most, their direction curves in
        numbers, and the invariance checks."""
        ranked = sorted(self.heads.table(), key=lambda r: r["rank"])[:10]
        lines = ["## Causal effects", "",
                 f"{self.heads.mode.capitalize()}-ablating each head's output z on the first text "
                 f"({self.n_tokens} tokens); baseline {self.heads.metric} {self.heads.baseline:.4g}.", "",
                 "| rank | layer | head | effect |", "|---|---|---|---|"]
        lines += [f"| {r['rank']} | {r['layer']} | {r['head']} | {r['effect']:.4g} |" for r in ranked]
        for d in self.directions:
            k = _directions_to_recover(d)
            lines += ["", f"L{d.layer}H{d.head} OV circuit: {d.singular_values.size} directions; removing the top "
                      f"one changes the {d.metric} by {d.removed[0]:.4g} (largest change: direction "
                      f"{int(np.argmax(np.abs(d.removed)))}); keeping the top {k} recovers 90% of the head's effect."]
        lines += ["", "| layer | head | check | expected | measured | other heads |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['head']} | {r['check']} | {r['expected']} | {r['measured']:.3g} | "
                  f"{'' if r['others'] is None else format(r['others'], '.3g')} |" for r in self.invariances]
        return "\n".join(lines) + "\n"


def _directions_to_recover(d: DirectionEffects, fraction: float = 0.9) -> int:
    """The fewest top directions whose kept-only metric recovers `fraction` of the way from
    none kept to the baseline."""
    gap = d.kept[0] - d.baseline
    if gap == 0:
        return 0
    done = np.flatnonzero(np.abs(d.kept - d.baseline) <= (1 - fraction) * abs(gap))
    return int(done[0]) if done.size else len(d.kept) - 1


def causal_effects(model, token_ids, *, top: int = 3, mode: str = "mean", dtype=np.float32) -> CausalEffects:
    """Head ablation effects on the loss, the OV singular-direction curves and the invariance
    checks of the ``top`` heads whose ablation changes the loss most (the heads report's
    ``--effects``).

    Parameters
    ----------
    model : Model or str or path-like
        A model with an unembedding and per-head weights, or its checkpoint (loaded once).
    token_ids : array_like of int, shape (n,) or (batch, n)
        The text(s), at least 2 tokens.
    top : int, default 3
        How many heads get direction curves and invariance checks.
    mode : {"mean", "zero"}, default "mean"
        The head ablation.
    dtype : {np.float32, np.float64}, default np.float32
        The dtype of the effects and direction curves (the invariance checks run in float64).

    Returns
    -------
    CausalEffects

    Examples
    --------
    >>> c = ag.models.causal_effects(model, ids, top=2)  # doctest: +SKIP
    >>> sorted(c.figures())  # doctest: +SKIP
    ['ablation_effects.png', 'directions_L1_H0.png', 'directions_L0_H0.png', 'spectrum_vs_effect.png']
    """
    model = resolve_model(model)
    top = count("top", top, 1)
    heads = head_ablation_effects(model, token_ids, mode=mode, dtype=dtype)
    ranked = sorted(heads.table(), key=lambda r: r["rank"])[:top]
    directions, invariances = [], []
    for r in ranked:
        directions.append(direction_effects(model, token_ids, r["layer"], r["head"], dtype=dtype))
        invariances += head_invariances(model, token_ids, r["layer"], r["head"])  # float64: rounding level
    return CausalEffects(heads, directions, invariances, int(np.asarray(token_ids).shape[-1]))
