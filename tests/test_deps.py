"""Optional dependencies: a feature whose extra is missing raises MissingDependencyError naming it.

Oracle: the documented install command. A package is made missing by ``sys.modules[name] = None`` (how
Python itself marks a failed import: ``import name`` then raises ``ModuleNotFoundError`` for ``name``),
in-process for functions and in a subprocess for module-level guards. ``tools/check_core.py`` (``tox -e
core``) checks the same in a real environment without the extras.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import attnsvm as A
from attnsvm._deps import EXTRA_OF, require
from attnsvm.lipschitz import jacobian_norm
from attnsvm.peers._mirror import solve_lp_svm


@pytest.fixture
def inst() -> A.Instance:
    return A.random_instance(3, 4, 3, seed=0)


def test_missing_dependency_error_is_both_an_attnsvm_error_and_an_import_error() -> None:
    """``except ImportError`` (the usual probe for optional packages) and ``except AttnSVMError`` both catch it."""
    assert issubclass(A.MissingDependencyError, A.AttnSVMError)
    assert issubclass(A.MissingDependencyError, ImportError)


@pytest.mark.parametrize("package", sorted(EXTRA_OF))
def test_require_names_the_extra_of_each_optional_package(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(
        A.MissingDependencyError, match=rf"pip install 'attnsvm\[{EXTRA_OF[package]}\]'"
    ) as info:
        require(package, feature="the feature")
    assert info.value.name == package
    assert str(info.value).startswith(f"the feature needs the optional package '{package}'")


def test_require_returns_the_module_when_installed() -> None:
    assert require("numpy.linalg", feature="x") is np.linalg


def test_a_broken_installation_is_not_reported_as_a_missing_extra() -> None:
    """A missing submodule of an installed package is a broken install, not a missing extra: it propagates."""
    with pytest.raises(ModuleNotFoundError) as info:
        require("numpy.no_such_submodule", feature="x")
    assert not isinstance(info.value, A.MissingDependencyError)


CALLS = {
    "run_gd_batch": ("torch", lambda inst: A.run_gd_batch([inst], 2, 0.1)),
    "lipschitz_estimate": ("torch", lambda inst: A.lipschitz_estimate(inst, radius=1.0)),
    "jacobian_norm": ("torch", lambda inst: jacobian_norm(inst, np.eye(inst.d))),
    "solve_svm(primal)": ("cvxpy", lambda inst: A.solve_svm(inst, method="primal")),
    "solve_svm(vector)": ("cvxpy", lambda inst: A.solve_svm(inst, method="vector")),
    "solve_svm(nuc)": ("cvxpy", lambda inst: A.solve_svm(inst, norm="nuc")),
    "solve_lp_svm": ("cvxpy", lambda inst: solve_lp_svm(inst, 1.5)),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_extra_feature_refuses_without_its_package(
    name: str, inst: A.Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    package, call = CALLS[name]
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(A.MissingDependencyError, match=rf"attnsvm\[{package}\]"):
        call(inst)


def test_the_core_still_works_without_the_extras(inst: A.Instance, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact dual SVM and single-run GD do not touch torch or cvxpy (margins ≥ 1 checked from scratch)."""
    for package in ("torch", "cvxpy"):
        monkeypatch.setitem(sys.modules, package, None)
    sol = A.solve_svm(inst)
    assert (A.svm_rows(inst, sol.alpha) @ A.vec(sol.W)).min() >= 1 - 1e-9  # the core's certificate level
    assert np.isfinite(A.run_gd(inst, 20, 0.1).W).all()


def _blocked(package: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules[{package!r}] = None\n{code}"],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "package", "extra"),
    [
        ("attnsvm.strategies", "hypothesis", "hypothesis"),
        ("attnsvm.peer_strategies", "hypothesis", "hypothesis"),
        ("attnsvm.identities", "sympy", "sympy"),
        ("attnsvm.harness.experiments", "mpmath", "sympy"),
    ],
)
def test_importing_an_extra_module_without_its_package_names_the_extra(
    module: str, package: str, extra: str
) -> None:
    out = _blocked(package, f"import {module}")
    assert out.returncode != 0
    assert "MissingDependencyError" in out.stderr and f"attnsvm[{extra}]" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("command", "package", "extra"), [("reproduce", "rich", "report"), ("check", "sympy", "sympy")]
)
def test_cli_commands_name_the_missing_extra(command: str, package: str, extra: str, tmp_path) -> None:
    args = [command, "--out", str(tmp_path / "r")] if command == "reproduce" else [command, "--tiny"]
    out = _blocked(package, f"from attnsvm.harness.cli import main; sys.exit(main({args!r}))")
    assert out.returncode == 2, out.stderr
    assert (
        f"attnsvm {command}: error: MissingDependencyError" in out.stderr
        and f"attnsvm[{extra}]" in out.stderr
    )
