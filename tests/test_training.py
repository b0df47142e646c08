"""The training experiment (seed 004 s.5-6, projection SDPA s.3) at a tiny size on a Markov source.

Every arm learns (its validation loss falls), perplexity is exp(loss), the whiteness and
stationarity series are finite, the same seed and thread count give the same losses, the
checkpoints are readable by ``ag.load_heads`` and rebuild the same model, and the pieces
(the Markov source's entropy rate, the whitened block, the equal-capacity width) are right.
"""
import dataclasses
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.heavy  # trains models (tests/conftest.py: collected first)

import attngeom as ag  # noqa: E402
from attngeom.experiments import EXPERIMENTS, TrainingConfig, run_training  # noqa: E402
from attngeom.experiments.training import CharCorpus, MarkovSource, load_corpus, parse_arms  # noqa: E402
from attngeom.torch.gpt import GPT, count_parameters, load_checkpoint, save_checkpoint  # noqa: E402

TINY = dict(corpus="markov", markov_chars=20_000, markov_alphabet=6, markov_order=1, d_model=16, n_heads=2,
            context=16, batch=16, iterations=80, eval_every=20, geometry_every=40, eval_windows=32,
            geometry_batch=16, timing_iterations=1, seeds=2, lr=1e-2, warmup=5, threads=1, seed=3)


@pytest.fixture(scope="module")
def tiny():
    return run_training(TrainingConfig(**TINY))


def test_every_arm_learns(tiny):
    r = tiny
    assert r.arms == ["standard", "whitened", "standard_equal", "whitened_half", "projection"]
    assert list(r.iterations) == [0, 20, 40, 60, 80]
    for arm in r.arms:
        loss = r.val_loss[arm]
        assert loss.shape == (2, 5) and np.all(np.isfinite(loss))
        assert np.all(loss[:, 0] > np.log(6) - 0.1)  # near-uniform at initialisation
        assert np.all(loss[:, -1] < loss[:, 0] - 0.2), (arm, loss)
        # every run gets closer to the source's entropy rate than to its starting point
        assert np.all(loss[:, -1] - r.corpus["entropy_rate"] < 0.75 * (loss[:, 0] - r.corpus["entropy_rate"])), arm
        assert np.all(np.diff(r.train_time[arm], axis=1) > 0)
        acc = r.val_accuracy[arm]
        assert np.all((acc >= 0) & (acc <= 1)) and np.all(acc[:, -1] > acc[:, 0])


def test_summary_tables(tiny):
    s = tiny.summary()
    for arm in tiny.arms:
        assert s[f"perplexity_{arm}"] == pytest.approx(math.exp(s[f"final_val_loss_{arm}"]), rel=1e-12, abs=0)
        assert s[f"final_val_loss_{arm}"] == pytest.approx(tiny.val_loss[arm][:, -1].mean(), rel=1e-12, abs=0)
        assert s[f"params_{arm}"] == tiny.arm_setup[arm]["params"] > 0
        assert s[f"time_s_{arm}"] > 0 and s[f"ms_per_iter_{arm}"] > 0
    setup = tiny.arm_setup
    assert setup["whitened_half"]["batch"] == 8 and setup["whitened"]["batch"] == 16
    assert setup["standard_equal"]["d_model"] > 16 == setup["standard"]["d_model"]
    # the baseline is the equal-capacity arm; it reaches its own final loss at the latest at the end
    assert s["baseline_arm"] == "standard_equal"
    assert s["iters_to_baseline_standard_equal"] is not None and s["iters_to_baseline_standard_equal"] <= 80
    for arm in tiny.arms:
        it = s[f"iters_to_baseline_{arm}"]
        if it is not None:
            i = list(tiny.iterations).index(it)
            assert tiny.mean_curve(arm)[i] <= s["baseline_loss"] + 1e-12
            assert np.all(tiny.mean_curve(arm)[:i] > s["baseline_loss"])
    assert s["entropy_rate"] == pytest.approx(tiny.corpus["entropy_rate"])
    assert {r["variant"] for r in s["table3"]} == {"standard", "whitened"} and len(s["table3"]) == 6
    assert all(r["ms_per_iter"] > 0 for r in s["table3"])
    md = tiny.table()
    for heading in ("Table 1", "Table 2", "Table 3", "What reproduced"):
        assert heading in md
    json.dumps(tiny.summary(), allow_nan=True)


