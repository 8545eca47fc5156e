"""Edge cases of `lipschitz_estimate` and its search helpers, each against an independent oracle.

Added for mutation testing of `attnsvm/lipschitz.py` (issue 13 §4): every test pins a documented
behaviour that an existing test left open.

Oracles: closed forms of the softmax weights Jacobian evaluated in mpmath at 50 digits from the exact
input doubles (``J = blockdiag_i(D_i)·𝓛`` with ``D_i = diag(s_i) − s_i s_iᵀ`` and the logit map's rows
``z_i ⊗ x_it``, so ``||J||₂² = λ_max(D G D)`` with ``G = 𝓛𝓛ᵀ``), exact closed forms of tiny hand-built
instances, the exact invariance of the weights map under per-sequence reciprocal rescaling
(``x_it → 2^a x_it``, ``z_i → 2^-a z_i`` keeps every row ``z_i ⊗ x_it``, hence every logit and every
Jacobian), the certified bound, and the documented request fields and error texts.
"""

from __future__ import annotations

import math
import re
from typing import Any

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.lipschitz import jacobian_norm, lipschitz_bound, lipschitz_estimate

EPS = float(np.finfo(np.float64).eps)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")
#: The scale contract's range (attnsvm.scaling.range_error), verbatim.
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
#: A singular value from a backward-stable SVD of an ``m × p`` matrix is within ``~(m + p)·eps``
#: relative of exact; 8 ulps of headroom per dimension (as in tests/test_lipschitz_edges.py).
SVD_ULPS = 8.0
#: mpmath working precision of the closed forms: 50 digits, far beyond float64's 16.
DPS = 50

#: Three tokens ``(1, 1), (1, −1), (−1, 0)`` (times ¾) and the query ``¾·e₁``: the logits are
#: ``l = X w`` with ``w = W z``. At ``W = 0`` the weights are uniform; along ``w ∝ (−1, 2)`` tokens 1 and 3
#: stay tied while token 2 is suppressed, and the Jacobian grows towards the two-token tie value
#: (``s = (½, 0, ½)``), ~1.45 times the one at ``W = 0`` (both closed forms below).
TOKENS = 0.75 * np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 0.0]])
QUERY = np.array([0.75, 0.0])


def svd_rtol(inst: A.Instance) -> float:
    return SVD_ULPS * (inst.n * inst.T + inst.d**2) * EPS


def mp_weights_jacobian_norm(inst: A.Instance, s: list[list[Any]]) -> mpmath.mpf:
    """``||blockdiag_i(diag(s_i) − s_i s_iᵀ)·𝓛||₂`` in mpmath for given weights ``s_i`` (exact fractions
    such as ``1/3``): ``λ_max(D G D)^½`` with ``G[(i,t),(j,u)] = (z_i·z_j)(x_it·x_ju)`` from the exact
    input doubles. With ``s_i`` uniform it is the Jacobian of the softmax weights at ``W = 0``."""
    n, T, d = inst.shape
    with mpmath.workdps(DPS):
        X = [[[mpmath.mpf(float(c)) for c in inst.X[i, t]] for t in range(T)] for i in range(n)]
        z = [[mpmath.mpf(float(c)) for c in inst.z[i]] for i in range(n)]

        def dot(a: list[mpmath.mpf], b: list[mpmath.mpf]) -> mpmath.mpf:
            return mpmath.fsum(p * q for p, q in zip(a, b, strict=True))

        idx = [(i, t) for i in range(n) for t in range(T)]
        G = mpmath.matrix(n * T, n * T)
        D = mpmath.matrix(n * T, n * T)
        for a, (i, t) in enumerate(idx):
            for b, (j, u) in enumerate(idx):
                G[a, b] = dot(z[i], z[j]) * dot(X[i][t], X[j][u])
                if i == j:
                    st, su = mpmath.mpf(s[i][t]), mpmath.mpf(s[i][u])
                    D[a, b] = (st if t == u else 0) - st * su
        M = D * G * D
        M = (M + M.T) / 2  # symmetric up to the rounding of the products at 50 digits
        return mpmath.sqrt(max(max(mpmath.eigsy(M)[0]), mpmath.mpf(0)))


