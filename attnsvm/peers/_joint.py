"""Joint training of the head ``v`` and the prompt ``p``: the v-SVM, its support inputs, the relaxed p-SVM.

Model (Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596, Sec. on joint training): with a fixed key
matrix ``W``, ``f_i(v, p) = vᵀ X_iᵀ softmax(X_i W p)`` and ``L(v, p) = (1/n) Σ_i ℓ(Y_i f_i)``
(logistic by default). Gradients:

    ∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i,
    ∇_p L = the prompt gradient (:mod:`attnsvm.peers._prompt`) with the current head ``v``.

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

Scale: keys, values and SVM rows are power-of-two mantissas with separate exponents (the
helpers of :mod:`attnsvm.peers._prompt`); answers are put back exactly or refused by name when they are
not normal doubles. The joint engine treats a block as zero only when it is exactly zero (all
values equal within each sequence, or a zero ``∇_v L``), never on a range error.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (joint (v, p) training, relaxed SVM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import check_int, check_positive, check_shape
from ..errors import NumericalError
from ..model._grad import GradDirection, signed_log_derivative
from ..model._instance import Instance, require_unmasked
from ..model._losses import LossLike, get_loss
from ..scaling import range_error
from ..svm import KKTResiduals
from ._prompt import (
    GRAD_LOW_BITS,
    PromptData,
    _cos,
    _tokens,
    check_prompt,
    keys_mantissa,
    mantissa,
    norm2,
    normalized_prompt_grad_of,
    prompt_grad_of,
    prompt_log_attention,
    prompt_risk_of,
    prompt_row_mantissas,
    put_back,
    put_back_rows,
    record_steps,
    row_mantissas,
    row_margins,
    scaled_alpha,
    solve_min_norm_rows_or_raise,
    unresolved_support,
    values_mantissa,
)

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


# ==================================================================== array forms
_LN2 = math.log(2.0)


class _ZeroGradient(NumericalError):
    """``∇_v L`` is exactly zero (not a range error): the engine leaves ``v`` unchanged."""


def joint_data(ks: FloatArray, K: int, X: FloatArray, v: FloatArray) -> PromptData:
    """Keys (mantissa ``ks``, exponent ``K``) with the values ``vᵀx_it`` of the current head."""
    As, A = values_mantissa(X, v)
    return PromptData(ks, K, As, A)


def _v_weights(data: PromptData, Y: FloatArray, p: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(log s, u)``: log attention and margins ``u = Y f`` (refused when ``f`` overflows)."""
    log_s = prompt_log_attention(data, p)
    fs = np.sum(np.exp(log_s) * data.As, axis=1)
    with np.errstate(over="ignore"):
        u = np.ldexp(Y * fs, data.A)
    if not np.all(np.isfinite(u)):
        raise range_error("the joint outputs f_i", math.log(float(np.max(np.abs(fs)))) + data.A * _LN2)
    return log_s, u


def normalized_v_grad_of(
    X: FloatArray, data: PromptData, Y: FloatArray, p: FloatArray, loss: Any
) -> GradDirection:
    """Unit ``∇_v L/||∇_v L||`` and ``log||∇_v L||``, from log-magnitudes.

    ``∇_v L = (1/n) Σ_it ℓ'_i Y_i s_it x_it``; the weights' logs ``log|ℓ'_i| + log s_it`` are
    shifted by their maximum before exponentiating, so the direction stays exact when ``ℓ'``
    and the small attention weights underflow; the tokens enter as a power-of-two mantissa
    ``x = 2^ex·x'`` (``log||∇_v L||`` gets ``ex·log 2``).
    """
    n = X.shape[0]
    Xs, ex = mantissa(X)
    log_s, u = _v_weights(data, Y, p)
    sign_l, log_l = signed_log_derivative(loss, u)
    log_w = log_l[:, None] + log_s - math.log(n)
    sign_w = np.broadcast_to((sign_l * Y)[:, None], log_w.shape)
    live = np.isfinite(log_w) & (sign_w != 0)
    if not np.any(live):
        raise _ZeroGradient(
            "∇_v L is exactly zero (zero loss derivative everywhere); the direction is undefined"
        )
    top = float(np.max(log_w[live]))
    scaled = np.where(live, sign_w * np.exp(np.where(live, log_w, top) - top), 0.0)  # log-domain
    G = np.einsum("nt,ntd->d", scaled, Xs)
    m = float(np.max(np.abs(G)))
    if not m > 0:
        raise _ZeroGradient(
            "∇_v L is exactly zero (the inputs' contributions cancel); the direction is undefined"
        )
    Gs = G / m
    nrm = float(np.sqrt(np.sum(Gs * Gs)))
    return GradDirection(Gs / nrm, top + math.log(m) + math.log(nrm) + ex * _LN2)