def test_whiteness_and_stationarity_series(tiny):
    assert set(tiny.geometry) == {"whitened", "whitened_half"}
    for arm, g in tiny.geometry.items():
        for key in ("psi_x", "psi_w", "rho"):
            assert g[key].shape == (2, 5, 2)
            measured = g[key][:, [0, 2, 4]]  # iterations 0, 40, 80 (geometry_every = 40)
            assert np.all(np.isfinite(measured)) and np.all(measured > 0)
            assert np.all(np.isnan(g[key][:, [1, 3]]))
        # at initialisation the filter is the identity (L0 = I, M = 0): Psi_W = Psi_X
        np.testing.assert_allclose(g["psi_w"][:, 0], g["psi_x"][:, 0], rtol=1e-6)
        s = tiny.summary()
        assert math.isfinite(s[f"relative_whiteness_block0_{arm}"]) and math.isfinite(s[f"rho_block1_{arm}"])
    # the sampling floor: Psi and rho of white noise of the geometry batch's shape (16, 16, 16)
    s = tiny.summary()
    assert s["psi_white_noise"] == pytest.approx(math.sqrt(2 / (math.pi * 16)), rel=0.15)
    assert s["rho_white_noise"] > 0 and "sampling floor" in tiny.table()


def test_figures(tiny):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figs = tiny.figures()
    assert set(figs) == {"loss.png", "whiteness.png", "projection.png", "timing.png"}
    assert len(figs["loss.png"].axes) == 2 and len(figs["projection.png"].axes) == 3
    assert len(figs["whiteness.png"].axes) == 3
    assert len(figs["whiteness.png"].axes[1].lines) == 4  # two arms x two blocks
    plt.close("all")


