"""Shared behaviour of experiment results: a summary of named scalars, saved as JSON."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import numpy as np


class ExperimentResult:
    """Mixin for result dataclasses: ``summary()`` (dict of named scalars) and ``to_json``."""

    def summary(self) -> dict:  # pragma: no cover - every result defines it
        raise NotImplementedError

    # (regular expression, description) pairs; the first pattern that matches a summary key
    # (re.fullmatch) describes it, its groups filled into the description with str.format.
    DESCRIPTIONS: tuple = ()

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
                lines.append(f"| {key} | {value:.4g} | {self.describe(key)} |")
        return "\n".join(lines)

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
    """Base of the drivers' config dataclasses: the field every experiment has.

    ``seed`` (keyword-only) seeds the driver's random draws: a run is deterministic given its
    config (timings aside).
    """
    seed: int = dataclasses.field(default=0, kw_only=True)


def check_config(config, **minimums):
    """`config`, checked: raise ValueError naming the first field whose value is out of range.

    One rule for every driver's config dataclass, read off each field's default (every field
    has one): a boolean field takes True or False; an integer field takes an integer (not a
    boolean), ``seed`` one >= 0 (NumPy's generators refuse negative seeds), a field whose
    default is positive (a count or a size) one >= 1, any other one >= 0; a float field takes
    a finite real number, >= 0 when its default is >= 0 (scales, noise levels, sweep bounds).
    `minimums` raise the lower bound of integer fields (``n_sigma=2``: a sweep of two points at
    least), checked after the rule. Other checks that depend on the experiment (a bound above
    another, a fraction below 1) stay in its driver.

    Example: ``c = check_config(config, n_layers=1, n_sigma=2)``;
    ``check_config(IdentityConfig(n_heads=-3))`` raises "n_heads must be an integer >= 1, got -3"
    """
    for f in dataclasses.fields(config):
        name, default, value = f.name, f.default, getattr(config, f.name)
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        elif isinstance(default, int):
            minimum = 0 if name == "seed" or default <= 0 else 1
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        elif isinstance(default, float):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"{name} must be a real number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
            if default >= 0 and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
    for name, minimum in minimums.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
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
