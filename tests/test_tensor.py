"""Tensor trick: vec conventions, Att-SVM rows, factorised Gram, margins."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, NumericalError

#: products of O(1) entries summed over ≤ 64 terms: absolute error ≤ 64·eps·Σ|terms| ≈ 1e-13.
SUM_ATOL = 1e-12


def test_vec_is_column_major():
    M = np.arange(6.0).reshape(2, 3)  # [[0,1,2],[3,4,5]]
    np.testing.assert_array_equal(A.vec(M), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
    np.testing.assert_array_equal(A.vec_rowmajor(M), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(A.unvec(A.vec(M), (2, 3)), M)
    np.testing.assert_array_equal(A.unvec_rowmajor(A.vec_rowmajor(M), (2, 3)), M)
    with pytest.raises(InvalidInstanceError, match="shape \\(2, 2\\) needs 4"):
        A.unvec(np.zeros(5), (2, 2))


def test_kronecker_identities():
    rng = np.random.default_rng(0)
    Am, M, B = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    np.testing.assert_allclose(A.vec(Am @ M @ B), np.kron(B.T, Am) @ A.vec(M), atol=SUM_ATOL)
    A1, Xm, A2 = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((2, 5))
    np.testing.assert_allclose(
        A.vec_rowmajor(A1 @ Xm @ A2.T), np.kron(A1, A2) @ A.vec_rowmajor(Xm), atol=SUM_ATOL
    )
    x, W, z = rng.standard_normal(4), rng.standard_normal((4, 4)), rng.standard_normal(4)
    assert x @ W @ z == pytest.approx(np.kron(z, x) @ A.vec(W), abs=SUM_ATOL)


def test_svm_rows_definition_and_order(inst):
    alpha = np.array([1, 0, 5, 2])
    R = A.svm_rows(inst, alpha)
    expected, pairs = [], []
    for i in range(inst.n):
        for t in range(inst.T):
            if t != alpha[i]:
                expected.append(np.kron(inst.z[i], inst.X[i, alpha[i]] - inst.X[i, t]))
                pairs.append((i, t))
    np.testing.assert_allclose(R, np.array(expected), atol=SUM_ATOL)
    c = A.svm_constraints(inst, alpha)
    np.testing.assert_array_equal(c.pairs, pairs)
    assert R.shape == (inst.n * (inst.T - 1), inst.d**2)


def test_rows_act_on_vec_as_constraints(inst, W):
    alpha = inst.optimal_tokens()
    R = A.svm_rows(inst)
    c = A.svm_constraints(inst)
    direct = np.array([(inst.X[i, alpha[i]] - inst.X[i, t]) @ W @ inst.z[i] for i, t in c.pairs])
    np.testing.assert_allclose(R @ A.vec(W), direct, atol=SUM_ATOL)
    np.testing.assert_allclose(A.svm_margins(inst, W), direct, atol=SUM_ATOL)
    # a row-major vec would not satisfy this for generic W
    assert np.max(np.abs(R @ A.vec_rowmajor(W) - direct)) > 1e-3


def test_factorised_gram(inst):
    for alpha in (None, np.array([0, 1, 2, 3])):
        R = A.svm_rows(inst, alpha)
        np.testing.assert_allclose(A.svm_gram(inst, alpha), R @ R.T, atol=SUM_ATOL * 10)


def test_bad_alpha(inst):
    with pytest.raises(InvalidInstanceError, match="out of range"):
        A.svm_rows(inst, [0, 0, 0, 6])
    with pytest.raises(InvalidInstanceError, match="shape"):
        A.svm_gram(inst, [0, 0])


def test_out_of_range_row_and_gram_messages_give_the_entry_size():
    """n = T - 1 = d = 1, x_0 = 2^600, x_1 = 0, z = 2^500 (hand-derived): the one row entry is
    z·Δ = 2^1100 ≈ 1e+331 and the Gram entry (z·z)(Δ·Δ) = 2^2200 ≈ 1e+662; the messages state
    those decimal exponents (round(k·log10 2)) exactly."""
    inst = A.Instance(
        np.array([[[2.0**600], [0.0]]]), np.array([1.0]), np.array([1.0]), np.array([[2.0**500]])
    )
    row_exp, gram_exp = round(1100 * math.log10(2.0)), round(2200 * math.log10(2.0))
    assert (row_exp, gram_exp) == (331, 662)
    tail = ": it overflows float64's normal range [2.2e-308, 1.8e308]"
    with pytest.raises(NumericalError) as info:
        A.svm_rows(inst, [0])
    assert (
        str(info.value) == f"an Att-SVM row entry z_ij·Δ_itk is about 1e+{row_exp}{tail}. Scale X or z down"
    )
    with pytest.raises(NumericalError) as info:
        A.svm_gram(inst, [0])
    assert str(info.value) == f"an Att-SVM Gram entry (z_i·z_j)(Δ_it·Δ_ju) is about 1e+{gram_exp}{tail}"


def test_out_of_range_refusals_do_not_depend_on_the_callers_error_state():
    """X, z ×2^-300 (Gram entries ≈ 2^-1200, oracle: exact scaling of the O(1) Gram at scale 1) and
    X, z ×2^-600 (rows ≈ 2^-1200): the library's NumericalError comes back even when the caller has
    turned every floating-point warning into an exception."""
    inst0 = A.random_instance(2, 3, 4, seed=3)
    small = A.Instance(np.ldexp(inst0.X, -300), inst0.Y, inst0.v, np.ldexp(inst0.z, -300))
    tiny = A.Instance(np.ldexp(inst0.X, -600), inst0.Y, inst0.v, np.ldexp(inst0.z, -600))
    with np.errstate(all="raise"):
        with pytest.raises(NumericalError, match="Gram entry .*underflows"):
            A.svm_gram(small)
        with pytest.raises(NumericalError, match="underflows"):
            A.svm_rows(tiny)


def test_gram_diagonal_at_the_smallest_normal_is_returned_exactly():
    """z = 2^-256, Δ = 2^-255 (d = 1, hand-derived): ||z||²·||Δ||² = 2^-1022, the smallest normal
    double, is in range and returned exactly."""
    inst = A.Instance(
        np.array([[[2.0**-255], [0.0]]]), np.array([1.0]), np.array([1.0]), np.array([[2.0**-256]])
    )
    np.testing.assert_array_equal(A.svm_gram(inst, [0]), [[2.0**-1022]])


def test_gram_underflow_message_names_the_first_small_diagonal_entry():
    """z = 2^-300, Δ_1 = −2^-300, Δ_2 = −2^-350 (hand-derived): diagonal entries 2^-1200 and 2^-1300
    are both below the range; the message gives the first one's exponent round(−1200·log10 2) = −361."""
    X = np.array([[[0.0], [2.0**-300], [2.0**-350]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0]), np.array([[2.0**-300]]))
    expected_exp = round(-1200 * math.log10(2.0))
    assert expected_exp == -361
    with pytest.raises(NumericalError) as info:
        A.svm_gram(inst, [0])
    assert str(info.value) == (
        f"a diagonal Att-SVM Gram entry ||z_i||²·||Δ_it||² is about 1e{expected_exp}: it underflows "
        "float64's normal range [2.2e-308, 1.8e308]. Scale X or z up (the Att-SVM solution scales as "
        "W_mm(cX, cz) = W_mm(X, z)/c²)"
    )
