"""Risk, the cancellation-free gradient and the log-domain normalized direction.

Oracles: torch autograd (float64), central finite differences, and a 50-digit mpmath
evaluation of the textbook formula (exact enough that its own cancellation is harmless).
"""

from __future__ import annotations

import warnings

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, NumericalError
from attnsvm.model._grad import risk_grad_textbook

EPS = np.finfo(np.float64).eps
mpmath.mp.dps = 50

MP_LOSS_DERIV = {
    "logistic": lambda u: -1 / (1 + mpmath.exp(u)),
    "exponential": lambda u: -mpmath.exp(-u),
    "correlation": lambda u: mpmath.mpf(-1),
}


def mp_gradient(inst, W, loss="logistic"):
    """50-digit gradient from the float64 inputs (treated as exact), and its term magnitudes.

    Returns (G, S) as float arrays: G the gradient, S = Σ_it |w_it| |x_it| |z_i|ᵀ (entrywise),
    the scale against which summation rounding is measured.
    """
    n, T, d = inst.shape
    X = [[[mpmath.mpf(float(x)) for x in inst.X[i, t]] for t in range(T)] for i in range(n)]
    z = [[mpmath.mpf(float(x)) for x in inst.z[i]] for i in range(n)]
    v = [mpmath.mpf(float(x)) for x in inst.v]
    Wm = [[mpmath.mpf(float(W[j, k])) for k in range(d)] for j in range(d)]
    G = [[mpmath.mpf(0)] * d for _ in range(d)]
    S = [[mpmath.mpf(0)] * d for _ in range(d)]
    for i in range(n):
        q = [mpmath.fsum(Wm[j][k] * z[i][k] for k in range(d)) for j in range(d)]
        l = [mpmath.fsum(X[i][t][j] * q[j] for j in range(d)) for t in range(T)]
        m = max(l)
        e = [mpmath.exp(x - m) for x in l]
        tot = mpmath.fsum(e)
        s = [x / tot for x in e]
        a = [mpmath.fsum(v[j] * X[i][t][j] for j in range(d)) for t in range(T)]
        f = mpmath.fsum(s[t] * a[t] for t in range(T))
        dl = MP_LOSS_DERIV[loss](inst.Y[i] * f)
        for t in range(T):
            w = dl * inst.Y[i] * s[t] * (a[t] - f) / n
            for j in range(d):
                for k in range(d):
                    G[j][k] += w * X[i][t][j] * z[i][k]
                    S[j][k] += abs(w * X[i][t][j] * z[i][k])
    return np.array(G, dtype=float), np.array(S, dtype=float)


def logit_error_bound(inst, W):
    """Rounding bound on the computed logits: q = W z (d terms) then xᵀq (d terms), so
    |δl_it| ≤ 2d·eps·Σ_jk |x_itj||W_jk||z_ik| (first-order dot-product bound)."""
    mag = np.einsum("ntj,jk,nk->nt", np.abs(inst.X), np.abs(W), np.abs(inst.z))
    return 2 * inst.d * EPS * float(mag.max())


def saturate(inst, W0, gap=1e-13):
    """Scale W0 so that the largest weight of every sequence is within `gap` of 1."""
    lo, hi = 1.0, 1.0
    while True:
        log_s = A.log_attention(inst, hi * W0)
        rest = np.array([np.exp(np.sort(r)[:-1]).sum() for r in log_s])
        if np.all(rest <= gap):
            break
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        log_s = A.log_attention(inst, mid * W0)
        rest = np.array([np.exp(np.sort(r)[:-1]).sum() for r in log_s])
        lo, hi = (lo, mid) if np.all(rest <= gap) else (mid, hi)
    return hi * W0


def torch_grad(inst, W, loss):
    Wt = torch.tensor(W, requires_grad=True)
    X, z, v, Y = (torch.tensor(a) for a in (inst.X, inst.z, inst.v, inst.Y))
    s = torch.softmax(torch.einsum("ntd,de,ne->nt", X, Wt, z), dim=1)
    u = Y * (s * (X @ v)).sum(1)
    val = {
        "logistic": torch.nn.functional.softplus(-u),
        "exponential": torch.exp(-u),
        "correlation": -u,
    }[loss]
    val.mean().backward()
    return Wt.grad.numpy()


@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
def test_risk_matches_definition(inst, W, loss):
    f = A.output(inst, W)
    expected = np.mean(A.get_loss(loss).value(inst.Y * f))
    assert A.risk(inst, W, loss=loss) == pytest.approx(expected, rel=4 * EPS * inst.n)


@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grad_matches_autograd_and_mp(loss, seed):
    inst = A.random_instance(3, 4, 5, seed=seed, family=["gaussian", "unit", "self_attention"][seed])
    W = np.random.default_rng(seed + 10).standard_normal((5, 5))
    g = A.risk_grad(inst, W, loss=loss)
    G, S = mp_gradient(inst, W, loss)
    # Both float64 evaluations sum O(T·d) rounded terms: |error| ≤ c·(T + 2d)·eps·S, c ≈ 4.
    tol = 4 * (inst.T + 2 * inst.d) * EPS * S + 4 * logit_error_bound(inst, W) * S
    assert np.all(np.abs(g - G) <= tol)
    assert np.all(np.abs(torch_grad(inst, W, loss) - G) <= tol)


def test_grad_matches_central_differences(inst, W):
    g = A.risk_grad(inst, W)
    h = 1e-5
    # central difference error: h²/6·|L'''| (≈ 1e-11 for O(1) derivatives) + eps·|L|/h (≈ 1e-11)
    FD_ATOL = 1e-8
    fd = np.zeros_like(W)
    for j in range(inst.d):
        for k in range(inst.d):
            E = np.zeros_like(W)
            E[j, k] = h
            fd[j, k] = (A.risk(inst, W + E) - A.risk(inst, W - E)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=0, atol=FD_ATOL)


