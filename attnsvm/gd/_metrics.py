"""Measures of a GD direction: correlation and gap to a reference, and the fitted rate of the gap.

``corr(W₁, W₂) = ⟨W₁, W₂⟩_F / (||W₁||_F ||W₂||_F)`` and ``gap(W₁, W₂) = ||W₁/||W₁|| − W₂/||W₂|| ||_F``
(``gap² = 2 − 2·corr``, computed from the difference so a small gap keeps its relative accuracy);
:func:`fit_rate` fits ``log gap = a + b·log x`` by least squares.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from .._types import FloatArray
from .._validation import as_real_array
from ..errors import InvalidInstanceError
from ..scaling import (
    LOG_FLOAT_MAX,
    ldexp_scale,
    pow2_exponent,
    range_error,
)
from ._scaled import _LN2


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
