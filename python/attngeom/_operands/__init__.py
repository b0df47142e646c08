"""The private operand layer: how arguments become checked operands of the C++ core.

Every public module checks its arguments here, so that every error names the argument, the
expected shape and the one received (docs/architecture.md, "The operand contract"), in one wording:

* :mod:`.validation`: :func:`operand` turns an array argument into a real ndarray in one
  pass: real -> number of axes -> non-empty -> finite -> computation dtype. The
  expected-shape string, e.g. ``"(..., n_q, d_k)"``, is both the message and the rule for the
  number of axes. :func:`scalar`, :func:`count`, :func:`choice`, :func:`flag`,
  :func:`rtol_arg`, :func:`causal_code` and the others check scalar arguments;
  :func:`cotangent` checks a cotangent or saved forward output of a backward pass.
* :mod:`.broadcast`: :class:`AttentionOperands` checks and broadcasts the (q, k, v, tau,
  mask) operands of one attention-like call; its ``cotangent``, ``saved`` and ``gradients``
  serve the backward passes, with :func:`reduce_to_shape` (a gradient summed back over
  broadcast axes).
* :mod:`.float_range`: :func:`check_bound` refuses inputs that may overflow, and
  :func:`finite_result` turns a result beyond the float range into :class:`ResultOverflow`.
* :mod:`.layouts`: :func:`to_bhnd` and :func:`from_bhnd` are the activation layouts: every
  function taking per-head q / k / v converts "bnhd" (..., n, heads, d) operands to the
  library's "bhnd" (..., heads, n, d) with the first and its results back with the second;
  without a layout argument :func:`looks_token_major` decides whether to warn
  (:class:`LayoutWarning`).

The exception classes live in the public :mod:`attngeom.errors`. Conventions (see the package
docstring): tokens are rows, the last one or two axes are the core axes, every leading axis
is a batch axis that broadcasts like NumPy. The core works on contiguous (blocks, rows, cols)
stacks; broadcasting reaches it as an index array mapping each flat batch position to the
operand's own block, so no operand is copied to broadcast it. An operand is copied once only
when it is not C-contiguous or not of the computation dtype.
"""
from ..errors import LayoutWarning, NonFiniteOperand, ResultOverflow
from .broadcast import AttentionOperands, Operand, batch_operands, broadcast_batch, reduce_to_shape
from .float_range import check_bound, finite_result, max_row_norm
from .layouts import ACTIVATION_LAYOUTS, attention_kinds, from_bhnd, looks_token_major, to_bhnd
from .validation import (COMPUTE, MAX_ARRAY_BYTES, as_array, causal_code, check_finite, check_min_ndim, check_nonempty,
                         check_shared_width, check_size, check_token_ids, choice, compute_dtype, cotangent, count, flag,
                         float_dtype, generator, logit_scale, operand, query_key_value, real_array, rtol_arg, scalar,
                         sequence, uniform_grid)
