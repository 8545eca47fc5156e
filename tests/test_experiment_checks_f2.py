"""The checks of the ``reproduce`` experiments svm, lipschitz, symbolic, multitoken, toys and
autograd_saturation, on typed results built by hand (no numerics run).

Oracle: the hand-built data itself, read against the criterion each claim states in its ``statement``
(e.g. "no attained estimate exceeds the certified bound": one estimate above its bound must fail it).
Each experiment has a result that must pass and one that must fail, and the message must carry the
measured numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnsvm.harness.experiments import autograd_saturation as exp_ag
from attnsvm.harness.experiments import lipschitz as exp_lip
from attnsvm.harness.experiments import multitoken as exp_mt
from attnsvm.harness.experiments import svm as exp_svm
from attnsvm.harness.experiments import symbolic as exp_sym
from attnsvm.harness.experiments import toys as exp_toys
from attnsvm.harness.experiments._common import EPS, SVM_AGREE_RTOL


def _by_name(claims):
    names = [c.name for c in claims]
    assert len(set(names)) == len(names), names
    return {c.name: c for c in claims}


# ------------------------------------------------------------------------------------------- symbolic
def _identity(
    name: str, *, proved: bool = True, code_ok: bool = True, failed: str = ""
) -> exp_sym.IdentityOutcome:
    return exp_sym.IdentityOutcome(
        claim=name,
        group="g",
        statement="s",
        proved=proved,
        sizes=("n=2",),
        obligations=1,
        proof_s=0.0,
        code_max_error=0.0,
        code_tolerance=1e-12,
        code_ok=code_ok,
        failed=failed,
    )


def test_symbolic_all_proved_passes() -> None:
    """Oracle: two identities proved with passing code checks → 'all-proved' holds, '2/2'."""
    res = exp_sym.SymbolicResult(quick=True, identities=(_identity("a"), _identity("b")), registry_size=9)
    (c,) = exp_sym.check_symbolic(res, size="tiny")
    assert c.name == "all-proved" and c.passed and c.severity == "check"
    assert c.message == "2/2 proved and matched"
    assert exp_sym.numbers_symbolic(res) == {"claims": 2, "proved": 2, "registry_size": 9}


@pytest.mark.parametrize("bad", [{"proved": False, "failed": "obligation 3"}, {"code_ok": False}])
def test_symbolic_unproved_or_code_mismatch_fails(bad: dict) -> None:
    """Oracle: one identity unproved, or proved but its code check failing → 'all-proved' fails and
    names it."""
    res = exp_sym.SymbolicResult(
        quick=True, identities=(_identity("a"), _identity("b", **bad)), registry_size=9
    )
    (c,) = exp_sym.check_symbolic(res, size="tiny")
    assert not c.passed
    assert c.message.startswith("1/2 proved and matched; first failure b")
    assert bad.get("failed", "") in c.message


# ------------------------------------------------------------------------------------------- multitoken
def _mt_run(pred: float, single: float, *, multi: bool) -> exp_mt.MultitokenRun:
    return exp_mt.MultitokenRun(
        d=4,
        seed=0,
        norm_W=10.0,
        set_sizes=(2, 1, 1) if multi else (1, 1, 1),
        multi=multi,
        rel_error_prediction=pred,
        rel_error_single=single,
        corr_prediction=1.0,
        corr_single=1.0,
    )


def _mt(*runs: exp_mt.MultitokenRun) -> exp_mt.MultitokenResult:
    return exp_mt.MultitokenResult(n=3, T=4, runs_per_d=len(runs), steps=10, ds=(4,), runs=runs)


def test_multitoken_checks_pass() -> None:
    """Oracle: singleton runs whose two fits agree to SVM_AGREE_RTOL, and multi-token runs where the
    prediction is closer → both claims hold; 'better in 2/2'."""
    res = _mt(
        _mt_run(0.1, 0.1 + 0.5 * SVM_AGREE_RTOL, multi=False),
        _mt_run(0.01, 0.2, multi=True),
        _mt_run(0.02, 0.3, multi=True),
    )
    c = _by_name(exp_mt.check_multitoken(res, size="tiny"))
    assert c["singletons-reduce-to-att-svm"].passed
    assert c["singletons-reduce-to-att-svm"].message == "1 single-token runs"
    assert c["prediction-beats-single-token"].passed
    assert "better in 2/2 multi-token runs" in c["prediction-beats-single-token"].message
    (b,) = exp_mt.summarise_multitoken(res)
    assert (b.multi_runs, b.better_runs, b.share_prediction_better) == (2, 2, 1.0)


def test_multitoken_checks_fail() -> None:
    """Oracle: a singleton run whose fits differ by 1e-6 ≫ SVM_AGREE_RTOL, and one multi-token run of two
    where the single-token fit is closer → both claims fail; 'better in 1/2'."""
    res = _mt(
        _mt_run(0.1, 0.1 + 1e-6, multi=False),
        _mt_run(0.01, 0.2, multi=True),
        _mt_run(0.3, 0.2, multi=True),
    )
    c = _by_name(exp_mt.check_multitoken(res, size="tiny"))
    assert not c["singletons-reduce-to-att-svm"].passed
    assert not c["prediction-beats-single-token"].passed
    assert "better in 1/2 multi-token runs" in c["prediction-beats-single-token"].message


def test_multitoken_no_multi_token_run_is_not_a_pass() -> None:
    """Oracle: the finding is about multi-token runs; with none it cannot hold ('better in 0/0')."""
    c = _by_name(exp_mt.check_multitoken(_mt(_mt_run(0.1, 0.1, multi=False)), size="tiny"))
    assert not c["prediction-beats-single-token"].passed
    assert "0/0" in c["prediction-beats-single-token"].message
    (b,) = exp_mt.summarise_multitoken(_mt(_mt_run(0.1, 0.1, multi=False)))
    assert math.isnan(b.share_prediction_better)


# ------------------------------------------------------------------------------------------- lipschitz
def _lip_point(
    of: str, R: float, *, soft: tuple[float, float], lin: tuple[float, float], nl: tuple[float, float]
):
    def kc(be: tuple[float, float]) -> exp_lip.KindConstant:
        return exp_lip.KindConstant(bound=be[0], estimate=be[1], gap=be[0] / be[1])

    return exp_lip.LipschitzPoint(
        of=of,
        instance=0,
        radius=R,
        softmax=kc(soft),
        linear=kc(lin),
        normalized_linear=kc(nl),
        bound_ratio_linear=soft[0] / lin[0],
        estimate_ratio_linear=soft[1] / lin[1],
        bound_ratio_normalized_linear=soft[0] / nl[0],
        estimate_ratio_normalized_linear=soft[1] / nl[1],
    )


def _lip(weights, output) -> exp_lip.LipschitzResult:
    return exp_lip.LipschitzResult(
        shape=(2, 3, 3), radii=(1.0, 2.0), instances=1, weights=tuple(weights), output=tuple(output)
    )


def test_lipschitz_checks_pass() -> None:
    """Oracle: every estimate below its bound, softmax estimate = 0.3 · linear (≤ ½) and below the
    normalized-linear one → every claim holds; messages give the ratio 0.3 and the comparison count."""
    good = dict(soft=(1.0, 0.3), lin=(2.0, 1.0), nl=(1.0, 0.6))
    res = _lip(
        [_lip_point("weights", 1.0, **good), _lip_point("weights", 2.0, **good)],
        [_lip_point("output", 1.0, **good), _lip_point("output", 2.0, **good)],
    )
    c = _by_name(exp_lip.check_lipschitz(res, size="tiny"))
    assert all(x.passed for x in c.values()), c
    assert c["bounds-sound"].message == "12 comparisons; none violated"
    assert c["softmax-half-linear-weights"].message.endswith("= 0.3")
    assert "softmax/normalized_linear = 0.5" in c["softmax-more-stable-than-normalized-linear"].message
    nums = exp_lip.numbers_lipschitz(res)
    assert nums["weights/max_bound_over_estimate_softmax"] == pytest.approx(1 / 0.3)


def test_lipschitz_checks_fail() -> None:
    """Oracle: a softmax estimate 1.5 above its bound 1.0 at R = 2 (unsound), attained softmax = 0.75 ·
    linear (> ½) and above linear on the output map → 'bounds-sound', 'softmax-half-linear-weights' and
    'softmax-more-stable-output' fail, naming the point and the ratio."""
    good = dict(soft=(1.0, 0.3), lin=(2.0, 1.0), nl=(1.0, 0.6))
    res = _lip(
        [
            _lip_point("weights", 1.0, **good),
            _lip_point("weights", 2.0, soft=(1.0, 1.5), lin=(4.0, 2.0), nl=(3.0, 3.0)),
        ],
        [
            _lip_point("output", 1.0, **good),
            _lip_point("output", 2.0, soft=(5.0, 3.0), lin=(4.0, 2.0), nl=(9.0, 9.0)),
        ],
    )
    c = _by_name(exp_lip.check_lipschitz(res, size="tiny"))
    assert not c["bounds-sound"].passed
    assert "first violation: weights, softmax, R=2.0" in c["bounds-sound"].message
    assert not c["softmax-half-linear-weights"].passed
    assert c["softmax-half-linear-weights"].message.endswith("= 0.75")
    assert not c["softmax-more-stable-output"].passed
    assert "= 1.5 (instance 0, R=2)" in c["softmax-more-stable-output"].message
    assert c["softmax-more-stable-weights"].passed  # 0.75 < 1: softmax still more stable on weights


# ------------------------------------------------------------------------------------------- svm
def _solve(method: str, d: int, **kw) -> exp_svm.SvmSolve:
    base = dict(
        method=method,
        d=d,
        seed=0,
        time_s=1e-3,
        objective=2.0,
        min_margin=1.0,
        certified=True,
        error_bound=1e-12,
        kkt_max=1e-14,
        raw_rel_error=1e-8,
        rel_diff_to_dual=0.0,
        support_size=3,
    )
    if method == "nuc":
        base.update(
            rel_diff_to_dual=math.nan,
            fro_solution_nuclear_norm=2.5,
            nuc_solution_fro_norm=2.2,
            fro_objective=2.1,
        )
    base.update(kw)
    return exp_svm.SvmSolve(**base)


def _svm(*solves: exp_svm.SvmSolve) -> exp_svm.SvmResult:
    ds = {m: tuple(sorted({s.d for s in solves if s.method == m})) for m in exp_svm.SVM_METHODS}
    return exp_svm.SvmResult(
        n=3, T=4, seeds=1, ds=ds, first_call_s={m: 0.1 for m in exp_svm.SVM_METHODS}, solves=solves
    )


def test_svm_checks_pass() -> None:
    """Oracle: Frobenius methods 1e-12 from the dual (≤ SVM_AGREE_RTOL), all certified; the nuclear
    solution feasible (margin 1) with ||W_nuc||_* = 2 ≤ ||W_fro||_* = 2.5 and ||W_nuc||_F = 2.2 ≥
    ||W_fro||_F = 2.1 → all four checks hold."""
    res = _svm(
        _solve("dual", 4),
        _solve("vector", 4, rel_diff_to_dual=1e-12),
        _solve("primal", 4, rel_diff_to_dual=1e-12),
        _solve("nuc", 4),
    )
    c = _by_name(exp_svm.check_svm(res, size="tiny"))
    assert set(c) == {"methods-agree", "certified", "nuclear-feasible", "nuclear-vs-frobenius"}
    assert all(x.passed for x in c.values()), c
    assert c["methods-agree"].message == "worst ||W − W_dual||/||W_dual|| = 1e-12 over 3 solves"
    assert c["certified"].message == "3/3 certified; worst KKT residual 1e-14"
    assert c["nuclear-feasible"].message == "worst margin 1.0 over 1 solves"


def test_svm_checks_fail() -> None:
    """Oracle: vector 1e-6 from the dual, primal uncertified with KKT 1e-5, nuclear margin 0.99
    (< 1 − SVM_NUC_FEAS_TOL) and ||W_nuc||_* = 3 > ||W_fro||_* = 2.5 → all four checks fail."""
    res = _svm(
        _solve("dual", 4),
        _solve("vector", 4, rel_diff_to_dual=1e-6),
        _solve("primal", 4, certified=False, kkt_max=1e-5),
        _solve("nuc", 4, min_margin=0.99, objective=3.0),
    )
    c = _by_name(exp_svm.check_svm(res, size="tiny"))
    assert not any(x.passed for x in c.values()), c
    assert "= 1e-06 over 3 solves" in c["methods-agree"].message
    assert c["certified"].message == "2/3 certified; worst KKT residual 1e-05"
    assert c["nuclear-feasible"].message == "worst margin 0.99 over 1 solves"


def test_svm_without_nuclear_solves_has_no_nuclear_claims() -> None:
    """Oracle: no nuclear solve → nothing to check about it (the two nuclear claims are absent)."""
    c = _by_name(exp_svm.check_svm(_svm(_solve("dual", 4), _solve("vector", 4)), size="tiny"))
    assert set(c) == {"methods-agree", "certified"}


# ------------------------------------------------------------------------------------------- autograd
def _pt(
    log10_r: float,
    torch_error: float,
    *,
    seed: int = 0,
    ours: float = 1e-15,
    bound: float = 1e-14,
    within: bool = True,
):
    return exp_ag.DirectionPoint(
        seed=seed,
        scale=1.0,
        log10_runner_up=log10_r,
        torch_error=torch_error,
        torch_zero_gradient=bool(math.isnan(torch_error)),
        attnsvm_error=ours,
        differential_bound=bound,
        torch_within_bound=within,
    )


def _ag(*pts: exp_ag.DirectionPoint) -> exp_ag.AutogradResult:
    n, T, d = 2, 3, 3
    return exp_ag.AutogradResult(shape=(n, T, d), seeds=1, ref_bound=n * T * (d + T) * EPS, points=pts)


def test_autograd_checks_pass() -> None:
    """Oracle: autograd's error 2·eps/r (≤ 4T·eps/r, and ≤ 1e-6: 4.4e-13 and 4.4e-8) at r = 1e-3, 1e-8,
    then NaN (no direction) at 1e-20 and 1e-200, leaving the bound at 1e-8; attnsvm within both bounds →
    every claim holds, and the messages give the threshold band (≤ 1e-6 down to 1e-8.0, above it from
    1e-20.0 on) and where the bound is left."""
    res = _ag(
        _pt(-3.0, 2 * EPS / 1e-3),
        _pt(-8.0, 2 * EPS / 1e-8, within=False),
        _pt(-20.0, math.nan, within=False),
        _pt(-200.0, math.nan, within=False),
    )
    c = _by_name(exp_ag.check_autograd_saturation(res, size="tiny"))
    assert all(x.passed for x in c.values()), c
    assert "at every runner-up ≥ 1e-8.0;" in c["autograd-leaves-1e-6"].message
    assert "at every runner-up ≤ 1e-20.0 (2 of 4 points)" in c["autograd-leaves-1e-6"].message
    assert "median 2, max 2 over 2 points (model bound 4T = 12)" in c["autograd-tracks-eps-over-r"].message
    assert "exactly zero gradients: 2" in c["autograd-tracks-eps-over-r"].message
    assert c["differential-bound-flags-autograd"].message.endswith("runner-up 1e-8.0")
    assert "worst error / bound 0.1" in c["attnsvm-within-differential-bound"].message
    nums = exp_ag.numbers_autograd_saturation(res)
    assert nums["torch_error_exceeds_1e_6_below_log10_r"] == -20.0
    assert nums["torch_leaves_bound_at_log10_r"] == [-8.0]


def test_autograd_checks_fail() -> None:
    """Oracle: attnsvm's error twice its differential bound (and above nT(d+T)·eps); autograd above 1e-6
    at r = 1e-3 but within it at 1e-8 (no clean threshold), error·r/eps = 100 > 4T at r = 1e-3, and
    never outside the bound → every claim fails; the messages give 2, 100 and 'never'."""
    res = _ag(
        _pt(-3.0, 100 * EPS / 1e-3, ours=2e-14, bound=1e-14),
        _pt(-8.0, 1e-9),
    )
    c = _by_name(exp_ag.check_autograd_saturation(res, size="tiny"))
    assert not any(x.passed for x in c.values()), c
    assert "worst error / bound 2," in c["attnsvm-within-differential-bound"].message
    assert "max 100 over 2 points" in c["autograd-tracks-eps-over-r"].message
    assert c["differential-bound-flags-autograd"].message.endswith("runner-up never")


# ------------------------------------------------------------------------------------------- toys
def _prompt(key: str, lo: tuple[bool, ...], corr: float = 0.999) -> exp_toys.PromptToy:
    runs = tuple(
        exp_toys.PromptRun(y0=y, final_token=0, corr=corr, direction=np.array([[0.0, 1.0], [1.0, 0.0]]))
        for y in (1.0, -1.0)
    )
    return exp_toys.PromptToy(key=key, runs=runs, p_mm=tuple(np.eye(3)), locally_optimal=lo)


def _toys(*, lo9, lo0, corr=0.999, g_corr=0.999, joint=(0.999, 0.999), own_final=0.1) -> exp_toys.ToysResult:
    steps = np.array([1, 10])
    return exp_toys.ToysResult(
        prompt_steps=10,
        prompt=(_prompt("c=0.9", lo9, corr), _prompt("c=0.0", lo0, corr)),
        global_toy=exp_toys.GlobalToy(
            steps=steps,
            corr=np.array([0.5, g_corr]),
            final_tokens=np.array([0, 0, 0]),
            optimal_tokens=np.array([0, 0, 0]),
            gap_steps=(1.0, 10.0),
            gap=(1e-3, 1e-5),
        ),
        joint=(
            exp_toys.JointToy(
                key="c=1.0", steps=steps, v_corr=np.array([0.5, joint[0]]), p_corr=np.array([0.5, joint[1]])
            ),
        ),
        lp=(
            exp_toys.LpRun(
                key="p=2.0",
                p=2.0,
                steps=steps,
                svm_keys=("p'=1.75", "p'=2.0"),
                svm_ps=(1.75, 2.0),
                bregman=(np.array([1.0, 0.5]), np.array([1.0, own_final])),
            ),
        ),
    )


def test_toys_checks_pass() -> None:
    """Oracle: token 1 locally optimal only at c = 0; prompt, global and joint correlations 0.999 ≥
    TOY_CORR; the ℓp run ends closest (0.1 < 0.5) to its own ℓ2-SVM → every claim holds."""
    res = _toys(lo9=(True, False, True), lo0=(True, True, False))
    c = _by_name(exp_toys.check_toys(res, size="tiny"))
    assert all(x.passed for x in c.values()), c
    assert c["prompt-second-token-local-iff-c0"].message == "locally optimal: c=0.9 → False, c=0 → True"
    assert c["prompt-gd-to-p-mm"].message.startswith("worst corr 0.999000; final tokens c=0.9 y₀=1: 0")
    assert c["global-toy-converges"].message == "final corr 0.999000, final tokens [0, 0, 0]"
    assert c["joint-toy-converges"].message == "c=1.0: corr v 0.999000, p 0.999000"
    assert c["mirror-descent-to-own-lp-svm"].message == "1/1 runs"
    tab = exp_toys.tables_toys(res)
    assert tab["lp"] == [
        {"run": "p=2.0", "svm": "p'=1.75", "final_bregman": 0.5},
        {"run": "p=2.0", "svm": "p'=2.0", "final_bregman": 0.1},
    ]


def test_toys_checks_fail() -> None:
    """Oracle: token 1 locally optimal at c = 0.9 too; correlations 0.9 < TOY_CORR; the ℓp run ends
    closer to the ℓ1.75-SVM (0.5 < 0.7) → every claim fails, with the measured numbers."""
    res = _toys(
        lo9=(True, True, True),
        lo0=(True, True, False),
        corr=0.9,
        g_corr=0.9,
        joint=(0.999, 0.9),
        own_final=0.7,
    )
    c = _by_name(exp_toys.check_toys(res, size="tiny"))
    assert not any(x.passed for x in c.values()), c
    assert c["prompt-second-token-local-iff-c0"].message == "locally optimal: c=0.9 → True, c=0 → True"
    assert c["prompt-gd-to-p-mm"].message.startswith("worst corr 0.900000")
    assert c["global-toy-converges"].message.startswith("final corr 0.900000")
    assert c["joint-toy-converges"].message == "c=1.0: corr v 0.999000, p 0.900000"
    assert c["mirror-descent-to-own-lp-svm"].message == "0/1 runs"


def test_toys_missing_prompt_toy_fails_the_check() -> None:
    """Oracle: without the c = 0 toy the statement cannot be confirmed (its flag reads None)."""
    res = _toys(lo9=(True, False, True), lo0=(True, True, False))
    res = exp_toys.ToysResult(
        prompt_steps=10, prompt=res.prompt[:1], global_toy=res.global_toy, joint=res.joint, lp=res.lp
    )
    c = _by_name(exp_toys.check_toys(res, size="tiny"))
    assert not c["prompt-second-token-local-iff-c0"].passed
    assert c["prompt-second-token-local-iff-c0"].message == "locally optimal: c=0.9 → False, c=0 → None"
