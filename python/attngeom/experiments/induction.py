"""Induction heads forming in training, with the geometry measured along the way (``attngeom run induction``).

Olsson et al. (2022), "In-context learning and induction heads": attention-only transformers
of two layers develop induction heads in a sudden phase change, visible as a bump in the
training loss and, at the same step, a fall of the in-context-learning (ICL) score; one-layer
models cannot (an induction head needs a previous-token head in an earlier layer whose
output its keys read: K-composition). This driver trains attention-only models of each layer
count in ``layers`` (:class:`attngeom.torch.gpt.GPT` with ``mlp=False``, softmax attention,
learned or rotary positions) on a character corpus mixed with repeated random segments, where
induction pays, and at every evaluation saves the weights as a checkpoint and measures, from
that checkpoint with the library's own functions (``ag.load_model``):

* the loss on fixed probe windows of validation text and on fixed repeated random segments
  (:func:`attngeom.models.next_token_losses` of the NumPy forward pass);
* the ICL score: the mean loss at position ``icl_late`` minus that at ``icl_early`` (Olsson's
  definition, their 500 and 50 scaled to the context), on the text probe (``icl_score``) and
  on the repeated probe (``icl_repeated``);
* per head the induction and previous-token scores (:func:`attngeom.models.induction_scores`
  on repeated random tokens), the K- and Q-composition of every layer-0 head into every
  layer-1 head (:func:`attngeom.composition_scores`), the effective rank, largest singular
  values and ker B dimension of W_QK and W_OV (:meth:`ModelHeads.diagnostics`), and the
  change in the probe loss when the head is mean-ablated
  (:func:`attngeom.models.head_ablation_effects`).

Definitions in the summary: a run has a **phase change** only when the circuit formed: its
repeated-probe ICL score fell by at least ``phase_min_icl_fall`` nats (default 1.0) from its
highest value after the learning rate's warmup to its final value, and its final induction
score reached ``phase_min_induction`` (default 0.3). Otherwise the summary says "no phase
change" (the steps are NaN, null in summary.json) and names the two measured values. With a
phase change, the **phase change step** is the evaluation step at the end of the interval over
which the repeated-probe ICL score falls fastest (the most negative difference between
consecutive evaluations, over intervals beginning after the warmup: during it every score
moves as the weights leave their random start); the **circuit** is the layer-0 head with the
highest final previous-token score and the layer-1 head with the highest final induction
score, and the **composition rise step** is the end of the interval over which the
K-composition of that pair rises fastest (after the warmup too). Both are reported per seed
with their agreement (within two evaluation intervals or not).

The **induction score** of the summary is measured on the run's own probe: 4 sequences of ``segment_max`` distinct random tokens (context // 2 by default: two copies fill
the training context) repeated twice, seed ``seed``, i.e.
``ag.models.induction_scores(model, seq_len=segment_max, n_repeats=2, n_sequences=4, seed=seed)``;
the final induction score is its largest value over heads.
"""
from __future__ import annotations

import copy
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .._operands import choice
from ._result import ExperimentConfig, ExperimentResult, check_config
from ._resume import RunState, capture, checkpoint_due
from .training import (TrainingConfig, check_training, load_corpus, make_optimizer, parallel_runs, require_torch,
                       threads, train_step, windows)


