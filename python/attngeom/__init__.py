"""attngeom: the geometry of attention.

Exact C++ kernels (Eigen, OpenMP) for softmax, kernel-swapped and Laplace-Radon attention,
with the diagnostics of the Laplace-Radon picture. Tokens are rows: ``X`` has shape
(..., n, d_model) and leading dimensions are batch dimensions that broadcast like NumPy.

dtypes: float32 and float64 are kept, float16 is computed and returned in float32,
integer or mixed input in float64.

Examples
--------
>>> import numpy as np, attngeom as ag
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((5, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
>>> y = ag.softmax_attention(q, k, v, causal=True)
>>> u, tau = ag.tilt_radius(q)
>>> bool(np.allclose(ag.laplace_radon_attention(u, tau, k, v, causal=True), y))
True
"""
import os as _os

# Idle thread pools spin before they sleep: OpenBLAS's workers for 2^28 cycles (tens of
# milliseconds), libgomp's for 300,000 iterations (a few). A forward pass alternates NumPy's
# BLAS products with the core's OpenMP kernels, and on a few cores each pool's spinning
# threads took the cores the other needed (the attention ran 2-4x slower right after a
# product, a product 1.4x slower right after the attention). Shorter spins, unless the
# environment says otherwise. libgomp reads its setting when the core module loads (below);
# OpenBLAS reads its own when NumPy is first imported, so it applies when attngeom is imported
# first (the command line, worker processes) or the variable is set before Python starts.
for _name, _value in (("GOMP_SPINCOUNT", "10000"), ("OPENBLAS_THREAD_TIMEOUT", "18")):
    _os.environ.setdefault(_name, _value)
del _name, _value

import typing as _typing  # noqa: E402

from . import _config  # noqa: E402
from ._config import get_num_threads, set_num_threads, show_config  # noqa: E402
from . import errors
from .errors import LayoutWarning
from .attention import (
    AttentionGrads,
    kernel_attention,
    kernel_attention_backward,
    softmax_attention,
    softmax_attention_backward,
)
from .attention_stats import AttentionStats
from .kernels import KERNELS, psi
from .lightning import deep_lightning, lightning_attention, lightning_attention_backward, lightning_layer
from .projection import LocalFlatness, local_flatness, projection_attention, projection_attention_backward
from .random_features import (
    RandomFeatures,
    feature_matrix,
    random_feature_attention,
    random_feature_attention_backward,
    random_features,
)
from .sampling import SampledAttention, sampled_attention
from .laplace_radon import (
    LogTransform,
    Transform,
    head_probe,
    laplace_radon_attention,
    laplace_radon_transform,
    log_partition_gradient,
    projected_cumulants,
    radon_project,
    tilt_radius,
)
from .stable_density import stable_density
from .subspace import Subspace
from .spectral import (
    SVD,
    GaugeErrors,
    ParameterNulls,
    RoutingNulls,
    TiltCoverage,
    TiltCoverageResult,
    cumulative_energy,
    effective_rank,
    factored_svd,
    gauge_invariance_error,
    gauge_transform,
    null_space,
    parameter_nulls,
    routing_nulls,
    singular_values,
    tilt_coverage,
)
from .head_diagnostics import HeadDiagnostics, head_diagnostics
from .dimension import (
    CriticalPoint,
    DimensionResult,
    expected_dimension,
    function_discrepancy,
    gl_transform,
    is_critical,
    rescale,
    virtual_network,
    virtual_weights,
    network_forward,
    neuromanifold_dimension,
    numerical_rank,
    parameter_count,
    parametrization_jacobian,
    random_weights,
)
from .circuits import (
    Injectivity,
    KeyValueMLP,
    LatentFactorization,
    PathExpansion,
    RouterGram,
    composition_scores,
    embedding_injectivity,
    head_operator,
    latent_factorization,
    layernorm,
    layernorm_jacobian,
    mlp_key_value,
    path_expansion,
    principal_angles,
    router_gram,
    topk_router,
    virtual_head,
)
from .whitening import (
    SteadyState,
    block_cholesky_factors,
    block_covariances,
    block_diagonal_factor,
    full_whitening,
    stationarity,
    steady_state_factor,
    vector_ar1,
    vector_ma1,
    WhitenGrads,
    whiten,
    whiten_backward,
    whiten_scan,
    whitened_attention,
    whiteness,
)
from .inverse import DensityFit, ExponentialSum, fit_exponential_sum, invert_laplace_density, wasserstein1
from .point_sets import PointSet, RecoveredHead, reconstruct_points, recover_keys
from .radon import (
    circle_mask,
    fourier_filter,
    iradon,
    iradon_sart,
    limited_angle,
    radon,
    radon_adjoint,
    rms_error,
    shepp_logan_phantom,
)
from . import plotting  # matplotlib itself is imported on first use
from ._deprecation import renamed_attributes as _renamed_attributes

