"""Multi-token selection with a nonlinear head: GD, the selected sets, and the ``W_fin + R·W_dir`` prediction.

Model (Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898, Sec. on nonlinear heads):

    out_i = 1ᵀ ReLU(Vᵀ X_iᵀ s_i),   s_i = softmax(X_i W z_i),   V ∈ ℝ^{d×k} fixed (random),

risk ``L(W) = (1/n) Σ_i ℓ(Y_i out_i)``. With a nonlinear head the risk can be minimised by a
*mixture* of tokens, and GD then selects a set ``O_i = {t : s_it ≥ 1e-3}`` per sequence rather
than one token. The prediction of the theory for the GD iterate is ``W_fin + R·W_dir``:

    W_dir = argmin ||W||_F  s.t.  (x_it − x_iτ)ᵀ W z_i = 0   (t, τ ∈ O_i),
                                  (x_it − x_iτ)ᵀ W z_i ≥ 1   (t ∈ O_i, τ ∉ O_i);
    W_fin = argmin ||W||_F  s.t.  (x_it₂ − x_it₁)ᵀ W z_i = log(s_it₂ / s_it₁)   (t₁, t₂ ∈ O_i),

with ``R`` fitted to the iterate (least squares), compared with the single-token ``W_mm(α)``,
``α_i = argmax_t s_it``. Equalities are imposed against one reference token ``t₁ = min O_i``
(the other pairs follow), and the inequalities only from ``t₁`` (equal logits inside ``O_i``
make the others identical), so the rows handed to the certified min-norm solver are not
needlessly dependent.

Gradient. ReLU is positively homogeneous: with the mask ``m_i = 1[Vᵀ X_iᵀ s_i > 0]`` (``ReLU'(0)
= 0``), ``out_i = Σ_t s_it a_it`` with per-sequence token values ``a_it = x_itᵀ V m_i``, and
``∂out_i/∂W = Σ_t s_it (a_it − out_i) x_it z_iᵀ`` wherever no coordinate of ``Vᵀ X_iᵀ s_i`` is 0.
So the gradient is the core gradient with per-sequence values, which the core computes
unchanged on augmented data: ``x'_it = (x_it, a_it)``, ``z'_i = (z_i, 0)``, ``v' = e_d``,
``W' = [[W, 0], [0, 0]]`` (logits ``x_itᵀ W z_i``, values ``a_it``); ``∇L(W)`` is the top-left
``d×d`` block of the core gradient, and the log-domain direction is renormalised on that block.

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

from .attention import log_softmax, logits_of
from .errors import AttnSVMError, InvalidInstanceError, NumericalError
from .gd import direction_corr
from .grad import GradDirection, normalized_risk_grad_of, risk_grad_of
from .instance import Instance, as_real_array
from .losses import LossLike, get_loss
from .prompt import check_lr, check_steps, record_steps, solve_min_norm_or_raise
from .svm import KKTResiduals, solve_svm

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

FloatArray = NDArray[np.float64]

#: ``O_i = {t : s_it ≥ SELECT_THRESHOLD}`` (the threshold of the issue and of the paper's experiments).
SELECT_THRESHOLD = 1e-3


def random_head(d: int, k: int, seed: int | np.random.Generator = 0) -> FloatArray:
    """A random head ``V ∈ ℝ^{d×k}`` with i.i.d. ``N(0, 1/k)`` entries (``numpy.random.default_rng(seed)``)."""
    for name, val in (("d", d), ("k", k)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise InvalidInstanceError(f"{name} must be an integer ≥ 1; got {val!r}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.standard_normal((d, k)) / math.sqrt(k)


def _check_V(inst: Instance, V: ArrayLike) -> FloatArray:
    Va = as_real_array(V, "V", ndim=2)
    if Va.shape[0] != inst.d or Va.shape[1] < 1:
        raise InvalidInstanceError(f"V must have shape (d, k) = ({inst.d}, k ≥ 1); got {Va.shape}")
    return Va


# ==================================================================== array forms
def _values_of(X: FloatArray, V: FloatArray, log_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per-sequence token values ``a_it = x_itᵀ V m_i`` and outputs ``out_i``."""
    H = X @ V  # (n, T, k)
    u = np.einsum("nt,ntk->nk", np.exp(log_s), H)  # Vᵀ X_iᵀ s_i
    mask = (u > 0).astype(np.float64)  # ReLU'(0) = 0
    a = np.einsum("ntk,nk->nt", H, mask)
    return a, np.sum(np.maximum(u, 0.0), axis=1)


