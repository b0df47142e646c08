"""One head on one text: :func:`plot_head` (one figure) and :func:`head_view` (an interactive view).

Where the head looks (its attention pattern, queries as rows, token strings on both axes with
spaces drawn), how spread its attention is along the text (the entropy of every query's
weights against log(i + 1), the entropy of attending uniformly to the visible keys), and the
spectra of its two circuits: W_QK = W_Q W_K^T (what it matches) and W_OV = W_V W_O (what it
moves), from their factors (:func:`attngeom.factored_svd`).

:func:`head_view` is where every head looks from every token, as a self-contained HTML
component (bertviz's head view idea; the data and a small script written here inlined, no
server, nothing fetched): hover or click a token, choose a layer and a head, and the head's
weights from that token shade the text beside the query's and the head's entropy, sink weight
and mean distance. ``attngeom heads`` embeds it in report.html; in Jupyter it draws itself.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..._deprecation import renamed_field
from ..._docstrings import filler
from ..._operands import count
from ...spectral import factored_svd
from .prompt import encode_prompt, resolve_model

_fill_doc = filler(model_text="""\
    model : Model or str or path-like
        A model, or a checkpoint (:func:`attngeom.models.analysis.prompt.resolve_model`).
    text : str or array_like of int, shape (n,)
        A text (tokenized with the model's tokenizer) or token ids.""")


@_fill_doc
def plot_head(model, text, layer: int, head: int, *, axes=None):
    """Pattern, entropy profile and circuit spectra of one head on one text.

    Parameters
    ----------
    %(model_text)s
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


# -- the interactive head view ------------------------------------------------------------------
#: The window's routing is kept up to this many numbers (all heads together): about 2 MB of page.
VIEW_NUMBERS = 400_000
#: The longest window drawn by default.
VIEW_WINDOW = 256


def _b64(a: np.ndarray) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


class HeadView:
    """Where every head looks from every token: a self-contained HTML component (:func:`head_view`).

    Attributes
    ----------
    tokens : list of str
        The token strings of the whole text.
    start, stop : int
        The window [start, stop) whose routing the view holds.
    routing : ndarray, shape (n_layers, n_heads, stop - start, stop - start), float32
        P[layer, head, start + i, start + j]: every head's routing matrix from the window's
        queries to its keys (exactly ``Model.forward(...).pattern`` there); ``weights`` is its
        deprecated old name.
    outside : ndarray, shape (n_layers, n_heads, stop - start), float32
        Each window query's weight on keys outside the window (keys before ``start``, and for a
        bidirectional model after ``stop``).
    stats : dict
        {"entropy", "sink_weight", "mean_distance"}: (n_layers, n_heads, stop - start) per query of
        the window, from the streaming statistics of the pass over the whole text.
    means : dict
        The same statistics averaged over every query of the whole text, (n_layers, n_heads).
    causal : bool
        Whether the model is causal (queries see earlier keys only).
    title : str
        What the view shows (model and text length).
    """

    weights = renamed_field("routing")

    def __init__(self, tokens, start, stop, routing, outside, stats, means, causal, title):
        self.tokens, self.start, self.stop = list(tokens), int(start), int(stop)
        self.routing, self.outside, self.stats, self.means = routing, outside, stats, means
        self.causal, self.title = bool(causal), str(title)

    def __repr__(self) -> str:
        L, H = self.routing.shape[:2]
        return (f"HeadView({L} layers x {H} heads, {len(self.tokens)} tokens, routing of tokens "
                f"{self.start}..{self.stop - 1}; _repr_html_ draws it, save(path) writes a page)")

    def data(self) -> dict:
        """The view's data as the page reads it (float32 arrays base64-encoded, little-endian)."""
        L, H, w = self.routing.shape[:3]
        if self.causal:  # the lower triangle, row by row
            rows = np.concatenate([self.routing[:, :, i, :i + 1] for i in range(w)], axis=-1)
        else:
            rows = self.routing.reshape(L, H, w * w)
        return {"tokens": self.tokens[self.start:self.stop], "n": len(self.tokens), "start": self.start,
                "layers": L, "heads": H, "causal": self.causal, "title": self.title, "routing": _b64(rows),
                "outside": _b64(self.outside), **{f"q_{k}": _b64(v) for k, v in self.stats.items()},
                **{f"mean_{k}": np.round(np.asarray(v, float), 6).tolist() for k, v in self.means.items()}}

    def html(self, element_id: Optional[str] = None) -> str:
        """The component: a <div> and its inlined script (no server, nothing fetched)."""
        import json
        import uuid

        eid = element_id or "hv" + uuid.uuid4().hex[:10]
        payload = json.dumps(self.data(), separators=(",", ":")).replace("</", "<\\/")
        return (f"<div class='attngeom-head-view' id='{eid}'><style>{_VIEW_CSS}</style>"
                f"<script type='application/json' id='{eid}-data'>{payload}</script>"
                f"<script>{_VIEW_JS}\nattngeomHeadView('{eid}');</script></div>")

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path) -> str:
        """Write a self-contained page holding the view to ``path``; returns the path."""
        from html import escape

        from ..._durable import write_atomic

        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(self.title)}</title></head>"
                f"<body style='font-family:sans-serif;margin:1em'>{self.html()}</body></html>")
        write_atomic(path, page)
        return str(path)


