"""Token masks in the Lipschitz functions (issue 15 §2): attnsvm.lipschitz on masked instances.

A masked token has weight 0 for every ``W``: its row of ``s`` is constant and it takes no part in its
sequence's weights, output or logits, so sequence ``i`` acts on its ``T_i`` allowed tokens. Oracles:

* **deletion** (an exact construction): the masked instance is the instance with the masked tokens
  deleted, sequence by sequence, combined as the module combines sequences: the logit map stacks the
  sequences' rows ``z_i ⊗ x_it`` (allowed ``t`` only), the bound uses per-sequence factors ``κ_i`` (those
  of the one-sequence instance built from the allowed tokens; ``κ_i = 0`` for a sequence with one allowed
  token, whose normalised weight is the constant 1) in ``min(||K𝓛||₂, max_i κ_i ||𝓛||₂)``, and the
  Jacobian stacks the sequences' blocks. Where every sequence keeps the same number of tokens the
  deleted instance is one ordinary :class:`Instance`;
* **mpmath at 50 digits**: the Jacobian of the masked attention map (weights by their definition over
  the allowed tokens, derivatives by the quotient rule) and its spectral norm;
* **bound ≥ estimate = Jacobian norm at the estimate's W** (the certified bound against an attained
  value, the attained value against mpmath), on masked and sequence-to-sequence (causal or not) instances;
* **invariance**: masked tokens are never read, so giving them norms 1e200 changes no result, bit for bit,
  and raises no warning;
* **the pre-mask implementation**: unmasked outputs pinned bit for bit (``float.hex``) as recorded before
  masks were supported (this platform's float64; a regression pin, not a correctness oracle).
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.lipschitz import (
    JACOBIAN_ULPS,
    bound_rounding_rtol,
    compare_lipschitz,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
    logit_gram,
    logit_norm,
)

EPS = float(np.finfo(np.float64).eps)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")
#: Digits of the mpmath oracle: every input is an exact double, every oracle step has relative error
#: 1e-50, far below float64's 1e-16.
ORACLE_DPS = 50
#: Search budget of the estimates here (small: the file stays under a minute).
FAST = {"samples": 8, "steps": 6, "starts": 2}
#: Size of the masked tokens of the invariance tests: far beyond every other entry (1e200² overflows),
#: so a masked token that set a scale, a norm or a search cap would change the result or overflow.
HUGE = 1e200
#: Hypothesis examples per property (each is a few small eigenproblems or Jacobians).
EXAMPLES = 40


# ------------------------------------------------------------------------------ data
def _mask_rows(rng: np.random.Generator, n: int, T: int, *, equal: int | None) -> np.ndarray:
    """A valid mask: ``equal`` allowed tokens per row, or a random nonempty subset per row."""
    mask = np.zeros((n, T), dtype=bool)
    for i in range(n):
        k = equal if equal is not None else int(rng.integers(1, T + 1))
        mask[i, rng.choice(T, size=k, replace=False)] = True
    return mask


def _instance(
    seed: int, n: int, T: int, d: int, *, equal: int | None = None, masked_value: float | None = None
) -> A.Instance:
    """Gaussian cross-attention data with a mask; masked entries set to ``masked_value`` if given."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    v = rng.standard_normal(d)
    Y = rng.choice(np.array([-1.0, 1.0]), size=n)
    mask = _mask_rows(rng, n, T, equal=equal)
    if masked_value is not None:
        X[~mask] = masked_value
    return A.Instance(X, Y, v, z, mask=mask)


@st.composite
def masked_instances(draw: st.DrawFn, *, equal: bool = False) -> A.Instance:
    """Masked instances built valid: each row keeps a forced token plus any others (shrinks to small
    sizes, seed 0 and masks with one allowed token per row). ``equal``: every row keeps the same number
    ``T' ≥ 2`` of tokens (the deleted data is then one ``Instance``, which needs ``T ≥ 2``)."""
    n = draw(st.integers(1, 3))
    T = draw(st.integers(2, 5))
    d = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    v = rng.standard_normal(d)
    if equal:
        k = draw(st.integers(2, T))
        rows = [draw(st.permutations(range(T)))[:k] for _ in range(n)]
        mask = np.zeros((n, T), dtype=bool)
        for i, r in enumerate(rows):
            mask[i, list(r)] = True
    else:
        mask = np.array([draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(n)])
        keep = [draw(st.integers(0, T - 1)) for _ in range(n)]
        mask[np.arange(n), keep] = True  # every row keeps ≥ 1 token: valid by construction
    return A.Instance(X, np.ones(n), v, z, mask=mask)


