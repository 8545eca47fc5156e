"""Joint (v, p) training: gradients, the v-SVM / support inputs / relaxed p-SVM, GD directions on the toy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import attnsvm as A
from attnsvm import joint as J
from attnsvm.errors import AttnSVMError, InvalidInstanceError, NumericalError
from attnsvm.peer_strategies import joint_instances
from attnsvm.svm import CERTIFY_RTOL
from attnsvm.toys import JOINT_TOY_ALPHA, joint_toy

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
