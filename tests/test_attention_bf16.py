"""Softmax attention with bfloat16 products (``products="bfloat16"``): q, k and v rounded to
bfloat16, float32 scores, softmax, log Z and statistics.

The paths: "cpu" is the public function on this CPU (the AMX tiles where it has AMX-BF16, the
AVX512_BF16 dot tiles where it has those, the float32 kernel on the rounded values elsewhere),
"avx512_bf16" the dot tiles on a CPU that has them (a skip elsewhere), "emulated" and
"emulated_amx" the dot tiles and the AMX tiles on emulated intrinsics and tiles
(attngeom._bf16_emulated, built by make test where SIMDe is installed), so that every CPU runs
both paths' code.

The bound on y: the dot path rounds each weight p'_j = exp(s_j - m) to bfloat16 (relative
error at most u = 2^-8) for the value product, while l sums the float32 weights, so
|y - y*| <= u sum_j p_j |v_j| up to float32 rounding, y* the exact attention of the rounded
q, k, v (float64 here). The float32 part (scores summed over d_k <= 128 in float32, exp,
the value sums) stays below 2^-14 of the same sum at these sizes (measured at most 1e-6).
"""
import contextlib
import dataclasses

import numpy as np
import pytest

import attngeom as ag
from attngeom import _core
from attngeom._operands import AttentionOperands
from attngeom.models import bfloat16_to_float32, float32_to_bfloat16
from emulation import emulated_bf16

PATHS = ["cpu", "avx512_bf16", "emulated", "emulated_amx"]
# (batch, n_q, n_k, d_k, d_v, causal): odd depths and key counts; d_v of whole 64-column
# groups, then 1, 2 or 3 packets of 16 and ragged columns left, and below one packet; key
# blocks crossed (n_k > 128); bottom-right alignment
CASES = [(2, 37, 53, 64, 64, False), (1, 100, 100, 128, 128, True), (3, 9, 300, 7, 5, False),
         (2, 65, 65, 33, 80, "bottom_right"), (1, 200, 513, 64, 17, False), (2, 130, 130, 16, 200, True),
         (1, 40, 70, 32, 96, True), (2, 25, 33, 48, 48, False), (1, 1, 1, 1, 1, False)]
U = 2.0 ** -8


def _rounded(x):
    return bfloat16_to_float32(float32_to_bfloat16(x))


def _operands(batch, n_q, n_k, d_k, d_v, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, n_q, d_k)).astype(np.float32),
            rng.standard_normal((batch, n_k, d_k)).astype(np.float32),
            rng.standard_normal((batch, n_k, d_v)).astype(np.float32))


@contextlib.contextmanager
def _on(path):
    """The module that computes `path` (one of PATHS, "amx_bf16" or "widened"), with its bfloat16 path
    chosen while the block runs."""
    if path.startswith("emulated"):
        module, chosen = emulated_bf16(), "amx_bf16" if path == "emulated_amx" else "avx512_bf16"
    else:
        module, chosen = _core, "" if path == "cpu" else path
        if path == "avx512_bf16" and _core.dot_path() not in ("avx512_bf16", "amx_bf16"):
            pytest.skip(f"this CPU has no bfloat16 dot products (its path is {_core.dot_path()})")
        if path == "amx_bf16" and _core.dot_path() != "amx_bf16":
            pytest.skip(f"this CPU has no AMX tiles (its path is {_core.dot_path()})")
    module.set_dot_path(chosen)
    try:
        yield module
    finally:
        module.set_dot_path("")


def _attend(path, q, k, v, causal=False, block_q=0, weights=False):
    """(y, P or None, log Z, stats tuple) of the bfloat16-product forward through `path`."""
    args = AttentionOperands(q, k, v, causal=causal, finite=False).core_args()
    scale = 1.0 / np.sqrt(q.shape[-1])
    with _on(path) as module:
        return module.softmax_attention(args, scale, weights, True, block_q, 0, True, True)


def _exact(q, k, v, causal):
    """float64 attention of the rounded operands: y*, P, log Z and sum_j p_j |v_j|."""
    qr, kr, vr = (_rounded(t).astype(np.float64) for t in (q, k, v))
    n_q, n_k = q.shape[1], k.shape[1]
    s = qr @ kr.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if causal:
        offset = n_k - n_q if causal == "bottom_right" else 0
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    P = p / p.sum(-1, keepdims=True)
    return P @ vr, P, (m + np.log(p.sum(-1, keepdims=True)))[..., 0], P @ np.abs(vr)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES)
