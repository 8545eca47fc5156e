"""The batched engine on data spanning the range within one sequence: pinned counterexamples.

Each instance here was answered wrongly by `attnsvm.BatchEngine` (both paths, hence `run_gd_batch`) while the
single form and 400-digit mpmath agreed. Three causes, each pinned by the smallest instance found:

* values ``x_itᵀv`` formed in the instance's units underflowed to 0 (a key 1.5e-228 next to keys of 0.8, ``v``
  3.6e-150): two tied maximisers with values 0 and 5.5e-378 were taken for exact copies, the term that
  dominates ``∇L`` (~1e-606) was dropped and the runner-up's ``e^{−7e26}`` returned instead — the opposite
  direction and ``log||∇L||`` −7.2e26 for −1395.75 (the sweep that found it: 10 of 667 instances wrong);
* terms ``c·x·zᵀ`` underflowed although every factor is normal (a value difference of 8e-182 times a key
  of 4e-142): the log-domain path returned a NaN direction with ``log||∇L|| = +inf`` and no refusal, the fast
  path ``log||∇L||`` of the smallest subnormal (−744.44 for −744.65), or every term came out exactly 0 and a
  determined gradient was refused as "exactly zero";
* a sequence whose every term is exactly 0 was taken for a live one (``nan_to_num`` turned its
  ``log|c| = −inf`` into −1.8e308) and its instance refused as "ℓ' undetermined" where ``∇L = 0`` exactly.

The oracle is ``∇L`` in mpmath (:func:`mp_grad`, every token of every sequence, masked tokens deleted) or an
exact construction; never the engine or the single form.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _mp_oracle import mp_grad

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.gd import run_gd_batch
from attnsvm.model._grad import CANCELLED_MESSAGE

torch = pytest.importorskip("torch")

EPS = float(np.finfo(np.float64).eps)
#: Normwise accuracy of a direction: nT(d+T)·eps ≤ 108·eps for n ≤ 2, T ≤ 3, d ≤ 2 (each weight a product of a
#: few log-sum-exp terms, each entry of G a sum of nT products); 256·eps leaves a factor 2 for the logits'
#: rounding (the terms that dominate here have weights ½ or 1, which that rounding does not move). For a
#: gradient whose terms cancel (κ = Σ|w||x||z|/||∇L|| > 1, from the oracle) the bound is DIR_TOL·κ.
DIR_TOL = 256 * EPS
#: log||∇L|| to eps·|log||∇L||| (a sum of logs of that size) plus the direction's relative accuracy:
#: 4·eps·1400 + 256·eps ≈ 1.3e-12 at the sizes here; 1e-10 leaves a factor 75.
LOG_NORM_ATOL = 1e-10


def _engine(inst: A.Instance, W: np.ndarray, loss: str, path: str) -> tuple[np.ndarray, float, bool, object]:
    """``(direction, log||∇L||, cancelled, undetermined)`` of ``inst`` at ``W`` (user's scale) by the engine."""
    eng = A.BatchEngine.from_instances([inst], loss=loss, path=path)
    G, inv, log_norm, cancelled = eng.gradient(eng.to_engine_scale(torch.as_tensor(W[None]).clone()))
    k = float(eng.scale_exponents[0]) * math.log(2.0)
    flag = cancelled is not None and bool(cancelled[0])
    return (G[0] * inv[0]).numpy().copy(), float(log_norm[0]) + k, flag, eng.undetermined


# ------------------------------------------------------------ values that underflow in the engine's units
#: The sweep's reproducer (seed 0, instance 89), correlation loss. Sequence 1: keys 0, 0.83 and 1.5e-228,
#: z = −0.65, W = 1.2e96: logits 0, −6.5e95, −1.2e-133, so keys 0 and 1.5e-228 share the weight ½ and carry
#: values 0 and 5.5e-378 (not a double: 0 in the instance's units), whose term (~1e-606) dominates ∇L.
#: Sequence 0 has a runner-up at e^{−7.2e26} only.
_VALUES = (
    np.array([[[-0.5053038754733633], [-2.5375140291429935e-130], [8.9003414298606974e-70]],
              [[0.0], [0.8275222344074514], [1.5232824405903812e-228]]]),
    np.array([-1.0, -1.0]),
    np.array([[0.6783192417163852], [-0.6512947277392238]]),
    np.array([3.6248001852053725e-150]),
    np.array([[1.197660883006112e96]]),
)  # fmt: skip


# ------------------------------------------------------------ terms that underflow in the engine's units
#: One sequence, logistic loss, Y = 1, z = 1, v = −2e-40, W = 1e79: keys 0, −1 and x₂ with logits 0, −1e79
#: and 1e79·x₂ (≈ 0): keys 0 and x₂ share the weight ½, values 0 and −2e-40·x₂. ∇L ≈ ℓ'·¼·a₂·x₂ ~ e^{−745}:
#: each factor is a normal double, the term c·x·zᵀ is at the bottom of the subnormals. x₂ = 4e-142: the
#: log-domain path returned NaN with log||∇L|| = +inf (no refusal), the fast path −744.44 (the smallest
#: subnormal's log) for −744.65; x₂ = 1e-142: both refused it as "exactly zero".
def _terms(x2: float) -> A.Instance:
    return A.Instance(
        np.array([[[0.0], [-1.0], [x2]]]), np.array([1.0]), np.array([-2e-40]), np.array([[1.0]])
    )


_W_TERMS = np.array([[1e79]])

#: Exponential loss, Y = −1: keys 1e-108, 0.6 and 2e-104, z = 0.63, v = 3.5e-141, W = −1.2e27: the two tiny
#: keys share the weight ½ (logits ≈ −1e-81), the key 0.6 has e^{−4.5e26}; every product c·x·z of the tiny
#: keys (~1e-350) underflowed to 0 and the gradient (log||∇L|| ≈ −802.8) was refused as "exactly zero".
_ALL_ZERO = (
    np.array([[[1e-108], [0.6], [2e-104]]]),
    np.array([-1.0]),
    np.array([[0.63]]),
    np.array([3.5e-141]),
    np.array([[-1.2e27]]),
)


@pytest.mark.parametrize("path", ["auto", "log"])
@pytest.mark.parametrize(
    ("case", "loss"),
    [
        ("values", "correlation"),
        ("terms 4e-142", "logistic"),
        ("terms 1e-142", "logistic"),
        ("zero", "exponential"),
    ],
)
def test_engine_direction_and_log_norm_match_mpmath_on_spread_data(case: str, loss: str, path: str) -> None:
    """Regression (the sweep of the batched engine on data spanning the range within one sequence).
    Oracle: ∇L in 400-digit mpmath."""
    if case == "values":
        X, Y, z, v, W = _VALUES
        inst = A.Instance(X, Y, v, z)
    elif case == "zero":
        X, Y, z, v, W = _ALL_ZERO
        inst = A.Instance(X, Y, v, z)
    else:
        inst, W = _terms(float(case.split()[1])), _W_TERMS
    log_norm, direction, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, loss, None)
    assert direction is not None and mpmath.isfinite(log_norm)
    got, got_log, cancelled, undetermined = _engine(inst, W, loss, path)
    assert not cancelled and undetermined is None
    assert np.linalg.norm(got - direction) <= DIR_TOL
    assert abs(got_log - float(log_norm)) <= LOG_NORM_ATOL


