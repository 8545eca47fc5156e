"""`attnsvm.peers._mirror` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.peers._mirror` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).

The descent tests use one hand-solvable instance (``_two_token_instance``): one sequence, tokens
``x_1 = e_1``, ``x_2 = e_2``, query ``z = e_1``, values ``a = (1, 0)``, label ``Y = 1``. With
``W = w·[[1, 0], [−1, 0]]`` the logits are ``(w, −w)``, so ``s_1 = σ(2w)``, ``f = s_1`` and

    ∇L(W) = ℓ'(f)·s_1 s_2·[[1, 0], [−1, 0]]      (ℓ'(u) = −1/(1 + e^u) < 0 for the logistic loss),

whose ℓq-normalisation is ``−2^{−1/q}·[[1, 0], [−1, 0]]`` whatever ``w``. Normalized ℓp mirror descent
from ``W_0 = 0`` therefore has the closed form ``U_t = t·η·2^{−1/q}·[[1, 0], [−1, 0]]``,
``W_t = sign(U_t)|U_t|^{q−1}`` (derived by hand, evaluated in mpmath). The direction is the same at
*every* ``W`` (``∇L ∝ (x_1 − x_2)zᵀ``), so from any ``W_0`` one step gives
``U_1 = ∇ψ(W_0) + η·2^{−1/q}·[[1, 0], [−1, 0]]`` (``_dual_closed_form``): the oracle of the dual-state
tests (issue 13 §1), which run with every warning an error.
"""

from __future__ import annotations

import itertools
import math
import warnings

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.peers import _mirror as M

EPS = float(np.finfo(np.float64).eps)
FLOAT_TINY = float(np.finfo(np.float64).tiny)  # 2^−1022, the smallest normal double
FLOAT_MAX = float(np.finfo(np.float64).max)

#: The scale contract's range as every refusal names it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
#: The documented remedy of an iterate refusal and of a plain-gradient refusal.
ITERATE_REMEDY = "Lower (overflow) or raise (underflow) lr, or rescale the data"
GRAD_REMEDY = "Use the normalized gradient (direction and log-norm), which stays exact at any size"
#: What the two maps call their entries in a refusal (the docstrings' equations).
MAP_WHAT = "an entry of the mirror map ∇ψ(W) = sign(W)|W|^(p−1)"
INVERSE_WHAT = "an entry of the inverse mirror map sign(U)|U|^(1/(p−1))"

#: mpmath digits for the closed-form oracles: 40 digits make their own error negligible next to eps.
ORACLE_DPS = 40
#: Relative error of the iterates after ≤ 2 normalized steps of the two-token instance: the core's
#: log-domain direction and its ℓq norm (two pows and a two-term sum) give each entry of g to
#: ≤ 8 eps; two steps of the same sign add ≤ 16 eps to U (no cancellation); W = U² doubles it.
ITERATE_RTOL = 32 * EPS
#: Relative error of a recorded ||W||_p and risk: the iterate's 32 eps (above) through a norm of
#: degree 1 and a softmax/log1p chain whose condition number at |w| ≤ 1 is below 1, plus ≤ 16 eps of
#: their own evaluation (pow, sum, exp, log1p).
RECORD_RTOL = 64 * EPS
#: Absolute error of a recorded log10||∇L||_F: a sum of O(1) logarithms, each to a few ulps
#: (the core's log-magnitude split), divided by ln 10.
LOG10_ATOL = 16 * EPS
#: Documented absolute accuracy of D_ψ: ~1e-16 per entry (4 entries here), 4 eps per entry.
BREGMAN_ATOL = 4 * 4 * EPS

#: Floating-point error states a caller may have set: numpy's default and the strictest one. A map's
#: result or refusal must not depend on them (the maps set their own state around the power).
CALLER_ERRSTATES: tuple[dict[str, str], ...] = ({}, {"all": "raise"})

P = 1.5  # the descent tests' exponent: q = 3, q − 1 = 1/(p − 1) = 2, both exact
Q = 3.0


