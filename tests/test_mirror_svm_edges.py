"""`attnsvm.peers._mirror` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.peers._mirror` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).

The ℓp-SVM instances here are built so that the optimum has a closed form. With queries ``z_i = e_i``
(or one input), the rows ``(x_iα − x_it) ⊗ z_i`` of different inputs touch disjoint columns of ``W``,
so ``min ||W||_p`` splits into one problem per column; a column with one constraint ``Δᵀw ≥ 1`` has
(Hölder, equality case)

    w* = sign(Δ)|Δ|^{q−1} / ||Δ||_q^q,   ||w*||_p = 1/||Δ||_q,   μ = 1/||Δ||_q^p

(``∇ψ(w*) = μΔ``, using ``(q−1)(p−1) = 1`` and ``q(p−1) = p``), and the whole optimum is
``||W*||_p = (Σ_k ||Δ_k||_q^{−p})^{1/p}``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError, SolverError
from attnsvm.peers import _mirror as M

#: Every test here takes < 2 s; a hang (a line search that never ends) must fail, not stall the suite.
pytestmark = pytest.mark.timeout(60)

#: The scale contract's range as every refusal names it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"

#: Polished answers solve the active-set KKT equations to NEWTON_TOL = 1e-13 in the residual; the
#: map from residual to W has condition O(1) on these instances (one row per column, entries O(1)), so
#: W, μ and the objective agree with the closed form to ~1e-13; 1e-12 leaves a decade for rounding.
POLISHED_RTOL = 1e-12
#: An unpolished answer is Clarabel's (default tolerances ~1e-8 on gap and feasibility). The objective
#: is flat to first order at the optimum, so W is less accurate than the objective: measured at p = 3 on
#: the instances below, W 1.1e-7 relative, objective, bound and μ ~1e-9. 1e-6 bounds W; 1e-7 the rest.
CONIC_W_RTOL = 1e-6
CONIC_RTOL = 1e-7
#: Newton stops at |μ² − 1| ≤ NEWTON_TOL on the scalar system μ² = 1 (the root μ = 1), so
#: |μ − 1| ≤ NEWTON_TOL/2 and w = μ² is within NEWTON_TOL of 1, plus a few roundings (4 eps).
NEWTON_ROOT_TOL = M.NEWTON_TOL + 4 * np.finfo(np.float64).eps
#: The float gap (obj − lb)/obj of a (numerically) exact answer is rounding: obj and lb are each
#: within ~2 ulps (lp_norm's bound for N ≤ 4 entries), so |gap| ≤ 4 eps when the true gap is 0
#: (measured −1.8e-16 for the conic answer at p = 1.5 on ZERO_COLUMN, mpmath exact gap 6e-18).
GAP_ROUNDING = 4 * np.finfo(np.float64).eps


# ------------------------------------------------------------------------------ instances
def _instance(deltas: list[list[list[float]]], queries: list[list[float]]) -> A.Instance:
    """Input ``i`` selects token 0 = the zero vector and has tokens ``x_it = −Δ_it`` (t ≥ 1), so its
    constraint rows are ``Δ_it ⊗ z_i`` with ``α = 0``."""
    n, d = len(queries), len(queries[0])
    T = 1 + max(len(rows) for rows in deltas)
    X = np.zeros((n, T, d))
    for i, rows in enumerate(deltas):
        for t, row in enumerate(rows):
            X[i, t + 1] = -np.asarray(row, dtype=np.float64)
    return A.Instance(X, np.ones(n), np.ones(d), np.array(queries, dtype=np.float64))


def _one_row(delta: list[float], p: float) -> tuple[np.ndarray, float, float]:
    """The closed form of ``min ||w||_p s.t. Δᵀw ≥ 1``: ``(w*, ||w*||_p, μ)``."""
    q = p / (p - 1.0)
    dl = np.asarray(delta, dtype=np.float64)
    nq = float(np.sum(np.abs(dl) ** q)) ** (1.0 / q)
    return np.sign(dl) * np.abs(dl) ** (q - 1.0) / nq**q, 1.0 / nq, 1.0 / nq**p


def _rel(a: np.ndarray | float, b: np.ndarray | float) -> float:
    a_, b_ = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a_ - b_)) / np.max(np.abs(b_)))


#: One input, d = 2, query e_1: W's second column touches no constraint, so W*[:, 1] = 0 exactly and
#: for p > 2 (q − 1 < 1) the inverse map is not differentiable there: the Newton polish cannot run
#: and the answer is the conic solver's, rescaled (``polished = False``, documented fallback).
DELTA = [0.75, -0.5]
ZERO_COLUMN = _instance([[DELTA]], [[1.0, 0.0]])


@contextlib.contextmanager
def _conic_answer(
    monkeypatch: pytest.MonkeyPatch,
    *,
    value: Callable[[np.ndarray], np.ndarray] | None = None,
    duals: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Iterator[None]:
    """Fault injection: Clarabel solves as usual, then its primal ``w`` and/or the constraint's dual
    are replaced (status stays ``optimal``), to reach the branches a healthy solve does not."""
    import cvxpy as cp

    real = cp.Problem.solve

    def tampered(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(self, *args, **kwargs)
        (w,) = self.variables()
        if value is not None:
            w.value = value(np.array(w.value))
        if duals is not None:
            con = self.constraints[0]
            con.dual_variables[0].value = duals(np.array(con.dual_value))
        return out

    with monkeypatch.context() as m:
        m.setattr(cp.Problem, "solve", tampered)
        yield


def _solver_scale(w_solver: np.ndarray, W_true: np.ndarray) -> float:
    """The power of two between the solver's variable and ``vec(W)`` (the solver works on a
    power-of-two mantissa of the rows; nearest power of two of the ratio of the largest entries)."""
    k = int(np.argmax(np.abs(W_true.reshape(-1, order="F"))))
    return 2.0 ** round(math.log2(w_solver[k] / W_true.reshape(-1, order="F")[k]))


# ------------------------------------------------------------ the Newton solver, far from the root
@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("p", "mu0"), [(1.5, 2.0**-20), (1.5, 2.0**80), (1.1, 2.0**-20), (1.1, 2.0**20), (8.0, 2.0**60)]
)
def test_newton_reaches_a_one_row_root_in_one_step_from_any_start(p, mu0):
    """One row a = 1: the margin is g = μ^{q−1}, and Newton runs on h(g) = g^{p−1} = μ, linear in μ,
    so a single step from any μ₀ > 0 lands on the root μ = 1 (w = 1), however many binades off (plain
    Newton on g − 1 needs ~log₂μ₀ steps from above at p = 1.5, ~7·log₂μ₀ at p = 1.1). Oracle: the
    root μ = 1 (hand); the budget ``max_iter`` counts steps: 0 steps leave μ₀, 1 step suffices."""
    res = M._newton_active(np.array([[1.0]]), p, np.array([mu0]), max_iter=1)
    assert res is not None
    mu, w = res
    assert abs(mu[0] - 1.0) <= NEWTON_ROOT_TOL and abs(w[0] - 1.0) <= NEWTON_ROOT_TOL
    assert M._newton_active(np.array([[1.0]]), p, np.array([mu0]), max_iter=0) is None


def test_newton_with_no_budget_accepts_a_root_start():
    """``max_iter = 0``: the start is checked before any step, so the root itself is returned (oracle:
    μ = 1 solves a = 1 at any p, w = 1)."""
    res = M._newton_active(np.array([[1.0]]), 3.0, np.array([1.0]), max_iter=0)
    assert res is not None and res[0][0] == 1.0 and res[1][0] == 1.0


# ------------------------------------------------------------------------- lp_norm input
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            [1.0, float("nan")],
            "W must be finite; found nan at index (1,). Remove or impute NaN/Inf entries first.",
        ),
        (["a"], "W must hold real numbers (int or float); got dtype <U1"),
    ],
)
def test_lp_norm_names_its_argument(bad, message):
    """Oracle: the documented message of a bad array, naming the argument ``W``."""
    with pytest.raises(AttnSVMError) as exc:
        M.lp_norm(bad, 2.0)
    assert str(exc.value) == message


# ----------------------------------------------------------------- lp_norm: any p, any scale
#: lp_norm's bound (its docstring): relative error ≲ (3 + log₂N/(2p))·eps to first order (ratios
#: ε/2 each, their powers pε/2 + an ulp, the p-th root divides the sum's error by p, then one root and
#: one product); N ≤ 4 entries here, so ≤ 4 eps + a margin of 2 for second-order terms: 6 eps.
LP_NORM_RTOL = 6 * np.finfo(np.float64).eps

LP_NORM_CASES = [
    [1.0],
    [3.0, 1.0],
    [3.0, -3.0],  # a tie: the norm is 3·2^{1/p}, visible at every p
    [0.75, -0.5, 0.25, 1e-3],
    [2.0**-1074, 2.0**-1073, 3 * 2.0**-1074],  # all subnormal
    [2.0**-1021, -(2.0**-1022)],  # near the normal range's end
    [1.7e308, -1e308],  # the top of the range
]


@pytest.mark.parametrize("p", [2.0, 3.0, 100.0, 1100.0, 5000.0])
@pytest.mark.parametrize("W", LP_NORM_CASES)
def test_lp_norm_matches_mpmath_at_any_p(W, p):
    """``||W||_p`` for p up to 5000, including the regression cases ``lp_norm([1], 1100) = 1`` and
    ``lp_norm([3, 1], 5000) = 3`` (once a silent 0: the largest term |m|^p of the mantissa underflowed).
    Oracle: mpmath at 60 digits; the norm is returned when it is a normal double, else the contract's
    underflow refusal (all-subnormal data at small p)."""
    with mpmath.workdps(60):
        exact = mpmath.power(mpmath.fsum(mpmath.power(abs(mpmath.mpf(x)), p) for x in W), 1 / mpmath.mpf(p))
        normal = mpmath.mpf(np.finfo(np.float64).tiny) <= exact <= mpmath.mpf(np.finfo(np.float64).max)
        if not normal:
            with pytest.raises(NumericalError) as exc:
                M.lp_norm(np.array(W), p)
            assert str(exc.value).startswith("the ℓp norm ||W||_p is about ")
            return
        got = M.lp_norm(np.array(W), p)
        assert abs(mpmath.mpf(got) - exact) <= LP_NORM_RTOL * exact


def test_lp_norm_of_all_subnormal_entries_can_be_normal():
    """4096 entries of 2^−1030 (subnormal) at p = 1.2: the norm 2^−1030·4096^{1/1.2} = 2^−1020 is a
    normal double and is returned, to lp_norm's accuracy. Oracle: the closed form (exact power of 2)."""
    W = np.full(4096, 2.0**-1030)
    assert abs(M.lp_norm(W, 1.2) - 2.0**-1020) <= 8 * np.finfo(np.float64).eps * 2.0**-1020


