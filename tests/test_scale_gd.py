"""The scale contract of the GD engines (issue 13 §1): right answer or a NumericalError naming the range.

Every engine computes on the data rescaled by exact powers of two (``attnsvm.gd._scaled._Scaled``: ``X'``,
``z'`` of order one, ``v' = v·2^ex`` so the token values are unchanged, ``W' = W·2^k``), so the data's
magnitude alone never overflows or underflows an intermediate; what remains out of range is the
answer itself (an iterate, the logits ``x_itᵀ W z_i``, the token values ``vᵀx_it``), and that is
refused with :func:`attnsvm.scaling.range_error`'s message.

Oracles: the equivariance ``(2^a X, 2^b z, 2^−a v)`` with ``W0·2^−(a+b)`` and ``lr·2^−(a+b)``
(normalized; ``lr·2^−2(a+b)`` for plain GD) gives exactly ``W_t·2^−(a+b)`` (powers of two round
nothing in the normal range); at data so small that every logit is below 1e-300 the softmax is
uniform to float64 precision, so normalized GD moves along the fixed direction at ``W = 0``
(computed from the unscaled data) and ``W_t = −t·lr·D_0``; direction measures against mpmath at
60 digits.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.gd import (
    direction_corr,
    direction_gap,
    fit_rate,
    regularization_path,
    run_gd,
    run_gd_batch,
    run_gd_kq,
)

ROOT = Path(__file__).resolve().parents[1]
EPS = float(np.finfo(np.float64).eps)
#: W_t = −t·lr·D_0 at uniform attention: t additions of the same vector, each rounding by ≤ eps/2
#: relative (the sum of t equal terms: ≤ t·eps/2), and D_0 itself to a few ulps (8 eps, the
#: log-domain direction's error): 40 steps → ≤ 28 eps; 64 eps.
RTOL_UNIFORM = 64 * EPS
#: corr and gap against 60-digit mpmath: a d²-term dot product of unit matrices (d ≤ 3: 9 terms),
#: each rounded to ≤ 2 eps relative; the gap ½||Ŵ1 − Ŵ2||² has relative error ~ eps/gap (gap ≥ 1e-3
#: here): 1e-12 covers both.
RTOL_MEASURE = 1e-12


def _inst(seed: int = 1) -> A.Instance:
    return A.random_instance(3, 4, 3, seed=seed)


def test_cli_gd_at_1e200_names_the_logit_overflow(tmp_path: Path) -> None:
    """The observed case (issue 13): ``attnsvm gd`` on X, z scaled by 1e200 exited 2 with "gradient
    contributions cancel to rounding level". The cause is the logits ``x_itᵀ W_1 z_i`` ~ 1e400 after
    one step of length 0.1: the error must name them and the range, not a cancellation."""
    inst = _inst()
    path = tmp_path / "big.npz"
    np.savez(path, X=inst.X * 1e200, Y=inst.Y, v=inst.v, z=inst.z * 1e200)
    proc = subprocess.run(
        [sys.executable, "-m", "attnsvm.harness.cli", "gd", str(path), "--steps", "50", "--lr", "0.1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "logits" in proc.stderr and "overflows float64's normal range" in proc.stderr, proc.stderr
    assert "cancel" not in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("normalized", "j"), [(True, 500), (True, -500), (False, 250), (False, -250)])
def test_run_gd_at_extreme_scales_with_the_scaled_step_equals_the_unit_scale_run(
    normalized: bool, j: int
) -> None:
    """Oracle: equivariance. X, z ×2^j (2^±500 ≈ 1e±150; plain GD, whose lr scales twice as fast,
    2^±250), v ×2^−j (token values unchanged), lr scaled to match: every iterate is exactly the
    unit-scale one ×2^−2j, the tokens and risks identical."""
    inst = _inst()
    big = S.scaled(inst, j, j, -j)
    lr = 0.1 if normalized else 0.05
    lr_big = math.ldexp(lr, -2 * j) if normalized else math.ldexp(lr, -4 * j)
    ref = run_gd(inst, 30, lr, normalized=normalized, record_at=1, keep_iterates=True)
    tr = run_gd(big, 30, lr_big, normalized=normalized, record_at=1, keep_iterates=True)
    for a, b in zip(tr.record, ref.record, strict=True):
        assert a.W is not None and b.W is not None
        np.testing.assert_array_equal(np.ldexp(a.W, 2 * j), b.W)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert a.risk == b.risk


def test_run_gd_on_tiny_data_moves_along_the_uniform_attention_direction() -> None:
    """X, z ×2^−700 (≈ 1e-211): the logits of W_t (||W_t|| ≤ 4) are ≤ 1e-400, the softmax is uniform
    to float64 precision, so normalized GD is W_t = −t·lr·D_0 with D_0 the direction at W = 0 of the
    unscaled data (oracle; the old engine refused: ∇L ~ 1e-422 underflowed to 0)."""
    inst = _inst()
    tiny = S.scaled(inst, -700, -700, 700)
    tr = run_gd(tiny, 40, 0.1, record_at=1, keep_iterates=True)
    D0 = A.normalized_risk_grad(inst, np.zeros((3, 3))).direction
    for r in tr.record:
        assert r.W is not None
        expect = -r.step * 0.1 * D0
        assert np.linalg.norm(r.W - expect) <= RTOL_UNIFORM * np.linalg.norm(expect) * max(r.step, 1)
    assert math.isclose(tr.record[-1].log10_grad_norm, tr.record[0].log10_grad_norm, rel_tol=1e-12)


def test_token_values_out_of_range_are_named() -> None:
    """X ≈ 1e300 and v ≈ 1e100: the token values vᵀx_it ≈ 1e400 are no double (the risk is not
    either): every engine raises the contract's error naming them."""
    inst = _inst()
    bad = S.scaled(inst, 997, 997, 332)
    for call in (
        lambda: run_gd(bad, 5, 0.1),
        lambda: run_gd(bad, 5, 0.1, normalized=False),
        lambda: run_gd_batch([bad], 5, 0.1),
        lambda: run_gd_kq(bad, 5, 0.1),
        lambda: regularization_path(bad, [1.0]),
    ):
        with pytest.raises(NumericalError, match=r"token values vᵀx_it.*overflows float64's normal range"):
            call()


