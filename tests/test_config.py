import io
import re

import pytest

import attngeom as ag


def test_version_and_config():
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", ag.__version__)
    buf = io.StringIO()
    cfg = ag.show_config(file=buf)
    for key in ("eigen_version", "openmp", "threads", "simd"):
        assert key in cfg and key in buf.getvalue()
    assert cfg["eigen_version"].startswith("3.4")
    assert cfg["threads"] == ag.get_num_threads()


def test_threads_round_trip():
    before = ag.get_num_threads()
    try:
        ag.set_num_threads(1)
        assert ag.get_num_threads() == 1
        ag.set_num_threads(3)
        assert ag.get_num_threads() == (3 if ag.show_config(file=io.StringIO())["openmp"] else 1)
    finally:
        ag.set_num_threads(before)
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, "):
        ag.set_num_threads(0)
    with pytest.raises(TypeError, match="n must be an integer"):
        ag.set_num_threads(1.5)
    with pytest.raises(TypeError, match="n must be an integer"):
        ag.set_num_threads(True)


@pytest.mark.parametrize("n", [100_000, 10**30])
def test_absurd_thread_counts_are_refused(n):
    """A team of 100,000 threads used to crash the interpreter at the next parallel kernel."""
    import numpy as np

    before = ag.get_num_threads()
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, \d+\], got"):
        ag.set_num_threads(n)
    assert ag.get_num_threads() == before
    q = np.ones((4, 64, 64))
    assert np.isfinite(ag.softmax_attention(q, q, q)).all()  # the kernels still run