# ------------------------------------------------------------- ℓp-SVM: closed-form instances
@pytest.mark.parametrize("scale", [(0, 0), (40, -10), (-300, 200)])
def test_unpolished_lp_svm_matches_the_closed_form(scale):
    """p = 3 with an untouched column of W: the polish is refused (``polished = False``) and the
    rescaled conic answer is returned with its certificate. Oracle: the closed form of the one-row
    problem (module docstring), and scale equivariance W_p(2^a X, 2^b z) = 2^−(a+b) W_p,
    μ(2^a X, 2^b z) = 2^−p(a+b) μ, applied to it exactly."""
    p, (a, b) = 3.0, scale
    inst = A.Instance(np.ldexp(ZERO_COLUMN.X, a), ZERO_COLUMN.Y, ZERO_COLUMN.v, np.ldexp(ZERO_COLUMN.z, b))
    w, opt, mu = _one_row(DELTA, p)
    W = np.zeros((2, 2))
    W[:, 0] = w
    s = M.solve_lp_svm(inst, p, alpha=[0])
    assert s.polished is False and s.status == "optimal" and s.p_norm == p
    assert _rel(s.W, np.ldexp(W, -(a + b))) <= CONIC_W_RTOL
    assert _rel(s.objective, math.ldexp(opt, -(a + b))) <= CONIC_RTOL
    assert _rel(s.lower_bound, math.ldexp(opt, -(a + b))) <= CONIC_RTOL
    assert s.lower_bound <= s.objective
    assert _rel(s.duals, [mu * 2.0 ** (-p * (a + b))]) <= CONIC_RTOL
    # the optimum has an active constraint: min margin 1, to the conic solver's accuracy
    assert 1.0 <= s.min_margin <= 1.0 + CONIC_RTOL
    assert 0.0 <= s.gap <= CONIC_RTOL
    assert s.support == [(0, 1)]


