"""The array type aliases every module annotates with (annotations only: no runtime behaviour).

* ``FloatArray``: float64 arrays, the package's one floating type.
* ``IntArray``: index arrays (``np.intp``, what ``argmax`` and fancy indexing use).
* ``Int64Array``: counts and binary exponents (``np.int64`` whatever the platform's index width).
* ``BoolArray``: masks.

The float64 constants (``EPS``, ``FLOAT_MAX``, ``FLOAT_TINY`` and their logarithms) live in
:mod:`attnsvm.scaling`, with the rescaling they serve.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["FloatArray", "IntArray", "Int64Array", "BoolArray"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
Int64Array = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
