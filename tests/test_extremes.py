"""Finite inputs at the extremes of the float range: a correct finite answer or a ValueError
saying what overflows, never NaN, zeros as if every key were hidden, or a crash."""
import math
import warnings

import numpy as np
import pytest
from scipy import integrate

import attngeom as ag
import reference as ref

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
    y, P, log_z = ag.softmax_attention(q, k, v, scale=1.0, return_routing=True, return_log_partition=True)
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


def test_stable_kernel_at_the_smallest_alpha_is_right():
    # The reference weights come from the convergent tail series for alpha < 1 (extended
    # precision, not the library's density), normalised in NumPy. The series and the library's
    # density agree to 6.9e-15 relative here, so y (a weighted mean of V) is within twice that
    # times max |V|: measured 7.7e-16 max |V|; 3e-14 is twice the bound.
    y = ag.kernel_attention(Q, K, V, kernel="stable", alpha=0.1)
    u, tau = ref.tilt_radius(Q)
    x = tau[:, None] - u @ K.T
    f = ref.stable_tail_series(x.ravel(), 0.1).reshape(x.shape)
    assert np.all(np.isfinite(f))  # the series converged without cancellation at every point
    np.testing.assert_allclose(y, (f / f.sum(-1, keepdims=True)) @ V, rtol=0, atol=3e-14 * np.abs(V).max())


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
def test_random_feature_attention_huge_scale_is_right(scale, causal):
    # The log-domain reference sums every term exp(l_q,f + l_k,f) by logsumexp, so it is
    # exact to rounding for any logits. At these scales a query's features spread over 1e4 to
    # 1e50 nats, and a key shift shared by all features underflowed every key term of the
    # feature that carries the query (log Z then left the estimate): the shifts are per feature.
    y, log_z = ag.random_feature_attention(Q, K, V, scale=scale, causal=causal, return_log_partition=True)
    y_ref, lz_ref = ref.favor_log_domain(Q, K, V, ag.feature_matrix(Q.shape[1], 256, seed=0), scale, causal)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(log_z))
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-13 * np.abs(V).max())
    np.testing.assert_allclose(log_z, lz_ref, rtol=1e-12, atol=0)


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


# --- the outside fuzz campaign's last findings: huge float32 values, absurd scales and counts,
# --- one-element masks, grown sample arrays, NaN sample points ---

F32_MAX = float(np.finfo(np.float32).max)


def _near_max(shape, dtype, seed=0):
    """Values whose largest magnitude is 0.9 of the dtype's largest finite number."""
    x = np.random.default_rng(seed).standard_normal(shape)
    return (x / np.abs(x).max() * 0.9 * float(np.finfo(dtype).max)).astype(dtype)


def test_radon_adjoint_of_a_float32_sinogram_near_the_maximum():
    s = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    # Scaled by 2^120 (entries up to ~1e37): the result is the scaled result, bitwise, in float32.
    big = ag.radon_adjoint(np.ldexp(s, 120))
    assert big.dtype == np.float32 and np.all(np.isfinite(big))
    np.testing.assert_array_equal(big, np.ldexp(ag.radon_adjoint(s), 120))
    # Near the float32 maximum the sums pass the range: refused, never inf.
    with pytest.raises(ValueError, match="sinogram has entries up to"):
        ag.radon_adjoint(_near_max((16, 16), np.float32))


@pytest.mark.parametrize("func, name", [(ag.null_space, "M"), (ag.routing_nulls, "routing"),
                                        (ag.numerical_rank, "J"), (ag.singular_values, "x")])
def test_spectra_beyond_the_float_range_are_refused(func, name):
    # An (8, 1) column of entries near 1.6e308 has a singular value sqrt(8) times larger.
    with pytest.raises(ValueError, match=rf"\b{name} has entries up to"):
        func(_near_max((8, 1), np.float64))
    # One power of two lower it is representable, and the answer is the exact scaled one.
    x = _near_max((8, 1), np.float64) / 4
    np.testing.assert_allclose(ag.singular_values(x), [np.linalg.norm(x / 2**1000) * 2**1000], rtol=1e-15)
    assert ag.numerical_rank(x).rank == 1 and ag.null_space(x.T)[0].dim == 7


