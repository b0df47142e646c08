"""bfloat16 in the core: rounding and widening, the product (bounds, exact cases, both paths,
determinism), the fused token-wise steps, the product weights and the mode's dtype argument.
NumPy only (the sanitizer runs it); the forward's bfloat16 mode against transformers, kept
weights, corpus runs and bfloat16 operands are tests/test_bf16_models.py.

The product's error bound: each product of two bfloat16 values is exact in float32 (8 + 8
significant bits), so the only errors are the k - 1 float32 additions of an entry, whatever
their order: |C - ref| <= gamma_k (|bf16(A)| |B|^T) with gamma_k = k u / (1 - k u), u = 2^-24
(Higham, Accuracy and Stability, Thm. 3.1 / 3.5), ref the exact product of the rounded
operands (float64 here is exact for k * 2^16 < 2^53).
"""
import functools
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom import _core
from attngeom.models import bfloat16_to_float32, float32_to_bfloat16
from attngeom.models.nn.products import BFloat16Weight, bfloat16_values, compute_dtype
from emulation import emulated_bf16

# "cpu": the path this CPU takes (its AMX tiles or bfloat16 dot products where it has them);
# "widened": the widened path on any CPU; "avx512_bf16" and "amx_bf16": those paths where this
# CPU has them (a skip elsewhere); "emulated" and "emulated_amx": the AVX512_BF16 tiles and the
# AMX path's code on emulated intrinsics and tiles (attngeom._bf16_emulated, which make test
# builds where SIMDe is installed), so that every CPU runs both paths' code.
PATHS = ["cpu", "widened", "avx512_bf16", "amx_bf16", "emulated", "emulated_amx"]
CPU_PATHS = {"avx512_bf16": ("avx512_bf16", "amx_bf16"), "amx_bf16": ("amx_bf16",)}
SHAPES = [(1, 1, 1), (7, 5, 33), (13, 9, 70), (6, 4, 64), (100, 37, 1024), (97, 130, 3001), (300, 2, 5),
          (20, 9, 4000),  # depth past an A tile in L1 (column tiles outer)
          (33, 17, 64), (65, 50, 96),  # AMX: a short end of B's rows (the tile of its last 16), one row block
          (70, 300, 64), (530, 20, 32)]  # AMX: more than one unit of B's rows, of A's rows


def _product(x, w, path, parallel=True):
    """bf16(x) @ w.T through one of PATHS."""
    if path.startswith("emulated"):
        return emulated_bf16().matmul_bf16(x, w, parallel, "amx_bf16" if path == "emulated_amx" else "avx512_bf16")
    if path in CPU_PATHS and _core.dot_path() not in CPU_PATHS[path]:
        pytest.skip(f"this CPU has no {path} path (its best is {_core.dot_path()})")
    return _core.matmul_bf16(x, w, parallel, "" if path == "cpu" else path)


def _operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = float32_to_bfloat16(rng.standard_normal((n, k)).astype(np.float32))
    return x, w


def _exact(x, w):
    """The exact product of the rounded operands and the bound's |.| product (float64)."""
    xr = bfloat16_to_float32(float32_to_bfloat16(x)).astype(np.float64)
    wf = bfloat16_to_float32(w).astype(np.float64)
    return xr @ wf.T, np.abs(xr) @ np.abs(wf).T


