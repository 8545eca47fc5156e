"""GD engines: textbook agreement, batched = single, long runs, convergence in direction, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, InvalidInstanceError, NumericalError
from attnsvm.gd import (
    BatchEngine,
    GDRecord,
    direction_corr,
    direction_gap,
    fit_rate,
    regularization_path,
    run_gd,
    run_gd_batch,
    run_gd_kq,
)
from attnsvm.gd._single import _settled
from attnsvm.svm import is_locally_optimal, local_optimality_report, solve_svm

LOSSES = ("logistic", "exponential", "correlation")

#: Step-for-step agreement of two float64 implementations of the same update: each step adds a
#: unit matrix computed two ways that differ by a few ulps (~1e-15 relative); over <= 300 steps
#: at moderate ||W|| the accumulated relative difference stays below ~1e-12, and the issue's
#: contract is 1e-8. RTOL_ENGINES is that contract.
RTOL_ENGINES = 1e-8
#: Textbook update vs the engine: 40 steps, per-step difference a few ulps of ||W|| (<= 4).
RTOL_TEXTBOOK = 1e-12

#: Convergence rate of 1 − corr(W_t, W_mm(α_final)) for normalized GD, lr 0.1, W0 = 0 or a
#: random start of Frobenius norm ~3, on 4×6×8 "gaussian" and "self_attention" instances.
#: Measured (this harness, seeds 0–11): gap·t² at t = 10³, 10⁴, 10⁵ lies in [31.6, 617],
#: [31.6, 461], [31.6, 449] (W0 = 0, gaussian) — i.e. gap ≈ C/t², the 1/||W||² rate, with
#: C = 31.6…617 (the issue's 3e-5..4e-5 at 10³ are the instances with C ≈ 35: seeds 0, 2, 6, 7);
#: at t = 2000 from W0 = 0 or random starts (gaussian, self_attention) gap·t² ∈ [28.5, 830],
#: with one outlier at 7.25e3 (self_attention seed 10, random start: tokens settled late).
#: Held-out seeds 20–31 (W0 = 0, gaussian, t = 2000): gap·t² ∈ [30.9, 148].
#: The bound below is 2.4× the largest non-outlier value; the tests use W0 = 0 gaussian seeds.
RATE_CONSTANT = 2000.0


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ------------------------------------------------------------------ direction measures
def test_direction_corr_and_gap_basics() -> None:
    rng = np.random.default_rng(0)
    W = rng.standard_normal((5, 5))
    assert direction_corr(W, 3.0 * W) == pytest.approx(1.0, abs=4e-16)
    assert direction_corr(W, -W) == pytest.approx(-1.0, abs=4e-16)
    assert direction_gap(W, 7.0 * W) < 1e-30 + 4 * np.finfo(float).eps ** 2 * 25
    V = rng.standard_normal((5, 5))
    # gap = 1 − corr (exact identity for unit matrices); both O(1) here, so 1 − corr is accurate
    assert direction_gap(W, V) == pytest.approx(1.0 - direction_corr(W, V), rel=1e-13)


def test_direction_gap_accurate_for_tiny_gaps() -> None:
    # W2 = W1 + ε E with E ⟂ W1 (unit): the exact gap is 1 − 1/sqrt(1 + ε²) ≈ ε²/2
    rng = np.random.default_rng(1)
    W1 = rng.standard_normal((6, 6))
    W1 /= np.linalg.norm(W1)
    E = rng.standard_normal((6, 6))
    E -= np.sum(E * W1) * W1
    E /= np.linalg.norm(E)
    for eps in (1e-4, 1e-6, 1e-7):
        exact = 1.0 - 1.0 / math.sqrt(1.0 + eps * eps)
        exact = eps * eps / 2 - 3 * eps**4 / 8  # series, exact to O(ε⁶) (cancellation-free)
        # relative accuracy ~ ulp(1)/||Ŵ1 − Ŵ2|| = 2.2e-16/ε; 1e-8 covers ε = 1e-7 with margin
        assert direction_gap(W1 + eps * E, W1) == pytest.approx(exact, rel=1e-8)
    # huge entries do not overflow the norms
    assert direction_corr(1e200 * W1, 1e-200 * W1) == pytest.approx(1.0, abs=4e-16)


def test_direction_measures_bad_input() -> None:
    W = np.eye(3)
    with pytest.raises(AttnSVMError, match="zero matrix"):
        direction_corr(W, np.zeros((3, 3)))
    with pytest.raises(AttnSVMError, match="same shape"):
        direction_gap(W, np.eye(4))
    with pytest.raises(AttnSVMError, match="finite"):
        direction_corr(W, np.full((3, 3), np.nan))


def test_fit_rate_recovers_power_law_and_rejects_bad_input() -> None:
    x = np.array([1e3, 1e4, 1e5, 1e6])
    fit = fit_rate(x, 35.0 / x**2)
    assert fit.slope == pytest.approx(-2.0, rel=1e-12)
    assert fit.intercept == pytest.approx(math.log10(35.0), rel=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    noisy = fit_rate(x, 35.0 / x**2 * np.array([1.0, 3.0, 0.5, 2.0]))
    assert noisy.r2 < 1.0
    with pytest.raises(AttnSVMError, match="positive"):
        fit_rate(x, np.array([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(AttnSVMError, match="at least 3"):
        fit_rate([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(AttnSVMError, match="same length"):
        fit_rate([1.0, 2.0, 3.0], [1.0, 2.0])


# --------------------------------------------------------------------- single engine
def test_normalized_gd_equals_textbook_update_step_for_step() -> None:
    inst = A.random_instance(4, 6, 8, seed=3)
    steps, lr = 40, 0.1
    tr = run_gd(inst, steps, lr, record_at=1, keep_iterates=True)
    W = np.zeros((inst.d, inst.d))
    for t in range(1, steps + 1):
        g = A.risk_grad(inst, W)
        W = W - lr * g / np.linalg.norm(g)  # textbook normalized GD
        Wt = tr.record[t - 1].W
        assert tr.record[t - 1].step == t
        assert Wt is not None
        assert _rel(Wt, W) < RTOL_TEXTBOOK
    assert tr.steps_run == steps and tr.stop_reason == "steps" and not tr.saturated


@pytest.mark.parametrize("loss", LOSSES)
def test_plain_gd_equals_textbook_update(loss: str) -> None:
    inst = A.random_instance(3, 4, 5, seed=4)
    W0 = np.random.default_rng(2).standard_normal((5, 5)) * 0.3
    W = W0.copy()
    for _ in range(25):
        W = W - 0.05 * A.risk_grad(inst, W, loss=loss)
    tr = run_gd(inst, 25, 0.05, normalized=False, loss=loss, W0=W0)
    assert _rel(tr.W, W) < RTOL_TEXTBOOK


def test_record_contents() -> None:
    inst = A.random_instance(4, 6, 8, seed=0)
    ref = solve_svm(inst).W
    tr = run_gd(inst, 200, 0.1, record_at=[0, 10, 50], reference=ref, keep_iterates=True)
    assert tr.steps.tolist() == [0, 10, 50, 200]
    r = tr.record[2]
    assert r.W is not None
    assert r.norm == pytest.approx(np.linalg.norm(r.W), rel=1e-15)
    assert r.risk == pytest.approx(A.risk(inst, r.W), rel=1e-14)
    np.testing.assert_array_equal(r.tokens, np.argmax(A.attention(inst, r.W), axis=1))
    assert r.corr == pytest.approx(direction_corr(r.W, ref), abs=1e-15)
    assert r.gap == pytest.approx(direction_gap(r.W, ref), rel=1e-12)
    assert r.log10_grad_norm == pytest.approx(math.log10(np.linalg.norm(A.risk_grad(inst, r.W))), rel=1e-12)
    # at W0 = 0 the direction is undefined: documented NaN, not a silent number
    assert math.isnan(tr.record[0].corr)
    assert tr.corrs.shape == (4,) and tr.tokens.shape == (4, inst.n)


def test_long_normalized_run_stays_finite_and_converges_in_direction() -> None:
    """2·10⁴ steps: the gradient underflows (log10||∇L|| in the −thousands) yet the direction keeps improving."""
    inst = A.random_instance(4, 6, 8, seed=0)
    ref = solve_svm(inst).W
    steps = 20_000
    tr = run_gd(inst, steps, 0.1, record_at=[2_000, 10_000], reference=ref)
    assert np.all(np.isfinite(tr.W))
    assert tr.norms[-1] > 1_900  # ||W_t|| ≈ η t: the normalized steps align
    assert tr.log10_grad_norms[-1] < -1_000  # far below the smallest double (1e-308)
    assert np.all(np.diff(tr.gaps) < 0)
    assert tr.gaps[-1] <= RATE_CONSTANT / steps**2


def test_plain_gd_reports_underflow_instead_of_stalling_silently() -> None:
    inst = A.random_instance(4, 6, 8, seed=0)
    Wmm = solve_svm(inst).W
    W0 = 1000.0 * Wmm / np.linalg.norm(Wmm)  # gradient ~ e^{−hundreds}: underflows to 0
    W0_before = W0.copy()
    tr = run_gd(inst, 10, 0.1, normalized=False, W0=W0)
    assert tr.saturated and tr.stop_reason == "gradient underflow"
    assert tr.steps_run == 0 and tr.record[-1].step == 0
    np.testing.assert_array_equal(W0, W0_before)  # inputs are never modified
    # the exact log-norm still says how small it is
    assert tr.record[-1].log10_grad_norm < -308
    # moderate norm: the gradient is representable but lr·g no longer changes W
    tr2 = run_gd(inst, 10, 0.1, normalized=False, W0=30.0 * Wmm / np.linalg.norm(Wmm))
    assert tr2.saturated and tr2.stop_reason == "stalled"
    # normalized GD from the same start keeps moving
    tr3 = run_gd(inst, 10, 0.1, W0=W0)
    assert not tr3.saturated and tr3.norms[-1] > 1000.5


def test_early_stop_when_tokens_and_direction_settle() -> None:
    inst = A.random_instance(4, 6, 8, seed=0)
    tol = 1e-8
    tr = run_gd(inst, 100_000, 0.1, record_at=200, early_stop=tol, keep_iterates=True)
    assert tr.stop_reason == "settled" and tr.steps_run < 100_000
    r0, r1, r2 = tr.record[-3:]
    assert r0.W is not None and r1.W is not None and r2.W is not None
    assert np.array_equal(r0.tokens, r2.tokens) and np.array_equal(r1.tokens, r2.tokens)
    assert direction_gap(r0.W, r1.W) <= tol and direction_gap(r1.W, r2.W) <= tol
    # one record earlier the criterion did not hold (it stopped at the first chance)
    rp = tr.record[-4]
    assert rp.W is not None
    assert direction_gap(rp.W, r0.W) > tol or not np.array_equal(rp.tokens, r0.tokens)


# -------------------------------------------- convergence to W_mm(α_final), local optimality
@pytest.mark.parametrize("seed", range(20, 26))
def test_final_direction_correlates_with_wmm_of_final_tokens(seed: int) -> None:
    """Held-out seeds (the calibration used 0–11): measured gap·t² at t = 2000 is 75.1, 74.9,
    135, 71.8, 42.4, 51.5 for seeds 20–25; seed 21 settles on α_final ≠ opt from W0 = 0."""
    inst = A.random_instance(4, 6, 8, seed=seed)
    steps = 2000
    tr = run_gd(inst, steps, 0.1, record_at=[1000, 1500])
    alpha = tr.final_tokens
    # precondition of the rate: the selected tokens have settled
    assert all(np.array_equal(r.tokens, alpha) for r in tr.record)
    sol = solve_svm(inst, alpha)
    assert direction_gap(tr.W, sol.W) <= RATE_CONSTANT / steps**2
    # empirical conjecture of the peer papers (arXiv 2308.16898): α_final is locally optimal.
    # No counterexample found (36 gaussian / unit / self_attention instances × 2 starts).
    assert is_locally_optimal(inst, alpha), local_optimality_report(inst, alpha).reason


def test_random_start_can_select_a_locally_optimal_non_global_alpha() -> None:
    """Named finding: from a random start (gaussian seed 0, W0 of norm 3) GD settles on
    α = [1, 2, 3, 2] ≠ opt = [1, 2, 3, 0], which is locally optimal (not a counterexample)."""
    inst = A.random_instance(4, 6, 8, seed=0)
    W0 = np.random.default_rng(1000).standard_normal((8, 8)) * 3.0 / 8
    steps = 2000
    tr = run_gd(inst, steps, 0.1, W0=W0, record_at=[1000, 1500])
    alpha = tr.final_tokens
    assert all(np.array_equal(r.tokens, alpha) for r in tr.record)
    assert not np.array_equal(alpha, inst.optimal_tokens())
    assert is_locally_optimal(inst, alpha)
    assert direction_gap(tr.W, solve_svm(inst, alpha).W) <= RATE_CONSTANT / steps**2


# ---------------------------------------------------------------------- batched engine
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("loss", LOSSES)
def test_batched_equals_single_runs(normalized: bool, loss: str) -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(4)]
    steps, lr = 150, 0.1 if normalized else 0.5
    refs = np.stack([np.eye(8)] * 4)
    bt = run_gd_batch(insts, steps, lr, normalized=normalized, loss=loss, record_at=50, reference=refs)
    assert bt.W.shape == (4, 8, 8)
    for b, inst in enumerate(insts):
        tr = run_gd(inst, steps, lr, normalized=normalized, loss=loss, record_at=50, reference=refs[b])
        assert _rel(bt.W[b], tr.W) < RTOL_ENGINES
        np.testing.assert_allclose(bt.norms[:, b], tr.norms, rtol=RTOL_ENGINES)
        np.testing.assert_allclose(bt.risks[:, b], tr.risks, rtol=RTOL_ENGINES)
        np.testing.assert_allclose(bt.log10_grad_norms[:, b], tr.log10_grad_norms, rtol=RTOL_ENGINES)
        np.testing.assert_allclose(bt.corrs[:, b], tr.corrs, rtol=RTOL_ENGINES)  # type: ignore[index]
        np.testing.assert_array_equal(bt.tokens[:, b], tr.tokens)
    assert np.all(bt.saturated_at == -1)


def test_batched_equals_single_after_gradient_underflow() -> None:
    """From ||W0|| = 400 the gradient is ~1e-100s or below: both log-domain directions agree."""
    insts = [A.random_instance(4, 6, 8, seed=s, family="self_attention") for s in range(3)]
    W0 = np.stack([400 * solve_svm(i).W / np.linalg.norm(solve_svm(i).W) for i in insts])
    bt = run_gd_batch(insts, 100, 0.1, W0=W0)
    assert np.all(bt.log10_grad_norms[-1] < -100)
    for b, inst in enumerate(insts):
        tr = run_gd(inst, 100, 0.1, W0=W0[b])
        assert _rel(bt.W[b], tr.W) < RTOL_ENGINES
        # the direction moved, not just the norm: compare the update, relative to its size
        step_b, step_s = bt.W[b] - W0[b], tr.W - W0[b]
        assert _rel(step_b, step_s) < RTOL_ENGINES
        np.testing.assert_allclose(bt.log10_grad_norms[:, b], tr.log10_grad_norms, rtol=RTOL_ENGINES)


#: Fast (linear-domain) vs log-domain batched direction at the same W: the same quantities,
#: each formed with a few tens of roundings from O(1) factors, so they agree to ~1e-14 (measured
#: ≤ 7e-14 over ||W|| = 0…1000, three losses); the brief's contract for the switch is 1e-12.
RTOL_FAST_PATH = 1e-12


@pytest.mark.parametrize("loss", LOSSES)
def test_batched_fast_path_equals_log_domain_path_and_switches_per_instance(loss: str) -> None:
    """The fast path is used while the weights are representable, the log-domain path after: same
    direction and log-norm to 1e-12 at every ||W||, including batches where only some instances
    have underflowing weights (the switch is per instance and per step). White-box in one respect: the
    engine's streak heuristic (``_log_streak``, LOG_FRACTION) is reset before each call, so that the
    per-call, per-instance choice is what is compared. The eager paths (kernel="eager"): the fused kernel
    computes the log-domain form everywhere (tests/test_fused_kernel.py)."""
    insts = [A.random_instance(4, 6, 8, seed=s, family=f) for s in range(4) for f in ("gaussian", "unit")]
    fast = BatchEngine.from_instances(insts, loss=loss, kernel="eager")
    slow = BatchEngine.from_instances(insts, loss=loss, path="log", kernel="eager")
    dirs = np.stack([solve_svm(i).W for i in insts])
    dirs /= np.linalg.norm(dirs, axis=(1, 2), keepdims=True)
    rng = np.random.default_rng(0)
    for scale in (0.0, 1.0, 10.0, 100.0, 200.0, 300.0, 400.0, 700.0, 1000.0, 1e5):
        # mixed norms: half the batch at `scale`, half at scale/4 (some saturated, some not)
        s = np.where(np.arange(len(insts)) % 2 == 0, scale, scale / 4).reshape(-1, 1, 1)
        W = torch.as_tensor(s * (dirs + 0.3 * rng.standard_normal(dirs.shape) / 8))
        fast._log_streak = 0  # compare the per-step choice, not the streak heuristic
        Df, lf = fast.direction(W)
        Ds, ls = slow.direction(W)
        assert slow.log_path.all()
        assert float(torch.linalg.matrix_norm(Df - Ds).max()) <= RTOL_FAST_PATH  # unit matrices
        assert float(((lf - ls).abs() / ls.abs().clamp_min(1.0)).max()) <= RTOL_FAST_PATH
    # all three regimes were exercised: whole batch fast, mixed (log-domain subset), all log-domain
    assert fast.stats["fast"] > 0 and fast.stats["mixed"] > 0 and fast.stats["log"] > 0
    assert slow.stats["fast"] == 0 and slow.stats["mixed"] == 0


@pytest.mark.parametrize("loss", LOSSES)
def test_batched_paths_handle_exactly_duplicated_selected_tokens(loss: str) -> None:
    """Token 0 is copied into tokens 1 (and 2) of every sequence, so two or three maximisers tie
    exactly at every W (every token ties at W = 0), and W is pushed towards them until every other
    weight underflows. Both batched paths must still give the single-instance direction
    (``normalized_risk_grad_of``, an O(T²) form with no special token) to RTOL_FAST_PATH.
    Regressions: a mean over three tied scores is not exact (``fl(fl(3γ)/3) ≠ γ``) and its ±1 ulp
    swamped the saturated weights (direction error 0.6); the log-domain path took the selected
    token's twin as runner-up, whose weight is 0, and returned a zero gradient. White-box in one
    respect: the streak heuristic (``_log_streak``) is reset before each call (per-call choice)."""
    from attnsvm.model._grad import normalized_risk_grad_of
    from attnsvm.model._losses import get_loss

    insts = []
    for s in range(6):
        inst = A.random_instance(4, 6, 8, seed=s)
        X = inst.X.copy()
        X[:, 1 : 1 + s % 3] = X[:, :1]  # 0, 1 or 2 copies of token 0
        insts.append(A.Instance(X=X, Y=inst.Y, z=inst.z, v=inst.v))
    lo = get_loss(loss)
    engines = [BatchEngine.from_instances(insts, loss=lo, path=p) for p in ("auto", "log")]
    # unit-size data: the engine's data and iterates are the user's
    assert not any(eng.scale_exponents.any() for eng in engines)
    base = np.stack([np.einsum("id,ie->de", i.X[:, 0], i.z) for i in insts])
    base /= np.linalg.norm(base, axis=(1, 2), keepdims=True)
    for scale in (0.0, 1.0, 10.0, 100.0, 300.0, 1000.0, 3000.0):
        W = scale * base
        refs = [normalized_risk_grad_of(i.X, i.Y, i.z, i.v, W[b], lo) for b, i in enumerate(insts)]
        for eng in engines:
            eng._log_streak = 0
            D, ln = eng.direction(torch.as_tensor(W))
            for b, ref in enumerate(refs):
                assert np.linalg.norm(D[b].numpy() - ref.direction) <= RTOL_FAST_PATH, (scale, b, eng.path)
                assert abs(float(ln[b]) - ref.log_norm) <= RTOL_FAST_PATH * max(1.0, abs(ref.log_norm))


def test_batched_mixed_saturation_equals_single_runs() -> None:
    """One batch, some instances from W0 = 0 (fast path) and some from ||W0|| = 400 (gradient
    ~1e-100s: log-domain path): each equals its single run."""
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(4)]
    W0 = np.zeros((4, 8, 8))
    for b in (1, 3):
        Wmm = solve_svm(insts[b]).W
        W0[b] = 400 * Wmm / np.linalg.norm(Wmm)
    bt = run_gd_batch(insts, 100, 0.1, W0=W0)
    assert np.all(bt.log10_grad_norms[-1, [1, 3]] < -100) and np.all(bt.log10_grad_norms[-1, [0, 2]] > -50)
    for b, inst in enumerate(insts):
        tr = run_gd(inst, 100, 0.1, W0=W0[b])
        assert _rel(bt.W[b] - W0[b], tr.W - W0[b]) < RTOL_ENGINES
        np.testing.assert_allclose(bt.log10_grad_norms[:, b], tr.log10_grad_norms, rtol=RTOL_ENGINES)


def test_batched_plain_gd_reports_saturation() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    W = solve_svm(insts[1]).W
    W0 = np.stack([np.zeros((8, 8)), 1000 * W / np.linalg.norm(W)])  # instance 1: gradient ~1e-400
    bt = run_gd_batch(insts, 5, 0.1, normalized=False, W0=W0)
    assert bt.saturated_at.tolist() == [-1, 1]


def test_batched_bad_input() -> None:
    a = A.random_instance(4, 6, 8, seed=0)
    b = A.random_instance(4, 5, 8, seed=1)
    with pytest.raises(AttnSVMError, match="share one shape"):
        run_gd_batch([a, b], 10, 0.1)
    with pytest.raises(AttnSVMError, match="empty"):
        run_gd_batch([], 10, 0.1)
    with pytest.raises(AttnSVMError, match="sequence"):
        run_gd_batch(a, 10, 0.1)  # type: ignore[arg-type]
    with pytest.raises(AttnSVMError, match="lr"):
        run_gd_batch([a], 10, 0.0)
    with pytest.raises(AttnSVMError, match="steps"):
        run_gd_batch([a], 0, 0.1)
    with pytest.raises(AttnSVMError, match="not supported|not a torch device"):
        run_gd_batch([a], 10, 0.1, device="tpu")
    with pytest.raises(AttnSVMError, match="shape"):
        run_gd_batch([a, a], 10, 0.1, W0=np.zeros((3, 8, 8)))
    if not torch.cuda.is_available():
        with pytest.raises(AttnSVMError, match="CUDA is not available"):
            run_gd_batch([a], 10, 0.1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batched_cuda_equals_cpu() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(8)]
    cpu = run_gd_batch(insts, 300, 0.1)
    gpu = run_gd_batch(insts, 300, 0.1, device="cuda")
    assert gpu.device.startswith("cuda")
    assert _rel(gpu.W, cpu.W) < RTOL_ENGINES


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("lr", [0.0, -0.1, math.nan, math.inf, "fast", True])
def test_bad_lr(lr: object) -> None:
    inst = A.random_instance(2, 3, 3, seed=0)
    with pytest.raises(AttnSVMError, match="lr"):
        run_gd(inst, 10, lr)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [0, -3, 2.5, True, "10"])
def test_bad_steps(steps: object) -> None:
    inst = A.random_instance(2, 3, 3, seed=0)
    with pytest.raises(AttnSVMError, match="steps"):
        run_gd(inst, steps, 0.1)  # type: ignore[arg-type]


def test_bad_W0_reference_record_and_early_stop() -> None:
    inst = A.random_instance(2, 3, 3, seed=0)
    with pytest.raises(InvalidInstanceError, match="W0 must have shape"):
        run_gd(inst, 10, 0.1, W0=np.zeros((2, 2)))
    with pytest.raises(InvalidInstanceError, match="W0 must be finite"):
        run_gd(inst, 10, 0.1, W0=np.full((3, 3), np.inf))
    with pytest.raises(InvalidInstanceError, match="zero matrix"):
        run_gd(inst, 10, 0.1, reference=np.zeros((3, 3)))
    with pytest.raises(AttnSVMError, match="record_at"):
        run_gd(inst, 10, 0.1, record_at=[3, 11])
    with pytest.raises(AttnSVMError, match="record_at"):
        run_gd(inst, 10, 0.1, record_at=0)
    with pytest.raises(AttnSVMError, match="early_stop"):
        run_gd(inst, 10, 0.1, early_stop=-1.0)
    with pytest.raises(AttnSVMError, match="unknown loss"):
        run_gd(inst, 10, 0.1, loss="hinge")
    with pytest.raises(AttnSVMError, match="early_stop"):
        run_gd(inst, 10, 0.1, early_stop="soon")  # type: ignore[arg-type]
    with pytest.raises(InvalidInstanceError, match="attnsvm.Instance"):
        run_gd(inst.X, 10, 0.1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInstanceError, match="attnsvm.Instance"):
        run_gd_kq(None, 10, 0.1)  # type: ignore[arg-type]


def test_inputs_are_not_modified() -> None:
    insts = [A.random_instance(3, 4, 5, seed=s) for s in range(2)]
    W0 = np.random.default_rng(0).standard_normal((2, 5, 5))
    ref = np.random.default_rng(1).standard_normal((2, 5, 5))
    W0c, refc = W0.copy(), ref.copy()
    run_gd_batch(insts, 20, 0.1, W0=W0, reference=ref)
    run_gd(insts[0], 20, 0.1, W0=W0[0], reference=ref[0])
    regularization_path(insts[0], [1.0, 2.0], reference=ref[0], W0=W0[0] / 10, max_steps=20)
    np.testing.assert_array_equal(W0, W0c)
    np.testing.assert_array_equal(ref, refc)


@pytest.mark.parametrize("seed", [0, 3])
def test_batched_gd_refuses_a_gradient_that_cancels_like_run_gd(seed: int) -> None:
    """A sequence repeated with the opposite label under the correlation loss: ∇L = 0 exactly, and
    the float64 sums leave rounding noise or 0. ``run_gd`` refuses the normalized direction; the
    batched engine must too (it used to step along the noise, or fail later with "exactly zero")."""
    one = A.random_instance(1, 2, 1, seed=seed)
    dup = A.Instance(
        np.concatenate([one.X, one.X]), np.array([1.0, -1.0]), one.v, np.concatenate([one.z, one.z])
    )
    other = A.random_instance(2, 2, 1, seed=1)
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(dup, 3, 0.1, loss="correlation")
    with pytest.raises(NumericalError, match=r"step 0: instance 1: .*cancel to rounding level"):
        run_gd_batch([other, dup], 3, 0.1, loss="correlation")
    # plain GD takes the step, 0 or rounding noise (|∇L| ≤ ~1e-17, times lr, 3 steps): nothing to
    # refuse, and a zero gradient is reported as saturation
    bt = run_gd_batch([other, dup], 3, 0.1, loss="correlation", normalized=False)
    assert np.abs(bt.W[1]).max() <= 1e-15
    assert bt.saturated_at[1] >= 0 and bt.saturated_at[0] == -1


def test_plain_gd_divergence_raises() -> None:
    base = A.random_instance(2, 3, 3, seed=0)
    inst = A.Instance(base.X * 10, base.Y, base.v, base.z)  # ∇L(0) has entries > 1
    with pytest.raises(NumericalError, match="lower lr"):
        run_gd(inst, 50, 1e308, normalized=False, loss="correlation")
    # the batched engine names the divergence too, not the non-finite gradient it causes
    with pytest.raises(NumericalError, match="diverged.*lower lr"):
        run_gd_batch([inst], 50, 1e308, normalized=False, loss="correlation", record_at=[50])


# ------------------------------------------------------------------ regularization path
def test_regularization_path_is_stationary_and_approaches_wmm() -> None:
    inst = A.random_instance(4, 6, 8, seed=0)
    ref = solve_svm(inst).W
    radii = [1.0, 2.0, 4.0, 8.0, 16.0]
    path = regularization_path(inst, radii, reference=ref)
    # KKT: ∇L ∝ −W on the sphere, to the requested tolerance (1e-10, the default tol)
    assert np.all(path.kkt_residuals <= 1e-10)
    assert np.allclose([p.norm for p in path.points], radii, rtol=1e-12)
    # measured: gap 0.0685, 0.024, 0.008, 0.0024, 0.00068 (slope ≈ −1.8 in R); the theory
    # (arXiv 2308.16898) says W_R/R → W_mm/||W_mm||, so the gap must decrease along the path
    assert np.all(np.diff(path.gaps) < 0)
    assert path.gaps[-1] < 1e-3
    with pytest.raises(AttnSVMError, match="increasing"):
        regularization_path(inst, [2.0, 1.0])


@pytest.mark.parametrize(
    ("family", "seed", "radii"),
    [
        ("gaussian", 1, [1.0, 2.0, 4.0, 8.0]),
        ("self_attention", 1, [1.0, 2.0, 4.0]),
        ("unit", 0, [1.0, 2.0, 4.0, 8.0, 16.0]),
    ],
)
def test_regularization_path_does_not_stall_between_basins(
    family: str, seed: int, radii: list[float]
) -> None:
    """Named regression: the first version kept steps on the KKT residual alone and took the first
    step of each radius unchecked from inside the ball; on these instances it stalled at residual
    2e-2 (gaussian 1, R = 8), 2e-1 (self_attention 1, R = 4), 4e-1 and 2e-1 (unit 0, R = 8, 16).
    Warm start on the sphere + risk-descent acceptance reach the tolerance at every radius, at a
    risk no higher than the stalled point's (measured: lower by 7e-4, 5e-4, 4e-3 / 2e-3)."""
    inst = A.random_instance(4, 6, 8, seed=seed, family=family)
    path = regularization_path(inst, radii)
    assert np.all(path.kkt_residuals <= 1e-10)  # the default tol; NaN (interior) fails too
    assert np.allclose([p.norm for p in path.points], radii, rtol=1e-12)


