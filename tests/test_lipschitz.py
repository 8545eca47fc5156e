"""Unit tests of attnsvm.lipschitz: certified bounds, attained estimates, the softmax/linear comparison.

What is shown:

* the logit map's norm from the factorised Gram equals the norm of the explicit Kronecker matrix;
* soundness: no sampled pair ``(W1, W2)`` in the ball and no attained estimate exceeds the bound,
  over instance families, kinds, maps and radii up to ``1e3`` (softmax fully saturated);
* ``softmax ≤ ½ · linear`` and ``normalized_linear ≤ ½ · linear`` for the certified weights bounds;
* for ``linear`` the estimate equals the exact operator norm up to rounding;
* the Jacobian factors behind the bounds survive an adversarial search (the normalized-linear
  Jacobian ``(diag s − ssᵀ) diag r`` has norm ≤ ½ although it is not symmetric; the output factor
  ``||s∘(a − f)|| ≤ (√2/4)(max a − min a)`` is tight);
* where the orderings fail, the exact condition and a pinned minimal counterexample:
  softmax *output* vs linear *output*, and softmax vs normalized_linear *weights*;
* bad input raises ``AttnSVMError`` with a message that says what to do.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, InvalidInstanceError, NumericalError, UnknownNameError
from attnsvm.lipschitz import (
    SPREAD_FACTOR,
    LipschitzBound,
    LipschitzEstimate,
    bound_rounding_rtol,
    compare_lipschitz,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
    logit_gram,
    logit_norm,
)
from attnsvm.strategies import scaled

EPS = float(np.finfo(np.float64).eps)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")

#: Search budget of the estimates in these tests (small, to keep the file under a minute).
FAST = {"samples": 8, "steps": 8, "starts": 2}


def est_rtol(inst: A.Instance) -> float:
    """Relative rounding of an estimate: the SVD of the ``(nT) × d²`` Jacobian is backward stable,
    so its largest singular value is within ``c·max(nT, d²)·eps`` of the exact one; ``c = 4``."""
    return 4.0 * max(inst.n * inst.T, inst.d**2) * EPS


def pair_atol(inst: A.Instance, W: np.ndarray, of: str) -> float:
    """Absolute float64 error of a computed ``s(W)`` (or ``f(W)``), ℓ2 over all entries.

    Each logit is two length-``d`` products: error ≤ ``2d·eps·||x_it|| ||W||_F ||z_i||``. Every kind's
    weights are 1-Lipschitz in the logits (softmax and normalized_linear ½, ``log φ`` is 1-Lipschitz),
    and exp/normalisation add ≤ ``4T·eps`` per entry; the output multiplies by ``|a_it|`` and sums
    ``T`` terms. Doubled for safety of the constants (not tuned to pass).
    """
    c = np.linalg.norm(inst.X, axis=-1) * np.linalg.norm(inst.z, axis=1)[:, None]
    logit_err = 2 * inst.d * EPS * np.linalg.norm(c) * np.linalg.norm(W)
    base = logit_err + 4 * inst.T * EPS * math.sqrt(inst.n * inst.T)
    if of == "output":
        base *= inst.T * (1.0 + float(np.max(np.abs(inst.values()))))
    return 2.0 * base


def evaluate(inst: A.Instance, W: np.ndarray, kind: str, of: str) -> np.ndarray:
    return A.attention(inst, W, kind=kind).ravel() if of == "weights" else A.output(inst, W, kind=kind)


def in_ball(rng: np.random.Generator, d: int, R: float, scale: float | None = None) -> np.ndarray:
    g = rng.standard_normal((d, d))
    g /= np.linalg.norm(g)
    r = R * rng.random() ** (1.0 / (d * d)) if scale is None else min(R, scale)
    return r * g


def project(W: np.ndarray, R: float) -> np.ndarray:
    nrm = np.linalg.norm(W)
    return W * (R / nrm) if nrm > R else W


# ----------------------------------------------------------------------------- the logit map
@pytest.mark.parametrize("family", ["gaussian", "unit", "self_attention"])
def test_logit_gram_equals_explicit_kronecker_rows(family: str) -> None:
    inst = A.random_instance(3, 4, 5, seed=11, family=family)
    # Explicit rows: l_it = (z_i ⊗ x_it)ᵀ vec(W), column-major vec (attnsvm.lipschitz module docstring).
    rows = np.array([np.kron(inst.z[i], inst.X[i, t]) for i in range(inst.n) for t in range(inst.T)])
    W = np.random.default_rng(0).standard_normal((inst.d, inst.d))
    np.testing.assert_allclose(rows @ A.vec(W), A.logits(inst, W).ravel(), rtol=0, atol=64 * EPS * 100)
    G = logit_gram(inst)
    # Entries: a d²-long dot product vs. a product of two d-long ones, each ≤ d²·eps relative to
    # |z_i||z_j||x_it||x_ju| ≤ max|G| (Cauchy–Schwarz on the PSD Gram).
    gram_atol = 4 * inst.d**2 * EPS * float(np.max(np.abs(G)))
    np.testing.assert_allclose(G, rows @ rows.T, rtol=0, atol=gram_atol)
    # Operator norm: SVD of the explicit matrix vs eigenvalue of the Gram, both backward stable.
    sv = np.linalg.svd(rows, compute_uv=False)[0]
    assert abs(logit_norm(inst) - sv) <= 8 * (inst.n * inst.T + inst.d**2) * EPS * sv


# ----------------------------------------------------------------------------- linear: exact
@pytest.mark.parametrize("family", ["gaussian", "unit", "self_attention"])
@pytest.mark.parametrize("of", OFS)
def test_linear_estimate_equals_bound_up_to_rounding(family: str, of: str) -> None:
    inst = A.random_instance(3, 4, 5, seed=5, family=family)
    b = lipschitz_bound(inst, kind="linear", radius=2.0, of=of)
    e = lipschitz_estimate(inst, kind="linear", radius=2.0, of=of, **FAST)
    # Two backward-stable computations of one singular value: the Gram eigenvalue (error
    # ≤ c·nT·eps relative, halved by the root) and the SVD of the autograd Jacobian (est_rtol).
    tol = est_rtol(inst) + bound_rounding_rtol(inst)
    assert abs(e.value - b.nominal) <= tol * b.nominal
    assert e.value <= b.value * (1 + est_rtol(inst))
    # radius-independent
    assert float(lipschitz_bound(inst, kind="linear", radius=1e3, of=of)) == b.value


# ----------------------------------------------------------------------------- soundness
SOUND_CASES = [
    (fam, seed, shape)
    for fam, seed, shape in [
        ("gaussian", 1, (2, 3, 3)),
        ("unit", 2, (3, 4, 4)),
        ("self_attention", 3, (2, 5, 3)),
        ("gaussian", 4, (1, 2, 2)),
    ]
]
RADII = (0.05, 1.0, 10.0, 1e3)


@pytest.mark.parametrize("family,seed,shape", SOUND_CASES)
def test_bounds_sound_on_sampled_pairs_and_estimates(
    family: str, seed: int, shape: tuple[int, int, int]
) -> None:
    inst = A.random_instance(*shape, seed=seed, family=family)
    rng = np.random.default_rng(100 + seed)
    c = np.linalg.norm(inst.X, axis=-1) * np.linalg.norm(inst.z, axis=1)[:, None]
    for R in RADII:
        for of in OFS:
            for kind in KINDS:
                b = lipschitz_bound(inst, kind=kind, radius=R, of=of)
                e = lipschitz_estimate(inst, kind=kind, radius=R, of=of, seed=seed, **FAST)
                assert np.linalg.norm(e.W) <= R * (1 + 4 * EPS)
                assert e.value <= b.value * (1 + est_rtol(inst)), (kind, of, R, e.value, b.value)
                centres = [e.W] + [in_ball(rng, inst.d, R) for _ in range(3)]
                # points where the logits are O(1), the regime where the Jacobian is largest
                centres += [in_ball(rng, inst.d, R, scale=1.0 / float(np.max(c))) for _ in range(2)]
                for W1 in centres:
                    for h in (R, 1e-2 * R, 1e-5 * R):
                        W2 = project(W1 + h * rng.standard_normal((inst.d, inst.d)) / inst.d, R)
                        lhs = np.linalg.norm(evaluate(inst, W1, kind, of) - evaluate(inst, W2, kind, of))
                        rhs = b.value * np.linalg.norm(W1 - W2)
                        atol = pair_atol(inst, W1, of) + pair_atol(inst, W2, of)
                        assert lhs <= rhs + atol, (kind, of, R, h, lhs, rhs)


def test_estimate_value_is_attained_at_its_point() -> None:
    inst = A.random_instance(2, 3, 3, seed=8, family="gaussian")
    for kind in KINDS:
        e = lipschitz_estimate(inst, kind=kind, radius=3.0, **FAST)

        def F(w: np.ndarray, kind: str = kind) -> np.ndarray:
            return evaluate(inst, w.reshape(3, 3), kind, "weights")

        assert isinstance(e, LipschitzEstimate) and float(e) == e.value
        assert jacobian_norm(inst, e.W, kind=kind) == e.value
        # the factorised search value (λ_max(D G Dᵀ)^½) and the full Jacobian SVD agree
        assert abs(e.search_value - e.value) <= (est_rtol(inst) + bound_rounding_rtol(inst)) * e.value
        # an independent Jacobian by central differences of the numpy attention: error
        # ≤ h²·M₃/6 + eps/h per entry; with h = 1e-5 both are ≤ 1e-9 for O(1) derivatives.
        Wv = e.W.reshape(-1)
        J_fd = np.empty((inst.n * inst.T, 9))
        for k in range(9):
            dv = np.zeros(9)
            dv[k] = 1e-5
            J_fd[:, k] = (F(Wv + dv) - F(Wv - dv)) / 2e-5
        FD_RTOL = 1e-6  # h² M₃ + eps/h with h = 1e-5 and O(1)-sized derivatives, with margin
        assert abs(np.linalg.svd(J_fd, compute_uv=False)[0] - e.value) <= FD_RTOL * max(1.0, e.value)


def test_estimate_is_deterministic_for_a_seed() -> None:
    inst = A.random_instance(2, 3, 3, seed=9, family="unit")
    e1 = lipschitz_estimate(inst, kind="softmax", radius=5.0, seed=3, **FAST)
    e2 = lipschitz_estimate(inst, kind="softmax", radius=5.0, seed=3, **FAST)
    assert e1.value == e2.value and np.array_equal(e1.W, e2.W)


# ----------------------------------------------------------------------------- softmax ≤ ½ linear
@pytest.mark.parametrize("family", ["gaussian", "unit", "self_attention"])
def test_normalised_kinds_weights_bound_at_most_half_linear(family: str) -> None:
    """Unit test of the bound's *formula*: ``bound(softmax) ≤ ½ · bound(linear)`` holds by
    construction (the cap ``½||𝓛||`` is one of the candidates, same ``||𝓛||`` and allowance), exactly
    in floating point. It is not evidence for the theorem; the theorem is checked on attained
    constants against an independent Jacobian in
    ``test_attained_weights_constant_at_most_half_linear_svd``."""
    for seed in range(4):
        inst = A.random_instance(3, 4, 3, seed=seed, family=family)
        lin = lipschitz_bound(inst, kind="linear", of="weights")
        for R in (1e-3, 0.5, 1.0, 10.0, 1e6):
            for kind in ("softmax", "normalized_linear"):
                b = lipschitz_bound(inst, kind=kind, radius=R, of="weights")
                assert isinstance(b, LipschitzBound)
                # exact in floating point: the cap ½||L|| is one of the candidates, and the
                # rounding allowance depends on the instance's sizes only
                assert b.value <= 0.5 * lin.value
                assert b.jacobian_factor <= 0.5 and b.logit_norm == lin.logit_norm
            # on large balls the cap is what certifies: the radius bound p_i → 1
        big = lipschitz_bound(inst, kind="softmax", radius=1e6)
        assert big.value == 0.5 * lin.value


def _explicit_jacobian(inst: A.Instance, kind: str, W: np.ndarray) -> np.ndarray:
    """``∂ vec s / ∂ vec W`` (rows (i, t), columns (j, k) of ``W``) of an independent torch
    implementation (torch softmax / elu, not attnsvm), by ``torch.autograd.functional.jacobian``."""
    X, z = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (inst.X, inst.z))

    def s(Wt: torch.Tensor) -> torch.Tensor:
        lg = torch.einsum("ntd,de,ne->nt", X, Wt, z)
        if kind == "softmax":
            return torch.softmax(lg, dim=1).reshape(-1)
        phi = torch.nn.functional.elu(lg) + 1.0
        return (phi / phi.sum(dim=1, keepdim=True)).reshape(-1)

    J = torch.autograd.functional.jacobian(s, torch.tensor(W, dtype=torch.float64))
    return np.asarray(J.reshape(inst.n * inst.T, -1).numpy())


@pytest.mark.parametrize("family", ["gaussian", "unit", "self_attention"])
@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_attained_weights_constant_at_most_half_linear_svd(family: str, kind: str) -> None:
    """The theorem behind ``softmax ≤ ½ · linear`` (``||diag(s) − ssᵀ||₂ ≤ ½``; ``≤ ½`` also for
    ``φ = elu + 1``), on *attained* constants: the estimate's attaining point (``lipschitz_estimate``)
    and sampled points, each evaluated by the SVD of an explicit Jacobian of an independent torch
    implementation, stay below ½ · the exact linear constant, ``||𝓛||₂`` from the SVD of the explicit
    Kronecker rows ``z_i ⊗ x_it``. Tolerance: two backward-stable SVDs (``est_rtol`` each)."""
    rng = np.random.default_rng(3)
    for seed in range(3):
        inst = A.random_instance(3, 4, 3, seed=seed, family=family)
        rows = np.array([np.kron(inst.z[i], inst.X[i, t]) for i in range(inst.n) for t in range(inst.T)])
        lin = float(np.linalg.svd(rows, compute_uv=False)[0])
        for R in (0.5, 3.0, 30.0):
            e = lipschitz_estimate(inst, kind=kind, radius=R, seed=seed, **FAST)
            points = [e.W, np.zeros((3, 3))] + [in_ball(rng, 3, R) for _ in range(3)]
            for W in points:
                attained = float(np.linalg.svd(_explicit_jacobian(inst, kind, W), compute_uv=False)[0])
                assert attained <= 0.5 * lin * (1 + 2 * est_rtol(inst))
            # the estimate is the attained value at its point (same independent Jacobian)
            ref = float(np.linalg.svd(_explicit_jacobian(inst, kind, e.W), compute_uv=False)[0])
            assert abs(e.value - ref) <= 2 * est_rtol(inst) * ref


def test_small_radius_bound_tends_to_uniform_jacobian() -> None:
    """At ``R → 0`` the weights are uniform, ``||diag(s) − ssᵀ|| = 1/T``; the bound's factor → 1/T."""
    inst = A.random_instance(2, 5, 3, seed=1)
    b = lipschitz_bound(inst, kind="softmax", radius=1e-9)
    # p_i = 1/(1 + Σ e^{−Rδ}) = 1/T + O(R·max δ); with R = 1e-9 and δ = O(10) the excess is ≤ 1e-7.
    assert abs(b.jacobian_factor - 1 / inst.T) <= 1e-7
    e = lipschitz_estimate(inst, kind="softmax", radius=1e-9, **FAST)
    # the attained value is ||blockdiag((1/T)(I − 11ᵀ/T)) 𝓛|| ≤ (1/T)||𝓛|| ≈ the bound
    assert e.value <= b.value * (1 + est_rtol(inst))
    assert b.value <= (1 / inst.T) * (1 + 1e-6) * b.logit_norm


