"""Token values whose ``v`` or keys span beyond float64's range: carried exactly, or refused by name.

A (the engines' rescaling). The GD engines compute on ``X' = X·2^−ex``, ``z' = z·2^−ez``, ``v' = v·2^ex``.
Where ``v·2^ex`` leaves the range although every value ``vᵀx_it`` is a normal double (``v = (2^−60,
2^1000)``, keys ``(0.75·2^30, 0.75·2^−1000)``: values near 1, ``v_1·2^30`` overflows), ``run_gd`` carries
``v`` at another exponent (``gd._scaled._rescale(shift=True)``); ``run_gd_batch`` (``gd._stack``),
``run_gd_kq`` and ``regularization_path`` refused such instances, naming values "about 1e+310" that do
not exist. They now carry them as ``run_gd`` does.

B (the core). ``Instance.values`` and the log-domain gradient formed every value as ``X'_i v'`` with
``v' = v·2^−ev`` (``pow2_split``): where ``v`` spans more than 2^1074 its small entries flush to 0, so
values 0.75 and 0.5 came out 0, ``normalized_risk_grad`` returned a direction 0.03 off (a sequence left
with no live term also left the rounding-level check) or "exactly zero" when every sequence was affected.
Each value is now formed from per-entry exponents (``model._instance.token_values``).

Oracle: mpmath at :data:`ORACLE_DPS` digits from the definitions (values, logits, softmax, ``f``,
``ℓ'``, ``∇L``), with the documented error bound's terms (``M̃``, ``VE``, ``δl``, ``δf``) from the same
oracle; every input is an exact double.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.model import normalized_risk_grad

EPS = 2.0**-52
#: Digits of the mpmath oracle: the inputs are exact doubles, the oracle's exp, sums and square roots each
#: lose a few of 60 digits, far below float64's 16; exponents as large as 2^±1200 are exact in mpmath.
ORACLE_DPS = 60
#: The documented first-order bound (module docstring of ``attnsvm.model._grad``) leaves out a constant
#: number of roundings per term (a product, an exp, a division by the norm, the normalisation): a factor
#: 4 on it (as tests/test_masked_rescale.py).
ROUNDINGS = 4.0
#: Normalized GD's step size in the GD checks.
LR = 0.1


# ---------------------------------------------------------------------------------------------- oracle
def _mp(a: float) -> mpmath.mpf:
    return mpmath.mpf(float(a))


class _Oracle:
    """``∇L(W)`` of the logistic loss in mpmath, its unit direction and ``log||∇L||``, the risk, and the
    documented bound ``ε`` on the computed direction's relative error:
    ``ε = [(nT + T + d)·eps·M̃ + 2·max δl·M̃ + max κδf·M̃ + VE] / ||∇L||`` (``κ ≤ 1``)."""

    def __init__(self, inst: A.Instance, W: np.ndarray) -> None:
        with mpmath.workdps(ORACLE_DPS):
            n, T, d = inst.shape
            v = [_mp(c) for c in inst.v]
            Wm = [[_mp(W[j, k]) for k in range(d)] for j in range(d)]
            G = [[mpmath.mpf(0)] * d for _ in range(d)]
            M = VE = mpmath.mpf(0)
            dl_max = df_max = mpmath.mpf(0)
            risk = mpmath.mpf(0)
            self.values = np.zeros((n, T))
            for i in range(n):
                xs = [[_mp(c) for c in inst.X[i, t]] for t in range(T)]
                z = [_mp(c) for c in inst.z[i]]
                a = [mpmath.fsum(x[k] * v[k] for k in range(d)) for x in xs]
                amag = [mpmath.fsum(abs(x[k] * v[k]) for k in range(d)) for x in xs]
                self.values[i] = [float(c) for c in a]
                Wz = [mpmath.fsum(Wm[j][k] * z[k] for k in range(d)) for j in range(d)]
                logit = [mpmath.fsum(x[j] * Wz[j] for j in range(d)) for x in xs]
                lmag = max(
                    mpmath.fsum(abs(x[j] * Wm[j][k] * z[k]) for j in range(d) for k in range(d)) for x in xs
                )
                top = max(logit)
                ex = [mpmath.exp(lg - top) for lg in logit]
                s = [e / mpmath.fsum(ex) for e in ex]
                f = mpmath.fsum(s[t] * a[t] for t in range(T))
                y = _mp(inst.Y[i])
                u = y * f
                risk += mpmath.log1p(mpmath.exp(-u)) / n
                dl = -1 / (1 + mpmath.exp(u))  # logistic ℓ'(u) = −1/(1 + e^u)
                zn = mpmath.sqrt(mpmath.fsum(c * c for c in z))
                delta_l = d * d * EPS * lmag
                delta_f = ((T + d) * EPS + 2 * delta_l) * mpmath.fsum(s[t] * abs(a[t]) for t in range(T))
                dl_max, df_max = max(dl_max, delta_l), max(df_max, delta_f)
                for t in range(T):
                    w = dl * y * s[t] * (a[t] - f) / n
                    for j in range(d):
                        for k in range(d):
                            G[j][k] += w * xs[t][j] * z[k]
                    xn = mpmath.sqrt(mpmath.fsum(c * c for c in xs[t]))
                    spread = mpmath.fsum(s[u_] * abs(a[t] - a[u_]) for u_ in range(T))
                    mix = mpmath.fsum(s[u_] * (amag[t] + amag[u_]) for u_ in range(T) if xs[u_] != xs[t])
                    M += abs(dl) * s[t] * spread * xn * zn / n
                    VE += abs(dl) * s[t] * d * EPS * mix * xn * zn / n
            norm = mpmath.sqrt(mpmath.fsum(c * c for row in G for c in row))
            self.G = G
            self.direction = np.array([[float(c / norm) for c in row] for row in G])
            self.log_norm = float(mpmath.log(norm))
            self.risk = float(risk)
            self.eps = float(((n * T + T + d) * EPS * M + 2 * dl_max * M + df_max * M + VE) / norm)

    def tol(self, d: int) -> float:
        """Normwise bound on the computed unit direction: ``2ε`` times :data:`ROUNDINGS`, plus ``2^−1074``
        absolute per entry (entries ``x_2·z`` of size 2^−1030 round on the subnormal grid)."""
        return 2.0 * ROUNDINGS * self.eps + d * d * 2.0**-1074


# ------------------------------------------------------------------------------------------ instances
def _spanning_v() -> A.Instance:
    """A: ``v = (2^−60, 2^1000)``, keys ``(c·2^30, c'·2^−1000)``: values near 1, ``v·2^ex`` overflows
    (ex = 30); queries ``2^−30`` so that the logits of ``||W|| ≈ 1`` are O(1)."""
    X = np.array(
        [
            [
                [0.75 * 2.0**30, 0.75 * 2.0**-1000],
                [0.5 * 2.0**30, -0.25 * 2.0**-1000],
                [-0.25 * 2.0**30, 0.5 * 2.0**-1000],
            ],
            [
                [0.5 * 2.0**30, 0.25 * 2.0**-1000],
                [0.75 * 2.0**30, 0.5 * 2.0**-1000],
                [0.25 * 2.0**30, -0.75 * 2.0**-1000],
            ],
        ]
    )
    z = np.array([[1.0, 0.5], [-0.5, 1.0]]) * 2.0**-30
    return A.Instance(X, np.array([1.0, -1.0]), np.array([2.0**-60, 2.0**1000]), z)


def _reproducer(both: bool = False) -> A.Instance:
    """B: ``v = (2^−500, 2^700)`` (a span of 2^1200); sequence 0 reads ``v_0`` (keys ``0.75·2^500``,
    ``0.5·2^500``: values 0.75, 0.5), sequence 1 ``v_1`` (keys ``±c·2^−700``: values 0.75, −0.5); with
    ``both`` sequence 1 reads ``v_0`` too (every sequence affected)."""
    X = np.zeros((2, 2, 2))
    X[0, 0] = [0.75 * 2.0**500, 0.0]
    X[0, 1] = [0.5 * 2.0**500, 0.0]
    if both:
        X[1, 0] = [0.75 * 2.0**500, 0.0]
        X[1, 1] = [-0.5 * 2.0**500, 0.0]
    else:
        X[1, 0] = [0.0, 0.75 * 2.0**-700]
        X[1, 1] = [0.0, -0.5 * 2.0**-700]
    z = np.array([[1.0, 0.5], [0.25, 1.0]])
    return A.Instance(X, np.array([1.0, -1.0]), np.array([2.0**-500, 2.0**700]), z)


def _within_token() -> A.Instance:
    """B, the same flaw inside one token: ``x = (2^600, 2^−600)``, ``v = (2^−600, 2^600)`` (both span
    2^1200): values such as ``1 + 1 = 2``, ``0.5 + 1``; ``z`` of size 2^−600 keeps the logits O(1)."""
    X = np.array(
        [
            [[2.0**600, 2.0**-600], [0.5 * 2.0**600, 2.0**-600], [0.75 * 2.0**600, -0.5 * 2.0**-600]],
            [
                [-0.5 * 2.0**600, 0.75 * 2.0**-600],
                [2.0**600, 0.25 * 2.0**-600],
                [0.25 * 2.0**600, 0.5 * 2.0**-600],
            ],
        ]
    )
    z = np.array([[0.5, 1.0], [1.0, -0.25]]) * 2.0**-600
    return A.Instance(X, np.array([-1.0, 1.0]), np.array([2.0**-600, 2.0**600]), z)


_W1 = np.array([[0.5, -0.25], [0.75, 1.0]])


def _generic_W(inst: A.Instance) -> np.ndarray:
    """``_W1`` scaled by ``2^−(ex+ez)`` (the binary exponents of the largest key and query), exactly: the
    largest logits are O(1), so their rounding ``δl`` leaves the bound at eps level."""
    ex = math.frexp(float(np.max(np.abs(inst.X))))[1]
    ez = math.frexp(float(np.max(np.abs(inst.z))))[1]
    return np.ldexp(_W1, -(ex + ez))


def _log_norm_tol(orc: _Oracle, d: int) -> float:
    """``log||∇L||``: the norm's relative error is within the direction's bound, plus the rounding of the
    logarithm itself (a double of size ``|log||∇L|||``, 344 here: one ulp is 5.7e-14)."""
    return orc.tol(d) + 2 * EPS * abs(orc.log_norm)


# ------------------------------------------------------------------------------- B: values, gradient
@pytest.mark.parametrize(
    "make", [_reproducer, lambda: _reproducer(True), _within_token], ids=["one", "both", "token"]
)
def test_values_are_the_exact_values(make: object) -> None:
    """``Instance.values`` (and the scores, optimal tokens) against mpmath: each value to its documented
    ``d·eps·Σ_k|v_k x_k|`` (here exact: at most two terms of 3 bits). Before: 0 for the values read
    through ``v_0`` (``optimal_tokens`` then found a tie)."""
    inst = make()  # type: ignore[operator]
    exact = _Oracle(inst, np.zeros((2, 2))).values
    assert np.all(np.abs(exact) >= 0.25)  # the premise: normal values near 1
    np.testing.assert_array_equal(inst.values(), exact)
    np.testing.assert_array_equal(inst.scores(), inst.Y[:, None] * exact)
    np.testing.assert_array_equal(inst.optimal_tokens(), np.argmax(inst.Y[:, None] * exact, axis=1))


@pytest.mark.parametrize(
    "make", [_reproducer, lambda: _reproducer(True), _within_token], ids=["one", "both", "token"]
)
@pytest.mark.parametrize("at", ["zero", "W1"])
def test_normalized_direction_is_the_oracle_direction(make: object, at: str) -> None:
    """``normalized_risk_grad`` against mpmath, at ``W = 0`` and at a generic ``W``: the direction to the
    documented bound, ``log||∇L||`` to the same relative bound. Before: 0.03 off ("one"), refused as
    "exactly zero" ("both")."""
    inst = make()  # type: ignore[operator]
    W = np.zeros((2, 2)) if at == "zero" else _generic_W(inst)
    orc = _Oracle(inst, W)
    tol = orc.tol(inst.d)
    assert tol < 1e-10  # a real check: a wrong direction is off by O(0.01)
    got = normalized_risk_grad(inst, W)
    assert np.linalg.norm(got.direction - orc.direction) <= tol
    assert abs(got.log_norm - orc.log_norm) <= _log_norm_tol(orc, inst.d)


@pytest.mark.parametrize("make", [_reproducer, _within_token], ids=["one", "token"])
def test_risk_and_gradient_are_the_oracle_ones(make: object) -> None:
    """``risk`` and ``risk_grad`` against mpmath at a generic ``W`` (the plain products happen to be
    exact here; the check pins the answer whichever path computes it)."""
    inst = make()  # type: ignore[operator]
    W = _generic_W(inst)
    orc = _Oracle(inst, W)
    G = A.risk_grad(inst, W)
    expect = math.exp(orc.log_norm) * orc.direction
    assert np.linalg.norm(G - expect) <= (orc.tol(inst.d) + 2 * EPS) * np.linalg.norm(expect)
    assert abs(A.risk(inst, W) - orc.risk) <= 8 * EPS * orc.risk


def test_values_beyond_the_range_are_still_refused_by_name() -> None:
    """The contract's other half: a value that is not a normal double is refused naming the values, also
    where ``v`` spans beyond the range (a value ``2^−600·2^−600`` underflows)."""
    X = np.array([[[2.0**-600, 0.0], [0.0, 1.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([2.0**-600, 2.0**600]), np.array([[1.0, 1.0]]))
    with pytest.raises(NumericalError, match="token values"):
        inst.values()


# ------------------------------------------------------------------------- A: the engines' rescaling
def _check_run(inst: A.Instance, Ws: Sequence[np.ndarray]) -> None:
    """Each normalized step ``W_t = W_{t−1} − lr·∇L/||∇L||`` against the oracle's direction at the
    computed ``W_{t−1}`` (a per-step oracle: errors do not compound through the check)."""
    for prev, cur in zip(Ws[:-1], Ws[1:], strict=True):
        orc = _Oracle(inst, prev)
        step = (prev - cur) / LR
        assert np.linalg.norm(step - orc.direction) <= orc.tol(inst.d) + 4 * EPS * (
            1 + np.linalg.norm(prev) / LR
        )


@pytest.mark.parametrize("kernel", ["eager", "auto"])
def test_run_gd_batch_carries_values_v_times_2_to_the_ex_cannot(kernel: str) -> None:
    """``run_gd_batch`` on the instance (batched with an ordinary one) against the per-step oracle, and
    equal to ``run_gd`` to the contract's 1e-8 (docs/scale-contract.md). Before: refused, "about 1e+310"."""
    inst = _spanning_v()
    other = A.random_instance(2, 3, 2, seed=1)
    steps = 3
    tb = A.run_gd_batch([inst, other], steps, LR, record_at=list(range(steps + 1)), kernel=kernel)
    ts = A.run_gd(inst, steps, LR, record_at=list(range(steps + 1)), keep_iterates=True)
    Ws = [r.W for r in ts.record]
    assert all(W is not None for W in Ws)
    _check_run(inst, Ws)  # type: ignore[arg-type]
    assert np.linalg.norm(tb.W[0] - ts.W) <= 1e-8 * np.linalg.norm(ts.W)
    np.testing.assert_allclose(tb.risks[:, 0], [r.risk for r in ts.record], rtol=1e-8)


def test_run_gd_kq_carries_values_v_times_2_to_the_ex_cannot() -> None:
    """``run_gd_kq``'s first normalized step against the oracle: ``(K, Q) ← (K, Q) − lr·(DQ, DᵀK)/||·||``
    with ``D`` the oracle's direction at ``W_0 = K_0 Q_0ᵀ``. Before: refused."""
    inst = _spanning_v()
    K0 = np.array([[0.5, -0.25], [0.75, 0.5]])
    Q0 = np.array([[0.25, 1.0], [-0.5, 0.75]])
    tr = A.run_gd_kq(inst, 1, LR, K0=K0, Q0=Q0)
    orc = _Oracle(inst, K0 @ Q0.T)  # K0 Q0ᵀ is exact (3-bit entries)
    D = orc.direction
    gK, gQ = D @ Q0, D.T @ K0
    jn = math.sqrt(float(np.sum(gK**2) + np.sum(gQ**2)))
    # D's error (≤ tol normwise) moves (DQ, DᵀK) by ≤ tol·(||Q|| + ||K||) and its unit pair by twice that
    # over jn; plus the rounding of the products (eps-level).
    tol = 2 * orc.tol(inst.d) * (np.linalg.norm(Q0) + np.linalg.norm(K0)) / jn + 16 * EPS
    assert np.linalg.norm((K0 - tr.K) / LR - gK / jn) <= tol
    assert np.linalg.norm((Q0 - tr.Q) / LR - gQ / jn) <= tol


def test_regularization_path_carries_values_v_times_2_to_the_ex_cannot() -> None:
    """``regularization_path``: its first projected step from 0 is ``−lr·R·D(0)`` (one step, inside the
    ball), and its point at radius 1 satisfies the KKT condition ``∇L/||∇L|| + W/||W|| = 0`` to its
    reported residual, judged by the oracle's gradient at that point. Before: refused."""
    inst = _spanning_v()
    orc0 = _Oracle(inst, np.zeros((2, 2)))
    one = A.regularization_path(inst, [1.0], max_steps=1, lr=LR)
    W1 = one.points[0].W
    assert np.linalg.norm(W1 / (-LR) - orc0.direction) <= orc0.tol(inst.d) + 4 * EPS
    path = A.regularization_path(inst, [1.0], tol=1e-9)
    pt = path.points[0]
    orc = _Oracle(inst, pt.W)
    kkt = np.linalg.norm(orc.direction + pt.W / np.linalg.norm(pt.W))
    assert kkt <= path.kkt_residuals[0] + orc.tol(inst.d) + 4 * EPS
    assert abs(pt.risk - orc.risk) <= 8 * EPS * orc.risk


# ------------------------------------------------------ B: a sequence with no live term, hidden values
def _hidden_difference() -> A.Instance:
    """Sequence 0: values 1 and ``1 + 2^−60`` (keys ``(1, 0)``, ``(1, 2^−60)``), equal in float64, so no term
    of it is live; sequence 1: values ``±2^−80``, live but ~1e11 times smaller than sequence 0's true term."""
    X = np.zeros((2, 2, 2))
    X[0, 0] = [1.0, 0.0]
    X[0, 1] = [1.0, 2.0**-60]
    X[1, 0] = [2.0**-80, 0.0]
    X[1, 1] = [-(2.0**-80), 0.0]
    return A.Instance(X, np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.array([[1.0, 0.5], [0.5, 1.0]]))


def test_a_sequence_whose_values_differ_below_rounding_is_not_dropped() -> None:
    """Oracle: mpmath. The true ``∇L`` is sequence 0's (the direction of the instance without it is far
    from the true one), which float64 cannot resolve (its values differ below their rounding): the answer
    is the contract's refusal at rounding level, for the direction and for ``risk_grad``. Before: sequence 0
    left the rounding-level check and the direction of sequence 1 alone was returned."""
    inst = _hidden_difference()
    W = np.zeros((2, 2))
    full = _Oracle(inst, W)
    alone = _Oracle(A.Instance(inst.X[1:], inst.Y[1:], inst.v, inst.z[1:]), W)
    assert np.linalg.norm(full.direction - alone.direction) > 1.0  # the premise: sequence 0 dominates
    assert full.log_norm - alone.log_norm > 20.0
    with pytest.raises(NumericalError, match="rounding level"):
        normalized_risk_grad(inst, W)
    with pytest.raises(NumericalError, match="rounding level"):
        A.risk_grad(inst, W)


# ------------------------------------------- A and B together: GD on values v·2^ex cannot carry
@pytest.mark.parametrize("make", [_reproducer, _within_token], ids=["one", "token"])
def test_run_gd_first_step_on_a_v_spanning_beyond_the_range(make: object) -> None:
    """``run_gd``'s first normalized step from 0 is ``−lr·D(0)`` (oracle direction) where ``v`` spans 2^1200
    and ``v·2^ex`` overflows (carried at another exponent). Before: "token" took ``X'' = (X·2^−ex)·2^(ex−c)``,
    whose ``2^−600`` key entries ``X·2^−ex`` had flushed to 0 (each carries half a value): 0.25 off."""
    inst = make()  # type: ignore[operator]
    orc = _Oracle(inst, np.zeros((2, 2)))
    tr = A.run_gd(inst, 1, LR)
    assert np.linalg.norm(tr.W / (-LR) - orc.direction) <= orc.tol(inst.d) + 4 * EPS


def test_run_gd_batch_first_step_on_a_v_spanning_beyond_the_range() -> None:
    """``run_gd_batch``'s first step on the reproducer against the oracle (as ``run_gd``, above). Regression:
    the engine found v's spread from ``split_rows(v, 1)``, which flushes entries 2^1074 below the largest to 0
    (the instance was not routed to the single form: 1.41 off); it reads v's own exponents now."""
    inst = _reproducer()
    orc = _Oracle(inst, np.zeros((2, 2)))
    tb = A.run_gd_batch([inst], 1, LR, kernel="eager")
    assert np.linalg.norm(tb.W[0] / (-LR) - orc.direction) <= orc.tol(inst.d) + 4 * EPS
