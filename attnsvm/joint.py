"""Joint training of the head ``v`` and the prompt ``p``: the v-SVM, its support inputs, the relaxed p-SVM.

Model (Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596, Sec. on joint training): with a fixed key
matrix ``W``, ``f_i(v, p) = vᵀ X_iᵀ softmax(X_i W p)`` and ``L(v, p) = (1/n) Σ_i ℓ(Y_i f_i)``
(logistic by default). Gradients:

    ∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i,
    ∇_p L = the prompt gradient (:mod:`attnsvm.prompt`) with the current head ``v``.

GD updates both, each gradient normalized separately,
``v ← v − η ∇_v L/||∇_v L||``, ``p ← p − η ∇_p L/||∇_p L||``. With the selected token
``α_i`` of each input, the theory predicts ``v/||v|| → v_mm/||v_mm||`` and
``p/||p|| → p_relax/||p_relax||`` where

    v_mm    = argmin ||v|| s.t. Y_i vᵀ x_iα_i ≥ 1                       (v-SVM),
    S       = { i : Y_i v_mmᵀ x_iα_i = 1 }                              (support inputs),
    p_relax = argmin ||p|| s.t. (k_iα_i − k_it)ᵀ p ≥ 1 for i ∈ S, ≥ 0 for i ∉ S   (relaxed p-SVM).

Both SVMs are min-norm problems solved by the certified solver on their Gram matrices.
The ``v`` direction is computed in the log domain (``log|ℓ'_i| + log s_it`` factored out), so it
stays exact when ``ℓ'`` underflows at large margins.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (joint (v, p) training, relaxed SVM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .attention import log_softmax
from .errors import InvalidInstanceError, NumericalError
from .grad import GradDirection, signed_log_derivative
from .instance import Instance, as_real_array
from .losses import LossLike, get_loss
from .prompt import (
    _cos,
    check_lr,
    check_prompt,
    check_steps,
    keys_of,
    normalized_prompt_grad_of,
    prompt_constraint_rows,
    prompt_grad_of,
    record_steps,
    solve_min_norm_or_raise,
)
from .svm import KKTResiduals

__all__ = [
    "JointSVMSolution",
    "solve_joint_svm",
    "joint_risk",
    "joint_grads",
    "normalized_joint_grads",
    "JointRecord",
    "JointTrajectory",
    "run_joint_gd",
]

FloatArray = NDArray[np.float64]


def _check_head(inst: Instance, v: ArrayLike, name: str = "v") -> FloatArray:
    va = as_real_array(v, name, ndim=1)
    if va.shape != (inst.d,):
        raise InvalidInstanceError(f"{name} must have shape (d,) = ({inst.d},); got {va.shape}")
    return va


# ==================================================================== array forms
def _forward(X: FloatArray, keys: FloatArray, v: FloatArray, p: FloatArray) -> tuple[FloatArray, FloatArray]:
    log_s = log_softmax(keys @ p)
    f = np.sum(np.exp(log_s) * (X @ v), axis=1)
    return log_s, f


def joint_risk_of(
    X: FloatArray, keys: FloatArray, Y: FloatArray, v: FloatArray, p: FloatArray, loss: Any
) -> float:
    """Array form of :func:`joint_risk`."""
    _, f = _forward(X, keys, v, p)
    r = float(np.mean(loss.value(Y * f)))
    if not math.isfinite(r):
        raise NumericalError("the joint risk is not finite; rescale the data or use the logistic loss")
    return r


def normalized_v_grad_of(
    X: FloatArray, keys: FloatArray, Y: FloatArray, v: FloatArray, p: FloatArray, loss: Any
) -> GradDirection:
    """Unit ``∇_v L/||∇_v L||`` and ``log||∇_v L||``, from log-magnitudes.

    ``∇_v L = (1/n) Σ_it ℓ'_i Y_i s_it x_it``; the weights' logs ``log|ℓ'_i| + log s_it`` are
    shifted by their maximum before exponentiating, so the direction stays exact when ``ℓ'``
    and the small attention weights underflow.
    """
    n = X.shape[0]
    log_s, f = _forward(X, keys, v, p)
    sign_l, log_l = signed_log_derivative(loss, Y * f)
    log_w = log_l[:, None] + log_s - math.log(n)
    sign_w = np.broadcast_to((sign_l * Y)[:, None], log_w.shape)
    live = np.isfinite(log_w) & (sign_w != 0)
    if not np.any(live):
        raise NumericalError(
            "∇_v L is exactly zero (zero loss derivative everywhere); the direction is undefined"
        )
    top = float(np.max(log_w[live]))
    scaled = np.where(live, sign_w * np.exp(np.where(live, log_w, top) - top), 0.0)  # log-domain
    G = np.einsum("nt,ntd->d", scaled, X)
    m = float(np.max(np.abs(G)))
    if not m > 0:
        raise NumericalError(
            "∇_v L is exactly zero (the inputs' contributions cancel); the direction is undefined"
        )
    Gs = G / m
    nrm = float(np.sqrt(np.sum(Gs * Gs)))
    return GradDirection(Gs / nrm, top + math.log(m) + math.log(nrm))


def v_grad_of(
    X: FloatArray, keys: FloatArray, Y: FloatArray, v: FloatArray, p: FloatArray, loss: Any
) -> FloatArray:
    """``∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i``, shape ``(d,)``."""
    log_s, f = _forward(X, keys, v, p)
    dl = np.asarray(loss.derivative(Y * f), dtype=np.float64)
    return np.einsum("nt,ntd->d", (dl * Y)[:, None] * np.exp(log_s), X) / X.shape[0]


# ====================================================================== public
def joint_risk(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic"
) -> float:
    """Risk ``L(v, p) = (1/n) Σ_i ℓ(Y_i vᵀX_iᵀ softmax(X_i W p))``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    lo = get_loss(loss)
    keys = keys_of(inst.X, inst.check_weights(W))
    return joint_risk_of(inst.X, keys, inst.Y, _check_head(inst, v), check_prompt(inst, p), lo)


