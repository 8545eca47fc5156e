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
from fractions import Fraction

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError, SolverError
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


# ============== rows far apart in size (issue 16: per-row exponents of solve_prompt_svm / solve_joint_svm)
# The SVM rows used to share one power-of-two exponent: a row 2^537 below the largest then squared below
# 2^-1074 in the Gram matrix, read as a zero row, and a feasible problem was refused as infeasible. Oracle:
# hand-solved optima checked exactly in rational arithmetic (fractions): a point meeting every constraint
# whose norm equals a lower bound (Cauchy–Schwarz on one binding row) is the least-norm point.


def _two_sequences(x0: tuple[float, float], x1: tuple[float, float]) -> A.Instance:
    """Two sequences of two tokens in d = 2: selected token ``x_i`` (α = 0), the other token 0, labels +1."""
    X = np.zeros((2, 2, 2))
    X[0, 0], X[1, 0] = x0, x1
    return A.Instance(X, np.ones(2), np.array([1.0, 1.0]), np.ones((2, 2)))


def _exact_optimum(
    rows: list[tuple[float, float]], b: list[int], x: tuple[float, float], binding: int
) -> None:
    """``x`` meets ``rowsᵀx ≥ b`` exactly and ``||x|| = b_r/||row_r||`` for the ``binding`` row (a lower bound
    on every feasible norm by Cauchy–Schwarz), so ``x`` is the least-norm point; all in exact rationals."""
    from fractions import Fraction as F

    xs = [F(v) for v in x]
    for r, br in zip(rows, b, strict=True):
        assert sum(F(a) * v for a, v in zip(r, xs, strict=True)) >= br
    row = [F(a) for a in rows[binding]]
    # ||x||² = b²/||row||² (squared: no square roots in Q)
    assert sum(v * v for v in xs) == F(b[binding]) ** 2 / sum(a * a for a in row)


# x_0 = (2^-300, 0) binds; x_1 = (2^300, 2^300) is 2^600 larger and has margin 2^600 at the optimum
FAR = ((2.0**-300, 0.0), (2.0**300, 2.0**300))


def test_joint_svm_rows_2_to_600_apart_solve_and_certify():
    """The v-SVM rows ``Y_i x_iα`` are 2^600 apart: ``v_mm = (2^300, 0)`` (multiplier ``2^600``, margins
    ``(1, 2^600)``, input 0 the only support input), and the relaxed p-SVM (``W = I``, rows ``x_iα``, ``≥ 1``
    for input 0, ``≥ 0`` for input 1) has the same solution. Used to raise InfeasibleSVMError (the small row
    read as zero); now exact and certified."""
    inst = _two_sequences(*FAR)
    _exact_optimum(list(FAR), [1, 1], (2.0**300, 0.0), binding=0)
    _exact_optimum(list(FAR), [1, 0], (2.0**300, 0.0), binding=0)
    sol = J.solve_joint_svm(inst, np.eye(2), [0, 0])
    assert sol.certified
    np.testing.assert_array_equal(sol.v, [2.0**300, 0.0])
    np.testing.assert_array_equal(sol.v_duals, [2.0**600, 0.0])
    np.testing.assert_array_equal(sol.v_margins, [1.0, 2.0**600])
    np.testing.assert_array_equal(sol.support_inputs, [0])
    np.testing.assert_array_equal(sol.p, [2.0**300, 0.0])
    np.testing.assert_array_equal(sol.p_duals, [2.0**600, 0.0])
    np.testing.assert_array_equal(sol.p_margins, [1.0, 2.0**600])
    np.testing.assert_array_equal(sol.p_rows, np.array(FAR))


def test_prompt_svm_rows_2_to_600_apart_solve_and_certify():
    """The p-SVM of the same data (``W = I``: rows ``x_iα − 0``): ``p_mm = (2^300, 0)``, multipliers
    ``(2^600, 0)``, margins ``(1, 2^600)``; used to raise InfeasibleSVMError."""
    _exact_optimum(list(FAR), [1, 1], (2.0**300, 0.0), binding=0)
    sol = P.solve_prompt_svm(_two_sequences(*FAR), np.eye(2), [0, 0])
    assert sol.certified and sol.support == [(0, 1)] and sol.weakly_active == []
    np.testing.assert_array_equal(sol.p, [2.0**300, 0.0])
    np.testing.assert_array_equal(sol.duals, [2.0**600, 0.0])
    np.testing.assert_array_equal(sol.margins, [1.0, 2.0**600])


