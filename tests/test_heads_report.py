"""Diagnostics on a model's heads and the head report: figures, several texts, inputs, the
data frame, and how texts are split."""
import json
import os
import sys
import types

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import head_report
from checkpoints import CONFIGS, raw_model, write_model


def test_model_diagnostics(tmp_path, rng):
    t = raw_model("gpt2", rng, 2, 3, 12, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t, CONFIGS["gpt2"](2, 3, 12, 3)))
    d = H.diagnostics()
    ref = ag.head_diagnostics(H.W_Q, H.W_K, H.W_V, H.W_O)
    assert d.batch_shape == (2, 3) and d.routing_rank is None
    np.testing.assert_allclose(d.bilinear_effective_rank, ref.bilinear_effective_rank)
    x = rng.standard_normal((2, 2, 7, 12))  # (n_layers, n_seq, n, d_model)
    d = H.diagnostics(x)
    q, k = H.queries_keys(x[1], 1)  # biases included: (n_seq, n_heads, n, d_head)
    tau = np.linalg.norm(q[:, 2], axis=-1) / 2.0
    np.testing.assert_allclose(d.radius_mean[1, 2], tau.mean(), rtol=1e-12)
    P = ag.softmax_attention(q[0, 2], k[0, 2], None, causal=True, return_routing=True)[1]
    np.testing.assert_allclose(d.routing_singular_values[1, 2, 0], np.linalg.svd(P, compute_uv=False), rtol=1e-9)
    raw = H.diagnostics(x, bias=False)
    assert not np.allclose(raw.radius_mean, d.radius_mean)
    with pytest.raises(ValueError, match="x must have shape \\(2, n, 12\\)"):
        H.diagnostics(np.ones((3, 7, 12)))
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        H.queries_keys(x[0], 2)


def test_report_and_figures(tmp_path, rng):
    pytest.importorskip("matplotlib")
    t = raw_model("llama", rng, 2, 4, 16, 4, 2, "model.")
    folder = write_model(tmp_path / "m", t, CONFIGS["llama"](2, 4, 16, 2))
    r = head_report(folder)
    rows = r.table()
    assert len(rows) == 8 and rows[5]["layer"] == 1 and rows[5]["head"] == 1
    s = r.diagnostics.nulls.singular_values[1, 1]
    e = np.cumsum(np.sort(s)[::-1] ** 2) / np.sum(s ** 2)
    assert rows[5]["bilinear_k90"] == int(np.searchsorted(e, 0.9 - 1e-12) + 1)
    assert r.grid("ov_effective_rank").shape == (2, 4)
    with pytest.raises(ValueError, match="metric must be one of"):
        r.grid("nope")
    paths = r.save(tmp_path / "out")
    assert {os.path.basename(p) for p in paths} >= {"heads.json", "layer_head_grids.png", "cross_layer.png",
                                                    "summary.md", "report.html"}
    assert all(os.path.getsize(p) > 0 for p in paths)
    data = json.load(open(tmp_path / "out" / "heads.json"))
    assert data["summary"]["layout"] == "llama" and len(data["heads"]) == 8
    x = rng.standard_normal((2, 6, 16))
    r = head_report(ag.load_heads(folder), x, tokens=list("abcdef"), chosen=[(1, 3)])
    assert set(r.routing) == {(1, 3)} and np.allclose(r.routing[1, 3].sum(-1), 1)
    assert np.allclose(np.triu(r.routing[1, 3], 1), 0)  # causal
    assert "attention_L1_H3.png" in r.figures() and r.summary()["n_tokens"] == 6
    with pytest.raises(ValueError, match="outside 2 layers x 4 heads"):
        head_report(folder, chosen=[(2, 0)])
    with pytest.raises(ValueError, match="tokens must have 6"):
        head_report(folder, x, tokens=["a"])


