"""`attnsvm.peers._multitoken` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.peers._multitoken` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InfeasibleSVMError, InvalidInstanceError, NumericalError, SolverError
from attnsvm.peers import _multitoken as MT
from attnsvm.svm import CERTIFY_RTOL

#: The scale contract's refusals all end with float64's normal range (attnsvm.scaling.range_error).
RANGE = "float64's normal range [2.2e-308, 1.8e308]"
#: Remedy that every refusal of the (plain) gradient carries (documented in multitoken_grad).
GRAD_REMEDY = "Use the normalized gradient (direction and log-norm), which stays exact at any size"
#: The certified min-norm solver's documented relative accuracy (attnsvm.svm.min_norm_dual:
#: ``error_bound`` and every KKT residual ≤ CERTIFY_RTOL) bounds W_mm, W_dir and W_fin.
SOLVER_RTOL = CERTIFY_RTOL
#: Hand-derived values computed from O(1) mantissas with a handful of roundings (each ≤ eps/2): 4 eps.
FEW_ULPS = 4 * float(np.finfo(np.float64).eps)


def line(tokens: list[float], *, z: float = 1.0, v: float = 1.0) -> A.Instance:
    """One sequence of scalar tokens (d = 1), label +1, query ``z``: the logit of token t is ``x_t·W·z``."""
    X = np.array([[[float(t)] for t in tokens]])
    return A.Instance(X, np.array([1.0]), np.array([v]), np.array([[z]]))


# ------------------------------------------------------------------------------------ input validation
@pytest.mark.parametrize(
    ("V", "message"),
    [
        (np.ones(4), "V must have 2 dimension(s); got shape (4,)"),
        (np.ones((4, 2, 1)), "V must have 2 dimension(s); got shape (4, 2, 1)"),
        (
            np.array([[1.0], [np.nan], [0.0], [0.0]]),
            "V must be finite; found nan at index (1, 0). Remove or impute NaN/Inf entries first.",
        ),
    ],
)
def test_head_of_the_wrong_rank_or_with_nan_is_refused_by_name(V, message):
    """Documented: V is a finite real (d, k) matrix; a bad one raises InvalidInstanceError naming ``V``
    (the argument as the user passed it), what is wrong and what was received (oracle: the text)."""
    inst = A.random_instance(2, 3, 4, seed=1)
    for call in (
        lambda: MT.multitoken_output(inst, np.eye(4), V),
        lambda: MT.multitoken_grad(inst, np.eye(4), V),
        lambda: MT.run_multitoken_gd(inst, V, 1, 0.1),
    ):
        with pytest.raises(InvalidInstanceError) as exc:
            call()
        assert str(exc.value) == message


def test_prediction_refuses_a_bad_iterate_by_its_name():
    """Documented: ``W_gd`` is a finite (d, d) matrix; the refusal names ``W_gd`` (oracle: the text)."""
    inst = A.random_instance(2, 3, 4, seed=1)
    with pytest.raises(InvalidInstanceError) as exc:
        MT.predict_multitoken(inst, np.eye(3))
    assert str(exc.value) == "W_gd must have shape (d, d) = (4, 4) for this instance; got (3, 3)"
    with pytest.raises(InvalidInstanceError) as exc:
        MT.predict_multitoken(inst, np.full((4, 4), np.inf))
    assert str(exc.value) == (
        "W_gd must be finite; found inf at index (0, 0). Remove or impute NaN/Inf entries first."
    )


# ------------------------------------------------------------------------------ the prediction's fields
def test_prediction_uses_the_threshold_it_is_given():
    """Hand-derived: tokens 1, 0 with W_gd = 1/4 give s = (σ(¼), σ(−¼)) = (0.562, 0.438). With the
    threshold 1/T = ½ only token 0 is selected; with the default 10⁻³ both are (then W_dir = 0)."""
    inst = line([1.0, 0.0])
    W = np.array([[0.25]])
    assert [O.tolist() for O in MT.predict_multitoken(inst, W, threshold=0.5).sets] == [[0]]
    assert [O.tolist() for O in MT.predict_multitoken(inst, W).sets] == [[0, 1]]


def test_prediction_of_a_one_dimensional_singleton_is_exact():
    """Hand-derived (d = 1, tokens 1, 0, z = 1, W_gd = ¼, threshold ½ so O = {0}): W_dir = 1 (margin
    (1 − 0)·w ≥ 1 at least norm), W_fin = 0, R = ⟨W_gd, W_dir⟩/||W_dir||² = ¼, prediction = W_gd,
    rel_error = 0 and corr = cos(W_gd, prediction) = 1."""
    pr = MT.predict_multitoken(line([1.0, 0.0]), np.array([[0.25]]), threshold=0.5)
    assert pr.W_dir == pytest.approx(np.array([[1.0]]), rel=SOLVER_RTOL)
    assert pr.W_fin.tolist() == [[0.0]] and pr.kkt_fin is None
    assert pr.R == pytest.approx(0.25, rel=SOLVER_RTOL)
    assert pr.prediction == pytest.approx(np.array([[0.25]]), rel=SOLVER_RTOL)
    assert pr.rel_error <= SOLVER_RTOL
    assert pr.corr == pytest.approx(1.0, rel=SOLVER_RTOL)


def test_correlation_is_undefined_when_the_prediction_is_zero():
    """Hand-derived: z = e₀ and W_gd = e₁e₁ᵀ give W_gd z = 0, so every logit is 0, s = (½, ½), both tokens
    are selected (W_dir = 0, R = 0) and the log-ratios are 0 (W_fin = 0): the prediction is the zero
    matrix, ||W_gd − 0||/||W_gd|| = 1, and its correlation with W_gd is undefined (NaN)."""
    X = np.array([[[1.0, 2.0], [-1.0, 0.5]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]]))
    pr = MT.predict_multitoken(inst, np.array([[0.0, 0.0], [0.0, 1.0]]))
    assert [O.tolist() for O in pr.sets] == [[0, 1]]
    assert not np.any(pr.W_dir) and not np.any(pr.W_fin) and not np.any(pr.prediction)
    assert pr.R == 0.0 and pr.rel_error == 1.0
    assert math.isnan(pr.corr)


def test_single_token_baseline_is_the_svm_at_the_attended_token():
    """Documented: W_mm is the Att-SVM at α = argmax_t s_it (the attended token), not at the optimal token
    of v. Hand-derived (d = 1, tokens 1, 0, v = 1): W_gd = −5 attends token 1 (logits −5, 0), while v
    prefers token 0; the SVM at α = 1 is min w² s.t. (0 − 1)·w ≥ 1, so W_mm = −1, and cos(W_gd, W_mm) = 1
    with zero residual for the best multiple of W_mm."""
    pr = MT.predict_multitoken(line([1.0, 0.0]), np.array([[-5.0]]))
    assert pr.W_mm is not None
    assert pr.W_mm == pytest.approx(np.array([[-1.0]]), rel=SOLVER_RTOL)
    assert pr.single_corr == pytest.approx(1.0, rel=SOLVER_RTOL)
    assert pr.single_rel_error <= SOLVER_RTOL


def test_single_token_baseline_is_absent_when_the_attended_token_is_duplicated():
    """Documented: W_mm is None when the single-token SVM is infeasible, and then single_rel_error and
    single_corr are NaN. Hand-derived: tokens 1, 1, 0 with W_gd = 10 attend token 0 (first of the tie),
    whose twin (token 1) can have no margin against it: infeasible. O = {0, 1} (s₂ = e⁻¹⁰/(2 + e⁻¹⁰) <
    10⁻³), and W_dir = 1 (equal logits of the twins hold for any w; margin w ≥ 1 against token 2)."""
    pr = MT.predict_multitoken(line([1.0, 1.0, 0.0]), np.array([[10.0]]))
    assert [O.tolist() for O in pr.sets] == [[0, 1]]
    assert pr.W_dir == pytest.approx(np.array([[1.0]]), rel=SOLVER_RTOL)
    assert pr.W_mm is None
    assert math.isnan(pr.single_rel_error) and math.isnan(pr.single_corr)


def test_infeasible_direction_svm_is_refused_with_a_farkas_certificate():
    """Hand-derived (d = 1, tokens 0, 1, 2, 1, W_gd = 5): s ∝ (1, e⁵, e¹⁰, e⁵), so O = {1, 2, 3} and token 0
    (s₀ ≈ e⁻¹⁰ < 10⁻³) is out. W_dir needs equal logits of tokens 1 and 2 ((2 − 1)·w = 0, so w = 0) and a
    margin (1 − 0)·w ≥ 1 against token 0: contradictory, an InfeasibleSVMError naming the direction SVM
    and the only sequence (0), with the certificate rows 0 (token 2 vs 1) and 2 (token 1 vs 0)."""
    with pytest.raises(InfeasibleSVMError) as exc:
        MT.predict_multitoken(line([0.0, 1.0, 2.0, 1.0]), np.array([[5.0]]))
    msg = str(exc.value)
    assert msg.startswith("the direction SVM W_dir is infeasible: ")
    assert "sequence 0," in msg
    assert "rows [0, 2] cannot hold together" in msg


def test_infeasible_direction_svm_is_explained_in_the_multitoken_model():
    """The same instance: the message reads the Farkas certificate in the model's terms, the equal-logit constraint
    of tokens 2 and 1 (row 0, triple (0, 2, 1)) and the margin of the selected token 1 over token 0 (row 2, triple
    (0, 1, 0)), hand-derived above. Was: the prompt model's explanation ("token 1 has the same key as the selected
    token", "no p", "alpha", "W"), which blamed the zero row 1 (tokens 3 and 1 are equal, an equality 0 = 0 that
    always holds) and named quantities the multi-token model does not have."""
    with pytest.raises(InfeasibleSVMError) as exc:
        MT.predict_multitoken(line([0.0, 1.0, 2.0, 1.0]), np.array([[5.0]]))
    msg = str(exc.value)
    assert msg.startswith(
        "the direction SVM W_dir is infeasible: no W gives the selected tokens O_i of each sequence equal logits "
        "((x_it − x_it₁)ᵀ W z_i = 0, t ∈ O_i) and a margin ≥ 1 over the other tokens ((x_it₁ − x_iτ)ᵀ W z_i ≥ 1, "
        "τ ∉ O_i). The conflicting constraints (Farkas certificate): sequence 0, tokens 2 and 1 equal logits; "
        "sequence 0, selected token 1 over token 0 by ≥ 1. "
    )
    for foreign in ("same key", "no p", "alpha", "Wᵀ(x_iα"):
        assert foreign not in msg


def test_infeasible_finite_part_is_explained_as_rounding(monkeypatch):
    """Fault injection: the finite part's equalities are met by W_gd itself, so only floating point can make them
    infeasible; a solver verdict of infeasibility (injected, certificate on both rows of line([0, 1, 2]), every
    token selected at W_gd = 1: triples (0, 1, 0), (0, 2, 0)) is explained as such, naming those constraints.
    Oracle: the documented text."""
    from attnsvm.svm._results import InfeasibleMinNormError

    def infeasible(rows, R, b, eq):
        raise InfeasibleMinNormError("min-norm problem infeasible: injected", np.array([1.0, -0.5]), math.inf)

    monkeypatch.setattr(MT, "_min_norm_rows", infeasible)
    with pytest.raises(InfeasibleSVMError) as exc:
        MT.predict_multitoken(line([0.0, 1.0, 2.0]), np.array([[1.0]]))
    assert str(exc.value) == (
        "the finite part W_fin is infeasible in floating point: its equalities (x_it − x_it₁)ᵀ W z_i = "
        "(x_it − x_it₁)ᵀ W_gd z_i (t ∈ O_i) are met by W_gd itself, so its rows z_i ⊗ (x_it − x_it₁) are "
        "numerically dependent and their right-hand sides disagree at rounding level. The conflicting constraints "
        "(Farkas certificate): sequence 0, tokens 1 and 0 equal logits; sequence 0, tokens 2 and 0 equal logits. "
        "Merge near-duplicate tokens or rescale the features. (min-norm problem infeasible: injected)"
    )


# ------------------------------------------------------------------- refusals of the scale contract
def test_prediction_refuses_each_unrepresentable_matrix_by_name():
    """Oracle: hand-computed sizes on d = 1 instances (tokens a, 0, query c: logit gap a·W·c).

    * a = c = 2⁻⁵²⁰, W_gd = 2¹⁰²³, threshold ½ (gap 2⁻¹⁷ > 0, so O = {0}): W_dir = 1/(a·c) = 2¹⁰⁴⁰ ≈ 1e313.
    * the same with the default threshold (both tokens kept: W_dir = 0, W_fin = W_gd, fine): the
      single-token W_mm = 1/(a·c) = 2¹⁰⁴⁰.
    * a = c = 2⁵²⁰, W_gd = 2⁻¹⁰⁶⁰ (gap 2⁻²⁰: both kept, W_dir = 0): W_fin = W_gd = 2⁻¹⁰⁶⁰ ≈ 1e-319.
    * a = c = 2⁵⁰⁰, W_gd = 2⁻¹⁰³⁰, threshold ½ (gap 2⁻³⁰, O = {0}): W_dir = 2⁻¹⁰⁰⁰ is normal, W_fin = 0,
      and the prediction R·W_dir = W_gd = 2⁻¹⁰³⁰ ≈ 1e-310 is not.
    """
    cases = [
        (-520, 1023, 0.5, "the direction SVM solution W_dir is about 1e+313: it overflows "),
        (
            -520,
            1023,
            MT.SELECT_THRESHOLD,
            "the single-token Att-SVM solution W_mm is about 1e+313: it overflows ",
        ),
        (520, -1060, MT.SELECT_THRESHOLD, "the finite part W_fin is about 1e-319: it underflows "),
        (500, -1030, 0.5, "the prediction W_fin + R·W_dir is about 1e-310: it underflows "),
    ]
    for ja, jw, thr, message in cases:
        inst = line([2.0**ja, 0.0], z=2.0**ja)
        with pytest.raises(NumericalError) as exc:
            MT.predict_multitoken(inst, np.array([[2.0**jw]]), threshold=thr)
        assert str(exc.value) == message + RANGE


def test_risk_below_the_normal_range_is_refused_by_name():
    """Oracle: hand-derived. Tokens 1000, 1000, V = 1, W = 0: out = 1000, so the logistic risk is
    log(1 + e⁻¹⁰⁰⁰) ≈ e⁻¹⁰⁰⁰ = 10^−434.3, below 2.2e-308 (documented refusal, named)."""
    inst = line([1000.0, 1000.0])
    with pytest.raises(NumericalError) as exc:
        MT.multitoken_risk(inst, np.zeros((1, 1)), np.ones((1, 1)))
    assert str(exc.value) == "the multi-token risk L(W) is about 1e-434: it underflows " + RANGE


def test_gradient_below_the_normal_range_is_refused_by_name():
    """Oracle: hand-derived. Tokens 1, 0, z = 1, V = 2^−k, W = 0: s = (½, ½), Vᵀ Xᵀ s = 2^−k−1 > 0 so
    m = 1, values a = (2^−k, 0), out = 2^−k−1, ℓ'(≈0) = −½, and ∇L = ℓ'·Σ_t s_t(a_t − out)x_t z =
    −½·½·2^−k−1 = −2^−k−3. Exact for k = 1000; for k = 1020 it is −2^−1023 ≈ 1e-308, subnormal:
    refused, naming the gradient and the normalized gradient as the remedy."""
    inst = line([1.0, 0.0])
    g = MT.multitoken_grad(inst, np.zeros((1, 1)), np.array([[2.0**-1000]]))
    assert g == pytest.approx(np.array([[-(2.0**-1003)]]), rel=FEW_ULPS)
    with pytest.raises(NumericalError) as exc:
        MT.multitoken_grad(inst, np.zeros((1, 1)), np.array([[2.0**-1020]]))
    assert (
        str(exc.value)
        == f"the multi-token gradient ∇L(W) is about 1e-308: it underflows {RANGE}. {GRAD_REMEDY}"
    )


def test_uniform_attention_over_a_thousand_tokens_selects_every_token():
    """Documented: O_i = {t : s_it ≥ 10⁻³} is never empty (the top token has s ≥ 1/T), and the records
    carry |O_i|. Hand-derived boundary: T = 1000 equal tokens at W0 = 0 have s_it = 1/T = 10⁻³, the
    threshold itself, so every token is selected: |O_0| = 1000 in the record and in selected_sets."""
    inst = line([1.0] * 1000)
    tr = MT.run_multitoken_gd(inst, np.ones((1, 1)), 1, 0.1, record_at=[0])
    assert tr.record[0].set_sizes.tolist() == [1000]
    assert [len(O) for O in MT.selected_sets(inst, np.zeros((1, 1)))] == [1000]


# -------------------------------------------- the finite part at small logit gaps (issue 13 §1, mutation)
#: The base iterate of the small-gap cases: ``W_gd = c·G_BASE``.
G_BASE = np.array([[1.0, -2.0], [0.5, 3.0]])
#: Scales of the small-gap cases. Before the fix (log-ratios as differences of log-softmax values, relative
#: error eps/|gap|) W_fin's relative error was 6.5e-5 at 1e-12, 0.13 at 1e-15 and 1 (W_fin = 0) from 1e-17 on.
SMALL_SCALES = [1e-12, 1e-15, 1e-17, 1e-100, 2.0**-1000]
#: Significant digits the mpmath oracle keeps in the log-ratios log(s_t/s_t₁) (the working precision is
#: raised by the number of digits the ratios lie below 1, so that cancellation in the oracle leaves 50).
ORACLE_DIGITS = 50


def _gap_instance() -> A.Instance:
    """``A.random_instance(2, 3, 2, seed=3)``: n(T − 1) = 4 = d² equality rows spanning ℝ^{2×2}."""
    return A.random_instance(2, 3, 2, seed=3)


def _rel_fro(got: np.ndarray, want: np.ndarray) -> float:
    """``||got − want||_F / ||want||_F`` after an exact power-of-two rescaling (no underflow in the squares)."""
    e = math.frexp(float(np.max(np.abs(want))))[1]
    g, w = np.ldexp(got, -e), np.ldexp(want, -e)
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def _mp_finite_part(inst: A.Instance, W: np.ndarray) -> np.ndarray:
    """Oracle: W_fin from its definition at high precision (mpmath), independent of the package.

    Every token is selected here (the callers check it), so the constraints are, for each sequence i and
    t ≥ 1, ``(x_it − x_i0)ᵀ W z_i = log(s_it / s_i0)`` with ``s_i = softmax(X_i W z_i)`` evaluated in mpmath
    (logits, exponentials, the normaliser and the logarithm: no use of the identity that the package uses).
    The rows have full column rank (checked: ``det(AᵀA) ≠ 0``), so the consistent system has exactly one
    solution, the least-norm one, ``(AᵀA)⁻¹Aᵀb``.
    """
    scale = float(np.max(np.abs(W))) * float(np.max(np.abs(inst.X))) * float(np.max(np.abs(inst.z)))
    with mpmath.workdps(ORACLE_DIGITS + max(0, -math.floor(math.log10(scale)))):
        d = inst.d
        Wm = mpmath.matrix([[mpmath.mpf(float(W[j, k])) for k in range(d)] for j in range(d)])
        rows, b = [], []
        for i in range(inst.n):
            z = mpmath.matrix([mpmath.mpf(float(v)) for v in inst.z[i]])
            xs = [mpmath.matrix([mpmath.mpf(float(v)) for v in inst.X[i, t]]) for t in range(inst.T)]
            logits = [(x.T * Wm * z)[0] for x in xs]
            norm = mpmath.fsum(mpmath.exp(lg) for lg in logits)
            s = [mpmath.exp(lg) / norm for lg in logits]
            for t in range(1, inst.T):
                delta = xs[t] - xs[0]
                # column-major vec: entry j·d + k multiplies W[k, j]
                rows.append([z[j] * delta[k] for j in range(d) for k in range(d)])
                b.append(mpmath.log(s[t] / s[0]))
        Am, bm = mpmath.matrix(rows), mpmath.matrix(b)
        AtA = Am.T * Am
        assert mpmath.det(AtA) != 0  # full column rank: the solution is unique
        w = mpmath.lu_solve(AtA, Am.T * bm)
        return np.array([[float(w[j * d + k]) for j in range(d)] for k in range(d)])


@pytest.mark.parametrize("c", SMALL_SCALES)
def test_finite_part_at_small_gaps_is_the_iterate_itself(c):
    """Was: relative error 6.5e-5 at c = 1e-12, 0.13 at 1e-15, W_fin = 0 (error 1) at 1e-17 and below.

    Oracle (exact certificate and mpmath): at W_gd = c·G every s_it ≈ 1/3 ≥ 10⁻³, so every token is
    selected and W_dir = 0; the n(T − 1) = 4 = d² equality rows have full column rank (mpmath determinant),
    so the only W with the log-ratios of W_gd is W_gd itself: W_fin = W_gd. Independently, W_fin equals the
    mpmath least-norm solution of the defining system with b = log(s_it/s_i0) kept to 50 digits. Both to
    the certified solver's accuracy, with a certified finite-part solve."""
    inst = _gap_instance()
    Wg = c * G_BASE
    pr = MT.predict_multitoken(inst, Wg)
    assert [O.tolist() for O in pr.sets] == [[0, 1, 2], [0, 1, 2]]
    assert not np.any(pr.W_dir) and pr.R == 0.0 and pr.kkt_dir is None
    assert pr.kkt_fin is not None and pr.kkt_fin.max() <= CERTIFY_RTOL
    assert _rel_fro(pr.W_fin, Wg) <= SOLVER_RTOL
    assert _rel_fro(pr.W_fin, _mp_finite_part(inst, Wg)) <= SOLVER_RTOL
    assert pr.rel_error <= SOLVER_RTOL  # the prediction is W_fin (R = 0): W_gd to solver accuracy


