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

Scale (the contract of :mod:`attnsvm.scaling`). Every sequence's tokens, its query and the
values are rescaled by exact powers of two before any product is formed, and the integer
exponents are carried apart from the log weights, so :func:`normalized_risk_grad` is exact for
data of any size (its ``log_norm`` shifts by the log of the factor). :func:`risk_grad` keeps the
fast plain products when an underflow screen shows they are exact to ``eps`` (the common case),
otherwise rebuilds ``∇L = e^top · 2^E · G'`` from the log-domain form; it raises
:class:`GradientRangeError` when ``||∇L||`` is not a normal double, instead of returning zeros,
subnormal digits or Inf. Logits or outputs ``f_i`` beyond 1.8e308 raise naming them; so does a row
of logits spanning more than 1.8e308 when no other term survives (a weight ``e^{−gap}`` is then not
even a double in logs, and the true ``∇L ≠ 0`` is below any double: never returned as 0).

Accuracy (what the checks guarantee, first order in ``eps``). With ``M = Σ_it |w_it|·||x_it||·||z_i||``
(``w_it = ℓ'_i Y_i s_it c_it/n``, ``c_it = Σ_u s_iu (a_it − a_iu)``), ``M̃`` the same with ``|c_it|``
replaced by ``Σ_u s_iu |a_it − a_iu|`` (``M̃ ≥ M``), the values' rounding
``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (|a|_it + |a|_iu)·||x_it||·||z_i||/n``
(``|a| = Σ_k |v_k x_k|``), the logits' rounding ``δl_i = d²·eps·max_t Σ_jk |x_itj W_jk z_ik|`` and the
outputs' ``δf_i`` (:func:`_output_spread`), the computed ``Ĝ`` satisfies

    ||Ĝ − ∇L||_F ≲ (nT + T + d)·eps·M̃ + 2·max_i δl_i·M̃ + max_i κ_i δf_i·M̃ + VE,

``κ_i = |ℓ''/ℓ'| ≤ 1`` (0 for the correlation loss). Both functions refuse (``NumericalError``, "rounding
level") when ``||Ĝ|| ≤ CANCELLATION_FACTOR·(nT·eps·M + VE)``, and ("undetermined") when a sequence that
matters has ``κ_i δf_i > 1``. So a returned result has the sum's and the values' rounding below
``1/CANCELLATION_FACTOR`` of its norm; the other terms are not checked: its relative error is the bound
over ``||∇L||``, which is ``≲ (nT + T + d)·eps`` for O(1) logits and values when the terms do not cancel
(``M̃ ≈ ||∇L||``), but grows with the logits (``δl``), with outputs that cancel (``δf``; ``κδf < 2^−20``
on the plain path, ``≤ 1`` on the log-domain one) and with cancellation between the terms (``M̃/||∇L||``).
The one 0 returned for nonzero terms: their float64 sum cancels exactly (e.g. a sequence repeated with
the opposite label, where ``∇L = 0`` by symmetry), correct to the absolute bound above.

The log-domain form has two shapes. Plain (``|log s_it| ≤ 2^11`` and every rescaled entry of ``X`` and
``v`` 0 or ≥ 2^−511, the ordinary case, bit for bit as before): each term's size is a sum of logs,
``log s_it + log|c_it| + log||x'|| ||z'||``, which rounds its O(1) parts to ``eps·|log s|``: the direction
gains ``≤ 4·eps·(max|log s| + 360) ≤ 1.1e-12`` (``|log ||x'|| ||z'||| < 360`` for keys ≥ 2^−511). Split
(:func:`_split_parts`: log weights beyond 2^11, or a token or value 2^511 below its sequence's largest,
"data spanning the range within one sequence"): every token is rescaled on its own (its value keeps its digits however small it is
next to the others), each term's shared exponent ``log s_it + max_u log s_iu`` and its binary exponents
are kept apart from its O(1) factors, so the logits' rounding enters only through the logit differences
that ``∇L`` depends on (a token and its runner-up sharing ``e^{−gap}`` keep their relative size exactly),
and the rounding level includes the values' underflow (:data:`VALUE_UNDERFLOW_ALLOWANCE`). Before the split,
log weights of size 1e15..1e308 rounded the O(1) parts (and ``d·eps``) away — directions off by up to 0.3
and clear gradients refused as cancelled — and values of keys 1e-300 next to O(1) keys underflowed to 0
(a direction 1.4 off).

Values from per-entry exponents. Every value ``a_it = vᵀx_it`` is formed from the rescaled data where each
product of it is a normal double (the common case, bit for bit as before), otherwise from per-entry exponents
(:func:`attnsvm.model._instance.token_values`): with ``v`` spanning more than 2^1074, ``v·2^−ev`` flushed its
small entries to 0, values 0.75 and 0.5 came out 0 and the direction was 0.03 off, or "exactly zero". A
sequence with no live term whose exact values differ (a difference below their rounding) adds its values'
rounding to the level (:func:`_hidden`): it was left out, and its true term silently dropped.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (gradient, normalized GD);
Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import BoolArray, FloatArray
from ..errors import NumericalError
from ..scaling import (
    EPS,
    FLOAT_MAX,
    FLOAT_TINY,
    LOG_FLOAT_MAX,
    check_log_representable,
    range_error,
)
from ._attention import _log_softmax_raw, logits_of
from ._instance import (
    Instance,
    _products_exact,
    mask_kw,
    pow2_split,
    split_rows,
    token_values,
    values_split_mag,
)
from ._losses import Loss, LossLike, _logistic_value, correlation, exponential, get_loss, logistic

__all__ = [
    "risk",
    "risk_grad",
    "risk_grad_textbook",
    "normalized_risk_grad",
    "GradDirection",
    "GradientRangeError",
    "risk_of",
    "risk_grad_of",
    "normalized_risk_grad_of",
    "signed_log_derivative",
]


_LN2 = math.log(2.0)
#: Safety factor of the plain gradient's underflow screen (:func:`risk_grad_of`): each weight
#: ``w_it`` is a product of up to four factors, each losing ≤ 2^−1074 when it underflows.
UNDERFLOW_SAFETY = 4.0
#: The plain gradient is used only while every output is known to ±2^−20 or better (the
#: log-domain path checks the exact condition, δf ≤ 1, where ``ℓ'(Y f)`` keeps a digit).
PLAIN_F_SPREAD = 2.0**-20
#: A sequence with an undetermined ``ℓ'`` is ignored when its largest possible term is below
#: ``e^{−NEGLIGIBLE_LOG}`` (≈ 1e-20 < eps/100) of the largest determined one.
NEGLIGIBLE_LOG = 46.0
#: The normalized direction is refused when ``||∇L|| ≤ CANCELLATION_FACTOR·nT·eps·Σ|w_it| ||x_it|| ||z_i||``:
#: below that, float64 cannot tell the gradient from the rounding of its own sum.
CANCELLATION_FACTOR = 8
#: The error raised there (also by the batched engine, :func:`attnsvm.gd.run_gd_batch`).
CANCELLED_MESSAGE = (
    "the risk gradient's contributions cancel to rounding level at this W "
    f"(||∇L|| ≤ {CANCELLATION_FACTOR}·nT·eps × the sum of their magnitudes): W is stationary up to "
    "rounding and the normalized direction is undefined"
)


class GradientRangeError(NumericalError):
    """``||∇L||`` is outside float64's normal range: :func:`risk_grad` refuses it.

    ``log_norm`` is ``log||∇L||_F`` (exact, from the log-domain form), so an engine can tell an
    underflow (``log_norm < 0``: the gradient has vanished to float64, normalized steps still work)
    from an overflow.
    """

    def __init__(self, message: str, log_norm: float) -> None:
        super().__init__(message)
        self.log_norm = log_norm


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
            f"{what} is not finite (NaN or Inf): it overflows float64's range [2.2e-308, 1.8e308]; "
            "check the loss (a custom loss may overflow) or rescale the data"
        )
    return x


