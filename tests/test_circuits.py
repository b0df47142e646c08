"""Circuits (notes "linear algebra applications for transformers"): tensor-product heads,
virtual heads, composition scores, residual paths, layer norm, MoE routing, MLA, embeddings,
MLP key-value writes; each against a direct NumPy computation."""
import math

import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag


def stochastic(rng, *shape):
    a = rng.random(shape)
    return a / a.sum(-1, keepdims=True)


def test_head_operator_is_the_kronecker_product(rng):
    n, d = 5, 4
    A, W, X = stochastic(rng, n, n), rng.standard_normal((d, d)), rng.standard_normal((n, d))
    y = ag.head_operator(A, W, X)
    # W is the row-convention W_OV (x -> x W_OV); the notes' column matrix is W^T, and their
    # (A (x) W^T) acting on vec(X) with X's rows as positions is np.kron(A, W.T) @ X.ravel()
    assert rel_err(y.ravel(), np.kron(A, W.T) @ X.ravel()) <= 1e-14
    # the notes' NumPy tensor form A[:, :, None, None] * W_col[None, None, :, :]
    T = A[:, :, None, None] * W.T[None, None, :, :]
    assert rel_err(y, np.einsum("ijab,jb->ia", T, X)) <= 1e-14


def test_head_operator_takes_the_row_convention_ov_circuit(rng):
    """W_OV = W_V W_O (TransformerLens layout): the head's output is P (X W_V) W_O."""
    n, d, h = 5, 6, 2
    P, X = stochastic(rng, n, n), rng.standard_normal((n, d))
    W_V, W_O = rng.standard_normal((d, h)), rng.standard_normal((h, d))
    assert rel_err(ag.head_operator(P, W_V @ W_O, X), P @ (X @ W_V) @ W_O) <= 1e-14
    with pytest.raises(ValueError, match=r"W_OV must have shape \(\.\.\., d_model, d_out\) with 6 rows \(the columns of X"):
        ag.head_operator(P, rng.standard_normal((3, d)), X)


def test_deprecated_routing_keywords(rng):
    n, d = 4, 3
    P1, P2, X = stochastic(rng, n, n), stochastic(rng, n, n), rng.standard_normal((n, d))
    W1, W2 = rng.standard_normal((2, d, d))
    with pytest.warns(DeprecationWarning, match="'P' is deprecated, use 'routing'"):
        old = ag.head_operator(P=P1, W_OV=W1, X=X)
    np.testing.assert_array_equal(old, ag.head_operator(routing=P1, W_OV=W1, X=X))
    with pytest.warns(DeprecationWarning) as record:
        old = ag.virtual_head(P1=P1, W_OV1=W1, P2=P2, W_OV2=W2)
    messages = [str(w.message) for w in record]
    assert any("'P1' is deprecated, use 'routing1'" in m for m in messages)
    assert any("'P2' is deprecated, use 'routing2'" in m for m in messages)
    new = ag.virtual_head(routing1=P1, W_OV1=W1, routing2=P2, W_OV2=W2)
    np.testing.assert_array_equal(old[0], new[0])
    np.testing.assert_array_equal(old[1], new[1])
    with pytest.raises(TypeError, match="both 'P'"):
        ag.head_operator(routing=P1, W_OV=W1, X=X, P=P1)


def test_virtual_head_mixed_product(rng):
    n, d = 6, 5
    P1, P2 = stochastic(rng, n, n), stochastic(rng, n, n)
    W1, W2 = rng.standard_normal((2, d, d))
    X = rng.standard_normal((n, d))
    P, W = ag.virtual_head(P1, W1, P2, W2)
    seq = ag.head_operator(P2, W2, ag.head_operator(P1, W1, X))
    assert rel_err(ag.head_operator(P, W, X), seq) <= 1e-14
    with pytest.raises(ValueError, match="W_OV2"):
        ag.virtual_head(P1, W1, P2, np.ones((d + 1, d)))
    # row convention: the virtual OV map is W1 W2
    np.testing.assert_allclose(W, W1 @ W2)


def dense_scores(Q, K, V, O, mode):
    L, H = Q.shape[:2]
    out = np.zeros((L, H, L, H))
    for l1, h1, l2, h2 in np.ndindex(L, H, L, H):
        if l1 >= l2:
            continue
        left = V[l1, h1] @ O[l1, h1]
        right = {"Q": Q[l2, h2] @ K[l2, h2].T, "K": K[l2, h2] @ Q[l2, h2].T, "V": V[l2, h2] @ O[l2, h2]}[mode]
        out[l1, h1, l2, h2] = np.linalg.norm(left @ right) / (np.linalg.norm(left) * np.linalg.norm(right))
    return out


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_scores(rng, mode):
    L, H, d, h = 3, 4, 16, 3
    Q, K, V = rng.standard_normal((3, L, H, d, h))
    O = rng.standard_normal((L, H, h, d))
    S = ag.composition_scores(Q, K, V, O, mode)
    assert S.shape == (L, H, L, H)
    np.testing.assert_allclose(S, dense_scores(Q, K, V, O, mode), rtol=1e-12, atol=1e-15)
    assert np.all(S[1, :, :2] == 0) and np.all(S[2] == 0)
    assert np.all((S >= 0) & (S <= 1 + 1e-12))


