"""The projection, whitening, random-features and inverse drivers at small configs: the identities, the
sign and shape of every predicted effect, the figures, the CLI run folders; the progress helper."""
import dataclasses
import io
import json
import math
import sys

import numpy as np
import pytest

from attngeom.experiments import (
    EXPERIMENTS,
    InverseConfig,
    ProjectionConfig,
    RandomFeaturesConfig,
    WhiteningConfig,
    run_inverse,
    run_projection,
    run_random_features,
    run_whitening,
)
from attngeom.experiments._progress import progress

EPS = np.finfo(np.float64).eps


@pytest.fixture
def pyplot():
    """matplotlib.pyplot (the test is skipped without it); every figure is closed afterwards."""
    plt = pytest.importorskip("matplotlib.pyplot")
    yield plt
    plt.close("all")


def figure_axes(result, *methods):
    """({file name: number of axes}, figures) of ``result.figures()``; checks on the way that
    each plot method in `methods`, called alone, draws a figure with axes."""
    figs = result.figures()
    for method in methods:
        assert method().axes, method.__name__
    return {k: len(f.axes) for k, f in figs.items()}, figs


def saved(result, tmp_path):
    """The JSON that ``result.to_json`` writes, read back."""
    with open(result.to_json(tmp_path / "s.json")) as f:
        return json.load(f)


# -- projection ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def projection():
    return run_projection(ProjectionConfig(n_examples=4, n_sigma=13, n_points=200, n_layers=3, seed=1))


def test_projection_identity(projection):
    r = projection
    assert r.identity_rel_error < 8 * EPS and r.weight_abs_error < 8 * EPS
    # at every sigma, to the rounding of logits of size 1 / sigma^2
    assert np.all(r.identity_rel_error_sweep <= 16 * EPS * np.maximum(1.0, 1.0 / r.sigma ** 2))
    # the paper's unsquared distance |q - k| is not the same weighting
    assert r.unsquared_weight_error > 1e3 * r.weight_abs_error


def test_projection_sigma_sweep(projection):
    r = projection
    s = r.summary()
    assert r.sigma[0] == pytest.approx(0.01) and r.sigma.shape == r.entropy.shape == (13,)
    # small sigma: every token keeps itself (the layer is the identity); large sigma: uniform weights
    assert np.all(np.diff(r.entropy) >= -1e-12) and np.all(np.diff(r.max_prob) <= 1e-12)
    assert np.all(np.diff(r.output_change) >= -1e-12)
    assert s["max_prob_sigma_min"] > 1 - 1e-9 and s["output_change_sigma_min"] < 1e-9
    assert s["entropy_sigma_max"] == pytest.approx(math.log(64), rel=1e-3)
    assert s["max_prob_sigma_max"] < 2.0 / 64
    assert r.sigma[0] < s["sigma_half_entropy"] < r.sigma[-1]


def test_projection_flattening(projection):
    r = projection
    s = r.summary()
    assert r.local_dim_after.shape == (3, 200) and r.local_dim_before.shape == (200,)
    assert s["local_dim_after_1"] < 0.8 * s["local_dim_before"]
    layers = s["layers"]["local_dim"]
    assert all(a > b for a, b in zip(layers, layers[1:]))  # every layer flattens further
    assert s["off_plane_after_1"] < s["off_plane_before"] and s["off_plane_after_last"] < s["off_plane_after_1"]


def test_projection_figures(projection, pyplot):
    r = projection
    axes, figs = figure_axes(r, r.plot_identity, r.plot_sigma_sweep, r.plot_flattening, r.plot_cloud)
    assert axes == {"identity.png": 1, "sigma_sweep.png": 3, "flattening.png": 3, "cloud.png": 3}
    assert figs["sigma_sweep.png"].axes[0].get_xscale() == "log"


# -- whitening -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def whitening():
    return run_whitening(WhiteningConfig(batch=1000, T=10, D=3, phi_max=0.6, n_phi=7, timing_T=256, timing_D=4,
                                         timing_batch=4, timing_repeats=1, seed=2))