@pytest.mark.parametrize("seed", [3, 4])
def test_stable_grad_exact_at_saturation_where_textbook_fails(seed):
    inst = A.random_instance(3, 4, 5, seed=seed)
    W = saturate(inst, np.random.default_rng(seed).standard_normal((5, 5)))
    log_s = A.log_attention(inst, W)
    rest = np.array([np.exp(np.sort(r)[:-1]).sum() for r in log_s])
    assert np.all(rest <= 1e-12)  # every sequence's largest weight within 1e-12 of 1
    G, S = mp_gradient(inst, W)
    # Stable form: the small weights carry the logits' rounding (relative error δl) and the
    # sums add O(T + 2d) roundings: |error| ≤ 4·(δl + (T + 2d)·eps)·S.
    tol = 4 * (logit_error_bound(inst, W) + (inst.T + 2 * inst.d) * EPS) * S
    stable = A.risk_grad(inst, W)
    assert np.all(np.abs(stable - G) <= tol)
    # Textbook: a_iα − f_i is a difference of O(1) numbers equal to ~1e-13, so it keeps only
    # ~3 digits; its error is orders of magnitude beyond the stable bound.
    textbook = risk_grad_textbook(inst, W)
    assert np.max(np.abs(textbook - G) / tol) > 1e3


def test_normalized_direction_agrees_with_grad(inst, W):
    g = A.risk_grad(inst, W)
    d = A.normalized_risk_grad(inst, W)
    assert isinstance(d, A.GradDirection)
    np.testing.assert_allclose(d.direction, g / np.linalg.norm(g), rtol=0, atol=16 * EPS * inst.d)
    assert d.log_norm == pytest.approx(np.log(np.linalg.norm(g)), rel=0, abs=16 * EPS * inst.d)


@pytest.mark.parametrize("scale", [300.0, 3000.0])
def test_normalized_direction_exact_when_gradient_underflows(scale):
    inst = A.random_instance(3, 4, 5, seed=8)
    W = scale * np.random.default_rng(1).standard_normal((5, 5))
    assert np.linalg.norm(W) > 1000
    if scale == 3000.0:
        # ||∇L|| ≈ 1e-779 is not a double: risk_grad refuses (it used to return exact zeros) and
        # points to normalized_risk_grad, which is exact there (issue 13 §1).
        with pytest.raises(NumericalError, match=r"underflows .*normalized_risk_grad"):
            A.risk_grad(inst, W)
    d = A.normalized_risk_grad(inst, W)
    assert np.all(np.isfinite(d.direction))
    assert np.linalg.norm(d.direction) == pytest.approx(1.0, abs=8 * EPS)
    ref = _mp_direction(inst, W)
    _, T, dd = inst.shape
    # relative error of each log-weight ≈ logit rounding δl; factored-out sums add (T + 2d)·eps.
    tol = 8 * (logit_error_bound(inst, W) + (T + 2 * dd) * EPS)
    np.testing.assert_allclose(d.direction, ref, rtol=0, atol=tol)
    assert np.isfinite(d.log_norm)
    if scale == 3000.0:
        assert d.log_norm < np.log(np.finfo(np.float64).smallest_subnormal)  # ||∇L|| < 5e-324


def _mp_direction(inst, W):
    """∇L/||∇L|| by the textbook formula in mpmath (mp numbers do not underflow).

    The textbook difference a_iα − f_i ≈ Σ_u s_iu (a_iα − a_iu) loses as many digits as
    −log10(1 − s_iα); the working precision is raised by the logit range (in digits) so that
    50 correct digits survive it.
    """
    with mpmath.workdps(50 + int(np.ptp(A.logits(inst, W), axis=1).max() / np.log(10)) + 10):
        return _mp_direction_at_current_precision(inst, W)


