"""GD → SVM: normalized GD converges in direction to ``W_mm(α_final)``; the selected tokens are
locally optimal; under the global-convergence condition they are the optimal tokens; the
regularization path approaches the max-margin direction too.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Thm. on local convergence of
normalized GD, global convergence when every non-optimal token of a sequence has the same score,
regularization path); Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

Calibration. On 85 instances of this file's family (n ≤ 3, T ≤ 5, d ≤ 4, Gaussian data with
``d ≥ max(n, T − 1)``, normalized GD, ``lr = 0.1``, ``W_0 = 0``) the direction gap
``1 − corr(W_t, W_mm(α_final))`` fell ~4× per doubling of ``t`` (``∝ (η t)^{−2}``), with
``gap · (η t)² ≤ 20``. The ci run then found a slower instance (pinned, ``GD_SLOW``: gaps 1.6e-2,
1.2e-2, 6.9e-3, 3.1e-3, 1.2e-3, 3.7e-4 at steps 250 … 8000, i.e. ``gap · (η t)² = 236`` and still
accelerating): the asymptotic rate holds but its constant varies by more than 10× between
instances, so a fixed ``C/(ηt)²`` bound is not a sound threshold. The test therefore measures ``C``
on each run (``RATE_SLACK``): after the final token segment starts the gap decreases at every
record, and every record after ``SETTLE_BY`` satisfies ``gap(t) ≤ RATE_SLACK·C/t²`` with ``C`` the
largest ``gap·t²`` of the segment's records up to ``SETTLE_BY`` — the theory's rate, not a fixed
angle.

Finding (sweep, pinned as ``GD_LATE_SWITCH``): tokens that look settled are not always settled.
On a 3×5×4 instance GD selects α = (3, 4, 2) from step ≤ 250 to 1000 while its gap to
``W_mm(3, 4, 2)`` falls like the rate above (9.6e-3, 2.2e-3, 5.5e-4), and that α *is* locally
optimal; then GD leaves it and selects ``opt = (4, 4, 2)`` by step 2000 (gap to ``W_mm(opt)``:
5.9e-3, 3.5e-4, 7.6e-5 at steps 2000, 4000, 8000). So convergence towards a locally optimal
``W_mm(α)`` for a while does not mean GD stays there; the tests below therefore measure from the
first step of the *final* token segment (``s0``), and require ``s0 ≤ SETTLE_BY``.

Masks (issue 15 §2). The direction and global-condition properties have ``*_masked`` twins on masked
instances (:func:`attnsvm.strategies.instances` / :func:`~attnsvm.strategies.feasible_instances` with
``masked=True``: masks aimed at the score maximiser, a tie partner, the largest token, a single allowed
token). A masked instance is the unmasked one with the masked tokens deleted, so the single-query theorems
apply to it unchanged (``d ≥ max(n, T_i − 1)`` still holds; the global condition survives masking
non-optimal tokens); the SVM and local-optimality oracles read the mask themselves. A mask that leaves
every sequence one token leaves no gradient and no Att-SVM constraint: there ``solve_svm``'s refusal is
asserted instead. Sequence-to-sequence instances are *not* asserted here: their convergence is beyond
the single-query theorems (issue 15: measured and reported by the ``reproduce`` experiment, not asserted).
The twins run ``MASKED_EXAMPLES`` examples (each a full 8000-step run) to stay within ~15 s.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, example, given, note, settings, target

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.gd import direction_corr, direction_gap, regularization_path, run_gd
from attnsvm.model._instance import Instance
from attnsvm.svm import is_locally_optimal, local_optimality_report, solve_svm

LR = 0.1
STEPS = 8000
RECORD = [250, 500, 1000, 2000, 4000, 8000]
#: The final token segment must start by this step (measured: ≤ 2000, the pinned late switch).
SETTLE_BY = 2000
#: The theory's rate (normalized GD, arXiv 2308.16898; README: slope −2.0000 from 10³ to 10⁶ steps):
#: ``gap(t) = 1 − corr(W_t, W_mm(α_final)) ≈ C/t²``. ``C`` is measured on the run itself, as the
#: largest ``gap·t²`` over the final segment's records up to ``SETTLE_BY``; the later records must
#: satisfy ``gap(t) ≤ RATE_SLACK·C/t²``. Measured spread of ``max_{t > 2000} gap·t² / C``: ≤ 1.16 on
#: 58 instances of this family (ci draws, 8000 steps), 1.9 on the pinned ``GD_SLOW`` (pre-asymptotic:
#: ``gap·t²`` still grows from 1e3 at t = 250 to 2.4e4 at t = 8000); 4 is twice the worst.
RATE_SLACK = 4.0
#: Gaps below this are at the rounding level of the measurement and carry no rate: the SVM
#: direction is certified to ~1e-14 relative and 8000 float64 steps leave ≲ 8000·eps ≈ 2e-12
#: relative error in ``W_t``; the gap of two unit matrices that far apart is ≲ (2e-12)² ≈ 4e-24.
#: 1e-20 keeps 4 decades of margin (measured: one instance at 8e-27, d = 1 instances at exactly 0).
GAP_FLOOR = 1e-20
#: After settling the gap must shrink between records; allow it to grow by rounding only
#: (``corr`` is a ratio of d²-long dot products: relative error ~ d²·EPS ≪ 1e-12).
MONOTONE_SLACK = 1e-12
#: A regularization-path point counts as stationary when its KKT residual ``||∇L/||∇L|| + W/R||``
#: (a distance between unit-scale directions) is at most this.
PATH_KKT_OK = 0.1
#: Path points that are not stationary (the claim does not apply) may be at most this fraction of
#: the path property's examples (measured in the ci profile: see test_path_discards_are_rare).
MAX_NONSTATIONARY_FRACTION = 0.05
_path_counts = {"all": 0, "not stationary": 0}
#: arccos of 1 − g computed from a gap g with relative error ~1e-15 has absolute error ≲ 1e-7 near
#: g = 0 (dθ = dg/sin θ ≈ dg/√(2g)); 1e-6 covers the three angles of the triangle inequality.
ANGLE_SLACK = 1e-6

#: The dev profile's unconverged-path instance (exact float64 values).
PATH_SLOW = dict(
    X=[
        [[1.35731007, 1.27350366], [-0.82885897, 0.79571898], [1.55870721, -0.55823163]],
        [[-0.81456724, -1.00454438], [-2.04603078, -0.85137168], [0.58707733, 0.10769225]],
    ],
    Y=[1.0, 1.0],
    v=[-0.90648223, -0.50614519],
)

#: The ci run's slow instance (module docstring), exact float64 values.
GD_SLOW = dict(
    X=[
        [
            [-0.6659328712946647, -0.018902500715432258],
            [-0.26687176879353336, -1.3393217839210059],
            [-1.2852488495090926, -0.19510102508081967],
        ],
        [
            [0.5571421730116081, 0.15496757857863197],
            [0.4748340033119231, 0.749577404666003],
            [-0.00034703692474363025, 1.4793903760573048],
        ],
    ],
    Y=[1.0, 1.0],
    v=[0.5324839913374303, -1.308647310997363],
    z=[[0.012971524882959344, -0.22736085550510335], [-0.6579946187902878, -1.6335950144262836]],
)

#: The sweep's late-switch instance (see module docstring), exact float64 values.
GD_LATE_SWITCH = dict(
    X=[
        [
            [-0.8019314252534474, -1.324358995628145, -0.24836162209524854, 0.4204452380655215],
            [1.1360465324896427, 0.10970639932180819, -0.5526473205362324, -0.7847803553442784],
            [0.7487457707345911, 1.6347830429585775, 0.27276877584472176, -1.2333286640307717],
            [-0.9582652054360887, 1.6000190889991115, 0.2028824405086084, -1.7321348424395848],
            [-0.08369619281702581, -1.1632259734447485, -0.6292880940615545, -0.48800582327685743],
        ],
        [
            [-0.7133133716322436, 0.5533784703532895, -0.06308597192528916, -0.5894312580326048],
            [0.40963782655711695, 0.8298553070613239, -1.643023371405677, -0.256730126365494],
            [-0.9807473560440125, -0.17315522486203205, -1.2894187467538587, 0.0206903940375912],
            [-0.03788574104406823, -0.304337750958489, -1.0479265051202462, -0.3961903304730927],
            [-1.091328901695709, -1.3552087462047395, 0.22478573245989314, -1.109349937891366],
        ],
        [
            [1.1702961011782933, 0.7165876558738361, -1.9978166924497212, 0.272128869412488],
            [-1.1017166275810448, 0.033057220158269195, 0.04363199256942161, -1.9884297882311208],
            [-0.23342252376577002, -0.255790031399391, 0.9620005318430944, -1.1814468079562157],
            [0.7380418978456841, -1.0989727630364063, -0.33129089269991674, -0.8404731684222111],
            [1.448731288921672, 0.5682130997882933, 2.4317325028452124, 0.6419163790823205],
        ],
    ],
    Y=[1.0, 1.0, 1.0],
    v=[0.10302313848680769, -0.8649727462818201, 0.8957830431894438, -1.298481208246912],
    z=[
        [0.8449927337191754, 0.8406828762653401, -0.6066115359095516, -0.07002844663838208],
        [1.350388867744626, -0.3965507651729716, 0.18879953129109867, -0.021223460417289796],
        [0.6092164928327407, -0.3649087419473726, -0.15236188875684828, 0.24238142867215043],
    ],
)

costly = settings(max_examples=max(5, settings.default.max_examples // 8))
#: Examples of each masked twin: a quarter of ``costly`` (each example is a full 8000-step GD run, ~3 s).
MASKED_EXAMPLES = max(3, settings.default.max_examples // 32)
masked_costly = settings(max_examples=MASKED_EXAMPLES)

generic = S.shapes(n=(1, 3), T=(2, 5), d=(1, 4), generic_feasible=True).flatmap(
    lambda sh: S.instances(shape=sh, family="gaussian")
)
#: Shapes with ``d < n`` too (``d`` raised only to ``T − 1``): the local-optimality property.
below_n = S.shapes(n=(1, 3), T=(2, 5), d=(1, 4), generic_feasible=True, below_n=True).flatmap(
    lambda sh: S.instances(shape=sh, family="gaussian")
)
#: The global-convergence condition: every non-optimal token of a sequence has the same score.
equal_scores = S.feasible_instances(n=(1, 3), T=(2, 4), equal_nonoptimal_scores=True)
#: Masked twins' data (module docstring).
generic_masked = S.shapes(n=(1, 3), T=(2, 5), d=(1, 4), generic_feasible=True).flatmap(
    lambda sh: S.instances(shape=sh, family="gaussian", masked=True)
)
equal_scores_masked = S.feasible_instances(n=(1, 3), T=(2, 4), equal_nonoptimal_scores=True, masked=True)


def _masked_hard_case(seed: int) -> Instance:
    """A generic 2×4×3 instance (``d ≥ max(n, T − 1)``) with sequence 0's score maximiser and sequence 1's
    largest token masked: the masked twins' pinned example (the few generated ones may all be plain or
    single-token)."""
    inst = A.random_instance(2, 4, 3, seed=seed)
    mask = np.ones((2, 4), dtype=bool)
    mask[0, int(np.argmax(inst.scores()[0]))] = False
    mask[1, int(np.argmax(np.linalg.norm(inst.X[1], axis=1)))] = False
    return A.Instance(inst.X, inst.Y, inst.v, inst.z, mask=mask)


_E5 = np.eye(5)
#: The global condition with a mask, by hand: v = e_0, token scores (1, 0, 0) in both sequences (opt = 0,
#: the non-optimal scores equal), tokens affinely independent, queries independent; sequence 0's token 2
#: is masked (its remaining non-optimal token keeps the condition).
GLOBAL_MASKED = A.Instance(
    np.array([[_E5[0] + _E5[1], _E5[2], _E5[3]], [_E5[0] + _E5[2], _E5[1], _E5[3]]]),
    np.array([1.0, 1.0]),
    _E5[0],
    np.array([_E5[4] + 0.5 * _E5[1], _E5[3] + _E5[4]]),
    mask=np.array([[True, True, False], [True, True, True]]),
)


def _refused_without_rows(inst: Instance) -> bool:
    """Event the kind; where the mask leaves every sequence one token (no gradient, no constraint)
    assert ``solve_svm``'s refusal and say so."""
    event(f"instance: {S.instance_kind(inst)}")
    if np.any(inst.allowed.sum(axis=1) >= 2):
        return False
    with pytest.raises(A.AttnSVMError, match="no constraint"):
        solve_svm(inst)
    event("no constraint (every sequence keeps one token): refusal asserted")
    return True