def test_y_within_the_bound_of_bfloat16_weights(case, path):
    *shape, causal = case
    q, k, v = _operands(*shape)
    y, _, log_z, _ = _attend(path, q, k, v, causal)
    ref, _, ref_log_z, size = _exact(q, k, v, causal)
    assert y.dtype == np.float32 and y.shape == ref.shape
    assert np.all(np.abs(y - ref) <= (U + 2.0 ** -14) * size)
    # log Z from the float32 scores: float32 rounding, not bfloat16's
    assert np.all(np.abs(log_z - ref_log_z) <= 1e-5 * (1 + np.abs(ref_log_z)))


@pytest.mark.parametrize("path", ["avx512_bf16", "amx_bf16"])
def test_subnormal_inputs_count_as_zero_on_the_instructions(path):
    """The CPU's dot products and tiles take subnormal bfloat16 inputs as zero, and the
    vector rounding of q, k and the weights flushes subnormal floats to zero: either way a
    subnormal entry of q, k or v gives the bits of a zero there, in whole tile rows and in
    ragged ends (d_k 40: 32 values and 8 under masks)."""
    q, k, v = _operands(2, 33, 45, 40, 24, seed=5)
    flushed = [t.copy() for t in (q, k, v)]
    for t, z in zip((q, k, v), flushed):
        mask = np.zeros(t.shape, bool)
        mask[:, ::3, ::7] = True
        t[mask] = np.where(np.arange(mask.sum()) % 2, 1e-39, -3e-40).astype(np.float32)
        z[mask] = np.where(np.arange(mask.sum()) % 2, 0.0, -0.0).astype(np.float32)
    for causal in (False, True):
        got, want = _attend(path, q, k, v, causal), _attend(path, *flushed, causal)
        for a, b in zip(got, want):
            if a is not None:
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", PATHS)
def test_the_statistics_and_the_routing_are_float32_softmax(path):
    """Entropy, largest weight and its key, sink weight, mean distance and P come from the
    float32 scores: within float32 rounding of the float64 softmax of the rounded operands."""
    q, k, v = _operands(2, 70, 150, 64, 32, seed=1)
    _, P, _, st = _attend(path, q, k, v, True, weights=True)
    _, ref_P, _, _ = _exact(q, k, v, True)
    entropy, max_weight, argmax, sink, distance = st
    np.testing.assert_allclose(P, ref_P, rtol=0, atol=1e-5)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref_entropy = -np.where(ref_P > 0, ref_P * np.log(ref_P), 0).sum(-1)
    np.testing.assert_allclose(entropy, ref_entropy, rtol=0, atol=2e-5)
    np.testing.assert_allclose(max_weight, ref_P.max(-1), rtol=0, atol=1e-5)
    np.testing.assert_allclose(sink, ref_P[..., 0], rtol=0, atol=1e-5)
    pos = np.arange(70)[:, None]
    np.testing.assert_allclose(distance, (ref_P * np.abs(pos - np.arange(150))).sum(-1), rtol=0, atol=1e-3)
    top2 = np.sort(ref_P, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 1e-4  # keys whose lead over the runner-up float32 cannot flip
    np.testing.assert_array_equal(argmax[clear], ref_P.argmax(-1)[clear])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d_v", [72, 64])  # AMX: value chunks from a scratch block; in place in whole panels
def test_an_entry_does_not_depend_on_the_query_tiling_or_the_threads(path, d_v):
    """Bitwise: query blocks of 0 (the default), 1, 5, 7, 17 and 64 rows (panels of 1-6 rows
    for the dot tiles, 1-16 for the AMX tiles) and 1 or 2 threads give the same y, log Z and
    statistics."""
    q, k, v = _operands(2, 75, 301, 40, d_v, seed=2)
    first = _attend(path, q, k, v, "bottom_right")
    old = ag.get_num_threads()
    try:
        for threads in (1, 2):
            ag.set_num_threads(threads)
            for block_q in (0, 1, 5, 7, 17, 64):
                y, _, log_z, st = _attend(path, q, k, v, "bottom_right", block_q=block_q)
                for a, b in zip((y, log_z) + tuple(st), (first[0], first[2]) + tuple(first[3])):
                    assert a.tobytes() == b.tobytes(), (threads, block_q)
    finally:
        ag.set_num_threads(old)


@pytest.mark.parametrize("path", PATHS)
def test_the_default_large_query_blocks_give_the_same_bits(path):
    """With enough units (8 x 2 blocks of 768 queries here) the dot and AMX tiles take
    768-query units by default; the bits equal 192- and 64-query units', causal."""
    q, k, v = _operands(8, 800, 800, 32, 48, seed=4)
    first = _attend(path, q, k, v, True)
    for block_q in (192, 64):
        y, _, log_z, st = _attend(path, q, k, v, True, block_q=block_q)
        for a, b in zip((y, log_z) + tuple(st), (first[0], first[2]) + tuple(first[3])):
            assert a.tobytes() == b.tobytes(), block_q


def test_the_widened_path_is_the_float32_kernel_on_rounded_operands():
    """Without bfloat16 dot products (or with the widened path chosen), products="bfloat16"
    rounds q, k and v and runs the float32 kernel: bitwise that kernel on operands rounded
    beforehand (so a model whose operands are bfloat16 values already keeps its bits)."""
    q, k, v = _operands(2, 90, 200, 24, 40, seed=3)
    for causal in (False, True):
        with _on("widened"):
            got = ag.softmax_attention(q, k, v, causal=causal, return_log_partition=True, return_stats=True,
                                       products="bfloat16")
        want = ag.softmax_attention(*(_rounded(t) for t in (q, k, v)), causal=causal, return_log_partition=True,
                                    return_stats=True)
        fields = [f.name for f in dataclasses.fields(got[2])]
        for a, b in zip(got[:2] + tuple(getattr(got[2], f) for f in fields),
                        want[:2] + tuple(getattr(want[2], f) for f in fields)):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_the_public_function_takes_the_products_argument():
    q, k, v = _operands(1, 20, 30, 16, 8, seed=4)
    y = ag.softmax_attention(q[0], k[0], v[0], products="bfloat16")
    ref, _, _, size = _exact(q, k, v, False)
    assert y.dtype == np.float32 and np.all(np.abs(y - ref[0]) <= (U + 2.0 ** -14) * size[0])
    with pytest.raises(ValueError, match="products must be one of"):
        ag.softmax_attention(q, k, v, products="bf16")
    with pytest.raises(ValueError, match="products='bfloat16' computes in float32"):
        ag.softmax_attention(q.astype(np.float64), k, v, products="bfloat16")


@pytest.mark.parametrize("path", PATHS)
def test_inputs_whose_bfloat16_products_overflow_are_refused(path):
    """The float32 kernel folds the scale into q, so it accepts |scale q| |k| up to the float
    maximum; the dot tiles sum q . k before the scale, and rounding to bfloat16 carries values
    within half a bfloat16 step of the float maximum to inf. Both bfloat16 paths refuse such
    inputs (the same ones on every CPU) instead of returning y with log Z = inf."""
    v = np.array([[[1.0], [0.0]]], np.float32)

    def call(mod, q, keys, scale, bf16):
        q, k = np.array([[[q]]], np.float32), np.array([[[key] for key in keys]], np.float32)
        return mod.softmax_attention(AttentionOperands(q, k, v, finite=False).core_args(), scale, False, True, 0, 0,
                                     False, bf16)

    cases = [(1e20, [2e19, 1e19], 0.125, "the bfloat16 products q.k"),  # q.k = 2e39, scale q.k = 2.5e38
             (3.4e38, [1.0, 0.5], 1e-30, r"\|q_i\| rounded to bfloat16"),
             (1.0, [3.4e38, 0.5], 1e-30, r"\|k_j\| rounded to bfloat16")]
    for q, keys, scale, message in cases:
        y, _, log_z, _ = call(_core, q, keys, scale, False)
        assert np.all(np.isfinite(y)) and np.all(np.isfinite(log_z))  # the float32 kernel takes them
        with _on(path) as module, pytest.raises(ValueError, match=message):
            call(module, q, keys, scale, True)
    # just inside the bound: |q| |k| = 3e38, finite y and log Z
    with _on(path) as module:
        y, _, log_z, _ = call(module, 1.5e19, [2e19, 1e19], 1e-30, True)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(log_z))
