"""Tensor trick: vec conventions, Att-SVM rows, factorised Gram, margins."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, NumericalError
from attnsvm.model._tensor import svm_margins

#: products of O(1) entries summed over ≤ 64 terms: absolute error ≤ 64·eps·Σ|terms| ≈ 1e-13.
SUM_ATOL = 1e-12
#: float64 unit roundoff ×2 (machine epsilon), the factor of svm_margins' documented error bound.
EPS = float(np.finfo(np.float64).eps)
#: The tail every scale-contract refusal message ends its size clause with (scaling.range_error).
RANGE_TAIL = "float64's normal range [2.2e-308, 1.8e308]"
#: The remedy svm_rows / svm_gram / the row check give when data are too small.
SCALE_UP = "Scale X or z up (the Att-SVM solution scales as W_mm(cX, cz) = W_mm(X, z)/c²)"


def _decimal_exponent(value: Fraction) -> int:
    """round(log10 |value|) of an exact rational, at 50 digits (mpmath): the k of a message's "1e{k:+}"."""
    with mpmath.workdps(50):
        return int(mpmath.nint(mpmath.log10(abs(mpmath.mpf(value.numerator) / value.denominator))))


def _one_sequence(X: list[list[float]], z: list[float]) -> A.Instance:
    """n = 1 instance with tokens X (T × d), query z, label 1 and value vector of ones."""
    Xa = np.array([X], dtype=np.float64)
    return A.Instance(Xa, np.array([1.0]), np.ones(Xa.shape[2]), np.array([z], dtype=np.float64))