def test_iterates_below_the_normal_range_are_refused() -> None:
    """lr = 1e-320 from W0 = 0 makes W_1 subnormal (a few significant bits): refused, naming the
    iterate, not returned as if exact."""
    inst = _inst()
    with pytest.raises(NumericalError, match=r"iterate W_1 of normalized GD is about 1e-320: it underflows"):
        run_gd(inst, 3, 1e-320)


def test_batched_engine_raises_the_same_error_at_1e200_and_agrees_at_2_pm300() -> None:
    """The batched engine: at 1e200 (lr 0.1) the logit overflow, like run_gd; at X, z ×2^±300 (1e±90)
    with the scaled step it agrees with run_gd to the batched engine's documented 1e-8 (measured
    ≤ 3e-14)."""
    inst = _inst()
    big = A.Instance(inst.X * 1e200, inst.Y, inst.v, inst.z * 1e200)
    with pytest.raises(NumericalError, match="logits"):
        run_gd(big, 10, 0.1)
    with pytest.raises(NumericalError, match="logits"):
        run_gd_batch([big], 10, 0.1)
    for j in (300, -300):
        s = S.scaled(inst, j, j, -j)
        lr = math.ldexp(0.1, -2 * j)
        tr = run_gd(s, 30, lr)
        bt = run_gd_batch([s], 30, lr)
        Wb, Ws = np.ldexp(bt.W[0], 2 * j), np.ldexp(tr.W, 2 * j)  # back to unit scale (exact) for the norms
        assert np.linalg.norm(Wb - Ws) <= 1e-8 * np.linalg.norm(Ws)
        assert np.abs(bt.log10_grad_norms[-1, 0] - tr.log10_grad_norms[-1]) <= 1e-8 * abs(
            tr.log10_grad_norms[-1]
        )


