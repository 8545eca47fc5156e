"""The batched GD engine at its edges: boundary cases, exact small trajectories and documented messages.

Each test pins one documented behaviour of `attnsvm.run_gd_batch` (the batched engine of :mod:`attnsvm.gd`) against an independent oracle (a
trajectory computed by hand or with mpmath for a tiny instance, scale equivariance by powers of two,
an exact certificate, or the documented error text).

The refusal thresholds are pinned from both sides, each a factor ≥ √2 away from the threshold, so that
a changed constant, a dropped factor or a bound that stops bounding moves a case across it:

* ``ℓ'(Y_i f_i)`` undetermined: ``f_i`` is known only to ``±δf_i``, ``δf_i = [(T+d)·eps + 2δl_i]·Σ_t s_it|a_it|``
  with the logits' rounding ``δl_i = d²·eps·max_t |x_it|ᵀ|W||z_i|``; refused where ``κ·δf_i > 1``
  (``κ = σ(u + δf)`` for the logistic loss, 1 for the exponential one);
* the values' rounding: ``||∇L|| ≤ CANCELLATION_FACTOR·VE`` (``VE`` the rounding of ``a = vᵀx`` carried
  into ``∇L``) is refused, in the fast (linear-domain) path, the log-domain path and a mixed batch.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.gd import run_gd, run_gd_batch
from attnsvm.model._grad import CANCELLED_MESSAGE

EPS = float(np.finfo(np.float64).eps)  # 2^−52
#: A unit direction formed from a few products and one norm, then one step of size lr ≤ 1 from an
#: iterate with entries ≤ 2: each entry of W_1 is within 8 ulps of 2 (≤ 8·eps·2) of the exact one.
ATOL_STEP = 16 * EPS

# ---------------------------------------------------------------- undetermined loss derivative
#: d = 1, T = 2: tokens ±1, value v = 2^51, query 1, at W = 0 (s = ½ each): f = 0 exactly (u = 0), and
#: δf = (T+d)·eps·Σ s|a| = 3·2^−52·2^51 = 1.5 exactly; logistic κ = σ(0 + 1.5) = 0.818, κ·δf = 1.23 > 1.
_UNDET_DF = "1.5"
_UNDETERMINED = A.Instance(X=[[[1.0], [-1.0]]], Y=[1.0], v=[2.0**51], z=[[1.0]])
_DETERMINED = A.Instance(X=[[[1.0], [-1.0]]], Y=[1.0], v=[1.0], z=[[1.0]])


@pytest.mark.parametrize("normalized", [True, False])
def test_undetermined_derivative_at_zero_margin_names_instance_step_and_sequence(normalized: bool) -> None:
    """Oracle: δf = 1.5 and κ = σ(+δf) by hand (above: refused, κ·δf = 1.23; with σ(−δf) it would be
    0.27), the documented message, and run_gd, which refuses with the same text."""
    with pytest.raises(NumericalError, match="undetermined") as single:
        run_gd(_UNDETERMINED, 1, 0.1, normalized=normalized)
    with pytest.raises(NumericalError) as batched:
        run_gd_batch([_DETERMINED, _UNDETERMINED], 1, 0.1, normalized=normalized)
    kind = "normalized" if normalized else "plain"
    prefix = f"{kind} GD at step 0: instance 1: "
    msg = str(batched.value)
    assert msg.startswith(prefix)
    assert msg[len(prefix) :] == str(single.value).split(": ", 1)[1]
    assert f"the output f_0 = Σ_t s_it vᵀx_it is known only to ±{_UNDET_DF} " in msg
    assert msg.endswith("Rescale v, or use the correlation loss")


#: d = 2, T = 2: x_1 = e_1, x_2 = e_2, z = e_1, v = (A, −A), W = diag(2, 0): logits (2, 0), so
#: max_t |x_t|ᵀ|W||z| = 2, ||W||_F = 2, max||x|| ||z|| = 1, Σ s|a| = A and
#: δf = [(T+d)·eps + 2·d²·eps·2]·A = 20·eps·A. With eps·A = K: refused (u = A·tanh(1) ≫ 0, κ = 1) for
#: K = 0.06 (δf = 1.2); the logits' rounding carries 16/20 of it, so δf without the d² factor (2 in
#: place of 2d²) is 8K = 0.48 < 1 and without δl it is 4K = 0.24.
_W_DIAG = np.diag([2.0, 0.0])


def _opposite_values(K: float) -> A.Instance:
    a = K * 2.0**52
    return A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[a, -a], z=[[1.0, 0.0]])


def test_logit_rounding_makes_the_derivative_undetermined_at_large_W() -> None:
    """Oracle: δf = 20·eps·A = 1.2 by hand (above), most of it from the logits' rounding at W ≠ 0,
    and run_gd, which refuses with the same text."""
    inst = _opposite_values(0.06)
    with pytest.raises(NumericalError, match=r"known only to ±1\.2 ") as single:
        run_gd(inst, 1, 0.1, W0=_W_DIAG)
    with pytest.raises(NumericalError) as batched:
        run_gd_batch([_DETERMINED_2D, inst], 1, 0.1, W0=_W_DIAG)
    prefix = "normalized GD at step 0: instance 1: "
    assert str(batched.value) == prefix + str(single.value).split(": ", 1)[1]


_DETERMINED_2D = A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[1.0, 2.0], z=[[1.0, 0.0]])

#: Tied logits (W z = (2, 2): s = ½ each, f = 0, u = 0) with the same rounding terms as above:
#: max_t |x_t|ᵀ|W||z| = 2, so δf = 20·eps·A = 0.8 for K = 0.04, below 1 (κ = 1, exponential loss):
#: determined, although the cheap screen (4K + ||W||_F·8K = 1.06 > ½) sends it to the exact test.
_W_TIED = np.array([[2.0, 0.0], [2.0, 0.0]])
#: A step small enough that u stays O(1) at W_1 (|Δl| ≤ √2·lr, |f| ≤ A·|Δl|/2 ≈ 0.1): nothing underflows.
_LR_TINY = 2.0**-50


def test_determined_derivative_at_large_values_gives_the_closed_form_step() -> None:
    """Oracle: the closed form at W_0 (s = ½, f = 0, ℓ'(0) = −1): w = ∓A/2, ∇L = (A/2)·(e_2 − e_1)e_1ᵀ,
    D = (e_2 − e_1)e_1ᵀ/√2, so W_1 = W_0 − lr·D exactly up to rounding; and the risk e^0 = 1."""
    inst = _opposite_values(0.04)
    traj = run_gd_batch([inst], 1, _LR_TINY, loss="exponential", W0=_W_TIED, record_at=[0])
    D = np.array([[-1.0, 0.0], [1.0, 0.0]]) / math.sqrt(2.0)
    np.testing.assert_allclose(traj.W[0], _W_TIED - _LR_TINY * D, rtol=0, atol=ATOL_STEP)
    assert traj.steps[0] == 0
    np.testing.assert_allclose(traj.risks[0], [1.0], rtol=4 * EPS)


# ---------------------------------------------------------------- the values' rounding (VE)
#: x_1 = e_1, x_2 = e_2, z = e_1 at W = 0 (s = ½), v = (1, 1 + h), h = k·eps: ∇L = ℓ'·¼·h·(e_1 − e_2)e_1ᵀ,
#: ||∇L|| = |ℓ'|·¼·h·√2; the values' rounding VE = d·eps·|ℓ'|·Σ_t s_t s_u (m_t + m_u) ≈ 2·eps·|ℓ'|, so
#: ||∇L|| / (CANCELLATION_FACTOR·VE) = (√2/64)·k: 0.71 for k = 32 (refused), 2.83 for k = 128 (accepted).
#: (The sum's own rounding level, ~eps²·|ℓ'|, is negligible.) A VE smaller by S² = 4 (the softmax
#: normaliser at W = 0) would accept k = 32; one larger by 4 would refuse k = 128.
_K_REFUSED = 32
_K_ACCEPTED = 128


def _gap(k: int, scale: float = 1.0) -> A.Instance:
    h = k * EPS
    return A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[scale, scale * (1.0 + h)], z=[[scale, 0.0]])


@pytest.mark.parametrize("fast_path", [True, False])
def test_values_rounding_refusal_threshold_from_below(fast_path: bool) -> None:
    """Oracle: ratio 0.71 < 1 by hand (above), and run_gd, which refuses too; the refused instance is
    instance 1 of the batch (the log path's exact term must read that instance's data)."""
    bad = _gap(_K_REFUSED)
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(bad, 1, 0.1)
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_DETERMINED_2D, bad], 1, 0.1, fast_path=fast_path)
    assert str(exc.value) == f"normalized GD at step 0: instance 1: {CANCELLED_MESSAGE}"


@pytest.mark.parametrize("fast_path", [True, False])
def test_values_rounding_refusal_threshold_from_above(fast_path: bool) -> None:
    """Oracle: ratio 2.83 > 1 by hand (accepted), and the closed-form direction
    D = (e_1 − e_2)e_1ᵀ/√2 (a_1 < a_2, ℓ' < 0): one step of lr = 1 from 0 gives W_1 = −D."""
    traj = run_gd_batch([_DETERMINED_2D, _gap(_K_ACCEPTED)], 1, 1.0, fast_path=fast_path, record_at=[1])
    D = np.array([[1.0, 0.0], [-1.0, 0.0]]) / math.sqrt(2.0)
    np.testing.assert_allclose(-traj.W[1], D, rtol=0, atol=ATOL_STEP)


#: v·2^40 and z·2^40 (moderate data: no rescaling by the engine) multiply a, ∇L and VE by 2^80 alike
#: (correlation loss: ℓ' = −1 at any margin), so the verdict is that of scale 1: refused. The cheap
#: bound's constant 4·d·eps·max m·max||x|| ||z|| is then ≈ 2^31 > 1 (its log > 0).
_BIG = 2.0**40


def test_values_rounding_refusal_is_scale_equivariant_in_the_log_path() -> None:
    """Oracle: scale equivariance by exact powers of two (the ratio is that of scale 1: 0.71, refused)
    and run_gd, which refuses too."""
    bad = _gap(_K_REFUSED, _BIG)
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(bad, 1, 0.1, loss="correlation")
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_DETERMINED_2D, bad], 1, 0.1, loss="correlation", fast_path=False)
    assert str(exc.value) == f"normalized GD at step 0: instance 1: {CANCELLED_MESSAGE}"


