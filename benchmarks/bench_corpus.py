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

Threads: one attngeom thread per process (the in-process run and each of the 2 workers,
which also run with OMP_NUM_THREADS=1), NumPy's BLAS at 1 thread except in the run that
measures its default. The in-process run, its BLAS-default twin, the store's write and
reads, and the cluster on the base corpus are medians of --repeats calls (default 3) after
a warm-up; the 1x / 10x / 100x rows measure a worker's peak memory as the corpus grows and
run once each (their throughput is one call; 100x is the longest part of the benchmark).

There is no external anchor (no other library computes these statistics): the anchor is
the in-process run on the base corpus, which every other way of computing the same
statistics is timed and gated against (harness.agree, per statistic, relative to its
largest entry): BLAS's default threads, the store read in-process and on the cluster, the
cluster with Dask's partitions and with 8 uneven ones. The tolerance is 1e-10: the same
float64 sums merged in another order agree to about 3e-15 (measured), and a lost or doubled
partition changes a statistic in its first digits. Beyond it the exit status is 1.
--quick: 20 base texts.

    python benchmarks/bench_corpus.py [--base-texts 200] [--repeats R] [--out DIR] [--quick]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from attngeom.experiments.timing import timed
from harness import agree, finish, memory_mb, parse, parser, print_threads, reset_peak_rss

TOLERANCE = 1e-10  # every way of computing the statistics against the in-process run; see the docstring


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
    """The calling process's peak resident memory since it started or since
    :func:`reset_peak_rss` (harness.memory_mb: VmHWM, not ru_maxrss, which a worker forked from
    the parent and then exec'd would report as the parent's)."""
    return memory_mb()["peak"]


def folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2 ** 20


def gate(case: str, res, ref) -> float:
    """agree() on every float statistic of `res` against the reference `ref` (per statistic,
    relative to its largest entry); the largest relative difference."""
    worst = 0.0
    for name, d in ref.statistics.items():
        for key, v in d.items():
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
                check = agree(f"{case}: {name}.{key}", res.statistics[name][key], v, rtol=TOLERANCE, show=False)
                worst = max(worst, check["max_rel_error"] or 0.0)
    return worst


