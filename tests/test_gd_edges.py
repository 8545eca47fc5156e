"""Gradient descent at its edges: boundary cases, exact small trajectories and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.gd` against an independent oracle (a
trajectory computed by hand or with mpmath for a tiny instance, scale equivariance by powers of two,
an exact certificate, or the documented error text).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm
from attnsvm import AttnSVMError, Instance, InvalidInstanceError, NumericalError
from attnsvm.gd._single import record_steps
from attnsvm.scaling import FLOAT_MAX

#: mpmath working precision (digits) of the hand-derived trajectories: far beyond float64's 16.
MP_DPS = 40
#: Relative tolerance of one float64 GD step against its 40-digit value on a 1×2×2 instance:
#: the step is a handful of products and one softmax of O(1) logits, each rounding to ≤ eps
#: (2.2e-16); 1e-12 leaves a factor > 1000 of margin and is still far below any real error.
STEP_RTOL = 1e-12
#: Relative tolerance of a warm start rescaled onto a sphere: W0·(R/||W0||) rounds twice (the
#: norm and the product), each ≤ eps relatively, so 4·eps bounds it.
RESCALE_RTOL = 4 * np.finfo(np.float64).eps


def _inst(a: int = 0, b: int = 0) -> Instance:
    """1×2×2 instance (n = 1, T = 2, d = 2) with X·2^a, z·2^b, v·2^−a (the same token values)."""
    X = np.array([[[0.75, 0.0], [0.0, 0.5]]]) * 2.0**a
    z = np.array([[0.75, 0.5]]) * 2.0**b
    v = np.array([1.0, -1.0]) * 2.0**-a
    return Instance(X, np.array([1.0]), v, z)


def _mp_risk_grad(W: np.ndarray) -> list[list[mpmath.mpf]]:
    """∇L(W) of the 1×2×2 instance of :func:`_inst` at 40 digits, from the definition
    ``L(W) = ℓ(Y·vᵀXᵀσ(XWz))``, ``ℓ(u) = log(1 + e^{−u})``, differentiated by mpmath (central differences
    at 40 digits, step 1e-15: truncation error ~1e-30), independently of attnsvm's closed form."""
    mpmath.mp.dps = MP_DPS
    X = [[mpmath.mpf("0.75"), 0], [0, mpmath.mpf("0.5")]]
    z = [mpmath.mpf("0.75"), mpmath.mpf("0.5")]
    v = [1, -1]

    def risk(M: list[list[mpmath.mpf]]) -> mpmath.mpf:
        logit = [sum(X[t][p] * M[p][q] * z[q] for p in range(2) for q in range(2)) for t in range(2)]
        top = max(logit)
        e = [mpmath.exp(lt - top) for lt in logit]
        s = [ei / sum(e) for ei in e]
        f = sum(s[t] * sum(v[p] * X[t][p] for p in range(2)) for t in range(2))
        return mpmath.log(1 + mpmath.exp(-f))

    h = mpmath.mpf("1e-15")
    Wm = [[mpmath.mpf(float(W[p, q])) for q in range(2)] for p in range(2)]
    G = [[mpmath.mpf(0)] * 2 for _ in range(2)]
    for p in range(2):
        for q in range(2):
            up = [row[:] for row in Wm]
            dn = [row[:] for row in Wm]
            up[p][q] += h
            dn[p][q] -= h
            G[p][q] = (risk(up) - risk(dn)) / (2 * h)
    return G


# ------------------------------------------------------------------ direction measures
def test_corr_of_a_matrix_and_its_negative_is_exactly_minus_one() -> None:
    """Oracle: the definition, corr(W, −W) = −1 exactly, and the documented range [−1, 1]. For this W
    the rounded Σ ûᵢ² is 1 + 2^−52, so an unclipped sum would leave the documented range."""
    W = np.array([[-2.3250307746388343, -0.21879166393254573], [-1.2459109472530652, -0.7322673547034516]])
    assert attnsvm.direction_corr(W, -W) == -1.0
    assert attnsvm.direction_corr(W, W) == 1.0


