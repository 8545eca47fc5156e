"""Empirical risk of softmax attention, its closed-form gradient, and the normalized direction.

Model: ``f_i = Σ_t s_it a_it`` with ``s_i = softmax(l_i)``, ``l_it = x_itᵀ W z_i``,
``a_it = vᵀx_it``; risk ``L(W) = (1/n) Σ_i ℓ(Y_i f_i)``. Its gradient is

    ∇L(W) = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ.

Numerics. GD drives ``||W|| → ∞`` and the softmax saturates (``s_iα → 1``). Then

* ``a_it − f_i`` computed as a difference cancels catastrophically for ``t = α``
  (``f_i ≈ a_iα``); :func:`risk_grad` uses the cancellation-free form
  ``a_it − f_i = Σ_u s_iu (a_it − a_iu)``, a sum of terms each known to full relative
  precision because the small weights come from log-sum-exp;
* the gradient itself underflows (its size is ``≈ e^{−margin·||W||}``) and ``g/||g||``
  becomes ``0/0``; :func:`normalized_risk_grad` computes every term's logarithm,
  ``log|w_it| = log|ℓ'_i| + log s_it + log|Σ_u s_iu (a_it − a_iu)|``, factors out the
  largest, and normalises what is left, so the unit direction stays exact for
  ``||W||`` in the thousands and beyond, and ``log||∇L||`` is returned alongside.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (gradient, normalized GD);
Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .attention import log_softmax, logits_of
from .errors import NumericalError
from .instance import Instance
from .losses import Loss, LossLike, get_loss

__all__ = [
    "risk",
    "risk_grad",
    "risk_grad_textbook",
    "normalized_risk_grad",
    "GradDirection",
    "risk_of",
    "risk_grad_of",
    "normalized_risk_grad_of",
    "signed_log_derivative",
]

FloatArray = NDArray[np.float64]

EPS = float(np.finfo(np.float64).eps)
#: The normalized direction is refused when ``||∇L|| ≤ CANCELLATION_FACTOR·nT·eps·Σ|w_it| ||x_it|| ||z_i||``:
#: below that, float64 cannot tell the gradient from the rounding of its own sum.
CANCELLATION_FACTOR = 8
#: The error raised there (also by the batched engine, :func:`attnsvm.gd.run_gd_batch`).
CANCELLED_MESSAGE = (
    "the risk gradient's contributions cancel to rounding level at this W "
    f"(||∇L|| ≤ {CANCELLATION_FACTOR}·nT·eps × the sum of their magnitudes): W is stationary up to "
    "rounding and the normalized direction is undefined"
)


class GradDirection(NamedTuple):
    """A unit-Frobenius-norm gradient direction and the log of the gradient's norm.

    ``∇L(W) = exp(log_norm) · direction``; ``direction`` is finite and has norm 1 even when
    ``exp(log_norm)`` underflows to 0.
    """

    direction: FloatArray
    log_norm: float


def _finite(x: Any, what: str) -> Any:
    if not np.all(np.isfinite(x)):
        raise NumericalError(
            f"{what} is not finite (NaN or Inf); check the loss (a custom loss may overflow) "
            "or rescale the data"
        )
    return x


def _forward(
    X: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Token values ``a``, log weights ``log s`` and outputs ``f``."""
    a = X @ v
    log_s = log_softmax(logits_of(X, z, W))
    f = np.sum(np.exp(log_s) * a, axis=1)
    return a, log_s, f


# -------------------------------------------------------------- array forms
def risk_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray, loss: "Loss | LossLike"
) -> float:
    """Array form of :func:`risk` (no validation)."""
    _, _, f = _forward(X, z, v, W)
    return float(_finite(np.mean(loss.value(Y * f)), "the risk"))


def risk_grad_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray, loss: "Loss | LossLike"
) -> FloatArray:
    """Array form of :func:`risk_grad` (no validation)."""
    a, log_s, f = _forward(X, z, v, W)
    s = np.exp(log_s)
    # Cancellation-free: a_it − f_i = Σ_u s_iu (a_it − a_iu). The textbook difference
    # a_iα − f_i subtracts two nearly equal numbers once s_iα ≈ 1 and keeps only
    # ~ −log10(1 − s_iα) of its 16 digits; each term here is exact to a few ulps.
    centred = np.einsum("nu,ntu->nt", s, a[:, :, None] - a[:, None, :])
    dl = _finite(loss.derivative(Y * f), "the loss derivative")
    w = (dl * Y)[:, None] * s * centred / X.shape[0]
    return np.einsum("nt,ntd,ne->de", w, X, z)


def signed_log_derivative(loss: "Loss | LossLike", u: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sign ℓ'(u), log|ℓ'(u)|)``, from the loss's log form when it has one."""
    if isinstance(loss, Loss) and loss.log_neg_derivative_fn is not None:
        return -np.ones_like(u), np.asarray(loss.log_neg_derivative_fn(u), dtype=np.float64)
    d = _finite(np.asarray(loss.derivative(u), dtype=np.float64), "the loss derivative")
    with np.errstate(divide="ignore"):
        return np.sign(d), np.log(np.abs(d))