@pytest.mark.parametrize("p", [1.5, 2.0])
def test_polished_lp_svm_matches_the_closed_form(p):
    """p ≤ 2: the inverse map is differentiable at 0, so the polish runs and the answer is the closed
    form to ~1e-13 (oracle: module docstring), certificate tight."""
    w, opt, mu = _one_row(DELTA, p)
    s = M.solve_lp_svm(ZERO_COLUMN, p, alpha=[0])
    assert s.polished is True and s.p_norm == p
    assert _rel(s.W[:, 0], w) <= POLISHED_RTOL and s.W[0, 1] == 0.0 and s.W[1, 1] == 0.0
    assert _rel(s.objective, opt) <= POLISHED_RTOL and _rel(s.lower_bound, opt) <= POLISHED_RTOL
    assert _rel(s.duals, [mu]) <= POLISHED_RTOL
    assert abs(s.gap) <= POLISHED_RTOL and abs(s.min_margin - 1.0) <= POLISHED_RTOL


def test_polish_drops_a_nearly_active_constraint():
    """A second constraint with margin 1 + 5e-7 at the optimum lies inside LP_SUPPORT_TOL, so it
    starts in the active set; forcing it to equality needs a negative multiplier, so it leaves and the
    polish ends on the true active set. Oracle: the one-row closed form for Δ₁ = e₁ (w* = e₁, μ = 1,
    Δ₂ᵀw* = 1 + 5e-7), its multiplier exactly 0."""
    inst = _instance([[[1.0, 0.0], [1.0 + 5e-7, 1.0]]], [[1.0, 0.0]])
    s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W, np.array([[1.0, 0.0], [0.0, 0.0]])) <= POLISHED_RTOL
    assert _rel(s.duals, [1.0, 0.0]) <= POLISHED_RTOL and s.duals[1] == 0.0
    assert s.support == [(0, 1), (0, 2)]  # both margins within LP_SUPPORT_TOL of 1
    assert abs(s.min_margin - 1.0) <= POLISHED_RTOL


