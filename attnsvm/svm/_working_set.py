"""Att-SVM at scale: a working-set solver of the factorised dual, certified like :func:`attnsvm.solve_svm`.

The problem is the Frobenius Att-SVM of :mod:`attnsvm.svm`, in its exact unit-row form (``_UnitSVM``:
each row divided by ``ρ_r = ||Δ_r||·||z_i||``, the scale kept as a power of two):

    Ŵ = argmin ½||W||_F²   s.t.   Δ̂_rᵀ W ẑ_i(r) ≥ β_r,   r = (i, t), t ≠ α_i,        W_mm = 2^G·Ŵ,

with the dual ``max_λ≥0 βᵀλ − ½λᵀKλ``, ``K[r, s] = (ẑ_r·ẑ_s)(Δ̂_r·Δ̂_s)`` and ``Ŵ = Σ_r λ_r Δ̂_r ẑ_rᵀ``.
The dense method factorises all of ``K`` (``m × m``: 545 s and 0.5 GB at ``m = 7936``); but only the
support rows carry a multiplier, a fraction of ``m`` (2578 of 7936 there). This solver never forms more
than ``K_SS`` of a working set ``S``:

1. ``S₀``: per sequence, the row with the largest ``β_r`` (the nearest token, the most violated at ``W = 0``),
   at most ``min(d, n)·d`` of them (the rank of the rows ``ẑ_i ⊗ Δ̂_r``; no round grows ``S`` beyond it).
2. Solve the dual restricted to ``S`` exactly by *block principal pivoting* (Júdice & Pires 1994; Kim &
   Park 2011): a free set ``F ⊆ S`` is solved as equalities, ``K_FF λ_F = β_F`` by a Cholesky factor
   (extended by blocks when rows join ``F``, updated by a triangular-pentagonal QR when rows leave:
   never refactorised, see ``_GramCholesky``), and
   the rows with ``λ_r < 0`` or a negative slack are exchanged (all at once while that reduces their
   number, else Murty's single exchange, which terminates for the positive definite ``K_SS``).
3. ``Ŵ = Σ_F λ_r Δ̂_r ẑ_rᵀ`` and the margins of **all** ``m`` rows: one product ``Ŵ ẑ_i`` per sequence,
   ``O(n·d² + m·d)``, never the ``m × m`` Gram. When no row outside ``S`` has slack below the rounding
   level, the KKT conditions hold over all rows (stop). Otherwise ``S ← F ∪`` (the ``chunk`` most
   violated rows): rows with ``λ = 0`` leave, ``Ŵ`` stays optimal for ``F`` and each added row is
   violated by it, so the restricted optimum ``½||Ŵ_S||²`` grows strictly: no working set repeats and
   the loop ends (Dantzig–Wolfe / cutting-plane argument).
4. Certify as :func:`~attnsvm.solve_svm` does: KKT residuals over all ``m`` rows (:func:`attnsvm.svm._dual._kkt`),
   the support (:func:`attnsvm.svm._dual._classify`), ``error_bound`` and the same ``certified`` rule.
   ``error_bound = cond(K_FF)·eps`` (the exact eigenvalue ratio for ``|F| ≤`` :data:`EXACT_COND_MAX`, above
   it a Lanczos (ARPACK) estimate of both ends, each inflated by its residual norm), plus what the loop's
   two tolerances can leave (:func:`_error_bound`): multipliers held at ``λ_r < 0`` (within
   ``MULTIPLIER_RTOL``) add ``||λ_N||₁/||Ŵ||``; rows outside ``F`` whose slack is negative (within the slack
   tolerance, a violation ``≤ 1e-12`` may be genuine) or within a slack's rounding ``ν_r`` of 0 add the norm
   of the least-norm correction that meets them with ``F`` kept, relative to ``||Ŵ||`` (large when such a row
   is nearly parallel to rows of ``F``), and, when not certified, join the exact core's start. So
   ``error_bound`` bounds the relative error of the returned ``W`` (to first order) whenever it is
   certified, not only the error of the solve on ``F``; generically (no such rows) it is ``cond(K_FF)·eps``.

Ties: rows equally violated (equal ``β_r`` in ``S₀``, equal scaled slack when rows join) are taken in row
order (sequence, then token: the order of ``svm_rows``), by stable sorts; so on a degenerate vertex the
multiplier lands on the first of the tied rows, deterministically.

When a Cholesky factor fails (``K_FF`` singular or worse than :data:`FAST_COND_MAX`: ties, ``d² <`` support,
contradictory rows), the restricted norm exceeds ``INFEASIBLE_NORM``, pivoting does not settle, or the
result is not certified, the same working-set loop is rerun with each restricted problem solved by the
dense exact core of :mod:`attnsvm.svm` (``_core`` on ``_svm_factor`` of ``S``: rank-revealing SVD solves,
Lawson–Hanson NNLS, Farkas certificates of infeasibility), warm-started from the support found so far. A
restricted solution beyond ``INFEASIBLE_NORM`` (in units of ``max β_S``) is redone without the warm start,
so that the NNLS decides infeasibility exactly as the dense solver does.

Cost: time ``O(|F|³/3)`` for the factor (built once in blocks) plus ``O(n·d² + m·d)`` per pivoting step;
memory ``O(m·d + |S|²)``. Measured figures: ``attnsvm bench --only svm`` (scale rows).

Scale: as :func:`attnsvm.solve_svm` (the same ``_UnitSVM`` reformulation and ``_back_to_data_scale``):
any finite ``X, z``; ``W_mm(2^a X, 2^b z) = 2^−(a+b)·W_mm(X, z)`` exactly (the unit-row problem is bitwise
the same); ``NumericalError`` iff ``||W_mm||_F`` or a margin is outside float64's normal range.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM); Júdice & Pires, *Comput.
Oper. Res.* 21 (1994) 587–596 (block principal pivoting); Kim & Park, *SIAM J. Sci. Comput.* 33 (2011)
3261–3281 (its NNLS form); Murty, *Math. Program.* 6 (1974) 65–78 (single principal pivoting, finite for
P-matrices); Golub & Van Loan, *Matrix Computations* (4th ed.), §4.2 (Cholesky), §10.1 (Lanczos).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.sparse
import scipy.sparse.linalg
from numpy.typing import ArrayLike

from .._types import BoolArray, FloatArray, IntArray
from .._validation import check_instance
from ..errors import InvalidInstanceError, SolverError
from ..model._instance import Instance
from ..model._tensor import SVMConstraints
from ..scaling import EPS
from ._constants import CERTIFY_RTOL, INFEASIBLE_NORM, MULTIPLIER_RTOL, SUPPORT_RTOL
from ._dual import _classify, _Core, _core, _factor_correction_norm, _kkt, _round_tol
from ._problem import (
    _back_to_data_scale,
    _check_trivially_infeasible,
    _fro_margins,
    _pairs_alpha,
    _pairs_of,
    _raise_infeasible,
    _require_rows,
    _svm_factor,
    _SVMFactor,
    _unit_svm,
    _UnitSVM,
    _weighted_sum,
)
from ._results import InfeasibleMinNormError, SVMSolution, _ro, _ro_own

__all__ = [
    "EXACT_COND_MAX",
    "FAST_COND_MAX",
    "CHUNK_MIN",
    "LANCZOS_TOL",
    "solve_svm_working_set",
]


#: ``cond(K_FF)`` is computed exactly (all eigenvalues, ``O(|F|³)``, ≈1 s at ``|F| = 2048`` on one core)
#: up to this many support rows; above, by Lanczos at both ends of the spectrum (``O(|F|²)`` per step).
EXACT_COND_MAX = 2048

#: Relative tolerance of the Lanczos Ritz values (ARPACK ``tol``: residual ``≤ tol·θ``). The estimate only
#: feeds ``error_bound = cond·eps``, a first-order bound compared with ``CERTIFY_RTOL`` (``cond ≤ 4.5e6``):
#: a few per cent do not matter there. Each end is raised by its residual norm, so the estimate is at most
#: ``(1 + tol)² − 1 ≈ 2 %`` above the product of the Ritz values, and an extreme Ritz value converges from
#: inside with the residual's square (measured at ``|F| = 2578``: 2.6e-4 below the exact eigenvalue after
#: 21 products, against 71 products at ``tol = 1e-8``; each product costs two passes over the factor).
LANCZOS_TOL = 1e-2

#: The fast path gives up on a Cholesky factor whose diagonal ratio ``(max r_kk / min r_kk)²`` (a lower
#: bound on ``cond(K_FF)``) exceeds this: multipliers from it keep fewer than ``-log10(FAST_COND_MAX·eps)``
#: ≈ 4 digits, far from certifiable (``cond ≤ 4.5e6``); the rank-revealing exact core takes over.
FAST_COND_MAX = 1e12

#: Rows added per working-set round: at least this many, and at least one per sequence (see ``chunk``).
CHUNK_MIN = 256

#: Block principal pivoting: full exchanges allowed without a decrease of the infeasible count before
#: Murty's single exchange (Júdice & Pires' ``p̄ = 3``).
BPP_BACKUP = 3

#: Pivoting steps per restricted problem before the exact core takes over (typically 1–5 are needed).
MAX_PIVOTS = 200

#: Working-set rounds before the exact core takes over (typically 5–10 are needed).
MAX_ROUNDS = 500


# ====================================================================== blocks of K
class _Rows:
    """The unit-row problem's data in the form the working set needs: ``K`` blocks, ``Ŵ`` and margins."""

    def __init__(self, u: _UnitSVM) -> None:
        self.u = u
        self.D = u.c.deltas  # (m, d) unit Δ̂_r
        self.seq = u.c.pairs[:, 0]  # (m,) sequence of each row
        self.Zg = u.zhat @ u.zhat.T  # (n, n) ẑ_i·ẑ_j
        self.n = u.zhat.shape[0]

    def K(self, A: IntArray, B: IntArray) -> FloatArray:
        """``K[A, B] = (ẑ_A ẑ_Bᵀ) ∘ (Δ̂_A Δ̂_Bᵀ)``: ``O(|A|·|B|·d)``."""
        return np.asarray(self.Zg[np.ix_(self.seq[A], self.seq[B])] * (self.D[A] @ self.D[B].T))

    def W(self, rows: IntArray, lam: FloatArray) -> FloatArray:
        """``Σ_r λ_r Δ̂_r ẑ_rᵀ = Bᵀ Ẑ`` with ``B_i = Σ_{r ∈ seq i} λ_r Δ̂_r``: ``O(|rows|·d + n·d²)``."""
        onehot = scipy.sparse.csr_matrix(
            (lam, (self.seq[rows], np.arange(rows.size))), shape=(self.n, rows.size)
        )
        B = np.asarray(onehot @ self.D[rows])
        return np.asarray(B.T @ self.u.zhat, dtype=np.float64)

    def margins(self, W: FloatArray) -> FloatArray:
        """``Δ̂_rᵀ Ŵ ẑ_i(r)`` for all ``m`` rows: one ``Ŵ ẑ_i`` per sequence (:func:`attnsvm.svm._problem._fro_margins`)."""
        return _fro_margins(self.u.zhat, self.u.c, W)