def _run(inst: Instance):  # type: ignore[no-untyped-def]
    return run_gd(inst, steps=STEPS, lr=LR, normalized=True, record_at=RECORD, keep_iterates=True)


def _final_segment_start(tr) -> int:  # type: ignore[no-untyped-def]
    """Index of the first record of the final run of identical selected tokens."""
    tokens = tr.tokens
    k = len(tokens) - 1
    while k > 0 and np.array_equal(tokens[k - 1], tokens[-1]):
        k -= 1
    return k


@costly
@example(inst=A.Instance(**GD_LATE_SWITCH))  # type: ignore[arg-type]
@example(inst=A.Instance(**GD_SLOW))  # type: ignore[arg-type]
@given(generic)
def test_normalized_gd_converges_in_direction_to_svm_of_final_tokens(inst: Instance) -> None:
    tr = _run(inst)
    k0 = _final_segment_start(tr)
    s0 = int(tr.steps[k0])
    note(f"tokens per record {tr.tokens.tolist()}, final segment from step {s0}")
    assert s0 <= SETTLE_BY, f"selected tokens still changing at step {s0}"
    W_mm = solve_svm(inst, tr.final_tokens).W
    gaps = [direction_gap(r.W, W_mm) for r in tr.record[k0:]]
    note(f"direction gaps from step {s0}: {gaps}")
    assert all(b <= a + MONOTONE_SLACK for a, b in zip(gaps, gaps[1:], strict=False)), "correlation fell"
    _assert_rate(tr.steps[k0:], gaps)


