"""Risk, the cancellation-free gradient and the log-domain normalized direction.

Oracles: torch autograd (float64), central finite differences, and a 50-digit mpmath
evaluation of the textbook formula (exact enough that its own cancellation is harmless).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import InvalidInstanceError, NumericalError
from attnsvm.grad import risk_grad_textbook

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
    assert A.risk(inst, W, loss) == pytest.approx(expected, rel=4 * EPS * inst.n)


@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grad_matches_autograd_and_mp(loss, seed):
    inst = A.random_instance(3, 4, 5, seed=seed, family=["gaussian", "unit", "self_attention"][seed])
    W = np.random.default_rng(seed + 10).standard_normal((5, 5))
    g = A.risk_grad(inst, W, loss)
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
        A.normalized_risk_grad(inst, W, "squared")


def test_no_public_call_modifies_its_inputs(inst):
    rng = np.random.default_rng(3)
    X, Y, v, z = inst.X.copy(), inst.Y.copy(), inst.v.copy(), inst.z.copy()
    mine = A.Instance(X, Y, v, z)
    W = rng.standard_normal((inst.d, inst.d))
    W_copy, alpha = W.copy(), np.array([0, 1, 2, 3])
    alpha_copy = alpha.copy()
    for kind in A.KINDS:
        A.attention(mine, W, kind)
        A.output(mine, W, kind)
    for loss in A.LOSSES:
        A.risk(mine, W, loss)
        A.risk_grad(mine, W, loss)
        A.normalized_risk_grad(mine, W, loss)
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
    direction must not be that noise."""
    for seed in (0, 3):
        one = A.random_instance(1, 2, 1, seed=seed)
        dup = A.Instance(
            np.concatenate([one.X, one.X]), np.array([1.0, -1.0]), one.v, np.concatenate([one.z, one.z])
        )
        g = A.risk_grad(dup, np.zeros((1, 1)), "correlation")
        assert np.abs(g).max() <= 1e-15  # zero up to rounding
        with pytest.raises(NumericalError, match="cancel to rounding level"):
            A.normalized_risk_grad(dup, np.zeros((1, 1)), "correlation")


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