def test_composition_known_answer():
    # head (0, 0) writes along e_0; head (1, 0) reads queries from e_0: full Q-composition;
    # head (1, 1) reads from e_1, orthogonal: zero.
    d, h = 4, 1
    e = np.eye(d)
    Q = np.zeros((2, 2, d, h)); K = np.zeros((2, 2, d, h)); V = np.zeros((2, 2, d, h)); O = np.zeros((2, 2, h, d))
    V[0, 0, :, 0] = e[2]; O[0, 0, 0] = e[0]
    Q[1, 0, :, 0] = e[0]; K[1, 0, :, 0] = e[3]
    Q[1, 1, :, 0] = e[1]; K[1, 1, :, 0] = e[3]
    V[0, 1, :, 0] = e[2]; O[0, 1, 0] = e[2]
    Q[0, :, :, 0] = e[3]; K[0, :, :, 0] = e[3]; V[1, :, :, 0] = e[3]; O[1, :, 0] = e[3]
    S = ag.composition_scores(Q, K, V, O, "Q")
    assert S[0, 0, 1, 0] == pytest.approx(1.0) and S[0, 0, 1, 1] == 0.0


def test_path_expansion_sums_to_forward(rng):
    L, H, n, d = 3, 2, 5, 4
    P = stochastic(rng, L, H, n, n)
    W = rng.standard_normal((L, H, d, d)) * 0.5
    J = rng.standard_normal((L, d, d)) * 0.3
    x = rng.standard_normal((n, d))
    for mlp in (None, J):
        ex = ag.path_expansion(P, W, x, mlp_jacobians=mlp)
        # direct forward pass, written out
        r = x.copy()
        for l in range(L):
            r = r + sum(P[l, h] @ r @ W[l, h] for h in range(H))
            if mlp is not None:
                r = r + r @ mlp[l].T
        assert rel_err(ex.forward, r) <= 1e-13
        assert rel_err(ex.total(), r) <= 1e-12
        assert len(ex.paths) == (H + 1) ** L * (2 ** L if mlp is not None else 1)
    ex = ag.path_expansion(P, W, x)
    np.testing.assert_allclose(ex.paths[()], x)
    np.testing.assert_allclose(ex.paths[((0, 1),)], P[0, 1] @ x @ W[0, 1])
    np.testing.assert_allclose(ex.paths[((0, 1), (2, 0))], P[2, 0] @ P[0, 1] @ x @ W[0, 1] @ W[2, 0])
    # a virtual two-head path is the virtual head applied to x
    Pv, Wv = ag.virtual_head(P[0, 1], W[0, 1], P[2, 0], W[2, 0])
    assert rel_err(ex.paths[((0, 1), (2, 0))], ag.head_operator(Pv, Wv, x)) <= 1e-14
    short = ag.path_expansion(P, W, x, max_length=1)
    assert len(short.paths) == 1 + L * H and set(short.by_length()) == {0, 1}
    assert rel_err(sum(ex.by_length().values()), ex.forward) <= 1e-12


def test_layernorm_jacobian(rng):
    d = 7
    x = rng.standard_normal((3, d)) * 2 + 1
    gamma = rng.standard_normal(d)
    J = ag.layernorm_jacobian(x, gamma)
    assert J.shape == (3, d, d)
    h = 1e-6
    for b in range(3):
        fd = np.stack([(ag.layernorm(x[b] + h * e, gamma) - ag.layernorm(x[b] - h * e, gamma)) / (2 * h)
                       for e in np.eye(d)], axis=1)
        assert rel_err(J[b], fd) <= 1e-6
    np.testing.assert_allclose(J @ np.ones(d), 0, atol=1e-14)  # annihilates the all-ones direction
    c = x - x.mean(-1, keepdims=True)
    var = (c * c).mean(-1)
    Jc = np.einsum("bij,bj->bi", J, c)
    # J c = gamma * c * eps / (s (var + eps)): small, zero only for eps -> 0
    want = gamma * c * (1e-5 / (np.sqrt(var + 1e-5) * (var + 1e-5)))[:, None]
    assert rel_err(Jc, want) <= 1e-8
    J0 = ag.layernorm_jacobian(x, gamma, eps=0.0)
    np.testing.assert_allclose(np.einsum("bij,bj->bi", J0, c), 0, atol=1e-13)
    B = ag.layernorm_jacobian(x[0], eps=0.0) * np.sqrt(var[0])  # the bracket: a projector, not stochastic
    np.testing.assert_allclose(B @ B, B, atol=1e-13)
    assert np.allclose(B.sum(1), 0) and B.min() < 0
    with pytest.raises(ValueError, match="zero variance"):
        ag.layernorm_jacobian(np.ones(4), eps=0.0)
    with pytest.raises(ValueError, match="gamma"):
        ag.layernorm_jacobian(x, np.ones(d + 1))
    with pytest.raises(ValueError, match="eps"):
        ag.layernorm_jacobian(x, eps=-1)