def test_finite_part_is_linear_in_the_iterate_down_to_the_normal_range():
    """Oracle: scale equivariance W_fin(2^j·G) = 2^j·W_fin(G) (W_fin is the projection of W_gd onto the
    rows' span, linear in W_gd). A power of two leaves W_gd's mantissa unchanged, so the answer is the
    scale-1 one moved exactly: bitwise, wherever 2^j·W_fin is a normal double (j = −1000: max 3·2^−1000).
    At j = −1030 it is not (max|W_fin| = 3·2^−1030 ≈ 2.6e-310, subnormal): refused, naming W_fin."""
    inst = _gap_instance()
    ref = MT.predict_multitoken(inst, 2.0**-10 * G_BASE).W_fin  # every token selected from 2^−10 down
    for j in (-57, -333, -1000):
        got = MT.predict_multitoken(inst, np.ldexp(G_BASE, j - 10)).W_fin
        assert np.array_equal(got, np.ldexp(ref, j))
    with pytest.raises(NumericalError) as exc:
        MT.predict_multitoken(inst, np.ldexp(G_BASE, -1030))
    assert str(exc.value) == "the finite part W_fin is about 1e-310: it underflows " + RANGE


@pytest.mark.parametrize("w", [1e-8, 1e-15, 1.0])
def test_finite_part_of_a_line_at_a_tiny_gap_is_exact_and_certified(w):
    """Was: W = 1e-8 gave W_fin = 0 with kkt_fin.primal_feasibility = 1 (uncertified, returned), and
    W = 1e-15 a false InfeasibleSVMError ("the finite part W_fin is infeasible").

    Oracle: hand-derived and mpmath. d = 1, tokens 0, 1, 2, z = 1: logits (0, w, 2w), every token selected;
    the constraints are 1·W = log(s₁/s₀) = w and 2·W = log(s₂/s₀) = 2w, whose only solution is W = w; the
    mpmath evaluation of the definition (50 digits of the ratios) agrees."""
    inst = line([0.0, 1.0, 2.0])
    pr = MT.predict_multitoken(inst, np.array([[w]]))
    assert [O.tolist() for O in pr.sets] == [[0, 1, 2]]
    assert pr.kkt_fin is not None and pr.kkt_fin.max() <= CERTIFY_RTOL
    assert pr.W_fin[0, 0] == pytest.approx(w, rel=SOLVER_RTOL)
    assert pr.W_fin[0, 0] == pytest.approx(_mp_finite_part(inst, np.array([[w]]))[0, 0], rel=SOLVER_RTOL)