def _two_token_instance() -> A.Instance:
    """The hand-solvable instance of the module docstring."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]]))


def _closed_form(t: int, lr: float) -> dict[str, mpmath.mpf]:
    """Hand-derived state after ``t`` normalized steps (module docstring), in ``ORACLE_DPS`` digits:
    ``u = t·η·2^{−1/q}``, ``w = u^{q−1}``, ``||W||_p = 2^{1/p} w``, the risk ``log(1 + e^{−f})`` and
    ``||∇L||_F = √2·s_1 s_2/(1 + e^f)`` with ``s_1 = σ(2w) = f``."""
    mp = mpmath.mpf
    u = t * mp(lr) * mp(2) ** (-1 / mp(Q))
    w = u ** (mp(Q) - 1)
    s1 = 1 / (1 + mpmath.exp(-2 * w))
    s2 = 1 - s1
    return {
        "u": u,
        "w": w,
        "norm_p": mp(2) ** (1 / mp(P)) * w,
        "risk": mpmath.log(1 + mpmath.exp(-s1)),
        "grad_fro": mpmath.sqrt(2) * s1 * s2 / (1 + mpmath.exp(s1)),
    }


def _bregman_oracle(R: np.ndarray, W: np.ndarray, p: float) -> mpmath.mpf:
    """``D_ψ(a, b) = Σ (1/p)|a|^p + ((p−1)/p)|b|^p − sign(b)|b|^{p−1}a`` of the ℓp-unit directions,
    straight from the definition (module docstring of :mod:`attnsvm.peers._mirror`) in mpmath."""
    mp = mpmath.mpf
    pp = mp(p)
    a = [mp(float(x)) for x in np.ravel(R)]
    b = [mp(float(x)) for x in np.ravel(W)]
    na = mpmath.fsum(abs(x) ** pp for x in a) ** (1 / pp)
    nb = mpmath.fsum(abs(x) ** pp for x in b) ** (1 / pp)
    a, b = [x / na for x in a], [x / nb for x in b]
    return mpmath.fsum(
        abs(x) ** pp / pp + (pp - 1) / pp * abs(y) ** pp - mpmath.sign(y) * abs(y) ** (pp - 1) * x
        for x, y in zip(a, b, strict=True)
    )


# ------------------------------------------------------------------ the maps at the range's ends
def test_maps_return_images_at_the_normal_range_ends_exactly():
    """Oracle: exact powers of two. (±2^−511)² = ±2^−1022 and, at p = 2 (the identity), 2^−1022 and
    1.8e308 are themselves: normal doubles, so the contract returns them, bit for bit, not a refusal."""
    half = 2.0**-511
    assert np.array_equal(M.mirror_map(np.array([half, -half]), 3.0), [FLOAT_TINY, -FLOAT_TINY])
    assert np.array_equal(M.mirror_map(np.array([FLOAT_TINY, -FLOAT_MAX]), 2.0), [FLOAT_TINY, -FLOAT_MAX])
    assert np.array_equal(
        M.inverse_mirror_map(np.array([-FLOAT_TINY, FLOAT_MAX]), 2.0), [-FLOAT_TINY, FLOAT_MAX]
    )
    with np.errstate(all="raise"):  # zeros are mapped to 0 without taking log 0 (no FloatingPointError)
        assert np.array_equal(M.mirror_map(np.array([0.0, -half]), 3.0), [0.0, -FLOAT_TINY])


def test_maps_refuse_an_image_that_rounds_past_the_largest_double():
    """Oracle: (2^512)² = 2^1024 > 1.8e308 exactly (hand-computed), for ∇ψ at p = 3 and its inverse at
    p = 1.5 (exponent 1/(p − 1) = 2). The logarithm test alone cannot see it (2·log 2^512 rounds to
    log(1.8e308)); the refusal names the map and the size 1e+308, never an Inf, and it is the same
    whatever numpy error state the caller has set (no warning or FloatingPointError escapes)."""
    for (call, what), state in itertools.product(
        (
            (lambda: M.mirror_map(np.array([1.0, 2.0**512]), 3.0), MAP_WHAT),
            (lambda: M.inverse_mirror_map(np.array([2.0**512, 1.0]), 1.5), INVERSE_WHAT),
        ),
        CALLER_ERRSTATES,
    ):
        with np.errstate(**state), pytest.raises(NumericalError) as exc:
            call()
        # Was: "… it underflows" (the rounded log passed to range_error sat at LOG_FLOAT_MAX).
        assert str(exc.value) == f"{what} is about 1e+308: it overflows {RANGE_TEXT}", state


def test_maps_refuse_an_image_that_rounds_into_the_subnormal_band():
    """Oracle: the double just below 2^−511 squares to 2^−1022·(1 − 2^−53)² < 2^−1022 (hand-computed),
    a subnormal that would lose digits; 2·log of it rounds to log(2^−1022), so only the rounded-end
    check sees it. The refusal names the map and the size 1e-308, the same whatever numpy error state
    the caller has set (no FloatingPointError escapes under ``np.errstate(all="raise")``)."""
    below = float(np.nextafter(2.0**-511, 0.0))
    for (call, what), state in itertools.product(
        (
            (lambda: M.mirror_map(np.array([-below]), 3.0), MAP_WHAT),
            (lambda: M.inverse_mirror_map(np.array([below]), 1.5), INVERSE_WHAT),
        ),
        CALLER_ERRSTATES,
    ):
        with np.errstate(**state), pytest.raises(NumericalError) as exc:
            call()
        assert str(exc.value) == f"{what} is about 1e-308: it underflows {RANGE_TEXT}", state


def test_map_refusals_report_the_entry_that_leaves_the_range():
    """Oracle: exact powers of two, sizes hand-computed. An underflow reports the smallest image, an
    overflow the largest, whatever the other entries: (2^±600)² = 2^±1200 ≈ 10^±361.2; the double just
    below 2^−511 squares below 2^−1022 ≈ 10^−307.7 (rounded-end branch). Was: the rounded-end refusal
    reported the largest entry's size (1e+0) as an underflow. An overflow is named first when both
    occur. The same whatever numpy error state the caller has set."""
    below = float(np.nextafter(2.0**-511, 0.0))
    cases = [
        (lambda: M.mirror_map(np.array([below, 1.0]), 3.0), MAP_WHAT, "1e-308: it underflows"),
        (lambda: M.inverse_mirror_map(np.array([1.0, -below]), 1.5), INVERSE_WHAT, "1e-308: it underflows"),
        (lambda: M.mirror_map(np.array([2.0**-600, 4.0]), 3.0), MAP_WHAT, "1e-361: it underflows"),
        (lambda: M.mirror_map(np.array([4.0, -(2.0**600)]), 3.0), MAP_WHAT, "1e+361: it overflows"),
        (lambda: M.mirror_map(np.array([2.0**-600, 2.0**600]), 3.0), MAP_WHAT, "1e+361: it overflows"),
    ]
    assert f"1e{1200 * math.log10(2.0):+.0f}" == "1e+361" and f"1e{-1022 * math.log10(2.0):+.0f}" == "1e-308"
    for (call, what, size), state in itertools.product(cases, CALLER_ERRSTATES):
        with np.errstate(**state), pytest.raises(NumericalError) as exc:
            call()
        assert str(exc.value) == f"{what} is about {size} {RANGE_TEXT}", state


def test_maps_and_bregman_name_their_bad_argument():
    """Oracle: the documented input-validation text (attnsvm.model._instance.as_real_array) with the
    argument's own name, as the signatures spell it (W, U, reference, W)."""
    nan_at_0 = "must be finite; found nan at index (0,). Remove or impute NaN/Inf entries first."
    inf_at_1 = "must be finite; found inf at index (1,). Remove or impute NaN/Inf entries first."
    cases = [
        (lambda: M.mirror_map(np.array([np.nan, 1.0]), 2.0), "W " + nan_at_0),
        (lambda: M.inverse_mirror_map(np.array([np.nan, 1.0]), 2.0), "U " + nan_at_0),
        (lambda: M.bregman_divergence(np.array([np.nan, 1.0]), np.ones(2), 2.0), "reference " + nan_at_0),
        (lambda: M.bregman_divergence(np.ones(2), np.array([1.0, np.inf]), 2.0), "W " + inf_at_1),
    ]
    for call, message in cases:
        with pytest.raises(AttnSVMError) as exc:
            call()
        assert str(exc.value) == message