def test_topk_router_and_gram(rng):
    g = rng.standard_normal((50, 8))
    R = ag.topk_router(g, 2)
    assert np.all(np.count_nonzero(R, axis=1) == 2)
    np.testing.assert_allclose(R.sum(1), 1)
    top = np.argsort(-g, axis=1)[:, :2]
    for t in range(50):
        w = np.exp(g[t, top[t]] - g[t, top[t]].max())
        np.testing.assert_allclose(R[t, top[t]], w / w.sum())
    gram = ag.router_gram(R)
    np.testing.assert_allclose(gram.gram, R.T @ R)
    np.testing.assert_allclose(gram.loads, R.sum(0))
    assert 0 < gram.off_diagonal_mass < 1 and gram.imbalance > 0
    # balanced one-hot routing: diagonal Gram, kT/E on the diagonal, no imbalance (notes' lemma)
    T, E = 40, 4
    onehot = np.eye(E)[np.arange(T) % E]
    bal = ag.router_gram(onehot)
    np.testing.assert_allclose(bal.gram, np.eye(E) * T / E)
    assert bal.off_diagonal_mass == 0 and bal.imbalance == 0
    ties = ag.topk_router(np.zeros((1, 4)), 2)
    np.testing.assert_allclose(ties, [[0.5, 0.5, 0, 0]])
    with pytest.raises(ValueError, match="k must be"):
        ag.topk_router(g, 9)
    with pytest.raises(ValueError, match="non-negative"):
        ag.router_gram(-R)


def test_latent_factorization_eckart_young(rng):
    K = rng.standard_normal((40, 12)) @ np.diag(np.geomspace(10, 0.01, 12)) @ rng.standard_normal((12, 30))
    s = np.linalg.svd(K, compute_uv=False)
    for r in (1, 5, 12):
        f = ag.latent_factorization(K, r)
        assert f.U.shape == (40, r) and f.Z.shape == (r, 30)
        assert f.error == pytest.approx(np.sum(s[r:] ** 2), rel=1e-10, abs=1e-20 * s[0] ** 2)
        # At r = 12 (the rank of K) the tail is rounding noise, of order (eps s_0)^2 on both
        # sides: measured <= 2.8 (eps s_0)^2 apart over 50 seeds; below the rank, <= 2.1e-15 relative.
        assert f.tail_energy == pytest.approx(np.sum(s[r:] ** 2), rel=1e-12, abs=100 * (np.finfo(float).eps * s[0]) ** 2)
        assert f.condition == pytest.approx(s[0] / s[r - 1], rel=1e-12, abs=0)
        np.testing.assert_allclose(f.Z @ f.Z.T, np.eye(r), atol=1e-13)
    with pytest.raises(ValueError, match="rank"):
        ag.latent_factorization(K, 0)