def _mp_direction_at_current_precision(inst, W):
    n, T, d = inst.shape
    G = [[mpmath.mpf(0)] * d for _ in range(d)]
    for i in range(n):
        x = [[mpmath.mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
        zi = [mpmath.mpf(float(c)) for c in inst.z[i]]
        q = [mpmath.fsum(mpmath.mpf(float(W[j, k])) * zi[k] for k in range(d)) for j in range(d)]
        l = [mpmath.fsum(x[t][j] * q[j] for j in range(d)) for t in range(T)]
        m = max(l)
        e = [mpmath.exp(c - m) for c in l]
        s = [c / mpmath.fsum(e) for c in e]
        a = [mpmath.fsum(mpmath.mpf(float(inst.v[j])) * x[t][j] for j in range(d)) for t in range(T)]
        f = mpmath.fsum(s[t] * a[t] for t in range(T))
        dl = MP_LOSS_DERIV["logistic"](inst.Y[i] * f)
        for t in range(T):
            w = dl * inst.Y[i] * s[t] * (a[t] - f) / n
            for j in range(d):
                for k in range(d):
                    G[j][k] += w * x[t][j] * zi[k]
    norm = mpmath.sqrt(mpmath.fsum(c**2 for row in G for c in row))
    return np.array([[float(c / norm) for c in row] for row in G])


def test_zero_gradient_raises():
    # Every token of every sequence has the same value vᵀx: the risk is constant in W.
    X = np.zeros((2, 3, 2))
    X[:, :, 1] = np.random.default_rng(0).standard_normal((2, 3))
    inst = A.Instance(X, np.array([1.0, -1.0]), np.array([1.0, 0.0]), z=np.ones((2, 2)))
    assert np.all(A.risk_grad(inst, np.eye(2)) == 0)
    with pytest.raises(NumericalError, match="exactly zero"):
        A.normalized_risk_grad(inst, np.eye(2))


def test_bad_weights_and_loss(inst, W):
    with pytest.raises(InvalidInstanceError, match=r"W must have shape \(d, d\)"):
        A.risk_grad(inst, W.T[:3])
    with pytest.raises(InvalidInstanceError, match="finite"):
        A.risk(inst, np.full_like(W, np.nan))
    with pytest.raises(A.UnknownNameError, match="unknown loss"):
        A.normalized_risk_grad(inst, W, loss="squared")


def test_no_public_call_modifies_its_inputs(inst):
    rng = np.random.default_rng(3)
    X, Y, v, z = inst.X.copy(), inst.Y.copy(), inst.v.copy(), inst.z.copy()
    mine = A.Instance(X, Y, v, z)
    W = rng.standard_normal((inst.d, inst.d))
    W_copy, alpha = W.copy(), np.array([0, 1, 2, 3])
    alpha_copy = alpha.copy()
    for kind in A.KINDS:
        A.attention(mine, W, kind=kind)
        A.output(mine, W, kind=kind)
    for loss in A.LOSSES:
        A.risk(mine, W, loss=loss)
        A.risk_grad(mine, W, loss=loss)
        A.normalized_risk_grad(mine, W, loss=loss)
    A.logits(mine, W)
    A.log_attention(mine, W)
    A.svm_rows(mine, alpha)
    A.svm_gram(mine, alpha)
    A.svm_margins(mine, W, alpha)
    A.vec(W)
    A.vec_rowmajor(W)
    for got, orig in ((X, inst.X), (Y, inst.Y), (v, inst.v), (z, inst.z), (W, W_copy), (alpha, alpha_copy)):
        np.testing.assert_array_equal(got, orig)


def test_cancellation_to_rounding_level_raises():
    """A sequence repeated with the opposite label has ∇L = 0 exactly under the correlation loss,
    but the float64 sum leaves rounding noise (found by the property suite): the normalized
    direction must not be that noise, and risk_grad must not return it as a number (issue 13 §1: it
    used to return the noise, ~1e-16, as the gradient: 100 % relative error)."""
    for seed, exact in ((0, True), (3, False)):
        one = A.random_instance(1, 2, 1, seed=seed)
        dup = A.Instance(
            np.concatenate([one.X, one.X]), np.array([1.0, -1.0]), one.v, np.concatenate([one.z, one.z])
        )
        if exact:  # the float64 sum cancels exactly: 0 is returned (documented; the truth is 0)
            assert np.all(A.risk_grad(dup, np.zeros((1, 1)), loss="correlation") == 0.0)
        else:
            with pytest.raises(NumericalError, match="undetermined in float64: .*cancel to rounding level"):
                A.risk_grad(dup, np.zeros((1, 1)), loss="correlation")
        with pytest.raises(NumericalError, match="cancel to rounding level"):
            A.normalized_risk_grad(dup, np.zeros((1, 1)), loss="correlation")


# ---------------------------------------------------- refusals: what they name (pinned by mutation testing)
_RANGE = "float64's normal range [2.2e-308, 1.8e308]"


@pytest.mark.parametrize("v", [-1000.0, -709.9])
def test_exponential_risk_overflow_message_names_the_risk_its_size_and_the_remedy(v):
    """One token value v, W = 0: L = e^{−v}, of size 10^{−v/ln 10} (mpmath). At v = −709.9 only the
    risk's own log (709.9 > log FLOAT_MAX = 709.78) can tell: the refusal is the risk's, not the loss's."""
    inst = A.Instance(np.array([[[1.0], [1.0]]]), np.array([1.0]), np.array([v]), np.ones((1, 1)))
    k = int(mpmath.nint(-v / mpmath.log(10)))
    with pytest.raises(NumericalError) as info:
        A.risk(inst, np.zeros((1, 1)), loss="exponential")
    assert str(info.value) == (
        f"the risk L(W) is about 1e+{k}: it overflows {_RANGE}. Rescale the data or use the logistic loss"
    )


def test_logistic_risk_underflow_message_names_the_risk_its_size_and_the_remedy():
    """Margins 1000 and 2000: L = [log1p(e^{−1000}) + log1p(e^{−2000})]/2 ≈ 10^{−434.6} (mpmath)."""
    X = np.array([[[1.0], [0.5]], [[2.0], [1.0]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1000.0]), np.ones((2, 1)))
    with mpmath.workdps(30):
        ref = (mpmath.log1p(mpmath.exp(-1000)) + mpmath.log1p(mpmath.exp(-2000))) / 2
        k = int(mpmath.nint(mpmath.log10(ref)))
    assert k == -435
    with pytest.raises(NumericalError) as info:
        A.risk(inst, np.array([[1e4]]))
    assert str(info.value) == (
        f"the risk L(W) is about 1e{k}: it underflows {_RANGE}. Use the log-domain normalized_risk_grad"
    )


def test_undetermined_loss_derivative_message_states_the_output_uncertainty():
    """a = ±2^66 under weights ½ ± 2^−57 (W = 2^−56): f is known to ±δf with, by hand,
    δf = [(T + d)·eps + 2·d²·eps·|x W z|]·Σ_t s_t|a_t| = (3·2^−52 + 2^−107)·2^66 ≈ 4.92e4."""
    inst = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([1.0]), np.array([2.0**66]), np.array([[1.0]]))
    df = (3 * EPS + 2 * EPS * 2.0**-56) * 2.0**66
    expected = (
        f"the output f_0 = Σ_t s_it vᵀx_it is known only to ±{df:.3g} (values of both signs cancel under "
        "rounded weights): the loss derivative ℓ'(Y_i f_i) is undetermined in float64 (its relative error "
        "e^{δf} − 1 exceeds 1). Rescale v, or use the correlation loss"
    )
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError) as info:
            fn(inst, np.array([[2.0**-56]]))
        assert str(info.value) == expected


