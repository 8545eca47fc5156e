"""Prompt attention: a trainable prompt ``p`` attending over the tokens, its p-SVM and GD on ``p``.

Model (Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596): with a fixed key matrix ``W`` and a fixed
head ``v``, sequence ``i`` gives

    f_i = vᵀ X_iᵀ softmax(X_i W p),   logits  l_it = k_itᵀ p,   keys  k_it = Wᵀ x_it,

and the risk is ``L(p) = (1/n) Σ_i ℓ(Y_i f_i)``. Its gradient is

    ∇_p L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) k_it,

and GD on ``p`` converges in direction to the p-SVM solution

    p_mm(α) = argmin ||p||₂  s.t.  (k_iα_i − k_it)ᵀ p ≥ 1   for all t ≠ α_i, all i.

Reparametrisation (used to reuse the core's stable gradient, and proved exactly in
``symbolic/test_peer_gradients.py``). Put ``x'_it = (k_it, vᵀx_it) ∈ ℝ^{d+1}``, the constant query
``z' = e_0``, the head ``v' = e_d`` and ``W' = [p; 0] e_0ᵀ``. Then ``x'_itᵀ W' z' = k_itᵀ p`` and
``v'ᵀ x'_it = vᵀ x_it``, so the prompt model *is* the core model on the augmented data and
``∇_p L = ∇_{W'} L [:d, 0]``: the cancellation-free gradient
(:func:`attnsvm.model._grad.risk_grad_of`) and the log-domain normalized direction
(:func:`attnsvm.model._grad.normalized_risk_grad_of`) apply unchanged. The core direction is the unit
vector of the whole column ``(∇_p L, Σ w_it vᵀx_it)``; we drop the last entry and renormalise,
which keeps full relative precision because every entry of the core's direction is computed
from factored-out log-magnitudes.

Likewise the p-SVM is the core Att-SVM on keys ``X' = K`` with constant query ``e_0``:
``W' = p e_0ᵀ`` has ``||W'||_F = ||p||``; we solve it with the same certified min-norm solver
(:mod:`attnsvm.svm`), on the Gram matrix ``(Δk_r · Δk_s)``.

Scale contract (issue 13). Keys, values, logits, SVM rows and the core gradient are formed from
power-of-two mantissas (largest entry in ``[½, 1)``) and the exponents are carried separately
(``k = 2^K·k'``, ``vᵀx = 2^A·a'``, ``W_eff = 2^K·p e_0ᵀ``, the loss evaluated at ``2^A·u'``), so
no intermediate over- or underflows (where one power of two per array would round the small entries of a
``v``, ``W`` or ``p`` spanning beyond the range to a few-bit subnormal, keys, values and logits are formed
from per-entry exponents: :func:`product_mantissa`); an answer is put back with one exact ``ldexp`` and refused
with :class:`~attnsvm.NumericalError` (:func:`attnsvm.scaling.range_error`) only when its largest
entry is not a normal double. The helpers of that section are shared by :mod:`attnsvm.peers._joint`,
:mod:`attnsvm.peers._mirror` and :mod:`attnsvm.peers._multitoken`.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (prompt attention, p-SVM,
regularization path); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import as_real_array, check_int, check_positive, check_shape
from ..errors import AttnSVMError, InfeasibleSVMError, InvalidInstanceError, NumericalError
from ..gd import projected_path
from ..gd._single import record_steps
from ..model._attention import logits_of
from ..model._grad import CANCELLED_MESSAGE, GradDirection, normalized_risk_grad_of, risk_grad_of
from ..model._instance import Instance, _products_exact, require_unmasked, token_values, values_split_mag
from ..model._losses import Loss, LossLike, get_loss
from ..scaling import FLOAT_TINY, LOG_FLOAT_MAX, LOG_FLOAT_TINY, pow2_split, range_error
from ..svm import SUPPORT_RTOL, KKTResiduals, MinNormSolution, min_norm_dual
from ..svm._dual import _min_norm_rows

__all__ = [
    "prompt_keys",
    "prompt_logits",
    "prompt_attention",
    "prompt_output",
    "prompt_risk",
    "prompt_grad",
    "normalized_prompt_grad",
    "PromptSVMSolution",
    "solve_prompt_svm",
    "prompt_local_optimality",
    "PromptRecord",
    "PromptTrajectory",
    "run_prompt_gd",
    "PromptPathPoint",
    "prompt_regularization_path",
]


# ================================================================== validation
def check_prompt(inst: Instance, p: ArrayLike, name: str = "p") -> FloatArray:
    """Validate a prompt vector: finite real, shape ``(d,)`` (returns a float64 copy)."""
    require_unmasked(inst, "attnsvm.peers.check_prompt")
    return check_shape(p, name, (inst.d,), described="(d,)", note=" for this instance")


# ============================================================ min-norm problems
def solve_min_norm_or_raise(
    rows: FloatArray,
    b: FloatArray,
    equality: NDArray[np.bool_] | None,
    pairs: NDArray[np.intp],
    what: str,
    factor: FloatArray | None = None,
) -> MinNormSolution:
    """``min ½||x||² s.t. rows·x ≥ b`` (``= b`` on ``equality``) by the certified solver of :mod:`attnsvm.svm`.

    ``rows`` (shape ``(m, k)``) is passed as the factor ``L`` of the Gram matrix ``K = rows rowsᵀ``
    (more accurate than factoring ``K``: ``cond(A)`` instead of ``cond(K)``); the solution is
    ``x = rowsᵀ · multipliers``. An infeasible problem raises :class:`InfeasibleSVMError` naming
    a pair ``(i, t)`` of ``pairs`` responsible when one row is zero.
    """
    L = rows if factor is None else factor
    try:
        return min_norm_dual(L @ L.T, b, equality=equality, factor=L)
    except InfeasibleSVMError as exc:
        raise InfeasibleSVMError(f"{_explain_infeasible(rows, pairs, what)} ({exc})") from exc


def solve_min_norm_rows_or_raise(
    rows: FloatArray,
    R: NDArray[np.int64],
    b: FloatArray,
    pairs: NDArray[np.intp],
    what: str,
    *,
    equality: NDArray[np.bool_] | None = None,
) -> tuple[MinNormSolution, int]:
    """``min ½||x||² s.t. (2^{R_r}·rows_r)·x ≥ b_r`` (``= b_r`` on ``equality``), each row a mantissa with its
    own exponent ``R_r``.

    The certified solver of :mod:`attnsvm.svm` on rows any number of binades apart (a shared exponent
    would square the smallest rows below float64's range and read them as zero). Returns ``(sol, G)`` at
    the posed scale: ``x = 2^G·rowsᵀ·sol.multipliers``, ``λ_r = 2^{G−R_r}·sol.multipliers_r`` (see
    :func:`attnsvm.svm._dual._min_norm_rows`). An infeasible problem raises :class:`InfeasibleSVMError`
    naming a pair ``(i, t)`` of ``pairs`` responsible when one row is zero.
    """
    try:
        return _min_norm_rows(rows, R, b, equality)
    except InfeasibleSVMError as exc:
        raise InfeasibleSVMError(f"{_explain_infeasible(rows, pairs, what)} ({exc})") from exc


def row_mantissas(a: FloatArray) -> tuple[FloatArray, NDArray[np.int64]]:
    """``a_r = 2^{e_r}·m_r`` per row, ``max|m_r| ∈ [½, 1)`` (a zero row: ``m_r = 0``, ``e_r = 0``); exact."""
    e = np.frexp(np.max(np.abs(a), axis=1))[1].astype(np.int64)
    return np.ldexp(a, -e[:, None]), e


def put_back_rows(m: FloatArray, e: NDArray[np.int64], what: str, *, remedy: str = "") -> FloatArray:
    """``m_r·2^{e_r}`` (entry or row ``r`` of ``m``, one exponent each) when the largest ``|m_r|·2^{e_r}`` is a
    normal double (or all are zero); else the range error. As :func:`put_back`, smaller entries keep an
    absolute error ``≤ 2^−1075`` (gradual underflow), far below ``eps`` of the largest.
    """
    a = np.abs(m) if m.ndim == 1 else np.max(np.abs(m), axis=1)
    live = a > 0
    if not np.any(live):
        return np.zeros_like(m)
    log_big = float(np.max(np.log(a[live]) + e[live] * _LN2))
    if not (LOG_FLOAT_TINY <= log_big <= LOG_FLOAT_MAX):
        raise range_error(what, log_big, remedy=remedy)
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(m, e if m.ndim == 1 else e[:, None])
    if not np.all(np.isfinite(out)) or float(np.max(np.abs(out))) < FLOAT_TINY:  # the interval's ends
        raise range_error(what, log_big, remedy=remedy)
    return out


# ============================================================ scale-safe core
# Every model of this module and of :mod:`attnsvm.peers._joint`, :mod:`attnsvm.peers._multitoken` and
# :mod:`attnsvm.peers._mirror` is the core model (logits ``x_itᵀ W z_i``, values ``a_it``) on some data.
# The helpers below evaluate it on *power-of-two rescaled* data: ``x = 2^ex·x'``, ``z = 2^ez·z'``,
# ``a = 2^ea·a'`` with the largest entry of each mantissa in ``[½, 1)``, ``W_eff = 2^(ex+ez)·W``
# (same logits, exactly), and the loss evaluated at ``2^ea·u'``. Power-of-two scaling is exact in
# the normal range, so nothing is lost, and the gradient is ``2^(ex+ez+ea)`` times the rescaled
# one: the answer is put back with one ``ldexp`` and refused (scaling.range_error) only when it is
# not a normal double.

_LN2 = math.log(2.0)


#: Alias of :func:`attnsvm.scaling.pow2_split` (``a = m·2^e``, ``max|m| ∈ [½, 1)``), kept
#: for the modules that still import it from here (:mod:`attnsvm.peers._joint`, :mod:`attnsvm.peers._multitoken`).
mantissa = pow2_split  # new code imports attnsvm.scaling.pow2_split


def put_back(m: FloatArray, e: int, what: str, *, remedy: str = "") -> FloatArray:
    """``m·2^e`` when its largest entry is a normal double (or it is all zero); else the range error.

    Smaller entries keep an absolute error ``≤ 2^−1075`` (gradual underflow), far below
    ``eps·max|m·2^e|``.
    """
    big = float(np.max(np.abs(m), initial=0.0))
    if big == 0.0:
        return np.zeros_like(m)
    log_big = math.log(big) + e * _LN2
    if not (LOG_FLOAT_TINY <= log_big <= LOG_FLOAT_MAX):
        raise range_error(what, log_big, remedy=remedy)
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(m, e)
    if not np.all(np.isfinite(out)) or float(np.max(np.abs(out))) < FLOAT_TINY:  # the interval's ends
        raise range_error(what, log_big, remedy=remedy)
    return out


def put_back_scalar(x: float, e: int, what: str, *, remedy: str = "") -> float:
    """A scalar version of :func:`put_back` (zero stays zero)."""
    return float(put_back(np.array([x]), e, what, remedy=remedy)[0])


def scaled_loss(loss: Any, e: int) -> Any:
    """The loss on rescaled outputs: ``u' ↦ ℓ(2^e u')`` (and its derivative, log-derivative)."""
    if e == 0:
        return loss

    def up(u: Any) -> Any:
        with np.errstate(over="ignore"):
            return np.ldexp(np.asarray(u, dtype=np.float64), e)

    if isinstance(loss, Loss):
        lg = loss.log_neg_derivative_fn
        return Loss(
            loss.name,
            lambda u: loss.value_fn(up(u)),
            lambda u: loss.derivative_fn(up(u)),
            loss.assumptions,
            None if lg is None else (lambda u: lg(up(u))),
        )
    return _ScaledLossLike(loss, up)


class _ScaledLossLike:
    """A user loss object evaluated at rescaled margins (see :func:`scaled_loss`)."""

    def __init__(self, loss: Any, up: Any) -> None:
        self._loss, self._up, self.assumptions = loss, up, loss.assumptions

    def value(self, u: Any) -> Any:
        return self._loss.value(self._up(u))

    def derivative(self, u: Any) -> Any:
        return self._loss.derivative(self._up(u))


class ScaledCore(NamedTuple):
    """The core model on rescaled data (see the section comment): augmented arrays for the core
    gradient (``x'' = (x', a')``, ``z'' = (z', 0)``, ``v'' = e_d``), the rescaled loss, exponents."""

    Xs: FloatArray
    zs: FloatArray
    As: FloatArray
    Y: FloatArray
    loss: Any
    scaled_loss: Any
    ex: int
    ez: int
    ea: int

    @property
    def d(self) -> int:
        return int(self.Xs.shape[2])


def scaled_core(
    Xs: FloatArray, ex: int, zs: FloatArray, ez: int, a: FloatArray, ea: int, Y: FloatArray, loss: Any
) -> ScaledCore:
    """Build :class:`ScaledCore` from mantissas ``Xs, zs`` (exponents ``ex, ez``) and values ``a·2^ea``."""
    As, e2 = pow2_split(a)
    return ScaledCore(Xs, zs, As, Y, loss, scaled_loss(loss, ea + e2), ex, ez, ea + e2)


def _augmented(sc: ScaledCore) -> tuple[FloatArray, FloatArray, FloatArray]:
    n, T, d = sc.Xs.shape
    Xa = np.concatenate([sc.Xs, sc.As[:, :, None]], axis=2)
    za = np.concatenate([sc.zs, np.zeros((n, 1))], axis=1)
    va = np.zeros(d + 1)
    va[d] = 1.0
    return Xa, za, va


def effective_weights(
    sc: ScaledCore, W: FloatArray, what: str, *, scale: str = "max|x|·max|z|", data: str = "the data"
) -> FloatArray:
    """``W_eff = 2^(ex+ez)·W`` (``x'ᵀ W_eff z' = xᵀ W z`` exactly); refused when it overflows.

    Scaling ``W`` up is exact; scaling it down may round entries below the normal range, which
    changes the logits by at most ``d²·2^−1074``. The refusal names the logit scale
    ``max|what|·scale`` (``scale``: the data factors of the logits in this model; the core's
    ``max|x|·max|z|`` by default) and suggests scaling ``what`` or ``data`` down.
    """
    e = sc.ex + sc.ez
    with np.errstate(over="ignore", under="ignore"):
        We = np.ldexp(W, e)
    if not np.all(np.isfinite(We)):
        big = float(np.max(np.abs(W)))
        raise range_error(
            f"the logit scale max|{what}|·{scale}",
            math.log(big) + e * _LN2,  # max|W|·2^(ex+ez), 2^(ex+ez) within a factor 4 of max|x|·max|z|
            remedy=f"Scale {what} or {data} down; the attention logits would overflow",
        )
    return We


#: The prompt model's logits are ``k_itᵀp`` with keys ``k_it = Wᵀx_it`` (no query ``z``): its logit
#: scale is ``max|p|·max|k|`` (the core's ``x`` are the keys, its query the constant ``e_0``).
_PROMPT_LOGIT_SCALE = {"scale": "max|k| (keys k_it = Wᵀx_it)", "data": "the keys (W or X)"}


def core_log_attention(sc: ScaledCore, W: FloatArray) -> FloatArray:
    """``log s`` (shape ``(n, T)``) at ``W`` (original units), from the mantissas: never overflows."""
    Ws, ew = pow2_split(W)
    L, el = pow2_split(logits_of(sc.Xs, sc.zs, Ws))  # |x'ᵀW'z'| ≤ d²: no overflow
    return scaled_log_softmax(L, sc.ex + sc.ez + ew + el)


def core_risk(sc: ScaledCore, W: FloatArray, what: str) -> float:
    """The risk at ``W`` (original units); refused as :func:`risk_value`, or when ``f`` overflows."""
    fs = np.sum(np.exp(core_log_attention(sc, W)) * sc.As, axis=1)
    with np.errstate(over="ignore"):
        u = np.ldexp(sc.Y * fs, sc.ea)
    if not np.all(np.isfinite(u)):
        raise range_error(
            f"the outputs f_i of {what}",
            math.log(float(np.max(np.abs(fs)))) + sc.ea * _LN2,
            remedy="Scale v down",
        )
    return risk_value(sc.loss, u, what)


def risk_value(loss: Any, u: FloatArray, what: str) -> float:
    """``(1/n) Σ ℓ(u_i)``, refused when it overflows or when a positive loss underflows.

    Logistic and exponential losses are positive: a risk below 2.2e-308 is not a normal double
    (its log is ``≈ log Σ e^{−u_i} − log n``, the tail of both losses).
    """
    r = float(np.mean(loss.value(u)))
    if not math.isfinite(r):
        raise range_error(what, math.inf, remedy="Scale the data down or use the logistic loss")
    if isinstance(loss, Loss) and loss.name in ("logistic", "exponential") and r < FLOAT_TINY:
        t = -np.asarray(u, dtype=np.float64)
        top = float(np.max(t))
        raise range_error(what, top + math.log(float(np.sum(np.exp(t - top)))) - math.log(len(t)))
    return r


def core_direction(sc: ScaledCore, We: FloatArray) -> GradDirection:
    """Unit ``∇_W L/||∇_W L||`` (shape ``(d, d)``) and ``log||∇_W L||`` for the original data."""
    Xa, za, va = _augmented(sc)
    Wa = np.zeros((sc.d + 1, sc.d + 1))
    Wa[: sc.d, : sc.d] = We
    G = normalized_risk_grad_of(Xa, sc.Y, za, va, Wa, sc.scaled_loss)
    B = G.direction[: sc.d, : sc.d]
    # The core direction is exact entrywise (log-magnitudes factored out); dropping the value
    # row/column and renormalising loses nothing unless the W-block is exactly 0.
    m = float(np.max(np.abs(B)))
    if not m > 0:
        raise NumericalError(
            "the gradient is exactly zero at this point; the normalized direction is undefined"
        )
    Bs = B / m  # scaled before the norm: no overflow/underflow in Σ b²
    nrm = float(np.sqrt(np.sum(Bs * Bs)))
    shift = (sc.ex + sc.ez + sc.ea) * _LN2
    return GradDirection(Bs / nrm, G.log_norm + math.log(m) + math.log(nrm) + shift)


#: A rescaled core gradient whose largest entry is below ``2^GRAD_LOW_BITS`` may have lost digits
#: to gradual underflow inside the core (its weights ``ℓ'·s`` are ≥ 2^−1074); below it the
#: gradient is rebuilt from the log-domain direction, exact at any size.
GRAD_LOW_BITS = -960


def core_grad(sc: ScaledCore, We: FloatArray, what: str) -> FloatArray:
    """``∇_W L`` (shape ``(d, d)``) for the original data: the core's cancellation-free gradient on
    the rescaled data times ``2^(ex+ez+ea)``; from the log-domain direction when it underflows."""
    Xa, za, va = _augmented(sc)
    Wa = np.zeros((sc.d + 1, sc.d + 1))
    Wa[: sc.d, : sc.d] = We
    shift = sc.ex + sc.ez + sc.ea
    try:
        G = np.array(risk_grad_of(Xa, sc.Y, za, va, Wa, sc.scaled_loss)[: sc.d, : sc.d])
        big = float(np.max(np.abs(G)))
        if big == 0.0 or big >= 2.0**GRAD_LOW_BITS:
            return put_back(G, shift, what, remedy=_GRAD_REMEDY)
    except NumericalError:
        G = None
    try:
        D = core_direction(sc, We)
    except NumericalError:
        if G is None:
            raise
        return put_back(G, shift, what, remedy=_GRAD_REMEDY)  # exact zero or rounding level
    k = math.floor(D.log_norm / _LN2)
    return put_back(D.direction * math.exp(D.log_norm - k * _LN2), k, what, remedy=_GRAD_REMEDY)


def is_stationary_error(exc: NumericalError) -> bool:
    """The core's refusal of a zero or rounding-level gradient (the point is stationary, so a record's
    ``log10||∇L||`` is ``−inf``), as opposed to a range error or an undetermined ``ℓ'``, which must
    propagate. The same test as :func:`attnsvm.gd._single._is_stationary_error` (one home for both: grad)."""
    msg = str(exc)
    return CANCELLED_MESSAGE in msg or "exactly zero" in msg


_GRAD_REMEDY = "Use the normalized gradient (direction and log-norm), which stays exact at any size"


def scaled_log_softmax(L: FloatArray, e: int) -> FloatArray:
    """``log softmax(2^e·L)`` along the last axis, for logits given as a mantissa ``L`` and exponent ``e``.

    ``2^e(L − max L)`` is formed after the subtraction, so logits beyond 1.8e308 are fine: a
    log weight below −1.8e308 is ``−inf`` (its weight is 0 to absolute accuracy 2^−1074).
    """
    m = np.max(L, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        D = np.ldexp(L - m, e)  # stable: shift before scaling; −inf only beyond any double
    return np.asarray(D - np.log(np.sum(np.exp(D), axis=-1, keepdims=True)), dtype=np.float64)


def norm2(x: FloatArray, what: str) -> float:
    """``||x||₂`` from the mantissa (no overflow or underflow in ``Σ x²``); refused only when it overflows."""
    m, e = pow2_split(x)
    return put_back_scalar(float(np.sqrt(np.sum(m * m))), e, what)


# ================================================================= array forms
class PromptData(NamedTuple):
    """Keys ``k = 2^K·ks`` and values ``a = 2^A·As`` of a prompt problem (mantissas in ``[½, 1)``)."""

    ks: FloatArray
    K: int
    As: FloatArray
    A: int


def product_mantissa(X: FloatArray, V: FloatArray) -> tuple[FloatArray, int]:
    """``(M, E)`` with ``X @ V = 2^E·M``, ``max|M| ∈ [½, 1)`` (all zero: ``E = 0``); ``V`` of shape ``(d,)`` or ``(d, m)``.

    ``M`` from ``X'V'`` with ``X = 2^ex·X'`` and ``V = 2^ev·V'`` (one power of two each) while every product of
    the rescaled data is a normal double (:func:`attnsvm.model._instance._products_exact`: ordinary data, bit
    for bit as before). Otherwise ``X`` or ``V`` spans beyond the range and ``X'`` or ``V'`` rounded its small
    entries to a few-bit subnormal (``v = (2^1000, 2^−60)``: values ``2^−60`` and ``2^−60·(1 + 2^−20)`` came out
    equal, and so did keys through ``W = diag(2^1000, 2^−60)``): each entry is formed from per-entry exponents
    (:func:`attnsvm.model._instance.token_values`, one column of ``V`` at a time) and aligned on the largest, so
    an entry loses at most ``2^−1075·2^E`` absolute beyond its own ``d·eps`` (one exponent for the whole array:
    an entry more than 2^1074 below the largest still rounds on its subnormal grid).
    """
    Xs, ex = pow2_split(X)
    Vs, ev = pow2_split(V)
    if _products_exact(X, np.ravel(V), np.full(np.shape(X)[:1], ex, dtype=np.int64), ev):
        M, em = pow2_split(Xs @ Vs)  # |X'V'| ≤ d: no overflow
        return M, ex + ev + em
    if np.ndim(V) == 1:
        a, _, e = token_values(X, V)  # X@V = a·2^e per entry
    else:  # one column of V at a time, stacked on the last axis
        cols = [token_values(X, V[:, j]) for j in range(V.shape[1])]
        a, _, e = (np.stack(parts, axis=-1) for parts in zip(*cols, strict=True))
    live = a != 0  # (a term-free entry, or one whose terms cancel exactly, is 0)
    if not np.any(live):
        return np.zeros(np.shape(a)), 0
    # aligned on the largest entry itself (not on its largest term: an entry that cancels would round twice)
    top = int(np.max((e + np.frexp(a)[1])[live]))
    with np.errstate(under="ignore"):
        M = np.ldexp(a, np.where(live, e - top, 0))  # max|M| ∈ [½, 1); the others on its grid
    return M, top


def keys_mantissa(X: FloatArray, W: FloatArray) -> tuple[FloatArray, int]:
    """``(ks, K)`` with ``k_it = Wᵀx_it = 2^K·ks_it`` (no overflow; :func:`product_mantissa`, ``V = W``)."""
    return product_mantissa(X, W)


def values_mantissa(X: FloatArray, v: FloatArray) -> tuple[FloatArray, int]:
    """``(As, A)`` with ``vᵀx_it = 2^A·As_it`` (no overflow; :func:`product_mantissa`, ``V = v``)."""
    return product_mantissa(X, v)


def prompt_data(inst: Instance, W: FloatArray, v: FloatArray | None = None) -> PromptData:
    """Keys and values (of head ``v``, default ``inst.v``) as mantissas and exponents."""
    require_unmasked(inst, "attnsvm.peers.prompt_data")
    ks, K = keys_mantissa(inst.X, W)
    As, A = values_mantissa(inst.X, inst.v if v is None else v)
    return PromptData(ks, K, As, A)


def prompt_core(data: PromptData, Y: FloatArray, loss: Any) -> ScaledCore:
    """The prompt model as the rescaled core model: ``x' = ks``, ``z' = e_0``, values ``As``."""
    n, _, D = data.ks.shape
    z0 = np.zeros((n, D))
    z0[:, 0] = 1.0
    return scaled_core(data.ks, data.K, z0, 0, data.As, data.A, Y, loss)


def embed_prompt(p: FloatArray) -> FloatArray:
    """``P = p e_0ᵀ``, shape ``(D, D)``: the core logits ``k_itᵀ P e_0 = k_itᵀ p``."""
    P = np.zeros((p.shape[0], p.shape[0]))
    P[:, 0] = p
    return P


def prompt_log_attention(data: PromptData, p: FloatArray) -> FloatArray:
    """``log s_it`` of logits ``k_itᵀp = 2^(K+el)·L`` (:func:`product_mantissa` of ``ks`` and ``p``; never
    overflows)."""
    L, el = product_mantissa(data.ks, p)
    return scaled_log_softmax(L, data.K + el)


def prompt_risk_of(
    data: PromptData, Y: FloatArray, p: FloatArray, loss: Any, what: str = "the prompt risk L(p)"
) -> float:
    """Array form of :func:`prompt_risk` (refuses a risk that is not a normal double)."""
    fs = np.sum(np.exp(prompt_log_attention(data, p)) * data.As, axis=1)
    with np.errstate(over="ignore"):
        u = np.ldexp(Y * fs, data.A)
    if not np.all(np.isfinite(u)):
        raise range_error(
            "the prompt outputs f_i",
            math.log(float(np.max(np.abs(fs)))) + data.A * _LN2,
            remedy="Scale v down",
        )
    return risk_value(loss, u, what)


def _prompt_risk_unchecked(data: PromptData, Y: FloatArray, p: FloatArray, loss: Any) -> float:
    """The risk for the path engine's comparisons: its float value (0 once it underflows), no refusal."""
    try:
        return prompt_risk_of(data, Y, p, loss)
    except NumericalError:
        fs = np.sum(np.exp(prompt_log_attention(data, p)) * data.As, axis=1)
        with np.errstate(over="ignore", under="ignore"):
            return float(np.mean(loss.value(np.ldexp(Y * fs, data.A))))


def prompt_grad_of(data: PromptData, Y: FloatArray, p: FloatArray, loss: Any) -> FloatArray:
    """Array form of :func:`prompt_grad`: the core gradient on the rescaled augmented data, column 0."""
    sc = prompt_core(data, Y, loss)
    We = effective_weights(sc, embed_prompt(p), "p", **_PROMPT_LOGIT_SCALE)
    return np.array(core_grad(sc, We, "the prompt gradient ∇_p L")[:, 0])


def normalized_prompt_grad_of(data: PromptData, Y: FloatArray, p: FloatArray, loss: Any) -> GradDirection:
    """Array form of :func:`normalized_prompt_grad` (log-domain, via the rescaled core direction)."""
    sc = prompt_core(data, Y, loss)
    We = effective_weights(sc, embed_prompt(p), "p", **_PROMPT_LOGIT_SCALE)
    try:
        G = core_direction(sc, We)
    except NumericalError as exc:
        raise NumericalError(f"the prompt gradient: {exc}") from exc
    return GradDirection(np.array(G.direction[:, 0]), G.log_norm)


# =================================================================== public model
def prompt_keys(inst: Instance, W: ArrayLike) -> FloatArray:
    """Keys ``k_it = Wᵀ x_it``, shape ``(n, T, d)``.

    Scale: any finite ``X``, ``W`` (formed from power-of-two mantissas, from per-entry exponents where ``W`` or
    ``X`` spans beyond the range: :func:`product_mantissa`); each key to absolute error
    ``≲ d·eps·max|k|``; raises :class:`NumericalError` when ``max|k|`` is not a normal double.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    require_unmasked(inst, "attnsvm.peers.prompt_keys")
    ks, K = keys_mantissa(inst.X, inst.check_weights(W))
    return put_back(ks, K, "the keys k_it = Wᵀx_it")


def prompt_logits(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Logits ``l_it = x_itᵀ W p = k_itᵀ p``, shape ``(n, T)``.

    Scale: any finite data (``W`` or ``p`` spanning beyond the range included: keys and logits from per-entry
    exponents there); each logit to absolute error ``≲ 2d·eps·max|l|``; raises :class:`NumericalError` when
    ``max|l|`` is not a normal double.
    """
    require_unmasked(inst, "attnsvm.peers.prompt_logits")
    ks, K = keys_mantissa(inst.X, inst.check_weights(W))
    L, el = product_mantissa(ks, check_prompt(inst, p))
    return put_back(L, K + el, "the prompt logits k_itᵀp")


def prompt_attention(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Attention ``s_i = softmax(X_i W p)``, shape ``(n, T)`` (log-sum-exp form).

    Scale: any finite data, never raises (logits beyond 1.8e308 included); each weight to
    ``≲ T·eps·max|l_i|`` relative plus ``2^−1074`` absolute (weights below 2.2e-308 flush).
    """
    require_unmasked(inst, "attnsvm.peers.prompt_attention")
    ks, K = keys_mantissa(inst.X, inst.check_weights(W))
    return np.exp(prompt_log_attention(PromptData(ks, K, ks[:, :, 0], 0), check_prompt(inst, p)))


def prompt_output(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Outputs ``f_i = vᵀ X_iᵀ softmax(X_i W p)``, shape ``(n,)``.

    Scale: any finite data; ``f`` to absolute error ``≲ (d+T)·eps·max_t|vᵀx_it|``; raises
    :class:`NumericalError` when ``max|f|`` is not a normal double.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596, eq. (1).
    """
    require_unmasked(inst, "attnsvm.peers.prompt_output")
    data = prompt_data(inst, inst.check_weights(W))
    fs = np.sum(np.exp(prompt_log_attention(data, check_prompt(inst, p))) * data.As, axis=1)
    return put_back(fs, data.A, "the prompt outputs f_i")


def prompt_risk(inst: Instance, W: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic") -> float:
    """Risk ``L(p) = (1/n) Σ_i ℓ(Y_i f_i)`` of the prompt model.

    Scale: any finite data; to a few ulps relative (as the loss); raises :class:`NumericalError`
    when ``f`` or the risk overflows, or a logistic/exponential risk is below 2.2e-308.
    """
    require_unmasked(inst, "attnsvm.peers.prompt_risk")
    lo = get_loss(loss)
    data = prompt_data(inst, inst.check_weights(W))
    return prompt_risk_of(data, inst.Y, check_prompt(inst, p), lo)


def prompt_grad(
    inst: Instance, W: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> FloatArray:
    """Gradient ``∇_p L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) k_it``, shape ``(d,)``.

    Cancellation-free: computed as the core gradient on the augmented data (module docstring),
    i.e. with ``vᵀx_it − f_i = Σ_u s_iu (vᵀx_it − vᵀx_iu)``, on keys and values rescaled by
    powers of two (the gradient is ``2^(K+A)`` times the rescaled one).

    Scale: any finite data with ``max|p|·max|k|`` below 1.8e308 (a ``v`` spanning beyond the range included:
    values from per-entry exponents, as ``Instance.values``); as ``risk_grad``, normwise to
    ``≲ nT(d+T)·eps·Σ_it |w_it|·||k_it||`` plus the values' rounding, ``w_it = ℓ'(Y_i f_i)·s_it·(a_it − f_i)/n``:
    ``nT(d+T)·eps`` relative to ``||∇_p L||`` where the keys and values do not cancel (keys and values
    ``2^−20`` apart: 1.4e-10 measured); raises :class:`NumericalError` when ``max|∇_p L|`` is not a normal double
    (use :func:`normalized_prompt_grad` there).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

    Args:
      inst: the data (``inst.z`` is unused).
      W: key matrix, shape ``(d, d)``.
      p: prompt, shape ``(d,)``.
      loss: loss name or object.

    Returns:
      The gradient, shape ``(d,)``.
    """
    require_unmasked(inst, "attnsvm.peers.prompt_grad")
    lo = get_loss(loss)
    data = prompt_data(inst, inst.check_weights(W))
    return prompt_grad_of(data, inst.Y, check_prompt(inst, p), lo)


def normalized_prompt_grad(
    inst: Instance, W: ArrayLike, p: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> GradDirection:
    """Unit direction ``∇_p L/||∇_p L||`` and ``log||∇_p L||``, exact after ``∇_p L`` underflows.

    Scale: any finite data with ``max|p|·max|k|`` below 1.8e308 (values as :func:`prompt_grad`); as
    ``normalized_risk_grad``, the direction and ``log||∇_p L||`` to ``2·bound/||∇_p L||`` (``bound``:
    :func:`prompt_grad`'s), i.e. ``≲ (nT + T + d)·eps`` per entry and ``(nT + T + d)·eps·(1 + |log||∇_p L|||)``
    absolute where the keys and values do not cancel; never over/underflows.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (normalized GD on ``p``).

    Returns:
      :class:`attnsvm.model._grad.GradDirection` with ``direction`` of shape ``(d,)``.
    """
    require_unmasked(inst, "attnsvm.peers.normalized_prompt_grad")
    lo = get_loss(loss)
    data = prompt_data(inst, inst.check_weights(W))
    return normalized_prompt_grad_of(data, inst.Y, check_prompt(inst, p), lo)


# ========================================================================= p-SVM
@dataclass(frozen=True)
class PromptSVMSolution:
    """Solution of the p-SVM ``min ||p|| s.t. (k_iα_i − k_it)ᵀ p ≥ 1``.

    Attributes:
      p: the solution, shape ``(d,)``.
      alpha: the token choice, shape ``(n,)``.
      rows: constraint rows ``Δk_it = k_iα_i − k_it``, shape ``(m, d)``, ``m = n(T−1)``.
      pairs: ``(i, t)`` of each row, shape ``(m, 2)``.
      duals: multipliers of ``min ½||p||²`` aligned with ``rows`` (``p = rowsᵀ duals``).
      support: active constraints as ``(i, t)`` pairs (margin 1 to :data:`attnsvm.svm.SUPPORT_RTOL`).
      weakly_active: active constraints with zero multiplier (a subset of ``support``).
      margins: ``rows @ p``, shape ``(m,)``.
      kkt: relative KKT residuals (:class:`attnsvm.svm.KKTResiduals`), as for ``solve_svm``.
      error_bound: first-order bound on the relative error of ``p``: ``cond(K_S)·eps`` plus the rounding-level
        rows' terms of :func:`attnsvm.svm.min_norm_dual`'s bound.
      certified: ``error_bound`` and every KKT residual ``≤`` :data:`attnsvm.svm.CERTIFY_RTOL`, and no support
        row unresolved (a row so much larger than the binding ones that its margin ``≥ 1`` reads ``≥ 0`` at
        working precision, as in :func:`attnsvm.svm.solve_svm`).
    """

    p: FloatArray
    alpha: NDArray[np.intp]
    rows: FloatArray
    pairs: NDArray[np.intp]
    duals: FloatArray
    support: list[tuple[int, int]]
    weakly_active: list[tuple[int, int]]
    margins: FloatArray
    kkt: KKTResiduals
    error_bound: float
    certified: bool


def prompt_row_mantissas(
    inst: Instance, W: FloatArray, alpha: NDArray[np.intp]
) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.intp]]:
    """Rows ``Δk_it = Wᵀ(x_iα_i − x_it) = 2^{R_r}·rows_r`` (``t ≠ α_i``, by sequence then token), each row a
    mantissa (largest entry in ``[½, 1)``) with its own exponent ``R_r``.

    The two tokens of a row are scaled by one power of two (their difference cannot overflow), ``W`` by one
    power of two per column, so a row or a column of ``W`` of any size keeps its digits; entries below
    ``2^−1074`` of their row's largest flush (absolute error far below ``eps`` of the row).
    """
    require_unmasked(inst, "attnsvm.peers.prompt_row_mantissas")
    n, T, _ = inst.shape
    ii, tt = np.meshgrid(np.arange(n), np.arange(T), indexing="ij")
    keep = tt != alpha[:, None]
    pairs = np.stack([ii[keep], tt[keep]], axis=1).astype(np.intp)
    xa, xt = inst.X[pairs[:, 0], alpha[pairs[:, 0]]], inst.X[pairs[:, 0], pairs[:, 1]]
    e = np.frexp(np.maximum(np.max(np.abs(xa), axis=1), np.max(np.abs(xt), axis=1)))[1].astype(np.int64)
    with np.errstate(under="ignore"):
        D = np.ldexp(xa, -e[:, None]) - np.ldexp(xt, -e[:, None])  # entries in (−2, 2)
    ew = np.frexp(np.max(np.abs(W), axis=0))[1].astype(np.int64)  # per column of W
    with np.errstate(under="ignore"):
        S = D @ np.ldexp(W, -ew[None, :])  # Δk_rj = 2^{e_r + ew_j}·S_rj, |S_rj| ≤ 2d
    h = np.where(S != 0.0, np.frexp(S)[1] + ew[None, :], np.iinfo(np.int64).min // 4)
    H = np.where(np.any(S != 0.0, axis=1), np.max(h, axis=1), 0).astype(np.int64)
    with np.errstate(under="ignore"):
        rows = np.ldexp(S, ew[None, :] - H[:, None])
    return rows, H + e, pairs


def _explain_infeasible(rows: FloatArray, pairs: NDArray[np.intp], what: str) -> str:
    scale = max(1.0, float(np.max(np.abs(rows)))) if rows.size else 1.0
    zero = np.flatnonzero(np.max(np.abs(rows), axis=1) <= 1e-14 * scale)
    if zero.size:
        i, t = (int(x) for x in pairs[zero[0]])
        return (
            f"the {what} is infeasible: sequence {i}, token {t} has the same key as the selected token "
            f"(Wᵀ(x_iα − x_it) = 0), so no p can give it a positive margin. Choose another alpha, "
            "or a W that separates these tokens."
        )
    return (
        f"the {what} is infeasible: the key differences admit no p with all margins ≥ 1 (they are "
        "linearly dependent with incompatible signs). Choose another alpha or a different W."
    )


def scaled_alpha(inst: Instance, alpha: ArrayLike | None) -> NDArray[np.intp]:
    """``inst.check_alpha(alpha)``: ``None`` → ``opt_i = argmax_t Y_i vᵀx_it`` (:meth:`Instance.optimal_tokens`,
    any finite data: each sequence rescaled on its own, values from per-entry exponents where ``v`` spans the
    range)."""
    require_unmasked(inst, "attnsvm.peers.scaled_alpha")
    # Instance.optimal_tokens is scale-safe itself (per-sequence rescaling, per-entry exponents where v or a key
    # spans beyond the range). An instance of X·2^−ex and v·2^−ev (one power of two each) rounded small entries of
    # a v spanning more than 2^1022 to a few-bit subnormal: a false tie, or the order of two scores flipped.
    return inst.check_alpha(alpha)


def _solve_prompt_scaled(
    inst: Instance, Wa: FloatArray, a: NDArray[np.intp]
) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.intp], MinNormSolution, int]:
    """The p-SVM on per-row mantissas: ``(rows, R, pairs, sol, G)``; ``Δk_r = 2^{R_r}·rows_r``,
    ``p = 2^G·rowsᵀλ'``, ``λ_r = 2^{G−R_r}·λ'_r`` (``λ' = sol.multipliers``)."""
    rows, R, pairs = prompt_row_mantissas(inst, Wa, a)
    sol, G = solve_min_norm_rows_or_raise(rows, R, np.ones(len(rows)), pairs, "prompt SVM (p-SVM)")
    return rows, R, pairs, sol, G


def unresolved_support(
    rows: FloatArray, R: NDArray[np.int64], b: FloatArray, sol: MinNormSolution, G: int
) -> NDArray[np.intp]:
    """Support rows of :func:`solve_min_norm_rows_or_raise`'s problem whose right-hand side is below its own
    resolution: ``b'_r ≤ SUPPORT_RTOL·(b'_r + ||rows_r||·||x'||)`` with ``b'_r = 2^{−R_r−G}·b_r`` the posed one.

    ``solve_svm``'s unit-row rule: a row so much larger than the binding ones (``b'_r`` tiny) that
    ``margin ≥ b_r`` reads ``≥ 0`` at working precision; whether it binds, and its margin, are unresolved.
    Rows with ``b_r = 0`` ask exactly ``≥ 0`` and are never unresolved.
    """
    sup = np.asarray(sol.support, dtype=np.intp)
    sup = sup[b[sup] > 0]
    with np.errstate(under="ignore"):
        bp = np.ldexp(b[sup], -R[sup] - G)
    rn = np.linalg.norm(rows[sup], axis=1)
    return sup[bp <= SUPPORT_RTOL * (bp + rn * sol.norm)]


def row_margins(rows: FloatArray, R: NDArray[np.int64], xs: FloatArray, G: int, what: str) -> FloatArray:
    """``(2^{R_r}·rows_r)ᵀ(2^G·xs) = 2^{R_r+G}·rows_rᵀxs``; refused by name when the largest is not a double."""
    return put_back_rows(rows @ xs, R + G, what)


def solve_prompt_svm(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> PromptSVMSolution:
    """Solve the p-SVM ``p_mm = argmin ||p||₂ s.t. (k_iα_i − k_it)ᵀ p ≥ 1`` exactly, with a certificate.

    Keys ``k_it = Wᵀ x_it``. Solved through the certified min-norm solver of :mod:`attnsvm.svm` on
    the Gram matrix ``(Δk_r · Δk_s)`` (an exact active-set finish), so ``p`` is accurate to about
    1e-9 relative. Each row ``Δk_r = 2^{R_r}·Δk'_r`` is a power-of-two mantissa with its own exponent, so
    rows any number of binades apart are solved (one shared exponent squared the small ones below the range
    and read them as zero): ``p_mm = 2^G·p'``, multipliers ``λ_r = 2^{G−R_r}·λ'_r``, exactly.

    Scale: any finite data; ``p_mm(cX) = p_mm(X)/c``, multipliers ``/c²``, exactly; raises
    :class:`NumericalError` when ``max|p_mm|``, ``max|Δk|``, the largest multiplier or the largest margin is
    not a normal double. Rows far apart in size solve to working precision relative to ``||p_mm||``;
    ``certified`` is False when a support row is unresolved at their spread.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (p-SVM, eq. ATT-SVM for ``p``).

    Args:
      inst: the data (``inst.z`` unused; ``inst.v`` defines the default ``alpha``).
      W: key matrix, shape ``(d, d)``.
      alpha: selected token per sequence, shape ``(n,)``; ``None`` → the optimal tokens.

    Returns:
      :class:`PromptSVMSolution`.

    Raises:
      InfeasibleSVMError: when no ``p`` meets the constraints (e.g. a key equal to the selected one).
    """
    require_unmasked(inst, "attnsvm.peers.solve_prompt_svm")
    Wa = inst.check_weights(W)
    a = scaled_alpha(inst, alpha)
    # per-row exponents (rows any number of binades apart; one shared exponent read the small ones as 0)
    rows, R, pairs, sol, G = _solve_prompt_scaled(inst, Wa, a)
    ps = rows.T @ sol.multipliers
    return PromptSVMSolution(
        p=put_back(ps, G, "the p-SVM solution p_mm"),
        alpha=a,
        rows=put_back_rows(rows, R, "the p-SVM constraint rows Δk_it"),
        pairs=pairs,
        duals=put_back_rows(np.asarray(sol.multipliers), G - R, "the p-SVM multipliers"),
        support=[(int(i), int(t)) for i, t in pairs[sol.support]],
        weakly_active=[(int(i), int(t)) for i, t in pairs[sol.weakly_active]],
        margins=row_margins(rows, R, ps, G, "the p-SVM margins Δk_itᵀp_mm"),
        kkt=sol.kkt,
        error_bound=sol.error_bound,
        certified=sol.certified and unresolved_support(rows, R, np.ones(len(rows)), sol, G).size == 0,
    )


def prompt_local_optimality(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> bool:
    """``True`` exactly when the p-SVM(α) is feasible and ``γ_iα_i > γ_it`` for every support token ``t``.

    The prompt analogue of :func:`attnsvm.svm.is_locally_optimal` (support tokens of the p-SVM,
    token scores ``γ_it = Y_i vᵀx_it``; weakly active constraints count as support).

    Scale: any finite data (invariant under ``X → cX``, ``W → cW``, ``v → cv``, ``c > 0``: the
    support and the score order are computed from power-of-two mantissas).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (locally optimal tokens).
    """
    require_unmasked(inst, "attnsvm.peers.prompt_local_optimality")
    Wa = inst.check_weights(W)
    a = scaled_alpha(inst, alpha)
    try:
        _, _, pairs, sol, _ = _solve_prompt_scaled(inst, Wa, a)
    except InfeasibleSVMError:
        return False
    # per sequence, from per-entry exponents where v spans the range (one scale for X and v flushed v's small entries)
    As, _, _ = values_split_mag(inst.X, inst.v)
    g = inst.Y[:, None] * As  # scores / 2^e_i: the same order within each sequence
    return all(g[i, a[i]] > g[i, t] for i, t in pairs[sol.support])


# ============================================================================ GD
class PromptRecord(NamedTuple):
    """State of a prompt-GD run at one recorded step: ``step``, ``||p||``, risk, selected tokens,
    ``corr(p, reference)`` (NaN without one), ``log10||∇_p L||`` and a copy of ``p_t`` when the
    run keeps iterates."""

    step: int
    norm: float
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    log10_grad_norm: float
    p: FloatArray | None = None


@dataclass
class PromptTrajectory:
    """Result of :func:`run_prompt_gd`: final ``p`` (shape ``(d,)``) and the records."""

    p: FloatArray
    record: list[PromptRecord] = field(default_factory=list)
    normalized: bool = True
    lr: float = 0.0

    @property
    def corrs(self) -> FloatArray:
        """``corr(p_t, reference)`` at the recorded steps."""
        return np.array([r.corr for r in self.record])

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """Selected tokens ``argmax_t s_it`` at the final step."""
        return self.record[-1].tokens


def _cos(a: FloatArray, b: FloatArray) -> float:
    """``cos(a, b)`` from the mantissas (``||a||`` never squared at full scale); NaN for a zero vector."""
    am, _ = pow2_split(a)
    bm, _ = pow2_split(b)
    na, nb = float(np.linalg.norm(am)), float(np.linalg.norm(bm))
    if na == 0 or nb == 0:
        return math.nan
    return float(np.clip(np.dot(am / na, bm / nb), -1.0, 1.0))


def _tokens(data: PromptData, p: FloatArray) -> NDArray[np.intp]:
    """``argmax_t k_itᵀp`` from the mantissas (the order of the logits is scale-invariant)."""
    return np.argmax(product_mantissa(data.ks, p)[0], axis=1).astype(np.intp)


def run_prompt_gd(
    inst: Instance,
    W: ArrayLike,
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    p0: ArrayLike | None = None,
    loss: "str | LossLike" = "logistic",
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    keep_iterates: bool = False,
) -> PromptTrajectory:
    """GD on the prompt: ``p ← p − η ∇_p L/||∇_p L||`` (normalized) or ``p ← p − η ∇_p L``.

    The normalized direction is log-domain (:func:`normalized_prompt_grad`), so it stays exact
    after the gradient underflows; plain GD uses the cancellation-free gradient and raises
    :class:`NumericalError` if ``p`` becomes non-finite.

    Scale: any finite data; equivariant (``X → cX``, ``lr → lr/c``, ``p0 → p0/c`` gives ``p_t/c``
    exactly for powers of two ``c``); raises :class:`NumericalError` naming the step when a
    gradient (plain GD), ``p`` or a recorded risk is not a normal double, or the recorded gradient is
    refused (a record's ``log10||∇_p L||`` is ``−inf`` only at a stationary ``p``).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (Thm. on GD convergence to p-SVM).

    Args:
      inst: the data.
      W: key matrix, shape ``(d, d)``.
      steps: updates, integer ≥ 1.
      lr: step size ``η > 0``.
      normalized: normalized (default) or plain GD.
      p0: initial prompt, shape ``(d,)``; default zeros.
      loss: loss name or object.
      record_at: ``None`` (about 25 log-spaced steps), an interval, or a list of steps.
      reference: a ``(d,)`` direction (e.g. ``solve_prompt_svm(...).p``) for ``corr``.
      keep_iterates: store a copy of ``p_t`` in each record.

    Returns:
      :class:`PromptTrajectory` with ``.p`` and ``.record``.
    """
    require_unmasked(inst, "attnsvm.peers.run_prompt_gd")
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    p = np.zeros(inst.d) if p0 is None else np.array(check_prompt(inst, p0, "p0"))
    ref = None if reference is None else check_prompt(inst, reference, "reference")
    if ref is not None and not np.any(ref != 0):
        raise InvalidInstanceError("reference is the zero vector; it has no direction")
    at = set(int(s) for s in record_steps(record_at, steps))
    data, Y = prompt_data(inst, Wa), inst.Y
    rec: list[PromptRecord] = []

    def record(t: int) -> None:
        try:
            try:
                lg = normalized_prompt_grad_of(data, Y, p, lo).log_norm / math.log(10.0)
            except NumericalError as exc:
                if not is_stationary_error(exc):
                    raise  # a range error or an undetermined ℓ': not a zero gradient
                lg = -math.inf
            rec.append(
                PromptRecord(
                    t,
                    norm2(p, "||p||"),
                    prompt_risk_of(data, Y, p, lo),
                    _tokens(data, p),
                    _cos(p, ref) if ref is not None else math.nan,
                    lg,
                    np.array(p) if keep_iterates else None,
                )
            )
        except NumericalError as exc:
            raise NumericalError(f"prompt GD, record at step {t}: {exc}") from exc

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        if normalized:
            try:
                g = normalized_prompt_grad_of(data, Y, p, lo).direction
            except NumericalError as exc:
                raise NumericalError(f"normalized prompt GD at step {t}: {exc}") from exc
        else:
            try:
                g = prompt_grad_of(data, Y, p, lo)
            except NumericalError as exc:
                raise NumericalError(f"prompt GD at step {t}: {exc}") from exc
        with np.errstate(over="ignore"):
            p = p - lr * g
        if not np.all(np.isfinite(p)):
            raise NumericalError(f"prompt GD diverged at step {t}: p became non-finite; lower lr")
        if t in at:
            record(t)
    return PromptTrajectory(p=p, record=rec, normalized=bool(normalized), lr=lr)


# ========================================================= regularization path
class PromptPathPoint(NamedTuple):
    """One point ``p_R ≈ argmin_{||p|| ≤ R} L(p)``: radius, ``p_R``, risk, tokens,
    ``corr(p_R, reference)`` and the KKT residual ``||ĝ + p/||p|| ||`` on the sphere."""

    radius: float
    p: FloatArray
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    kkt_residual: float


def prompt_regularization_path(
    inst: Instance,
    W: ArrayLike,
    radii: ArrayLike,
    *,
    loss: "str | LossLike" = "logistic",
    reference: ArrayLike | None = None,
    max_steps: int = 2000,
    lr: float = 0.1,
    tol: float = 1e-10,
) -> list[PromptPathPoint]:
    """Regularization path ``p_R = argmin_{||p||₂ ≤ R} L(p)`` for increasing ``R`` (warm-started).

    Projected normalized GD with the same warm start and acceptance rule as the ``W`` path
    (:func:`attnsvm.gd.projected_path`), until the KKT residual ``||∇L/||∇L|| + p/R||`` is below
    ``tol``. The risk is not convex in ``p``, so the
    points are stationary points of the constrained problems (residual reported), not certified
    minimisers. Tarzanagh et al. show ``p_R/R → p_mm/||p_mm||`` for the optimal tokens.
    The engine runs in logit units ``q = 2^K·p`` on radii ``2^K·R`` (``2^K`` the keys' scale).

    Scale: any finite data; equivariant (``X → cX``, ``radii → radii/c`` gives ``p_R/c``);
    raises :class:`NumericalError` when ``R·max|k|``, a point ``p_R`` or its risk is not a
    normal double.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (regularization path of ``p``).

    Args:
      inst, W: data and key matrix ``(d, d)``.
      radii: increasing positive radii, shape ``(k,)``.
      loss: loss name or object.
      reference: ``(d,)`` direction for ``corr``.
      max_steps: projected steps per radius.
      lr: initial step as a fraction of ``R``.
      tol: KKT residual at which a radius is done.

    Returns:
      One :class:`PromptPathPoint` per radius.
    """
    require_unmasked(inst, "attnsvm.peers.prompt_regularization_path")
    R_all = as_real_array(radii, "radii", ndim=1)
    if R_all.size == 0 or np.any(R_all <= 0) or np.any(np.diff(R_all) <= 0):
        raise AttnSVMError("radii must be a non-empty, strictly increasing list of positive radii")
    max_steps = check_int(max_steps, "max_steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    tol = float(tol)
    if not (math.isfinite(tol) and tol >= 0):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}")
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    ref = None if reference is None else check_prompt(inst, reference, "reference")
    data, Y = prompt_data(inst, Wa), inst.Y
    # Run in logit units q = 2^K·p against the key mantissa (exactly the same logits), on radii
    # 2^K·R: the engine's norms and steps then stay O(R_eff) whatever the size of the keys.
    unit = PromptData(data.ks, 0, data.As, data.A)
    R_eff = put_back(R_all, data.K, "the radii in logit units R·max|k|")
    if float(np.min(R_eff)) < FLOAT_TINY:
        raise range_error(
            "the smallest radius in logit units R·max|k|", math.log(float(R_all[0])) + data.K * _LN2
        )
    steps = projected_path(
        np.zeros(inst.d),
        R_eff,
        lambda qc: _prompt_risk_unchecked(unit, Y, qc, lo),
        lambda qc: normalized_prompt_grad_of(unit, Y, qc, lo),
        max_steps,
        lr,
        tol,
    )
    out: list[PromptPathPoint] = []
    for R, st in zip(R_all, steps, strict=True):
        on_sphere = float(np.linalg.norm(st.x)) >= st.radius * (1 - 1e-12)
        p = put_back(st.x, -data.K, f"the path point p_R at R = {R:.3g}")
        out.append(
            PromptPathPoint(
                float(R),
                p,
                prompt_risk_of(unit, Y, st.x, lo),
                _tokens(unit, st.x),
                _cos(p, ref) if ref is not None else math.nan,
                st.residual if on_sphere else math.nan,
            )
        )
    return out
