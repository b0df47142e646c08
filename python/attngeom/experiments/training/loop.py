"""The training loop: the learning rate, the optimiser, one step, one run (arm, seed), the pool that trains runs in
parallel (shared with the induction experiment), and run_training: every arm over the seeds, then Table 3's timings."""
from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Optional

import numpy as np

from ...whitening import stationarity, whiteness
from .._progress import progress
from .._resume import RunState, capture, checkpoint_due
from ..timing import timed
from .config import TrainingConfig, base_variant, parse_arms
from .corpora import CharCorpus, load_corpus, windows
from .result import TrainingResult


def learning_rate(config, it: int) -> float:
    """The learning rate at iteration `it` (0-based) under config.schedule ("constant" or linear
    warmup then cosine to min_lr_ratio lr), from config.lr, warmup, iterations, min_lr_ratio."""
    c = config
    if c.schedule == "constant":
        return c.lr
    if it < c.warmup:
        return c.lr * (it + 1) / c.warmup
    frac = (it - c.warmup) / max(c.iterations - c.warmup, 1)
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def make_optimizer(model, config):
    """AdamW (config.lr, beta1, beta2) with weight decay config.weight_decay on the weight
    matrices of the linear maps only."""
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # weight decay on the weight matrices of the linear maps only: not on embeddings, LayerNorm,
        # biases, nor the whitening pair (decaying L0 towards 0 would blow up L0^{-1})
        (decay if p.dim() == 2 and name.endswith(".weight") and "embed" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=config.lr, betas=(config.beta1, config.beta2))


def train_step(model, opt, xy, config, it: int, what: str) -> float:
    """One optimisation step on the batch xy (batch, context + 1) of token ids: the learning
    rate of iteration `it`, the next-token loss, its gradient clipped to config.grad_clip (0:
    no clipping), the optimizer's step. Returns the loss; FloatingPointError naming `what`
    when it is not finite."""
    import torch

    for group in opt.param_groups:
        group["lr"] = learning_rate(config, it)
    loss = model.loss(xy[:, :-1], xy[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    opt.step()
    value = loss.item()
    if not math.isfinite(value):
        raise FloatingPointError(f"{what}: the training loss is {value} at iteration {it + 1}")
    return value


def _train_run(arm: str, seed: int, config: TrainingConfig, corpus: CharCorpus, setup: dict, val_x, val_y,
               geo_x, eval_points: np.ndarray, state_dir: Optional[str] = None):
    """One run: returns the curves (n_eval,) and the trained model. With `state_dir` it saves
    its state there every config.checkpoint_every iterations and at the end, and continues
    from a state found there (:mod:`attngeom.experiments._resume`)."""
    import torch

    from ...torch.gpt import GPT

    c = config
    variant = setup["variant"]
    params = {k: getattr(c, k) for k in {"projection": ("sigma",), "cauchy": ("gamma",),
                                         "stable": ("alpha",)}.get(variant, ())}
    torch.manual_seed(seed)
    model = GPT(len(corpus.vocab), setup["d_model"], c.n_blocks, c.n_heads, c.context, variant, **params)
    opt = make_optimizer(model, c)
    rng = np.random.default_rng(seed)  # the data order: shared by every arm of this seed
    batch = setup["batch"]
    n_eval = len(eval_points)
    curves = {k: np.full(n_eval, np.nan) for k in ("val_loss", "val_accuracy", "train_loss", "train_time")}
    geo = {k: np.full((n_eval, c.n_blocks), np.nan) for k in ("psi_x", "psi_w", "rho")} if variant == "whitened" else None
    elapsed, running, count, e = 0.0, 0.0, 0, 1

    def evaluate(k):
        model.eval()
        with torch.no_grad():
            losses, correct = [], 0
            for i in range(0, len(val_x), c.batch):
                logits = model(val_x[i:i + c.batch])
                y = val_y[i:i + c.batch]
                losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                                reduction="sum").item())
                correct += int((logits.argmax(-1) == y).sum())
            curves["val_loss"][k] = sum(losses) / val_y.numel()
            curves["val_accuracy"][k] = correct / val_y.numel()
            if geo is not None and (eval_points[k] % c.geometry_every == 0 or k == n_eval - 1):
                _, inputs = model(geo_x, return_block_inputs=True)
                for b, (a, w) in enumerate(inputs):
                    a64, w64 = a.double().numpy(), w.double().numpy()
                    geo["psi_x"][k, b] = whiteness(a64)
                    geo["psi_w"][k, b] = whiteness(w64)
                    geo["rho"][k, b] = stationarity(a64)
        model.train()
        curves["train_loss"][k] = running / count if count else np.nan
        curves["train_time"][k] = elapsed

    state = RunState(state_dir, f"{arm}_seed{seed}")
    start, saved = state.resume(model, opt, rng, evaluate)
    if saved is not None:
        curves, geo = saved["curves"], saved["geo"]
        elapsed, running, count, e = saved["counters"]

    # In a worker process the parent's bar reports the runs (two bars on one terminal garble it).
    bar = range(start, c.iterations) if _IN_WORKER else progress(range(start, c.iterations), desc=f"{arm} seed {seed}",
                                                                 total=c.iterations - start)
    for it in bar:
        starts = rng.integers(0, len(corpus.train) - c.context - 1, size=batch)
        xy = torch.from_numpy(windows(corpus.train, starts, c.context + 1))
        t0 = time.perf_counter()
        value = train_step(model, opt, xy, c, it, f"arm {arm!r}, seed {seed}")
        elapsed += time.perf_counter() - t0
        running, count = running + value, count + 1
        if e < n_eval and it + 1 == eval_points[e]:
            evaluate(e)
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"train {running / count:.3f} val {curves['val_loss'][e]:.3f}")
            running, count, e = 0.0, 0, e + 1
        if checkpoint_due(it, c):
            state.save(capture(it, model, opt, rng, curves=curves, geo=geo, counters=(elapsed, running, count, e)))
    return curves, geo, model


