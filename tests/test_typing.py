"""The py.typed marker and the annotations agree: a small typed caller passes `mypy --strict`
exactly when the package ships the marker (PEP 561). Today most public functions have no
annotations (the call of ag.tilt_radius below is an untyped call), so there is no marker."""
import os
import subprocess
import sys
import sysconfig

import pytest

import attngeom as ag

USAGE = '''"""attngeom as a typed caller uses it."""
import numpy as np
import numpy.typing as npt

import attngeom as ag


def compare(q: npt.NDArray[np.float64], k: npt.NDArray[np.float64], v: npt.NDArray[np.float64]) -> float:
    y = ag.softmax_attention(q, k, v, causal="bottom_right")
    u, tau = ag.tilt_radius(q)
    y_lr = ag.laplace_radon_attention(u, tau, k, v)
    ag.set_num_threads(ag.get_num_threads())
    version: str = ag.__version__
    return float(np.abs(np.asarray(y) - np.asarray(y_lr)).max()) + len(version)
'''


def test_the_marker_is_shipped_exactly_when_a_typed_caller_passes(tmp_path):
    pytest.importorskip("mypy")
    package = os.path.dirname(os.path.abspath(ag.__file__))
    (tmp_path / "usage.py").write_text(USAGE)
    env = dict(os.environ)
    site = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    if os.path.realpath(os.path.dirname(package)) not in site:  # an editable install: the sources
        env["MYPYPATH"] = os.path.dirname(package)
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                             "--no-incremental", "usage.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "usage.py" in result.stdout + result.stderr or result.returncode == 0, result.stdout + result.stderr
    typed = result.returncode == 0
    marker = os.path.exists(os.path.join(package, "py.typed"))
    assert marker == typed, ("ship py.typed: the typed caller passes mypy --strict" if typed else
                             f"remove py.typed: mypy --strict fails on a typed caller:\n{result.stdout}")