def test_rounding_is_nearest_ties_to_even():
    """The core's rounding equals the NumPy reference on every class of float32: ties both
    ways, carries into the exponent, overflow to infinity, subnormals, zeros, NaN."""
    special = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20, -(1.0 + 2.0 ** -8),
                        np.finfo(np.float32).max, 3.3961e38, 2.0 ** -140, -2.0 ** -149, 0.0, -0.0, np.inf, -np.inf,
                        1.9999999], np.float32)
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    finite = bits[np.isfinite(bits)]
    for x in (special, finite):
        np.testing.assert_array_equal(_core.round_bf16(x), float32_to_bfloat16(x))
    assert _core.round_bf16(np.array([1.0 + 2.0 ** -8], np.float32))[0] == 0x3F80  # a tie to the even 1.0
    assert _core.round_bf16(np.array([1.0 + 3 * 2.0 ** -8], np.float32))[0] == 0x3F82  # a tie up to even
    nan = bfloat16_to_float32(_core.round_bf16(np.array([np.nan, -np.nan], np.float32)))
    assert np.isnan(nan).all()
    np.testing.assert_array_equal(bfloat16_values(special[:4]), bfloat16_to_float32(float32_to_bfloat16(special[:4])))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_product_within_the_float32_summation_bound(shape, path):
    m, n, k = shape
    x, w = _operands(m, n, k)
    y = _product(x, w, path)
    assert y.dtype == np.float32 and y.shape == (m, n)
    ref, size = _exact(x, w)
    u = 2.0 ** -24
    bound = k * u / (1 - k * u) * size
    assert np.all(np.abs(y - ref) <= bound)
    # and not vacuous: with x unrounded the error is of bfloat16's size, above the bound (which
    # grows like k, the rounding's effect like sqrt(k): at depth 4,000 they meet)
    if 64 <= k <= 3001:
        unrounded = x.astype(np.float64) @ bfloat16_to_float32(w).astype(np.float64).T
        assert np.max(np.abs(unrounded - ref) - bound) > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [257, 1601])  # AMX: 1,601 in blocks of the depth, the sums between them in memory
def test_product_is_exact_where_every_sum_is(path, k):
    """Small integers: every product and partial sum is an integer below 2^24, so both paths
    give the exact product, bitwise."""
    rng = np.random.default_rng(2)
    m, n = 23, 19
    x = rng.integers(-8, 9, (m, k)).astype(np.float32)
    w = float32_to_bfloat16(rng.integers(-8, 9, (n, k)).astype(np.float32))
    ref = x.astype(np.float64) @ bfloat16_to_float32(w).astype(np.float64).T
    np.testing.assert_array_equal(_product(x, w, path), ref.astype(np.float32))


@pytest.mark.parametrize("path", PATHS)
# the AMX path copies B padded at 300 (not whole tile rows); at 1,600 it goes in blocks of the depth
@pytest.mark.parametrize("k", [300, 320, 1600])
def test_an_entry_depends_on_its_row_and_column_only(path, k):
    """Bitwise: any split of the rows, one row at a time, serial or parallel, 1 or 2 threads,
    and slices of the columns (fewer than a tile's 16, and a run of them starting mid-tile)
    give the same entries. (AMX: up to 16 rows the weights are the row operand, read in
    place; past that the packed rows are, so the splits compare the two layouts.)"""
    x, w = _operands(97, 130, k, seed=3)
    full = _product(x, w, path)
    np.testing.assert_array_equal(np.vstack([_product(x[i:i + 1], w, path) for i in range(97)]), full)
    np.testing.assert_array_equal(np.vstack([_product(x[i:i + 13], w, path, parallel=False)
                                             for i in range(0, 97, 13)]), full)
    np.testing.assert_array_equal(_product(x, np.ascontiguousarray(w[5:11]), path), full[:, 5:11])
    np.testing.assert_array_equal(_product(x, np.ascontiguousarray(w[3:58]), path), full[:, 3:58])
    old = ag.get_num_threads()
    try:
        for t in (1, 2):
            ag.set_num_threads(t)
            np.testing.assert_array_equal(_product(x, w, path), full)
    finally:
        ag.set_num_threads(old)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [300, 1024, 1600])  # AMX: B padded at 300, whole depth at 1,024, depth blocks at 1,600
def test_products_of_one_left_factor_are_each_products_bits(path, k):
    """matmul_bf16_many (x rounded and packed once, units over every weight's columns) gives
    each weight's product bit for bit, serial or parallel, with a weight of no columns, one
    short of a tile and several units wide."""
    x, _ = _operands(530, 1, k, seed=11)
    ws = [_operands(1, n, k, seed=12 + n)[1] for n in (130, 0, 5, 300)]
    if path.startswith("emulated"):
        many = emulated_bf16().matmul_bf16_many
        name = "amx_bf16" if path == "emulated_amx" else "avx512_bf16"
    else:
        _product(x[:1], ws[0], path)  # skips where this CPU lacks the path
        many, name = _core.matmul_bf16_many, "" if path == "cpu" else path
    for parallel in (True, False):
        got = many(x, ws, parallel, name)
        assert [g.shape for g in got] == [(530, 130), (530, 0), (530, 5), (530, 300)]
        for g, w in zip(got, ws):
            np.testing.assert_array_equal(g, _product(x, w, path, parallel))


