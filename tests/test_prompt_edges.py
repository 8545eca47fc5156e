"""`attnsvm.peers._prompt` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.peers._prompt` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).
"""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest

from attnsvm import InfeasibleSVMError, Instance, InvalidInstanceError, NumericalError
from attnsvm.model._losses import Loss, logistic
from attnsvm.peers._prompt import (
    core_risk,
    normalized_prompt_grad,
    prompt_attention,
    prompt_data,
    prompt_grad,
    prompt_logits,
    prompt_output,
    prompt_regularization_path,
    put_back,
    risk_value,
    run_prompt_gd,
    scaled_core,
    solve_min_norm_or_raise,
    solve_prompt_svm,
)

mpmath.mp.dps = 60

#: Relative accuracy of the float64 prompt gradient on the tiny instances below: the documented
#: ``≲ nT·eps`` with n, T ≤ 2 is ~1e-15; 1e-12 leaves a margin of ~1000 ulps for the exp/log1p calls.
GRAD_RTOL = 1e-12
#: Softmax weights/logits of a handful of entries: a few ulps each (exp of a log-sum-exp); 1e-13.
ATT_RTOL = 1e-13


def _mp_logistic_prime(u: mpmath.mpf) -> mpmath.mpf:
    """ℓ'(u) = −1/(1+e^u) for ℓ(u) = log(1+e^{−u})."""
    return -1 / (1 + mpmath.exp(u))


def _mp_prompt_grad(X: np.ndarray, Y: np.ndarray, v: np.ndarray, W: np.ndarray, p: np.ndarray) -> list:
    """∇_p L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) k_it, in 60-digit mpmath (logistic)."""
    n, T, d = X.shape
    g = [mpmath.mpf(0)] * d
    for i in range(n):
        keys = [
            [sum(mpmath.mpf(W[a, b]) * mpmath.mpf(X[i, t, a]) for a in range(d)) for b in range(d)]
            for t in range(T)
        ]
        lg = [sum(keys[t][b] * mpmath.mpf(p[b]) for b in range(d)) for t in range(T)]
        top = max(lg)
        ex = [mpmath.exp(x - top) for x in lg]
        s = [e / sum(ex) for e in ex]
        a = [sum(mpmath.mpf(v[b]) * mpmath.mpf(X[i, t, b]) for b in range(d)) for t in range(T)]
        f = sum(s[t] * a[t] for t in range(T))
        # vᵀx_it − f_i = Σ_u s_iu (a_it − a_iu): no cancellation even when 1 − s_it is below 1e-60
        dev = [sum(s[u] * (a[t] - a[u]) for u in range(T)) for t in range(T)]
        w = _mp_logistic_prime(mpmath.mpf(Y[i]) * f) * mpmath.mpf(Y[i]) / n
        for b in range(d):
            g[b] += w * sum(s[t] * dev[t] * keys[t][b] for t in range(T))
    return g


def _assert_close_mp(got: np.ndarray, want: list, rtol: float) -> None:
    scale = max(abs(x) for x in want)
    for gi, wi in zip(got, want, strict=True):
        assert abs(mpmath.mpf(float(gi)) - wi) <= rtol * scale, (got, [float(x) for x in want])


def _two_seq() -> tuple[Instance, np.ndarray]:
    """n = 2, T = 2, d = 2 with value scores vᵀx in [1, 2) (value exponent 1) and two different logit scales."""
    X = np.array([[[1.0, 0.5], [-0.25, 1.0]], [[0.75, -1.0], [0.5, 0.25]]])
    return Instance(X, np.array([1.0, -1.0]), np.array([1.5, 0.5])), np.array([[1.0, 0.25], [-0.5, 0.75]])


# ------------------------------------------------------------------ model values
def test_prompt_logits_are_keys_times_prompt() -> None:
    """Oracle: exact dyadic arithmetic, l_it = x_itᵀ W p (every product and sum exact in float64)."""
    inst, W = _two_seq()
    p = np.array([0.5, -2.0])
    want = np.einsum("ntd,de,e->nt", inst.X, W, p)
    np.testing.assert_array_equal(prompt_logits(inst, W, p), want)
    with pytest.raises(InvalidInstanceError, match="p must have shape"):
        prompt_logits(inst, W, np.ones(3))


