"""Backward passes of softmax and kernel attention: finite differences, PyTorch autograd, threads, bad input."""
import math

import numpy as np
import pytest
from conftest import rel_err
from gradients import check_fd, draw

import attngeom as ag
import reference as ref


MASKS = ["none", "bool", "additive", "full_row"]


def make_mask(kind, rng, n_q, n_k):
    if kind == "none":
        return None
    if kind == "bool":
        m = rng.random((n_q, n_k)) < 0.7
        m[:, 0] = True
        return m
    if kind == "additive":
        m = rng.standard_normal((1, n_k))
        if n_k > 1:
            m[0, -1] = -np.inf  # a hidden key
        return m
    m = np.ones((n_q, n_k), bool)  # a fully masked row
    m[1] = False
    return m


# ---- softmax: finite differences ------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_softmax_backward_finite_differences(rng, causal, mask_kind):
    q, k, v = draw(rng, (2,), (1,), (2,), 4, 6, 3, 2)
    mask = make_mask(mask_kind, rng, 4, 6)
    f = lambda q, k, v: ag.softmax_attention(q, k, v, mask=mask, causal=causal, scale=0.7)
    b = lambda q, k, v, dy: ag.softmax_attention_backward(q, k, v, dy, mask=mask, causal=causal, scale=0.7)
    check_fd(f, b, [q, k, v], rng)


def test_softmax_backward_fully_masked_row_is_zero(rng):
    q, k, v = draw(rng, (), (), (), 4, 6, 3, 2)
    mask = np.ones((4, 6), bool)
    mask[2] = False
    dy = rng.standard_normal((4, 2))
    dq, dk, dv = ag.softmax_attention_backward(q, k, v, dy, mask=mask)
    assert np.all(dq[2] == 0)
    # the masked row's cotangent reaches nothing: the same as dy with that row zeroed
    dy0 = dy.copy()
    dy0[2] = 0
    g0 = ag.softmax_attention_backward(q, k, v, dy0, mask=mask)
    assert np.array_equal(dk, g0.dk) and np.array_equal(dv, g0.dv)
    # top-left causal with n_q > n_k: no row is empty; bottom-right: the first rows are
    dq, dk, dv = ag.softmax_attention_backward(q[:, :], k[:2], v[:2], dy, causal="bottom_right")
    assert np.all(dq[:2] == 0) and np.all(np.isfinite(dk))


# ---- softmax: PyTorch autograd of a plain-torch implementation ------------------------

