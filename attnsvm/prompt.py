"""Prompt attention: a trainable prompt ``p`` attending over the tokens, its p-SVM and GD on ``p``.

Model (Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596): with a fixed key matrix ``W`` and a fixed
head ``v``, sequence ``i`` gives

    f_i = vᵀ X_iᵀ softmax(X_i W p),   logits  l_it = k_itᵀ p,   keys  k_it = Wᵀ x_it,

and the risk is ``L(p) = (1/n) Σ_i ℓ(Y_i f_i)``. Its gradient is

    ∇_p L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) k_it,

and GD on ``p`` converges in direction to the p-SVM solution

    p_mm(α) = argmin ||p||₂  s.t.  (k_iα_i − k_it)ᵀ p ≥ 1   for all t ≠ α_i, all i.

Reparametrisation (used to reuse the core's stable gradient, and proved exactly in
``symbolic/test_peer_gradients.py``). Put ``x'_it = (k_it, vᵀx_it) ∈ ℝ^{d+1}``, the constant query
``z' = e_0``, the head ``v' = e_d`` and ``W' = [p; 0] e_0ᵀ``. Then ``x'_itᵀ W' z' = k_itᵀ p`` and
``v'ᵀ x'_it = vᵀ x_it``, so the prompt model *is* the core model on the augmented data and
``∇_p L = ∇_{W'} L [:d, 0]``: the cancellation-free gradient
(:func:`attnsvm.grad.risk_grad_of`) and the log-domain normalized direction
(:func:`attnsvm.grad.normalized_risk_grad_of`) apply unchanged. The core direction is the unit
vector of the whole column ``(∇_p L, Σ w_it vᵀx_it)``; we drop the last entry and renormalise,
which keeps full relative precision because every entry of the core's direction is computed
from factored-out log-magnitudes.

Likewise the p-SVM is the core Att-SVM on keys ``X' = K`` with constant query ``e_0``:
``W' = p e_0ᵀ`` has ``||W'||_F = ||p||``; we solve it with the same certified min-norm solver
(:mod:`attnsvm.svm`), on the Gram matrix ``(Δk_r · Δk_s)``.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (prompt attention, p-SVM,
regularization path); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .attention import log_softmax
from .errors import AttnSVMError, InfeasibleSVMError, InvalidInstanceError, NumericalError
from .gd import check_lr, check_steps, projected_path, record_steps
from .grad import GradDirection, normalized_risk_grad_of, risk_grad_of, risk_of
from .instance import Instance, as_real_array
from .losses import LossLike, get_loss
from .svm import KKTResiduals, MinNormSolution, min_norm_dual

__all__ = [
    "prompt_keys",
    "prompt_logits",
    "prompt_attention",
    "prompt_output",
    "prompt_risk",
    "prompt_grad",
    "normalized_prompt_grad",
    "PromptSVMSolution",
    "solve_prompt_svm",
    "prompt_local_optimality",
    "PromptRecord",
    "PromptTrajectory",
    "run_prompt_gd",
    "PromptPathPoint",
    "prompt_regularization_path",
]

FloatArray = NDArray[np.float64]


# ================================================================== validation
def check_prompt(inst: Instance, p: ArrayLike, name: str = "p") -> FloatArray:
    """Validate a prompt vector: finite real, shape ``(d,)`` (returns a float64 copy)."""
    pa = as_real_array(p, name, ndim=1)
    if pa.shape != (inst.d,):
        raise InvalidInstanceError(
            f"{name} must have shape (d,) = ({inst.d},) for this instance; got {pa.shape}"
        )
    return pa


# ============================================================ min-norm problems
def solve_min_norm_or_raise(
    rows: FloatArray,
    b: FloatArray,
    equality: NDArray[np.bool_] | None,
    pairs: NDArray[np.intp],
    what: str,
    factor: FloatArray | None = None,
) -> MinNormSolution:
    """``min ½||x||² s.t. rows·x ≥ b`` (``= b`` on ``equality``) by the certified solver of :mod:`attnsvm.svm`.

    ``rows`` (shape ``(m, k)``) is passed as the factor ``L`` of the Gram matrix ``K = rows rowsᵀ``
    (more accurate than factoring ``K``: ``cond(A)`` instead of ``cond(K)``); the solution is
    ``x = rowsᵀ · multipliers``. An infeasible problem raises :class:`InfeasibleSVMError` naming
    a pair ``(i, t)`` of ``pairs`` responsible when one row is zero.
    """
    L = rows if factor is None else factor
    try:
        return min_norm_dual(L @ L.T, b, equality=equality, factor=L)
    except InfeasibleSVMError as exc:
        raise InfeasibleSVMError(f"{_explain_infeasible(rows, pairs, what)} ({exc})") from exc


# ================================================================= array forms
def keys_of(X: FloatArray, W: FloatArray) -> FloatArray:
    """Keys ``k_it = Wᵀ x_it`` as rows, shape ``(n, T, d)`` (no validation)."""
    return X @ W


def augmented_of(keys: FloatArray, a: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The core instance arrays ``(X', z', v')`` equivalent to logits ``keys·p`` and values ``a``.

    ``x'_it = (k_it, a_it)``, ``z'_i = e_0``, ``v' = e_D`` (``D`` the key dimension), so that with
    ``W' = [p; 0] e_0ᵀ`` the core logits are ``k_itᵀ p`` and the core values ``a_it``.
    """
    n, T, D = keys.shape
    Xa = np.concatenate([keys, a[:, :, None]], axis=2)
    za = np.zeros((n, D + 1))
    za[:, 0] = 1.0
    va = np.zeros(D + 1)
    va[D] = 1.0
    return Xa, za, va


