"""Circuits: heads as tensor products, virtual heads, composition scores, residual paths,
the layer-norm Jacobian, the MoE router, latent (MLA) factorisation, MLP key-value writes.

Source: the lecture notes "linear algebra applications for transformers" (cited by the
notes' headings). Conventions: tokens are rows, X (n, d_model). A head with attention
(routing) matrix P (n, n) and OV matrix W_OV maps X to P X W_OV, where W_OV is always the
library's row-convention map x -> x W_V W_O (d_model x d_model; docs/architecture.md, "Glossary").
The notes and transformer-circuits write the column-convention matrix W_O W_V acting on
column vectors, which is W_OV^T: their (A (x) W_OV) X is our P X W_OV. Stacked head weights
use TransformerLens's row convention and layout: W_Q, W_K, W_V (n_layers, n_heads,
d_model, d_head), W_O (n_layers, n_heads, d_head, d_model), so W_OV = W_V @ W_O and
QK is W_Q W_K^T; d_model x d_model products are never formed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import numpy as np

from ._deprecation import renamed_arguments, renamed_attributes, renamed_values
from ._operands import broadcast_batch, check_size, choice, count, finite_result, operand, scalar
from .activation_functions import gelu_tanh, relu, silu
from .subspace import Subspace


# -- heads as tensor products --------------------------------------------------------------
def _product(*factors):
    """The checked factors (name, array, expected shape) of a matrix product, in product
    order: each factor's rows must match the columns of the one before it."""
    arrays = [operand(name, a, expected) for name, a, expected in factors]
    for (left, _, _), a, (right, _, expected), b in zip(factors, arrays, factors[1:], arrays[1:]):
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"{right} must have shape {expected} with {a.shape[-1]} rows (the columns of {left} "
                             f"{a.shape}), got {b.shape}")
    broadcast_batch([(name, a, 2) for (name, _, _), a in zip(factors, arrays)])
    return arrays


@renamed_arguments(P="routing")
@finite_result
def head_operator(routing, W_OV, X):
    """P X W_OV: a head with frozen routing P applied to tokens X.

    The notes' "single-head attention as a tensor product" (A (x) W_OV^T) X, in the row
    convention. The old keyword ``P`` is deprecated (use ``routing``).

    Parameters
    ----------
    routing : array_like, shape (..., n, n_k)
        The attention matrix P.
    W_OV : array_like, shape (..., d_model, d_out)
        The row-convention OV map x -> x W_OV (for TransformerLens weights W_OV = W_V @ W_O;
        the notes' column matrix W_O W_V is its transpose).
    X : array_like, shape (..., n_k, d_model)
        Tokens.

    Returns
    -------
    ndarray, shape (..., n, d_out)
        P X W_OV.

    Examples
    --------
    >>> P = np.array([[1.0, 0.0], [0.5, 0.5]])
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> ag.head_operator(P, 2 * np.eye(2), X)
    array([[2., 0.],
           [1., 1.]])
    """
    P, X, W = _product(("routing", routing, "(..., n, n_k)"), ("X", X, "(..., n_k, d_model)"),
                       ("W_OV", W_OV, "(..., d_model, d_out)"))
    return P @ X @ W


@renamed_arguments(P1="routing1", P2="routing2")
@finite_result
def virtual_head(routing1, W_OV1, routing2, W_OV2):
    """The virtual head of head 1 followed by head 2: (P2 P1, W_OV1 W_OV2).

    Row convention: head 1 maps X to P1 X W_OV1, head 2 maps that to P2 P1 X W_OV1 W_OV2,
    so applying the two heads in sequence equals applying the virtual head once (the
    mixed-product property of the notes' "virtual heads"). The old keywords ``P1``, ``P2``
    are deprecated (use ``routing1``, ``routing2``).

    Parameters
    ----------
    routing1 : array_like, shape (..., n, n)
        Routing of the first head.
    W_OV1 : array_like, shape (..., d_model, d_model)
        Row-convention OV map of the first head.
    routing2 : array_like, shape (..., n, n)
        Routing of the second head.
    W_OV2 : array_like, shape (..., d_model, d_model)
        Row-convention OV map of the second head.

    Returns
    -------
    routing : ndarray, shape (..., n, n)
        P2 P1.
    W_OV : ndarray, shape (..., d_model, d_model)
        W_OV1 W_OV2.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> P1, P2 = rng.dirichlet(np.ones(3), size=(2, 3))
    >>> W1, W2, X = rng.standard_normal((3, 3, 3))
    >>> P, W = ag.virtual_head(P1, W1, P2, W2)
    >>> two_steps = ag.head_operator(P2, W2, ag.head_operator(P1, W1, X))
    >>> bool(np.allclose(ag.head_operator(P, W, X), two_steps))
    True
    """
    P2, P1 = _product(("routing2", routing2, "(..., n2, n1)"), ("routing1", routing1, "(..., n1, n0)"))
    W1, W2 = _product(("W_OV1", W_OV1, "(..., d0, d1)"), ("W_OV2", W_OV2, "(..., d1, d2)"))
    return P2 @ P1, W1 @ W2


