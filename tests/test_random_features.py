"""FAVOR+ positive random features (Laplace-Radon s.7.3 item 3)."""
import math

import numpy as np
import pytest
from conftest import rel_err

import attngeom as ag
import reference as ref


def head(rng, n_q=48, n_k=96, d=8, d_v=3, s=0.7):
    return (s * rng.standard_normal((n_q, d)), s * rng.standard_normal((n_k, d)), rng.standard_normal((n_k, d_v)))


def z_estimates(q, k, v, m, orthogonal, seeds):
    return np.array([np.exp(ag.random_feature_attention(q, k, v, num_features=m, orthogonal=orthogonal, seed=s,
                                                        return_log_partition=True)[1]) for s in seeds])


@pytest.mark.parametrize("orthogonal", [True, False])
def test_partition_estimate_is_unbiased(rng, orthogonal):
    q, k, v = head(rng)
    _, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    est = z_estimates(q, k, v, 32, orthogonal, range(400))
    se = est.std(0, ddof=1) / math.sqrt(len(est))
    z_scores = (est.mean(0) - Z) / se
    assert np.all(np.abs(z_scores) < 4.5)  # every query (48 of them) within 4.5 standard errors
    assert np.mean(np.abs(z_scores) < 3) > 0.95  # and 3 standard errors for nearly all


def test_orthogonal_beats_iid_and_error_falls_with_m(rng):
    q, k, v = head(rng)
    y_exact, log_z = ag.softmax_attention(q, k, v, return_log_partition=True)
    Z = np.exp(log_z)
    mse = {}
    for orth in (True, False):
        est = z_estimates(q, k, v, 64, orth, range(60))
        mse[orth] = np.mean((est / Z - 1) ** 2)
    assert mse[True] < mse[False]
    errs = [np.mean([np.abs(ag.random_feature_attention(q, k, v, num_features=m, seed=s) - y_exact).mean()
                     for s in range(20)]) for m in (16, 64, 256, 1024)]
    assert all(a > b for a, b in zip(errs, errs[1:]))


def test_causal_equals_prefix_estimates(rng):
    q, k, v = head(rng, n_q=40, n_k=40)
    y = ag.random_feature_attention(q, k, v, causal=True, seed=5, num_features=48)
    for i in (0, 7, 39):
        yi = ag.random_feature_attention(q[i:i + 1], k[:i + 1], v[:i + 1], seed=5, num_features=48)
        assert rel_err(y[i], yi[0]) <= 1e-12
    # bottom-right alignment for a block of new queries
    y_br = ag.random_feature_attention(q[:10], k, v[:40], causal="bottom_right", seed=5, num_features=48)
    assert rel_err(y_br[-1], ag.random_feature_attention(q[9:10], k, v[:40], seed=5, num_features=48)[0]) <= 1e-12


def test_features_and_batches(rng):
    x = rng.standard_normal((2, 5, 6))
    f = ag.random_features(x, 10, seed=1)
    W = ag.feature_matrix(6, 10, seed=1)
    direct = np.exp(x @ W.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / math.sqrt(10)
    assert rel_err(f.phi * np.exp(f.log_shift)[..., None], direct) <= 1e-13
    g = ag.random_features(x, 10, seed=1, per_row=False)
    assert np.allclose(g.log_shift, g.log_shift[..., :1]) and g.phi.max() <= 1 / math.sqrt(10) + 1e-15
    # orthogonal blocks: rows orthogonal inside each block of d
    Wo = ag.feature_matrix(6, 12, orthogonal=True, seed=2)
    G = Wo[:6] @ Wo[:6].T
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0, atol=1e-12)
    # batched heads with broadcast keys; float32 stays float32
    q = rng.standard_normal((3, 8, 4)).astype(np.float32)
    k = rng.standard_normal((8, 4)).astype(np.float32)
    y = ag.random_feature_attention(q, k, k, num_features=16)
    assert y.shape == (3, 8, 4) and y.dtype == np.float32


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (37, 70), (130, 65)])
def test_matches_reference(rng, dtype, tol, n_q, n_k):
    """The core's feature map + lightning product equals FAVOR+ written out in NumPy."""
    q = rng.standard_normal((2, n_q, 8)).astype(dtype)
    k, v = rng.standard_normal((2, 2, n_k, 8)).astype(dtype)
    y, log_z = ag.random_feature_attention(q, k, v, num_features=24, seed=3, scale=0.3,
                                           return_log_partition=True)
    W = ag.feature_matrix(8, 24, seed=3)
    expected = ref.favor_attention(q.astype(float), k.astype(float), v.astype(float), W, 0.3)
    assert y.dtype == dtype and log_z.dtype == dtype
    assert rel_err(y, expected) <= tol
    fq = np.exp((np.sqrt(0.3) * q.astype(float)) @ W.T - 0.15 * np.sum(q.astype(float) ** 2, -1, keepdims=True))
    fk = np.exp((np.sqrt(0.3) * k.astype(float)) @ W.T - 0.15 * np.sum(k.astype(float) ** 2, -1, keepdims=True))
    assert np.max(np.abs(log_z - np.log(fq @ fk.sum(-2)[..., None] / 24)[..., 0])) <= 100 * tol