def test_regularization_path_and_kq_are_equivariant_at_1e150() -> None:
    """Oracle: equivariance (radii and factors scaled exactly): the path points and the (K, Q)
    iterates are the unit-scale ones times the power of two, bit for bit."""
    inst = _inst()
    j = 500
    s = S.scaled(inst, j, j, -j)
    p0 = regularization_path(inst, [1.0, 2.0, 4.0], max_steps=30)
    ps = regularization_path(s, np.ldexp([1.0, 2.0, 4.0], -2 * j), max_steps=30)
    for a, b in zip(ps.points, p0.points, strict=True):
        np.testing.assert_array_equal(np.ldexp(a.W, 2 * j), b.W)
        assert a.kkt_residual == b.kkt_residual or (math.isnan(a.kkt_residual) and math.isnan(b.kkt_residual))
    rng = np.random.default_rng(1)
    K0, Q0 = 0.1 * rng.standard_normal((3, 3)), 0.1 * rng.standard_normal((3, 3))
    k0 = run_gd_kq(inst, 20, 0.1, K0=K0, Q0=Q0)
    ks = run_gd_kq(s, 20, math.ldexp(0.1, -j), K0=np.ldexp(K0, -j), Q0=np.ldexp(Q0, -j))
    np.testing.assert_array_equal(np.ldexp(ks.K, j), k0.K)
    np.testing.assert_array_equal(np.ldexp(ks.W, 2 * j), k0.W)


def test_regularization_path_point_below_the_normal_range_is_refused() -> None:
    """Regression (found by the scale sweep's property once its examples changed): with ``z·2^1014`` and
    the radii ``·2^−1014`` the path's first point is the unit-scale one, ``0.0025``, times ``2^−1014``:
    ``1.425e-308``, below float64's normal range. The path ran on subnormal iterates and returned wrong
    numbers silently: ``1.4383e-308`` for it, and ``1.4383e-308`` for the second point, whose exact value is
    ``0.0021484375·2^−1014 = 1.2238e-308`` (17 % off).
    Oracle: the unit-scale path and the contract: a point that is not a normal double is refused,
    naming the range and the radii as the remedy; the scale at which it is normal agrees bit for bit."""
    X = np.array([[[-4.0], [0.0], [0.0], [0.0]], [[0.0], [0.0], [0.0], [0.0]], [[-3.0], [3.0], [0.0], [0.0]]])
    Y, v, z = np.array([-1.0, 1.0, -1.0]), np.array([-1.0]), np.array([[-2.0], [0.0], [2.0]])
    radii = np.array([0.5, 2.0, 8.0])
    unit = regularization_path(A.Instance(X, Y, v, z), radii, max_steps=20)
    assert 0.0 < float(np.max(np.abs(unit.points[0].W))) * 2.0**-1014 < 2.0**-1022  # the oracle's claim
    with pytest.raises(NumericalError, match=r"path point W at radius .*normal range.*Scale the radii"):
        regularization_path(A.Instance(X, Y, v, np.ldexp(z, 1014)), np.ldexp(radii, -1014), max_steps=20)
    ok = regularization_path(A.Instance(X, Y, v, np.ldexp(z, 1000)), np.ldexp(radii, -1000), max_steps=20)
    for a, b in zip(ok.points, unit.points, strict=True):
        np.testing.assert_array_equal(np.ldexp(a.W, 1000), b.W)


def _mp_corr_gap(W1: np.ndarray, W2: np.ndarray) -> tuple[float, float]:
    with mpmath.workdps(60):
        a = [mpmath.mpf(float(x)) for x in W1.ravel()]
        b = [mpmath.mpf(float(x)) for x in W2.ravel()]
        na = mpmath.sqrt(sum(x * x for x in a))
        nb = mpmath.sqrt(sum(x * x for x in b))
        corr = sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)
        gap = sum((x / na - y / nb) ** 2 for x, y in zip(a, b, strict=True)) / 2
        return float(corr), float(gap)


@pytest.mark.parametrize("scale", [1e-300, 1e-160, 1.0, 1e160, 1e300])
def test_direction_measures_at_every_scale(scale: float) -> None:
    """Oracle: mpmath at 60 digits. Norms of 1e±300 (||W||² would overflow or underflow)."""
    rng = np.random.default_rng(0)
    W1 = rng.standard_normal((3, 3)) * scale
    W2 = (rng.standard_normal((3, 3)) * 0.3 + W1 / scale) * scale
    corr, gap = _mp_corr_gap(W1, W2)
    assert abs(direction_corr(W1, W2) - corr) <= RTOL_MEASURE
    assert abs(direction_gap(W1, W2) - gap) <= RTOL_MEASURE * gap
    # mixed scales: the measures are scale-free
    assert abs(direction_corr(W1, (W2 / scale) * 1e-300) - corr) <= RTOL_MEASURE