_IN_WORKER = False  # set in the training worker processes


def _worker_threads(n: int) -> None:
    """Initializer of a training worker process: its torch and attngeom thread counts."""
    import torch

    from ... import set_num_threads

    global _IN_WORKER
    _IN_WORKER = True
    torch.set_num_threads(n)
    set_num_threads(n)


def parallel_runs(fn, runs: list, config, describe=None):
    """``fn(*run)`` for each argument tuple of `runs`, in order: serially when config.workers is
    1 (or there is one run), else computed by `config.workers` processes (spawned: torch's
    threads do not survive a fork) with config.threads threads each. Each run is seeded by
    its arguments alone, so the results equal the serial ones bit for bit; the processes share
    the machine's cores, which the per-iteration times include. ``describe(run, out)`` gives
    the progress bar's note after a run (a worker's own bars are off)."""
    if config.workers <= 1 or len(runs) <= 1:
        yield from (fn(*run) for run in runs)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(config.workers, len(runs)), initializer=_worker_threads,
                             initargs=(config.threads,), mp_context=multiprocessing.get_context("spawn")) as pool:
        bar = progress(pool.map(fn, *zip(*runs)), desc="training runs", total=len(runs))
        for run, out in zip(runs, bar):
            if describe is not None and hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(describe(run, out))
            yield out


def require_torch(experiment: str):
    """torch, or an ImportError saying that `experiment` needs it and how to install it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError(f"the {experiment} experiment needs PyTorch: pip install 'attngeom[torch]'") from exc
    return torch


@contextlib.contextmanager
def threads(n: int):
    """torch's and attngeom's thread counts set to `n` inside the block, restored after it."""
    import torch

    from ... import get_num_threads, set_num_threads

    saved = (torch.get_num_threads(), get_num_threads())
    torch.set_num_threads(n)
    set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        set_num_threads(saved[1])


def _equal_width(config: TrainingConfig, vocab_size: int) -> int:
    """The d_model above config.d_model (a multiple of 2 n_heads) whose standard model's parameter count is
    nearest the whitened model's (at least one step wider, so the arm differs from "standard")."""
    from ...torch.gpt import GPT, count_parameters

    c = config
    target = count_parameters(GPT(vocab_size, c.d_model, c.n_blocks, c.n_heads, c.context, "whitened"))
    step = 2 * c.n_heads
    return min(range(c.d_model + step, 2 * c.d_model + 2 * step, step),
               key=lambda d: abs(count_parameters(GPT(vocab_size, d, c.n_blocks, c.n_heads, c.context)) - target))


def _time_iterations(variant, context, d_model, config: TrainingConfig, vocab_size: int) -> dict:
    """Milliseconds per training iteration (median of timed iterations after two warm-up ones)."""
    import torch

    from ...torch.gpt import GPT, count_parameters

    c = config
    torch.manual_seed(c.seed)
    model = GPT(vocab_size, d_model, c.n_blocks, c.n_heads, context, variant)
    opt = make_optimizer(model, c)
    g = torch.Generator().manual_seed(c.seed)
    x = torch.randint(0, vocab_size, (c.batch, context + 1), generator=g)

    def step():
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # the first warm-up iteration; timed() runs the second
    seconds = timed(step, c.timing_iterations, warm_up=True)[1]
    return {"variant": variant, "context": context, "d_model": d_model, "params": count_parameters(model),
            "ms_per_iter": 1e3 * seconds}