def test_bad_input(rng):
    q, k, v = head(rng)
    with pytest.raises(ValueError, match="num_features"):
        ag.random_feature_attention(q, k, v, num_features=0)
    with pytest.raises(ValueError, match="num_features"):
        ag.random_features(q, 0)
    with pytest.raises(ValueError, match="k must have shape"):
        ag.random_feature_attention(q, k[:, :3], v)
    with pytest.raises(ValueError, match="v must have shape"):
        ag.random_feature_attention(q, k, v[:5])
    with pytest.raises(ValueError, match="q contains NaN"):
        ag.random_feature_attention(np.full_like(q, np.nan), k, v)
    with pytest.raises(ValueError, match="k must be non-empty"):
        ag.random_feature_attention(q, k[:0], v[:0])
    with pytest.raises(ValueError, match="causal"):
        ag.random_feature_attention(q, k, v, causal="left")
    with pytest.raises(ValueError, match="scale"):
        ag.random_feature_attention(q, k, v, scale=-1.0)


# ---- the fused forward -------------------------------------------------------------------
# random_feature_attention runs one core kernel (features block by block, running-max key
# shift); these references form the (n, m) feature matrices.

CAUSAL = [False, True, "bottom_right"]


def log_err(a, b):
    """Largest |a - b| over entries where both are finite, relative to max(1, |b|); the
    -inf entries (no visible key) must coincide."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert np.array_equal(np.isneginf(a), np.isneginf(b)) and np.all(np.isfinite(a) | np.isneginf(a))
    fin = np.isfinite(b)
    return float(np.max(np.abs(a[fin] - b[fin]) / np.maximum(1.0, np.abs(b[fin])), initial=0.0))


def fused_and_log_domain(q, k, v, m, seed, scale, causal):
    """(y, log Z) of the fused forward and of the log-domain reference. Where a query sees no
    key (bottom-right alignment with n_q > n_k) log Z is -inf and y is 0."""
    W = ag.feature_matrix(q.shape[-1], m, seed=seed)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qb, kb, vb = (np.broadcast_to(a, lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:]).astype(float)
                  for a in (q, k, v))
    parts = [ref.favor_log_domain(qi, ki, vi, W, scale, causal) for qi, ki, vi in zip(qb, kb, vb)]
    y_ref = np.stack([p[0] for p in parts]).reshape(lead + (q.shape[-2], v.shape[-1]))
    lz_ref = np.stack([p[1] for p in parts]).reshape(lead + (q.shape[-2],))
    kw = dict(num_features=m, seed=seed, scale=scale, causal=causal)
    y, log_z = ag.random_feature_attention(q, k, v, return_log_partition=True, **kw)
    assert np.all(y[np.isneginf(lz_ref)] == 0)
    assert np.array_equal(ag.random_feature_attention(q, k, v, **kw), y)
    return y, log_z, y_ref, lz_ref


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("lead_q, lead_k, n_q, n_k, d, d_v, m", [
    ((), (), 1, 1, 4, 2, 8),
    ((), (), 1, 200, 4, 3, 16),
    ((2,), (2,), 129, 257, 8, 5, 24),   # ragged: not multiples of the 128-row blocks or the 64-query chunks
    ((2, 3), (1, 3), 70, 70, 6, 6, 33),  # batch dims broadcast, m not a multiple of d
    ((3,), (), 200, 131, 5, 1, 7),       # keys shared by three heads, d_v = 1, n_q > n_k
])
def test_fused_matches_log_domain_reference(rng, causal, dtype, tol, lead_q, lead_k, n_q, n_k, d, d_v, m):
    q = (0.6 * rng.standard_normal(lead_q + (n_q, d))).astype(dtype)
    k = (0.6 * rng.standard_normal(lead_k + (n_k, d))).astype(dtype)
    v = rng.standard_normal(lead_k + (n_k, d_v)).astype(dtype)
    y, log_z, y_ref, lz_ref = fused_and_log_domain(q, k, v, m, 4, 0.7, causal)
    assert y.dtype == dtype and y.shape == y_ref.shape
    assert rel_err(y, y_ref) <= tol
    assert log_z.dtype == dtype and log_z.shape == lz_ref.shape
    assert log_err(log_z, lz_ref) <= tol  # -inf exactly where a query sees no key
    if causal == "bottom_right" and n_q > n_k:
        assert np.all(np.isneginf(log_z[..., : n_q - n_k])) and np.all(np.isfinite(log_z[..., n_q - n_k:]))


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("batch, n_q, n_k", [(1, 1100, 1100), (2, 1300, 1037), (1, 1037, 1300)])
def test_fused_matches_materialised_path(rng, causal, dtype, tol, batch, n_q, n_k):
    """Long sequences: several key spans (non-causal), several segments (causal, batch 1)."""
    q = (0.5 * rng.standard_normal((batch, n_q, 8))).astype(dtype)
    k = (0.5 * rng.standard_normal((batch, n_k, 8))).astype(dtype)
    v = rng.standard_normal((batch, n_k, 3)).astype(dtype)
    y_ref, lz_ref = ref.favor_materialised(q, k, v, 40, 2, None, causal)
    y, log_z = ag.random_feature_attention(q, k, v, num_features=40, seed=2, causal=causal, return_log_partition=True)
    assert log_err(log_z, lz_ref) <= tol  # bottom-right, n_q > n_k: -inf where a query sees no key
    assert rel_err(y, y_ref) <= tol


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("size", [8.0, 40.0])
def test_fused_extreme_logits_stay_finite(rng, causal, size):
    """Large |q|, |k|: logits of -1e4 and below, spread over thousands; the shifts keep every
    exp in range and the result matches the log-domain reference."""
    q = size * rng.standard_normal((90, 6))
    k = size * rng.standard_normal((150, 6))
    v = rng.standard_normal((150, 2))
    y, log_z, y_ref, lz_ref = fused_and_log_domain(q, k, v, 16, 1, 1.0, causal)
    assert np.all(np.isfinite(y)) and not np.any(np.isnan(log_z))
    assert np.isfinite(lz_ref).sum() == np.isfinite(log_z).sum()
    assert rel_err(y, y_ref) <= 1e-9
    assert log_err(log_z, lz_ref) <= 1e-12


def test_causal_running_shift_avoids_underflow(rng):
    """Key norms falling along the sequence (logits -|k|^2 / 2 of about -7000 first, about 0
    last): a shift by the maximum over all keys (the materialised path) underflows the early
    queries' estimates (log Z off by thousands), the running maximum of the keys seen so far
    does not."""
    q = rng.standard_normal((200, 4))
    k = rng.standard_normal((200, 4)) * np.linspace(60.0, 0.1, 200)[:, None]
    v = rng.standard_normal((200, 3))
    y, log_z, y_ref, lz_ref = fused_and_log_domain(q, k, v, 8, 0, 1.0, True)
    _, lz_old = ref.favor_materialised(q, k, v, 8, 0, 1.0, True)
    assert np.all(np.isfinite(lz_ref)) and np.max(np.abs(lz_old - lz_ref)) > 1000
    assert np.all(np.isfinite(log_z))
    assert rel_err(y, y_ref) <= 1e-9 and log_err(log_z, lz_ref) <= 1e-12


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_is_bitwise_independent_of_threads(rng, causal, dtype):
    q = rng.standard_normal((1, 1300, 16)).astype(dtype) / 3
    k = rng.standard_normal((1, 1300, 16)).astype(dtype) / 3
    v = rng.standard_normal((1, 1300, 5)).astype(dtype)
    before = ag.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            ag.set_num_threads(n)
            out[n] = ag.random_feature_attention(q, k, v, num_features=64, causal=causal, return_log_partition=True)
    finally:
        ag.set_num_threads(before)
    for a, b in zip(out[1], out[2]):
        assert np.array_equal(a, b)


def test_feature_matrix_cache_is_not_shared(rng):
    W = ag.feature_matrix(8, 20, seed=11)
    fresh = ag.feature_matrix(8, 20, seed=np.random.default_rng(11))
    np.testing.assert_array_equal(W, fresh)
    W[:] = 0.0  # the caller's copy: the cached draw is untouched
    np.testing.assert_array_equal(ag.feature_matrix(8, 20, seed=11), fresh)
    assert ag.feature_matrix(8, 20, seed=11).flags.writeable
    iid = ag.feature_matrix(8, 20, orthogonal=False, seed=11)
    assert not np.array_equal(iid, fresh)
    np.testing.assert_array_equal(iid, np.random.default_rng(11).standard_normal((20, 8)))
    with pytest.raises(ValueError, match="seed"):
        ag.feature_matrix(8, 20, seed=-1)
    with pytest.raises(TypeError, match="seed"):
        ag.feature_matrix(8, 20, seed=1.5)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_does_not_depend_on_where_arrays_live(rng, causal, dtype):
    """Bitwise the same result for inputs copied to differently aligned buffers and for
    repeated calls (outputs land at different addresses): no product or reduction may write
    into the caller's arrays with alignment-dependent rounding."""
    q = (0.6 * rng.standard_normal((2, 3, 70, 6))).astype(dtype)
    k = (0.6 * rng.standard_normal((1, 3, 70, 6))).astype(dtype)
    v = rng.standard_normal((1, 3, 70, 6)).astype(dtype)

    def shifted(a, by):
        buf = np.empty(a.size + by, dtype)[by:]
        buf[:] = a.ravel()
        return buf.reshape(a.shape)

    first = ag.random_feature_attention(q, k, v, num_features=33, seed=4, scale=0.7, causal=causal,
                                        return_log_partition=True)
    for by in (0, 1, 2, 3, 0, 1):
        again = ag.random_feature_attention(shifted(q, by), shifted(k, by), shifted(v, by), num_features=33, seed=4,
                                            scale=0.7, causal=causal, return_log_partition=True)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))