def _assert_rate(steps: np.ndarray, gaps: list[float]) -> None:
    """``gap(t) ≤ RATE_SLACK·C/t²`` after ``SETTLE_BY``, ``C = max gap·t²`` up to it (module docstring)."""
    t = np.asarray(steps, dtype=np.float64)
    g = np.asarray(gaps, dtype=np.float64)
    early, late = t <= SETTLE_BY, t > SETTLE_BY
    C = float(np.max(g[early] * t[early] ** 2))
    bound = np.maximum(RATE_SLACK * C / t[late] ** 2, GAP_FLOOR)
    if np.all(g <= GAP_FLOOR):
        event("direction exact to rounding (every gap ≤ GAP_FLOOR)")
    above = late & (g > GAP_FLOOR)  # the rate is measurable only above the rounding floor
    ratio = float(np.max(g[above] * t[above] ** 2)) / C if C > 0 and np.any(above) else 0.0
    target(ratio, label="late gap·t² / early C")
    note(f"C = {C:.3g}, late gap·t²/C = {ratio:.3g}")
    assert np.all(g[late] <= bound), (g[late].tolist(), bound.tolist())


#: The surviving candidate of the README's local/global experiment (unit, n = 6, T = 8, d = 2 < n,
#: seed 20031): GD's tokens settle by step 250, ||W|| grows like ηt, Att-SVM(α_final) is feasible,
#: and α_final is not locally optimal (support token 2 of sequence 5 outscores the selected one).
SEED_20031 = A.random_instance(6, 8, 2, seed=20031, family="unit")