def reciprocal_pair(a: int, b: int = 0) -> A.Instance:
    """Two copies of the three-token sequence, rescaled per sequence by reciprocal powers of two:
    sequence 0 has tokens ``2^(b+a)·TOKENS`` and query ``2^(b−a)·QUERY``, sequence 1 the reverse. Every
    row ``z_i ⊗ x_it`` is ``2^2b`` times the balanced one (``a = 0``), so the weights map, its Jacobian and
    its Lipschitz constant on the ball ``R·2^-2b`` are exactly those of the balanced data on ``R``."""
    X = np.stack([np.ldexp(TOKENS, b + a), np.ldexp(TOKENS, b - a)])
    z = np.stack([np.ldexp(QUERY, b - a), np.ldexp(QUERY, b + a)])
    return A.Instance(X, np.ones(2), np.array([0.5, 0.25]), z)


# ----------------------------------------------------------------------------- the request's fields
def test_seed_of_a_wrong_type_is_refused_with_its_message() -> None:
    """A seed must be an integer (``numpy.random.default_rng`` takes it); a float or a bool is refused with
    the documented message, verbatim."""
    inst = A.random_instance(1, 2, 2, seed=0)
    for seed in (1.5, True):
        with pytest.raises(AttnSVMError) as exc:
            lipschitz_estimate(inst, seed=seed)  # type: ignore[arg-type]
        assert str(exc.value) == f"seed must be an integer; got {seed!r}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_constant_map_estimate_reports_its_request_and_no_search(kind: str, of: str) -> None:
    """``z = 0``: every logit is 0 for every ``W``, so the map is constant and its constant exactly 0 (exact
    certificate). The estimate is exactly 0 at ``W = 0`` without any search (``evaluations = 0`` and the
    factorised search value ``||J(0)||₂ = 0``) and echoes the request: kind, of, wrt, radius, seed, samples
    and steps as passed (a NumPy integer seed as a Python int)."""
    inst = A.Instance(np.ones((1, 3, 2)) * [[[1.0], [2.0], [3.0]]], [1.0], [1.0, -1.0], [[0.0, 0.0]])
    e = lipschitz_estimate(inst, kind=kind, radius=3.0, of=of, seed=np.int64(7), samples=5, steps=6, starts=2)
    assert e.value == 0.0 and float(e) == 0.0
    assert np.array_equal(e.W, np.zeros((2, 2)))
    assert e.search_value == 0.0
    assert e.evaluations == 0
    assert (e.kind, e.of, e.wrt, e.radius, e.samples, e.steps) == (kind, of, "W", 3.0, 5, 6)
    assert e.seed == 7 and type(e.seed) is int


@pytest.mark.parametrize("kind", KINDS)
def test_searched_estimate_reports_its_request(kind: str) -> None:
    """A searched estimate echoes the request (seed as a Python int, samples, steps) and attains its value:
    ``value ≤ lipschitz_bound`` (certified) and ``||W||_F ≤ radius``."""
    inst = A.random_instance(1, 3, 2, seed=4)
    e = lipschitz_estimate(inst, kind=kind, radius=2.0, seed=np.int64(5), samples=3, steps=2, starts=1)
    assert (e.kind, e.of, e.wrt, e.radius, e.samples, e.steps) == (kind, "weights", "W", 2.0, 3, 2)
    assert e.seed == 5 and type(e.seed) is int
    assert 0.0 < e.value <= lipschitz_bound(inst, kind=kind, radius=2.0).value
    assert float(np.linalg.norm(e.W)) <= 2.0 * (1 + 4 * EPS)


# ------------------------------------------------------------------------- the search ball at extreme scales
#: The search must leave the origin's neighbourhood: a search confined to logits ``≤ 2^-50`` attains at most
#: ``||J(0)||·(1 + 2^-40)``; the two-token tie (``s = (½, 0, ½)``) is ~1.45·||J(0)||, and with this budget the
#: balanced data reach 1.41·||J(0)||. Required: at least this share of the way from ``||J(0)||`` to the tie.
REACH_SHARE = 1.0 / 3.0
#: Search budget of the reach test (deterministic: seed 0).
REACH_BUDGET = {"samples": 16, "steps": 10, "starts": 2}


