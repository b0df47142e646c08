"""The tests' module of the emulated AVX512_BF16 products (attngeom._bf16_emulated: bf16.cpp
and the attention's bfloat16 tiles compiled on SIMDe's emulated intrinsics, built by make test
where SIMDe's headers are installed), so that every CPU runs the bfloat16 dot path's code."""
import pytest


def emulated_bf16():
    """attngeom._bf16_emulated, or a skip of the calling test where it is not built."""
    try:
        from attngeom import _bf16_emulated
    except ImportError:
        pytest.skip("attngeom._bf16_emulated is not built: make test builds it where SIMDe's headers are installed "
                    "(Debian: libsimde-dev)")
    return _bf16_emulated
