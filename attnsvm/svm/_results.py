"""What the Att-SVM solvers return: the solution with its certificate, the KKT residuals, the exact core's result.

Arrays in results are read-only (``_ro``); a result never aliases a caller's array.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray, IntArray
from ..errors import InfeasibleSVMError

Pairs = tuple[tuple[int, int], ...]


# =============================================================================== results
@dataclass(frozen=True)
class KKTResiduals:
    """Relative KKT residuals of ``min ½||w||² s.t. a_rᵀw ≥ b_r`` (or ``= b_r``) at ``(w, λ)``.

    Attributes:
      primal_feasibility: ``max_r max(0, b_r − a_rᵀw) / (|b_r| + ||a_r||·||w||)`` (``|·|`` on equality rows).
      dual_feasibility: ``max(0, −min_r λ_r) / max|λ|`` over inequality rows (before clipping to 0).
      stationarity: ``||w − Aᵀλ|| / ||w||`` (for Att-SVM ``||W − Σ λ_it Δ_it z_iᵀ||_F / ||W||_F``).
      complementary_slackness: ``max_r (|λ_r| / max|λ|)·|a_rᵀw − b_r| / (|b_r| + ||a_r||·||w||)``.
      duality_gap: ``|½||w||² − (bᵀλ − ½||Aᵀλ||²)| / (½||w||²)``.
    """

    primal_feasibility: float
    dual_feasibility: float
    stationarity: float
    complementary_slackness: float
    duality_gap: float

    def max(self) -> float:
        """Largest residual."""
        return max(
            self.primal_feasibility,
            self.dual_feasibility,
            self.stationarity,
            self.complementary_slackness,
            self.duality_gap,
        )


@dataclass(frozen=True, eq=False)
class MinNormSolution:
    """Result of :func:`min_norm_dual`.

    Attributes:
      multipliers: ``λ``, shape ``(m,)``; ``≥ 0`` on inequality rows; ``w = Aᵀλ``.
      support: indices of the active rows (``a_rᵀw = b_r`` to :data:`SUPPORT_RTOL`), equality rows included.
      weakly_active: indices of active inequality rows with ``λ_r = 0`` (a subset of ``support``).
      margins: ``a_rᵀw = (Kλ)_r``, shape ``(m,)``, computed from the primal coordinates.
      coords: the primal solution in the factor's coordinates, shape ``(k,)``: when ``A = L Pᵀ`` with
        ``P`` orthonormal columns and ``L`` the factor used (``factor`` argument), ``w = P·coords``.
      factor: the factor ``L`` (``LLᵀ = K``) that ``coords`` refers to, shape ``(m, k)``.
      norm: ``||w||₂``.
      kkt: relative :class:`KKTResiduals`.
      error_bound: first-order bound on the relative error of ``w``: ``cond(K_S)·eps`` plus what the
        active-set step's tolerances can leave (inequality multipliers held slightly negative, rows violated
        at rounding level; :func:`attnsvm.svm._dual._fro_error_bound`, the bound of ``solve_svm``).
      certified: ``error_bound`` and every KKT residual are ``≤ CERTIFY_RTOL``, and no row left out of the
        tight set is violated by enough to need a multiplier significant among the rows as posed (``2^{−k_r}``
        times its violation above ``MULTIPLIER_RTOL`` of the largest weighted multiplier): the norm-wise
        residuals cannot see a row whose ``b_r`` is far below the others (:func:`attnsvm.svm._dual._rows_resolved`).
      method: how the active set was found (``"active-set"`` from the hint, ``"nnls+active-set"``,
        ``"nnls"`` when the refinement failed and the NNLS point is returned uncertified, or
        ``"trivial"`` when no row needs ``w ≠ 0`` (inequality right-hand sides ``≤ 0``, equality ones
        ``0``) and ``w = 0``, ``λ = 0`` is the answer).
      iterations: active-set iterations used.
    """

    multipliers: FloatArray
    support: IntArray
    weakly_active: IntArray
    margins: FloatArray
    coords: FloatArray
    factor: FloatArray
    norm: float
    kkt: KKTResiduals
    error_bound: float
    certified: bool
    method: str
    iterations: int


class InfeasibleMinNormError(InfeasibleSVMError):
    """The constraints cannot all hold; carries a Farkas certificate.

    ``certificate`` (shape ``(m,)``, ``≥ 0`` on inequality rows) satisfies ``Aᵀc ≈ 0`` and
    ``bᵀc > 0``, so ``bᵀc ≤ cᵀAw = (Aᵀc)ᵀw`` would need ``||w|| ≥ bᵀc / ||Aᵀc||`` = ``norm_bound``
    (``inf`` when ``Aᵀc = 0`` exactly). ``rows`` lists the rows with ``c_r ≠ 0``.
    """

    def __init__(self, message: str, certificate: FloatArray, norm_bound: float) -> None:
        super().__init__(message)
        self.certificate = certificate
        self.norm_bound = norm_bound
        self.rows = np.flatnonzero(certificate != 0)


@dataclass(frozen=True, eq=False)
class SVMSolution:
    """Result of :func:`solve_svm`.

    Attributes:
      W: the solution, shape ``(d, d)``.
      alpha: the token choice, shape ``(n,)``.
      norm: ``"fro"`` or ``"nuc"``.
      method: the method that ran (``"primal"``, ``"vector"``, ``"dual"``; ``"auto"`` resolved).
      solver: what produced it, e.g. ``"cvxpy/CLARABEL + active-set"``.
      objective: ``||W||_F`` (fro) or ``||W||_*`` (nuc).
      pairs: ``(m, 2)`` array of ``(i, t)``, the rows of ``svm_rows(inst, alpha)`` in order.
      margins: ``Δ_itᵀ W z_i`` per row, shape ``(m,)``, computed from ``W``.
      duals: multipliers of ``min ½||W||_F²``, aligned with ``pairs`` (``vec(W) = svm_rowsᵀ·duals``);
        ``None`` for ``norm="nuc"``, and ``None`` when a non-negligible multiplier is not a normal double
        (they scale by ``1/(ab)²`` when ``X, z`` scale by ``a, b``: see ``duals_mantissa``). Multipliers
        below ``MULTIPLIER_RTOL·max`` that would be subnormal are returned as 0. Not unique when the
        Gram matrix is singular: compare ``W``.
      support: active constraints ``(i, t)`` (margin 1 to :data:`SUPPORT_RTOL`; nuc:
        :data:`NUC_SUPPORT_TOL`), weakly active ones included.
      weakly_active: the support pairs with multiplier 0 (fro only; ``()`` for nuc).
      kkt: relative :class:`KKTResiduals` of the Frobenius problem (``None`` for nuc).
      error_bound: fro: a first-order bound on ``||W − W_mm||_F/||W_mm||_F``: ``cond(K_S)·eps``, plus the
        terms of held negative multipliers and of rows left out with a slack below rounding (see
        :func:`_fro_error_bound`; generically 0); nuc: the relative optimality gap certified by a dual
        feasible point, ``(||W||_* − lower bound)/||W||_*``.
      certified: fro: ``error_bound`` and the KKT residuals are ``≤ CERTIFY_RTOL`` and every support row is
        resolved (``1 > SUPPORT_RTOL·(1 + ||Δ_it||·||z_i||·||W||)``: otherwise its margin is below rounding,
        which happens only for data spanning ≥ 9 orders of magnitude across rows); nuc: ``False``.
      raw_rel_error: ``||W_raw − W||_F/||W||_F`` of the conic solver's own answer (primal/vector;
        ``None`` for dual and nuc).
      iterations: active-set iterations (0 for nuc).
      timings: seconds spent per stage (``"solver"``, ``"active_set"``, ``"total"``).
      W_raw: diagnostic: the conic solver's own answer before the exact active-set finish, at the data's
        scale (primal/vector; ``None`` for dual and nuc). Accurate only to the conic solver's tolerance
        (~1e-4..1e-8 relative); ``W`` is the certified answer. ``None`` also when it overflows (possible
        only when ``||W||`` is within the solver's error of ``FLOAT_MAX``).
      duals_mantissa, duals_exponent: the multipliers as ``duals_mantissa·2^duals_exponent`` (exact, at
        every scale; ``max duals_mantissa ∈ [½, 1)``); ``None``/``0`` for nuc.
    """

    W: FloatArray
    alpha: IntArray
    norm: str
    method: str
    solver: str
    objective: float
    pairs: IntArray
    margins: FloatArray
    duals: FloatArray | None
    support: Pairs
    weakly_active: Pairs
    kkt: KKTResiduals | None
    error_bound: float
    certified: bool
    raw_rel_error: float | None
    iterations: int
    timings: dict[str, float] = field(default_factory=dict)
    W_raw: FloatArray | None = None
    duals_mantissa: FloatArray | None = None
    duals_exponent: int = 0


def _ro(a: NDArray[Any]) -> NDArray[Any]:
    """A read-only copy (a fresh array the caller cannot share with anything else)."""
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def _ro_own(a: NDArray[Any]) -> NDArray[Any]:
    """Mark a freshly computed array read-only without copying it (d² arrays at d = 1024)."""
    a.setflags(write=False)
    return a
