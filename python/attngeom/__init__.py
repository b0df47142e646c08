"""attngeom: the geometry of attention.

Exact C++ kernels (Eigen, OpenMP) for softmax, kernel-swapped and Laplace-Radon attention,
with the diagnostics of the Laplace-Radon picture. Tokens are rows: ``X`` has shape
(..., n, d_model) and leading dimensions are batch dimensions that broadcast like NumPy.
"""
from ._config import __version__, get_num_threads, set_num_threads, show_config

__all__ = ["__version__", "get_num_threads", "set_num_threads", "show_config"]
