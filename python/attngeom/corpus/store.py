"""Activations on disk: a corpus run through the model once (:func:`write_activations`, a Zarr
store) and analysed many times (:func:`attngeom.corpus_statistics` of the store, with
dask.array).

The store holds, for every token of every text (texts one after the other, ``N`` tokens in
all), what the statistics read from a forward pass, chunked by (layer, tokens):

* ``q``, ``k``: (n_layers, n_heads, N, d_head), the queries and keys as the attention uses them;
* ``attentions``: (n_layers, n_heads, S), ragged: every text's (n, n) routing matrix, rows
  of its own n keys, flattened and concatenated text after text (S = sum n^2, no padding to
  the longest text); text i's block starts at ``attention_offsets[i]``;
* ``attention_inputs``: (n_layers, N, d_model);
* ``log_z``: (n_layers, n_heads, N), every query's log partition (which P does not determine);
* ``lengths`` (n_texts,), ``attention_offsets`` (n_texts + 1,), ``scale`` (n_layers,) and,
  for models without rotary embedding, ``W_K`` (n_layers, n_heads, d_model, d_head), so
  results need no model.

``zarr`` and ``dask`` are imported only when a store is written or read.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Optional

import numpy as np

from .._operands import count, float_dtype
from .profile import stats_from_weights
from .protocol import Batch

FORMAT = "attngeom-activations"
VERSION = 3
_FIELDS = ("q", "k", "attentions", "attention_inputs", "log_z")


def _zarr():
    try:
        import zarr
    except ImportError:  # pragma: no cover - zarr is in the corpus and test extras
        raise ImportError("activation stores need the zarr package: pip install 'attngeom[corpus]'") from None
    return zarr


def is_store(path) -> bool:
    """True when `path` is a folder written by :func:`write_activations`."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(os.path.join(path, "zarr.json")):
        return False
    try:
        return _zarr().open_group(os.fspath(path), mode="r").attrs.get("format") == FORMAT
    except Exception:  # noqa: BLE001 - anything unreadable is not a store
        return False


class _Appender:
    """Appends blocks along one axis of a Zarr array, writing whole chunks as they fill (the
    rest at the final flush), so every chunk is written once."""

    def __init__(self, array, axis: int):
        self.array, self.axis, self.chunk = array, axis, array.chunks[axis]
        self.parts: list = []
        self.buffered = self.written = 0

    def append(self, block: np.ndarray) -> None:
        self.parts.append(block)
        self.buffered += block.shape[self.axis]
        if self.buffered >= self.chunk:
            self.flush(final=False)

    def flush(self, final: bool) -> None:
        stop = self.buffered if final else self.buffered - self.buffered % self.chunk
        if stop == 0:
            return
        block = np.concatenate(self.parts, axis=self.axis) if len(self.parts) > 1 else self.parts[0]
        head = (slice(None),) * self.axis
        self.array[head + (slice(self.written, self.written + stop),)] = block[head + (slice(0, stop),)]
        self.parts = [block[head + (slice(stop, None),)].copy()] if stop < self.buffered else []
        self.written, self.buffered = self.written + stop, self.buffered - stop