def _near_parallel(delta: float) -> A.Instance:
    """d = 2, tokens (0, 0), (1, 0), (1, δ), z = e₀: rows a_t = e₀ ⊗ (x_t − x_0) = (1, 0, 0, 0), (1, δ, 0, 0)."""
    X = np.array([[[0.0, 0.0], [1.0, 0.0], [1.0, delta]]])
    return A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]]))


def _gram_error_bound(delta: float) -> float:
    """Oracle of the solver's certificate: ``cond(K)·eps`` of the rows' Gram matrix ``K = [[1, 1], [1, 1 + δ²]]``
    (times 1/4 from the mantissas, which cond ignores), from its eigenvalues in mpmath at 40 digits."""
    with mpmath.workdps(40):
        d2 = mpmath.mpf(delta) ** 2
        K = mpmath.matrix([[1, 1], [1, 1 + d2]])
        ev = mpmath.eigsy(K)[0]
        return float(max(ev) / min(ev)) * float(np.finfo(np.float64).eps)


def test_finite_part_with_nearly_parallel_rows_is_certified_or_refused():
    """Was: an uncertified min-norm point returned without a word. Now the solve is refused when the
    solver cannot certify it.

    Oracle: mpmath condition number of the rows' Gram matrix (the certificate is cond(K_S)·eps ≤ 1e-9)
    and the exact projection. Every token is selected (W_gd = 10⁻³·G); the rows span {W : W[:, 1] = 0},
    so W_fin is W_gd's first column. δ = 10⁻²: cond·eps ≈ 8.9e-12, certified, W_fin = [W_gd[:, 0], 0].
    δ = 10⁻⁴: cond·eps ≈ 8.9e-8 > 1e-9: a SolverError naming the finite part and the cause."""
    Wg = 1e-3 * G_BASE
    assert _gram_error_bound(1e-2) <= CERTIFY_RTOL
    pr = MT.predict_multitoken(_near_parallel(1e-2), Wg)
    assert [O.tolist() for O in pr.sets] == [[0, 1, 2]]
    want = np.array([[Wg[0, 0], 0.0], [Wg[1, 0], 0.0]])
    assert np.max(np.abs(pr.W_fin - want)) <= SOLVER_RTOL * np.max(np.abs(Wg))
    assert _gram_error_bound(1e-4) > CERTIFY_RTOL
    with pytest.raises(SolverError) as exc:
        MT.predict_multitoken(_near_parallel(1e-4), Wg)
    msg = str(exc.value)
    assert msg.startswith(
        "the finite part W_fin could not be certified: its error bound cond(K_S)·eps is 8.9e-08"
    )
    assert "too close to linearly dependent for float64" in msg