def _with_masked(inst: A.Instance, value: float) -> A.Instance:
    """The same instance with every masked entry of ``X`` replaced by ``value``."""
    X = np.array(inst.X)
    X[~inst.allowed] = value
    return A.Instance(X, inst.Y, inst.v, None if inst.self_attention else inst.z, mask=inst.mask)


def _sub(inst: A.Instance, i: int) -> A.Instance | None:
    """Sequence ``i`` with its masked tokens deleted, a one-sequence instance (``None`` if ``T_i = 1``)."""
    keep = inst.allowed[i]
    if keep.sum() < 2:
        return None
    return A.Instance(inst.X[i][keep][None], inst.Y[i : i + 1], inst.v, inst.z[i : i + 1])


def _deleted(inst: A.Instance) -> A.Instance:
    """The deleted instance when every sequence keeps the same number ``T' ≥ 2`` of tokens."""
    counts = inst.allowed.sum(axis=1)
    assert np.all(counts == counts[0]) and counts[0] >= 2
    X = inst.X[inst.allowed].reshape(inst.n, int(counts[0]), inst.d)
    return A.Instance(X, inst.Y, inst.v, inst.z)


def _kron_rows(inst: A.Instance) -> np.ndarray:
    """The deleted logit map, explicitly: rows ``z_i ⊗ x_it`` over the allowed ``(i, t)``, in order."""
    return np.array(
        [np.kron(inst.z[i], inst.X[i, t]) for i in range(inst.n) for t in np.flatnonzero(inst.allowed[i])]
    )


# ------------------------------------------------------------------------------ the mpmath oracle
def _mp_jacobian_norm(inst: A.Instance, W: np.ndarray, kind: str, of: str) -> mpmath.mpf:
    """``||J(W)||₂`` of the masked map at 50 digits: ``J[(i,t), (p,q)] = Σ_u ∂s_it/∂l_iu · x_iup z_iq``
    over the allowed ``t, u`` (outputs: ``∂f_i/∂l_iu = Σ_t a_it ∂s_it/∂l_iu``), the weights from their
    definition over the allowed tokens and the derivative by the quotient rule."""
    with mpmath.workdps(ORACLE_DPS):
        d = inst.d
        Wm = mpmath.matrix(W.tolist())
        rows = []
        for i in range(inst.n):
            idx = [int(t) for t in np.flatnonzero(inst.allowed[i])]
            z = mpmath.matrix(inst.z[i].tolist())
            xs = [mpmath.matrix(inst.X[i, t].tolist()) for t in idx]
            Wz = Wm * z
            l = [sum(x[p] * Wz[p] for p in range(d)) for x in xs]
            a = [sum(x[p] * mpmath.mpf(float(inst.v[p])) for p in range(d)) for x in xs]
            k = len(idx)
            if kind == "linear":
                ds = [[mpmath.mpf(int(t == u)) for u in range(k)] for t in range(k)]
            else:
                if kind == "softmax":
                    phi = [mpmath.exp(x) for x in l]
                    dphi = phi
                else:  # φ = elu + 1: 1 + l for l > 0, e^l for l ≤ 0
                    phi = [1 + x if x > 0 else mpmath.exp(x) for x in l]
                    dphi = [mpmath.mpf(1) if x > 0 else mpmath.exp(x) for x in l]
                S = sum(phi)
                ds = [
                    [((dphi[t] * S if t == u else 0) - phi[t] * dphi[u]) / S**2 for u in range(k)]
                    for t in range(k)
                ]
            dl = [[sum(ds[t][u] * a[t] for t in range(k)) for u in range(k)]] if of == "output" else ds
            for r in dl:
                rows.append(
                    [sum(r[u] * xs[u][p] * z[q] for u in range(k)) for p in range(d) for q in range(d)]
                )
        J = mpmath.matrix(rows)
        return max(mpmath.svd_r(J, compute_uv=False))