def test_max_weight_bound_sound_and_attained() -> None:
    """``p_i ≥ max_t s_it`` on the ball (sampled), with equality where the logit bounds are attained.

    softmax, ``T = 2``: ``W = R (x₁ − x₂) zᵀ / (||x₁ − x₂|| ||z||)`` gives ``l₁ − l₂ = R ||x₁ − x₂|| ||z||``,
    so ``s₁ = σ(R δ) = p``. normalized_linear with ``x₂ = −2x₁``: ``W = R x̂₁ ẑᵀ`` gives ``l₁ = R c₁``
    and ``l₂ = −R c₂`` at once, the two extremes the bound uses.
    """
    from attnsvm.lipschitz._bound import _max_weight_bound

    SIGMOID_RTOL = 16 * EPS  # a log-sum-exp and an exp, a few roundings each
    inst = _two_token((1.0, 0.5), (-0.5, 2.0), z=(0.7, -0.2))
    for R in (0.1, 1.0, 5.0):
        x1, x2 = inst.X[0]
        zz = inst.z[0]
        dx = x1 - x2
        W = R * np.outer(dx, zz) / (np.linalg.norm(dx) * np.linalg.norm(zz))
        s1 = A.attention(inst, W, kind="softmax")[0, 0]
        p = _max_weight_bound(inst, "softmax", R)[0]
        assert abs(p - s1) <= SIGMOID_RTOL
    anti = _two_token((1.0, 0.5), (-2.0, -1.0), z=(0.7, -0.2))
    for R in (0.1, 1.0, 5.0):
        x1 = anti.X[0, 0]
        zz = anti.z[0]
        W = R * np.outer(x1, zz) / (np.linalg.norm(x1) * np.linalg.norm(zz))
        s1 = A.attention(anti, W, kind="normalized_linear")[0, 0]
        p = _max_weight_bound(anti, "normalized_linear", R)[0]
        assert abs(p - s1) <= SIGMOID_RTOL
    rng = np.random.default_rng(4)
    for family in ("gaussian", "unit", "self_attention"):
        big = A.random_instance(3, 5, 3, seed=6, family=family)
        for R in (0.05, 0.5, 2.0):
            for kind in ("softmax", "normalized_linear"):
                p = _max_weight_bound(big, kind, R)
                for _ in range(50):
                    W = in_ball(rng, 3, R)
                    W = W * (R / np.linalg.norm(W))  # the sphere: the largest logits
                    assert np.all(A.attention(big, W, kind=kind).max(axis=1) <= p * (1 + SIGMOID_RTOL))


