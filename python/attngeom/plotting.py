"""Matplotlib figures (matplotlib is imported lazily: ``pip install attngeom[plot]``).

Every function takes an optional ``ax`` (or ``axes``) and returns the figure.
"""
from __future__ import annotations

import numpy as np


def _plt():
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


def _subplots(nrows=1, ncols=1, *, figsize=None, **kw):
    """A new Figure and its axes. Outside Jupyter the figure is built outside pyplot's
    registry (no global state is left behind, nothing needs closing); under Jupyter's inline
    backend it goes through pyplot so it is shown at the end of the cell, and the backend
    closes it after showing it."""
    plt = _plt()
    import matplotlib

    if "inline" in matplotlib.get_backend().lower():
        return plt.subplots(nrows, ncols, figsize=figsize, **kw)
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def _row(axes, n, width, height=3.2, **kw):
    """(figure, list of n axes): a new row of n panels, each `width` inches wide, or the
    figure of the given axes."""
    if axes is None:
        fig, grid = _subplots(1, n, figsize=(width * n, height), squeeze=False, **kw)
        return fig, list(grid[0])
    return axes[0].figure, list(axes)


def _finish_curves(ax, xlabel, ylabel, xscale, yscale, n_curves):
    """Scales, labels and (for several curves) the legend of a curve panel."""
    ax.set_xscale(xscale)
    ax.set_yscale(yscale)
    if xscale == "log":  # no labels on minor ticks: they collide over a short decade range
        from matplotlib.ticker import NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if n_curves > 1:
        ax.legend(frameon=False, fontsize=8)


def _axes(ax, **fig_kw):
    if ax is None:
        return _subplots(**fig_kw)
    return ax.figure, ax


def identity_errors(rel_error, ax=None):
    """Bar chart of per-head relative errors of an identity, with float64 epsilon marked."""
    fig, ax = _axes(ax, figsize=(5, 3))
    heads = np.arange(len(rel_error))
    ax.bar(heads, np.maximum(rel_error, 1e-18), color="tab:blue")
    ax.axhline(np.finfo(np.float64).eps, color="k", ls="--", lw=1, label="float64 eps")
    ax.set_yscale("log")
    ax.set_xlabel("head")
    ax.set_ylabel("relative error")
    ax.set_title("Laplace-Radon identity: N/Z vs softmax")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def radius_histogram(tau, ax=None):
    """Histogram of Laplace radii tau."""
    fig, ax = _axes(ax, figsize=(5, 3))
    ax.hist(np.ravel(tau), bins=60, color="tab:orange", alpha=0.85)
    ax.set_xlabel(r"radius $\tau = |q| / \sqrt{d_k}$")
    ax.set_ylabel("queries")
    ax.set_title("Laplace radii")
    fig.tight_layout()
    return fig


def transform_panels(projection, tau_query, tau_grid, log_Z, omega, Z_imag, axes=None):
    """Three panels for one query: the Radon projection s = u.k of the keys (a stem plot of
    the discrete measure), log Z(u, tau) on real tau (the CGF, the query's own tau marked),
    and |Z(u, i w)|, the modulus of the characteristic function."""
    fig, axes = _row(axes, 3, 4.0)
    ax = axes[0]
    ax.stem(projection, np.ones_like(projection), basefmt=" ")
    ax.set_xlabel(r"$s = u \cdot k$")
    ax.set_yticks([])
    ax.set_title(r"Radon projection $(\mathcal{R}\mu)(u, s)$")
    ax = axes[1]
    ax.plot(tau_grid, log_Z)
    ax.axvline(tau_query, color="k", ls=":", lw=1, label=r"query's $\tau$")
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel(r"$\log Z(u, \tau)$")
    ax.set_title("Laplace transform (CGF)")
    ax.legend(frameon=False)
    ax = axes[2]
    ax.plot(omega, np.abs(Z_imag))
    ax.set_xlabel(r"$\omega$")
    ax.set_ylabel(r"$|Z(u, i\omega)|$")
    ax.set_title("characteristic function")
    fig.tight_layout()
    return fig