def test_prompt_attention_and_output_per_sequence_match_mpmath() -> None:
    """Oracle: 60-digit mpmath softmax per sequence; sequences whose logits differ by 2^11 in scale
    (the softmax's max is taken per sequence, not over the batch)."""
    X = np.array([[[1.0, 0.0], [0.5, 0.0]], [[-1024.0, 0.0], [-1000.0, 0.0]]])
    inst = Instance(X, np.array([1.0, 1.0]), np.array([1.0, 0.0]))
    W, p = np.eye(2), np.array([2.0, 0.0])
    s = prompt_attention(inst, W, p)
    f = prompt_output(inst, W, p)
    assert f.shape == (2,)
    for i in range(2):
        lg = [mpmath.mpf(X[i, t, 0]) * 2 for t in range(2)]
        z = mpmath.fsum(mpmath.exp(x) for x in lg)
        for t in range(2):
            want = mpmath.exp(lg[t]) / z
            assert abs(mpmath.mpf(float(s[i, t])) - want) <= ATT_RTOL * want
        fw = mpmath.fsum(mpmath.exp(lg[t]) / z * mpmath.mpf(X[i, t, 0]) for t in range(2))
        assert abs(mpmath.mpf(float(f[i])) - fw) <= ATT_RTOL * abs(fw)


def test_prompt_attention_single_feature() -> None:
    """Oracle: for d = 1, T = 2 the weight is the logistic function of the logit gap (mpmath)."""
    inst = Instance(np.array([[[1.0], [0.0]]]), np.array([1.0]), np.array([1.0]))
    s = prompt_attention(inst, np.array([[1.0]]), np.array([3.0]))
    want = 1 / (1 + mpmath.exp(-3))
    assert abs(mpmath.mpf(float(s[0, 0])) - want) <= ATT_RTOL * want
    assert abs(mpmath.mpf(float(s[0, 1])) - (1 - want)) <= ATT_RTOL * (1 - want)


def test_prompt_data_uses_the_given_head() -> None:
    """Oracle: exact dyadic values vᵀx_it for an explicit head v (not the instance's)."""
    inst, W = _two_seq()
    v = np.array([-3.0, 0.125])
    data = prompt_data(inst, W, v)
    np.testing.assert_array_equal(np.ldexp(data.As, data.A), np.einsum("ntd,d->nt", inst.X, v))


def test_prompt_grad_matches_mpmath_with_value_exponent_one() -> None:
    """Oracle: the 60-digit mpmath gradient formula (module docstring) on a tiny instance whose
    values vᵀx have largest magnitude in [1, 2), so the loss is evaluated at 2^1·u'."""
    inst, W = _two_seq()
    p = np.array([0.75, -0.5])
    _assert_close_mp(prompt_grad(inst, W, p), _mp_prompt_grad(inst.X, inst.Y, inst.v, W, p), GRAD_RTOL)


def test_prompt_grad_exact_when_core_weights_are_subnormal() -> None:
    """Oracle: mpmath. The runner-up weight s ≈ e^−735 is subnormal inside the rescaled core, but the
    gradient (≈ s·2^600) is a normal double: it must come back to full precision, not with the
    ~1e-5 relative digit loss of gradual underflow."""
    X = np.array([[[1.0], [0.0]]])
    v, Y, W, p = np.array([2.0**600]), np.array([-1.0]), np.array([[1.0]]), np.array([735.0])
    inst = Instance(X, Y, v)
    _assert_close_mp(prompt_grad(inst, W, p), _mp_prompt_grad(X, Y, v, W, p), GRAD_RTOL)


class _DuckLogistic:
    """A user loss object (LossLike, not a Loss): the logistic loss."""

    assumptions = logistic.assumptions

    def value(self, u):  # noqa: ANN001, ANN201
        return logistic.value(u)

    def derivative(self, u):  # noqa: ANN001, ANN201
        return logistic.derivative(u)