# -- composition scores --------------------------------------------------------------------
def _r_factor(m):
    """R of the thin QR of each (..., rows, k) matrix (k x k when rows >= k)."""
    return np.linalg.qr(m, mode="r")


@finite_result
def composition_scores(W_Q, W_K, W_V, W_O, mode: str = "Q") -> np.ndarray:
    """Q-, K- or V-composition scores between every pair of heads in different layers.

    Elhage et al. / TransformerLens (the notes' "virtual heads"): score =
    ``||L R||_F / (||L||_F ||R||_F)`` with the earlier head's OV = W_V W_O on the left and the
    later head's QK = W_Q W_K^T ("Q"), QK^T ("K") or OV ("V") on the right (row convention).
    Products of d_model x d_model matrices are never formed: with thin factors L = a b and
    R = c e, ``||a (b c) e||_F = ||R_a (b c) R_e^T||_F`` for the QR factors R_a of a and R_e of
    e^T, so each pair costs O(d_head^2 d_model).

    Parameters
    ----------
    W_Q, W_K, W_V : array_like, shape (n_layers, n_heads, d_model, d_head)
        Query, key and value weights (TransformerLens layout).
    W_O : array_like, shape (n_layers, n_heads, d_head, d_model)
        Output weights.
    mode : {"Q", "K", "V"}, default "Q"
        Which composition.

    Returns
    -------
    ndarray, shape (n_layers, n_heads, n_layers, n_heads)
        scores[l1, h1, l2, h2] for head (l1, h1) writing into head (l2, h2); zero where
        l1 >= l2.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> W_Q, W_K, W_V = rng.standard_normal((3, 2, 2, 8, 4))
    >>> W_O = rng.standard_normal((2, 2, 4, 8))
    >>> S = ag.composition_scores(W_Q, W_K, W_V, W_O, "K")
    >>> S.shape, bool(np.all(S[1] == 0)), bool(np.all(S[0, :, 1] > 0))
    ((2, 2, 2, 2), True, True)
    """
    choice("mode", mode, ("Q", "K", "V"), "'Q', 'K' or 'V'")
    names = ("W_Q", "W_K", "W_V", "W_O")
    Q, K, V, O = (operand(n, w, "(n_layers, n_heads, ...)", ndim=4) for n, w in zip(names, (W_Q, W_K, W_V, W_O)))
    L, H, d_model, d_head = Q.shape
    for n, w, shape in (("W_K", K, Q.shape), ("W_V", V, (L, H, d_model, V.shape[-1])),
                        ("W_O", O, (L, H, V.shape[-1], d_model))):
        if w.shape != shape:
            raise ValueError(f"{n} must have shape {shape}, got {w.shape}")
    # Every score is a ratio in which each weight tensor appears once above and once below:
    # each is scaled to entries below 1 by a power of two first (exact), so no norm or
    # product overflows or underflows for weights of any size.
    Q, K, V, O = (np.ldexp(w, -int(np.frexp(np.max(np.abs(w)))[1])) if np.any(w) else w for w in (Q, K, V, O))
    # left = OV = a b with a = W_V, b = W_O; right = c e
    c, e_t = {"Q": (Q, K), "K": (K, Q), "V": (V, np.swapaxes(O, -1, -2))}[mode]
    R_a, R_e = _r_factor(V), _r_factor(e_t)  # (L, H, k, k)
    norm_left = np.linalg.norm(R_a @ np.swapaxes(_r_factor(np.swapaxes(O, -1, -2)), -1, -2), axis=(-2, -1))
    norm_right = np.linalg.norm(_r_factor(c) @ np.swapaxes(R_e, -1, -2), axis=(-2, -1))
    scores = np.zeros((L, H, L, H), dtype=Q.dtype)
    for l1 in range(L - 1):
        # middle[h1, l2, h2] = b_{l1,h1} c_{l2,h2}: (H, L', H, d_v, d_c)
        mid = np.einsum("hvd,mgdc->hmgvc", O[l1], c[l1 + 1:], optimize=True)
        core = R_a[l1][:, None, None] @ mid @ np.swapaxes(R_e[l1 + 1:], -1, -2)[None]
        num = np.linalg.norm(core, axis=(-2, -1))
        den = norm_left[l1][:, None, None] * norm_right[l1 + 1:][None]
        scores[l1, :, l1 + 1:] = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return scores


