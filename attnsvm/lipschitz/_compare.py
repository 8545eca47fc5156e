"""Bounds against estimates per kind: :func:`compare_lipschitz` and its ratio conventions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .._validation import check_instance
from ..errors import unknown_name
from ..model._attention import KINDS
from ..model._instance import Instance
from ..scaling import FLOAT_MAX, FLOAT_TINY, range_error
from ._bound import lipschitz_bound
from ._checks import OFS, _check_radius
from ._estimate import lipschitz_estimate


# --------------------------------------------------------------------------- comparison
def _ratio(x: float, y: float, what: str) -> float:
    """``x / y`` of two numbers ``≥ 0`` with the conventions of :func:`compare_lipschitz`:
    ``0/0 = 1`` (both constants 0: equal), ``x/0 = inf`` (``x > 0``), ``0/y = 0``; a quotient of
    positive numbers that leaves float64's normal range raises the scale contract's error."""
    if y == 0.0:
        return 1.0 if x == 0.0 else math.inf
    if x == 0.0:
        return 0.0
    r = x / y  # Python floats: inf on overflow, 0 or a subnormal on underflow (checked next)
    if not FLOAT_TINY <= r <= FLOAT_MAX:  # an overflow to inf or a (subnormal) underflow
        raise range_error(what, math.log(x) - math.log(y), remedy="Compare the logarithms of the two numbers")
    return r


def _gap(b: float, e: float) -> float:
    """``bound / estimate`` with the conventions of :func:`_ratio` (``0/0 = 1``, ``b/0 = inf``).

    Never out of range, so no range check: the bound is certified (``b ≥ e``, never below 2^-1022·e), and
    a returned estimate exceeds its rounding floor ``≥ JACOBIAN_ULPS·(nT + d²)·eps`` times the scale that
    also bounds the bound (``||𝓛_i||_F``, times the values' size for outputs; ``_jacobian_floors``), so
    ``b/e ≲ 1/eps``, far below 1.8e308.
    """
    if e == 0.0:
        return 1.0 if b == 0.0 else math.inf
    return b / e


def compare_lipschitz(
    instances: Sequence[Instance],
    radii: Sequence[float],
    *,
    of: str = "weights",
    seed: int = 0,
    samples: int = 32,
    steps: int = 20,
) -> list[dict[str, Any]]:
    """Bound and estimate per kind for every (instance, radius), with the softmax ratios.

    One row per ``(instance index, radius)`` with, for each kind ``k``, ``bound_k``, ``estimate_k``
    and ``gap_k = bound_k / estimate_k``, and the ratios ``softmax/linear`` and
    ``softmax/normalized_linear`` of bounds (``bound_ratio_*``) and of estimates (``estimate_ratio_*``).
    An estimate ratio above 1 means softmax is *less* stable than the other kind on that ball, as
    attained (not just bounded).

    Ratios at 0 (every ratio ``x / y`` of the row, never NaN):

    * ``0 / 0 = 1``: both numbers are exactly 0 only when both constants are 0 (a bound of 0 certifies
      the constant 0, an estimate of 0 is returned only for a Jacobian identically 0), so the bound is
      exact (gap 1) and the two kinds are equally stable (ratio 1);
    * ``x / 0 = inf`` for ``x > 0``: the estimate is 0 (the Jacobian identically 0) while the bound is
      positive, or the other kind's constant is 0 while softmax's is not: the exact ratio is unbounded;
    * ``0 / y = 0`` for ``y > 0``, exactly.

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710.

    Args:
      instances: the data sets.
      radii: ball radii ``R > 0``.
      of: ``"weights"`` or ``"output"``.
      seed, samples, steps: passed to :func:`lipschitz_estimate`.

    Scale: as :func:`lipschitz_bound` and :func:`lipschitz_estimate` (it raises what they raise);
    each ratio of two positive numbers is their correctly rounded quotient when that is a normal
    double, otherwise :class:`~attnsvm.NumericalError` names it (never a silent ``inf`` or 0).

    Returns:
      A list of dicts (table rows), ``len(instances) · len(radii)`` of them.
    """
    if of not in OFS:
        raise unknown_name("Lipschitz map 'of'", of, OFS)
    rs = [_check_radius(r) for r in radii]

    rows: list[dict[str, Any]] = []
    for idx, inst in enumerate(instances):
        check_instance(inst, f"instances[{idx}]")
        for R in rs:
            row: dict[str, Any] = {"instance": idx, "shape": inst.shape, "radius": R, "of": of}
            for kind in KINDS:
                b = float(lipschitz_bound(inst, kind=kind, radius=R, of=of))
                e = float(
                    lipschitz_estimate(
                        inst, kind=kind, radius=R, of=of, seed=seed, samples=samples, steps=steps
                    )
                )
                row[f"bound_{kind}"] = b
                row[f"estimate_{kind}"] = e
                row[f"gap_{kind}"] = _gap(b, e)
            for other in ("linear", "normalized_linear"):
                for what in ("bound", "estimate"):
                    row[f"{what}_ratio_softmax/{other}"] = _ratio(
                        row[f"{what}_softmax"],
                        row[f"{what}_{other}"],
                        f"the {what} ratio softmax/{other} (radius {R:.3g})",
                    )
            rows.append(row)
    return rows
