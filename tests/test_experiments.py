import json

import numpy as np

import attngeom as ag
from attngeom.experiments import IdentityConfig, run_identity


def test_identity_experiment(tmp_path):
    res = run_identity(IdentityConfig(n_heads=3, n_examples=8, seed=3))
    s = res.summary()
    assert s["laplace_radon_rel_error_max"] <= 1e-14
    assert s["laplace_radon_rel_error_float32"] <= 2e-6
    assert res.tau.shape == (3, 8, 64)
    path = res.to_json(tmp_path / "summary.json")
    data = json.load(open(path))
    assert data["config"]["seed"] == 3 and data["summary"] == s
    again = run_identity(IdentityConfig(n_heads=3, n_examples=8, seed=3))
    assert np.array_equal(again.tau, res.tau)


def test_identity_figures(tmp_path):
    res = run_identity(IdentityConfig(n_heads=2, n_examples=4))
    for fig in (res.plot_errors(), res.plot_radii(), res.plot_transform()):
        fig.savefig(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_cli_demo(tmp_path):
    from attngeom.cli import main

    assert main(["demo", "--out", str(tmp_path / "run")]) == 0
    for name in ("summary.json", "identity_errors.png", "radii.png", "transform.png"):
        assert (tmp_path / "run" / name).exists()
    assert main(["config"]) == 0
