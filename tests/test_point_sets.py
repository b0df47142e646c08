"""Point sets from their projections and key recovery (Laplace-Radon s.9): candidate
intersection, matching by values, limited-angle nulls, and a head's keys from Z and N."""
import numpy as np
import pytest

import attngeom as ag
from conftest import rel_err


def unit_rows(rng, m, d):
    U = rng.standard_normal((m, d))
    return U / np.linalg.norm(U, axis=1, keepdims=True)


def match_error(found, truth):
    """Largest distance after matching each found point to its nearest true point (one-to-one)."""
    dist = np.linalg.norm(found[:, None] - truth[None], axis=2)
    match = dist.argmin(1)
    assert len(np.unique(match)) == len(truth) == len(found)
    return float(dist[np.arange(len(found)), match].max())


@pytest.mark.parametrize("d, n, m", [(2, 200, 4), (3, 40, 5), (8, 8, 10)])
def test_candidate_intersection_exact(rng, d, n, m):
    X = rng.standard_normal((n, d))
    U = unit_rows(rng, m, d)
    nodes = [rng.permutation(U[j] @ X.T) for j in range(m)]
    ps = ag.reconstruct_points(U, nodes)
    assert ps.rank == d and match_error(ps.points, X) <= 1e-12


def test_near_collisions_and_multiplicity(rng):
    d, m = 3, 6
    X = rng.standard_normal((10, d))
    U = unit_rows(rng, m, d)
    # X[1] sits 1e-7 from X[0] along a direction orthogonal to u_0: their u_0 nodes nearly collide
    w = np.cross(U[0], rng.standard_normal(3))
    X[1] = X[0] + 1e-7 * w / np.linalg.norm(w)
    nodes = [U[j] @ X.T for j in range(m)]
    assert abs(nodes[0][0] - nodes[0][1]) < 1e-12
    assert match_error(ag.reconstruct_points(U, nodes, tol=1e-12).points, X) <= 1e-9
    # a repeated point: one node of weight 2 in every direction
    Y = np.concatenate([X[2:], X[2:3]])
    nodes = [np.unique(U[j] @ Y.T) for j in range(m)]
    weights = [np.array([np.sum(np.isclose(U[j] @ Y.T, s, atol=0, rtol=1e-14)) for s in nodes[j]]) for j in range(m)]
    ps = ag.reconstruct_points(U, nodes, weights=weights)
    assert len(ps.points) == 8 and sorted(ps.weights.tolist()) == [1] * 7 + [2]


def test_noisy_nodes(rng):
    d, n, m, eta = 2, 30, 8, 1e-6
    X = rng.standard_normal((n, d))
    U = unit_rows(rng, m, d)
    nodes = [U[j] @ X.T + eta * rng.standard_normal(n) for j in range(m)]
    err = match_error(ag.reconstruct_points(U, nodes, tol=10 * eta).points, X)
    assert eta / 10 <= err <= 10 * eta  # error at the noise level


def test_matching_by_values(rng):
    d, n, m = 8, 50, 10
    X, vals = rng.standard_normal((n, d)), rng.standard_normal((n, 3))
    U = unit_rows(rng, m, d)
    perms = [rng.permutation(n) for _ in range(m)]
    ps = ag.reconstruct_points(U, [U[j] @ X[p].T for j, p in enumerate(perms)],
                               values=[vals[p] for p in perms])
    order = np.argsort(perms[0])
    assert np.max(np.abs(ps.points[order] - X)) <= 1e-12 and np.max(np.abs(ps.values[order] - vals)) <= 1e-14


def test_limited_angle_null(rng):
    """Directions confined to span(U) see only P_U k; moving keys along span(U)^perp changes
    nothing the probes see (the limited-angle null of s.6.2)."""
    d, r, n = 6, 3, 12
    basis = np.linalg.qr(rng.standard_normal((d, r)))[0]
    U = unit_rows(rng, 8, r) @ basis.T  # 8 directions inside span(U)
    k, v = rng.standard_normal((n, d)), rng.standard_normal((n, 2))
    perp = (np.eye(d) - basis @ basis.T) @ rng.standard_normal((d, n))
    k_moved = k + perp.T
    tau = 1j * 0.7 * np.arange(40)
    Z1, N1 = ag.head_probe(k, v)(U, tau)
    Z2, N2 = ag.head_probe(k_moved, v)(U, tau)
    assert rel_err(Z2, Z1) <= 1e-13 and rel_err(N2, N1) <= 1e-13
    ps = ag.reconstruct_points(U, [U[j] @ k.T for j in range(len(U))])
    assert ps.rank == r
    assert match_error(ps.points, k @ basis @ basis.T) <= 1e-12  # the observed part is recovered


