"""Lipschitz bounds and estimates at their edges: boundary cases, exact small instances and messages.

Each test pins one documented behaviour of :mod:`attnsvm.lipschitz` against an independent oracle
(an exact value for a hand-built instance, mpmath, scale equivariance by powers of two, or the
documented error text).
"""

from __future__ import annotations

import math
import re

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError, UnknownNameError
from attnsvm.lipschitz import (
    JACOBIAN_ULPS,
    bound_rounding_rtol,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
    logit_norm,
)

EPS = float(np.finfo(np.float64).eps)
FLOAT_MAX = float(np.finfo(np.float64).max)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")
#: The scale contract's range (attnsvm.scaling.range_error), verbatim.
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
#: A singular value from a backward-stable SVD of an ``m × p`` matrix is within ``~(m + p)·eps``
#: relative of exact; 8 ulps of headroom per dimension (as in tests/test_lipschitz.py).
SVD_ULPS = 8.0
#: Search budget of the estimates here (small: each test stays well under a second).
FAST = {"samples": 4, "steps": 2, "starts": 1}


def svd_rtol(inst: A.Instance) -> float:
    return SVD_ULPS * (inst.n * inst.T + inst.d**2) * EPS


def torch_jac_norm(inst: A.Instance, kind: str, of: str, W: np.ndarray) -> float:
    """Independent ``||J(W)||₂``: torch softmax / ``elu + 1`` on the raw data (no rescaling), ``jacrev``
    with respect to ``W`` itself, largest singular value (for data of moderate size only)."""
    X, z, v = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (inst.X, inst.z, inst.v))

    def m(Wt: torch.Tensor) -> torch.Tensor:
        lg = torch.einsum("ntd,de,ne->nt", X, Wt, z)
        if kind == "softmax":
            s = torch.softmax(lg, dim=1)
        elif kind == "linear":
            s = lg
        else:
            phi = torch.nn.functional.elu(lg) + 1.0
            s = phi / phi.sum(dim=1, keepdim=True)
        return s.reshape(-1) if of == "weights" else (s * (X @ v)).sum(dim=1)

    J = torch.func.jacrev(m)(torch.tensor(W, dtype=torch.float64))
    return float(torch.linalg.svdvals(J.reshape(J.shape[0], -1))[0])


def kron_rows(inst: A.Instance) -> np.ndarray:
    """The logit map as an explicit matrix: row ``(i, t)`` is ``z_i ⊗ x_it`` (column-major ``vec W``)."""
    return np.einsum("nj,ntk->ntjk", inst.z, inst.X).reshape(inst.n * inst.T, -1)


def mp_softmax_weights_jacobian_norm(inst: A.Instance, W: np.ndarray, dps: int = 40) -> mpmath.mpf:
    """``||J(W)||₂`` of ``W ↦ softmax weights`` from the definition, in mpmath at ``dps`` digits: logits
    ``x_itᵀ W z_i``, ``D_i = diag(s_i) − s_i s_iᵀ``, ``J = blockdiag(D_i)·𝓛`` with the rows ``z_i ⊗ x_it``,
    largest singular value (``mpmath.svd_r``). Every input double is taken exactly."""
    n, T, d = inst.shape
    with mpmath.workdps(dps):
        Wm = mpmath.matrix([[mpmath.mpf(float(W[j, k])) for k in range(d)] for j in range(d)])
        rows = []
        for i in range(n):
            zi = mpmath.matrix([mpmath.mpf(float(c)) for c in inst.z[i]])
            xs = [mpmath.matrix([mpmath.mpf(float(c)) for c in inst.X[i, t]]) for t in range(T)]
            lg = [(xs[t].T * Wm * zi)[0] for t in range(T)]
            top = max(lg)
            ex = [mpmath.exp(v - top) for v in lg]
            s = [e / mpmath.fsum(ex) for e in ex]
            L = [[zi[k] * xs[t][j] for k in range(d) for j in range(d)] for t in range(T)]
            for t in range(T):
                rows.append(
                    [
                        mpmath.fsum(((s[t] if t == u else 0) - s[t] * s[u]) * L[u][c] for u in range(T))
                        for c in range(d * d)
                    ]
                )
        return max(mpmath.svd_r(mpmath.matrix(rows), compute_uv=False))