def test_fit_rate_on_underflowing_gaps_raises_instead_of_nan() -> None:
    """Gaps ``1e-300·x^−2`` (some subnormal, oracle: the exact power law, slope −2) fit to slope −2;
    a gap that underflowed to 0 is refused with an AttnSVMError naming it, never a NaN slope."""
    x = np.array([1.0, 2.0, 4.0, 8.0])
    fit = fit_rate(x, 1e-300 * x**-2.0)
    assert abs(fit.slope + 2.0) <= 1e-12 and fit.r2 == pytest.approx(1.0, abs=1e-12)
    fit = fit_rate(x, 1e-310 * x**-2.0)  # subnormal: ~14 significant bits left, slope still −2 to 1e-3
    assert abs(fit.slope + 2.0) <= 1e-3
    with pytest.raises(AttnSVMError, match=r"gap must be positive.*gap\[3\] = 0.0"):
        fit_rate(x, np.array([1e-300, 1e-310, 1e-320, 0.0]))


def test_plain_gd_stops_as_stationary_where_the_gradient_is_zero() -> None:
    """A sequence repeated with the opposite label under the correlation loss: ∇L = 0 exactly (oracle:
    the symmetry Y → −Y of the two copies). Plain GD, which now takes its size from the log-domain
    norm, stops with ``stop_reason = "stationary"`` (the float64 sum is 0 or rounding noise), never a
    step along noise; W0 is returned unchanged."""
    one = A.random_instance(1, 2, 1, seed=0)
    dup = A.Instance(
        np.concatenate([one.X, one.X]), np.array([1.0, -1.0]), one.v, np.concatenate([one.z, one.z])
    )
    tr = run_gd(dup, 3, 0.1, normalized=False, loss="correlation", W0=np.ones((1, 1)))
    assert tr.saturated and tr.stop_reason == "stationary" and tr.steps_run == 0
    np.testing.assert_array_equal(tr.W, np.ones((1, 1)))


@pytest.mark.parametrize("k", [-300, -305])
@pytest.mark.parametrize("fast", [True, False])
def test_batched_engine_at_tiny_token_values_equals_run_gd(k: int, fast: bool) -> None:
    """X, z ×10^k with v fixed: token values ~1e-300 (normal), so the log-domain weights are ~1e-300
    and Σ G² underflowed: the batched engine flagged "contributions cancel" at step 0 where run_gd
    (oracle, itself log-domain throughout) returns. It must agree with run_gd to its documented
    1e-8 (measured ≤ 3e-15)."""
    inst = _inst()
    s = A.Instance(inst.X * 10.0**k, inst.Y, inst.v, inst.z * 10.0**k)
    tr = run_gd(s, 50, 0.1)
    bt = run_gd_batch([s], 50, 0.1, fast_path=fast)
    assert np.linalg.norm(bt.W[0] - tr.W) <= 1e-8 * np.linalg.norm(tr.W)
    assert abs(bt.log10_grad_norms[-1, 0] - tr.log10_grad_norms[-1]) <= 1e-8 * abs(tr.log10_grad_norms[-1])


def test_normalized_run_gd_overflowing_iterate_is_refused_without_a_warning() -> None:
    """Oracle: exact arithmetic. With d = 1 the normalized direction is ±1, so every step moves W by exactly
    lr: W_k = ±(lr + lr + … + lr), k terms summed in float64. At lr = 1.8e307 the first iterate beyond FLOAT_MAX
    (1.7977e308) is W_10 ≈ 1.8e308, which
    must be refused by name, not computed as inf with numpy's overflow RuntimeWarning (found by the scale
    sweep of the batched engine's property: data 1e-154, values 1.5e154)."""
    inst = A.Instance(
        np.array([[[1e-154], [-2e-154]]]), np.array([1.0]), np.array([1.5e154]), np.array([[1e-154]])
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = 0.0
        for _ in range(9):
            w += 1.8e307
        assert abs(float(A.run_gd(inst, 9, 1.8e307).W[0, 0])) == w
        with pytest.raises(NumericalError, match=r"iterate W_10 of normalized GD is beyond any double"):
            A.run_gd(inst, 10, 1.8e307)
