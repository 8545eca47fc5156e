"""Regularization paths: warm-started projected normalized GD onto ``||W||_F ≤ R``.

``W_R = argmin_{||W||_F ≤ R} L(W)``; as ``R → ∞`` its direction approaches the Att-SVM solution
(Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import as_real_array, check_instance, check_int, check_positive
from ..errors import AttnSVMError
from ..model._attention import logits_of
from ..model._grad import (
    GradDirection,
    risk_of,
)
from ..model._instance import Instance
from ..model._losses import LossLike, get_loss
from ..scaling import (
    FLOAT_TINY,
    range_error,
)
from ._metrics import _fro, direction_corr, direction_gap
from ._scaled import _check_iterate, _check_reference, _rescale, _to_logit_scale
from ._single import _direction, _initial_W


# ================================================================ regularization path
class PathPoint(NamedTuple):
    """One point of a regularization path.

    Attributes:
      radius: ``R``.
      W: the stationary point found, ``||W||_F ≤ R``, shape ``(d, d)``.
      norm: ``||W||_F``.
      risk: ``L(W)``.
      tokens: selected tokens, shape ``(n,)``.
      corr, gap: ``corr(W/R, reference)`` and ``½||Ŵ − R̂||²`` (NaN without a reference).
      kkt_residual: ``||∇L/||∇L|| + W/||W|| ||_F`` when ``W`` is on the sphere (0 at a KKT point
        ``∇L = −μW``, ``μ ≥ 0``); ``nan`` if ``W`` is inside the ball (then the residual is the
        gradient itself, see ``log10_grad_norm``).
      log10_grad_norm: ``log10||∇L(W)||_F``.
      iterations: projected steps taken at this radius.
    """

    radius: float
    W: FloatArray
    norm: float
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    gap: float
    kkt_residual: float
    log10_grad_norm: float
    iterations: int


@dataclass
class RegularizationPath:
    """Result of :func:`regularization_path`: one :class:`PathPoint` per radius."""

    points: list[PathPoint] = field(default_factory=list)

    @property
    def radii(self) -> FloatArray:
        """Radii, shape ``(k,)``."""
        return np.array([p.radius for p in self.points])

    @property
    def corrs(self) -> FloatArray:
        """``corr(W_R/R, reference)``, shape ``(k,)``."""
        return np.array([p.corr for p in self.points])

    @property
    def gaps(self) -> FloatArray:
        """``½||Ŵ_R − R̂||²``, shape ``(k,)``."""
        return np.array([p.gap for p in self.points])

    @property
    def kkt_residuals(self) -> FloatArray:
        """KKT residuals, shape ``(k,)``."""
        return np.array([p.kkt_residual for p in self.points])


#: Relative change of the risk below which it counts as flat (4 ulps: the risk is a mean of
#: O(1) terms, each exact to ~1 ulp, so smaller changes are not resolved in float64).
_FLAT_RTOL = 4 * float(np.finfo(np.float64).eps)


def _project(W: FloatArray, R: float) -> FloatArray:
    nrm = _fro(W)  # scaled: ||W|| of entries ~1e±200 neither overflows nor underflows
    return W * (R / nrm) if nrm > R else W


class PathStep(NamedTuple):
    """One radius of :func:`projected_path`: the point, its risk, KKT residual (``inf`` inside the
    ball), its normalized gradient direction and the projected steps taken."""

    radius: float
    x: FloatArray
    risk: float
    residual: float
    grad: GradDirection
    iterations: int


def projected_path(
    x0: FloatArray,
    radii: FloatArray,
    risk: Callable[[FloatArray], float],
    direction: Callable[[FloatArray], GradDirection],
    max_steps: int,
    lr: float,
    tol: float,
) -> list[PathStep]:
    """Warm-started projected normalized GD ``x ← Π_R(x − η ∇L/||∇L||)`` over increasing radii.

    The shared engine of :func:`regularization_path` (``x = W``) and of the prompt-attention path
    (``x = p``). Each radius starts from the previous point rescaled onto the new sphere, with
    ``η = lr · R``; a step is kept when it lowers the risk (and does not multiply the KKT residual
    ``||∇L/||∇L|| + x/R||`` by more than 10; a step into the ball, where that residual is not
    defined, is judged on the risk alone) or, once the risk change is below float64 resolution
    (at large ``R`` it is ~``e^{−R·margin}``), when it lowers the residual; then
    ``η ← min(1.25η, lr·R)``, otherwise ``η ← η/2``. A radius stops at ``tol``, ``max_steps`` or
    ``η ≤ 1e-15·R``. (Keeping steps on the residual alone, with the first step of each radius
    accepted unchecked from inside the ball, could jump basins between radii and stall at
    residuals 1e-3..0.4.)
    """

    def residual(xc: FloatArray, R: float, dc: FloatArray) -> float:
        nrm = _fro(xc)
        if nrm < R * (1 - 1e-12) or nrm == 0:
            return math.inf  # interior, non-stationary (∇L ≠ 0): keep moving
        return float(np.linalg.norm(dc + xc / nrm))

    x = x0
    out: list[PathStep] = []
    for R in (float(r) for r in radii):
        nrm0 = _fro(x)
        # Warm start *on the new sphere* (the previous point rescaled): the constrained minimiser
        # lies on the sphere (∇L ≠ 0), and a start inside the ball has an infinite residual, so
        # its first step would be accepted unchecked and could jump to another basin.
        x = x * (R / nrm0) if nrm0 > 0 else x
        gd = direction(x)
        res = residual(x, R, gd.direction)
        rsk = risk(x)
        eta = lr * R
        it = 0
        while it < max_steps and res > tol and eta > 1e-15 * R:
            it += 1
            xn = _project(x - eta * gd.direction, R)
            rk = risk(xn)
            gn = direction(xn)
            rn = residual(xn, R, gn.direction)
            # Accept a descent step on the risk (unless it multiplies the residual by > 10); once
            # the risk change is below float64 resolution (it is ~e^{−R·margin} at large R),
            # accept a step that lowers the KKT residual. Inside the ball (residual ∞: from 0,
            # or where the risk decreases inward, e.g. gaussian seed 1 at R = 8-16) only the risk
            # decides.
            flat = abs(rk - rsk) <= _FLAT_RTOL * abs(rsk)
            if (rk < rsk and (rn < 10 * res or math.isinf(res) or math.isinf(rn))) or (flat and rn < res):
                x, gd, res, rsk = xn, gn, rn, rk
                eta = min(eta * 1.25, lr * R)
            else:
                eta *= 0.5
        out.append(PathStep(R, np.array(x), rsk, res, gd, it))
    return out


def regularization_path(
    inst: Instance,
    radii: ArrayLike,
    *,
    loss: "str | LossLike" = "logistic",
    reference: ArrayLike | None = None,
    max_steps: int = 2000,
    lr: float = 0.1,
    tol: float = 1e-10,
    W0: ArrayLike | None = None,
) -> RegularizationPath:
    """Approximate ``W_R = argmin_{||W||_F ≤ R} L(W)`` for increasing ``R`` (warm-started).

    Projected normalized GD ``W ← Π_R(W − η ∇L/||∇L||)`` with an adaptive step, warm-started on
    each new sphere (:func:`projected_path` gives the acceptance rule). The direction is the
    log-domain one, so large ``R`` still works.

    The risk is not convex in ``W``: what this finds is a path of *stationary points* of the
    constrained problems (KKT residual reported per point), not certified global minimisers.
    Tarzanagh et al. show ``W_R/R → W_mm/||W_mm||`` along the global path; the harness reports
    ``corr(W_R/R, reference)`` to test it.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (regularization path);
    Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

    Args:
      inst: the data.
      radii: increasing positive finite radii, shape ``(k,)``.
      loss: loss name or object.
      reference: ``(d, d)`` reference direction.
      max_steps: projected steps per radius, ≥ 1.
      lr: initial step as a fraction of ``R``, > 0.
      tol: KKT residual at which a radius is done.
      W0: start for the first radius (default zeros; a nonzero ``W0`` is rescaled onto the first
        sphere, like every warm start).

    Returns:
      :class:`RegularizationPath`.

    Scale: as :func:`run_gd`: radii ``R·2^−(a+b)`` on ``X·2^a``, ``z·2^b``, ``v·2^−a`` give exactly
    ``W_R·2^−(a+b)``; the largest radius must keep the logits below ``1.8e308/(4d²)`` and the
    smallest must be a normal double (else :class:`~attnsvm.NumericalError`, before any work).

    Token masks (:attr:`Instance.mask`): supported, as in :func:`run_gd`.
    """
    inst = check_instance(inst)
    R_all = as_real_array(radii, "radii", ndim=1)
    if R_all.size == 0 or np.any(R_all <= 0) or np.any(np.diff(R_all) <= 0):
        raise AttnSVMError("radii must be a non-empty, strictly increasing list of positive radii")
    max_steps = check_int(max_steps, "max_steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    try:
        tol = float(tol)
    except (TypeError, ValueError):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}") from None
    if not (math.isfinite(tol) and tol >= 0):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}")
    lo = get_loss(loss)
    ref = _check_reference(inst, reference)
    W = _check_iterate(_initial_W(inst, W0), "W0")
    sc = _rescale(inst, shift=True)  # needs x'ᵀW'z' = xᵀWz and the values only, as run_gd
    # The path stays in the user's scale (radii, W); risk and direction come from the rescaled
    # data at W' = W·2^k (see _Scaled), so neither overflows nor underflows with the data's scale.
    # The largest radius must keep the logits finite: checked before any work.
    _to_logit_scale(sc, np.full((1, 1), float(R_all[-1])), "W (||W||_F = the largest radius)")
    if float(R_all[0]) < FLOAT_TINY:
        raise range_error(
            "the smallest radius", math.log(float(R_all[0])), remedy="Radii must be normal doubles"
        )
    steps = projected_path(
        W,
        R_all,
        lambda Wc: risk_of(sc.X, sc.Y, sc.z, sc.v, _to_logit_scale(sc, Wc), lo, **sc.mask_kw),
        lambda Wc: _direction(sc, Wc, lo),
        max_steps,
        lr,
        tol,
    )
    path = RegularizationPath()
    for st in steps:
        # A point whose largest entry is below the normal range has lost digits (the path runs in the
        # user's scale): refused like any iterate, not returned rounded.
        W = st.x
        top = float(np.max(np.abs(W), initial=0.0))
        if 0.0 < top < FLOAT_TINY:
            raise range_error(
                f"the path point W at radius {st.radius:.3g} (its largest entry)",
                math.log(top),
                remedy="Scale the radii with the data: X·2^a, z·2^b is the same path at radii·2^−(a+b)",
            )
        nrm = _fro(W)
        on_sphere = nrm >= st.radius * (1 - 1e-12)
        path.points.append(
            PathPoint(
                radius=st.radius,
                W=W,
                norm=nrm,
                risk=st.risk,
                tokens=np.argmax(logits_of(sc.X, sc.z, _to_logit_scale(sc, W), **sc.mask_kw), axis=1).astype(
                    np.intp
                ),
                corr=direction_corr(W, ref) if ref is not None else math.nan,
                gap=direction_gap(W, ref) if ref is not None else math.nan,
                kkt_residual=st.residual if on_sphere else math.nan,
                log10_grad_norm=st.grad.log_norm / math.log(10.0),
                iterations=st.iterations,
            )
        )
    return path
