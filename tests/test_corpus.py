"""Corpus statistics (attngeom.corpus): exact merges of the mergeable states, agreement with the
batch functions on the concatenated data, partition independence, resume, a real
distributed.LocalCluster (2 worker processes, one of them killed mid-run) and the CLI.

The model is a random GPT-2 (2 layers x 4 heads, d_model 32) built with transformers offline,
run in float64; the corpus a few hundred short token-id texts.
"""
import json
import os

import numpy as np
import pytest

import attngeom as ag
from attngeom.corpus import (Batch, Histogram, Mergeable, Moments, RadiusStatistic, SequenceMoments, Statistic,
                             corpus_statistics)
from attngeom.corpus import run as corpus_run

RTOL = 1e-12
DEFAULT = ag.corpus.DEFAULT_STATISTICS


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)) if a.size else 0.0


def splits(n, rng, k):
    """k random partitions of range(n) into consecutive pieces of random sizes."""
    out = [[(0, n)], [(i, i + 1) for i in range(n)]]
    for _ in range(k):
        cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(1, n - 1), replace=False))
        edges = np.concatenate([[0], cuts, [n]])
        out.append(list(zip(edges[:-1], edges[1:])))
    return out


# -- the mergeable parts ---------------------------------------------------------------------
def test_moments_merge_equals_single_pass(rng):
    x = 3.0 + rng.standard_normal((2, 3, 40, 5)) * rng.uniform(0.1, 10, 5)
    ref_cov = np.einsum("abni,abnj->abij", x - x.mean(2, keepdims=True), x - x.mean(2, keepdims=True)) / 39
    for parts in splits(40, rng, 4):
        acc = Moments((2, 3), 5)
        for a, b in parts:
            acc.merge(Moments((2, 3), 5).update(x[:, :, a:b]))
        assert rel(acc.mean, x.mean(2)) < RTOL
        assert rel(acc.covariance(ddof=1), ref_cov) < RTOL
        diag = Moments((2, 3), 5, full=False)
        for a, b in reversed(parts):  # another merge order
            diag.merge(Moments((2, 3), 5, full=False).update(x[:, :, a:b]))
        assert rel(diag.variance(), x.var(2)) < RTOL
    with pytest.raises(ValueError, match="x must have shape"):
        Moments((2,), 3).update(np.ones((3, 4, 3)))


def test_histogram_merge_is_exact(rng):
    x = rng.uniform(-1, 5, (3, 200))
    edges = np.linspace(0, 4, 9)
    whole = Histogram((3,), edges).update(x)
    for parts in splits(200, rng, 3):
        acc = Histogram((3,), edges)
        for a, b in parts:
            acc.merge(Histogram((3,), edges).update(x[:, a:b]))
        np.testing.assert_array_equal(acc.counts, whole.counts)
        np.testing.assert_array_equal(acc.overflow, whole.overflow)
    np.testing.assert_array_equal(whole.counts[0], np.histogram(x[0], edges)[0])
    assert whole.underflow[0] == np.sum(x[0] < 0) and whole.overflow[0] == np.sum(x[0] > 4)
    with pytest.raises(ValueError, match="edges"):
        Histogram((), [1.0, 0.0])


def test_whiteness_accumulator_equals_the_batch_functions(rng):
    x = ag.vector_ma1(np.stack([t * np.eye(3) for t in np.linspace(0.2, 0.9, 5)]), B=60, T=5, seed=3)
    for parts in splits(60, rng, 4):
        parts = [(a, b) for a, b in parts]
        acc = SequenceMoments((), 5, 3)
        for a, b in parts:
            acc.merge(SequenceMoments((), 5, 3).update(x[a:b]))
        assert rel(acc.whiteness(), ag.whiteness(x)) < RTOL
        assert rel(acc.stationarity(), ag.stationarity(x)) < RTOL
    with pytest.raises(ValueError, match="at least 2 sequences"):
        SequenceMoments((), 5, 3).update(x[:1]).whiteness()


def banded_whiteness(x, max_lag):
    """Plain-NumPy reference: the full TD x TD covariance, entries outside the band |s - t| <= max_lag
    of position blocks dropped, mean off-diagonal magnitude over mean diagonal magnitude."""
    B, T, D = x.shape
    lam = np.abs(np.cov(x.reshape(B, T * D), rowvar=False))
    pos = np.repeat(np.arange(T), D)
    band = np.abs(pos[:, None] - pos[None, :]) <= max_lag
    off = band & ~np.eye(T * D, dtype=bool)
    return lam[off].mean() / np.diag(lam).mean()


