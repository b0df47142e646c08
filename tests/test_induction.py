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

import attngeom as ag  # noqa: E402
from attngeom.experiments import InductionConfig, run_induction  # noqa: E402
from attngeom.experiments.induction import probe_batches  # noqa: E402
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
    for s, seed in enumerate((1, 2)):
        after = steps[:-1] >= TINY["warmup"]  # intervals after the learning rate's warmup
        fall = np.where(after, np.diff(icl[s]) / np.diff(steps), np.inf)
        assert summary[f"phase_change_step_2layer_seed{seed}"] == steps[1:][np.argmin(fall)]
        prev = z_prev[s, -1, 0].argmax()
        head = ind[s, -1, 1].argmax()  # the circuit: final previous-token head of layer 0, induction head of layer 1
        rise = np.where(after, np.diff(comp[s][:, prev, head]) / np.diff(steps), -np.inf)
        assert summary[f"composition_rise_step_2layer_seed{seed}"] == steps[1:][np.argmax(rise)]
        assert summary[f"final_induction_score_2layer_seed{seed}"] == ind[s, -1].max()
        apart = summary[f"composition_rise_step_2layer_seed{seed}"] - summary[f"phase_change_step_2layer_seed{seed}"]
        assert summary[f"agree_2layer_seed{seed}"] == float(abs(apart) <= 2 * TINY["eval_every"])
    assert summary["phase_change_step_2layer"] == np.mean([summary[f"phase_change_step_2layer_seed{s}"]
                                                            for s in (1, 2)])


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
    assert all(len(ax.lines) >= 3 for ax in a.plot_loss().axes)  # two curves and the phase-change mark
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
