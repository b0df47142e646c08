"""Linear subspaces stored by the smaller of themselves and their orthogonal complement.

The null spaces of an attention head are mostly huge: ker(B) for B = W_Q W_K^T is
d_model - d_k wide (Laplace-Radon eq. 18), ker(W_K^T) likewise (eq. 19). Storing an
orthonormal basis of such a space costs d_model^2 numbers; its complement, the row space,
costs d_model d_k. A :class:`Subspace` keeps an orthonormal basis of whichever of the two is
smaller and answers every question (projection, membership, principal angles) from it,
materialising the other only when :meth:`Subspace.basis` is asked for it.

Bases are columns, as in ``scipy.linalg.null_space``: ``basis()`` has shape
(ambient_dim, dim). Vectors passed to ``project`` and ``contains`` are rows (..., ambient_dim),
the library's token convention.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ._operands import check_finite, finite_result, flag, real_array, scalar


def _orthogonal_complement(q: np.ndarray) -> np.ndarray:
    """Orthonormal basis (n, n - k) of the complement of the span of q's orthonormal columns."""
    n, k = q.shape
    if k == 0:
        return np.eye(n, dtype=q.dtype)
    full, _ = np.linalg.qr(q, mode="complete")
    return np.ascontiguousarray(full[:, k:])