def test_whitening_effects(whitening):
    r = whitening
    s = r.summary()
    assert r.phi.shape == (7,) and s["phi_ref"] == pytest.approx(0.3)
    for kind in ("stationary", "drifting"):
        assert np.all(np.diff(r.psi_x[kind]) > 0)  # stronger correlation, less white
        assert r.psi_x[kind][0] < 1.3 * r.psi_white  # phi = 0 is white noise
        # the filter whitens at moderate correlation ...
        assert s[f"relative_whiteness_{kind}"] < 1 and s[f"psi_w_{kind}"] < s[f"psi_x_{kind}"]
        # ... and the lag-1 model stops existing at strong correlation
        assert 0.3 < s[f"breakdown_phi_{kind}"] <= 0.6
        assert np.all(np.isnan(r.psi_w[kind][r.phi >= s[f"breakdown_phi_{kind}"]]))
    # the drifting process is less stationary, the more so the larger its drift, and whitened less well
    ratio = r.rho["drifting"] / r.rho["stationary"]
    assert ratio[0] == pytest.approx(1.0) and np.all(np.diff(ratio) > 0) and ratio[-1] > 3
    both = np.isfinite(r.psi_w["drifting"]) & np.isfinite(r.psi_w["stationary"]) & (r.phi > 0)
    assert np.all(r.relative_whiteness("drifting")[both] > r.relative_whiteness("stationary")[both])
    # the scan is the recursion, to rounding
    assert s["scan_rel_error"] < 1e-13
    assert set(r.timing) == {"B=1", "B=4"} and all(t["recursion"] > 0 and t["scan"] > 0 for t in r.timing.values())
    assert s["scan_over_recursion_B1"] > 0  # a measured ratio, not asserted against a bound


def test_whitening_summary_json(whitening, tmp_path):
    data = saved(whitening, tmp_path)
    sweep = data["summary"]["sweep"]
    assert len(sweep["phi"]) == 7 and None in sweep["psi_w_stationary"]  # NaN saved as null
    assert data["config"]["seed"] == 2


def test_whitening_figures(whitening, pyplot):
    r = whitening
    axes, figs = figure_axes(r, r.plot_whiteness, r.plot_stationarity, r.plot_timing)
    assert axes == {"whiteness.png": 2, "stationarity.png": 1, "scan_timing.png": 1}
    assert figs["whiteness.png"].axes[0].get_yscale() == "log"


# -- random features and importance sampling ----------------------------------------------
@pytest.fixture(scope="module")
def random_features():
    return run_random_features(RandomFeaturesConfig(max_features=256, feature_draws=40, n_tau=5, sampling_draws=40,
                                                    seed=3))


def test_feature_error_falls_with_m(random_features):
    r = random_features
    s = r.summary()
    assert list(r.num_features) == [8, 16, 32, 64, 128, 256]
    for kind in ("iid", "orthogonal"):
        assert r.z_mse[kind][-1] < r.z_mse[kind][0] / 10
        assert s[f"z_mse_slope_{kind}"] < -0.7  # variance ~ 1/m
        assert np.all(np.diff(r.output_error[kind]) < 0)
        assert s[f"output_error_slope_{kind}"] < -0.3
    assert s["orthogonal_over_iid_output_error"] < 1  # orthogonal blocks lower the error


def test_sampling_variance_grows_with_tau(random_features):
    r = random_features
    s = r.summary()
    assert r.tau == pytest.approx(np.geomspace(0.25, 4.0, 5))
    assert np.all(np.diff(r.uniform_exact) > 0)  # Gibbs weights concentrate as tau grows
    assert np.all(np.diff(r.sampling_mse["uniform"]) > 0)
    assert s["sampling_mse_uniform_tau_max"] > 100 * s["sampling_mse_uniform_tau_min"]
    assert np.all(r.sampling_mse["tilted"] < r.sampling_mse["uniform"])
    # Monte Carlo against the exact variance of the uniform proposal where its tails are light
    assert r.sampling_mse["uniform"][0] == pytest.approx(r.uniform_exact[0], rel=0.1)