# ---------------------------------------------------------------------- W = K Qᵀ engine
def test_kq_gd_equals_textbook_factor_update() -> None:
    inst = A.random_instance(3, 4, 5, seed=5)
    rng = np.random.default_rng(0)
    K0, Q0 = 0.3 * rng.standard_normal((5, 5)), 0.3 * rng.standard_normal((5, 5))
    K, Q = K0.copy(), Q0.copy()
    for _ in range(20):
        g = A.risk_grad(inst, K @ Q.T)
        gK, gQ = g @ Q, g.T @ K
        nrm = math.sqrt(np.sum(gK**2) + np.sum(gQ**2))
        K, Q = K - 0.1 * gK / nrm, Q - 0.1 * gQ / nrm
    tr = run_gd_kq(inst, 20, 0.1, K0=K0, Q0=Q0)
    assert _rel(tr.K, K) < RTOL_TEXTBOOK and _rel(tr.Q, Q) < RTOL_TEXTBOOK
    np.testing.assert_allclose(tr.W, tr.K @ tr.Q.T, rtol=0, atol=1e-15 * np.abs(tr.W).max())
    np.testing.assert_array_equal(K0, 0.3 * np.random.default_rng(0).standard_normal((5, 5)))


def test_kq_gd_measures_nuclear_svm_correlation() -> None:
    """Empirical question (not asserted beyond sanity): does GD on (K, Q) go to the nuclear-norm
    SVM? Measured on gaussian seed 0: gap to W_mm^nuc 3.4e-3 at 5000 steps and falling, while
    the gap to the Frobenius W_mm stays ≈ 0.12 (the two SVM directions are 0.11 apart)."""
    inst = A.random_instance(4, 6, 8, seed=0)
    ref = solve_svm(inst, norm="nuc").W
    tr = run_gd_kq(inst, 1000, 0.1, reference=ref, record_at=[250, 500])
    assert np.all(np.isfinite(tr.W)) and np.all(np.isfinite(tr.corrs))
    assert tr.nuclear_norms.shape == tr.norms.shape
    assert np.all(tr.nuclear_norms >= tr.norms * (1 - 1e-12))  # ||W||_* ≥ ||W||_F
    with pytest.raises(AttnSVMError, match="K0 must have shape"):
        run_gd_kq(inst, 10, 0.1, K0=np.zeros((8, 3)), Q0=np.zeros((8, 4)), m=4)


