"""Neuromanifold dimension (Henry-Marchetti-Kohn s.3): exact Jacobians, closed forms, Figure 4."""
import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag


def central_differences(weights, X, kind, h=1e-5):
    flat = [w for triple in weights for w in triple]
    cols = []
    for w in flat:
        for idx in np.ndindex(*w.shape):
            old = w[idx]
            w[idx] = old + h
            plus = ag.network_forward(weights, X, kind=kind)
            w[idx] = old - h
            minus = ag.network_forward(weights, X, kind=kind)
            w[idx] = old
            cols.append(((plus - minus) / (2 * h)).ravel())
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("kind", ["lightning", "softmax"])
def test_jacobian_against_finite_differences(rng, kind):
    d, a = (3, 4, 2, 3), (2, 1, 3)
    weights = ag.random_weights(d, a, seed=3)
    X = rng.standard_normal((4, 3, 3))
    J = ag.parametrization_jacobian(weights, X, kind=kind)
    assert J.shape == (4 * 3 * 3, ag.parameter_count(d, a))
    assert rel_err(J, central_differences(weights, X, kind)) <= 1e-8


def test_forward_is_the_deep_network(rng):
    d, a = (4, 3, 5), (2, 3)
    weights = ag.random_weights(d, a, seed=1)
    X = rng.standard_normal((6, 5, 4))
    As = [K.T @ Q for Q, K, _ in weights]
    Vs = [V for _, _, V in weights]
    assert rel_err(ag.network_forward(weights, X), ag.deep_lightning(X, As, Vs)) <= 1e-13
    assert rel_err(ag.network_forward(weights, X, kind="softmax", temperature=0.7),
                   ag.deep_lightning(X, As, Vs, kind="softmax", temperature=0.7)) <= 1e-13
    # the Jacobian is linear in each layer's V: phi is trilinear in (Q, K, V) per layer
    J = ag.parametrization_jacobian(weights[:1], X)
    P = ag.parameter_count(d[:2], a[:1])
    v_cols = slice(P - d[1] * d[0], P)
    flat_v = weights[0][2].ravel()
    np.testing.assert_allclose(J[:, v_cols] @ flat_v, ag.network_forward(weights[:1], X).ravel(), rtol=1e-12,
                               atol=1e-12)


FIGURE_4 = {"softmax": [37, 52, 61, 64], "lightning": [34, 49, 58, 61]}


@pytest.mark.parametrize("kind", ["softmax", "lightning"])
def test_figure_4(kind):
    for a, want in zip((1, 2, 3, 4), FIGURE_4[kind]):
        r = ag.neuromanifold_dimension((4, 4, 4, 4), (a, a, a), kind=kind, t=3, n_samples=100, n_draws=5)
        assert r.dims.tolist() == [want] * 5, (kind, a, r.dims)
        assert np.all(r.gap_ratios > 1e4) and r.reliable  # four decades between sigma_r and sigma_{r+1}
        assert r.parameters == 3 * (2 * a * 4 + 16)
        if kind == "softmax" or a >= 2:
            assert r.expected == want and r.agrees
        else:
            assert r.expected is None  # Corollary 3.14 needs a_i >= 2


def test_single_layer_grid():
    for kind in ("lightning", "softmax"):
        for d in range(2, 6):
            for dp in range(2, 6):
                for a in range(1, 7):
                    r = ag.neuromanifold_dimension((d, dp), (a,), kind=kind, n_samples=20, n_draws=2, seed=d + dp + a)
                    assert r.agrees, (kind, d, dp, a, r.dims, r.expected)