# ----------------------------------------------------------------------------- jacobian_norm's rounding floor
def documented_floor(inst: A.Instance, W: np.ndarray) -> float:
    """The absolute rounding floor of a weights Jacobian norm on O(1) data, as documented at
    ``attnsvm.lipschitz.JACOBIAN_ULPS``: ``JACOBIAN_ULPS·(nT + d² + T + 2 + 2d(1 + |l|))·eps·||𝓛||_F`` with
    ``|l| ≤ max_it ||x_it||·||z_i||·||W||_F`` the logits' size and ``||𝓛||_F = (Σ ||x_it||²||z_i||²)^½``."""
    n, T, d = inst.shape
    c = np.linalg.norm(inst.X, axis=-1) * np.linalg.norm(inst.z, axis=1)[:, None]
    logits = float(np.max(c)) * float(np.linalg.norm(W))
    return JACOBIAN_ULPS * (n * T + d * d + T + 2 + 2 * d * (1 + logits)) * EPS * float(np.linalg.norm(c))


def near_coincident(n: int, T: int, d: int, delta: float) -> A.Instance:
    """Tokens ``0.75·1 + δ·u_t`` (a fixed pattern ``u`` in ``[−1, 1]``, rolled per sequence): every entry of
    ``X``, ``z`` and ``v`` has its largest magnitude in ``[½, 1)``, so the data are already at the scale on
    which the floor is defined (no rescaling), and the Jacobian is ``∝ δ``."""
    t, k = np.arange(T)[:, None], np.arange(d)[None, :]
    u = ((3 * t + 5 * k + 1) % 7 - 3.0) / 3.0
    X = np.stack([0.75 + delta * np.roll(u, i, axis=0) for i in range(n)])
    z = 0.75 - 0.125 * ((np.arange(n)[:, None] + np.arange(d)[None, :]) % 3)
    return A.Instance(X, np.ones(n), np.full(d, 0.5), z)


#: (n, T, d, ||W|| scale, truth / floor): instances where one term of the floor dominates (d², nT, T, and
#: the logits' size 2d·|l|), each with the true norm at half the floor (must raise) and at twice it (must
#: be returned).
FLOOR_CASES = [
    (n, T, d, w, rho)
    for (n, T, d, w) in [(1, 2, 6, 0.0), (4, 8, 1, 0.0), (1, 16, 1, 0.0), (1, 16, 2, 100.0)]
    for rho in (0.5, 2.0)
]
#: The tokens' offset δ is sized from a probe so that truth/floor lands within this factor of the target.
RHO_SLACK = 1.1


@pytest.mark.parametrize(("n", "T", "d", "w", "rho"), FLOOR_CASES)
def test_jacobian_norm_refuses_exactly_the_values_below_its_documented_rounding_floor(
    n: int, T: int, d: int, w: float, rho: float
) -> None:
    """``jacobian_norm`` returns ``||J(W)||₂`` when it is above the documented absolute rounding floor of its
    float64 computation (``documented_floor``) and refuses at or below it (the value's digits would be
    rounding: the tokens nearly coincide). Oracle: the Jacobian from its definition in mpmath at 40 digits
    (``mp_softmax_weights_jacobian_norm``), on near-coincident tokens sized so that the true value is half
    or twice the documented floor; a returned value is within the documented accuracy (the floor plus the
    SVD's relative rounding)."""
    W = w * np.eye(d)
    probe_delta = 2.0**-20
    per_delta = (
        float(mp_softmax_weights_jacobian_norm(near_coincident(n, T, d, probe_delta), W)) / probe_delta
    )
    inst = near_coincident(n, T, d, rho * documented_floor(near_coincident(n, T, d, 0.0), W) / per_delta)
    truth = float(mp_softmax_weights_jacobian_norm(inst, W))
    floor = documented_floor(inst, W)
    assert rho / RHO_SLACK <= truth / floor <= rho * RHO_SLACK
    if rho < 1.0:
        with pytest.raises(NumericalError) as exc:
            jacobian_norm(inst, W, kind="softmax")
        msg = str(exc.value)
        assert msg.startswith("the softmax weights Jacobian norm at this W is below the rounding level")
        assert msg.endswith("Use lipschitz_bound for a certified upper bound, or a point with smaller logits")
    else:
        got = jacobian_norm(inst, W, kind="softmax")
        assert abs(got - truth) <= floor + svd_rtol(inst) * truth


