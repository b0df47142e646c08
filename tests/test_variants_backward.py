"""Backward passes of projection, lightning and random-feature attention and of the whitening recursion."""
import numpy as np
import pytest
from conftest import rel_err
from gradients import check_fd, draw, finite_difference

import attngeom as ag


# ---- lightning --------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q,n_k", [(5, 5), (3, 6), (6, 3)])
def test_lightning_backward_finite_differences(rng, causal, n_q, n_k):
    q, k, v = draw(rng, (2,), (1,), (2,), n_q, n_k, 3, 2)
    f = lambda q, k, v: ag.lightning_attention(q, k, v, causal=causal)
    b = lambda q, k, v, dy: ag.lightning_attention_backward(q, k, v, dy, causal=causal)
    check_fd(f, b, [q, k, v], rng)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("n_q,n_k", [(200, 200), (70, 150), (150, 70)])
def test_lightning_backward_matches_torch_autograd(rng, causal, n_q, n_k):
    torch = pytest.importorskip("torch")
    import reference as ref

    q, k, v = draw(rng, (2, 1), (1, 3), (2, 3), n_q, n_k, 5, 4)
    dy = rng.standard_normal((2, 3, n_q, 4))
    got = ag.lightning_attention_backward(q, k, v, dy, causal=causal)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    keep = torch.from_numpy(ref.causal_keep(n_q, n_k, causal))
    ((tq @ tk.transpose(-1, -2)) * keep @ tv).backward(torch.from_numpy(dy))
    for g, t in zip(got, (tq, tk, tv)):
        assert g.shape == tuple(t.shape)
        assert rel_err(g, t.grad.numpy()) <= 1e-10


# ---- projection ------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("with_v", [True, False])
def test_projection_backward_finite_differences(rng, causal, mask_kind, with_v):
    q, k, v = draw(rng, (2,), (1,), (2,), 4, 5, 3, 3)
    k += 3.0  # away from the origin: the centring matters
    mask = None
    if mask_kind == "bool":
        mask = rng.random((4, 5)) < 0.7
        mask[:, 0] = True
    elif mask_kind == "additive":
        mask = rng.standard_normal((4, 5))
    if with_v:
        f = lambda q, k, v: ag.projection_attention(q, k, v, sigma=0.9, causal=causal, mask=mask)
        b = lambda q, k, v, dy: ag.projection_attention_backward(q, k, v, dy, sigma=0.9, causal=causal, mask=mask)
        check_fd(f, b, [q, k, v], rng)
    else:
        f = lambda q, k: ag.projection_attention(q, k, sigma=0.9, causal=causal, mask=mask)
        y = f(q, k)
        dy = rng.standard_normal(y.shape)
        dq, dk, dv = ag.projection_attention_backward(q, k, None, dy, sigma=0.9, causal=causal, mask=mask)
        assert dv is None
        want = finite_difference(f, [q, k], dy)
        assert rel_err(dq, want[0]) <= 1e-7 and rel_err(dk, want[1]) <= 1e-7