def test_numerical_rank_of_a_zero_or_empty_matrix():
    # Rank 0 is exact; the gap ratio (no singular value above zero) is inf, as documented.
    for J in (np.zeros((4, 4)), np.zeros((0, 3))):
        rank, s, gap = ag.numerical_rank(J)
        assert rank == 0 and np.all(s == 0) and s.size == min(J.shape) and gap == math.inf


def test_gauge_transform_overflow_is_refused():
    W = RNG.standard_normal((2, 3, 3))
    with pytest.raises(ValueError, match="has entries up to"):
        ag.gauge_transform(W * 1e200, W, W * 1e200)


def test_path_expansion_refuses_too_many_paths_before_any_work():
    P, W, x = np.full((8, 8, 4, 4), 0.25), np.full((8, 8, 2, 2), 0.01), np.ones((4, 2))
    J = np.full((8, 2, 2), 0.01)
    with pytest.raises(ValueError, match="max_length"):  # 9^8 2^8 = 1.1e10 paths
        ag.path_expansion(P, W, x, mlp_jacobians=J)
    ex = ag.path_expansion(P, W, x, mlp_jacobians=J, max_length=2)  # 1 + 72 + C(paths of two) = 2,449
    assert len(ex.paths) == 1 + 72 + (72 * 72 - 8 * 8 * 8 - 8) // 2
    with pytest.raises(ValueError, match="W_OV has entries up to"):  # float32 products overflow
        ag.path_expansion(P[:2, :2].astype(np.float32), _near_max((2, 2, 2, 2), np.float32) / 8,
                          x.astype(np.float32))