def _augment(X: FloatArray, z: FloatArray, a: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    n, T, d = X.shape
    Xa = np.concatenate([X, a[:, :, None]], axis=2)
    za = np.concatenate([z, np.zeros((n, 1))], axis=1)
    va = np.zeros(d + 1)
    va[d] = 1.0
    return Xa, za, va


def _embed(W: FloatArray) -> FloatArray:
    d = W.shape[0]
    Wa = np.zeros((d + 1, d + 1))
    Wa[:d, :d] = W
    return Wa


def multitoken_grad_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, V: FloatArray, W: FloatArray, loss: Any
) -> FloatArray:
    """Array form of :func:`multitoken_grad`."""
    a, _ = _values_of(X, V, log_softmax(logits_of(X, z, W)))
    Xa, za, va = _augment(X, z, a)
    return np.array(risk_grad_of(Xa, Y, za, va, _embed(W), loss)[: X.shape[2], : X.shape[2]])


def normalized_multitoken_grad_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, V: FloatArray, W: FloatArray, loss: Any
) -> GradDirection:
    """Array form of :func:`normalized_multitoken_grad`."""
    d = X.shape[2]
    a, _ = _values_of(X, V, log_softmax(logits_of(X, z, W)))
    Xa, za, va = _augment(X, z, a)
    G = normalized_risk_grad_of(Xa, Y, za, va, _embed(W), loss)
    B = G.direction[:d, :d]
    m = float(np.max(np.abs(B)))
    if not m > 0:
        raise NumericalError("the multi-token gradient is exactly zero at this W; the direction is undefined")
    Bs = B / m  # scaled before the norm (no under/overflow)
    nrm = float(np.sqrt(np.sum(Bs * Bs)))
    return GradDirection(Bs / nrm, G.log_norm + math.log(m) + math.log(nrm))


def multitoken_risk_of(
    X: FloatArray, Y: FloatArray, z: FloatArray, V: FloatArray, W: FloatArray, loss: Any
) -> float:
    """Array form of :func:`multitoken_risk`."""
    _, out = _values_of(X, V, log_softmax(logits_of(X, z, W)))
    r = float(np.mean(loss.value(Y * out)))
    if not math.isfinite(r):
        raise NumericalError("the multi-token risk is not finite; rescale the data or use the logistic loss")
    return r


# ======================================================================== public
def multitoken_output(inst: Instance, W: ArrayLike, V: ArrayLike) -> FloatArray:
    """``out_i = 1ᵀ ReLU(Vᵀ X_iᵀ softmax(X_i W z_i))``, shape ``(n,)``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (nonlinear head).
    """
    Wa, Va = inst.check_weights(W), _check_V(inst, V)
    return _values_of(inst.X, Va, log_softmax(logits_of(inst.X, inst.z, Wa)))[1]


def multitoken_risk(inst: Instance, W: ArrayLike, V: ArrayLike, loss: "str | LossLike" = "logistic") -> float:
    """``L(W) = (1/n) Σ_i ℓ(Y_i out_i)``."""
    lo = get_loss(loss)
    return multitoken_risk_of(inst.X, inst.Y, inst.z, _check_V(inst, V), inst.check_weights(W), lo)


def multitoken_grad(
    inst: Instance, W: ArrayLike, V: ArrayLike, loss: "str | LossLike" = "logistic"
) -> FloatArray:
    """``∇L(W) = (1/n) Σ_i ℓ'(Y_i out_i) Y_i Σ_t s_it (a_it − out_i) x_it z_iᵀ``, ``a_it = x_itᵀ V m_i``.

    ``m_i = 1[Vᵀ X_iᵀ s_i > 0]``; exact wherever no coordinate of ``Vᵀ X_iᵀ s_i`` is 0 (the
    convention ``ReLU'(0) = 0`` applies there). Cancellation-free (core gradient on augmented data).

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Returns:
      shape ``(d, d)``.
    """
    lo = get_loss(loss)
    return multitoken_grad_of(inst.X, inst.Y, inst.z, _check_V(inst, V), inst.check_weights(W), lo)