def test_jacobian_norm_of_sequences_2_1000_apart_is_the_mpmath_value() -> None:
    """Sequence 0 of size 1 (``z_0`` the largest query), sequence 1 with tokens ``2^1000`` and a first token
    (its query) ``2^-1000``: no common rescaling of ``X`` and ``z`` brings both products ``||z_i||·||x_it||``
    to O(1) (that path refused, ``RESOLVED_MIN``); each sequence is now rescaled on its own, so the answer
    is returned. Oracle: the Jacobian from its definition in mpmath at 40 digits on the raw data."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2, 3, 2))
    X[1] = np.ldexp(X[1], 1000)
    X[1, 0] = np.ldexp(X[1, 0], -2000)
    inst = A.Instance(X, np.ones(2), np.array([1.0, -0.5]))
    W = np.zeros((2, 2))
    truth = float(mp_softmax_weights_jacobian_norm(inst, W))
    assert 0.1 < truth < 10.0
    assert abs(jacobian_norm(inst, W, kind="softmax") - truth) <= svd_rtol(inst) * truth


def test_jacobian_norm_overflowing_logits_of_unit_scale_data_message() -> None:
    """Data already at scale 1 (largest entries in ``[½, 1)``: no rescaling, ``W`` is finite on the data's
    scale) but ``W = 1e308`` everywhere: the logits ``x̃ᵀWz̃`` overflow inside the Jacobian's computation,
    which must say so (the norm ``||W||_F = 2e308`` itself reads inf), never return NaN."""
    inst = A.Instance(np.array([[[0.75, 0.5], [0.5, 0.875]]]), [1.0], [0.5, 0.75], [[0.875, 0.75]])
    with pytest.raises(NumericalError) as exc:
        jacobian_norm(inst, np.full((2, 2), 1e308), kind="softmax")
    assert str(exc.value) == (
        "the softmax weights Jacobian is not finite at a point with ||W||_F = inf "
        "(logits beyond float64 range); use a smaller radius or rescale the data"
    )


# ----------------------------------------------------------------------------- range edges
def _two_token_gap(a: float, b: float, gap: float = 2.0) -> A.Instance:
    """``d = 1``: tokens ``a`` and ``a(1 − gap)`` (``x_1 − x_2 = gap·a``), query ``b``. At ``W = 0`` the softmax
    weights Jacobian is ``D 𝓛`` with ``D = ¼[[1, −1], [−1, 1]]``: by hand ``||J||₂ = (√2/4)·|b|·|x_1 − x_2|``."""
    return A.Instance(np.array([[[a], [a * (1.0 - gap)]]]), [1.0], [1.0], [[b]])


def _hand_jacobian(inst: A.Instance) -> mpmath.mpf:
    with mpmath.workdps(40):
        gap = mpmath.mpf(float(inst.X[0, 0, 0])) - mpmath.mpf(float(inst.X[0, 1, 0]))
        return mpmath.sqrt(2) / 4 * abs(mpmath.mpf(float(inst.z[0, 0])) * gap)


def test_jacobian_norm_at_the_edges_of_the_normal_range() -> None:
    """The value ``(√2/4)|b||x_1 − x_2|`` (by hand, mpmath) put at each edge of float64's normal range:
    just below ``2^−1022`` (subnormal: must raise, never a subnormal with lost digits), just above ``2^1024``
    (must raise NumericalError, never OverflowError or inf), and a normal value ``~2^1019`` whose data need
    a rescaling by ``2^1032`` (``X, z ~ 2^516``: the factor put back is beyond 2^1024 by itself)."""
    sub = _two_token_gap(2.0**-511, 1.5 * 2.0**-512)  # (√2/4)·1.5·2^-1022 ≈ 0.53·2^-1022
    assert 2.0**-1023 <= _hand_jacobian(sub) < 2.0**-1022
    with pytest.raises(NumericalError, match="underflows " + re.escape(RANGE_TEXT)):
        jacobian_norm(sub, np.zeros((1, 1)), kind="softmax")
    over = _two_token_gap(2.0**512, 1.5 * 2.0**512)  # ≈ 1.06·2^1024
    assert mpmath.mpf(2) ** 1024 <= _hand_jacobian(over) < mpmath.mpf(2) ** 1025
    with pytest.raises(NumericalError, match="overflows " + re.escape(RANGE_TEXT)):
        jacobian_norm(over, np.zeros((1, 1)), kind="softmax")
    near = _two_token_gap(0.75 * 2.0**516, 0.75 * 2.0**516, gap=2.0**-10)
    hand = _hand_jacobian(near)
    assert 2.0**1018 < hand < 2.0**1020
    got = jacobian_norm(near, np.zeros((1, 1)), kind="softmax")
    assert abs(got / hand - 1) <= svd_rtol(near)


#: ``lipschitz_bound``'s rounding allowance for ``n = 1, T = 2, d = 1``: ``(8m + m(2d + 2))·eps``, ``m = 2``.
RTOL_1_2_1 = 24 * EPS


@pytest.mark.parametrize(
    ("ea", "eb", "returned"),
    [(-510, -511, True), (512, 512, True), (513, 512, False), (-511, -511, False)],
)
def test_linear_bound_at_the_edges_of_the_normal_range(ea: int, eb: int, returned: bool) -> None:
    """Tokens ``0.75·2^ea`` and 0, query ``0.75·2^eb``: the linear weights constant is ``||𝓛||₂ = 0.5625·2^(ea+eb)``
    exactly (by hand: one nonzero row), and the bound is that times ``1 + rounding_rtol``. At
    ``ea + eb = −1021`` it is ``1.125·2^−1022`` and at ``1024`` it is ``1.125·2^1023``, the two ends of the normal
    range: both returned (oracle: mpmath, 2 ulps); one binade beyond either end it must raise the scale
    contract's error, never return inf or a subnormal."""
    inst = A.Instance(np.array([[[0.75 * 2.0**ea], [0.0]]]), [1.0], [1.0], [[0.75 * 2.0**eb]])
    with mpmath.workdps(40):
        exact = mpmath.mpf(0.5625) * mpmath.mpf(2) ** (ea + eb) * (1 + mpmath.mpf(RTOL_1_2_1))
    assert bound_rounding_rtol(inst) == RTOL_1_2_1
    if returned:
        b = lipschitz_bound(inst, kind="linear")
        assert abs(mpmath.mpf(b.value) / exact - 1) <= 2 * EPS
    else:
        side = "overflows" if ea + eb > 0 else "underflows"
        with pytest.raises(NumericalError, match=side + " " + re.escape(RANGE_TEXT)):
            lipschitz_bound(inst, kind="linear")


