"""``attngeom heads`` on synthetic checkpoints: reports, several texts, hostile checkpoints,
the output folder, and the one rule by which heads and corpus read text files."""
import json
import os

import numpy as np
import pytest

from attngeom import cli
from checkpoints import bert_checkpoint, raw_file, raw_model, write_model


def test_cli_heads(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "text.txt").write_text("The cat sat on the mat.")
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "text.txt"), "--heads", "1.0",
                     "--out", str(tmp_path / "r1")]) == 0
    assert "bert model, 2 layers x 2 heads" in capsys.readouterr().out
    assert {"heads.json", "layer_head_grids.png", "spectra_L1_H0.png", "attention_L1_H0.png",
            "laplace_radon_L1_H0.png", "attention.npz", "report.html"} <= set(
        os.listdir(tmp_path / "r1"))
    rows = json.load(open(tmp_path / "r1" / "heads.json"))["heads"]
    assert len(rows) == 4 and "routing_effective_rank_mean" in rows[0]

    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 2, 2, 8, 4))
    os.makedirs(tmp_path / "acts")
    np.save(tmp_path / "acts" / "activations.npy", rng.standard_normal((2, 2, 5, 8)))
    assert cli.main(["heads", os.path.join(g, "model.safetensors"), "--n-heads", "2", "--activations",
                     str(tmp_path / "acts"), "--out", str(tmp_path / "r2")]) == 0
    assert json.load(open(tmp_path / "r2" / "heads.json"))["summary"]["causal"] is True
    assert cli.main(["heads", g, "--out", str(tmp_path / "r3")]) == 2
    assert "n_heads is required" in capsys.readouterr().err
    assert cli.main(["heads", g, "--n-heads", "2", "--heads", "x", "--out", str(tmp_path / "r4")]) == 2
    assert "--heads expects layer.head pairs" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r3") and not os.path.exists(tmp_path / "r4")


def test_cli_heads_several_texts(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "a.txt").write_text("The cat sat on the mat.\n\nA cat sat.\n")
    (tmp_path / "b.txt").write_text("The mat\nsat on a cat.")
    (tmp_path / "empty.txt").write_text("\n \n")
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "a.txt"), "--text", str(tmp_path / "b.txt"),
                     "--heads", "1.1", "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    assert "3 texts (24 tokens, 6-9 per text" in out and "per layer, mean over heads" in out
    assert "b.txt' has no blank line, so its 2 lines are one text" in err
    data = json.load(open(tmp_path / "r" / "heads.json"))
    assert data["summary"]["text_lengths"] == [9, 6, 9] and data["tokens"][2][:3] == ["[CLS]", "the", "mat"]
    assert "routing_effective_rank_mean_spread" in data["heads"][0]
    assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "empty.txt"), "--out",
                     str(tmp_path / "r2")]) == 2
    assert "holds no text" in capsys.readouterr().err and not os.path.exists(tmp_path / "r2")


def test_cli_heads_hostile_checkpoints(tmp_path, rng, capsys):
    """`attngeom heads` on the crafted files of issue 17: one line, exit status 2, nothing written."""
    g = raw_model("gpt2", rng, 1, 2, 8, 4)
    nested = tmp_path / "nested"
    nested.mkdir()
    raw_file(nested / "model.safetensors", b'{"h.0.attn.c_attn.weight": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    wide = tmp_path / "wide"
    wide.mkdir()
    raw_file(wide / "model.safetensors", {"h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [2 ** 64, 8],
                                                                       "data_offsets": [0, 0]}})
    listed = write_model(tmp_path / "listed", g)
    (tmp_path / "listed" / "config.json").write_text("[2, 1]")
    nan = dict(g, **{"h.0.attn.c_proj.weight": np.full((8, 8), np.nan, np.float32)})
    cases = [(nested, "nested too deeply"), (wide, "has an invalid shape"),
             (listed, "config.json' must hold a JSON object, got a JSON array"),
             (write_model(tmp_path / "nan", nan), "tensor 'h.0.attn.c_proj.weight'")]
    for folder, message in cases:
        out = tmp_path / f"report_{os.path.basename(folder)}"
        assert cli.main(["heads", str(folder), "--n-heads", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attngeom heads: ") and err.count("\n") == 1 and message in err, err
        assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["listed", "nan", "nested", "wide"]  # no staging folder left


def test_cli_heads_out(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    g = write_model(tmp_path / "g", raw_model("gpt2", rng, 1, 2, 8, 4))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(tmp_path / "notes")]) == 2
    assert "holds other files" in capsys.readouterr().err
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]
    out = tmp_path / "report"
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(out)]) == 0
    (out / "stale.png").write_bytes(b"old")
    assert cli.main(["heads", g, "--n-heads", "2", "--out", str(out)]) == 0  # an earlier report is replaced
    assert "heads.json" in os.listdir(out) and "stale.png" not in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["g", "notes", "report"]


