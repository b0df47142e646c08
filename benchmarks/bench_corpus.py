"""Corpus statistics: tokens per second in-process vs a LocalCluster of 2 worker processes, the
peak memory of a worker as the corpus grows (1x, 10x, 100x tokens; flat is expected: the
states are O(d_head^2) per head and never hold tokens, and the fold of the partitions keeps
only a few of them), and the activation-store path (write the store once, statistics from it
in-process and on the cluster).

The in-process run is timed with NumPy's BLAS limited to one thread (the default of
corpus_statistics, and what Dask's workers run with) and with BLAS as NumPy starts it (one
thread per core), which shows what a BLAS thread pool costs on these small products. The
workers run with Dask's statistical profiler off: it keeps about 1000 s of call stacks per
worker, which would grow a worker's memory with the length of the run.

A random GPT-2 (transformers, offline, float64 forward pass) and random token-id texts. Prints
the numbers and writes JSON (``--out``). Not part of ``make test``.

    python benchmarks/bench_corpus.py [--base-texts 200] [--out DIR]
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
import time

import numpy as np

from harness import parser, write


def build_checkpoint(folder: str, n_layer: int, n_embd: int, n_head: int) -> str:
    """A random GPT-2 saved by transformers, in a subprocess: importing torch here would change
    the OpenMP runtime of the in-process measurement."""
    import subprocess

    code = ("import torch, transformers; torch.manual_seed(0); "
            f"c = transformers.GPT2Config(vocab_size=1000, n_embd={n_embd}, n_layer={n_layer}, n_head={n_head}, "
            "n_positions=128, bos_token_id=0, eos_token_id=0); "
            f"transformers.GPT2LMHeadModel(c).save_pretrained({folder!r}, safe_serialization=True)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return folder


def corpus(n_texts: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, size=int(rng.integers(16, 64))) for _ in range(n_texts)]


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started or since :func:`reset_peak_rss`:
    VmHWM of /proc/self/status on Linux. Not ru_maxrss: a worker process is forked from the
    parent and then exec'd, and ru_maxrss keeps the forked copy's peak, i.e. the parent's
    memory at the time the worker was started."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the peak of :func:`peak_rss_mb` to the current resident memory (Linux
    /proc/self/clear_refs); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2 ** 20


def max_relative_difference(res, ref) -> float:
    worst = 0.0
    for name, d in ref.statistics.items():
        for key, v in d.items():
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
                e = np.max(np.abs(res.statistics[name][key] - v)) / max(np.max(np.abs(v)), 1e-300)
                worst = max(worst, float(e))
    return worst


def timed(f, *args, **kwargs):
    t0 = time.perf_counter()
    out = f(*args, **kwargs)
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    import dask

    import attngeom as ag
    from distributed import Client, LocalCluster

    p = parser(__doc__, repeats=None)  # --out: the results directory, as every benchmark has
    p.add_argument("--base-texts", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch-tokens", type=int, default=1024)
    args = p.parse_args(argv)
    ag.set_num_threads(1)  # one core thread per process, as each worker has (threads_per_worker=1)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(os.path.join(tmp, "gpt2"), args.layers, args.width, args.heads)
        report = {"model": {"n_layers": args.layers, "d_model": args.width, "n_heads": args.heads},
                  "batch_tokens": args.batch_tokens, "runs": []}
        texts = corpus(args.base_texts)
        ag.corpus_statistics(ckpt, texts[:5])  # warm-up (imports, first forward)
        ref, t_in = timed(ag.corpus_statistics, ckpt, texts, batch_tokens=args.batch_tokens, partitions=4)
        _, t_blas = timed(ag.corpus_statistics, ckpt, texts, batch_tokens=args.batch_tokens, partitions=4,
                          blas_threads=None)
        report["in_process"] = {"tokens": ref.n_tokens, "seconds": t_in, "tokens_per_s": ref.n_tokens / t_in,
                                "blas_default_seconds": t_blas, "blas_default_tokens_per_s": ref.n_tokens / t_blas}
        print(f"in-process: {ref.n_tokens} tokens in {t_in:.2f} s = {ref.n_tokens / t_in:.0f} tokens/s (BLAS 1 "
              f"thread); {t_blas:.2f} s = {ref.n_tokens / t_blas:.0f} tokens/s with BLAS's default threads")
        store, t_write = timed(ag.write_activations, ckpt, texts, os.path.join(tmp, "acts.zarr"),
                               batch_tokens=args.batch_tokens)
        from_store, t_read = timed(ag.corpus_statistics, store)
        report["store"] = {"write_seconds": t_write, "write_tokens_per_s": ref.n_tokens / t_write,
                           "size_mb": folder_mb(store), "read_seconds": t_read,
                           "read_tokens_per_s": ref.n_tokens / t_read,
                           "max_relative_difference": max_relative_difference(from_store, ref)}
        print(f"store: written in {t_write:.2f} s ({ref.n_tokens / t_write:.0f} tokens/s, {folder_mb(store):.1f} MB); "
              f"statistics from it in-process in {t_read:.2f} s ({ref.n_tokens / t_read:.0f} tokens/s), max relative "
              f"difference to the direct run {report['store']['max_relative_difference']:.1e}")

        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                   env={"OMP_NUM_THREADS": "1"})
        client = Client(cluster)
        try:
            client.run(lambda: __import__("attngeom").corpus.run._worker_model(ckpt))  # load once per worker
            report["peak_rss_mb_per_worker_model_loaded"] = sorted(client.run(peak_rss_mb).values())
            print(f"cluster: peak RSS per worker with the model loaded "
                  f"{', '.join(f'{v:.0f}' for v in report['peak_rss_mb_per_worker_model_loaded'])} MB")
            for factor in (1, 10, 100):
                big = corpus(args.base_texts * factor, seed=factor)
                client.run(lambda: __import__("gc").collect())
                client.run(reset_peak_rss)  # each row's own peak
                res, dt = timed(ag.corpus_statistics, ckpt, big, batch_tokens=args.batch_tokens, client=client)
                peaks = client.run(peak_rss_mb)
                row = {"factor": factor, "tokens": res.n_tokens, "partitions": res.n_partitions, "seconds": dt,
                       "tokens_per_s": res.n_tokens / dt, "peak_rss_mb_per_worker": sorted(peaks.values())}
                report["runs"].append(row)
                print(f"cluster x{factor:<3}: {res.n_tokens} tokens in {res.n_partitions} partitions, {dt:.2f} s = "
                      f"{res.n_tokens / dt:.0f} tokens/s; peak RSS per worker "
                      f"{', '.join(f'{v:.0f}' for v in sorted(peaks.values()))} MB")
                if factor == 1:
                    same = ag.corpus_statistics(ckpt, texts, batch_tokens=args.batch_tokens, client=client,
                                                partitions=[1] * 7 + [len(texts) - 7])
                    report["merge_max_relative_difference"] = max_relative_difference(same, ref)
            print(f"cluster (8 uneven partitions) vs in-process (4 partitions): max relative difference "
                  f"{report['merge_max_relative_difference']:.1e}")
            # after the memory rows: the peaks are per process
            on_cluster, t_cl = timed(ag.corpus_statistics, store, client=client)
            report["store"]["cluster_read_seconds"] = t_cl
            report["store"]["cluster_read_tokens_per_s"] = ref.n_tokens / t_cl
            print(f"store: statistics from it on the cluster in {t_cl:.2f} s ({ref.n_tokens / t_cl:.0f} tokens/s), "
                  f"max relative difference {max_relative_difference(on_cluster, ref):.1e}")
        finally:
            client.close()
            cluster.close()
        rows = report["runs"]
        report["cluster_speedup_1x"] = rows[0]["tokens_per_s"] / report["in_process"]["tokens_per_s"]
        report["cluster_speedup_100x"] = rows[-1]["tokens_per_s"] / report["in_process"]["tokens_per_s"]
    print(f"cluster / in-process throughput: {report['cluster_speedup_1x']:.2f} (1x), "
          f"{report['cluster_speedup_100x']:.2f} (100x)")
    write(args.out, "bench_corpus", **report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