# Real models and corpus runs load on first use: ``attngeom.Model``, ``attngeom.models`` or
# ``import attngeom.corpus`` imports them then. They are half the package's import time, and
# the kernels, the command line's other commands and the worker processes of a corpus run
# (which import attngeom, then what they need) do without them.
_LAZY = {
    "models": ("models", None),
    **{name: ("models", name) for name in (
        "Model", "ModelHeads", "load_heads", "load_model", "InductionScores", "LatentKeyCache", "LogitLens",
        "RouterStatistics", "WeightSpectra", "induction_scores", "latent_key_cache", "logit_lens",
        "router_statistics", "weight_spectra")},
    "corpus": ("corpus", None),
    **{name: ("corpus", name) for name in ("CorpusStatistics", "corpus_statistics", "write_activations")},
}
_renamed = _renamed_attributes(__name__, topk_routing="topk_router", routing_gram="router_gram",
                               RoutingGram="RouterGram")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = importlib.import_module(f"{__name__}.{module}")
        if attribute is not None:
            value = getattr(value, attribute)
        globals()[name] = value
        return value
    if name == "__version__":
        return _config.__version__
    return _renamed(name, stacklevel=3)


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


if _typing.TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from . import corpus, models
    from ._config import __version__
    from .corpus import CorpusStatistics, corpus_statistics, write_activations
    from .models import (
        InductionScores,
        LatentKeyCache,
        LogitLens,
        Model,
        ModelHeads,
        RouterStatistics,
        WeightSpectra,
        induction_scores,
        latent_key_cache,
        load_heads,
        load_model,
        logit_lens,
        router_statistics,
        weight_spectra,
    )

__all__ = [
    "__version__", "get_num_threads", "set_num_threads", "show_config", "errors", "LayoutWarning",
    "softmax_attention", "kernel_attention", "softmax_attention_backward", "kernel_attention_backward",
    "AttentionGrads", "AttentionStats", "projection_attention", "projection_attention_backward", "lightning_attention_backward",
    "random_feature_attention_backward", "local_flatness", "LocalFlatness",
    "lightning_attention", "lightning_layer", "deep_lightning",
    "random_feature_attention", "random_features", "feature_matrix", "RandomFeatures",
    "sampled_attention", "SampledAttention",
    "KERNELS", "psi", "stable_density",
    "tilt_radius", "radon_project", "laplace_radon_transform", "laplace_radon_attention",
    "projected_cumulants", "log_partition_gradient", "Transform", "LogTransform",
    "Subspace", "null_space", "singular_values", "factored_svd", "SVD", "parameter_nulls", "ParameterNulls",
    "effective_rank", "cumulative_energy", "tilt_coverage", "TiltCoverage", "TiltCoverageResult",
    "routing_nulls", "RoutingNulls", "gauge_transform", "gauge_invariance_error", "GaugeErrors",
    "head_diagnostics", "HeadDiagnostics",
    "network_forward", "parametrization_jacobian", "expected_dimension", "neuromanifold_dimension",
    "numerical_rank", "parameter_count", "random_weights", "DimensionResult", "virtual_weights",
    "whiten", "whiten_backward", "WhitenGrads", "whiten_scan", "block_covariances", "steady_state_factor", "SteadyState", "block_cholesky_factors", "block_diagonal_factor",
    "full_whitening", "whitened_attention", "whiteness", "stationarity", "vector_ma1", "vector_ar1",
    "head_operator", "virtual_head", "composition_scores", "path_expansion", "PathExpansion", "layernorm",
    "layernorm_jacobian", "topk_router", "router_gram", "RouterGram", "latent_factorization",
    "LatentFactorization", "principal_angles", "embedding_injectivity", "Injectivity", "mlp_key_value", "KeyValueMLP",
    "models", "load_heads", "ModelHeads", "load_model", "Model",
    "logit_lens", "LogitLens", "induction_scores", "InductionScores", "weight_spectra", "WeightSpectra",
    "latent_key_cache", "LatentKeyCache", "router_statistics", "RouterStatistics",
    "fit_exponential_sum", "ExponentialSum", "invert_laplace_density", "DensityFit", "wasserstein1",
    "reconstruct_points", "PointSet", "recover_keys", "RecoveredHead", "head_probe",
    "radon", "radon_adjoint", "iradon", "iradon_sart", "fourier_filter", "shepp_logan_phantom", "circle_mask",
    "limited_angle", "rms_error",
    "virtual_network", "gl_transform", "rescale", "function_discrepancy", "is_critical", "CriticalPoint",
    "corpus", "corpus_statistics", "CorpusStatistics", "write_activations",
]
