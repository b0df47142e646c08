"""The BERT forward pass against plain per-head loops, its GELU, the WordPiece tokenizer and
text activations; other architectures that share BERT's tensor names are refused."""
import json
import math
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.activation_functions import gelu
from attngeom.models import BertEncoder, load_activations, text_activations, tokenize
from attngeom.models.io.tokenizer import WordPiece
from checkpoints import CONFIGS, VOCAB, bert_checkpoint, model_attention, raw_model, write_model


def bert_reference(t, ids, L, H):
    """Plain per-head loops, the erf GELU from math, the layer norm written out."""
    g = lambda k: t["bert." + k].astype(np.float64)  # noqa: E731

    def ln(x, w, b):
        m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * w + b

    n = len(ids)
    h = ln(g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[:n]
           + g("embeddings.token_type_embeddings.weight")[0], g("embeddings.LayerNorm.weight"),
           g("embeddings.LayerNorm.bias"))
    states = [h]
    for i in range(L):
        a = f"encoder.layer.{i}."
        att = model_attention("bert", {k[5:]: v.astype(np.float64) for k, v in t.items()}, i, h, H)
        h1 = ln(h + att, g(a + "attention.output.LayerNorm.weight"), g(a + "attention.output.LayerNorm.bias"))
        pre = h1 @ g(a + "intermediate.dense.weight").T + g(a + "intermediate.dense.bias")
        act = pre * 0.5 * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
        h = ln(h1 + act @ g(a + "output.dense.weight").T + g(a + "output.dense.bias"),
               g(a + "output.LayerNorm.weight"), g(a + "output.LayerNorm.bias"))
        states.append(h)
    return np.stack(states)


def test_gelu():
    x = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(gelu(x), [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x], rtol=1e-14)
    assert gelu(np.ones(2, np.float32)).dtype == np.float32


def test_bert_forward(tmp_path, rng):
    t = bert_checkpoint(tmp_path / "b", rng)
    enc = BertEncoder.from_checkpoint(tmp_path / "b")
    ids = np.array([2, 4, 5, 6, 7, 4, 8, 9, 3])
    out = enc.forward(ids)
    ref = bert_reference(t, ids, 2, 2)
    assert out.hidden_states.shape == (3, 9, 8) and out.routing.shape == (2, 2, 9, 9)
    np.testing.assert_allclose(out.hidden_states, ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.routing.sum(-1), 1, rtol=1e-12)
    e = enc.sentence_embedding(ids)
    np.testing.assert_allclose(e, ref[-1].mean(0) / np.linalg.norm(ref[-1].mean(0)), rtol=1e-10)
    with pytest.raises(ValueError, match="input_ids must lie in 0..17"):
        enc.forward(np.array([2, 40]))
    with pytest.raises(ValueError, match="more than the model's 16 positions"):
        enc.forward(np.full(17, 4))
    with pytest.raises(ValueError, match="non-empty 1-D integer"):
        enc.forward(np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="token_type_ids must have shape"):
        enc.forward(ids, token_type_ids=np.zeros(3, int))
    del t["bert.encoder.layer.1.output.dense.bias"]
    write_model(tmp_path / "c", t)
    with pytest.raises(ValueError, match="needs tensor 'bert.encoder.layer.1.output.dense.bias'"):
        BertEncoder.from_checkpoint(tmp_path / "c", n_heads=2)


def test_wordpiece(tmp_path):
    wp = WordPiece(VOCAB)
    ids, toks = wp.encode("The cat, unbelievable!  Cafés\tsat")
    assert toks == ["[CLS]", "the", "cat", ",", "un", "##believ", "##able", "!", "cafe", "##s", "sat", "[SEP]"]
    assert ids == [VOCAB.index(x) for x in toks]
    assert wp.encode("dog")[1] == ["[CLS]", "[UNK]", "[SEP]"]
    assert wp.encode("the cat sat on the mat", max_length=4)[1] == ["[CLS]", "the", "cat", "[SEP]"]
    with pytest.raises(ValueError, match="vocab must contain \\[CLS\\]"):
        WordPiece(["a"])
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB))
    assert tokenize(tmp_path, "the mat.", backend="wordpiece")[1] == ["[CLS]", "the", "mat", ".", "[SEP]"]
    with pytest.raises(ValueError, match="backend must be"):
        tokenize(tmp_path, "x", backend="bpe")
    with pytest.raises(ValueError, match="neither tokenizer.json"):
        tokenize(tmp_path / "nowhere", "x")


