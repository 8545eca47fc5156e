"""The scale contract of the Att-SVM solvers and ``attnsvm svm`` (issue 13 §1): regression tests.

Each observed failure is reproduced here and must now give the right answer or a one-line
``NumericalError`` naming float64's range. Oracles: the equivariance ``W_mm(aX, bz) = W_mm(X, z)/(ab)``
(multipliers ``/(ab)²``) against the solve at scale 1, closed forms, and primal feasibility of the
returned ``W`` recomputed in mpmath at the data's scale (mpmath numbers neither overflow nor underflow).

Tolerances. A certified solution is within ``CERTIFY_RTOL`` (relative, Frobenius) of its exact
``W_mm``. Scaling by a power of ten rounds every entry once (relative ``eps``), which moves the exact
``W_mm`` by at most ``cond·eps``; certification caps ``cond·eps`` at ``CERTIFY_RTOL``. So two certified
solutions at scales ``1`` and ``10^k`` agree after rescaling to ``DECIMAL_RTOL = 4·CERTIFY_RTOL`` (two
certified errors + two roundings); with exact powers of two the roundings vanish: ``POW2_RTOL = 2·CERTIFY_RTOL``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import mpmath
import numpy as np
import pytest

from attnsvm.errors import InfeasibleSVMError, NumericalError, SolverError
from attnsvm.model._instance import Instance
from attnsvm.svm import CERTIFY_RTOL, local_optimality_report, min_norm_dual, solve_svm

ROOT = Path(__file__).resolve().parents[1]
DECIMAL_RTOL = 4 * CERTIFY_RTOL
POW2_RTOL = 2 * CERTIFY_RTOL
#: Nuclear norm: the SDP solve is accurate to Clarabel's tolerances (1e-8) times the conditioning;
#: the unit-row reformulation makes the scaled and unscaled SDPs the same up to one rounding per entry,
#: so they agree to the solver's accuracy (NUC_SUPPORT_TOL = 1e-6 in attnsvm.svm).
NUC_RTOL = 1e-6
#: ...but W itself only to about √(1e-8) = 1e-4: the nuclear norm is not strongly convex, so an
#: objective within 1e-8 of optimal pins W down only to the square root (measured here: 2.9e-6).
NUC_W_RTOL = 1e-4
#: Margins recomputed in mpmath from the returned W: a certified W is feasible to CERTIFY_RTOL relative
#: to |b_r| + ||a_r||·||W|| (the KKT definition), ×10 for the float64 rounding of W's entries.
MARGIN_RTOL = 10 * CERTIFY_RTOL
RANGE = r"normal range \[2\.2e-308, 1\.8e308\]"


def _base() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 4, 5))
    z = rng.standard_normal((3, 5))
    return X, np.array([1.0, -1.0, 1.0]), rng.standard_normal(5), z, np.array([0, 1, 2])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _mp_min_relative_slack(inst: Instance, W: np.ndarray, alpha: np.ndarray) -> float:
    """min over rows of (Δᵀ W z − 1)/(1 + ||Δ||·||z||·||W||), all in 50-digit mpmath from the doubles."""
    mpmath.mp.dps = 50
    n, T, d = inst.shape
    Wm = mpmath.matrix([[mpmath.mpf(float(w)) for w in row] for row in W])
    wn = mpmath.sqrt(sum(Wm[k, j] ** 2 for k in range(d) for j in range(d)))
    out = []
    for i in range(n):
        zi = [mpmath.mpf(float(x)) for x in inst.z[i]]
        for t in range(T):
            if t == alpha[i]:
                continue
            D = [
                mpmath.mpf(float(inst.X[i, alpha[i], k])) - mpmath.mpf(float(inst.X[i, t, k]))
                for k in range(d)
            ]
            m = sum(D[k] * Wm[k, j] * zi[j] for k in range(d) for j in range(d))
            nd = mpmath.sqrt(sum(x**2 for x in D))
            nz = mpmath.sqrt(sum(x**2 for x in zi))
            out.append((m - 1) / (1 + nd * nz * wn))
    return float(min(out))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(
        [sys.executable, "-m", "attnsvm.harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


# ================================================================================ API
def test_solve_svm_at_1e80_returns_w_over_1e160() -> None:
    """Was W = 0 with primal feasibility 1.0. Oracle: equivariance (scale-1 solve / 1e160) and
    mpmath primal feasibility of the returned W at the data's scale."""
    X, Y, v, z, alpha = _base()
    ref = solve_svm(Instance(X, Y, v, z), alpha)
    inst = Instance(X * 1e80, Y, v, z * 1e80)
    sol = solve_svm(inst, alpha)
    assert sol.certified and sol.kkt is not None and sol.kkt.primal_feasibility <= CERTIFY_RTOL
    assert _rel(sol.W * 1e160, ref.W) <= DECIMAL_RTOL
    assert sol.objective == pytest.approx(ref.objective / 1e160, rel=DECIMAL_RTOL)
    assert set(sol.support) == set(ref.support)
    assert _mp_min_relative_slack(inst, np.asarray(sol.W), alpha) >= -MARGIN_RTOL
    # the multipliers scale by 1/(ab)² = 1e-320: below the normal range, so `duals` is None and the exact
    # mantissa·2^exponent form carries them
    assert sol.duals is None and sol.duals_mantissa is not None and ref.duals is not None
    # λ·1e320 = mantissa·2^(exponent+1063)·(1e160·2^−531)·(1e160·2^−532): every factor a normal double
    lam = (
        np.ldexp(sol.duals_mantissa, sol.duals_exponent + 1063)
        * math.ldexp(1e160, -531)
        * math.ldexp(1e160, -532)
    )
    big = ref.duals > 1e-6 * ref.duals.max()
    np.testing.assert_allclose(lam[big], ref.duals[big], rtol=DECIMAL_RTOL)