def _log_floor(values):
    """Values below (max * 1e-17) drawn at that floor, so exact zeros do not stretch a log axis."""
    values = np.asarray(values, dtype=float)
    top = float(values.max()) if values.size else 1.0
    floor = top * 1e-17 if top > 0 else np.finfo(float).tiny
    return np.maximum(values, floor), floor


def head_spectra(spectra, title="", ax=None):
    """Singular values of many heads, one line each, log scale: (n_heads, k) array."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    spectra = np.atleast_2d(np.asarray(spectra, dtype=float))
    idx = np.arange(1, spectra.shape[1] + 1)
    shown, _ = _log_floor(spectra)
    for s in shown:
        ax.plot(idx, s, lw=1, alpha=0.6 if len(spectra) > 1 else 1)
    ax.set_yscale("log")
    ax.set_xlabel("index i")
    ax.set_ylabel(r"$\sigma_i$")
    ax.set_title(f"singular values of {title}" if title else "singular values")
    fig.tight_layout()
    return fig


def head_map(values, metric, ax=None):
    """A (layer, head) heat map of one per-head quantity."""
    fig, ax = _axes(ax, figsize=(1.2 + 0.45 * values.shape[1], 1.0 + 0.4 * values.shape[0]))
    im = ax.imshow(values, cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(metric)
    fig.tight_layout()
    return fig


def spectrum_with_energy(s, ax=None, label=""):
    """Eigenvalue or singular-value spectrum (log scale) with its cumulative energy E_k."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    s = np.sort(np.asarray(s, dtype=float))[::-1]
    idx = np.arange(1, s.size + 1)
    shown, floor = _log_floor(s)
    ax.semilogy(idx, shown, "o-", ms=3, label=label or "spectrum")
    if np.any(s < floor):
        ax.annotate("zeros at 1e-17 of max", (idx[s < floor][0], floor), fontsize=8, va="bottom")
    ax.set_xlabel("index")
    ax.set_ylabel("value")
    twin = ax.twinx()
    e = np.cumsum(s * s)
    twin.plot(idx, e / e[-1] if e[-1] > 0 else e, color="tab:red", lw=1)
    twin.set_ylabel(r"cumulative energy $E_k$", color="tab:red")
    twin.set_ylim(0, 1.02)
    fig.tight_layout()
    return fig


def scatter_identity(y, y_hat, rel_error, ax=None):
    """Y against its reconstruction, with the diagonal and the relative error."""
    fig, ax = _axes(ax, figsize=(4, 4))
    idx = np.random.default_rng(0).permutation(len(y))[:20000]
    ax.plot(y[idx], y_hat[idx], ".", ms=1.5, alpha=0.4)
    lim = [float(min(y.min(), y_hat.min())), float(max(y.max(), y_hat.max()))]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set_xlabel("Y (softmax attention)")
    ax.set_ylabel(r"$\hat Y$ (Laplace-Radon)")
    ax.set_title(f"relative error {rel_error:.2e}")
    fig.tight_layout()
    return fig


def radius_vs_chi(tau, d_k, var_q, ax=None):
    """Density of tau = |q| / sqrt(d_k) against sqrt(var_q / d_k) chi(d_k)."""
    from math import lgamma, log

    fig, ax = _axes(ax, figsize=(5, 3.2))
    ax.hist(tau, bins=60, density=True, alpha=0.6, label="empirical")
    c = np.sqrt(var_q / d_k)
    t = np.linspace(max(tau.min() * 0.8, 1e-6), tau.max() * 1.2, 400)
    z = t / c
    logpdf = (d_k - 1) * np.log(z) - z * z / 2 - (d_k / 2 - 1) * log(2) - lgamma(d_k / 2)
    ax.plot(t, np.exp(logpdf) / c, "k--", label=r"scaled $\chi_{d_k}$ prediction")
    ax.set_xlabel(r"$\tau$")
    ax.set_ylabel("density")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def two_histograms(a, label_a, b, label_b, axes=None):
    """Two histograms side by side."""
    fig, axes = _row(axes, 2, 4.0, 3.0)
    for ax, data, label in ((axes[0], a, label_a), (axes[1], b, label_b)):
        ax.hist(data, bins=60, alpha=0.8)
        ax.set_xlabel(label)
    axes[0].set_ylabel("count")
    fig.tight_layout()
    return fig