def test_run_gd_batch_records_the_gradient_of_a_spread_instance_beside_an_ordinary_one() -> None:
    """run_gd_batch on the values' counterexample batched with an ordinary instance: the recorded
    log10||∇L|| of both at step 0 is mpmath's, and normalized GD steps (it refused nothing, returned no NaN).
    Oracle: ∇L in 400-digit mpmath at W0 (the ordinary instance at W0 too)."""
    X, Y, z, v, W = _VALUES
    spread = A.Instance(X, Y, v, z)
    ordinary = A.random_instance(2, 3, 1, seed=3)
    W0 = np.stack([W, np.array([[0.7]])])
    tr = run_gd_batch([spread, ordinary], 2, 0.5, loss="correlation", W0=W0, record_at=[0, 2])
    for b, inst in enumerate((spread, ordinary)):
        log_norm, _, _ = mp_grad(inst.X, inst.Y, inst.z, inst.v, W0[b], "correlation", None)
        assert abs(tr.log10_grad_norms[0, b] * math.log(10.0) - float(log_norm)) <= LOG_NORM_ATOL
    assert np.all(np.isfinite(tr.W)) and np.all(np.isfinite(tr.log10_grad_norms))


def test_run_gd_batch_steps_where_every_engine_term_underflowed() -> None:
    """The all-zero counterexample under normalized GD: the first step is taken (it was refused as
    cancelled), and its recorded log||∇L|| is mpmath's. Oracle: ∇L in 400-digit mpmath at W0."""
    X, Y, z, v, W = _ALL_ZERO
    inst = A.Instance(X, Y, v, z)
    tr = run_gd_batch([inst], 1, 1.0, loss="exponential", W0=W, record_at=[0])
    log_norm, _, _ = mp_grad(X, Y, z, v, W, "exponential", None)
    assert abs(tr.log10_grad_norms[0, 0] * math.log(10.0) - float(log_norm)) <= LOG_NORM_ATOL