@dataclass
class InductionConfig(ExperimentConfig):
    """``attngeom run induction`` (module docstring). Defaults: the benchmark run (2 cores, 15 minutes)."""

    layers: str = "1,2"  # arms: attention-only models with these layer counts
    positions: str = "rope"  # "rope" | "learned" (a position table)
    corpus: str = "stdlib"  # as training: "stdlib" | a path to a UTF-8 text file
    corpus_chars: int = 400_000  # use at most this many characters of the corpus (0: all)
    repeat_fraction: float = 0.5  # of every training batch: sequences of a random segment repeated
    segment_min: int = 4  # the repeated segments' lengths are uniform in segment_min..segment_max
    segment_max: int = 0  # (0: context // 2); varied, so that no fixed offset predicts the repeat
    d_model: int = 64
    n_heads: int = 4
    context: int = 64
    batch: int = 32
    iterations: int = 2000
    seeds: int = 3  # runs per arm, seeds seed, seed + 1, ...
    eval_every: int = 50
    probe: int = 16  # probe sequences of each kind (text windows, repeated segments)
    icl_early: int = 8  # ICL score: loss at icl_late minus loss at icl_early (positions of the predicted token)
    icl_late: int = 56
    lr: float = 3e-3
    schedule: str = "warmup_cosine"
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    top_singular_values: int = 4  # of W_QK and W_OV kept per head and evaluation
    threads: int = 1  # torch and attngeom threads per run
    workers: int = 2  # runs trained at once in worker processes; results do not depend on it
    checkpoints: bool = True  # keep every evaluation's weights for the run folder
    checkpoint_every: int = 100  # iterations between a run's saved states, for resuming (and at the end)
    # A phase change is reported only when the circuit formed (module docstring): the repeated-probe ICL
    # score fell by at least phase_min_icl_fall nats (highest value after the warmup -> final value) and
    # the final induction score reached phase_min_induction; otherwise the summary says "no phase change".
    phase_min_icl_fall: float = 1.0
    phase_min_induction: float = 0.3

    def check(self) -> "InductionConfig":
        """This config, checked (:func:`check_config`, :func:`attngeom.experiments.training.check_training`, and the
        positions, repeated segments, ICL positions and layer counts); ValueError naming the field."""
        c = check_config(self, d_model=2, context=4, batch=2, segment_min=2)
        check_training(c)
        choice("positions", c.positions, ("learned", "rope"), "'learned' or 'rope'")
        if not 0 <= c.repeat_fraction <= 1:
            raise ValueError(f"repeat_fraction must be in [0, 1], got {c.repeat_fraction!r}")
        top = _segment_max(c)
        if not c.segment_min <= top <= c.context // 2:
            raise ValueError(f"segment_max must be in segment_min..context // 2 = {c.context // 2} (two copies fit), "
                             f"got {top} (segment_min {c.segment_min})")
        if not 0 < c.phase_min_induction <= 1:
            raise ValueError(f"phase_min_induction must be in (0, 1] (an induction score is an attention mass), "
                             f"got {c.phase_min_induction!r}")
        if not 0 <= c.icl_early < c.icl_late < c.context - 1:
            raise ValueError(f"icl_early and icl_late must satisfy 0 <= icl_early < icl_late < context - 1 = "
                             f"{c.context - 1}, got {c.icl_early} and {c.icl_late}")
        _arms(c.layers)
        return c


def _arms(layers: str) -> List[int]:
    counts = []
    for part in str(layers).split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"layers: each arm is a positive layer count, got {part!r} in {layers!r}")
        if int(part) not in counts:
            counts.append(int(part))
    if not counts:
        raise ValueError(f"layers must name at least one layer count, got {layers!r}")
    return counts


def _segment_max(c: InductionConfig) -> int:
    return c.segment_max or c.context // 2