@pytest.mark.parametrize("j", [-200, 0, 400])
def test_far_apart_rows_stay_equivariant(j):
    """The far-apart solution moves with a global ``X → 2^j X`` as every other (``v, p → 2^−j``, multipliers
    ``2^−2j``), bitwise: the per-row exponents absorb ``j`` exactly (``j`` keeps the multiplier ``2^(600−2j)``
    a double)."""
    base = J.solve_joint_svm(_two_sequences(*FAR), np.eye(2), [0, 0])
    sol = J.solve_joint_svm(_two_sequences(*(tuple(ld(x, j)) for x in FAR)), np.eye(2), [0, 0])
    np.testing.assert_array_equal(sol.v, ld(base.v, -j))
    np.testing.assert_array_equal(sol.v_duals, ld(base.v_duals, -2 * j))
    np.testing.assert_array_equal(sol.p, ld(base.p, -j))
    np.testing.assert_array_equal(sol.v_margins, base.v_margins)


def test_key_matrix_columns_2_to_600_apart_are_not_read_as_zero():
    """``W = diag(2^300, 2^-300)`` (its columns 2^600 apart), selected tokens ``(1, 2)`` and ``(0, 1)``: the
    p-rows ``Wᵀx_iα`` are ``(2^300, 2^-299)`` and ``(0, 2^-300)``. Row 1 forces ``p_2 ≥ 2^300``, and
    ``p = (0, 2^300)`` meets row 0 with margin 2: the least-norm point (checked exactly). The shared exponent
    of ``W`` read row 1 as zero (InfeasibleSVMError). The relaxed p-SVM (input 1 the only support input of
    the v-SVM, so row 0 asks ``≥ 0``) is solved exactly and certified. The p-SVM is solved to working
    precision (relative ``2^-600``: its row 0 binds in floating point, since its slack is ``2^-600`` of its own
    size), and, that row being unresolved at the rows' spread, not certified — as ``solve_svm`` does."""
    rows = [(2.0**300, 2.0**-299), (0.0, 2.0**-300)]
    _exact_optimum(rows, [1, 1], (0.0, 2.0**300), binding=1)
    _exact_optimum(rows, [0, 1], (0.0, 2.0**300), binding=1)
    inst = _two_sequences((1.0, 2.0), (0.0, 1.0))
    W = np.diag([2.0**300, 2.0**-300])
    sol = J.solve_joint_svm(inst, W, [0, 0])
    assert sol.certified
    np.testing.assert_array_equal(sol.support_inputs, [1])
    np.testing.assert_array_equal(sol.p, [0.0, 2.0**300])
    np.testing.assert_array_equal(sol.p_rows, np.array(rows))
    np.testing.assert_array_equal(sol.p_margins, [2.0, 1.0])
    ps = P.solve_prompt_svm(inst, W, [0, 0])
    assert rel(ps.p, np.array([0.0, 2.0**300])) <= EQUI_RTOL
    assert not ps.certified
    np.testing.assert_array_equal(ps.rows, np.array(rows))


def test_both_rows_binding_2_to_600_apart_is_solved_but_not_certified():
    """Rows ``(2^-300, 0)`` and ``(0, 2^300)`` both bind: ``v_mm = (2^300, 2^-300)``. Its second entry is
    ``2^-600`` of the first, below working precision, so the margin of row 1 is unresolved: ``v`` is right
    normwise (relative error ``≤ 2^-600``) and ``certified`` is False (``solve_svm``'s rule for a support row
    whose right-hand side is below its own resolution)."""
    rows = [(2.0**-300, 0.0), (0.0, 2.0**300)]
    inst = _two_sequences(*rows)
    sol = J.solve_joint_svm(inst, np.eye(2), [0, 0])
    assert rel(sol.v, np.array([2.0**300, 2.0**-300])) <= EQUI_RTOL
    assert not sol.certified
    ps = P.solve_prompt_svm(inst, np.eye(2), [0, 0])
    assert rel(ps.p, np.array([2.0**300, 2.0**-300])) <= EQUI_RTOL
    assert not ps.certified


