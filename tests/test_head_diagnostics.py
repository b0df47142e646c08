"""head_diagnostics: every per-head quantity equals the one computed by the separate
functions (and their NumPy references) on the same head."""
import json
import math

import numpy as np
import pytest

import attngeom as ag
import reference as ref


def weights(rng, batch, d_model=24, d_head=6, d_v=5):
    s = 1 / math.sqrt(d_model)
    return (rng.standard_normal(batch + (d_model, d_head)) * s, rng.standard_normal(batch + (d_model, d_head)) * s,
            rng.standard_normal(batch + (d_model, d_v)) * s, rng.standard_normal(batch + (d_v, d_model)) * s)


def test_single_head_matches_parts(rng):
    W_Q, W_K, W_V, W_O = weights(rng, ())
    W_K[:, 5] = W_K[:, 0]  # rank-deficient keys
    x = rng.standard_normal((3, 16, 24)) * 2
    d = ag.head_diagnostics(W_Q, W_K, W_V, W_O, x)
    assert d.batch_shape == ()
    nulls = ag.parameter_nulls(W_Q, W_K)
    assert d.nulls.rank == nulls.rank == 5 and d.nulls.ker_B.dim == 19
    assert d.nulls.ker_B.distance(nulls.ker_B) <= 1e-12
    np.testing.assert_allclose(d.ov_singular_values, np.linalg.svd(W_V @ W_O, compute_uv=False)[:5], rtol=1e-12)
    assert d.ov_rank == 5
    q, k = x @ W_Q, x @ W_K
    tau = np.linalg.norm(q, axis=-1) / math.sqrt(6)
    assert d.radius_mean == pytest.approx(tau.mean(), rel=1e-13, abs=0)
    assert d.radius_std == pytest.approx(tau.std(), rel=1e-12, abs=0)
    np.testing.assert_allclose(d.tilt.eigenvalues, ref.tilt_eigenvalues(q), rtol=1e-11, atol=1e-15)
    assert d.tilt.token_null.dim == 24 - 5  # span(N) = W_K span(U), rank(W_K) = 5
    _, P = ag.softmax_attention(q, k, None, return_routing=True)
    r = ag.routing_nulls(P)
    np.testing.assert_allclose(d.routing_singular_values, r.singular_values, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(d.routing_rank, r.rank)
    np.testing.assert_allclose(d.routing_effective_rank, r.effective_rank, rtol=1e-12)
    s = d.summary()
    assert s["n_heads"] == 1 and s["bilinear_rank"] == 5 and s["ker_WK_T_dim"] == 19
    assert s["routing_nullity_mean"] == pytest.approx(np.mean(16 - r.rank))
    assert s["tilt_effective_dim"] == pytest.approx(d.tilt.effective_dim)


def test_stacked_layers_with_per_layer_inputs(rng, tmp_path):
    W_Q, W_K, W_V, W_O = weights(rng, (2, 3))
    x = rng.standard_normal((2, 1, 4, 10, 24))  # one residual stream per layer
    d = ag.head_diagnostics(W_Q, W_K, W_V, W_O, x, causal=True)
    assert d.batch_shape == (2, 3)
    assert d.routing_singular_values.shape == (2, 3, 4, 10) and d.tilt.shape == (2, 3)
    rows = d.table()
    assert len(rows) == 6 and rows[4]["head"] == [1, 1]
    for layer, head in np.ndindex(2, 3):
        one = ag.head_diagnostics(W_Q[layer, head], W_K[layer, head], W_V[layer, head], W_O[layer, head],
                                  x[layer, 0], causal=True)
        row = rows[layer * 3 + head]
        for key, value in one.summary().items():
            if key in row:
                assert row[key] == pytest.approx(value, rel=1e-10, abs=0), key
    # causal routing: lower-triangular P with a positive diagonal is invertible (full rank)
    assert np.all(d.routing_rank == 10)
    s = d.summary()
    assert s["n_heads"] == 6
    assert s["tilt_effective_dim"] == pytest.approx(np.mean([r["tilt_effective_dim"] for r in rows]))
    path = d.to_json(tmp_path / "heads.json")
    saved = json.loads(open(path).read())
    assert saved["summary"]["n_heads"] == 6 and len(saved["heads"]) == 6


def test_shared_weights_broadcast_and_float32(rng):
    W_Q, W_K, W_V, W_O = weights(rng, (3,))
    d = ag.head_diagnostics(W_Q[0], W_K, None, None, (rng.standard_normal((20, 24))).astype(np.float32))
    assert d.batch_shape == (3,) and d.ov_singular_values is None
    assert d.routing_singular_values.dtype == np.float64  # weights are float64
    d32 = ag.head_diagnostics(*(w.astype(np.float32) for w in (W_Q, W_K, W_V, W_O)),
                              x=rng.standard_normal((2, 12, 24)).astype(np.float32))
    assert d32.routing_singular_values.dtype == np.float32
    assert np.all(d32.nulls.rank == 6)


def test_plots(rng):
    pytest.importorskip("matplotlib")
    W_Q, W_K, W_V, W_O = weights(rng, (2, 2))
    d = ag.head_diagnostics(W_Q, W_K, W_V, W_O, rng.standard_normal((3, 8, 24)))
    for which in ("bilinear", "ov", "routing"):
        assert d.plot_spectra(which) is not None
    assert d.plot_map("tilt_effective_dim") is not None
    with pytest.raises(ValueError, match="metric"):
        d.plot_map("nope")
    with pytest.raises(ValueError, match="which"):
        d.plot_spectra("qk")
    with pytest.raises(ValueError, match="routing"):
        ag.head_diagnostics(W_Q, W_K).plot_spectra("routing")
    import matplotlib.pyplot as plt

    plt.close("all")


def test_errors(rng):
    W_Q, W_K, W_V, W_O = weights(rng, ())
    with pytest.raises(ValueError, match="W_K"):
        ag.head_diagnostics(W_Q, W_K[:, :4])
    with pytest.raises(ValueError, match="W_O needs W_V"):
        ag.head_diagnostics(W_Q, W_K, None, W_O)
    with pytest.raises(ValueError, match="W_O must have shape"):
        ag.head_diagnostics(W_Q, W_K, W_V, W_O.T)
    with pytest.raises(ValueError, match="x must have shape"):
        ag.head_diagnostics(W_Q, W_K, x=np.ones((5, 23)))
    with pytest.raises(ValueError, match="x's leading axes"):
        ag.head_diagnostics(np.stack([W_Q] * 2), W_K, x=np.ones((3, 1, 5, 24)))
    with pytest.raises(ValueError, match="x contains NaN"):
        ag.head_diagnostics(W_Q, W_K, x=np.full((5, 24), np.nan))
    with pytest.raises(ValueError, match="rtol"):
        ag.head_diagnostics(W_Q, W_K, rtol=-1)


def test_attention_heatmap_deprecated_keyword(rng):
    pytest.importorskip("matplotlib")
    P = rng.random((4, 4))
    with pytest.warns(DeprecationWarning, match="'P' is deprecated, use 'routing'"):
        old = ag.plotting.attention_heatmap(P=P)
    new = ag.plotting.attention_heatmap(routing=P)
    np.testing.assert_array_equal(old.axes[0].images[0].get_array(), new.axes[0].images[0].get_array())
