"""Activations on disk: a corpus run through the model once (:func:`write_activations`, a Zarr
store) and analysed many times (:func:`attngeom.corpus_statistics` of the store, with
dask.array).

The store holds, for every token of every text (texts one after the other, ``N`` tokens in
all), what the statistics read from a forward pass, chunked by (layer, tokens):

* ``q``, ``k``: (n_layers, n_heads, N, d_head), the queries and keys as the attention uses them;
* ``attentions``: (n_layers, n_heads, N, n_max), each token's attention row over the keys of
  its own text (zero beyond the text's length; n_max is the longest text);
* ``attention_inputs``: (n_layers, N, d_model);
* ``lengths`` (n_texts,), ``scale`` (n_layers,) and, for models without rotary embedding,
  ``W_K`` (n_layers, n_heads, d_model, d_head), so results need no model.

``zarr`` and ``dask`` are imported only when a store is written or read.
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Optional

import numpy as np

from .._operands import float_dtype
from .protocol import Batch

FORMAT = "attngeom-activations"
VERSION = 1
_TOKEN_FIELDS = ("q", "k", "attentions", "attention_inputs")


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


def write_activations(model, texts, store, *, batch_tokens: int = 1024, max_length: Optional[int] = None,
                      chunk_tokens: int = 256, dtype=np.float64, overwrite: bool = False) -> str:
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
        Tokens per chunk. A chunk of ``attentions`` is n_heads x chunk_tokens x n_max values.
    dtype : {np.float64, np.float32}, default np.float64
        The forward pass's dtype, and the stored one.
    overwrite : bool, default False
        Replace an existing activation store at ``store`` (other files are never replaced).

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
    from .partitions import positive_int, token_ids

    batch_tokens = positive_int("batch_tokens", batch_tokens)
    max_length = positive_int("max_length", max_length, allow_none=True)
    chunk_tokens = positive_int("chunk_tokens", chunk_tokens)
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
    arrays = {
        "q": root.create_array("q", shape=(L, H, N, d), chunks=(1, H, c, d), dtype=dt),
        "k": root.create_array("k", shape=(L, H, N, d), chunks=(1, H, c, d), dtype=dt),
        "attentions": root.create_array("attentions", shape=(L, H, N, n_max), chunks=(1, H, c, n_max), dtype=dt),
        "attention_inputs": root.create_array("attention_inputs", shape=(L, N, D), chunks=(1, c, D), dtype=dt),
    }
    root.create_array("lengths", shape=lengths.shape, dtype=np.int64)[:] = lengths
    scale = None
    buffer = {k: [] for k in _TOKEN_FIELDS}
    written, buffered = 0, 0

    def flush(final: bool) -> None:
        nonlocal written, buffered
        stop = buffered if final else buffered - buffered % c
        if stop == 0:
            return
        for key, parts in buffer.items():
            axis = 1 if key == "attention_inputs" else 2
            block = np.concatenate(parts, axis=axis)
            index = (slice(None),) * axis + (slice(written, written + stop),)
            arrays[key][index] = np.take(block, np.arange(stop), axis=axis)
            buffer[key] = [np.take(block, np.arange(stop, block.shape[axis]), axis=axis)]
        written, buffered = written + stop, buffered - stop

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
        f = m.forward(tok, attention_mask=mask, dtype=dt)
        if scale is None:
            scale = np.asarray(f.scale, np.float64)
        for r, ln in enumerate(group):
            ln = int(ln)
            buffer["q"].append(np.asarray(f.q[:, r, :, :ln], dt))
            buffer["k"].append(np.asarray(f.k[:, r, :, :ln], dt))
            att = np.zeros((L, H, ln, n_max), dt)
            att[..., :ln] = f.attentions[:, r, :, :ln, :ln]
            buffer["attentions"].append(att)
            buffer["attention_inputs"].append(np.asarray(f.attention_inputs[:, r, :ln], dt))
            buffered += ln
        flush(final=False)
        start = stop
    flush(final=True)
    root.create_array("scale", shape=(L,), dtype=np.float64)[:] = scale
    if a.family != "llama":
        W_K = np.asarray(m.heads.W_K, np.float64)
        root.create_array("W_K", shape=W_K.shape, dtype=np.float64)[:] = W_K
    root.attrs.update({"format": FORMAT, "version": VERSION, "dtype": dt.name, "batch_tokens": batch_tokens,
                       "model": {"path": str(m.path), "family": a.family, "n_layers": L, "n_heads": H,
                                 "d_model": D, "d_head": d}})
    return store


def _store_partition(q, k, attentions, attention_inputs, lengths, scale, protos, batch_tokens: int) -> dict:
    """The states of `protos` over one partition of a store: arrays of its tokens (whole texts)."""
    from .partitions import batches

    offsets = np.concatenate([[0], np.cumsum(lengths)])
    states = {s.name: s.empty() for s in protos}
    L, H, _, d = q.shape
    D = attention_inputs.shape[-1]
    for group in batches([range(int(n)) for n in lengths], batch_tokens):
        lens = np.array([int(lengths[i]) for i in group])
        b, n = len(group), int(lens.max())
        f = SimpleNamespace(q=np.zeros((L, b, H, n, d), q.dtype), k=np.zeros((L, b, H, n, d), k.dtype),
                            attentions=np.zeros((L, b, H, n, n), attentions.dtype),
                            attention_inputs=np.zeros((L, b, n, D), attention_inputs.dtype), scale=scale)
        for r, i in enumerate(group):
            o, ln = int(offsets[i]), int(lens[r])
            f.q[:, r, :, :ln] = q[:, :, o:o + ln]
            f.k[:, r, :, :ln] = k[:, :, o:o + ln]
            f.attentions[:, r, :, :ln, :ln] = attentions[:, :, o:o + ln, :ln]
            f.attention_inputs[:, r, :ln] = attention_inputs[:, o:o + ln]
        batch = Batch(f, lens)
        for s in states.values():
            s.update(batch)
    return states


def store_statistics(store, protos, *, batch_tokens: Optional[int] = None, partitions=None, client=None):
    """(info, n_texts, n_tokens, n_partitions, results, merged states) of a store: the partitions
    are dask.array slices of the store (whole texts), each turned into states by one task,
    merged in a fixed binary tree of tasks; run on `client`, or in-process (synchronously)."""
    import dask
    import dask.array as da

    from .partitions import merge_states, partition_bounds, positive_int, results

    path = os.fspath(store)
    root = _zarr().open_group(path, mode="r")
    attrs = dict(root.attrs)
    batch_tokens = positive_int("batch_tokens", int(attrs["batch_tokens"]) if batch_tokens is None else batch_tokens)
    lengths = np.asarray(root["lengths"][:], np.int64)
    scale = np.asarray(root["scale"][:], np.float64)
    W_K = np.asarray(root["W_K"][:]) if "W_K" in root else None
    workers = 0
    if client is not None:
        if not hasattr(client, "compute") or not hasattr(client, "scheduler_info"):
            raise TypeError(f"client must be a distributed.Client, got {type(client).__name__}")
        workers = len(client.scheduler_info().get("workers", {}))
    if partitions is None:  # about one forward batch of tokens per partition (attention rows are O(n_max))
        partitions = min(len(lengths), max(1, -(-int(lengths.sum()) // batch_tokens), 2 * workers))
    bounds = partition_bounds(lengths, partitions, batch_tokens, workers)
    arrays = {key: da.from_zarr(path, component=key) for key in _TOKEN_FIELDS}
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    part = dask.delayed(_store_partition, pure=True)
    merge = dask.delayed(merge_states, pure=True)
    level = []
    for ta, tb in bounds:
        a, b = int(offsets[ta]), int(offsets[tb])
        level.append(part(arrays["q"][:, :, a:b], arrays["k"][:, :, a:b], arrays["attentions"][:, :, a:b],
                          arrays["attention_inputs"][:, a:b], lengths[ta:tb], scale, protos, batch_tokens))
    while len(level) > 1:
        level = [merge(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    if client is None:
        (merged,) = dask.compute(level[0], scheduler="sync")
    else:
        merged = client.compute(level[0]).result()
    info = dict(attrs["model"], store=path)
    results = results(merged, info["d_head"], W_K)
    return info, len(lengths), int(lengths.sum()), len(bounds), results, merged
