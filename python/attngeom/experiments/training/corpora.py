"""The training experiment's corpora: the standard library's docstrings, a Markov chain of known entropy rate, a
text file; as character ids split 90/10."""
from __future__ import annotations

import ast
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import List

import numpy as np

from .config import TrainingConfig


def stdlib_docstrings(*, max_chars: int = 0, cache: bool = True) -> str:
    """The docstrings of the running Python's standard library, as one text (the default corpus).

    Every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, in sorted path order,
    outside ``test``/``tests``/``idle_test`` folders and ``site-packages``; from each file the
    module, class and function docstrings (``ast.get_docstring``, cleaned) in source order,
    separated by blank lines. The text depends only on the Python version's standard library;
    it is cached under ``$XDG_CACHE_HOME/attngeom`` (default ``~/.cache/attngeom``).

    Parameters
    ----------
    max_chars : int, default 0
        Keep the first max_chars characters (0: all).
    cache : bool, default True
        Read and write the cache file.

    Returns
    -------
    str
        The corpus.

    Examples
    --------
    >>> from attngeom.experiments.training import stdlib_docstrings
    >>> len(stdlib_docstrings(max_chars=1000))
    1000
    """
    version = "{}.{}.{}".format(*sys.version_info[:3])
    cache_root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(cache_root, "attngeom", f"stdlib_docstrings_py{version}.txt")
    text = None
    if cache and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    if text is None:
        root = sysconfig.get_paths()["stdlib"]
        skip = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in skip)
            files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
        parts = []
        for file in sorted(os.path.relpath(f, root) for f in files):
            try:
                with open(os.path.join(root, file), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=True)
                    if doc:
                        parts.append(doc)
        text = "\n\n".join(parts) + "\n"
        if cache:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
    return text[:max_chars] if max_chars else text


@dataclass
class MarkovSource:
    """A random k-th order Markov chain over a small alphabet, with its exact entropy rate.

    ``transition[s]`` is the distribution of the next symbol after the k-gram with index s
    (base-``alphabet`` digits, oldest first); ``stationary`` is the stationary distribution of
    the k-grams; ``entropy_rate`` = sum_s stationary[s] H(transition[s]) in nats per symbol,
    the smallest mean cross-entropy any predictor with at least k symbols of context reaches.

    Example: ``src = MarkovSource.random(8, 2, seed=0); text = src.sample(10_000, seed=1)``
    """

    alphabet: int
    order: int
    transition: np.ndarray  # (alphabet^order, alphabet)
    stationary: np.ndarray  # (alphabet^order,)
    entropy_rate: float

    SYMBOLS = "abcdefghijklmnopqrstuvwxyz0123456789"

    @classmethod
    def random(cls, alphabet: int = 8, order: int = 2, *, concentration: float = 0.3, seed: int = 0) -> "MarkovSource":
        """Transition rows drawn from Dirichlet(concentration); the entropy rate by power iteration.

        Parameters
        ----------
        alphabet : int, default 8
            Number of symbols (at most 36).
        order : int, default 2
            k, the number of previous symbols the next one depends on.
        concentration : float, default 0.3
            Dirichlet concentration: small values give peaked rows (low entropy).
        seed : int, default 0
            Seed of the transition rows.

        Returns
        -------
        MarkovSource
            The chain.

        Examples
        --------
        >>> from attngeom.experiments.training import MarkovSource
        >>> src = MarkovSource.random(4, 1, seed=0)
        >>> bool(0 < src.entropy_rate < np.log(4))
        True
        """
        if not (2 <= alphabet <= len(cls.SYMBOLS)) or order < 1 or alphabet ** order > 1 << 16:
            raise ValueError(f"alphabet must be in 2..{len(cls.SYMBOLS)} and order >= 1 with alphabet^order <= "
                             f"65536, got alphabet={alphabet}, order={order}")
        rng = np.random.default_rng(seed)
        n_states = alphabet ** order
        P = rng.dirichlet(np.full(alphabet, concentration), size=n_states)
        P = np.maximum(P, 1e-12)
        P /= P.sum(1, keepdims=True)
        # k-gram s = (s_1 .. s_k) -> (s_2 .. s_k, c): index (s * alphabet + c) mod n_states
        nxt = (np.arange(n_states)[:, None] * alphabet + np.arange(alphabet)[None, :]) % n_states
        pi = np.full(n_states, 1.0 / n_states)
        for _ in range(10_000):
            new = np.zeros(n_states)
            np.add.at(new, nxt.ravel(), (pi[:, None] * P).ravel())
            if np.abs(new - pi).sum() < 1e-15:
                pi = new
                break
            pi = new
        h = -np.sum(P * np.log(P), axis=1)
        return cls(alphabet, order, P, pi, float(pi @ h))

    def sample(self, n: int, *, seed: int = 0) -> str:
        """n symbols of the chain started from its stationary distribution.

        Parameters
        ----------
        n : int
            Length.
        seed : int, default 0
            Seed of the sample path.

        Returns
        -------
        str
            The text (symbols a, b, c, ...).

        Examples
        --------
        >>> from attngeom.experiments.training import MarkovSource
        >>> len(MarkovSource.random(4, 1).sample(100))
        100
        """
        rng = np.random.default_rng(seed)
        a, n_states = self.alphabet, self.transition.shape[0]
        state = int(rng.choice(n_states, p=self.stationary))
        cum = np.cumsum(self.transition, axis=1)
        u = rng.random(n)
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            c = min(int(np.searchsorted(cum[state], u[i], side="right")), a - 1)
            out[i] = c
            state = (state * a + c) % n_states
        return "".join(self.SYMBOLS[c] for c in out)