#: A mixed batch: instances 0 and 1 moderate (fast path), instance 2 saturated — W_0 = diag(640, 0)
#: gives logits (640, 0), weights ~e^−640 ≈ 1e-278·h < 1e-280, below the fast path's range, so only it
#: takes the log-domain path. ∇L and VE both scale with s_1 s_2, so the ratio is that of W = 0 (0.71):
#: refused. Instance 0 has values 2^−30 times smaller (its own VE is 2^30 smaller).
_SMALL = A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[2.0**-30, 2.0**-29], z=[[1.0, 0.0]])


def test_values_rounding_refusal_of_a_saturated_instance_in_a_mixed_batch() -> None:
    """Oracle: the ratio is invariant under W (both ∇L and VE ∝ s_1 s_2: 0.71, refused), and run_gd at
    the same W_0, which refuses too."""
    bad = _gap(_K_REFUSED)
    W_sat = np.diag([640.0, 0.0])
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(bad, 1, 0.1, W0=W_sat)
    W0 = np.stack([np.zeros((2, 2)), np.zeros((2, 2)), W_sat])
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_SMALL, _DETERMINED_2D, bad], 1, 0.1, W0=W0)
    assert str(exc.value) == f"normalized GD at step 0: instance 2: {CANCELLED_MESSAGE}"