def test_far_apart_rows_whose_multiplier_overflows_are_refused_by_name():
    """``x_0 = (2^-600, 0)`` binds alone: ``v_mm = (2^600, 0)`` is a double but its multiplier
    ``1/||x_0||² = 2^1200 ≈ 1e361`` is not: refused by name (the answer, not the rows' spread)."""
    inst = _two_sequences((2.0**-600, 0.0), (2.0**300, 2.0**300))
    with pytest.raises(
        NumericalError, match="the v-SVM multipliers is about 1e\\+361: it overflows " + RANGE
    ):
        J.solve_joint_svm(inst, np.eye(2), [0, 0])
    with pytest.raises(
        NumericalError, match="the p-SVM multipliers is about 1e\\+361: it overflows " + RANGE
    ):
        P.solve_prompt_svm(inst, np.eye(2), [0, 0])


# ============ multi-token rows far apart in size (issue 16: per-row exponents of predict_multitoken)
# The rows z_i ⊗ (x_it − x_iτ) of W_dir and W_fin shared one power-of-two exponent: a row ~2^537 below the
# largest squared to 0 in the Gram matrix, so a feasible direction SVM, or the always-feasible finite part
# (W_gd meets its equalities), was refused with InfeasibleSVMError. Oracle: hand-solved optima checked exactly
# in rational arithmetic from the definition (x_it − x_iτ)ᵀ W z_i, a feasible point whose norm meets a lower
# bound (Cauchy–Schwarz: |aᵀw| ≤ ||a||·||w||, ||z ⊗ δ|| = ||z||·||δ||) being the least-norm point.


def _mt_instance(x: list[tuple[float, float]], z: list[tuple[float, float]]) -> A.Instance:
    """``n = 2`` sequences of two tokens in ``d = 2``: token 0 is ``x[i]``, token 1 is 0; queries ``z[i]``;
    labels and head 1 (``predict_multitoken`` reads neither)."""
    X = np.zeros((2, 2, 2))
    X[0, 0], X[1, 0] = x
    return A.Instance(X, np.ones(2), np.ones(2), np.array(z, dtype=np.float64))


Constraint = tuple[int, int, int, str, int]


def _bilinear_rows(inst: A.Instance, cons: list[Constraint]) -> list[list[Fraction]]:
    """The rows ``z_i ⊗ (x_it − x_iτ)`` of ``cons = [(i, t, τ, kind, b)]`` as the flattened matrices ``δ z_iᵀ``,
    in exact rationals from the instance's doubles (so ``rowᵀ vec(W) = (x_it − x_iτ)ᵀ W z_i``)."""
    X = [[[Fraction(v) for v in tok] for tok in seq] for seq in inst.X.tolist()]
    Z = [[Fraction(v) for v in q] for q in inst.z.tolist()]
    out = []
    for i, t, tau, _, _ in cons:
        delta = [a - b for a, b in zip(X[i][t], X[i][tau], strict=True)]
        out.append([delta[j] * Z[i][k] for j in range(inst.d) for k in range(inst.d)])
    return out


def _exact_feasible(inst: A.Instance, cons: list[Constraint], W: np.ndarray) -> None:
    """``W`` meets every ``(x_it − x_iτ)ᵀ W z_i ≥ b`` (kind ``"≥"``) or ``= b`` (``"="``) exactly (rationals)."""
    w = [Fraction(v) for v in np.asarray(W).reshape(-1).tolist()]  # row-major, as the rows' δ z_iᵀ
    for (i, t, tau, kind, b), row in zip(cons, _bilinear_rows(inst, cons), strict=True):
        m = sum((a * v for a, v in zip(row, w, strict=True)), Fraction(0))
        assert m == b if kind == "=" else m >= b, (i, t, tau, kind, b, m)