@pytest.mark.parametrize("a", [0, 250, 475])
def test_estimate_reaches_the_logit_scale_of_reciprocally_rescaled_sequences(a: int) -> None:
    """Sequences whose tokens and queries have reciprocal scales ``2^±a`` (``a = 250``: on the data rescaled
    to O(1), every ``||x_it||·||z_i||`` is ``~2^-500``; ``a = 475``: ``~2^-950``, whose squares underflow)
    define exactly the weights map of the balanced data (``a = 0``). On the ball ``R = 16`` the search must
    see the logits that ``R`` reaches, not a ball shrunk to the origin: the estimate exceeds ``||J(0)||`` by
    at least ``REACH_SHARE`` of the gain of the two-token tie. Oracle: both Jacobians in closed form (mpmath
    at 50 digits); the certified bound above."""
    inst = reciprocal_pair(a)
    third = mpmath.mpf(1) / 3
    j0 = float(mp_weights_jacobian_norm(inst, [[third] * 3] * 2))
    tie = float(mp_weights_jacobian_norm(inst, [[0.5, 0.0, 0.5]] * 2))
    assert tie > 1.4 * j0  # the instance's premise: the tie is well above the origin
    e = lipschitz_estimate(inst, kind="softmax", radius=16.0, **REACH_BUDGET)
    assert e.value >= j0 + REACH_SHARE * (tie - j0)
    assert e.value <= lipschitz_bound(inst, kind="softmax", radius=16.0).value


def test_estimate_on_a_ball_that_underflows_on_the_rescaled_data_is_the_jacobian_at_zero() -> None:
    """Sequence 0 has tokens ``~2^-200`` and query ``~2^-740``, sequence 1 the reverse: every
    ``||x_it||·||z_i||`` is ``~2^-940`` (a normal double), but on the data rescaled to O(1) (``X/2^eX``,
    ``z/2^ez``) the small factors are ``~2^-540`` and their squared norms underflow, so the search has no
    logit scale to draw radii from, and its ball ``R·2^(eX+ez)`` with ``R = 2^-700`` underflows to ``{0}``.
    The logits on the ball are ``≤ 2^-1640``: the constant is ``||J(0)||`` to ~2^-1600 relative. Oracle:
    ``||J(0)||`` in closed form (mpmath at 50 digits, uniform weights); the answer is that value (to the SVD's
    rounding), not a foreign exception from the radius sampler."""
    X = np.stack([np.ldexp(TOKENS, -200), np.ldexp(TOKENS, -740)])
    z = np.stack([np.ldexp(QUERY, -740), np.ldexp(QUERY, -200)])
    inst = A.Instance(X, np.ones(2), np.array([0.5, 0.25]), z)
    third = mpmath.mpf(1) / 3
    j0 = mp_weights_jacobian_norm(inst, [[third] * 3] * 2)
    e = lipschitz_estimate(inst, kind="softmax", radius=2.0**-700, samples=4, steps=2, starts=1)
    assert abs(mpmath.mpf(e.value) / j0 - 1) <= svd_rtol(inst)


@pytest.mark.parametrize("log2_radius", [-1040, -1060])
def test_estimate_attaining_point_inside_a_subnormal_ball_is_refused(log2_radius: int) -> None:
    """``X, z ~ 2^515`` and ``v ~ 2^-600`` (output constant ``~2^953``, a normal double) on a ball of radius
    ``2^-1040`` or ``2^-1060``: every nonzero point of the ball has ``||W||_F`` below ``2^-1022``, so a
    nonzero attaining point is not a normal double and the estimate must say so (documented Raises), however
    small the point is on the search's own scale (there ``||W̃|| ≤ R·2^(eX+ez) = R·2^1034 ≤ 2^-6``). The
    attaining point is nonzero: ``W = 0`` is not a local maximum of ``||J||`` for this data (the first ascent
    step from it improves), so the search cannot return ``W = 0``."""
    rng = np.random.default_rng(3)
    X = np.ldexp(rng.standard_normal((1, 3, 2)), 515)
    inst = A.Instance(
        X, [1.0], np.ldexp(rng.standard_normal(2), -600), np.ldexp(rng.standard_normal((1, 2)), 515)
    )
    with pytest.raises(NumericalError) as exc:
        lipschitz_estimate(inst, kind="softmax", radius=2.0**log2_radius, of="output", samples=4, steps=2)
    assert re.fullmatch(
        r"the norm \|\|W\|\|_F of the estimate's attaining point W is about 1e-3\d\d: it underflows "
        + re.escape(RANGE_TEXT)
        + r"\. Rescale X or z by a power of two \(W scales inversely\)",
        str(exc.value),
    )


