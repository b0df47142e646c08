"""Model.forward(keep=, layers=, logits_at=): a forward pass that keeps only what is asked.

The kept fields are bitwise those of the full pass (the attention kernel's output does not
depend on whether weights or statistics are returned, and the products are split by rows
into blocks fixed by the processor count); the streaming attention statistics equal the
statistics of the materialised weights; a pass beyond memory is refused before allocation;
the products give the same bits at any thread count.
"""
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.models import load_model
from attngeom.models.nn.forward import KEEPABLE, plan_forward

from checkpoints import RANDOM_LAYOUTS, RANDOM_VOCAB as VOCAB, random_batch as batch, random_checkpoint, random_tensors
from reference import decoder_logits

DECODERS = ["gpt2", "llama", "mistral", "qwen3"]
TOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for layout in DECODERS + ["bert"]:
        folder = tmp_path_factory.mktemp(layout)
        out[layout] = load_model(random_checkpoint(layout, folder))
    return out


def _assert_stats_close(stats, reference, real, tol):
    """stats against reference at the real query rows (the last axis), every field."""
    for name in ("entropy", "max_weight", "sink_weight", "mean_distance"):
        a, b = getattr(stats, name)[..., real], getattr(reference, name)[..., real]
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_array_equal(stats.argmax[..., real], reference.argmax[..., real])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", DECODERS + ["bert"])
def test_statistics_equal_those_of_the_weights(models, layout, dtype):
    """attention_stats of every layer equal AttentionStats.from_weights of the attentions
    (1e-5 relative in float32, 1e-12 in float64) at every real query of a padded batch, and
    log Z equals log sum exp of the scaled logits."""
    m = models[layout]
    ids, mask = batch()
    f = m.forward(ids, attention_mask=mask, dtype=dtype, keep=("pattern", "attention_stats", "q", "k"))
    assert f.attention_stats.shape == (2, 3, 4, ids.shape[1])
    ref = ag.AttentionStats.from_routing(f.pattern)
    causal = layout != "bert"
    for s in range(ids.shape[0]):
        real = np.flatnonzero(mask[s])
        _assert_stats_close(f.attention_stats.map(lambda a: a[:, s]), ref.map(lambda a: a[:, s]), real, TOL[dtype])
        logits = np.einsum("lhid,lhjd->lhij", f.q[:, s], f.k[:, s]).astype(np.float64) * f.scale[:, None, None, None]
        n = len(mask[s])
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = np.broadcast_to(mask[s][None, :] & ((j <= i) if causal else True), (2, n, n)).copy()
        for layer in m.arch.sliding_layers:  # Mistral's window
            visible[layer] &= (i - j) < m.arch.sliding_window
        logits = np.where(visible[:, None], logits, -np.inf)
        top = logits.max(-1, keepdims=True)
        with np.errstate(invalid="ignore"):  # padded queries that see no key
            log_z = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
        # log Z is a sum of logits: its error scales with their magnitude, not with log Z
        size = max(1.0, float(np.abs(np.where(np.isfinite(logits), logits, 0)).max()))
        np.testing.assert_allclose(f.attention_stats.log_z[:, s][..., real], log_z[..., real], rtol=0,
                                   atol=10 * TOL[dtype] * size)


@pytest.mark.parametrize("layout", ["llama", "qwen2", "qwen3"])
def test_the_forward_is_the_architecture_written_out(tmp_path, layout):
    """Model.forward (float64) equals the decoder written out in NumPy (tests/reference.py) at
    every position of a 300-token sequence, to 1e-12 of the largest logit (measured 5e-15): the
    model tests that need no transformers reference run on a forward checked without it."""
    ids = np.random.default_rng(0).integers(0, VOCAB, 300)
    got = load_model(random_checkpoint(layout, tmp_path / layout)).forward(ids, dtype=np.float64, keep="logits").logits
    want = decoder_logits(random_tensors(layout), RANDOM_LAYOUTS[layout], ids, rows=np.arange(300), block=100)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("layout", DECODERS + ["bert"])
