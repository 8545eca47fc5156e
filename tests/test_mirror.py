"""ℓp mirror descent: mirror map, Bregman metric, ℓp-SVM certificate (vs the Frobenius SVM at p = 2), runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import attnsvm as A
from attnsvm.errors import AttnSVMError, InfeasibleSVMError, NumericalError
from attnsvm.gd import direction_gap, run_gd
from attnsvm.peer_strategies import p_norms
from attnsvm.peers import _mirror as M
from attnsvm.peers._toys import LP_TOY_P, lp_toy
from attnsvm.svm import solve_svm

EPS = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def inst() -> A.Instance:
    return A.random_instance(3, 4, 5, seed=6, family="unit")


# ------------------------------------------------------------------------ the map
@pytest.mark.parametrize("p", [1.25, 1.75, 2.0, 3.0, 7.0])
def test_mirror_map_inverse_roundtrip(p):
    W = np.random.default_rng(0).standard_normal((4, 4)) * 3
    back = M.inverse_mirror_map(M.mirror_map(W, p), p)
    # two powers, each with relative error ≤ ~(1 + p·|log|W||)·eps; 64 eps covers |W| ≤ 10
    assert np.max(np.abs(back - W) / np.abs(W)) <= 64 * EPS


def test_mirror_map_is_gradient_of_potential():
    p = 1.75
    W = np.random.default_rng(1).standard_normal((3, 3))
    h = 1e-6
    psi = lambda M_: np.sum(np.abs(M_) ** p) / p  # noqa: E731
    fd = np.zeros_like(W)
    for j in range(3):
        for k in range(3):
            E = np.zeros_like(W)
            E[j, k] = h
            fd[j, k] = (psi(W + E) - psi(W - E)) / (2 * h)
    assert np.max(np.abs(fd - M.mirror_map(W, p))) <= 1e-8  # central differences, h = 1e-6


def test_bregman_is_one_minus_cos_for_p2():
    a, b = np.random.default_rng(2).standard_normal((2, 4, 4))
    assert abs(M.bregman_divergence(a, b, 2.0) - direction_gap(a, b)) <= 8 * EPS


@pytest.mark.parametrize("p", [1.5, 3.0])
def test_bregman_formula_and_properties(p):
    a, b = np.random.default_rng(3).standard_normal((2, 3, 3))
    an, bn = a / M.lp_norm(a, p), b / M.lp_norm(b, p)
    issue = 1 / p + (p - 1) / p - np.sum(np.sign(bn) * np.abs(bn) ** (p - 1) * an)  # the issue's formula
    D = M.bregman_divergence(a, b, p)
    assert abs(D - issue) <= 16 * EPS and D > 0
    assert M.bregman_divergence(a, 5 * a, p) <= 16 * EPS  # scale-invariant, zero on equal directions


def test_lp_norm_no_overflow():
    W = np.full((2, 2), 1e300)
    assert np.isclose(M.lp_norm(W, 3.0), 1e300 * 4 ** (1 / 3), rtol=4 * EPS, atol=0)


# -------------------------------------------------------------------------- ℓp-SVM
def test_lp_svm_p2_equals_certified_frobenius(inst):
    lp = M.solve_lp_svm(inst, 2.0)
    fro = solve_svm(inst)
    assert lp.polished
    # both solutions certified to ≤ 1e-9 relative (the Newton polish solves the same active-set
    # equations as the exact Frobenius solver)
    assert np.max(np.abs(lp.W - fro.W)) <= 1e-9 * np.max(np.abs(fro.W))


@pytest.mark.parametrize("p", [1.5, 1.75, 3.0])
def test_lp_svm_certificate(inst, p):
    sol = M.solve_lp_svm(inst, p)
    assert sol.status == "optimal" and sol.polished
    # Hölder lower bound 1ᵀμ/||Aᵀμ||_q ≤ optimum ≤ objective: relative gap ≤ 1e-9 after polishing
    assert -1e-14 <= sol.gap <= 1e-9  # rounding can make the float gap a few eps negative
    assert sol.min_margin >= 1 - 1e-13  # feasible up to rounding of the rescaled margins
    # KKT: ∇ψ(W) = Aᵀμ with μ ≥ 0 supported on the active constraints
    A_ = A.svm_rows(inst, sol.alpha)
    vecW = sol.W.reshape(-1, order="F")
    grad_psi = np.sign(vecW) * np.abs(vecW) ** (p - 1)
    assert np.max(np.abs(grad_psi - A_.T @ sol.duals)) <= 1e-10 * np.max(np.abs(grad_psi))
    assert np.all(sol.duals >= 0)
    act = {tuple(x) for x in sol.support}
    for r, (i, t) in enumerate(A.svm_constraints(inst, sol.alpha).pairs):
        if sol.duals[r] > 0:
            assert (int(i), int(t)) in act


def test_lp_svm_differs_from_frobenius_for_p_not_2(inst):
    fro = solve_svm(inst).W
    for p in (1.5, 3.0):
        W = M.solve_lp_svm(inst, p).W
        assert direction_gap(W, fro) > 1e-4
        # and it is ℓp-smaller than the rescaled Frobenius solution (which is feasible)
        assert M.lp_norm(W, p) < M.lp_norm(fro, p)


# -------------------------------------------------------------------- mirror descent
def test_p2_mirror_descent_is_normalized_gd(inst):
    md = M.run_mirror_descent(inst, 2.0, 50, 0.1, record_at=[50])
    gd = run_gd(inst, 50, 0.1, record_at=[50])
    assert np.max(np.abs(md.W - gd.W)) <= 1e-12 * np.max(np.abs(gd.W))


def test_mirror_step_by_hand(inst):
    p, q, lr = 3.0, 1.5, 0.2
    W0 = 0.3 * np.random.default_rng(4).standard_normal((5, 5))
    md = M.run_mirror_descent(inst, p, 1, lr, W0=W0, record_at=[1])
    g = A.risk_grad(inst, W0)
    U = np.sign(W0) * np.abs(W0) ** (p - 1) - lr * g / np.sum(np.abs(g) ** q) ** (1 / q)
    expect = np.sign(U) * np.abs(U) ** (1 / (p - 1))
    assert np.max(np.abs(md.W - expect)) <= 1e-13


#: Bregman divergence to the ℓp-SVM of the final tokens after 2000 normalized steps, lr 0.1,
#: measured on lp_toy(0): 2.0e-4 (p = 1.75), 1.1e-3 (p = 2), 1.6e-2 (p = 3); to the *other* p'
#: ≥ 5e-3. Asserted: the matching p' is the closest, and D falls ≥ 10× from step 100 to 2000.
def test_lp_runs_converge_to_their_own_svm():
    inst = lp_toy(seed=0)
    for p in LP_TOY_P:
        tr = M.run_mirror_descent(inst, p, 2000, 0.1, record_at=[100, 2000], keep_iterates=True)
        a = tr.final_tokens
        sols = {pp: M.solve_lp_svm(inst, pp, a).W for pp in LP_TOY_P}
        D = {pp: M.bregman_divergence(sols[pp], tr.W, p) for pp in LP_TOY_P}
        assert min(D, key=D.get) == p
        W100 = tr.record[0].W
        assert D[p] * 10 <= M.bregman_divergence(sols[p], W100, p)


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("bad", [1.0, 0.5, -2.0, float("nan"), float("inf"), "two", True])
def test_bad_p_norm(inst, bad):
    with pytest.raises(AttnSVMError, match="p_norm"):
        M.run_mirror_descent(inst, bad, 1, 0.1)
    with pytest.raises(AttnSVMError, match="p_norm"):
        M.solve_lp_svm(inst, bad)
    with pytest.raises(AttnSVMError, match="p_norm"):
        M.mirror_map(np.ones((2, 2)), bad)


def test_other_bad_input(inst):
    W0 = np.ones((5, 5))
    keep = W0.copy()
    with pytest.raises(AttnSVMError, match="steps"):
        M.run_mirror_descent(inst, 2.0, 0, 0.1)
    with pytest.raises(AttnSVMError, match="W0 must have shape"):
        M.run_mirror_descent(inst, 2.0, 1, 0.1, W0=np.ones((2, 2)))
    with pytest.raises(AttnSVMError, match="same shape"):
        M.bregman_divergence(np.ones(3), np.ones(4), 2.0)
    with pytest.raises(AttnSVMError, match="zero"):
        M.bregman_divergence(np.zeros(3), np.ones(3), 2.0)
    M.run_mirror_descent(inst, 3.0, 2, 0.1, W0=W0)
    assert np.array_equal(W0, keep)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(p=p_norms())
def test_property_mirror_roundtrip_and_bregman_nonnegative(p):
    rng = np.random.default_rng(0)
    W = rng.standard_normal((3, 3))
    back = M.inverse_mirror_map(M.mirror_map(W, p), p)
    # exponents up to 1/(p−1) = 10: relative error ≤ ~(2 + 10·|log|W||)·eps; 256 eps for |W| ∈ [1e-3, 10]
    assert np.max(np.abs(back - W) / np.abs(W)) <= 256 * EPS
    a, b = rng.standard_normal((2, 3, 3))
    assert M.bregman_divergence(a, b, p) >= 0
    assert M.bregman_divergence(a, a, p) <= 16 * EPS


def test_infeasible_lp_svm_raises(inst):
    X = np.array(inst.X)
    X[0, 1] = X[0, 0]  # a token equal to the selected one: its margin is 0 for every W
    bad = A.Instance(X, inst.Y, inst.v, inst.z)
    with pytest.raises(InfeasibleSVMError, match="infeasible"):
        M.solve_lp_svm(bad, 1.5, alpha=[0] * inst.n)


# ------------------------------------------------------------- documented messages (exact wording)
#: The scale contract's range as every refusal names it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
P_RULE = (
    "p_norm must be a finite number > 1 (ψ = (1/p)Σ|W_ij|^p needs p > 1 for an invertible mirror map); got "
)


def test_bad_input_messages_are_exact(inst):
    """The messages are part of the contract: the argument, the rule and the value received."""
    cases = [
        (lambda: M.check_p_norm("a"), "p_norm must be a real number > 1; got 'a'"),
        (lambda: M.check_p_norm(None), "p_norm must be a real number > 1; got None"),
        (lambda: M.check_p_norm(1.0), P_RULE + "1.0"),
        (lambda: M.check_p_norm(True), P_RULE + "True"),
        (lambda: M.check_p_norm(float("inf")), P_RULE + "inf"),
        (lambda: M.check_p_norm(float("nan")), P_RULE + "nan"),
        (
            lambda: M.bregman_divergence(np.ones(3), np.ones(4), 2.0),
            "reference and W must have the same shape; got (3,) and (4,)",
        ),
        (
            lambda: M.bregman_divergence(np.zeros(3), np.ones(3), 2.0),
            "reference is zero; it has no direction",
        ),
        (lambda: M.bregman_divergence(np.ones(3), np.zeros(3), 2.0), "W is zero; it has no direction"),
        (
            lambda: M.run_mirror_descent(inst, 2.0, 1, 0.1, reference=np.zeros((5, 5))),
            "reference is the zero matrix; it has no direction",
        ),
    ]
    for call, message in cases:
        with pytest.raises(AttnSVMError) as exc:
            call()
        assert str(exc.value) == message


def test_p_norm_just_above_one_is_accepted():
    """Boundary of the documented ``p > 1``: the next double above 1 is valid; q = p/(p − 1) by hand."""
    p = float(np.nextafter(1.0, 2.0))
    assert M.check_p_norm(p) == p
    assert M.dual_exponent(3.0) == 1.5 and M.dual_exponent(2.0) == 2.0


def test_range_refusals_name_the_quantity():
    """Oracle: the size of the image, hand-computed: |1e300|^2 = 1e600 (p = 3), |1e−300|^2 = 1e−600,
    |1e300|^{1/(p−1)} = 1e600 (p = 1.5), ||(1.7e308, 1.7e308)||_1.5 = 2^{2/3}·1.7e308 ≈ 2.7e308,
    ||(1e−310)||_p = 1e−310 (subnormal)."""
    cases = [
        (
            lambda: M.mirror_map(np.array([1e300]), 3.0),
            "an entry of the mirror map ∇ψ(W) = sign(W)|W|^(p−1)",
            "1e+600: it overflows",
        ),
        (
            lambda: M.mirror_map(np.array([1e-300, 1.0]), 3.0),
            "an entry of the mirror map ∇ψ(W) = sign(W)|W|^(p−1)",
            "1e-600: it underflows",
        ),
        (
            lambda: M.inverse_mirror_map(np.array([1e300]), 1.5),
            "an entry of the inverse mirror map sign(U)|U|^(1/(p−1))",
            "1e+600: it overflows",
        ),
        (lambda: M.lp_norm(np.array([1.7e308, 1.7e308]), 1.5), "the ℓp norm ||W||_p", "1e+308: it overflows"),
        (lambda: M.lp_norm(np.array([1e-310]), 1.5), "the ℓp norm ||W||_p", "1e-310: it underflows"),
    ]
    for call, what, size in cases:
        with pytest.raises(NumericalError) as exc:
            call()
        assert str(exc.value) == f"{what} is about {size} {RANGE_TEXT}"
    assert M.lp_norm(np.zeros(3), 1.5) == 0.0  # zero is exact, not a refusal


def test_solver_failures_are_named(inst, monkeypatch):
    """Fault injection (cvxpy's Problem.solve raising, or reporting a non-optimal status): the
    documented errors, with the exponent, the status and the selected tokens in the message."""
    import cvxpy as cp

    from attnsvm.errors import SolverError

    alpha = M.solve_lp_svm(inst, 3.0).alpha.tolist()

    def boom(self, *args, **kwargs):
        raise cp.error.SolverError("boom")

    with monkeypatch.context() as m:
        m.setattr(cp.Problem, "solve", boom)
        with pytest.raises(SolverError) as exc:
            M.solve_lp_svm(inst, 3.0)
        assert str(exc.value) == "Clarabel failed on the ℓp-SVM (p = 3.0): boom"
    X = np.array(inst.X)
    X[0, 1] = X[0, 0]  # a token equal to the selected one (α_0 = 0): margin 0 for every W (infeasible)
    bad = A.Instance(X, inst.Y, inst.v, inst.z)
    for status in ("infeasible", "infeasible_inaccurate"):
        with monkeypatch.context() as m:
            m.setattr(cp.Problem, "status", property(lambda self, s=status: s))
            # An infeasibility verdict is decided exactly (certified ℓ2 solve of the same rows): on the
            # infeasible instance it stands, with the documented message ...
            with pytest.raises(InfeasibleSVMError) as exc:
                M.solve_lp_svm(bad, 3.0, alpha=[0] * inst.n)
            assert str(exc.value) == (
                f"the ℓp-Att-SVM (p = 3.0) is infeasible for alpha = {[0] * inst.n}: no W separates the selected "
                "tokens with margin 1 (check for a token equal to the selected one or a zero query)"
            )
            # ... on the feasible one (solved above) it is the conic solver's failure, a SolverError.
            with pytest.raises(SolverError) as exc2:
                M.solve_lp_svm(inst, 3.0)
            assert str(exc2.value).startswith(
                f"Clarabel called the ℓp-Att-SVM (p = 3.0) infeasible for alpha = {alpha}, but it is feasible"
            )
    for status in ("optimal_inaccurate", "unbounded"):
        with monkeypatch.context() as m:
            m.setattr(cp.Problem, "status", property(lambda self, s=status: s))
            with pytest.raises(SolverError) as exc:
                M.solve_lp_svm(inst, 3.0)
            assert str(exc.value) == (
                f"Clarabel returned status {status!r} on the ℓp-SVM (p = 3.0); the solution is not certified"
            )


def test_record_refuses_an_unrepresentable_norm_by_name():
    """Oracle: ||W0||_2 = 2·1e308 for a 2×2 matrix of 1e308 (hand-computed); tokens 2^−10 keep the
    logits finite, and equal values vᵀx_it = 2^−10 make ∇L exactly 0 (hand-derived: the record's
    gradient norm is the legitimate −inf), so the record at step 0 names the ℓp norm and the step."""
    X = np.array([[[2.0**-10, 0.0], [0.0, 2.0**-10]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 1.0]), np.ones((1, 2)))
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(inst, 2.0, 1, 0.1, W0=np.full((2, 2), 1e308), record_at=[0])
    assert (
        str(exc.value)
        == f"mirror descent, record at step 0: the ℓp norm ||W||_p is about 1e+308: it overflows {RANGE_TEXT}"
    )


def test_record_names_the_logit_scale_and_the_step():
    """Oracle: hand-computed size. Unit tokens and queries (mantissa exponents 1 each) and W0 = 1e308:
    the logit scale max|W|·2^(1+1) = 4e308 ≈ 10^308.6 overflows; the refusal of the record at step 0
    carries the "record at step t" prefix of the other record refusals."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2)))
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(inst, 2.0, 1, 0.1, W0=np.full((2, 2), 1e308), record_at=[0])
    assert str(exc.value) == (
        "mirror descent, record at step 0: the logit scale max|W|·max|x|·max|z| is about 1e+309: it "
        f"overflows {RANGE_TEXT}. Scale W or the data down; the attention logits would overflow"
    )


def test_record_gradient_norm_is_minus_inf_only_when_stationary():
    """Oracle: hand-derived. Equal values (v = (1, 1)) give ∇L = 0 exactly: −inf is recorded. With
    v = (1, 0) the values differ, so ∇L ≠ 0 at W0 = 1e308 (tokens 2^−10); the core refuses it there
    (ℓ' undetermined) and the record refuses naming the step, where it used to record −inf."""
    X = np.array([[[2.0**-10, 0.0], [0.0, 2.0**-10]]])
    zero = A.Instance(X, np.array([1.0]), np.array([1.0, 1.0]), np.ones((1, 2)))
    tr = M.run_mirror_descent(zero, 2.0, 1, 0.1, normalized=False, record_at=[0, 1])
    assert [r.log10_grad_norm for r in tr.record] == [-np.inf, -np.inf]
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2)))
    with pytest.raises(NumericalError) as exc:
        M.run_mirror_descent(inst, 2.0, 1, 0.1, W0=np.full((2, 2), 1e308), record_at=[0])
    assert str(exc.value).startswith("mirror descent, record at step 0: the output f_0 ")