# -- residual path expansion ---------------------------------------------------------------
@dataclass
class PathExpansion:
    """Contributions of the residual paths of a network with frozen attention.

    Attributes
    ----------
    paths
        {path: contribution (n, d_model)}; a path is a tuple of components in order,
        each (layer, head) for an attention head or (layer, "mlp") for a frozen MLP; the
        empty tuple is the direct path (the input itself)
    forward
        the frozen-attention forward pass the paths sum to (n, d_model)
    max_length
        longest path included (None: all)
    """

    paths: Dict[tuple, np.ndarray]
    forward: np.ndarray
    max_length: Optional[int]

    def by_length(self) -> Dict[int, np.ndarray]:
        """Sum of the contributions of the paths of each length."""
        out: Dict[int, np.ndarray] = {}
        for p, c in self.paths.items():
            out[len(p)] = out.get(len(p), 0) + c
        return out

    def total(self) -> np.ndarray:
        return sum(self.paths.values())

    def norms(self) -> Dict[tuple, float]:
        """Frobenius norm of every path's contribution, largest first."""
        return dict(sorted(((p, float(np.linalg.norm(c))) for p, c in self.paths.items()), key=lambda kv: -kv[1]))


#: The most paths path_expansion holds (each an (n, d_model) array computed by one product).
MAX_PATHS = 2 ** 20


def _path_count(sizes, max_length) -> int:
    """Paths that choose at most one of sizes[i] components in each sublayer and at most
    max_length components in all (None: no bound)."""
    longest = len(sizes) if max_length is None else min(int(max_length), len(sizes))
    counts = [1] + [0] * longest  # counts[k]: paths through k components
    for c in sizes:
        for k in range(longest, 0, -1):
            counts[k] += c * counts[k - 1]
    return sum(counts)