# --------------------------------------------------------------------------- mirror descent
def test_normalized_descent_follows_the_closed_form_and_records_it():
    """Oracle: the hand-derived closed form of the module docstring (40-digit mpmath) and the Bregman
    divergence from its definition. Recording at steps [0, 2] with a reference gives exactly those
    records: at W_0 = 0 no direction (D = NaN) and ||∇L|| = (√2/4)/(1 + e^½); at step 2 the closed-form
    norm, risk, ||∇L|| and D_ψ. The result carries W, the dual U = ∇ψ(W) and p; iterates are not kept
    unless asked."""
    inst, lr = _two_token_instance(), 0.1
    R = np.array([[1.0, 0.0], [-0.5, 0.0]])  # a reference direction other than the iterate's
    pattern = np.array([[1.0, 0.0], [-1.0, 0.0]])
    with mpmath.workdps(ORACLE_DPS):
        tr = M.run_mirror_descent(inst, P, 2, lr, record_at=[0, 2], reference=R)
        assert tr.p_norm == P
        assert [r.step for r in tr.record] == [0, 2] and all(type(r.step) is int for r in tr.record)
        assert all(r.W is None for r in tr.record)  # keep_iterates defaults to False
        end = _closed_form(2, lr)
        np.testing.assert_allclose(tr.U, float(end["u"]) * pattern, rtol=ITERATE_RTOL, atol=0)
        np.testing.assert_allclose(tr.W, float(end["w"]) * pattern, rtol=ITERATE_RTOL, atol=0)
        for rec, t in zip(tr.record, (0, 2), strict=True):
            cf = _closed_form(t, lr)
            assert rec.norm_p == pytest.approx(float(cf["norm_p"]), rel=RECORD_RTOL, abs=0)
            assert rec.risk == pytest.approx(float(cf["risk"]), rel=RECORD_RTOL, abs=0)
            assert rec.log10_grad_norm == pytest.approx(float(mpmath.log10(cf["grad_fro"])), abs=LOG10_ATOL)
            assert rec.tokens.tolist() == [0]  # logits (w, −w), w ≥ 0: token 1 (ties at t = 0 pick it)
        assert math.isnan(tr.record[0].bregman)
        D = float(_bregman_oracle(R, float(end["w"]) * pattern, P))
        assert tr.record[1].bregman == pytest.approx(D, abs=BREGMAN_ATOL)
        assert D > 1e-3  # the reference is not the iterate's direction: a real comparison


