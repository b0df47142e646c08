"""The tomography driver (Laplace-Radon s.13, Table 1, Figures 1-10) at a small config."""
import math

import numpy as np
import pytest

from attngeom.experiments import TomographyConfig, run_tomography
from attngeom.experiments.tomography import PAPER_TABLE_1


@pytest.fixture(scope="module")
def result():
    return run_tomography(TomographyConfig(n_examples=48, n_alpha=13, baseline_draws=16, seed=2))


def test_identities_at_machine_precision(result):
    s = result.scalars
    assert s["laplace_radon_rel_error"] < 5e-15
    assert s["projection_logit_rel_error"] < 5e-15
    assert max(s["gauge_rel_error_B"], s["gauge_rel_error_logits"], s["gauge_rel_error_Y"]) < 1e-13


def test_mean_field_predictions(result):
    s = result.scalars
    assert s["tau_mean"] == pytest.approx(s["tau_mean_chi"], rel=0.02)
    assert s["logit_std_empirical"] == pytest.approx(s["logit_std_predicted"], rel=0.02)
    assert 0.8 < s["var_q"] < 1.25 and 0.8 < s["var_k"] < 1.25


def test_sweep_effects(result):
    sw, a = result.sweep, result.alpha
    assert np.all(np.diff(sw["entropy"]) < 0) and np.all(np.diff(sw["max_prob"]) > 0)
    peak = int(np.argmax(sw["effective_rank"]))
    assert 0 < peak < len(a) - 1  # the effective rank peaks at an interior alpha
    for base in ("_iid", "_bilinear"):
        assert np.all(np.diff(sw["entropy" + base]) < 0)
    # the structured baseline tracks the empirical rank better than iid logits (s.13.7)
    err = {b: np.mean(np.abs(sw["effective_rank" + b] - sw["effective_rank"])) for b in ("_iid", "_bilinear")}
    assert err["_bilinear"] < err["_iid"]


def test_summary_and_table(result, tmp_path):
    s = result.summary()
    for key in PAPER_TABLE_1:
        assert key in s and math.isfinite(s[key])
    assert set(s["sweep"]) >= {"alpha", "entropy", "max_prob", "effective_rank"}
    assert len(s["sweep"]["alpha"]) == 13
    table = result.table()
    assert table.count("\n") == len(PAPER_TABLE_1) + 6 + 1
    for row in table.splitlines()[2:]:  # quantity, ours, paper, a description of each
        assert row.count("|") == 5 and not row.endswith("|  |"), row
    result.to_json(tmp_path / "s.json")


def test_figures(result):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figs = result.figures()
    assert len(figs) == 10
    for name, fig in figs.items():
        assert fig.axes, name
    assert figs["fig08_entropy_sweep.png"].axes[0].get_xscale() == "log"
    plt.close("all")
