"""The inverse Laplace step (Laplace-Radon s.9): exponential sums, projected densities, and the
normalisation obstacle. Point sets and key recovery are in test_point_sets.py."""
import numpy as np
import pytest

import attngeom as ag
import reference as ref
from conftest import rel_err


def spread_nodes(rng, n, sep=0.05):
    """n sorted nodes uniform on [-1, 1], at least `sep` apart."""
    for _ in range(10000):
        s = np.sort(rng.uniform(-1, 1, n))
        if n == 1 or np.diff(s).min() > sep:
            return s
    raise RuntimeError("no node set")


def imaginary_samples(s, weights=None, N=128, step=2.5):
    tau = 1j * step * np.arange(N)
    w = np.ones(len(s)) if weights is None else weights
    return tau, np.exp(np.outer(tau, s)) @ w


# -- exponential sums ------------------------------------------------------------------------
@pytest.mark.parametrize("n, tol", [(1, 1e-10), (4, 1e-10), (16, 1e-10), (24, 1e-10), (32, 1e-8)])
def test_imaginary_tau_recovers_nodes(rng, n, tol):
    s = spread_nodes(rng, n, sep=1e-3)  # close nodes included: weights of nearer pairs are ill-determined
    w = rng.uniform(0.5, 2.0, n)
    tau, f = imaginary_samples(s, w)
    fit = ag.fit_exponential_sum(tau, f)
    assert fit.order == n
    assert np.max(np.abs(fit.nodes - s)) <= tol
    assert np.max(np.abs(fit.weights - w)) <= 100 * tol
    assert fit.residual <= 1e-10


@pytest.mark.parametrize("n", [2, 4, 6])
def test_real_tau_recovers_up_to_six_nodes(rng, n):
    for _ in range(3):
        s = spread_nodes(rng, n, sep=0.1)
        tau = np.linspace(-10, 10, 64)
        fit = ag.fit_exponential_sum(tau, np.exp(np.outer(tau, s)).sum(1))
        assert fit.order == n
        assert np.max(np.abs(fit.nodes - s)) <= 1e-7


def test_against_numpy_pencil(rng):
    s = spread_nodes(rng, 6)
    tau, f = imaginary_samples(s, N=40)
    L = 20
    z_ref = ref.matrix_pencil(f, L, 6)
    s_ref = np.sort(np.angle(z_ref) / 2.5)
    fit = ag.fit_exponential_sum(tau, f, order=6, pencil=L)
    assert np.max(np.abs(fit.nodes - s_ref)) <= 1e-10


def test_vector_values_and_multiplicities(rng):
    keys_s = spread_nodes(rng, 5)
    s = np.concatenate([keys_s, keys_s[:2]])  # two repeated keys
    v = rng.standard_normal((5, 3))
    v_all = np.concatenate([v, v[:2]])
    tau = 1j * 2.5 * np.arange(48)
    E = np.exp(np.outer(tau, s))
    Z, N = E.sum(1), E @ v_all
    fit = ag.fit_exponential_sum(tau, np.concatenate([Z[:, None], N], axis=1), vector=True)
    assert fit.order == 5 and fit.weights.shape == (5, 4)
    order = np.argsort(keys_s)
    mult = np.array([2, 2, 1, 1, 1])[order]
    assert np.max(np.abs(fit.nodes - keys_s[order])) <= 1e-10
    assert np.max(np.abs(fit.weights[:, 0] - mult)) <= 1e-9
    assert np.max(np.abs(fit.weights[:, 1:] / fit.weights[:, :1] - v[order])) <= 1e-9


@pytest.mark.parametrize("eta", [1e-6, 1e-3])
def test_noise_never_invents_nodes(rng, eta):
    errors = []
    for _ in range(10):
        s = spread_nodes(rng, 8)
        tau, f = imaginary_samples(s)
        noise = (rng.standard_normal(f.shape) + 1j * rng.standard_normal(f.shape)) / np.sqrt(2)
        fit = ag.fit_exponential_sum(tau, f + eta * np.linalg.norm(f) / np.sqrt(f.size) * noise)
        assert fit.order == 8  # neither invented nor lost
        errors.append(np.max(np.abs(fit.nodes - s)))
    assert max(errors) <= 0.05 * eta  # measured about 6e-3 eta
    assert max(errors) >= 1e-4 * eta  # and the noise does show: the fit is not exact by accident