def v_grad_of(X: FloatArray, data: PromptData, Y: FloatArray, p: FloatArray, loss: Any) -> FloatArray:
    """``∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i``, shape ``(d,)``.

    Formed on the token mantissa and put back by ``2^ex``; rebuilt from the log-domain direction
    when the rescaled sum is small enough to have lost digits to underflow.
    """
    Xs, ex = mantissa(X)
    log_s, u = _v_weights(data, Y, p)
    dl = np.asarray(loss.derivative(u), dtype=np.float64)
    G = np.einsum("nt,ntd->d", (dl * Y)[:, None] * np.exp(log_s), Xs) / X.shape[0]
    big = float(np.max(np.abs(G)))
    if big >= 2.0**GRAD_LOW_BITS:
        return put_back(G, ex, "the head gradient ∇_v L")
    # Small or 0: a plain 0 may be ℓ' or the weights underflowing, not a zero gradient. The log
    # domain decides: exactly zero (every ℓ' = 0 or the contributions cancel exactly) → 0;
    # otherwise the rebuilt value, or the range error when it is not a double.
    try:
        D = normalized_v_grad_of(X, data, Y, p, loss)
    except _ZeroGradient:
        return np.zeros_like(G)
    k = math.floor(D.log_norm / _LN2)
    return put_back(D.direction * math.exp(D.log_norm - k * _LN2), k, "the head gradient ∇_v L")


# ====================================================================== public
def _data(inst: Instance, W: ArrayLike, v: FloatArray) -> PromptData:
    ks, K = keys_mantissa(inst.X, inst.check_weights(W))
    return joint_data(ks, K, inst.X, v)