def _jacobian_atol(inst: A.Instance, W: np.ndarray, of: str) -> float:
    """Documented absolute accuracy of ``jacobian_norm`` (module: ``_jacobian_floors``), from the
    deleted data: ``JACOBIAN_ULPS·(m + d² + T + 2 + 2d(1 + λ))·eps·||𝓛||_F`` (times ``T·max_t Σ|x||v|`` for
    outputs), ``m = Σ_i T_i`` rows, ``λ`` the largest |logit|: the autograd entries' rounding, which grows
    with the logits, and the SVD's backward error."""
    keys, z = inst.keys, inst.z
    c = np.linalg.norm(keys, axis=-1) * np.linalg.norm(z, axis=1)[:, None]
    lam = float(np.max(c)) * float(np.linalg.norm(W))
    m, T, d = int(inst.allowed.sum()), inst.T, inst.d
    scale = 1.0 if of == "weights" else T * float(np.max(np.abs(keys) @ np.abs(inst.v)))
    return JACOBIAN_ULPS * (m + d * d + T + 2 + 2 * d * (1 + lam)) * EPS * float(np.linalg.norm(c)) * scale


def _svd_rtol(inst: A.Instance) -> float:
    """Relative error of a backward-stable largest singular value of an ``m × d²`` matrix,
    ``4·max(m, d²)·eps`` (as ``est_rtol`` of tests/test_lipschitz.py), ``m`` the allowed rows."""
    return 4.0 * max(int(inst.allowed.sum()), inst.d**2) * EPS


# ------------------------------------------------------------------------------ the logit map
@settings(max_examples=EXAMPLES, deadline=None)
@given(masked_instances())
def test_logit_gram_and_norm_equal_the_deleted_logit_map(inst: A.Instance) -> None:
    """Deletion: ``logit_gram``'s allowed block is the Gram of the explicit deleted rows ``z_i ⊗ x_it``
    (masked rows and columns exactly 0), ``logit_norm`` their largest singular value; tolerances as
    tests/test_lipschitz.py (entries: a d²-long vs two d-long dot products, ≤ 4d²·eps·max|G|; norms: two
    backward-stable solvers, ≤ 8(m + d²)·eps relative)."""
    al = inst.allowed.ravel()
    G = logit_gram(inst)
    assert G.shape == (inst.n * inst.T,) * 2
    assert np.all(G[~al] == 0) and np.all(G[:, ~al] == 0)
    rows = _kron_rows(inst)
    gram_atol = 4 * inst.d**2 * EPS * float(np.max(np.abs(G)))
    np.testing.assert_allclose(G[np.ix_(al, al)], rows @ rows.T, rtol=0, atol=gram_atol)
    sv = float(np.linalg.svd(rows, compute_uv=False)[0])
    m = int(al.sum())
    assert abs(logit_norm(inst) - sv) <= 8 * (m + inst.d**2) * EPS * sv
    assert bound_rounding_rtol(inst) == (8 * m + m * (2 * inst.d + 2)) * EPS


@settings(max_examples=EXAMPLES, deadline=None)
@given(masked_instances(equal=True))
def test_logit_map_equals_deleted_instance_exactly(inst: A.Instance) -> None:
    """Deletion, every sequence keeping ``T'`` tokens: the same Gram entries (numpy's elementwise
    products of the same power-of-two splits, ``einsum`` summing each entry's ``d`` products in order)
    and the same eigenproblem, so ``logit_gram``'s allowed block and ``logit_norm`` equal the deleted
    instance's bit for bit."""
    dele = _deleted(inst)
    al = inst.allowed.ravel()
    assert np.array_equal(logit_gram(inst)[np.ix_(al, al)], logit_gram(dele))
    assert logit_norm(inst) == logit_norm(dele)
    assert bound_rounding_rtol(inst) == bound_rounding_rtol(dele)


# ------------------------------------------------------------------------------ the bound
def _kappa_rtol(sub: A.Instance, R: float) -> float:
    """Relative agreement of two float64 evaluations of one ``κ_i`` (same formula, same operands, in
    arrays of different shapes): the max-weight bound's log carries ``_log_weight_ulps·eps·size``
    (``2(2d + T + 16)·eps·(1 + |exponent| + |q|)``, module ``_log_max_weight``), with
    ``|exponent| ≤ 2R·max||z||·max||x|| + log1p(R·max c)`` and ``|q| ≤ max|exponent| + log T``; each
    evaluation is within it of the exact log, so they agree to twice it (doubled: exp(δ) ≈ 1 + δ)."""
    zmax = float(np.max(np.linalg.norm(sub.z, axis=1)))
    xmax = float(np.max(np.linalg.norm(sub.X, axis=-1)))
    ex = 2 * R * zmax * xmax + math.log1p(R * zmax * xmax)
    size = 1 + 2 * ex + math.log(sub.T)
    return 4 * 2 * (2 * sub.d + sub.T + 16) * EPS * size