def test_expected_dimension_formulas_and_hypotheses():
    assert ag.expected_dimension((4, 3), (2,)) == 2 * 2 * 4 + 12 - 4 - 1
    assert ag.expected_dimension((4, 3), (6,)) == 16 + 12 - 1  # a > d: d^2 + d d' - 1
    assert ag.expected_dimension((4, 3), (6,), "softmax") == 28
    assert ag.expected_dimension((5, 3, 3, 6), (2, 3, 4), "lightning") == (
        2 * 2 * 5 - 4 + 3 * 11 - 9 - 3 + (2 * 3 * 3 - 9) + (2 * 3 * 3 - 9))
    with pytest.raises(ValueError, match="bottleneck"):
        ag.expected_dimension((4, 3, 5, 4), (2, 2, 2))
    with pytest.raises(ValueError, match="d_0, d_l >= delta"):
        ag.expected_dimension((2, 4, 4), (2, 2))
    with pytest.raises(ValueError, match="a_i >= 2"):
        ag.expected_dimension((4, 4, 4), (1, 2))
    with pytest.raises(ValueError, match="Corollary 3.3"):
        ag.expected_dimension((1, 3), (2,))
    with pytest.raises(ValueError, match="len\\(d\\)"):
        ag.expected_dimension((4, 4), (2, 2))
    with pytest.raises(ValueError, match="kind"):
        ag.expected_dimension((4, 4), (2,), "relu")


def test_numerical_rank_known():
    rng = np.random.default_rng(0)
    J = rng.standard_normal((60, 7)) @ rng.standard_normal((7, 12))
    r, s, gap = ag.numerical_rank(J, block_rows=6)
    assert r == 7 and s.shape == (12,) and gap > 1e8
    r, _, _ = ag.numerical_rank(rng.standard_normal((30, 5)))
    assert r == 5  # full column rank: the gap to the noise floor
    assert ag.numerical_rank(np.zeros((4, 3)))[0] == 0


def test_bad_input(rng):
    with pytest.raises(ValueError, match="X must have shape"):
        ag.parametrization_jacobian(ag.random_weights((3, 2), (1,)), rng.standard_normal((2, 3, 4)))
    with pytest.raises(ValueError, match="weights\\[1\\]"):
        ag.network_forward([(np.ones((1, 3)), np.ones((1, 3)), np.ones((2, 3))),
                            (np.ones((1, 3)), np.ones((1, 3)), np.ones((2, 3)))], np.ones((1, 2, 3)))
    with pytest.raises(ValueError, match="weights\\[0\\].Q contains NaN"):
        ag.network_forward([(np.full((1, 3), np.nan), np.ones((1, 3)), np.ones((2, 3)))], np.ones((1, 2, 3)))
    with pytest.raises(ValueError, match="n_samples"):
        ag.neuromanifold_dimension((3, 3), (1,), n_samples=0)
    with pytest.raises(ValueError, match="temperature"):
        ag.network_forward(ag.random_weights((3, 2), (1,)), np.ones((1, 2, 3)), kind="softmax", temperature=0)
    with pytest.raises(ValueError, match="a\\[0\\] must be an integer >= 1"):
        ag.random_weights((3, 3), (0,))


def deep_net(rng, d=(5, 3, 3, 6)):
    As = [rng.standard_normal((d[i], d[i])) for i in range(len(d) - 1)]
    Vs = [rng.standard_normal((d[i + 1], d[i])) for i in range(len(d) - 1)]
    return As, Vs


def test_virtual_weights_and_lemma_3_12(rng):
    As, Vs = deep_net(rng)
    X = rng.standard_normal((4, 5, 5))
    M, L = ag.virtual_weights(As, Vs)
    assert [m.shape for m in M] == [(5, 5)] * 3 and L.shape == (6, 5)
    np.testing.assert_allclose(M[0], As[0])
    np.testing.assert_allclose(L, Vs[2] @ Vs[1] @ Vs[0])
    y = ag.deep_lightning(X, As, Vs)
    for b in range(4):
        assert rel_err(ag.virtual_network(M, L, X[b].T), y[b].T) <= 1e-10


def test_gl_symmetry_eq_10(rng):
    As, Vs = deep_net(rng)
    X = rng.standard_normal((4, 5, 5))
    Cs = [rng.standard_normal((3, 3)) + 2 * np.eye(3) for _ in range(2)]
    A2, V2 = ag.gl_transform(As, Vs, Cs)
    assert rel_err(A2[1], As[1]) > 1e-3  # the weights do change ...
    M, L = ag.virtual_weights(As, Vs)
    M2, L2 = ag.virtual_weights(A2, V2)
    assert all(rel_err(a, b) <= 1e-12 for a, b in zip(M2, M)) and rel_err(L2, L) <= 1e-12  # ... (M, L) do not
    assert ag.function_discrepancy((As, Vs), (A2, V2), X) <= 1e-12
    assert ag.function_discrepancy((As, Vs), (A2, V2), X, kind="softmax") <= 1e-12