def test_direction_svm_with_nearly_parallel_rows_is_certified_or_refused():
    """Oracle: hand-derived and the mpmath condition number as above. Tokens (0, 0), (1, 0), (1, δ),
    z = e₀, W_gd = [[0, 0], [−10/δ, 0]]: logits (0, 0, −10), so O = {0, 1} (s₂ ≈ 2.3e-5) and W_dir solves
    W₀₀ = 0 (equal logits of tokens 0, 1) and −W₀₀ − δW₁₀ ≥ 1 (margin against token 2) at least norm:
    W_dir = [[0, 0], [−1/δ, 0]]. δ = 10⁻²: certified, W_dir = −100·e₁e₀ᵀ; δ = 10⁻⁴: refused (SolverError)."""
    for delta, certified in ((1e-2, True), (1e-4, False)):
        assert (_gram_error_bound(delta) <= CERTIFY_RTOL) is certified
        Wg = np.array([[0.0, 0.0], [-10.0 / delta, 0.0]])
        if certified:
            pr = MT.predict_multitoken(_near_parallel(delta), Wg)
            assert [O.tolist() for O in pr.sets] == [[0, 1]]
            want = np.array([[0.0, 0.0], [-1.0 / delta, 0.0]])
            assert np.max(np.abs(pr.W_dir - want)) <= SOLVER_RTOL / delta
        else:
            with pytest.raises(SolverError, match="^the direction SVM W_dir could not be certified: "):
                MT.predict_multitoken(_near_parallel(delta), Wg)