#: Tied scores without duplicate tokens (the log-domain path's general form): v = (1, 1),
#: x_1 = e_1, x_2 = e_2 (a = 1, 1: tied, different tokens), x_3 = (2, −1 + eps) (a_3 = 1 + eps exactly),
#: z = (1, 1), W_0 = −30·I: logits (−30, −30, −30 − 30·eps), all negative, s ≈ ⅓ each. By hand,
#: γ − f = (−h/3, −h/3, 2h/3)·(1 + O(eps)) (h = eps), ∇L = ℓ'·(h/9)·(−x_1 − x_2 + 2x_3) zᵀ = ℓ'·(h/9)·(3, −3)zᵀ,
#: ||∇L|| = (2/3)·h·|ℓ'|, and VE = d·eps·|ℓ'|·Σ_{t≠u} s_t s_u (m_t + m_u)||x_t|| ||z|| with m = (1, 1, 3),
#: ||x|| = (1, 1, √5): VE = 2·eps·|ℓ'|·(12 + 8√5)·√2/9 ≈ 9.4·eps·|ℓ'|, so
#: ||∇L|| / (CANCELLATION_FACTOR·VE) ≈ 0.67/75 ≈ 0.009: refused.
_TIES = A.Instance(X=[[[1.0, 0.0], [0.0, 1.0], [2.0, -1.0 + EPS]]], Y=[1.0], v=[1.0, 1.0], z=[[1.0, 1.0]])