def test_loss_derivative_is_refused_exactly_where_its_uncertainty_reaches_one():
    """W = 0, tokens ±1 with values ±a: s = ½ exactly and f = 0, but the documented bound
    δf = (T + d)·eps·Σ_t s_t|a_t| = 3·eps·a (here δl = 0) is what float64 can vouch for. The logistic
    ℓ' moves by e^{κδf}, κ = σ(u + δf): at a = 2^50, δf = 0.75 and κδf < 1, so the gradient is
    returned, by hand −½·(½a + ½a)/1 = −2^49 (direction −1, log-norm 49 ln 2); at a = 1.5·2^51,
    δf = 2.25 and κδf = 2.25·σ(2.25) ≈ 2.0 > 1, so both forms refuse, naming δf."""
    one = np.array([[[1.0], [-1.0]]])
    W = np.zeros((1, 1))
    inst = A.Instance(one, np.array([1.0]), np.array([2.0**50]), np.array([[1.0]]))
    assert A.risk_grad(inst, W)[0, 0] == pytest.approx(-(2.0**49), rel=4 * EPS)
    D = A.normalized_risk_grad(inst, W)
    assert D.direction[0, 0] == -1.0
    assert D.log_norm == pytest.approx(49 * np.log(2.0), rel=4 * EPS)
    inst = A.Instance(one, np.array([1.0]), np.array([1.5 * 2.0**51]), np.array([[1.0]]))
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(
            NumericalError, match=r"^the output f_0 = Σ_t s_it vᵀx_it is known only to ±2\.25 "
        ):
            fn(inst, W)


#: The normalized direction's documented accuracy, a few ulps per entry (n = 1, T = 2, d = 2): a factor
#: 64 over eps covers the log-domain sums; the defect below showed as ≈ 2^(jv−53), i.e. ≥ 1e-4 at jv = 40.
HUGE_MARGIN_DIR_ATOL = 64 * EPS


@pytest.mark.parametrize("jv", [0, 30, 40, 50])
def test_normalized_direction_at_a_huge_margin_keeps_the_within_sequence_weights(jv: int) -> None:
    """Regression: log|ℓ'(Y f)| ≈ −2^(jv−1) was added to the O(1) log-weights before they were
    exponentiated, rounding them to ulp(2^(jv−1)) (ratio −2.117 instead of −2 at jv = 50).
    Oracle, by hand: X_1 = (e_1, ½e_2), z = (1, 1), W = 0 give s = (½, ½) and values a = (2^jv, 0), so
    a_t − f = ±2^(jv−1) and ∇L = ℓ'·¼·2^jv·(x_1 − x_2) zᵀ with ℓ' < 0: the direction is exactly
    −(1, −½) ⊗ (1, 1)/√2.5 at every jv (one sequence: ℓ' only scales it)."""
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 0.5]]]),
        np.array([1.0]),
        np.array([2.0**jv, 0.0]),
        np.array([[1.0, 1.0]]),
    )
    d = A.normalized_risk_grad(inst, np.zeros((2, 2))).direction
    expected = -np.outer([1.0, -0.5], [1.0, 1.0]) / np.sqrt(2.5)
    assert np.max(np.abs(d - expected)) <= HUGE_MARGIN_DIR_ATOL


# ------------------------------------ scale-dependent refusals and messages (pinned by mutation testing)
def test_output_overflow_message_names_the_outputs_their_size_and_the_remedy():
    """One sequence of ten tokens (1, …, 1), v = 1e308·(1, …, 1), W = 0: every value is vᵀx = 1e309,
    so f = 1e309 (by hand), beyond float64: each public function refuses, naming the outputs, their
    size 1e+309 and the remedy, not an IndexError or another sequence's size."""
    inst = A.Instance(np.ones((1, 2, 10)), np.array([1.0]), np.full(10, 1e308), np.ones((1, 10)))
    expected = (
        f"the outputs f_i = Σ_t s_it vᵀx_it is about 1e+309: it overflows {_RANGE}. "
        "The loss of a margin beyond 1.8e308 is not computable; scale v or X down"
    )
    for fn in (A.risk, A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError) as info:
            fn(inst, np.zeros((10, 10)))
        assert str(info.value) == expected


def test_textbook_gradient_refuses_undefined_and_overflowing_values():
    """The textbook baseline never returns or warns NaN/Inf. (a) Values +inf and −inf (tokens ±1e308·(1, 1),
    v = (1, 1)) give f = ½·inf − ½·inf, undefined: the loss derivative is refused. (b) Values ±1 but
    x zᵀ = ±1e400 (x = ±1e200, z = 1e200, v = 1e-200): the gradient ℓ'·Y·Σ_t s_t(a_t − f) x_t zᵀ is
    −½·1e400 by hand, beyond float64: refused with the message naming the textbook gradient."""
    inst = A.Instance(
        np.array([[[1e308, 1e308], [-1e308, -1e308]]]), np.array([1.0]), np.ones(2), np.ones((1, 2))
    )
    with warnings.catch_warnings():  # refused as an AttnSVMError, without a numpy RuntimeWarning first
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(NumericalError, match=r"^the loss derivative is not finite"):
            risk_grad_textbook(inst, np.zeros((2, 2)))
    inst = A.Instance(
        np.array([[[1e200], [-1e200]]]), np.array([1.0]), np.array([1e-200]), np.array([[1e200]])
    )
    with pytest.raises(NumericalError) as info:
        risk_grad_textbook(inst, np.zeros((1, 1)))
    assert str(info.value).startswith(
        "the textbook risk gradient (use risk_grad, which rescales) is not finite (NaN or Inf)"
    )


