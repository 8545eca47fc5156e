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
