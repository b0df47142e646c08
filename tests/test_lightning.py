"""Lightning attention and deep lightning networks (Henry-Marchetti-Kohn, Definitions 1-2,
Theorem 3.2, eq. 16)."""
import numpy as np
import pytest
from conftest import TOL, rel_err

import attngeom as ag
import reference as ref


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q,n_k", [(50, 50), (37, 130), (130, 37), (1, 1), (64, 64), (200, 65)])
def test_lightning_against_quadratic(rng, dtype, causal, n_q, n_k):
    q = rng.standard_normal((2, 1, n_q, 7)).astype(dtype)
    k = rng.standard_normal((3, n_k, 7)).astype(dtype)
    v = rng.standard_normal((2, 3, n_k, 5)).astype(dtype)
    y = ag.lightning_attention(q, k, v, causal=causal)
    assert y.shape == (2, 3, n_q, 5) and y.dtype == dtype
    want = ref.lightning_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal)
    assert rel_err(y, want) <= TOL[dtype] * (10 if dtype == np.float32 else 1)


def test_lightning_non_contiguous_and_threads(rng):
    q = rng.standard_normal((4, 300, 6)).transpose(1, 0, 2)[:, ::2]  # (300, 2, 6) view
    k = np.asfortranarray(rng.standard_normal((300, 6)))
    v = rng.standard_normal((300, 9))[:, ::3]
    qq = np.swapaxes(q, 0, 1)
    want = ref.lightning_attention(qq, k, v, True)
    old = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.lightning_attention(qq, k, v, causal=True)
        ag.set_num_threads(2)
        two = ag.lightning_attention(qq, k, v, causal=True)
    finally:
        ag.set_num_threads(old)
    assert rel_err(one, want) <= 1e-12 and rel_err(one, two) <= 1e-12


@pytest.mark.parametrize("causal", [True, "bottom_right"])
def test_lightning_causal_across_chunk_groups(rng, causal):
    # d = 64 in float64 over a batch of 2: groups of 5 chunks of 64 rows (about 1 MB of keys,
    # values and states), so 3,000 queries take 10 groups and every state but the first group's
    # comes through the carry from the group before; bottom-right with n_k > n_q also gives
    # chunk 0 the keys before its first boundary.
    n_q, n_k = 3000, 3000 if causal is True else 3100
    q, k, v = rng.standard_normal((2, n_q, 64)), rng.standard_normal((2, n_k, 64)), rng.standard_normal((2, n_k, 64))
    want = ref.lightning_attention(q, k, v, causal)
    old = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.lightning_attention(q, k, v, causal=causal)
        ag.set_num_threads(2)
        two = ag.lightning_attention(q, k, v, causal=causal)
    finally:
        ag.set_num_threads(old)
    assert rel_err(one, want) <= TOL[np.float64]
    assert np.array_equal(one, two)


