"""Running corpus statistics: :func:`corpus_statistics`, in-process or on a Dask cluster.

The texts are tokenized once by the caller's process, cut into partitions of consecutive
texts, and each partition is run through the model in forward batches of at most
``batch_tokens`` (padded) tokens, updating a fresh state of every statistic. The partitions'
states are folded into one in partition order, ((s_0 + s_1) + s_2) + ..., as they finish, so
at most a few states exist at any time however long the corpus is, and the result does not
depend on timing (in-process and on a cluster the same merges run in the same order). With a
``distributed.Client`` the partitions are tasks on the workers; each worker process loads the
model once (weights memory-mapped) and keeps it for the next partitions; the merges are tasks
of a higher priority than the partitions, so each runs as soon as its two inputs exist. With
``state_dir`` every finished partition's states are pickled there, and a run over the same
corpus, model and statistics resumes from them.

An in-process run limits NumPy's BLAS to ``blas_threads`` threads (default 1, as Dask's
workers run): the forward passes and the statistics are many small matrix products, which a
BLAS thread pool does not speed up; its threads spin between the products, and on cores
shared with other work they make a run several times slower.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np

from .._durable import read_checked, write_checked
from .._operands import count
from ..errors import DamagedFile
from .cumulants import CumulantStatistic
from .partitions import batches, blas_limit, merge_states, partition_bounds, results, token_ids
from .profile import ProfileStatistic
from .protocol import Batch, Statistic
from .radius import RadiusStatistic
from .result import CorpusStatistics
from .routing import RoutingStatistic
from .tilt import TiltStatistic
from .whiteness import WhitenessStatistic

STATISTICS = {"radius": RadiusStatistic, "tilt": TiltStatistic, "routing": RoutingStatistic,
              "cumulants": CumulantStatistic, "whiteness": WhitenessStatistic, "profile": ProfileStatistic}
DEFAULT_STATISTICS = tuple(STATISTICS)

_MODELS: dict = {}  # the models a worker process has loaded, by path


def _worker_model(path: str):
    """The model at `path`, loaded once per process (weights memory-mapped)."""
    if path not in _MODELS:
        from ..models import load_model

        _MODELS[path] = load_model(path)
    return _MODELS[path]


def _check_statistics(statistics) -> List[Statistic]:
    if isinstance(statistics, (str, Statistic)):
        statistics = (statistics,)
    try:
        items = list(statistics)
    except TypeError:
        raise TypeError(f"statistics must be a sequence of names {DEFAULT_STATISTICS} or Statistic objects, "
                        f"got {type(statistics).__name__}") from None
    if not items:
        raise ValueError("statistics must name at least one statistic")
    out = []
    for s in items:
        if isinstance(s, str):
            if s not in STATISTICS:
                raise ValueError(f"statistics: unknown statistic {s!r}; choose from {DEFAULT_STATISTICS}")
            out.append(STATISTICS[s]())
        elif isinstance(s, Statistic):
            out.append(s.empty())
        else:
            raise TypeError(f"statistics must hold names or Statistic objects, got {type(s).__name__}")
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"statistics names a statistic twice: {names}")
    return out


def partition_states(model, ids: Sequence[np.ndarray], statistics: Sequence[Statistic], batch_tokens: int,
                     dtype=np.float64) -> Dict[str, Statistic]:
    """The states of `statistics` (fresh copies) over one partition of token id arrays.

    Parameters
    ----------
    model : Model or str
        The model, or its checkpoint path (loaded once per process).
    ids : sequence of ndarray of int
        The partition's texts as token ids.
    statistics : sequence of Statistic
        Prototypes (their settings are used, not their data).
    batch_tokens : int
        Padded tokens per forward batch.
    dtype : {np.float64, np.float32}, default np.float64
        The forward pass's dtype.

    Returns
    -------
    dict
        name -> state.

    Examples
    --------
    >>> states = ag.corpus.partition_states("model_dir", [np.array([1, 2, 3])], [ag.corpus.RadiusStatistic()], 64)  # doctest: +SKIP
    """
    m = _worker_model(model) if isinstance(model, str) else model
    states = {s.name: s.empty() for s in statistics}
    # the forward keeps only what the statistics read (and its defaults when one does not say)
    keep = {f for s in statistics for f in (s.fields or ())}
    if any(s.fields is None for s in statistics):
        from ..models.nn.forward import KEEP_DEFAULT

        keep |= set(KEEP_DEFAULT)
    keep = sorted(keep)
    for group in batches(ids, batch_tokens):
        lengths = np.array([len(ids[i]) for i in group])
        n = int(lengths.max())
        tok = np.zeros((len(group), n), dtype=np.int64)
        mask = np.zeros((len(group), n), dtype=bool)
        for r, i in enumerate(group):
            tok[r, :lengths[r]] = ids[i]
            mask[r, :lengths[r]] = True
        f = m.forward(tok, attention_mask=mask, dtype=dtype, keep=keep)
        batch = Batch(f, lengths)
        for s in states.values():
            s.update(batch)
    return states


def _fingerprint(path: str, ids, protos, bounds, batch_tokens, dtype) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([path, [(s.name, type(s).__qualname__) for s in protos], bounds, batch_tokens,
                         dtype if isinstance(dtype, str) else np.dtype(dtype).name]).encode())
    for s in protos:
        h.update(pickle.dumps({k: np.asarray(v).tolist() for k, v in s.config().items()}))
    for a in ids:
        h.update(len(a).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(a, dtype="<i8").tobytes())
    return h.hexdigest()


class _StateFolder:
    """Per-partition pickled states under a folder, valid for one run's fingerprint.

    Each state file is written whole or not at all, with its digest (:mod:`attngeom._durable`):
    a damaged one is named in a warning and its partition recomputed. One run at a time: the
    folder is locked (``flock`` on ``lock``) until :meth:`close`, and a second run on it is
    refused with a one-line error instead of both writing the same files."""

    def __init__(self, folder: Optional[str], fingerprint: str):
        self.folder = None if folder is None else os.fspath(folder)
        self._lock = None
        if self.folder is None:
            return
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise ValueError(f"state_dir {self.folder!r} exists and is not a folder")
        os.makedirs(self.folder, exist_ok=True)
        self._acquire()
        manifest = os.path.join(self.folder, "manifest.json")
        if os.path.exists(manifest):
            with open(manifest) as f:
                if json.load(f).get("fingerprint") != fingerprint:
                    self.close()
                    raise ValueError(f"state_dir {self.folder!r} holds the states of another run (other texts, model, "
                                     "statistics or partitions); choose a new folder")
        else:
            tmp = f"{manifest}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"fingerprint": fingerprint}, f)
            os.replace(tmp, manifest)

    def _acquire(self) -> None:
        import fcntl

        lock = open(os.path.join(self.folder, "lock"), "a+")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise ValueError(f"state_dir {self.folder!r} is in use by another corpus run ({holder}); wait for it to "
                             "finish or choose another folder") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}")
        lock.flush()
        self._lock = lock

    def close(self) -> None:
        """Release the folder's lock (also released when the process ends)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _path(self, i: int) -> str:
        return os.path.join(self.folder, f"partition_{i:06d}.pkl")

    def has(self, i: int) -> bool:
        return self.folder is not None and os.path.exists(self._path(i))

    def load(self, i: int):
        """Partition i's saved states, or None (not saved, or damaged: then recomputed)."""
        if not self.has(i):
            return None
        try:
            return pickle.loads(read_checked(self._path(i)))
        except (DamagedFile, pickle.UnpicklingError, EOFError) as exc:
            warnings.warn(f"state_dir: the saved states of partition {i} cannot be used ({exc}); partition {i} is "
                          "recomputed", RuntimeWarning, stacklevel=2)
            os.remove(self._path(i))
            return None

    def save(self, i: int, states) -> None:
        if self.folder is not None:
            write_checked(self._path(i), pickle.dumps(states))


