"""Fixtures shared by the unit tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import attnsvm as A


def _register_helper(name: str) -> None:
    """Make ``tests/<name>.py`` importable as ``<name>`` by the test files.

    Under ``--import-mode=importlib`` (pyproject.toml) pytest puts no test folder on ``sys.path``; this
    conftest is imported before any test file of this folder (and in each xdist worker), so it loads the
    helper once under its own name (as properties/conftest.py does for its helper).
    """
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


# The mpmath gradient oracle (tests/_mp_oracle.py) shared by the engine tests.
_register_helper("_mp_oracle")


@pytest.fixture
def inst() -> A.Instance:
    """A small generic cross-attention instance (n=4, T=6, d=8)."""
    return A.random_instance(4, 6, 8, seed=1)


@pytest.fixture
def W(inst: A.Instance) -> np.ndarray:
    """A moderate attention matrix (entries ~ N(0, 1/d))."""
    return np.random.default_rng(7).standard_normal((inst.d, inst.d)) / np.sqrt(inst.d)
