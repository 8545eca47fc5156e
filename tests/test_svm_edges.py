"""Edge cases of the Att-SVM solvers that the main suite does not reach.

Input validation of :func:`min_norm_dual` (which argument is named), zero and trivial rows, the
certification bookkeeping (``certified``/``error_bound``/KKT residuals), the documented rules of the
active-set refinement, the Lawson–Hanson fallback, error messages of rarely reached failures (found
by fault injection through ``monkeypatch``), and result fields of the nuclear-norm solver.
"""

from __future__ import annotations

import dataclasses
import re
import time
import warnings
from decimal import Decimal

import numpy as np
import pytest
import scipy.optimize
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import attnsvm as A
import attnsvm.svm._conic as _conic_mod
import attnsvm.svm._constants as _constants_mod
import attnsvm.svm._dual as _dual_mod
import attnsvm.svm._optimality as _optimality_mod
import attnsvm.svm._problem as _problem_mod
import attnsvm.svm._results as _results_mod
import attnsvm.svm._solve as _solve_mod
from attnsvm.errors import (
    InfeasibleSVMError,
    InvalidInstanceError,
    NumericalError,
    SolverError,
    UnknownNameError,
)
from attnsvm.model._instance import TIE_RTOL
from attnsvm.scaling import EPS
from attnsvm.svm import CERTIFY_RTOL, SUPPORT_RTOL, InfeasibleMinNormError, min_norm_dual, solve_svm
from attnsvm.svm._constants import FARKAS_ZERO_FACTOR, MULTIPLIER_RTOL
from attnsvm.svm._dual import (
    _Core,
    _core,
    _factor_from_gram,
    _kkt,
    _nonneg_representation,
    _pow2_str,
    _refine,
    _Refused,
    _tight_solve,
)
from attnsvm.svm._problem import _raise_infeasible
from attnsvm.svm._results import KKTResiduals

#: The modules of the Att-SVM solvers (attnsvm.svm without the working-set solver): a test that replaces a
#: private helper replaces it in each of them that holds the name, i.e. wherever the solvers look it up.
_SVM_MODULES = (
    _constants_mod,
    _results_mod,
    _dual_mod,
    _problem_mod,
    _conic_mod,
    _solve_mod,
    _optimality_mod,
)


