"""W_OV and W_QK spectra of every head, and the notes' "spectral diagnostics" figure.

The notes ("spectral diagnostics"): the singular values sigma_i of a head's W_OV measure how
much it stretches each direction; the effective rank r_eff = exp(-sum p_i log p_i) with
p_i = sigma_i^2 / sum sigma_j^2 separates low-rank copiers from high-rank mixers, and the
cumulative energy E_k = sum_{i<=k} sigma_i^2 / sum_i sigma_i^2 says how many directions hold
a given fraction of the variance. The same numbers for W_QK = W_Q W_K^T (the bilinear form
B of Laplace-Radon eq. 17; the position-free part B(0) for rotary models) describe what a
head matches. The spectra come from :func:`attngeom.factored_svd` (no d_model x d_model
product is formed), r_eff from :func:`attngeom.effective_rank` (kind "energy") and E_k from
:func:`attngeom.cumulative_energy`.

With a prompt, the model's routing matrices are kept (``WeightSpectra.routing``), so
:meth:`WeightSpectra.plot` draws the notes' figure for one head: its spectra with E_k beside
its attention heat map on the prompt, tokens as tick labels (every k-th beyond 60 tokens).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..._deprecation import renamed_field
from ..._docstrings import fill_doc
from ..._operands import choice, count, scalar
from ...spectral import cumulative_energy, effective_rank, factored_svd
from ..nn.heads import ModelHeads
from .prompt import encode_prompt, resolve_model


@dataclass
class WeightSpectra:
    """Spectra of W_OV = W_V W_O and W_QK = W_Q W_K^T for every head (module docstring).

    Attributes
    ----------
    ov_singular_values, qk_singular_values : ndarray, shape (n_layers, n_heads, d_head)
        Descending singular values.
    ov_effective_rank, qk_effective_rank : ndarray, shape (n_layers, n_heads)
        The notes' r_eff (entropy of sigma_i^2 / sum sigma_j^2, exponentiated).
    ov_energy, qk_energy : ndarray, shape (n_layers, n_heads, d_head)
        E_k for k = 1..d_head.
    routing : ndarray, shape (n_layers, n_heads, n, n), or None
        The routing matrices P of every head on the prompt (None without one); ``attentions``
        is its deprecated old name.
    token_ids : ndarray of int, shape (n,), or None
        The prompt's token ids.
    tokens : list of str or None
        The prompt's token strings.
    """

    ov_singular_values: np.ndarray
    qk_singular_values: np.ndarray
    ov_effective_rank: np.ndarray
    qk_effective_rank: np.ndarray
    ov_energy: np.ndarray = field(repr=False)
    qk_energy: np.ndarray = field(repr=False)
    routing: Optional[np.ndarray] = field(default=None, repr=False)
    token_ids: Optional[np.ndarray] = None
    tokens: Optional[List[str]] = None
    attentions = renamed_field("routing")

    def directions_for(self, level: float = 0.9, *, which: str = "ov") -> np.ndarray:
        """The smallest k with E_k >= level, per head: how many directions hold that energy.

        Parameters
        ----------
        level : float, default 0.9
            Energy fraction in (0, 1].
        which : {"ov", "qk"}, default "ov"
            Which spectrum.

        Returns
        -------
        ndarray of int, shape (n_layers, n_heads)
            k per head (0 for a zero matrix).

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> s = ag.weight_spectra(planted_induction_model("planted"))
        >>> int(s.directions_for(0.99)[1, 0])  # the planted copier spans the 48 token directions
        48
        """
        level = scalar("level", level, positive=True)
        if level > 1:
            raise ValueError(f"level must be in (0, 1], got {level}")
        choice("which", which, ("ov", "qk"), "'ov' or 'qk'")
        e = self.ov_energy if which == "ov" else self.qk_energy
        k = np.argmax(e >= level - 1e-12, axis=-1) + 1
        return np.where(e[..., -1] > 0, k, 0)

    def summary(self) -> dict:
        """Named scalars: mean and range over heads of both effective ranks."""
        out = {}
        for name in ("ov_effective_rank", "qk_effective_rank"):
            v = getattr(self, name)
            out.update({f"{name}_mean": float(v.mean()), f"{name}_min": float(v.min()), f"{name}_max": float(v.max())})
        return out

    @fill_doc
    def plot(self, layer: int, head: int, *, axes=None):
        """The notes' spectral-diagnostics figure for one head.

        The W_QK and W_OV spectra (log scale, with E_k) and, when the spectra were taken
        with a prompt, the head's attention heat map with the tokens as tick labels.

        Parameters
        ----------
        layer, head : int
            The head.
        axes : sequence of Axes, optional
            Two axes (three with a prompt) to draw into.

        %(figure_returns)s

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> s = ag.weight_spectra(planted_induction_model("planted"), prompt=np.arange(1, 9).repeat(2))
        >>> len(s.plot(1, 0).axes) >= 3
        True
        """
        from ... import plotting

        L, H = self.ov_effective_rank.shape
        layer = count("layer", layer, 0, L - 1)
        head = count("head", head, 0, H - 1)
        n_panels = 3 if self.routing is not None else 2
        if axes is None:
            fig, axes = plotting.panel_row(None, n_panels, 4.6, height=4.0)
        else:
            fig = axes[0].figure
        title = f"L{layer}H{head}"
        plotting.head_spectrum_pair(self.qk_singular_values[layer, head], self.ov_singular_values[layer, head],
                                    f"{title} (r_eff W_QK {self.qk_effective_rank[layer, head]:.1f}, W_OV "
                                    f"{self.ov_effective_rank[layer, head]:.1f})", axes=axes[:2])
        if self.routing is not None:
            plotting.attention_heatmap(self.routing[layer, head], tokens=self.tokens, title=f"{title} attention",
                                       ax=axes[2])
        return fig


def weight_spectra(model, *, prompt=None) -> WeightSpectra:
    """Per-head W_OV and W_QK spectra, effective ranks and cumulative energies E_k.

    The notes' "spectral diagnostics" (module docstring); with a prompt the routing
    matrices are kept for the figure of :meth:`WeightSpectra.plot`.

    Parameters
    ----------
    model : Model or str or path-like
        A model or a checkpoint (:func:`attngeom.models.analysis.prompt.resolve_model`), or
        its heads (:class:`ModelHeads`: weights only; no prompt then).
    prompt : str or array_like of int, optional
        A text or token ids to run the model on.

    Returns
    -------
    WeightSpectra
        Singular values, r_eff and E_k of W_OV and W_QK for every head (n_layers, n_heads, ...),
        and the routing matrices on the prompt.

    Raises
    ------
    ValueError
        For a prompt with ModelHeads, and a bad prompt.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> s = ag.weight_spectra(planted_induction_model("planted"))
    >>> s.ov_singular_values.shape
    (2, 4, 64)
    >>> round(float(s.ov_effective_rank[0, 0]), 6)  # the planted heads' W_OV: 48 equal singular values
    48.0
    """
    if isinstance(model, ModelHeads):
        if prompt is not None:
            raise ValueError("prompt needs a Model (or a checkpoint) to run, got ModelHeads")
        heads, m = model, None
    else:
        m = resolve_model(model)
        heads = m.heads
    ov = factored_svd(heads.W_V, heads.W_O).S
    qk = factored_svd(heads.W_Q, np.swapaxes(heads.W_K, -1, -2)).S
    out = WeightSpectra(ov, qk, effective_rank(ov, kind="energy", spectrum=True),
                        effective_rank(qk, kind="energy", spectrum=True), cumulative_energy(ov, spectrum=True),
                        cumulative_energy(qk, spectrum=True))
    if prompt is not None:
        ids, tokens = encode_prompt(m, prompt)
        out.routing = m.forward(ids, dtype=np.float64, keep=("pattern",)).pattern
        out.token_ids, out.tokens = ids, tokens
    return out