def test_each_sequence_is_judged_by_its_own_logit_rounding_and_output_size():
    """Two sequences whose data live at scales 2^40 apart; the oracle is the gradient by hand.
    Sequence 1: tokens ±e_1, z = e_1, W_11 = 2^40: logits ±2^40, values ±1, weights (1, e^{−2^41}),
    so its term ≈ e^{−2^41} vanishes against sequence 2's. Sequence 2: tokens ±e_2, z = e_1, logits
    exactly 0 (W_21 = 0), values ±2^40, s = ½, f = 0: ∇L = ½·ℓ'(0)·[½·2^40 e_2 + ½·2^40 e_2] e_1ᵀ
    = −2^38 e_2 e_1ᵀ exactly. Each output's uncertainty is small in its own units (δf_1 ≈ 2^−9 from
    logits of size 2^40 rounded to d²·eps; δf_2 = 4·eps·2^40 with exact logits), so both functions must
    return; borrowing one sequence's logit size or value size for the other (δf ≈ 2^31) would refuse."""
    X = np.array([[[1.0, 0.0], [-1.0, 0.0]], [[0.0, 1.0], [0.0, -1.0]]])
    z = np.array([[1.0, 0.0], [1.0, 0.0]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1.0, 2.0**40]), z)
    W = np.diag([2.0**40, 0.0])
    expected = np.array([[0.0, 0.0], [-(2.0**38), 0.0]])
    np.testing.assert_allclose(A.risk_grad(inst, W), expected, rtol=4 * EPS, atol=0.0)
    D = A.normalized_risk_grad(inst, W)
    np.testing.assert_allclose(D.direction, expected / 2.0**38, rtol=4 * EPS, atol=0.0)
    assert D.log_norm == pytest.approx(38 * np.log(2.0), rel=4 * EPS)


@pytest.mark.parametrize("k", [0, 16])
def test_logit_rounding_refusal_is_invariant_under_power_of_two_rescaling(k):
    """Tokens 2^k·(1, ±1), z = e_1, W_11 = 2^(31−k): both logits are 2^31 (equal, so s = ½), values
    v = (0, 2^(20−k)) give a = ±2^20 and f = 0. The logits are known to δl = d²·eps·2^31 = 2^−19, so
    by hand δf = (T + d)·eps·2^20 + 2δl·2^20 ≈ 4 and the logistic ℓ'(f) is undetermined (κδf ≈ 3.9 > 1).
    Oracle: scale equivariance — X·2^k with W·2^−k leaves every logit and value unchanged, hence the
    refusal (naming δf = 4) must not depend on k; a plain product that returned −2^19 e_2 e_1ᵀ at
    k = 16 would be a silently undetermined number."""
    X = np.array([[[1.0, 1.0], [1.0, -1.0]]]) * 2.0**k
    W = np.zeros((2, 2))
    W[0, 0] = 2.0 ** (31 - k)
    inst = A.Instance(X, np.array([1.0]), np.array([0.0, 2.0 ** (20 - k)]), np.array([[1.0, 0.0]]))
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError, match=r"^the output f_0 = Σ_t s_it vᵀx_it is known only to ±4 "):
            fn(inst, W)


def _mp_two_scale_gradient(kb: int, U: float):
    """60-digit diagonal of ∇L for :func:`test_sequences_of_very_different_scale_and_margin_combine`:
    sequence i has tokens (c_i e_i, 0), query c_i e_i and v = 2U·2^−kb·(1, 1), so values (2U·2^−kb·c_i, 0)
    with c_1 = 2^kb, c_2 = 2^−kb; W = 0 gives s = ½, f_i = U·2^−kb·c_i, and by the docstring's formula
    ∂L/∂W_ii = (1/2)·ℓ'(f_i)·½·(f_i)·c_i·c_i (logistic ℓ'(u) = −1/(1 + e^u))."""
    with mpmath.workdps(60):
        out = []
        for c in (mpmath.mpf(2) ** kb, mpmath.mpf(2) ** -kb):
            f = mpmath.mpf(U) * mpmath.mpf(2) ** -kb * c
            out.append(-1 / (1 + mpmath.exp(f)) * f / 4 * c * c)
        norm = mpmath.sqrt(out[0] ** 2 + out[1] ** 2)
        return [float(g / norm) for g in out], float(mpmath.log(norm))


#: Between sequences the log-domain form carries the factor e^{top_i − top}; its log, of size up to the
#: margin U, is rounded to ulp(U) ≤ U·eps, so the relative weight of a sequence whose loss derivative
#: is e^{−U} is known to about 2U·eps (plus the within-sequence nT(d+T)·eps = 16·eps here).
def _two_scale_tol(U: float) -> float:
    return (16.0 + 4.0 * U) * EPS