# ------------------------------------------------------------ log weights of size 1e14 shared by sequences
#: Two sequences with the same logits (first coordinates of the keys equal, W = g·e₁e₁ᵀ, z = e₁: logits g, 0,
#: 0.3g in both) but different keys and labels ±1: their log weights m (log s at the runner-up, ≈ −0.7g) are
#: the same double, and their terms nearly cancel, so ∇L is set by the O(1) ratio ℓ'(Y_0 f_0)/ℓ'(Y_1 f_1) of
#: the two sequences. The engine formed log|ℓ'_i| + m_i as one sum, which keeps that ratio only to ulp(m):
#: at g = 1e14 (ulp 0.016) the direction came out 1.2 off (2 for the exponential loss).
_SHARED_X = np.array([[[1.0, 0.0], [0.0, 0.5], [0.3, 0.2]], [[1.0, 0.7], [0.0, -0.4], [0.3, 0.9]]])
_SHARED_Z = np.array([[1.0, 0.0], [1.0, 0.0]])


@pytest.mark.parametrize("path", ["auto", "log"])
@pytest.mark.parametrize(("loss", "v"), [("logistic", [1e-3, -0.7e-3]), ("exponential", [1e-3, 2e-3])])
@pytest.mark.parametrize("g", [1e3, 1e12, 1e14, 1e16])
def test_engine_keeps_the_o1_ratio_of_sequences_sharing_a_huge_log_weight(
    g: float, loss: str, v: list[float], path: str
) -> None:
    """Regression; oracle: ∇L in 400-digit mpmath. The direction to DIR_TOL·κ (the terms cancel: κ ≈ 1.4e3 …
    6.4e3); log||∇L|| ≈ −0.7g to its documented eps·|log w| (the log weight's own rounding, 4·eps·0.7g) plus
    LOG_NORM_ATOL. g = 1e3 (log weights ≈ −700) is the control in the plain form."""
    inst = A.Instance(_SHARED_X, np.array([1.0, -1.0]), np.array(v), _SHARED_Z)
    W = np.array([[g, 0.0], [0.0, 0.1]])
    log_norm, direction, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, loss, None)
    assert direction is not None
    got, got_log, cancelled, undetermined = _engine(inst, W, loss, path)
    assert not cancelled and undetermined is None
    assert np.linalg.norm(got - direction) <= DIR_TOL * kappa
    assert abs(got_log - float(log_norm)) <= 4 * EPS * abs(float(log_norm)) + LOG_NORM_ATOL


