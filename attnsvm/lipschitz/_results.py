"""What the Lipschitz functions return: :class:`LipschitzBound` and :class:`LipschitzEstimate`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._types import FloatArray


# --------------------------------------------------------------------------- result objects
@dataclass(frozen=True)
class LipschitzBound:
    """A certified upper bound on a Lipschitz constant; ``float(bound)`` is the bound.

    Attributes:
      value: the certified bound, rounding allowance included (``nominal · (1 + rounding_rtol)``).
      nominal: the formula evaluated in float64, before the rounding allowance.
      kind, of, wrt, radius: what it bounds.
      logit_norm: ``||𝓛||₂``.
      jacobian_factor: ``max_i κ_i``, the bound on the Jacobian with respect to the logits
        (``1`` for linear weights; for linear outputs the exact norm uses its own Gram).
      kappa: per-sequence factors ``κ_i``, shape ``(n,)``.
      formula: which formula gave ``nominal``.
      candidates: every certified candidate computed (name → value); ``nominal`` is their minimum.
      rounding_rtol: see :func:`bound_rounding_rtol`.
      log_value: ``ln(value)``, exact also where the diagnostics below leave the float64 range.
      log_candidates: ``ln`` of each candidate (``−inf`` for 0).
      log_kappa: ``ln κ_i`` (``−inf`` for 0), shape ``(n,)``.
      log_logit_norm: ``ln ||𝓛||₂``.

    ``value`` and ``nominal`` are always normal doubles (or exactly 0); the diagnostics
    ``logit_norm``, ``jacobian_factor``, ``kappa`` and ``candidates`` are rounded to float64 and read
    0 or inf where the quantity itself is outside ``[2.2e-308, 1.8e308]`` (their ``log_*`` are exact).
    """

    value: float
    nominal: float
    kind: str
    of: str
    wrt: str
    radius: float
    logit_norm: float
    jacobian_factor: float
    kappa: FloatArray = field(repr=False)
    formula: str
    candidates: dict[str, float] = field(repr=False)
    rounding_rtol: float = field(repr=False)
    log_value: float = field(repr=False, default=math.nan)
    log_candidates: dict[str, float] = field(repr=False, default_factory=dict)
    log_kappa: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))
    log_logit_norm: float = field(repr=False, default=math.nan)

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True)
class LipschitzEstimate:
    """An attained lower estimate: ``value = ||J(W)||₂`` at the returned point ``W`` of the ball.

    Attributes:
      value: the largest Jacobian spectral norm found.
      W: the point attaining it, shape ``(d, d)``, ``||W||_F ≤ radius``.
      kind, of, wrt, radius, seed, samples, steps: the request.
      evaluations: how many Jacobians were evaluated.
      search_value: ``||J(W)||₂`` at ``W`` by the factorised path used in the search
        (``λ_max(D G Dᵀ)^{1/2}``); ``value`` is the full-Jacobian SVD at the same point.
    """

    value: float
    W: FloatArray = field(repr=False)
    kind: str
    of: str
    wrt: str
    radius: float
    seed: int
    samples: int
    steps: int
    evaluations: int
    search_value: float = field(repr=False, default=math.nan)

    def __float__(self) -> float:
        return self.value