# ----------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_million_normalized_steps_keep_improving() -> None:
    """10⁶ normalized steps (minutes): finite, and the gap to W_mm falls at the 1/t² rate."""
    inst = A.random_instance(4, 6, 8, seed=0)
    ref = solve_svm(inst).W
    tr = run_gd(inst, 10**6, 0.1, record_at=[10**3, 10**4, 10**5], reference=ref)
    assert np.all(np.isfinite(tr.W))
    assert np.all(np.diff(tr.gaps) < 0)
    assert np.all(tr.gaps <= RATE_CONSTANT / tr.steps.astype(float) ** 2)
    fit = fit_rate(tr.steps, tr.gaps)
    # the 1/t² rate (1/||W||², ||W_t|| ≈ ηt): slope −2 within the fit's spread
    assert fit.slope == pytest.approx(-2.0, abs=0.1) and fit.r2 > 0.99


def test_batched_custom_loss_without_log_derivative_equals_single() -> None:
    """A user loss with only value/derivative goes through the sign/log|ℓ'| path of both engines."""
    from attnsvm.model._losses import Loss, logistic

    custom = Loss("logistic-no-log", logistic.value_fn, logistic.derivative_fn, logistic.assumptions)
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    bt = run_gd_batch(insts, 100, 0.1, loss=custom)
    for b, inst in enumerate(insts):
        assert _rel(bt.W[b], run_gd(inst, 100, 0.1, loss=custom).W) < RTOL_ENGINES


