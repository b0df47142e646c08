"""The private operand layer: one wording for every argument error (name, expected shape,
received shape) and one dtype rule."""
import numpy as np
import pytest

from attngeom._deprecation import renamed_arguments
from attngeom._operands import check_token_ids, count, operand, query_key_value, rtol_arg, uniform_grid


def test_operand_reads_the_axes_rule_from_the_expected_shape():
    assert operand("x", np.ones((2, 3)), "(m, n)").shape == (2, 3)
    with pytest.raises(ValueError, match=r"^x must have shape \(m, n\), got \(2, 3, 4\)$"):
        operand("x", np.ones((2, 3, 4)), "(m, n)")
    assert operand("x", np.ones((5, 2, 3)), "(..., m, n)").shape == (5, 2, 3)
    with pytest.raises(ValueError, match=r"^x must have shape \(\.\.\., m, n\) \(at least 2 dimensions\), got \(3,\)$"):
        operand("x", np.ones(3), "(..., m, n)")
    with pytest.raises(ValueError, match=r"^x must be non-empty with shape \(m, n\), got \(0, 3\)$"):
        operand("x", np.ones((0, 3)), "(m, n)")
    with pytest.raises(ValueError, match="^x contains NaN or infinite values$"):
        operand("x", np.array([[np.inf]]), "(m, n)")
    with pytest.raises(TypeError, match="x must be a real floating or integer array"):
        operand("x", np.ones((2, 2), complex), "(m, n)")


@pytest.mark.parametrize("dtype, expected", [(np.float32, np.float32), (np.float16, np.float32),
                                             (np.float64, np.float64), (np.int64, np.float64)])
def test_operand_computation_dtype(dtype, expected):
    assert operand("x", np.ones((2, 2), dtype), "(m, n)").dtype == expected
    assert operand("x", np.ones((2, 2), dtype), "(m, n)", dtype=None).dtype == dtype
    a = operand("x", np.ones((3, 4))[:, ::2], "(m, n)", contiguous=True)
    assert a.flags.c_contiguous


def test_shared_width_blames_the_argument_whose_shape_is_wrong():
    q, k, v = np.ones((5, 3)), np.ones((6, 3)), np.ones((6, 2))
    with pytest.raises(ValueError, match=r"^q must have shape .* with d_k = 3 \(from k\), got \(3, 5\): is q transposed"):
        query_key_value(q.T, k, v)
    with pytest.raises(ValueError, match=r"^k must have shape \(\.\.\., n_k, d_k\) with d_k = 3 \(from q\), got \(6, 2\)"):
        query_key_value(q, k[:, :2], v)
    with pytest.raises(ValueError, match=r"^v must have shape \(\.\.\., n_k, d_v\) with n_k = 6 \(from k\), got \(5, 2\)"):
        query_key_value(q, k, v[:5])


def test_scalar_arguments():
    assert count("n", 3) == 3
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            count("n", bad)
    assert count("n", None, allow_none=True) is None
    with pytest.raises(TypeError, match=r"^n must be an integer >= 1, got 1\.5$"):  # type_error: the kind is wrong
        count("n", 1.5, type_error=True)
    with pytest.raises(ValueError, match="^n must be an integer >= 1, got 0$"):
        count("n", 0, type_error=True)
    assert rtol_arg(None) is None and rtol_arg(0) == 0.0
    with pytest.raises(ValueError, match="rtol must be >= 0"):
        rtol_arg(-1.0)
    t, step, kind = uniform_grid("tau", 1j * np.arange(4.0))
    assert kind == "imaginary" and step == 1j
    with pytest.raises(ValueError, match="tau must be uniformly spaced"):
        uniform_grid("tau", np.array([0.0, 1.0, 3.0]))


def test_token_ids_lie_in_the_vocabulary():
    check_token_ids("ids", np.array([0, 4]), 5)
    with pytest.raises(ValueError, match=r"^ids must lie in 0\.\.4 \(vocab 5\), got 0\.\.5$"):
        check_token_ids("ids", np.array([0, 5]), 5, " (vocab 5)")


def test_renamed_arguments():
    @renamed_arguments(old="new")
    def f(new=0):
        return new

    with pytest.warns(DeprecationWarning, match=r"f\(\): the argument 'old' is deprecated, use 'new'"):
        assert f(old=2) == 2
    with pytest.raises(TypeError, match="both 'old'"):
        f(old=1, new=2)


class _TorchLikeBfloat16:
    """Stands in for a torch bfloat16 tensor: np.asarray fails on it the way it fails on torch's."""
    __module__ = "torch"
    dtype = "torch.bfloat16"

    def __array__(self, *args, **kwargs):
        raise TypeError("Got unsupported ScalarType BFloat16")


def test_bfloat16_tensor_error_says_to_call_float():
    with pytest.raises(TypeError, match=r"^q is a torch bfloat16 tensor.*q\.float\(\)"):
        operand("q", _TorchLikeBfloat16(), "(..., n_q, d_k)")


def test_bfloat16_torch_tensor_through_a_public_function():
    torch = pytest.importorskip("torch")
    import attngeom as ag
    k = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"q is a torch bfloat16 tensor.*q\.float\(\)"):
        ag.softmax_attention(torch.ones((2, 4), dtype=torch.bfloat16), k, k)
    y = ag.softmax_attention(torch.ones((2, 4), dtype=torch.bfloat16).float(), k, k)
    assert y.dtype == np.float32


@pytest.mark.parametrize("dtype, expected", [(np.float16, np.float32), (np.float32, np.float32),
                                             (np.float64, np.float64), (np.int32, np.float64)])
def test_public_dtype_contract(dtype, expected):
    """The documented rule (README "Conventions"): float32 and float64 are kept, float16 is
    computed and returned in float32, integers become float64."""
    import attngeom as ag
    x = np.arange(12).reshape(3, 4).astype(dtype)
    assert ag.softmax_attention(x, x, x).dtype == expected
    assert ag.kernel_attention(x, x, x, kernel="cauchy").dtype == expected
    u, tau = ag.tilt_radius(x)
    assert u.dtype == expected


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_finite_check_of_large_arrays_finds_every_position(dtype):
    # From 2^16 entries the check runs in the core, in 16k-entry blocks split over threads:
    # one bad entry at a block's edges, in the middle and at the very end is found, as NumPy
    # finds it; a strided view of the same array goes through NumPy.
    from attngeom._operands.validation import _CORE_CHECK_SIZE, all_finite
    n = 5 * _CORE_CHECK_SIZE + 7
    a = np.ones(n, dtype)
    assert all_finite(a) and all_finite(a.reshape(-1, 1)) and all_finite(a[::2])
    for i in (0, 16383, 16384, n // 2, n - 1):
        for bad in (np.nan, np.inf, -np.inf):
            a[i] = bad
            assert not all_finite(a) and not all_finite(a.reshape(-1, 1)[i:])
            a[i] = 1
    a[-1] = np.nan
    assert all_finite(a[:-1][::2]) and not all_finite(a[::2])  # n - 1 is even
    small = np.ones(10, dtype)
    small[3] = np.nan
    assert not all_finite(small)
