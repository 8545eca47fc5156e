"""Validation at the boundary: the checks every public function runs on its arguments, in one place.

Each check returns the validated value in the type the code computes with, or raises an
:class:`~attnsvm.errors.AttnSVMError` subclass whose message names the argument, says what it must
be and shows what was given (``lr must be a positive finite number (the step size η); got -1``). A
public function validates once, on entry; the internal array forms trust their callers.

* :func:`as_real_array`: a finite real float64 array (read-only copy) of a given rank.
* :func:`check_shape`: the same, of an exact shape.
* :func:`check_instance`: an :class:`~attnsvm.Instance`.
* :func:`check_int`: an integer ``≥ low`` (``bool`` refused).
* :func:`check_positive`: a finite real number ``> 0`` (``bool`` refused).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ._types import FloatArray
from .errors import AttnSVMError, InvalidInstanceError

if TYPE_CHECKING:
    from .model._instance import Instance

__all__ = ["as_real_array", "check_shape", "check_instance", "check_int", "check_positive"]


def as_real_array(value: ArrayLike, name: str, ndim: int | None = None) -> FloatArray:
    """Return a validated float64 copy of ``value`` (read-only).

    Raises :class:`InvalidInstanceError` naming ``name`` when the value is not a real
    numeric array (complex, object, string and boolean data are refused), has the
    wrong rank, or holds NaN or Inf.
    """
    try:
        arr = np.array(value, copy=True)
    except Exception as exc:  # ragged lists and the like
        raise InvalidInstanceError(
            f"{name} must be a real numeric array; could not convert it ({exc})"
        ) from exc
    if arr.dtype.kind not in "iuf":
        raise InvalidInstanceError(
            f"{name} must hold real numbers (int or float); got dtype {arr.dtype}"
            + (" (complex values are not supported)" if arr.dtype.kind == "c" else "")
        )
    if ndim is not None and arr.ndim != ndim:
        raise InvalidInstanceError(f"{name} must have {ndim} dimension(s); got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise InvalidInstanceError(
            f"{name} must be finite; found {arr[tuple(bad)]} at index {tuple(int(b) for b in bad)}. "
            "Remove or impute NaN/Inf entries first."
        )
    arr.setflags(write=False)
    return arr


def check_shape(
    value: ArrayLike, name: str, shape: tuple[int, ...], *, described: str, note: str = ""
) -> FloatArray:
    """:func:`as_real_array` of rank ``len(shape)`` and exactly ``shape``; the message shows the shape as
    ``described`` (``"(d,)"``) and its value (``"(d,) = (4,)"``), then ``note`` (``" for this instance"``)."""
    arr = as_real_array(value, name, ndim=len(shape))
    if arr.shape != shape:
        raise InvalidInstanceError(f"{name} must have shape {described} = {shape}{note}; got {arr.shape}")
    return arr


def check_instance(inst: Any, name: str = "inst") -> Instance:
    """``inst`` itself when it is an :class:`~attnsvm.Instance`; else :class:`InvalidInstanceError`."""
    from .model._instance import Instance

    if not isinstance(inst, Instance):
        raise InvalidInstanceError(
            f"{name} must be an attnsvm.Instance; got {type(inst).__name__} "
            "(build one with attnsvm.Instance(X, Y, v, z))"
        )
    return inst


def check_int(value: Any, name: str, *, low: int = 1, error: type[AttnSVMError] = AttnSVMError) -> int:
    """``value`` as an ``int`` when it is an integer ``≥ low`` (numpy integers accepted, ``bool`` refused);
    else ``error``: ``"{name} must be an integer ≥ {low}; got {value!r}"``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise error(f"{name} must be an integer ≥ {low}; got {value!r}")
    return int(value)


def check_positive(
    value: Any, name: str, *, meaning: str = "", error: type[AttnSVMError] = AttnSVMError
) -> float:
    """``value`` as a ``float`` when it is a finite real number ``> 0`` (``bool`` refused); else ``error``:
    ``"{name} must be a positive finite number ({meaning}); got {value!r}"``."""
    try:
        val = float(value)
    except (TypeError, ValueError):
        raise error(f"{name} must be a positive finite number; got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(val) or val <= 0:
        about = f" ({meaning})" if meaning else ""
        raise error(f"{name} must be a positive finite number{about}; got {value!r}")
    return val
