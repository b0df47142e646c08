"""attngeom.torch: custom ops with autograd, gradcheck, torch.compile, zero-copy hand-over, modules, RoPE."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attngeom as ag  # noqa: E402
import attngeom.torch as agt  # noqa: E402


def tensors(shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, dtype=dtype, generator=g, requires_grad=True) for s in shapes]


def plain_softmax(q, k, v, causal, scale):
    logits = scale * q @ k.transpose(-1, -2)
    if causal:
        n_q, n_k = logits.shape[-2:]
        logits = logits.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril().logical_not(), -math.inf)
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_gradcheck_softmax(causal):
    q, k, v = tensors([(2, 4, 3), (1, 5, 3), (2, 5, 2)])
    mask = torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) < 0.8
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda q, k, v: agt.softmax_attention(q, k, v, causal=causal, mask=mask),
                                    (q, k, v))


@pytest.mark.parametrize("kernel,params", [("exp", {}), ("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.7}),
                                           ("stable", {"alpha": 1.3, "c": 1.0})])
def test_gradcheck_kernel(kernel, params):
    q, k, v = tensors([(2, 4, 3), (2, 5, 3), (2, 5, 2)], seed=2)
    assert torch.autograd.gradcheck(
        lambda q, k, v: agt.kernel_attention(q, k, v, kernel=kernel, causal=True, **params), (q, k, v))


def test_gradcheck_projection_lightning_whiten():
    q, k, v = tensors([(2, 4, 3), (2, 5, 3), (2, 5, 2)], seed=3)
    assert torch.autograd.gradcheck(lambda q, k, v: agt.projection_attention(q, k, v, sigma=0.9, causal=True),
                                    (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k: agt.projection_attention(q, k, sigma=1.2), (q, k))
    assert torch.autograd.gradcheck(lambda q, k, v: agt.lightning_attention(q, k, v, causal="bottom_right"),
                                    (q, k, v))
    x, = tensors([(2, 6, 3)], seed=4)
    L0 = (torch.eye(3, dtype=torch.float64) * 2 + 0.3 * torch.randn(3, 3, dtype=torch.float64).tril()).requires_grad_()
    M = (0.4 * torch.randn(3, 3, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, L, M: agt.whiten(x, torch.tril(L), M), (x, L0, M))
    assert torch.autograd.gradcheck(agt.whiten, (x, L0.detach().clone().requires_grad_(), M))


@pytest.mark.parametrize("op", ["softmax", "cauchy", "gaussian", "projection", "lightning", "whiten"])
def test_backward_is_reentrant_bitwise(op):
    """gradcheck's reentrance check, made strict: the same backward on the same tensors gives
    the same bits on every call, wherever the intermediate arrays are allocated."""
    q, k, v = tensors([(2, 37, 5), (2, 41, 5), (2, 41, 3)], seed=8)
    x, = tensors([(3, 29, 4)], seed=9)
    L = (torch.eye(4, dtype=torch.float64) * 2 + 0.3 * torch.randn(4, 4, dtype=torch.float64).tril(-1)).requires_grad_()
    M = (0.3 * torch.randn(4, 4, dtype=torch.float64)).requires_grad_()
    f = {"softmax": lambda: agt.softmax_attention(q, k, v, causal=True),
         "cauchy": lambda: agt.kernel_attention(q, k, v, kernel="cauchy", gamma=0.7, causal=True),
         "gaussian": lambda: agt.kernel_attention(q, k, v, kernel="gaussian", sigma=0.8),
         "projection": lambda: agt.projection_attention(q, k, v, sigma=0.9, causal=True),
         "lightning": lambda: agt.lightning_attention(q, k, v, causal=True),
         "whiten": lambda: agt.whiten(x, L, M)}[op]
    inputs = (x, L, M) if op == "whiten" else (q, k, v)
    out = f()
    dy = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    first, ballast = None, []
    for _ in range(8):
        ballast.append(torch.empty(1 + 37 * len(ballast), dtype=torch.float64))
        grads = torch.autograd.grad(f(), inputs, dy)
        if first is None:
            first = grads
        for g, g0 in zip(grads, first):
            assert torch.equal(g, g0)


def test_softmax_matches_plain_torch_in_float32_and_float64():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        q, k, v = tensors([(2, 3, 50, 8), (2, 3, 50, 8), (2, 3, 50, 8)], dtype=dtype, seed=5)
        y = agt.softmax_attention(q, k, v, causal=True)
        assert y.dtype == dtype
        y.square().sum().backward()
        ours = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        plain_softmax(q, k, v, True, 1 / math.sqrt(8)).square().sum().backward()
        for a, t in zip(ours, (q, k, v)):
            assert (a - t.grad).abs().max() <= tol * t.grad.abs().max() * 10


def test_torch_compile_one_call():
    q, k, v = tensors([(2, 2, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8)], seed=6)

    @torch.compile(fullgraph=True)  # the default (inductor) backend
    def f(q, k, v):
        return (agt.softmax_attention(q * 2, k, v, causal=True) ** 2).sum()

    loss = f(q, k, v)
    loss.backward()
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    (plain_softmax(ref[0] * 2, ref[1], ref[2], True, 1 / math.sqrt(8)) ** 2).sum().backward()
    assert torch.allclose(loss, (plain_softmax(ref[0] * 2, ref[1], ref[2], True, 1 / math.sqrt(8)) ** 2).sum())
    for t, r in zip((q, k, v), ref):
        assert torch.allclose(t.grad, r.grad, rtol=1e-10, atol=1e-12)


def test_zero_copy_and_device_errors(monkeypatch):
    q, k, v = (t.detach() for t in tensors([(4, 3), (5, 3), (5, 2)]))
    seen = []
    original = ag.attention.softmax_attention

    def spy(q, k, v, **kw):
        seen.append(q)
        return original(q, k, v, **kw)

    monkeypatch.setattr(ag.attention, "softmax_attention", spy)
    y = agt.softmax_attention(q, k, v)
    assert np.shares_memory(seen[0], q.numpy())  # the core saw the tensor's own memory
    qt = torch.randn(3, 4, dtype=torch.float64).t()  # non-contiguous: one copy, same result
    assert torch.allclose(agt.softmax_attention(qt, k, v), agt.softmax_attention(qt.contiguous(), k, v))
    assert y.shape == (4, 2)
    with pytest.raises(ValueError, match="float32 or float64"):
        agt.softmax_attention(q.to(torch.float16), k, v)
    with pytest.raises(ValueError, match="one dtype"):
        agt.softmax_attention(q.float(), k, v)
    with pytest.raises(ValueError, match="CPU"):
        agt.softmax_attention(q.to("meta"), k.to("meta"), v.to("meta"))


def test_rope_rotate_half_relative_positions():
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 6, 8, dtype=torch.float64, generator=g), torch.randn(1, 6, 8, dtype=torch.float64, generator=g)
    # rotating every row of q and k by the same vector: q_i.k_j depends on i - j only
    qs, ks = q[:, :1].expand(1, 6, 8), k[:, :1].expand(1, 6, 8)
    s = agt.rotary_embedding(qs) @ agt.rotary_embedding(ks).transpose(-1, -2)
    for off in range(-5, 6):
        d = torch.diagonal(s[0], off)
        assert torch.allclose(d, d[0].expand_as(d), atol=1e-12)
    # rotate-half layout: pair (x_i, x_{i + d/2}) at position 1 turns by theta_i = base^(-2i/d)
    x = torch.zeros(1, 2, 8, dtype=torch.float64)
    x[0, 1, 1] = 1.0
    r = agt.rotary_embedding(x)[0, 1]
    theta = 10000.0 ** (-2 / 8)
    assert abs(r[1] - math.cos(theta)) < 1e-15 and abs(r[5] - math.sin(theta)) < 1e-15
    assert torch.equal(agt.rotary_embedding(x)[0, 0], x[0, 0])


@pytest.mark.parametrize("variant,params", [("softmax", {}), ("kernel", {"kernel": "gaussian", "sigma": 2.0}),
                                            ("projection", {"sigma": 3.0}), ("lightning", {}), ("whitened", {})])
def test_multihead_self_attention_trains(variant, params):
    torch.manual_seed(0)
    block = agt.nn.MultiheadSelfAttention(16, 2, variant=variant, **params).double()
    x = torch.randn(3, 10, 16, dtype=torch.float64)
    target = torch.randn(3, 10, 16, dtype=torch.float64)
    opt = torch.optim.Adam(block.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = ((block(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())
    assert losses[-1] < losses[0]


def test_multihead_matches_plain_torch_and_causality():
    torch.manual_seed(1)
    block = agt.nn.MultiheadSelfAttention(12, 3, variant="softmax").double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    y = block(x)
    q, k, v = (t.view(2, 7, 3, 4).transpose(1, 2) for t in block.qkv(x).chunk(3, -1))
    q, k = agt.rotary_embedding(q), agt.rotary_embedding(k)
    ref = x + block.out(plain_softmax(q, k, v, True, 0.5).transpose(1, 2).reshape(2, 7, 12))
    assert torch.allclose(y, ref, atol=1e-12)
    x2 = x.clone()
    x2[:, 4:] += 1.0  # the future does not change the past
    assert torch.allclose(block(x2)[:, :4], y[:, :4], atol=1e-12)
    w = agt.nn.MultiheadSelfAttention(12, 3, variant="whitened").double()
    with torch.no_grad():
        w.M.normal_(std=0.2)
    xw = w(x)
    assert torch.allclose(w(x2)[:, :4], xw[:, :4], atol=1e-12)
    with pytest.raises(ValueError, match="n_heads"):
        agt.nn.MultiheadSelfAttention(10, 3)
    with pytest.raises(ValueError, match="variant"):
        agt.nn.MultiheadSelfAttention(12, 3, variant="nope")
    with pytest.raises(ValueError, match="sigma"):
        agt.nn.MultiheadSelfAttention(12, 3, variant="projection", gamma=1.0)


@pytest.mark.parametrize("kernel", [None, "gaussian"])
def test_forward_with_stats(kernel):
    """return_stats: the same y and gradients as without, and the NumPy API's statistics."""
    q, k, v = tensors([(2, 3, 20, 6), (2, 3, 30, 6), (2, 3, 30, 4)], seed=11)
    if kernel is None:
        f = lambda **kw: agt.softmax_attention(q, k, v, causal="bottom_right", **kw)  # noqa: E731
        _, ref = ag.softmax_attention(*(t.detach().numpy() for t in (q, k, v)), causal="bottom_right",
                                      return_stats=True)
    else:
        f = lambda **kw: agt.kernel_attention(q, k, v, kernel=kernel, sigma=0.8, **kw)  # noqa: E731
        _, ref = ag.kernel_attention(*(t.detach().numpy() for t in (q, k, v)), kernel=kernel, sigma=0.8,
                                     return_stats=True)
    y, stats = f(return_stats=True)
    assert isinstance(stats, ag.AttentionStats) and stats.entropy.shape == (2, 3, 20)
    assert stats.argmax.dtype == torch.int64 and not stats.entropy.requires_grad
    for name in ("log_z", "entropy", "max_weight", "argmax", "sink_weight", "mean_distance"):
        assert np.array_equal(getattr(stats, name).numpy(), getattr(ref, name)), name
    y0 = f()
    assert torch.equal(y, y0)
    g = torch.autograd.grad(y.square().sum(), (q, k, v))
    g0 = torch.autograd.grad(y0.square().sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(g, g0))
    assert torch.autograd.gradcheck(lambda q, k, v: agt.softmax_attention(q, k, v, return_stats=True)[0],
                                    tuple(t[:1, :1, :5] .detach().clone().requires_grad_() for t in (q, k, v)))
