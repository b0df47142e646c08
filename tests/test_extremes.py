"""Finite inputs at the extremes of the float range: a correct finite answer or a ValueError
saying what overflows, never NaN, zeros as if every key were hidden, or a crash."""
import math
import warnings

import numpy as np
import pytest
from scipy import integrate

import attngeom as ag

RNG = np.random.default_rng(7)
Q, K, V = RNG.standard_normal((3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal((5, 2))


# --- softmax attention: logits beyond the float range are refused, large finite ones work ---

@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_softmax_logits_beyond_float64_are_refused(sign):
    q, k = np.full((1, 2, 4), 1e200), sign * np.full((1, 3, 4), 1e200)
    with pytest.raises(ValueError, match="logits scale q.k"):
        ag.softmax_attention(q, k, np.ones((1, 3, 4)))
    with pytest.raises(ValueError, match="logits scale q.k"):
        ag.softmax_attention_backward(q, k, np.ones((1, 3, 4)), np.ones((1, 2, 4)))


def test_softmax_float32_scale_beyond_float32_is_refused():
    q = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="float range"):
        ag.softmax_attention(q, q, q, scale=1e39)


def test_softmax_huge_representable_logits_give_the_argmax():
    # logits up to 1e300: every one representable, the differences enormous: P is one-hot.
    k = np.diag([1.0, 2.0, 3.0]) * 1e150
    q = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]]) * 1e150
    v = np.arange(6.0).reshape(3, 2)
    y, P, log_z = ag.softmax_attention(q, k, v, scale=1.0, return_weights=True, return_log_partition=True)
    np.testing.assert_array_equal(P, q / 1e150)  # k is diagonal: each query picks its own axis
    np.testing.assert_array_equal(y, (q / 1e150) @ v)
    np.testing.assert_allclose(log_z, [1e300, 3e300, 2e300], rtol=1e-15)


def test_kernel_exp_logits_beyond_float64_are_refused():
    with pytest.raises(ValueError, match="logits tau s"):
        ag.kernel_attention(Q * 1e160, K * 1e160, V)


# --- bounded kernels: tiny widths are refused when the log-weights overflow, answered otherwise ---

def test_gaussian_tiny_sigma_is_refused_when_log_weights_overflow():
    with pytest.raises(ValueError, match="sigma = 1e-160"):
        ag.kernel_attention(Q, K, V, kernel="gaussian", sigma=1e-160)


def test_gaussian_tiny_sigma_gives_the_nearest_key():
    u, tau = ag.tilt_radius(Q)
    nearest = np.argmin(np.abs(tau[:, None] - u @ K.T), axis=1)
    y = ag.kernel_attention(Q, K, V, kernel="gaussian", sigma=1e-150)
    np.testing.assert_array_equal(y, V[nearest])


def test_cauchy_tiny_gamma_is_refused_when_log_weights_overflow():
    with pytest.raises(ValueError, match="gamma = 1e-300"):
        ag.kernel_attention(Q, K, V, kernel="cauchy", gamma=1e-300)


def test_cauchy_tiny_gamma_matches_the_log_domain_reference():
    gamma = 1e-150
    u, tau = ag.tilt_radius(Q)
    z = (u @ K.T - tau[:, None]) / gamma
    log_w = -np.log1p(z * z)
    w = np.exp(log_w - log_w.max(1, keepdims=True))
    ref = (w / w.sum(1, keepdims=True)) @ V
    np.testing.assert_allclose(ag.kernel_attention(Q, K, V, kernel="cauchy", gamma=gamma), ref, rtol=1e-12)


# --- tilt and radius: the norm never squares an overflowing or underflowing entry ---

@pytest.mark.parametrize("dtype, big", [(np.float64, 1e155), (np.float64, 1e300), (np.float32, 1e20),
                                        (np.float64, 1e-200), (np.float32, 1e-30)])
def test_tilt_radius_at_the_extremes(dtype, big):
    q = np.full((2, 4), big, dtype)
    u, tau = ag.tilt_radius(q, scale=1.0)
    np.testing.assert_allclose(u, 0.5, rtol=1e-6 if dtype == np.float32 else 1e-15)
    np.testing.assert_allclose(tau, 2 * big, rtol=1e-6 if dtype == np.float32 else 1e-15)


def test_tilt_radius_refuses_a_radius_beyond_the_range():
    with pytest.raises(ValueError, match="scale"):
        ag.tilt_radius(np.full((1, 4), 1e300), scale=1e10)


# --- the stable density: supported range [0.1, 2], exact through alpha = 1 ---

@pytest.mark.parametrize("alpha", [0.05, 0.02, 1e-4, 0.0, -1.0, 2.5])
def test_stable_alpha_outside_the_supported_range_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha"):
        ag.stable_density(np.zeros(3), alpha)
    with pytest.raises(ValueError, match="alpha"):
        ag.kernel_attention(Q, K, V, kernel="stable", alpha=alpha)