def _angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles (descending) between the spans of orthonormal column sets a, b.

    Cosines from svd(a^T b), small angles from the sines svd(b - a a^T b) where the cosine
    is close to 1 (Bjorck-Golub), so angles near 0 are accurate to working precision.
    """
    if a.shape[1] < b.shape[1]:
        a, b = b, a
    if b.shape[1] == 0:
        return np.zeros(0, dtype=a.dtype)
    ab = a.T @ b
    cos = np.linalg.svd(ab, compute_uv=False)  # descending cosines: ascending angles
    sin = np.linalg.svd(b - a @ ab, compute_uv=False)  # descending sines: descending angles
    angles_from_cos = np.arccos(np.clip(cos[::-1], -1.0, 1.0))
    angles_from_sin = np.arcsin(np.clip(sin, -1.0, 1.0))
    return np.where(cos[::-1] ** 2 >= 0.5, angles_from_sin, angles_from_cos)


class Subspace:
    """A linear subspace of R^ambient_dim with an orthonormal basis of it or of its complement.

    Build one with :meth:`Subspace.span` (the span of given vectors) or get one from
    :func:`attngeom.null_space`, :func:`attngeom.parameter_nulls`, :func:`attngeom.tilt_coverage`.

    Attributes
    ----------
    dim : int
        Dimension of the subspace.
    ambient_dim : int
        Dimension of the space it lives in.
    stores_complement : bool
        True when the stored basis spans the orthogonal complement (the smaller side).

    Example: ``ag.Subspace.span(np.eye(3)[:1]).complement().dim  # 2``
    """

    __slots__ = ("_stored", "_is_complement")

    def __init__(self, basis: np.ndarray, *, complement: bool = False):
        """Wrap orthonormal columns ``basis`` (n, k): the subspace itself, or its complement.

        The columns must already be orthonormal (this is the internal constructor); use
        :meth:`span` for arbitrary vectors. The smaller side is what gets stored.
        """
        basis = real_array("basis", basis)
        if basis.ndim != 2:
            raise ValueError(f"basis must have shape (ambient_dim, k), got {basis.shape}")
        check_finite("basis", basis)
        basis = basis.astype(np.float32 if basis.dtype == np.float32 else np.float64, copy=False)
        n, k = basis.shape
        complement = flag("complement", complement)
        # The cheap part of orthonormality (O(n k)): every column has unit norm.
        if k:
            eps = float(np.finfo(basis.dtype).eps)
            with np.errstate(over="ignore"):
                norms = np.linalg.norm(basis.astype(np.float64), axis=0)
            if not np.all(np.abs(norms - 1) <= max(math.sqrt(eps), 10 * n * eps)):
                raise ValueError(f"basis must have orthonormal columns (column norms up to {np.max(norms):.3g}); "
                                 "Subspace.span(vectors) takes arbitrary vectors")
        if 2 * k > n:  # store the smaller side
            basis, complement = _orthogonal_complement(basis), not complement
        self._stored = np.ascontiguousarray(basis)
        self._is_complement = bool(complement)

    @classmethod
    def span(cls, vectors, *, rtol: Optional[float] = None) -> "Subspace":
        """The span of the rows of ``vectors`` (m, ambient_dim), rank decided by SVD.

        rtol: singular values <= rtol * sigma_max count as zero; default
        max(m, ambient_dim) * eps (NumPy's matrix_rank rule).
        """
        v = real_array("vectors", vectors)
        if v.ndim != 2:
            raise ValueError(f"vectors must have shape (m, ambient_dim), got {v.shape}")
        if v.shape[1] == 0:
            raise ValueError(f"vectors must have ambient_dim >= 1, got shape {v.shape}")
        check_finite("vectors", v)
        v = v.astype(np.float32 if v.dtype == np.float32 else np.float64, copy=False)
        if v.shape[0] == 0:
            return cls(np.zeros((v.shape[1], 0), v.dtype))
        _, s, vh = np.linalg.svd(v, full_matrices=False)
        rtol = max(v.shape) * np.finfo(v.dtype).eps if rtol is None else scalar("rtol", rtol, nonnegative=True)
        rank = int(np.count_nonzero(s > rtol * s[0])) if s.size else 0
        return cls(vh[:rank].T)

    # -- shape ---------------------------------------------------------------------------
    @property
    def ambient_dim(self) -> int:
        return self._stored.shape[0]

    @property
    def dim(self) -> int:
        k = self._stored.shape[1]
        return self.ambient_dim - k if self._is_complement else k

    @property
    def stores_complement(self) -> bool:
        return self._is_complement

    @property
    def dtype(self) -> np.dtype:
        return self._stored.dtype

    def __repr__(self) -> str:
        side = "complement" if self._is_complement else "subspace"
        return (f"Subspace(dim={self.dim}, ambient_dim={self.ambient_dim}, "
                f"stores the {side}: {self._stored.shape[1]} vectors)")

    # -- bases ---------------------------------------------------------------------------
    def basis(self) -> np.ndarray:
        """Orthonormal basis of the subspace, shape (ambient_dim, dim) (materialised if needed)."""
        if self._is_complement:
            return _orthogonal_complement(self._stored)
        return self._stored.copy()

    def complement_basis(self) -> np.ndarray:
        """Orthonormal basis of the orthogonal complement, shape (ambient_dim, ambient_dim - dim)."""
        if self._is_complement:
            return self._stored.copy()
        return _orthogonal_complement(self._stored)

    def complement(self) -> "Subspace":
        """The orthogonal complement (no computation: the same stored basis, the other side)."""
        out = Subspace.__new__(Subspace)
        out._stored = self._stored
        out._is_complement = not self._is_complement
        return out

    # -- vectors -------------------------------------------------------------------------
    def _vectors(self, x) -> np.ndarray:
        x = real_array("x", x)
        if x.ndim < 1 or x.shape[-1] != self.ambient_dim:
            raise ValueError(f"x must have shape (..., {self.ambient_dim}), got {x.shape}")
        check_finite("x", x)
        return x.astype(np.result_type(x.dtype, self._stored.dtype, np.float32), copy=False)

    @finite_result
    def project(self, x) -> np.ndarray:
        """Orthogonal projection of the rows of x (..., ambient_dim) onto the subspace."""
        x = self._vectors(x)
        q = self._stored.astype(x.dtype, copy=False)
        along = (x @ q) @ q.T
        return x - along if self._is_complement else along

    @finite_result
    def residual(self, x) -> np.ndarray:
        """``|x - project(x)|`` for each row of x: the distance to the subspace, shape (...)."""
        x = self._vectors(x)
        return np.linalg.norm(x - self.project(x), axis=-1)

    def contains(self, x, *, atol: float = 0.0, rtol: Optional[float] = None) -> np.ndarray:
        """Whether each row of x lies in the subspace: ``|x - P x|`` <= atol + rtol ``|x|``.

        rtol defaults to 100 * ambient_dim * eps of the stored basis's dtype (the rounding
        of one projection). Returns a bool array of shape x.shape[:-1].
        """
        x = self._vectors(x)
        atol = scalar("atol", atol, nonnegative=True)
        if rtol is None:
            rtol = 100 * self.ambient_dim * np.finfo(self._stored.dtype).eps
        rtol = scalar("rtol", rtol, nonnegative=True)
        return self.residual(x) <= atol + rtol * np.linalg.norm(x, axis=-1)

    # -- comparisons ---------------------------------------------------------------------
    def principal_angles(self, other: "Subspace") -> np.ndarray:
        """Principal angles (radians, descending, min(dim, other.dim) of them) to ``other``.

        Same convention as ``scipy.linalg.subspace_angles``. When both subspaces have the
        same dimension and both store their complements, the angles are computed from the
        complements (the nonzero principal angles of two equal-dimensional subspaces and of
        their complements coincide), so two (d_model - d_k)-dimensional nulls are compared
        at O(d_model d_k^2) cost.
        """
        if not isinstance(other, Subspace):
            raise TypeError(f"other must be a Subspace, got {type(other).__name__}")
        if other.ambient_dim != self.ambient_dim:
            raise ValueError(f"other lives in R^{other.ambient_dim}, this subspace in R^{self.ambient_dim}")
        k = min(self.dim, other.dim)
        if self.dim == other.dim and self._is_complement and other._is_complement:
            small = _angles(self._stored, other._stored.astype(self._stored.dtype, copy=False))
            return np.concatenate([small, np.zeros(k - small.size, small.dtype)])
        a, b = self.basis(), other.basis()
        return _angles(a, b.astype(a.dtype, copy=False))

    def distance(self, other: "Subspace") -> float:
        """The largest principal angle to ``other`` (radians); pi/2 when dimensions differ."""
        if not isinstance(other, Subspace):
            raise TypeError(f"other must be a Subspace, got {type(other).__name__}")
        if other.dim != self.dim:
            return float(np.pi / 2)
        angles = self.principal_angles(other)
        return float(angles.max()) if angles.size else 0.0