def test_points_bad_input(rng):
    U = unit_rows(rng, 3, 2)
    with pytest.raises(ValueError, match="directions"):
        ag.reconstruct_points(np.ones(3), [np.ones(2)] * 3)
    with pytest.raises(ValueError, match="nodes"):
        ag.reconstruct_points(U, [np.ones(2)] * 2)
    with pytest.raises(ValueError, match="NaN|infinite"):
        ag.reconstruct_points(U, [np.array([np.inf, 1.0])] * 3)
    with pytest.raises(ValueError, match="rank \\+ 1"):
        ag.reconstruct_points(U[:2], [np.ones(2)] * 2)
    with pytest.raises(ValueError, match="weights"):
        ag.reconstruct_points(U, [np.ones(2)] * 3, weights=[np.ones(3)] * 3)


def test_recover_keys_of_a_head(rng):
    n, d, dv = 16, 8, 4
    k, v = rng.standard_normal((n, d)), rng.standard_normal((n, dv))
    U = unit_rows(rng, 12, d)
    step = 2.5 / np.abs(U @ k.T).max()  # no aliasing
    head = ag.recover_keys(ag.head_probe(k, v), U, 1j * step * np.arange(64))
    dist = np.linalg.norm(head.keys[:, None] - k[None], axis=2)
    match = dist.argmin(1)
    assert len(np.unique(match)) == n
    assert np.max(np.abs(head.keys - k[match])) <= 1e-8
    assert np.max(np.abs(head.values - v[match])) <= 1e-8
    assert np.max(np.abs(head.multiplicities - 1)) <= 1e-6


def test_shared_projection_on_a_confirming_direction(rng):
    """Two points with the same projection on one direction: a node listed twice (or once with
    weight 2) must serve both."""
    U = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-0.8, 0.6]])
    X = rng.standard_normal((6, 2))
    X[1] = X[0] + 0.7 * np.array([-U[2, 1], U[2, 0]])  # same projection on u_2
    nodes = [U[j] @ X.T for j in range(4)]
    assert abs(nodes[2][0] - nodes[2][1]) < 1e-14
    assert match_error(ag.reconstruct_points(U, nodes).points, X) <= 1e-12


def test_base_choice_is_well_conditioned(rng):
    """Two nearly parallel directions first in the list: the base must not be built on them."""
    angles = np.array([0.0, 1e-3, 1.0, 2.0])
    U = np.stack([np.cos(angles), np.sin(angles)], 1)
    X = rng.standard_normal((20, 2))
    eta = 1e-6
    nodes = [U[j] @ X.T + eta * rng.standard_normal(20) for j in range(4)]
    assert match_error(ag.reconstruct_points(U, nodes, tol=10 * eta).points, X) <= 100 * eta


def test_degenerate_directions_raise(rng):
    U = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # the only confirming direction repeats a base one
    X = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match="degenerate"):
        ag.reconstruct_points(U, [U[j] @ X.T for j in range(3)])
    with pytest.warns(RuntimeWarning, match="no point"):
        U = unit_rows(rng, 4, 2)
        ag.reconstruct_points(U, [U[j] @ X.T + 1e-3 * rng.standard_normal(5) for j in range(4)])


def test_padded_fit_output_feeds_reconstruction(rng):
    """fit_exponential_sum's NaN-padded nodes and 0-padded weights pass straight through."""
    d = 2
    X = rng.standard_normal((6, d))
    U = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-0.8, 0.6]])
    X[1] = X[0] + 0.5 * np.array([-U[2, 1], U[2, 0]])  # direction 2 sees 5 distinct nodes
    S = U @ X.T
    tau = 1j * (2.5 / np.abs(S).max()) * np.arange(40)
    fit = ag.fit_exponential_sum(tau, np.exp(tau[None, :, None] * S[:, None, :]).sum(-1))
    assert fit.order.tolist() == [6, 6, 5, 6]
    ps = ag.reconstruct_points(U, fit.nodes, weights=fit.weights, tol=1e-8)
    assert match_error(ps.points, X) <= 1e-8


def test_value_matching_skips_a_direction_with_merged_nodes(rng):
    """Two keys with nearly equal projections on one direction merge there into one node;
    the other directions still identify every key."""
    d, n, m = 3, 8, 6
    X, vals = rng.standard_normal((n, d)), rng.standard_normal((n, 2))
    U = unit_rows(rng, m, d)
    nodes = [U[j] @ X.T for j in range(m)]
    values = [vals.copy() for _ in range(m)]
    # direction 2: keys 0 and 1 merged into one node carrying both (multiplicity 2)
    nodes[2] = np.concatenate([[nodes[2][0]], nodes[2][2:]])
    values[2] = np.concatenate([vals[:1] + vals[1:2], vals[2:]])
    weights = [np.ones(n) for _ in range(m)]
    weights[2] = np.concatenate([[2.0], np.ones(n - 2)])
    ps = ag.reconstruct_points(U, nodes, weights=weights, values=values)
    assert match_error(ps.points, X) <= 1e-12