def test_prompt_grad_with_user_loss_objects_matches_mpmath() -> None:
    """Oracle: mpmath gradient; a duck-typed loss object and a Loss without log-derivative give the
    logistic gradient and direction when the values need rescaling (exponent ≠ 0)."""
    inst, W = _two_seq()
    p = np.array([0.75, -0.5])
    want = _mp_prompt_grad(inst.X, inst.Y, inst.v, W, p)
    nrm = mpmath.sqrt(mpmath.fsum(x * x for x in want))
    plain = Loss("my-logistic", logistic.value_fn, logistic.derivative_fn, logistic.assumptions, None)
    for lo in (_DuckLogistic(), plain):
        _assert_close_mp(prompt_grad(inst, W, p, loss=lo), want, GRAD_RTOL)
        G = normalized_prompt_grad(inst, W, p, loss=lo)
        _assert_close_mp(G.direction, [x / nrm for x in want], GRAD_RTOL)
        assert abs(G.log_norm - float(mpmath.log(nrm))) <= GRAD_RTOL * max(1.0, abs(G.log_norm))


# ------------------------------------------------------------ documented errors
def test_prompt_grad_overflow_is_named() -> None:
    """Oracle: the documented error text; the true gradient is ≈ 1e310 (mpmath), not a double."""
    X = np.array([[[1e10], [0.0]]])
    inst = Instance(X, np.array([-1.0]), np.array([1e300]))
    with pytest.raises(NumericalError) as info:
        prompt_grad(inst, np.array([[1.0]]), np.array([0.0]))
    msg = str(info.value)
    assert "the prompt gradient ∇_p L" in msg and "overflows" in msg
    assert "normalized gradient" in msg


def test_core_risk_refuses_overflowing_outputs() -> None:
    """Oracle: documented error text; f = 2^1100·(mantissa) overflows for every loss."""
    Xs = np.array([[[0.5], [0.25]]])
    zs = np.array([[0.5]])
    sc = scaled_core(Xs, 0, zs, 0, np.array([[0.5, 0.5]]), 1100, np.array([1.0]), logistic)
    with pytest.raises(NumericalError) as info:
        core_risk(sc, np.array([[1.0]]), "my risk")
    assert "the outputs f_i of my risk" in str(info.value) and "Scale v down" in str(info.value)


def test_risk_value_refuses_overflow_with_remedy() -> None:
    """Oracle: a loss whose value at u = −1000 is e^{1000} > 1.8e308 (inf in float64): the risk is
    not a double, and the refusal names it and the remedy."""

    def big(u):  # noqa: ANN001, ANN202
        with np.errstate(over="ignore"):
            return np.exp(-np.asarray(u, dtype=np.float64))

    lo = Loss("unchecked-exponential", big, lambda u: -big(u), logistic.assumptions)
    with pytest.raises(NumericalError) as info:
        risk_value(lo, np.array([-1000.0]), "the test risk")
    msg = str(info.value)
    assert "the test risk" in msg and "Scale the data down or use the logistic loss" in msg


