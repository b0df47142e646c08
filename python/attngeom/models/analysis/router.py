"""Router statistics of mixture-of-experts models from their activations.

The notes' "mixture-of-experts feed-forward layers": "the router multiplies token states by
a gating matrix R with sparse rows ... Inspecting R^T R diagnoses load imbalance and expert
redundancy". :func:`router_statistics` runs a prompt through a MoE model (Mixtral or
DeepSeek-V2 layout, :mod:`.moe`), takes every MoE layer's router logits g and its top-k
router matrix R (the notes' "Definition (top-k routing matrix)", exactly what the model
uses: topk_router(g, k) for Mixtral, the unrenormalised, scaled top-k of softmax(g) for
DeepSeek-V2, :func:`attngeom.models.nn.moe.route`), and summarises: expert loads, top-k sparsity 1 - k / n_experts, the router
Gram matrix R^T R and its spectrum (:func:`attngeom.router_gram`; the notes' "Lemma
(balanced expert utilization)": with disjoint, equal loads R^T R is diagonal with entries
kT / n_experts), router entropy and the softmax mass the top k keep before renormalising.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..._deprecation import renamed_field
from ..._docstrings import fill_doc
from ...circuits import RouterGram, router_gram
from ..nn.moe import route
from .prompt import encode_prompt, resolve_model


@dataclass
class RouterStatistics:
    """The router of every MoE layer on one prompt (module docstring).

    Attributes
    ----------
    router_logits : ndarray, shape (n_layers, n, n_experts)
        Router logits g (n_layers counts the MoE layers, listed in ``layers``).
    router_matrix : ndarray, shape (n_layers, n, n_experts)
        The top-k router matrices R (k non-zeros a row; rows sum to 1 for Mixtral, to the
        top-k softmax mass times routed_scaling_factor for DeepSeek-V2).
    counts : ndarray of int, shape (n_layers, n_experts)
        Tokens routed to each expert.
    load_fraction : ndarray, shape (n_layers, n_experts)
        counts / (k n): each expert's share of the routed slots (1 / n_experts if balanced).
    grams : list of RouterGram
        :func:`attngeom.router_gram` of every layer: G = R^T R, loads sum_t R[t, e],
        off-diagonal mass, imbalance.
    gram_spectrum : ndarray, shape (n_layers, n_experts)
        Eigenvalues of G, descending.
    sparsity : float
        Fraction of zero entries of R, 1 - k / n_experts.
    top_k_mass : ndarray, shape (n_layers,)
        Mean softmax probability the k chosen experts hold before renormalising.
    entropy : ndarray, shape (n_layers,)
        Mean entropy (nats) of the full router softmax.
    k : int
        Experts per token.
    tokens : list of str or None
        The prompt's token strings.
    layers : list of int or None
        The model's layer index of each entry (its MoE layers; DeepSeek-V2's first
        first_k_dense_replace layers are dense and absent).
    """

    router_logits: np.ndarray = field(repr=False)
    router_matrix: np.ndarray = field(repr=False)
    counts: np.ndarray
    load_fraction: np.ndarray = field(repr=False)
    grams: List[RouterGram] = field(repr=False)
    gram_spectrum: np.ndarray = field(repr=False)
    sparsity: float
    top_k_mass: np.ndarray
    entropy: np.ndarray
    k: int
    tokens: Optional[List[str]] = field(default=None, repr=False)
    layers: Optional[List[int]] = None
    routing = renamed_field("router_matrix")

    def summary(self) -> dict:
        """Named scalars per MoE layer (keys carry the model's layer index): imbalance
        (coefficient of variation of the loads), the off-diagonal mass of R^T R, the top-k
        mass and entropy; and the sparsity."""
        out = {"n_layers": len(self.grams), "n_experts": int(self.counts.shape[1]), "k": self.k,
               "sparsity": self.sparsity}
        names = self.layers if self.layers is not None else range(len(self.grams))
        for i, (layer, g) in enumerate(zip(names, self.grams)):
            out[f"imbalance_L{layer}"] = g.imbalance
            out[f"off_diagonal_mass_L{layer}"] = g.off_diagonal_mass
            out[f"top_k_mass_L{layer}"] = float(self.top_k_mass[i])
            out[f"entropy_L{layer}"] = float(self.entropy[i])
        return out

    @fill_doc
    def plot(self, axes=None):
        """Expert load per layer (heat map) and the spectra of R^T R.

        Parameters
        ----------
        axes : sequence of two Axes, optional
            Axes to draw into.

        %(figure_returns)s

        Examples
        --------
        >>> stats.plot()  # doctest: +SKIP
        """
        from ... import plotting

        fig, axes = plotting.panel_row(axes, 2, 4.6)
        im = axes[0].imshow(self.load_fraction, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=axes[0], label="share of routed slots")
        names = list(self.layers) if self.layers is not None else list(range(len(self.gram_spectrum)))
        axes[0].set_yticks(range(len(names)), [str(layer) for layer in names])
        axes[0].set_xlabel("expert")
        axes[0].set_ylabel("layer")
        axes[0].set_title("expert load", fontsize=9)
        for layer, s in zip(names, self.gram_spectrum):
            shown, _ = plotting.log_floor(np.maximum(s, 0))
            axes[1].semilogy(np.arange(1, s.size + 1), shown, "o-", ms=2.5, lw=1, label=f"layer {layer}")
        axes[1].set_xlabel("i")
        axes[1].set_ylabel(r"$\lambda_i(R^\top R)$")
        axes[1].set_title("router Gram spectrum", fontsize=9)
        if len(self.gram_spectrum) <= 12:
            axes[1].legend(fontsize=7)
        fig.tight_layout()
        return fig


def router_statistics(model, prompt) -> RouterStatistics:
    """Router statistics of a mixture-of-experts model on a prompt (module docstring).

    The notes' MoE section: the top-k router matrix R of every layer from the model's own
    activations, the expert loads, the router Gram matrix R^T R (:func:`attngeom.router_gram`)
    and its spectrum, top-k sparsity, router entropy and the softmax mass kept by the top k.

    Parameters
    ----------
    model : Model or str or path-like
        A mixture-of-experts decoder (Mixtral or DeepSeek-V2) or its checkpoint.
    prompt : str or array_like of int, shape (n,)
        A text or token ids.

    Returns
    -------
    RouterStatistics
        Per layer: router logits and R (n_layers, n, n_experts), counts and load fractions,
        Gram matrices with their spectra, top-k mass and entropy; the sparsity 1 - k / n_experts.

    Raises
    ------
    ValueError
        For a model without MoE layers, and a bad prompt.

    Examples
    --------
    >>> stats = ag.router_statistics("mixtral-checkpoint", "The cat sat.")  # doctest: +SKIP
    >>> stats.counts.sum(axis=1)  # doctest: +SKIP
    array([8, 8])
    """
    m = resolve_model(model)
    if not m.arch.n_experts:
        raise ValueError(f"model: router statistics need a mixture-of-experts model, got a {m.arch.model_type} "
                         f"checkpoint with dense MLPs")
    ids, tokens = encode_prompt(m, prompt)
    f = m.forward(ids, dtype=np.float64)
    logits = f.router_logits  # (L, n, E)
    k, E = m.arch.experts_per_token, m.arch.n_experts
    R = route(logits, m.arch)
    counts = np.count_nonzero(R, axis=1)
    grams = [router_gram(r) for r in R]
    spectrum = np.stack([np.linalg.eigvalsh(g.gram)[::-1] for g in grams])
    shifted = logits - logits.max(-1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(-1, keepdims=True)
    top = np.sort(p, axis=-1)[..., ::-1][..., :k].sum(-1)
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    return RouterStatistics(logits, R, counts, counts / (k * ids.size), grams, spectrum, 1.0 - k / E,
                            top.mean(-1), entropy.mean(-1), k, tokens, list(m.arch.moe_layers))