class _Singular(Exception):
    """``K_FF`` is singular or too badly conditioned for the Cholesky fast path."""


def _principal_block(R: FloatArray, kept: IntArray) -> FloatArray:
    """``R[kept][:, kept]`` of an upper triangular column-major ``R``, copied run by run of consecutive indices.

    With few rows leaving, ``kept`` is a few long runs: the copy is a few large strided block copies (one
    pass over memory), where fancy indexing of a large matrix gathers element by element (3-10x slower
    at ``|F| = 6000``). Blocks below the diagonal are zero and skipped.
    """
    N = kept.size
    out = np.zeros((N, N), order="F")
    runs = _runs(kept)
    for a0, a1, ra in runs:
        for b0, b1, cb in runs:
            if b1 > a0:  # not strictly below the diagonal
                out[ra : ra + a1 - a0, cb : cb + b1 - b0] = R[a0:a1, b0:b1]
    return out


def _runs(idx: IntArray) -> list[tuple[int, int, int]]:
    """The runs of consecutive values of the sorted ``idx``: ``(first, last + 1, position of first)``."""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts, ends = np.r_[0, breaks], np.r_[breaks, idx.size]
    return [(int(idx[s]), int(idx[e - 1]) + 1, int(s)) for s, e in zip(starts, ends, strict=True)]


