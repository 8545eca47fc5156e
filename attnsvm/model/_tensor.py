"""The tensor trick: vectorisation, Kronecker rows of the Att-SVM, and its Gram matrix.

``vec`` stacks **columns** (column-major, Fortran order), so

    vec(A M B) = (Bᵀ ⊗ A) vec(M)      and      xᵀ W z = (z ⊗ x)ᵀ vec(W).

The row-major convention of Gao, Song, Xie (arXiv 2307.02419),
``vec_r(A₁ X A₂ᵀ) = (A₁ ⊗ A₂) vec_r(X)``, is :func:`vec_rowmajor`.

With ``Δ_it = x_iα_i − x_it`` the Att-SVM(α) constraints ``Δ_itᵀ W z_i ≥ 1`` become
``A vec(W) ≥ 1`` with rows ``a_it = z_i ⊗ Δ_it`` (:func:`svm_rows`), and the dual Gram
matrix factorises, ``⟨a_it, a_ju⟩ = (z_i·z_j)(Δ_it·Δ_ju)`` (:func:`svm_gram`), which
costs ``O(m² d)`` for ``m = n(T−1)`` rows instead of ``O(m² d²)``.

Scale: rows, Gram entries and margins are formed from rows rescaled by exact powers of two and
``frexp`` mantissa/exponent products, so nothing over- or underflows in an intermediate; a
result outside float64's normal range raises :class:`~attnsvm.NumericalError` naming it (never
a silent 0 or Inf).

References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick for attention);
Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import as_real_array
from ..errors import InvalidInstanceError
from ..scaling import EPS as _EPS
from ..scaling import FLOAT_TINY, range_error
from ._instance import Instance, pow2_split, split_rows

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


_LN2 = math.log(2.0)


def _exact_products(p: FloatArray, q: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``p·q`` elementwise (broadcast) as ``(value, mantissa, exponent)`` from ``frexp``.

    The mantissas multiply in ``[¼, 1)`` and the exponents add as integers, so no intermediate
    overflows or underflows; ``value`` is ``ldexp`` of the two (``inf`` or subnormal only when the
    product itself is out of range).
    """
    mp, ep = np.frexp(p)
    mq, eq = np.frexp(q)
    m = mp * mq
    e = ep + eq
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(m, e), m, e


def _log_abs(m: FloatArray, e: FloatArray) -> float:
    """``log|m·2^e|`` of one entry given by mantissa and exponent."""
    return math.log(abs(float(m))) + float(e) * _LN2


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
    """The Att-SVM(α) constraints in factored form, one row per ``(i, t)``, ``t ≠ α_i`` an allowed token.

    ``deltas[r] = x_iα_i − x_it`` and ``queries[r] = z_i`` for row ``r ↔ pairs[r] = (i, t)``;
    the constraint is ``deltas[r]ᵀ W queries[r] ≥ 1``. Rows are ordered by sequence, then token.
    """

    deltas: FloatArray  # (m, d)
    queries: FloatArray  # (m, d)
    pairs: NDArray[np.intp]  # (m, 2): (i, t)
    alpha: NDArray[np.intp]  # (n,)


def constraint_pairs(inst: Instance, a: NDArray[np.intp]) -> NDArray[np.intp]:
    """The ``(i, t)`` of the Att-SVM(α) rows, by sequence then token: ``t ≠ α_i``, ``t`` allowed.

    ``a`` is a validated token choice (:meth:`Instance.check_alpha`). Shape ``(m, 2)``.
    """
    n, T, _ = inst.shape
    ii, tt = np.meshgrid(np.arange(n), np.arange(T), indexing="ij")
    keep = tt != a[:, None]
    if inst.mask is not None:
        keep &= inst.mask
    return np.stack([ii[keep], tt[keep]], axis=1).astype(np.intp)