@finite_result
def path_expansion(routing, W_OV, x, *, mlp_jacobians=None, max_length: Optional[int] = None) -> PathExpansion:
    """Expand a network with frozen attention into residual paths.

    The notes' "Proposition (Residual path expansion)". Layer l maps the residual stream r to
    r + sum_h P_{l,h} r W_OV_{l,h} and then, when a frozen MLP Jacobian J_l (d_model, d_model,
    column convention) is given, to r + r J_l^T. Every component is linear once attention is
    frozen, so the output is the sum over all ordered choices of components (at most one per
    sublayer) of their products applied to x.

    Parameters
    ----------
    routing : array_like, shape (n_layers, n_heads, n, n)
        Frozen attention matrices P_{l,h}.
    W_OV : array_like, shape (n_layers, n_heads, d_model, d_model)
        Row-convention OV maps x -> x W_OV (W_V @ W_O for TransformerLens weights).
    x : array_like, shape (n, d_model)
        The input residual stream.
    mlp_jacobians : array_like, shape (n_layers, d_model, d_model), optional
        Frozen MLP Jacobians.
    max_length : int, optional
        Keep paths through at most this many components (None: all; then the contributions
        sum to ``forward`` exactly). A network of L layers of H heads has (1 + H)^L paths
        ((1 + H)^L 2^L with MLPs): more than MAX_PATHS (2^20) paths, or paths whose arrays
        exceed the size limit, are refused (ValueError naming max_length) before any work.

    Returns
    -------
    PathExpansion
        The contribution of each path and the forward pass they sum to.

    Raises
    ------
    ResultOverflow
        A ValueError when a path's contribution or the forward pass lies beyond the float
        range of the operands' dtype (entries near the float32 or float64 maximum), even
        where the forward pass stays finite because the paths cancel: rescale x or W_OV.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> P = rng.dirichlet(np.ones(3), size=(2, 1, 3))  # 2 layers, 1 head, 3 tokens
    >>> W_OV, x = 0.1 * rng.standard_normal((2, 1, 4, 4)), rng.standard_normal((3, 4))
    >>> ex = ag.path_expansion(P, W_OV, x)
    >>> len(ex.paths), bool(np.allclose(sum(ex.paths.values()), ex.forward))
    (4, True)
    """
    P = operand("routing", routing, "(n_layers, n_heads, n, n)", ndim=4)
    W = operand("W_OV", W_OV, "(n_layers, n_heads, d_model, d_model)", ndim=4)
    X = operand("x", x, "(n, d_model)", ndim=2)
    L, H, n, _ = P.shape
    d = X.shape[1]
    if P.shape[-1] != n or n != X.shape[0]:
        raise ValueError(f"routing must have shape (n_layers, n_heads, {X.shape[0]}, {X.shape[0]}), got {P.shape}")
    if W.shape != (L, H, d, d):
        raise ValueError(f"W_OV must have shape {(L, H, d, d)}, got {W.shape}")
    J = None
    if mlp_jacobians is not None:
        J = operand("mlp_jacobians", mlp_jacobians, "(n_layers, d_model, d_model)", ndim=3)
        if J.shape != (L, d, d):
            raise ValueError(f"mlp_jacobians must have shape {(L, d, d)}, got {J.shape}")
    count("max_length", max_length, 0, allow_none=True, bound=">= 0 or None")

    sizes = [H, 1] * L if J is not None else [H] * L
    n_paths = _path_count(sizes, max_length)
    if n_paths > MAX_PATHS:
        raise ValueError(f"path_expansion: {n_paths:.3g} paths of at most {max_length if max_length is not None else len(sizes)} "
                         f"components, beyond the limit of MAX_PATHS = {MAX_PATHS}: pass a smaller max_length")
    check_size("max_length (the number of paths)", n_paths * n * d, np.result_type(P, W, X).itemsize)

    def apply(component, r):
        layer, which = component
        if which == "mlp":
            return r @ J[layer].T
        return P[layer, which] @ r @ W[layer, which]

    sublayers = []
    for layer in range(L):
        sublayers.append([(layer, h) for h in range(H)])
        if J is not None:
            sublayers.append([(layer, "mlp")])
    # forward pass with frozen attention
    r = X.copy()
    for comps in sublayers:
        r = r + sum(apply(c, r) for c in comps)
    # paths: choose at most one component per sublayer, in order
    paths: Dict[tuple, np.ndarray] = {(): X.copy()}
    frontier = {(): X}
    for comps in sublayers:
        new = {}
        for path, value in frontier.items():
            if max_length is not None and len(path) >= max_length:
                continue
            for c in comps:
                new[path + (c,)] = apply(c, value)
        paths.update(new)
        frontier = {**frontier, **new}
    return PathExpansion(paths, r, max_length)


# -- layer norm ----------------------------------------------------------------------------
@finite_result
def layernorm(x, gamma=None, beta=None, eps: float = 1e-5):
    """Layer norm N(x) = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis.

    The notes' "Lemma (layer norm linearization)" linearises this map
    (:func:`layernorm_jacobian`).

    Parameters
    ----------
    x : array_like, shape (..., d)
        Vectors.
    gamma : array_like, shape (d,), optional
        Scale (default 1).
    beta : array_like, shape (d,), optional
        Shift (default 0).
    eps : float, default 1e-5
        Variance floor.

    Returns
    -------
    ndarray, shape (..., d)
        The normalised vectors.

    Examples
    --------
    >>> ag.layernorm(np.array([1.0, 3.0]), eps=0.0)
    array([-1.,  1.])
    """
    eps = scalar("eps", eps)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    x = operand("x", x, "(..., d)", min_ndim=1)
    # Rows with entries beyond 1 are divided by their largest one first, so neither the mean's
    # sum nor a square overflows (the result does not depend on the row's scale but for eps).
    m = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), 1.0) if x.shape[-1] else 1.0
    x = x / m
    c = x - x.mean(-1, keepdims=True)
    with np.errstate(over="ignore"):
        s = np.sqrt((c * c).mean(-1, keepdims=True) + eps / (m * m))
    g = 1.0 if gamma is None else _feature_vector("gamma", gamma, x.shape[-1:])
    b = 0.0 if beta is None else _feature_vector("beta", beta, x.shape[-1:])
    if eps > 0:  # s = 0 only where eps / m^2 underflows in a constant row: c = 0 there, and so is the result
        c = np.divide(c, s, out=np.zeros_like(c), where=s > 0)
    elif np.any(s == 0):
        raise ValueError("x: a constant row with eps = 0 has no layer norm (zero variance)")
    else:
        c = c / s
    return g * c + b