def test_polish_ignores_a_parallel_slack_constraint():
    """Δ₂ = 1.5·Δ₁: the second constraint is parallel to the first with margin 1.5 at the optimum, so
    it is not active; the polish (on the active row alone) succeeds. Oracle: the one-row closed form."""
    d1 = [1.0, 0.5]
    inst = _instance([[d1, [1.5, 0.75]]], [[1.0, 0.0]])
    w, opt, mu = _one_row(d1, 1.5)
    s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W[:, 0], w) <= POLISHED_RTOL and _rel(s.objective, opt) <= POLISHED_RTOL
    assert _rel(s.duals, [mu, 0.0]) <= POLISHED_RTOL and s.duals[1] == 0.0
    assert abs(s.min_margin - 1.0) <= POLISHED_RTOL and s.support == [(0, 1)]


def test_polish_with_multipliers_six_decades_apart():
    """p = 1.1 (q − 1 = 10, a stiff inverse map), two inputs with queries e₁, e₂ and differences of
    sizes 0.9 and 3.5e-6: the columns decouple and the multipliers are ~1.1 and ~1e6. The polish
    reaches machine precision. Oracle: the one-row closed form per column."""
    p, r = 1.1, 3.5e-6
    d1, d2 = [0.9, 0.6], [r, 0.5 * r]
    inst = _instance([[d1], [d2]], [[1.0, 0.0], [0.0, 1.0]])
    (w1, o1, m1), (w2, o2, m2) = _one_row(d1, p), _one_row(d2, p)
    s = M.solve_lp_svm(inst, p, alpha=[0, 0])
    assert s.polished is True
    assert _rel(s.W[:, 0], w1) <= POLISHED_RTOL and _rel(s.W[:, 1], w2) <= POLISHED_RTOL
    assert _rel(s.duals, [m1, m2]) <= POLISHED_RTOL
    assert _rel(s.objective, (o1**p + o2**p) ** (1.0 / p)) <= POLISHED_RTOL


@pytest.mark.parametrize("p", [1.1, 1.2, 1.5, 2.0])
@pytest.mark.parametrize("r", [1e-3, 1e-8])
def test_polish_with_multipliers_many_decades_apart(p, r):
    """Regression (issue 13 §1): at p = 1.1, r = 1e-8 the polish used to run out of its 100 Newton
    steps (the start of the small multiplier, floored at 1e-3·max μ, was 5.6e5× too large and plain
    Newton shrank it by 10 % per step), leaving Clarabel's answer: gap 1.5e-6, column 0 of W off by
    210× its size, μ = (0.019, 6.3e8) for (1.12, 6.3e8). Two inputs with queries e₁, e₂ and differences
    of sizes 0.9 and r: multipliers ~1 and r^−p apart (up to 20 decades). Oracle: the one-row closed
    form per column (module docstring); polished to POLISHED_RTOL, each column relative to itself."""
    d1, d2 = [0.9, 0.6], [r, 0.5 * r]
    inst = _instance([[d1], [d2]], [[1.0, 0.0], [0.0, 1.0]])
    (w1, o1, m1), (w2, o2, m2) = _one_row(d1, p), _one_row(d2, p)
    s = M.solve_lp_svm(inst, p, alpha=[0, 0])
    assert s.polished is True
    assert _rel(s.W[:, 0], w1) <= POLISHED_RTOL and _rel(s.W[:, 1], w2) <= POLISHED_RTOL
    assert _rel(s.duals[0], m1) <= POLISHED_RTOL and _rel(s.duals[1], m2) <= POLISHED_RTOL
    assert _rel(s.objective, (o1**p + o2**p) ** (1.0 / p)) <= POLISHED_RTOL
    assert abs(s.gap) <= POLISHED_RTOL