@settings(max_examples=EXAMPLES, deadline=None)
@given(masked_instances(), st.sampled_from(KINDS), st.sampled_from(OFS), st.sampled_from([0.3, 2.0, 50.0]))
def test_bound_equals_deletion_per_sequence(inst: A.Instance, kind: str, of: str, R: float) -> None:
    """Deletion, as the module combines sequences: ``κ_i`` equals the factor of the one-sequence deleted
    instance (``κ_i = 0`` for one allowed token: its weight is the constant 1, output ``a_it``), and the
    nominal bound is ``min(||K𝓛||₂, max_i κ_i ||𝓛||₂)`` from the explicit deleted rows (numpy SVD; the
    two eigen/SVD solvers agree to ``8(m + d²)·eps``, the factors to ``_kappa_rtol``)."""
    b = lipschitz_bound(inst, kind=kind, radius=R, of=of)
    kap = np.array(b.kappa)
    for i in range(inst.n):
        sub = _sub(inst, i)
        if kind == "linear":
            assert kap[i] == 1.0
        elif sub is None:
            assert kap[i] == 0.0  # one allowed token: the sequence's map is constant
        else:
            ref = float(lipschitz_bound(sub, kind=kind, radius=R, of=of).kappa[0])
            assert abs(kap[i] - ref) <= _kappa_rtol(sub, R) * ref
    rows = _kron_rows(inst)
    m = rows.shape[0]
    svd_rtol = 8 * (m + inst.d**2) * EPS + 2 * bound_rounding_rtol(inst)
    if kind == "linear" and of == "output":
        # the exact norm of f_i = (Σ_t a_it x_it)ᵀ W z_i over the allowed t
        y = np.einsum("it,itd->id", inst.keys @ inst.v, inst.keys)
        ref_nom = float(
            np.linalg.svd(np.array([np.kron(inst.z[i], y[i]) for i in range(inst.n)]), compute_uv=False)[0]
        )
    else:
        scale = np.repeat(kap, inst.allowed.sum(axis=1))
        kl = float(np.linalg.svd(scale[:, None] * rows, compute_uv=False)[0])
        ref_nom = min(kl, float(np.max(kap)) * float(np.linalg.svd(rows, compute_uv=False)[0]))
    kap_rtol = max(
        (_kappa_rtol(s, R) for s in (_sub(inst, i) for i in range(inst.n)) if s is not None), default=0.0
    )
    assert abs(b.nominal - ref_nom) <= (svd_rtol + kap_rtol) * ref_nom


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_bound_equals_deleted_instance(seed: int, kind: str, of: str) -> None:
    """Deletion, every sequence keeping 3 of 5 tokens: the bound of the masked instance equals that of
    the deleted ``Instance``, to the factors' agreement (``_kappa_rtol``, max over sequences) plus the
    two eigenproblems' ``2·rounding_rtol``; ``rounding_rtol`` itself is the deleted one (``m = Σ T_i``)."""
    inst = _instance(seed, 3, 5, 3, equal=3)
    dele = _deleted(inst)
    for R in (0.5, 4.0):
        bm, bd = (
            lipschitz_bound(inst, kind=kind, radius=R, of=of),
            lipschitz_bound(dele, kind=kind, radius=R, of=of),
        )
        assert bm.rounding_rtol == bd.rounding_rtol
        tol = max(_kappa_rtol(_sub(inst, i), R) for i in range(inst.n)) + 2 * bd.rounding_rtol
        assert abs(bm.value - bd.value) <= tol * bd.value
        np.testing.assert_allclose(bm.kappa, bd.kappa, rtol=tol, atol=0)


