"""Tensor trick: vec conventions, Att-SVM rows, factorised Gram, margins."""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InvalidInstanceError

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