def test_batched_with_different_orders(rng):
    tau = 1j * 2.5 * np.arange(40)
    s1, s2 = spread_nodes(rng, 3), spread_nodes(rng, 6)
    f = np.stack([np.exp(np.outer(tau, s1)).sum(1), np.exp(np.outer(tau, s2)).sum(1)])[:, None, :]  # (2, 1, N)
    fit = ag.fit_exponential_sum(tau, f)
    assert fit.nodes.shape == (2, 1, 6) and fit.order.tolist() == [[3], [6]]
    assert np.all(np.isnan(fit.nodes[0, 0, 3:])) and np.all(fit.weights[0, 0, 3:] == 0)
    assert np.max(np.abs(fit.nodes[0, 0, :3] - s1)) <= 1e-10 and np.max(np.abs(fit.nodes[1, 0] - s2)) <= 1e-10


def test_rtol_counts_singular_values(rng):
    s = spread_nodes(rng, 4)
    tau, f = imaginary_samples(s, weights=np.array([1, 1, 1, 1e-9]), N=40)
    assert ag.fit_exponential_sum(tau, f, rtol=1e-6).order == 3  # the tiny weight sits below rtol
    assert ag.fit_exponential_sum(tau, f).order == 3  # the largest gap: 1 -> 1e-9, a noise-like node
    fit = ag.fit_exponential_sum(tau, f, rtol=1e-12)
    assert fit.order == 4 and np.max(np.abs(fit.nodes - s)) <= 1e-6


def test_threads_agree(rng):
    tau = 1j * 2.5 * np.arange(64)
    f = np.stack([np.exp(np.outer(tau, spread_nodes(rng, 10))).sum(1) for _ in range(9)])
    old = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.fit_exponential_sum(tau, f)
        ag.set_num_threads(2)
        two = ag.fit_exponential_sum(tau, f)
    finally:
        ag.set_num_threads(old)
    assert np.array_equal(one.order, two.order) and rel_err(one.nodes, two.nodes) <= 1e-12


def test_exponential_sum_bad_input():
    tau = 1j * np.arange(10.0)
    f = np.ones(10, complex)
    with pytest.raises(ValueError, match="uniformly spaced"):
        ag.fit_exponential_sum(np.array([0, 1, 3, 4.0]), np.ones(4))
    with pytest.raises(ValueError, match="purely imaginary"):
        ag.fit_exponential_sum((1 + 1j) * np.arange(10.0) + 1, f)
    with pytest.raises(ValueError, match="tau must have shape"):
        ag.fit_exponential_sum(np.zeros((2, 5)), f)
    with pytest.raises(ValueError, match="values"):
        ag.fit_exponential_sum(tau, np.ones(7))
    with pytest.raises(ValueError, match="NaN"):
        ag.fit_exponential_sum(tau, np.full(10, np.nan))
    with pytest.raises(ValueError, match="order"):
        ag.fit_exponential_sum(tau, f, order=9)
    with pytest.raises(ValueError, match="rtol"):
        ag.fit_exponential_sum(tau, f, rtol=-1)
    with pytest.raises(ValueError, match="pencil"):
        ag.fit_exponential_sum(tau, f, pencil=9)
    with pytest.raises(TypeError, match="values"):
        ag.fit_exponential_sum(tau, np.array(["a"] * 10))


# -- projected densities -------------------------------------------------------------------------
TAU = np.linspace(-10, 10, 81)
TAU = np.where(TAU == 0, 1e-12, TAU)  # sinh(tau)/tau at 0 by continuity


@pytest.mark.parametrize("eta, bound", [(0.0, 0.02), (1e-3, 0.1)])
def test_uniform_density(rng, eta, bound):
    s = np.linspace(-2, 2, 201)
    Z = np.sinh(TAU) / TAU * (1 + eta * rng.standard_normal(TAU.shape))
    fit = ag.invert_laplace_density(TAU, Z, s)
    truth = np.where(np.abs(s) <= 1, 0.5, 0.0)
    assert ag.wasserstein1(s, fit.density, truth) < bound
    assert np.all(fit.density >= 0) and abs(fit.mass - 1) < 0.01


@pytest.mark.parametrize("eta, bound", [(0.0, 0.01), (1e-3, 0.05)])
def test_gaussian_density(rng, eta, bound):
    s = np.linspace(-4, 4, 201)
    Z = np.exp(TAU ** 2 / 8) * (1 + eta * rng.standard_normal(TAU.shape))
    fit = ag.invert_laplace_density(TAU, Z, s)
    truth = np.exp(-s ** 2 / 0.5) / np.sqrt(0.5 * np.pi)
    assert ag.wasserstein1(s, fit.density, truth) < bound


def test_nnls_against_scipy(rng):
    optimize = pytest.importorskip("scipy.optimize")
    from attngeom import _core

    for shape in [(60, 40), (30, 50)]:
        A = rng.standard_normal(shape)
        b = rng.standard_normal(shape[0])
        x, it = _core.nnls(A, b, 1000)
        assert it > 0 and np.all(x >= 0)
        assert np.max(np.abs(x - optimize.nnls(A, b)[0])) <= 1e-10


