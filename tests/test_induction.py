"""attngeom run induction: attention-only models trained here, measured at every evaluation.

A tiny config trains through the command line into a run folder; every measured quantity is
then recomputed by its library function from the checkpoint saved at that step (no
re-implementation in the driver), and the summary's definitions are checked on the curves.
"""
import dataclasses
import json
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.heavy  # trains models (tests/conftest.py: collected first)

import attngeom as ag  # noqa: E402
from attngeom.experiments import InductionConfig, run_induction  # noqa: E402
from attngeom.experiments.induction import phase_change, probe_batches  # noqa: E402
from attngeom.experiments.training import TrainingConfig, load_corpus  # noqa: E402

TINY = dict(corpus="markov", d_model=16, n_heads=2, context=16, batch=8, iterations=30, eval_every=10, seeds=2,
            probe=4, icl_early=2, icl_late=12, warmup=2, threads=1, workers=1, top_singular_values=2, seed=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    pytest.importorskip("matplotlib")
    from attngeom.cli import main

    out = tmp_path_factory.mktemp("runs")
    sets = [f"{k}={v}" for k, v in TINY.items() if k != "seed"]
    args = ["run", "induction", "--seed", str(TINY["seed"]), "--out", str(out)]
    for pair in sets:
        args += ["--set", pair]
    assert main(args) == 0
    (run,) = [p for p in out.iterdir() if p.name.startswith("induction_")]
    return run


def test_run_folder(folder):
    files = set(os.listdir(folder))
    assert {"config.json", "summary.json", "summary.md", "loss.png", "formation.png", "curves.npz",
            "checkpoints"} <= files
    steps = sorted(os.listdir(folder / "checkpoints" / "2layer" / "seed2"))
    assert steps == ["step000000", "step000010", "step000020", "step000030"]
    summary = json.load(open(folder / "summary.json"))["summary"]
    for arm in ("1layer", "2layer"):
        for key in ("phase_change_step", "final_induction_score", "final_icl_score", "composition_rise_step"):
            assert f"{key}_{arm}" in summary and f"{key}_{arm}_seed1" in summary and f"{key}_{arm}_seed2" in summary
    assert summary["composition_rise_step_1layer"] is None  # one layer: no composition (NaN -> null)
    assert "| 2layer | 2 |" in (folder / "summary.md").read_text()


def test_every_measurement_is_the_library_function_of_the_checkpoint(folder):
    """Each curve value at a step equals the library function applied to that step's checkpoint."""
    config = InductionConfig(**{k: v for k, v in TINY.items()})
    corpus = load_corpus(TrainingConfig(corpus="markov", seed=TINY["seed"]))
    probes = probe_batches(config, corpus)
    with np.load(folder / "curves.npz") as z:
        curves = {k: z[k] for k in z.files}
    for arm, seed, k in (("2layer", 2, 3), ("2layer", 1, 1), ("1layer", 1, 2)):
        s, step = seed - TINY["seed"], int(curves["eval_points"][k])
        model = ag.load_model(folder / "checkpoints" / arm / f"seed{seed}" / f"step{step:06d}")
        got = {name[len(arm) + 1:]: v[s, k] for name, v in curves.items() if name.startswith(arm + "/")}
        for kind, ids in probes.items():
            losses = ag.models.next_token_losses(model.forward(ids).logits, ids)
            assert got[f"loss_{kind}"] == losses.mean()
            icl = losses[:, config.icl_late].mean() - losses[:, config.icl_early].mean()
            assert got["icl_score" if kind == "text" else "icl_repeated"] == icl
        both = np.concatenate([probes["text"], probes["repeated"]])
        np.testing.assert_array_equal(got["effect"], ag.models.head_ablation_effects(model, both).effects)
        scores = ag.models.induction_scores(model, seq_len=8, n_repeats=2, n_sequences=4, seed=TINY["seed"])
        np.testing.assert_array_equal(got["induction"], scores.induction)
        np.testing.assert_array_equal(got["previous_token"], scores.previous_token)
        H = model.heads
        d = H.diagnostics()
        np.testing.assert_array_equal(got["qk_effective_rank"], d.bilinear_effective_rank)
        np.testing.assert_array_equal(got["ov_effective_rank"], d.ov_effective_rank)
        np.testing.assert_array_equal(got["qk_top"], d.nulls.singular_values[..., :2])
        np.testing.assert_array_equal(got["ov_top"], d.ov_singular_values[..., :2])
        assert got["ker_B_dim"][0, 0] == d.nulls.ker_B[0, 0].dim
        if arm == "2layer":
            for mode in ("K", "Q"):
                np.testing.assert_array_equal(got[f"{mode.lower()}_composition"],
                                              ag.composition_scores(H.W_Q, H.W_K, H.W_V, H.W_O, mode)[0, :, 1, :])
        else:
            assert "k_composition" not in got
        assert math.isfinite(got["train_loss"]) or k == 0


def test_summary_definitions(folder):
    summary = json.load(open(folder / "summary.json"))["summary"]
    with np.load(folder / "curves.npz") as z:
        steps, icl, comp, ind = z["eval_points"], z["2layer/icl_repeated"], z["2layer/k_composition"], \
            z["2layer/induction"]
        z_prev = z["2layer/previous_token"]
    config = InductionConfig(**TINY)
    for s, seed in enumerate((1, 2)):
        after = steps[:-1] >= TINY["warmup"]  # intervals after the learning rate's warmup
        icl_fall = icl[s][steps >= TINY["warmup"]].max() - icl[s, -1]
        assert summary[f"icl_fall_2layer_seed{seed}"] == pytest.approx(icl_fall, abs=1e-12)
        assert summary[f"final_induction_score_2layer_seed{seed}"] == ind[s, -1].max()
        # 30 steps of a tiny model form no circuit: no phase change, and the summary says so
        assert icl_fall < config.phase_min_icl_fall or ind[s, -1].max() < config.phase_min_induction
        assert summary[f"phase_change_found_2layer_seed{seed}"] == 0
        assert summary[f"phase_change_step_2layer_seed{seed}"] is None
        assert summary[f"composition_rise_step_2layer_seed{seed}"] is None
        assert f"agree_2layer_seed{seed}" not in summary
        # the definitions of the steps, where the thresholds are met (both set to what this run reaches)
        relaxed = dataclasses.replace(config, phase_min_icl_fall=min(icl_fall, 0.0), phase_min_induction=1e-9)
        found, fall, step = phase_change(steps.astype(float), icl[s], ind[s, -1].max(), relaxed)
        fastest = np.where(after, np.diff(icl[s]) / np.diff(steps), np.inf)
        assert found and step == steps[1:][np.argmin(fastest)]
        prev = z_prev[s, -1, 0].argmax()
        head = ind[s, -1, 1].argmax()  # the circuit: final previous-token head of layer 0, induction head of layer 1
        rise = np.where(after, np.diff(comp[s][:, prev, head]) / np.diff(steps), -np.inf)
        assert np.isfinite(steps[1:][np.argmax(rise)])
    assert summary["phase_change_step_2layer"] is None and summary["phase_change_found_2layer"] == 0
    text = (folder / "summary.md").read_text()
    verdicts = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(verdicts) == 4 and all(": no phase change found: " in v for v in verdicts)  # two arms, two seeds
    assert "needs >= 1" in text and "needs >= 0.3" in text


def test_phase_change_needs_the_stated_fall_and_induction_score():
    """A fall of the ICL score alone, or an induction score alone, is no phase change."""
    config = InductionConfig(warmup=100)
    steps = np.arange(0, 1001, 100.0)
    icl = np.array([0.0, -0.2, -0.3, -0.3, -0.4, -2.5, -4.0, -4.2, -4.3, -4.3, -4.3])
    found, fall, step = phase_change(steps, icl, 0.8, config)
    assert found and fall == pytest.approx(4.1) and step == 500.0
    assert not phase_change(steps, icl, 0.29, config)[0]  # no induction head
    assert math.isnan(phase_change(steps, icl, 0.29, config)[2])
    small = np.r_[0.0, np.linspace(-0.2, -1.1, 10)]  # a steady fall of 0.9 nats: below the margin
    assert not phase_change(steps, small, 0.8, config)[0]
    assert InductionConfig.phase_min_icl_fall == 1.0 and InductionConfig.phase_min_induction == 0.3
    import attngeom.experiments.induction as module

    doc = module.__doc__
    assert "phase_min_icl_fall`` nats (default 1.0)" in doc and "``phase_min_induction`` (default 0.3)" in doc


def test_too_few_iterations_report_no_phase_change(tmp_path, capsys):
    """The README's recipe with 300 iterations: the circuit has not formed, and the summary says so."""
    pytest.importorskip("matplotlib")
    from attngeom.cli import main

    assert main(["run", "induction", "--set", "layers=2", "--set", "iterations=300", "--set", "seeds=1",
                 "--out", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    text = (run / "summary.md").read_text()
    assert "2layer, seed 0: no phase change found" in text
    assert "| 2layer | 0 | no phase change |" in text
    summary = json.load(open(run / "summary.json"))["summary"]
    assert summary["phase_change_found_2layer"] == 0 and summary["phase_change_step_2layer"] is None
    assert summary["composition_rise_step_2layer"] is None
    assert summary["final_induction_score_2layer"] < 0.3


def test_workers_give_the_same_numbers():
    config = InductionConfig(**{**TINY, "iterations": 10, "eval_every": 5, "seeds": 1, "checkpoints": False})
    a, b = run_induction(config), run_induction(dataclasses.replace(config, workers=2))
    for arm in a.arms:
        for key, value in a.curves[arm].items():
            np.testing.assert_array_equal(value, b.curves[arm][key], err_msg=f"{arm} {key}")
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    axes = a.plot_formation().axes  # rows: scores, composition, ranks; columns: the arms
    assert all(len(ax.lines) >= 2 for ax in axes[:2] + axes[4:]) and len(axes[3].lines) >= 1
    assert len(axes[2].lines) == 0 and "no composition" in axes[2].texts[0].get_text()
    assert all(len(ax.lines) == 2 for ax in a.plot_loss().axes)  # two curves; no phase change, so no mark
    plt.close("all")


@pytest.mark.parametrize("pair, message", [
    ("positions=absolute", "positions must be 'learned' or 'rope'"),
    ("layers=0", "each arm is a positive layer count"),
    ("layers=", "layers must name at least one layer count"),
    ("repeat_fraction=1.5", r"repeat_fraction must be in \[0, 1\]"),
    ("icl_late=70", "icl_early and icl_late must satisfy"),
    ("segment_max=100", "segment_max must be in segment_min..context // 2"),
    ("iterations=0", "iterations must be an integer >= 1"),
    ("corpus=/nonexistent/file.txt", "corpus: cannot read"),
])
def test_bad_settings_are_one_line_errors(tmp_path, capsys, pair, message):
    from attngeom.cli import main

    assert main(["run", "induction", "--out", str(tmp_path), "--set", pair]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert __import__("re").search(message, err), err
    assert not os.listdir(tmp_path)  # nothing written