def test_values_rounding_refusal_with_tied_scores_and_negative_logits() -> None:
    """Oracle: the hand-computed ratio ≈ 0.009 above (refused), and run_gd, which refuses too."""
    W0 = -30.0 * np.eye(2)
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(_TIES, 1, 0.1, W0=W0)
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_TIES], 1, 0.1, W0=W0, fast_path=False)
    assert str(exc.value) == f"normalized GD at step 0: instance 0: {CANCELLED_MESSAGE}"


# ---------------------------------------------------------------- range errors and messages
def test_logits_that_overflow_at_a_record_name_the_step_and_the_iterate() -> None:
    """Oracle: by hand, W_0 = 1e308 everywhere and z = (1, 1) give W_0 z = (2e308, 2e308) = inf in
    float64, so the logits are out of range (|l| ≤ d²·max|W| = 4e308 > FLOAT_MAX); the contract's
    error names the step and the iterate W_0 (plain GD, correlation loss: no other refusal applies)."""
    inst = A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[1.0, 2.0], z=[[1.0, 1.0]])
    with pytest.raises(NumericalError) as exc:
        run_gd_batch(
            [inst], 1, 0.1, normalized=False, loss="correlation", W0=np.full((2, 2), 1e308), record_at=[0]
        )
    msg = str(exc.value)
    assert msg.startswith("step 0: instance 0: the logits x_itᵀ W_0 z_i ")
    assert "it overflows float64's normal range" in msg


def _saturation_instance(v: float) -> A.Instance:
    return A.Instance(X=[[[1.0], [0.0]]], Y=[1.0], v=[v], z=[[1.0]])


@pytest.mark.parametrize("fast_path", [True, False])
def test_saturated_at_marks_a_gradient_strictly_below_the_smallest_normal(fast_path: bool) -> None:
    """Oracle: by hand (d = 1, x = (1, 0), z = 1, correlation loss ℓ' = −1, W = 0, s = ½):
    ∇L = −Σ_t ½(a_t − f)·x_t·z = −¼·v·(x_1 − x_2)²·z, so ||∇L|| = v/4 exactly. For v = 2^−1020 it is
    2^−1022, the smallest normal double itself (not below it: saturated_at = −1); for
    v = 2^−1020·(1 − 2^−40) it is below (the step is the first one, saturated_at = 1)."""
    tiny = float(np.finfo(np.float64).tiny)
    assert 2.0**-1020 / 4 == tiny
    at = run_gd_batch(
        [_saturation_instance(2.0**-1020), _saturation_instance(2.0**-1020 * (1.0 - 2.0**-40))],
        1,
        2.0**60,  # W_1 = −lr·∇L ≈ 2^−962: a normal iterate
        normalized=False,
        loss="correlation",
        fast_path=fast_path,
    ).saturated_at
    np.testing.assert_array_equal(at, [-1, 1])