# ------------------------------------------------------------ a sequence with no term is not live
#: The sweep's masked counterexample, cleaned: one sequence, the second token masked, W of size 4e171. One
#: allowed token has s = 1 and a − f = 0: ∇L = 0 exactly (the construction), whatever the logits' rounding.
#: The engine's undetermined-ℓ' screen took the sequence (log|c| = −inf, turned into −1.8e308) for live.
_ONE_TOKEN = A.Instance(
    np.array([[[0.0, -0.5], [-0.9, 0.1]]]),
    np.array([1.0]),
    np.array([-7e-156, -1e-155]),
    np.array([[-0.75, -0.7]]),
    mask=np.array([[True, False]]),
)
_W_ONE_TOKEN = np.array([[4.5e171, 1.7e170], [-9.4e170, 4.3e171]])


@pytest.mark.parametrize("path", ["auto", "log"])
def test_engine_refuses_an_exactly_zero_gradient_as_zero_not_as_undetermined(path: str) -> None:
    """Oracle: the construction (∇L = 0 exactly; mpmath agrees). Contract: refused as a zero gradient
    (cancelled, log||∇L|| = −inf), with no undetermined-ℓ' refusal; run_gd_batch names the cancellation."""
    log_norm, direction, kappa = mp_grad(
        _ONE_TOKEN.keys, _ONE_TOKEN.Y, _ONE_TOKEN.z, _ONE_TOKEN.v, _W_ONE_TOKEN, "logistic", _ONE_TOKEN.mask
    )
    assert direction is None and log_norm == -mpmath.inf
    _, got_log, cancelled, undetermined = _engine(_ONE_TOKEN, _W_ONE_TOKEN, "logistic", path)
    assert cancelled and got_log == -math.inf and undetermined is None
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_ONE_TOKEN], 1, 0.1, W0=_W_ONE_TOKEN, fast_path=path == "auto")
    assert str(exc.value) == f"normalized GD at step 0: instance 0: {CANCELLED_MESSAGE}"


# ------------------------------------------------------------ the others in the batch are untouched
#: The log-domain path takes one form for the whole batch (the tokens scoring like the selected one are that
#: token alone in every sequence, or not), so a batch-mate with tied tokens moves the others' results by the
#: rounding of an equivalent formula: a few ulps (measured: 1 ulp of log||∇L||). 8·eps bounds it.
BATCH_RTOL = 8 * EPS


@pytest.mark.parametrize("path", ["auto", "log"])
def test_a_spread_instance_leaves_the_other_instances_of_its_batch_alone(path: str) -> None:
    """The instances of a batch are independent: the ordinary ones give the same direction and log||∇L||
    (to the rounding of BATCH_RTOL) with the values' counterexample in the batch as without it (oracle:
    that independence); the counterexample takes the single form's log-domain direction."""
    X, Y, z, v, W = _VALUES
    spread = A.Instance(X, Y, v, z)
    ordinary = [A.random_instance(2, 3, 1, seed=s) for s in range(3)]
    Ws = np.array([[[0.3]], [[-2.0]], [[40.0]]])
    alone = A.BatchEngine.from_instances(ordinary, loss="correlation", path=path)
    G, inv, ln, _ = alone.gradient(torch.as_tensor(Ws).clone())
    D_alone, ln_alone = (G * inv.view(-1, 1, 1)).numpy().copy(), ln.numpy().copy()
    mixed = A.BatchEngine.from_instances([*ordinary, spread], loss="correlation", path=path)
    G, inv, ln, _ = mixed.gradient(torch.as_tensor(np.concatenate([Ws, W[None]])).clone())
    np.testing.assert_allclose((G * inv.view(-1, 1, 1)).numpy()[:3], D_alone, rtol=0, atol=BATCH_RTOL)
    np.testing.assert_allclose(ln.numpy()[:3], ln_alone, rtol=BATCH_RTOL, atol=0)
    assert mixed.log_path.tolist()[3] is True