def test_kept_iterates_are_the_closed_form_iterates():
    """Oracle: the closed form (module docstring); ``keep_iterates=True`` stores W_t at each record."""
    inst, lr = _two_token_instance(), 0.25
    pattern = np.array([[1.0, 0.0], [-1.0, 0.0]])
    tr = M.run_mirror_descent(inst, P, 3, lr, record_at=[1, 3], keep_iterates=True)
    with mpmath.workdps(ORACLE_DPS):
        for rec in tr.record:
            w = float(_closed_form(rec.step, lr)["w"])
            np.testing.assert_allclose(rec.W, w * pattern, rtol=ITERATE_RTOL, atol=0)


def test_iterate_out_of_range_is_refused_with_its_size_and_remedy():
    """Oracle: the closed form's first iterate |W_1| = (η·2^{−1/3})² (hand-derived): η = 1e300 gives
    10^599.8 (overflow), η = 1e-200 gives 10^−400.2 (underflow); the refusal names the step, the
    iterate, its size and the documented remedy instead of returning Inf or 0."""
    inst = _two_token_instance()
    for lr, size in ((1e300, "1e+600: it overflows"), (1e-200, "1e-400: it underflows")):
        k = 2 * (math.log10(lr) - math.log10(2.0) / 3)
        assert f"1e{k:+.0f}" == size.split(":")[0]  # the oracle's size, as range_error rounds it
        with pytest.raises(NumericalError) as exc:
            M.run_mirror_descent(inst, P, 1, lr, record_at=[1])
        assert str(exc.value) == (
            f"mirror descent at step 1: the iterate W = (∇ψ)^(−1)(U) is about {size} {RANGE_TEXT}. "
            + ITERATE_REMEDY
        )


def test_step_refusal_names_the_variant_and_the_step():
    """Oracle: hand-computed size and the documented prefix. Unit tokens and query, W_0 = 1e308: the
    logit scale max|W|·2^(1+1) = 4e308 ≈ 10^308.6 overflows at the first update (step 0 is not
    recorded); the message says which variant (normalized or plain) refused and at which step."""
    inst = _two_token_instance()
    tail = (
        f"the logit scale max|W|·max|x|·max|z| is about 1e+309: it overflows {RANGE_TEXT}. "
        "Scale W or the data down; the attention logits would overflow"
    )
    for normalized, prefix in ((True, "normalized mirror descent"), (False, "mirror descent")):
        with pytest.raises(NumericalError) as exc:
            M.run_mirror_descent(
                inst, 2.0, 1, 0.1, normalized=normalized, W0=np.full((2, 2), 1e308), record_at=[1]
            )
        assert str(exc.value) == f"{prefix} at step 1: {tail}"


def test_plain_gradient_overflow_is_refused_by_name():
    """Oracle: hand-derived. The two-token instance with X, z, v scaled by c = 2^300 and Y = −1: at
    W = 0, s = (½, ½), f = 2^599, ℓ'(−2^599) = −1 (to e^{−2^599}), so ∇L[0, 0] = ½·2^599·c² = 2^1198
    ≈ 10^360.6, beyond float64. The plain variant refuses naming the gradient and pointing to the
    normalized one (which runs: its direction is scale-free)."""
    c = 2.0**300
    base = _two_token_instance()
    inst = A.Instance(c * base.X, np.array([-1.0]), c * base.v, c * base.z)
    assert f"1e{1198 * math.log10(2.0):+.0f}" == "1e+361"
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(inst, 2.0, 1, 0.1, normalized=False, record_at=[1])
    assert str(exc.value) == (
        f"mirror descent at step 1: the risk gradient ∇L(W) is about 1e+361: it overflows {RANGE_TEXT}. "
        + GRAD_REMEDY
    )