def _copy_columns(out: FloatArray, R: FloatArray, cols: IntArray) -> None:
    """``out[:] = R[:, cols]`` run by run (contiguous column blocks of a column-major ``R``)."""
    for b0, b1, cb in _runs(cols):
        out[:, cb : cb + b1 - b0] = R[:, b0:b1]


class _GramCholesky:
    """Upper triangular ``R`` with ``RᵀR = K_FF`` for an ordered row set ``F``, updated in blocks, never refactorised.

    Rows leave: with ``k`` = the kept positions and ``D`` the leaving ones, ``K_kk = R[:, k]ᵀR[:, k] =
    R[k, k]ᵀR[k, k] + R[D, k]ᵀR[D, k]``, and ``R[k, k]`` is upper triangular; so the new factor is the ``R`` of
    the QR factorisation of ``[R[k, k]; R[D, k]]`` (LAPACK ``dtpqrt``, triangular-pentagonal QR, backward
    stable, ``O(|D|·|F|²)``; only the columns after the first leaving row change). Rows join: ``R₁₂ =
    R⁻ᵀK[F, new]`` and ``R₂₂ = chol(K_new,new − R₁₂ᵀR₁₂)``, ``O(|F|²k + |F|k² + k³)``. A factor is never
    rebuilt, so the whole solve costs about one Cholesky of the final ``K_FF`` (``|F|³/3`` flops).
    Diagonal entries may be negative after a QR step (``RᵀR`` is what counts).
    """

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.F: IntArray = np.zeros(0, dtype=np.intp)
        self.R: FloatArray = np.zeros((0, 0), order="F")

    def update(self, F_new: IntArray) -> None:
        keep = np.isin(self.F, F_new)
        if not np.all(keep):
            self._drop(keep)
        new = F_new[~np.isin(F_new, self.F)]
        if new.size:
            self._append(new)
        dg = np.abs(np.diag(self.R))
        # (max |r_kk| / min |r_kk|)² ≤ cond(K_FF): a lower bound, cheap
        if self.F.size and not (np.min(dg) > 0 and (np.max(dg) / np.min(dg)) ** 2 <= FAST_COND_MAX):
            raise _Singular("the Cholesky diagonal spans more than FAST_COND_MAX")

    def _drop(self, keep: BoolArray) -> None:
        gone = np.flatnonzero(~keep)
        p = int(gone[0])  # rows and columns before the first leaving row do not change
        kept = np.flatnonzero(keep)
        tail = kept[p:]  # kept rows after it (positions in the old factor)
        N1 = kept.size
        R = np.zeros((N1, N1), order="F")
        R[:p, :p] = self.R[:p, :p]
        if tail.size:
            _copy_columns(R[:p, p:], self.R[:p], tail)  # R[:p, tail]: unchanged columns of the kept block
            # A = R[tail, tail] (upper triangular, built contiguous so dtpqrt works in place), B = R[D, tail]
            A = _principal_block(self.R, tail)
            B = np.asfortranarray(self.R[gone][:, tail])
            a, _, _, info = scipy.linalg.lapack.dtpqrt(
                0, min(64, tail.size), A, B, overwrite_a=1, overwrite_b=1
            )
            if info != 0:
                raise _Singular(f"LAPACK dtpqrt failed (info = {info})")
            R[p:, p:] = a  # its strictly lower part is A's: zero (dtpqrt does not reference it)
        self.F, self.R = self.F[keep], R

    def _append(self, new: IntArray) -> None:
        p = self.F.size
        S22 = self.rows.K(new, new)
        if p:
            R12 = scipy.linalg.solve_triangular(
                self.R, self.rows.K(self.F, new), trans="T", lower=False, check_finite=False
            )
            S22 -= R12.T @ R12  # the Schur complement of the kept block
        try:
            R22 = scipy.linalg.cholesky(S22, lower=False, check_finite=False)
        except np.linalg.LinAlgError as exc:
            raise _Singular(str(exc)) from None
        R = np.zeros((p + new.size, p + new.size), order="F")  # LAPACK's order: no copies in the solves
        R[:p, :p] = self.R
        if p:
            R[:p, p:] = R12
        R[p:, p:] = R22
        self.F, self.R = np.concatenate([self.F, new]).astype(np.intp), R

    def solve(self, b: FloatArray) -> FloatArray:
        """``K_FF⁻¹ b`` (two triangular solves, ``O(|F|²)``)."""
        return np.asarray(scipy.linalg.cho_solve((self.R, False), b, check_finite=False))


