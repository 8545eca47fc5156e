"""The Att-SVM by conic programs (cvxpy): the Frobenius primal and vector programs, and the nuclear norm.

Conic solvers are accurate to only ~1e-4..1e-6 relative here, so a Frobenius conic solution only seeds
the exact active-set step of :func:`attnsvm.svm.min_norm_dual`; ``norm="nuc"`` solves ``min ||W||_*``
(an SDP, Clarabel), rescales ``W`` to restore exact feasibility and certifies its objective by a dual
lower bound. A solver status other than ``OPTIMAL`` is refused.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .. import scaling
from .._deps import require
from .._types import FloatArray
from ..errors import SolverError
from ..model._instance import Instance
from ._constants import NUC_FEAS_TOL, NUC_SUPPORT_TOL
from ._dual import _core
from ._problem import (
    _RESCALE_REMEDY,
    _back_to_data_scale,
    _fro_margins,
    _pairs_of,
    _raise_infeasible,
    _svm_factor,
    _UnitSVM,
    _weighted_sum,
)
from ._results import InfeasibleMinNormError, SVMSolution, _ro, _ro_own


def _check_cvxpy_status(prob: Any, what: str) -> str:
    """Map a cvxpy status: ``"optimal"`` / ``"infeasible"``; every other status raises SolverError."""
    import cvxpy as cp

    st = prob.status
    if st == cp.OPTIMAL:
        return "optimal"
    if st in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        return "infeasible"
    if st in (cp.UNBOUNDED, cp.UNBOUNDED_INACCURATE):
        raise SolverError(
            f"{what}: cvxpy reported {st!r}, impossible for a norm minimisation (bounded below by 0); "
            "a solver failure. Use method='dual'."
        )
    if st == cp.OPTIMAL_INACCURATE:
        raise SolverError(
            f"{what}: cvxpy reported {st!r} (solver tolerances not met); the answer is not certified. "
            "Use method='dual' (exact) or a smaller problem."
        )
    raise SolverError(f"{what}: cvxpy returned status {st!r} without a solution. Use method='dual'.")


def _cvxpy_solve(prob: Any, what: str) -> None:
    import cvxpy as cp

    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise SolverError(f"{what}: the conic solver failed ({exc}). Use method='dual'.") from exc


def _cvxpy_fro(u: _UnitSVM, d: int, method: str) -> tuple[FloatArray | None, str]:
    """Raw conic solution of the (unit-row) Frobenius Att-SVM: the matrix program or the vectorised one.

    Solves ``min ||W|| s.t. Δ̂_rᵀ W ẑ_r ≥ β_r`` (the exact reformulation of :class:`_UnitSVM`); the caller
    multiplies by ``2^G``.
    """
    require("cvxpy", feature="solve_svm(method='primal' | 'vector')")  # pragma: no mutate
    import cvxpy as cp

    c = u.c
    if method == "primal":
        Wv = cp.Variable((d, d))
        margins = cp.sum(cp.multiply(c.deltas @ Wv, c.queries), axis=1)
        prob = cp.Problem(cp.Minimize(cp.norm(Wv, "fro")), [margins >= u.beta])
        _cvxpy_solve(prob, "primal Att-SVM")
        status = _check_cvxpy_status(prob, "primal Att-SVM")
        return (None if status == "infeasible" else np.asarray(Wv.value, dtype=np.float64)), status
    # the rows of svm_rows, each divided by its norm: â_r = ẑ_r ⊗ Δ̂_r (column-major vec)
    A = np.einsum("rj,rk->rjk", c.queries, c.deltas).reshape(len(c.pairs), -1)
    w = cp.Variable(d * d)
    prob = cp.Problem(cp.Minimize(cp.norm(w, 2)), [A @ w >= u.beta])
    _cvxpy_solve(prob, "vector Att-SVM")
    status = _check_cvxpy_status(prob, "vector Att-SVM")
    if status == "infeasible":
        return None, status
    return np.asarray(w.value, dtype=np.float64).reshape((d, d), order="F"), status  # unvec (column-major)


def _solve_nuc(inst: Instance, u: _UnitSVM) -> SVMSolution:
    require("cvxpy", feature="solve_svm(norm='nuc')")  # pragma: no mutate
    import cvxpy as cp

    t0 = time.perf_counter()
    c = u.c
    m = c.pairs.shape[0]
    # Feasibility is the same as for the Frobenius problem: decide it exactly (and name the culprit).
    try:
        _core(_svm_factor(u.zhat, c).L, u.beta, np.zeros(m, dtype=bool), None)
    except InfeasibleMinNormError as err:
        _raise_infeasible(c, err, u.G)
    d = inst.d
    Wv = cp.Variable((d, d))
    # the unit-row reformulation (exact; see _UnitSVM): ||W||_* is homogeneous, so W_nuc = 2^G·Ŵ as well
    cons = cp.sum(cp.multiply(c.deltas @ Wv, c.queries), axis=1) >= u.beta
    prob = cp.Problem(cp.Minimize(cp.normNuc(Wv)), [cons])
    _cvxpy_solve(prob, "nuclear-norm Att-SVM")
    if _check_cvxpy_status(prob, "nuclear-norm Att-SVM") != "optimal":
        raise SolverError(
            "nuclear-norm Att-SVM: cvxpy reported infeasible, but the exact Frobenius dual finds a feasible "
            "point (the constraint sets are the same); the conic solver failed."
        )
    t1 = time.perf_counter()
    W_hat = np.asarray(Wv.value, dtype=np.float64)
    if not np.all(np.isfinite(W_hat)):
        raise SolverError("nuclear-norm Att-SVM: cvxpy returned non-finite values")

    def ratios(Wh: FloatArray) -> FloatArray:
        # margin / right-hand side = m̂_r/β_r = m̂_r·||D_r||·||Z_i||·2^{E_r+G}: 1/β_r is never formed
        with np.errstate(over="ignore"):
            return np.ldexp(_fro_margins(u.zhat, c, Wh) * u.mant, u.E + u.G)

    mm = float(np.min(ratios(W_hat)))
    if mm <= 0.0:
        raise SolverError(f"nuclear-norm Att-SVM: the solver's W has minimum margin {mm:.3g} ≤ 0")
    # Margins are linear in W: dividing by the minimum margin makes it exactly 1, restoring feasibility
    # when mm < 1 and lowering the objective when mm > 1.
    W_hat = W_hat / mm
    rat = ratios(W_hat)
    if float(np.min(rat)) < 1.0 - NUC_FEAS_TOL:
        raise SolverError("nuclear-norm Att-SVM: could not restore feasibility to 1e-7")
    objective_hat = float(np.sum(np.linalg.svd(W_hat, compute_uv=False)))
    # Certified gap: for any μ ≥ 0, μ/||Σ μ_r Δ̂_r ẑ_rᵀ||₂ is dual feasible (the dual norm of ||·||_* is
    # the spectral norm), so βᵀμ/||Σ μ_r Δ̂_r ẑ_rᵀ||₂ ≤ min ||Ŵ||_* (weak duality); the ratio is scale-free.
    mu = np.maximum(np.asarray(cons.dual_value, dtype=np.float64).reshape(-1), 0.0)
    Mmu = _weighted_sum(u.zhat, c, mu)
    opn = float(np.linalg.norm(Mmu, 2))
    lower = float(u.beta @ mu) / opn if opn > 0 else 0.0
    gap = max(0.0, (objective_hat - lower) / objective_hat)
    active = np.flatnonzero(rat - 1.0 <= NUC_SUPPORT_TOL).astype(np.intp)
    W, _, margins, _ = _back_to_data_scale(
        u, W_hat, float(np.linalg.norm(W_hat)), _fro_margins(u.zhat, c, W_hat), None
    )
    scaling.check_log_representable(
        "the nuclear-norm Att-SVM objective ||W||_*",
        math.log(objective_hat) + u.G * math.log(2.0),
        remedy=_RESCALE_REMEDY,
    )
    objective = float(np.ldexp(objective_hat, u.G))
    t2 = time.perf_counter()
    return SVMSolution(
        W=_ro_own(W),
        alpha=_ro(c.alpha),
        norm="nuc",
        method="primal",
        solver="cvxpy/CLARABEL (SDP) + rescaled to min margin 1",
        objective=objective,
        pairs=_ro(c.pairs),
        margins=_ro_own(margins),
        duals=None,
        support=_pairs_of(c, active),
        weakly_active=(),
        kkt=None,
        error_bound=gap,
        certified=False,
        raw_rel_error=None,
        iterations=0,
        timings={"solver": t1 - t0, "active_set": 0.0, "total": t2 - t0},
    )