def test_fitted_scale_alone_out_of_range_is_refused_by_name():
    """Oracle: hand-derived (d = 1, tokens a, 0, z = a with a = 2⁴⁰, W_gd = 2¹⁰⁰⁰, threshold ½, so O = {0}):
    W_dir = 1/a² = 2⁻⁸⁰, W_fin = 0 and the prediction R·W_dir = W_gd = 2¹⁰⁰⁰ are normal doubles, but
    R = ⟨W_gd, W_dir⟩/||W_dir||² = W_gd·a² = 2¹⁰⁸⁰ ≈ 1e325 is not: refused, naming R. At W_gd = 2⁹⁰⁰ every
    field is representable: R = 2⁹⁸⁰ and the prediction is W_gd, exactly up to the solver's accuracy."""
    inst = line([2.0**40, 0.0], z=2.0**40)
    pr = MT.predict_multitoken(inst, np.array([[2.0**900]]), threshold=0.5)
    assert pr.W_dir[0, 0] == pytest.approx(2.0**-80, rel=SOLVER_RTOL)
    assert pr.R == pytest.approx(2.0**980, rel=SOLVER_RTOL)
    assert pr.prediction[0, 0] == pytest.approx(2.0**900, rel=SOLVER_RTOL)
    with pytest.raises(NumericalError) as exc:
        MT.predict_multitoken(inst, np.array([[2.0**1000]]), threshold=0.5)
    assert str(exc.value) == (
        "the fitted scale R of the prediction W_fin + R·W_dir is about 1e+325: it overflows " + RANGE
    )