def test_projection_backward_matches_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    q, k, v = draw(rng, (3,), (3,), (3,), 90, 300, 6, 4)
    dy = rng.standard_normal((3, 90, 4))
    got = ag.projection_attention_backward(q, k, v, dy, sigma=1.3)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    logw = -torch.cdist(tq, tk) ** 2 / (2 * 1.3 ** 2)
    (torch.softmax(logw, -1) @ tv).backward(torch.from_numpy(dy))
    for g, t in zip(got, (tq, tk, tv)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10


# ---- random features -------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_random_feature_backward_finite_differences(rng, causal):
    q, k, v = draw(rng, (2,), (2,), (), 4, 5, 3, 2)
    kw = dict(num_features=16, seed=3, causal=causal)
    f = lambda q, k, v: ag.random_feature_attention(q, k, v, **kw)
    b = lambda q, k, v, dy: ag.random_feature_attention_backward(q, k, v, dy, **kw)
    check_fd(f, b, [q, k, v], rng)


def test_random_feature_backward_matches_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    q, k, v = draw(rng, (2,), (2,), (2,), 100, 120, 8, 3)
    m, scale = 64, 0.3
    dy = rng.standard_normal((2, 100, 3))
    got = ag.random_feature_attention_backward(q, k, v, dy, num_features=m, seed=1, causal=True, scale=scale)
    W = torch.from_numpy(ag.feature_matrix(8, m, seed=1))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))

    def phi(x):
        x = x * scale ** 0.5
        return torch.exp(x @ W.T - 0.5 * (x * x).sum(-1, keepdim=True)) / m ** 0.5

    a = (phi(tq) @ phi(tk).transpose(-1, -2)).tril()
    ((a @ tv) / a.sum(-1, keepdim=True)).backward(torch.from_numpy(dy))
    for g, t in zip(got, (tq, tk, tv)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10


# ---- whitening ---------------------------------------------------------------------------

def whitening_pair(rng, D, lower=True):
    L = np.tril(rng.standard_normal((D, D)) * 0.3) + 2 * np.eye(D)
    if not lower:
        L = L + 0.3 * np.triu(rng.standard_normal((D, D)), 1)
    return L, 0.5 / np.sqrt(D) * rng.standard_normal((D, D))  # a stable filter (spectral radius < 1)


@pytest.mark.parametrize("lower", [True, False])
def test_whiten_backward_finite_differences(rng, lower):
    x = rng.standard_normal((2, 5, 3))
    L, M = whitening_pair(rng, 3, lower)
    w = ag.whiten(x, L, M)
    dw = rng.standard_normal(w.shape)
    dx, dL, dM = ag.whiten_backward(x, L, M, dw)
    # the full-matrix gradient of L: differentiate with the general (LU) path
    f = lambda x, L, M: ag.whiten(x, L, M)
    want = finite_difference(f, [x, L.copy(), M], dw)
    for g, t in zip((dx, dL, dM), want):
        assert g.shape == t.shape and rel_err(g, t) <= 1e-7


@pytest.mark.parametrize("lower", [True, False])
def test_whiten_backward_blocked_scan_equals_sequential(rng, lower):
    x = rng.standard_normal((3, 200, 5))
    L, M = whitening_pair(rng, 5, lower)
    dw = rng.standard_normal(x.shape)
    seq = ag.whiten_backward(x, L, M, dw)
    for block in (1, 7, 64, 500):
        scan = ag.whiten_backward(x, L, M, dw, block=block)
        for a, b in zip(scan, seq):
            assert rel_err(a, b) <= 1e-12
    # the adjoint is the forward recursion with transposed factors on reversed time
    assert rel_err(ag.whiten(dw[:, ::-1], L.T, M.T)[:, ::-1], seq.dx) <= 1e-13
    with pytest.raises(ValueError, match="block"):
        ag.whiten_backward(x, L, M, dw, block=0)


@pytest.mark.parametrize("lower", [True, False])
def test_whiten_backward_matches_torch_autograd(rng, lower):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((4, 3, 40, 6))
    L, M = whitening_pair(rng, 6, lower)
    dw = rng.standard_normal(x.shape)
    got = ag.whiten_backward(x, L, M, dw)
    tx, tL, tM = (torch.tensor(a, requires_grad=True) for a in (x, L, M))
    w, prev = [], None
    for i in range(x.shape[-2]):
        z = tx[..., i, :] if prev is None else tx[..., i, :] - prev @ tM.T
        prev = torch.linalg.solve(tL, z.unsqueeze(-1)).squeeze(-1)
        w.append(prev)
    torch.stack(w, dim=-2).backward(torch.from_numpy(dw))
    for g, t in zip(got, (tx, tL, tM)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10


def test_whiten_backward_float32_threads_and_bad_input(rng):
    x = rng.standard_normal((7, 30, 40))
    L, M = whitening_pair(rng, 40)
    dw = rng.standard_normal(x.shape)
    g64 = ag.whiten_backward(x, L, M, dw)
    g32 = ag.whiten_backward(*(a.astype(np.float32) for a in (x, L, M, dw)))
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32 and rel_err(a, b) <= 1e-4
    before = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        one = ag.whiten_backward(x, L, M, dw)
        ag.set_num_threads(2)
        two = ag.whiten_backward(x, L, M, dw)
    finally:
        ag.set_num_threads(before)
    for a, b in zip(one, two):
        assert rel_err(a, b) <= 1e-12
    with pytest.raises(ValueError, match="dw"):
        ag.whiten_backward(x, L, M, dw[:, 1:])
    bad = dw.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="dw"):
        ag.whiten_backward(x, L, M, bad)
    with pytest.raises(ValueError, match="dw"):
        ag.whiten_backward(x, L, M, dw.astype(complex))
    with pytest.raises(ValueError, match="L0"):
        ag.whiten_backward(x, np.stack([L] * 30), np.stack([M] * 30), dw)
    with pytest.raises(ValueError, match="M"):
        ag.whiten_backward(x, L, M[:2], dw)


@pytest.mark.parametrize("fn,args", [
    (ag.lightning_attention_backward, {}),
    (ag.projection_attention_backward, {"sigma": 0.5}),
    (ag.random_feature_attention_backward, {"num_features": 8}),
])
def test_variant_backward_bad_input(rng, fn, args):
    q, k, v = draw(rng, (2,), (2,), (2,), 4, 5, 3, 2)
    dy = rng.standard_normal((2, 4, 2))
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy[..., :1], **args)
    bad = dy.copy()
    bad[1, 2, 0] = np.inf
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, bad, **args)
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy.astype(complex), **args)
    with pytest.raises(ValueError, match="v"):
        fn(q, k, v[:, :3], dy, **args)