def normalized_multitoken_grad(
    inst: Instance, W: ArrayLike, V: ArrayLike, loss: "str | LossLike" = "logistic"
) -> GradDirection:
    """Unit ``∇L/||∇L||_F`` (log-domain) and ``log||∇L||_F`` of the multi-token risk."""
    lo = get_loss(loss)
    return normalized_multitoken_grad_of(inst.X, inst.Y, inst.z, _check_V(inst, V), inst.check_weights(W), lo)


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
    normalized: bool = False,
    loss: "str | LossLike" = "logistic",
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
) -> MultiTokenTrajectory:
    """GD ``W ← W − η∇L(W)`` (default, plain) or normalized GD on the multi-token risk.

    Plain GD is the default here: the finite part ``W_fin`` of the limit is a stationary point
    inside the selected sets, which normalized GD (fixed step length ``η``) keeps overshooting.

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
    steps = check_steps(steps)
    lr = check_lr(lr)
    lo = get_loss(loss)
    Va = _check_V(inst, V)
    W = np.zeros((inst.d, inst.d)) if W0 is None else np.array(inst.check_weights(W0, "W0"))
    at = set(int(s) for s in record_steps(record_at, steps))
    X, Y, z = inst.X, inst.Y, inst.z
    rec: list[MultiTokenRecord] = []

    def record(t: int) -> None:
        s = np.exp(log_softmax(logits_of(X, z, W)))
        rec.append(
            MultiTokenRecord(
                t,
                float(np.linalg.norm(W)),
                multitoken_risk_of(X, Y, z, Va, W, lo),
                np.sum(s >= SELECT_THRESHOLD, axis=1).astype(np.intp),
            )
        )

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        if normalized:
            try:
                g = normalized_multitoken_grad_of(X, Y, z, Va, W, lo).direction
            except NumericalError as exc:
                raise NumericalError(f"normalized multi-token GD at step {t}: {exc}") from exc
        else:
            g = multitoken_grad_of(X, Y, z, Va, W, lo)
        W = W - lr * g
        if not np.all(np.isfinite(W)):
            raise NumericalError(f"multi-token GD diverged at step {t}: W became non-finite; lower lr")
        if t in at:
            record(t)
    return MultiTokenTrajectory(W=W, record=rec)


def selected_sets(
    inst: Instance, W: ArrayLike, threshold: float = SELECT_THRESHOLD
) -> list[NDArray[np.intp]]:
    """``O_i = {t : s_it ≥ threshold}`` for each sequence (never empty: the top token has ``s ≥ 1/T``).

    Args:
      inst, W: data and attention matrix ``(d, d)``.
      threshold: in ``(0, 1/T]``.

    Returns:
      A list of ``n`` sorted index arrays.
    """
    Wa = inst.check_weights(W)
    thr = float(threshold)
    if not (0 < thr <= 1.0 / inst.T):
        raise AttnSVMError(
            f"threshold must lie in (0, 1/T] = (0, {1.0 / inst.T:.3g}] so no set is empty; got {threshold!r}"
        )
    s = np.exp(log_softmax(logits_of(inst.X, inst.z, Wa)))
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


def _rows(inst: Instance, pairs: list[tuple[int, int, int]]) -> tuple[FloatArray, NDArray[np.intp]]:
    """Rows ``z_i ⊗ (x_it − x_iτ)`` (column-major ``vec``) for triples ``(i, t, τ)``."""
    if not pairs:
        return np.zeros((0, inst.d * inst.d)), np.zeros((0, 2), dtype=np.intp)
    P = np.array(pairs, dtype=np.intp)
    delta = inst.X[P[:, 0], P[:, 1]] - inst.X[P[:, 0], P[:, 2]]
    rows = np.einsum("rj,rk->rjk", inst.z[P[:, 0]], delta).reshape(len(P), -1)
    return rows, P[:, [0, 2]]


def predict_multitoken(
    inst: Instance, W_gd: ArrayLike, threshold: float = SELECT_THRESHOLD
) -> MultiTokenPrediction:
    """Build ``W_dir`` and ``W_fin`` from the selected sets of ``W_gd`` and compare ``W_fin + R·W_dir`` with it.

    Both are min-norm problems with equality constraints, solved exactly by the certified solver
    (rows ``z_i ⊗ (x_it − x_iτ)``, so ``vec(W) = rowsᵀλ``). The log-ratios of ``W_fin`` come
    from the log-softmax of ``W_gd`` (exact however small the weights). The single-token
    baseline is :func:`attnsvm.svm.solve_svm` at ``α = argmax_t s_it``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (``W^fin``, ``W^dir``).

    Args:
      inst: the data.
      W_gd: the GD iterate, shape ``(d, d)``, nonzero.
      threshold: selection threshold (``O_i = {t : s_it ≥ threshold}``).

    Returns:
      :class:`MultiTokenPrediction`.
    """
    Wg = inst.check_weights(W_gd, "W_gd")
    if not np.any(Wg != 0):
        raise AttnSVMError("W_gd is the zero matrix; there is nothing to predict (run GD first)")
    sets = selected_sets(inst, Wg, threshold)
    log_s = log_softmax(logits_of(inst.X, inst.z, Wg))
    d = inst.d
    eq_trip: list[tuple[int, int, int]] = []
    ineq_trip: list[tuple[int, int, int]] = []
    fin_b: list[float] = []
    for i, O in enumerate(sets):
        t1 = int(O[0])
        for t in O[1:]:
            eq_trip.append((i, int(t), t1))
            fin_b.append(float(log_s[i, t] - log_s[i, t1]))
        for tau in np.setdiff1d(np.arange(inst.T), O):
            ineq_trip.append((i, t1, int(tau)))
    rows_eq, pairs_eq = _rows(inst, eq_trip)
    rows_in, pairs_in = _rows(inst, ineq_trip)
    W_dir = np.zeros((d, d))
    kkt_dir = None
    if ineq_trip:
        rows = np.concatenate([rows_eq, rows_in])
        b = np.concatenate([np.zeros(len(rows_eq)), np.ones(len(rows_in))])
        eq = np.concatenate([np.ones(len(rows_eq), dtype=bool), np.zeros(len(rows_in), dtype=bool)])
        sol = solve_min_norm_or_raise(
            rows, b, eq, np.concatenate([pairs_eq, pairs_in]), "direction SVM W_dir"
        )
        W_dir = (rows.T @ sol.multipliers).reshape((d, d), order="F")
        kkt_dir = sol.kkt
    W_fin = np.zeros((d, d))
    kkt_fin = None
    if eq_trip:
        bf = np.array(fin_b)
        solf = solve_min_norm_or_raise(
            rows_eq, bf, np.ones(len(bf), dtype=bool), pairs_eq, "finite part W_fin"
        )
        W_fin = (rows_eq.T @ solf.multipliers).reshape((d, d), order="F")
        kkt_fin = solf.kkt
    nd = float(np.sum(W_dir * W_dir))
    R = float(np.sum((Wg - W_fin) * W_dir)) / nd if nd > 0 else 0.0
    pred = W_fin + R * W_dir
    ng = float(np.linalg.norm(Wg))
    alpha = np.argmax(log_s, axis=1)
    W_mm: FloatArray | None
    try:
        W_mm = solve_svm(inst, alpha=alpha).W
    except AttnSVMError:
        W_mm = None
    if W_mm is not None:
        Rs = float(np.sum(Wg * W_mm)) / float(np.sum(W_mm * W_mm))
        s_err = float(np.linalg.norm(Wg - Rs * W_mm)) / ng
        s_corr = direction_corr(Wg, W_mm)
    else:
        s_err = s_corr = math.nan
    return MultiTokenPrediction(
        sets=sets,
        W_dir=W_dir,
        W_fin=W_fin,
        R=R,
        prediction=pred,
        rel_error=float(np.linalg.norm(Wg - pred)) / ng,
        corr=direction_corr(Wg, pred) if np.any(pred != 0) else math.nan,
        W_mm=W_mm,
        single_rel_error=s_err,
        single_corr=s_corr,
        kkt_dir=kkt_dir,
        kkt_fin=kkt_fin,
    )