# ---- the fused backward ------------------------------------------------------------------

def backward_and_log_domain(q, k, v, dy, m, seed, scale, causal):
    """(dq, dk, dv) of the fused backward and of the log-domain reference, over broadcast
    batch dims (the reference's cotangents summed back to the inputs' shapes)."""
    W = ag.feature_matrix(q.shape[-1], m, seed=seed)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qb, kb, vb = (np.broadcast_to(a, lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:]).astype(float)
                  for a in (q, k, v))
    dyb = dy.reshape((-1,) + dy.shape[-2:]).astype(float)
    parts = [ref.favor_log_domain_grads(*args, W, scale, causal) for args in zip(qb, kb, vb, dyb)]
    want = []
    for x, grads in zip((q, k, v), zip(*parts)):
        g = np.stack(grads).reshape(lead + x.shape[-2:])
        g = g.sum(axis=tuple(range(g.ndim - x.ndim)))
        want.append(g.sum(axis=tuple(i for i, n in enumerate(x.shape) if n == 1 and g.shape[i] != 1), keepdims=True))
    got = ag.random_feature_attention_backward(q, k, v, dy, num_features=m, seed=seed, scale=scale, causal=causal)
    return got, want


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("lead_q, lead_k, n_q, n_k, d, d_v, m", [
    ((), (), 1, 1, 4, 2, 8),
    ((), (), 3, 200, 4, 3, 16),
    ((2,), (2,), 129, 257, 8, 5, 24),   # ragged: three 64-query chunks, the last of one row
    ((2, 3), (1, 3), 70, 70, 6, 6, 33),  # batch dims broadcast: dk, dv summed over them
    ((3,), (), 200, 131, 5, 1, 7),       # n_q > n_k: bottom-right queries that see no key
    ((), (), 90, 100, 4, 9, 3),          # d_v > m
])
def test_backward_matches_log_domain_reference(rng, causal, dtype, tol, lead_q, lead_k, n_q, n_k, d, d_v, m):
    q = (0.6 * rng.standard_normal(lead_q + (n_q, d))).astype(dtype)
    k = (0.6 * rng.standard_normal(lead_k + (n_k, d))).astype(dtype)
    v = rng.standard_normal(lead_k + (n_k, d_v)).astype(dtype)
    dy = rng.standard_normal(np.broadcast_shapes(lead_q, lead_k) + (n_q, d_v)).astype(dtype)
    got, want = backward_and_log_domain(q, k, v, dy, m, 4, 0.7, causal)
    for name, g, w, x in zip("qkv", got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == dtype, name
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1.0)  # dq = 0 exactly with one key
        assert err <= tol, (name, err)


