"""The neuromanifold of deep self-attention networks and its dimension.

Henry, Marchetti & Kohn, "Geometry of Lightning Self-Attention" s.3. A network with l
layers, widths d = (d_0, ..., d_l) and heads a = (a_1, ..., a_l) has weights
W = (Q_i, K_i, V_i), Q_i and K_i of shape (a_i, d_{i-1}), V_i of shape (d_i, d_{i-1}) (the
paper's shapes; its statement "Q_i, K_i in R^{a_i x d_i}" is read with d_{i-1}, the width
the layer acts on, as eq. 9's M_i = L_{i-1}^T A_i L_{i-1} requires). The neuromanifold is
the image of W -> phi_W; its dimension is the generic rank of the Jacobian of that map,
which we estimate by restricting phi_W to N random inputs (the paper's s.3.4 procedure).

Conventions: the paper writes tokens as columns, X in R^{d_0 x t}. Here a sample is
(t, d_0) with tokens as rows, the output (t, d_l) is phi_W(X)^T, and the Jacobian rows are
ordered (sample, token, output coordinate). Weights keep the paper's shapes, flattened
layer by layer as Q, K, V (row-major) when a flat parameter vector is needed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, NamedTuple, Tuple

import numpy as np

from . import _core
from ._docstrings import filler
from ._operands import check_size, count, finite_result, generator, operand, scalar, sequence
from .errors import ResultOverflow
from .lightning import deep_lightning, network_kind

# The layer widths of a deep network, as most functions here take them.
_fill_doc = filler(widths="""\
    d : sequence of int, length l + 1
        Widths (d_0, ..., d_l): d_0 the input token width, d_i the output width of layer i.
    a : sequence of int, length l
        Query/key dimensions (a_1, ..., a_l), one head per layer: the paper's a, the rank bound
        of A_i = K_i^T Q_i.""")

Weights = List[Tuple[np.ndarray, np.ndarray, np.ndarray]]


def _dims(d, a) -> Tuple[List[int], List[int]]:
    def ints(name, xs, minimum):
        xs = [count(f"{name}[{i}]", v, minimum) for i, v in enumerate(sequence(name, xs))]
        if any(v < minimum for v in xs):
            raise ValueError(f"{name} must hold integers >= {minimum}, got {xs}")
        return xs

    d, a = ints("d", d, 1), ints("a", a, 1)
    if len(a) < 1 or len(d) != len(a) + 1:
        raise ValueError(f"need len(d) == len(a) + 1 >= 2 (d = (d_0..d_l), a = (a_1..a_l)), got d={d}, a={a}")
    return d, a


@_fill_doc
def parameter_count(d, a) -> int:
    """Number of weights P = sum_i (2 a_i d_{i-1} + d_i d_{i-1}) of a deep attention network.

    Henry, Marchetti & Kohn, "Geometry of Lightning Self-Attention", Definition 2: layer i has
    Q_i, K_i of shape (a_i, d_{i-1}) and V_i of shape (d_i, d_{i-1}).

    Parameters
    ----------
    %(widths)s

    Returns
    -------
    int
        The parameter count P.

    Examples
    --------
    >>> ag.parameter_count((3, 2), (2,))  # 2*2*3 + 2*3
    18
    """
    d, a = _dims(d, a)
    return sum(2 * a[i] * d[i] + d[i + 1] * d[i] for i in range(len(a)))


@_fill_doc
def random_weights(d, a, *, seed=0) -> Weights:
    """Gaussian weights [(Q_i, K_i, V_i)] with entries N(0, 1 / d_{i-1}).

    Henry-Marchetti-Kohn Definition 2 shapes: Q_i, K_i (a_i, d_{i-1}), V_i (d_i, d_{i-1}).

    Parameters
    ----------
    %(widths)s
    seed : int, default 0
        Seed of the NumPy generator.

    Returns
    -------
    list of tuple of ndarray
        One (Q_i, K_i, V_i) triple per layer, float64.

    Examples
    --------
    >>> [tuple(w.shape for w in layer) for layer in ag.random_weights((3, 4, 2), (2, 5))]
    [((2, 3), (2, 3), (4, 3)), ((5, 4), (5, 4), (2, 4))]
    """
    d, a = _dims(d, a)
    check_size("d, a", sum(2 * a[i] * d[i] + d[i + 1] * d[i] for i in range(len(a))))
    rng = generator(seed)
    s = [1 / math.sqrt(w) for w in d]
    return [(rng.standard_normal((a[i], d[i])) * s[i], rng.standard_normal((a[i], d[i])) * s[i],
             rng.standard_normal((d[i + 1], d[i])) * s[i]) for i in range(len(a))]


def _flatten(weights) -> Tuple[List[int], List[int], np.ndarray, list]:
    """Check [(Q_i, K_i, V_i)] and return (d, a, flat float64 parameter vector, checked triples)."""
    weights = sequence("weights", weights)
    for i, triple in enumerate(weights):
        sequence(f"weights[{i}]", triple, length=3)
    d, a, flat, triples = [], [], [], []
    for i, triple in enumerate(weights):
        if len(triple) != 3:
            raise ValueError(f"weights[{i}] must be a (Q, K, V) triple")
        Q, K, V = (operand(f"weights[{i}].{n}", w, "(rows, cols)", dtype=np.float64) for n, w in zip("QKV", triple))
        din = Q.shape[1] if i == 0 else d[-1]
        if Q.shape[1] != din or K.shape != Q.shape or V.shape[1] != din:
            raise ValueError(f"weights[{i}]: need Q, K of shape (a, {din}) and V of shape (d_out, {din}), got "
                             f"Q {Q.shape}, K {K.shape}, V {V.shape}")
        if i == 0:
            d.append(din)
        d.append(V.shape[0])
        a.append(Q.shape[0])
        flat += [Q.ravel(), K.ravel(), V.ravel()]
        triples.append((Q, K, V))
    return d, a, np.concatenate(flat), triples


def _samples(X, d0) -> np.ndarray:
    expected = f"(N, t, {d0}) (tokens as rows)"
    x = operand("X", X, expected, min_ndim=2, dtype=np.float64, contiguous=True)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != d0:
        raise ValueError(f"X must have shape {expected}, got {np.shape(X)}")
    return x


@finite_result
@_fill_doc
def network_forward(weights, X, *, kind="lightning", temperature=1.0) -> np.ndarray:
    """phi_W(X) for N samples X (N, t, d_0) -> (N, t, d_l) (Definition 2; eq. 1 or eq. 16).

    Henry, Marchetti & Kohn. kind "lightning": each layer y = (q k^T) v with q = x Q^T,
    k = x K^T, v = x V^T; "softmax": y = softmax_rows(k q^T / temperature) v, the weight of
    token j for token i being exp(x_i^T A x_j / temperature), A = K^T Q (eq. 16 as written).
    Tokens are rows here; the paper's phi_W(X) with tokens as columns is the transpose.

    Parameters
    ----------
    weights : list of (Q_i, K_i, V_i)
        Q_i, K_i of shape (a_i, d_{i-1}), V_i of shape (d_i, d_{i-1}).
    X : array_like, shape (N, t, d_0) or (t, d_0)
        N samples of t tokens.
    %(network_kind)s

    Returns
    -------
    ndarray, shape (N, t, d_l)
        The network output, float64.

    Examples
    --------
    >>> X = np.random.default_rng(0).standard_normal((4, 5, 3))
    >>> ag.network_forward(ag.random_weights((3, 2), (2,)), X).shape
    (4, 5, 2)
    """
    kind = network_kind(kind)
    d, _, _, triples = _flatten(weights)
    x = _samples(X, d[0])
    As = [K.T @ Q for Q, K, _ in triples]  # A = K^T Q (eq. 3)
    return deep_lightning(x, As, [V for _, _, V in triples], kind=kind, temperature=temperature)


@finite_result
@_fill_doc
def parametrization_jacobian(weights, X, *, kind="lightning", temperature=1.0) -> np.ndarray:
    """Exact Jacobian of W -> phi_W(X) on N samples, float64, shape (N * t * d_l, P).

    Henry-Marchetti-Kohn s.3.4: the neuromanifold dimension is the generic rank of this
    Jacobian. Computed analytically in the core (forward mode, one tangent pass per weight,
    OpenMP over samples). Rows are (sample, token, output coordinate); columns follow the flat
    parameter order (layer by layer, Q, K, V row-major), P = parameter_count(d, a).

    Parameters
    ----------
    weights : list of (Q_i, K_i, V_i)
        As in :func:`network_forward`.
    X : array_like, shape (N, t, d_0) or (t, d_0)
        Samples at which phi_W is restricted.
    %(network_kind)s

    Returns
    -------
    ndarray, shape (N * t * d_l, P)
        The Jacobian.

    Examples
    --------
    >>> X = np.random.default_rng(0).standard_normal((4, 5, 3))
    >>> J = ag.parametrization_jacobian(ag.random_weights((3, 2), (2,)), X)
    >>> J.shape, ag.numerical_rank(J, block_rows=10)[0]
    ((40, 18), 13)
    """
    softmax = network_kind(kind) == "softmax"
    temperature = scalar("temperature", temperature, positive=True)
    d, a, p, _ = _flatten(weights)
    x = _samples(X, d[0])
    # Each thread keeps a t x t score matrix per layer and three more for a tangent pass.
    check_size("X (its t tokens)", (len(a) + 3) * x.shape[1] ** 2 * _core.get_num_threads())
    jac = _core.network_jacobian(d, a, p, x, softmax, temperature)
    return jac.reshape(-1, jac.shape[-1])


@_fill_doc
def expected_dimension(d, a, kind="lightning") -> int:
    """Closed-form dimension of the neuromanifold (Henry, Marchetti & Kohn s.3).

    * one layer (Corollary 3.3, lightning; needs d_0 >= 2 and d_1 >= 2, or d_0 >= 2 and a >= 2):
      2 alpha d + d d' - alpha^2 - 1 with alpha = min(a, d); for softmax (Theorem 3.15, one-to-one
      parametrization) the same without the -1;
    * deep (Corollary 3.14 for lightning, eq. 17 for the softmax conjecture 3.16; needs a_i >= 2
      for lightning, and d_i = delta >= 2 for 0 < i < l with d_0, d_l >= delta):
      2 alpha_1 d_0 - alpha_1^2 + delta (d_0 + d_l) - delta^2 - [l] + sum_{i>1} (2 alpha_i delta - alpha_i^2),
      alpha_i = min(a_i, d_{i-1}); the -l term only for lightning.

    t >= 3 tokens (2 for one layer) are assumed.

    Parameters
    ----------
    %(widths)s
    kind : {"lightning", "softmax"}, default "lightning"
        Network kind.

    Returns
    -------
    int
        The dimension of the neuromanifold.

    Raises
    ------
    ValueError
        Naming the hypothesis of the closed form that fails.

    Examples
    --------
    >>> ag.expected_dimension((3, 2), (2,))
    13
    >>> ag.expected_dimension((4, 4, 4, 4), (2, 2, 2), "softmax")
    52
    """
    softmax = network_kind(kind) == "softmax"
    d, a = _dims(d, a)
    l = len(a)
    if l == 1:
        d0, d1, a1 = d[0], d[1], a[0]
        if not ((d0 >= 2 and d1 >= 2) or (d0 >= 2 and a1 >= 2)):
            raise ValueError("Corollary 3.3 needs d, d' >= 2 or d, a >= 2 (d = d_0, d' = d_1)")
        alpha = min(a1, d0)
        return 2 * alpha * d0 + d0 * d1 - alpha * alpha - (0 if softmax else 1)
    delta = d[1]
    if any(w != delta for w in d[1:-1]):
        raise ValueError(f"the deep formula needs a bottleneck: d_i equal for 0 < i < l, got {d[1:-1]}")
    if delta < 2 and not softmax:
        raise ValueError(f"Corollary 3.14 needs delta = d_1 >= 2, got {delta}")
    if d[0] < delta or d[-1] < delta:
        raise ValueError(f"the deep formula needs d_0, d_l >= delta = {delta}, got d_0 = {d[0]}, d_l = {d[-1]}")
    if not softmax and any(x < 2 for x in a):
        raise ValueError(f"Corollary 3.14 needs a_i >= 2 for every layer, got a = {a}")
    alpha = [min(a[i], d[i]) for i in range(l)]
    dim = 2 * alpha[0] * d[0] - alpha[0] ** 2 + delta * (d[0] + d[-1]) - delta ** 2
    dim += sum(2 * alpha[i] * delta - alpha[i] ** 2 for i in range(1, l))
    return dim - (0 if softmax else l)


class NumericalRank(NamedTuple):
    """Result of :func:`numerical_rank`: (rank, singular_values, gap_ratio)."""

    rank: int
    singular_values: np.ndarray
    gap_ratio: float


def numerical_rank(J, block_rows=None) -> NumericalRank:
    """Rank of a Jacobian by the largest log-gap of its singular values.

    Henry-Marchetti-Kohn s.3.4 (rank at random points). Each block of ``block_rows`` rows
    (one sample's outputs) is first scaled to unit Frobenius norm (row scaling does not change
    the rank but evens out samples of very different magnitude). The rank r maximises
    log(sigma_r / sigma_{r+1}) over the spectrum extended by the floor eps * sigma_1 (so a
    full-rank Jacobian is recognised; values below the floor count as the floor). The floor
    carries no dimension factor: a genuine small singular value just above the rounding level
    must stay distinguishable.

    Parameters
    ----------
    J : array_like, shape (rows, P)
        The Jacobian.
    block_rows : int, optional
        Rows per sample (t * d_l); default: no block scaling.

    Returns
    -------
    rank : int
        The numerical rank.
    singular_values : ndarray
        The singular values after block scaling, descending.
    gap_ratio : float
        sigma_r / sigma_{r+1} at the chosen rank (sigma_{r+1} taken no smaller than the floor,
        so at most 1 / eps); inf for a zero or empty J, whose rank 0 is exact (no singular
        value is above zero). The three come as a named tuple, NumericalRank.

    Raises
    ------
    ResultOverflow
        A ValueError when the singular values lie beyond the float range (entries near the
        float maximum); the rank does not depend on the scale, so ``J / max |J_ij|`` answers.

    Examples
    --------
    >>> J = np.diag([1.0, 1.0, 1e-14])
    >>> rank, s, gap = ag.numerical_rank(J)
    >>> rank, gap > 1e10
    (2, True)
    """
    J = operand("J", J, "(m, n)", ndim=2, dtype=np.float64, nonempty=False)
    block_rows = None if block_rows is None else count("block_rows", block_rows)
    if block_rows and J.shape[0] % block_rows:
        raise ValueError(f"block_rows must divide the {J.shape[0]} rows of J, got {block_rows}")
    if J.size == 0:
        return NumericalRank(0, np.zeros(0), float("inf"))
    if block_rows:
        blocks = J.reshape(-1, block_rows, J.shape[1])
        # Divided by the largest entry first, so the norm neither overflows nor underflows.
        big = np.max(np.abs(blocks), axis=(1, 2), keepdims=True)
        blocks = blocks / np.where(big > 0, big, 1)
        norms = np.linalg.norm(blocks, axis=(1, 2), keepdims=True)
        J = (blocks / np.where(norms > 0, norms, 1)).reshape(J.shape)
    # The rank is decided on J / max |J_ij|: the floor eps sigma_0 neither underflows (J of
    # subnormal size) nor the spectrum overflows (entries near the float maximum).
    big = float(np.max(np.abs(J)))
    if big == 0:
        return NumericalRank(0, np.zeros(min(J.shape)), float("inf"))
    s = np.linalg.svd(J / big, compute_uv=False)
    floor = np.finfo(np.float64).eps * s[0]
    ext = np.maximum(np.r_[s, floor], floor)
    gaps = np.log(ext[:-1]) - np.log(ext[1:])
    r = int(np.argmax(gaps)) + 1
    with np.errstate(over="ignore"):
        s = s * big
        gap = float(ext[r - 1] / ext[r])
    if not np.all(np.isfinite(s)):
        raise ResultOverflow(f"numerical_rank: the singular values are beyond the float range for these inputs: "
                             f"J has entries up to {big:.3g}; rescale it (the rank does not depend on the scale)")
    return NumericalRank(r, s, gap)


@dataclass
class DimensionResult:
    """Neuromanifold dimension estimates, one per random draw of the weights.

    dims : (n_draws,) estimated dimension of each draw (never only their max)
    gap_ratios : (n_draws,) sigma_r / sigma_{r+1} at the chosen rank of each draw
    singular_values : (n_draws, min(rows, P)) normalised Jacobian spectra
    expected : closed-form value (None where no formula applies)
    parameters : parameter count P
    """

    d: tuple
    a: tuple
    kind: str
    t: int
    n_samples: int
    dims: np.ndarray
    gap_ratios: np.ndarray
    singular_values: np.ndarray = field(repr=False)
    expected: object
    parameters: int

    @property
    def reliable(self) -> bool:
        """Every draw's rank sits on a gap of at least three decades (sigma_r / sigma_{r+1} >= 1e3).

        When the true spectrum sinks into rounding noise (deep softmax networks saturate as
        widths grow) the largest log-gap is small and the estimate is not to be trusted."""
        return bool(np.all(self.gap_ratios >= 1e3))

    @property
    def agrees(self) -> bool:
        """Every draw equals the closed form."""
        return self.expected is not None and bool(np.all(self.dims == self.expected))

    def summary(self) -> dict:
        return {"d": list(self.d), "a": list(self.a), "kind": self.kind, "dims": self.dims.tolist(),
                "expected": self.expected, "parameters": self.parameters,
                "min_gap_ratio": float(self.gap_ratios.min()), "reliable": self.reliable}

    def plot_spectrum(self, ax=None):
        """Normalised Jacobian singular values of every draw (one line each), the estimated rank marked."""
        from . import plotting

        fig, axis = plotting.axes_or_new(ax, figsize=(5.6, 3.6))
        shown, _ = plotting.log_floor(np.atleast_2d(self.singular_values))
        i = np.arange(1, shown.shape[1] + 1)
        for n, (s, r) in enumerate(zip(shown, self.dims)):
            axis.semilogy(i, s, lw=1, alpha=0.8, label=f"draw {n + 1}: rank {int(r)}")
        for n, r in enumerate(np.unique(self.dims)):
            axis.axvline(r + 0.5, color="k", ls=":", lw=1, label="estimated rank (largest gap)" if n == 0 else None)
        axis.set_xlabel("i (i-th largest singular value of the Jacobian)")
        axis.set_ylabel(r"$\sigma_i$ (each sample's rows normalised)")
        axis.set_title(f"Jacobian spectra, {self.kind}\nd = {self.d}, a = {self.a}", fontsize=10)
        axis.legend(frameon=False, fontsize=7, loc="lower left")
        fig.tight_layout()
        return fig


@_fill_doc
def neuromanifold_dimension(d, a, *, kind="lightning", t=3, n_samples=100, n_draws=5, seed=0,
                            temperature=1.0) -> DimensionResult:
    """Estimate the neuromanifold dimension of a deep attention network as a Jacobian rank.

    Henry, Marchetti & Kohn, "Geometry of Lightning Self-Attention", s.3.4 and Figure 4. The
    network has l layers with widths d = (d_0, ..., d_l) and query/key dimensions
    a = (a_1, ..., a_l) (layer i: Q_i, K_i of shape (a_i, d_{i-1}), V_i of shape
    (d_i, d_{i-1}); one head per layer). The procedure: draw N = n_samples Gaussian inputs X
    of t tokens of width d_0, restrict phi_W to them, and take the rank of the Jacobian at
    random weights W (:func:`numerical_rank`), for n_draws independent draws of (X, W). Compare
    with the closed form :func:`expected_dimension`.

    Parameters
    ----------
    %(widths)s
    kind : {"lightning", "softmax"}, default "lightning"
        Unnormalised (lightning, eq. 1) or softmax-normalised layers (eq. 16).
    t : int, default 3
        Number of tokens per input sample.
    n_samples : int, default 100
        Number N of input samples phi_W is restricted to.
    n_draws : int, default 5
        Independent draws of (X, W); each gives one estimate.
    seed : int, default 0
        Seed of the NumPy generator.
    temperature : float, default 1.0
        Softmax temperature (kind "softmax").

    Returns
    -------
    DimensionResult
        One estimate per draw (``dims``), the gap ratio of each, the spectra, the closed form
        (``expected``) and the parameter count.

    Examples
    --------
    >>> r = ag.neuromanifold_dimension((3, 2), (2,), n_samples=20, n_draws=2)
    >>> r.dims, r.expected, r.parameters
    (array([13, 13]), 13, 18)
    """
    softmax = network_kind(kind) == "softmax"
    d, a = _dims(d, a)
    t, n_samples = count("t", t), count("n_samples", n_samples)
    n_draws = count("n_draws", n_draws, 1, 100_000)  # each draw is one Jacobian and its SVD
    check_size("n_samples, t", n_samples * t * d[-1] * sum(2 * a[i] * d[i] + d[i + 1] * d[i] for i in range(len(a))))
    check_size("t", (len(a) + 3) * t * t * _core.get_num_threads())  # parametrization_jacobian's working set
    rng = generator(seed)
    dims, gaps, spectra = [], [], []
    for _ in range(n_draws):
        weights = random_weights(d, a, seed=rng.integers(2 ** 63))
        X = rng.standard_normal((n_samples, t, d[0]))
        J = parametrization_jacobian(weights, X, kind=kind, temperature=temperature)
        r, s, g = numerical_rank(J, block_rows=t * d[-1])
        dims.append(r)
        gaps.append(g)
        spectra.append(s)
    try:
        expected = expected_dimension(d, a, kind)
    except ValueError:
        expected = None
    k = min(len(s) for s in spectra)
    return DimensionResult(tuple(d), tuple(a), "softmax" if softmax else "lightning", t, n_samples,
                           np.array(dims), np.array(gaps), np.array([s[:k] for s in spectra]), expected,
                           parameter_count(d, a))


# -- fibers and symmetries (s.3.1, s.3.3, Lemma 3.1, Theorem 3.2, eq. 9-14) ----------------
def _layers(As, Vs, d0=None, names=("As", "Vs")):
    na, nv = names
    As, Vs = sequence(na, As), sequence(nv, Vs)
    if len(As) != len(Vs):
        raise ValueError(f"{na} and {nv} must be non-empty sequences of equal length, got {len(As)} and {len(Vs)}")
    As = [operand(f"{na}[{i}]", A, "(d, d)", nonempty=False, dtype=np.float64) for i, A in enumerate(As)]
    Vs = [operand(f"{nv}[{i}]", V, "(d', d)", nonempty=False, dtype=np.float64) for i, V in enumerate(Vs)]
    width = As[0].shape[-1] if d0 is None else d0
    for i, (A, V) in enumerate(zip(As, Vs)):
        if A.shape != (width, width):
            raise ValueError(f"{na}[{i}] must have shape ({width}, {width}), got {A.shape}")
        if V.ndim != 2 or V.shape[1] != width:
            raise ValueError(f"{nv}[{i}] must have shape (d_{i + 1}, {width}), got {V.shape}")
        width = V.shape[0]
    return As, Vs


@finite_result
def virtual_weights(As, Vs):
    """Virtual weights (M, L) of eq. 9: L_i = V_i ... V_1, M_i = L_{i-1}^T A_i L_{i-1}, L = L_l.

    Henry, Marchetti & Kohn s.3.3. The deep lightning network depends on (A, V) only through
    (M, L) (Lemma 3.12), so the GL transformations of eq. 10 (:func:`gl_transform`) do not
    change it.

    Parameters
    ----------
    As : sequence of array_like
        Attention matrices A_i = K_i^T Q_i, each of shape (d_{i-1}, d_{i-1}).
    Vs : sequence of array_like
        Value matrices V_i, each of shape (d_i, d_{i-1}).

    Returns
    -------
    Ms : list of ndarray
        M_i, each of shape (d_0, d_0).
    L : ndarray, shape (d_l, d_0)
        The product V_l ... V_1.

    Examples
    --------
    >>> Ms, L = ag.virtual_weights([np.eye(3), np.eye(2)], [np.ones((2, 3)), np.ones((1, 2))])
    >>> [M.shape for M in Ms], L
    ([(3, 3), (3, 3)], array([[2., 2., 2.]]))
    """
    As, Vs = _layers(As, Vs)
    L = np.eye(As[0].shape[0])
    Ms = []
    for A, V in zip(As, Vs):
        Ms.append(L.T @ A @ L)
        L = V @ L
    return Ms, L


@finite_result
def virtual_network(Ms, L, X):
    """phi(X) from virtual weights by Lemma 3.12 (eq. 11-12), tokens as columns X (d_0, t).

    Henry, Marchetti & Kohn: D_0 = I, D_i = D_{i-1} X^T M_i X D_{i-1} X^T M_i^T X D_{i-1};
    phi(X) = L X prod_{1 <= i <= l} D_{l-i} X^T M_{l-i+1} X.

    Parameters
    ----------
    Ms : sequence of array_like
        M_1 .. M_l, each (d_0, d_0), from :func:`virtual_weights`.
    L : array_like, shape (d_l, d_0)
        The product of the value matrices.
    X : array_like, shape (d_0, t)
        One input, tokens as columns (the paper's convention).

    Returns
    -------
    ndarray, shape (d_l, t)
        phi(X), tokens as columns.

    Examples
    --------
    >>> w = ag.random_weights((3, 2), (2,))
    >>> As, Vs = [K.T @ Q for Q, K, V in w], [V for Q, K, V in w]
    >>> X = np.random.default_rng(0).standard_normal((5, 3))
    >>> phi = ag.virtual_network(*ag.virtual_weights(As, Vs), X.T)
    >>> bool(np.allclose(phi.T, ag.network_forward(w, X)[0]))
    True
    """
    X = operand("X", X, "(d_0, t)", ndim=2, dtype=np.float64)
    d0 = X.shape[0]
    Ms = [operand(f"Ms[{i}]", M, f"({d0}, {d0})", ndim=2, dtype=np.float64) for i, M in enumerate(sequence("Ms", Ms))]
    for i, M in enumerate(Ms):
        if M.shape != (d0, d0):
            raise ValueError(f"Ms[{i}] must have shape ({d0}, {d0}) (d_0 from X), got {M.shape}")
    L = operand("L", L, f"(d_l, {d0})", ndim=2, dtype=np.float64)
    if L.shape[1] != d0:
        raise ValueError(f"L must have shape (d_l, {d0}) (d_0 from X), got {L.shape}")
    l = len(Ms)
    D = [np.eye(X.shape[1])]
    for i in range(1, l + 1):
        G, Gt = X.T @ Ms[i - 1] @ X, X.T @ Ms[i - 1].T @ X
        D.append(D[i - 1] @ G @ D[i - 1] @ Gt @ D[i - 1])
    out = L @ X
    for i in range(1, l + 1):
        out = out @ D[l - i] @ (X.T @ Ms[l - i] @ X)
    return out


@finite_result
def gl_transform(As, Vs, Cs):
    """The symmetry of eq. 10: V_i' = C_i V_i C_{i-1}^{-1}, A_{i+1}' = C_i^{-T} A_{i+1} C_i^{-1}.

    Henry, Marchetti & Kohn s.3.3: a deep lightning network is unchanged (its fiber).

    Parameters
    ----------
    As : sequence of array_like
        A_1 .. A_l, A_i of shape (d_{i-1}, d_{i-1}).
    Vs : sequence of array_like
        V_1 .. V_l, V_i of shape (d_i, d_{i-1}).
    Cs : sequence of array_like
        C_1 .. C_{l-1}, C_i invertible of shape (d_i, d_i); C_0 = C_l = I.

    Returns
    -------
    As2, Vs2 : list of ndarray
        The transformed weights.

    Examples
    --------
    >>> w = ag.random_weights((3, 3, 2), (2, 2))
    >>> As, Vs = [K.T @ Q for Q, K, V in w], [V for Q, K, V in w]
    >>> moved = ag.gl_transform(As, Vs, [np.diag([1.0, 2.0, 3.0])])
    >>> X = np.random.default_rng(0).standard_normal((4, 5, 3))
    >>> ag.function_discrepancy((As, Vs), moved, X) < 1e-12
    True
    """
    As, Vs = _layers(As, Vs)
    l = len(As)
    if len(Cs) != l - 1:
        raise ValueError(f"Cs must hold l - 1 = {l - 1} matrices C_1..C_(l-1), got {len(Cs)}")
    dims = [V.shape[0] for V in Vs]
    C = [np.eye(As[0].shape[0])] + [operand(f"Cs[{i}]", c, "(d_i, d_i)", dtype=np.float64) for i, c in enumerate(Cs)]
    C.append(np.eye(dims[-1]))
    for i in range(1, l):
        if C[i].shape != (dims[i - 1], dims[i - 1]):
            raise ValueError(f"Cs[{i - 1}] must have shape ({dims[i - 1]}, {dims[i - 1]}), got {C[i].shape}")
    new_V = [C[i + 1] @ Vs[i] @ np.linalg.inv(C[i]) for i in range(l)]
    new_A = [As[0]] + [np.linalg.inv(C[i]).T @ As[i] @ np.linalg.inv(C[i]) for i in range(1, l)]
    return new_A, new_V


def _power_split(x: float, p: int) -> tuple:
    """x^p (x > 0, p >= 0) as (mantissa in [0.5, 1), exponent), by squaring with every product
    renormalised: no overflow or underflow whatever x^p is."""
    base, base_e = math.frexp(x)
    mant, expo = 1.0, 0
    while p:
        if p & 1:
            mant, e = math.frexp(mant * base)
            expo += base_e + e
        base, e = math.frexp(base * base)
        base_e = 2 * base_e + e
        p >>= 1
    return math.frexp(mant)[0], expo + math.frexp(mant)[1]


@finite_result
def rescale(As, Vs, lambdas):
    """A point of the rescaling fiber (eq. 14) of a deep attention network.

    Henry, Marchetti & Kohn: A_i -> lambda_i A_i and V_l -> rho V_l with
    rho = 1 / prod_i lambda_i^(3^(l-i)). For lightning networks phi is unchanged; for softmax
    networks it changes (Theorem 3.15: no rescaling fiber).

    Parameters
    ----------
    As : sequence of array_like
        A_1 .. A_l.
    Vs : sequence of array_like
        V_1 .. V_l.
    lambdas : sequence of float
        One nonzero factor per layer.

    Returns
    -------
    As2, Vs2 : list of ndarray
        The rescaled weights.

    Examples
    --------
    >>> w = ag.random_weights((3, 2), (2,))
    >>> As, Vs = [K.T @ Q for Q, K, V in w], [V for Q, K, V in w]
    >>> X = np.random.default_rng(0).standard_normal((4, 5, 3))
    >>> ag.function_discrepancy((As, Vs), ag.rescale(As, Vs, [2.0]), X) < 1e-12
    True
    """
    As, Vs = _layers(As, Vs)
    l = len(As)
    lam = [scalar(f"lambdas[{i}]", x) for i, x in enumerate(lambdas)]
    if len(lam) != l or any(x == 0 for x in lam):
        raise ValueError(f"lambdas must hold {l} nonzero numbers, got {lambdas}")
    # rho = 1 / prod_i lam_i^(3^(l-1-i)), as mantissa and binary exponent (frexp) so that no
    # power overflows when rho itself does not; every power of 3 is odd, so rho has the sign
    # of prod_i lam_i.
    mant, expo = 1.0, 0
    for i, x in enumerate(lam):
        m, e = _power_split(abs(x), 3 ** (l - 1 - i))
        mant, e2 = math.frexp(mant * m)
        expo += e + e2
    inv, e3 = math.frexp(1.0 / mant)
    expo = e3 - expo
    if not np.finfo(np.float64).minexp <= expo <= np.finfo(np.float64).maxexp:
        raise ValueError(f"lambdas {lam} make the last layer's factor rho = 2^{expo} leave the float range; "
                         "choose factors nearer 1")
    rho = math.copysign(math.ldexp(inv, expo), math.prod(math.copysign(1.0, x) for x in lam))
    return [x * A for x, A in zip(lam, As)], Vs[:-1] + [rho * Vs[-1]]


@finite_result
@_fill_doc
def function_discrepancy(first, second, X, *, kind="lightning", temperature=1.0) -> float:
    """Relative distance max ``|phi_W(X) - phi_W'(X)|`` / max ``|phi_W(X)|`` of two networks.

    Henry, Marchetti & Kohn s.3.3: about 1e-15 when W and W' lie in one fiber (eq. 10, 14).

    Parameters
    ----------
    first, second : tuple (As, Vs)
        The two networks, as sequences of A_i and V_i.
    X : array_like, shape (N, t, d_0)
        Samples, tokens as rows.
    %(network_kind)s

    Returns
    -------
    float
        The relative discrepancy.

    Examples
    --------
    >>> A, V = [np.eye(2)], [np.eye(2)]
    >>> X = np.ones((1, 3, 2))
    >>> ag.function_discrepancy((A, V), ([2 * np.eye(2)], V), X)  # phi is linear in A
    1.0
    """
    kw = dict(kind=network_kind(kind), temperature=temperature)
    (A1, V1), (A2, V2) = sequence("first", first, length=2), sequence("second", second, length=2)
    A1, V1 = _layers(A1, V1, names=("first[0]", "first[1]"))
    A2, V2 = _layers(A2, V2, names=("second[0]", "second[1]"))
    x = _samples(X, np.shape(A1[0])[0])
    y1, y2 = deep_lightning(x, A1, V1, **kw), deep_lightning(x, A2, V2, **kw)
    return float(np.max(np.abs(y1 - y2)) / max(float(np.max(np.abs(y1))), np.finfo(float).tiny))


@dataclass
class CriticalPoint:
    """Jacobian rank of one layer at (A, V) against the generic rank (Lemma 3.7, Cor. 3.8)."""

    critical: bool
    rank: int
    generic_rank: int
    gap_ratio: float


@finite_result
def is_critical(A, V, *, kind="lightning", t=3, n_samples=50, seed=0) -> CriticalPoint:
    """Whether the single-layer parametrization (A, V) -> phi is critical at (A, V).

    Henry, Marchetti & Kohn, Lemma 3.7 and Corollary 3.8. The Jacobian of (A, V) -> phi_(A,V)
    restricted to n_samples random inputs is computed through the (Q, K, V) Jacobian at Q = I,
    K = A^T (a = d): there (Q, K) -> K^T Q is a submersion, so both Jacobians have the same
    rank. The point is critical when that rank is below the generic one: d^2 + d d' - 1 for
    lightning (Corollary 3.3 with a = d) and d^2 + d d' for softmax. For lightning the points
    with rk(A) rk(V) <= 1 are exactly the singular ones.

    Parameters
    ----------
    A : array_like, shape (d, d)
        The attention matrix.
    V : array_like, shape (d', d)
        The value matrix.
    kind : {"lightning", "softmax"}, default "lightning"
        Network kind.
    t : int, default 3
        Tokens per sample.
    n_samples : int, default 50
        Number of random inputs.
    seed : int, default 0
        Seed of the NumPy generator.

    Returns
    -------
    CriticalPoint
        ``critical``, the rank, the generic rank and the gap ratio.

    Examples
    --------
    >>> A, V = np.outer([1.0, 0, 0], [1.0, 0, 0]), np.outer([1.0, 0], [1.0, 0, 0])  # rank 1 each
    >>> p = ag.is_critical(A, V)
    >>> p.critical, p.rank, p.generic_rank
    (True, 12, 14)
    """
    A = operand("A", A, "(d, d)", nonempty=False, dtype=np.float64)
    V = operand("V", V, "(d', d)", nonempty=False, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise ValueError(f"A must have shape (d, d) with d >= 2, got {A.shape}")
    d = A.shape[0]
    if V.ndim != 2 or V.shape[1] != d or V.shape[0] < 1:
        raise ValueError(f"V must have shape (d', {d}), got {V.shape}")
    t, n_samples = count("t", t), count("n_samples", n_samples)
    check_size("n_samples, t", n_samples * t * V.shape[0] * (2 * d * d + V.shape[0] * d))
    X = generator(seed).standard_normal((n_samples, t, d))
    J = parametrization_jacobian([(np.eye(d), A.T.copy(), V)], X, kind=kind)
    r, _, gap = numerical_rank(J, block_rows=t * V.shape[0])
    generic = expected_dimension((d, V.shape[0]), (d,), kind)
    return CriticalPoint(r < generic, r, generic, gap)