def test_ratio_returns_the_largest_double_and_names_its_remedy() -> None:
    """The ratio helper of compare_lipschitz: a quotient equal to the largest double is representable and
    returned exactly (IEEE: ``FLOAT_MAX / 1``); one beyond the range raises with the documented remedy."""
    from attnsvm.lipschitz._compare import _ratio

    assert _ratio(FLOAT_MAX, 1.0, "r") == FLOAT_MAX
    with pytest.raises(NumericalError) as exc:
        _ratio(1e300, 1e-300, "the gap")
    assert str(exc.value) == (
        f"the gap is about 1e+600: it overflows {RANGE_TEXT}. Compare the logarithms of the two numbers"
    )


# ----------------------------------------------------------------------------- messages of bad input
def test_bad_names_messages() -> None:
    """Each entry point names the bad argument, repeats the value given and lists the valid ones."""
    inst = A.random_instance(1, 2, 2, seed=0)
    calls = (
        lambda **kw: lipschitz_bound(inst, **kw),
        lambda **kw: lipschitz_estimate(inst, **kw, **FAST),
        lambda **kw: jacobian_norm(inst, np.zeros((2, 2)), **kw),
    )
    for call in calls:
        with pytest.raises(UnknownNameError) as exc:
            call(kind="relu")
        assert str(exc.value) == (
            "unknown attention kind 'relu'; expected one of 'softmax', 'linear', 'normalized_linear'"
        )
        with pytest.raises(UnknownNameError) as exc:
            call(of="logits")
        assert str(exc.value) == "unknown Lipschitz map 'of' 'logits'; expected one of 'weights', 'output'"


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"starts": 0}, "starts must be an integer ≥ 1; got 0"),
        ({"samples": -1}, "samples must be an integer ≥ 0; got -1"),
        ({"steps": 1.5}, "steps must be an integer ≥ 0; got 1.5"),
        ({"radius": "1"}, "radius must be a real number > 0; got '1' of type str"),
    ],
)
def test_bad_search_settings_messages(kw: dict, msg: str) -> None:
    """The documented bounds of each search setting and the type of a non-numeric radius, verbatim."""
    with pytest.raises(AttnSVMError) as exc:
        lipschitz_estimate(A.random_instance(1, 2, 2, seed=0), **kw)
    assert str(exc.value) == msg


