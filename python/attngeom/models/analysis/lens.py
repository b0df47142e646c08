"""The logit lens: every layer's residual stream read through the final norm and W_U.

The notes' practice agenda ("derive the logit lens: multiply the post-block residual by the
unembedding U to map subspace contributions directly to token probability shifts", with the
residual path expansion, Elhage et al. 2021; nostalgebraist 2020). For a decoder with
residual streams h_0 (embeddings), h_1, ..., h_L (after each layer), final norm N_f and
unembedding W_U (vocab, d_model), layer l's lens is

    logits_l = N_f(h_l) W_U^T,        log p_l(v | position t) = log_softmax(logits_l)[t, v],

so logits_L are the model's logits (transformers' last hidden state already has N_f
applied; :class:`Forward` stores it so, and the lens of layer L uses it as it is). The full
(n_layers + 1, n, vocab) array is never kept: per layer only the top-k tokens, the
log-probability and rank of the actual next token, and the entropy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..._operands import count
from .prompt import encode_prompt, resolve_model, token_strings


@dataclass
class LogitLens:
    """The logit lens of one prompt (module docstring); layer 0 is the embedding.

    Attributes
    ----------
    token_ids : ndarray of int, shape (n,)
        The prompt.
    tokens : list of str or None
        Its token strings (None without tokenizer files).
    top_ids : ndarray of int, shape (n_layers + 1, n, k)
        The k most likely next tokens at every layer and position, most likely first.
    top_log_probs : ndarray, shape (n_layers + 1, n, k)
        Their log-probabilities.
    top_tokens : list or None
        top_ids as strings, nested (n_layers + 1, n, k), when a tokenizer exists.
    target_log_probs : ndarray, shape (n_layers + 1, n - 1)
        log p_l(token_{t+1} | position t): the log-probability of the actual next token.
    target_ranks : ndarray of int, shape (n_layers + 1, n - 1)
        Its rank (0 = the top prediction).
    entropy : ndarray, shape (n_layers + 1, n)
        Entropy (nats) of every predicted distribution.
    """

    token_ids: np.ndarray
    tokens: Optional[List[str]]
    top_ids: np.ndarray
    top_log_probs: np.ndarray
    top_tokens: Optional[list] = field(repr=False)
    target_log_probs: np.ndarray = field(repr=False)
    target_ranks: np.ndarray = field(repr=False)
    entropy: np.ndarray = field(repr=False)

    @property
    def n_layers(self) -> int:
        """Number of transformer layers (the lens has one more row, the embedding)."""
        return self.top_ids.shape[0] - 1

    @property
    def target_probs(self) -> np.ndarray:
        """(n_layers + 1, n - 1) probabilities of the actual next token."""
        return np.exp(self.target_log_probs)

    def summary(self) -> dict:
        """Named scalars: per layer the mean log-probability of the next token
        (``mean_target_log_prob_L{l}``) and top-1 accuracy (``top1_L{l}``), and the layer
        where the accuracy first reaches its final value (``first_final_layer``)."""
        out = {"n_layers": self.n_layers, "n_tokens": int(self.token_ids.size)}
        if self.target_log_probs.shape[1] == 0:
            return out
        acc = (self.target_ranks == 0).mean(axis=1)
        for layer in range(self.n_layers + 1):
            out[f"mean_target_log_prob_L{layer}"] = float(self.target_log_probs[layer].mean())
            out[f"top1_L{layer}"] = float(acc[layer])
        out["first_final_layer"] = int(np.argmax(acc >= acc[-1] - 1e-12))
        return out

    def plot(self, ax=None, *, title: str = ""):
        """Heat map layer x position of the log-probability of the actual next token.

        Parameters
        ----------
        ax : matplotlib.axes.Axes, optional
            Axes to draw into.
        title : str, default ""
            Title.

        Returns
        -------
        matplotlib.figure.Figure
            The figure (positions labelled with the next token when tokens are known).

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> lens = ag.logit_lens(planted_induction_model("planted"), np.arange(1, 9).repeat(2))
        >>> lens.plot().axes[0].get_ylabel()
        'layer (0 = embedding)'
        """
        from ... import plotting

        values = self.target_log_probs
        n = values.shape[1]
        fig, ax = plotting.axes_or_new(ax, figsize=(min(14.0, 2.5 + 0.22 * max(n, 1)), 1.4 + 0.3 * values.shape[0]))
        im = ax.imshow(values, cmap="viridis", aspect="auto", interpolation="nearest",
                       vmax=0.0, vmin=min(float(values.min()) if values.size else -1.0, -1e-3))
        fig.colorbar(im, ax=ax, label="log p(next token)")
        if self.tokens is not None and n:
            plotting.token_ticks(ax, [f"{a}\u2192{b}" for a, b in zip(self.tokens[:-1], self.tokens[1:])], "x")
        ax.set_yticks(range(values.shape[0]))
        ax.set_xlabel("position (token \u2192 next token)")
        ax.set_ylabel("layer (0 = embedding)")
        ax.set_title(title or "logit lens: log-probability of the next token", fontsize=9)
        fig.tight_layout()
        return fig


def logit_lens(model, prompt, *, k: int = 5, dtype=np.float32) -> LogitLens:
    """The logit lens of a decoder on one prompt: every layer's residual through N_f and W_U.

    The notes' practice agenda (module docstring): layer l's prediction is
    log_softmax(N_f(h_l) W_U^T) for the residual stream h_l after layer l (h_0 the
    embedding); layer n_layers gives the model's own logits.

    Parameters
    ----------
    model : Model or str or path-like
        A decoder with an unembedding (GPT-2, Llama, Mistral, Qwen2, Qwen3), or a checkpoint
        for :func:`attngeom.load_model`.
    prompt : str or array_like of int, shape (n,)
        A text (tokenized with the checkpoint's tokenizer files) or token ids.
    k : int, default 5
        How many top tokens to keep per layer and position (at most vocab_size).
    dtype : {np.float32, np.float64}, default np.float32
        The forward pass's dtype.

    Returns
    -------
    LogitLens
        top_ids / top_log_probs (n_layers + 1, n, k), target_log_probs and target_ranks
        (n_layers + 1, n - 1), entropy (n_layers + 1, n), tokens; ``plot()`` draws the
        layer x position heat map of the next token's log-probability.

    Raises
    ------
    ValueError
        For a model without an unembedding (BERT), a bad prompt, k outside 1..vocab_size.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> ids = np.array([3, 9, 4, 7, 3, 9, 4, 7])  # a repeated sequence
    >>> lens = ag.logit_lens(planted_induction_model("planted"), ids, k=3)
    >>> lens.top_ids.shape, lens.target_log_probs.shape
    ((3, 8, 3), (3, 7))
    >>> lens.top_ids[-1, 5:, 0]  # the last layer's induction head predicts the repeats
    array([4, 7, 3])
    """
    m = resolve_model(model)
    if not m.has_unembedding:
        raise ValueError(f"model: the logit lens needs a decoder with an unembedding (lm_head), "
                         f"got a {m.arch.model_type} checkpoint without one")
    V = m.arch.vocab_size
    k = count("k", k, 1, V)
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be float32 or float64: {exc}") from None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    ids, tokens = encode_prompt(m, prompt)
    f = m.forward(ids, dtype=dt, keep=("resid_pre", "ln_final"))
    W_U = np.asarray(m.unembedding).astype(dt, copy=False)
    L, n = f.n_layers, ids.size
    top_ids = np.zeros((L + 1, n, k), np.int64)
    top_lp = np.zeros((L + 1, n, k), dt)
    target_lp = np.zeros((L + 1, n - 1), dt)
    ranks = np.zeros((L + 1, n - 1), np.int64)
    entropy = np.zeros((L + 1, n), dt)
    nxt = ids[1:]
    for layer in range(L + 1):
        logits = (f.ln_final if layer == L else m.final_norm(f.resid_pre[layer])) @ W_U.T  # (n, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        logp = shifted - lse
        top = np.argpartition(-logp, k - 1, axis=-1)[:, :k] if k < V else np.broadcast_to(np.arange(V), (n, V))
        order = np.argsort(-np.take_along_axis(logp, top, -1), axis=-1, kind="stable")
        top_ids[layer] = np.take_along_axis(top, order, -1)
        top_lp[layer] = np.take_along_axis(logp, top_ids[layer], -1)
        p = np.exp(logp)
        entropy[layer] = -(p * logp).sum(axis=-1)
        if n > 1:
            t = logp[np.arange(n - 1), nxt]
            target_lp[layer] = t
            ranks[layer] = (logp[:-1] > t[:, None]).sum(axis=-1)
    top_tokens = None
    if tokens is not None:
        strings = token_strings(m, top_ids)
        top_tokens = np.asarray(strings, dtype=object).reshape(top_ids.shape).tolist() if strings else None
    return LogitLens(ids, tokens, top_ids, top_lp, top_tokens, target_lp, ranks, entropy)
