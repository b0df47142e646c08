"""The training experiment's config: its fields, the arms it names and the rules both follow."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ..._operands import choice, scalar
from .._result import ExperimentConfig, check_config

ARM_SUFFIXES = ("_equal", "_half")


@dataclass
class TrainingConfig(ExperimentConfig):
    variants: str = "standard,whitened,standard_equal,whitened_half,projection"  # arms, comma-separated
    corpus: str = "stdlib"  # "stdlib" | "markov" | a path to a UTF-8 text file
    corpus_chars: int = 0  # use at most this many characters of the corpus (0: all)
    d_model: int = 64
    n_blocks: int = 2
    n_heads: int = 2
    context: int = 64
    batch: int = 32
    iterations: int = 600
    seeds: int = 3  # runs per arm, seeds seed, seed + 1, ... (shared data order across arms)
    eval_every: int = 50
    geometry_every: int = 100  # Psi and rho at the evaluations at multiples of this (and the last)
    eval_windows: int = 128  # fixed validation windows of context + 1 characters
    geometry_batch: int = 64  # validation windows for Psi and rho (Fig. 4)
    lr: float = 2e-3  # AdamW peak learning rate
    schedule: str = "warmup_cosine"  # "warmup_cosine" (linear warmup, cosine to min_lr_ratio lr) | "constant"
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # on the weight matrices only (not on embeddings, LN, biases, L0, M)
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    sigma: float = 0.01  # projection attention's Gaussian width (Sanger s.3's self-attention value)
    gamma: float = 1.0  # cauchy kernel width
    alpha: float = 1.5  # alpha-stable kernel index
    markov_alphabet: int = 8  # corpus="markov": alphabet size
    markov_order: int = 2  # corpus="markov": order k of the chain
    markov_concentration: float = 0.3  # corpus="markov": Dirichlet concentration of the transition rows
    markov_chars: int = 200_000  # corpus="markov": characters generated
    timing: bool = True  # measure Table 3 (ms per iteration vs context and d_model)
    timing_iterations: int = 5  # Table 3: timed iterations per (context, d_model) point after 2 warm-up ones
    threads: int = 1  # torch and attngeom threads per run (at this size one thread is robust on a shared machine)
    workers: int = 2  # runs (arm, seed) trained at once in worker processes; results do not depend on it
    checkpoints: bool = True  # keep each run's final weights for the run folder
    checkpoint_every: int = 100  # iterations between a run's saved states, for resuming (and at the end)

    def check(self) -> "TrainingConfig":
        """This config, checked (:func:`check_config`, :func:`check_training`, the kernels' widths > 0, a half-batch
        arm's batch >= 4); ValueError naming the first field out of range."""
        c = check_config(self, d_model=2, context=2, batch=2, geometry_batch=2, markov_chars=100, markov_alphabet=2)
        check_training(c)
        for name in ("sigma", "gamma", "alpha", "markov_concentration"):
            scalar(name, getattr(c, name), positive=True)
        if any(a.endswith("_half") for a in parse_arms(c.variants)) and c.batch < 4:
            raise ValueError(f"batch must be >= 4 for a half-batch arm, got {c.batch}")
        return c


def check_training(config) -> None:
    """The rules of every config that trains with :func:`attngeom.experiments.training.train_step` (training,
    induction): d_model a multiple of 2 n_heads, a known schedule, lr > 0, beta1 and beta2 in [0, 1)."""
    c = config
    if c.d_model % (2 * c.n_heads):
        raise ValueError(f"d_model must be a multiple of 2 * n_heads = {2 * c.n_heads} (an even head width, as "
                         f"rotary positions need), got {c.d_model}")
    choice("schedule", c.schedule, ("warmup_cosine", "constant"), "'warmup_cosine' or 'constant'")
    scalar("lr", c.lr, positive=True)
    if not (0 <= c.beta1 < 1 and 0 <= c.beta2 < 1):
        raise ValueError(f"beta1 and beta2 must be in [0, 1), got {c.beta1!r}, {c.beta2!r}")


def parse_arms(variants: str) -> List[str]:
    """The arm names of a comma-separated ``variants`` string, checked.

    An arm is a variant of :data:`attngeom.torch.gpt.VARIANTS` ("standard", "whitened",
    "projection", "cauchy", "stable", "lightning"), optionally with a suffix: ``_equal``
    (d_model widened to the whitened model's parameter count) or ``_half`` (half the batch).

    Parameters
    ----------
    variants : str
        E.g. "standard,whitened,standard_equal,whitened_half".

    Returns
    -------
    list of str
        The arms, in order, without duplicates.

    Examples
    --------
    >>> from attngeom.experiments.training import parse_arms
    >>> parse_arms("standard, whitened_half")
    ['standard', 'whitened_half']
    """
    known = ("standard", "whitened", "projection", "cauchy", "stable", "lightning")
    arms = []
    for part in str(variants).split(","):
        arm = part.strip()
        if not arm:
            continue
        base = base_variant(arm)
        if base not in known:
            raise ValueError(f"variants: unknown arm {arm!r}; an arm is one of {known}, optionally with the "
                             f"suffix _equal (parameter count of the whitened model) or _half (half batch)")
        if arm not in arms:
            arms.append(arm)
    if not arms:
        raise ValueError(f"variants must name at least one arm, got {variants!r}")
    return arms


def base_variant(arm: str) -> str:
    """The variant of an arm: its name without the suffix _equal or _half."""
    for suffix in ARM_SUFFIXES:
        if arm.endswith(suffix):
            return arm[: -len(suffix)]
    return arm