def test_products_of_one_left_factor_refuse_bad_weights():
    x, w = _operands(8, 16, 64, seed=13)
    with pytest.raises(ValueError, match="uint16"):
        _core.matmul_bf16_many(x, [w, w.astype(np.float32)])
    with pytest.raises(ValueError, match="uint16"):
        _core.matmul_bf16_many(x, [np.asfortranarray(w)])
    with pytest.raises(ValueError, match="weights"):
        _core.matmul_bf16_many(x, [w[:, :32].copy()])
    assert _core.matmul_bf16_many(x, []) == []


@pytest.mark.parametrize("path", ["cpu", "avx512_bf16", "amx_bf16", "emulated", "emulated_amx"])
def test_the_paths_agree_to_float32_rounding(path):
    x, w = _operands(50, 40, 2048, seed=4)
    a, b = _product(x, w, path), _product(x, w, "widened")
    _, size = _exact(x, w)
    assert np.all(np.abs(a - b) <= 2 * 2048 * 2.0 ** -24 * size)


@pytest.mark.parametrize("path", PATHS)
def test_non_finite_values_stay_in_their_rows_and_columns(path):
    x, w = _operands(12, 8, 100, seed=5)
    x[3, 7] = np.nan
    w[2, 50] = float32_to_bfloat16(np.array([np.inf], np.float32))[0]
    y = _product(x, w, path)
    bad = np.zeros(y.shape, bool)
    bad[3, :] = True
    bad[:, 2] = True
    assert np.isnan(y[3]).all() and not np.isfinite(y[:, 2]).any()
    assert np.isfinite(y[~bad]).all()


@pytest.mark.parametrize("path", ["cpu", "widened"])
def test_the_product_writes_into_a_block_of_columns(path):
    """out= takes rows of contiguous entries at another row stride (a block of a larger
    array's columns), writes the product's bits there and nothing else, and returns it; an
    out of another shape, dtype, layout or a read-only one is refused."""
    x, w = _operands(37, 40, 96, seed=9)
    whole = np.full((37, 70), -7.0, np.float32)
    got = _core.matmul_bf16(x, w, False, "" if path == "cpu" else path, whole[:, 20:60])
    assert got.base is whole or np.shares_memory(got, whole)
    np.testing.assert_array_equal(whole[:, 20:60], _product(x, w, path, parallel=False))
    assert np.all(whole[:, :20] == -7.0) and np.all(whole[:, 60:] == -7.0)
    for bad in (np.empty((37, 41), np.float32), np.empty((37, 40), np.float64), np.empty((40, 37), np.float32).T):
        with pytest.raises((ValueError, TypeError)):
            _core.matmul_bf16(x, w, False, "", bad)
    frozen = np.empty((37, 40), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _core.matmul_bf16(x, w, False, "", frozen)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (13, 9, 70), (16, 40, 64), (97, 130, 3001), (530, 20, 32),
                                   (70, 300, 64), (5, 7, 0)])
def test_the_product_adds_a_residual_with_the_bits_of_the_sum(path, shape):
    """add=h: each unit adds its block of h as it finishes it; the result is bitwise h plus
    the product (NumPy's float32 add), on every path, for few rows (m <= 16: the AMX path's
    weights read in place) and many, in a new array or in out."""
    m, n, k = shape
    x, w = _operands(m, n, k, seed=4)
    h = np.random.default_rng(5).standard_normal((m, n)).astype(np.float32)
    want = h + _product(x, w, path)
    if path.startswith("emulated"):
        run = functools.partial(emulated_bf16().matmul_bf16, path="amx_bf16" if path == "emulated_amx" else "avx512_bf16")
    else:
        run = functools.partial(_core.matmul_bf16, path="" if path == "cpu" else path)
    np.testing.assert_array_equal(run(x, w, True, add=h), want)
    whole = np.full((m, n + 9), -7.0, np.float32)
    got = run(x, w, False, out=whole[:, 4:4 + n], add=h)
    assert np.shares_memory(got, whole) and np.all(whole[:, :4] == -7.0) and np.all(whole[:, 4 + n:] == -7.0)
    np.testing.assert_array_equal(got, want)


