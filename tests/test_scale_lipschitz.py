"""The scale contract for the Lipschitz bounds and estimates (issue 13 §1): regression tests.

Observed before the fix, each pinned here:

* ``lipschitz_bound(kind="softmax" | "normalized_linear", of="output")`` returned ``0.0`` when
  ``X``, ``z``, ``v`` had very different sizes (scaled by 1e-44, 1e61, 1e-123: the attained output
  Jacobian at ``W = 0`` is ~1e-150) and on small uniform-family instances with tiny entries (attained
  ~1e-194): ``κ²`` underflowed in the Gram and a ``min`` picked the 0;
* for data of size ≥ ~1e160 the softmax and normalized-linear bounds raised numpy's ``LinAlgError``
  ("Eigenvalues did not converge": NaN factors from an overflowing norm) instead of an AttnSVMError.

Oracles (independent of attnsvm.lipschitz): the attained Jacobian of an independent torch
implementation of the maps (``torch.func.jacrev``, float64, on data where its own intermediates stay
in range), closed forms evaluated with mpmath at 50 digits, and the exact equivariance of the maps
under power-of-two rescaling — ``X → 2^a X``, ``z → 2^b z``, ``v → 2^c v``, ``R → 2^-(a+b) R`` scales
the weights constant by ``2^(a+b)`` and the output constant by ``2^(2a+b+c)``.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.lipschitz import (
    compare_lipschitz,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
    logit_gram,
    logit_norm,
)
from attnsvm.strategies import scaled

EPS = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")
#: A singular value from a backward-stable SVD of an ``m × p`` matrix is within ``~(m + p)·eps``
#: relative of exact; 8 ulps of headroom per dimension (as in tests/test_lipschitz.py).
SVD_ULPS = 8.0
#: Message of the scale contract's error (attnsvm.scaling.range_error).
RANGE = r"float64's normal range \[2.2e-308, 1.8e308\]"
FAST = {"samples": 6, "steps": 4, "starts": 1}


def VALUE_ULPS(d: int) -> float:  # noqa: N802 (a constant of d)
    """The output bound's allowance for the rounding of the values ``a = Xv`` in the spread
    (lipschitz_bound: ``spread·(1 + 2eps) + 4(d + 2)·eps·max||x||·||v||``), plus 4 ulps for the last
    roundings of the product; relative to the spread when ``max||x||·||v||`` equals it."""
    return 2 + 4 * (d + 2) + 4


def torch_jac_norm(inst: A.Instance, kind: str, of: str, W: np.ndarray) -> float:
    """Independent ``||J(W)||₂``: torch softmax / elu on the raw data, jacrev, largest singular value."""
    X, z, v = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (inst.X, inst.z, inst.v))

    def m(Wt: torch.Tensor) -> torch.Tensor:
        lg = torch.einsum("ntd,de,ne->nt", X, Wt, z)
        if kind == "softmax":
            s = torch.softmax(lg, dim=1)
        elif kind == "linear":
            s = lg
        else:
            phi = torch.nn.functional.elu(lg) + 1.0
            s = phi / phi.sum(dim=1, keepdim=True)
        return s.reshape(-1) if of == "weights" else (s * (X @ v)).sum(dim=1)

    J = torch.func.jacrev(m)(torch.tensor(W, dtype=torch.float64))
    return float(torch.linalg.svdvals(J.reshape(J.shape[0], -1))[0])


def svd_rtol(inst: A.Instance) -> float:
    return SVD_ULPS * (inst.n * inst.T + inst.d**2) * EPS


# ----------------------------------------------------------------------------- §1: zero bounds
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["softmax", "normalized_linear", "linear"])
def test_output_bound_positive_and_sound_at_mixed_scales(seed: int, kind: str) -> None:
    """X, z, v scaled by 1e-44, 1e61, 1e-123 (the issue's case): the output bound was 0.0.

    Oracle: the independent torch Jacobian at ``W = 0`` and at points of the ball (its intermediates,
    ~1e-167 values and ~1e17 logit rows, are all normal doubles on this data)."""
    base = A.random_instance(2, 3, 3, seed=seed)
    inst = A.Instance(base.X * 1e-44, base.Y, base.v * 1e-123, base.z * 1e61)
    b = lipschitz_bound(inst, kind=kind, radius=1.0, of="output")
    rng = np.random.default_rng(seed)
    # the ball ||W|| ≤ 1 holds logits up to ~1e17; sample where they are O(1)-O(10) (beyond, the
    # oracle's own elu + 1 gives 0/0)
    points = [np.zeros((3, 3))] + [rng.standard_normal((3, 3)) * 10.0**-k for k in (16, 17, 18)]
    for W in points:
        W = W / max(1.0, float(np.linalg.norm(W)))
        J = torch_jac_norm(inst, kind, "output", W)
        assert J <= b.value * (1 + svd_rtol(inst))
    assert torch_jac_norm(inst, kind, "output", np.zeros((3, 3))) > 1e-152  # the truth is not 0
    assert 1e-152 < b.value < 1e-146


def _tiny_uniform_n1() -> A.Instance:
    # uniform-family shape (n = 1, T = 2, d = 1) with a tiny value head: κ ~ 1e-194, κ² underflowed
    return A.Instance([[[1.0], [0.0]]], [1.0], [5.6e-194], [[1.0]])


def _tiny_uniform_n2() -> A.Instance:
    # n = 2, entries of uniform-family size, values ~1e-171 (the n = 2 case: attained 2.6e-171)
    return A.Instance(
        [[[1.5, 0.0], [0.0, -2.0]], [[0.25, 1.0], [3.0, 0.5]]],
        [1.0, -1.0],
        [1e-171, 2e-171],
        [[1.0, 0.5], [0.0, 2.0]],
    )


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_output_bound_tiny_uniform_instance_closed_form(kind: str) -> None:
    """n = 1, T = 2: the output constant is exactly ``¼ ||z|| |a₁ − a₂| ||x₁ − x₂||`` for every radius
    (the supremum is at ``W = 0``, where both kinds coincide; tests/test_lipschitz.py derives it),
    1.4e-194 here; the bound was 0.0. With ``x₂ = 0`` the bound's ``(√2/4)·spread·||𝓛||`` is at most
    ``√2`` times the closed form, up to the bound's rounding allowances (``rounding_rtol`` and the
    values' allowance ``VALUE_ULPS``). Oracle: the closed form in mpmath (50 digits)."""
    inst = _tiny_uniform_n1()
    with mpmath.workdps(50):
        x1, x2, v, z = (mpmath.mpf(t) for t in (1.0, 0.0, 5.6e-194, 1.0))
        closed = abs(z) * abs(v * x1 - v * x2) * abs(x1 - x2) / 4
    for R in (1e-3, 1.0, 1e300):
        b = lipschitz_bound(inst, kind=kind, radius=R, of="output")
        allowance = 1 + b.rounding_rtol + VALUE_ULPS(inst.d) * EPS
        assert float(closed) <= b.value <= float(closed * mpmath.sqrt(2)) * allowance
        e = lipschitz_estimate(inst, kind=kind, radius=R, of="output", **FAST)
        assert abs(e.value - float(closed)) <= svd_rtol(inst) * float(closed)


@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize("of", OFS)
def test_bound_tiny_uniform_n2_sound(kind: str, of: str) -> None:
    """n = 2, O(1) tokens, values ~1e-171 (the issue's n = 2 case: attained 2.6e-171, bounded by 0).

    Oracle: the independent torch Jacobian at ``W = 0`` and sampled points of the ball."""
    inst = _tiny_uniform_n2()
    rng = np.random.default_rng(7)
    for R in (1.0, 1e3):
        b = lipschitz_bound(inst, kind=kind, radius=R, of=of)
        assert b.value > 0.0
        for W in [np.zeros((2, 2))] + [rng.standard_normal((2, 2)) * 10.0**k for k in (-2, 0, 1, 3)]:
            W = W * min(1.0, R / float(np.linalg.norm(W))) if np.any(W) else W
            J = torch_jac_norm(inst, kind, of, W)
            assert J <= b.value * (1 + svd_rtol(inst))


# ----------------------------------------------------------------------------- §1: LinAlgError
@pytest.mark.parametrize("c", [1e160, 1e200, 1e300])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_huge_data_named_error_never_linalg(c: float, kind: str, of: str) -> None:
    """Data of size ≥ 1e160 raised numpy's LinAlgError. The constants are ~c² (weights) and ~c³
    (output, v of size 1): beyond 1.8e308, so the contract's error naming the overflow is the answer."""
    base = A.random_instance(2, 3, 3, seed=4)
    inst = A.Instance(base.X * c, base.Y, base.v, base.z * c)
    for R in (1.0, 1e-300):
        with pytest.raises(NumericalError, match="overflows " + RANGE):
            lipschitz_bound(inst, kind=kind, radius=R, of=of)


@pytest.mark.parametrize("kind", KINDS)
def test_huge_tokens_with_small_queries_return_equivariant_value(kind: str) -> None:
    """``X`` of size 2^530 (~1e160) with ``z`` and ``v`` scaled down so that both constants are O(1):
    the bound must return ``2^(a+b)`` (weights) and ``2^(2a+b+c)`` (output) times the bound at scale 1
    (radius ``2^-(a+b) R``); the maps are exactly equivariant and so is the computation (exponent
    arithmetic only), so the comparison is exact. This case raised LinAlgError before."""
    base = A.random_instance(2, 3, 3, seed=3)
    a, b_, c = 530, -520, -540
    inst = scaled(base, a, b_, c)
    for of, k in (("weights", a + b_), ("output", 2 * a + b_ + c)):
        for R in (0.5, 4.0):
            ref = lipschitz_bound(base, kind=kind, radius=R, of=of).value
            got = lipschitz_bound(inst, kind=kind, radius=math.ldexp(R, -(a + b_)), of=of).value
            assert got == math.ldexp(ref, k)


def test_logit_norm_and_gram_scale_contract() -> None:
    """``||𝓛||₂`` is bilinear in ``(X, z)``: exact power-of-two equivariance, and the named error where
    the norm (or the Gram's largest entry, its square) leaves the normal range. Oracle: the SVD of the
    explicit Kronecker rows ``z_i ⊗ x_it`` at scale 1 (numpy, independent of lipschitz.py)."""
    base = A.random_instance(2, 3, 3, seed=2)
    rows = np.einsum("nj,ntk->ntjk", base.z, base.X).reshape(base.n * base.T, -1)
    sv = float(np.linalg.svd(rows, compute_uv=False)[0])
    assert abs(logit_norm(base) - sv) <= svd_rtol(base) * sv
    for a, b_ in ((600, -590), (-500, -400), (1000, 10)):
        inst = scaled(base, a, b_, 0)
        expected_log2 = math.log2(sv) + a + b_
        if -1021 < expected_log2 < 1023:
            assert logit_norm(inst) == math.ldexp(logit_norm(base), a + b_)
        else:
            with pytest.raises(NumericalError, match=RANGE):
                logit_norm(inst)
        if -1021 < 2 * expected_log2 < 1023:
            G = logit_gram(inst)
            np.testing.assert_array_equal(
                np.max(G), math.ldexp(float(np.max(logit_gram(base))), 2 * (a + b_))
            )
        else:
            with pytest.raises(NumericalError, match="logit Gram"):
                logit_gram(inst)


# ----------------------------------------------------------------------------- estimate, Jacobian
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_estimate_and_jacobian_norm_equivariant_at_extreme_scales(kind: str, of: str) -> None:
    """The estimate and ``jacobian_norm`` work on the data rescaled to O(1) and put the power of two
    back: at ``X·2^600, z·2^-300, v·2^-700`` (logits and values far outside float64 for a naive torch
    evaluation) they return exactly ``2^k`` times the scale-1 answer, at the point ``2^-(a+b) W``.
    Oracle: the equivariance, and the independent torch Jacobian at scale 1."""
    base = A.random_instance(2, 3, 3, seed=6)
    a, b_, c = 600, -300, -700
    k = a + b_ if of == "weights" else 2 * a + b_ + c
    inst = scaled(base, a, b_, c)
    e0 = lipschitz_estimate(base, kind=kind, radius=2.0, of=of, **FAST)
    e1 = lipschitz_estimate(inst, kind=kind, radius=math.ldexp(2.0, -(a + b_)), of=of, **FAST)
    assert e1.value == math.ldexp(e0.value, k)
    np.testing.assert_array_equal(e1.W, np.ldexp(e0.W, -(a + b_)))
    J0 = torch_jac_norm(base, kind, of, e0.W)
    assert abs(J0 - e0.value) <= svd_rtol(base) * J0
    assert jacobian_norm(inst, e1.W, kind=kind, of=of) == e1.value


#: mpmath digits of the closed-form oracle below (50 ≫ float64's 16: its own error is negligible).
ORACLE_DPS = 50


def _mp_uniform_jacobian_norm(inst: A.Instance, kind: str, of: str) -> float:
    """``||J(0)||₂`` in ``ORACLE_DPS``-digit mpmath, from the data alone (not attnsvm's code).

    At ``W = 0`` every logit is 0 and every kind but ``linear`` has uniform weights ``1/T`` with
    ``∂s/∂l = I/T − 11ᵀ/T²`` (softmax; for ``φ = elu + 1``, ``φ(0) = φ'(0) = 1`` gives the same), so
    ``J(0) = blockdiag_i(I/T − 11ᵀ/T²) 𝓛`` for the weights and rows ``Σ_t (a_it − ā_i)/T · 𝓛_it`` for the
    output (``𝓛_it = z_i ⊗ x_it``, ``a_it = vᵀx_it``); ``linear`` has ``J = 𝓛`` and rows ``Σ_t a_it 𝓛_it``.
    """
    n, T, d = inst.shape
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        rows = []
        for i in range(n):
            z = [mpf(float(c)) for c in inst.z[i]]
            L = [[mpf(float(inst.X[i, t, k])) * z[j] for k in range(d) for j in range(d)] for t in range(T)]
            a = [
                mpmath.fsum(mpf(float(inst.X[i, t, k])) * mpf(float(inst.v[k])) for k in range(d))
                for t in range(T)
            ]
            if of == "weights":
                if kind == "linear":
                    rows += L
                else:
                    rows += [
                        [L[t][c] / T - mpmath.fsum(L[u][c] for u in range(T)) / T**2 for c in range(d * d)]
                        for t in range(T)
                    ]
            else:
                w = a if kind == "linear" else [(a[t] - mpmath.fsum(a) / T) / T for t in range(T)]
                rows.append([mpmath.fsum(w[t] * L[t][c] for t in range(T)) for c in range(d * d)])
        J = mpmath.matrix(rows)
        ev = mpmath.eigsy(J * J.T, eigvals_only=True)
        return float(mpmath.sqrt(max(ev)))


@pytest.mark.parametrize("j", [-600, -1000])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_self_attention_tiny_first_token_estimate_closed_form(j: int, kind: str, of: str) -> None:
    """Regression (over-refusal): self-attention (``z_i = x_i0``) with tokens of size ~1 and the first
    token scaled by ``2^j``. The estimate and ``jacobian_norm`` refused ("the largest entry of the logit
    Gram matrix ... underflows") although the constant (~1e-182 at ``j = −600``, ~1e-302 at
    ``j = −1000``) is a normal double: the rescaling gave ``z = x_i0`` the exponent of ``X``, so the
    rescaled Gram ``||z̃||²||x̃||²`` underflowed. Oracle: on the unit ball every logit is at most
    ``~2^j`` in size, so ``J(W) = J(0)·(1 + O(2^j))`` and the constant is ``||J(0)||₂`` to far below
    rounding: a 50-digit mpmath closed form (``_mp_uniform_jacobian_norm``). The estimate attains it
    (``W = 0`` is one of its candidates) to the SVD's rounding, and the bound is above it."""
    rng = np.random.default_rng(11)
    X = rng.standard_normal((2, 3, 2))
    X[:, 0, :] = np.ldexp(X[:, 0, :], j)
    inst = A.Instance(X, np.ones(2), np.array([1.0, -0.5]))
    assert inst.self_attention
    truth = _mp_uniform_jacobian_norm(inst, kind, of)
    assert TINY < truth < 1e-180
    e = lipschitz_estimate(inst, kind=kind, radius=1.0, of=of, **FAST)
    assert abs(e.value - truth) <= svd_rtol(inst) * truth
    assert float(np.linalg.norm(e.W)) <= 1.0
    assert abs(jacobian_norm(inst, np.zeros((2, 2)), kind=kind, of=of) - truth) <= svd_rtol(inst) * truth
    assert lipschitz_bound(inst, kind=kind, radius=1.0, of=of).value >= truth * (1 - svd_rtol(inst))


def test_estimate_answers_when_sequence_scales_span_beyond_2_970() -> None:
    """Formerly the estimate's named limit, now answered: sequence 0 of size 1 (``z_0`` the largest query),
    sequence 1 with tokens ``2^1000`` and a first token (its query) ``2^-1000``. No common power-of-two
    rescaling of ``X`` and ``z`` brings both products ``||z_i||·||x_it||`` to O(1) (that path raised naming
    the subnormal band); the Jacobian is now evaluated per sequence, each on its own O(1) scale, and the
    blocks combined on the scale of the largest. Oracles: an independent torch Jacobian on the raw data
    (representable there) at ``W = 0`` and at the estimate's attaining point; the certified bound above."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2, 3, 2))
    X[1] = np.ldexp(X[1], 1000)
    X[1, 0] = np.ldexp(X[1, 0], -2000)
    inst = A.Instance(X, np.ones(2), np.array([1.0, -0.5]))
    truth = torch_jac_norm(inst, "softmax", "weights", np.zeros((2, 2)))
    assert 0.1 < truth < 10.0
    assert abs(jacobian_norm(inst, np.zeros((2, 2)), kind="softmax") - truth) <= svd_rtol(inst) * truth
    e = lipschitz_estimate(inst, kind="softmax", radius=1.0, **FAST)
    at_w = torch_jac_norm(inst, "softmax", "weights", e.W)
    assert abs(e.value - at_w) <= svd_rtol(inst) * at_w
    assert e.value >= truth * (1 - svd_rtol(inst))  # W = 0 is a candidate
    assert lipschitz_bound(inst, kind="softmax", radius=1.0).value >= e.value * (1 - svd_rtol(inst))


@pytest.mark.parametrize("R", [1.5e308, float(np.finfo(np.float64).max)])
@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
@pytest.mark.parametrize("of", OFS)
def test_bound_at_radius_near_float_max_no_overflow_warning(R: float, kind: str, of: str) -> None:
    """Regression (found by the ci scale sweep, ``jx = 1021``, reference radius ~1.1e307): a radius near
    1.8e308 made the max-weight bound's rounding allowance ``1 + |R·c| + |q|`` overflow in numpy (a
    RuntimeWarning, an error under this project's warning filter). The overflowing allowance only makes
    the cap ``p_i ≤ 1`` bind, so the answer is the radius-free bound. Oracles: monotonicity in ``R``
    with the radius-free cap (the bound at ``R = 1e300`` already has ``p_i = 1`` in float64, and no
    larger ball can lower it or push it past the cap: equal), and soundness against the independent
    torch Jacobian at ``W = 0`` and at a saturating point of the ball."""
    inst = A.random_instance(2, 2, 2, seed=0)
    b = lipschitz_bound(inst, kind=kind, radius=R, of=of).value
    assert b == lipschitz_bound(inst, kind=kind, radius=1e300, of=of).value
    for W in (np.zeros((2, 2)), np.full((2, 2), 1e3)):
        assert torch_jac_norm(inst, kind, of, W) <= b


def test_estimate_and_jacobian_norm_raise_named_range_error() -> None:
    """Where the constant is beyond float64 (weights map of data 2^600 × 2^600: ~2^1200) the estimate
    and the Jacobian norm raise the contract's error; where the attaining point ``W`` would underflow
    (``||W|| ~ 2^-1100`` while the output constant is ~2^700) the estimate says so."""
    base = A.random_instance(1, 2, 2, seed=1)
    big = scaled(base, 600, 600, 0)
    with pytest.raises(NumericalError, match="overflows " + RANGE):
        lipschitz_estimate(big, kind="softmax", radius=1.0, **FAST)
    with pytest.raises(NumericalError, match="overflows " + RANGE):
        jacobian_norm(big, np.zeros((2, 2)), kind="softmax")
    # output constant ~2^(2·600 + 500 − 1000) = 2^700, attaining point ~2^-(600 + 500) W̃: not a double
    odd = scaled(A.random_instance(2, 3, 2, seed=0), 600, 500, -1000)
    with pytest.raises(NumericalError, match="attaining point W.*underflows " + RANGE):
        lipschitz_estimate(odd, kind="softmax", radius=1.0, of="output", **FAST)
    # and the bound, which needs no point, answers
    assert 1e200 < lipschitz_bound(odd, kind="softmax", radius=1.0, of="output").value < 1e220


def test_jacobian_norm_saturated_point_raises_not_zero() -> None:
    """At logit gaps ~1e4 the true Jacobian is ~e^-1e4 > 0, beyond float64: never a silent 0."""
    inst = A.random_instance(1, 3, 2, seed=0)
    W = np.full((2, 2), 1e4)
    for kind in ("softmax", "normalized_linear"):
        with pytest.raises(NumericalError, match="below the rounding level"):
            jacobian_norm(inst, W, kind=kind)
    # a structurally zero Jacobian (every token equal) is exactly 0, not an error
    same = A.Instance(np.ones((1, 3, 2)), [1.0], [1.0, 2.0], [[1.0, 0.0]])
    assert jacobian_norm(same, W, kind="softmax") == 0.0


def test_compare_lipschitz_at_mixed_scales() -> None:
    """compare_lipschitz on the issue's mixed-scale data: every bound positive and ≥ its estimate."""
    base = A.random_instance(1, 2, 2, seed=0)
    inst = A.Instance(base.X * 1e-44, base.Y, base.v * 1e-123, base.z * 1e61)
    (row,) = compare_lipschitz([inst], [1.0], of="output", samples=4, steps=2)
    for kind in KINDS:
        assert 0.0 < row[f"estimate_{kind}"] <= row[f"bound_{kind}"] * (1 + svd_rtol(inst))


def test_bad_input_still_named() -> None:
    inst = _tiny_uniform_n1()
    with pytest.raises(AttnSVMError, match="radius"):
        lipschitz_bound(inst, radius=float("inf"))


#: Per-sequence exponents ``(p_0, p_1, p_2)`` and the common logit-scale exponent ``c``: sequence ``i``'s tokens
#: scaled by ``2^p_i`` and its query by ``2^(c − p_i)``. Spreads of ``2^1800`` between sequences (no common
#: rescaling of ``X`` and ``z`` holds them: the former path underflowed them to 0 or raised), one-sided spreads,
#: and the identity.
PER_SEQUENCE_EXPONENTS = [
    ((0, 0, 0), 0),
    ((900, -900, 0), 0),
    ((-900, 900, 450), 77),
    ((900, 900, -900), -100),
    ((1000, 0, -1000), 0),
]


@pytest.mark.parametrize(("p", "c"), PER_SEQUENCE_EXPONENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_jacobian_norm_exactly_equivariant_under_per_sequence_rescaling(p: tuple, c: int, kind: str) -> None:
    """Scaling sequence ``i``'s tokens by ``2^p_i`` and its query by ``2^(c − p_i)`` keeps every logit at
    ``W·2^−c``, so the weights Jacobian is ``2^c`` times the original, exactly (the sequences share ``W`` but
    each block scales by the same ``2^c``). Oracles: that equivariance, bit for bit (dyadic data on a grid of
    eighths: every rescaled entry is a normal double, no rounding), and at the base scale the independent
    torch Jacobian on the raw data (``torch_jac_norm``) to the SVD's rounding."""
    rng = np.random.default_rng(11)
    X = rng.integers(-8, 9, size=(3, 3, 2)) / 8.0
    z = rng.integers(-8, 9, size=(3, 2)) / 8.0
    z[np.all(z == 0, axis=1)] = 0.5  # every query nonzero
    W = rng.integers(-16, 17, size=(2, 2)) / 8.0
    base = A.Instance(X, np.ones(3), np.array([1.0, -0.5]), z)
    pe = np.array(p)
    scaled_inst = A.Instance(
        np.ldexp(X, pe[:, None, None]), np.ones(3), base.v, np.ldexp(z, (c - pe)[:, None])
    )
    got = jacobian_norm(scaled_inst, np.ldexp(W, -c), kind=kind)
    ref = jacobian_norm(base, W, kind=kind)
    assert got == math.ldexp(ref, c)
    truth = torch_jac_norm(base, kind, "weights", W)
    assert abs(ref - truth) <= svd_rtol(base) * truth
