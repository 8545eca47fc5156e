"""The exact power-of-two rescaling every GD engine computes on, and the checks of iterates in it.

Every engine computes on the data rescaled by exact powers of two (``X' = X·2^−ex``, ``z' = z·2^−ez``,
``v' = v·2^ex``: the token values are unchanged; the logits of ``W`` are those of ``W' = W·2^(ex+ez)`` on
``X'``, ``z'``), while its iterate stays in the user's scale. The data's magnitude alone therefore never
overflows or underflows an intermediate; an iterate, logit or token value that is itself not a normal
double raises :class:`~attnsvm.NumericalError` naming it and the range.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from ..errors import InvalidInstanceError, NumericalError
from ..model._instance import Instance, split_rows
from ..scaling import (
    FLOAT_MAX,
    FLOAT_TINY,
    LOG_FLOAT_MAX,
    ldexp_scale,
    log10_of,
    pow2_exponent,
    pow2_split,
    range_error,
)

#: Smallest positive normal float64. A plain-GD gradient whose norm falls below it has lost
#: relative precision (subnormal) or underflowed to 0: the update is no longer ``η∇L``.
_TINY = float(np.finfo(np.float64).tiny)


# ======================================================================== data scale
_LN2 = math.log(2.0)


class _Scaled(NamedTuple):
    """The instance's arrays rescaled by exact powers of two, and the scale of ``W``.

    ``X' = X·2^−ex``, ``z' = z·2^−ez`` (largest entries in ``[½, 1)``) and ``v' = v·2^ex`` (so the
    token values ``a = X'v' = Xv`` and the loss arguments are unchanged). The logits are then
    ``l = x'ᵀ W' z'`` with ``W' = W·2^k``, ``k = ex + ez``: GD on ``W`` is GD on ``W'`` with data of
    order one, and ``∇_W L = 2^k ∇_{W'} L``. Every engine computes on ``(X', z', v', W')``, so
    no intermediate (logits, ``x zᵀ``, ``Σ w x zᵀ``) overflows or underflows because of the data's
    scale alone. Entries of ``X``/``z`` more than ``2^1022`` below the largest round in ``X'``/``z'``
    (absolute error ≤ 2^−1075 against entries ≥ ½: invisible at float64 precision). Where ``v·2^ex`` cannot
    carry normal values, ``_rescale(..., shift=True)`` (``run_gd`` and the other engines) uses ``v·2^c`` with
    ``X·2^−c`` and ``z'·2^(c−ex)`` instead (checked exact, or rounded harmlessly for the values; ``k`` and
    ``max|X'|·max|z'| < 1`` unchanged).
    """

    X: FloatArray
    Y: FloatArray
    z: FloatArray
    v: FloatArray
    k: int
    d: int
    #: the instance's token mask (``None``: every token takes part); ``X`` then has its masked tokens zeroed
    mask: NDArray[np.bool_] | None = None

    @property
    def mask_kw(self) -> dict[str, Any]:
        """``{"mask": mask}`` when there is one, else ``{}`` (the array forms' keyword, passed only then)."""
        return {} if self.mask is None else {"mask": self.mask}


def _v_exact(v: FloatArray, Xs: FloatArray, c: int) -> bool:
    """``v' = v·2^c`` carries the token values: finite, and every entry comes back bit for bit, or the
    entries that do not (rounded below the normal range, each by at most 2^−1075) move no token value
    ``x''ᵀv'`` (``x'' = x·2^−c``) by more than the value's own rounding, ``eps·Σ_k|x''_tk v'_k|``.

    ``Xs = |X·2^−ex|`` (``max ≤ 1``): the test is linear in ``x''``, so it is made in the units of ``Xs`` (the
    factor ``2^(ex−c)`` cancels). v = (1, 2e-182) with x ≈ 2e-182 has normal values although v'_1 underflows.
    The test in units of 2^−1075: ``Σ_k|x_tk|·[v'_k rounded] ≤ 2^1023·Σ_k|x_tk v'_k|``."""
    with np.errstate(over="ignore"):
        v2 = ldexp_scale(v, -c)
        if not bool(np.all(np.isfinite(v2))):
            return False
        back = ldexp_scale(v2, c)
    if bool(np.array_equal(back, v)):
        return True
    with np.errstate(over="ignore"):
        moved = Xs @ (back != v).astype(np.float64)
        return bool(np.all(moved <= (Xs @ np.abs(v2)) * 2.0**1023))


def _value_exponent(v: FloatArray, ex: int) -> int:
    """The exponent ``c`` nearest to ``ex`` at which ``v·2^c`` is representable: when ``v·2^ex`` overflows, the
    largest that keeps ``max|v·2^c| < 2^1024``; otherwise (entries rounded below the normal range) the smallest
    that makes the smallest nonzero entry normal, capped by the largest."""
    nz = np.abs(v[v != 0])
    if nz.size == 0:
        return ex
    hi = 1024 - math.frexp(float(np.max(nz)))[1]  # max|v|·2^c < 2^1024
    lo = -1021 - math.frexp(float(np.min(nz)))[1]  # min|v|·2^c ≥ 2^−1022
    return hi if hi < ex else min(max(lo, ex), hi)


#: How far :func:`_rescale` searches for an exponent that carries the token values, in binades either side of the
#: one :func:`_value_exponent` finds (the keys' rounding at ``X·2^−c`` changes by one binade per step of ``c``;
#: data whose keys span more than that within a token are refused as before).
CARRY_SEARCH = 64


def _carried(inst: Instance, z1: FloatArray, ex: int, c: int) -> tuple[FloatArray, bool]:
    """``(X'', ok)``: ``X'' = keys·2^−c`` and whether exponent ``c`` carries the instance's token values:
    :func:`_keys_carry`, ``v'' = v·2^−c`` exact or rounded harmlessly (:func:`_v_exact`, each token scaled on its
    own: linear in each token, nothing flushed against others) and ``z'' = z'·2^(c−ex)`` exact."""
    with np.errstate(under="ignore", over="ignore"):
        X2 = np.ldexp(inst.keys, -c)  # from the keys themselves (X·2^−ex flushes entries that X·2^−c keeps)
        v2 = ldexp_scale(inst.v, -c)
    if not bool(np.all(np.isfinite(v2))):
        return X2, False
    ok = (
        _keys_carry(inst.keys, X2, v2, c)
        and _v_exact(inst.v, np.abs(split_rows(X2, 2)[0]), c)
        and _moved_exactly(z1, c - ex)
    )
    return X2, ok


def _keys_carry(keys: FloatArray, X2: FloatArray, v2: FloatArray, c: int) -> bool:
    """``X'' = keys·2^−c`` carries the token values ``x''ᵀv''``: finite, and every entry comes back bit for bit,
    or the entries that do not (rounded below the normal range, each by at most 2^−1075) move no value by
    more than its own rounding, ``eps·Σ_k|x''_tk v''_k|``; and no ``Σ_k|x''_tk v''_k|`` overflows (the engines
    form ``X''v''``). The test is linear in ``v''``, so it is made on ``v''`` scaled to largest entry ½..1.

    (``X'`` shifted from ``X·2^−ex`` lost what ``X·2^−ex`` had flushed: keys ``(2^600, 2^−600)`` with
    ``v = (2^−600, 2^600)`` lost the ``2^−600`` entry that carries half of each value, a direction 0.25 off.)
    """
    if not bool(np.all(np.isfinite(X2))):
        return False
    with np.errstate(over="ignore"):
        if not bool(np.all(np.isfinite(np.abs(X2) @ np.abs(v2)))):
            return False
    vn = np.abs(pow2_split(v2)[0])
    rounded = (np.ldexp(X2, c) != keys).astype(np.float64)
    if not np.any(rounded):
        return True
    with np.errstate(over="ignore"):
        return bool(np.all(rounded @ vn <= (np.abs(X2) @ vn) * 2.0**1023))


def _moved_exactly(a: FloatArray, e: int) -> bool:
    """``a·2^e`` is exact: every entry comes back bit for bit (no overflow, no rounding below the range)."""
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(a, e)
        return bool(np.all(np.isfinite(out))) and bool(np.array_equal(np.ldexp(out, -e), a))


def _rescale(inst: Instance, *, shift: bool = False) -> _Scaled:
    """:class:`_Scaled` of ``inst``; raises the contract's error when the token values ``vᵀx_it`` leave the
    normal range.

    The values are carried by ``v' = v·2^ex`` (``X' = X·2^−ex``). Without ``shift`` that ``v'`` must be exact
    (or round harmlessly, :func:`_v_exact`), else the instance is refused. With ``shift`` (``run_gd``, ``run_gd_batch``, ``run_gd_kq``, ``regularization_path``), where
    it is not, the values are decided by :meth:`Instance.values` itself (the contract's rule: refused when a
    value exceeds 1.8e308 or a nonzero one underflows), and normal values are carried by ``v'' = v·2^c`` with
    ``c`` as near ``ex`` as :func:`_value_exponent` finds (or, where the keys round there, the nearest exponent
    within ``CARRY_SEARCH`` binades of it that carries them, :func:`_carried`), ``X'' = X·2^−c`` (from the keys themselves, exact or
    rounded harmlessly for the values, :func:`_keys_carry`) and ``z'' = z'·2^(c−ex)`` (exact), ``k`` unchanged: the logits ``x''ᵀ W' z''``, the values ``x''ᵀ v''`` and
    ``max|x''|·max|z''| < 1`` are those of the unshifted data, so the engine computes the same quantities
    (values near 1 from ``v = (2^−60, 2^1000)`` and keys ``(0.75·2^30, 0.75·2^−1000)`` were refused:
    ``v·2^30`` overflows, the values do not). An instance ``v·2^ex`` carries is rescaled bit for bit as before.
    """
    # Instance.keys: X with its masked tokens zeroed (X itself without a mask), so they set no scale
    ex, ez = pow2_exponent(inst.keys), pow2_exponent(inst.z)
    X1, z1 = ldexp_scale(inst.keys, ex), ldexp_scale(inst.z, ez)
    Xs = np.abs(X1)
    c = ex
    exact = _v_exact(inst.v, Xs, ex)
    if not exact and shift:
        try:
            inst.values()  # NumericalError where a value is not a normal double: refused below
        except NumericalError:
            pass
        else:
            # the exponent _value_exponent finds first, then its neighbours, nearest first: keys that round at
            # the first (X·2^−48 subnormal beside values 2^20 ulps apart) may carry one binade away
            c0 = _value_exponent(inst.v, ex)
            for c in sorted(range(c0 - CARRY_SEARCH, c0 + CARRY_SEARCH + 1), key=lambda e: (abs(e - c0), e)):
                X2, exact = _carried(inst, z1, ex, c)
                if exact:
                    break
    if not exact:
        # v·2^ex overflowed or went subnormal: the values vᵀx_it (size ~ |v|·|X|) are not normal doubles.
        with np.errstate(over="ignore", invalid="ignore"):
            back = ldexp_scale(ldexp_scale(inst.v, -ex), ex)
        j = int(np.flatnonzero(~(back == inst.v))[0])  # the first entry that did not come back
        log_val = math.log(abs(float(inst.v[j]))) + ex * _LN2
        raise range_error(
            f"the token values vᵀx_it (|v_{j}| = {abs(float(inst.v[j])):.3g} times max|X| ≈ 2^{ex})",
            log_val,
            remedy="Rescale v or X so that the token values vᵀx_it are normal doubles",
        )
    if (
        c != ex
    ):  # the checked arrays: X'' = X·2^−c (checked by _keys_carry), z'' = z'·2^(c−ex) (exact both ways)
        X1, z1 = X2, np.ldexp(z1, c - ex)
    return _Scaled(X1, inst.Y, z1, ldexp_scale(inst.v, -c), ex + ez, inst.d, inst.mask)


#: Largest ``max|W'|`` (``W' = W·2^k``, data entries ≤ 1) whose logits and their differences
#: stay finite: ``|l_it| ≤ d²·max|W'|`` and the log-domain forms subtract two logits.
def _pow2_factors(k: NDArray[np.int64]) -> list[FloatArray]:
    """Powers of two whose product is ``2^k`` (per entry), each a double, all of one sign of
    exponent (so ``W·f1·f2·f3`` rounds only when ``W·2^k`` itself is not normal); ``[]`` if ``k = 0``."""
    if not np.any(k):
        return []
    parts = 1 if np.max(np.abs(k)) <= 1000 else 3
    out, left = [], np.array(k, dtype=np.int64)
    for i in range(parts, 0, -1):
        ki = left // i if i > 1 else left
        out.append(np.ldexp(1.0, ki))
        left = left - ki
    return out


def _logit_bound(d: int) -> float:
    return FLOAT_MAX / (4.0 * d * d)


def _to_logit_scale(sc: _Scaled, W: FloatArray, what: str = "W") -> FloatArray:
    """``W' = W·2^k`` (exact while normal; entries that round below the normal range change the
    logits by < 2^−1070, nothing at float64 precision); raises when the logits would overflow."""
    m = float(np.max(np.abs(W), initial=0.0))
    if m > 0 and math.log(m) + sc.k * _LN2 > math.log(_logit_bound(sc.d)):
        quantity = (
            f"the logits x_itᵀ {what} z_i (up to d²·max|{what}|·max|X|·max|z| ≈ "
            f"{sc.d * sc.d}·{m:.3g}·2^{sc.k})"
        )
        log_l = math.log(sc.d * sc.d) + math.log(m) + sc.k * _LN2
        remedy = (
            "The softmax is one-hot far beyond float64 there; lower lr or the number of steps, "
            "or rescale the data (W·c on (X, z) is W on (√c·X, √c·z))"
        )
        if log_l > LOG_FLOAT_MAX:
            raise range_error(quantity, log_l, remedy=remedy)
        # Representable, but above the headroom the engines need (logit differences and the
        # gradient's sums would overflow): an overflow of that bound, not an underflow.
        raise NumericalError(
            f"{quantity} is about 1e{log10_of(log_l):+.0f}: above {_logit_bound(sc.d):.3g} = 1.8e308/(4d²), "
            f"the largest logits whose softmax and gradient float64 computes without overflow. {remedy}"
        )
    return np.ldexp(W, sc.k)


def _check_iterate(W: FloatArray, what: str) -> FloatArray:
    """An iterate must be 0 or have its largest entry a normal double (smaller entries then have
    absolute error ≤ 2^−1075 ≤ eps·max|W|: normwise exact); otherwise the contract's error."""
    m = float(np.max(np.abs(W), initial=0.0))
    if m == 0.0 or FLOAT_TINY <= m <= FLOAT_MAX:
        return W
    log_m = math.log(m) if math.isfinite(m) else math.inf
    raise range_error(
        what,
        log_m,
        remedy="Scale lr (and W0) with the data: X·2^a, z·2^b is the same problem in W·2^−(a+b)",
    )


# ============================================================================ checking


def _check_reference(inst: Instance, reference: ArrayLike | None) -> FloatArray | None:
    if reference is None:
        return None
    R = inst.check_weights(reference, "reference")
    if not np.any(R != 0):
        raise InvalidInstanceError("reference is the zero matrix; it has no direction")
    return R
