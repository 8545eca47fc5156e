"""`attnsvm.svm._working_set` at its edges: boundary cases, exact small instances and documented behaviour.

Each test pins one documented behaviour of :mod:`attnsvm.svm._working_set` against an independent oracle
(an exact certificate checked from scratch, a hand-solved instance, the dense dual solver on the same
problem, scale equivariance by powers of two, or the documented error text).

This file covers the inner half of the solver: the ``K`` blocks (``_Rows``), the Cholesky factor with
its block updates (``_GramCholesky``, ``_principal_block``), block principal pivoting (``_bpp``) and the
condition number behind ``error_bound`` (``_cond_KFF``). Where a behaviour is visible through
:func:`~attnsvm.svm._working_set.solve_svm_working_set` (the path named in ``solver``, the pivot count in
``iterations``, ``error_bound``) the test goes through it; the factor's documented invariants
(``RᵀR = K_FF`` in the documented row order, the refusal rule) are checked on the private class against
the unit-row Gram matrix built independently from the public :func:`attnsvm.svm_gram`.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import pytest

import attnsvm as A
import attnsvm.svm._problem as svm_problem
import attnsvm.svm._working_set as ws
from attnsvm.svm import CERTIFY_RTOL, solve_svm
from attnsvm.svm._problem import _pairs_alpha, _unit_svm
from attnsvm.svm._working_set import solve_svm_working_set

EPS = float(np.finfo(np.float64).eps)
#: Two certified solutions are each within CERTIFY_RTOL (relative, Frobenius) of the unique W_mm (the
#: primal is strictly convex), so they agree to 2·CERTIFY_RTOL (as tests/test_svm_working_set.py).
AGREE_RTOL = 2 * CERTIFY_RTOL
#: A closed-form answer computed in float64 (a handful of products and one division per entry) against
#: the solver's (one Cholesky solve of a 1×1 system and the tensor-trick product): a few eps relative.
HAND_RTOL = 16 * EPS
#: Cholesky and Householder QR are backward stable: the computed factor satisfies
#: |RᵀR − K| ≤ γ_{k+1}·|Rᵀ||R| entrywise (Higham, *Accuracy and Stability*, Thm 10.3; Thm 19.4 for the
#: triangular-pentagonal QR of a downdate), and |Rᵀ||R| ≤ 1 entrywise here (Cauchy–Schwarz on the unit
#: diagonal of K). Up to three updates accumulate in a test and the reference Gram carries its own
#: d-term rounding: 4·(k + d)·eps with k, d ≤ 16.
FACTOR_ATOL_PER_TERM = 4 * EPS
#: The exact eigenvalues of a unit-diagonal Gram of size k ≤ 128 (numpy eigvalsh) are perturbed by
#: ≤ k·eps·λ_max (Weyl), so a condition number near 10–100 is known to ≤ 1e-12 relative.
COND_EXACT_RTOL = 1e-12


def _unit_gram(inst: A.Instance, alpha: Any, rows: np.ndarray) -> np.ndarray:
    """The unit-row Gram ``K̂ = D K D`` (``D = diag(1/||a_r||)``) from the public :func:`attnsvm.svm_gram`."""
    K = A.svm_gram(inst, alpha)
    Dn = 1.0 / np.sqrt(np.diag(K)[rows])
    return np.asarray(K[np.ix_(rows, rows)] * Dn[:, None] * Dn[None, :])


def _rows_of(inst: A.Instance, alpha: Any) -> ws._Rows:
    pairs, a = _pairs_alpha(inst, alpha)
    return ws._Rows(_unit_svm(inst, pairs, a))


# ------------------------------------------------------------------ the path taken (solver string)
@pytest.mark.parametrize(("n", "T", "d", "seed"), [(5, 4, 8, 3), (16, 8, 16, 0)])
def test_well_conditioned_instances_are_answered_by_the_cholesky_fast_path(
    n: int, T: int, d: int, seed: int
) -> None:
    """Oracle: the documented fallback rule and the dense certified dual. The exact core takes over only
    when a factor fails (``K_FF`` singular or its diagonal ratio beyond ``FAST_COND_MAX``), the restricted
    norm exceeds ``INFEASIBLE_NORM``, pivoting does not settle, or the answer is not certified. Here the
    support's unit-row Gram (from :func:`attnsvm.svm_gram`, exact eigenvalues) is well conditioned and the
    dense solver certifies the answer, so none of these happens: ``solver`` names block principal
    pivoting, and ``W`` and the support are the dense dual's."""
    inst = A.random_instance(n, T, d, seed=seed)
    ref = solve_svm(inst, method="dual")
    assert ref.certified and ref.duals is not None
    on = np.flatnonzero(np.asarray(ref.duals) > 0)
    ev = np.linalg.eigvalsh(_unit_gram(inst, ref.alpha, on))
    assert ev[-1] / ev[0] < 1e6  # far from FAST_COND_MAX = 1e12 and from what certification refuses
    sol = solve_svm_working_set(inst)
    assert "block principal pivoting" in sol.solver and "exact core" not in sol.solver
    assert sol.certified and np.linalg.norm(sol.W - ref.W) <= AGREE_RTOL * np.linalg.norm(ref.W)
    assert set(sol.support) == set(ref.support)


