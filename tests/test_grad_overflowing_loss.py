"""A custom loss whose derivative overflows float64 at a margin: refused by name, never a zero gradient.

Defect (session 10): with a ``Loss`` whose ``log_neg_derivative_fn`` gives ``log(−ℓ'(u)) = +inf`` (here
``ℓ'(u) = −e^{−u}`` at ``u = −800`` with the log form computed as ``log(e^{−u})``), the log-domain gradient
read the ``+inf`` log as "no live term": ``normalized_risk_grad`` said the gradient is "exactly zero" and
``risk_grad`` returned the zero matrix, ``run_gd`` treated the iterate as stationary. The true gradient is
not 0; its size is beyond float64.

Oracle: mpmath at :data:`ORACLE_DPS` digits of the same instance (exact doubles in, the closed-form
gradient ``(1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ`` out): its norm is nonzero and above
float64's largest double, so the only right answers are a refusal naming the overflow (the scale contract),
never 0 and never a finite number.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.model import Loss, LossAssumptions, normalized_risk_grad, risk_grad

#: Digits of the mpmath oracle: the instance's doubles are exact, and the question is only whether
#: ``||∇L||`` is 0, a double, or beyond float64 (e^{800} against 1.8e308): 60 digits decide it by far.
ORACLE_DPS = 60
#: The margin ``u = Y f`` at ``W = 0``: the mean of the values −790 and −810 (uniform weights).
MARGIN = -800.0

_ASSUMPTIONS = LossAssumptions(True, False, True, True)


def _exp_neg(u: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(-np.asarray(u, dtype=np.float64))


def _instance() -> A.Instance:
    """One sequence, keys e₁ and e₂, v = (−790, −810), any query: at ``W = 0`` the weights are ½ each and
    ``f = −800``."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    return A.Instance(X, np.array([1.0]), np.array([-790.0, -810.0]), np.array([[0.3, -0.2]]))


def _log_inf_loss() -> Loss:
    """``ℓ(u) = e^{−u}`` with ``log_neg_derivative_fn`` computed by exponentiating: ``+inf`` at ``u = −800``."""
    return Loss("exp-by-exp", _exp_neg, lambda u: -_exp_neg(u), _ASSUMPTIONS, lambda u: np.log(_exp_neg(u)))


def _no_log_loss() -> Loss:
    """The same loss without a log form: ``ℓ'(−800) = −inf`` in float64."""
    return Loss("exp-no-log", _exp_neg, lambda u: -_exp_neg(u), _ASSUMPTIONS)


