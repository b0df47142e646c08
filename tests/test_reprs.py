"""The objects a notebook prints summarise themselves in a few lines (shape, dtype and a few
numbers) instead of dumping their arrays: ModelHeads, AttentionStats, DirectionEffects and
factored_svd's SVD, like Model, Forward and HeadEffects."""
import numpy as np
import pytest

import attngeom as ag
from attngeom.models import direction_effects, planted_induction_model


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return ag.load_model(planted_induction_model(tmp_path_factory.mktemp("planted")))


def test_model_heads_repr(planted):
    heads = ag.load_heads(planted.folder)
    text = repr(heads)
    assert len(text.splitlines()) <= 10 and len(text) < 1200
    assert text.startswith(f"ModelHeads(gpt2 (gpt2 layout) from {heads.path!r}: 2 layers x 4 heads (kv heads 4), "
                           "d_model 256, d_head 64")
    w = heads.W_Q
    assert (f"W_Q: (2, 4, 256, 64) float64, mean {w.mean():.4g}, range [{w.min():.4g}, {w.max():.4g}]" in text)
    assert "W_O: (2, 4, 64, 256) float64" in text and "b_O: (2, 256) float64" in text
    assert str(heads) == text


def test_attention_stats_repr(planted):
    stats = planted.forward(np.tile(np.arange(1, 9), (3, 2)), keep=("attention_stats",)).attention_stats
    text = repr(stats)
    assert len(text.splitlines()) == 7 and len(text) < 800
    assert text.startswith("AttentionStats(shape (2, 3, 4, 16) (..., heads, n_q)")
    e = stats.entropy
    assert f"entropy: float32, mean {e.mean():.4g}, range [{e.min():.4g}, {e.max():.4g}]" in text
    assert "argmax: int64" in text


def test_attention_stats_repr_counts_non_finite():
    stats = ag.AttentionStats.from_routing(np.array([[1.0, 0.0], [0.0, 0.0]]),  # query 1 sees no key
                                           log_z=np.array([0.5, -np.inf]))
    text = repr(stats)
    assert text.startswith("AttentionStats(shape (2,) (..., heads, n_q)")
    assert "log_z: float64, mean 0.5, range [0.5, 0.5], 1 not finite" in text


def test_direction_effects_repr(planted):
    ids = np.concatenate([np.arange(1, 13)] * 2)[None]
    d = direction_effects(planted, ids, 1, 0, dtype=np.float64)
    text = repr(d)
    assert len(text.splitlines()) == 4 and len(text) < 600
    assert text.startswith(f"DirectionEffects(OV circuit of L1H0, {d.singular_values.size} directions, loss baseline "
                           f"{d.baseline:.4g}")
    i = int(np.argmax(np.abs(d.removed)))
    assert f"(index, change): {i} {d.removed[i]:+.3g}" in text
    assert f"with none kept {d.kept[0]:.4g}" in text


def test_factored_svd_repr():
    rng = np.random.default_rng(0)
    r = ag.factored_svd(rng.standard_normal((64, 8)), rng.standard_normal((8, 64)))
    text = repr(r)
    assert len(text.splitlines()) == 3 and len(text) < 400
    assert text.startswith("SVD(U (64, 8) float64") and "Vh (8, 64) float64" in text
    assert f"singular values [{r.S[0]:.4g}, {r.S[1]:.4g}, {r.S[2]:.4g}, {r.S[3]:.4g}, ...]" in text
    batch = ag.factored_svd(rng.standard_normal((5, 64, 8)), rng.standard_normal((8, 64)))
    assert f"S (5, 8) float64" in repr(batch) and f"largest {batch.S.max():.4g}" in repr(batch)
    U, S, Vh = r  # still the named tuple
    assert S is r.S