def _feature_vector(name: str, value, features: tuple) -> np.ndarray:
    """A per-feature parameter of shape (d,) or a scalar (shape ()), for x of shape (..., d)."""
    v = operand(name, value, "(d,)", min_ndim=0)
    if v.ndim > 1 or (v.ndim == 1 and v.shape != features and v.shape != (1,)):
        raise ValueError(f"{name} must have shape {features} or be a scalar, got {v.shape}")
    return v


@finite_result
def layernorm_jacobian(x, gamma=None, eps: float = 1e-5) -> np.ndarray:
    """Exact Jacobian of layer norm at x (..., d): (..., d, d).

    J = diag(gamma) (1/s) [I - 1 1^T / d - c c^T / (d s^2)], c = x - mean(x),
    s = sqrt(var(x) + eps) (notes: "Lemma (layer norm linearization)"). J 1 = 0 exactly.
    J c = diag(gamma) c eps / (s (var + eps)), which vanishes only as eps -> 0: with eps = 0
    the bracket is the orthogonal projector onto the complement of span{1, c}. The notes call
    B_x "doubly stochastic"; it is not: its rows sum to 0, not 1, and it has negative entries.

    Parameters
    ----------
    x : array_like, shape (..., d)
        The point of linearisation.
    gamma : array_like, shape (d,), optional
        Scale (default 1).
    eps : float, default 1e-5
        Variance floor.

    Returns
    -------
    ndarray, shape (..., d, d)
        J[..., i, j] = d N(x)_i / d x_j.

    Examples
    --------
    >>> J = ag.layernorm_jacobian(np.array([1.0, 2.0, 4.0]))
    >>> bool(np.allclose(J @ np.ones(3), 0))
    True
    """
    x = operand("x", x, "(..., d)")
    eps = scalar("eps", eps)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    d = x.shape[-1]
    # As in layernorm, rows are divided by their largest entry beyond 1 first: c and var below
    # are those of x / m, s that of x (sqrt(eps) for a constant row, where c = 0).
    m = np.maximum(np.max(np.abs(x), axis=-1), 1.0)
    xs = x / m[..., None]
    c = xs - xs.mean(-1, keepdims=True)
    var = (c * c).mean(-1)
    with np.errstate(over="ignore", under="ignore"):
        r2 = np.where(var > 0, var + eps / (m * m), 1.0)  # (s / m)^2 where c is not 0
        s = np.where(var > 0, m * np.sqrt(r2), math.sqrt(eps))
    if np.any(s <= 0):
        raise ValueError("x: a constant row with eps = 0 has no layer-norm Jacobian (zero variance)")
    eye = np.eye(d, dtype=x.dtype)
    B = eye - 1.0 / d - c[..., :, None] * c[..., None, :] / (d * r2[..., None, None])
    g = np.ones(d, dtype=x.dtype) if gamma is None else operand("gamma", gamma, f"({d},)", ndim=1)
    if g.shape != (d,):
        raise ValueError(f"gamma must have shape ({d},), got {g.shape}")
    return g[:, None] * B / s[..., None, None]