def embed_prompt(p: FloatArray) -> FloatArray:
    """``W' = [p; 0] e_0ᵀ``, shape ``(D+1, D+1)``."""
    D = p.shape[0]
    Wa = np.zeros((D + 1, D + 1))
    Wa[:D, 0] = p
    return Wa


def prompt_grad_of(keys: FloatArray, Y: FloatArray, a: FloatArray, p: FloatArray, loss: Any) -> FloatArray:
    """Array form of :func:`prompt_grad`: the core gradient on the augmented data, column 0."""
    Xa, za, va = augmented_of(keys, a)
    return np.array(risk_grad_of(Xa, Y, za, va, embed_prompt(p), loss)[: keys.shape[2], 0])


def normalized_prompt_grad_of(
    keys: FloatArray, Y: FloatArray, a: FloatArray, p: FloatArray, loss: Any
) -> GradDirection:
    """Array form of :func:`normalized_prompt_grad` (log-domain, via the augmented core direction)."""
    Xa, za, va = augmented_of(keys, a)
    G = normalized_risk_grad_of(Xa, Y, za, va, embed_prompt(p), loss)
    col = G.direction[: keys.shape[2], 0]
    # The core direction is exact entrywise (log-magnitudes factored out); dropping the
    # value coordinate and renormalising loses nothing unless the p-part is exactly 0.
    m = float(np.max(np.abs(col)))
    if not m > 0:
        raise NumericalError(
            "the prompt gradient is exactly zero at this p (the keys' weighted sums cancel); "
            "p is stationary and the normalized direction is undefined"
        )
    cs = col / m  # scaled before the norm: no overflow/underflow in Σ c²
    nrm = float(np.sqrt(np.sum(cs * cs)))
    return GradDirection(cs / nrm, G.log_norm + math.log(m) + math.log(nrm))


def prompt_risk_of(keys: FloatArray, Y: FloatArray, a: FloatArray, p: FloatArray, loss: Any) -> float:
    """Array form of :func:`prompt_risk`."""
    Xa, za, va = augmented_of(keys, a)
    return risk_of(Xa, Y, za, va, embed_prompt(p), loss)


# =================================================================== public model
def prompt_keys(inst: Instance, W: ArrayLike) -> FloatArray:
    """Keys ``k_it = Wᵀ x_it``, shape ``(n, T, d)``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.
    """
    return keys_of(inst.X, inst.check_weights(W))


