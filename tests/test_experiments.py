import json

import numpy as np

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


def test_cli_run_list_report(tmp_path, capsys):
    from attngeom.cli import main

    assert main(["run", "identity", "--out", str(tmp_path), "--set", "n_heads=2", "--set", "n_examples=4"]) == 0
    (folder,) = list(tmp_path.iterdir())
    assert folder.name.startswith("identity_")
    for name in ("config.json", "summary.json", "summary.md", "identity_errors.png", "radii.png", "transform.png"):
        assert (folder / name).exists()
    assert json.load(open(folder / "config.json"))["n_heads"] == 2
    assert main(["report", str(folder)]) == 0
    assert "laplace_radon_rel_error_max" in capsys.readouterr().out
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "tomography" in out and "dimension" in out
    assert main(["config"]) == 0
    capsys.readouterr()
    assert main(["run", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["run", "identity", "--set", "bogus=1"]) == 2
    assert "unknown config field 'bogus'" in capsys.readouterr().err


def test_figures_leave_no_pyplot_state(tmp_path):
    """Figures are built outside pyplot's registry: a run leaves no open figures behind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    before = plt.get_fignums()
    result = run_identity(IdentityConfig(n_heads=2, n_examples=4, seed=1))
    figs = result.figures()
    assert figs and all(isinstance(f, Figure) for f in figs.values())
    for name, fig in figs.items():
        fig.savefig(tmp_path / name)
    assert plt.get_fignums() == before
