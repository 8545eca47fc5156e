"""The scale contract's tools: exact power-of-two rescaling and the range errors.

Oracles: ``math.frexp``/``math.ldexp`` (exact binary exponent arithmetic, independent of numpy),
exact rational arithmetic (``fractions.Fraction``) for the claim that rescaling is exact, and the
IEEE 754 limits written out as literals.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attnsvm import NumericalError
from attnsvm import scaling as sc

#: IEEE 754 binary64: largest finite and smallest normal numbers, written out.
IEEE_MAX = 1.7976931348623157e308
IEEE_TINY = 2.2250738585072014e-308


def test_limits_are_ieee_binary64() -> None:
    assert sc.FLOAT_MAX == IEEE_MAX and sc.FLOAT_TINY == IEEE_TINY
    assert sc.LOG_FLOAT_MAX == math.log(IEEE_MAX) and sc.LOG_FLOAT_TINY == math.log(IEEE_TINY)


@pytest.mark.parametrize("x", [1.0, 0.5, 0.75, 3.0, 1e-300, 1e300, IEEE_TINY, IEEE_MAX, 5e-324])
def test_pow2_exponent_brings_the_largest_entry_to_half_one(x: float) -> None:
    e = sc.pow2_exponent(np.array([[0.0, -x], [x / 4, 0.0]]))
    assert 0.5 <= Fraction(x) / Fraction(2) ** e < 1  # exact, in rationals


def test_pow2_exponent_of_non_finite_is_zero() -> None:
    assert sc.pow2_exponent(np.array([np.inf])) == 0


def test_pow2_exponent_of_zero_or_empty_is_zero() -> None:
    assert sc.pow2_exponent(np.zeros((2, 3))) == 0
    assert sc.pow2_exponent(np.zeros((0,))) == 0


@pytest.mark.parametrize("e", [-1000, -1, 0, 1, 7, 1000])
def test_ldexp_scale_is_exact_and_new(e: int) -> None:
    a = np.array([1.0 / 3.0, -2.5, 1e-5, 0.0])
    a0 = a.copy()
    out = sc.ldexp_scale(a, e)
    assert out is not a and np.array_equal(a, a0)
    for x, y in zip(a, out, strict=True):
        assert Fraction(float(y)) == Fraction(float(x)) / Fraction(2) ** e


def test_log10_of() -> None:
    assert sc.log10_of(math.log(1e100)) == pytest.approx(100.0, rel=1e-15)


RANGE = "float64's normal range [2.2e-308, 1.8e308]"


@pytest.mark.parametrize(
    ("log_value", "message"),
    [
        (800.0, f"the thing is about 1e+347: it overflows {RANGE}. Call g instead"),
        (-800.0, f"the thing is about 1e-347: it underflows {RANGE}. Call g instead"),
        (710.0, f"the thing is about 1e+308: it overflows {RANGE}. Call g instead"),
        (math.inf, "the thing is beyond any double (overflow). Call g instead"),
        (-math.inf, "the thing is below any double (underflow to 0). Call g instead"),
        (math.nan, "the thing is not representable (its logarithm is undefined). Call g instead"),
    ],
)
def test_range_error_names_the_quantity_the_size_and_the_range(log_value: float, message: str) -> None:
    err = sc.range_error("the thing", log_value, remedy="Call g instead")
    assert isinstance(err, NumericalError)
    assert str(err) == message


def test_range_error_without_remedy_ends_at_the_range() -> None:
    assert str(sc.range_error("y", -350 * math.log(10.0))) == f"y is about 1e-350: it underflows {RANGE}"
    assert str(sc.range_error("y", -math.inf)) == "y is below any double (underflow to 0)"


@pytest.mark.parametrize("x", [IEEE_TINY, 1.0, 1e-300, 1e300, 1.7e308])
def test_check_log_representable_returns_normal_values(x: float) -> None:
    assert sc.check_log_representable("x", math.log(x)) == pytest.approx(x, rel=1e-12)


def test_check_log_representable_at_the_ends_of_the_range() -> None:
    assert sc.check_log_representable("x", sc.LOG_FLOAT_MAX) == pytest.approx(IEEE_MAX, rel=1e-13)
    assert sc.check_log_representable("x", sc.LOG_FLOAT_TINY) == pytest.approx(IEEE_TINY, rel=1e-13)


@pytest.mark.parametrize("log_value", [710.0, -709.0, -745.0, math.inf, -math.inf, math.nan])
def test_check_log_representable_refuses_beyond_the_normal_range(log_value: float) -> None:
    with pytest.raises(NumericalError) as info:
        sc.check_log_representable("x", log_value, remedy="Do y.")
    assert str(info.value) == str(sc.range_error("x", log_value, remedy="Do y."))
    with pytest.raises(NumericalError) as info:
        sc.check_log_representable("x", log_value)
    assert str(info.value) == str(sc.range_error("x", log_value))


def test_check_finite_result() -> None:
    a = np.array([1, -2])
    out = sc.check_finite_result(a, "a")
    assert out.dtype == np.float64 and np.array_equal(out, a)
    for bad in (np.inf, -np.inf, np.nan):
        with pytest.raises(NumericalError) as info:
            sc.check_finite_result(np.array([1.0, bad]), "the output", remedy="Rescale.")
        assert str(info.value) == f"the output is not finite: it overflows {RANGE} (or is 0/0). Rescale."
        with pytest.raises(NumericalError) as info:
            sc.check_finite_result(np.array([1.0, bad]), "the output")
        assert str(info.value) == f"the output is not finite: it overflows {RANGE} (or is 0/0)"


def test_ldexp_scale_returns_float64() -> None:
    out = sc.ldexp_scale(np.array([3], dtype=np.float32), 1)
    assert out.dtype == np.float64 and out[0] == 1.5
    assert sc.ldexp_scale(np.array([1.0]), 1074)[0] == 5e-324  # exact down to the last subnormal


# ------------------------------------------------------------------ pow2_split
# Oracle: math.frexp (the exponent) and exact rational arithmetic (fractions.Fraction) for the claim
# a = m·2^e: exact for every entry whose mantissa is a normal double (and for every entry when e ≤ 0);
# otherwise m_k is a_k·2^−e rounded to the subnormal grid, to nearest: |m_k·2^e − a_k| ≤ 2^−1075·2^e.
#: The smallest subnormal spacing is 2^−1074; round-to-nearest is off by at most half of it.
HALF_SUBNORMAL_ULP = Fraction(1, 2**1075)
IEEE_TRUE_MIN = 5e-324  # 2^−1074, the smallest positive subnormal, written out


def _check_split(a: np.ndarray) -> None:
    """Assert the documented contract of ``pow2_split`` on ``a`` against frexp and Fraction."""
    a0 = a.copy()
    m, e = sc.pow2_split(a)
    assert np.array_equal(a, a0, equal_nan=True)  # the input is not modified
    assert isinstance(e, int) and m.dtype == np.float64 and m.shape == a.shape
    assert not np.shares_memory(m, a)
    big = max((abs(float(x)) for x in a.ravel()), default=0.0)
    if big == 0.0:
        assert e == 0 and not np.any(m != 0.0)
        return
    assert e == math.frexp(big)[1]
    top = max(abs(Fraction(float(x))) for x in m.ravel())
    assert Fraction(1, 2) <= top < 1
    scale = Fraction(2) ** e
    for x, y in zip(a.ravel(), m.ravel(), strict=True):
        exact, got = Fraction(float(x)), Fraction(float(y)) * scale
        if e <= 0 or abs(exact) >= Fraction(2) ** (e - 1022):  # the mantissa entry is a normal double
            assert got == exact
        else:
            assert abs(got - exact) <= HALF_SUBNORMAL_ULP * scale


@pytest.mark.parametrize(
    "values",
    [
        [0.0],
        [-0.0, 0.0],
        [1.0],
        [0.5, -0.75, 1.0 / 3.0],
        [IEEE_MAX, -IEEE_MAX],  # ±max: e = 1024, m = ±(1 − 2^−53)
        [-IEEE_MAX, 1.0, IEEE_TINY],  # the smallest normal 2^1022 below the largest ...
        [IEEE_MAX, IEEE_TRUE_MIN, -3 * IEEE_TRUE_MIN],  # ... and subnormals: rounded to m's grid (to 0)
        [IEEE_TINY],  # the smallest normal alone: e = −1021, scaled up exactly
        [IEEE_TRUE_MIN],  # the smallest subnormal alone: e = −1073, m = ½ exactly
        [IEEE_TRUE_MIN, 7 * IEEE_TRUE_MIN, -(2.0**-1060)],  # the subnormal range only
        [1e300, 3e-8, -1e-30],  # far apart but all mantissas normal: exact
        [2.0**1000, 2.0**-20 + 2.0**-72],  # e = 1001: m = 2^−1021 + 2^−1073, normal, exact
        [2.0**1000, 2.0**-22 + 2.0**-80],  # e = 1001: m = 2^−1023 + 2^−1081 is subnormal: rounded
    ],
)
def test_pow2_split_is_frexp_of_the_largest_entry_and_exact(values: list[float]) -> None:
    """Oracle: math.frexp and Fraction (see _check_split); the cases pin 0, ±max, the smallest normal
    and subnormal numbers, and entries rounded to the subnormal grid of the mantissa."""
    _check_split(np.array(values, dtype=np.float64))


def test_pow2_split_pinned_values() -> None:
    """Oracle: the IEEE 754 encodings, by hand. max = (1 − 2^−53)·2^1024; 2^−1074 = ½·2^−1073;
    against 2^1000 (e = 1001) the entry 1 gives the normal 2^−1001 (exact) and 2^−22 + 2^−80 gives the
    subnormal 2^−1023 (2^−1081 is below half the grid step 2^−1074); against 1 (e = 1) 2^−1074 and
    3·2^−1074 halve to ties, rounded to even: 0 and 2^−1073."""
    m, e = sc.pow2_split(np.array([IEEE_MAX, -IEEE_MAX]))
    assert e == 1024 and m.tolist() == [1.0 - 2.0**-53, -(1.0 - 2.0**-53)]
    m, e = sc.pow2_split(np.array([IEEE_TRUE_MIN]))
    assert e == -1073 and m.tolist() == [0.5]
    m, e = sc.pow2_split(np.array([2.0**1000, 1.0]))
    assert e == 1001 and m.tolist() == [0.5, 2.0**-1001]
    m, e = sc.pow2_split(np.array([2.0**1000, 2.0**-22 + 2.0**-80]))
    assert e == 1001 and m.tolist() == [0.5, 2.0**-1023]
    m, e = sc.pow2_split(np.array([1.0, 2.0**-1074]))
    assert e == 1 and m.tolist() == [0.5, 0.0]
    m, e = sc.pow2_split(np.array([1.0, 3 * 2.0**-1074]))
    assert e == 1 and m.tolist() == [0.5, 2.0**-1073]


def test_pow2_split_of_zero_empty_and_ints() -> None:
    """Oracle: the documented convention (zeros and empty give e = 0) and exact integers."""
    for a in (np.zeros((2, 3)), np.zeros((0,)), np.array([-0.0])):
        m, e = sc.pow2_split(a)
        assert e == 0 and m.shape == a.shape and not np.any(m != 0.0)
    m, e = sc.pow2_split([[3, -8], [1, 0]])  # array-like of ints: float64 out
    assert e == 4 and m.dtype == np.float64 and m.tolist() == [[3 / 16, -0.5], [1 / 16, 0.0]]
    m, e = sc.pow2_split(2.0)  # a scalar: a 0-d mantissa
    assert e == 2 and m.shape == () and float(m) == 0.5


def test_pow2_split_has_one_home() -> None:
    """The helper lives in attnsvm.scaling; instance.pow2_split and prompt.mantissa are re-exports."""
    from attnsvm.model import _instance as instance
    from attnsvm.peers import _prompt as prompt

    assert instance.pow2_split is sc.pow2_split and prompt.mantissa is sc.pow2_split


_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=5), elements=_FLOATS),
    st.integers(min_value=-1074, max_value=1023),
)
def test_pow2_split_property_over_the_whole_range(a: np.ndarray, j: int) -> None:
    """Oracle: math.frexp and Fraction (see _check_split), on arrays drawn over every finite double
    (subnormals, ±0, ±max), and on the same arrays with one entry moved to 2^j (mixed magnitudes)."""
    _check_split(a)
    b = a.copy()
    b.flat[0] = 2.0**j
    _check_split(b)
