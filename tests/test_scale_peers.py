"""Regression tests of the scale contract for the peer models (issue 13 §1): prompt, joint, ℓp, multi-token.

Each test pins an input on which the code before the fix returned a silent wrong answer, NaN/Inf
or 0, or raised a foreign or misleading exception (found by the power-of-two scale probe of the
peer functions). Data are scaled by exact powers of two ``2^j`` (``numpy.ldexp``), so the oracle
is the model's **scale equivariance**, exact in binary floating point: the answer on the scaled
data must be the answer at scale 1 moved by the known power of two (itself checked against
mpmath / finite differences / certificates in ``tests/test_prompt.py`` and siblings), or, where
that answer is not a normal double, a ``NumericalError`` naming the range. Where the oracle is a
sign fact (the logistic risk is positive) it is named in the test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.peers import _joint as J
from attnsvm.peers import _mirror as M
from attnsvm.peers import _multitoken as MT
from attnsvm.peers import _prompt as P
from attnsvm.peers._toys import joint_toy

EPS = float(np.finfo(np.float64).eps)
#: The scaled and unscaled computations run on the same power-of-two mantissas, so they agree to
#: rounding of the final put-back alone; 8 eps relative leaves room for a different summation order.
EQUI_RTOL = 8 * EPS
#: Two runs of the conic solver on bitwise-identical mantissas agree exactly; the put-back of the
#: real-exponent multipliers adds one rounding. 1e-12 relative also covers an interior-point restart.
LP_RTOL = 1e-12
#: The message of every scale-contract refusal names float64's normal range.
RANGE = r"float64's normal range \[2\.2e-308, 1\.8e308\]"


def ld(a: np.ndarray | float, j: int) -> np.ndarray:
    return np.ldexp(np.asarray(a, dtype=np.float64), j)


def scaled(inst: A.Instance, jx: int, jv: int = 0) -> A.Instance:
    """``X → 2^jx X`` (and ``z`` with it), ``v → 2^jv v``."""
    if inst.self_attention:
        return A.Instance(ld(inst.X, jx), inst.Y, ld(inst.v, jv))
    return A.Instance(ld(inst.X, jx), inst.Y, ld(inst.v, jv), ld(inst.z, jx))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def prompt_case() -> tuple[A.Instance, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    inst = A.random_instance(2, 3, 4, seed=1)
    return inst, rng.standard_normal((4, 4)), 0.5 * rng.standard_normal(4)


# ---------------------------------------------------------------------------------- prompt
@pytest.mark.parametrize("j", [510, 540, 990])
def test_normalized_prompt_grad_at_large_keys(prompt_case, j):
    """Was: "contributions cancel to rounding level" for X·2^j, p·2^−j, v·2^−j (j ≥ 510).
    Oracle: equivariance — same logits and outputs, so the same direction, log-norm + j·log 2."""
    inst, W, p = prompt_case
    ref = P.normalized_prompt_grad(inst, W, p)
    got = P.normalized_prompt_grad(scaled(inst, j, -j), W, ld(p, -j))
    assert rel(got.direction, ref.direction) <= EQUI_RTOL
    assert abs(got.log_norm - (ref.log_norm + j * math.log(2.0))) <= EQUI_RTOL * abs(got.log_norm)


@pytest.mark.parametrize("j", [-540, 540])
def test_prompt_local_optimality_invariant(prompt_case, j):
    """Was: InvalidInstanceError ("K must be finite") at X·2^540 and InfeasibleSVMError read as
    ``False`` at W·2^−540. Oracle: local optimality is invariant under X → cX and W → cW."""
    inst, W, _ = prompt_case
    for a in range(inst.T):
        ref = P.prompt_local_optimality(inst, W, [a, a])
        assert P.prompt_local_optimality(scaled(inst, j), W, [a, a]) == ref
        assert P.prompt_local_optimality(inst, ld(W, j), [a, a]) == ref


@pytest.mark.parametrize("j", [-300, 300, 480])
def test_prompt_svm_equivariant(prompt_case, j):
    """Was: TiedScoresError at X·2^−300, InvalidInstanceError ("K must be finite") from 2^510 on.
    Oracle: p_mm(2^j X) = 2^−j p_mm(X), multipliers 2^−2j, margins and KKT unchanged."""
    inst, W, _ = prompt_case
    ref = P.solve_prompt_svm(inst, W)
    got = P.solve_prompt_svm(scaled(inst, j), W)
    assert rel(got.p, ld(ref.p, -j)) <= EQUI_RTOL
    assert rel(got.duals, ld(ref.duals, -2 * j)) <= EQUI_RTOL
    assert np.array_equal(got.alpha, ref.alpha) and got.support == ref.support and got.certified


def test_prompt_svm_refuses_unrepresentable_multipliers(prompt_case):
    """Was: InfeasibleSVMError ("the same key as the selected token": false) at W·2^−540.
    Oracle: the multipliers are 2^1080 times those at scale 1: not a double, so the range error."""
    inst, W, _ = prompt_case
    with pytest.raises(NumericalError, match="p-SVM multipliers .*overflows " + RANGE):
        P.solve_prompt_svm(inst, ld(W, -540))


@pytest.mark.parametrize("j", [-540, 510])
def test_prompt_path_equivariant(prompt_case, j):
    """Was: a silently wrong path (relative error 1) at X·2^−540, radii·2^540, and "cancel to rounding
    level" at 2^510. Oracle: p_R(2^j X, 2^−j v) = 2^−j p_{2^j R}(X, v)."""
    inst, W, _ = prompt_case
    radii = np.array([1.0, 2.0])
    ref = P.prompt_regularization_path(inst, W, radii, max_steps=50)
    got = P.prompt_regularization_path(scaled(inst, j, -j), W, ld(radii, -j), max_steps=50)
    for g, r in zip(got, ref, strict=True):
        assert rel(g.p, ld(r.p, -j)) <= EQUI_RTOL and g.risk == pytest.approx(r.risk, rel=EQUI_RTOL)