def prompt_logits(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Logits ``l_it = x_itᵀ W p = k_itᵀ p``, shape ``(n, T)``."""
    return prompt_keys(inst, W) @ check_prompt(inst, p)


def prompt_attention(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Attention ``s_i = softmax(X_i W p)``, shape ``(n, T)`` (log-sum-exp form)."""
    return np.exp(log_softmax(prompt_logits(inst, W, p)))


def prompt_output(inst: Instance, W: ArrayLike, p: ArrayLike) -> FloatArray:
    """Outputs ``f_i = vᵀ X_iᵀ softmax(X_i W p)``, shape ``(n,)``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596, eq. (1).
    """
    return np.sum(prompt_attention(inst, W, p) * inst.values(), axis=1)


def prompt_risk(inst: Instance, W: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic") -> float:
    """Risk ``L(p) = (1/n) Σ_i ℓ(Y_i f_i)`` of the prompt model."""
    lo = get_loss(loss)
    keys = prompt_keys(inst, W)
    return prompt_risk_of(keys, inst.Y, inst.values(), check_prompt(inst, p), lo)


def prompt_grad(
    inst: Instance, W: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic"
) -> FloatArray:
    """Gradient ``∇_p L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) k_it``, shape ``(d,)``.

    Cancellation-free: computed as the core gradient on the augmented data (module docstring),
    i.e. with ``vᵀx_it − f_i = Σ_u s_iu (vᵀx_it − vᵀx_iu)``.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

    Args:
      inst: the data (``inst.z`` is unused).
      W: key matrix, shape ``(d, d)``.
      p: prompt, shape ``(d,)``.
      loss: loss name or object.

    Returns:
      The gradient, shape ``(d,)``.
    """
    lo = get_loss(loss)
    keys = prompt_keys(inst, W)
    return prompt_grad_of(keys, inst.Y, inst.values(), check_prompt(inst, p), lo)


def normalized_prompt_grad(
    inst: Instance, W: ArrayLike, p: ArrayLike, loss: "str | LossLike" = "logistic"
) -> GradDirection:
    """Unit direction ``∇_p L/||∇_p L||`` and ``log||∇_p L||``, exact after ``∇_p L`` underflows.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (normalized GD on ``p``).

    Returns:
      :class:`attnsvm.grad.GradDirection` with ``direction`` of shape ``(d,)``.
    """
    lo = get_loss(loss)
    keys = prompt_keys(inst, W)
    return normalized_prompt_grad_of(keys, inst.Y, inst.values(), check_prompt(inst, p), lo)


# ========================================================================= p-SVM
@dataclass(frozen=True)
class PromptSVMSolution:
    """Solution of the p-SVM ``min ||p|| s.t. (k_iα_i − k_it)ᵀ p ≥ 1``.

    Attributes:
      p: the solution, shape ``(d,)``.
      alpha: the token choice, shape ``(n,)``.
      rows: constraint rows ``Δk_it = k_iα_i − k_it``, shape ``(m, d)``, ``m = n(T−1)``.
      pairs: ``(i, t)`` of each row, shape ``(m, 2)``.
      duals: multipliers of ``min ½||p||²`` aligned with ``rows`` (``p = rowsᵀ duals``).
      support: active constraints as ``(i, t)`` pairs (margin 1 to :data:`attnsvm.svm.SUPPORT_RTOL`).
      weakly_active: active constraints with zero multiplier (a subset of ``support``).
      margins: ``rows @ p``, shape ``(m,)``.
      kkt: relative KKT residuals (:class:`attnsvm.svm.KKTResiduals`), as for ``solve_svm``.
      error_bound: ``cond(K_S)·eps``, bound on the relative error of ``p``.
      certified: ``error_bound`` and every KKT residual ``≤`` :data:`attnsvm.svm.CERTIFY_RTOL`.
    """

    p: FloatArray
    alpha: NDArray[np.intp]
    rows: FloatArray
    pairs: NDArray[np.intp]
    duals: FloatArray
    support: list[tuple[int, int]]
    weakly_active: list[tuple[int, int]]
    margins: FloatArray
    kkt: KKTResiduals
    error_bound: float
    certified: bool


def prompt_constraint_rows(
    inst: Instance, W: FloatArray, alpha: NDArray[np.intp]
) -> tuple[FloatArray, NDArray[np.intp]]:
    """Rows ``Δk_it = Wᵀ(x_iα_i − x_it)`` (``t ≠ α_i``, by sequence then token) and their pairs."""
    n, T, _ = inst.shape
    ii, tt = np.meshgrid(np.arange(n), np.arange(T), indexing="ij")
    keep = tt != alpha[:, None]
    pairs = np.stack([ii[keep], tt[keep]], axis=1).astype(np.intp)
    deltas = inst.X[pairs[:, 0], alpha[pairs[:, 0]]] - inst.X[pairs[:, 0], pairs[:, 1]]
    return deltas @ W, pairs


def _explain_infeasible(rows: FloatArray, pairs: NDArray[np.intp], what: str) -> str:
    scale = max(1.0, float(np.max(np.abs(rows)))) if rows.size else 1.0
    zero = np.flatnonzero(np.max(np.abs(rows), axis=1) <= 1e-14 * scale)
    if zero.size:
        i, t = (int(x) for x in pairs[zero[0]])
        return (
            f"the {what} is infeasible: sequence {i}, token {t} has the same key as the selected token "
            f"(Wᵀ(x_iα − x_it) = 0), so no p can give it a positive margin. Choose another alpha, "
            "or a W that separates these tokens."
        )
    return (
        f"the {what} is infeasible: the key differences admit no p with all margins ≥ 1 (they are "
        "linearly dependent with incompatible signs). Choose another alpha or a different W."
    )


def solve_prompt_svm(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> PromptSVMSolution:
    """Solve the p-SVM ``p_mm = argmin ||p||₂ s.t. (k_iα_i − k_it)ᵀ p ≥ 1`` exactly, with a certificate.

    Keys ``k_it = Wᵀ x_it``. Solved through the certified min-norm solver of :mod:`attnsvm.svm` on
    the Gram matrix ``(Δk_r · Δk_s)`` (an exact active-set finish), so ``p`` is accurate to about
    1e-9 relative.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (p-SVM, eq. ATT-SVM for ``p``).

    Args:
      inst: the data (``inst.z`` unused; ``inst.v`` defines the default ``alpha``).
      W: key matrix, shape ``(d, d)``.
      alpha: selected token per sequence, shape ``(n,)``; ``None`` → the optimal tokens.

    Returns:
      :class:`PromptSVMSolution`.

    Raises:
      InfeasibleSVMError: when no ``p`` meets the constraints (e.g. a key equal to the selected one).
    """
    Wa = inst.check_weights(W)
    a = inst.check_alpha(alpha)
    rows, pairs = prompt_constraint_rows(inst, Wa, a)
    sol = solve_min_norm_or_raise(rows, np.ones(len(rows)), None, pairs, "prompt SVM (p-SVM)")
    p = rows.T @ sol.multipliers
    return PromptSVMSolution(
        p=p,
        alpha=a,
        rows=rows,
        pairs=pairs,
        duals=sol.multipliers,
        support=[(int(i), int(t)) for i, t in pairs[sol.support]],
        weakly_active=[(int(i), int(t)) for i, t in pairs[sol.weakly_active]],
        margins=rows @ p,
        kkt=sol.kkt,
        error_bound=sol.error_bound,
        certified=sol.certified,
    )


def prompt_local_optimality(inst: Instance, W: ArrayLike, alpha: ArrayLike | None = None) -> bool:
    """``True`` exactly when the p-SVM(α) is feasible and ``γ_iα_i > γ_it`` for every support token ``t``.

    The prompt analogue of :func:`attnsvm.svm.is_locally_optimal` (support tokens of the p-SVM,
    token scores ``γ_it = Y_i vᵀx_it``; weakly active constraints count as support).

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (locally optimal tokens).
    """
    try:
        sol = solve_prompt_svm(inst, W, alpha)
    except InfeasibleSVMError:
        return False
    g = inst.scores()
    return all(g[i, sol.alpha[i]] > g[i, t] for i, t in sol.support)


# ============================================================================ GD
class PromptRecord(NamedTuple):
    """State of a prompt-GD run at one recorded step: ``step``, ``||p||``, risk, selected tokens,
    ``corr(p, reference)`` (NaN without one), ``log10||∇_p L||`` and a copy of ``p_t`` when the
    run keeps iterates."""

    step: int
    norm: float
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    log10_grad_norm: float
    p: FloatArray | None = None


@dataclass
class PromptTrajectory:
    """Result of :func:`run_prompt_gd`: final ``p`` (shape ``(d,)``) and the records."""

    p: FloatArray
    record: list[PromptRecord] = field(default_factory=list)
    normalized: bool = True
    lr: float = 0.0

    @property
    def corrs(self) -> FloatArray:
        """``corr(p_t, reference)`` at the recorded steps."""
        return np.array([r.corr for r in self.record])

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """Selected tokens ``argmax_t s_it`` at the final step."""
        return self.record[-1].tokens


def _cos(a: FloatArray, b: FloatArray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return math.nan
    return float(np.clip(np.dot(a / na, b / nb), -1.0, 1.0))


def run_prompt_gd(
    inst: Instance,
    W: ArrayLike,
    steps: int,
    lr: float,
    normalized: bool = True,
    p0: ArrayLike | None = None,
    loss: "str | LossLike" = "logistic",
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    keep_iterates: bool = False,
) -> PromptTrajectory:
    """GD on the prompt: ``p ← p − η ∇_p L/||∇_p L||`` (normalized) or ``p ← p − η ∇_p L``.

    The normalized direction is log-domain (:func:`normalized_prompt_grad`), so it stays exact
    after the gradient underflows; plain GD uses the cancellation-free gradient and raises
    :class:`NumericalError` if ``p`` becomes non-finite.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (Thm. on GD convergence to p-SVM).

    Args:
      inst: the data.
      W: key matrix, shape ``(d, d)``.
      steps: updates, integer ≥ 1.
      lr: step size ``η > 0``.
      normalized: normalized (default) or plain GD.
      p0: initial prompt, shape ``(d,)``; default zeros.
      loss: loss name or object.
      record_at: ``None`` (about 25 log-spaced steps), an interval, or a list of steps.
      reference: a ``(d,)`` direction (e.g. ``solve_prompt_svm(...).p``) for ``corr``.
      keep_iterates: store a copy of ``p_t`` in each record.

    Returns:
      :class:`PromptTrajectory` with ``.p`` and ``.record``.
    """
    steps = check_steps(steps)
    lr = check_lr(lr)
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    p = np.zeros(inst.d) if p0 is None else np.array(check_prompt(inst, p0, "p0"))
    ref = None if reference is None else check_prompt(inst, reference, "reference")
    if ref is not None and not np.any(ref != 0):
        raise InvalidInstanceError("reference is the zero vector; it has no direction")
    at = set(int(s) for s in record_steps(record_at, steps))
    keys, Y, a = keys_of(inst.X, Wa), inst.Y, inst.values()
    rec: list[PromptRecord] = []

    def record(t: int) -> None:
        try:
            lg = normalized_prompt_grad_of(keys, Y, a, p, lo).log_norm / math.log(10.0)
        except NumericalError:
            lg = -math.inf
        rec.append(
            PromptRecord(
                t,
                float(np.linalg.norm(p)),
                prompt_risk_of(keys, Y, a, p, lo),
                np.argmax(keys @ p, axis=1).astype(np.intp),
                _cos(p, ref) if ref is not None else math.nan,
                lg,
                np.array(p) if keep_iterates else None,
            )
        )

    if 0 in at:
        record(0)
    for t in range(1, steps + 1):
        if normalized:
            try:
                g = normalized_prompt_grad_of(keys, Y, a, p, lo).direction
            except NumericalError as exc:
                raise NumericalError(f"normalized prompt GD at step {t}: {exc}") from exc
        else:
            g = prompt_grad_of(keys, Y, a, p, lo)
        p = p - lr * g
        if not np.all(np.isfinite(p)):
            raise NumericalError(f"prompt GD diverged at step {t}: p became non-finite; lower lr")
        if t in at:
            record(t)
    return PromptTrajectory(p=p, record=rec, normalized=bool(normalized), lr=lr)


# ========================================================= regularization path
class PromptPathPoint(NamedTuple):
    """One point ``p_R ≈ argmin_{||p|| ≤ R} L(p)``: radius, ``p_R``, risk, tokens,
    ``corr(p_R, reference)`` and the KKT residual ``||ĝ + p/||p|| ||`` on the sphere."""

    radius: float
    p: FloatArray
    risk: float
    tokens: NDArray[np.intp]
    corr: float
    kkt_residual: float


def prompt_regularization_path(
    inst: Instance,
    W: ArrayLike,
    radii: ArrayLike,
    loss: "str | LossLike" = "logistic",
    reference: ArrayLike | None = None,
    max_steps: int = 2000,
    lr: float = 0.1,
    tol: float = 1e-10,
) -> list[PromptPathPoint]:
    """Regularization path ``p_R = argmin_{||p||₂ ≤ R} L(p)`` for increasing ``R`` (warm-started).

    Projected normalized GD with the same warm start and acceptance rule as the ``W`` path
    (:func:`attnsvm.gd.projected_path`), until the KKT residual ``||∇L/||∇L|| + p/R||`` is below
    ``tol``. The risk is not convex in ``p``, so the
    points are stationary points of the constrained problems (residual reported), not certified
    minimisers. Tarzanagh et al. show ``p_R/R → p_mm/||p_mm||`` for the optimal tokens.

    References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (regularization path of ``p``).

    Args:
      inst, W: data and key matrix ``(d, d)``.
      radii: increasing positive radii, shape ``(k,)``.
      loss: loss name or object.
      reference: ``(d,)`` direction for ``corr``.
      max_steps: projected steps per radius.
      lr: initial step as a fraction of ``R``.
      tol: KKT residual at which a radius is done.

    Returns:
      One :class:`PromptPathPoint` per radius.
    """
    R_all = as_real_array(radii, "radii", ndim=1)
    if R_all.size == 0 or np.any(R_all <= 0) or np.any(np.diff(R_all) <= 0):
        raise AttnSVMError("radii must be a non-empty, strictly increasing list of positive radii")
    max_steps = check_steps(max_steps, "max_steps")
    lr = check_lr(lr)
    tol = float(tol)
    if not (math.isfinite(tol) and tol >= 0):
        raise AttnSVMError(f"tol must be a finite number ≥ 0; got {tol!r}")
    lo = get_loss(loss)
    Wa = inst.check_weights(W)
    ref = None if reference is None else check_prompt(inst, reference, "reference")
    keys, Y, a = keys_of(inst.X, Wa), inst.Y, inst.values()
    steps = projected_path(
        np.zeros(inst.d),
        R_all,
        lambda pc: prompt_risk_of(keys, Y, a, pc, lo),
        lambda pc: normalized_prompt_grad_of(keys, Y, a, pc, lo),
        max_steps,
        lr,
        tol,
    )
    out: list[PromptPathPoint] = []
    for st in steps:
        on_sphere = float(np.linalg.norm(st.x)) >= st.radius * (1 - 1e-12)
        out.append(
            PromptPathPoint(
                st.radius,
                st.x,
                st.risk,
                np.argmax(keys @ st.x, axis=1).astype(np.intp),
                _cos(st.x, ref) if ref is not None else math.nan,
                st.residual if on_sphere else math.nan,
            )
        )
    return out
