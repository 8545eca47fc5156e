"""Multi-token selection with a nonlinear head: GD, the selected sets, and the ``W_fin + R·W_dir`` prediction.

Model (Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898, Sec. on nonlinear heads):

    out_i = 1ᵀ ReLU(Vᵀ X_iᵀ s_i),   s_i = softmax(X_i W z_i),   V ∈ ℝ^{d×k} fixed (random),

risk ``L(W) = (1/n) Σ_i ℓ(Y_i out_i)``. With a nonlinear head the risk can be minimised by a
*mixture* of tokens, and GD then selects a set ``O_i = {t : s_it ≥ 1e-3}`` per sequence rather
than one token. The prediction of the theory for the GD iterate is ``W_fin + R·W_dir``:

    W_dir = argmin ||W||_F  s.t.  (x_it − x_iτ)ᵀ W z_i = 0   (t, τ ∈ O_i),
                                  (x_it − x_iτ)ᵀ W z_i ≥ 1   (t ∈ O_i, τ ∉ O_i);
    W_fin = argmin ||W||_F  s.t.  (x_it₂ − x_it₁)ᵀ W z_i = log(s_it₂ / s_it₁)   (t₁, t₂ ∈ O_i),

with ``s_i = softmax(X_i W_gd z_i)`` and ``R`` fitted to the iterate (least squares), compared with
the single-token ``W_mm(α)``, ``α_i = argmax_t s_it``. The normaliser cancels in the log-ratios,
``log(s_it₂ / s_it₁) = (x_it₂ − x_it₁)ᵀ W_gd z_i``, so ``W_fin`` is the orthogonal projection of
``W_gd`` onto the span of the equality rows. Equalities are imposed against one reference token
``t₁ = min O_i`` (the other pairs follow), and the inequalities only from ``t₁`` (equal logits
inside ``O_i`` make the others identical), so the rows handed to the certified min-norm solver
are not needlessly dependent.

Gradient. ReLU is positively homogeneous: with the mask ``m_i = 1[Vᵀ X_iᵀ s_i > 0]`` (``ReLU'(0)
= 0``), ``out_i = Σ_t s_it a_it`` with per-sequence token values ``a_it = x_itᵀ V m_i``, and
``∂out_i/∂W = Σ_t s_it (a_it − out_i) x_it z_iᵀ`` wherever no coordinate of ``Vᵀ X_iᵀ s_i`` is 0.
So the gradient is the core gradient with per-sequence values, which the core computes
unchanged on augmented data: ``x'_it = (x_it, a_it)``, ``z'_i = (z_i, 0)``, ``v' = e_d``,
``W' = [[W, 0], [0, 0]]`` (logits ``x_itᵀ W z_i``, values ``a_it``); ``∇L(W)`` is the top-left
``d×d`` block of the core gradient, and the log-domain direction is renormalised on that block.

Scale: logits, values, outputs and the gradient (core gradient on augmented, rescaled data) are formed
from power-of-two mantissas of ``X``, ``z``, ``V`` and ``W``, and each min-norm row of the prediction is a
mantissa with its own exponent (rows any number of binades apart are solved, never read as zero); answers
are put back exactly or refused by name when they are not normal doubles. The
right-hand sides of ``W_fin`` are those logit differences formed directly on the mantissas (never a
difference of log-softmax values, which cancels at small gaps), and a min-norm solution the
certified solver cannot certify is refused (:class:`~attnsvm.errors.SolverError`), never returned.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (nonlinear heads,
multi-token SVM equivalence); Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import as_real_array, check_int, check_positive
from ..errors import AttnSVMError, InfeasibleSVMError, InvalidInstanceError, NumericalError, SolverError
from ..gd import direction_corr
from ..model._attention import logits_of
from ..model._grad import GradDirection
from ..model._instance import Instance, require_unmasked
from ..model._losses import LossLike, get_loss
from ..scaling import pow2_exponent, range_error
from ..svm import CERTIFY_RTOL, KKTResiduals, MinNormSolution, solve_svm
from ..svm._dual import _min_norm_rows
from ._prompt import (
    ScaledCore,
    core_direction,
    core_grad,
    effective_weights,
    mantissa,
    norm2,
    put_back,
    put_back_scalar,
    record_steps,
    risk_value,
    row_mantissas,
    scaled_core,
    scaled_log_softmax,
    unresolved_support,
)

__all__ = [
    "SELECT_THRESHOLD",
    "random_head",
    "multitoken_output",
    "multitoken_risk",
    "multitoken_grad",
    "normalized_multitoken_grad",
    "MultiTokenRecord",
    "MultiTokenTrajectory",
    "run_multitoken_gd",
    "selected_sets",
    "MultiTokenPrediction",
    "predict_multitoken",
]


#: ``O_i = {t : s_it ≥ SELECT_THRESHOLD}`` (the threshold of the issue and of the paper's experiments).
SELECT_THRESHOLD = 1e-3


def random_head(d: int, k: int, *, seed: int | np.random.Generator = 0) -> FloatArray:
    """A random head ``V ∈ ℝ^{d×k}`` with i.i.d. ``N(0, 1/k)`` entries (``numpy.random.default_rng(seed)``)."""
    for name, val in (("d", d), ("k", k)):
        check_int(val, name, error=InvalidInstanceError)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.standard_normal((d, k)) / math.sqrt(k)


def _check_V(inst: Instance, V: ArrayLike) -> FloatArray:
    Va = as_real_array(V, "V", ndim=2)
    if Va.shape[0] != inst.d or Va.shape[1] < 1:
        raise InvalidInstanceError(f"V must have shape (d, k) = ({inst.d}, k ≥ 1); got {Va.shape}")
    return Va


# ==================================================================== array forms
_LN2 = math.log(2.0)


class MTData(NamedTuple):
    """Tokens ``x = 2^ex·Xs``, queries ``z = 2^ez·zs`` and head ``V = 2^eV·Vs`` as mantissas."""

    Xs: FloatArray
    ex: int
    zs: FloatArray
    ez: int
    Vs: FloatArray
    eV: int


def mt_data(X: FloatArray, z: FloatArray, V: FloatArray) -> MTData:
    """Power-of-two mantissas of ``X``, ``z``, ``V`` (exact)."""
    Xs, ex = mantissa(X)
    zs, ez = mantissa(z)
    Vs, eV = mantissa(V)
    return MTData(Xs, ex, zs, ez, Vs, eV)


def mt_log_attention(md: MTData, W: FloatArray) -> FloatArray:
    """``log s`` of logits ``x_itᵀ W z_i = 2^(ex+ez+ew)·(x'ᵀW'z')`` (never overflows)."""
    Ws, ew = mantissa(W)
    L, el = mantissa(logits_of(md.Xs, md.zs, Ws))  # |x'ᵀW'z'| ≤ d²: no overflow
    return scaled_log_softmax(L, md.ex + md.ez + ew + el)


def _values_of(md: MTData, log_s: FloatArray) -> tuple[FloatArray, FloatArray, int]:
    """Token values ``a_it = x_itᵀ V m_i`` and outputs ``out_i``, both as mantissas ``· 2^(ex+eV)``."""
    H = md.Xs @ md.Vs  # (n, T, k): x'ᵀV', |·| ≤ d
    u = np.einsum("nt,ntk->nk", np.exp(log_s), H)  # Vᵀ X_iᵀ s_i / 2^(ex+eV): same signs
    mask = (u > 0).astype(np.float64)  # ReLU'(0) = 0
    a = np.einsum("ntk,nk->nt", H, mask)
    return a, np.sum(np.maximum(u, 0.0), axis=1), md.ex + md.eV


def mt_core(md: MTData, Y: FloatArray, W: FloatArray, loss: Any) -> tuple[ScaledCore, FloatArray]:
    """The multi-token model at ``W`` as the rescaled core model (values frozen at ``W``) and ``W_eff``."""
    a, _, e = _values_of(md, mt_log_attention(md, W))
    sc = scaled_core(md.Xs, md.ex, md.zs, md.ez, a, e, Y, loss)
    return sc, effective_weights(sc, W, "W")


def multitoken_grad_of(md: MTData, Y: FloatArray, W: FloatArray, loss: Any) -> FloatArray:
    """Array form of :func:`multitoken_grad`."""
    sc, We = mt_core(md, Y, W, loss)
    return core_grad(sc, We, "the multi-token gradient ∇L(W)")


def normalized_multitoken_grad_of(md: MTData, Y: FloatArray, W: FloatArray, loss: Any) -> GradDirection:
    """Array form of :func:`normalized_multitoken_grad`."""
    sc, We = mt_core(md, Y, W, loss)
    try:
        return core_direction(sc, We)
    except NumericalError as exc:
        raise NumericalError(f"the multi-token gradient: {exc}") from exc


def multitoken_risk_of(md: MTData, Y: FloatArray, W: FloatArray, loss: Any) -> float:
    """Array form of :func:`multitoken_risk`."""
    _, out, e = _values_of(md, mt_log_attention(md, W))
    with np.errstate(over="ignore"):
        u = np.ldexp(Y * out, e)
    if not np.all(np.isfinite(u)):
        raise range_error("the multi-token outputs out_i", math.log(float(np.max(out))) + e * _LN2)
    return risk_value(loss, u, "the multi-token risk L(W)")


# ======================================================================== public
def multitoken_output(inst: Instance, W: ArrayLike, V: ArrayLike) -> FloatArray:
    """``out_i = 1ᵀ ReLU(Vᵀ X_iᵀ softmax(X_i W z_i))``, shape ``(n,)``.

    Scale: any finite data; to ``≲ (d+T)·eps·max_t Σ_k|x_itᵀV_k|`` absolute; raises
    :class:`NumericalError` when ``max out`` is not a normal double (an all-zero output is exact).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (nonlinear head).
    """
    require_unmasked(inst, "attnsvm.peers.multitoken_output")
    Wa, Va = inst.check_weights(W), _check_V(inst, V)
    md = mt_data(inst.X, inst.z, Va)
    _, out, e = _values_of(md, mt_log_attention(md, Wa))
    return put_back(out, e, "the multi-token outputs out_i")


def multitoken_risk(
    inst: Instance, W: ArrayLike, V: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> float:
    """``L(W) = (1/n) Σ_i ℓ(Y_i out_i)``.

    Scale: any finite data; to a few ulps relative; raises :class:`NumericalError` when ``out`` or
    the risk overflows, or a logistic/exponential risk is below 2.2e-308.
    """
    require_unmasked(inst, "attnsvm.peers.multitoken_risk")
    lo = get_loss(loss)
    md = mt_data(inst.X, inst.z, _check_V(inst, V))
    return multitoken_risk_of(md, inst.Y, inst.check_weights(W), lo)


def multitoken_grad(
    inst: Instance, W: ArrayLike, V: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> FloatArray:
    """``∇L(W) = (1/n) Σ_i ℓ'(Y_i out_i) Y_i Σ_t s_it (a_it − out_i) x_it z_iᵀ``, ``a_it = x_itᵀ V m_i``.

    ``m_i = 1[Vᵀ X_iᵀ s_i > 0]``; exact wherever no coordinate of ``Vᵀ X_iᵀ s_i`` is 0 (the
    convention ``ReLU'(0) = 0`` applies there). Cancellation-free (core gradient on augmented,
    power-of-two rescaled data: ``∇L = 2^(ex+ez+ea)`` times the rescaled one).

    Scale: any finite data with ``max|W|·max|x|·max|z|`` below 1.8e308; as ``risk_grad`` (the core gradient
    it is), normwise to ``≲ nT(d+T)·eps·Σ_it |w_it|·||x_it|| ||z_i||`` plus the values' rounding: ``nT(d+T)·eps``
    relative to ``||∇L||`` where the values do not cancel; raises :class:`NumericalError` when ``max|∇L|`` is not a normal double (use
    :func:`normalized_multitoken_grad`).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Returns:
      shape ``(d, d)``.
    """
    require_unmasked(inst, "attnsvm.peers.multitoken_grad")
    lo = get_loss(loss)
    md = mt_data(inst.X, inst.z, _check_V(inst, V))
    return multitoken_grad_of(md, inst.Y, inst.check_weights(W), lo)


def normalized_multitoken_grad(
    inst: Instance, W: ArrayLike, V: ArrayLike, *, loss: "str | LossLike" = "logistic"
) -> GradDirection:
    """Unit ``∇L/||∇L||_F`` (log-domain) and ``log||∇L||_F`` of the multi-token risk.

    Scale: any finite data with ``max|W|·max|x|·max|z|`` below 1.8e308; as ``normalized_risk_grad``, the
    direction to ``≲ (nT + T + d)·eps`` per entry where the values do not cancel; never over/underflows.
    """
    require_unmasked(inst, "attnsvm.peers.normalized_multitoken_grad")
    lo = get_loss(loss)
    md = mt_data(inst.X, inst.z, _check_V(inst, V))
    return normalized_multitoken_grad_of(md, inst.Y, inst.check_weights(W), lo)


class MultiTokenRecord(NamedTuple):
    """State at one recorded step: ``||W||_F``, risk, sizes ``|O_i|`` of the selected sets."""

    step: int
    norm: float
    risk: float
    set_sizes: NDArray[np.intp]


@dataclass
class MultiTokenTrajectory:
    """Result of :func:`run_multitoken_gd`: final ``W`` (shape ``(d, d)``) and the records."""

    W: FloatArray
    record: list[MultiTokenRecord] = field(default_factory=list)


def run_multitoken_gd(
    inst: Instance,
    V: ArrayLike,
    steps: int,
    lr: float,
    *,
    normalized: bool = False,
    loss: "str | LossLike" = "logistic",
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
) -> MultiTokenTrajectory:
    """GD ``W ← W − η∇L(W)`` (default, plain) or normalized GD on the multi-token risk.

    Plain GD is the default here: the finite part ``W_fin`` of the limit is a stationary point
    inside the selected sets, which normalized GD (fixed step length ``η``) keeps overshooting.

    Scale: any finite data; equivariant (``X → cX``, ``z → cz``, ``V → V/c`` with ``lr → lr/c⁴``
    (plain) or ``lr/c²`` (normalized) gives ``W_t/c²``); raises :class:`NumericalError` naming the
    step when a gradient (plain GD), ``W`` or a recorded risk is not a normal double.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Args:
      inst: the data.
      V: head, shape ``(d, k)``.
      steps, lr: updates (≥ 1) and step size (> 0).
      normalized: normalized or plain (default) GD.
      loss: loss name or object.
      W0: initial ``(d, d)`` matrix (default zeros).
      record_at: ``None`` (log-spaced), an interval, or a list of steps.

    Returns:
      :class:`MultiTokenTrajectory`.
    """
    require_unmasked(inst, "attnsvm.peers.run_multitoken_gd")
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    lo = get_loss(loss)
    Va = _check_V(inst, V)
    W = np.zeros((inst.d, inst.d)) if W0 is None else np.array(inst.check_weights(W0, "W0"))
    at = set(int(s) for s in record_steps(record_at, steps))
    Y = inst.Y
    md = mt_data(inst.X, inst.z, Va)
    rec: list[MultiTokenRecord] = []

    def record(t: int) -> None:
        s = np.exp(mt_log_attention(md, W))
        try:
            rec.append(
                MultiTokenRecord(
                    t,
                    norm2(W, "||W||_F"),
                    multitoken_risk_of(md, Y, W, lo),
                    np.sum(s >= SELECT_THRESHOLD, axis=1).astype(np.intp),
                )
            )
        except NumericalError as exc:
            raise NumericalError(f"multi-token GD, record at step {t}: {exc}") from exc

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        try:
            if normalized:
                g = normalized_multitoken_grad_of(md, Y, W, lo).direction
            else:
                g = multitoken_grad_of(md, Y, W, lo)
        except NumericalError as exc:
            raise NumericalError(
                f"{'normalized ' if normalized else ''}multi-token GD at step {t}: {exc}"
            ) from exc
        with np.errstate(over="ignore"):
            W = W - lr * g
        if not np.all(np.isfinite(W)):
            raise NumericalError(f"multi-token GD diverged at step {t}: W became non-finite; lower lr")
        if t in at:
            record(t)
    return MultiTokenTrajectory(W=W, record=rec)


def selected_sets(
    inst: Instance, W: ArrayLike, *, threshold: float = SELECT_THRESHOLD
) -> list[NDArray[np.intp]]:
    """``O_i = {t : s_it ≥ threshold}`` for each sequence (never empty: the top token has ``s ≥ 1/T``).

    Scale: any finite data, never over/underflows (logits from power-of-two mantissas; invariant
    under ``X → cX``, ``z → cz``, ``W → W/c²``).

    Args:
      inst, W: data and attention matrix ``(d, d)``.
      threshold: in ``(0, 1/T]``.

    Returns:
      A list of ``n`` sorted index arrays.
    """
    require_unmasked(inst, "attnsvm.peers.selected_sets")
    Wa = inst.check_weights(W)
    thr = float(threshold)
    if not (0 < thr <= 1.0 / inst.T):
        raise AttnSVMError(
            f"threshold must lie in (0, 1/T] = (0, {1.0 / inst.T:.3g}] so no set is empty; got {threshold!r}"
        )
    s = np.exp(mt_log_attention(mt_data(inst.X, inst.z, np.ones((1, 1))), Wa))
    return [np.flatnonzero(s[i] >= thr).astype(np.intp) for i in range(inst.n)]


@dataclass(frozen=True)
class MultiTokenPrediction:
    """The multi-token SVM prediction for a GD iterate ``W_gd``.

    Attributes:
      sets: the selected sets ``O_i``.
      W_dir: direction SVM solution, shape ``(d, d)`` (zero matrix when every ``O_i`` is all tokens).
      W_fin: finite part, shape ``(d, d)`` (zero when every ``|O_i| = 1``).
      R: fitted scale ``⟨W_gd − W_fin, W_dir⟩/||W_dir||²``.
      prediction: ``W_fin + R·W_dir``.
      rel_error: ``||W_gd − prediction||_F / ||W_gd||_F``.
      corr: ``corr(W_gd, prediction)``.
      W_mm: single-token Att-SVM for ``α = argmax s`` (``None`` if infeasible).
      single_rel_error: ``||W_gd − R'·W_mm|| / ||W_gd||`` with the best ``R'`` (NaN without ``W_mm``).
      single_corr: ``corr(W_gd, W_mm)`` (NaN without ``W_mm``).
      kkt_dir, kkt_fin: residuals of the two min-norm problems (``None`` when a problem is empty).
    """

    sets: list[NDArray[np.intp]]
    W_dir: FloatArray
    W_fin: FloatArray
    R: float
    prediction: FloatArray
    rel_error: float
    corr: float
    W_mm: FloatArray | None
    single_rel_error: float
    single_corr: float
    kkt_dir: KKTResiduals | None
    kkt_fin: KKTResiduals | None


def _rows(
    X: FloatArray, z: FloatArray, pairs: list[tuple[int, int, int]]
) -> tuple[FloatArray, NDArray[np.int64], NDArray[np.intp]]:
    """Rows ``a_r = z_i ⊗ (x_it − x_iτ) = 2^{R_r}·rows_r`` (column-major ``vec``: ``a_rᵀvec(W) = (x_it − x_iτ)ᵀ W
    z_i``) for triples ``(i, t, τ)``, each a mantissa (largest entry in ``[½, 1)``) with its own exponent ``R_r``,
    and the ``(i, τ)`` of each row.

    The two tokens of a row are scaled by one power of two (their difference cannot overflow) and ``z_i`` by its
    own, so a row of any size keeps its digits: one exponent shared by all rows squared those ~2^537 below the
    largest to 0 in the Gram matrix (a feasible problem read as infeasible). Entries below ``2^−1074`` of their
    row's largest flush (absolute error far below ``eps`` of the row).
    """
    d = X.shape[2]
    if not pairs:
        return np.zeros((0, d * d)), np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.intp)
    P = np.array(pairs, dtype=np.intp)
    xt, xu = X[P[:, 0], P[:, 1]], X[P[:, 0], P[:, 2]]
    e = np.frexp(np.maximum(np.max(np.abs(xt), axis=1), np.max(np.abs(xu), axis=1)))[1].astype(np.int64)
    with np.errstate(under="ignore"):
        delta = np.ldexp(xt, -e[:, None]) - np.ldexp(xu, -e[:, None])  # entries in (−2, 2)
        zs, ez = row_mantissas(z)
        rows, er = row_mantissas(np.einsum("rj,rk->rjk", zs[P[:, 0]], delta).reshape(len(P), -1))
    return rows, e + ez[P[:, 0]] + er, P[:, [0, 2]]


def _rel(A: FloatArray, B: FloatArray) -> float:
    """``||A − B||_F/||A||_F`` on power-of-two mantissas (no overflow in the squares)."""
    e = pow2_exponent(A)
    return float(np.linalg.norm(np.ldexp(A - B, -e))) / float(np.linalg.norm(np.ldexp(A, -e)))


#: At most this many rows of a Farkas certificate are spelled out in an infeasibility message (the rest counted).
_CERT_ROWS_SHOWN = 6


def _solve_rows(
    rows: FloatArray,
    R: NDArray[np.int64],
    b: FloatArray,
    eq: NDArray[np.bool_],
    trips: list[tuple[int, int, int]],
    what: str,
) -> tuple[MinNormSolution, int]:
    """``min ½||w||² s.t. (2^{R_r}·rows_r)ᵀw ≥ b_r`` (``= b_r`` on ``eq``) by the certified solver on per-row
    mantissas (:func:`attnsvm.svm._dual._min_norm_rows`: ``(sol, G)`` at the posed scale); an infeasible problem
    raises :class:`InfeasibleSVMError` explained in the multi-token model's terms (:func:`_explain_infeasible`)."""
    try:
        return _min_norm_rows(rows, R, b, eq)
    except InfeasibleSVMError as exc:
        raise InfeasibleSVMError(_explain_infeasible(exc, trips, eq, what)) from exc


def _explain_infeasible(
    exc: InfeasibleSVMError, trips: list[tuple[int, int, int]], eq: NDArray[np.bool_], what: str
) -> str:
    """The multi-token reading of the min-norm solver's Farkas certificate ``exc`` (its rows ``r``, triples
    ``(i, t, τ)`` of the rows ``z_i ⊗ (x_it − x_iτ)``): which equal-logit and margin constraints conflict.

    The direction SVM asks ``(x_it − x_it₁)ᵀ W z_i = 0`` for the selected tokens ``t ∈ O_i`` (equal logits) and
    ``(x_it₁ − x_iτ)ᵀ W z_i ≥ 1`` for the others ``τ ∉ O_i`` (a margin over them); it is infeasible e.g. when an
    unselected token's difference lies in the span of the selected ones' (a token equal to a selected one, or on
    the line through two of them: the equal logits force its logit to theirs). The finite part's equalities are met by ``W_gd`` itself, so
    its infeasibility is floating point: nearly dependent rows whose right-hand sides disagree at rounding level.
    """
    cert = getattr(exc, "rows", np.zeros(0, dtype=np.intp))
    items = []
    for r in (int(x) for x in cert[:_CERT_ROWS_SHOWN]):
        i, t, tau = trips[r]
        items.append(
            f"sequence {i}, tokens {t} and {tau} equal logits"
            if eq[r]
            else f"sequence {i}, selected token {t} over token {tau} by ≥ 1"
        )
    if len(cert) > _CERT_ROWS_SHOWN:
        items.append(f"and {len(cert) - _CERT_ROWS_SHOWN} more")
    which = f" The conflicting constraints (Farkas certificate): {'; '.join(items)}." if items else ""
    if what.startswith("direction"):
        return (
            f"the {what} is infeasible: no W gives the selected tokens O_i of each sequence equal logits "
            "((x_it − x_it₁)ᵀ W z_i = 0, t ∈ O_i) and a margin ≥ 1 over the other tokens "
            f"((x_it₁ − x_iτ)ᵀ W z_i ≥ 1, τ ∉ O_i).{which} An unselected token's difference x_it₁ − x_iτ lies in "
            "the span of the selected tokens' differences (e.g. a token equal to a selected one, or on the line "
            "through two of them), so equal logits of the selected tokens force its logit to theirs: W_gd's "
            "selected sets have no separating direction. Check the selection threshold or run GD longer so the "
            f"sets settle. ({exc})"
        )
    return (
        f"the {what} is infeasible in floating point: its equalities (x_it − x_it₁)ᵀ W z_i = "
        "(x_it − x_it₁)ᵀ W_gd z_i (t ∈ O_i) are met by W_gd itself, so its rows z_i ⊗ (x_it − x_it₁) are "
        f"numerically dependent and their right-hand sides disagree at rounding level.{which} Merge near-duplicate "
        f"tokens or rescale the features. ({exc})"
    )


def _certified(
    sol: MinNormSolution,
    what: str,
    unresolved: NDArray[np.intp] | None = None,
    pairs: NDArray[np.intp] | None = None,
    spread: int = 0,
) -> MinNormSolution:
    """``sol`` when the certified solver certified it; otherwise :class:`SolverError` naming the problem.

    An uncertified least-norm point (``error_bound = cond(K_S)·eps`` or a relative KKT residual above
    :data:`attnsvm.svm.CERTIFY_RTOL`) may be wrong in every digit, so it is never returned. Nor is one with an
    ``unresolved`` support row (:func:`attnsvm.peers._prompt.unresolved_support`: a row so much larger than the
    binding ones that its margin ``≥ 1`` reads ``≥ 0`` at working precision); ``pairs`` names it and ``spread``
    is the rows' spread in binades.
    """
    if unresolved is not None and unresolved.size and pairs is not None:
        i, tau = (int(x) for x in pairs[unresolved[0]])
        raise SolverError(
            f"the {what} could not be certified: its constraint rows z_i ⊗ (x_it − x_iτ) are about "
            f"{spread} binades apart in size, so the margin ≥ 1 of the row of sequence {i}, "
            f"token {tau} is below working precision relative to that row (unresolved: it may or may not bind). "
            "Bring the sequences' tokens and queries closer in size."
        )
    if not sol.certified:
        raise SolverError(
            f"the {what} could not be certified: its error bound cond(K_S)·eps is {sol.error_bound:.2g} and "
            f"its largest relative KKT residual {sol.kkt.max():.2g} (both must be ≤ {CERTIFY_RTOL:g}). Its "
            "constraint rows z_i ⊗ (x_it − x_iτ) are too close to linearly dependent for float64 (nearly "
            "parallel token differences); merge near-duplicate tokens or rescale the features."
        )
    return sol


def predict_multitoken(
    inst: Instance, W_gd: ArrayLike, *, threshold: float = SELECT_THRESHOLD
) -> MultiTokenPrediction:
    """Build ``W_dir`` and ``W_fin`` from the selected sets of ``W_gd`` and compare ``W_fin + R·W_dir`` with it.

    Both are min-norm problems with equality constraints, solved by the certified solver (rows
    ``a_r = z_i ⊗ (x_it − x_iτ)``, ``vec(W) = Σ_r λ_r a_r``); an uncertified solution is refused
    (:class:`SolverError`), never returned. The log-ratios of ``W_fin`` are the logit differences
    ``log(s_it/s_it₁) = (x_it − x_it₁)ᵀ W_gd z_i``, formed as ``a_rᵀ vec(W_gd)`` (never as a difference
    of log-softmax values, which cancels), so ``W_fin`` is the orthogonal projection of ``W_gd`` onto
    ``span{a_r}``: linear in ``W_gd`` at any size (``W_fin(c·W_gd) = c·W_fin(W_gd)``). The
    single-token baseline is :func:`attnsvm.svm.solve_svm` at ``α = argmax_t s_it``.

    Scale: any finite data (each row ``z_i ⊗ (x_it − x_iτ)`` a power-of-two mantissa with its own exponent, so
    rows any number of binades apart are solved, and ``W_gd`` as a mantissa; at fixed sets, ``X → 2^a X``,
    ``z → 2^b z``, ``W_gd → 2^c W_gd`` gives ``W_dir·2^−(a+b)``, ``W_fin·2^c``, ``R·2^(a+b+c)``, the same
    errors); ``W_fin`` to ``≲ (κ + √m·d²·√κ)·eps·||W_gd||_F``, ``W_dir`` to ``κ·eps`` relative, ``κ = cond(K_S)``
    (certified: ``κ·eps ≤ 1e-9`` and no support row unresolved at the rows' spread, else :class:`SolverError`);
    raises :class:`NumericalError` when a returned matrix's largest entry or a nonzero ``R`` is not a normal
    double.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (``W^fin``, ``W^dir``).

    Args:
      inst: the data.
      W_gd: the GD iterate, shape ``(d, d)``, nonzero.
      threshold: selection threshold (``O_i = {t : s_it ≥ threshold}``).

    Returns:
      :class:`MultiTokenPrediction`.

    Raises:
      InfeasibleSVMError: the direction SVM's constraints cannot all hold (Farkas certificate).
      SolverError: a min-norm solution could not be certified (nearly dependent rows).
      NumericalError: a returned matrix or ``R`` is outside float64's normal range.
    """
    require_unmasked(inst, "attnsvm.peers.predict_multitoken")
    Wg = inst.check_weights(W_gd, "W_gd")
    if not np.any(Wg != 0):
        raise AttnSVMError("W_gd is the zero matrix; there is nothing to predict (run GD first)")
    sets = selected_sets(inst, Wg, threshold=threshold)
    md = mt_data(inst.X, inst.z, np.ones((1, 1)))
    d = inst.d
    # Scale: each row is a_r = 2^{R_r}·rows_r (its own exponent: rows any number of binades apart) and
    # W_gd = 2^ew·Ws (max|Ws| ∈ [½, 1)). The direction SVM is posed on the rows with their exponents and
    # returns W_dir = 2^G·wd; the finite part's equalities a_rᵀvec(W) = a_rᵀvec(W_gd) divided by 2^{R_r+ew}
    # are rows_rᵀvec(W') = rows_rᵀvec(Ws) (each row's scale cancels: the exponents are all 0 there), so its
    # solution is wf = 2^−ew·W_fin. Nothing of the logits' size 2^(R_r+ew) is ever formed.
    E = md.ex + md.ez  # the single-token baseline's shared scale
    Ws, ew = mantissa(Wg)
    eq_trip: list[tuple[int, int, int]] = []
    ineq_trip: list[tuple[int, int, int]] = []
    for i, O in enumerate(sets):
        t1 = int(O[0])
        eq_trip.extend((i, int(t), t1) for t in O[1:])
        ineq_trip.extend((i, t1, int(tau)) for tau in np.setdiff1d(np.arange(inst.T), O))
    rows_eq, R_eq, pairs_eq = _rows(inst.X, inst.z, eq_trip)
    rows_in, R_in, pairs_in = _rows(inst.X, inst.z, ineq_trip)
    wd = np.zeros((d, d))  # W_dir = 2^G·wd
    G = 0
    kkt_dir = None
    if ineq_trip:
        rows, R_all = np.concatenate([rows_eq, rows_in]), np.concatenate([R_eq, R_in])
        pairs = np.concatenate([pairs_eq, pairs_in])
        b = np.concatenate([np.zeros(len(rows_eq)), np.ones(len(rows_in))])
        eq = np.concatenate([np.ones(len(rows_eq), dtype=bool), np.zeros(len(rows_in), dtype=bool)])
        what = "direction SVM W_dir"
        sol, G = _solve_rows(rows, R_all, b, eq, eq_trip + ineq_trip, what)
        live = R_all[np.any(rows != 0.0, axis=1)]
        spread = int(np.max(live) - np.min(live)) if live.size else 0
        _certified(sol, what, unresolved_support(rows, R_all, b, sol, G), pairs, spread)
        # (type: numpy's stubs for a --python-version 3.10 check type reshape to a 0-d array here.)
        wd = sol.coords.reshape((d, d), order="F")  # type: ignore[assignment]  # the primal point itself
        kkt_dir = sol.kkt
    wf = np.zeros((d, d))
    kkt_fin = None
    if eq_trip:
        # log(s_it/s_it₁) = (x_it − x_it₁)ᵀ W_gd z_i exactly (the softmax normaliser cancels). Stable form:
        # the right-hand sides are these logit differences formed directly, rowsᵀvec(Ws) on O(1) mantissas
        # (error ≤ d²·eps·||row||·||Ws||), not log s_it − log s_it₁, whose relative error eps/|gap| made
        # W_fin wrong at small gaps (0 below ~1e-17) and the system falsely infeasible.
        bf = rows_eq @ Ws.reshape(-1, order="F")
        what = "finite part W_fin"
        solf, Gf = _solve_rows(
            rows_eq, np.zeros(len(bf), dtype=np.int64), bf, np.ones(len(bf), dtype=bool), eq_trip, what
        )
        _certified(solf, what)
        with np.errstate(under="ignore"):  # the projection of Ws (||wf|| ≤ ||Ws||_F ≤ d): never overflows
            wf = np.ldexp(solf.coords, Gf).reshape((d, d), order="F")  # type: ignore[assignment]  # (as wd)
        kkt_fin = solf.kkt
    # R = ⟨W_gd − W_fin, W_dir⟩/||W_dir||² with W_dir = 2^(G+k)·wm (wm the mantissa of wd): R = 2^(ew−G−k)·r,
    # r = ⟨Ws − wf, wm⟩/||wm||², and R·W_dir = 2^ew·r·wm, so the prediction is 2^ew·(wf + r·wm) (no
    # logit-level quantity is formed; only R itself carries the logits' scale).
    wm, k = mantissa(wd)
    nd = float(np.sum(wm * wm))
    r = float(np.sum((Ws - wf) * wm)) / nd if nd > 0 else 0.0
    Pm = wf + r * wm  # 2^−ew · prediction
    W_dir = put_back(wd, G, "the direction SVM solution W_dir")
    W_fin = put_back(wf, ew, "the finite part W_fin")
    R = put_back_scalar(r, ew - G - k, "the fitted scale R of the prediction W_fin + R·W_dir")
    pred = put_back(Pm, ew, "the prediction W_fin + R·W_dir")
    alpha = np.argmax(mt_log_attention(md, Wg), axis=1)
    W_mm: FloatArray | None
    try:
        vs, _ = mantissa(inst.v)
        Wm = solve_svm(Instance(md.Xs, inst.Y, vs, md.zs), alpha=alpha).W  # = 2^E·W_mm
    except AttnSVMError:
        Wm = None
    W_mm = None if Wm is None else put_back(Wm, -E, "the single-token Att-SVM solution W_mm")
    if Wm is not None:
        Mm, _ = mantissa(Wm)  # the best-scale fit and the correlation are invariant under scaling either side
        Rs = float(np.sum(Ws * Mm)) / float(np.sum(Mm * Mm))
        s_err = _rel(Ws, Rs * Mm)
        s_corr = direction_corr(Ws, Mm)
    else:
        s_err = s_corr = math.nan
    return MultiTokenPrediction(
        sets=sets,
        W_dir=W_dir,
        W_fin=W_fin,
        R=R,
        prediction=pred,
        rel_error=_rel(Ws, Pm),
        corr=direction_corr(Ws, Pm) if np.any(Pm != 0) else math.nan,
        W_mm=W_mm,
        single_rel_error=s_err,
        single_corr=s_corr,
        kkt_dir=kkt_dir,
        kkt_fin=kkt_fin,
    )
