"""Saved states of training runs, so that an interrupted experiment resumes where it stopped.

A training run (one arm, one seed) saves, every ``checkpoint_every`` iterations and when it
ends, everything its next iterations depend on: the model's and the optimiser's tensors,
the iteration, the NumPy generator that draws the batches, torch's RNG and the curves and
counters gathered so far. A resumed run loads the state and continues; because every input of
an iteration is restored bit for bit, its final weights and measurements equal those of a run
that was never interrupted (wall-clock times aside).

Each state is written to a temporary file in the same folder, flushed to disk and renamed
over the previous one (``os.replace`` is atomic on POSIX), so a process killed at any moment
leaves either the previous state or the new one, never a torn file. The file begins with the
SHA-256 digest of its payload: a file damaged in place (a disk fault, a truncation) is
reported and that run starts over.
"""
from __future__ import annotations

import io
import os
import warnings
from typing import Optional

from .._durable import read_checked, write_checked

_SUFFIX = ".state"


class RunState:
    """The saved state of one run: ``<folder>/<key>.state`` (torch.save of a dict, written by
    :func:`attngeom._durable.write_checked`). ``folder`` None: nothing is saved or loaded."""

    def __init__(self, folder: Optional[str], key: str):
        self.path = None if folder is None else os.path.join(folder, key + _SUFFIX)

    def load(self) -> Optional[dict]:
        """The saved state, or None when there is none (or it is damaged: then a warning says
        so and the run starts over)."""
        if self.path is None or not os.path.exists(self.path):
            return None
        import torch

        try:
            return torch.load(io.BytesIO(read_checked(self.path)), weights_only=False)
        except Exception as exc:  # noqa: BLE001 - any damage means: start this run over
            warnings.warn(f"the saved state {self.path} cannot be used ({exc}); the run starts over",
                          RuntimeWarning, stacklevel=2)
            return None

    def save(self, state: dict) -> None:
        """Write `state` atomically, with its digest."""
        if self.path is None:
            return
        import torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        write_checked(self.path, buffer.getvalue())

    def resume(self, model, optimizer, rng, evaluate) -> tuple:
        """(iteration to start at, saved state): the saved state put back (:func:`restore`), or, when there is
        none, (0, None) after ``evaluate(0)`` measures the initial model."""
        saved = self.load()
        if saved is None:
            evaluate(0)
            return 0, None
        return restore(saved, model, optimizer, rng), saved


def capture(it: int, model, optimizer, rng, **extra) -> dict:
    """The state after iteration `it` (0-based) of a run: its model, optimiser, the NumPy
    generator of the data order and torch's RNG, plus the run's own `extra` entries."""
    import torch

    return {"iteration": it + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), **extra}


def restore(saved: dict, model, optimizer, rng) -> int:
    """Put what :func:`capture` saved back into the model, the optimiser and the generators,
    so the next iteration runs bit for bit as uninterrupted; returns the iteration to start at."""
    import torch

    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    rng.bit_generator.state = saved["rng"]
    torch.set_rng_state(saved["torch_rng"])
    return saved["iteration"]


def checkpoint_due(it: int, config) -> bool:
    """Whether a run saves its state after iteration `it` (0-based): every
    ``config.checkpoint_every`` iterations, and after the last one."""
    return (it + 1) % config.checkpoint_every == 0 or it + 1 == config.iterations
