"""Bounded discards: the one helper the property files use to set examples aside, counted and capped.

A property states a claim for every input of a kind. An example outside the claim (a case the claim
excludes by its stated condition, or one whose reference is not representable) may be *set aside*,
but never silently: each one is reported with ``hypothesis.event("discarded: <why>")`` (so the
statistics of a run list the reasons) and counted, and after the Hypothesis run the test fails
when more than ``max_fraction`` (default :data:`MAX_DISCARD_FRACTION`) of its examples were set
aside. A silent ``return`` or ``assume(False)`` is a defect in this project.

Use::

    _TALLY = Tally()

    @bounded_discards(_TALLY)
    @given(...)
    def test_claim(...):
        _TALLY.run += 1
        if outside_the_claim:
            _TALLY.discard("why, in words")
            return
        ...

The check runs in the same pytest test as the Hypothesis run (the decorator wraps it), so it holds
serially and under xdist. ``properties/conftest.py`` makes this module importable as ``_discards``
(pytest's importlib import mode puts no test folder on ``sys.path``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hypothesis import event

__all__ = ["MAX_DISCARD_FRACTION", "RANDOM_PROFILE_ALPHA", "Tally", "bounded_discards", "too_many_discards"]

#: At most this fraction of a property's examples may be set aside (asserted after each run): a
#: property that discards more tests too little of what it claims.
MAX_DISCARD_FRACTION = 0.05

#: Under a randomized profile (``dev``, ``sweep``) the examples differ from run to run, so the observed
#: fraction scatters around the true discard rate: 2 of 38 (5.3 %) happens in about half the runs of a
#: property whose true rate is 5 %. There the test fails when the observed count is improbable under the
#: bound: the exact binomial tail ``P[Bin(run, max_fraction) ≥ discarded]`` is below this level (a property
#: that sets 20 of 100 aside fails, p ≈ 1e-7). Derandomized profiles (``ci``) compare the observed fraction
#: itself, which is reproducible.
RANDOM_PROFILE_ALPHA = 1e-3


def too_many_discards(discarded: int, run: int, max_fraction: float = MAX_DISCARD_FRACTION) -> bool:
    """Whether ``discarded`` of ``run`` examples breaks the bound ``max_fraction`` (see
    :data:`RANDOM_PROFILE_ALPHA` for randomized profiles)."""
    from hypothesis import settings
    from scipy.stats import binom

    if settings.default.derandomize:
        return discarded > max_fraction * run
    return (
        discarded > max_fraction * run
        and float(binom.sf(discarded - 1, run, max_fraction)) < RANDOM_PROFILE_ALPHA
    )


class Tally:
    """Examples run and examples set aside by one property run (checked by :func:`bounded_discards`)."""

    def __init__(self) -> None:
        self.run = 0
        self.discarded = 0

    def discard(self, why: str) -> None:
        """Set the current example aside: ``event("discarded: <why>")`` and count it."""
        event(f"discarded: {why}")
        self.discarded += 1


def bounded_discards(tally: Tally, max_fraction: float = MAX_DISCARD_FRACTION) -> Callable[[Any], Any]:
    """Run a ``@given`` test, then assert that at most ``max_fraction`` of its examples were set aside.

    The tally is reset before the run. A sweep seed that ``properties/conftest.py`` sets on the wrapper
    (``_hypothesis_internal_use_seed``) is handed on to the Hypothesis test.
    """

    def deco(test: Any) -> Any:
        @functools.wraps(test)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            tally.run = tally.discarded = 0
            seed = getattr(wrapper, "_hypothesis_internal_use_seed", None)
            if seed is not None:
                test._hypothesis_internal_use_seed = seed
            test(*args, **kwargs)
            assert tally.run > 0
            assert not too_many_discards(tally.discarded, tally.run, max_fraction), (
                f"{tally.discarded} of {tally.run} examples set aside (> {max_fraction:.0%})"
            )

        return wrapper

    return deco