def test_rescaling_fiber_and_softmax_singletons(rng):
    As, Vs = deep_net(rng)
    X = rng.standard_normal((4, 5, 5))
    A3, V3 = ag.rescale(As, Vs, [2.0, -0.5, 3.0])
    assert ag.function_discrepancy((As, Vs), (A3, V3), X) <= 1e-13  # eq. 14
    assert ag.function_discrepancy((As, Vs), (A3, V3), X, kind="softmax") > 1e-2  # Theorem 3.15
    # single layer: (lambda A, V / lambda)
    A1, V1 = ag.rescale(As[:1], Vs[:1], [-4.0])
    np.testing.assert_allclose(V1[0], Vs[0] / -4.0)
    assert ag.function_discrepancy((As[:1], Vs[:1]), (A1, V1), X) <= 1e-13
    assert ag.function_discrepancy((As[:1], Vs[:1]), (A1, V1), X, kind="softmax") > 1e-2


def test_rank_one_swap_and_gl_a(rng):
    d, dp = 4, 3
    k, q, v = rng.standard_normal((3, d))
    h = rng.standard_normal(dp)
    X = rng.standard_normal((5, 3, d))
    W = ([np.outer(k, q)], [np.outer(h, v)])
    W_swap = ([np.outer(v, q)], [np.outer(h, k)])
    assert ag.function_discrepancy(W, W_swap, X) <= 1e-13  # Theorem 3.2, first case
    # Lemma 3.1: (Q, K) -> (G Q, G^{-T} K) keeps A = K^T Q, so phi, for both kinds
    Q, K, V = ag.random_weights((d, dp), (2,), seed=4)[0]
    G = rng.standard_normal((2, 2)) + 2 * np.eye(2)
    Xs = rng.standard_normal((5, 3, d))
    for kind in ("lightning", "softmax"):
        y = ag.network_forward([(Q, K, V)], Xs, kind=kind)
        y2 = ag.network_forward([(G @ Q, np.linalg.inv(G).T @ K, V)], Xs, kind=kind)
        assert rel_err(y2, y) <= 1e-13


def test_critical_points_lemma_3_7(rng):
    d, dp = 4, 3
    k, q = rng.standard_normal((2, d))
    h = rng.standard_normal(dp)
    singular = ag.is_critical(np.outer(k, q), np.outer(h, k))  # A = k (x) q, V = h (x) k
    assert singular.critical and singular.rank < singular.generic_rank == d * d + d * dp - 1
    generic = ag.is_critical(rng.standard_normal((d, d)), rng.standard_normal((dp, d)))
    assert not generic.critical and generic.rank == generic.generic_rank
    # rank-1 A with a generic V: rk(A) rk(V) = dp > 1, not singular
    assert not ag.is_critical(np.outer(k, q), rng.standard_normal((dp, d))).critical
    with pytest.raises(ValueError, match="A must have shape"):
        ag.is_critical(np.ones((3, 4)), np.ones((2, 3)))


def test_fiber_helper_errors(rng):
    As, Vs = deep_net(rng)
    with pytest.raises(ValueError, match="Cs must hold"):
        ag.gl_transform(As, Vs, [np.eye(3)])
    with pytest.raises(ValueError, match="lambdas"):
        ag.rescale(As, Vs, [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="As\\[1\\]"):
        ag.virtual_weights([As[0], np.eye(4)], Vs[:2])


@pytest.mark.parametrize("size", [1e-310, 1e-300, 1.0, 1e300])
def test_numerical_rank_does_not_depend_on_scale(size):
    """The rank of diag(1, 1, 0) at any size: the floor eps sigma_0 used to underflow for a
    subnormal J (rank 3, gap NaN)."""
    r = ag.numerical_rank(np.diag([1.0, 1.0, 0.0]) * size)
    assert r.rank == 2 and r.gap_ratio > 1e15 and np.isfinite(r.gap_ratio)