def run_training(config: TrainingConfig = TrainingConfig(), *, state_dir: Optional[str] = None) -> TrainingResult:
    """Train every arm over ``config.seeds`` seeds and measure Fig. 3-4 and Tables 1-3 of seed 004.

    Deterministic given the config and the thread count (the losses, accuracies and the
    whiteness series; the timings are wall-clock). Needs PyTorch. With `state_dir` every run
    saves its state there every ``config.checkpoint_every`` iterations, and a call with the
    same config and folder after an interruption continues each run from its last state to
    the same final weights and measurements, bit for bit (``attngeom run training --resume``).

    Example: ``res = run_training(TrainingConfig(corpus="markov", iterations=200, seeds=1))``
    """
    c = config.check()
    arms = parse_arms(c.variants)
    torch = require_torch("training")
    from ...torch.gpt import count_parameters, GPT

    with threads(c.threads):
        corpus = load_corpus(c).check_context(c.context)
        vocab = len(corpus.vocab)
        # fixed validation windows, evenly spread over the validation split
        starts = np.linspace(0, len(corpus.val) - c.context - 1, c.eval_windows).astype(np.int64)
        val = torch.from_numpy(windows(corpus.val, starts, c.context + 1))
        val_x, val_y = val[:, :-1].contiguous(), val[:, 1:].contiguous()
        geo_starts = np.linspace(0, len(corpus.val) - c.context - 1, c.geometry_batch).astype(np.int64)
        geo_x = torch.from_numpy(windows(corpus.val, geo_starts, c.context))
        eval_points = np.unique(np.r_[0, np.arange(c.eval_every, c.iterations + 1, c.eval_every), c.iterations])
        wide = _equal_width(c, vocab) if any(a.endswith("_equal") for a in arms) else c.d_model
        setup = {}
        for arm in arms:
            variant = base_variant(arm)
            d = wide if arm.endswith("_equal") else c.d_model
            b = c.batch // 2 if arm.endswith("_half") else c.batch
            n_params = count_parameters(GPT(vocab, d, c.n_blocks, c.n_heads, c.context, variant))
            setup[arm] = {"variant": variant, "d_model": d, "batch": b, "params": n_params}
        names = ("val_loss", "val_accuracy", "train_loss", "train_time")
        results = {k: {arm: np.empty((c.seeds, len(eval_points))) for arm in arms} for k in names}
        geometry, models = {}, {arm: [] for arm in arms}
        jobs = [(s, arm) for s in range(c.seeds) for arm in arms]  # seeds outermost, as a partial run wants
        runs = [(arm, c.seed + s, c, corpus, setup[arm], val_x, val_y, geo_x, eval_points, state_dir)
                for s, arm in jobs]
        # the bar's note: the finished run's last validation loss
        outputs = parallel_runs(_train_run, runs, c, lambda run, out: f"{run[0]} seed {run[1]}: val "
                                                                        f"{out[0]['val_loss'][-1]:.3f}")
        for (s, arm), (curves, geo, model) in zip(jobs, outputs):
            for k in names:
                results[k][arm][s] = curves[k]
            if geo is not None:
                g = geometry.setdefault(arm, {k: np.empty((c.seeds,) + v.shape) for k, v in geo.items()})
                for k, v in geo.items():
                    g[k][s] = v
            if c.checkpoints:
                models[arm].append(model)
        noise = np.random.default_rng(c.seed + 10 ** 6).standard_normal((c.geometry_batch, c.context, c.d_model))
        noise_floor = {"psi": float(whiteness(noise)), "rho": float(stationarity(noise))}
        timing = []
        if c.timing:
            points = [(c.context, c.d_model), (2 * c.context, c.d_model), (c.context, 2 * c.d_model)]
            for variant in progress(("standard", "whitened"), desc="Table 3"):
                for n, d in points:
                    timing.append(_time_iterations(variant, n, d, c, vocab))
    corpus_info = {"name": corpus.name, "characters": int(len(corpus.train) + len(corpus.val)),
                   "vocab_size": vocab, "sha256": corpus.sha256, "entropy_rate": corpus.entropy_rate,
                   "vocab": "".join(corpus.vocab), "python": "{}.{}.{}".format(*sys.version_info[:3])}
    return TrainingResult(c, corpus_info, arms, setup, eval_points, results["val_loss"], results["val_accuracy"],
                          results["train_loss"], results["train_time"], geometry, timing, noise_floor,
                          models if c.checkpoints else None)