def test_put_back_at_the_overflow_edge_is_a_named_error() -> None:
    """Oracle: 0.5·2^1025 = 2^1024 > max double, though its natural log rounds to log(FLOAT_MAX):
    a NumericalError naming the quantity, with no floating-point warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NumericalError, match="the edge quantity"):
            put_back(np.array([0.5]), 1025, "the edge quantity")


def test_infeasible_p_svm_message() -> None:
    """Oracle: the documented message for a repeated key (x_iα = x_it gives Δk = 0)."""
    X = np.array([[[1.0, 0.0], [1.0, 0.0]]])
    inst = Instance(X, np.array([1.0]), np.array([1.0, 0.0]))
    with pytest.raises(InfeasibleSVMError) as info:
        solve_prompt_svm(inst, np.eye(2), alpha=[0])
    msg = str(info.value)
    assert "prompt SVM (p-SVM) is infeasible" in msg
    assert "Choose another alpha, or a W that separates these tokens. (" in msg


def test_p_svm_solution_overflow_and_subnormal_rows_are_named() -> None:
    """Oracle: p_mm = Δk/||Δk||² for one constraint. Keys of size 1e-310 give max|p_mm| ≈ 1e310
    (overflow); keys of 1e-308·(1,…,1) in d = 8 give normal p_mm but subnormal rows Δk."""
    X = np.array([[[1e-155, 0.0], [0.0, 0.0]]])
    inst = Instance(X, np.array([1.0]), np.array([1.0, 0.0]))
    with pytest.raises(NumericalError, match="the p-SVM solution p_mm"):
        solve_prompt_svm(inst, 1e-155 * np.eye(2), alpha=[0])
    X8 = np.zeros((1, 2, 8))
    X8[0, 0] = 1e-154
    inst8 = Instance(X8, np.array([1.0]), np.ones(8))
    with pytest.raises(NumericalError, match="the p-SVM constraint rows Δk_it"):
        solve_prompt_svm(inst8, 1e-154 * np.eye(8), alpha=[0])


def test_p_svm_error_bound_is_a_small_number() -> None:
    """Oracle: orthogonal rows (cond(K_S) = 1): the documented bound cond·eps is tiny; p_mm exact."""
    X = np.array([[[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]])
    inst = Instance(X, np.array([1.0]), np.array([1.0, 1.0]))
    sol = solve_prompt_svm(inst, np.eye(2), alpha=[0])
    np.testing.assert_allclose(sol.p, [1.0, 1.0], rtol=1e-12)
    assert isinstance(sol.error_bound, float) and 0.0 <= sol.error_bound <= 1e-12


def test_min_norm_equality_rows_are_equalities() -> None:
    """Oracle: hand-solved. min ½||x||² s.t. x_0 = −1 is x = (−1, 0); as an inequality x_0 ≥ −1 it is 0."""
    rows = np.array([[1.0, 0.0]])
    pairs = np.array([[0, 1]])
    sol = solve_min_norm_or_raise(rows, np.array([-1.0]), np.array([True]), pairs, "test problem")
    np.testing.assert_allclose(rows.T @ sol.multipliers, [-1.0, 0.0], atol=1e-12)


def test_min_norm_uses_the_row_factor() -> None:
    """Oracle: rows (1, 0), (1, 1e-9) with b = (1, 1): the unique feasible-with-equality point is
    x = (1, 0), margins both exactly 1; the Gram matrix alone rounds to singular [[1,1],[1,1]]."""
    rows = np.array([[1.0, 0.0], [1.0, 1e-9]])
    pairs = np.array([[0, 1], [0, 2]])
    sol = solve_min_norm_or_raise(rows, np.ones(2), None, pairs, "test problem")
    np.testing.assert_allclose(rows @ (rows.T @ sol.multipliers), [1.0, 1.0], rtol=1e-9)


# ------------------------------------------------------------------- GD and path
def test_gd_records_integer_tokens_and_corr() -> None:
    """Oracle: at step 0, p = p0: corr(p0, p0) = 1, corr(p0, −p0) = −1 exactly within [−1, 1]
    (Cauchy–Schwarz), tokens = argmax of the exact logits, an integer index array."""
    inst, W = _two_seq()
    p0 = np.array([0.1, 0.7]) * 3
    for ref, want in ((p0, 1.0), (-p0, -1.0)):
        tr = run_prompt_gd(inst, W, 1, 0.1, p0=p0, reference=ref, record_at=[0])
        c = tr.record[0].corr
        assert -1.0 <= c <= 1.0 and abs(c - want) <= 4 * np.finfo(float).eps
    tok = tr.record[0].tokens
    assert tok.dtype.kind == "i"
    np.testing.assert_array_equal(tok, np.argmax(np.einsum("ntd,de,e->nt", inst.X, W, p0), axis=1))


def test_path_option_errors_name_the_option() -> None:
    """Oracle: the documented messages name the offending argument."""
    inst, W = _two_seq()
    with pytest.raises(Exception, match="max_steps"):
        prompt_regularization_path(inst, W, [1.0], max_steps=0)
    with pytest.raises(InvalidInstanceError, match="reference must have shape"):
        prompt_regularization_path(inst, W, [1.0], reference=np.ones(3))


def test_path_refuses_underflowing_risk() -> None:
    """Oracle: with every margin Y_i vᵀx_it ≥ 2000 the logistic risk is ≤ e^−2000 for every p: not a
    double, so the path raises NumericalError naming the risk (not a foreign exception)."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [1.0, 0.25]]])
    inst = Instance(X, np.array([1.0, 1.0]), np.array([4000.0, 4000.0]))
    with pytest.raises(NumericalError, match="risk"):
        prompt_regularization_path(inst, np.eye(2), [0.5, 1.0], max_steps=20)