# ----------------------------------------------------------------------------- the random candidates' radii
def triangle_with_common_part() -> A.Instance:
    """Three tokens ``(r cos θ_t, r sin θ_t, M)`` (an equilateral triangle, ``θ_t = 2πt/3``, ``r = ½``)
    sharing the common coordinate ``M = ¾``, query ``¾·e₁``. Two facts make the search's random points
    observable:

    * the logit map's top singular vector ``V₁`` (``√3·M > √(3/2)·r``) moves every logit by the same amount,
      which leaves the softmax unchanged: the structured candidates ``t R V₁`` attain ``||J(0)||`` (to
      rounding);
    * ``W = 0`` is a strict (conical) minimum of ``||J(W)||`` on small balls: the planar logits span the whole
      sum-zero subspace and, at uniform weights, any first-order change ``δs`` raises the top eigenvalue of
      ``D = diag(s) − ssᵀ`` there by ``|μ| > 0`` (the projected ``diag(δs)`` is traceless on it).

    Hence with ``steps = 0`` the estimate's ``W`` is a random sample whenever its value exceeds ``||J(0)||``,
    and every sample at a small enough radius does."""
    th = 2 * np.pi * np.arange(3) / 3
    X = np.stack([0.5 * np.cos(th), 0.5 * np.sin(th), np.full(3, 0.75)], axis=1)[None]
    return A.Instance(X, [1.0], np.array([0.5, 0.25, 0.0]), np.array([[0.75, 0.0, 0.0]]))


#: Significance of the Kolmogorov–Smirnov test of the sampled radii: a correct sampler is rejected with
#: probability 1e-3 (the seeds are fixed, so the outcome is deterministic).
KS_ALPHA = 1e-3
#: Seeds of the radius tests (each run draws one or two random points).
RADIUS_SEEDS = 30
#: A value counts as above ``||J(0)||`` beyond the rounding of the ``t R V₁`` candidates (relative ~1e-13 at
#: the radii used: the common logit shift is computed with absolute error ``~eps·|l|``).
ABOVE_J0 = 1e-9


def test_random_points_of_even_draws_are_uniform_in_the_ball() -> None:
    """With one sample (the 0-th, an even draw) and no ascent on a ball small enough that no weight saturates
    (``R = 1``, logit gaps ``≤ 0.65``), the estimate's point is that sample (see
    :func:`triangle_with_common_part`); documented: uniform in the ball, so ``||W||_F/R`` has the CDF
    ``ρ^{d²}`` (``d² = 9``). Oracle: Kolmogorov–Smirnov test over ``RADIUS_SEEDS`` seeds (a radius uniform on
    ``[0, R]`` instead is rejected at p ~ 1e-11)."""
    from scipy.stats import kstest

    inst = triangle_with_common_part()
    j0 = float(mp_weights_jacobian_norm(inst, [[mpmath.mpf(1) / 3] * 3]))
    radii = []
    for seed in range(RADIUS_SEEDS):
        e = lipschitz_estimate(inst, radius=1.0, seed=seed, samples=1, steps=0)
        assert e.value > j0 * (1 + ABOVE_J0)  # the sample is the point found (premise)
        radii.append(float(np.linalg.norm(e.W)))
    assert kstest(radii, lambda x: np.clip(x, 0.0, 1.0) ** 9).pvalue >= KS_ALPHA


def test_random_points_of_odd_draws_stay_on_the_logits_scale() -> None:
    """Odd draws have the documented radius ``min(R, e^u)``, ``u`` uniform between ``log(0.1/max c)`` and
    ``log(10/min c)``, ``c`` over the positive ``||x_it||·||z_i||`` and ``||x_it − x_iu||·||z_i||``: never
    below ``0.1/max c``. On a large ball (``R = 1000``) the even draw (radius ``≥ 0.148`` with probability ``1
    − 1e-34``) and the ``t R V₁`` candidates cannot be that small, and every point at such a small radius
    beats ``W = 0`` (see :func:`triangle_with_common_part`); so no point found may lie below ``0.1/max c``.
    Oracle: ``c`` from the definition (hand-listed norms); most runs find their odd draw."""
    inst = triangle_with_common_part()
    X, z = inst.X[0], inst.z[0]
    c = [float(np.linalg.norm(X[t]) * np.linalg.norm(z)) for t in range(3)]
    c += [
        float(np.linalg.norm(X[t] - X[u]) * np.linalg.norm(z)) for t in range(3) for u in range(3) if t != u
    ]
    lo, hi = 0.1 / max(c), 10.0 / min(c)
    j0 = float(mp_weights_jacobian_norm(inst, [[mpmath.mpf(1) / 3] * 3]))
    found = []
    for seed in range(2 * RADIUS_SEEDS):
        e = lipschitz_estimate(inst, radius=1000.0, seed=seed, samples=2, steps=0)
        if e.value > j0 * (1 + ABOVE_J0):
            found.append(float(np.linalg.norm(e.W)))
    assert min(found) >= lo * (1 - 4 * EPS)
    assert sum(rho <= hi for rho in found) >= RADIUS_SEEDS  # the odd draws are found in most runs