def test_the_residual_must_match_and_lie_apart_from_the_output():
    x, w = _operands(20, 12, 64)
    with pytest.raises(ValueError, match="add must be"):
        _core.matmul_bf16(x, w, add=np.zeros((20, 11), np.float32))
    with pytest.raises(TypeError):
        _core.matmul_bf16(x, w, add=np.zeros((20, 12)))  # float64: no conversion
    out = np.zeros((20, 12), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _core.matmul_bf16(x, w, True, "", out, out)


@pytest.mark.parametrize("path", ["avx512_bf16", "amx_bf16"])
def test_the_instructions_take_subnormal_inputs_as_zero(path):
    """VDPBF16PS and TDPBF16PS treat subnormal bfloat16 inputs as zero, so a float32 subnormal
    in A's rows (rounded to a subnormal bfloat16, or to zero by the AMX path's packing of whole
    16-row blocks) adds nothing, in a whole block's row (0) as in a ragged one's (16); the
    widened path keeps it."""
    x = np.zeros((17, 32), np.float32)
    x[:, 0], x[:, 1] = 1e-39, 2.0 ** -126
    w = float32_to_bfloat16(np.full((16, 32), 2.0 ** 100, np.float32))
    y = _product(x, w, path)
    np.testing.assert_array_equal(y, np.float32(2.0 ** -26))
    assert np.all(_product(x, w, "widened") > 2.0 ** -26)


@pytest.mark.parametrize("path", PATHS)
def test_empty_depth_gives_zeros(path):
    y = _product(np.zeros((3, 0), np.float32), np.zeros((4, 0), np.uint16), path)
    np.testing.assert_array_equal(y, np.zeros((3, 4), np.float32))
    assert _product(np.zeros((0, 5), np.float32), np.zeros((4, 5), np.uint16), path).shape == (0, 4)


def test_the_emulated_module_runs_the_dot_paths():
    """The emulated module has both tiled paths (its dot_path is the AMX one), and its threads
    are the core's: one OpenMP runtime, one budget."""
    emulated = emulated_bf16()
    assert emulated.dot_path() == "amx_bf16"
    old = ag.get_num_threads()
    try:
        for t in (1, 2):
            ag.set_num_threads(t)
            assert emulated.get_num_threads() == t
    finally:
        ag.set_num_threads(old)


def test_the_path_is_reported():
    """The CPU's AMX tiles, or else its bfloat16 dot products, are used exactly where
    /proc/cpuinfo lists them (with the AVX-512 subsets the tiles need; Linux lists AMX only
    where it runs the tiles), and show_config says which path runs; a path the CPU lacks is
    refused."""
    import io

    assert ag.show_config(file=io.StringIO())["bf16_products"] == _core.dot_path()
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    need = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}
    expected = ("amx_bf16" if need | {"amx_tile", "amx_bf16"} <= flags else "avx512_bf16" if need <= flags
                else "widened")
    assert _core.dot_path() == expected
    x, w = _operands(2, 3, 4)
    for path in ("avx512_bf16", "amx_bf16"):
        if _core.dot_path() not in CPU_PATHS[path]:
            with pytest.raises(ValueError, match=f"no {path} path"):
                _core.matmul_bf16(x, w, True, path)
    with pytest.raises(ValueError, match="unknown path"):
        _core.matmul_bf16(x, w, True, "fast")


# -- the fused token-wise steps ---------------------------------------------------------------------
def test_rounding_to_values_in_place_equals_the_bits():
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 1e3,
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0 ** -140, 3.3961e38], np.float32)])
    y = x.copy()
    _core.round_bf16_values(y)
    np.testing.assert_array_equal(y.view(np.uint32), (float32_to_bfloat16(x).astype(np.uint32) << 16))
    with pytest.raises(TypeError):
        _core.round_bf16_values(x[::2])  # in place needs a C-contiguous float32 array


def test_widening_in_the_core_keeps_values_and_layout():
    """bfloat16_to_float32 widens C-contiguous bits (and transposed ones) in the core: the same
    values and the same strides as NumPy's shift (so the products that read them do not change)."""
    bits = float32_to_bfloat16(np.random.default_rng(11).standard_normal((300, 200)).astype(np.float32))
    bits[0, :4] = float32_to_bfloat16(np.array([np.nan, np.inf, -0.0, 2.0 ** -130], np.float32))
    for b in (bits, bits.T, bits[:, ::2], bits[3], bits[:0]):
        ref = (b.astype(np.uint32) << np.uint32(16)).view(np.float32)
        got = bfloat16_to_float32(b)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
        assert got.strides == ref.strides