def _double_exponential() -> A.Loss:
    """ℓ(u) = exp(e^{−u}): decreasing, log(−ℓ'(u)) = −u + e^{−u} overflows for u < −709.78."""
    import torch

    def xp(u: object) -> Any:
        return torch if isinstance(u, torch.Tensor) else np

    return A.Loss(
        name="double-exponential",
        value_fn=lambda u: xp(u).exp(xp(u).exp(-u)),
        derivative_fn=lambda u: -xp(u).exp(-u) * xp(u).exp(xp(u).exp(-u)),
        assumptions=A.LossAssumptions(
            strictly_decreasing=True,
            derivative_bounded=False,
            derivative_lipschitz_on_bounded_sets=True,
            bounded_below=True,
        ),
        log_neg_derivative_fn=lambda u: -u + xp(u).exp(-u),
    )


def test_a_custom_loss_whose_derivative_overflows_gets_the_documented_message() -> None:
    """Oracle: by hand, d = 1, tokens 1 and 3, v = −360, at W = 0: f = ½(−360 − 1080) = −720, and
    log(−ℓ'(−720)) = 720 + e^{720} is not a double (e^{720} > FLOAT_MAX): the gradient is not finite.
    The single form's message (oracle: normalized_risk_grad's own refusal of the instance), after the
    step and the instance, for both updates: the cause is named, never a zero or cancelled gradient."""
    inst = A.Instance(X=[[[1.0], [3.0]]], Y=[1.0], v=[-360.0], z=[[1.0]])
    assert 720.0 > math.log(float(np.finfo(np.float64).max))
    with pytest.raises(NumericalError) as single:
        A.normalized_risk_grad(inst, np.zeros((1, 1)), loss=_double_exponential())
    assert "u = Y_0 f_0 = -720" in str(single.value)
    for normalized in (False, True):
        kind = "normalized" if normalized else "plain"
        with pytest.raises(NumericalError) as exc:
            run_gd_batch([inst], 1, 0.1, normalized=normalized, loss=_double_exponential(), record_at=[0])
        assert str(exc.value) == f"{kind} GD at step 0: instance 0: {single.value}"


def test_a_risk_below_the_normal_range_is_refused_like_run_gd_not_recorded_as_zero() -> None:
    """Oracle: the risk in closed form. One sequence, tokens e₁, e₂, z = e₁, values ±a with
    a = 0.04·2^52, W₀ = [[2, 0], [2, 0]]: the logits tie (f = 0, risk 1); the gradient there is
    −(a/2)(e₁ − e₂)e₁ᵀ, so one normalized step of 0.1 moves W by 0.1(e₁ − e₂)e₁ᵀ/√2 and splits the
    logits by δ = 0.1·√2: f₁ = a·tanh(δ/2) ≈ 1.27e13 and the exponential risk e^−f₁ ≈ 10^−5.5e12 is far
    below the normal range. The batched engine's exp rounds it to 0; it must refuse naming the
    underflow and its size, as run_gd does, instead of recording a risk of 0."""
    a = 0.04 * 2**52
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([a, -a]), np.array([[1.0, 0.0]])
    )
    W0 = np.array([[2.0, 0.0], [2.0, 0.0]])
    log10_risk = -a * math.tanh(0.1 * math.sqrt(2.0) / 2) / math.log(10.0)
    for run in (
        lambda: run_gd(inst, 1, 0.1, loss="exponential", W0=W0),
        lambda: run_gd_batch([inst], 1, 0.1, loss="exponential", W0=W0),
    ):
        with pytest.raises(NumericalError, match=r"the risk L\(W\) is about 1e-\d+: it underflows") as ei:
            run()
        exponent = float(re.search(r"about 1e(-\d+)", str(ei.value)).group(1))  # type: ignore[union-attr]
        assert abs(exponent - log10_risk) <= 1.0, (exponent, log10_risk)
    with pytest.raises(NumericalError, match=r"^step 1: instance 0: the risk"):
        run_gd_batch([inst], 1, 0.1, loss="exponential", W0=W0)