def test_cli_text_without_config(tmp_path, rng, capsys):
    pytest.importorskip("matplotlib")
    bert_checkpoint(tmp_path / "b", rng)
    os.remove(tmp_path / "b" / "config.json")
    (tmp_path / "text.txt").write_text("The cat sat on the mat.")
    assert cli.main(["heads", str(tmp_path / "b"), "--n-heads", "2", "--text", str(tmp_path / "text.txt"),
                     "--out", str(tmp_path / "r")]) == 0
    assert cli.main(["heads", str(tmp_path / "b"), "--n-heads", "2", "--text", str(tmp_path / "missing.txt"),
                     "--out", str(tmp_path / "r")]) == 2
    assert "--text" in capsys.readouterr().err


def test_heads_and_corpus_read_files_by_one_rule(tmp_path, capsys, monkeypatch):
    """Both commands cut their files with one function, one rule and one --split option."""
    wrapped = tmp_path / "wrapped.txt"
    wrapped.write_text("The cat sat\non the mat.\n\nA dog\nran.\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("first document\nsecond document\nthird document\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    for option in ("--text", "--corpus"):
        assert cli._read_texts([str(wrapped)], "paragraph", option) == ["The cat sat on the mat.", "A dog ran."]
        assert cli._read_texts([str(wrapped)], "line", option) == ["The cat sat", "on the mat.", "A dog", "ran."]
        assert capsys.readouterr().err == ""
        # several lines and no blank line are one text by paragraph: said on stderr
        assert cli._read_texts([str(lines)], "paragraph", option) == ["first document second document third document"]
        err = capsys.readouterr().err
        assert f"note: {option}" in err and "3 lines are one text" in err and "--split line" in err
        assert cli._read_texts([str(lines)], "line", option) == ["first document", "second document", "third document"]
        with pytest.raises(ValueError, match=f"{option}: .*empty.txt' holds no text"):
            cli._read_texts([str(empty)], "line", option)
    # both commands pass --split through, paragraph by default
    seen = []

    def spy(paths, split, option):
        seen.append((option, split))
        raise ValueError("stop")

    monkeypatch.setattr(cli, "_read_texts", spy)
    for argv in (["heads", "x", "--text", "f"], ["corpus", "x", "--corpus", "f"]):
        assert cli.main(argv) == 2 and cli.main(argv + ["--split", "line"]) == 2
    assert seen == [("--text", "paragraph"), ("--text", "line"), ("--corpus", "paragraph"), ("--corpus", "line")]
    capsys.readouterr()
    for argv in (["heads", "x", "--split", "sentence"], ["corpus", "x", "--corpus", "f", "--split", "sentence"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "invalid choice: 'sentence'" in capsys.readouterr().err


def test_cli_heads_ids_for_a_checkpoint_without_tokenizer(tmp_path, capsys):
    """A folder without tokenizer files: the message names --ids, and --ids FILE runs the report
    on those token ids (the attention inputs are the model's own)."""
    pytest.importorskip("matplotlib")
    from attngeom.models import load_model
    from checkpoints import random_checkpoint

    folder = random_checkpoint("llama", tmp_path / "m")
    (tmp_path / "t.txt").write_text("the cat sat")
    assert cli.main(["heads", folder, "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "r0")]) == 2
    assert "attngeom heads --ids FILE" in capsys.readouterr().err
    ids = [5, 17, 3, 42, 8, 5, 17, 3]
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids[:4])) + "\n" + " ".join(map(str, ids[4:])) + "\n")
    assert cli.main(["heads", folder, "--ids", str(tmp_path / "ids.txt"), "--heads", "1.2",
                     "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "llama model, 2 layers x 4 heads" in out and "token ids (8 tokens" in out
    data = json.load(open(tmp_path / "r" / "heads.json"))
    assert data["summary"]["n_tokens"] == 8
    f = load_model(folder).forward(np.array(ids), dtype=np.float64, keep=("pattern",))
    row = next(r for r in data["heads"] if (r["layer"], r["head"]) == (1, 2))
    import attngeom as ag
    ranks = np.linalg.svd(f.pattern[1, 2], compute_uv=False)
    assert abs(row["routing_effective_rank_mean"] - ag.effective_rank(ranks, kind="entropy", spectrum=True)) < 1e-6
    (tmp_path / "bad.txt").write_text("5 17 x")
    assert cli.main(["heads", folder, "--ids", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "r2")]) == 2
    assert "whitespace-separated integer token ids, found 'x'" in capsys.readouterr().err


def test_cli_heads_max_tokens_is_named(tmp_path, rng, capsys):
    bert_checkpoint(tmp_path / "b", rng)
    (tmp_path / "t.txt").write_text("The cat sat on the mat.")
    for value in ("0", "1", "-3"):
        assert cli.main(["heads", str(tmp_path / "b"), "--text", str(tmp_path / "t.txt"), "--max-tokens", value,
                         "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attngeom heads: --max-tokens must be >= 2") and f"got {value}" in err
        assert "max_length" not in err
    assert not os.path.exists(tmp_path / "r")


def test_cli_heads_names_the_model_type(tmp_path, capsys):
    """A training checkpoint is named by its model_type (attngeom-gpt), not by its layout."""
    pytest.importorskip("matplotlib")
    torch = pytest.importorskip("torch")
    from attngeom.torch.gpt import GPT, save_checkpoint

    torch.manual_seed(0)
    folder = save_checkpoint(GPT(7, d_model=16, n_blocks=1, n_heads=2, context=12).eval(), tmp_path / "g",
                             vocab="abcdefg")
    (tmp_path / "t.txt").write_text("abcabcgfedab")
    assert cli.main(["heads", folder, "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("attngeom-gpt model, 1 layers x 2 heads") and "llama model" not in out
    for written in ("summary.md", "report.html"):  # the report says so too
        text = (tmp_path / "r" / written).read_text()
        assert "attngeom-gpt model, 1 layers x 2 heads" in text and "llama model" not in text


def test_cli_heads_missing_checkpoint(tmp_path, capsys):
    import attngeom as ag

    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="which does not exist"):
        ag.load_model(missing)
    with pytest.raises(ValueError, match="which does not exist"):  # as before
        ag.load_heads(missing)
    assert issubclass(ag.errors.MissingCheckpoint, FileNotFoundError)
    assert cli.main(["heads", missing, "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_heads_dtype_is_the_forward_pass(tmp_path, capsys):
    """--dtype runs the decoder's forward in that mode, and the report's data statistics are
    those of its activations: float32 agrees with float64 to float32 rounding (1e-6 here), the
    bfloat16 mode differs by its products' rounding (1e-3 to 1e-2) and stays close; a BERT
    checkpoint, or no text, refuses a dtype other than float64."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("ml_dtypes")
    from checkpoints import random_checkpoint

    folder = random_checkpoint("llama", tmp_path / "m")
    ids = [5, 17, 3, 42, 8, 5, 17, 3, 9, 11]
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    ranks = {}
    for dtype in ("float64", "float32", "bfloat16"):
        assert cli.main(["heads", folder, "--ids", str(tmp_path / "ids.txt"), "--dtype", dtype, "--heads", "1.2",
                         "--out", str(tmp_path / dtype)]) == 0
        out = capsys.readouterr().out
        assert ("NumPy forward pass)" if dtype == "float64" else f"NumPy forward pass, {dtype})") in out
        heads = json.load(open(tmp_path / dtype / "heads.json"))["heads"]
        ranks[dtype] = np.array([r["routing_effective_rank_mean"] for r in heads])
    assert np.max(np.abs(ranks["float32"] - ranks["float64"])) < 1e-5
    gap = np.max(np.abs(ranks["bfloat16"] - ranks["float64"]))
    assert 1e-4 < gap < 5e-2 * np.max(ranks["float64"])
    assert cli.main(["heads", folder, "--dtype", "float32", "--out", str(tmp_path / "r2")]) == 2
    assert "give --text FILE or --ids FILE" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("the cat sat on the mat")
    bert_checkpoint(tmp_path / "bert", np.random.default_rng(0))
    assert cli.main(["heads", str(tmp_path / "bert"), "--text", str(tmp_path / "t.txt"), "--dtype", "float32",
                     "--out", str(tmp_path / "r3")]) == 2
    assert "BERT's encoder runs in float64 only" in capsys.readouterr().err
