"""Properties of the risk gradient: closed form = torch autograd = finite differences, and
the cancellation-free form is exact at saturation where the textbook form is not.

Error model (float64, unit roundoff ``EPS``). Let ``κ`` be the amplification of relative
errors through the computation: logits carry ``≤ 2d·EPS·Σ_kj |x_k W_kj z_j|`` absolute error,
which ``exp`` turns into relative error of the weights; the weights' errors move ``f`` and
thus ``ℓ'(Y f)`` by a relative ``≤ |ℓ''/ℓ'|·|δf| ≤ max|a|·(…)`` (``|ℓ''| ≤ |ℓ'|`` for the
logistic and exponential losses). Every entry of ``∇L`` is then within
``ULPS · EPS · κ · S_kj`` of the exact value, where ``S_kj = Σ_it m_it |x_itk| |z_ij|`` sums
the magnitudes of the terms the formula adds (see :func:`_scales`), and ``ULPS`` absorbs the
constant number of roundings per term.

Masks (issue 15 §2). Each property has a ``*_masked`` twin on masked instances (masks aimed at the
hard cases: the score maximiser, a tie partner, the largest token, a single allowed token) and on
sequence-to-sequence instances (:meth:`attnsvm.Instance.from_sequences`, causal or not, padded), so the
plain examples stay those of before. The oracles apply the mask themselves: torch autograd fills the
masked logits with ``−inf`` before its softmax, the mpmath oracle gives a masked token weight exactly 0
(so it adds no term), and the error model's scales read the keys (masked tokens zeroed). The kind drawn
is counted with ``hypothesis.event``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import event, example, given, target
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.model._grad import CANCELLATION_FACTOR
from attnsvm.model._instance import Instance

EPS = float(np.finfo(np.float64).eps)
#: Roundings per gradient term: one each for the logit dot products (accounted in κ), the
#: log-sum-exp, exp, the loss derivative, the weighted difference and the final sum; 16 leaves
#: a factor ~2 of headroom over that count.
ULPS = 16.0
#: Smallest positive normal double: terms below it lose relative precision (subnormals).
TINY = float(np.finfo(np.float64).tiny)
#: Spacing of subnormal doubles, 2^-1074: the absolute rounding error of a subnormal result.
SUBNORMAL_ULP = float(np.nextafter(0.0, 1.0))
#: Digits of the mpmath oracle. Each oracle term is a product/sum of O(nTd²) exactly
#: representable inputs with relative error 1e-50, far below float64's 1e-16.
ORACLE_DPS = 50
#: ``risk_grad`` refuses (NumericalError, pointing to ``normalized_risk_grad``) when ``||∇L||``
#: is below the normal range; it decides from its own ``log||∇L||``, accurate to ≪ 1 relative
#: where the gradient is above its rounding level, so a factor 2 on FLOAT_TINY covers the edge.
RAISE_SLACK = 2.0
#: Relative error bound of the float gradient at which its direction is not determined: the unit
#: vectors of G* and of a G within rel·||G*|| of it differ by up to 2·rel ≥ 1.
DIRECTION_UNDETERMINED = 0.5

LOSSES = ("logistic", "exponential", "correlation")
SMALL = {"n": (1, 3), "T": (2, 4), "d": (1, 4)}

moderate = S.instances_and_weights(
    S.instances(**SMALL, family="gaussian", bound=3.0) | S.instances(**SMALL, family="unit"),
    scale=(1e-2, 2.0),
)
#: Saturation stated by the runner-up weight: from 1e-1 down to e^{−2000} (∇L then far below 1e-308).
saturated = S.instances_and_weights(
    S.feasible_instances(n=(1, 3), T=(2, 4)), runner_up=(1e-300, 1e-1)
) | S.instances_and_weights(S.feasible_instances(n=(1, 3), T=(2, 4)), log_runner_up=(-2e3, -690.0))
#: The masked twins' data: masked instances and sequence-to-sequence ones (causal or not, padded or not).
SEQ = S.sequence_instances(n=(1, 2), T=(2, 3), d=(1, 3), bound=3.0) | S.sequence_instances(
    n=(1, 2), T=(2, 3), d=(1, 3), family="unit", padding=True
)
moderate_masked = S.instances_and_weights(
    S.instances(**SMALL, family="gaussian", bound=3.0, masked=True)
    | S.instances(**SMALL, family="unit", masked=True)
    | SEQ,
    scale=(1e-2, 2.0),
)
saturated_masked = (
    S.instances_and_weights(S.feasible_instances(n=(1, 3), T=(2, 4), masked=True), runner_up=(1e-300, 1e-1))
    | S.instances_and_weights(
        S.feasible_instances(n=(1, 3), T=(2, 4), masked=True), log_runner_up=(-2e3, -690.0)
    )
    | S.instances_and_weights(SEQ, runner_up=(1e-300, 1e-1))
)


def _kind(inst: Instance) -> None:
    event(f"instance: {S.instance_kind(inst)}")


# ---------------------------------------------------------------- references
def _torch_risk(inst: Instance, W: torch.Tensor, loss: str) -> torch.Tensor:
    """Independent torch implementation of the risk (library softmax and losses); a masked token's
    logit is filled with ``−inf`` before the softmax (weight 0, no gradient)."""
    X, z, v, Y = (torch.tensor(a, dtype=torch.float64) for a in (inst.X, inst.z, inst.v, inst.Y))
    lg = torch.einsum("ntd,de,ne->nt", X, W, z)
    if inst.mask is not None:
        lg = lg.masked_fill(~torch.tensor(inst.mask), -torch.inf)
    f = (torch.softmax(lg, dim=1) * (X @ v)).sum(dim=1)
    u = Y * f
    vals = {
        "logistic": torch.nn.functional.softplus(-u),
        "exponential": torch.exp(-u),
        "correlation": -u,
    }[loss]
    return vals.mean()


def autograd_grad(inst: Instance, W: np.ndarray, loss: str) -> np.ndarray:
    Wt = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    _torch_risk(inst, Wt, loss).backward()
    assert Wt.grad is not None
    return Wt.grad.numpy()


def _mp_sequences(inst: Instance, W: np.ndarray) -> Iterator[tuple[Any, ...]]:
    """Per sequence, in the caller's mpmath precision from the exact float64 inputs:
    ``(z, tokens, weights s, values a, |values| A_t = Σ_k |v_k x_tk|, margin u = Y f)``; a masked
    token has weight exactly 0 (it adds no term to any sum of the oracle)."""
    mpf = mpmath.mpf
    n, T, d = inst.shape
    ok = inst.allowed
    Wm = [[mpf(float(W[k, j])) for j in range(d)] for k in range(d)]
    vm = [mpf(float(c)) for c in inst.v]
    for i in range(n):
        z = [mpf(float(c)) for c in inst.z[i]]
        xs = [[mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
        Wz = [mpmath.fsum(Wm[k][j] * z[j] for j in range(d)) for k in range(d)]
        lg = [mpmath.fsum(x[k] * Wz[k] for k in range(d)) for x in xs]
        a = [mpmath.fsum(x[k] * vm[k] for k in range(d)) for x in xs]
        Aabs = [mpmath.fsum(abs(x[k] * vm[k]) for k in range(d)) for x in xs]
        m = max(li for li, keep in zip(lg, ok[i], strict=True) if keep)
        e = [mpmath.exp(li - m) if keep else mpf(0) for li, keep in zip(lg, ok[i], strict=True)]
        tot = mpmath.fsum(e)
        s = [ei / tot for ei in e]
        u = mpf(float(inst.Y[i])) * mpmath.fsum(si * ai for si, ai in zip(s, a, strict=True))
        yield z, xs, s, a, Aabs, u


def mp_grad_and_scale(
    inst: Instance, W: np.ndarray, loss: str
) -> tuple[list[list[mpmath.mpf]], list[list[mpmath.mpf]]]:
    """``∇L(W)`` and the error model's scale matrix ``S`` (cancellation-free form, see
    :func:`_scales`) in ``ORACLE_DPS``-digit arithmetic from the float64 inputs (exact inputs).

    ``S`` in mpmath does not underflow where the weights do, so ``S/||∇L||`` is exact at any
    saturation.
    """
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        n, T, d = inst.shape
        G = [[mpf(0) for _ in range(d)] for _ in range(d)]
        Sm = [[mpf(0) for _ in range(d)] for _ in range(d)]
        for i, (z, xs, s, a, Aabs, u) in enumerate(_mp_sequences(inst, W)):
            dl = {
                "logistic": -1 / (1 + mpmath.exp(u)),
                "exponential": -mpmath.exp(-u),
                "correlation": mpf(-1),
            }[loss]
            for t in range(T):
                # a_t − f written as Σ_u s_u (a_t − a_u): at 50 digits the textbook difference would
                # lose −log10(1 − s_α) of them at saturation; this exact identity loses none.
                centred = mpmath.fsum(s[u_] * (a[t] - a[u_]) for u_ in range(T))
                w = dl * mpf(float(inst.Y[i])) * s[t] * centred / n
                mag = (
                    abs(dl)
                    * s[t]
                    * mpmath.fsum(
                        s[u_] * (abs(a[t] - a[u_]) + Aabs[t] + Aabs[u_]) for u_ in range(T) if u_ != t
                    )
                    / n
                )
                for k in range(d):
                    wx = w * xs[t][k]
                    mx = mag * abs(xs[t][k])
                    for j in range(d):
                        G[k][j] += wx * z[j]
                        Sm[k][j] += mx * abs(z[j])
        return G, Sm


def mp_grad(inst: Instance, W: np.ndarray, loss: str) -> list[list[mpmath.mpf]]:
    """``∇L(W)`` in ``ORACLE_DPS``-digit arithmetic (see :func:`mp_grad_and_scale`)."""
    return mp_grad_and_scale(inst, W, loss)[0]


def _mp_norm(G: list[list[mpmath.mpf]]) -> mpmath.mpf:
    with mpmath.workdps(ORACLE_DPS):
        return mpmath.sqrt(mpmath.fsum(g * g for row in G for g in row))


#: The error model fixes a direction only when ``||Ĝ − G*|| < ½||G*||`` (else its sign is unknown).
UNDETERMINED_REL = 0.5


def _to_float(G: list[list[mpmath.mpf]]) -> np.ndarray:
    return np.array([[float(g) for g in row] for row in G])


def _scales(inst: Instance, W: np.ndarray, loss: str, textbook: bool) -> tuple[np.ndarray, float]:
    """``(S, κ)`` of the module's error model.

    ``m_it = |ℓ'_i| s_it Σ_u s_iu (|a_t − a_u| + A_t + A_u)/n`` for the cancellation-free form
    (``A_t = Σ_k |x_tk v_k|`` bounds the rounding of ``a_t``; the ``t = u`` term is exactly 0);
    the textbook form rounds ``a_t − f`` to ``EPS·(|a_t| + |f|)``, so its ``m_it`` carries
    ``|a_t| + Σ_u s_u |a_u|`` instead.
    """
    X, z, v, Y = inst.keys, inst.z, inst.v, inst.Y  # keys: a masked token has no weight, no term
    n, T, d = inst.shape
    Absa = np.abs(X) @ np.abs(v)  # A_it
    a = X @ v
    lg = np.einsum("ntd,de,ne->nt", X, W, z)
    s = A.attention(inst, W)
    f = np.sum(s * a, axis=1)
    dl = np.abs(A.get_loss(loss).derivative(Y * f))
    if textbook:
        inner = np.abs(a) + np.sum(s * np.abs(a), axis=1, keepdims=True)
    else:
        pair = np.abs(a[:, :, None] - a[:, None, :]) + Absa[:, :, None] + Absa[:, None, :]
        pair = pair * (1 - np.eye(T))[None]
        inner = np.einsum("nu,ntu->nt", s, pair)
    m = dl[:, None] * s * inner / n
    Smat = np.einsum("nt,ntk,nj->kj", m, np.abs(X), np.abs(z))
    L1 = float(np.max(np.einsum("ntk,kj,nj->nt", np.abs(X), np.abs(W), np.abs(z))))
    kappa = (4 * d * L1 + float(np.max(np.abs(lg))) + 2 * T + n + 8) * (1 + float(np.max(Absa)))
    return Smat, kappa


def _log_domain_rtol(inst: Instance, W: np.ndarray, loss: str) -> float:
    """Relative error of the log-domain direction: each term is ``exp(log|w_it| − top)`` with
    ``log|w_it|`` a sum of logs rounded to ``EPS·|log|w_it||`` absolute, i.e. that much relative
    after ``exp`` (tiny data puts ``|log|w||`` in the hundreds: 1e-278-sized values give 640;
    saturation puts it in the thousands). Computed from ``log_attention``, which does not underflow."""
    a = inst.keys @ inst.v
    log_s = A.log_attention(inst, W)  # −inf at a masked token: its terms drop out below
    dl = np.abs(A.get_loss(loss).derivative(inst.Y * np.sum(np.exp(log_s) * a, axis=1)))
    pair = np.abs(a[:, :, None] - a[:, None, :])
    with np.errstate(divide="ignore"):
        logs = (
            np.log(dl)[:, None, None] + log_s[:, :, None] + log_s[:, None, :] + np.log(pair) - np.log(inst.n)
        )
    finite = logs[np.isfinite(logs)]
    return ULPS * EPS * (1.0 + (float(np.max(np.abs(finite))) if finite.size else 0.0))


def _floor(inst: Instance) -> float:
    """Absolute error of terms that underflow: ``n·T`` terms below ``TINY·|x||z|·max|a|``, plus
    the rounding of results that are themselves subnormal (``≤ SUBNORMAL_ULP`` per operation,
    ``d + 2`` operations per term: the final products ``w_it x_itk z_ij`` and the sum)."""
    under = (
        TINY
        * float(np.max(np.abs(inst.keys)) * np.max(np.abs(inst.z)))
        * (1 + float(np.max(np.abs(inst.keys) @ np.abs(inst.v))))
    )
    return inst.n * inst.T * (under + (inst.d + 2) * SUBNORMAL_ULP)


# ---------------------------------------------------------------- properties
@given(moderate, st.sampled_from(LOSSES))
def test_risk_grad_equals_torch_autograd(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    inst, W = pair
    G = A.risk_grad(inst, W, loss=loss)
    Gt = autograd_grad(inst, W, loss)
    Smat, kappa = _scales(inst, W, loss, textbook=True)
    tol = ULPS * EPS * kappa * Smat + _floor(inst)
    target(float(np.max(np.abs(G - Gt) / tol)), label="gradient error / bound")
    assert np.all(np.abs(G - Gt) <= tol)


def _third_derivative_bound(inst: Instance, loss: str) -> float:
    """``sup_t |d³/dt³ L(W + tE)|`` for any ``W`` and unit ``E`` (cumulant bound).

    With ``δ_it = x_itᵀ E z_i`` (range ``R_δ ≤ 2 max||x_it|| ||z_i||``) and values of range
    ``R_a``, ``f_i`` has derivatives given by mixed cumulants of ``a`` and ``δ`` under ``s_i``:
    ``|f'| ≤ R_a R_δ``, ``|f''| ≤ R_a R_δ²``, ``|f'''| ≤ 4 R_a R_δ³`` (centred variables:
    1 + 3 pairings). Chain rule: ``|(ℓ∘f)'''| ≤ B (|f'|³ + 3|f'||f''| + |f'''|)`` with
    ``B = sup |ℓ^{(k)}|, k = 1..3``, on ``|u| ≤ max|a|``.
    """
    ok = inst.allowed
    a = inst.keys @ inst.v
    # ranges over the allowed tokens (a masked token has weight 0 in every cumulant)
    Ra = float(np.max(np.max(np.where(ok, a, -np.inf), axis=1) - np.min(np.where(ok, a, np.inf), axis=1)))
    Rd = 2 * float(np.max(np.linalg.norm(inst.keys, axis=2) * np.linalg.norm(inst.z, axis=1)[:, None]))
    amax = float(np.max(np.abs(a)))
    B = {"logistic": 1.0, "exponential": float(np.exp(amax)), "correlation": 1.0}[loss]
    p1, p2, p3 = Ra * Rd, Ra * Rd**2, 4 * Ra * Rd**3
    return B * (p1**3 + 3 * p1 * p2 + p3)


@given(moderate, st.sampled_from(LOSSES), S.seeds())
def test_risk_grad_equals_central_differences(
    pair: tuple[Instance, np.ndarray], loss: str, seed: int
) -> None:
    inst, W = pair
    E = np.random.default_rng(seed).standard_normal(W.shape)
    E /= np.linalg.norm(E)
    Lw = A.risk(inst, W, loss=loss)
    amax = float(np.max(np.abs(inst.keys @ inst.v)))
    _, kappa = _scales(inst, W, loss, textbook=True)
    B = {"logistic": 1.0, "exponential": float(np.exp(amax)), "correlation": 1.0}[loss]
    err_L = ULPS * EPS * kappa * (abs(Lw) + B * (1 + amax))  # rounding of one risk evaluation
    M3 = _third_derivative_bound(inst, loss)
    if M3 == 0.0:  # all values equal: L is constant along every line, the gradient is 0
        assert np.all(A.risk_grad(inst, W, loss=loss) == 0.0)
        return
    h = (3 * err_L / M3) ** (1 / 3)  # minimises h² M3 / 6 + err_L / h
    fd = (A.risk(inst, W + h * E, loss=loss) - A.risk(inst, W - h * E, loss=loss)) / (2 * h)
    tol = h**2 * M3 / 6 + err_L / h
    assert abs(fd - float(np.sum(A.risk_grad(inst, W, loss=loss) * E))) <= tol


def mp_rounding_level(inst: Instance, W: np.ndarray, loss: str) -> mpmath.mpf:
    """The documented rounding level of the float gradient, ``nT·EPS·M + VE``, in mpmath (oracle).

    ``M = Σ_it |w_it|·||x_it||·||z_i||`` (``|w_it| = |ℓ'_i| s_it |Σ_u s_iu (a_t − a_u)|/n``) and the
    values' rounding ``VE = d·EPS·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (A_t + A_u)·||x_it||·||z_i||/n``
    (``A_t = Σ_k |v_k x_tk|``; an exact copy of a token has the same rounded value). ``risk_grad`` and
    ``normalized_risk_grad`` refuse at ``||Ĝ|| ≤ CANCELLATION_FACTOR`` times it."""
    n, T, d = inst.shape
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        M = VE = mpf(0)
        for i, (z, xs, s, a, Aabs, u) in enumerate(_mp_sequences(inst, W)):
            dl = abs(
                {"logistic": -1 / (1 + mpmath.exp(u)), "exponential": -mpmath.exp(-u)}.get(loss, mpf(-1))
            )
            zn = mpmath.sqrt(mpmath.fsum(c * c for c in z))
            for t in range(T):
                xn = mpmath.sqrt(mpmath.fsum(c * c for c in xs[t])) * zn
                c_t = mpmath.fsum(s[u_] * (a[t] - a[u_]) for u_ in range(T))
                M += dl * s[t] * abs(c_t) / n * xn
                mix = mpmath.fsum(
                    s[u_] * (Aabs[t] + Aabs[u_]) for u_ in range(T) if np.any(inst.X[i, u_] != inst.X[i, t])
                )
                VE += dl * s[t] * d * EPS * mix / n * xn
        return n * T * EPS * M + VE


#: ``risk_grad`` decides its rounding-level refusal from its own float64 ``M`` and ``VE``, which may
#: differ from the oracle's by the error model's relative error (≪ 1 where a decision matters): a
#: factor 2 on the oracle's level covers that edge.
REFUSAL_SLACK = 2.0


def _check_risk_grad(
    inst: Instance, W: np.ndarray, loss: str, Gm: list, norm: mpmath.mpf, tol: np.ndarray
) -> str:
    """``risk_grad`` is within ``tol`` of the oracle ``Gm`` entrywise, or refuses (NumericalError)
    only where ``||∇L|| < RAISE_SLACK·FLOAT_TINY`` (the oracle's norm; message pointing to
    ``normalized_risk_grad``) or where ``||∇L||`` is within the error model's bound ``||tol||_F`` of
    ``REFUSAL_SLACK·CANCELLATION_FACTOR`` times the oracle's rounding level (:func:`mp_rounding_level`;
    message "cancel to rounding level"): there the float G may be mostly rounding. Returns the outcome."""
    try:
        G = A.risk_grad(inst, W, loss=loss)
    except A.NumericalError as err:
        if "rounding level" in str(err):
            level = REFUSAL_SLACK * CANCELLATION_FACTOR * mp_rounding_level(inst, W, loss)
            assert norm <= level + float(np.linalg.norm(tol)), (
                f"risk_grad refused a gradient of norm {mpmath.nstr(norm, 5)} above its rounding level "
                f"{mpmath.nstr(level, 5)}: {err}"
            )
            return "refused at the rounding level (values or sum)"
        assert norm < RAISE_SLACK * TINY, (
            f"risk_grad refused a gradient of norm {mpmath.nstr(norm, 5)}: {err}"
        )
        assert "normalized_risk_grad" in str(err)
        return "refused below the normal range"
    err_ = np.abs(G - _to_float(Gm))
    target(float(np.max(err_ / tol)), label="gradient error / bound")
    assert np.all(err_ <= tol)
    return "returned"


@given(saturated, st.sampled_from(LOSSES))
def test_stable_grad_matches_high_precision_oracle(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """Oracle: the 50-digit mpmath gradient. At any saturation (runner-up weight 1e-1 … e^{−2000})
    every entry is exact to the error model (no cancellation), or ``risk_grad`` refuses because
    ``||∇L||`` is below the normal range (as the oracle says), pointing to ``normalized_risk_grad``, or
    because it is at the rounding level of its values or sum (oracle: :func:`mp_rounding_level`; e.g.
    two leading values both at the rounding level of their dot products)."""
    inst, W = pair
    Gm, _ = mp_grad_and_scale(inst, W, loss)
    Smat, kappa = _scales(inst, W, loss, textbook=False)
    event(_check_risk_grad(inst, W, loss, Gm, _mp_norm(Gm), ULPS * EPS * kappa * Smat + _floor(inst)))


def _direction_rel(inst: Instance, W: np.ndarray, loss: str, norm: mpmath.mpf, Sm: list) -> float:
    """``||Ĝ − G*||/||G*||`` of the error model, with ``S/||G*||`` from the oracle (no underflow)."""
    _, kappa = _scales(inst, W, loss, textbook=False)
    with mpmath.workdps(ORACLE_DPS):
        ratio = float(_mp_norm(Sm) / norm)
    return ULPS * EPS * kappa * ratio


def _assert_direction(
    res: A.GradDirection, D: np.ndarray, log_norm: float, rel: float, inst: Instance, W: np.ndarray, loss: str
) -> None:
    """The returned direction against the oracle ``D = G*/||G*||``, for every ``rel``.

    ``||Ĝ − G*|| ≤ rel·||G*||`` gives ``||Ĝ/||Ĝ|| − D|| ≤ 2·rel`` (true for any ``rel``; once
    ``2·rel ≥ 2`` it says no more than "a finite unit vector", which is asserted first) and
    ``|log||Ĝ|| − log||G*||| ≤ −log(1 − rel)`` for ``rel < 1`` (``≤ rel + rel²`` for ``rel ≤ ½``; the
    determined case keeps its ``rel`` bound), each plus the log-domain rounding."""
    assert np.all(np.isfinite(res.direction))
    assert abs(np.linalg.norm(res.direction) - 1) <= ULPS * EPS * inst.d
    err = float(np.linalg.norm(res.direction - D))
    dbound = 2 * rel + _log_domain_rtol(inst, W, loss)
    target(err / dbound, label="direction error / bound")
    assert err <= dbound
    rounding = ULPS * EPS * max(1.0, abs(log_norm))
    if rel < UNDETERMINED_REL:
        assert abs(res.log_norm - log_norm) <= rel + rounding
    elif rel < 1.0:
        assert abs(res.log_norm - log_norm) <= -np.log1p(-rel) + rounding


@given(saturated, st.sampled_from(LOSSES))
def test_normalized_direction_matches_oracle(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """Oracle: the 50-digit mpmath gradient, normalised. The log-domain direction is exact even where
    ∇L underflows to 0 in float64 (runner-up weights down to e^{−2000}).

    Condition: the direction is a float64 answer only where the error model fixes it, ``rel < ½``
    (``rel`` includes the values' own rounding ``A_t``). Found by the ci run: saturated sequences
    whose two leading values are both at the rounding level of their dot products
    (``a = 1.1e-16, 8.3e-17`` with ``Σ|v_k x_k| ≈ 1``, ``rel = 3e7``): their difference, hence the
    direction, is rounding noise, and ``normalized_risk_grad`` refuses. There a refusal is the right
    answer and is asserted to happen only there (``rel ≥ ½``); a direction returned there is held to the
    same error model (:func:`_assert_direction`: within ``2·rel``, a finite unit vector), so every
    example is tested and none is set aside."""
    inst, W = pair
    Gm, Sm = mp_grad_and_scale(inst, W, loss)
    norm = _mp_norm(Gm)
    with mpmath.workdps(ORACLE_DPS):
        D = np.array([[float(g / norm) for g in row] for row in Gm])
        log_norm = float(mpmath.log(norm))
    # ||Ĝ − G*||/||G*|| ≤ rel; the unit vectors then differ by ≤ 2·rel.
    rel = _direction_rel(inst, W, loss, norm, Sm)
    try:
        res = A.normalized_risk_grad(inst, W, loss=loss)
    except A.NumericalError as exc:
        assert rel >= UNDETERMINED_REL, f"refused a direction the error model fixes (rel = {rel:.3g}): {exc}"
        event("refused: direction undetermined by the error model (rel ≥ ½)")
        return
    event(
        "returned: " + ("determined (rel < ½)" if rel < UNDETERMINED_REL else "rel ≥ ½, error model asserted")
    )
    _assert_direction(res, D, log_norm, rel, inst, W, loss)


# ----------------------------------------------- the textbook form fails (a pinned finding)
def test_textbook_loses_digits_at_saturation() -> None:
    """The oracle comparison can fail: the textbook gradient violates the error model at
    saturation (why attnsvm.model._grad uses the cancellation-free form), while the cancellation-free
    one satisfies it."""
    rng = np.random.default_rng(0)
    inst = A.random_instance(2, 3, 4, seed=rng, family="gaussian")
    sol_dir = rng.standard_normal((4, 4))
    W = 30.0 * sol_dir / np.linalg.norm(sol_dir)
    Gs = _to_float(mp_grad(inst, W, "logistic"))
    Smat, kappa = _scales(inst, W, "logistic", textbook=False)
    tol = ULPS * EPS * kappa * Smat + _floor(inst)
    assert np.all(np.abs(A.risk_grad(inst, W) - Gs) <= tol)
    assert np.any(np.abs(A.risk_grad_textbook(inst, W) - Gs) > tol)


@pytest.mark.parametrize("loss", LOSSES)
def test_zero_weights_gradient_matches_autograd_exactly_shaped(loss: str) -> None:
    """At ``W = 0`` all three references agree (uniform attention)."""
    inst = A.random_instance(3, 4, 3, seed=1)
    W = np.zeros((3, 3))
    G = A.risk_grad(inst, W, loss=loss)
    Smat, kappa = _scales(inst, W, loss, textbook=True)
    assert np.all(np.abs(G - autograd_grad(inst, W, loss)) <= ULPS * EPS * kappa * Smat)
    assert np.all(np.abs(G - _to_float(mp_grad(inst, W, loss))) <= ULPS * EPS * kappa * Smat)


@given(moderate, st.sampled_from(LOSSES))
def test_textbook_grad_equals_torch_autograd_at_moderate_w(
    pair: tuple[Instance, np.ndarray], loss: str
) -> None:
    """Away from saturation the textbook form is as good as the stable one (its baseline role)."""
    inst, W = pair
    Smat, kappa = _scales(inst, W, loss, textbook=True)
    tol = ULPS * EPS * kappa * Smat + _floor(inst)
    assert np.all(np.abs(A.risk_grad_textbook(inst, W, loss=loss) - autograd_grad(inst, W, loss)) <= tol)


#: Token 1 has value equal to the output at W = 0 (a = (1, 0, −1), f = 0): its centred value is
#: exactly 0 (the positive and negative parts cancel in the log domain), yet x_1 ≠ 0.
_ZERO_CENTRED = A.Instance([[[1.0, 1.0], [0.0, 1.0], [-1.0, 1.0]]], [1.0], [1.0, 0.0], [[0.5, 2.0]])


#: Sweep finding (shrunk): a gradient ~1e-156 whose squared entries are subnormal; the reference
#: norm must be computed on the rescaled matrix (see the test body).
#: ci finding (shrunk): values ~1e-278 make |log|w|| ≈ 640, the log-domain rounding 1.4e-13 relative.
_TINY_VALUES = A.Instance([[[0.0, 1.0], [1.0, 1.0]]], [1.0], [1.4e-278, 1.4e-278], [[0.0, 1.0]])
_TINY_GRAD = A.Instance([[[2.0**-126], [0.0]], [[0.0], [0.0]]], [1.0, 1.0], [2.0**-126], [[2.0**-126], [0.0]])


@example(pair=(_ZERO_CENTRED, np.zeros((2, 2))), loss="logistic", scale=1.0)
@example(pair=(_TINY_GRAD, np.ones((1, 1))), loss="logistic", scale=0.001)
@example(pair=(_TINY_VALUES, np.array([[0.1865, -0.1960], [0.9500, 0.1556]])), loss="logistic", scale=2.0)
@given(
    S.instances_and_weights(
        S.instances(family="uniform", bound=4.0, d=(1, 3))
        | S.instances(family="gaussian")
        | S.instances(family="gaussian", duplicates=True, near_parallel=True),
        scale=(1e-2, 2.0),
    ),
    st.sampled_from(LOSSES),
    st.floats(1e-3, 1e3),
)
def test_normalized_direction_equals_normalized_gradient(
    pair: tuple[Instance, np.ndarray], loss: str, scale: float
) -> None:
    """Oracle: the 50-digit mpmath gradient ``G*``. At moderate W and queries of any scale
    (``z → c z``, ``W → W/max(1, c)``, so ``||∇L||`` ranges over 6 orders and more while the logits,
    values and losses stay moderate),
    including exact ties (uniform family, duplicated tokens) and zero centred values:

    * ``G* = 0`` exactly ⇒ ``normalized_risk_grad`` refuses (NumericalError);
    * ``||G*||`` above the rounding level of the float gradient ⇒ ``risk_grad`` is right to the error
      model (or refuses below the normal range), and ``normalized_risk_grad`` returns ``G*/||G*||``
      and ``log||G*||`` to the error model, or refuses as "cancelled" only where ``||G*||`` is at
      the core's own cancellation level;
    * error model's relative bound ``rel ≥ DIRECTION_UNDETERMINED`` (``||G*||`` at the rounding
      level of its float sum): float64 does not fix the direction, so ``normalized_risk_grad`` may
      refuse; a returned direction is held to the same error model (within ``2·rel`` of ``G*/||G*||``,
      a finite unit vector). These examples are tested, not set aside (no discards in this property).
    """
    inst0, W0 = pair
    inst = A.Instance(inst0.X, inst0.Y, inst0.v, scale * inst0.z, mask=inst0.mask)
    # W/max(1, c): the logits stay those of a moderate W (saturation is the saturated tests' domain;
    # there, large c made ||∇L*|| fall to the rounding level of its float sum in ~5 % of examples).
    W = W0 / max(1.0, scale)
    Gm, Sm = mp_grad_and_scale(inst, W, loss)
    norm = _mp_norm(Gm)
    if norm == 0:
        event("∇L = 0 exactly: refusal asserted")
        with pytest.raises(A.NumericalError):
            A.normalized_risk_grad(inst, W, loss=loss)
        return
    Smat, kappa = _scales(inst, W, loss, textbook=False)
    tol = ULPS * EPS * kappa * Smat + _floor(inst)
    # Relative error bound of the float gradient, ||Ĝ − G*||/||G*|| ≤ rel, with S/||G*|| from the
    # oracle (no underflow, however saturated). rel ≥ ½: float64 does not determine the direction.
    rel = _direction_rel(inst, W, loss, norm, Sm)
    nG = float(norm)
    with mpmath.workdps(ORACLE_DPS):
        D = np.array([[float(g / norm) for g in row] for row in Gm])
        log_norm = float(mpmath.log(norm))
    event(_check_risk_grad(inst, W, loss, Gm, norm, tol))
    if rel >= DIRECTION_UNDETERMINED:
        # float64 does not fix the direction here (||G*|| within the error model of its rounding):
        # a refusal is right; a returned direction is held to the error model all the same (within
        # 2·rel, a finite unit vector). Tested, not set aside.
        try:
            res = A.normalized_risk_grad(inst, W, loss=loss)
        except A.NumericalError:
            event("direction undetermined by the error model (rel ≥ ½): refused")
            return
        event("direction undetermined by the error model (rel ≥ ½): returned, error model asserted")
        _assert_direction(res, D, log_norm, rel, inst, W, loss)
        return
    try:
        res = A.normalized_risk_grad(inst, W, loss=loss)
    except A.NumericalError as err:
        # The core refuses gradients at the rounding level of their own sum,
        # ||∇L|| ≤ CANCELLATION_FACTOR·nT·EPS·Σ|w_it| ||x_it|| ||z_i||; allow 2× for our recomputation.
        assert "cancel to rounding level" in str(err)
        a = inst.keys @ inst.v
        s_att = A.attention(inst, W)
        f = np.sum(s_att * a, axis=1)
        centred = np.einsum("nu,ntu->nt", s_att, a[:, :, None] - a[:, None, :])
        w = np.abs(A.get_loss(loss).derivative(inst.Y * f))[:, None] * s_att * np.abs(centred) / inst.n
        mag = float(np.sum(w * np.linalg.norm(inst.keys, axis=2) * np.linalg.norm(inst.z, axis=1)[:, None]))
        assert nG <= 2 * CANCELLATION_FACTOR * inst.n * inst.T * EPS * mag
        event("refused as cancelled (at the core's cancellation level)")
        return
    _assert_direction(res, D, log_norm, rel, inst, W, loss)


@pytest.mark.parametrize(
    "case",
    [
        ([[[0.0], [1.0]]], [1.0], [1.0], [[3.805905962263e-275]]),  # tiny query
        ([[[0.0], [1.0]], [[3.0], [0.0]]], [1.0, 1.0], [1.0], [[0.0], [129.0]]),  # largest term has x = 0
    ],
)
def test_tiny_queries_keep_the_normalized_direction(case: tuple) -> None:  # type: ignore[type-arg]
    """Regression (found by the ci and sweep runs, shrunk): ``normalized_risk_grad_of`` used to take
    ``np.linalg.norm`` of ``G`` scaled by its largest term coefficient; when that was below ~1e-154
    (a tiny query ``z = 3.8e-275``; or a saturated sequence whose largest-coefficient token is
    ``x = 0``) the squares underflowed, and it raised "contributions cancel" or returned a direction
    off by ~1e-9 although ``∇L`` is a normal double. Fixed by dividing ``G`` by ``max|G|`` first."""
    inst = A.Instance(*case)  # type: ignore[arg-type]
    W = np.ones((1, 1))
    G = A.risk_grad(inst, W)
    assert G[0, 0] != 0.0
    res = A.normalized_risk_grad(inst, W)
    assert res.direction[0, 0] == np.sign(G[0, 0])
    assert abs(res.log_norm - np.log(abs(G[0, 0]))) <= 64 * EPS * abs(np.log(abs(G[0, 0])))


# ---------------------------------------------------------------- masked and sequence-to-sequence twins
# Each runs the unmasked property's own body (``inner_test``: the same claim, oracle and error model, all
# of which apply the mask) on masked and sequence-to-sequence data, counting the kind drawn.
@given(moderate_masked, st.sampled_from(LOSSES))
def test_risk_grad_equals_torch_autograd_masked(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """Oracle: torch autograd through a softmax whose masked logits are filled with ``−inf``."""
    _kind(pair[0])
    test_risk_grad_equals_torch_autograd.hypothesis.inner_test(pair, loss)


@given(moderate_masked, st.sampled_from(LOSSES), S.seeds())
def test_risk_grad_equals_central_differences_masked(
    pair: tuple[Instance, np.ndarray], loss: str, seed: int
) -> None:
    """Oracle: central differences of the (masked) risk, step and bound from the cumulant bound over
    the allowed tokens."""
    _kind(pair[0])
    test_risk_grad_equals_central_differences.hypothesis.inner_test(pair, loss, seed)


@given(saturated_masked, st.sampled_from(LOSSES))
def test_stable_grad_matches_high_precision_oracle_masked(
    pair: tuple[Instance, np.ndarray], loss: str
) -> None:
    """Oracle: the 50-digit mpmath gradient with weight exactly 0 at the masked tokens."""
    _kind(pair[0])
    test_stable_grad_matches_high_precision_oracle.hypothesis.inner_test(pair, loss)


@given(saturated_masked, st.sampled_from(LOSSES))
def test_normalized_direction_matches_oracle_masked(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """Oracle: the 50-digit mpmath gradient (masked weights 0), normalised. A mask can leave no
    gradient at all (every sequence with one allowed token, or only equal values allowed): where the
    oracle's ``∇L`` is exactly 0 the direction is undefined and ``normalized_risk_grad`` must refuse."""
    inst, W = pair
    _kind(inst)
    if _mp_norm(mp_grad(inst, W, loss)) == 0:
        event("∇L = 0 exactly (no sequence with two allowed, distinct values): refusal asserted")
        with pytest.raises(A.NumericalError, match="exactly zero"):
            A.normalized_risk_grad(inst, W, loss=loss)
        return
    test_normalized_direction_matches_oracle.hypothesis.inner_test(pair, loss)


