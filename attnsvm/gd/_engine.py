"""Gradient-descent engines that keep the direction: single runs, batches, regularization paths.

GD on softmax attention drives ``||W|| → ∞``; the claim under test is about the limit direction
``W/||W||`` (the Att-SVM solution ``W_mm``). The engines here follow that direction exactly for as
long as a user asks:

* :func:`run_gd` — one instance, float64 NumPy, plain GD ``W ← W − η∇L(W)`` or normalized GD
  ``W ← W − η∇L(W)/||∇L(W)||_F``. The normalized direction comes from the core's log-domain
  :func:`attnsvm.model._grad.normalized_risk_grad_of`, so it stays exact after ``∇L`` underflows
  (10⁶ steps, ``||W||`` ~ 10⁵); plain GD reports gradient underflow instead of stalling silently.
* :func:`run_gd_batch` — many equal-shaped instances in one torch float64 computation
  (CPU or CUDA), closed-form gradients, a linear-domain fast path while the weights are
  representable and the same cancellation-free, log-domain direction after (per instance);
  token masks as :func:`run_gd` (different masks per instance, masked and unmasked mixed).
* :func:`regularization_path` — warm-started projected normalized GD onto ``||W||_F ≤ R``.
* :func:`run_gd_kq` — GD on the factors of ``W = K Qᵀ``.
* :func:`direction_corr`, :func:`direction_gap`, :func:`fit_rate` — measuring the direction.

Scale (issue 13's contract): every engine computes on the data rescaled by exact powers of two
(``X' = X·2^−ex``, ``z' = z·2^−ez``, ``v' = v·2^ex``: the token values are unchanged; the logits of
``W`` are those of ``W' = W·2^(ex+ez)`` on ``X'``, ``z'``), while its iterate stays in the user's
scale. The data's magnitude alone therefore never overflows or underflows an intermediate; an
iterate, logit or token value that is itself not a normal double raises
:class:`~attnsvm.NumericalError` naming it and the range.

Data flow: gd takes a reference direction (e.g. ``attnsvm.svm._solve.solve_svm(inst).W``) as an
argument and never imports the SVM solvers.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (normalized GD, convergence
in direction, regularization path, ``W = KQᵀ`` and the nuclear-norm SVM); Tarzanagh, Li, Zhang,
Oymak, arXiv 2306.13596 (max-margin token selection).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._deps import require
from .._types import FloatArray
from .._validation import as_real_array, check_instance, check_int, check_positive, check_shape
from ..errors import AttnSVMError, InvalidInstanceError, NumericalError
from ..model._attention import logits_of
from ..model._grad import (
    CANCELLATION_FACTOR,
    CANCELLED_MESSAGE,
    NEGLIGIBLE_LOG,
    GradDirection,
    normalized_risk_grad_of,
    risk_of,
)
from ..model._instance import Instance, require_unmasked
from ..model._losses import Loss, LossLike, _logistic_derivative, correlation, get_loss, logistic
from ..scaling import (
    EPS as _EPS,
)
from ..scaling import (
    FLOAT_MAX,
    FLOAT_TINY,
    LOG_FLOAT_MAX,
    LOG_FLOAT_TINY,
    ldexp_scale,
    log10_of,
    pow2_exponent,
    range_error,
)

__all__ = [
    "GDRecord",
    "GDTrajectory",
    "BatchTrajectory",
    "PathPoint",
    "RegularizationPath",
    "KQTrajectory",
    "RateFit",
    "run_gd",
    "run_gd_batch",
    "run_gd_kq",
    "regularization_path",
    "direction_corr",
    "direction_gap",
    "fit_rate",
    "default_record_steps",
    "projected_path",
    "PathStep",
]


#: Smallest positive normal float64. A plain-GD gradient whose norm falls below it has lost
#: relative precision (subnormal) or underflowed to 0: the update is no longer ``η∇L``.
_TINY = float(np.finfo(np.float64).tiny)


# =================================================================== direction measures
def _unit(W: FloatArray) -> FloatArray:
    # Scale by the power of two of the largest entry before the norm: sqrt(Σ w²) overflows for
    # entries ≳ 1e154 and underflows for entries ≲ 1e-154; the scaled form is exact in both ranges,
    # and a power of two (not the entry itself) rounds nothing, so Ŵ is the same at every scale 2^j W.
    Ws = ldexp_scale(W, pow2_exponent(W))
    return Ws / float(np.sqrt(np.sum(Ws * Ws)))


def _fro(W: FloatArray) -> float:
    """``||W||_F`` without overflow or underflow of the squares (scaled by the largest entry)."""
    m = float(np.max(np.abs(W))) if W.size else 0.0
    if m == 0.0 or not math.isfinite(m):
        return m
    e = pow2_exponent(W)
    Ws = ldexp_scale(W, e)  # exact (a power of two): the norm is equivariant under W → 2^j W
    r = float(np.sqrt(np.sum(Ws * Ws)))  # in [½, d]
    if math.log(r) + e * _LN2 > LOG_FLOAT_MAX:  # entries near 1.8e308: the norm itself is no double
        raise range_error("the Frobenius norm ||W||_F of an iterate", math.log(r) + e * _LN2)
    return float(np.ldexp(r, e))


def _check_pair(W1: ArrayLike, W2: ArrayLike) -> tuple[FloatArray, FloatArray]:
    a = as_real_array(W1, "W1")
    b = as_real_array(W2, "W2")
    if a.shape != b.shape:
        raise InvalidInstanceError(f"W1 and W2 must have the same shape; got {a.shape} and {b.shape}")
    for name, M in (("W1", a), ("W2", b)):
        if M.size == 0 or not np.any(M != 0):
            raise InvalidInstanceError(
                f"{name} is the zero matrix (or empty); it has no direction. Pass a nonzero matrix."
            )
    return a, b


def direction_corr(W1: ArrayLike, W2: ArrayLike) -> float:
    """Direction correlation ``⟨W1, W2⟩ / (||W1||_F ||W2||_F)`` in ``[−1, 1]``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (the correlation plotted
    against ``W_mm``).

    Args:
      W1, W2: real finite nonzero arrays of the same shape (usually ``(d, d)``).

    Returns:
      The cosine of the angle between them. For ``1 − corr`` below ~1e-8 use
      :func:`direction_gap`, which does not cancel.

    Scale: any finite nonzero matrices (norms from the subnormal range to 1.8e308: each is scaled
    by a power of two before its norm, exactly); ``corr`` to absolute error ``≲ d²·eps``.
    """
    a, b = _check_pair(W1, W2)
    ua, ub = _unit(a), _unit(b)
    return float(np.clip(np.sum(ua * ub), -1.0, 1.0))


def direction_gap(W1: ArrayLike, W2: ArrayLike) -> float:
    """Direction gap ``½||Ŵ1 − Ŵ2||_F² = 1 − corr(W1, W2)``, accurate for tiny gaps.

    ``Ŵ = W/||W||_F``. Numerically stable form: ``1 − corr`` computed as a difference keeps only
    absolute accuracy ~1e-16 (a gap of 1e-11 would have 5 correct digits); the squared norm of
    the difference of the unit matrices has *relative* accuracy ~1e-16/||Ŵ1 − Ŵ2||.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Args:
      W1, W2: real finite nonzero arrays of the same shape.

    Returns:
      The gap in ``[0, 2]``.

    Scale: as :func:`direction_corr` (scale-free, exactly: ``gap(2^a W1, 2^b W2) = gap(W1, W2)``);
    relative error ``≲ d·eps/√gap``.
    """
    a, b = _check_pair(W1, W2)
    D = _unit(a) - _unit(b)  # stable: no 1 − cos cancellation
    return float(0.5 * np.sum(D * D))


class RateFit(NamedTuple):
    """Least-squares fit ``log10 gap ≈ slope · log10 x + intercept`` and its ``R²``."""

    slope: float
    intercept: float
    r2: float
    n_points: int


def fit_rate(x: ArrayLike, gap: ArrayLike) -> RateFit:
    """Fit the log-log rate ``gap ≈ 10^intercept · x^slope`` of a direction gap.

    ``gap`` is typically ``1 − corr(W_t, W_mm)`` (from :func:`direction_gap`) and ``x`` the
    steps ``t`` or the norms ``||W_t||``; e.g. a gap ``∝ 1/||W||²`` gives slope ``−2``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (rates of convergence in
    direction).

    Args:
      x: positive finite values, shape ``(k,)``, ``k ≥ 3``, not all equal.
      gap: positive finite values, shape ``(k,)``.

    Returns:
      :class:`RateFit` with the slope, intercept, coefficient of determination ``R²`` of the
      fit in log-log space (1 for points exactly on a line) and the number of points.

    Scale: any positive finite values (subnormal gaps keep only their remaining bits); a gap that
    underflowed to 0 is refused with :class:`~attnsvm.InvalidInstanceError`, never a NaN fit.
    """
    xa = as_real_array(x, "x", ndim=1)
    ga = as_real_array(gap, "gap", ndim=1)
    if xa.shape != ga.shape:
        raise InvalidInstanceError(f"x and gap must have the same length; got {xa.size} and {ga.size}")
    if xa.size < 3:
        raise InvalidInstanceError(f"fit_rate needs at least 3 points for a slope and its R²; got {xa.size}")
    for name, arr in (("x", xa), ("gap", ga)):
        if np.any(arr <= 0):
            i = int(np.flatnonzero(arr <= 0)[0])
            raise InvalidInstanceError(
                f"{name} must be positive for a log-log fit; {name}[{i}] = {float(arr[i])!r}. "
                "Drop zero gaps (direction already exact) or steps 0."
            )
    lx, lg = np.log10(xa), np.log10(ga)
    if np.ptp(lx) == 0:
        raise InvalidInstanceError("x values are all equal; the slope is undefined")
    A = np.stack([lx, np.ones_like(lx)], axis=1)
    coef = np.linalg.lstsq(A, lg, rcond=None)[0]
    resid = lg - A @ coef
    ss_tot = float(np.sum((lg - lg.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0
    return RateFit(float(coef[0]), float(coef[1]), r2, int(xa.size))


# ======================================================================== data scale
_LN2 = math.log(2.0)


class _Scaled(NamedTuple):
    """The instance's arrays rescaled by exact powers of two, and the scale of ``W``.

    ``X' = X·2^−ex``, ``z' = z·2^−ez`` (largest entries in ``[½, 1)``) and ``v' = v·2^ex`` (so the
    token values ``a = X'v' = Xv`` and the loss arguments are unchanged). The logits are then
    ``l = x'ᵀ W' z'`` with ``W' = W·2^k``, ``k = ex + ez``: GD on ``W`` is GD on ``W'`` with data of
    order one, and ``∇_W L = 2^k ∇_{W'} L``. Every engine computes on ``(X', z', v', W')``, so
    no intermediate (logits, ``x zᵀ``, ``Σ w x zᵀ``) overflows or underflows because of the data's
    scale alone. Entries of ``X``/``z`` more than ``2^1022`` below the largest round in ``X'``/``z'``
    (absolute error ≤ 2^−1075 against entries ≥ ½: invisible at float64 precision).
    """

    X: FloatArray
    Y: FloatArray
    z: FloatArray
    v: FloatArray
    k: int
    d: int
    #: the instance's token mask (``None``: every token takes part); ``X`` then has its masked tokens zeroed
    mask: NDArray[np.bool_] | None = None

    @property
    def mask_kw(self) -> dict[str, Any]:
        """``{"mask": mask}`` when there is one, else ``{}`` (the array forms' keyword, passed only then)."""
        return {} if self.mask is None else {"mask": self.mask}


def _rescale(inst: Instance) -> _Scaled:
    """:class:`_Scaled` of ``inst``; raises the contract's error when ``v·2^ex`` is not exact (the
    token values ``vᵀx_it`` leave the normal range)."""
    # Instance.keys: X with its masked tokens zeroed (X itself without a mask), so they set no scale
    ex, ez = pow2_exponent(inst.keys), pow2_exponent(inst.z)
    with np.errstate(over="ignore"):
        v2 = ldexp_scale(inst.v, -ex)
        exact = bool(np.all(np.isfinite(v2))) and bool(np.array_equal(ldexp_scale(v2, ex), inst.v))
    if not exact and np.all(np.isfinite(v2)):
        # Entries of v·2^ex below the normal range were rounded (to subnormals or 0), each by at most
        # 2^−1075. That is harmless where it moves no token value x'ᵀv' (|x'| ≤ 1) by more than the value's
        # own rounding, eps·Σ_k|x'_tk v'_k|: v = (1, 2e-182) with x ≈ 2e-182 has normal values although
        # v'_1 underflows. The test in units of 2^−1075: Σ_k|x'_tk|·[v'_k rounded] ≤ 2^1023·Σ_k|x'_tk v'_k|.
        Xs = np.abs(ldexp_scale(inst.keys, ex))
        with np.errstate(over="ignore"):
            back = ldexp_scale(v2, ex)
            moved = Xs @ (back != inst.v).astype(np.float64)
            exact = bool(np.all(moved <= (Xs @ np.abs(v2)) * 2.0**1023))
    if not exact:
        # v·2^ex overflowed or went subnormal: the values vᵀx_it (size ~ |v|·|X|) are not normal doubles.
        with np.errstate(over="ignore", invalid="ignore"):
            back = ldexp_scale(v2, ex)
        j = int(np.flatnonzero(~(back == inst.v))[0])  # the first entry that did not come back
        log_val = math.log(abs(float(inst.v[j]))) + ex * _LN2
        raise range_error(
            f"the token values vᵀx_it (|v_{j}| = {abs(float(inst.v[j])):.3g} times max|X| ≈ 2^{ex})",
            log_val,
            remedy="Rescale v or X so that the token values vᵀx_it are normal doubles",
        )
    return _Scaled(
        ldexp_scale(inst.keys, ex), inst.Y, ldexp_scale(inst.z, ez), v2, ex + ez, inst.d, inst.mask
    )


#: Largest ``max|W'|`` (``W' = W·2^k``, data entries ≤ 1) whose logits and their differences
#: stay finite: ``|l_it| ≤ d²·max|W'|`` and the log-domain forms subtract two logits.
def _pow2_factors(k: NDArray[np.int64]) -> list[FloatArray]:
    """Powers of two whose product is ``2^k`` (per entry), each a double, all of one sign of
    exponent (so ``W·f1·f2·f3`` rounds only when ``W·2^k`` itself is not normal); ``[]`` if ``k = 0``."""
    if not np.any(k):
        return []
    parts = 1 if np.max(np.abs(k)) <= 1000 else 3
    out, left = [], np.array(k, dtype=np.int64)
    for i in range(parts, 0, -1):
        ki = left // i if i > 1 else left
        out.append(np.ldexp(1.0, ki))
        left = left - ki
    return out


def _logit_bound(d: int) -> float:
    return FLOAT_MAX / (4.0 * d * d)


def _to_logit_scale(sc: _Scaled, W: FloatArray, what: str = "W") -> FloatArray:
    """``W' = W·2^k`` (exact while normal; entries that round below the normal range change the
    logits by < 2^−1070, nothing at float64 precision); raises when the logits would overflow."""
    m = float(np.max(np.abs(W), initial=0.0))
    if m > 0 and math.log(m) + sc.k * _LN2 > math.log(_logit_bound(sc.d)):
        quantity = (
            f"the logits x_itᵀ {what} z_i (up to d²·max|{what}|·max|X|·max|z| ≈ "
            f"{sc.d * sc.d}·{m:.3g}·2^{sc.k})"
        )
        log_l = math.log(sc.d * sc.d) + math.log(m) + sc.k * _LN2
        remedy = (
            "The softmax is one-hot far beyond float64 there; lower lr or the number of steps, "
            "or rescale the data (W·c on (X, z) is W on (√c·X, √c·z))"
        )
        if log_l > LOG_FLOAT_MAX:
            raise range_error(quantity, log_l, remedy=remedy)
        # Representable, but above the headroom the engines need (logit differences and the
        # gradient's sums would overflow): an overflow of that bound, not an underflow.
        raise NumericalError(
            f"{quantity} is about 1e{log10_of(log_l):+.0f}: above {_logit_bound(sc.d):.3g} = 1.8e308/(4d²), "
            f"the largest logits whose softmax and gradient float64 computes without overflow. {remedy}"
        )
    return np.ldexp(W, sc.k)


def _check_iterate(W: FloatArray, what: str) -> FloatArray:
    """An iterate must be 0 or have its largest entry a normal double (smaller entries then have
    absolute error ≤ 2^−1075 ≤ eps·max|W|: normwise exact); otherwise the contract's error."""
    m = float(np.max(np.abs(W), initial=0.0))
    if m == 0.0 or FLOAT_TINY <= m <= FLOAT_MAX:
        return W
    log_m = math.log(m) if math.isfinite(m) else math.inf
    raise range_error(
        what,
        log_m,
        remedy="Scale lr (and W0) with the data: X·2^a, z·2^b is the same problem in W·2^−(a+b)",
    )


# ============================================================================ checking


def _check_reference(inst: Instance, reference: ArrayLike | None) -> FloatArray | None:
    if reference is None:
        return None
    R = inst.check_weights(reference, "reference")
    if not np.any(R != 0):
        raise InvalidInstanceError("reference is the zero matrix; it has no direction")
    return R


def default_record_steps(steps: int, points: int = 25) -> NDArray[np.int64]:
    """Log-spaced record steps ``1 … steps`` (about ``points`` of them, always including both ends)."""
    steps = check_int(steps, "steps")
    grid = np.unique(np.round(np.logspace(0, math.log10(steps), points)).astype(np.int64))
    return np.unique(np.concatenate([grid, [steps]]))


def record_steps(record_at: int | Sequence[int] | ArrayLike | None, steps: int) -> NDArray[np.int64]:
    if record_at is None:
        return default_record_steps(steps)
    if isinstance(record_at, (int, np.integer)) and not isinstance(record_at, bool):
        if record_at < 1:
            raise AttnSVMError(
                f"record_at as an integer is a record interval and must be ≥ 1; got {record_at}"
            )
        return np.unique(np.concatenate([np.arange(record_at, steps + 1, record_at), [steps]])).astype(
            np.int64
        )
    arr = np.asarray(record_at)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise AttnSVMError("record_at must be None, an interval (int ≥ 1) or a 1-D list of integer steps")
    if arr.size and (arr.min() < 0 or arr.max() > steps):
        raise AttnSVMError(
            f"record_at steps must lie in [0, steps] = [0, {steps}]; got {arr.min()}..{arr.max()}"
        )
    return np.unique(np.concatenate([arr.astype(np.int64), [steps]]))


# ====================================================================== single engine
class GDRecord(NamedTuple):
    """State of a GD run at one recorded step.

    Attributes:
      step: the step count ``t`` (``W_t`` after ``t`` updates).
      norm: ``||W_t||_F``.
      risk: ``L(W_t)``.
      tokens: selected tokens ``argmax_t s_it(W_t)``, shape ``(n,)``.
      corr: ``corr(W_t, reference)`` (NaN when no reference was given or ``W_t = 0``).
      gap: ``½||Ŵ_t − R̂||²`` (NaN likewise).
      log10_grad_norm: ``log10 ||∇L(W_t)||_F``, exact from log-magnitudes even when the
        gradient underflows (``−inf`` only when the gradient is exactly zero).
      W: a copy of ``W_t`` when the run was asked to keep iterates, else ``None``.
    """

    step: int
    norm: float
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    gap: float
    log10_grad_norm: float
    W: FloatArray | None = None


@dataclass
class GDTrajectory:
    """Result of :func:`run_gd` / :func:`run_gd_kq`.

    Attributes:
      W: final iterate, shape ``(d, d)``.
      record: one :class:`GDRecord` per recorded step (the last one is the final state).
      steps_run: updates performed (less than asked after an early or saturation stop).
      stop_reason: ``"steps"``, ``"settled"`` (early stop), ``"gradient underflow"`` (plain GD:
        the gradient of the rescaled problem left the normal range, a scale-free test),
        ``"stationary"`` (plain GD: ``∇L = 0``, or below the rounding level of its own sum) or
        ``"stalled"`` (plain GD whose update no longer changes ``W`` in float64).
      saturated: ``True`` when plain GD stopped because the gradient underflowed or the update
        vanished; the iterate is then *not* where exact GD would be after ``steps`` steps.
      normalized, lr, loss: the run's settings.
    """

    W: FloatArray
    record: list[GDRecord]
    steps_run: int
    stop_reason: str
    saturated: bool
    normalized: bool
    lr: float
    loss: str

    def _col(self, name: str) -> FloatArray:
        return np.array([getattr(r, name) for r in self.record], dtype=np.float64)

    @property
    def steps(self) -> NDArray[np.int64]:
        """Recorded steps, shape ``(k,)``."""
        return np.array([r.step for r in self.record], dtype=np.int64)

    @property
    def norms(self) -> FloatArray:
        """``||W_t||_F`` at the recorded steps, shape ``(k,)``."""
        return self._col("norm")

    @property
    def risks(self) -> FloatArray:
        """``L(W_t)``, shape ``(k,)``."""
        return self._col("risk")

    @property
    def corrs(self) -> FloatArray:
        """``corr(W_t, reference)``, shape ``(k,)``."""
        return self._col("corr")

    @property
    def gaps(self) -> FloatArray:
        """``½||Ŵ_t − R̂||²``, shape ``(k,)``."""
        return self._col("gap")

    @property
    def log10_grad_norms(self) -> FloatArray:
        """``log10||∇L(W_t)||_F``, shape ``(k,)``."""
        return self._col("log10_grad_norm")

    @property
    def tokens(self) -> NDArray[np.intp]:
        """Selected tokens at the recorded steps, shape ``(k, n)``."""
        return np.stack([r.tokens for r in self.record])

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """``α_final``: the tokens selected by the final iterate, shape ``(n,)``."""
        return self.record[-1].tokens


def _loss_name(lo: Any) -> str:
    return str(getattr(lo, "name", type(lo).__name__))


def _direction(sc: _Scaled, W: FloatArray, lo: Any) -> GradDirection:
    """Unit direction of ``∇L(W)`` and ``log||∇L(W)||`` from the rescaled data (``∇_W L = 2^k ∇_{W'} L``)."""
    gd = normalized_risk_grad_of(sc.X, sc.Y, sc.z, sc.v, _to_logit_scale(sc, W), lo, **sc.mask_kw)
    return GradDirection(gd.direction, gd.log_norm + sc.k * _LN2)


def _is_stationary_error(exc: NumericalError) -> bool:
    """The core's refusal of a zero (or rounding-level) gradient, as opposed to a range error."""
    msg = str(exc)
    return msg == CANCELLED_MESSAGE or "exactly zero" in msg


def _log10_grad_norm(sc: _Scaled, W: FloatArray, lo: Any) -> float:
    Ws = _to_logit_scale(sc, W)
    try:
        return (
            normalized_risk_grad_of(sc.X, sc.Y, sc.z, sc.v, Ws, lo, **sc.mask_kw).log_norm + sc.k * _LN2
        ) / math.log(10.0)
    except NumericalError as exc:
        if not _is_stationary_error(exc):
            raise
        return -math.inf  # the gradient is exactly zero (stationary W)


def _make_record(
    sc: _Scaled, W: FloatArray, lo: Any, step: int, ref: FloatArray | None, log10_g: float, keep: bool
) -> GDRecord:
    Ws = _to_logit_scale(sc, W)  # logits and risk from the rescaled data: nothing overflows
    tokens = np.argmax(logits_of(sc.X, sc.z, Ws, **sc.mask_kw), axis=1).astype(np.intp)  # masked: −inf
    nonzero = bool(np.any(W != 0))
    corr = direction_corr(W, ref) if ref is not None and nonzero else math.nan
    gap = direction_gap(W, ref) if ref is not None and nonzero else math.nan
    return GDRecord(
        step=int(step),
        norm=_fro(W),
        risk=risk_of(sc.X, sc.Y, sc.z, sc.v, Ws, lo, **sc.mask_kw),
        tokens=tokens,
        corr=corr,
        gap=gap,
        log10_grad_norm=float(log10_g),
        W=np.array(W) if keep else None,
    )


def _initial_W(inst: Instance, W0: ArrayLike | None) -> FloatArray:
    if W0 is None:
        return np.zeros((inst.d, inst.d))
    return np.array(inst.check_weights(W0, "W0"))


def _settled(record: list[GDRecord], tol: float) -> bool:
    """Early-stop criterion: the last three records select the same tokens and the direction moved
    by at most ``tol`` (as a :func:`direction_gap`) between each of the last two record pairs."""
    if len(record) < 3:
        return False
    r0, r1, r2 = record[-3:]
    if r0.W is None or r1.W is None or r2.W is None:
        return False
    if not (np.array_equal(r0.tokens, r1.tokens) and np.array_equal(r1.tokens, r2.tokens)):
        return False
    if not (np.any(r0.W != 0) and np.any(r1.W != 0)):
        return False
    return direction_gap(r0.W, r1.W) <= tol and direction_gap(r1.W, r2.W) <= tol


def run_gd(
    inst: Instance,
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    loss: "str | LossLike" = "logistic",
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    early_stop: float | None = None,
    keep_iterates: bool = False,
) -> GDTrajectory:
    """Run GD on the attention risk of one instance, in float64.

    Normalized GD: ``W ← W − η ∇L(W)/||∇L(W)||_F``; plain GD: ``W ← W − η ∇L(W)``.

    The normalized direction is the core's log-domain one
    (:func:`attnsvm.model._grad.normalized_risk_grad_of`): it is exact after ``∇L`` underflows, so the
    iterates keep improving in direction for 10⁶ steps and beyond. Plain GD uses the
    cancellation-free :func:`attnsvm.model._grad.risk_grad_of`; when its gradient norm drops below the
    smallest normal float64 (subnormal or 0) or the update no longer changes ``W``, the run stops
    and says so (``saturated=True``, ``stop_reason``) rather than returning a stalled iterate as if
    it were GD's.

    Early stop (``early_stop = tol``): after a record step, stop when the last three records
    select the same tokens and the direction gap ``½||Ŵ_a − Ŵ_b||²`` between consecutive records
    is ≤ ``tol`` for both pairs. Checked only at record steps, so it depends on ``record_at``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (normalized GD, Thm. on
    convergence in direction); Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

    Args:
      inst: the data.
      steps: number of updates, integer ≥ 1.
      lr: step size ``η > 0``, finite.
      normalized: normalized (default) or plain GD.
      loss: loss name or object.
      W0: initial ``(d, d)`` matrix, finite; default zeros.
      record_at: ``None`` (about 25 log-spaced steps), an interval ``k`` (every ``k`` steps) or a
        list of steps in ``[0, steps]``; the final step is always recorded.
      reference: a ``(d, d)`` reference direction (e.g. ``W_mm``) for ``corr`` and ``gap``.
      early_stop: ``None`` (off) or the direction tolerance ``tol ≥ 0`` described above.
      keep_iterates: store a copy of ``W_t`` in each record.

    Returns:
      :class:`GDTrajectory`.

    Scale: any finite data. The engine computes on ``X``, ``z`` rescaled by exact powers of two
    (``W' = W·2^k`` carries the logits), so ``X·2^a``, ``z·2^b``, ``v·2^−a`` with ``W0·2^−(a+b)`` and
    ``lr·2^−(a+b)`` (plain GD: ``lr·2^−2(a+b)``) gives exactly ``W_t·2^−(a+b)``. Raises
    :class:`~attnsvm.NumericalError` naming the range when the largest entry of an iterate leaves
    the normal range [2.2e-308, 1.8e308], when the logits would exceed ``1.8e308/(4d²)`` (the softmax
    is one-hot far beyond float64), or when the token values ``vᵀx_it`` are not normal doubles.
    Each step rounds to ``≲ eps`` normwise; the direction as :func:`attnsvm.model._grad.normalized_risk_grad`.

    Token masks (:attr:`Instance.mask`): supported; masked tokens take no part in the risk, the gradient or
    the recorded tokens (``tokens`` are indices into the full sequence, never a masked one).
    """
    inst = check_instance(inst)
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    W = _initial_W(inst, W0)
    ref = _check_reference(inst, reference)
    at = record_steps(record_at, steps)
    tol = None
    if early_stop is not None:
        try:
            tol = float(early_stop)
        except (TypeError, ValueError):
            tol = math.nan
        if isinstance(early_stop, bool) or not (math.isfinite(tol) and tol >= 0):
            raise AttnSVMError(f"early_stop must be None or a finite tolerance ≥ 0; got {early_stop!r}")
    keep = keep_iterates or tol is not None
    rec_set = {int(s) for s in at}
    sc = _rescale(inst)
    _check_iterate(W, "W0")
    record: list[GDRecord] = []
    stop, saturated, t = "steps", False, 0

    if normalized:
        cur = None
        for t in range(0, steps + 1):
            if t > 0:
                try:
                    gd = cur if cur is not None else _direction(sc, W, lo)
                except NumericalError as exc:
                    raise NumericalError(f"normalized GD at step {t}: {exc}") from exc
                W = _check_iterate(W - lr * gd.direction, f"the iterate W_{t} of normalized GD")
                cur = None
            if t in rec_set:
                try:
                    cur = _direction(sc, W, lo)
                    lg = cur.log_norm / math.log(10.0)
                except NumericalError as exc:
                    if not _is_stationary_error(exc):
                        raise NumericalError(f"normalized GD at step {t}: {exc}") from exc
                    cur, lg = None, -math.inf
                record.append(_make_record(sc, W, lo, t, ref, lg, keep))
                if tol is not None and _settled(record, tol) and t < steps:
                    stop = "settled"
                    break
    else:
        lr_m, lr_e = math.frexp(lr)
        for t in range(0, steps + 1):
            if t > 0:
                # ∇_W L = 2^k g' with g' = e^{log||g'||}·D the gradient of the rescaled problem at
                # W' = W·2^k (data of order one), from the log-domain direction: its size is exact
                # even where it leaves the normal range, and nothing here depends on the data's scale.
                try:
                    g_dir = normalized_risk_grad_of(
                        sc.X, sc.Y, sc.z, sc.v, _to_logit_scale(sc, W), lo, **sc.mask_kw
                    )
                except NumericalError as exc:
                    if not _is_stationary_error(exc):
                        raise NumericalError(f"plain GD at step {t}: {exc}") from exc
                    stop, saturated = "stationary", True  # ∇L = 0, or below the rounding of its own sum
                    t -= 1
                    break
                if g_dir.log_norm < LOG_FLOAT_TINY:
                    # g' (the gradient up to the exact factor 2^k) is below the normal range: in
                    # float64 the update would not be η∇L (a scale-free test: the same at every scale).
                    stop, saturated = "gradient underflow", True
                    t -= 1
                    break
                if g_dir.log_norm > LOG_FLOAT_MAX:
                    raise NumericalError(
                        f"plain GD at step {t}: the gradient is not finite "
                        f"(||∇L|| ≈ 2^{sc.k}·e^{g_dir.log_norm:.4g}); lower lr"
                    )
                # the step η·2^k·g' = (m·||g'||·D)·2^(e+k) with η = m·2^e, m ∈ [½, 1): the powers of
                # two applied last (exact while normal, so the run is scale-equivariant)
                with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
                    Wn = W - np.ldexp((lr_m * math.exp(g_dir.log_norm)) * g_dir.direction, lr_e + sc.k)
                if not np.all(np.isfinite(Wn)):
                    raise NumericalError(
                        f"plain GD diverged at step {t}: W became non-finite "
                        f"(||∇L|| ≈ 2^{sc.k}·e^{g_dir.log_norm:.4g}); lower lr"
                    )
                if np.array_equal(Wn, W):
                    # log ||η∇L||_F = log η + k·ln 2 + log ||g'||: a step below the normal range that is not
                    # also below W's own rounding (W = 0, say) vanished by underflow, not by rounding
                    # against W: the next iterate is not a normal double (at another scale it is; the
                    # same run), the contract's error. Below W's rounding it is a stall at every scale.
                    log_step = math.log(lr) + sc.k * _LN2 + g_dir.log_norm
                    w_max = float(np.max(np.abs(W), initial=0.0))
                    if log_step < LOG_FLOAT_TINY and (w_max == 0.0 or log_step > math.log(w_max * _EPS)):
                        raise range_error(
                            f"the step η·∇L of plain GD at step {t}",
                            log_step,
                            remedy="Scale lr (and W0) with the data: X·2^a, z·2^b is the same problem in W·2^−(a+b)",
                        )
                    stop, saturated = "stalled", True
                    t -= 1
                    break
                W = _check_iterate(Wn, f"the iterate W_{t} of plain GD")
            if t in rec_set:
                record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), keep))
                if tol is not None and _settled(record, tol) and t < steps:
                    stop = "settled"
                    break
        if saturated and (not record or record[-1].step != t):
            record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), keep))
    if not keep_iterates:
        record = [r._replace(W=None) for r in record]
    return GDTrajectory(
        W=W,
        record=record,
        steps_run=int(t),
        stop_reason=stop,
        saturated=saturated,
        normalized=bool(normalized),
        lr=lr,
        loss=_loss_name(lo),
    )