# ----------------------------------------------------------------------------- the bound's split of the data
def test_linear_output_bound_of_tiny_tokens_next_to_a_zero_token_is_exact() -> None:
    """One zero token and one token ``2^-600·(1, ½)``, ``v = (2^600, 0)``, ``z = (1, ½)``: the values are
    ``a = (0, 1)`` and the linear output ``f = Σ_t a_t x_tᵀ W z`` is linear in ``W`` with constant
    ``||Σ_t a_t x_t||·||z|| = 2^-600·(5/4)`` exactly (hand-derived). The bound is that value, rounded up by at
    most its rounding allowance: the zero token must not set the sequence's scale (the tokens ``2^-600``
    would then be multiplied unscaled and their products underflow to a bound of 0)."""
    X = np.array([[[0.0, 0.0], [2.0**-600, 2.0**-601]]])
    inst = A.Instance(X, [1.0], np.array([2.0**600, 0.0]), np.array([[1.0, 0.5]]))
    b = lipschitz_bound(inst, kind="linear", of="output")
    exact = math.ldexp(1.25, -600)
    assert exact <= b.value <= exact * (1 + 2 * b.rounding_rtol)


# ----------------------------------------------------------------------------- defects found by mutation
def mp_softmax_weights(inst: A.Instance, W: np.ndarray) -> list[list[mpmath.mpf]]:
    """The softmax weights at ``W`` in mpmath (50 digits) from the exact input doubles."""
    n, T, d = inst.shape
    with mpmath.workdps(DPS):
        out = []
        for i in range(n):
            wz = [
                mpmath.fsum(mpmath.mpf(float(W[r, c])) * float(inst.z[i, c]) for c in range(d))
                for r in range(d)
            ]
            lg = [mpmath.fsum(mpmath.mpf(float(inst.X[i, t, r])) * wz[r] for r in range(d)) for t in range(T)]
            top = max(lg)
            ex = [mpmath.exp(v - top) for v in lg]
            tot = mpmath.fsum(ex)
            out.append([v / tot for v in ex])
        return out


def test_estimate_at_a_huge_radius_returns_the_largest_resolved_point() -> None:
    """Regression (found while judging mutants): at radius 1e30 the search's best candidate ``R·V₁`` keeps
    two tokens exactly tied at logits ~1e30, where the Jacobian is below its float64 rounding floor, and the
    estimate used to refuse with "below the rounding level" although ``||J(0)|| ≈ 0.43`` is attained and
    representable. It now returns the largest point that resolves. Oracle: the value is the mpmath
    Jacobian norm at the returned ``W`` (50 digits, weights and Jacobian from the exact doubles), at least
    ``||J(0)||`` (closed form) and at most the certified bound."""
    inst = A.Instance(TOKENS[None], [1.0], [0.5, 0.25], QUERY[None])
    e = lipschitz_estimate(inst, radius=1e30, samples=8, steps=4, starts=2)
    at_w = mp_weights_jacobian_norm(inst, mp_softmax_weights(inst, e.W))
    assert abs(mpmath.mpf(e.value) / at_w - 1) <= svd_rtol(inst)
    third = mpmath.mpf(1) / 3
    j0 = mp_weights_jacobian_norm(inst, [[third] * 3])
    assert e.value >= float(j0) * (1 - svd_rtol(inst))
    assert e.value <= lipschitz_bound(inst, radius=1e30).value


def test_estimate_on_reciprocal_scales_at_a_radius_beyond_the_logit_range_is_answered() -> None:
    """Regression: sequences with reciprocal scales (``2^±250``) have a logit map of norm ``~2^-500`` on the
    rescaled data, so the search's cap ``2^900/||𝓛||`` overflowed to inf at radius ``2^600``: the search
    multiplied by inf (numpy warning) and refused with "radius too large". The map is the balanced one
    (``a = 0``) exactly, so the answer is that of the balanced data on the same ball. Oracle: the mpmath
    Jacobian at the returned point, ``≥ ||J(0)||`` (closed form) and ``≤`` the certified bound; no warning."""
    inst = reciprocal_pair(250)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = lipschitz_estimate(inst, radius=2.0**600, samples=8, steps=4, starts=2)
    at_w = mp_weights_jacobian_norm(inst, mp_softmax_weights(inst, e.W))
    assert abs(mpmath.mpf(e.value) / at_w - 1) <= svd_rtol(inst)
    third = mpmath.mpf(1) / 3
    j0 = mp_weights_jacobian_norm(inst, [[third] * 3] * 2)
    assert e.value >= float(j0) * (1 - svd_rtol(inst))
    assert e.value <= lipschitz_bound(inst, radius=2.0**600).value