def test_fused_rms_norm_and_silu_gate_against_numpy():
    """Within float32 rounding of the float64 formulas (a few units in the last place)."""
    from attngeom.activation_functions import silu
    from attngeom.models.nn.norm import normalize

    rng = np.random.default_rng(9)
    x = rng.standard_normal((33, 1024)).astype(np.float32) * 3
    w = (1 + 0.2 * rng.standard_normal(1024)).astype(np.float32)
    ref = normalize(x.astype(np.float64), w.astype(np.float64), None, 1e-6, "rmsnorm")
    got = normalize(x, w, None, 1e-6, "rmsnorm", fused=True)
    assert got.dtype == np.float32 and np.max(np.abs(got - ref) / np.abs(ref).max()) < 1e-6
    g, u = (rng.standard_normal((7, 3000)).astype(np.float32) * 6 for _ in range(2))
    ref = silu(g.astype(np.float64)) * u
    got = u.copy()
    _core.silu_mul(g, got)
    assert np.all(np.abs(got - ref) <= 4 * np.finfo(np.float32).eps * np.abs(ref) + 1e-30)


def test_the_fused_gate_is_the_same_bits_at_any_address():
    """silu_mul's entries depend on their g and u only: u placed at every offset of a cache
    line gives the same bits (Eigen's expression had computed the entries before the first
    aligned address with the scalar exp). 4 x 4,100 entries end in a partial packet at every
    vector width."""
    rng = np.random.default_rng(11)
    g, u = (rng.standard_normal((4, 4100)).astype(np.float32) * 6 for _ in range(2))
    ref = u.copy()
    _core.silu_mul(g, ref)
    for offset in range(1, 17):
        buf = np.empty(u.size + 16, np.float32)
        placed = buf[offset:offset + u.size].reshape(u.shape)
        placed[...] = u
        _core.silu_mul(g, placed)
        np.testing.assert_array_equal(placed, ref)


@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_rotation_is_bitwise_numpys(interleaved):
    """A block of tokens' heads rotated in one pass of the core equals NumPy's expression
    x cos + rotate_half(x) sin bitwise (the float32 forward keeps its bits)."""
    from attngeom.models.nn.rotary import Rotary

    rng = np.random.default_rng(10)
    r = Rotary(rng.random(32), interleaved=interleaved)
    x = rng.standard_normal((19, 6, 64)).astype(np.float32)
    c, s = (t[:, None] for t in r.cos_sin(np.arange(5, 24), np.float32))
    if interleaved:
        half = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    else:
        half = np.concatenate([-x[..., 32:], x[..., :32]], axis=-1)
    np.testing.assert_array_equal(r.rotate(x, cos_sin=(c, s)), x * c + half * s)