# ====================================================== pinned by mutation testing (issue 13 §4)
#: Hand-derived values of the tests below are sums of a few O(1) doubles: a few ulps of 1.
ABS_FEW_ULPS = 8 * float(np.finfo(np.float64).eps)


# ------------------------------------------------------------------------------ fit_rate
def test_fit_rate_names_the_wrong_rank_of_gap() -> None:
    with pytest.raises(InvalidInstanceError) as ei:
        fit_rate([1.0, 2.0, 3.0], [[1.0, 2.0, 3.0]])
    assert str(ei.value) == "gap must have 1 dimension(s); got shape (1, 3)"


def test_fit_rate_names_a_non_finite_gap() -> None:
    with pytest.raises(InvalidInstanceError) as ei:
        fit_rate([1.0, 2.0, 3.0], [1.0, math.nan, 3.0])
    assert str(ei.value) == (
        "gap must be finite; found nan at index (1,). Remove or impute NaN/Inf entries first."
    )


@pytest.mark.parametrize(
    ("x", "gap", "message"),
    [
        (
            [0.0, 2.0, 3.0],
            [1.0, 2.0, 3.0],
            "x must be positive for a log-log fit; x[0] = 0.0. "
            "Drop zero gaps (direction already exact) or steps 0.",
        ),
        (
            [1.0, 2.0, 3.0],
            [1.0, 0.0, 3.0],
            "gap must be positive for a log-log fit; gap[1] = 0.0. "
            "Drop zero gaps (direction already exact) or steps 0.",
        ),
    ],
)
def test_fit_rate_names_the_first_non_positive_entry(x: list[float], gap: list[float], message: str) -> None:
    with pytest.raises(InvalidInstanceError) as ei:
        fit_rate(x, gap)
    assert str(ei.value) == message


