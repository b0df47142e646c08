"""Matplotlib figures shared by several modules (matplotlib is imported lazily:
``pip install attngeom[plot]``).

Every figure function takes an optional ``ax`` (or ``axes``) and returns the figure. The
building blocks (:func:`new_figure`, :func:`axes_or_new`, :func:`panel_row`,
:func:`finish_curves`, :func:`finish`, :func:`log_floor`) are what the experiment drivers use to draw the
figures that belong to one driver only, which live in that driver's module.
"""
from __future__ import annotations

import numpy as np

from ._docstrings import fill_doc
from ._deprecation import renamed_arguments
from ._operands import choice


def pyplot():
    """matplotlib.pyplot, with the Agg backend chosen when there is no display.

    Returns
    -------
    module
        ``matplotlib.pyplot``.

    Raises
    ------
    ImportError
        Naming the ``plot`` extra when matplotlib is missing.

    Examples
    --------
    >>> plt = ag.plotting.pyplot()
    >>> plt.__name__
    'matplotlib.pyplot'
    """
    try:
        import matplotlib

        if matplotlib.get_backend().lower() not in ("module://matplotlib_inline.backend_inline",):
            import os

            if not os.environ.get("DISPLAY") and not os.environ.get("MPLBACKEND"):
                matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install 'attngeom[plot]'") from exc
    return plt


def new_figure(nrows=1, ncols=1, *, figsize=None, **kw):
    """A new Figure and its axes.

    Outside Jupyter the figure is built outside pyplot's registry (no global state is left
    behind, nothing needs closing); under Jupyter's inline backend it goes through pyplot so
    it is shown at the end of the cell, and the backend closes it after showing it.

    Parameters
    ----------
    nrows, ncols : int, default 1
        Grid of axes.
    figsize : tuple of float, optional
        (width, height) in inches.
    **kw
        Passed to ``Figure.subplots`` (e.g. ``squeeze=False``).

    Returns
    -------
    fig : matplotlib.figure.Figure
        The figure.
    axes : Axes or ndarray of Axes
        As ``Figure.subplots`` returns them.

    Examples
    --------
    >>> fig, axes = ag.plotting.new_figure(1, 2, figsize=(6, 3))
    >>> len(axes)
    2
    """
    plt = pyplot()
    import matplotlib

    if "inline" in matplotlib.get_backend().lower():
        return plt.subplots(nrows, ncols, figsize=figsize, **kw)
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def panel_row(axes, n, width, height=3.2, **kw):
    """A new row of n panels, each `width` inches wide, or the figure of the given axes.

    Parameters
    ----------
    axes : sequence of Axes or None
        Existing axes to draw into, or None for a new figure.
    n : int
        Number of panels.
    width : float
        Width of one panel in inches.
    height : float, default 3.2
        Height in inches.
    **kw
        Passed to :func:`new_figure`.

    Returns
    -------
    fig : matplotlib.figure.Figure
        The figure.
    axes : list of Axes
        The n panels.

    Examples
    --------
    >>> fig, axes = ag.plotting.panel_row(None, 3, 2.0)
    >>> len(axes), fig.get_size_inches().tolist()
    (3, [6.0, 3.2])
    """
    if axes is None:
        fig, grid = new_figure(1, n, figsize=(width * n, height), squeeze=False, **kw)
        return fig, list(grid[0])
    return axes[0].figure, list(axes)


def finish_curves(ax, xlabel, ylabel, xscale, yscale, n_curves):
    """Scales, labels and (for several curves) the legend of a curve panel.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel.
    xlabel, ylabel : str
        Axis labels.
    xscale, yscale : {"linear", "log"}
        Axis scales.
    n_curves : int
        Number of curves drawn; a legend is added when it is above 1.

    Returns
    -------
    None
        The axes are changed in place.

    Examples
    --------
    >>> fig, ax = ag.plotting.new_figure()
    >>> _ = ax.plot([1, 10], [1, 2], label="a")
    >>> ag.plotting.finish_curves(ax, "features m", "error", "log", "linear", 1)
    >>> ax.get_xscale(), ax.get_xlabel()
    ('log', 'features m')
    """
    ax.set_xscale(xscale)
    ax.set_yscale(yscale)
    if xscale == "log":  # no labels on minor ticks: they collide over a short decade range
        from matplotlib.ticker import NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if n_curves > 1:
        ax.legend(frameon=False, fontsize=8)


