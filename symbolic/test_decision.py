"""The decision procedure refuses false statements: every check here must be able to fail.

Each test states a plausible but wrong variant of a proved identity (a swapped Kronecker
order, a sign error, a missing term) and asserts that :func:`attnsvm.identities.decide`
returns ``False`` with a nonzero residual.
"""

from __future__ import annotations

import pytest
import sympy as sp

from attnsvm import identities as I

pytestmark = pytest.mark.timeout(120)


def _mat(name: str, r: int, c: int) -> sp.Matrix:
    return sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{name}_{i}_{j}", real=True))


def _vec(M: sp.Matrix) -> sp.Matrix:
    p, q = M.shape
    return sp.Matrix(p * q, 1, lambda r, _: M[r % p, r // p])


def _vec_r(M: sp.Matrix) -> sp.Matrix:
    p, q = M.shape
    return sp.Matrix(p * q, 1, lambda r, _: M[r // q, r % q])


def test_wrong_kronecker_order_is_refused() -> None:
    A, M, B = _mat("A", 2, 2), _mat("M", 2, 2), _mat("B", 2, 2)
    good = I.Obligation("zero", _vec(A * M * B) - sp.kronecker_product(B.T, A) * _vec(M), "right")
    bad = I.Obligation("zero", _vec(A * M * B) - sp.kronecker_product(A, B.T) * _vec(M), "swapped")
    assert I.decide(good)[0]
    ok, residual = I.decide(bad)
    assert not ok and not residual.is_zero_matrix


def test_row_major_vec_in_the_column_major_identity_is_refused() -> None:
    A, M, B = _mat("A", 2, 3), _mat("M", 3, 2), _mat("B", 2, 2)
    ok, _ = I.decide(
        I.Obligation("zero", _vec_r(A * M * B) - sp.kronecker_product(B.T, A) * _vec_r(M), "mixed")
    )
    assert not ok


def test_wrong_softmax_jacobian_sign_is_refused() -> None:
    l = sp.Matrix(sp.symbols("l0:3", real=True))
    E = sp.symbols("E0:3", positive=True)
    den = sum(I.PosExp(x) for x in l)
    s = sp.Matrix([I.PosExp(x) / den for x in l])
    sub = {I.PosExp(x): e for x, e in zip(l, E, strict=True)}
    wrong = (s.jacobian(l) - (sp.diag(*s) + s * s.T)).xreplace(sub)
    assert not I.decide(I.Obligation("zero", wrong, "diag(s) + ssᵀ"))[0]
    right = (s.jacobian(l) - (sp.diag(*s) - s * s.T)).xreplace(sub)
    assert I.decide(I.Obligation("zero", right, "diag(s) − ssᵀ"))[0]


def test_certificates_must_be_manifest() -> None:
    s = sp.Symbol("s", positive=True)
    assert I.decide(I.Obligation("nonneg", 2 * (s - sp.Rational(1, 2)) ** 2, "square"))[0]
    # true on [0, 1] but not decidable from its form: refused, never guessed
    assert not I.decide(I.Obligation("nonneg", sp.Rational(1, 2) - 2 * s * (1 - s), "expanded"))[0]
    assert not I.decide(I.Obligation("pos", s - 1, "sign unknown"))[0]
    assert not I.decide(I.Obligation("pos", [s, -s], "one negative"))[0]


def test_a_wrong_claim_reports_its_residual() -> None:
    def obligations(T: int) -> list[I.Obligation]:
        x = sp.Symbol("x", real=True)
        return [I.Obligation("zero", sp.diff(I.PosExp(T * x), x) - I.PosExp(T * x), "d/dx e^(Tx) = e^(Tx)?")]

    claim = I.Claim(
        name="wrong",
        group="test",
        statement="d/dx e^(Tx) = e^(Tx)",
        sizes=((1,), (2,)),
        size_names="T",
        obligations=obligations,
        check=lambda rng: [],
        justification="",
    )
    res = claim.prove()
    assert not res.proved and res.failed.startswith("T=2") and res.residual != "0"


def test_wrong_hessian_middle_matrix_is_refused() -> None:
    # B without its rank-one ⟨3f − 2b, f⟩ffᵀ part: the Hessian identity must fail.
    A, x, b = (
        _mat("A", 2, 2),
        sp.Matrix(sp.symbols("x0:2", real=True)),
        sp.Matrix(sp.symbols("b0:2", real=True)),
    )
    y = A * x
    u = sp.Matrix([I.PosExp(t) for t in y])
    f = u / sum(u)
    c = f - b
    L = (c.T * c)[0, 0] / 2
    fb = sp.matrix_multiply_elementwise(f, b)
    ff = sp.matrix_multiply_elementwise(f, f)
    B_wrong = (
        sp.diag(*(2 * ff - fb))
        + ((f.T * b)[0, 0] - (f.T * f)[0, 0]) * sp.diag(*f)
        - (2 * ff - fb) * f.T
        - f * (2 * ff - fb).T
    )
    sub = {I.PosExp(t): sp.Symbol(f"U{k}", positive=True) for k, t in enumerate(y)}
    ok, _ = I.decide(I.Obligation("zero", (sp.hessian(L, x) - A.T * B_wrong * A).xreplace(sub), "B wrong"))
    assert not ok
