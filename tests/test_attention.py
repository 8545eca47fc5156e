"""Attention kinds, logits and outputs."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, NumericalError, UnknownNameError
from attnsvm.model._attention import attention_of, log_softmax, output_of

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
    np.testing.assert_allclose(A.attention(inst, W, kind="softmax"), naive, rtol=0, atol=WEIGHT_ATOL)


def test_softmax_finite_and_exact_at_huge_logits(inst, W):
    big = 1e4 * W  # logits in the thousands: naive exp overflows
    s = A.attention(inst, big, kind="softmax")
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s.sum(axis=1), 1.0, atol=WEIGHT_ATOL)
    log_s = A.log_attention(inst, big, kind="softmax")
    assert np.all(np.isfinite(log_s))  # log weights of −10⁴ are returned, not −inf
    l = A.logits(inst, big)
    # log s_it − log s_iu = l_it − l_iu exactly up to rounding of the logits
    np.testing.assert_allclose(log_s - log_s[:, :1], l - l[:, :1], rtol=0, atol=1e-9 * np.max(np.abs(l)))


def test_linear_is_logits(inst, W):
    np.testing.assert_array_equal(A.attention(inst, W, kind="linear"), A.logits(inst, W))


def test_normalized_linear_definition(inst, W):
    l = _naive_logits(inst, W)
    phi = np.where(l > 0, l + 1.0, np.exp(l))
    naive = phi / phi.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(
        A.attention(inst, W, kind="normalized_linear"), naive, rtol=0, atol=WEIGHT_ATOL
    )


def test_normalized_linear_all_very_negative_logits():
    # Every logit ≈ −1000: φ = e^l underflows to 0 and the naive ratio is 0/0.
    X = np.zeros((1, 3, 2))
    X[0, :, 0] = [1000.0, 1001.0, 1002.0]
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), z=np.array([[1.0, 0.0]]))
    W = -np.eye(2)
    s = A.attention(inst, W, kind="normalized_linear")
    expected = np.exp([0.0, -1.0, -2.0]) / np.exp([0.0, -1.0, -2.0]).sum()  # φ ratio = e^{l − l_max}
    np.testing.assert_allclose(s[0], expected, rtol=0, atol=WEIGHT_ATOL)


def test_output_is_weighted_values(inst, W):
    for kind in A.KINDS:
        s = A.attention(inst, W, kind=kind)
        f = np.array([s[i] @ (inst.X[i] @ inst.v) for i in range(inst.n)])
        np.testing.assert_allclose(A.output(inst, W, kind=kind), f, rtol=1e-13, atol=1e-13)


def test_bad_kind_and_weights(inst, W):
    with pytest.raises(UnknownNameError, match="'softmax', 'linear', 'normalized_linear'"):
        A.attention(inst, W, kind="relu")
    with pytest.raises(UnknownNameError):
        A.output(inst, W, kind="Softmax")
    with pytest.raises(UnknownNameError, match="log_attention"):
        A.log_attention(inst, W, kind="linear")
    with pytest.raises(InvalidInstanceError, match="W must have shape"):
        A.attention(inst, W[:-1])
    with pytest.raises(InvalidInstanceError, match="W must be finite"):
        A.output(inst, np.full_like(W, np.inf))


def test_log_attention_of_linear_kind_lists_the_normalised_kinds(inst, W):
    """``linear`` weights have no logarithm: the refusal names the argument and lists exactly the
    two normalised kinds (documented message of :func:`attnsvm.errors.unknown_name`)."""
    with pytest.raises(UnknownNameError) as info:
        A.log_attention(inst, W, kind="linear")
    assert str(info.value) == (
        "unknown attention kind for log_attention 'linear'; expected one of 'softmax', 'normalized_linear'"
    )


# ------------------------------------------------------------------------------------------------
# Scale contract at the edges of float64 (issue 13 §1, §4): refusal messages, subnormal and
# overflowing intermediates, weights far below the range, and the caller's numpy error state.
# Every instance is hand-built from powers of two so the exact answer is known in closed form.

#: The contract's range as the messages state it (attnsvm.scaling.range_error).
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"
#: mpmath digits for the saturated-weight oracle: e^−1500·2^2000 needs no more than double's 16
#: digits plus the ~4 lost to a log weight of size 1500; 50 leaves a wide margin.
ORACLE_DPS = 50


def _one_sequence(X: list, v: list, z: list) -> A.Instance:
    """One sequence (n = 1), label +1: ``X`` of shape (T, d), ``z`` of shape (d,)."""
    return A.Instance(np.array([X], dtype=float), np.array([1.0]), np.array(v, dtype=float), np.array([z]))


def _exact_logits(inst: A.Instance, W: np.ndarray) -> list[list[Fraction]]:
    """Oracle: ``l_it = Σ_kj x_itk W_kj z_ij`` in exact rational arithmetic (doubles are rationals)."""
    d = inst.d
    return [
        [
            sum(
                (
                    Fraction(x[k]) * Fraction(W[k, j]) * Fraction(inst.z[i, j])
                    for k in range(d)
                    for j in range(d)
                ),
                Fraction(0),
            )
            for x in inst.X[i]
        ]
        for i in range(inst.n)
    ]


def _documented_logit_error(inst: A.Instance, W: np.ndarray) -> np.ndarray:
    """The accuracy :func:`attnsvm.logits` documents per logit (its docstring's "Scale:" line):
    ``d²·eps·Σ_kj |x_k W_kj z_j| + d²·2^−1074·(1 + max|x_i··|·max|W|·max|z_i|)``, in exact arithmetic."""
    d = inst.d
    out = np.zeros((inst.n, inst.T))
    for i in range(inst.n):
        big = (
            Fraction(np.max(np.abs(inst.X[i])))
            * Fraction(np.max(np.abs(W)))
            * Fraction(np.max(np.abs(inst.z[i])))
        )
        for t, x in enumerate(inst.X[i]):
            lam = sum(
                (
                    abs(Fraction(x[k]) * Fraction(W[k, j]) * Fraction(inst.z[i, j]))
                    for k in range(d)
                    for j in range(d)
                ),
                Fraction(0),
            )
            out[i, t] = float(d * d * Fraction(EPS) * lam + d * d * Fraction(2) ** -1074 * (1 + big))
    return out


def test_unknown_kind_message_names_the_argument_and_lists_the_kinds(inst, W):
    """The refusal of an unknown kind is the documented message of
    :func:`attnsvm.errors.unknown_name`: what was wrong, the value given, every valid kind."""
    for fn in (A.attention, A.output, A.log_attention):
        with pytest.raises(UnknownNameError) as info:
            fn(inst, W, kind="relu")
        assert str(info.value) == (
            "unknown attention kind 'relu'; expected one of 'softmax', 'linear', 'normalized_linear'"
        )


def test_log_weight_below_the_range_is_refused_with_its_cause_and_remedy():
    """Logits ±1e308 in one row: ``log s = −2e308`` (exact difference) is below every double. The
    refusal names the weight, says it underflows (not overflows) and what to change."""
    with pytest.raises(NumericalError) as info:
        log_softmax(np.array([[1e308, -1e308]]))
    assert str(info.value) == (
        "an attention weight s_it (its logit is more than 1.8e308 below the row's largest) is below any "
        "double (underflow to 0). Its logarithm is below −1.8e308; scale W down"
    )


def test_one_overflowing_logit_is_named_with_its_size():
    """Only logit ``x_00 W z = 2^600·2^500 = 2^1100`` overflows (the other is 2^500): the refusal
    names the logits, their size ``1e+331`` (oracle: round(1100·log10 2) in mpmath) and the remedy."""
    inst = _one_sequence([[2.0**600], [1.0]], [1.0], [2.0**500])
    k = int(mpmath.nint(1100 * mpmath.log10(2)))
    assert k == 331
    for fn in (A.logits, A.attention, A.output):
        with pytest.raises(NumericalError) as info:
            fn(inst, np.eye(1))
        assert str(info.value) == (
            f"the logits x_itᵀ W z_i is about 1e+{k}: it overflows {RANGE_TEXT}. Scale W (or the data) "
            "down; softmax attention of logits beyond 1.8e308 is not computable"
        )


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_one_overflowing_output_is_named_with_its_size(kind):
    """W = 0: both weights are ½ and both values are ``vᵀx = 2^500·2^600``, so ``f = 2^1100``
    (exact) overflows: the refusal names the outputs and their size ``1e+331`` (mpmath)."""
    inst = _one_sequence([[2.0**600], [2.0**600]], [2.0**500], [1.0])
    k = int(mpmath.nint(1100 * mpmath.log10(2)))
    with pytest.raises(NumericalError) as info:
        A.output(inst, np.zeros((1, 1)), kind=kind)
    assert str(info.value) == f"the outputs f_i = Σ_t s_it vᵀx_it is about 1e+{k}: it overflows {RANGE_TEXT}"


def test_output_below_the_range_is_refused_with_its_size_whatever_the_error_state():
    """Linear kind, hand-derived: logits ``s = (0, 2^−600·2^−350)``, values ``a = (1, 2^−600)``, so
    ``f = Σ|s a| = 2^−1550``, not a double: refused naming the outputs, their size ``1e-467``
    (round(−1550·log10 2), mpmath) and the remedy — also when the caller turned every numpy
    floating-point warning into an exception (the refusal is the library's, not numpy's)."""
    inst = _one_sequence([[1.0, 0.0], [0.0, 2.0**-600]], [1.0, 1.0], [0.0, 2.0**-350])
    W = np.diag([0.0, 1.0])
    k = int(mpmath.nint(-1550 * mpmath.log10(2)))
    assert k == -467
    for state in ("warn", "raise"):
        with np.errstate(all=state), pytest.raises(NumericalError) as info:
            A.output(inst, W, kind="linear")
        assert str(info.value) == (
            "the outputs f_i = Σ_t s_it vᵀx_it (the size Σ_t |s_it vᵀx_it| of a nonzero one) is about "
            f"1e{k}: it underflows {RANGE_TEXT}. Scale v or X up"
        )


def test_output_at_the_smallest_normal_is_returned_and_below_it_refused():
    """Linear kind, one contributing token: ``s = x W z = 2^−511`` and ``a = v x = 2^−511`` give
    ``f = 2^−1022``, the smallest normal double (in range: returned exactly); with ``v = ½``,
    ``f = 2^−1023`` is subnormal and refused (oracle: exact powers of two)."""
    inst = _one_sequence([[2.0**-511], [0.0]], [1.0], [1.0])
    assert A.output(inst, np.eye(1), kind="linear")[0] == 2.0**-1022
    half = _one_sequence([[2.0**-511], [0.0]], [0.5], [1.0])
    with pytest.raises(NumericalError, match=r"is about 1e-308: it underflows"):
        A.output(half, np.eye(1), kind="linear")


def test_weight_far_below_the_range_still_counts_against_a_huge_value():
    """Softmax, logits (0, −1500) (exact: 2^1000·(−1500·2^−1000)), values (0, 2^2000) (not a double):
    ``f = 2^2000·e^−1500/(1 + e^−1500) ≈ 4.2e-50``. The weight e^−1500 is far below the range and
    the value far above it, yet their product is a double and must be returned, not 0.

    Oracle: mpmath at ``ORACLE_DPS`` digits. Tolerance: the log weight −1500 is exact to
    ``T·eps·max|l|`` (log_attention's accuracy), twice over (the log-softmax and the ``e^r·2^k``
    split), which is the relative error of ``f``; ``(d + T)·eps`` for the rest.
    """
    inst = _one_sequence([[0.0], [2.0**1000]], [2.0**1000], [1.0])
    W = np.array([[-1500.0 * 2.0**-1000]])
    np.testing.assert_array_equal(A.logits(inst, W), [[0.0, -1500.0]])
    with mpmath.workdps(ORACLE_DPS):
        exact = mpmath.mpf(2) ** 2000 * mpmath.exp(-1500) / (1 + mpmath.exp(-1500))
        f = A.output(inst, W)
        rel = abs((mpmath.mpf(float(f[0])) - exact) / exact)
    rtol = 2 * inst.T * EPS * 1500.0 + (inst.d + inst.T) * EPS
    assert float(rel) <= rtol


def test_attention_of_gives_float64_weights_for_integer_logits():
    """Integer logits (0, 1): every kind returns float64 weights (hand-derived: softmax
    ``(1, e)/(1 + e)``, linear the logits, normalized linear ``φ = (1, 2)`` over 3)."""
    l = np.array([[0, 1]])
    expected = {
        "softmax": [1 / (1 + math.e), math.e / (1 + math.e)],
        "linear": [0.0, 1.0],
        "normalized_linear": [1 / 3, 2 / 3],
    }
    for kind, want in expected.items():
        s = attention_of(l, kind)
        assert s.dtype == np.float64, kind
        np.testing.assert_allclose(s[0], want, rtol=0, atol=WEIGHT_ATOL)


@pytest.mark.parametrize(
    ("X", "z", "w"),
    [
        # W z = fl(1/3)·2^−1060 is subnormal (rounds to 14 bits) and x = 2^1000 amplifies it
        ([[2.0**1000], [3 * 2.0**998]], [2.0**-1000], math.ldexp(1 / 3, -60)),
        # W z = 2^−1200 underflows to 0 outright, x = 3·2^1000 brings the logit back to 3·2^−200
        ([[3 * 2.0**1000], [2.0**1000]], [2.0**-600], 2.0**-600),
    ],
    ids=["subnormal-Wz", "Wz-underflows-to-0"],
)
def test_logits_keep_their_digits_when_w_z_is_below_the_range(X, z, w):
    """An intermediate ``W z_i`` below the normal range, multiplied by a huge ``x``: the logits are
    normal doubles and must come back to the documented accuracy (here ``≈ eps`` relative), not
    with the intermediate's lost digits (or as 0), whatever the caller's numpy error state.

    Oracle: exact rational arithmetic; tolerance: the bound logits' docstring states."""
    inst = _one_sequence(X, [1.0], z)
    W = np.array([[w]])
    exact = _exact_logits(inst, W)
    bound = _documented_logit_error(inst, W)
    with np.errstate(all="raise"):
        got = A.logits(inst, W)
    for t in range(inst.T):
        assert abs(Fraction(got[0, t]) - exact[0][t]) <= Fraction(bound[0, t]), t


def test_logits_of_a_tiny_entry_next_to_a_huge_one_are_exact():
    """Token 0 is ``(0, 2^−80, 0)`` in a sequence whose largest entry is 2^1000 (2^1080 times
    larger), and ``W z = (2^−969, 2^1000, 0)``: the logits ``(2^920, 2^31)`` are doubles, exactly
    representable, and must come back exactly (oracle: exact powers of two) — not as 0, which
    would flip the softmax from token 0 to token 1."""
    inst = _one_sequence([[0.0, 2.0**-80, 0.0], [2.0**1000, 0.0, 0.0]], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0])
    W = np.diag([2.0**-969, 2.0**1000, 1.0])
    assert [float(q) for q in _exact_logits(inst, W)[0]] == [2.0**920, 2.0**31]
    np.testing.assert_array_equal(A.logits(inst, W), [[2.0**920, 2.0**31]])
    np.testing.assert_array_equal(A.attention(inst, W), [[1.0, 0.0]])