@given(moderate_masked, st.sampled_from(LOSSES))
def test_textbook_grad_equals_torch_autograd_at_moderate_w_masked(
    pair: tuple[Instance, np.ndarray], loss: str
) -> None:
    """Oracle: torch autograd with ``−inf`` masked logits."""
    _kind(pair[0])
    test_textbook_grad_equals_torch_autograd_at_moderate_w.hypothesis.inner_test(pair, loss)


@given(
    S.instances_and_weights(
        S.instances(family="uniform", bound=4.0, d=(1, 3), masked=True)
        | S.instances(family="gaussian", masked=True)
        | S.instances(family="gaussian", duplicates=True, near_parallel=True, masked=True)
        | SEQ,
        scale=(1e-2, 2.0),
    ),
    st.sampled_from(LOSSES),
    st.floats(1e-3, 1e3),
)
def test_normalized_direction_equals_normalized_gradient_masked(
    pair: tuple[Instance, np.ndarray], loss: str, scale: float
) -> None:
    """Oracle: the 50-digit mpmath gradient (masked weights 0); masks aimed at tie partners and the
    score maximiser, and sequence-to-sequence instances."""
    _kind(pair[0])
    test_normalized_direction_equals_normalized_gradient.hypothesis.inner_test(pair, loss, scale)
