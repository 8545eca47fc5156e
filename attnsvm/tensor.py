"""The tensor trick: vectorisation, Kronecker rows of the Att-SVM, and its Gram matrix.

``vec`` stacks **columns** (column-major, Fortran order), so

    vec(A M B) = (Bᵀ ⊗ A) vec(M)      and      xᵀ W z = (z ⊗ x)ᵀ vec(W).

The row-major convention of Gao, Song, Xie (arXiv 2307.02419),
``vec_r(A₁ X A₂ᵀ) = (A₁ ⊗ A₂) vec_r(X)``, is :func:`vec_rowmajor`.

With ``Δ_it = x_iα_i − x_it`` the Att-SVM(α) constraints ``Δ_itᵀ W z_i ≥ 1`` become
``A vec(W) ≥ 1`` with rows ``a_it = z_i ⊗ Δ_it`` (:func:`svm_rows`), and the dual Gram
matrix factorises, ``⟨a_it, a_ju⟩ = (z_i·z_j)(Δ_it·Δ_ju)`` (:func:`svm_gram`), which
costs ``O(m² d)`` for ``m = n(T−1)`` rows instead of ``O(m² d²)``.

References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick for attention);
Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import InvalidInstanceError
from .instance import Instance, as_real_array

__all__ = [
    "vec",
    "unvec",
    "vec_rowmajor",
    "unvec_rowmajor",
    "SVMConstraints",
    "svm_constraints",
    "svm_rows",
    "svm_gram",
    "svm_margins",
]

FloatArray = NDArray[np.float64]


def vec(M: ArrayLike) -> FloatArray:
    """Column-major vectorisation: ``vec(M)[j·p + k] = M[k, j]`` for ``M`` of shape ``(p, q)``."""
    Ma = as_real_array(M, "M", ndim=2)
    return np.array(Ma.reshape(-1, order="F"))


def unvec(w: ArrayLike, shape: tuple[int, int]) -> FloatArray:
    """Inverse of :func:`vec`: the ``(p, q)`` matrix whose columns are stacked in ``w``."""
    wa = as_real_array(w, "w", ndim=1)
    p, q = shape
    if wa.size != p * q:
        raise InvalidInstanceError(f"w has {wa.size} entries; shape {shape} needs {p * q}")
    return np.array(wa.reshape((p, q), order="F"))


def vec_rowmajor(M: ArrayLike) -> FloatArray:
    """Row-major vectorisation ``vec_r``: rows stacked, ``vec_r(A₁XA₂ᵀ) = (A₁ ⊗ A₂) vec_r(X)``."""
    Ma = as_real_array(M, "M", ndim=2)
    return np.array(Ma.reshape(-1, order="C"))


def unvec_rowmajor(w: ArrayLike, shape: tuple[int, int]) -> FloatArray:
    """Inverse of :func:`vec_rowmajor`."""
    wa = as_real_array(w, "w", ndim=1)
    p, q = shape
    if wa.size != p * q:
        raise InvalidInstanceError(f"w has {wa.size} entries; shape {shape} needs {p * q}")
    return np.array(wa.reshape((p, q), order="C"))


class SVMConstraints(NamedTuple):
    """The Att-SVM(α) constraints in factored form, one row per ``(i, t)``, ``t ≠ α_i``.

    ``deltas[r] = x_iα_i − x_it`` and ``queries[r] = z_i`` for row ``r ↔ pairs[r] = (i, t)``;
    the constraint is ``deltas[r]ᵀ W queries[r] ≥ 1``. Rows are ordered by sequence, then token.
    """

    deltas: FloatArray  # (m, d)
    queries: FloatArray  # (m, d)
    pairs: NDArray[np.intp]  # (m, 2): (i, t)
    alpha: NDArray[np.intp]  # (n,)


def svm_constraints(inst: Instance, alpha: ArrayLike | None = None) -> SVMConstraints:
    """Factored Att-SVM(α) constraints; ``alpha=None`` means the optimal tokens."""
    a = inst.check_alpha(alpha)
    n, T, _ = inst.shape
    ii, tt = np.meshgrid(np.arange(n), np.arange(T), indexing="ij")
    keep = tt != a[:, None]
    pairs = np.stack([ii[keep], tt[keep]], axis=1).astype(np.intp)
    deltas = inst.X[pairs[:, 0], a[pairs[:, 0]]] - inst.X[pairs[:, 0], pairs[:, 1]]
    queries = inst.z[pairs[:, 0]]
    return SVMConstraints(deltas, np.array(queries), pairs, a)


def svm_rows(inst: Instance, alpha: ArrayLike | None = None) -> FloatArray:
    """Rows of the vectorised Att-SVM, shape ``(n(T−1), d²)``.

    Row ``r ↔ (i, t)`` is ``a_it = z_i ⊗ (x_iα_i − x_it)``, so that
    ``a_it · vec(W) = (x_iα_i − x_it)ᵀ W z_i`` (column-major :func:`vec`).
    Rows are ordered by sequence, then token (skipping ``t = α_i``).
    """
    c = svm_constraints(inst, alpha)
    # np.kron(z, Δ)[j·d + k] = z_j Δ_k = vec(Δ zᵀ)[j·d + k]  (column-major)
    return np.einsum("rj,rk->rjk", c.queries, c.deltas).reshape(len(c.pairs), -1)


def svm_gram(inst: Instance, alpha: ArrayLike | None = None) -> FloatArray:
    """Gram matrix ``K = A Aᵀ`` of :func:`svm_rows`, factorised:
    ``K[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju)``, in ``O(m² d)`` without forming ``d²``-long rows."""
    c = svm_constraints(inst, alpha)
    return (c.queries @ c.queries.T) * (c.deltas @ c.deltas.T)


def svm_margins(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> FloatArray:
    """Constraint values ``(x_iα_i − x_it)ᵀ W z_i`` for every row of :func:`svm_rows`, shape ``(m,)``."""
    Wa = inst.check_weights(W)
    c = svm_constraints(inst, alpha)
    return np.einsum("rk,kj,rj->r", c.deltas, Wa, c.queries)