def test_kept_fields_are_bitwise_the_full_pass(models, layout):
    """Every site kept alone (or with others, at some layers) is bitwise the value of a pass that
    keeps every site, and keeping every site leaves the logits bitwise those of a plain pass
    (the MLP's split path, taken when mlp_in or mlp_post is kept, computes the same bits)."""
    m = models[layout]
    ids, mask = batch()
    full = m.forward(ids, attention_mask=mask, keep="all")
    np.testing.assert_array_equal(m.forward(ids, attention_mask=mask, keep="logits").logits, full.logits)
    for keep, layers in [(("attention_stats", "logits"), None), (("q", "v", "resid_pre", "ln_final"), [1]),
                         (("pattern", "attn_in", "k_prerotary", "mlp_post", "embed"), [0]),
                         (("mlp_in", "resid_mid", "z", "pos_embed"), [1]), ("attention_stats", [-1])]:
        f = m.forward(ids, attention_mask=mask, keep=keep, layers=layers)
        kept = (keep,) if isinstance(keep, str) else keep
        index = [0, 1] if layers is None else [layers[0] % 2]
        np.testing.assert_array_equal(f.layers, index)
        for name in KEEPABLE:
            value = getattr(f, name)
            if name not in kept or getattr(full, name) is None:
                assert value is None, name
            elif name == "attention_stats":
                for field in ("log_z", "entropy", "max_weight", "argmax", "sink_weight", "mean_distance"):
                    np.testing.assert_array_equal(getattr(value, field), getattr(full.attention_stats, field)[index])
            elif name in ("logits", "embed", "pos_embed", "ln_final"):  # one per pass
                np.testing.assert_array_equal(value, getattr(full, name), err_msg=name)
            else:
                np.testing.assert_array_equal(value, getattr(full, name)[index], err_msg=name)
        np.testing.assert_array_equal(f.scale, full.scale[index])


def test_default_keep_is_every_field_but_the_statistics(models):
    ids, mask = batch()
    f = models["qwen3"].forward(ids, attention_mask=mask)
    assert f.attention_stats is None
    assert f.pattern.shape == (2, 3, 4, ids.shape[1], ids.shape[1])
    assert f.resid_pre.shape == (2, 3, ids.shape[1], 32) and f.ln_final.shape == (3, ids.shape[1], 32) and f.logits.shape == (3, ids.shape[1], VOCAB)
    np.testing.assert_array_equal(f.logits_positions, np.broadcast_to(np.arange(ids.shape[1]), ids.shape))


@pytest.mark.parametrize("layout", ["llama", "gpt2"])
def test_logits_at(models, layout):
    m = models[layout]
    ids, mask = batch()
    full = m.forward(ids, attention_mask=mask)
    last = m.forward(ids, attention_mask=mask, keep="logits", logits_at="last")
    ends = [np.flatnonzero(row)[-1] for row in mask]   # right padding: not the last column
    assert ends == [ids.shape[1] - 1, ids.shape[1] - 1, ids.shape[1] - 4]
    assert last.logits.shape == (3, 1, VOCAB)
    np.testing.assert_array_equal(last.logits_positions[:, 0], ends)
    # fewer rows go through another BLAS product shape: equal to rounding, not bitwise
    np.testing.assert_allclose(last.logits[:, 0], full.logits[np.arange(3), ends], rtol=1e-5, atol=1e-5)
    some = m.forward(ids, attention_mask=mask, keep=("logits",), logits_at=[0, -1, 2])
    np.testing.assert_allclose(some.logits, full.logits[:, [0, ids.shape[1] - 1, 2]], rtol=1e-5, atol=1e-5)
    one = m.forward(ids[0], keep=("logits",), logits_at="last")  # one sequence: no batch axis
    assert one.logits.shape == (1, VOCAB) and one.logits_positions.tolist() == [ids.shape[1] - 1]
    np.testing.assert_allclose(one.logits[0], m.forward(ids[0]).logits[-1], rtol=1e-5, atol=1e-5)


def test_one_sequence_drops_the_batch_axis(models):
    ids, _ = batch()
    f = models["llama"].forward(ids[0], keep=("attention_stats", "q", "resid_pre", "ln_final"))
    assert f.attention_stats.shape == (2, 4, ids.shape[1]) and f.q.shape == (2, 4, ids.shape[1], 8)
    assert f.positions.shape == (ids.shape[1],) and f.resid_pre.shape == (2, ids.shape[1], 32)
    assert f.ln_final.shape == (ids.shape[1], 32)