# ============================================================== restricted problems
@dataclass
class _State:
    """The working set's solution: multipliers on ``rows``, ``Ŵ``, all ``m`` margins."""

    rows: IntArray  # rows with a multiplier (F of the fast path, the working set of the exact one)
    lam: FloatArray  # multipliers on ``rows`` (raw: tiny negatives possible)
    W: FloatArray
    margins: FloatArray
    error_bound: float  # exact path: the core's cond(K_S)·eps; fast path: computed at the end
    pivots: int


def _slack_tol(beta: FloatArray, wnorm: float, k: int) -> FloatArray:
    """Rounding level of the slacks (as :func:`attnsvm.svm._dual._refine`): ``_round_tol(k)·(β_r + ||Ŵ||)``, unit rows."""
    return _round_tol(k) * (beta + wnorm)


def _bpp(rows: _Rows, chol: _GramCholesky, S: IntArray, F0: IntArray) -> _State:
    """Block principal pivoting for ``min ½λᵀK_SSλ − β_Sᵀλ, λ ≥ 0`` from the free set ``F0 ⊆ S``.

    Each step solves ``K_FF λ_F = β_F`` and takes ``V = {r ∈ F: λ_r < 0} ∪ {r ∈ S∖F: slack_r < 0}`` (to the
    rounding levels of :mod:`attnsvm.svm`); ``V = ∅`` is the restricted KKT point. ``F ← F △ V`` while
    ``|V|`` decreases (or for :data:`BPP_BACKUP` more steps), else ``F ← F △ {max V}`` (Murty).
    """
    beta = rows.u.beta
    free = np.isin(S, F0)
    best, backup = S.size + 1, BPP_BACKUP
    for it in range(1, MAX_PIVOTS + 1):
        chol.update(S[free])
        lam = chol.solve(beta[chol.F])
        W = rows.W(chol.F, lam)
        wnorm = float(np.linalg.norm(W))
        if not wnorm <= INFEASIBLE_NORM:  # also NaN: beyond what float64 certifies (svm.INFEASIBLE_NORM)
            raise _Singular(f"restricted norm {wnorm:.3g} exceeds INFEASIBLE_NORM")
        margins = rows.margins(W)
        slack = margins - beta
        lmax = float(np.max(np.abs(lam), initial=0.0))
        neg = chol.F[lam < -MULTIPLIER_RTOL * lmax]
        tol = _slack_tol(beta, wnorm, max(chol.F.size, rows.D.shape[1]))
        out = S[~free]
        viol = out[slack[out] < -tol[out]]
        V = np.concatenate([neg, viol])
        if V.size == 0:
            return _State(chol.F.copy(), lam, W, margins, math.nan, it)
        flip = np.isin(S, V)
        if V.size < best:
            best, backup = V.size, BPP_BACKUP
        elif backup > 0:
            backup -= 1
        else:
            flip = S == int(np.max(V))  # Murty's rule: the largest index of a fixed order
        free ^= flip
    raise _Singular("block principal pivoting did not settle")