def test_a_callers_underflow_trap_changes_nothing() -> None:
    """Regression: under the caller's ``np.errstate(under="raise")`` the bound and the attained Jacobian
    used to raise numpy's ``FloatingPointError`` (an unguarded ``exp`` of huge negative exponents; token
    norms of entries far below their sequence's largest). Oracle: numpy's floating-point state is not an
    input: the results equal those under the default state, bit for bit."""
    r = np.random.default_rng(0)
    i4 = A.Instance(
        r.standard_normal((1, 3, 2)) * 2.0**-100,
        [1.0],
        np.ones(2) * 2.0**-1000,
        r.standard_normal((1, 2)) * 2.0**1000,
    )
    X = r.standard_normal((2, 3, 2))
    X[:, :, 1] *= 2.0**-600
    i1 = A.Instance(X, np.ones(2), [2.0**-600, 1.0], r.standard_normal((2, 2)))
    plain = (
        lipschitz_bound(i4, kind="softmax").value,
        jacobian_norm(i1, np.eye(2), kind="softmax", of="output"),
    )
    with np.errstate(under="raise"):
        trapped = (
            lipschitz_bound(i4, kind="softmax").value,
            jacobian_norm(i1, np.eye(2), kind="softmax", of="output"),
        )
    assert trapped == plain


# ----------------------------------------------------------------------------- the search's candidates and caps
def test_search_radius_is_capped_where_the_search_intermediates_stay_finite() -> None:
    """``_search_radius`` documents two caps: ``2^SATURATION_LOG2/||𝓛||_F`` and
    ``2^(SATURATION_LOG2+100)/(max||x||·max||z||)``. Two sequences with reciprocal scales (tokens ``½·e₁`` and
    0, query ``2^-300·e₁``; the reverse) have ``||𝓛||_F = √2·2^-301`` (the first cap overflows to inf) and
    ``max||x||·max||z|| = ¼`` exactly, so on a ball of ``2^1020`` the search radius is ``2^1000/¼ = 2^1002``
    exactly (hand-derived from the docstring's formula), also when that product is below 1."""
    from attnsvm.lipschitz import SATURATION_LOG2
    from attnsvm.lipschitz._estimate import _search_radius

    assert SATURATION_LOG2 == 900
    tiny = 2.0**-300
    X = np.array([[[0.5, 0.0], [0.0, 0.0]], [[tiny, 0.0], [0.0, 0.0]]])
    inst = A.Instance(X, np.ones(2), np.array([1.0, 0.0]), np.array([[tiny, 0.0], [0.5, 0.0]]))
    assert _search_radius(inst, 2.0**1020, 0) == 2.0**1002
    assert _search_radius(inst, 2.0**1000, 2) == 2.0**1002  # R·2^shift beyond the cap
    assert _search_radius(inst, 2.0**500, 0) == 2.0**500  # a ball inside the cap is kept


#: Two 1-d sequences (``z = 1``, ``W = w``) whose best structured candidate is a quarter of the ball, one on
#: each side of the logit map's top singular vector ``V₁``, whatever sign the eigensolver gives it (the
#: logits at ``t R V₁`` are ``t R σ₁ u``, ``u`` the Gram's top eigenvector, ``∝ ±x``). Along ``w`` two of the
#: three weights stay tied, ``s = (s₁, (1 − s₁)/2, (1 − s₁)/2)``, and ``||J(w)|| = c·s₁(1 − s₁)·√(3/2)``
#: (``c`` the tokens' gap) is largest at ``s = (½, ¼, ¼)``:
#:
#: * ``x = (2, 0, 0)``: ``s₁ = e^{2w}/(e^{2w} + 2)``, best at ``w = ln 2/2``, ``R = 2 ln 2``;
#: * ``x = (1, 2, 2)``: ``s₁ = 1/(1 + 2e^{w})``, best at ``w = −ln 2``, ``R = 4 ln 2``.
#:
#: At the other candidates ``s₁ ∈ {⅓, ⅕, ⅔, 1/9, 8/9, 1/17}``, at most ``8/9`` of the best value; the
#: two sequences rank the candidates ``+¼ V₁`` and ``−¼ V₁`` oppositely (``u₁`` has the sign of ``x₁`` in one
#: frame and the opposite in the other), so one of them needs ``t = −¼``.
QUARTER_CASES = [
    ((2.0, 0.0, 0.0), 2.0 * math.log(2.0), math.log(2.0) / 2),
    ((1.0, 2.0, 2.0), 4.0 * math.log(2.0), -math.log(2.0)),
]


