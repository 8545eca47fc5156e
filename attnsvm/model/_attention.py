"""Attention weights and outputs over the logits ``l_it = x_itᵀ W z_i``.

Kinds (all act on the same logits ``l_i ∈ R^T`` of sequence ``i``):

* ``softmax``            ``s_i = softmax(l_i)``, computed as ``exp(l_i − logsumexp(l_i))``;
* ``linear``             ``s_i = l_i`` (no normalisation);
* ``normalized_linear``  ``s_i = φ(l_i) / 1ᵀφ(l_i)``, ``φ = elu + 1`` (the positive feature
  map of Katharopoulos et al. 2020, applied to the logits).

The output of sequence ``i`` is ``f_i = Σ_t s_it vᵀx_it``.

Masks (:attr:`Instance.mask`): a masked token's logit is ``−inf`` (the additive-mask convention),
so its weight is exactly 0 and its log weight ``−inf`` for every kind (``linear`` included: a ``−inf``
logit is read as weight 0); the sums run over the allowed tokens only. Logits are computed from
:attr:`Instance.keys` (masked tokens zeroed), so a masked token never causes an overflow.

Scale (the contract of :mod:`attnsvm.scaling`). Logits and values are formed from data
rescaled by exact powers of two (``X·2^−ex``, ``z·2^−ez``, ``W·2^−ew``, ``v·2^−ev``), so no
intermediate product overflows or underflows; the scale is put back at the end, and a
quantity that is itself outside float64's range raises :class:`~attnsvm.NumericalError`
naming it (``logits``, ``outputs``, a log weight below ``−1.8e308``).

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (the model);
Katharopoulos, Vyas, Pappas, Fleuret, ICML 2020 (``φ = elu + 1``);
Kim, Papamakarios, Mnih, ICML 2021 (softmax vs. linear sensitivity).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from ..errors import unknown_name
from ..scaling import FLOAT_TINY, range_error
from ._instance import Instance, mask_kw, pow2_split, split_rows, values_split

__all__ = [
    "KINDS",
    "logits",
    "logits_of",
    "log_softmax",
    "log_phi",
    "log_attention",
    "attention",
    "attention_of",
    "output",
]


_LN2 = math.log(2.0)
#: ``2^−969 = FLOAT_TINY/eps``: an intermediate at least this large rounds to full relative
#: precision even after its products underflow (each loses ≤ 2^−1074 ≤ eps·2^−969·2^−52).
_SAFE_INTERMEDIATE = 2.0**-969

KINDS = ("softmax", "linear", "normalized_linear")


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    return kind


def logits(inst: Instance, W: ArrayLike) -> FloatArray:
    """Logits ``l_it = x_itᵀ W z_i``, shape ``(n, T)``; ``−inf`` at masked tokens (:attr:`Instance.mask`).

    Scale: any finite data; each logit to absolute error ``≲ d²·eps·Σ|x_k W_kj z_j|`` plus
    ``d²·2^−1074·(1 + max|x_i··|·max|W|·max|z_i|)`` (products lost below the range, relative
    2^−1074 of the data's size); raises :class:`~attnsvm.NumericalError` when a logit exceeds 1.8e308.
    """
    Wa = inst.check_weights(W)
    return logits_of(inst.keys, inst.z, Wa, **mask_kw(inst))


def logits_of(
    X: FloatArray, z: FloatArray, W: FloatArray, *, mask: NDArray[np.bool_] | None = None
) -> FloatArray:
    """Array form of :func:`logits` (no validation): ``einsum('ntd,de,ne->nt')``.

    The plain product is used when it is finite; otherwise (an intermediate ``W z`` or a logit
    overflowed) the logits are recomputed from power-of-two rescaled ``X``, ``z``, ``W``.
    With ``mask`` (boolean ``(n, T)``, ``True`` = allowed) the masked tokens of ``X`` are read as 0
    and their logits are ``−inf``.
    """
    if mask is None:
        return _logits_unmasked(X, z, W)
    out = _logits_unmasked(np.where(mask[:, :, None], X, 0.0), z, W)
    return np.where(mask, out, -np.inf)


def _logits_unmasked(X: FloatArray, z: FloatArray, W: FloatArray) -> FloatArray:
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        out = np.einsum("ntd,nd->nt", X, z @ W.T)
        # The plain path is exact to d²·eps·Σ|xWz| unless an intermediate (W z_i)_k whose magnitude
        # Σ_j|W_kj z_ij| is below the normal range (by eps) is multiplied by a large x: then its
        # 2^−1074 rounding is amplified by |x|, so those cases take the rescaled path.
        mag = np.abs(z) @ np.abs(W).T
        finite = math.isfinite(float(out.sum()))  # NaN/Inf propagate (a sum overflow only costs time)
    low = mag < _SAFE_INTERMEDIATE
    # A magnitude that is 0 only because its products underflowed is not an exact 0.
    if finite and not (low.any() and (low & ((z != 0) @ (W != 0).T.astype(np.float64) > 0)).any()):
        return out
    return _logits_rescaled(X, z, W)


def _logits_rescaled(X: FloatArray, z: FloatArray, W: FloatArray) -> FloatArray:
    """``l_i = 2^(ex_i+ez_i+ew) · (X'_i W' z'_i)``, every sequence, query and ``W`` rescaled on its own."""
    Xs, ex = split_rows(X, 1)
    zs, ez = split_rows(z, 1)
    Ws, ew = pow2_split(W)
    core = np.einsum("ntd,nd->nt", Xs, zs @ Ws.T)  # |core| ≤ d²: no overflow
    e = (ex + ez + ew)[:, None]
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(core, e)
    if not np.all(np.isfinite(out)):
        i, t = np.argwhere(~np.isfinite(out))[0]
        raise range_error(
            "the logits x_itᵀ W z_i",
            math.log(abs(float(core[i, t]))) + float(e[i, 0]) * _LN2,
            remedy="Scale W (or the data) down; softmax attention of logits beyond 1.8e308 is not computable",
        )
    return out


def log_softmax(l: FloatArray) -> FloatArray:
    """``log softmax`` along the last axis.

    Numerically stable form: ``l − max(l) − log Σ exp(l − max(l))``. The naive
    ``log(exp(l)/Σexp(l))`` overflows for ``l > 709`` and gives ``log 0 = −inf`` for
    weights below 1e-308; this form is exact to a few ulps for any finite ``l``
    (log weights of ``−10⁶`` are returned as such, not as ``−inf``).

    Scale: finite ``l`` of any size; raises :class:`~attnsvm.NumericalError` when a log weight
    is below ``−1.8e308`` (the logits of one row span more than float64's range). A ``−inf`` logit
    (a masked token) gets log weight ``−inf``; each row needs a finite logit.
    """
    out = _log_softmax_raw(l)
    if np.all(np.isfinite(l) | np.isneginf(l)) and np.any(~np.isfinite(out) & np.isfinite(l)):
        raise range_error(
            "an attention weight s_it (its logit is more than 1.8e308 below the row's largest)",
            -math.inf,
            remedy="Its logarithm is below −1.8e308; scale W down",
        )
    return out


def _log_softmax_raw(l: FloatArray) -> FloatArray:
    """:func:`log_softmax` returning ``−inf`` for log weights below ``−1.8e308`` (internal use:
    such a weight is 0 to every precision a double has)."""
    m = np.max(l, axis=-1, keepdims=True)
    with np.errstate(over="ignore", under="ignore"):
        shifted = l - m  # −inf only when the row spans more than 1.8e308
        # exp of a shifted logit below −745 underflows to 0, which is its weight to every precision
        # the sum (≥ 1, the largest term is e^0) can hold: never an error, whatever the caller's errstate
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def log_phi(l: FloatArray) -> FloatArray:
    """``log φ(l)`` for ``φ = elu + 1``: ``log1p(l)`` for ``l > 0`` and ``l`` for ``l ≤ 0``.

    Working in logs keeps ``normalized_linear`` exact when every logit of a sequence is very
    negative (``φ = eˡ`` then underflows to 0 and ``φ / 1ᵀφ`` would be ``0/0``).
    """
    return np.where(l > 0, np.log1p(np.maximum(l, 0.0)), np.minimum(l, 0.0))


def log_attention(inst: Instance, W: ArrayLike, *, kind: str = "softmax") -> FloatArray:
    """``log s_it`` for the normalised kinds ``softmax`` and ``normalized_linear``, shape ``(n, T)``.

    Finite for every finite ``W``, also where ``s_it`` itself underflows to 0, except at masked
    tokens (:attr:`Instance.mask`), where it is ``−inf`` (``log 0``: the weight is exactly 0).
    ``linear`` weights can be negative and have no logarithm.

    Scale: any finite data; each log weight to absolute error ``≲ T·eps·max|l_i|``; raises
    :class:`~attnsvm.NumericalError` when a logit exceeds 1.8e308 or a log weight is below −1.8e308.
    """
    _check_kind(kind)
    if kind == "linear":
        raise unknown_name("attention kind for log_attention", kind, KINDS[0::2])
    l = logits(inst, W)
    return log_softmax(l if kind == "softmax" else log_phi(l))


def attention_of(l: FloatArray, kind: str) -> FloatArray:
    """Array form of :func:`attention`, from logits ``l`` (shape ``(..., T)``); a ``−inf`` logit
    (a masked token) gets weight 0 for every kind."""
    if kind == "linear":
        return np.where(np.isneginf(l), 0.0, np.asarray(l, dtype=np.float64))
    base = l if kind == "softmax" else log_phi(l)
    # Weights whose log is below −1.8e308 are 0 to absolute accuracy 2^−1074 (rows sum to 1); those
    # below −745 underflow to 0 or a subnormal, within that accuracy, whatever the caller's errstate.
    with np.errstate(under="ignore"):
        return np.exp(_log_softmax_raw(base))


def attention(inst: Instance, W: ArrayLike, *, kind: str = "softmax") -> FloatArray:
    """Attention weights ``s_it``, shape ``(n, T)``.

    Args:
      inst: the data.
      W: attention matrix, shape ``(d, d)``, finite.
      kind: ``"softmax"``, ``"linear"`` or ``"normalized_linear"``.

    Returns:
      ``s`` with ``s_i = softmax(l_i)``, ``l_i`` or ``φ(l_i)/1ᵀφ(l_i)`` by kind, over the allowed tokens
      of :attr:`Instance.mask`; exactly 0 at masked tokens.

    Scale: any finite data; normalised kinds to ``≲ T·eps·max|l_i|`` relative per weight plus
    ``2^−1074`` absolute (weights below 2.2e-308 are returned to that absolute accuracy: use
    :func:`log_attention` for their size); ``linear`` as :func:`logits`. Raises
    :class:`~attnsvm.NumericalError` when a logit exceeds 1.8e308.
    """
    _check_kind(kind)
    return attention_of(logits(inst, W), kind)


def output(inst: Instance, W: ArrayLike, *, kind: str = "softmax") -> FloatArray:
    """Outputs ``f_i = Σ_t s_it vᵀx_it``, shape ``(n,)`` (the sum over the allowed tokens when masked).

    Scale: any finite data; ``f_i`` to absolute error ``≲ (d+T)·eps·Σ_t |s_it| Σ_k |v_k x_itk|`` plus
    the weights' own error (``2δl`` relative, :func:`logits`) and ``T·2^−1074·max_t|a_it|`` (terms
    lost against the largest; weights below the normal range still count, from their logs). Raises
    :class:`~attnsvm.NumericalError` when a logit or ``f_i`` exceeds 1.8e308, or when a nonzero
    ``Σ_t |s_it a_it|`` is below 2.2e-308 (``f_i`` would lose its digits to underflow).
    """
    _check_kind(kind)
    l = logits(inst, W)
    if kind == "linear":
        return output_of(attention_of(l, kind), inst.keys, inst.v)
    log_s = _log_softmax_raw(l if kind == "softmax" else log_phi(l))
    with np.errstate(under="ignore"):  # output_of uses log_s; s only where it is not tiny
        s = np.exp(log_s)
    return output_of(s, inst.keys, inst.v, log_s=log_s)


def output_of(s: FloatArray, X: FloatArray, v: FloatArray, *, log_s: FloatArray | None = None) -> FloatArray:
    """Array form of :func:`output` from weights ``s`` (no validation).

    ``f_i = 2^(es_i+ea_i) Σ_t s'_it a'_it`` with ``s'_i = s_i·2^−es_i``, ``a'_i = a_i·2^−ea_i`` (the
    values from per-sequence rescaled ``X`` and ``v``): ``f_i`` is formed without overflow whenever
    it is representable, even where a value ``vᵀx_it`` itself is not. With ``log_s`` (normalised
    kinds) each weight enters as ``e^r · 2^k`` from its logarithm, so a weight far below the range
    still counts (``e^{−800}·a`` with a large ``a`` is not lost).
    """
    a, ea = values_split(X, v)
    if log_s is None:
        ss, es = split_rows(s, 1)
        core = np.sum(ss * a, axis=-1)
        mag = np.sum(np.abs(ss * a), axis=-1)
        e = ea + es
    else:
        # s_it = e^{r_it}·2^{k_it}, k = ⌊log s / ln 2⌋ (exact integer), r ∈ [0, ln 2): each term
        # e^r·a'_it·2^(k_it − K_i) is aligned to the row's largest exponent K_i among nonzero values.
        ls = np.maximum(log_s, -5000.0)  # −inf (below −1.8e308) → a weight 0 to any precision
        k = np.floor(ls / _LN2)
        m = np.exp(ls - k * _LN2) * a
        kk = np.where(m != 0, k, -np.inf)
        K = np.max(kk, axis=-1)
        K = np.where(np.isfinite(K), K, 0.0)
        with np.errstate(under="ignore"):
            terms = np.ldexp(m, (k - K[:, None]).astype(np.int64))
        core = np.sum(terms, axis=-1)
        mag = np.sum(np.abs(terms), axis=-1)
        e = ea + K.astype(np.int64)
    with np.errstate(over="ignore", under="ignore"):
        f = np.ldexp(core, e)
        m = np.ldexp(mag, e)
    if not np.all(np.isfinite(f)):
        i = int(np.flatnonzero(~np.isfinite(f))[0])
        raise range_error(
            "the outputs f_i = Σ_t s_it vᵀx_it", math.log(abs(float(core[i]))) + float(e[i]) * _LN2
        )
    low = (mag > 0) & (m < FLOAT_TINY)
    if np.any(low):
        i = int(np.flatnonzero(low)[0])
        log_size = math.log(float(mag[i])) + float(e[i]) * _LN2
        if log_s is not None:  # the size from the unclamped log weights (the clamp at −5000 is not it)
            with np.errstate(divide="ignore", under="ignore"):
                la = log_s[i] + np.log(np.abs(a[i]))
                top = float(np.max(la))
                log_size = top + math.log(float(np.sum(np.exp(la - top)))) if math.isfinite(top) else top
            log_size += float(ea[i]) * _LN2
        raise range_error(
            "the outputs f_i = Σ_t s_it vᵀx_it (the size Σ_t |s_it vᵀx_it| of a nonzero one)",
            log_size,
            remedy="Scale v or X up",
        )
    return f