def _exact_restricted(u: _UnitSVM, rows: _Rows, S: IntArray, hint: IntArray) -> _State:
    """The restricted problem on ``S`` by the dense exact core of :mod:`attnsvm.svm` (warm-started at ``hint``)."""
    c = u.c
    cS = SVMConstraints(c.deltas[S], c.queries[S], c.pairs[S], c.alpha)
    fac = _svm_factor(u.zhat, cS)
    hint_local = np.flatnonzero(np.isin(S, hint)).astype(np.intp)
    bS, eqS = u.beta[S], np.zeros(S.size, dtype=bool)
    try:
        core = _core(fac.L, bS, eqS, hint_local)
        W = _core_W(u, fac, cS, core)
        # The warm-started active set (svm._refine) accepts any feasible point, however large; the dense
        # core reaches it only after the NNLS, which declares "infeasible" beyond INFEASIBLE_NORM (in units
        # of the largest right-hand side, svm._ldp_nnls). Beyond that norm the NNLS decides here too, so
        # the working set raises InfeasibleSVMError exactly where solve_svm(method="dual") does.
        if not np.linalg.norm(W) <= INFEASIBLE_NORM * float(np.max(bS)):
            core = _core(fac.L, bS, eqS, None)
            W = _core_W(u, fac, cS, core)
    except InfeasibleMinNormError as err:
        # a Farkas certificate of rows of S is one of the whole problem (the same rows, the same W)
        _raise_infeasible(cS, err, u.G)
        raise  # unreachable
    if not np.all(np.isfinite(W)):
        raise SolverError("the Att-SVM solution is not finite; the instance is too badly conditioned")
    return _State(S, core.lam, W, rows.margins(W), float(core.error_bound), core.iterations)


def _core_W(u: _UnitSVM, fac: _SVMFactor, cS: SVMConstraints, core: _Core) -> FloatArray:
    """``Ŵ`` of an exact-core solution on the rows ``cS``: from its primal coordinates, or its multipliers."""
    W = fac.to_W(core.u)
    if W is None:  # eigendecomposition factor: W from the multipliers (as svm._solve_fro_unit)
        W = _weighted_sum(u.zhat, cS, np.maximum(core.lam, 0.0))
    return np.asarray(W, dtype=np.float64)


# ======================================================================= condition
def _cond_KFF(rows: _Rows, chol: _GramCholesky) -> float:
    """``cond(K_FF)``: exact eigenvalues up to :data:`EXACT_COND_MAX` rows, else Lanczos at both ends.

    Lanczos: the largest eigenvalue of ``K_FF`` (products ``K x = A_F(A_Fᵀx)`` from the data, ``O(n·d² +
    |F|·d)``, independent of the factor) and of ``K_FF⁻¹`` (two triangular solves with ``R``); each Ritz value
    ``θ`` is raised to ``θ + ||K y − θ y||`` (an eigenvalue lies within the residual norm of ``θ``).
    """
    F = chol.F
    if F.size == 0:
        return 1.0
    if F.size <= EXACT_COND_MAX:
        ev = scipy.linalg.eigh(rows.K(F, F), eigvals_only=True, check_finite=False)
        return float(ev[-1] / ev[0]) if ev[0] > 0 else math.inf
    seqF, DF, zhat = rows.seq[F], rows.D[F], rows.u.zhat

    def kmul(x: FloatArray) -> FloatArray:
        W = rows.W(F, np.asarray(x, dtype=np.float64).reshape(-1))
        return np.asarray(np.einsum("rk,rk->r", DF, (W @ zhat.T).T[seqF]))

    def kinv(x: FloatArray) -> FloatArray:
        return chol.solve(np.asarray(x, dtype=np.float64).reshape(-1))

    def top(mv: Callable[[FloatArray], FloatArray]) -> float:
        op = scipy.sparse.linalg.LinearOperator((F.size, F.size), matvec=mv, dtype=np.float64)
        v0 = np.ones(F.size) / math.sqrt(F.size)  # deterministic start: reproducible certificates
        try:
            vals, vecs = scipy.sparse.linalg.eigsh(op, k=1, which="LA", tol=LANCZOS_TOL, v0=v0)
        except scipy.sparse.linalg.ArpackNoConvergence:
            return math.inf  # no estimate: not certified
        y = vecs[:, 0]
        return float(vals[0] + np.linalg.norm(mv(y) - vals[0] * y))

    return top(kmul) * top(kinv)


def _correction_norm(
    rows: _Rows, E: IntArray, V: IntArray, sV: FloatArray, chol: _GramCholesky | None
) -> float:
    """``||Δ||`` of the least-norm ``Δ`` with ``â_rᵀΔ = 0`` on ``E`` and ``â_rᵀΔ = δ_r`` (``sV``) on ``V``: ``√(δᵀK_TT⁺δ)``.

    ``T = E ∪ V``, ``δ = (0_E, s_V)``; singular values of the rows below their numerical rank count as 0: a row of
    ``V`` that repeats rows of ``E`` (ties) adds its own slack, not ``1/0``. By an SVD of the compressed rows
    (:func:`attnsvm.svm._problem._svm_factor`) up to :data:`EXACT_COND_MAX` rows; above, by the Schur complement
    ``K_VV − K_VE K_EE⁻¹ K_EV`` on a Cholesky factor of ``K_EE`` (``δᵀK_TT⁻¹δ = s_Vᵀ(Schur)⁻¹s_V``), ``inf`` when
    ``K_EE`` has no factor.
    """
    T = np.concatenate([E, V]).astype(np.intp)
    if T.size <= EXACT_COND_MAX:
        # on the rows themselves (the exact compressed factor L_T, L_T L_Tᵀ = K_TT), not on K_TT: a nearly
        # parallel row has σ_min(L_T) ≈ its angle, resolved down to eps, where K_TT's λ_min = σ_min² drowns in
        # K's rounding below √eps
        c = rows.u.c
        L = _svm_factor(rows.u.zhat, SVMConstraints(c.deltas[T], c.queries[T], c.pairs[T], c.alpha)).L
        return _factor_correction_norm(L, E.size, sV)
    if chol is None or not np.array_equal(np.sort(chol.F), np.sort(E)):
        chol = _GramCholesky(rows)
        try:
            chol.update(E)
        except _Singular:
            return math.inf
    R12 = scipy.linalg.solve_triangular(chol.R, rows.K(chol.F, V), trans="T", lower=False, check_finite=False)
    mu, U = scipy.linalg.eigh(rows.K(V, V) - R12.T @ R12, check_finite=False)
    kept = mu > T.size * EPS * max(float(mu[-1]), 0.0)
    return math.sqrt(float(np.sum((U[:, kept].T @ sV) ** 2 / mu[kept])))