@pytest.mark.parametrize(("tokens", "radius", "w_best"), QUARTER_CASES)
def test_structured_candidates_include_both_signs_of_the_top_singular_vector(
    tokens: tuple[float, float, float], radius: float, w_best: float
) -> None:
    """Documented: the candidates are ``W = 0`` and ``t R V₁`` for ``t ∈ {±¼, ±½, ±1}``; with no random
    samples and no ascent the estimate is the largest of those seven values (see ``QUARTER_CASES``: a
    quarter of the ball, on the side of ``V₁`` fixed by the data). Oracle: the closed form at
    ``s = (½, ¼, ¼)`` in mpmath (``√6/4``, ``√6/8``), ≥ 9/8 times every other candidate's value, and the
    hand-derived maximiser ``w``."""
    inst = A.Instance(np.array(tokens)[None, :, None], [1.0], np.array([1.0]), np.array([[1.0]]))
    e = lipschitz_estimate(inst, radius=radius, samples=0, steps=0, starts=1)
    best = mp_weights_jacobian_norm(inst, [[mpmath.mpf(1) / 2, mpmath.mpf(1) / 4, mpmath.mpf(1) / 4]])
    assert abs(mpmath.mpf(e.value) / best - 1) <= svd_rtol(inst)
    assert float(e.W[0, 0]) == pytest.approx(w_best, rel=4 * EPS)


# ----------------------------------------------------------------------------- refusals, named
#: Two tokens ``(1, 0)`` and ``(1, 2^-60)`` (query ``e₁ + e₂``, ``||z|| = √2``): every logit difference is
#: ``≤ 2^-60·||W||·√2`` and the weights' derivative is at most ½ per logit, so ``||J(W)|| ≤ 2^-61·√2`` on the
#: unit ball, far below the Jacobian's float64 rounding floor (``~100·eps·||𝓛|| ≈ 2^-45``).
NEAR_COINCIDENT = 2.0**-60


@pytest.mark.parametrize("steps", [0, 3])
def test_estimate_refuses_when_no_point_resolves_above_the_rounding_floor(steps: int) -> None:
    """Documented (Raises): no point searched, down to ``W = 0``, has a Jacobian above its float64 rounding
    level (every sequence's tokens nearly coincide) → ``NumericalError`` naming the rounding level, never
    another exception. Oracle: the hand bound of ``NEAR_COINCIDENT`` (the true value is below the floor)."""
    X = np.array([[[1.0, 0.0], [1.0, NEAR_COINCIDENT]]])
    inst = A.Instance(X, [1.0], np.array([1.0, 0.0]), np.array([[1.0, 1.0]]))
    with pytest.raises(NumericalError, match="below the rounding level of its float64 computation"):
        lipschitz_estimate(inst, radius=1.0, samples=4, steps=steps, starts=2)


def test_estimate_beyond_float64_names_the_estimate_and_its_radius() -> None:
    """Scale contract: ``X`` and ``z`` times ``2^600`` multiply the weights Jacobian by ``2^1200`` exactly
    (``||J(0)|| ≈ 0.43·2^1200 ≈ 1e360``), beyond float64: ``NumericalError`` naming the estimate, its
    radius and the representable range (``RANGE_TEXT``, the contract's wording), not a number."""
    inst = A.Instance(np.ldexp(TOKENS, 600)[None], [1.0], [0.5, 0.25], np.ldexp(QUERY, 600)[None])
    with pytest.raises(NumericalError) as info:
        lipschitz_estimate(inst, radius=1.0, samples=4, steps=2)
    msg = str(info.value)
    assert "softmax weights Lipschitz estimate (radius" in msg
    assert RANGE_TEXT in msg