# ------------------------------------------------------------------------------ the Jacobian
@settings(max_examples=EXAMPLES, deadline=None)
@given(masked_instances(), st.sampled_from(KINDS), st.sampled_from(OFS), st.sampled_from([0.5, 2.0]))
def test_jacobian_norm_against_mpmath(inst: A.Instance, kind: str, of: str, scale: float) -> None:
    """mpmath (50 digits): ``jacobian_norm`` of the masked map at a random ``W`` equals the spectral norm
    of the 50-digit Jacobian over the allowed tokens, to the documented accuracy (SVD ``4·max(m, d²)·eps``
    relative plus the autograd floor ``_jacobian_atol``). Logits are O(1) (``||W||_F`` ≲ 2·d, O(1)
    data), far from saturation, so no value is at its rounding floor: a refusal fails the test."""
    W = scale * np.random.default_rng(inst.n * 7 + inst.T).standard_normal((inst.d, inst.d))
    ref = float(_mp_jacobian_norm(inst, W, kind, of))
    val = jacobian_norm(inst, W, kind=kind, of=of)
    assert abs(val - ref) <= _svd_rtol(inst) * ref + 2 * _jacobian_atol(inst, W, of)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_jacobian_norm_equals_deleted_instance(seed: int, kind: str, of: str) -> None:
    """Deletion, equal counts: ``jacobian_norm`` of the masked instance equals that of the deleted
    ``Instance`` at the same ``W`` (each within the documented accuracy of the exact value, so within
    twice it of each other); and with ragged masks the 50-digit Jacobian norm of the masked map equals that
    of the explicitly deleted rows (the per-sequence blocks of the one-sequence instances stacked)."""
    inst = _instance(seed, 3, 5, 3, equal=3)
    dele = _deleted(inst)
    W = np.random.default_rng(seed + 100).standard_normal((3, 3))
    vm, vd = jacobian_norm(inst, W, kind=kind, of=of), jacobian_norm(dele, W, kind=kind, of=of)
    assert abs(vm - vd) <= 2 * (_svd_rtol(dele) * vd + _jacobian_atol(dele, W, of))


# ------------------------------------------------------------------------------ bound ≥ estimate ≥ oracle
def _seq2seq(seed: int, causal: bool) -> A.Instance:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2, 4, 2))
    return A.Instance.from_sequences(
        X, rng.choice([-1.0, 1.0], size=(2, 4)), rng.standard_normal(2), causal=causal
    )