def _progress_bar(progress, total: int, done: int):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the test and plot extras
        return None
    return tqdm(total=total, initial=done, unit="partition", desc="corpus")


def corpus_statistics(model, texts=None, *, statistics=DEFAULT_STATISTICS, batch_tokens: Optional[int] = None,
                      partitions=None, max_length: Optional[int] = None, client=None, state_dir=None,
                      progress: bool = False, dtype=np.float64, blas_threads: Optional[int] = 1) -> CorpusStatistics:
    """Mergeable statistics of every attention head over a corpus, in-process or on Dask.

    The per-head statistics of Laplace-Radon s.6, s.10, s.13.4 and Whitened self-attention
    s.6 accumulated over any number of texts in O(d_head^2) memory per head: ``"radius"``
    (tau = scale ``|q|``: moments, histogram, chi prediction, eq. 62), ``"tilt"`` (tilt
    coverage, eq. 20-23, and the token covariance of the numerator directions W_K u, eq.
    22), ``"routing"`` (row entropy, largest weight, effective rank of P), ``"cumulants"``
    (mean and variance of the projected keys under the Gibbs weights, eq. 51) and
    ``"whiteness"`` (Psi and rho of each layer's input, eq. 10-14). Partitions of the corpus
    are merged exactly up to rounding (Chan-style updates, fixed histogram edges), so the
    result does not depend on the partitioning or the cluster beyond 1e-12 relative; they are
    folded in partition order as they finish, so memory does not grow with the corpus.

    Parameters
    ----------
    model : Model or str or path-like
        A loaded :class:`attngeom.models.Model`, or a checkpoint folder / name for
        :func:`attngeom.load_model` (a cluster needs a checkpoint on disk); or an activation
        store written by :func:`attngeom.write_activations` (then without texts: the
        statistics are computed from the store with dask.array, in partitions of whole texts;
        ``batch_tokens`` defaults to the store's, ``max_length``, ``state_dir`` and ``dtype``
        do not apply).
    texts : sequence of str or of 1-D int arrays, optional
        The corpus: texts (tokenized with the checkpoint's tokenizer.json) or token ids.
        Empty texts are skipped. Required unless ``model`` is an activation store.
    statistics : sequence of str or Statistic, default all six
        Names from ("radius", "tilt", "routing", "cumulants", "whiteness", "profile"), or
        :class:`attngeom.corpus.Statistic` objects (their settings, e.g. histogram edges).
        The forward pass keeps only the fields the statistics read (their ``fields``).
    batch_tokens : int, optional
        Padded tokens per forward pass (default 1024); texts are truncated to this length (and to
        ``max_length`` and the model's position table).
    partitions : int or sequence of int, optional
        The number of partitions (about equal in tokens), or their sizes in texts (adding up
        to the number of non-empty texts). Default about 8 forward batches per partition,
        and at least 2 per worker with a client.
    max_length : int, optional
        Truncate every text to this many tokens.
    client : distributed.Client, optional
        Run the partitions as tasks on this cluster (each worker loads the model once);
        default in-process. At most two partitions per worker run ahead of the fold. Dask's
        statistical profiler keeps about 1000 s of call stacks in every worker, which grows
        the workers' memory during a long run; ``attngeom corpus --workers`` starts its
        workers without it (config ``distributed.worker.profile.enabled: False``).
    state_dir : str or path-like, optional
        Save every finished partition's states here; a rerun with the same arguments loads
        them and only runs the partitions that are missing (resume after an interruption or
        a killed process). Each file is written atomically with its SHA-256 digest: a damaged
        one is named in a RuntimeWarning and its partition recomputed. The folder is locked
        while a run uses it: a second run on it raises ValueError.
    progress : bool, default False
        A tqdm progress bar over partitions.
    dtype : {np.float64, np.float32, "bfloat16"}, default np.float64
        The forward pass's dtype (:meth:`attngeom.models.Model.forward`; statistics always
        accumulate in float64).
    blas_threads : int, optional
        Threads of NumPy's BLAS during an in-process run (and in-process reads of a store),
        restored afterwards; default 1, the setting of Dask's workers. None leaves BLAS as it
        is. Needs ``threadpoolctl`` (in the corpus extra; without it BLAS is left as it is).
        Cluster workers are not affected.

    Returns
    -------
    CorpusStatistics
        ``statistics[name]`` holds each statistic's arrays, (n_layers, n_heads) per head;
        ``table()``, ``summary()``, ``to_json()``, ``plot_layers()``.

    Raises
    ------
    ValueError
        For unknown statistics, texts without tokens or with token ids outside the
        vocabulary, partition sizes that do not add up, a model in memory with a client,
        and a state_dir holding another run's states.

    Examples
    --------
    >>> folder = ag.models.planted_induction_model("m", vocab_size=8, n_heads=2, d_head=16, n_positions=12)
    >>> texts = [np.array([1, 2, 3, 1, 2, 3]), np.array([4, 5, 6, 4])]
    >>> res = ag.corpus_statistics(folder, texts, statistics=("radius", "routing"))
    >>> res.n_tokens, res.statistics["radius"]["mean"].shape
    (10, (2, 2))
    """
    from ..models import Model, load_model

    protos = _check_statistics(statistics)
    if texts is None:
        from .store import is_store, store_statistics

        if not is_store(model):
            raise ValueError("texts are required unless model is an activation store (ag.write_activations)")
        if state_dir is not None or max_length is not None:
            raise ValueError("state_dir and max_length do not apply to an activation store")
        return CorpusStatistics(*store_statistics(model, protos, batch_tokens=batch_tokens, partitions=partitions,
                                                  client=client, blas_threads=blas_threads))
    batch_tokens = count("batch_tokens", 1024 if batch_tokens is None else batch_tokens, type_error=True)
    blas_threads = count("blas_threads", blas_threads, allow_none=True, type_error=True)
    max_length = count("max_length", max_length, allow_none=True, type_error=True)
    from ..models.nn.products import BFLOAT16, compute_dtype

    act, bf16 = compute_dtype(dtype)
    dt = BFLOAT16 if bf16 else act
    if isinstance(model, Model):
        m = model
        path = m.path if os.path.exists(m.path) else None
    elif isinstance(model, (str, os.PathLike)):
        m = load_model(model)
        path = m.path
    else:
        raise TypeError(f"model must be a Model or a checkpoint path, got {type(model).__name__}")
    if client is not None and path is None:
        raise ValueError("model: a model held in memory cannot be sent to cluster workers; pass its checkpoint "
                         "folder instead")
    limit = min(v for v in (batch_tokens, max_length, m.max_length) if v is not None)
    ids = token_ids(m, texts, limit)
    lengths = np.array([len(a) for a in ids])
    workers = 0
    if client is not None:
        if not hasattr(client, "map") or not hasattr(client, "submit"):
            raise TypeError(f"client must be a distributed.Client, got {type(client).__name__}")
        workers = len(client.scheduler_info().get("workers", {}))
    bounds = partition_bounds(lengths, partitions, batch_tokens, workers)
    folder = _StateFolder(state_dir, _fingerprint(str(path or m.path), ids, protos, bounds, batch_tokens, dt))
    done = sum(folder.has(i) for i in range(len(bounds)))
    bar = _progress_bar(progress, len(bounds), done)
    try:
        if client is None:
            with blas_limit(blas_threads):
                merged = _in_process(m, ids, bounds, protos, batch_tokens, dt, folder, bar)
        else:
            merged = _on_cluster(client, str(path), ids, bounds, protos, batch_tokens, dt, folder, bar, workers)
    finally:
        folder.close()
        if bar is not None:
            bar.close()
    a = m.arch
    info = {"path": str(m.path), "family": a.family, "n_layers": a.n_layers, "n_heads": a.n_heads,
            "d_model": a.d_model, "d_head": a.d_head}
    W_K = None if a.family == "llama" else m.heads.W_K
    return CorpusStatistics(info, len(ids), int(lengths.sum()), len(bounds), results(merged, a.d_head, W_K), merged)