# ----------------------------------------------------------------------------- signatures' defaults
def test_default_radius_and_kind() -> None:
    """``lipschitz_bound(inst)`` is the softmax weights bound on the unit ball and ``lipschitz_estimate(inst)``
    the softmax estimate (the signatures' documented defaults); the instance is one where the radius and
    the kind change the answer, so a different default cannot pass."""
    inst = A.random_instance(2, 3, 2, seed=1)
    unit = lipschitz_bound(inst, kind="softmax", wrt="W", radius=1.0, of="weights").value
    assert lipschitz_bound(inst).value == unit
    assert lipschitz_bound(inst, radius=2.0).value != unit
    inst = A.random_instance(1, 3, 2, seed=1)
    est = lipschitz_estimate(inst, **FAST).value
    assert est == lipschitz_estimate(inst, kind="softmax", **FAST).value
    assert est != lipschitz_estimate(inst, kind="normalized_linear", **FAST).value


# ----------------------------------------------------------------------------- the search's candidates
def test_estimate_counts_its_documented_candidates() -> None:
    """Without ascent (``steps = 0``) the search evaluates exactly its documented candidates: ``W = 0``, the six
    points ``t R V₁`` (``t ∈ {±¼, ±½, ±1}``) and ``samples`` random points, one Jacobian each."""
    inst = A.random_instance(2, 3, 2, seed=3)
    for samples in (0, 1, 5):
        e = lipschitz_estimate(inst, radius=2.0, samples=samples, steps=0)
        assert e.evaluations == 1 + 6 + samples


def test_estimate_without_sampling_is_the_best_documented_structured_candidate() -> None:
    """With ``samples = 0`` and ``steps = 0`` the estimate is the largest Jacobian over the documented
    structured candidates ``{0} ∪ {t R V₁ : t ∈ ±{¼, ½, 1}}``. Oracle: ``V₁`` from numpy's SVD of the explicit
    Kronecker rows (either sign: the set is symmetric) and the Jacobians from an independent torch
    implementation on the raw data. On this instance the best candidate is ``±½ R V₁`` alone, ~7 % above the
    runner-up, so a candidate set that misses one sign of ``½`` cannot pass."""
    inst, R = A.random_instance(1, 3, 2, seed=10), 2.0
    v1 = np.linalg.svd(kron_rows(inst))[2][0].reshape(inst.d, inst.d, order="F")
    cands = [np.zeros((2, 2))] + [t * R * v1 for t in (0.25, 0.5, 1.0, -0.25, -0.5, -1.0)]
    vals = [torch_jac_norm(inst, "softmax", "output", W) for W in cands]
    best = int(np.argmax(vals))
    assert best in (2, 5) and max(vals) > 1.05 * sorted(vals)[-2]
    e = lipschitz_estimate(inst, kind="softmax", radius=R, of="output", samples=0, steps=0)
    assert abs(e.value - vals[best]) <= 2 * svd_rtol(inst) * vals[best]
    np.testing.assert_allclose(e.W, cands[best], rtol=0, atol=64 * EPS * R)


# ----------------------------------------------------------------------------- exact zeros
@pytest.mark.parametrize("kind", KINDS)
def test_output_jacobian_of_zero_values_is_exactly_zero(kind: str) -> None:
    """``v = 0``: every value ``vᵀx_it`` is 0, so the output is 0 for every ``W`` and its Jacobian is exactly 0
    at every point (exact certificate), saturated ones included: 0, not an error. The weights Jacobian of
    the same data is not 0 (distinct tokens), and at a saturated softmax point it must still be refused
    rather than read as 0 because the values vanish."""
    inst = A.Instance(np.array([[[1.0, 0.5], [-0.5, 1.0], [0.25, -1.0]]]), [1.0], [0.0, 0.0], [[1.0, -0.5]])
    for W in (np.zeros((2, 2)), np.ones((2, 2)), np.full((2, 2), 1e4)):
        assert jacobian_norm(inst, W, kind=kind, of="output") == 0.0
    assert lipschitz_estimate(inst, kind=kind, of="output", **FAST).value == 0.0
    if kind == "softmax":  # logit gaps ~1e4: weights ~e^-1e4, beyond float64 (elu + 1 decays only as 1/l)
        with pytest.raises(NumericalError, match="below the rounding level"):
            jacobian_norm(inst, np.full((2, 2), 1e4), kind=kind, of="weights")


