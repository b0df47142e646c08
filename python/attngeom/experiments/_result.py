"""Shared behaviour of experiment results: a summary of named scalars, saved as JSON."""
from __future__ import annotations

import dataclasses
import json
import os


class ExperimentResult:
    """Mixin for result dataclasses: ``summary()`` (dict of named scalars) and ``to_json``."""

    def summary(self) -> dict:  # pragma: no cover - every result defines it
        raise NotImplementedError

    def to_json(self, path) -> str:
        """Write {"config": ..., "summary": ...} to `path`; returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        payload = {"config": dataclasses.asdict(self.config), "summary": self.summary()}
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=False)
        return str(path)