def _in_process(m, ids, bounds, protos, batch_tokens, dt, folder, bar):
    """Every partition in order (loaded when saved), folded into one running state."""
    merged = None
    for i, (a, b) in enumerate(bounds):
        states = folder.load(i)
        if states is None:
            states = partition_states(m, ids[a:b], protos, batch_tokens, dt)
            folder.save(i, states)
            if bar is not None:
                bar.update(1)
        merged = states if merged is None else merge_states(merged, states)
    return merged


def _on_cluster(client, path, ids, bounds, protos, batch_tokens, dt, folder, bar, workers):
    """Partitions as tasks, folded in partition order by merge tasks that outrank them; finished
    partitions saved (with a state_dir). At most ``2 * workers`` partitions run ahead of the
    fold: a slow partition holds up the fold, and without the bound the partitions after it
    would pile up on the workers, one state each, waiting for their merge. Only futures of
    unfinished tasks (and the last merge) are held here, so the cluster releases every state
    once merged: the workers hold the running state and a few partitions, not one state per
    partition."""
    from distributed import as_completed

    window = 2 * max(workers, 1)
    done = as_completed()
    leaves: dict = {}  # key -> partition index, of the unfinished partitions to save or count
    merges: set = set()  # keys of the unfinished merges
    merged, pending, nxt = None, 0, 0

    def submit_next():
        nonlocal merged, pending, nxt
        i, (a, b) = nxt, bounds[nxt]
        nxt += 1
        states = folder.load(i)  # a loaded state goes to its merge task as an argument
        if states is None:
            states = client.submit(partition_states, path, ids[a:b], protos, batch_tokens, dt, pure=False,
                                   priority=-i)
            if folder.folder is not None or bar is not None:
                leaves[states.key] = i
                done.add(states)
        if merged is None:
            merged = states
            return
        merged = client.submit(merge_states, merged, states, pure=False, priority=len(bounds))
        merges.add(merged.key)
        pending += 1
        done.add(merged)

    while nxt < len(bounds) and pending < window:
        submit_next()
    for fut in done:
        if fut.key in leaves:
            i = leaves.pop(fut.key)
            if folder.folder is not None:
                folder.save(i, fut.result())
            if bar is not None:
                bar.update(1)
        elif fut.key in merges:
            merges.discard(fut.key)
            pending -= 1
            while nxt < len(bounds) and pending < window:
                submit_next()
        if fut is not merged:
            fut.release()
        del fut
    return merged.result() if hasattr(merged, "result") else merged
