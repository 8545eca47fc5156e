"""The float64 range, exact power-of-two rescaling, and the errors of the scale contract.

The scale contract. Every public numeric function of attnsvm, given finite data of any
magnitude float64 holds, returns the right answer to its documented accuracy or raises an
:class:`~attnsvm.errors.NumericalError` that names the quantity out of range and the
representable range. Where the mathematics is scale-equivariant (for example
``W_mm(cX, cz) = W_mm(X, z)/c²``) the function rescales instead of refusing, and refuses only
when the answer itself is not a representable double.

The tools here make that cheap and exact:

* :func:`pow2_exponent` / :func:`ldexp_scale`: rescale an array by a power of two, which is
  exact in binary floating point (no rounding) as long as the result stays in the normal
  range; data rescaled so that its largest entry lies in ``[½, 1)`` loses nothing.
* :func:`pow2_split`: the two together, ``a = m·2^e`` with ``max|m| ∈ [½, 1)`` — the one home of
  the power-of-two mantissa/exponent split the models use to keep every intermediate O(1).
* :func:`check_log_representable`: given the natural logarithm of a positive answer, raise
  the contract's error when ``exp`` of it is not a normal double.
* :func:`range_error`: the message, the same everywhere.

References: Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed., 2002), §2.1
(scaling by powers of the base is exact), §2.3 (gradual underflow loses relative precision).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ._types import FloatArray
from .errors import NumericalError

__all__ = [
    "EPS",
    "FLOAT_MAX",
    "FLOAT_TINY",
    "LOG_FLOAT_MAX",
    "LOG_FLOAT_TINY",
    "pow2_exponent",
    "ldexp_scale",
    "pow2_split",
    "log10_of",
    "range_error",
    "check_log_representable",
    "check_finite_result",
]


#: Machine epsilon, ``2^−52`` ≈ 2.2e-16: the spacing of doubles at 1 (the unit roundoff is ``EPS/2``).
EPS = float(np.finfo(np.float64).eps)
#: Largest finite double, ≈ 1.8e308.
FLOAT_MAX = float(np.finfo(np.float64).max)
#: Smallest *normal* positive double, ≈ 2.2e-308. Below it (the subnormal band, down to
#: ≈ 4.9e-324) a double keeps fewer than 53 significant bits.
FLOAT_TINY = float(np.finfo(np.float64).tiny)
#: ``log(FLOAT_MAX)`` ≈ 709.78.
LOG_FLOAT_MAX = math.log(FLOAT_MAX)
#: ``log(FLOAT_TINY)`` ≈ −708.40.
LOG_FLOAT_TINY = math.log(FLOAT_TINY)

_RANGE = "float64's normal range [2.2e-308, 1.8e308]"


def pow2_exponent(a: ArrayLike) -> int:
    """The exponent ``e`` with ``max|a| · 2^−e ∈ [½, 1)``; ``0`` when ``a`` is all zero.

    Dividing by ``2^e`` (:func:`ldexp_scale`) brings the largest entry to order one without
    rounding any normal entry.
    """
    # frexp(0) = (0, 0), so all-zero (and empty) arrays give 0.
    return math.frexp(float(np.max(np.abs(a), initial=0.0)))[1]


def ldexp_scale(a: ArrayLike, e: int) -> FloatArray:
    """``a · 2^−e``, exact for every entry whose result is a normal double (a new array)."""
    return np.ldexp(np.asarray(a, dtype=np.float64), -int(e))


def pow2_split(a: ArrayLike) -> tuple[FloatArray, int]:
    """Split ``a`` into a power-of-two mantissa and exponent: ``a = m·2^e``, ``max|m| ∈ [½, 1)``.

    ``e = pow2_exponent(a)`` is the ``math.frexp`` exponent of ``max|a|`` (``frexp(x) = (f, e)``,
    ``x = f·2^e``, ``|f| ∈ [½, 1)``) and ``m = a·2^−e`` (:func:`ldexp_scale`, a new float64 array;
    ``a`` is not modified). An all-zero or empty ``a`` gives ``(zeros, 0)``.

    Exactness: ``m_k·2^e = a_k`` holds exactly for every entry whose mantissa ``m_k`` is a normal
    double (``|a_k| ≥ 2^(e−1022)``, i.e. within ``2^1021`` of the largest entry), and for every entry
    when ``e ≤ 0`` (scaling up never rounds); an entry further below the largest is rounded to the
    subnormal grid of ``m``, absolute error ``≤ 2^−1075·2^e`` (``≤ 2^−1074`` relative to ``max|a|``).

    Scale: any finite ``a`` (subnormal entries and ``±1.8e308`` included); never over- or underflows.
    """
    e = pow2_exponent(a)
    return ldexp_scale(a, e), e


def log10_of(log_value: float) -> float:
    """``log10`` of a number given by its natural logarithm."""
    return log_value / math.log(10.0)


def range_error(what: str, log_value: float, *, remedy: str = "") -> NumericalError:
    """The scale contract's error: ``what`` is about ``10^k``, outside the representable range.

    Args:
      what: the quantity, as the user knows it (``"the risk gradient ∇L(W)"``).
      log_value: its natural logarithm (``+inf``/``−inf`` for beyond any bound).
      remedy: what to call or change instead (one sentence).
    """
    if math.isnan(log_value):
        size = "not representable (its logarithm is undefined)"
    elif math.isinf(log_value):
        size = "beyond any double (overflow)" if log_value > 0 else "below any double (underflow to 0)"
    else:
        k = log10_of(log_value)
        side = "overflows" if log_value > LOG_FLOAT_MAX else "underflows"
        size = f"about 1e{k:+.0f}: it {side} {_RANGE}"
    msg = f"{what} is {size}"
    return NumericalError(msg + (f". {remedy}" if remedy else ""))


def check_log_representable(what: str, log_value: float, *, remedy: str = "") -> float:
    """Return ``exp(log_value)`` when it is a normal double; otherwise raise :func:`range_error`."""
    if not (LOG_FLOAT_TINY <= log_value <= LOG_FLOAT_MAX):  # also False for NaN
        raise range_error(what, log_value, remedy=remedy)
    # exp of the interval's ends rounds to 2.2250738585072626e-308 and 1.7976931348622732e308: normal.
    return math.exp(log_value)


def check_finite_result(value: ArrayLike, what: str, *, remedy: str = "") -> FloatArray:
    """Return ``value`` as an array when every entry is finite; otherwise raise an overflow error."""
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise NumericalError(
            f"{what} is not finite: it overflows {_RANGE} (or is 0/0)" + (f". {remedy}" if remedy else "")
        )
    return arr