class _Forward(NamedTuple):
    """The forward pass in rescaled units: every array is O(1), the scales are exponents.

    Per sequence ``i``: ``X_i = 2^ex_i Xs_i``, ``z_i = 2^ez_i zs_i``, ``a_i = vᵀx_i· = 2^ea_i a'_i``
    (integer exponent arrays of shape ``(n,)``); ``log_s`` the true log weights (``−inf`` only below
    −1.8e308); ``f`` the true outputs (raises when they overflow).
    """

    Xs: FloatArray
    zs: FloatArray
    a: FloatArray
    amag: FloatArray
    ex: NDArray[np.int64]
    ez: NDArray[np.int64]
    ea: NDArray[np.int64]
    log_s: FloatArray
    f: FloatArray


def _zero_masked(X: FloatArray, mask: BoolArray | None) -> FloatArray:
    """``X`` with the masked tokens set to 0 (``X`` itself without a mask): their values and norms are 0,
    so they never set a scale, overflow or count as a different token; their weights are 0 from the
    ``−inf`` logits of :func:`logits_of`."""
    return X if mask is None else np.where(mask[:, :, None], X, 0.0)


def _logits(X: FloatArray, z: FloatArray, W: FloatArray, mask: BoolArray | None) -> FloatArray:
    """:func:`logits_of`, looked up at call time, with ``mask`` passed only when there is one (so that the
    convention checks of ``symbolic/`` can substitute a three-argument ``logits_of``)."""
    return logits_of(X, z, W) if mask is None else logits_of(X, z, W, mask=mask)


def _forward_scaled(
    X: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray, mask: BoolArray | None = None
) -> _Forward:
    Xs, ex = split_rows(X, 1)
    zs, ez = split_rows(z, 1)
    # values_split_mag: a = X'_i v' (ea = ex_i + ev) where every rescaled product is normal, else each value
    # from per-entry exponents (v or a key spanning beyond the range: v' flushed values 0.75 to 0);
    # amag = Σ_k|v_k x_itk| in the same units, the values' rounding scale
    a, amag, ea = values_split_mag(X, v)
    log_s = _log_softmax_raw(_logits(X, z, W, mask))
    core = np.sum(np.exp(log_s) * a, axis=1)
    with np.errstate(over="ignore", under="ignore"):
        f = np.ldexp(core, ea)  # f_i = 2^ea_i Σ_t s_it a'_it: a value vᵀx may overflow while f does not
    if not np.all(np.isfinite(f)):
        i = int(np.flatnonzero(~np.isfinite(f))[0])
        raise range_error(
            "the outputs f_i = Σ_t s_it vᵀx_it",
            math.log(abs(float(core[i]))) + float(ea[i]) * _LN2,
            remedy="The loss of a margin beyond 1.8e308 is not computable; scale v or X down",
        )
    return _Forward(Xs, zs, a, amag, ex, ez, ea, log_s, f)


def _output_spread(fw: _Forward, W: FloatArray, loss: Any) -> FloatArray | None:
    """``log δf_i``: ``f_i`` is known only to ``±δf_i``, and ``ℓ'`` moves by ``e^{±κ δf}``.

    ``δf_i = [(T+d)·eps + 2δl_i]·Σ_t s_it|a_it|`` with ``δl_i = d²·eps·max_t Σ|x W z|`` (the logits'
    rounding): ``f = Σ s a`` cancels when large values of both signs share the weight, and the
    logistic or exponential ``ℓ'`` changes by the factor ``e^{±δf}`` (``|ℓ''/ℓ'| ≤ 1``), so beyond
    ``κδf = 1`` (where ``e^{κδf} − 1 ≤ 2κδf`` fails) no digit of that sequence's term is known.
    ``κ = |ℓ''/ℓ'|`` at the worst point ``u + δf``: ``σ(u + δf)`` for the logistic loss (flat for
    ``u → −∞``), 1 for the exponential and any custom loss; ``None`` for the correlation loss
    (``ℓ' = −1``).
    """
    if loss is correlation:
        return None
    n, T, d = fw.Xs.shape
    Ws, ew = pow2_split(W)
    lmag = np.einsum("ntd,nd->nt", np.abs(fw.Xs), np.abs(fw.zs) @ np.abs(Ws).T).max(axis=1)  # Σ|x'W'z'|
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        log_dl = np.log(d * d * EPS * lmag) + (fw.ex + fw.ez + ew) * _LN2
        m = np.sum(np.exp(fw.log_s) * np.abs(fw.a), axis=1)
        log_m = np.log(m) + fw.ea * _LN2
        log_df = log_m + np.logaddexp(math.log((T + d) * EPS), math.log(2.0) + log_dl)
    return log_df  # log δf_i; κ is applied by _refuse_undetermined, which knows u = Y f