# -- MoE router ----------------------------------------------------------------------------
@renamed_arguments(gate_logits="router_logits")
def topk_router(router_logits, k: int) -> np.ndarray:
    """Top-k router matrix: exactly k non-zeros per row, the softmax of the k largest router logits.

    The notes' "top-k routing matrix" (R with sparse rows, as in DeepSeekMoE). Ties are broken
    toward the lower expert index.

    Parameters
    ----------
    router_logits : array_like, shape (..., n_tokens, n_experts)
        Router logits.
    k : int
        Experts per token.

    Returns
    -------
    ndarray, shape (..., n_tokens, n_experts)
        The router matrix R; each row sums to 1.

    Examples
    --------
    >>> ag.topk_router(np.array([[0.0, 2.0, 2.0, -1.0]]), 2)
    array([[0. , 0.5, 0.5, 0. ]])
    """
    g = operand("router_logits", router_logits, "(..., n_tokens, n_experts)")
    E = g.shape[-1]
    count("k", k, 1, E, bound=f"in [1, n_experts = {E}]")
    idx = np.argsort(-g, axis=-1, kind="stable")[..., :k]
    top = np.take_along_axis(g, idx, -1)
    w = np.exp(top - top.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    R = np.zeros_like(g)
    np.put_along_axis(R, idx, w, -1)
    return R


@dataclass
class RouterGram:
    """G = R^T R (n_experts, n_experts) and its load / interference summaries.

    loads : (n_experts,) token mass per expert, sum_t R[t, e]
    diagonal : (n_experts,) diag(G), each expert's self-interference
    off_diagonal_mass : sum of ``|G|`` off the diagonal over its total (0 for disjoint experts)
    imbalance : coefficient of variation std(loads) / mean(loads) (0 when balanced)
    """

    gram: np.ndarray
    loads: np.ndarray
    diagonal: np.ndarray
    off_diagonal_mass: float
    imbalance: float


@finite_result
def router_gram(R) -> RouterGram:
    """Load and interference diagnostics of a router matrix R (n_tokens, n_experts).

    The notes: "Inspecting R^T R diagnoses load imbalance and expert redundancy".

    Parameters
    ----------
    R : array_like, shape (n_tokens, n_experts)
        Router matrix, e.g. from :func:`topk_router`.

    Returns
    -------
    RouterGram
        G = R^T R, the expert loads, diag(G), the off-diagonal mass and the load imbalance.

    Examples
    --------
    >>> g = ag.router_gram(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    >>> g.loads, g.off_diagonal_mass
    (array([2., 1.]), 0.0)
    """
    R = operand("R", R, "(n_tokens, n_experts)", ndim=2)
    if np.any(R < 0):
        raise ValueError("R must be non-negative")
    G = R.T @ R
    loads = R.sum(0)
    total = np.abs(G).sum()
    off = float((total - np.abs(np.diag(G)).sum()) / total) if total > 0 else 0.0
    mean = loads.mean()
    return RouterGram(G, loads, np.diag(G).copy(), off, float(loads.std() / mean) if mean > 0 else 0.0)


# -- latent (MLA) factorisation ------------------------------------------------------------
@dataclass
class LatentFactorization:
    """K ~ U Z with U (m, r) = U_r diag(sigma_r) and Z (r, n) = V_r^T (orthonormal rows).

    Attributes
    ----------
    error
        ||K - U Z||_F^2, equal to sum_{i > r} sigma_i^2 (Eckart-Young; the notes'
        "Proposition (spectral error bound)")
    tail_energy
        sum_{i > r} sigma_i^2 from the spectrum
    condition
        kappa_2(U) = sigma_1 / sigma_r
    singular_values
        all singular values of K
    """

    U: np.ndarray
    Z: np.ndarray
    error: float
    tail_energy: float
    condition: float
    singular_values: np.ndarray


@finite_result
def latent_factorization(K, rank: int) -> LatentFactorization:
    """Best rank-r factorisation K ~ U Z (multi-head latent attention's cache compression).

    The notes' MLA section and "Proposition (spectral error bound)": the truncated SVD, with
    error sum_{i > r} sigma_i^2 (Eckart-Young).

    Parameters
    ----------
    K : array_like, shape (m, n)
        The matrix to compress (e.g. keys of a cache).
    rank : int
        Latent rank r.

    Returns
    -------
    LatentFactorization
        U (m, r), Z (r, n), the error, the tail energy, kappa_2(U) and the spectrum.

    Examples
    --------
    >>> f = ag.latent_factorization(np.diag([3.0, 2.0, 1.0]), 2)
    >>> round(f.error, 12), f.U.shape, f.Z.shape
    (1.0, (3, 2), (2, 3))
    """
    K = operand("K", K, "(m, n)", ndim=2)
    k = min(K.shape)
    count("rank", rank, 1, k, bound=f"in [1, min(m, n) = {k}]")
    u, s, vh = np.linalg.svd(K, full_matrices=False)
    if s[rank - 1] == 0:  # U would have a zero column: no rank-r factorisation, kappa(U) = inf
        raise ValueError(f"rank {rank} exceeds the rank of K ({int(np.count_nonzero(s))} nonzero singular values)")
    U, Z = u[:, :rank] * s[:rank], vh[:rank]
    err = float(np.linalg.norm(K - U @ Z) ** 2)
    cond = float(s[0] / s[rank - 1])
    return LatentFactorization(U, Z, err, float(np.sum(s[rank:] ** 2)), cond, s)


# -- embeddings ----------------------------------------------------------------------------
def principal_angles(A, B) -> np.ndarray:
    """Principal angles (radians, descending) between the column spaces of A and B.

    Used by the notes' distinguishability lemma (:func:`embedding_injectivity`). Accurate for
    small angles (sines, not only cosines).

    Parameters
    ----------
    A : array_like, shape (d, p)
        Spanning columns of the first subspace.
    B : array_like, shape (d, q)
        Spanning columns of the second subspace.

    Returns
    -------
    ndarray, shape (min(rank A, rank B),)
        The angles, descending.

    Examples
    --------
    >>> A = np.array([[1.0], [0.0]])
    >>> B = np.array([[1.0], [1.0]])
    >>> ag.principal_angles(A, B) / np.pi
    array([0.25])
    """
    A = operand("A", A, "(d, p)", ndim=2)
    B = operand("B", B, "(d, q)", ndim=2)
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"A (d, p) and B (d, q) must share d: A {A.shape}, B {B.shape}")
    return Subspace.span(A.T).principal_angles(Subspace.span(B.T))


