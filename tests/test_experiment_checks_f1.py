"""The checks of the ``reproduce`` experiments saturation, textbook_gd, convergence, local_global and regpath
on hand-built typed results (no numerics run).

Oracle: the hand-built data itself, read against the criterion each claim's statement gives (e.g. a
path whose median gap grows must not pass ``path-converges``); each test also asserts that the claim's
message reports the measured numbers it was given.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnsvm.harness.experiments import convergence as conv
from attnsvm.harness.experiments import local_global as lg
from attnsvm.harness.experiments import regpath as rp
from attnsvm.harness.experiments import saturation as sat
from attnsvm.harness.experiments import textbook_gd as tb
from attnsvm.harness.results import ExperimentClaim


def _claim(claims: list[ExperimentClaim], name: str) -> ExperimentClaim:
    (c,) = [c for c in claims if c.name == name]
    return c


# ------------------------------------------------------------------------------------ saturation
def _sat_point(radius: float, *, stable: float, direction: float, textbook: float) -> sat.SaturationPoint:
    """A point with the given error / bound ratios (``stable`` NaN: the gradient underflowed)."""
    return sat.SaturationPoint(
        seed=0,
        radius=radius,
        norm_W=radius,
        logit_spread=radius,
        log10_grad_norm=-radius,
        max_weight_gap=0.0,
        stable_rel_err=stable * 1e-16,
        textbook_rel_err=math.nan if math.isnan(stable) else textbook * 1e-16,
        stable_err_over_bound=stable,
        textbook_err_over_bound=math.nan if math.isnan(stable) else textbook,
        direction_err=direction * 1e-16,
        direction_err_over_bound=direction,
        log_norm_err=0.0,
        textbook_direction_err=1.0,
    )


def _sat(*points: sat.SaturationPoint) -> sat.SaturationResult:
    return sat.SaturationResult(
        shape=(2, 3, 3), seeds=1, scales=tuple(p.radius for p in points), points=tuple(points)
    )


def test_saturation_checks_pass_within_the_bounds() -> None:
    """Every ratio ≤ 1 (one point underflowed): both checks pass; the textbook formula, 40× its bound,
    passes the finding; the messages give the worst ratios and the counts."""
    res = _sat(
        _sat_point(1.0, stable=0.25, direction=0.5, textbook=0.75),
        _sat_point(300.0, stable=0.5, direction=0.125, textbook=40.0),
        _sat_point(1e4, stable=math.nan, direction=0.375, textbook=math.nan),
    )
    claims = sat.check_saturation(res, size="tiny")
    stable = _claim(claims, "stable-gradient-exact")
    assert stable.passed and stable.severity == "check"
    assert "worst error / bound = 0.5 over 2 points" in stable.message
    direction = _claim(claims, "direction-exact")
    assert direction.passed and "= 0.5 over 3 points, 1 with an underflowed gradient" in direction.message
    textbook = _claim(claims, "textbook-loses-digits")
    assert textbook.passed and textbook.severity == "finding" and "= 40," in textbook.message


def test_saturation_checks_fail_beyond_the_bounds() -> None:
    """A stable error 2.5× its bound and a direction error 3× its bound fail their checks; a textbook
    formula within its bound does not support the finding."""
    res = _sat(
        _sat_point(1.0, stable=0.5, direction=3.0, textbook=0.5),
        _sat_point(30.0, stable=2.5, direction=0.5, textbook=0.75),
    )
    claims = sat.check_saturation(res, size="small")
    assert not _claim(claims, "stable-gradient-exact").passed
    assert "= 2.5 over 2 points" in _claim(claims, "stable-gradient-exact").message
    assert not _claim(claims, "direction-exact").passed
    assert "= 3 over 2 points, 0 with" in _claim(claims, "direction-exact").message
    assert not _claim(claims, "textbook-loses-digits").passed
    assert sat.numbers_saturation(res)["points_gradient_underflowed"] == 0


# ------------------------------------------------------------------------------------ textbook_gd
def _tb(stable: list[float], textbook: list[float], stopped: int = 0) -> tb.TextbookGDResult:
    return tb.TextbookGDResult(
        shape=(4, 6, 8),
        seeds=(0,),
        marks=(10, 100, 300),
        stable_gap=np.array([stable]),
        textbook_gap=np.array([textbook]),
        textbook_stopped_at=np.array([stopped], dtype=np.int64),
    )


@pytest.mark.parametrize(("size", "severity"), [("tiny", "finding"), ("small", "check")])
def test_textbook_gd_checks_pass_when_the_stable_run_converges(size: str, severity: str) -> None:
    """The stable gap falls 0.1 → 0.01 → 0.001 (strictly, over the last three records): passes; the
    textbook run ends at 0.5 > 0.001: the finding holds; a tiny run only reports it."""
    claims = tb.check_textbook_gd(_tb([0.1, 0.01, 0.001], [0.2, 0.3, 0.5]), size=size)
    keeps = _claim(claims, "stable-keeps-converging")
    assert keeps.passed and keeps.severity == severity
    assert keeps.message.endswith("0.1, 0.01, 0.001")
    loses = _claim(claims, "textbook-loses-direction")
    assert loses.passed and "stable 0.001, textbook 0.5 (best textbook median 0.2; 0 runs" in loses.message


def test_textbook_gd_checks_fail_when_the_stable_gap_grows() -> None:
    """The stable gap rises at the last record (0.1 → 0.01 → 0.02): fails; a textbook run that ends
    closer (0.005 < 0.02) refutes the finding. A textbook run that stopped on underflow (all NaN)
    supports it."""
    claims = tb.check_textbook_gd(_tb([0.1, 0.01, 0.02], [0.1, 0.01, 0.005]), size="small")
    assert not _claim(claims, "stable-keeps-converging").passed
    assert _claim(claims, "stable-keeps-converging").message.endswith("0.1, 0.01, 0.02")
    assert not _claim(claims, "textbook-loses-direction").passed
    stopped = tb.check_textbook_gd(_tb([0.1, 0.01, 0.001], [math.nan] * 3, stopped=42), size="small")
    loses = _claim(stopped, "textbook-loses-direction")
    assert loses.passed and "textbook nan" in loses.message and "1 runs stopped on underflow" in loses.message


# ------------------------------------------------------------------------------------ convergence
def _rate(mode: str, halfway: float, final: float, slope: float) -> conv.ConvergenceRate:
    return conv.ConvergenceRate(
        loss="logistic",
        mode=mode,
        lr=conv.CONVERGENCE_LR[mode],
        steps=1000,
        median_final_gap=final,
        max_final_gap=2 * final,
        median_final_norm=50.0,
        slope_vs_steps=slope / 2,
        r2_vs_steps=0.9,
        slope_vs_norm=slope,
        r2_vs_norm=0.99,
        median_gap_halfway=halfway,
        runs_infeasible_final=0,
    )


def _conv(*rates: conv.ConvergenceRate) -> conv.ConvergenceResult:
    return conv.ConvergenceResult(
        shape=(3, 4, 5),
        seeds=(0, 1),
        marks=(1, 10, 100, 1000),
        runs=(),
        rates=rates,
        svm_solves=4,
        infeasible_token_choices_seen=0,
    )


def test_convergence_checks_pass_when_the_gap_falls() -> None:
    """Normalized: 0.01 → 1e-4 (100×) with slope −2 (criterion ≥ 10× and slope < 0); plain: 0.3 → 0.2
    (1.5×) with slope −0.1 (criterion > 1× and slope < 0): both pass; the fitted half starts at
    marks[2] = 100."""
    claims = conv.check_convergence(
        _conv(_rate("normalized", 1e-2, 1e-4, -2.0), _rate("plain", 0.3, 0.2, -0.1)), size="small"
    )
    norm = _claim(claims, "converges/logistic/normalized")
    assert norm.passed and norm.severity == "check"
    assert "median gap 0.01 at step 100 → 0.0001 at step 1000 (100×); slope vs ||W|| -2 (R² 0.99)" in (
        norm.message
    )
    plain = _claim(claims, "converges/logistic/plain")
    assert plain.passed and "(1.5×); slope vs ||W|| -0.1" in plain.message


def test_convergence_checks_fail_when_the_gap_grows_or_falls_too_little() -> None:
    """Normalized 0.01 → 0.002 (5× < 10×) fails although the slope is negative; plain 0.2 → 0.3
    (the gap grows, 0.667×) fails; a gap reaching 0 counts as an infinite shrink."""
    claims = conv.check_convergence(
        _conv(_rate("normalized", 1e-2, 2e-3, -1.0), _rate("plain", 0.2, 0.3, 0.5)), size="tiny"
    )
    norm = _claim(claims, "converges/logistic/normalized")
    assert not norm.passed and norm.severity == "finding" and "(5×)" in norm.message
    plain = _claim(claims, "converges/logistic/plain")
    assert not plain.passed and "0.2 at step 100 → 0.3 at step 1000 (0.667×)" in plain.message
    assert _rate("normalized", 1e-2, 0.0, -1.0).shrink == math.inf


# ------------------------------------------------------------------------------------ local_global
def _run(d: int, seed: int, **flags: bool) -> lg.LocalGlobalRun:
    """A settled, diverging, feasible, locally optimal, non-global run unless ``flags`` say otherwise."""
    f = {"is_global": False, "settled": True, "diverging": True, "locally_optimal": True, "feasible": True}
    f.update(flags)
    return lg.LocalGlobalRun(
        d=d,
        seed=seed,
        norm_growth_second_half=5.0 if f["diverging"] else 0.0,
        final_gap=1e-3 if f["locally_optimal"] else 0.25,
        alpha_final=np.array([0, 1]),
        opt=np.array([0, 1]) if f["is_global"] else np.array([1, 1]),
        reason=None if f["locally_optimal"] else "support token 0 scores above the selected one",
        **f,
    )


def _lg(runs: list[lg.LocalGlobalRun], confirmed: bool = False) -> lg.LocalGlobalResult:
    counter = tuple(
        lg.Counterexample(
            d=r.d, seed=r.seed, settled=r.settled, diverging=r.diverging, confirmed=confirmed, reason=r.reason
        )
        for r in runs
        if not r.locally_optimal
    )
    return lg.LocalGlobalResult(
        n=2, T=3, runs_per_d=2, steps=200, ds=(2, 4), runs=tuple(runs), counterexamples=counter
    )


def test_local_global_checks_pass_on_good_runs() -> None:
    """Global shares 0.5 at d=2 and 1.0 at d=4, every run diverging and locally optimal, a candidate
    counterexample that was not confirmed: every claim holds, the messages give the counts."""
    runs = [
        _run(2, 1, is_global=True),
        _run(2, 2, locally_optimal=False),
        _run(4, 3, is_global=True),
        _run(4, 4, is_global=True),
    ]
    claims = lg.check_local_global(_lg(runs, confirmed=False), size="tiny")
    assert all(c.passed for c in claims), [c.name for c in claims if not c.passed]
    assert _claim(claims, "global-is-locally-optimal").message == "3 global finals checked"
    assert _claim(claims, "gd-diverges").message.startswith("4/4 runs diverging; the other 0 ")
    final = _claim(claims, "final-tokens-locally-optimal")
    assert final.message.startswith("3/4 settled diverging runs locally optimal; 1 apparent counterexamples")
    assert "(3/4 of all runs); median final gap to W_mm(α_final): 0.001 (locally optimal) vs 0.25" in (
        final.message
    )
    assert _claim(claims, "global-share-grows-with-d").message == "d=2: 0.50 → d=4: 1.00 (monotone)"


def test_local_global_checks_fail_on_bad_runs() -> None:
    """A global, feasible choice that is not locally optimal fails the check; a bounded run refutes
    gd-diverges; a confirmed counterexample refutes the conjecture (named in the message); the global
    share falling from 0.5 to 0 refutes the growth finding, and the figure's note says so."""
    runs = [
        _run(2, 1, is_global=True, locally_optimal=False),
        _run(2, 2),
        _run(4, 7, locally_optimal=False),
        _run(4, 8, diverging=False),
    ]
    res = _lg(runs, confirmed=True)
    claims = lg.check_local_global(res, size="tiny")
    glob = _claim(claims, "global-is-locally-optimal")
    assert not glob.passed and glob.severity == "check" and glob.message == "1 global finals checked"
    div = _claim(claims, "gd-diverges")
    assert not div.passed and div.message.startswith("3/4 runs diverging; the other 1 ")
    final = _claim(claims, "final-tokens-locally-optimal")
    assert not final.passed
    assert final.message.endswith(
        "first counterexample d=2, seed 1: support token 0 scores above the selected one"
    )
    grows = _claim(claims, "global-share-grows-with-d")
    assert not grows.passed and grows.message == "d=2: 0.50 → d=4: 0.00 (dips at d=4)"
    (fig,) = lg.figures_local_global(res)
    assert "refuted" in fig.panels[0].note and "dips at d=4" in fig.panels[0].note