def test_one_constraint_is_solved_in_one_pivot() -> None:
    """Oracle: the hand-solved one-row problem. ``min ½||W||² s.t. Δᵀ W z ≥ 1`` with ``Δ = x_0 − x_1 =
    (1, 3, −3)``, ``z = (2, 0, 1)`` has ``W = Δzᵀ/(||Δ||²||z||²) = Δzᵀ/95`` and ``λ = 1/95``. The working
    set is that row from the start, free, and one solve of the 1×1 system is its KKT point: one round,
    one pivoting step (``iterations`` counts the steps of every round, each round taking at least one)."""
    X = np.array([[[1.0, 2.0, 0.0], [0.0, -1.0, 3.0]]])
    z = np.array([[2.0, 0.0, 1.0]])
    inst = A.Instance(X, np.ones(1), np.ones(3), z)
    seen: list[dict[str, Any]] = []
    sol = solve_svm_working_set(inst, [0], progress=seen.append)
    W = np.outer([1.0, 3.0, -3.0], [2.0, 0.0, 1.0]) / 95.0
    assert np.allclose(sol.W, W, rtol=HAND_RTOL, atol=0.0)
    assert sol.duals is not None and math.isclose(float(sol.duals[0]), 1.0 / 95.0, rel_tol=HAND_RTOL)
    assert sol.iterations == 1 and [p["pivots"] for p in seen] == [1]
    assert "block principal pivoting" in sol.solver and sol.certified


def test_every_round_takes_at_least_one_pivot() -> None:
    """Oracle: the definition of the count. Each round solves its restricted problem with at least one
    ``K_FF`` solve, so the cumulative ``pivots`` reported to ``progress`` grows strictly from round to
    round, starts at ≥ 1, and ``iterations`` is the last value (≥ the number of rounds)."""
    inst = A.random_instance(16, 8, 16, seed=0)
    seen: list[dict[str, Any]] = []
    sol = solve_svm_working_set(inst, chunk=7, progress=seen.append)
    piv = [p["pivots"] for p in seen]
    assert len(seen) >= 2 and piv[0] >= 1 and all(b > a for a, b in zip(piv, piv[1:], strict=False))
    assert sol.iterations == piv[-1] >= len(seen)


# --------------------------------------------------- block principal pivoting: Murty's single exchange
#: Four sequences of two tokens, token 0 selected, the same query e₁: row i is Δ̂_i = c_i/||c_i|| with
#: right-hand side β_i ∝ b_i (||Δ_i|| = 8/b_i). The unit-row dual is the LCP ``min ½λᵀKλ − βᵀλ, λ ≥ 0``
#: with ``K = Gram(Δ̂)`` (positive definite, cond ≈ 25).
MURTY_COLUMNS = [[-3, 3, 1, 2], [0, 1, -3, -3], [-1, 4, -4, 3], [-1, 3, 0, 3]]
MURTY_RHS = [2, 5, 4, 1]
#: The documented pivoting rule traced on this LCP in exact arithmetic (50-digit mpmath; every λ_r/max λ
#: on F and every slack off F is at least 0.007 away from 0, far above rounding): the free sets are
#: {0,1,2,3}, {0,2}, {1,2}, {0,1,2,3}, {0,2}, {0,1,2} with infeasible sets V of sizes 2, 2, 2, 2, 2, 0.
#: Step 1 sets the best count to 2; steps 2–4 are the BPP_BACKUP = 3 full exchanges allowed without a
#: decrease; step 5 is Murty's single exchange of max V (row 3 leaves); step 6 is the KKT point. Full
#: exchanges alone cycle here with period 3 (step 4 repeats step 1).
MURTY_PIVOTS = 6