def torch_softmax_attention(torch, q, k, v, mask, causal, scale):
    n_q, n_k = q.shape[-2], k.shape[-2]
    logits = scale * q @ k.transpose(-1, -2)
    keep = torch.from_numpy(ref.causal_keep(n_q, n_k, causal))
    if mask is not None:
        m = torch.from_numpy(np.asarray(mask))
        if m.dtype == torch.bool:
            keep = keep & m
        else:
            logits = logits + m
    logits = logits.masked_fill(~keep, -math.inf)
    p = torch.softmax(logits, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows: zeros, as the core
    return p @ v


SHAPES = [  # (batch q, batch k, batch v, n_q, n_k, d_k, d_v): several key and query blocks
    ((2,), (2,), (2,), 33, 65, 8, 5),
    ((2, 3), (1, 3), (2, 1), 70, 300, 16, 9),
    ((3,), (), (), 130, 600, 6, 6),
    ((), (), (), 1, 1, 3, 2),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_softmax_backward_matches_torch_autograd(rng, shape, causal, mask_kind):
    torch = pytest.importorskip("torch")
    q, k, v = draw(rng, *shape)
    mask = make_mask(mask_kind, rng, shape[3], shape[4])
    y = ag.softmax_attention(q, k, v, mask=mask, causal=causal)
    dy = rng.standard_normal(y.shape)
    got = ag.softmax_attention_backward(q, k, v, dy, mask=mask, causal=causal)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ty = torch_softmax_attention(torch, tq, tk, tv, mask, causal, 1 / math.sqrt(q.shape[-1]))
    ty.backward(torch.from_numpy(dy))
    assert rel_err(y, ty.detach().numpy()) <= 1e-12
    for g, t in zip(got, (tq, tk, tv)):
        assert g.shape == tuple(t.shape)
        assert rel_err(g, t.grad.numpy()) <= 1e-10


def test_softmax_backward_float32(rng):
    q, k, v = draw(rng, (2,), (2,), (2,), 100, 300, 16, 8)
    dy = rng.standard_normal((2, 100, 8))
    g64 = ag.softmax_attention_backward(q, k, v, dy, causal=True)
    g32 = ag.softmax_attention_backward(*(a.astype(np.float32) for a in (q, k, v)), dy.astype(np.float32),
                                        causal=True)
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32
        assert rel_err(a, b) <= 1e-4


def test_softmax_backward_saved_outputs_and_huge_logits(rng):
    q, k, v = draw(rng, (2,), (2,), (2,), 40, 50, 4, 3)
    q *= 300.0  # logits ~ 1e4
    y, lz = ag.softmax_attention(q, k, v, return_log_partition=True)
    dy = rng.standard_normal(y.shape)
    a = ag.softmax_attention_backward(q, k, v, dy)
    b = ag.softmax_attention_backward(q, k, v, dy, y=y, log_partition=lz)
    for x, z in zip(a, b):
        assert np.all(np.isfinite(x)) and np.array_equal(x, z)


@pytest.mark.parametrize("dtype, scales", [(np.float64, [1.0, 1e4, 1e8, 1e12, 1e16, 1e17]),
                                           (np.float32, [1.0, 1e2, 1e4, 1e6, 1e8])])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_weights_stay_normalised_at_any_logit_size(rng, dtype, scales, causal):
    """P = exp(l - log Z) is recomputed from the saved log Z, so its logits must be bitwise the
    forward's (the same score tiles): with one key P = 1 exactly and dv = dy at any logit size
    (logits from a differently ordered product were off by an ulp, which is e^(1/2) at 1e16).
    With many keys sum_j dv_j = sum_i dy_i, as the rows of P sum to 1 up to the rounding of
    log Z itself (half an ulp of log Z: relative 2^-25 of P at |log Z| ~ 500 in float32)."""
    q, k, v = (rng.standard_normal((2, 70, 5)).astype(dtype) for _ in range(3))
    dy = rng.standard_normal((2, 70, 5)).astype(dtype)
    eps = np.finfo(dtype).eps
    for scale in scales:
        one = ag.softmax_attention_backward(q[:, :1], k[:, :1], v[:, :1], dy[:, :1], scale=scale).dv
        assert np.array_equal(one, dy[:, :1]), scale
        _, lz = ag.softmax_attention(q, k, v, scale=scale, causal=causal, return_log_partition=True)
        tol = 50 * eps + float(np.max(np.spacing(np.abs(lz))))  # e^(ulp / 2) - 1 ~ ulp / 2, twice
        if tol > 1e-3:
            continue  # log Z itself no longer resolves P: only the one-key identity is meaningful
        dv = ag.softmax_attention_backward(q, k, v, dy, scale=scale, causal=causal).dv
        assert rel_err(dv.astype(float).sum(axis=1), dy.astype(float).sum(axis=1)) <= tol, scale


def test_softmax_backward_threads_do_not_change_results(rng):
    q, k, v = draw(rng, (3,), (3,), (3,), 300, 700, 16, 8)
    dy = rng.standard_normal((3, 300, 8))
    before = ag.get_num_threads()
    try:
        out = []
        for n in (1, 2, 3):
            ag.set_num_threads(n)
            out.append((ag.softmax_attention_backward(q, k, v, dy, causal=True),
                        ag.kernel_attention_backward(q, k, v, dy, kernel="gaussian", sigma=0.7)))
        for other in out[1:]:
            for a, b in zip(out[0], other):
                for x, z in zip(a, b):
                    assert np.array_equal(x, z)
    finally:
        ag.set_num_threads(before)


# ---- kernel attention ------------------------------------------------------------------

KERNELS = [("exp", {}), ("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.6}),
           ("stable", {"alpha": 1.5, "c": 0.7}), ("stable", {"alpha": 0.8, "c": 1.0}),
           ("stable", {"alpha": 1.0, "c": 1.0}), ("stable", {"alpha": 2.0, "c": 0.5})]


@pytest.mark.parametrize("kernel,params", KERNELS)
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_kernel_backward_finite_differences(rng, kernel, params, causal):
    q, k, v = draw(rng, (2,), (1,), (), 4, 5, 3, 2)
    q *= 2.0
    mask = make_mask("additive", rng, 4, 5)
    f = lambda q, k, v: ag.kernel_attention(q, k, v, kernel=kernel, mask=mask, causal=causal, **params)
    b = lambda q, k, v, dy: ag.kernel_attention_backward(q, k, v, dy, kernel=kernel, mask=mask, causal=causal,
                                                         **params)
    check_fd(f, b, [q, k, v], rng)


def test_stable_derivative_far_tail_finite_differences(rng):
    # |tau - s| beyond the table: the derivative of the tail series (alpha < 2) and of the
    # Gaussian (alpha = 2)
    q, k, v = draw(rng, (), (), (), 3, 4, 2, 2)
    k *= 40.0
    for params in ({"alpha": 1.2, "c": 1.0}, {"alpha": 0.6, "c": 1.0}):
        f = lambda q, k, v: ag.kernel_attention(q, k, v, kernel="stable", **params)
        b = lambda q, k, v, dy: ag.kernel_attention_backward(q, k, v, dy, kernel="stable", **params)
        check_fd(f, b, [q, k, v], rng)


def torch_kernel_attention(torch, q, k, v, kernel, params, scale):
    norm = torch.linalg.vector_norm(q, dim=-1, keepdim=True)
    u, tau = q / norm, scale * norm
    s = u @ k.transpose(-1, -2)
    if kernel == "gaussian":
        logw = -(s - tau) ** 2 / (2 * params["sigma"] ** 2)
    else:
        logw = -torch.log1p(((s - tau) / params["gamma"]) ** 2)
    return torch.softmax(logw, dim=-1) @ v


@pytest.mark.parametrize("kernel,params", [("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.6})])
def test_kernel_backward_matches_torch_autograd(rng, kernel, params):
    torch = pytest.importorskip("torch")
    q, k, v = draw(rng, (2, 3), (1, 3), (2, 1), 70, 300, 16, 9)
    dy = rng.standard_normal((2, 3, 70, 9))
    got = ag.kernel_attention_backward(q, k, v, dy, kernel=kernel, **params)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    torch_kernel_attention(torch, tq, tk, tv, kernel, params, 0.25).backward(torch.from_numpy(dy))
    for g, t in zip(got, (tq, tk, tv)):
        assert rel_err(g, t.grad.numpy()) <= 1e-10


def test_kernel_exp_backward_is_softmax_backward(rng):
    q, k, v = draw(rng, (2,), (2,), (2,), 10, 12, 4, 3)
    dy = rng.standard_normal((2, 10, 3))
    a = ag.kernel_attention_backward(q, k, v, dy, kernel="exp", scale=0.3)
    b = ag.softmax_attention_backward(q, k, v, dy, scale=0.3)
    assert all(np.array_equal(x, z) for x, z in zip(a, b))


def test_kernel_backward_zero_query(rng):
    q, k, v = draw(rng, (), (), (), 3, 5, 4, 2)
    q[1] = 0
    dy = rng.standard_normal((3, 2))
    dq, dk, dv = ag.kernel_attention_backward(q, k, v, dy, kernel="cauchy")
    assert np.all(dq[1] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


# ---- bad input --------------------------------------------------------------------------

@pytest.mark.parametrize("fn,kw", [(ag.softmax_attention_backward, {}),
                                   (ag.kernel_attention_backward, {"kernel": "gaussian"})])
def test_backward_bad_input(rng, fn, kw):
    q, k, v = draw(rng, (2,), (2,), (2,), 4, 5, 3, 2)
    dy = rng.standard_normal((2, 4, 2))
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy[:, :3], **kw)
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy[0], **kw)  # dy must have the broadcast output shape
    bad = dy.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, bad, **kw)
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy.astype(complex), **kw)
    with pytest.raises(ValueError, match="dy"):
        fn(q, k, v, dy > 0, **kw)
    y = ag.softmax_attention(q, k, v)
    with pytest.raises(ValueError, match="y"):
        fn(q, k, v, dy, y=y[:, :2], log_partition=np.zeros((2, 4)), **kw)
    with pytest.raises(ValueError, match="log_partition"):
        fn(q, k, v, dy, y=y, log_partition=np.zeros((2, 3)), **kw)
    with pytest.raises(ValueError, match="log_partition"):
        fn(q, k, v, dy, y=y, log_partition=np.full((2, 4), np.nan), **kw)
    with pytest.raises(ValueError, match="k"):
        fn(q, k[..., :2], v, dy, **kw)
    qn = q.copy()
    qn[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="q"):
        fn(qn, k, v, dy, **kw)
    # non-contiguous and integer inputs are accepted
    g = fn(np.asfortranarray(q), k[:, ::1], v.transpose(0, 2, 1).copy().transpose(0, 2, 1), dy, **kw)
    assert all(np.all(np.isfinite(x)) for x in g)