def test_logits_whose_plain_product_is_inf_minus_inf_are_exact_without_warnings():
    """``W z = 2^1200`` overflows, so the plain product gives ``(+inf, −inf)`` (and ``inf − inf`` in
    its finiteness check); the logits ``±2^−600·2^1200 = ±2^600`` are doubles and come back exactly
    (oracle: exact powers of two), with no numpy warning or exception (caller's state ``raise``)."""
    inst = _one_sequence([[2.0**-600], [-(2.0**-600)]], [1.0], [2.0**600])
    with np.errstate(all="raise"):
        got = A.logits(inst, np.array([[2.0**600]]))
    np.testing.assert_array_equal(got, [[2.0**600, -(2.0**600)]])


def test_subnormal_logits_are_returned_whatever_the_error_state():
    """``l = x·2^−600·2^−600`` with ``x = fl(1/3)·2^140, 2^140``: subnormal logits (≈ 5461.3 and
    16384 units of 2^−1074), returned to the documented absolute accuracy ``d²·2^−1074·(1 + …)``
    (oracle: exact rational arithmetic) with the caller's numpy error state set to ``raise``."""
    inst = _one_sequence([[math.ldexp(1 / 3, 140)], [2.0**140]], [1.0], [2.0**-600])
    W = np.array([[2.0**-600]])
    exact = _exact_logits(inst, W)
    bound = _documented_logit_error(inst, W)
    with np.errstate(all="raise"):
        got = A.logits(inst, W)
    assert 0 < got[0, 0] < 2.0**-1022
    for t in range(inst.T):
        assert abs(Fraction(got[0, t]) - exact[0][t]) <= Fraction(bound[0, t]), t