def test_direction_measures_name_the_bad_second_argument() -> None:
    """Oracle: the documented error text (the message names the argument that is wrong)."""
    W = np.eye(2)
    with pytest.raises(InvalidInstanceError, match=r"^W2 must be finite"):
        attnsvm.direction_corr(W, np.array([[1.0, math.nan], [0.0, 1.0]]))
    with pytest.raises(InvalidInstanceError, match=r"^W2 is the zero matrix"):
        attnsvm.direction_corr(W, np.zeros((2, 2)))
    with pytest.raises(InvalidInstanceError, match=r"^W1 is the zero matrix"):
        attnsvm.direction_gap(np.zeros((2, 2)), W)


def test_fit_rate_refuses_bad_x_with_its_name() -> None:
    """Oracle: the documented contract of ``x`` (shape (k,), finite, not all equal) and its error text."""
    gap = [1.0, 0.5, 0.25]
    with pytest.raises(InvalidInstanceError, match=r"^x must have 1 dimension\(s\); got shape \(3, 1\)"):
        attnsvm.fit_rate([[1.0], [2.0], [3.0]], gap)
    with pytest.raises(InvalidInstanceError, match=r"^x must be finite"):
        attnsvm.fit_rate([1.0, math.inf, 3.0], gap)
    with pytest.raises(InvalidInstanceError, match=r"^x values are all equal; the slope is undefined"):
        attnsvm.fit_rate([2.0, 2.0, 2.0], gap)


# --------------------------------------------------------------------------- run_gd
def test_run_gd_names_the_step_size_when_it_is_not_positive() -> None:
    """Oracle: the documented error text (``lr`` must be a positive finite number)."""
    with pytest.raises(AttnSVMError, match=r"^lr must be a positive finite number"):
        attnsvm.run_gd(_inst(), 1, -1.0)


def test_run_gd_names_a_misshapen_reference() -> None:
    """Oracle: the documented error text naming ``reference`` and the expected shape (d, d)."""
    with pytest.raises(InvalidInstanceError, match=r"^reference must have shape \(d, d\) = \(2, 2\)"):
        attnsvm.run_gd(_inst(), 1, 0.1, reference=np.eye(3))


def test_subnormal_start_is_refused_with_the_scaling_remedy() -> None:
    """Oracle: the scale contract's documented message: an iterate whose largest entry is subnormal
    raises NumericalError naming it, its size (about 1e-310) and the remedy."""
    with pytest.raises(NumericalError) as info:
        attnsvm.run_gd(_inst(), 1, 0.1, W0=np.array([[1e-310, 0.0], [0.0, 0.0]]))
    msg = str(info.value)
    assert msg.startswith("W0 is about 1e-310")
    assert msg.endswith("Scale lr (and W0) with the data: X·2^a, z·2^b is the same problem in W·2^−(a+b)")