def _exact_least_norm(inst: A.Instance, cons: list[Constraint], W: np.ndarray, binding: list[int]) -> None:
    """``W`` is feasible (:func:`_exact_feasible`) and ``||W||_F² = Σ b_r²/||row_r||²`` over the ``binding``
    constraints (non-empty), whose rows are pairwise orthogonal (checked): by Cauchy–Schwarz on each, projected on
    their orthogonal directions, a lower bound on the norm of every feasible point, so ``W`` is the least-norm
    point. All in exact rationals."""
    assert binding
    _exact_feasible(inst, cons, W)
    rows = [_bilinear_rows(inst, cons)[r] for r in binding]
    for p in range(len(rows)):
        for q in range(p):
            assert sum((a * c for a, c in zip(rows[p], rows[q], strict=True)), Fraction(0)) == 0
    bound = sum(
        (
            Fraction(cons[r][4]) ** 2 / sum((a * a for a in rows[k]), Fraction(0))
            for k, r in enumerate(binding)
        ),
        Fraction(0),
    )
    assert sum((Fraction(v) ** 2 for v in np.asarray(W).reshape(-1).tolist()), Fraction(0)) == bound


#: The single-token baseline ``W_mm`` comes from :func:`attnsvm.svm.solve_svm`, certified to this relative error.
SVM_CERTIFIED_RTOL = 1e-9


@pytest.mark.parametrize("k", [300, 450])
def test_predict_multitoken_direction_rows_far_apart(k):
    """``z_i = e_0``, ``x_00 = (2^-k, 0)``, ``x_10 = (2^k, 2^k)`` (the other tokens 0): the direction SVM's rows
    ``e_0 ⊗ x_i0`` are ``2^2k`` apart (2^600, 2^900). ``W_gd = 10·W_dir`` selects token 0 in both sequences (logit
    gaps 10 and ``10·2^2k``), so ``W_dir = 2^k·e_0e_0ᵀ`` (row 0 binds, row 1 has margin ``2^2k``), ``W_fin = 0``,
    ``R = 10`` and the prediction is ``W_gd`` itself. Used to raise InfeasibleSVMError (row 0 read as zero); now
    exact."""
    inst = _mt_instance([(2.0**-k, 0.0), (2.0**k, 2.0**k)], [(1.0, 0.0), (1.0, 0.0)])
    W_dir = np.array([[2.0**k, 0.0], [0.0, 0.0]])
    _exact_least_norm(inst, [(0, 0, 1, "≥", 1), (1, 0, 1, "≥", 1)], W_dir, binding=[0])
    Wg = 10.0 * W_dir
    got = MT.predict_multitoken(inst, Wg)
    assert [s.tolist() for s in got.sets] == [[0], [0]]
    np.testing.assert_array_equal(got.W_dir, W_dir)
    np.testing.assert_array_equal(got.W_fin, np.zeros((2, 2)))
    assert got.R == 10.0 and got.rel_error == 0.0 and got.corr == 1.0
    np.testing.assert_array_equal(got.prediction, Wg)
    assert got.kkt_fin is None and got.kkt_dir is not None and got.kkt_dir.max() == 0.0
    # all sets are singletons: the single-token Att-SVM at α = (0, 0) is the same problem
    assert got.W_mm is not None and rel(got.W_mm, W_dir) <= SVM_CERTIFIED_RTOL


def test_predict_multitoken_finite_part_rows_2_to_600_apart():
    """``x_00 = z_0 = (1, 0)``, ``x_10 = z_1 = (0, 2^-300)``, ``W_gd = diag(10, 2^600)``: sequence 0 selects token 0
    (gap 10), sequence 1 both tokens (gap 1), so ``W_fin`` solves ``(x_11 − x_10)ᵀ W z_1 = (x_11 − x_10)ᵀ W_gd z_1
    = −1``, a row of size 2^-600: ``W_fin = 2^600·e_1e_1ᵀ``; ``W_dir = e_0e_0ᵀ`` (``W_00 ≥ 1``, ``W_11 = 0``);
    ``R = 10``; the prediction is ``W_gd``. The finite part used to raise InfeasibleSVMError (its row read as zero
    with a nonzero right-hand side, though ``W_gd`` itself meets it); now exact."""
    inst = _mt_instance([(1.0, 0.0), (0.0, 2.0**-300)], [(1.0, 0.0), (0.0, 2.0**-300)])
    Wg = np.diag([10.0, 2.0**600])
    W_fin, W_dir = np.diag([0.0, 2.0**600]), np.diag([1.0, 0.0])
    _exact_feasible(
        inst, [(1, 1, 0, "=", -1)], Wg
    )  # the right-hand side is W_gd's own (x_11 − x_10)ᵀ W_gd z_1
    _exact_least_norm(inst, [(1, 1, 0, "=", -1)], W_fin, binding=[0])
    _exact_least_norm(inst, [(1, 1, 0, "=", 0), (0, 0, 1, "≥", 1)], W_dir, binding=[1])
    got = MT.predict_multitoken(inst, Wg)
    assert [s.tolist() for s in got.sets] == [[0], [0, 1]]
    np.testing.assert_array_equal(got.W_fin, W_fin)
    np.testing.assert_array_equal(got.W_dir, W_dir)
    assert got.R == 10.0 and got.rel_error == 0.0
    np.testing.assert_array_equal(got.prediction, Wg)


