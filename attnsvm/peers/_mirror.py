"""ℓp mirror descent on attention and the ℓp-norm Att-SVM it converges to.

Potential ``ψ(W) = (1/p) Σ_ij |W_ij|^p`` (entrywise, ``p > 1``), mirror map and inverse

    ∇ψ(W) = sign(W) ⊙ |W|^{p−1},        (∇ψ)^{-1}(U) = sign(U) ⊙ |U|^{q−1},   q = p/(p−1),

(``(p−1)(q−1) = 1``). Mirror descent (ℓp-AttGD): ``∇ψ(W⁺) = ∇ψ(W) − η g`` with ``g = ∇L(W)``,
or ``g = ∇L/||∇L||_q`` (entrywise dual norm) for the normalized variant. The engine keeps the
dual iterate ``U = ∇ψ(W)`` as its state and maps it back once per step, so no round trip
``W → ∇ψ(W) → W`` accumulates rounding; the normalized ``g`` is formed from the core's
log-domain unit gradient ``D`` (``∇L = e^{log_norm} D``), as ``D/||D||_q``, exact after ``∇L``
underflows.

The limit direction is the ℓp-Att-SVM

    W_p(α) = argmin ||W||_p = (Σ|W_ij|^p)^{1/p}  s.t.  (x_iα_i − x_it)ᵀ W z_i ≥ 1,

not a quadratic program for ``p ≠ 2``: solved with cvxpy (``pnorm``, Clarabel), feasibility
restored by rescaling with the smallest margin, then *polished*: on the solver's active set
``S`` the KKT system ``A_S (∇ψ)^{-1}(A_Sᵀμ) = 1`` is solved by Newton's method for ``μ``, giving
``W = (∇ψ)^{-1}(Aᵀμ)`` to machine precision when ``μ_S > 0`` and the other rows have slack.
The certificate is the duality gap: for any ``μ ≥ 0``, ``1ᵀμ / ||Aᵀμ||_q ≤ ||W*||_p`` (Hölder),
so ``(||W||_p − 1ᵀμ/||Aᵀμ||_q)/||W||_p`` bounds the relative suboptimality of a feasible ``W``.

Convergence metric: the Bregman divergence between the ℓp-normalised SVM solution ``a`` and
iterate ``b``,

    D_ψ(a, b) = (1/p)||a||_p^p + ((p−1)/p)||b||_p^p − ⟨sign(b)|b|^{p−1}, a⟩,

summed entrywise (every entry's term is ≥ 0 by Young's inequality); for ``p = 2`` it is
``1 − cos(a, b)``.

Scale: ``ψ`` is homogeneous (``∇ψ`` of degree ``p − 1``, its inverse of degree ``1/(p−1)``,
``||·||_p`` of degree 1, ``D_ψ`` of the unit directions of degree 0). The maps refuse an entry whose
image leaves float64's normal range (decided from the computed image; the size reported from
``(p−1)·log|W|``); norms and unit directions come from power-of-two mantissas; the ℓp-SVM is solved
on the row mantissa (``W_p(2^j X, 2^j z) = 2^−2j W_p``), or on per-row mantissas when its rows are too far
apart in size for the conic solver, and the engine's direction on rescaled data.
The engine carries its dual state ``U = ∇ψ(W)`` as mantissa ⊙ 2^exponent per entry, so ``U`` may
leave float64 (``|W|^{p−1}``, ``η g``) wherever ``W`` itself is a double.

References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (ℓp-AttGD, ℓp-Att-SVM, Bregman
metric); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (the ``p = 2`` case).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._deps import require
from .._types import FloatArray, Int64Array
from .._validation import as_real_array, check_int, check_positive
from ..errors import AttnSVMError, InfeasibleSVMError, NumericalError, SolverError
from ..gd._single import record_steps
from ..model._attention import logits_of
from ..model._instance import Instance, require_unmasked
from ..model._losses import LossLike, get_loss
from ..model._tensor import svm_constraints, svm_rows
from ..scaling import FLOAT_TINY, LOG_FLOAT_MAX, pow2_split, range_error
from ._prompt import (
    core_direction,
    core_grad,
    core_risk,
    effective_weights,
    is_stationary_error,
    put_back,
    row_mantissas,
    scaled_alpha,
    scaled_core,
    solve_min_norm_rows_or_raise,
    values_mantissa,
)

__all__ = [
    "check_p_norm",
    "dual_exponent",
    "mirror_map",
    "inverse_mirror_map",
    "lp_norm",
    "bregman_divergence",
    "LpSVMSolution",
    "solve_lp_svm",
    "MirrorRecord",
    "MirrorTrajectory",
    "run_mirror_descent",
]


#: A constraint of the ℓp-SVM is active when its margin is within this of 1. The polished
#: solution satisfies the active equations to ~1e-13; before polishing, Clarabel's margins are
#: accurate to ~1e-8, so 1e-6 separates active from inactive rows (generic slacks are O(1)).
LP_SUPPORT_TOL = 1e-6

#: Newton on the active-set KKT equations stops when ``max|A_S W − 1| ≤`` this (a few hundred eps).
NEWTON_TOL = 1e-13

#: The active-set Newton solver's step budget (:func:`_newton_active`). Its equations are homogeneous
#: of degree 1 in the multipliers, so a start far off costs O(1) steps, not O(log of the distance):
#: one step per active set when the rows touch disjoint columns of W (any p, multipliers 20 decades
#: apart); measured on 300 random coupled instances (p ∈ [1.1, 8], inputs 0–8 decades apart in size)
#: at most 9 steps with inputs of one size, 56 with sizes 4–8 decades apart. 100 is the cut-off.
NEWTON_MAX_STEPS = 100


# ==================================================================== the mirror map
def check_p_norm(p_norm: Any) -> float:
    """Validate the exponent ``p``: a finite real number ``> 1`` (returns it as float).

    ``p ≤ 1`` makes ``ψ`` non-strictly-convex or non-differentiable, so the mirror map is not
    invertible: an :class:`AttnSVMError`.
    """
    try:
        val = float(p_norm)
    except (TypeError, ValueError):
        raise AttnSVMError(f"p_norm must be a real number > 1; got {p_norm!r}") from None
    if isinstance(p_norm, bool) or not math.isfinite(val) or val <= 1.0:
        raise AttnSVMError(
            f"p_norm must be a finite number > 1 (ψ = (1/p)Σ|W_ij|^p needs p > 1 for an invertible "
            f"mirror map); got {p_norm!r}"
        )
    return val


def dual_exponent(p_norm: float) -> float:
    """``q = p/(p−1)``, the dual exponent (``1/p + 1/q = 1``)."""
    p = check_p_norm(p_norm)
    return p / (p - 1.0)


def _signed_pow(U: FloatArray, e: float) -> FloatArray:
    return np.sign(U) * np.abs(U) ** e


_LN2 = math.log(2.0)


def _overflow_log(log_value: float) -> float:
    """``log_value`` kept strictly above ``LOG_FLOAT_MAX``, for an image already known to overflow.

    An image that rounds to ``inf`` may have a logarithm that rounds to ``LOG_FLOAT_MAX`` itself
    (``2·log 2^512 = log(1.8e308)`` in float64); :func:`~attnsvm.scaling.range_error` would then call
    it an underflow. The size it reports is unchanged (``1e+308``).
    """
    return max(log_value, math.nextafter(LOG_FLOAT_MAX, math.inf))


def _checked_signed_pow(U: FloatArray, e: float, what: str) -> FloatArray:
    """``sign(U)|U|^e`` entrywise, refused when a nonzero entry's image is not a normal double.

    Decided from the computed image itself (``pow`` is accurate to an ulp, so it is ``inf`` exactly
    when the image rounds past the largest double, subnormal or 0 exactly when it falls below the
    normal range): an overflow is refused with the largest ``e·log|U_ij|``, an underflow with the
    smallest, never an Inf, a 0 or a subnormal with lost digits.
    """
    nz = U != 0
    with np.errstate(over="ignore", under="ignore"):
        out = _signed_pow(U, e)
    mag = np.abs(out[nz])
    if mag.size == 0:
        return out
    overflow = not bool(np.all(np.isfinite(mag)))
    if overflow or float(np.min(mag)) < FLOAT_TINY:
        with np.errstate(over="ignore", under="ignore"):  # e·log|U| may leave float64 for extreme p
            logs = e * np.log(np.abs(U[nz]))
        if overflow:
            raise range_error(f"an entry of {what}", _overflow_log(float(np.max(logs))))
        raise range_error(f"an entry of {what}", float(np.min(logs)))
    return out


def mirror_map(W: ArrayLike, p_norm: float) -> FloatArray:
    """``∇ψ(W) = sign(W) ⊙ |W|^{p−1}``, entrywise.

    Scale: homogeneous of degree ``p − 1``; every entry to a few ulps relative (``pow``); raises
    :class:`NumericalError` when a nonzero entry's image ``|W_ij|^{p−1}`` is not a normal double
    (an overflow reports the largest image's size, an underflow the smallest's).

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581.
    """
    p = check_p_norm(p_norm)
    return _checked_signed_pow(as_real_array(W, "W"), p - 1.0, "the mirror map ∇ψ(W) = sign(W)|W|^(p−1)")


def inverse_mirror_map(U: ArrayLike, p_norm: float) -> FloatArray:
    """``(∇ψ)^{-1}(U) = sign(U) ⊙ |U|^{1/(p−1)} = sign(U) ⊙ |U|^{q−1}``, entrywise.

    Scale: homogeneous of degree ``1/(p − 1)``; every entry to a few ulps relative; raises
    :class:`NumericalError` when a nonzero entry's image is not a normal double (an overflow
    reports the largest image's size, an underflow the smallest's).

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581.
    """
    p = check_p_norm(p_norm)
    return _checked_signed_pow(
        as_real_array(U, "U"), 1.0 / (p - 1.0), "the inverse mirror map sign(U)|U|^(1/(p−1))"
    )


def _lp_norm(Wa: FloatArray, p: float) -> tuple[float, int]:
    """``||W||_p = m·2^e`` as ``(m, e)``, ``m ∈ [½, N^{1/p})`` for ``N`` entries, for any ``p > 1``.

    ``||W||_p = 2^e·b·(Σ(|m_ij|/b)^p)^{1/p}`` with ``m = W·2^−e`` the power-of-two mantissa and
    ``b = max|m| ∈ [½, 1)``: the largest term is exactly ``1``, so the sum lies in ``[1, N]`` and
    nothing over- or underflows whatever ``p``; terms below ``2^−1074`` drop out (relative size
    ``< 2^−1074``, far below eps). Rounding: each ratio's ``ε/2`` becomes ``pε/2`` in its power and
    ``ε/2`` again after the ``1/p``-th root, so ``m`` is within ``(2 + log₂N/p)`` ulps or so.
    """
    Ws, e = pow2_split(Wa)
    big = float(np.max(np.abs(Ws), initial=0.0))
    if big == 0.0:
        return 0.0, 0
    with np.errstate(under="ignore"):
        # Stable form: b·(Σ(|m|/b)^p)^{1/p}, not (Σ|m|^p)^{1/p}, whose largest term |m|^p ≥ 2^−p
        # underflows (to a silent 0 for p > 1075, digits lost from p > 1022).
        total = float(np.sum((np.abs(Ws) / big) ** p))
    return big * total ** (1.0 / p), e


def lp_norm(W: ArrayLike, p_norm: float) -> float:
    """Entrywise ``||W||_p = (Σ|W_ij|^p)^{1/p}``, computed on a power-of-two mantissa of ``W``.

    Scale: homogeneous of degree 1 (``||cW||_p = c||W||_p``); any finite ``W`` and any ``p > 1``
    (the largest entry is divided out before the power); relative error ≲ ``(3 + log₂N/(2p))·eps``
    for ``N`` entries; raises :class:`NumericalError` when the norm of a nonzero ``W`` is not a normal
    double.
    """
    p = check_p_norm(p_norm)
    m, e = _lp_norm(as_real_array(W, "W"), p)
    if m == 0.0:
        return 0.0
    return float(put_back(np.array([m]), e, "the ℓp norm ||W||_p")[0])


def _unit_lp(W: FloatArray, p: float, name: str) -> FloatArray:
    m, e = _lp_norm(W, p)
    if not m > 0:
        raise AttnSVMError(f"{name} is zero; it has no direction")
    return np.ldexp(W, -e) / m  # W/||W||_p without forming ||W||_p (exact power-of-two step)


def bregman_divergence(reference: ArrayLike, W: ArrayLike, p_norm: float) -> float:
    """Bregman divergence ``D_ψ(a, b)`` between the ℓp-unit directions of ``reference`` and ``W``.

    ``a = reference/||reference||_p``, ``b = W/||W||_p``,
    ``D_ψ(a, b) = (1/p)||a||_p^p + ((p−1)/p)||b||_p^p − ⟨sign(b)|b|^{p−1}, a⟩ ≥ 0``; ``= 1 − cos``
    for ``p = 2``. Summed entrywise over the nonnegative terms
    ``(1/p)|a|^p + ((p−1)/p)|b|^p − sign(b)|b|^{p−1}a`` (Young), so the total never goes negative;
    its absolute accuracy is ~1e-16 per entry.

    Scale: any finite nonzero arrays (scale-invariant in each argument; the unit directions come
    from power-of-two mantissas, so no norm over/underflows); absolute accuracy ~1e-16 per entry.

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (convergence metric).

    Args:
      reference: e.g. the ℓp-SVM solution, any shape.
      W: the iterate, same shape.
      p_norm: ``p > 1``.

    Returns:
      ``D_ψ(a, b)`` in ``[0, ∞)``.
    """
    p = check_p_norm(p_norm)
    A = as_real_array(reference, "reference")
    B = as_real_array(W, "W")
    if A.shape != B.shape:
        raise AttnSVMError(f"reference and W must have the same shape; got {A.shape} and {B.shape}")
    a, b = _unit_lp(A, p, "reference"), _unit_lp(B, p, "W")
    with np.errstate(under="ignore"):  # terms below 2^−1074 are 0 to the stated absolute accuracy
        terms = np.abs(a) ** p / p + (p - 1.0) / p * np.abs(b) ** p - _signed_pow(b, p - 1.0) * a
    return float(np.sum(np.maximum(terms, 0.0)))  # each term ≥ 0 exactly; clip rounding


# ====================================================================== ℓp-SVM
@dataclass(frozen=True)
class LpSVMSolution:
    """Solution of the ℓp-Att-SVM ``min ||W||_p s.t. (x_iα_i − x_it)ᵀ W z_i ≥ 1``.

    Attributes:
      W: the solution, shape ``(d, d)``, feasible (min margin ≥ 1 after rescaling).
      alpha: token choice, shape ``(n,)``.
      p_norm: ``p``.
      objective: ``||W||_p``.
      lower_bound: ``1ᵀμ / ||Aᵀμ||_q`` from the multipliers (a certified lower bound on the optimum).
      gap: ``(objective − lower_bound)/objective`` (relative suboptimality bound).
      min_margin: smallest constraint value: 1 up to rounding (≥ 1 − 4·eps; the rescale by the smallest margin
        leaves it within a few ulps of 1).
      duals: multipliers ``μ ≥ 0`` with ``∇ψ(W) = Σ μ_r a_r`` at the optimum, aligned with ``svm_rows``.
      support: active constraints ``(i, t)`` (margin within ``LP_SUPPORT_TOL`` of 1).
      polished: the Newton active-set step succeeded (else the rescaled conic solution is returned).
      status: cvxpy status of the conic solve (``"optimal"``).
    """

    W: FloatArray
    alpha: NDArray[np.intp]
    p_norm: float
    objective: float
    lower_bound: float
    gap: float
    min_margin: float
    duals: FloatArray
    support: list[tuple[int, int]]
    polished: bool
    status: str


def _newton_active(
    AS: FloatArray, p: float, mu0: FloatArray, max_iter: int = NEWTON_MAX_STEPS
) -> tuple[FloatArray, FloatArray] | None:
    """Solve ``A_S (∇ψ)^{-1}(A_Sᵀμ) = 1`` for ``μ`` by damped Newton on ``h(margins) = 1``; ``None`` if it fails.

    The margins ``g(μ) = A_S w(μ)``, ``w(μ) = sign(u)|u|^{q−1}``, ``u = A_Sᵀμ``, are homogeneous of
    degree ``q − 1`` in ``μ``. Newton runs on the equivalent equations

        G(μ) = h(g(μ)) − 1 = 0,    h(t) = sign(t)|t|^{p−1}    (increasing, h(1) = 1: same roots),

    which are homogeneous of degree 1: a row whose columns of ``W`` no other row touches has
    ``G_k = c_k μ_k − 1`` and is solved in one step from any ``μ_k > 0``, however many decades off.
    (Newton on ``g − 1`` itself shrinks a too-large ``μ_k`` by only a factor ``1 − (p − 1)`` per
    step: 10 % at ``p = 1.1``, hundreds of steps for a start 10⁵× too large.)

    (``h(g(μ)) = c_k μ_k`` for either sign of ``μ_k``, as ``h`` and ``w`` are odd.)

    Step: ``J Δ = −ρ`` with ``J = ∂g/∂μ = A_S diag((q−1)|u|^{q−2}) A_Sᵀ`` and
    ``ρ_k = G_k/h'(g_k) = (q−1)(g_k − |g_k|^{2−p})`` (Newton on ``G``); at ``g_k = 0``, where ``h'`` is
    0 or ∞, ``ρ_k = g_k − 1`` (Newton on the margin itself). Either way ``ρ_k = s_k G_k`` with
    ``s_k > 0`` (``h`` increasing), so ``Δ`` is a descent direction of ``||G||``. By Euler's identity
    ``J μ = (q−1) g`` the full step is ``μ⁺ = J^{-1} b``, ``b_k = (q−1)|g_k|^{2−p}`` (1 where ``g_k = 0``),
    solved for directly; the trial point ``μ + t(μ⁺ − μ)`` is halved until ``||G||`` decreases (at
    most 27 times, to ``t ≈ 1e-8``). ``J`` is solved after the symmetric diagonal scaling
    ``D^{−½} J D^{−½}`` (``D = diag J``): unit diagonal whatever the multipliers' sizes.

    Returns ``(μ, w(μ))`` once ``max|g(μ) − 1| ≤ NEWTON_TOL`` (checked before the first step and after
    each of at most ``max_iter`` steps); ``None`` when the budget runs out, the line search fails,
    ``J`` is singular, or the map is not differentiable at an entry ``u = 0`` (``q < 2``).
    """
    e = 1.0 / (p - 1.0)  # q − 1
    mu = np.array(mu0, dtype=np.float64)

    def margins(m: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, float]:
        u = AS.T @ m
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # far from the root: inf/nan
            w = _signed_pow(u, e)
            g = AS @ w
            merit = float(np.linalg.norm(_signed_pow(g, p - 1.0) - 1.0))  # ||G(μ)||, h(g) = sign(g)|g|^{p−1}
        return g, u, w, merit if math.isfinite(merit) else math.inf

    def converged(g: FloatArray) -> bool:
        return bool(float(np.max(np.abs(g - 1.0))) <= NEWTON_TOL)

    g, u, w, merit = margins(mu)
    for step in range(max_iter + 1):
        if converged(g):
            return mu, w
        if step == max_iter or not np.all(np.isfinite(g)):
            return None
        with np.errstate(divide="ignore", over="ignore", under="ignore"):
            dw = e * np.abs(u) ** (e - 1.0)  # d/du sign(u)|u|^e = e|u|^{e−1}
        if not np.all(np.isfinite(dw)):
            return None  # an entry u = 0 with q < 2: the map is not differentiable there
        J = (AS * dw) @ AS.T
        # The Newton iterate μ⁺ = μ + Δ in closed form: Euler's identity J μ = (q−1) g (g is homogeneous
        # of degree q − 1) turns J Δ = −ρ into J μ⁺ = (q−1) g − ρ = (q−1)|g|^{2−p} (1 where g = 0), so
        # μ⁺ is solved for directly, not as μ + Δ, which cancels to 0 when μ⁺ is many binades below μ.
        b = np.ones_like(g)
        nz = g != 0
        with np.errstate(over="ignore", under="ignore"):
            b[nz] = e * np.abs(g[nz]) ** (2.0 - p)
        scale = np.sqrt(np.diag(J))
        if not (np.all(np.isfinite(b)) and np.all(np.isfinite(J)) and np.all(scale > 0)):
            return None
        try:
            # Symmetric diagonal scaling: the scaled J has a unit diagonal whatever the multipliers' sizes.
            target = np.linalg.solve(J / np.outer(scale, scale), b / scale) / scale
        except np.linalg.LinAlgError:
            return None
        t, trial = 1.0, target
        while t > 1e-8:
            gn, un, wn, mn = margins(trial)
            if mn < merit or converged(gn):
                break
            t *= 0.5
            trial = (1.0 - t) * mu + t * target  # damped: μ + t(μ⁺ − μ)
        else:
            return None
        mu, g, u, w, merit = trial, gn, un, wn, mn
    return None  # pragma: no cover  (the loop returns at step == max_iter)


def solve_lp_svm(inst: Instance, p_norm: float, alpha: ArrayLike | None = None) -> LpSVMSolution:
    """Solve the ℓp-Att-SVM ``W_p = argmin (Σ|W_ij|^p)^{1/p} s.t. (x_iα_i − x_it)ᵀ W z_i ≥ 1``.

    cvxpy (``pnorm``, Clarabel; any status other than ``optimal`` raises :class:`SolverError`),
    feasibility restored by ``W / min(1, min margin)``, then the Newton active-set polish and the
    Hölder duality-gap certificate described in the module docstring. Solved on a power-of-two
    mantissa of the rows: ``W_p(cX, cz) = W_p(X, z)/c²``, multipliers ``/c^{2p}``. When Clarabel reports
    infeasibility, or fails otherwise on rows at least :data:`LP_RETRY_SPREAD_BITS` binades apart,
    feasibility is decided exactly (the certified ℓ2 min-norm solver on per-row mantissas; it does not
    depend on the norm), and a feasible problem (rows far apart in size: Clarabel's tolerance) is re-posed
    on equilibrated rows ``rows_r·w' ≥ 2^{R₀−R_r}`` and polished and certified as above.

    Scale: any finite data; polished, ``W`` and ``μ`` to ~1e-13 (the Newton polish converges in a
    step or two per active set even with multipliers 20 decades apart, p ≤ 2); unpolished, Clarabel's
    answer with its certificate ``gap`` (≲ 1e-8 when the multipliers are within a few decades; up to
    ~1e-5 measured when they are 8+ decades apart and p > 2, where a column of ``W`` untouched by the
    starting active set stops the polish); rows any distance apart up to ~1000 binades (their equilibrated
    form must be doubles), beyond that :class:`SolverError` naming the spread (never a false
    :class:`InfeasibleSVMError`); unpolished with rows far apart, ``W`` is right normwise (``gap``) but an
    entry far below the largest, and the support of rows far larger than the binding ones, may be unresolved;
    raises :class:`NumericalError` when ``max|W_p|``, the objective or the largest multiplier is not a
    normal double.

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (ℓp-Att-SVM).

    Args:
      inst: the data.
      p_norm: ``p > 1``.
      alpha: token choice, shape ``(n,)``; ``None`` → the optimal tokens.

    Returns:
      :class:`LpSVMSolution` (``.W``, objective, lower bound, gap, multipliers, support).

    Raises:
      InfeasibleSVMError: the constraints cannot be met (Clarabel reports infeasibility and the exact ℓ2
        check confirms it with a Farkas certificate).
      SolverError: any other non-optimal status (on rows within ``LP_RETRY_SPREAD_BITS`` binades), or a
        feasible problem Clarabel fails on even equilibrated (naming the rows' spread).
    """
    require_unmasked(inst, "attnsvm.peers.solve_lp_svm")
    require("cvxpy", feature="solve_lp_svm")  # pragma: no mutate
    import cvxpy as cp

    p = check_p_norm(p_norm)
    q = p / (p - 1.0)
    # Scale: solved on the row mantissa. With X = 2^ex·X', z = 2^ez·z' and rows A = 2^E·A'
    # (E = ex + ez + ea), the solution is W = 2^−E·W' and the multipliers μ = 2^−Ep·μ'
    # (∇ψ is homogeneous of degree p − 1), so the conic solver and Newton see O(1) data.
    Xs, ex = pow2_split(inst.X)
    zs, ez = pow2_split(inst.z)
    vs, _ = pow2_split(inst.v)
    inst_s = Instance(Xs, inst.Y, vs, zs)
    c = svm_constraints(inst_s, scaled_alpha(inst, alpha))
    A, ea = pow2_split(svm_rows(inst_s, c.alpha))  # (m, d²), row · vec(W) = Δᵀ W z  (column-major vec)
    E = ex + ez + ea
    m, D = A.shape
    d = inst.d
    w = cp.Variable(D)
    cons = [A @ w >= 1]
    prob = cp.Problem(cp.Minimize(cp.pnorm(w, p)), cons)  # type: ignore[arg-type]
    failure: cp.error.SolverError | None = None
    try:
        prob.solve(solver=cp.CLARABEL)
        status = str(prob.status)
    except cp.error.SolverError as exc:
        status, failure = "failed", exc
    infeasible = status in ("infeasible", "infeasible_inaccurate")
    if infeasible or status != "optimal" or w.value is None:
        # An infeasibility verdict is decided exactly; it, or any failure on rows far apart in size, is re-posed
        # on equilibrated rows (A and E with it). Other failures are refused as Clarabel's.
        far = _far_rows(inst, c.alpha, c.pairs)
        if not infeasible and far.spread < LP_RETRY_SPREAD_BITS:
            if failure is not None:
                raise SolverError(f"Clarabel failed on the ℓp-SVM (p = {p}): {failure}") from failure
            raise SolverError(
                f"Clarabel returned status {status!r} on the ℓp-SVM (p = {p}); the solution is not certified"
            )
        verdict = (
            f"called the ℓp-Att-SVM (p = {p}) infeasible"
            if infeasible
            else f"failed on the ℓp-Att-SVM (p = {p}) ({failure})"
            if failure is not None
            else f"returned status {status!r} on the ℓp-Att-SVM (p = {p})"
        )
        A, E, wv, dual0, status = _solve_far_apart(far, c.alpha, c.pairs, p, verdict)
    else:
        wv = np.asarray(w.value, dtype=np.float64)
        dual0 = np.asarray(cons[0].dual_value, dtype=np.float64).reshape(-1)
    marg = A @ wv
    mmin = float(marg.min())
    if not mmin > 0:
        raise SolverError(
            f"the ℓp-SVM solution has a non-positive margin {mmin:.3g}; cannot restore feasibility"
        )
    wv = wv / min(1.0, mmin)  # restore feasibility: every margin ≥ 1
    marg = A @ wv
    polished = False
    mu = np.zeros(m)
    # Multipliers of the (1/p)||w||_p^p form: ∇ψ(w) = Aᵀμ; cvxpy's duals are for ||w||_p, which
    # rescales them by ||w||_p^{p−1}.
    mu_conic = np.maximum(dual0, 0.0) * lp_norm(wv, p) ** (p - 1.0)
    # Active set: small slack or a multiplier that is not negligible (the conic solver's margins
    # are only accurate to ~1e-6 here), then corrected: violated rows join, negative μ leave.
    in_S = (marg <= 1.0 + LP_SUPPORT_TOL) | (mu_conic > 1e-6 * max(float(mu_conic.max(initial=0.0)), 1e-300))
    for _ in range(2 * m):
        S = np.flatnonzero(in_S)
        if not S.size:
            break
        res = _newton_active(A[S], p, np.maximum(mu_conic[S], 1e-3 * float(mu_conic.max(initial=1.0))))
        if res is None:
            break
        muS, wS = res
        margS = A @ wS
        viol = ~in_S & (margS < 1.0 - NEWTON_TOL)
        if np.all(muS > 0) and not viol.any():
            wv, polished = wS, True
            mu[S] = muS
            break
        if (muS <= 0).any():
            in_S[S[int(np.argmin(muS))]] = False
        else:
            in_S[int(np.argmin(np.where(viol, margS, np.inf)))] = True
    if not polished:
        mu = mu_conic
    marg = A @ wv
    wv = wv / min(1.0, float(marg.min()))
    marg = A @ wv
    obj = lp_norm(wv, p)
    u = A.T @ mu
    lb = float(np.sum(mu)) / lp_norm(u, q) if np.any(u != 0) else 0.0
    S = np.flatnonzero(marg <= 1.0 + LP_SUPPORT_TOL)
    return LpSVMSolution(
        W=put_back(wv.reshape((d, d), order="F"), -E, "the ℓp-SVM solution W_p"),
        alpha=c.alpha,
        p_norm=p,
        objective=_put_back_real(np.array([obj]), -float(E), "the ℓp-SVM objective ||W_p||_p")[0],
        lower_bound=_put_back_real(np.array([lb]), -float(E), "the ℓp-SVM lower bound")[0],
        gap=(obj - lb) / obj,  # scale-invariant
        min_margin=float(marg.min()),  # scale-invariant
        duals=_put_back_real(mu, -E * p, "the ℓp-SVM multipliers μ"),
        support=[(int(i), int(t)) for i, t in c.pairs[S]],
        polished=polished,
        status=status,
    )


#: When Clarabel fails on the ℓp-SVM other than by calling it infeasible (an exception, ``user_limit``,
#: ``optimal_inaccurate``), it is re-posed on equilibrated rows only when the rows' exponents span at least this many
#: binades (rows 2^16 ≈ 6.6e4 apart and more: measured, Clarabel hit ``user_limit`` at rows 2^28 apart and called
#: rows 2^40 apart infeasible). Ordinary data of one scale have rows within a few binades: their failures keep
#: Clarabel's own message. (The re-posed solve is sound at any spread: feasibility decided exactly, the answer
#: polished and certified as any other; the threshold only decides when to try it.)
LP_RETRY_SPREAD_BITS = 16


class _FarRows(NamedTuple):
    """The ℓp-SVM rows ``a_r = 2^{R_r}·rows_r`` (per-row mantissas), and their exponents' spread in binades."""

    rows: FloatArray
    R: Int64Array
    spread: int


def _far_rows(inst: Instance, alpha: NDArray[np.intp], pairs: NDArray[np.intp]) -> _FarRows:
    """The rows ``z_i ⊗ (x_iα_i − x_it)`` of :func:`solve_lp_svm` (same order and ``vec``) as per-row mantissas
    (:func:`attnsvm.peers._multitoken._rows`: rows any number of binades apart keep their digits)."""
    from ._multitoken import _rows  # (a sibling module: imported here, not at the top, to keep the order)

    rows, R, _ = _rows(inst.X, inst.z, [(int(i), int(alpha[i]), int(t)) for i, t in pairs])
    live = R[np.any(rows != 0.0, axis=1)]
    return _FarRows(rows, R, int(np.max(live) - np.min(live)) if live.size else 0)


def _solve_far_apart(
    far: _FarRows, alpha: NDArray[np.intp], pairs: NDArray[np.intp], p: float, verdict: str
) -> tuple[FloatArray, int, FloatArray, FloatArray, str]:
    """Clarabel failed on the ℓp-SVM (``verdict``): decide feasibility exactly, and if feasible solve it on
    equilibrated rows.

    Feasibility of ``{W : (x_iα_i − x_it)ᵀ W z_i ≥ 1}`` does not depend on the norm, so it is decided by the
    certified ℓ2 min-norm solver on the same rows ``a_r = 2^{R_r}·rows_r`` (:func:`_far_rows`). Infeasible there
    (a Farkas certificate): :class:`InfeasibleSVMError`. Feasible: Clarabel's failure was its tolerance (~1e-8
    relative) on rows far apart in size. With ``W = 2^{−R₀}·w'`` (``R₀ = min R_r``) the constraints read

        rows_r·w' ≥ b_r = 2^{R₀−R_r} ∈ (0, 1]     ⇔     A'_r·w' ≥ 1,   A'_r = 2^{R_r−R₀}·rows_r,

    posed to Clarabel in the first form (unit rows; the far larger rows ask ``≥ ~0``), its multipliers ``y`` turned
    into those of the second (``y_r·b_r``: ``y_r(rows_r·w' − b_r) = y_r b_r(A'_r·w' − 1)``), which the caller
    polishes and certifies as any other answer. Returns ``(A', R₀, w', multipliers, status)``, i.e. what
    :func:`solve_lp_svm` continues with (its rows ``A`` at scale ``2^{−E}``, ``E = R₀``).

    Raises:
      InfeasibleSVMError: the ℓ2 solver's Farkas certificate.
      SolverError: feasible, but ``A'`` leaves float64 (rows over ~1000 binades apart) or Clarabel fails on the
        equilibrated rows too; names the rows' spread in binades.
    """
    import cvxpy as cp

    rows, R, spread = far
    try:
        solve_min_norm_rows_or_raise(rows, R, np.ones(len(rows)), pairs, f"ℓp-Att-SVM (p = {p})")
    except InfeasibleSVMError as exc:
        raise InfeasibleSVMError(
            f"the ℓp-Att-SVM (p = {p}) is infeasible for alpha = {alpha.tolist()}: no W separates the "
            "selected tokens with margin 1 (check for a token equal to the selected one or a zero query)"
        ) from exc
    R0 = int(np.min(R[np.any(rows != 0.0, axis=1)]))  # a zero row would have been infeasible

    def far_apart(why: str) -> SolverError:
        return SolverError(
            f"Clarabel {verdict} for alpha = {alpha.tolist()}, but it is feasible "
            "(the certified ℓ2 min-norm solver meets every constraint on the same rows, feasibility not depending "
            f"on the norm): its constraint rows z_i ⊗ (x_iα_i − x_it) are about {spread} binades apart in size, "
            f"and {why}. Bring the sequences' tokens and queries closer in size, or for p = 2 use "
            "attnsvm.solve_svm (certified at any spread of the rows)."
        )

    with np.errstate(over="ignore"):
        Ap = np.ldexp(rows, (R - R0)[:, None])
    if not np.all(np.isfinite(Ap)):
        raise far_apart("the largest, relative to the smallest, leave float64's range")
    with np.errstate(under="ignore"):
        b = np.ldexp(1.0, R0 - R)
    w = cp.Variable(rows.shape[1])
    cons = [rows @ w >= b]
    prob = cp.Problem(cp.Minimize(cp.pnorm(w, p)), cons)  # type: ignore[arg-type]
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise far_apart(f"Clarabel failed on them equilibrated ({exc})") from exc
    status = str(prob.status)
    if status != "optimal" or w.value is None:
        raise far_apart(f"Clarabel returned status {status!r} on them equilibrated")
    y = np.asarray(cons[0].dual_value, dtype=np.float64).reshape(-1)
    return Ap, R0, np.asarray(w.value, dtype=np.float64), y * b, status


def _put_back_real(m: FloatArray, log2_scale: float, what: str) -> FloatArray:
    """``m·2^{log2_scale}`` for a real exponent (integer part by ``ldexp``, exact; the fraction by one
    multiplication), refused as :func:`attnsvm.peers._prompt.put_back`."""
    k = math.floor(log2_scale)
    return put_back(np.asarray(m, dtype=np.float64) * 2.0 ** (log2_scale - k), k, what)


# ===================================================== the dual state, exact at any size

#: :func:`run_mirror_descent` needs ``p − 1 ∈ [2^−ENGINE_P_BITS, 2^ENGINE_P_BITS]`` (``p ∈ [1.002, 513]``):
#: the limit comes from the exact dual state, not from :func:`lp_norm` (exact at any ``p`` since it
#: works on the largest entry's ratio powers): in :func:`_split_pow` ``|m|^e ∈ [2^−512, 1]`` for both
#: powers ``e = p − 1`` and ``1/(p − 1)``, while
#: every exponent ``|E|`` of the dual state stays below ``2^21`` (``≤ 1075·2^9`` for ``|W_0|^{p−1}``,
#: ``≤ 2^12`` for a sum of steps ``η g`` each below ``2^2048``), so ``|E·e| < 2^30`` and
#: :func:`_exponent_product` is exact.
ENGINE_P_BITS = 9
#: Veltkamp's splitting constant ``2^27 + 1`` (float64: 53 = 26 + 27 bits).
_VELTKAMP = 2.0**27 + 1.0


def _frexp64(a: FloatArray) -> tuple[FloatArray, Int64Array]:
    """``a = f·2^k`` entrywise, ``|f| ∈ [½, 1)`` (``f = 0``, ``k = 0`` for a zero), ``k`` as int64."""
    f, k = np.frexp(a)
    return f, k.astype(np.int64)


def _exponent_product(E: Int64Array, e: float) -> tuple[FloatArray, FloatArray]:
    """``E·e = hi + lo`` exactly, for integers ``|E| < 2^26`` (here ``< 2^21``: :data:`ENGINE_P_BITS`).

    Veltkamp's splitting ``e = e1 + e2`` (``e1`` with 26 significant bits, ``e2`` with 27) makes both
    ``E·e1`` and ``E·e2`` exact doubles (``≤ 26 + 27`` bits): no rounding in the product.
    """
    c = _VELTKAMP * e
    e1 = c - (c - e)
    a = E.astype(np.float64)
    return a * e1, a * (e - e1)


def _split_pow(m: FloatArray, E: Int64Array, e: float) -> tuple[FloatArray, Int64Array]:
    """``sign(m)·|m·2^E|^e`` entrywise as ``(mantissa, exponent)`` in ``frexp`` form, at any size.

    With ``|m| ∈ [½, 1)`` (``frexp`` form),

        |m·2^E|^e = |m|^e · 2^{E·e},   E·e = hi + lo exactly,   2^{E·e} = 2^{(hi − K) + lo} · 2^K,

    ``K = ⌊hi + lo⌋``, where ``hi − K`` is exact and ``|m|^e ∈ [2^−512, 1]`` (``e ≤ 2^9``: :data:`ENGINE_P_BITS`), so no
    intermediate leaves the normal range, whatever the size of the power. Relative error: ``pow``,
    ``exp2`` of an argument in ``[−¼, 1¼]`` and one product, a few ulps; exact for ``e = 1``
    (``p = 2``: ``W = U``). A zero entry stays ``(0, 0)``.
    """
    f, k = np.zeros(m.shape), np.zeros(m.shape, dtype=np.int64)
    nz = m != 0
    hi, lo = _exponent_product(E[nz], e)
    # K: any integer near E·e; hi − K is then exact (|hi| < 2^30) and (hi − K) + lo ∈ [−ε, 1 + ε].
    K = np.floor(hi + lo)
    fm, km = _frexp64(np.abs(m[nz]) ** e * np.exp2((hi - K) + lo))
    f[nz], k[nz] = np.sign(m[nz]) * fm, K.astype(np.int64) + km
    return f, k


def _split_step(Um: FloatArray, Ue: Int64Array, lr: float, g: FloatArray) -> tuple[FloatArray, Int64Array]:
    """``U − lr·g`` for ``U = Um·2^Ue`` (entrywise), as ``(mantissa, exponent)`` in ``frexp`` form.

    ``lr·g = (lm·gm)·2^{le+ge}`` (one rounding, as in float64); each entry's two terms are aligned at
    its larger exponent. The shift is exact unless the smaller term falls below ``2^−1074`` there,
    where it is below half an ulp of the larger and the rounded difference is the same: every entry
    is ``fl(U − fl(lr·g))``, the float64 update without its range limits (no Inf, no NaN).
    """
    lm, le = math.frexp(lr)
    gm, ge = _frexp64(g)
    pm, pe = lm * gm, ge + le
    k = np.where(Um == 0, pe, np.where(pm == 0, Ue, np.maximum(Ue, pe)))
    with np.errstate(under="ignore"):  # a term far below the other: flushed below half an ulp of it
        f, j = _frexp64(np.ldexp(Um, Ue - k) - np.ldexp(pm, pe - k))
    return f, np.where(f == 0, 0, k + j)


def _split_to_float(f: FloatArray, k: Int64Array, what: str, *, remedy: str = "") -> FloatArray:
    """``f·2^k`` (``frexp`` form) as doubles when its largest entry is a normal double (or all are 0);
    else the range error naming ``what``. Decided on the integer exponents (``|f|·2^k ∈ [2^{k−1}, 2^k)``:
    normal iff ``−1021 ≤ k ≤ 1024``), so exactly; smaller entries keep an absolute error ``≤ 2^−1075``."""
    nz = f != 0
    if not np.any(nz):
        return np.zeros_like(f)
    top = int(np.max(k[nz]))
    if not -1021 <= top <= 1024:
        log_big = float(np.max(np.log(np.abs(f[nz])) + k[nz] * _LN2))
        raise range_error(what, _overflow_log(log_big) if top > 1024 else log_big, remedy=remedy)
    with np.errstate(under="ignore"):  # entries far below the largest: gradual underflow, absolute error
        return np.ldexp(f, k)


def _check_engine_p(p: float) -> None:
    if not 2.0**-ENGINE_P_BITS <= p - 1.0 <= 2.0**ENGINE_P_BITS:
        raise AttnSVMError(
            f"run_mirror_descent needs p_norm in [1 + 2^−{ENGINE_P_BITS}, 1 + 2^{ENGINE_P_BITS}] = "
            f"[{1.0 + 2.0**-ENGINE_P_BITS!r}, {1.0 + 2.0**ENGINE_P_BITS!r}] (p and q = p/(p−1) at most "
            f"{1.0 + 2.0**ENGINE_P_BITS:.0f} keep the powers of its norms and dual state in float64); "
            f"got p_norm = {p!r}"
        )


# ================================================================= mirror descent
def _selected_tokens(Xq: FloatArray, zq: FloatArray, W: FloatArray) -> NDArray[np.intp]:
    """``argmax_t x_itᵀ W z_i`` per sequence from per-sequence mantissas ``Xq``, ``zq`` and ``W``'s mantissa.

    Power-of-two scaling is exact, so the logits are those of the data times ``2^{k_i}`` (one per sequence)
    bit for bit, ties included, unless the data's own logits leave the range; a sequence whose logits are all
    ``2^−1074`` below another's keeps its digits (a shared exponent flushed them to 0, argmax then 0).
    """
    return np.argmax(logits_of(Xq, zq, pow2_split(W)[0]), axis=1).astype(np.intp)


class MirrorRecord(NamedTuple):
    """State at one recorded step: ``||W||_p``, risk, selected tokens, ``D_ψ(reference, W)``
    (NaN without a reference), ``log10||∇L||_F`` and a copy of ``W_t`` when iterates are kept."""

    step: int
    norm_p: float
    risk: float
    tokens: NDArray[np.intp]
    bregman: float
    log10_grad_norm: float
    W: FloatArray | None = None


@dataclass
class MirrorTrajectory:
    """Result of :func:`run_mirror_descent`: final ``W`` (shape ``(d, d)``), the dual state and the records.

    The dual iterate ``U = ∇ψ(W) = U_mantissa ⊙ 2^U_exponent`` (entrywise; ``frexp`` form, int64
    exponents) is exact at any size; ``|W|^{p−1}`` need not be a double (``p = 3``, ``|W| = 1e300``).
    """

    W: FloatArray
    U_mantissa: FloatArray
    U_exponent: Int64Array
    p_norm: float
    record: list[MirrorRecord] = field(default_factory=list)

    @property
    def U(self) -> FloatArray:
        """The dual iterate ``U = ∇ψ(W)`` as doubles.

        Scale: the largest entry must be a normal double (smaller ones to an absolute ``2^−1075``);
        otherwise :class:`NumericalError` (the exact state stays in ``U_mantissa``, ``U_exponent``).
        """
        return _split_to_float(
            self.U_mantissa,
            self.U_exponent,
            "the dual iterate U = ∇ψ(W)",
            remedy="Read the exact dual state from U_mantissa·2^U_exponent",
        )

    @property
    def bregman(self) -> FloatArray:
        """``D_ψ(reference, W_t)`` at the recorded steps."""
        return np.array([r.bregman for r in self.record])

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """``argmax_t s_it`` at the final step."""
        return self.record[-1].tokens


def run_mirror_descent(
    inst: Instance,
    p_norm: float,
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    loss: "str | LossLike" = "logistic",
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    keep_iterates: bool = False,
) -> MirrorTrajectory:
    """ℓp mirror descent ``∇ψ(W⁺) = ∇ψ(W) − η g`` on the attention risk.

    ``g = ∇L(W)`` (plain) or ``g = ∇L/||∇L||_q`` (normalized, ``q = p/(p−1)``); the dual iterate
    ``U = ∇ψ(W)`` is the state and ``W = sign(U)|U|^{q−1}``. For ``p = 2`` this is GD
    (normalized by the Frobenius norm).

    References: Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (ℓp-AttGD).

    Args:
      inst: the data.
      p_norm: ``p > 1`` (``p ≤ 1`` raises :class:`AttnSVMError`).
      steps, lr: updates (≥ 1) and step size (> 0).
      normalized: normalized (default) or plain.
      loss: loss name or object.
      W0: initial ``(d, d)`` iterate (default zeros).
      record_at: ``None`` (log-spaced), an interval, or a list of steps.
      reference: ``(d, d)`` direction (e.g. ``solve_lp_svm(...).W``) for the Bregman metric.
      keep_iterates: store a copy of ``W_t`` in each record.

    Scale: any finite data, ``W0`` and ``lr``; ``p − 1 ∈ [2^−9, 2^9]``, i.e. ``p ∈ [1.002, 513]``
    (else :class:`AttnSVMError`: :data:`ENGINE_P_BITS`).
    The dual state ``U`` is carried as mantissa ⊙ 2^exponent per entry, so ``U − η g`` is the float64
    update without range limits (``U`` may be 1e600 while ``W`` is a double) and each entry of ``W_t``
    is ``sign(U)|U|^{q−1}`` of its own dual entry to a few ulps (exactly ``U`` for ``p = 2``); the
    normalized direction is scale-invariant (computed on power-of-two mantissas), so ``X → cX``,
    ``z → cz``, ``v → v/c``, ``lr → lr/c^{2(p−1)}`` gives ``W_t/c²``; entries of ``W`` below
    ``2^−1074`` flush (absolute accuracy). Raises :class:`NumericalError` naming the step when the
    largest entry of ``W_t`` is not a normal double, a plain gradient or a recorded risk is not
    representable, or the recorded gradient is refused (a record's ``log10||∇L||`` is ``−inf`` only
    at a stationary ``W``).

    Returns:
      :class:`MirrorTrajectory` with ``.W``.
    """
    require_unmasked(inst, "attnsvm.peers.run_mirror_descent")
    p = check_p_norm(p_norm)
    _check_engine_p(p)
    q = p / (p - 1.0)
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    W = np.zeros((inst.d, inst.d)) if W0 is None else np.array(inst.check_weights(W0, "W0"))
    ref = None if reference is None else inst.check_weights(reference, "reference")
    if ref is not None and not np.any(ref != 0):
        raise AttnSVMError("reference is the zero matrix; it has no direction")
    # The dual state U = ∇ψ(W) = sign(W)|W|^(p−1), entrywise as mantissa·2^exponent: a double U
    # overflowed or flushed to 0 wherever |W|^(p−1) leaves float64 while W itself is a double.
    Um, Ue = _split_pow(*_frexp64(W), p - 1.0)
    at = set(int(s) for s in record_steps(record_at, steps))
    # The gradient and its direction come from the core model on power-of-two rescaled data
    # (the direction is scale-invariant, the gradient put back by 2^(ex+ez+ea)).
    Xs, ex = pow2_split(inst.X)
    zs, ez = pow2_split(inst.z)
    As, ea = values_mantissa(inst.X, inst.v)
    sc = scaled_core(Xs, ex, zs, ez, As, ea, inst.Y, lo)
    # The recorded tokens from each sequence's own power-of-two mantissas (argmax is invariant under a positive
    # scale per sequence): the shared ones flushed the logits of a sequence ~2^−1074 below the largest to 0.
    n, T, d = inst.shape
    Xq = row_mantissas(inst.X.reshape(n, T * d))[0].reshape(n, T, d)
    zq = row_mantissas(inst.z)[0]
    rec: list[MirrorRecord] = []

    def record(t: int) -> None:
        try:
            We = effective_weights(sc, W, "W")  # inside: its refusal names the record's step too
            try:
                lg = core_direction(sc, We).log_norm / math.log(10.0)
            except NumericalError as exc:
                if not is_stationary_error(exc):
                    raise  # a range error or an undetermined ℓ': not a zero gradient
                lg = -math.inf
            rec.append(
                MirrorRecord(
                    t,
                    lp_norm(W, p),
                    core_risk(sc, W, "the risk L(W)"),
                    _selected_tokens(Xq, zq, W),
                    bregman_divergence(ref, W, p) if ref is not None and np.any(W != 0) else math.nan,
                    lg,
                    np.array(W) if keep_iterates else None,
                )
            )
        except NumericalError as exc:
            raise NumericalError(f"mirror descent, record at step {t}: {exc}") from exc

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        try:
            We = effective_weights(sc, W, "W")
            if normalized:
                Dn = core_direction(sc, We).direction
                g = Dn / lp_norm(Dn, q)  # ∇L/||∇L||_q = D/||D||_q: scale-free, exact after underflow
            else:
                g = core_grad(sc, We, "the risk gradient ∇L(W)")
        except NumericalError as exc:
            raise NumericalError(
                f"{'normalized ' if normalized else ''}mirror descent at step {t}: {exc}"
            ) from exc
        # U − η g in the split form (the naive U - lr*g overflowed to Inf and NaN), then
        # W = (∇ψ)^{-1}(U) = sign(U)|U|^(q−1) from it: refused when W's largest entry is not a normal
        # double (overflow, or an all-underflowed W that would read as 0).
        Um, Ue = _split_step(Um, Ue, lr, g)
        W = _split_to_float(
            *_split_pow(Um, Ue, 1.0 / (p - 1.0)),
            f"mirror descent at step {t}: the iterate W = (∇ψ)^(−1)(U)",
            remedy="Lower (overflow) or raise (underflow) lr, or rescale the data",
        )
        if t in at:
            record(t)
    return MirrorTrajectory(W=W, U_mantissa=Um, U_exponent=Ue, p_norm=p, record=rec)