def test_a_callers_underflow_trap_changes_nothing_in_the_estimate() -> None:
    """Under the caller's ``np.errstate(under="raise")`` the estimate answers as under the default state: data
    of size ``2^-300`` put the ball ``R = 2^-500`` at ``2^-1100`` on the rescaled data (it underflows to 0: the
    estimate is the Jacobian at ``W = 0``). Oracle: numpy's floating-point state is not an input
    (bit-identical results) and the value is ``||J(0)||`` of the balanced data times ``2^-600`` (closed form
    in mpmath)."""
    inst = A.Instance(np.ldexp(TOKENS, -300)[None], [1.0], [0.5, 0.25], np.ldexp(QUERY, -300)[None])
    plain = lipschitz_estimate(inst, radius=2.0**-500, samples=4, steps=2)
    with np.errstate(under="raise"):
        trapped = lipschitz_estimate(inst, radius=2.0**-500, samples=4, steps=2)
    assert trapped.value == plain.value
    assert np.array_equal(trapped.W, plain.W)
    balanced = A.Instance(TOKENS[None], [1.0], [0.5, 0.25], QUERY[None])
    j0 = mp_weights_jacobian_norm(balanced, [[mpmath.mpf(1) / 3] * 3])
    assert abs(mpmath.mpf(math.ldexp(plain.value, 600)) / j0 - 1) <= svd_rtol(inst)


#: Seeds of the power test of the even draws' radius law: the KS distance between ``ρ^{d²}`` and a law one
#: power of ``ρ`` off (``ρ^{d²/2}``, i.e. ``U^{2/d²}``) is ``¼``; with 100 draws a correct sampler passes at
#: ``KS_ALPHA`` and that wrong one is rejected at ``p ≈ 2·e^{−2·100·(¼)²} ≈ 7e-6``.
POWER_SEEDS = 100


def test_random_points_of_even_draws_have_the_radius_law_of_the_ball_not_a_lower_power() -> None:
    """Documented: even draws are uniform in the ball, ``ρ = R U^{1/d²}``, so ``||W||_F/R`` has the CDF
    ``ρ^{d²}`` (``d² = 9``). As :func:`test_random_points_of_even_draws_are_uniform_in_the_ball`, with
    ``POWER_SEEDS`` seeds: enough to tell ``ρ^9`` from ``ρ^{4.5}`` (``U^{2/d²}``). Oracle: the ball's
    volume law, Kolmogorov–Smirnov at ``KS_ALPHA``, both ways (the right law accepted, the half power
    rejected)."""
    from scipy.stats import kstest

    inst = triangle_with_common_part()
    j0 = float(mp_weights_jacobian_norm(inst, [[mpmath.mpf(1) / 3] * 3]))
    radii = []
    for seed in range(POWER_SEEDS):
        e = lipschitz_estimate(inst, radius=1.0, seed=seed, samples=1, steps=0)
        assert e.value > j0 * (1 + ABOVE_J0)  # the sample is the point found (premise)
        radii.append(float(np.linalg.norm(e.W)))
    assert kstest(radii, lambda x: np.clip(x, 0.0, 1.0) ** 9).pvalue >= KS_ALPHA
    assert kstest(radii, lambda x: np.clip(x, 0.0, 1.0) ** 4.5).pvalue < KS_ALPHA


#: Ascent steps allowed in the boundary test: far more than the halvings that take ``η`` from ``R/4`` below
#: ``1e-9·R`` (28), so an ascent that halved on every non-improving step ends long before them.
BOUNDARY_STEPS = 100


@pytest.mark.parametrize("radius", [0.25, 0.375, 0.5])
def test_ascent_at_a_boundary_maximiser_halves_its_step_and_stops(radius: float) -> None:
    """``x = (1, 2, 2)``, ``z = 1`` (``d = 1``): ``||J(w)|| = √(3/2)·s₁(1 − s₁)`` with ``s₁ = 1/(1 + 2e^w)``
    grows as ``w`` decreases to ``−ln 2``, so on a ball ``R < ln 2`` the maximiser is the edge ``w = −R``
    (the candidate ``−R·sign V₁``, the best start). Every ascent step there leaves the ball outwards and is
    projected back onto the same point: no improvement, so (documented) ``η`` is halved each time and the
    ascent stops once ``η`` is negligible, long before ``BOUNDARY_STEPS``. Oracle: the hand-derived
    maximiser, the mpmath Jacobian there, and the evaluation count (7 candidates + the halvings, ``<
    7 + BOUNDARY_STEPS``; an ascent that moves on equal values never halves and spends every step)."""
    inst = A.Instance(np.array([1.0, 2.0, 2.0])[None, :, None], [1.0], np.array([1.0]), np.array([[1.0]]))
    e = lipschitz_estimate(inst, radius=radius, samples=0, steps=BOUNDARY_STEPS, starts=1)
    assert float(e.W[0, 0]) == -radius
    at_edge = mp_weights_jacobian_norm(inst, mp_softmax_weights(inst, np.array([[-radius]])))
    assert abs(mpmath.mpf(e.value) / at_edge - 1) <= svd_rtol(inst)
    assert 7 < e.evaluations < 7 + BOUNDARY_STEPS // 2
