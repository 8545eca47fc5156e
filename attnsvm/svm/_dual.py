"""The exact dual core: least-norm solutions under linear constraints, from a Gram matrix alone.

:func:`min_norm_dual` solves ``min ½||w||² s.t. a_rᵀw = b_r (r ∈ E), a_rᵀw ≥ b_r (r ∉ E)`` given only
``K = AAᵀ`` and ``b``: an active-set step solves the rows believed active as equalities by an SVD
least-norm solve on an exact factor of ``K`` and repeats (rows with negative multipliers dropped, violated
rows added) until ``λ_S ≥ 0`` and every other row has slack, with a Lawson–Hanson NNLS (the dual as a
least-distance program) as the fallback and starting point. The result carries its KKT residuals and the
error bound of :func:`attnsvm.svm.solve_svm` (``cond(K_S)·eps`` plus what the refinement's tolerances leave:
inequality multipliers held slightly negative, rows violated at rounding level amplified by ``1/σ_min``).
Exact power-of-two row equilibration of ``K`` and scaling of ``b`` keep it valid for data of any magnitude.

References: Lawson & Hanson, *Solving Least Squares Problems* (1974), ch. 23 (least-distance
programming through NNLS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize
from numpy.typing import ArrayLike, NDArray

from .. import scaling
from .._types import FloatArray, IntArray
from .._validation import as_real_array
from ..errors import InvalidInstanceError, SolverError
from ..scaling import EPS
from ._constants import (
    CERTIFY_RTOL,
    FARKAS_ZERO_FACTOR,
    GRAM_RTOL,
    INFEASIBLE_NORM,
    MULTIPLIER_RTOL,
    ROUNDING_RTOL,
    SUPPORT_RTOL,
    VACUOUS_RHS,
)
from ._results import InfeasibleMinNormError, KKTResiduals, MinNormSolution, _ro, _ro_own


# ========================================================================== exact core
@dataclass(frozen=True)
class _Core:
    u: FloatArray  # (k,) primal coordinates, original scaling
    lam: FloatArray  # (m,) multipliers (raw; may hold tiny negatives)
    error_bound: float
    iterations: int
    method: str


class _Refused(Exception):
    """The active-set refinement did not settle (cycling or an inconsistent tight system)."""


def _round_tol(k: int) -> float:
    """Rounding level of a length-``k`` margin: :data:`ROUNDING_RTOL`, or ``4k·eps`` for wider factors."""
    return max(ROUNDING_RTOL, 4 * k * EPS)


def _tight_solve(LS: FloatArray, bS: FloatArray) -> tuple[FloatArray, FloatArray, float, int]:
    """Least-norm ``u`` with ``L_S u = b_S`` and least-norm ``λ_S`` with ``L_Sᵀλ_S = u``, by an SVD.

    ``u = V Σ⁻¹ Uᵀ b_S`` and ``λ_S = U Σ⁻² Uᵀ b_S = (L_S L_Sᵀ)⁺ b_S`` over the numerical rank. Works on
    the factor ``L_S`` rather than ``K_S = L_S L_Sᵀ``: the error is ``cond(L_S)·eps`` instead of
    ``cond(K_S)·eps`` (forming ``K_S`` and solving would square the condition number).
    Returns ``u``, ``λ_S``, ``cond(K_S)`` over the retained rank, the rank.
    """
    U, sv, Vt = np.linalg.svd(LS, full_matrices=False)
    rank = int(np.sum(sv > max(LS.shape) * EPS * sv[0])) if sv.size and sv[0] > 0 else 0
    if rank == 0:
        raise _Refused("zero tight system")
    c = U[:, :rank].T @ bS
    u = Vt[:rank].T @ (c / sv[:rank])
    lamS = U[:, :rank] @ (c / sv[:rank] ** 2)
    res = LS @ u - bS
    if np.any(np.abs(res) > _round_tol(LS.shape[1]) * (np.abs(bS) + np.linalg.norm(u))):
        raise _Refused("inconsistent tight system")
    cond_K = float((sv[0] / sv[rank - 1]) ** 2)
    return u, lamS, cond_K, rank


def _nonneg_representation(LS: FloatArray, u: FloatArray, eqS: NDArray[np.bool_]) -> FloatArray | None:
    """A representation ``u = L_Sᵀλ`` with ``λ ≥ 0`` on inequality rows, when ``L_S`` is rank-deficient.

    The least-norm ``λ_S`` may have negative entries although a nonnegative one exists (degenerate
    supports); an NNLS over ``[L_Sᵀ(ineq), L_Sᵀ(eq), −L_Sᵀ(eq)]`` finds one if it does.
    """
    cols = np.hstack([LS.T, -LS[eqS].T])
    try:
        y, _ = scipy.optimize.nnls(cols, u, maxiter=max(100, 10 * cols.shape[1]))
    except RuntimeError:  # scipy: iteration limit reached; the least-norm multipliers are kept
        return None
    if np.linalg.norm(cols @ y - u) > CERTIFY_RTOL * np.linalg.norm(u):
        return None
    lam = y[: LS.shape[0]].copy()
    lam[eqS] -= y[LS.shape[0] :]
    return lam


def _refine(
    Ln: FloatArray, bs: FloatArray, eqn: NDArray[np.bool_], seed: IntArray
) -> tuple[FloatArray, FloatArray, float, int]:
    """Active-set iteration on the row-normalised problem from the seed rows.

    Solves the seed rows as equalities; drops the inequality row with the most negative multiplier,
    or adds the most violated inactive row, until ``λ_S ≥ 0`` (to :data:`MULTIPLIER_RTOL`) and every
    other row has slack ``≥ −ROUNDING_RTOL·(|b_r| + |L_r|·|u|)`` (componentwise, the rounding of a computed
    slack: a row orthogonal to ``u`` must meet its own ``b_r``, however far below the others): the KKT
    conditions, hence the optimum (convex problem). Raises :class:`_Refused` when that does not happen
    within ``2m + 10`` steps.
    """
    m = bs.size
    inS = np.zeros(m, dtype=bool)
    inS[seed] = True
    inS |= eqn
    for it in range(1, 2 * m + 11):
        idx = np.flatnonzero(inS)
        if idx.size == 0:
            u = np.zeros(Ln.shape[1])
            lamS = np.zeros(0)
            cond_K = 1.0
        else:
            u, lamS, cond_K, rank = _tight_solve(Ln[idx], bs[idx])
            ineqS = ~eqn[idx]
            scale = float(np.max(np.abs(lamS))) if lamS.size else 0.0
            if rank < idx.size and np.any(lamS[ineqS] < -MULTIPLIER_RTOL * scale):
                alt = _nonneg_representation(Ln[idx], u, eqn[idx])
                if alt is not None:
                    lamS = alt
            scale = float(np.max(np.abs(lamS))) if lamS.size else 0.0
            neg = np.flatnonzero(ineqS & (lamS < -MULTIPLIER_RTOL * scale))
            if neg.size:
                inS[idx[neg[np.argmin(lamS[neg])]]] = False
                continue
        slack = Ln @ u - bs
        # componentwise rounding of a computed slack (|L_r|·|u|, not ||L_r||·||u||): a row orthogonal to u whose
        # right-hand side is far below the largest is violated by all of its b_r, which a norm-wise tolerance
        # (relative to ||u||) would hide, dropping a multiplier that the rows as posed may weigh most
        tol = _round_tol(Ln.shape[1]) * (np.abs(bs) + np.abs(Ln) @ np.abs(u))
        viol = np.flatnonzero(~inS & (slack < -tol))
        if viol.size:
            # the most violated relative to |b_r| + ||u|| (the documented rule; the componentwise scale ties
            # every row orthogonal to u at a relative violation of 1)
            inS[viol[np.argmin(slack[viol] / (np.abs(bs[viol]) + np.linalg.norm(u)))]] = True
            continue
        lam = np.zeros(m)
        lam[idx] = lamS
        return u, lam, cond_K, it
    raise _Refused("active set did not settle")


def _ldp_nnls(
    Ln: FloatArray, bs: FloatArray, eqn: NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """Least-distance program ``min ||u|| s.t. G u ≥ h`` by Lawson–Hanson NNLS (LH74, ch. 23).

    With ``E = [Gᵀ; hᵀ]`` and ``f = e_{k+1}``, the NNLS ``min_{y≥0} ||E y − f||`` has residual
    ``r = E y − f`` with ``−r_{k+1} = 1 − hᵀy = 1/(1 + ||u||²)``; then ``u = Gᵀy/(1 − hᵀy)`` and
    ``λ = y/(1 − hᵀy)``. ``r ≈ 0`` means ``Gᵀy ≈ 0``, ``hᵀy ≈ 1``: a Farkas certificate of
    infeasibility. Equality rows enter as two opposite inequalities.
    Returns ``u``, ``λ`` and the certificate (``None`` when feasible).
    """
    m, k = Ln.shape
    G = np.vstack([Ln, -Ln[eqn]])
    h = np.concatenate([bs, -bs[eqn]])
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(k + 1)
    f[-1] = 1.0
    try:
        y, _ = scipy.optimize.nnls(E, f, maxiter=max(1000, 50 * E.shape[1]))
    except RuntimeError as exc:  # iteration limit
        raise SolverError(
            f"NNLS did not converge on the dual ({exc}); the problem is badly conditioned"
        ) from exc

    def fold(v: FloatArray) -> FloatArray:
        out = v[:m].copy()
        out[eqn] -= v[m:]
        return out

    denom = 1.0 - float(h @ y)  # = 1/(1 + ||u||²) in exact arithmetic
    if denom <= 1.0 / (1.0 + INFEASIBLE_NORM**2):
        hy = float(h @ y)
        return np.zeros(k), np.zeros(m), fold(y / hy) if hy > 0 else fold(y)
    return G.T @ y / denom, fold(y / denom), None


def _refuse_zero_rows(
    zero: NDArray[np.bool_], b: FloatArray, eq: NDArray[np.bool_], *, explained: bool = False
) -> None:
    """Raise :class:`InfeasibleMinNormError` at the first identically zero row ``a_r = 0`` that asks for a
    nonzero right-hand side (``a_rᵀw = b_r ≠ 0``, or ``a_rᵀw ≥ b_r > 0``): no ``w`` satisfies it, whatever its
    norm. The certificate is ``c = sign(b_r)·e_r`` (``Σ c_r a_r = 0``, ``Σ c_r b_r > 0``), the norm bound ``inf``.

    ``explained``: the message of :func:`min_norm_dual`'s infeasibility (the rows, the certificate's meaning
    and what to do) around the bare one of :func:`_core` (``row r is identically zero but asks for ...``).
    """
    bad = zero & np.where(eq, b != 0.0, b > 0.0)
    if not np.any(bad):
        return
    r = int(np.flatnonzero(bad)[0])
    cert = np.zeros(b.size)
    cert[r] = np.sign(b[r])
    what = f"row {r} is identically zero but asks for {'=' if eq[r] else '≥'} {b[r]:.6g}"
    if explained:
        what = (
            f"min-norm problem infeasible: rows [{r}] cannot hold together ({what}); the combination Σ c_r a_r "
            "with certificate c ≥ 0 vanishes while Σ c_r b_r > 0, so any solution would need ||w|| ≥ inf. "
            "Drop or relax one of these rows."
        )
    raise InfeasibleMinNormError(what, cert, np.inf)


def _core(L: FloatArray, b: FloatArray, eq: NDArray[np.bool_], hint: IntArray | None) -> _Core:
    """Exact least-norm solve of ``min ½||u||² s.t. L_r u ≥ b_r (= on eq)``; see :func:`min_norm_dual`."""
    m, k = L.shape
    rn = np.linalg.norm(L, axis=1)
    zero = rn == 0.0
    _refuse_zero_rows(zero, b, eq)
    live = np.flatnonzero(~zero)
    # Row-normalise (the feasible set and the least-norm point do not change) and scale b to
    # max|b| = 1: the conditioning then reflects only the geometry of the rows.
    Ln = L[live] / rn[live, None]
    bn = b[live] / rn[live]
    eqn = eq[live]
    # Scale by the rows that can bind away from 0 (equalities, and inequalities with b_r > 0): a row with
    # b_r ≤ 0 holds at w = 0, and letting a large negative b_r set the scale would push the binding
    # right-hand sides towards underflow (w would come out 0 where it is not).
    need = eqn | (bn > 0.0)
    s = float(np.max(np.abs(bn[need]))) if np.any(need) else 0.0
    if s == 0.0:  # no row needs w ≠ 0 (inequalities with b_r ≤ 0, equalities with b_r = 0): w = 0
        return _Core(np.zeros(k), np.zeros(m), 0.0, 0, "trivial")
    with np.errstate(over="ignore"):
        # an inequality with b_r below −VACUOUS_RHS cannot bind while ||u|| < VACUOUS_RHS (unit rows):
        # clamping it there is exact for every solution float64 can certify, and keeps b finite
        bs = np.where(eqn, bn / s, np.maximum(bn / s, -VACUOUS_RHS))

    def unscale(u: FloatArray, lam_n: FloatArray) -> tuple[FloatArray, FloatArray]:
        lam = np.zeros(m)
        lam[live] = s * lam_n / rn[live]
        return s * u, lam

    if hint is not None:
        pos = np.full(m, -1)
        pos[live] = np.arange(live.size)
        hint_live = pos[np.asarray(hint, dtype=np.intp)]
        try:
            u, lam_n, cond_K, it = _refine(Ln, bs, eqn, hint_live[hint_live >= 0])
            uu, lam = unscale(u, lam_n)
            return _Core(uu, lam, cond_K * EPS, it, "active-set")
        except _Refused:
            pass
    u0, lam0, farkas = _ldp_nnls(Ln, bs, eqn)
    if farkas is not None:
        full = np.zeros(m)
        full[live] = farkas / rn[live]  # back to the original rows: Σ c_r L_r ≈ 0, bᵀc > 0
        full[np.abs(full) <= MULTIPLIER_RTOL * np.max(np.abs(full))] = 0.0
        resid = float(np.linalg.norm(L.T @ full))
        # Σ c_r L_r is zero to rounding (the certificate's weights and the product each carry
        # ≲ (m + 1)·eps·Σ|c_r|·||L_r||; FARKAS_ZERO_FACTOR× that): exactly contradictory rows, e.g. a
        # selected token that is a convex combination of others; no W at all, not a huge one.
        zero_tol = FARKAS_ZERO_FACTOR * (m + 1) * EPS * float(np.abs(full) @ rn)
        bound = float(b @ full) / resid if resid > zero_tol else np.inf
        raise InfeasibleMinNormError("the constraints are contradictory", full, bound)
    seed = np.flatnonzero(lam0 != 0.0)
    try:
        u, lam_n, cond_K, it = _refine(Ln, bs, eqn, seed)
        uu, lam = unscale(u, lam_n)
        return _Core(uu, lam, cond_K * EPS, it, "nnls+active-set")
    except _Refused:
        # Degenerate beyond what the refinement handles: keep the NNLS point, uncertified.
        uu, lam = unscale(u0, lam0)
        return _Core(uu, lam, np.inf, 0, "nnls")


def _kkt(
    margins: FloatArray,
    b: FloatArray,
    eq: NDArray[np.bool_],
    row_norms: FloatArray,
    lam_raw: FloatArray,
    wnorm: float,
    stat_resid: float,
    dual_obj_quad: float,
    *,
    lam_rel: FloatArray | None = None,
) -> KKTResiduals:
    """Relative KKT residuals (see :class:`KKTResiduals`).

    ``lam_rel``: numbers proportional to the multipliers of the problem as posed, when ``lam_raw`` are
    those of an equivalent row-scaled one (dual feasibility and complementary slackness are relative to
    ``max|λ|`` of the problem as posed); default ``lam_raw``.
    """
    scale = np.abs(b) + row_norms * wnorm
    scale = np.where(scale > 0, scale, 1.0)
    slack = margins - b
    pf_rows = np.where(eq, np.abs(slack), np.maximum(0.0, -slack)) / scale
    lr = lam_raw if lam_rel is None else lam_rel
    lmax = float(np.max(np.abs(lr))) if lr.size else 0.0
    lam_scale = lmax if lmax > 0 else 1.0
    ineq_lam = lr[~eq]
    dual_feas = max(0.0, -float(np.min(ineq_lam))) / lam_scale if ineq_lam.size else 0.0
    comp = float(np.max(np.abs(lr) / lam_scale * np.abs(slack) / scale)) if lr.size else 0.0
    primal = 0.5 * wnorm**2
    dual = float(b @ lam_raw) - 0.5 * dual_obj_quad
    gap = abs(primal - dual) / primal if primal > 0 else abs(dual)
    return KKTResiduals(
        primal_feasibility=float(np.max(pf_rows)) if pf_rows.size else 0.0,
        dual_feasibility=dual_feas,
        stationarity=stat_resid / wnorm if wnorm > 0 else stat_resid,
        complementary_slackness=comp,
        duality_gap=gap,
    )


def _classify(
    margins: FloatArray,
    b: FloatArray,
    eq: NDArray[np.bool_],
    row_norms: FloatArray,
    lam: FloatArray,
    wnorm: float,
) -> tuple[IntArray, IntArray]:
    """Support (active rows) and weakly active rows (active inequality rows with ``λ = 0``)."""
    scale = np.abs(b) + row_norms * wnorm
    active = eq | (np.abs(margins - b) <= SUPPORT_RTOL * scale)
    lmax = float(np.max(lam)) if lam.size else 0.0
    weak = active & ~eq & (lam <= MULTIPLIER_RTOL * lmax)
    return np.flatnonzero(active).astype(np.intp), np.flatnonzero(weak).astype(np.intp)


def _equality_mask(equality: ArrayLike | None, m: int) -> NDArray[np.bool_]:
    if equality is None:
        return np.zeros(m, dtype=bool)
    e = np.asarray(equality)
    if e.dtype == bool:
        if e.shape != (m,):
            raise InvalidInstanceError(f"equality mask must have shape (m,) = ({m},); got {e.shape}")
        return np.array(e, dtype=bool)
    if e.dtype.kind not in "iu" or e.ndim != 1:
        raise InvalidInstanceError(
            f"equality must be a boolean mask of shape ({m},) or a 1-D array of row indices; got dtype {e.dtype}, shape {e.shape}"
        )
    if e.size and (e.min() < 0 or e.max() >= m):
        raise InvalidInstanceError(f"equality row indices must lie in [0, {m - 1}]; got {e.tolist()}")
    mask = np.zeros(m, dtype=bool)
    mask[e] = True
    return mask


def _factor_from_gram(K: FloatArray) -> FloatArray:
    """``L`` with ``LLᵀ = K`` from the eigendecomposition (eigenvalues below rounding dropped)."""
    m = K.shape[0]
    w, V = np.linalg.eigh(K)
    top = float(max(w[-1], 0.0)) if w.size else 0.0
    tol = 16 * m * EPS * top  # eigenvalues of a rounded PSD matrix are perturbed by ≤ ||δK|| ≲ m·eps·||K||
    if w.size and w[0] < -max(GRAM_RTOL * top, tol):
        raise InvalidInstanceError(
            f"K must be positive semidefinite (a Gram matrix AAᵀ); its smallest eigenvalue is {w[0]:.3g} "
            f"(largest {top:.3g}). Pass K = A @ A.T, or a factor."
        )
    keep = w > tol
    return np.asarray(V[:, keep] * np.sqrt(w[keep]), dtype=np.float64)


def min_norm_dual(
    K: ArrayLike,
    b: ArrayLike,
    equality: ArrayLike | None = None,
    *,
    factor: ArrayLike | None = None,
    support_hint: ArrayLike | None = None,
) -> MinNormSolution:
    """Exact least-norm point under linear (in)equalities, from the Gram matrix alone, with a certificate.

    Solves ``min ½||w||² s.t. a_rᵀw = b_r (r ∈ E), a_rᵀw ≥ b_r (r ∉ E)`` through its dual
    ``max bᵀλ − ½λᵀKλ, λ_r ≥ 0 (r ∉ E)``, ``K = AAᵀ``, ``w = Aᵀλ``. The active set is found by
    Lawson–Hanson NNLS (or taken from ``support_hint``) and polished by an exact active-set iteration
    on a factor ``L`` of ``K`` (SVD least-norm solves) until ``λ_S ≥ 0`` and every other row has slack.

    References: Lawson & Hanson (1974), ch. 23 (LDP); Tarzanagh et al., arXiv 2308.16898 (Att-SVM).

    Args:
      K: Gram matrix ``AAᵀ``, shape ``(m, m)``, symmetric positive semidefinite.
      b: right-hand sides, shape ``(m,)`` (any sign).
      equality: ``None`` (all inequalities), a boolean mask of shape ``(m,)`` or row indices.
      factor: optional ``L`` of shape ``(m, k)`` with ``LLᵀ = K`` (e.g. ``A`` itself or a compressed
        form); more accurate than the eigendecomposition used otherwise (``cond(A)`` instead of ``cond(K)``).
      support_hint: optional row indices believed active (e.g. from a conic solver); only a starting point.

    Scale: any finite ``K``, ``b``: rows are equilibrated by exact powers of two (``K_rr`` to ``[¼, 1)``) and
    ``b`` rescaled to ``max ∈ [½, 1)``, so ``min_norm_dual(4^j K, 2^jb b)`` is exactly ``2^(jb−j)·w``,
    ``2^(jb−2j)·λ``. Accuracy: relative error of ``w`` ≤ ``error_bound`` to first order, certified or not
    (certified ≤ 1e-9), ``error_bound = cond(K_S)·eps + (||λ_N||₁ + ||Δ||)/||w||`` on the equilibrated rows:
    ``λ_N`` the inequality multipliers held slightly negative, ``Δ`` the least-norm correction of rows outside
    the tight set that are violated or within rounding of 0 (:func:`_fro_error_bound`,
    the bound :func:`attnsvm.svm.solve_svm` reports; 0 added on generic problems). ``certified`` also asks
    that no inequality row left with ``λ_r = 0`` be violated by enough to need a multiplier above
    ``MULTIPLIER_RTOL·max λ`` (:func:`_rows_resolved`): the norm-wise KKT residuals cannot see a row whose
    ``b_r`` is far below the others, and its multiplier (the largest one, possibly) would be lost. Raises ``NumericalError`` iff
    ``||w||`` or a non-negligible multiplier (``> MULTIPLIER_RTOL·max``) is not a normal double, or a margin
    overflows (margins are absolute: one below 2.2e-308 is returned as it rounds).

    Returns:
      :class:`MinNormSolution` (multipliers, support, weakly active rows, margins, KKT residuals, error bound).

    Raises:
      InfeasibleMinNormError: the constraints cannot all hold (with a Farkas certificate).
      InvalidInstanceError: bad shapes, non-finite entries, ``K`` not symmetric PSD or not ``LLᵀ``.
    """
    Ka = as_real_array(K, "K", ndim=2)
    m = Ka.shape[0]
    if Ka.shape != (m, m):
        raise InvalidInstanceError(f"K must be square (m, m); got {Ka.shape}")
    ba = as_real_array(b, "b", ndim=1)
    if ba.shape != (m,):
        raise InvalidInstanceError(f"b must have shape (m,) = ({m},) to match K; got {ba.shape}")
    # Scale (exact, powers of two): row r of A is divided by 2^{k_r}, k_r = ⌈e_r/2⌉ with K_rr = μ·2^{e_r},
    # so K' = D K D (D = diag 2^{−k}) has diagonal in [¼, 1) — the same feasible set with b'_r = 2^{−k_r} b_r —
    # and b' is divided by 2^Gb (its largest entry to [½, 1)). Then w = 2^Gb·w', λ_r = 2^{Gb−k_r}·λ'_r,
    # margins_r = 2^{Gb+k_r}·margins'_r. Nothing of the size of K or b is formed in floating point, and
    # the equivariance min_norm(c²K, βb) = (β/c)·min_norm(K, b) holds bitwise.
    diag = np.diag(Ka)
    kr = np.where(diag > 0, (np.frexp(np.abs(diag))[1] + 1) // 2, 0).astype(np.int64)
    with np.errstate(over="ignore", under="ignore"):
        Ks = np.ldexp(Ka, -(kr[:, None] + kr[None, :]))
    if not np.all(np.isfinite(Ks)):
        raise InvalidInstanceError(
            "K must be positive semidefinite (a Gram matrix AAᵀ): an off-diagonal entry exceeds "
            "sqrt(K_rr·K_ss) by far. Pass K = A @ A.T, or a factor."
        )
    kmax = float(np.max(np.abs(Ks))) if Ks.size else 0.0
    if np.max(np.abs(Ks - Ks.T), initial=0.0) > GRAM_RTOL * kmax:
        raise InvalidInstanceError("K must be symmetric (a Gram matrix AAᵀ); K - K.T is not negligible")
    eq = _equality_mask(equality, m)
    if factor is None:
        L = _factor_from_gram(0.5 * (Ks + Ks.T))
    else:
        Lu = as_real_array(factor, "factor", ndim=2)
        if Lu.shape[0] != m:
            raise InvalidInstanceError(f"factor must have m = {m} rows; got shape {Lu.shape}")
        with np.errstate(under="ignore"):
            L = np.ldexp(Lu, -kr[:, None])
        if np.max(np.abs(L @ L.T - Ks), initial=0.0) > GRAM_RTOL * max(kmax, 1e-300):
            raise InvalidInstanceError(
                "factor L does not satisfy L @ L.T == K (to 1e-10 relative to sqrt(K_rr·K_ss))"
            )
    hint = _support_hint(support_hint, m)
    sol, _ = _solve_equilibrated(L, ba, eq, hint, kr, diag == 0.0, factor=None if factor is None else Lu)
    return sol


def _support_hint(support_hint: ArrayLike | None, m: int) -> IntArray | None:
    """The validated ``support_hint`` of :func:`min_norm_dual` as row indices (``None`` stays ``None``)."""
    if support_hint is None:
        return None
    raw = np.asarray(support_hint).reshape(-1)
    if raw.dtype.kind not in "iu" and not (
        raw.dtype.kind == "f" and np.all(np.isfinite(raw)) and np.all(raw == np.round(raw))
    ):
        raise InvalidInstanceError(
            f"support_hint must hold integer row indices; got {np.asarray(support_hint)!r} "
            f"(dtype {raw.dtype}). Pass a list of ints; for a boolean mask, np.flatnonzero(mask)."
        )
    hint = raw.astype(np.intp)
    if hint.size and (hint.min() < 0 or hint.max() >= m):
        raise InvalidInstanceError(f"support_hint indices must lie in [0, {m - 1}]")
    return hint


def _solve_equilibrated(
    L: FloatArray,
    ba: FloatArray,
    eq: NDArray[np.bool_],
    hint: IntArray | None,
    kr: NDArray[np.int64],
    zero: NDArray[np.bool_],
    *,
    factor: FloatArray | None,
    posed: NDArray[np.int64] | None = None,
) -> tuple[MinNormSolution, int]:
    """``min ½||w||² s.t. a_rᵀw ≥ b_r`` (``=`` on ``eq``) with ``a_r = 2^{kr_r}·L_r`` (``L``'s rows equilibrated).

    ``ba`` is ``b`` as given; ``zero`` marks the rows with ``a_r = 0``. The right-hand sides are scaled by
    ``2^{−kr_r−Gb}`` (binding ``max|b'| ∈ [½, 1)``), solved by :func:`_core`, and the result put back by
    :func:`_min_norm_solution`: at the caller's scale (range-checked), or with ``posed`` (row exponents
    ``R``, ``kr − R`` the equilibration of the mantissa rows) at the posed scale of :func:`_min_norm_rows`.
    Returns the solution and ``Gb``.
    """
    bexp = np.frexp(ba)[1].astype(np.int64) - kr
    # the scale is set by the rows that can bind away from w = 0 (see _core); a very negative b_r of an
    # inequality is clamped at −VACUOUS_RHS (it cannot bind), so nothing overflows
    need = (eq | (ba > 0.0)) & (ba != 0.0)
    Gb = int(np.max(bexp[need])) if np.any(need) else 0
    with np.errstate(over="ignore", under="ignore"):
        bs = np.ldexp(ba, -kr - Gb)  # binding max |b'| ∈ [½, 1); entries 2^-1074 below it flush (negligible)
    bs = np.where(eq, bs, np.maximum(bs, -VACUOUS_RHS))
    # A zero row (K_rr = 0) asking for a nonzero right-hand side: reported with b as given (the scaled
    # problem would quote b'_r), in the words of the infeasibility message below.
    _refuse_zero_rows(zero, ba, eq, explained=True)
    try:
        core = _core(L, bs, eq, hint)
    except InfeasibleMinNormError as err:
        rows = err.rows.tolist()
        # back to the rows as given: weights c_r·2^{−k_r} (normalised to max 1), bound 2^Gb·bound
        # (rows outside the certificate weigh 0: their 2^{−k_r} may leave the range when rows are far apart)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            shift = kr - int(np.min(kr[err.rows])) if err.rows.size else kr
            cw = np.where(err.certificate != 0.0, err.certificate * np.ldexp(1.0, -shift), 0.0)
        cert = cw / float(np.max(np.abs(cw))) if np.any(cw != 0) else cw
        with np.errstate(over="ignore"):
            bound = float(np.ldexp(err.norm_bound, Gb))
        raise InfeasibleMinNormError(
            f"min-norm problem infeasible: rows {rows} cannot hold together ({err}); the combination "
            f"Σ c_r a_r with certificate c ≥ 0 vanishes while Σ c_r b_r > 0, so any solution would need "
            f"||w|| ≥ {_pow2_str(err.norm_bound, Gb)}. Drop or relax one of these rows.",
            cert,
            bound,
        ) from None
    if posed is None:
        return _min_norm_solution(L, bs, eq, core, kr=kr, Gb=Gb, factor=factor), Gb
    return _min_norm_solution(L, bs, eq, core, kr=kr - posed, Gb=0, factor=factor, weight_exp=kr), Gb


def _min_norm_rows(
    rows: FloatArray, R: NDArray[np.int64], b: FloatArray, equality: ArrayLike | None = None
) -> tuple[MinNormSolution, int]:
    """``min ½||w||² s.t. (2^{R_r}·rows_r)ᵀw ≥ b_r`` (``=`` on ``equality``), rows given as mantissas ``rows``
    with one binary exponent ``R_r`` each: what :func:`min_norm_dual` does with ``K = AAᵀ`` and ``factor = A``,
    ``A_r = 2^{R_r}·rows_r``, without forming ``A`` or ``K`` (rows any number of binades apart; their squares
    would leave float64's range).

    ``K' = rows·rowsᵀ`` has its diagonal in ``[¼, k)`` when each row's largest entry is in ``[½, 1)``, so
    its exact equilibration exponents ``k'_r`` are small; those of ``A`` are ``k_r = k'_r + R_r`` and the rest
    is :func:`min_norm_dual`'s (bitwise the same steps as ``min_norm_dual(K', b, factor=rows)`` on a shared
    mantissa). Returns ``(sol, G)`` with ``sol`` at the *posed* scale and not range-checked (the caller puts
    it back): ``w = 2^G·sol.coords``, ``||w|| = 2^G·sol.norm``, ``λ_r = 2^{G−R_r}·sol.multipliers_r``,
    ``a_rᵀw = 2^{R_r+G}·sol.margins_r``, ``sol.factor = rows``. The support, weakly active rows, KKT residuals
    and ``error_bound`` are scale-free; the multipliers are weighted as the true ``λ`` (``∝ 2^{−k_r}·λ̃_r``,
    ``λ̃`` those of the equilibrated rows).

    Raises:
      InfeasibleMinNormError: as :func:`min_norm_dual` (the certificate weights those of the rows ``A_r``).
    """
    m = rows.shape[0]
    Kp = rows @ rows.T
    diag = np.diag(Kp)
    kp = np.where(diag > 0, (np.frexp(np.abs(diag))[1] + 1) // 2, 0).astype(np.int64)
    with np.errstate(under="ignore"):
        L = np.ldexp(rows, -kp[:, None])
    R64 = np.asarray(R, dtype=np.int64)
    return _solve_equilibrated(
        L,
        np.asarray(b, dtype=np.float64),
        _equality_mask(equality, m),
        None,
        kp + R64,
        diag == 0.0,
        factor=rows,
        posed=R64,
    )


def _correction_norm(L: FloatArray, E: IntArray, V: IntArray, sV: FloatArray) -> float:
    """``||Δ||`` of the least-norm ``Δ`` with ``L_EΔ = 0`` and ``L_VΔ = δ_V`` (``sV``): ``√(δᵀK_TT⁺δ)``, ``T = E ∪ V``.

    On the exact factor's rows ``L_T`` (``L_T L_Tᵀ = K_TT``) by an SVD, not on ``K_TT``: a nearly parallel row
    has ``σ_min(L_T)`` ≈ its angle, resolved down to eps, where ``λ_min(K_TT) = σ_min²`` drowns in rounding
    below √eps. Singular values below the numerical rank count as 0 (as :func:`_tight_solve`): a row of ``V``
    that repeats rows of ``E`` (ties) adds its own slack, not ``1/0``. The same quantity as the working set's
    ``_correction_norm`` (which works from its own row store).
    """
    return _factor_correction_norm(L[np.concatenate([E, V]).astype(np.intp)], E.size, sV)


def _factor_correction_norm(L_T: FloatArray, n_equal: int, sV: FloatArray) -> float:
    """``√(δᵀK_TT⁺δ)`` from a factor ``L_T`` of the rows ``T`` (``L_T L_Tᵀ = K_TT``), ``δ = (0, …, 0, s_V)``
    with ``n_equal`` leading zeros (the rows held as equalities): the norm of the least-norm correction
    (:func:`_correction_norm`). An SVD of ``L_T``; singular values below ``max(shape)·eps·σ_max`` (the
    numerical rank, as :func:`_tight_solve`) count as 0."""
    U, sv, _ = np.linalg.svd(L_T, full_matrices=False)
    kept = sv > max(L_T.shape) * EPS * sv[0]
    delta = np.concatenate([np.zeros(n_equal), sV])
    return math.sqrt(float(np.sum((U[:, kept].T @ delta) ** 2 / sv[kept] ** 2)))


def _fro_error_bound(
    L: FloatArray, lam_raw: FloatArray, base: float, slack: FloatArray, beta: FloatArray, wnorm: float, d: int
) -> float:
    """A first-order bound on ``||Ŵ − Ŵ_mm||_F/||Ŵ||_F`` for the unit-row problem (``||â_r|| = 1``).

    ``Ŵ = Σ_E λ_r â_r`` solves the rows ``E`` (``λ_r ≠ 0``) as equalities; ``base = cond(K_E)·eps`` bounds
    the error of that solve. The refinement's two tolerances can leave more (both were silent before):

    * rows ``N ⊆ E`` kept with ``λ_r < 0`` (within ``−MULTIPLIER_RTOL·max λ``): ``||Ŵ − Ŵ_mm||² ≤
      Σ_N |λ_r|·(â_rᵀŴ_mm − β_r) ≤ ||λ_N||₁·||Ŵ − Ŵ_mm||`` (``λ_mm ≥ 0``, complementarity): at most ``||λ_N||₁``;
    * rows ``V ∉ E`` with slack ``s_r`` below the rounding ``ν_r = 4d·eps·(β_r + ||Ŵ||)`` of a computed slack
      (``_refine`` accepts ``s_r ≥ −ROUNDING_RTOL``; within ``ν_r`` the sign is unknown; either is amplified by
      ``1/σ_min`` when the row is nearly parallel to rows of ``E``): the optimum with ``T = E ∪ V`` active is
      within ``||Δ||`` of ``Ŵ``, ``Δ`` the least-norm correction raising each row of ``V`` by
      ``max(−s_r, 0) + ν_r`` with ``E`` kept (:func:`_correction_norm`).

    Returns ``base + (||λ_N||₁ + ||Δ||)/||Ŵ||``: ``cond(K_S)·eps`` when ``N = V = ∅`` (the generic case).
    The same bound as the working set's ``_error_bound``.
    """
    if not wnorm > 0 or not math.isfinite(base):
        return base
    E = np.flatnonzero(lam_raw != 0.0).astype(np.intp)
    bound = base + float(np.sum(-lam_raw[lam_raw < 0.0])) / wnorm
    # rounding of a computed slack â_rᵀŴ − β_r (d-term products, Ŵ's own entries): a row within it of 0 may be
    # violated by up to that much, amplified by 1/σ_min when it is nearly parallel to rows of E
    noise = 4 * d * EPS * (beta + wnorm)
    outside = np.ones(slack.size, dtype=bool)
    outside[E] = False
    V = np.flatnonzero(outside & (slack < noise)).astype(np.intp)
    if V.size:
        bound += _correction_norm(L, E, V, np.maximum(-slack[V], 0.0) + noise[V]) / wnorm
    return bound


def _rows_resolved(
    b: FloatArray, eq: NDArray[np.bool_], lam_raw: FloatArray, margins: FloatArray, wexp: NDArray[np.int64]
) -> bool:
    """Whether no row left out of the tight set could carry a significant multiplier of the problem as posed.

    A row ``r`` held by no multiplier (an inequality with ``λ'_r = 0``) but violated by ``v_r = b_r − L_r u > 0``
    needs a multiplier ``μ_r ≥ v_r`` of the unit-row problem to be met (raising ``L_r u`` by ``v_r`` through
    ``Δ = μ_r·P⊥L_r``, ``||P⊥L_r|| ≤ 1``); weighted as the posed ones (``λ_r ∝ 2^{−wexp_r}·λ'_r``) it is
    significant when ``2^{−wexp_r}·v_r > MULTIPLIER_RTOL·max_s 2^{−wexp_s}|λ'_s|``. The norm-wise KKT residuals
    (relative to ``|b_r| + ||L_r||·||u||``) cannot see such a row when its ``b_r`` is far below the others, so
    :func:`_min_norm_solution` certifies only when there is none. Compared in binary logarithms (the weights
    ``2^{−wexp}`` may span more than float64's range).
    """
    held = eq | (lam_raw != 0.0)
    viol = np.where(held, 0.0, np.maximum(b - margins, 0.0))
    out = viol > 0.0
    if not np.any(out):
        return True
    if not np.any(held & (lam_raw != 0.0)):
        return False  # a violated row and no multiplier at all: nothing to weigh it against
    nz = lam_raw != 0.0
    top = float(np.max(np.log2(np.abs(lam_raw[nz])) - wexp[nz]))
    return bool(np.all(np.log2(viol[out]) - wexp[out] <= math.log2(MULTIPLIER_RTOL) + top))


def _min_norm_solution(
    L: FloatArray,
    b: FloatArray,
    eq: NDArray[np.bool_],
    core: _Core,
    *,
    kr: NDArray[np.int64],
    Gb: int,
    factor: FloatArray | None,
    weight_exp: NDArray[np.int64] | None = None,
) -> MinNormSolution:
    """Residuals of the scaled problem ``(L, b)``; results at the caller's scale (see :func:`min_norm_dual`).

    ``weight_exp`` (the posed form of :func:`_min_norm_rows`): the multipliers of the problem are
    ``λ_r ∝ 2^{−weight_exp_r}·λ̃_r`` (``λ̃`` those of ``L``), which sets their relative sizes in the KKT residuals
    and the weakly active rows; the results are put back by ``kr``, ``Gb`` with no range check and no flush.

    ``error_bound`` is :func:`_fro_error_bound` on ``(L, b)``: ``cond(K_S)·eps`` plus what
    the refinement's two tolerances leave (inequality multipliers held slightly negative, rows outside the
    tight set violated at rounding level, amplified by ``1/σ_min``), the bound :func:`solve_svm` reports.
    """

    u, lam_raw = core.u, core.lam
    lam = np.where(eq, lam_raw, np.maximum(lam_raw, 0.0))
    margins = L @ u
    rn = np.linalg.norm(L, axis=1)
    wnorm = float(np.linalg.norm(u))
    Lt_lam = L.T @ lam
    if weight_exp is None:
        # relative sizes of the multipliers of the rows as given: λ_r ∝ 2^{−k_r}·λ'_r
        w_rel = np.ldexp(1.0, -(kr - int(np.min(kr)))) if kr.size else np.ones(0)
        lam_rel, lam_w = lam_raw * w_rel, lam * w_rel
    else:
        # the same, normalised on the largest 2^{−k_r}·|λ'_r| (rows may be any number of binades apart)
        nz = lam_raw != 0.0
        e_lam = np.frexp(lam_raw)[1].astype(np.int64) - weight_exp
        top = int(np.max(e_lam[nz])) if np.any(nz) else 0
        with np.errstate(under="ignore"):
            lam_rel, lam_w = np.ldexp(lam_raw, -weight_exp - top), np.ldexp(lam, -weight_exp - top)
    kkt = _kkt(
        margins,
        b,
        eq,
        rn,
        lam_raw,
        wnorm,
        float(np.linalg.norm(u - Lt_lam)),
        float(Lt_lam @ Lt_lam),
        lam_rel=lam_rel,
    )
    support, weak = _classify(margins, b, eq, rn, lam_w, wnorm)
    # equality rows are always held (E) and their multipliers' sign is free: 1.0 marks them held without
    # counting them among the negative inequality multipliers ||λ_N||₁
    error_bound = _fro_error_bound(
        L, np.where(eq, 1.0, lam_raw), core.error_bound, margins - b, np.abs(b), wnorm, L.shape[1]
    )
    # Norm-wise residuals (relative to |b_r| + ||a_r||·||w||) cannot see a row whose b_r is far below the
    # largest: violated by all of b_r, it still looks feasible, and its multiplier, which the rows as posed may
    # weigh most (λ_r ∝ 2^{−k_r}·λ'_r), is lost. Certify only when no row left out could carry a significant one.
    resolved = _rows_resolved(b, eq, lam_raw, margins, kr if weight_exp is None else weight_exp)
    certified = bool(error_bound <= CERTIFY_RTOL and kkt.max() <= CERTIFY_RTOL and resolved)
    if weight_exp is not None:
        with np.errstate(over="ignore", under="ignore"):
            lam_p, margins_p = np.ldexp(lam, Gb - kr), np.ldexp(margins, Gb + kr)
        return MinNormSolution(
            multipliers=_ro_own(lam_p),
            support=_ro(support),
            weakly_active=_ro(weak),
            margins=_ro_own(margins_p),
            coords=_ro_own(np.ldexp(u, Gb)),
            factor=_ro(L if factor is None else factor),
            norm=float(np.ldexp(wnorm, Gb)),
            kkt=kkt,
            error_bound=error_bound,
            certified=certified,
            method=core.method,
            iterations=core.iterations,
        )
    log2 = math.log(2.0)
    if wnorm > 0:
        scaling.check_log_representable(
            "the least-norm solution ||w||", math.log(wnorm) + Gb * log2, remedy="rescale b (w scales with b)"
        )
    with np.errstate(over="ignore", under="ignore"):
        lam_out = np.ldexp(lam, Gb - kr)
        margins_out = np.ldexp(margins, Gb + kr)
    lw = np.abs(lam_w)
    significant = lw > MULTIPLIER_RTOL * float(np.max(lw, initial=0.0))
    bad = significant & ~((np.abs(lam_out) >= scaling.FLOAT_TINY) & (np.abs(lam_out) <= scaling.FLOAT_MAX))
    if np.any(bad):
        r = int(np.flatnonzero(bad)[0])
        raise scaling.range_error(
            f"the multiplier λ_{r} of min_norm_dual",
            math.log(abs(float(lam[r]))) + float(Gb - kr[r]) * log2,
            remedy="rescale K or b (λ scales with b and with 1/K)",
        )
    lam_out = np.where(np.abs(lam_out) >= scaling.FLOAT_TINY, lam_out, 0.0)  # negligible ones only
    if not np.all(np.isfinite(margins_out)):
        r = int(np.flatnonzero(~np.isfinite(margins_out))[0])
        raise scaling.range_error(
            f"the margin a_{r}ᵀw of min_norm_dual",
            math.log(abs(float(margins[r]))) + float(Gb + kr[r]) * log2,
        )
    L_out = factor if factor is not None else np.ldexp(L, kr[:, None])
    return MinNormSolution(
        multipliers=_ro_own(lam_out),
        support=_ro(support),
        weakly_active=_ro(weak),
        margins=_ro_own(margins_out),
        coords=_ro_own(np.ldexp(u, Gb)),
        factor=_ro(L_out),
        norm=float(np.ldexp(wnorm, Gb)),
        kkt=kkt,
        error_bound=error_bound,
        certified=certified,
        method=core.method,
        iterations=core.iterations,
    )


def _pow2_str(x: float, e: int) -> str:
    """``x·2^e`` as ``1.23e+456`` (formatted from logarithms: the value itself need not be a double)."""
    if x == 0.0 or not np.isfinite(x):
        return f"{x:.3g}"
    with np.errstate(over="ignore", under="ignore"):
        v = float(np.ldexp(x, e))
    if scaling.FLOAT_TINY <= abs(v) <= scaling.FLOAT_MAX:
        return f"{v:.3g}"
    lg = math.log10(abs(x)) + e * math.log10(2.0)
    k = math.floor(lg)
    return f"{'-' if x < 0 else ''}{10.0 ** (lg - k):.3g}e{k:+d}"