@pytest.mark.parametrize("c", [1e155, 1e-160, 1e200])
def test_solve_svm_refuses_only_an_unrepresentable_w(c: float) -> None:
    """Was a foreign ValueError ("array must not contain infs or NaNs") at 1e155. ||W_mm|| ≈ 0.38/c² is
    below 2.2e-308 (c = 1e155, 1e200) or above 1.8e308 (c = 1e-160). Oracle: equivariance (scale-1 norm)."""
    X, Y, v, z, alpha = _base()
    ref = solve_svm(Instance(X, Y, v, z), alpha)
    predicted = math.log10(ref.objective) - 2 * math.log10(c)
    assert predicted < -308 or predicted > 308
    with pytest.raises(NumericalError, match=r"the Att-SVM solution \|\|W_mm\|\|_F is about 1e") as exc:
        solve_svm(Instance(X * c, Y, v, z * c), alpha)
    assert "normal range [2.2e-308, 1.8e308]" in str(exc.value)
    assert f"1e{predicted:+.0f}" in str(exc.value)


@pytest.mark.parametrize("j", [-1020, -600, 500, 1000])
def test_solve_svm_is_exactly_equivariant_under_powers_of_two(j: int) -> None:
    """X → 2^j X with z fixed (entries up to ~2^1022: differences x_iα − x_it overflow at j = 1000 if
    formed naively). Oracle: equivariance, W·2^j = W(scale 1)."""
    X, Y, v, z, alpha = _base()
    ref = solve_svm(Instance(X, Y, v, z), alpha)
    sol = solve_svm(Instance(np.ldexp(X, j), Y, v, z), alpha)
    assert sol.certified
    assert _rel(np.ldexp(sol.W, j), ref.W) <= POW2_RTOL
    np.testing.assert_allclose(sol.margins, ref.margins, rtol=POW2_RTOL)


@pytest.mark.parametrize("method", ["primal", "vector"])
def test_conic_methods_at_1e80(method: str) -> None:
    """Oracle: equivariance (the certified scale-1 solve / 1e160); the raw conic answer scales too."""
    X, Y, v, z, alpha = _base()
    ref = solve_svm(Instance(X, Y, v, z), alpha)
    sol = solve_svm(Instance(X * 1e80, Y, v, z * 1e80), alpha, method=method)
    assert sol.certified
    assert _rel(sol.W * 1e160, ref.W) <= DECIMAL_RTOL
    assert sol.W_raw is not None and sol.raw_rel_error is not None
    assert _rel(np.asarray(sol.W_raw) * 1e160, ref.W) <= 2 * sol.raw_rel_error + DECIMAL_RTOL