# ------------------------------------------------------------------- ℓp-SVM: range refusals
#: One input, d = 4, query e₁, Δ = ¾·(1, 1, 1, 1), p = 1.5 (q = 3): w* = |Δ|²/||Δ||₃³ = ⅓ in each entry
#: of W's first column, ||w*||_p = 4^{2/3}/3 ≈ 0.84 (closed form), so max|W| and the objective are
#: 1.33 binades apart: one scale has the first normal and the second not.
FLAT = _instance([[[0.75] * 4]], [[1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("inst", "p", "what", "side"),
    [
        # X, z scaled by 2^−520: max|W| = |W*|·2^1040 ≈ 2^1040 overflows (ZERO_COLUMN, max|w*| = 0.86)
        (
            A.Instance(
                np.ldexp(ZERO_COLUMN.X, -520), ZERO_COLUMN.Y, ZERO_COLUMN.v, np.ldexp(ZERO_COLUMN.z, -520)
            ),
            3.0,
            "the ℓp-SVM solution W_p",
            "overflows",
        ),
        # X, z scaled by 2^−513, 2^−512: max|W| = ⅓·2^1025 ≈ 1.2e308 is normal, the objective
        # 0.84·2^1025 ≈ 3.0e308 is not
        (
            A.Instance(np.ldexp(FLAT.X, -513), FLAT.Y, FLAT.v, np.ldexp(FLAT.z, -512)),
            1.5,
            "the ℓp-SVM objective ||W_p||_p",
            "overflows",
        ),
        # one binade lower (X by 2^−512): W and the objective ≈ 0.84·2^1024 are normal, the multiplier
        # μ = 2^(1.5·1024)·μ* (μ* = 1/||Δ||₃^1.5 ≈ 0.77) ≈ 2^1536 is not
        (
            A.Instance(np.ldexp(FLAT.X, -512), FLAT.Y, FLAT.v, np.ldexp(FLAT.z, -512)),
            1.5,
            "the ℓp-SVM multipliers μ",
            "overflows",
        ),
        # X, z scaled by 2^200: W ≈ 2^−400 and the objective are normal, μ ≈ 2^−1200 underflows (p = 3)
        (
            A.Instance(
                np.ldexp(ZERO_COLUMN.X, 200), ZERO_COLUMN.Y, ZERO_COLUMN.v, np.ldexp(ZERO_COLUMN.z, 200)
            ),
            3.0,
            "the ℓp-SVM multipliers μ",
            "underflows",
        ),
    ],
)
def test_lp_svm_refuses_each_unrepresentable_output_by_name(inst, p, what, side):
    """Oracle: the sizes from the closed form and the equivariance W_p(2^a X, 2^b z) = 2^−(a+b) W_p,
    μ → 2^−p(a+b) μ (see each case); the message names the quantity and the range."""
    with pytest.raises(NumericalError) as exc:
        M.solve_lp_svm(inst, p, alpha=[0])
    msg = str(exc.value)
    assert msg.startswith(f"{what} is about ") and msg.endswith(f"it {side} {RANGE_TEXT}")


# ------------------------------------------------------ ℓp-SVM: the conic answer, tampered with
def test_a_zero_margin_conic_answer_is_refused(monkeypatch):
    """Fault injection: Clarabel reports ``optimal`` with w = 0 (every margin 0): feasibility cannot
    be restored by rescaling. Oracle: the documented SolverError text."""
    with _conic_answer(monkeypatch, value=np.zeros_like), pytest.raises(SolverError) as exc:
        M.solve_lp_svm(ZERO_COLUMN, 3.0, alpha=[0])
    assert str(exc.value) == "the ℓp-SVM solution has a non-positive margin 0; cannot restore feasibility"


def test_an_infeasible_conic_answer_is_rescaled_to_feasibility(monkeypatch):
    """Fault injection: Clarabel's w halved (margin ½), p = 3 unpolished: W / min(1, min margin)
    restores the optimum, and the multipliers (cvxpy's dual times ||w||_p^{p−1}) use the restored w.
    Oracle: the one-row closed form, to the conic accuracy."""
    w, opt, mu = _one_row(DELTA, 3.0)
    with _conic_answer(monkeypatch, value=lambda x: 0.5 * x):
        s = M.solve_lp_svm(ZERO_COLUMN, 3.0, alpha=[0])
    assert s.polished is False
    assert _rel(s.W[:, 0], w) <= CONIC_W_RTOL and _rel(s.objective, opt) <= CONIC_RTOL
    assert _rel(s.duals, [mu]) <= CONIC_RTOL
    assert abs(s.min_margin - 1.0) <= CONIC_RTOL


def test_an_overfeasible_conic_answer_is_kept_and_its_gap_reported(monkeypatch):
    """Fault injection: Clarabel's w scaled by 3/2 (feasible, margin 3/2, suboptimal), p = 3
    unpolished. Feasibility is only restored (W / min(1, margin)), never shrunk, so the answer is 1.5·W*
    and the certificate says so: gap = 1 − opt/(1.5·opt) = 1/3. Oracle: closed form."""
    w, opt, mu = _one_row(DELTA, 3.0)
    with _conic_answer(monkeypatch, value=lambda x: 1.5 * x):
        s = M.solve_lp_svm(ZERO_COLUMN, 3.0, alpha=[0])
    assert s.polished is False
    assert _rel(s.W[:, 0], 1.5 * w) <= CONIC_W_RTOL and _rel(s.objective, 1.5 * opt) <= CONIC_RTOL
    assert _rel(s.min_margin, 1.5) <= CONIC_RTOL and _rel(s.lower_bound, opt) <= CONIC_RTOL
    assert abs(s.gap - 1.0 / 3.0) <= CONIC_RTOL
    assert s.support == []  # no margin within LP_SUPPORT_TOL of 1


def test_without_multipliers_the_certificate_is_vacuous(monkeypatch):
    """Fault injection: Clarabel's duals zeroed, p = 3 unpolished: no multiplier certifies anything,
    so the lower bound is 0 and the gap 1 (not a division by ||0||_q). Oracle: the definition
    lower bound = 1ᵀμ/||Aᵀμ||_q, vacuous at μ = 0; W still the closed form."""
    w, opt, _ = _one_row(DELTA, 3.0)
    with _conic_answer(monkeypatch, duals=np.zeros_like):
        s = M.solve_lp_svm(ZERO_COLUMN, 3.0, alpha=[0])
    assert s.polished is False
    assert s.lower_bound == 0.0 and s.gap == 1.0 and np.array_equal(s.duals, [0.0])
    assert _rel(s.W[:, 0], w) <= CONIC_W_RTOL and _rel(s.objective, opt) <= CONIC_RTOL


def test_a_lower_bound_below_the_normal_range_is_refused_by_name(monkeypatch):
    """Fault injection: the duals put all weight on a slack row Δ₂ = 4Δ₁ (margin 4), so the Hölder
    bound is 1/||Δ₂||_q = opt/4 (p = 3, unpolished). X, z scaled by 2^510: objective 0.998·2^−1020 ≈
    4·2.2e-308 is normal, the bound ≈ 2^−1022·0.998 is not. Oracle: closed form + equivariance."""
    inst0 = _instance([[DELTA, [4 * x for x in DELTA]]], [[1.0, 0.0]])
    inst = A.Instance(np.ldexp(inst0.X, 510), inst0.Y, inst0.v, np.ldexp(inst0.z, 510))
    with _conic_answer(monkeypatch, duals=lambda d: np.array([0.0, 1.0])):
        s0 = M.solve_lp_svm(inst0, 3.0, alpha=[0])
        with pytest.raises(NumericalError) as exc:
            M.solve_lp_svm(inst, 3.0, alpha=[0])
    _, opt, _ = _one_row(DELTA, 3.0)
    assert s0.polished is False and _rel(s0.lower_bound, opt / 4.0) <= CONIC_RTOL
    msg = str(exc.value)
    assert msg.startswith("the ℓp-SVM lower bound is about ") and msg.endswith(f"it underflows {RANGE_TEXT}")


def test_a_misleading_conic_answer_is_corrected_by_the_active_set(monkeypatch):
    """Fault injection: Clarabel's answer replaced by a feasible point on the wrong face — Δ₂ = (1.5,
    1.5) tight, Δ₁ = e₁ slack (margin 1.25) — with all dual weight on Δ₂ (p = 1.5). The active set
    starts at {Δ₂}; its solution violates Δ₁, which joins; Δ₂'s multiplier is then negative and it
    leaves. Oracle: the closed form w* = e₁ (Δ₁ alone; Δ₂ᵀe₁ = 1.5 slack), μ = (1, 0), polished."""
    inst = _instance([[[1.0, 0.0], [1.5, 1.5]]], [[1.0, 0.0]])
    W_true = np.array([[1.0, 0.0], [0.0, 0.0]])
    W_bad = np.array([[1.25, 0.0], [-7.0 / 12.0, 0.0]])  # Δ₂ᵀw = 1.875 − 0.875 = 1, Δ₁ᵀw = 1.25

    def wrong_face(x: np.ndarray) -> np.ndarray:
        return _solver_scale(x, W_true) * W_bad.reshape(-1, order="F")

    with _conic_answer(monkeypatch, value=wrong_face, duals=lambda d: np.array([0.0, 1.0])):
        s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W, W_true) <= POLISHED_RTOL and _rel(s.duals, [1.0, 0.0]) <= POLISHED_RTOL
    assert _rel(s.objective, 1.0) <= POLISHED_RTOL and abs(s.gap) <= POLISHED_RTOL
    assert s.support == [(0, 1)]


def test_a_polish_that_never_certifies_returns_the_conic_answer(monkeypatch):
    """Fault injection: a Newton solver whose multipliers are never positive. Each round drops the
    row with the smallest multiplier until the active set is empty; the answer is then the rescaled
    conic one, unpolished, with the conic certificate. Oracle: the closed form (p = 1.5), to the conic
    accuracy."""
    w, opt, mu = _one_row(DELTA, 1.5)
    calls = []

    def never(AS, p, mu0, max_iter=100):  # type: ignore[no-untyped-def]
        calls.append(AS.shape[0])
        return -np.ones(AS.shape[0]), np.zeros(AS.shape[1])

    monkeypatch.setattr(M, "_newton_active", never)
    s = M.solve_lp_svm(ZERO_COLUMN, 1.5, alpha=[0])
    assert calls == [1]
    assert s.polished is False
    assert _rel(s.W[:, 0], w) <= CONIC_W_RTOL and _rel(s.objective, opt) <= CONIC_RTOL
    assert _rel(s.duals, [mu]) <= CONIC_RTOL and -GAP_ROUNDING <= s.gap <= CONIC_RTOL


def test_a_slack_parallel_row_at_the_multiplier_threshold_stays_out(monkeypatch):
    """Boundary of the active-set rule "multiplier > 1e-6 × the largest": a slack row Δ₂ = 1.5·Δ₁
    (parallel, margin 1.5) whose conic multiplier is exactly 1e-6 × the largest (duals (1, 1e-6)) is
    negligible, so the polish runs on Δ₁ alone (with Δ₂ it would be singular). Oracle: the one-row
    closed form for Δ₁ (p = 1.5), polished."""
    d1 = [1.0, 0.5]
    inst = _instance([[d1, [1.5, 0.75]]], [[1.0, 0.0]])
    w, opt, mu = _one_row(d1, 1.5)
    with _conic_answer(monkeypatch, duals=lambda d: np.array([1.0, 1e-6])):
        s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W[:, 0], w) <= POLISHED_RTOL and _rel(s.duals, [mu, 0.0]) <= POLISHED_RTOL