def test_linear_weights_jacobian_never_reads_zero_when_the_logit_map_is_not_zero() -> None:
    """Sequence 0 holds tokens and query of size ``2^-40`` (``||𝓛||₂ = 2^-80``, a normal double); the largest
    tokens (``2^500``, sequence 1) have a zero query, the largest query (``2^500``, sequence 2) zero tokens,
    and ``v = 0``. On the data rescaled to O(1) sequence 0's Jacobian entries underflow, but the linear
    weights Jacobian is ``𝓛`` itself and is not 0: the answer is ``logit_norm`` (oracle: the exact value
    ``2^-80``, one row per token) or a NumericalError, never 0 (the values play no part in it)."""
    X = np.zeros((3, 2, 2))
    X[0] = np.eye(2) * 2.0**-40
    X[1] = np.eye(2) * 2.0**500
    z = np.zeros((3, 2))
    z[0, 0], z[2, 0] = 2.0**-40, 2.0**500
    inst = A.Instance(X, np.ones(3), [0.0, 0.0], z)
    assert logit_norm(inst) == 2.0**-80
    try:
        got = jacobian_norm(inst, np.zeros((2, 2)), kind="linear")
    except NumericalError:
        return
    assert abs(got / 2.0**-80 - 1) <= svd_rtol(inst)


def test_constant_map_estimate_is_zero_when_the_ball_underflows_on_the_rescaled_data() -> None:
    """``X = 0``: every logit is 0 for every ``W``, so every constant is exactly 0 (exact certificate). With
    ``R = 1e-300`` and queries ``~2^-100`` the ball on the rescaled data, ``R·2^(eX+ez)``, underflows to
    ``{0}``, and the search has no scale to draw radii from: still exactly 0, no error."""
    inst = A.Instance(np.zeros((1, 2, 2)), [1.0], [1.0, 1.0], [[2.0**-100, 0.0]])
    for kind in KINDS:
        for of in OFS:
            assert lipschitz_estimate(inst, kind=kind, radius=1e-300, of=of, samples=4, steps=2).value == 0.0


def test_constant_map_estimate_at_the_largest_radius_is_exactly_zero() -> None:
    """``X = 0`` (every constant exactly 0, exact certificate), ``z = 0.99·1`` and ``R = FLOAT_MAX``: exactly 0,
    attained at ``W = 0``, for every seed. (The search's intermediate ``z̃ Wᵀ`` overflowed at such radii before
    it met ``X = 0`` and the estimate raised "Jacobian is not finite … radius too large", the wrong cause: the
    constant map is now recognised on the original data before any search.)"""
    inst = A.Instance(np.zeros((1, 2, 2)), [1.0], [1.0, 1.0], [[0.99, 0.99]])
    for seed in range(3):
        e = lipschitz_estimate(inst, radius=FLOAT_MAX, samples=16, steps=2, seed=seed)
        assert e.value == 0.0
        assert np.all(e.W == 0.0)


