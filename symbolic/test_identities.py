"""Every registered identity: proved exactly by SymPy, and the code agrees at random points.

One test per claim of :data:`attnsvm.identities.CLAIMS`. A test fails if a SymPy obligation
does not reduce to 0 (or a certificate is not manifestly positive), or if the lambdified
proved expression and the ``attnsvm`` function differ by more than the claim's named
tolerance (``EVAL_TOL``, ``FD_TOL``, ``FD2_TOL`` in :mod:`attnsvm.identities`, each justified
there by float64 error analysis).
"""

from __future__ import annotations

import pytest

from attnsvm import identities as I
from attnsvm.errors import UnknownNameError

pytestmark = pytest.mark.timeout(120)

GROUPS = {c.group for c in I.CLAIMS}


@pytest.mark.parametrize("name", I.claim_names())
def test_claim_is_proved_and_code_agrees(name: str, check_rng) -> None:
    claim = I.get_claim(name)
    proof = claim.prove()
    assert proof.proved, f"{name}: {proof.failed}: residual {proof.residual}"
    assert proof.residual == "0"
    assert proof.obligations >= len(claim.sizes)
    check = claim.check_code(check_rng)
    bad = [c for c in check.comparisons if not c[1] <= c[2]]
    assert check.ok, f"{name}: code disagrees with the proved expression: {bad}"
    assert check.comparisons, "a claim must be tied to the code"


def test_registry_has_at_least_twenty_distinct_statements() -> None:
    names = I.claim_names()
    assert len(names) == len(set(names)) >= 20
    assert len({c.statement for c in I.CLAIMS}) == len(names)


def test_registry_covers_the_five_items_of_the_issue() -> None:
    assert sorted(g.split()[0] for g in GROUPS) == ["1", "2", "3", "4", "5"]


def test_every_claim_is_proved_at_a_stated_size(claims) -> None:
    for c in claims:
        assert c.sizes and c.statement and c.justification
        assert len(c.size_labels()) == len(c.sizes)


def test_prove_all_quick_runs_the_quick_subset_at_the_smallest_size() -> None:
    reports = I.prove_all(names=["softmax_jacobian", "bilinear_kron"], quick=True)
    assert [r.name for r in reports] == ["softmax_jacobian", "bilinear_kron"]
    assert all(r.ok for r in reports)
    assert reports[0].proof.sizes == (I.get_claim("softmax_jacobian").size_labels()[0],)
    quick_names = [c.name for c in I.CLAIMS if c.quick]
    assert set(quick_names) < set(I.claim_names())  # the slow Hessian is left out of quick


def test_prove_all_without_code_check() -> None:
    (r,) = I.prove_all(names=["frobenius_vec"], check_code=False)
    assert r.code is None and r.ok


def test_unknown_claim_name_is_refused() -> None:
    with pytest.raises(UnknownNameError, match="no_such_claim"):
        I.prove_all(names=["no_such_claim"])
    with pytest.raises(UnknownNameError, match="expected one of"):
        I.get_claim("softmax")


def test_code_check_is_deterministic() -> None:
    c = I.get_claim("risk_grad_logistic")
    assert c.check_code(7).comparisons == c.check_code(7).comparisons