def test_the_active_set_follows_relative_multipliers_of_any_scale(monkeypatch):
    """Fault injection: Clarabel's w scaled by 3/2 (no margin near 1) and its duals by 1e-8. The
    active rows are then known only from the multipliers, and the rule "multiplier > 1e-6 × the
    largest" is relative, so the scale of the duals does not matter: the row is selected and the polish
    recovers the optimum (p = 1.5). Oracle: the one-row closed form, polished."""
    w, opt, mu = _one_row(DELTA, 1.5)
    with _conic_answer(monkeypatch, value=lambda x: 1.5 * x, duals=lambda d: 1e-8 * d):
        s = M.solve_lp_svm(ZERO_COLUMN, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W[:, 0], w) <= POLISHED_RTOL and _rel(s.duals, [mu]) <= POLISHED_RTOL
    assert _rel(s.objective, opt) <= POLISHED_RTOL and abs(s.min_margin - 1.0) <= POLISHED_RTOL


def test_a_cycling_active_set_is_cut_off_after_two_rounds_per_row(monkeypatch):
    """Fault injection: a Newton solver that makes the active set cycle — on {Δ₁} it returns a W that
    violates Δ₂ (so Δ₂ joins), on {Δ₁, Δ₂} a negative multiplier for Δ₂ (so it leaves). The loop is
    bounded by 2m Newton solves (m = 2 rows: each may enter and leave once), then the conic answer is
    returned, unpolished. Oracle: the closed form w* = e₁ (Δ₁ = e₁, Δ₂ = (1.5, 1.5) slack), to the
    conic accuracy."""
    inst = _instance([[[1.0, 0.0], [1.5, 1.5]]], [[1.0, 0.0]])
    sizes = []

    def cycling(AS, p, mu0, max_iter=100):  # type: ignore[no-untyped-def]
        sizes.append(AS.shape[0])
        if AS.shape[0] == 1:
            return np.ones(1), np.zeros(AS.shape[1])  # every margin 0: Δ₂ violated
        return np.array([1.0, -1.0]), np.zeros(AS.shape[1])

    monkeypatch.setattr(M, "_newton_active", cycling)
    s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert sizes == [1, 2, 1, 2]
    assert s.polished is False
    assert _rel(s.W, np.array([[1.0, 0.0], [0.0, 0.0]])) <= CONIC_W_RTOL
    assert _rel(s.objective, 1.0) <= CONIC_RTOL