def write_activations(model, texts, store, *, batch_tokens: int = 1024, max_length: Optional[int] = None,
                      chunk_tokens: int = 256, dtype=np.float64, overwrite: bool = False,
                      blas_threads: Optional[int] = 1) -> str:
    """Run a corpus through the model once and save what the corpus statistics read to a Zarr store.

    The texts are run in forward batches of consecutive texts (at most ``batch_tokens`` padded
    tokens) and their real tokens written one text after another, chunked by (one layer,
    ``chunk_tokens`` tokens). :func:`attngeom.corpus_statistics` of the store gives the
    statistics of the direct run (to rounding) without the model, as often as wanted.

    Parameters
    ----------
    model : Model or str or path-like
        A loaded :class:`attngeom.models.Model`, or a checkpoint folder / name.
    texts : sequence of str or of 1-D int arrays
        The corpus (as for :func:`attngeom.corpus_statistics`); empty texts are skipped.
    store : str or path-like
        The folder of the new Zarr store.
    batch_tokens : int, default 1024
        Padded tokens per forward pass; texts are truncated to this length (and to
        ``max_length`` and the model's position table).
    max_length : int, optional
        Truncate every text to this many tokens.
    chunk_tokens : int, default 256
        Tokens per chunk of q, k and attention_inputs. A chunk of the ragged ``attentions``
        holds about as many texts' rows: n_heads x chunk_tokens x (S / N) values.
    dtype : {np.float64, np.float32}, default np.float64
        The forward pass's dtype, and the stored one.
    overwrite : bool, default False
        Replace an existing activation store at ``store`` (other files are never replaced).
    blas_threads : int, optional
        Threads of NumPy's BLAS during the forward passes, restored afterwards (default 1; see
        :func:`attngeom.corpus_statistics`); None leaves BLAS as it is.

    Returns
    -------
    str
        The store's path.

    Raises
    ------
    ValueError
        For texts without tokens or token ids outside the vocabulary, a bad dtype, an
        existing ``store`` without ``overwrite``, or an existing path that is not a store.

    Examples
    --------
    >>> folder = ag.models.planted_induction_model("m", vocab_size=8, n_heads=2, d_head=16, n_positions=12)
    >>> path = ag.write_activations(folder, [np.array([1, 2, 3, 1]), np.array([4, 5])], "acts.zarr")
    >>> ag.corpus_statistics(path, statistics=("radius",)).n_tokens
    6
    """
    from ..models import Model, load_model
    from .partitions import blas_limit, token_ids

    batch_tokens = count("batch_tokens", batch_tokens, type_error=True)
    blas_threads = count("blas_threads", blas_threads, allow_none=True, type_error=True)
    max_length = count("max_length", max_length, allow_none=True, type_error=True)
    chunk_tokens = count("chunk_tokens", chunk_tokens, type_error=True)
    dt = float_dtype("dtype", dtype)
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(f"store must be a path, got {type(store).__name__}")
    store = os.fspath(store)
    if os.path.exists(store) and not overwrite:
        raise ValueError(f"store {store!r} exists; pass overwrite=True to replace it")
    if os.path.exists(store) and not is_store(store):
        raise ValueError(f"store {store!r} exists and is not an activation store; it is not replaced")
    if isinstance(model, Model):
        m = model
    elif isinstance(model, (str, os.PathLike)):
        m = load_model(model)
    else:
        raise TypeError(f"model must be a Model or a checkpoint path, got {type(model).__name__}")
    limit = min(v for v in (batch_tokens, max_length, m.max_length) if v is not None)
    ids = token_ids(m, texts, limit)
    lengths = np.array([len(a) for a in ids], dtype=np.int64)
    N, n_max = int(lengths.sum()), int(lengths.max())
    a = m.arch
    L, H, d, D = a.n_layers, a.n_heads, a.d_head, a.d_model
    zarr = _zarr()
    root = zarr.open_group(store, mode="w")
    c = min(chunk_tokens, N)
    offsets = np.concatenate([[0], np.cumsum(lengths ** 2)])  # of each text's block in the ragged attentions
    S = int(offsets[-1])
    ca = min(S, c * max(1, round(S / N)))
    out = {
        "q": _Appender(root.create_array("q", shape=(L, H, N, d), chunks=(1, H, c, d), dtype=dt), 2),
        "k": _Appender(root.create_array("k", shape=(L, H, N, d), chunks=(1, H, c, d), dtype=dt), 2),
        "attentions": _Appender(root.create_array("attentions", shape=(L, H, S), chunks=(1, H, ca), dtype=dt), 2),
        "attention_inputs": _Appender(root.create_array("attention_inputs", shape=(L, N, D), chunks=(1, c, D),
                                                        dtype=dt), 1),
        "log_z": _Appender(root.create_array("log_z", shape=(L, H, N), chunks=(1, H, c), dtype=dt), 2),
    }
    root.create_array("lengths", shape=lengths.shape, dtype=np.int64)[:] = lengths
    root.create_array("attention_offsets", shape=offsets.shape, dtype=np.int64)[:] = offsets
    with blas_limit(blas_threads):
        scale = None
        start = 0
        while start < len(ids):
            stop = start + 1
            while stop < len(ids) and (stop - start + 1) * int(lengths[start:stop + 1].max()) <= batch_tokens:
                stop += 1
            group = lengths[start:stop]
            n = int(group.max())
            tok = np.zeros((len(group), n), dtype=np.int64)
            mask = np.zeros((len(group), n), dtype=bool)
            for r, t in enumerate(ids[start:stop]):
                tok[r, :len(t)], mask[r, :len(t)] = t, True
            f = m.forward(tok, attention_mask=mask, dtype=dt,
                          keep=("q", "k", "pattern", "attn_in", "attention_stats"))
            if scale is None:
                scale = np.asarray(f.scale, np.float64)
            for r, ln in enumerate(group):
                ln = int(ln)
                out["q"].append(np.asarray(f.q[:, r, :, :ln], dt))
                out["k"].append(np.asarray(f.k[:, r, :, :ln], dt))
                out["attentions"].append(np.asarray(f.pattern[:, r, :, :ln, :ln], dt).reshape(L, H, ln * ln))
                out["attention_inputs"].append(np.asarray(f.attn_in[:, r, :ln], dt))
                out["log_z"].append(np.asarray(f.attention_stats.log_z[:, r, :, :ln], dt))
            start = stop
        for appender in out.values():
            appender.flush(final=True)
    root.create_array("scale", shape=(L,), dtype=np.float64)[:] = scale
    if a.family != "llama":
        W_K = np.asarray(m.heads.W_K, np.float64)
        root.create_array("W_K", shape=W_K.shape, dtype=np.float64)[:] = W_K
    root.attrs.update({"format": FORMAT, "version": VERSION, "dtype": dt.name, "batch_tokens": batch_tokens,
                       "model": {"path": str(m.path), "family": a.family, "n_layers": L, "n_heads": H,
                                 "d_model": D, "d_head": d}})
    return store