def _forward(
    X: FloatArray, z: FloatArray, v: FloatArray, W: FloatArray, mask: BoolArray | None = None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Token values ``a``, log weights ``log s`` and outputs ``f`` (plain, may overflow; the caller
    sets ``np.errstate``). ``X`` has its masked tokens zeroed (:func:`_zero_masked`)."""
    a = X @ v
    log_s = _log_softmax_raw(_logits(X, z, W, mask))
    f = (np.exp(log_s) * a).sum(axis=1)
    return a, log_s, f


def _mean_scaled(vals: FloatArray) -> float:
    """``mean(vals)`` without overflow of the sum (power-of-two rescaled)."""
    vs, e = pow2_split(vals)
    with np.errstate(over="ignore"):
        return float(np.ldexp(np.mean(vs), e))


def _log_loss_values(lo: Any, u: FloatArray) -> FloatArray | None:
    """``log ℓ(u)`` for the built-in positive losses (``None`` for the others)."""
    if lo is logistic:
        # ℓ(u) = softplus(−u) = log1p(e^{−u}) for u > 0; log ℓ ≈ −u once e^{−u} < eps (u > 37).
        with np.errstate(divide="ignore"):
            direct = np.log(np.asarray(_logistic_value(u), dtype=np.float64))
        return np.where(u > 37.0, -u + np.log1p(-0.5 * np.exp(-np.abs(u))), direct)
    if lo is exponential:
        return np.asarray(-u, dtype=np.float64)
    return None


# -------------------------------------------------------------- array forms
def risk_of(
    X: FloatArray,
    Y: FloatArray,
    z: FloatArray,
    v: FloatArray,
    W: FloatArray,
    loss: "Loss | LossLike",
    *,
    mask: BoolArray | None = None,
) -> float:
    """Array form of :func:`risk` (no validation); ``mask`` as :attr:`Instance.mask`."""
    X = _zero_masked(X, mask)
    fw = _forward_scaled(X, z, v, W, mask)
    u = Y * fw.f
    logs = _log_loss_values(loss, u)
    if logs is not None and float(np.max(logs)) > LOG_FLOAT_MAX - 1.0:
        # The built-in positive losses: decide over/underflow from log ℓ (exact), not from ℓ.
        log_risk = float(_masked_logsumexp(logs, np.isfinite(logs), axis=0)) - math.log(len(u))
        check_log_representable("the risk L(W)", log_risk, remedy="Rescale the data or use the logistic loss")
    vals = np.asarray(_finite(loss.value(u), "the loss ℓ(Y_i f_i)"), dtype=np.float64)
    out = _mean_scaled(vals)
    if not math.isfinite(out):
        raise range_error("the risk L(W)", math.log(float(np.max(np.abs(vals)))))
    if logs is not None and out < FLOAT_TINY:
        # ℓ > 0 everywhere: a risk below the normal range is an underflow, not a 0.
        log_risk = float(_masked_logsumexp(logs, np.isfinite(logs), axis=0)) - math.log(len(u))
        check_log_representable("the risk L(W)", log_risk, remedy="Use the log-domain normalized_risk_grad")
    return out


def _refuse_undetermined(log_df: FloatArray, u: FloatArray, size_i: FloatArray, loss: Any) -> None:
    """Raise when a sequence whose ``ℓ'`` is undetermined (``κδf > 1``) may matter to ``∇L``.

    Its term can be as large as ``e^{δf}`` times the computed one (``ℓ'`` at ``u − δf``); it is
    ignored only when even that stays ``e^{−NEGLIGIBLE_LOG}`` below the largest determined sequence.
    """
    df = np.exp(np.minimum(log_df, 700.0))
    if loss is logistic:
        # κ = σ(u + δf) ≤ 1: the logistic ℓ' is flat for u → −∞, where it is −1 whatever δf.
        log_k = -np.logaddexp(0.0, -(u + df))
    else:
        log_k = np.zeros_like(u)
    bad = (log_df + log_k > 0.0) & np.isfinite(size_i)
    if not np.any(bad):
        return
    ok = np.isfinite(size_i) & ~bad
    best_ok = float(np.max(size_i[ok])) if np.any(ok) else -math.inf
    worst = size_i + df  # the term may grow by e^{δf} (ℓ' at u − δf)
    matter = bad & (worst >= best_ok - NEGLIGIBLE_LOG)
    if np.any(matter):
        i = int(np.flatnonzero(matter)[0])
        raise NumericalError(
            f"the output f_{i} = Σ_t s_it vᵀx_it is known only to ±{float(df[i]):.3g} (values of both signs "
            "cancel under rounded weights): the loss derivative ℓ'(Y_i f_i) is undetermined in float64 "
            "(its relative error e^{δf} − 1 exceeds 1). Rescale v, or use the correlation loss"
        )


def _risk_grad_plain(
    X: FloatArray,
    Y: FloatArray,
    z: FloatArray,
    v: FloatArray,
    W: FloatArray,
    loss: "Loss | LossLike",
    mask: BoolArray | None = None,
) -> FloatArray | None:
    """The fast plain gradient, or ``None`` when it may have lost digits (under/overflow).

    ``X`` has its masked tokens zeroed; a masked token has ``s_it = 0`` exactly, so its term is 0."""
    with np.errstate(all="ignore"):
        a, log_s, f = _forward(X, z, v, W, mask)
        s = np.exp(log_s)
        # Cancellation-free: a_it − f_i = Σ_u s_iu (a_it − a_iu). The textbook difference
        # a_iα − f_i subtracts two nearly equal numbers once s_iα ≈ 1 and keeps only
        # ~ −log10(1 − s_iα) of its 16 digits; each term here is exact to a few ulps.
        centred = np.einsum("nu,ntu->nt", s, a[:, :, None] - a[:, None, :])
        try:
            dl = np.asarray(loss.derivative(Y * f), dtype=np.float64)
        except NumericalError:
            return None  # ℓ' overflows (exponential loss): the log-domain path decides
        w = (dl * Y)[:, None] * s * centred / X.shape[0]
        G = np.einsum("nt,ntd,ne->de", w, X, z)
        # Weights and products that underflow each lose at most 2^−1074 (absolute) per factor: w_it
        # (≤ 4 factors, and the d products of each value a = vᵀx) carries that error times |x||z|
        # into G, and each product w·x·z in the sum
        # loses ≤ 2^−1074 more. The plain result is accurate to eps (normwise) when
        # max|G| ≥ UNDERFLOW_SAFETY·nT²d·FLOAT_TINY·[(1+|ℓ'|)(1+|c|+2|a|)·max|x|·max|z| + max|z| + 1]
        # (FLOAT_TINY = 2^−1074/eps); the bracket is formed first so that it cannot underflow.
        gmax = float(np.abs(G).max())
        if not math.isfinite(gmax):
            return None
        # f = Σ s a is known only to ±[(T+d)·eps + 2δl]·Σ s|a| (δl the logits' rounding, at most
        # d²·eps·max|x|·max|W|·max|z|): where that may reach PLAIN_F_SPREAD, ℓ'(Y f) may have lost its
        # digits; the log-domain path decides exactly (and raises).
        if loss is not correlation:
            n_, T_, d_ = X.shape
            dl_bound = (
                d_ * d_ * EPS * float(np.abs(X).max()) * float(np.abs(W).max()) * float(np.abs(z).max())
            )
            spread = ((T_ + d_) * EPS + 2.0 * dl_bound) * float((s * np.abs(a)).sum(axis=1).max())
            if not spread < PLAIN_F_SPREAD:
                return None
        zmax = float(np.abs(z).max())
        bracket = (
            (1.0 + float(np.abs(dl).max()))
            * (1.0 + float(np.abs(centred).max()) + 2.0 * float(np.abs(a).max()))
            * float(np.abs(X).max())
            * zmax
            + zmax
            + 1.0
        )
        n, T, d = X.shape
        level = UNDERFLOW_SAFETY * n * T * T * d * FLOAT_TINY * bracket
        if not (math.isfinite(level) and gmax >= level):
            return None
        # The rounding level of the result, as normalized_risk_grad_of checks it: the sum's own
        # rounding nT·eps·M (M = Σ_it |w_it|·||x_it||·||z_i||) and the values' rounding VE, which enters
        # every a_it − a_iu of two different tokens (their rounded values may differ by d·eps·(|a|_t +
        # |a|_u), |a| = Σ_k |v_k x_k|, however close the true ones are). At or below 8·(nT·eps·M + VE) the
        # plain G may be mostly rounding (a contrived instance had 33 % error): the log-domain path decides
        # (it refuses). Overflow of these sizes (inf, nan) also hands over.
        xn = np.linalg.norm(X, axis=2) * np.linalg.norm(z, axis=1)[:, None]  # ||x_it||·||z_i||
        M = float(np.sum(np.abs(w) * xn))
        amag = np.abs(X) @ np.abs(v)
        # Σ_{u≠t} s_u (|a|_t + |a|_u) in O(nT): an upper bound of _log_grad's sum over the tokens that
        # differ from t (exact copies are not excluded here: a stricter test, the log path decides).
        mix = np.maximum(amag * (1.0 - 2.0 * s) + np.sum(s * amag, axis=1, keepdims=True), 0.0)
        VE = float(np.sum((np.abs(dl) / n)[:, None] * s * (d * EPS) * mix * xn))
        gnorm = gmax * float(np.linalg.norm(G / gmax))
        if not gnorm > CANCELLATION_FACTOR * (n * T * EPS * M + VE):
            return None
    return G


class _LogGrad(NamedTuple):
    """``∇L = e^top · 2^e2 · G``; ``magnitude`` = ``Σ|scaled_it||x_it||z_i|`` in the same units."""

    G: FloatArray
    top: float
    e2: int
    magnitude: float
    zero: bool  # every term is exactly 0: ∇L = 0
    value_error: float = 0.0  # the values' rounding carried into G (same units), see _log_grad
    #: ``log`` of an upper bound on ``||∇L||`` when every nonzero term has a softmax weight below
    #: ``e^{−1.8e308}`` (a logit gap overflowed: no term is representable, even in logs); else ``None``.
    dead_log_bound: float | None = None

    @property
    def log_factor(self) -> float:
        return self.top + self.e2 * _LN2


def _no_live_term(
    X: FloatArray,
    v: FloatArray,
    fw: _Forward,
    log_s: FloatArray,
    log_l: FloatArray,
    sign_w: FloatArray,
    norms: FloatArray,
    mask: BoolArray | None = None,
) -> _LogGrad:
    """No term has a finite log size: ``∇L`` is exactly 0, or below any double, or at value rounding.

    * Dead terms (``log s_it = −inf`` with ``ℓ'_i ≠ 0``, ``a_it ≠ f_i``, ``x_it, z_i ≠ 0``): a row of logits
      spans more than 1.8e308, so ``s_it < e^{−1.8e308}`` is not even a double in logs. The true
      gradient is not 0: ``dead_log_bound`` bounds its log (``|a_t − a_u| ≤ 2d·2^ea_i``,
      ``||x'||·||z'|| ≤ d``, at most ``nT²`` such products).
    * Every computed centred value ``a_it − a_iu`` is 0 but two tokens' exact values ``vᵀx`` differ
      (a difference below the values' rounding): 0 is wrong, its size unknown (``value_error = inf``:
      the callers refuse at rounding level).
    * Otherwise every term is exactly 0 (equal values, ``ℓ' = 0``, or zero tokens/queries).
    """
    n, T, d = X.shape
    d0 = np.zeros((d, d))
    ok_l = np.isfinite(log_l)[:, None]  # ℓ'_i ≠ 0
    dead = np.isneginf(log_s) & (sign_w != 0) & (norms > 0) & ok_l
    if np.any(dead):
        E = (fw.ea + fw.ex + fw.ez) * _LN2
        with np.errstate(divide="ignore"):
            seq = np.where(np.any(dead, axis=1), log_l + E, -np.inf)
        bound = float(np.max(seq)) - FLOAT_MAX + math.log(2.0 * d * d * T * T)  # log s_it < −FLOAT_MAX
        return _LogGrad(d0, 0.0, 0, 0.0, False, 0.0, bound)
    if np.any(_hidden(X, v, fw, np.zeros((n, T), dtype=bool), log_l, norms, mask)):
        return _LogGrad(d0, 0.0, 0, 0.0, False, math.inf)
    return _LogGrad(d0, 0.0, 0, 0.0, True)


def _hidden(
    X: FloatArray,
    v: FloatArray,
    fw: _Forward,
    live: BoolArray,
    log_l: FloatArray,
    norms: FloatArray,
    mask: BoolArray | None,
) -> BoolArray:
    """``(n,)``: the sequences with no live term (every computed ``a_it − a_iu`` 0, ``ℓ'_i ≠ 0``) whose tokens'
    exact values ``vᵀx`` differ: their contribution to ``∇L`` is hidden below the values' rounding.

    The exact values ``Σ_k v_k x_itk`` are compared in rational arithmetic (doubles are exact rationals), only
    for sequences with two different tokens of nonzero size (rare: every computed term of them is 0)."""
    different = np.any(X[:, :, None, :] != X[:, None, :, :], axis=3)
    if mask is not None:  # a masked token is no token of its sequence (its zeroed copy differs from others)
        different &= mask[:, :, None] & mask[:, None, :]
    pair_mag = fw.amag[:, :, None] + fw.amag[:, None, :]
    ok_l = np.isfinite(log_l) & ~np.any(live, axis=1)
    unsure = different & (pair_mag > 0) & (norms > 0)[:, :, None] & ok_l[:, None, None]
    out = np.zeros(X.shape[0], dtype=bool)
    for i in np.flatnonzero(np.any(unsure, axis=(1, 2))):
        out[i] = len({_exact_value(X[i, t], v) for t in range(X.shape[1]) if mask is None or mask[i, t]}) > 1
    return out


def _exact_value(x: FloatArray, v: FloatArray) -> Fraction:
    """``vᵀx`` exactly, as a rational number."""
    return sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, v, strict=True)), Fraction(0))


#: ``log`` of the smallest positive (subnormal) double, 2^−1074: below it a value is 0 in float64.
_LOG_SUBNORMAL_MIN = -1074 * _LN2


def _dead_error(lg: _LogGrad, remedy: str) -> NumericalError:
    """The refusal of a gradient whose every term has a weight below ``e^{−1.8e308}`` (see _no_live_term)."""
    assert lg.dead_log_bound is not None
    if lg.dead_log_bound < _LOG_SUBNORMAL_MIN:
        return GradientRangeError(
            str(
                range_error(
                    "the risk gradient ∇L(W) (Frobenius norm)",
                    -math.inf,
                    remedy="A gap between two logits x_itᵀ W z_i of a sequence exceeds 1.8e308, so a softmax "
                    "weight e^{−gap} and the gradient are far below float64's normal range "
                    "[2.2e-308, 1.8e308] (even log||∇L|| is not a double). " + remedy,
                )
            ),
            -math.inf,
        )
    return NumericalError(
        "the risk gradient ∇L(W) is undetermined in float64: a gap between two logits of a sequence exceeds "
        "1.8e308 (a weight e^{−gap} is not a double, even in logs) while |ℓ'| is as large as e^{gap}. "
        "Scale W (or the data) down"
    )


#: Below this largest entry a vector's squares may underflow: its 2-norm is taken on the vector scaled to
#: unit size (np.linalg.norm squares the entries: ||(9.8e-295,)|| came out 0 and its term was taken for dead).
NORM_SCALE_BELOW = 1e-150


def _norm_no_underflow(a: FloatArray, *, axis: int) -> FloatArray:
    """``||a||₂`` along ``axis``, exact to rounding where the entries' squares underflow: rows whose largest
    entry is below :data:`NORM_SCALE_BELOW` are scaled to unit size first (the others as ``np.linalg.norm``,
    bit for bit)."""
    out = np.linalg.norm(a, axis=axis)
    m = np.max(np.abs(a), axis=axis)
    tiny = (m > 0) & (m < NORM_SCALE_BELOW)
    if np.any(tiny):
        scale = np.where(tiny, m, 1.0)
        out = np.where(tiny, scale * np.linalg.norm(a / np.expand_dims(scale, axis), axis=axis), out)
    return np.asarray(out, dtype=np.float64)


#: Log weights ``|log s_it|`` up to this size are combined as plain sums of logs (the original form, kept
#: bit for bit): an O(1) factor (a norm, a difference of values, ``d·eps``) added to a log of size ``K``
#: keeps it to ``K·eps`` relative, ≤ 2^−42 here (a weight e^−2048 is far below float64's range). Above it a
#: sum ``log s_it + log|c_it|`` of size 1e15..1e308 rounded the O(1) factors away — two terms sharing the
#: factor ``e^{−gap}`` (a token and its runner-up) lost their relative size (directions off by up to 0.3)
#: and ``d·eps`` vanished from the rounding level (clear gradients refused as cancelled) — so there each
#: term keeps its shared exponent apart (:func:`_split_parts`).
LOG_WEIGHT_SPLIT = 2.0**11
#: Data whose rescaled entries all lie in ``[2^−511, 1)`` (or are 0) take the plain form: products of two
#: of them are normal doubles, so no value ``x'ᵀv'`` loses digits to underflow. A smaller entry (a token
#: 1e-300 next to one of size 1 in the same sequence) made values underflow to 0 or to subnormals (a
#: direction 1.4 off); such data take :func:`_split_parts` with every token rescaled on its own.
DATA_SPLIT_BELOW = 2.0**-511
#: The values' underflow allowance in the split form, in a pair's units: a value ``x''ᵀv'`` of per-token
#: rescaled data (entries ≤ 1) whose products underflow loses ≤ ``d·2^−1074`` = ``d·eps·2^−1021``, so
#: ``2^−1020`` added to ``|a|_t + |a|_u`` covers both values of the pair (and the ``ldexp`` that aligns
#: the smaller one) in the rounding level.
VALUE_UNDERFLOW_ALLOWANCE = 2.0**-1020


def _below_split(a: FloatArray, e: Any) -> bool:
    """A nonzero entry of ``a·2^−e`` (``e`` the exponent of its block's largest, broadcast) is below
    :data:`DATA_SPLIT_BELOW`, decided on the exponents of ``a`` itself: ``m·2^(p−e) < 2^−511`` with
    ``m ∈ [½, 1)`` iff ``p − e ≤ −511``. (Read from the rescaled array, an entry more than 2^1074 below its
    block's largest had flushed to 0 and was not seen: ``v = (2^−500, 2^700)`` took the plain form.)"""
    nz = a != 0
    if not np.any(nz):
        return False
    p = np.frexp(a)[1].astype(np.int64) - np.asarray(e, dtype=np.int64)
    return bool(np.any(nz & (p <= math.log2(DATA_SPLIT_BELOW))))


class _Parts(NamedTuple):
    """Per term, the log of its size in ``G`` without ``log|ℓ'_i|/n``, relative to its sequence.

    ``small`` is that log relative to a per-sequence shift ``big`` (``(n,)``, 0 in the plain form);
    in the split form a term's size is ``e^{big_i + small0_it}·2^{kexp_it + seq_k_i}`` exactly (``small``
    = ``small0 + kexp·ln 2``, for choosing the largest) and ``kexp = 0`` at each sequence's largest term.
    ``log_vr`` is the values' rounding of each term in the units of ``small``, ``live`` the terms with a
    finite nonzero size, ``keys`` and ``norms`` the keys and ``||key||·||z'||`` that ``G`` is formed from."""

    big: FloatArray
    small: FloatArray
    small0: FloatArray
    kexp: NDArray[np.int64]
    seq_k: NDArray[np.int64]
    log_vr: FloatArray
    sign_c: FloatArray
    live: BoolArray
    keys: FloatArray
    norms: FloatArray


def _plain_parts(
    log_s: FloatArray,
    fw: _Forward,
    X: FloatArray,
    different: BoolArray,
    log_l: FloatArray,
    sign_lY: FloatArray,
) -> _Parts:
    """The sizes as plain sums of logs: ``log s_it + log|c_it| + log||x'|| ||z'||`` (moderate log weights,
    data in the range of :data:`DATA_SPLIT_BELOW`)."""
    a = fw.a
    diff = a[:, :, None] - a[:, None, :]  # (n, T, T): (a_it − a_iu)·2^−ea, |diff| ≤ 2d
    with np.errstate(divide="ignore"):
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
    log_w = log_l[:, None] + log_s + log_c
    sign_w = sign_lY[:, None] * sign_c
    # Each term's size in G is |w_it|·||x'_it||·||z'_i||: include the norms when choosing the largest
    # (a sequence with z_i = 0 contributes nothing, however large its weights).
    norms = _norm_no_underflow(fw.Xs, axis=2) * _norm_no_underflow(fw.zs, axis=1)[:, None]
    with np.errstate(divide="ignore"):
        log_norms = np.log(norms)
    live = np.isfinite(log_w + log_norms) & (sign_w != 0)
    # The O(1) parts of each term's log, without the sequence's common log|ℓ'_i|/n: adding a huge
    # log|ℓ'_i| (|Y f| ~ 1e12 under the exponential or logistic loss) to them would round them to
    # ulp(log|ℓ'_i|), so the weights *within* a sequence, which do not depend on ℓ'_i, are formed
    # from these alone.
    small = log_s + log_c + log_norms
    # The values' own rounding, d·eps·Σ_k|v_k x_k| per value, enters every difference a_it − a_iu
    # of two different tokens (a token and its exact copy have bitwise equal rounded values, so
    # their difference is exactly 0, as the true one): the term's error is
    # |ℓ'|·s_it·d·eps·Σ_{u: x_iu ≠ x_it} s_iu (|a|_it + |a|_iu)/n, in the units of `small`.
    with np.errstate(divide="ignore", invalid="ignore"):
        pair = log_s[:, None, :] + np.log(fw.amag[:, :, None] + fw.amag[:, None, :])
        log_mix = _masked_logsumexp(pair, different, axis=2)
        log_vr = log_s + log_mix + math.log(X.shape[2] * EPS) + log_norms
    n, T = log_s.shape
    zi = np.zeros(n, dtype=np.int64)
    return _Parts(
        np.zeros(n), small, small, np.zeros((n, T), np.int64), zi, log_vr, sign_c, live, fw.Xs, norms
    )


def _shifted_logsumexp(log_s: FloatArray, rest: FloatArray, mask: BoolArray) -> tuple[FloatArray, FloatArray]:
    """``(m_it, log Σ_{u∈mask_it} e^{log s_iu − m_it + rest_itu})`` with ``m_it = max_{u∈mask_it} log s_iu``.

    The shift is taken out before the O(1) ``rest`` is added, so ``rest`` keeps its digits however large
    ``|log s|`` is; ``m = −inf`` (and the sum ``−inf``) where the mask is empty."""
    m = np.max(np.where(mask, log_s[:, None, :], -np.inf), axis=2)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        rel = np.where(mask, log_s[:, None, :] - m_safe[:, :, None], -np.inf)
        return m, _masked_logsumexp(rel + rest, mask, axis=2)


def _exp2(x: FloatArray, j: NDArray[np.int64]) -> FloatArray:
    """``e^x · 2^j`` without overflow or underflow of ``e^x`` alone (``x`` beyond ±700 with ``j`` the other
    way: a term whose O(1) log and binary exponent pull apart)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # Below e^−1500 of the sequence's largest term a term is 0 to every double's precision.
        keep = np.isfinite(x) & (x + j * _LN2 >= -1500.0)
        xk = np.where(keep, x, 0.0)
        out = np.ldexp(np.exp(np.clip(xk, -700.0, 700.0)), j)
        far = keep & (np.abs(xk) > 700.0)  # then |x| ≤ 1500 + |j| ln 2: p fits, r is exact to eps·|x|
        if np.any(far):
            p = np.floor(np.where(far, xk, 0.0) / _LN2)
            rho = np.where(far, xk, 0.0) - p * _LN2
            big = np.clip(p + j, -4000, 4000).astype(np.int64)
            out = np.where(far, np.ldexp(np.exp(rho), big), out)
        return np.where(keep, out, 0.0)


def _split_parts(
    log_s: FloatArray,
    fw: _Forward,
    X: FloatArray,
    v: FloatArray,
    different: BoolArray,
    log_l: FloatArray,
    sign_lY: FloatArray,
) -> _Parts:
    """The sizes with each term's shared exponents kept apart (log weights beyond :data:`LOG_WEIGHT_SPLIT`,
    or data below :data:`DATA_SPLIT_BELOW`).

    Every token is rescaled on its own, ``x_it = 2^{o_it} x''_it`` relative to its sequence (``o ≤ 0``), so
    its value ``a''_it = x''_itᵀv'`` keeps its digits however small the token is next to the others (where a
    product of ``x''`` and ``v'`` would leave the normal range, from per-entry exponents,
    :func:`attnsvm.model._instance.token_values`, at the value's own offset ``vo_it``), and the difference of
    two values is formed in the pair's units ``2^{max(vo_t, vo_u)}``.
    ``s_it c_it = e^{log s_it + m_it} ĉ_it`` with ``m_it = max_{u: a_iu ≠ a_it} log s_iu`` and
    ``ĉ_it = Σ_u e^{log s_iu − m_it}(a_it − a_iu)`` in the units ``2^{e*_it}`` of its largest pair (its
    largest weight is 1). The exponent ``B_it = log s_it + m_it`` is the same double for a token and its
    partner (``log s_α + log s_β`` either way) and terms are compared through ``B_it − max_t B_it`` before
    their O(1) logs are added, so a log weight of size 1e300 rounds neither the difference of values nor
    the key norms nor ``d·eps`` away; the binary exponents ``e*_it + o_it`` stay integers. The values'
    rounding is formed the same way, with ``m'_it`` the largest log weight of a token that differs from
    ``x_it`` and :data:`VALUE_UNDERFLOW_ALLOWANCE` for products that underflow."""
    n, T, d = X.shape
    Xt, et = split_rows(X, 2)  # x_it = 2^et_it · x''_it, max|x''_it| ∈ [1/2, 1)
    tok = np.any(Xt != 0, axis=2)
    # o_it: the token's exponent relative to its sequence's (≤ 0); far below for a zero token, which then
    # never sets a pair's units.
    off = np.where(tok, et - fw.ex[:, None], -100000).astype(np.int64)
    vs, ev = pow2_split(v)
    if _products_exact(X, v, fw.ex, ev):
        # a_it·2^−ea_i = 2^vo_it·x''_itᵀv' (vo = et + ev − ea: the key's offset `off` where ea = ex + ev)
        a2 = Xt @ vs
        amag2 = np.abs(Xt) @ np.abs(vs)
        voff = np.where(tok, et + ev - fw.ea[:, None], -100000).astype(np.int64)
    else:
        # v (or a key) spans beyond the range: v' would flush entries (values 0.75 came out 0), so each value
        # from per-entry exponents, a_it = a''_it·2^e_it (token_values), vo = e_it − ea_i ≤ 0
        a2, amag2, e_tok = token_values(X, v)
        voff = np.where(amag2 > 0, e_tok - fw.ea[:, None], -100000).astype(np.int64)
    pe = np.maximum(voff[:, :, None], voff[:, None, :])  # a pair's units 2^pe (relative to 2^ea_i)
    with np.errstate(under="ignore"):
        dd = np.ldexp(a2[:, :, None], voff[:, :, None] - pe) - np.ldexp(a2[:, None, :], voff[:, None, :] - pe)
        pm = (
            np.ldexp(amag2[:, :, None], voff[:, :, None] - pe)
            + np.ldexp(amag2[:, None, :], voff[:, None, :] - pe)
            + VALUE_UNDERFLOW_ALLOWANCE
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        log_dd = np.log(np.abs(np.where(dd == 0, 1.0, dd)))
        # The units of each t's sum ĉ_it: those of its dominant pair (largest e^{log s − m}·|dd|·2^pe).
        nz = dd != 0
        mfull = np.max(np.where(nz, log_s[:, None, :], -np.inf), axis=2)
        mfull_safe = np.where(np.isfinite(mfull), mfull, 0.0)
        approx = np.where(nz, (log_s[:, None, :] - mfull_safe[:, :, None]) + log_dd + pe * _LN2, -np.inf)
    ustar = np.argmax(approx, axis=2)
    estar = np.take_along_axis(pe, ustar[:, :, None], axis=2)[:, :, 0]
    estar = np.where(np.any(nz, axis=2), estar, 0)
    rest = log_dd + (pe - estar[:, :, None]) * _LN2  # exactly log|dd| for the dominant pair
    m, log_p = _shifted_logsumexp(log_s, rest, dd > 0)
    m_n, log_n = _shifted_logsumexp(log_s, rest, dd < 0)
    # P and N share the shift: the largest weight over both signs.
    mm = np.maximum(m, m_n)
    mm_safe = np.where(np.isfinite(mm), mm, 0.0)
    with np.errstate(invalid="ignore"):
        log_p = np.where(np.isfinite(m), log_p + (np.where(np.isfinite(m), m, 0.0) - mm_safe), -np.inf)
        log_n = np.where(np.isfinite(m_n), log_n + (np.where(np.isfinite(m_n), m_n, 0.0) - mm_safe), -np.inf)
    hi, lo = np.maximum(log_p, log_n), np.minimum(log_p, log_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_c = hi + np.log1p(-np.exp(lo - hi))  # log|ĉ|: −inf when P = N exactly (c = 0)
    log_c = np.where(np.isneginf(hi), -np.inf, log_c)
    sign_c = np.where(log_p > log_n, 1.0, np.where(log_p < log_n, -1.0, 0.0))
    norms = np.linalg.norm(Xt, axis=2) * _norm_no_underflow(fw.zs, axis=1)[:, None]  # ||x''||·||z'||
    with np.errstate(divide="ignore", invalid="ignore"):
        log_norms = np.log(norms)
        B = log_s + mm  # −inf where either is
    sign_w = sign_lY[:, None] * sign_c
    live = (
        np.isfinite(log_l)[:, None]
        & np.isfinite(B)
        & np.isfinite(log_c)
        & np.isfinite(log_norms)
        & (sign_w != 0)
    )
    K = np.where(live, estar + off, 0).astype(np.int64)  # each term's binary exponent
    big = np.max(np.where(live, B, -np.inf), axis=1)
    big_safe = np.where(np.isfinite(big), big, 0.0)
    with np.errstate(invalid="ignore"):
        small0 = np.where(live, (B - big_safe[:, None]) + log_c + log_norms, -np.inf)
        top_t = np.argmax(np.where(live, small0 + K * _LN2, -np.inf), axis=1)
    seq_k = np.where(np.any(live, axis=1), K[np.arange(n), top_t], 0).astype(np.int64)
    kexp = np.where(live, K - seq_k[:, None], 0).astype(np.int64)
    small = np.where(live, small0 + kexp * _LN2, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        m2, log_mix = _shifted_logsumexp(log_s, np.log(pm) + pe * _LN2, different)
        B2 = log_s + m2
        # (a sequence without a live term: big_safe = seq_k = 0, so its log_vr is absolute, for _hidden_error)
        log_vr = np.where(
            np.isfinite(B2),
            (B2 - big_safe[:, None])
            + log_mix
            + math.log(d * EPS)
            + log_norms
            + (np.where(tok, off, 0) - seq_k[:, None]) * _LN2,
            -np.inf,
        )
    return _Parts(big, small, small0, kexp, seq_k, log_vr, sign_c, live, Xt, norms)


def _log_grad(
    X: FloatArray,
    Y: FloatArray,
    z: FloatArray,
    v: FloatArray,
    W: FloatArray,
    loss: "Loss | LossLike",
    mask: BoolArray | None = None,
) -> _LogGrad:
    """The gradient from log-magnitudes and power-of-two rescaled data (see the module docstring).

    ``X`` has its masked tokens zeroed: their log weights are ``−inf`` and their norms 0, so they have
    no live term, are never "dead" terms and add nothing to the values' rounding."""
    n = X.shape[0]
    fw = _forward_scaled(X, z, v, W, mask)
    log_kdf = _output_spread(fw, W, loss)
    log_s = fw.log_s
    different = np.any(X[:, :, None, :] != X[:, None, :, :], axis=3)  # (n, T, T); False on the diagonal
    sign_l, log_l = signed_log_derivative(loss, Y * fw.f)
    finite_s = np.abs(log_s[np.isfinite(log_s)])
    split = (
        (finite_s.size > 0 and float(np.max(finite_s)) > LOG_WEIGHT_SPLIT)
        or _below_split(X, fw.ex[:, None, None])
        or _below_split(v, pow2_split(v)[1])
    )
    if split:
        parts = _split_parts(log_s, fw, X, v, different, log_l, sign_l * Y)
    else:
        parts = _plain_parts(log_s, fw, X, different, log_l, sign_l * Y)
    live, small, norms = parts.live, parts.small, parts.norms
    sign_w = (sign_l * Y)[:, None] * parts.sign_c
    if not np.any(live):
        return _no_live_term(X, v, fw, log_s, log_l, sign_w, norms, mask)
    # Sequence i contributes e^{log_w_it} · 2^{E_i} · x'_it z'_iᵀ with the integer E_i = ea_i + ex_i + ez_i
    # (the data's scale, kept exact; in the split form also the largest term's own exponent) and
    # |x'|, |z'| < 1. Factor out the largest sequence, e^top · 2^E*, and rescale the others by
    # 2^(q_i + E_i − E*) · e^{r_i}, q_i ln2 + r_i = top_i − top.
    E = fw.ea + fw.ex + fw.ez + parts.seq_k
    small_top_i = np.max(np.where(live, small, -np.inf), axis=1)
    has = np.isfinite(small_top_i)
    if split:
        top_i = np.where(has, log_l - np.log(n) + parts.big + np.where(has, small_top_i, 0.0), -np.inf)
    else:
        top_i = np.where(has, log_l - np.log(n) + np.where(has, small_top_i, 0.0), -np.inf)
    size_i = np.where(has, top_i + E * _LN2, -np.inf)  # log of each sequence's largest term
    if log_kdf is not None:
        _refuse_undetermined(log_kdf, Y * fw.f, size_i, loss)
    star = int(np.argmax(size_i))
    if split:
        # top_i − top by parts: the O(1) parts of two sequences with log weights of size 1e300 would
        # otherwise be rounded away (and with them which one is larger).
        def gap(j: int) -> FloatArray:
            with np.errstate(invalid="ignore"):
                return np.where(
                    has,
                    (log_l - log_l[j]) + (parts.big - parts.big[j]) + (small_top_i - small_top_i[j]),
                    -np.inf,
                )

        star = int(np.argmax(gap(star) + (E - E[star]) * _LN2))
        rel = gap(star)
    else:
        rel = top_i - top_i[star]
    top, E_star = float(top_i[star]), int(E[star])
    # A sequence whose largest term is below e^−4000 of the largest sequence's — judged on its whole
    # log size, the exponent gap E_i − E* included (clipping top_i − top alone before adding the gap
    # gave a wrong size) — is 0 to every double's precision; the others keep their exact shift.
    use = has & (((rel + (E - E_star) * _LN2) if split else (size_i - size_i[star])) >= -4000.0)
    D = np.where(use, rel, 0.0)  # ≥ −4000 − |E_i − E*|·ln 2: q fits an int, q ln2 + r is exact
    q = np.floor(D / _LN2)
    r = D - q * _LN2
    # Clipped: a shift below −4000 leaves 0 either way (doubles end at 2^−1074), and it fits an int.
    shift = np.clip(np.where(use, q + E - E_star, 0), -4000, 4000).astype(np.int64)
    live = live & use[:, None]
    top_small = np.where(has, small_top_i, 0.0)[:, None]
    with np.errstate(under="ignore"):  # terms below 2^−1074 of the largest are 0 to that accuracy
        if split:  # e^{small0 − small0_top}·2^kexp: the binary exponents exact
            within = np.where(live, _exp2(np.where(live, parts.small0 - top_small, -np.inf), parts.kexp), 0.0)
        else:
            within = np.exp(np.where(live, small - top_small, -np.inf))  # ≤ 1
        sized = np.ldexp(within * np.exp(r)[:, None], shift[:, None])  # |w_it|·||x'||·||z'||, scaled
        scaled = sign_w * sized / np.where(norms > 0, norms, 1.0)
        # The values' rounding in the units of `scaled` (relative to the sequence's largest term:
        # log|ℓ'_i|/n cancels, see `small`).
        log_vr = parts.log_vr
        vr_ok = np.isfinite(log_vr) & use[:, None] & np.isfinite(log_l)[:, None]
        vr = np.where(
            vr_ok,
            np.ldexp(
                np.exp(np.minimum(np.where(vr_ok, log_vr, 0.0) - top_small, 700.0)) * np.exp(r)[:, None],
                shift[:, None],
            ),
            0.0,
        )
    G = np.einsum("nt,ntd,ne->de", scaled, parts.keys, fw.zs)
    magnitude = float(np.sum(sized))
    value_error = float(np.sum(vr))
    hidden = _hidden(X, v, fw, parts.live, log_l, norms, mask)
    if np.any(hidden):
        # A sequence with no live term whose exact values differ (a difference below their rounding): its
        # true term is at most its values' rounding, which enters the rounding level as the others' does
        # (left out, its contribution was silently dropped: values 1 and 1 + 2^−60 next to a live sequence
        # 1e11 times smaller gave that sequence's direction). Its log_vr is absolute (no live term: no shift),
        # so in G's units: (log_l_i − log_l*) + (log_vr_it − big* − small_top*) and 2^(E_i − E*).
        with np.errstate(invalid="ignore"):
            rel_l = np.where(hidden, log_l - log_l[star], -np.inf)[:, None]
            D_h = rel_l + (parts.log_vr - (parts.big[star] + float(top_small[star, 0])))
        D_h = np.where(hidden[:, None] & np.isfinite(D_h), D_h, -np.inf)
        value_error += float(
            np.sum(_exp2(D_h, np.broadcast_to((fw.ea + fw.ex + fw.ez - E_star)[:, None], D_h.shape)))
        )
    return _LogGrad(G, top, E_star, magnitude, False, value_error)


def _times_exp(G: FloatArray, top: float, e2: int) -> FloatArray:
    """``G · e^top · 2^e2`` without overflow or underflow of the factor itself.

    The power of two is applied exactly (``ldexp``); only ``e^r``, ``r = top − k ln 2 ∈ [0, ln 2)``,
    is rounded, so the data's scale adds no error (``top`` carries that of the log weights).
    """
    k = math.floor(top / _LN2)
    return np.ldexp(G * math.exp(top - k * _LN2), k + e2)


def risk_grad_of(
    X: FloatArray,
    Y: FloatArray,
    z: FloatArray,
    v: FloatArray,
    W: FloatArray,
    loss: "Loss | LossLike",
    *,
    mask: BoolArray | None = None,
) -> FloatArray:
    """Array form of :func:`risk_grad` (no validation); ``mask`` as :attr:`Instance.mask`.

    The plain product form is used when it is safe (the common case, hot in GD loops); near the
    ends of float64's range the gradient is rebuilt from the log-domain form, or refused with
    :class:`GradientRangeError` (a :class:`~attnsvm.NumericalError` carrying ``log_norm``: engines
    catch it to stop plain GD with "gradient underflow").
    """
    X = _zero_masked(X, mask)
    G = _risk_grad_plain(X, Y, z, v, W, loss, mask)
    if G is not None:
        return G
    lg = _log_grad(X, Y, z, v, W, loss, mask)
    d = X.shape[2]
    if lg.zero:
        return np.zeros((d, d))
    remedy = "Use normalized_risk_grad, which returns the direction and log||∇L|| exactly at any scale"
    if lg.dead_log_bound is not None:
        # A logit gap overflowed: the true gradient is not 0 but below any double (never return 0).
        raise _dead_error(lg, "Scale W down")
    gmax = float(np.max(np.abs(lg.G))) if lg.G.size else 0.0
    if gmax == 0.0 and lg.magnitude > 0.0:
        # Nonzero terms whose float64 sum cancels exactly (e.g. a sequence repeated with the opposite
        # label, ∇L = 0 by symmetry): 0, to the absolute accuracy nT·eps·M + VE (documented). Without
        # a nonzero term (magnitude 0: the values' differences all rounded to 0) it is refused below.
        return np.zeros((d, d))
    norm = float(np.linalg.norm(lg.G / gmax)) if gmax > 0 else 0.0
    # The same rounding-level refusal as normalized_risk_grad_of: at or below it the computed G is
    # mostly the rounding of its own sum or of the values, not ∇L (never returned as a number).
    bound = CANCELLATION_FACTOR * (X.shape[0] * X.shape[1] * EPS * lg.magnitude + lg.value_error)
    if not gmax * norm > bound:
        raise NumericalError(f"the risk gradient ∇L(W) is undetermined in float64: {CANCELLED_MESSAGE}")
    log_norm = lg.log_factor + math.log(gmax) + math.log(norm)
    # Below FLOAT_TINY the entries would be subnormal, with fewer than 53 significant bits.
    try:
        check_log_representable("the risk gradient ∇L(W) (Frobenius norm)", log_norm, remedy=remedy)
    except NumericalError as exc:
        raise GradientRangeError(str(exc), log_norm) from None
    with np.errstate(under="ignore"):
        out = _times_exp(lg.G, lg.top, lg.e2)
    return _finite(out, "the risk gradient ∇L(W)")


def signed_log_derivative(loss: "Loss | LossLike", u: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``(sign ℓ'(u), log|ℓ'(u)|)``, from the loss's log form when it has one.

    ``log|ℓ'| = −inf`` (``ℓ' = 0``) is returned; ``log|ℓ'| = +inf`` or NaN (a custom loss whose derivative, or
    its log, overflows at a margin ``u``) raises :class:`~attnsvm.NumericalError` naming the margin, never
    handed on: a ``+inf`` log read as "no live term" made the gradient "exactly zero" (and ``risk_grad``
    returned 0) where the true ``∇L`` is not 0.
    """
    u = np.asarray(u, dtype=np.float64)
    if isinstance(loss, Loss) and loss.log_neg_derivative_fn is not None:
        log_d = np.asarray(loss.log_neg_derivative_fn(u), dtype=np.float64)
        _check_log_derivative(log_d, u)
        return -np.ones_like(u), log_d
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.asarray(loss.derivative(u), dtype=np.float64)
    if not np.all(np.isfinite(d)):
        i = int(np.flatnonzero(~np.isfinite(np.broadcast_to(d, u.shape)))[0])
        raise NumericalError(
            f"the loss derivative is not finite (NaN or Inf) at the margin u = Y_{i} f_{i} = {float(u.flat[i]):.6g}: "
            "ℓ'(u) overflows float64's range [2.2e-308, 1.8e308] there (never a zero gradient). Give the loss "
            "a log_neg_derivative_fn (attnsvm.Loss(..., log_neg_derivative_fn=...): log(−ℓ'(u)), finite where "
            "ℓ' itself overflows), or rescale the data (v, X) so that the margins Y_i f_i are moderate"
        )
    with np.errstate(divide="ignore"):
        return np.sign(d), np.log(np.abs(d))


def _check_log_derivative(log_d: FloatArray, u: FloatArray) -> None:
    """Raise where ``log(−ℓ'(u))`` from a loss's ``log_neg_derivative_fn`` is ``+inf`` or NaN (``−inf``,
    ``ℓ' = 0``, is a value)."""
    bad = np.isnan(log_d) | np.isposinf(log_d)
    if np.any(bad):
        i = int(np.flatnonzero(np.broadcast_to(bad, u.shape))[0])
        what = "NaN" if bool(np.isnan(np.broadcast_to(log_d, u.shape).flat[i])) else "+inf"
        raise NumericalError(
            f"the loss derivative is not finite at the margin u = Y_{i} f_{i} = {float(u.flat[i]):.6g}: the "
            f"loss's log_neg_derivative_fn gives log(−ℓ'(u)) = {what}, so |ℓ'(u)| overflows float64's range "
            "[2.2e-308, 1.8e308] even in logs (never a zero gradient). Make log_neg_derivative_fn return "
            "log(−ℓ'(u)) as a finite number there (computed without exponentiating), or rescale the data "
            "(v, X) so that the margins Y_i f_i are moderate"
        )


def _masked_logsumexp(vals: FloatArray, mask: NDArray[np.bool_], axis: int) -> FloatArray:
    """``log Σ_{mask} exp(vals)`` along ``axis``; ``−inf`` where the mask is empty."""
    v = np.where(mask, vals, -np.inf)
    m = np.max(v, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(v - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def normalized_risk_grad_of(
    X: FloatArray,
    Y: FloatArray,
    z: FloatArray,
    v: FloatArray,
    W: FloatArray,
    loss: "Loss | LossLike",
    *,
    mask: BoolArray | None = None,
) -> GradDirection:
    """Array form of :func:`normalized_risk_grad` (no validation); ``mask`` as :attr:`Instance.mask`."""
    lg = _log_grad(_zero_masked(X, mask), Y, z, v, W, loss, mask)
    if lg.zero:
        raise NumericalError(
            "the risk gradient is exactly zero at this W (every sequence has equal token values "
            "or a zero loss derivative): W is stationary and the normalized direction is undefined"
        )
    if lg.dead_log_bound is not None:
        raise _dead_error(lg, "Scale W down: the direction is then defined by representable weights")
    G = lg.G
    # Normalise by max|G| before the norm: ||G|| squares the entries, which underflows below
    # ~1e-154 (tiny queries, or a saturated sequence led by a zero token) although G is normal.
    gmax = float(np.max(np.abs(G)))
    unit = G / gmax if gmax > 0 else G
    norm = float(np.linalg.norm(unit))  # = ||G|| / max|G| ∈ [1, d]
    # ||G|| below the rounding level of its own sum means the contributions cancel (e.g. a
    # sequence repeated with the opposite label): what is left is rounding noise, not a direction.
    # Each entry of G sums nT products, so its error is ≤ nT·eps·Σ|scaled_it||x_it||z_i| (Frobenius).
    # ... and the values' own rounding (a_it − a_iu of two nearly equal values keeps few digits).
    bound = CANCELLATION_FACTOR * (X.shape[0] * X.shape[1] * EPS * lg.magnitude + lg.value_error)
    if not gmax > 0 or not np.isfinite(norm) or not gmax * norm > bound:
        raise NumericalError(CANCELLED_MESSAGE)
    return GradDirection(unit / norm, lg.log_factor + math.log(gmax) + math.log(norm))


# ---------------------------------------------------------------- public API
def risk(inst: Instance, W: ArrayLike, *, loss: "str | LossLike" = "logistic") -> float:
    """Empirical risk ``L(W) = (1/n) Σ_i ℓ(Y_i f_i)`` of softmax attention.

    With a token mask (:attr:`Instance.mask`) ``f_i`` is the output over the allowed tokens of sequence
    ``i``: the risk of the instance with the masked tokens deleted.

    Args:
      inst: the data.
      W: attention matrix, shape ``(d, d)``, finite.
      loss: ``"logistic"``, ``"exponential"``, ``"correlation"`` or a loss object.

    Scale: any finite data; to ``≲ (d+T)·eps`` relative for the built-in losses. Raises
    :class:`~attnsvm.NumericalError` when a logit, an output ``f_i`` or the risk itself leaves
    [2.2e-308, 1.8e308] (a positive risk below it is refused, never returned as 0).
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return risk_of(inst.keys, inst.Y, inst.z, inst.v, Wa, lo, **mask_kw(inst))


def risk_grad(inst: Instance, W: ArrayLike, *, loss: "str | LossLike" = "logistic") -> FloatArray:
    """Gradient ``∇L(W) = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) x_it z_iᵀ``, shape ``(d, d)``.

    Computed in the cancellation-free form ``vᵀx_it − f_i = Σ_u s_iu (vᵀx_it − vᵀx_iu)``. With a token
    mask (:attr:`Instance.mask`) the sums over ``t`` and ``u`` run over the allowed tokens (``s_it = 0``
    at a masked one): the gradient of the instance with the masked tokens deleted.

    Scale: any finite data; returned when ``||∇L||_F`` lies in [2.2e-308, 1.8e308] (or every term is
    exactly 0, or the float64 sum of the terms cancels exactly); otherwise raises
    :class:`GradientRangeError` (a :class:`~attnsvm.NumericalError`) pointing to
    :func:`normalized_risk_grad`, never a subnormal, 0 or Inf gradient. Also raises when a logit or an
    output ``f_i`` exceeds 1.8e308, when a logit gap exceeds 1.8e308 and no other term survives.
    Accuracy: normwise error ``≲ (nT+T+d)·eps·M̃ + 2δl·M̃ + κδf·M̃ + VE`` (module docstring); raises
    ``NumericalError`` ("rounding level") when ``||∇L|| ≤ 8·(nT·eps·M + VE)``, where the computed value
    would be mostly rounding, and ("undetermined") where ``ℓ'(Y_i f_i)`` has no correct digit, and ("not finite")
    where a custom loss's ``ℓ'(Y_i f_i)`` overflows even in logs (:func:`signed_log_derivative`; never a 0).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898, eq. for ∇L.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return risk_grad_of(inst.keys, inst.Y, inst.z, inst.v, Wa, lo, **mask_kw(inst))


def risk_grad_textbook(inst: Instance, W: ArrayLike, *, loss: "str | LossLike" = "logistic") -> FloatArray:
    """The same gradient with the textbook difference ``vᵀx_it − f_i``.

    Kept as the baseline that tests and benchmarks compare against: once ``s_iα`` is
    within ``δ`` of 1 it loses about ``−log10 δ`` digits. Do not use it for GD.

    Scale: moderate data only (no rescaling); raises :class:`~attnsvm.NumericalError` instead of
    returning NaN/Inf when an intermediate overflows. Its documented inaccuracy stays.
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    with np.errstate(over="ignore", invalid="ignore"):
        a, log_s, f = _forward(inst.keys, inst.z, inst.v, Wa, inst.mask)
        s = np.exp(log_s)
    dl = _finite(lo.derivative(inst.Y * f), "the loss derivative")
    with np.errstate(all="ignore"):
        w = (dl * inst.Y)[:, None] * s * (a - f[:, None]) / inst.n  # naive: cancels at saturation
        G = np.einsum("nt,ntd,ne->de", w, inst.keys, inst.z)
    return _finite(G, "the textbook risk gradient (use risk_grad, which rescales)")


def normalized_risk_grad(
    inst: Instance, W: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> GradDirection:
    """Unit direction ``∇L(W)/||∇L(W)||_F`` and ``log||∇L(W)||_F``, computed from log-magnitudes.

    Stays exact when ``∇L`` underflows (``||W||`` in the thousands): normalized GD is
    ``W ← W − η · direction``. Raises :class:`NumericalError` when the gradient is exactly 0.
    Masked tokens (:attr:`Instance.mask`) take no part, as in :func:`risk_grad`.

    Scale: any finite data; the direction is invariant under power-of-two rescaling of ``X``,
    ``z``, ``v`` (with ``W`` keeping the logits) and ``log_norm`` shifts by the log of the factor.
    Accuracy: direction to ``2ε`` normwise and ``log_norm`` to ``ε`` absolute (plus ``eps·|log w|`` of
    the log-domain rounding), ``ε = (||Ĝ − ∇L|| bound of the module docstring)/||∇L||``: ``≲ (nT+T+d)·eps``
    for moderate logits and values without cancellation. The logits' rounding ``δl`` enters only through
    the logit differences the gradient depends on (module docstring: the split form, for log weights
    beyond 2^11 and data spanning the range within one sequence; the plain form adds
    ``≤ 4·eps·(max|log s| + 360)``), so e.g. a saturated token and its runner-up give the exact direction
    at any ``||W||``. Raises :class:`~attnsvm.NumericalError` when
    a logit or an output ``f_i`` exceeds 1.8e308 (naming it), when a logit gap exceeds 1.8e308 and no
    other term survives (``log||∇L||`` is then below −1.8e308), when the contributions cancel to
    rounding level (``||∇L|| ≤ 8·(nT·eps·M + VE)``), where ``ℓ'(Y_i f_i)`` is undetermined, and where a custom
    loss's ``ℓ'(Y_i f_i)`` overflows even in logs (``log|ℓ'| = +inf`` or NaN: "not finite", never "exactly zero").
    """
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    return normalized_risk_grad_of(inst.keys, inst.Y, inst.z, inst.v, Wa, lo, **mask_kw(inst))