def test_vec_is_column_major():
    M = np.arange(6.0).reshape(2, 3)  # [[0,1,2],[3,4,5]]
    np.testing.assert_array_equal(A.vec(M), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
    np.testing.assert_array_equal(A.vec_rowmajor(M), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(A.unvec(A.vec(M), (2, 3)), M)
    np.testing.assert_array_equal(A.unvec_rowmajor(A.vec_rowmajor(M), (2, 3)), M)
    with pytest.raises(InvalidInstanceError, match="shape \\(2, 2\\) needs 4"):
        A.unvec(np.zeros(5), (2, 2))


def test_kronecker_identities():
    rng = np.random.default_rng(0)
    Am, M, B = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    np.testing.assert_allclose(A.vec(Am @ M @ B), np.kron(B.T, Am) @ A.vec(M), atol=SUM_ATOL)
    A1, Xm, A2 = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((2, 5))
    np.testing.assert_allclose(
        A.vec_rowmajor(A1 @ Xm @ A2.T), np.kron(A1, A2) @ A.vec_rowmajor(Xm), atol=SUM_ATOL
    )
    x, W, z = rng.standard_normal(4), rng.standard_normal((4, 4)), rng.standard_normal(4)
    assert x @ W @ z == pytest.approx(np.kron(z, x) @ A.vec(W), abs=SUM_ATOL)


def test_svm_rows_definition_and_order(inst):
    alpha = np.array([1, 0, 5, 2])
    R = A.svm_rows(inst, alpha)
    expected, pairs = [], []
    for i in range(inst.n):
        for t in range(inst.T):
            if t != alpha[i]:
                expected.append(np.kron(inst.z[i], inst.X[i, alpha[i]] - inst.X[i, t]))
                pairs.append((i, t))
    np.testing.assert_allclose(R, np.array(expected), atol=SUM_ATOL)
    c = A.svm_constraints(inst, alpha)
    np.testing.assert_array_equal(c.pairs, pairs)
    assert R.shape == (inst.n * (inst.T - 1), inst.d**2)


def test_rows_act_on_vec_as_constraints(inst, W):
    alpha = inst.optimal_tokens()
    R = A.svm_rows(inst)
    c = A.svm_constraints(inst)
    direct = np.array([(inst.X[i, alpha[i]] - inst.X[i, t]) @ W @ inst.z[i] for i, t in c.pairs])
    np.testing.assert_allclose(R @ A.vec(W), direct, atol=SUM_ATOL)
    np.testing.assert_allclose(A.svm_margins(inst, W), direct, atol=SUM_ATOL)
    # a row-major vec would not satisfy this for generic W
    assert np.max(np.abs(R @ A.vec_rowmajor(W) - direct)) > 1e-3


def test_factorised_gram(inst):
    for alpha in (None, np.array([0, 1, 2, 3])):
        R = A.svm_rows(inst, alpha)
        np.testing.assert_allclose(A.svm_gram(inst, alpha), R @ R.T, atol=SUM_ATOL * 10)


def test_bad_alpha(inst):
    with pytest.raises(InvalidInstanceError, match="out of range"):
        A.svm_rows(inst, [0, 0, 0, 6])
    with pytest.raises(InvalidInstanceError, match="shape"):
        A.svm_gram(inst, [0, 0])


def test_out_of_range_row_and_gram_messages_give_the_entry_size():
    """n = T - 1 = d = 1, x_0 = 2^600, x_1 = 0, z = 2^500 (hand-derived): the one row entry is
    z·Δ = 2^1100 ≈ 1e+331 and the Gram entry (z·z)(Δ·Δ) = 2^2200 ≈ 1e+662; the messages state
    those decimal exponents (round(k·log10 2)) exactly."""
    inst = A.Instance(
        np.array([[[2.0**600], [0.0]]]), np.array([1.0]), np.array([1.0]), np.array([[2.0**500]])
    )
    row_exp, gram_exp = round(1100 * math.log10(2.0)), round(2200 * math.log10(2.0))
    assert (row_exp, gram_exp) == (331, 662)
    tail = ": it overflows float64's normal range [2.2e-308, 1.8e308]"
    with pytest.raises(NumericalError) as info:
        A.svm_rows(inst, [0])
    assert (
        str(info.value) == f"an Att-SVM row entry z_ij·Δ_itk is about 1e+{row_exp}{tail}. Scale X or z down"
    )
    with pytest.raises(NumericalError) as info:
        A.svm_gram(inst, [0])
    assert str(info.value) == f"an Att-SVM Gram entry (z_i·z_j)(Δ_it·Δ_ju) is about 1e+{gram_exp}{tail}"


def test_out_of_range_refusals_do_not_depend_on_the_callers_error_state():
    """X, z ×2^-300 (Gram entries ≈ 2^-1200, oracle: exact scaling of the O(1) Gram at scale 1) and
    X, z ×2^-600 (rows ≈ 2^-1200): the library's NumericalError comes back even when the caller has
    turned every floating-point warning into an exception."""
    inst0 = A.random_instance(2, 3, 4, seed=3)
    small = A.Instance(np.ldexp(inst0.X, -300), inst0.Y, inst0.v, np.ldexp(inst0.z, -300))
    tiny = A.Instance(np.ldexp(inst0.X, -600), inst0.Y, inst0.v, np.ldexp(inst0.z, -600))
    with np.errstate(all="raise"):
        with pytest.raises(NumericalError, match="Gram entry .*underflows"):
            A.svm_gram(small)
        with pytest.raises(NumericalError, match="underflows"):
            A.svm_rows(tiny)


def test_gram_diagonal_at_the_smallest_normal_is_returned_exactly():
    """z = 2^-256, Δ = 2^-255 (d = 1, hand-derived): ||z||²·||Δ||² = 2^-1022, the smallest normal
    double, is in range and returned exactly."""
    inst = A.Instance(
        np.array([[[2.0**-255], [0.0]]]), np.array([1.0]), np.array([1.0]), np.array([[2.0**-256]])
    )
    np.testing.assert_array_equal(A.svm_gram(inst, [0]), [[2.0**-1022]])


def test_gram_underflow_message_names_the_first_small_diagonal_entry():
    """z = 2^-300, Δ_1 = −2^-300, Δ_2 = −2^-350 (hand-derived): diagonal entries 2^-1200 and 2^-1300
    are both below the range; the message gives the first one's exponent round(−1200·log10 2) = −361."""
    X = np.array([[[0.0], [2.0**-300], [2.0**-350]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0]), np.array([[2.0**-300]]))
    expected_exp = round(-1200 * math.log10(2.0))
    assert expected_exp == -361
    with pytest.raises(NumericalError) as info:
        A.svm_gram(inst, [0])
    assert str(info.value) == (
        f"a diagonal Att-SVM Gram entry ||z_i||²·||Δ_it||² is about 1e{expected_exp}: it underflows "
        "float64's normal range [2.2e-308, 1.8e308]. Scale X or z up (the Att-SVM solution scales as "
        "W_mm(cX, cz) = W_mm(X, z)/c²)"
    )


# --- Behaviour at the edges of the float64 range (hand-derived instances, exact oracles) ---------------

#: x = 1.875·2^1023 ≈ 1.69e308 and −x: the token difference 2x = 15·2^1021 ≈ 3.37e308 is not a double.
_BIG = 1.875 * 2.0**1023


@pytest.mark.parametrize("fn", ["svm_constraints", "svm_rows", "svm_gram", "svm_margins"])
def test_token_difference_overflow_is_refused_with_its_size(fn):
    """x_iα = 1.875·2^1023, x_it = −1.875·2^1023 (n = d = 1, T = 2): Δ = 15·2^1021 ≈ 3.37e308 overflows.
    Oracle: the exact integer 15·2^1021, whose log10 (mpmath, 50 digits) rounds to 309 — every function
    built on the constraints refuses with that size, even when the caller's error state raises on every
    floating-point exception (no FloatingPointError leaks out of the library)."""
    inst = _one_sequence([[_BIG], [-_BIG]], [1.0])
    exp = _decimal_exponent(Fraction(15 * 2**1021))
    assert exp == 309
    call = {
        "svm_constraints": lambda: A.svm_constraints(inst, [0]),
        "svm_rows": lambda: A.svm_rows(inst, [0]),
        "svm_gram": lambda: A.svm_gram(inst, [0]),
        "svm_margins": lambda: A.svm_margins(inst, np.eye(1), [0]),
    }[fn]
    with np.errstate(all="raise"), pytest.raises(NumericalError) as info:
        call()
    assert str(info.value) == (
        f"a token difference x_iα − x_it is about 1e+{exp}: it overflows {RANGE_TAIL}. Scale X down "
        "(the Att-SVM solution scales as W_mm(cX, cz) = W_mm(X, z)/c²)"
    )


def test_margin_overflow_message_names_the_overflowing_row():
    """Δ_1 = 1, Δ_2 = 2^1000, W = 2^100, z = 1 (d = 1, hand-derived): margins 2^100 (finite) and 2^1100
    (not a double). The refusal names the second row's size, round(1100·log10 2) = 331 (mpmath), not the
    first's, under a caller error state that raises on every floating-point exception."""
    inst = _one_sequence([[0.0], [-1.0], [-(2.0**1000)]], [1.0])
    exp = _decimal_exponent(Fraction(2**1100))
    assert exp == 331
    with np.errstate(all="raise"), pytest.raises(NumericalError) as info:
        A.svm_margins(inst, np.array([[2.0**100]]), [0])
    assert (
        str(info.value)
        == f"the Att-SVM margins (x_iα − x_it)ᵀ W z_i is about 1e+{exp}: it overflows {RANGE_TAIL}"
    )


def test_margin_just_below_the_normal_range_is_returned_to_its_documented_accuracy():
    """Δ = (0.7, 0.3), W = I, z = (0.6, −0.9)·2^-1021 (d = 2): the margin 0.15·2^-1021 ≈ 3.3e-309 is
    below the normal range, and terms of size 2^-1021 make its last bits fall off the subnormal grid.
    Oracle: exact rational arithmetic (Fraction) of Σ_kj Δ_k W_kj z_j; the value must come back within the
    documented absolute error d²·eps·Σ|Δ_k W_kj z_j| (≈ 5.5·2^-1074 here, which covers the subnormal
    rounding of ≤ 2^-1075), and no FloatingPointError may escape a caller's raising error state."""
    X = [[0.7, 0.3], [0.0, 0.0]]
    z = [0.6 * 2.0**-1021, -0.9 * 2.0**-1021]
    inst = _one_sequence(X, z)
    W = np.eye(2)
    terms = [Fraction(X[0][k]) * Fraction(W[k, j]) * Fraction(z[j]) for k in range(2) for j in range(2)]
    exact = sum(terms, Fraction(0))
    tol = Fraction(4) * Fraction(EPS) * sum(abs(t) for t in terms)  # d² = 4
    with np.errstate(all="raise"):
        out = A.svm_margins(inst, W, [0])
    assert out.shape == (1,)
    assert 0.0 < out[0] < 2.0**-1022
    assert abs(Fraction(out[0]) - exact) <= tol


def test_row_norm_below_the_normal_range_is_refused_with_its_size():
    """n = 1, T = 3, d = 1, z = 2^-511, Δ_1 = 0.875·2^-511, Δ_2 = 1.5 (hand-derived): row 1's only entry,
    and so its norm, is 7·2^-1025 ≈ 1.9e-308 < 2.2e-308 (the entry is an exact subnormal) while row 2
    (1.5·2^-511) is fine. Oracle: round(log10(7·2^-1025)) = −308 (mpmath). The refusal names that row,
    measured by the row's own norm ||z_i||·||Δ_it||: a norm pooled over the rows' power-of-two rescaled
    factors (||(0.875, 0.75)|| ≈ 1.15 in place of 0.875, giving ≈ 1.15·2^-1022) would let it through."""
    inst = _one_sequence([[0.0], [-0.875 * 2.0**-511], [-1.5]], [2.0**-511])
    exp = _decimal_exponent(Fraction(7, 2**1025))
    assert exp == -308
    with np.errstate(all="raise"), pytest.raises(NumericalError) as info:
        A.svm_rows(inst, [0])
    assert str(info.value) == (
        f"the norm ||z_i||·||x_iα − x_it|| of an Att-SVM row is about 1e{exp}: it underflows {RANGE_TAIL}. "
        + SCALE_UP
    )


def test_row_norm_at_the_smallest_normal_is_returned_exactly():
    """z = 2^-511, Δ = 2^-511 (d = 1, hand-derived): the row z ⊗ Δ = 2^-1022 is the smallest normal double,
    inside the documented range [2.2e-308, 1.8e308], and comes back exactly."""
    inst = _one_sequence([[2.0**-511], [0.0]], [2.0**-511])
    np.testing.assert_array_equal(A.svm_rows(inst, [0]), [[2.0**-1022]])


def test_rows_with_finite_entries_but_overflowing_norm_leak_no_floating_point_error():
    """z = (2^511, 2^511), Δ = (0.75·2^513, 0.75·2^513) (d = 2, hand-derived): every entry z_j Δ_k is
    0.75·2^1024 ≈ 1.35e308 (a double) while the row norm 1.5·2^1024 is not. Under a caller error state
    that raises on every floating-point exception the library either returns the exact Kronecker row
    (oracle: the exact product 3·2^1022 in every entry) or refuses with its NumericalError — never a
    FloatingPointError."""
    a, b = 2.0**511, 0.75 * 2.0**513
    inst = _one_sequence([[b, b], [0.0, 0.0]], [a, a])
    try:
        with np.errstate(all="raise"):
            rows = A.svm_rows(inst, [0])
    except NumericalError as err:
        assert "Att-SVM row" in str(err)
    else:
        assert [Fraction(r) for r in rows.ravel()] == [Fraction(3 * 2**1022)] * 4


def _one_row_instance(delta: float, z: float) -> A.Instance:
    """n = 1, T = 2, d = 1: x_α = (delta), x_t = (0), query z: the one margin is delta·W·z."""
    return A.Instance(np.array([[[delta], [0.0]]]), np.array([1.0]), np.array([1.0]), np.array([[z]]))


@pytest.mark.parametrize(
    ("delta", "w_exp", "z_exp"),
    [(1.0, -500, -600), (1.0 + 2.0**-52, -460, -600)],
    ids=["below-every-double", "subnormal-losing-digits"],
)
def test_margin_below_the_normal_range_is_refused_when_rounding_would_exceed_its_error_bound(
    delta: float, w_exp: int, z_exp: int
) -> None:
    """Oracle, exact: the margin is delta·2^(w_exp+z_exp) — 2^−1100 (no double; was returned as 0.0) and
    2^−1060 + 2^−1112 (subnormal: rounding drops the 2^−1112 part, more than the documented
    d²·eps·Σ|terms| = 2^−1112·(1+2^−52)); both must be refused with the scale contract's message."""
    inst = _one_row_instance(delta, 2.0**z_exp)
    with pytest.raises(NumericalError, match=r"the Att-SVM margins .* underflows float64's normal range"):
        svm_margins(inst, np.array([[2.0**w_exp]]), np.array([0]))


def test_exact_subnormal_margin_is_returned_exactly() -> None:
    """Oracle, exact: 1·2^−500·2^−560 = 2^−1060 is a subnormal double, returned bit for bit."""
    inst = _one_row_instance(1.0, 2.0**-560)
    assert svm_margins(inst, np.array([[2.0**-500]]), np.array([0]))[0] == 2.0**-1060


def test_tiny_margin_from_cancelling_large_terms_is_within_its_error_bound() -> None:
    """A margin that cancels between O(1) terms (true value 0) is returned, not refused: its documented
    error bound d²·eps·Σ|terms| (~1e-15) dwarfs any subnormal rounding. Oracle: exact arithmetic, the
    terms 1·1 and −1·1 cancel to exactly 0."""
    X = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, -1.0]]))
    assert svm_margins(inst, np.eye(2), np.array([0]))[0] == 0.0