def test_bad_arguments(models):
    m = models["llama"]
    ids = np.arange(6)
    with pytest.raises(ValueError, match="keep: unknown site 'atention'.*pattern"):
        m.forward(ids, keep=("atention",))
    with pytest.raises(TypeError, match="keep must be a site name"):
        m.forward(ids, keep=3)
    with pytest.raises(ValueError, match="layers: 2 is out of range for a model of 2 layers"):
        m.forward(ids, layers=[0, 2])
    with pytest.raises(ValueError, match="layers: -3 is out of range"):
        m.forward(ids, layers=-3)
    with pytest.raises(ValueError, match="layers must name at least one layer"):
        m.forward(ids, layers=[])
    with pytest.raises(TypeError, match="layers must be an integer"):
        m.forward(ids, layers=[0.5])
    with pytest.raises(ValueError, match="logits_at: token index 6 is out of range for sequences of 6 tokens"):
        m.forward(ids, logits_at=[6])
    with pytest.raises(ValueError, match="logits_at must be 'last'"):
        m.forward(ids, logits_at="first")
    with pytest.raises(ValueError, match="logits_at must be"):
        m.forward(ids, logits_at=[[0]])
    with pytest.raises(ValueError, match="logits_at was given but keep does not hold 'logits'"):
        m.forward(ids, keep="q", logits_at="last")


def test_a_pass_beyond_memory_is_refused_before_allocation(models):
    m = models["llama"]
    n = 400_000  # 2 layers x 4 heads x n^2 float32 weights: 5 TB
    with pytest.raises(ValueError, match=r"would need .* GiB for 'pattern'.*keep=\('attention_stats', 'logits'\)"):
        m.forward(np.zeros(n, np.int64))
    mask = np.ones((1, 1000), bool)
    plan_forward(m.arch, mask, np.float32, keep=("attention_stats",), available=10 ** 9)  # fits
    with pytest.raises(ValueError, match=r"'q' \(.*more than the 9.31e-07 GiB of memory available"):
        plan_forward(m.arch, mask, np.float32, keep=("q", "attention_stats"), available=1000)
    with pytest.raises(ValueError, match="working arrays.*shorter input or a smaller batch"):
        plan_forward(m.arch, mask, np.float32, keep=(), available=1000)


