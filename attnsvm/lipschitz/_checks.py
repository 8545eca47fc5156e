"""Validation shared by the Lipschitz functions: the maps ``of``, the variable ``wrt``, the radius."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import AttnSVMError, unknown_name
from ..model._attention import KINDS

OFS = ("weights", "output")
WRTS = ("W",)


def _check_common(kind: str, of: str, wrt: str) -> None:
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    if of not in OFS:
        raise unknown_name("Lipschitz map 'of'", of, OFS)
    if wrt not in WRTS:
        raise AttnSVMError(
            f"wrt={wrt!r} is not supported: only Lipschitz constants with respect to the attention "
            "matrix W (wrt='W') are implemented. Pass wrt='W'."
        )


def _check_radius(radius: Any) -> float:
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)):
        raise AttnSVMError(
            f"radius must be a real number > 0; got {radius!r} of type {type(radius).__name__}"
        )
    r = float(radius)
    if not math.isfinite(r) or r <= 0.0:
        raise AttnSVMError(
            f"radius must be finite and > 0 (the ball ||W||_F ≤ radius); got {radius!r}. "
            "The linear bound is radius-free; for the others pass a positive finite radius."
        )
    return r
