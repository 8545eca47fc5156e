"""Att-SVM solvers with certificates: matrix primal, tensor-trick vector program, factorised dual.

For a token choice ``α`` (one index per sequence) the attention SVM is

    W_mm(α) = argmin ||W||_F   s.t.   Δ_itᵀ W z_i ≥ 1   for all t ≠ α_i, all i,   Δ_it = x_iα_i − x_it.

With the tensor trick (column-major ``vec``, :mod:`attnsvm.model._tensor`) it is the least-norm program
``min ||w||₂ s.t. A w ≥ 1`` with rows ``a_it = z_i ⊗ Δ_it``; its dual

    max_λ 1ᵀλ − ½ λᵀKλ,  λ ≥ 0,      K = AAᵀ,  K[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju),

needs nothing of size ``d²``, and ``W = Σ λ_it Δ_it z_iᵀ``.

Methods of :func:`solve_svm` (``norm="fro"``): ``"primal"`` (cvxpy matrix program), ``"vector"``
(cvxpy on ``A = svm_rows``), ``"dual"`` (the factorised dual, solved exactly) and ``"auto"``
(the dual). Conic solvers are accurate to only ~1e-4..1e-6 relative here, and a duality gap alone
bounds the error of ``W`` by about ``√gap``; so **every** Frobenius method ends with the same exact
active-set step (:func:`min_norm_dual`): the rows believed active are solved as equalities by an
SVD least-norm solve on an exact factor of the Gram matrix, the step is repeated (rows with
negative multipliers dropped, violated rows added) until ``λ_S ≥ 0`` and every other row has
slack, with a Lawson–Hanson NNLS (the dual solved as a least-distance program) as the fallback
and as the dual method's own starting point. The result carries its KKT residuals and the
error bound ``cond(K_S)·eps`` plus what the step's two tolerances can leave (:func:`_fro_error_bound`:
multipliers held at ``λ_r < 0`` within ``MULTIPLIER_RTOL``, and rows outside ``S`` whose slack is below
rounding, amplified by ``1/σ_min`` when nearly parallel to rows of ``S``); so it bounds the relative
error of the returned ``W`` (first order), and it is *certified* when that bound and the residuals are
below :data:`CERTIFY_RTOL` (1e-9 relative).

``norm="nuc"`` solves ``min ||W||_*`` under the same constraints with cvxpy + Clarabel (an SDP),
rescales ``W`` to restore exact feasibility, and certifies its objective by a dual lower bound.

:func:`min_norm_dual` is the reusable exact core: given only a Gram matrix ``K = AAᵀ`` and a
right-hand side ``b`` it solves ``min ½||w||² s.t. a_rᵀw = b_r (r ∈ E), a_rᵀw ≥ b_r (r ∉ E)``.

Scale (the contract of :mod:`attnsvm.scaling`). The constraints are bilinear in ``(X, z)``, so
``W_mm(aX, bz) = W_mm(X, z)/(ab)`` and the multipliers scale by ``1/(ab)²``. Every solver divides each
row by its norm ``||Δ_it||·||z_i||`` (an exact reformulation, kept as mantissa·2^E so nothing of the size
of the data is squared or multiplied out, see ``_UnitSVM``), solves the unit-row problem and puts the
scale back as a power of two. It therefore works for finite data of any magnitude, is exactly
equivariant under power-of-two scalings, and raises :class:`~attnsvm.errors.NumericalError` only when
``||W_mm||`` (or a margin) is not a normal double; multipliers outside the normal range are returned as
``duals_mantissa·2^duals_exponent`` (``duals = None``). Data whose rows span ≳ 9 orders of magnitude
can make a support constraint unresolvable in float64: the solution is then not certified and
:func:`local_optimality_report` refuses. :func:`min_norm_dual` does the same with exact power-of-two
row equilibration of ``K`` and scaling of ``b``.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, support tokens,
local optimality); Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Gao, Song, Xie,
arXiv 2307.02419 (tensor trick); Lawson & Hanson, *Solving Least Squares Problems* (1974),
ch. 23 (least-distance programming through NNL"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from .._types import FloatArray, IntArray
from .._validation import check_instance
from ..errors import AttnSVMError, SolverError, unknown_name
from ..model._instance import Instance
from ._conic import _cvxpy_fro, _solve_nuc
from ._constants import CERTIFY_RTOL, HINT_SLACK, SUPPORT_RTOL, SVM_METHODS, SVM_NORMS
from ._dual import _classify, _Core, _core, _fro_error_bound, _kkt
from ._problem import (
    _back_to_data_scale,
    _check_trivially_infeasible,
    _fro_margins,
    _pairs_alpha,
    _pairs_of,
    _raise_infeasible,
    _require_rows,
    _svm_factor,
    _unit_svm,
    _UnitSVM,
    _weighted_sum,
)
from ._results import InfeasibleMinNormError, KKTResiduals, SVMSolution, _ro, _ro_own


@dataclass(frozen=True)
class _FroUnit:
    """The Frobenius Att-SVM solved on the unit-row problem (see :class:`_UnitSVM`), before rescaling."""

    W_hat: FloatArray
    W_raw_hat: FloatArray | None
    margins_hat: FloatArray
    wnorm_hat: float
    lam: FloatArray  # λ̂ ≥ 0
    support: IntArray
    weak: IntArray
    kkt: KKTResiduals
    core: _Core
    certified: bool
    solver: str
    t: tuple[float, float, float]
    unresolved: IntArray  # support rows whose right-hand side is below their resolution
    error_bound: float  # core.error_bound plus what the refinement's tolerances leave (_fro_error_bound)


def _solve_fro_unit(inst: Instance, u: _UnitSVM, method: str) -> _FroUnit:
    t0 = time.perf_counter()
    c = u.c
    m = c.pairs.shape[0]
    W_raw: FloatArray | None = None
    hint: IntArray | None = None
    solver = "NNLS (Lawson-Hanson) on the factorised dual"
    if method in ("primal", "vector"):
        W_raw, status = _cvxpy_fro(u, inst.d, method)
        solver = "cvxpy/CLARABEL"
        if W_raw is not None:
            if not np.all(np.isfinite(W_raw)):
                raise SolverError(f"{method} Att-SVM: cvxpy returned non-finite values. Use method='dual'.")
            slack = _fro_margins(u.zhat, c, W_raw) - u.beta
            hint = np.flatnonzero(slack <= HINT_SLACK * u.beta).astype(np.intp)
    t1 = time.perf_counter()
    fac = _svm_factor(u.zhat, c)
    b = u.beta
    eq = np.zeros(m, dtype=bool)
    try:
        core = _core(fac.L, b, eq, hint)
    except InfeasibleMinNormError as err:
        _raise_infeasible(c, err, u.G)
        raise  # unreachable; keeps type checkers informed
    if W_raw is None and method in ("primal", "vector"):
        raise SolverError(
            f"{method} Att-SVM: cvxpy reported infeasible, but the exact dual finds a feasible point; "
            "the conic solver is unreliable on this instance. Use method='dual'."
        )
    lam_raw = core.lam
    lam = np.maximum(lam_raw, 0.0)
    # stationarity in factored form: Σ_r λ_r Δ_r z_rᵀ = Δᵀ diag(λ) Z, never the d²-long rows
    M = _weighted_sum(u.zhat, c, lam)
    W_hat = fac.to_W(core.u)
    if W_hat is None:  # eigendecomposition factor (very large m): W from the multipliers
        W_hat = M
    if not np.all(np.isfinite(W_hat)):
        raise SolverError("the Att-SVM solution is not finite; the instance is too badly conditioned")
    t2 = time.perf_counter()
    # KKT of the unit-row problem: relative residuals are those of the original rows (the row scaling
    # cancels in each ratio); the multipliers' relative sizes are λ_r ∝ β_r·λ̂_r (see _UnitSVM).
    margins_hat = _fro_margins(u.zhat, c, W_hat)
    wnorm_hat = float(np.linalg.norm(W_hat))
    rn = np.linalg.norm(c.deltas, axis=1) * np.linalg.norm(c.queries, axis=1)  # = 1 up to rounding
    kkt = _kkt(
        margins_hat,
        b,
        eq,
        rn,
        lam_raw,
        wnorm_hat,
        float(np.linalg.norm(W_hat - M)),
        float(np.sum(M * M)),
        lam_rel=b * lam_raw,
    )
    support, weak = _classify(margins_hat, b, eq, rn, b * lam, wnorm_hat)
    # A support row whose right-hand side is below its own resolution SUPPORT_RTOL·(β_r + ||â_r||·||Ŵ||)
    # (it needs ||Δ_it||·||z_i||·||W_mm|| ≥ 1/SUPPORT_RTOL: data spanning many orders of magnitude across
    # rows) reads "≥ 0" at working precision: whether it binds, and the sign of its margin, are unresolved.
    unresolved = support[b[support] <= SUPPORT_RTOL * (b[support] + rn[support] * wnorm_hat)]
    # cond(K_S)·eps covers the solve on the equality rows only: add the rows the refinement's tolerances left
    # out (held negative multipliers, rows violated below rounding amplified by 1/σ_min; issue 13 §1)
    error_bound = _fro_error_bound(fac.L, lam_raw, core.error_bound, margins_hat - b, b, wnorm_hat, inst.d)
    certified = bool(error_bound <= CERTIFY_RTOL and kkt.max() <= CERTIFY_RTOL and unresolved.size == 0)
    return _FroUnit(
        W_hat,
        W_raw,
        margins_hat,
        wnorm_hat,
        lam,
        support,
        weak,
        kkt,
        core,
        certified,
        solver,
        (t0, t1, t2),
        unresolved,
        error_bound,
    )


def _solve_fro(inst: Instance, u: _UnitSVM, method: str) -> SVMSolution:
    f = _solve_fro_unit(inst, u, method)
    c, core, W_raw, W_hat, wnorm_hat = u.c, f.core, f.W_raw_hat, f.W_hat, f.wnorm_hat
    t0, t1, t2 = f.t
    raw_err = None if W_raw is None else float(np.linalg.norm(W_raw - W_hat) / wnorm_hat)
    W, wnorm, margins, dual_parts = _back_to_data_scale(u, W_hat, wnorm_hat, f.margins_hat, f.lam)
    assert dual_parts is not None
    duals, duals_mantissa, duals_exponent = dual_parts
    W_raw_out = None
    if W_raw is not None:
        with np.errstate(over="ignore"):
            W_raw_out = np.ldexp(W_raw, u.G)
        W_raw_out = _ro_own(W_raw_out) if np.all(np.isfinite(W_raw_out)) else None
    t3 = time.perf_counter()
    return SVMSolution(
        W=_ro_own(W),
        alpha=_ro(c.alpha),
        norm="fro",
        method=method,
        solver=f"{f.solver} + exact {core.method}",
        objective=wnorm,
        pairs=_ro(c.pairs),
        margins=_ro_own(margins),
        duals=None if duals is None else _ro_own(duals),
        support=_pairs_of(c, f.support),
        weakly_active=_pairs_of(c, f.weak),
        kkt=f.kkt,
        error_bound=float(f.error_bound),
        certified=f.certified,
        raw_rel_error=raw_err,
        iterations=core.iterations,
        timings={"solver": t1 - t0, "active_set": t2 - t1, "total": t3 - t0},
        W_raw=W_raw_out,
        duals_mantissa=_ro_own(duals_mantissa),
        duals_exponent=duals_exponent,
    )


def solve_svm(
    inst: Instance, alpha: ArrayLike | None = None, *, norm: str = "fro", method: str = "auto"
) -> SVMSolution:
    """Solve Att-SVM(α) and certify the solution.

    ``W_mm(α) = argmin ||W||  s.t.  (x_iα_i − x_it)ᵀ W z_i ≥ 1  ∀ t ≠ α_i, ∀ i``, with ``||·||`` the
    Frobenius (``norm="fro"``) or nuclear (``norm="nuc"``) norm. Frobenius methods: ``"primal"``
    (cvxpy matrix program), ``"vector"`` (cvxpy, ``min ||w||₂ s.t. A w ≥ 1``, ``A = svm_rows``),
    ``"dual"`` (``max 1ᵀλ − ½λᵀKλ, λ ≥ 0`` on the factorised Gram, no ``d²``-long rows,
    ``W = Σ λ_it Δ_it z_iᵀ``), ``"auto"`` (the dual). Each ends with the exact active-set step of
    :func:`min_norm_dual`, so all agree to 1e-9 relative (or report ``error_bound``). Nuclear norm:
    ``"primal"``/``"auto"`` only (cvxpy + Clarabel SDP; practical up to ``d ≈ 32``).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM); Gao, Song, Xie,
    arXiv 2307.02419 (tensor trick).

    Args:
      inst: the :class:`Instance`.
      alpha: token choice, shape ``(n,)`` integers in ``[0, T)``; ``None`` means the optimal tokens.
      norm: ``"fro"`` or ``"nuc"``.
      method: ``"auto"``, ``"primal"``, ``"vector"`` or ``"dual"``.

    Scale: any finite ``X, z``; ``W_mm(2^jx X, 2^jz z) = 2^−(jx+jz)·W_mm(X, z)`` exactly. Fro: relative
    Frobenius error ≤ ``error_bound`` to first order, certified or not (certified ⇒ ≤ 1e-9), plus
    ≤ ``d·2^−53`` when entries of ``W`` are subnormal; raises ``NumericalError`` iff ``||W_mm||_F`` (or a margin) is outside ``[2.2e-308, 1.8e308]``;
    ``duals = None`` (use ``duals_mantissa·2^duals_exponent``) iff a non-negligible multiplier is. Nuc:
    the same range rule for ``||W||_F`` and ``||W||_*``; objective to the SDP's gap (``error_bound``).

    Returns:
      :class:`SVMSolution` (``W`` of shape ``(d, d)``, duals aligned with ``svm_rows(inst, alpha)``,
      support, KKT residuals, error bound).

    Raises:
      InfeasibleSVMError: the constraints cannot be met (names the sequence and the reason).
      SolverError: a conic solver did not return status ``OPTIMAL``.
      UnknownNameError: unknown ``norm`` or ``method``.
      AttnSVMError: ``method="dual"``/``"vector"`` with ``norm="nuc"``, or a bad ``alpha``.
    """
    check_instance(inst)
    if norm not in SVM_NORMS:
        raise unknown_name("norm", norm, SVM_NORMS)
    if method not in SVM_METHODS:
        raise unknown_name("solver method", method, SVM_METHODS)
    if norm == "nuc" and method in ("dual", "vector"):
        raise AttnSVMError(
            f"method={method!r} solves the Frobenius-norm Att-SVM only (its dual/vector form needs "
            "||W||_F); use method='primal' or 'auto' with norm='nuc'."
        )
    pairs, a = _pairs_alpha(inst, alpha)
    _require_rows(pairs)
    _check_trivially_infeasible(inst, pairs, a)
    # Every method solves the exact unit-row reformulation (rows divided by ||Δ_it||·||z_i||, kept as
    # mantissa·2^E) and puts the scale back as a power of two: see _UnitSVM. Nothing overflows or
    # underflows on the way; only an answer outside the normal range raises.
    u = _unit_svm(inst, pairs, a)
    if norm == "nuc":
        return _solve_nuc(inst, u)
    return _solve_fro(inst, u, "dual" if method == "auto" else method)