def test_recorded_risk_underflow_is_refused_by_name():
    """Oracle: hand-derived. Equal values a = (800, 800) make f = 800 at every W (and ∇L = 0 exactly,
    a stationary point), so L = log(1 + e^−800) ≈ e^−800 = 10^−347.4 is below the normal range: the
    record at step 0 refuses naming the risk, instead of recording a subnormal or 0."""
    base = _two_token_instance()
    inst = A.Instance(base.X, base.Y, np.array([800.0, 800.0]), base.z)
    assert f"1e{-800 / math.log(10.0):+.0f}" == "1e-347"
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(inst, 2.0, 1, 0.1, record_at=[0])
    assert str(exc.value) == (
        f"mirror descent, record at step 0: the risk L(W) is about 1e-347: it underflows {RANGE_TEXT}"
    )


def test_reference_is_validated_by_name():
    """Oracle: the documented validation text (Instance.check_weights) naming ``reference``."""
    with pytest.raises(AttnSVMError) as exc:
        M.run_mirror_descent(_two_token_instance(), 2.0, 1, 0.1, reference=np.ones((3, 3)))
    assert str(exc.value) == "reference must have shape (d, d) = (2, 2) for this instance; got (3, 3)"


# ------------------------------------------------- the dual state at any size (issue 13 §1)
#: The engine's documented p range: p − 1 ∈ [2^−9, 2^9] (attnsvm.peers._mirror.ENGINE_P_BITS, docstring).
P_LOW, P_HIGH = 1.0 + 2.0**-9, 1.0 + 2.0**9
#: Relative error of an iterate W = U^{1/(p−1)} at p = 1 + 2^−9: the power 1/(p − 1) = 512 is the
#: condition number of the inverse map, so the dual entry's error (≤ ITERATE_RTOL, as above: W_0's
#: image and one step) is multiplied by 512.
CONDITIONED_RTOL = 512 * ITERATE_RTOL
#: The absolute accuracy of an entry far below the largest: gradual underflow rounds it to the
#: subnormal grid (error ≤ 2^−1075, documented); 2^−1075 itself is not a double, so 2^−1074 bounds it.
FLUSH_ATOL = 2.0**-1074


def _dual_closed_form(W0: np.ndarray, p: float, lr: float, t: int = 1) -> tuple[list, list]:
    """Normalized ℓp mirror descent on the two-token instance (or any instance with x_1 = c·e_1,
    x_2 = c·e_2, z = c'·e_1, a_1 > a_2, Y = 1) from any ``W0``: ``∇L ∝ −(e_1 − e_2)e_1ᵀ`` at every ``W``
    (hand-derived: ``∇L = ℓ'(f)·s_1 s_2 (a_1 − a_2)(x_1 − x_2)zᵀ`` with ``ℓ' < 0``), so
    ``U_t = ∇ψ(W0) + t·η·2^{−1/q}·[[1, 0], [−1, 0]]`` and ``W_t = sign(U_t)|U_t|^{1/(p−1)}``, in
    ``ORACLE_DPS`` digits; returns ``(U_t, W_t)`` as nested lists of mpf. The inverse power is the
    engine's: the double nearest ``1/(p − 1)``, taken exactly (its own rounding moves ``W`` by
    ``½eps·|ln W|``, 80 eps at 1e-300, which is not the engine's error to measure); ``p − 1`` is exact."""
    mp = mpmath.mpf
    pp = mp(p)
    e_inv = mp(1.0 / (p - 1.0))
    step = t * mp(lr) * mp(2) ** (-(pp - 1) / pp)
    pattern = [[1, 0], [-1, 0]]
    U = [
        [mpmath.sign(mp(w)) * abs(mp(w)) ** (pp - 1) + step * pattern[i][j] for j, w in enumerate(row)]
        for i, row in enumerate(np.asarray(W0, dtype=np.float64).tolist())
    ]
    W = [[mpmath.sign(u) * abs(u) ** e_inv for u in row] for row in U]
    return U, W