def test_report_over_several_texts(tmp_path, rng):
    """Known answers: the data fields of several texts are the mean and spread of the one-text
    reports; the entropy is that of the saved attention matrices; every file is written."""
    pytest.importorskip("matplotlib")
    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t), n_heads=2)
    xs = [rng.standard_normal((2, n, 8)) for n in (5, 7, 4)]
    toks = [[f"w{i}" for i in range(x.shape[1])] for x in xs]
    r = head_report(H, xs, tokens=toks, chosen=[(1, 0)])
    singles = [head_report(H, x, tokens=tk, chosen=[(1, 0)]) for x, tk in zip(xs, toks)]
    assert r.n_texts == 3 and r.summary()["n_tokens"] == 16 and r.summary()["text_lengths"] == [5, 7, 4]
    for key in ("routing_effective_rank_mean", "tilt_effective_dim", "radius_mean", "attention_entropy"):
        per_text = np.stack([s.grid(key) for s in singles])
        np.testing.assert_allclose(r.grid(key), per_text.mean(0), atol=1e-12)
        np.testing.assert_allclose(r.grid(key + "_spread"), per_text.std(0), atol=1e-12)
    np.testing.assert_allclose(r.grid("bilinear_effective_rank"), singles[0].grid("bilinear_effective_rank"))
    # the entropy is that of the routing matrices themselves (causal: row i has i + 1 keys)
    P = r.text_routing[1]
    assert P.shape == (2, 2, 7, 7) and np.allclose(np.triu(P[0, 0], 1), 0) and np.allclose(P.sum(-1), 1, atol=1e-6)
    ent = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), -1).mean(-1)
    np.testing.assert_allclose(singles[1].grid("attention_entropy"), ent, atol=1e-5)
    # planted uniform rows: identical tokens give equal logits, so causal row i has entropy log(i + 1)
    same = np.repeat(rng.standard_normal((2, 1, 8)), 6, axis=1)
    np.testing.assert_allclose(head_report(H, same).grid("attention_entropy"), np.mean(np.log(np.arange(1, 7))),
                               atol=1e-9)
    assert r.queries[1, 0].shape == (16, 4)
    rows = r.layer_means()
    assert len(rows) == 2 and rows[1]["attention_entropy"] == pytest.approx(r.grid("attention_entropy")[1].mean())

    paths = {os.path.basename(p) for p in r.save(tmp_path / "out")}
    assert {"heads.json", "attention.npz", "cross_layer.png", "layer_head_grids.png", "spectra_L1_H0.png",
            "attention_L1_H0.png", "laplace_radon_L1_H0.png", "summary.md", "report.html"} <= paths
    data = json.load(open(tmp_path / "out" / "heads.json"))
    assert data["tokens"] == toks and set(data["fields"]) == set(data["heads"][0])
    assert all(data["fields"].values()) and "standard deviation over the 3 texts" in data["fields"]["radius_mean_spread"]
    with np.load(tmp_path / "out" / "attention.npz") as z:
        assert z["tokens_2"].tolist() == toks[2] and z["attention_0"].shape == (2, 2, 5, 5)
        np.testing.assert_allclose(z["attention_0"][1, 0], r.routing[1, 0], atol=1e-6)
    md = open(tmp_path / "out" / "summary.md").read()
    assert "## Per layer: mean over heads" in md and "| layer | bilinear_effective_rank |" in md
    page = open(tmp_path / "out" / "report.html").read()
    assert page.count("data:image/png;base64,") == len([p for p in paths if p.endswith(".png")])
    assert "<script>" in page and "http" not in page and "w6" in page and "<th title=" in page