# ===================================================================== batched engine
@dataclass
class BatchTrajectory:
    """Result of :func:`run_gd_batch`; arrays have a leading record axis ``k`` and batch axis ``B``.

    Attributes:
      W: final iterates, shape ``(B, d, d)``.
      steps: recorded steps, shape ``(k,)``.
      norms, risks, log10_grad_norms: shape ``(k, B)``.
      tokens: selected tokens (``argmax`` of the logits over the allowed tokens), shape ``(k, B, n)``.
      corrs, gaps: shape ``(k, B)`` when a reference was given, else ``None``.
      saturated_at: first step at which plain GD's gradient norm fell below the smallest normal
        float64 (its update is then inexact), ``−1`` if never (always ``−1`` for normalized GD),
        shape ``(B,)``.
      device: the torch device the run used.
    """

    W: FloatArray
    steps: NDArray[np.int64]
    norms: FloatArray
    risks: FloatArray
    tokens: NDArray[np.intp]
    log10_grad_norms: FloatArray
    corrs: FloatArray | None
    gaps: FloatArray | None
    saturated_at: NDArray[np.int64]
    normalized: bool
    lr: float
    loss: str
    device: str

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """Selected tokens of the final iterates, shape ``(B, n)``."""
        return self.tokens[-1]


def _torch_device(device: Any) -> Any:
    import torch

    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise AttnSVMError(
            f"device {device!r} is not a torch device name; use 'cpu' or 'cuda' ({exc})"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise AttnSVMError(
                f"device {device!r} was requested but CUDA is not available to torch on this machine "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise AttnSVMError(
                f"device {device!r} does not exist; torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    elif dev.type != "cpu":
        raise AttnSVMError(f"device {device!r} is not supported; use 'cpu' or 'cuda'")
    return dev


#: Data whose largest entries lie within 2^±_MODERATE need no rescaling in the batched engine.
_MODERATE = 64


def _stack_instances(instances: Sequence[Instance], *, rescale: bool = False, masks: bool = False) -> Any:
    """``(X, Y, z, v)`` stacked; with ``rescale=True`` each instance as :func:`_rescale` gives it, and
    the exponents ``k_b`` (``W'_b = W_b·2^k_b``) as a fifth array.

    ``X`` holds the keys (:attr:`Instance.keys`: the masked tokens zeroed, ``X`` itself without a mask).
    With ``masks=True`` the token masks come last: a boolean ``(B, n, T)`` array (``True`` = the token
    takes part; all ``True`` rows for an unmasked instance), or ``None`` when no instance has a mask.
    Without it a masked instance is refused (a caller that drops the mask would read every token).
    """
    if isinstance(instances, Instance):
        raise AttnSVMError("run_gd_batch takes a sequence of instances; wrap a single one in a list")
    try:
        items = list(instances)
    except TypeError:
        raise AttnSVMError(
            f"instances must be a sequence of Instance; got {type(instances).__name__}"
        ) from None
    if not items:
        raise AttnSVMError("instances is empty; pass at least one Instance")
    for i, it in enumerate(items):
        if not isinstance(it, Instance):
            raise AttnSVMError(f"instances[{i}] is a {type(it).__name__}, not an attnsvm Instance")
        if not masks:
            require_unmasked(it, f"_stack_instances without masks=True (instances[{i}])")
    shape = items[0].shape
    for i, it in enumerate(items):
        if it.shape != shape:
            raise AttnSVMError(
                f"instances must share one shape (n, T, d) to be batched; instances[0] has {shape}, "
                f"instances[{i}] has {it.shape}. Group instances by shape and call run_gd_batch per group."
            )
    tail: tuple[Any, ...] = ()
    if masks:
        any_mask = any(it.mask is not None for it in items)
        tail = (np.stack([it.allowed for it in items]) if any_mask else None,)
    if rescale:
        scs = [_rescale(it) for it in items]
        if all(
            abs(pow2_exponent(it.keys)) <= _MODERATE and abs(pow2_exponent(it.z)) <= _MODERATE for it in items
        ):
            # moderate data (entries within 2^±64): the engine's own ranges suffice; no per-step
            # rescaling of W (the throughput of the common case is unchanged)
            X = np.stack([it.keys for it in items])
            return (
                X,
                np.stack([it.Y for it in items]),
                np.stack([it.z for it in items]),
                np.stack([it.v for it in items]),
                np.zeros(len(items), dtype=np.int64),
            ) + tail
        return (
            np.stack([c.X for c in scs]),
            np.stack([c.Y for c in scs]),
            np.stack([c.z for c in scs]),
            np.stack([c.v for c in scs]),
            np.array([c.k for c in scs], dtype=np.int64),
        ) + tail
    X = np.stack([it.keys for it in items])
    Y = np.stack([it.Y for it in items])
    z = np.stack([it.z for it in items])
    v = np.stack([it.v for it in items])
    return (X, Y, z, v) + tail


def _batch_matrices(arg: ArrayLike | None, B: int, d: int, name: str) -> FloatArray | None:
    if arg is None:
        return None
    arr = as_real_array(arg, name)
    if arr.shape == (d, d):
        arr = np.broadcast_to(arr, (B, d, d))
    if arr.shape != (B, d, d):
        raise InvalidInstanceError(
            f"{name} must have shape (d, d) = ({d}, {d}) or (B, d, d) = ({B}, {d}, {d}); got {arr.shape}"
        )
    return np.array(arr)


class _TorchBatch:
    """Stacked data on a device and the batched closed-form direction (no autograd).

    Layout is token-major and feature-major: ``Xt[t, k, b, i] = X_b[i, t, k]`` (shape
    ``(T, d, B, n)``), per-token arrays ``(T, B, n)``. Reductions over tokens are then
    elementwise operations on contiguous ``(B, n)`` slabs, the two contractions with ``X``
    (logits and gradient) stream it once each, without temporaries of its size, and
    ``y_b = (Σ_t w_it x_it)_i`` is a ``(d, n)`` matrix with unit inner stride that the final
    batched product reads in place (no layout copy).

    Everything that does not depend on ``W`` is computed once here: the token values
    ``a_it = x_itᵀ v_i``, the scores ``γ_it = Y_i a_it`` and, per instance, the bound
    ``Δ_b = 2 max |γ|`` used by the fast path's underflow test.

    Two ways to the same direction (see :meth:`_parts`): a linear-domain fast path (about
    half the passes) used while no weight that matters is below the normal range, and the
    log-domain path, taken automatically, per step and per instance, for the instances where
    the fast path could lose digits. ``fast=False`` forces the log-domain path everywhere.

    A GD step is :meth:`gradient` then :meth:`update_` (or :meth:`step_`, both): the iterate is
    updated in place by one fused pass, the unit direction never materialised;
    :meth:`direction` returns it for callers that need it.

    Refusals, per instance, as :func:`attnsvm.model._grad.normalized_risk_grad_of`: ``cancelled`` where
    ``||G|| ≤ CANCELLATION_FACTOR·(nT·eps·Σ|w_it| ||x_it|| ||z_i|| + VE)``, ``VE`` the rounding of the
    token values carried into ``G`` (:meth:`_value_error`; exact copies of a token charge nothing),
    and :attr:`undetermined` where ``ℓ'(Y_i f_i)`` is (:meth:`_check_undetermined`). Each is decided
    by a cheap bound first (a few passes over ``(T, B, n)``, vectorised); the exact ``O(T²)`` terms
    are formed only for the instances the bound does not clear.

    Token masks: ``mask`` (keyword, boolean ``(B, n, T)``, ``True`` = the token takes part, ≥ 1 per
    sequence; ``None`` or all ``True``: no mask, and no pass below does any mask work). A masked token
    is stored as a zero key (value, score, norm and value magnitude 0: it sets no scale, bound or
    maximum — ``Δ_b``, ``||x|| ||z||``, the rounding levels, the undetermined-ℓ' screen) and its logit is
    ``−inf`` (:meth:`logits`), so its weight ``e^{l − max l}`` is exactly 0 and it is never a maximiser.
    The passes that form ``l_t − l_u`` are safe for it: the fast path subtracts the (finite) largest
    logit only; the log-domain path keeps masked tokens out of the tied set ``Z`` and, for a sequence
    with one allowed token (no runner-up, ``l' = −inf``), shifts by 0 instead of ``−inf`` (then ``E = 0``,
    ``ψ = 0``, ``m = −inf``: weights exactly 0, no ``−inf − (−inf)``); ``log_softmax`` gives ``−inf`` log
    weights, which only meet finite terms or other ``−inf`` (``−inf + −inf``) and products with 0 weights.
    Exact-duplicate classes count allowed tokens only (a zeroed key is nobody's copy).
    """

    #: Fast-path acceptance: the largest weight |w_it| of an instance must be ≥ this (its
    #: weights down to 1e-16·max are then ≥ 1e-296, normal, hence exact to a few ulps; the
    #: smaller ones are below the rounding error of the sum they enter).
    FAST_MIN_WEIGHT = 1e-280
    #: When more than this fraction of a batch needed the log-domain path, the next steps use
    #: it for the whole batch (retrying the fast path every ``LOG_RETRY`` steps): once
    #: saturated, an instance stays saturated as ``||W||`` grows, and a failed fast attempt
    #: costs half a step.
    LOG_FRACTION = 0.5
    LOG_RETRY = 16
    #: The fast path's gradient norm is taken unscaled when every accepted ``||G_b||`` lies in
    #: ``[1/NORM_SAFE, NORM_SAFE]`` (no overflow of ``Σ G²``, underflow below 1e-26 relative).
    NORM_SAFE = 1e140
    _LOG_NORM_SAFE = math.log(NORM_SAFE)
    #: The cheap bound on the values' rounding error (:meth:`_value_bound_log`) is scaled by this, so
    #: that its own rounding (≤ (T+d)·eps relative) cannot make it fall below the exact term.
    VALUE_SAFETY = 1.01

    def __init__(
        self,
        X: FloatArray,
        Y: FloatArray,
        z: FloatArray,
        v: FloatArray,
        lo: Any,
        device: Any,
        fast: bool = True,
        *,
        mask: NDArray[np.bool_] | None = None,
    ):
        import torch

        self.torch = torch
        kw: dict[str, Any] = {"dtype": torch.float64, "device": device}
        allowed = self._check_mask(mask, np.shape(X))
        if allowed is not None:
            # a masked token is a zero key (no value, no norm: it sets no scale, bound or maximum) whose
            # logit is −inf (logits() fills it in); the caller's X is not modified
            X = np.where(allowed[..., None], np.asarray(X, dtype=np.float64), 0.0)
        Xd = torch.as_tensor(X, **kw)
        B, n, T, d = Xd.shape
        self.B, self.n, self.T, self.d = B, n, T, d
        #: (T, B, n) boolean: True at the masked tokens; ``None`` when every token takes part (every
        #: mask-only pass is then skipped: the unmasked batch runs the unmasked code)
        self._masked: Any | None = None
        self._allowed: Any | None = None
        if allowed is not None:
            self._allowed = torch.as_tensor(np.ascontiguousarray(allowed.transpose(2, 0, 1)), device=device)
            self._masked = (~self._allowed).contiguous()
        self.Xt = Xd.permute(2, 3, 0, 1).contiguous()  # (T, d, B, n)
        self.zB = torch.as_tensor(z, **kw).contiguous()  # (B, n, d)
        self.zT = self.zB.transpose(1, 2).contiguous()  # (B, d, n)
        self.Y = torch.as_tensor(Y, **kw).contiguous()  # (B, n)
        vt = torch.as_tensor(v, **kw).T.contiguous()  # (d, B)
        self.a = torch.einsum("tkbi,kb->tbi", self.Xt, vt).contiguous()  # token values a_it
        self.gamma = (self.a * self.Y).contiguous()  # token scores γ_it = Y_i a_it, constant
        # Δ_b = 2 max|γ| bounds |δ_it| = |γ_it − γ_ir| (fast-path underflow test); ≥ tiny so 0·Δ = 0.
        self.delta_bound = (2 * self.gamma.abs().amax(dim=0).amax(dim=-1)).clamp_min(_TINY)
        self.lo = lo
        self.log_n = math.log(n)
        self._log_fn = lo.log_neg_derivative_fn if isinstance(lo, Loss) else None
        self._l = torch.empty((T, B, n), **kw)
        self._E = torch.empty((T, B, n), **kw)
        self._F = torch.empty((T, B, n), **kw)
        self._w = torch.empty((T, B, n), **kw)
        self._y = torch.empty((d, B, n), **kw)
        self._P = torch.empty((T, B, n), **kw)  # products reduced over tokens
        self._qB = torch.empty((B, d, n), **kw)  # W z_i, bmm layout
        self._q = torch.empty((d, B, n), **kw)  # W z_i, X's layout
        # The full-batch gradient (and the returned direction): a reused buffer, valid until the next
        # call; fresh (B, d, d) tensors each step cost page faults comparable to a pass over X.
        self._G = torch.empty((B, d, d), **kw)
        # Per-feature / per-token slabs of the constant data and of the reused buffers, taken once:
        # slicing them anew each step costs more dispatch time than the small reductions it feeds.
        self._X_feat = [self.Xt[:, k] for k in range(d)]  # (T, B, n) each
        self._X_tok = [self.Xt[t] for t in range(T)]  # (d, B, n) each
        self._q_feat = [self._q[k] for k in range(d)]  # (B, n) each
        self._w_tok = [self._w[t] for t in range(T)]  # (B, n) each
        self._Bn = B * n
        # ||x_it|| ||z_i|| (T, B, n) and its max over tokens: the scale of the rounding error of G. A norm
        # squares its entries: rows below ~1e-154 would read 0 (a live sequence taken for dead), so those
        # rows' norms are formed from the row scaled by a power of two (exact; the others unchanged).
        x_norm = self._row_norm(self.Xt, 1)  # (T, B, n)
        z_norm = self._row_norm(self.zB, 2)  # (B, n)
        self._xz = (x_norm * z_norm).contiguous()
        self._xz_max = self._xz.amax(dim=0)
        # A sequence with z_i = 0 (or x_i· = 0) contributes nothing to G, however large its weights: it
        # must not set the scale of an instance (its weights would mask the others' underflow).
        self._live = (self._xz_max > 0).to(torch.float64)  # (B, n)
        self._any_dead = not bool(self._live.all())
        self._cancel_rtol = CANCELLATION_FACTOR * n * T * float(np.finfo(np.float64).eps)
        self._neg_inf = torch.tensor(-math.inf, **kw)
        self.fast = bool(fast)
        # κ: a weight below κ·Δ_b·max|α| could come from a subnormal factor (E_it or ψ_i); the
        # fast path is accepted only when the largest weight is far above that (≥ 1e18 × it).
        self._kappa = 1e18 * T * _TINY
        self._kappa_delta = self.delta_bound * self._kappa
        self._logistic = isinstance(lo, Loss) and lo.derivative_fn is _logistic_derivative
        # Logistic loss: |ℓ'| = σ(−u) ≤ 1 and S ≥ 1, so |α| ≤ 1, and the fast path's acceptance
        # threshold max(max|α| κ Δ_b, FAST_MIN_WEIGHT) is at most this constant, per instance
        # (Δ_b ≤ 1e300 keeps |w| ≤ 2|α|Δ_b finite without a per-step test).
        self._thr_bounded = (
            self._kappa_delta.clamp_min(self.FAST_MIN_WEIGHT)
            if self._logistic and bool((self.delta_bound <= 1e300).all())
            else None
        )
        self._log_streak = 0
        #: calls of :meth:`direction` by path: "fast" (whole batch), "log" (whole batch),
        #: "mixed" (fast path with a log-domain subset).
        self.stats = {"fast": 0, "log": 0, "mixed": 0}
        # --- the single form's refusals (grad.normalized_risk_grad_of), per instance -------------
        # The values' own rounding: a_it = vᵀx_it is known to ±d·eps·m_it, m_it = Σ_k |v_k x_itk|.
        self.amag = torch.einsum("tkbi,kb->tbi", self.Xt.abs(), vt.abs()).contiguous()  # m_it
        self._amag_max = self.amag.amax(dim=0)  # (B, n)
        # constant factor of the cheap value bound (see _value_bound_log): 4·d·eps·max m·max||x|| ||z||
        # per sequence, and its log (−inf for a sequence with no value or no query: it adds nothing)
        self._ve_const = self._amag_max * self._xz_max * (4.0 * d * _EPS * self.VALUE_SAFETY)
        self._log_ve_const = torch.log(self._ve_const)
        # the undetermined-ℓ' screen, per instance: δf_i ≤ [(T+d)·eps + 2d²·eps·||W||_F·max||x|| ||z||]·max|a|
        a_abs_max = self.a.abs().amax(dim=0)  # (B, n): bounds Σ_t s_it |a_it|
        self._df_c0 = ((T + d) * _EPS * a_abs_max).amax(dim=-1)  # (B,)
        self._df_c1 = (2.0 * d * d * _EPS * self._xz_max * a_abs_max).amax(dim=-1)  # (B,)
        self._d_eps = d * _EPS
        # Exact-duplicate classes (constant): cls_it = the first token u with x_iu = x_it bitwise. A token
        # and its copy have bitwise equal values, so their difference is exact (no rounding charged).
        # Rows compared as d·8 raw bytes ((B, n, T, T), not (…, d)); + 0.0 turns −0 into +0, so that the
        # test is the single form's X_t == X_u.
        Xn = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)
        rows = Xn.view(np.dtype((np.void, 8 * d)))[..., 0]  # (B, n, T)
        same = rows[:, :, :, None] == rows[:, :, None, :]  # (B, n, T, T)
        if allowed is not None:
            # a masked token is no token of its sequence: its zeroed key is nobody's copy (its own class)
            same &= allowed[:, :, :, None] & allowed[:, :, None, :]
            same |= np.eye(T, dtype=bool)
        cls = np.argmax(same, axis=-1)  # (B, n, T): first equal token
        self._has_dup = bool(np.any(cls != np.arange(T)))
        self._cls = torch.as_tensor(np.ascontiguousarray(cls.transpose(2, 0, 1)), **kw)  # (T, B, n)
        # ℓ'(Y f) is undetermined where κ·δf > 1 (grad._output_spread); not for the correlation loss.
        self._check_output = lo is not correlation
        #: instances whose ℓ' is undetermined at the last call of :meth:`gradient` (``None``: none),
        #: and ``(sequence, δf)`` of the first such instance, for the error message.
        self.undetermined: Any | None = None
        self.undetermined_detail: dict[int, tuple[int, float]] = {}
        self._init_mixed(np.asarray(X, dtype=np.float64), np.asarray(z, dtype=np.float64), np.asarray(v), kw)

    #: Mixed-magnitude data (see :meth:`_init_mixed`): a live sequence whose keys or query have their
    #: largest entry below ``2^−SEQ_MODERATE``, or whose terms ``c·x zᵀ`` (``c`` of the size of its values,
    #: ``≤ d·2^(kx+kv)``) have the scale ``2^(2kx + kz + kv)`` outside ``2^±TERM_MODERATE``, makes its instance
    #: "mixed". Otherwise a sequence's largest term is within 2^±800 and those that matter (≥ 2^−60 of it)
    #: are normal doubles (≥ 2^−860 > 2^−1022): the engine's per-instance scaling is exact there, as before.
    #: (The data of every instance of the existing tests are of this kind: they run bit for bit as before.)
    SEQ_MODERATE = 64
    TERM_MODERATE = 800

    def _init_mixed(self, X: FloatArray, z: FloatArray, v: FloatArray, kw: dict[str, Any]) -> None:
        """Per-sequence power-of-two scaling for instances whose sequences differ wildly in size.

        Each term of ``G`` is ``A_i c_it x_it z_iᵀ`` (:meth:`_direction_log`); the engine factors out the
        largest ``A_i`` only, so with keys, queries or values of very different size per sequence (a query
        of 1e-274, values of 3e-237) the products ``c x z`` underflow — a whole live sequence lost, or read
        as dead — although ``∇L`` is well determined (the single form scales each row on its own,
        ``split_rows``). For such an instance ("mixed", ``_mixed``, (B,) bool) every sequence is scaled as
        the single form does: ``x' = x·2^−kx_i``, ``z' = z·2^−kz_i``, ``v' = v·2^−kv`` (largest entries in
        ``[½, 1)``, exact), scores ``γ'_it = Y_i x'ᵀv'`` (``γ = 2^kg γ'``, ``kg_i = kx_i + kv``), and the
        log-domain path runs on them with ``log A_i`` raised by ``σ_i = (kg_i + kx_i + kz_i)·ln 2``, so that
        the largest term of the whole instance is O(1) before the sum. The fast path does not take a mixed
        instance (its weights are absolute). Every other instance keeps its data (exponents 0, the arrays
        below equal to the plain ones bit for bit), so ordinary data run the unchanged engine.
        """
        torch = self.torch
        self._mixed: Any | None = None
        self._all_mixed = False
        # the exact logs of ||x|| ||z||, (T, B, n), and of its max, (B, n); which sequences are live
        self._log_xz = torch.log(self._xz)
        self._log_xz_max = torch.log(self._xz_max)
        ax = np.max(np.abs(X), axis=(2, 3))  # (B, n) (masked keys are zero)
        az = np.max(np.abs(z), axis=2)  # (B, n)
        av = np.max(np.abs(v), axis=1)  # (B,)
        kx = np.frexp(np.where(ax > 0, ax, 1.0))[1].astype(np.int64)
        kz = np.frexp(np.where(az > 0, az, 1.0))[1].astype(np.int64)
        kv = np.frexp(np.where(av > 0, av, 1.0))[1].astype(np.int64)
        live = (ax > 0) & (az > 0)
        odd = live & (
            (kx < -self.SEQ_MODERATE)
            | (kz < -self.SEQ_MODERATE)
            | (np.abs(2 * kx + kz + kv[:, None]) > self.TERM_MODERATE)
        )
        mixed = odd.any(axis=1)  # (B,)
        if not mixed.any():
            return
        kx = np.where(mixed[:, None], kx, 0)
        kz = np.where(mixed[:, None], kz, 0)
        kv = np.where(mixed, kv, 0)
        kg = kx + kv[:, None]  # (B, n): γ = 2^kg γ'
        Xs = np.ldexp(X, -kx[:, :, None, None])  # (B, n, T, d)
        zs = np.ldexp(z, -kz[:, :, None])
        vs = np.ldexp(v, -kv[:, None])
        m_t = torch.as_tensor(mixed, device=kw["device"])
        mb = m_t.view(-1, 1)  # (B, 1)
        self._mixed = m_t
        self._all_mixed = bool(mixed.all())
        Xst = torch.as_tensor(Xs, **kw).permute(2, 3, 0, 1)  # (T, d, B, n)
        self._Xs = torch.where(mb, Xst, self.Xt).contiguous()
        self._Xs_tok = [self._Xs[t] for t in range(self.T)]
        self._zs = torch.where(mb.unsqueeze(-1), torch.as_tensor(zs, **kw), self.zB).contiguous()
        vst = torch.as_tensor(vs, **kw).T.contiguous()  # (d, B)
        gam = torch.einsum("tkbi,kb->tbi", self._Xs, vst) * self.Y
        self._gamma_s = torch.where(mb, gam, self.gamma).contiguous()
        # γ = 2^kg γ' applied as two factors (2^kg alone may not be a double); 1·1 elsewhere
        h = kg // 2
        self._kg_f1 = torch.as_tensor(np.ldexp(1.0, h), **kw)
        self._kg_f2 = torch.as_tensor(np.ldexp(1.0, kg - h), **kw)
        self._sigma = torch.as_tensor((kg + kx + kz) * _LN2, **kw)  # (B, n), 0 off the mixed instances
        # the norms of the scaled rows, and the exact logs in the true units
        xz_s = self._row_norm(self._Xs, 1) * self._row_norm(self._zs, 2)
        self._xz_s = torch.where(mb, xz_s, self._xz).contiguous()
        log_xz = torch.log(xz_s) + torch.as_tensor((kx + kz) * _LN2, **kw)
        self._log_xz = torch.where(mb, log_xz, self._log_xz).contiguous()
        self._log_xz_max = self._log_xz.amax(dim=0)
        amag_s = torch.einsum("tkbi,kb->tbi", self._Xs.abs(), vst.abs()).amax(dim=0)
        log_amag = torch.log(amag_s) + torch.as_tensor((kx + kv[:, None]) * _LN2, **kw)
        log_ve = log_amag + self._log_xz_max + math.log(4.0 * self.d * _EPS * self.VALUE_SAFETY)
        self._log_ve_const = torch.where(mb, log_ve, self._log_ve_const)
        live_t = torch.as_tensor(live, device=kw["device"])
        self._live_bn = torch.where(mb, live_t, self._xz_max > 0)
        self._live = self._live_bn.to(torch.float64)
        self._any_dead = not bool(self._live_bn.all())

    #: Rows whose largest entry is below this have their norm formed from the row scaled by a power of
    #: two: their squares (≤ 1e-300) would lose digits or underflow (the norm of a larger row is exact).
    NORM_TINY = 1e-150

    def _row_norm(self, A: Any, dim: int) -> Any:
        """``||A||`` along ``dim``, exact (to rounding) for rows of any size: ``vector_norm`` where the row's
        largest entry is ≥ ``NORM_TINY`` (bit-for-bit the plain norm), ``2^e ||A·2^−e||`` for smaller rows."""
        torch = self.torch
        nrm = torch.linalg.vector_norm(A, dim=dim)
        big = A.abs().amax(dim=dim)
        tiny = (big > 0) & (big < self.NORM_TINY)
        if bool(tiny.any()):
            # 2^−e in two factors (e ≥ −1073: 2^−e alone may not be a double); 2^e is one (≥ 2^−1073)
            e = torch.where(tiny, torch.frexp(big).exponent, 0).to(A.dtype)
            h = torch.floor(-e / 2)
            up = A * torch.pow(2.0, h).unsqueeze(dim) * torch.pow(2.0, -e - h).unsqueeze(dim)
            nrm = torch.where(tiny, torch.linalg.vector_norm(up, dim=dim) * torch.pow(2.0, e), nrm)
        return nrm

    @staticmethod
    def _check_mask(mask: Any, shape: tuple[int, ...]) -> NDArray[np.bool_] | None:
        """The token mask as a boolean ``(B, n, T)`` array (``True`` = the token takes part), or ``None``
        when there is none or every token takes part; refuses a wrong shape or a sequence with no token."""
        if mask is None:
            return None
        allowed = np.asarray(mask)
        if allowed.dtype != np.bool_ or allowed.shape != tuple(shape[:3]):
            raise InvalidInstanceError(
                f"mask must be a boolean array of shape (B, n, T) = {tuple(shape[:3])}; got dtype "
                f"{allowed.dtype}, shape {allowed.shape}"
            )
        if bool(allowed.all()):
            return None
        empty = np.argwhere(~allowed.any(axis=2))
        if empty.size:
            b, i = (int(c) for c in empty[0])
            raise InvalidInstanceError(
                f"mask masks every token of sequence {i} of instance {b}: each sequence keeps at least one"
            )
        return allowed

    def logits(self, W: Any) -> Any:
        """Logits ``l_it = x_itᵀ (W z_i)``, shape ``(T, B, n)`` (a reused buffer); ``−inf`` at a masked token."""
        self._q.copy_(self.torch.bmm(W, self.zT, out=self._qB).transpose(0, 1))  # (d, B, n): q_i = W z_i
        l, Xk, qk = self._l, self._X_feat, self._q_feat
        self.torch.mul(Xk[0], qk[0], out=l)
        for k in range(1, self.d):
            l.addcmul_(Xk[k], qk[k])
        if self._masked is not None:
            l.masked_fill_(self._masked, -math.inf)  # weight e^{−inf} = 0; never a maximum (≥ 1 allowed)
        return l

    def log_s(self, W: Any) -> tuple[Any, Any]:
        """Logits and ``log s`` (log-sum-exp), shapes ``(T, B, n)``."""
        logits = self.logits(W).clone()
        return logits, self.torch.log_softmax(logits, dim=0)

    def _signed_log_dl(self, u: Any) -> tuple[Any, Any]:
        torch = self.torch
        if self._log_fn is not None:
            return None, self._log_fn(u)  # ℓ' < 0: sign −1
        d = self.lo.derivative(u)
        if not bool(torch.isfinite(d).all()):
            raise NumericalError("the loss derivative is not finite (NaN or Inf); check the custom loss")
        return torch.sign(d), torch.log(torch.abs(d))

    def _gradient_sum(self, w: Any, Xt: Any, zB: Any, y: Any | None = None) -> Any:
        """``Σ_i (Σ_t w_it x_it) z_iᵀ``, shape ``(B, d, d)``: one stream of ``X`` and one bmm.

        With ``y`` given (the whole batch) the result is written to the reused buffer ``_G``.
        """
        torch = self.torch
        out = None
        if y is None:
            y = torch.empty(Xt.shape[1:], dtype=Xt.dtype, device=Xt.device)
            xs = [Xt[t] for t in range(self.T)]
        else:
            # the whole batch: Xt is self.Xt, or its per-sequence scaled copy (mixed data, _init_mixed)
            out, xs = self._G, (self._X_tok if Xt is self.Xt else self._Xs_tok)
        ws = self._w_tok if w is self._w else [w[t] for t in range(self.T)]
        torch.mul(xs[0], ws[0], out=y)
        for t in range(1, self.T):
            y.addcmul_(xs[t], ws[t])  # y_i = Σ_t w_it x_it, shape (d, B, n)
        return torch.bmm(y.transpose(0, 1), zB, out=out)  # (B, d, d): Σ_i y_i z_iᵀ (strided view, no copy)

    def _rounding_level(self, w: Any, xz: Any) -> Any:
        """``C·nT·eps·Σ_it |w_it| ||x_it|| ||z_i||`` per instance, the rounding level of ``G = Σ w x zᵀ``
        (as :func:`attnsvm.model._grad.normalized_risk_grad_of`); overwrites ``w``."""
        return w.abs_().mul_(xz).sum(dim=(0, 2)).mul_(self._cancel_rtol)

    @staticmethod
    def _abs_max(w: Any) -> Any:
        """``max_{t,i} |w_it|`` per instance, shape ``(B,)`` (NaN propagates)."""
        return w.amax(dim=0).amax(dim=-1).maximum(w.amin(dim=0).amin(dim=-1).neg_())

    def _direction_fast(self, l: Any) -> tuple[Any, Any, Any, Any | None, Any | None]:
        """Linear-domain gradient: ``(G, inv, log_norm, ok, cancelled)``, direction ``G·inv``.

        ``ok`` (B,) says where the result is exact, ``None`` meaning everywhere; ``cancelled``
        (B,) marks the accepted instances whose gradient cancels to the rounding level of its own
        sum (a noise direction; see :data:`attnsvm.model._grad.CANCELLATION_FACTOR`), ``None`` meaning
        none (the common case, known from a cheap bound).

        With ``E_it = e^{l_it − max_u l_iu}`` (``= 1`` at the selected token, exactly),
        ``S_i = Σ_t E_it``, a reference score ``c_i`` = the score of a selected token (the largest
        over exactly tied maximisers), ``δ_it = γ_it − c_i`` and ``ψ_i = Σ_t E_it δ_it``:
        ``Y_i f_i = c_i + ψ_i/S_i`` and ``w_it = ℓ'_i s_it (γ_it − Y_i f_i) = E_it (α_i δ_it − α_i ψ_i/S_i)``
        with ``α_i = ℓ'_i/S_i``. The selected token's weight ``−α_i ψ_i/S_i`` is formed from
        ``ψ`` (no ``γ_ir − Y_i f_i`` cancellation). Every factor is exact to a few ulps unless
        it leaves the normal range; ``ok`` is false for instances whose largest weight is
        below ``FAST_MIN_WEIGHT`` or not far above what a subnormal ``E_it``/``ψ_i`` could
        contribute, or is not finite (the log-domain path then takes over).
        """
        torch = self.torch
        B = l.shape[1]
        lmax = l.amax(dim=0)  # (B, n)
        E = torch.sub(l, lmax, out=self._E).exp_()  # ≤ 1; exactly 1 at the maximisers
        S = E.sum(dim=0)  # ≥ 1
        # c_i = the exact score of one selected token, so that δ = 0 exactly at a token with E = 1.
        # F = 1 exactly at the maximisers (E < 1 elsewhere; a logit within 1e-16 of the top also
        # gives E = 1 and counts as tied, harmlessly). Without ties c = Σ_t F γ is that score; each
        # sequence has ≥ 1 maximiser, so Σ F = B·n exactly iff no sequence has a tie (one reduction).
        # With ties, the largest tied score. (Not their mean: fl(fl(3γ)/3) ≠ γ for ~14% of doubles,
        # and ±1 ulp of δ swamps a saturated weight.)
        F = torch.floor(E, out=self._F)
        # N_i S_i = Σ_{u ∉ dup(r)} E_iu for a maximiser r (the weight outside r's duplicates, for the
        # bound on the values' rounding): a sum of positive terms, no cancellation. Without exact
        # duplicates, E − F is E off the maximisers and 0 on them, and the other maximisers add ΣF − 1.
        if self._has_dup:
            cls_r = torch.mul(self._cls, F).amax(dim=0)  # the class of one maximiser
            nsum = torch.where(self._cls != cls_r, E, 0.0).sum(dim=0)
        else:
            nsum = torch.sub(E, F).sum(dim=0).add_(F.sum(dim=0).sub_(1.0))  # ΣF − 1 first: an integer
        c = torch.mul(F, self.gamma, out=self._P).sum(dim=0)
        if bool(F.sum() != self._Bn):
            c = torch.where(F == 1.0, self.gamma, self._neg_inf, out=self._P).amax(dim=0)
        delta = torch.sub(self.gamma, c, out=self._F)  # δ_it = γ_it − c_i
        psi_s = torch.mul(E, delta, out=self._P).sum(dim=0).div_(S)  # ψ_i/S_i = Σ_t s_it δ_it
        # Cancellation-free margin: Y_i f_i = c_i + Σ_t s_it δ_it.
        u = c.add_(psi_s)
        if self._logistic:
            # ℓ'(u) = −σ(−u) in one kernel (σ(x) = 1/(1 + e^{−x}), a few ulps; 0 where e^{−x} overflows,
            # i.e. |ℓ'| < 1e-307: the weights are then below FAST_MIN_WEIGHT and the log path takes over)
            dl = torch.sigmoid(u.neg_()).neg_()
        else:
            dl = self.lo.derivative(u)
        alpha = dl.div_(S) if self._logistic else dl / S  # a custom ℓ' may return a read-only view
        # w = E·(α δ − α ψ/S): the selected token's weight is −α ψ/S (δ = 0 there), no cancellation.
        a_psi = alpha * psi_s
        w = torch.addcmul(-a_psi, delta, alpha, out=self._w).mul_(E)
        if self._any_dead:  # dead sequences (z_i = 0) neither contribute nor certify (see __init__)
            w.mul_(self._live)
            a_psi.mul_(self._live)
        # ok ⇔ wmax = max|w| finite, ≥ FAST_MIN_WEIGHT and ≥ κ Δ max|α| (NaN fails every comparison;
        # for the logistic loss the threshold is the constant upper bound of that, see _thr_bounded).
        # Shortcut (two passes saved): the token with E = 1 and δ = 0 has weight exactly −fl(α ψ/S),
        # so wmax ≥ |α ψ/S|; and |w| ≤ 2 |α| Δ is finite when |α| Δ ≤ 1e300. If that lower bound
        # passes for every instance, ok is all true, as the exact test would say.
        lower = a_psi.abs_().amax(dim=-1)
        if self._thr_bounded is not None:  # logistic: |α| ≤ 1, a constant threshold bounds the exact one
            thr = self._thr_bounded
            sure = lower >= thr
        else:
            amax_alpha = alpha.abs().amax(dim=-1)
            thr = torch.mul(amax_alpha, self._kappa_delta).clamp_min_(self.FAST_MIN_WEIGHT)
            sure = (lower >= thr) & (amax_alpha.mul_(self.delta_bound) <= 1e300)
        wmax = None
        if bool(sure.all()):
            ok = None  # every instance certified
        else:
            wmax = self._abs_max(w)
            ok = (wmax >= thr) & (wmax < math.inf)
        if self._mixed is not None:  # mixed-magnitude instances: the log-domain path only (_init_mixed)
            ok = ~self._mixed if ok is None else ok & ~self._mixed
        G = self._gradient_sum(w, self.Xt, self.zB, self._y)
        nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
        # Σ G² is exact to rounding when ||G|| is in [NORM_SAFE⁻¹, NORM_SAFE] (squares ≤ 1e280 cannot
        # overflow; the squares that underflow are < 1e-308 each, < 1e-26 relative to ||G||² ≥ 1e-280):
        # the common case, one pass over G. Otherwise the scaled norm below (instances not ``ok`` are
        # recomputed by the log-domain path and do not count). NaN fails the test.
        log_nrm = torch.log(nrm)
        in_range = log_nrm.abs() <= self._LOG_NORM_SAFE
        # Cancellation (as grad.normalized_risk_grad_of): ||G|| must exceed the rounding level of its
        # own sum, C·nT·eps·Σ_it |w_it| ||x_it|| ||z_i||. Cheap sufficient test first, on (B, n)
        # arrays: Σ_t |w_it| ≤ |α_i| (S_i Δ_b + |ψ_i|) = |α_i| S_i (Δ_b + |ψ_i/S_i|).
        bound = (alpha.abs() * S).mul_(psi_s.abs().add_(self.delta_bound.view(B, 1)))
        # ... plus the values' rounding (grad.py's value-error term), bounded by
        # 4·d·eps·Σ_i |ℓ'_i| N_i max_t m_it max_t ||x_it|| ||z_i||, |ℓ'_i| N_i = |α_i| nsum_i
        # (see _value_bound_log for the derivation).
        ve_ub = (alpha.abs() * nsum).mul_(self._ve_const).sum(dim=-1).mul_(CANCELLATION_FACTOR)  # 8·VE bound
        clear = nrm > self._cancel_rtol * bound.mul_(self._xz_max).sum(dim=-1) + ve_ub
        good = in_range & clear
        if bool((good if ok is None else good | ~ok).all()):
            return G, nrm.reciprocal_(), log_nrm.sub_(self.log_n), ok, None
        log2_scale = torch.zeros_like(nrm)
        if not bool((in_range if ok is None else in_range | ~ok).all()):
            # Scale G by 2^−e (exact) with wmax = m·2^e before the norm: Σ G² would underflow for
            # weights below ~1e-154 (and overflow above ~1e154); the scaled G is O(1).
            if wmax is None:
                wmax = self._abs_max(w)
            e = torch.frexp(wmax if ok is None else torch.where(ok, wmax, torch.ones_like(wmax))).exponent
            G.mul_(torch.ldexp(torch.ones_like(wmax), -e).view(B, 1, 1))
            nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
            log2_scale = e.to(nrm.dtype)
            log_nrm = torch.log(nrm)
        # the exact rounding level, in the same scale as G (w is not needed any more)
        e2 = -log2_scale.to(torch.int32)
        level = torch.ldexp(self._rounding_level(w, self._xz), e2)
        cancelled = ~(nrm > level + torch.ldexp(ve_ub, e2))
        if ok is not None:
            cancelled &= ok
        if bool(cancelled.any()):
            # the cheap value bound does not clear: the exact value-rounding term, O(T²), for those only
            idx = torch.nonzero(cancelled).squeeze(1)
            ve = self._value_error(
                l.index_select(1, idx),
                idx,
                torch.log(alpha.abs() * S).index_select(0, idx),
                log2_scale.index_select(0, idx) * math.log(2.0),
            )
            cancelled[idx] = ~(nrm[idx] > level[idx] + CANCELLATION_FACTOR * ve)
        return G, nrm.reciprocal(), log_nrm + log2_scale * math.log(2.0) - self.log_n, ok, cancelled

    def _direction_log(self, l: Any, idx: Any | None = None, y: Any | None = None) -> tuple[Any, Any, Any]:
        """Log-domain direction of the instances in ``l`` (``(T, k, n)``), exact under underflow.

        ``idx`` (``(k,)``): the instances of the batch that ``l`` holds, ``None`` for all of them.
        Returns ``(D, log_norm, cancelled)`` (``cancelled`` as in :meth:`_direction_fast`).

        Organised around a selected token ``r_i = argmax_t l_it`` so that it costs ``O(T)`` per
        sequence instead of ``O(T²)``. With scores ``γ_it = Y_i a_it``, ``δ_it = γ_it − γ_ir``, the
        set ``Z_i = {t : δ_it = 0}`` of tokens scoring exactly like the selected one (``r`` and its
        exact duplicates), the runner-up logit among the others ``l'_i = max_{u∉Z} l_iu``,
        ``E_iu = e^{l_iu − l'_i}`` (``u ∉ Z``), ``ψ_i = Σ_{u∉Z} E_iu δ_iu`` and
        ``m_i = l'_i − lse_i = log s_i at l'``:

            Y_i (a_it − f_i) = Σ_u s_iu (γ_it − γ_iu) = δ_it − e^{m_i} ψ_i     (t ∉ Z)
            Y_i (a_it − f_i) = −e^{m_i} ψ_i   (t ∈ Z),      Y_i f_i = γ_ir + e^{m_i} ψ_i,

        and ``w_it = ℓ'_i Y_i s_it (a_it − f_i) = −sign(ℓ'_i) A_i c_it`` with
        ``A_i = |ℓ'_i| e^{m_i}`` and ``c_it = E_it (e^{m_i} ψ_i − δ_it)`` (``t ∉ Z``),
        ``c_it = s_it ψ_i`` (``t ∈ Z``): the factor that underflows, ``A_i``, is kept as a
        logarithm and the largest of each instance is factored out before it is exponentiated;
        ``c`` is O(δ), or negligible where ``E_it`` underflows. (Taking the runner-up among all ``u ≠ r``
        would pick an exact duplicate of ``r``, whose ``δ = 0``, and lose every other weight to
        underflow: a zero gradient where the true one is ~e^{−(l_r − l')}.) ``lse`` uses the
        runner-up among all ``u ≠ r``. If every token scores alike, ``ψ = 0`` and the gradient is
        exactly 0.
        """
        torch = self.torch
        B = l.shape[1]
        mixed = self._mixed is not None  # per-sequence scaled data (see _init_mixed)
        if idx is None:
            Xt, gamma, zB, xz = self.Xt, self.gamma, self.zB, self._xz
            log_ve_const, xz_max, cls = self._log_ve_const, self._xz_max, self._cls
            if mixed:
                Xt, gamma, zB, xz = self._Xs, self._gamma_s, self._zs, self._xz_s
                live, sigma, kg1, kg2 = self._live_bn, self._sigma, self._kg_f1, self._kg_f2
                on = self._mixed
        else:
            Xt, gamma, zB = self.Xt.index_select(2, idx), self.gamma.index_select(1, idx), self.zB[idx]
            xz, log_ve_const, xz_max = (
                self._xz.index_select(1, idx),
                self._log_ve_const[idx],
                self._xz_max[idx],
            )
            cls = self._cls.index_select(1, idx)
            if mixed:
                Xt, gamma, zB = (
                    self._Xs.index_select(2, idx),
                    self._gamma_s.index_select(1, idx),
                    self._zs[idx],
                )
                xz = self._xz_s.index_select(1, idx)
                live, sigma = self._live_bn[idx], self._sigma[idx]
                kg1, kg2 = self._kg_f1[idx], self._kg_f2[idx]
                on = self._mixed.index_select(0, idx)  # type: ignore[union-attr]  # not None: mixed
        lr, r = torch.max(l, dim=0)  # selected token r (a first maximiser) and its logit
        r0 = r.unsqueeze(0)  # (1, B, n): index of the selected token, for scatter/gather
        g_r = gamma.gather(0, r0)  # (1, B, n): score of the selected token
        delta = gamma - g_r  # exactly 0 on Z
        in_z = delta == 0
        allowed = self._allowed
        masked = allowed is not None
        if allowed is not None:
            # a masked token (logit −inf, zero key: γ = 0) is not in Z even where γ_ir = 0; a sequence with
            # one allowed token has no runner-up (l' = −inf): its reference is shifted by 0, not by −inf
            # (−inf − (−inf) = NaN), so that E = 0, ψ = 0, m = −inf and its weights are exactly 0
            in_z &= allowed if idx is None else allowed.index_select(1, idx)
        # Z = {r} in every sequence (the usual case, one reduction to know): scatter at r instead of
        # masks over (T, B, n), fewer passes; otherwise the masked form below.
        single = bool(in_z.sum() == in_z[0].numel())
        lm = l.scatter(0, r0, -math.inf)  # the logits of u ≠ r
        if single:
            l1 = lm.amax(dim=0)  # runner-up (outside Z = {r})
            Z = lm.sub_(torch.where(torch.isfinite(l1), l1, 0.0) if masked else l1)  # l_u − l' ≤ 0, −inf at r
            E = torch.exp(Z)  # the runner-up's is 1: the weights that matter do not underflow
            sum_nr = E.sum(dim=0)  # Σ_{u≠r} e^{l_u − l'} ≥ 1
            lse = torch.log1p(torch.exp(l1 - lr) * sum_nr)  # lse_i − l_ir = log Σ_t e^{l_t − l_r}
            # log N_i = log Σ_{u ∉ dup(r)} s_iu: Z = {r}, so r has no duplicate (a copy scores alike)
            log_nd = (l1 - lr - lse) + torch.log(sum_nr)
        else:
            l2 = lm.amax(dim=0)  # runner-up among all u ≠ r, for lse (Σ ≥ 1: no underflow)
            sum_nr = lm.sub_(torch.where(torch.isfinite(l2), l2, 0.0) if masked else l2).exp_().sum(dim=0)
            lse = torch.log1p(torch.exp(l2 - lr) * sum_nr)
            if self._has_dup:  # the weight outside r's exact duplicates, as a log-sum-exp
                outside = torch.where(cls != cls.gather(0, r0), l, -math.inf)
                log_nd = torch.logsumexp(outside, dim=0) - lr - lse
            else:
                log_nd = (l2 - lr - lse) + torch.log(sum_nr)
            lo = torch.where(in_z, -math.inf, l)  # the logits outside Z
            l1 = lo.amax(dim=0)  # −inf when every token scores alike
            Z = lo.sub_(torch.where(torch.isfinite(l1), l1, torch.zeros_like(l1)))  # −inf on Z
            E = torch.exp(Z)
        psi = (E * delta).sum(dim=0)  # Σ_{u∉Z} E_u δ_u
        m = l1 - lr - lse  # log s at l' (−inf when every token scores alike: ψ = 0 then)
        em = torch.exp(m)
        # Cancellation-free margin: Y_i f_i = γ_ir + Σ_u s_iu δ_iu = γ_ir + e^{m_i} ψ_i.
        u = g_r.squeeze(0) + em * psi
        if mixed:
            u = u * kg1 * kg2  # in the true units: γ = 2^kg γ' (exact; 1·1 off the mixed instances)
        sign_l, log_l = self._signed_log_dl(u)
        # w_it = −sign(ℓ'_i) A_i c_it with A_i = |ℓ'_i| e^{m_i}, the only factor that can underflow
        # (kept as its log, the instance scaled by its largest A: e^{log A_i − top_b} ≤ 1), and
        # c_it = E_it (e^{m_i} ψ_i − δ_it) off Z (s_it = E_it e^{m_i}), c_it = s_it ψ_i on Z (s ≤ 1,
        # e^{−lse} at r). Each c is O(Δ) or negligible (an E_u that underflows is below 1e-300 of the
        # runner-up's and of the rounding of the sum it enters).
        log_a = log_l + m
        wsc = torch.sub(em * psi, delta, out=delta).mul_(E)  # E (e^{m} ψ − δ), 0 on Z (E = 0 there)
        if single:
            wsc.scatter_(0, r0, (torch.exp(-lse) * psi).unsqueeze(0))  # s_r ψ
        else:
            s_z = torch.exp(l - (lr + lse).unsqueeze(0))  # s_t, needed on Z only
            wsc = torch.where(in_z, s_z.mul_(psi), wsc)
        if mixed:
            # each sequence's data scale 2^(kg + kx + kz) (0 off the mixed instances), and the size of its
            # largest term c'·||x'|| ||z'|| (a sequence's weight may sit on tokens far smaller than its
            # largest): the largest term, not the largest A, is factored out, so no term that matters
            # underflows. c' is scaled by 2^−k (k ≥ −MIXED_UP: c'·2^−k stays finite), log A raised by k ln 2.
            log_a = log_a + sigma + self._term_scale_(wsc, xz, on)
        if self._any_dead:  # dead sequences (z_i = 0) do not set the scale (see __init__)
            log_a = torch.where(live if mixed else xz_max > 0, log_a, -math.inf)
        top = log_a.amax(dim=-1)  # (B,)
        top_safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        fac = torch.exp(log_a - top_safe.unsqueeze(-1))  # (B, n), ≤ 1
        if sign_l is not None:
            fac.mul_(-sign_l)  # the minus sign is sign(ℓ') = −1 of a decreasing loss
        wsc.mul_(fac)
        G = self._gradient_sum(wsc, Xt, zB, y)
        # c is O(δ), the size of the token values: tiny values (≲ 1e-154) would underflow Σ G² to 0
        # and read as a cancellation. Scale G by 2^−e with max|G| = m·2^e first (exact), and the
        # rounding level with it; e = 0 where G = 0.
        e = torch.frexp(G.abs().amax(dim=(1, 2))).exponent
        G.mul_(torch.ldexp(torch.ones_like(top), -e).view(B, 1, 1))
        nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
        # below the rounding level of its own sum (scaled as G): noise, not a direction; G's units are
        # e^{−offset} times the true ones (the values' rounding term is formed in the same units)
        offset = top_safe + e.to(top.dtype) * math.log(2.0)
        level = torch.ldexp(self._rounding_level(wsc, xz), -e)
        ve_ub = self._value_bound_log(log_l, log_nd, log_ve_const, offset)
        cancelled = ~(nrm > level + CANCELLATION_FACTOR * ve_ub)
        if bool(cancelled.any()):
            # the cheap value bound does not clear: the exact value-rounding term, O(T²), for those only
            sub = torch.nonzero(cancelled).squeeze(1)
            ve = self._value_error(
                l.index_select(1, sub),
                sub if idx is None else idx[sub],
                log_l.index_select(0, sub),
                offset.index_select(0, sub),
            )
            cancelled[sub] = ~(nrm[sub] > level[sub] + CANCELLATION_FACTOR * ve)
        D = G.mul_(nrm.reciprocal().view(B, 1, 1))  # NaN only for a zero gradient (reported as cancelled)
        return D, top + torch.log(nrm) + e.to(nrm.dtype) * math.log(2.0) - self.log_n, cancelled

    #: Largest upward scaling of a mixed sequence's ``c'`` (:meth:`_term_scale_`): ``|c'| ≤ 2d``, so
    #: ``c'·2^MIXED_UP`` ≤ 2d·1e301 is finite.
    MIXED_UP = 1000

    def _term_scale_(self, c: Any, xz: Any, on: Any) -> Any:
        """Scale ``c`` (``(T, k, n)``, the log path's ``c'`` on mixed data) in place by ``2^−k_i`` per
        sequence, ``k_i = ⌊log2 max_t |c'_it| ||x'_it|| ||z'_i||⌋`` (clipped to ``[−MIXED_UP, 0]``; 0 for a
        sequence without a term, and on the instances that are not mixed, ``on`` (k,) false: those run as
        in a batch without mixed data, bit for bit), so that its largest term is in ``[1, 2)``; returns
        ``k_i ln 2``, ``(k, n)``. Formed from logarithms (the product may underflow); exact (powers of two)."""
        torch = self.torch
        lt = (torch.log(c.abs()) + torch.log(xz)).amax(dim=0)  # −inf where the sequence has no term
        ok = torch.isfinite(lt) & on.view(-1, 1)
        k = torch.where(ok, torch.floor(lt / _LN2), 0.0).clamp_(-self.MIXED_UP, 0.0)
        c.mul_(torch.pow(2.0, -k).unsqueeze(0))
        return k * _LN2

    def _value_bound_log(self, log_dl: Any, log_nd: Any, log_ve_const: Any, offset: Any) -> Any:
        """Upper bound of the values' rounding term, per instance, in units of ``e^offset``: ``(k,)``.

        The single form's term (grad._log_grad) is ``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u∉dup(t)} s_iu
        (m_it + m_iu) ||x_it|| ||z_i||`` (``dup(t)``: the exact copies of token t, itself included).
        With ``N_i = Σ_{u∉dup(r)} s_iu`` for any token r: ``Σ_t s_t Σ_{u∉dup(t)} s_u ≤ 2 N_i`` (the
        tokens of dup(r) carry ≤ 1 of weight, each with N_i outside; the others carry N_i, each
        with ≤ 1 outside), so ``VE ≤ 4·d·eps·Σ_i |ℓ'_i| N_i max_t m_it max_t ||x_it|| ||z_i||``
        (``log_ve_const`` holds the logarithm of everything but ``|ℓ'_i| N_i``). Formed from
        logarithms (``N_i`` underflows once saturated; no term is ``+inf``, so no NaN); ``inf`` reads
        as "not clear".
        """
        return self.torch.exp(log_dl + log_nd + log_ve_const - offset.unsqueeze(-1)).sum(dim=-1)

    def _value_error(self, l: Any, idx: Any, log_dl: Any, offset: Any) -> Any:
        """The values' rounding term of grad._log_grad, exactly (``O(T²)``), in units of ``e^offset``.

        ``VE_b = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (m_it + m_iu) ||x_it|| ||z_i||`` for the
        instances ``idx`` (logits ``l``, ``(T, k, n)``; ``log_dl = log|ℓ'_i|``, ``(k, n)``): the error
        that the rounding of each value ``a = vᵀx`` (``±d·eps·m``) carries into ``G``. A token and its
        exact copy have bitwise equal values and charge nothing. Overflow gives ``inf`` (refused).
        """
        torch = self.torch
        k = l.shape[1]
        Xt = self.Xt.index_select(2, idx)  # (T, d, k, n)
        amag = self.amag.index_select(1, idx)
        log_xz = self._log_xz.index_select(1, idx)  # exact for rows of any size (log(xz) where ordinary)
        log_s = torch.log_softmax(l, dim=0)
        different = (Xt.unsqueeze(1) != Xt.unsqueeze(0)).any(dim=2)  # (T, T, k, n): [t, u]
        pair = log_s.unsqueeze(0) + torch.log(amag.unsqueeze(1) + amag.unsqueeze(0))  # log s_u (m_t + m_u)
        log_mix = torch.logsumexp(pair.masked_fill(~different, -math.inf), dim=1)  # (T, k, n)
        lg = log_dl.unsqueeze(0) + log_s + log_mix + log_xz - offset.view(1, k, 1)
        lg = torch.nan_to_num(lg, nan=-math.inf)
        return torch.exp(lg).sum(dim=(0, 2)).mul_(self._d_eps)

    def _check_undetermined(self, W: Any, l: Any) -> None:
        """Set :attr:`undetermined`: the instances where the single form refuses ``ℓ'(Y_i f_i)``.

        As grad._output_spread / grad._refuse_undetermined: ``f_i`` is known only to ``±δf_i``,
        ``δf_i = [(T+d)·eps + 2δl_i]·Σ_t s_it |a_it|`` with the logits' rounding
        ``δl_i = d²·eps·max_t |x_it|ᵀ|W||z_i|``; ``ℓ'`` is undetermined where ``κ·δf_i > 1``
        (``κ = σ(u + δf)`` for the logistic loss, 1 otherwise), and the instance is refused when such a
        sequence's term, grown by ``e^{δf}``, is within ``e^{−NEGLIGIBLE_LOG}`` of the largest determined one.
        Cheap test first: ``δl_i ≤ d²·eps·||W||_F max_t ||x_it|| ||z_i||`` and ``Σ s|a| ≤ max|a|``; where that
        bound keeps ``δf ≤ ½`` (the common case, one small pass) nothing more is computed.
        """
        self.undetermined = None
        self.undetermined_detail = {}
        if not self._check_output:
            return
        torch = self.torch
        T, d = self.T, self.d
        wn = torch.linalg.vector_norm(W.reshape(W.shape[0], -1), dim=1)  # (B,)
        maybe = ~(torch.addcmul(self._df_c0, wn, self._df_c1) <= 0.5)  # δf ≤ ½ for sure; NaN: maybe
        if not bool(maybe.any()):
            return
        idx = torch.nonzero(maybe).squeeze(1)
        ls = l.index_select(1, idx)  # (T, k, n)
        Xt = self.Xt.index_select(2, idx)  # (T, d, k, n)
        zB, a, Y = self.zB[idx], self.a.index_select(1, idx), self.Y[idx]
        log_xz = self._log_xz.index_select(1, idx)  # exact for rows of any size (log(xz) where ordinary)
        log_s = torch.log_softmax(ls, dim=0)
        s = torch.exp(log_s)
        u = Y * (s * a).sum(dim=0)  # Y_i f_i (k, n)
        q = torch.bmm(W[idx].abs(), zB.abs().transpose(1, 2))  # |W||z_i|: (k, d, n)
        lmag = torch.einsum("tdki,kdi->tki", Xt.abs(), q).amax(dim=0)  # max_t |x_it|ᵀ|W||z_i|
        log_dl = torch.log(d * d * _EPS * lmag)
        log_m = torch.log((s * a.abs()).sum(dim=0))
        log_df = log_m + torch.logaddexp(
            torch.full_like(log_m, math.log((T + d) * _EPS)), math.log(2.0) + log_dl
        )
        df = torch.exp(log_df.clamp(max=700.0))
        if self.lo is logistic:
            log_k = -torch.logaddexp(torch.zeros_like(u), -(u + df))  # κ = σ(u + δf) ≤ 1
        else:
            log_k = torch.zeros_like(u)
        # each sequence's largest term log(|ℓ'_i| s_it |c_it| ||x_it|| ||z_i||), c_it = Σ_u s_iu (a_it − a_iu)
        # from its positive and negative parts (log-sum-exp: nothing underflows)
        diff = a.unsqueeze(1) - a.unsqueeze(0)  # [t, u]: a_t − a_u
        with torch.no_grad():
            terms = log_s.unsqueeze(0) + torch.log(diff.abs())
            log_p = torch.logsumexp(terms.masked_fill(~(diff > 0), -math.inf), dim=1)
            log_n = torch.logsumexp(terms.masked_fill(~(diff < 0), -math.inf), dim=1)
            hi, lo = torch.maximum(log_p, log_n), torch.minimum(log_p, log_n)
            log_c = torch.where(torch.isneginf(hi), hi, hi + torch.log1p(-torch.exp(lo - hi)))
            log_c = torch.nan_to_num(log_c, nan=-math.inf)
            _, log_l = self._signed_log_dl(u)
            size = (log_l.unsqueeze(0) + log_s + log_c + log_xz).amax(dim=0)  # (k, n)
        live = torch.isfinite(size)
        bad = (log_df + log_k > 0.0) & live
        if not bool(bad.any()):
            return
        best_ok = torch.where(live & ~bad, size, -math.inf).amax(dim=-1, keepdim=True)
        matter = bad & (size + df >= best_ok - NEGLIGIBLE_LOG)
        hit = matter.any(dim=-1)
        if not bool(hit.any()):
            return
        self.undetermined = torch.zeros(self.B, dtype=torch.bool, device=l.device)
        self.undetermined[idx[hit]] = True
        for j in torch.nonzero(hit).squeeze(1).tolist():
            i = int(torch.nonzero(matter[j])[0])
            self.undetermined_detail[int(idx[j])] = (i, float(df[j, i]))

    def _parts(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """``(G, inv, log_norm, cancelled)``: the direction of ``∇L(W_b)`` is ``G_b·inv_b`` (``G`` a reused buffer).

        The linear-domain fast path (:meth:`_direction_fast`) is tried first; the instances it
        cannot certify (a weight that matters left the normal range: ``||W||`` large, the
        gradient near or below underflow) are recomputed by the log-domain path
        (:meth:`_direction_log`, already normalized: ``inv = 1`` there), exact at any ``||W||``.
        Both agree to a few ulps wherever the fast path is accepted, so the switch, made per step
        and per instance, does not show in the iterates.
        """
        torch = self.torch
        B = self.B
        l = self.logits(W)
        use_log = not self.fast or self._all_mixed  # mixed data: log-domain only (see _init_mixed)
        if self.fast and self._log_streak > 0:
            self._log_streak -= 1
            use_log = True  # most of the batch was saturated a moment ago (see LOG_FRACTION)
        self._check_undetermined(W, l)  # the single form's undetermined-ℓ' refusal, per instance
        if use_log:
            self.stats["log"] += 1
            D, log_norm, cancelled = self._direction_log(l, None, self._y)
            return D, torch.ones_like(log_norm), log_norm, cancelled
        G, inv, log_norm, ok, cancelled = self._direction_fast(l)
        if ok is None or bool(ok.all()):
            self.stats["fast"] += 1
            return G, inv, log_norm, cancelled
        n_bad = B - int(ok.sum())
        if n_bad > self.LOG_FRACTION * B:
            self._log_streak = self.LOG_RETRY - 1
            self.stats["log"] += 1
            D, log_norm, cancelled = self._direction_log(l, None, self._y)
            return D, torch.ones_like(log_norm), log_norm, cancelled
        self.stats["mixed"] += 1
        idx = torch.nonzero(~ok).squeeze(1)
        D_s, ln_s, c_s = self._direction_log(l.index_select(1, idx), idx)
        G[idx] = D_s
        inv[idx] = 1.0
        log_norm[idx] = ln_s
        if cancelled is None:
            cancelled = torch.zeros_like(ok)
        cancelled[idx] = c_s
        return G, inv, log_norm, cancelled

    def direction(self, W: Any) -> tuple[Any, Any]:
        """Unit direction of ``∇L(W_b)`` and ``log||∇L(W_b)||``, shapes ``(B, d, d)`` and ``(B,)``.

        Same quantity as :func:`attnsvm.model._grad.normalized_risk_grad_of` (see :meth:`_parts` for
        the two paths), without its cancellation test (see :meth:`gradient`). The returned
        direction is a buffer of this engine, overwritten by the next call: use it (or copy it)
        before then.
        """
        G, inv, log_norm, _ = self._parts(W)
        return G.mul_(inv.view(self.B, 1, 1)), log_norm

    def gradient(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """``(G, inv, log_norm, cancelled)``: the direction is ``G·inv``, ``log_norm = log||∇L(W)||``.

        ``cancelled`` (B,) bool, or ``None`` for none: instances whose gradient is below the
        rounding level of its own sum or of the token values, where the direction is noise
        (``run_gd_batch`` raises, as :func:`run_gd` does). :attr:`undetermined` is set alongside:
        the instances whose loss derivative is undetermined (``run_gd_batch`` raises for those too).
        """
        return self._parts(W)

    def update_(self, W: Any, parts: tuple[Any, ...], lr: float, normalized: bool = True) -> Any:
        """Apply one GD step in place to ``W`` from ``parts = gradient(W)``; returns ``W``.

        Normalized: ``W ← W − η ∇L/||∇L||``; plain: ``W ← W − η ∇L`` (``∇L`` rebuilt from the
        direction and ``e^{log||∇L||}``, 0 once it underflows). One fused in-place pass over
        ``(B, d, d)``: the direction is never materialised and nothing of that size is allocated.
        """
        G, inv, log_norm = parts[:3]
        if normalized:
            scale = inv.mul_(-lr)
        else:
            # η·||∇L|| as one exponential (e^{log||∇L|| + log η}): neither factor alone may be a
            # double when the data are far from unit scale (||∇L|| ~ 2^k), their product is
            scale = inv.mul_(self.torch.exp(log_norm + math.log(lr)).neg_())
            zero = log_norm == -math.inf  # ∇L = 0 exactly: no step (its "direction" 0·∞ is NaN)
            if bool(zero.any()):
                G[zero] = 0.0
                scale[zero] = 0.0
        return W.addcmul_(G, scale.view(self.B, 1, 1))

    def step_(self, W: Any, lr: float, normalized: bool = True) -> Any:
        """One GD step of every instance, in place on ``W``; returns ``log||∇L(W_b)||`` before the step."""
        parts = self._parts(W)
        self.update_(W, parts, lr, normalized)
        return parts[2]

    def risk(self, W: Any) -> Any:
        _, log_s = self.log_s(W)
        f = (self.torch.exp(log_s) * self.a).sum(dim=0)
        return self.lo.value(self.Y * f).mean(dim=-1)


def _undetermined_message(i: int, df: float) -> str:
    """The single form's undetermined-ℓ' message (grad._refuse_undetermined), for sequence ``i``."""
    return (
        f"the output f_{i} = Σ_t s_it vᵀx_it is known only to ±{df:.3g} (values of both signs "
        "cancel under rounded weights): the loss derivative ℓ'(Y_i f_i) is undetermined in float64 "
        "(its relative error e^{δf} − 1 exceeds 1). Rescale v, or use the correlation loss"
    )


def run_gd_batch(
    instances: Sequence[Instance],
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    loss: "str | LossLike" = "logistic",
    device: Any = None,
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    fast_path: bool = True,
) -> BatchTrajectory:
    """Run GD on ``B`` equal-shaped instances at once, in one torch float64 computation.

    Each instance follows exactly the update of :func:`run_gd` (normalized
    ``W ← W − η∇L/||∇L||_F`` or plain ``W ← W − η∇L``), with closed-form gradients (no autograd)
    in cancellation-free form, so results equal :func:`run_gd` to ~1e-8 relative or better. Each
    step uses a linear-domain fast path for the instances whose weights are all representable and
    the log-domain form of the core for the others (chosen per step and per instance; the two
    agree to ~1e-14), so the direction stays exact after the gradient underflows. Plain GD whose
    gradient underflows keeps stepping (the update is then inexact) and reports the first such
    step in ``saturated_at``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Token masks (:attr:`Instance.mask`) are supported, as in :func:`run_gd`: a masked token takes no
    part (weight exactly 0, never selected in ``tokens``, no part in any scale, bound or refusal), so
    each instance runs as the instance with its masked tokens deleted. Instances of one batch may have
    different masks, or none (masked and unmasked instances mix, e.g. the causal and the plain
    :meth:`Instance.from_sequences` instances of one ``(n, T, d)``); the engine reads the keys
    (:attr:`Instance.keys`) and sets the masked logits to ``−inf``. A batch without any mask runs the
    unmasked engine unchanged.

    Args:
      instances: a sequence of ``B`` :class:`Instance` of one shape ``(n, T, d)``, masked or not.
      steps, lr, normalized, loss: as :func:`run_gd`.
      device: ``None``/``"cpu"`` or ``"cuda"`` (raises if CUDA is unavailable).
      W0: initial matrices, shape ``(d, d)`` (shared) or ``(B, d, d)``; default zeros.
      record_at: as :func:`run_gd`.
      reference: reference directions, ``(d, d)`` or ``(B, d, d)``.
      fast_path: ``False`` forces the log-domain path at every step (the two paths agree; this
        is for testing and timing them separately).

    Returns:
      :class:`BatchTrajectory` (NumPy arrays; ``W`` has shape ``(B, d, d)``).

    Refusals: the single form's, per instance and step. At a step whose direction is refused —
    its contributions cancel to the rounding level of their own sum or of the token values
    (normalized GD), or ``ℓ'(Y_i f_i)`` is undetermined (either update) — raises
    :class:`~attnsvm.NumericalError` ``"<normalized|plain> GD at step t: instance b: <the single form's
    message>"``, ``t`` the iterate whose gradient was refused (:func:`run_gd` numbers it ``t + 1``, the
    iterate it was building).

    Scale: as :func:`run_gd` (each instance rescaled by its own powers of two; the same errors, per
    instance, at record steps and where a step fails); an instance whose sequences differ wildly in size
    (keys or query below 2^−64, or terms ``a·x zᵀ`` beyond 2^±800) runs the log-domain path on each
    sequence scaled by its own powers of two, as the single form does (``_TorchBatch._init_mixed``); agrees with :func:`run_gd` to ~1e-8 relative
    (measured ≤ 1e-13) at every scale where float64 determines the direction (the rounding of the
    values and logits moves it by less than 1e-11), and refuses where :func:`run_gd` does.

    Conditioning: the agreement of whole trajectories also needs an iteration that does not amplify
    rounding. The two engines' directions at the same ``W`` agree to ~1e-13 at every step, but at large
    ``lr`` normalized GD can amplify a 1-ulp difference of an iterate exponentially: on 4×6×8 random
    instances at ``lr = 2`` (and on some at ``lr = 0.5``), :func:`run_gd` itself started from ``W_10``
    and from ``W_10·(1 + 2^−52)`` ends 1e-3 … 1e-2 apart after 300 steps, and the batched and single runs
    separate likewise. There, compare directions at given ``W`` (:func:`attnsvm.normalized_risk_grad`), not runs.
    """
    require("torch", feature="run_gd_batch (the batched torch engine)")  # pragma: no mutate
    import torch

    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    dev = _torch_device(device)
    X, Y, z, v, kb, allowed = _stack_instances(instances, rescale=True, masks=True)
    B, n, T, d = X.shape
    W0a = _batch_matrices(W0, B, d, "W0")
    ref = _batch_matrices(reference, B, d, "reference")
    if ref is not None:
        zero = np.flatnonzero(~np.any(ref.reshape(B, -1) != 0, axis=1))
        if zero.size:
            raise InvalidInstanceError(f"reference[{zero[0]}] is the zero matrix; it has no direction")
    if W0a is not None:
        for b in range(B):
            _check_iterate(W0a[b], f"W0[{b}]")
    at = record_steps(record_at, steps)
    rec_set = {int(s) for s in at}
    # The engine runs on the rescaled data (see _Scaled): instance b's logits are x'ᵀ W'_b z' with
    # W'_b = W_b·2^k_b. The iterate stays in the user's scale (W_b: representable whenever the answer
    # is) and W' is formed from it before each step by exact powers of two (skipped when every k_b = 0).
    eng = _TorchBatch(X, Y, z, v, lo, dev, fast=fast_path, mask=allowed)
    W = (
        torch.zeros((B, d, d), dtype=torch.float64, device=dev)
        if W0a is None
        else torch.as_tensor(W0a, device=dev)
    )
    k_shift = torch.as_tensor(kb * _LN2, dtype=torch.float64, device=dev)  # log of 2^k_b
    factors = [torch.as_tensor(f, dtype=torch.float64, device=dev).view(B, 1, 1) for f in _pow2_factors(kb)]
    Wp = torch.empty((B, d, d), dtype=torch.float64, device=dev) if factors else None
    scales = [_rescale(it) for it in instances]  # the true data scale, for the logit-range check

    def logit_scale(Wc: Any) -> Any:
        if Wp is None:
            return Wc
        torch.mul(Wc, factors[0], out=Wp)
        for f in factors[1:]:
            Wp.mul_(f)
        return Wp

    def check_logits(Wc: Any, t: int) -> None:
        # the contract's error for logits out of range (else a NaN would read as a cancellation)
        Wn_ = Wc.cpu().numpy()
        for b in range(B):
            try:
                _to_logit_scale(scales[b], Wn_[b], f"W_{t}")
            except NumericalError as exc:
                raise NumericalError(f"step {t}: instance {b}: {exc}") from exc

    sat = torch.full((B,), -1, dtype=torch.int64, device=dev)
    log_tiny = math.log(_TINY)
    rec: dict[str, list[Any]] = {k: [] for k in ("steps", "norms", "risks", "tokens", "lg", "corrs", "gaps")}

    def check(t: int, log_norm: Any) -> None:
        # the direction G·inv is finite iff log||∇L|| is: a NaN/Inf gradient or a zero one shows there
        # (plain GD takes no step at a zero gradient and reports it in saturated_at instead)
        bad = ~torch.isfinite(log_norm) if normalized else torch.isnan(log_norm) | (log_norm == math.inf)
        if bool(bad.any()):
            check_logits(W, t)
            i = int(torch.nonzero(bad)[0])
            raise NumericalError(
                f"instance {i}: the risk gradient is exactly zero or not finite at or before step {t} "
                "(stationary W or a custom loss that overflows); its normalized direction is undefined"
            )

    W = W.clone()  # the iterate, updated in place (W0 stays untouched)
    for t in range(0, steps + 1):
        if t < steps or t in rec_set:
            parts = eng.gradient(logit_scale(W))  # at W_t: direction G·inv, log||∇_{W'} L(W'_t)||
            log_norm1 = parts[2]  # of the rescaled problem: scale-free (saturation test)
            log_norm = log_norm1 + k_shift  # log||∇L(W_t)|| = log||∇_{W'}L|| + k log 2
            cancelled = parts[3]
            if eng.undetermined is not None and bool(eng.undetermined.any()):
                # the single form's refusal (grad._refuse_undetermined), for either update
                check_logits(W, t)
                b = int(torch.nonzero(eng.undetermined)[0])
                i, df = eng.undetermined_detail[b]
                kind = "normalized" if normalized else "plain"
                raise NumericalError(f"{kind} GD at step {t}: instance {b}: {_undetermined_message(i, df)}")
            if normalized and cancelled is not None and bool(cancelled.any()):
                check_logits(W, t)
                i = int(torch.nonzero(cancelled)[0])
                raise NumericalError(f"normalized GD at step {t}: instance {i}: {CANCELLED_MESSAGE}")
        if t in rec_set:
            if not bool(torch.isfinite(W).all()):  # first: a diverged W also makes the gradient non-finite
                check_logits(W, t)
                raise NumericalError(f"plain GD diverged by step {t}: W became non-finite; lower lr")
            check(t, log_norm)
            check_logits(W, t)  # the logit bound of run_gd, at every record (the last step included)
            Wn = W.cpu().numpy().copy()
            for b in range(B):
                _check_iterate(Wn[b], f"the iterate W_{t} of instance {b}")
            logits, _ = eng.log_s(logit_scale(W))
            rec["steps"].append(t)
            rec["norms"].append(np.array([_fro(Wn[b]) for b in range(B)]))
            risk = eng.risk(logit_scale(W))
            if not bool(torch.isfinite(risk).all()):
                raise NumericalError(f"the risk is not finite at step {t}; check the loss")
            risk_np = risk.cpu().numpy()
            # A risk that reads 0 or subnormal may have underflowed in the engine's exp: take the
            # single form's exact value there (log-domain, refusing a risk below the normal range
            # as run_gd does) instead of recording a 0 whose truth is not 0.
            for b in map(int, np.flatnonzero(np.abs(risk_np) < FLOAT_TINY)):
                sc = scales[b]
                try:
                    Wb = _to_logit_scale(sc, Wn[b], f"W_{t}")
                    risk_np[b] = risk_of(sc.X, sc.Y, sc.z, sc.v, Wb, lo, **sc.mask_kw)
                except NumericalError as exc:
                    raise NumericalError(f"step {t}: instance {b}: {exc}") from exc
            rec["risks"].append(risk_np)
            rec["tokens"].append(logits.argmax(dim=0).cpu().numpy().astype(np.intp))
            rec["lg"].append(log_norm.cpu().numpy() / math.log(10.0))
            if ref is not None:
                nz = [bool(np.any(Wn[b] != 0)) for b in range(B)]
                rec["corrs"].append(
                    np.array([direction_corr(Wn[b], ref[b]) if nz[b] else math.nan for b in range(B)])
                )
                rec["gaps"].append(
                    np.array([direction_gap(Wn[b], ref[b]) if nz[b] else math.nan for b in range(B)])
                )
        if t < steps:
            if not normalized:
                # scale-free, as run_gd: the rescaled problem's gradient left the normal range
                newly = (log_norm1 < log_tiny) & (sat < 0)
                sat = torch.where(newly, torch.full_like(sat, t + 1), sat)
            # W_{t+1} in the user's scale (∇_W L = 2^k ∇_{W'} L); recording (above) does not touch G
            eng.update_(W, (parts[0], parts[1], log_norm), lr, normalized)
    return BatchTrajectory(
        W=W.cpu().numpy(),
        steps=np.array(rec["steps"], dtype=np.int64),
        norms=np.array(rec["norms"]),
        risks=np.array(rec["risks"]),
        tokens=np.array(rec["tokens"]),
        log10_grad_norms=np.array(rec["lg"]),
        corrs=np.array(rec["corrs"]) if ref is not None else None,
        gaps=np.array(rec["gaps"]) if ref is not None else None,
        saturated_at=sat.cpu().numpy(),
        normalized=bool(normalized),
        lr=lr,
        loss=_loss_name(lo),
        device=str(dev),
    )


# ================================================================ regularization path
class PathPoint(NamedTuple):
    """One point of a regularization path.

    Attributes:
      radius: ``R``.
      W: the stationary point found, ``||W||_F ≤ R``, shape ``(d, d)``.
      norm: ``||W||_F``.
      risk: ``L(W)``.
      tokens: selected tokens, shape ``(n,)``.
      corr, gap: ``corr(W/R, reference)`` and ``½||Ŵ − R̂||²`` (NaN without a reference).
      kkt_residual: ``||∇L/||∇L|| + W/||W|| ||_F`` when ``W`` is on the sphere (0 at a KKT point
        ``∇L = −μW``, ``μ ≥ 0``); ``nan`` if ``W`` is inside the ball (then the residual is the
        gradient itself, see ``log10_grad_norm``).
      log10_grad_norm: ``log10||∇L(W)||_F``.
      iterations: projected steps taken at this radius.
    """

    radius: float
    W: FloatArray
    norm: float
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    gap: float
    kkt_residual: float
    log10_grad_norm: float
    iterations: int


@dataclass
class RegularizationPath:
    """Result of :func:`regularization_path`: one :class:`PathPoint` per radius."""

    points: list[PathPoint] = field(default_factory=list)

    @property
    def radii(self) -> FloatArray:
        """Radii, shape ``(k,)``."""
        return np.array([p.radius for p in self.points])

    @property
    def corrs(self) -> FloatArray:
        """``corr(W_R/R, reference)``, shape ``(k,)``."""
        return np.array([p.corr for p in self.points])

    @property
    def gaps(self) -> FloatArray:
        """``½||Ŵ_R − R̂||²``, shape ``(k,)``."""
        return np.array([p.gap for p in self.points])

    @property
    def kkt_residuals(self) -> FloatArray:
        """KKT residuals, shape ``(k,)``."""
        return np.array([p.kkt_residual for p in self.points])


#: Relative change of the risk below which it counts as flat (4 ulps: the risk is a mean of
#: O(1) terms, each exact to ~1 ulp, so smaller changes are not resolved in float64).
_FLAT_RTOL = 4 * float(np.finfo(np.float64).eps)


def _project(W: FloatArray, R: float) -> FloatArray:
    nrm = _fro(W)  # scaled: ||W|| of entries ~1e±200 neither overflows nor underflows
    return W * (R / nrm) if nrm > R else W


class PathStep(NamedTuple):
    """One radius of :func:`projected_path`: the point, its risk, KKT residual (``inf`` inside the
    ball), its normalized gradient direction and the projected steps taken."""

    radius: float
    x: FloatArray
    risk: float
    residual: float
    grad: GradDirection
    iterations: int


def projected_path(
    x0: FloatArray,
    radii: FloatArray,
    risk: Callable[[FloatArray], float],
    direction: Callable[[FloatArray], GradDirection],
    max_steps: int,
    lr: float,
    tol: float,
) -> list[PathStep]:
    """Warm-started projected normalized GD ``x ← Π_R(x − η ∇L/||∇L||)`` over increasing radii.

    The shared engine of :func:`regularization_path` (``x = W``) and of the prompt-attention path
    (``x = p``). Each radius starts from the previous point rescaled onto the new sphere, with
    ``η = lr · R``; a step is kept when it lowers the risk (and does not multiply the KKT residual
    ``||∇L/||∇L|| + x/R||`` by more than 10; a step into the ball, where that residual is not
    defined, is judged on the risk alone) or, once the risk change is below float64 resolution
    (at large ``R`` it is ~``e^{−R·margin}``), when it lowers the residual; then
    ``η ← min(1.25η, lr·R)``, otherwise ``η ← η/2``. A radius stops at ``tol``, ``max_steps`` or
    ``η ≤ 1e-15·R``. (Keeping steps on the residual alone, with the first step of each radius
    accepted unchecked from inside the ball, could jump basins between radii and stall at
    residuals 1e-3..0.4.)
    """

    def residual(xc: FloatArray, R: float, dc: FloatArray) -> float:
        nrm = _fro(xc)
        if nrm < R * (1 - 1e-12) or nrm == 0:
            return math.inf  # interior, non-stationary (∇L ≠ 0): keep moving
        return float(np.linalg.norm(dc + xc / nrm))

    x = x0
    out: list[PathStep] = []
    for R in (float(r) for r in radii):
        nrm0 = _fro(x)
        # Warm start *on the new sphere* (the previous point rescaled): the constrained minimiser
        # lies on the sphere (∇L ≠ 0), and a start inside the ball has an infinite residual, so
        # its first step would be accepted unchecked and could jump to another basin.
        x = x * (R / nrm0) if nrm0 > 0 else x
        gd = direction(x)
        res = residual(x, R, gd.direction)
        rsk = risk(x)
        eta = lr * R
        it = 0
        while it < max_steps and res > tol and eta > 1e-15 * R:
            it += 1
            xn = _project(x - eta * gd.direction, R)
            rk = risk(xn)
            gn = direction(xn)
            rn = residual(xn, R, gn.direction)
            # Accept a descent step on the risk (unless it multiplies the residual by > 10); once
            # the risk change is below float64 resolution (it is ~e^{−R·margin} at large R),
            # accept a step that lowers the KKT residual. Inside the ball (residual ∞: from 0,
            # or where the risk decreases inward, e.g. gaussian seed 1 at R = 8-16) only the risk
            # decides.
            flat = abs(rk - rsk) <= _FLAT_RTOL * abs(rsk)
            if (rk < rsk and (rn < 10 * res or math.isinf(res) or math.isinf(rn))) or (flat and rn < res):
                x, gd, res, rsk = xn, gn, rn, rk
                eta = min(eta * 1.25, lr * R)
            else:
                eta *= 0.5
        out.append(PathStep(R, np.array(x), rsk, res, gd, it))
    return out


def regularization_path(
    inst: Instance,
    radii: ArrayLike,
    *,
    loss: "str | LossLike" = "logistic",
    reference: ArrayLike | None = None,
    max_steps: int = 2000,
    lr: float = 0.1,
    tol: float = 1e-10,
    W0: ArrayLike | None = None,
) -> RegularizationPath:
    """Approximate ``W_R = argmin_{||W||_F ≤ R} L(W)`` for increasing ``R`` (warm-started).

    Projected normalized GD ``W ← Π_R(W − η ∇L/||∇L||)`` with an adaptive step, warm-started on
    each new sphere (:func:`projected_path` gives the acceptance rule). The direction is the
    log-domain one, so large ``R`` still works.

    The risk is not convex in ``W``: what this finds is a path of *stationary points* of the
    constrained problems (KKT residual reported per point), not certified global minimisers.
    Tarzanagh et al. show ``W_R/R → W_mm/||W_mm||`` along the global path; the harness reports
    ``corr(W_R/R, reference)`` to test it.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (regularization path);
    Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

    Args:
      inst: the data.
      radii: increasing positive finite radii, shape ``(k,)``.
      loss: loss name or object.
      reference: ``(d, d)`` reference direction.
      max_steps: projected steps per radius, ≥ 1.
      lr: initial step as a fraction of ``R``, > 0.
      tol: KKT residual at which a radius is done.
      W0: start for the first radius (default zeros; a nonzero ``W0`` is rescaled onto the first
        sphere, like every warm start).

    Returns:
      :class:`RegularizationPath`.

    Scale: as :func:`run_gd`: radii ``R·2^−(a+b)`` on ``X·2^a``, ``z·2^b``, ``v·2^−a`` give exactly
    ``W_R·2^−(a+b)``; the largest radius must keep the logits below ``1.8e308/(4d²)`` and the
    smallest must be a normal double (else :class:`~attnsvm.NumericalError`, before any work).

    Token masks (:attr:`Instance.mask`): supported, as in :func:`run_gd`.
    """
    inst = check_instance(inst)
    R_all = as_real_array(radii, "radii", ndim=1)
    if R_all.size == 0 or np.any(R_all <= 0) or np.any(np.diff(R_all) <= 0):
        raise AttnSVMError("radii must be a non-empty, strictly increasing list of positive radii")
    max_steps = check_int(max_steps, "max_steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    try:
        tol = float(tol)
    except (TypeError, ValueError):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}") from None
    if not (math.isfinite(tol) and tol >= 0):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}")
    lo = get_loss(loss)
    ref = _check_reference(inst, reference)
    W = _check_iterate(_initial_W(inst, W0), "W0")
    sc = _rescale(inst)
    # The path stays in the user's scale (radii, W); risk and direction come from the rescaled
    # data at W' = W·2^k (see _Scaled), so neither overflows nor underflows with the data's scale.
    # The largest radius must keep the logits finite: checked before any work.
    _to_logit_scale(sc, np.full((1, 1), float(R_all[-1])), "W (||W||_F = the largest radius)")
    if float(R_all[0]) < FLOAT_TINY:
        raise range_error(
            "the smallest radius", math.log(float(R_all[0])), remedy="Radii must be normal doubles"
        )
    steps = projected_path(
        W,
        R_all,
        lambda Wc: risk_of(sc.X, sc.Y, sc.z, sc.v, _to_logit_scale(sc, Wc), lo, **sc.mask_kw),
        lambda Wc: _direction(sc, Wc, lo),
        max_steps,
        lr,
        tol,
    )
    path = RegularizationPath()
    for st in steps:
        # A point whose largest entry is below the normal range has lost digits (the path runs in the
        # user's scale): refused like any iterate, not returned rounded.
        W = st.x
        top = float(np.max(np.abs(W), initial=0.0))
        if 0.0 < top < FLOAT_TINY:
            raise range_error(
                f"the path point W at radius {st.radius:.3g} (its largest entry)",
                math.log(top),
                remedy="Scale the radii with the data: X·2^a, z·2^b is the same path at radii·2^−(a+b)",
            )
        nrm = _fro(W)
        on_sphere = nrm >= st.radius * (1 - 1e-12)
        path.points.append(
            PathPoint(
                radius=st.radius,
                W=W,
                norm=nrm,
                risk=st.risk,
                tokens=np.argmax(logits_of(sc.X, sc.z, _to_logit_scale(sc, W), **sc.mask_kw), axis=1).astype(
                    np.intp
                ),
                corr=direction_corr(W, ref) if ref is not None else math.nan,
                gap=direction_gap(W, ref) if ref is not None else math.nan,
                kkt_residual=st.residual if on_sphere else math.nan,
                log10_grad_norm=st.grad.log_norm / math.log(10.0),
                iterations=st.iterations,
            )
        )
    return path


# ===================================================================== W = K Qᵀ engine
@dataclass
class KQTrajectory(GDTrajectory):
    """Result of :func:`run_gd_kq`: a :class:`GDTrajectory` of ``W = K Qᵀ`` plus the factors.

    Attributes (beyond :class:`GDTrajectory`):
      K, Q: final factors, shape ``(d, m)``.
      nuclear_norms: ``||W_t||_*`` at the recorded steps, shape ``(k,)``.
    """

    K: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    Q: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    nuclear_norms: FloatArray = field(default_factory=lambda: np.zeros(0))


def _nuclear(W: FloatArray) -> float:
    """``||W||_*`` from ``W`` scaled by a power of two (the SVD squares nothing, but its iteration does
    not like entries near the ends of the range)."""
    e = pow2_exponent(W)
    s = float(np.sum(np.linalg.svd(ldexp_scale(W, e), compute_uv=False)))
    if s > 0 and math.log(s) + e * _LN2 > LOG_FLOAT_MAX:
        raise range_error("the nuclear norm ||W||_*", math.log(s) + e * _LN2)
    return float(np.ldexp(s, e))


def run_gd_kq(
    inst: Instance,
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    loss: "str | LossLike" = "logistic",
    K0: ArrayLike | None = None,
    Q0: ArrayLike | None = None,
    m: int | None = None,
    init_scale: float = 0.1,
    seed: int = 0,
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
) -> KQTrajectory:
    """GD on the factors of ``W = K Qᵀ`` (``K, Q ∈ ℝ^{d×m}``).

    Gradients ``∇_K L = ∇L(W) Q`` and ``∇_Q L = ∇L(W)ᵀ K`` (simultaneous update). Normalized GD
    divides the pair by its joint Frobenius norm ``(||∇_K||² + ||∇_Q||²)^{1/2}``; since
    ``∇L(W) = e^{log_norm} D`` with the core's log-domain unit direction ``D``, the joint
    direction ``(DQ, DᵀK)/||(DQ, DᵀK)||`` stays exact when ``∇L`` underflows. Plain GD uses the
    cancellation-free gradient and stops with ``saturated=True`` on underflow, as :func:`run_gd`.

    Tarzanagh et al. show that the regularization path of this parameterisation approaches the
    nuclear-norm Att-SVM; whether GD does too is an empirical question: pass that solution as
    ``reference`` and read ``corrs`` (nothing is asserted here).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (``W = KQᵀ``, nuclear-norm
    SVM).

    Args:
      inst: the data.
      steps, lr, normalized, loss, record_at: as :func:`run_gd`.
      K0, Q0: initial factors, shape ``(d, m)``; default ``init_scale ·`` standard normal draws
        from ``numpy.random.default_rng(seed)`` (``K = Q = 0`` is a saddle with zero gradient).
      m: factor width (default ``d``, or the width of ``K0``).
      init_scale: scale of the default initial factors, > 0.
      seed: seed of the default initial factors.
      reference: ``(d, d)`` reference direction (e.g. the nuclear-norm SVM's ``W``).

    Returns:
      :class:`KQTrajectory`.

    Scale: as :func:`run_gd`, with ``K0``, ``Q0`` scaled by ``2^−(a+b)/2`` each and ``lr`` by
    ``2^−(a+b)/2`` (normalized): the factors scale exactly. ``W = KQᵀ`` is formed from the
    factors scaled to order one; raises :class:`~attnsvm.NumericalError` when its largest entry
    (or the nuclear norm) is not a normal double, or the logits overflow as in :func:`run_gd`.

    Token masks (:attr:`Instance.mask`): supported, as in :func:`run_gd`.
    """
    inst = check_instance(inst)
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    ref = _check_reference(inst, reference)
    d = inst.d
    if m is None:
        m = d if K0 is None else int(np.shape(K0)[1]) if np.ndim(K0) == 2 else d
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise AttnSVMError(f"m must be an integer ≥ 1; got {m!r}")
    scale = check_positive(
        init_scale, "init_scale", meaning="the standard deviation of the random K0, Q0 entries"
    )
    rng = np.random.default_rng(seed)
    K = (
        np.array(check_shape(K0, "K0", (d, m), described="(d, m)"))
        if K0 is not None
        else scale * rng.standard_normal((d, m))
    )
    Q = (
        np.array(check_shape(Q0, "Q0", (d, m), described="(d, m)"))
        if Q0 is not None
        else scale * rng.standard_normal((d, m))
    )
    at = record_steps(record_at, steps)
    rec_set = {int(s) for s in at}
    sc = _rescale(inst)
    lr_m, lr_e = math.frexp(lr)
    record: list[GDRecord] = []
    nuc: list[float] = []
    stop, saturated, t = "steps", False, 0

    def product(t: int) -> tuple[FloatArray, FloatArray]:
        # W = K Qᵀ and W' = W·2^k from the factors scaled to order one (K = K̃·2^eK, Q = Q̃·2^eQ,
        # exact): K Qᵀ itself may overflow or underflow where W' (the logits) is fine, and vice versa.
        eK, eQ = pow2_exponent(K), pow2_exponent(Q)
        Wn = ldexp_scale(K, eK) @ ldexp_scale(Q, eQ).T
        m = float(np.max(np.abs(Wn)))
        if m > 0:
            log_m = math.log(m) + (eK + eQ) * _LN2
            if not (LOG_FLOAT_TINY <= log_m <= LOG_FLOAT_MAX):
                raise range_error(f"W_{t} = K Qᵀ (largest entry)", log_m, remedy="Rescale K0, Q0 or lr")
            _to_logit_scale(sc, np.full((1, 1), m), f"W_{t}")  # raises before ldexp could overflow
        return np.ldexp(Wn, eK + eQ), np.ldexp(Wn, eK + eQ + sc.k)

    def joint_norm(gK: FloatArray, gQ: FloatArray) -> float:
        # ||(gK, gQ)||_F scaled by the largest entry (no overflow/underflow of the squares)
        m = max(float(np.max(np.abs(gK))), float(np.max(np.abs(gQ))))
        if not (m > 0 and math.isfinite(m)):
            return m
        return m * math.sqrt(float(np.sum((gK / m) ** 2) + np.sum((gQ / m) ** 2)))

    for t in range(0, steps + 1):
        if t > 0:
            _, Wp = product(t - 1)
            try:
                g_dir = normalized_risk_grad_of(sc.X, sc.Y, sc.z, sc.v, Wp, lo, **sc.mask_kw)
            except NumericalError as exc:
                if normalized or not _is_stationary_error(exc):
                    raise NumericalError(
                        f"{'normalized' if normalized else 'plain'} (K, Q) GD at step {t}: {exc}"
                    ) from exc
                stop, saturated = "stationary", True
                t -= 1
                break
            D = g_dir.direction  # ∇L(W) = 2^k e^{log||g'||} D
            gK, gQ = D @ Q, D.T @ K
            if normalized:
                jn = joint_norm(gK, gQ)
                if not jn > 0:
                    raise NumericalError(
                        f"normalized (K, Q) GD at step {t}: ∇L(W) Q and ∇L(W)ᵀ K are both zero "
                        "(K, Q at a saddle); start from other factors"
                    )
                K, Q = K - (lr / jn) * gK, Q - (lr / jn) * gQ
            else:
                if g_dir.log_norm < LOG_FLOAT_TINY:  # scale-free, as run_gd
                    stop, saturated = "gradient underflow", True
                    t -= 1
                    break
                if g_dir.log_norm > LOG_FLOAT_MAX:
                    raise NumericalError(f"plain (K, Q) GD at step {t}: the gradient is not finite; lower lr")
                # η ∇L(W) Q = ((m e^{log||g'||}) D Q)·2^(e+k) with η = m·2^e: powers of two applied last
                c = lr_m * math.exp(g_dir.log_norm)
                with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
                    Kn = K - np.ldexp(c * gK, lr_e + sc.k)
                    Qn = Q - np.ldexp(c * gQ, lr_e + sc.k)
                if not (np.all(np.isfinite(Kn)) and np.all(np.isfinite(Qn))):
                    raise NumericalError(
                        f"plain (K, Q) GD diverged at step {t}: factors became non-finite; lower lr"
                    )
                if np.array_equal(Kn, K) and np.array_equal(Qn, Q):
                    stop, saturated = "stalled", True
                    t -= 1
                    break
                K, Q = Kn, Qn
        if t in rec_set:
            W, _ = product(t)
            record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), False))
            nuc.append(_nuclear(W))
    W, _ = product(t)
    if saturated and (not record or record[-1].step != t):
        record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), False))
        nuc.append(_nuclear(W))
    return KQTrajectory(
        W=W,
        record=record,
        steps_run=int(t),
        stop_reason=stop,
        saturated=saturated,
        normalized=bool(normalized),
        lr=lr,
        loss=_loss_name(lo),
        K=K,
        Q=Q,
        nuclear_norms=np.array(nuc),
    )