def test_activations(tmp_path, rng):
    t = bert_checkpoint(tmp_path / "b", rng)
    x, tokens = text_activations(tmp_path / "b", "The cat sat on the mat.")
    assert tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert x.shape == (2, 1, 9, 8)
    np.testing.assert_allclose(x[:, 0], bert_reference(t, [VOCAB.index(s) for s in tokens], 2, 2)[:-1], rtol=1e-10)
    x2, tokens2 = text_activations(tmp_path / "b", "the cat sat on the mat " * 10)
    assert len(tokens2) == 16 and x2.shape[2] == 16  # truncated to the positions
    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 1, 2, 8, 4), CONFIGS["gpt2"](1, 2, 8, 2))
    # decoders run Model.forward (tests/test_decoders.py), which needs the model type and every tensor
    with pytest.raises(ValueError, match="model_type None is not supported; supported model types: bert, gpt2"):
        text_activations(g, "the cat")
    json.dump({**CONFIGS["gpt2"](1, 2, 8, 2), "model_type": "gpt2", "vocab_size": 10}, open(os.path.join(g, "config.json"), "w"))
    with pytest.raises(ValueError, match="gpt2 checkpoint .* lacks tensor 'wte.weight'"):
        text_activations(g, "the cat")

    acts = tmp_path / "acts"
    os.makedirs(acts)
    for i in range(2):
        np.save(acts / f"layer_{i}.npy", rng.standard_normal((3, 5, 8)))
    a = load_activations(acts, 2, 8)
    assert a.shape == (2, 3, 5, 8)
    np.testing.assert_array_equal(a[1], np.load(acts / "layer_1.npy"))
    with pytest.raises(ValueError, match="missing layers \\[2\\]"):
        load_activations(acts, 3, 8)
    with pytest.raises(ValueError, match="shape \\(2, n_seq, n, 7\\)"):
        load_activations(acts, 2, 7)
    np.save(acts / "activations.npy", np.full((2, 5, 8), np.nan))
    with pytest.raises(ValueError, match="NaN"):
        load_activations(acts, 2, 8)
    np.save(acts / "activations.npy", rng.standard_normal((2, 5, 8)))
    assert load_activations(acts, 2, 8).shape == (2, 1, 5, 8)
    with pytest.raises(ValueError, match="must be a folder"):
        load_activations(acts / "activations.npy", 2, 8)


def test_forward_pass_refuses_other_architectures(tmp_path, rng):
    """RoBERTa shares BERT's tensor names but offsets positions; a ReLU BERT differs too."""
    bert_checkpoint(tmp_path / "b", rng)
    cfg_path = tmp_path / "b" / "config.json"
    cfg = json.load(open(cfg_path))
    for key, value in [("model_type", "roberta"), ("hidden_act", "relu"), ("position_embedding_type", "relative_key")]:
        json.dump({**cfg, key: value}, open(cfg_path, "w"))
        with pytest.raises(ValueError, match=key):
            BertEncoder.from_checkpoint(tmp_path / "b")
        if key == "position_embedding_type":  # load_model refuses it too (roberta is an unknown model type there)
            json.dump({**cfg, "model_type": "bert", "vocab_size": len(VOCAB), key: value}, open(cfg_path, "w"))
            with pytest.raises(ValueError, match="position_embedding_type 'relative_key' is not supported"):
                ag.load_model(tmp_path / "b")
    json.dump(cfg, open(cfg_path, "w"))
    assert BertEncoder.from_checkpoint(tmp_path / "b").heads.n_layers == 2