@pytest.mark.parametrize("j", [-200, 0, 300])
def test_predict_multitoken_far_apart_rows_stay_equivariant(j):
    """``X, z → 2^j X, 2^j z`` with ``W_gd → 2^−2j W_gd`` keeps the logits and the sets: ``W_dir``, ``W_fin`` and the
    prediction move by ``2^−2j`` and ``R`` stays 10, bitwise (the per-row exponents absorb ``j`` exactly)."""
    inst = _mt_instance([(1.0, 0.0), (0.0, 2.0**-300)], [(1.0, 0.0), (0.0, 2.0**-300)])
    got = MT.predict_multitoken(scaled(inst, j), ld(np.diag([10.0, 2.0**600]), -2 * j))
    np.testing.assert_array_equal(got.W_fin, ld(np.diag([0.0, 2.0**600]), -2 * j))
    np.testing.assert_array_equal(got.W_dir, ld(np.diag([1.0, 0.0]), -2 * j))
    assert got.R == 10.0


def test_predict_multitoken_unresolved_far_apart_rows_are_refused_by_name():
    """``x_00 = z_0 = (1, 0)``, ``x_10 = z_1 = (0, 2^-300)``, ``W_gd = diag(10, 10·2^600)``: both sequences select
    token 0 and both rows bind: ``W_dir = diag(1, 2^600)`` (exactly; rows on disjoint entries). Its entry 1 is
    ``2^-600`` of its norm, so row 0's margin ``≥ 1`` is below working precision relative to that row: unresolved
    (``solve_svm``'s rule), refused with SolverError naming the rows' spread. Was: InfeasibleSVMError (row 1 read as
    zero) on a feasible problem."""
    inst = _mt_instance([(1.0, 0.0), (0.0, 2.0**-300)], [(1.0, 0.0), (0.0, 2.0**-300)])
    _exact_least_norm(inst, [(0, 0, 1, "≥", 1), (1, 0, 1, "≥", 1)], np.diag([1.0, 2.0**600]), binding=[0, 1])
    with pytest.raises(SolverError, match="direction SVM W_dir could not be certified: .* 600 binades apart"):
        MT.predict_multitoken(inst, np.diag([10.0, 10.0 * 2.0**600]))


# ============ ℓp-SVM rows far apart in size (Clarabel's false infeasibility; solve_lp_svm re-poses equilibrated)
# x_00 = (2^-k, 0), x_10 = (2^k, 2^k), the other tokens 0, z_i = (1, 1), α = (0, 0): the rows z_i ⊗ x_i0 are 2^2k
# apart. Row 0 asks W_00 + W_01 ≥ 2^k, row 1 (W_00 + W_01 + W_10 + W_11) ≥ 2^-k. Hölder (|W_00| + |W_01| ≤
# 2^{1/q}·||(W_00, W_01)||_p) bounds every feasible norm below by 2^k/2^{1/q} = 2^{k−1}·2^{1/p}, which
# W* = 2^{k−1}·(e_0e_0ᵀ + e_0e_1ᵀ) attains while meeting row 1 with margin 2^2k: the ℓp optimum for every p, with
# one multiplier μ_0 = 2^k·(2^{k−1})^{p−1} (∇ψ(W*) = μ_0·a_0, a_0 = 2^-k on the entries W_00, W_01).
# Clarabel called it infeasible from 2^40 apart on (tolerance, not underflow).

