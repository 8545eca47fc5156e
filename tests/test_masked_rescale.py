"""run_gd on a masked instance whose normal token values ``v·2^ex`` cannot carry (``gd._scaled._rescale``).

Defect (session 10): the engines compute on ``X' = X·2^−ex``, ``v' = v·2^ex`` (``ex`` the exponent of the
largest allowed key), and refused every instance whose ``v'`` overflows or rounds, naming the token values
as out of range, also where every token value ``vᵀx_it`` is a normal double: here ``v = (2^−60, 2^1000)``
and allowed keys ``(0.75·2^30, 0.75·2^−1000)`` give values near 1, but ``v_1·2^30`` overflows.
``normalized_risk_grad`` returns the direction. The scale contract decides: the data and the answer are
doubles and the values are normal, so ``run_gd`` must answer (its refusal is for values that are not
normal, :meth:`attnsvm.Instance.values`); ``run_gd`` now carries ``v`` at another exponent (``X`` and ``z``
shifted the other way, exactly; the logits and values unchanged).

The instance is masked: one token per sequence, huge (``2^900``, ``2^400``), is masked; unmasked, its value
``2^1400`` is no double, so only "masked tokens take no part" makes the instance valid. (The masked key
itself never caused the refusal: the scale is taken from :attr:`attnsvm.Instance.keys`, masked tokens
zeroed.)

Oracles: mpmath at :data:`ORACLE_DPS` digits of the instance with the masked tokens deleted (the closed-form
gradient at ``W = 0``, its direction and norm, and the documented error bound's ``M̃`` and ``VE``); and
deletion (an exact construction: the masked instance is the unmasked one with those tokens deleted).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.gd._scaled import _rescale

EPS = 2.0**-53
#: Digits of the mpmath oracle: every input is an exact double (dyadic, at most 3 significant bits) and the
#: oracle's steps (exp, sums, sqrt) each lose a few of 60 digits: far below float64's 16.
ORACLE_DPS = 60
#: Normalized GD's step size (any; one step from ``W_0 = 0`` is ``−lr·direction``).
LR = 0.1
#: Plain GD's step size: ``W_1 = −lr·∇L(0)``.
LR_PLAIN = 1e-3
#: The documented accuracy of the direction (``normalized_risk_grad``, module docstring of
#: ``attnsvm.model._grad``): ``2ε`` normwise with ``ε = [(nT + T + d)·eps·M̃ + VE]/||∇L||`` at ``W = 0`` (no
#: logit rounding: the logits are exactly 0), ``M̃`` the terms' magnitudes and ``VE`` the values' rounding,
#: both from the oracle. The data span 2^1030 within a token, so the core's split form computes each value
#: ``x''ᵀv'`` of per-token rescaled data in the subnormal range: ``VE`` includes its documented underflow
#: allowance ``VALUE_UNDERFLOW_ALLOWANCE = 2^−1020`` in the pair's units (:data:`UNDERFLOW_ALLOWANCE`).
#: ``ROUNDINGS`` covers the constant number of roundings per term that the first-order bound leaves out (a
#: product, an exp, a division by the norm), and 2^−1074 absolute per entry the entries of the direction
#: that are subnormal (``x_1 z`` ≈ 2^−1030: they round on the subnormal grid).
ROUNDINGS = 4.0
#: ``attnsvm.model._grad.VALUE_UNDERFLOW_ALLOWANCE``, restated: a value of per-token rescaled data (entries
#: ≤ 1) whose products underflow loses ≤ ``d·2^−1074 = d·eps·2^−1021`` in the token's units
#: ``2^(e(max|x_t|) + e(max|v|))`` (``e`` the binary exponent), so ``2^−1020`` covers a pair.
UNDERFLOW_ALLOWANCE = 2.0**-1020

_MASKED_KEYS = ([2.0**900, 2.0**400], [-(2.0**899), 2.0**401])


def _masked() -> A.Instance:
    """Two sequences of three keys, one masked each (position 2, then 0); the allowed keys' entries span
    2^1030 and so does ``v``, the values are 0.75, 0.625, 1, −0.875 (plus 2^−31-size parts)."""
    X = np.zeros((2, 3, 2))
    X[0, 0] = [0.75 * 2.0**30, 0.75 * 2.0**-1000]
    X[0, 1] = [-0.5 * 2.0**30, 0.625 * 2.0**-1000]
    X[0, 2] = _MASKED_KEYS[0]
    X[1, 0] = _MASKED_KEYS[1]
    X[1, 1] = [0.625 * 2.0**28, 0.5 * 2.0**-999]
    X[1, 2] = [0.5 * 2.0**29, -0.875 * 2.0**-1000]
    mask = np.array([[True, True, False], [False, True, True]])
    z = np.array([[0.75 * 2.0**-30, -0.5 * 2.0**-30], [0.625 * 2.0**-30, 0.875 * 2.0**-30]])
    return A.Instance(X, np.array([1.0, -1.0]), np.array([2.0**-60, 2.0**1000]), z, mask=mask)


def _deleted(inst: A.Instance) -> A.Instance:
    """The masked instance with its masked tokens deleted (each sequence keeps two)."""
    assert inst.mask is not None
    X = np.stack([inst.X[i][inst.mask[i]] for i in range(inst.n)])
    return A.Instance(X, inst.Y, inst.v, inst.z)


def _oracle(inst: A.Instance) -> tuple[np.ndarray, float, float]:
    """From the deleted instance in mpmath, at ``W = 0`` under the logistic loss: the unit direction of
    ``∇L``, ``log||∇L||_F`` and the documented bound ``ε`` on the direction's relative error (see
    :data:`ROUNDINGS`)."""
    with mpmath.workdps(ORACLE_DPS):
        mp = mpmath.mpf
        n, T, d = inst.shape
        v = [mp(float(c)) for c in inst.v]
        G = [[mp(0)] * d for _ in range(d)]
        M = VE = mp(0)
        for i in range(n):
            xs = [[mp(float(c)) for c in inst.X[i, t]] for t in range(T)]
            z = [mp(float(c)) for c in inst.z[i]]
            a = [mpmath.fsum(x[k] * v[k] for k in range(d)) for x in xs]
            amag = [mpmath.fsum(abs(x[k] * v[k]) for k in range(d)) for x in xs]
            # each token's units: its largest entry's and v's binary exponents
            ev = math.frexp(float(np.max(np.abs(inst.v))))[1]
            units = [
                mpmath.ldexp(1, math.frexp(float(np.max(np.abs(inst.X[i, t]))))[1] + ev) for t in range(T)
            ]
            s = mp(1) / T  # W = 0: uniform weights
            f = mpmath.fsum(s * at for at in a)
            y = mp(float(inst.Y[i]))
            dl = -1 / (1 + mpmath.exp(y * f))  # logistic ℓ'(u) = −1/(1 + e^u)
            zn = mpmath.sqrt(mpmath.fsum(c * c for c in z))
            for t in range(T):
                w = dl * y * s * (a[t] - f) / n
                for j in range(d):
                    for k in range(d):
                        G[j][k] += w * xs[t][j] * z[k]
                xn = mpmath.sqrt(mpmath.fsum(c * c for c in xs[t]))
                spread = mpmath.fsum(s * abs(a[t] - a[u]) for u in range(T))
                mix = mpmath.fsum(
                    s * (amag[t] + amag[u] + UNDERFLOW_ALLOWANCE * max(units[t], units[u]))
                    for u in range(T)
                    if u != t
                )
                M += abs(dl) * s * spread * xn * zn / n
                VE += abs(dl) * s * d * EPS * mix * xn * zn / n
        norm = mpmath.sqrt(mpmath.fsum(c * c for row in G for c in row))
        direction = np.array([[float(c / norm) for c in row] for row in G])
        eps_dir = ((n * T + T + d) * EPS * M + VE) / norm
        return direction, float(mpmath.log(norm)), float(eps_dir)


def _direction_tol(eps_dir: float) -> float:
    """The documented normwise bound ``2ε`` on the unit direction, with :data:`ROUNDINGS` and the subnormal
    entries' absolute rounding (4 entries, 2^−1074 each)."""
    return 2.0 * ROUNDINGS * eps_dir + 4 * 2.0**-1074


