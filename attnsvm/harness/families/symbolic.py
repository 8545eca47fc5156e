"""``reproduce`` family ``symbolic``: Symbolic identities (SymPy)."""

from __future__ import annotations

import math
from typing import Any

from ..experiments import FAMILY_REGISTRY, FamilyResult, ProgressFn, register_family

__all__ = ["symbolic_family"]


# =================================================================== family: symbolic
@register_family(
    "symbolic",
    "Symbolic identities (SymPy)",
    "The identities behind the theory (tensor trick, softmax calculus, the ½ spectral bound, risk "
    "gradients, softmax regression, linear-attention Jacobians), each decided exactly by SymPy and "
    "then compared with the attnsvm function it underlies at random float64 points. Sizes 'tiny' "
    "and 'small' re-prove the quick subset at its smallest size (`prove_all(quick=True)`, seconds; "
    "the full proofs run in `tox -e symbolic`); 'paper' proves every claim at every size.",
    order=70,
)
def symbolic_family(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> FamilyResult:
    """Prove the registered identities and check the code against them."""
    from ...identities import CLAIMS, prove_all

    spec = FAMILY_REGISTRY["symbolic"]
    quick = size != "paper"
    res = FamilyResult(spec.name, spec.title, spec.description, config={"quick": quick})
    chosen = [c.name for c in CLAIMS if c.quick or not quick]
    if size == "tiny":
        chosen = chosen[:4]
    rows: list[dict[str, Any]] = []
    for k, name in enumerate(chosen):
        (rep,) = prove_all(names=[name], quick=quick, seed=seed)
        rows.append(
            {
                "claim": rep.name,
                "group": rep.group,
                "statement": rep.statement,
                "proved": rep.proof.proved,
                "sizes": ", ".join(rep.proof.sizes),
                "obligations": rep.proof.obligations,
                "proof_s": rep.proof.seconds,
                "code_max_error": rep.code.max_error if rep.code else math.nan,
                "code_tolerance": rep.code.tolerance if rep.code else math.nan,
                "code_ok": rep.code.ok if rep.code else True,
                "failed": rep.proof.failed,
            }
        )
        progress(k + 1, len(chosen))
    res.tables["identities"] = rows
    bad = [r for r in rows if not (r["proved"] and r["code_ok"])]
    res.numbers.update(claims=len(rows), proved=sum(r["proved"] for r in rows), registry_size=len(CLAIMS))
    res.claim(
        "all-proved",
        "every identity is proved exactly and the code agrees with it",
        not bad,
        f"{len(rows) - len(bad)}/{len(rows)} proved and matched"
        + (f"; first failure {bad[0]['claim']}: {bad[0]['failed']}" if bad else ""),
    )
    return res