#: Polished, ``W`` and ``μ`` are the Newton solution of the active KKT equations to NEWTON_TOL = 1e-13 (module
#: docstring of attnsvm.peers._mirror); 1e-13 relative covers the put-back's single rounding.
LP_POLISHED_RTOL = 1e-13
#: Unpolished (p > 2 here: a column of W the active set leaves untouched stops the polish), the conic answer is
#: certified by its Hölder gap, documented ≲ 1e-8 when the multipliers are within a few decades (one here).
LP_CONIC_GAP = 1e-8


def _lp_far(k: int, *, twin: bool = False) -> A.Instance:
    """The far-apart ℓp instance above; ``twin``: token 1 of sequence 0 equal to the selected token 0."""
    inst = _two_sequences((2.0**-k, 0.0), (2.0**k, 2.0**k))
    if not twin:
        return inst
    X = np.array(inst.X)
    X[0, 1] = X[0, 0]
    return A.Instance(X, inst.Y, inst.v, inst.z)


def _lp_exact_feasible(inst: A.Instance, alpha: list[int], W: np.ndarray) -> None:
    """``(x_iα_i − x_it)ᵀ W z_i ≥ 1`` for every ``t ≠ α_i``, in exact rationals from the doubles."""
    X, Z, Wf = (
        [[[Fraction(v) for v in tok] for tok in seq] for seq in inst.X.tolist()],
        [[Fraction(v) for v in q] for q in inst.z.tolist()],
        [[Fraction(v) for v in row] for row in np.asarray(W).tolist()],
    )
    d = inst.d
    for i, a in enumerate(alpha):
        for t in range(inst.T):
            if t != a:
                delta = [X[i][a][j] - X[i][t][j] for j in range(d)]
                m = sum((delta[j] * Wf[j][k] * Z[i][k] for j in range(d) for k in range(d)), Fraction(0))
                assert m >= 1, (i, t, m)


@pytest.mark.parametrize("k", [20, 300])
@pytest.mark.parametrize("p", [1.5, 2.0, 3.0])
def test_lp_svm_rows_far_apart_are_solved_not_called_infeasible(k, p):
    """Was: InfeasibleSVMError (Clarabel's verdict on the shared-exponent rows) from rows 2^40 apart. Now decided
    exactly (certified ℓ2 solve on per-row mantissas: feasible) and solved on equilibrated rows. Oracle: the
    hand-derived optimum above (Hölder lower bound attained, checked feasible in exact rationals; the value
    2^{k−1}·2^{1/p} in mpmath). p ≤ 2: polished, ``W`` and ``μ`` to LP_POLISHED_RTOL; p = 3: the conic answer,
    feasible in exact rationals, its certified gap honest against the exact optimum and ≤ LP_CONIC_GAP."""
    import mpmath

    inst = _lp_far(k)
    W_opt = np.array([[2.0 ** (k - 1), 2.0 ** (k - 1)], [0.0, 0.0]])
    _lp_exact_feasible(inst, [0, 0], W_opt)
    with mpmath.workdps(50):
        opt = mpmath.mpf(2) ** (k - 1) * mpmath.mpf(2) ** (mpmath.mpf(1) / p)
        mu0 = float(mpmath.mpf(2) ** k * mpmath.mpf(2) ** ((k - 1) * (mpmath.mpf(p) - 1)))
    sol = M.solve_lp_svm(inst, p, [0, 0])
    _lp_exact_feasible(inst, [0, 0], sol.W)
    assert sol.min_margin >= 1.0 and sol.support == [(0, 1)]
    assert float((mpmath.mpf(sol.objective) - opt) / sol.objective) <= sol.gap + LP_POLISHED_RTOL
    if p <= 2.0:
        assert sol.polished
        assert rel(sol.W, W_opt) <= LP_POLISHED_RTOL
        assert sol.objective == pytest.approx(float(opt), rel=LP_POLISHED_RTOL)
        assert sol.duals[0] == pytest.approx(mu0, rel=LP_POLISHED_RTOL) and sol.duals[1] == 0.0
    else:
        assert sol.gap <= LP_CONIC_GAP