def joint_grads(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic"
) -> tuple[FloatArray, FloatArray]:
    """``(∇_v L, ∇_p L)``, shapes ``((d,), (d,))``.

    ``∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i``; ``∇_p L`` as :func:`attnsvm.prompt.prompt_grad`
    with head ``v`` (cancellation-free).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    lo = get_loss(loss)
    keys = keys_of(inst.X, inst.check_weights(W))
    va, pa = _check_head(inst, v), check_prompt(inst, p)
    return v_grad_of(inst.X, keys, inst.Y, va, pa, lo), prompt_grad_of(keys, inst.Y, inst.X @ va, pa, lo)


def normalized_joint_grads(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic"
) -> tuple[GradDirection, GradDirection]:
    """Separately normalized directions of ``∇_v L`` and ``∇_p L`` (log-domain), each with its log-norm."""
    lo = get_loss(loss)
    keys = keys_of(inst.X, inst.check_weights(W))
    va, pa = _check_head(inst, v), check_prompt(inst, p)
    return (
        normalized_v_grad_of(inst.X, keys, inst.Y, va, pa, lo),
        normalized_prompt_grad_of(keys, inst.Y, inst.X @ va, pa, lo),
    )


# ======================================================================= SVMs
@dataclass(frozen=True)
class JointSVMSolution:
    """The v-SVM, its support inputs and the relaxed p-SVM.

    Attributes:
      v: ``v_mm``, shape ``(d,)``.
      v_duals: multipliers of ``min ½||v||²`` (``v = Σ_i λ_i Y_i x_iα_i``), shape ``(n,)``.
      v_margins: ``Y_i v_mmᵀ x_iα_i``, shape ``(n,)``.
      support_inputs: ``S``, sorted indices with margin 1 (to :data:`attnsvm.svm.SUPPORT_RTOL`),
        weakly active inputs (margin 1, zero multiplier) included.
      p: ``p_relax``, shape ``(d,)``.
      p_duals, p_rows, p_pairs, p_margins: the relaxed p-SVM's multipliers, rows
        ``Δk_it``, ``(i, t)`` pairs and margins.
      p_support: active constraints of the relaxed p-SVM as ``(i, t)`` (margin equal to its bound).
      alpha: the selected tokens, shape ``(n,)``.
      kkt_v, kkt_p: KKT residuals of the two problems.
      certified: both solver certificates passed.
    """

    v: FloatArray
    v_duals: FloatArray
    v_margins: FloatArray
    support_inputs: NDArray[np.intp]
    p: FloatArray
    p_duals: FloatArray
    p_rows: FloatArray
    p_pairs: NDArray[np.intp]
    p_margins: FloatArray
    p_support: list[tuple[int, int]]
    alpha: NDArray[np.intp]
    kkt_v: KKTResiduals
    kkt_p: KKTResiduals
    certified: bool


def solve_joint_svm(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> JointSVMSolution:
    """The v-SVM ``min ||v|| s.t. Y_i vᵀx_iα_i ≥ 1``, its support inputs ``S`` and the relaxed p-SVM.

    Relaxed p-SVM: ``min ||p|| s.t. (k_iα_i − k_it)ᵀ p ≥ 1`` for ``i ∈ S`` and ``≥ 0`` for ``i ∉ S``,
    ``k_it = Wᵀx_it``. Both are solved exactly (certified min-norm solver).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (joint training theorem).

    Args:
      inst: the data; ``inst.v`` defines the default ``alpha``.
      W: key matrix, shape ``(d, d)``.
      alpha: selected token of each input, shape ``(n,)``; ``None`` → optimal tokens under ``inst.v``.

    Returns:
      :class:`JointSVMSolution`.

    Raises:
      InfeasibleSVMError: when either SVM has no feasible point (e.g. a zero selected token).
    """
    Wa = inst.check_weights(W)
    a = inst.check_alpha(alpha)
    n = inst.n
    sel = inst.Y[:, None] * inst.X[np.arange(n), a]  # rows Y_i x_iα_i, (n, d)
    pairs_v = np.stack([np.arange(n), a], axis=1).astype(np.intp)
    sv = solve_min_norm_or_raise(sel, np.ones(n), None, pairs_v, "v-SVM")
    v = sel.T @ sv.multipliers
    S = np.array(sorted(int(i) for i in sv.support), dtype=np.intp)
    rows, pairs = prompt_constraint_rows(inst, Wa, a)
    bp = np.isin(pairs[:, 0], S).astype(np.float64)
    sp = solve_min_norm_or_raise(rows, bp, None, pairs, "relaxed p-SVM")
    p = rows.T @ sp.multipliers
    return JointSVMSolution(
        v=v,
        v_duals=sv.multipliers,
        v_margins=sel @ v,
        support_inputs=S,
        p=p,
        p_duals=sp.multipliers,
        p_rows=rows,
        p_pairs=pairs,
        p_margins=rows @ p,
        p_support=[(int(i), int(t)) for i, t in pairs[sp.support]],
        alpha=a,
        kkt_v=sv.kkt,
        kkt_p=sp.kkt,
        certified=sv.certified and sp.certified,
    )


# ========================================================================= GD
class JointRecord(NamedTuple):
    """State at one recorded step: ``||v||``, ``||p||``, risk, selected tokens, and the
    correlations of ``v`` and ``p`` with the references (NaN without them)."""

    step: int
    v_norm: float
    p_norm: float
    risk: float
    tokens: NDArray[np.intp]
    v_corr: float
    p_corr: float


@dataclass
class JointTrajectory:
    """Result of :func:`run_joint_gd`: final ``v``, ``p`` (shape ``(d,)``) and the records."""

    v: FloatArray
    p: FloatArray
    record: list[JointRecord] = field(default_factory=list)

    @property
    def v_corrs(self) -> FloatArray:
        """``corr(v_t, v_ref)`` at the recorded steps."""
        return np.array([r.v_corr for r in self.record])

    @property
    def p_corrs(self) -> FloatArray:
        """``corr(p_t, p_ref)`` at the recorded steps."""
        return np.array([r.p_corr for r in self.record])


def run_joint_gd(
    inst: Instance,
    W: ArrayLike,
    steps: int,
    lr: float,
    normalized: bool = True,
    v0: ArrayLike | None = None,
    p0: ArrayLike | None = None,
    loss: "str | LossLike" = "logistic",
    record_at: int | Sequence[int] | ArrayLike | None = None,
    v_reference: ArrayLike | None = None,
    p_reference: ArrayLike | None = None,
) -> JointTrajectory:
    """GD on ``(v, p)`` jointly, each gradient normalized separately (or plain GD).

    Normalized: ``v ← v − η ∇_v L/||∇_v L||``, ``p ← p − η ∇_p L/||∇_p L||`` (both from the
    same iterate). A block whose gradient is exactly zero (e.g. ``∇_p L`` at ``v = 0``, where all
    token values are equal) is left unchanged for that step.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (joint GD converges to
    ``(v_mm, p_relax)`` in direction).

    Args:
      inst: the data; ``inst.v`` is the initial head unless ``v0`` is given.
      W: key matrix, shape ``(d, d)``.
      steps, lr: updates (≥ 1) and step size (> 0).
      normalized: separately normalized (default) or plain GD.
      v0, p0: initial head and prompt, shape ``(d,)`` (defaults ``inst.v`` and zeros).
      loss: loss name or object (the theory uses the logistic loss).
      record_at: ``None`` (log-spaced), an interval, or a list of steps.
      v_reference, p_reference: ``(d,)`` directions for ``v_corr`` and ``p_corr``.

    Returns:
      :class:`JointTrajectory`.
    """
    steps = check_steps(steps)
    lr = check_lr(lr)
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    v = np.array(inst.v) if v0 is None else np.array(_check_head(inst, v0, "v0"))
    p = np.zeros(inst.d) if p0 is None else np.array(check_prompt(inst, p0, "p0"))
    vr = None if v_reference is None else _check_head(inst, v_reference, "v_reference")
    pr = None if p_reference is None else check_prompt(inst, p_reference, "p_reference")
    at = set(int(s) for s in record_steps(record_at, steps))
    X, Y = inst.X, inst.Y
    keys = keys_of(X, Wa)
    rec: list[JointRecord] = []

    def record(t: int) -> None:
        rec.append(
            JointRecord(
                t,
                float(np.linalg.norm(v)),
                float(np.linalg.norm(p)),
                joint_risk_of(X, keys, Y, v, p, lo),
                np.argmax(keys @ p, axis=1).astype(np.intp),
                _cos(v, vr) if vr is not None else math.nan,
                _cos(p, pr) if pr is not None else math.nan,
            )
        )

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        if normalized:
            try:
                gv = normalized_v_grad_of(X, keys, Y, v, p, lo).direction
            except NumericalError:
                gv = np.zeros_like(v)
            try:
                gp = normalized_prompt_grad_of(keys, Y, X @ v, p, lo).direction
            except NumericalError:
                gp = np.zeros_like(p)
            if not (np.any(gv) or np.any(gp)):
                raise NumericalError(
                    f"joint GD at step {t}: both gradients are exactly zero; (v, p) is stationary"
                )
        else:
            gv = v_grad_of(X, keys, Y, v, p, lo)
            gp = prompt_grad_of(keys, Y, X @ v, p, lo)
        v, p = v - lr * gv, p - lr * gp
        if not (np.all(np.isfinite(v)) and np.all(np.isfinite(p))):
            raise NumericalError(f"joint GD diverged at step {t}: v or p became non-finite; lower lr")
        if t in at:
            record(t)
    return JointTrajectory(v=v, p=p, record=rec)