@dataclass
class CharCorpus:
    """A text as character ids, split 90/10 into training and validation (the paper's split).

    ``vocab`` lists the characters (sorted), ``train`` and ``val`` are int64 id arrays,
    ``entropy_rate`` the known loss floor in nats (synthetic sources) or NaN.

    Example: ``c = CharCorpus.from_text("hello world" * 100); c.decode(c.train[:5])``
    """

    name: str
    vocab: List[str]
    train: np.ndarray
    val: np.ndarray
    entropy_rate: float = float("nan")
    sha256: str = ""

    @classmethod
    def from_text(cls, text: str, *, name: str = "text", entropy_rate: float = float("nan"),
                  split: float = 0.9) -> "CharCorpus":
        """Character vocabulary and the first `split` of the text for training, the rest for validation.

        Parameters
        ----------
        text : str
            The corpus.
        name : str, default "text"
            A label.
        entropy_rate : float, optional
            The known loss floor (nats per character).
        split : float, default 0.9
            Training fraction.

        Returns
        -------
        CharCorpus
            The encoded corpus.

        Examples
        --------
        >>> from attngeom.experiments.training import CharCorpus
        >>> c = CharCorpus.from_text("abcabcabca" * 3)
        >>> c.vocab, len(c.train), len(c.val)
        (['a', 'b', 'c'], 27, 3)
        """
        if len(text) < 20:
            raise ValueError(f"the corpus must have at least 20 characters, got {len(text)}")
        vocab = sorted(set(text))
        lookup = {ch: i for i, ch in enumerate(vocab)}
        ids = np.fromiter((lookup[ch] for ch in text), dtype=np.int64, count=len(text))
        cut = int(round(split * len(ids)))
        return cls(name, vocab, ids[:cut], ids[cut:], float(entropy_rate),
                   hashlib.sha256(text.encode("utf-8")).hexdigest())

    def decode(self, ids) -> str:
        """The text of a sequence of ids.

        Parameters
        ----------
        ids : sequence of int
            Character ids.

        Returns
        -------
        str
            The characters.

        Examples
        --------
        >>> from attngeom.experiments.training import CharCorpus
        >>> c = CharCorpus.from_text("abcabcabca" * 3)
        >>> c.decode([2, 1, 0])
        'cba'
        """
        return "".join(self.vocab[int(i)] for i in ids)

    def check_context(self, context: int) -> "CharCorpus":
        """This corpus, when each split holds a window of context + 2 characters; ValueError otherwise."""
        if len(self.train) < context + 2 or len(self.val) < context + 2:
            raise ValueError(f"the corpus is too short for context {context}: {len(self.train)} training and "
                             f"{len(self.val)} validation characters")
        return self


def load_corpus(config: TrainingConfig) -> CharCorpus:
    """The corpus a config names ("stdlib", "markov" or a path), truncated to ``corpus_chars``.

    Parameters
    ----------
    config : TrainingConfig
        Reads corpus, corpus_chars and the markov_* fields (the chain's seed is config.seed).

    Returns
    -------
    CharCorpus
        The encoded corpus with its 90/10 split.

    Examples
    --------
    >>> from attngeom.experiments.training import TrainingConfig, load_corpus
    >>> c = load_corpus(TrainingConfig(corpus="markov", markov_chars=2000))
    >>> len(c.vocab), bool(c.entropy_rate > 0)
    (8, True)
    """
    c = config
    if c.corpus == "markov":
        src = MarkovSource.random(c.markov_alphabet, c.markov_order, concentration=c.markov_concentration,
                                  seed=c.seed)
        text = src.sample(c.markov_chars, seed=c.seed + 1)
        return CharCorpus.from_text(text, name=f"markov(alphabet={c.markov_alphabet}, order={c.markov_order})",
                                    entropy_rate=src.entropy_rate)
    if c.corpus == "stdlib":
        text = stdlib_docstrings()
        name = "Python {}.{} standard-library docstrings".format(*sys.version_info[:2])
    else:
        try:
            with open(c.corpus, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"corpus: cannot read {c.corpus!r} as UTF-8 text: {exc}") from None
        name = os.path.basename(c.corpus)
    if c.corpus_chars:
        text = text[:c.corpus_chars]
    return CharCorpus.from_text(text, name=name)


def windows(ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The windows ids[s : s + length] of every start s, as the rows of a (len(starts), length) array."""
    return ids[starts[:, None] + np.arange(length)[None, :]]