def _murty_instance() -> A.Instance:
    k, d = len(MURTY_COLUMNS), len(MURTY_COLUMNS[0])
    X = np.zeros((k, 2, d))
    for i, (c, b) in enumerate(zip(MURTY_COLUMNS, MURTY_RHS, strict=True)):
        col = np.asarray(c, dtype=np.float64)
        X[i, 0] = col / np.linalg.norm(col) * (8.0 / b)
    z = np.zeros((k, d))
    z[:, 0] = 1.0
    return A.Instance(X, np.ones(k), np.ones(d), z)


def test_murty_single_exchange_settles_where_full_exchanges_cycle() -> None:
    """Oracles: the hand trace of the documented rule (``MURTY_PIVOTS``: three backup full exchanges,
    then Murty's single exchange, which terminates for the positive definite ``K_SS``) and the dense
    certified dual. The fast path settles (no fallback to the exact core), in exactly the traced number of
    pivoting steps, and its answer is the dense solver's."""
    inst = _murty_instance()
    alpha = [0, 0, 0, 0]
    ref = solve_svm(inst, alpha, method="dual")
    assert ref.certified
    sol = solve_svm_working_set(inst, alpha)
    assert "block principal pivoting" in sol.solver and "1 rounds" in sol.solver
    assert sol.iterations == MURTY_PIVOTS
    assert sol.certified and np.linalg.norm(sol.W - ref.W) <= AGREE_RTOL * np.linalg.norm(ref.W)
    assert set(sol.support) == set(ref.support) == {(0, 1), (1, 1), (2, 1)}


# ------------------------------------------------------------------------ the Cholesky factor
def test_gram_cholesky_keeps_the_documented_row_order_and_factors_K_FF() -> None:
    """Oracle: the unit-row Gram from the public :func:`attnsvm.svm_gram` and the documented update rule
    (rows that stay keep their order, rows that join are appended in the order given). After a start, a
    drop in the middle (the triangular-pentagonal QR path) with joins, and a drop of the first row,
    ``F`` is the documented order, ``R`` is upper triangular and ``RᵀR = K̂_FF`` to Cholesky's backward
    error."""
    inst = A.random_instance(5, 4, 8, seed=3)
    alpha = inst.check_alpha(None)
    rows = _rows_of(inst, alpha)
    chol = ws._GramCholesky(rows)
    steps = [
        (np.array([0, 1, 2, 3, 4, 5], dtype=np.intp), [0, 1, 2, 3, 4, 5]),
        (np.array([9, 4, 1, 3, 0, 7], dtype=np.intp), [0, 1, 3, 4, 9, 7]),
        (np.array([7, 3, 4, 9, 12], dtype=np.intp), [3, 4, 9, 7, 12]),
    ]
    for F_new, expected in steps:
        chol.update(F_new)
        assert chol.F.tolist() == expected
        k = len(expected)
        R = chol.R
        assert R.shape == (k, k) and np.all(np.tril(R, -1) == 0.0)
        K = _unit_gram(inst, alpha, np.asarray(expected))
        assert np.max(np.abs(R.T @ R - K)) <= FACTOR_ATOL_PER_TERM * (k + inst.d)
        b = np.arange(1.0, k + 1.0)
        assert np.allclose(K @ chol.solve(b), b, rtol=0.0, atol=1e-12 * k)


