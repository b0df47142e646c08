"""How a corpus is cut into work and put back together: token ids of the texts, partitions
of consecutive texts, forward batches within a partition, merging the partitions' states,
the statistics' results and the BLAS thread limit of in-process runs. Shared by the
model-driven run (:mod:`.run`) and the activation-store run (:mod:`.store`)."""
from __future__ import annotations

import contextlib
import copy
from typing import Dict, List, Sequence

import numpy as np

from .._operands import check_token_ids, count
from .protocol import Statistic


def token_ids(model, texts, limit: int) -> List[np.ndarray]:
    """Token ids of every text (str through the model's tokenizer, or integer sequences),
    truncated to `limit`; empty texts dropped."""
    try:
        if isinstance(texts, (str, bytes)):
            raise TypeError
        len(texts)
        texts = list(texts)
    except TypeError:
        raise TypeError(f"texts must be a sequence of strings or token id arrays, got {type(texts).__name__}") \
            from None
    out = []
    V = model.arch.vocab_size
    for i, t in enumerate(texts):
        if isinstance(t, str):
            try:
                ids = np.asarray(model.tokenize(t)[0], dtype=np.int64)
            except ValueError as exc:
                raise ValueError(f"texts[{i}]: {exc}") from None
        else:
            a = np.asarray(t) if not isinstance(t, bytes) else np.asarray([])
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise ValueError(f"texts[{i}] must be a string or a 1-D integer array of token ids, got "
                                 f"shape {a.shape}, dtype {a.dtype}")
            ids = a.astype(np.int64)
            check_token_ids(f"texts[{i}]: token ids", ids, V)
        if ids.size:
            out.append(ids[:limit])
    if not out:
        raise ValueError("texts: no text has a token")
    return out


def partition_bounds(lengths: np.ndarray, partitions, batch_tokens: int, workers: int) -> List[tuple]:
    """[(start, stop)] of consecutive texts: `partitions` sizes in texts, a number of
    partitions of about equal tokens, or by default about 8 forward batches each (at least 2
    per worker on a cluster)."""
    n = len(lengths)
    if partitions is not None and not isinstance(partitions, (int, np.integer)):
        try:
            sizes = [int(s) for s in partitions]
        except (TypeError, ValueError):
            raise TypeError(f"partitions must be an int or a sequence of sizes, got {type(partitions).__name__}") \
                from None
        if any(s < 1 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"partitions sizes must be positive and add up to the {n} texts with tokens, got "
                             f"{sizes}")
        stops = np.cumsum(sizes)
        return [(int(a), int(b)) for a, b in zip(np.concatenate([[0], stops[:-1]]), stops)]
    if partitions is None:
        parts = max(1, -(-int(lengths.sum()) // (8 * batch_tokens)), 2 * workers)
    else:
        parts = count("partitions", partitions)
    parts = min(parts, n)
    cum = np.cumsum(lengths)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, parts) / parts, side="left") + 1
    cuts = np.unique(np.clip(cuts, 1, n - 1)) if n > 1 else np.array([], int)
    edges = np.concatenate([[0], cuts, [n]]).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def batches(ids: Sequence[np.ndarray], batch_tokens: int):
    """Forward batches of texts (sorted by length) with at most batch_tokens padded tokens."""
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    group: list = []
    for i in order:
        if group and (len(group) + 1) * len(ids[i]) > batch_tokens:
            yield group
            group = []
        group.append(i)
    if group:
        yield group


def merge_states(a: Dict[str, Statistic], b: Dict[str, Statistic]) -> Dict[str, Statistic]:
    """A new dict of states: a's merged with b's (neither is modified).

    Parameters
    ----------
    a, b : dict
        name -> state, as :func:`partition_states` returns.

    Returns
    -------
    dict
        name -> merged state.

    Examples
    --------
    >>> ag.corpus.merge_states({"radius": ag.corpus.RadiusStatistic()}, {"radius": ag.corpus.RadiusStatistic()})["radius"].state is None
    True
    """
    out = copy.deepcopy(a)
    for k, s in out.items():
        s.merge(b[k])
    return out


@contextlib.contextmanager
def blas_limit(threads):
    """NumPy's BLAS limited to `threads` threads inside the block (restored after); nothing when
    threads is None or threadpoolctl is not installed."""
    if threads is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is in the corpus and test extras
        yield
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def results(merged: dict, d_head: int, W_K) -> dict:
    """Each merged state's result (the radius needs d_head, the tilt's token part W_K)."""
    results = {}
    for name, s in merged.items():
        if name == "radius":
            results[name] = s.result(d_head=d_head)
        elif name == "tilt":
            results[name] = s.result(W_K=W_K)
        else:
            results[name] = s.result()
    return results
