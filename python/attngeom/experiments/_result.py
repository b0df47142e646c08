"""Shared behaviour of experiment results: a summary of named scalars, saved as JSON."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

from .._operands import count, flag, scalar


class ExperimentResult:
    """Mixin for result dataclasses: ``summary()`` (dict of named scalars) and ``to_json``."""

    def summary(self) -> dict:  # pragma: no cover - every result defines it
        raise NotImplementedError

    # (regular expression, description) pairs; the first pattern that matches a summary key
    # (re.fullmatch) describes it, its groups filled into the description with str.format.
    DESCRIPTIONS: tuple = ()

    # What a run folder holds besides config, summaries and figures, e.g. ("checkpoints",): a result type that
    # declares ARTIFACTS defines save_artifacts(folder), which the run-folder writer calls. None by default.
    ARTIFACTS: tuple = ()

    def describe(self, key: str) -> str:
        """One line saying what the summary scalar `key` measures ("" when undescribed)."""
        for pattern, text in self.DESCRIPTIONS:
            m = re.fullmatch(pattern, key)
            if m:
                return text.format(*m.groups())
        return ""

    def table(self) -> str:
        """Markdown table of the summary's scalars with a description of each (nested entries,
        such as sweeps, are left to summary.json). Results with paper values override it to add
        that column."""
        lines = ["| quantity | value | description |", "|---|---|---|"]
        for key, value in self.summary().items():
            if not isinstance(value, (dict, list)):
                lines.append(f"| {key} | {self.cell(value)} | {self.describe(key)} |")
        return "\n".join(lines)

    @staticmethod
    def cell(value) -> str:
        """A summary scalar as :meth:`table` shows it: four significant digits."""
        return f"{value:.4g}"

    def to_json(self, path) -> str:
        """Write {"config": ..., "summary": ...} to `path` as strict JSON (NaN and infinities,
        e.g. a quantity that does not exist on the chosen grid, become null); returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        payload = _strict({"config": dataclasses.asdict(self.config), "summary": self.summary()})
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=False, allow_nan=False)
        return str(path)


@dataclasses.dataclass
class ExperimentConfig:
    """Base of the drivers' config dataclasses: the field every experiment has, and the check.

    ``seed`` (keyword-only) seeds the driver's random draws: a run is deterministic given its
    config (timings aside).
    """
    seed: int = dataclasses.field(default=0, kw_only=True)

    MINIMUMS = {}  # raised lower bounds of integer fields (check_config's `minimums`), e.g. {"n_sigma": 2}

    def check(self):
        """This config, checked by :func:`check_config` with MINIMUMS (ValueError naming the first field out of
        range); a driver and the run-folder writer both call it. Experiments whose fields constrain each other
        (a bound above another, a fraction below 1) extend it."""
        return check_config(self, **self.MINIMUMS)


def check_config(config, **minimums):
    """`config`, checked: raise ValueError naming the first field whose value is out of range.

    One rule for every driver's config dataclass, read off each field's default (every field
    has one), by the operand layer's checks: a boolean field takes True or False
    (``_operands.flag``); an integer field takes an integer, not a boolean (``_operands.count``),
    ``seed`` one >= 0 (NumPy's generators refuse negative seeds), a field whose default is
    positive (a count or a size) one >= 1, any other one >= 0; a float field takes a finite real
    number (``_operands.scalar``), >= 0 when its default is >= 0 (scales, noise levels, sweep
    bounds). `minimums` raise the lower bound of integer fields (``n_sigma=2``: a sweep of two
    points at least). A value of the wrong type is a ValueError too, like any other bad value.

    Example: ``c = check_config(config, n_layers=1, n_sigma=2)``;
    ``check_config(IdentityConfig(n_heads=-3))`` raises "n_heads must be an integer >= 1, got -3"
    """
    try:
        for f in dataclasses.fields(config):
            name, default, value = f.name, f.default, getattr(config, f.name)
            if isinstance(default, bool):
                flag(name, value)
            elif isinstance(default, int):
                count(name, value, max(0 if name == "seed" or default <= 0 else 1, minimums.get(name, 0)))
            elif isinstance(default, float) and scalar(name, value) < 0 <= default:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return config


def _strict(value):
    """value with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