def test_gram_cholesky_refuses_a_nearly_singular_block() -> None:
    """Oracle: the documented refusal rule and the exact 2×2 eigenvalues. Two tokens whose differences
    from the selected one are at angle ``θ ≈ 1.4e-7`` give ``K̂ = [[1, c], [c, 1]]`` with ``c = cos θ``:
    ``cond = (1 + c)/(1 − c) ≈ 2e14`` and a Cholesky diagonal ratio² ``1/(1 − c²) ≈ 5e13``, beyond
    ``FAST_COND_MAX = 1e12``: the fast path must give up (``_Singular``). A well-separated pair is kept."""
    theta = 1.4e-7
    X = np.zeros((1, 3, 3))
    X[0, 1] = [-1.0, 0.0, 0.0]
    X[0, 2] = [-math.cos(theta), -math.sin(theta), 0.0]
    inst = A.Instance(X, np.ones(1), np.ones(3), np.array([[0.0, 0.0, 1.0]]))
    K = _unit_gram(inst, [0], np.array([0, 1]))
    assert (1.0 - K[0, 1] ** 2) ** -1 > 10 * ws.FAST_COND_MAX  # the oracle's diagonal ratio², squared sines
    chol = ws._GramCholesky(_rows_of(inst, [0]))
    with pytest.raises(ws._Singular):
        chol.update(np.array([0, 1], dtype=np.intp))
    X[0, 2] = [0.0, -1.0, 0.0]  # orthogonal: K̂ = I, cond 1
    chol = ws._GramCholesky(_rows_of(A.Instance(X, np.ones(1), np.ones(3), np.array([[0.0, 0.0, 1.0]])), [0]))
    chol.update(np.array([0, 1], dtype=np.intp))
    assert chol.F.tolist() == [0, 1]


# --------------------------------------------------------------------------- cond(K_FF)
def test_condition_of_a_singular_block_is_not_certifiable() -> None:
    """Oracle: constructed linear dependence. Token 3 repeats token 1 (two identical rows) and token 4 is
    the midpoint of tokens 1 and 2 (``Δ_4 = (Δ_1 + Δ_2)/2``), so ``K̂_FF`` is exactly singular on those
    rows: ``cond = ∞``. The exact-eigenvalue branch must report a positive value that no certificate
    accepts (``cond·eps > CERTIFY_RTOL``), without a floating-point warning, whatever sign the rounded
    smallest eigenvalue takes."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1, 5, 5))
    X[0, 3] = X[0, 1]
    X[0, 4] = 0.5 * X[0, 1] + 0.5 * X[0, 2]
    inst = A.Instance(X, np.ones(1), np.ones(5), rng.standard_normal((1, 5)))
    rows = _rows_of(inst, [0])
    for F in ([0, 2], [0, 1, 3]):  # rows: tokens 1, 2, 3, 4
        chol = ws._GramCholesky(rows)
        chol.F = np.array(F, dtype=np.intp)  # the free set under test (its factor is not used here)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cond = ws._cond_KFF(rows, chol)
        assert cond > 0 and not cond * EPS <= CERTIFY_RTOL, (F, cond)


def test_lanczos_estimate_is_an_upper_bound_and_reproducible(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracles: the exact eigenvalues of the support's unit-row Gram (:func:`attnsvm.svm_gram`) and the
    Kato–Temple bound. Each end's Ritz value θ lies inside the spectrum and, when the residual ``||r||`` is
    below the gap to the next eigenvalue, the extreme eigenvalue is within ``||r||²/gap ≤ ||r||`` of θ;
    ARPACK stops at ``||r|| ≤ LANCZOS_TOL·θ``, here far below both relative gaps (checked). So the raised
    estimate ``(θ₁ + ||r₁||)(θ₂ + ||r₂||)`` is never below the exact ``cond(K̂_S)`` (up to the eigenvalues'
    own rounding). The documented deterministic start makes the certificate reproducible: the same
    ``error_bound`` bit for bit on a second call, after an unrelated ARPACK run in between."""
    import scipy.sparse.linalg

    inst = A.random_instance(30, 10, 16, seed=0)
    monkeypatch.setattr(ws, "EXACT_COND_MAX", 0)
    sol = solve_svm_working_set(inst)
    assert sol.duals is not None and "block principal pivoting" in sol.solver
    on = np.flatnonzero(np.asarray(sol.duals) > 0)
    ev = np.linalg.eigvalsh(_unit_gram(inst, sol.alpha, on))
    gap_top = (ev[-1] - ev[-2]) / ev[-1]
    gap_bottom = (1.0 / ev[0] - 1.0 / ev[1]) * ev[0]
    assert min(gap_top, gap_bottom) > 10 * ws.LANCZOS_TOL  # the Kato–Temple premise, with room
    exact = ev[-1] / ev[0]
    assert sol.error_bound / (exact * EPS) - 1.0 >= -COND_EXACT_RTOL
    scipy.sparse.linalg.eigsh(np.diag(np.arange(1.0, 40.0)), k=1)  # advance ARPACK's internal state
    again = solve_svm_working_set(inst)
    assert again.error_bound == sol.error_bound and np.array_equal(again.W, sol.W)