@costly
@example(inst=SEED_20031)
@example(inst=A.Instance(**GD_LATE_SWITCH))  # type: ignore[arg-type]
@given(below_n)
def test_final_tokens_are_locally_optimal(inst: Instance) -> None:
    """Empirical conjecture (the theory proves convergence *to* locally optimal directions from a
    suitable start; from ``W = 0`` it is open): GD from zero ends at a locally optimal α.

    The claim's true condition. At ``d ≥ n`` (generic data: every Att-SVM(α) feasible) it is
    asserted: no counterexample in the ci/sweep runs (README). At ``d < n`` the queries are
    dependent: Att-SVM(α_final) may be infeasible (the claim does not apply: counted), and where it
    is feasible α_final need not be locally optimal — the finding, pinned as ``SEED_20031`` (see
    test_finding_d_below_n_gd_ends_not_locally_optimal); there the property asserts what the report
    must give: a verdict with its certificate (the violating support token)."""
    tr = _run(inst)
    rep = local_optimality_report(inst, tr.final_tokens)
    if inst.d >= inst.n:
        event("d ≥ n: asserted")
        assert rep.feasible, rep.reason
        assert rep.locally_optimal, rep.reason
        return
    if not rep.feasible:
        event("d < n: Att-SVM(α_final) infeasible (claim not applicable)")
        assert "infeasible" in rep.reason
    elif rep.locally_optimal:
        event("d < n: locally optimal")
    else:
        event("d < n: NOT locally optimal (the finding)")
        note(rep.reason)
        assert "support token" in rep.reason, rep.reason


