"""Docstring text shared by several public functions, filled in at import time.

A docstring names a fragment on a line of its own, ``%(name)s``, indented where the fragment's
text belongs (the placeholder syntax of SciPy's ``doccer``). :func:`filler` returns a
decorator that replaces each such line by the fragment, every line indented alike, so
``help()``, numpydoc, the doctests and Sphinx all read the complete docstring. Only whole-line
placeholders are filled; any other ``%`` in a docstring is left as it is, and a placeholder
that names no fragment raises KeyError when the module is imported.

:data:`FRAGMENTS` holds the text several modules share. A fragment used by one module only is
defined there and passed to :func:`filler` (``_fill_doc = filler(widths=...)`` in
attngeom.dimension). A fragment named ``*_returns`` or ``*_parameters`` is a whole section,
header included, for functions whose section is that text and nothing else.
"""
from __future__ import annotations

import re
import textwrap
from typing import Callable, Mapping

FRAGMENTS = {
    # operands of the attention functions (docs/architecture.md, "Conventions": tokens are rows)
    "q_k": """\
        q : array_like, shape (..., n_q, d_k)
            Queries.
        k : array_like, shape (..., n_k, d_k)
            Keys.""",
    "q_k_v": """\
        q : array_like, shape (..., n_q, d_k)
            Queries.
        k : array_like, shape (..., n_k, d_k)
            Keys.
        v : array_like, shape (..., n_k, d_v)
            Values; leading axes broadcast.""",
    "dy": """\
        dy : array_like, shape (..., n_q, d_v)
            Cotangent of the output, in the forward output's (broadcast) shape.""",
    "backward_layout": """\
        layout : {None, "bhnd", "bnhd"}, optional
            As given to the forward: with "bnhd", q, k, v, dy and dq, dk, dv are (..., n, heads, d).""",
    "grads_returns": """\
        Returns
        -------
        AttentionGrads
            (dq, dk, dv) with the shapes of q, k, v, broadcast axes summed, in the forward's
            dtype; wrong or non-finite cotangents raise ValueError, as for
            :func:`softmax_attention_backward`.""",
    # deep networks of lightning (or softmax-normalised) layers, Henry-Marchetti-Kohn
    "network_kind": """\
        kind : {"lightning", "softmax"}, default "lightning"
            Unnormalised (lightning, eq. 1) or softmax-normalised layers (eq. 16).
        temperature : float, default 1.0
            Softmax temperature (kind "softmax" only).""",
    # figures (attngeom.plotting and the plot methods of results)
    "ax": """\
        ax : matplotlib.axes.Axes, optional
            Axes to draw into.""",
    "figure_returns": """\
        Returns
        -------
        matplotlib.figure.Figure
            The figure.""",
}

_PLACEHOLDER = re.compile(r"^([ \t]*)%\((\w+)\)s[ \t]*$", re.MULTILINE)


def fill(doc: str, fragments: Mapping[str, str]) -> str:
    """`doc` with every whole-line ``%(name)s`` replaced by ``fragments[name]``, indented alike."""
    def expand(match):
        indent, name = match.groups()
        if name not in fragments:
            raise KeyError(f"docstring fragment %({name})s is not defined")
        text = textwrap.dedent(fragments[name])
        return "\n".join(indent + line if line.strip() else "" for line in text.splitlines())
    return _PLACEHOLDER.sub(expand, doc)


def filler(**own: str) -> Callable:
    """A decorator filling the shared :data:`FRAGMENTS` and a module's `own` into ``__doc__``.

    It returns the function or class it decorates; place it below decorators that copy
    ``__doc__`` (``functools.wraps``), so that they copy the filled text.
    """
    clash = set(own) & set(FRAGMENTS)
    if clash:
        raise ValueError(f"fragments {sorted(clash)} are already shared ones")
    table = {**FRAGMENTS, **own}

    def decorate(obj):
        if obj.__doc__:  # None under python -OO
            obj.__doc__ = fill(obj.__doc__, table)
        return obj
    return decorate


fill_doc = filler()