def test_random_features_figures(random_features, pyplot):
    r = random_features
    axes, figs = figure_axes(r, r.plot_feature_error, r.plot_sampling_variance)
    assert axes == {"feature_error.png": 2, "sampling_variance.png": 1}
    ax = figs["feature_error.png"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


# -- inverse pipeline -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def inverse():
    return run_inverse(InverseConfig(max_nodes=12, node_draws=3, n_eta=4, noise_draws=4, points_n_d2=50, points_n_d3=20,
                                     phantom_size=64, n_angles=64, timing_repeats=1, seed=4))


def test_inverse_node_recovery(inverse):
    r = inverse
    s = r.summary()
    assert r.n_nodes.tolist() == list(range(1, 13))
    for kind in ("real", "imaginary"):
        assert r.node_error[kind].shape == r.node_order[kind].shape == (12, 3)
        assert np.all(r.node_order[kind] <= r.n_nodes[:, None])  # the order selection never invents nodes
    med = {kind: np.median(r.node_error[kind], axis=1) for kind in ("real", "imaginary")}
    beyond = r.n_nodes > 6
    assert np.all(med["imaginary"][beyond] < med["real"][beyond])  # imaginary tau beats real tau beyond n = 6
    assert np.all(med["imaginary"][beyond] < 1e-6 * med["real"][beyond])  # by six orders of magnitude at least
    assert np.all(r.node_error["imaginary"] <= 1e-10) and np.all(r.node_order["imaginary"] == r.n_nodes[:, None])
    assert np.all(r.node_error["real"][:4] <= 1e-7)  # real tau is exact for a few nodes ...
    assert np.all(np.diff(med["real"][2:8]) > 0)  # ... and degrades with every node added from n = 3 to 8
    assert 4 <= s["max_nodes_real_tau_error_1e-7"] <= 8 and s["max_nodes_imaginary_tau_error_1e-10"] == 12
    assert s["order_correct_fraction_imaginary"] == 1 and s["order_correct_fraction_real"] < 1


def test_inverse_noise(inverse):
    r = inverse
    s = r.summary()
    assert r.eta == pytest.approx(np.geomspace(1e-8, 1e-2, 4))
    assert np.all(r.noise_order == 8) and s["noise_order_max"] == s["noise_order_min"] == 8
    med = np.median(r.noise_error, axis=1)
    assert np.all(np.diff(med) > 0)  # the node error grows with the noise ...
    assert 0.8 < s["noise_error_slope"] < 1.2  # ... linearly
    assert np.all(r.noise_error >= 1e-4 * r.eta[:, None]) and np.all(r.noise_error <= 0.05 * r.eta[:, None])


def test_inverse_points_keys_densities(inverse):
    r = inverse
    s = r.summary()
    assert r.points_n == {2: 50, 3: 20, 8: 8}
    for d in (2, 3, 8):
        assert s[f"points_error_d{d}"] <= 1e-12 and s[f"points_time_ms_d{d}"] > 0
    assert r.cloud_2d[0].shape == r.cloud_2d[1].shape == (50, 2)
    assert s["recover_keys_key_error"] <= 1e-8 and s["recover_keys_value_error"] <= 1e-8
    assert s["recover_keys_multiplicity_error"] <= 1e-6
    assert s["density_w1_uniform"] < 0.02 and s["density_w1_uniform_noisy"] < 0.1
    assert s["density_w1_gaussian"] < 0.01 and s["density_w1_gaussian_noisy"] < 0.05
    for case in r.densities.values():
        assert case.s.shape == case.truth.shape == case.clean.shape == case.noisy.shape == (201,)
        assert np.all(case.clean >= 0) and np.all(case.noisy >= 0)  # non-negative least squares


def test_inverse_missing_wedge(inverse):
    r = inverse
    s = r.summary()
    assert r.wedges.tolist() == [0, 30, 60, 90] and r.angles_kept[0] == 64
    assert np.all(np.diff(r.angles_kept) < 0)
    for method in ("fbp", "sart"):
        assert np.all(np.diff(r.rms[method]) > 0)  # the error grows with the missing wedge
        assert r.images[method].shape == (4, 64, 64)
    assert r.rms["sart"][-1] > 3 * r.rms["sart"][0] and r.rms["fbp"][-1] > 3 * r.rms["fbp"][0]
    assert np.all(r.rms["sart"] < r.rms["fbp"])  # two SART sweeps beat filtered backprojection
    assert s["fbp_rms_error"] == r.rms["fbp"][0] and s["wedge_sart2_rms_error_90"] == r.rms["sart"][-1]
    assert s["wedge_fbp_rms_error_30"] < s["wedge_fbp_rms_error_60"] < s["wedge_fbp_rms_error_90"]


def test_inverse_bad_config():
    with pytest.raises(ValueError, match="node_gap"):
        run_inverse(InverseConfig(node_gap=1.5))
    with pytest.raises(ValueError, match="max_wedge"):
        run_inverse(InverseConfig(max_wedge=180))


def test_inverse_summary_json(inverse, tmp_path):
    data = saved(inverse, tmp_path)
    sweep = data["summary"]["sweep"]
    assert len(sweep["n_nodes"]) == len(sweep["node_error_real"]) == 12 and len(sweep["sart2_rms_error"]) == 4
    assert data["config"]["seed"] == 4


def test_inverse_figures(inverse, pyplot):
    r = inverse
    axes, figs = figure_axes(r, r.plot_node_recovery, r.plot_noise, r.plot_densities, r.plot_points,
                             r.plot_missing_wedge, r.plot_wedge_errors)
    assert axes == {"node_recovery.png": 2, "node_noise.png": 2, "densities.png": 2, "points.png": 2,
                    "missing_wedge.png": 10, "wedge_errors.png": 1}
    ax = figs["node_recovery.png"].axes[0]
    assert ax.get_yscale() == "log" and len(ax.get_lines()) == 2
    noise = figs["node_noise.png"].axes[0]
    assert noise.get_xscale() == "log" and noise.get_yscale() == "log"
    assert len(figs["missing_wedge.png"].axes[0].get_images()) == 1


# -- the CLI writes a run folder for each driver -------------------------------------------
SMALL = {
    "projection": ["n_examples=2", "n_sigma=5", "n_points=60", "n_layers=2", "n_neighbors=8"],
    "whitening": ["batch=200", "T=6", "D=2", "n_phi=4", "timing_T=64", "timing_D=2", "timing_batch=2",
                  "timing_repeats=1"],
    "random_features": ["max_features=32", "feature_draws=3", "n_tau=3", "sampling_draws=3"],
    "inverse": ["max_nodes=6", "node_draws=2", "n_eta=3", "noise_draws=2", "points_n_d2=20", "points_n_d3=10",
                "phantom_size=32", "n_angles=32", "density_grid=61", "timing_repeats=1"],
}

PNGS = {
    "projection": ["identity.png", "sigma_sweep.png", "flattening.png", "cloud.png"],
    "whitening": ["whiteness.png", "stationarity.png", "scan_timing.png"],
    "random_features": ["feature_error.png", "sampling_variance.png"],
    "inverse": ["node_recovery.png", "node_noise.png", "densities.png", "points.png", "missing_wedge.png",
                "wedge_errors.png"],
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_cli_runs_driver(name, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from attngeom.cli import main

    args = ["run", name, "--seed", "5", "--out", str(tmp_path)]
    for pair in SMALL[name]:
        args += ["--set", pair]
    assert main(args) == 0
    (folder,) = list(tmp_path.iterdir())
    assert folder.name.startswith(name + "_")
    config = json.load(open(folder / "config.json"))
    assert config["seed"] == 5 and name in EXPERIMENTS
    key, value = SMALL[name][0].split("=")
    assert config[key] == int(value)
    summary = json.load(open(folder / "summary.json"))["summary"]
    assert summary and "sweep" in summary
    assert (folder / "summary.md").read_text().startswith(f"# {name}")
    for fname in PNGS[name]:
        assert (folder / fname).stat().st_size > 1000, fname
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(PNGS[name])
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| quantity | value | description |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| quantity")]
    assert rows
    for row in rows:  # every scalar says what it measures, and no description breaks the table
        assert row.count("|") == 4 and not row.endswith("|  |"), row


# -- progress bars -------------------------------------------------------------------------
class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_silent_unless_terminal(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.setattr(sys, "stderr", _Stream(False))
    assert list(progress(range(5), desc="x")) == list(range(5))
    assert sys.stderr.getvalue() == ""
    tty = _Stream(True)
    monkeypatch.setattr(sys, "stderr", tty)
    bar = progress(range(5), desc="sweep")
    assert isinstance(bar, tqdm.tqdm)
    assert list(bar) == list(range(5))
    assert "sweep" in tty.getvalue()


def test_progress_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    monkeypatch.setattr(sys, "stderr", _Stream(True))
    items = [1, 2, 3]
    assert progress(items) is items


@pytest.mark.parametrize("name", ["projection", "random_features", "inverse"])
def test_same_seed_same_summary(name):
    """A driver is a function of its config: the same seed gives the same summary (timings aside)."""
    from attngeom.cli import _parse_sets
    from attngeom.experiments import EXPERIMENTS

    config_cls, run = EXPERIMENTS[name]
    config = config_cls(**{**_parse_sets(config_cls, SMALL[name]), "seed": 3})

    def stable(summary):
        return {k: v for k, v in summary.items() if "time" not in k and "_ms" not in k}

    first, again = stable(run(config).summary()), stable(run(config).summary())
    other = stable(run(dataclasses.replace(config, seed=4)).summary())
    assert json.dumps(first, sort_keys=True, default=str) == json.dumps(again, sort_keys=True, default=str)
    assert json.dumps(first, sort_keys=True, default=str) != json.dumps(other, sort_keys=True, default=str)


def test_summary_json_is_strict(tmp_path):
    from attngeom.experiments._result import _strict

    assert _strict({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}}) == {"a": None, "b": [1.0, None],
                                                                                  "c": {"d": 2}}
