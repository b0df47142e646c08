"""The exception and warning classes of attngeom.

Every class a call can raise or warn with is defined here (``import attngeom as ag;
ag.errors.NonFiniteOperand``). The errors subclass ValueError, so ``except ValueError`` keeps
catching them; every other bad argument raises a plain ValueError or TypeError naming it.
This module imports no other module of the package.
"""
from __future__ import annotations

__all__ = ["NonFiniteOperand", "ResultOverflow", "DamagedFile", "MissingCheckpoint", "LayoutWarning", "ContextWarning"]


class NonFiniteOperand(ValueError):
    """An operand holds NaN or inf: raised by the argument checks of every function taking
    arrays, and by the core's kernels, which find such entries in the passes they make anyway
    (the message names the operand: "q contains NaN or infinite values")."""


class ResultOverflow(ValueError):
    """A public function's result (or an intermediate operand) is beyond the float range for
    finite inputs; the message names the argument with the largest entries (rescale it)."""


class DamagedFile(ValueError):
    """A file written whole with its SHA-256 digest (the saved state of an interrupted
    training run, the saved partitions of a corpus run) is truncated or its content no longer
    matches its digest; raised when it is read back. The runs catch it, warn and recompute."""


class MissingCheckpoint(FileNotFoundError, ValueError):
    """The checkpoint named does not exist: no such file or folder, no packaged model of that
    name, and no Hugging Face snapshot of it in the local cache. A FileNotFoundError (an
    OSError) and, as before, a ValueError, so either ``except`` catches it."""


class LayoutWarning(UserWarning):
    """4-D activations that look like (batch, pos, head, d_head) were passed without a layout
    argument and are read as (batch, heads, n, d); pass ``layout="bnhd"`` for the former,
    ``layout="bhnd"`` to keep this reading without the warning."""


class ContextWarning(UserWarning):
    """A text or a sequence does not fit the model's context: it was truncated to the model's
    length (the message names that length and how many tokens were analysed), or it runs
    past the context a rotary model was trained on (config.json's max_position_embeddings),
    where its attention maps are extrapolation. Inputs beyond a position table cannot be
    represented at all and are an error instead."""
