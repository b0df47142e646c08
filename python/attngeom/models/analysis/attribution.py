"""Direct logit attribution and path patching: which heads move a logit, and through which path.

:func:`logit_attribution` splits the final residual stream at one position into what wrote
it (the embeddings, every head, every attention bias, every MLP) and reads each part through
the final norm, with the norm's scale frozen at the stream's (TransformerLens'
``apply_ln_to_stack``), and the unembedding's column of the answer (minus that of a wrong
answer). With the scale frozen the final norm is linear, so the parts add up to the logit (or
logit difference) exactly, up to rounding and the final norm's bias (reported). Each head's
part is further split over the singular directions of its OV circuit W_V W_O (from its
factors, :func:`attngeom.factored_svd`): how many directions carry the head's effect on the
logit. Optionally each head's part is split over the source tokens it read.

:func:`path_patching` measures the effect of one head (the sender) through chosen inputs of
later heads only (their queries, keys or values: the receivers), as Wang et al. (2022) define
it: a pass on the clean prompt with the sender's output taken from the corrupted prompt and
every other head's output frozen at its clean value gives the receivers' inputs; a second
clean pass with only those inputs patched gives the metric (the logit difference of a right
and a wrong answer at the last position).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..._operands import check_token_ids, count
from ...spectral import factored_svd
from ..nn.interventions import Patch
from .prompt import prompt_pair, resolve_model
from .saved import SavedResult, json_floats

RECEIVER_INPUTS = ("q", "k", "v")


@dataclass(repr=False)
class LogitAttribution(SavedResult):
    """Direct logit attribution of one position's logit (difference) to what wrote the stream.

    Attributes
    ----------
    answer, wrong : int, int or None
        The token ids: the attributed quantity is logit[answer] - logit[wrong] (logit[answer]
        when wrong is None).
    position : int
        The token position read.
    total : float
        That logit (difference) as the forward pass computed it.
    embed, pos_embed : float
        The token embedding's part and the position table's (0 for rotary models).
    heads : ndarray, shape (n_layers, n_heads)
        Each head's part (its output z_h W_O[h] at the position).
    attn_bias, mlp : ndarray, shape (n_layers,)
        The attention output bias's part, and each MLP's.
    final_bias : float
        The final norm's bias read by the answer direction (LayerNorm; 0 for RMSNorm): no
        component wrote it.
    directions : ndarray, shape (n_layers, n_heads, d_head)
        Each head's part split over the right singular vectors of its OV circuit, largest
        singular value first (NaN beyond the circuit's rank).
    singular_values : ndarray, shape (n_layers, n_heads, d_head)
        The OV circuits' singular values (NaN beyond the rank).
    outside : ndarray, shape (n_layers, n_heads)
        The part of each head's output outside its OV circuit's row space (rounding when W_V
        has full rank).
    by_position : ndarray, shape (n_layers, n_heads, n) or None
        Each head's part split over the source tokens it read (P[p, j] v_j W_O), when asked.
    tokens : list of str or None
        The prompt's token strings, when a text was given.

    Examples
    --------
    >>> r = ag.models.logit_attribution(model, ids, answer=42, wrong=7)  # doctest: +SKIP
    >>> r.top(3)  # doctest: +SKIP
    [('L1H1', 3.2), ('MLP0', -0.8), ('embed', 0.5)]
    """

    answer: int
    wrong: Optional[int]
    position: int
    total: float
    embed: float
    pos_embed: float
    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    final_bias: float
    directions: np.ndarray
    singular_values: np.ndarray
    outside: np.ndarray
    by_position: Optional[np.ndarray] = None
    tokens: Optional[List[str]] = field(default=None)

    @property
    def explained(self) -> float:
        """The sum of every part and the final bias: ``total`` up to rounding."""
        return float(self.embed + self.pos_embed + self.heads.sum() + self.attn_bias.sum() + self.mlp.sum()
                     + self.final_bias)

    def table(self) -> list:
        """One dict per component ({"component", "layer", "head", "attribution"}), largest
        magnitude first."""
        rows = [{"component": "embed", "layer": None, "head": None, "attribution": float(self.embed)},
                {"component": "pos_embed", "layer": None, "head": None, "attribution": float(self.pos_embed)},
                {"component": "final_bias", "layer": None, "head": None, "attribution": float(self.final_bias)}]
        L, H = self.heads.shape
        for layer in range(L):
            rows.append({"component": f"attn_bias{layer}", "layer": layer, "head": None,
                         "attribution": float(self.attn_bias[layer])})
            rows.append({"component": f"MLP{layer}", "layer": layer, "head": None, "attribution": float(self.mlp[layer])})
            for head in range(H):
                rows.append({"component": f"L{layer}H{head}", "layer": layer, "head": head,
                             "attribution": float(self.heads[layer, head])})
        return sorted(rows, key=lambda r: -abs(r["attribution"]))

    def top(self, n: int = 5) -> list:
        """The n components with the largest attribution magnitude, as (name, attribution)."""
        return [(r["component"], r["attribution"]) for r in self.table()[:n]]

    def directions_needed(self, layer: int, head: int, fraction: float = 0.9) -> int:
        """The fewest of a head's OV directions (largest attribution first) whose parts sum to
        `fraction` of the head's part."""
        parts = self.directions[layer, head]
        parts = parts[np.isfinite(parts)]
        total = self.heads[layer, head]
        if total == 0:
            return 0
        order = np.argsort(-np.abs(parts), kind="stable")
        running = np.cumsum(parts[order]) / total
        hits = np.flatnonzero(running >= fraction)
        return int(hits[0]) + 1 if hits.size else len(parts)

    def to_dict(self) -> dict:
        """Every field as JSON types (NaN as null)."""
        return {"answer": self.answer, "wrong": self.wrong, "position": self.position, "total": self.total,
                "explained": self.explained, "embed": self.embed, "pos_embed": self.pos_embed,
                "heads": json_floats(self.heads), "attn_bias": json_floats(self.attn_bias), "mlp": json_floats(self.mlp),
                "final_bias": self.final_bias, "directions": json_floats(self.directions),
                "singular_values": json_floats(self.singular_values), "outside": json_floats(self.outside),
                "by_position": None if self.by_position is None else json_floats(self.by_position),
                "tokens": self.tokens}

    def __repr__(self) -> str:
        what = f"logit[{self.answer}]" + ("" if self.wrong is None else f" - logit[{self.wrong}]")
        top = ", ".join(f"{name} {value:+.3g}" for name, value in self.top(3))
        return (f"LogitAttribution({what} at position {self.position} = {self.total:.4g}; "
                f"{self.heads.shape[0]} layers x {self.heads.shape[1]} heads; largest: {top})")

    def plot(self, axes=None):
        """Heads (a layer x head map, each cell labelled with its part) and the other parts
        (bars: embeddings, attention biases, MLPs, the final norm's bias; those the model lacks
        are left out). Returns the matplotlib figure."""
        import matplotlib.pyplot as plt

        L, H = self.heads.shape
        others = [("embed", self.embed), ("pos_embed", self.pos_embed)]
        others += [(f"attn bias {layer}", self.attn_bias[layer]) for layer in range(L)]
        others += [(f"MLP {layer}", self.mlp[layer]) for layer in range(L)]
        others += [("final norm bias", self.final_bias)]
        others = [(name, float(value)) for name, value in others if value != 0]
        if axes is None:
            fig, axes = plt.subplots(1, 2, figsize=(4.5 + 0.45 * H, 1.6 + 0.45 * max(L, len(others) / 2)),
                                     width_ratios=[max(H, 2), 3])
        else:
            fig = axes[0].figure
        top = float(np.abs(self.heads).max()) or 1.0
        im = axes[0].imshow(self.heads, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
        if L * H <= 400:
            for (layer, head), value in np.ndenumerate(self.heads):
                axes[0].text(head, layer, f"{value:.2g}", ha="center", va="center", fontsize=6,
                             color="white" if abs(value) > 0.6 * top else "black")
        axes[0].set_xticks(range(H))
        axes[0].set_yticks(range(L))
        axes[0].set_xlabel("head")
        axes[0].set_ylabel("layer")
        axes[0].set_title("heads", fontsize=9)
        fig.colorbar(im, ax=axes[0])
        y = np.arange(len(others))
        axes[1].barh(y, [value for _, value in others], color=["C3" if v < 0 else "C0" for _, v in others])
        axes[1].set_yticks(y, [name for name, _ in others], fontsize=7)
        axes[1].invert_yaxis()
        axes[1].axvline(0, color="k", lw=0.5)
        axes[1].set_xlabel("part")
        axes[1].set_title("embeddings, biases, MLPs", fontsize=9)
        what = f"logit[{self.answer}]" + ("" if self.wrong is None else f" - logit[{self.wrong}]")
        fig.suptitle(f"direct attribution of {what} = {self.total:.3g} at position {self.position}", fontsize=9)
        fig.tight_layout()
        return fig


def _token(model, name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a token id (an integer), got {value!r}")
    V = model.arch.vocab_size
    if not 0 <= value < V:
        raise ValueError(f"{name}: token id {value} is outside the vocabulary (0..{V - 1})")
    return int(value)


def _prompt(model, token_ids, name="token_ids"):
    """(ids (n,), token strings or None) of a text or of one sequence of token ids."""
    if isinstance(token_ids, str):
        ids, tokens = model.tokenize(token_ids)
        return np.asarray(ids, np.int64), tokens
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a text or one non-empty sequence of token ids (n,), got shape "
                         f"{ids.shape}, dtype {ids.dtype}")
    check_token_ids(name, ids, model.arch.vocab_size)
    return ids.astype(np.int64), None


def logit_attribution(model, token_ids, answer, wrong=None, *, position: int = -1, by_position: bool = False,
                      dtype=np.float64) -> LogitAttribution:
    """Direct logit attribution of every head, attention bias and MLP (module docstring).

    Parameters
    ----------
    model : Model or str or path-like
        A decoder with an unembedding and per-head weights, or a checkpoint
        (:func:`attngeom.models.analysis.prompt.resolve_model`).
    token_ids : str or array_like of int, shape (n,)
        The prompt: a text (tokenized with the model's tokenizer) or token ids.
    answer : int
        The token whose logit is attributed.
    wrong : int, optional
        A token whose logit is subtracted (the logit difference is attributed).
    position : int, default -1
        The position read (negative from the end).
    by_position : bool, default False
        Also split each head's part over the source tokens (``by_position``).
    dtype : {np.float64, np.float32}, default np.float64
        The forward pass's dtype (the attribution itself is computed in float64).

    Returns
    -------
    LogitAttribution
        Whose parts add up to ``total`` (``explained``; to rounding).

    Raises
    ------
    ValueError
        For a model without an unembedding or without a final norm, multi-head latent
        attention (no per-head W_V, W_O), token ids or answers outside the vocabulary, and a
        position out of range.

    Examples
    --------
    >>> r = ag.models.logit_attribution(model, "When Mary and John went to the store, John gave a drink to",
    ...                                 answer=mary, wrong=john)  # doctest: +SKIP
    >>> r.heads.shape  # doctest: +SKIP
    (12, 12)
    """
    model = resolve_model(model)
    if not model.has_unembedding:
        raise ValueError(f"model: a {model.arch.model_type} checkpoint has no unembedding: no logit to attribute")
    norm = model.final_norm_parameters
    heads = model.heads  # ValueError under multi-head latent attention
    ids, tokens = _prompt(model, token_ids)
    answer, wrong = _token(model, "answer", answer), _token(model, "wrong", wrong, allow_none=True)
    n = ids.size
    if isinstance(position, (bool, np.bool_)) or not isinstance(position, (int, np.integer)) or not -n <= position < n:
        raise ValueError(f"position must be an integer in -{n}..{n - 1}, got {position!r}")
    p = int(position) % n
    keep = ("logits", "embed", "pos_embed", "z", "mlp_out", "resid_post") + (("pattern", "v") if by_position else ())
    f = model.forward(ids, dtype=dtype, keep=keep, logits_at=[p])
    W_U = model.unembedding
    d = np.asarray(W_U[answer], np.float64) - (0 if wrong is None else np.asarray(W_U[wrong], np.float64))
    x = np.asarray(f.resid_post[-1][p], np.float64)  # the final stream
    layernorm = norm["kind"] == "layernorm"
    center = x - x.mean() if layernorm else x
    s = np.sqrt(np.mean(center * center) + norm["eps"])
    read = norm["weight"] * d / s
    if layernorm:  # (c - mean c) . read = c . (read - mean read)
        read = read - read.mean()

    def part(c):  # with the scale frozen, part c of the stream contributes c . read
        return np.asarray(c, np.float64) @ read

    L, H = model.arch.n_layers, model.arch.n_heads
    W_O = np.asarray(heads.W_O, np.float64)  # (L, H, d_head, d_model)
    z = np.asarray(f.z[:, :, p], np.float64)  # (L, H, d_head)
    outputs = np.einsum("lhe,lhed->lhd", z, W_O)  # each head's output at the position
    head_parts = part(outputs)
    dh = W_O.shape[2]
    directions = np.full((L, H, dh), np.nan)
    values = np.full((L, H, dh), np.nan)
    outside = np.zeros((L, H))
    W_V = np.asarray(heads.W_V, np.float64)
    for layer in range(L):
        for head in range(H):
            svd = factored_svd(W_V[layer, head], W_O[layer, head])
            o = outputs[layer, head]
            coords = svd.Vh @ o  # (r,)
            pieces = coords[:, None] * svd.Vh  # (r, d_model): the output's component on each direction
            r = len(coords)
            directions[layer, head, :r] = part(pieces)
            values[layer, head, :r] = svd.S
            outside[layer, head] = part(o - pieces.sum(axis=0))
    b_O = heads.b_O
    attn_bias = np.zeros(L) if b_O is None else part(np.asarray(b_O, np.float64))
    per_source = None
    if by_position:  # head h at p reads sum_j P[p, j] v_j, and writes it through W_O
        P = np.asarray(f.pattern[:, :, p], np.float64)  # (L, H, n)
        v = np.asarray(f.v, np.float64)  # (L, H, n, d_head)
        per_source = np.einsum("lhj,lhje,lhe->lhj", P, v, W_O @ read)
    logits = np.asarray(f.logits[0], np.float64)
    total = logits[answer] - (0 if wrong is None else logits[wrong])
    return LogitAttribution(
        answer=answer, wrong=wrong, position=p, total=float(total), embed=float(part(f.embed[p])),
        pos_embed=0.0 if f.pos_embed is None else float(part(f.pos_embed[p])), heads=head_parts, attn_bias=attn_bias,
        mlp=part(np.asarray(f.mlp_out[:, p], np.float64)),
        final_bias=0.0 if norm["bias"] is None else float(norm["bias"] @ d), directions=directions,
        singular_values=values, outside=outside, by_position=per_source, tokens=tokens)


@dataclass(repr=False)
class PathPatching(SavedResult):
    """The effect of one head through chosen inputs of later heads (:func:`path_patching`).

    Attributes
    ----------
    sender : (int, int)
        (layer, head) whose output is taken from the corrupted prompt.
    receivers : list of (int, int, str)
        (layer, head, "q" | "k" | "v"): the inputs the sender's change reaches.
    clean, corrupt : float
        The metric (logit difference right - wrong at the last position, mean over the batch)
        of the clean and the corrupted pass.
    patched : ndarray, shape (n_receivers,)
        The metric with only that receiver's input patched.
    joint : float
        The metric with every receiver's input patched at once.
    answers : (int, int)
        The right and wrong token ids.
    """

    sender: tuple
    receivers: list
    clean: float
    corrupt: float
    patched: np.ndarray
    joint: float
    answers: tuple

    @property
    def effect(self) -> np.ndarray:
        """patched - clean, per receiver."""
        return self.patched - self.clean

    @property
    def fraction(self) -> np.ndarray:
        """(patched - clean) / (corrupt - clean) per receiver: the share of the whole
        corruption's effect that passes this path (NaN when the corruption changes nothing)."""
        change = self.corrupt - self.clean
        return self.effect / change if change != 0 else np.full(len(self.receivers), np.nan)

    def table(self) -> list:
        """One dict per receiver: its layer, head, input, metric, effect and fraction."""
        return [{"layer": layer, "head": head, "input": kind, "metric": float(m), "effect": float(e),
                 "fraction": float(fr)}
                for (layer, head, kind), m, e, fr in zip(self.receivers, self.patched, self.effect, self.fraction)]

    def to_dict(self) -> dict:
        """Every field as JSON types."""
        return {"sender": list(self.sender), "receivers": [list(r) for r in self.receivers], "clean": self.clean,
                "corrupt": self.corrupt, "patched": json_floats(self.patched), "joint": self.joint,
                "answers": list(self.answers)}

    def __repr__(self) -> str:
        parts = ", ".join(f"L{layer}H{head}.{kind} {e:+.3g}" for (layer, head, kind), e
                          in zip(self.receivers, self.effect))
        return (f"PathPatching(L{self.sender[0]}H{self.sender[1]} -> {len(self.receivers)} receivers: {parts}; "
                f"joint {self.joint - self.clean:+.3g}; clean {self.clean:.4g}, corrupt {self.corrupt:.4g})")

    def plot(self, ax=None):
        """The effect of each path (bars), with the whole corruption's for scale. Returns the
        matplotlib figure."""
        from ...plotting import axes_or_new

        fig, ax = axes_or_new(ax, figsize=(1.5 + 0.5 * len(self.receivers), 3))
        labels = [f"L{layer}H{head}.{kind}" for layer, head, kind in self.receivers] + ["joint"]
        ax.bar(range(len(labels)), list(self.effect) + [self.joint - self.clean])
        ax.axhline(self.corrupt - self.clean, color="k", ls="--", lw=0.8, label="whole corruption")
        ax.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
        ax.set_ylabel("change in logit difference")
        ax.set_title(f"paths from L{self.sender[0]}H{self.sender[1]}", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


def _logit_diff(logits, answers) -> float:
    last = np.asarray(logits, np.float64)[:, -1]
    rows = np.arange(len(last))
    return float(np.mean(last[rows, answers[0]] - last[rows, answers[1]]))


def path_patching(model, clean_ids, corrupt_ids, sender, receivers, *, answers, dtype=np.float32) -> PathPatching:
    """Path patching from one head into the queries, keys or values of later heads.

    Parameters
    ----------
    model : Model or str or path-like
        A decoder with an unembedding, or a checkpoint.
    clean_ids, corrupt_ids : array_like of int, shape (n,) or (batch, n)
        The clean and the corrupted prompts (one shape).
    sender : (int, int)
        (layer, head) of the sending head.
    receivers : sequence of (int, int, str)
        (layer, head, "q" | "k" | "v"), each in a later layer than the sender.
    answers : (int, int)
        The right and the wrong answer's token ids: the metric is their logit difference at
        the last position (mean over the batch).
    dtype : {np.float32, np.float64}, default np.float32
        The passes' dtype.

    Returns
    -------
    PathPatching
        The metric with each receiver's input patched, and with all of them.

    Raises
    ------
    ValueError
        For a sender or receiver out of range, a receiver not in a later layer than the
        sender, an input other than q, k, v, prompts of different shapes, and answers outside
        the vocabulary.

    Examples
    --------
    >>> r = ag.models.path_patching(model, clean, corrupt, sender=(0, 3), receivers=[(1, 1, "k")],
    ...                             answers=(right, wrong))  # doctest: +SKIP
    >>> r.fraction  # doctest: +SKIP
    array([0.71])
    """
    model = resolve_model(model)
    if not model.has_unembedding:
        raise ValueError(f"model: a {model.arch.model_type} checkpoint has no unembedding: no logit difference")
    L, H = model.arch.n_layers, model.arch.n_heads
    if not isinstance(sender, (tuple, list)) or len(sender) != 2:
        raise ValueError(f"sender must be (layer, head), got {sender!r}")
    for name, value, size in (("sender layer", sender[0], L), ("sender head", sender[1], H)):
        count(name, value, minimum=0, maximum=size - 1)
    sl, sh = int(sender[0]), int(sender[1])
    if isinstance(receivers, tuple) and len(receivers) == 3 and isinstance(receivers[2], str):
        receivers = [receivers]
    checked = []
    for i, r in enumerate(receivers):
        if not isinstance(r, (tuple, list)) or len(r) != 3:
            raise ValueError(f"receivers[{i}] must be (layer, head, 'q' | 'k' | 'v'), got {r!r}")
        layer, head, kind = r
        for name, value, size in (("layer", layer, L), ("head", head, H)):
            count(f"receivers[{i}] {name}", value, minimum=0, maximum=size - 1)
        if kind not in RECEIVER_INPUTS:
            raise ValueError(f"receivers[{i}]: the input must be 'q', 'k' or 'v', got {kind!r}")
        if layer <= sl:
            raise ValueError(f"receivers[{i}]: layer {layer} is not after the sender's layer {sl}")
        checked.append((int(layer), int(head), kind))
    if not checked:
        raise ValueError("receivers must name at least one (layer, head, input)")
    clean_ids, corrupt_ids = prompt_pair(model, clean_ids, corrupt_ids)
    if answers is None or len(answers) != 2:
        raise ValueError("answers must be (right, wrong) token ids")
    answers = (_token(model, "answers[0]", answers[0]), _token(model, "answers[1]", answers[1]))
    clean = model.forward(clean_ids, dtype=dtype, keep=("logits", "resid_pre", "z"), logits_at="last")
    corrupt = model.forward(corrupt_ids, dtype=dtype, keep=("logits", "z"), logits_at="last")
    # 1. the receivers' inputs when the sender's output is corrupted and every other head frozen clean
    frozen = [Patch("z", sl, corrupt, heads=[sh])] + [Patch("z", layer, clean) for layer in range(sl + 1, L)]
    layers = sorted({layer for layer, _, _ in checked})
    inputs = model.run_from(sl, clean.resid_pre[sl], clean_ids, interventions=frozen, keep=("q", "k", "v"),
                            layers=layers, dtype=dtype)

    # 2. clean passes with only those inputs patched
    def metric(chosen):
        first = min(layer for layer, _, _ in chosen)
        patches = [Patch(kind, layer, inputs, heads=[head]) for layer, head, kind in chosen]
        f = model.run_from(first, clean.resid_pre[first], clean_ids, interventions=patches, logits_at="last",
                           dtype=dtype)
        return _logit_diff(f.logits, answers)

    patched = np.array([metric([r]) for r in checked])
    return PathPatching(sender=(sl, sh), receivers=checked, clean=_logit_diff(clean.logits, answers),
                        corrupt=_logit_diff(corrupt.logits, answers), patched=patched, joint=metric(checked),
                        answers=answers)
