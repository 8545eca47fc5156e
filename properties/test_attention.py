"""Invariants of the attention kinds (softmax, linear, normalized linear) and of the losses.

Tolerances: a weight ``s_it = exp(log s_it)`` is exact to a relative ``EPS·(|l_it − max l_i| + T)``
plus the logits' own rounding ``2d·EPS·Λ_it`` (``Λ_it = Σ_kj |x_itk W_kj z_ij|``), which
``WEIGHT_ULPS`` multiplies; sums of ``T`` weights add ``T`` roundings.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.attention import attention_of, log_phi, log_softmax
from attnsvm.instance import Instance

EPS = float(np.finfo(np.float64).eps)
#: exp/log/log-sum-exp each round once or twice per weight; 8 covers them with headroom.
WEIGHT_ULPS = 8.0
#: Loss values/derivatives: a handful of elementary operations each correct to ≤ 1 ulp
#: (IEEE exp/log1p within 1 ulp), so 8 ulps relative to the exact value is a safe bound.
LOSS_ULPS = 8.0

KINDS = A.KINDS
pairs = S.instances_and_weights(
    S.instances(family="gaussian") | S.instances(family="uniform", bound=4.0) | S.instances(family="unit"),
    scale=(1e-2, 1e3),
)


def _lam(inst: Instance, W: np.ndarray) -> np.ndarray:
    return np.einsum("ntk,kj,nj->nt", np.abs(inst.X), np.abs(W), np.abs(inst.z))


@given(pairs, st.sampled_from(("softmax", "normalized_linear")))
def test_normalised_kinds_are_distributions(pair: tuple[Instance, np.ndarray], kind: str) -> None:
    inst, W = pair
    s = A.attention(inst, W, kind)
    assert s.shape == (inst.n, inst.T)
    assert np.all(s >= 0) and np.all(s <= 1)
    assert np.all(np.abs(s.sum(axis=1) - 1) <= WEIGHT_ULPS * inst.T * EPS)
    logs = A.log_attention(inst, W, kind)
    assert np.all(np.isfinite(logs)) and np.all(logs <= 0)
    # log_attention = log(attention) wherever the weight is a normal double
    ok = s > np.finfo(np.float64).tiny
    rel = WEIGHT_ULPS * EPS * (np.abs(logs) + inst.T + 2 * inst.d * _lam(inst, W))
    assert np.all(np.abs(np.exp(logs[ok]) - s[ok]) <= rel[ok] * s[ok])


@given(pairs)
def test_linear_attention_is_the_logits(pair: tuple[Instance, np.ndarray]) -> None:
    inst, W = pair
    assert np.array_equal(A.attention(inst, W, "linear"), A.logits(inst, W))
    direct = np.array([[inst.X[i, t] @ W @ inst.z[i] for t in range(inst.T)] for i in range(inst.n)])
    assert np.all(np.abs(A.logits(inst, W) - direct) <= 4 * inst.d**2 * EPS * _lam(inst, W))


@given(pairs, st.sampled_from(KINDS))
def test_output_is_weighted_values(pair: tuple[Instance, np.ndarray], kind: str) -> None:
    inst, W = pair
    s = A.attention(inst, W, kind)
    f = A.output(inst, W, kind)
    a = inst.values()
    assert np.all(np.abs(f - np.sum(s * a, axis=1)) <= 4 * inst.T * EPS * np.sum(np.abs(s * a), axis=1))


@given(pairs, st.sampled_from(KINDS), S.seeds())
def test_token_permutation_equivariance(pair: tuple[Instance, np.ndarray], kind: str, seed: int) -> None:
    """Permuting the tokens (queries fixed) permutes the weights and leaves the output."""
    inst, W = pair
    perm = np.random.default_rng(seed).permutation(inst.T)
    z = None if inst.self_attention else inst.z
    if inst.self_attention:  # keep the query: it is the first token, so hold token 0 in place
        perm = np.concatenate([[0], 1 + np.random.default_rng(seed).permutation(inst.T - 1)])
    p = A.Instance(inst.X[:, perm], inst.Y, inst.v, z)
    s, sp = A.attention(inst, W, kind), A.attention(p, W, kind)
    # Each token's logit is the same dot product in the same order, so the permuted logits are
    # bitwise the permuted logits; only the normalising sum changes order (T roundings).
    assert np.array_equal(A.logits(p, W), A.logits(inst, W)[:, perm])
    assert np.all(np.abs(sp - s[:, perm]) <= WEIGHT_ULPS * inst.T * EPS * np.abs(s[:, perm]))
    f, fp = A.output(inst, W, kind), A.output(p, W, kind)
    a = inst.values()
    assert np.all(np.abs(f - fp) <= 4 * (WEIGHT_ULPS + 1) * inst.T * EPS * np.sum(np.abs(s * a), axis=1))


@given(S.instances(), st.sampled_from(("softmax", "normalized_linear")))
def test_zero_weights_give_uniform_attention(inst: Instance, kind: str) -> None:
    W = np.zeros((inst.d, inst.d))
    s = A.attention(inst, W, kind)
    assert np.all(np.abs(s - 1 / inst.T) <= WEIGHT_ULPS * EPS / inst.T * inst.T)
    a = inst.values()
    assert np.all(
        np.abs(A.output(inst, W, kind) - a.mean(axis=1)) <= 4 * inst.T * EPS * np.abs(a).sum(axis=1)
    )


@given(S.instances_and_weights(scale=(1e-2, 1e2)), S.weight_matrices(1), S.bounded_floats(3.0))
def test_linear_attention_is_linear_in_w(pair: tuple[Instance, np.ndarray], _u: np.ndarray, c: float) -> None:
    inst, W = pair
    V = np.roll(W, 1, axis=0)
    lhs = A.attention(inst, W + c * V, "linear")
    rhs = A.attention(inst, W, "linear") + c * A.attention(inst, V, "linear")
    scale = _lam(inst, np.abs(W) + abs(c) * np.abs(V))
    assert np.all(np.abs(lhs - rhs) <= 8 * inst.d**2 * EPS * scale)


@given(
    st.integers(2, 6).flatmap(
        lambda T: st.lists(S.bounded_floats(1e3), min_size=T, max_size=T).map(np.array)
    ),
    S.bounded_floats(1e3),
)
def test_softmax_shift_invariance_and_monotonicity(l: np.ndarray, c: float) -> None:
    """``softmax(l + c) = softmax(l)`` (the shift cancels in log-sum-exp) and larger logit → larger weight."""
    s = attention_of(l[None], "softmax")[0]
    sc = attention_of((l + c)[None], "softmax")[0]
    # l + c rounds each logit by ≤ EPS·|l + c|, which moves log-weights by ≤ 2·EPS·max|l + c|.
    tol = WEIGHT_ULPS * EPS * (len(l) + np.max(np.abs(l)) + abs(c) + np.abs(log_softmax(l)))
    assert np.all(np.abs(sc - s) <= tol * s + np.finfo(np.float64).tiny)
    order = np.argsort(l, kind="stable")
    assert np.all(np.diff(s[order]) >= 0)


@given(st.lists(S.bounded_floats(1e6), min_size=2, max_size=6).map(np.array))
def test_log_phi_matches_elu_plus_one(l: np.ndarray) -> None:
    phi = torch.nn.functional.elu(torch.tensor(l, dtype=torch.float64)).numpy() + 1.0
    lp = log_phi(l)
    assert np.all(np.isfinite(lp))
    big = phi > 1e-300
    # φ = e^l (l ≤ 0) or 1 + l: log is exact to a few ulps of |log φ| plus the rounding of elu+1
    # (absolute EPS on φ ≈ 1, i.e. relative EPS/φ).
    assert np.all(
        np.abs(np.exp(lp[big]) - phi[big]) <= WEIGHT_ULPS * EPS * (phi[big] * (1 + np.abs(lp[big])) + 1)
    )


# -------------------------------------------------------------------- losses
@pytest.mark.parametrize("name", sorted(A.LOSSES))
@given(u=S.bounded_floats(700.0))
def test_loss_derivative_matches_high_precision(name: str, u: float) -> None:
    loss = A.get_loss(name)
    with mpmath.workdps(50):
        um = mpmath.mpf(u)
        val = {"logistic": mpmath.log1p(mpmath.exp(-um)), "exponential": mpmath.exp(-um), "correlation": -um}[
            name
        ]
        der = {
            "logistic": -1 / (1 + mpmath.exp(um)),
            "exponential": -mpmath.exp(-um),
            "correlation": mpmath.mpf(-1),
        }[name]
    v, dv = float(loss.value(np.array([u]))[0]), float(loss.derivative(np.array([u]))[0])
    tiny = float(np.finfo(np.float64).tiny)
    assert abs(v - float(val)) <= LOSS_ULPS * EPS * abs(float(val)) + tiny
    assert abs(dv - float(der)) <= LOSS_ULPS * EPS * abs(float(der)) + tiny
    # log(−ℓ') in log form: exact even where ℓ' underflows
    with mpmath.workdps(50):
        lnd = float(mpmath.log(-der))
    assert abs(float(loss.log_neg_derivative(np.array([u]))[0]) - lnd) <= LOSS_ULPS * EPS * max(1.0, abs(lnd))


@pytest.mark.parametrize("name", sorted(A.LOSSES))
@given(u=st.lists(S.bounded_floats(50.0), min_size=1, max_size=5).map(np.array))
def test_loss_numpy_and_torch_agree(name: str, u: np.ndarray) -> None:
    loss = A.get_loss(name)
    ut = torch.tensor(u, dtype=torch.float64)
    for fn in (loss.value, loss.derivative):
        a, b = np.asarray(fn(u)), fn(ut).numpy()
        assert np.all(np.abs(a - b) <= LOSS_ULPS * EPS * np.abs(a) + float(np.finfo(np.float64).tiny))


@pytest.mark.parametrize("name", sorted(A.LOSSES))
@given(u=S.bounded_floats(30.0), du=st.floats(1e-3, 1.0))
def test_losses_decrease(name: str, u: float, du: float) -> None:
    loss = A.get_loss(name)
    assert float(loss.derivative(np.array([u]))[0]) < 0
    assert loss.assumptions.strictly_decreasing
    assert float(loss.value(np.array([u + du]))[0]) < float(loss.value(np.array([u]))[0])


@given(u=st.floats(-1e4, -709.79))
def test_exponential_overflow_is_reported(u: float) -> None:
    with pytest.raises(A.NumericalError):
        A.get_loss("exponential").value(np.array([u]))
    with pytest.raises(A.NumericalError):
        A.get_loss("exponential").derivative(np.array([u]))
