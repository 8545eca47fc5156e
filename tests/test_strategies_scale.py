"""The scale-sweep strategies: exponents keep every entry normal, scaling is exact, shrinking goes to 0.

Oracles: exact rational arithmetic (``fractions.Fraction``) for exactness; IEEE 754 limits for the
exponent range; Hypothesis's own ``find`` for the shrinking target.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S

TINY = float(np.finfo(np.float64).tiny)
MAX = float(np.finfo(np.float64).max)


def test_exponent_range_is_the_normal_range() -> None:
    lo, hi = S.exponent_range(np.array([1.0, -0.25]))
    # 1·2^hi < 2^1024 and 0.25·2^lo ≥ 2^-1022, with hi, lo the extreme such exponents
    assert hi == 1023 and lo == -1020
    assert np.ldexp(1.0, hi) <= MAX
    assert np.ldexp(0.25, lo) >= TINY and np.ldexp(0.25, lo - 1) < TINY
    assert S.exponent_range(np.array([1.0]), headroom_bits=10) == (-1022, 1013)
    assert S.exponent_range(np.zeros(3)) == (-1074, 1074)


def test_exponent_range_always_contains_zero() -> None:
    assert S.exponent_range(np.array([MAX, TINY])) == (0, 0)


@settings(max_examples=50, deadline=None)
@given(S.scaled_instances())
def test_scaled_instances_are_exact_scalings(s: S.ScaledInstance) -> None:
    for big, small, j in (
        (s.inst.X, s.original.X, s.jx),
        (s.inst.z, s.original.z, s.jz),
        (s.inst.v, s.original.v, s.jv),
    ):
        for x, y in zip(big.ravel(), small.ravel(), strict=True):
            assert Fraction(float(x)) == Fraction(float(y)) * Fraction(2) ** j
    assert np.array_equal(s.inst.Y, s.original.Y)
    assert s.inst.self_attention == s.original.self_attention
    if s.inst.self_attention:
        assert s.jz == s.jx


@settings(max_examples=30, deadline=None)
@given(S.scaled_instances(tied=True))
def test_tied_scaling_gives_x_and_z_one_exponent(s: S.ScaledInstance) -> None:
    assert s.jx == s.jz


def test_flags_keep_arrays_unscaled() -> None:
    @settings(max_examples=20, deadline=None)
    @given(S.scaled_instances(S.instances(attention="cross"), scale_X=False, scale_v=False))
    def check(s: S.ScaledInstance) -> None:
        assert s.jx == 0 and s.jv == 0

    check()


def test_exponents_shrink_to_zero() -> None:
    from hypothesis import find

    s = find(
        S.scaled_instances(S.instances(attention="cross")),
        lambda s: s.jx != 0,
        settings=settings(database=None),
    )
    assert abs(s.jx) == 1 and s.jz == 0 and s.jv == 0


def test_scaled_refuses_untied_self_attention() -> None:
    inst = A.random_instance(2, 3, 2, family="self_attention")
    with pytest.raises(A.InvalidInstanceError, match="jz must equal jx"):
        S.scaled(inst, 1, 2, 0)
    assert S.scaled(inst, 3, 3, 0).self_attention


@given(st.data())
@settings(max_examples=5, deadline=None)
def test_scaled_does_not_modify_the_instance(data: st.DataObject) -> None:
    inst = data.draw(S.instances(attention="cross"))
    X0 = inst.X.copy()
    S.scaled(inst, 5, -5, 2)
    assert np.array_equal(inst.X, X0)