def test_backward_where_key_norms_fall(rng):
    """The sequence whose early queries the materialised path underflows (see
    test_causal_running_shift_avoids_underflow): each query is differentiated at the key
    shift its forward used, so the gradients match the log-domain reference."""
    q = rng.standard_normal((200, 4))
    k = rng.standard_normal((200, 4)) * np.linspace(60.0, 0.1, 200)[:, None]
    v = rng.standard_normal((200, 3))
    dy = rng.standard_normal((200, 3))
    got, want = backward_and_log_domain(q, k, v, dy, 8, 0, 1.0, True)
    for name, g, w in zip("qkv", got, want):
        assert np.all(np.isfinite(g)) and rel_err(g, w) <= 1e-9, (name, rel_err(g, w))


@pytest.mark.parametrize("dtype, tol, gap", [(np.float64, 1e-12, 700.0), (np.float32, 2e-5, 90.0)])
def test_rows_whose_hidden_keys_dominate_are_summed_exactly(dtype, tol, gap):
    """One causal chunk of 64 queries whose key norms fall fast along it: the keys a query may
    not see carry logits hundreds (float32: tens) of nats above the ones it sees, beyond the
    range of exp, so a shift shared by the chunk would underflow every term of those rows. The
    kernel sums them term by term; forward and backward match the log-domain reference, and
    stay bitwise equal at 1 and 2 threads."""
    rng = np.random.default_rng(5)
    n, d, m = 64, 4, 8
    q = rng.standard_normal((n, d)).astype(dtype)
    k = rng.standard_normal((n, d))
    k *= (np.linspace(60.0 if dtype == np.float64 else 20.0, 0.1, n) / np.linalg.norm(k, axis=1))[:, None]
    k = k.astype(dtype)
    v = rng.standard_normal((n, 3)).astype(dtype)
    dy = rng.standard_normal((n, 3)).astype(dtype)
    W = ag.feature_matrix(d, m, seed=0)
    lq, lk = (x.astype(float) @ W.T - 0.5 * np.sum(x.astype(float) ** 2, -1, keepdims=True) for x in (q, k))
    visible_top = np.array([np.max(lq[i] + lk[: i + 1].max(0)) for i in range(n)])
    block_top = np.max(lq + lk.max(0), axis=1)
    assert np.sum(block_top - visible_top > gap) >= 16  # rows a chunk-wide shift would lose
    kw = dict(num_features=m, seed=0, scale=1.0, causal=True)
    before = ag.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            ag.set_num_threads(threads)
            runs.append((ag.random_feature_attention(q, k, v, return_log_partition=True, **kw),
                         ag.random_feature_attention_backward(q, k, v, dy, **kw)))
    finally:
        ag.set_num_threads(before)
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert np.array_equal(a, b)
    (y, log_z), grads = runs[0]
    y_ref, lz_ref = ref.favor_log_domain(*(x.astype(float) for x in (q, k, v)), W, 1.0, True)
    assert rel_err(y, y_ref) <= tol and log_err(log_z, lz_ref) <= tol
    want = ref.favor_log_domain_grads(*(x.astype(float) for x in (q, k, v, dy)), W, 1.0, True)
    for name, g, w in zip("qkv", grads, want):
        assert np.all(np.isfinite(g)) and rel_err(g, w) <= tol, (name, rel_err(g, w))