def finish(fig, ax, xlabel, ylabel, title=None, *, legend=False, title_size=None):
    """Axis labels, title and (when asked) legend of a one-panel figure; tight layout.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    ax : matplotlib.axes.Axes
        Its axes.
    xlabel, ylabel : str
        Axis labels.
    title : str, optional
        Title.
    legend : bool, default False
        Add a legend.
    title_size : float, optional
        Font size of the title (matplotlib's default when None).

    Returns
    -------
    matplotlib.figure.Figure
        `fig`.

    Examples
    --------
    >>> fig, ax = ag.plotting.new_figure()
    >>> ag.plotting.finish(fig, ax, "key", "query", "routing") is fig
    True
    """
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    if legend:
        ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def axes_or_new(ax, **fig_kw):
    """The given axes and its figure, or a new figure with one axes.

    Parameters
    ----------
    ax : matplotlib.axes.Axes or None
        Axes to draw into.
    **fig_kw
        Passed to :func:`new_figure` when `ax` is None.

    Returns
    -------
    fig : matplotlib.figure.Figure
        The figure.
    ax : matplotlib.axes.Axes
        The axes.

    Examples
    --------
    >>> fig, ax = ag.plotting.axes_or_new(None, figsize=(3, 3))
    >>> ag.plotting.axes_or_new(ax) == (fig, ax)
    True
    """
    if ax is None:
        return new_figure(**fig_kw)
    return ax.figure, ax


def log_floor(values):
    """Values below max * 1e-17 raised to that floor, so exact zeros can be drawn on a log axis.

    Parameters
    ----------
    values : array_like
        Non-negative values (e.g. a spectrum with exact zeros).

    Returns
    -------
    shown : ndarray
        The values with the floor applied.
    floor : float
        The floor.

    Examples
    --------
    >>> shown, floor = ag.plotting.log_floor([1.0, 0.0])
    >>> shown, floor
    (array([1., 0.]), 1e-17)
    """
    values = np.asarray(values, dtype=float)
    top = float(values.max()) if values.size else 1.0
    floor = top * 1e-17 if top > 0 else np.finfo(float).tiny
    return np.maximum(values, floor), floor


@fill_doc
def head_spectra(spectra, title="", ax=None):
    """Singular values of many heads, one line each, log scale.

    The spectra of Laplace-Radon s.5.3 (B = W_Q W_K^T) or of the notes' W_OV.

    Parameters
    ----------
    spectra : array_like, shape (n_heads, k)
        Singular values, one row per head.
    title : str, default ""
        What the spectra are of (e.g. "B").
    %(ax)s

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.head_spectra(np.array([[3.0, 1.0, 0.0], [2.0, 2.0, 1.0]]), "B")
    >>> fig.axes[0].get_yscale()
    'log'
    """
    fig, ax = axes_or_new(ax, figsize=(5, 3.2))
    spectra = np.atleast_2d(np.asarray(spectra, dtype=float))
    idx = np.arange(1, spectra.shape[1] + 1)
    shown, _ = log_floor(spectra)
    for s in shown:
        ax.plot(idx, s, lw=1, alpha=0.6 if len(spectra) > 1 else 1)
    ax.set_yscale("log")
    ax.set_xlabel("i (i-th largest singular value)")
    ax.set_ylabel(r"$\sigma_i$")
    ax.set_title(f"singular values of {title}" if title else "singular values")
    fig.tight_layout()
    return fig