def test_a_margin_of_one_minus_newton_tol_counts_as_met(monkeypatch):
    """Boundary of the polish's feasibility test (margins ≥ 1 − NEWTON_TOL, inclusive). Δ₁ = e₁ and
    Δ₂ = (1 − NEWTON_TOL)·e₁ (as doubles); a Newton stand-in drops Δ₂ (negative multiplier) and, on
    {Δ₁}, returns W = e₁ exactly, where Δ₂'s margin is exactly the double 1 − NEWTON_TOL (powers of
    two scale the rows exactly): accepted, polished, then rescaled to feasibility. Oracle: the closed
    form for the binding row Δ₂, w* = e₁/(1 − NEWTON_TOL)."""
    c = 1.0 - M.NEWTON_TOL
    inst = _instance([[[1.0, 0.0], [c, 0.0]]], [[1.0, 0.0]])

    def newton(AS, p, mu0, max_iter=100):  # type: ignore[no-untyped-def]
        if AS.shape[0] == 2:
            return np.array([1.0, -1.0]), np.zeros(AS.shape[1])
        w = np.zeros(AS.shape[1])
        w[0] = 1.0 / AS[0, 0]  # AS[0] = 2^k·e₁: exact
        return np.ones(1), w

    monkeypatch.setattr(M, "_newton_active", newton)
    s = M.solve_lp_svm(inst, 1.5, alpha=[0])
    assert s.polished is True
    assert _rel(s.W, np.array([[1.0 / c, 0.0], [0.0, 0.0]])) <= POLISHED_RTOL
    assert s.min_margin >= 1.0


