"""Prompt attention: gradient (FD, 50-digit oracle at saturation), p-SVM certificate, GD direction, bad input."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnsvm as A
from attnsvm.errors import AttnSVMError, InfeasibleSVMError, InvalidInstanceError, NumericalError
from attnsvm.model._grad import CANCELLED_MESSAGE
from attnsvm.peer_strategies import prompt_instances
from attnsvm.peers import _prompt as P
from attnsvm.peers._toys import PROMPT_TOY_LR, PROMPT_TOY_Y0, prompt_toy
from attnsvm.svm import CERTIFY_RTOL, solve_svm

EPS = np.finfo(np.float64).eps
#: Central differences with step h: truncation O(h²·|L'''|) ≈ 1e-12 plus rounding eps·|L|/h ≈ 2e-10
#: for h = 1e-6 and |L| ≤ 1; 1e-8 absolute leaves a safety factor of 50.
FD_ATOL = 1e-8
#: Same-formula agreement (gradient vs textbook form at moderate p, unit direction vs g/||g||):
#: a few hundred eps for sums of T·n·d terms of size ≤ 1.
SAME_RTOL = 1e-13


@pytest.fixture
def case() -> tuple[A.Instance, np.ndarray, np.ndarray]:
    inst = A.random_instance(3, 5, 6, seed=2)
    W = np.random.default_rng(0).standard_normal((6, 6))
    p = 0.3 * np.random.default_rng(1).standard_normal(6)
    return inst, W, p


def textbook_prompt_grad(inst, W, p):
    K = inst.X @ W
    l = K @ p
    s = np.exp(l - l.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    a = inst.values()
    f = (s * a).sum(axis=1)
    dl = -1 / (1 + np.exp(inst.Y * f))
    w = (dl * inst.Y)[:, None] * s * (a - f[:, None]) / inst.n
    return np.einsum("nt,ntd->d", w, K)


def mp_prompt_grad(inst, W, p):
    """50-digit prompt gradient (inputs treated as exact), in the cancellation-free form."""
    mpmath.mp.dps = 50
    n, T, d = inst.shape
    K = inst.X @ W  # keys in float64 are the oracle's exact inputs too
    G = [mpmath.mpf(0)] * d
    for i in range(n):
        l = [
            mpmath.fsum(mpmath.mpf(float(K[i, t, j])) * mpmath.mpf(float(p[j])) for j in range(d))
            for t in range(T)
        ]
        m = max(l)
        e = [mpmath.exp(x - m) for x in l]
        s = [x / mpmath.fsum(e) for x in e]
        a = [
            mpmath.fsum(mpmath.mpf(float(inst.v[j])) * mpmath.mpf(float(inst.X[i, t, j])) for j in range(d))
            for t in range(T)
        ]
        f = mpmath.fsum(s[t] * a[t] for t in range(T))
        dl = -1 / (1 + mpmath.exp(inst.Y[i] * f))
        for t in range(T):
            # a_t − f as Σ_u s_u (a_t − a_u): at ||p|| = 2000 the difference a_α − f is ~1e-800,
            # beyond 50 digits; this form is exact term by term.
            c = mpmath.fsum(s[u] * (a[t] - a[u]) for u in range(T))
            w = dl * inst.Y[i] * s[t] * c / n
            for j in range(d):
                G[j] += w * mpmath.mpf(float(K[i, t, j]))
    return G


# ----------------------------------------------------------------------- gradient
def test_gradient_matches_finite_differences(case):
    inst, W, p = case
    g = P.prompt_grad(inst, W, p)
    h = 1e-6
    fd = np.array(
        [(P.prompt_risk(inst, W, p + h * e) - P.prompt_risk(inst, W, p - h * e)) / (2 * h) for e in np.eye(6)]
    )
    assert np.max(np.abs(g - fd)) <= FD_ATOL


def test_gradient_matches_textbook_at_moderate_p(case):
    inst, W, p = case
    g = P.prompt_grad(inst, W, p)
    assert np.max(np.abs(g - textbook_prompt_grad(inst, W, p))) <= SAME_RTOL * np.max(np.abs(g))


def test_normalized_direction_is_unit_gradient(case):
    inst, W, p = case
    g = P.prompt_grad(inst, W, p)
    D = P.normalized_prompt_grad(inst, W, p)
    assert np.max(np.abs(D.direction - g / np.linalg.norm(g))) <= SAME_RTOL
    assert abs(D.log_norm - np.log(np.linalg.norm(g))) <= SAME_RTOL * max(1.0, abs(D.log_norm))


def test_normalized_direction_exact_after_underflow():
    """At ||p|| = 2000 the gradient underflows to 0 in float64; the direction must match 50 digits."""
    inst = A.random_instance(2, 4, 3, seed=5)
    W = np.eye(3)
    sol = P.solve_prompt_svm(inst, W)
    p = 2000.0 * sol.p / np.linalg.norm(sol.p)
    # The plain gradient (~1e-1053) is not a double: the scale contract refuses it, naming the cause.
    with pytest.raises(NumericalError, match="prompt gradient .* underflows"):
        P.prompt_grad(inst, W, p)
    D = P.normalized_prompt_grad(inst, W, p)
    G = mp_prompt_grad(inst, W, p)
    nrm = mpmath.sqrt(mpmath.fsum(x * x for x in G))
    ref = np.array([float(x / nrm) for x in G])
    # The direction is a ratio of log-domain sums of ≤ n·T² terms: relative error ≤ ~100 eps per
    # entry of size O(1); 1e-12 absolute.
    assert np.max(np.abs(D.direction - ref)) <= 1e-12
    assert abs(D.log_norm - float(mpmath.log(nrm))) <= 1e-9 * abs(D.log_norm)


# --------------------------------------------------------------------------- SVM
def test_svm_certificate_and_constraints(case):
    inst, W, _ = case
    sol = P.solve_prompt_svm(inst, W)
    assert sol.certified and sol.kkt.max() <= CERTIFY_RTOL
    assert np.all(sol.margins >= 1 - CERTIFY_RTOL)
    assert np.allclose(sol.p, sol.rows.T @ sol.duals, rtol=0, atol=CERTIFY_RTOL * np.linalg.norm(sol.p))
    assert np.array_equal(sol.alpha, inst.optimal_tokens())
    for i, t in sol.support:
        r = [k for k, pr in enumerate(sol.pairs) if tuple(pr) == (i, t)][0]
        assert abs(sol.margins[r] - 1) <= 1e-8


def test_svm_equals_core_svm_on_keys_with_constant_query(case):
    """p-SVM = Att-SVM on X' = keys, z' = e_0 (W' = p e_0ᵀ), solved by the core solver."""
    inst, W, _ = case
    sol = P.solve_prompt_svm(inst, W)
    z = np.zeros((inst.n, inst.d))
    z[:, 0] = 1.0
    keys_inst = A.Instance(inst.X @ W, inst.Y, inst.v, z)
    core = solve_svm(keys_inst, alpha=sol.alpha)
    assert np.max(np.abs(core.W[:, 0] - sol.p)) <= 1e-9 * np.linalg.norm(sol.p)
    assert np.max(np.abs(core.W[:, 1:])) <= 1e-9 * np.linalg.norm(sol.p)


def test_toy_svm_solutions_by_hand():
    """Hand-derived: α = 0 → p = (−0.1, 1, 0)/1.01 (only token 2 active); α = 1 → p = (1, 0, 0)."""
    for c in (0.9, 0.0):
        inst, W = prompt_toy(c)
        s0 = P.solve_prompt_svm(inst, W)
        assert np.allclose(s0.p, np.array([-0.1, 1.0, 0.0]) / 1.01, rtol=0, atol=1e-12)
        assert s0.support == [(0, 2)]
        s1 = P.solve_prompt_svm(inst, W, alpha=[1])
        assert np.allclose(s1.p, [1.0, 0.0, 0.0], rtol=0, atol=1e-12)
        assert s1.support == [(0, 2)]


def test_toy_second_token_locally_optimal_only_when_c_is_zero():
    assert P.prompt_local_optimality(*prompt_toy(0.0), alpha=[1])
    assert not P.prompt_local_optimality(*prompt_toy(0.9), alpha=[1])  # tie γ = 0.9 with the support token
    for c in (0.9, 0.0):
        assert P.prompt_local_optimality(*prompt_toy(c), alpha=[0])


def test_infeasible_svm_names_the_token():
    inst, W = prompt_toy(0.0)
    # W = diag(1, 1, 0) maps token 2 = (0, 0, c) to the zero key; select token 2 and duplicate it.
    X = np.array(inst.X)
    X[0, 1] = X[0, 2] + np.array([0, 0, 5.0])  # same key as token 2, different value
    bad = A.Instance(X, inst.Y, inst.v)
    with pytest.raises(InfeasibleSVMError, match="same key"):
        P.solve_prompt_svm(bad, W, alpha=[2])


# ---------------------------------------------------------------------------- GD
#: The toy runs of the paper: 1000 normalized steps, lr 0.1. Measured 1 − corr(p, p_mm(final)) ≤ 3e-4
#: over all six starts and both c; the theory's rate is O(1/log-ish) in ||p|| ≈ 100, so 1e-3.
TOY_CORR_GAP = 1e-3


@pytest.mark.parametrize("c", [0.9, 0.0])
def test_toy_gd_converges_to_p_mm_of_its_final_token(c):
    inst, W = prompt_toy(c)
    finals = []
    for y in PROMPT_TOY_Y0:
        tr = P.run_prompt_gd(inst, W, 1000, PROMPT_TOY_LR, p0=[0.0, y, 0.0], record_at=[1000])
        a = tr.final_tokens
        finals.append(int(a[0]))
        ref = P.solve_prompt_svm(inst, W, alpha=a).p
        cos = float(np.dot(tr.p, ref) / (np.linalg.norm(tr.p) * np.linalg.norm(ref)))
        assert 1 - cos <= TOY_CORR_GAP
        assert P.prompt_local_optimality(inst, W, a)  # GD ends at a locally optimal token
    if c == 0.9:
        assert set(finals) == {0}  # only the global token is locally optimal
    else:
        assert set(finals) == {0, 1}  # the locally optimal second token attracts some starts


def test_gd_record_and_norm_growth(case):
    inst, W, _ = case
    sol = P.solve_prompt_svm(inst, W)
    tr = P.run_prompt_gd(inst, W, 300, 0.1, reference=sol.p, record_at=[0, 100, 200, 300])
    assert [r.step for r in tr.record] == [0, 100, 200, 300]
    norms = [r.norm for r in tr.record]
    assert norms[0] == 0 and all(b > a for a, b in zip(norms, norms[1:], strict=False))
    assert norms[-1] <= 300 * 0.1 * (1 + 1e-12)  # each normalized step moves p by exactly lr


def test_plain_gd_step_equals_textbook_update(case):
    inst, W, p = case
    tr = P.run_prompt_gd(inst, W, 1, 0.5, normalized=False, p0=p, record_at=[1])
    expect = p - 0.5 * textbook_prompt_grad(inst, W, p)
    assert np.max(np.abs(tr.p - expect)) <= SAME_RTOL * np.max(np.abs(p))


def test_regularization_path_approaches_p_mm():
    inst, W = prompt_toy(0.0)
    ref = P.solve_prompt_svm(inst, W).p
    path = P.prompt_regularization_path(inst, W, np.geomspace(1, 50, 6), reference=ref)
    corrs = [pt.corr for pt in path]
    # measured corr 0.9695 at R = 1 ... 0.99999978 at R = 50 (rate ~ 1/R² near the limit), every
    # point reached its KKT tolerance 1e-10; assert with a factor 10 margin on both.
    assert corrs[-1] >= 1 - 2e-6
    assert all(pt.kkt_residual <= 1e-9 for pt in path)
    assert all(np.array_equal(pt.tokens, [0]) for pt in path)


# --------------------------------------------------------------------- bad input
def test_bad_input_raises_and_inputs_unchanged(case):
    inst, W, p = case
    W0, p0 = W.copy(), p.copy()
    with pytest.raises(InvalidInstanceError, match="p must have shape"):
        P.prompt_grad(inst, W, p[:3])
    with pytest.raises(InvalidInstanceError, match="finite"):
        P.prompt_output(inst, W, np.full(6, np.nan))
    with pytest.raises(InvalidInstanceError, match="W must have shape"):
        P.solve_prompt_svm(inst, W[:3])
    with pytest.raises(InvalidInstanceError, match="out of range"):
        P.solve_prompt_svm(inst, W, alpha=[0, 1, 9])
    with pytest.raises(AttnSVMError, match="steps"):
        P.run_prompt_gd(inst, W, 0, 0.1)
    with pytest.raises(AttnSVMError, match="lr"):
        P.run_prompt_gd(inst, W, 10, -1.0)
    with pytest.raises(AttnSVMError, match="radii"):
        P.prompt_regularization_path(inst, W, [2.0, 1.0])
    with pytest.raises(InvalidInstanceError, match="zero vector"):
        P.run_prompt_gd(inst, W, 1, 0.1, reference=np.zeros(6))
    P.run_prompt_gd(inst, W, 3, 0.1, p0=p)
    assert np.array_equal(W, W0) and np.array_equal(p, p0)


# ------------------------------------------------------------------- properties


@settings(max_examples=20, deadline=None, derandomize=True)
@given(pair=prompt_instances(), data=st.data())
def test_property_p_svm_feasible_and_certified_for_any_alpha(pair, data):
    inst, W = pair
    alpha = np.array([data.draw(st.integers(0, inst.T - 1)) for _ in range(inst.n)])
    sol = P.solve_prompt_svm(inst, W, alpha)
    assert sol.certified
    assert np.all(sol.margins >= 1 - CERTIFY_RTOL)
    assert sol.support  # at least one constraint is active at a min-norm solution


@settings(max_examples=10, deadline=None, derandomize=True)
@given(pair=prompt_instances(n=(1, 2), T=(2, 3)))
def test_property_normalized_gd_decreases_risk_and_aligns(pair):
    """Normalized prompt GD at a small step lowers the risk over 200 steps and its direction
    correlates positively with the p-SVM of the tokens it selects (a weak, always-true-in-theory
    check; the strong rate is asserted on the toy)."""
    inst, W = pair
    tr = P.run_prompt_gd(inst, W, 200, 0.05, record_at=[0, 200])
    assert tr.record[-1].risk < tr.record[0].risk
    ref = P.solve_prompt_svm(inst, W, tr.final_tokens).p
    assert float(np.dot(tr.p, ref)) > 0


# ------------------------------------------------------------- documented messages (exact wording)
#: The scale contract's range as every refusal names it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
#: The prompt model has no query z: its logits k_itᵀp overflow with max|p|·max|k| (keys k = Wᵀx).
PROMPT_LOGIT_SCALE = "the logit scale max|p|·max|k| (keys k_it = Wᵀx_it)"
LOGIT_REMEDY = "Scale p or the keys (W or X) down; the attention logits would overflow"


def test_bad_input_messages_are_exact(case):
    """The messages are part of the contract: the argument, what is wrong, the expected form, the value."""
    inst, W, p = case
    radii = "radii must be a non-empty, strictly increasing list of positive radii"
    cases = [
        (lambda: P.prompt_grad(inst, W, p[:3]), "p must have shape (d,) = (6,) for this instance; got (3,)"),
        (
            lambda: P.run_prompt_gd(inst, W, 1, 0.1, p0=p[:3]),
            "p0 must have shape (d,) = (6,) for this instance; got (3,)",
        ),
        (
            lambda: P.run_prompt_gd(inst, W, 1, 0.1, reference=p[:3]),
            "reference must have shape (d,) = (6,) for this instance; got (3,)",
        ),
        (
            lambda: P.run_prompt_gd(inst, W, 1, 0.1, reference=np.zeros(6)),
            "reference is the zero vector; it has no direction",
        ),
        (lambda: P.prompt_regularization_path(inst, W, [2.0, 1.0]), radii),
        (lambda: P.prompt_regularization_path(inst, W, [1.0, 1.0]), radii),
        (lambda: P.prompt_regularization_path(inst, W, []), radii),
        (lambda: P.prompt_regularization_path(inst, W, [0.0, 1.0]), radii),
        (lambda: P.prompt_regularization_path(inst, W, [-1.0, 1.0]), radii),
        (
            lambda: P.prompt_regularization_path(inst, W, [1.0], tol=-1.0),
            "tol must be a finite number ≥ 0; got -1.0",
        ),
        (
            lambda: P.prompt_regularization_path(inst, W, [1.0], tol=float("inf")),
            "tol must be a finite number ≥ 0; got inf",
        ),
    ]
    for call, message in cases:
        with pytest.raises(AttnSVMError) as exc:
            call()
        assert str(exc.value) == message


def test_tol_zero_is_allowed():
    """Boundary of the documented ``tol ≥ 0``: 0 is accepted (the path then runs max_steps)."""
    inst, W = prompt_toy(0.9)
    pts = P.prompt_regularization_path(inst, W, [1.0], tol=0.0, max_steps=3)
    assert len(pts) == 1 and pts[0].radius == 1.0


def test_range_refusals_name_the_quantity(case):
    """Oracle: the size of the refused quantity, hand-computed, and the documented wording.

    Radii 1e-320 (times max|k| < 10) is below 2.2e-308; keys 1e308·|W x| overflow; p·1e200 with
    W·1e200 puts the logit scale at ~1e400; plain GD with lr 1.7e308 leaves the doubles at step 1."""
    inst, W, p = case
    with pytest.raises(NumericalError) as exc:
        P.prompt_regularization_path(inst, W, [1e-320, 1.0])
    assert (
        str(exc.value)
        == f"the smallest radius in logit units R·max|k| is about 1e-319: it underflows {RANGE_TEXT}"
    )
    with pytest.raises(NumericalError) as exc:
        P.prompt_regularization_path(inst, W, [1e300, 1e308])
    assert str(exc.value) == f"the radii in logit units R·max|k| is about 1e+309: it overflows {RANGE_TEXT}"
    for call in (P.prompt_grad, P.normalized_prompt_grad):
        with pytest.raises(NumericalError) as exc:
            call(inst, W * 1e200, p * 1e200)
        assert (
            str(exc.value)
            == f"{PROMPT_LOGIT_SCALE} is about 1e+400: it overflows {RANGE_TEXT}. {LOGIT_REMEDY}"
        )
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, W, 2, 1.7e308, normalized=False)
    assert str(exc.value) == "prompt GD diverged at step 1: p became non-finite; lower lr"
    # p_1 (|p_1| ≈ 1.7e308·[½, 1)) leaves the logit scale: the record at step 1 refuses it (it used
    # to record log10||∇_p L|| = −inf there); without that record the step-2 gradient refuses it.
    overflow = f"{PROMPT_LOGIT_SCALE} is about 1e+309: it overflows {RANGE_TEXT}. {LOGIT_REMEDY}"
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, W, 2, 1.7e308)
    assert str(exc.value) == f"prompt GD, record at step 1: {overflow}"
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, W, 2, 1.7e308, record_at=[0])
    assert str(exc.value) == f"normalized prompt GD at step 2: {overflow}"