# ------------------------------------------------------------------------------------ regpath
def _seed(seed: int, path_gap: list[float], same: bool) -> rp.RegpathSeedRun:
    k = len(path_gap)
    return rp.RegpathSeedRun(
        seed=seed,
        path_gap=np.array(path_gap),
        gd_gap=np.array(path_gap) * 2,
        path_vs_gd_gap=np.full(k, 1e-3),
        gd_norm=np.array([0.5, 2.0, 8.0][:k]),
        gd_step=np.arange(1, k + 1, dtype=np.int64),
        path_kkt_residual=np.full(k, 1e-10),
        path_tokens=np.zeros((k, 3), dtype=np.int64),
        gd_tokens=np.zeros((k, 3), dtype=np.int64),
        same_final_tokens=same,
        path_final_is_opt=True,
    )


def _rp(*seeds: rp.RegpathSeedRun) -> rp.RegpathResult:
    return rp.RegpathResult(shape=(3, 4, 5), radii=(0.5, 2.0, 8.0), seeds=seeds)


def test_regpath_checks_pass_when_the_path_converges() -> None:
    """Median path gap 0.1 at R=0.5 → 0.001 at R=8 (criterion: smaller at the largest R) and the same
    final tokens on both seeds: both claims hold."""
    claims = rp.check_regpath(
        _rp(_seed(0, [0.1, 0.01, 0.001], True), _seed(1, [0.1, 0.02, 0.001], True)), size="small"
    )
    conv_ = _claim(claims, "path-converges")
    assert conv_.passed and conv_.severity == "check"
    assert conv_.message == "median gap 0.1 at R=0.5 → 0.001 at R=8"
    agree = _claim(claims, "path-and-gd-agree")
    assert agree.passed and agree.message == "2/2 seeds; median 1 − corr(W_R, W_GD) at the largest R 0.001"


def test_regpath_checks_fail_when_the_path_gap_grows() -> None:
    """Median path gap 0.01 → 0.1 (it grows) fails path-converges; one seed of two ending on other
    tokens than GD refutes path-and-gd-agree."""
    claims = rp.check_regpath(
        _rp(_seed(0, [0.01, 0.05, 0.1], True), _seed(1, [0.01, 0.05, 0.1], False)), size="tiny"
    )
    conv_ = _claim(claims, "path-converges")
    assert not conv_.passed and conv_.severity == "finding"
    assert conv_.message == "median gap 0.01 at R=0.5 → 0.1 at R=8"
    agree = _claim(claims, "path-and-gd-agree")
    assert not agree.passed and agree.message.startswith("1/2 seeds;")