def _fourier_log_density(alpha, x):
    """log f_1(x) = log((1/pi) int_0^inf exp(-w^alpha) cos(w x) dw), segment by segment."""
    end = 60.0 ** (1 / alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", integrate.IntegrationWarning)  # quad asks for more than it can prove
        total = sum(integrate.quad(lambda w: math.exp(-w ** alpha) * math.cos(w * x), a, min(a + 1, end),
                                   epsabs=1e-17, epsrel=1e-14)[0] for a in np.arange(0.0, end, 1.0))
    return math.log(total / math.pi)


@pytest.mark.parametrize("alpha", [1 - 1e-10, 1 + 1e-10, 1 - 1e-6, 1 + 1e-6, 0.99, 1.03])
def test_stable_density_near_alpha_one_is_exact(alpha):
    x = np.array([0.3, 0.999, 1.0, 1.001, 2.0, 5.0])
    got = ag.stable_density(x, alpha, log=True)
    ref = np.array([_fourier_log_density(alpha, xi) for xi in x])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("alpha", [1.995, 1.999, 1.9999])
def test_stable_density_near_alpha_two(alpha):
    # The tail's coefficient sin(pi alpha / 2) -> 0: the tail series must still be usable, so
    # the table ends early and far points are finite (they were NaN after a 10 s table build).
    x = np.array([0.5, 3.0, 8.0])
    ref = np.array([_fourier_log_density(alpha, xi) for xi in x])
    np.testing.assert_allclose(ag.stable_density(x, alpha, log=True), ref, rtol=0, atol=1e-9)
    far = ag.stable_density(np.logspace(1, 15, 15), alpha, log=True)
    assert np.all(np.isfinite(far)) and np.all(np.diff(far) < 0)


def test_stable_density_at_infinity_is_zero():
    np.testing.assert_array_equal(ag.stable_density(np.array([np.inf, -np.inf]), 1.5), [0.0, 0.0])
    np.testing.assert_array_equal(ag.stable_density(np.array([np.inf]), 0.7, log=True), [-np.inf])


def test_stable_kernel_at_the_smallest_alpha_is_finite():
    y = ag.kernel_attention(Q, K, V, kernel="stable", alpha=0.1)
    assert np.all(np.isfinite(y))


# --- whitening: a recursion that overflows is refused, naming the filter's growth ---

def test_whiten_with_a_tiny_diagonal_block_is_refused():
    x = RNG.standard_normal((6, 3))
    for f in (ag.whiten, lambda *a: ag.whiten_scan(*a, block=2)):
        with pytest.raises(ValueError, match="spectral radius of L\\^-1 M 1e\\+299"):
            f(x, 1e-300 * np.eye(3), 0.1 * np.eye(3))
    with pytest.raises(ValueError, match="overflowed float32"):
        ag.whiten(x.astype(np.float32), 1e-30 * np.eye(3), 0.1 * np.eye(3))


# --- scales and temperatures that make logits overflow elsewhere ---

def test_network_forward_tiny_temperature_is_refused():
    w = ag.random_weights([3, 3, 3], [2, 2], seed=0)
    with pytest.raises(ValueError, match="temperature"):
        ag.network_forward(w, RNG.standard_normal((4, 3)), kind="softmax", temperature=1e-308)


def test_log_partition_gradient_huge_scale_is_refused():
    with pytest.raises(ValueError, match="logits scale q.k"):
        ag.log_partition_gradient(Q, K, scale=1e308)
    with pytest.raises(ValueError, match="Hessian"):
        ag.log_partition_gradient(Q, K * 1e100, scale=1e60, hessian=True)


def test_sampled_attention_huge_scale_is_refused():
    with pytest.raises(ValueError, match="logits scale q.k"):
        ag.sampled_attention(Q, K, V, num_samples=3, scale=1e308)


@pytest.mark.parametrize("scale", [1e9, 1e100])
@pytest.mark.parametrize("causal", [False, True])
def test_random_feature_attention_huge_scale_is_finite(scale, causal):
    assert np.all(np.isfinite(ag.random_feature_attention(Q, K, V, scale=scale, causal=causal)))


@pytest.mark.parametrize("dtype, tiny, big", [(np.float64, 1e-160, 1e300), (np.float32, 1e-22, 1e38)])
def test_logit_bound_sees_rows_whose_squares_underflow(dtype, tiny, big):
    # |q| tiny (its squares underflow), |k| and scale huge: the logits still overflow.
    q, k = np.full((2, 4), tiny, dtype), np.full((3, 4), big, dtype)
    with pytest.raises(ValueError, match="logits scale q.k"):
        ag.softmax_attention(q, k, k, scale=float(np.finfo(dtype).max) / 10)


# -- the last findings of the fuzz campaign ---------------------------------------------------


def test_tilts_of_tiny_rows_are_defined():
    # Rows of 1e-160: their squared norm underflows, their tilt does not.
    u = np.array([[1e-160, 0.0, 0.0], [0.0, 2e-160, 0.0]])
    cov = ag.tilt_coverage(u)
    assert cov.count == 2 and cov.rank == 2
    heads = ag.tilt_coverage(np.stack([u, u]), batch_ndim=1)
    assert [h.rank for h in heads] == [2, 2]


def test_tilt_coverage_of_zero_rows_names_u():
    with pytest.raises(ValueError, match="u has no nonzero rows"):
        ag.tilt_coverage(np.zeros((5, 3)))


def test_tilt_coverage_sizes_and_overflow_are_refused():
    with pytest.raises(ValueError, match="dim"):
        ag.TiltCoverage(10 ** 18)
    acc = ag.TiltCoverage(4).update(RNG.standard_normal((3, 4)))
    with pytest.raises(ValueError, match="W_K"):
        acc.result(W_K=np.full((4, 4), 1e300))


def test_head_diagnostics_zero_queries_name_x():
    W = RNG.standard_normal((4, 4))
    with pytest.raises(ValueError, match="x @ W_Q is zero"):
        ag.head_diagnostics(W, W, x=np.zeros((8, 4)))


def test_numerical_rank_blocks_of_huge_entries():
    J = np.diag([1.0, 1.0, 0.0]) * 1e200
    assert ag.numerical_rank(J, block_rows=1).rank == 2  # block norms overflowed to inf before
    assert ag.numerical_rank(np.ones((8, 0)), block_rows=1).rank == 0


def test_rescale_by_extreme_factors():
    w = ag.random_weights([2, 2, 2, 2], [2, 2, 2], seed=0)
    As, Vs = [a.T @ b for b, a, _ in w], [v for _, _, v in w]
    with pytest.raises(ValueError, match="lambdas"):
        ag.rescale(As, Vs, [1.0, -1e308, 0.5])  # (1e308)^3 overflowed in Python before
    A2, V2 = ag.rescale(As, Vs, [2.0, -3.0, 0.5])
    rho = 1 / (2.0 ** 9 * (-3.0) ** 3 * 0.5)
    np.testing.assert_allclose(V2[-1], rho * Vs[-1], rtol=1e-15)


def test_reconstruct_points_zero_direction_is_refused():
    with pytest.raises(ValueError, match=r"directions\[0\] is zero"):
        ag.reconstruct_points(np.zeros((3, 3)), np.ones((3, 1)))


def test_recover_keys_names_a_failing_probe():
    D = np.eye(3)
    with pytest.raises(ValueError, match="probe returned NaN"):
        ag.recover_keys(lambda d, t: (np.full((3, t.size), np.nan), np.zeros((3, t.size, 1))), D, np.arange(8.0))
    with pytest.raises(TypeError, match="probe must be a callable"):
        ag.recover_keys(None, D, np.arange(8.0))


def test_mlp_and_layernorm_shapes_and_overflow():
    x, W = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 4))
    with pytest.raises(ValueError, match="b1 must have shape"):
        ag.mlp_key_value(x, W, W, b1=np.ones(5))
    with pytest.raises(ValueError, match="x has entries up to"):
        ag.mlp_key_value(x * 1e307, W * 100, W * 100, activation="silu")
    with pytest.raises(ValueError, match="gamma must have shape"):
        ag.layernorm(x, gamma=np.ones(9))
    np.testing.assert_allclose(ag.layernorm(x, gamma=2.0), 2 * ag.layernorm(x))