# ----------------------------------------------------------------------------- Jacobian factors
def _adversarial_max(fn, dim: int, seeds: int, iters: int) -> float:
    best = -math.inf
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        p = (3.0 * torch.randn(dim, generator=g, dtype=torch.float64)).requires_grad_(True)
        opt = torch.optim.Adam([p], lr=0.05)
        for _ in range(iters):
            opt.zero_grad()
            (-fn(p)).backward()
            opt.step()
        best = max(best, float(fn(p.detach())))
    return best


@pytest.mark.parametrize("T", [2, 3, 5, 8])
def test_normalized_linear_jacobian_norm_at_most_half_adversarial(T: int) -> None:
    """``||diag(s∘r) − s(s∘r)ᵀ||₂ ≤ min(½, max s)`` for every ``s`` in the simplex and ``r ∈ (0, 1]``.

    The matrix is not symmetric; it factors as ``(diag s − ssᵀ) diag r``. An adversarial search
    over free ``(s, r)`` (a superset of what ``φ = elu + 1`` can produce) stays below ½.
    """

    def norm(p: torch.Tensor) -> torch.Tensor:
        s = torch.softmax(p[:T], 0)
        r = torch.sigmoid(p[T:])
        w = s * r
        return torch.linalg.matrix_norm(torch.diag(w) - torch.outer(s, w), 2)

    best = _adversarial_max(norm, 2 * T, seeds=3, iters=250)
    SVD_RTOL = 8 * T * EPS  # rounding of a T × T spectral norm
    assert best <= 0.5 * (1 + SVD_RTOL)
    assert best >= 0.45  # the search reaches the supremum region (½ at s = (½, ½, 0, ...), r = 1)
    # and the max-weight factor: random (s, r)
    rng = np.random.default_rng(T)
    for _ in range(200):
        s = rng.dirichlet(np.full(T, 0.3))
        r = rng.uniform(0, 1, T)
        J = np.diag(s * r) - np.outer(s, s * r)
        assert np.linalg.norm(J, 2) <= min(0.5, s.max()) * (1 + SVD_RTOL)


def test_normalized_linear_autograd_jacobian_factorises() -> None:
    """The torch Jacobian of ``φ(l)/1ᵀφ(l)`` equals ``(diag s − ssᵀ) diag(φ'/φ)``, ``φ = elu + 1``."""
    from attnsvm.lipschitz._heads import _torch_head

    head = _torch_head("normalized_linear", "weights")
    rng = np.random.default_rng(0)
    for _ in range(20):
        l = torch.as_tensor(rng.normal(scale=3, size=5))
        J = torch.func.jacrev(head)(l, torch.zeros(5)).numpy()
        ln = l.numpy()
        phi = np.where(ln > 0, 1 + ln, np.exp(np.minimum(ln, 0)))
        r = np.where(ln > 0, 1 / (1 + np.maximum(ln, 0)), 1.0)
        s = phi / phi.sum()
        np.testing.assert_allclose(J, (np.diag(s) - np.outer(s, s)) @ np.diag(r), rtol=0, atol=32 * EPS)
        assert np.all((r > 0) & (r <= 1))


@pytest.mark.parametrize("T", [2, 3, 6])
def test_output_factor_spread_bound_adversarial_and_tight(T: int) -> None:
    """``||s∘(a − f)||₂ ≤ (√2/4)(max a − min a)``, ``f = sᵀa``; equality at ``T = 2``, ``s = (½, ½)``."""

    def ratio(p: torch.Tensor) -> torch.Tensor:
        s = torch.softmax(p[:T], 0)
        a = p[T:]
        f = (s * a).sum()
        return torch.linalg.vector_norm(s * (a - f)) / (a.max() - a.min())

    best = _adversarial_max(ratio, 2 * T, seeds=3, iters=250)
    assert best <= SPREAD_FACTOR * (1 + 16 * T * EPS)  # T-term sums, a few roundings each
    s = np.array([0.5, 0.5])
    a = np.array([0.0, 1.0])
    assert abs(np.linalg.norm(s * (a - s @ a)) - SPREAD_FACTOR) <= 4 * EPS


# ----------------------------------------------------------------------------- where orderings fail
def _two_token(x1, x2, v=(1.0, 0.0), z=(1.0, 0.0)) -> A.Instance:
    return A.Instance(np.array([[x1, x2]], dtype=float), np.array([1.0]), np.array(v), np.array([z]))