def test_output_of_log_weights_far_below_the_range_whatever_the_error_state():
    """Log weights ``(0, −800)`` (``s = (1, e^−800)``, hand-derived) on values ``(1, 1)``: the second
    term is ``e^−800`` below the first and is lost to rounding, ``f = 1`` (oracle: mpmath
    ``1 + e^−800`` rounded to a double), with the caller's numpy error state set to ``raise``."""
    X = np.array([[[1.0], [1.0]]])
    with np.errstate(all="raise"):
        f = output_of(np.array([[1.0, 0.0]]), X, np.array([1.0]), log_s=np.array([[0.0, -800.0]]))
    with mpmath.workdps(ORACLE_DPS):
        assert f[0] == float(1 + mpmath.exp(-800))


def test_saturated_weights_never_raise_a_floating_point_error_under_a_strict_error_state() -> None:
    """Regression: exp of a log weight below −745 raised ``FloatingPointError`` under
    ``np.errstate(all="raise")``. Oracle, exact: logits (0, −800) give weights (1, e^−800) with
    e^−800 ≈ 1e-348 below 2^−1074 (0 to the documented absolute accuracy), and values (1, 2) give
    f = (1 + 2e^−800)/(1 + e^−800), which rounds to 1."""
    inst = A.Instance(np.array([[[1.0], [2.0]]]), np.ones(1), np.ones(1), np.ones((1, 1)))
    W = np.array([[-800.0]])
    with np.errstate(all="raise"):
        assert A.attention(inst, W).tolist() == [[1.0, 0.0]]
        assert A.attention(inst, W, kind="normalized_linear").tolist() == [[1.0, 0.0]]
        assert A.log_attention(inst, W).tolist() == [[0.0, -800.0]]
        assert A.output(inst, W).tolist() == [1.0]


def test_output_underflow_message_quotes_the_true_size_of_weights_below_the_clamp() -> None:
    """Regression: the quoted size came from log weights clamped at −5000 ("about 1e-1840"). Oracle,
    mpmath: logits (0, −10^6), values (0, 2^1100), so f = e^(−10^6)·2^1100 and
    log10 f = (−10^6 + 1100 ln 2)/ln 10 ≈ −433963.35."""
    inst = A.Instance(np.array([[[0.0], [2.0**600]]]), np.ones(1), np.array([2.0**500]), np.ones((1, 1)))
    exponent = int(mpmath.nint((-(10**6) + 1100 * mpmath.log(2)) / mpmath.log(10)))
    with pytest.raises(NumericalError, match=rf"about 1e{exponent}: it underflows"):
        A.output(inst, np.array([[-1e6 * 2.0**-600]]))
