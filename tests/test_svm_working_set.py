"""The working-set Att-SVM solver (issue 16 §1): the same certified answer as the dense dual, at any scale.

Oracles (each test names its own):

* the dense certified solver ``solve_svm(method="dual")`` (the exact core of :mod:`attnsvm.svm` on the
  whole ``m × m`` problem): ``W`` equal within the two certified error bounds, the same support;
* the KKT conditions recomputed from scratch from the returned ``W`` and multipliers with the public
  tensor-trick code (:func:`attnsvm.svm_margins` for every row's margin, :func:`attnsvm.svm_rows` for
  ``Σ λ_r a_r``), not the solver's own residuals; strong duality ``Σ λ_r = ||W||_F²`` (right-hand sides 1);
* scale equivariance by exact powers of two, ``W_mm(2^a X, 2^b z) = 2^−(a+b)·W_mm(X, z)`` (bitwise: the
  unit-row problem is the same), and a ``NumericalError`` exactly when ``||W_mm||_F`` leaves float64's range;
* constructed infeasibility (a selected token at the midpoint of two others: ``Δ_1 + Δ_2 = 0``), and
  ``InfeasibleSVMError`` wherever the dense solver raises it;
* the exact eigenvalues of the unit-row Gram matrix (from :func:`attnsvm.svm_gram`) for the Lanczos
  estimate of ``cond(K_S)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import attnsvm as A
import attnsvm.svm._working_set as ws
from attnsvm import strategies as S
from attnsvm.errors import AttnSVMError, InfeasibleSVMError, InvalidInstanceError, NumericalError, SolverError
from attnsvm.svm import CERTIFY_RTOL, MULTIPLIER_RTOL, solve_svm
from attnsvm.svm._working_set import solve_svm_working_set

EPS = float(np.finfo(np.float64).eps)
#: Two certified solutions are each within CERTIFY_RTOL (relative, Frobenius) of the unique W_mm
#: (the primal is strictly convex), so they agree to 2·CERTIFY_RTOL.
AGREE_RTOL = 2 * CERTIFY_RTOL
#: A certified W is feasible to CERTIFY_RTOL relative to |b_r| + ||a_r||·||W|| (the KKT definition); the
#: margins recomputed by svm_margins carry d²·eps relative rounding (≤ 6e-14 for d ≤ 16): ×10 headroom,
#: as tests/test_scale_svm.py.
MARGIN_RTOL = 10 * CERTIFY_RTOL
#: ||W − Σ λ_r a_r||/||W||: the certified stationarity residual (≤ CERTIFY_RTOL) plus the rounding of the
#: returned multipliers (one ldexp and one division each, relative eps) and of the m·d² sum in float64
#: (≤ m·d²·eps·Σλ_r||a_r||/||W|| ≲ 1e-11 at m ≤ 100, d ≤ 16): 2·CERTIFY_RTOL.
STATIONARITY_RTOL = 2 * CERTIFY_RTOL
#: Strong duality |Σλ_r − ||W||²|/||W||²: the certified duality gap (≤ CERTIFY_RTOL) plus roundings.
GAP_RTOL = 2 * CERTIFY_RTOL
#: The Lanczos estimate of cond(K_S) against the exact eigenvalues: ARPACK stops each end at a residual
#: ≤ LANCZOS_TOL·θ and the solver raises θ by that residual, so the estimate is at most
#: (1 + LANCZOS_TOL)² − 1 above the exact ratio (plus the eigenvalues' own cond·eps ≲ 1e-12); an extreme
#: Ritz value lies inside the spectrum within the residual's square over the gap, far below LANCZOS_TOL,
#: so the raised estimate is not more than LANCZOS_TOL below.
COND_RTOL_ABOVE = (1 + ws.LANCZOS_TOL) ** 2 - 1 + 1e-12
COND_RTOL_BELOW = ws.LANCZOS_TOL
#: The solver decides "not representable" from log||W|| (certified to 1e-9 relative): within this many
#: units of log2 of the range's ends either outcome is right (as properties/test_scale_svm.py).
BOUNDARY_LOG_SLACK = 1e-6
#: At most this fraction of the property's examples may fall in that band (a strategy steering there
#: would test nothing): asserted after the run.
MAX_BOUNDARY_FRACTION = 0.05
LOG2_TINY, LOG2_MAX = -1022.0, 1024.0

# (n, T, d, family, seed): generic (d ≥ n), d < n (m > d² for the last ones: K singular, the exact core),
# and the three families. Each is feasible and certified by the dense solver (checked in the test).
CASES = [
    (3, 3, 4, "gaussian", 0),
    (4, 5, 6, "unit", 1),
    (6, 6, 16, "self_attention", 2),
    (16, 8, 16, "gaussian", 0),
    (5, 4, 8, "gaussian", 3),
    (6, 5, 6, "unit", 0),
    (8, 6, 3, "self_attention", 0),  # d < n
    (12, 6, 4, "gaussian", 0),  # d < n, m = 60 > d² = 16
    (9, 4, 3, "gaussian", 3),  # d < n, support 8 of d² = 9: a K_S that turns singular (the exact core)
    (10, 4, 2, "gaussian", 1),  # d < n, support 4 = d²
]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _feasible_certified(n: int, T: int, d: int, family: str, seed: int) -> tuple[A.Instance, Any]:
    inst = A.random_instance(n, T, d, seed=seed, family=family)
    ref = solve_svm(inst, method="dual")
    assert ref.certified, "the oracle must be certified on the chosen cases"
    return inst, ref


@pytest.mark.parametrize(("n", "T", "d", "family", "seed"), CASES)
def test_matches_the_dense_certified_dual(n: int, T: int, d: int, family: str, seed: int) -> None:
    """Oracle: the dense certified ``solve_svm(method="dual")``: W within the certified bounds, the same
    support, weakly active rows and certification; the same result fields."""
    inst, ref = _feasible_certified(n, T, d, family, seed)
    sol = solve_svm_working_set(inst)
    assert sol.certified and sol.norm == "fro" and sol.method == "dual"
    assert _rel(sol.W, ref.W) <= AGREE_RTOL
    assert math.isclose(sol.objective, ref.objective, rel_tol=AGREE_RTOL)
    assert set(sol.support) == set(ref.support)
    assert set(sol.weakly_active) == set(ref.weakly_active)
    assert np.array_equal(sol.pairs, ref.pairs) and np.array_equal(sol.alpha, ref.alpha)
    assert sol.error_bound <= CERTIFY_RTOL and sol.kkt is not None and sol.kkt.max() <= CERTIFY_RTOL
    assert sol.raw_rel_error is None and sol.W_raw is None
    assert set(sol.timings) == {"solver", "active_set", "total"}
    assert not sol.W.flags.writeable


@pytest.mark.parametrize(("n", "T", "d", "family", "seed"), CASES)
def test_kkt_recomputed_from_scratch(n: int, T: int, d: int, family: str, seed: int) -> None:
    """Oracle: the KKT conditions of ``min ½||W||² s.t. Δ_itᵀWz_i ≥ 1`` recomputed with the public tensor
    code from the returned ``W`` and ``duals`` (not the solver's residuals): primal feasibility of every
    row (:func:`attnsvm.svm_margins`), dual feasibility, complementary slackness, stationarity
    ``vec(W) = svm_rowsᵀλ`` and strong duality ``Σλ = ||W||²``."""
    inst = A.random_instance(n, T, d, seed=seed, family=family)
    sol = solve_svm_working_set(inst)
    assert sol.duals is not None
    lam, W = np.asarray(sol.duals), np.asarray(sol.W)
    rows = A.svm_rows(inst, sol.alpha)
    scale = 1.0 + np.linalg.norm(rows, axis=1) * np.linalg.norm(W)  # |b_r| + ||a_r||·||W||
    margins = A.svm_margins(inst, W, sol.alpha)
    assert np.all(margins >= 1.0 - MARGIN_RTOL * scale)  # primal feasibility, all m rows
    assert np.all(lam >= 0.0)  # dual feasibility
    on = lam > MULTIPLIER_RTOL * lam.max()
    assert np.all(np.abs(margins[on] - 1.0) <= MARGIN_RTOL * scale[on])  # complementary slackness
    assert {tuple(p) for p in sol.pairs[on]} <= set(sol.support)
    W_dual = A.unvec(rows.T @ lam, (d, d))  # stationarity: W = Σ λ_it Δ_it z_iᵀ
    assert _rel(W_dual, W) <= STATIONARITY_RTOL
    assert abs(lam.sum() - np.sum(W * W)) <= GAP_RTOL * np.sum(W * W)


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_any_chunk_gives_the_same_answer(chunk: int) -> None:
    """Oracle: the dense certified dual. One row per round (many rounds, the cutting-plane argument
    exercised), a few, or all rows at once give the unique ``W_mm``."""
    inst, ref = _feasible_certified(16, 8, 16, "gaussian", 0)
    sol = solve_svm_working_set(inst, chunk=chunk)
    assert sol.certified and _rel(sol.W, ref.W) <= AGREE_RTOL
    assert set(sol.support) == set(ref.support)


def test_exact_core_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the dense certified dual. With the Cholesky fast path disabled (every factor refused),
    the working set is solved by svm.py's exact core and gives the same certified answer."""
    monkeypatch.setattr(ws, "FAST_COND_MAX", 0.0)
    inst, ref = _feasible_certified(6, 5, 6, "unit", 0)
    sol = solve_svm_working_set(inst)
    assert "exact core" in sol.solver
    assert sol.certified and _rel(sol.W, ref.W) <= AGREE_RTOL and set(sol.support) == set(ref.support)


def test_tied_rows_and_weakly_active_constraints() -> None:
    """Ties: a non-selected token duplicated in its sequence gives two identical rows (``K_S`` singular:
    the fast path hands over to the exact core). Oracle: the dense certified dual; both copies have the
    same margin, so both are in the support or neither."""
    inst0 = A.random_instance(4, 5, 6, seed=1)
    sol0 = solve_svm(inst0, method="dual")
    i, t = sol0.support[0]
    u = next(k for k in range(inst0.T) if k not in (t, int(sol0.alpha[i])))
    X = np.array(inst0.X)
    X[i, u] = X[i, t]  # token u := token t (a tie; alpha unchanged)
    inst = A.Instance(X, inst0.Y, inst0.v, inst0.z)
    ref = solve_svm(inst, sol0.alpha, method="dual")
    sol = solve_svm_working_set(inst, sol0.alpha)
    assert ref.certified and sol.certified
    assert _rel(sol.W, ref.W) <= AGREE_RTOL
    assert ((i, t) in sol.support) == ((i, u) in sol.support) == ((i, t) in ref.support)


def test_infeasible_midpoint_token_raises() -> None:
    """Oracle: a construction. The selected token is the midpoint of two others, so
    ``Δ_1 + Δ_2 = 0`` and the constraints ``Δ_1ᵀWz ≥ 1``, ``Δ_2ᵀWz ≥ 1`` add up to ``0 ≥ 2``."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((3, 4, 5))
    X[1, 0] = 0.5 * (X[1, 2] + X[1, 3])
    inst = A.Instance(X, np.ones(3), rng.standard_normal(5), rng.standard_normal((3, 5)))
    with pytest.raises(InfeasibleSVMError, match="infeasible"):
        solve_svm_working_set(inst, [0, 0, 0])
    with pytest.raises(InfeasibleSVMError):  # the dense solver agrees
        solve_svm(inst, [0, 0, 0], method="dual")


@pytest.mark.parametrize(("n", "T", "d", "family", "seed"), [(8, 6, 3, "gaussian", 0), (10, 4, 2, "unit", 1)])
def test_infeasible_like_the_dense_solver(n: int, T: int, d: int, family: str, seed: int) -> None:
    """Oracle: the dense solver raises InfeasibleSVMError (with a Farkas certificate) on these d < n
    instances; so does the working set (a certificate on rows of S is one for the whole problem)."""
    inst = A.random_instance(n, T, d, seed=seed, family=family)
    with pytest.raises(InfeasibleSVMError):
        solve_svm(inst, method="dual")
    with pytest.raises(InfeasibleSVMError, match="contradict"):
        solve_svm_working_set(inst)


def test_trivially_infeasible_names_the_cause() -> None:
    """Oracle: the definition: a zero query makes every constraint of its sequence read ``0 ≥ 1``."""
    inst0 = A.random_instance(3, 4, 5, seed=0)
    z = np.array(inst0.z)
    z[1] = 0.0
    with pytest.raises(InfeasibleSVMError, match="zero query"):
        solve_svm_working_set(A.Instance(inst0.X, inst0.Y, inst0.v, z))


@pytest.mark.parametrize(("jx", "jz"), [(0, 0), (3, -7), (-500, -400), (600, 300), (-1000, 900)])
def test_power_of_two_equivariance(jx: int, jz: int) -> None:
    """Oracle: ``W_mm(2^jx X, 2^jz z) = 2^−(jx+jz)·W_mm(X, z)`` bitwise (the unit-row problem is the same
    bit for bit), duals ``·2^−2(jx+jz)`` via their mantissa/exponent, the same support."""
    inst = A.random_instance(5, 4, 8, seed=3)
    ref = solve_svm_working_set(inst)
    sol = solve_svm_working_set(S.scaled(inst, jx, jz))
    assert np.array_equal(sol.W, np.ldexp(ref.W, -(jx + jz)))
    assert sol.support == ref.support and sol.certified == ref.certified
    assert sol.duals_mantissa is not None and ref.duals_mantissa is not None
    assert np.array_equal(sol.duals_mantissa, ref.duals_mantissa)
    assert sol.duals_exponent == ref.duals_exponent - 2 * (jx + jz)


@pytest.mark.parametrize(("jx", "jz"), [(-520, -520), (520, 520)])
def test_out_of_range_answer_raises_like_solve_svm(jx: int, jz: int) -> None:
    """Oracle: ``||W_mm|| ≈ 2^−(jx+jz)`` at these scales is beyond float64 (2^1040 or 2^−1040): a
    ``NumericalError`` naming the range, as ``solve_svm`` raises (never 0 or inf)."""
    inst = S.scaled(A.random_instance(5, 4, 8, seed=3), jx, jz)
    with pytest.raises(NumericalError, match="normal range"):
        solve_svm_working_set(inst)
    with pytest.raises(NumericalError, match="normal range"):
        solve_svm(inst, method="dual")


SCALE_BASE = st.one_of(
    S.feasible_instances(n=(1, 3), T=(2, 4)),
    st.sampled_from(S.INSTANCE_FAMILIES).flatmap(lambda f: S.instances(family=f)),
)


def test_scale_sweep_property() -> None:
    """Oracle: equivariance over float64's whole exponent range (``scaled_instances``, shrinking to
    exponent 0) against the same solver at scale 1, and at scale 1 the dense certified dual (``W`` within
    the certified bounds; infeasibility and certification alike). Outcomes are counted with ``event``;
    examples in the boundary band of the range (either outcome right) are counted and bounded."""
    counts = {"calls": 0, "boundary": 0, "infeasible": 0, "refused": 0, "returned": 0}

    @settings(max_examples=60, derandomize=True, deadline=None, database=None)
    @given(si=S.scaled_instances(SCALE_BASE, scale_v=False))
    def prop(si: S.ScaledInstance) -> None:
        counts["calls"] += 1
        k = si.jx + si.jz

        def outcome(f: Any) -> tuple[str, Any]:
            try:
                return "ok", f()
            except AttnSVMError as exc:
                return type(exc).__name__, exc

        kind0, ref = outcome(lambda: solve_svm_working_set(si.original))
        kindd, dense = outcome(lambda: solve_svm(si.original, method="dual"))
        assert kind0 == kindd, (kind0, kindd, ref, dense)
        kind, sol = outcome(lambda: solve_svm_working_set(si.inst))
        if kind0 != "ok":
            event(f"scale 1 raises {kind0}")
            counts["infeasible"] += 1
            assert kind == kind0, (kind, sol)
            return
        assert ref.certified == dense.certified
        if ref.certified:
            assert _rel(ref.W, dense.W) <= AGREE_RTOL
        wlog2 = math.log2(ref.objective) - k
        if min(abs(wlog2 - LOG2_TINY), abs(wlog2 - LOG2_MAX)) <= BOUNDARY_LOG_SLACK:
            counts["boundary"] += 1
            event("boundary band of the range (either outcome accepted)")
            assert kind in ("ok", "NumericalError")
            return
        if not (LOG2_TINY <= wlog2 < LOG2_MAX):
            event("raises NumericalError (W_mm out of range)")
            counts["refused"] += 1
            assert kind == "NumericalError" and "normal range" in str(sol), (kind, sol)
            return
        event("returns the rescaled answer")
        counts["returned"] += 1
        assert kind == "ok", (kind, sol)
        # one correctly rounded ldexp from the same unit-row solution: bitwise (subnormal entries too)
        assert np.array_equal(sol.W, np.ldexp(ref.W, -k))
        assert sol.support == ref.support and sol.certified == ref.certified

    prop()
    assert counts["boundary"] <= MAX_BOUNDARY_FRACTION * counts["calls"], counts
    # the sweep reaches both sides of the contract (it would test nothing otherwise)
    assert counts["returned"] > 0 and counts["refused"] > 0, counts


def test_lanczos_condition_estimate_matches_the_eigenvalues(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: the exact eigenvalues (``numpy.linalg.eigvalsh``) of the unit-row Gram matrix of the support
    rows, built by the public :func:`attnsvm.svm_gram` and ``D K D`` with ``D = diag(1/||a_r||)``. The
    Lanczos estimate (forced by ``EXACT_COND_MAX = 0``) gives ``error_bound = cond·eps`` to its tolerance."""
    inst = A.random_instance(24, 12, 16, seed=4)
    exact = solve_svm_working_set(inst)
    monkeypatch.setattr(ws, "EXACT_COND_MAX", 0)
    lanczos = solve_svm_working_set(inst)
    assert lanczos.duals is not None
    K = A.svm_gram(inst, lanczos.alpha)
    on = np.flatnonzero(np.asarray(lanczos.duals) > 0)
    Dn = 1.0 / np.sqrt(np.diag(K)[on])
    ev = np.linalg.eigvalsh(K[np.ix_(on, on)] * Dn[:, None] * Dn[None, :])
    cond = ev[-1] / ev[0]
    assert -COND_RTOL_BELOW <= lanczos.error_bound / (cond * EPS) - 1.0 <= COND_RTOL_ABOVE
    assert abs(exact.error_bound / (cond * EPS) - 1.0) <= 1e-6  # the exact path: eigenvalues too
    assert np.array_equal(lanczos.W, exact.W)


