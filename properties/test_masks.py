"""Properties of token masks: the deletion oracle on weights and on the gradient direction.

Oracle (an exact construction): a masked instance is the unmasked instance with the masked tokens
deleted, sequence by sequence. Sequence ``i`` with ``T_i ≥ 2`` allowed tokens becomes a one-sequence
:class:`Instance` of its allowed tokens (query kept); one with ``T_i = 1`` has weight 1 on its token and
no gradient term. So the masked weights are the deleted ones with exact zeros at the masked positions,
and ``∇L = (1/n) Σ_i ∇L_i`` with ``∇L_i`` the gradient of the deleted sequence ``i``; the masked direction
is compared with that combination, formed in log space from the deleted sequences' own
``normalized_risk_grad`` (exact at any saturation).

Masks are :func:`attnsvm.strategies.instance_masks` draws: at least one allowed token per sequence,
shrinking towards all-True (no token masked), and aimed at the hard cases on purpose (the masked token
is the score maximiser, its runner-up, a tie partner, the largest token or the query; a single allowed
token). Data: moderate ``W``; saturated ``W`` (runner-up weight ≤ 1e-100, so the gradient is far below
float64's range and only the log-domain direction exists); and instances scaled by powers of two over
the whole exponent range (:func:`attnsvm.strategies.scaled_instances`), with ``W`` scaled back so the
logits stay those of the unscaled instance where that ``W`` is representable.

Error model of the direction comparison: both sides are within ``ε·M̃/||∇L||`` of the truth, with
``ε = (nT+T+d)·eps + 2δl + max_i δf_i`` (``risk_grad``'s documented first-order bound: ``δl`` the
logits' rounding ``d²·eps·max Σ|x W z|``, ``δf_i`` the outputs' ``[(T+d)·eps + 2δl]·Σ_t s|a|``) and ``M̃``
the sum of the term magnitudes (computed here in log space from the deleted sequences); unit vectors of
two such gradients differ by at most twice their relative errors, hence ``4ε·M̃/||∇L||``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from _discards import Tally, bounded_discards
from hypothesis import event, given
from hypothesis import strategies as st

from attnsvm import strategies as S
from attnsvm.errors import NumericalError
from attnsvm.model import Instance, attention, log_attention, logits, normalized_risk_grad, output
from attnsvm.model._grad import signed_log_derivative
from attnsvm.model._losses import get_loss

EPS = float(np.finfo(np.float64).eps)
#: Smallest positive double: the absolute accuracy of a weight that underflows (``attention``'s bound).
SUBNORMAL = 2.0**-1074
#: Weights: each side is within ``T·eps·max|l_i| + 2δl`` relative (plus 2^−1074 absolute) of the exact
#: weights (``attention``'s bound from given logits, plus the logits' rounding ``δl = d²·eps·max Σ|x W z|``
#: (:func:`attnsvm.logits`), doubled by softmax), so they differ by at most twice that; 4 leaves a factor 2.
WEIGHT_ULPS = 4.0
#: Direction: ``4ε·M̃/||∇L||`` (module docstring) times 4 for the constant number of roundings per term
#: that the first-order bound leaves out.
DIRECTION_ULPS = 16.0
LOSSES = ("logistic", "exponential", "correlation")


def _with_mask(inst: Instance, mask: np.ndarray) -> Instance:
    return Instance(inst.X, inst.Y, inst.v, None if inst.self_attention else inst.z, mask=mask)


def _sub(inst: Instance, i: int) -> Instance | None:
    keep = inst.allowed[i]
    if keep.sum() < 2:
        return None
    return Instance(inst.X[i][keep][None], inst.Y[i : i + 1], inst.v, inst.z[i : i + 1])


@st.composite
def masked_pairs(
    draw: Any, base: st.SearchStrategy[tuple[Instance, np.ndarray]]
) -> tuple[Instance, np.ndarray]:
    inst, W = draw(base)
    return _with_mask(inst, draw(S.instance_masks(inst))), W


@st.composite
def scaled_pairs(draw: Any) -> tuple[Instance, np.ndarray]:
    """An instance with ``X, z → 2^j X, 2^j z`` and ``v → 2^jv v`` (exact, :func:`attnsvm.strategies.scaled`)
    and ``W → 2^−2j W``, so the logits are those of the unscaled instance. ``j`` ranges over every exponent
    that keeps ``X``, ``z`` and ``W`` normal (shrinking towards 0), and ``jv = −j`` where ``v`` stays normal
    (else as far as it does): the values ``vᵀx``, hence the margins, keep their size where possible (a
    margin of 1e300 leaves ``ℓ'`` undetermined in float64, which the gradient refuses, masked or not).

    (:func:`attnsvm.strategies.scaled_instances` draws the exponents without regard to ``W``: a ``W`` that
    cannot be scaled back leaves logits of 1e300, where the weights are undetermined in float64.)
    """
    inst = draw(S.instances(n=(1, 3), T=(2, 4), d=(1, 4)))
    W = draw(S.weight_matrices(inst.d, scale=(1e-2, 2.0)))
    lo, hi = S.exponent_range(inst.X, inst.z)
    lo_w, hi_w = S.exponent_range(W)
    j = draw(st.integers(max(lo, -(hi_w // 2)), min(hi, (-lo_w) // 2)))
    lo_v, hi_v = S.exponent_range(inst.v)
    jv = int(np.clip(-j, lo_v, hi_v))  # v → 2^−j v where representable: the values vᵀx keep their size
    sc = S.scaled(inst, j, j, jv)
    return _with_mask(sc, draw(S.instance_masks(sc))), np.ldexp(W, -2 * j)


moderate = masked_pairs(
    S.instances_and_weights(
        S.instances(n=(1, 3), T=(2, 5), d=(1, 4), family="gaussian", bound=3.0)
        | S.instances(n=(1, 3), T=(2, 5), d=(1, 4), family="unit"),
        scale=(1e-2, 2.0),
    )
)
#: Saturated: runner-up weight between 1e-300 and 1e-100, and below the float64 range in logs.
saturated = masked_pairs(
    S.instances_and_weights(S.feasible_instances(n=(1, 3), T=(2, 4)), runner_up=(1e-300, 1e-100))
    | S.instances_and_weights(S.feasible_instances(n=(1, 3), T=(2, 4)), log_runner_up=(-2e3, -690.0))
)
#: Sequence-to-sequence instances (causal or not, padded or not), moderate ``W``.
seq2seq = S.instances_and_weights(
    S.sequence_instances(n=(1, 2), T=(2, 3), d=(1, 3))
    | S.sequence_instances(n=(1, 2), T=(2, 3), padding=True),
    scale=(1e-2, 2.0),
)
pairs = st.one_of(moderate, saturated, scaled_pairs(), seq2seq)


@given(pairs, st.sampled_from(("softmax", "normalized_linear")))
def test_masked_weights_are_the_deleted_ones(pair: tuple[Instance, np.ndarray], kind: str) -> None:
    inst, W = pair
    try:
        s = attention(inst, W, kind=kind)
        ls = log_attention(inst, W, kind=kind)
    except NumericalError as err:  # logits beyond 1.8e308 (scaled data): the deleted problem refuses too
        event("refused: logits out of range")
        for i in range(inst.n):
            sub = _sub(inst, i)
            if sub is not None:
                try:
                    attention(sub, W, kind=kind)
                except NumericalError:
                    return
        raise AssertionError(f"masked instance refused ({err}) where every deleted sequence did not") from err
    assert np.all(s[~inst.allowed] == 0.0) and np.all(np.isneginf(ls[~inst.allowed]))
    assert np.all(np.isfinite(ls[inst.allowed]))
    for i in range(inst.n):
        keep = inst.allowed[i]
        sub = _sub(inst, i)
        if sub is None:
            assert s[i, keep][0] == 1.0 and ls[i, keep][0] == 0.0
            continue
        ref, lref = attention(sub, W, kind=kind)[0], log_attention(sub, W, kind=kind)[0]
        lsub = logits(sub, W)[0]
        # T·eps·max|l| (attention, from given logits) + 2δl (the logits' own rounding, δl = d²·eps·max Σ|x W z|:
        # the masked and the deleted logits may take different paths, plain or rescaled)
        lmag = float(np.max(np.abs(sub.X[0]) @ np.abs(W) @ np.abs(sub.z[0])))
        rel = WEIGHT_ULPS * EPS * (keep.sum() * max(1.0, float(np.max(np.abs(lsub)))) + 2 * inst.d**2 * lmag)
        assert np.all(np.abs(s[i, keep] - ref) <= rel * np.abs(ref) + 2 * SUBNORMAL), i
        assert np.all(np.abs(ls[i, keep] - lref) <= rel * np.maximum(1.0, np.abs(lref))), i


def _norm(rows: np.ndarray) -> np.ndarray:
    """Row norms without underflow of the squares (scaled data reach 1e-300)."""
    m = np.max(np.abs(rows), axis=1, keepdims=True)
    safe = np.where(m > 0, m, 1.0)
    return np.linalg.norm(rows / safe, axis=1) * safe[:, 0]


def _log_magnitude(sub: Instance, W: np.ndarray, loss: Any, n: int) -> tuple[float, float]:
    """``(log M̃_i, ε_i)`` of one deleted sequence: ``M̃_i = |ℓ'| Σ_t s_t Σ_u s_u |a_t − a_u| ||x_t|| ||z|| / n`` in
    log space (exact at any saturation) and its ``2δl + δf`` (module docstring)."""
    ls = log_attention(sub, W)[0]
    x, z = sub.X[0], sub.z[0]
    a = x @ sub.v
    with np.errstate(divide="ignore"):
        pair = ls[None, :] + np.log(np.abs(a[:, None] - a[None, :]))
        xn = np.log(_norm(x))
        lp = float(signed_log_derivative(loss, np.array([sub.Y[0] * float(output(sub, W)[0])]))[1][0])
        logc = np.logaddexp.reduce(pair, axis=1)
        terms = ls + logc + xn
        log_m = float(np.logaddexp.reduce(terms)) + float(np.log(_norm(z[None])[0])) + lp - np.log(n)
    d, T = sub.d, sub.T
    dl = d * d * EPS * float(np.max(np.abs(x) @ np.abs(W) @ np.abs(z)))
    df = ((T + d) * EPS + 2 * dl) * float(np.exp(ls) @ np.abs(a))
    return log_m, 2 * dl + df


def _direction_or_zero(sub: Instance, W: np.ndarray, loss: str) -> Any:
    """The deleted sequence's ``normalized_risk_grad``, or ``None`` when its gradient is exactly 0 (equal
    values, a zero query, ``ℓ' = 0``: no term to add) or at its rounding level (``||∇L_i|| ≤ 8·T·eps·M̃_i``:
    counted as 0, its size is within the tolerance, which includes ``M̃_i``)."""
    try:
        return normalized_risk_grad(sub, W, loss=loss)
    except NumericalError as err:
        if "exactly zero" in str(err) or "rounding level" in str(err):
            event("a deleted sequence's gradient is 0 or at rounding level")
            return None
        raise


_GRAD = Tally()


@bounded_discards(_GRAD)
@given(pairs, st.sampled_from(LOSSES))
def test_masked_gradient_direction_is_the_deleted_one(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    _GRAD.run += 1
    inst, W = pair
    lo = get_loss(loss)
    subs = [s for s in (_sub(inst, i) for i in range(inst.n)) if s is not None]
    try:
        parts = [p for p in (_direction_or_zero(s, W, loss) for s in subs) if p is not None]
        mags = [_log_magnitude(s, W, lo, inst.n) for s in subs]
    except NumericalError as err:
        # the deleted problem's own refusal (a cancelling or out-of-range sequence gradient): its
        # direction is not an oracle; the claim is about the sequences that have one
        _GRAD.discard(f"a deleted sequence refuses: {type(err).__name__}")
        return
    if not parts:  # ∇L = 0 or at rounding level in every deleted sequence: the masked direction is refused
        try:
            normalized_risk_grad(inst, W, loss=loss)
        except NumericalError:
            return
        raise AssertionError("every deleted sequence has ∇L_i = 0 (or at rounding level), the masked one not")
    top = max(p.log_norm for p in parts)
    comb = sum(np.exp(p.log_norm - top) * p.direction for p in parts) / inst.n
    cn = float(np.linalg.norm(comb))
    log_g = top + float(np.log(cn))  # log||∇L||
    log_m = float(np.logaddexp.reduce([m for m, _ in mags]))
    eps_all = (inst.n * inst.T + inst.T + inst.d) * EPS + max(e for _, e in mags)
    tol = DIRECTION_ULPS * eps_all * float(np.exp(min(log_m - log_g, 700.0)))
    try:
        nd = normalized_risk_grad(inst, W, loss=loss)
    except NumericalError as err:
        # refused at rounding level: legitimate only where the oracle says the direction is undetermined
        assert tol >= 0.5, (
            f"masked direction refused ({err}) but the deleted one is determined (tol {tol:.3g})"
        )
        _GRAD.discard("masked direction refused at rounding level (the deleted one is undetermined too)")
        return
    if tol >= 0.5:
        _GRAD.discard("direction undetermined by the error model (tolerance ≥ 0.5)")
        return
    assert np.linalg.norm(nd.direction - comb / cn) <= tol
    # log_norm also carries the rounding of its own size (a sum of logs, documented: eps·|log w|)
    assert abs(nd.log_norm - log_g) <= tol + DIRECTION_ULPS * EPS * abs(log_g)
