"""The public API the analyses stand on: Model.run_from (the rest of a pass from a layer's
residual stream), the one way analyses take a model (a Model or a checkpoint path or name),
the circuits' factored SVD, and NonFiniteOperand for NaN / inf inputs. Random NumPy
checkpoints only (tests/checkpoints.py): no torch."""
import inspect

import numpy as np
import pytest

import attngeom as ag
from attngeom.errors import NonFiniteOperand
from attngeom.models import Ablate, load_activations, load_model
from attngeom.models.analysis import effects
from attngeom.models.analysis.prompt import resolve_heads, resolve_model
from checkpoints import RANDOM_VOCAB, random_checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = random_checkpoint("llama", tmp_path_factory.mktemp("llama"))
    return folder, load_model(folder)


def _ids(shape, seed=3):
    return np.random.default_rng(seed).integers(0, RANDOM_VOCAB, size=shape)


# -- Model.run_from ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (2, 7)], ids=["1-D ids", "2-D ids"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_run_from_every_layer_equals_the_forward_bitwise(llama, shape, dtype):
    _, model = llama
    ids = _ids(shape)
    f = model.forward(ids, dtype=dtype, keep=("logits", "resid_pre"))
    for layer in range(model.arch.n_layers):
        g = model.run_from(layer, f.resid_pre[layer], ids, dtype=dtype)
        assert g.logits.shape == f.logits.shape and g.logits.dtype == f.logits.dtype
        assert np.array_equal(g.logits, f.logits), f"layer {layer}"


def _one_line(excinfo, argument):
    message = str(excinfo.value)
    assert "\n" not in message and argument in message, message


def test_run_from_refuses_bad_arguments_in_one_line_naming_them(llama):
    _, model = llama
    ids = _ids((2, 7))
    h = model.forward(ids, keep=("resid_pre",)).resid_pre
    L = model.arch.n_layers
    for layer in (L, -1, 1.0, True):
        with pytest.raises(ValueError, match="^layer must be an integer") as e:
            model.run_from(layer, h[0], ids)
        _one_line(e, "layer")
    for bad in (h[0, :1], h[0][..., :-1], h[0][None]):
        with pytest.raises(ValueError, match="^residual must have shape") as e:
            model.run_from(0, bad, ids)
        _one_line(e, "residual")
    for value in (np.nan, np.inf):
        r = h[1].copy()
        r[1, 2, 3] = value
        with pytest.raises(NonFiniteOperand) as e:
            model.run_from(1, r, ids)
        _one_line(e, "residual")
    with pytest.raises(ValueError, match="^interventions:") as e:
        model.run_from(1, h[1], ids, interventions=[Ablate("z", 0, heads=[0])])
    _one_line(e, "interventions")
    with pytest.raises(ValueError, match="^layers:") as e:
        model.run_from(1, h[1], ids, layers=[0, 1])
    _one_line(e, "layers")


# -- one way to take a model -------------------------------------------------------------------
def _analyses():
    """The public functions of attngeom.models that come from analysis modules and take a
    model (a parameter named model, heads or checkpoint)."""
    out = {}
    for name in ag.models.__all__:
        f = getattr(ag.models, name)
        if inspect.isfunction(f) and f.__module__.startswith("attngeom.models.analysis"):
            first = next(iter(inspect.signature(f).parameters), None)
            if first in ("model", "heads", "checkpoint"):
                out[name] = (f, first)
    return out


def test_every_analysis_documents_a_model_or_a_checkpoint():
    found = _analyses()
    assert {"logit_lens", "head_ablation_effects", "direction_effects", "activation_patching", "head_invariances",
            "causal_effects", "head_report", "weight_spectra", "text_activations", "token_strings"} <= set(found)
    for name, (f, first) in found.items():
        doc = inspect.getdoc(f)
        line = next(l for l in doc.splitlines() if l.startswith(f"{first} : "))
        assert "Model" in line and "str or path-like" in line, f"{name}: {line}"