def svm_constraints(inst: Instance, alpha: ArrayLike | None = None) -> SVMConstraints:
    """Factored Att-SVM(α) constraints; ``alpha=None`` means the optimal tokens.

    Rows only for the allowed tokens ``t ≠ α_i`` of :attr:`Instance.mask` (``Σ_i (T_i − 1)`` rows, ``T_i``
    the allowed tokens of sequence ``i``; a sequence with one allowed token has none).

    Scale: any finite data; ``deltas`` are exact (a difference that lands below the normal range
    is exact in IEEE arithmetic). Raises :class:`~attnsvm.NumericalError` when a difference
    ``x_iα − x_it`` exceeds 1.8e308 (tokens of opposite sign near the top of the range).
    """
    a = inst.check_alpha(alpha)
    pairs = constraint_pairs(inst, a)
    with np.errstate(over="ignore"):
        deltas = inst.X[pairs[:, 0], a[pairs[:, 0]]] - inst.X[pairs[:, 0], pairs[:, 1]]
    if not np.all(np.isfinite(deltas)):
        # Halving both tokens is exact (they are ≥ 2^−1021 in size when the difference overflows).
        half = np.ldexp(inst.X[pairs[:, 0], a[pairs[:, 0]]], -1) - np.ldexp(
            inst.X[pairs[:, 0], pairs[:, 1]], -1
        )
        raise range_error(
            "a token difference x_iα − x_it",
            math.log(float(np.max(np.abs(half)))) + _LN2,
            remedy="Scale X down (the Att-SVM solution scales as W_mm(cX, cz) = W_mm(X, z)/c²)",
        )
    queries = inst.z[pairs[:, 0]]
    return SVMConstraints(deltas, np.array(queries), pairs, a)


def svm_rows(inst: Instance, alpha: ArrayLike | None = None) -> FloatArray:
    """Rows of the vectorised Att-SVM, shape ``(n(T−1), d²)`` (``Σ_i (T_i − 1)`` rows with a mask).

    Row ``r ↔ (i, t)`` is ``a_it = z_i ⊗ (x_iα_i − x_it)``, so that
    ``a_it · vec(W) = (x_iα_i − x_it)ᵀ W z_i`` (column-major :func:`vec`).
    Rows are ordered by sequence, then token (skipping ``t = α_i`` and masked tokens).

    Scale: any finite data; every entry is the exactly rounded product ``z_j Δ_k`` when it is
    normal, and the rows are returned when every entry is finite and each nonzero row's norm
    ``||z_i||·||Δ_it||`` is at least 2.2e-308 (entries below 2.2e-308 are then right to ``eps``
    normwise; a norm above 1.8e308 with finite entries is fine: the entries are exact); otherwise
    raises :class:`~attnsvm.NumericalError` naming the entry's or row's size.
    """
    c = svm_constraints(inst, alpha)
    # np.kron(z, Δ)[j·d + k] = z_j Δ_k = vec(Δ zᵀ)[j·d + k]  (column-major). The products are
    # formed from frexp mantissas and exponents: an entry over/underflows only if it is itself
    # out of range, never through an intermediate.
    val, m, e = _exact_products(c.queries[:, :, None], c.deltas[:, None, :])
    dd = inst.d * inst.d  # explicit: a masked instance may have no row (m = 0)
    m_rows = m.reshape(len(c.pairs), dd)
    e_rows = e.reshape(len(c.pairs), dd)
    rows = val.reshape(len(c.pairs), dd)
    if not np.all(np.isfinite(rows)):
        r, k = np.argwhere(~np.isfinite(rows))[0]
        raise range_error(
            "an Att-SVM row entry z_ij·Δ_itk",
            _log_abs(m_rows[r, k], e_rows[r, k]),
            remedy="Scale X or z down",
        )
    # Row norms from the rescaled factors: ||a_it|| = ||z_i||·||Δ_it||, in log space.
    zs, ez = split_rows(c.queries, 1)
    ds, ed = split_rows(c.deltas, 1)
    nz = np.linalg.norm(zs, axis=1) * np.linalg.norm(ds, axis=1)
    with np.errstate(under="ignore", over="ignore"):
        norms = np.ldexp(nz, ez + ed)
    low = (nz > 0) & (norms < FLOAT_TINY)
    if np.any(low):
        r = int(np.flatnonzero(low)[0])
        raise range_error(
            "the norm ||z_i||·||x_iα − x_it|| of an Att-SVM row",
            math.log(float(nz[r])) + float(ez[r] + ed[r]) * _LN2,
            remedy="Scale X or z up (the Att-SVM solution scales as W_mm(cX, cz) = W_mm(X, z)/c²)",
        )
    return rows