@pytest.mark.parametrize("backward", [False, True])
def test_random_features_refuse_a_feature_exponent_beyond_the_range(backward):
    q, k, v = RNG.standard_normal((3, 50, 4))
    call = (lambda **kw: ag.random_feature_attention_backward(q, k * 1e3, v, v, **kw)) if backward else \
        (lambda **kw: ag.random_feature_attention(q, k * 1e3, v, return_log_partition=True, **kw))
    with pytest.raises(ValueError, match="scale"):
        call(scale=1e308)
    q32 = q.astype(np.float32)
    with pytest.raises(ValueError, match=r"scale .*3\.4e\+38"):
        ag.random_feature_attention(q32, q32 * 1e3, q32, scale=1e35)
    out = call(scale=1e9)  # large but representable: finite (its value: the test below)
    assert all(np.all(np.isfinite(a)) for a in out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backward", [False, True])
def test_random_features_refuse_keys_whose_squared_norm_overflows(dtype, backward):
    # |k|^2 = 1.5 x the float maximum: |k|^2 / 2 fits, but the kernel forms |k|^2 before halving
    # it, so every logit of those keys would be -inf. Such keys once made the key state NaN and
    # every later query read y = 0, log Z = -inf (as if it saw no key), without an error.
    q = RNG.standard_normal((130, 3)).astype(dtype)
    k = RNG.standard_normal((130, 3)).astype(dtype)
    k[:64] = np.sqrt(float(np.finfo(dtype).max) / 2) * np.sign(RNG.standard_normal((64, 3)))
    v = RNG.standard_normal((130, 2)).astype(dtype)
    with pytest.raises(ValueError, match=r"squared feature norm scale \|x\|\^2 may reach"):
        if backward:
            ag.random_feature_attention_backward(q, k, v, v, scale=1.0, causal=True)
        else:
            ag.random_feature_attention(q, k, v, scale=1.0, causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_random_features_at_a_large_representable_scale_are_right(causal):
    # The forward of the case above against the log-domain reference (exact to rounding for
    # any logits); the tolerances are those test_random_features.py holds for extreme logits.
    q, k, v = RNG.standard_normal((3, 50, 4))
    y, log_z = ag.random_feature_attention(q, k * 1e3, v, scale=1e9, causal=causal, return_log_partition=True)
    y_ref, lz_ref = ref.favor_log_domain(q, k * 1e3, v, ag.feature_matrix(4, 256, seed=0), 1e9, causal)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-9 * np.abs(v).max())
    np.testing.assert_allclose(log_z, lz_ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mask", [np.zeros((1, 1), bool), np.full((1, 1), -np.inf)])
def test_a_one_element_mask_hiding_every_key_gives_the_documented_outputs(mask):
    # Every query sees no key: y = 0, P = 0, log Z = -inf (the exact log of an empty sum),
    # statistics 0 with argmax -1, and zero gradients, for every attention that takes a mask.
    q, k, v = RNG.standard_normal((3, 4, 2))
    dy = RNG.standard_normal((4, 2))
    y, P, log_z, stats = ag.softmax_attention(q, k, v, mask=mask, return_routing=True, return_log_partition=True,
                                              return_stats=True)
    assert np.all(y == 0) and np.all(P == 0) and np.all(log_z == -np.inf)
    assert np.all(stats.log_z == -np.inf) and np.all(stats.argmax == -1)
    assert all(np.all(getattr(stats, f) == 0) for f in ("entropy", "max_weight", "sink_weight", "mean_distance"))
    for out in (ag.kernel_attention(q, k, v, mask=mask, kernel="gaussian", return_routing=True,
                                    return_log_partition=True),
                ag.laplace_radon_attention(*ag.tilt_radius(q), k, v, mask=mask, return_routing=True,
                                           return_log_partition=True)):
        assert np.all(out[0] == 0) and np.all(out[1] == 0) and np.all(out[2] == -np.inf)
    y, P = ag.projection_attention(q, k, v, mask=mask, return_routing=True)
    assert np.all(y == 0) and np.all(P == 0)
    for grads in (ag.softmax_attention_backward(q, k, v, dy, mask=mask),
                  ag.kernel_attention_backward(q, k, v, dy, mask=mask, kernel="cauchy"),
                  ag.projection_attention_backward(q, k, v, dy, mask=mask)):
        assert all(np.all(g == 0) for g in grads)


def test_fit_exponential_sum_pads_nothing_for_one_problem():
    # Many more samples than nodes, and a lone delta sample whose pencil eigenvalue is 0 (no
    # node): the single problem's nodes are exactly the ones found, all finite.
    t = np.arange(32) * 0.1
    f = np.exp(-t)
    f[0] += 1.0
    fit = ag.fit_exponential_sum(t, f, pencil=3)
    assert fit.order == 1 and fit.nodes.shape == (1,) and abs(fit.nodes[0] + 1) < 1e-6
    assert all(np.all(np.isfinite(np.asarray(a))) for a in (fit.nodes, fit.weights, fit.residual))


def test_wasserstein1_grid_checks_and_scale():
    g, p, q = np.linspace(0, 1, 5), np.ones(5), 1.0 + np.arange(5.0)
    bad = g.copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"\bs\b"):
        ag.wasserstein1(bad, p, q)
    w = ag.wasserstein1(g, p, q)
    # W1 scales with the grid: exact powers of two, from subnormal steps to near the maximum.
    for e in (-1070, -1000, 1000):
        assert ag.wasserstein1(np.ldexp(g, e), p, q) == np.ldexp(w, e)
    assert ag.wasserstein1(g, p * 1e308, q) == w  # each density is normalised first
    with pytest.raises(ValueError, match="has entries up to"):  # the distance itself passes the range
        ag.wasserstein1(np.array([-1.5, -0.5, 0.5, 1.5]) * 1e308, np.array([1.0, 0, 0, 0]), np.array([0, 0, 0, 1.0]))


def test_iradon_output_size_and_sart_counts_are_checked():
    s = RNG.standard_normal((8, 6))
    with pytest.raises(ValueError, match="output_size"):
        ag.iradon(s, output_size=1e308)
    with pytest.raises(ValueError, match="iterations"):  # refused up front, not after hours
        ag.iradon_sart(s, iterations=10 ** 9)
    with pytest.raises(TypeError, match="clip"):
        ag.iradon_sart(s, clip=2147483648)
    with pytest.raises(ValueError, match="clip"):
        ag.iradon_sart(s, clip=(math.nan, 1.0))


def test_sart_is_scale_equivariant_up_to_the_float_maximum():
    img = ag.shepp_logan_phantom(16)
    theta = np.linspace(0, 180, 24, endpoint=False)
    s = ag.radon(img, theta)
    ref = ag.iradon_sart(s, theta, iterations=2, clip=(0.0, 1.0))
    # Near 1e308 and near the subnormals: the same reconstruction, scaled, bitwise.
    for e in (1000, -1000):
        out = ag.iradon_sart(np.ldexp(s, e), theta, iterations=2, clip=(0.0, math.ldexp(1.0, e)))
        np.testing.assert_array_equal(out, np.ldexp(ref, e))
    big, angles = _near_max((8, 8), np.float64), np.arange(0.0, 180, 22.5)
    huge = ag.iradon_sart(big, angles)
    assert np.all(np.isfinite(huge))
    # entries up to 0.9 * 1.8e308, no clip: the reconstruction at 2^-1000 of the size, scaled back, bitwise
    np.testing.assert_array_equal(huge, np.ldexp(ag.iradon_sart(np.ldexp(big, -1000), angles), 1000))
    np.testing.assert_array_equal(ag.iradon_sart(s, theta, clip=(0.0, math.inf)), ag.iradon_sart(s, theta, clip=(0.0, 1e300)))


def test_stable_density_log_below_the_float_range_is_minus_inf():
    # log f of the Gaussian (alpha = 2, c = 1) is -x^2 / 4 - log(2 sqrt(pi)): below -1.8e308
    # for |x| > ~2.7e154, where the documented result is -inf; finite and exact up to there.
    x = np.array([1e100, 2e154, 1e200, 1e300])
    out = ag.stable_density(x, 2.0, log=True)
    np.testing.assert_allclose(out[:2], -(x[:2] / 2) ** 2 - math.log(2 * math.sqrt(math.pi)), rtol=1e-14)
    assert np.all(out[2:] == -np.inf)
    assert np.all(np.isfinite(ag.stable_density(x, 1.5, log=True)))  # power-law tails stay in range


def test_complex_radii_with_projections_beyond_the_range_are_refused():
    u = RNG.standard_normal((8, 3))
    with pytest.raises(ValueError, match="u.k"):
        ag.laplace_radon_transform(u, 1e-8j * np.ones(8), _near_max((2, 3), np.float64), log_domain=True)
    with pytest.raises(ValueError, match="tau"):
        ag.laplace_radon_transform(u, 1e300j * np.ones(8), np.full((2, 3), 1e10), log_domain=True)


def test_a_ragged_list_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"\bq must be a real array"):
        ag.softmax_attention_backward([[1.0], [2.0, 3.0]], np.ones((2, 3)), np.ones((2, 2)), np.ones((8, 2)))