def test_fit_rate_accepts_exactly_three_points_and_counts_them() -> None:
    # gap = 10·x^−2 on x = 1, 10, 100: slope −2, intercept 1, R² = 1, three points (the documented minimum)
    fit = fit_rate([1.0, 10.0, 100.0], [10.0, 0.1, 1e-3])
    assert fit.n_points == 3
    assert fit.slope == pytest.approx(-2.0, abs=ABS_FEW_ULPS * 10)
    assert fit.intercept == pytest.approx(1.0, abs=ABS_FEW_ULPS * 10)
    assert fit.r2 == pytest.approx(1.0, abs=ABS_FEW_ULPS)


def test_fit_rate_r2_of_a_constant_gap_is_one() -> None:
    # Every log10 gap equal: the points lie exactly on the line of slope 0 (ss_tot = 0), R² = 1 by
    # the documented convention "1 for points exactly on a line" (not 0/0).
    fit = fit_rate([1.0, 10.0, 100.0], [5.0, 5.0, 5.0])
    assert fit.r2 == 1.0
    assert fit.slope == pytest.approx(0.0, abs=ABS_FEW_ULPS * 10)


def test_fit_rate_r2_of_a_small_symmetric_bump_is_zero() -> None:
    # log10 x = 0, 1, 2 and log10 gap = 0, 0.1, 0: the least-squares line is flat at 1/30, so the
    # residuals (−1, 2, −1)/30 are the deviations from the mean and R² = 1 − ss_res/ss_tot = 0 by hand.
    # ss_tot = 6/900 < 1: a small spread still gets its true R².
    fit = fit_rate([1.0, 10.0, 100.0], [1.0, 10.0**0.1, 1.0])
    assert fit.r2 == pytest.approx(0.0, abs=ABS_FEW_ULPS * 10)
    assert fit.slope == pytest.approx(0.0, abs=ABS_FEW_ULPS * 10)
    assert fit.intercept == pytest.approx(1.0 / 30.0, abs=ABS_FEW_ULPS)


# ------------------------------------------------------------------------- early stop
def _rec(tokens: list[int], W: np.ndarray | None) -> GDRecord:
    return GDRecord(0, 0.0, 0.0, np.array(tokens, dtype=np.intp), math.nan, math.nan, 0.0, W)


def test_settled_needs_all_three_records_to_select_the_same_tokens() -> None:
    W = np.eye(2)
    assert _settled([_rec([0], W), _rec([0], W), _rec([0], W)], 0.0)
    # the first two agree, the last one does not: not settled
    assert not _settled([_rec([0], W), _rec([0], W), _rec([1], W)], 0.0)
    assert not _settled([_rec([1], W), _rec([0], W), _rec([0], W)], 0.0)


def test_settled_accepts_a_gap_equal_to_the_tolerance() -> None:
    # identical iterates: both gaps are exactly 0, and the documented criterion is gap ≤ tol
    W = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert _settled([_rec([0], W), _rec([0], W), _rec([0], W)], 0.0)


def test_settled_with_all_ones_iterates() -> None:
    # a nonzero iterate whose entries are all 1 has a direction like any other
    W = np.ones((3, 3))
    assert _settled([_rec([2], W), _rec([2], W.copy()), _rec([2], W.copy())], 1e-12)


@pytest.mark.parametrize("missing", [0, 1, 2])
def test_settled_is_false_without_iterates(missing: int) -> None:
    recs = [_rec([0], np.eye(2)) for _ in range(3)]
    recs[missing] = _rec([0], None)
    assert not _settled(recs, 1.0)


# ---------------------------------------------------------------------------- (K, Q) GD
def test_kq_default_factors_are_a_tenth_of_standard_normal_draws() -> None:
    # Documented: K0, Q0 default to init_scale · standard normal draws from default_rng(seed),
    # K first, with init_scale = 0.1 by default.
    inst = A.random_instance(3, 4, 5, seed=7)
    rng = np.random.default_rng(0)
    K0 = 0.1 * rng.standard_normal((5, 5))
    Q0 = 0.1 * rng.standard_normal((5, 5))
    default = run_gd_kq(inst, 3, 0.1)
    explicit = run_gd_kq(inst, 3, 0.1, K0=K0, Q0=Q0)
    np.testing.assert_array_equal(default.K, explicit.K)
    np.testing.assert_array_equal(default.Q, explicit.Q)