def test_counterexample_softmax_output_less_stable_than_linear_output() -> None:
    """Refutes "softmax output is more stable than linear output" (for any constant factor).

    Exact condition for ``n = 1, T = 2`` (every radius): the softmax output Jacobian is
    ``s₁s₂ (a₁ − a₂) z ⊗ (x₁ − x₂)``, maximal at ``s = (½, ½)`` (``W = 0``), so
    ``Lip_softmax,out = ¼ ||z|| |a₁ − a₂| ||x₁ − x₂||``, while ``Lip_linear,out = ||z|| ||a₁x₁ + a₂x₂||``.
    Softmax is less stable iff ``|a₁ − a₂| ||x₁ − x₂|| > 4 ||a₁x₁ + a₂x₂||``. Minimal case (d = 2):
    ``x₁ = (ε, 0), x₂ = (0, 1), v = z = e₁``: ``a = (ε, 0)``, linear ``ε²``, softmax
    ``(ε/4)√(1 + ε²)``; the ratio ``√(1+ε²)/(4ε)`` is unbounded as ``ε → 0`` (fails for ε < 1/√15).
    Mechanism: linear attention ignores a zero-value token entirely, softmax does not, since moving
    weight onto it changes ``f`` through the normalisation.
    """
    for eps_ in (0.1, 0.01):
        inst = _two_token((eps_, 0.0), (0.0, 1.0))
        lin = lipschitz_bound(inst, kind="linear", of="output")  # exact norm
        assert abs(lin.nominal - eps_**2) <= 8 * EPS * eps_**2
        closed = eps_ / 4 * math.sqrt(1 + eps_**2)
        at_zero = jacobian_norm(inst, np.zeros((2, 2)), kind="softmax", of="output")
        assert abs(at_zero - closed) <= 8 * EPS * closed
        for R in (1e-3, 1.0, 1e3):
            est = lipschitz_estimate(inst, kind="softmax", radius=R, of="output", **FAST)
            assert est.value >= at_zero  # the origin is a candidate
            assert est.value <= closed * (1 + est_rtol(inst))  # the closed form is the supremum
            assert est.value > lin.value  # the ordering fails, on every ball
        assert closed / lin.nominal >= 1 / (4 * eps_)
    # The boundary of the condition: ε = 1/√15 gives equality; ε = 0.3 (> 1/√15) keeps the ordering.
    inst = _two_token((0.3, 0.0), (0.0, 1.0))
    assert 0.3 / 4 * math.sqrt(1 + 0.09) < lipschitz_bound(inst, kind="linear", of="output").nominal


def test_counterexample_normalized_linear_weights_less_stable_than_softmax() -> None:
    """Refutes "softmax weights ≤ normalized_linear weights" as a universal ordering (the converse of
    the seed's ranking if one reads φ = elu + 1 attention as the linear competitor).

    Facts: (i) at ``W = 0`` both kinds have the same Jacobian (``φ(0) = φ'(0) = 1``), so
    ``Lip_nl(R) ≥ ||J(0)||₂`` always; (ii) for ``n = 1, T = 2`` the softmax Jacobian is
    ``s₁s₂ (1, −1)ᵀ z ⊗ (x₁ − x₂)`` with supremum at ``W = 0``, so ``Lip_softmax = (√2/4)||z|| ||x₁ − x₂||``
    exactly and ``Lip_nl(R) ≥ Lip_softmax(R)`` for every such instance and radius. Strict when the
    tokens are nearly parallel: the normalized-linear Jacobian is ``s₁s₂ (1, −1)ᵀ z ⊗ (r₁x₁ − r₂x₂)``
    and ``r = φ'/φ`` differs between tokens once a logit is positive. Minimal case (d = 2):
    ``x₁ = (1, 0), x₂ = (1, δ), z = e₁, W = (2/δ) e₂e₁ᵀ`` (``l = (0, 2)``, ``||W||_F = 2/δ``):
    ``||J_nl|| = √2 (3/16) ||(2/3, −δ/3)||`` vs ``(√2/4) δ``; softmax is more stable iff
    ``δ ≳ ½`` here, and needs ``R ≥ 2/δ``.
    """
    delta = 0.1
    inst = _two_token((1.0, 0.0), (1.0, delta))
    exact_softmax = math.sqrt(2) / 4 * delta
    R = 2 / delta
    W = np.array([[0.0, 0.0], [R, 0.0]])
    nl_at_W = jacobian_norm(inst, W, kind="normalized_linear")
    closed = math.sqrt(2) * 3 / 16 * math.hypot(2 / 3, delta / 3)
    assert abs(nl_at_W - closed) <= 64 * EPS
    assert nl_at_W > 4 * exact_softmax
    e_sm = lipschitz_estimate(inst, kind="softmax", radius=R, **FAST)
    assert e_sm.value <= exact_softmax * (1 + est_rtol(inst))  # the closed form is the supremum
    assert abs(jacobian_norm(inst, np.zeros((2, 2)), kind="softmax") - exact_softmax) <= 8 * EPS
    # the default search (not FAST) finds a point nearly as good as the pinned one by itself
    e_nl = lipschitz_estimate(inst, kind="normalized_linear", radius=R)
    assert e_nl.value > 4 * e_sm.value
    # the certified bounds cannot see the difference: both are ½||𝓛|| on this ball
    assert (
        lipschitz_bound(inst, kind="softmax", radius=R).value
        == lipschitz_bound(inst, kind="normalized_linear", radius=R).value
    )


def test_softmax_and_normalized_linear_agree_at_origin() -> None:
    for seed in range(3):
        inst = A.random_instance(2, 4, 3, seed=seed)
        Z = np.zeros((3, 3))
        for of in OFS:
            a = jacobian_norm(inst, Z, kind="softmax", of=of)
            b = jacobian_norm(inst, Z, kind="normalized_linear", of=of)
            assert abs(a - b) <= est_rtol(inst) * max(a, b)


# ----------------------------------------------------------------------------- comparison helper
def test_compare_lipschitz_rows() -> None:
    insts = [A.random_instance(2, 3, 3, seed=s) for s in range(2)]
    radii = [0.5, 5.0]
    radii_before = list(radii)
    rows = compare_lipschitz(insts, radii, of="weights", samples=4, steps=4)
    assert radii == radii_before
    assert len(rows) == 4
    for row in rows:
        for kind in KINDS:
            assert row[f"gap_{kind}"] >= 1.0 - est_rtol(insts[0])
        assert row["bound_ratio_softmax/linear"] <= 0.5  # by construction of the bound
        # the theorem on attained constants (the linear estimate is the exact ||𝓛||₂ up to its SVD)
        assert row["estimate_ratio_softmax/linear"] <= 0.5 * (1 + 2 * est_rtol(insts[0]))
        assert row["estimate_ratio_softmax/linear"] == row["estimate_softmax"] / row["estimate_linear"]
        assert (
            row["bound_ratio_softmax/normalized_linear"]
            == row["bound_softmax"] / row["bound_normalized_linear"]
        )


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("radius", [0, 0.0, -1.0, float("nan"), float("inf"), "1", None, True])
def test_bad_radius(radius: object) -> None:
    inst = A.random_instance(1, 2, 2)
    with pytest.raises(AttnSVMError, match="radius"):
        lipschitz_bound(inst, kind="softmax", radius=radius)  # type: ignore[arg-type]
    with pytest.raises(AttnSVMError, match="radius"):
        lipschitz_estimate(inst, kind="softmax", radius=radius)  # type: ignore[arg-type]
    with pytest.raises(AttnSVMError, match="radius"):
        compare_lipschitz([inst], [radius])  # type: ignore[list-item]