def test_report_says_one_thing_once(tmp_path, rng):
    """The report's title names the model; a field equal for every head is stated once above
    the heads table, not as a column; the detail figure's tilt number has its own name (it is
    not the table's tilt_effective_dim); the console table prints every field's full name."""
    pytest.importorskip("matplotlib")
    from attngeom.cli import layer_table
    from attngeom.models import model_name
    from attngeom.models.analysis.report import constant_fields

    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "gpt2-tiny" / "model", t), n_heads=2)
    assert H.summary()["name"] == "gpt2-tiny/model"  # a folder called "model" gets its parent's name
    xs = [rng.standard_normal((2, n, 8)) for n in (5, 7)]
    r = head_report(H, xs, chosen=[(1, 0)])
    rows = r.table()
    constant = constant_fields(rows)
    assert constant and all(all(row[k] == v for row in rows) for k, v in constant.items())
    assert "bilinear_effective_rank" not in constant  # it varies between heads
    r.save(tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h1>attngeom heads: gpt2-tiny/model</h1>" in page
    assert "The same for every head: " in page
    heads_table = page.split("<h2>Heads</h2>")[1].split("</table>")[0]
    for key in constant:
        assert f">{key}</th>" not in heads_table and f">{key} " in page
    assert "# Heads report: gpt2-tiny/model" in (tmp_path / "out" / "summary.md").read_text()
    titles = [ax.get_title() for ax in r.plot_laplace_radon(1, 0).axes]
    assert any("centred Cov(u), tokens pooled: participation" in t for t in titles)
    assert not any("dim" in t and "eff" in t for t in titles)
    assert "detail figures' 'centred Cov(u), tokens pooled' is another quantity" in r.fields()["tilt_effective_dim"]
    text = layer_table(r.layer_means())
    assert all(key in text for key in r.layer_means()[0])  # full names, never cut to a column
    assert len(layer_table([{"layer": i, "x": 1.0} for i in range(30)]).splitlines()) == 1 + 3 * 2
    assert model_name(tmp_path / "runs" / "abc123" / "checkpoint") == "abc123/checkpoint"


def test_report_inputs_and_dataframe(tmp_path, rng, monkeypatch):
    t = raw_model("gpt2", rng, 2, 2, 8, 4)
    H = ag.load_heads(write_model(tmp_path / "m", t), n_heads=2)
    x4 = rng.standard_normal((2, 3, 5, 8))  # three sequences of one length are three texts
    r = head_report(H, x4)
    assert r.n_texts == 3 and r.tokens is None and "attention_entropy_spread" in r.table()[0]
    one = head_report(H, x4[:, 0])
    assert one.n_texts == 1 and "attention_entropy_spread" not in one.table()[0]
    with pytest.raises(ValueError, match="x must have shape"):
        head_report(H, [x4[:, 0], x4[0]])
    with pytest.raises(ValueError, match="tokens must have one list per text"):
        head_report(H, [x4[:, 0], x4[:, 1]], tokens=[list("abcde")])
    with pytest.raises(TypeError, match="tokens must be a list"):
        head_report(H, x4[:, 0], tokens="abcde")
    with pytest.raises(ValueError, match="tokens need activations"):
        head_report(H, tokens=["a"])
    with pytest.raises(ValueError, match="x holds non-finite"):
        head_report(H, np.full((2, 5, 8), np.nan))
    other = next((l, h) for l in range(2) for h in range(2) if (l, h) not in r.chosen)
    with pytest.raises(ValueError, match="must be a chosen head"):
        r.plot_laplace_radon(*other)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_dataframe needs pandas"):
        r.to_dataframe()
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: rows
    monkeypatch.setitem(sys.modules, "pandas", fake)
    assert r.to_dataframe() == r.table()


def test_split_texts():
    from attngeom.models import split_texts
    assert split_texts("one\ntext\n") == ["one text"]
    assert split_texts("a\r\n\r\nb\n \t\nc\n\n\n") == ["a", "b", "c"]
    assert split_texts("\n\n") == []
    with pytest.raises(TypeError, match="text must be a str"):
        split_texts(b"bytes")
    # one text per line: the other unit, same stripping and dropping of empty lines
    assert split_texts("one\ntext\n", by="line") == ["one", "text"]
    assert split_texts("a\r\n\r\n b \n \t\nc\n\n\n", by="line") == ["a", "b", "c"]
    assert split_texts("\n \n", by="line") == []
    with pytest.raises(ValueError, match="by must be 'paragraph' or 'line'"):
        split_texts("a", by="sentence")