@pytest.mark.parametrize("call", [
    lambda m: ag.models.head_ablation_effects(m, [1, 2, 3]),
    lambda m: ag.models.direction_effects(m, [1, 2, 3], 0, 0),
    lambda m: ag.models.activation_patching(m, [1, 2, 3], [1, 2, 4]),
    lambda m: ag.models.head_invariances(m, [1, 2, 3], 0, 0),
    lambda m: ag.models.causal_effects(m, [1, 2, 3]),
    lambda m: ag.models.logit_lens(m, [1, 2, 3]),
    lambda m: ag.models.token_strings(m, [1, 2]),
    lambda m: ag.models.weight_spectra(m),
    lambda m: ag.models.head_report(m),
], ids=["head_ablation_effects", "direction_effects", "activation_patching", "head_invariances", "causal_effects",
        "logit_lens", "token_strings", "weight_spectra", "head_report"])
def test_analyses_refuse_what_is_not_a_model_naming_it(call):
    with pytest.raises(TypeError, match="^model must be an attngeom.models"):
        call(3)


def test_analyses_take_a_checkpoint_path_as_they_take_the_model(llama):
    folder, model = llama
    ids = _ids((2, 6))
    a = ag.models.head_ablation_effects(model, ids, dtype=np.float64)
    b = ag.models.head_ablation_effects(folder, ids, dtype=np.float64)
    np.testing.assert_array_equal(a.effects, b.effects)
    a = ag.models.direction_effects(model, ids, 1, 2, dtype=np.float64)
    b = ag.models.direction_effects(folder, ids, 1, 2, dtype=np.float64)
    np.testing.assert_array_equal(a.kept, b.kept)
    clean, corrupt = ids[:1], ids[1:]
    a = ag.models.activation_patching(model, clean, corrupt, metric="loss", layers=[1], dtype=np.float64)
    b = ag.models.activation_patching(folder, clean, corrupt, metric="loss", layers=[1], dtype=np.float64)
    np.testing.assert_array_equal(a.restored, b.restored)
    a = ag.models.head_invariances(model, ids, 0, 1)
    b = ag.models.head_invariances(folder, ids, 0, 1)
    assert [r["check"] for r in a] == [r["check"] for r in b]
    np.testing.assert_array_equal([r["measured"] for r in a], [r["measured"] for r in b])
    r1, r2, r3 = (ag.models.head_report(m).table() for m in (model, folder, model.heads))
    assert r1 == r2 == r3
    assert resolve_model(model) is model and resolve_heads(model) is model.heads
    assert resolve_heads(model.heads) is model.heads
    with pytest.raises(ValueError, match="^model: cannot load"):
        resolve_model(folder + "-missing")


def test_text_activations_take_a_model_for_the_checkpoint(tmp_path):
    from checkpoints import with_tokenizer

    folder = random_checkpoint("llama", tmp_path)
    with_tokenizer(tmp_path)
    model = load_model(folder)
    x, tokens = ag.models.text_activations(folder, "the cat sat")
    y, same = ag.models.text_activations(model, "the cat sat")
    z, _ = ag.models.text_activations(folder, "the cat sat", model=folder)
    assert tokens == same and x.shape == (2, 1, 3, 32)
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(x, z)
    with pytest.raises(ValueError, match="^model: checkpoint is already a Model"):
        ag.models.text_activations(model, "the cat", model=model)


# -- the circuits' factored SVD ----------------------------------------------------------------
def _dense_circuit_maps(A, B):
    """_circuit_maps as it was: the dense SVD of the d x d product."""
    _, s, vt = np.linalg.svd(A @ B)
    r = int(np.count_nonzero(s > max(A.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0)))
    v = vt[:r].T
    return s[:r], B @ v, np.linalg.pinv(B).T @ v


@pytest.mark.parametrize("rank", [4, 2])
def test_circuit_maps_from_the_factors_equal_the_dense_svd(rank):
    rng = np.random.default_rng(rank)
    A = rng.standard_normal((16, 4)) @ np.diag([1.0] * rank + [0.0] * (4 - rank)) @ rng.standard_normal((4, 4))
    B = rng.standard_normal((4, 16))
    s, a, c = effects._circuit_maps(A, B)
    s0, a0, c0 = _dense_circuit_maps(A, B)
    assert s.size == s0.size == rank
    np.testing.assert_allclose(s, s0, rtol=1e-12)
    for i in range(rank):  # each direction's map z -> z a_i c_i^T (the singular vector's sign cancels)
        np.testing.assert_allclose(np.outer(a[:, i], c[:, i]), np.outer(a0[:, i], c0[:, i]), atol=1e-12)