def test_log_partition_gradient_when_only_q_dot_k_overflows():
    # q.k ~ 1e318 is beyond float64 while scale q.k is not: the same gradient as the
    # representable problem with q / 2^1000 and scale 2^1000 times larger, up to rounding.
    q, k = RNG.standard_normal((2, 2, 3, 4))
    x = ag.log_partition_gradient(np.ldexp(q, 1020), k * 1e10, scale=np.ldexp(1e-10, -1000))
    y = ag.log_partition_gradient(np.ldexp(q, 20), k * 1e10, scale=1e-10)
    np.testing.assert_allclose(np.ldexp(x, 1000), y, rtol=1e-12, atol=1e-12 * np.abs(y).max())
    with pytest.raises(ValueError, match="scale"):  # a float32 tau cannot hold the scale
        ag.log_partition_gradient(q.astype(np.float32), k.astype(np.float32), scale=-1e308)


def test_orthogonal_feature_matrices_have_a_block_limit():
    with pytest.raises(ValueError, match="num_features"):  # 1e9 QR factorisations: refused at once
        ag.feature_matrix(1, 10 ** 9, orthogonal=True)
    assert ag.feature_matrix(1, 10 ** 6, orthogonal=False).shape == (10 ** 6, 1)


def test_choice_arguments_that_are_arrays_are_refused_by_name():
    x = np.ones((3, 2))
    for call, name in ((lambda: ag.fourier_filter(8, filter=np.array([-1, 0])), "filter"),
                       (lambda: ag.mlp_key_value(x, np.ones((2, 4)), np.ones((4, 2)), activation=np.array(1.0)),
                        "activation"),
                       (lambda: ag.effective_rank(np.ones(8), spectrum=np.ones(3)), "spectrum"),
                       (lambda: ag.Subspace(np.eye(3)[:, :1], complement=np.ones(2)), "complement"),
                       (lambda: ag.function_discrepancy(([np.eye(2)], [np.eye(2)]), ([np.eye(2)], [np.eye(2)]),
                                                        np.ones((5, 3, 2)), kind=np.ones(3)), "kind")):
        with pytest.raises((TypeError, ValueError), match=rf"\b{name} must be"):
            call()


