"""The ``reproduce`` experiment ``seq2seq`` (issue 15 §2): every token a query, normalized GD against
``W_mm(α_final)``.

Oracles:

* **hand-built typed results** (as ``tests/test_experiment_checks_f*.py``): runs and rates built by hand, read
  against the criterion each claim's statement gives; each test also asserts that the message reports the
  numbers it was given. The per-(setting, shape) summary is checked on gaps that follow exact power laws
  (slope known in closed form) and on hand-counted token choices.
* **the Att-SVM's KKT conditions, from the raw data**: for every run of the tiny experiment, the constraints
  ``(x_iα_ik − x_it)ᵀ W x_ik ≥ 1`` (allowed ``t ≠ α_ik``; ``t ≤ k`` when causal; the control: query
  ``x_i0``) are built by explicit loops over the data of :func:`seq2seq_data` (not with ``svm_rows`` or the
  instance); the experiment's ``W_mm(α_final)`` must meet them with equality on a support whose non-negative
  multipliers (``scipy.optimize.nnls``) give back ``W_mm`` — the KKT conditions of the convex program, which
  are sufficient for optimality. ``α_final`` itself is checked against a direct argmax of the logits, and
  the final gap against ``1 − cos`` in 50-digit mpmath.
* **local optimality from the definition**: support rows (margin 1 under the verified ``W_mm``) and scores
  ``γ_ikt = Y_ik vᵀx_it`` by loops; the experiment's ``locally_optimal`` flag must agree, on runs where it
  holds and on runs where it is refuted.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
import pytest
from scipy.optimize import nnls

from attnsvm.harness.experiments import seq2seq as S
from attnsvm.harness.results import ExperimentClaim
from attnsvm.harness.runner import EXPERIMENT_REGISTRY

EPS = float(np.finfo(np.float64).eps)

#: Margins of the certified ``W_mm`` (relative Frobenius error ≤ 1e-9, ``svm.CERTIFY_RTOL``) differ from
#: the exact ones by ≤ 1e-9·||W_mm||·||Δ||·||z|| ≤ 2e-9·||W_mm|| on unit-norm tokens (||Δ|| ≤ 2); 1e-7·||W_mm||
#: leaves a factor 50 for the rounding of the loops' own dot products (≲ d²·eps·||W||).
MARGIN_RTOL = 1e-7
#: A row is in the support when its margin is ≤ 1 + MARGIN_RTOL·||W_mm||; every other margin must exceed
#: 1 + SUPPORT_GAP, so that the split is unambiguous (continuous data: inactive slacks are O(0.1)).
SUPPORT_GAP = 1e-4
#: Stationarity ``W_mm = Σ_S λ_r Δ_r z_rᵀ`` with ``λ ≥ 0``: the certified ``W_mm`` is within 1e-9 relative of
#: the exact solution, whose exact multipliers give residual 0; 1e-8 leaves a factor 10 for nnls's rounding.
KKT_RTOL = 1e-8
#: Final gap against 50-digit mpmath: ``direction_gap``'s relative error is ≲ d·eps/√gap (its docstring);
#: with d ≤ 4 and gaps ≥ 1e-4 on the tiny runs that is ≤ 4e-14; 1e-12 leaves a factor 25.
GAP_RTOL = 1e-12
#: A score difference below this is a tie (scores are O(1) on unit-norm data, rounded to a few eps).
SCORE_TIE = 1e-12
#: The log-log slope of an exact power law, fitted in float64 over ≤ 10 points: logs to ~eps, normal
#: equations well conditioned (log-steps spread ≥ 1): error ≪ 1e-9.
FIT_ATOL = 1e-9


def _claim(claims: list[ExperimentClaim], name: str) -> ExperimentClaim:
    (c,) = [c for c in claims if c.name == name]
    return c


# ============================================================ hand-built typed results
MARKS = (10, 30, 100, 300, 1000)
SHAPE = (2, 3, 4)


def _run(
    setting: str,
    gaps: Any,
    *,
    shape: tuple[int, int, int] = SHAPE,
    tokens: Any = None,
    feasible: bool = True,
    certified: bool = True,
    locally_optimal: bool = True,
    seed: int = 0,
) -> S.Seq2SeqRun:
    n, T, d = shape
    q = n if setting == "single" else n * T
    return S.Seq2SeqRun(
        setting=setting,
        shape=shape,
        seed=seed,
        steps=MARKS,
        gaps=np.asarray(gaps, dtype=np.float64),
        norms=0.1 * np.asarray(MARKS, dtype=np.float64),
        tokens_final=np.zeros(q, dtype=np.int64) if tokens is None else np.asarray(tokens, dtype=np.int64),
        settled_step=MARKS[0],
        feasible=feasible,
        certified=certified,
        locally_optimal=locally_optimal,
        margin_ratio=0.9 if feasible else math.nan,
        W_final=np.eye(d),
        W_mm=np.eye(d) if feasible else None,
    )


def _rate(
    setting: str,
    *,
    halfway: float = 0.1,
    final: float = 0.001,
    slope: float = -1.5,
    se: float = 0.1,
    runs: int = 4,
    feasible: int = 4,
    locally_optimal: int = 4,
    shape: tuple[int, int, int] = SHAPE,
) -> S.Seq2SeqRate:
    return S.Seq2SeqRate(
        setting=setting,
        shape=shape,
        runs=runs,
        feasible_runs=feasible,
        certified_runs=feasible,
        locally_optimal_runs=locally_optimal,
        median_gap_halfway=halfway,
        median_final_gap=final,
        max_final_gap=2 * final,
        slope_vs_steps=slope,
        r2_vs_steps=0.99,
        median_run_slope=slope,
        run_slope_se=se,
        fitted_runs=runs,
        median_margin_ratio=0.9,
        median_settled_step=10.0,
        own_share=math.nan if setting == "single" else 0.5,
        own_share_chance=math.nan if setting == "single" else 0.4,
    )


def _result(rates: list[S.Seq2SeqRate], runs: list[S.Seq2SeqRun] | None = None) -> S.Seq2SeqResult:
    if runs is None:
        runs = [_run(st, [0.1, 0.05, 0.01, 0.003, 0.001]) for st in S.SEQ2SEQ_SETTINGS]
    return S.Seq2SeqResult(shapes=(SHAPE,), seeds=4, marks=MARKS, runs=tuple(runs), rates=tuple(rates))


@pytest.mark.parametrize(("size", "severity"), [("tiny", "finding"), ("small", "check")])
def test_checks_hold_when_every_setting_behaves_as_the_single_query_theory(size: str, severity: str) -> None:
    """Every α_final feasible and locally optimal, every gap falling 100×, the slopes equal: every finding
    holds, both checks pass (findings at size tiny); the messages carry the numbers."""
    rates = [_rate(st) for st in S.SEQ2SEQ_SETTINGS]
    claims = S.check_seq2seq(_result(rates), size=size)
    names = {c.name for c in claims}
    expected = {
        f"{k}/{st}"
        for k in ("alpha-final-feasible", "alpha-final-locally-optimal")
        for st in S.SEQ2SEQ_SETTINGS
    }
    expected |= {f"gap-falls/{st}/2x3x4" for st in S.SEQ2SEQ_SETTINGS}
    expected |= {f"rate-as-single-query/{st}/2x3x4" for st in ("full", "causal")}
    expected |= {"svm-certified", "causal-tokens-allowed"}
    assert names == expected
    assert all(c.passed for c in claims), [c.name for c in claims if not c.passed]
    for c in claims:
        want = severity if c.name in ("svm-certified", "causal-tokens-allowed") else "finding"
        assert c.severity == want, c.name
    falls = _claim(claims, "gap-falls/full/2x3x4")
    assert "0.1 at step 100 → 0.001 at step 1000 (100×" in falls.message
    rate = _claim(claims, "rate-as-single-query/causal/2x3x4")
    assert "-1.5 (SE 0.1, 4/4 runs fitted)" in rate.message and "shallower by 0, within 2" in rate.message
    assert "feasible in 4/4 runs (2x3x4: 4/4)" in _claim(claims, "alpha-final-feasible/full").message
    assert "3/3 feasible solves certified" in _claim(claims, "svm-certified").message


def test_checks_refute_where_the_single_query_prediction_fails() -> None:
    """Full: one α_final not locally optimal, the gap falling only 5×, the slope shallower by 0.6 against
    a 2-SE band of 2·√(0.1² + 0.1²) = 0.283: refuted. Causal: an infeasible run (refutes feasibility) and a
    slope shallower by 0.2 < 0.283 (holds). The control holds throughout."""
    rates = [
        _rate("single"),
        _rate("full", halfway=0.05, final=0.01, slope=-0.9, locally_optimal=3),
        _rate("causal", slope=-1.3, feasible=3),
    ]
    claims = S.check_seq2seq(_result(rates), size="small")
    assert _claim(claims, "alpha-final-locally-optimal/single").passed
    lo = _claim(claims, "alpha-final-locally-optimal/full")
    assert not lo.passed and "locally optimal in 3/4 runs" in lo.message
    falls = _claim(claims, "gap-falls/full/2x3x4")
    assert not falls.passed and "(5×" in falls.message
    rate = _claim(claims, "rate-as-single-query/full/2x3x4")
    assert not rate.passed and "shallower by 0.6, beyond 2 standard errors (0.283)" in rate.message
    feas = _claim(claims, "alpha-final-feasible/causal")
    assert not feas.passed and "feasible in 3/4 runs" in feas.message
    rc = _claim(claims, "rate-as-single-query/causal/2x3x4")
    assert rc.passed and "shallower by 0.2, within" in rc.message
    assert _claim(claims, "gap-falls/causal/2x3x4").passed


def test_a_steeper_setting_never_refutes_the_rate_and_a_missing_control_does() -> None:
    """A setting falling faster than the control (slope −3 against −1.5, SE 0) holds; with no control
    for the shape the rate claim is refuted and says why; an all-NaN gap (shrink unknown) does not
    pass ``gap-falls``."""
    ok = S.check_seq2seq(
        _result([_rate("single", se=0.0), _rate("full", slope=-3.0, se=0.0), _rate("causal")]), size="small"
    )
    assert _claim(ok, "rate-as-single-query/full/2x3x4").passed
    other = (5, 5, 5)
    missing = S.check_seq2seq(
        _result([_rate("single"), _rate("full", shape=other), _rate("causal", final=math.nan)]), size="small"
    )
    c = _claim(missing, "rate-as-single-query/full/5x5x5")
    assert not c.passed and "no single-query control" in c.message
    assert not _claim(missing, "gap-falls/causal/2x3x4").passed


def test_checks_fail_on_an_uncertified_solve_or_a_masked_token() -> None:
    """A feasible but uncertified Att-SVM fails ``svm-certified`` (naming the run); a causal query
    ``(0, 1)`` selecting token 2 > 1 fails ``causal-tokens-allowed`` (1 of 6 choices)."""
    bad_tokens = [0, 2, 0, 0, 1, 2]  # (i, k) = (0, 1) selects t = 2 > k
    runs = [
        _run("single", [0.1] * 5, certified=False, seed=7),
        _run("full", [0.1] * 5),
        _run("causal", [0.1] * 5, tokens=bad_tokens),
    ]
    claims = S.check_seq2seq(_result([_rate(st) for st in S.SEQ2SEQ_SETTINGS], runs), size="small")
    cert = _claim(claims, "svm-certified")
    assert not cert.passed and cert.severity == "check"
    assert "2/3 feasible solves certified; uncertified: single 2x3x4 seed 7" in cert.message
    causal = _claim(claims, "causal-tokens-allowed")
    assert not causal.passed and "1 of 6 final causal token choices" in causal.message
    # an infeasible run is not counted as an uncertified solve
    runs[0] = _run("single", [math.nan] * 5, feasible=False, certified=False)
    runs[2] = _run("causal", [0.1] * 5, tokens=[0, 1, 2, 0, 0, 1])
    claims = S.check_seq2seq(_result([_rate(st) for st in S.SEQ2SEQ_SETTINGS], runs), size="small")
    assert _claim(claims, "svm-certified").passed and _claim(claims, "causal-tokens-allowed").passed


def test_summary_of_exact_power_laws() -> None:
    """Gaps ``c_b·t^s_b`` exactly with slopes −1, −2, −3, −2: the median per-run slope is −2 and its
    standard error √(π/2)·std(ddof=1)/√4; the median gap curve is ``t^−2`` (slope −2, R² 1, shrink 10² over
    the fitted steps 100 → 1000); one infeasible run (all NaN) is left out of the medians and the fits."""
    t = np.asarray(MARKS, dtype=np.float64)
    slopes = [-1.0, -2.0, -3.0, -2.0]
    runs = [_run("full", t**s * 100.0**-s) for s in slopes]  # every run is 1 at t = 100
    runs.append(_run("full", [math.nan] * 5, feasible=False))
    r = S._rate(runs, MARKS)
    assert (r.runs, r.feasible_runs, r.fitted_runs) == (5, 4, 4)
    assert r.median_run_slope == pytest.approx(-2.0, abs=FIT_ATOL)
    sd = math.sqrt(sum((s + 2.0) ** 2 for s in slopes) / 3)
    assert r.run_slope_se == pytest.approx(math.sqrt(math.pi / 2) * sd / 2, rel=FIT_ATOL)
    assert r.slope_vs_steps == pytest.approx(-2.0, abs=FIT_ATOL)
    assert r.r2_vs_steps == pytest.approx(1.0, abs=FIT_ATOL)
    assert r.median_gap_halfway == 1.0 and r.shrink == pytest.approx(100.0, rel=1e-12)


def test_own_position_share_and_chance() -> None:
    """Tokens ``[0, 0, 2, 1, 1, 1]`` for n = 2, T = 3: queries (0,0), (0,2), (1,1) select their own position,
    3 of 6; chance 1/3 (full) and (1 + ½ + ⅓)/3 (causal); the control has none."""
    run = _run("full", [0.1] * 5, shape=(2, 3, 4), tokens=[0, 0, 2, 1, 1, 1])
    assert run.own_share == 0.5
    assert S.own_position_chance(3, "full") == pytest.approx(1 / 3, rel=1e-15)
    assert S.own_position_chance(3, "causal") == pytest.approx((1 + 1 / 2 + 1 / 3) / 3, rel=1e-15)
    assert math.isnan(_run("single", [0.1] * 5).own_share)


# ============================================================ the tiny experiment, end to end
@pytest.fixture(scope="module")
def tiny() -> tuple[Any, S.Seq2SeqResult, list[tuple[int, int]]]:
    calls: list[tuple[int, int]] = []
    res = S.seq2seq_experiment("tiny", 0, 1, "cpu", lambda done, total: calls.append((done, total)))
    return res, S.compute_seq2seq("tiny", 0), calls


def test_tiny_experiment_runs_with_claims_figures_and_tables(tiny: Any) -> None:
    """Registered; every run present (settings × shapes × seeds, progress to the total); every claim of the
    statement list present, the two checks passing; the figure has two panels (not causal, causal) whose
    series hold one finite positive median per recorded step; the tables have a row per run/rate."""
    res, result, calls = tiny
    assert "seq2seq" in EXPERIMENT_REGISTRY and res.name == "seq2seq"
    cfg = S.SEQ2SEQ_SIZES["tiny"]
    total = len(S.SEQ2SEQ_SETTINGS) * len(cfg["shapes"]) * cfg["seeds"]
    assert calls[-1] == (total, total) and len(result.runs) == total
    assert len(res.tables["runs"]) == total and len(res.tables["rates"]) == len(result.rates)
    names = {c.name for c in res.claims}
    for st in S.SEQ2SEQ_SETTINGS:
        assert {f"alpha-final-feasible/{st}", f"alpha-final-locally-optimal/{st}"} <= names
    assert {"svm-certified", "causal-tokens-allowed"} <= names
    assert _claim(res.claims, "svm-certified").passed and _claim(res.claims, "causal-tokens-allowed").passed
    assert all(c.message for c in res.claims)
    (fig,) = res.figures
    assert [p.title.split(":")[0] for p in fig.panels] == ["every token a query (not causal)", "causal"]
    assert f"{cfg['seeds']} seeds" in fig.title and "2x4x4" in fig.title
    for panel in fig.panels:
        assert panel.xlog and panel.ylog and len(panel.series) == 2 * len(cfg["shapes"])
        for s in panel.series:
            assert list(s.x) == list(cfg["marks"])
            assert all(math.isfinite(y) and y > 0 for y in s.y), s.label
    assert res.numbers["runs"] == total
    # the typed result the other tests verify is the one the experiment reports (deterministic in the seed)
    assert [row["final_gap"] for row in res.tables["runs"]] == [float(r.gaps[-1]) for r in result.runs]


def _raw(run: S.Seq2SeqRun) -> tuple[Any, Any, Any, list[tuple[int, int, Any, list[int]]]]:
    """The data of ``run`` and its queries ``(sequence, position, query vector, allowed tokens)``, by loops."""
    n, T, d = run.shape
    X, Y, v = S.seq2seq_data(n, T, d, run.seed)
    if run.setting == "single":
        return X, Y[:, 0], v, [(i, 0, X[i, 0], list(range(T))) for i in range(n)]
    queries = []
    for i in range(n):
        for k in range(T):
            allowed = list(range(k + 1)) if run.setting == "causal" else list(range(T))
            queries.append((i, k, X[i, k], allowed))
    return X, Y.reshape(-1), v, queries


def _kkt(run: S.Seq2SeqRun) -> tuple[Any, list[tuple[int, int]]]:
    """Assert that ``run.W_mm`` meets the Att-SVM(α_final) KKT conditions built from the raw data; return
    the margins and the support ``(query, token)``."""
    X, _, _, queries = _raw(run)
    W = run.W_mm
    assert W is not None
    nW = float(np.linalg.norm(W))
    rows, margins, pairs = [], [], []
    for q, (i, _k, z, allowed) in enumerate(queries):
        a = int(run.tokens_final[q])
        assert a in allowed
        for t in allowed:
            if t == a:
                continue
            delta = X[i, a] - X[i, t]
            rows.append(np.outer(delta, z).ravel())
            margins.append(float(delta @ W @ z))
            pairs.append((q, t))
    m = np.array(margins)
    tol = MARGIN_RTOL * nW
    assert m.min() >= 1 - tol, (run.setting, run.seed, m.min())
    active = m <= 1 + tol
    assert np.all(active | (m >= 1 + SUPPORT_GAP)), "ambiguous support"
    # No active row: W/min(margin) is feasible with a smaller norm (and nnls is not called on 0 columns).
    assert active.any(), (run.setting, run.seed, "no active constraint")
    A = np.array(rows)[active]
    lam, resid = nnls(A.T, W.ravel())
    assert resid <= KKT_RTOL * nW, (run.setting, run.seed, resid / nW)
    assert np.all(lam >= 0)
    return m, [p for p, on in zip(pairs, active, strict=True) if on]


def _locally_optimal(run: S.Seq2SeqRun, support: list[tuple[int, int]]) -> tuple[bool, float]:
    """By definition: every support token of a query scores strictly below its selected token
    (``γ = label · vᵀx``); returns the verdict and the least score lead (negative: a violation)."""
    X, labels, v, queries = _raw(run)
    lead = math.inf
    for q, t in support:
        i = queries[q][0]
        a = int(run.tokens_final[q])
        lead = min(lead, float(labels[q] * (v @ X[i, a]) - labels[q] * (v @ X[i, t])))
    assert abs(lead) > SCORE_TIE, "a tie: the verdict is not determined"
    return lead > 0, lead


def test_tiny_w_mm_is_the_att_svm_solution_from_the_raw_data(tiny: Any) -> None:
    """For every tiny run: α_final is the argmax of the final logits over the allowed tokens (a direct
    loop); ``W_mm(α_final)`` meets the KKT conditions built from the raw data; the final gap agrees with
    ``1 − cos(W_final, W_mm)`` in 50-digit mpmath; the ``locally_optimal`` flag agrees with the definition."""
    _, result, _ = tiny
    for run in result.runs:
        X, _, _, queries = _raw(run)
        for q, (i, _k, z, allowed) in enumerate(queries):
            logits = {t: float(X[i, t] @ run.W_final @ z) for t in allowed}
            assert int(run.tokens_final[q]) == max(logits, key=logits.__getitem__)
        assert run.feasible and run.W_mm is not None
        _, support = _kkt(run)
        with mpmath.workdps(50):
            a = [mpmath.mpf(float(x)) for x in run.W_final.ravel()]
            b = [mpmath.mpf(float(x)) for x in run.W_mm.ravel()]
            dot = mpmath.fsum(x * y for x, y in zip(a, b, strict=True))
            cos = dot / mpmath.sqrt(mpmath.fsum(x * x for x in a) * mpmath.fsum(y * y for y in b))
            exact = float(1 - cos)
        assert run.gaps[-1] == pytest.approx(exact, rel=GAP_RTOL)
        assert _locally_optimal(run, support)[0] == run.locally_optimal


@pytest.mark.parametrize(("setting", "seed"), [("causal", 1009), ("full", 1003)])
def test_refuted_local_optimality_agrees_with_the_definition(setting: str, seed: int) -> None:
    """Two runs of the small size (shape 4x6x4, the shape where the experiment reports α_final not
    locally optimal): the experiment's flag is False, its ``W_mm`` passes the raw-data KKT check, and by
    the definition some support token scores clearly (≫ a tie) above the selected one."""
    marks = list(S.SEQ2SEQ_SIZES["small"]["marks"])
    run = S._one_run(setting, (4, 6, 4), seed, marks)
    assert run.feasible and not run.locally_optimal
    _, support = _kkt(run)
    ok, lead = _locally_optimal(run, support)
    assert not ok and lead < -1e-3
