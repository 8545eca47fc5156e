"""Joint (v, p) training: gradients, the v-SVM / support inputs / relaxed p-SVM, GD directions on the toy."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings

import attnsvm as A
from attnsvm.errors import AttnSVMError, InvalidInstanceError, NumericalError
from attnsvm.model._losses import get_loss
from attnsvm.peer_strategies import joint_instances
from attnsvm.peers import _joint as J
from attnsvm.peers._toys import JOINT_TOY_ALPHA, joint_toy
from attnsvm.svm import CERTIFY_RTOL

#: Central differences, h = 1e-6: truncation ~1e-12, rounding eps/h ~ 2e-10; 1e-8 absolute.
FD_ATOL = 1e-8
#: Unit direction vs g/||g|| from the same formula: a few hundred eps.
SAME_RTOL = 1e-13


@pytest.fixture
def case():
    # d ≥ n(T − 1): generic key differences are then independent and every p-SVM is feasible
    inst = A.random_instance(3, 3, 6, seed=4)
    W = np.random.default_rng(3).standard_normal((6, 6))
    p = 0.4 * np.random.default_rng(2).standard_normal(6)
    return inst, W, p


def test_gradients_match_finite_differences(case):
    inst, W, p = case
    v = inst.v
    gv, gp = J.joint_grads(inst, W, v, p)
    h = 1e-6
    E = np.eye(6)
    fv = [(J.joint_risk(inst, W, v + h * e, p) - J.joint_risk(inst, W, v - h * e, p)) / (2 * h) for e in E]
    fp = [(J.joint_risk(inst, W, v, p + h * e) - J.joint_risk(inst, W, v, p - h * e)) / (2 * h) for e in E]
    assert np.max(np.abs(gv - fv)) <= FD_ATOL
    assert np.max(np.abs(gp - fp)) <= FD_ATOL


def test_normalized_directions_are_unit_gradients(case):
    inst, W, p = case
    gv, gp = J.joint_grads(inst, W, inst.v, p)
    dv, dp = J.normalized_joint_grads(inst, W, inst.v, p)
    assert np.max(np.abs(dv.direction - gv / np.linalg.norm(gv))) <= SAME_RTOL
    assert np.max(np.abs(dp.direction - gp / np.linalg.norm(gp))) <= SAME_RTOL
    assert abs(dv.log_norm - np.log(np.linalg.norm(gv))) <= 1e-12


def test_v_direction_survives_underflow():
    """With ||v|| = 1e4 the logistic derivative underflows (ℓ' ≈ e^{−10⁴}); the direction must not."""
    inst, W = joint_toy(1.5)
    v = 1e4 * np.array([0.0, 1.0])
    p = 50.0 * np.array([1.0, 0.0])
    # The plain gradients (~1e-4343) are not doubles: the scale contract refuses them by name.
    with pytest.raises(NumericalError, match="underflows"):
        J.joint_grads(inst, W, v, p)
    dv, _ = J.normalized_joint_grads(inst, W, v, p)
    assert np.all(np.isfinite(dv.direction)) and abs(np.linalg.norm(dv.direction) - 1) <= 1e-15
    # The dominant term is the input with the smallest margin; with s ≈ one-hot on token 1 the
    # direction is −Σ_i∈argmin Y_i x_i1 / norm; margins: 1e4·(1, 1, c): inputs 0 and 1 tie.
    expect = -(np.array([1.0, 1.0]) - np.array([1.0, -1.0]))
    assert np.allclose(dv.direction, expect / np.linalg.norm(expect), rtol=0, atol=1e-12)


@pytest.mark.parametrize("c", [1.0, 1.5])
def test_toy_svms_by_hand(c):
    """Hand-derived: v_mm = (0, 1); S = {0, 1, 2} iff c = 1; p_relax = (1, 0) for c = 1.5 and
    (4/3, 1/3) for c = 1 (constraints p1+p2 ≥ 1, p1−p2 ≥ 1, 0.5p1 + p2 ≥ 1: the last two active)."""
    inst, W = joint_toy(c)
    sol = J.solve_joint_svm(inst, W, JOINT_TOY_ALPHA)
    assert sol.certified and sol.kkt_v.max() <= CERTIFY_RTOL and sol.kkt_p.max() <= CERTIFY_RTOL
    assert np.allclose(sol.v, [0.0, 1.0], rtol=0, atol=1e-12)
    if c == 1.0:
        assert sol.support_inputs.tolist() == [0, 1, 2]
        assert np.allclose(sol.p, [4 / 3, 1 / 3], rtol=0, atol=1e-12)
    else:
        assert sol.support_inputs.tolist() == [0, 1]
        assert np.allclose(sol.p, [1.0, 0.0], rtol=0, atol=1e-12)
        assert sol.p_margins[2] >= 0  # i ∉ S: margin ≥ 0 only (it is 0.5)


def test_relaxed_svm_constraints_on_random_instance(case):
    inst, W, _ = case
    sol = J.solve_joint_svm(inst, W)
    assert sol.certified
    assert np.all(sol.v_margins >= 1 - CERTIFY_RTOL)
    assert np.all(np.abs(sol.v_margins[sol.support_inputs] - 1) <= 1e-8)
    b = np.isin(sol.p_pairs[:, 0], sol.support_inputs).astype(float)
    assert np.all(sol.p_margins >= b - CERTIFY_RTOL)
    assert np.allclose(sol.p, sol.p_rows.T @ sol.p_duals, rtol=0, atol=1e-9 * np.linalg.norm(sol.p))


#: 1000 separately normalized steps at lr 0.1 on the toy: measured 1 − corr ≤ 2.5e-6 (v) and
#: ≤ 1.1e-5 (p) for both c (and ≈ 100× smaller at 10⁴ steps, a 1/t² rate). Threshold 1e-4.
JOINT_GAP = 1e-4


@pytest.mark.parametrize("c", [1.0, 1.5])
def test_toy_gd_converges_to_v_mm_and_p_relax(c):
    inst, W = joint_toy(c)
    sol = J.solve_joint_svm(inst, W, JOINT_TOY_ALPHA)
    tr = J.run_joint_gd(inst, W, 1000, 0.1, v_reference=sol.v, p_reference=sol.p, record_at=[10, 1000])
    assert 1 - tr.v_corrs[-1] <= JOINT_GAP
    assert 1 - tr.p_corrs[-1] <= JOINT_GAP
    assert tr.record[-1].tokens.tolist() == list(JOINT_TOY_ALPHA)
    # the two c give different limits for p: the relaxed SVM, not the plain p-SVM, is the target
    other = J.solve_joint_svm(*joint_toy(2.5 - c), JOINT_TOY_ALPHA).p
    cos_other = float(np.dot(tr.p, other) / (np.linalg.norm(tr.p) * np.linalg.norm(other)))
    assert 1 - cos_other > 100 * JOINT_GAP


def test_bad_input(case):
    inst, W, p = case
    v0 = inst.v.copy()
    with pytest.raises(InvalidInstanceError, match="v0 must have shape"):
        J.run_joint_gd(inst, W, 1, 0.1, v0=np.ones(3))
    with pytest.raises(InvalidInstanceError, match="p must have shape"):
        J.joint_grads(inst, W, inst.v, np.ones(2))
    with pytest.raises(AttnSVMError, match="lr"):
        J.run_joint_gd(inst, W, 1, float("nan"))
    with pytest.raises(InvalidInstanceError, match="out of range"):
        J.solve_joint_svm(inst, W, alpha=[0, 0, 7])
    inst0, W0 = joint_toy(1.0)
    with pytest.raises(AttnSVMError, match="infeasible"):
        J.solve_joint_svm(inst0, W0, alpha=[0, 0, 0])  # selected tokens are all zero vectors
    J.run_joint_gd(inst, W, 2, 0.1, p0=p)
    assert np.array_equal(inst.v, v0)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(pair=joint_instances())
def test_property_joint_svms_certified(pair):
    inst, W = pair
    sol = J.solve_joint_svm(inst, W)
    assert sol.certified
    assert sol.support_inputs.size >= 1  # some input is on the margin of the v-SVM
    assert np.all(sol.v_margins >= 1 - CERTIFY_RTOL)


# ------------------------------------------------------------------ hand-derived values and messages
#: The scale contract's range as every refusal names it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"


@pytest.mark.parametrize("y", [1.0, -1.0])
def test_v_gradient_by_hand_on_one_input_of_two_tokens(y):
    """Hand-derived (n = 1 ≠ T = 2, d = 1): tokens x = (1, 3), v = 0, p = 0 give s = (½, ½), f = 0,
    ℓ'(0) = −½ (logistic), so ∇_v L = (1/n)·ℓ'(0)·Y·(½·1 + ½·3) = −Y exactly; ∇_p L = 0 (equal values)."""
    inst = A.Instance(np.array([[[1.0], [3.0]]]), np.array([y]), np.array([0.0]), np.ones((1, 1)))
    gv, gp = J.joint_grads(inst, np.eye(1), [0.0], [0.0])
    assert gv.tolist() == [-y]
    assert gp.tolist() == [0.0]


def test_v_gradient_by_hand_averages_over_inputs():
    """Hand-derived (n = 2, T = 3, d = 1, v = 0, p = 0): s = ⅓ each, f = 0, ℓ'(0) = −½, so
    ∇_v L = (1/2)·(−½)·(Y_0·mean(x_0) + Y_1·mean(x_1)) = −¼·(2 − (−1)) = −¾ exactly."""
    X = np.array([[[1.0], [2.0], [3.0]], [[-1.0], [-1.0], [-1.0]]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([0.0]), np.ones((2, 1)))
    gv, _ = J.joint_grads(inst, np.eye(1), [0.0], [0.0])
    assert gv.tolist() == [-0.75]


def test_joint_risk_underflow_is_refused_by_name():
    """Oracle: the logistic risk at margin 1000 is log(1 + e^−1000) ≈ e^−1000 ≈ 10^−434.29 (not a
    double); the refusal names the joint risk and its size (documented message)."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [1.0, 0.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        J.joint_risk(inst, np.eye(2), [1000.0, 0.0], [0.0, 0.0])
    assert str(exc.value) == f"the joint risk L(v, p) is about 1e-434: it underflows {RANGE_TEXT}"
    # margin 700: e^−700 ≈ 9.86e-305 is a normal double, and log1p(e^−700) = e^−700 to rounding
    assert J.joint_risk(inst, np.eye(2), [700.0, 0.0], [0.0, 0.0]) == pytest.approx(np.exp(-700.0), rel=1e-15)


def test_joint_outputs_overflow_is_refused_by_name():
    """Oracle: tokens (2, 0), v = (1e308, 0) give f = 2e308 > 1.8e308 (not a double): both gradient
    entry points refuse, naming the joint outputs."""
    inst = A.Instance(
        np.array([[[2.0, 0.0], [2.0, 0.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    want = f"the joint outputs f_i is about 1e+308: it overflows {RANGE_TEXT}"
    for call in (J.joint_grads, J.normalized_joint_grads):
        with pytest.raises(NumericalError) as exc:
            call(inst, np.eye(2), [1e308, 0.0], [0.0, 0.0])
        assert str(exc.value) == want


def test_exactly_cancelling_v_gradient_is_named():
    """Hand-derived: two inputs with identical tokens and opposite labels at v = 0 give f = 0 and
    ∇_v L = ½·(−½·x − (−½)·x)·… = 0 exactly; the direction is undefined (documented message), and
    joint GD (∇_p L = 0 too, equal values) stops as stationary."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([0.0, 0.0]), np.ones((2, 2)))
    with pytest.raises(NumericalError) as exc:
        J.normalized_joint_grads(inst, np.eye(2), [0.0, 0.0], [0.3, 0.1])
    assert (
        str(exc.value)
        == "∇_v L is exactly zero (the inputs' contributions cancel); the direction is undefined"
    )
    with pytest.raises(NumericalError) as exc:
        J.run_joint_gd(inst, np.eye(2), 1, 0.1, v0=[0.0, 0.0])
    assert str(exc.value) == "joint GD at step 1: both gradients are exactly zero; (v, p) is stationary"


def test_head_shape_error_is_exact():
    """Documented message: the head's name, the expected (d,) and the shape received."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(InvalidInstanceError) as exc:
        J.joint_risk(inst, np.eye(2), [1.0, 0.0, 0.0], [0.0, 0.0])
    assert str(exc.value) == "v must have shape (d,) = (2,); got (3,)"
    with pytest.raises(InvalidInstanceError) as exc:
        J.run_joint_gd(inst, np.eye(2), 1, 0.1, v0=[1.0])
    assert str(exc.value) == "v0 must have shape (d,) = (2,); got (1,)"
    for bad, shape in (([[1.0], [0.0]], "(2, 1)"), (1.0, "()")):  # the dimension is checked first
        with pytest.raises(InvalidInstanceError) as exc:
            J.joint_risk(inst, np.eye(2), bad, [0.0, 0.0])
        assert str(exc.value) == f"v must have 1 dimension(s); got shape {shape}"


#: Hand-derived steps vs the engine: a few roundings of O(1) quantities (sqrt, exp, log1p).
HAND_RTOL = 1e-14


@pytest.mark.parametrize("normalized", [True, False])
def test_joint_gd_first_step_and_records_by_hand(normalized):
    """Hand-derived (n = 1, T = 2, d = 2, W = I, keys = tokens e_1, e_2, v0 = e_1, p0 = 0):
    s = (½, ½), f = ½, ℓ' = ℓ'(½) = −1/(1 + e^{½}); ∇_v L = ℓ'·(½, ½), ∇_p L = ℓ'·(¼, −¼).
    Normalized: v1 = e_1 + η(1, 1)/√2, p1 = η(1, −1)/√2; plain: v1 = e_1 − ηℓ'(½, ½), p1 = −ηℓ'(¼, −¼).
    Records: ||v||, ||p||, the textbook risk log(1 + e^{−f}), argmax logits, cosines with references."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2)))
    lr = 0.5
    dl = -1.0 / (1.0 + np.exp(0.5))
    if normalized:
        v1 = np.array([1.0, 0.0]) + lr * np.array([1.0, 1.0]) / np.sqrt(2.0)
        p1 = lr * np.array([1.0, -1.0]) / np.sqrt(2.0)
    else:
        v1 = np.array([1.0, 0.0]) - lr * dl * np.array([0.5, 0.5])
        p1 = -lr * dl * np.array([0.25, -0.25])
    tr = J.run_joint_gd(
        inst,
        np.eye(2),
        1,
        lr,
        normalized=normalized,
        record_at=[0, 1],
        v_reference=[0.0, 3.0],
        p_reference=[2.0, 0.0],
    )
    assert np.allclose(tr.v, v1, rtol=HAND_RTOL, atol=0) and np.allclose(tr.p, p1, rtol=HAND_RTOL, atol=0)
    r0, r1 = tr.record
    assert (r0.step, r1.step) == (0, 1)
    assert (
        r0.v_norm == 1.0
        and r0.p_norm == 0.0
        and r0.risk == pytest.approx(np.log1p(np.exp(-0.5)), rel=HAND_RTOL)
    )
    assert r0.v_corr == 0.0 and np.isnan(r0.p_corr)  # cos(e_1, e_2) = 0; p0 = 0 has no direction
    s1 = np.exp(p1) / np.sum(np.exp(p1))  # logits k_t·p1 = p1_t
    f1 = float(s1 @ (X[0] @ v1))
    assert r1.v_norm == pytest.approx(np.linalg.norm(v1), rel=HAND_RTOL)
    assert r1.p_norm == pytest.approx(np.linalg.norm(p1), rel=HAND_RTOL)
    assert r1.risk == pytest.approx(np.log1p(np.exp(-f1)), rel=HAND_RTOL)
    assert r1.tokens.tolist() == [0]
    assert r1.v_corr == pytest.approx(v1[1] / np.linalg.norm(v1), rel=HAND_RTOL)
    assert r1.p_corr == pytest.approx(p1[0] / np.linalg.norm(p1), rel=HAND_RTOL)
    assert tr.v_corrs[1] == r1.v_corr and np.isnan(tr.p_corrs[0])


def test_joint_gd_refusals_name_the_step():
    """Oracle: hand-computed sizes. Plain GD with lr 1.79e308 on tokens (2, 6), v = 0 has
    ∇_v L = −2 (as in the one-input example), so v_1 = 3.58e308: not a double. With v = (1000, 0)
    on equal tokens the recorded risk ≈ e^−1000 underflows at the recorded step."""
    inst = A.Instance(np.array([[[2.0], [6.0]]]), np.array([1.0]), np.array([0.0]), np.ones((1, 1)))
    with pytest.raises(NumericalError) as exc:
        J.run_joint_gd(inst, np.eye(1), 1, 1.79e308, normalized=False)
    assert str(exc.value) == "joint GD diverged at step 1: v or p became non-finite; lower lr"
    inst = A.Instance(
        np.array([[[1.0, 0.0], [1.0, 0.0]]]), np.array([1.0]), np.array([1000.0, 0.0]), np.ones((1, 2))
    )
    for t in (0, 1):
        with pytest.raises(NumericalError) as exc:
            J.run_joint_gd(inst, np.eye(2), 1, 0.1, record_at=[t])
        assert str(exc.value) == (
            f"joint GD, record at step {t}: the joint risk L(v, p) is about 1e-434: it underflows {RANGE_TEXT}"
        )


def test_toy_svm_multipliers_rows_and_support_by_hand():
    """Hand-derived on the toy (W = I, α = (1, 1, 1), token 0 = origin, so rows Y_i x_i and Δk_i = x_i):
    c = 1.5: v_mm = ½(1, 1) + ½(−1, 1) → v_duals (½, ½, 0), margins (1, 1, 1.5); p_relax = (1, 0) =
    ½(1, 1) + ½(1, −1) → p_duals (½, ½, 0), margins (1, 1, 0.5), active rows (0, 0), (1, 0).
    c = 1: p_relax = (4/3, 1/3) = μ₂(1, −1) + μ₃(½, 1) → μ = (0, 7/9, 10/9), active (1, 0), (2, 0)."""
    sol = J.solve_joint_svm(*joint_toy(1.5), JOINT_TOY_ALPHA)
    assert np.allclose(sol.v_duals, [0.5, 0.5, 0.0], rtol=0, atol=1e-12)
    assert np.allclose(sol.v_margins, [1.0, 1.0, 1.5], rtol=0, atol=1e-12)
    assert np.allclose(sol.p_duals, [0.5, 0.5, 0.0], rtol=0, atol=1e-12)
    assert np.allclose(sol.p_margins, [1.0, 1.0, 0.5], rtol=0, atol=1e-12)
    assert sol.p_rows.tolist() == [[1.0, 1.0], [1.0, -1.0], [0.5, 1.5]]
    assert sol.p_pairs.tolist() == [[0, 0], [1, 0], [2, 0]]
    assert sol.p_support == [(0, 0), (1, 0)]
    assert sol.alpha.tolist() == [1, 1, 1]
    sol = J.solve_joint_svm(*joint_toy(1.0), JOINT_TOY_ALPHA)
    assert np.allclose(sol.p_duals, [0.0, 7 / 9, 10 / 9], rtol=0, atol=1e-12)
    assert sol.p_support == [(1, 0), (2, 0)]


def test_exactly_cancelling_gradients_are_exact_zeros():
    """Hand-derived (as in the cancelling example): ∇_v L = 0 exactly and ∇_p L = 0 (equal values at
    v = 0); the plain gradients return exact zeros, not a refusal."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([0.0, 0.0]), np.ones((2, 2)))
    gv, gp = J.joint_grads(inst, np.eye(2), [0.0, 0.0], [0.3, 0.1])
    assert gv.tolist() == [0.0, 0.0] and gp.tolist() == [0.0, 0.0]


#: The v-gradient below 2^−960 is rebuilt from its log-domain direction: exp of a log-norm of size
#: |log| ≈ 700 amplifies that log's rounding (|log|·eps ≈ 1.6e-13); 4× that for the final products.
LOG_PATH_RTOL = 4 * 700 * 2.0**-52


@pytest.mark.parametrize("margin", [680.0, 700.0])
def test_tiny_v_gradient_against_mpmath(margin):
    """Oracle: mpmath (30 digits). Two identical inputs with tokens (1, 0), v = (m, 0), p = (0.3, 0):
    f = m, ∇_v L = (1/2)·2·ℓ'(m)·(1, 0) = (−1/(1 + e^m), 0), a normal double below 2^−960
    (5e-296, 1e-304); ∇_p L = 0 (equal values). At m = 740 it is 4e-322, subnormal: refused."""
    X = np.array([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.ones((2, 2)))
    gv, gp = J.joint_grads(inst, np.eye(2), [margin, 0.0], [0.3, 0.0])
    mpmath.mp.dps = 30
    want = float(-1 / (1 + mpmath.exp(margin)))
    assert abs(gv[0] - want) <= LOG_PATH_RTOL * abs(want) and gv[1] == 0.0
    assert gp.tolist() == [0.0, 0.0]
    with pytest.raises(NumericalError) as exc:
        J.joint_grads(inst, np.eye(2), [740.0, 0.0], [0.3, 0.0])
    assert str(exc.value) == f"the head gradient ∇_v L is about 1e-321: it underflows {RANGE_TEXT}"


class _ExtendedLogistic:
    """A user loss object (value/derivative/assumptions) computing the logistic loss in long double."""

    assumptions = get_loss("logistic").assumptions

    def value(self, u):
        return np.log1p(np.exp(-np.asarray(u, dtype=np.longdouble)))

    def derivative(self, u):
        return -1 / (1 + np.exp(np.asarray(u, dtype=np.longdouble)))


def test_user_loss_in_extended_precision_gives_float64_gradients(case):
    """Oracle: the built-in logistic loss. A user loss object returning long doubles gives the same
    gradients (to the same-formula tolerance) as float64 arrays (the documented return type)."""
    inst, W, p = case
    gv, gp = J.joint_grads(inst, W, inst.v, p, loss=_ExtendedLogistic())
    rv, rp = J.joint_grads(inst, W, inst.v, p)
    assert gv.dtype == np.float64 and gp.dtype == np.float64
    assert np.max(np.abs(gv - rv)) <= SAME_RTOL * np.max(np.abs(rv))
    assert np.max(np.abs(gp - rp)) <= SAME_RTOL * np.max(np.abs(rp))
    assert J.joint_risk(inst, W, inst.v, p, loss=_ExtendedLogistic()) == pytest.approx(
        J.joint_risk(inst, W, inst.v, p), rel=SAME_RTOL
    )


def test_v_gradient_with_subnormal_loss_derivative_against_mpmath():
    """Oracle: mpmath (30 digits). Tokens (2^100, 0) twice, v = (740·2^−100, 0): f = 740 and
    ℓ'(740) = −1/(1 + e^740) ≈ 4e-322 is subnormal (a few bits), yet ∇_v L = ℓ'·2^100 ≈ −5.3e-292
    is a normal double: it must come from the log domain, to LOG_PATH_RTOL, not from the rounded ℓ'."""
    x = 2.0**100
    inst = A.Instance(
        np.array([[[x, 0.0], [x, 0.0]]]), np.array([1.0]), np.array([0.0, 0.0]), np.ones((1, 2))
    )
    gv, gp = J.joint_grads(inst, np.eye(2), [740.0 * 2.0**-100, 0.0], [0.0, 0.0])
    mpmath.mp.dps = 30
    want = float(-x / (1 + mpmath.exp(740)))
    assert abs(gv[0] - want) <= LOG_PATH_RTOL * abs(want) and gv[1] == 0.0
    assert gp.tolist() == [0.0, 0.0]


def test_v_gradient_refused_when_only_it_underflows():
    """Regression: v_grad_of read an ℓ' that underflowed to 0 in every input as an exact zero gradient
    and returned 0 (a silent wrong answer). Oracle: ∇_v L = ℓ'(10⁴)·(1, 0) ≈ −e^−10000 ≈ 10^−4343 ≠ 0 (not a double: the contract says refuse);
    ∇_p L = 0 exactly (equal values). Found while pinning the log-domain rebuild of ∇_v L."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [1.0, 0.0]]]), np.array([1.0]), np.array([0.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError, match="the head gradient ∇_v L is about 1e-4343: it underflows"):
        J.joint_grads(inst, np.eye(2), [1e4, 0.0], [0.0, 0.0])


@pytest.mark.parametrize(("margin", "size"), [(740.0, "1e-622"), (744.0, "1e-624")])
def test_v_gradient_far_below_the_range_is_refused_by_size(margin, size):
    """Oracle: hand-computed size. Tokens a·(1, 0), a·(1, 1) with a = 2^−1000, v = (m/a, 0),
    p = (0, −64/a): s ≈ (1, e^−64), f ≈ m, so ∇_v L ≈ −e^−m·a·(1, 0): log10 = −m/ln 10 − 1000·log10 2
    = −622.4 (m = 740), −624.2 (m = 744); not doubles, refused with their size (∇_p L is refused too,
    but the head gradient is computed first)."""
    a = 2.0**-1000
    inst = A.Instance(np.array([[[a, 0.0], [a, a]]]), np.array([1.0]), np.array([0.0, 0.0]), np.ones((1, 2)))
    with pytest.raises(NumericalError) as exc:
        J.joint_grads(inst, np.eye(2), [margin / a, 0.0], [0.0, -64.0 / a])
    assert str(exc.value) == f"the head gradient ∇_v L is about {size}: it underflows {RANGE_TEXT}"


def test_gd_starting_point_and_reference_arguments():
    """Documented arguments: p0 is the starting prompt (record at step 0: ||p0|| = ||(3, 4)|| = 5, its
    cosine with p_reference (4, 3) is 24/25); shape errors name the argument exactly."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    tr = J.run_joint_gd(inst, np.eye(2), 1, 0.1, p0=[3.0, 4.0], record_at=[0], p_reference=[4.0, 3.0])
    assert tr.record[0].p_norm == 5.0 and tr.record[0].p_corr == pytest.approx(24 / 25, rel=1e-15)
    cases = [
        (dict(p0=[1.0, 2.0, 3.0]), "p0 must have shape (d,) = (2,) for this instance; got (3,)"),
        (dict(v_reference=[1.0, 2.0, 3.0]), "v_reference must have shape (d,) = (2,); got (3,)"),
        (
            dict(p_reference=[1.0, 2.0, 3.0]),
            "p_reference must have shape (d,) = (2,) for this instance; got (3,)",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidInstanceError) as exc:
            J.run_joint_gd(inst, np.eye(2), 1, 0.1, **kwargs)
        assert str(exc.value) == message


@pytest.mark.parametrize("normalized", [True, False])
def test_gd_moves_only_the_block_with_a_nonzero_gradient(normalized):
    """Hand-derived, both ways round (documented: a block whose gradient is exactly zero is left unchanged).
    (a) tokens (1, 0), (−1, 0), v0 = (2, 0), p0 = 0: s = (½, ½), Σ s_t x_t = 0 so ∇_v L = 0 exactly,
    while values (2, −2), f = 0, ℓ'(0) = −½ give ∇_p L = −½·(½·2·(1, 0) + ½·(−2)·(−1, 0)) = (−1, 0):
    v stays, p_1 = η·(1, 0) (both the unit step and the plain step with |∇_p L| = 1).
    (b) tokens (1), (3), v0 = 0: equal values so ∇_p L = 0, ∇_v L = −1: v_1 = η, p stays 0."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [-1.0, 0.0]]]), np.array([1.0]), np.array([2.0, 0.0]), np.ones((1, 2))
    )
    tr = J.run_joint_gd(inst, np.eye(2), 1, 0.5, normalized=normalized)
    assert tr.v.tolist() == [2.0, 0.0] and tr.p.tolist() == [0.5, 0.0]
    inst = A.Instance(np.array([[[1.0], [3.0]]]), np.array([1.0]), np.array([0.0]), np.ones((1, 1)))
    tr = J.run_joint_gd(inst, np.eye(1), 1, 0.5, normalized=normalized)
    assert tr.v.tolist() == [0.5] and tr.p.tolist() == [0.0]
    assert tr.v.dtype == np.float64 and tr.p.dtype == np.float64  # the documented FloatArray


def test_record_refuses_an_unrepresentable_norm_by_name():
    """Oracle: ||(1.5e308, 1.5e308)|| = 2.1e308 > 1.8e308 (hand-computed): the record at step 0 names
    the norm (of v, or of p) and the step."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    b = 1.5e308
    for kwargs, name in ((dict(v0=[b, b]), "||v||"), (dict(p0=[b, b]), "||p||")):
        with pytest.raises(NumericalError) as exc:
            J.run_joint_gd(inst, np.eye(2), 1, 0.1, record_at=[0], **kwargs)
        assert (
            str(exc.value) == f"joint GD, record at step 0: {name} is about 1e+308: it overflows {RANGE_TEXT}"
        )


def test_v_gradient_overflow_is_refused_by_name():
    """Oracle: hand-computed size. Exponential loss, tokens (1e306, 0) twice, v = (−1e-305, 0): f = −10,
    ℓ'(−10) = −e^10 ≈ −2.2e4, so ∇_v L ≈ (2.2e310, 0) overflows (log10 = 10/ln 10 + 306 = 310.3);
    ∇_p L = 0 (equal values)."""
    inst = A.Instance(
        np.array([[[1e306, 0.0], [1e306, 0.0]]]), np.array([1.0]), np.array([0.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        J.joint_grads(inst, np.eye(2), [-1e-305, 0.0], [0.0, 0.0], loss="exponential")
    assert str(exc.value) == f"the head gradient ∇_v L is about 1e+310: it overflows {RANGE_TEXT}"


class _Hinge:
    """A user loss object: ℓ(u) = max(0, 1 − u), ℓ'(u) = −1[u < 1] (exactly zero past the margin)."""

    assumptions = get_loss("logistic").assumptions

    def value(self, u):
        return np.maximum(0.0, 1.0 - np.asarray(u, dtype=np.float64))

    def derivative(self, u):
        return -(np.asarray(u, dtype=np.float64) < 1.0).astype(np.float64)


def test_v_direction_skips_inputs_with_zero_loss_derivative():
    """Hand-derived (hinge loss, n = 2 ≠ T = 3, W = I, p = (1, 0), v = (2, ¼)): input 0 (tokens (1, 0))
    has f = 2 ≥ 1, ℓ' = 0, and contributes nothing; input 1 (tokens (0, 1), (0, 3), (0, 2), equal
    logits, s = ⅓) has f = ½, ℓ' = −1, so ∇_v L = (1/2)·(−1)·(0, 2) = (0, −1): direction (0, −1),
    log-norm 0. With v = (2, 2) every ℓ' is 0: the documented message."""
    X = np.array([[[1.0, 0.0]] * 3, [[0.0, 1.0], [0.0, 3.0], [0.0, 2.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.ones((2, 2)))
    dv, _ = J.normalized_joint_grads(inst, np.eye(2), [2.0, 0.25], [1.0, 0.0], loss=_Hinge())
    assert dv.direction.tolist() == [0.0, -1.0]
    assert abs(dv.log_norm) <= 4 * 2.0**-52
    with pytest.raises(NumericalError) as exc:
        J.normalized_joint_grads(inst, np.eye(2), [2.0, 2.0], [1.0, 0.0], loss=_Hinge())
    assert (
        str(exc.value)
        == "∇_v L is exactly zero (zero loss derivative everywhere); the direction is undefined"
    )
