"""The boundary checks of attnsvm._validation: what each accepts, what it refuses, and the message.

Oracle: the documented messages, written out; the Python/numpy types the checks must accept or refuse.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm._validation import as_real_array, check_instance, check_int, check_positive, check_shape
from attnsvm.errors import AttnSVMError, InvalidInstanceError


@pytest.mark.parametrize("good", [1, 7, np.int64(3), np.int8(2)])
def test_check_int_accepts_integers_and_returns_int(good) -> None:
    out = check_int(good, "steps")
    assert out == int(good) and type(out) is int


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.0, "3", None, np.float64(2.0)])
def test_check_int_refuses_with_the_documented_message(bad) -> None:
    with pytest.raises(AttnSVMError) as exc:
        check_int(bad, "steps")
    assert str(exc.value) == f"steps must be an integer ≥ 1; got {bad!r}"
    assert type(exc.value) is AttnSVMError


def test_check_int_low_and_error_class() -> None:
    assert check_int(0, "samples", low=0) == 0
    with pytest.raises(InvalidInstanceError, match=r"^T must be an integer ≥ 2; got 1$"):
        check_int(1, "T", low=2, error=InvalidInstanceError)


@pytest.mark.parametrize("good", [1e-300, 0.1, 3, np.float32(0.5), 1.7e308])
def test_check_positive_accepts_positive_finite_numbers(good) -> None:
    out = check_positive(good, "lr")
    assert out == float(good) and type(out) is float


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True])
def test_check_positive_refuses_with_its_meaning(bad) -> None:
    with pytest.raises(AttnSVMError) as exc:
        check_positive(bad, "lr", meaning="the step size η")
    assert str(exc.value) == f"lr must be a positive finite number (the step size η); got {bad!r}"


@pytest.mark.parametrize("bad", ["x", None, [1.0, 2.0]])
def test_check_positive_refuses_what_is_not_a_number(bad) -> None:
    with pytest.raises(InvalidInstanceError) as exc:
        check_positive(bad, "bound", meaning="ignored here", error=InvalidInstanceError)
    assert str(exc.value) == f"bound must be a positive finite number; got {bad!r}"


def test_check_shape_message_and_read_only_copy() -> None:
    v = [1.0, 2.0]
    out = check_shape(v, "v", (2,), described="(d,)")
    assert out.dtype == np.float64 and not out.flags.writeable and out.tolist() == v
    with pytest.raises(InvalidInstanceError) as exc:
        check_shape([1.0, 2.0, 3.0], "p0", (2,), described="(d,)", note=" for this instance")
    assert str(exc.value) == "p0 must have shape (d,) = (2,) for this instance; got (3,)"
    with pytest.raises(InvalidInstanceError, match=r"^K0 must have 2 dimension\(s\); got shape \(3,\)$"):
        check_shape([1.0, 2.0, 3.0], "K0", (3, 1), described="(d, m)")


def test_as_real_array_refusals_name_the_argument() -> None:
    with pytest.raises(InvalidInstanceError, match=r"^W must be finite; found nan at index \(0, 1\)"):
        as_real_array([[1.0, np.nan]], "W")
    with pytest.raises(InvalidInstanceError, match="complex values are not supported"):
        as_real_array([1j], "v")
    with pytest.raises(InvalidInstanceError, match="dtype bool"):
        as_real_array([True], "v")
    a = np.array([1.0, 2.0])
    out = as_real_array(a, "a")
    assert out is not a and a.flags.writeable  # a copy; the input is untouched


def test_check_instance() -> None:
    inst = A.random_instance(1, 2, 2)
    assert check_instance(inst) is inst
    with pytest.raises(InvalidInstanceError) as exc:
        check_instance(inst.X, "instances[3]")
    assert str(exc.value) == (
        "instances[3] must be an attnsvm.Instance; got ndarray (build one with attnsvm.Instance(X, Y, v, z))"
    )


def test_default_names_and_empty_meaning_and_note() -> None:
    """The defaults write nothing extra: ``check_instance``'s argument is called ``inst``, ``check_positive``
    without a meaning adds no parenthesis, ``check_shape`` without a note ends at the shape."""
    with pytest.raises(InvalidInstanceError, match=r"^inst must be an attnsvm\.Instance; got int "):
        check_instance(3)
    with pytest.raises(AttnSVMError) as exc:
        check_positive(0.0, "bound")
    assert str(exc.value) == "bound must be a positive finite number; got 0.0"
    with pytest.raises(InvalidInstanceError) as exc2:
        check_shape([1.0, 2.0, 3.0], "v", (2,), described="(d,)")
    assert str(exc2.value) == "v must have shape (d,) = (2,); got (3,)"
