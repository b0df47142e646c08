"""Equal inputs give bitwise equal outputs: every public kernel, forward and backward, called on
the same values placed at several byte offsets from a 64-byte boundary (the width of an
AVX-512 register, so every peeling of a vector loop is reached), at 1, 2 and 3 threads, with
allocations of growing size between the calls so that the outputs land at other addresses too.

A vector loop that peels an unaligned head, or a reduction whose split follows the thread
count, rounds the same inputs differently from one address or thread count to the next;
those differences are 1 ulp and pass every tolerance test, so only bitwise comparison finds
them."""
import dataclasses

import numpy as np
import pytest

import attngeom as ag

OFFSETS = {np.float32: (0, 4, 8, 12, 36), np.float64: (0, 8, 24, 40)}
THREADS = (1, 2, 3)


def at_offset(a: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of `a` whose first byte lies `offset` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == offset
    return out


def leaves(result):
    """The arrays of a result (arrays, scalars, tuples, dataclasses and result objects), in order."""
    if isinstance(result, np.ndarray):
        return [result]
    if isinstance(result, (float, int, np.floating, np.integer)):
        return [np.asarray(result)]
    if isinstance(result, (tuple, list)):
        return [x for r in result for x in leaves(r)]
    if dataclasses.is_dataclass(result):
        return [x for f in dataclasses.fields(result) for x in leaves(getattr(result, f.name))]
    if isinstance(result, dict):
        return [x for key in sorted(result) for x in leaves(result[key])]
    if hasattr(result, "__dict__"):
        return leaves(vars(result))
    return []


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def cases(dtype):
    """(name, function, float operands, other arguments): shapes that are not multiples of any
    vector width, large enough that the parallel loops run on several threads."""
    rng = np.random.default_rng(7)

    def draw(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(dtype)

    q, k, v, dy = draw(3, 2, 131, 13), draw(3, 2, 149, 13), draw(3, 2, 149, 11), draw(3, 2, 131, 11)
    mask = rng.random((131, 149)) < 0.8
    mask[:, 0] = True
    u = draw(2, 37, 5, scale=0.4)
    tau, ku, vu = draw(2, 37), draw(2, 61, 5), draw(2, 61, 3)
    out = [
        ("softmax", lambda q, k, v: ag.softmax_attention(q, k, v, causal=True, return_routing=True,
                                                         return_log_partition=True), dict(q=q, k=k, v=v), {}),
        ("softmax masked", lambda q, k, v: ag.softmax_attention(q, k, v, mask=mask, return_log_partition=True),
         dict(q=q, k=k, v=v), {}),
        ("softmax stats", lambda q, k, v: ag.softmax_attention(q, k, v, mask=mask, causal="bottom_right",
                                                               return_stats=True), dict(q=q, k=k, v=v), {}),
        ("cauchy stats", lambda q, k, v: ag.kernel_attention(q, k, v, kernel="cauchy", gamma=0.7,
                                                             return_stats=True), dict(q=q, k=k, v=v), {}),
        ("softmax backward", lambda q, k, v, dy: ag.softmax_attention_backward(q, k, v, dy, causal="bottom_right"),
         dict(q=q, k=k, v=v, dy=dy), {}),
        ("lightning", lambda q, k, v: ag.lightning_attention(q, k, v, causal=True), dict(q=q, k=k, v=v), {}),
        ("lightning backward", lambda q, k, v, dy: ag.lightning_attention_backward(q, k, v, dy, causal=True),
         dict(q=q, k=k[..., :131, :], v=v[..., :131, :], dy=dy), {}),
        ("projection", lambda q, k, v: ag.projection_attention(q, k, v, sigma=0.9, causal=True, return_routing=True),
         dict(q=q, k=k, v=v), {}),
        ("projection backward", lambda q, k, v, dy: ag.projection_attention_backward(q, k, v, dy, sigma=0.9),
         dict(q=q, k=k, v=v, dy=dy), {}),
        ("random features", lambda q, k, v: ag.random_feature_attention(q, k, v, num_features=40, causal=True,
                                                                        return_log_partition=True),
         dict(q=q, k=k[..., :131, :], v=v[..., :131, :]), {}),
        ("random features backward", lambda q, k, v, dy: ag.random_feature_attention_backward(
            q, k, v, dy, num_features=40), dict(q=q, k=k, v=v, dy=dy), {}),
        ("laplace-radon transform", lambda u, tau, k, v: ag.laplace_radon_transform(u, tau, k, v, kernel="gaussian",
                                                                                   sigma=0.7),
         dict(u=u, tau=tau, k=ku, v=vu), {}),
        ("projected cumulants", lambda u, tau, k: ag.projected_cumulants(u, tau, k, order=3),
         dict(u=u, tau=tau, k=ku), {}),
        ("tilt radius", lambda q: ag.tilt_radius(q), dict(q=q), {}),
    ]
    for kernel, params in (("exp", {}), ("gaussian", {"sigma": 0.8}), ("cauchy", {"gamma": 0.7}),
                           ("stable", {"alpha": 1.3, "c": 1.0})):
        small = dict(q=q[:1], k=k[:1], v=v[:1]) if kernel == "stable" else dict(q=q, k=k, v=v)
        out.append((f"kernel {kernel}", lambda q, k, v, kernel=kernel, params=params: ag.kernel_attention(
            q, k, v, kernel=kernel, causal=True, return_routing=True, return_log_partition=True, **params),
            small, {}))
        out.append((f"kernel {kernel} backward", lambda q, k, v, dy, kernel=kernel, params=params:
                    ag.kernel_attention_backward(q, k, v, dy, kernel=kernel, causal=True, **params),
                    dict(small, dy=dy[:len(small["q"])]), {}))
    # whitening: a stable filter (L well conditioned, M small)
    D, T = 6, 67
    L = (np.eye(D) * 2 + 0.3 * np.tril(rng.standard_normal((D, D)), -1)).astype(dtype)
    M = (0.3 * rng.standard_normal((D, D))).astype(dtype)
    x, dw = draw(5, T, D), draw(5, T, D)
    out += [
        ("whiten", ag.whiten, dict(x=x, L=L, M=M), {}),
        ("whiten full L", ag.whiten, dict(x=x, L=L + np.triu(0.1 * np.ones((D, D), dtype), 1), M=M), {}),
        ("whiten scan", lambda x, L, M: ag.whiten_scan(x, L, M, block=16), dict(x=x, L=L, M=M), {}),
        ("whiten backward", lambda x, L0, M, dw: ag.whiten_backward(x, L0, M, dw), dict(x=x, L0=L, M=M, dw=dw), {}),
    ]
    image = draw(33, 33) * ag.circle_mask(33)
    theta = np.linspace(0.0, 180.0, 29, endpoint=False)
    sino = ag.radon(image.astype(np.float64), theta).astype(dtype)
    out += [
        ("radon", lambda image: ag.radon(image, theta), dict(image=image), {}),
        ("radon adjoint", lambda s: ag.radon_adjoint(s, theta), dict(s=sino), {}),
        ("iradon", lambda s: ag.iradon(s, theta), dict(s=sino), {}),
        ("iradon sart", lambda s: ag.iradon_sart(s, theta, iterations=2), dict(s=sino), {}),
        ("stable density", lambda x: ag.stable_density(x, 1.3), dict(x=draw(97)), {}),
    ]
    if dtype == np.float32:  # bfloat16 products: this CPU's path (AMX or dot tiles where it has them)
        out += [
            ("softmax bfloat16 products", lambda q, k, v: ag.softmax_attention(
                q, k, v, mask=mask, causal="bottom_right", return_stats=True, return_log_partition=True,
                products="bfloat16"), dict(q=q, k=k, v=v), {}),
        ]
    if dtype == np.float64:  # the double-precision-only analyses
        A, B = draw(4, 37, 9), draw(4, 9, 29)
        taus = np.linspace(0.1, 3.0, 41)
        values = 2.0 * np.exp(-0.7 * taus) + 0.5 * np.exp(-1.9 * taus)
        out += [
            ("singular values", ag.singular_values, dict(x=draw(5, 37, 23)), {}),
            ("factored svd", ag.factored_svd, dict(A=A, B=B), {}),
            ("exponential sum", lambda v: ag.fit_exponential_sum(taus, v, order=2), dict(v=values), {}),
            ("laplace inversion", lambda Z: ag.invert_laplace_density(taus, Z, np.linspace(-3, 3, 31)),
             dict(Z=values), {}),
            ("parametrization jacobian", lambda Q, K, V, X: ag.parametrization_jacobian(
                [(Q, K, V)], X, kind="softmax"), dict(Q=draw(4, 4), K=draw(4, 4), V=draw(3, 4), X=draw(7, 5, 4)), {}),
        ]
    return out


def _ids(dtype):
    return [name for name, *_ in cases(dtype)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_every_kernel_is_bitwise_reproducible(dtype):
    before = ag.get_num_threads()
    failures = []
    ballast = []  # allocations of growing size between calls move where the outputs land
    try:
        for name, fn, arrays, kwargs in cases(dtype):
            reference = None
            for threads in THREADS:
                ag.set_num_threads(threads)
                for offset in OFFSETS[dtype]:
                    placed = {key: at_offset(a, offset) for key, a in arrays.items()}
                    ballast.append(np.empty(1 + 37 * len(ballast)))
                    try:
                        got = leaves(fn(**placed, **kwargs))
                    except Exception as exc:
                        raise AssertionError(f"{name} raised") from exc
                    assert got, f"{name}: no arrays in the result"
                    if reference is None:
                        reference = got
                    elif len(got) != len(reference) or not all(map(same_bits, got, reference)):
                        failures.append(f"{name}: {threads} threads, offset {offset}")
                        break
    finally:
        ag.set_num_threads(before)
    assert not failures, "results depend on the address or the thread count:\n" + "\n".join(failures)


def test_the_harness_sees_a_one_ulp_difference():
    a = np.linspace(0.0, 1.0, 7)
    b = a.copy()
    b[3] = np.nextafter(b[3], 2.0)
    assert not same_bits(a, b) and same_bits(a, a.copy())
    placed = at_offset(a.astype(np.float32), 12)
    assert placed.ctypes.data % 64 == 12 and same_bits(placed, a.astype(np.float32))
