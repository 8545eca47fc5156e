"""Losses: values, derivatives, assumptions, overflow behaviour, torch compatibility."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError, UnknownNameError
from attnsvm.losses import get_loss

EPS = np.finfo(np.float64).eps
#: value and derivative are a handful of correctly rounded operations (exp, log1p, one
#: division): relative error ≤ ~4 eps; 16 eps leaves room for libm's 1-ulp functions.
LOSS_RTOL = 16 * EPS

POINTS = np.array([-700.0, -50.0, -3.0, -1e-3, 0.0, 1e-8, 0.5, 2.0, 40.0, 700.0, 1e4])

mpmath.mp.dps = 50
ORACLES = {
    "logistic": (lambda u: mpmath.log1p(mpmath.exp(-u)), lambda u: -1 / (1 + mpmath.exp(u))),
    "exponential": (lambda u: mpmath.exp(-u), lambda u: -mpmath.exp(-u)),
    "correlation": (lambda u: -u, lambda u: mpmath.mpf(-1)),
}


@pytest.mark.parametrize("name", list(ORACLES))
def test_value_and_derivative_against_50_digit_oracle(name):
    loss = get_loss(name)
    val, der = ORACLES[name]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is exact here
        got_v, got_d = loss.value(POINTS), loss.derivative(POINTS)
    for u, gv, gd in zip(POINTS, got_v, got_d, strict=True):
        ev, ed = float(val(mpmath.mpf(u))), float(der(mpmath.mpf(u)))
        assert gv == pytest.approx(ev, rel=LOSS_RTOL, abs=1e-300), (name, u)
        assert gd == pytest.approx(ed, rel=LOSS_RTOL, abs=1e-300), (name, u)


@pytest.mark.parametrize("name", list(ORACLES))
def test_log_neg_derivative(name):
    loss = get_loss(name)
    u = np.array([-30.0, 0.0, 3.0, 800.0, 1e5])
    got = loss.log_neg_derivative(u)
    der = ORACLES[name][1]
    expected = [float(mpmath.log(-der(mpmath.mpf(x)))) for x in u]
    np.testing.assert_allclose(got, expected, rtol=LOSS_RTOL, atol=LOSS_RTOL)
    assert np.all(np.isfinite(got))  # finite even where ℓ' underflows (logistic at 1e5)


def test_derivative_is_derivative_of_value():
    u = np.linspace(-5, 5, 21)
    h = 1e-5  # central difference: truncation h²·|ℓ'''|/6 ≈ 2e-11, rounding eps·|ℓ|/h ≈ 2e-11
    for name in ORACLES:
        loss = get_loss(name)
        fd = (loss.value(u + h) - loss.value(u - h)) / (2 * h)
        np.testing.assert_allclose(loss.derivative(u), fd, rtol=1e-8, atol=1e-8)


def test_declared_assumptions():
    assert A.LOSSES["logistic"].assumptions.derivative_bounded
    assert not A.LOSSES["exponential"].assumptions.derivative_bounded  # ℓ' unbounded as u → −∞
    assert not A.LOSSES["correlation"].assumptions.bounded_below
    for loss in A.LOSSES.values():
        assert loss.assumptions.strictly_decreasing
        assert loss.assumptions.derivative_lipschitz_on_bounded_sets
        assert np.all(loss.derivative(POINTS[:-2]) < 0)


def test_exponential_overflow_raises():
    with pytest.raises(NumericalError, match="overflows"):
        A.LOSSES["exponential"].value(np.array([-800.0]))
    with pytest.raises(NumericalError):
        A.LOSSES["exponential"].derivative(-800.0)


def test_torch_tensors_give_same_numbers():
    u = torch.tensor(POINTS[:-1], dtype=torch.float64)
    for loss in A.LOSSES.values():
        np.testing.assert_array_equal(loss.value(u).numpy(), loss.value(POINTS[:-1]))
        np.testing.assert_array_equal(loss.derivative(u).numpy(), loss.derivative(POINTS[:-1]))
    with pytest.raises(NumericalError):
        A.LOSSES["exponential"].value(torch.tensor([-800.0], dtype=torch.float64))


def test_unknown_and_malformed_losses():
    with pytest.raises(UnknownNameError, match="'logistic', 'exponential', 'correlation'"):
        get_loss("hinge")
    with pytest.raises(AttnSVMError, match="value\\(u\\), derivative\\(u\\)"):
        get_loss(object())


def test_custom_loss_is_accepted(inst, W):
    # ℓ(u) = e^{−u²/2}... not decreasing everywhere: a loss outside the theory's assumptions.
    custom = A.Loss(
        "gauss",
        lambda u: np.exp(-(u**2) / 2),
        lambda u: -u * np.exp(-(u**2) / 2),
        A.LossAssumptions(False, True, True, True),
    )
    g = A.risk_grad(inst, W, custom)
    h = 1e-6
    E = np.zeros_like(W)
    E[1, 2] = 1.0
    fd = (A.risk(inst, W + h * E, custom) - A.risk(inst, W - h * E, custom)) / (2 * h)
    assert g[1, 2] == pytest.approx(fd, rel=1e-6, abs=1e-9)
    d = A.normalized_risk_grad(inst, W, custom)  # mixed-sign ℓ' goes through the signed-log path
    np.testing.assert_allclose(d.direction, g / np.linalg.norm(g), atol=1e-13)