def test_finding_d_below_n_gd_ends_not_locally_optimal() -> None:
    """The README's surviving candidate reproduces in the property's budget (8000 steps): tokens
    settled from the first record, GD diverging (||W_t|| ≥ 0.9·ηt at every record; measured 0.947 at
    t = 250 rising to 0.991 at t = 8000), Att-SVM(α_final)
    feasible, and α_final not locally optimal — a counterexample to the conjecture at d = 2 < n = 6."""
    tr = _run(SEED_20031)
    assert _final_segment_start(tr) == 0
    assert np.all(tr.norms >= 0.9 * LR * tr.steps)
    rep = local_optimality_report(SEED_20031, tr.final_tokens)
    assert rep.feasible and not rep.locally_optimal
    assert "support token 2 of sequence 5" in rep.reason


@costly
@given(equal_scores)
def test_global_condition_selects_optimal_tokens(inst: Instance) -> None:
    """Condition: in every sequence all non-optimal tokens share one score (and the step is small:
    lr = 0.1 with unit-norm directions). Then GD selects ``opt`` and aligns with ``W_mm(opt)``."""
    tr = _run(inst)
    opt = inst.optimal_tokens()
    assert np.array_equal(tr.final_tokens, opt)
    assert is_locally_optimal(inst, opt)
    k0 = _final_segment_start(tr)
    assert int(tr.steps[k0]) <= SETTLE_BY
    W_mm = solve_svm(inst).W
    _assert_rate(tr.steps[k0:], [direction_gap(r.W, W_mm) for r in tr.record[k0:]])


@costly
@given(generic)
def test_regularization_path_approaches_svm_direction(inst: Instance) -> None:
    """The path ``W_R`` (stationary points of ``min_{||W|| ≤ R} L``) turns towards ``W_mm(α_R)``
    for the tokens it selects at the largest radius; where GD selects the same tokens, both end
    in the same direction. Condition: the claim is about *stationary* points, so it is asserted
    when the largest radius's point has KKT residual ≤ ``PATH_KKT_OK`` (found by the dev profile:
    with 500 steps per radius a 2×3×2 instance stopped at residual 0.24 with gap 0.022; at 4000
    steps the same point is stationary with gap 2.5e-4, pinned below). Measured on this family at
    stationary points: ``1 − corr`` at R = 64 ≤ 2e-3; bound 10×."""
    radii = [4.0, 16.0, 64.0]
    path = regularization_path(inst, radii, max_steps=2000)
    last = path.points[-1]
    note(f"path KKT residuals {[p.kkt_residual for p in path.points]}")
    _path_counts["all"] += 1
    if not last.kkt_residual <= PATH_KKT_OK:
        # counted and bounded (test_path_discards_are_rare): the claim is about stationary points
        _path_counts["not stationary"] += 1
        event("path point at R = 64 not stationary: claim not applicable (counted, bounded)")
        return
    alpha_R = last.tokens
    W_mm = solve_svm(inst, alpha_R).W
    gaps = [direction_gap(p.W, W_mm) for p in path.points]
    note(f"path gaps {gaps}")
    assert gaps[-1] <= 2e-2
    assert gaps[-1] <= gaps[0] + MONOTONE_SLACK
    tr = _run(inst)
    if np.array_equal(tr.final_tokens, alpha_R):
        event("GD selects the path's tokens")

        # Both head for W_mm(α_R): by the triangle inequality for angles on the sphere,
        # ∠(W_GD, W_R) ≤ ∠(W_GD, W_mm) + ∠(W_R, W_mm) (+ rounding of the arccos: ANGLE_SLACK).
        def angle(g: float) -> float:  # 1 − cos θ = g
            return math.acos(max(-1.0, min(1.0, 1.0 - g)))

        lhs = angle(direction_gap(tr.W, last.W))
        rhs = angle(direction_gap(tr.W, W_mm)) + angle(gaps[-1])
        assert lhs <= rhs + ANGLE_SLACK, (lhs, rhs)


