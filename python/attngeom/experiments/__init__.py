"""Synthetic experiment drivers: each takes a config dataclass (with a seed) and returns a
result dataclass with ``summary()``, ``to_json(path)``, ``table()`` and one plot method per
figure (``figures()`` gives them all). ``EXPERIMENTS`` maps the CLI names to
(config class, run function)."""
from .dimension import DimensionConfig, DimensionSweepResult, run_dimension
from .identity import IdentityConfig, IdentityResult, run_identity
from .tomography import TomographyConfig, TomographyResult, run_tomography

EXPERIMENTS = {
    "tomography": (TomographyConfig, run_tomography),
    "dimension": (DimensionConfig, run_dimension),
    "identity": (IdentityConfig, run_identity),
}

__all__ = ["EXPERIMENTS", "IdentityConfig", "IdentityResult", "run_identity", "TomographyConfig", "TomographyResult",
           "run_tomography", "DimensionConfig", "DimensionSweepResult", "run_dimension"]