def test_progress_and_limits() -> None:
    """Oracle: the definition of the options. ``progress`` sees every round, the last with no violated
    row; ``max_working_set`` below the support size refuses with SolverError; inputs are not modified."""
    inst = A.random_instance(16, 8, 16, seed=0)
    X0, z0 = np.array(inst.X), np.array(inst.z)
    seen: list[dict[str, Any]] = []
    sol = solve_svm_working_set(inst, progress=seen.append)
    assert seen and seen[-1]["violated"] == 0 and [p["round"] for p in seen] == list(range(1, len(seen) + 1))
    assert {"working_set", "free", "min_slack", "pivots", "elapsed_s", "path"} <= set(seen[0])
    assert np.array_equal(inst.X, X0) and np.array_equal(inst.z, z0)
    with pytest.raises(SolverError, match="max_working_set"):
        solve_svm_working_set(inst, max_working_set=len(sol.support) - 1)


@pytest.mark.parametrize(
    "kwargs", [{"chunk": 0}, {"chunk": 2.5}, {"max_working_set": -1}, {"max_working_set": True}]
)
def test_bad_options_raise(kwargs: dict[str, Any]) -> None:
    """Oracle: the documented option types (positive integers): InvalidInstanceError naming the option."""
    with pytest.raises(InvalidInstanceError, match=next(iter(kwargs))):
        solve_svm_working_set(A.random_instance(3, 3, 4), **kwargs)


def test_not_an_instance() -> None:
    """Oracle: the documented argument type."""
    with pytest.raises(InvalidInstanceError, match="Instance"):
        solve_svm_working_set(np.zeros((2, 3, 4)))  # type: ignore[arg-type]
