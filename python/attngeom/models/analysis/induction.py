"""Induction heads: the repeated-random-tokens test and K-composition with previous-token heads.

The notes' "induction circuits" (Olsson et al. 2022; Elhage et al. 2021): a previous-token
head writes "the token before me" into the residual stream, and a later induction head
matches the current token against it (K-composition), so it attends to the token right
after an earlier occurrence of the current token and copies it.

Behavioural test: a random sequence s of ``seq_len`` distinct tokens repeated ``n_repeats``
times (after an optional BOS token). For a query at copy r >= 1, index i (token s_i), the
*induction score* is its attention mass on the positions right after the earlier
occurrences of s_i (one per earlier copy: copy r' at index i + 1), averaged over all such
queries and sequences; with two copies this is TransformerLens's stripe at offset
seq_len - 1. The *previous-token score* is the mean attention P[t, t - 1] over every
position t >= 1 of the repeated part. The *duplicate-token score* is, for the same queries,
the attention mass on the earlier occurrences of s_i itself (copy r' < r at index i): the
heads that find a token's duplicates. Random heads score about 1 / (position) on each; a
perfect induction, previous-token or duplicate-token head scores 1.

The scores are those of their probe (``InductionScores.probe`` says which): on the trained
context of a small model a longer probe can score far lower. ``attngeom run induction``
measures on 4 sequences of context // 2 tokens repeated twice (its summary says so); the
default here is 50 tokens repeated twice, or fewer where the vocabulary, the position table
or the context the model was trained on (config.json's ``max_position_embeddings`` for a
rotary model) is smaller, so both probes agree on such a checkpoint.

Weights-only evidence: the K-composition scores (:func:`attngeom.composition_scores`,
mode "K") of every earlier head into every later head. For rotary models these are the
position-free part of W_Q W_K^T (the usual approximation); LayerNorm is left out, as in
Elhage et al.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from ..._operands import choice, count, generator, scalar
from ...circuits import composition_scores
from .prompt import resolve_model


@dataclass
class InductionScores:
    """Per-head induction evidence of one model (module docstring).

    Attributes
    ----------
    induction : ndarray, shape (n_layers, n_heads)
        Mean attention to the tokens after earlier occurrences of the current token.
    previous_token : ndarray, shape (n_layers, n_heads)
        Mean attention to the previous position.
    duplicate_token : ndarray, shape (n_layers, n_heads)
        Mean attention to the earlier occurrences of the current token.
    k_composition : ndarray, shape (n_layers, n_heads, n_layers, n_heads) or None
        K-composition scores of head (l1, h1) into head (l2, h2); zero unless l1 < l2.
        None for multi-head latent attention (DeepSeek-V2), whose keys pass through a norm
        and have no linear per-head W_K.
    previous_token_heads : list of (int, int)
        Heads with previous_token >= threshold.
    k_composition_with_previous : ndarray, shape (n_layers, n_heads) or None
        For every head, its largest K-composition score with a previous-token head of an
        earlier layer (0 when there is none); None with k_composition.
    threshold : float
        The previous-token threshold used.
    token_ids : ndarray of int, shape (n_sequences, n)
        The sequences the scores were measured on.
    probe : str
        The probe in words (sequences, tokens, copies, bos, seed): the scores are those of it.
    """

    induction: np.ndarray
    previous_token: np.ndarray
    k_composition: Optional[np.ndarray] = field(repr=False)
    previous_token_heads: List[Tuple[int, int]]
    k_composition_with_previous: Optional[np.ndarray]
    threshold: float
    token_ids: np.ndarray = field(repr=False)
    duplicate_token: Optional[np.ndarray] = field(default=None, repr=False)
    probe: str = ""

    def __repr__(self) -> str:
        L, H = self.induction.shape
        best = ", ".join(f"L{l}H{h} {v:.3f}" for l, h, v in self.top(3))
        prev = ", ".join(f"L{l}H{h}" for l, h in self.previous_token_heads) or "none"
        return (f"InductionScores({L} layers x {H} heads; induction: {best}; previous-token heads "
                f"(>= {self.threshold:g}): {prev}" + (f"; probe: {self.probe}" if self.probe else "") + ")")

    def top(self, n: int = 5, *, by: str = "induction") -> List[Tuple[int, int, float]]:
        """The n highest-scoring heads as (layer, head, score), best first.

        Parameters
        ----------
        n : int, default 5
            How many heads.
        by : {"induction", "previous_token", "duplicate_token", "k_composition_with_previous"}, default "induction"
            Which score ranks them.

        Returns
        -------
        list of (int, int, float)
            (layer, head, score).

        Examples
        --------
        >>> from attngeom.models import planted_induction_model
        >>> s = ag.induction_scores(planted_induction_model("planted"), seq_len=10, bos=0)
        >>> s.top(1)[0][:2]
        (1, 0)
        """
        choice("by", by, ("induction", "previous_token", "duplicate_token", "k_composition_with_previous"),
               "'induction', 'previous_token', 'duplicate_token' or 'k_composition_with_previous'")
        values = getattr(self, by)
        if values is None:
            raise ValueError(f"by: {by!r} is not available for this model (multi-head latent attention has no "
                             f"per-head W_K to compose)")
        order = np.argsort(-values, axis=None, kind="stable")[:count("n", n, 1)]
        return [(int(i // values.shape[1]), int(i % values.shape[1]), float(values.flat[i])) for i in order]

    def summary(self) -> dict:
        """Named scalars: the best induction and previous-token heads and their scores, the
        number of previous-token heads, and the mean scores over all heads."""
        (li, hi, si), (lp, hp, sp) = self.top(1)[0], self.top(1, by="previous_token")[0]
        return {"best_induction_head": f"{li}.{hi}", "best_induction_score": si,
                "best_previous_token_head": f"{lp}.{hp}", "best_previous_token_score": sp,
                "n_previous_token_heads": len(self.previous_token_heads),
                "mean_induction_score": float(self.induction.mean()),
                "mean_previous_token_score": float(self.previous_token.mean()),
                **({} if self.duplicate_token is None else
                   {"best_duplicate_token_head": "{0}.{1}".format(*self.top(1, by="duplicate_token")[0][:2]),
                    "best_duplicate_token_score": self.top(1, by="duplicate_token")[0][2]})}


def _repeated_random_tokens(vocab_size: int, seq_len: int, n_repeats: int, n_sequences: int, rng,
                           bos: Optional[int] = None) -> np.ndarray:
    """(n_sequences, [1 +] n_repeats * seq_len) sequences: seq_len distinct random tokens
    (never ``bos``) repeated n_repeats times, after ``bos`` when given."""
    pool = np.arange(vocab_size) if bos is None else np.delete(np.arange(vocab_size), bos)
    seqs = np.stack([rng.choice(pool, seq_len, replace=False) for _ in range(n_sequences)])
    ids = np.tile(seqs, (1, n_repeats))
    if bos is not None:
        ids = np.concatenate([np.full((n_sequences, 1), bos), ids], axis=1)
    return ids.astype(np.int64)


def induction_scores(model, *, seq_len: Optional[int] = None, n_repeats: int = 2, n_sequences: int = 4, bos: Optional[int] = None,
                     threshold: float = 0.4, seed=0) -> InductionScores:
    """Induction, previous-token and duplicate-token scores of every head, and K-composition from weights.

    The repeated-random-tokens test of Olsson et al. (the notes' "induction circuits";
    definitions in the module docstring), run through the model's own forward pass, plus
    :func:`attngeom.composition_scores` (mode "K") of the model's heads.

    Parameters
    ----------
    model : Model or str or path-like
        A causal decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3) or its checkpoint.
    seq_len : int, optional
        Length of the random sequence (distinct tokens; at most the vocabulary size). Default
        50, or less where the vocabulary (less bos), the position table or the trained context
        of a rotary model (config.json's max_position_embeddings; n_repeats copies, plus bos)
        is smaller.
    n_repeats : int, default 2
        Copies of it (>= 2).
    n_sequences : int, default 4
        Independent random sequences, run as one batch; scores are averaged over them.
    bos : int, optional
        A token id put first (GPT-2 style models attend to it as a sink); it is never
        drawn in the random sequences. Positions are then shifted by one.
    threshold : float, default 0.4
        Previous-token score from which a head counts as a previous-token head.
    seed : int, default 0
        Seed of the random sequences.

    Returns
    -------
    InductionScores
        induction, previous_token and duplicate_token (n_layers, n_heads), k_composition (n_layers, n_heads,
        n_layers, n_heads), previous_token_heads, k_composition_with_previous
        (n_layers, n_heads) and the token ids used.

    Raises
    ------
    ValueError
        For a bidirectional model (BERT), sizes beyond the vocabulary or the position
        table, and a bad bos or threshold.

    Examples
    --------
    >>> from attngeom.models import planted_induction_model
    >>> s = ag.induction_scores(planted_induction_model("planted"), seq_len=20, bos=0)
    >>> bool(s.induction[1, 0] > 0.99), bool(s.previous_token[0, 0] > 0.99)
    (True, True)
    >>> s.previous_token_heads
    [(0, 0)]
    """
    m = resolve_model(model)
    if m.arch.family == "bert":
        raise ValueError(f"model: induction scores need a causal decoder, got a {m.arch.model_type} encoder")
    V = m.arch.vocab_size
    R = count("n_repeats", n_repeats, 2, 10 ** 6)
    B = count("n_sequences", n_sequences, 1, 10 ** 6)
    if bos is not None:
        bos = count("bos", bos, 0, V - 1)
    if seq_len is None:  # 50, within the vocabulary, the position table and the trained context
        room = m.arch.max_positions
        if room is None and isinstance(m.arch.config.get("max_position_embeddings"), int):
            room = m.arch.config["max_position_embeddings"]
        seq_len = min(50, V - (bos is not None), 50 if room is None else (room - (bos is not None)) // R)
    T = count("seq_len", seq_len, 2)
    threshold = scalar("threshold", threshold)
    offset = 0 if bos is None else 1
    if T > V - offset:
        raise ValueError(f"seq_len ({T}) must not exceed the {V - offset} tokens available (vocab_size {V}"
                         f"{', less the bos token' if offset else ''}): the tokens of one copy are distinct")
    n = offset + R * T
    limit = m.arch.max_positions
    if limit is not None and n > limit:
        raise ValueError(f"seq_len * n_repeats (+ bos) = {n} exceeds the model's {limit} positions")
    ids = _repeated_random_tokens(V, T, R, B, generator(seed), bos)
    P = m.forward(ids, dtype=np.float32, keep=("pattern",)).pattern.astype(np.float64)  # (L, B, H, n, n)
    # queries of copy r >= 1, index i: the keys after the earlier occurrences (copy r' < r, index i + 1)
    mass = np.zeros(P.shape[:3] + ((R - 1) * T,))
    same = np.zeros_like(mass)  # the earlier occurrences of the query's own token
    i = np.arange(T)
    for r in range(1, R):
        for earlier in range(r):
            mass[..., (r - 1) * T + i] += P[..., offset + r * T + i, offset + earlier * T + i + 1]
            same[..., (r - 1) * T + i] += P[..., offset + r * T + i, offset + earlier * T + i]
    induction = mass.mean(axis=(1, 3))
    duplicate = same.mean(axis=(1, 3))
    t = np.arange(offset + 1, n)
    previous = P[..., t, t - 1].mean(axis=(1, 3))
    prev_heads = [(int(a), int(b)) for a, b in zip(*np.nonzero(previous >= threshold))]
    comp = with_prev = None
    if not m.arch.mla:  # MLA keys pass through a norm: no per-head W_K (:mod:`.mla`)
        H = m.heads
        comp = composition_scores(H.W_Q, H.W_K, H.W_V, H.W_O, "K")
        with_prev = np.zeros(previous.shape)
        for a, b in prev_heads:
            with_prev = np.maximum(with_prev, comp[a, b])
    probe = (f"{B} sequences of {T} distinct random tokens repeated {R} times ({n} positions"
             + (f", after bos {bos}" if bos is not None else "") + f"), seed {seed}")
    return InductionScores(induction, previous, comp, prev_heads, with_prev, threshold, ids, duplicate, probe)
