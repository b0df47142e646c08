"""Activation layouts: per-head operands in "bnhd" (..., n, heads, d) are converted to the
library's "bhnd" (..., heads, n, d) and results back; without a layout argument, operands that
look token-major give a LayoutWarning."""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from ..errors import LayoutWarning
from .validation import real_array, shape_of

#: The layouts of per-head activations: "bhnd" (..., heads, n, d), the library's, tokens are
#: the rows of each head; "bnhd" (..., n, heads, d), TransformerLens ``hook_q`` / ``hook_k`` /
#: ``hook_v`` / ``hook_z`` and Hugging Face's (batch, pos, head, d_head) before the transpose.
ACTIVATION_LAYOUTS = ("bhnd", "bnhd")

# What "bnhd" does to each kind of array, as the pair of axes it swaps with respect to "bhnd":
# "v" per-token vectors (..., n, d) per head (q, k, v, y, dy, gradients, tilts);
# "s" per-token scalars (..., n) per head (tau, log Z);
# "m" per-token matrices (..., n, d, d) per head (Hessians);
# "-" arrays over pairs of tokens (routing matrices, masks, projected coordinates): unchanged.
_SWAPS = {"v": (-3, -2), "s": (-2, -1), "m": (-4, -3)}
_KIND_SHAPES = {"v": "(..., n, heads, d)", "s": "(..., n, heads)", "m": "(..., n, heads, d, d)"}


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside the attngeom package, for warnings that should
    point at the user's line whatever the depth of decorators and internal calls."""
    import sys
    frame, level = sys._getframe(1), 1
    package = __name__.partition(".")[0]
    while frame is not None and (frame.f_globals.get("__name__", "") + ".").startswith(package + "."):
        frame, level = frame.f_back, level + 1
    return level


def looks_token_major(q_shape: tuple, *others: tuple) -> bool:
    """Whether 4-D queries (and keys, values) look like (batch, pos, head, d_head).

    The rule: q and every other operand given (k, v) have 4 axes; q's third axis is shorter
    than its second (read as "bhnd" that would be fewer tokens than heads; read as "bnhd",
    fewer heads than tokens); every other operand has q's second axis (the tokens of
    self-attention, or the heads in "bhnd") and a third axis that divides q's (its key/value
    heads: grouped-query attention, or equal). So (2, 8, 1024, 64) is not flagged and
    (1, 128, 12, 64) is; a "bhnd" batch of sequences shorter than their head count, e.g.
    (2, 12, 5, 64), is flagged too (pass layout="bhnd" to say so).
    """
    if len(q_shape) != 4 or any(len(s) != 4 for s in others):
        return False
    if not q_shape[2] < q_shape[1]:
        return False
    return all(s[1] == q_shape[1] and s[2] >= 1 and q_shape[2] % s[2] == 0 for s in others)


def to_bhnd(layout, func: str, operands: Sequence[tuple]) -> tuple:
    """Per-head activations in the library's layout: (layout, [arrays]).

    The helper every function taking q / k / v calls first (:func:`from_bhnd` restores its
    results).

    Parameters
    ----------
    layout : {None, "bhnd", "bnhd"}
        None is "bhnd", checked by :func:`looks_token_major` on the first operands of kind
        "v" (queries, keys, values): when they look like (batch, pos, head, d_head) a
        :class:`LayoutWarning` says so. An explicit "bhnd" is never checked.
    func : str
        The public function's name, for the messages.
    operands : sequence of (name, value, kind)
        kind "v", "s", "m" or "-" (see ``_SWAPS``); a None value passes through. With
        "bnhd", each array's (n, heads) axes are swapped to (heads, n) and made contiguous
        (the one copy the core makes of a non-contiguous operand anyway), so the call
        computes exactly what it computes on the same values given in "bhnd".

    Returns
    -------
    layout : str
        "bhnd" or "bnhd", for :func:`from_bhnd`.
    arrays : list
        The operands in "bhnd" (unchanged for "bhnd").

    Raises
    ------
    ValueError
        Naming ``layout`` for a value other than the two, and naming the operand when a
        "bnhd" operand has too few axes to hold both n and heads.
    """
    if layout is not None and (not isinstance(layout, str) or layout not in ACTIVATION_LAYOUTS):
        raise ValueError(f"{func}: layout must be 'bhnd' (..., heads, n, d) or 'bnhd' (..., n, heads, d), "
                         f"got {layout!r}")
    if layout is None:
        shapes = [shape_of(name, x) for name, x, kind in operands if kind == "v" and x is not None][:3]
        if shapes and looks_token_major(*shapes):
            name = next(n for n, x, kind in operands if kind == "v" and x is not None)
            warnings.warn(f"{func}: {name} has shape {shapes[0]}, which looks like (batch, pos, head, d_head) "
                          f"(TransformerLens hook_q, Hugging Face before the transpose) but is read as "
                          f"(batch, heads, n, d); pass layout='bnhd' for the former, layout='bhnd' to keep "
                          f"this reading without the warning", LayoutWarning, stacklevel=_caller_stacklevel())
        layout = "bhnd"
    if layout == "bhnd":
        return layout, [x for _, x, _ in operands]
    out = []
    for name, x, kind in operands:
        if x is None or kind == "-":
            out.append(x)
            continue
        a = real_array(name, x)
        axes = _SWAPS[kind]
        if a.ndim < -axes[0]:
            raise ValueError(f"{func}: with layout='bnhd', {name} must have shape {_KIND_SHAPES[kind]} "
                             f"(at least {-axes[0]} dimensions), got {a.shape}")
        out.append(np.ascontiguousarray(np.swapaxes(a, *axes)))  # the copy the core would make anyway
    return layout, out


def from_bhnd(layout: str, result, kinds: str):
    """A result of a function that took per-head activations, back in the caller's `layout`.

    result : an array (``kinds`` one letter), or a tuple / named tuple with one letter of
    ``kinds`` per item ("v", "s", "m", "-" as in :func:`to_bhnd`; None items pass through).
    "bnhd" results are views of the computed "bhnd" arrays with the axes swapped.
    """
    if layout == "bhnd":
        return result

    def swap(a, kind):
        return a if a is None or kind == "-" else np.swapaxes(a, *_SWAPS[kind])

    if isinstance(result, tuple):
        items = [swap(a, kind) for a, kind in zip(result, kinds)]
        return type(result)(*items) if hasattr(result, "_fields") else tuple(items)
    return swap(result, kinds)


def attention_kinds(return_weights: bool, return_log_partition: bool) -> str:
    """The kinds (for :func:`from_bhnd`) of an attention call's result (y, [P], [log Z])."""
    return "v" + ("-" if return_weights else "") + ("s" if return_log_partition else "")