def test_density_bad_input():
    s = np.linspace(-2, 2, 21)
    with pytest.raises(ValueError, match="Z must be positive"):
        ag.invert_laplace_density(TAU, -np.ones_like(TAU), s)
    with pytest.raises(ValueError, match="s_grid"):
        ag.invert_laplace_density(TAU, np.ones_like(TAU), s[::-1])
    with pytest.raises(ValueError, match="regularization"):
        ag.invert_laplace_density(TAU, np.ones_like(TAU), s, regularization=-1)
    with pytest.raises(ValueError, match="Z must have the shape"):
        ag.invert_laplace_density(TAU, np.ones(3), s)
    with pytest.raises(ValueError, match="NaN"):
        ag.invert_laplace_density(TAU, np.full_like(TAU, np.nan), s)


def test_normalisation_obstacle(rng):
    """y = N / Z does not identify Z and N (s.9.3): two different measures agree on y at a
    set of probes while Z differs."""
    n, d, dv, p = 6, 4, 3, 5
    k, v = rng.standard_normal((n, d)), rng.standard_normal((n, dv))
    q = rng.standard_normal((p, d))
    u, tau = ag.tilt_radius(q, scale=1.0)
    # (a) the measure doubled: every probe agrees, Z doubles
    y1 = ag.laplace_radon_attention(u, tau, k, v)
    y2 = ag.laplace_radon_attention(u, tau, np.concatenate([k, k]), np.concatenate([v, v]))
    assert rel_err(y2, y1) <= 1e-14
    # (b) a different support: p extra keys whose values are solved so every probe's output is kept
    extra = rng.standard_normal((p, d))
    E = np.exp(tau[:, None] * (u @ extra.T))  # (probes, extra keys)
    v_extra = np.linalg.solve(E, (E.sum(1)[:, None] * y1))  # sum_e E_je (v_e - y_j) = 0 for every probe j
    k2, vv2 = np.concatenate([k, extra]), np.concatenate([v, v_extra])
    assert rel_err(ag.laplace_radon_attention(u, tau, k2, vv2), y1) <= 1e-10
    Z1, _ = ag.laplace_radon_transform(u, tau, k, v)
    Z2, _ = ag.laplace_radon_transform(u, tau, k2, vv2)
    assert np.all(Z2 > Z1 * 1.01)  # the partition functions differ at every probe


def test_zero_pencil_eigenvalue_is_no_node():
    tau = 1j * np.arange(12.0)
    f = np.zeros(12, complex)
    f[0] = 0.1  # a lone delta sample
    fit = ag.fit_exponential_sum(tau, f)
    # No node is found and nothing is padded: a single problem's nodes are all finite.
    assert fit.order == 0 and fit.nodes.shape == (0,) and fit.weights.shape == (0,)
    g = np.exp(tau * 0.5j)
    g[0] += 0.1  # one exponential and the delta: one node, no padding
    fit = ag.fit_exponential_sum(tau, g)
    assert fit.order == 1 and fit.nodes.shape == (1,) and np.all(np.isfinite(fit.nodes))


def test_density_overflow_is_reported():
    tau = np.linspace(-300, 300, 40)  # Z up to 3e127: formed in the log domain, no overflow
    Z = np.sinh(tau) / tau
    fit = ag.invert_laplace_density(tau, Z, np.linspace(-3, 3, 61))
    assert np.isfinite(fit.mass) and fit.mass > 0
    with pytest.raises(ValueError, match="overflows"):
        ag.invert_laplace_density(tau, Z, np.linspace(-30, 30, 61))
    with pytest.raises(ValueError, match="non-negative density"):
        ag.wasserstein1(np.linspace(0, 1, 3), np.zeros(3), np.ones(3))


def test_nnls_is_scale_free(rng):
    optimize = pytest.importorskip("scipy.optimize")
    from attngeom import _core

    A, b = rng.standard_normal((30, 20)), rng.standard_normal(30)
    for sa, sb in [(1e8, 1.0), (1.0, 1e-14), (1e-6, 1e6)]:
        x, it = _core.nnls(np.ascontiguousarray(A * sa), b * sb, 2000)
        ref_x = optimize.nnls(A * sa, b * sb)[0]
        assert it > 0 and np.max(np.abs(x - ref_x)) <= 1e-9 * np.abs(ref_x).max()




def test_float32_grid_is_uniform_to_its_precision():
    """A float32 linspace is uniform only to float32 rounding: accepted, and the node comes
    back to about that precision."""
    tau = np.linspace(0, 1, 21, dtype=np.float32)
    fit = ag.fit_exponential_sum(tau, np.exp(0.5 * tau.astype(float)), order=1)
    assert fit.order == 1 and abs(fit.nodes[0] - 0.5) < 1e-6