@_fill_doc
def head_view(model, text, *, window=None, max_length: Optional[int] = None) -> HeadView:
    """Hover or click a token and see where every head looks from it: an interactive view.

    The idea of bertviz's head view, self-contained (the data and a small script inlined, no
    server, nothing downloaded when viewed): the text's tokens, a layer and a head to choose,
    and on hovering (or clicking, which pins it) a token the chosen head's weights from it shaded
    over the tokens (each token's weight in its ``data-w`` attribute and tooltip), beside the
    query's entropy, sink weight and mean distance and the head's means over the whole text.

    Long texts: the statistics of every query come from the streaming kernels (no (n, n)
    matrix); the routing is kept for a window of the text only, so a page of a 4,000-token text
    stays within a few MB.

    Parameters
    ----------
    %(model_text)s
    window : int or (int, int), optional
        The tokens whose routing the view holds: (start, stop), or the first `window` tokens.
        Default the first 256 tokens, fewer where all heads' routing would exceed 400,000
        numbers (about 2 MB).
    max_length : int, optional
        Keep at most this many tokens of the text.

    Returns
    -------
    HeadView
        ``_repr_html_`` draws it in Jupyter; ``save(path)`` writes a page; ``html()`` the component.

    Raises
    ------
    ValueError
        For an empty text or a window outside it.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> view = ag.models.head_view(planted_induction_model("planted"), [0, 5, 6, 7, 5, 6, 7])
    >>> view.routing.shape  # (layers, heads, queries, keys) of the window: here the whole text
    (2, 4, 7, 7)
    >>> round(float(view.routing[1, 0, 4, 2]), 3)  # the induction head, from the second 5 to the 6 after the first
    1.0
    >>> view.save("head_view.html")
    'head_view.html'
    """
    model = resolve_model(model)
    ids, tokens = encode_prompt(model, text, max_length=max_length)
    try:  # decoded strings (a byte-level BPE token reads " the", not its vocabulary entry "Ġthe")
        tokens = list(model.to_str_tokens(np.asarray(ids, dtype=np.int64)))
    except (ValueError, OSError, ImportError):  # no tokenizer files: the vocabulary entries, or the ids
        tokens = tokens if tokens is not None else [str(int(i)) for i in ids]
    ids = np.asarray(ids, dtype=np.int64)
    n, L, H = len(ids), model.arch.n_layers, model.arch.n_heads
    causal = not model.arch.bidirectional
    if window is None:
        per = VIEW_NUMBERS / (L * H)
        fit = int((np.sqrt(1 + 8 * per) - 1) / 2) if causal else int(np.sqrt(per))
        start, stop = 0, max(1, min(n, VIEW_WINDOW, fit))
    elif np.ndim(window) == 0:
        start, stop = 0, min(n, count("window", window, 1))
    else:
        if np.shape(window) != (2,):
            raise ValueError(f"window must be a token count or (start, stop), got {window!r}")
        start, stop = (count(f"window[{i}]", v, 0) for i, v in enumerate(window))
        if not 0 <= start < stop <= n:
            raise ValueError(f"window must satisfy 0 <= start < stop <= {n} (the text's tokens), got {window!r}")
    st = model.forward(ids, keep=("attention_stats",)).attention_stats  # every query, no (n, n) matrix
    names = ("entropy", "sink_weight", "mean_distance")
    full = {k: np.asarray(getattr(st, k))[:, 0] if np.ndim(getattr(st, k)) == 4 else np.asarray(getattr(st, k))
            for k in names}  # (L, H, n)
    means = {k: v.mean(-1) for k, v in full.items()}
    stats = {k: v[..., start:stop].astype(np.float32) for k, v in full.items()}
    w = stop - start
    routing = np.empty((L, H, w, w), np.float32)
    outside = np.empty((L, H, w), np.float32)
    upto = ids[:stop] if causal else ids  # a causal model's rows < stop need only the tokens < stop
    for layer in range(L) if start > 0 else [None]:  # a window inside the text: one layer at a time
        f = model.forward(upto, keep=("pattern",), layers=None if layer is None else [layer])
        P = np.asarray(f.pattern, np.float32)
        if P.ndim == 5:
            P = P[:, 0]
        rows = P[..., start:stop, :]
        sl = slice(None) if layer is None else slice(layer, layer + 1)
        routing[sl] = rows[..., start:stop]
        outside[sl] = rows.sum(-1) - rows[..., start:stop].sum(-1)
    name = getattr(model, "name", None) or model.arch.model_type
    title = f"{name}: {n} tokens" + (f", routing of tokens {start}..{stop - 1}" if (start, stop) != (0, n) else "")
    return HeadView(tokens, start, stop, routing, np.maximum(outside, 0), stats, means, causal, title)