def test_lightning_errors():
    with pytest.raises(ValueError, match="k must have shape"):
        ag.lightning_attention(np.ones((3, 4)), np.ones((3, 5)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="v must have shape"):
        ag.lightning_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="causal"):
        ag.lightning_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 2)), causal="diagonal")
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.lightning_attention(np.full((3, 4), np.nan), np.ones((3, 4)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="k must be non-empty"):
        ag.lightning_attention(np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 2)))


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_lightning_names_a_non_finite_operand_wherever_it_is(rng, causal, name, bad):
    # The causal passes check each chunk (64 rows) as they read it; the keys from the last
    # chunk's boundary on, and those no query sees (top-left, 300 keys for 150 queries), are
    # checked after. One bad entry anywhere, in the second batch element, names its operand;
    # with every operand bad, q is named first, then k.
    n_q, n_k = 150, 300
    ops = {"q": rng.standard_normal((2, n_q, 8)), "k": rng.standard_normal((2, n_k, 8)),
           "v": rng.standard_normal((2, n_k, 3))}
    rows = ops[name].shape[1]
    for row in (0, 63, 64, rows // 2, rows - 1):
        for dtype in (np.float64, np.float32):
            a = {key: x.astype(dtype) for key, x in ops.items()}
            a[name][1, row, -1] = bad
            with pytest.raises(ag.errors.NonFiniteOperand, match=f"^{name} contains NaN"):
                ag.lightning_attention(a["q"], a["k"], a["v"], causal=causal)
    every = {key: np.where(np.arange(x.shape[1])[:, None] == x.shape[1] - 1, bad, x) for key, x in ops.items()}
    with pytest.raises(ag.errors.NonFiniteOperand, match="^q contains"):
        ag.lightning_attention(every["q"], every["k"], every["v"], causal=causal)
    with pytest.raises(ag.errors.NonFiniteOperand, match="^k contains"):
        ag.lightning_attention(ops["q"], every["k"], every["v"], causal=causal)


def layer_weights(rng, d=4, dp=3, a=2):
    Q, K = rng.standard_normal((2, a, d))
    return K.T @ Q, rng.standard_normal((dp, d))


def test_layer_is_the_papers_equation(rng):
    A, V = layer_weights(rng)
    x = rng.standard_normal((2, 6, 4))  # two sequences of t = 6 tokens (rows)
    y = ag.lightning_layer(x, A, V)
    for b in range(2):
        assert rel_err(y[b].T, ref.lightning_layer_columns(x[b].T, A, V)) <= 1e-13
    yn = ag.lightning_layer(x, A, V, kind="softmax", temperature=2.0)
    for b in range(2):
        assert rel_err(yn[b].T, ref.normalized_layer_columns(x[b].T, A, V, 2.0)) <= 1e-13


def test_homogeneity_and_rescaling_fiber(rng):
    A, V = layer_weights(rng)
    x = rng.standard_normal((6, 4))
    y = ag.lightning_layer(x, A, V)
    assert rel_err(ag.lightning_layer(2.5 * x, A, V), 2.5 ** 3 * y) <= 1e-13  # phi(cX) = c^3 phi(X)
    assert rel_err(ag.lightning_layer(x, -3.0 * A, V / -3.0), y) <= 1e-13  # (lambda A, V / lambda)
    # deep: degree 3^l
    A2, V2 = layer_weights(rng, d=3, dp=2)
    deep = ag.deep_lightning(x, [A, A2], [V, V2])
    assert deep.shape == (6, 2)
    assert rel_err(ag.deep_lightning(1.5 * x, [A, A2], [V, V2]), 1.5 ** 9 * deep) <= 1e-12
    assert rel_err(deep, ag.lightning_layer(ag.lightning_layer(x, A, V), A2, V2)) <= 1e-14
    # the normalised network has no rescaling fiber
    yn = ag.lightning_layer(x, A, V, kind="softmax")
    assert rel_err(ag.lightning_layer(x, 2 * A, V / 2, kind="softmax"), yn) > 1e-3


def test_rank_one_swap_theorem_3_2(rng):
    # A = k (x) q, V = h (x) v  and  A' = v (x) q, V' = h (x) k  define the same function
    d, dp = 4, 3
    q, k, v = rng.standard_normal((3, d))
    h = rng.standard_normal(dp)
    A, V = np.outer(k, q), np.outer(h, v)
    A2, V2 = np.outer(v, q), np.outer(h, k)
    x = rng.standard_normal((5, 7, d))
    y = ag.lightning_layer(x, A, V)
    assert rel_err(ag.lightning_layer(x, A2, V2), y) <= 1e-13
    # a generic rank-1 change of v alone is not in the fiber
    assert rel_err(ag.lightning_layer(x, np.outer(v + 1, q), V2), y) > 1e-3


def test_layer_errors(rng):
    A, V = layer_weights(rng)
    x = rng.standard_normal((6, 4))
    with pytest.raises(ValueError, match="A must have shape"):
        ag.lightning_layer(x, A[:3], V)
    with pytest.raises(ValueError, match="V must have shape"):
        ag.lightning_layer(x, A, V[:, :3])
    with pytest.raises(ValueError, match="temperature"):
        ag.lightning_layer(x, A, V, kind="softmax", temperature=0)
    with pytest.raises(ValueError, match="Vs\\[1\\]"):
        ag.deep_lightning(x, [A, np.eye(3)], [V, np.ones((2, 4))])
    with pytest.raises(ValueError, match="As\\[1\\]"):
        ag.deep_lightning(x, [A, np.eye(4)], [V, np.ones((2, 3))])
    with pytest.raises(ValueError, match="equal length"):
        ag.deep_lightning(x, [A], [])
    with pytest.raises(ValueError, match="x contains NaN"):
        ag.lightning_layer(np.full((3, 4), np.nan), A, V)


def test_deprecated_normalize_keyword(rng):
    x, A, V = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
    for normalize, kind in ((True, "softmax"), (False, "lightning")):
        with pytest.warns(DeprecationWarning, match="normalize= is deprecated"):
            old = ag.lightning_layer(x, A, V, normalize=normalize)
        np.testing.assert_array_equal(old, ag.lightning_layer(x, A, V, kind=kind))
        with pytest.warns(DeprecationWarning, match="normalize= is deprecated"):
            old = ag.deep_lightning(x, [A], [V], normalize=normalize, temperature=0.5)
        np.testing.assert_array_equal(old, ag.deep_lightning(x, [A], [V], kind=kind, temperature=0.5))
    with pytest.raises(ValueError, match="kind must be one of"):
        ag.lightning_layer(x, A, V, kind="normalized")


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("dtype, big", [(np.float32, 1e15), (np.float64, 1e120)])
def test_lightning_refuses_an_output_beyond_the_float_range(rng, causal, dtype, big):
    # Finite operands whose products overflow in one query row of the second batch element,
    # in the first chunk, at a chunk's edge or in the last one (chunks of 64 rows): the core
    # checks each chunk of y as it writes it and the refusal names the largest operand.
    n = 150
    q, k, v = (rng.standard_normal((2, n, 8)).astype(dtype) for _ in range(3))
    k *= big
    v *= big
    for row in (0, 63, 64, n - 1):
        qq = q.copy()
        qq[1, row] *= big
        with pytest.raises(ag.errors.ResultOverflow, match="^lightning_attention: .* beyond the float range"):
            ag.lightning_attention(qq, k, v, causal=causal)
    y = ag.lightning_attention(q / big, k, v / big, causal=causal)  # the same operands scaled back fit
    assert np.isfinite(y).all()
