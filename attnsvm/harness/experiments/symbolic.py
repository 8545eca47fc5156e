"""``reproduce`` experiment ``symbolic``: Symbolic identities (SymPy).

Proves the registered identities of :mod:`attnsvm.identities` (tensor trick, softmax calculus, the ½
spectral bound, risk gradients, softmax regression, linear-attention Jacobians) exactly in SymPy and
compares each with the attnsvm function it underlies at random float64 points.

Claim checked: ``all-proved`` (every identity is proved and the code agrees with it).

Structure: :func:`compute_symbolic` (the proofs) → :class:`SymbolicResult` → :func:`check_symbolic`,
:func:`tables_symbolic`, :func:`numbers_symbolic` → :func:`symbolic_experiment` (the registered wiring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..results import ExperimentClaim, ExperimentResult
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import experiment_result

__all__ = [
    "IdentityOutcome",
    "SymbolicResult",
    "compute_symbolic",
    "check_symbolic",
    "tables_symbolic",
    "numbers_symbolic",
    "symbolic_experiment",
]

#: Identities proved at size ``"tiny"`` (the first of the quick subset): seconds for the test suite.
SYMBOLIC_TINY_CLAIMS = 4


# ----------------------------------------------------------------------------- typed results
@dataclass(frozen=True)
class IdentityOutcome:
    """One identity: its proof and the comparison of the code with it.

    Fields: ``claim``/``group``/``statement`` (the registry's name, group and statement); ``proved``
    (SymPy decided every obligation true), ``sizes`` (the sizes proved, e.g. ``"p,q=2,2"``),
    ``obligations`` (how many), ``proof_s`` (seconds), ``failed`` (the first failed obligation, ``""``
    if none); ``code_max_error``/``code_tolerance`` (the code's worst error against the identity at random
    float64 points and its tolerance; NaN when the identity has no code check) and ``code_ok``.
    """

    claim: str
    group: str
    statement: str
    proved: bool
    sizes: tuple[str, ...]
    obligations: int
    proof_s: float
    code_max_error: float
    code_tolerance: float
    code_ok: bool
    failed: str


@dataclass(frozen=True)
class SymbolicResult:
    """The proofs of one run: ``quick`` (the quick subset at its smallest size), ``identities`` (one
    :class:`IdentityOutcome` per identity proved, in registry order) and ``registry_size`` (how many
    identities the registry holds)."""

    quick: bool
    identities: tuple[IdentityOutcome, ...]
    registry_size: int


# ----------------------------------------------------------------------------- compute
def compute_symbolic(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> SymbolicResult:
    """Prove the chosen identities (``size != "paper"``: the quick subset; ``"tiny"``: its first
    :data:`SYMBOLIC_TINY_CLAIMS`) and compare the code with each at points drawn from ``seed``."""
    from ...identities import CLAIMS, prove_all

    quick = size != "paper"
    chosen = [c.name for c in CLAIMS if c.quick or not quick]
    if size == "tiny":
        chosen = chosen[:SYMBOLIC_TINY_CLAIMS]
    out: list[IdentityOutcome] = []
    for k, name in enumerate(chosen):
        (rep,) = prove_all(names=[name], quick=quick, seed=seed)
        out.append(
            IdentityOutcome(
                claim=rep.name,
                group=rep.group,
                statement=rep.statement,
                proved=rep.proof.proved,
                sizes=tuple(rep.proof.sizes),
                obligations=rep.proof.obligations,
                proof_s=rep.proof.seconds,
                code_max_error=rep.code.max_error if rep.code else math.nan,
                code_tolerance=rep.code.tolerance if rep.code else math.nan,
                code_ok=rep.code.ok if rep.code else True,
                failed=rep.proof.failed,
            )
        )
        progress(k + 1, len(chosen))
    return SymbolicResult(quick=quick, identities=tuple(out), registry_size=len(CLAIMS))


# ----------------------------------------------------------------------------- checks
def check_symbolic(result: SymbolicResult, *, size: str) -> list[ExperimentClaim]:
    """``all-proved``: every identity is proved and its code check passes."""
    rows = result.identities
    bad = [r for r in rows if not (r.proved and r.code_ok)]
    return [
        ExperimentClaim(
            name="all-proved",
            statement="every identity is proved exactly and the code agrees with it",
            passed=not bad,
            message=f"{len(rows) - len(bad)}/{len(rows)} proved and matched"
            + (f"; first failure {bad[0].claim}: {bad[0].failed}" if bad else ""),
            severity="check",
        )
    ]


# ----------------------------------------------------------------------------- tables and numbers
def tables_symbolic(result: SymbolicResult) -> dict[str, list[dict[str, Any]]]:
    """The ``identities`` table: one row per identity."""
    rows = [
        {
            "claim": r.claim,
            "group": r.group,
            "statement": r.statement,
            "proved": r.proved,
            "sizes": ", ".join(r.sizes),
            "obligations": r.obligations,
            "proof_s": r.proof_s,
            "code_max_error": r.code_max_error,
            "code_tolerance": r.code_tolerance,
            "code_ok": r.code_ok,
            "failed": r.failed,
        }
        for r in result.identities
    ]
    return {"identities": rows}


def numbers_symbolic(result: SymbolicResult) -> dict[str, Any]:
    """How many identities were proved, out of how many run and how many registered."""
    return {
        "claims": len(result.identities),
        "proved": sum(r.proved for r in result.identities),
        "registry_size": result.registry_size,
    }


# ----------------------------------------------------------------------------- the experiment
@register_experiment(
    "symbolic",
    "Symbolic identities (SymPy)",
    "The identities behind the theory (tensor trick, softmax calculus, the ½ spectral bound, risk "
    "gradients, softmax regression, linear-attention Jacobians), each decided exactly by SymPy and "
    "then compared with the attnsvm function it underlies at random float64 points. Sizes 'tiny' "
    "and 'small' re-prove the quick subset at its smallest size (`prove_all(quick=True)`, seconds; "
    "the full proofs run in `tox -e symbolic`); 'paper' proves every claim at every size.",
    order=70,
)
def symbolic_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Prove the registered identities and check the code against them."""
    result = compute_symbolic(size, seed, device=device, progress=progress)
    return experiment_result(
        "symbolic",
        config={"quick": result.quick},
        tables=tables_symbolic(result),
        numbers=numbers_symbolic(result),
        claims=check_symbolic(result, size=size),
        figures=[],
    )