def test_direction_effects_equal_the_dense_svd_maps(llama, monkeypatch):
    _, model = llama
    ids = _ids((2, 6))
    d = ag.models.direction_effects(model, ids, 1, 3, dtype=np.float64)
    monkeypatch.setattr(effects, "_circuit_maps", _dense_circuit_maps)
    dense = ag.models.direction_effects(model, ids, 1, 3, dtype=np.float64)
    np.testing.assert_allclose(d.singular_values, dense.singular_values, rtol=1e-12)
    np.testing.assert_allclose(d.removed, dense.removed, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(d.kept, dense.kept, rtol=1e-9, atol=1e-12)


# -- NaN and infinity --------------------------------------------------------------------------
def test_non_finite_activations_raise_non_finite_operand(llama, tmp_path):
    _, model = llama
    heads = model.heads
    x = np.random.default_rng(0).standard_normal((heads.n_layers, 5, heads.d_model))
    for value in (np.nan, -np.inf):
        bad = x.copy()
        bad[1, 2, 3] = value
        with pytest.raises(NonFiniteOperand, match="^x holds non-finite values$"):
            ag.models.head_report(heads, bad)
        with pytest.raises(NonFiniteOperand, match=r"^x holds non-finite values \(text 1\)$"):
            ag.models.head_report(heads, [x, bad])
        np.save(tmp_path / "activations.npy", bad)
        with pytest.raises(NonFiniteOperand, match="^activations contains NaN or infinite values$"):
            load_activations(tmp_path, heads.n_layers, heads.d_model)


@pytest.mark.parametrize("analysis", ["head_ablation_effects", "direction_effects", "activation_patching"])
def test_logit_diff_answers_are_token_ids_of_the_vocabulary(llama, analysis):
    """answers = (right, wrong): integers in 0..V-1, one or one per sequence; a negative id
    (NumPy would wrap it), a float (it would be truncated), a bool, an id past the vocabulary
    or one per sequence of the wrong count is refused, naming the argument."""
    _, model = llama
    V = model.arch.vocab_size
    ids = _ids((2, 6))
    calls = {"head_ablation_effects": lambda a: ag.models.head_ablation_effects(model, ids, metric="logit_diff",
                                                                                answers=a, layers=[0]),
             "direction_effects": lambda a: ag.models.direction_effects(model, ids, 0, 0, metric="logit_diff", answers=a),
             "activation_patching": lambda a: ag.models.activation_patching(model, ids[:1], ids[1:], metric="logit_diff",
                                                                            answers=a, layers=[0])}
    call = calls[analysis]
    call((1, 2))
    call(([1] if analysis == "activation_patching" else [1, 3], 2))  # one id per sequence
    for bad, says in [((-1, 2), r"answers\[0\] \(right\) must lie in 0\.\.%d" % (V - 1)),
                      ((1, V), r"answers\[1\] \(wrong\) must lie in 0\.\.%d" % (V - 1)),
                      ((3.7, 2), r"answers\[0\] \(right\) must be token ids \(integers\)"),
                      ((True, 2), r"answers\[0\] \(right\) must be token ids"),
                      (([1, 2, 3], 2), r"answers\[0\] \(right\) must be one token id or one per sequence")]:
        if analysis == "activation_patching" and isinstance(bad[0], list):
            bad = ([1, 2], 2)  # one sequence: two ids are one too many
        with pytest.raises(ValueError, match=says):
            call(bad)


def test_next_token_losses_refuse_ids_outside_the_logits_vocabulary():
    z = np.zeros((1, 3, 4))
    for bad, says in [([[0, 1, -1]], r"token_ids must lie in 0\.\.3 \(the logits' vocabulary\), got -1\.\.1"),
                      ([[0, 1, 4]], r"token_ids must lie in 0\.\.3"), ([[0.0, 1.0, 2.0]], "token_ids must be integers")]:
        with pytest.raises(ValueError, match=says):
            ag.models.next_token_losses(z, bad)
