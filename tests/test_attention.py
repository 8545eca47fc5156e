"""Attention kinds, logits and outputs."""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, UnknownNameError

EPS = np.finfo(np.float64).eps
#: softmax/normalised weights are O(1) numbers obtained through one exp, one sum of T terms
#: and one log; their absolute error is a small multiple of T·eps.
WEIGHT_ATOL = 32 * EPS


def _naive_logits(inst, W):
    return np.array([[inst.X[i, t] @ W @ inst.z[i] for t in range(inst.T)] for i in range(inst.n)])


def test_logits_definition(inst, W):
    np.testing.assert_allclose(A.logits(inst, W), _naive_logits(inst, W), rtol=0, atol=1e-13)


def test_logits_not_transposed(inst, W):
    # A transposed convention x zᵀ instead of xᵀ W z would give these; they differ for generic W.
    wrong = np.array([[inst.z[i] @ W @ inst.X[i, t] for t in range(inst.T)] for i in range(inst.n)])
    assert np.max(np.abs(A.logits(inst, W) - wrong)) > 1e-3


def test_softmax_matches_naive_at_moderate_logits(inst, W):
    l = _naive_logits(inst, W)
    naive = np.exp(l) / np.exp(l).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(A.attention(inst, W, "softmax"), naive, rtol=0, atol=WEIGHT_ATOL)


def test_softmax_finite_and_exact_at_huge_logits(inst, W):
    big = 1e4 * W  # logits in the thousands: naive exp overflows
    s = A.attention(inst, big, "softmax")
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s.sum(axis=1), 1.0, atol=WEIGHT_ATOL)
    log_s = A.log_attention(inst, big, "softmax")
    assert np.all(np.isfinite(log_s))  # log weights of −10⁴ are returned, not −inf
    l = A.logits(inst, big)
    # log s_it − log s_iu = l_it − l_iu exactly up to rounding of the logits
    np.testing.assert_allclose(log_s - log_s[:, :1], l - l[:, :1], rtol=0, atol=1e-9 * np.max(np.abs(l)))


def test_linear_is_logits(inst, W):
    np.testing.assert_array_equal(A.attention(inst, W, "linear"), A.logits(inst, W))


def test_normalized_linear_definition(inst, W):
    l = _naive_logits(inst, W)
    phi = np.where(l > 0, l + 1.0, np.exp(l))
    naive = phi / phi.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(A.attention(inst, W, "normalized_linear"), naive, rtol=0, atol=WEIGHT_ATOL)


def test_normalized_linear_all_very_negative_logits():
    # Every logit ≈ −1000: φ = e^l underflows to 0 and the naive ratio is 0/0.
    X = np.zeros((1, 3, 2))
    X[0, :, 0] = [1000.0, 1001.0, 1002.0]
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))
    W = -np.eye(2)
    s = A.attention(inst, W, "normalized_linear")
    expected = np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()  # φ ratio = e^{l − l_max}
    np.testing.assert_allclose(s[0], expected, rtol=0, atol=WEIGHT_ATOL)


def test_output_is_weighted_values(inst, W):
    for kind in A.KINDS:
        s = A.attention(inst, W, kind)
        f = np.array([s[i] @ (inst.X[i] @ inst.v) for i in range(inst.n)])
        np.testing.assert_allclose(A.output(inst, W, kind), f, rtol=1e-13, atol=1e-13)


def test_bad_kind_and_weights(inst, W):
    with pytest.raises(UnknownNameError, match="'softmax', 'linear', 'normalized_linear'"):
        A.attention(inst, W, "relu")
    with pytest.raises(UnknownNameError):
        A.output(inst, W, "Softmax")
    with pytest.raises(UnknownNameError, match="log_attention"):
        A.log_attention(inst, W, "linear")
    with pytest.raises(InvalidInstanceError, match="W must have shape"):
        A.attention(inst, W[:-1])
    with pytest.raises(InvalidInstanceError, match="W must be finite"):
        A.output(inst, np.full_like(W, np.inf))


def test_log_attention_of_linear_kind_lists_the_normalised_kinds(inst, W):
    """``linear`` weights have no logarithm: the refusal names the argument and lists exactly the
    two normalised kinds (documented message of :func:`attnsvm.errors.unknown_name`)."""
    with pytest.raises(UnknownNameError) as info:
        A.log_attention(inst, W, "linear")
    assert str(info.value) == (
        "unknown attention kind for log_attention 'linear'; expected one of 'softmax', 'normalized_linear'"
    )