def _oracle_log_norm(inst: A.Instance) -> mpmath.mpf:
    """``log||∇L(0)||_F`` in mpmath for ``ℓ'(u) = −e^{−u}`` (uniform weights at ``W = 0``)."""
    with mpmath.workdps(ORACLE_DPS):
        n, T, d = inst.shape
        G = [[mpmath.mpf(0)] * d for _ in range(d)]
        for i in range(n):
            xs = [[mpmath.mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
            zs = [mpmath.mpf(float(c)) for c in inst.z[i]]
            a = [mpmath.fsum(x[k] * mpmath.mpf(float(inst.v[k])) for k in range(d)) for x in xs]
            s = [mpmath.mpf(1) / T] * T
            f = mpmath.fsum(s[t] * a[t] for t in range(T))
            u = mpmath.mpf(float(inst.Y[i])) * f
            dl = -mpmath.exp(-u)
            for t in range(T):
                w = dl * mpmath.mpf(float(inst.Y[i])) * s[t] * (a[t] - f) / n
                for j in range(d):
                    for k in range(d):
                        G[j][k] += w * xs[t][j] * zs[k]
        return mpmath.log(mpmath.sqrt(mpmath.fsum(c * c for row in G for c in row)))


def test_the_oracle_gradient_is_nonzero_and_beyond_float64() -> None:
    """The premise of the tests below, from mpmath: ``||∇L(0)||`` is about e^{800}: not 0, not a double."""
    inst = _instance()
    log_norm = _oracle_log_norm(inst)
    assert float(inst.Y[0]) * float(np.mean(inst.X[0] @ inst.v)) == MARGIN
    assert log_norm > math.log(float(np.finfo(np.float64).max))


@pytest.mark.parametrize("make_loss", [_log_inf_loss, _no_log_loss], ids=["log-fn-inf", "no-log-fn"])
@pytest.mark.parametrize("fn", [normalized_risk_grad, risk_grad], ids=["normalized_risk_grad", "risk_grad"])
def test_an_overflowing_loss_derivative_is_refused_by_name_not_read_as_zero(make_loss, fn) -> None:
    """Oracle: mpmath (above): ``∇L ≠ 0`` and beyond float64, so a zero gradient ("exactly zero", or
    ``risk_grad`` returning zeros, as before the fix for the log form) is wrong; the refusal names the
    margin, the overflow and the remedies (a finite ``log_neg_derivative_fn``, or rescaling)."""
    inst = _instance()
    assert _oracle_log_norm(inst) > 0
    with pytest.raises(NumericalError) as info:
        fn(inst, np.zeros((2, 2)), loss=make_loss())
    msg = str(info.value)
    assert msg.startswith("the loss derivative is not finite")
    assert f"at the margin u = Y_0 f_0 = {MARGIN:.6g}" in msg
    assert "overflows float64's range [2.2e-308, 1.8e308]" in msg
    assert "log_neg_derivative_fn" in msg and "rescale the data" in msg
    assert "exactly zero" not in msg


def test_a_nan_log_derivative_is_refused_as_well() -> None:
    """Oracle: a log form giving NaN (here at every margin) carries no size at all: refused, naming NaN;
    never a zero gradient (it was read as "no live term" like ``+inf``)."""
    loss = Loss("nan-log", _exp_neg, lambda u: -_exp_neg(u), _ASSUMPTIONS, lambda u: np.full_like(u, np.nan))
    with pytest.raises(NumericalError, match=r"log\(−ℓ'\(u\)\) = NaN") as info:
        normalized_risk_grad(_instance(), np.zeros((2, 2)), loss=loss)
    assert "exactly zero" not in str(info.value)


@pytest.mark.parametrize("normalized", [True, False], ids=["normalized", "plain"])
def test_run_gd_refuses_the_overflowing_derivative_at_step_one_never_as_stationary(normalized: bool) -> None:
    """Oracle: mpmath (above): ``∇L(W_0) ≠ 0``, so ``W_0`` is not stationary; ``run_gd`` names the step and
    the cause (before: normalized GD refused it as "exactly zero", plain GD stopped as "stationary" and then
    failed on the loss value)."""
    inst = _instance()
    assert _oracle_log_norm(inst) > 0
    with pytest.raises(NumericalError) as info:
        A.run_gd(inst, 2, 0.1, normalized=normalized, loss=_log_inf_loss())
    msg = str(info.value)
    assert msg.startswith(
        f"{'normalized' if normalized else 'plain'} GD at step 1: the loss derivative is not finite"
    )
    assert "log_neg_derivative_fn" in msg and "exactly zero" not in msg


def test_a_zero_loss_derivative_is_still_a_zero_gradient() -> None:
    """The other end, unchanged: ``log(−ℓ') = −inf`` (``ℓ' = 0`` exactly, e.g. a hinge past its margin) is a
    value, and with it every term is exactly 0: "exactly zero" by hand (``ℓ' = 0`` times anything)."""
    loss = Loss(
        "flat",
        lambda u: np.zeros_like(u),
        lambda u: np.zeros_like(u),
        _ASSUMPTIONS,
        lambda u: np.full_like(u, -np.inf),
    )
    with pytest.raises(NumericalError, match="exactly zero"):
        normalized_risk_grad(_instance(), np.zeros((2, 2)), loss=loss)
    assert np.array_equal(risk_grad(_instance(), np.zeros((2, 2)), loss=loss), np.zeros((2, 2)))
