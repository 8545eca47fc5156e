"""The log-domain gradient and the risk at their edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.model._grad` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.model._grad import signed_log_derivative
from attnsvm.model._losses import get_loss
from attnsvm.scaling import LOG_FLOAT_MAX

EPS = float(np.finfo(np.float64).eps)
#: Digits of the mpmath oracle: exponents are unbounded there, so 40 digits leave > 25 correct
#: after the logits' and the outputs' spread (|f| ≤ 2e3 loses ≤ 4 digits in exp).
ORACLE_DPS = 40


def _mp_loss_parts(loss: str, u: mpmath.mpf) -> tuple[mpmath.mpf, mpmath.mpf]:
    """``(ℓ(u), ℓ'(u))`` in mpmath, written from the losses' definitions (independent of attnsvm)."""
    if loss == "exponential":
        return mpmath.exp(-u), -mpmath.exp(-u)
    if loss == "logistic":
        return mpmath.log1p(mpmath.exp(-u)), -1 / (1 + mpmath.exp(u))
    raise ValueError(loss)


def _mp_forward(inst: A.Instance, W: np.ndarray, i: int) -> tuple[list, list, mpmath.mpf]:
    """Softmax weights, token values and output of sequence ``i`` in mpmath (from the exact doubles)."""
    X, z, v = inst.X, inst.z, inst.v
    T, d = X.shape[1], X.shape[2]
    mpf = mpmath.mpf
    logits = [
        mpmath.fsum(
            mpf(float(X[i, t, j])) * mpf(float(W[j, k])) * mpf(float(z[i, k]))
            for j in range(d)
            for k in range(d)
        )
        for t in range(T)
    ]
    top = max(logits)
    e = [mpmath.exp(lg - top) for lg in logits]
    s = [w / mpmath.fsum(e) for w in e]
    a = [mpmath.fsum(mpf(float(X[i, t, k])) * mpf(float(v[k])) for k in range(d)) for t in range(T)]
    return s, a, mpmath.fsum(st * at for st, at in zip(s, a, strict=True))


def mp_risk(inst: A.Instance, W: np.ndarray, loss: str) -> mpmath.mpf:
    """``L(W) = (1/n) Σ_i ℓ(Y_i f_i)`` at ``ORACLE_DPS`` digits (independent oracle)."""
    with mpmath.workdps(ORACLE_DPS):
        n = inst.X.shape[0]
        total = mpmath.fsum(
            _mp_loss_parts(loss, mpmath.mpf(float(inst.Y[i])) * _mp_forward(inst, W, i)[2])[0]
            for i in range(n)
        )
        return total / n


def mp_grad(inst: A.Instance, W: np.ndarray, loss: str) -> mpmath.matrix:
    """``∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ`` at ``ORACLE_DPS`` digits.

    ``a_it − f_i`` is taken as ``Σ_u s_iu (a_it − a_iu)`` (no cancellation at any saturation).
    """
    with mpmath.workdps(ORACLE_DPS):
        n, T, d = inst.X.shape
        G = mpmath.zeros(d, d)
        for i in range(n):
            s, a, f = _mp_forward(inst, W, i)
            y = mpmath.mpf(float(inst.Y[i]))
            lp = _mp_loss_parts(loss, y * f)[1]
            for t in range(T):
                c = mpmath.fsum(s[u] * (a[t] - a[u]) for u in range(T))
                w = lp * y * s[t] * c / n
                for j in range(d):
                    for k in range(d):
                        G[j, k] += w * mpmath.mpf(float(inst.X[i, t, j])) * mpmath.mpf(float(inst.z[i, k]))
        return G


#: ``risk`` of the exponential loss at ``|u| ≤ 709.5``: the output ``f = Σ_t s_t a_t`` is known to
#: ``(T + d)·eps·Σ_t s_t|a_t|`` (the documented δf, T = 2, d = 1), which ``ℓ = e^{−u}`` turns into a
#: relative error δf; the mean of n = 4 terms adds (n + 1)·eps. Four times their sum.
RISK_RTOL = 4 * (3 * 709.5 + 5) * EPS


def test_risk_near_float_max_is_the_mean_not_an_overflow() -> None:
    """One loss value e^{709.5} (above the log-branch threshold, below 1.8e308) among n = 4: the risk is
    their mean e^{709.5}/4 + ..., a normal double, returned to full precision.

    Oracle: mpmath mean of e^{−u_i}. (The log-domain overflow screen must subtract log n: adding it
    called the representable risk e^{708.1} an overflow.)
    """
    u0 = 709.5
    assert u0 > LOG_FLOAT_MAX - 1.0  # the risk is decided in the log domain first
    X = np.array([[[-u0], [-u0]], [[10.0], [10.0]], [[3.0], [3.0]], [[1.0], [1.0]]])  # two equal tokens
    inst = A.Instance(X, np.ones(4), np.array([1.0]), np.array([[1.0]] * 4))
    W = np.zeros((1, 1))
    got = A.risk(inst, W, loss="exponential")
    want = mp_risk(inst, W, "exponential")
    assert abs(mpmath.mpf(got) - want) <= RISK_RTOL * abs(want)


#: The gradient at |ℓ'| = e^{1500} with tiny data: the built-in exponential loss's ℓ' depends on the
#: output f = −1500 known to κδf ≈ (T + d)·eps·Σ s|a| ≈ 4·1600·eps = 1.4e-12 (the documented δf);
#: the rest is (nT + T + d)·eps. Four times their sum.
HUGE_DERIVATIVE_RTOL = 4 * (4 * 1600 + 8) * EPS


def test_risk_grad_with_overflowing_derivative_and_tiny_data_is_exact() -> None:
    """``|ℓ'| = e^{1500}`` (not a double) times data of size 2^−1010 gives ``||∇L|| ≈ 2^161``, a normal
    double: ``risk_grad`` returns it to the documented accuracy (the factor ``e^top·2^E`` applied
    without over- or underflowing on its own).

    Oracle: mpmath gradient at 40 digits (hand-checkable: W = 0, s = ½, ∇L = ℓ'·½(a₁−a₂)/2·(x₁ − x₂)zᵀ).
    """
    x = 2.0**-1010
    X = np.array([[[x, 0.0], [0.0, x]]])
    v = np.array([-1400.0 * 2.0**1010, -1600.0 * 2.0**1010])  # a = (−1400, −1600), f = −1500
    z = np.array([[2.0**-1000, 2.0**-1000]])
    inst = A.Instance(X, np.ones(1), v, z)
    W = np.zeros((2, 2))
    got = A.risk_grad(inst, W, loss="exponential")
    want = mp_grad(inst, W, "exponential")
    err = mpmath.sqrt(
        mpmath.fsum((mpmath.mpf(float(got[j, k])) - want[j, k]) ** 2 for j in range(2) for k in range(2))
    )
    norm = mpmath.mnorm(want, "f")
    assert math.log(norm) > 100  # the regime: a normal gradient from an overflowing ℓ' and tiny data
    assert err <= HUGE_DERIVATIVE_RTOL * norm


def test_normalized_direction_refuses_exact_zero_despite_an_unrepresentable_logit_gap() -> None:
    """Both tokens have the same value (a = 1), so ``a_t − f = 0`` and ``∇L = 0`` exactly, although the
    logit gap 2e308 leaves the second weight below ``e^{−1.8e308}``: the gradient is an exact 0 (W is
    stationary), not an unrepresentable nonzero one.

    Oracle: hand-derived (``c_t = Σ_u s_u (a_t − a_u) = 0`` for every t); the documented messages.
    """
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.ones(1), np.array([1.0, 1.0]), np.array([[1.0, 0.0]]))
    W = np.array([[1e308, 0.0], [-1e308, 0.0]])  # logits ±1e308: gap 2e308 > 1.8e308
    assert np.array_equal(A.risk_grad(inst, W), np.zeros((2, 2)))
    with pytest.raises(NumericalError, match="exactly zero"):
        A.normalized_risk_grad(inst, W)


def test_signed_log_derivative_has_the_margins_shape_and_float64_logs() -> None:
    """``(sign ℓ'(u), log|ℓ'(u)|)`` elementwise: for the exponential loss ``ℓ' = −e^{−u}``, so the sign is
    −1 and the log is ``−u`` at every margin, as float64 even for integer margins.

    Oracle: hand-derived (``ℓ(u) = e^{−u}``), and mpmath ``log(1/(1+e^u))`` for the logistic loss.
    """
    u = np.array([-3, 0, 2, 40])
    sign, log_mag = signed_log_derivative(get_loss("exponential"), u)
    assert sign.shape == u.shape and np.all(sign == -1.0)
    assert log_mag.dtype == np.float64 and np.array_equal(log_mag, -u.astype(np.float64))
    uf = np.array([-30.0, 0.0, 1.5, 700.0])
    sign, log_mag = signed_log_derivative(get_loss("logistic"), uf)
    assert sign.shape == uf.shape and np.all(sign == -1.0)
    want = [float(mpmath.log(1 / (1 + mpmath.exp(mpmath.mpf(x))))) for x in uf]
    # log|ℓ'| = −softplus(u): one log1p/exp each, a few ulps of max(1, |u|).
    assert np.allclose(log_mag, want, rtol=8 * EPS, atol=8 * EPS)


def mp_magnitudes(inst: A.Instance, W: np.ndarray, loss: str) -> tuple[mpmath.mpf, mpmath.mpf]:
    """``(M̃, VE)`` of the module docstring at ``ORACLE_DPS`` digits, from their definitions.

    ``M̃ = Σ_it |ℓ'_i| s_it Σ_u s_iu |a_it − a_iu| ||x_it|| ||z_i|| / n`` and
    ``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (|a|_it + |a|_iu) ||x_it|| ||z_i|| / n``,
    ``|a|_it = Σ_k |v_k x_itk|``.
    """
    with mpmath.workdps(ORACLE_DPS):
        n, T, d = inst.X.shape
        mpf = mpmath.mpf
        m_tot, ve_tot = mpf(0), mpf(0)
        for i in range(n):
            s, a, f = _mp_forward(inst, W, i)
            lp = abs(_mp_loss_parts(loss, mpf(float(inst.Y[i])) * f)[1])
            zn = mpmath.norm([mpf(float(c)) for c in inst.z[i]])
            absa = [
                mpmath.fsum(abs(mpf(float(inst.X[i, t, k])) * mpf(float(inst.v[k]))) for k in range(d))
                for t in range(T)
            ]
            for t in range(T):
                xn = mpmath.norm([mpf(float(c)) for c in inst.X[i, t]])
                spread = mpmath.fsum(s[u] * abs(a[t] - a[u]) for u in range(T))
                mix = mpmath.fsum(
                    s[u] * (absa[t] + absa[u])
                    for u in range(T)
                    if not np.array_equal(inst.X[i, u], inst.X[i, t])
                )
                m_tot += lp * s[t] * spread * xn * zn / n
                ve_tot += d * mpf(EPS) * lp * s[t] * mix * xn * zn / n
        return m_tot, ve_tot


#: The refusal threshold of both functions (documented): ``||Ĝ|| ≤ 8·(nT·eps·M + VE)``.
CANCELLATION_FACTOR = 8


def _near_threshold_instance(scale_z: int) -> A.Instance:
    """n = 1, T = 2, d = 8: tokens ``(1, ±δ, 0…)``, ``v = e₂``, W = 0, so ``∇L = −(δ²/2)·e₂zᵀ`` while
    ``M = δ/2·||z||``: ``||∇L||/M = δ``, and ``VE = d·eps·M``. With ``δ = 88·eps`` the gradient is 1.1 times
    the refusal threshold ``8·(nT + d)·eps·M = 80·eps·M`` (every value exact in float64)."""
    d, delta = 8, 88 * EPS
    X = np.zeros((1, 2, d))
    X[0, :, 0] = 1.0
    X[0, 0, 1], X[0, 1, 1] = delta, -delta
    v = np.zeros(d)
    v[1] = 1.0
    z = np.zeros((1, d))
    z[0, 0] = 2.0**scale_z
    return A.Instance(X, np.ones(1), v, z)


def test_risk_grad_just_above_the_rounding_level_is_returned_accurately() -> None:
    """A gradient 1.1× above the documented refusal level ``8·(nT·eps·M + VE)`` (log-domain path: z of
    size 2^900) is returned, within its documented error ``(nT + T + d)·eps·M̃ + VE + κδf·M̃``.

    Oracle: mpmath gradient, ``M̃`` and ``VE`` from their definitions at 40 digits (the threshold's
    shape ``nT`` is checked: ``||∇L||`` lies below ``8·(n·d·eps·M + VE)`` and ``8·(T²·eps·M + VE)``).
    """
    inst = _near_threshold_instance(900)
    n, T, d = inst.X.shape
    W = np.zeros((d, d))
    want = mp_grad(inst, W, "logistic")
    norm = mpmath.mnorm(want, "f")
    m_tilde, ve = mp_magnitudes(inst, W, "logistic")
    assert norm > 1.05 * CANCELLATION_FACTOR * (n * T * EPS * m_tilde + ve)  # M = M̃ here (two tokens)
    assert norm < 0.95 * CANCELLATION_FACTOR * (T * T * EPS * m_tilde + ve)  # the regime: near the level
    got = A.risk_grad(inst, W, loss="logistic")
    err = mpmath.sqrt(
        mpmath.fsum((mpmath.mpf(float(got[j, k])) - want[j, k]) ** 2 for j in range(d) for k in range(d))
    )
    # δf = (T + d)·eps·Σ s|a| (W = 0: no logit rounding), κ ≤ 1 for the logistic loss.
    delta_f = (T + d) * EPS * 88 * EPS
    assert err <= (n * T + T + d) * EPS * m_tilde + ve + delta_f * m_tilde


def test_normalized_direction_just_above_the_rounding_level_is_returned_accurately() -> None:
    """The same instance at scale 1: ``normalized_risk_grad`` returns the unit direction (not the
    rounding-level refusal), within twice the documented relative error, and ``log||∇L||`` to it.

    Oracle: mpmath gradient, ``M̃`` and ``VE`` at 40 digits.
    """
    inst = _near_threshold_instance(0)
    n, T, d = inst.X.shape
    W = np.zeros((d, d))
    want = mp_grad(inst, W, "logistic")
    norm = mpmath.mnorm(want, "f")
    m_tilde, ve = mp_magnitudes(inst, W, "logistic")
    rel = ((n * T + T + d) * EPS * m_tilde + ve) / norm
    got = A.normalized_risk_grad(inst, W, loss="logistic")
    err = mpmath.sqrt(
        mpmath.fsum(
            (mpmath.mpf(float(got.direction[j, k])) - want[j, k] / norm) ** 2
            for j in range(d)
            for k in range(d)
        )
    )
    assert err <= 2 * rel  # a unit vector's error is at most twice the relative error of the vector
    assert abs(got.log_norm - float(mpmath.log(norm))) <= 2 * rel


def test_normalized_direction_refuses_just_below_the_rounding_level_of_two_sequences() -> None:
    """Two near-threshold sequences (the second with a query 0.75 times the first's, so its terms are
    rescaled by a non-power-of-two factor against the largest): the gradient is 0.92 times the documented
    refusal level ``8·(nT·eps·M + VE)``, with both sequences' ``VE`` counted, so the direction is refused.

    Oracle: ``M̃`` (= M: two tokens per sequence), ``VE`` and ``||∇L||`` in mpmath at 40 digits; the
    documented message.
    """
    d, delta = 8, 88 * EPS
    X = np.zeros((2, 2, d))
    X[:, :, 0] = 1.0
    X[:, 0, 1], X[:, 1, 1] = delta, -delta
    v = np.zeros(d)
    v[1] = 1.0
    z = np.zeros((2, d))
    z[0, 0], z[1, 0] = 1.0, 0.75
    inst = A.Instance(X, np.ones(2), v, z)
    n, T, _ = inst.X.shape
    W = np.zeros((d, d))
    norm = mpmath.mnorm(mp_grad(inst, W, "logistic"), "f")
    m_tilde, ve = mp_magnitudes(inst, W, "logistic")
    level = CANCELLATION_FACTOR * (n * T * EPS * m_tilde + ve)
    assert 0.9 * level < norm < 0.95 * level  # just below the level (VE is 2/3 of it)
    with pytest.raises(NumericalError, match="rounding level"):
        A.normalized_risk_grad(inst, W, loss="logistic")