def test_principal_angles_and_injectivity(rng):
    d = 12
    E = rng.standard_normal((d, 5))
    P = rng.standard_normal((d, 4))
    angles = ag.principal_angles(E, P)
    assert angles.shape == (4,)
    inj = ag.embedding_injectivity(E, P)
    assert inj.injective and inj.smallest_angle == pytest.approx(angles.min()) and inj.dims == (5, 4, d)
    # a shared direction breaks injectivity: (i, pos) pairs collide
    P2 = np.column_stack([P[:, :3], E[:, 0] + E[:, 1]])
    bad = ag.embedding_injectivity(E, P2)
    assert not bad.injective and bad.smallest_angle < 1e-7
    # too many dimensions: spans must meet
    assert not ag.embedding_injectivity(rng.standard_normal((d, 8)), rng.standard_normal((d, 6))).injective
    # a known angle
    a = np.array([[1.0], [0.0]])
    b = np.array([[math.cos(0.3)], [math.sin(0.3)]])
    assert ag.principal_angles(a, b)[0] == pytest.approx(0.3, abs=1e-15)


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh", "silu", "identity", np.tanh])
def test_mlp_key_value(rng, activation):
    x = rng.standard_normal((2, 6, 8))
    W1, W2 = rng.standard_normal((8, 20)), rng.standard_normal((20, 8))
    b1, b2 = rng.standard_normal(20), rng.standard_normal(8)
    kv = ag.mlp_key_value(x, W1, W2, activation, b1=b1, b2=b2)
    assert rel_err(kv.writes().sum(-2) + b2, kv.output) <= 1e-13
    phi = {"relu": lambda z: np.maximum(z, 0), "identity": lambda z: z, "silu": lambda z: z / (1 + np.exp(-z)),
           "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))}
    f = activation if callable(activation) else phi[activation]
    assert rel_err(kv.output, f(x @ W1 + b1) @ W2 + b2) <= 1e-14
    np.testing.assert_allclose(kv.keys, W1.T)
    idx, norms = kv.top_neurons((0, 2), k=3)
    assert len(idx) == 3 and np.all(np.diff(norms) <= 0)
    with pytest.raises(ValueError, match="activation"):
        ag.mlp_key_value(x, W1, W2, "swish2")
    with pytest.raises(ValueError, match="W2"):
        ag.mlp_key_value(x, W1, W2[:5])


def test_bad_input(rng):
    with pytest.raises(ValueError, match="routing"):
        ag.head_operator(np.ones((3, 4)), np.eye(2), np.ones((3, 2)))
    with pytest.raises(ValueError, match="X contains NaN"):
        ag.head_operator(np.eye(2), np.eye(2), np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="mode"):
        ag.composition_scores(*np.ones((3, 1, 1, 2, 1)), np.ones((1, 1, 1, 2)), mode="O")
    with pytest.raises(ValueError, match="W_O must have shape"):
        ag.composition_scores(*np.ones((3, 2, 1, 4, 2)), np.ones((2, 1, 4, 2)))
    with pytest.raises(ValueError, match="routing"):
        ag.path_expansion(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="max_length"):
        ag.path_expansion(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((2, 2)), max_length=-1)
    with pytest.raises(ValueError, match="E must be non-empty"):
        ag.embedding_injectivity(np.ones((3, 0)), np.ones((3, 1)))


def test_layernorm_at_the_float_limits():
    """Rows are scaled by their largest entry before the mean: a constant row near the float
    maximum normalises to 0 (its mean's sum overflowed before), and a row of huge and small
    entries keeps the small one's share."""
    assert np.array_equal(ag.layernorm(np.full(4, 1e308)), np.zeros(4))
    y = ag.layernorm(np.array([1e300, -1e300, 3.0]))
    # mean 1, c = (1e300, -1e300, 2), s = 1e300 sqrt(2 / 3)
    assert np.allclose(y, [np.sqrt(1.5), -np.sqrt(1.5), 2e-300 * np.sqrt(1.5)], rtol=1e-12, atol=0)


@pytest.mark.parametrize("size", [1e-150, 1e150, 1e200, 1e300])
def test_layernorm_jacobian_at_any_scale(size):
    """With eps = 0 the Jacobian is homogeneous of degree -1: J(size x) size = J(x); the squares
    of a 1e200 row overflowed to a spurious ResultOverflow. A constant row with eps > 0 keeps
    J = (I - 1/d) / sqrt(eps) at any size."""
    x = np.array([[1.0, 2.0, 4.0], [-3.0, 0.5, 0.25]])
    want = ag.layernorm_jacobian(x, eps=0.0)
    got = ag.layernorm_jacobian(x * size, eps=0.0) * size
    assert np.max(np.abs(got - want)) <= 1e-14 * np.max(np.abs(want))
    J = ag.layernorm_jacobian(np.full(3, size), eps=1e-5)
    assert np.allclose(J, (np.eye(3) - 1 / 3) / np.sqrt(1e-5), rtol=1e-14, atol=0)


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_scores_do_not_depend_on_weight_scale(rng, mode):
    """Each score is homogeneous of degree 0 in every weight tensor: the same for weights
    scaled by 1e50 or 1e-200 (a spurious ResultOverflow at 1e50 before)."""
    W = [rng.standard_normal(s) for s in ((2, 2, 8, 4), (2, 2, 8, 4), (2, 2, 8, 4), (2, 2, 4, 8))]
    want = ag.composition_scores(*W, mode)
    for size in (1e50, 1e-200):
        got = ag.composition_scores(*[w * size for w in W], mode)
        assert np.max(np.abs(got - want)) <= 1e-14
    assert np.array_equal(ag.composition_scores(*[w * 2.0 ** 40 for w in W], mode), want)  # powers of 2: exact
