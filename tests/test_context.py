"""Texts longer than the model's length and sequences past its trained context are never
analysed silently: a truncated text is a ContextWarning naming the model's length and the
tokens analysed, a sequence past a rotary model's trained context (config.json's
max_position_embeddings) runs with a ContextWarning naming it, and a sequence beyond a
position table stays an error. The command line prints each warning as one line."""
import json
import os
import warnings

import numpy as np
import pytest

import attngeom as ag
from attngeom import cli
from attngeom.errors import ContextWarning
from attngeom.models import load_model, text_activations
from checkpoints import bert_checkpoint, random_checkpoint, with_tokenizer

WORDS = "the cat sat on the mat and the dog ran . "  # 11 tokens of with_tokenizer's vocabulary


def _no_context_warning(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextWarning)
        return fn(*args, **kw)


def test_rotary_model_past_its_trained_context_warns(tmp_path):
    folder = random_checkpoint("llama", tmp_path / "m")  # max_position_embeddings 64, rotary
    model = load_model(folder)
    assert model.max_length is None and model.context_length == 64
    _no_context_warning(model.forward, np.arange(64) % 90)
    with pytest.warns(ContextWarning, match=r"token_ids has 100 tokens, past the 64-token context this llama model "
                                            r"was trained on \(config.json max_position_embeddings\): all 100"):
        f = model.forward(np.arange(100) % 90)
    assert f.logits.shape[0] == 100  # analysed whole


def test_text_past_the_trained_context_warns_once(tmp_path):
    folder = random_checkpoint("llama", tmp_path / "m")
    with_tokenizer(tmp_path / "m")
    x, tokens = _no_context_warning(text_activations, folder, WORDS * 5)  # 55 tokens
    assert len(tokens) == 55
    with pytest.warns(ContextWarning) as record:
        x, tokens = text_activations(folder, WORDS * 10)
    assert len(record) == 1 and "the text has 110 tokens, past the 64-token context" in str(record[0].message)
    assert len(tokens) == 110 and x.shape[2] == 110
    _no_context_warning(text_activations, folder, WORDS * 10, max_length=64)  # truncation asked for: no warning


def test_position_table_truncates_with_a_warning_and_refuses_longer_ids(tmp_path):
    folder = random_checkpoint("gpt2", tmp_path / "g")  # n_positions 16
    with_tokenizer(tmp_path / "g")
    with pytest.warns(ContextWarning, match=r"the text has 22 tokens and the gpt2 model's position table 16 "
                                            r"positions: analysed its first 16 tokens"):
        x, tokens = text_activations(folder, WORDS * 2)
    assert len(tokens) == 16
    with pytest.raises(ValueError, match="more than the 16 positions of the model's position table"):
        load_model(folder).forward(np.arange(20))


def _bert_with_sentence_length(folder, rng, length):
    bert_checkpoint(folder, rng, max_pos=16)
    with open(os.path.join(folder, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": length}, f)
    return str(folder)


def test_bert_truncation_names_both_lengths(tmp_path, rng):
    folder = _bert_with_sentence_length(tmp_path / "b", rng, 8)
    text = "the cat sat on the mat . " * 3  # 21 tokens with [CLS] and [SEP]
    with pytest.warns(ContextWarning, match=r"the text has 23 tokens: analysed its first 8 \(\[CLS\] \.\.\. "
                                            r"\[SEP\]\), truncated to the model's max_seq_length, 8 .*position "
                                            r"table holds 16: max_length up to 16"):
        x, tokens = text_activations(folder, text)
    assert len(tokens) == 8 and tokens[-1] == "[SEP]"
    x, tokens = _no_context_warning(text_activations, folder, text, max_length=12)  # asked for
    assert len(tokens) == 12
    with pytest.warns(ContextWarning, match="truncated to the 16 positions of the model's position table"):
        x, tokens = text_activations(folder, text, max_length=40)
    assert len(tokens) == 16


def test_cli_prints_each_warning_as_one_line(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    folder = _bert_with_sentence_length(tmp_path / "b", rng, 8)
    (tmp_path / "t.txt").write_text("the cat sat on the mat . " * 3)
    assert cli.main(["heads", folder, "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines == [lines[0]] and lines[0].startswith("attngeom heads: warning: the text has 23 tokens: analysed "
                                                       "its first 8") and "16" in lines[0]
    assert "warnings.warn" not in err and "ContextWarning" not in err  # no source line, no class name
    assert "text (8 tokens" in out

    llama = random_checkpoint("llama", tmp_path / "m")
    with_tokenizer(tmp_path / "m")
    (tmp_path / "long.txt").write_text(WORDS * 10)
    assert cli.main(["heads", llama, "--text", str(tmp_path / "long.txt"), "--out", str(tmp_path / "r2")]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [err.strip()] and "110 tokens, past the 64-token context" in err
    assert "text (110 tokens" in out


def test_attngeom_gpt_checkpoints_carry_their_trained_context(tmp_path):
    torch = pytest.importorskip("torch")
    from attngeom.torch.gpt import GPT, save_checkpoint

    torch.manual_seed(0)
    folder = save_checkpoint(GPT(7, d_model=16, n_blocks=1, n_heads=2, context=12).eval(), tmp_path / "g",
                             vocab="abcdefg")
    assert json.load(open(os.path.join(folder, "config.json")))["max_position_embeddings"] == 12
    model = ag.load_model(folder)
    assert model.max_length is None and model.context_length == 12
    with pytest.warns(ContextWarning, match="the text has 30 tokens, past the 12-token context this attngeom-gpt"):
        x, tokens = text_activations(model, "abcdefg" * 4 + "ab")
    assert len(tokens) == 30