def test_bad_names() -> None:
    inst = A.random_instance(1, 2, 2)
    for fn in (lipschitz_bound, lipschitz_estimate):
        with pytest.raises(UnknownNameError, match="attention kind"):
            fn(inst, kind="relu")
        with pytest.raises(UnknownNameError, match="'weights', 'output'"):
            fn(inst, kind="softmax", of="logits")
        with pytest.raises(AttnSVMError, match="only .* wrt='W'"):
            fn(inst, kind="softmax", wrt="X")
    with pytest.raises(UnknownNameError):
        compare_lipschitz([inst], [1.0], of="gradient")
    with pytest.raises(AttnSVMError, match="Instance"):
        compare_lipschitz([inst.X], [1.0])  # type: ignore[list-item]


def test_bad_search_settings_and_weights() -> None:
    inst = A.random_instance(1, 2, 2)
    for kw in ({"samples": -1}, {"steps": 1.5}, {"starts": 0}, {"seed": "a"}, {"samples": True}):
        with pytest.raises(AttnSVMError):
            lipschitz_estimate(inst, **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidInstanceError, match="shape"):
        jacobian_norm(inst, np.zeros((3, 3)))
    W = np.array([[np.nan, 0.0], [0.0, 0.0]])
    with pytest.raises(InvalidInstanceError, match="finite"):
        jacobian_norm(inst, W)
    W_in = np.ones((2, 2))
    W_copy = W_in.copy()
    jacobian_norm(inst, W_in)
    assert np.array_equal(W_in, W_copy)


def test_overflowing_radius_raises_not_nan() -> None:
    """Logits beyond float64 range give a NumericalError, never a NaN estimate."""
    inst = _two_token((10.0, 10.0), (1.0, 0.0), z=(10.0, 10.0))
    W = np.full((2, 2), 1e308)  # logits ≈ 4e310: inf in float64
    for kind in ("softmax", "normalized_linear"):
        with pytest.raises(NumericalError, match="not finite"):
            jacobian_norm(inst, W, kind=kind)
    # the linear Jacobian does not depend on W: still exact there
    lin = jacobian_norm(inst, W, kind="linear")
    assert abs(lin - logit_norm(inst)) <= est_rtol(inst) * lin
    # saturated but finite logits (≈ 1e307): the true Jacobian is positive (its size is e^{-1e307}),
    # far below the float64 resolution of the autograd Jacobian; a 0 would be a silent wrong answer,
    # so the scale contract asks for an error that names the cause
    with pytest.raises(NumericalError, match="below the rounding level.*saturated"):
        jacobian_norm(A.random_instance(1, 2, 2, seed=0), np.full((2, 2), 1e308), kind="softmax")
    b = lipschitz_bound(inst, kind="softmax", radius=1e300)
    assert math.isfinite(b.value)


@pytest.mark.parametrize("c", [1e-160, 1e150])
def test_linear_bounds_homogeneous_at_extreme_scales(c):
    """||𝓛||₂ and ||A𝓛||₂ are homogeneous: scaling the tokens by c scales the linear weights bound
    by c and the linear output bound by c² (values a = vᵀx scale by c too). The Gram entries of the
    scaled data under- or overflow float64 (c⁴ = 1e-640 / 1e600), so this fails unless the bound
    rescales the data before forming them (found by the property suite at v = 1e-300). Tolerance:
    both sides are computed to ~100 ulps (eigvalsh plus the rounding allowance of the bound).
    Where ``c² · ref`` is below the normal range (1e-160: ~1e-319) the scale contract asks for a
    NumericalError naming the underflow instead of a subnormal number with lost digits."""
    inst = A.random_instance(2, 3, 4, seed=5)
    big = A.Instance(c * inst.X, inst.Y, inst.v, inst.z)
    for of, power in (("weights", 1), ("output", 2)):
        ref = float(lipschitz_bound(inst, kind="linear", radius=1.0, of=of))
        log_expected = power * math.log(c) + math.log(ref)
        if log_expected > math.log(np.finfo(np.float64).tiny):
            got = float(lipschitz_bound(big, kind="linear", radius=1.0, of=of))
            assert got == pytest.approx(c**power * ref, rel=1e-13)
        else:
            with pytest.raises(NumericalError, match="underflows float64's normal range"):
                lipschitz_bound(big, kind="linear", radius=1.0, of=of)


# ============================================================================= pinned by mutation testing
# Contracts that mutation testing (issue 13 §4, tools/mutation.py) found open: exact error messages,
# the table rows of compare_lipschitz (keys, ratios at 0, the search settings passed through and the
# defaults), and tiny instances whose answer is derived by hand. Oracles: hand-derived values, numpy's
# SVD of the explicit Kronecker rows, the documented messages and the signatures' defaults.
#: The scale contract's range (attnsvm.scaling.range_error), verbatim.
RANGE_TEXT = "float64's normal range [2.2e-308, 1.8e308]"


def _kron_sv(inst: A.Instance) -> float:
    """``||𝓛||₂`` from numpy's SVD of the explicit Kronecker rows ``z_i ⊗ x_it`` (scale-1 data)."""
    rows = np.einsum("nj,ntk->ntjk", inst.z, inst.X).reshape(inst.n * inst.T, -1)
    return float(np.linalg.svd(rows, compute_uv=False)[0])


# ----------------------------------------------------------------------------- compare_lipschitz
def test_compare_lipschitz_unknown_map_message() -> None:
    inst = A.random_instance(1, 2, 2)
    with pytest.raises(UnknownNameError) as exc:
        compare_lipschitz([inst], [1.0], of="gradient")
    assert str(exc.value) == "unknown Lipschitz map 'of' 'gradient'; expected one of 'weights', 'output'"


def test_compare_lipschitz_row_keys() -> None:
    """A row holds exactly the documented columns, with the instance index, shape, radius and map."""
    inst = A.random_instance(1, 2, 2, seed=0)
    (row,) = compare_lipschitz([inst], [0.5], of="output", samples=2, steps=1)
    expected = {"instance", "shape", "radius", "of"}
    for kind in KINDS:
        expected |= {f"bound_{kind}", f"estimate_{kind}", f"gap_{kind}"}
    for other in ("linear", "normalized_linear"):
        expected |= {f"bound_ratio_softmax/{other}", f"estimate_ratio_softmax/{other}"}
    assert set(row) == expected
    assert (row["instance"], row["shape"], row["radius"], row["of"]) == (0, (1, 2, 2), 0.5, "output")


def test_compare_lipschitz_gap_infinite_where_only_the_estimate_is_zero() -> None:
    """Every token equal: the softmax and normalized-linear Jacobians are identically 0 (``D_i 1 = 0``),
    so their estimates are exactly 0 while their certified bounds are positive (by hand: the softmax
    max-weight bound is ``1/T``, so the bound is ``||𝓛||₂/3 = √6/3``); the gap reads ``inf`` (x/0, the
    documented convention), the estimate ratio softmax/normalized_linear is 0/0 = 1 (both constants 0:
    equal) and softmax/linear is 0/y = 0. Oracle: the exact structure (``D_i 1 = 0``) and the hand value."""
    same = A.Instance(np.ones((1, 3, 2)), [1.0], [1.0, 2.0], [[1.0, 0.0]])
    (row,) = compare_lipschitz([same], [1.0], samples=2, steps=1)
    assert row["estimate_softmax"] == 0.0 and row["estimate_normalized_linear"] == 0.0
    assert row["bound_softmax"] == pytest.approx(math.sqrt(6.0) / 3.0, rel=1e-12)
    assert row["gap_softmax"] == math.inf and row["gap_normalized_linear"] == math.inf
    assert row["estimate_ratio_softmax/linear"] == 0.0
    assert row["estimate_ratio_softmax/normalized_linear"] == 1.0
    assert not any(isinstance(v, float) and math.isnan(v) for v in row.values())


