"""Losses: values, derivatives, assumptions, overflow behaviour, torch compatibility."""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError, UnknownNameError
from attnsvm.model._losses import LossLike, get_loss

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
    g = A.risk_grad(inst, W, loss=custom)
    h = 1e-6
    E = np.zeros_like(W)
    E[1, 2] = 1.0
    fd = (A.risk(inst, W + h * E, loss=custom) - A.risk(inst, W - h * E, loss=custom)) / (2 * h)
    assert g[1, 2] == pytest.approx(fd, rel=1e-6, abs=1e-9)
    d = A.normalized_risk_grad(inst, W, loss=custom)  # mixed-sign ℓ' goes through the signed-log path
    np.testing.assert_allclose(d.direction, g / np.linalg.norm(g), atol=1e-13)


# ------------------------------------------------------------ the contracts pinned by mutation testing
def _gauss_loss():
    """ℓ(u) = e^{−u²/2}, ℓ'(u) = −u·e^{−u²/2}: a custom loss with no log form, decreasing only for u > 0."""
    return A.Loss(
        "gauss",
        lambda u: A.model._losses._xp(u).exp(-(u**2) / 2),
        lambda u: -u * A.model._losses._xp(u).exp(-(u**2) / 2),
        A.LossAssumptions(False, True, True, True),
    )


def test_log_neg_derivative_of_a_custom_loss_defaults_to_log_of_minus_the_derivative():
    # log(−ℓ'(u)) = log u − u²/2 by hand: −1/2 at u = 1, log 2 − 2 at u = 2; −inf where ℓ' = 0
    # (u = 0, and u = 40 where e^{−800} underflows to 0); NaN where ℓ' > 0 (u = −2: no logarithm).
    u = np.array([-2.0, 0.0, 1.0, 2.0, 40.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # log 0 and log of a negative are expected, not warned about
        got = _gauss_loss().log_neg_derivative(u)
    assert np.isnan(got[0])
    assert got[1] == -np.inf and got[4] == -np.inf
    np.testing.assert_allclose(got[2:4], [-0.5, np.log(2.0) - 2.0], rtol=LOSS_RTOL)


def test_log_neg_derivative_of_a_custom_loss_stays_in_torch_and_differentiable():
    # d/du [log u − u²/2] = 1/u − u: 0 at u = 1, −3/2 at u = 2 (hand-derived).
    u = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    got = _gauss_loss().log_neg_derivative(u)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.detach().numpy(), [-0.5, np.log(2.0) - 2.0], rtol=LOSS_RTOL)
    (grad,) = torch.autograd.grad(got.sum(), u)
    np.testing.assert_allclose(grad.numpy(), [0.0, -1.5], rtol=LOSS_RTOL, atol=LOSS_RTOL)


# error: the overflow check must read the tensor's value without touching autograd (a UserWarning
# "Converting a tensor with requires_grad=True to a scalar" reached users before)
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name", list(ORACLES))
def test_torch_losses_are_differentiable_by_autograd(name):
    """The torch engine differentiates through the built-in losses: d ℓ/du = ℓ' and d ℓ'/du = ℓ''
    (50-digit mpmath derivatives of the oracles), so every operation must stay in torch. u = 0 is
    left out: the overflow-free forms use max(x, 0) and |x|, whose autograd subgradients at the kink
    are not the smooth derivative."""
    pts = [-3.0, -1e-3, 0.5, 2.0, 40.0]
    loss = get_loss(name)
    val, der = ORACLES[name]
    for fn, ref in ((loss.value, val), (loss.derivative, der)):
        u = torch.tensor(pts, dtype=torch.float64, requires_grad=True)
        out = fn(u)
        assert isinstance(out, torch.Tensor)
        expected = [float(mpmath.diff(ref, mpmath.mpf(x))) for x in pts]
        if not out.requires_grad:  # constant in u (the correlation ℓ' = −1): its derivative is 0
            assert expected == [0.0] * len(pts)
            continue
        (grad,) = torch.autograd.grad(out.sum(), u)
        np.testing.assert_allclose(grad.numpy(), expected, rtol=LOSS_RTOL, atol=1e-300)


def test_exponential_refusal_states_the_size_of_the_overflow():
    # e^{800} = 10^{800·log10 e} = 10^{347.4...}: the message rounds the decimal exponent.
    expo = int(mpmath.nint(800 * mpmath.log10(mpmath.e)))
    assert expo == 347
    expected = (
        f"the exponential loss e^{{-u}} is about 1e+{expo}: it overflows float64's normal range "
        "[2.2e-308, 1.8e308] (margin u < -709.78); rescale the data or use the logistic loss"
    )
    for u in (np.array([1.0, -800.0]), torch.tensor([-800.0, 1.0], dtype=torch.float64)):
        with pytest.raises(NumericalError) as info:
            A.LOSSES["exponential"].derivative(u)
        assert str(info.value) == expected


def test_exponential_is_returned_up_to_the_largest_double():
    # u = −log(1.797...e308) rounded: e^{−u} is the largest finite double (mpmath), not a refusal;
    # the next double below u overflows float64.
    from attnsvm.model._losses import EXP_OVERFLOW

    u = np.array([-EXP_OVERFLOW])
    expected = float(mpmath.exp(mpmath.mpf(EXP_OVERFLOW)))
    assert A.LOSSES["exponential"].value(u)[0] == pytest.approx(expected, rel=LOSS_RTOL)
    with pytest.raises(NumericalError, match="overflows"):
        A.LOSSES["exponential"].value(np.nextafter(u, -np.inf) - 1e-9)


@pytest.mark.parametrize("name", list(ORACLES))
def test_losses_of_no_margins_are_empty(name):
    loss = get_loss(name)
    for empty in (np.zeros(0), torch.zeros(0, dtype=torch.float64)):
        for fn in (loss.value, loss.derivative, loss.log_neg_derivative):
            out = fn(empty)
            assert type(out) is type(empty) and out.shape == (0,)


def test_loss_error_messages_are_exact():
    with pytest.raises(UnknownNameError) as info:
        get_loss("hinge")
    assert str(info.value) == "unknown loss 'hinge'; expected one of 'logistic', 'exponential', 'correlation'"
    with pytest.raises(AttnSVMError) as info:
        get_loss(object())
    assert str(info.value) == (
        "loss must be one of ('logistic', 'exponential', 'correlation') or an object with value(u), "
        "derivative(u) and assumptions; got object"
    )


def test_duck_typed_loss_is_returned_as_is():
    class Duck:
        assumptions = A.LossAssumptions(True, True, True, False)

        def value(self, u):
            return -u

        def derivative(self, u):
            return -np.ones_like(u)

    duck = Duck()
    assert get_loss(duck) is duck
    assert isinstance(duck, LossLike)
    for missing in ("value", "derivative", "assumptions"):
        partial = type(
            "Partial",
            (),
            {k: getattr(Duck, k) for k in ("value", "derivative", "assumptions") if k != missing},
        )()
        with pytest.raises(AttnSVMError, match="got Partial"):
            get_loss(partial)