#: ||W||_F to its rounding: d² squares summed (each rounded once, the sum's rounding ≤ (d² − 1)·eps relative in
#: any order) and a square root (½·eps): (d² + 1)·eps relative bounds both record paths.
def _norm_tol(d: int) -> float:
    return (d * d + 1) * EPS


@pytest.mark.parametrize("exponent", [0, 399, -399, 401, -401, 1000, -1000])
def test_recorded_norms_match_the_exact_norm_on_both_sides_of_the_direct_range(exponent: int) -> None:
    """Oracle: ``||W0||_F`` in 60-digit mpmath from the exact entries. The record at step 0 reports ``||W0_b||``:
    torch's plain norm where every ``max|W0_b|`` lies within 2^±400, a norm scaled by powers of two elsewhere
    (where the squares would overflow or vanish); both within (d² + 1)·eps of the exact value, at
    ``W0 = 2^exponent·U`` with each matrix's largest entry on both sides of 2^±400. The keys are scaled by
    ``2^−exponent`` and ``v`` by ``2^exponent`` (exactly), so that logits and values are those of ``U``."""
    import mpmath

    insts = []
    for s in range(3):
        inst = A.random_instance(2, 3, 3, seed=80 + s)
        X, v = np.ldexp(inst.X, -exponent), np.ldexp(inst.v, exponent)
        insts.append(A.Instance(X, inst.Y, v, inst.z))
    U = np.random.default_rng(4).standard_normal((3, 3, 3))
    U[:, 0, 0] = 1.5  # the largest entry: 2^exponent·1.5 has frexp exponent exponent + 1
    U = np.clip(U, -1.4, 1.4)
    U[:, 0, 0] = 1.5
    W0 = np.ldexp(U, exponent)
    tr = run_gd_batch(insts, 1, math.ldexp(0.1, exponent), W0=W0, record_at=[0])  # a step of W0's scale
    with mpmath.workdps(60):
        exact = [float(mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(w)) ** 2 for w in W.ravel()))) for W in W0]
    np.testing.assert_allclose(tr.norms[0], exact, rtol=_norm_tol(3), atol=0)


def test_a_start_whose_largest_entry_is_subnormal_is_refused_by_its_index() -> None:
    """The contract's range error for ``W0[b]`` alone: matrix 1's largest entry is 2^−1060 (subnormal: its entries
    carry a few bits) beside a normal matrix 0; oracle: run_gd's refusal of that start, by name and index."""
    insts = [A.random_instance(2, 3, 3, seed=90 + s) for s in range(2)]
    W0 = np.stack([np.eye(3), np.ldexp(np.eye(3), -1060)])
    with pytest.raises(NumericalError, match=r"W0\[1\]"):
        run_gd_batch(insts, 1, 0.1, W0=W0)
    with pytest.raises(NumericalError, match="W0"):
        run_gd(insts[1], 1, 0.1, W0=W0[1])


def test_a_recorded_norm_beyond_the_range_is_refused() -> None:
    """``W0 = 2^1022·U`` with nine entries ±1.4: every entry a double (max 1.4·2^1022), ``||W0||_F = 4.2·2^1022``
    is not (> 2^1024); keys ``X·2^−1022`` and ``v·2^1022`` keep the logits and values those of ``U``. The record
    at step 0 refuses the norm with the contract's error (oracle: the exact norm, 4.2·2^1022 > FLOAT_MAX)."""
    e = 1022
    insts = []
    for s in range(2):
        inst = A.random_instance(2, 3, 3, seed=95 + s)
        v = np.clip(inst.v, -1.9, 1.9)  # v·2^1022 stays a double
        insts.append(A.Instance(np.ldexp(inst.X, -e), inst.Y, np.ldexp(v, e), inst.z))
    U = 1.4 * np.where(np.arange(9).reshape(3, 3) % 2 == 0, 1.0, -1.0)
    W0 = np.ldexp(np.stack([U, U]), e)
    assert 3 * 1.4 * 2.0**e > np.finfo(np.float64).max and np.all(np.isfinite(W0))
    with pytest.raises(NumericalError, match="Frobenius norm"):
        run_gd_batch(insts, 1, math.ldexp(0.1, e), W0=W0, record_at=[0])
