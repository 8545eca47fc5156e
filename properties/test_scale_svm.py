"""Scale sweep of the Att-SVM solvers (issue 13 §2): data scaled by 2^j over float64's whole range.

Data: :func:`attnsvm.strategies.scaled_instances` multiplies ``X``, ``z`` (and ``v``) by exact powers
of two ``2^jx``, ``2^jz``, ``2^jv``, each exponent drawn over the whole range that keeps every entry a
normal double and shrinking towards 0 (a failure shrinks to the smallest exponent that breaks), on
:func:`~attnsvm.strategies.feasible_instances` and on generic instances of every family (``gaussian``,
``unit``, ``uniform``), with a drawn token choice ``α``.

Oracle: equivariance, i.e. what the answer must be given the answer at scale 1. The constraints
``(x_iα − x_it)ᵀ W z_i ≥ 1`` are bilinear in ``(X, z)`` and the norms are homogeneous, so

    W_mm(2^jx X, 2^jz z) = 2^−(jx+jz)·W_mm(X, z),   λ(2^jx X, 2^jz z) = 2^−2(jx+jz)·λ(X, z),

the margins, the support, the certification and local optimality are invariant (local optimality
also under ``v → 2^jv v``), and infeasibility is invariant. For ``min_norm_dual``
(``min ½||w||² s.t. a_rᵀw ≥ b_r`` from ``K = AAᵀ``): ``K → 4^j K`` (rows ``→ 2^j a_r``) and
``b → 2^jb b`` give ``w → 2^(jb−j) w`` and ``λ → 2^(jb−2j) λ``. A call must raise ``NumericalError``
naming float64's range exactly when the oracle's answer is not a normal double (within
``BOUNDARY_LOG_SLACK`` of the range's ends either outcome is right; counted), and return the oracle's
answer otherwise. Every example is compared; none is discarded. Outcomes are counted with
``hypothesis.event``.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import pytest
from _discards import too_many_discards
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnsvm import strategies as S
from attnsvm.errors import AttnSVMError
from attnsvm.model._instance import Instance
from attnsvm.scaling import pow2_exponent
from attnsvm.svm import CERTIFY_RTOL, MULTIPLIER_RTOL, local_optimality_report, min_norm_dual, solve_svm

EPS = float(np.finfo(np.float64).eps)
LOG2_TINY = -1022.0  # log2 of the smallest normal double
LOG2_MAX = 1024.0  # log2 of the first power of two above FLOAT_MAX
#: Two certified solutions of problems whose exact answers agree after an exact power-of-two scaling
#: are each within CERTIFY_RTOL (relative, Frobenius) of it: 2·CERTIFY_RTOL. Entries of ``W`` below
#: 2^−1022 are rounded to the subnormal grid (absolute 2^−1075 each, ≤ d·2^−1075 in Frobenius norm,
#: ≤ d·2^−53 relative to ``||W|| ≥ 2^−1022``), covered by the extra ``64·EPS`` for ``d ≤ 64``.
SWEEP_RTOL = 2 * CERTIFY_RTOL + 64 * EPS
#: The same for the nuclear-norm solver, which is certified only to its own optimality gap: two SDP
#: solves of bitwise-equivalent problems (the unit-row reformulation makes them so) agree to the solver's
#: tolerance; 1e-6 is Clarabel's feasibility/gap tolerance 1e-8 times the conditioning headroom used by
#: NUC_SUPPORT_TOL in attnsvm.svm.
NUC_SWEEP_RTOL = 1e-6
#: W of the nuclear-norm problem only to about √(1e-8) = 1e-4 (the nuclear norm is not strongly convex:
#: an objective within 1e-8 of optimal pins W down only to the square root).
NUC_W_RTOL = 1e-4
#: A solver decides "not representable" from ``log||W||`` computed to relative ~1e-9 (certified) plus
#: one rounding of the log: within this many units of log2 of the range's ends either outcome is right.
BOUNDARY_LOG_SLACK = 1e-6
#: At most this fraction of examples may fall in that boundary band (a strategy steering there would
#: test nothing); asserted by ``test_zz_boundary_band_is_rare``.
MAX_BOUNDARY_FRACTION = 0.05
RANGE_MESSAGE = r"1\.8e308|2\.2e-308|normal range"
#: KKT residuals recomputed in mpmath from a certified solution: CERTIFY_RTOL for the solver's own
#: residuals plus the float64 rounding of W's entries and of the multipliers (relative eps each, ≪ 1e-9);
#: ×10 headroom for the recomputation, as in properties/test_svm.py.
KKT_RTOL = 10 * CERTIFY_RTOL

FAMILIES = st.sampled_from(S.INSTANCE_FAMILIES).flatmap(lambda f: S.instances(family=f))
FEASIBLE = S.feasible_instances(n=(1, 3), T=(2, 4))
BASE = st.one_of(FEASIBLE, FAMILIES)
costly = settings(max_examples=max(5, settings.default.max_examples // 5))

_COUNTS = {"calls": 0, "boundary": 0}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """||a − b||/||b|| computed on both scaled by the same power of two (no overflow in the norms)."""
    e = pow2_exponent(b)  # max|b|·2^−e ∈ [½, 1)
    a2, b2 = np.ldexp(a, -e), np.ldexp(b, -e)
    return float(np.linalg.norm(a2 - b2) / max(np.linalg.norm(b2), np.finfo(np.float64).tiny))


def _outcome(f: Any) -> tuple[str, Any]:
    try:
        return "ok", f()
    except AttnSVMError as exc:
        return type(exc).__name__, exc


def _expect_range(log2_value: float) -> bool | None:
    """``True``: outside the normal range; ``False``: inside; ``None``: in the boundary band (count)."""
    _COUNTS["calls"] += 1
    if min(abs(log2_value - LOG2_TINY), abs(log2_value - LOG2_MAX)) <= BOUNDARY_LOG_SLACK:
        _COUNTS["boundary"] += 1
        event("boundary band of the range (either outcome accepted)")
        return None
    return not (LOG2_TINY <= log2_value < LOG2_MAX)


def _check_svm(si: S.ScaledInstance, alpha: np.ndarray, *, norm: str = "fro", method: str = "auto") -> None:
    """The shared oracle of the solve_svm properties (see the module docstring)."""
    k = si.jx + si.jz  # W scales by 2^−k, duals by 2^−2k
    kind0, ref = _outcome(lambda: solve_svm(si.original, alpha, norm=norm, method=method))
    kind, sol = _outcome(lambda: solve_svm(si.inst, alpha, norm=norm, method=method))
    if kind0 != "ok":
        # infeasible / unsolvable at scale 1 ⇒ the same at every scale (equivariance); a range error at
        # scale 1 is impossible for the strategies' moderate data.
        event(f"scale 1 raises {kind0}")
        assert kind == kind0, (kind, sol)
        return
    wlog2 = math.log2(ref.objective) - k
    out = _expect_range(wlog2)
    if kind == "NumericalError":
        event("raises NumericalError (W_mm out of range)")
        assert out is not False, f"refused although ||W_mm|| = 2^{wlog2:.1f} is a normal double: {sol}"
        assert any(s in str(sol) for s in ("1.8e308", "2.2e-308", "normal range")), str(sol)
        return
    assert kind == "ok", (kind, sol)
    assert out is not True, f"returned although ||W_mm|| = 2^{wlog2:.1f} is outside the normal range"
    event("returns W")
    rtol = SWEEP_RTOL if norm == "fro" else NUC_SWEEP_RTOL
    assert np.all(np.isfinite(sol.W))
    # ldexp back: exact unless W's entries are subnormal
    assert _rel(np.ldexp(sol.W, k), ref.W) <= (SWEEP_RTOL if norm == "fro" else NUC_W_RTOL)
    assert math.isclose(math.log2(sol.objective) + k, math.log2(ref.objective), abs_tol=rtol)
    assert np.allclose(sol.margins, ref.margins, rtol=rtol, atol=0)
    assert set(sol.support) == set(ref.support)
    assert sol.certified == ref.certified
    if norm != "fro":
        return
    assert ref.duals_mantissa is not None and sol.duals_mantissa is not None
    # duals = mantissa·2^exponent (exact at every scale) and 2^−2k times the scale-1 ones; compared on the
    # significant entries (the rest count as 0), mantissa against mantissa so nothing leaves the range
    m0 = np.asarray(ref.duals_mantissa)
    sig = m0 > MULTIPLIER_RTOL * float(np.max(m0, initial=0.0))
    m1 = np.ldexp(np.asarray(sol.duals_mantissa), sol.duals_exponent + 2 * k - ref.duals_exponent)
    assert np.allclose(m1[sig], m0[sig], rtol=rtol, atol=0)
    logs = np.log2(m0[sig]) + ref.duals_exponent - 2 * k
    outs = [_expect_range(float(lg)) for lg in logs]
    if sol.duals is None:
        event("duals outside the normal range (returned as mantissa·2^exponent)")
        assert any(o is not False for o in outs)
    else:
        assert not any(o is True for o in outs)
        lam = np.asarray(sol.duals)[sig]
        assert np.allclose(np.ldexp(lam, 2 * k - ref.duals_exponent), m0[sig], rtol=rtol, atol=0)


@given(S.scaled_instances(BASE, scale_v=False), st.data())
def test_solve_svm_dual_is_equivariant(si: S.ScaledInstance, data: st.DataObject) -> None:
    """solve_svm (dual/auto): W, duals, margins, support and certification equivariant under 2^jx X, 2^jz z;
    raises NumericalError exactly when 2^−(jx+jz)·||W_mm|| is not normal. Oracle: equivariance."""
    _check_svm(si, data.draw(S.token_choices(si.original), label="alpha"))


@costly
@pytest.mark.parametrize("method", ["primal", "vector"])
@given(si=S.scaled_instances(FEASIBLE, scale_v=False), data=st.data())
def test_solve_svm_conic_methods_are_equivariant(
    method: str, si: S.ScaledInstance, data: st.DataObject
) -> None:
    """solve_svm primal/vector (cvxpy + exact finish) at every scale. Oracle: equivariance."""
    _check_svm(si, data.draw(S.token_choices(si.original), label="alpha"), method=method)


@settings(max_examples=max(4, settings.default.max_examples // 25))
@given(si=S.scaled_instances(S.feasible_instances(n=(1, 2), T=(2, 3), attention="cross"), scale_v=False))
def test_solve_svm_nuclear_is_equivariant(si: S.ScaledInstance) -> None:
    """solve_svm norm="nuc" (SDP; 1/25 of the profile's examples, small n, T: ~60 ms each). Oracle: equivariance."""
    _check_svm(si, si.original.optimal_tokens(), norm="nuc")


@given(S.scaled_instances(BASE), st.data())
def test_local_optimality_report_is_scale_invariant(si: S.ScaledInstance, data: st.DataObject) -> None:
    """local_optimality_report under X → 2^jx X, z → 2^jz z, v → 2^jv v: the same verdict, support and
    violating pairs (or the same error) at every scale; it never raises a range error. Oracle: invariance
    (the definition compares scores within a sequence and uses the support, both scale-free)."""
    alpha = data.draw(S.token_choices(si.original), label="alpha")
    kind0, r0 = _outcome(lambda: local_optimality_report(si.original, alpha))
    kind, r = _outcome(lambda: local_optimality_report(si.inst, alpha))
    _COUNTS["calls"] += 1
    event(f"scale 1: {kind0 if kind0 != 'ok' else ('locally optimal' if r0.locally_optimal else 'not')}")
    assert kind == kind0, (kind, r)
    if kind == "ok":
        assert (r.feasible, r.locally_optimal) == (r0.feasible, r0.locally_optimal)
        assert set(r.support) == set(r0.support)
        assert set(r.violating) == set(r0.violating)


@st.composite
def gram_problems(draw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Rows ``A`` (the Att-SVM rows of a feasible instance, or of a generic one, with mixed-sign ``b``),
    ``K = AAᵀ``, and exponents ``j`` (``K → 4^j K``) and ``jb`` (``b → 2^jb b``) over their whole ranges."""
    inst: Instance = draw(BASE)
    alpha = draw(S.token_choices(inst))
    i = np.repeat(np.arange(inst.n), inst.T)
    t = np.tile(np.arange(inst.T), inst.n)
    keep = t != alpha[i]
    i, t = i[keep], t[keep]
    D = inst.X[i, alpha[i]] - inst.X[i, t]
    Am = np.einsum("rj,rk->rjk", inst.z[i], D).reshape(len(i), -1)  # Kronecker rows z_i ⊗ Δ_it
    if draw(st.booleans()):
        b = np.ones(len(i))
    else:  # mixed signs, one entry positive (all b_r ≤ 0 is the trivial w = 0, a unit test)
        b = np.array(draw(hnp.arrays(np.float64, (len(i),), elements=st.floats(-2.0, 2.0))))
        b[draw(st.integers(0, len(i) - 1))] = draw(st.floats(0.25, 2.0))
    K = Am @ Am.T
    lo, hi = S.exponent_range(K, Am)
    j = draw(st.integers(-((-lo) // 2), hi // 2))  # 2j within K's range, j within A's
    lob, hib = S.exponent_range(b)
    jb = draw(st.integers(lob, hib))
    return Am, K, b, j, jb


@given(gram_problems())
def test_min_norm_dual_is_equivariant(prob: tuple[np.ndarray, np.ndarray, np.ndarray, int, int]) -> None:
    """min_norm_dual(4^j K, 2^jb b) = 2^(jb−j) w, λ·2^(jb−2j), same support, certification and margins
    ·2^jb; raises NumericalError exactly when ||w|| or a significant multiplier is not normal.
    Oracle: equivariance (exact power-of-two scaling of the rows and of b)."""
    Am, K, b, j, jb = prob
    kind0, ref = _outcome(lambda: min_norm_dual(K, b))
    kind, sol = _outcome(lambda: min_norm_dual(np.ldexp(K, 2 * j), np.ldexp(b, jb)))
    if kind0 != "ok":
        event(f"scale 1 raises {kind0}")
        assert kind == kind0, (kind, sol)
        return
    if np.all(b <= 0.0):  # w = 0 is feasible, hence optimal, at every scale
        event("trivial (every b_r ≤ 0: w = 0)")
        assert kind == "ok" and sol.norm == 0.0 and ref.norm == 0.0
        return
    assert ref.norm > 0.0  # some b_r > 0 forces w ≠ 0 (never an underflowed 0)
    lam0 = np.asarray(ref.multipliers)
    sig = np.abs(lam0) > MULTIPLIER_RTOL * float(np.max(np.abs(lam0)))
    m0 = np.asarray(ref.margins)
    logs = [math.log2(ref.norm) + jb - j] + list(np.log2(np.abs(lam0[sig])) + jb - 2 * j)
    outs = [_expect_range(lg) for lg in logs]
    # margins a_rᵀw scale with b; only their overflow is an error (a margin is an absolute quantity: one
    # that is 0 in exact arithmetic comes out as rounding noise, and its underflow is no loss)
    outs += [_expect_range(max(lg, 0.0)) for lg in np.log2(np.abs(m0[m0 != 0])) + jb]
    if kind == "NumericalError":
        event("raises NumericalError (w, λ or a margin out of range)")
        assert any(o is not False for o in outs), str(sol)
        assert any(s in str(sol) for s in ("1.8e308", "2.2e-308", "normal range")), str(sol)
        return
    assert kind == "ok", (kind, sol)
    assert not any(o is True for o in outs), "returned although w, a multiplier or a margin is out of range"
    event("returns w")
    assert math.isclose(math.log2(sol.norm) - (jb - j), math.log2(ref.norm), abs_tol=SWEEP_RTOL)
    assert np.allclose(
        np.ldexp(np.asarray(sol.multipliers)[sig], 2 * j - jb), lam0[sig], rtol=SWEEP_RTOL, atol=0
    )
    assert np.array_equal(sol.support, ref.support)
    assert sol.certified == ref.certified
    scale = np.abs(b) + np.linalg.norm(Am, axis=1) * ref.norm  # the margins' rounding scale at scale 1
    assert np.all(np.abs(np.ldexp(np.asarray(sol.margins), -jb) - m0) <= SWEEP_RTOL * scale)


@st.composite
def spread_instances(draw: Any) -> Instance:
    """Each sequence's tokens (and, with cross-attention, its query) scaled by its own power of two, drawn
    over the whole range that keeps its entries normal (shrinking to 0): rows of one problem spanning up
    to ~600 orders of magnitude. Not an equivariance: a different problem, checked by its KKT conditions."""
    inst: Instance = draw(BASE)
    X = inst.X.copy()
    z = None if inst.self_attention else inst.z.copy()
    for i in range(inst.n):
        lo, hi = S.exponent_range(X[i])
        X[i] = np.ldexp(X[i], draw(st.integers(lo, hi), label=f"jx_{i}"))
        if z is not None:
            lo, hi = S.exponent_range(z[i])
            z[i] = np.ldexp(z[i], draw(st.integers(lo, hi), label=f"jz_{i}"))
    return Instance(X, inst.Y, inst.v, z)


def _mp_kkt(inst: Instance, alpha: np.ndarray, W: np.ndarray, lam: list[mpmath.mpf]) -> dict[str, float]:
    """Relative KKT residuals of ``min ½||W||² s.t. Δ_itᵀ W z_i ≥ 1`` in mpmath at the data's scale."""
    mpmath.mp.dps = 40
    n, T, d = inst.shape
    Wm = [[mpmath.mpf(float(W[k, j])) for j in range(d)] for k in range(d)]
    wn = mpmath.sqrt(sum(x**2 for row in Wm for x in row))
    M = [[mpmath.mpf(0)] * d for _ in range(d)]
    pf, cs = mpmath.mpf(0), mpmath.mpf(0)
    lmax = max(lam) if lam else mpmath.mpf(0)
    r = 0
    for i in range(n):
        zi = [mpmath.mpf(float(x)) for x in inst.z[i]]
        nz = mpmath.sqrt(sum(x**2 for x in zi))
        for t in range(T):
            if t == alpha[i]:
                continue
            D = [
                mpmath.mpf(float(inst.X[i, alpha[i], k])) - mpmath.mpf(float(inst.X[i, t, k]))
                for k in range(d)
            ]
            m = sum(D[k] * Wm[k][j] * zi[j] for k in range(d) for j in range(d))
            scale = 1 + mpmath.sqrt(sum(x**2 for x in D)) * nz * wn
            pf = max(pf, (1 - m) / scale)
            if lmax > 0:
                cs = max(cs, lam[r] / lmax * abs(m - 1) / scale)
            for k in range(d):
                for j in range(d):
                    M[k][j] += lam[r] * D[k] * zi[j]
            r += 1
    st_res = mpmath.sqrt(sum((M[k][j] - Wm[k][j]) ** 2 for k in range(d) for j in range(d))) / wn
    return {"primal": float(pf), "stationarity": float(st_res), "compl": float(cs)}


@given(spread_instances(), st.data())
def test_solve_svm_on_rows_of_very_different_sizes_certifies_only_what_holds(
    inst: Instance, data: st.DataObject
) -> None:
    """Sequences at independent scales (no global rescaling can fix them): a solution flagged certified
    satisfies the KKT conditions recomputed in 40-digit mpmath at the data's scale (primal feasibility,
    stationarity W = Σ λ Δ zᵀ with the returned multipliers, complementary slackness) to KKT_RTOL; otherwise
    the solve is flagged uncertified or raises an AttnSVMError. Oracle: the KKT conditions in mpmath."""
    alpha = data.draw(S.token_choices(inst), label="alpha")
    kind, sol = _outcome(lambda: solve_svm(inst, alpha))
    if kind != "ok":
        event(f"raises {kind}")
        return
    if not sol.certified:
        event("returns W flagged uncertified")
        return
    event("certified")
    assert np.all(np.isfinite(sol.W)) and sol.duals_mantissa is not None
    lam = [mpmath.ldexp(mpmath.mpf(float(x)), sol.duals_exponent) for x in sol.duals_mantissa]
    res = _mp_kkt(inst, alpha, np.asarray(sol.W), lam)
    target(max(res.values()), label="largest mpmath KKT residual of a certified solution")
    assert res["primal"] <= KKT_RTOL, res
    assert res["stationarity"] <= KKT_RTOL, res
    assert res["compl"] <= KKT_RTOL, res


def test_zz_boundary_band_is_rare() -> None:
    """The boundary band (either outcome accepted) is at most MAX_BOUNDARY_FRACTION of the checks."""
    if _COUNTS["calls"]:
        assert not too_many_discards(_COUNTS["boundary"], _COUNTS["calls"], MAX_BOUNDARY_FRACTION), _COUNTS