@pytest.mark.parametrize("j", [510, 900])
def test_prompt_gd_equivariant(prompt_case, j):
    """Was: "contributions cancel to rounding level" at step 1 for j ≥ 510.
    Oracle: normalized GD on (2^j X, 2^−j v) with lr·2^−j is 2^−j times the run at scale 1."""
    inst, W, _ = prompt_case
    ref = P.run_prompt_gd(inst, W, 20, 0.1)
    got = P.run_prompt_gd(scaled(inst, j, -j), W, 20, 0.1 * 2.0**-j)
    assert rel(got.p, ld(ref.p, -j)) <= EQUI_RTOL


def test_prompt_risk_underflow_is_refused():
    """Was: 0.0. Oracle: the logistic risk is positive (log(1 + e^{−u}) > 0 for every finite u); here
    s ≈ (1, e^{−50}) and f ≈ 2000, so its log is ≈ −2000, far below log(2.2e-308) ≈ −708."""
    inst = A.Instance(np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([2000.0, 0.0]))
    with pytest.raises(NumericalError, match="prompt risk .*underflows " + RANGE):
        P.prompt_risk(inst, np.eye(2), np.array([50.0, 0.0]))


# ----------------------------------------------------------------------------------- joint
@pytest.mark.parametrize("j", [540, 990])
def test_joint_gd_does_not_drop_a_block(j):
    """Was: the p-block's range error read as a zero gradient, so p stayed 0 (relative error 1).
    Oracle: joint GD on 2^j X with v0·2^−j, lr·2^−j is 2^−j times the run at scale 1."""
    inst, W = joint_toy(1.0)
    v0 = np.array([0.3, 0.7])
    ref = J.run_joint_gd(inst, W, 20, 0.1, v0=v0)
    got = J.run_joint_gd(scaled(inst, j), W, 20, 0.1 * 2.0**-j, v0=ld(v0, -j))
    assert rel(got.v, ld(ref.v, -j)) <= EQUI_RTOL and rel(got.p, ld(ref.p, -j)) <= EQUI_RTOL


@pytest.mark.parametrize("j", [540, 990])
def test_normalized_joint_grads_at_large_scale(j):
    """Was: "contributions cancel to rounding level". Oracle: equivariance (same directions)."""
    inst, W = joint_toy(1.0)
    v, p = np.array([0.3, 0.7]), np.array([0.2, -0.4])
    ref = J.normalized_joint_grads(inst, W, v, p)
    got = J.normalized_joint_grads(scaled(inst, j), W, ld(v, -j), ld(p, -j))
    for g, r in zip(got, ref, strict=True):
        assert rel(g.direction, r.direction) <= EQUI_RTOL


@pytest.mark.parametrize("j", [-500, 500])
def test_joint_svm_equivariant(j):
    """Was: InfeasibleSVMError (false) at 2^−540 and InvalidInstanceError at 2^540; at ±500 the
    multipliers (2^∓1000) are still doubles. Oracle: v_mm, p_relax scale by 2^−j, the support not."""
    inst, W = joint_toy(1.0)
    ref = J.solve_joint_svm(inst, W, [1, 1, 1])
    got = J.solve_joint_svm(scaled(inst, j), W, [1, 1, 1])
    assert rel(got.v, ld(ref.v, -j)) <= EQUI_RTOL and rel(got.p, ld(ref.p, -j)) <= EQUI_RTOL
    assert got.support_inputs.tolist() == ref.support_inputs.tolist()


