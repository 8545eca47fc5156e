"""The public Hypothesis strategies keep the guarantees their docstrings state.

Each test states one documented guarantee and checks it with an oracle that does not reuse the
strategy's own arithmetic: a pure-Python SplitMix64 and mpmath's inverse normal CDF for the Gaussian
entries; numpy's SVD (smallest singular value against the bound the construction proves) and an
explicit feasible ``W`` for Att-SVM(α); ``math.fsum``/``fractions.Fraction`` for norms and
differences; an mpmath softmax for runner-up weights; the exact messages of the errors; and
``hypothesis.find`` for what a strategy can reach and what it shrinks to.

Every ``@given`` runs derandomized with few examples, so the file is fast and its outcome does not
depend on the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any, TypeVar

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import attnsvm as A
from attnsvm import strategies as S

EPS = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)
MAX = float(np.finfo(np.float64).max)

#: Unit-norm check: the strategy's norm (≤ 3 eps for d ≤ 5: a sum of d squares, a square root),
#: the d quotients (½ eps each) and our fsum-based norm (1 eps) — 8 eps leaves a margin.
UNIT_TOL = 8 * EPS
#: SVD backward error (a few eps · ||D||, ||D|| ≲ 30 here) and the rounding of the constructed tokens
#: (a few eps · ||x||): far below 1e-12 in absolute terms.
SVD_TOL = 1e-12
#: Scores recomputed from the tokens differ from the designed ones by the rounding of
#: x = g e_0 + r p + m (eps · ||x|| ≲ 1e-14): 1e-12 absolute covers it.
SCORE_TOL = 1e-12
#: Lower bound on every singular value the feasible construction proves (radii and query scales ≥ ½).
SIGMA_MIN = 0.5
#: mpmath working precision (decimal digits) for softmax and inverse-CDF oracles.
MP_DPS = 50

FAST = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

T_ = TypeVar("T_")


def simplest(
    strategy: st.SearchStrategy[T_],
    condition: Callable[[T_], bool] = lambda _: True,
    *,
    shrink: bool = True,
    max_examples: int = 2000,
) -> T_:
    """The example Hypothesis shrinks to among those meeting ``condition`` (deterministic); with
    ``shrink=False`` the first one generated."""
    return find(
        strategy,
        condition,
        settings=settings(
            max_examples=max_examples,
            database=None,
            derandomize=True,
            deadline=None,
            phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )


def reachable(
    strategy: st.SearchStrategy[Any], condition: Callable[[Any], bool], max_examples: int = 2000
) -> bool:
    try:
        simplest(strategy, condition, shrink=False, max_examples=max_examples)
    except NoSuchExample:
        return False
    return True


def draw_once(strategy: st.SearchStrategy[T_]) -> T_:
    return simplest(strategy, shrink=False)


def fsum_norm(a: np.ndarray) -> float:
    return math.sqrt(math.fsum(float(x) ** 2 for x in np.ravel(a)))


def tokens_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b))


def has_repeated_token(inst: A.Instance) -> bool:
    return any(
        tokens_equal(inst.X[i, t], inst.X[i, u])
        for i in range(inst.n)
        for t in range(inst.T)
        for u in range(t)
    )


# ------------------------------------------------------------------------------------- sizes
@settings(FAST, max_examples=60)
@given(S.shapes(n=(2, 3), T=(3, 5), d=(1, 2)))
def test_shapes_lie_in_the_requested_ranges(shape: tuple[int, int, int]) -> None:
    n, T, d = shape
    assert 2 <= n <= 3 and 3 <= T <= 5 and 1 <= d <= 2


def test_shapes_reach_both_ends_and_shrink_to_the_lower_one() -> None:
    strat = S.shapes(n=(2, 3), T=(3, 5), d=(1, 2))
    assert simplest(strat) == (2, 3, 1)
    assert simplest(strat, lambda s: s[0] == 3 and s[1] == 5 and s[2] == 2) == (3, 5, 2)


def test_degenerate_ranges_are_accepted() -> None:
    assert draw_once(S.shapes(n=(1, 1), T=(2, 2), d=(1, 1))) == (1, 2, 1)
    assert draw_once(S.shapes(n=(2, 2), T=(3, 3), d=(4, 4))) == (2, 3, 4)


@settings(FAST, max_examples=60)
@given(S.shapes(n=(1, 4), T=(2, 5), d=(1, 2), generic_feasible=True))
def test_generic_feasible_shapes_have_d_at_least_n_and_T_minus_1(shape: tuple[int, int, int]) -> None:
    n, T, d = shape
    need = max(n, T - 1)
    assert need <= d <= max(2, need)


@settings(FAST, max_examples=60)
@given(S.shapes(n=(1, 4), T=(2, 5), d=(1, 2), generic_feasible=True, below_n=True))
def test_below_n_shapes_keep_only_d_at_least_T_minus_1(shape: tuple[int, int, int]) -> None:
    n, T, d = shape
    assert T - 1 <= d <= max(2, T - 1)


def test_below_n_shapes_reach_d_below_n() -> None:
    strat = S.shapes(n=(3, 3), T=(2, 2), d=(1, 1), generic_feasible=True, below_n=True)
    assert simplest(strat) == (3, 2, 1)
    assert simplest(S.shapes(n=(3, 3), T=(2, 2), d=(1, 1), generic_feasible=True)) == (3, 2, 3)


@pytest.mark.parametrize(
    ("kwargs", "name", "low", "bad"),
    [
        ({"n": (0, 1)}, "n", 1, (0, 1)),
        ({"n": (3, 2)}, "n", 1, (3, 2)),
        ({"n": (1.0, 2)}, "n", 1, (1.0, 2)),
        ({"n": (1, 2.0)}, "n", 1, (1, 2.0)),
        ({"T": (1, 3)}, "T", 2, (1, 3)),
        ({"d": (0, 3)}, "d", 1, (0, 3)),
    ],
)
def test_bad_size_ranges_are_refused_with_the_documented_message(
    kwargs: dict[str, Any], name: str, low: int, bad: tuple[Any, Any]
) -> None:
    expected = f"{name} must be a range (lo, hi) of integers with {low} ≤ lo ≤ hi; got {bad!r}"
    with pytest.raises(A.InvalidInstanceError) as err:
        draw_once(S.shapes(**kwargs))
    assert str(err.value) == expected


def test_feasible_instances_refuse_a_negative_extra_d() -> None:
    with pytest.raises(A.InvalidInstanceError) as err:
        draw_once(S.feasible_instances(extra_d=(-1, 0)))
    assert str(err.value) == "extra_d must be a range (lo, hi) of integers with 0 ≤ lo ≤ hi; got (-1, 0)"


# ---------------------------------------------------------------------------- scalar strategies
# These strategies are built inside the tests (not in @given at import time), so that the
# strategy under test is the one in force when the test runs.
@settings(FAST, max_examples=300)
@given(st.data())
def test_bounded_floats_default_to_finite_values_within_4(data: st.DataObject) -> None:
    x = data.draw(S.bounded_floats())
    assert isinstance(x, float) and math.isfinite(x)
    assert -4.0 <= x <= 4.0


def test_bounded_floats_exclude_subnormals() -> None:
    # Hypothesis finds a subnormal in [−4, 4] within a few hundred draws when they are allowed.
    assert not reachable(S.bounded_floats(), lambda x: 0.0 < abs(x) < TINY, max_examples=300)


@settings(FAST, max_examples=100)
@given(st.data())
def test_bounded_floats_respect_a_bound_below_one(data: st.DataObject) -> None:
    x = data.draw(S.bounded_floats(0.5))
    assert -0.5 <= x <= 0.5


def test_bounded_floats_reach_both_ends_and_no_further() -> None:
    assert simplest(S.bounded_floats(), lambda x: x >= 4.0) == 4.0
    assert simplest(S.bounded_floats(), lambda x: x <= -4.0) == -4.0
    assert simplest(S.bounded_floats(0.5), lambda x: x >= 0.5) == 0.5
    # Hypothesis tries the end points of a float range early, so a wider range would show here.
    assert not reachable(S.bounded_floats(), lambda x: abs(x) > 4.0, max_examples=100)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan])
def test_bounded_floats_refuse_a_bad_bound(bound: float) -> None:
    with pytest.raises(A.InvalidInstanceError) as err:
        S.bounded_floats(bound)
    assert str(err.value) == f"bound must be a positive finite number; got {bound!r}"


@settings(FAST, max_examples=200)
@given(st.data())
def test_seeds_are_valid_numpy_seeds(data: st.DataObject) -> None:
    seed = data.draw(S.seeds())
    assert 0 <= seed <= 2**32 - 1
    np.random.default_rng(seed)
    np.random.RandomState(seed)  # the legacy generator takes 32-bit seeds only


def test_seeds_shrink_to_zero_reach_the_top_and_stay_32_bit() -> None:
    assert simplest(S.seeds()) == 0
    assert simplest(S.seeds(), lambda s: s >= 2**32 - 1) == 2**32 - 1
    # Hypothesis tries the end points of an integer range early, so a larger range would show here.
    assert not reachable(S.seeds(), lambda s: s >= 2**32, max_examples=100)


# ---------------------------------------------------------------------------- Gaussian entries
_M64 = 2**64 - 1


def _splitmix64_finaliser(state: int) -> int:
    """SplitMix64's output for ``state`` (Steele, Lea, Flood 2014), in Python integers."""
    z = (state + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def test_reference_splitmix64_matches_the_published_sequence() -> None:
    # The first outputs of SplitMix64 seeded with 0 (states γ, 2γ, … before the finaliser's add).
    assert _splitmix64_finaliser(0) == 0xE220A8397B1DCDAF
    assert _splitmix64_finaliser(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def _gaussian_oracle(k: int) -> mpmath.mpf:
    """``Φ⁻¹(frac(½ + h(k)·2⁻⁶⁴))`` with ``h(k) = mix(k) ⊕ mix(0)``, exactly then in mpmath."""
    h = _splitmix64_finaliser(k) ^ _splitmix64_finaliser(0)
    u = (Fraction(1, 2) + Fraction(h, 2**64)) % 1
    with mpmath.workdps(MP_DPS):
        return mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.mpf(u.numerator) / u.denominator - 1)


def test_gaussian_arrays_shrink_to_the_documented_reference_array() -> None:
    shape = (4, 16)
    g = simplest(S.gaussian_arrays(shape))
    assert g.shape == shape and g.dtype == np.float64
    assert g.flat[0] == 0.0  # k = 0 gives exactly 0
    with mpmath.workdps(MP_DPS):
        for e, value in enumerate(g.ravel()):
            exact = _gaussian_oracle(e)  # the reference array has k_e = e (C order)
            # u is rounded to 53 bits (≤ 2^-52), Φ⁻¹ has slope 1/φ(g); ndtri itself is good to ~4 eps.
            phi = mpmath.npdf(exact)
            tol = 2.0**-52 / float(phi) + 4 * EPS * abs(float(exact))
            assert abs(float(value) - float(exact)) <= tol, (e, value, exact)


@settings(FAST)
@given(S.gaussian_arrays((3, 5), bound=1.5))
def test_gaussian_arrays_are_distinct_and_clipped(g: np.ndarray) -> None:
    assert g.shape == (3, 5)
    assert np.all(np.abs(g) <= 1.5)
    inner = g[np.abs(g) < 1.5]
    assert np.unique(inner).size == inner.size  # distinct k give distinct entries


# ---------------------------------------------------------------------------- instances
@settings(FAST)
@given(S.instances(n=(2, 3), T=(3, 4), d=(2, 3)))
def test_instances_sizes_lie_in_the_requested_ranges(inst: A.Instance) -> None:
    assert 2 <= inst.n <= 3 and 3 <= inst.T <= 4 and 2 <= inst.d <= 3


@settings(FAST)
@given(S.instances(shape=(2, 3, 4)))
def test_instances_take_a_fixed_shape(inst: A.Instance) -> None:
    assert inst.shape == (2, 3, 4)


@settings(FAST)
@given(S.instances(family="gaussian", attention="cross", bound=4.0))
def test_gaussian_instances_are_generic(inst: A.Instance) -> None:
    entries = np.concatenate([inst.X.ravel(), inst.z.ravel(), inst.v])
    assert np.all(np.abs(entries) <= 4.0)
    inner = entries[np.abs(entries) < 4.0]
    assert np.unique(inner).size == inner.size  # no two entries equal: no ties, no repeated tokens
    assert set(inst.Y.tolist()) <= {1.0, -1.0}


@settings(FAST)
@given(S.instances(family="unit"))
def test_unit_instances_have_unit_rows(inst: A.Instance) -> None:
    rows = [*inst.X.reshape(-1, inst.d), *inst.z, inst.v]
    for row in rows:
        assert abs(fsum_norm(row) - 1.0) <= UNIT_TOL


@settings(FAST)
@given(S.instances(family="unit", d=(2, 4)))
def test_unit_instances_stay_generic(inst: A.Instance) -> None:
    assert not has_repeated_token(inst)
    flat = inst.X.reshape(-1, inst.d)
    assert np.unique(flat, axis=0).shape[0] == flat.shape[0]


def test_unit_family_maps_a_zero_row_to_the_first_basis_vector() -> None:
    # The shrink target's first Gaussian entry is exactly 0; with d = 1 its row is the zero row.
    inst = simplest(S.instances(family="unit", shape=(1, 2, 1), attention="cross"))
    assert inst.X[0, 0, 0] == 1.0
    inst3 = simplest(S.instances(family="unit", shape=(1, 2, 3), attention="self"))
    assert inst3.X[0, 0, 0] == 0.0 and abs(fsum_norm(inst3.X[0, 0]) - 1.0) <= UNIT_TOL


@settings(FAST)
@given(S.instances(family="uniform", bound=2.5))
def test_uniform_instances_lie_within_the_bound(inst: A.Instance) -> None:
    for a in (inst.X, inst.z, inst.v):
        assert np.all(np.isfinite(a)) and np.all(np.abs(a) <= 2.5)


def test_uniform_instances_reach_zeros_the_bound_and_repeated_tokens() -> None:
    strat = S.instances(family="uniform", bound=2.5)
    assert reachable(strat, lambda i: bool(np.any(i.X == 0.0)))
    assert reachable(strat, lambda i: bool(np.any(np.abs(i.X) == 2.5)))
    assert reachable(strat, has_repeated_token)


@settings(FAST)
@given(S.instances(attention="self", family="unit"))
def test_self_attention_takes_the_first_token_as_query(inst: A.Instance) -> None:
    assert inst.self_attention
    assert np.array_equal(inst.z, inst.X[:, 0, :])


@settings(FAST)
@given(S.instances(attention="cross"))
def test_cross_attention_draws_queries(inst: A.Instance) -> None:
    assert not inst.self_attention


def test_either_reaches_both_attention_kinds() -> None:
    assert simplest(S.instances(attention="either"), lambda i: i.self_attention).self_attention
    assert not simplest(S.instances(attention="either"), lambda i: not i.self_attention).self_attention


def test_labels_take_both_signs() -> None:
    inst = simplest(S.instances(n=(2, 2)), lambda i: set(i.Y.tolist()) == {1.0, -1.0})
    assert sorted(inst.Y.tolist()) == [-1.0, 1.0]


def test_unknown_attention_and_family_are_refused_by_name() -> None:
    with pytest.raises(A.UnknownNameError) as err:
        draw_once(S.instances(attention="bogus"))
    assert str(err.value) == "unknown attention 'bogus'; expected one of 'self', 'cross', 'either'"
    with pytest.raises(A.UnknownNameError) as err:
        draw_once(S.feasible_instances(attention="Self"))
    assert str(err.value) == "unknown attention 'Self'; expected one of 'self', 'cross', 'either'"
    with pytest.raises(A.UnknownNameError) as err:
        draw_once(S.instances(family="bogus"))
    assert str(err.value) == "unknown instance family 'bogus'; expected one of 'gaussian', 'unit', 'uniform'"


# ---------------------------------------------------------------------------- hard cases: ties
def test_duplicates_copy_earlier_tokens_exactly() -> None:
    # T = 2: the only copy possible is token 1 ← token 0.
    inst = simplest(S.instances(duplicates=True, n=(1, 1), T=(2, 2), attention="cross"), has_repeated_token)
    assert np.array_equal(inst.X[0, 1], inst.X[0, 0])

    def third_copies_first_only(i: A.Instance) -> bool:
        return tokens_equal(i.X[0, 2], i.X[0, 0]) and not tokens_equal(i.X[0, 1], i.X[0, 0])

    assert reachable(
        S.instances(duplicates=True, n=(1, 1), T=(3, 3), attention="cross"), third_copies_first_only
    )


@settings(FAST)
@given(S.instances(duplicates=True, attention="self", family="gaussian"))
def test_duplicates_keep_self_attention_queries(inst: A.Instance) -> None:
    assert np.array_equal(inst.z, inst.X[:, 0, :])


def test_duplicates_shrink_to_no_tie() -> None:
    assert not has_repeated_token(simplest(S.instances(duplicates=True, attention="cross")))


def _near_parallel_partners(inst: A.Instance, i: int, t: int) -> list[tuple[int, int, Fraction]]:
    """Earlier tokens ``u`` that agree with token ``t`` in all but one coordinate ``k``: ``(u, k, δ)``."""
    out = []
    for u in range(t):
        diff = inst.X[i, t] != inst.X[i, u]
        if int(diff.sum()) == 1:
            k = int(np.flatnonzero(diff)[0])
            out.append((u, k, Fraction(float(inst.X[i, t, k])) - Fraction(float(inst.X[i, u, k]))))
    return out


@settings(FAST, max_examples=60)
@given(S.instances(near_parallel=True, family="gaussian", attention="cross", d=(2, 4), T=(2, 4)))
def test_near_parallel_pairs_sit_a_delta_in_the_documented_range_apart(inst: A.Instance) -> None:
    lo, hi = (10.0**e for e in S.NEAR_PARALLEL_LOG10)
    assert not has_repeated_token(inst)  # δ ≥ 1e-15 exceeds half an ulp of any |x| ≤ 4.1
    for i in range(inst.n):
        for t in range(1, inst.T):
            partners = _near_parallel_partners(inst, i, t)
            if not partners:
                continue  # a generic token (Gaussian entries are distinct)
            # x_it = fl(x_iu + δ): the stored difference is δ up to half an ulp of x_it.
            ok = [
                p
                for p in partners
                if Fraction(lo) * (1 - Fraction(2 * EPS)) - Fraction(math.ulp(float(inst.X[i, t, p[1]])))
                <= p[2]
                <= Fraction(hi) * (1 + Fraction(2 * EPS)) + Fraction(math.ulp(float(inst.X[i, t, p[1]])))
            ]
            assert ok, (i, t, partners)


def test_near_parallel_shrinks_to_delta_one_tenth_along_e0() -> None:
    strat = S.instances(near_parallel=True, family="gaussian", attention="cross", shape=(1, 2, 3))

    def close_pair(i: A.Instance) -> bool:
        return bool(np.max(np.abs(i.X[0, 1] - i.X[0, 0])) <= 0.2)

    inst = simplest(strat, close_pair)
    x0, x1 = inst.X[0, 0], inst.X[0, 1]
    assert x0[0] == 0.0  # the Gaussian reference array starts at 0
    assert x1[0] == 0.1 and np.array_equal(x1[1:], x0[1:])


def test_near_parallel_reaches_the_smallest_deltas() -> None:
    strat = S.instances(near_parallel=True, family="gaussian", attention="cross", shape=(1, 2, 2))

    def tiny_pair(i: A.Instance) -> bool:
        p = _near_parallel_partners(i, 0, 1)
        return bool(p) and 0 < p[0][2] <= Fraction(1e-13)

    assert reachable(strat, tiny_pair)


def test_near_parallel_works_in_one_dimension() -> None:
    inst = simplest(
        S.instances(near_parallel=True, family="gaussian", attention="cross", shape=(1, 2, 1)),
        lambda i: bool(abs(i.X[0, 1, 0] - i.X[0, 0, 0]) <= 0.2),
    )
    assert inst.X[0, 1, 0] == 0.1 and inst.X[0, 0, 0] == 0.0


# ---------------------------------------------------------------------------- feasible instances
def _certificate(inst: A.Instance, alpha: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """An explicit ``W`` for Att-SVM(α) (the docstring's argument) and its smallest margin
    ``min (x_iα − x_it)ᵀ W z_i``: ``u_i`` solves ``(x_iα − x_it)ᵀ u_i = 1``, then ``W z_i = u_i``."""
    n, T, d = inst.shape
    U = np.empty((n, d))
    for i, a in enumerate(alpha):
        D = np.array([inst.X[i, a] - inst.X[i, t] for t in range(T) if t != a])
        U[i] = np.linalg.lstsq(D, np.ones(T - 1), rcond=None)[0]
    Z = inst.z  # (n, d), full row rank: W = Uᵀ (Z Zᵀ)⁻¹ Z satisfies W z_i = u_i
    W = U.T @ np.linalg.solve(Z @ Z.T, Z)
    margins = [
        float((inst.X[i, a] - inst.X[i, t]) @ W @ inst.z[i])
        for i, a in enumerate(alpha)
        for t in range(T)
        if t != a
    ]
    return W, min(margins)


def _scores(inst: A.Instance) -> list[list[float]]:
    return [
        [
            float(inst.Y[i])
            * math.fsum(float(a) * float(b) for a, b in zip(inst.v, inst.X[i, t], strict=True))
            for t in range(inst.T)
        ]
        for i in range(inst.n)
    ]


@settings(FAST, max_examples=40)
@given(S.feasible_instances(n=(1, 3), T=(2, 4), extra_d=(0, 1), min_gap=0.1))
def test_feasible_instances_make_every_att_svm_feasible(inst: A.Instance) -> None:
    n, T, d = inst.shape
    base = n + T if inst.self_attention else T + 1
    assert base <= d <= base + 1
    for a in (inst.X, inst.z, inst.v):
        assert np.all(np.isfinite(a))
    # Queries independent, with every singular value ≥ ½ (query scales and radii lie in [½, 2]).
    assert np.linalg.svd(inst.z, compute_uv=False).min() >= SIGMA_MIN - SVD_TOL
    if not inst.self_attention:
        gram = inst.z @ inst.z.T
        assert np.all(np.abs(gram - np.diag(np.diag(gram))) <= SVD_TOL)  # orthogonal queries
        assert np.all((np.diag(gram) >= 0.25 - SVD_TOL) & (np.diag(gram) <= 4.0 + SVD_TOL))
    # Tokens affinely independent in every sequence, for every choice of α.
    for i in range(n):
        for a in range(T):
            D = np.array([inst.X[i, a] - inst.X[i, t] for t in range(T) if t != a])
            assert np.linalg.svd(D, compute_uv=False).min() >= SIGMA_MIN - SVD_TOL
    # An explicit feasible W for every α (the claim itself).
    for alpha in itertools.product(range(T), repeat=n):
        assert _certificate(inst, alpha)[1] >= 1.0 - 1e-9  # lstsq/solve residuals ~ 1e-13


def test_feasible_queries_are_randomly_oriented() -> None:
    # The basis is the Q of a Gaussian matrix with signs fixed (a random rotation): its law is
    # invariant under reflections, so a query coordinate takes both signs.
    strat = S.feasible_instances(attention="cross")
    assert reachable(strat, lambda i: bool(i.z[0, 0] > 0), max_examples=300)
    assert reachable(strat, lambda i: bool(i.z[0, 0] < 0), max_examples=300)


@settings(FAST, max_examples=40)
@given(S.feasible_instances(min_gap=0.3))
def test_feasible_instances_have_a_unique_optimum_with_the_gap(inst: A.Instance) -> None:
    scores = _scores(inst)
    opt = inst.optimal_tokens()
    for i, row in enumerate(scores):
        ranked = sorted(row, reverse=True)
        assert ranked[0] - ranked[1] >= 0.3 - SCORE_TOL
        assert row[int(opt[i])] == ranked[0]


@settings(FAST, max_examples=30)
@given(S.feasible_instances(equal_nonoptimal_scores=True, T=(3, 4)))
def test_equal_nonoptimal_scores_are_equal(inst: A.Instance) -> None:
    scores = _scores(inst)
    for row in scores:
        best = int(np.argmax(row))
        others = [s for t, s in enumerate(row) if t != best]
        assert max(others) - min(others) <= SCORE_TOL
        assert row[best] - max(others) >= 0.1 - SCORE_TOL


@settings(FAST, max_examples=3)
@given(S.feasible_instances(n=(2, 2), T=(3, 3)))
def test_feasible_instances_agree_with_the_exact_solver(inst: A.Instance) -> None:
    for alpha in itertools.product(range(3), repeat=2):
        W_cert, margin = _certificate(inst, alpha)
        assert margin >= 1.0 - 1e-9
        sol = A.solve_svm(inst, np.array(alpha))  # raises InfeasibleSVMError if infeasible
        # The solver's W is no larger than the certificate's (it is the minimum norm).
        assert np.linalg.norm(sol.W) <= np.linalg.norm(W_cert) * (1 + 1e-9)


@pytest.mark.parametrize("gap", [0.0, -1.0, math.inf, math.nan])
def test_feasible_instances_refuse_a_bad_min_gap(gap: float) -> None:
    with pytest.raises(A.InvalidInstanceError) as err:
        draw_once(S.feasible_instances(min_gap=gap))
    assert str(err.value) == f"min_gap must be a positive finite number; got {gap!r}"


@settings(FAST)
@given(S.instances_and_alphas())
def test_token_choices_index_the_tokens(pair: tuple[A.Instance, np.ndarray]) -> None:
    inst, alpha = pair
    assert alpha.shape == (inst.n,) and alpha.dtype == np.intp
    assert np.all((alpha >= 0) & (alpha < inst.T))


# ---------------------------------------------------------------------------- weights
@settings(FAST)
@given(st.integers(1, 5).flatmap(lambda d: st.tuples(st.just(d), S.directions(d))))
def test_directions_have_unit_frobenius_norm(pair: tuple[int, np.ndarray]) -> None:
    d, U = pair
    assert U.shape == (d, d)
    assert abs(fsum_norm(U) - 1.0) <= UNIT_TOL * d


@settings(FAST)
@given(S.weight_matrices(3, scale=(1e-2, 1e3)))
def test_weight_matrices_norms_lie_in_the_scale_range(W: np.ndarray) -> None:
    norm = fsum_norm(W)
    assert 1e-2 * (1 - 1e-12) <= norm <= 1e3 * (1 + 1e-12)


def test_weight_matrices_with_a_single_scale_have_that_norm() -> None:
    W = draw_once(S.weight_matrices(4, scale=(3.0, 3.0)))
    assert abs(fsum_norm(W) - 3.0) <= 3.0 * 1e-12


@pytest.mark.parametrize("scale", [(0.0, 1.0), (2.0, 1.0), (1.0, math.inf)])
def test_weight_matrices_refuse_a_bad_scale(scale: tuple[float, float]) -> None:
    with pytest.raises(A.InvalidInstanceError) as err:
        draw_once(S.weight_matrices(2, scale=scale))
    assert str(err.value) == f"scale must be a range (lo, hi) with 0 < lo ≤ hi < inf; got {scale!r}"


def _mp_log_runner_up(inst: A.Instance, W: np.ndarray) -> mpmath.mpf:
    """mpmath: in the sequence whose two largest logits are furthest apart, log of the largest
    non-top softmax weight (logits from exact products of the float64 entries)."""
    with mpmath.workdps(MP_DPS):
        best = None
        for i in range(inst.n):
            logits = [
                mpmath.fsum(
                    mpmath.mpf(float(inst.X[i, t, k]))
                    * mpmath.mpf(float(W[k, j]))
                    * mpmath.mpf(float(inst.z[i, j]))
                    for k in range(inst.d)
                    for j in range(inst.d)
                )
                for t in range(inst.T)
            ]
            ranked = sorted(logits, reverse=True)
            gap = ranked[0] - ranked[1]
            if best is None or gap > best[0]:
                lse = mpmath.log(mpmath.fsum(mpmath.exp(x) for x in logits))
                best = (gap, ranked[1] - lse)
        assert best is not None
        return best[1]


def _logit_magnitude(inst: A.Instance, W: np.ndarray) -> float:
    return float(np.max(np.einsum("ntk,kj,nj->nt", np.abs(inst.X), np.abs(W), np.abs(inst.z))))


def test_log_runner_up_weight_matches_an_mpmath_softmax() -> None:
    # d = 1, z = 1, W = c: the logits are c·x. Sequence 1 has the larger top-two gap (1.5 vs 1);
    # sequence 0 has the larger top-two sum and the larger gap between first and third.
    X = np.array([[[3.0], [2.0], [-5.0]], [[1.0], [-1.0], [-0.5]]])
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([1.0]), np.array([[1.0], [1.0]]))
    for c in (1.0, 0.25, 1000.0):
        W = np.array([[c]])
        got = S.log_runner_up_weight(inst, W)
        with mpmath.workdps(MP_DPS):
            want = c * mpmath.mpf(-0.5) - mpmath.log(
                mpmath.exp(c * 1) + mpmath.exp(c * mpmath.mpf(-0.5)) + mpmath.exp(-c)
            )
            assert abs(got - float(want)) <= 4 * EPS * (1 + 3 * c)
            assert abs(float(want - _mp_log_runner_up(inst, W))) <= 1e-30


@settings(FAST, max_examples=25)
@given(st.data())
def test_log_runner_up_weight_matches_mpmath_on_drawn_instances(data: st.DataObject) -> None:
    inst = data.draw(S.instances(attention="either", T=(2, 4)))
    W = data.draw(S.weight_matrices(inst.d, scale=(1e-1, 1e2)))
    got = S.log_runner_up_weight(inst, W)
    want = _mp_log_runner_up(inst, W)
    # logits to d² eps · Σ|x W z|; log-sum-exp is 1-Lipschitz in the max norm; the top-gap argmax is
    # unaffected unless two gaps tie to rounding (then either sequence is a valid answer).
    tol = 4 * inst.d**2 * EPS * _logit_magnitude(inst, W) + 1e-12
    if abs(got - float(want)) > tol:
        pytest.skip("two sequences' top-two gaps tie to rounding")  # pragma: no cover
    assert abs(got - float(want)) <= tol


def _reached_within(inst: A.Instance, W: np.ndarray, llo: float, lhi: float) -> None:
    rho = _mp_log_runner_up(inst, W)
    # bisection to 1e-9·|log ρ| (documented), then the rounding of W = c·U (eps per entry, so
    # ≤ eps·Σ|x W z| per logit and 2 eps·Σ|x W z| in log ρ) and of the logits.
    tol = 1e-9 * max(abs(llo), abs(lhi)) + 8 * EPS * _logit_magnitude(inst, W)
    assert llo - tol <= float(rho) <= lhi + tol, (float(rho), llo, lhi)


@settings(FAST, max_examples=25)
@given(st.data())
def test_saturated_weights_reach_the_requested_runner_up_weight(data: st.DataObject) -> None:
    inst = data.draw(S.instances(attention="cross", family="gaussian", T=(3, 4)))
    W = data.draw(S.saturated_weights(inst, runner_up=(1e-300, 1e-1)))
    assert W.shape == (inst.d, inst.d)
    _reached_within(inst, W, math.log(1e-300), math.log(1e-1))


@settings(FAST, max_examples=25)
@given(st.data())
def test_saturated_weights_reach_weights_below_the_float64_range(data: st.DataObject) -> None:
    inst = data.draw(S.instances(attention="cross", family="gaussian", T=(2, 3), d=(1, 3)))
    W = data.draw(S.saturated_weights(inst, log_runner_up=(-1e5, -2.0)))
    _reached_within(inst, W, -1e5, -2.0)


def test_saturated_weights_take_a_degenerate_log_range() -> None:
    inst = draw_once(S.instances(attention="cross", shape=(2, 3, 2)))
    W = draw_once(S.saturated_weights(inst, log_runner_up=(-3.0, -3.0)))
    _reached_within(inst, W, -3.0, -3.0)


def test_saturated_weights_shrink_to_the_moderate_end() -> None:
    inst = draw_once(S.instances(attention="cross", shape=(2, 3, 2)))
    W = simplest(S.saturated_weights(inst, runner_up=(1e-300, 1e-1)))
    _reached_within(inst, W, math.log(1e-1), math.log(1e-1))


def test_instances_and_weights_passes_the_runner_up_options() -> None:
    inst, W = simplest(S.instances_and_weights(S.instances(attention="cross"), log_runner_up=(-50.0, -50.0)))
    _reached_within(inst, W, -50.0, -50.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give exactly one of runner_up=(lo, hi) and log_runner_up=(lo, hi)"),
        (
            {"runner_up": (1e-3, 1e-2), "log_runner_up": (-3.0, -2.0)},
            "give exactly one of runner_up=(lo, hi) and log_runner_up=(lo, hi)",
        ),
        (
            {"runner_up": (0.0, 0.1)},
            "runner_up must be a range (lo, hi) with 0 < lo ≤ hi < ½; got (0.0, 0.1)",
        ),
        (
            {"runner_up": (0.2, 0.1)},
            "runner_up must be a range (lo, hi) with 0 < lo ≤ hi < ½; got (0.2, 0.1)",
        ),
        (
            {"runner_up": (0.1, 0.5)},
            "runner_up must be a range (lo, hi) with 0 < lo ≤ hi < ½; got (0.1, 0.5)",
        ),
    ]
    + [
        (
            {"log_runner_up": bad},
            "log_runner_up must be a range (lo, hi) with lo ≤ hi < -0.693147 (a runner-up weight is below ½)",
        )
        for bad in [(-math.inf, -2.0), (-3.0, math.nan), (-1.0, -2.0), (-2.0, math.log(0.5)), (-2.0, 0.0)]
    ],
)
def test_saturated_weights_refuse_bad_ranges(kwargs: dict[str, Any], message: str) -> None:
    inst = A.random_instance(2, 3, 2, seed=0)
    with pytest.raises(A.InvalidInstanceError) as err:
        draw_once(S.saturated_weights(inst, **kwargs))
    assert str(err.value) == message


# ---------------------------------------------------------------------------- scale helpers
def test_scaled_with_default_exponents_is_the_identity() -> None:
    inst = A.random_instance(2, 3, 2, seed=3)
    out = S.scaled(inst)
    for a, b in ((out.X, inst.X), (out.z, inst.z), (out.v, inst.v), (out.Y, inst.Y)):
        assert np.array_equal(a, b)


def test_exponent_range_skips_all_zero_arrays_among_several() -> None:
    assert S.exponent_range(np.zeros(2), np.array([1.0])) == S.exponent_range(np.array([1.0]))
    assert S.exponent_range(np.array([1.0]), np.zeros(2)) == (-1022, 1023)


def test_exponent_range_contains_zero_for_subnormal_or_oversized_data() -> None:
    # A subnormal entry cannot be scaled down and stay normal: lo is clipped to 0, not above it.
    assert S.exponent_range(np.array([5e-324]))[0] == 0
    # The largest double with 10 bits of headroom: hi is clipped to 0, not below it.
    assert S.exponent_range(np.array([MAX]), headroom_bits=10)[1] == 0
