"""The mask strategies (issue 15 §2) keep the guarantees their docstrings state.

Oracles, none reusing the strategies' arithmetic: the mask's own definition (boolean, ``(n, T)``, ≥ 1
allowed token per row, ``keep`` allowed, a prefix with ``padding``); the hard cases recomputed here from
the data (the masked token is ``argmax_t Y_i vᵀx_it`` of the full row, has an exact copy or an equal score,
has the largest norm, is the self-attention query, or a row keeps one token); :meth:`attnsvm.Instance.
from_sequences` rebuilt by hand (row ``i·T + k``: tokens ``X_i``, query ``x_ik``, mask ``t ≤ k``);
``solve_svm``'s certificate for feasibility; and an mpmath softmax for the masked runner-up weight.

``masked=False`` unchanged: the examples ``hypothesis.find`` shrinks to (deterministic: the minimal
example meeting a condition, which depends on the order and kind of every draw a strategy makes) are
pinned by digest from the module as it was before masks. (Digests of ``@seed``-ed runs do not work as a
test: under pytest they differ between processes and test orders.)
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.errors import InvalidInstanceError
from attnsvm.svm import solve_svm

FAST = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Draws over which the hard cases are counted, and the fewest of each that must appear: each hard case is
#: one of ≥ 6 row kinds, so ~1/6 of the masked rows; 5 of 300 is far below that and far above 0.
HARD_CASE_DRAWS = 300
HARD_CASE_MIN = 5
#: mpmath digits for the runner-up oracle; the strategy's log-sum-exp is within ~T·eps·max|l| of it.
MP_DPS = 50
EPS = float(np.finfo(np.float64).eps)


def _valid(mask: np.ndarray, n: int, T: int) -> None:
    assert mask.dtype == np.bool_ and mask.shape == (n, T)
    assert np.all(mask.any(axis=1))


# ---------------------------------------------------------------- token_masks
@FAST
@given(st.integers(1, 4), st.integers(2, 5), st.data())
def test_token_masks_are_valid_and_keep(n: int, T: int, data: st.DataObject) -> None:
    keep = np.array(data.draw(st.lists(st.integers(0, T - 1), min_size=n, max_size=n)), dtype=np.intp)
    for kw in ({}, {"keep": keep}, {"padding": True}, {"padding": True, "keep": keep}):
        mask = data.draw(S.token_masks(n, T, **kw))
        _valid(mask, n, T)
        if "keep" in kw:
            assert np.all(mask[np.arange(n), keep])
        if kw.get("padding"):  # right padding: each row is a prefix
            lengths = mask.sum(axis=1)
            assert np.array_equal(mask, np.arange(T)[None, :] < lengths[:, None])


def test_token_masks_shrink_to_all_true_and_reach_single_tokens() -> None:
    """Shrink target: nothing masked. Reachable: a row with one allowed token, in every row at once."""
    fs = settings(database=None, derandomize=True, max_examples=500, suppress_health_check=list(HealthCheck))
    assert np.all(find(S.token_masks(3, 4), lambda m: True, settings=fs))
    single = find(S.token_masks(3, 4), lambda m: bool(np.all(m.sum(axis=1) == 1)), settings=fs)
    assert np.all(single.sum(axis=1) == 1)
    assert find(S.instances(masked=True), lambda i: True, settings=fs).mask is None


def test_token_masks_refuse_bad_arguments() -> None:
    with pytest.raises(InvalidInstanceError, match="T must be an integer ≥ 2"):
        find(S.token_masks(2, 1), lambda m: True)
    with pytest.raises(InvalidInstanceError, match="keep must hold one token index"):
        find(S.token_masks(2, 3, keep=[0, 3]), lambda m: True)


# ---------------------------------------------------------------- hard cases
def _hard_cases(inst: A.Instance) -> set[str]:
    """Hard cases of a masked instance, recomputed from the data."""
    out: set[str] = set()
    if inst.mask is None:
        return out
    ok = inst.allowed
    gam = inst.Y[:, None] * (inst.X @ inst.v)
    norms = np.linalg.norm(inst.X, axis=2)
    for i in range(inst.n):
        if ok[i].sum() == 1:
            out.add("single token")
        if not ok[i, int(np.argmax(gam[i]))]:
            out.add("score maximiser masked")
        if not ok[i, int(np.argmax(norms[i]))]:
            out.add("largest norm masked")
        for t in np.flatnonzero(~ok[i]):
            others = [u for u in range(inst.T) if u != t]
            if any(gam[i, u] == gam[i, t] or np.array_equal(inst.X[i, u], inst.X[i, t]) for u in others):
                out.add("tie partner masked")
        if inst.self_attention and not ok[i, 0]:
            out.add("query masked")
    return out


def test_instance_masks_reach_every_hard_case() -> None:
    """Counted over ``HARD_CASE_DRAWS`` derandomized draws (uniform data with exact copies, so ties
    exist): every hard case appears at least ``HARD_CASE_MIN`` times, and every mask is valid."""
    counts: Counter[str] = Counter()

    @settings(FAST, max_examples=HARD_CASE_DRAWS)
    @given(S.instances(family="uniform", duplicates=True, masked=True))
    def run(inst: A.Instance) -> None:
        _valid(inst.allowed, inst.n, inst.T)
        counts["draws"] += 1
        counts["masked"] += inst.mask is not None
        counts.update(_hard_cases(inst))

    run()
    for case in (
        "single token",
        "score maximiser masked",
        "largest norm masked",
        "tie partner masked",
        "query masked",
    ):
        assert counts[case] >= HARD_CASE_MIN, dict(counts)


@FAST
@given(S.feasible_instances(masked=True), st.data())
def test_masked_feasible_instances_keep_their_guarantee(inst: A.Instance, data: st.DataObject) -> None:
    """Oracle: ``solve_svm``'s certificate for an α drawn among the allowed tokens (feasible), and the
    scores recomputed here (the optimal token is allowed and leads every allowed one by ≥ min_gap = 0.1)."""
    opt = inst.optimal_tokens()
    ok = inst.allowed
    assert np.all(ok[np.arange(inst.n), opt])
    gam = inst.Y[:, None] * (inst.X @ inst.v)
    for i in range(inst.n):
        rest = [gam[i, t] for t in range(inst.T) if ok[i, t] and t != opt[i]]
        assert all(gam[i, opt[i]] - r >= 0.1 - 1e-12 for r in rest)
    alpha = data.draw(S.token_choices(inst))
    assert np.all(ok[np.arange(inst.n), alpha])
    if np.any(ok.sum(axis=1) >= 2):
        assert solve_svm(inst, alpha).certified
    else:
        with pytest.raises(A.AttnSVMError, match="no constraint"):
            solve_svm(inst, alpha)


# ---------------------------------------------------------------- sequence_instances
@FAST
@given(S.sequence_instances(padding=True))
def test_sequence_instances_are_from_sequences(inst: A.Instance) -> None:
    """Rebuilt by hand: ``n·T`` rows, row ``i·T + k`` holds ``X_i`` and queries ``x_ik``; the mask is within
    ``t ≤ k`` when causal, a prefix per sequence (padding), and keeps token 0."""
    kind = S.instance_kind(inst)
    assert kind.startswith("seq2seq")
    T = inst.T
    m = inst.n // T
    for i in range(m):
        for k in range(T):
            assert np.array_equal(inst.X[i * T + k], inst.X[i * T])
            assert np.array_equal(inst.z[i * T + k], inst.X[i * T, k])
    ok = inst.allowed
    assert np.all(ok[:, 0])
    if "causal" in kind:
        assert not np.any(ok.reshape(m, T, T) & ~np.tril(np.ones((T, T), dtype=bool)))


def test_sequence_instances_reach_causal_padded_and_plain() -> None:
    kinds: Counter[str] = Counter()

    @settings(FAST, max_examples=200)
    @given(S.sequence_instances(padding=True))
    def run(inst: A.Instance) -> None:
        kinds[S.instance_kind(inst).replace(" (single token)", "")] += 1

    run()
    for k in ("seq2seq", "seq2seq causal", "seq2seq padded", "seq2seq causal padded"):
        assert kinds[k] >= HARD_CASE_MIN, dict(kinds)


# ---------------------------------------------------------------- helpers with masks
@FAST
@given(S.instances(masked=True) | S.sequence_instances(padding=True), st.data())
def test_masked_runner_up_weight_matches_mpmath(inst: A.Instance, data: st.DataObject) -> None:
    """``log_runner_up_weight`` over the allowed tokens against an mpmath softmax of the allowed logits
    (rows with one allowed token skipped; ``−inf`` when no row has two)."""
    W = data.draw(S.saturated_weights(inst, log_runner_up=(-50.0, -2.0)))
    got = S.log_runner_up_weight(inst, W)
    ok = inst.allowed
    rows = [i for i in range(inst.n) if ok[i].sum() >= 2]
    if not rows:
        assert got == -np.inf
        return
    with mpmath.workdps(MP_DPS):
        best: Any = None
        for i in rows:
            lg = sorted(
                (
                    mpmath.fsum(
                        mpmath.mpf(float(inst.X[i, t, k]))
                        * mpmath.mpf(float(W[k, j]))
                        * mpmath.mpf(float(inst.z[i, j]))
                        for k in range(inst.d)
                        for j in range(inst.d)
                    )
                    for t in range(inst.T)
                    if ok[i, t]
                ),
                reverse=True,
            )
            if best is None or lg[0] - lg[1] > best[0]:
                best = (lg[0] - lg[1], lg)
        lg = best[1]
        ref = float(lg[1] - lg[0] - mpmath.log(mpmath.fsum(mpmath.exp(v - lg[0]) for v in lg)))
        lmax = float(max(abs(v) for v in lg))
    # float64 logits: d² products per logit (d²·eps·Σ|terms|), then log-sum-exp (T·eps·max|l|)
    lam = float(np.max(np.abs(inst.keys) @ np.abs(W) @ np.abs(inst.z).T))
    tol = 8 * EPS * (inst.d**2 * lam + inst.T * max(1.0, lmax))
    assert abs(got - ref) <= tol


@FAST
@given(S.instances(masked=True), st.integers(-20, 20))
def test_scaled_keeps_the_mask(inst: A.Instance, j: int) -> None:
    sc = S.scaled(inst, j, j, -j)
    assert (sc.mask is None) == (inst.mask is None)
    assert np.array_equal(sc.allowed, inst.allowed)
    assert np.array_equal(sc.X, np.ldexp(inst.X, j))


# ---------------------------------------------------------------- masked=False draws unchanged
#: Choice sequences (the values Hypothesis hands a strategy) and the digest of what the strategy built from
#: them, recorded from attnsvm/strategies.py as it was before masks (Hypothesis 6.170.17). Replaying them is
#: deterministic (unlike a seeded run, whose draws under pytest depend on the process and the test order), so
#: an unmasked strategy that now drew anything differently would build something else.
PRE_MASK_DRAWS: dict[str, tuple[tuple[Any, ...], str]] = {
    "uniform_ties": (
        (
            False,
            2,
            3,
            2,
            True,
            7,
            0.39872673209938814,
            True,
            11,
            -1.9779415269956427e-188,
            True,
            10,
            -2.8707207673061284,
            True,
            2,
            -1.0234951769317262,
            True,
            0,
            5.365480217076325e-44,
            True,
            9,
            -3.5997984739502668e-149,
            True,
            2,
            True,
            5,
            -1.5,
            False,
            -3.3955284798380436,
            True,
            1,
            -1.7558454631642646,
            True,
            0,
            0.8441675390884535,
            False,
            True,
            1,
            0.3333333333333333,
            True,
            3,
            5.361941228590372e-109,
            True,
            0,
            -2.9630208660413386e-247,
            True,
            2,
            3.554982744836975,
            False,
            True,
            0,
            True,
            0,
            True,
            0,
            True,
            0,
            1,
            1,
        ),
        "bf9fbddb87cc1e08",
    ),
    "feasible": (
        (
            2,
            3,
            0,
            0,
            1,
            1.3247612622686353,
            1,
            False,
            2,
            True,
            0,
            1.01,
            True,
            0,
            True,
            1,
            0.35173282259283667,
            False,
            1287937,
            707,
            21076,
            166,
            17188,
            41233445,
            2679,
            431,
            358103,
            12842981,
            985904,
            24637,
            690054,
            1972048,
            576,
            308,
            -0.0,
            1.1754943508222875e-38,
            -0.16874957549175007,
            1.1168976917357154,
            0.5,
            1.0,
            151,
            6961,
            11479123,
            511,
            358,
            27,
            73716,
            141030,
            285,
            37837,
            1443,
            40208,
            248922,
            0.921480424772616,
            -0.8225313907701799,
            -0.057897233240045365,
            1.8370598240922793,
            1.5,
            0.7912924755480921,
            233456897,
            3403,
            4,
            250,
            210,
            970,
            13125,
            39,
            2000,
            4103445,
            7040,
            2806,
            2570,
            890,
            268,
            2563136,
            225,
            999749,
            1,
            364,
            913368,
            18339,
            560,
            364,
            57,
            791,
            216,
            30596,
            11930,
            0.8026024997592267,
            1.018925478922808,
        ),
        "51df7d6169027350",
    ),
    "alphas": (
        (
            False,
            2,
            3,
            2,
            9624,
            8356816,
            213217,
            4402,
            2888440,
            1,
            2,
            3246604,
            791432,
            15347651,
            987245,
            4942,
            438,
            185,
            6256343,
            932,
            24658353,
            10054534,
            0,
            0,
            True,
            0,
            0,
            True,
            0,
            True,
            0,
            True,
            1,
            1,
            False,
        ),
        "737460215de9362c",
    ),
    "saturated": (
        (
            1,
            3,
            2,
            11844184,
            772,
            1344,
            211,
            7677,
            29,
            2,
            4542944,
            1028244,
            23656171,
            1,
            409386889,
            3097,
            457,
            595929,
            33697557,
        ),
        "ebee884896ba4a33",
    ),
}
PRE_MASK_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "uniform_ties": S.instances(
        n=(2, 2), T=(3, 3), d=(2, 2), family="uniform", duplicates=True, near_parallel=True
    ),
    "feasible": S.feasible_instances(n=(2, 2), T=(3, 3), extra_d=(0, 0), attention="cross"),
    "alphas": S.instances_and_alphas(S.instances(n=(2, 2), T=(3, 3), d=(2, 2))),
    "saturated": S.instances_and_weights(
        S.instances(n=(1, 1), T=(3, 3), d=(2, 2), attention="self"), log_runner_up=(-50.0, -2.0)
    ),
}


def _digest(x: Any) -> str:
    h = hashlib.sha256()

    def feed(y: Any) -> None:
        if hasattr(y, "X"):
            for a in (y.X, y.Y, y.v, y.z):
                h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        elif isinstance(y, tuple):
            for e in y:
                feed(e)
        else:
            h.update(np.ascontiguousarray(y).tobytes())

    feed(x)
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(PRE_MASK_DRAWS))
def test_unmasked_draws_are_unchanged(name: str) -> None:
    """Oracle: the pre-mask module's output for the same choices (pinned digest). Uses Hypothesis's
    internal ``ConjectureData.for_choices`` (the only deterministic replay of a choice sequence)."""
    from hypothesis.internal.conjecture.data import ConjectureData

    choices, digest = PRE_MASK_DRAWS[name]
    x = ConjectureData.for_choices(choices).draw(PRE_MASK_STRATEGIES[name])
    assert x[0].mask is None if isinstance(x, tuple) else x.mask is None
    assert _digest(x) == digest
