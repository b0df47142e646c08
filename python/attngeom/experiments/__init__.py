"""Synthetic experiment drivers: each takes a config dataclass (with a seed) and returns a
result dataclass with ``summary()``, ``to_json(path)`` and one plot method per figure."""
from .identity import IdentityConfig, IdentityResult, run_identity

__all__ = ["IdentityConfig", "IdentityResult", "run_identity"]