def _masked_logsumexp(vals: FloatArray, mask: NDArray[np.bool_], axis: int) -> FloatArray:
    """``log Σ_{mask} exp(vals)`` along ``axis``; ``−inf`` where the mask is empty."""
    v = np.where(mask, vals, -np.inf)
    m = np.max(v, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(v - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def normalized_risk_grad_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray, loss: "Loss | LossLike"
) -> GradDirection:
    """Array form of :func:`normalized_risk_grad` (no validation)."""
    n = X.shape[0]
    a, log_s, f = _forward(X, z, v, W)
    diff = a[:, :, None] - a[:, None, :]  # (n, T, T): a_it − a_iu
    terms = log_s[:, None, :] + np.log(np.abs(np.where(diff == 0, 1.0, diff)))
    # log|Σ_u s_iu (a_it − a_iu)| as log(P − N) with P, N the positive and negative parts,
    # each a log-sum-exp, so nothing underflows however small the weights are.
    log_p = _masked_logsumexp(terms, diff > 0, axis=2)
    log_n = _masked_logsumexp(terms, diff < 0, axis=2)
    hi, lo = np.maximum(log_p, log_n), np.minimum(log_p, log_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_c = hi + np.log1p(-np.exp(lo - hi))  # −inf when P = N exactly (c = 0)
    log_c = np.where(np.isneginf(hi), -np.inf, log_c)
    sign_c = np.where(log_p > log_n, 1.0, np.where(log_p < log_n, -1.0, 0.0))
    sign_l, log_l = signed_log_derivative(loss, Y * f)
    log_w = log_l[:, None] + log_s + log_c - np.log(n)
    sign_w = (sign_l * Y)[:, None] * sign_c
    live = np.isfinite(log_w) & (sign_w != 0)
    if not np.any(live):
        raise NumericalError(
            "the risk gradient is exactly zero at this W (every sequence has equal token values "
            "or a zero loss derivative): W is stationary and the normalized direction is undefined"
        )
    top = float(np.max(log_w[live]))
    scaled = np.where(live, sign_w * np.exp(np.where(live, log_w, top) - top), 0.0)
    G = np.einsum("nt,ntd,ne->de", scaled, X, z)
    # Normalise by max|G| before the norm: ||G|| squares the entries, which underflows below
    # ~1e-154 (tiny queries, or a saturated sequence led by a zero token) although G is normal.
    gmax = float(np.max(np.abs(G)))
    unit = G / gmax if gmax > 0 else G
    norm = float(np.linalg.norm(unit))  # = ||G|| / max|G| ∈ [1, d]
    # ||G|| below the rounding level of its own sum means the contributions cancel (e.g. a
    # sequence repeated with the opposite label): what is left is rounding noise, not a direction.
    # Each entry of G sums nT products, so its error is ≤ nT·eps·Σ|scaled_it||x_it||z_i| (Frobenius).
    magnitude = float(np.sum(np.abs(scaled) * np.linalg.norm(X, axis=2) * np.linalg.norm(z, axis=1)[:, None]))
    bound = CANCELLATION_FACTOR * X.shape[0] * X.shape[1] * EPS * magnitude
    if not gmax > 0 or not np.isfinite(norm) or not gmax * norm > bound:
        raise NumericalError(CANCELLED_MESSAGE)
    return GradDirection(unit / norm, top + float(np.log(gmax)) + float(np.log(norm)))


# ---------------------------------------------------------------- public API
def risk(inst: Instance, W: ArrayLike, loss: "str | LossLike" = "logistic") -> float:
    """Empirical risk ``L(W) = (1/n) Σ_i ℓ(Y_i f_i)`` of softmax attention.

    Args:
      inst: the data.
      W: attention matrix, shape ``(d, d)``, finite.
      loss: ``"logistic"``, ``"exponential"``, ``"correlation"`` or a loss object.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return risk_of(inst.X, inst.Y, inst.z, inst.v, Wa, lo)


def risk_grad(inst: Instance, W: ArrayLike, loss: "str | LossLike" = "logistic") -> FloatArray:
    """Gradient ``∇L(W) = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) x_it z_iᵀ``, shape ``(d, d)``.

    Computed in the cancellation-free form ``vᵀx_it − f_i = Σ_u s_iu (vᵀx_it − vᵀx_iu)``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898, eq. for ∇L.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return risk_grad_of(inst.X, inst.Y, inst.z, inst.v, Wa, lo)


def risk_grad_textbook(inst: Instance, W: ArrayLike, loss: "str | LossLike" = "logistic") -> FloatArray:
    """The same gradient with the textbook difference ``vᵀx_it − f_i``.

    Kept as the baseline that tests and benchmarks compare against: once ``s_iα`` is
    within ``δ`` of 1 it loses about ``−log10 δ`` digits. Do not use it for GD.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    a, log_s, f = _forward(inst.X, inst.z, inst.v, Wa)
    s = np.exp(log_s)
    dl = _finite(lo.derivative(inst.Y * f), "the loss derivative")
    w = (dl * inst.Y)[:, None] * s * (a - f[:, None]) / inst.n  # naive: cancels at saturation
    return np.einsum("nt,ntd,ne->de", w, inst.X, inst.z)


def normalized_risk_grad(inst: Instance, W: ArrayLike, loss: "str | LossLike" = "logistic") -> GradDirection:
    """Unit direction ``∇L(W)/||∇L(W)||_F`` and ``log||∇L(W)||_F``, computed from log-magnitudes.

    Stays exact when ``∇L`` underflows (``||W||`` in the thousands): normalized GD is
    ``W ← W − η · direction``. Raises :class:`NumericalError` when the gradient is exactly 0.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return normalized_risk_grad_of(inst.X, inst.Y, inst.z, inst.v, Wa, lo)
