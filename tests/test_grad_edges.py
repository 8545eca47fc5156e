"""`attnsvm.model._grad` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.model._grad` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.model._grad import GradientRangeError
from attnsvm.scaling import FLOAT_TINY

#: mpmath working precision of the oracle: the gradients below are ~2^-1000 with weights down to
#: e^-735, far inside mpmath's exponent range; 50 digits leave ≥ 30 beyond float64's 16.
ORACLE_DPS = 50
#: The logit gap of the instances below (their runner-up weight is ``e^{-734.5}`` ≈ 2^-1060, subnormal).
_GAP = 734.5
_EPS = float(np.finfo(np.float64).eps)
#: Normwise relative accuracy of a returned gradient on these tiny (n = 1, T = 2, d = 2) instances: the
#: module docstring's bound over ||∇L|| without cancellation, ``(nT + T + d)·eps + 2·δl`` with the logits'
#: rounding ``δl = d²·eps·max|l|`` (|l| ≤ _GAP: ≈ 6.5e-13, it dominates), times 2 of headroom (≈ 2.6e-12).
#: A gradient built from the subnormal weight itself (≤ 14 significant bits) misses it by ~1e7.
GRAD_RTOL = 2 * ((2 + 2 + 2) * _EPS + 2 * 4 * _EPS * _GAP)


def mp_grad(inst: A.Instance, W: np.ndarray, loss: str) -> np.ndarray:
    """``∇L`` in ``ORACLE_DPS``-digit mpmath from the exact float64 inputs, returned as an object array.

    ``∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it c_it x_it z_iᵀ`` with ``c_it = Σ_u s_iu (a_it − a_iu)``.
    """
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        n, T, d = inst.shape
        G = np.array([[mpf(0)] * d for _ in range(d)], dtype=object)
        for i in range(n):
            z = [mpf(float(c)) for c in inst.z[i]]
            xs = [[mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
            Wz = [mpmath.fsum(mpf(float(W[k, j])) * z[j] for j in range(d)) for k in range(d)]
            lg = [mpmath.fsum(x[k] * Wz[k] for k in range(d)) for x in xs]
            a = [mpmath.fsum(x[k] * mpf(float(inst.v[k])) for k in range(d)) for x in xs]
            m = max(lg)
            e = [mpmath.exp(li - m) for li in lg]
            s = [ei / mpmath.fsum(e) for ei in e]
            f = mpmath.fsum(si * ai for si, ai in zip(s, a, strict=True))
            u = mpf(float(inst.Y[i])) * f
            dl = {"logistic": -1 / (1 + mpmath.exp(u)), "correlation": mpf(-1)}[loss]
            for t in range(T):
                c = mpmath.fsum(su * (a[t] - au) for su, au in zip(s, a, strict=True))
                w = dl * mpf(float(inst.Y[i])) * s[t] * c / n
                for k in range(d):
                    for j in range(d):
                        G[k, j] += w * xs[t][k] * z[j]
        return G


def _rel_err(G: np.ndarray, exact: np.ndarray) -> float:
    with mpmath.workdps(ORACLE_DPS):
        num = mpmath.sqrt(
            mpmath.fsum((mpmath.mpf(float(g)) - e) ** 2 for g, e in zip(G.flat, exact.flat, strict=True))
        )
        den = mpmath.sqrt(mpmath.fsum(e**2 for e in exact.flat))
        return float(num / den)


def _two_tokens(x1, x2, v, z, W10: float) -> tuple[A.Instance, np.ndarray]:
    """n = 1, T = 2, d = 2, label +1; ``W = [[0, 0], [W10, 0]]`` (so ``l_t = x_t1·W10·z_0``)."""
    X = np.array([[x1, x2]], dtype=np.float64)
    W = np.array([[0.0, 0.0], [W10, 0.0]])
    return A.Instance(X, np.array([1.0]), np.array(v, dtype=np.float64), np.array([z], dtype=np.float64)), W


# A runner-up weight s_2 = e^{-734.5} ≈ 2^-1060 is subnormal (≤ 14 significant bits): the plain
# product form loses digits there, while ||∇L|| itself is a normal double. The three scalings put
# the data's size in different places (tokens, query, values), where the plain path's underflow
# screen must see it: ``max|x|`` large, ``max|z|`` large with small tokens, values ±2^60.
_UNDERFLOW_CASES = {
    "large tokens": _two_tokens(
        (2.0**50, 0.0), (0.0, 2.0**50), (2.0**-50, 0.0), (2.0**50, 0.0), -_GAP * 2.0**-100
    ),
    "small tokens, large query": _two_tokens(
        (2.0**-4, 0.0), (0.0, 2.0**-4), (2.0**4, 0.0), (2.0**100, 0.0), -_GAP * 2.0**-96
    ),
    "values of both signs": _two_tokens((1.0, 0.0), (0.0, 1.0), (2.0**60, -(2.0**60)), (1.0, 0.0), -_GAP),
}


@pytest.mark.parametrize("case", sorted(_UNDERFLOW_CASES))
def test_risk_grad_is_accurate_when_a_weight_is_subnormal(case: str) -> None:
    """A subnormal softmax weight never costs the returned gradient its digits (the scale contract).

    Oracle: the 50-digit mpmath gradient (centred form). ``||∇L||`` is normal here, so it must be
    returned to the documented accuracy; the plain product with the subnormal weight would be off by
    up to 2^-14.
    """
    inst, W = _UNDERFLOW_CASES[case]
    exact = mp_grad(inst, W, "correlation")
    G = A.risk_grad(inst, W, loss="correlation")
    assert float(np.max(np.abs(G))) >= FLOAT_TINY  # normal: returned, not refused
    assert _rel_err(G, exact) <= GRAD_RTOL


def test_values_rounding_level_is_refused_not_returned() -> None:
    """A gradient made only of the values' rounding is refused ("rounding level"), never returned.

    Oracle: exact rational arithmetic. ``v = 2^10·(1, 1)``, ``x_1 = (1, ¾·2^-52)``, ``x_2 = (½, ½)``:
    the exact values differ by ``¾·2^-42`` but their float64 products by ``2^-42``, so every centred
    term ``a_1 − a_2`` (hence ``∇L``) computed in float64 is 33 % off; the refusal rule of the module
    docstring must catch it whatever the size of the query (``2^80``: entries ≫ 1).
    """
    from fractions import Fraction

    inst, W = _two_tokens((1.0, 0.75 * 2.0**-52), (0.5, 0.5), (2.0**10, 2.0**10), (2.0**80, 0.0), 0.0)
    exact = [
        sum(Fraction(float(x)) * Fraction(float(vk)) for x, vk in zip(row, inst.v, strict=True))
        for row in inst.X[0]
    ]
    rounded = inst.X[0] @ inst.v
    true_gap = exact[0] - exact[1]
    assert abs(Fraction(float(rounded[0] - rounded[1])) - true_gap) / true_gap >= Fraction(1, 4)
    with pytest.raises(NumericalError, match="rounding level"):
        A.risk_grad(inst, W, loss="correlation")
    with pytest.raises(NumericalError, match="rounding level"):
        A.normalized_risk_grad(inst, W, loss="correlation")


def test_undetermined_loss_derivative_is_refused_with_more_features_than_tokens() -> None:
    """``f = Σ s a`` known only to ±10 (values ±2^53 cancel) leaves ``ℓ'(Y f)`` without a digit: refused.

    Oracle: the documented bound ``δf = (T + d)·eps·Σ_t s_t|a_t|`` (W = 0: no logit rounding) =
    5·2^-52·2^53 = 10 > 1, with the documented message. ``T = 2 < d = 3``.
    """
    X = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    inst = A.Instance(
        X, np.array([1.0]), np.array([2.0**53, -(2.0**53) + 2.0, 0.0]), np.array([[1.0, 0.0, 0.0]])
    )
    W = np.zeros((3, 3))
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError, match=r"f_0 .* known only to ±10 .*undetermined"):
            fn(inst, W, loss="logistic")


def test_distinct_tokens_with_equal_values_give_an_exact_zero_gradient() -> None:
    """Tokens that differ but have exactly equal values ``vᵀx``: every ``a_it − f_i`` is 0, so ``∇L = 0``.

    Oracle: hand-derived (``vᵀx_1 = vᵀx_2 = 2`` exactly, hence ``f = 2`` and each centred term is 0
    for every W): ``risk_grad`` returns exact zeros and ``normalized_risk_grad`` says the gradient is
    exactly zero (not "rounding level").
    """
    inst, _ = _two_tokens((1.0, 0.0), (1.0, 3.0), (2.0, 0.0), (1.0, 1.0), 0.0)
    W = np.array([[0.3, -1.2], [0.7, 2.5]])
    G = A.risk_grad(inst, W)
    assert G.shape == (2, 2) and np.all(G == 0.0)
    with pytest.raises(NumericalError, match="exactly zero"):
        A.normalized_risk_grad(inst, W)


def test_overflowed_logit_gap_beside_a_sequence_without_terms_is_refused_as_underflow() -> None:
    """A logit gap of 2e308 (weight ``e^{-2e308}``, not a double even in logs) next to a sequence whose
    query is 0: ``∇L ≠ 0`` but ``log||∇L|| ≈ −2e308``: refused as an underflow, never 0.

    Oracle: hand-derived size ``||∇L|| ≤ e^{−2e308}·|a_1 − a_2|·||x||·||z||`` and the documented
    :class:`GradientRangeError` (``log_norm = −inf``); the zero-query sequence contributes nothing.
    """
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    z = np.array([[1.0, 0.0], [0.0, 0.0]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([1.0, -1.0]), z)
    W = np.array([[1e308, 0.0], [-1e308, 0.0]])  # logits (1e308, −1e308) in sequence 0, 0 in sequence 1
    with pytest.raises(GradientRangeError, match="1.8e308") as ei:
        A.risk_grad(inst, W)
    assert ei.value.log_norm == -math.inf
    with pytest.raises(NumericalError, match="exceeds 1.8e308"):
        A.normalized_risk_grad(inst, W)


def test_gradient_at_the_sums_rounding_level_is_refused() -> None:
    """``||∇L|| ≤ 8·nT·eps·M`` (``M = Σ_it |w_it|·||x_it||·||z_i||``) is refused ("rounding level").

    32 copies of a sequence with label +1 against 32 with label −1 whose query is ``(1 − 2^-44)`` times
    as long: the terms cancel to ``||∇L||/M ≈ 2^-45.5``, below the documented level ``8·nT·eps = 2^-42``
    (n = 64, T = 2), with large queries (``2^100``). Oracle: ``||∇L||`` and ``M`` in exact rational
    arithmetic (W = 0: every weight is ½, the correlation loss has ``ℓ' = −1``), checked against the
    documented refusal condition, then the documented message.
    """
    from fractions import Fraction

    m, k = 32, 44
    X = np.tile(np.array([[[1.0, 0.0], [0.0, 1.0]]]), (2 * m, 1, 1))
    za, zb = 2.0**100, 2.0**100 * (1.0 - 2.0**-k)
    z = np.array([[za, 0.0]] * m + [[zb, 0.0]] * m)
    inst = A.Instance(X, np.array([1.0] * m + [-1.0] * m), np.array([1.0, 0.0]), z)
    n, T = 2 * m, 2
    # w_it = ℓ' Y s_t c_t / n with s = ½, c = ±½ (values 1 and 0): |w| = 1/(4n); ||x_t|| = 1.
    M = sum(2 * Fraction(1, 4 * n) * Fraction(abs(float(zi[0]))) for zi in z)
    # ∇L = −(1/(4n))·(x_1 − x_2)·Σ_i Y_i z_iᵀ: ||∇L||² = 2·(m (za − zb)/(4n))².
    g2 = 2 * (m * (Fraction(za) - Fraction(zb)) / (4 * n)) ** 2
    level = 8 * n * T * Fraction(_EPS) * M
    assert g2 <= level**2  # the documented refusal condition holds (exactly)
    assert 4 * g2 >= level**2 / 64  # ... and not by a wide margin: it is the sum's term that decides
    with pytest.raises(NumericalError, match="rounding level"):
        A.risk_grad(inst, np.zeros((2, 2)), loss="correlation")


#: Relative accuracy of ``_exp2``'s far branch (|x| > 700): ``r = x − p·ln 2`` carries the rounding of
#: ``p·ln 2`` and of ``ln 2`` itself, each ≤ |p|·ln 2·eps with |p| ≤ 2048 here, and ``exp``/``ldexp`` add
#: ≤ 2 ulps; 8·2048·eps (≈ 3.6e-12) is twice that sum. A wrong sign in ``r`` misses by ``e^{2|x|}``.
EXP2_RTOL = 8 * 2048 * _EPS


@pytest.mark.parametrize(("x", "j"), [(800.0, -1200), (1400.0, -2000), (-720.0, 1100), (-1200.0, 1700)])
def test_exp2_far_branch_matches_mpmath(x: float, j: int) -> None:
    """``_exp2(x, j) = e^x · 2^j`` where ``e^x`` alone over- or underflows (|x| > 700, j the other way).

    Oracle: mpmath at ``ORACLE_DPS`` digits from the exact float64 x and integer j; every case has a
    normal result (``x + j ln 2`` between −32 and 43).
    """
    from attnsvm.model._grad import _exp2

    got = _exp2(np.array([x]), np.array([j], dtype=np.int64))
    with mpmath.workdps(ORACLE_DPS):
        exact = mpmath.exp(mpmath.mpf(x)) * mpmath.mpf(2) ** j
        assert abs(mpmath.mpf(float(got[0])) - exact) <= EXP2_RTOL * exact


#: Direction accuracy on the tiny-token instance below (n = 1, T = 2, d = 2, logits O(1)): the documented
#: ``2ε`` normwise with ``ε ≲ (nT + T + d)·eps + 4·eps·(max|log s| + 360)`` (max|log s| < 2 here), i.e.
#: 2·(6 + 1448)·eps ≈ 6.5e-13; 2·GRAD_RTOL (≈ 5.2e-12) covers it. log_norm: ε absolute, the same bound.
TINY_TOKEN_TOL = 2 * GRAD_RTOL


def test_normalized_gradient_with_a_token_below_the_norm_rescale_threshold() -> None:
    """A token 1e-152 times the size of its sequence's largest (entries ≥ 2^-511: the plain log form) has
    squares near the bottom of the normal range: its norm is taken on the rescaled row
    (``NORM_SCALE_BELOW``), and the direction and ``log_norm`` are exact to the documented accuracy.

    Oracle: ``mp_grad`` (mpmath, ``ORACLE_DPS`` digits) from the exact float64 inputs.
    """
    from attnsvm.model._grad import NORM_SCALE_BELOW

    X = np.array([[[1.0, 0.5], [1e-152, 2e-152]]])
    assert 2.0**-511 < 1e-152 < NORM_SCALE_BELOW  # plain form, rescaled norm (the case under test)
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, -0.75]), np.array([[1.0, 0.5]]))
    W = np.array([[0.3, -0.2], [0.1, 0.4]])
    got = A.normalized_risk_grad(inst, W)
    exact = mp_grad(inst, W, "logistic")
    with mpmath.workdps(ORACLE_DPS):
        norm = mpmath.sqrt(mpmath.fsum(e**2 for e in exact.flat))
        assert _rel_err(got.direction, exact / norm) <= TINY_TOKEN_TOL
        assert abs(got.log_norm - float(mpmath.log(norm))) <= TINY_TOKEN_TOL
