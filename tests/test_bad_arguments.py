"""Regression table of the argument reproducers of the reliability campaign: each one a
ValueError or TypeError whose message names the argument (never ZeroDivisionError,
OverflowError, AttributeError, IndexError, a bare LinAlgError, a hang or a NaN result)."""
import numpy as np
import pytest

import attngeom as ag

RNG = np.random.default_rng(3)
Q, K, V = RNG.standard_normal((3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal((5, 2))
NAN22 = np.full((2, 2), np.nan)

# Two layers of one head, P = I: layer 0 maps x to -x, so the residual stream after it is 0
# and the forward pass stays 0, while the path through layer 1 alone is 4 x = 4e38, beyond
# float32.
_CANCELLING_PATHS = (np.broadcast_to(np.eye(3, dtype=np.float32), (2, 1, 3, 3)),
                     np.stack([-np.eye(4), 4 * np.eye(4)])[:, None].astype(np.float32),
                     np.full((3, 4), 1e38, np.float32))

CASES = [
    # NaN / inf accepted silently before
    ("psi NaN tau", lambda: ag.psi(np.nan, 0.0), "tau"),
    ("vector_ma1 NaN", lambda: ag.vector_ma1(NAN22, B=3, T=4), "Theta"),
    ("vector_ar1 NaN", lambda: ag.vector_ar1(NAN22, B=3, T=4), "Phi"),
    ("virtual_network NaN", lambda: ag.virtual_network([NAN22], np.eye(2), np.ones((2, 3))), "Ms"),
    ("gl_transform NaN", lambda: ag.gl_transform([np.eye(2)] * 2, [np.eye(2)] * 2, [NAN22]), "Cs"),
    ("numerical_rank NaN", lambda: ag.numerical_rank(np.full((3, 3), np.nan)), "J"),
    ("limited_angle NaN", lambda: ag.limited_angle(np.array([0.0, np.nan]), 30.0), "theta"),
    ("layernorm eps -1", lambda: ag.layernorm(RNG.standard_normal((2, 3)), eps=-1), "eps"),
    ("layernorm eps NaN", lambda: ag.layernorm(RNG.standard_normal((2, 3)), eps=np.nan), "eps"),
    # ZeroDivisionError / OverflowError before
    ("projection sigma 1e-300", lambda: ag.projection_attention(Q, K, V, sigma=1e-300), "sigma"),
    ("log_partition_gradient d_k 0", lambda: ag.log_partition_gradient(np.zeros((2, 0)), np.zeros((3, 0))), "d_k"),
    ("fit_exponential_sum order inf", lambda: ag.fit_exponential_sum(1j * np.arange(10.0), np.ones(10), order=np.inf),
     "order"),
    ("iradon_sart iterations inf",
     lambda: ag.iradon_sart(np.ones((8, 4)), np.linspace(0, 180, 4, endpoint=False), iterations=np.inf),
     "iterations"),
    ("sampled_attention sketch_rank inf",
     lambda: ag.sampled_attention(Q, K, V, num_samples=4, proposal="tilted", sketch_rank=np.inf), "sketch_rank"),
    ("steady_state_factor max_iter inf",
     lambda: ag.steady_state_factor(np.eye(2), 0.1 * np.eye(2), max_iter=np.inf), "max_iter"),
    # AttributeError before
    ("laplace_radon_transform tau None", lambda: ag.laplace_radon_transform(Q, None, K), "tau"),
    ("laplace_radon_attention tau None", lambda: ag.laplace_radon_attention(Q, None, K, V), "tau"),
    ("projected_cumulants tau None", lambda: ag.projected_cumulants(Q, None, K), "tau"),
    ("show_config file 3", lambda: ag.show_config(file=3), "file"),
    # IndexError / bare LinAlgError before
    ("numerical_rank 0-d", lambda: ag.numerical_rank(np.float64(1.0)), "J"),
    ("vector_ma1 0-d", lambda: ag.vector_ma1(np.float64(0.5), B=3, T=4), "Theta"),
    ("gl_transform 0-d", lambda: ag.gl_transform(np.float64(1), np.float64(1), np.float64(1)), "As"),
    ("virtual_network 0-d", lambda: ag.virtual_network(np.float64(1), 1.0, np.ones((2, 2))), "Ms"),
    ("virtual_network empty", lambda: ag.virtual_network([], None, np.ones((2, 2))), "Ms"),
    # absurd sizes: refused before allocating, not a hang or a MemoryError
    ("block_cholesky_factors T 1e9", lambda: ag.block_cholesky_factors(np.eye(2), 0.1 * np.eye(2), T=10 ** 9), "T"),
    ("feature_matrix 1e9 features", lambda: ag.feature_matrix(4, 10 ** 9), "num_features"),
    ("random_weights 1e9", lambda: ag.random_weights([2, 2], [10 ** 9]), "d, a"),
    ("vector_ar1 B 1e30", lambda: ag.vector_ar1(0.5 * np.eye(1), 10 ** 30, 3), "B"),
    ("shepp_logan_phantom render 1e18", lambda: ag.shepp_logan_phantom(render=10 ** 18), "render"),
    ("circle_mask None", lambda: ag.circle_mask(None), "size"),
    ("neuromanifold_dimension n_draws 2^31", lambda: ag.neuromanifold_dimension([2, 2], [2], n_draws=2 ** 31),
     "n_draws"),
    # absurd working sets inside the core's parallel loops: an allocation failure there used to
    # terminate the process (std::bad_alloc cannot leave an OpenMP region)
    ("parametrization_jacobian t 1e5",
     lambda: ag.parametrization_jacobian(ag.random_weights([3, 2, 2], [2, 1]), np.zeros((1, 10 ** 5, 3))), "X"),
    ("neuromanifold_dimension t 1e6",
     lambda: ag.neuromanifold_dimension([3, 2, 2], [2, 1], t=10 ** 6, n_samples=10, n_draws=1), "t"),
    ("fit_exponential_sum N 2e5",
     lambda: ag.fit_exponential_sum(np.linspace(0, 1, 200000), np.exp(0.5 * np.linspace(0, 1, 200000)), order=1),
     "tau, values"),
    # inf returned before
    ("laplace_radon_transform Z overflow",
     lambda: ag.laplace_radon_transform(np.ones((1, 1)), np.array([800.0]), np.ones((1, 1)), np.ones((1, 1))),
     "log_domain"),
    ("laplace_radon_transform complex Z overflow",
     lambda: ag.laplace_radon_transform(np.ones((1, 1)), np.array([1e15 + 0j]), np.ones((1, 1))), "log_domain"),
    ("sampled_attention y overflow",
     lambda: ag.sampled_attention(Q, K, np.full((5, 2), 1.7e308), num_samples=4), "v"),
    # MemoryError before
    ("sampled_attention num_samples 2^40", lambda: ag.sampled_attention(Q, K, V, num_samples=2 ** 40),
     "num_samples"),
    ("iradon output_size 1e6", lambda: ag.iradon(np.ones((16, 30)), output_size=10 ** 6), "output_size"),
    # AxisError / matmul ValueError before
    ("layernorm 0-d", lambda: ag.layernorm(2.0), "x"),
    ("latent_factorization zero K", lambda: ag.latent_factorization(np.zeros((3, 2)), 1), "rank"),
    ("layernorm constant row eps 0", lambda: ag.layernorm(np.ones(3), eps=0.0), "zero variance"),
    # seeds
    ("feature_matrix seed 2.5", lambda: ag.feature_matrix(4, 8, seed=2.5), "seed"),
    ("random_weights seed -1", lambda: ag.random_weights([2, 2], [2], seed=-1), "seed"),
    # paths
    ("load_heads None", lambda: ag.load_heads(None), "path"),
    # AttributeError before
    ("sampled_attention v None", lambda: ag.sampled_attention(Q, K, None, num_samples=4), "v"),
    # a path's contribution inf returned before (the forward pass finite: the paths cancel)
    ("path_expansion float32 path overflow", lambda: ag.path_expansion(*_CANCELLING_PATHS), "x"),
]


@pytest.mark.parametrize("label, call, name", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_a_clean_error_naming_it(label, call, name):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    assert type(info.value).__name__ not in ("LinAlgError",) or name in str(info.value)
    assert name in str(info.value), f"{label}: {info.value}"


def test_whiteness_does_not_depend_on_memory_layout():
    # Identical sequences: no variation across the batch, so nothing to whiten (0), and a
    # broadcast view must give what a contiguous copy gives.
    x = np.broadcast_to(RNG.standard_normal((1, 6, 3)), (5, 6, 3))
    assert ag.whiteness(x) == ag.whiteness(np.ascontiguousarray(x)) == 0.0
    y = RNG.standard_normal((7, 6, 3))
    assert ag.whiteness(y[:, :, ::-1]) == pytest.approx(ag.whiteness(np.ascontiguousarray(y[:, :, ::-1])), rel=1e-13, abs=0)


def test_the_error_types_of_the_fuzz_findings():
    """None for an array is a TypeError naming it (not an AttributeError); a path beyond the
    float range is ResultOverflow, although the forward pass is finite."""
    for args, name in (((None, K, V), "q"), ((Q, None, V), "k"), ((Q, K, None), "v")):
        with pytest.raises(TypeError, match=f"^{name} must be a real"):
            ag.sampled_attention(*args, num_samples=4)
    with pytest.raises(ag.errors.ResultOverflow, match="path_expansion: the result is not finite .* x has entries"):
        ag.path_expansion(*_CANCELLING_PATHS)
    P, W, x = _CANCELLING_PATHS
    ex = ag.path_expansion(P, W, x / 8)  # 4 x / 8 = 5e37: in range, every path returned
    assert np.all(ex.forward == 0) and np.array_equal(ex.paths[((1, 0),)], 4 * (x / 8))