def test_kq_factor_width_is_that_of_k0() -> None:
    # Documented: m defaults to the width of K0 when K0 is given (here 3 < d = 5).
    inst = A.random_instance(3, 4, 5, seed=7)
    rng = np.random.default_rng(1)
    K0, Q0 = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    tr = run_gd_kq(inst, 2, 0.1, K0=K0, Q0=Q0)
    assert tr.K.shape == (5, 3) and tr.Q.shape == (5, 3)


def test_kq_names_a_k0_of_the_wrong_rank() -> None:
    inst = A.random_instance(3, 4, 5, seed=7)
    with pytest.raises(InvalidInstanceError) as ei:
        run_gd_kq(inst, 2, 0.1, K0=np.ones(5))
    assert str(ei.value) == "K0 must have 2 dimension(s); got shape (5,)"


def test_kq_normalized_gd_at_a_saddle_says_so() -> None:
    # K = Q = 0: ∇L(W) Q = ∇L(W)ᵀ K = 0 whatever ∇L(0) is, so the joint direction is undefined.
    inst = A.random_instance(3, 4, 5, seed=7)
    with pytest.raises(NumericalError) as ei:
        run_gd_kq(inst, 2, 0.1, K0=np.zeros((5, 5)), Q0=np.zeros((5, 5)))
    assert str(ei.value) == (
        "normalized (K, Q) GD at step 1: ∇L(W) Q and ∇L(W)ᵀ K are both zero "
        "(K, Q at a saddle); start from other factors"
    )


def test_kq_names_an_initial_product_beyond_float64() -> None:
    # K0 = Q0 = 2^600 (all entries): W_0 = K0 Q0ᵀ has entries 5·2^1200 ≈ 1e362 (> 1.8e308). With the
    # first record at step 2, W_0 is first formed for step 1, and the error must still name W_0.
    inst = A.random_instance(3, 4, 5, seed=7)
    big = np.full((5, 5), 2.0**600)
    with pytest.raises(NumericalError) as ei:
        run_gd_kq(inst, 2, 0.1, K0=big, Q0=big, record_at=[2])
    assert str(ei.value) == (
        "W_0 = K Qᵀ (largest entry) is about 1e+362: it overflows float64's normal range "
        "[2.2e-308, 1.8e308]. Rescale K0, Q0 or lr"
    )


def test_plain_kq_gd_equals_textbook_factor_update() -> None:
    # K ← K − η ∇L(W) Q, Q ← Q − η ∇L(W)ᵀ K (simultaneous), ∇L from the core's risk_grad.
    inst = A.random_instance(3, 4, 5, seed=5)
    rng = np.random.default_rng(0)
    K0, Q0 = 0.3 * rng.standard_normal((5, 5)), 0.3 * rng.standard_normal((5, 5))
    K, Q = K0.copy(), Q0.copy()
    for _ in range(20):
        g = A.risk_grad(inst, K @ Q.T)
        K, Q = K - 0.5 * (g @ Q), Q - 0.5 * (g.T @ K)
    tr = run_gd_kq(inst, 20, 0.5, normalized=False, K0=K0, Q0=Q0, loss="logistic")
    assert _rel(tr.K, K) < RTOL_TEXTBOOK and _rel(tr.Q, Q) < RTOL_TEXTBOOK
    assert tr.steps_run == 20 and tr.stop_reason == "steps" and not tr.saturated
    assert tr.lr == 0.5 and tr.loss == "logistic" and not tr.normalized
    assert all(r.W is None for r in tr.record)  # run_gd_kq keeps no iterates in its records