def _repeats(rng, n_seq: int, vocab: int, lo: int, hi: int, length: int) -> np.ndarray:
    """n_seq sequences of `length` tokens, each a uniform random segment of a uniform random
    length in lo..hi repeated (cut to length)."""
    out = np.empty((n_seq, length), np.int64)
    for i, size in enumerate(rng.integers(lo, hi + 1, n_seq)):
        seg = rng.integers(0, vocab, size)
        out[i] = np.tile(seg, -(-length // size))[:length]
    return out


def _batch(rng, train: np.ndarray, c: InductionConfig, vocab: int) -> np.ndarray:
    """One training batch (batch, context + 1): text windows and repeated random segments."""
    n_rep = int(round(c.repeat_fraction * c.batch))
    starts = rng.integers(0, len(train) - c.context - 1, size=c.batch - n_rep)
    text = windows(train, starts, c.context + 1)
    rep = _repeats(rng, n_rep, vocab, c.segment_min, _segment_max(c), c.context + 1)
    return np.concatenate([text, rep])


def probe_batches(config: InductionConfig, corpus) -> dict:
    """The fixed probes every evaluation measures: {"text": (probe, context) windows spread
    over the validation split, "repeated": (probe, context) repeated random segments (seed
    config.seed + 10**6)}."""
    c = config
    starts = np.linspace(0, len(corpus.val) - c.context - 1, c.probe).astype(np.int64)
    rng = np.random.default_rng(c.seed + 10 ** 6)
    return {"text": windows(corpus.val, starts, c.context),
            "repeated": _repeats(rng, c.probe, len(corpus.vocab), c.segment_min, _segment_max(c), c.context)}


def measure(model, probes: dict, config: InductionConfig) -> dict:
    """Everything one evaluation records, from a loaded checkpoint (``ag.load_model``).

    Parameters
    ----------
    model : attngeom.models.Model
        The checkpoint.
    probes : dict
        :func:`probe_batches`.
    config : InductionConfig
        Reads icl_early, icl_late, context, segment_max, top_singular_values, seed.

    Returns
    -------
    dict
        Scalars ``loss_text``, ``loss_repeated``, ``icl_score``, ``icl_repeated``; per head
        (n_layers, n_heads) ``induction``, ``previous_token``, ``effect`` (mean-ablation change
        of the probe loss), ``qk_effective_rank``, ``ov_effective_rank``, ``ker_B_dim``;
        (n_layers, n_heads, k) ``qk_top``, ``ov_top``; and for two layers or more
        (n_heads, n_heads) ``k_composition`` and ``q_composition`` of layer-0 heads (rows)
        into layer-1 heads (columns).

    Examples
    --------
    >>> m = measure(ag.load_model(folder), probe_batches(config, corpus), config)  # doctest: +SKIP
    """
    from ..circuits import composition_scores
    from ..models import head_ablation_effects, induction_scores, next_token_losses

    c = config
    out = {}
    for kind, ids in probes.items():
        losses = next_token_losses(model.forward(ids, keep=("logits",)).logits, ids)  # (probe, context - 1)
        out[f"loss_{kind}"] = float(losses.mean())
        out["icl_score" if kind == "text" else "icl_repeated"] = float(losses[:, c.icl_late].mean()
                                                                       - losses[:, c.icl_early].mean())
    both = np.concatenate([probes["text"], probes["repeated"]])
    out["effect"] = head_ablation_effects(model, both, mode="mean").effects
    scores = induction_scores(model, seq_len=_segment_max(c), n_repeats=2, n_sequences=PROBE_SEQUENCES, seed=c.seed)
    out["induction"], out["previous_token"] = scores.induction, scores.previous_token
    H = model.heads
    d = H.diagnostics()
    k = c.top_singular_values
    out["qk_effective_rank"] = np.asarray(d.bilinear_effective_rank, float)
    out["ov_effective_rank"] = np.asarray(d.ov_effective_rank, float)
    out["ker_B_dim"] = np.array([[d.nulls.ker_B[l, h].dim for h in range(H.n_heads)] for l in range(H.n_layers)])
    out["qk_top"], out["ov_top"] = d.nulls.singular_values[..., :k], d.ov_singular_values[..., :k]
    if H.n_layers >= 2:
        for mode in ("K", "Q"):
            out[f"{mode.lower()}_composition"] = composition_scores(H.W_Q, H.W_K, H.W_V, H.W_O, mode)[0, :, 1, :]
    return out


#: Sequences of the run's induction probe (module docstring).
PROBE_SEQUENCES = 4


def induction_probe(config: InductionConfig) -> str:
    """The run's induction probe in words and as the library call that measures it."""
    T = _segment_max(config)
    return (f"{PROBE_SEQUENCES} sequences of {T} distinct random tokens repeated twice ({2 * T} positions), "
            f"ag.models.induction_scores(model, seq_len={T}, n_repeats=2, n_sequences={PROBE_SEQUENCES}, "
            f"seed={config.seed})")


def phase_change(steps: np.ndarray, icl_repeated: np.ndarray, final_induction: float, config: InductionConfig):
    """(found, ICL fall, phase change step) of one run (module docstring): the fall of the
    repeated-probe ICL score from its highest value after the warmup to its final value, and the
    step of its fastest fall when the fall reaches ``phase_min_icl_fall`` and the final induction
    score ``phase_min_induction`` (NaN otherwise)."""
    after = steps >= min(config.warmup, steps[-1])
    fall = float(np.max(icl_repeated[after]) - icl_repeated[-1])
    found = fall >= config.phase_min_icl_fall and final_induction >= config.phase_min_induction
    return found, fall, (_fastest(steps, icl_repeated, -1.0, config.warmup) if found else float("nan"))


def _run(n_layers: int, seed: int, c: InductionConfig, train: np.ndarray, vocab: List[str], probes: dict,
         eval_points: np.ndarray, state_dir: Optional[str] = None):
    """One run: trains, and at every evaluation saves a checkpoint and measures it. With
    `state_dir` it saves its state there every c.checkpoint_every iterations and at the end,
    and continues from a state found there (:mod:`attngeom.experiments._resume`)."""
    import torch

    from ..models import load_model
    from ..torch.gpt import GPT, save_checkpoint

    def new_model():
        return GPT(len(vocab), c.d_model, n_layers, c.n_heads, c.context, mlp=False, positions=c.positions)

    torch.manual_seed(seed)
    model = new_model()
    opt = make_optimizer(model, c)
    rng = np.random.default_rng(seed)
    records, snapshots, train_loss = [], [], np.full(len(eval_points), np.nan)
    running, count, e = 0.0, 0, 1
    state = RunState(state_dir, f"{n_layers}layer_seed{seed}")
    with tempfile.TemporaryDirectory() as tmp:
        def evaluate(k):
            model.eval()
            folder = save_checkpoint(model, os.path.join(tmp, f"step{int(eval_points[k])}"), vocab=vocab)
            records.append(measure(load_model(folder), probes, c))
            if c.checkpoints:
                snapshots.append(copy.deepcopy(model))
            model.train()
            train_loss[k] = running / count if count else np.nan

        start, saved = state.resume(model, opt, rng, evaluate)
        if saved is not None:
            records, train_loss = saved["records"], saved["train_loss"]
            running, count, e = saved["counters"]
            for weights in saved["snapshots"]:
                snapshots.append(new_model())
                snapshots[-1].load_state_dict(weights)
        for it in range(start, c.iterations):
            xy = torch.from_numpy(_batch(rng, train, c, len(vocab)))
            value = train_step(model, opt, xy, c, it, f"{n_layers}-layer run, seed {seed}")
            running, count = running + value, count + 1
            if e < len(eval_points) and it + 1 == eval_points[e]:
                evaluate(e)
                running, count, e = 0.0, 0, e + 1
            if checkpoint_due(it, c):
                state.save(capture(it, model, opt, rng, records=records, train_loss=train_loss,
                                   counters=(running, count, e), snapshots=[m.state_dict() for m in snapshots]))
    return records, train_loss, snapshots


def _fastest(steps: np.ndarray, values: np.ndarray, sign: float, start: int) -> float:
    """The end step of the interval (beginning at `start` or later) over which sign * values
    changes fastest (NaN without one)."""
    rate = sign * np.diff(values) / np.diff(steps)
    rate[steps[:-1] < start] = np.nan
    return float(steps[1:][int(np.nanargmax(rate))]) if np.isfinite(rate).any() else float("nan")


@dataclass
class InductionResult(ExperimentResult):
    """What :func:`run_induction` measured (module docstring).

    ``curves[arm][quantity]`` has shape (seeds, evaluations[, ...]) for the scalar and
    per-head quantities of :func:`measure` plus ``train_loss``; ``eval_points`` the steps;
    ``checkpoints[arm][s]`` the torch models at every evaluation (or None).
    """

    config: InductionConfig
    corpus: dict
    arms: List[str]
    eval_points: np.ndarray
    curves: dict
    seconds: float
    checkpoints: Optional[dict] = field(default=None, repr=False)

    ARTIFACTS = ("curves.npz", "checkpoints")  # written by save_artifacts
    DESCRIPTIONS = (
        (r"phase_change_found_(\w+?)((?:_seed\d+)?)", "1 when the circuit formed: the repeated-probe ICL score fell by "
         ">= phase_min_icl_fall nats after the warmup and the final induction score reached phase_min_induction; "
         "0: no phase change ({0}{1}; the mean over seeds for an arm)"),
        (r"icl_fall_(\w+?)((?:_seed\d+)?)", "fall of the repeated-probe ICL score from its highest value after the "
         "warmup to its final value, nats ({0}{1})"),
        (r"phase_change_step_(\w+?)((?:_seed\d+)?)", "step of the fastest fall of the repeated-probe ICL score; none: "
         "no phase change found ({0}{1})"),
        (r"composition_rise_step_(\w+?)((?:_seed\d+)?)", "step of the fastest rise of the circuit's K-composition; "
         "none without a phase change or a second layer ({0}{1})"),
        (r"final_induction_score_(\w+?)((?:_seed\d+)?)", "largest induction score over heads at the end, on the run's "
         "probe (module docstring; summary.md names it) ({0}{1})"),
        (r"final_icl_score_(\w+?)((?:_seed\d+)?)", "ICL score on validation text at the end: loss late - early ({0}{1})"),
        (r"final_icl_repeated_(\w+?)((?:_seed\d+)?)", "ICL score on the repeated random segments at the end ({0}{1})"),
        (r"final_loss_text_(\w+?)((?:_seed\d+)?)", "probe loss on validation text at the end, nats ({0}{1})"),
        (r"steps_apart_(\w+?)((?:_seed\d+)?)", "composition rise step - phase change step ({0}{1})"),
        (r"agree_(\w+?)((?:_seed\d+)?)", "1 when the two steps are within two evaluation intervals ({0}{1})"),
    )

    def circuit(self, arm: str, s: int):
        """(previous-token head of layer 0, induction head of layer 1, their K-composition
        against step) of seed index s (the heads with the highest final scores); None for a
        one-layer arm."""
        cv = self.curves[arm]
        if "k_composition" not in cv:
            return None
        h0 = int(np.argmax(cv["previous_token"][s, -1, 0]))
        h1 = int(np.argmax(cv["induction"][s, -1, 1]))
        return h0, h1, cv["k_composition"][s][:, h0, h1]

    def _per_seed(self, arm: str) -> dict:
        steps = self.eval_points.astype(float)
        cv = self.curves[arm]
        out = {"phase_change_found": [], "icl_fall": [], "phase_change_step": [], "composition_rise_step": [],
               "final_induction_score": [], "final_icl_score": [], "final_icl_repeated": [], "final_loss_text": []}
        for s in range(self.config.seeds):
            final = float(cv["induction"][s, -1].max())
            found, fall, step = phase_change(steps, cv["icl_repeated"][s], final, self.config)
            out["phase_change_found"].append(float(found))
            out["icl_fall"].append(fall)
            out["phase_change_step"].append(step)
            pair = self.circuit(arm, s)
            out["composition_rise_step"].append(_fastest(steps, pair[2], 1.0, self.config.warmup) if pair and found
                                                else float("nan"))
            out["final_induction_score"].append(final)
            out["final_icl_score"].append(float(cv["icl_score"][s, -1]))
            out["final_icl_repeated"].append(float(cv["icl_repeated"][s, -1]))
            out["final_loss_text"].append(float(cv["loss_text"][s, -1]))
        return out

    def summary(self) -> dict:
        """Per arm the means over seeds of the phase change step, the composition rise step,
        the final induction score, ICL scores and text loss, and every value per seed."""
        out = {}
        interval = self.config.eval_every
        for arm in self.arms:
            per = self._per_seed(arm)
            for key, values in per.items():  # the steps: means over the seeds with a phase change
                steps_only = key in ("phase_change_step", "composition_rise_step")
                finite = [v for v in values if math.isfinite(v)] if steps_only else values
                out[f"{key}_{arm}"] = float(np.mean(finite)) if finite else float("nan")
            apart = np.array(per["composition_rise_step"]) - np.array(per["phase_change_step"])
            if np.isfinite(apart).all():
                out[f"steps_apart_{arm}"] = float(np.mean(apart))
                out[f"agree_{arm}"] = float(np.mean(np.abs(apart) <= 2 * interval))
            for s in range(self.config.seeds):
                seed = self.config.seed + s
                for key, values in per.items():
                    out[f"{key}_{arm}_seed{seed}"] = values[s]
                if np.isfinite(apart[s]):
                    out[f"steps_apart_{arm}_seed{seed}"] = float(apart[s])
                    out[f"agree_{arm}_seed{seed}"] = float(abs(apart[s]) <= 2 * interval)
        out["seconds"] = self.seconds
        return out

    def verdicts(self) -> List[str]:
        """One sentence per arm and seed: the phase change found (its step, the circuit's heads, the
        ICL fall and the final induction score) or that none was found, and why."""
        c, out = self.config, []
        for arm in self.arms:
            per = self._per_seed(arm)
            for s in range(c.seeds):
                fall, ind = per["icl_fall"][s], per["final_induction_score"][s]
                measured = (f"the repeated-probe ICL score fell by {fall:.2f} nats after the warmup (a phase change "
                            f"needs >= {c.phase_min_icl_fall:g}) and the final induction score is {ind:.3f} "
                            f"(needs >= {c.phase_min_induction:g})")
                if per["phase_change_found"][s]:
                    pair = self.circuit(arm, s)
                    heads = f"; the circuit: L0H{pair[0]} (previous token) -> L1H{pair[1]} (induction)" if pair else ""
                    out.append(f"{arm}, seed {c.seed + s}: phase change at step {per['phase_change_step'][s]:.0f}: "
                               f"{measured}{heads}.")
                else:
                    out.append(f"{arm}, seed {c.seed + s}: no phase change found: {measured}.")
        return out

    @staticmethod
    def cell(value) -> str:
        """A summary scalar as the table shows it: four significant digits, "none" for NaN (no phase change)."""
        return f"{value:.4g}" if math.isfinite(value) else "none"

    def table(self) -> str:
        """The verdict per arm and seed, the phase-change table (one row per arm and seed), the
        induction probe and the summary's scalars."""
        lines = [f"- {v}" for v in self.verdicts()]
        lines += ["", f"Induction scores are measured on the run's probe: {induction_probe(self.config)}.", "",
                  "| arm | seed | phase change step | composition rise step | agree (within 2 evals) | final induction "
                  "score | final ICL (text) | final ICL (repeated) |", "|---|---|---|---|---|---|---|---|"]
        for arm in self.arms:
            per = self._per_seed(arm)
            for s in range(self.config.seeds):
                p, r = per["phase_change_step"][s], per["composition_rise_step"][s]
                agree = "" if not math.isfinite(r) else ("yes" if abs(r - p) <= 2 * self.config.eval_every else "no")
                lines.append(f"| {arm} | {self.config.seed + s} | {p:.0f} | {'' if not math.isfinite(r) else f'{r:.0f}'} "
                             f"| {agree} | {per['final_induction_score'][s]:.3f} | {per['final_icl_score'][s]:.3f} | "
                             f"{per['final_icl_repeated'][s]:.3f} |".replace("| nan |", "| no phase change |"))
        return "\n".join(lines) + "\n\n" + super().table()

    def _mark(self, ax, arm):
        for s, step in enumerate(self._per_seed(arm)["phase_change_step"]):
            if math.isfinite(step):
                ax.axvline(step, color=f"C{s}", lw=0.8, ls=":")

    def plot_loss(self):
        """Training loss, probe loss on text and the ICL scores against step, one column per
        arm, seeds as lines, each seed's phase change dotted. Returns the figure."""
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, len(self.arms), figsize=(4.4 * len(self.arms), 6.0), squeeze=False)
        steps = self.eval_points
        for j, arm in enumerate(self.arms):
            cv = self.curves[arm]
            for s in range(self.config.seeds):
                axes[0, j].plot(steps[1:], cv["train_loss"][s, 1:], color=f"C{s}", lw=0.8,
                                label=f"train (seed {self.config.seed + s})")
                axes[0, j].plot(steps, cv["loss_text"][s], color=f"C{s}", lw=0.8, ls="--")
                axes[1, j].plot(steps, cv["icl_repeated"][s], color=f"C{s}", lw=1.0)
                axes[1, j].plot(steps, cv["icl_score"][s], color=f"C{s}", lw=0.8, ls="--")
            for ax in axes[:, j]:
                self._mark(ax, arm)
            axes[0, j].set_title(f"{arm}: loss (train solid, text probe dashed)", fontsize=9)
            axes[1, j].set_title(f"{arm}: ICL score (repeated solid, text dashed)", fontsize=9)
            axes[1, j].set_xlabel("step")
            axes[0, j].legend(fontsize=7)
        fig.tight_layout()
        return fig

    def plot_formation(self):
        """Against step: the largest induction and previous-token scores, the largest
        K-composition score, and the effective ranks of the final induction head's W_OV and
        W_QK, one column per arm, each seed's phase change dotted. Returns the figure."""
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, len(self.arms), figsize=(4.4 * len(self.arms), 8.0), squeeze=False)
        steps = self.eval_points
        for j, arm in enumerate(self.arms):
            cv = self.curves[arm]
            for s in range(self.config.seeds):
                ind = cv["induction"][s]
                axes[0, j].plot(steps, ind.max(axis=(-2, -1)), color=f"C{s}", lw=1.0)
                axes[0, j].plot(steps, cv["previous_token"][s].max(axis=(-2, -1)), color=f"C{s}", lw=0.8, ls="--")
                pair = self.circuit(arm, s)
                if pair is not None:
                    axes[1, j].plot(steps, pair[2], color=f"C{s}", lw=1.0, label=f"L0H{pair[0]} -> L1H{pair[1]}")
                    axes[1, j].legend(fontsize=7)
                layer, head = np.unravel_index(int(np.argmax(ind[-1])), ind.shape[1:])
                axes[2, j].plot(steps, cv["ov_effective_rank"][s][:, layer, head], color=f"C{s}", lw=1.0)
                axes[2, j].plot(steps, cv["qk_effective_rank"][s][:, layer, head], color=f"C{s}", lw=0.8, ls="--")
            if "k_composition" not in cv:
                axes[1, j].text(0.5, 0.5, "one layer: no composition", ha="center", va="center",
                                transform=axes[1, j].transAxes)
                axes[1, j].set_xticks([])
                axes[1, j].set_yticks([])
            for ax in axes[:, j] if "k_composition" in cv else axes[[0, 2], j]:
                self._mark(ax, arm)
            axes[0, j].set_title(f"{arm}: top induction (solid) and previous-token (dashed) score", fontsize=9)
            axes[1, j].set_title(f"{arm}: K-composition of the circuit's two heads", fontsize=9)
            axes[2, j].set_title(f"{arm}: induction head's eff. rank, W_OV (solid), W_QK (dashed)", fontsize=8)
            axes[2, j].set_xlabel("step")
        fig.tight_layout()
        return fig

    def figures(self) -> dict:
        """{"loss.png": :meth:`plot_loss`, "formation.png": :meth:`plot_formation`}."""
        return {"loss.png": self.plot_loss(), "formation.png": self.plot_formation()}

    def save_artifacts(self, folder) -> List[str]:
        """Write every evaluation's checkpoint (``checkpoints/<arm>/seed<k>/step<s>/``: model.safetensors
        and config.json, readable by ``ag.load_model`` and ``ag.load_heads``) and curves.npz (every
        curve, keys ``<arm>/<quantity>``). Returns the written paths."""
        from ..torch.gpt import save_checkpoint

        paths = []
        arrays = {f"{arm}/{k}": v for arm, cv in self.curves.items() for k, v in cv.items()}
        arrays["eval_points"] = self.eval_points
        path = os.path.join(folder, "curves.npz")
        os.makedirs(folder, exist_ok=True)
        np.savez_compressed(path, **arrays)
        paths.append(path)
        for arm, runs in (self.checkpoints or {}).items():
            for s, models in enumerate(runs):
                seed = self.config.seed + s
                for step, model in zip(self.eval_points, models):
                    where = os.path.join(folder, "checkpoints", arm, f"seed{seed}", f"step{int(step):06d}")
                    paths.append(save_checkpoint(model, where, vocab=self.corpus["vocab"],
                                                 extra={"arm": arm, "step": int(step), "seed": seed}))
        return paths