def test_prompt_logits_overflow_is_named() -> None:
    """Oracle: documented error text; l = x·W·p = 1e200·1e200 = 1e400 is not a double."""
    inst = Instance(np.array([[[1e200], [0.0]]]), np.array([1.0]), np.array([1.0]))
    with pytest.raises(NumericalError, match="the prompt logits k_itᵀp"):
        prompt_logits(inst, np.array([[1.0]]), np.array([1e200]))


def test_prompt_grad_independent_of_callers_underflow_mode() -> None:
    """Oracle: scale equivariance by an exact power of two. A prompt of 1e-300 on keys of 2^-70
    (effective weights rounded into the subnormal range) under the caller's ``np.errstate(under="raise")``
    gives 2^-70 times the gradient on keys 2^70 times larger (same logits up to d²·2^-1074)."""
    X = np.array([[[2.0**-70, 0.0], [0.0, 2.0**-70]]])
    inst = Instance(X, np.array([1.0]), np.array([1.0, -1.0]))
    p = np.array([1e-300, 0.0])
    base = prompt_grad(Instance(X * 2.0**70, inst.Y, inst.v * 2.0**-70), np.eye(2), p)
    with np.errstate(under="raise"):
        g = prompt_grad(inst, np.eye(2), p)
    np.testing.assert_allclose(g, np.ldexp(base, -70), rtol=GRAD_RTOL)


# ============================== per-row mantissas of the p-SVM rows (issue 16: rows far apart in size)
#: A row entry is a length-d dot product of the token difference (one rounding) with a column of W: its
#: error is ≤ (d + 1)·eps·Σ_k |Δx_k|·|W_kj| (the standard dot-product bound γ_{d+1}); 2(d + 1) leaves room
#: for the power-of-two bookkeeping, which is exact.
def _row_atol(d: int) -> float:
    return 2 * (d + 1) * float(np.finfo(np.float64).eps)


@pytest.mark.parametrize("seed", range(6))
def test_prompt_row_mantissas_are_the_exact_key_differences(seed: int) -> None:
    """Oracle: ``Δk_it = Wᵀ(x_iα − x_it)`` in exact rational arithmetic (fractions). Tokens of each sequence and
    columns of ``W`` are scaled by their own powers of two, up to 2^±900 apart (a shared exponent flushed the
    small ones to zero): each returned row ``2^{R_r}·rows_r`` is within the dot-product rounding of the exact
    row (relative to ``Σ|Δx||W|``), and each mantissa row has its largest entry in ``[½, 1)``."""
    from fractions import Fraction as F

    from attnsvm.peers._prompt import prompt_row_mantissas

    rng = np.random.default_rng(seed)
    n, T, d = 3, 3, 3
    X = rng.standard_normal((n, T, d)) * np.ldexp(1.0, rng.integers(-450, 450, size=(n, 1, 1)))
    W = rng.standard_normal((d, d)) * np.ldexp(1.0, rng.integers(-450, 450, size=(1, d)))
    inst = Instance(X, np.ones(n), np.ones(d))
    alpha = rng.integers(0, T, size=n)
    rows, R, pairs = prompt_row_mantissas(inst, W, alpha)
    assert rows.shape == (n * (T - 1), d)
    np.testing.assert_array_less(np.max(np.abs(rows), axis=1), 1.0)
    assert np.all(np.max(np.abs(rows), axis=1) >= 0.5)
    for r, (i, t) in enumerate(pairs):
        dx = [F(float(X[i, alpha[i], k])) - F(float(X[i, t, k])) for k in range(d)]
        for j in range(d):
            exact = sum(dx[k] * F(float(W[k, j])) for k in range(d))
            scale = sum(abs(dx[k]) * abs(F(float(W[k, j]))) for k in range(d))
            got = F(float(rows[r, j])) * F(2) ** int(R[r])
            assert abs(got - exact) <= F(_row_atol(d)) * scale
