"""Error classes of attnsvm.

Every error raised on bad input derives from :class:`AttnSVMError`, itself a
``ValueError``, so ``except ValueError`` keeps working for callers that do not
know this package. Each message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AttnSVMError",
    "InvalidInstanceError",
    "TiedScoresError",
    "UnknownNameError",
    "InfeasibleSVMError",
    "SolverError",
    "NumericalError",
    "MissingDependencyError",
    "RenamedSettingError",
]


class AttnSVMError(ValueError):
    """Base class of every error attnsvm raises on purpose."""


class InvalidInstanceError(AttnSVMError):
    """An array handed to attnsvm has the wrong type, shape or values."""


class TiedScoresError(InvalidInstanceError):
    """Two tokens of one sequence share the best score, so ``opt`` is undefined."""


class UnknownNameError(AttnSVMError):
    """A name (attention kind, loss, method, family, ...) is not one attnsvm knows."""


class InfeasibleSVMError(AttnSVMError):
    """The Att-SVM constraints for the requested token choice cannot all be met."""


class SolverError(AttnSVMError):
    """A numerical solver did not return a certified optimal solution."""


class NumericalError(AttnSVMError):
    """A quantity is not representable in float64 (overflow, 0/0) and was not returned."""


class MissingDependencyError(AttnSVMError, ImportError):
    """A feature needs an optional package that is not installed; the message names the extra.

    Also an ``ImportError``, so ``except ImportError`` (the usual probe for optional packages) catches it.
    """

    def __init__(self, message: str, *, name: str) -> None:
        AttnSVMError.__init__(self, message)
        self.name = name


def unknown_name(what: str, given: object, valid: "tuple[str, ...] | list[str]") -> UnknownNameError:
    """Build the error for an unknown name, listing the valid ones."""
    names = ", ".join(repr(v) for v in valid)
    return UnknownNameError(f"unknown {what} {given!r}; expected one of {names}")


class RenamedSettingError(AttnSVMError):
    """A setting (an environment variable) is given under a name attnsvm no longer reads; the message names the
    new one, so a user's setting is never silently ignored."""
