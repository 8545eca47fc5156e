"""The discard bound of the property suites (properties/_discards.py): what breaks it, per profile.

Oracles: the binomial law, in closed form at the edges (``P[Bin(n, p) ≥ 0] = 1``,
``P[Bin(n, p) ≥ n] = pⁿ``) and by exact summation with math.comb.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def discards():
    spec = importlib.util.spec_from_file_location("attnsvm_discards", ROOT / "properties" / "_discards.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _tail(k: int, n: int, p: float) -> float:
    """``P[Bin(n, p) ≥ k]`` by exact summation."""
    return math.fsum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


@pytest.fixture
def profile():
    """Switch ``derandomize`` for one test, restoring the loaded profile afterwards."""
    before = settings.default
    name = settings.get_current_profile_name()

    def use(derandomize: bool) -> None:
        settings.register_profile("_discard_test", parent=before, derandomize=derandomize)
        settings.load_profile("_discard_test")

    yield use
    settings.load_profile(name)


def test_derandomized_profiles_compare_the_observed_fraction(discards, profile) -> None:
    """A derandomized run is reproducible: its observed fraction itself is bounded (2 of 38 > 5 %)."""
    profile(True)
    assert discards.too_many_discards(2, 38, 0.05)
    assert not discards.too_many_discards(1, 20, 0.05)
    assert not discards.too_many_discards(5, 100, 0.05)
    assert discards.too_many_discards(6, 100, 0.05)


def test_randomized_profiles_fail_only_on_improbable_counts(discards, profile) -> None:
    """Randomized runs scatter: 2 of 38 at a true 5 % is common (tail ≈ 0.57) and passes; 20 of 100 (tail
    ≈ 1e-7) and 38 of 38 fail; the threshold is the exact tail against RANDOM_PROFILE_ALPHA."""
    profile(False)
    alpha = discards.RANDOM_PROFILE_ALPHA
    assert _tail(2, 38, 0.05) > 0.5 and not discards.too_many_discards(2, 38, 0.05)
    assert _tail(20, 100, 0.05) < alpha and discards.too_many_discards(20, 100, 0.05)
    assert math.isclose(_tail(38, 38, 0.05), 0.05**38) and discards.too_many_discards(38, 38, 0.05)
    # the first failing count at n = 100 is the first k whose exact tail is below alpha
    first = next(k for k in range(101) if _tail(k, 100, 0.05) < alpha)
    assert not discards.too_many_discards(first - 1, 100, 0.05)
    assert discards.too_many_discards(first, 100, 0.05)
    assert not discards.too_many_discards(0, 100, 0.05)  # P[Bin ≥ 0] = 1
