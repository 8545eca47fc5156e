"""Fixtures shared by the unit tests."""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A


@pytest.fixture
def inst() -> A.Instance:
    """A small generic cross-attention instance (n=4, T=6, d=8)."""
    return A.random_instance(4, 6, 8, seed=1)


@pytest.fixture
def W(inst: A.Instance) -> np.ndarray:
    """A moderate attention matrix (entries ~ N(0, 1/d))."""
    return np.random.default_rng(7).standard_normal((inst.d, inst.d)) / np.sqrt(inst.d)
