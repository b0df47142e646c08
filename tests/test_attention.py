"""softmax_attention and kernel_attention against the NumPy references."""
import numpy as np
import pytest
from conftest import TOL, rel_err

import attngeom as ag
import reference as ref

SHAPES = [  # (batch q, batch k, batch v, n_q, n_k, d_k, d_v)
    ((), (), (), 5, 7, 3, 4),
    ((2,), (2,), (2,), 33, 65, 8, 5),
    ((2, 3), (1, 3), (2, 1), 70, 300, 16, 9),
    ((4, 1), (1, 2), (1, 2), 1, 513, 4, 3),
    ((3,), (), (), 130, 20, 6, 6),
]


def draw(rng, bq, bk, bv, n_q, n_k, d_k, d_v, dtype=np.float64):
    q = rng.standard_normal(bq + (n_q, d_k)).astype(dtype)
    k = rng.standard_normal(bk + (n_k, d_k)).astype(dtype)
    v = rng.standard_normal(bv + (n_k, d_v)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_softmax_matches_reference(rng, dtype, shape, causal):
    check_softmax_against_reference(*draw(rng, *shape, dtype=dtype), causal)


def check_softmax_against_reference(q, k, v, causal):
    """y, P and log Z of softmax_attention against the NumPy reference; zeros (and log Z =
    -inf) exactly where a query sees no key. Returns y."""
    dtype = q.dtype.type
    y, P, lz = ag.softmax_attention(q, k, v, causal=causal, return_routing=True, return_log_partition=True)
    y_r, P_r, lz_r = ref.softmax_attention(q, k, v, causal=causal)
    assert y.dtype == dtype and P.dtype == dtype and lz.dtype == dtype
    assert y.shape == y_r.shape and P.shape == P_r.shape and lz.shape == lz_r.shape
    tol = TOL[dtype]
    assert rel_err(y, y_r) < tol * 10
    assert np.max(np.abs(P - P_r)) < tol * 10
    finite = np.isfinite(lz_r)
    assert np.array_equal(finite, np.isfinite(lz))
    assert np.max(np.abs(lz[finite] - lz_r[finite])) < tol * 10 * max(1, np.abs(lz_r[finite]).max())
    assert np.array_equal(y[~finite], np.zeros_like(y[~finite]))
    return y


# (d_k, d_v): value tiles of every packet count (whole, narrower, none) and ragged columns
# past the last packet, at float32 and float64 packet widths; d_k off the transpose blocks.
TILE_WIDTHS = [(3, 1), (16, 16), (64, 24), (67, 48), (8, 64), (32, 69), (64, 131)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d_k,d_v", TILE_WIDTHS)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_register_tiles_every_width(rng, dtype, d_k, d_v, causal):
    # Two query blocks with a ragged last panel, two key blocks with a ragged last group of
    # keys; bottom_right with more queries than keys leaves the first rows empty.
    n_k = 150 if causal == "bottom_right" else 389
    q, k, v = draw(rng, (4,), (4,), (4,), 203, n_k, d_k, d_v, dtype)
    y = check_softmax_against_reference(q, k, v, causal)
    assert np.array_equal(ag.softmax_attention(q, k, v, causal=causal), y)  # without weights: the same path


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d_k,d_v", TILE_WIDTHS)
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("kernel", ["softmax", "cauchy"])
def test_an_output_entry_does_not_depend_on_the_query_tiling(rng, dtype, d_k, d_v, causal, kernel):
    """The rows of a query block go through register panels of up to 6 rows; the last panel of
    a block has what is left, and under a causal limit a panel's keys end at its last row's.
    Query blocks of 1, 5, 7, 8, 9, 64 and 203 rows make panels of every row count, and y, log Z
    and the statistics must be the same bits for all of them, columns past the last whole
    packet of d_v included: an entry depends on its query row, the keys and the key tiling
    only. The Cauchy kernel without statistics sums its bounded weights directly (no running
    max); with them it takes the log-domain path."""
    from attngeom import _core
    from attngeom._operands import AttentionOperands
    from attngeom.laplace_radon import tilts_and_radii

    q, k, v = draw(rng, (3,), (3,), (3,), 203, 389, d_k, d_v, dtype)
    scale = 1 / np.sqrt(d_k)
    if kernel == "softmax":
        args = AttentionOperands(q, k, v, causal=causal).core_args()

        def run(bq, stats):
            return _core.softmax_attention(args, scale, False, True, block_q=bq, want_stats=stats)
    else:
        u, tau = tilts_and_radii(q, scale)
        args = AttentionOperands(u, k, v, qname="q", tau=tau, causal=causal).core_args()

        def run(bq, stats):
            return _core.ridge_attention(args, "cauchy", {"gamma": 0.5}, False, True, want_stats=stats,
                                         block_q=bq)
    for stats in (False, True):
        runs = [leaves_of(run(bq, stats)) for bq in (0, 1, 5, 7, 8, 9, 64, 203)]
        assert len(runs[0]) == (7 if stats else 2)  # y, log Z and the five statistics
        for other in runs[1:]:
            assert all(a.tobytes() == b.tobytes() for a, b in zip(runs[0], other, strict=True))


def leaves_of(out) -> list[np.ndarray]:
    """The arrays of a core result: (y, weights or None, log Z, statistics tuple or None)."""
    found = []
    for part in out:
        if isinstance(part, np.ndarray):
            found.append(part)
        elif isinstance(part, (tuple, list)):
            found.extend(leaves_of(part))
    return found


def test_weights_and_output_paths_agree(rng):
    q, k, v = draw(rng, (2,), (2,), (2,), 40, 600, 8, 3)
    y1 = ag.softmax_attention(q, k, v)
    y2, P = ag.softmax_attention(q, k, v, return_routing=True)
    assert np.array_equal(y1, y2)
    assert rel_err(P @ v, y1) < 1e-13
    np.testing.assert_allclose(P.sum(-1), 1, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_masks(rng, dtype):
    q, k, v = draw(rng, (2, 3), (2, 3), (2, 3), 17, 300, 8, 5, dtype)
    keep = rng.random((3, 17, 300)) < 0.7  # broadcast over the first batch axis
    keep[1, 4] = False  # a fully masked row
    bias = rng.standard_normal((17, 300)).astype(dtype)
    bias[3, ::2] = -np.inf
    pad = rng.random(300) < 0.9  # key padding, shape (n_k,)
    for mask in (keep, bias, pad, keep[:, :1, :], bias[:, :1]):
        for causal in (False, True):
            y, P = ag.softmax_attention(q, k, v, mask=mask, causal=causal, return_routing=True)
            y_r, P_r, _ = ref.softmax_attention(q, k, v, mask=mask, causal=causal)
            assert rel_err(y, y_r) < TOL[dtype] * 10
            assert np.max(np.abs(P - P_r)) < TOL[dtype] * 10
    y = ag.softmax_attention(q, k, v, mask=keep)
    assert np.all(y[:, 1, 4] == 0)


def test_causal_alignment_conventions(rng):
    q, k, v = draw(rng, (), (), (), 4, 10, 3, 2)
    _, P_tl = ag.softmax_attention(q, k, v, causal=True, return_routing=True)
    _, P_br = ag.softmax_attention(q, k, v, causal="bottom_right", return_routing=True)
    # top-left: query 0 sees key 0 only; bottom-right: query 0 sees keys 0..6, the last query all.
    assert np.count_nonzero(P_tl[0]) == 1 and np.count_nonzero(P_tl[3]) == 4
    assert np.count_nonzero(P_br[0]) == 7 and np.count_nonzero(P_br[3]) == 10
    assert ag.softmax_attention(q, k, v, causal="top_left").tolist() == ag.softmax_attention(q, k, v, causal=True).tolist()
    # more queries than keys, bottom-right: the first n_q - n_k queries see nothing -> zeros
    q2, k2, v2 = draw(rng, (), (), (), 10, 4, 3, 2)
    y, lz = ag.softmax_attention(q2, k2, v2, causal="bottom_right", return_log_partition=True)
    assert np.all(y[:6] == 0) and np.all(np.isneginf(lz[:6])) and np.all(np.isfinite(lz[6:]))


def test_matches_pytorch_convention_when_square(rng):
    q, k, v = draw(rng, (3,), (3,), (3,), 50, 50, 8, 4)
    assert rel_err(ag.softmax_attention(q, k, v, causal=True), ag.softmax_attention(q, k, v, causal="bottom_right")) == 0


def test_non_contiguous_and_integer_inputs(rng):
    q, k, v = draw(rng, (4,), (4,), (4,), 20, 30, 6, 5)
    qt = np.asfortranarray(q)
    ks = np.repeat(k, 2, axis=-1)[..., ::2]  # strided view
    vs = v[::-1]
    assert not ks.flags.c_contiguous
    y = ag.softmax_attention(qt, ks, vs)
    y_r, _, _ = ref.softmax_attention(q, k, v[::-1])
    assert rel_err(y, y_r) < 1e-13
    qi = rng.integers(-3, 4, (5, 3))
    y = ag.softmax_attention(qi, qi, qi)
    assert y.dtype == np.float64
    assert rel_err(y, ref.softmax_attention(qi, qi, qi)[0]) < 1e-13
    # mixed float32 / float64 computes in float64
    assert ag.softmax_attention(q.astype(np.float32), k, v).dtype == np.float64


def test_scale(rng):
    q, k, v = draw(rng, (), (), (), 6, 9, 4, 2)
    for s in (0.0, 0.3, -2.0, 7):
        assert rel_err(ag.softmax_attention(q, k, v, scale=s), ref.softmax_attention(q, k, v, scale=s)[0]) < 1e-13


# ---- adversarial inputs ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_huge_logits(rng, dtype):
    q, k, v = draw(rng, (2,), (2,), (2,), 40, 700, 4, 3, dtype)
    q = q * dtype(1e4)  # logits of order 1e4 .. 1e5
    y, P, lz = ag.softmax_attention(q, k, v, return_routing=True, return_log_partition=True)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(P)) and np.all(np.isfinite(lz))
    y_r, P_r, lz_r = ref.softmax_attention(q, k, v)
    assert rel_err(y, y_r) < TOL[dtype] * 10
    assert rel_err(lz, lz_r) < TOL[dtype]


def test_repeated_keys_n1_and_zero_query(rng):
    q, k, v = draw(rng, (), (), (), 8, 1, 5, 3)
    y = ag.softmax_attention(q, k, v)  # n_k = 1: every query returns the one value
    assert rel_err(y, np.broadcast_to(v, y.shape)) < 1e-15
    k = np.repeat(rng.standard_normal((1, 5)), 50, axis=0)  # all keys equal: uniform weights
    v = rng.standard_normal((50, 3))
    y, P = ag.softmax_attention(q, k, v, return_routing=True)
    np.testing.assert_allclose(P, 1 / 50, rtol=1e-13)
    qz = np.zeros((1, 5))
    kk = rng.standard_normal((30, 5))
    y = ag.softmax_attention(qz, kk, v[:30])
    assert rel_err(y, v[:30].mean(0, keepdims=True)) < 1e-13
    y = ag.softmax_attention(rng.standard_normal((1, 1)), rng.standard_normal((1, 1)), rng.standard_normal((1, 1)))
    assert y.shape == (1, 1)


# ---- kernel attention -------------------------------------------------------------------

KERNEL_CASES = [("exp", {}), ("gaussian", {"sigma": 0.7}), ("cauchy", {"gamma": 0.4}),
                ("gaussian", {"sigma": 0.01}), ("cauchy", {"gamma": 3.0}), ("stable", {"alpha": 1.3, "c": 0.5}),
                ("stable", {"alpha": 0.6, "c": 2.0})]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kernel,params", KERNEL_CASES)
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_kernel_attention_matches_reference(rng, dtype, kernel, params, causal):
    q, k, v = draw(rng, (2, 2), (1, 2), (2, 1), 37, 290, 8, 5, dtype)
    mask = rng.random((37, 290)) < 0.8
    y, P, lz = ag.kernel_attention(q, k, v, kernel=kernel, causal=causal, mask=mask, return_routing=True,
                                   return_log_partition=True, **params)
    u, tau = ref.tilt_radius(q)
    y_r, P_r, lz_r = ref.ridge_attention(u, tau, k, v, kernel, mask=mask, causal=causal, **params)
    assert y.dtype == dtype
    assert rel_err(y, y_r) < TOL[dtype] * 20
    assert np.max(np.abs(P - P_r)) < TOL[dtype] * 20
    ok = np.isfinite(lz_r)
    assert np.max(np.abs(lz[ok] - lz_r[ok])) < TOL[dtype] * 20 * max(1, np.abs(lz_r[ok]).max())
    # positive kernels: rows are probability vectors (or zero rows where nothing is visible)
    sums = P.sum(-1)
    assert np.all(P >= 0)
    np.testing.assert_allclose(sums[ok], 1, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype,gamma", [(np.float64, 0.4), (np.float32, 0.4), (np.float64, 3.0), (np.float32, 3.0),
                                         (np.float64, 1e-6)])  # float32 cannot resolve tau - s at 1e-6
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_cauchy_direct_weights_match_reference(rng, dtype, causal, gamma):
    # Without a mask the Cauchy kernel sums its weights as they are (no running max, no exp).
    q, k, v = draw(rng, (2, 2), (1, 2), (2, 1), 37, 290, 8, 5, dtype)
    masked = ag.kernel_attention(q, k, v, kernel="cauchy", gamma=gamma, causal=causal,
                                 mask=np.ones((37, 290), bool))  # a mask takes the log-domain path
    assert rel_err(ag.kernel_attention(q, k, v, kernel="cauchy", gamma=gamma, causal=causal), masked) < TOL[dtype]
    y, P, lz = ag.kernel_attention(q, k, v, kernel="cauchy", gamma=gamma, causal=causal, return_routing=True,
                                   return_log_partition=True)
    y_r, P_r, lz_r = ref.ridge_attention(*ref.tilt_radius(q), k, v, "cauchy", causal=causal, gamma=gamma)
    assert rel_err(y, y_r) < TOL[dtype] * 20
    assert np.max(np.abs(P - P_r)) < TOL[dtype] * 20
    ok = np.isfinite(lz_r)
    assert np.max(np.abs(lz[ok] - lz_r[ok])) < TOL[dtype] * 20 * max(1, np.abs(lz_r[ok]).max())
    assert np.array_equal(np.isfinite(lz), ok)


def test_kernel_exp_equals_softmax(rng):
    q, k, v = draw(rng, (3,), (3,), (3,), 64, 200, 16, 8)
    for causal in (False, True):
        a = ag.kernel_attention(q, k, v, kernel="exp", causal=causal)
        b = ag.softmax_attention(q, k, v, causal=causal)
        assert rel_err(a, b) < 1e-14


def test_kernel_zero_query_is_uniform(rng):
    k, v = rng.standard_normal((40, 6)), rng.standard_normal((40, 3))
    for kernel in ("exp", "gaussian", "cauchy"):
        y, P = ag.kernel_attention(np.zeros((2, 6)), k, v, kernel=kernel, return_routing=True)
        np.testing.assert_allclose(P, 1 / 40, rtol=1e-14)


def test_gaussian_kernel_far_points_are_stable(rng):
    q, k, v = draw(rng, (), (), (), 10, 50, 4, 2)
    y = ag.kernel_attention(q * 100, k, v, kernel="gaussian", sigma=0.01)  # all log-weights ~ -1e8
    y_r = ref.ridge_attention(*ref.tilt_radius(q * 100), k, v, "gaussian", sigma=0.01)[0]
    assert np.all(np.isfinite(y)) and rel_err(y, y_r) < 1e-10


# ---- bad input --------------------------------------------------------------------------

def _qkv(rng):
    return draw(rng, (2,), (2,), (2,), 5, 6, 3, 4)


@pytest.mark.parametrize("fn", ["softmax", "kernel"])
def test_bad_inputs(rng, fn):
    f = ag.softmax_attention if fn == "softmax" else (lambda *a, **kw: ag.kernel_attention(*a, kernel="cauchy", **kw))
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=r"q must have shape"):
        f(q[0, 0], k, v)
    with pytest.raises(ValueError, match=r"k must have shape .*d_k = 3"):
        f(q, k[..., :2], v)
    with pytest.raises(ValueError, match=r"v must have shape .*n_k = 6"):
        f(q, k, v[:, :5])
    # a transposed q is blamed on q (its rows match the keys' width), not on k
    with pytest.raises(ValueError, match=r"^q must have shape \(\.\.\., n_q, d_k\) with d_k = 3 \(from k\), "
                                         r"got \(2, 3, 5\): is q transposed\?"):
        f(np.swapaxes(q, -1, -2), k, v)
    with pytest.raises(ValueError, match=r"batch dimensions do not broadcast"):
        f(q, np.concatenate([k, k, k]), np.concatenate([v, v, v]))
    qn = q.copy()
    qn[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match=r"q contains NaN"):
        f(qn, k, v)
    kn = k.copy()
    kn[1, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"k contains NaN"):
        f(q, kn, v)
    with pytest.raises(ValueError, match=r"k must be non-empty"):
        f(q, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match=r"q must be non-empty"):
        f(q[:, :0], k, v)
    with pytest.raises(ValueError, match=r"v must be non-empty"):
        f(q, k, v[..., :0])
    with pytest.raises(TypeError, match=r"q must be a real"):
        f(q.astype(complex), k, v)
    with pytest.raises(TypeError, match=r"v must be a real"):
        f(q, k, np.array([["a"]]))
    with pytest.raises(ValueError, match=r"mask must be broadcastable"):
        f(q, k, v, mask=np.ones((5, 5), bool))
    with pytest.raises(ValueError, match=r"mask .*NaN"):
        f(q, k, v, mask=np.full((5, 6), np.nan))
    with pytest.raises(ValueError, match=r"causal must be"):
        f(q, k, v, causal="diagonal")
    with pytest.raises(ValueError, match=r"scale must be finite"):
        f(q, k, v, scale=np.inf)
    with pytest.raises(TypeError, match=r"scale must be a real number"):
        f(q, k, v, scale="1")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_core_finds_non_finite_operands(rng, dtype, bad):
    """softmax_attention leaves the NaN / inf checks to the core (the range pass over q and k,
    the output rows for v): the same NonFiniteOperand, whichever block and thread hold it."""
    from attngeom.errors import NonFiniteOperand

    q, k, v = (rng.standard_normal((6, 2, 300, 16)).astype(dtype) for _ in range(3))  # parallel in the core
    for name, where in [("q", (5, 1, 299, 15)), ("k", (3, 0, 7, 0)), ("v", (0, 1, 150, 3)), ("v", (5, 1, 299, 15))]:
        ops = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
        ops[name][where] = bad
        with pytest.raises(NonFiniteOperand, match=f"^{name} contains NaN or infinite values$"):
            ag.softmax_attention(**ops, causal=True)
    # q is reported before k, and k before v, as the Python checks did
    with pytest.raises(NonFiniteOperand, match="^q contains"):
        ag.softmax_attention(q * np.nan, k * np.nan, v * np.nan)
    with pytest.raises(NonFiniteOperand, match="^k contains"):
        ag.softmax_attention(q, k * np.nan, v * np.nan)