def test_subspace_refuses_columns_that_are_not_unit_vectors():
    b = np.zeros((8, 2))
    b[0, 0], b[1, 1] = 1e154, 1.0
    for basis in (b, 2 * np.eye(8)[:, :2]):
        with pytest.raises(ValueError, match="orthonormal columns"):
            ag.Subspace(basis)
    assert ag.Subspace.span(2 * np.eye(8)[:2]).dim == 2  # arbitrary vectors go through span


def test_broadcast_failures_name_the_arguments():
    with pytest.raises(ValueError, match=r"W_OV \(3,\)"):
        ag.head_operator(np.ones((2, 3, 8)), np.ones((3, 5, 3)), np.ones((2, 8, 5)))
    with pytest.raises(ValueError, match=r"tau \(3, 3, 0\), s \(2, 3, 0\)"):
        ag.psi(np.ones((3, 3, 0)), np.ones((2, 3, 0)))
    with pytest.raises(ValueError, match=r"q \(2,\), k \(3,\)"):
        ag.projection_attention_backward(np.ones((2, 3, 1)), np.ones((3, 1, 1)), None, np.ones((2, 3, 1)))


def test_point_reconstruction_with_directions_near_the_maximum():
    keys = np.array([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.7]])
    U = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    ref = ag.reconstruct_points(U, [U[j] @ keys.T for j in range(3)]).points
    big = U * 2.0 ** 1000  # projections 2^1000 larger: the same points
    out = ag.reconstruct_points(big, [big[j] @ keys.T for j in range(3)]).points
    np.testing.assert_allclose(out, ref, rtol=1e-14, atol=1e-15)  # LAPACK rescales huge right-hand sides
    with pytest.raises(TypeError, match="nodes"):
        ag.reconstruct_points(U, None)


def test_block_cholesky_with_an_overflowing_schur_complement_is_not_definite():
    lam0 = np.eye(3) * 2
    with pytest.raises(ValueError, match="not positive definite"):
        ag.block_cholesky_factors(lam0, _near_max((3, 3), np.float64), 2)


def test_sart_image_beyond_a_float32_sinogram_is_refused():
    s = RNG.standard_normal((4, 2)).astype(np.float32)
    with pytest.raises(ValueError, match="image"):
        ag.iradon_sart(s, image=np.full((4, 4), 1e154))