def test_the_fused_norm_is_the_same_bits_at_any_address():
    """rms_norm's mean square sums in one order whatever the row's address: rows placed at
    every offset of a cache line give the same bits. Rows of 1,027 end in a partial packet at
    every vector width; out= writes the same bits where it is told."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((5, 1027)).astype(np.float32) * 3
    w = (1 + 0.2 * rng.standard_normal(1027)).astype(np.float32)
    ref = _core.rms_norm(x, w, 1e-6)
    for offset in range(1, 17):
        buf = np.empty(x.size + 16, np.float32)
        placed = buf[offset:offset + x.size].reshape(x.shape)
        placed[...] = x
        np.testing.assert_array_equal(_core.rms_norm(placed, w, 1e-6), ref)
        assert _core.rms_norm(x, w, 1e-6, placed) is placed
        np.testing.assert_array_equal(placed, ref)
    with pytest.raises(ValueError, match="shape"):
        _core.rms_norm(x, w, 1e-6, np.empty((5, 1026), np.float32))


@pytest.mark.parametrize("interleaved", [False, True])
def test_finishing_the_heads_is_the_steps_one_by_one(interleaved):
    """finish_heads (norm, rotation, rounding and the heads-major write in one pass) gives the
    bits of rms_norm, rotate_half and round_bf16_values one after another, each step optional,
    and writes only its rows of out."""
    from attngeom.models.nn.rotary import Rotary

    rng = np.random.default_rng(15)
    x = rng.standard_normal((19, 6, 64)).astype(np.float32) * 4
    w = (1 + 0.2 * rng.standard_normal(64)).astype(np.float32)
    c, s = (np.ascontiguousarray(t) for t in Rotary(rng.random(32), interleaved=interleaved).cos_sin(
        np.arange(5, 24), np.float32))
    for norm, rotate, round_ in [(True, True, True), (False, True, True), (True, False, False), (False, False, True)]:
        y = _core.rms_norm(x, w, 1e-6) if norm else x.copy()
        if rotate:
            y = _core.rotate_half(y, c, s, interleaved)
        if round_:
            _core.round_bf16_values(y)
        out = np.full((6, 30, 64), -7.0, np.float32)
        _core.finish_heads(x, out, 4, w if norm else None, 1e-6, c if rotate else None, s if rotate else None,
                           interleaved, round_)
        np.testing.assert_array_equal(out[:, 4:23], y.transpose(1, 0, 2))
        assert np.all(out[:, :4] == -7.0) and np.all(out[:, 23:] == -7.0)
    out = np.empty((6, 30, 64), np.float32)
    for bad in [dict(out=out[:5]), dict(out=np.empty((6, 30, 64))), dict(row0=12), dict(w=w[:10]),
                dict(cos=c, sin=None), dict(cos=c[:3], sin=s[:3])]:
        args = dict(out=out, row0=4, w=None, cos=None, sin=None) | bad
        with pytest.raises((ValueError, TypeError)):
            _core.finish_heads(x, args["out"], args["row0"], args["w"], 1e-6, args["cos"], args["sin"])


def test_the_token_steps_on_the_core_threads_are_the_serial_bits():
    """rms_norm, silu_mul and finish_heads with parallel=True (rows, or chunks of entries, on
    OpenMP's threads) give the serial call's bits at 1 and 2 threads; 40,001 entries end
    mid-packet and mid-chunk."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((300, 512)).astype(np.float32) * 3
    w = (1 + 0.2 * rng.standard_normal(512)).astype(np.float32)
    g, u = (rng.standard_normal(40001).astype(np.float32) * 6 for _ in range(2))
    heads = rng.standard_normal((300, 4, 128)).astype(np.float32)
    c, s = (rng.standard_normal((300, 128)).astype(np.float32) for _ in range(2))
    serial = _core.rms_norm(x, w, 1e-6)
    gated = u.copy()
    _core.silu_mul(g, gated)
    finished = np.empty((4, 300, 128), np.float32)
    _core.finish_heads(heads, finished, 0, w[:128].copy(), 1e-6, c, s, False, True)
    old = ag.get_num_threads()
    try:
        for t in (1, 2):
            ag.set_num_threads(t)
            np.testing.assert_array_equal(_core.rms_norm(x, w, 1e-6, None, True), serial)
            got = u.copy()
            _core.silu_mul(g, got, True)
            np.testing.assert_array_equal(got, gated)
            out = np.empty_like(finished)
            _core.finish_heads(heads, out, 0, w[:128].copy(), 1e-6, c, s, False, True, True)
            np.testing.assert_array_equal(out, finished)
    finally:
        ag.set_num_threads(old)


# -- BFloat16Weight and compute_dtype ------------------------------------------------------------
def test_bfloat16_weight_is_a_product_factor():
    rng = np.random.default_rng(6)
    W = rng.standard_normal((24, 10)).astype(np.float32)  # (k, n)
    x = rng.standard_normal((2, 3, 24))
    B = BFloat16Weight.of(W)
    assert B.shape == (24, 10) and B.bits.shape == (10, 24)
    np.testing.assert_array_equal(B.bits, float32_to_bfloat16(W.T))
    y = x @ B
    assert y.shape == (2, 3, 10) and y.dtype == np.float32
    np.testing.assert_array_equal(y.reshape(6, 10), _core.matmul_bf16(x.reshape(6, 24).astype(np.float32), B.bits))
    with pytest.raises(ValueError, match=r"x @ W: x has shape \(3, 5\)"):
        np.ones((3, 5)) @ B
    with pytest.raises(TypeError, match="C-contiguous 2-d uint16"):
        BFloat16Weight(np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "BFloat16"])
def test_compute_dtype_names(dtype):
    assert compute_dtype(dtype) == (np.dtype(np.float32), True)
    assert compute_dtype(np.float64) == (np.dtype(np.float64), False)
    with pytest.raises(ValueError, match="float32, float64 or 'bfloat16'"):
        compute_dtype(np.float16)