@pytest.mark.parametrize("k", [0, 200])
def test_logits_beyond_the_documented_bound_are_refused_at_every_data_scale(k: int) -> None:
    """Oracle: run_gd's documented logit bound 1.8e308/(4d²) (d = 2: FLOAT_MAX/16) and scale
    equivariance: X·2^(k/2), z·2^(k/2), W0·2^−k has the same logits, so the same refusal and the
    same reported size (d²·max|W|·2^k = FLOAT_MAX/2 ≈ 1e308) and remedy at every k. max|W0|·2^k =
    FLOAT_MAX/8 is above the bound for d = 2 (and below FLOAT_MAX/4: the bound must grow with d²)."""
    W0 = np.array([[FLOAT_MAX / 8 * 2.0**-k, 0.0], [0.0, 0.0]])
    with pytest.raises(NumericalError) as info:
        attnsvm.run_gd(_inst(k // 2, k - k // 2), 1, 0.1, W0=W0)
    msg = str(info.value)
    assert msg.startswith("normalized GD at step 1: the logits x_itᵀ W z_i (up to d²·max|W|")
    assert f"2^{k}) is about 1e+308" in msg
    # representable logits above the engines' headroom: named as above the bound, never an underflow
    assert f"above {FLOAT_MAX / 16:.3g} = 1.8e308/(4d²)" in msg and "underflow" not in msg
    assert msg.endswith(
        "The softmax is one-hot far beyond float64 there; lower lr or the number of steps, "
        "or rescale the data (W·c on (X, z) is W on (√c·X, √c·z))"
    )


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_unrepresentable_token_values_are_refused_with_the_remedy(scale: float) -> None:
    """Oracle: the scale contract's documented message: v and X both scaled by 1e±300 make the token
    values vᵀx_it about 1e±600, not doubles, so run_gd refuses and says what to rescale."""
    inst = Instance(_inst().X * scale, np.array([1.0]), _inst().v * scale, _inst().z)
    with pytest.raises(NumericalError) as info:
        attnsvm.run_gd(inst, 1, 0.1)
    msg = str(info.value)
    assert f"is about 1e{'+' if scale > 1 else '-'}600" in msg
    assert msg.endswith("Rescale v or X so that the token values vᵀx_it are normal doubles")


@pytest.mark.parametrize(("normalized", "lr"), [(True, 0.5), (False, 1.0)])
def test_early_stop_reports_settled_and_the_loss_name(normalized: bool, lr: float) -> None:
    """Oracle: the documented early-stop rule and result fields: with a loose tolerance (1e-2) and a
    record every step, normalized and plain GD settle after the third record (the first at which three
    records exist), report ``stop_reason == "settled"`` and name their loss and variant."""
    traj = attnsvm.run_gd(_inst(), 50, lr, normalized=normalized, early_stop=1e-2, record_at=1)
    assert traj.stop_reason == "settled"
    assert traj.steps_run == 3
    assert traj.loss == "logistic"
    assert traj.normalized is normalized


def test_plain_gd_stalled_at_the_start_records_step_zero_once() -> None:
    """Oracle: float64 arithmetic and the documented stall rule. At W0 = 1000·𝟙 the logit gap is
    312.5, so ||∇L|| ≈ 1e-136 and η∇L (η = 1) is below half an ulp of every entry (~1e-13): the first
    update leaves W0 bit for bit, the run stops as ``"stalled"`` after 0 steps with W = W0, and the
    record holds step 0 exactly once."""
    W0 = np.full((2, 2), 1000.0)
    traj = attnsvm.run_gd(_inst(), 3, 1.0, normalized=False, W0=W0, record_at=[0, 1])
    assert (traj.stop_reason, traj.steps_run, traj.saturated) == ("stalled", 0, True)
    assert np.array_equal(traj.W, W0)
    assert [r.step for r in traj.record] == [0]


# ------------------------------------------------------------------ regularization path
def test_regularization_path_argument_errors_name_the_argument() -> None:
    """Oracle: the documented argument contract (radii positive and increasing, max_steps ≥ 1,
    tol finite ≥ 0) and its error text."""
    inst = _inst()
    with pytest.raises(
        AttnSVMError, match=r"^radii must be a non-empty, strictly increasing list of positive"
    ):
        attnsvm.regularization_path(inst, [0.0, 1.0])
    with pytest.raises(InvalidInstanceError, match=r"^radii must be finite"):
        attnsvm.regularization_path(inst, [1.0, math.nan])
    with pytest.raises(AttnSVMError, match=r"^max_steps must be an integer ≥ 1"):
        attnsvm.regularization_path(inst, [1.0], max_steps=0)
    for tol in (-1.0, math.inf):
        with pytest.raises(AttnSVMError, match=r"^tol must be a finite number ≥ 0"):
            attnsvm.regularization_path(inst, [1.0], tol=tol)


def test_regularization_path_warm_start_and_its_direction_measures() -> None:
    """Oracle: hand-derived values. A nonzero W0 = diag(3, 4) is rescaled onto the sphere R = 2
    (documented): W = diag(1.2, 1.6); with a tolerance no residual exceeds, no step is taken; the
    correlation with diag(1, 0) is 3/5 and the gap 1 − 3/5 = 2/5."""
    path = attnsvm.regularization_path(
        _inst(), [2.0], W0=np.diag([3.0, 4.0]), tol=1e300, reference=np.diag([1.0, 0.0])
    )
    (p,) = path.points
    assert p.iterations == 0
    np.testing.assert_allclose(p.W, np.diag([1.2, 1.6]), rtol=RESCALE_RTOL, atol=0)
    assert p.corr == pytest.approx(0.6, rel=RESCALE_RTOL)
    assert p.gap == pytest.approx(0.4, rel=RESCALE_RTOL)
    assert path.corrs[0] == p.corr


def test_a_radius_whose_residual_meets_tol_takes_no_step() -> None:
    """Oracle: the documented stopping rule ("a radius stops at tol": done once the KKT residual is
    ≤ tol). The warm start's residual r0 is read from a run that takes no step; with tol = r0
    exactly the radius is already done, with tol just below r0 it is not."""
    W0 = np.diag([3.0, 4.0])
    r0 = attnsvm.regularization_path(_inst(), [2.0], W0=W0, tol=1e300).points[0].kkt_residual
    assert math.isfinite(r0) and r0 > 0
    assert attnsvm.regularization_path(_inst(), [2.0], W0=W0, tol=r0).points[0].iterations == 0
    below = attnsvm.regularization_path(_inst(), [2.0], W0=W0, tol=r0 * (1 - 1e-15), max_steps=1)
    assert below.points[0].iterations == 1


def test_a_radius_whose_step_size_reaches_its_floor_takes_no_step() -> None:
    """Oracle: the documented stopping rule "a radius stops at η ≤ 1e-15·R" (η = lr·R): with
    lr = 1e-15 the first step size is exactly at the floor, so the radius takes no step; one ulp above
    the floor it steps (tol = 0 and max_steps = 3 rule out the other stops)."""
    W0 = np.diag([3.0, 4.0])
    at_floor = attnsvm.regularization_path(_inst(), [2.0], lr=1e-15, W0=W0, tol=0.0, max_steps=3)
    assert at_floor.points[0].iterations == 0
    above = attnsvm.regularization_path(
        _inst(), [2.0], lr=np.nextafter(1e-15, 1.0), W0=W0, tol=0.0, max_steps=3
    )
    assert above.points[0].iterations > 0


# ---------------------------------------------------------------------------- W = K Qᵀ
def test_run_gd_kq_argument_errors_name_the_argument() -> None:
    """Oracle: the documented argument contract (m an integer ≥ 1, Q0 of shape (d, m)) and its text."""
    for m in (True, 1.5, "2"):
        with pytest.raises(AttnSVMError, match=r"^m must be an integer ≥ 1"):
            attnsvm.run_gd_kq(_inst(), 1, 0.1, m=m)  # type: ignore[arg-type]
    with pytest.raises(InvalidInstanceError, match=r"^Q0 must have shape \(d, m\) = \(2, 2\)"):
        attnsvm.run_gd_kq(_inst(), 1, 0.1, Q0=np.ones((2, 3)))


def test_normalized_kq_at_a_stationary_point_says_normalized() -> None:
    """Oracle: the documented behaviour at ∇L = 0 (equal token values vᵀx_1 = vᵀx_2 = 0 make the
    gradient exactly zero): normalized (K, Q) GD has no direction and raises, naming its variant."""
    X = np.array([[[0.5, 0.5], [0.75, 0.75]]])
    inst = Instance(X, np.array([1.0]), np.array([1.0, -1.0]), np.array([[0.75, 0.5]]))
    with pytest.raises(NumericalError, match=r"^normalized \(K, Q\) GD at step 1: .*exactly zero"):
        attnsvm.run_gd_kq(inst, 3, 0.1)


def test_plain_kq_gradient_underflow_at_the_first_step() -> None:
    """Oracle: the documented saturation rule and the hand-computed logit gap: K0 = Q0 = 50·e1 give
    W = 2500·e1e1ᵀ, logits 2500·0.75·(0.75, 0) (gap 1406), so ||∇L|| ~ e^−1406 underflows before any
    update: 0 steps, stop "gradient underflow", one record at step 0 with ||W||_* = 2500."""
    K0 = np.array([[50.0], [0.0]])
    traj = attnsvm.run_gd_kq(_inst(), 3, 0.1, normalized=False, K0=K0, Q0=K0.copy())
    assert (traj.stop_reason, traj.steps_run, traj.saturated) == ("gradient underflow", 0, True)
    assert [r.step for r in traj.record] == [0]
    assert traj.nuclear_norms.tolist() == [2500.0]
    assert traj.normalized is False


def test_plain_kq_one_step_then_underflow_matches_the_update_rule() -> None:
    """Oracle: the documented update K ← K − η∇L(W)Q, Q ← Q − η∇L(W)ᵀK taken by hand with a
    40-digit gradient (mpmath, from the risk's definition), and the documented saturation record:
    from K0 = Q0 = e1 with η = 1000 the first step moves W to ~7e3 in a separating direction, the
    second gradient underflows, so 1 step is run and the final state (step 1) is recorded after
    the record at step 0; with m = 1, ||W||_* = ||K||·||Q|| (a rank-one W)."""
    K0 = np.array([[1.0], [0.0]])
    lr = 1000.0
    traj = attnsvm.run_gd_kq(_inst(), 3, lr, normalized=False, K0=K0, Q0=K0.copy(), record_at=[0, 3])
    assert (traj.stop_reason, traj.steps_run) == ("gradient underflow", 1)
    assert [r.step for r in traj.record] == [0, 1]
    G = _mp_risk_grad(K0 @ K0.T)
    K1 = [K0[p, 0] - lr * (G[p][0] * K0[0, 0] + G[p][1] * K0[1, 0]) for p in range(2)]
    Q1 = [K0[q, 0] - lr * (G[0][q] * K0[0, 0] + G[1][q] * K0[1, 0]) for q in range(2)]
    np.testing.assert_allclose(traj.K[:, 0], [float(x) for x in K1], rtol=STEP_RTOL)
    np.testing.assert_allclose(traj.Q[:, 0], [float(x) for x in Q1], rtol=STEP_RTOL)
    nuc = float(mpmath.sqrt(sum(x**2 for x in K1)) * mpmath.sqrt(sum(x**2 for x in Q1)))
    np.testing.assert_allclose(traj.nuclear_norms, [1.0, nuc], rtol=STEP_RTOL)


def test_normalized_kq_reports_its_settings_and_nuclear_norms() -> None:
    """Oracle: with m = 1, W = K Qᵀ is rank one and ||W||_* = ||K||_F·||Q||_F (hand identity), at
    every recorded step; the result names its variant."""
    traj = attnsvm.run_gd_kq(_inst(), 4, 0.1, m=1, record_at=[4])
    assert traj.normalized is True
    assert traj.nuclear_norms.shape == (1,)
    assert traj.nuclear_norms[0] == pytest.approx(
        float(np.linalg.norm(traj.K) * np.linalg.norm(traj.Q)), rel=RESCALE_RTOL
    )


# -------------------------------------------------------------------------- record steps
@pytest.mark.parametrize(("k", "steps"), [(1, 3), (2, 5), (3, 9), (4, 3)])
def test_record_interval_grid(k: int, steps: int) -> None:
    """Oracle: the documented record grid of an interval k: every k-th step in [1, steps] and the
    final step, as int64 (the engines' step indices), built here as a Python set."""
    got = record_steps(k, steps)
    assert got.dtype == np.int64
    assert got.tolist() == sorted({s for s in range(1, steps + 1) if s % k == 0} | {steps})
