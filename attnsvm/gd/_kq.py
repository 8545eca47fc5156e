""":func:`run_gd_kq`: GD on the factors of ``W = K Qᵀ``.

Gradient descent on ``(K, Q)`` with ``∇_K L = ∇_W L · Q`` and ``∇_Q L = (∇_W L)ᵀ K``; its direction
approaches the nuclear-norm Att-SVM (Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .._types import FloatArray
from .._validation import check_instance, check_int, check_positive, check_shape
from ..errors import AttnSVMError, NumericalError
from ..model._grad import (
    normalized_risk_grad_of,
)
from ..model._instance import Instance
from ..model._losses import LossLike, get_loss
from ..scaling import (
    LOG_FLOAT_MAX,
    LOG_FLOAT_TINY,
    ldexp_scale,
    pow2_exponent,
    range_error,
)
from ._scaled import _LN2, _check_reference, _rescale, _Scaled, _to_logit_scale
from ._single import (
    GDRecord,
    GDTrajectory,
    _is_stationary_error,
    _log10_grad_norm,
    _loss_name,
    _make_record,
    record_steps,
)


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


def _initial_factors(
    inst: Instance,
    K0: ArrayLike | None,
    Q0: ArrayLike | None,
    m: int | None,
    init_scale: float,
    seed: int,
) -> tuple[FloatArray, FloatArray]:
    """The initial factors ``(K_0, Q_0)``, shape ``(d, m)``: ``K0``, ``Q0`` as given (checked), else
    ``init_scale · N(0, 1)`` draws from ``numpy.random.default_rng(seed)`` (``K`` drawn first). The width
    ``m`` defaults to ``d``, or the width of a 2-D ``K0``; an ``m`` that is not an integer ``≥ 1`` raises
    :class:`AttnSVMError`."""
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
    return K, Q


def _product(sc: _Scaled, K: FloatArray, Q: FloatArray, t: int) -> tuple[FloatArray, FloatArray]:
    """``W_t = K Qᵀ`` and ``W'_t = W_t·2^k`` (the logit scale of :class:`_Scaled`), formed from the factors
    scaled to order one; raises the contract's error naming ``W_t`` when its largest entry, or its
    logits, leave the normal range."""
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


def _joint_norm(gK: FloatArray, gQ: FloatArray) -> float:
    """``||(gK, gQ)||_F = (||gK||_F² + ||gQ||_F²)^{1/2}`` (the largest entry itself when it is 0 or not
    finite)."""
    # ||(gK, gQ)||_F scaled by the largest entry (no overflow/underflow of the squares)
    m = max(float(np.max(np.abs(gK))), float(np.max(np.abs(gQ))))
    if not (m > 0 and math.isfinite(m)):
        return m
    return m * math.sqrt(float(np.sum((gK / m) ** 2) + np.sum((gQ / m) ** 2)))


def _kq_step(
    sc: _Scaled, K: FloatArray, Q: FloatArray, lo: Any, lr: float, normalized: bool, t: int
) -> tuple[FloatArray, FloatArray] | str:
    """Update ``t`` of (K, Q) GD: ``(K, Q) ← (K, Q) − η (∇L(W) Q, ∇L(W)ᵀ K)`` at ``W = K Qᵀ``, divided by
    the pair's :func:`_joint_norm` when ``normalized``; or, for plain GD, the saturation that stops the
    run instead (``"stationary"``, ``"gradient underflow"``, ``"stalled"``, as :func:`run_gd`). Raises
    :class:`NumericalError` at a saddle of normalized GD, or when the gradient or the factors are not
    finite."""
    lr_m, lr_e = math.frexp(lr)
    _, Wp = _product(sc, K, Q, t - 1)
    try:
        g_dir = normalized_risk_grad_of(sc.X, sc.Y, sc.z, sc.v, Wp, lo, **sc.mask_kw)
    except NumericalError as exc:
        if normalized or not _is_stationary_error(exc):
            raise NumericalError(
                f"{'normalized' if normalized else 'plain'} (K, Q) GD at step {t}: {exc}"
            ) from exc
        return "stationary"
    D = g_dir.direction  # ∇L(W) = 2^k e^{log||g'||} D
    gK, gQ = D @ Q, D.T @ K
    if normalized:
        jn = _joint_norm(gK, gQ)
        if not jn > 0:
            raise NumericalError(
                f"normalized (K, Q) GD at step {t}: ∇L(W) Q and ∇L(W)ᵀ K are both zero "
                "(K, Q at a saddle); start from other factors"
            )
        return K - (lr / jn) * gK, Q - (lr / jn) * gQ
    if g_dir.log_norm < LOG_FLOAT_TINY:  # scale-free, as run_gd
        return "gradient underflow"
    if g_dir.log_norm > LOG_FLOAT_MAX:
        raise NumericalError(f"plain (K, Q) GD at step {t}: the gradient is not finite; lower lr")
    # η ∇L(W) Q = ((m e^{log||g'||}) D Q)·2^(e+k) with η = m·2^e: powers of two applied last
    c = lr_m * math.exp(g_dir.log_norm)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
        Kn = K - np.ldexp(c * gK, lr_e + sc.k)
        Qn = Q - np.ldexp(c * gQ, lr_e + sc.k)
    if not (np.all(np.isfinite(Kn)) and np.all(np.isfinite(Qn))):
        raise NumericalError(f"plain (K, Q) GD diverged at step {t}: factors became non-finite; lower lr")
    if np.array_equal(Kn, K) and np.array_equal(Qn, Q):
        return "stalled"
    return Kn, Qn


def _kq_record(sc: _Scaled, W: FloatArray, lo: Any, t: int, ref: FloatArray | None) -> tuple[GDRecord, float]:
    """The record of ``W_t = K Qᵀ`` at step ``t`` (no iterate kept) and its nuclear norm ``||W_t||_*``."""
    return _make_record(sc, W, lo, t, ref, _log10_grad_norm(sc, W, lo), False), _nuclear(W)


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
    K, Q = _initial_factors(inst, K0, Q0, m, init_scale, seed)
    at = record_steps(record_at, steps)
    rec_set = {int(s) for s in at}
    sc = _rescale(inst, shift=True)  # needs x'ᵀW'z' = xᵀWz and the values only, as run_gd
    record: list[GDRecord] = []
    nuc: list[float] = []
    stop, saturated, t = "steps", False, 0
    for t in range(0, steps + 1):
        if t > 0:
            step = _kq_step(sc, K, Q, lo, lr, normalized, t)
            if isinstance(step, str):
                stop, saturated = step, True
                t -= 1
                break
            K, Q = step
        if t in rec_set:
            W, _ = _product(sc, K, Q, t)
            rec, nuc_t = _kq_record(sc, W, lo, t, ref)
            record.append(rec)
            nuc.append(nuc_t)
    W, _ = _product(sc, K, Q, t)
    if saturated and (not record or record[-1].step != t):  # the state where it stopped
        rec, nuc_t = _kq_record(sc, W, lo, t, ref)
        record.append(rec)
        nuc.append(nuc_t)
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
