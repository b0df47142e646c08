"""Instruction-set dispatch: every compiled level this CPU runs agrees with the baseline.

The portable build holds the core compiled for baseline x86-64, x86-64-v3 (AVX2, FMA) and
x86-64-v4 (AVX-512); attngeom._core imports the best one. Here the same calls run on each
level through ``_core.use_level`` and are compared with the baseline in float64.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import attngeom as ag
from attngeom import _core

RTOL = 1e-12


def _battery():
    """One call of every hot kernel, float64, results as a dict of arrays."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, 97, 16)) for _ in range(3))
    x = rng.standard_normal((4, 33, 8))
    out = {
        "softmax": ag.softmax_attention(q, k, v),
        "softmax_causal": ag.softmax_attention(q, k, v, causal=True),
        "softmax_mask": ag.softmax_attention(q, k, v, mask=rng.random((97, 97)) < 0.7),
        "projection": ag.projection_attention(q, k, v, sigma=2.0),
        "lightning": ag.lightning_attention(q, k, v),
        "lightning_causal": ag.lightning_attention(q, k, v, causal=True),
        "stable_density": ag.stable_density(np.linspace(-30, 30, 301), 1.3),
        "random_features": ag.random_feature_attention(q / 4, k / 4, v, num_features=64, seed=1),
        "random_features_causal": ag.random_feature_attention(q / 4, k / 4, v, num_features=64, seed=1, causal=True),
    }
    for kernel, params in [("exp", {}), ("gaussian", {"sigma": 1.5}), ("cauchy", {"gamma": 0.7}),
                           ("stable", {"alpha": 1.5})]:
        out[f"kernel_{kernel}"] = ag.kernel_attention(q, k, v, kernel=kernel, causal=True, **params)
    for causal in (False, "bottom_right"):  # the statistics' own packet loop
        _, st = ag.softmax_attention(q[..., :61, :], k, v, causal=causal, return_stats=True)
        for name in ("entropy", "max_weight", "sink_weight", "mean_distance"):
            out[f"stats_{causal}_{name}"] = getattr(st, name)
        out[f"stats_{causal}_argmax"] = st.argmax.astype(float)
    u, tau = ag.tilt_radius(q[0, 0])
    t = ag.laplace_radon_transform(u, tau, k[0, 0], v[0, 0])
    out["laplace_radon_Z"], out["laplace_radon_N"] = t.Z, t.N
    image = ag.shepp_logan_phantom(48)
    theta = np.linspace(0.0, 180.0, 40, endpoint=False)
    sino = ag.radon(image, theta)
    out["radon"] = sino
    out["iradon"] = ag.iradon(sino, theta)
    out["sart"] = ag.iradon_sart(sino, theta, iterations=2)
    L = np.tril(rng.standard_normal((8, 8))) + 4 * np.eye(8)
    M = 0.2 * rng.standard_normal((8, 8))
    out["whiten"] = ag.whiten(x, L, M)
    out["whiten_scan"] = ag.whiten_scan(x, L, M, block=8)
    weights = ag.random_weights([3, 2, 3], [2, 2], seed=3)
    X = rng.standard_normal((5, 3, 3))
    out["jacobian"] = ag.parametrization_jacobian(weights, X)
    out["jacobian_softmax"] = ag.parametrization_jacobian(weights, X, kind="softmax")
    out["singular_values"] = ag.singular_values(rng.standard_normal((3, 20, 12)))
    return out


def test_show_config_names_levels():
    cfg = ag.show_config(file=open(os.devnull, "w"))
    assert cfg["isa"] == _core.LEVEL
    assert cfg["isa"] in cfg["isa_compiled"].split()
    assert cfg["isa"] in cfg["isa_supported"].split()
    assert "baseline" in _core.SUPPORTED or _core.COMPILED == ("native",)


def test_best_supported_level_is_chosen():
    if os.environ.get(_core.ENV):
        pytest.skip(f"{_core.ENV} forces a level")
    assert _core.LEVEL == _core.SUPPORTED[0]


@pytest.mark.parametrize("level", [lv for lv in _core.SUPPORTED if lv != "baseline"])
def test_level_matches_baseline(level):
    if "baseline" not in _core.SUPPORTED:
        pytest.skip("native build: one level only")
    with _core.use_level("baseline"):
        assert ag.show_config(file=open(os.devnull, "w"))["isa"] == "baseline"
        reference = _battery()
    with _core.use_level(level):
        assert ag.show_config(file=open(os.devnull, "w"))["isa"] == level
        result = _battery()
    for name, ref in reference.items():
        got = result[name]
        scale = max(np.max(np.abs(ref)), np.finfo(float).tiny)
        err = np.max(np.abs(got - ref)) / scale
        assert err <= RTOL, f"{name} on {level}: {err:.2e} relative to the baseline"


def test_levels_differ_in_code():
    """The levels are really different builds (their compilers' SIMD flags differ)."""
    flags = {}
    for level in _core.SUPPORTED:
        with _core.use_level(level):
            flags[level] = _core.build_config()["simd"]
    if "avx2" in flags:
        assert "AVX2" in flags["avx2"] and "AVX2" not in flags["baseline"]
    if "avx512" in flags:
        assert "AVX512F" in flags["avx512"]


def _import_with(value):
    env = dict(os.environ, ATTNGEOM_ISA=value)
    code = "import attngeom as ag, os; print(ag.show_config(file=open(os.devnull, 'w'))['isa'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("level", list(_core.SUPPORTED))
def test_environment_forces_level(level):
    run = _import_with(level)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == level


def test_environment_rejects_unknown_level():
    run = _import_with("sse9")
    assert run.returncode != 0
    assert "ATTNGEOM_ISA must be one of" in run.stderr


def test_use_level_rejects_unsupported():
    with pytest.raises(ValueError, match="level must be one of"):
        with _core.use_level("sse9"):
            pass


def test_baseline_only_concepts_come_from_the_baseline():
    # The AVX2 / AVX-512 modules hold the hot kernels only; spectra, the inverse Laplace
    # solvers, the Radon projector and the network Jacobians are compiled once, into the
    # baseline module, and re-exported at every level.
    wide = [level for level in ("avx2", "avx512") if level in _core.SUPPORTED]
    if not wide:
        pytest.skip("no AVX2 / AVX-512 level compiled here")
    import importlib

    baseline = importlib.import_module("attngeom._core_baseline")
    for level in wide:
        module = importlib.import_module(f"attngeom._core_{level}")
        cold = ("factored_svd", "matrix_pencil", "radon_forward", "sart", "network_jacobian")
        assert not any(hasattr(module, name) for name in cold)
        assert hasattr(module, "softmax_attention")
        with _core.use_level(level):
            for name in cold:
                assert getattr(_core, name) is getattr(baseline, name)
            assert _core.softmax_attention is module.softmax_attention
