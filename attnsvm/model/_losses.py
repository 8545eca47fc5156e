"""Losses ``ℓ(u)`` of the margin ``u = Y_i f_i``, with derivatives and declared assumptions.

Built in:

* ``logistic``    ``ℓ(u) = log(1 + e^{−u})``,   ``ℓ'(u) = −1 / (1 + e^{u})``;
* ``exponential`` ``ℓ(u) = e^{−u}``,            ``ℓ'(u) = −e^{−u}``;
* ``correlation`` ``ℓ(u) = −u``,                ``ℓ'(u) = −1``.

The seed paper (Chen, Guo, Li, Song, Zhou, ICLR 2024 submission) claims convergence in
direction under weaker assumptions on ``ℓ'`` than Tarzanagh et al. (arXiv 2308.16898),
which ask for a strictly decreasing loss whose derivative is bounded and Lipschitz
on bounded sets. Each loss therefore carries :class:`LossAssumptions`, and users can
pass their own :class:`Loss` (or any object with ``value``, ``derivative`` and
``assumptions``) wherever a loss name is accepted, to try losses outside them.

Every function here takes a NumPy array or a torch tensor and returns the same kind,
so one loss object serves the NumPy and the torch engines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import AttnSVMError, NumericalError, unknown_name

__all__ = [
    "LossAssumptions",
    "Loss",
    "LossLike",
    "LOSSES",
    "get_loss",
    "logistic",
    "exponential",
    "correlation",
]

#: ``e^{−u}`` overflows float64 for ``u < −EXP_OVERFLOW`` (log of the largest double).
EXP_OVERFLOW = math.log(np.finfo(np.float64).max)


@dataclass(frozen=True)
class LossAssumptions:
    """What a loss satisfies; the conditions the convergence theorems are stated under.

    Attributes:
      strictly_decreasing: ``ℓ' < 0`` everywhere.
      derivative_bounded: ``sup_u |ℓ'(u)| < ∞`` on all of ℝ (if False, only on bounded sets).
      derivative_lipschitz_on_bounded_sets: ``ℓ'`` is Lipschitz on every bounded set.
      bounded_below: ``inf ℓ > −∞``.
    """

    strictly_decreasing: bool
    derivative_bounded: bool
    derivative_lipschitz_on_bounded_sets: bool
    bounded_below: bool


def _xp(u: Any) -> Any:
    """The array namespace of ``u``: torch for tensors, NumPy otherwise."""
    if type(u).__module__.startswith("torch"):
        import torch

        return torch
    return np


def _exp_checked(x: Any) -> Any:
    """``e^{x}``, raising :class:`NumericalError` instead of returning Inf."""
    xp = _xp(x)
    if xp is np:
        x = np.asarray(x)
    size = x.numel() if xp is not np else x.size
    # the check reads a value, not a graph: detach a torch tensor first (float() of a tensor that
    # requires grad warns)
    top = float((x if xp is np else x.detach()).max()) if size else -math.inf
    if top > EXP_OVERFLOW:
        raise NumericalError(
            f"the exponential loss e^{{-u}} is about 1e{top / math.log(10.0):+.0f}: it overflows "
            "float64's normal range [2.2e-308, 1.8e308] (margin u < -709.78); "
            "rescale the data or use the logistic loss"
        )
    return xp.exp(x)


@dataclass(frozen=True)
class Loss:
    """A margin loss: ``value(u)``, ``derivative(u)``, ``log_neg_derivative(u)`` and assumptions.

    ``log_neg_derivative(u) = log(−ℓ'(u))`` lets the log-domain gradient direction
    (:func:`attnsvm.model._grad.normalized_risk_grad`) stay exact when ``ℓ'`` underflows; if a
    custom loss leaves it ``None`` it is computed as ``log(−derivative(u))``.
    """

    name: str
    value_fn: Callable[[Any], Any]
    derivative_fn: Callable[[Any], Any]
    assumptions: LossAssumptions
    log_neg_derivative_fn: Callable[[Any], Any] | None = None

    def value(self, u: Any) -> Any:
        """``ℓ(u)``, elementwise."""
        return self.value_fn(u)

    def derivative(self, u: Any) -> Any:
        """``ℓ'(u)``, elementwise."""
        return self.derivative_fn(u)

    def log_neg_derivative(self, u: Any) -> Any:
        """``log(−ℓ'(u))`` for a decreasing loss, elementwise (``−inf`` where ``ℓ' = 0``)."""
        if self.log_neg_derivative_fn is not None:
            return self.log_neg_derivative_fn(u)
        xp = _xp(u)
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.log(-self.derivative_fn(u))


@runtime_checkable
class LossLike(Protocol):
    """Anything with ``value(u)``, ``derivative(u)`` and ``assumptions``."""

    assumptions: LossAssumptions

    def value(self, u: Any) -> Any: ...

    def derivative(self, u: Any) -> Any: ...


# --------------------------------------------------------------------- logistic
def _softplus(x: Any) -> Any:
    # log(1 + e^x) = max(x, 0) + log1p(e^{−|x|}): never overflows, exact for large |x|.
    xp = _xp(x)
    return xp.clip(x, 0, None) + xp.log1p(xp.exp(-xp.abs(x)))


def _logistic_value(u: Any) -> Any:
    return _softplus(-u)


def _logistic_derivative(u: Any) -> Any:
    # −1/(1 + e^u) = −sigmoid(−u); with e = e^{−|u|} ∈ (0, 1] this is −e/(1+e) for u ≥ 0
    # and −1/(1+e) for u < 0: no overflow, full relative precision in the tail.
    xp = _xp(u)
    e = xp.exp(-xp.abs(u))
    return -xp.where(u >= 0, e, xp.ones_like(e)) / (1 + e)


def _logistic_log_neg_derivative(u: Any) -> Any:
    # log(1/(1 + e^u)) = −softplus(u): finite for every finite u, where ℓ' itself underflows.
    return -_softplus(u)


logistic = Loss(
    "logistic",
    _logistic_value,
    _logistic_derivative,
    LossAssumptions(True, True, True, True),
    _logistic_log_neg_derivative,
)

# ------------------------------------------------------------------ exponential
exponential = Loss(
    "exponential",
    lambda u: _exp_checked(-u),
    lambda u: -_exp_checked(-u),
    LossAssumptions(True, False, True, True),
    lambda u: -u,
)

# ------------------------------------------------------------------ correlation
correlation = Loss(
    "correlation",
    lambda u: -u,
    lambda u: -_xp(u).ones_like(u),
    LossAssumptions(True, True, True, False),
    lambda u: _xp(u).zeros_like(u),
)

LOSSES: dict[str, Loss] = {loss.name: loss for loss in (logistic, exponential, correlation)}


def get_loss(loss: "str | LossLike") -> "Loss | LossLike":
    """Resolve a loss name (``logistic``, ``exponential``, ``correlation``) or a loss object."""
    if isinstance(loss, str):
        try:
            return LOSSES[loss]
        except KeyError:
            raise unknown_name("loss", loss, tuple(LOSSES)) from None
    if all(hasattr(loss, a) for a in ("value", "derivative", "assumptions")):
        return loss
    raise AttnSVMError(
        f"loss must be one of {tuple(LOSSES)} or an object with value(u), derivative(u) and "
        f"assumptions; got {type(loss).__name__}"
    )