@dataclass
class Injectivity:
    """span(E) and span(P) meet only at 0 iff the smallest principal angle is > 0.

    injective : the notes' sufficient condition for distinguishability holds numerically
    smallest_angle : radians (0 when the spans share a direction, or when dim E + dim P > d)
    dims : (dim span E, dim span P, d)
    """

    injective: bool
    smallest_angle: float
    dims: Tuple[int, int, int]


def embedding_injectivity(E, P, *, atol: float = 1e-10) -> Injectivity:
    """The notes' distinguishability lemma for token and positional embeddings.

    Token embeddings E (columns) and positional embeddings P give an injective map
    (i, pos) -> e_i + p_pos when span E and span P intersect only at 0 (and positions are
    distinct). Reports the smallest principal angle; injective when it exceeds atol.

    Parameters
    ----------
    E : array_like, shape (d, n_tokens)
        Token embeddings as columns.
    P : array_like, shape (d, n_positions)
        Positional embeddings as columns.
    atol : float, default 1e-10
        Smallest angle (radians) that counts as positive.

    Returns
    -------
    Injectivity
        ``injective``, the smallest angle and (dim span E, dim span P, d).

    Examples
    --------
    >>> ag.embedding_injectivity(np.eye(4)[:, :2], np.eye(4)[:, 2:]).injective
    True
    """
    atol = scalar("atol", atol)
    E = operand("E", E, "(d, n_tokens)", ndim=2)
    P = operand("P", P, "(d, n_positions)", ndim=2)
    if E.shape[0] != P.shape[0]:
        raise ValueError(f"E (d, n_tokens) and P (d, n_positions) must share d: E {E.shape}, P {P.shape}")
    se, sp = Subspace.span(E.T), Subspace.span(P.T)
    d = E.shape[0]
    if se.dim + sp.dim > d:
        angle = 0.0  # dimension count forces a common direction
    else:
        angles = se.principal_angles(sp)
        angle = float(angles.min()) if angles.size else math.pi / 2
    return Injectivity(angle > atol, angle, (se.dim, sp.dim, d))


# -- MLP as key-value memory ---------------------------------------------------------------
_ACTIVATIONS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": relu,
    "gelu_tanh": gelu_tanh,
    "silu": silu,
    "identity": lambda z: z,
}