def joint_risk(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> float:
    """Risk ``L(v, p) = (1/n) Σ_i ℓ(Y_i vᵀX_iᵀ softmax(X_i W p))``.

    Scale: any finite data; to a few ulps relative; raises :class:`NumericalError` when ``f`` or
    the risk overflows, or a logistic/exponential risk is below 2.2e-308.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    require_unmasked(inst, "attnsvm.peers.joint_risk")
    lo = get_loss(loss)
    va, pa = check_shape(v, "v", (inst.d,), described="(d,)"), check_prompt(inst, p)
    return prompt_risk_of(_data(inst, W, va), inst.Y, pa, lo, "the joint risk L(v, p)")


def joint_grads(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> tuple[FloatArray, FloatArray]:
    """``(∇_v L, ∇_p L)``, shapes ``((d,), (d,))``.

    ``∇_v L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i X_iᵀ s_i``; ``∇_p L`` as :func:`attnsvm.peers._prompt.prompt_grad`
    with head ``v`` (cancellation-free).

    Scale: any finite data with ``max|p|·max|k|`` below 1.8e308; ``∇_p L`` normwise as
    :func:`attnsvm.peers._prompt.prompt_grad` (``nT(d+T)·eps`` relative where the keys and values do not
    cancel), ``∇_v L`` to ``≲ nT·eps`` relative to its largest entry; raises :class:`NumericalError` when
    either largest entry is not a normal double (use :func:`normalized_joint_grads`).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    require_unmasked(inst, "attnsvm.peers.joint_grads")
    lo = get_loss(loss)
    va, pa = check_shape(v, "v", (inst.d,), described="(d,)"), check_prompt(inst, p)
    data = _data(inst, W, va)
    return v_grad_of(inst.X, data, inst.Y, pa, lo), prompt_grad_of(data, inst.Y, pa, lo)


def normalized_joint_grads(
    inst: Instance, W: ArrayLike, v: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> tuple[GradDirection, GradDirection]:
    """Separately normalized directions of ``∇_v L`` and ``∇_p L`` (log-domain), each with its log-norm.

    Scale: any finite data with ``max|p|·max|k|`` below 1.8e308; the ``p`` direction as
    :func:`attnsvm.peers._prompt.normalized_prompt_grad` (``≲ (nT + T + d)·eps`` per entry where the keys and
    values do not cancel), the ``v`` direction to ``≲ nT·eps`` per entry; never over/underflows (raises
    :class:`NumericalError` only for an exactly zero block).
    """
    require_unmasked(inst, "attnsvm.peers.normalized_joint_grads")
    lo = get_loss(loss)
    va, pa = check_shape(v, "v", (inst.d,), described="(d,)"), check_prompt(inst, p)
    data = _data(inst, W, va)
    return (
        normalized_v_grad_of(inst.X, data, inst.Y, pa, lo),
        normalized_prompt_grad_of(data, inst.Y, pa, lo),
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
      certified: both solver certificates passed and no support row is unresolved at the rows' spread.
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
    ``k_it = Wᵀx_it``. Both are solved exactly (certified min-norm solver), on power-of-two
    mantissas of their rows, one exponent per row.

    Scale: any finite data (``v_mm(cX) = v_mm/c``, ``p_relax(cX) = p_relax/c``, multipliers
    ``/c²``), rows any number of binades apart (one power-of-two exponent per row); raises
    :class:`NumericalError` when a solution, the rows, the multipliers or the margins (by their largest entry)
    are not normal doubles. ``certified`` is False when a support row is unresolved at the rows' spread
    (its margin ``≥ b`` reads ``≥ 0`` at working precision, as in :func:`attnsvm.svm.solve_svm`).

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
    require_unmasked(inst, "attnsvm.peers.solve_joint_svm")
    Wa = inst.check_weights(W)
    a = scaled_alpha(inst, alpha)
    n = inst.n
    # Both SVMs on power-of-two mantissas of their rows, one exponent per row: rows r = 2^{E_r}·rows'_r give
    # the solution 2^G·x' and the multipliers 2^{G−E_r}·λ'_r (exact, _min_norm_rows), so nothing over- or
    # underflows in the Gram matrix, however many binades apart the rows are.
    sel, E = row_mantissas(inst.Y[:, None] * inst.X[np.arange(n), a])  # rows Y_i x_iα_i, (n, d)
    pairs_v = np.stack([np.arange(n), a], axis=1).astype(np.intp)
    sv, Gv = solve_min_norm_rows_or_raise(sel, E, np.ones(n), pairs_v, "v-SVM")
    vs = sel.T @ sv.multipliers
    S = np.array(sorted(int(i) for i in sv.support), dtype=np.intp)
    rows, R, pairs = prompt_row_mantissas(inst, Wa, a)
    bp = np.isin(pairs[:, 0], S).astype(np.float64)
    sp, Gp = solve_min_norm_rows_or_raise(rows, R, bp, pairs, "relaxed p-SVM")
    ps = rows.T @ sp.multipliers
    return JointSVMSolution(
        v=put_back(vs, Gv, "the v-SVM solution v_mm"),
        v_duals=put_back_rows(np.asarray(sv.multipliers), Gv - E, "the v-SVM multipliers"),
        v_margins=row_margins(sel, E, vs, Gv, "the v-SVM margins Y_i v_mmᵀx_iα_i"),
        support_inputs=S,
        p=put_back(ps, Gp, "the relaxed p-SVM solution p_relax"),
        p_duals=put_back_rows(np.asarray(sp.multipliers), Gp - R, "the relaxed p-SVM multipliers"),
        p_rows=put_back_rows(rows, R, "the relaxed p-SVM rows Δk_it"),
        p_pairs=pairs,
        p_margins=row_margins(rows, R, ps, Gp, "the relaxed p-SVM margins Δk_itᵀp_relax"),
        p_support=[(int(i), int(t)) for i, t in pairs[sp.support]],
        alpha=a,
        kkt_v=sv.kkt,
        kkt_p=sp.kkt,
        certified=bool(
            sv.certified
            and sp.certified
            and unresolved_support(sel, E, np.ones(n), sv, Gv).size == 0
            and unresolved_support(rows, R, bp, sp, Gp).size == 0
        ),
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
    *,
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

    Scale: any finite data; equivariant (``X → cX``, ``v0 → v0/c``, ``p0 → p0/c``,
    ``lr → lr/c`` gives ``(v_t, p_t)/c``); raises :class:`NumericalError` naming the step when a
    gradient (plain GD), an iterate or a recorded risk is not a normal double.

    Returns:
      :class:`JointTrajectory`.
    """
    require_unmasked(inst, "attnsvm.peers.run_joint_gd")
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    v = np.array(inst.v) if v0 is None else np.array(check_shape(v0, "v0", (inst.d,), described="(d,)"))
    p = np.zeros(inst.d) if p0 is None else np.array(check_prompt(inst, p0, "p0"))
    vr = None if v_reference is None else check_shape(v_reference, "v_reference", (inst.d,), described="(d,)")
    pr = None if p_reference is None else check_prompt(inst, p_reference, "p_reference")
    at = set(int(s) for s in record_steps(record_at, steps))
    X, Y = inst.X, inst.Y
    ks, K = keys_mantissa(X, Wa)
    rec: list[JointRecord] = []

    def record(t: int) -> None:
        data = joint_data(ks, K, X, v)
        try:
            rec.append(
                JointRecord(
                    t,
                    norm2(v, "||v||"),
                    norm2(p, "||p||"),
                    prompt_risk_of(data, Y, p, lo, "the joint risk L(v, p)"),
                    _tokens(data, p),
                    _cos(v, vr) if vr is not None else math.nan,
                    _cos(p, pr) if pr is not None else math.nan,
                )
            )
        except NumericalError as exc:
            raise NumericalError(f"joint GD, record at step {t}: {exc}") from exc

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        data = joint_data(ks, K, X, v)
        # ∇_p L is exactly zero when every sequence's values are equal (e.g. v = 0): that block
        # is left unchanged. Any other failure (a range error) is raised, never read as zero.
        p_zero = bool(np.all(data.As == data.As[:, :1]))
        try:
            if normalized:
                try:
                    gv = normalized_v_grad_of(X, data, Y, p, lo).direction
                except _ZeroGradient:
                    gv = np.zeros_like(v)
                gp = np.zeros_like(p) if p_zero else normalized_prompt_grad_of(data, Y, p, lo).direction
                if not (np.any(gv) or np.any(gp)):
                    raise NumericalError("both gradients are exactly zero; (v, p) is stationary")
            else:
                gv = v_grad_of(X, data, Y, p, lo)
                gp = np.zeros_like(p) if p_zero else prompt_grad_of(data, Y, p, lo)
        except NumericalError as exc:
            raise NumericalError(f"joint GD at step {t}: {exc}") from exc
        with np.errstate(over="ignore"):
            v, p = v - lr * gv, p - lr * gp
        if not (np.all(np.isfinite(v)) and np.all(np.isfinite(p))):
            raise NumericalError(f"joint GD diverged at step {t}: v or p became non-finite; lower lr")
        if t in at:
            record(t)
    return JointTrajectory(v=v, p=p, record=rec)