# -------------------------------------------------------------------------------------- ℓp
@pytest.mark.parametrize(("p", "j"), [(3.0, 540), (7.0, 180)])
def test_mirror_map_overflow_is_refused(p, j):
    """Was: inf entries. Oracle: ∇ψ is homogeneous of degree p − 1: |2^j W|^{p−1} ≥ 2^{j(p−1)−…} > 1.8e308."""
    W = np.array([[1.5, -0.7], [0.0, 2.0]])
    with pytest.raises(NumericalError, match="mirror map .*overflows " + RANGE):
        M.mirror_map(ld(W, j), p)


@pytest.mark.parametrize(("p", "j"), [(3.0, -540), (1.25, -270)])
def test_mirror_maps_underflow_is_refused(p, j):
    """Was: silent zeros (p = 3: |2^−540|² = 2^−1080) and, for the inverse at p = 1.25 (degree 4),
    2^−1080 as well. Oracle: homogeneity; a nonzero entry's image below 2.2e-308 is not a double."""
    W = np.array([[1.5, -0.7], [0.0, 2.0]])
    with pytest.raises(NumericalError, match="underflows " + RANGE):
        (M.mirror_map if p > 2 else M.inverse_mirror_map)(ld(W, j), p)


def test_inverse_mirror_map_overflow_is_refused():
    """Was: inf entries at p = 1.25 (degree 1/(p−1) = 4), W·2^270. Oracle: homogeneity."""
    with pytest.raises(NumericalError, match="inverse mirror map .*overflows " + RANGE):
        M.inverse_mirror_map(ld(np.array([[1.5, -0.7]]), 270), 1.25)


@pytest.mark.parametrize(("p", "j"), [(1.25, 60), (3.0, 30), (3.0, -100), (7.0, 60)])
def test_lp_svm_equivariant(p, j):
    """Was: SolverError ("Clarabel failed" / "optimal_inaccurate") from 2^30 on, a false
    InfeasibleSVMError at 2^−30. Oracle: W_p(2^j X, 2^j z) = 2^−2j W_p(X, z), objective 2^−2j."""
    inst = A.random_instance(2, 3, 3, seed=4, family="unit")
    ref = M.solve_lp_svm(inst, p)
    got = M.solve_lp_svm(scaled(inst, j), p)
    assert rel(got.W, ld(ref.W, -2 * j)) <= LP_RTOL
    assert got.objective == pytest.approx(math.ldexp(ref.objective, -2 * j), rel=LP_RTOL)
    assert got.gap == pytest.approx(ref.gap, rel=LP_RTOL, abs=EPS)


def test_lp_svm_out_of_range_is_a_numerical_error():
    """Was: cvxpy's ValueError ("Problem data contains NaN or Inf"), a foreign exception, at 2^540.
    Oracle: W_p = 2^−1080 W_p(X): not a normal double."""
    inst = A.random_instance(2, 3, 3, seed=4, family="unit")
    with pytest.raises(NumericalError, match="ℓp-SVM solution .*underflows " + RANGE):
        M.solve_lp_svm(scaled(inst, 540), 3.0)


@pytest.mark.parametrize(("p", "j"), [(3.0, 120), (1.25, 200), (2.0, -300)])
def test_mirror_descent_equivariant(p, j):
    """Was: "contributions cancel to rounding level" at step 1 at many scales. Oracle: with X, z by
    2^j, v by 2^−j, lr by 2^{−2j(p−1)}, the iterates are 2^−2j times the run at scale 1."""
    inst = A.random_instance(2, 3, 3, seed=4, family="unit")
    ref = M.run_mirror_descent(inst, p, 10, 0.1)
    lr = 0.1 * 2.0 ** (-2 * j * (p - 1))
    got = M.run_mirror_descent(scaled(inst, j, -j), p, 10, lr)
    assert rel(got.W, ld(ref.W, -2 * j)) <= 1e-13  # lr·2^{…} rounds once when p − 1 is not dyadic


def test_mirror_descent_underflowing_iterate_is_refused():
    """Was: W = 0 returned silently (W_t·2^−1080 underflows). Oracle: equivariance as above."""
    inst = A.random_instance(2, 3, 3, seed=4, family="unit")
    with pytest.raises(NumericalError, match="iterate W .*underflows " + RANGE):
        M.run_mirror_descent(scaled(inst, 540, -540), 1.25, 10, 0.1 * 2.0**-270)


