"""Regression tests for the scale contract of the model core (issue 13 §1).

Every case below was a silent wrong answer (a 0, an Inf, a NaN, a spurious tie) before the
fix. Oracles: an mpmath evaluation at ``ORACLE_DPS`` digits from the exact float64 inputs
(mpmath numbers neither overflow nor underflow), and exact power-of-two equivariances (the
answer at scale 1, moved by the known factor).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError, TiedScoresError
from attnsvm.model._grad import GradientRangeError
from attnsvm.scaling import FLOAT_MAX, FLOAT_TINY, LOG_FLOAT_MAX, LOG_FLOAT_TINY

EPS = float(np.finfo(np.float64).eps)
#: Digits of the mpmath oracle: 50 leave > 30 correct digits after the logits' own spread at
#: the ``||W||`` used here (logits of size ≤ 1e3 lose ≤ 3 of them in ``exp``).
ORACLE_DPS = 50
#: Relative (normwise) accuracy asked of a gradient or direction: nT(d+T)·eps with n ≤ 3,
#: T ≤ 4, d ≤ 5 (each weight is a product of a few log-sum-exp terms, each entry of G a sum of
#: nT products) is ≤ 108·eps; 256·eps leaves a factor 2 for the logits' rounding.
GRAD_RTOL = 256 * EPS
#: Absolute accuracy of log||∇L||: the log weights are sums of a few logs of size ≤ 1e3.
LOG_NORM_ATOL = 1e-10
LN2 = math.log(2.0)


def mp_log_grad(
    inst: A.Instance, W: np.ndarray, loss: str = "logistic", *, dps: int | None = None
) -> tuple[mpmath.mpf, np.ndarray]:
    """``(log||∇L||_F, ∇L/||∇L||_F)`` in mpmath from the exact float64 inputs (independent oracle).

    ``∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ`` (``a_it − f_i`` as
    ``Σ_u s_iu (a_it − a_iu)``, exact at any saturation) with every quantity an
    ``ORACLE_DPS``-digit number, or ``dps`` digits (no over- or underflow at any scale).
    """
    with mpmath.workdps(dps or ORACLE_DPS):
        mpf = mpmath.mpf
        n, T, d = inst.shape
        Wm = mpmath.matrix([[mpf(float(W[k, j])) for j in range(d)] for k in range(d)])
        v = mpmath.matrix([mpf(float(c)) for c in inst.v])
        G = mpmath.zeros(d, d)
        for i in range(n):
            z = mpmath.matrix([mpf(float(c)) for c in inst.z[i]])
            xs = [mpmath.matrix([mpf(float(c)) for c in inst.X[i, t]]) for t in range(T)]
            Wz = Wm * z
            lg = [sum(x[k] * Wz[k] for k in range(d)) for x in xs]
            a = [sum(x[k] * v[k] for k in range(d)) for x in xs]
            m = max(lg)
            e = [mpmath.exp(li - m) for li in lg]
            tot = mpmath.fsum(e)
            s = [ei / tot for ei in e]
            f = mpmath.fsum(si * ai for si, ai in zip(s, a, strict=True))
            u = mpf(float(inst.Y[i])) * f
            dl = {
                "logistic": -1 / (1 + mpmath.exp(u)),
                "exponential": -mpmath.exp(-u),
                "correlation": mpf(-1),
            }[loss]
            for t in range(T):
                # a_it − f_i in the centred form Σ_u s_iu (a_it − a_iu): the textbook difference
                # loses every digit once a weight is below 10^−dps (strong saturation).
                c = mpmath.fsum(su * (a[t] - au) for su, au in zip(s, a, strict=True))
                w = dl * mpf(float(inst.Y[i])) * s[t] * c / n
                G += w * xs[t] * z.T
        nrm = mpmath.sqrt(mpmath.fsum(G[k, j] ** 2 for k in range(d) for j in range(d)))
        direction = np.array([[float(G[k, j] / nrm) for j in range(d)] for k in range(d)])
        return mpmath.log(nrm), direction


def _case() -> tuple[A.Instance, np.ndarray]:
    inst = A.random_instance(3, 4, 5, seed=8)
    W = np.random.default_rng(1).standard_normal((5, 5))
    return inst, W


def _scale(inst: A.Instance, jx: int, jz: int, jv: int) -> A.Instance:
    return A.Instance(np.ldexp(inst.X, jx), inst.Y, np.ldexp(inst.v, jv), np.ldexp(inst.z, jz))


# ------------------------------------------------------------------------- risk_grad
def test_risk_grad_refuses_a_gradient_below_the_range_instead_of_zeros() -> None:
    """Issue 13: data ×2^−415 (≈1e-125), W ×2^830 (logits kept): ||∇L|| ≈ 1e-376 came back as 0.

    Oracle: mpmath log||∇L|| (below log FLOAT_TINY, so refusing is right) and mpmath direction.
    """
    inst0, W0 = _case()
    inst = _scale(inst0, -415, -415, -415)
    W = np.ldexp(W0, 830)
    log_norm, direction = mp_log_grad(inst, W)
    assert log_norm < LOG_FLOAT_TINY
    with pytest.raises(
        GradientRangeError, match=r"underflows float64's normal range.*normalized_risk_grad"
    ) as ei:
        A.risk_grad(inst, W)
    assert abs(ei.value.log_norm - float(log_norm)) <= LOG_NORM_ATOL  # engines read the exact size
    D = A.normalized_risk_grad(inst, W)
    assert abs(D.log_norm - float(log_norm)) <= LOG_NORM_ATOL
    assert np.linalg.norm(D.direction - direction) <= GRAD_RTOL


@pytest.mark.parametrize("j", [-350, -352, -354, -356])
def test_risk_grad_refuses_the_subnormal_band(j: int) -> None:
    """Issue 13: ||∇L|| in the subnormal band lost digits silently (direction error 2.6e-5).

    Oracle: mpmath log||∇L||. Below FLOAT_TINY risk_grad raises; where it returns, it is right
    to GRAD_RTOL normwise. The normalized direction is right in every case.
    """
    inst0, W0 = _case()
    inst = _scale(inst0, j, j, 0)
    W = np.ldexp(W0, -2 * j)  # logits unchanged
    log_norm, direction = mp_log_grad(inst, W)
    assert LOG_FLOAT_TINY - 40 < log_norm < LOG_FLOAT_TINY + 40  # the band around FLOAT_TINY
    if log_norm < LOG_FLOAT_TINY:
        with pytest.raises(NumericalError, match="underflows"):
            A.risk_grad(inst, W)
    else:
        G = A.risk_grad(inst, W)
        ref = direction * float(mpmath.exp(log_norm))
        assert np.linalg.norm(G - ref) <= GRAD_RTOL * float(mpmath.exp(log_norm))
    D = A.normalized_risk_grad(inst, W)
    assert np.linalg.norm(D.direction - direction) <= GRAD_RTOL
    assert abs(D.log_norm - float(log_norm)) <= LOG_NORM_ATOL


def test_risk_grad_refuses_an_overflowing_gradient_instead_of_inf() -> None:
    """Issue 13: an overflowing gradient came back as ``inf``. Oracle: mpmath log||∇L|| > log FLOAT_MAX."""
    inst0, W0 = _case()
    inst = _scale(inst0, 350, 350, 0)
    W = np.ldexp(W0, -700)
    log_norm, direction = mp_log_grad(inst, W)
    assert log_norm > LOG_FLOAT_MAX
    with pytest.raises(NumericalError, match=r"overflows float64's normal range.*normalized_risk_grad"):
        A.risk_grad(inst, W)
    D = A.normalized_risk_grad(inst, W)
    assert np.linalg.norm(D.direction - direction) <= GRAD_RTOL
    assert abs(D.log_norm - float(log_norm)) <= LOG_NORM_ATOL


@pytest.mark.parametrize(("jx", "jz"), [(500, 510), (-500, -500), (-480, -530)])
def test_risk_grad_near_the_ends_equals_the_rescaled_gradient(jx: int, jz: int) -> None:
    """Equivariance oracle: X → 2^jx X, z → 2^jz z, v → 2^−jx v, W → 2^−(jx+jz) W keeps the logits
    and the outputs, so ∇L → 2^(jx+jz) ∇L exactly in exact arithmetic (here ||∇L|| near 1e±307)."""
    inst0, W0 = _case()
    G0 = A.risk_grad(inst0, W0)
    G = A.risk_grad(_scale(inst0, jx, jz, -jx), np.ldexp(W0, -(jx + jz)))
    assert np.linalg.norm(np.ldexp(G, -(jx + jz)) - G0) <= GRAD_RTOL * np.linalg.norm(G0)


# ------------------------------------------------------------ normalized direction
def test_normalized_direction_survives_data_at_1e200() -> None:
    """Issue 13: ``attnsvm gd`` on data ×1e200 said "contributions cancel" (the cause was overflow).

    X, z ×2^664 (≈1e200), v ×2^−664 (outputs kept), W ×2^−664 (logits kept, jz = 0 part of it):
    oracle the direction at scale 1 (invariant) and log_norm + 664·ln2 (the known factor).
    """
    inst0, W0 = _case()
    D0 = A.normalized_risk_grad(inst0, W0)
    inst = _scale(inst0, 664, 0, -664)
    D = A.normalized_risk_grad(inst, np.ldexp(W0, -664))
    assert np.linalg.norm(D.direction - D0.direction) <= GRAD_RTOL
    assert abs(D.log_norm - (D0.log_norm + 664 * LN2)) <= LOG_NORM_ATOL


def test_normalized_direction_names_overflowing_outputs() -> None:
    """X, z, v all ×2^664: the outputs f_i ≈ 1e400 are not doubles, so the loss ℓ'(Y f) is not
    computable: the error names the outputs and the range (oracle: |f| from mpmath > FLOAT_MAX)."""
    inst0, _ = _case()
    inst = _scale(inst0, 664, 664, 664)
    with mpmath.workdps(30):
        f_max = max(
            abs(
                mpmath.fsum(
                    mpmath.mpf(float(x)) * mpmath.mpf(float(c)) for x, c in zip(row, inst.v, strict=True)
                )
            )
            for seq in inst.X
            for row in seq
        )
    assert f_max > FLOAT_MAX
    for fn in (A.normalized_risk_grad, A.risk_grad, A.risk):
        with pytest.raises(NumericalError, match=r"outputs f_i .*overflows float64's normal range"):
            fn(inst, np.zeros((5, 5)))


def test_logits_that_overflow_are_named() -> None:
    """Logits x W z beyond 1.8e308 (X, z ×2^520, W unit-size): every consumer names the logits
    (oracle: the mpmath logit exceeds FLOAT_MAX); before, the softmax returned NaN."""
    inst0, W0 = _case()
    inst = _scale(inst0, 520, 520, -520)
    with mpmath.workdps(30):
        lg = max(
            abs(
                mpmath.fsum(
                    mpmath.mpf(float(x[k])) * mpmath.mpf(float(W0[k, j])) * mpmath.mpf(float(inst.z[i, j]))
                    for k in range(5)
                    for j in range(5)
                )
            )
            for i in range(inst.n)
            for x in inst.X[i]
        )
    assert lg > FLOAT_MAX
    for fn in (A.attention, A.log_attention, A.output, A.logits, A.risk, A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError, match=r"logits x_itᵀ W z_i is about 1e\+\d+: it overflows"):
            fn(inst, W0)


# ------------------------------------------------------------------ optimal tokens
@pytest.mark.parametrize("j", [-1000, -664, 664, 1000])
def test_optimal_tokens_are_scale_invariant(j: int) -> None:
    """Issue 13: at data scale 1e-200 every sequence was "tied"; at 1e200 the scores overflowed.

    Oracle: argmax_t Y_i vᵀx_it is invariant under X → cX and v → cv (c > 0).
    """
    inst0 = A.random_instance(3, 4, 5, seed=8)
    ref = inst0.optimal_tokens()
    for jx, jv in ((j, 0), (0, j), (j // 2, j // 2)):
        inst = _scale(inst0, jx, 0, jv) if abs(jx) < 1000 else _scale(inst0, jx, 0, 0)
        np.testing.assert_array_equal(inst.optimal_tokens(), ref)


@pytest.mark.parametrize("j", [-1000, 0, 1000])
def test_exact_ties_are_ties_at_every_scale(j: int) -> None:
    """A duplicated best token is a tie at every scale (oracle: the two scores are equal exactly)."""
    X = np.array([[[1.0, 2.0], [1.0, 2.0], [0.0, -1.0]]])
    inst = A.Instance(np.ldexp(X, j), np.array([1.0]), np.array([1.0, 1.0]), np.ones((1, 2)))
    with pytest.raises(TiedScoresError, match="sequence 0"):
        inst.optimal_tokens()


def test_token_values_that_overflow_are_named() -> None:
    """vᵀx beyond 1.8e308 (oracle: 2^1023·4 exactly): values/scores raise naming them."""
    inst = A.Instance(np.array([[[2.0**1023], [1.0]]]), np.array([1.0]), np.array([4.0]), np.ones((1, 1)))
    with pytest.raises(NumericalError, match="token values"):
        inst.values()
    assert inst.optimal_tokens().tolist() == [0]


# ---------------------------------------------------------------------- output
def test_output_is_returned_when_a_value_overflows_but_the_output_does_not() -> None:
    """a_0 = 4·2^1023 overflows, but its weight is e^{−2^23}: f = a_1 = 4·2^1000 (oracle: exact
    arithmetic, the other weight is below 2^−1074). Before the fix: 0·inf = NaN."""
    X = np.array([[[2.0**1023], [2.0**1000]]])
    inst = A.Instance(X, np.array([1.0]), np.array([4.0]), np.ones((1, 1)))
    W = np.array([[-(2.0**-1000)]])  # logits −2^23 and −1
    f = A.output(inst, W)
    assert f[0] == 4.0 * 2.0**1000
    s = A.attention(inst, W)
    assert s[0, 1] == 1.0 and s[0, 0] == 0.0  # e^{−2^23+1} is 0 to absolute 2^−1074


def test_output_below_the_range_is_refused() -> None:
    """X ×2^−600, v ×2^−600: outputs ≈ 1e-361 are not doubles (oracle: exact scaling of f at scale 1)."""
    inst0, W0 = _case()
    f0 = A.output(inst0, W0)
    assert np.all(np.abs(f0) > 1e-3)
    inst = _scale(inst0, -600, 600, -600)
    with pytest.raises(NumericalError, match=r"outputs f_i .*underflows"):
        A.output(inst, W0)


def test_log_weight_beyond_the_range_is_refused() -> None:
    """Logits ±1.5e308 in one row: log s = −3e308 is not a double (oracle: exact difference)."""
    inst = A.Instance(np.array([[[1.5e308], [-1.5e308]]]), np.array([1.0]), np.array([1.0]), np.ones((1, 1)))
    W = np.ones((1, 1))
    with pytest.raises(NumericalError, match="attention weight"):
        A.log_attention(inst, W)
    np.testing.assert_array_equal(A.attention(inst, W), [[1.0, 0.0]])


# --------------------------------------------------------------------- risk
def test_exponential_risk_overflow_names_the_range() -> None:
    """ℓ(u) = e^{−u} at u = −1000: the message names the size and the range (oracle: e^{1000} > FLOAT_MAX)."""
    inst = A.Instance(np.array([[[1.0], [1.0]]]), np.array([1.0]), np.array([-1000.0]), np.ones((1, 1)))
    with pytest.raises(NumericalError, match=r"is about 1e\+434: it overflows float64's normal range"):
        A.risk(inst, np.zeros((1, 1)), loss="exponential")


def test_logistic_risk_below_the_range_is_refused_not_zero() -> None:
    """Every margin Y f ≥ 710: the risk e^{−u} < 2.2e-308 used to come back as 0.0 (oracle: mpmath)."""
    X = np.array([[[1.0], [0.5]], [[2.0], [1.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1000.0]), np.ones((2, 1)))
    W = np.array([[1e4]])  # saturated on the larger token
    with mpmath.workdps(30):
        ref = mpmath.log((mpmath.log1p(mpmath.exp(-1000)) + mpmath.log1p(mpmath.exp(-2000))) / 2)
    assert ref < LOG_FLOAT_TINY
    with pytest.raises(NumericalError, match=r"risk L\(W\) is about 1e-\d+: it underflows"):
        A.risk(inst, W)


# ---------------------------------------------------------------- svm rows / gram
def test_svm_rows_and_gram_are_exact_where_the_old_intermediates_overflowed() -> None:
    """z ×2^600, X ×2^−600: z·z overflowed to inf (Gram inf/NaN). Oracle: rows and Gram scale by
    exactly 2^0 and 2^0 (the products z⊗Δ keep their size), so they equal those at scale 1."""
    inst0 = A.random_instance(2, 3, 4, seed=3)
    inst = _scale(inst0, -600, 600, 0)
    np.testing.assert_array_equal(A.svm_rows(inst), A.svm_rows(inst0))
    K0 = A.svm_gram(inst0)
    K = A.svm_gram(inst)
    assert np.max(np.abs(K - K0)) <= 8 * 4 * EPS * np.max(np.abs(np.diag(K0)))


@pytest.mark.parametrize(("jx", "jz", "what"), [(-600, -600, "underflows"), (600, 500, "overflows")])
def test_svm_rows_and_gram_refuse_out_of_range_entries(jx: int, jz: int, what: str) -> None:
    """Rows z⊗Δ ≈ 2^(jx+jz) and Gram entries ≈ 4^(jx+jz) outside the range raise (before: 0 or inf).

    Oracle: the rows at scale 1 are O(1), so rows at 2^∓1200 / 2^1100 are not doubles.
    """
    inst = _scale(A.random_instance(2, 3, 4, seed=3), jx, jz, 0)
    with pytest.raises(NumericalError, match=what):
        A.svm_rows(inst)
    with pytest.raises(NumericalError, match=what):
        A.svm_gram(inst)


def test_svm_gram_below_the_range_but_rows_fine() -> None:
    """X, z ×2^−300: rows ≈ 2^−600 are doubles, Gram entries ≈ 2^−1200 are not (oracle: exact scaling)."""
    inst0 = A.random_instance(2, 3, 4, seed=3)
    inst = _scale(inst0, -300, -300, 0)
    np.testing.assert_array_equal(A.svm_rows(inst), np.ldexp(A.svm_rows(inst0), -600))
    with pytest.raises(NumericalError, match="Gram entry .*underflows"):
        A.svm_gram(inst)
    assert FLOAT_TINY > 0


# ------------------------------------------------------- found by the scale sweep
def test_direction_not_lost_behind_a_sequence_with_zero_query() -> None:
    """Sequence 0 has z_0 = 0 (no contribution) but the larger weight; sequence 1 carries ∇L ≈ 4e-782.

    Found by the sweep: the direction raised "exactly zero" and risk_grad returned 0. Oracle: mpmath.
    """
    X = np.array([[[1.0], [0.0]], [[1.0], [0.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([2048.0]), np.array([[0.0], [1.0]]))
    W = np.array([[2.0]])
    log_norm, direction = mp_log_grad(inst, W)
    D = A.normalized_risk_grad(inst, W)
    assert np.linalg.norm(D.direction - direction) <= GRAD_RTOL
    assert abs(D.log_norm - float(log_norm)) <= LOG_NORM_ATOL
    with pytest.raises(GradientRangeError, match="underflows"):
        A.risk_grad(inst, W)


def test_gradient_refused_when_the_output_cancels_below_its_rounding() -> None:
    """f = Σ s a with a = ±2^66 and weights ½ ± 2^−57: f = 1024 exactly, but float64 weights round to
    ½ and f is known only to ±2^14, so ℓ'(f) = −e^{−f} is undetermined. Found by the sweep: risk_grad
    returned −3.7e19 (truth 1.4e-425, mpmath). Now both forms refuse and name the cause."""
    inst = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([1.0]), np.array([2.0**66]), np.array([[1.0]]))
    W = np.array([[2.0**-56]])
    log_norm, _ = mp_log_grad(inst, W)
    assert log_norm < LOG_FLOAT_TINY
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError, match="undetermined"):
            fn(inst, W)
    # The correlation loss does not depend on f: its gradient is exact (oracle: mpmath).
    log_norm_c, direction_c = mp_log_grad(inst, W, "correlation")
    D = A.normalized_risk_grad(inst, W, loss="correlation")
    assert np.linalg.norm(D.direction - direction_c) <= GRAD_RTOL
    assert abs(D.log_norm - float(log_norm_c)) <= LOG_NORM_ATOL


def test_exact_copies_of_the_selected_token_do_not_count_as_value_rounding() -> None:
    """Regression: the cancellation test of the normalized direction charged the values' rounding
    to every pair of tokens, also a token and its exact copy, whose rounded values are bitwise equal
    (difference exactly 0, as the true one). With the selected token copied, that phantom error
    (~d·eps·|a|·s_α·s_copy) exceeded the true saturated gradient (~|a|·e^−gap), and the direction
    was refused as "cancels to rounding level". Oracle: a 200-digit mpmath gradient (the runner-up
    weight ~1e-60 leaves 140 digits after the cancellation inside a − f)."""
    inst = A.random_instance(2, 4, 5, seed=3)
    X = inst.X.copy()
    X[:, 1] = X[:, 0]
    dup = A.Instance(X, inst.Y, inst.v, inst.z)
    base = np.einsum("id,ie->de", X[:, 0], inst.z)
    W = 40.0 * base / np.linalg.norm(base)
    log_norm, direction = mp_log_grad(dup, W, dps=200)
    res = A.normalized_risk_grad(dup, W)
    assert np.linalg.norm(res.direction - direction) <= GRAD_RTOL
    assert abs(res.log_norm - float(log_norm)) <= LOG_NORM_ATOL


@pytest.mark.parametrize(("j", "side"), [(-415, "underflows"), (350, "overflows")])
def test_risk_grad_refusal_message_names_the_gradient_its_size_and_the_remedy(j: int, side: str) -> None:
    """The whole refusal is the contract: the quantity, its decimal size 10^k from the mpmath
    log||∇L||, the range and the remedy (engines and users read it)."""
    inst0, W0 = _case()
    inst = _scale(inst0, j, j, min(j, 0))  # the two cases of the refusal tests above
    W = np.ldexp(W0, -2 * j)  # logits unchanged
    log_norm, _ = mp_log_grad(inst, W)
    k = int(mpmath.nint(log_norm / mpmath.log(10)))
    with pytest.raises(GradientRangeError) as ei:
        A.risk_grad(inst, W)
    assert str(ei.value) == (
        f"the risk gradient ∇L(W) (Frobenius norm) is about 1e{k:+d}: it {side} float64's normal range "
        "[2.2e-308, 1.8e308]. Use normalized_risk_grad, which returns the direction and log||∇L|| "
        "exactly at any scale"
    )
    assert abs(ei.value.log_norm - float(log_norm)) <= LOG_NORM_ATOL


# ---------------------------------------- risk_grad: no 0 and no rounding noise returned (issue 13 §1)
#: Digits of the oracle at the logit-gap threshold: log||∇L|| ≈ −1.8e308 must be resolved to well
#: below 1 (80 digits resolve it to 1e-72), so that its sign against log FLOAT_TINY is certain.
GAP_ORACLE_DPS = 80


#: ``log||∇L||`` of size 1.8e308 is documented to ``eps·|log w|`` (the log-domain rounding of the log
#: weights ``log s_1 + log s_2``, two roundings of numbers of that size): 4·eps relative.
HUGE_LOG_NORM_RTOL = 4 * EPS

_PM_ONE = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([1.0]), np.array([1.0]), np.array([[1.0]]))
_HALF_MAX = FLOAT_MAX / 2  # logits ±w: the gap 2w overflows to inf exactly when w > FLOAT_MAX/2


@pytest.mark.parametrize("loss", ["logistic", "correlation"])
@pytest.mark.parametrize(
    "w",
    [np.nextafter(_HALF_MAX, 0.0), _HALF_MAX, np.nextafter(_HALF_MAX, np.inf), 1e308],
    ids=["below", "at", "above", "1e308"],
)
def test_risk_grad_never_returns_zeros_when_a_logit_gap_overflows(w: float, loss: str) -> None:
    """Tokens ±1, v = z = 1, W = [[w]]: logits ±w, gap 2w. Once 2w > FLOAT_MAX the gap is inf before
    exp, log s_2 = −inf, and risk_grad returned exact zeros (normalized_risk_grad: "exactly zero").

    Oracle: mpmath at 80 digits (centred form): ∇L = 4ℓ'·s_1 s_2 ≠ 0 with log||∇L|| ≈ −2w < log FLOAT_TINY on both
    sides of the threshold. Contract: risk_grad refuses (NumericalError) on both sides; above it, the
    refusal is the range error naming the underflow of the gradient and the range (log_norm −inf:
    even log||∇L|| is not a double); normalized_risk_grad refuses alike, never "exactly zero". Below it,
    log||∇L|| ≈ −2w is a double: with the correlation loss normalized_risk_grad returns the exact direction."""
    W = np.array([[w]])
    log_norm, direction = mp_log_grad(_PM_ONE, W, loss, dps=GAP_ORACLE_DPS)
    assert mpmath.isfinite(log_norm) and log_norm < LOG_FLOAT_TINY  # nonzero, below the normal range
    if 2 * mpmath.mpf(w) > FLOAT_MAX:
        assert log_norm < -FLOAT_MAX  # not even its logarithm is a double
        for fn in (A.risk_grad, A.normalized_risk_grad):
            with pytest.raises(GradientRangeError) as ei:
                fn(_PM_ONE, W, loss=loss)
            assert ei.value.log_norm == -math.inf
            assert str(ei.value).startswith(
                "the risk gradient ∇L(W) (Frobenius norm) is below any double (underflow to 0). A gap "
                "between two logits"
            )
            assert "[2.2e-308, 1.8e308]" in str(ei.value)
    else:
        # log s_2 ≈ −1.8e308 is a double. risk_grad refuses: the range error (correlation), or
        # "undetermined" (logistic: f = s_1 − s_2 is known only to ±4e292, so ℓ'(f) has no digit).
        # normalized_risk_grad refuses alike for the logistic loss; for the correlation loss (ℓ' = −1) it
        # returns the direction and log||∇L|| ≈ −2w: the O(1) parts (log 4, the rounding level's d·eps)
        # are kept apart from the log weights' common exponent, which once rounded them away and refused
        # a determined gradient as cancelled.
        with pytest.raises(NumericalError, match=r"normal range|undetermined"):
            A.risk_grad(_PM_ONE, W, loss=loss)
        if loss == "correlation":
            g = A.normalized_risk_grad(_PM_ONE, W, loss=loss)
            np.testing.assert_array_equal(g.direction, direction)
            assert abs(g.log_norm - float(log_norm)) <= HUGE_LOG_NORM_RTOL * abs(float(log_norm))
        else:
            with pytest.raises(NumericalError, match="undetermined"):
                A.normalized_risk_grad(_PM_ONE, W, loss=loss)


@pytest.mark.parametrize(("w", "returns"), [(353.0, True), (355.0, False)])
def test_risk_grad_on_both_sides_of_the_normal_range(w: float, returns: bool) -> None:
    """The same instance where ||∇L|| = 4s_1 s_2 ≈ 4e^{−2w} crosses FLOAT_TINY (w ≈ 354.5). Oracle: mpmath
    (80 digits, centred form). Above: the value to GRAD_RTOL; below: GradientRangeError with log_norm to LOG_NORM_ATOL."""
    W = np.array([[w]])
    log_norm, direction = mp_log_grad(_PM_ONE, W, "correlation", dps=GAP_ORACLE_DPS)
    assert (log_norm >= LOG_FLOAT_TINY) == returns
    if returns:
        G = A.risk_grad(_PM_ONE, W, loss="correlation")
        ref = direction * float(mpmath.exp(log_norm))
        assert np.linalg.norm(G - ref) <= GRAD_RTOL * float(mpmath.exp(log_norm))
    else:
        with pytest.raises(GradientRangeError, match="underflows float64's normal range") as ei:
            A.risk_grad(_PM_ONE, W, loss="correlation")
        assert abs(ei.value.log_norm - float(log_norm)) <= LOG_NORM_ATOL


def _values_below_rounding(middle: float) -> A.Instance:
    """One sequence: x_1 = (1, middle, −1), x_2 = 0, v = (1, 1, 1), z = e_1 (d = 3, W = 0). The value
    a_1 = vᵀx_1 = middle is a sum that cancels: float64 rounds it by up to d·eps·Σ|v_k x_k| ≈ 6.7e-16."""
    X = np.array([[[1.0, middle, -1.0], [0.0, 0.0, 0.0]]])
    return A.Instance(X, np.array([1.0]), np.ones(3), np.array([[1.0, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "middle",
    [3 * 2.0**-54, 2.0**-53],
    ids=["33-percent-error", "returned-zero"],
)
def test_risk_grad_refuses_values_that_cancel_to_rounding(middle: float) -> None:
    """Issue 13 §1: the plain path had no value-rounding check. With a_1 = 3·2^−54 (true, mpmath) the
    dot product rounds to 2^−52 on this BLAS: risk_grad returned ∇L with 33 % error; with a_1 = 2^−53 it
    rounds to 0 and risk_grad returned exact zeros (normalized_risk_grad said "exactly zero").

    Oracle: mpmath at 80 digits (the true ∇L is nonzero). Contract: the gradient to GRAD_RTOL, or the
    refusal NumericalError "rounding level" (the computed G is at the values' rounding level,
    VE = d·eps·Σ s (|a|_t + |a|_u)), which normalized_risk_grad also applies."""
    inst = _values_below_rounding(middle)
    W = np.zeros((3, 3))
    log_norm, direction = mp_log_grad(inst, W, "logistic", dps=GAP_ORACLE_DPS)
    assert mpmath.isfinite(log_norm)  # ∇L ≠ 0
    ref = direction * float(mpmath.exp(log_norm))
    try:
        G = A.risk_grad(inst, W)
    except NumericalError as exc:
        assert "undetermined in float64" in str(exc) and "rounding level" in str(exc)
    else:  # a BLAS that sums these exactly: then the value must be right
        assert np.linalg.norm(G - ref) <= GRAD_RTOL * float(mpmath.exp(log_norm))
    with pytest.raises(NumericalError, match="rounding level"):
        A.normalized_risk_grad(inst, W)


#: Found by the batched engine's sweep (2026-12-02): two sequences, d = 1, entries from 1e-295 to 0.85, W = 4e194.
#: Sequence 1's live term has the rescaled key x'_0 ≈ 2e-195, whose norm np.linalg.norm squared to 0: the term was
#: taken for dead and the far smaller t = 2 term (weight e^-9.47e6) kept, log ||∇L|| = -9475128.56.
_MIXED_TERMS = A.Instance(
    np.array(
        [
            [
                [-1.057573625787223e-34],
                [0.8475991918477764],
                [1.6112042647931494e-24],
                [-2.0221741352564896e-167],
            ],
            [[9.772437985116454e-295], [0.0], [4.835426958342857e-100], [0.0]],
        ]
    ),
    np.array([-1.0, 1.0]),
    np.array([-9.138499206738973e-149]),
    np.array([[0.7175953432890637], [-4.871987097060625e-89]]),
)


def test_normalized_risk_grad_keeps_a_term_whose_key_norm_underflows_when_squared() -> None:
    """Regression. Oracle: ∇L of the correlation loss summed term by term in 400-digit mpmath:
    log|∇L| = −1900.382551577…, direction −1 (d = 1)."""
    g = A.normalized_risk_grad(_MIXED_TERMS, np.array([[4.021593423457008e194]]), loss="correlation")
    assert g.direction[0, 0] == -1.0
    assert abs(g.log_norm - (-1900.382551577364)) <= 1e-9 * 1900.4


# ------------------------------ normalized_risk_grad on data spanning the range within one sequence
#: Digits of the oracle of the within-sequence-spread regressions: weights e^−1e300 and values 1e-324 are
#: exact in mpmath at any precision (its exponents are unbounded); 400 digits resolve a sum of terms
#: 1e-650 apart (values 1e-324 next to 1, keys 1e-299 next to 1) with > 100 digits to spare.
SPREAD_ORACLE_DPS = 400
#: log||∇L|| of size |L| is documented to ``eps·|log w|`` plus the direction's bound: the log weights
#: ``log s_1 + log s_2`` are two roundings of numbers of size |L|, so 4·eps·|L| + LOG_NORM_ATOL.
SPREAD_LOG_RTOL = 4 * EPS

#: One sequence, tokens e_1 and e_2/2, v = e_1, z = e_1: logits (g, 0) exactly, values (1, 0), so ∇L =
#: −s_1 s_2·(e_1 − e_2/2) e_1ᵀ (correlation loss, Y = 1): the direction (−2, 0; 1, 0)/√5 for every g (an
#: exact construction; the 400-digit oracle agrees). Before: the O(1) logs of the two terms' sizes
#: (log ||x_2|| = log ½) were added to log weights of size g and rounded away, so both terms came out
#: the same size: the direction (−1, 0; 1, 0)/√2 (0.32 off) at g = 1e17, and at g ≥ 1e20 also the
#: rounding level's log(d·eps) vanished and the gradient was refused as cancelled (it is 2e14 times the
#: level). g = 1e5 took the old plain form too (an error ~1e-11, eps·g).
_RUNNER_UP = A.Instance(
    np.array([[[1.0, 0.0], [0.0, 0.5]]]), np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]])
)


@pytest.mark.parametrize("g", [1e5, 1e17, 1e20, 1e300])
def test_normalized_risk_grad_keeps_the_o1_parts_of_terms_sharing_a_huge_log_weight(g: float) -> None:
    """Regression (the sweep of issue 16's gap): a token and its runner-up share the factor e^{−g}.
    Oracles: the exact construction above, and ∇L in 400-digit mpmath (log||∇L|| = −g + log(√5/2) − …)."""
    W = np.array([[g, 0.0], [0.0, 0.0]])
    log_norm, direction = mp_log_grad(_RUNNER_UP, W, "correlation", dps=SPREAD_ORACLE_DPS)
    exact = np.array([[-2.0, 0.0], [1.0, 0.0]]) / math.sqrt(5.0)
    assert np.linalg.norm(direction - exact) <= GRAD_RTOL  # the oracle agrees with the construction
    got = A.normalized_risk_grad(_RUNNER_UP, W, loss="correlation")
    assert np.linalg.norm(got.direction - exact) <= GRAD_RTOL
    assert abs(got.log_norm - float(log_norm)) <= SPREAD_LOG_RTOL * g + LOG_NORM_ATOL


def test_normalized_risk_grad_still_refuses_a_gradient_cancelled_by_symmetry_at_huge_log_weights() -> None:
    """The refusal that stays: _RUNNER_UP's sequence twice, with labels +1 and −1, at g = 1e20: ∇L = 0 by
    symmetry (each term meets its negative), so the direction is undefined — refused at rounding level,
    never returned (oracle: the symmetry)."""
    X = np.concatenate([_RUNNER_UP.X, _RUNNER_UP.X])
    inst = A.Instance(X, np.array([1.0, -1.0]), _RUNNER_UP.v, np.concatenate([_RUNNER_UP.z, _RUNNER_UP.z]))
    with pytest.raises(NumericalError, match="rounding level"):
        A.normalized_risk_grad(inst, np.array([[1e20, 0.0], [0.0, 0.0]]), loss="correlation")


#: One sequence: a key e_1 and two keys 1e-299·e_2, 2e-299·e_2 in the same sequence, v = (1, 1e-25), z = e_1,
#: W = −1500·e_1e_1ᵀ: logits (−1500, 0, 0). The tiny keys' values 1e-324 and 2e-324 (exact products) were
#: formed in the sequence's units, where they underflowed to 0: their pair, which dominates ∇L (≈ 1e-624
#: against e^−1500 ≈ 1e-652 for the pairs with the first key), was lost and the direction came out e_1e_1ᵀ
#: (−1, 0; 0, 0) for the true (0, 0; −1, 0) (oracle: 400-digit mpmath; error 1.41), log||∇L|| −1500.69
#: for −1435.90. Each key is now rescaled on its own.
_TINY_KEYS_X = np.array([[[1.0, 0.0], [0.0, 1e-299], [0.0, 2e-299]]])
_TINY_KEYS_W = np.array([[-1500.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("v2", [1e-25, 1e-5])
def test_normalized_risk_grad_keeps_values_that_underflow_in_their_sequences_units(v2: float) -> None:
    """Regression; oracle: ∇L in 400-digit mpmath (v2 = 1e-5: values 1e-304, normal; the same answer path)."""
    inst = A.Instance(_TINY_KEYS_X, np.array([1.0]), np.array([1.0, v2]), np.array([[1.0, 0.0]]))
    log_norm, direction = mp_log_grad(inst, _TINY_KEYS_W, "correlation", dps=SPREAD_ORACLE_DPS)
    got = A.normalized_risk_grad(inst, _TINY_KEYS_W, loss="correlation")
    assert np.linalg.norm(got.direction - direction) <= GRAD_RTOL
    assert abs(got.log_norm - float(log_norm)) <= LOG_NORM_ATOL


def test_normalized_risk_grad_of_tiny_keys_ignores_a_masked_key() -> None:
    """The same instance with a fourth key (0.7, 0.7), masked: a masked token is deleted, so the answer is
    the unmasked instance's bit for bit (oracle: the deletion)."""
    X4 = np.concatenate([_TINY_KEYS_X, np.array([[[0.7, 0.7]]])], axis=1)
    v, z, Y = np.array([1.0, 1e-25]), np.array([[1.0, 0.0]]), np.array([1.0])
    masked = A.Instance(X4, Y, v, z, mask=np.array([[True, True, True, False]]))
    plain = A.Instance(_TINY_KEYS_X, Y, v, z)
    got = A.normalized_risk_grad(masked, _TINY_KEYS_W, loss="correlation")
    ref = A.normalized_risk_grad(plain, _TINY_KEYS_W, loss="correlation")
    np.testing.assert_array_equal(got.direction, ref.direction)
    assert got.log_norm == ref.log_norm