@pytest.mark.parametrize("causal, n_q", [("top_left", 130), ("bottom_right", 100)])
@pytest.mark.parametrize("dtype, tol, top, values", [(np.float64, 1e-12, 60.0, (1e-40, 1.0, 1e12)),
                                                     (np.float32, 2e-5, 20.0, (1e-16, 1.0, 1e6))])
def test_spread_logits_hold_at_any_scale_of_the_values(dtype, tol, top, values, causal, n_q):
    """Key norms falling along each 64-query chunk (a sawtooth over three chunks): every chunk
    has rows summed exactly and fast rows whose keys hidden from them lie up to the kernel's gap
    above the ones they see, with the keys of earlier chunks in the state. y is linear in v and
    the cotangents bilinear in (v, dy), so values and cotangents scaled far down or up must
    keep their relative error: the fast rows' products meet them at the row's own shift."""
    rng = np.random.default_rng(11)
    n_k, d, m = 130, 4, 8
    q = rng.standard_normal((n_q, d)).astype(dtype)
    k = rng.standard_normal((n_k, d))
    saw = np.resize(np.linspace(top, 0.1, 64), n_k)
    k = (k * (saw / np.linalg.norm(k, axis=1))[:, None]).astype(dtype)
    v0 = rng.standard_normal((n_k, 3))
    dy0 = rng.standard_normal((n_q, 3))
    W = ag.feature_matrix(d, m, seed=0)
    kw = dict(num_features=m, seed=0, scale=1.0, causal=causal)
    for c in values:
        v, dy = (v0 * c).astype(dtype), (dy0 * c).astype(dtype)
        y, log_z = ag.random_feature_attention(q, k, v, return_log_partition=True, **kw)
        y_ref, lz_ref = ref.favor_log_domain(*(x.astype(float) for x in (q, k, v)), W, 1.0, causal)
        assert rel_err(y, y_ref) <= tol and log_err(log_z, lz_ref) <= tol, c
        grads = ag.random_feature_attention_backward(q, k, v, dy, **kw)
        want = ref.favor_log_domain_grads(*(x.astype(float) for x in (q, k, v, dy)), W, 1.0, causal)
        for name, g, w in zip("qkv", grads, want):
            assert rel_err(g, w) <= tol, (c, name, rel_err(g, w))


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_backward_is_bitwise_stable(rng, causal, dtype):
    """The same cotangents bitwise for 1 and 2 threads and for inputs at shifted addresses."""
    q = (0.6 * rng.standard_normal((3, 150, 6))).astype(dtype)
    k = (0.6 * rng.standard_normal((3, 150, 6))).astype(dtype)
    v = rng.standard_normal((3, 150, 5)).astype(dtype)
    dy = rng.standard_normal((3, 150, 5)).astype(dtype)

    def shifted(a, by):
        buf = np.empty(a.size + by, dtype)[by:]
        buf[:] = a.ravel()
        return buf.reshape(a.shape)

    kw = dict(num_features=33, seed=4, scale=0.7, causal=causal)
    before = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        first = ag.random_feature_attention_backward(q, k, v, dy, **kw)
        ag.set_num_threads(2)
        for by in (0, 1, 2, 3):
            again = ag.random_feature_attention_backward(*(shifted(a, by) for a in (q, k, v, dy)), **kw)
            assert all(np.array_equal(a, b) for a, b in zip(first, again))
    finally:
        ag.set_num_threads(before)


@pytest.mark.parametrize("dim, m", [(8, 12), (64, 16), (100, 7), (16, 64)])
def test_partial_blocks_draw_what_full_blocks_draw(dim, m):
    """A partial block of orthogonal features (m < dim included) takes the QR of the columns it
    needs only, and gives the rows of the full dim x dim draw (to rounding): same seed, same W."""
    rng = np.random.default_rng(3)
    blocks = []
    for _ in range(-(-m // dim)):
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        blocks.append((q * np.sign(np.diag(r))).T * np.sqrt(rng.chisquare(dim, size=dim))[:, None])
    assert np.allclose(ag.feature_matrix(dim, m, seed=3), np.concatenate(blocks)[:m], rtol=0, atol=1e-13)