@dataclass
class KeyValueMLP:
    """Neuron-wise key-value view of an MLP (notes: "Lemma (key-value decomposition)").

    keys : (d_ff, d_model) k_j = column j of W1; values : (d_ff, d_model) v_j = row j of W2
    activations : (..., n, d_ff) a_j = phi(x . k_j + b1_j)
    output : (..., n, d_model) sum_j a_j v_j (+ b2)
    """

    keys: np.ndarray
    values: np.ndarray
    activations: np.ndarray
    output: np.ndarray

    def writes(self) -> np.ndarray:
        """Each neuron's rank-one write a_j v_j: (..., n, d_ff, d_model)."""
        return self.activations[..., None] * self.values

    def top_neurons(self, token_index, k: int = 5):
        """The k neurons writing the most (by ``|a_j|`` ``|v_j|``) for one token: (indices, norms)."""
        norms = np.abs(self.activations[token_index]) * np.linalg.norm(self.values, axis=1)
        order = np.argsort(-norms, kind="stable")[:k]
        return order, norms[order]


@renamed_values(activation={"gelu": "gelu_tanh"})
@finite_result
def mlp_key_value(x, W1, W2, activation: Union[str, Callable] = "gelu_tanh", *, b1=None, b2=None) -> KeyValueMLP:
    """The MLP x -> phi(x W1 + b1) W2 + b2 as a sum of neuron writes a_j v_j.

    The notes' "Lemma (key-value decomposition)". Row convention: the notes' K = W1^T and
    V = W2 in their column convention.

    Parameters
    ----------
    x : array_like, shape (..., n, d_model)
        Tokens.
    W1 : array_like, shape (d_model, d_ff)
        Input weights (keys k_j are its columns).
    W2 : array_like, shape (d_ff, d_model)
        Output weights (values v_j are its rows).
    activation : {"relu", "gelu_tanh", "silu", "identity"} or callable, default "gelu_tanh"
        The activation function phi; "gelu_tanh" is GELU's tanh approximation ("gelu", the
        deprecated name of the same function here, is the exact erf form elsewhere).
    b1 : array_like, shape (d_ff,), optional
        Input bias.
    b2 : array_like, shape (d_model,), optional
        Output bias.

    Returns
    -------
    KeyValueMLP
        Keys, values, activations a_j and the output sum_j a_j v_j (+ b2).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x, W1, W2 = rng.standard_normal((3, 4)), rng.standard_normal((4, 6)), rng.standard_normal((6, 4))
    >>> kv = ag.mlp_key_value(x, W1, W2, "relu")
    >>> bool(np.allclose(kv.output, np.maximum(x @ W1, 0) @ W2))
    True
    """
    X = operand("x", x, "(..., n, d_model)", min_ndim=1)
    A = operand("W1", W1, "(d_model, d_ff)", ndim=2)
    B = operand("W2", W2, "(d_ff, d_model)", ndim=2)
    if A.shape[0] != X.shape[-1]:
        raise ValueError(f"W1 must have shape ({X.shape[-1]}, d_ff), got {A.shape}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"W2 must have shape ({A.shape[1]}, d_model), got {B.shape}")
    if callable(activation):
        phi = activation
    else:
        phi = _ACTIVATIONS[choice("activation", activation, _ACTIVATIONS, f"one of {tuple(_ACTIVATIONS)} or a callable")]
    biases = [None if b is None else operand(name, b, f"({size},)", ndim=1)
              for name, b, size in (("b1", b1, A.shape[1]), ("b2", b2, B.shape[1]))]
    for name, b, size in zip(("b1", "b2"), biases, (A.shape[1], B.shape[1])):
        if b is not None and b.shape != (size,):
            raise ValueError(f"{name} must have shape ({size},), got {b.shape}")
    pre = X @ A
    if biases[0] is not None:
        pre = pre + biases[0]
    a = phi(pre)
    out = a @ B
    if biases[1] is not None:
        out = out + biases[1]
    return KeyValueMLP(A.T.copy(), B.copy(), a, out)


__getattr__ = renamed_attributes(__name__, topk_routing="topk_router", routing_gram="router_gram",
                                 RoutingGram="RouterGram")