_VIEW_CSS = """.attngeom-head-view{font-family:sans-serif;font-size:13px;display:flex;flex-wrap:wrap;gap:12px}
.attngeom-head-view .hv-text{flex:3 1 420px;max-height:420px;align-self:flex-start;overflow-y:auto;border:1px solid #ddd;padding:6px;
line-height:1.9;font-family:monospace;white-space:pre-wrap}
.attngeom-head-view .hv-tok{padding:1px 0;border-radius:2px;cursor:pointer;border-bottom:1px solid #eee}
.attngeom-head-view .hv-q{outline:2px solid #1f77b4}
.attngeom-head-view .hv-side{flex:1 1 240px;min-width:240px}
.attngeom-head-view table{border-collapse:collapse;font-size:12px}
.attngeom-head-view td{border:1px solid #ddd;padding:1px 6px;text-align:right}"""

# The page's script: decodes the float32 arrays, draws the tokens, shades the chosen head's
# weights from the hovered or pinned query. Written here; no library, nothing fetched.
_VIEW_JS = r"""function attngeomHeadView(id) {
  var root = document.getElementById(id), d = JSON.parse(document.getElementById(id + "-data").textContent);
  function f32(s) { var b = atob(s), u = new Uint8Array(b.length); for (var i = 0; i < b.length; i++) u[i] = b.charCodeAt(i);
    return new Float32Array(u.buffer); }
  var W = f32(d.routing), out = f32(d.outside), w = d.tokens.length, q = {};
  ["entropy", "sink_weight", "mean_distance"].forEach(function (k) { q[k] = f32(d["q_" + k]); });
  var per = d.causal ? w * (w + 1) / 2 : w * w, layer = 0, head = 0, pinned = -1, shown = -1;
  function el(tag, attrs, text) { var e = document.createElement(tag); for (var a in attrs) e.setAttribute(a, attrs[a]);
    if (text !== undefined) e.textContent = text; return e; }
  var bar = el("div", {"class": "hv-bar", style: "flex-basis:100%"});
  bar.appendChild(el("b", {}, d.title + " ")); bar.appendChild(document.createTextNode(" layer "));
  var ls = el("select", {"class": "hv-layer"}), hs = el("select", {"class": "hv-head"});
  for (var l = 0; l < d.layers; l++) ls.appendChild(el("option", {value: l}, String(l)));
  for (var h = 0; h < d.heads; h++) hs.appendChild(el("option", {value: h}, String(h)));
  bar.appendChild(ls); bar.appendChild(document.createTextNode(" head ")); bar.appendChild(hs);
  bar.appendChild(el("span", {style: "color:#666"}, "  hover a token (click pins it): shading is the head's weight from it"));
  var text = el("div", {"class": "hv-text"}), side = el("div", {"class": "hv-side"});
  root.appendChild(bar); root.appendChild(text); root.appendChild(side);
  var spans = d.tokens.map(function (t, i) {
    var s = el("span", {"class": "hv-tok", "data-i": i}, t.replace(/\n/g, "\u21b5\n"));
    s.addEventListener("mouseenter", function () { if (pinned < 0) show(i); });
    s.addEventListener("click", function () { pinned = pinned === i ? -1 : i; show(i); });
    text.appendChild(s); return s; });
  function weight(i, j) { var base = (layer * d.heads + head) * per;
    if (d.causal) return j > i ? 0 : W[base + i * (i + 1) / 2 + j]; return W[base + i * w + j]; }
  function fmt(v) { return v.toFixed(4); }
  function show(i) {
    shown = i; var k = (layer * d.heads + head) * w + i, top = [];
    spans.forEach(function (s, j) { var v = weight(i, j); s.dataset.w = String(v); s.title = "weight " + v.toPrecision(6);
      s.style.background = "rgba(214,39,40," + Math.min(1, Math.sqrt(v)).toFixed(3) + ")";
      s.classList.toggle("hv-q", j === i); if (v > 0) top.push([v, j]); });
    top.sort(function (a, b) { return b[0] - a[0]; });
    side.innerHTML = "";
    side.appendChild(el("div", {"class": "hv-head-name"}, "L" + layer + "H" + head + ", query " + (d.start + i) + " " +
      JSON.stringify(d.tokens[i])));
    var t = el("table", {}), rows = [["entropy (nats)", q.entropy[k], d.mean_entropy[layer][head]],
      ["sink weight (key 0)", q.sink_weight[k], d.mean_sink_weight[layer][head]],
      ["mean distance", q.mean_distance[k], d.mean_mean_distance[layer][head]]];
    t.appendChild(el("tr", {})).innerHTML = "<th></th><th>this query</th><th>head, all " + d.n + " tokens</th>";
    rows.forEach(function (r) { var tr = el("tr", {}); tr.appendChild(el("td", {}, r[0]));
      tr.appendChild(el("td", {"class": "hv-stat"}, fmt(r[1]))); tr.appendChild(el("td", {}, fmt(r[2]))); t.appendChild(tr); });
    side.appendChild(t);
    if (out[k] > 0) side.appendChild(el("div", {}, "weight on keys outside the shown tokens: " + fmt(out[k])));
    side.appendChild(el("div", {style: "margin-top:6px"}, "largest weights:"));
    var tt = el("table", {"class": "hv-top"});
    top.slice(0, 8).forEach(function (p) { var tr = el("tr", {}); tr.appendChild(el("td", {}, String(d.start + p[1])));
      tr.appendChild(el("td", {style: "text-align:left"}, JSON.stringify(d.tokens[p[1]])));
      tr.appendChild(el("td", {}, fmt(p[0]))); tt.appendChild(tr); });
    side.appendChild(tt);
  }
  ls.addEventListener("change", function () { layer = +ls.value; if (shown >= 0) show(shown); });
  hs.addEventListener("change", function () { head = +hs.value; if (shown >= 0) show(shown); });
  root.attngeomSelect = function (l, h, i) { layer = l; head = h; ls.value = l; hs.value = h; pinned = i; show(i); };
  show(w - 1);
}"""