def _two_term_instance(delta: tuple[float, float], z: tuple[float, float]) -> A.Instance:
    """n = 1, T = 2, d = 2: x_α = delta, x_t = 0, query z; with W diagonal the margin is a sum of two
    exactly known terms delta_k·W_kk·z_k."""
    X = np.array([[list(delta), [0.0, 0.0]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.array([list(z)]))


@pytest.mark.parametrize(
    ("case", "refused", "expected"),
    [
        # d = 1, value (1+2^-52)·2^-1024: bound eps·|value| ≈ 2^-1076 < 2^-1075, inexact on the grid.
        ("d1-below-threshold", True, None),
        # d = 1, value (1+2^-52)·2^-1023: bound (1+2^-52)·2^-1075 ≥ 2^-1075: returned, rounded to even.
        ("d1-above-threshold", False, 2.0**-1023),
        # d = 2, terms ±2^-1026·(1±2^-52): Σ|terms| = 2^-1025, bound 4·eps·2^-1025 = 2^-1075 exactly
        # (not below it): value 2^-1077 is returned as 0.0, within the bound.
        ("d2-at-threshold", False, 0.0),
        # d = 2, terms ±2^-1027·(1±2^-52): bound 2^-1076 < 2^-1075, value 2^-1078: refused.
        ("d2-below-threshold", True, None),
    ],
)
def test_subnormal_margin_refused_exactly_when_rounding_may_exceed_the_bound(
    case: str, refused: bool, expected: float | None
) -> None:
    """The documented rule: a margin below the normal range is returned when its rounding to the
    subnormal grid (≤ 2^-1075) stays within d²·eps·Σ|Δ_k W_kj z_j|, and refused when that bound is below
    2^-1075 and the value is not exact. Oracle: the exact values in the comments (powers of two)."""
    if case.startswith("d1"):
        scale = -1024 if case == "d1-below-threshold" else -1023
        inst = _one_row_instance(1.0 + 2.0**-52, 2.0 ** (scale + 1000))
        W = np.array([[2.0**-1000]])
    else:
        half = -1026 if case == "d2-at-threshold" else -1027
        inst = _two_term_instance(
            (1.0 + 2.0**-52, 1.0 - 2.0**-52), (2.0 ** (half + 500), -(2.0 ** (half + 500)))
        )
        W = 2.0**-500 * np.eye(2)
    if refused:
        with pytest.raises(NumericalError, match=r"the Att-SVM margins .* underflows"):
            svm_margins(inst, W, np.array([0]))
    else:
        assert svm_margins(inst, W, np.array([0]))[0] == expected