def test_the_same_bits_at_any_thread_count(models):
    """The products split rows over a pool of the thread budget; blocks are fixed by the
    processor count, so 1, 2 and 3 threads give the same bits."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, (3, 50))  # 150 rows: split into blocks on more than one processor
    before = ag.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            ag.set_num_threads(threads)
            runs.append(models["qwen3"].forward(ids, keep=("logits", "resid_pre", "ln_final", "attention_stats")))
    finally:
        ag.set_num_threads(before)
    for f in runs[1:]:
        np.testing.assert_array_equal(f.logits, runs[0].logits)
        np.testing.assert_array_equal(f.resid_pre, runs[0].resid_pre)
        np.testing.assert_array_equal(f.ln_final, runs[0].ln_final)
        np.testing.assert_array_equal(f.attention_stats.entropy, runs[0].attention_stats.entropy)


def test_last_logits_by_vocabulary_chunks_at_any_thread_count(models, monkeypatch):
    """The last token's logits (too few rows to split) go over the vocabulary's chunks on the
    pool, each chunk's product whole: the same bits at 1, 2 and 3 threads, and the same as
    the float64 logits of the whole pass to float32 rounding."""
    from attngeom.models.nn import decoder

    ids = np.random.default_rng(5).integers(0, VOCAB, (2, 30))
    monkeypatch.setattr(decoder, "_UNEMBED_ROWS", 7)  # many chunks, the last one short
    before = ag.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            ag.set_num_threads(threads)
            runs.append(models["qwen3"].forward(ids, keep=("logits",), logits_at="last", dtype=np.float32).logits)
    finally:
        ag.set_num_threads(before)
    for logits in runs[1:]:
        np.testing.assert_array_equal(logits, runs[0])
    full = models["qwen3"].forward(ids, keep=("logits",), dtype=np.float64).logits[:, -1:]
    assert runs[0].shape == full.shape
    np.testing.assert_allclose(runs[0], full, rtol=1e-4, atol=1e-4 * np.abs(full).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_core_float_product_against_numpy_at_any_address(dtype):
    """The forward's float products (the core's GEMM): x @ W for W given as a linear layer's
    (out, in) weight or as (in, out), odd shapes, against NumPy's float64 product; the same
    bits for operands copied to other byte offsets."""
    from attngeom import _core
    from attngeom.models.nn.products import block_product

    rng = np.random.default_rng(6)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    for m, k, n in [(2, 3, 5), (37, 130, 67), (256, 64, 300)]:
        x, w = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        by_rows = _core.matmul(x, w, True)
        by_cols = _core.matmul(x, np.ascontiguousarray(w.T), False)
        for got in (by_rows, by_cols, block_product(x, w.T), block_product(x, np.ascontiguousarray(w.T))):
            assert got.dtype == dtype and got.shape == (m, n)
            assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want)) * np.sqrt(k)
        for offset in (1, 3):  # elements: 4 or 8 bytes times these
            buf_x = np.empty(x.size + offset, dtype)[offset:].reshape(x.shape)
            buf_w = np.empty(w.size + offset, dtype)[offset:].reshape(w.shape)
            buf_x[...], buf_w[...] = x, w
            np.testing.assert_array_equal(_core.matmul(buf_x, buf_w, True), by_rows)
    with pytest.raises(ValueError, match="matmul"):
        _core.matmul(np.ones((2, 3), dtype), np.ones((4, 5), dtype), True)


def test_products_split_by_rows(monkeypatch):
    from attngeom.models.nn import products

    rng = np.random.default_rng(0)
    x, W = rng.standard_normal((2, 100, 16)), rng.standard_normal((16, 24))
    monkeypatch.setattr(products, "_processors", lambda: 3)
    with products.product_threads():
        y = products.product(x, W)
    assert y.shape == (2, 100, 24)
    np.testing.assert_allclose(y, x @ W, rtol=1e-13, atol=1e-13)
    assert products.product(x[:, :10], W).shape == (2, 10, 24)  # too few rows to split


@pytest.mark.parametrize("kind", ["float32", "float64", "bfloat16"])
def test_products_split_by_columns(kind, monkeypatch):
    """A linear layer's stored (out, in) weight is split by columns, in units that depend on
    the processor count: every column once, chunks starting at multiples of COLUMN_ALIGN. For
    each processor count the result is the same bits at 1 and 2 threads; the bfloat16 product
    is bitwise the unsplit one (an entry depends on its row and column only), the float GEMM
    agrees with it to rounding (Eigen's row blocking can follow the columns of a call)."""
    from attngeom import _core
    from attngeom.models.nn import products

    rng = np.random.default_rng(7)
    dtype = np.float64 if kind == "float64" else np.float32
    x = rng.standard_normal((37, 130)).astype(dtype)
    stored = [rng.standard_normal((n, 130)).astype(dtype) for n in (200, 64, 131)]  # (out, in)
    if kind == "bfloat16":
        weights = [products.BFloat16Weight(_core.round_bf16(w)) for w in stored]
        whole = [_core.matmul_bf16(x, W.bits, False) for W in weights]
    else:
        weights = [w.T for w in stored]
        whole = [_core.matmul(x, w, True) for w in stored]
    assert products.splits_columns(x, weights)
    for processors in (1, 2, 3, 16):
        units = products.column_units([200, 64, 131], processors)
        for i, n in enumerate((200, 64, 131)):
            spans = sorted((lo, hi) for j, lo, hi in units if j == i)
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert all(lo % products.COLUMN_ALIGN == 0 for lo, _ in spans)
        assert len(units) == {1: 3, 2: 3, 3: 4, 16: 8}[processors]  # about one chunk per processor, >= 64 wide
        monkeypatch.setattr(products, "_processors", lambda: processors)
        runs = []
        for threads in (1, 2):
            before = ag.get_num_threads()
            ag.set_num_threads(threads)
            try:
                runs.append(products.column_products(x, weights) + [products.product(x[None], weights[0])[0]])
            finally:
                ag.set_num_threads(before)
        for g, h in zip(runs[0], runs[1]):
            np.testing.assert_array_equal(g, h)
        for g, w in zip(runs[0], whole + whole[:1]):
            assert g.dtype == w.dtype and g.shape == w.shape
            if kind == "bfloat16":
                np.testing.assert_array_equal(g, w)
            else:  # float summation bound over the depth 130
                bound = 130 * np.finfo(dtype).eps * np.abs(x).max() * max(np.abs(s).max() for s in stored)
                assert np.max(np.abs(g - w)) <= bound


@pytest.mark.parametrize("layout", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16"])
def test_products_by_columns_equal_products_by_rows(models, layout, dtype, monkeypatch):
    """The forward's products split by columns against the same pass split by rows, in blocks
    of 40 tokens (the last one too short to split), for 3 processors: the bfloat16 mode's
    bits are the same (an entry of its product depends on its row and column only), float
    results agree to rounding; the pre-rotary sites and the attention inputs too."""
    from attngeom.models.nn import decoder, products

    ids = np.random.default_rng(9).integers(0, VOCAB, (3, 50))
    keep = ("logits", "q_prerotary", "k_prerotary", "q", "k", "v", "attn_in", "resid_post")
    monkeypatch.setattr(decoder, "MLP_ROWS", 40)
    monkeypatch.setattr(products, "_processors", lambda: 3)
    runs = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(decoder, "splits_columns", lambda x, weights: False)
        runs.append(models[layout].forward(ids, keep=keep, dtype=dtype))
    for name in keep:
        a, b = getattr(runs[0], name), getattr(runs[1], name)
        if dtype == "bfloat16":
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            tol = TOL[dtype]
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=name)


def test_mlp_in_blocks_of_rows(models, monkeypatch):
    """Beyond MLP_ROWS rows the MLP runs in row blocks: the same function of each row."""
    from attngeom.models.nn import decoder

    ids = np.random.default_rng(4).integers(0, VOCAB, (2, 40))
    whole = models["llama"].forward(ids, keep=("logits",))
    monkeypatch.setattr(decoder, "MLP_ROWS", 16)
    blocks = models["llama"].forward(ids, keep=("logits",))
    np.testing.assert_allclose(blocks.logits, whole.logits, rtol=1e-5, atol=1e-5)


def test_set_num_threads_sets_the_blas_threads_too():
    import io

    from attngeom._config import blas_controller

    if not blas_controller().info():  # threadpoolctl is a dependency; a BLAS without a pool is not
        pytest.skip("NumPy's BLAS has no thread pool threadpoolctl can see")
    before = ag.get_num_threads()
    try:
        for n in (1, 2):
            ag.set_num_threads(n)
            assert ag.show_config(file=io.StringIO())["blas_threads"] == n
    finally:
        ag.set_num_threads(before)


CHILD = r"""
import json, resource, sys
import os

import numpy as np
import attngeom as ag
model = ag.load_model(sys.argv[1])
ids = np.random.default_rng(5).integers(0, model.arch.vocab_size, int(sys.argv[2]))
f = model.forward(ids, keep=("attention_stats", "logits"), logits_at="last")
np.savez(sys.argv[3], entropy=f.attention_stats.entropy[:, :, :512], argmax=f.attention_stats.argmax[:, :, :512],
         logits=f.logits, ids=ids[:512])
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "shape": list(f.attention_stats.shape)}))
"""


@pytest.mark.heavy
def test_sixteen_thousand_tokens_in_little_memory(tmp_path):
    """16,384 tokens with statistics and the last logits: one layer's (4, n, n) float32 weights
    alone would be 4.3 GB; the pass peaks well under 2 GB. The statistics of the first 512
    queries equal those of the weights of a full pass over the first 512 tokens (causal)."""
    import json
    import subprocess
    import sys

    random_checkpoint("qwen3", tmp_path / "m")
    n = 16384
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m"), str(n), str(tmp_path / "out.npz")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["shape"] == [2, 4, n]
    assert report["peak_mb"] < 2048, report
    saved = np.load(tmp_path / "out.npz")
    short = load_model(tmp_path / "m").forward(saved["ids"], keep=("pattern",))
    ref = ag.AttentionStats.from_routing(short.pattern)
    np.testing.assert_allclose(saved["entropy"], ref.entropy, rtol=1e-4, atol=1e-4)
    top = np.sort(short.pattern, axis=-1)
    clear = top[..., -1] - top[..., -2] > 1e-4  # the largest weight is not tied at float32 rounding
    np.testing.assert_array_equal(saved["argmax"][clear], ref.argmax[clear])
    # the last token's logits: a float32 pass over 16,384 tokens against the architecture
    # written out in float64 (tests/reference.py). Measured 2e-6 of the largest logit; float32
    # rounding grows with the sum over 16k keys, so 1e-4 leaves a margin no broken pass stays under.
    ids = np.random.default_rng(5).integers(0, VOCAB, n)
    want = decoder_logits(random_tensors("qwen3"), RANDOM_LAYOUTS["qwen3"], ids)
    np.testing.assert_allclose(saved["logits"], want, rtol=0, atol=1e-4 * np.abs(want).max())


@pytest.mark.heavy
def test_heads_report_on_a_long_text(tmp_path):
    """`attngeom heads` on a 4,096-token text: every query's statistics (the per-position
    profile figure, in the HTML too), the P-based fields on the first 512 tokens."""
    import json

    pytest.importorskip("matplotlib")
    from checkpoints import with_tokenizer

    from attngeom import cli

    random_checkpoint("llama", tmp_path / "m")
    with_tokenizer(tmp_path / "m")
    words = "the cat sat on mat and dog ran . a".split()
    (tmp_path / "t.txt").write_text(" ".join(np.random.default_rng(0).choice(words, 4096)))
    assert cli.main(["heads", str(tmp_path / "m"), "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / "r")]) == 0
    out = tmp_path / "r"
    assert (out / "attention_profile.png").stat().st_size > 10_000
    html = (out / "report.html").read_text()
    assert "alt='attention_profile.png'" in html and "first 512 tokens" in html
    assert "first 512 tokens" in (out / "summary.md").read_text()
    report = json.loads((out / "heads.json").read_text())
    assert report["summary"]["text_lengths"] == [4096] and report["summary"]["window"] == 512
    profiles = report["profiles"]
    assert np.shape(profiles["entropy"]) == (2, 4, len(profiles["positions"])) and profiles["bin_edges"][-1] == 4096
    model = load_model(tmp_path / "m")
    ids, _ = model.tokenize((tmp_path / "t.txt").read_text())
    stats = model.forward(np.asarray(ids), dtype=np.float64, keep=("attention_stats",)).attention_stats
    for row in report["heads"]:
        layer, head = row["layer"], row["head"]
        assert row["attention_entropy"] == pytest.approx(stats.entropy[layer, head].mean(), rel=1e-9, abs=0)
        assert row["sink_weight"] == pytest.approx(stats.sink_weight[layer, head].mean(), rel=1e-9, abs=1e-12)
        assert row["log_z_max"] == pytest.approx(stats.log_z[layer, head].max(), rel=1e-9, abs=0)


def _resident_kb(path):
    """Resident kB of this process's mappings of `path` (Linux /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
                inside = line.rstrip("\n").endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_released_pages_leave_the_resident_set_and_keep_their_values(tmp_path):
    from attngeom.models import SafetensorsFile, write_safetensors
    from attngeom.models.io.safetensors import release_pages

    values = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    path = write_safetensors(tmp_path / "w.safetensors", {"w": values})
    f = SafetensorsFile(path)
    w = f.mapped("w")
    assert float(w.T.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # every page read
    assert _resident_kb(path) >= 1900
    release_pages(w.T)
    assert _resident_kb(path) <= 16  # at most the partial pages at the ends
    np.testing.assert_array_equal(w, values)  # mapped again from the page cache
    release_pages(values)  # not mapped: nothing happens


def test_corpus_profile_over_every_query(tmp_path):
    """ProfileStatistic: per head, the moments over every real query equal those of the
    forward's attention_stats text by text; the position profile starts at entropy 0 and
    sink weight 1 (query 0 sees key 0 only); counts add up to the tokens."""
    random_checkpoint("llama", tmp_path / "m")
    rng = np.random.default_rng(2)
    texts = [rng.integers(0, VOCAB, n) for n in (40, 300, 7)]
    res = ag.corpus_statistics(str(tmp_path / "m"), texts, statistics=("profile",))
    prof = res.statistics["profile"]
    model = load_model(tmp_path / "m")
    per_text = [model.forward(t, dtype=np.float64, keep=("attention_stats",)).attention_stats for t in texts]
    for field in ("entropy", "sink_weight", "mean_distance", "log_z"):
        values = np.concatenate([getattr(s, field) for s in per_text], axis=-1)  # (L, H, tokens)
        np.testing.assert_allclose(prof[field + "_mean"], values.mean(-1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(prof[field + "_std"], values.std(-1), rtol=1e-8, atol=1e-10)
    assert prof["profile_count"].sum() == sum(map(len, texts)) and prof["profile_positions"][0] == 0
    assert prof["profile_count"][0] == 3
    np.testing.assert_allclose(prof["profile_entropy"][..., 0], 0, atol=1e-12)
    np.testing.assert_allclose(prof["profile_sink_weight"][..., 0], 1, atol=1e-12)
    assert res.plot_profile() is not None


def test_the_estimate_counts_windows_patterns_and_bert(models):
    """A sliding window's (b, 1, n, n) mask, a pattern intervention's P and BERT's per-sequence
    weights are working memory the estimate counts."""
    from attngeom.models import Ablate
    from attngeom.models.nn.forward import forward_bytes

    mask = np.ones((1, 4000), bool)
    mistral, llama = models["mistral"].arch, models["llama"].arch
    base = forward_bytes(llama, mask.shape, np.float32, plan_forward(llama, mask, np.float32, keep=()))
    windowed = forward_bytes(mistral, mask.shape, np.float32, plan_forward(mistral, mask, np.float32, keep=()))
    assert windowed["working"] - base["working"] >= 4000 ** 2
    pattern = plan_forward(llama, mask, np.float32, keep=(), interventions=[Ablate("pattern", 0)])
    assert forward_bytes(llama, mask.shape, np.float32, pattern)["working"] - base["working"] >= 2 * 4 * 4 * 4000 ** 2
    bert = models["bert"].arch
    short = np.ones((3, 16), bool)
    assert forward_bytes(bert, short.shape, np.float32, plan_forward(bert, short, np.float32, keep=()))["working"] \
        >= 4 * 2 * 3 * 4 * 16 ** 2


def test_the_product_pool_survives_nesting_threads_and_fork(monkeypatch):
    import threading

    from attngeom.models.nn import products

    monkeypatch.setattr(products, "_processors", lambda: 8)
    rng = np.random.default_rng(0)
    x, W = rng.standard_normal((600, 16)), rng.standard_normal((16, 8))
    before = ag.get_num_threads()
    ag.set_num_threads(2)
    try:
        want = products.product(x, W)
        nested = []
        products.for_row_blocks(lambda lo, hi: nested.append(products.product(x[lo:hi], W)), 600)  # no deadlock
        assert sum(len(a) for a in nested) == 600
        errors = []

        def run(rows):
            try:
                for _ in range(20):
                    products.product(rng.standard_normal((rows, 16)), W)
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(r,)) for r in (64, 256, 600)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        if hasattr(os, "fork"):
            pid = os.fork()
            if pid == 0:  # the child's copy of the pool has no threads: it must make its own
                os._exit(0 if np.array_equal(products.product(x, W), want) else 1)
            _, status = os.waitpid(pid, 0)
            assert status == 0
    finally:
        ag.set_num_threads(before)


def test_copy_on_write_maps_keep_their_edits(tmp_path):
    from attngeom.models.io.safetensors import release_pages

    np.save(tmp_path / "a.npy", np.ones((1024, 1024)))
    w = np.load(tmp_path / "a.npy", mmap_mode="c")
    w[:] = 0
    release_pages(w)
    assert w.max() == 0


def test_forward_and_model_print_in_a_few_lines(models):
    m = models["llama"]
    f = m.forward(np.arange(6), keep=("logits", "attention_stats"))
    text = repr(f)
    assert text.startswith("Forward(6 tokens, layers [0, 1]") and len(text.splitlines()) <= 6
    assert f"logits: (6, {VOCAB}) float32" in text and "attention_stats: (2, 4, 6)" in text
    assert "not kept: embed, pos_embed, resid_pre, attn_in" in text
    assert repr(m).startswith("Model(llama from ") and "2 layers x 4 heads (kv heads 2)" in repr(m)
