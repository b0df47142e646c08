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
                   ag.deep_lightning(X, As, Vs, normalize=True, temperature=0.7)) <= 1e-13
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
        assert np.all(r.gap_ratios > 1e4)  # at least four decades between sigma_r and sigma_{r+1}
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
    with pytest.raises(ValueError, match="a must hold"):
        ag.random_weights((3, 3), (0,))