def test_the_instance_has_normal_values_that_v_times_2_to_the_ex_cannot_carry() -> None:
    """The premise, by hand: every allowed value is a normal double (``Instance.values``, near 1), the
    unmasked values are not (``2^400·2^1000``), and ``v·2^ex`` (ex = 30) overflows: the unshifted
    rescaling (``_rescale`` without ``shift``; every engine now calls it with ``shift=True``) refuses."""
    inst = _masked()
    vals = inst.values()[inst.allowed]
    assert np.all((np.abs(vals) >= 0.5) & (np.abs(vals) <= 2.0))
    with pytest.raises(NumericalError, match="token values"):
        A.Instance(inst.X, inst.Y, inst.v, inst.z).values()
    assert math.frexp(float(np.max(np.abs(inst.keys))))[1] == 30
    assert math.frexp(float(inst.v[1]))[1] + 30 > 1024  # v_1·2^30 ≥ 2^1024: no double
    with pytest.raises(NumericalError, match="token values"):
        _rescale(inst)


def test_normalized_run_gd_takes_the_direction_of_the_deleted_instance() -> None:
    """Oracle: mpmath of the deleted instance. ``run_gd``'s first normalized step from 0 is
    ``−lr·∇L/||∇L||`` to the documented bound, its ``log10||∇L||`` at step 0 to the same relative bound, and
    ``normalized_risk_grad`` gives that direction too (before the fix run_gd refused the instance)."""
    inst = _masked()
    direction, log_norm, eps_dir = _oracle(_deleted(inst))
    tol = _direction_tol(eps_dir)
    assert tol < 1e-10  # a real check: a wrong direction (or none) is off by O(1)
    tr = A.run_gd(inst, 1, LR, record_at=[0, 1], keep_iterates=True)
    assert tr.stop_reason == "steps" and tr.steps_run == 1
    W1 = tr.record[1].W
    assert W1 is not None
    assert np.linalg.norm(W1 / LR + direction) <= tol + EPS  # + the rounding of lr·direction
    assert abs(tr.record[0].log10_grad_norm * math.log(10.0) - log_norm) <= tol
    got = A.normalized_risk_grad(inst, np.zeros((2, 2)))
    assert np.linalg.norm(got.direction - direction) <= tol
    assert all(bool(inst.allowed[i, t]) for r in tr.record for i, t in enumerate(r.tokens))