def test_whiteness_band_bounds_the_state(rng):
    x = ag.vector_ma1(np.stack([t * np.eye(3) for t in np.linspace(0.2, 0.9, 5)]), B=60, T=5, seed=4)
    full = SequenceMoments((), 5, 3).update(x)
    assert rel(banded_whiteness(x, 4), ag.whiteness(x)) < RTOL  # the reference's full band is eq. 12
    for max_lag in (1, 2, 4):
        acc = SequenceMoments((), 5, 3, max_lag=max_lag)
        for a, b in splits(60, rng, 2)[2]:
            acc.merge(SequenceMoments((), 5, 3, max_lag=max_lag).update(x[a:b]))
        assert rel(acc.whiteness(), banded_whiteness(x, max_lag)) < RTOL
        assert rel(acc.stationarity(), ag.stationarity(x)) < RTOL  # rho reads lag 1 only: exact in any band
        # count, mean (T, D) and the blocks of lags 0..max_lag: (T - l) D x D each, never (T D)^2
        assert acc.nbytes == 8 * (1 + 5 * 3 + 9 * sum(5 - lag for lag in range(max_lag + 1)))
    assert full.nbytes < 8 * (5 * 3) ** 2  # the upper block triangle, not the whole covariance
    for bad in (0, 5, 1.5, True):
        with pytest.raises(ValueError, match="max_lag"):
            SequenceMoments((), 5, 3, max_lag=bad)
    with pytest.raises(ValueError, match="other has"):
        full.merge(SequenceMoments((), 5, 3, max_lag=1))
    with pytest.raises(ValueError, match="max_lag"):
        ag.corpus.WhitenessStatistic(window=3, max_lag=3)


def test_tilt_coverage_fits_the_protocol(rng):
    assert isinstance(ag.TiltCoverage(3), Mergeable)
    q = rng.standard_normal((50, 3)) @ np.diag([1.0, 0.1, 0.0])
    for parts in splits(50, rng, 3):
        acc = ag.TiltCoverage(3)
        for a, b in parts:
            acc.merge(ag.TiltCoverage(3).update(q[a:b]))
        ref = ag.tilt_coverage(q)
        r = acc.result()
        assert rel(r.eigenvalues, ref.eigenvalues) < RTOL and r.rank == ref.rank == 2


# -- a model and a corpus --------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("transformers")
    from builders import with_tokenizer, build

    folder = tmp_path_factory.mktemp("corpus") / "gpt2"
    build("gpt2", folder, dtype="float64")
    with_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="module")
def texts():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 97, size=int(rng.integers(1, 16))) for _ in range(240)]


@pytest.fixture(scope="module")
def reference(checkpoint, texts):
    return corpus_statistics(checkpoint, texts)


def assert_same(res, ref, rtol=RTOL):
    assert res.n_tokens == ref.n_tokens and res.statistics.keys() == ref.statistics.keys()
    for name, d in ref.statistics.items():
        for key, v in d.items():
            if v is None:
                assert res.statistics[name][key] is None
                continue
            err = rel(res.statistics[name][key], v)
            assert err < rtol, f"{name}.{key}: {err:.2e}"


def test_partition_independence_in_process(checkpoint, texts, reference):
    n = len(texts)
    for parts in ([n], [1] * 30 + [n - 30], [100, 3, 137]):
        assert_same(corpus_statistics(checkpoint, texts, partitions=parts, batch_tokens=48), reference)
    assert_same(corpus_statistics(checkpoint, texts, partitions=7, batch_tokens=200), reference)


