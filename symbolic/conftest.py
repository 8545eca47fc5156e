"""Shared setup of the SymPy suite: the claim registry and the seed of the code checks.

Every test here is deterministic (SymPy decisions are exact; the numeric ties draw their
points from ``numpy.random.default_rng(CHECK_SEED)``).
"""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm import identities

#: Seed of the random float64 points at which the proved expressions meet the code.
CHECK_SEED = 20240501


@pytest.fixture
def check_rng() -> np.random.Generator:
    """A fresh generator for one code check (same seed → same points → same result)."""
    return np.random.default_rng(CHECK_SEED)


@pytest.fixture(scope="session")
def claims() -> tuple[identities.Claim, ...]:
    """The ordered registry of proved statements."""
    return identities.CLAIMS