@pytest.mark.parametrize(("kb", "U"), [(350, 1455.0), (350, 1462.0), (700, 2916.0)])
def test_sequences_of_very_different_scale_and_margin_combine(kb, U):
    """Sequence 1 has data of size 2^kb and margin U (ℓ' ≈ e^{−U}); sequence 2 has data of size 2^−kb
    and margin ≈ 0. Their gradient terms, e^{−U}·2^{4kb} apart in size, are within a factor e^{±5}
    of each other here, far outside float64 each: the direction must weigh them correctly.
    Oracle: the 60-digit diagonal gradient of the docstring's formula (hand-reduced, see helper)."""
    B, b = 2.0**kb, 2.0**-kb
    X = np.array([[[B, 0.0], [0.0, 0.0]], [[0.0, b], [0.0, 0.0]]])
    z = np.array([[B, 0.0], [0.0, b]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([2 * U * b, 2 * U * b]), z)
    (g1, g2), log_norm = _mp_two_scale_gradient(kb, U)
    D = A.normalized_risk_grad(inst, np.zeros((2, 2)))
    tol = _two_scale_tol(U)
    np.testing.assert_allclose(D.direction, np.diag([g1, g2]), rtol=0.0, atol=tol)
    assert D.log_norm == pytest.approx(log_norm, abs=tol * abs(log_norm))


def test_values_equal_to_their_rounding_refuse_the_direction():
    """Tokens (1, 3·2^−54) and (2^−60, 1) with v = (1, 1): the values 1 + 3·2^−54 and 1 + 2^−60 differ
    by ≈ 0.746·2^−52 but both round to within 2^−52 of 1 (computed difference 2^−52, 34 % off, by
    hand); the gradient, proportional to that difference, has no correct digit in its size (log_norm
    would be off by ≈ log(4/3)). Oracle: the exact rounding of vᵀx (IEEE, by hand) — the direction
    must be refused as rounding-level, not returned."""
    X = np.array([[[1.0, 3 * 2.0**-54], [2.0**-60, 1.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 1.0]), np.array([[1.0, 0.0]]))
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        A.normalized_risk_grad(inst, np.zeros((2, 2)))


@pytest.mark.parametrize(("n", "zq"), [(1, 1e-320), (1000, 1e-319)])
def test_subnormal_gradient_of_a_misclassified_point_is_refused(n, zq):
    """Exponential loss at margin f = −24 (ℓ' = −e^{24}, large) with query zq, the sequence repeated
    n times (the mean gradient is that of one copy): by the docstring's formula (60-digit mpmath)
    ||∇L|| = 4e^{24}·zq ≈ 1.1e-309 / 1.1e-308, subnormal. risk_grad must refuse with GradientRangeError
    carrying log||∇L||, not return subnormal digits, however large ℓ' or n is."""
    from attnsvm.model._grad import GradientRangeError

    inst = A.Instance(
        np.tile(np.array([[[1.0], [2.0]]]), (n, 1, 1)), np.ones(n), np.array([-16.0]), np.full((n, 1), zq)
    )
    with mpmath.workdps(60):
        # s = ½, a = (−16, −32), f = −24: ∇L = ℓ'(f)·[½(a_1 − f)·1 + ½(a_2 − f)·2]·z = −e^{24}·(4 − 8)·z
        log_ref = float(mpmath.log(mpmath.exp(24) * 4 * mpmath.mpf(zq)))
    assert log_ref < np.log(np.finfo(np.float64).tiny)  # the oracle's gradient is subnormal
    with pytest.raises(GradientRangeError, match="underflows") as info:
        A.risk_grad(inst, np.zeros((1, 1)), loss="exponential")
    assert info.value.log_norm == pytest.approx(log_ref, rel=16 * EPS)


class _Float32DerivativeLogistic:
    """A custom logistic loss whose derivative comes back as float32 (a user's own loss object)."""

    assumptions = None

    def value(self, u):
        return np.logaddexp(0.0, -u)

    def derivative(self, u):
        return (-1.0 / (1.0 + np.exp(u))).astype(np.float32)


class _SameValuesAsFloat64(_Float32DerivativeLogistic):
    def derivative(self, u):
        return super().derivative(u).astype(np.float64)


def test_custom_loss_derivative_values_are_used_whatever_their_dtype():
    """Oracle: the gradient depends only on the numbers ℓ' returns, not on their dtype. A custom loss
    returning float32 derivatives must give the same direction and log-norm (to the summation rounding,
    16·eps) as the same numbers returned as float64; float32 arithmetic on them would lose ~1e-8."""
    inst = A.random_instance(3, 3, 2, seed=1)
    W = np.full((2, 2), 0.3)
    got = A.normalized_risk_grad(inst, W, loss=_Float32DerivativeLogistic())
    ref = A.normalized_risk_grad(inst, W, loss=_SameValuesAsFloat64())
    np.testing.assert_allclose(got.direction, ref.direction, rtol=0.0, atol=16 * EPS)
    assert got.log_norm == pytest.approx(ref.log_norm, abs=16 * EPS)
    np.testing.assert_allclose(
        A.risk_grad(inst, W, loss=_Float32DerivativeLogistic()),
        A.risk_grad(inst, W, loss=_SameValuesAsFloat64()),
        rtol=16 * EPS,
        atol=0.0,
    )


def test_near_cancellation_is_judged_against_each_tokens_own_size():
    """Correlation loss; sequence 1 (Y = +1) and sequence 2 (Y = −1) share tokens (e_1, e_2), v = e_1,
    and have queries e_1 and (1 + 2^−40) e_1; 48 more sequences have z = 0 (no contribution). By hand
    (s = ½, a = (1, 0), f = ½): ∇L = (2^−40 / 4n)·(e_1 − e_2) e_1ᵀ, n = 50, while the terms' sum of
    magnitudes is Σ|w_it|·||x_it||·||z_i|| ≈ 1/n: the gradient stands 2^−40·√2/4 above it, a few times
    the refusal level 8·nT·eps. The direction must be returned, to the documented accuracy
    nT(d + T)·eps·Σ|w||x||z| / ||∇L||; measuring the terms by the norm of all tokens together (instead of
    each token's own) would inflate the rounding level √(nT)-fold and refuse it."""
    n, k = 50, 40
    X = np.zeros((n, 2, 2))
    X[:, 0, 0] = X[:, 1, 1] = 1.0
    z = np.zeros((n, 2))
    z[0, 0], z[1, 0] = 1.0, 1.0 + 2.0**-k
    Y = np.ones(n)
    Y[1] = -1.0
    inst = A.Instance(X, Y, np.array([1.0, 0.0]), z)
    D = A.normalized_risk_grad(inst, np.zeros((2, 2)), loss="correlation")
    norm = 2.0**-k * np.sqrt(2.0) / (4 * n)
    tol = n * 2 * (2 + 2) * EPS * (1.0 / n) / norm  # documented: nT(d+T)·eps·Σ|w||x||z| / ||∇L||
    np.testing.assert_allclose(
        D.direction, np.array([[1.0, 0.0], [-1.0, 0.0]]) / np.sqrt(2.0), atol=tol, rtol=0
    )
    assert D.log_norm == pytest.approx(np.log(norm), abs=tol)
    # At 2^−42 the ratio ||∇L|| / Σ|w||x||z| = 2^−42·√2/4 ≈ 8.0e-14 is below the refusal level
    # 8·nT·eps ≈ 1.78e-13 (at 2^−40 it is 3.2e-13, above): refused as rounding-level.
    z[1, 0] = 1.0 + 2.0**-42
    inst = A.Instance(X, Y, np.array([1.0, 0.0]), z)
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        A.normalized_risk_grad(inst, np.zeros((2, 2)), loss="correlation")


def test_each_sequence_is_judged_by_its_own_value_size():
    """Sequence 1: tokens ±e_1, query e_2 (logits 0, s = ½), values ±1, f = 0: by hand its term is
    ½·ℓ'(0)·[½·e_1 + ½·e_1] e_2ᵀ = −¼ e_1 e_2ᵀ, f known to (T + d)·eps. Sequence 2: tokens e_2, ½e_2,
    values 2^60, 2^59 (v = (1, 2^60)), margin 1.5·2^59: its ℓ' ≈ e^{−1.5·2^59} makes its term 0 in
    float64 (its own δf ≈ 2^9 is irrelevant there). Oracle: ∇L = −¼ e_1 e_2ᵀ by hand; judging sequence
    1's output by sequence 2's value size (δf ≈ 2^8) would wrongly refuse."""
    X = np.array([[[1.0, 0.0], [-1.0, 0.0]], [[0.0, 1.0], [0.0, 0.5]]])
    z = np.array([[0.0, 1.0], [1.0, 0.0]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([1.0, 2.0**60]), z)
    expected = np.array([[0.0, -0.25], [0.0, 0.0]])
    np.testing.assert_allclose(A.risk_grad(inst, np.zeros((2, 2))), expected, rtol=4 * EPS, atol=0.0)
    D = A.normalized_risk_grad(inst, np.zeros((2, 2)))
    np.testing.assert_allclose(D.direction, np.array([[0.0, -1.0], [0.0, 0.0]]), rtol=0.0, atol=4 * EPS)


def test_undetermined_output_is_refused_under_the_exponential_loss_beside_a_determined_one():
    """Sequence 1 is the undetermined case of the message test above (values ±2^66 cancelling under
    weights ½ ± 2^−57, δf ≈ 4.92e4 by hand); sequence 2 (tokens 2^−70, 2^−71: values 2^−4, 2^−5, margin
    ≈ 0.05) is determined and dominates the computed gradient. Under the exponential loss (κ = 1) the
    undetermined ℓ'(Y f_1) may be e^{δf} larger, so it matters: both functions refuse, naming f_0."""
    X = np.array([[[1.0], [-1.0]], [[2.0**-70], [2.0**-71]]])
    inst = A.Instance(X, np.array([1.0, 1.0]), np.array([2.0**66]), np.array([[1.0], [1.0]]))
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(
            NumericalError, match=r"^the output f_0 = Σ_t s_it vᵀx_it is known only to ±4\.92e\+04 "
        ):
            fn(inst, np.array([[2.0**-56]]), loss="exponential")


def test_subnormal_gradient_with_a_huge_loss_derivative_is_refused():
    """Exponential loss at margin f ≈ −32 (|ℓ'| = e^{32} ≈ 7.9e13), the other token's weight e^{−710}
    (itself subnormal), query 1e-16: ∇L ≈ 5.6e-310 (60-digit mpmath from the float64 inputs), subnormal.
    However large |ℓ'|·|a|·|x|·|z| is, risk_grad must refuse with GradientRangeError (its log_norm the
    mpmath value), never return the plain product's subnormal digits."""
    from attnsvm.model._grad import GradientRangeError

    X = np.array([[[1.0], [2.0]]])
    zq, v, w = 1e-16, -16.0, 7.1e18
    inst = A.Instance(X, np.array([1.0]), np.array([v]), np.array([[zq]]))
    with mpmath.workdps(60):
        x = [mpmath.mpf(1), mpmath.mpf(2)]
        q = mpmath.mpf(w) * mpmath.mpf(zq)
        logits = [xi * q for xi in x]
        top = max(logits)
        e = [mpmath.exp(li - top) for li in logits]
        s = [ei / mpmath.fsum(e) for ei in e]
        a = [mpmath.mpf(v) * xi for xi in x]
        f = mpmath.fsum(si * ai for si, ai in zip(s, a, strict=True))
        g = (
            -mpmath.exp(-f)
            * mpmath.fsum(si * (ai - f) * xi for si, ai, xi in zip(s, a, x, strict=True))
            * mpmath.mpf(zq)
        )
        log_ref = float(mpmath.log(abs(g)))
    assert log_ref < np.log(np.finfo(np.float64).tiny)  # the oracle's gradient is subnormal
    with pytest.raises(GradientRangeError, match="underflows") as info:
        A.risk_grad(inst, np.array([[w]]), loss="exponential")
    assert info.value.log_norm == pytest.approx(log_ref, rel=64 * EPS)


def _mp_risk_grad(X: np.ndarray, Y: np.ndarray, v: np.ndarray, z: np.ndarray, W: np.ndarray) -> list:
    """The logistic-risk gradient in 80-digit mpmath from the definition:
    ∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ, ℓ'(u) = −1/(1 + e^u)."""
    with mpmath.workdps(80):
        n, T, d = X.shape
        G = [[mpmath.mpf(0)] * d for _ in range(d)]
        for i in range(n):
            x = [[mpmath.mpf(float(X[i, t, k])) for k in range(d)] for t in range(T)]
            zi = [mpmath.mpf(float(z[i, k])) for k in range(d)]
            logit = [
                sum(x[t][j] * mpmath.mpf(float(W[j, k])) * zi[k] for j in range(d) for k in range(d))
                for t in range(T)
            ]
            top = max(logit)
            e = [mpmath.exp(lg - top) for lg in logit]
            s = [w / sum(e) for w in e]
            a = [sum(mpmath.mpf(float(v[k])) * x[t][k] for k in range(d)) for t in range(T)]
            f = sum(s[t] * a[t] for t in range(T))
            lp = -1 / (1 + mpmath.exp(mpmath.mpf(float(Y[i])) * f))
            for t in range(T):
                c = lp * mpmath.mpf(float(Y[i])) * s[t] * (a[t] - f) / n
                for j in range(d):
                    for k in range(d):
                        G[j][k] += c * x[t][j] * zi[k]
        return G


def test_normalized_direction_across_sequences_whose_scales_differ_by_2_to_the_2000() -> None:
    """Regression: the log-domain gradient clipped each sequence's log-size gap at −4000 before adding
    its exponent gap E_i − E*, so a sequence 2^2000 apart in scale got a wrong size and the direction
    came out ≈ −e₁e₁ᵀ (log-norm −2607.4). Oracle: 80-digit mpmath from the definition."""
    X = np.array([[[2.0**1000, 0.0], [0.0, 0.0]], [[0.0, 2.0**-1000], [0.0, 0.0]]])
    z = np.array([[2.0**1000, 0.0], [0.0, 2.0**-1000]])
    Y = np.array([1.0, 1.0])
    v = 8800 * 2.0**-1000 * np.array([1.0, 1.0])
    W = np.zeros((2, 2))
    g = A.normalized_risk_grad(A.Instance(X, Y, v, z), W)
    G = _mp_risk_grad(X, Y, v, z, W)
    with mpmath.workdps(80):
        norm = mpmath.sqrt(sum(G[j][k] ** 2 for j in range(2) for k in range(2)))
        ref = np.array([[float(G[j][k] / norm) for k in range(2)] for j in range(2)])
        log_norm = float(mpmath.log(norm))
    assert np.max(np.abs(g.direction - ref)) <= HUGE_MARGIN_DIR_ATOL
    assert abs(g.log_norm - log_norm) <= LOG_NORM_RTOL * abs(log_norm)


#: log||∇L|| is a sum of logs of size ~3000 each rounded to a few ulps: 1e-12 relative covers it.
LOG_NORM_RTOL = 1e-12


# ------------------------------------- no-live-term refusals (issue 13 §1): what each one names
_GAP_MAX = float(np.finfo(np.float64).max)


def test_overflowing_logit_gap_with_a_huge_loss_derivative_is_undetermined() -> None:
    """Logits ±1e308 (the gap overflows: s_2 is not a double even in logs) and values ∓1.8e308 under the
    exponential loss: |ℓ'| = e^{|f|} may be as large as 1/s_2, so the size of ∇L cannot be bounded below
    the range from float64 alone. Both functions refuse as undetermined (never a 0, never "exactly zero").
    Oracle: the analytic size bound log|ℓ'| + log s_2 ≤ 1.8e308 − 2e308 is not decidable in doubles."""
    inst = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([1.0]), np.array([-_GAP_MAX]), np.array([[1.0]]))
    msg = (
        "the risk gradient ∇L(W) is undetermined in float64: a gap between two logits of a sequence exceeds "
        "1.8e308 (a weight e^{−gap} is not a double, even in logs) while |ℓ'| is as large as e^{gap}. "
        "Scale W (or the data) down"
    )
    for fn in (A.risk_grad, A.normalized_risk_grad):
        with pytest.raises(NumericalError) as ei:
            fn(inst, np.array([[1e308]]), loss="exponential")
        assert str(ei.value) == msg
        assert not isinstance(ei.value, A.model._grad.GradientRangeError)


def test_overflowing_logit_gap_refusal_names_the_underflow_and_the_range() -> None:
    """Tokens ±1, W = 1e308: ∇L = −4 s_1 s_2 with s_2 = e^{−2e308} (analytic oracle: nonzero, below any
    double, even in logs). The whole refusal is pinned: it names the gradient, the underflow, the
    cause (the logit gap), the range and the remedy; log_norm is −inf."""
    inst = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([1.0]), np.array([1.0]), np.array([[1.0]]))
    head = (
        "the risk gradient ∇L(W) (Frobenius norm) is below any double (underflow to 0). A gap between two "
        "logits x_itᵀ W z_i of a sequence exceeds 1.8e308, so a softmax weight e^{−gap} and the gradient "
        "are far below float64's normal range [2.2e-308, 1.8e308] (even log||∇L|| is not a double). "
    )
    for fn, tail in (
        (A.risk_grad, "Scale W down"),
        (A.normalized_risk_grad, "Scale W down: the direction is then defined by representable weights"),
    ):
        with pytest.raises(A.model._grad.GradientRangeError) as ei:
            fn(inst, np.array([[1e308]]))
        assert str(ei.value) == head + tail
        assert ei.value.log_norm == -np.inf


def test_equal_rounded_values_of_different_tokens_are_not_an_exact_zero() -> None:
    """x_1 = (1, 2^−53, −1), x_2 = 0, v = 1: vᵀx_1 = 2^−53 (exact, by hand) rounds to 0 = vᵀx_2, so every
    computed term is 0 while ∇L ≠ 0. risk_grad used to return zeros and normalized_risk_grad to say
    "exactly zero"; both now refuse at the values' rounding level. Oracle: the exact value 2^−53 ≠ 0."""
    inst = A.Instance(
        np.array([[[1.0, 2.0**-53, -1.0], [0.0, 0.0, 0.0]]]),
        np.array([1.0]),
        np.ones(3),
        np.array([[1.0, 0, 0]]),
    )
    assert float((inst.X @ inst.v)[0, 0]) == 0.0  # the rounding that hides the difference
    with pytest.raises(
        NumericalError, match=r"^the risk gradient ∇L\(W\) is undetermined in float64: the risk "
    ):
        A.risk_grad(inst, np.zeros((3, 3)))
    with pytest.raises(NumericalError, match=r"^the risk gradient's contributions cancel to rounding level"):
        A.normalized_risk_grad(inst, np.zeros((3, 3)))
    # Different tokens whose products v_k x_k are all exactly 0 (no rounding to hide anything): the
    # values are exactly equal and ∇L = 0 exactly, which is returned.
    exact = A.Instance(
        np.array([[[0.0, 5.0, 0.0], [0.0, 7.0, 0.0]]]), inst.Y, np.array([1.0, 0.0, 1.0]), inst.z
    )
    assert np.all(A.risk_grad(exact, np.zeros((3, 3))) == 0.0)