def _kq_factors_of(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    U, S, Vt = np.linalg.svd(W)
    return U * np.sqrt(S), Vt.T * np.sqrt(S)


def test_plain_kq_gd_stops_when_the_update_no_longer_changes_the_factors() -> None:
    # W_0 = 60·Ŵ_mm: ||∇L|| ~ 1e-25, so η ∇L Q is below half an ulp of every entry of K, Q.
    inst = A.random_instance(3, 4, 5, seed=7)
    Wmm = solve_svm(inst).W
    K0, Q0 = _kq_factors_of(60.0 * Wmm / np.linalg.norm(Wmm))
    tr = run_gd_kq(inst, 5, 0.1, normalized=False, K0=K0, Q0=Q0, reference=Wmm, record_at=[5])
    assert tr.stop_reason == "stalled" and tr.saturated and tr.steps_run == 0
    np.testing.assert_array_equal(tr.K, K0)
    np.testing.assert_array_equal(tr.Q, Q0)
    # the state where it stopped is recorded, with its reference measures and no iterate
    (r,) = tr.record
    assert r.step == 0 and r.W is None
    assert r.corr == pytest.approx(direction_corr(K0 @ Q0.T, Wmm), abs=4e-16)
    assert r.log10_grad_norm == pytest.approx(math.log10(np.linalg.norm(A.risk_grad(inst, tr.W))), rel=1e-12)
    assert tr.nuclear_norms.shape == (1,)


def test_plain_kq_gd_stops_as_stationary_where_the_gradient_is_zero() -> None:
    # v = e_1 and every token's first feature 0.5: every token value vᵀx is 0.5 exactly, so ∇L = 0
    # exactly at every W.
    inst = A.random_instance(3, 4, 5, seed=7)
    X = inst.X.copy()
    X[:, :, 0] = 0.5
    flat = A.Instance(X=X, Y=inst.Y, z=inst.z, v=np.eye(5)[0])
    tr = run_gd_kq(flat, 5, 0.1, normalized=False)
    assert tr.stop_reason == "stationary" and tr.saturated and tr.steps_run == 0
    assert [r.step for r in tr.record] == [0] and tr.record[0].log10_grad_norm == -math.inf


def test_plain_kq_gd_refuses_a_gradient_beyond_float64() -> None:
    # Exponential loss with token values ~ ±2.6e3: e^{−Y f} ~ e^{900} at the misclassified sequences.
    inst = A.random_instance(3, 4, 5, seed=7)
    hot = A.Instance(X=inst.X, Y=inst.Y, z=inst.z, v=1e3 * inst.v)
    with pytest.raises(NumericalError) as ei:
        run_gd_kq(hot, 2, 0.1, normalized=False, loss="exponential")
    assert str(ei.value) == "plain (K, Q) GD at step 1: the gradient is not finite; lower lr"


def test_plain_kq_gd_divergence_raises() -> None:
    # lr = 1e308 and Q ~ 1e3: η ∇L(W) Q overflows; the factors would become Inf.
    inst = A.random_instance(3, 4, 5, seed=7)
    rng = np.random.default_rng(3)
    K0, Q0 = 1e-3 * rng.standard_normal((5, 5)), 1e3 * rng.standard_normal((5, 5))
    with pytest.raises(NumericalError) as ei:
        run_gd_kq(inst, 2, 1e308, normalized=False, K0=K0, Q0=Q0)
    assert str(ei.value) == "plain (K, Q) GD diverged at step 1: factors became non-finite; lower lr"


def test_pow2_factors_are_doubles_whose_product_is_two_to_the_k() -> None:
    from attnsvm.gd._scaled import _pow2_factors

    assert _pow2_factors(np.zeros(3, dtype=np.int64)) == []
    for k in (1, -7, 1000, -1000, 1001, 1600, -2100):
        fs = _pow2_factors(np.array([k, 0], dtype=np.int64))
        assert fs and all(np.all(np.isfinite(f)) and np.all(f > 0) for f in fs)
        # log2 of a power of two is exact: the exponents add up to k
        assert sum(int(np.log2(f[0])) for f in fs) == k and all(float(f[1]) == 1.0 for f in fs)
        assert all(np.sign(np.log2(f[0])) in (0, np.sign(k)) for f in fs)  # one sign of exponent


def test_batched_log_domain_path_scales_each_instance_by_its_own_gradient() -> None:
    """One instance with O(1) token values, one with values ~1e-200 (gradient ~1e-200: Σ G² would
    underflow unless each instance is scaled by its own largest entry): both equal the
    single-instance direction. Through the public API: one step of lr = 1 from W0 gives
    W_1 = W0 − D (D to ≤ eps·max|W0| ≈ 7e-17 from W0 − W_1), and the record at step 0 holds
    log10||∇L(W0)||."""
    from attnsvm.model._grad import normalized_risk_grad_of
    from attnsvm.model._losses import logistic

    a, b = A.random_instance(4, 6, 8, seed=0), A.random_instance(4, 6, 8, seed=1)
    b = A.Instance(X=b.X, Y=b.Y, z=b.z, v=1e-200 * b.v)
    W = np.stack([0.3 * np.eye(8), 0.3 * np.eye(8)])
    for fast in (True, False):
        tr = run_gd_batch([a, b], 1, 1.0, W0=W, record_at=[0], fast_path=fast)
        for i, inst in enumerate((a, b)):
            ref = normalized_risk_grad_of(inst.X, inst.Y, inst.z, inst.v, W[i], logistic)
            assert np.linalg.norm((W[i] - tr.W[i]) - ref.direction) <= RTOL_FAST_PATH
            ln = float(tr.log10_grad_norms[0, i]) * np.log(10.0)
            assert abs(ln - ref.log_norm) <= RTOL_FAST_PATH * abs(ref.log_norm)


class _DuckLogistic:
    """A loss that is not an attnsvm Loss: only value(u), derivative(u) and assumptions."""

    assumptions = A.model._losses.logistic.assumptions

    def value(self, u: object) -> object:
        return A.model._losses.logistic.value(u)

    def derivative(self, u: object) -> object:
        return A.model._losses.logistic.derivative(u)


def test_batched_duck_typed_loss_equals_single() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    bt = run_gd_batch(insts, 20, 0.1, loss=_DuckLogistic())
    for b, inst in enumerate(insts):
        assert _rel(bt.W[b], run_gd(inst, 20, 0.1, loss=_DuckLogistic()).W) < RTOL_ENGINES


def test_batched_names_a_custom_loss_derivative_that_is_not_finite() -> None:
    class NaNDerivative(_DuckLogistic):
        def derivative(self, u: object) -> object:
            return u * math.nan

    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    with pytest.raises(NumericalError) as ei:
        run_gd_batch(insts, 2, 0.1, loss=NaNDerivative(), fast_path=False)
    assert str(ei.value) == "the loss derivative is not finite (NaN or Inf); check the custom loss"


def test_torch_device_checks_the_cuda_index_against_the_device_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with exactly one CUDA device (simulated: only the availability queries are patched). The
    refusal through the public entry points; white-box for the accepted names (the private device check):
    the simulated device holds no tensor, so no engine can be built on it."""
    from attnsvm.gd._stack import _torch_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _torch_device("cuda") == torch.device("cuda")
    assert _torch_device("cuda:0") == torch.device("cuda:0")
    inst = A.random_instance(2, 3, 2, seed=0)
    for build in (
        lambda: BatchEngine.from_instances([inst], device="cuda:1"),
        lambda: run_gd_batch([inst], 1, 0.1, device="cuda:1"),
    ):
        with pytest.raises(AttnSVMError) as ei:
            build()
        assert str(ei.value) == "device 'cuda:1' does not exist; torch sees 1 CUDA device(s)"


def test_batched_names_the_zero_reference_among_nonzero_ones() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    ref = np.stack([np.eye(8), np.zeros((8, 8)), np.eye(8)])
    with pytest.raises(InvalidInstanceError) as ei:
        run_gd_batch(insts, 2, 0.1, reference=ref)
    assert str(ei.value) == "reference[1] is the zero matrix; it has no direction"


def test_batched_instances_of_different_scales_each_equal_their_single_run() -> None:
    """Three instances (B = 3 ≠ d) with X·2^a, z·2^b, v·2^−a for (a, b) = (100, 100), (150, 50),
    (200, 0): each is rescaled by its own powers of two, and a + b = 200 for all, so one scaled step
    lr = 0.1·2^−200 is the same problem for each. Each batch row equals its own run_gd to RTOL_ENGINES."""
    base = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    insts = [
        A.Instance(X=np.ldexp(b.X, a), Y=b.Y, z=np.ldexp(b.z, c), v=np.ldexp(b.v, -a))
        for b, (a, c) in zip(base, ((100, 100), (150, 50), (200, 0)), strict=True)
    ]
    lr = math.ldexp(0.1, -200)
    bt = run_gd_batch(insts, 20, lr)
    for b, inst in enumerate(insts):
        tr = run_gd(inst, 20, lr)
        assert _rel(bt.W[b], tr.W) < RTOL_ENGINES
        np.testing.assert_allclose(bt.log10_grad_norms[:, b], tr.log10_grad_norms, rtol=RTOL_ENGINES)


def test_batched_default_is_the_fast_path() -> None:
    # Documented default fast_path=True (eager paths): the default run is bit-for-bit the fast-path run.
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    default = run_gd_batch(insts, 50, 0.1, kernel="eager")
    fast = run_gd_batch(insts, 50, 0.1, fast_path=True, kernel="eager")
    log = run_gd_batch(insts, 50, 0.1, fast_path=False, kernel="eager")
    np.testing.assert_array_equal(default.W, fast.W)
    assert not np.array_equal(default.W, log.W)  # the paths agree to rounding, not bit for bit


def test_batched_trajectory_metadata_and_reference_columns() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    plain = run_gd_batch(insts, 3, 0.1, loss="exponential")
    assert plain.loss == "exponential" and plain.lr == 0.1 and plain.normalized and plain.device == "cpu"
    assert plain.corrs is None and plain.gaps is None  # documented: None without a reference
    ref = np.stack([solve_svm(i).W for i in insts])
    with_ref = run_gd_batch(insts, 3, 0.1, loss="exponential", reference=ref, record_at=[1, 3])
    assert with_ref.corrs is not None and with_ref.gaps is not None
    assert with_ref.corrs.shape == (2, 2) and with_ref.gaps.shape == (2, 2)
    for b in range(2):
        assert with_ref.gaps[-1, b] == pytest.approx(direction_gap(with_ref.W[b], ref[b]), rel=1e-12)
        assert with_ref.corrs[-1, b] == pytest.approx(direction_corr(with_ref.W[b], ref[b]), abs=4e-16)


def test_batched_fast_path_hands_overflowing_weights_to_the_log_domain() -> None:
    """Exponential loss with v scaled so that min_i Y_i f_i(0) = −705: ℓ' ~ e^705 ≈ 1e306 times
    score differences ~1e3 overflow the linear-domain weights; the direction (log||∇L|| ≈ 712, a
    gradient beyond float64) must still be the single-instance log-domain one."""
    from attnsvm.model._grad import normalized_risk_grad_of
    from attnsvm.model._losses import exponential

    insts = []
    for s in range(2):
        inst = A.random_instance(4, 6, 8, seed=s)
        margin = float(np.min(inst.Y * (inst.X @ inst.v).mean(axis=1)))  # Y_i f_i at W = 0 (uniform s)
        insts.append(A.Instance(X=inst.X, Y=inst.Y, z=inst.z, v=inst.v * (-705.0 / margin)))
    # the engine itself: run_gd_batch would refuse to record the risk here (e^{705+} overflows)
    W = np.zeros((2, 8, 8))
    eng = BatchEngine.from_instances(insts, loss=exponential)
    assert not eng.scale_exponents.any()  # unit-size keys and queries: the engine's data are the user's
    D, ln = eng.direction(torch.as_tensor(W))
    assert eng.log_path.all()  # the linear-domain weights overflow: every instance is handed over
    for i, inst in enumerate(insts):
        ref = normalized_risk_grad_of(inst.X, inst.Y, inst.z, inst.v, W[i], exponential)
        assert ref.log_norm > 709.8  # ||∇L|| > 1.8e308
        assert np.linalg.norm(D[i].numpy() - ref.direction) <= RTOL_FAST_PATH
        assert abs(float(ln[i]) - ref.log_norm) <= RTOL_FAST_PATH * ref.log_norm


@pytest.mark.parametrize("fast", [True, False])
def test_batched_gd_refuses_a_gradient_at_the_rounding_level_of_its_sum(fast: bool) -> None:
    """n = 2 sequences, the second a copy of the first with the opposite label and X·(1 + 16·2^−52):
    ∇L is the difference of two nearly equal sums, ~16·eps of their size, under the rounding level
    8·nT·eps = 32·eps of the sum. run_gd refuses the normalized direction; the batched engine must
    too, on both of its paths (with 8·T·eps/n, a level n² lower, it would step along the noise)."""
    one = A.random_instance(1, 2, 1, seed=0)
    near = A.Instance(
        np.concatenate([one.X, one.X * (1 + 16 * 2.0**-52)]),
        np.array([1.0, -1.0]),
        one.v,
        np.concatenate([one.z, one.z]),
    )
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(near, 2, 0.1, loss="correlation")
    with pytest.raises(NumericalError, match=r"step 0: instance 0: .*cancel to rounding level"):
        run_gd_batch([near], 2, 0.1, loss="correlation", fast_path=fast)


def test_batched_names_an_item_that_is_not_an_instance() -> None:
    a = A.random_instance(4, 6, 8, seed=0)
    with pytest.raises(AttnSVMError) as ei:
        run_gd_batch([a, "a"], 2, 0.1)  # type: ignore[list-item]
    assert str(ei.value) == "instances[1] is a str, not an attnsvm Instance"


def test_batched_rescales_tokens_far_from_unit_scale_even_with_unit_queries() -> None:
    """X·2^600 (entries ~1e180: ||x||² overflows), v·2^−600, queries unchanged: the engine must rescale
    X although z is moderate; normalized GD with lr·2^−600 equals run_gd (the oracle: the unit-scale
    run, mapped back exactly by 2^600)."""
    base = A.random_instance(4, 6, 8, seed=2)
    inst = A.Instance(X=np.ldexp(base.X, 600), Y=base.Y, z=base.z, v=np.ldexp(base.v, -600))
    lr = math.ldexp(0.1, -600)
    bt = run_gd_batch([inst], 20, lr)
    unit = run_gd(base, 20, 0.1)
    assert _rel(np.ldexp(bt.W[0], 600), unit.W) < RTOL_ENGINES


def test_batched_engine_retries_the_fast_path_every_log_retry_calls() -> None:
    """Documented: when more than LOG_FRACTION of a batch needed the log-domain path, the next calls
    use it for the whole batch, retrying the fast path every LOG_RETRY calls. Call 1 at a saturated W
    (gradient ~1e-400: the fast path fails for every instance), then W = 0 (the fast path works):
    calls 2…LOG_RETRY stay on the log path, call LOG_RETRY + 1 is fast again (stats and log_path)."""
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    W_sat = np.stack([1000 * solve_svm(i).W / np.linalg.norm(solve_svm(i).W) for i in insts])
    eng = BatchEngine.from_instances(insts, loss="logistic", kernel="eager")
    eng.direction(torch.as_tensor(W_sat))
    assert eng.stats == {"fast": 0, "log": 1, "mixed": 0, "fused": 0}
    assert eng.log_path.tolist() == [True, True]
    W0 = torch.zeros((2, 8, 8), dtype=torch.float64)
    for _ in range(BatchEngine.LOG_RETRY - 1):
        eng.direction(W0)
    assert eng.stats == {"fast": 0, "log": BatchEngine.LOG_RETRY, "mixed": 0, "fused": 0}
    assert eng.log_path.tolist() == [True, True]
    eng.direction(W0)
    assert eng.stats == {"fast": 1, "log": BatchEngine.LOG_RETRY, "mixed": 0, "fused": 0}
    assert eng.log_path.tolist() == [False, False]


def test_batched_mixed_step_scales_an_accepted_instance_with_a_tiny_gradient() -> None:
    """One batch, three instances at once: O(1) values, values ~1e-200 (accepted by the fast path:
    weights ~1e-200 ≥ FAST_MIN_WEIGHT, but ||G|| ~ 1e-200 is outside the unscaled norm's safe range),
    and a saturated one (||W|| = 1000: the log-domain path). Each equals the single-instance direction."""
    from attnsvm.model._grad import normalized_risk_grad_of
    from attnsvm.model._losses import logistic

    a, b, c = (A.random_instance(4, 6, 8, seed=s) for s in range(3))
    b = A.Instance(X=b.X, Y=b.Y, z=b.z, v=1e-200 * b.v)
    Wc = solve_svm(c).W
    W = np.stack([0.3 * np.eye(8), 0.3 * np.eye(8), 1000 * Wc / np.linalg.norm(Wc)])
    eng = BatchEngine.from_instances([a, b, c], loss=logistic, kernel="eager")
    assert not eng.scale_exponents.any()  # the values are small, not the keys or queries: no rescaling
    D, ln = eng.direction(torch.as_tensor(W))
    assert eng.stats["mixed"] == 1 and eng.log_path.tolist() == [False, False, True]
    for i, inst in enumerate((a, b, c)):
        ref = normalized_risk_grad_of(inst.X, inst.Y, inst.z, inst.v, W[i], logistic)
        assert np.linalg.norm(D[i].numpy() - ref.direction) <= RTOL_FAST_PATH
        assert abs(float(ln[i]) - ref.log_norm) <= RTOL_FAST_PATH * abs(ref.log_norm)


def test_regularization_path_names_its_bad_arguments() -> None:
    inst = A.random_instance(3, 4, 5, seed=7)
    with pytest.raises(AttnSVMError) as ei:
        regularization_path(inst, [2.0, 1.0])
    assert str(ei.value) == "radii must be a non-empty, strictly increasing list of positive radii"
    with pytest.raises(AttnSVMError) as ei:
        regularization_path(inst, [1.0], tol=math.nan)
    assert str(ei.value) == "tol must be a finite number ≥ 0; got nan"
    with pytest.raises(NumericalError) as ei:
        regularization_path(inst, [1e-320, 1.0])
    assert str(ei.value) == (
        "the smallest radius is about 1e-320: it underflows float64's normal range "
        "[2.2e-308, 1.8e308]. Radii must be normal doubles"
    )
    with pytest.raises(NumericalError) as ei:
        regularization_path(inst, [1.0, 1e307])
    assert str(ei.value).startswith("the logits x_itᵀ W (||W||_F = the largest radius) z_i")


def test_regularization_path_reports_each_radius_and_its_step_count() -> None:
    # tol = 0 is never reached: each radius takes exactly max_steps projected steps (η stays ≥ 1e-15·R
    # over 5 halvings at most).
    inst = A.random_instance(3, 4, 5, seed=7)
    path = regularization_path(inst, [1.0, 2.0], max_steps=5, tol=0.0)
    assert [p.radius for p in path.points] == [1.0, 2.0]
    assert [p.iterations for p in path.points] == [5, 5]
    np.testing.assert_array_equal(path.radii, [1.0, 2.0])


def test_regularization_path_point_inside_the_ball_has_no_kkt_residual() -> None:
    # From W0 = 0 one step of length lr·R = 0.1 stays inside the ball of radius 1: documented NaN
    # residual there; log10_grad_norm is log10||∇L(W)||_F of the point (the core's risk_grad).
    inst = A.random_instance(3, 4, 5, seed=7)
    (p,) = regularization_path(inst, [1.0], max_steps=1, lr=0.1).points
    assert p.iterations == 1 and p.norm == pytest.approx(0.1, rel=1e-12)
    assert math.isnan(p.kkt_residual)
    assert p.log10_grad_norm == pytest.approx(math.log10(np.linalg.norm(A.risk_grad(inst, p.W))), rel=1e-12)


def test_batched_engine_step_is_one_normalized_gd_step() -> None:
    # step_(W, lr): W ← W − lr·D in place (D the unit direction at W), returning log||∇L(W)||.
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    W0 = 0.3 * np.stack([np.eye(8), -np.eye(8)])
    eng = BatchEngine.from_instances(insts)
    W = torch.as_tensor(W0.copy())
    ln = eng.step_(W, 0.1).clone()
    for b, inst in enumerate(insts):
        ref = A.normalized_risk_grad(inst, W0[b])
        assert float(ln[b]) == pytest.approx(ref.log_norm, rel=RTOL_FAST_PATH)
        assert _rel(W[b].numpy(), W0[b] - 0.1 * ref.direction) < RTOL_TEXTBOOK