def _two_token(x: float, v: float = 1.0) -> A.Instance:
    """n = 1, T = 2, d = 1: tokens x and x/2."""
    return A.Instance(np.array([[[x], [x / 2]]]), np.array([1.0]), np.array([v]), np.ones((1, 1)))


def test_answers_at_the_ends_of_the_normal_range_are_returned():
    """Oracle: exact products of powers of two. Keys W·x with W = 2^−1022, x = 1 are exactly
    2.2250738585072014e-308 (the smallest normal: returned) and with W = 2^−1023 the largest key is
    subnormal (refused); W = FLOAT_MAX with x = 1 is returned, with x = 2 it overflows; zero is exact."""
    tiny, big = 2.0**-1022, float(np.finfo(np.float64).max)
    assert P.prompt_keys(_two_token(1.0), [[tiny]]).ravel().tolist() == [tiny, tiny / 2]
    assert P.prompt_keys(_two_token(1.0), [[big]]).ravel().tolist() == [big, big / 2]
    assert P.prompt_keys(_two_token(1.0), [[0.0]]).ravel().tolist() == [0.0, 0.0]
    with pytest.raises(NumericalError) as exc:
        P.prompt_keys(_two_token(1.0), [[tiny / 2]])
    assert str(exc.value) == f"the keys k_it = Wᵀx_it is about 1e-308: it underflows {RANGE_TEXT}"
    with pytest.raises(NumericalError) as exc:
        P.prompt_keys(_two_token(2.0), [[big]])
    assert str(exc.value) == f"the keys k_it = Wᵀx_it is about 1e+309: it overflows {RANGE_TEXT}"