def _exponent_test(inst: A.Instance) -> bool:
    """The spread criterion from the exact binary exponents (Python's ``math.frexp``, entry by entry): a nonzero
    key 511 binary orders below its sequence's largest, an entry of ``v`` 511 orders below ``v``'s largest, or a
    token with a product ``x_k v_k`` of nonzero factors whose every such product has exponents summing below
    −1020 (the instances here are stacked as given: keys and queries within 2^±64 of 1, ``k = 0``)."""

    def exps(row: np.ndarray) -> list[int]:
        return [math.frexp(float(c))[1] for c in row if c != 0.0]

    def spread_row(row: np.ndarray) -> bool:
        e = exps(row)
        return bool(e) and min(e) - max(e) <= -511

    if spread_row(inst.v) or any(spread_row(inst.X[i].ravel()) for i in range(inst.n)):
        return True
    for i in range(inst.n):
        for t in range(inst.T):
            sums = [
                math.frexp(float(x))[1] + math.frexp(float(w))[1]
                for x, w in zip(inst.X[i, t], inst.v, strict=True)
                if x != 0.0 and w != 0.0
            ]
            if sums and max(sums) < -1020:
                return True
    return False


@pytest.mark.parametrize("gap", [-508, -509, -510, -511, -512])
def test_the_spread_screen_never_passes_what_the_exponent_test_marks(gap: int) -> None:
    """The engine decides spread data by a cheap screen and by the entries' exponents only where the screen
    fails. Oracle: the criterion recomputed from every entry's exponent in plain Python. Each case trips one
    part of the screen alone (none is mixed: every sequence's keys within 2^±64 of 1, terms within 2^±800):
    a key, or an entry of ``v``, at ``0.5·2^(gap+20)`` or ``0.75·2^(gap+20)`` beside a largest entry of
    ``0.75·2^20`` (the row screen fails from gap −509 on, the criterion holds from −511 on; no entry is below
    2^−510), and a token with one key 2^−500 where ``v`` has ``2^(gap−12)`` (the value screen fails, the product's
    exponents sum to ``gap − 510``: below −1020 from −511 on). The engine's flags equal the oracle's on each
    side of both thresholds, and ordinary data are not spread."""
    base = A.random_instance(2, 3, 3, seed=70)
    big = math.ldexp(0.75, 20)
    keys = np.full((2, 3, 3), 0.5)
    keys[:, 0, 0] = big
    cases = []
    for size in (0.75, 0.5):
        X = keys.copy()
        X[0, 1, 2] = math.ldexp(size, gap + 20)
        cases.append(A.Instance(X, base.Y, base.v, base.z))
        v = np.array([big, math.ldexp(size, gap + 20), 0.5])
        cases.append(A.Instance(keys, base.Y, v, base.z))
    X = np.full((2, 3, 3), 0.5)
    X[:, 0, 0] = 0.75
    X[1, 2] = [0.0, math.ldexp(1.0, -500), 0.0]
    v = np.array([math.ldexp(1.0, -490), math.ldexp(1.0, gap - 12), math.ldexp(1.0, -490)])
    cases.append(A.Instance(X, base.Y, v, base.z))
    cases.append(A.Instance(keys, base.Y, base.v, base.z))
    from attnsvm.gd import BatchEngine

    eng = BatchEngine.from_instances(cases, kernel="eager")
    assert eng._mixed is None and not eng.scale_exponents.any()  # the oracle reads the data as given
    expected = [_exponent_test(inst) for inst in cases]
    assert [b in eng._spread_idx for b in range(len(cases))] == expected
    assert expected == [gap <= -511] * 5 + [False]
