"""Optional dependencies: import one where a feature needs it, or say which extra installs it.

The core (instances, attention, losses, gradients, the tensor trick, the exact dual Att-SVM, single-run
GD, the analytic Lipschitz bounds) needs NumPy and SciPy only. Every other feature imports its package
through :func:`require`, which turns a missing package into a :class:`MissingDependencyError` that names
the extra to install (``pip install 'attnsvm[torch]'``) instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

#: The extra (``pyproject.toml``'s ``[project.optional-dependencies]``) that installs each optional
#: top-level package. ``all`` installs every one of them.
EXTRA_OF: dict[str, str] = {
    "torch": "torch",
    "cvxpy": "cvxpy",
    "sympy": "sympy",
    "mpmath": "sympy",
    "hypothesis": "hypothesis",
    "matplotlib": "report",
    "rich": "report",
    "sklearn": "bench",
    "dask": "distributed",
    "distributed": "distributed",
    "redis": "distributed",
}


def require(module: str, *, feature: str) -> ModuleType:
    """Import ``module`` (dotted names allowed) for ``feature``, or raise naming the extra to install.

    Raises:
      MissingDependencyError: the module's top-level package is not installed. Any other import
        failure (a broken installation) propagates unchanged.
    """
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != top:
            raise
        extra = EXTRA_OF.get(top, "all")
        raise MissingDependencyError(
            f"{feature} needs the optional package {top!r}, which is not installed; install it with "
            f"`pip install 'attnsvm[{extra}]'` (or `attnsvm[all]` for every feature)",
            name=top,
        ) from exc
