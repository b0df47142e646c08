"""One head on one text, in one figure: :func:`plot_head`.

Where the head looks (its attention pattern, queries as rows, token strings on both axes with
spaces drawn), how spread its attention is along the text (the entropy of every query's
weights against log(i + 1), the entropy of attending uniformly to the visible keys), and the
spectra of its two circuits: W_QK = W_Q W_K^T (what it matches) and W_OV = W_V W_O (what it
moves), from their factors (:func:`attngeom.factored_svd`).
"""
from __future__ import annotations

import numpy as np

from ..._operands import count
from ...spectral import factored_svd
from .prompt import encode_prompt, resolve_model


def plot_head(model, text, layer: int, head: int, *, axes=None):
    """Pattern, entropy profile and circuit spectra of one head on one text.

    Parameters
    ----------
    model : Model or str or path-like
        A model, or a checkpoint (:func:`attngeom.models.analysis.prompt.resolve_model`).
    text : str or array_like of int, shape (n,)
        A text (tokenized with the model's tokenizer) or token ids.
    layer, head : int
        The head.
    axes : sequence of three Axes, optional
        Where to draw (pattern, entropy, spectra).

    Returns
    -------
    matplotlib.figure.Figure
        Three panels; the spectra panel says so where the model has no per-head W_V, W_O
        (multi-head latent attention).

    Raises
    ------
    ValueError
        For a layer or head out of range, and an empty text.

    Examples
    --------
    >>> fig = ag.models.plot_head(model, "The cat sat on the mat. The cat", layer=1, head=0)  # doctest: +SKIP
    """
    from ...plotting import panel_row, token_ticks

    model = resolve_model(model)
    count("layer", layer, minimum=0, maximum=model.arch.n_layers - 1)
    count("head", head, minimum=0, maximum=model.arch.n_heads - 1)
    ids, tokens = encode_prompt(model, text)
    tokens = tokens if tokens is not None else [str(i) for i in ids]
    f = model.forward(ids, keep=("pattern", "attention_stats"), layers=[layer], dtype=np.float64)
    P = f.pattern[0, head]
    entropy = f.attention_stats.entropy[0, head]
    n = len(ids)
    fig, axes = panel_row(axes, 3, 4.2, height=4.0)
    size = min(n, 60)
    im = axes[0].imshow(P, cmap="magma", vmin=0, vmax=max(float(P.max()), 1e-12), interpolation="nearest")
    fig.colorbar(im, ax=axes[0], shrink=0.75, label="weight")
    token_ticks(axes[0], tokens, "x", max_labels=size)
    token_ticks(axes[0], tokens, "y", max_labels=size)
    axes[0].set_xlabel("key")
    axes[0].set_ylabel("query")
    axes[0].set_title(f"L{layer}H{head} pattern", fontsize=9)
    i = np.arange(n)
    axes[1].plot(i, entropy, lw=1.2, label="this head")
    if not model.arch.bidirectional:
        axes[1].plot(i, np.log(i + 1), "k--", lw=0.8, label="uniform over visible keys")
    else:
        axes[1].axhline(np.log(n), color="k", ls="--", lw=0.8, label="uniform over all keys")
    axes[1].set_xlabel("query position")
    axes[1].set_ylabel("entropy (nats)")
    axes[1].set_title("how spread the attention is", fontsize=9)
    axes[1].legend(fontsize=7)
    try:
        heads = model.heads
    except ValueError as e:  # multi-head latent attention: no per-head W_V, W_O
        axes[2].text(0.5, 0.5, str(e).split(":")[0] + ":\nno per-head circuits", ha="center", va="center", fontsize=8,
                     transform=axes[2].transAxes)
        axes[2].set_axis_off()
    else:
        qk = factored_svd(heads.W_Q[layer, head], heads.W_K[layer, head].T).S
        ov = factored_svd(heads.W_V[layer, head], heads.W_O[layer, head]).S
        for values, label in ((qk, "$W_{QK} = W_Q W_K^T$"), (ov, "$W_{OV} = W_V W_O$")):
            axes[2].plot(np.arange(1, len(values) + 1), values, "o-", ms=3, lw=1, label=label)
        axes[2].set_yscale("log")
        axes[2].set_xlabel("i (i-th largest singular value)")
        axes[2].set_ylabel(r"$\sigma_i$")
        axes[2].set_title("circuit spectra", fontsize=9)
        axes[2].legend(fontsize=7)
    fig.suptitle(f"layer {layer}, head {head} on {n} tokens", fontsize=10)
    fig.tight_layout()
    return fig
