"""Instance validation, scores, optimal tokens and random families."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import (
    AttnSVMError,
    InvalidInstanceError,
    NumericalError,
    TiedScoresError,
    UnknownNameError,
)
from attnsvm.model._instance import TIE_RTOL


def _data(n=3, T=4, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, T, d)), np.array([1.0, -1.0, 1.0][:n]), rng.standard_normal(d)


def test_error_hierarchy():
    for cls in (InvalidInstanceError, TiedScoresError, UnknownNameError, A.InfeasibleSVMError):
        assert issubclass(cls, AttnSVMError)
    assert issubclass(AttnSVMError, ValueError)


def test_stores_read_only_float64_copies():
    X, Y, v = _data()
    z = np.ones((3, 5), dtype=np.int64)
    inst = A.Instance(X, Y, v, z)
    for arr in (inst.X, inst.Y, inst.v, inst.z):
        assert arr.dtype == np.float64
        assert not arr.flags.writeable
    assert inst.X is not X and np.array_equal(inst.X, X)
    X[0, 0, 0] = 123.0  # the caller's array stays the caller's
    assert inst.X[0, 0, 0] != 123.0
    with pytest.raises(ValueError):
        inst.X[0, 0, 0] = 1.0


def test_default_query_is_first_token():
    X, Y, v = _data()
    inst = A.Instance(X, Y, v)
    assert inst.self_attention
    np.testing.assert_array_equal(inst.z, X[:, 0, :])
    assert not A.Instance(X, Y, v, X[:, 1, :]).self_attention
    assert (inst.n, inst.T, inst.d) == (3, 4, 5) and inst.shape == (3, 4, 5)
    assert "self-attention" in repr(inst)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("X", np.zeros((3, 4)), "X must have 3 dimension"),
        ("X", np.zeros((0, 4, 5)), "n ≥ 1"),
        ("X", np.zeros((3, 1, 5)), "T ≥ 2"),
        ("X", np.zeros((3, 4, 0)), "d ≥ 1"),
        ("X", np.full((3, 4, 5), 1j), "complex"),
        ("X", np.array([[["a"]]]), "real numbers"),
        ("X", np.zeros((3, 4, 5), dtype=bool), "real numbers"),
        ("X", [[[1.0, 2.0], [3.0]]], "could not convert"),
        ("Y", np.array([1.0, -1.0]), r"Y must have shape \(n,\) = \(3,\)"),
        ("Y", np.array([1.0, 0.0, 1.0]), r"Y\[1\] = 0.0.*2\*y - 1"),
        ("Y", np.array([[1.0, -1.0, 1.0]]), "Y must have 1 dimension"),
        ("v", np.zeros(4), r"v must have shape \(d,\) = \(5,\)"),
        ("z", np.zeros((3, 4)), r"z must have shape \(n, d\) = \(3, 5\)"),
        ("z", np.zeros(5), "z must have 2 dimension"),
    ],
)
def test_bad_input_names_argument(field, value, match):
    X, Y, v = _data()
    args = {"X": X, "Y": Y, "v": v, "z": None}
    args[field] = value
    with pytest.raises(InvalidInstanceError, match=match):
        A.Instance(**args)


@pytest.mark.parametrize("field", ["X", "Y", "v", "z"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected_with_location(field, bad):
    X, Y, v = _data()
    args = {"X": X.copy(), "Y": Y.copy(), "v": v.copy(), "z": X[:, 0, :].copy()}
    arr = args[field]
    arr.flat[arr.size - 1] = bad
    with pytest.raises(InvalidInstanceError, match=rf"{field} must be finite.*at index"):
        A.Instance(**args)


def test_scores_and_optimal_tokens_match_definition():
    X, Y, v = _data(seed=3)
    inst = A.Instance(X, Y, v)
    gamma = np.array([[Y[i] * v @ X[i, t] for t in range(4)] for i in range(3)])
    np.testing.assert_allclose(inst.scores(), gamma, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(inst.optimal_tokens(), np.argmax(gamma, axis=1))


def test_tie_for_best_score_names_the_sequence():
    X, Y, v = _data(seed=4)
    gamma = Y[:, None] * (X @ v)
    best = int(np.argmax(gamma[2]))
    other = (best + 1) % 4
    X[2, other] = X[2, best]  # duplicate the best token of sequence 2
    inst = A.Instance(X, Y, v)
    with pytest.raises(TiedScoresError, match=r"sequence 2 .*tokens \[.*\]"):
        inst.optimal_tokens()


def test_check_alpha_and_weights():
    inst = A.random_instance(3, 4, 5, seed=0)
    np.testing.assert_array_equal(inst.check_alpha(None), inst.optimal_tokens())
    np.testing.assert_array_equal(inst.check_alpha([0, 3, 1]), [0, 3, 1])
    np.testing.assert_array_equal(inst.check_alpha(np.array([0.0, 3.0, 1.0])), [0, 3, 1])
    with pytest.raises(InvalidInstanceError, match=r"alpha\[1\] = 4 is out of range"):
        inst.check_alpha([0, 4, 1])
    with pytest.raises(InvalidInstanceError, match="out of range"):
        inst.check_alpha([0, -1, 1])
    with pytest.raises(InvalidInstanceError, match=r"shape \(n,\) = \(3,\)"):
        inst.check_alpha([0, 1])
    with pytest.raises(InvalidInstanceError, match="integer token indices"):
        inst.check_alpha([0.5, 1, 1])
    with pytest.raises(InvalidInstanceError, match=r"W must have shape \(d, d\) = \(5, 5\)"):
        inst.check_weights(np.zeros((5, 4)))
    with pytest.raises(InvalidInstanceError, match="W must be finite"):
        inst.check_weights(np.full((5, 5), np.nan))


def test_random_families():
    g = A.random_instance(3, 4, 6, seed=5, family="gaussian")
    assert not g.self_attention
    u = A.random_instance(3, 4, 6, seed=5, family="unit")
    unit_tol = 4 * np.finfo(float).eps  # one division by a norm: a few ulps
    np.testing.assert_allclose(np.linalg.norm(u.X, axis=-1), 1.0, atol=unit_tol)
    np.testing.assert_allclose(np.linalg.norm(u.z, axis=-1), 1.0, atol=unit_tol)
    assert abs(np.linalg.norm(u.v) - 1.0) <= unit_tol
    # unit is the gaussian draw, normalised: same directions
    np.testing.assert_allclose(u.X, g.X / np.linalg.norm(g.X, axis=-1, keepdims=True), atol=unit_tol)
    s = A.random_instance(3, 4, 6, seed=5, family="self_attention")
    assert s.self_attention and np.array_equal(s.z, s.X[:, 0, :])
    assert set(np.unique(g.Y)) <= {-1.0, 1.0}
    # determinism: same seed, same draw; different seed, different draw
    assert np.array_equal(A.random_instance(3, 4, 6, seed=5).X, g.X)
    assert not np.array_equal(A.random_instance(3, 4, 6, seed=6).X, g.X)


def test_random_instance_bad_arguments():
    with pytest.raises(UnknownNameError, match="'gaussian', 'unit', 'self_attention'"):
        A.random_instance(2, 3, 4, family="cauchy")
    with pytest.raises(InvalidInstanceError, match="T must be an integer ≥ 2"):
        A.random_instance(2, 1, 4)
    with pytest.raises(InvalidInstanceError, match="n must be an integer ≥ 1"):
        A.random_instance(0, 3, 4)
    with pytest.raises(InvalidInstanceError, match="d must be an integer"):
        A.random_instance(2, 3, 2.5)


def test_import_does_not_load_torch():
    """``import attnsvm`` (and the CLI's start-up) stays free of torch's ~1 s import: the torch
    engines (batched GD, Lipschitz estimates, benchmarks) import it when first called."""
    import subprocess
    import sys

    code = "import sys, attnsvm, attnsvm.harness.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_repr_states_sizes_and_query_kind_exactly():
    """The repr is documented output: sizes and which query the instance uses, word for word."""
    X, Y, v = _data()
    assert repr(A.Instance(X, Y, v)) == "Instance(n=3, T=4, d=5, self-attention (z = first token))"
    assert repr(A.Instance(X, Y, v, X[:, 1, :])) == "Instance(n=3, T=4, d=5, cross-attention (z given))"


def test_overflowing_token_value_message_names_its_size():
    """v·x_01 = 4·2^1023 = 2^1025 (hand-derived): the message gives its decimal exponent,
    round(1025·log10 2) = 309, not the size of the other, finite value (v·x_00 = 4)."""
    inst = A.Instance(np.array([[[1.0], [2.0**1023]]]), np.array([1.0]), np.array([4.0]), np.ones((1, 1)))
    expected_exp = round(1025 * math.log10(2.0))
    assert expected_exp == 309
    with pytest.raises(NumericalError) as info:
        inst.values()
    assert str(info.value) == (
        f"the token values vᵀx_it is about 1e+{expected_exp}: it overflows float64's normal range "
        "[2.2e-308, 1.8e308]"
    )


def test_token_values_below_the_range_are_refused_with_the_first_ones_size():
    """v = 2^-600, tokens 2^-600, 2^-700, 0 (hand-derived): the values 2^-1200 and 2^-1300 are not
    doubles; the message names the first, round(-1200·log10 2) = -361; the zero value is no reason."""
    X = np.array([[[2.0**-600], [2.0**-700], [0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([2.0**-600]), np.ones((1, 1)))
    expected_exp = round(-1200 * math.log10(2.0))
    assert expected_exp == -361
    # The refusal is the library's, whatever the caller's floating-point error state.
    with pytest.raises(NumericalError) as info, np.errstate(all="raise"):
        inst.values()
    assert str(info.value) == (
        "the token values vᵀx_it (the size Σ_k|v_k x_itk| of a nonzero one) is about "
        f"1e{expected_exp}: it underflows float64's normal range [2.2e-308, 1.8e308]. "
        "Scale v or X up (optimal_tokens does not need the values themselves)"
    )


def test_smallest_normal_token_value_and_an_exact_zero_are_returned():
    """2^-511·2^-511 = 2^-1022 is the smallest normal double (returned exactly), and a zero token
    has the exact value 0 (neither is below the range)."""
    X = np.array([[[2.0**-511], [0.0]]])
    inst = A.Instance(X, np.array([-1.0]), np.array([2.0**-511]), np.ones((1, 1)))
    np.testing.assert_array_equal(inst.values(), [[2.0**-1022, 0.0]])
    np.testing.assert_array_equal(inst.scores(), [[-(2.0**-1022), 0.0]])


TIE_MESSAGE_TAIL = (
    "score within the rounding level 1.42e-14·Σ_k|v_k x_itk| of each other; the optimal token is "
    "undefined. Pass an explicit alpha, or perturb the data."
)


def test_scores_exactly_one_tolerance_apart_are_a_tie():
    """Scores 1 and 1 − 2^-46 (v = 1, d = 1): their gap equals TIE_RTOL·max_t|v x_t| = 64·eps·1 exactly,
    which is "within the rounding level"; both tokens are named."""
    assert TIE_RTOL == 2.0**-46
    X = np.array([[[1.0], [1.0 - 2.0**-46]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0]), np.ones((1, 1)))
    with pytest.raises(TiedScoresError) as info:
        inst.optimal_tokens()
    assert (
        str(info.value) == "sequence 0 has a tie for the best token score: tokens [0, 1] " + TIE_MESSAGE_TAIL
    )


def test_tie_message_lists_exactly_the_tied_tokens():
    """Sequence 1 has tokens 0 and 2 equal and best, token 1 and 3 lower: exactly [0, 2] are named."""
    X = np.array([[[3.0], [1.0], [2.0], [0.0]], [[2.0], [1.0], [2.0], [-1.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1.0]), np.ones((2, 1)))
    with pytest.raises(TiedScoresError) as info:
        inst.optimal_tokens()
    assert (
        str(info.value) == "sequence 1 has a tie for the best token score: tokens [0, 2] " + TIE_MESSAGE_TAIL
    )


def test_tie_tolerance_is_relative_to_the_scores_not_absolute():
    """v = (2^-40, 1), tokens (1, 0) and (0, 0): scores 2^-40 and 0 differ by all of their size
    (Σ_k|v_k x_tk| = 2^-40), far beyond 64·eps of it: token 0 is optimal, no tie."""
    X = np.array([[[1.0, 0.0], [0.0, 0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([2.0**-40, 1.0]), np.ones((1, 2)))
    np.testing.assert_array_equal(inst.optimal_tokens(), [0])


def test_random_instance_default_seed_is_zero():
    """The documented default ``seed=0``: the default draw is the seed-0 draw."""
    a, b = A.random_instance(2, 3, 4), A.random_instance(2, 3, 4, seed=0)
    for x, y in ((a.X, b.X), (a.Y, b.Y), (a.v, b.v), (a.z, b.z)):
        np.testing.assert_array_equal(x, y)


def test_unknown_family_message_is_exact():
    """The refusal names the argument, echoes the value and lists the families (unknown_name's format)."""
    with pytest.raises(UnknownNameError) as info:
        A.random_instance(2, 3, 4, family="cauchy")
    assert str(info.value) == (
        "unknown instance family 'cauchy'; expected one of 'gaussian', 'unit', 'self_attention'"
    )


def test_random_labels_are_fair_signs():
    """Y_i = ±1 with probability ½ each: over n = 4000 draws the count of +1 is Binomial(4000, ½),
    mean 2000, sd ≈ 31.6; 6 sd (190) bounds it for every seed but with probability < 1e-8."""
    for family in A.FAMILIES:
        Y = A.random_instance(4000, 2, 1, seed=11, family=family).Y
        assert set(np.unique(Y)) == {-1.0, 1.0}
        assert abs(int(np.sum(Y > 0)) - 2000) <= 190


def test_check_alpha_returns_read_only_intp_and_states_the_range_exactly():
    """Token indices come back as a read-only intp array (from ints or integral floats), and an
    index out of range is named with the valid range [0, T − 1] (T = 4 here: [0, 3])."""
    inst = A.random_instance(3, 4, 5, seed=0)
    for alpha in ([0, 3, 1], np.array([0.0, 3.0, 1.0]), np.array([0, 3, 1], dtype=np.int8)):
        out = inst.check_alpha(alpha)
        assert out.dtype == np.intp and not out.flags.writeable
        np.testing.assert_array_equal(out, [0, 3, 1])
    with pytest.raises(InvalidInstanceError) as info:
        inst.check_alpha([0, 4, 1])
    assert str(info.value) == "alpha[1] = 4 is out of range; token indices must lie in [0, 3]"


def test_split_rows_scales_each_row_by_its_own_power_of_two():
    """Hand-derived: row (3, 1) has largest entry 3 = 0.75·2^2, so it becomes (0.75, 0.25) with e = 2;
    the zero row keeps e = 0. The default is one leading axis (per row), the result float64 even
    for small integer input, and an empty block counts as all-zero."""
    from attnsvm.model._instance import split_rows

    a = np.array([[3, 1], [0, 0], [-1, 0]], dtype=np.int8)
    scaled, e = split_rows(a)
    assert scaled.dtype == np.float64
    np.testing.assert_array_equal(scaled, [[0.75, 0.25], [0.0, 0.0], [-0.5, 0.0]])
    np.testing.assert_array_equal(e, [2, 0, 1])
    # lead = ndim: every entry is its own block (3 = 0.75·2^2, −0.5 = −0.5·2^0, 0 keeps e = 0).
    each, e_each = split_rows(np.array([3.0, -0.5, 0.0]), 1)
    np.testing.assert_array_equal(each, [0.75, -0.5, 0.0])
    np.testing.assert_array_equal(e_each, [2, 0, 0])
    empty, e_empty = split_rows(np.zeros((3, 0)), 1)
    assert empty.shape == (3, 0)
    np.testing.assert_array_equal(e_empty, [0, 0, 0])


def test_weights_of_wrong_rank_are_refused_for_their_rank():
    """A flat W (25 entries for d = 5) is refused for its rank, before any shape comparison."""
    inst = A.random_instance(3, 4, 5, seed=0)
    with pytest.raises(InvalidInstanceError) as info:
        inst.check_weights(np.zeros(25))
    assert str(info.value) == "W must have 2 dimension(s); got shape (25,)"


def test_refused_dtype_messages_are_exact_and_only_complex_data_gets_the_complex_note():
    """The documented refusal, word for word: complex data is told that complex values are not
    supported; other non-real dtypes (bool) get the plain message, with nothing appended."""
    head = "X must hold real numbers (int or float); got dtype "
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(np.full((1, 2, 1), 1j), [1.0], [1.0])
    assert str(info.value) == head + "complex128 (complex values are not supported)"
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(np.zeros((1, 2, 1), dtype=bool), [1.0], [1.0])
    assert str(info.value) == head + "bool"


@pytest.mark.parametrize("field", ["X", "v"])
def test_non_finite_message_names_the_argument_value_index_and_fix_exactly(field):
    """The documented message for a NaN, word for word: the argument's own name, the bad value, its
    index (hand-placed at the last entry) and the remedy."""
    args = {"X": np.zeros((1, 2, 2)), "Y": np.ones(1), "v": np.ones(2)}
    args[field] = args[field].copy()
    args[field].flat[-1] = np.nan
    index = "(0, 1, 1)" if field == "X" else "(1,)"
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(**args)
    assert str(info.value) == (
        f"{field} must be finite; found nan at index {index}. Remove or impute NaN/Inf entries first."
    )


@pytest.mark.parametrize(
    "shape, message",
    [
        ((0, 2, 3), "X must hold at least one sequence (n ≥ 1); got n = 0"),
        ((2, 2, 0), "X must have token dimension d ≥ 1; got d = 0"),
        (
            (2, 1, 3),
            "X must hold at least two tokens per sequence (T ≥ 2) for attention to select one; got T = 1",
        ),
    ],
)
def test_empty_axis_messages_are_exact(shape, message):
    """An empty axis of X is refused with the documented sentence, naming X (capital, as the user
    passed it) and the size required."""
    n, _, d = shape
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(np.zeros(shape), np.ones(n), np.ones(d))
    assert str(info.value) == message


def test_value_head_of_wrong_rank_is_refused_for_its_rank():
    """v must be 1-D: a (1, d) row is refused for its rank (as W and alpha are), not compared as a shape."""
    X, Y, _ = _data()
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(X, Y, np.ones((1, 5)))
    assert str(info.value) == "v must have 1 dimension(s); got shape (1, 5)"
    with pytest.raises(InvalidInstanceError) as info:
        A.Instance(X, Y, np.float64(1.0))
    assert str(info.value) == "v must have 1 dimension(s); got shape ()"


def test_default_query_is_a_read_only_copy_of_its_own():
    """The module's promise "stored as read-only float64 copies" for the query taken from the first
    token: its own contiguous memory (not a view of X), and not writable."""
    X, Y, v = _data()
    inst = A.Instance(X, Y, v)
    assert not np.shares_memory(inst.z, inst.X)
    assert inst.z.flags.c_contiguous and inst.z.flags.owndata
    assert not inst.z.flags.writeable
    with pytest.raises(ValueError):
        inst.z[0, 0] = 1.0
    np.testing.assert_array_equal(inst.z, X[:, 0, :])


def test_self_attention_flag_is_a_bool():
    """``self_attention`` is documented as True/False (a bool), for both kinds of query."""
    X, Y, v = _data()
    assert A.Instance(X, Y, v).self_attention is True
    assert A.Instance(X, Y, v, X[:, 1, :]).self_attention is False


def test_subnormal_token_value_after_a_normal_one_is_refused_with_its_own_size():
    """Hand-derived: v = 1, tokens 1 and 2^-1030 (n = 1): the second value 2^-1030 is subnormal, so it
    is refused, and the message gives its size round(-1030·log10 2) = -310 (the offending token is
    token 1 of sequence 0: its sequence's exponent, not another index's, scales the size)."""
    inst = A.Instance(np.array([[[1.0], [2.0**-1030]]]), np.array([1.0]), np.array([1.0]), np.ones((1, 1)))
    expected_exp = round(-1030 * math.log10(2.0))
    assert expected_exp == -310
    with pytest.raises(NumericalError) as info:
        inst.values()
    assert str(info.value) == (
        "the token values vᵀx_it (the size Σ_k|v_k x_itk| of a nonzero one) is about "
        f"1e{expected_exp}: it underflows float64's normal range [2.2e-308, 1.8e308]. "
        "Scale v or X up (optimal_tokens does not need the values themselves)"
    )


def test_exact_tie_of_subnormal_scores_is_a_tie_at_every_scale():
    """Oracle: exact rational arithmetic (fractions.Fraction) of γ_t = Y vᵀx_t. v = (0, 1, 1); tokens
    (1, 6u, 0), (1, 5u, u), (1, −2^-1027, 0) with u = 2^-1074: γ = 6u, 6u, −2^-1027, so the two best
    scores tie exactly and the optimal token is undefined (TiedScoresError). In the rescaled data
    (X/2, v/2) the subnormal entries and products round (5u/2 → 2u, u/2 → 0, 3u/2 → 2u), so the computed
    scores differ by one subnormal unit 2^-1074 and the tie is caught at the rounding level. Scaling X
    and v by exact powers of two 2^k (k ≥ 0 keeps every entry exact) must not change the answer."""
    from fractions import Fraction

    u = 2.0**-1074
    X = np.array([[[1.0, 6 * u, 0.0], [1.0, 5 * u, u], [1.0, -(2.0**-1027), 0.0]]])
    v = np.array([0.0, 1.0, 1.0])
    gamma = [sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(x, v, strict=True)) for x in X[0]]
    best = sorted(gamma)[-2:]
    assert best[0] == best[1] == 6 * Fraction(u)
    for kx, kv in ((0, 0), (600, 0), (0, 1000), (1000, -500)):
        inst = A.Instance(np.ldexp(X, kx), np.array([1.0]), np.ldexp(v, kv), np.ones((1, 3)))
        with pytest.raises(TiedScoresError, match=r"sequence 0 .*tokens \[0, 1\]"):
            inst.optimal_tokens()


def test_exact_tie_of_subnormal_scores_next_to_a_tiny_normal_entry_is_a_tie() -> None:
    """Regression: the allowance for underflowed products sat inside ``TIE_RTOL·level`` and was rounded
    away, so an exact tie was returned as a winner. Oracle, exact (Fraction): with u = 2^-1074 the scores
    of tokens 0 and 1 are 6u and 5u + u = 6u, a tie; token 2 scores −2^-1028·1 < 0."""
    u = Fraction(2) ** -1074
    scores = [6 * u, 5 * u + u, -(Fraction(2) ** -1028)]
    assert scores[0] == scores[1] > scores[2]
    t = 2.0**-1074
    X = np.array([[[1.0, 6 * t, 0.0], [1.0, 5 * t, t], [1.0, -(2.0**-1028), 0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([0.0, 1.0, 1.0]), np.ones((1, 3)))
    with pytest.raises(TiedScoresError, match=r"tokens \[0, 1\]"):
        inst.optimal_tokens()