def _assert_entrywise(got: np.ndarray, want: list, rtol: float, atol: float = 0.0) -> None:
    """``|got_ij − want_ij| ≤ rtol·|want_ij| + atol`` for every entry (``want``, and ``got`` where it is
    an exact state beyond float64, in mpmath)."""
    for i, j in itertools.product(range(len(want)), range(len(want[0]))):
        g = got[i][j] if isinstance(got[i][j], mpmath.mpf) else mpmath.mpf(float(got[i][j]))
        assert abs(g - want[i][j]) <= rtol * abs(want[i][j]) + atol, (i, j, g, want[i][j])


def _exact_dual(tr: M.MirrorTrajectory) -> list:
    """The trajectory's dual state ``U_mantissa ⊙ 2^U_exponent`` as exact mpf values."""
    return [
        [mpmath.ldexp(mpmath.mpf(float(m)), int(k)) for m, k in zip(mr, kr, strict=True)]
        for mr, kr in zip(tr.U_mantissa, tr.U_exponent, strict=True)
    ]


def _run_strict(*args, **kwargs) -> M.MirrorTrajectory:
    """``run_mirror_descent`` with every warning an error: no RuntimeWarning may escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return M.run_mirror_descent(*args, **kwargs)


@pytest.mark.parametrize("W0", [[[0.0, 1e-200], [0.0, 0.0]], [[1e-200, 1e-200], [0.0, 0.0]]])
def test_descent_keeps_a_dual_entry_below_the_normal_range(W0):
    """Oracle: the hand-derived closed form (``_dual_closed_form``, 40-digit mpmath). At p = 3 the
    dual entry of W0 = 1e-200 is 1e-400, below any double; the gradient's second column is exactly 0,
    so W_1[0, 1] = 1e-200 (was: 0, a silent zero). The second W0 also adds a step to a dual entry
    1e-400 (the step dominates) and keeps the dual state exact: U_mantissa·2^U_exponent = U_1, a zero
    entry stored as (0, 0). ``tr.U`` gives the doubles (1e-400 flushed within 2^−1075)."""
    lr = 0.1
    with mpmath.workdps(ORACLE_DPS):
        U1, W1 = _dual_closed_form(np.array(W0), 3.0, lr)
        tr = _run_strict(_two_token_instance(), 3.0, 1, lr, W0=W0, record_at=[1])
        _assert_entrywise(tr.W, W1, ITERATE_RTOL)
        assert tr.W[0, 1] != 0
        _assert_entrywise(_exact_dual(tr), U1, ITERATE_RTOL)
        assert tr.U_mantissa[1, 1] == 0 and tr.U_exponent[1, 1] == 0
        assert all(0.5 <= abs(m) < 1 for m in tr.U_mantissa.ravel() if m != 0)  # frexp form
        _assert_entrywise(tr.U, U1, ITERATE_RTOL, FLUSH_ATOL)


def test_descent_returns_an_iterate_whose_dual_state_overflows():
    """Oracle: the closed form (mpmath). p = 3, W0[0, 1] = 1e300, η = 1e-300: U_1[0, 1] = 1e600 is
    no double but W_1 = (1e300 there, ±(η·2^{−2/3})^{1/2} ≈ 7.9e-151 in column 0) is. Was: refused as
    "the iterate W … is beyond any double (overflow)" with a RuntimeWarning. The exact dual state is
    1e600; ``tr.U`` refuses it by name and size (10^600, hand-computed) and points to the exact state."""
    lr, W0 = 1e-300, np.array([[0.0, 1e300], [0.0, 0.0]])
    with mpmath.workdps(ORACLE_DPS):
        U1, W1 = _dual_closed_form(W0, 3.0, lr)
        tr = _run_strict(_two_token_instance(), 3.0, 1, lr, W0=W0, record_at=[1])
        _assert_entrywise(tr.W, W1, ITERATE_RTOL)
        _assert_entrywise(_exact_dual(tr), U1, ITERATE_RTOL)
    with pytest.raises(NumericalError) as exc:
        tr.U  # noqa: B018
    assert str(exc.value) == (
        f"the dual iterate U = ∇ψ(W) is about 1e+600: it overflows {RANGE_TEXT}. "
        "Read the exact dual state from U_mantissa·2^U_exponent"
    )


def test_plain_step_beyond_float64_follows_the_closed_form():
    """Oracle: hand-derived, evaluated in mpmath. x_1 = e_1, x_2 = e_2, z = (1, 2^−1000), a = (1e305, 0),
    Y = −1, W0 = 1e300·e_1e_2ᵀ: logits (1e300·2^−1000, 0), f = s_1 a_1, ℓ'(−f) = −1 (to e^{−5e304}), so
    ∇L = s_1 s_2 a_1 (e_1 − e_2)zᵀ ≈ 2.5e304 and η∇L ≈ 2.5e612 overflows, while
    W_1 = sign(U_1)|U_1|^{1/2} (U_1 = ∇ψ(W0) − η∇L) is (∓1.6e306, 1e300; 4.8e155 at [1, 1]): all doubles.
    Was: ``U − lr*g`` leaked overflow/invalid RuntimeWarnings and the run was refused. The plain
    gradient is accurate to ≤ 8 eps per entry (as for the normalized one), so ITERATE_RTOL holds."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    z1 = 2.0**-1000
    inst = A.Instance(X, np.array([-1.0]), np.array([1e305, 0.0]), np.array([[1.0, z1]]))
    W0, lr = np.array([[0.0, 1e300], [0.0, 0.0]]), 1e308
    with mpmath.workdps(ORACLE_DPS):
        mp = mpmath.mpf
        s1 = 1 / (1 + mpmath.exp(-mp(1e300) * mp(z1)))
        c = s1 * (1 - s1) * mp(1e305) / (1 + mpmath.exp(-s1 * mp(1e305)))  # −ℓ'(Yf)·Y = 1/(1 + e^{−f})
        G = [[c, c * mp(z1)], [-c, -c * mp(z1)]]
        U1 = [[mp(1e300) ** 2 * (j == 1 and i == 0) - mp(lr) * G[i][j] for j in range(2)] for i in range(2)]
        W1 = [[mpmath.sign(u) * mpmath.sqrt(abs(u)) for u in row] for row in U1]
        tr = _run_strict(inst, 3.0, 1, lr, normalized=False, W0=W0, record_at=[0])
        assert np.all(np.isfinite(tr.W))
        _assert_entrywise(tr.W, W1, ITERATE_RTOL)
        _assert_entrywise(_exact_dual(tr), U1, ITERATE_RTOL)
        assert tr.record[0].risk == pytest.approx(
            float(mpmath.log1p(mpmath.exp(s1 * mp(1e305)))), rel=RECORD_RTOL
        )