def run_induction(config: InductionConfig = InductionConfig(), *, state_dir: Optional[str] = None) -> InductionResult:
    """Train the attention-only arms over ``config.seeds`` seeds and measure every evaluation
    (module docstring). Deterministic given the config and the thread count. Needs PyTorch.
    With `state_dir` every run saves its state there every ``config.checkpoint_every``
    iterations, and a call with the same config and folder after an interruption continues
    each run to the same result, bit for bit (``attngeom run induction --resume``).

    Example: ``res = run_induction(InductionConfig(iterations=300, seeds=1))``
    """
    c = config.check()
    counts = _arms(c.layers)
    require_torch("induction")
    t0 = time.perf_counter()
    corpus = load_corpus(TrainingConfig(corpus=c.corpus, corpus_chars=c.corpus_chars, seed=c.seed))
    corpus.check_context(c.context)
    if _segment_max(c) > len(corpus.vocab):
        raise ValueError(f"segment_max {_segment_max(c)} exceeds the corpus's {len(corpus.vocab)} characters "
                         f"(induction scores use a copy of distinct tokens)")
    with threads(c.threads):
        probes = probe_batches(c, corpus)
        eval_points = np.unique(np.r_[0, np.arange(c.eval_every, c.iterations + 1, c.eval_every), c.iterations])
        arms = [f"{n}layer" for n in counts]
        jobs = [(s, n) for s in range(c.seeds) for n in counts]
        runs = [(n, c.seed + s, c, corpus.train, corpus.vocab, probes, eval_points, state_dir) for s, n in jobs]
        curves = {arm: {} for arm in arms}
        models = {arm: [None] * c.seeds for arm in arms}
        outputs = parallel_runs(_run, runs, c, lambda run, out: f"{run[0]} layers, seed {run[1]}: ICL "
                                                               f"{out[0][-1]['icl_repeated']:.2f}")
        for (s, n), (records, train_loss, snapshots) in zip(jobs, outputs):
            cv = curves[f"{n}layer"]
            for key in records[0]:
                cv.setdefault(key, np.empty((c.seeds, len(eval_points)) + np.shape(records[0][key])))[s] = \
                    [r[key] for r in records]
            cv.setdefault("train_loss", np.empty((c.seeds, len(eval_points))))[s] = train_loss
            models[f"{n}layer"][s] = snapshots
    info = {"name": corpus.name, "characters": int(len(corpus.train) + len(corpus.val)),
            "vocab_size": len(corpus.vocab), "sha256": corpus.sha256, "vocab": "".join(corpus.vocab)}
    return InductionResult(c, info, arms, eval_points, curves, time.perf_counter() - t0,
                           models if c.checkpoints else None)