@pytest.mark.parametrize("kernel, params", [("gaussian", {"sigma": 2.0}), ("cauchy", {"gamma": 2.0})])
def test_core_finds_non_finite_operands_of_ridge_kernels(rng, kernel, params):
    """kernel_attention checks q itself (u and tau come from it); k and v, and the tilts and
    radii given to laplace_radon_attention, are checked by the core."""
    from attngeom.errors import NonFiniteOperand

    q, k, v = (rng.standard_normal((2, 200, 8)) for _ in range(3))
    u, tau = ag.tilt_radius(q)
    for name in "qkv":
        ops = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
        ops[name][1, 150, 2] = np.nan
        with pytest.raises(NonFiniteOperand, match=f"^{name} contains NaN"):
            ag.kernel_attention(**ops, kernel=kernel, **params)
    for name, bad in [("u", u.copy()), ("tau", tau.copy())]:
        bad[(1, 7) + (() if name == "tau" else (0,))] = np.inf
        ops = {"u": u, "tau": tau, name: bad}
        with pytest.raises(NonFiniteOperand, match=f"^{name} contains NaN"):
            ag.laplace_radon_attention(ops["u"], ops["tau"], k, v, kernel=kernel, **params)


def test_values_no_query_sees_do_not_enter(rng):
    """A causal limit hides the keys past the last query from every query (top-left, n_q <
    n_k): their values never enter, so a NaN there changes nothing."""
    q, k, v = draw(rng, (), (), (), 4, 7, 3, 2)
    bad = v.copy()
    bad[4:] = np.nan
    assert np.array_equal(ag.softmax_attention(q, k, bad, causal=True), ag.softmax_attention(q, k, v, causal=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_output_overflow_is_refused(dtype):
    """Finite values whose weighted running sum passes the float range (|v| near the
    maximum, equal weights) raise ResultOverflow instead of returning inf."""
    from attngeom.errors import ResultOverflow

    big = np.finfo(dtype).max / 2
    q, k = np.zeros((3, 2), dtype), np.zeros((8, 2), dtype)
    v = np.full((8, 4), big, dtype)
    with pytest.raises(ResultOverflow, match="attention output is beyond the float range"):
        ag.softmax_attention(q, k, v)
    y = ag.softmax_attention(q, k, v / 8)  # the same sum within range: exact
    assert np.all(y == dtype(big / 8))


def test_bad_kernel_arguments(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=r"kernel must be one of"):
        ag.kernel_attention(q, k, v, kernel="laplacian")
    with pytest.raises(TypeError, match=r"kernel must be a string"):
        ag.kernel_attention(q, k, v, kernel=np.exp)
    for alpha in (0.0, -1.0, 2.5, np.nan):
        with pytest.raises(ValueError, match=r"alpha"):
            ag.kernel_attention(q, k, v, kernel="stable", alpha=alpha)
    with pytest.raises(ValueError, match=r"sigma must be > 0"):
        ag.kernel_attention(q, k, v, kernel="gaussian", sigma=0)
    with pytest.raises(ValueError, match=r"unexpected \['sigma'\]"):
        ag.kernel_attention(q, k, v, kernel="cauchy", sigma=1.0)


# ---- threads ----------------------------------------------------------------------------

def test_thread_count_does_not_change_results(rng):
    q, k, v = draw(rng, (6,), (6,), (6,), 300, 700, 16, 8)
    before = ag.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            ag.set_num_threads(n)
            assert ag.get_num_threads() == n
            out[n] = (ag.softmax_attention(q, k, v, causal=True, return_routing=True),
                      ag.kernel_attention(q, k, v, kernel="cauchy", gamma=0.5))
        (y1, P1), c1 = out[1]
        (y2, P2), c2 = out[2]
        assert rel_err(y1, y2) <= 1e-12 and rel_err(P1, P2) <= 1e-12 and rel_err(c1, c2) <= 1e-12
    finally:
        ag.set_num_threads(before)