@pytest.mark.parametrize(
    ("lr", "outcome"),
    [
        (2.0**969, "returned"),
        (2.0**971, "about 1e+308: it overflows"),
    ],
)
def test_iterate_range_is_decided_at_the_largest_double(lr, outcome):
    """Oracle: exact binary arithmetic (p = 2, W = U exactly). Tokens and query scaled by 2^−600 keep
    the logits tiny (the closed form's direction holds: ``_dual_closed_form``); W0[0, 0] = 1.8e308
    (the largest double, 2^1024 − 2^971) gains η·2^−½: below half its ulp (2^970) for η = 2^969, so
    W_1[0, 0] is the largest double exactly; 2^970.5 for η = 2^971, so it rounds to 2^1024, not a double:
    refused with its size ``1e+308`` (log10 2^1024 = 308.25) as an overflow."""
    base, c = _two_token_instance(), 2.0**-600
    inst = A.Instance(c * base.X, base.Y, base.v, c * base.z)
    W0 = np.array([[FLOAT_MAX, 0.0], [0.0, 0.0]])
    if outcome == "returned":
        tr = _run_strict(inst, 2.0, 1, lr, W0=W0, record_at=[1])
        assert tr.W[0, 0] == FLOAT_MAX
        with mpmath.workdps(ORACLE_DPS):
            _assert_entrywise(tr.W[1:], _dual_closed_form(W0, 2.0, lr)[1][1:], ITERATE_RTOL)
        return
    with pytest.raises(NumericalError) as exc:
        _run_strict(inst, 2.0, 1, lr, W0=W0, record_at=[1])
    assert str(exc.value) == (
        f"mirror descent at step 1: the iterate W = (∇ψ)^(−1)(U) is {outcome} {RANGE_TEXT}. " + ITERATE_REMEDY
    )


@pytest.mark.parametrize(
    ("lr", "outcome"), [(2.0**-1021, "returned"), (2.0**-1022, "about 1e-308: it underflows")]
)
def test_iterate_range_is_decided_at_the_smallest_normal(lr, outcome):
    """Oracle: exact binary arithmetic (p = 2: W_1 = η·2^−½·[[1, 0], [−1, 0]], the closed form). η = 2^−1021
    gives 2^−1021.5, a normal double (returned to ITERATE_RTOL); η = 2^−1022 gives 2^−1022.5 ≈ 10^−307.8,
    subnormal: refused as an underflow instead of returning digits lost to gradual underflow."""
    inst = _two_token_instance()
    if outcome == "returned":
        tr = _run_strict(inst, 2.0, 1, lr, record_at=[1])
        with mpmath.workdps(ORACLE_DPS):
            _assert_entrywise(tr.W, _dual_closed_form(np.zeros((2, 2)), 2.0, lr)[1], ITERATE_RTOL)
        return
    with pytest.raises(NumericalError) as exc:
        _run_strict(inst, 2.0, 1, lr, record_at=[1])
    assert str(exc.value) == (
        f"mirror descent at step 1: the iterate W = (∇ψ)^(−1)(U) is {outcome} {RANGE_TEXT}. " + ITERATE_REMEDY
    )