def test_output_and_risk_refusals_name_the_quantity():
    """Oracle: hand-computed sizes. Tokens (2, 0), v = (1e308, 0): f = 2e308 overflows (the risk's
    refusal adds the remedy). Two inputs at margin 1001 (tokens (1, 0), v = (1001, 0)): the logistic and
    exponential risks are ≈ (1/2)·2·e^−1001 = 10^−434.73, below the normal range."""
    inst = A.Instance(
        np.array([[[2.0, 0.0], [2.0, 0.0]]]), np.array([1.0]), np.array([1e308, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        P.prompt_output(inst, np.eye(2), [0.0, 0.0])
    assert str(exc.value) == f"the prompt outputs f_i is about 1e+308: it overflows {RANGE_TEXT}"
    with pytest.raises(NumericalError) as exc:
        P.prompt_risk(inst, np.eye(2), [0.0, 0.0])
    assert (
        str(exc.value) == f"the prompt outputs f_i is about 1e+308: it overflows {RANGE_TEXT}. Scale v down"
    )
    X = np.array([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1001.0, 0.0]), np.ones((2, 2)))
    for loss in ("logistic", "exponential"):
        with pytest.raises(NumericalError) as exc:
            P.prompt_risk(inst, np.eye(2), [0.0, 0.0], loss=loss)
        assert str(exc.value) == f"the prompt risk L(p) is about 1e-435: it underflows {RANGE_TEXT}"


def test_zero_prompt_gradient_with_zero_keys():
    """Hand-derived: W = 0 makes every key 0, so ∇_p L = Σ (…)·k_it = 0 exactly although the values
    differ; the plain gradient is exact zeros, the direction is undefined (documented message)."""
    inst = A.random_instance(3, 5, 6, seed=2)
    assert P.prompt_grad(inst, np.zeros((6, 6)), np.ones(6)).tolist() == [0.0] * 6
    with pytest.raises(NumericalError) as exc:
        P.normalized_prompt_grad(inst, np.zeros((6, 6)), np.ones(6))
    assert str(exc.value) == (
        "the prompt gradient: the gradient is exactly zero at this point; the normalized direction is undefined"
    )


@pytest.mark.parametrize("normalized", [True, False])
def test_gd_records_and_trajectory_fields(case, normalized):
    """Oracle: the textbook gradient (``textbook_prompt_grad``) for log10||∇_p L|| at each recorded
    step, the kept iterate equal to the final p, and the run's settings on the trajectory."""
    inst, W, p = case
    tr = P.run_prompt_gd(inst, W, 2, 0.25, normalized=normalized, p0=p, record_at=[0, 2], keep_iterates=True)
    assert tr.lr == 0.25 and tr.normalized is normalized
    r0, r2 = tr.record
    assert np.array_equal(r0.p, p) and np.array_equal(r2.p, tr.p)
    for r in (r0, r2):
        g = textbook_prompt_grad(inst, W, r.p)
        assert r.log10_grad_norm == pytest.approx(np.log10(np.linalg.norm(g)), rel=SAME_RTOL, abs=SAME_RTOL)
        assert r.norm == pytest.approx(np.linalg.norm(r.p), rel=SAME_RTOL)
        assert np.isnan(r.corr)
    assert P.run_prompt_gd(inst, W, 1, 0.25, record_at=[1]).record[0].p is None  # iterates not kept


def test_gd_record_of_a_zero_gradient():
    """Hand-derived: v = 0 gives equal values, so ∇_p L = 0 exactly: the record's log10||∇_p L|| is
    −inf; plain GD stays at p0, normalized GD stops at step 1 (the direction is undefined)."""
    inst = A.random_instance(2, 3, 4, seed=1)
    inst0 = A.Instance(inst.X, inst.Y, np.zeros(4))
    W = np.eye(4)
    tr = P.run_prompt_gd(inst0, W, 1, 0.1, normalized=False, p0=np.ones(4), record_at=[0, 1])
    assert [r.log10_grad_norm for r in tr.record] == [-np.inf, -np.inf]
    assert tr.p.tolist() == [1.0] * 4
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst0, W, 1, 0.1)
    assert str(exc.value).startswith("normalized prompt GD at step 1: the prompt gradient: ")


def test_record_refuses_an_unrepresentable_norm_by_name():
    """Oracle: ||(1.5e308, 1.5e308)|| = 2.1e308 > 1.8e308 (hand-computed): the record names ||p|| and the step.

    Keys Wᵀx = x/4 keep the logit scale at max|p|·max|k| = 3.75e307; equal values vᵀx_it = 1 make
    ∇_p L exactly 0 (hand-derived), so the record's gradient norm is the legitimate −inf and the
    refusal that remains is the norm's."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 1.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, np.eye(2) / 4, 1, 0.1, p0=[1.5e308, 1.5e308], record_at=[0])
    assert str(exc.value) == f"prompt GD, record at step 0: ||p|| is about 1e+308: it overflows {RANGE_TEXT}"


def test_record_names_the_logit_scale_and_the_step():
    """Oracle: hand-computed size. Keys k_it = x_it (W = I, |k| ≤ 1, mantissa exponent 1) and
    p0 = (1.5e308, 1.5e308): the logit scale max|p|·2^1 = 3e308 overflows; the record at step 0 says so
    with the prompt's quantities (p and the keys k, no z) and the step."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, np.eye(2), 1, 0.1, p0=[1.5e308, 1.5e308], record_at=[0])
    assert str(exc.value) == (
        f"prompt GD, record at step 0: {PROMPT_LOGIT_SCALE} is about 1e+308: it overflows {RANGE_TEXT}. "
        f"{LOGIT_REMEDY}"
    )


def test_record_gradient_norm_is_minus_inf_only_when_stationary():
    """Oracle: hand-derived. A record's log10||∇_p L|| is −inf only for a zero (stationary) gradient:
    v = 0 gives ∇_p L = 0 exactly (−inf recorded). With v = (1, 0) and a step of 1e308 the values differ
    and ∇_p L ≠ 0; the core refuses the gradient there (ℓ' undetermined), and the record now refuses
    naming the step instead of recording −inf (it did before: a silent wrong number)."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    zero = A.Instance(X, np.array([1.0]), np.zeros(2), np.ones((1, 2)))
    tr = P.run_prompt_gd(zero, np.eye(2), 1, 1.0, normalized=False, record_at=[0, 1])
    assert [r.log10_grad_norm for r in tr.record] == [-np.inf, -np.inf]
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2)))
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(inst, np.eye(2), 1, 1e308, record_at=[1])
    assert str(exc.value).startswith("prompt GD, record at step 1: the prompt gradient: ")
    assert P.is_stationary_error(NumericalError("the prompt gradient: the gradient is exactly zero"))
    assert P.is_stationary_error(NumericalError(f"the prompt gradient: {CANCELLED_MESSAGE}"))
    assert not P.is_stationary_error(NumericalError(f"x is about 1e+309: it overflows {RANGE_TEXT}"))