# ========================================================================== public
def _default_chunk(n: int) -> int:
    return max(CHUNK_MIN, n)


def solve_svm_working_set(
    inst: Instance,
    alpha: ArrayLike | None = None,
    *,
    chunk: int | None = None,
    max_working_set: int | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> SVMSolution:
    """Solve the Frobenius Att-SVM(α) by a working set of constraints, with the exact certificate of ``solve_svm``.

    ``W_mm(α) = argmin ||W||_F  s.t.  (x_iα_i − x_it)ᵀ W z_i ≥ 1  ∀ t ≠ α_i, ∀ i`` through its dual
    ``max_λ≥0 1ᵀλ − ½λᵀKλ`` (``K[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju)``, ``W = Σ λ_it Δ_it z_iᵀ``), restricted
    to a working set grown from the most violated rows and solved exactly on it (block principal pivoting
    on a Cholesky factor of ``K_SS``); the margins of all ``m`` rows cost ``O(n·d² + m·d)`` per step and the
    ``m × m`` Gram is never formed. See the module docstring for the algorithm and its fallback.

    Args:
      inst: the :class:`~attnsvm.Instance`.
      alpha: token choice, shape ``(n,)`` integers in ``[0, T)``; ``None`` means the optimal tokens.
      chunk: rows added per round (the most violated); default ``max(CHUNK_MIN, n)`` = ``max(256, n)``.
      max_working_set: refuse (``SolverError``) rather than hold a working set larger than this
        (memory ``≈ 16·|S|²`` bytes); default ``None``, no limit but ``m``.
      progress: called after each round with ``{"round", "working_set", "free", "violated",
        "min_slack", "pivots", "elapsed_s", "path"}`` (``min_slack`` of the unit-row problem).

    Returns:
      :class:`~attnsvm.svm.SVMSolution` exactly as ``solve_svm(inst, alpha, method="dual")`` returns it:
      ``method="dual"``, KKT residuals over **all** ``m`` rows, support and weakly active rows,
      ``error_bound = cond(K_S)·eps`` (``S`` the rows solved as equalities) plus the effect of the loop's
      tolerances (module docstring, step 4), ``certified`` by the same rule (bound and residuals
      ``≤ CERTIFY_RTOL``, every support row resolved), duals aligned with ``svm_rows(inst, alpha)``;
      ``raw_rel_error = W_raw = None``. Ties between equally violated rows are broken by row order
      (sequence, then token).

    Scale: any finite ``X, z``; ``W_mm(2^jx X, 2^jz z) = 2^−(jx+jz)·W_mm(X, z)`` exactly; relative Frobenius
    error ≤ ``error_bound`` (certified ≤ 1e-9); raises ``NumericalError`` iff ``||W_mm||_F`` or a margin is
    outside ``[2.2e-308, 1.8e308]`` (``duals = None`` iff a non-negligible multiplier is), as ``solve_svm``.

    Raises:
      InfeasibleSVMError: the constraints cannot be met, or only by ``||Ŵ||`` beyond ``INFEASIBLE_NORM`` (a
        Farkas certificate on the working set; wherever ``solve_svm(method="dual")`` raises it).
      SolverError: ``max_working_set`` would be exceeded, or the solution is not finite.
      InvalidInstanceError: bad ``inst``, ``alpha``, ``chunk`` or ``max_working_set``.
    """
    t0 = time.perf_counter()
    check_instance(inst)
    for name, val in (("chunk", chunk), ("max_working_set", max_working_set)):
        if val is not None and (not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1):
            raise InvalidInstanceError(f"{name} must be a positive integer or None; got {val!r}")
    pairs, a = _pairs_alpha(inst, alpha)  # masked tokens have no row
    _require_rows(pairs)
    _check_trivially_infeasible(inst, pairs, a)
    # The exact unit-row reformulation of svm.py (rows ÷ ||Δ_it||·||z_i||, the scale kept as 2^E): nothing
    # of the data's size is squared or multiplied out, and the scale goes back as a power of two.
    u = _unit_svm(inst, pairs, a)
    rows = _Rows(u)
    m = pairs.shape[0]
    step = int(chunk) if chunk is not None else _default_chunk(inst.n)
    cap = m if max_working_set is None else min(m, int(max_working_set))
    chol = _GramCholesky(rows)
    hint = None
    try:
        state, rounds, max_S = _loop(u, rows, step, cap, progress, t0, chol=chol, hint=None)
        sol, V = _certify(u, rows, state, chol, rounds, max_S, t0, time.perf_counter())
        if sol.certified:
            return sol
        # the exact core starts from the rows with a multiplier and those violated within the tolerance
        hint = np.union1d(state.rows[state.lam > 0], V).astype(np.intp)
    except _Singular:
        hint = chol.F  # the last free set the fast path factorised
    # The exact core on the working set: rank-revealing, decides infeasibility (Farkas), handles ties.
    try:
        state, rounds, max_S = _loop(u, rows, step, cap, progress, t0, chol=None, hint=hint)
    except _Singular as exc:
        raise SolverError(
            f"the working-set Att-SVM did not settle ({exc}); use solve_svm(method='dual')"
        ) from None
    return _certify(u, rows, state, None, rounds, max_S, t0, time.perf_counter())[0]


def _loop(
    u: _UnitSVM,
    rows: _Rows,
    step: int,
    cap: int,
    progress: Callable[[dict[str, Any]], None] | None,
    t0: float,
    *,
    chol: _GramCholesky | None,
    hint: IntArray | None,
) -> tuple[_State, int, int]:
    """The working-set rounds; ``chol`` given: the Cholesky fast path, else the exact core."""
    beta, seq = u.beta, rows.seq
    n, d = u.zhat.shape
    rank_max = min(d, n) * d
    # S₀: per sequence the row with the largest β_r (most violated at W = 0), at most rank_max of them
    # (the largest β first), plus the hint
    order = np.lexsort((-beta, seq))
    first = np.r_[0, np.flatnonzero(np.diff(seq[order])) + 1]
    S = np.asarray(order[first], dtype=np.intp)
    S = S[np.argsort(-beta[S], kind="stable")[:rank_max]]  # no more rows than the rank allows
    if hint is not None:
        S = np.union1d(hint, S).astype(np.intp)
    # rows believed active: all of S for block pivoting (its first solve); the hint for the exact core's
    # active-set step (it adds violated rows itself, one at a time, each with an SVD)
    F0 = S if hint is None or chol is not None else np.asarray(hint, dtype=np.intp)
    pivots, max_S = 0, 0
    for rnd in range(1, MAX_ROUNDS + 1):
        if S.size > cap:
            raise SolverError(
                f"the working set needs {S.size} rows, more than max_working_set = {cap} (memory ≈ "
                f"{16 * S.size**2 / 2**30:.2g} GiB); raise max_working_set or use solve_svm(method='dual')"
            )
        max_S = max(max_S, S.size)
        if chol is not None:
            state = _bpp(rows, chol, S, F0)
        else:
            state = _exact_restricted(u, rows, S, F0)
        pivots += state.pivots
        state.pivots = pivots
        slack = state.margins - beta
        wnorm = float(np.linalg.norm(state.W))
        tol = _slack_tol(beta, wnorm, max(state.rows.size, rows.D.shape[1]))
        inS = np.zeros(beta.size, dtype=bool)
        inS[S] = True
        viol = np.flatnonzero(~inS & (slack < -tol))
        if progress is not None:
            progress(
                {
                    "round": rnd,
                    "working_set": int(S.size),
                    "free": int(np.sum(state.lam > 0)),
                    "violated": int(viol.size),
                    "min_slack": float(np.min(slack)),
                    "pivots": pivots,
                    "elapsed_s": time.perf_counter() - t0,
                    "path": "fast" if chol is not None else "exact",
                }
            )
        if viol.size == 0:
            return state, rnd, max_S
        # Rows with λ = 0 leave (Ŵ stays optimal without them); the most violated rows join, so the
        # restricted optimum grows strictly and no working set repeats.
        if chol is None:  # exact core: keep the rows with λ > 0 and the (weakly) active ones
            act = np.abs(slack[state.rows]) <= SUPPORT_RTOL * (beta[state.rows] + wnorm)
            keep = state.rows[(state.lam > 0) | act]
        else:
            keep = state.rows
        # rows â_r = ẑ_i ⊗ Δ̂_r span at most rank_max = min(d, n)·d dimensions: more free rows than that make
        # K_FF singular, so a round adds no more than fill that up (at least one row)
        room = max(1, min(step, cap - keep.size, rank_max - keep.size))
        add = viol[np.argsort(slack[viol] / tol[viol], kind="stable")[:room]]
        S = np.concatenate([keep, add]).astype(np.intp)
        F0 = S if chol is not None else keep
    raise _Singular("the working set did not settle")


def _certify(
    u: _UnitSVM,
    rows: _Rows,
    state: _State,
    chol: _GramCholesky | None,
    rounds: int,
    max_S: int,
    t0: float,
    t1: float,
) -> tuple[SVMSolution, IntArray]:
    """KKT over all ``m`` rows, support, error bound and the back-scaling, as ``svm._solve_fro_unit``/``_solve_fro``.

    Also returns the rows violated within the tolerance that no multiplier holds (see :func:`_error_bound`).
    """
    c = u.c
    m = c.pairs.shape[0]
    b = u.beta
    eq = np.zeros(m, dtype=bool)
    lam_raw = np.zeros(m)
    lam_raw[state.rows] = state.lam
    lam = np.maximum(lam_raw, 0.0)
    W_hat = state.W
    if not np.all(np.isfinite(W_hat)):
        raise SolverError("the Att-SVM solution is not finite; the instance is too badly conditioned")
    base = _cond_KFF(rows, chol) * EPS if chol is not None else state.error_bound
    margins_hat = rows.margins(W_hat)
    wnorm_hat = float(np.linalg.norm(W_hat))
    error_bound, V = _error_bound(rows, state, chol, base, margins_hat - b, wnorm_hat)
    # stationarity in factored form over all m rows (svm._weighted_sum: another summation order than Ŵ's)
    M = _weighted_sum(u.zhat, c, lam)
    rn = np.linalg.norm(c.deltas, axis=1) * np.linalg.norm(c.queries, axis=1)  # = 1 up to rounding
    # KKT of the unit-row problem; relative multipliers λ_r ∝ β_r·λ̂_r (see svm._UnitSVM)
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
    unresolved = support[b[support] <= SUPPORT_RTOL * (b[support] + rn[support] * wnorm_hat)]
    certified = bool(error_bound <= CERTIFY_RTOL and kkt.max() <= CERTIFY_RTOL and unresolved.size == 0)
    t2 = time.perf_counter()
    W, wnorm, margins, dual_parts = _back_to_data_scale(u, W_hat, wnorm_hat, margins_hat, lam)
    assert dual_parts is not None
    duals, duals_mantissa, duals_exponent = dual_parts
    how = (
        "block principal pivoting, Cholesky of K_S"
        if chol is not None
        else "exact core (SVD active set, NNLS)"
    )
    t3 = time.perf_counter()
    sol = SVMSolution(
        W=_ro_own(W),
        alpha=_ro(c.alpha),
        norm="fro",
        method="dual",
        solver=f"working set on the factorised dual ({how}; {rounds} rounds, |S| <= {max_S} of {m})",
        objective=wnorm,
        pairs=_ro(c.pairs),
        margins=_ro_own(margins),
        duals=None if duals is None else _ro_own(duals),
        support=_pairs_of(c, support),
        weakly_active=_pairs_of(c, weak),
        kkt=kkt,
        error_bound=float(error_bound),
        certified=certified,
        raw_rel_error=None,
        iterations=state.pivots,
        timings={"solver": t1 - t0, "active_set": t2 - t1, "total": t3 - t0},
        duals_mantissa=_ro_own(duals_mantissa),
        duals_exponent=duals_exponent,
    )
    return sol, V


def _error_bound(
    rows: _Rows, state: _State, chol: _GramCholesky | None, base: float, slack: FloatArray, wnorm: float
) -> tuple[float, IntArray]:
    """A first-order bound on ``||Ŵ − Ŵ_mm||_F/||Ŵ||_F``, and the rows ``V`` it had to account for.

    ``Ŵ = Σ_E λ_r â_r`` solves the rows ``E`` (those with ``λ_r ≠ 0``) as equalities; ``base = cond(K_EE)·eps``
    bounds the error of that solve. Two tolerances of the loop can leave more (both were silent before):

    * rows ``N ⊆ E`` held with ``λ_r < 0`` (within ``−MULTIPLIER_RTOL·max λ``): ``Ŵ`` is then the optimum with
      ``N`` as equalities, and ``||Ŵ − Ŵ_mm||² ≤ Σ_N |λ_r|·(â_rᵀŴ_mm − β_r) ≤ Σ_N |λ_r|·||Ŵ − Ŵ_mm||`` (unit
      rows, ``λ_mm ≥ 0``, complementarity): the error is at most ``||λ_N||₁``;
    * rows ``V ∉ E`` with slack ``s_r`` below the rounding ``ν_r = 4d·eps·(β_r + ||Ŵ||)`` of a computed slack
      (within the loop's tolerance, ``≥ 1e-12`` relative, a violation may be genuine; within ``ν_r`` its sign
      is unknown; either is amplified by ``1/σ_min`` when the row is nearly parallel to rows of ``E``): with
      ``T = E ∪ V`` active, the optimum is within ``||Δ||`` of ``Ŵ``, ``Δ`` the least-norm correction raising
      each row of ``V`` by ``max(−s_r, 0) + ν_r`` with ``E`` kept (:func:`_correction_norm`).

    ``error_bound = base + (||λ_N||₁ + ||Δ||)/||Ŵ||``: ``cond(K_S)·eps`` when ``N = V = ∅`` (the generic case).
    """
    if not wnorm > 0:
        return base, np.zeros(0, dtype=np.intp)
    E = state.rows[state.lam != 0.0]
    bound = base + float(np.sum(-state.lam[state.lam < 0.0])) / wnorm
    outside = np.ones(slack.size, dtype=bool)
    outside[E] = False
    # rounding of a computed slack â_rᵀŴ − β_r (d-term products, Ŵ's own entries): a row within it of 0 may be
    # violated, by up to that much (amplified by 1/σ_min when it is nearly parallel to rows of E)
    noise = 4 * rows.D.shape[1] * EPS * (rows.u.beta + wnorm)
    V = np.flatnonzero(outside & (slack < noise)).astype(np.intp)
    if V.size:
        bound += _correction_norm(rows, E, V, np.maximum(-slack[V], 0.0) + noise[V], chol) / wnorm
    return bound, V