def test_statistics_equal_the_batch_functions(checkpoint, texts, reference):
    model = ag.load_model(checkpoint)
    fs = [model.forward(t, dtype=np.float64) for t in texts[:60]]
    res = corpus_statistics(model, texts[:60], statistics=("radius", "tilt", "cumulants", "whiteness", "routing"))
    S = res.statistics
    q = np.concatenate([f.q for f in fs], axis=-2)  # (L, H, N, d)
    tau = fs[0].scale[:, None, None] * np.linalg.norm(q, axis=-1)
    assert rel(S["radius"]["mean"], tau.mean(-1)) < RTOL and rel(S["radius"]["std"], tau.std(-1)) < RTOL
    cov = ag.tilt_coverage(q, batch_ndim=2)
    assert rel(S["tilt"]["eigenvalues"], np.stack([[c.eigenvalues for c in row] for row in cov])) < 1e-11
    W_K = model.heads.W_K
    tok = ag.tilt_coverage(q[1, 2], W_K=W_K[1, 2], centered=True)
    assert rel(S["tilt"]["token_eigenvalues"][1, 2], tok.token_eigenvalues) < 1e-11
    x = np.stack([f.attn_in[:, :4] for f in fs if f.n_tokens >= 4], axis=1)  # (L, B, 4, D)
    for layer in range(2):
        assert rel(S["whiteness"]["whiteness"][layer], ag.whiteness(x[layer])) < RTOL
        assert rel(S["whiteness"]["stationarity"][layer], ag.stationarity(x[layer])) < RTOL
    # cumulants: ag.projected_cumulants of each query against the keys it sees (causal)
    kap = []
    for f in fs[:5]:
        u, t = ag.tilt_radius(f.q, scale=f.scale[0], layout="bhnd")
        kap.append(np.stack([ag.projected_cumulants(u[..., j:j + 1, :], t[..., j:j + 1], f.k[..., :j + 1, :], layout="bhnd")[..., 0, :]
                             for j in range(f.n_tokens)], axis=-2))
    kap = np.concatenate(kap, axis=-2)
    sub = corpus_statistics(model, texts[:5], statistics=("cumulants",)).statistics["cumulants"]
    assert rel(sub["kappa1_mean"], kap[..., 0].mean(-1)) < 1e-10 and rel(sub["kappa2_std"], kap[..., 1].std(-1)) < 1e-10
    ent = -np.concatenate([np.sum(f.pattern * np.log(np.where(f.pattern > 0, f.pattern, 1)), -1)
                           for f in fs], axis=-1)
    assert rel(S["routing"]["entropy_mean"], ent.mean(-1)) < 1e-10
    assert S["routing"]["texts"][0, 0] == 60 and S["routing"]["rows"][0, 0] == q.shape[-2]


def test_whiteness_band_through_the_run(checkpoint, texts, reference):
    res = corpus_statistics(checkpoint, texts, statistics=[ag.corpus.WhitenessStatistic(max_lag=1)], partitions=3)
    w, ref = res.statistics["whiteness"], reference.statistics["whiteness"]
    assert w["max_lag"] == 1 and ref["max_lag"] == 3 and w["texts"] == ref["texts"]
    assert rel(w["stationarity"], ref["stationarity"]) < RTOL
    assert not np.allclose(w["whiteness"], ref["whiteness"])  # the band's Psi, another quantity