def test_factored_svd_scales_its_factors_exactly():
    A, B = RNG.standard_normal((5, 3)), RNG.standard_normal((3, 4))
    ref, big = ag.factored_svd(A, B), ag.factored_svd(np.ldexp(A, 900), np.ldexp(B, -1000))
    np.testing.assert_array_equal(np.ldexp(ref.S, -100), big.S)
    np.testing.assert_array_equal(ref.U, big.U)
    with pytest.raises(ValueError, match="W_Q has entries up to"):  # B = W_Q W_K^T itself overflows
        ag.parameter_nulls(np.array([[1e300]]), np.array([[1e300]]))


def test_steady_state_and_whitening_near_the_maximum():
    out = ag.steady_state_factor(np.array([[1.6e308]]), np.zeros((1, 1)))
    assert out.converged and np.isfinite(out.L).all() and out.L[0, 0] == pytest.approx(math.sqrt(1.6e308))
    with pytest.raises(ValueError, match=r"\bx has entries up to"):
        ag.full_whitening(_near_max((5, 2, 2), np.float64))


def test_tilt_coverage_refuses_token_factors_beyond_the_range_instead_of_hanging():
    # A non-finite matrix can send LAPACK's SVD into an endless loop; the overflow is refused.
    u = np.asfortranarray(_near_max((2, 3, 3, 5), np.float64))
    with pytest.raises(ValueError, match="has entries up to"):
        ag.tilt_coverage(u, W_K=_near_max((3, 5), np.float64, seed=1))


def test_hessian_of_log_z_when_only_scale_squared_overflows():
    # scale = 1e200: scale^2 alone is beyond float64, scale^2 Cov(k) with |k| ~ 1e-150 is not.
    q, k = np.zeros((1, 2)), RNG.standard_normal((4, 2)) * 1e-150
    grad, hess = ag.log_partition_gradient(q, k, scale=1e200, hessian=True)
    centred = k - k.mean(0)
    np.testing.assert_allclose(hess[0], (centred.T @ centred / 4) * 1e200 * 1e200, rtol=1e-12)


def test_tilted_sampling_of_keys_near_the_maximum():
    # The sketch's principal directions do not depend on the keys' scale.
    q, k, v = RNG.standard_normal((3, 6, 4))
    a = ag.sampled_attention(q, k, v, num_samples=8, proposal="tilted", seed=1)
    b = ag.sampled_attention(q, np.ldexp(k, 600), v, num_samples=8, proposal="tilted", seed=1, scale=0.5 * 2.0 ** -600)
    np.testing.assert_allclose(a.y, b.y, rtol=1e-12)


def test_scale_zero_gives_zero_gradient_and_hessian_whatever_the_keys():
    # scale 0: uniform weights, gradient scale E[k] = 0 and Hessian scale^2 Cov(k) = 0 exactly,
    # even where Cov(k) itself is beyond float32.
    q, k = _near_max((3, 4), np.float32), _near_max((4, 4), np.float32, seed=1)
    grad, hess = ag.log_partition_gradient(q, k, scale=0.0, hessian=True)
    assert grad.shape == (3, 4) and hess.shape == (3, 4, 4) and not grad.any() and not hess.any()


def test_flag_and_choice_arguments_of_the_readers_and_tomography(tmp_path):
    with pytest.raises(TypeError, match="circle must be True or False"):
        ag.iradon(np.ones((5, 2)), circle=np.ones((0, 0, 4, 4)))
    with pytest.raises(TypeError, match="circle must be True or False"):
        ag.radon(np.ones((4, 4)), circle=np.array([1.0]))
    path = ag.models.write_safetensors(str(tmp_path / "t.safetensors"), {"x": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="backend must be 'auto', 'package' or 'python'"):
        ag.models.read_safetensors(path, backend=np.ones((4, 0, 3)))