def test_plain_run_gd_takes_the_gradient_of_the_deleted_instance() -> None:
    """Oracle: mpmath of the deleted instance: plain GD's first step from 0 is ``−lr·∇L`` (``||∇L||`` from the
    oracle's log-norm), to the direction's bound plus the norm's (the same ``ε``)."""
    inst = _masked()
    direction, log_norm, eps_dir = _oracle(_deleted(inst))
    tr = A.run_gd(inst, 1, LR_PLAIN, normalized=False, record_at=[1], keep_iterates=True)
    assert tr.stop_reason == "steps"
    expect = -LR_PLAIN * math.exp(log_norm) * direction
    assert np.linalg.norm(tr.W - expect) <= (2 * _direction_tol(eps_dir) + 2 * EPS) * np.linalg.norm(expect)


@pytest.mark.parametrize("normalized", [True, False], ids=["normalized", "plain"])
def test_the_masked_run_is_the_deleted_run(normalized: bool) -> None:
    """Oracle: deletion (masked tokens take no part): the masked and the deleted instance give the same
    iterates (to the rounding of sums with and without the zeroed keys: 4·eps relative per step) and the
    same tokens through the index map, over a few steps."""
    inst = _masked()
    lr = LR if normalized else LR_PLAIN
    a = A.run_gd(inst, 3, lr, normalized=normalized, record_at=1, keep_iterates=True)
    b = A.run_gd(_deleted(inst), 3, lr, normalized=normalized, record_at=1, keep_iterates=True)
    index = [np.flatnonzero(inst.allowed[i]) for i in range(inst.n)]
    for ra, rb in zip(a.record, b.record, strict=True):
        assert ra.W is not None and rb.W is not None
        assert np.linalg.norm(ra.W - rb.W) <= 4 * EPS * ra.step * np.linalg.norm(rb.W)
        assert [int(index[i][t]) for i, t in enumerate(rb.tokens)] == ra.tokens.tolist()


def test_masked_values_that_are_not_normal_are_refused_as_the_deleted_instance() -> None:
    """Oracle: deletion, and the contract's refusal where ``v·2^ex`` rounds and a value is not normal
    (:meth:`attnsvm.Instance.values` refuses it too): allowed keys of size ~0.3 (ex = −1) and ``v`` a few
    units of 2^−1074 give values ~1e-324 (``v/2`` rounds), refused alike masked and deleted with the same
    message, whatever the masked key (here 2^900, whose value would be normal: it never sets the scale)."""
    X = np.array([[[0.25, 0.375], [-0.3125, 0.25], [2.0**900, 2.0**900]]])
    v = np.array([3 * 2.0**-1074, -5 * 2.0**-1074])
    masked = A.Instance(X, np.array([1.0]), v, np.array([[0.5, -0.75]]), mask=np.array([[True, True, False]]))
    deleted = _deleted(masked)
    with pytest.raises(NumericalError, match="token values"):
        deleted.values()
    msgs = []
    for inst in (masked, deleted):
        with pytest.raises(NumericalError) as info:
            A.run_gd(inst, 1, LR)
        msgs.append(str(info.value))
        assert msgs[-1].endswith("Rescale v or X so that the token values vᵀx_it are normal doubles")
    assert msgs[0] == msgs[1]