def main(argv=None) -> int:
    import dask

    import attngeom as ag
    from distributed import Client, LocalCluster

    p = parser(__doc__)
    p.add_argument("--base-texts", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch-tokens", type=int, default=1024)
    args = parse(p, argv)
    r, base = args.repeats, 20 if args.quick else args.base_texts
    ag.set_num_threads(1)  # one core thread per process, as each worker has (threads_per_worker=1)
    threads = print_threads(workers="2 processes x 1 thread (attngeom and BLAS)")
    print(f"medians of {r} calls after a warm-up, except the 1x / 10x / 100x memory rows (one call each); "
          "max relative difference = the largest of every statistic's, against the in-process run")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(os.path.join(tmp, "gpt2"), args.layers, args.width, args.heads)
        report = {"model": {"n_layers": args.layers, "d_model": args.width, "n_heads": args.heads},
                  "batch_tokens": args.batch_tokens, "base_texts": base, "repeats": r, "runs": []}
        texts = corpus(base)
        ref, t_in = timed(lambda: ag.corpus_statistics(ckpt, texts, batch_tokens=args.batch_tokens, partitions=4),
                          r, warm_up=True)
        blas, t_blas = timed(lambda: ag.corpus_statistics(ckpt, texts, batch_tokens=args.batch_tokens, partitions=4,
                                                          blas_threads=None), r, warm_up=True)
        report["in_process"] = {"tokens": ref.n_tokens, "seconds": t_in, "tokens_per_s": ref.n_tokens / t_in,
                                "blas_default_seconds": t_blas, "blas_default_tokens_per_s": ref.n_tokens / t_blas,
                                "blas_default_max_relative_difference": gate("BLAS default threads", blas, ref)}
        print(f"in-process: {ref.n_tokens} tokens in {t_in:.2f} s = {ref.n_tokens / t_in:.0f} tokens/s (BLAS 1 "
              f"thread); {t_blas:.2f} s = {ref.n_tokens / t_blas:.0f} tokens/s with BLAS's default threads, max "
              f"relative difference {report['in_process']['blas_default_max_relative_difference']:.1e}")
        stores = iter(range(r + 1))
        store, t_write = timed(lambda: ag.write_activations(ckpt, texts, os.path.join(tmp, f"acts{next(stores)}.zarr"),
                                                            batch_tokens=args.batch_tokens), r, warm_up=True)
        from_store, t_read = timed(lambda: ag.corpus_statistics(store), r, warm_up=True)
        report["store"] = {"write_seconds": t_write, "write_tokens_per_s": ref.n_tokens / t_write,
                           "size_mb": folder_mb(store), "read_seconds": t_read,
                           "read_tokens_per_s": ref.n_tokens / t_read,
                           "max_relative_difference": gate("store in-process", from_store, ref)}
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
            on_cluster, t_cl = timed(lambda: ag.corpus_statistics(ckpt, texts, batch_tokens=args.batch_tokens,
                                                                  client=client), r, warm_up=True)
            report["cluster_base"] = {"tokens": on_cluster.n_tokens, "partitions": on_cluster.n_partitions,
                                      "seconds": t_cl, "tokens_per_s": on_cluster.n_tokens / t_cl,
                                      "max_relative_difference": gate("cluster", on_cluster, ref)}
            print(f"cluster on the base corpus: {on_cluster.n_partitions} partitions, {t_cl:.2f} s = "
                  f"{on_cluster.n_tokens / t_cl:.0f} tokens/s, max relative difference to the in-process run "
                  f"{report['cluster_base']['max_relative_difference']:.1e}")
            for factor in (1, 10, 100):
                big = corpus(base * factor, seed=factor)
                client.run(lambda: __import__("gc").collect())
                client.run(reset_peak_rss)  # each row's own peak (harness.reset_peak_rss, run on the workers)
                t0 = time.perf_counter()
                res = ag.corpus_statistics(ckpt, big, batch_tokens=args.batch_tokens, client=client)
                dt = time.perf_counter() - t0
                peaks = client.run(peak_rss_mb)
                row = {"factor": factor, "tokens": res.n_tokens, "partitions": res.n_partitions, "seconds": dt,
                       "tokens_per_s": res.n_tokens / dt, "peak_rss_mb_per_worker": sorted(peaks.values())}
                report["runs"].append(row)
                print(f"cluster x{factor:<3}: {res.n_tokens} tokens in {res.n_partitions} partitions, {dt:.2f} s = "
                      f"{res.n_tokens / dt:.0f} tokens/s (one call); peak RSS per worker "
                      f"{', '.join(f'{v:.0f}' for v in sorted(peaks.values()))} MB")
            same = ag.corpus_statistics(ckpt, texts, batch_tokens=args.batch_tokens, client=client,
                                        partitions=[1] * 7 + [len(texts) - 7])
            report["merge_max_relative_difference"] = gate("cluster, 8 uneven partitions", same, ref)
            print(f"cluster (8 uneven partitions) vs in-process (4 partitions): max relative difference "
                  f"{report['merge_max_relative_difference']:.1e}")
            # after the memory rows: the peaks are per process
            on_cluster, t_cl = timed(lambda: ag.corpus_statistics(store, client=client), r, warm_up=True)
            report["store"]["cluster_read_seconds"] = t_cl
            report["store"]["cluster_read_tokens_per_s"] = ref.n_tokens / t_cl
            report["store"]["cluster_max_relative_difference"] = gate("store on the cluster", on_cluster, ref)
            print(f"store: statistics from it on the cluster in {t_cl:.2f} s ({ref.n_tokens / t_cl:.0f} tokens/s), "
                  f"max relative difference {report['store']['cluster_max_relative_difference']:.1e}")
        finally:
            client.close()
            cluster.close()
        report["cluster_speedup_base"] = report["cluster_base"]["tokens_per_s"] / report["in_process"]["tokens_per_s"]
        report["cluster_speedup_100x"] = report["runs"][-1]["tokens_per_s"] / report["in_process"]["tokens_per_s"]
    print(f"cluster / in-process throughput: {report['cluster_speedup_base']:.2f} (base corpus, medians), "
          f"{report['cluster_speedup_100x']:.2f} (100x, one call)")
    return finish(args.out, "bench_corpus", threads=threads, **report)


if __name__ == "__main__":
    sys.exit(main())