def test_subnormal_step_size_gives_a_full_precision_iterate():
    """Oracle: the closed form (mpmath). p = 3, η = 2^−1070 (a subnormal double, exact): U_1 = η·2^{−2/3}
    ≈ 10^−322.3 is kept to full precision in the split state, so W_1 = ±2^{−535.33} (normal) to
    ITERATE_RTOL, where the float update ``0 − lr*g`` kept ~4 significant bits. ``tr.U`` refuses the
    subnormal dual iterate by size (hand-computed 10^−322.3)."""
    lr = 2.0**-1070
    with mpmath.workdps(ORACLE_DPS):
        U1, W1 = _dual_closed_form(np.zeros((2, 2)), 3.0, lr)
        tr = _run_strict(_two_token_instance(), 3.0, 1, lr, record_at=[1])
        _assert_entrywise(tr.W, W1, ITERATE_RTOL)
        _assert_entrywise(_exact_dual(tr), U1, ITERATE_RTOL)
    with pytest.raises(NumericalError) as exc:
        tr.U  # noqa: B018
    assert str(exc.value) == (
        f"the dual iterate U = ∇ψ(W) is about 1e-322: it underflows {RANGE_TEXT}. "
        "Read the exact dual state from U_mantissa·2^U_exponent"
    )


def test_dual_powers_keep_every_digit_of_their_exponents():
    """Oracle: the closed form (mpmath, the engine's double exponent 1/(p − 1) = fl(4/3) taken exactly).
    At p = 1.75, W0 = 1e-300 and 1e300 in the gradient-free column map to U = 10^∓225 and back; the
    exponent products E·(4/3) ≈ ∓996 are not doubles (their rounding alone would move W by ~1e-13), so
    the round trip meets ITERATE_RTOL only with the exact two-term product."""
    W0 = np.array([[0.0, 1e-300], [0.0, 1e300]])
    with mpmath.workdps(ORACLE_DPS):
        U1, W1 = _dual_closed_form(W0, 1.75, 0.1)
        tr = _run_strict(_two_token_instance(), 1.75, 1, 0.1, W0=W0, record_at=[1])
        _assert_entrywise(tr.W, W1, ITERATE_RTOL)
        _assert_entrywise(_exact_dual(tr), U1, ITERATE_RTOL)


@pytest.mark.parametrize(("p", "rtol"), [(P_LOW, CONDITIONED_RTOL), (P_HIGH, ITERATE_RTOL)])
def test_engine_runs_at_the_ends_of_its_p_range(p, rtol):
    """Oracle: the closed form (mpmath) at p = 1 + 2^∓9 (exact doubles; the powers p − 1 and 1/(p − 1)
    are exact too). W0[0, 1] = 0.75 comes back through |·|^{p−1} and its inverse; at p = 1 + 2^−9 the
    column-0 entries (0.1·2^{−1/513})^512 ≈ 1e-512 are far below the largest: within 2^−1075 there."""
    W0 = np.array([[0.0, 0.75], [0.0, 0.0]])
    with mpmath.workdps(ORACLE_DPS):
        _, W1 = _dual_closed_form(W0, p, 0.1)
        tr = _run_strict(_two_token_instance(), p, 1, 0.1, W0=W0, record_at=[1])
        _assert_entrywise(tr.W, W1, rtol, FLUSH_ATOL)


@pytest.mark.parametrize("p", [1.0 + 2.0**-10, 514.0])
def test_engine_refuses_p_outside_its_range(p):
    """Oracle: the documented range p − 1 ∈ [2^−9, 2^9] (run_mirror_descent's docstring), by name."""
    with pytest.raises(AttnSVMError) as exc:
        M.run_mirror_descent(_two_token_instance(), p, 1, 0.1)
    assert str(exc.value) == (
        "run_mirror_descent needs p_norm in [1 + 2^−9, 1 + 2^9] = [1.001953125, 513.0] (p and q = p/(p−1) "
        f"at most 513 keep the powers of its norms and dual state in float64); got p_norm = {p!r}"
    )