def test_compare_lipschitz_gaps_and_ratios_are_one_where_everything_is_zero() -> None:
    """``z = 0``: every logit is 0 for every ``W``, so every constant is exactly 0 (exact certificate:
    each map is constant in ``W``); every bound and estimate must be exactly 0, and each gap and ratio
    is the documented 0/0 = 1 (the bound is exact; the kinds are equally stable): never NaN, never
    inf, never a ZeroDivisionError."""
    zz = A.Instance(np.arange(6.0).reshape(1, 3, 2), [1.0], [1.0, 2.0], [[0.0, 0.0]])
    for of in OFS:
        (row,) = compare_lipschitz([zz], [1.0], of=of, samples=2, steps=1)
        for kind in KINDS:
            assert row[f"bound_{kind}"] == 0.0 and row[f"estimate_{kind}"] == 0.0
            assert row[f"gap_{kind}"] == 1.0
        for other in ("linear", "normalized_linear"):
            assert row[f"bound_ratio_softmax/{other}"] == 1.0
            assert row[f"estimate_ratio_softmax/{other}"] == 1.0


def test_compare_lipschitz_ratio_helper_conventions_and_range() -> None:
    """The ratio helper behind every gap and ratio of a row (unit test of the convention, with the
    exact IEEE quotient as oracle): 0/0 = 1, x/0 = inf, 0/y = 0, x/y correctly rounded; a quotient of
    positive numbers beyond float64's normal range (which compare_lipschitz cannot reach from real
    bounds and estimates today) raises the scale contract's error instead of inf or a subnormal."""
    from attnsvm.lipschitz._compare import _ratio

    assert _ratio(0.0, 0.0, "r") == 1.0
    assert _ratio(2.0, 0.0, "r") == math.inf
    assert _ratio(0.0, 3.0, "r") == 0.0
    assert _ratio(1.0, 3.0, "r") == 1.0 / 3.0
    with pytest.raises(
        NumericalError, match="the gap is about 1e\\+600: it overflows " + re.escape(RANGE_TEXT)
    ):
        _ratio(1e300, 1e-300, "the gap")
    with pytest.raises(NumericalError, match="the gap is about 1e-310: it underflows"):
        _ratio(1e-10, 1e300, "the gap")


def test_compare_lipschitz_passes_the_search_settings_and_defaults() -> None:
    """The estimates in a row are :func:`lipschitz_estimate` with the given ``seed``, ``samples`` and
    ``steps``, and by default with ``seed=0, samples=32, steps=20`` (the signature); the instance is one
    where each of the three settings changes the softmax estimate."""
    inst = A.random_instance(1, 3, 2, seed=1)
    R = 3.0

    def est(**kw: int) -> float:
        return lipschitz_estimate(inst, kind="softmax", radius=R, **kw).value

    (row,) = compare_lipschitz([inst], [R], seed=1, samples=5, steps=3)
    assert row["estimate_softmax"] == est(seed=1, samples=5, steps=3)
    assert est(seed=1, samples=5, steps=3) != est(seed=0, samples=5, steps=3)
    (row,) = compare_lipschitz([inst], [R])
    assert row["estimate_softmax"] == est(seed=0, samples=32, steps=20)
    assert est(seed=0, samples=32, steps=20) != est(seed=0, samples=33, steps=20)
    assert est(seed=0, samples=32, steps=20) != est(seed=0, samples=32, steps=21)


def test_compare_lipschitz_non_instance_message() -> None:
    inst = A.random_instance(1, 2, 2)
    with pytest.raises(InvalidInstanceError) as exc:
        compare_lipschitz([inst, inst.X], [1.0])  # type: ignore[list-item]
    assert str(exc.value) == (
        "instances[1] must be an attnsvm.Instance; got ndarray (build one with attnsvm.Instance(X, Y, v, z))"
    )


# ----------------------------------------------------------------------------- logit norm and Gram
@pytest.mark.parametrize(("a", "b", "side"), [(-600, -600, "underflows"), (600, 600, "overflows")])
def test_logit_norm_range_error_message(a: int, b: int, side: str) -> None:
    """``||𝓛||₂`` of data scaled by ``2^a``, ``2^b`` is ``2^(a+b)`` times the scale-1 norm (numpy SVD of
    the Kronecker rows): about ``1e∓361``, and the message names it, its size and the side it leaves."""
    base = A.random_instance(2, 3, 3, seed=2)
    k = round(math.log10(_kron_sv(base)) + (a + b) * math.log10(2.0))
    with pytest.raises(NumericalError) as exc:
        logit_norm(scaled(base, a, b, 0))
    assert (
        str(exc.value)
        == f"the logit-map norm ||L||_2 is about 1e{k:+d}: it {side} {RANGE_TEXT}. rescale X or z"
    )


@pytest.mark.parametrize(("a", "b", "side"), [(-300, -300, "underflows"), (300, 300, "overflows")])
def test_logit_gram_range_error_message(a: int, b: int, side: str) -> None:
    """The Gram's largest entry ``max ||z_i||²||x_it||²`` (by hand from the scale-1 data, times
    ``2^(2(a+b))``) leaves the range: the message names the entry, its size and the side."""
    base = A.random_instance(2, 3, 3, seed=2)
    big = float(np.max(np.linalg.norm(base.z, axis=1)[:, None] ** 2 * np.linalg.norm(base.X, axis=-1) ** 2))
    k = round(math.log10(big) + 2 * (a + b) * math.log10(2.0))
    with pytest.raises(NumericalError) as exc:
        logit_gram(scaled(base, a, b, 0))
    what = "the largest entry max ||z_i||²||x_it||² of the logit Gram matrix"
    assert str(exc.value) == f"{what} is about 1e{k:+d}: it {side} {RANGE_TEXT}. rescale X or z"


# ----------------------------------------------------------------------------- jacobian_norm messages
def test_jacobian_norm_overflowing_logits_message() -> None:
    """``max|x| = 3``, ``max|z| = 3``: the data are rescaled by ``2^2`` each, so ``W = 1e308`` becomes
    ``1.6e309`` on the data's scale (the logits' size), beyond float64; the message says so, with the
    remedy."""
    inst = A.Instance(np.array([[[3.0, -1.0], [0.5, 2.0]]]), [1.0], [1.0, 0.5], [[-3.0, 1.0]])
    with pytest.raises(NumericalError) as exc:
        jacobian_norm(inst, np.full((2, 2), 1e308), kind="softmax", of="output")
    assert str(exc.value) == (
        "the softmax output Jacobian is not finite: the largest entry of W on the data's scale, "
        f"W·max|x|·max|z| (the logits' size), is about 1e+309: it overflows {RANGE_TEXT}. "
        "Use a smaller W or rescale the data"
    )