def svm_gram(inst: Instance, alpha: ArrayLike | None = None) -> FloatArray:
    """Gram matrix ``K = A Aᵀ`` of :func:`svm_rows`, factorised:
    ``K[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju)``, in ``O(m² d)`` without forming ``d²``-long rows.

    Scale: any finite data; each entry to absolute error ``≲ 2d·eps·||a_it||·||a_ju||``. Returned
    when every entry is below 1.8e308 and every nonzero diagonal entry ``||a_it||²`` is at least
    2.2e-308 (then off-diagonal entries below it are right to that absolute error); otherwise raises
    :class:`~attnsvm.NumericalError` naming the entry's size.
    """
    c = svm_constraints(inst, alpha)
    # Both factors from rows rescaled by powers of two (no overflow or underflow in the dot
    # products), then multiplied through frexp mantissas/exponents with each row's scale put back.
    zs, ez = split_rows(c.queries, 1)
    ds, ed = split_rows(c.deltas, 1)
    Kz = zs @ zs.T  # each row rescaled on its own: |Kz| ≤ d, and ≥ ¼·cos for a pair
    Kd = ds @ ds.T
    _, m, e = _exact_products(Kz, Kd)
    e = e + (ez + ed)[:, None] + (ez + ed)[None, :]
    with np.errstate(over="ignore", under="ignore"):
        K = np.ldexp(m, e)
    if not np.all(np.isfinite(K)):
        r, q = np.argwhere(~np.isfinite(K))[0]
        raise range_error("an Att-SVM Gram entry (z_i·z_j)(Δ_it·Δ_ju)", _log_abs(m[r, q], e[r, q]))
    diag_m, diag_e = np.diag(m), np.diag(e)
    dk = np.diag(K)
    low = (diag_m > 0) & (dk < FLOAT_TINY)
    if np.any(low):
        r = int(np.flatnonzero(low)[0])
        raise range_error(
            "a diagonal Att-SVM Gram entry ||z_i||²·||Δ_it||²",
            _log_abs(diag_m[r], diag_e[r]),
            remedy="Scale X or z up (the Att-SVM solution scales as W_mm(cX, cz) = W_mm(X, z)/c²)",
        )
    return K


def svm_margins(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> FloatArray:
    """Constraint values ``(x_iα_i − x_it)ᵀ W z_i`` for every row of :func:`svm_rows`, shape ``(m,)``.

    Scale: any finite data; each to absolute error ``≲ d²·eps·Σ|Δ_k W_kj z_j|``; formed from
    power-of-two rescaled ``Δ``, ``W``, ``z``. Raises :class:`~attnsvm.NumericalError` when a
    value exceeds 1.8e308, or when it falls below the normal range and its rounding to the subnormal
    grid (up to 2^−1075) would exceed that error bound (a margin of 2^−1100 is never returned as 0).
    """
    Wa = inst.check_weights(W)
    c = svm_constraints(inst, alpha)
    ds, ed = split_rows(c.deltas, 1)
    Ws, ew = pow2_split(Wa)
    zs, ez = split_rows(c.queries, 1)
    core = np.einsum("rk,kj,rj->r", ds, Ws, zs)  # |core| ≤ d²
    e = ed + ew + ez
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(core, e)
        # Below the normal range ldexp rounds to the subnormal grid (absolute error ≤ 2^−1075). That is
        # within the documented d²·eps·Σ|terms| unless the terms themselves are tiny: then refuse
        # (unless the value is exact), never return a 0 or a value that lost its digits.
        spread = Ws.shape[0] ** 2 * _EPS * np.einsum("rk,kj,rj->r", np.abs(ds), np.abs(Ws), np.abs(zs))
        lost = (np.abs(out) < FLOAT_TINY) & (np.ldexp(out, -e) != core) & (np.ldexp(spread, e + 1075) < 1.0)
    bad = ~np.isfinite(out) | lost
    if np.any(bad):
        r = int(np.flatnonzero(bad)[0])
        raise range_error(
            "the Att-SVM margins (x_iα − x_it)ᵀ W z_i", math.log(abs(float(core[r]))) + float(e[r]) * _LN2
        )
    return out
