""":func:`run_gd`: GD on one instance in float64 NumPy, and its recorded trajectory.

Plain GD ``W ← W − η∇L(W)`` or normalized GD ``W ← W − η∇L(W)/||∇L(W)||_F``. The normalized direction
comes from the core's log-domain :func:`attnsvm.model._grad.normalized_risk_grad_of`, so it stays exact
after ``∇L`` underflows (10⁶ steps, ``||W||`` ~ 10⁵); plain GD reports gradient underflow instead of
stalling silently. Token masks are honoured as in the model.

Data flow: gd takes a reference direction (e.g. ``attnsvm.solve_svm(inst).W``) as an argument and never
imports the SVM solvers.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (normalized GD, convergence in
direction); Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (max-margin token selection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import check_instance, check_int, check_positive
from ..errors import AttnSVMError, NumericalError
from ..model._attention import logits_of
from ..model._grad import (
    CANCELLED_MESSAGE,
    GradDirection,
    normalized_risk_grad_of,
    risk_of,
)
from ..model._instance import Instance
from ..model._losses import LossLike, get_loss
from ..scaling import (
    EPS as _EPS,
)
from ..scaling import (
    LOG_FLOAT_MAX,
    LOG_FLOAT_TINY,
    range_error,
)
from ._metrics import _fro, direction_corr, direction_gap
from ._scaled import _LN2, _check_iterate, _check_reference, _rescale, _Scaled, _to_logit_scale


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
    if not (np.any(r0.W != 0) and np.any(r1.W != 0) and np.any(r2.W != 0)):
        return False  # a zero iterate has no direction: not settled (direction_gap would refuse it)
    return direction_gap(r0.W, r1.W) <= tol and direction_gap(r1.W, r2.W) <= tol


def _early_stop_tol(early_stop: float | None) -> float | None:
    """The early-stop tolerance ``tol``: ``None`` (off) or a finite float ``≥ 0``; anything else (a bool,
    a negative, non-finite or non-numeric value) raises :class:`AttnSVMError`."""
    tol = None
    if early_stop is not None:
        try:
            tol = float(early_stop)
        except (TypeError, ValueError):
            tol = math.nan
        if isinstance(early_stop, bool) or not (math.isfinite(tol) and tol >= 0):
            raise AttnSVMError(f"early_stop must be None or a finite tolerance ≥ 0; got {early_stop!r}")
    return tol


def _stops_early(record: list[GDRecord], tol: float | None, t: int, steps: int) -> bool:
    """After recording step ``t``: early stop is on, the run has :func:`_settled`, and steps remain."""
    return tol is not None and _settled(record, tol) and t < steps


class _LoopEnd(NamedTuple):
    """How a run's loop ended: the fields of the same names in :class:`GDTrajectory`."""

    W: FloatArray
    record: list[GDRecord]
    steps_run: int
    stop_reason: str
    saturated: bool


def _recorded_direction(sc: _Scaled, W: FloatArray, lo: Any, t: int) -> tuple[GradDirection | None, float]:
    """At a record step of normalized GD: the direction of ``∇L(W_t)`` (reused by the next update) and
    ``log10||∇L(W_t)||``; ``(None, −inf)`` at a stationary ``W_t`` (``∇L = 0``), whose update then
    raises. A range error is re-raised naming the step."""
    try:
        cur = _direction(sc, W, lo)
        lg = cur.log_norm / math.log(10.0)
    except NumericalError as exc:
        if not _is_stationary_error(exc):
            raise NumericalError(f"normalized GD at step {t}: {exc}") from exc
        cur, lg = None, -math.inf
    return cur, lg


def _run_normalized(
    sc: _Scaled,
    W: FloatArray,
    lo: Any,
    lr: float,
    steps: int,
    rec_set: set[int],
    ref: FloatArray | None,
    keep: bool,
    tol: float | None,
) -> _LoopEnd:
    """Normalized GD ``W_t = W_{t−1} − η ∇L(W_{t−1})/||∇L(W_{t−1})||_F`` for ``t = 1 … steps``, recording
    ``W_t`` at the steps of ``rec_set`` (the direction computed for a record is the next update's) and
    stopping early when :func:`_stops_early`. Normalized GD never saturates."""
    record: list[GDRecord] = []
    stop, t = "steps", 0
    cur = None
    for t in range(0, steps + 1):
        if t > 0:
            try:
                gd = cur if cur is not None else _direction(sc, W, lo)
            except NumericalError as exc:
                raise NumericalError(f"normalized GD at step {t}: {exc}") from exc
            with np.errstate(over="ignore"):  # an entry beyond the range is refused just below
                W = _check_iterate(W - lr * gd.direction, f"the iterate W_{t} of normalized GD")
            cur = None
        if t in rec_set:
            cur, lg = _recorded_direction(sc, W, lo, t)
            record.append(_make_record(sc, W, lo, t, ref, lg, keep))
            if _stops_early(record, tol, t, steps):
                stop = "settled"
                break
    return _LoopEnd(W, record, t, stop, False)


