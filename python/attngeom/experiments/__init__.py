"""Synthetic experiment drivers: each takes a config dataclass (with a seed and ``check()``) and
returns a result dataclass with ``summary()``, ``to_json(path)``, ``table()``, one plot method
per figure (``figures()`` gives them all) and the artifacts it declares (``ARTIFACTS``,
written by ``save_artifacts(folder)``). ``EXPERIMENTS`` maps the CLI names to (config class,
run function); ``run_experiment`` runs one into a run folder (:mod:`.run`)."""
from .dimension import DimensionConfig, DimensionSweepResult, run_dimension
from .folders import write_folder
from .identity import IdentityConfig, IdentityResult, run_identity
from .induction import InductionConfig, InductionResult, run_induction
from .inverse import InverseConfig, InverseResult, run_inverse
from .projection import ProjectionConfig, ProjectionResult, run_projection
from .random_features import RandomFeaturesConfig, RandomFeaturesResult, run_random_features
from .run import experiment, run_experiment, run_summary
from .tomography import TomographyConfig, TomographyResult, run_tomography
from .training import TrainingConfig, TrainingResult, run_training
from .whitening import WhiteningConfig, WhiteningResult, run_whitening

EXPERIMENTS = {
    "tomography": (TomographyConfig, run_tomography),
    "dimension": (DimensionConfig, run_dimension),
    "identity": (IdentityConfig, run_identity),
    "projection": (ProjectionConfig, run_projection),
    "whitening": (WhiteningConfig, run_whitening),
    "random_features": (RandomFeaturesConfig, run_random_features),
    "inverse": (InverseConfig, run_inverse),
    "training": (TrainingConfig, run_training),
    "induction": (InductionConfig, run_induction),
}

__all__ = ["EXPERIMENTS", "experiment", "run_experiment", "run_summary", "write_folder", "IdentityConfig",
           "IdentityResult", "run_identity", "TomographyConfig", "TomographyResult", "run_tomography",
           "DimensionConfig", "DimensionSweepResult", "run_dimension", "ProjectionConfig", "ProjectionResult",
           "run_projection", "WhiteningConfig", "WhiteningResult", "run_whitening", "RandomFeaturesConfig",
           "RandomFeaturesResult", "run_random_features", "InverseConfig", "InverseResult", "run_inverse",
           "TrainingConfig", "TrainingResult", "run_training", "InductionConfig", "InductionResult", "run_induction"]