def test_scalar_arguments_that_are_not_numbers():
    with pytest.raises(TypeError, match="atol"):
        ag.embedding_injectivity(np.eye(3), np.eye(3), atol={})
    with pytest.raises(TypeError, match="center"):
        ag.limited_angle(np.zeros(2), 3.0, center={})
    with pytest.raises(TypeError, match="n must be an integer"):
        ag.set_num_threads(np.array(np.nan, np.float32))
    with pytest.raises(ValueError, match="n_samples"):
        ag.is_critical(np.eye(3), np.ones((1, 3)), n_samples=-3)
    with pytest.raises(ValueError, match="batch dimensions do not broadcast"):
        ag.gauge_transform(np.ones((3, 3, 1)), np.ones((2, 3, 1)), np.ones((2, 1, 1)))


def test_rescale_when_only_the_powers_overflow():
    # lambda_1^9 = 1e360 overflows, rho = 1 / (1e360 * 1e-300) = 1e-60 does not.
    w = ag.random_weights([2, 2, 2, 2], [2, 2, 2], seed=0)
    As, Vs = [a.T @ b for b, a, _ in w], [v for _, _, v in w]
    _, V2 = ag.rescale(As, Vs, [1e40, 1e-100, 1.0])
    np.testing.assert_allclose(V2[-1], 1e-60 * Vs[-1], rtol=1e-14)