# -------------------------------------------------------------- the active-set Newton solver
def test_newton_budget_is_newton_max_steps(monkeypatch):
    """Fault injection: one row a = 1, p = 1.5 (q − 1 = 2), where the scaled Newton system is
    ``1·y = b̂ = √(2μ)`` and the full step ``μ⁺ = y/√(2μ)`` is the root 1. A linear solve returning
    ``y = b̂·μ^0.999`` (μ = b̂²/2) moves μ to μ^0.999 instead: ||G|| = μ − 1 falls every step (accepted
    at t = 1) but the root is never reached from μ₀ = 4 (4^{0.999^100} ≈ 3.5). The solver takes exactly
    the documented budget of NEWTON_MAX_STEPS = 100 steps, then gives up (None). Oracle: the documented
    budget (one linear solve per step)."""
    calls = []

    def slow(a, b):  # type: ignore[no-untyped-def]
        calls.append(1)
        return b * (b * b / 2.0) ** 0.999

    monkeypatch.setattr(np.linalg, "solve", slow)
    assert M._newton_active(np.array([[1.0]]), 1.5, np.array([4.0])) is None
    assert len(calls) == M.NEWTON_MAX_STEPS == 100


def test_newton_line_search_halves_an_overlong_step(monkeypatch):
    """Fault injection: the linear solve returns −8× its answer (one row, p = 1.5, μ₀ = 4, ||G|| = 3):
    the full trial is μ = −8 (||G|| = 9), t = ½ gives −2 (||G|| = 3, no decrease), t = ¼ gives
    ¾·4 + ¼·(−8) = 1, the root. Oracle: the root μ = 1 (hand)."""
    real = np.linalg.solve
    monkeypatch.setattr(np.linalg, "solve", lambda a, b: -8.0 * real(a, b))
    res = M._newton_active(np.array([[1.0]]), 1.5, np.array([4.0]), max_iter=1)
    assert res is not None and abs(res[0][0] - 1.0) <= NEWTON_ROOT_TOL


def test_newton_multipliers_are_float64_for_an_integer_start():
    """A start that already solves the system (a = 1, p = 2: μ = 1) is returned as it is, in float64
    like every multiplier (oracle: the dtype contract of the public arrays)."""
    res = M._newton_active(np.array([[1.0]]), 2.0, np.array([1]))
    assert res is not None
    assert res[0].dtype == np.float64 and res[0][0] == 1.0