def _plain_step(sc: _Scaled, W: FloatArray, lo: Any, lr: float, t: int) -> FloatArray | str:
    """Update ``t`` of plain GD: ``W_t = W_{t−1} − η ∇L(W_{t−1})``, or the saturation that stops the run
    instead: ``"stationary"`` (``∇L = 0``, or below the rounding of its own sum), ``"gradient
    underflow"`` (the rescaled gradient is below the normal range) or ``"stalled"`` (the update leaves
    ``W`` unchanged in float64). Raises :class:`NumericalError` when the gradient or ``W_t`` is not
    finite, or the step itself underflows where ``W`` would not round it away."""
    lr_m, lr_e = math.frexp(lr)
    # ∇_W L = 2^k g' with g' = e^{log||g'||}·D the gradient of the rescaled problem at
    # W' = W·2^k (data of order one), from the log-domain direction: its size is exact
    # even where it leaves the normal range, and nothing here depends on the data's scale.
    try:
        g_dir = normalized_risk_grad_of(sc.X, sc.Y, sc.z, sc.v, _to_logit_scale(sc, W), lo, **sc.mask_kw)
    except NumericalError as exc:
        if not _is_stationary_error(exc):
            raise NumericalError(f"plain GD at step {t}: {exc}") from exc
        return "stationary"  # ∇L = 0, or below the rounding of its own sum
    if g_dir.log_norm < LOG_FLOAT_TINY:
        # g' (the gradient up to the exact factor 2^k) is below the normal range: in
        # float64 the update would not be η∇L (a scale-free test: the same at every scale).
        return "gradient underflow"
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
        return "stalled"
    return _check_iterate(Wn, f"the iterate W_{t} of plain GD")


def _run_plain(
    sc: _Scaled,
    W: FloatArray,
    lo: Any,
    lr: float,
    steps: int,
    rec_set: set[int],
    ref: FloatArray | None,
    keep: bool,
    tol: float | None,
) -> _LoopEnd:
    """Plain GD ``W_t = W_{t−1} − η ∇L(W_{t−1})`` for ``t = 1 … steps`` (:func:`_plain_step`), recording
    ``W_t`` at the steps of ``rec_set`` and stopping early when :func:`_stops_early`. A saturation stops
    the run at the last iterate reached (``steps_run`` = its step), which is then recorded too."""
    record: list[GDRecord] = []
    stop, saturated, t = "steps", False, 0
    for t in range(0, steps + 1):
        if t > 0:
            Wn = _plain_step(sc, W, lo, lr, t)
            if isinstance(Wn, str):
                stop, saturated = Wn, True
                t -= 1
                break
            W = Wn
        if t in rec_set:
            record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), keep))
            if _stops_early(record, tol, t, steps):
                stop = "settled"
                break
    if saturated and (not record or record[-1].step != t):
        record.append(_make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), keep))
    return _LoopEnd(W, record, t, stop, saturated)


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
    is one-hot far beyond float64), or when the token values ``vᵀx_it`` are not normal doubles
    (:meth:`Instance.values`; normal values whose ``v·2^ex`` leaves the range are carried at another
    exponent, :func:`attnsvm.gd._scaled._rescale`).
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
    tol = _early_stop_tol(early_stop)
    keep = keep_iterates or tol is not None
    rec_set = {int(s) for s in at}
    sc = _rescale(inst, shift=True)  # values v·2^ex cannot carry are carried at another exponent
    _check_iterate(W, "W0")
    run = _run_normalized if normalized else _run_plain
    W, record, t, stop, saturated = run(sc, W, lo, lr, steps, rec_set, ref, keep, tol)
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