def _store_partition(q, k, attentions, attention_inputs, log_z, lengths, scale, protos, batch_tokens: int) -> dict:
    """The states of `protos` over one partition of a store: arrays of its tokens (whole texts),
    the attentions ragged (each text's (n, n) block flattened, text after text)."""
    from .partitions import batches

    offsets = np.concatenate([[0], np.cumsum(lengths)])
    blocks = np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64) ** 2)])
    states = {s.name: s.empty() for s in protos}
    L, H, _, d = q.shape
    D = attention_inputs.shape[-1]
    for group in batches([range(int(n)) for n in lengths], batch_tokens):
        lens = np.array([int(lengths[i]) for i in group])
        b, n = len(group), int(lens.max())
        f = SimpleNamespace(q=np.zeros((L, b, H, n, d), q.dtype), k=np.zeros((L, b, H, n, d), k.dtype),
                            pattern=np.zeros((L, b, H, n, n), attentions.dtype),
                            attn_in=np.zeros((L, b, n, D), attention_inputs.dtype), scale=scale,
                            positions=np.zeros((b, n), np.int64), attention_stats=None)
        lz = np.full((L, b, H, n), -np.inf, log_z.dtype)
        for r, i in enumerate(group):
            o, ln = int(offsets[i]), int(lens[r])
            f.q[:, r, :, :ln] = q[:, :, o:o + ln]
            f.k[:, r, :, :ln] = k[:, :, o:o + ln]
            a = int(blocks[i])
            f.pattern[:, r, :, :ln, :ln] = attentions[:, :, a:a + ln * ln].reshape(L, H, ln, ln)
            f.attn_in[:, r, :ln] = attention_inputs[:, o:o + ln]
            lz[:, r, :, :ln] = log_z[:, :, o:o + ln]
        if any(s.fields is None or "attention_stats" in s.fields for s in protos):
            f.attention_stats = stats_from_weights(f.pattern, lz)
        batch = Batch(f, lens)
        for s in states.values():
            s.update(batch)
    return states


def store_statistics(store, protos, *, batch_tokens: Optional[int] = None, partitions=None, client=None,
                     blas_threads: Optional[int] = 1):
    """(info, n_texts, n_tokens, n_partitions, results, merged states) of a store: the partitions
    are dask.array slices of the store (whole texts), each turned into states by one task,
    folded in partition order by merge tasks (as :func:`attngeom.corpus_statistics` does); run
    on `client`, or in-process (synchronously, BLAS limited to `blas_threads`)."""
    import dask
    import dask.array as da

    from .partitions import blas_limit, merge_states, partition_bounds, results

    path = os.fspath(store)
    root = _zarr().open_group(path, mode="r")
    attrs = dict(root.attrs)
    batch_tokens = count("batch_tokens", int(attrs["batch_tokens"]) if batch_tokens is None else batch_tokens,
                         type_error=True)
    if attrs.get("version") != VERSION:
        raise ValueError(f"store {path!r} has format version {attrs.get('version')}, this attngeom reads version "
                         f"{VERSION}; write it again with ag.write_activations")
    lengths = np.asarray(root["lengths"][:], np.int64)
    blocks = np.asarray(root["attention_offsets"][:], np.int64)
    scale = np.asarray(root["scale"][:], np.float64)
    W_K = np.asarray(root["W_K"][:]) if "W_K" in root else None
    workers = 0
    if client is not None:
        if not hasattr(client, "compute") or not hasattr(client, "scheduler_info"):
            raise TypeError(f"client must be a distributed.Client, got {type(client).__name__}")
        workers = len(client.scheduler_info().get("workers", {}))
    if partitions is None:  # about one forward batch of tokens per partition
        partitions = min(len(lengths), max(1, -(-int(lengths.sum()) // batch_tokens), 2 * workers))
    bounds = partition_bounds(lengths, partitions, batch_tokens, workers)
    arrays = {key: da.from_zarr(path, component=key) for key in _FIELDS}
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    part = dask.delayed(_store_partition, pure=True)
    merge = dask.delayed(merge_states, pure=True)
    merged = None
    for ta, tb in bounds:
        a, b = int(offsets[ta]), int(offsets[tb])
        states = part(arrays["q"][:, :, a:b], arrays["k"][:, :, a:b],
                      arrays["attentions"][:, :, int(blocks[ta]):int(blocks[tb])],
                      arrays["attention_inputs"][:, a:b], arrays["log_z"][:, :, a:b], lengths[ta:tb], scale, protos,
                      batch_tokens)
        merged = states if merged is None else merge(merged, states)
    if client is None:
        with blas_limit(count("blas_threads", blas_threads, allow_none=True, type_error=True)):
            (merged,) = dask.compute(merged, scheduler="sync")
    else:
        merged = client.compute(merged).result()
    info = dict(attrs["model"], store=path)
    results = results(merged, info["d_head"], W_K)
    return info, len(lengths), int(lengths.sum()), len(bounds), results, merged
