"""Attention weights and outputs over the logits ``l_it = x_itᵀ W z_i``.

Kinds (all act on the same logits ``l_i ∈ R^T`` of sequence ``i``):

* ``softmax``            ``s_i = softmax(l_i)``, computed as ``exp(l_i − logsumexp(l_i))``;
* ``linear``             ``s_i = l_i`` (no normalisation);
* ``normalized_linear``  ``s_i = φ(l_i) / 1ᵀφ(l_i)``, ``φ = elu + 1`` (the positive feature
  map of Katharopoulos et al. 2020, applied to the logits).

The output of sequence ``i`` is ``f_i = Σ_t s_it vᵀx_it``.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (the model);
Katharopoulos, Vyas, Pappas, Fleuret, ICML 2020 (``φ = elu + 1``);
Kim, Papamakarios, Mnih, ICML 2021 (softmax vs. linear sensitivity).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import unknown_name
from .instance import Instance

__all__ = ["KINDS", "logits", "log_softmax", "log_phi", "log_attention", "attention", "output"]

FloatArray = NDArray[np.float64]

KINDS = ("softmax", "linear", "normalized_linear")


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    return kind


def logits(inst: Instance, W: ArrayLike) -> FloatArray:
    """Logits ``l_it = x_itᵀ W z_i``, shape ``(n, T)``."""
    Wa = inst.check_weights(W)
    return logits_of(inst.X, inst.z, Wa)


def logits_of(X: FloatArray, z: FloatArray, W: FloatArray) -> FloatArray:
    """Array form of :func:`logits` (no validation): ``einsum('ntd,de,ne->nt')``."""
    return np.einsum("ntd,nd->nt", X, z @ W.T)


def log_softmax(l: FloatArray) -> FloatArray:
    """``log softmax`` along the last axis.

    Numerically stable form: ``l − max(l) − log Σ exp(l − max(l))``. The naive
    ``log(exp(l)/Σexp(l))`` overflows for ``l > 709`` and gives ``log 0 = −inf`` for
    weights below 1e-308; this form is exact to a few ulps for any finite ``l``
    (log weights of ``−10⁶`` are returned as such, not as ``−inf``).
    """
    m = np.max(l, axis=-1, keepdims=True)
    shifted = l - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def log_phi(l: FloatArray) -> FloatArray:
    """``log φ(l)`` for ``φ = elu + 1``: ``log1p(l)`` for ``l > 0`` and ``l`` for ``l ≤ 0``.

    Working in logs keeps ``normalized_linear`` exact when every logit of a sequence is very
    negative (``φ = eˡ`` then underflows to 0 and ``φ / 1ᵀφ`` would be ``0/0``).
    """
    return np.where(l > 0, np.log1p(np.maximum(l, 0.0)), np.minimum(l, 0.0))


def log_attention(inst: Instance, W: ArrayLike, kind: str = "softmax") -> FloatArray:
    """``log s_it`` for the normalised kinds ``softmax`` and ``normalized_linear``, shape ``(n, T)``.

    Finite for every finite ``W``, also where ``s_it`` itself underflows to 0.
    ``linear`` weights can be negative and have no logarithm.
    """
    _check_kind(kind)
    if kind == "linear":
        raise unknown_name("attention kind for log_attention", kind, KINDS[0::2])
    l = logits(inst, W)
    return log_softmax(l if kind == "softmax" else log_phi(l))


def attention_of(l: FloatArray, kind: str) -> FloatArray:
    """Array form of :func:`attention`, from logits ``l`` (shape ``(..., T)``)."""
    if kind == "linear":
        return np.array(l, dtype=np.float64)
    base = l if kind == "softmax" else log_phi(l)
    return np.exp(log_softmax(base))


def attention(inst: Instance, W: ArrayLike, kind: str = "softmax") -> FloatArray:
    """Attention weights ``s_it``, shape ``(n, T)``.

    Args:
      inst: the data.
      W: attention matrix, shape ``(d, d)``, finite.
      kind: ``"softmax"``, ``"linear"`` or ``"normalized_linear"``.

    Returns:
      ``s`` with ``s_i = softmax(l_i)``, ``l_i`` or ``φ(l_i)/1ᵀφ(l_i)`` by kind.
    """
    _check_kind(kind)
    return attention_of(logits(inst, W), kind)


def output(inst: Instance, W: ArrayLike, kind: str = "softmax") -> FloatArray:
    """Outputs ``f_i = Σ_t s_it vᵀx_it``, shape ``(n,)``."""
    s = attention(inst, W, kind)
    return np.sum(s * inst.values(), axis=1)