def test_path_discards_are_rare() -> None:
    """Runs after the path property (file order): non-stationary path points (where the claim does
    not apply) are at most MAX_NONSTATIONARY_FRACTION of its examples."""
    if _path_counts["all"] == 0:
        pytest.skip("selected alone: the path property did not run in this session")
    assert _path_counts["not stationary"] <= MAX_NONSTATIONARY_FRACTION * _path_counts["all"], _path_counts


def test_regularization_path_found_unconverged_at_500_steps() -> None:
    """The dev-profile instance: with 4000 steps per radius the R = 64 point is stationary
    (residual 0.037) and its gap is 2.5e-4; with 500 it was not (residual 0.24, gap 0.022)."""
    inst = A.Instance(**PATH_SLOW)  # type: ignore[arg-type]
    path = regularization_path(inst, [4.0, 16.0, 64.0], max_steps=4000)
    last = path.points[-1]
    assert last.kkt_residual <= PATH_KKT_OK
    assert 1 - direction_corr(last.W, solve_svm(inst, last.tokens).W) <= 2e-2


def test_finding_gd_leaves_a_locally_optimal_direction_it_tracked() -> None:
    """The pinned late switch (module docstring): at step 1000 GD selects a locally optimal α ≠ opt
    and is within 1e-3 of ``W_mm(α)`` in direction, yet by step 8000 it selects ``opt``."""
    inst = A.Instance(**GD_LATE_SWITCH)  # type: ignore[arg-type]
    tr = _run(inst)
    at = {int(r.step): r for r in tr.record}
    alpha = at[1000].tokens
    assert not np.array_equal(alpha, inst.optimal_tokens())
    assert is_locally_optimal(inst, alpha)
    assert 1 - direction_corr(at[1000].W, solve_svm(inst, alpha).W) <= 1e-3
    assert np.array_equal(tr.final_tokens, inst.optimal_tokens())


# ---------------------------------------------------------------- masked twins
@masked_costly
@example(inst=_masked_hard_case(3))
@given(generic_masked)
def test_normalized_gd_converges_in_direction_to_svm_of_final_tokens_masked(inst: Instance) -> None:
    """As the unmasked property (same body) on masked instances: GD's direction converges to
    ``W_mm(α_final)`` over the allowed tokens at the theory's rate (the deletion construction: the
    masked instance is an unmasked one with fewer tokens)."""
    if not _refused_without_rows(inst):
        test_normalized_gd_converges_in_direction_to_svm_of_final_tokens.hypothesis.inner_test(inst)


@masked_costly
@example(inst=GLOBAL_MASKED)
@given(equal_scores_masked)
def test_global_condition_selects_optimal_tokens_masked(inst: Instance) -> None:
    """The global condition survives masking non-optimal tokens: GD selects ``opt`` (allowed by
    construction) and aligns with ``W_mm(opt)`` over the allowed tokens."""
    if not _refused_without_rows(inst):
        test_global_condition_selects_optimal_tokens.hypothesis.inner_test(inst)