class BlasThreads(Statistic):
    """Records the BLAS thread count while the forward batches are processed."""

    name = "blas_threads"

    def _new(self, batch):
        return {"seen": set()}

    def _update(self, batch):
        from threadpoolctl import threadpool_info

        self.state["seen"] |= {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    def result(self):
        return {"seen": sorted(self.state["seen"])}


def test_in_process_runs_limit_blas_threads(checkpoint, texts, reference, tmp_path):
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas():
        return {i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        if blas() != {2}:
            pytest.skip("NumPy's BLAS has no thread pool to limit")
        res = corpus_statistics(checkpoint, texts, statistics=DEFAULT + (BlasThreads(),))
        assert res.statistics.pop("blas_threads")["seen"] == [1] and blas() == {2}  # limited, then restored
        assert_same(res, reference)
        res = corpus_statistics(checkpoint, texts[:20], statistics=(BlasThreads(),), blas_threads=None)
        assert res.statistics["blas_threads"]["seen"] == [2]
        model, seen = ag.load_model(checkpoint), set()
        forward = model.forward
        model.forward = lambda *a, **k: (seen.update(blas()), forward(*a, **k))[1]
        store = ag.write_activations(model, texts[:20], tmp_path / "a.zarr")
        assert seen == {1} and blas() == {2}
        res = corpus_statistics(store, statistics=(BlasThreads(),))
        assert res.statistics["blas_threads"]["seen"] == [1] and blas() == {2}
    with pytest.raises(ValueError, match="blas_threads"):
        corpus_statistics(checkpoint, texts, blas_threads=0)


def test_resume_after_an_interruption(checkpoint, texts, reference, tmp_path, monkeypatch):
    calls = []
    real = corpus_run.partition_states

    def interrupted(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(corpus_run, "partition_states", interrupted)
    with pytest.raises(KeyboardInterrupt):
        corpus_statistics(checkpoint, texts, partitions=6, state_dir=tmp_path / "s")
    assert len([f for f in os.listdir(tmp_path / "s") if f.endswith(".pkl")]) == 3
    calls.clear()
    monkeypatch.setattr(corpus_run, "partition_states", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    assert_same(corpus_statistics(checkpoint, texts, partitions=6, state_dir=tmp_path / "s"), reference)
    assert len(calls) == 3  # only the missing partitions ran
    with pytest.raises(ValueError, match="state_dir .* another run"):
        corpus_statistics(checkpoint, texts[:10], partitions=6, state_dir=tmp_path / "s")


def test_bad_arguments(checkpoint, texts):
    with pytest.raises(ValueError, match="statistics: unknown"):
        corpus_statistics(checkpoint, texts, statistics=("nope",))
    with pytest.raises(ValueError, match="texts: no text"):
        corpus_statistics(checkpoint, [np.array([], int)])
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        corpus_statistics(checkpoint, [np.array([1]), np.array([1000])])
    with pytest.raises(ValueError, match="partitions sizes"):
        corpus_statistics(checkpoint, texts[:5], partitions=[2, 2])
    with pytest.raises(TypeError, match="batch_tokens"):
        corpus_statistics(checkpoint, texts[:5], batch_tokens=1.5)
    with pytest.raises(TypeError, match="texts"):
        corpus_statistics(checkpoint, "a text")
    with pytest.raises(TypeError, match="model"):
        corpus_statistics(3, texts[:5])


# -- a real cluster ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


class Once(Statistic):
    """A statistic that does something special the first time any process updates it (marker file)."""

    def __init__(self, marker=""):
        super().__init__()
        self.marker = marker

    def config(self):
        return {"marker": self.marker}

    def first_time(self):
        if os.path.exists(self.marker):
            return False
        open(self.marker, "w").close()
        return True


class KillOnce(Once):
    """Kills the worker process it runs in, the first time any worker runs it."""

    name = "kill_once"

    def _new(self, batch):
        return {"tokens": 0}

    def _update(self, batch):
        if self.first_time():
            os._exit(1)
        self.state["tokens"] += batch.n_tokens

    def result(self):
        return {"tokens": self.state["tokens"]}


class Largest:
    """A mergeable maximum."""

    def __init__(self, value):
        self.value = value

    def merge(self, other):
        self.value = max(self.value, other.value)
        return self


class HeldStates(Once):
    """The most task results a worker held while a partition ran there; the first partition to
    run anywhere is slow (a straggler)."""

    name = "held_states"

    def _new(self, batch):
        return {"held": Largest(0)}

    def _update(self, batch):
        import time

        from distributed import get_worker

        if self.first_time():
            time.sleep(3)
        self.state["held"].merge(Largest(len(get_worker().state.data)))

    def result(self):
        return {"held": self.state["held"].value}


def test_cluster_holds_a_few_states_whatever_the_corpus(checkpoint, texts, reference, client, tmp_path):
    # 40 partitions, the first one slow: the fold waits for it, and at most 2 per worker run ahead
    res = corpus_statistics(checkpoint, texts, statistics=DEFAULT + (HeldStates(str(tmp_path / "slow")),),
                            partitions=[1] * 39 + [len(texts) - 39], client=client)
    assert os.path.exists(tmp_path / "slow")
    assert res.statistics.pop("held_states")["held"] <= 2 * 2 + 2  # the window, the running state, one in transfer
    assert_same(res, reference)


def test_cluster_equals_in_process(checkpoint, texts, reference, client, tmp_path):
    n = len(texts)
    for parts in ([1] * 20 + [n - 20], 5):
        assert_same(corpus_statistics(checkpoint, texts, partitions=parts, batch_tokens=64, client=client), reference)
    res = corpus_statistics(checkpoint, texts, partitions=4, client=client, state_dir=tmp_path / "s", progress=True)
    assert_same(res, reference)
    assert len([f for f in os.listdir(tmp_path / "s") if f.endswith(".pkl")]) == 4
    # a second run loads every partition and agrees
    assert_same(corpus_statistics(checkpoint, texts, partitions=4, client=client, state_dir=tmp_path / "s"), reference)
    with pytest.raises(ValueError, match="model: a model held in memory"):
        corpus_statistics(ag.models.from_transformers(_tf_model(checkpoint)), texts, client=client)



# -- activations on disk (Zarr) --------------------------------------------------------------
def test_store_statistics_equal_the_direct_run(checkpoint, texts, reference, client, tmp_path):
    pytest.importorskip("zarr")
    import zarr

    path = ag.write_activations(checkpoint, texts, tmp_path / "acts.zarr", batch_tokens=64, chunk_tokens=50)
    root = zarr.open_group(path, mode="r")
    N = reference.n_tokens
    assert root["q"].shape[2] == N and root["q"].chunks[:3] == (1, 4, 50)
    assert root["attentions"].chunks[0] == 1 and root["attention_inputs"].chunks[:2] == (1, 50)
    # attentions are ragged: each text's n x n block, no padding to the longest text
    lengths = np.array([len(t) for t in texts])
    assert root["attentions"].shape == (2, 4, int(np.sum(lengths ** 2)))
    np.testing.assert_array_equal(root["attention_offsets"][:], np.concatenate([[0], np.cumsum(lengths ** 2)]))
    # the store's per-token rows are the forward pass of each text alone
    m = ag.load_model(checkpoint)
    f = m.forward(texts[3][None], dtype=np.float64)
    o = int(sum(len(t) for t in texts[:3]))
    n = len(texts[3])
    a = int(np.sum(lengths[:3] ** 2))
    assert rel(root["q"][:, :, o:o + n], f.q[:, 0]) < RTOL
    assert rel(root["attentions"][:, :, a:a + n * n].reshape(2, 4, n, n), f.pattern[:, 0]) < RTOL
    # analysed many times, any partitioning, in-process or on the cluster: the direct run's results
    assert_same(corpus_statistics(path), reference)
    assert_same(corpus_statistics(path, partitions=[1] * 10 + [len(texts) - 10], batch_tokens=16), reference)
    assert_same(corpus_statistics(path, partitions=5, client=client), reference)
    res = corpus_statistics(path, statistics=("radius",))
    assert list(res.statistics) == ["radius"] and res.model["store"] == path
    with pytest.raises(ValueError, match="exists"):
        ag.write_activations(checkpoint, texts, path)
    with pytest.raises(ValueError, match="not an activation store"):
        ag.write_activations(checkpoint, texts, checkpoint, overwrite=True)
    assert os.path.exists(os.path.join(checkpoint, "config.json"))
    with pytest.raises(ValueError, match="texts are required"):
        corpus_statistics(checkpoint)
    with pytest.raises(ValueError, match="do not apply"):
        corpus_statistics(path, state_dir=tmp_path / "s")


def test_core_import_needs_neither_zarr_nor_dask():
    import subprocess
    import sys

    code = "import sys, attngeom; print(sorted(m for m in ('zarr', 'dask', 'distributed') if m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ag.__file__)))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout
    assert out.strip() == "[]"

def _tf_model(checkpoint):
    import transformers
    return transformers.GPT2LMHeadModel.from_pretrained(checkpoint)


def test_worker_killed_mid_run(checkpoint, texts, reference, client, tmp_path):
    marker = str(tmp_path / "killed")
    res = corpus_statistics(checkpoint, texts, statistics=ag.corpus.DEFAULT_STATISTICS + (KillOnce(marker),),
                            partitions=6, client=client)
    assert os.path.exists(marker)  # a worker did die
    assert res.statistics["kill_once"]["tokens"] == reference.n_tokens
    del res.statistics["kill_once"]
    assert_same(res, reference)


def test_worker_process_killed_from_outside(checkpoint, texts, reference, client, tmp_path):
    # SIGKILL to one worker's process once the first partition is saved: Dask reruns its tasks
    # on the surviving (and the restarted) worker, and the result is exact.
    import signal
    import threading
    import time

    pids = list(client.run(os.getpid).values())
    out, folder = {}, tmp_path / "s"
    thread = threading.Thread(target=lambda: out.update(res=corpus_statistics(
        checkpoint, texts, partitions=[1] * 30 + [len(texts) - 30], batch_tokens=16, client=client, state_dir=folder)))
    thread.start()
    deadline = time.time() + 120
    while time.time() < deadline and not (folder.exists() and any(f.suffix == ".pkl" for f in folder.iterdir())):
        time.sleep(0.01)
    os.kill(pids[0], signal.SIGKILL)
    thread.join(timeout=300)
    assert not thread.is_alive() and "res" in out
    assert_same(out["res"], reference)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker for the next tests


def test_a_run_killed_in_a_subprocess_resumes(checkpoint, texts, reference, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "s"
    np.save(tmp_path / "texts.npy", np.array(texts, dtype=object), allow_pickle=True)
    code = ("import numpy as np, attngeom as ag; "
            f"texts = list(np.load({str(tmp_path / 'texts.npy')!r}, allow_pickle=True)); "
            f"ag.corpus_statistics({checkpoint!r}, texts, partitions=[1] * 40 + [len(texts) - 40], batch_tokens=16, "
            f"state_dir={str(folder)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if folder.exists() and sum(f.suffix == ".pkl" for f in folder.iterdir()) >= 5:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sum(f.suffix == ".pkl" for f in folder.iterdir())
    assert 5 <= saved < 41, saved  # killed mid-run, with partitions saved
    assert_same(corpus_statistics(checkpoint, texts, partitions=[1] * 40 + [len(texts) - 40], batch_tokens=16,
                                  state_dir=folder), reference)


def test_damaged_partition_states_are_named_and_recomputed(checkpoint, texts, reference, tmp_path):
    folder = tmp_path / "s"
    corpus_statistics(checkpoint, texts, partitions=6, state_dir=folder)
    flipped, cut = folder / "partition_000002.pkl", folder / "partition_000004.pkl"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40  # one bit, in place
    flipped.write_bytes(bytes(data))
    cut.write_bytes(cut.read_bytes()[:100])  # truncated
    calls = []
    real = corpus_run.partition_states
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus_run, "partition_states", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        with pytest.warns(RuntimeWarning, match=r"partition 2 cannot be used .*digest") as record:
            res = corpus_statistics(checkpoint, texts, partitions=6, state_dir=folder)
    assert any("partition 4" in str(w.message) for w in record)
    assert len(calls) == 2  # exactly the two damaged partitions ran again
    assert_same(res, reference)


def test_a_second_run_on_one_state_folder_is_refused(checkpoint, texts, tmp_path):
    folder = tmp_path / "s"
    holder = corpus_run._StateFolder(str(folder), "fingerprint")  # a run in progress holds the lock
    try:
        with pytest.raises(ValueError, match=r"state_dir .* is in use by another corpus run \(process \d+\)"):
            corpus_statistics(checkpoint, texts, partitions=6, state_dir=folder)
        from attngeom import cli

        assert cli.main(["corpus", checkpoint, "--corpus", _corpus_file(tmp_path), "--state", str(folder),
                         "--out", str(tmp_path / "r")]) == 2
    finally:
        holder.close()
    corpus_statistics(checkpoint, texts[:10], partitions=2, state_dir=tmp_path / "t")  # released: usable


def _corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("one text here\n\nand another one\n")
    return str(path)


# -- the command line --------------------------------------------------------------------------
def test_cli_corpus(checkpoint, tmp_path, capsys, client):
    pytest.importorskip("matplotlib")
    from attngeom import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n\nthe dog ran .\na cat and a dog sat\n" * 5)
    assert cli.main(["corpus", checkpoint, "--corpus", str(corpus), "--split", "line",
                     "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "gpt2 model, 2 layers x 4 heads; 15 texts" in out
    assert {"summary.json", "heads.csv", "layers.png"} <= set(os.listdir(tmp_path / "r"))
    summary = json.load(open(tmp_path / "r" / "summary.json"))["summary"]
    assert summary["n_texts"] == 15 and len(summary["whiteness_per_layer"]) == 2
    assert len(open(tmp_path / "r" / "heads.csv").read().splitlines()) == 1 + 8
    # --dtype bfloat16: the forward's bfloat16 mode (products rounded to bfloat16, ~1e-2 relative)
    assert cli.main(["corpus", checkpoint, "--corpus", str(corpus), "--split", "line", "--dtype", "bfloat16",
                     "--out", str(tmp_path / "b")]) == 0
    b = json.load(open(tmp_path / "b" / "summary.json"))["summary"]
    assert b["mean_radius_mean"] != summary["mean_radius_mean"]
    assert abs(b["mean_radius_mean"] - summary["mean_radius_mean"]) < 5e-2 * summary["mean_radius_mean"]
    assert cli.main(["corpus", checkpoint, "--corpus", str(corpus), "--split", "line",
                     "--scheduler", client.scheduler.address,
                     "--out", str(tmp_path / "c")]) == 0
    a = json.load(open(tmp_path / "c" / "summary.json"))["summary"]
    assert abs(a["mean_radius_mean"] - summary["mean_radius_mean"]) < 1e-12 * summary["mean_radius_mean"]
    for argv, message in [
        (["--corpus", str(tmp_path / "missing.txt")], "--corpus: "),
        (["--corpus", str(tmp_path / "r" / "layers.png")], "--corpus: "),
        (["--corpus", str(corpus), "--workers", "0"], "--workers must be >= 1"),
        (["--corpus", str(corpus), "--batch-tokens", "0"], "--batch-tokens must be >= 1"),
        (["--corpus", str(corpus), "--dtype", "bfloat16", "--write-store", str(tmp_path / "s.zarr")],
         "--dtype bfloat16 does not apply with --write-store"),
    ]:
        assert cli.main(["corpus", checkpoint, *argv, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attngeom corpus: ") and message in err and err.count("\n") == 1, err
    (tmp_path / "empty.txt").write_text("\n\n")
    assert cli.main(["corpus", checkpoint, "--corpus", str(tmp_path / "empty.txt")]) == 2
    assert "no non-empty line" in capsys.readouterr().err
    assert cli.main(["corpus", str(tmp_path / "nowhere"), "--corpus", str(corpus), "--out", str(tmp_path / "x")]) == 2
    assert not os.path.exists(tmp_path / "bad") and not os.path.exists(tmp_path / "x")


def test_cli_corpus_store(checkpoint, texts, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    pytest.importorskip("zarr")
    import dask
    import distributed

    from attngeom import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran .\na cat and a dog sat\n" * 5)
    store = str(tmp_path / "acts.zarr")
    assert cli.main(["corpus", checkpoint, "--corpus", str(corpus), "--split", "line", "--write-store", store,
                     "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "from the activation store" in out and f"wrote the activation store {store}" in out
    assert ag.corpus.store.is_store(store)
    direct = ag.corpus_statistics(checkpoint, ag.models.split_texts(corpus.read_text(), by="line"))
    assert direct.n_texts == 15
    # the statistics of a store, read again on a local cluster whose workers run without Dask's profiler
    profiling = []
    real = distributed.LocalCluster

    def cluster(*args, **kwargs):
        profiling.append(dask.config.get("distributed.worker.profile.enabled"))
        return real(*args, **kwargs)

    monkeypatch.setattr(distributed, "LocalCluster", cluster)
    assert cli.main(["corpus", store, "--workers", "1", "--out", str(tmp_path / "r")]) == 0
    assert profiling == [False]
    capsys.readouterr()  # the local cluster's own warnings (a dashboard port already taken)
    for folder in ("w", "r"):
        summary = json.load(open(tmp_path / folder / "summary.json"))["summary"]
        assert summary["n_tokens"] == direct.n_tokens
        for key, v in direct.summary().items():
            if isinstance(v, float):
                assert abs(summary[key] - v) <= 1e-12 * max(abs(v), 1e-300), key
    for argv, message in [
        ([store, "--corpus", str(corpus)], "--corpus do not apply"),
        ([store, "--state", str(tmp_path / "s")], "--state do not apply"),
        ([store, "--dtype", "float32"], "--dtype do not apply"),
        ([checkpoint], "--corpus FILE is required"),
        ([checkpoint, "--corpus", str(corpus), "--write-store", store], "--write-store"),
        ([checkpoint, "--corpus", str(corpus), "--write-store", str(tmp_path / "new"), "--state", str(tmp_path / "s")],
         "--state does not apply"),
    ]:
        assert cli.main(["corpus", *argv, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("attngeom corpus: ") and message in err, err
    assert not os.path.exists(tmp_path / "bad") and not os.path.exists(tmp_path / "new")