def index_ticks(ax, n, axis="x", *, max_labels=24):
    """Integer ticks 0..n-1 on an axis of an image of n rows or columns (layers, heads).

    Without them matplotlib picks fractional ticks (-0.5, 0.5, ...) for a few rows; with
    more than `max_labels` entries every k-th index is labelled.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes holding the image.
    n : int
        Number of rows ("y") or columns ("x").
    axis : {"x", "y"}, default "x"
        Which axis.
    max_labels : int, default 24
        At most about this many labels.

    Returns
    -------
    ndarray of int
        The ticked indices.

    Examples
    --------
    >>> fig, ax = ag.plotting.new_figure()
    >>> _ = ax.imshow(np.zeros((2, 4)))
    >>> ag.plotting.index_ticks(ax, 2, "y").tolist(), [t.get_text() for t in ax.get_yticklabels()]
    ([0, 1], ['0', '1'])
    """
    step = max(1, -(-int(n) // int(max_labels)))
    ticks = np.arange(0, int(n), step)
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, [str(int(t)) for t in ticks])
    return ticks


@fill_doc
def head_map(values, metric, ax=None):
    """A (layer, head) heat map of one per-head quantity.

    Parameters
    ----------
    values : ndarray, shape (n_layers, n_heads)
        The quantity per head.
    metric : str
        Its name (colour bar label and title).
    %(ax)s

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.head_map(np.arange(6.0).reshape(2, 3), "effective rank")
    >>> fig.axes[0].get_title()
    'effective rank'
    """
    fig, ax = axes_or_new(ax, figsize=(1.2 + 0.45 * values.shape[1], 1.0 + 0.4 * values.shape[0]))
    im = ax.imshow(values, cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(metric)
    fig.tight_layout()
    return fig


#: The cumulative-energy axis of the spectra figures, with its definition.
ENERGY_LABEL = r"$E_k$: share of $\sum_i \sigma_i^2$ in the k largest"


@fill_doc
def spectrum_with_energy(s, ax=None, label=""):
    """Eigenvalue or singular-value spectrum (log scale) with its cumulative energy E_k.

    The notes' E_k (:func:`attngeom.cumulative_energy`) on a second axis; exact zeros are
    drawn at 1e-17 of the maximum (Laplace-Radon Fig. 6 shows such a drop).

    Parameters
    ----------
    s : array_like, shape (k,)
        The spectrum (sorted descending here).
    %(ax)s
    label : str, default ""
        Legend label of the spectrum.

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.spectrum_with_energy([4.0, 1.0, 0.0])
    >>> fig.axes[0].get_xlabel()
    'k (k-th largest value)'
    """
    fig, ax = axes_or_new(ax, figsize=(5, 3.2))
    s = np.sort(np.asarray(s, dtype=float))[::-1]
    idx = np.arange(1, s.size + 1)
    shown, floor = log_floor(s)
    ax.semilogy(idx, shown, "o-", ms=3, label=label or "spectrum")
    if np.any(s < floor):
        ax.annotate("zeros at 1e-17 of max", (idx[s < floor][0], floor), fontsize=8, va="bottom")
    ax.set_xlabel("k (k-th largest value)")
    ax.set_ylabel("value")
    twin = ax.twinx()
    e = np.cumsum(s * s)
    twin.plot(idx, e / e[-1] if e[-1] > 0 else e, color="tab:red", lw=1)
    twin.set_ylabel(ENERGY_LABEL, color="tab:red", fontsize=8)
    twin.set_ylim(0, 1.02)
    fig.tight_layout()
    return fig


@fill_doc
def layer_head_grids(maps, axes=None):
    """(layer, head) grids of per-head metrics, two to a row, each cell annotated with its value.

    Parameters
    ----------
    maps : dict of str to array_like
        {title: (n_layers, n_heads) array}.
    axes : sequence of Axes, optional
        One axes per map.

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.layer_head_grids({"rank B": np.ones((2, 3)), "rank W_OV": np.zeros((2, 3))})
    >>> [ax.get_title() for ax in fig.axes if ax.get_title()]
    ['rank B', 'rank W_OV']
    """
    maps = {k: np.atleast_2d(np.asarray(v, dtype=float)) for k, v in maps.items()}
    n_layers, n_heads = next(iter(maps.values())).shape
    if axes is None:
        w, h = 1.6 + 0.42 * n_heads, 1.0 + 0.36 * n_layers
        ncols = min(2, len(maps))
        nrows = -(-len(maps) // ncols)
        fig, grid = new_figure(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
        axes = grid.ravel()
        for ax in axes[len(maps):]:
            ax.set_visible(False)
    else:
        fig = axes[0].figure
    for ax, (title, values) in zip(axes, maps.items()):
        im = ax.imshow(values, cmap="viridis", aspect="auto")
        fig.colorbar(im, ax=ax, shrink=0.85)
        if values.size <= 400:
            mid = np.nanmean(values)
            for (i, j), v in np.ndenumerate(values):
                ax.text(j, i, f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}", ha="center", va="center", fontsize=6,
                        color="k" if v > mid else "w")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


@fill_doc
def head_spectrum_pair(bilinear, ov, title="", axes=None):
    """One head's singular values of B = W_Q W_K^T and of W_OV, each with its cumulative energy.

    Laplace-Radon eq. 17 (B) and the notes' W_OV spectra, log scale, with the cumulative
    energy E_k = sum_{i <= k} sigma_i^2 / sum_i sigma_i^2 (the share of the squared
    singular values in the k largest) on a second axis, whose label gives that definition.

    Parameters
    ----------
    bilinear : array_like, shape (k,)
        Singular values of B.
    ov : array_like, shape (k,) or None
        Singular values of W_OV (one panel only when None).
    title : str, default ""
        Prefix of the panel titles (e.g. "L0H3").
    axes : sequence of Axes, optional
        One or two axes to draw into.

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.head_spectrum_pair([3.0, 1.0], [2.0, 0.5], "L0H0")
    >>> len([ax for ax in fig.axes if ax.get_title()])  # the B and W_OV panels
    2
    """
    from matplotlib.ticker import MaxNLocator

    panels = [(r"$B = W_Q W_K^\top$", bilinear)] + ([(r"$W_{OV}$", ov)] if ov is not None else [])
    fig, axes = panel_row(axes, len(panels), 4.6)
    for ax, (name, s) in zip(axes, panels):
        s = np.sort(np.asarray(s, dtype=float))[::-1]
        idx = np.arange(1, s.size + 1)
        shown, _ = log_floor(s)
        ax.semilogy(idx, shown, "o-", ms=2.5)
        ax.set_xlabel("i (i-th largest singular value)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(r"$\sigma_i$")
        ax.set_title(f"{title} {name}".strip(), fontsize=9)
        twin = ax.twinx()
        e = np.cumsum(s * s)
        twin.plot(idx, e / e[-1] if e[-1] > 0 else e, color="tab:red", lw=1)
        twin.set_ylim(0, 1.02)
        twin.set_ylabel(ENERGY_LABEL, color="tab:red", fontsize=8)
    fig.tight_layout()
    return fig


#: How a token's invisible characters are drawn on axes: a space, the byte-level BPE's and
#: SentencePiece's space markers, a newline, a tab.
_VISIBLE = {" ": "\u2423", "\u0120": "\u2423", "\u2581": "\u2423", "\n": "\u23ce", "\u010a": "\u23ce", "\t": "\u21e5"}


def display_token(token) -> str:
    """A token string as axes show it: spaces as "\u2423" (also the byte-level BPE's "\u0120" and
    SentencePiece's "\u2581"), newlines as "\u23ce", tabs as "\u21e5", the empty string as "\u2205".

    Parameters
    ----------
    token : str
        A token string as the tokenizer gives it.

    Returns
    -------
    str
        The string drawn on an axis.

    Examples
    --------
    >>> [ag.plotting.display_token(t) for t in (" ", "\u0120the", "a b", "")]
    ['\u2423', '\u2423the', 'a\u2423b', '\u2205']
    """
    text = "".join(_VISIBLE.get(ch, ch) for ch in str(token))
    return text if text else "\u2205"


def token_ticks(ax, tokens, axis="x", *, max_labels=60):
    """Label an axis of a heat map with token strings, every k-th one beyond `max_labels`.

    Up to `max_labels` tokens every token gets a tick; beyond, every k-th token with
    k = ceil(n / max_labels), so the labels stay readable (the notes' attention heat maps
    with tokens as tick labels). Spaces and newlines are drawn visibly (:func:`display_token`).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes of an image whose cells are tokens 0..n-1 along `axis`.
    tokens : sequence of str
        The token strings.
    axis : {"x", "y"}, default "x"
        Which axis; x labels are rotated by 90 degrees.
    max_labels : int, default 60
        The most labels drawn.

    Returns
    -------
    ndarray of int
        The positions that got a label.

    Examples
    --------
    >>> fig, ax = ag.plotting.axes_or_new(None)
    >>> ag.plotting.token_ticks(ax, [f"t{i}" for i in range(130)], max_labels=60)[:4]
    array([0, 3, 6, 9])
    """
    choice("axis", axis, ("x", "y"), "'x' or 'y'")
    tokens = [display_token(t) for t in tokens]
    step = max(1, -(-len(tokens) // max(1, int(max_labels))))
    where = np.arange(0, len(tokens), step)
    size = 6 if len(where) > 30 else 8
    if axis == "x":
        ax.set_xticks(where)
        ax.set_xticklabels([tokens[i] for i in where], rotation=90, fontsize=size)
    else:
        ax.set_yticks(where)
        ax.set_yticklabels([tokens[i] for i in where], fontsize=size)
    return where


@renamed_arguments(P="routing")
@fill_doc
def attention_heatmap(routing, tokens=None, title="", ax=None):
    """An attention (routing) matrix P as a heat map, queries as rows.

    Token strings label the axes when given (every k-th beyond 60 tokens, :func:`token_ticks`).
    The old keyword ``P`` is deprecated
    (use ``routing``).

    Parameters
    ----------
    routing : array_like, shape (n, n_k)
        The routing matrix P.
    tokens : sequence of str, optional
        Token strings.
    title : str, default ""
        Title.
    %(ax)s

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.attention_heatmap(np.eye(3), tokens=["a", "b", "c"], title="identity routing")
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
    ('key', 'query')
    """
    P = np.asarray(routing, dtype=float)
    n = P.shape[0]
    size = min(9.0, 2.5 + 0.16 * n)
    fig, ax = axes_or_new(ax, figsize=(size + 0.8, size))
    im = ax.imshow(P, cmap="magma", vmin=0, vmax=max(float(P.max()), 1e-12), interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.8, label="weight")
    if tokens is not None:
        token_ticks(ax, tokens[:P.shape[1]], "x")
        token_ticks(ax, tokens[:n], "y")
    return finish(fig, ax, "key", "query", title, title_size=9)


@fill_doc
def curve_panels(x, panels, xlabel, *, xscale="log", axes=None, title=None):
    """Side-by-side panels of curves against one parameter x.

    In each panel the first curve is drawn solid with markers, the others dashed. NaN values
    leave gaps (e.g. where a model does not exist).

    Parameters
    ----------
    x : array_like, shape (n,)
        The parameter.
    panels : list of tuple
        (ylabel, {label: (n,) values}, yscale) per panel, yscale "linear" or "log".
    xlabel : str
        Label of x.
    xscale : {"log", "linear"}, default "log"
        Scale of x.
    axes : sequence of Axes, optional
        One axes per panel.
    title : str, optional
        Figure title.

    %(figure_returns)s

    Examples
    --------
    >>> m = np.array([16, 64, 256])
    >>> fig = ag.plotting.curve_panels(m, [("error", {"iid": 1 / m, "orthogonal": 0.5 / m}, "log")], "features m")
    >>> len(fig.axes)
    1
    """
    fig, axes = panel_row(axes, len(panels), 4.3)
    x = np.asarray(x, dtype=float)
    for ax, (ylabel, curves, yscale) in zip(axes, panels):
        for i, (label, values) in enumerate(curves.items()):
            ax.plot(x, np.asarray(values, dtype=float), "-" if i == 0 else "--", marker="o" if i == 0 else ".",
                    ms=3, label=label)
        finish_curves(ax, xlabel, ylabel, xscale, yscale, len(curves))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


@fill_doc
def identity_scatter(a, b, rel_error, xlabel, ylabel, ax=None):
    """Two computations of the same quantity against each other, with the diagonal.

    Laplace-Radon Fig. 1 (softmax attention against N / Z). The diagonal is drawn thin and
    underneath, so the points on it stay visible.

    Parameters
    ----------
    a, b : array_like
        The two computations (raveled; at most 20000 points are drawn).
    rel_error : float
        The relative error shown in the title.
    xlabel, ylabel : str
        What a and b are.
    %(ax)s

    %(figure_returns)s

    Examples
    --------
    >>> x = np.linspace(0, 1, 50)
    >>> fig = ag.plotting.identity_scatter(x, x, 0.0, "softmax", "N / Z")
    >>> fig.axes[0].get_title()
    'relative error 0.00e+00'
    """
    fig, ax = axes_or_new(ax, figsize=(4, 4))
    a, b = np.ravel(a), np.ravel(b)
    idx = np.random.default_rng(0).permutation(a.size)[:20000]
    lim = [float(min(a.min(), b.min())), float(max(a.max(), b.max()))]
    # the diagonal goes underneath, thin and light, so the points on it stay visible
    ax.plot(lim, lim, "-", color="0.75", lw=0.8, zorder=1, label="y = x")
    ax.plot(a[idx], b[idx], "o", ms=2.5, alpha=0.6, mec="none", zorder=2, label="entries")
    ax.legend(loc="upper left", frameon=False, fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"relative error {rel_error:.2e}")
    fig.tight_layout()
    return fig




@fill_doc
def radius_vs_chi(tau, d_k, var_q, ax=None, title=None):
    """Density of the Laplace radii tau against the scaled chi prediction.

    Laplace-Radon eq. 9 and s.13.2 (Fig. 2): for queries with i.i.d. N(0, var_q) entries,
    tau = ``|q|`` / sqrt(d_k) follows sqrt(var_q / d_k) chi(d_k). On a real head the gap
    between the histogram and the curve shows how far the queries are from that mean field.

    Parameters
    ----------
    tau : array_like, shape (m,)
        Radii (raveled).
    d_k : int
        Query dimension (degrees of freedom of the chi law).
    var_q : float
        Variance of the query entries.
    %(ax)s
    title : str, optional
        Title.

    %(figure_returns)s

    Examples
    --------
    >>> tau = np.linalg.norm(np.random.default_rng(0).standard_normal((500, 8)), axis=-1) / np.sqrt(8)
    >>> fig = ag.plotting.radius_vs_chi(tau, 8, 1.0)
    >>> fig.axes[0].get_xlabel()
    '$\\\\tau$'
    """
    from math import lgamma, log

    tau = np.ravel(np.asarray(tau, dtype=float))
    if tau.size == 0 or not np.all(np.isfinite(tau)):
        raise ValueError(f"tau must be a non-empty finite array, got {tau.size} values")
    if int(d_k) < 1 or not float(var_q) > 0:
        raise ValueError(f"d_k must be >= 1 and var_q > 0, got d_k={d_k!r}, var_q={var_q!r}")
    d_k = int(d_k)
    fig, ax = axes_or_new(ax, figsize=(5, 3.2))
    ax.hist(tau, bins=min(60, max(10, tau.size // 10)), density=True, alpha=0.6, label="empirical")
    c = np.sqrt(var_q / d_k)
    t = np.linspace(max(tau.min() * 0.8, 1e-6), tau.max() * 1.2, 400)
    z = t / c
    logpdf = (d_k - 1) * np.log(z) - z * z / 2 - (d_k / 2 - 1) * log(2) - lgamma(d_k / 2)
    ax.plot(t, np.exp(logpdf) / c, "k--", label=r"scaled $\chi_{d_k}$ prediction")
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel("density")
    ax.legend(frameon=False, fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


@fill_doc
def eigen_spectrum(values, title, ax=None, ylabel="eigenvalue", n_total=None):
    """A descending spectrum on a log scale, exact zeros drawn at a floor.

    The tilt covariance, token-space and routing spectra of Laplace-Radon Figs. 5-7. With
    ``n_total``, the values not given are the exact zeros of a rank-deficient matrix, drawn at
    1e-17 of the largest value (:func:`log_floor`) so the drop to them is visible.

    Parameters
    ----------
    values : array_like, shape (k,)
        The spectrum (sorted descending here).
    title : str
        Title.
    %(ax)s
    ylabel : str, default "eigenvalue"
        What the values are (also names the x axis).
    n_total : int, optional
        Size of the full spectrum; ``n_total - k`` exact zeros are appended.

    %(figure_returns)s

    Examples
    --------
    >>> fig = ag.plotting.eigen_spectrum([3.0, 1.0, 0.5], "Cov(u)", n_total=5)
    >>> fig.axes[0].get_xlabel()
    'k (k-th largest eigenvalue)'
    """
    fig, ax = axes_or_new(ax, figsize=(5, 3.2))
    values = np.sort(np.ravel(np.asarray(values, dtype=float)))[::-1]
    n_zero = 0 if n_total is None else max(int(n_total) - values.size, 0)
    shown, floor = log_floor(np.concatenate([values, np.zeros(n_zero)]))
    k = np.arange(1, shown.size + 1)
    exact = shown > floor
    ax.semilogy(k[exact], shown[exact], "o-", ms=3, label=f"nonzero ({int(exact.sum())})")
    if not exact.all():
        ax.semilogy(k[~exact], shown[~exact], "x", ms=3, color="tab:red",
                    label=f"exact zeros ({int((~exact).sum())}), drawn at 1e-17 of max")
        ax.legend(frameon=False, fontsize=8)
    ax.set_xlabel(f"k (k-th largest {ylabel})")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


@fill_doc
def layer_distributions(maps, axes=None, *, kind="box"):
    """Per-layer distributions over heads of per-head quantities: one panel per quantity.

    A box (or violin) per layer summarises that layer's heads, so trends across depth (the
    routing effective rank falling from the first to the last layer of a model, say) show at
    a glance; three panels to a row.

    Parameters
    ----------
    maps : dict of str to array_like
        {title: (n_layers, n_heads) array}; NaN entries are left out.
    axes : sequence of Axes, optional
        One axes per quantity.
    kind : {"box", "violin"}, default "box"
        The summary drawn per layer.

    %(figure_returns)s

    Examples
    --------
    >>> grid = np.arange(12.0).reshape(3, 4)
    >>> fig = ag.plotting.layer_distributions({"rank B": grid, "radius": grid / 10})
    >>> [ax.get_xlabel() for ax in fig.axes if ax.get_visible()]
    ['layer', 'layer']
    """
    choice("kind", kind, ("box", "violin"), "'box' or 'violin'")
    if not isinstance(maps, dict) or not maps:
        raise ValueError("maps must be a non-empty dict {title: (n_layers, n_heads) array}")
    maps = {k: np.atleast_2d(np.asarray(v, dtype=float)) for k, v in maps.items()}
    shapes = {v.shape for v in maps.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"maps must hold (n_layers, n_heads) arrays of one shape, got {sorted(shapes)}")
    n_layers = next(iter(shapes))[0]
    if axes is None:
        ncols = min(3, len(maps))
        nrows = -(-len(maps) // ncols)
        width = max(3.6, 1.4 + 0.32 * n_layers)
        fig, grid = new_figure(nrows, ncols, figsize=(width * ncols, 2.9 * nrows), squeeze=False)
        axes = grid.ravel()
        for ax in axes[len(maps):]:
            ax.set_visible(False)
    else:
        fig = axes[0].figure
    layers = np.arange(n_layers)
    for ax, (title, values) in zip(axes, maps.items()):
        data = [row[np.isfinite(row)] for row in values]
        keep = [i for i, d in enumerate(data) if d.size]
        if kind == "box":
            ax.boxplot([data[i] for i in keep], positions=layers[keep], widths=0.6, showfliers=True,
                       flierprops={"markersize": 2.5}, medianprops={"color": "tab:red"})
        elif keep:
            ax.violinplot([data[i] for i in keep], positions=layers[keep], widths=0.8, showmedians=True)
        means = [float(np.mean(d)) if d.size else np.nan for d in data]
        ax.plot(layers, means, "o-", color="tab:blue", ms=3, lw=1, label="mean over heads")
        step = max(1, -(-n_layers // 16))
        ax.set_xticks(layers[::step])
        ax.set_xticklabels([str(i) for i in layers[::step]], fontsize=8)
        ax.set_xlim(-0.6, n_layers - 0.4)
        ax.set_xlabel("layer")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


def log_position_bins(n: int, bins: int = 48):
    """Geometric bins of the positions 0..n-1 for curves on a log position axis.

    Parameters
    ----------
    n : int
        Number of positions.
    bins : int, default 48
        At most this many bins (fewer when n is small: every position its own bin).

    Returns
    -------
    edges : ndarray of int, shape (m + 1,)
        Bin j holds positions edges[j] .. edges[j + 1] - 1; every position in one bin.
    centers : ndarray, shape (m,)
        The mean position of every bin, plus one (so position 0 sits at 1 on a log axis).

    Examples
    --------
    >>> edges, centers = ag.plotting.log_position_bins(6)
    >>> edges.tolist(), centers.tolist()
    ([0, 1, 2, 3, 4, 5, 6], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    """
    edges = np.unique(np.concatenate([[0], np.geomspace(1, n, bins).astype(int), [n]]))
    centers = np.array([(a + b - 1) / 2 + 1 for a, b in zip(edges[:-1], edges[1:])])
    return edges, centers


#: Above this many heads :func:`attention_profiles` draws one line per layer (mean and range).
PROFILE_HEAD_LINES = 24


@fill_doc
def attention_profiles(entropy, sink_weight, title="", axes=None, *, causal=True, positions=None, per_head=None):
    """Every head's attention entropy and sink mass against the query position, log position axis.

    Coloured by layer (viridis), each curve the mean within geometric position bins
    (:func:`log_position_bins`): one thin line per head for a few heads; for many (more than
    :data:`PROFILE_HEAD_LINES`, e.g. MiniLM's 72) one line per layer, the mean over its
    heads, with a band from its lowest to its highest head, so the layers stay readable. For
    a causal model the left panel shows the entropy of a uniform row over the visible keys,
    log(i + 1), dashed.

    Parameters
    ----------
    entropy : array_like, shape (n_layers, n_heads, n)
        Entropy in nats of every query's weights (``AttentionStats.entropy``).
    sink_weight : array_like, shape (n_layers, n_heads, n)
        Weight on key 0 of every query (``AttentionStats.sink_weight``).
    title : str, optional
        Figure title.
    axes : sequence of two Axes, optional
        Where to draw.
    causal : bool, default True
        Whether query i sees keys 0..i only (draws the uniform-row reference).
    positions : array_like, shape (n,), optional
        The position of every column when the values are already binned (e.g. a corpus
        profile, ``ProfileStatistic``): drawn at positions + 1, not binned again.
    per_head : bool, optional
        One line per head (True) or per layer with the heads' range as a band (False);
        default: per head up to :data:`PROFILE_HEAD_LINES` heads.

    %(figure_returns)s

    Examples
    --------
    >>> e = np.log(np.arange(1, 65))[None, None].repeat(2, 0)
    >>> fig = ag.plotting.attention_profiles(e, 1 / np.arange(1, 65)[None, None].repeat(2, 0))
    >>> len(fig.axes)
    3
    >>> many = np.log(np.arange(1, 65))[None, None].repeat(6, 0).repeat(12, 1)  # 72 heads
    >>> fig = ag.plotting.attention_profiles(many, np.exp(-many))
    >>> len(fig.axes[1].lines)  # one line per layer
    6
    """
    import matplotlib as mpl

    entropy, sink = np.asarray(entropy, float), np.asarray(sink_weight, float)
    if entropy.ndim != 3 or sink.shape != entropy.shape:
        raise ValueError(f"entropy and sink_weight must have one shape (n_layers, n_heads, n), got {entropy.shape} "
                         f"and {sink.shape}")
    L, H, n = entropy.shape
    fig, axes = panel_row(axes, 2, 4.6, height=3.4)
    if positions is not None:
        x = np.asarray(positions, float) + 1.0
        if x.shape != (n,):
            raise ValueError(f"positions must have shape ({n},), got {x.shape}")

        def binned(a):
            return a
    else:
        edges, x = log_position_bins(n)

        def binned(a):
            return np.stack([a[..., lo:hi].mean(-1) for lo, hi in zip(edges[:-1], edges[1:])], axis=-1)

    colors = mpl.colormaps["viridis"](np.linspace(0, 0.9, max(L, 1)))
    if per_head is None:
        per_head = L * H <= PROFILE_HEAD_LINES
    for ax, values, label in ((axes[0], binned(entropy), "entropy (nats)"), (axes[1], binned(sink), "weight on key 0")):
        for layer in range(L):
            if per_head:
                for head in range(H):
                    ax.plot(x, values[layer, head], color=colors[layer], lw=0.7, alpha=0.75)
            else:
                ax.fill_between(x, values[layer].min(axis=0), values[layer].max(axis=0), color=colors[layer],
                                alpha=0.15, lw=0)
                ax.plot(x, values[layer].mean(axis=0), color=colors[layer], lw=1.2)
        if not per_head:
            ax.text(0.99, 0.01, f"line: mean of a layer's {H} heads; band: their range", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=6, color="0.35")
        ax.set_xscale("log")
        ax.set_xlabel("query position + 1")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if causal:
        axes[0].plot(x, np.log(x), "k--", lw=1, label="uniform over visible keys")
        axes[0].legend(fontsize=7, loc="upper left")
    axes[1].set_ylim(-0.02, 1.02)
    fig.subplots_adjust(bottom=0.16, top=0.88, wspace=0.3)
    sm = mpl.cm.ScalarMappable(cmap=mpl.colors.ListedColormap(colors),
                               norm=mpl.colors.BoundaryNorm(np.arange(L + 1) - 0.5, L))
    bar = fig.colorbar(sm, ax=list(axes), label="layer", fraction=0.04, pad=0.02)
    bar.set_ticks(np.arange(L) if L <= 12 else np.linspace(0, L - 1, 7).round())
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