def test_nuclear_norm_at_1e80() -> None:
    """Oracle: equivariance of the nuclear-norm Att-SVM (constraints bilinear, ||·||_* homogeneous)."""
    X, Y, v, z, alpha = _base()
    ref = solve_svm(Instance(X, Y, v, z), alpha, norm="nuc")
    sol = solve_svm(Instance(X * 1e80, Y, v, z * 1e80), alpha, norm="nuc")
    assert sol.objective * 1e160 == pytest.approx(ref.objective, rel=NUC_RTOL)
    assert _rel(sol.W * 1e160, ref.W) <= NUC_W_RTOL
    assert float(np.min(sol.margins)) >= 1 - NUC_RTOL


def test_rows_spanning_300_orders_are_flagged_not_certified() -> None:
    """One sequence at 1e-300, another at 1: W_mm ~ 1e299, and the second sequence's constraint
    Δᵀ W z ≥ 1 is below the rounding of its margin (~1e283). The solve must not claim certification, and
    local optimality must refuse (was "locally optimal" from an uncertified support). Oracle: mpmath
    margins of the returned W show the constraint cannot be checked at this precision."""
    X, Y, v, z, alpha = _base()
    X = X.copy()
    X[0] *= 1e-300
    inst = Instance(X, Y, v, z)
    sol = solve_svm(inst, alpha)
    assert not sol.certified
    assert np.all(np.isfinite(sol.W))
    msg = (
        r"^cannot decide local optimality: support constraint \(i, t\) = \(\d+, \d+\) is unresolved in "
        r"float64 — \|\|Delta_it\|\|·\|\|z_i\|\|·\|\|W_mm\|\| exceeds 1/SUPPORT_RTOL = 1e9, so its right-hand "
        r"side 1 is below the rounding of its margin \(the data span too many orders of magnitude across "
        r"sequences or tokens\)\. Rescale the sequences to comparable sizes\.$"
    )
    with pytest.raises(SolverError, match=msg):
        local_optimality_report(inst, alpha)


def test_moderate_spread_across_sequences_is_certified_and_feasible_in_mpmath() -> None:
    """Sequences at 1e-3, 1 and 1e3 (rows differ by 1e6): certified, and feasible at the data's scale
    recomputed in mpmath. Oracle: mpmath margins; equivariance under a further 2^400 scaling of X."""
    X, Y, v, z, alpha = _base()
    X = X * np.array([1e-3, 1.0, 1e3])[:, None, None]
    inst = Instance(X, Y, v, z)
    sol = solve_svm(inst, alpha)
    assert sol.certified
    assert _mp_min_relative_slack(inst, np.asarray(sol.W), alpha) >= -MARGIN_RTOL
    far = solve_svm(Instance(np.ldexp(X, 400), Y, v, z), alpha)
    assert far.certified and _rel(np.ldexp(far.W, 400), sol.W) <= POW2_RTOL


def test_local_optimality_is_invariant_under_tiny_v_and_x() -> None:
    """Scores γ = Y vᵀx of order 1e-300: ties were judged against max(1, |γ|), so every support token
    looked tied. Oracle: invariance of the definition (γ_iα > γ_it within a sequence) under v → cv."""
    X, Y, v, z, alpha = _base()
    inst = Instance(X, Y, v, z)
    a = inst.optimal_tokens()
    ref = local_optimality_report(inst, a)
    assert ref.locally_optimal
    for jx, jv in [(-500, -500), (0, -1070), (1000, 20)]:
        rep = local_optimality_report(Instance(np.ldexp(X, jx), Y, np.ldexp(v, jv), np.ldexp(z, jx)), a)
        assert (rep.feasible, rep.locally_optimal) == (True, True)
        assert set(rep.support) == set(ref.support) and rep.violating == ()