def test_jacobian_norm_out_of_range_message() -> None:
    """At ``W = 0`` the softmax weights Jacobian of one sequence of two tokens is ``D 𝓛`` with
    ``D = ½(I − ½ 11ᵀ)``, whose norm is by hand ``(√2/4)·||z||·||x_1 − x_2||``; at ``2^600 X, 2^600 z`` it
    is ``2^1200`` times that, ~1e361: the message names the quantity, its size and the remedy."""
    base = A.random_instance(1, 2, 2, seed=1)
    hand = math.sqrt(2.0) / 4.0 * np.linalg.norm(base.z[0]) * np.linalg.norm(base.X[0, 0] - base.X[0, 1])
    k = round(math.log10(hand) + 1200 * math.log10(2.0))
    with pytest.raises(NumericalError) as exc:
        jacobian_norm(scaled(base, 600, 600, 0), np.zeros((2, 2)), kind="softmax")
    assert str(exc.value) == (
        f"the softmax weights Jacobian norm ||J(W)||_2 is about 1e{k:+d}: it overflows {RANGE_TEXT}. "
        "Rescale X, z or v by a power of two"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_jacobian_norm_exactly_zero_where_each_sequence_has_zero_tokens_or_zero_query(
    kind: str, of: str
) -> None:
    """Sequence 0 has ``X_0 = 0`` (``z_0 ≠ 0``), sequence 1 has ``z_1 = 0`` (``X_1 ≠ 0``): every logit is 0
    for every ``W``, so every map is constant in ``W`` and its Jacobian is exactly 0 (not an error)."""
    X = np.zeros((2, 2, 2))
    X[1] = [[1.0, 2.0], [-1.0, 0.5]]
    inst = A.Instance(X, [1.0, -1.0], [1.0, 0.5], np.array([[1.0, -2.0], [0.0, 0.0]]))
    assert jacobian_norm(inst, np.ones((2, 2)), kind=kind, of=of) == 0.0


def test_linear_output_jacobian_with_cancelling_values_raises_not_zero() -> None:
    """Two equal tokens ``x = (0.1, 0.3)``, ``v = (3, −1)``: the value ``vᵀx`` of the doubles is exactly
    ``2^−55`` (fractions), not 0, so the linear output Jacobian ``2·(vᵀx)·z ⊗ x`` is not 0; float64
    computes it at its rounding level, so ``jacobian_norm`` must refuse rather than answer 0."""
    from fractions import Fraction

    x, v = (0.1, 0.3), (3.0, -1.0)
    assert Fraction(x[0]) * Fraction(v[0]) + Fraction(x[1]) * Fraction(v[1]) == Fraction(1, 2**55)
    inst = A.Instance(np.array([[x, x]]), [1.0], np.array(v), np.array([[1.0, 0.0]]))
    with pytest.raises(NumericalError, match="below the rounding level"):
        jacobian_norm(inst, np.ones((2, 2)), kind="linear", of="output")


#: Rounding of a computed bound against its exact formula, in ulps: ``λ_max`` of the rank-one Gram
#: ``d·11ᵀ`` (backward-stable eigensolver, ``3·eps`` relative for a 3 × 3 matrix), halved by the square
#: root, then about five correctly rounded operations (exp of the log factor, products, frexp/ldexp):
#: 8 ulps of headroom.
BOUND_FORMULA_ULPS = 8.0


@pytest.mark.parametrize("d", [1, 2, 4])
def test_softmax_bound_of_equal_tokens_exceeds_exact_by_its_documented_allowances_only(d: int) -> None:
    """Three equal tokens ``x = 1_d``, ``z = e_1``: every weight is ``1/3`` for every ``W``, so the
    max-weight bound is ``p = 1/3`` exactly (``δ = 0``), ``||𝓛||₂ = √(3d)`` and the formula is ``√(3d)/3``.
    The certified bound adds only its documented allowances: ``rounding_rtol`` and the log allowance of
    ``p``, ``2(2d + T + 16)·eps·(1 + |exponent| + |q|)`` with exponents 0 and ``q = log 2``. Oracle:
    mpmath at 40 digits. (A certified bound may not be needlessly loose: a larger allowance fails.)"""
    import mpmath

    inst = A.Instance(np.ones((1, 3, d)), [1.0], np.ones(d), np.eye(d)[:1])
    b = lipschitz_bound(inst, kind="softmax", radius=1.0)
    with mpmath.workdps(40):
        allowance = 2 * (2 * d + 3 + 16) * mpmath.mpf(EPS) * (1 + mpmath.log(2))
        exact = mpmath.sqrt(3 * d) / 3 * (1 + mpmath.mpf(bound_rounding_rtol(inst))) * mpmath.exp(allowance)
        assert abs(mpmath.mpf(b.value) / exact - 1) <= BOUND_FORMULA_ULPS * EPS


@pytest.mark.parametrize("seed", [1, 2, 7])
@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize("of", OFS)
def test_kappa_of_a_sequence_does_not_depend_on_the_other_sequences(seed: int, kind: str, of: str) -> None:
    """``κ_i`` is a property of sequence ``i`` alone (``sup ||D_i||₂`` over the ball): the factor of each
    sequence of a two-sequence instance equals, bit for bit, the factor of that sequence on its own
    (the two sequences are drawn at different scales, so their logit gaps differ)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2, 3, 2)) * np.array([0.05, 0.3])[:, None, None]
    z = rng.standard_normal((2, 2))
    inst = A.Instance(X, [1.0, 1.0], [1.0, 1.0], z)
    both = lipschitz_bound(inst, kind=kind, radius=1.0, of=of).log_kappa
    for i in range(2):
        alone = A.Instance(X[i : i + 1], [1.0], [1.0, 1.0], z[i : i + 1])
        assert both[i] == lipschitz_bound(alone, kind=kind, radius=1.0, of=of).log_kappa[0]


def test_softmax_max_weight_bound_attained_by_collinear_tokens() -> None:
    """Tokens ``0, ε, 3ε`` on a line (``d = 1``, ``z = 1``): on ``|W| ≤ R`` the largest weight is the last
    token's at ``W = R``, ``1/(1 + e^{−2Rε} + e^{−3Rε})`` (by hand), and the max-weight bound equals it;
    below ½ it is the factor ``κ``, and the bound is ``κ·||𝓛||₂ = κ·√10·ε`` up to the allowances
    (``rounding_rtol``, the log allowance ``2(2d + T + 16)·eps·(1 + 3Rε + |q|)``). Oracle: mpmath."""
    import mpmath

    e, R = 2.0**-4, 1.6
    inst = A.Instance(np.array([[[0.0], [e], [3 * e]]]), [1.0], [1.0], [[1.0]])
    b = lipschitz_bound(inst, kind="softmax", radius=R)
    with mpmath.workdps(40):
        a = mpmath.mpf(R * e)
        p = 1 / (1 + mpmath.exp(-2 * a) + mpmath.exp(-3 * a))
        q = mpmath.log(mpmath.exp(-2 * a) + mpmath.exp(-3 * a))
        allowance = 2 * (2 + 3 + 16) * mpmath.mpf(EPS) * (1 + 3 * a + abs(q))
        exact = p * mpmath.sqrt(10) * e * (1 + mpmath.mpf(b.rounding_rtol)) * mpmath.exp(allowance)
        assert float(p) < 0.5
        assert abs(mpmath.mpf(b.kappa[0]) / (p * mpmath.exp(allowance)) - 1) <= BOUND_FORMULA_ULPS * EPS
        assert abs(mpmath.mpf(b.value) / exact - 1) <= BOUND_FORMULA_ULPS * EPS


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_zero_output_bound_reports_the_first_candidate(kind: str) -> None:
    """``z = 0``: both candidates are exactly 0 (every ``L_i = 0``) and the tie goes to the first, the cap
    ``max_i κ_i ||𝓛||₂``, whatever the size of ``κ`` (here ``> 1``: large values ``v``)."""
    zz = A.Instance(np.arange(6.0).reshape(1, 3, 2), [1.0], [8.0, 3.0], [[0.0, 0.0]])
    b = lipschitz_bound(zz, kind=kind, radius=1.0, of="output")
    assert b.value == 0.0 and b.kappa[0] > 1.0
    assert b.formula == "max_i kappa_i ||L||_2"


def test_bound_candidate_names() -> None:
    """The documented names of the certified candidates (``LipschitzBound.candidates``; ``formula`` is the
    smallest), per kind and map."""
    inst = A.random_instance(2, 3, 2, seed=0)
    names = {
        ("linear", "weights"): {"||L||_2 (exact)"},
        ("linear", "output"): {"||A L||_2 (exact, Gram (z_i·z_j)(X_i^T a_i·X_j^T a_j))"},
        ("softmax", "weights"): {"1/2 ||L||_2", "||K L||_2"},
        ("normalized_linear", "weights"): {"1/2 ||L||_2", "||K L||_2"},
        ("softmax", "output"): {"max_i kappa_i ||L||_2", "||K L||_2"},
        ("normalized_linear", "output"): {"max_i kappa_i ||L||_2", "||K L||_2"},
    }
    for (kind, of), expected in names.items():
        b = lipschitz_bound(inst, kind=kind, radius=1.0, of=of)
        assert set(b.candidates) == expected and b.formula in expected
        assert set(b.log_candidates) == expected


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize("R", [0.01, 1.0, 100.0])
def test_weights_candidates_half_cap_and_kron_within_it(kind: str, R: float) -> None:
    """The cap candidate is exactly ``½ ||𝓛||₂`` (a power-of-two multiple, no rounding), and
    ``||K 𝓛||₂ ≤ ½ ||𝓛||₂`` because every ``κ_i ≤ ½`` (equal where every sequence is capped, at large
    ``R``), up to the Gram eigenvalue's rounding (``rounding_rtol``)."""
    inst = A.random_instance(2, 3, 2, seed=4)
    b = lipschitz_bound(inst, kind=kind, radius=R)
    half = b.candidates["1/2 ||L||_2"]
    assert half == 0.5 * b.logit_norm
    assert b.candidates["||K L||_2"] <= half * (1 + b.rounding_rtol)
    assert np.all(b.kappa <= 0.5)


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_bound_of_equal_values_is_its_documented_rounding_allowance(kind: str) -> None:
    """Tokens ``e_1, e_2``, ``v = (1, 1)``: both values are exactly 1, so the output is constant in ``W``
    (true constant 0); the bound is then only the documented allowance for the values' rounding,
    ``κ = (√2/4)·4(d + 2)·eps·max||x||·||v|| = (√2/4)·16·eps·√2 = 8·eps`` (``T = 2``: ``p ≥ ½``, the factor
    is √2/4), times ``||𝓛||₂ = 1`` (orthonormal rows ``z ⊗ x_t``) and ``1 + rounding_rtol`` (by hand)."""
    inst = A.Instance(np.array([[[1.0, 0.0], [0.0, 1.0]]]), [1.0], [1.0, 1.0], [[1.0, 0.0]])
    b = lipschitz_bound(inst, kind=kind, radius=1.0, of="output")
    assert abs(b.value / (8 * EPS * (1 + b.rounding_rtol)) - 1) <= BOUND_FORMULA_ULPS * EPS


def test_bound_range_error_message() -> None:
    """Two tokens: the softmax weights bound is ``½ ||𝓛||₂`` for every radius (``κ = ½``, since ``p ≥ ½``);
    at ``2^600 X, 2^600 z`` that is ``2^1200`` times the scale-1 value (numpy SVD of the Kronecker rows),
    ~1e361: the message names the bound, its radius, its size and the remedy."""
    base = A.random_instance(1, 2, 2, seed=1)
    k = round(math.log10(0.5 * _kron_sv(base)) + 1200 * math.log10(2.0))
    with pytest.raises(NumericalError) as exc:
        lipschitz_bound(scaled(base, 600, 600, 0), kind="softmax", radius=1.0)
    assert str(exc.value) == (
        f"the softmax weights Lipschitz bound (radius 1) is about 1e{k:+d}: it overflows {RANGE_TEXT}. "
        "Rescale X, z or v by a power of two: the bound scales by the same factors"
    )


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_zero_output_bound_with_factors_beyond_float64_is_zero(kind: str) -> None:
    """``z = 0`` makes every logit 0, so the output constant is exactly 0, and the bound must say 0 even
    though the factors ``κ_i ~ spread of the values ~ 1e-300·1e-300`` are far below float64 (0 is
    representable; only a nonzero bound outside the range raises)."""
    X = np.array([[[1e-300, -2e-300], [3e-300, 5e-301]]])
    zz = A.Instance(X, [1.0], [1e-300, -3e-300], [[0.0, 0.0]])
    b = lipschitz_bound(zz, kind=kind, radius=1.0, of="output")
    assert b.value == 0.0 and b.nominal == 0.0
    assert b.log_kappa[0] < -590 * math.log(10.0)


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_bound_with_overflowing_factor_reads_inf_without_warning(kind: str) -> None:
    """``X, v ~ 1e200`` and ``z ~ 1e-300``: the factor ``κ ~ spread of the values ~ 1e400`` is beyond
    float64 while the bound ``~ κ·||𝓛||₂ ~ 1e400·1e-100`` is a normal double. The bound is returned; the
    diagnostic ``kappa`` reads ``inf`` (documented) with its exact ``log_kappa``, and no warning."""
    import warnings

    X = np.array([[[1e200, -2e200], [3e200, 5e199]]])
    inst = A.Instance(X, [1.0], [1e200, -3e200], [[1e-300, 2e-300]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = lipschitz_bound(inst, kind=kind, radius=1e-100, of="output")
    assert 1e250 < b.value < 1e308
    assert b.kappa[0] == math.inf and b.jacobian_factor == math.inf
    assert 400 * math.log(10.0) < b.log_kappa[0] < 402 * math.log(10.0)


def test_bound_log_logit_norm() -> None:
    """``log_logit_norm`` is ``ln ||𝓛||₂``: against numpy's SVD of the Kronecker rows at scale 1, shifted by
    ``200 ln 2`` at ``2^300 X, 2^-100 z`` (bilinear), and ``−inf`` for ``z = 0``."""
    base = A.random_instance(1, 2, 2, seed=1)
    ref = math.log(_kron_sv(base))
    b = lipschitz_bound(base, kind="linear", radius=1.0)
    assert abs(b.log_logit_norm - ref) <= 8 * EPS * abs(ref) + 8 * EPS
    big = lipschitz_bound(scaled(base, 300, -100, 0), kind="softmax", radius=1.0)
    assert abs(big.log_logit_norm - (ref + 200 * math.log(2.0))) <= 1e-12 * (abs(ref) + 200)
    zz = A.Instance(np.arange(6.0).reshape(1, 3, 2), [1.0], [8.0, 3.0], [[0.0, 0.0]])
    assert lipschitz_bound(zz, kind="softmax", radius=1.0).log_logit_norm == -math.inf


@pytest.mark.parametrize(("n", "T", "d"), [(1, 2, 1), (2, 3, 4), (3, 5, 2)])
def test_bound_rounding_rtol_is_the_documented_formula(n: int, T: int, d: int) -> None:
    """``rounding_rtol = (8m + m(2d + 2))·eps`` with ``m = nT`` (the docstring's Weyl + Gershgorin count)."""
    m = n * T
    assert bound_rounding_rtol(A.random_instance(n, T, d, seed=0)) == (8 * m + m * (2 * d + 2)) * EPS