def logits_vs_gaussian(logits, std, ax=None):
    """Empirical logit density against N(0, std^2)."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    ax.hist(logits, bins=100, density=True, alpha=0.6, label="empirical logits")
    t = np.linspace(logits.min(), logits.max(), 400)
    ax.plot(t, np.exp(-t * t / (2 * std * std)) / (std * np.sqrt(2 * np.pi)), "k--", label="Gaussian mean field")
    ax.set_xlabel(r"$\ell = q \cdot k / \sqrt{d_k}$")
    ax.set_ylabel("density")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def eigen_spectrum(values, title, ax=None, ylabel="eigenvalue"):
    """A descending spectrum on a log scale."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    shown, _ = _log_floor(np.sort(np.asarray(values, dtype=float))[::-1])
    ax.semilogy(np.arange(1, shown.size + 1), shown, "o-", ms=3)
    ax.set_xlabel("index")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def sweep(x, curves, ylabel, ax=None, xlabel=r"logit scale $\alpha$"):
    """Curves against a log-scaled parameter: {label: values}; the first is drawn solid."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    for i, (label, values) in enumerate(curves.items()):
        ax.semilogx(x, values, "-" if i == 0 else "--", marker="o" if i == 0 else None, ms=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def layer_head_grids(maps, axes=None):
    """(layer, head) grids of per-head metrics, two to a row, each cell annotated with its value.

    maps : {title: (n_layers, n_heads) array}. Returns the figure.
    """
    maps = {k: np.atleast_2d(np.asarray(v, dtype=float)) for k, v in maps.items()}
    n_layers, n_heads = next(iter(maps.values())).shape
    if axes is None:
        w, h = 1.6 + 0.42 * n_heads, 1.0 + 0.36 * n_layers
        ncols = min(2, len(maps))
        nrows = -(-len(maps) // ncols)
        fig, grid = _subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
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


def head_spectrum_pair(bilinear, ov, title="", axes=None):
    """One head's singular values of B = W_Q W_K^T and of W_OV (log scale), each with its
    cumulative energy E_k on a second axis. bilinear : (k,), ov : (k,) or None."""
    panels = [(r"$B = W_Q W_K^\top$", bilinear)] + ([(r"$W_{OV}$", ov)] if ov is not None else [])
    fig, axes = _row(axes, len(panels), 4.6)
    for ax, (name, s) in zip(axes, panels):
        s = np.sort(np.asarray(s, dtype=float))[::-1]
        idx = np.arange(1, s.size + 1)
        shown, _ = _log_floor(s)
        ax.semilogy(idx, shown, "o-", ms=2.5)
        ax.set_xlabel("index i")
        ax.set_ylabel(r"$\sigma_i$")
        ax.set_title(f"{title} {name}".strip(), fontsize=9)
        twin = ax.twinx()
        e = np.cumsum(s * s)
        twin.plot(idx, e / e[-1] if e[-1] > 0 else e, color="tab:red", lw=1)
        twin.set_ylim(0, 1.02)
        twin.set_ylabel(r"$E_k$", color="tab:red")
    fig.tight_layout()
    return fig


def attention_heatmap(P, tokens=None, title="", ax=None):
    """An attention (routing) matrix P (n, n) as a heat map, queries as rows; token strings
    label the axes when given and n <= 48."""
    P = np.asarray(P, dtype=float)
    n = P.shape[0]
    size = min(9.0, 2.5 + 0.16 * n)
    fig, ax = _axes(ax, figsize=(size + 0.8, size))
    im = ax.imshow(P, cmap="magma", vmin=0, vmax=max(float(P.max()), 1e-12), interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.8, label="weight")
    if tokens is not None and n <= 48:
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(tokens, rotation=90, fontsize=6)
        ax.set_yticklabels(tokens, fontsize=6)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def curve_panels(x, panels, xlabel, *, xscale="log", axes=None, title=None):
    """Side-by-side panels of curves against one parameter x (n,).

    panels : list of (ylabel, {label: (n,) values}, yscale) with yscale "linear" or "log";
    in each panel the first curve is drawn solid with markers, the others dashed. NaN values
    leave gaps (e.g. where a model does not exist). Returns the figure.
    """
    fig, axes = _row(axes, len(panels), 4.3)
    x = np.asarray(x, dtype=float)
    for ax, (ylabel, curves, yscale) in zip(axes, panels):
        for i, (label, values) in enumerate(curves.items()):
            ax.plot(x, np.asarray(values, dtype=float), "-" if i == 0 else "--", marker="o" if i == 0 else ".",
                    ms=3, label=label)
        _finish_curves(ax, xlabel, ylabel, xscale, yscale, len(curves))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def identity_scatter(a, b, rel_error, xlabel, ylabel, ax=None):
    """Two computations of the same quantity, (n,) each, against each other with the diagonal."""
    fig, ax = _axes(ax, figsize=(4, 4))
    a, b = np.ravel(a), np.ravel(b)
    idx = np.random.default_rng(0).permutation(a.size)[:20000]
    ax.plot(a[idx], b[idx], ".", ms=1.5, alpha=0.4)
    lim = [float(min(a.min(), b.min())), float(max(a.max(), b.max()))]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"relative error {rel_error:.2e}")
    fig.tight_layout()
    return fig


def flattening_panels(before, after, off_plane, axes=None):
    """Local dimension of a token cloud under repeated layers (Sanger's "flattening").

    before : (n,) local dimension of each point's neighbourhood; after : (n_layers, n) the
    same neighbourhoods after 1..n_layers layers; off_plane : (n_layers + 1,) the fraction of
    the cloud's variance off its plane, before and after each layer. Left: histograms of the
    local dimension before, after one layer and after the last; right: the means and the
    off-plane fraction against the number of layers.
    """
    fig, axes = _row(axes, 2, 4.5)
    after = np.atleast_2d(after)
    n_layers = after.shape[0]
    ax = axes[0]
    bins = np.linspace(min(before.min(), after.min()), max(before.max(), after.max()), 40)
    ax.hist(before, bins=bins, alpha=0.6, label="before")
    ax.hist(after[0], bins=bins, alpha=0.6, label="after 1 layer")
    if n_layers > 1:
        ax.hist(after[-1], bins=bins, alpha=0.6, label=f"after {n_layers} layers")
    ax.set_xlabel("local dimension (participation ratio)")
    ax.set_ylabel("points")
    ax.legend(frameon=False, fontsize=8)
    ax = axes[1]
    layers = np.arange(n_layers + 1)
    ax.plot(layers, np.concatenate([[before.mean()], after.mean(1)]), "o-", label="mean local dimension")
    ax.set_xlabel("layers")
    ax.set_ylabel("mean local dimension")
    twin = ax.twinx()
    twin.semilogy(layers, off_plane, "s--", color="tab:red", ms=4)
    twin.set_ylabel("variance fraction off the plane", color="tab:red")
    ax.set_xticks(layers)
    fig.tight_layout()
    return fig


def cloud_views(views, xlabel, ylabel, axes=None):
    """Scatter plots of 2-d views of point clouds side by side: {title: (n, 2) array}, one
    panel each, sharing the axis limits."""
    fig, axes = _row(axes, len(views), 3.3, sharex=True, sharey=True)
    for ax, (title, pts) in zip(axes, views.items()):
        ax.plot(pts[:, 0], pts[:, 1], ".", ms=3, alpha=0.6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    fig.tight_layout()
    return fig


def grouped_bars(groups, series, ylabel, ax=None, title=None):
    """Grouped bar chart: groups (g,) labels, series {name: (g,) values}."""
    fig, ax = _axes(ax, figsize=(5, 3.2))
    x = np.arange(len(groups))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def band_panels(x, panels, xlabel, *, xscale="linear", axes=None, title=None):
    """Side-by-side panels of repeated measurements against one parameter x (n,).

    panels : list of (ylabel, {label: values}, yscale). A (n, draws) array is drawn as its
    median over the draws (solid, markers) inside the band between its smallest and largest
    draw; a (n,) array as a dashed reference line. On a log y axis values are drawn no lower
    than 1e-17 (exact zeros, e.g. a recovery exact to the last bit, sit on that floor).
    Returns the figure.
    """
    fig, axes = _row(axes, len(panels), 4.6, 3.3)
    x = np.asarray(x, dtype=float)
    for ax, (ylabel, curves, yscale) in zip(axes, panels):
        for label, values in curves.items():
            values = np.asarray(values, dtype=float)
            if yscale == "log":
                values = np.maximum(values, 1e-17)
            if values.ndim == 2:
                line, = ax.plot(x, np.median(values, axis=1), "o-", ms=3, label=label)
                ax.fill_between(x, values.min(axis=1), values.max(axis=1), color=line.get_color(), alpha=0.2, lw=0)
            else:
                ax.plot(x, values, "k--" if len(curves) > 1 else "-", lw=1, label=label)
        _finish_curves(ax, xlabel, ylabel, xscale, yscale, len(curves))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def density_overlays(panels, axes=None):
    """Recovered against true densities, one panel each.

    panels : list of (title, s (G,), truth (G,), {label: (G,) recovered density}); the truth
    is drawn black, the recoveries over it. Returns the figure.
    """
    fig, axes = _row(axes, len(panels), 4.3)
    for ax, (title, s, truth, recovered) in zip(axes, panels):
        ax.plot(s, truth, "k-", lw=2, alpha=0.5, label="true")
        for i, (label, p) in enumerate(recovered.items()):
            ax.plot(s, p, "-" if i == 0 else "--", lw=1.2, label=label)
        ax.set_xlabel("$s$")
        ax.set_ylabel("density")
        ax.set_title(title, fontsize=9)
        ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


def point_recovery(truth, found, errors, axes=None, title=None):
    """Points recovered from their projections: a 2-d cloud and the errors of several cases.

    truth, found : (n, 2) the true and the recovered points of one planar cloud (drawn as
    circles and crosses); errors : {case label: largest point error}, drawn as bars on a log
    scale (exact zeros at 1e-17). Returns the figure.
    """
    fig, axes = _row(axes, 2, 4.75, 3.6, gridspec_kw={"width_ratios": [1, 1.3]})
    ax = axes[0]
    truth, found = np.asarray(truth, dtype=float), np.asarray(found, dtype=float)
    ax.plot(truth[:, 0], truth[:, 1], "o", mfc="none", ms=5, alpha=0.7, label="true")
    ax.plot(found[:, 0], found[:, 1], "x", ms=4, color="tab:red", label="recovered")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.legend(frameon=False, fontsize=8)
    ax = axes[1]
    labels = list(errors)
    ax.bar(np.arange(len(labels)), np.maximum(np.asarray([errors[k] for k in labels], dtype=float), 1e-17))
    ax.set_xticks(np.arange(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("largest point error")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def image_grid(rows, axes=None, cmap="gray", title=None):
    """A grid of images: rows is a list of rows, each a list of (title, image (M, N), vrange)
    with vrange a (vmin, vmax) pair or None (the image's own range). Ticks are hidden.
    Returns the figure."""
    nrows, ncols = len(rows), max(len(r) for r in rows)
    if axes is None:
        fig, grid = _subplots(nrows, ncols, figsize=(2.3 * ncols, 2.6 * nrows), squeeze=False)
    else:
        grid = np.asarray(axes, dtype=object).reshape(nrows, ncols)
        fig = grid[0, 0].figure
    for i, row in enumerate(rows):
        for j in range(ncols):
            ax = grid[i, j]
            if j >= len(row):
                ax.set_visible(False)
                continue
            name, img, vrange = row[j]
            vmin, vmax = vrange if vrange is not None else (None, None)
            ax.imshow(img, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto" if img.shape[0] != img.shape[1] else "equal",
                      interpolation="nearest")
            ax.set_title(name, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