def test_infeasibility_is_scale_invariant() -> None:
    """A selected token that is the midpoint of two others: infeasible at every scale, with the reason.
    Oracle: Farkas (½Δ₁ + ½Δ₂ = 0 while the right-hand sides add to 1)."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]])
    for c in (1.0, 2.0**-1000, 2.0**1000):
        inst = Instance(X * c, np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 2.0]]))
        with pytest.raises(InfeasibleSVMError, match="contradict each other"):
            solve_svm(inst, [2])


# ======================================================================= min_norm_dual
def test_min_norm_dual_diagonal_gram_spanning_600_orders() -> None:
    """K = diag(1, 1e-300), b = (1, 1): w = (1, 1e150) in the factor's coordinates, λ = (1, 1e300).
    Was an "identically zero row" infeasibility claim (the eigen-factor dropped 1e-300). Oracle: closed
    form w_r = b_r/√K_rr, λ_r = b_r/K_rr."""
    r = min_norm_dual(np.diag([1.0, 1e-300]), np.ones(2))
    assert r.certified
    assert r.norm == pytest.approx(math.hypot(1.0, 1e150), rel=POW2_RTOL)
    np.testing.assert_allclose(r.multipliers, [1.0, 1e300], rtol=POW2_RTOL)
    np.testing.assert_allclose(r.margins, [1.0, 1.0], rtol=POW2_RTOL)


@pytest.mark.parametrize(("j", "jb"), [(-500, 0), (500, 300), (0, -1000), (-510, -1000)])
def test_min_norm_dual_equivariance(j: int, jb: int) -> None:
    """min_norm_dual(4^j K, 2^jb b): w·2^(jb−j), λ·2^(jb−2j). Oracle: equivariance vs scale 1."""
    rng = np.random.default_rng(3)
    Am = rng.standard_normal((6, 9))
    b = rng.standard_normal(6) + 0.5
    ref = min_norm_dual(Am @ Am.T, b, factor=Am)
    r = min_norm_dual(np.ldexp(Am @ Am.T, 2 * j), np.ldexp(b, jb), factor=np.ldexp(Am, j))
    assert r.certified
    assert r.norm == pytest.approx(math.ldexp(ref.norm, jb - j), rel=POW2_RTOL)
    np.testing.assert_allclose(np.ldexp(r.multipliers, 2 * j - jb), ref.multipliers, rtol=POW2_RTOL, atol=0)
    np.testing.assert_array_equal(r.support, ref.support)


def test_min_norm_dual_binding_rhs_far_below_a_negative_one() -> None:
    """b = (6.5e-232, −1) on rows 0.027, −0.054 (d = 1): w = b_0/a_0 = 2.4e-230. Was ||w|| = 0 certified
    (the scale was set by |b_1| and ||w||² underflowed). Oracle: closed form (one binding row)."""
    a = np.array([[0.02704693], [-0.0539913]])
    b = np.array([6.49190681e-232, -1.0])
    r = min_norm_dual(a @ a.T, b)
    assert r.certified
    assert r.norm == pytest.approx(b[0] / a[0, 0], rel=POW2_RTOL)
    np.testing.assert_allclose(r.multipliers, [b[0] / a[0, 0] ** 2, 0.0], rtol=POW2_RTOL)


def test_min_norm_dual_with_no_positive_rhs_is_trivial() -> None:
    """Every b_r ≤ 0 (one of them −1e308): w = 0 is feasible, hence optimal. Oracle: w = 0, λ = 0 satisfy
    the KKT conditions exactly."""
    r = min_norm_dual(np.eye(2), np.array([-1.0, -1e308]))
    assert r.method == "trivial" and r.norm == 0.0 and r.certified
    assert np.all(r.multipliers == 0.0)


def test_min_norm_dual_refuses_an_unrepresentable_solution() -> None:
    """b ~ 1e300 with rows ~1e-10: ||w|| ~ 1e310 overflows. Oracle: closed form ||w|| = b/||a||."""
    with pytest.raises(NumericalError, match=r"least-norm solution \|\|w\|\| is about 1e\+310.*" + RANGE):
        min_norm_dual(np.array([[1e-20]]), np.array([1e300]))


# ================================================================================= CLI
@pytest.fixture(scope="module")
def scaled_files(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    X, Y, v, z, alpha = _base()
    d = tmp_path_factory.mktemp("scaled")
    out = {}
    for c in (1.0, 1e80, 1e155):
        p = d / f"data_{c:g}.npz"
        np.savez(p, X=X * c, Y=Y, v=v, z=z * c, alpha=alpha)
        out[c] = p
    return out


def test_cli_svm_at_1e80_prints_the_scaled_answer(scaled_files: dict[float, Path]) -> None:
    """Was exit 0 with W = 0, primal_feasibility 1.0, locally_optimal true. Oracle: equivariance against
    the CLI at scale 1 (W/1e160, same support and verdict)."""
    ref = json.loads(run_cli("svm", str(scaled_files[1.0]), "--json").stdout)
    proc = run_cli("svm", str(scaled_files[1e80]), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    W = np.array(doc["W"])
    assert _rel(W * 1e160, np.array(ref["W"])) <= DECIMAL_RTOL
    assert doc["kkt"]["primal_feasibility"] <= CERTIFY_RTOL and doc["certified"]
    assert doc["norm_fro"] == pytest.approx(ref["norm_fro"] / 1e160, rel=DECIMAL_RTOL)
    assert doc["locally_optimal"] == ref["locally_optimal"]
    assert sorted(doc["support"]) == sorted(ref["support"])
    assert doc["duals"] is None and doc["duals_scaled"]["meaning"] == "duals = mantissa * 2**exponent"


def test_cli_svm_at_1e155_is_a_one_line_range_error(scaled_files: dict[float, Path]) -> None:
    """Was exit 1 with a traceback. Now: exit 2, one line naming the quantity and the range."""
    proc = run_cli("svm", str(scaled_files[1e155]))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "NumericalError: the Att-SVM solution ||W_mm||_F is about 1e-310" in lines[0]
    assert "normal range [2.2e-308, 1.8e308]" in lines[0]


def test_cli_svm_on_rows_spanning_300_orders_reports_uncertified_and_undecided(tmp_path: Path) -> None:
    """The API case above through the CLI: exit 0 with certified false and locally_optimal null (the
    reason names the unresolved constraint), never a verdict from an uncertified support."""
    X, Y, v, z, alpha = _base()
    X = X.copy()
    X[0] *= 1e-300
    p = tmp_path / "spread.npz"
    np.savez(p, X=X, Y=Y, v=v, z=z, alpha=alpha)
    proc = run_cli("svm", str(p), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["certified"] is False and doc["locally_optimal"] is None
    assert doc["local_optimality"].startswith("undecided: cannot decide local optimality")
    assert np.all(np.isfinite(np.array(doc["W"])))


def test_overflowing_difference_in_one_sequence_leaves_subnormal_rows_of_others_exact() -> None:
    """Sequence 0: tokens ±1.5e308 on e₃ (x_iα − x_it overflows); sequence 1: Δ = (3, 1, 0)·2^-1074 (subnormal)
    with z = 2^1000·e₁. Only the overflowing row may take the halving path: halving sequence 1's Δ would
    round its subnormal entries (3, 1)·2^-1074 to (2, 0)·2^-1074 and solve another problem. Oracle: the rows
    are orthogonal, so ||W_mm||² = Σ_r 1/(||Δ_r||·||z_r||)² = (2^74/√10)² + (1/3e308)²; the second term is
    below rounding. The solve is not certified (rows span ~10^330), but two orthogonal rows are exact."""
    tiny = 2.0**-1074
    X = np.zeros((2, 2, 3))
    X[0, 0, 2], X[0, 1, 2] = 1.5e308, -1.5e308
    X[1, 0, :2] = [3 * tiny, tiny]
    z = np.zeros((2, 3))
    z[0, 2], z[1, 0] = 1.0, 2.0**1000
    sol = solve_svm(Instance(X, np.ones(2), np.ones(3), z), [0, 0])
    assert sol.objective == pytest.approx(2.0**74 / math.sqrt(10), rel=POW2_RTOL)