def test_only_figures_with_data(tiny):
    """variants=standard,whitened with timing=False: no Table 3 figure, no projection figure
    without a projection arm, no matplotlib warning; summary.md says Table 3 was not measured."""
    pytest.importorskip("matplotlib")
    import warnings

    import matplotlib.pyplot as plt

    run = dataclasses.replace(tiny, arms=["standard", "whitened"], timing=[],
                              geometry={"whitened": tiny.geometry["whitened"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figs = run.figures()
    assert set(figs) == {"loss.png", "whiteness.png"}
    assert "Not measured in this run (timing=False)" in run.table()
    plain = dataclasses.replace(run, arms=["standard"], geometry={})
    assert set(plain.figures()) == {"loss.png"}
    plt.close("all")


def test_same_seed_same_losses():
    config = TrainingConfig(**{**TINY, "variants": "standard,whitened,lightning", "iterations": 30,
                               "eval_every": 10, "seeds": 1, "timing": False, "checkpoints": False})
    # a runs in worker processes, b in this one: the same losses bit for bit
    a, b = run_training(config), run_training(dataclasses.replace(config, workers=1))
    c = run_training(dataclasses.replace(config, seed=4))
    for arm in a.arms:
        np.testing.assert_array_equal(a.val_loss[arm], b.val_loss[arm])
        np.testing.assert_array_equal(a.train_loss[arm], b.train_loss[arm])
        assert not np.array_equal(a.val_loss[arm], c.val_loss[arm])
    np.testing.assert_array_equal(a.geometry["whitened"]["psi_w"], b.geometry["whitened"]["psi_w"])


def test_other_variants_learn():
    config = TrainingConfig(**{**TINY, "variants": "cauchy,stable,lightning", "iterations": 60, "seeds": 1,
                               "timing": False, "checkpoints": False, "alpha": 1.2, "gamma": 0.5})
    r = run_training(config)
    for arm in r.arms:
        assert r.val_loss[arm][0, -1] < r.val_loss[arm][0, 0] - 0.2, arm


def test_cli_run_folder_and_checkpoints(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from attngeom.cli import main

    sets = ["variants=standard,whitened", "iterations=10", "eval_every=5", "seeds=1", "timing_iterations=1",
            "corpus=markov", "markov_chars=5000", "d_model=16", "context=8", "batch=8", "geometry_batch=8",
            "eval_windows=8"]
    args = ["run", "training", "--seed", "2", "--out", str(tmp_path)]
    for pair in sets:
        args += ["--set", pair]
    assert main(args) == 0
    (folder,) = list(tmp_path.iterdir())
    config = json.load(open(folder / "config.json"))
    assert config["seed"] == 2 and config["variants"] == "standard,whitened" and config["lr"] == 2e-3
    assert config["schedule"] == "warmup_cosine" and "weight_decay" in config
    summary = json.load(open(folder / "summary.json"))["summary"]
    assert summary["params_whitened"] > summary["params_standard"]
    assert (folder / "summary.md").read_text().startswith("# training")
    for png in ("loss.png", "whiteness.png", "timing.png"):
        assert (folder / png).stat().st_size > 1000
    assert not (folder / "projection.png").exists()  # no projection arm in this run
    capsys.readouterr()
    for arm in ("standard", "whitened"):
        ck = folder / "checkpoints" / arm / "seed2"
        heads = ag.load_heads(str(ck))
        model = load_checkpoint(str(ck))
        assert heads.layout == "llama" and heads.causal and heads.W_Q.shape[:2] == (2, 2)
        block = model.blocks[0].attn
        if arm == "standard":
            q = block.qkv.weight[:16].detach().numpy().T  # (d_model, d_model), head h in columns h d_head ..
            np.testing.assert_allclose(heads.W_Q[0, 1], q[:, 8:16], rtol=1e-6)
            np.testing.assert_allclose(heads.W_O[0, 0], block.out.weight.detach().numpy().T[:8], rtol=1e-6)
        else:
            # padded head width d_model; B = W_Q W_K^T and W_OV = W_V W_O are the trained ones
            qk = block.qk.weight.detach().numpy().astype(np.float64)
            q, k = qk[:16].T, qk[16:].T
            for h in range(2):
                B = heads.W_Q[0, h] @ heads.W_K[0, h].T
                np.testing.assert_allclose(B, q[:, 8 * h:8 * h + 8] @ k[:, 8 * h:8 * h + 8].T, rtol=1e-5, atol=1e-9)
                ov = heads.W_V[0, h] @ heads.W_O[0, h]
                np.testing.assert_allclose(ov, block.out.weight.detach().numpy().T[16 * h:16 * h + 16], rtol=1e-6)
        assert ag.head_diagnostics(heads.W_Q[0], heads.W_K[0], heads.W_V[0], heads.W_O[0]) is not None
    # The softmax arm's checkpoint is a decoder to analyse with no download: load_model runs it
    # (equal to the torch model), and `attngeom heads` reads it with its rotary embedding and
    # no warning, the effects included.
    ck = folder / "checkpoints" / "standard" / "seed2"
    torch_model, model = load_checkpoint(str(ck)).eval(), ag.load_model(str(ck))
    ids = np.array([[1, 2, 3, 4, 0, 1, 2, 3]])
    with torch.no_grad():
        np.testing.assert_allclose(model.forward(ids, keep=("logits",)).logits,
                                   torch_model(torch.from_numpy(ids)).numpy(), rtol=1e-5, atol=1e-5)
    assert ag.load_heads(str(ck)).rotary is not None
    text = tmp_path / "text.txt"
    vocab = json.load(open(ck / "config.json"))["vocab"]
    text.write_text("".join(vocab) * 3 + "\n")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["heads", str(ck), "--text", str(text), "--effects", "--out", str(tmp_path / "h")]) == 0
    assert not [w for w in caught if "rotary" in str(w.message).lower() or "unknown" in str(w.message).lower()], \
        [str(w.message) for w in caught]
    info = json.load(open(tmp_path / "h" / "heads.json"))
    assert info["summary"]["rotary"] and "effects" in info


def test_checkpoint_round_trip(tmp_path):
    for variant in ("standard", "whitened", "projection"):
        torch.manual_seed(0)
        model = GPT(7, d_model=8, n_blocks=2, n_heads=2, context=6, variant=variant, **(
            {"sigma": 0.5} if variant == "projection" else {}))
        with torch.no_grad():  # move the whitening pair away from its identity start
            for block in model.blocks:
                if variant == "whitened":
                    block.attn.L0.add_(0.1 * torch.randn(8, 8))
                    block.attn.M.add_(0.1 * torch.randn(8, 8))
        folder = save_checkpoint(model, tmp_path / variant, vocab="abcdefg")
        again = load_checkpoint(folder)
        ids = torch.randint(0, 7, (3, 6))
        torch.testing.assert_close(again(ids), model.eval()(ids), rtol=0, atol=0)
        assert again.params == model.params and json.load(open(tmp_path / variant / "config.json"))["vocab"][0] == "a"


def test_load_model_runs_the_trained_softmax_arm(tmp_path):
    """ag.load_model reads attngeom's own checkpoints: the NumPy forward pass equals the torch
    GPT's logits (float64, 1e-12), the heads carry its rotation (queries_keys gives the q the
    attention used), text is tokenized by the stored characters, interventions apply; the
    other arms are refused with a pointer to load_checkpoint."""
    ids = np.random.default_rng(0).integers(0, 7, (3, 12))
    for mlp, positions in ((True, "rope"), (False, "rope"), (False, "learned")):  # the last two: run induction's
        torch.manual_seed(0)
        model = GPT(7, d_model=16, n_blocks=2, n_heads=2, context=12, mlp=mlp, positions=positions)
        with torch.no_grad():  # away from the zero biases and unit norms of the initialisation
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        folder = save_checkpoint(model.eval(), tmp_path / f"{mlp}_{positions}", vocab="abcdefg")
        torch.testing.assert_close(load_checkpoint(folder)(torch.tensor(ids)), model(torch.tensor(ids)), rtol=0,
                                   atol=0)
        m = ag.load_model(folder)
        with torch.no_grad():
            ref = model.double()(torch.tensor(ids)).numpy()
        f = m.forward(ids, dtype=np.float64, keep=("logits", "q", "attn_in"))
        np.testing.assert_allclose(f.logits, ref, rtol=0, atol=1e-12 * np.abs(ref).max(), err_msg=f"{mlp} {positions}")
        q, _ = m.heads.queries_keys(f.attn_in[1, 0], 1)
        np.testing.assert_allclose(q, f.q[1, 0], rtol=0, atol=1e-12)
        assert (m.heads.rotary is None) == (positions == "learned") and m.max_length == (12 if positions == "learned"
                                                                                         else None)
    assert m.tokenize("cab") == ([2, 0, 1], ["c", "a", "b"])
    with pytest.raises(ValueError, match="characters outside the model's vocabulary: 'xz'"):
        m.tokenize("zax")
    ablated = m.forward(ids, dtype=np.float64, interventions=[ag.models.Ablate("z", 1, heads=[0])]).logits
    assert np.abs(ablated - f.logits).max() > 1e-3
    folder = save_checkpoint(GPT(7, d_model=16, n_blocks=1, n_heads=2, context=12, variant="whitened"),
                             tmp_path / "whitened")
    with pytest.raises(ValueError, match="the 'whitened' arm: the NumPy forward pass runs softmax attention"):
        ag.load_model(folder)


def test_whitened_block_is_the_bridge_module():
    """The GPT's whitened attention sub-layer computes MultiheadSelfAttention(variant="whitened")."""
    from attngeom.torch.nn import MultiheadSelfAttention
    from attngeom.torch.gpt import CausalSelfAttention

    torch.manual_seed(1)
    ours = CausalSelfAttention(8, 2, "whitened").double()
    ref = MultiheadSelfAttention(8, 2, variant="whitened").double()
    with torch.no_grad():
        ours.L0.add_(0.2 * torch.randn(8, 8, dtype=torch.float64))
        ours.M.normal_(0, 0.2)
    ref.load_state_dict(ours.state_dict())
    a = torch.randn(2, 5, 8, dtype=torch.float64)
    base, delta = ours(a)
    torch.testing.assert_close(base + delta, ref(a), rtol=1e-12, atol=1e-12)
    # and the whitened sequence is the recursion of seed eq. 9
    L0, M = torch.tril(ours.L0), ours.M
    w = [torch.linalg.solve_triangular(L0, a[:, 0].T, upper=False).T]
    for i in range(1, 5):
        w.append(torch.linalg.solve_triangular(L0, (a[:, i] - w[-1] @ M.T).T, upper=False).T)
    torch.testing.assert_close(base, torch.stack(w, 1), rtol=1e-10, atol=1e-12)


def test_parameter_counts_match_the_paper():
    # d_model 256, context 256, 93 characters, 2 blocks, 2 heads: 1.62m and 1.88m (seed 004 s.5)
    # (the paper's millions are truncated to two decimals: 1,625,600 -> 1.62m, 1,887,744 -> 1.88m)
    millions = lambda n: math.floor(n / 1e4) / 100  # noqa: E731
    standard = count_parameters(GPT(93, 256, 2, 2, 256, "standard"))
    whitened = count_parameters(GPT(93, 256, 2, 2, 256, "whitened"))
    assert millions(standard) == 1.62 and millions(whitened) == 1.88
    assert whitened - standard == 4 * 256 ** 2  # "four times the squared embedding dimension"
    # the paper widens standard attention to 276 for the equal-capacity arm (1.88m)
    assert millions(count_parameters(GPT(93, 276, 2, 2, 256))) == 1.88


def test_markov_entropy_rate():
    src = MarkovSource.random(5, 2, concentration=0.5, seed=7)
    assert src.transition.shape == (25, 5) and src.stationary.sum() == pytest.approx(1.0)
    text = src.sample(200_000, seed=1)
    ids = np.array([ord(ch) - ord("a") for ch in text])
    state = ids[:-2] * 5 + ids[1:-1]
    empirical = -np.mean(np.log(src.transition[state, ids[2:]]))
    assert empirical == pytest.approx(src.entropy_rate, abs=0.01)
    assert 0 < src.entropy_rate < np.log(5)


def test_corpus_split_and_paths(tmp_path):
    c = CharCorpus.from_text("abcdefghij" * 10)
    assert len(c.train) == 90 and len(c.val) == 10 and c.decode(c.train[:3]) == "abc"
    path = tmp_path / "text.txt"
    path.write_text("héllo wörld\n" * 50, encoding="utf-8")
    c = load_corpus(TrainingConfig(corpus=str(path)))
    assert "ö" in c.vocab and len(c.train) + len(c.val) == 600 and math.isnan(c.entropy_rate)
    with pytest.raises(ValueError, match="corpus"):
        load_corpus(TrainingConfig(corpus=str(tmp_path / "missing.txt")))


def test_config_errors():
    assert parse_arms("standard,whitened_half, projection") == ["standard", "whitened_half", "projection"]
    with pytest.raises(ValueError, match="unknown arm 'softmax'"):
        parse_arms("softmax")
    with pytest.raises(ValueError, match="d_model must be a multiple of 2 \\* n_heads"):
        run_training(TrainingConfig(d_model=18, n_heads=2))
    with pytest.raises(ValueError, match="iterations"):
        run_training(TrainingConfig(iterations=0))
    with pytest.raises(ValueError, match="schedule"):
        run_training(TrainingConfig(schedule="linear"))
    with pytest.raises(ValueError, match="sigma"):
        run_training(TrainingConfig(sigma=0.0))
    assert "training" in EXPERIMENTS


def test_import_attngeom_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, attngeom, attngeom.experiments; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_worse_whitened_arm_reads_as_fully_as_a_better_one(tiny, monkeypatch):
    """The verdict keeps its headline (arm, baseline, losses) whichever way perplexity moves."""
    s = dict(tiny.summary())
    base = tiny.baseline_arm()
    for factor, word in ((1.25, "higher"), (0.8, "lower")):
        s["perplexity_whitened"] = s[f"perplexity_{base}"] * factor
        monkeypatch.setattr(type(tiny), "summary", lambda self, s=dict(s): s)
        line = next(v for v in tiny.verdicts() if v.startswith("- **whitened vs"))
        assert f"- **whitened vs {base}, final loss:**" in line and "nats/char" in line
        assert f"perplexity {abs(100 * (1 - factor)):.1f}% {word} (paper: 19.7% lower" in line