# ----------------------------------------------------------------------------- scale
def test_estimate_attaining_point_below_the_normal_range_message() -> None:
    """``X, z ~ 2^515`` and ``v ~ 2^-600``: the output constant (``~2^(2·515+515−600)``) is a normal double, but
    on the ball ``R = 2^-1030`` every nonzero point has ``||W||_F ≤ 2^-1030``, below the normal range: the
    estimate raises naming the attaining point and the remedy instead of returning a subnormal ``W``."""
    rng = np.random.default_rng(3)
    X = np.ldexp(rng.standard_normal((1, 3, 2)), 515)
    inst = A.Instance(
        X, [1.0], np.ldexp(rng.standard_normal(2), -600), np.ldexp(rng.standard_normal((1, 2)), 515)
    )
    with pytest.raises(NumericalError) as exc:  # (this search budget finds a nonzero attaining point)
        lipschitz_estimate(inst, kind="softmax", radius=2.0**-1030, of="output", samples=4, steps=2)
    assert re.fullmatch(
        r"the norm \|\|W\|\|_F of the estimate's attaining point W is about 1e-3\d\d: it underflows "
        + re.escape(RANGE_TEXT)
        + r"\. Rescale X or z by a power of two \(W scales inversely\)",
        str(exc.value),
    )


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_kappa_of_a_sequence_alone_at_scales_2_pm600(kind: str) -> None:
    """``κ_i`` is a property of sequence ``i`` alone (``sup ||D_i||₂`` on the ball, ``lipschitz_bound``): with
    sequence 0's tokens at ``2^600`` (query ``2^-600``) and sequence 1's at ``2^-600`` (query ``2^600``), each
    output factor equals, bit for bit, the factor of that sequence on its own, although the two token
    scales are ``2^1200`` apart (no common scale holds both)."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, 3, 2))
    z = rng.standard_normal((2, 2))
    X[0], z[0] = np.ldexp(X[0], 600), np.ldexp(z[0], -600)
    X[1], z[1] = np.ldexp(X[1], -600), np.ldexp(z[1], 600)
    v = np.array([1.0, -0.5])
    both = lipschitz_bound(A.Instance(X, np.ones(2), v, z), kind=kind, of="output").log_kappa
    for i in range(2):
        alone = lipschitz_bound(A.Instance(X[i : i + 1], [1.0], v, z[i : i + 1]), kind=kind, of="output")
        assert math.isfinite(alone.log_kappa[0])
        assert both[i] == alone.log_kappa[0]


def test_estimate_first_ascent_step_is_the_documented_normalised_gradient_step() -> None:
    """The ascent's first step from the best candidate is ``W₁ = W₀ + η·∇σ/||∇σ||`` with ``η = R/4`` (documented),
    ``σ(W) = ||J(W)||₂``, taken when it improves. On the instance of the test above ``W₀ = ±½ R V₁`` (inside the
    ball: ``||W₁|| ≤ ¾R``, no projection). Oracles: the step length ``R/4``; the direction from an independent
    gradient of the largest singular value of the torch Jacobian (``torch.func.grad`` through ``jacrev`` and
    ``svdvals``); the value at ``W₁`` from the independent torch Jacobian, above the value at ``W₀``."""
    inst, R = A.random_instance(1, 3, 2, seed=10), 2.0
    e0 = lipschitz_estimate(inst, kind="softmax", radius=R, of="output", samples=0, steps=0)
    e1 = lipschitz_estimate(inst, kind="softmax", radius=R, of="output", samples=0, steps=1, starts=1)
    X, z, v = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (inst.X, inst.z, inst.v))

    def sigma(Wt: torch.Tensor) -> torch.Tensor:
        def f(W: torch.Tensor) -> torch.Tensor:
            s = torch.softmax(torch.einsum("ntd,de,ne->nt", X, W, z), dim=1)
            return (s * (X @ v)).sum(dim=1)

        return torch.linalg.svdvals(torch.func.jacrev(f)(Wt).reshape(inst.n, -1))[0]

    g = torch.func.grad(sigma)(torch.tensor(e0.W, dtype=torch.float64)).numpy()
    step = e1.W - e0.W
    assert abs(np.linalg.norm(step) - R / 4) <= 64 * EPS * R
    np.testing.assert_allclose(step, (R / 4) * g / np.linalg.norm(g), rtol=0, atol=1e-9 * R)
    assert torch_jac_norm(inst, "softmax", "output", e1.W) > e0.value
    assert abs(e1.value - torch_jac_norm(inst, "softmax", "output", e1.W)) <= 2 * svd_rtol(inst) * e1.value


# ----------------------------------------------------------------------------- regressions (mutation report)
#: Defect 1's instance: sequence 0 holds the largest tokens (``2^1000``) and a subnormal query ``2^-1074``,
#: sequence 1 subnormal tokens (``2^-1074``) and the largest query (``1``); ``v = (1, −1)``. One common
#: rescaling of ``X`` and ``z`` underflows both sequences' logit rows to 0. By hand at ``W = 0`` (each
#: ``z_i ⊗ x_it`` is a multiple of ``e_1 ⊗ e_t``; sequence 1's rows are ``2^-2074`` times sequence 0's, below
#: float64's resolution of the sum): linear weights ``||𝓛||₂ = 2^-74``; softmax and normalized-linear weights
#: ``½·2^-74`` (``D = ½I − ¼11ᵀ``, ``s = (½, ½)``); linear output ``√2·2^926`` (row ``Σ_t a_0t z_0 ⊗ x_0t``);
#: softmax / normalized-linear output ``√2·2^925`` (``∂f/∂l = s∘(a − f) = ½a``).
SPLIT_CLOSED_FORM = {
    ("linear", "weights"): 2.0**-74,
    ("softmax", "weights"): 2.0**-75,
    ("normalized_linear", "weights"): 2.0**-75,
    ("linear", "output"): math.ldexp(math.sqrt(2.0), 926),
    ("softmax", "output"): math.ldexp(math.sqrt(2.0), 925),
    ("normalized_linear", "output"): math.ldexp(math.sqrt(2.0), 925),
}


def split_scale_instance() -> A.Instance:
    X = np.zeros((2, 2, 2))
    X[0] = np.eye(2) * 2.0**1000
    X[1] = np.eye(2) * 2.0**-1074
    z = np.array([[2.0**-1074, 0.0], [1.0, 0.0]])
    return A.Instance(X, [1.0, 1.0], [1.0, -1.0], z)


@pytest.mark.parametrize(("kind", "of"), sorted(SPLIT_CLOSED_FORM))
def test_jacobian_norm_is_never_a_silent_zero_when_sequences_underflow_on_a_common_scale(
    kind: str, of: str
) -> None:
    """Mutation-report defect 1: on one common rescaling every sequence's Jacobian underflowed to exactly 0 and the
    structural-zero test, run on the rescaled data, returned 0 for a normal-double answer. Now each sequence is
    rescaled on its own. Oracle: the closed forms of ``SPLIT_CLOSED_FORM`` at ``W = 0`` (by hand); for the
    estimate, the closed form is attained (``W = 0`` is a candidate) and bounds it from below, the certified
    bound from above, and for softmax weights its value equals the mpmath Jacobian at its returned point."""
    inst, truth = split_scale_instance(), SPLIT_CLOSED_FORM[(kind, of)]
    assert abs(jacobian_norm(inst, np.zeros((2, 2)), kind=kind, of=of) - truth) <= svd_rtol(inst) * truth
    e = lipschitz_estimate(inst, kind=kind, of=of, **FAST)
    assert e.value >= truth * (1 - svd_rtol(inst))
    assert e.value <= lipschitz_bound(inst, kind=kind, of=of).value
    if kind == "linear":  # the Jacobian is constant: the estimate is the closed form itself
        assert abs(e.value - truth) <= svd_rtol(inst) * truth
    if (kind, of) == ("softmax", "weights"):
        at_w = float(mp_softmax_weights_jacobian_norm(inst, e.W))
        assert abs(e.value - at_w) <= svd_rtol(inst) * at_w


def test_jacobian_norm_of_a_constant_map_at_huge_w_is_exactly_zero() -> None:
    """Mutation-report defect 2 (``jacobian_norm``'s side): ``X = 0`` makes every logit 0 for every ``W`` (exact
    certificate), so the Jacobian is exactly 0 even at ``W = 1e308`` everywhere, where ``W`` on any rescaled
    scale, and ``z·Wᵀ``, overflow: 0, never a "not finite" error naming the logits."""
    inst = A.Instance(np.zeros((2, 2, 2)), [1.0, 1.0], [1.0, 1.0], [[0.99, 0.99], [0.5, -0.5]])
    for kind in KINDS:
        for of in OFS:
            assert jacobian_norm(inst, np.full((2, 2), 1e308), kind=kind, of=of) == 0.0
            assert lipschitz_estimate(inst, kind=kind, radius=FLOAT_MAX, of=of, **FAST).value == 0.0


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_weights_factor_is_exactly_one_half_where_the_cap_binds(kind: str) -> None:
    """Mutation-report item 4: the override ``κ_i = ½`` where ``p_i ≥ ½`` was redundant because the pair of
    ``log ½`` is exactly ``(½, 0)``. Oracle: the exact certificate ``κ_i = min(½, p_i)``, with ``p_i ≥ ½`` for any
    ball when ``T = 2`` (the larger weight is ``≥ ½``): every factor is exactly ½ and the bound equals the
    radius-free ``½·linear`` bound bit for bit."""
    inst = A.random_instance(3, 2, 2, seed=4)
    for R in (1e-3, 1.0, 1e3):
        b = lipschitz_bound(inst, kind=kind, radius=R)
        assert np.all(b.kappa == 0.5)
        assert b.value == lipschitz_bound(inst, kind=kind, radius=1e300).value