def _patch_svm(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """``monkeypatch.setattr`` of ``name`` in every solver module that holds it (defines or imports it)."""
    held = [m for m in _SVM_MODULES if hasattr(m, name)]
    assert held, f"no Att-SVM module holds {name}"
    for m in held:
        monkeypatch.setattr(m, name, value)


#: Two certified solutions (each to CERTIFY_RTOL relative) of the same problem agree to 2·CERTIFY_RTOL.
AGREE_RTOL = 2 * CERTIFY_RTOL

#: Exact rational solutions of tiny hand-built problems: the SVD least-norm solve of a 2×2 system with
#: O(1) entries is backward stable, so coordinates are exact to a few eps; 1e-14 is ~50 eps.
EXACT_ATOL = 1e-14

#: Lawson–Hanson NNLS (the fallback when the refinement refuses) on a well-conditioned problem
#: (rows of a random 9×14 Gaussian matrix, seed 2: cond(K_S) ≈ 2.7): its error is ≲ cond·eps ≈ 1e-15;
#: we measure 3e-16 relative (coords and multipliers). 1e-10 fails only when the fallback returns a
#: wrong point.
NNLS_RTOL = 1e-10

#: A multiplier vector perturbed by DELTA_LAMBDA must show up in the stationarity residual as
#: ||W − Σλ(1+δ)Δzᵀ||/||W|| = δ; the difference of two O(1) arrays that differ by δ carries absolute
#: error ≲ d²·eps ≈ 1e-14 (d = 6), i.e. ≈ 1e-8 relative to δ = 1e-6 (measured: 1.1e-9). STAT_RTOL =
#: 1e-6 leaves 100× over the estimate.
DELTA_LAMBDA = 1e-6
STAT_RTOL = 1e-6


def _generic(seed: int, m: int = 9, k: int = 14) -> tuple[np.ndarray, np.ndarray]:
    """Random rows (generic: nondegenerate support) and right-hand sides of mixed sign."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)), rng.standard_normal(m)


# ===================================================================== min_norm_dual: input checks
def test_min_norm_dual_error_messages_name_the_bad_argument():
    with pytest.raises(InvalidInstanceError, match=r"^K must have 2 dimension\(s\); got shape \(2,\)"):
        min_norm_dual(np.ones(2), np.ones(2))
    with pytest.raises(InvalidInstanceError, match=r"^K must be finite"):
        min_norm_dual(np.array([[1.0, np.inf], [np.inf, 1.0]]), np.ones(2))
    with pytest.raises(InvalidInstanceError, match=r"^b must have 1 dimension\(s\); got shape \(2, 1\)"):
        min_norm_dual(np.eye(2), np.ones((2, 1)))
    with pytest.raises(InvalidInstanceError, match=r"^b must be finite"):
        min_norm_dual(np.eye(2), np.array([1.0, np.nan]))
    with pytest.raises(InvalidInstanceError, match=r"^K must be symmetric \(a Gram matrix AAᵀ\); K - K\.T"):
        min_norm_dual(np.array([[1.0, 0.5], [0.0, 1.0]]), np.ones(2))
    with pytest.raises(InvalidInstanceError, match=r"^support_hint indices must lie in \[0, 1\]$"):
        min_norm_dual(np.eye(2), np.ones(2), support_hint=[2])
    with pytest.raises(InvalidInstanceError, match=r"^support_hint indices must lie in \[0, 1\]$"):
        min_norm_dual(np.eye(2), np.ones(2), support_hint=[-1])


@pytest.mark.parametrize(
    "equality",
    [np.array([0.0, 1.0]), np.array([[0]]), np.array([[True, False]])],
    ids=["float-indices", "2-D-indices", "2-D-mask"],
)
def test_min_norm_dual_rejects_malformed_equality(equality):
    # a float array is neither a mask nor indices, and a 2-D index array is not "1-D row indices"
    with pytest.raises(InvalidInstanceError, match=r"boolean mask of shape|equality mask must have shape"):
        min_norm_dual(np.eye(2), np.ones(2), equality)


# ======================================================================= zero and trivial rows
def test_zero_equality_row_with_nonzero_rhs_is_infeasible_with_sign_certificate():
    # row 0 of the factor is 0, so a_0ᵀw = 0 for every w and "= −1" cannot hold; the certificate is
    # c = sign(b_0)·e_0 (bᵀc = 1 > 0, Aᵀc = 0), and the norm bound is infinite.
    L = np.array([[0.0, 0.0], [1.0, 0.0]])
    with pytest.raises(
        InfeasibleMinNormError, match=re.escape("row 0 is identically zero but asks for = -1")
    ) as exc:
        min_norm_dual(L @ L.T, np.array([-1.0, 1.0]), [0], factor=L)
    np.testing.assert_array_equal(exc.value.certificate, [-1.0, 0.0])
    assert exc.value.norm_bound == np.inf
    assert exc.value.rows.tolist() == [0]
    with pytest.raises(InfeasibleMinNormError, match=re.escape("row 0 is identically zero but asks for = 1")):
        min_norm_dual(L @ L.T, np.array([1.0, 1.0]), [0], factor=L)


def test_zero_inequality_row_message_and_certificate():
    L = np.array([[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(
        InfeasibleMinNormError, match=re.escape("row 1 is identically zero but asks for ≥ 2")
    ) as exc:
        min_norm_dual(L @ L.T, np.array([1.0, 2.0]), factor=L)
    np.testing.assert_array_equal(exc.value.certificate, [0.0, 1.0])


def test_zero_rows_that_hold_trivially_are_accepted():
    # 0 = 0 (equality) and 0 ≥ −3 (inequality) hold for every w: the answer is that of row 0 alone, w = e₁.
    L = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    r = min_norm_dual(L @ L.T, np.array([1.0, 0.0, -3.0]), [1], factor=L)
    np.testing.assert_allclose(L.T @ r.multipliers, [1.0, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.certified
    assert 1 in r.support.tolist()  # an equality row is always in the support


def test_all_zero_rhs_gives_the_trivial_solution():
    # b = 0: w = 0 is feasible and has the least norm; every row is active (margin 0 = b) with λ = 0,
    # so every inequality row is weakly active. Nothing is iterated.
    rng = np.random.default_rng(3)
    Am = rng.standard_normal((4, 6))
    r = min_norm_dual(Am @ Am.T, np.zeros(4), [2], factor=Am)
    assert r.method == "trivial" and r.iterations == 0
    assert r.norm == 0.0 and r.error_bound == 0.0 and r.certified
    np.testing.assert_array_equal(r.multipliers, np.zeros(4))
    np.testing.assert_array_equal(r.coords, np.zeros(6))
    assert r.support.tolist() == [0, 1, 2, 3]
    assert r.weakly_active.tolist() == [0, 1, 3]


# ================================================================= certification bookkeeping
def test_large_norm_feasible_problem_is_solved_but_not_certified():
    # w₁ ≥ 1 and −w₁ + ε w₂ ≥ 0: the least-norm point is w = (1, 1/ε), norm ≈ 1e4 for ε = 1e-4 (below the
    # infeasibility threshold INFEASIBLE_NORM = 1e7). Both rows are active and K_S has cond ≈ 4/ε² = 4e8,
    # so error_bound = cond·eps ≈ 9e-8 > CERTIFY_RTOL: the KKT residuals are tiny but the answer must not
    # be certified.
    eps_ = 1e-4
    Am = np.array([[1.0, 0.0], [-1.0, eps_]])
    r = min_norm_dual(Am @ Am.T, np.array([1.0, 0.0]), factor=Am)
    w_exact = np.array([1.0, 1.0 / eps_])
    w = Am.T @ r.multipliers
    assert np.linalg.norm(w - w_exact) <= r.error_bound * np.linalg.norm(w_exact)
    assert r.norm == pytest.approx(np.linalg.norm(w_exact), rel=r.error_bound)
    assert r.error_bound > CERTIFY_RTOL
    assert r.kkt.max() <= CERTIFY_RTOL
    assert not r.certified
    assert r.support.tolist() == [0, 1]


@pytest.mark.parametrize("scale", [1e8, 1e-8])
def test_kkt_residuals_are_relative_to_the_rhs_scale(scale):
    # The residuals are relative (slacks divided by |b_r| + ||a_r||·||w||): scaling b scales w and λ and
    # leaves every residual at the rounding level, so the scaled problem is certified too.
    Am, b = _generic(0)
    ref = min_norm_dual(Am @ Am.T, b, factor=Am)
    r = min_norm_dual(Am @ Am.T, scale * b, factor=Am)
    assert ref.certified and r.certified, (r.kkt, r.error_bound)
    assert r.kkt.complementary_slackness <= CERTIFY_RTOL
    assert r.kkt.primal_feasibility <= CERTIFY_RTOL
    np.testing.assert_allclose(r.coords, scale * ref.coords, rtol=0, atol=AGREE_RTOL * scale * ref.norm)


def test_tiny_gram_matrix_is_not_mistaken_for_zero():
    # The eigenvalue cut-off of the Gram factor is relative to the largest eigenvalue: K·s with s = 2⁻⁷⁰
    # (≈ 8e-22) describes rows a·√s, whose least-norm solution is w/√s with the same support.
    Am, b = _generic(1)
    K = Am @ Am.T
    s = 2.0**-70
    ref = min_norm_dual(K, b)
    r = min_norm_dual(K * s, b)
    assert r.certified
    assert r.norm == pytest.approx(ref.norm / np.sqrt(s), rel=AGREE_RTOL)
    np.testing.assert_array_equal(r.support, ref.support)


# ============================================================ active-set refinement: the rules
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nnls_start_is_exact_so_one_refinement_step_confirms_it(seed):
    # NNLS solves the dual exactly, so on generic data its nonzero multipliers are the support and the
    # refinement only confirms it (iteration 1). The same holds when the support is passed as the hint.
    Am, b = _generic(seed)
    r = min_norm_dual(Am @ Am.T, b, factor=Am)
    assert r.method == "nnls+active-set" and r.iterations == 1
    assert 0 < r.support.size < b.size  # some rows are inactive, so a wrong start would cost steps
    h = min_norm_dual(Am @ Am.T, b, factor=Am, support_hint=r.support)
    assert h.method == "active-set" and h.iterations == 1
    np.testing.assert_allclose(h.coords, r.coords, rtol=0, atol=AGREE_RTOL * r.norm)


def test_zero_multiplier_is_not_dropped():
    # rows e₁ (b = 1) and e₂ (b = 0), hint = {row 1}: step 1 solves e₂ᵀw = 0, λ = 0 — not negative, so the
    # row stays; row 0 is violated and is added; step 2 solves both, λ = (1, 0) ≥ 0, nothing violated.
    # Dropping the zero multiplier would cost a third step.
    r = min_norm_dual(np.eye(2), np.array([1.0, 0.0]), support_hint=[1])
    assert r.method == "active-set" and r.iterations == 2
    np.testing.assert_allclose(r.multipliers, [1.0, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.support.tolist() == [0, 1] and r.weakly_active.tolist() == [1]


@pytest.mark.parametrize("hint", [None, [0]])
def test_weakly_active_row_outside_the_tight_set_is_not_added(hint):
    # w₁ ≥ 1, w₁ + w₂ ≥ 1: w = (1, 0); row 1 has slack 0 up to rounding and λ = 0. Started from row 0 alone
    # (the hint, or the NNLS support), the slack test (slack < −tol with tol > 0) must not count row 1 as
    # violated: one step suffices, and row 1 is reported weakly active.
    Am = np.array([[1.0, 0.0], [1.0, 1.0]])
    r = min_norm_dual(Am @ Am.T, np.ones(2), factor=Am, support_hint=hint)
    assert r.iterations == 1
    np.testing.assert_allclose(r.coords, [1.0, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.support.tolist() == [0, 1] and r.weakly_active.tolist() == [1]


@pytest.mark.parametrize("t", [1.0, 1e-5])
def test_negative_least_norm_multipliers_of_a_degenerate_support_are_repaired_at_any_scale(t):
    # Rows e₁, (c, c), (−c, c) (c = 1/√2) are all active at w = t·e₁ (right-hand sides t, ct, −ct), but
    # three rows in R² are rank-deficient and the least-norm multipliers (t/2, ct/2, −ct/2) have a
    # negative entry although λ = (t, 0, 0) ≥ 0 represents w. Started from those three rows, the step must
    # find the nonnegative representation at once (one step), whatever the scale t of the multipliers:
    # the row e₂ with b = −1 (inactive) keeps the normalisation from rescaling t to 1.
    c = np.sqrt(0.5)
    Am = np.array([[1.0, 0.0], [c, c], [-c, c], [0.0, 1.0]])
    r = min_norm_dual(Am @ Am.T, np.array([t, c * t, -c * t, -1.0]), factor=Am, support_hint=[0, 1, 2])
    assert r.method == "active-set" and r.iterations == 1
    np.testing.assert_allclose(r.coords, [t, 0.0], rtol=0, atol=EXACT_ATOL * t)
    np.testing.assert_allclose(r.multipliers, [t, 0.0, 0.0, 0.0], rtol=0, atol=EXACT_ATOL * t)
    assert r.support.tolist() == [0, 1, 2] and r.weakly_active.tolist() == [1, 2]
    assert r.certified


def test_most_violated_row_is_measured_relative_to_its_scale():
    # Rows e₁ (b = 1), a_A = (−0.6, 0.8) (b = 0), a_B = (0.5, √0.75) (b = 1); hint {e₁} gives w = e₁, where
    # A has slack −0.6 (scale |b| + ||w|| = 1) and B slack −0.5 (scale 2): relative to their scales A is
    # the more violated (−0.6 vs −0.25) and is added; then w = (1, 0.75), B has slack 0.15 > 0 and the
    # step ends (2 iterations). Adding B first instead would lead to the inconsistent tight set {e₁, A, B}
    # and a refusal (NNLS fallback).
    Am = np.array([[1.0, 0.0], [-0.6, 0.8], [0.5, np.sqrt(0.75)]])
    r = min_norm_dual(Am @ Am.T, np.array([1.0, 0.0, 1.0]), factor=Am, support_hint=[0])
    assert r.method == "active-set" and r.iterations == 2
    np.testing.assert_allclose(r.coords, [1.0, 0.75], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(r.multipliers, [1.5625, 0.9375, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.support.tolist() == [0, 1] and r.certified


def test_certificate_entries_at_the_multiplier_threshold_count_as_zero(monkeypatch):
    # MULTIPLIER_RTOL: an entry with |c_r| ≤ MULTIPLIER_RTOL·max|c| counts as 0 (boundary included). An
    # injected Farkas certificate (1, 1e-9, 0) on unit rows keeps row 0 only.
    _patch_svm(
        monkeypatch,
        "_ldp_nnls",
        lambda Ln, bs, eqn: (np.zeros(Ln.shape[1]), np.zeros(bs.size), np.array([1.0, 1e-9, 0.0])),
    )
    with pytest.raises(InfeasibleMinNormError, match=r"rows \[0\] cannot hold together") as exc:
        min_norm_dual(np.eye(3), np.ones(3))
    np.testing.assert_array_equal(exc.value.certificate, [1.0, 0.0, 0.0])


def test_refinement_gives_up_after_2m_plus_10_steps(monkeypatch):
    # A tight solver that always reports a negative multiplier makes the iteration drop a row, then
    # (empty set, w = 0, every row violated) add one, forever: _refine must refuse after 2m + 10 steps,
    # i.e. after m + 5 tight solves (one every other step).
    calls = []

    def always_negative(LS, bS):
        calls.append(LS.shape[0])
        return np.zeros(LS.shape[1]), -np.ones(LS.shape[0]), 1.0, LS.shape[0]

    _patch_svm(monkeypatch, "_tight_solve", always_negative)
    m = 4
    with pytest.raises(_Refused):
        _refine(np.eye(m), np.ones(m), np.zeros(m, dtype=bool), np.array([0]))
    assert len(calls) == m + 5


def test_nnls_fallback_when_the_refinement_refuses(monkeypatch):
    # When the active-set step refuses, the NNLS point is returned as is: method "nnls", no iterations,
    # an infinite error bound, never certified, yet (NNLS being exact here) the right answer.
    Am, b = _generic(2)
    ref = min_norm_dual(Am @ Am.T, b, factor=Am)

    def refuse(*args, **kwargs):
        raise _Refused("test")

    _patch_svm(monkeypatch, "_refine", refuse)
    r = min_norm_dual(Am @ Am.T, b, factor=Am)
    assert r.method == "nnls" and r.iterations == 0
    assert r.error_bound == np.inf and not r.certified
    np.testing.assert_allclose(r.coords, ref.coords, rtol=0, atol=NNLS_RTOL * ref.norm)
    np.testing.assert_allclose(
        r.multipliers, ref.multipliers, rtol=0, atol=NNLS_RTOL * np.abs(ref.multipliers).max()
    )
    # a wrong hint refused as well falls through to the same NNLS point
    r_h = min_norm_dual(Am @ Am.T, b, factor=Am, support_hint=[0])
    assert r_h.method == "nnls"


def test_nnls_iteration_limit_scales_with_the_number_of_rows():
    # Lawson–Hanson adds one row per iteration: 1001 active rows (w_r ≥ 1 for the unit vectors) need more
    # than 1000 iterations, so a fixed limit of 1000 would fail on this perfectly conditioned problem.
    m = 1001
    r = min_norm_dual(np.eye(m), np.ones(m))
    assert r.certified
    assert r.norm == pytest.approx(np.sqrt(m), rel=AGREE_RTOL)
    assert r.support.size == m


# ===================================================================== Att-SVM: Frobenius
def _perturbed_core(monkeypatch, edit):
    real = _core

    def fake(*args, **kwargs):
        return edit(real(*args, **kwargs))

    _patch_svm(monkeypatch, "_core", fake)


@pytest.mark.parametrize(
    "shape", [(4, 5, 6, 2), (4, 8, 3, 0)], ids=["wide-factor", "narrow-factor (p_Delta*p_z = 9 <= m = 28)"]
)
def test_multipliers_inconsistent_with_w_show_in_stationarity(monkeypatch, shape):
    # W is built from the primal coordinates, the stationarity residual from the multipliers; if the
    # multipliers are off by a factor 1 + δ the residual must say δ and the answer must not be certified
    # (building W from the multipliers would hide the inconsistency: residual 0). Both factor widths:
    # the narrow one (n = 4, T = 8, d = 3) skips the second QR.
    n, T, d, seed = shape
    inst = A.random_instance(n, T, d, seed=seed)
    ref = solve_svm(inst)
    _perturbed_core(monkeypatch, lambda core: dataclasses.replace(core, lam=core.lam * (1.0 + DELTA_LAMBDA)))
    sol = solve_svm(inst)
    assert sol.kkt is not None
    assert sol.kkt.stationarity == pytest.approx(DELTA_LAMBDA, rel=STAT_RTOL)
    assert not sol.certified
    np.testing.assert_allclose(sol.W, ref.W, rtol=0, atol=AGREE_RTOL * np.linalg.norm(ref.W))


def test_non_finite_solution_raises_solver_error(monkeypatch):
    inst = A.random_instance(3, 4, 5, seed=0)
    _perturbed_core(monkeypatch, lambda core: dataclasses.replace(core, u=np.full_like(core.u, np.nan)))
    with pytest.raises(SolverError, match=r"^the Att-SVM solution is not finite; the instance is too badly"):
        solve_svm(inst)


def test_support_uses_each_rows_own_norm():
    # n = 1, z = e₁, x₀ = 0 selected: the rows are Δ₁ = (1, 0), Δ₂ = (1 + δ, 5), Δ₃ = (100, 1000) and
    # W = e₁e₁ᵀ (only w₁ ≥ 1 binds). Row 2 has slack δ = 1e-7, above its own support threshold
    # SUPPORT_RTOL·(1 + ||Δ₂||·||z||·||W||) ≈ 6e-9 but below SUPPORT_RTOL·(1 + ||Δ||_F·||W||) ≈ 1e-6 of the
    # stacked Δ's: it is not a support token.
    delta = 1e-7
    X = np.array([[[0.0, 0.0], [-1.0, 0.0], [-(1.0 + delta), -5.0], [-100.0, -1000.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))
    sol = solve_svm(inst, alpha=[0])
    np.testing.assert_allclose(sol.W, [[1.0, 0.0], [0.0, 0.0]], rtol=0, atol=EXACT_ATOL)
    assert sol.support == ((0, 1),)
    # margin error ≤ ‖Δ₂‖·‖W − W*‖ (Cauchy–Schwarz) ≤ ‖Δ₂‖·EXACT_ATOL
    assert np.abs(sol.margins[1] - 1.0 - delta) <= EXACT_ATOL * np.linalg.norm(X[0, 2])
    # the documented definition, evaluated independently of the solver's bookkeeping
    c = A.svm_constraints(inst, [0])
    margins = A.svm_margins(inst, sol.W, [0])
    scale = 1.0 + np.linalg.norm(c.deltas, axis=1) * np.linalg.norm(c.queries, axis=1) * np.linalg.norm(sol.W)
    on = np.flatnonzero(np.abs(margins - 1.0) <= SUPPORT_RTOL * scale)
    assert sol.support == tuple((int(c.pairs[r, 0]), int(c.pairs[r, 1])) for r in on)
    assert sol.certified


def test_timings_are_durations():
    inst = A.random_instance(3, 4, 5, seed=0)
    t0 = time.perf_counter()
    sol = solve_svm(inst)
    wall = time.perf_counter() - t0
    tm = sol.timings
    assert set(tm) == {"solver", "active_set", "total"}
    assert all(0.0 <= v <= wall for v in tm.values()), (tm, wall)
    assert tm["solver"] + tm["active_set"] <= tm["total"]


@pytest.mark.parametrize("method", ["primal", "vector"])
def test_conic_failure_is_reported_under_the_method_that_ran(monkeypatch, method):
    # An unsolved cvxpy problem has status None: the error must name the program that was built
    # ("primal Att-SVM" is the matrix program, "vector Att-SVM" the one on svm_rows).
    _patch_svm(monkeypatch, "_cvxpy_solve", lambda prob, what: None)
    inst = A.random_instance(3, 4, 5, seed=0)
    with pytest.raises(
        SolverError, match=rf"^{method} Att-SVM: cvxpy returned status None without a solution"
    ):
        solve_svm(inst, method=method)


def test_unknown_norm_message_quotes_the_given_name():
    inst = A.random_instance(3, 4, 5, seed=0)
    with pytest.raises(UnknownNameError, match=r"^unknown norm 'l1'; expected one of 'fro', 'nuc'"):
        solve_svm(inst, norm="l1")


# ================================================================ infeasibility diagnosis wording
def _convex_combination_instance() -> A.Instance:
    # x₂ = (x₀ + x₁)/2 selected: Δ₀ = −Δ₁, so ½Δ₀ᵀWz + ½Δ₁ᵀWz = 0 < 1 for every W
    X = np.array([[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 2.0]]))


def test_infeasibility_message_gives_causes_and_remedy():
    inst = _convex_combination_instance()
    tail = (
        "Typical causes: a selected token that is a convex combination of the others, or sequences with "
        "parallel queries that ask for opposite orders of the same tokens. Choose a different alpha "
        "for sequence 0."
    )
    with pytest.raises(InfeasibleSVMError, match=re.escape(tail) + "$"):
        solve_svm(inst, alpha=[2])


def test_infeasibility_message_with_exact_certificate_says_no_w_at_all():
    # When the certificate combination vanishes exactly (norm bound ∞) no W of any norm is feasible.
    inst = _convex_combination_instance()
    c = A.svm_constraints(inst, [2])
    err = InfeasibleMinNormError("test", np.array([0.5, 0.5]), np.inf)
    with pytest.raises(
        InfeasibleSVMError, match=re.escape("(Farkas certificate; a solution would need no W at all).")
    ):
        _raise_infeasible(c, err)
    err = InfeasibleMinNormError("test", np.array([0.5, 0.5]), 123.0)
    with pytest.raises(InfeasibleSVMError, match=re.escape("a solution would need ||W||_F >= 123).")):
        _raise_infeasible(c, err)


# ====================================================================== Att-SVM: nuclear norm
def test_nuclear_norm_result_fields():
    inst = A.random_instance(3, 3, 3, seed=0)
    sol = solve_svm(inst, norm="nuc")
    assert sol.certified is False
    np.testing.assert_array_equal(sol.pairs, A.svm_constraints(inst).pairs)
    assert sol.pairs.dtype == np.intp and not sol.pairs.flags.writeable
    assert sol.weakly_active == () and sol.iterations == 0 and sol.raw_rel_error is None
    assert (sol.norm, sol.method) == ("nuc", "primal")
    assert sol.solver == "cvxpy/CLARABEL (SDP) + rescaled to min margin 1"


def test_nuclear_norm_infeasible_choice_is_diagnosed():
    with pytest.raises(InfeasibleSVMError, match=r"sequence\(s\) \[0\] contradict each other"):
        solve_svm(_convex_combination_instance(), alpha=[2], norm="nuc")


def _fake_conic(monkeypatch, value, status):
    """Replace the conic solve: the matrix variable gets ``value`` and the status maps to ``status``."""

    def solve(prob, what):
        (var,) = prob.variables()
        var.save_value(np.broadcast_to(value, var.shape).copy())

    _patch_svm(monkeypatch, "_cvxpy_solve", solve)
    _patch_svm(monkeypatch, "_check_cvxpy_status", lambda prob, what: status)


def test_nuclear_norm_solver_reporting_infeasible_is_a_solver_error(monkeypatch):
    _fake_conic(monkeypatch, 0.0, "infeasible")
    with pytest.raises(SolverError, match=r"^nuclear-norm Att-SVM: cvxpy reported infeasible, but the exact"):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm="nuc")


def test_nuclear_norm_non_finite_answer_is_a_solver_error(monkeypatch):
    _fake_conic(monkeypatch, np.nan, "optimal")
    with pytest.raises(SolverError, match=r"^nuclear-norm Att-SVM: cvxpy returned non-finite values$"):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm="nuc")


def test_nuclear_norm_answer_with_nonpositive_margin_is_a_solver_error(monkeypatch):
    # W = 0 has every margin 0: rescaling by the minimum margin cannot restore feasibility
    _fake_conic(monkeypatch, 0.0, "optimal")
    with pytest.raises(SolverError, match=r"^nuclear-norm Att-SVM: the solver's W has minimum margin 0 ≤ 0$"):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm="nuc")


# =========================================================== second mutation sample: more pins
#: Tolerance of a norm bound ``bᵀc/||Aᵀc||`` evaluated on exactly representable data (a dot product and
#: the 2-norm of a vector with one nonzero entry): a few roundings, so 1e-14 relative is ~50 eps of slack.
BOUND_RTOL = 1e-14


def _inject_certificate(monkeypatch, certificate):
    """Make the Lawson–Hanson step report infeasibility with the given (row-normalised) certificate."""
    _patch_svm(
        monkeypatch,
        "_ldp_nnls",
        lambda Ln, bs, eqn: (np.zeros(Ln.shape[1]), np.zeros(bs.size), np.asarray(certificate, dtype=float)),
    )


@pytest.mark.parametrize("fraction", [0.9, 1.1])
def test_farkas_combination_is_zero_exactly_within_its_rounding_bound(monkeypatch, fraction):
    # FARKAS_ZERO_FACTOR: Σ c_r L_r counts as exactly zero (norm bound ∞) when its norm is at most
    # FARKAS_ZERO_FACTOR·(m + 1)·eps·Σ|c_r|·||L_r||. Rows L₀ = (1, 0), L₁ = (−1, δ) (||L₁|| = 1 in float64
    # since δ² < eps) and certificate c = (1, 1) give Σ c_r L_r = (0, δ) exactly, Σ|c_r|·||L_r|| = 2 and
    # m = 2: δ at 0.9× the threshold is "no W at all", at 1.1× the bound is bᵀc/δ = 2/δ.
    m = 2
    threshold = FARKAS_ZERO_FACTOR * (m + 1) * EPS * 2.0
    delta = fraction * threshold
    L = np.array([[1.0, 0.0], [-1.0, delta]])
    assert np.linalg.norm(L, axis=1).tolist() == [1.0, 1.0]  # the premise: ||L_r|| are exactly 1
    _inject_certificate(monkeypatch, [1.0, 1.0])
    with pytest.raises(InfeasibleMinNormError) as exc:
        min_norm_dual(L @ L.T, np.ones(2), factor=L)
    np.testing.assert_array_equal(exc.value.certificate, [1.0, 1.0])
    if fraction < 1:
        assert exc.value.norm_bound == np.inf
    else:
        assert exc.value.norm_bound == pytest.approx(2.0 / delta, rel=BOUND_RTOL)


def test_equality_row_contradicting_an_inequality_is_infeasible():
    # w₁ = 1 (equality) and w₁ ≥ 2 cannot both hold. The Lawson–Hanson step must enter the equality as the
    # two inequalities w₁ ≥ 1 and −w₁ ≥ −1 (entering it as w₁ ≥ ±1 would make the system feasible), so the
    # problem is declared infeasible, with the reason from the Farkas step quoted in the message.
    L = np.array([[1.0, 0.0], [1.0, 0.0]])
    with pytest.raises(
        InfeasibleMinNormError, match=r"rows \[0, 1\] cannot hold together \(the constraints "
    ):
        min_norm_dual(L @ L.T, np.array([1.0, 2.0]), [0], factor=L)
    with pytest.raises(InfeasibleMinNormError, match=re.escape("(the constraints are contradictory)")):
        min_norm_dual(L @ L.T, np.array([1.0, 2.0]), [0], factor=L)


def test_all_equality_rows_have_no_dual_feasibility_condition():
    # With every row an equality there are no sign conditions on λ: w = b (rows e₁, e₂), λ = b with a
    # negative entry, dual feasibility residual 0 and the answer certified.
    r = min_norm_dual(np.eye(2), np.array([1.0, -2.0]), [0, 1], factor=np.eye(2))
    np.testing.assert_allclose(r.coords, [1.0, -2.0], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(r.multipliers, [1.0, -2.0], rtol=0, atol=EXACT_ATOL)
    assert r.kkt.dual_feasibility == 0.0
    assert r.certified and r.support.tolist() == [0, 1] and r.weakly_active.size == 0


def test_empty_problem_is_trivial():
    # m = 0 rows: nothing constrains w, so w = 0 (k = 0 coordinates) is the certified answer.
    r = min_norm_dual(np.zeros((0, 0)), np.zeros(0))
    assert r.method == "trivial" and r.norm == 0.0 and r.certified
    assert r.multipliers.shape == (0,) and r.support.shape == (0,)


def test_rank_deficient_gram_matrix_with_negative_rounded_eigenvalue_is_accepted():
    # K = AAᵀ for 6 rows in R³ has three zero eigenvalues; rounding makes the smallest −9.7e-16 here (seed 0).
    # That is far inside the PSD tolerance (GRAM_RTOL·λ_max), so K must be accepted, and the eigen-factor
    # solution must agree with the one from the exact factor A (both certified).
    rng = np.random.default_rng(0)
    Am = rng.standard_normal((6, 3))
    b = Am @ rng.standard_normal(3) - rng.uniform(0.0, 1.0, 6)  # feasible: that point satisfies every row
    K = Am @ Am.T
    assert np.linalg.eigh(K)[0][0] < 0  # the premise: a negative rounded eigenvalue
    r = min_norm_dual(K, b)
    ref = min_norm_dual(K, b, factor=Am)
    assert r.certified and ref.certified
    np.testing.assert_allclose(
        Am.T @ r.multipliers, Am.T @ ref.multipliers, rtol=0, atol=AGREE_RTOL * ref.norm
    )
    np.testing.assert_array_equal(r.support, ref.support)


def test_kkt_residual_formulas():
    # The formulas of KKTResiduals on exact binary data: margins (1, 3), b = (1, 1), unit rows, ||w|| = 1,
    # so scales |b_r| + ||a_r||·||w|| = 2 and slacks (0, 2).
    margins, b, rn = np.array([1.0, 3.0]), np.ones(2), np.ones(2)
    ineq = np.zeros(2, dtype=bool)
    # λ = (1, 0.5): complementary slackness max_r (λ_r/max λ)·|slack_r|/scale_r = 0.5·2/2 = 0.5;
    # stationarity 0.25/||w||; gap |½ − (bᵀλ − ½·1)|/½ = |0.5 − 1|/0.5 = 1.
    r = _kkt(margins, b, ineq, rn, np.array([1.0, 0.5]), 1.0, 0.25, 1.0)
    assert r == KKTResiduals(0.0, 0.0, 0.25, 0.5, 1.0)
    # λ = (1, −0.25): dual feasibility 0.25/max|λ| = 0.25; a violated row (margin 0 < b = 1) has primal
    # residual 1/scale = 1/2.
    r = _kkt(np.array([1.0, 0.0]), b, ineq, rn, np.array([1.0, -0.25]), 1.0, 0.0, 0.0)
    assert r.dual_feasibility == 0.25 and r.primal_feasibility == 0.5
    assert r.complementary_slackness == 0.25 * 1.0 / 2.0


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(KKTResiduals)])
def test_kkt_max_covers_every_residual(name):
    # certification compares kkt.max() with CERTIFY_RTOL, so no residual may be left out of the max
    res = KKTResiduals(0.0, 0.0, 0.0, 0.0, 0.0)
    assert dataclasses.replace(res, **{name: 1.0}).max() == 1.0


def test_refinement_drops_the_most_negative_multiplier_first():
    # Rows a₀ = (−1, 1, −1), a₁ = (0, 1, 0), a₂ = (2, 2, 1), b = (2, 1, −1), all three as the hint. The
    # multipliers of the three equalities are K⁻¹b = (−4, 11, −3); on the row-normalised problem (where the
    # rule applies) they are ∝ λ_r·||a_r|| = (−4√3, 11, −9), so row 2 is the most negative and is dropped;
    # then {0, 1} gives w = (−½, 1, −½), λ = (½, ½) ≥ 0, and row 2 has slack 1.5: done in 2 steps.
    # Dropping row 0 (the first negative one) instead takes 4.
    Am = np.array([[-1.0, 1.0, -1.0], [0.0, 1.0, 0.0], [2.0, 2.0, 1.0]])
    b = np.array([2.0, 1.0, -1.0])
    r = min_norm_dual(Am @ Am.T, b, factor=Am, support_hint=[0, 1, 2])
    assert r.method == "active-set" and r.iterations == 2
    np.testing.assert_allclose(r.coords, [-0.5, 1.0, -0.5], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(r.multipliers, [0.5, 0.5, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.support.tolist() == [0, 1] and r.certified


def test_rounding_level_negative_multiplier_keeps_the_least_norm_multipliers(monkeypatch):
    # MULTIPLIER_RTOL: a negative multiplier above −MULTIPLIER_RTOL·max|λ| is rounding, so even on a
    # rank-deficient tight set (rows e₁, e₁, e₂, b = (1, 1, 0)) it must not trigger the nonnegative
    # re-representation: the least-norm multipliers (½, ½, 0) are kept (clipped to 0 in the result).
    # Injected: −½·MULTIPLIER_RTOL·max|λ| on the zero multiplier of row 2.
    real = _tight_solve

    def nudged(LS, bS):
        u, lamS, cond_K, rank = real(LS, bS)
        lamS = lamS.copy()
        lamS[-1] = -0.5 * MULTIPLIER_RTOL * np.max(np.abs(lamS))
        return u, lamS, cond_K, rank

    _patch_svm(monkeypatch, "_tight_solve", nudged)
    Am = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    r = min_norm_dual(Am @ Am.T, np.array([1.0, 1.0, 0.0]), factor=Am, support_hint=[0, 1, 2])
    assert r.method == "active-set" and r.iterations == 1
    np.testing.assert_allclose(r.multipliers, [0.5, 0.5, 0.0], rtol=0, atol=EXACT_ATOL)
    assert r.weakly_active.tolist() == [2] and r.certified


def test_residuals_equal_to_certify_rtol_still_certify(monkeypatch):
    # CERTIFY_RTOL: certified when every residual is *at most* this (boundary included).
    real = _kkt
    _patch_svm(
        monkeypatch, "_kkt", lambda *a, **kw: dataclasses.replace(real(*a, **kw), duality_gap=CERTIFY_RTOL)
    )
    sol = solve_svm(A.random_instance(3, 4, 5, seed=0))
    assert sol.kkt is not None and sol.kkt.max() == CERTIFY_RTOL
    assert sol.error_bound <= CERTIFY_RTOL and sol.certified
    Am, b = _generic(0)
    r = min_norm_dual(Am @ Am.T, b, factor=Am)
    assert r.kkt.max() == CERTIFY_RTOL and r.certified


def test_frobenius_result_names_solver_and_counts_iterations():
    inst = A.random_instance(3, 4, 5, seed=0)
    sol = solve_svm(inst, method="dual")
    assert sol.solver == "NNLS (Lawson-Hanson) on the factorised dual + exact nnls+active-set"
    assert isinstance(sol.iterations, int) and sol.iterations >= 1


@pytest.mark.parametrize("method", ["primal", "vector"])
def test_conic_solver_wrongly_reporting_infeasible_is_a_solver_error(monkeypatch, method):
    # cvxpy says "infeasible" but the exact dual finds a feasible point: the conic solver is wrong, and the
    # error must say so under the method that ran.
    _patch_svm(monkeypatch, "_cvxpy_fro", lambda inst, c, meth: (None, "infeasible"))
    msg = (
        f"{method} Att-SVM: cvxpy reported infeasible, but the exact dual finds a feasible point; "
        "the conic solver is unreliable on this instance. Use method='dual'."
    )
    with pytest.raises(SolverError, match="^" + re.escape(msg) + "$"):
        solve_svm(A.random_instance(3, 4, 5, seed=0), method=method)


@pytest.mark.parametrize(
    "norm, method, program",
    [
        ("fro", "primal", "primal Att-SVM"),
        ("fro", "vector", "vector Att-SVM"),
        ("nuc", "auto", "nuclear-norm Att-SVM"),
    ],
)
def test_conic_solver_exception_names_the_program(monkeypatch, norm, method, program):
    import cvxpy as cp

    def fail(self, *args, **kwargs):
        raise cp.error.SolverError("injected")

    monkeypatch.setattr(cp.Problem, "solve", fail)
    msg = f"{program}: the conic solver failed (injected). Use method='dual'."
    with pytest.raises(SolverError, match="^" + re.escape(msg) + "$"):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm=norm, method=method)


def _single_row_instance() -> A.Instance:
    # n = 1, T = 2, d = 2, α = 0: one constraint Δᵀ W z ≥ 1 with Δ = z = e₁
    X = np.array([[[0.0, 0.0], [-1.0, 0.0]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))


def _fake_conic_with_dual(monkeypatch, value, dual):
    """Like ``_fake_conic`` (status "optimal"), also setting the constraint's dual value."""

    def solve(prob, what):
        (var,) = prob.variables()
        var.save_value(np.asarray(value, dtype=float))
        (con,) = prob.constraints
        con.save_dual_value(np.full(con.shape, dual))

    _patch_svm(monkeypatch, "_cvxpy_solve", solve)
    _patch_svm(monkeypatch, "_check_cvxpy_status", lambda prob, what: "optimal")


def test_nuclear_norm_error_bound_is_the_relative_certified_gap(monkeypatch):
    # Conic answer W = diag(2, 1) (margin 2) is rescaled to diag(1, ½): ||W||_* = 1.5. With dual μ = 3 the
    # certified lower bound is μ/||μ Δzᵀ||₂ = 3/3 = 1, so error_bound = (1.5 − 1)/1.5 = 1/3 (relative).
    _fake_conic_with_dual(monkeypatch, np.diag([2.0, 1.0]), 3.0)
    sol = solve_svm(_single_row_instance(), alpha=[0], norm="nuc")
    np.testing.assert_allclose(sol.W, np.diag([1.0, 0.5]), rtol=0, atol=EXACT_ATOL)
    assert sol.objective == pytest.approx(1.5, rel=EXACT_ATOL)
    assert sol.error_bound == pytest.approx(1.0 / 3.0, rel=EXACT_ATOL)


def test_nuclear_norm_timings_have_the_documented_keys(monkeypatch):
    # Same stage names as the Frobenius solver; there is no active-set stage, so it takes 0 s.
    _fake_conic_with_dual(monkeypatch, np.diag([2.0, 1.0]), 3.0)
    tm = solve_svm(_single_row_instance(), alpha=[0], norm="nuc").timings
    assert set(tm) == {"solver", "active_set", "total"}
    assert tm["active_set"] == 0.0 and 0.0 <= tm["solver"] <= tm["total"]


def test_gram_eigen_factor_path_for_large_problems(monkeypatch):
    # Above MAX_FACTOR_ENTRIES the Gram matrix is factorised by an eigendecomposition and W is built from
    # the multipliers; forcing that path (limit 0) on a small instance must give the same certified W.
    inst = A.random_instance(4, 5, 6, seed=2)
    ref = solve_svm(inst)
    _patch_svm(monkeypatch, "MAX_FACTOR_ENTRIES", 0)
    sol = solve_svm(inst)
    assert ref.certified and sol.certified
    np.testing.assert_allclose(sol.W, ref.W, rtol=0, atol=AGREE_RTOL * np.linalg.norm(ref.W))


def test_min_norm_dual_factor_errors_name_the_factor():
    with pytest.raises(InvalidInstanceError, match=r"^factor must have 2 dimension\(s\); got shape \(2,\)"):
        min_norm_dual(np.eye(2), np.ones(2), factor=np.ones(2))
    with pytest.raises(InvalidInstanceError, match=r"^factor must be finite"):
        min_norm_dual(np.eye(2), np.ones(2), factor=np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(InvalidInstanceError, match=r"^factor must have m = 2 rows; got shape \(3, 2\)$"):
        min_norm_dual(np.eye(2), np.ones(2), factor=np.ones((3, 2)))


def _two_support_candidates(v: np.ndarray) -> A.Instance:
    # n = 1, z = e₁, token 0 = 0 selected: W = e₁e₁ᵀ, support = {(0, 1)} (Δ₁ = e₁), token 2 far inactive
    X = np.array([[[0.0, 0.0], [-1.0, 0.0], [-100.0, -1000.0]]])
    return A.Instance(X, np.array([1.0]), v, z=np.array([[1.0, 0.0]]))


def test_local_optimality_reasons_are_exact_sentences():
    # v = e₁: scores γ = (0, −1, −100), the one support token scores below the selected one
    rep = A.local_optimality_report(_two_support_candidates(np.array([1.0, 0.0])), [0])
    assert rep.locally_optimal
    assert rep.reason == "locally optimal: every one of the 1 support tokens scores below the selected one"
    # v = −e₁: γ = (0, 1, 100); exactly one violating pair, so no "(k violating pairs)" suffix
    rep = A.local_optimality_report(_two_support_candidates(np.array([-1.0, 0.0])), [0])
    assert rep.violating == ((0, 1),)
    assert (
        rep.reason
        == "not locally optimal: support token 1 of sequence 0 scores 1 >= the selected token 0's 0"
    )


@pytest.mark.parametrize("hint", [[np.nan], [np.inf], ["a"], [1.7], [True, False]])
def test_min_norm_dual_rejects_support_hints_that_are_not_integer_indices(hint):
    """Review finding: NaN/Inf/strings escaped as plain ValueError/OverflowError, 1.7 was silently
    truncated to row 1 and a boolean mask was read as the indices [1, 0]."""
    with pytest.raises(InvalidInstanceError, match=r"^support_hint must hold integer row indices"):
        min_norm_dual(np.eye(2), np.ones(2), support_hint=hint)


@pytest.mark.parametrize("hint", [[], [1.0], [0, 1], np.array([1], dtype=np.uint8)])
def test_min_norm_dual_accepts_integer_valued_support_hints(hint):
    sol = min_norm_dual(np.eye(2), np.ones(2), support_hint=hint)
    np.testing.assert_allclose(sol.multipliers, [1.0, 1.0], rtol=0, atol=EXACT_ATOL)  # K = I: λ = w = b


def test_nonneg_representation_survives_the_nnls_iteration_limit(monkeypatch):
    """Review finding: scipy's NNLS raises RuntimeError at its iteration limit; the helper now
    answers "no representation found" (None) instead of letting it escape min_norm_dual."""

    def limit(*args, **kwargs):
        raise RuntimeError("Maximum number of iterations reached.")

    monkeypatch.setattr(scipy.optimize, "nnls", limit)
    LS = np.array([[1.0, 0.0], [1.0, 0.0]])
    assert _nonneg_representation(LS, np.array([1.0, 0.0]), np.array([False, False])) is None


# ============================================================ third mutation sample (seed 20261201)
def test_nonneg_representation_may_give_an_equality_row_a_negative_multiplier():
    # Rows (1, 0) (equality) and (1, 0) (inequality), u = (−1, 0): u = L_Sᵀλ needs λ₀ + λ₁ = −1 with
    # λ₁ ≥ 0, so the equality row's multiplier is ≤ −1 (negative multipliers are allowed on equalities).
    LS = np.array([[1.0, 0.0], [1.0, 0.0]])
    u = np.array([-1.0, 0.0])
    lam = _nonneg_representation(LS, u, np.array([True, False]))
    assert lam is not None
    np.testing.assert_allclose(LS.T @ lam, u, rtol=0, atol=EXACT_ATOL)  # the representation itself
    assert lam[1] >= 0.0 and lam[0] <= -1.0 + EXACT_ATOL


def _scores_beyond_double_range() -> A.Instance:
    # n = 1, d = 2, tokens s·(1, 0) (selected) and s·(−1, 0), z = e₁, v = −s·e₁ with s = 2^600: the single
    # constraint is support, and the scores γ = Y·vᵀx = (−2^1200, +2^1200) are not doubles.
    s = 2.0**600
    X = np.array([[[s, 0.0], [-s, 0.0]]])
    return A.Instance(X, np.array([1.0]), np.array([-s, 0.0]), z=np.array([[1.0, 0.0]]))


def test_local_optimality_reason_quotes_scores_beyond_the_double_range():
    # Oracle: 2^1200 to three digits from Python's exact integers (decimal), no float involved.
    big = format(Decimal(2**1200), ".3g")
    assert big == "1.72e+361"
    rep = A.local_optimality_report(_scores_beyond_double_range(), [0])
    assert rep.violating == ((0, 1),)
    assert rep.reason == (
        f"not locally optimal: support token 1 of sequence 0 scores {big} >= the selected token 0's -{big}"
    )


@pytest.mark.parametrize(("x", "e"), [(1.0, 2000), (-3.0, 1200), (1.0, -2000), (-0.75, -1100)])
def test_pow2_formatting_beyond_the_double_range_ignores_numpy_error_state(x, e):
    # x·2^e overflows or underflows float64; the text comes from logarithms, so it must not depend on
    # numpy's floating-point error state (a caller may run under np.errstate(all="raise")).
    # Oracle: the exact value x·2^e in decimal arithmetic (28 digits), rounded to 3 significant digits.
    expected = format(Decimal(x) * Decimal(2) ** e, ".3g")
    with np.errstate(all="raise"):
        assert _pow2_str(x, e) == expected


def test_unsolved_nuclear_norm_program_is_named_in_the_solver_error(monkeypatch):
    # An unsolved cvxpy problem has status None: the error names the SDP that was built.
    _patch_svm(monkeypatch, "_cvxpy_solve", lambda prob, what: None)
    msg = "nuclear-norm Att-SVM: cvxpy returned status None without a solution. Use method='dual'."
    with pytest.raises(SolverError, match="^" + re.escape(msg) + "$"):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm="nuc")


def test_nuclear_norm_answer_whose_margins_overflow_is_a_solver_error(monkeypatch):
    # Δ = z = (1, 1): the unit-row margin of W = 1e308·ones is Δ̂ᵀWẑ = 2e308 = inf, so the minimum margin
    # is inf and dividing by it gives W = 0, which cannot be made feasible.
    X = np.array([[[0.0, 0.0], [-1.0, -1.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 1.0]]))
    _fake_conic(monkeypatch, 1e308, "optimal")
    msg = "nuclear-norm Att-SVM: could not restore feasibility to 1e-7"
    with pytest.raises(SolverError, match="^" + re.escape(msg) + "$"):
        solve_svm(inst, alpha=[0], norm="nuc")


def test_nuclear_norm_objective_outside_the_double_range_is_named():
    # Constraints W₀₀ ≥ 1, W₁₁ ≥ 1, W₂₂ ≥ 1 at data scale 2^-1023 (X = 2^-600·I, z = 2^-423·I): the nuclear
    # minimiser is 2^1023·I, ||W||_F = √3·2^1023 ≈ 1.56e308 is a double, ||W||_* = 3·2^1023 ≈ 2.7e308 is not.
    n = d = 3
    X = np.zeros((n, 2, d))
    X[:, 0, :] = np.ldexp(np.eye(d), -600)
    z = np.ldexp(np.eye(d), -423)
    inst = A.Instance(X, np.ones(n), np.ones(d), z=z)
    with pytest.raises(
        NumericalError,
        match=r"^the nuclear-norm Att-SVM objective \|\|W\|\|_\* is about 1e\+308: it overflows",
    ):
        solve_svm(inst, alpha=[0, 0, 0], norm="nuc")


def test_equality_index_out_of_range_message_quotes_the_valid_range():
    msg = "equality row indices must lie in [0, 1]; got [2]"
    with pytest.raises(InvalidInstanceError, match="^" + re.escape(msg) + "$"):
        min_norm_dual(np.eye(2), np.ones(2), [2])


def test_gram_with_an_off_diagonal_entry_far_beyond_its_diagonal_is_not_psd():
    # |K_01| = 1e308 against sqrt(K_00·K_11) = 1e-300: no Gram matrix has that (Cauchy–Schwarz).
    K = np.array([[1e-300, 1e308], [1e308, 1e-300]])
    msg = (
        "K must be positive semidefinite (a Gram matrix AAᵀ): an off-diagonal entry exceeds "
        "sqrt(K_rr·K_ss) by far. Pass K = A @ A.T, or a factor."
    )
    with pytest.raises(InvalidInstanceError, match="^" + re.escape(msg) + "$"):
        min_norm_dual(K, np.ones(2))


def test_inequality_rhs_far_below_the_binding_scale_is_vacuous_and_silent():
    # K = I, b = (2^-1000, −2^1000): row 1 holds at w = 0 (a huge negative right-hand side), so
    # w = λ = (2^-1000, 0) exactly; rescaling b to the binding row's scale overflows row 1's entry, which
    # must be handled without a floating-point warning (warnings from attnsvm are errors here).
    b = np.array([2.0**-1000, -(2.0**1000)])
    r = min_norm_dual(np.eye(2), b)
    np.testing.assert_array_equal(r.coords @ r.factor.T, [2.0**-1000, 0.0])  # margins a_rᵀw with A = I
    np.testing.assert_array_equal(r.multipliers, [2.0**-1000, 0.0])
    assert r.norm == 2.0**-1000 and r.certified


def test_equality_rhs_far_below_the_binding_scale_is_not_clamped():
    # K = I, b = (1, −2^100), row 1 an equality: w = λ = b exactly (A = I). Only inequality right-hand
    # sides far below the scale are vacuous; an equality one must hold as given.
    b = np.array([1.0, -(2.0**100)])
    r = min_norm_dual(np.eye(2), b, [1])
    np.testing.assert_array_equal(r.margins, b)
    np.testing.assert_array_equal(r.multipliers, b)
    assert r.certified


def test_multiplier_equal_to_the_smallest_normal_double_is_returned():
    # One row a = 2^511 (K = 2^1022), b = 1: w = b/a = 2^-511 and λ = b/a² = 2^-1022 = FLOAT_TINY exactly,
    # the smallest normal double, so it is returned (not a range error).
    r = min_norm_dual(np.array([[2.0**1022]]), np.array([1.0]))
    assert r.multipliers.tolist() == [2.0**-1022] and r.norm == 2.0**-511


def test_subnormal_multiplier_is_a_range_error_naming_the_multiplier():
    # As above with b = ½: λ = 2^-1023 is subnormal (not a normal double), ||w|| = 2^-512 is fine.
    msg = (
        r"^the multiplier λ_0 of min_norm_dual is about 1e-308: it underflows .*"
        r"\. rescale K or b \(λ scales with b and with 1/K\)$"
    )
    with pytest.raises(NumericalError, match=msg):
        min_norm_dual(np.array([[2.0**1022]]), np.array([0.5]))


def test_overflowing_margin_of_a_slack_row_is_a_range_error_naming_the_margin():
    # Rows a₀ = e₁ and a₁ = 2^511·e₁ (K = [[1, 2^511], [2^511, 2^1022]]), b = (2^600, 0): w = 2^600·e₁ is a
    # double, but the slack row's margin a₁ᵀw = 2^1111 is not.
    K = np.array([[1.0, 2.0**511], [2.0**511, 2.0**1022]])
    with pytest.raises(
        NumericalError, match=r"^the margin a_1ᵀw of min_norm_dual is about 1e\+334: it overflows"
    ):
        min_norm_dual(K, np.array([2.0**600, 0.0]))


def test_least_norm_range_error_gives_the_remedy():
    with pytest.raises(NumericalError, match=r"\. rescale b \(w scales with b\)$"):
        min_norm_dual(np.array([[1e-20]]), np.array([1e300]))


def test_error_bound_equal_to_certify_rtol_still_certifies(monkeypatch):
    # CERTIFY_RTOL: certified when the error bound is *at most* this (boundary included).
    real = _core
    _patch_svm(monkeypatch, "_core", lambda *a: dataclasses.replace(real(*a), error_bound=CERTIFY_RTOL))
    Am, b = _generic(0)
    r = min_norm_dual(Am @ Am.T, b, factor=Am)
    assert r.error_bound == CERTIFY_RTOL and r.certified


def test_eigen_factor_keeps_eigenvalues_above_its_rank_cut_only():
    # The eigendecomposition factor drops eigenvalues below 16·m·eps·λ_max (rounding of a PSD matrix).
    # A diagonal K has exact eigenvalues: 16.5·m·eps is kept, 15.5·m·eps dropped (m = 2).
    m = 2
    keep = np.diag([1.0, 16.5 * m * EPS])
    L = _factor_from_gram(keep)
    assert L.shape == (2, 2)
    np.testing.assert_allclose(L @ L.T, keep, rtol=0, atol=EXACT_ATOL)
    assert _factor_from_gram(np.diag([1.0, 15.5 * m * EPS])).shape == (2, 1)


def test_empty_problem_with_a_factor_is_trivial():
    r = min_norm_dual(np.zeros((0, 0)), np.zeros(0), factor=np.zeros((0, 2)))
    assert r.method == "trivial" and r.norm == 0.0 and r.certified


def test_factor_of_a_zero_gram_matrix_must_be_zero():
    # K = 0 (every row zero) but the factor's row has norm 1e-6: L Lᵀ = 1e-12 ≠ 0 = K. Tiny, but K has no
    # scale to be relative to, so it is a mismatch.
    with pytest.raises(InvalidInstanceError, match=r"^factor L does not satisfy L @ L\.T == K"):
        min_norm_dual(np.zeros((1, 1)), np.zeros(1), factor=np.array([[1e-6]]))


def _near_tie(gap: float) -> A.Instance:
    # n = 1, T = 2, d = 2, v = z = e₁: tokens (1, 0) (selected) and (1 − gap, 0); the only constraint is
    # support, and the scores differ by exactly gap; the tie tolerance is TIE_RTOL·||v||·max||x|| = TIE_RTOL.
    X = np.array([[[1.0, 0.0], [1.0 - gap, 0.0]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))


def test_score_difference_against_the_tie_tolerance():
    # TIE_RTOL = 64 eps (documented in attnsvm.model._instance): a gap of 128 eps is strict, one of 32 eps a tie.
    assert A.local_optimality_report(_near_tie(2 * TIE_RTOL), [0]).locally_optimal
    rep = A.local_optimality_report(_near_tie(TIE_RTOL / 2), [0])
    assert rep.feasible and not rep.locally_optimal and rep.violating == ((0, 1),)


def test_zero_row_infeasibility_message_is_the_full_sentence():
    L = np.array([[1.0, 0.0], [0.0, 0.0]])
    msg = (
        "min-norm problem infeasible: rows [1] cannot hold together (row 1 is identically zero but asks for "
        "≥ 2); the combination Σ c_r a_r with certificate c ≥ 0 vanishes while Σ c_r b_r > 0, so any "
        "solution would need ||w|| ≥ inf. Drop or relax one of these rows."
    )
    with pytest.raises(InfeasibleMinNormError, match="^" + re.escape(msg) + "$"):
        min_norm_dual(L @ L.T, np.array([1.0, 2.0]), factor=L)


def test_infeasibility_bound_beyond_the_double_range_is_inf_and_quoted_from_logarithms():
    # Rows (1, 0) and (−1, 1e-9), b = 2^1000·(1, 1): w₁ ≥ 2^1000 and w₂ ≥ 2·2^1000/1e-9, beyond the norm the
    # solver accepts, so a Farkas certificate c ≈ (1, 1) is returned with ||w|| ≥ bᵀc/||Aᵀc|| ≈ 2^1001/1e-9
    # ≈ 2.14e310: not a double (norm_bound = inf), quoted in the message, and no overflow warning.
    A_ = np.array([[1.0, 0.0], [-1.0, 1e-9]])
    expected = format(Decimal(2) ** 1001 / Decimal("1e-9"), ".3g")
    assert expected == "2.14e+310"
    with pytest.raises(InfeasibleMinNormError, match=re.escape(f"||w|| ≥ {expected}. Drop")) as exc:
        min_norm_dual(A_ @ A_.T, np.ldexp(np.ones(2), 1000), factor=A_)
    assert exc.value.norm_bound == np.inf


def test_local_optimality_refuses_an_uncertified_solution_with_the_documented_sentence(monkeypatch):
    # Inflate one KKT residual to 1: the solution is then not certified and no verdict may be given.
    real = _kkt
    _patch_svm(monkeypatch, "_kkt", lambda *a, **kw: dataclasses.replace(real(*a, **kw), duality_gap=1.0))
    msg = (
        r"^cannot decide local optimality: the Att-SVM\(alpha\) solution is not certified \(error bound "
        r"\S+, largest relative KKT residual 1 > 1e-09\), so its support tokens are uncertain\. The instance "
        r"is degenerate or too badly conditioned; perturb the data or choose another alpha\.$"
    )
    with pytest.raises(SolverError, match=msg):
        A.local_optimality_report(A.random_instance(3, 4, 5, seed=0))


# ============================================== behaviours pinned for the svm mutation run (issue 13 §4)
def test_nuclear_norm_with_a_frobenius_only_method_is_refused_with_the_documented_sentence():
    """Oracle: the documented error text (the remedy must name the methods that do solve norm='nuc')."""
    msg = (
        "method='dual' solves the Frobenius-norm Att-SVM only (its dual/vector form needs ||W||_F); "
        "use method='primal' or 'auto' with norm='nuc'."
    )
    with pytest.raises(A.AttnSVMError, match="^" + re.escape(msg) + "$"):
        solve_svm(A.random_instance(2, 3, 2, seed=0), norm="nuc", method="dual")


def test_an_inconsistent_support_hint_is_refused_and_the_exact_optimum_returned():
    """Oracle: the hand-derived optimum of a 3-row problem with two parallel rows.

    Rows ``w₁ ≥ 1``, ``w₁ ≥ 2``, ``w₂ ≥ ½``: the least-norm point is ``w = (2, ½)`` with multipliers
    ``λ = (0, 2, ½)`` (row 0 is implied by row 1). The hint ``{0, 1}`` makes the tight system
    ``w₁ = 1, w₁ = 2`` inconsistent; its least-squares point ``w₁ = 1.5`` violates row 1, so the hint must
    be refused, not polished into an infeasible answer.
    """
    L = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    sol = min_norm_dual(L @ L.T, np.array([1.0, 2.0, 0.5]), factor=L, support_hint=[0, 1])
    assert sol.certified
    np.testing.assert_allclose(sol.coords, [2.0, 0.5], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(sol.multipliers, [0.0, 2.0, 0.5], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(sol.margins, [2.0, 2.0, 0.5], rtol=0, atol=EXACT_ATOL)


def test_farkas_certificate_of_an_equality_row_keeps_its_sign():
    """Oracle: the exact Farkas certificate of ``w₁ = −1`` (equality) and ``w₁ ≥ 0``.

    ``c = (−1, 1)``: ``Σ c_r a_r = −e₁ + e₁ = 0`` and ``Σ c_r b_r = 1 > 0``; the equality's weight may (and
    here must) be negative, the inequality's is ≥ 0. Normalised to ``max|c| = 1`` it is (−1, 1) to the
    NNLS's rounding (EXACT_ATOL; measured 4.4e-16).
    """
    L = np.array([[1.0, 0.0], [1.0, 0.0]])
    b = np.array([-1.0, 0.0])
    with pytest.raises(InfeasibleMinNormError, match="the constraints are contradictory") as exc:
        min_norm_dual(L @ L.T, b, equality=[0], factor=L)
    c = exc.value.certificate
    np.testing.assert_allclose(c, [-1.0, 1.0], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(L.T @ c, [0.0, 0.0], rtol=0, atol=EXACT_ATOL)  # the combination vanishes
    assert b @ c > 0
    assert exc.value.norm_bound == np.inf


def test_margin_overflow_names_the_overflowing_constraint_and_its_size():
    """Oracle: a hand-derived instance and the margin's exact decimal value.

    One sequence, ``z = e₁``, ``α = 0``: ``Δ₁ = (½, 0)`` binds (``W₁₁ = 2``, ``||W_mm|| = 2``, representable),
    while ``Δ₂ = (1 + 1.7e308, 0)`` has margin ``2·(1 + 1.7e308) = 3.4e308``: beyond float64, so the
    scale contract must raise naming constraint (0, 2) (not the finite one, (0, 1)) and ``1e+309``.
    """
    X = np.array([[[1.0, 0.0], [0.5, 0.0], [-1.7e308, 0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))
    margin = Decimal(2) * (Decimal(1) + Decimal("1.7e308"))
    k = round(margin.log10())
    assert k == 309
    msg = f"the margin Δ_itᵀ W_mm z_i of constraint (i, t) = (0, 2) is about 1e+{k}: it overflows"
    with pytest.raises(NumericalError, match="^" + re.escape(msg)):
        solve_svm(inst, [0])


#: KKT residuals recomputed from their definitions (KKTResiduals) at the caller's scale: both sides are
#: O(1) ratios of exactly rescaled quantities (powers of two) whose roundings differ by a few eps; 1e-12
#: leaves ~5000 eps, while each misreading of the definition changes a residual by a factor ≥ 2.
KKT_DEF_RTOL = 1e-12


def test_min_norm_kkt_residuals_of_an_injected_point_follow_their_definitions(monkeypatch):
    """Oracle: the definitions in :class:`KKTResiduals`, evaluated by hand on the problem as posed.

    Rows ``a₀ = (1, 0)`` (equality, ``b₀ = 1``) and ``a₁ = (0, 4)`` (``≥ 2``). The exact core is replaced
    (fault injection) by ``w = (1 + δ, ½)`` and scaled-problem multipliers ``λ' = (½, −½)``; the solver
    equilibrates row r by ``2^{−k_r}`` (``k = (1, 3)``), so the multipliers as posed are
    ``λ = 2^{−k}λ' = (¼, −1/16)``. Then: primal feasibility = ``δ/(1 + ||w||)`` (the equality row's
    *positive* slack counts), dual feasibility = ``(1/16)/(¼) = ¼`` (relative to ``max|λ|`` as posed),
    complementary slackness = the same ``δ/(1 + ||w||)`` (row 0 has the largest ``|λ|``, row 1 slack 0).
    """
    delta = 2.0**-10
    w = np.array([1.0 + delta, 0.5])
    _patch_svm(
        monkeypatch,
        "_core",
        lambda L, b, eq, hint: _Core(w.copy(), np.array([0.5, -0.5]), 0.0, 1, "injected"),
    )
    Amat = np.array([[1.0, 0.0], [0.0, 4.0]])
    sol = min_norm_dual(Amat @ Amat.T, np.array([1.0, 2.0]), equality=[0], factor=Amat)
    np.testing.assert_array_equal(sol.coords, w)  # the injected point, at the caller's scale (Gb = 0)
    pf = delta / (1.0 + float(np.hypot(1.0 + delta, 0.5)))
    assert sol.kkt.primal_feasibility == pytest.approx(pf, rel=KKT_DEF_RTOL)
    assert sol.kkt.dual_feasibility == pytest.approx(0.25, rel=KKT_DEF_RTOL)
    assert sol.kkt.complementary_slackness == pytest.approx(pf, rel=KKT_DEF_RTOL)
    assert not sol.certified


def test_att_svm_primal_feasibility_of_a_shrunk_solution_follows_its_definition(monkeypatch):
    """Oracle: ``max_r max(0, 1 − Δ_rᵀWz_i)/(1 + ||Δ_r||·||z_i||·||W||_F)`` from the data as given.

    The exact core's point is shrunk by 15/16 (fault injection): every binding margin drops to 15/16, and
    the residual of each row is measured with its own ``||Δ_r||·||z_i||`` (rows of different lengths
    here: ``Δ = (1, 0)`` and ``(0, 3)``, and a second sequence with query ``(0, 2)``).
    """
    real = _core
    _patch_svm(
        monkeypatch,
        "_core",
        lambda *a: dataclasses.replace(real(*a), u=real(*a).u * (15.0 / 16.0), method="shrunk"),
    )
    X = np.array(
        [
            [[1.0, 0.0], [0.0, 0.0], [1.0, -3.0]],
            [[0.0, 1.0], [0.0, -0.5], [2.0, 1.0]],
        ]
    )
    z = np.array([[1.0, 1.0], [0.0, 2.0]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([1.0, 0.0]), z=z)
    sol = solve_svm(inst, [0, 0], method="dual")
    W = np.asarray(sol.W)
    wn = float(np.linalg.norm(W))
    pf = 0.0
    for i, t in np.asarray(sol.pairs):
        d = X[i, 0] - X[i, t]
        pf = max(
            pf,
            max(0.0, 1.0 - float(d @ W @ z[i]))
            / (1.0 + float(np.linalg.norm(d) * np.linalg.norm(z[i])) * wn),
        )
    assert pf > 0.01  # the injected point violates the binding rows by 1/16 of their margin
    assert sol.kkt.primal_feasibility == pytest.approx(pf, rel=KKT_DEF_RTOL)
    assert not sol.certified


def test_a_factor_entry_flushed_by_equilibration_raises_no_underflow_warning():
    """Oracle: the hand-derived optimum of rows ``(2^500, 2^-600)`` and ``(0, 1)``, both ``≥ 1``.

    ``w = (2^-500·(1 − 2^-600), 1)``, i.e. ``(2^-500, 1)`` in float64. Equilibrating row 0 by ``2^-501``
    flushes its ``2^-600`` entry below ``2^-1074`` (documented as negligible); that must happen silently
    even when the caller has NumPy warn on underflow (warnings are errors here).
    """
    Lu = np.array([[2.0**500, 2.0**-600], [0.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(under="warn"):
            sol = min_norm_dual(Lu @ Lu.T, np.array([1.0, 1.0]), factor=Lu)
    assert sol.certified
    np.testing.assert_array_equal(sol.coords, [2.0**-500, 1.0])


def test_a_raw_conic_solution_beyond_the_double_range_is_dropped_without_a_warning():
    """Oracle: the hand-derived ``W₁₁ = 1/(Δ₁z₁) = 2^1024/(1 + 2^-52)``, one ulp below ``2^1024``.

    One constraint, ``Δ = (2^-1022, 0)``, ``z = (¼(1 + 2^-52), 0)``: ``W_mm = W₁₁e₁e₁ᵀ`` with ``W₁₁`` =
    1.7976931348623155e308 (rounded), representable. The conic solver's raw answer carries ~1e-10 relative
    error (measured 1.2e-10, above the exact one with Clarabel), so at the data's scale it may not be a
    double: ``W_raw`` is then ``None`` — never ``inf`` and never an overflow warning.
    """
    X = np.array([[[2.0**-1022, 0.0], [0.0, 0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[0.25 * (1 + 2.0**-52), 0.0]]))
    w11 = Decimal(2) ** 1024 / (Decimal(1) + Decimal(2) ** -52)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = solve_svm(inst, [0], method="primal")
    assert sol.certified
    assert float(sol.W[0, 0]) == pytest.approx(float(w11), rel=CERTIFY_RTOL)
    assert sol.W_raw is None or bool(np.all(np.isfinite(sol.W_raw)))


def test_the_most_violated_row_is_added_even_when_a_lesser_violation_comes_first():
    """Oracle: the documented rule of the refinement, traced by hand on three rows.

    Rows ``e₁ ≥ 1``, ``e₂ ≥ 0.1``, ``e₂ ≥ 5`` with hint ``{0}``: at ``w = e₁`` row 1 is violated by 0.1
    (relative 0.1/1.1) and row 2 by 5 (relative 5/6); adding row 2 (the most violated, listed last) gives
    ``w = (1, 5)`` where row 1 holds: 2 iterations, no fallback. Adding row 1 first would end in the
    inconsistent tight set ``{e₂ = 0.1, e₂ = 5}`` and the NNLS fallback.
    """
    Am = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    r = min_norm_dual(Am @ Am.T, np.array([1.0, 0.1, 5.0]), factor=Am, support_hint=[0])
    assert r.method == "active-set" and r.iterations == 2
    np.testing.assert_allclose(r.coords, [1.0, 5.0], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(r.multipliers, [1.0, 0.0, 5.0], rtol=0, atol=EXACT_ATOL)
    assert r.certified


# ================================== an honest certificate of the dense dual (issue 13 §1: error_bound)
#: mpmath precision of the exact two-row optima (50 digits: every float64 input is exact there, and the
#: closed forms lose at most a few digits to the cancellation 1 − c).
MP_DPS = 50
#: ``error_bound`` is first order with no constant (``cond·eps``): at the rounding floor the returned entries
#: carry their own rounding (one ldexp and a few products each, d = 2), a few eps of ||W||. 8·eps covers it
#: and is far below every error the defect produced (≥ 1e-11).
BOUND_FLOOR = 8 * float(np.finfo(np.float64).eps)


def _one_sequence(rows):
    """One sequence, query ``e₁``, selected token 0 at the origin, tokens ``−Δ_t``: constraints ``Δ_tᵀw ≥ 1``
    on the first column ``w`` of ``W`` (d = 2; the second column is 0 at the optimum)."""
    X = np.zeros((1, len(rows) + 1, 2))
    for t, dl in enumerate(rows, start=1):
        X[0, t] = -np.asarray(dl, dtype=float)
    return A.Instance(X, np.ones(1), np.array([1.0, 0.0]), np.array([[1.0, 0.0]]))


def _mp_rel_err(W, w_exact):
    """``||W − w e₁ᵀ||_F/||w||`` in mpmath."""
    import mpmath as mp

    W = np.asarray(W)
    num = sum((mp.mpf(float(W[k, 0])) - w_exact[k]) ** 2 + mp.mpf(float(W[k, 1])) ** 2 for k in range(2))
    return float(mp.sqrt(num) / mp.sqrt(sum(v**2 for v in w_exact)))


def _two_row_optimum(c, e):
    """``argmin ||w|| s.t. w₁ ≥ 1, c·w₁ + e·w₂ ≥ 1`` (``e > 0``) in mpmath: the least-norm feasible point among the
    three active-set candidates (row 1 alone, row 2 alone, both; both is always feasible)."""
    import mpmath as mp

    mp.mp.dps = MP_DPS
    cm, em = mp.mpf(c), mp.mpf(e)
    cands = [[mp.mpf(1), (1 - cm) / em]]
    if cm >= 1:
        cands.append([mp.mpf(1), mp.mpf(0)])
    r2 = [cm / (cm**2 + em**2), em / (cm**2 + em**2)]
    if r2[0] >= 1:
        cands.append(r2)
    return min(cands, key=lambda v: v[0] ** 2 + v[1] ** 2)


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("gap, e", [(1e-14, 1e-7), (1e-15, 10.0**-7.5)])
def test_dense_dual_bound_covers_a_row_violated_below_rounding(gap, e, first):
    """Oracle: the exact optimum in mpmath at 50 digits. Rows ``(c, e)`` and ``(1, 0)``, ``c = 1 − gap``: both
    bind, ``W_mm = (1, gap/e)e₁ᵀ``. The refinement solves ``(c, e)`` alone and accepts ``(1, 0)``, violated by
    ~1e-17 (below rounding), amplified by ``1/σ_min ≈ 1/e``: ``W = (1, e)e₁ᵀ``, 8e-11 (resp. 2.5e-11) from the
    truth. It used to be certified with ``error_bound = 2.2e-16``; now the bound covers the error (and the
    ~3e-15/e it must allow for a slack of unknown sign exceeds CERTIFY_RTOL: not certified)."""
    c = 1.0 - gap
    sol = solve_svm(
        _one_sequence([(1.0, 0.0), (c, e)] if first else [(c, e), (1.0, 0.0)]), [0], method="dual"
    )
    err = _mp_rel_err(sol.W, _two_row_optimum(c, e))
    assert err <= sol.error_bound + BOUND_FLOOR
    assert sol.certified == (sol.error_bound <= CERTIFY_RTOL)


@pytest.mark.parametrize("method", ["primal", "vector"])
def test_held_negative_multiplier_from_a_conic_hint_enters_the_bound(method):
    """Oracle: the hand solution ``W_mm = e₁e₁ᵀ`` (the row ``Δ_a = (1, √3)/(1 − g)`` has margin ``1/(1 − g) > 1``
    there, so only ``Δ_b = (1, 0)`` binds), compared in mpmath. The conic answer puts both rows in the hint (slack
    ``g ≤ HINT_SLACK``), and the refinement keeps ``λ_a ≈ −4e-10·λ_b`` (within ``MULTIPLIER_RTOL``) as an
    equality: ``W`` is ``g/√3 ≈ 3.5e-10`` from ``W_mm``. The certificate used to claim ``cond·eps = 6.7e-16``; now
    ``error_bound ≥`` the true error (it adds ``||λ_N||₁/||Ŵ||``). The dense dual (NNLS start) is exact here."""
    import mpmath as mp

    mp.mp.dps = MP_DPS
    g = 6e-10
    X = np.zeros((2, 2, 2))
    X[0, 1] = -np.array([1.0 / (1.0 - g), np.sqrt(3.0) / (1.0 - g)])
    X[1, 1] = -np.array([1.0, 0.0])
    inst = A.Instance(X, np.ones(2), np.array([1.0, 0.0]), np.array([[1.0, 0.0], [1.0, 0.0]]))
    sol = solve_svm(inst, [0, 0], method=method)
    err = _mp_rel_err(sol.W, [mp.mpf(1), mp.mpf(0)])
    assert err > 1e3 * float(np.finfo(np.float64).eps)  # the construction: the held multiplier moves W
    assert err <= sol.error_bound + BOUND_FLOOR
    assert sol.certified == (sol.error_bound <= CERTIFY_RTOL)
    exact = solve_svm(inst, [0, 0], method="dual")
    assert _mp_rel_err(exact.W, [mp.mpf(1), mp.mpf(0)]) <= exact.error_bound + BOUND_FLOOR


@settings(max_examples=100, deadline=None, database=None)
# the reported defects (issue 13 §1): a violation below rounding amplified by 1/σ_min, certified at 2.2e-16
@example(p_gap=-14.0, sign=1.0, p_e=-7.0, first=False)
@example(p_gap=-15.0, sign=1.0, p_e=-7.5, first=False)
@given(
    p_gap=st.floats(-16.0, -8.0),
    sign=st.sampled_from([1.0, -1.0]),
    p_e=st.floats(-8.0, 0.0),
    first=st.booleans(),
)
def test_dense_dual_two_row_error_bound_is_an_upper_bound(p_gap, sign, p_e, first):
    """Oracle: the exact optimum in mpmath at 50 digits (:func:`_two_row_optimum`). Rows ``(1, 0)`` and
    ``(1 − g, e)``, ``g = ±10^p_gap``, ``e = 10^p_e``, in either order: nearly parallel rows, violations below
    rounding, either row alone or both binding. ``W`` is within ``error_bound`` of the exact answer (certified
    or not), and ``certified`` iff the bound is ≤ CERTIFY_RTOL (the KKT residuals are at rounding here). No
    discards: the exact least norm is ≤ √2 over this range (``g/e ≤ 1``, or ``(1, 0)`` feasible when ``c ≥ 1``),
    so every example is feasible and solved."""
    c, e = 1.0 - sign * 10.0**p_gap, 10.0**p_e
    w = _two_row_optimum(c, e)
    sol = solve_svm(
        _one_sequence([(1.0, 0.0), (c, e)] if first else [(c, e), (1.0, 0.0)]), [0], method="dual"
    )
    event(f"certified={sol.certified}")
    assert _mp_rel_err(sol.W, w) <= sol.error_bound + BOUND_FLOOR
    assert sol.certified == (sol.error_bound <= CERTIFY_RTOL)


# --- issue 13 §4 sprint (svm2): messages of rarely reached errors --------------------------------


def test_unknown_method_message_names_the_solver_method_argument():
    """Oracle: the documented message of :func:`attnsvm.errors.unknown_name` (``unknown <what> <given!r>``);
    the argument is named in the words the API uses, lower case."""
    inst = A.random_instance(3, 4, 5, seed=0)
    with pytest.raises(UnknownNameError, match=r"^unknown solver method 'simplex'; expected one of "):
        solve_svm(inst, method="simplex")


def test_min_norm_dual_support_hint_message_quotes_the_hint_given():
    """Oracle: the documented message — the rejected ``support_hint`` is quoted back as given."""
    with pytest.raises(InvalidInstanceError, match=r"got array\(\[1\.7\]\)"):
        min_norm_dual(np.eye(2), np.ones(2), support_hint=[1.7])


def test_min_norm_dual_not_psd_message_reports_the_negative_eigenvalue():
    """Oracle: hand-solved spectrum. ``K = [[1, 2], [2, 1]]`` has eigenvalues −1 and 3 (any exact power-of-two
    equilibration keeps their signs): the message must report the smallest, a negative number."""
    with pytest.raises(InvalidInstanceError, match=r"smallest eigenvalue is -\d"):
        min_norm_dual(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2))


#: One binding row: the nuclear-norm optimum is ``1/(|Δ|·|z|)`` and the dual certificate
#: ``β·μ/||μ Δ̂ ẑᵀ||₂`` is exact up to a handful of roundings (one product, one 2-norm, one division):
#: 64·eps ≈ 1.4e-14 leaves ~20× over that.
NUC_ONE_ROW_GAP = 64 * np.finfo(float).eps


@pytest.mark.parametrize("delta", [0.99, 0.75, 0.5])
@pytest.mark.parametrize("zq", [0.99, 0.75, 0.5])
def test_nuclear_one_row_gap_is_certified_at_rounding(delta, zq):
    """Oracle: hand-solved instance in exact Fractions. One sequence, one constraint ``δ·W₁₁·ζ ≥ 1``
    (``Δ = (δ, 0)``, ``z = (ζ, 0)``, mantissas in ``[½, 1)``; at ``δ = ζ = 0.99`` the certificate's operator
    norm ``||μ Δ̂ ẑᵀ||₂`` is in ``(0, 1]``, the case a ``> 1`` test would drop to the trivial lower bound 0):
    ``min ||W||_* = 1/(δζ)``. The reported gap (``error_bound``) must be at rounding level, and the objective
    within it of the exact value."""
    from fractions import Fraction

    X = np.zeros((1, 2, 2))
    X[0, 1] = (-delta, 0.0)
    inst = A.Instance(X, np.ones(1), np.array([1.0, 0.0]), np.array([[zq, 0.0]]))
    sol = solve_svm(inst, [0], norm="nuc")
    exact = 1 / (Fraction(delta) * Fraction(zq))
    assert sol.error_bound <= NUC_ONE_ROW_GAP
    assert (
        abs(Fraction(sol.objective) - exact)
        <= (Fraction(sol.error_bound) + Fraction(NUC_ONE_ROW_GAP)) * exact
    )


def test_nuclear_norm_solver_reporting_infeasible_message_is_complete(monkeypatch):
    """Oracle: the documented message, in full (fault injection: the conic solver reports infeasible)."""
    _fake_conic(monkeypatch, 0.0, "infeasible")
    with pytest.raises(
        SolverError,
        match=r"^nuclear-norm Att-SVM: cvxpy reported infeasible, but the exact Frobenius dual finds a feasible "
        r"point \(the constraint sets are the same\); the conic solver failed\.$",
    ):
        solve_svm(A.random_instance(3, 3, 3, seed=0), norm="nuc")


def test_nnls_iteration_limit_on_the_dual_is_a_solver_error(monkeypatch):
    """Oracle: the documented message (fault injection: scipy's NNLS hits its iteration limit, which it
    reports as ``RuntimeError``); the cause is named and scipy's own text is quoted."""

    def stuck(*args, **kwargs):
        raise RuntimeError("Maximum number of iterations reached.")

    monkeypatch.setattr(scipy.optimize, "nnls", stuck)
    K, b = _generic(0)
    with pytest.raises(
        SolverError, match=r"^NNLS did not converge on the dual \(Maximum number of iterations reached\.\)"
    ):
        min_norm_dual(K @ K.T, b)


# ========================= min_norm_dual's error_bound covers rounding-level rows (issue 16, scale contract)
def _mp_rel_err_vec(w, w_exact):
    """``||w − w_exact||/||w_exact||`` in mpmath (``w`` a float vector, ``w_exact`` mpf)."""
    import mpmath as mp

    num = sum((mp.mpf(float(w[k])) - w_exact[k]) ** 2 for k in range(len(w_exact)))
    return float(mp.sqrt(num) / mp.sqrt(sum(v**2 for v in w_exact)))


@pytest.mark.parametrize(
    ("gap", "e", "first"), [(1e-14, 1e-7, False), (1e-14, 1e-7, True), (1e-15, 10.0**-7.5, False)]
)
def test_min_norm_dual_bound_covers_a_row_violated_below_rounding(gap, e, first):
    """Oracle: the exact optimum in mpmath at 50 digits (:func:`_two_row_optimum`). ``min_norm_dual`` on rows
    ``(1, 0)`` and ``(c, e)``, ``c = 1 − gap``, ``b = 1``, with the rows as factor: the refinement holds one row
    tight (one nonzero multiplier, so ``cond(K_S) = 1`` and the bound it reported was ``cond(K_S)·eps``, a few
    eps) and accepts the other, violated below rounding and amplified by ``1/σ_min ≈ 1/e``: the true error
    (2.5e-11 to 8e-11) exceeds that old bound by 1e5, and must be within the new one (``solve_svm``'s
    ``_fro_error_bound``: the smallest correction for rows within rounding of 0), which is above
    CERTIFY_RTOL, so the answer is not certified."""
    c = 1.0 - gap
    Am = np.array([(1.0, 0.0), (c, e)] if first else [(c, e), (1.0, 0.0)])
    r = min_norm_dual(Am @ Am.T, np.ones(2), factor=Am)
    err = _mp_rel_err_vec(r.coords, _two_row_optimum(c, e))
    assert np.count_nonzero(r.multipliers) == 1  # one tight row: cond(K_S) = 1, the old bound ≈ eps
    assert err > 1e4 * EPS  # the old bound was exceeded by far
    assert err <= r.error_bound + BOUND_FLOOR
    assert not r.certified and r.error_bound > CERTIFY_RTOL


@settings(max_examples=100, deadline=None, database=None)
@example(p_gap=-14.0, sign=1.0, p_e=-7.0, first=False, scale=0)
@example(p_gap=-15.0, sign=1.0, p_e=-7.5, first=True, scale=0)
@given(
    p_gap=st.floats(-16.0, -8.0),
    sign=st.sampled_from([1.0, -1.0]),
    p_e=st.floats(-8.0, 0.0),
    first=st.booleans(),
    scale=st.integers(-400, 400),
)
def test_min_norm_dual_two_row_error_bound_is_an_upper_bound(p_gap, sign, p_e, first, scale):
    """Oracle: the exact optimum in mpmath at 50 digits, moved by the exact scaling (rows ``× 2^scale``:
    ``w → 2^−scale·w``). As :func:`test_dense_dual_two_row_error_bound_is_an_upper_bound`, through
    ``min_norm_dual`` with the rows as factor: ``coords`` within ``error_bound`` of the exact answer (certified or
    not) and ``certified`` iff the bound is ≤ CERTIFY_RTOL (the KKT residuals are at rounding). No discards:
    every example is feasible (the exact least norm is ≤ √2 over this range)."""
    c, e = 1.0 - sign * 10.0**p_gap, 10.0**p_e
    w = [x * 2**-scale for x in _two_row_optimum(c, e)]
    Am = np.ldexp(np.array([(1.0, 0.0), (c, e)] if first else [(c, e), (1.0, 0.0)]), scale)
    r = min_norm_dual(Am @ Am.T, np.ones(2), factor=Am)
    event(f"certified={r.certified}")
    assert _mp_rel_err_vec(r.coords, w) <= r.error_bound + BOUND_FLOOR
    assert r.certified == (r.error_bound <= CERTIFY_RTOL)


def test_min_norm_dual_equality_rows_do_not_count_as_held_negative_multipliers():
    """Oracle: hand-solved. Equalities ``w₁ = 1``, ``w₁ + w₂ = −1`` (``w = (1, −2)``, multipliers ``λ = (3, −2)``:
    ``w = 3·(1, 0) − 2·(1, 1)``). An equality's multiplier has no sign condition, so the negative one is not
    a held rounding-level multiplier: the bound stays ``cond(K_S)·eps``-sized and the answer is certified."""
    Am = np.array([[1.0, 0.0], [1.0, 1.0]])
    r = min_norm_dual(Am @ Am.T, np.array([1.0, -1.0]), equality=[0, 1], factor=Am)
    np.testing.assert_allclose(r.coords, [1.0, -2.0], rtol=0, atol=EXACT_ATOL)
    np.testing.assert_allclose(r.multipliers, [3.0, -2.0], rtol=0, atol=EXACT_ATOL)
    assert r.error_bound < 1e3 * EPS and r.certified


def _edge_of_range(e: int) -> A.Instance:
    """Two sequences, queries (½, 0): the first asks Δ = (2^e, 0), so W₀₀·2^e·½ ≥ 1; the second (Δ = (½, ½))
    asks ¼(W₀₀ + W₁₀) ≥ 1, slack at the first row's answer. W_mm = 2^(1−e)·e₀e₀ᵀ exactly (hand-solved)."""
    X = np.array([[[2.0**e, 0.0], [0.0, 0.0]], [[0.5, 0.5], [0.0, 0.0]]])
    return A.Instance(X, np.ones(2), np.ones(2), np.array([[0.5, 0.0], [0.5, 0.0]]))


def test_solution_at_the_edge_of_the_range_is_returned_or_refused_by_its_value() -> None:
    """Oracle: hand-solved (:func:`_edge_of_range`). ||W_mm|| = 2^1023 is the largest power of two float64
    holds: returned exactly and certified; 2^1024 is not a double: refused by name, never W = inf (the
    log-domain range check alone cannot tell log 2^1024 from log FLOAT_MAX: they are the same double).
    Every Frobenius method and the working set go through the same scale-back."""
    sol = A.solve_svm(_edge_of_range(-1022), alpha=[0, 0])
    np.testing.assert_array_equal(sol.W, np.array([[2.0**1023, 0.0], [0.0, 0.0]]))
    assert sol.certified
    over = _edge_of_range(-1023)
    for solve in (
        lambda: A.solve_svm(over, alpha=[0, 0]),
        lambda: A.solve_svm(over, alpha=[0, 0], method="vector"),
        lambda: A.solve_svm_working_set(over, alpha=[0, 0]),
    ):
        with pytest.raises(NumericalError, match=r"\|\|W_mm\|\|_F is about 1e\+308: it overflows"):
            solve()


#: Relative accuracy of ``_min_norm_rows`` on orthogonal rows: after equilibration ``K_S`` is diagonal
#: (``cond = 1``), so the active-set solve is exact to a few ulps and the put-back is by powers of two;
#: 64·eps leaves an order of magnitude over the ≤ 4 roundings per quantity (``1/||a_r||²``, the product
#: with ``b_r``, the margin's dot product).
ROWS_RTOL = 64 * EPS


def test_min_norm_rows_posed_scale_on_rows_far_apart() -> None:
    """``_min_norm_rows`` (rows as mantissas with one binary exponent each, the peers' form): rows 2^±10
    apart (so that every power-of-two put-back is exercised and the multipliers' weights 2^{−k_r} differ by
    2^40, beyond MULTIPLIER_RTOL), two orthogonal binding rows and one slack row whose mantissa row is not
    unit-sized (its equilibration exponent is 1: the returned factor must be the rows as given).

    Oracle: the exact construction — for orthogonal active rows ``λ_r = b_r/||a_r||²``, ``w = Σ λ_r a_r``,
    ``a_rᵀw = b_r``, in rational arithmetic from the float64 inputs — read through the documented posed
    scale ``λ_r = 2^{G−R_r}·sol.multipliers_r``, ``a_rᵀw = 2^{R_r+G}·sol.margins_r``, ``w = 2^G·sol.coords``.
    """
    from fractions import Fraction

    rows = np.array([[0.5, 0.0], [0.0, 0.75], [0.75, 0.75]])
    R = np.array([10, -10, 0], dtype=np.int64)
    # b_r = λ_r·||a_r||² with λ = (1, 3): comparable multipliers, neither weakly active
    b = np.array([0.25 * 2.0**20, 3 * 0.5625 * 2.0**-20, -1.0])
    sol, G = _dual_mod._min_norm_rows(rows, R, b)
    two = Fraction(2)
    # a_r = 2^R_r·rows_r; the third row is slack: a_3ᵀw = 0.75·(w_1 + w_2) > 0 > b_3 (checked below)
    lam = [Fraction(b[r]) / (two ** (2 * int(R[r])) * sum(Fraction(c) ** 2 for c in rows[r])) for r in (0, 1)]
    w = [lam[0] * two ** int(R[0]) * Fraction(rows[0, 0]), lam[1] * two ** int(R[1]) * Fraction(rows[1, 1])]
    margin3 = two ** int(R[2]) * (Fraction(rows[2, 0]) * w[0] + Fraction(rows[2, 1]) * w[1])
    assert margin3 > Fraction(b[2])  # the third row is slack (the construction's premise)

    def close(got: float, exact: Fraction) -> bool:
        return abs(Fraction(got) - exact) <= Fraction(ROWS_RTOL) * abs(exact)

    for r in (0, 1):
        assert close(float(sol.multipliers[r]), lam[r] / two ** (G - int(R[r])))
        assert close(float(sol.margins[r]), Fraction(b[r]) / two ** (int(R[r]) + G))
        assert close(float(sol.coords[r]), w[r] / two**G)
    assert sol.multipliers[2] == 0.0
    assert close(float(sol.margins[2]), margin3 / two ** (int(R[2]) + G))
    wnorm2 = w[0] ** 2 + w[1] ** 2
    assert abs(Fraction(sol.norm) ** 2 * two ** (2 * G) - wnorm2) <= Fraction(2 * ROWS_RTOL) * wnorm2
    assert sol.support.tolist() == [0, 1]
    assert sol.weakly_active.tolist() == []
    assert np.array_equal(sol.factor, rows)
    assert sol.certified and sol.kkt.max() <= CERTIFY_RTOL and sol.error_bound <= CERTIFY_RTOL
    assert isinstance(sol.iterations, int) and sol.iterations >= 0


def test_local_optimality_report_names_the_choice_it_checked() -> None:
    """The report of a feasible choice carries that choice as ``alpha`` (the documented field).

    Oracle: the explicit ``alpha`` passed in, on a two-token instance where token 0 scores 1 and token 1
    scores 0 (``v = e_1``, tokens ``e_1`` and ``e_2``): Att-SVM(α = 0) is feasible and locally optimal.
    """
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 1.0]])
    )
    report = A.local_optimality_report(inst, np.array([0]))
    assert report.feasible and report.locally_optimal
    assert np.array_equal(report.alpha, [0])


def test_min_norm_rows_negative_equality_multiplier_at_the_posed_scale() -> None:
    """An equality row of ``_min_norm_rows`` keeps its negative multiplier (its sign is free).

    Oracle: the exact construction on orthogonal rows (``λ_r = b_r/||a_r||²``, here ``λ = (1, −3)``), read
    through the posed scale ``λ_r = 2^{G−R_r}·sol.multipliers_r``.
    """
    from fractions import Fraction

    rows = np.array([[0.5, 0.0], [0.0, 0.75]])
    R = np.array([4, -4], dtype=np.int64)
    b = np.array([0.25 * 2.0**8, -3 * 0.5625 * 2.0**-8])
    sol, G = _dual_mod._min_norm_rows(rows, R, b, [False, True])
    for r, lam in enumerate((Fraction(1), Fraction(-3))):
        exact = lam / Fraction(2) ** (G - int(R[r]))
        assert abs(Fraction(float(sol.multipliers[r])) - exact) <= Fraction(ROWS_RTOL) * abs(exact)
    assert sol.support.tolist() == [0, 1] and sol.weakly_active.tolist() == []


def test_min_norm_dual_returns_the_factor_as_given() -> None:
    """``sol.factor`` is the ``factor`` argument (the documented ``L`` that ``coords`` refers to), bit for
    bit, even where the solver's row equilibration by ``2^{−k_r}`` flushes an entry (``3·2^-1074`` next to
    ``2^40`` in its row).

    Oracle: the argument itself.
    """
    Lf = np.array([[2.0**40, 3 * 2.0**-1074], [0.0, 1.0]])
    sol = min_norm_dual(Lf @ Lf.T, np.array([1.0, 1.0]), factor=Lf)
    assert np.array_equal(sol.factor, Lf)


def test_min_norm_dual_infeasibility_certificate_on_rows_of_different_scales() -> None:
    """Rows ``a_1 = 2^10``, ``a_2 = −2^-10`` (1-D) with ``b = (1, 1)`` are infeasible; the certificate
    ``c ≥ 0`` combines the rows as given: ``Σ c_r a_r = 0`` and ``Σ c_r b_r > 0``.

    Oracle: the exact certificate ``c ∝ (2^-10, 2^10)`` (normalised to max 1: ``(2^-20, 1)``), checked in
    rational arithmetic against the rows as given.
    """
    from fractions import Fraction

    Af = np.array([[2.0**10], [-(2.0**-10)]])
    with pytest.raises(InfeasibleMinNormError) as info:
        min_norm_dual(Af @ Af.T, np.array([1.0, 1.0]), factor=Af)
    c = info.value.certificate
    assert np.all(c >= 0.0) and float(np.max(c)) == 1.0
    combo = sum(Fraction(float(c[r])) * Fraction(float(Af[r, 0])) for r in range(2))
    # |Σ c_r a_r| at rounding level of the terms (each |c_r a_r| ≤ 2^-10): ROWS_RTOL relative
    assert abs(combo) <= Fraction(ROWS_RTOL) * Fraction(2.0**-10)
    assert sum(Fraction(float(c[r])) for r in range(2)) > 0


def _one_allowed_token() -> A.Instance:
    """One sequence of two tokens, the second masked: Att-SVM(α) has no constraint."""
    return A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]),
        np.array([1.0]),
        np.array([1.0, 0.0]),
        np.array([[1.0, 1.0]]),
        mask=np.array([[True, False]]),
    )


def test_local_optimality_report_without_constraints_is_vacuously_optimal() -> None:
    """A mask that leaves the sequence one allowed token gives Att-SVM(α) no constraint: it is feasible
    (``W = 0``), has no support token, and so is locally optimal by the definition (``γ_iα_i > γ_it`` for
    every support token holds vacuously).

    Oracle: the definition of :class:`LocalOptimalityReport`'s fields on the empty constraint set.
    """
    inst = _one_allowed_token()
    report = A.local_optimality_report(inst)
    assert report.feasible and report.locally_optimal
    assert report.support == () and report.violating == ()
    assert np.array_equal(report.alpha, [0])


def test_solve_svm_without_constraints_names_the_cause() -> None:
    """``solve_svm`` refuses an Att-SVM without any constraint (``W_mm = 0``, no direction) with the
    documented message, whole (the scale contract: an AttnSVMError naming the cause).

    Oracle: the documented message text.
    """
    inst = _one_allowed_token()
    with pytest.raises(A.AttnSVMError) as info:
        solve_svm(inst)
    assert str(info.value) == (
        "Att-SVM(alpha) has no constraint: the mask leaves every sequence one allowed token, so "
        "W_mm = 0 and its direction is undefined. Allow at least two tokens in some sequence."
    )


def _orthogonal_far_apart(s: int) -> tuple[np.ndarray, np.ndarray]:
    """Two orthogonal rows ``a_0 = 0.5·2^s·e_1``, ``a_1 = 0.75·2^{−s}·e_2`` with ``b_r = λ_r·||a_r||²``,
    ``λ = (1, 3)``: both bind, and the normalised right-hand sides ``b_r/||a_r||`` are ``2^{2s}`` apart."""
    A_ = np.array([[0.5 * 2.0**s, 0.0], [0.0, 0.75 * 2.0**-s]])
    b = np.array([0.25 * 2.0 ** (2 * s), 3 * 0.5625 * 2.0 ** (-2 * s)])
    return A_, b


@pytest.mark.parametrize("s", [100, 300, 500])
def test_min_norm_dual_keeps_the_multiplier_of_a_row_far_below_the_largest(s: int) -> None:
    """A binding row whose right-hand side (after row normalisation) is ``2^{2s}`` below the largest keeps its
    multiplier: with ``λ = (1, 3)`` it is the *largest* multiplier of the problem as posed. (Regression: the
    active-set step's norm-wise slack tolerance ``ROUNDING_RTOL·||u||`` hid the row's whole violation
    ``b'_1 ≈ 2^{−2s}``; ``λ = (1, 0)`` came back with row 1 weakly active and ``certified=True``.)

    Oracle: the exact construction — orthogonal rows, so ``λ_r = b_r/||a_r||²``, ``w = Σ λ_r a_r``,
    ``a_rᵀw = b_r`` — in rational arithmetic from the float64 inputs.
    """
    from fractions import Fraction

    A_, b = _orthogonal_far_apart(s)
    sol = min_norm_dual(A_ @ A_.T, b, factor=A_)
    lam = [Fraction(b[r]) / (Fraction(A_[r, r]) ** 2) for r in (0, 1)]
    assert lam == [Fraction(1), Fraction(3)]  # the construction's premise
    for r in (0, 1):
        assert abs(Fraction(float(sol.multipliers[r])) - lam[r]) <= Fraction(ROWS_RTOL) * lam[r]
        assert abs(Fraction(float(sol.margins[r])) - Fraction(b[r])) <= Fraction(ROWS_RTOL) * Fraction(b[r])
        w_r = lam[r] * Fraction(A_[r, r])
        assert abs(Fraction(float(sol.coords[r])) - w_r) <= Fraction(ROWS_RTOL) * w_r
    assert sol.support.tolist() == [0, 1]
    assert sol.weakly_active.tolist() == []
    assert sol.certified and sol.kkt.max() <= CERTIFY_RTOL and sol.error_bound <= CERTIFY_RTOL


def test_min_norm_rows_keeps_the_multiplier_of_a_row_far_below_the_largest() -> None:
    """``_min_norm_rows`` on the same construction at ``2^{±300}`` (rows as mantissas with exponents
    ``R = (300, −300)``): both multipliers come back, read through the posed scale
    ``λ_r = 2^{G−R_r}·sol.multipliers_r``. (Regression: ``λ = (1, 0)``, row 1 weakly active, certified.)

    Oracle: the exact construction ``λ_r = b_r/||a_r||² = (1, 3)`` in rational arithmetic.
    """
    from fractions import Fraction

    rows = np.array([[0.5, 0.0], [0.0, 0.75]])
    R = np.array([300, -300], dtype=np.int64)
    b = np.array([0.25 * 2.0**600, 3 * 0.5625 * 2.0**-600])
    sol, G = _dual_mod._min_norm_rows(rows, R, b)
    two = Fraction(2)
    for r, lam in enumerate((Fraction(1), Fraction(3))):
        assert Fraction(b[r]) / (two ** (2 * int(R[r])) * Fraction(rows[r, r]) ** 2) == lam  # premise
        exact = lam / two ** (G - int(R[r]))
        assert abs(Fraction(float(sol.multipliers[r])) - exact) <= Fraction(ROWS_RTOL) * exact
    assert sol.support.tolist() == [0, 1] and sol.weakly_active.tolist() == []
    assert sol.certified


def test_min_norm_dual_does_not_certify_a_row_left_violated_below_the_norm_wise_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the active-set step leaves a row violated by all of its (tiny) right-hand side, the certificate
    fails: the norm-wise KKT residuals (relative to ``|b_r| + ||a_r||·||w||``) cannot see it, so ``certified``
    also asks that no row left with ``λ_r = 0`` need a significant multiplier of the problem as posed.
    Forced here by a slack tolerance of ``2·|b'_r|`` (``_round_tol`` → 2), which accepts row 1's violation
    ``b'_1`` as rounding.

    Oracle: the exact construction (``λ = (1, 3)``, both rows binding): the returned point violates row 1 by
    all of ``b_1`` (``a_1ᵀw = 0``) and its true multiplier is the largest, so the point is not the solution
    and must not be certified.
    """
    A_, b = _orthogonal_far_apart(100)
    monkeypatch.setattr(_dual_mod, "_round_tol", lambda k: 2.0)
    sol = min_norm_dual(A_ @ A_.T, b, factor=A_)
    assert sol.margins[1] == 0.0 and sol.multipliers[1] == 0.0  # the row left out, as the bug did
    assert not sol.certified