# ----------------------------------------------------------------------------- multi-token
@pytest.mark.parametrize("j", [-300, 300])
def test_predict_multitoken_equivariant(j):
    """Was: a false InfeasibleSVMError at 2^−300 and InvalidInstanceError ("K must be finite") at
    2^300. Oracle: W_dir, W_fin scale by 2^−2j (W_gd by 2^−2j), R and the errors are invariant."""
    inst = A.random_instance(2, 4, 4, seed=5)
    V = MT.random_head(4, 3, seed=1)
    Wg = MT.run_multitoken_gd(inst, V, 300, 2.0).W
    ref = MT.predict_multitoken(inst, Wg)
    got = MT.predict_multitoken(scaled(inst, j), ld(Wg, -2 * j))
    for g, r in ((got.W_dir, ref.W_dir), (got.W_fin, ref.W_fin)):
        if np.any(r):
            assert rel(g, ld(r, -2 * j)) <= EQUI_RTOL
    assert got.R == pytest.approx(ref.R, rel=EQUI_RTOL)
    assert got.rel_error == pytest.approx(ref.rel_error, rel=1e-12, abs=EPS)


def test_multitoken_grad_underflow_is_refused():
    """Oracle: |∇L| ≤ max|ℓ'|·max|a_t − a_u|·max||x||·max||z|| with the values a = xᵀVm of size
    2^−1010 and x, z of size 2^−10: below 2^−1020, not a normal double, while the (log-domain)
    direction exists. Was: a subnormal or zero matrix."""
    inst = A.random_instance(2, 4, 4, seed=5)
    V = MT.random_head(4, 3, seed=1)
    W = 0.5 * np.random.default_rng(0).standard_normal((4, 4))
    args = (scaled(inst, -10), ld(W, 20), ld(V, -1000))
    with pytest.raises(NumericalError, match="multi-token gradient .*underflows " + RANGE):
        MT.multitoken_grad(*args)
    assert abs(np.linalg.norm(MT.normalized_multitoken_grad(*args).direction) - 1) <= 4 * EPS


# ------------------------------------------------------------------- GD records at every scale
PROMPT_SCALE_OVERFLOW = (
    "the logit scale max|p|·max|k| (keys k_it = Wᵀx_it) is about 1e+308: it overflows float64's normal "
    "range [2.2e-308, 1.8e308]. Scale p or the keys (W or X) down; the attention logits would overflow"
)


@pytest.mark.parametrize("j", [0, 300, 600])
def test_prompt_gd_record_refuses_instead_of_minus_inf(j):
    """Was: the record at step 1 swallowed the refusal of ∇_p L and recorded log10||∇_p L|| = −inf, a
    zero gradient that is not there. Oracle: by the tokens' symmetry ∇_p L(0) ∝ (−1, 1), so
    p_1 = 1.7e308·(1, −1)/√2 and the logit scale max|p|·2^K (keys x_it, K = 1) is 2.4e308 ≈ 10^308.4
    (hand-computed); equivariance — (2^j X, 2^−j v, lr·2^−j) gives p_t·2^−j, the same logits and the same
    refusal at every j. The wording names p and the keys (the prompt model has no query z)."""
    inst = A.Instance(np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]))
    with pytest.raises(NumericalError) as exc:
        P.run_prompt_gd(scaled(inst, j, -j), np.eye(2), 2, ld(1.7e308, -j), record_at=[1])
    assert str(exc.value) == f"prompt GD, record at step 1: {PROMPT_SCALE_OVERFLOW}"


@pytest.mark.parametrize("j", [0, 200, 500])
def test_mirror_record_logit_overflow_names_the_step(j):
    """Was: the record's logit-scale refusal without the "record at step t" prefix. Oracle:
    equivariance — (2^j X, 2^j z, W0·2^−2j) has the same logits, hence the same refusal at every j:
    max|W0|·2^(ex+ez) = 1e308·4 ≈ 10^308.6 (unit tokens and queries, hand-computed)."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2))
    )
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(
            scaled(inst, j), 2.0, 1, 0.1, W0=ld(np.full((2, 2), 1e308), -2 * j), record_at=[0]
        )
    assert str(exc.value) == (
        "mirror descent, record at step 0: the logit scale max|W|·max|x|·max|z| is about 1e+309: it overflows "
        "float64's normal range [2.2e-308, 1.8e308]. Scale W or the data down; the attention logits would "
        "overflow"
    )


#: The documented accuracy of the normalized prompt direction, ``≲ nT·eps`` per entry (n = 1, T = 2),
#: with a factor 64 for the log-domain sums: a wrong direction shows as ≳ 1e-5 here.
PROMPT_DIR_ATOL = 64 * 2 * EPS


def test_normalized_prompt_direction_at_a_huge_margin():
    """Oracle: hand-derived symmetry. Keys e_0, e_1 (W = I), p = 0, values (2^40, 0): s = (½, ½),
    ∇_p L = ℓ'(2^39)·¼·2^40·(e_0 − e_1) with ℓ' < 0, so the direction is exactly (−1, 1)/√2."""
    inst = A.Instance(np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([2.0**40, 0.0]))
    g = P.normalized_prompt_grad(inst, np.eye(2), np.zeros(2))
    assert np.max(np.abs(g.direction - np.array([-1.0, 1.0]) / math.sqrt(2.0))) <= PROMPT_DIR_ATOL
