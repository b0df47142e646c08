"""Direct logit attribution and path patching (attngeom.models.analysis.attribution) on random
checkpoints, NumPy only. The identities: the parts add up to the logit difference (the final
norm is linear once its scale is frozen), each head's part is the sum of its parts over its OV
circuit's directions and over its source tokens. The TransformerLens equalities are in
test_transformer_lens.py."""
import json
import re

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_model

from checkpoints import random_checkpoint

LAYOUTS = ("gpt2", "llama", "mistral", "qwen3")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {layout: load_model(random_checkpoint(layout, tmp_path_factory.mktemp(layout))) for layout in LAYOUTS}


def _ids(seed, n=9):
    return np.random.default_rng(seed).integers(0, 97, n)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_parts_add_up_to_the_logit_difference(models, layout):
    """In float64 the parts, the heads' OV directions and their source tokens add up to rounding
    (measured below 1e-15 of the total; checked at 1e-12)."""
    r = ag.models.logit_attribution(models[layout], _ids(0), 5, 7, by_position=True)
    scale = abs(r.total) + np.abs(r.heads).sum() + np.abs(r.mlp).sum()
    assert abs(r.explained - r.total) <= 1e-12 * scale
    np.testing.assert_allclose(np.nansum(r.directions, axis=-1) + r.outside, r.heads, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(r.by_position.sum(axis=-1), r.heads, rtol=0, atol=1e-12 * scale)
    assert np.abs(r.outside).max() <= 1e-12 * scale  # W_V has full rank: the output lies in the OV row space
    assert np.all(np.diff(r.singular_values, axis=-1)[np.isfinite(np.diff(r.singular_values, axis=-1))] <= 0)
    assert np.abs(r.heads).max() > 1e-3 and (r.pos_embed != 0) == (layout == "gpt2")
    assert 1 <= r.directions_needed(1, 0) <= models[layout].arch.d_head
    single = ag.models.logit_attribution(models[layout], _ids(0), 5, position=3)
    assert single.wrong is None and single.position == 3
    assert abs(single.explained - single.total) <= 1e-12 * (abs(single.total) + np.abs(single.heads).sum() + 1)


def test_results_print_save_and_plot(models, tmp_path):
    model = models["gpt2"]
    r = ag.models.logit_attribution(model, _ids(2), 5, 7)
    assert repr(r).startswith("LogitAttribution(logit[5] - logit[7] at position 8") and "\n" not in repr(r)
    assert r.table()[0]["attribution"] == max((row["attribution"] for row in r.table()), key=abs)
    saved = json.loads(open(r.to_json(tmp_path / "a.json")).read())
    assert saved["total"] == r.total and len(saved["heads"]) == model.n_layers
    assert r.plot() is not None
    p = ag.models.path_patching(model, _ids(2), _ids(3), (0, 1), [(1, 0, "q"), (1, 2, "v")], answers=(5, 7))
    assert repr(p).startswith("PathPatching(L0H1 -> 2 receivers") and "\n" not in repr(p)
    assert [row["input"] for row in p.table()] == ["q", "v"] and p.plot() is not None
    assert json.loads(open(p.to_json(tmp_path / "p.json")).read())["sender"] == [0, 1]


def test_path_patching_identities(models):
    """A corruption that leaves the sender's output as it was changes no path; patching the
    receivers from the clean prompt itself changes nothing (bitwise: the same pass)."""
    model = models["qwen3"]
    clean = _ids(4)
    same = ag.models.path_patching(model, clean, clean, (0, 2), [(1, 1, "k"), (1, 3, "q")], answers=(5, 7))
    assert np.all(same.patched == same.clean) and same.joint == same.clean and same.corrupt == same.clean
    other = ag.models.path_patching(model, clean, _ids(5), (0, 2), [(1, 1, "k"), (1, 3, "q")], answers=(5, 7))
    assert np.abs(other.effect).max() > 1e-3 and np.all(np.isfinite(other.fraction))


def test_bad_input_is_a_one_line_error(models, tmp_path):
    model = models["llama"]
    ids = _ids(6)
    cases = [(lambda: ag.models.logit_attribution(model, ids, 97), "answer: token id 97 is outside the vocabulary (0..96)"),
             (lambda: ag.models.logit_attribution(model, ids, 5, -1), "wrong: token id -1 is outside the vocabulary"),
             (lambda: ag.models.logit_attribution(model, ids, 5, position=9), "position must be an integer in -9..8"),
             (lambda: ag.models.logit_attribution(model, ids[None], 5), "token_ids must be a text or one non-empty"),
             (lambda: ag.models.path_patching(model, ids, ids, (1, 0), [(0, 1, "q")], answers=(5, 7)),
              "receivers[0]: layer 0 is not after the sender's layer 1"),
             (lambda: ag.models.path_patching(model, ids, ids, (0, 0), [(1, 1, "z")], answers=(5, 7)),
              "receivers[0]: the input must be 'q', 'k' or 'v', got 'z'"),
             (lambda: ag.models.path_patching(model, ids, ids, (0, 4), [(1, 1, "q")], answers=(5, 7)),
              "sender head must be an integer in 0..3, got 4"),
             (lambda: ag.models.path_patching(model, ids, ids[:5], (0, 0), [(1, 1, "q")], answers=(5, 7)),
              "clean_ids and corrupt_ids must have one shape"),
             (lambda: ag.models.path_patching(model, ids, ids, (0, 0), [(1, 1, "q")], answers=(5, 100)),
              "answers[1]: token id 100 is outside the vocabulary")]
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)) as info:
            call()
        assert "\n" not in str(info.value)
    bert = load_model(random_checkpoint("bert", tmp_path / "bert"))
    with pytest.raises(ValueError, match="no unembedding"):
        ag.models.logit_attribution(bert, np.arange(4), 1)


def test_plot_head_draws_pattern_entropy_and_spectra(models, tmp_path):
    """plot_head labels every token while that stays legible (spaces drawn visibly), the pattern
    it shows is the forward pass's, and bad heads are one-line errors."""
    from checkpoints import with_tokenizer

    folder = tmp_path / "m"
    random_checkpoint("llama", folder)
    with_tokenizer(folder)
    model = load_model(folder)
    text = "the cat sat on the mat"
    fig = ag.models.plot_head(model, text, 1, 2)
    pattern, entropy, spectra = fig.axes[:3]  # then the colour bar
    ids, tokens = model.tokenize(text)
    assert [t.get_text() for t in pattern.get_xticklabels()] == [ag.plotting.display_token(t) for t in tokens]
    np.testing.assert_array_equal(pattern.images[0].get_array(), model.forward(ids, dtype=np.float64).pattern[1, 2])
    assert entropy.get_ylabel() == "entropy (nats)" and spectra.get_yscale() == "log" and len(spectra.lines) == 2
    long = ag.models.plot_head(models["gpt2"], _ids(0, n=16), 0, 0)
    assert len(long.axes[0].get_xticklabels()) == 16
    for layer, head, message in ((2, 0, "layer must be an integer in 0..1, got 2"),
                                 (0, 4, "head must be an integer in 0..3, got 4")):
        with pytest.raises(ValueError, match=re.escape(message)):
            ag.models.plot_head(model, text, layer, head)