CASES = {
    "ragged": lambda: _instance(3, 3, 5, 2),
    "equal": lambda: _instance(4, 2, 4, 2, equal=2),
    "seq2seq": lambda: _seq2seq(5, False),
    "causal": lambda: _seq2seq(6, True),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_bound_geq_estimate_attained_against_mpmath(case: str, kind: str, of: str) -> None:
    """Certified bound ≥ attained estimate, and the estimate is the 50-digit Jacobian norm of the masked
    map at its returned ``W`` (to the documented accuracy), on masked and sequence-to-sequence instances
    (a causal query at position 0 has one allowed token: ``κ = 0``). Deletion: the estimate's ``W``
    attains the same value on the deleted data (mpmath evaluates only the allowed rows)."""
    inst = CASES[case]()
    R = 3.0
    b = lipschitz_bound(inst, kind=kind, radius=R, of=of)
    e = lipschitz_estimate(inst, kind=kind, radius=R, of=of, **FAST)
    assert np.linalg.norm(e.W) <= R * (1 + 4 * EPS)
    ref = float(_mp_jacobian_norm(inst, e.W, kind, of))
    tol = _svd_rtol(inst) * ref + 2 * _jacobian_atol(inst, e.W, of)
    assert abs(e.value - ref) <= tol
    assert ref <= b.value and e.value <= b.value * (1 + _svd_rtol(inst))
    if case == "causal" and kind != "linear":
        assert np.all(b.kappa[0::4] == 0.0)  # rows i·T + 0 attend to their own token only


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_estimate_attained_on_the_deleted_instance(kind: str, of: str) -> None:
    """Deletion, equal counts: the masked estimate's ``W`` attains its value on the deleted ``Instance``
    (``jacobian_norm`` there, within twice the documented accuracy), and the deleted estimate's ``W``
    attains its value on the masked one; both are ≤ either bound."""
    inst = _instance(7, 3, 5, 3, equal=3)
    dele = _deleted(inst)
    em = lipschitz_estimate(inst, kind=kind, radius=2.0, of=of, **FAST)
    ed = lipschitz_estimate(dele, kind=kind, radius=2.0, of=of, **FAST)
    for e, other in ((em, dele), (ed, inst)):
        tol = 2 * (_svd_rtol(dele) * e.value + _jacobian_atol(dele, e.W, of))
        assert abs(jacobian_norm(other, e.W, kind=kind, of=of) - e.value) <= tol
        assert e.value <= float(lipschitz_bound(inst, kind=kind, radius=2.0, of=of)) * (1 + _svd_rtol(dele))


# ------------------------------------------------------------------------------ masked tokens are never read
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("of", OFS)
def test_huge_masked_tokens_change_nothing(kind: str, of: str) -> None:
    """Invariance: masked tokens of norm 1e200 (their squares overflow) give bit-for-bit the results of
    masked tokens 0, for every function, without a warning: they set no scale, norm, factor or search cap."""
    base = _instance(11, 3, 5, 3, masked_value=0.0)
    huge = _with_masked(base, HUGE)
    W = np.random.default_rng(0).standard_normal((3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for R in (0.5, 20.0):
            b0, b1 = (
                lipschitz_bound(base, kind=kind, radius=R, of=of),
                lipschitz_bound(huge, kind=kind, radius=R, of=of),
            )
            assert (b0.value, b0.nominal, b0.formula, b0.log_value) == (
                b1.value,
                b1.nominal,
                b1.formula,
                b1.log_value,
            )
            assert np.array_equal(b0.kappa, b1.kappa)
        assert jacobian_norm(base, W, kind=kind, of=of) == jacobian_norm(huge, W, kind=kind, of=of)
        e0 = lipschitz_estimate(base, kind=kind, radius=5.0, of=of, **FAST)
        e1 = lipschitz_estimate(huge, kind=kind, radius=5.0, of=of, **FAST)
        assert e0.value == e1.value and np.array_equal(e0.W, e1.W) and e0.evaluations == e1.evaluations
        assert np.array_equal(logit_gram(base), logit_gram(huge)) and logit_norm(base) == logit_norm(huge)
        assert bound_rounding_rtol(base) == bound_rounding_rtol(huge)


def test_single_token_sequences_are_constant() -> None:
    """Deletion: with one allowed token per sequence the normalised weights and outputs are constant
    (weight 1): bound, estimate and Jacobian norm are exactly 0 (no warning, no search); the linear kind's
    weights are the logits of the allowed tokens, exactly the logit map (bound = ``||𝓛||₂`` of those rows)."""
    inst = _instance(2, 3, 4, 3, equal=1, masked_value=HUGE)
    W = np.random.default_rng(1).standard_normal((3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in ("softmax", "normalized_linear"):
            for of in OFS:
                assert lipschitz_bound(inst, kind=kind, radius=5.0, of=of).value == 0.0
                e = lipschitz_estimate(inst, kind=kind, radius=5.0, of=of, **FAST)
                assert e.value == 0.0 and e.evaluations == 0
                assert jacobian_norm(inst, W, kind=kind, of=of) == 0.0
        sv = float(np.linalg.svd(_kron_rows(inst), compute_uv=False)[0])
        b = lipschitz_bound(inst, kind="linear", radius=5.0)
        assert abs(b.nominal - sv) <= 8 * (inst.n + inst.d**2) * EPS * sv


def test_masked_query_token_is_still_the_query() -> None:
    """Self-attention with token 0 masked: ``z_i = x_i0`` is still the query (a query need not be a key),
    so the bound equals that of the deleted cross-attention instance with ``z = x_i0`` (deletion)."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, 4, 3))
    mask = np.array([[False, True, True, True], [False, True, True, True]])
    inst = A.Instance(X, np.ones(2), rng.standard_normal(3), mask=mask)
    dele = A.Instance(X[:, 1:], np.ones(2), inst.v, X[:, 0])
    for kind in KINDS:
        bm, bd = lipschitz_bound(inst, kind=kind, radius=2.0), lipschitz_bound(dele, kind=kind, radius=2.0)
        tol = max(_kappa_rtol(_sub(inst, i), 2.0) for i in range(2)) + 2 * bd.rounding_rtol
        assert abs(bm.value - bd.value) <= tol * bd.value


# ------------------------------------------------------------------------------ unmasked: unchanged
#: Outputs of the pre-mask implementation (recorded before masks were supported), ``float.hex``:
#: instance 0 is ``random_instance(2, 3, 3, seed=1)``, instance 1 the sequence-to-sequence instance of
#: ``default_rng(4).standard_normal((2, 3, 2))`` (labels and v ones); bounds at R = 3, Jacobian norms at
#: ``W = default_rng(j).standard_normal((d, d))``, estimates at R = 2 with 8 samples, 6 steps.
PINNED = {
    0: {
        "logit_norm": "0x1.d5c98c2aef33fp+0",
        ("softmax", "weights"): ("0x1.d5c98c2aef3efp-1", "0x1.f2219155bdbdep-2", "0x1.6a033751abae7p-1"),
        ("softmax", "output"): ("0x1.4f687fe0ccdd7p+1", "0x1.6dae6f00c2800p+0", "0x1.098599f45c06cp+1"),
        ("linear", "output"): ("0x1.5dc9faa36db71p+2", "0x1.5dc9faa36daefp+2", "0x1.5dc9faa36daefp+2"),
        ("normalized_linear", "weights"): (
            "0x1.d5c98c2aef3efp-1",
            "0x1.d70e824092bc1p-2",
            "0x1.3a2391915a836p-1",
        ),
    },
    1: {
        "logit_norm": "0x1.b4f009d0d909dp+2",
        ("softmax", "weights"): ("0x1.b4f009d0d924bp+1", "0x1.2a80572dc4c80p-2", "0x1.2c0b344640608p+1"),
        ("normalized_linear", "output"): (
            "0x1.28004f5f5ff3ap+3",
            "0x1.534583db297c9p-1",
            "0x1.9536ef4b5d81bp+2",
        ),
    },
}


@pytest.mark.parametrize("j", list(PINNED))
def test_unmasked_outputs_unchanged_bit_for_bit(j: int) -> None:
    """The pre-mask implementation: on unmasked instances every output is the recorded one, bit for bit
    (the masked code paths are taken only when ``inst.mask`` is not ``None``)."""
    if j == 0:
        inst = A.random_instance(2, 3, 3, seed=1)
    else:
        inst = A.Instance.from_sequences(
            np.random.default_rng(4).standard_normal((2, 3, 2)), np.ones((2, 3)), np.ones(2)
        )
    assert inst.mask is None
    W = np.random.default_rng(3 if j == 1 else 0).standard_normal((inst.d, inst.d))
    pins = PINNED[j]
    assert logit_norm(inst).hex() == pins["logit_norm"]
    for key, (bound, jac, est) in ((k, v) for k, v in pins.items() if k != "logit_norm"):
        kind, of = key
        assert lipschitz_bound(inst, kind=kind, radius=3.0, of=of).value.hex() == bound
        assert jacobian_norm(inst, W, kind=kind, of=of).hex() == jac
        assert lipschitz_estimate(inst, kind=kind, radius=2.0, of=of, samples=8, steps=6).value.hex() == est


# ------------------------------------------------------------------------------ scale contract, masked
@pytest.mark.parametrize(("a", "b"), [(-500, 300), (400, -100), (-300, -300)])
@pytest.mark.parametrize("kind", KINDS)
def test_masked_power_of_two_equivariance(a: int, b: int, kind: str) -> None:
    """Scale contract on the masked path (symmetry: ``X → 2^a X``, ``z → 2^b z``, ``R → 2^-(a+b) R``
    keeps every logit, so the weights constants scale by exactly ``2^(a+b)``, the outputs' with ``v``
    fixed by ``2^(2a+b)``): bound, Jacobian norm and estimate are exactly equivariant, with masked tokens
    of size 1e200 that would overflow any scale they entered."""
    base = _instance(13, 3, 4, 2, masked_value=HUGE)
    X = np.ldexp(np.array(base.keys), a)  # (masked entries 0 first: 1e200·2^400 would overflow)
    X[~base.allowed] = HUGE
    big = A.Instance(X, base.Y, base.v, np.ldexp(base.z, b), mask=base.mask)
    R = 2.0
    W = np.random.default_rng(2).standard_normal((2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for of, k in (("weights", a + b), ("output", 2 * a + b)):
            b0 = lipschitz_bound(base, kind=kind, radius=R, of=of).value
            assert lipschitz_bound(big, kind=kind, radius=math.ldexp(R, -(a + b)), of=of).value == math.ldexp(
                b0, k
            )
            j0 = jacobian_norm(base, W, kind=kind, of=of)
            assert jacobian_norm(big, np.ldexp(W, -(a + b)), kind=kind, of=of) == math.ldexp(j0, k)
            e0 = lipschitz_estimate(base, kind=kind, radius=R, of=of, **FAST)
            e1 = lipschitz_estimate(big, kind=kind, radius=math.ldexp(R, -(a + b)), of=of, **FAST)
            assert e1.value == math.ldexp(e0.value, k) and np.array_equal(e1.W, np.ldexp(e0.W, -(a + b)))


@pytest.mark.parametrize("case", ["ragged", "causal"])
@pytest.mark.parametrize("kind", ["softmax", "normalized_linear"])
def test_saturated_masked_search_no_nan_or_warning(case: str, kind: str) -> None:
    """Scale contract at saturation (radius 1e4: logits in the thousands, every masked logit −inf):
    the estimate is a finite attained value ≤ the bound, or a ``NumericalError`` naming the rounding
    floor; never NaN, inf or a RuntimeWarning."""
    inst = CASES[case]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for of in OFS:
            b = lipschitz_bound(inst, kind=kind, radius=1e4, of=of)
            try:
                e = lipschitz_estimate(inst, kind=kind, radius=1e4, of=of, **FAST)
            except NumericalError as exc:
                assert "rounding level" in str(exc)
                continue
            assert math.isfinite(e.value) and 0.0 <= e.value <= b.value * (1 + _svd_rtol(inst))


def test_compare_lipschitz_accepts_masks() -> None:
    """``compare_lipschitz`` on a causal instance: every gap ``bound / estimate`` is ≥ 1 up to the SVD's
    rounding (certified bound against attained estimate), no ratio NaN."""
    inst = CASES["causal"]()
    rows = compare_lipschitz([inst], [1.0], samples=4, steps=2)
    for kind in KINDS:
        assert rows[0][f"gap_{kind}"] >= 1 - _svd_rtol(inst)
    assert all(not (isinstance(x, float) and math.isnan(x)) for x in rows[0].values())


def test_equal_allowed_tokens_give_exact_zero() -> None:
    """Deletion: a sequence whose allowed tokens coincide has constant normalised weights (and outputs),
    whatever its masked tokens; with every sequence so, the Jacobian is exactly 0 at every ``W`` (decided
    exactly on the allowed tokens; the masked ones differ and are huge)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 1, 3))
    X = np.concatenate([x, x, np.full((2, 1, 3), HUGE), x], axis=1)  # tokens 0, 1, 3 equal; 2 masked
    mask = np.array([[True, True, False, True], [True, False, True, True]])
    X[1, 2] = x[1, 0]
    X[1, 1] = -HUGE
    inst = A.Instance(X, np.ones(2), rng.standard_normal(3), rng.standard_normal((2, 3)), mask=mask)
    W = rng.standard_normal((3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in ("softmax", "normalized_linear"):
            for of in OFS:
                assert jacobian_norm(inst, W, kind=kind, of=of) == 0.0
                e = lipschitz_estimate(inst, kind=kind, radius=3.0, of=of, **FAST)
                assert e.value == 0.0 and e.evaluations == 0


@pytest.mark.parametrize("kind", ["linear", "softmax", "normalized_linear"])
def test_weights_map_does_not_depend_on_v_masked(kind: str) -> None:
    """The weights map W ↦ s(W) does not read v (oracle: the same instance with v = 1): with v = 0, which makes
    every *output* block zero, the masked weights Jacobian norm, bound and estimate are unchanged and nonzero."""
    rng = np.random.default_rng(7)
    X, z = rng.standard_normal((3, 4, 3)), rng.standard_normal((3, 3))
    mask = np.array([[True, False, True, True], [True, True, False, True], [False, True, True, True]])
    W = 0.3 * rng.standard_normal((3, 3))
    with_v = A.Instance(X, np.ones(3), np.ones(3), z, mask=mask)
    zero_v = A.Instance(X, np.ones(3), np.zeros(3), z, mask=mask)
    j1 = A.jacobian_norm(with_v, W, kind=kind, of="weights")
    assert j1 > 0 and A.jacobian_norm(zero_v, W, kind=kind, of="weights") == j1
    b1 = A.lipschitz_bound(with_v, kind=kind, radius=2.0, of="weights")
    assert float(A.lipschitz_bound(zero_v, kind=kind, radius=2.0, of="weights")) == float(b1) > 0