#: ARPACK's default Lanczos basis for one eigenvalue: ``ncv = min(N, max(2k + 1, 20)) = 20`` (N ≥ 20).
ARPACK_NCV = 20


def test_lanczos_stops_after_one_cycle_at_the_documented_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the Kaniel–Paige–Saad convergence bound for Lanczos and the documented tolerance. For each
    end (``K̂_S``, and ``K̂_S⁻¹`` for the smallest eigenvalue), with ``γ = (μ₁ − μ₂)/(μ₂ − μ_N)`` from the exact
    eigenvalues of the support's unit-row Gram (:func:`attnsvm.svm_gram`) and the documented start
    ``v₀ = 1/√N``, the top eigenvector's angle to the 20-dimensional Krylov space of ARPACK's first basis
    has ``tan ≤ tan∠(v₀, y₁)/T₁₉(1 + 2γ)``, checked below ``LANCZOS_TOL/10``; the Ritz residual is then
    below ``(μ₁ − μ_N)·sin ≤ LANCZOS_TOL·θ`` and each end stops after one cycle: at most ``ncv`` products
    plus the start and the residual check (``≤ 1.5·ncv`` asserted; a restart towards full precision
    would need another ``ncv − 1`` at least, as ``LANCZOS_TOL``'s comment measures: 21 products against 71
    at ``tol = 1e-8``)."""
    inst = A.random_instance(30, 10, 16, seed=0)
    monkeypatch.setattr(ws, "EXACT_COND_MAX", 0)
    counts = {"K": 0, "Kinv": 0}
    inside = {"on": False}
    W0, solve0, cond0 = ws._Rows.W, ws._GramCholesky.solve, ws._cond_KFF

    def W(self: Any, *args: Any) -> Any:
        counts["K"] += inside["on"]
        return W0(self, *args)

    def solve(self: Any, *args: Any) -> Any:
        counts["Kinv"] += inside["on"]
        return solve0(self, *args)

    def cond(*args: Any) -> float:
        inside["on"] = True
        try:
            return float(cond0(*args))
        finally:
            inside["on"] = False

    monkeypatch.setattr(ws._Rows, "W", W)
    monkeypatch.setattr(ws._GramCholesky, "solve", solve)
    monkeypatch.setattr(ws, "_cond_KFF", cond)
    sol = solve_svm_working_set(inst)
    assert sol.duals is not None and sol.certified
    on = np.flatnonzero(np.asarray(sol.duals) > 0)
    assert on.size > ARPACK_NCV
    ev, V = np.linalg.eigh(_unit_gram(inst, sol.alpha, on))
    for mu, y in ((ev[::-1], V[:, -1]), (1.0 / ev, V[:, 0])):  # (eigenvalues, largest first; its vector)
        gamma = (mu[0] - mu[1]) / (mu[1] - mu[-1])
        cos0 = abs(float(np.sum(y))) / math.sqrt(on.size)
        tan_krylov = math.sqrt(1.0 - cos0**2) / cos0 / math.cosh((ARPACK_NCV - 1) * math.acosh(1 + 2 * gamma))
        assert tan_krylov <= ws.LANCZOS_TOL / 10, (gamma, cos0)
    assert 1 <= counts["K"] <= 1.5 * ARPACK_NCV and 1 <= counts["Kinv"] <= 1.5 * ARPACK_NCV, counts


def _near_weak_instance(s: float) -> A.Instance:
    """Three sequences, one row each, the same query e₁: ``Δ̂_1 = e₁``, ``Δ̂_2 = e₂`` (``β_1 = β_2``) and
    ``Δ̂_3`` at 60° to the plane, with ``β_3 = β_1·(√2·cos 60° − s)``: at ``W`` of rows 1 and 2 alone
    row 3 has slack ``β_1·s``, so with all three rows free ``λ_3 = −β_1·s/sin²60°`` (hand-solved)."""
    phi = math.pi / 3
    X = np.zeros((3, 2, 3))
    X[0, 0] = [1.0, 0.0, 0.0]
    X[1, 0] = [0.0, 1.0, 0.0]
    d3 = np.array([math.cos(phi) / math.sqrt(2), math.cos(phi) / math.sqrt(2), math.sin(phi)])
    X[2, 0] = d3 / (math.sqrt(2) * math.cos(phi) - s)
    z = np.zeros((3, 3))
    z[:, 0] = 1.0
    return A.Instance(X, np.ones(3), np.ones(3), z)


def test_a_rounding_level_negative_multiplier_is_not_pivoted() -> None:
    """Oracle: the hand-solved three-row problem and the documented meaning of ``MULTIPLIER_RTOL`` ("a
    negative multiplier above ``−MULTIPLIER_RTOL·max λ`` is rounding, not a wrong active set"). At
    ``s = 1.5e-10`` the all-free solve has ``λ_3/max λ = −(s/sin²60°)/(1 + O(s)) ≈ −2e-10``: relative, above
    ``−1e-9``, so the first solve is accepted (one pivoting step); at ``s = 1e-7`` (``λ_3/max λ ≈ −1.3e-7``)
    row 3 leaves (two steps). Both answers are certified and equal the dense dual's, whose support is
    rows 1 and 2 (row 3 is slack by ``≈ β_1·s`` relative to ``β_1``)."""
    for s, pivots in ((1.5e-10, 1), (1e-7, 2)):
        inst = _near_weak_instance(s)
        alpha = [0, 0, 0]
        ref = solve_svm(inst, alpha, method="dual")
        sol = solve_svm_working_set(inst, alpha)
        assert ref.certified and sol.certified and "block principal pivoting" in sol.solver
        assert sol.iterations == pivots, (s, sol.iterations)
        assert np.linalg.norm(sol.W - ref.W) <= AGREE_RTOL * np.linalg.norm(ref.W)
        assert sol.kkt is not None and sol.kkt.dual_feasibility <= CERTIFY_RTOL


# ------------------------------------------------------- mutation survivors (issue 13 §4, solver half)
#: An angle between two token differences whose Cholesky diagonal ratio is 1/sin θ ≈ 1e5: the documented
#: refusal statistic ratio² ≈ 1e10 is a factor 100 inside FAST_COND_MAX = 1e12 (so rounding of the
#: diagonal, ~1e-11 relative here, cannot move it across), while any stronger power (ratio³ ≈ 1e15)
#: would exceed it.
ACCEPTED_ANGLE = 1e-5


def test_gram_cholesky_keeps_a_block_whose_squared_diagonal_ratio_is_inside_the_limit() -> None:
    """Oracle: the documented refusal rule ``(max|r_kk|/min|r_kk|)² ≤ FAST_COND_MAX`` with the exact 2×2
    Cholesky factor of ``K̂ = [[1, c], [c, 1]]``, ``c = cos θ``: ``r₁₁ = 1``, ``r₂₂ = sin θ``, so the
    statistic is ``1/sin²θ ≈ 1e10`` at ``θ = 1e-5``. The factor must be kept (no ``_Singular``) and satisfy
    ``RᵀR = K̂`` (checked against the public :func:`attnsvm.svm_gram`)."""
    theta = ACCEPTED_ANGLE
    X = np.zeros((1, 3, 3))
    X[0, 1] = [-1.0, 0.0, 0.0]
    X[0, 2] = [-math.cos(theta), -math.sin(theta), 0.0]
    inst = A.Instance(X, np.ones(1), np.ones(3), np.array([[0.0, 0.0, 1.0]]))
    K = _unit_gram(inst, [0], np.array([0, 1]))
    stat = 1.0 / (1.0 - K[0, 1] ** 2)  # the oracle's (r₁₁/r₂₂)² = 1/sin²θ
    assert 10 * stat <= ws.FAST_COND_MAX < stat**1.5  # inside for the square, outside for any cube
    chol = ws._GramCholesky(_rows_of(inst, [0]))
    chol.update(np.array([0, 1], dtype=np.intp))  # must not raise
    assert chol.F.tolist() == [0, 1]
    assert np.max(np.abs(chol.R.T @ chol.R - K)) <= FACTOR_ATOL_PER_TERM * (2 + inst.d)


def test_progress_reports_the_elapsed_wall_time() -> None:
    """Oracle: the clock read around the call. ``progress``'s ``elapsed_s`` is the time since the call
    started (documented), so every value lies in ``[0, t_after − t_before]`` and never decreases."""
    inst = A.random_instance(16, 8, 16, seed=0)
    seen: list[dict[str, Any]] = []
    t_before = time.perf_counter()
    solve_svm_working_set(inst, chunk=7, progress=seen.append)
    wall = time.perf_counter() - t_before
    el = [float(p["elapsed_s"]) for p in seen]
    assert len(el) >= 2
    assert all(0.0 <= e <= wall for e in el), (el, wall)
    assert all(b >= a for a, b in zip(el, el[1:], strict=False))


@pytest.mark.parametrize("gram_factor", [False, True], ids=["primal-coordinates", "multipliers"])
def test_a_non_finite_exact_core_solution_raises_the_documented_error(
    monkeypatch: pytest.MonkeyPatch, gram_factor: bool
) -> None:
    """Oracle: the documented ``Raises`` (``SolverError`` when "the solution is not finite") and its text.
    Fault injection: with the fast path disabled (every factor refused, as ``test_exact_core_fallback``)
    the exact core's ``Ŵ`` (computed from the real factor, constraints and core result) is made non-finite,
    as a badly conditioned core would return it. The warm-started solve then fails the norm test, the
    cold re-solve is non-finite too, and the call must raise ``SolverError`` naming the cause, never
    return a NaN ``W`` or a foreign exception. Both ways of forming ``Ŵ`` are exercised: from the compressed
    factor's primal coordinates, and (with ``MAX_FACTOR_ENTRIES = 0`` forcing the Gram eigendecomposition
    factor) from the multipliers and the restricted rows."""
    real = ws._core_W

    def poisoned(u: Any, fac: Any, cS: Any, core: Any) -> np.ndarray:
        return np.asarray(real(u, fac, cS, core)) * math.inf  # ±inf where W ≠ 0, NaN where W = 0

    monkeypatch.setattr(ws, "FAST_COND_MAX", 0.0)
    monkeypatch.setattr(ws, "_core_W", poisoned)
    if gram_factor:
        monkeypatch.setattr(svm_problem, "MAX_FACTOR_ENTRIES", 0)
    inst = A.random_instance(6, 5, 6, seed=0, family="unit")
    with pytest.raises(A.SolverError, match=r"the Att-SVM solution is not finite; the instance is too badly"):
        solve_svm_working_set(inst)


def test_a_working_set_that_does_not_settle_names_the_round_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the contract that an error names its cause (issue 13 §1). With the fast path disabled and
    the round limit cut to one, an instance whose exact-core working set needs several rounds (one row
    joins per round, ``chunk=1``; the rounds counted from ``progress`` on an unlimited run) must raise
    ``SolverError`` saying that the working set (not block pivoting) did not settle, and pointing to the
    dense solver."""
    monkeypatch.setattr(ws, "FAST_COND_MAX", 0.0)
    inst = A.random_instance(16, 8, 16, seed=0)
    seen: list[dict[str, Any]] = []
    solve_svm_working_set(inst, chunk=1, progress=seen.append)
    assert sum(p["path"] == "exact" for p in seen) >= 2  # the exact core needs more than one round
    monkeypatch.setattr(ws, "MAX_ROUNDS", 1)
    with pytest.raises(
        A.SolverError, match=r"\(the working set did not settle\); use solve_svm\(method='dual'\)"
    ):
        solve_svm_working_set(inst, chunk=1)
