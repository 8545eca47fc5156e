"""Edge cases of `lipschitz_bound` and its Jacobian helpers, each against an independent oracle.

Added for mutation testing of `attnsvm/lipschitz.py` (issue 13 §4): every test pins a documented
behaviour that an existing test left open.

Oracles: Jacobians of tiny hand-built instances derived by hand (``∂f_i/∂W = Σ_t s_it(a_it − f_i) x_it z_iᵀ``
for the output, ``f_i = Σ_t s_it a_it``, ``a_it = vᵀx_it``; at ``W = 0`` the weights are uniform) and
evaluated in mpmath from the exact input doubles; the documented rounding floor of the Jacobian norm
(``attnsvm.lipschitz.JACOBIAN_ULPS``) and the documented rounding allowance of the output bound
(``lipschitz_bound``'s docstring); the documented agreement of the estimate's two evaluation paths; the
scale contract's error text.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.lipschitz import (
    JACOBIAN_ULPS,
    bound_rounding_rtol,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
)

EPS = float(np.finfo(np.float64).eps)
#: mpmath working precision of the hand-derived values: 40 digits, far beyond float64's 16.
DPS = 40
#: A singular value from a backward-stable SVD of an ``m × p`` matrix is within ``~(m + p)·eps``
#: relative of exact; 8 ulps of headroom per dimension (as in tests/test_lipschitz_edges.py).
SVD_ULPS = 8.0
#: Search budget of the estimates here (small: each test stays well under a second).
FAST = {"samples": 4, "steps": 2, "starts": 1}


def svd_rtol(inst: A.Instance) -> float:
    return SVD_ULPS * (inst.n * inst.T + inst.d**2) * EPS


def mp_output_jacobian_at_zero(inst: A.Instance) -> mpmath.mpf:
    """``||J(0)||₂`` of ``W ↦ f(W) ∈ Rⁿ`` (softmax or normalized-linear: both have uniform weights and
    ``r = φ'/φ = 1`` at ``W = 0``) from its definition, in mpmath from the exact input doubles: row ``i`` of
    ``J`` is ``vec(Σ_t (1/T)(a_it − f_i) x_it z_iᵀ)`` with ``a_it = vᵀx_it``, ``f_i`` their mean."""
    n, T, d = inst.shape
    with mpmath.workdps(DPS):
        v = [mpmath.mpf(float(c)) for c in inst.v]
        rows = []
        for i in range(n):
            x = [[mpmath.mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
            z = [mpmath.mpf(float(c)) for c in inst.z[i]]
            a = [mpmath.fsum(p * q for p, q in zip(v, x[t], strict=True)) for t in range(T)]
            f = mpmath.fsum(a) / T
            g = [mpmath.fsum((a[t] - f) * x[t][j] for t in range(T)) / T for j in range(d)]
            rows.append([g[j] * z[k] for j in range(d) for k in range(d)])
        return max(mpmath.svd_r(mpmath.matrix(rows), compute_uv=False))


def documented_output_floor(inst: A.Instance, W: np.ndarray) -> float:
    """The absolute rounding floor of an output Jacobian norm of ONE sequence, as documented at
    ``attnsvm.lipschitz.JACOBIAN_ULPS``: ``JACOBIAN_ULPS·(nT + d² + T + 2 + 2d(1 + |l|))·eps·||𝓛||_F`` times
    the values' scale ``T·max_t Σ_k |x_tk||v_k|``, with ``|l| ≤ max_t ||x_t||·||z||·||W||_F`` and
    ``||𝓛||_F = (Σ_t ||x_t||²||z||²)^½`` (the floor scales like the Jacobian under power-of-two rescaling,
    so it may be evaluated on the raw data)."""
    n, T, d = inst.shape
    assert n == 1
    c = np.linalg.norm(inst.X[0], axis=-1) * float(np.linalg.norm(inst.z[0]))
    logits = float(np.max(c)) * float(np.linalg.norm(W))
    values = T * float(np.max(np.abs(inst.X[0]) @ np.abs(inst.v)))
    return float(
        JACOBIAN_ULPS * (n * T + d * d + T + 2 + 2 * d * (1 + logits)) * EPS * np.linalg.norm(c) * values
    )


# ----------------------------------------------------------------------------- the Jacobian's rounding floor
def _split_values(delta: float) -> A.Instance:
    """``n = 1, T = 2, d = 2``: tokens ``(1, 1)`` and ``(1, −1)``, query ``(1, 0)``, ``v = (1, δ)``: the
    values ``1 ± δ`` differ by ``2δ`` next to their size 1, and by hand
    ``∂f/∂W = ½δ(x_1 − x_2)zᵀ = δ e₂e₁ᵀ`` at ``W = 0``, so ``||J(0)||₂ = δ`` (softmax and
    normalized-linear)."""
    return A.Instance(np.array([[[1.0, 1.0], [1.0, -1.0]]]), [1.0], [1.0, delta], [[1.0, 0.0]])


#: The true norm is put this factor above the documented floor: inside the float64 rounding it claims
#: to cover (the computed values ``1 ± δ`` lose ``eps/(2δ) ≈ 0.2 %`` of the difference), and below the
#: floor of any rounding budget with one more term (``1 + 1/14`` for these sizes).
JUST_ABOVE = 1.035


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_jacobian_norm_just_above_its_documented_floor_is_returned(kind: str) -> None:
    """``jacobian_norm`` refuses only at or below the documented absolute rounding floor of its float64
    computation (``documented_output_floor``); a true norm ``JUST_ABOVE`` times that floor is returned, to
    the documented accuracy (the floor plus the SVD's relative rounding). Oracle: ``||J(0)||₂ = δ`` by hand
    (``_split_values``), checked in mpmath from the definition."""
    W = np.zeros((2, 2))
    floor1 = documented_output_floor(_split_values(0.0), W)  # the floor barely depends on δ (1 + δ)
    inst = _split_values(JUST_ABOVE * floor1)
    truth = float(mp_output_jacobian_at_zero(inst))
    floor = documented_output_floor(inst, W)
    assert truth == pytest.approx(inst.v[1], rel=1e-15)
    assert 1.0 < truth / floor < 1.0 + 1.0 / 14.0
    got = jacobian_norm(inst, W, kind=kind, of="output")
    assert abs(got - truth) <= floor + svd_rtol(inst) * truth


#: ``v``'s second coordinate: the live sequence's values are ``±2^-50`` next to ``v``'s size 1.
TINY_VALUE = 2.0**-50


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_floor_of_a_sequence_is_set_by_its_own_values_not_another_sequences(kind: str) -> None:
    """Two sequences share ``v = (1, 2^-50)``. Sequence 0 has two equal tokens ``(1, 0)`` (values 1: its block
    is 0 at every ``W``); sequence 1 has tokens ``(0, ±1)``, values ``±2^-50``. Each sequence's rounding floor
    is on the scale of its own values (``JACOBIAN_ULPS``: ``T·max_t |x_it|·|v|`` per sequence), so the
    ``2^-50``-sized Jacobian of sequence 1 is resolved, not refused against sequence 0's values. Oracle: by
    hand ``∂f_1/∂W = ½·2^-50 (x_11 − x_12) z_1ᵀ``, ``||J(0)||₂ = 2^-50·||z_1||`` (mpmath, from the
    definition)."""
    X = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, -1.0]]])
    inst = A.Instance(X, [1.0, 1.0], [1.0, TINY_VALUE], [[1.0, 0.0], [0.75, 0.5]])
    truth = float(mp_output_jacobian_at_zero(inst))
    assert truth == pytest.approx(TINY_VALUE * math.hypot(0.75, 0.5), rel=1e-15)
    got = jacobian_norm(inst, np.zeros((2, 2)), kind=kind, of="output")
    assert abs(got - truth) <= svd_rtol(inst) * truth


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_jacobian_is_never_a_silent_zero_when_the_values_differ_below_the_rescaled_range(
    kind: str,
) -> None:
    """Tokens ``(1, ±2^-1074)`` (they differ only in the smallest subnormal), ``v = (0, 2^1000)``, query
    ``(2^1000, 0)``: the values ``±2^-74`` differ, and by hand ``∂f/∂W = ½·2^-74 (x_1 − x_2)zᵀ`` has the one
    entry ``2^-75·2^-1073·2^1000 = 2^-148`` at ``W = 0``, a normal double. On the sequence's own scale the
    difference ``2^-1075`` rounds to 0, so the computed Jacobian is 0 and so is its rounding floor; the scale
    contract then allows a NumericalError, never the value 0 (the truth is not 0)."""
    X = np.array([[[1.0, 2.0**-1074], [1.0, -(2.0**-1074)]]])
    inst = A.Instance(X, [1.0], [0.0, 2.0**1000], [[2.0**1000, 0.0]])
    truth = float(mp_output_jacobian_at_zero(inst))
    assert truth == 2.0**-148
    try:
        got = jacobian_norm(inst, np.zeros((2, 2)), kind=kind, of="output")
    except NumericalError:
        return  # allowed: the value cannot be resolved on the rescaled data
    assert abs(got - truth) <= svd_rtol(inst) * truth


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_jacobian_ignores_a_huge_sequence_whose_values_are_all_equal(kind: str) -> None:
    """Sequence 0 has tokens ``(±2^200, 1)``: different tokens but, with ``v = (0, 1)``, equal values, so its
    output block is 0 at every ``W`` (``_zero_sequences``: ``v_k = 0`` or ``x_itk = x_i0k`` per coordinate)
    and its ``2^400``-sized rounding must not swamp sequence 1 (tokens ``(0, ±1)``, values ``±1``). Oracle: by
    hand ``||J(0)||₂ = ||½(x_11 − x_12)|| ||z_1|| = ||z_1||`` (mpmath from the definition)."""
    X = np.array([[[2.0**200, 1.0], [-(2.0**200), 1.0]], [[0.0, 1.0], [0.0, -1.0]]])
    inst = A.Instance(X, [1.0, 1.0], [0.0, 1.0], [[0.5, 0.5], [0.75, 0.0]])
    truth = float(mp_output_jacobian_at_zero(inst))
    assert truth == 0.75
    got = jacobian_norm(inst, np.zeros((2, 2)), kind=kind, of="output")
    assert abs(got - truth) <= svd_rtol(inst) * truth


def test_overflowing_logits_message_names_the_sequence_that_overflows() -> None:
    """Sequence 0 of size ~1, sequence 1 with tokens and query ``0.75·2^600``: at ``W = I`` sequence 1's
    logits ``x_1tᵀ W z_1`` are ~``2^1200`` (beyond float64) while sequence 0's are O(1). The error must
    give the size of the overflowing logits, ``max|W|·max|x|·max|z|`` of sequence 1
    (``0.5625·2^1200 ≈ 1e+361``, by hand), not those of sequence 0. Oracle: the documented
    message text of the scale contract."""
    X = np.array([[[0.75, 0.5], [0.5, -0.75]], [[0.75, 0.5], [-0.5, 0.75]]])
    X[1] = np.ldexp(X[1], 600)
    z = np.array([[0.75, 0.25], [0.75, -0.5]])
    z[1] = np.ldexp(z[1], 600)
    inst = A.Instance(X, [1.0, 1.0], [1.0, 0.5], z)
    assert round(math.log10(0.5625) + 1200 * math.log10(2.0)) == 361
    for kind in ("softmax", "normalized_linear"):
        with pytest.raises(NumericalError) as exc:
            jacobian_norm(inst, np.eye(2), kind=kind)
        assert str(exc.value) == (
            f"the {kind} weights Jacobian is not finite: the largest entry of W on the data's scale, "
            "W·max|x|·max|z| (the logits' size), is about 1e+361: it overflows float64's normal range "
            "[2.2e-308, 1.8e308]. Use a smaller W or rescale the data"
        )


# ----------------------------------------------------------------------------- the estimate's search value
#: ``search_value`` (``λ_max(D G Dᵀ)^½`` on the rescaled data, scale put back) and ``value`` (the full
#: Jacobian's SVD) are two float64 evaluations of the same norm: each within ``~(nT + d²)·eps`` relative
#: (SVD_ULPS per dimension) plus the Gram's ``(8m + m(2d + 2))·eps`` (``bound_rounding_rtol``).
@pytest.mark.parametrize("of", ["weights", "output"])
@pytest.mark.parametrize(("jx", "jz", "jv"), [(7, -3, 5), (-9, 4, -6), (40, 0, 300)])
def test_estimate_search_value_agrees_with_its_value_on_power_of_two_scaled_data(
    of: str, jx: int, jz: int, jv: int
) -> None:
    """``LipschitzEstimate.search_value`` is documented as ``||J(W)||₂`` at the returned ``W`` by the
    factorised path of the search, ``value`` the same norm by the full Jacobian's SVD: two independent
    evaluations that must agree, also when ``X``, ``z`` and ``v`` are scaled by different powers of two (the
    search runs on rescaled data and puts the scale back, ``2^(eX+ez)`` for weights and ``2^(2eX+ez+ev)`` for
    outputs). Oracle: agreement of the two paths to their rounding."""
    base = A.random_instance(2, 3, 2, seed=5, family="gaussian")
    inst = A.Instance(np.ldexp(base.X, jx), base.Y, np.ldexp(base.v, jv), np.ldexp(base.z, jz))
    for kind in ("softmax", "normalized_linear", "linear"):
        e = lipschitz_estimate(inst, kind=kind, radius=2.0 ** -(jx + jz), of=of, **FAST)
        assert e.value > 0.0
        tol = svd_rtol(inst) + bound_rounding_rtol(inst)
        assert abs(e.search_value - e.value) <= tol * e.value, (kind, e.search_value, e.value)


# ----------------------------------------------------------------------------- the output bound's factors
#: Radius of the "tiny ball": the max-weight bound is ``p = ¼·(1 + O(R·max δ·||z||))`` there, i.e. within
#: ``2^-38`` relative of ``1/T`` for the tokens below (``δ ≤ 2``, ``||z|| = 1``).
TINY_RADIUS = 2.0**-40
#: The bound's excess over the attained ``||J(0)||₂`` on the tight instance: the O(R) of ``p`` (``2^-39``
#: relative in ``√p``), the documented rounding allowances (``bound_rounding_rtol`` = 48 eps, the values'
#: 4(d + 2)·eps relative to the spread, ``p`` rounded up by ``_log_weight_ulps·eps·(1 + |exponent|)`` ≈
#: 92 eps in the log) and the SVD's ~8 ulps: all far below 1e-9, and far below a loose factor (√2).
TIGHT_RTOL = 1e-9


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_bound_is_tight_on_alternating_values_in_a_tiny_ball(kind: str) -> None:
    """``T = 4``, ``d = 1``: tokens ``1, −1, 1, −1``, query 1, ``v = 1``. The documented factor
    ``κ = min(√2/4, √p/2)·(max a − min a)`` with ``p → 1/T = ¼`` in a tiny ball is ``¼·2 = ½``, and
    ``||𝓛||₂ = ||z||·||x|| = 2``: the bound is 1. The Popoviciu step is an equality here (every value at
    distance 1 from their mean 0), so the bound equals the attained ``||J(0)||₂ = ¼·Σ_t x_t² = 1`` (by hand,
    mpmath from the definition) up to O(R) and rounding. Oracle: the attained Jacobian; the bound must be
    above it (soundness) and within ``TIGHT_RTOL`` of it (the √p/2 factor, not a looser one)."""
    inst = A.Instance(np.array([[[1.0], [-1.0], [1.0], [-1.0]]]), [1.0], [1.0], [[1.0]])
    attained = float(mp_output_jacobian_at_zero(inst))
    assert attained == 1.0
    b = float(lipschitz_bound(inst, kind=kind, radius=TINY_RADIUS, of="output"))
    assert attained <= b <= attained * (1.0 + TIGHT_RTOL)


#: The spread's rounding allowance of the output factor, as documented in ``lipschitz_bound``:
#: ``4(d + 2)·eps·max_t ||x_it||·||v||`` per sequence (``||x_it||`` the token's norm).
def documented_values_allowance(inst: A.Instance) -> np.ndarray:
    d = inst.d
    return 4 * (d + 2) * EPS * np.max(np.linalg.norm(inst.X, axis=-1), axis=1) * float(np.linalg.norm(inst.v))


#: One ulp of headroom per rounded operation of the product ``κ_max·||𝓛||₂·(1 + rtol)`` (a handful).
PRODUCT_ULPS = 8


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_bound_of_equal_values_is_only_the_documented_rounding_allowance(kind: str) -> None:
    """``T = 4`` equal tokens ``0.75`` (``d = 1``), ``v = 0.5``, query ``0.75``: the values are all equal, so
    the output is constant in ``W`` and the exact constant is 0. The bound may be positive only by the
    documented rounding allowance of the values, ``κ ≤ (√2/4)·4(d + 2)·eps·max||x||·||v||`` (the spread itself
    is 0), times ``||𝓛||₂ = |z|·||x|| = 0.75·1.5`` and ``1 + rounding_rtol``. Oracle: the exact constant 0 and
    the documented allowance (evaluated on the token norms, by hand)."""
    inst = A.Instance(np.full((1, 4, 1), 0.75), [1.0], [0.5], [[0.75]])
    b = lipschitz_bound(inst, kind=kind, radius=TINY_RADIUS, of="output")
    limit = (
        math.sqrt(2.0)
        / 4.0
        * float(documented_values_allowance(inst)[0])
        * (0.75 * 1.5)
        * (1.0 + bound_rounding_rtol(inst))
        * (1.0 + PRODUCT_ULPS * EPS)
    )
    assert 0.0 <= b.value <= limit


# ----------------------------------------------------------------------------- the bound's range and logs
#: ``lipschitz_bound``'s rounding allowance for ``n = 1, T = 2, d = 1``: ``(8m + m(2d + 2))·eps``, ``m = 2``.
RTOL_1_2_1 = 24 * EPS


def test_bound_whose_nominal_is_just_below_the_normal_range_is_refused() -> None:
    """Token ``2^-511·(1 − 2^-49)`` and 0, query ``2^-511`` (``d = 1``): the linear weights constant is
    ``||𝓛||₂ = 2^-1022·(1 − 8 eps)`` (by hand), a subnormal ``nominal``, while
    ``value = nominal·(1 + 24 eps)`` is just above ``2^-1022``. ``LipschitzBound`` documents both
    ``value`` and ``nominal`` as normal doubles, so the bound is refused with the scale contract's error
    rather than returned with a subnormal nominal (whose last digits are lost). Oracle: the
    exact constant by hand, and the documented error text."""
    a, b = 2.0**-511 * (1 - 2.0**-49), 2.0**-511
    inst = A.Instance(np.array([[[a], [0.0]]]), [1.0], [1.0], [[b]])
    assert bound_rounding_rtol(inst) == RTOL_1_2_1
    with mpmath.workdps(DPS):
        exact = mpmath.mpf(a) * mpmath.mpf(b)
        assert exact < mpmath.mpf(2) ** -1022 <= exact * (1 + mpmath.mpf(RTOL_1_2_1))
    with pytest.raises(NumericalError) as exc:
        lipschitz_bound(inst, kind="linear")
    assert str(exc.value).startswith(
        "the linear weights Lipschitz bound (radius 1) is about 1e-308: it underflows float64's normal range"
    )


@pytest.mark.parametrize(
    ("kind", "of"),
    [(k, o) for k in ("softmax", "linear", "normalized_linear") for o in ("weights", "output")],
)
def test_bound_log_candidates_are_the_logs_of_the_certified_candidates(kind: str, of: str) -> None:
    """``LipschitzBound.log_candidates`` is documented as ``ln`` of each candidate (``−inf`` only for a 0
    candidate). On the tight instance of ``test_output_bound_is_tight_on_alternating_values_in_a_tiny_ball``
    every candidate is positive and O(1), so each log is the log of the candidate's value, and the smallest
    is ``ln(nominal)``. For the linear weights the single candidate is ``||𝓛||₂ = 2`` (by hand). Oracle: the
    candidates' values, and the hand-derived ``||𝓛||₂``."""
    inst = A.Instance(np.array([[[1.0], [-1.0], [1.0], [-1.0]]]), [1.0], [1.0], [[1.0]])
    b = lipschitz_bound(inst, kind=kind, radius=TINY_RADIUS, of=of)
    assert set(b.log_candidates) == set(b.candidates)
    for name, val in b.candidates.items():
        assert val > 0.0
        assert b.log_candidates[name] == pytest.approx(math.log(val), abs=4 * EPS)
    assert min(b.log_candidates.values()) == pytest.approx(math.log(b.nominal), abs=4 * EPS)
    if (kind, of) == ("linear", "weights"):
        assert b.log_candidates["||L||_2 (exact)"] == pytest.approx(math.log(2.0), abs=4 * EPS)


# ----------------------------------------------------------------------------- the floor's two sides
def documented_sequence_floor(inst: A.Instance, i: int) -> float:
    """The documented absolute rounding floor (``attnsvm.lipschitz.JACOBIAN_ULPS``) of sequence ``i``'s output
    block at ``W = 0`` in an ``n``-sequence instance: ``JACOBIAN_ULPS·(nT + d² + T + 2 + 2d)·eps·||𝓛_i||_F``
    times ``T·max_t Σ_k |x_itk||v_k|``, with ``||𝓛_i||_F = (Σ_t ||x_it||²||z_i||²)^½`` (sequence ``i``'s own
    logit map; ``nT`` counts every row of ``J``). Evaluated on the raw data: it scales like the block."""
    n, T, d = inst.shape
    lf = float(np.linalg.norm(np.linalg.norm(inst.X[i], axis=-1))) * float(np.linalg.norm(inst.z[i]))
    values = T * float(np.max(np.abs(inst.X[i]) @ np.abs(inst.v)))
    return float(JACOBIAN_ULPS * (n * T + d * d + T + 2 + 2 * d) * EPS * lf * values)


def _split_values_query(delta: float, q: float) -> A.Instance:
    """``_split_values(δ)`` with the query ``(q, 0)``: by hand ``||J(0)||₂ = δ·q`` (the block is ``δ e₂(q e₁)ᵀ``)."""
    return A.Instance(np.array([[[1.0, 1.0], [1.0, -1.0]]]), [1.0], [1.0, delta], [[q, 0.0]])


#: The true norm is put this factor BELOW the documented floor: well outside the values' own rounding
#: (``eps/(2δ) ≈ 0.2 %`` of the norm here), so the computed norm is below the floor and must be refused.
JUST_BELOW = 0.85


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize("mantissa", [0.52, 0.75, 0.97])
def test_output_jacobian_norm_below_its_documented_floor_is_refused(kind: str, mantissa: float) -> None:
    """``jacobian_norm`` documents that a value at or below its absolute rounding floor (``JACOBIAN_ULPS``)
    raises rather than returning an unresolved number. The true norm is put ``JUST_BELOW`` times the
    documented floor, with the query's size chosen so that the floor's mantissa (its place in its binade:
    the floor is compared on a power-of-two scale) is ``mantissa``; the call must raise the documented
    rounding-level error. Oracle: ``||J(0)||₂ = δ·q`` by hand (``_split_values_query``), checked in mpmath from
    the definition, and the documented floor evaluated on the raw data."""
    W = np.zeros((2, 2))
    q = mantissa / math.frexp(documented_output_floor(_split_values_query(0.0, 1.0), W))[0]
    floor0 = documented_output_floor(_split_values_query(0.0, q), W)
    inst = _split_values_query(JUST_BELOW * floor0 / q, q)
    truth = float(mp_output_jacobian_at_zero(inst))
    floor = documented_output_floor(inst, W)
    assert math.frexp(floor)[0] == pytest.approx(mantissa, rel=1e-9)
    assert truth / floor == pytest.approx(JUST_BELOW, rel=1e-9)
    with pytest.raises(NumericalError, match="below the rounding level of its float64 computation"):
        jacobian_norm(inst, W, kind=kind, of="output")


#: Sequence 1 of the two-sequence instance below is ``2^-TINY_SEQUENCE_LOG2`` times sequence 0 in ``X``: its
#: block (and floor) is ``2^-1200`` times sequence 0's, below every float64 rounding of the stacked norm.
TINY_SEQUENCE_LOG2 = 600


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_floor_is_set_by_each_sequences_own_logit_map_not_the_whole_instances(kind: str) -> None:
    """Sequence 0 is ``_split_values`` (``||J_0(0)||₂ = δ``), put ``JUST_ABOVE`` its documented floor; sequence 1
    has the same tokens times ``2^-600`` (values ``2^-600(1 ± δ₁)``, a live block ``~2^-1200`` times smaller).
    The documented floor is summed in quadrature over the sequences, each with its OWN ``||𝓛_i||_F``
    (``documented_sequence_floor``): sequence 1 adds nothing at float64 precision, so the norm is resolved and
    returned to the documented accuracy (a floor built on both sequences' logit maps would be ``√2`` times
    larger and refuse). Oracle: the stacked ``||J(0)||₂`` in mpmath from the definition (= δ to 1e-15 by hand)
    and the documented floor."""
    W = np.zeros((2, 2))
    X = np.array([[[1.0, 1.0], [1.0, -1.0]], [[1.0, 1.0], [1.0, -1.0]]])
    X[1] = np.ldexp(X[1], -TINY_SEQUENCE_LOG2)
    probe = A.Instance(X, [1.0, 1.0], [1.0, 0.0], [[1.0, 0.0], [1.0, 0.0]])
    delta = JUST_ABOVE * documented_sequence_floor(probe, 0)
    inst = A.Instance(X, [1.0, 1.0], [1.0, delta], [[1.0, 0.0], [1.0, 0.0]])
    truth = float(mp_output_jacobian_at_zero(inst))
    floor = math.hypot(documented_sequence_floor(inst, 0), documented_sequence_floor(inst, 1))
    assert truth == pytest.approx(delta, rel=1e-15)
    assert 1.0 < truth / floor < math.sqrt(2.0)
    got = jacobian_norm(inst, W, kind=kind, of="output")
    assert abs(got - truth) <= floor + svd_rtol(inst) * truth


# ----------------------------------------------------------------------------- the caller's underflow trap
def _underflowing_products() -> A.Instance:
    """Tokens ``(1, 2^-600)`` and ``(−1, 2^-600)``, ``v = (1, 2^-600)``, query ``(0.75, 0)``: the products
    ``x_t2·v_2 = 2^-1200`` underflow (negligible next to ``x_t1·v_1 = ±1``); by hand ``∂f/∂W = ½(a_1 − a_2)·
    ½(x_1 − x_2) zᵀ`` at ``W = 0`` is the single entry ``½·2·½·2·0.75 = 0.75`` (``a_t = ±1 + 2^-1200``)."""
    X = np.array([[[1.0, 2.0**-600], [-1.0, 2.0**-600]]])
    return A.Instance(X, [1.0], [1.0, 2.0**-600], [[0.75, 0.0]])


def _far_apart_sequences() -> A.Instance:
    """``_split_values(½)`` twice, the second sequence's tokens times ``2^-600``: its block is ``2^-1200``
    times the first's and underflows when the blocks are put on the first's scale. By hand
    ``||J(0)||₂ = δ = ½`` (the second block adds ``2^-2400`` relative to its square)."""
    X = np.array([[[1.0, 1.0], [1.0, -1.0]], [[1.0, 1.0], [1.0, -1.0]]])
    X[1] = np.ldexp(X[1], -TINY_SEQUENCE_LOG2)
    return A.Instance(X, [1.0, 1.0], [1.0, 0.5], [[1.0, 0.0], [1.0, 0.0]])


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize(
    ("make", "exact"),
    [(_underflowing_products, 0.75), (_far_apart_sequences, 0.5)],
    ids=["products", "stack"],
)
def test_output_jacobian_norm_is_unchanged_by_a_callers_underflow_trap(
    kind: str, make: Callable[[], A.Instance], exact: float
) -> None:
    """``jacobian_norm`` of the output on data whose intermediates underflow harmlessly (the values' products
    ``|x_tk||v_k|`` of the rounding floor, or a block ``2^-1200`` below the largest when the blocks are stacked
    on a common scale) must answer under the caller's ``np.errstate(under="raise")`` exactly as under the
    default state, never with numpy's ``FloatingPointError``. Oracle: numpy's floating-point state is not an
    input (bit-identical results), and the hand-derived ``||J(0)||₂`` (checked in mpmath from the definition)."""
    inst = make()
    W = np.zeros((2, 2))
    assert float(mp_output_jacobian_at_zero(inst)) == pytest.approx(exact, rel=1e-15)
    plain = jacobian_norm(inst, W, kind=kind, of="output")
    with np.errstate(under="raise"):
        trapped = jacobian_norm(inst, W, kind=kind, of="output")
    assert trapped == plain
    assert abs(plain - exact) <= svd_rtol(inst) * exact