def test_lp_svm_rows_beyond_float64_apart_are_refused_as_a_solver_failure_not_infeasible():
    """Rows 2^1100 apart (k = 550): feasible (W* above, exact rationals), but the equilibrated rows 2^{R_r−R₀}·rows_r
    leave float64: SolverError naming the spread (1100 binades: frexp exponents −549 and 551) and the remedy, not a
    false InfeasibleSVMError."""
    inst = _lp_far(550)
    _lp_exact_feasible(inst, [0, 0], np.array([[2.0**549, 2.0**549], [0.0, 0.0]]))
    for p in (1.5, 3.0):
        with pytest.raises(
            SolverError, match=r"infeasible for alpha = \[0, 0\], but it is feasible .* 1100 binades"
        ):
            M.solve_lp_svm(inst, p, [0, 0])


def test_lp_svm_far_apart_rows_truly_infeasible_stay_infeasible():
    """The same far-apart rows plus token 1 of sequence 0 equal to its selected token: that row is exactly zero,
    so its margin is 0 < 1 for every W (exact). The exact feasibility check confirms Clarabel: InfeasibleSVMError
    with the documented message."""
    inst = _lp_far(20, twin=True)
    assert np.array_equal(inst.X[0, 0], inst.X[0, 1])
    for p in (1.5, 3.0):
        with pytest.raises(
            A.InfeasibleSVMError, match=r"ℓp-Att-SVM \(p = .*\) is infeasible for alpha = \[0, 0\]"
        ):
            M.solve_lp_svm(inst, p, [0, 0])


def test_mirror_record_tokens_of_a_sequence_2_to_1200_below_the_other():
    """Sequence 1 (tokens 2^-600·e_0, 2^-600·e_1, query 2^-600·e_0) has logits (2^-1200·W_00, 2^-1200·W_10): with
    ``W_0 = e_1e_0ᵀ`` token 1 wins (exact: 2^-1200 > 0), as in sequence 0 (tokens e_0, e_1, query e_0: logits
    (0, 1)). The recorded tokens used one mantissa for all sequences, flushed sequence 1's logits to 0 and
    recorded token 0; each sequence now has its own."""
    X = np.zeros((2, 2, 2))
    X[0, 0], X[0, 1] = (1.0, 0.0), (0.0, 1.0)
    X[1, 0], X[1, 1] = (2.0**-600, 0.0), (0.0, 2.0**-600)
    inst = A.Instance(X, np.ones(2), np.array([1.0, 0.0]), np.array([[1.0, 0.0], [2.0**-600, 0.0]]))
    W0 = np.array([[0.0, 0.0], [1.0, 0.0]])
    # the logits in exact rationals: x_itᵀ W_0 z_i
    Fz = [[Fraction(v) for v in q] for q in inst.z.tolist()]
    for i in range(2):
        lg = [
            sum(Fraction(X[i, t, a]) * Fraction(W0[a, b]) * Fz[i][b] for a in range(2) for b in range(2))
            for t in range(2)
        ]
        assert lg[1] > lg[0]
    tr = M.run_mirror_descent(inst, 2.0, 1, 0.1, W0=W0, record_at=[0])
    assert tr.record[0].tokens.tolist() == [1, 1]


def test_lp_svm_clarabel_failure_on_rows_far_apart_is_retried_equilibrated(monkeypatch):
    """Fault injection: Clarabel raising on the first (shared-exponent) solve of the rows 2^40 apart (measured
    failures there: ``user_limit`` at 2^28, "infeasible" from 2^40). The rows' spread (40 binades) is past
    LP_RETRY_SPREAD_BITS, so the problem is re-posed on equilibrated rows and solved: the hand-derived optimum
    ``W* = 2^19·(e_0e_0ᵀ + e_0e_1ᵀ)`` (above; polished for p = 2). On ordinary data a failure keeps Clarabel's
    message (tests/test_mirror.py::test_solver_failures_are_named)."""
    import cvxpy as cp

    assert M.LP_RETRY_SPREAD_BITS <= 40
    real = cp.Problem.solve
    calls = []

    def first_fails(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise cp.error.SolverError("injected")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cp.Problem, "solve", first_fails)
    sol = M.solve_lp_svm(_lp_far(20), 2.0, [0, 0])
    assert len(calls) == 2 and sol.polished
    assert rel(sol.W, np.array([[2.0**19, 2.0**19], [0.0, 0.0]])) <= LP_POLISHED_RTOL
