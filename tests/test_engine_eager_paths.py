"""The eager paths of :class:`attnsvm.BatchEngine` (``kernel="eager"``) on batches that mix kinds of instance.

Each test pins a behaviour that a batch-wide shortcut of the eager paths could break while every single-instance
test still passes (found by the mutation run of session 11 on ``attnsvm/gd/_torch_engine.py``):

* a mixed-magnitude instance (sequences of very different size, :meth:`BatchEngine._init_mixed`) that the fast
  path hands to the log-domain path as a subset of its batch;
* log weights beyond ``LOG_WEIGHT_SPLIT`` combined by parts: one instance's rounding of its own log weights
  must not move another instance's ``log||∇L||``;
* an exactly zero gradient reported alike alone and beside a nonzero one;
* the values' rounding term charging every pair of tokens whose keys differ (in any feature), in both paths;
* a custom loss whose ``log(−ℓ')`` overflows, refused under the instance's own index when the log-domain path
  runs on a subset of the batch;
* plain GD from a ``W_0`` whose logits overflow, refused at step 0 naming ``W_0``;
* the undetermined-ℓ' test decided per instance when several need it, and a sequence whose ℓ' is undetermined
  but whose terms are negligible not refused;
* a gradient sum just above ``G_TINY`` answered by the fast path;
* a key row below ``2^−512`` (neither spread nor mixed) keeping its sequence live;
* an unknown kernel name refused with the documented text.

Oracles: ``∇L`` in 400-digit mpmath (:func:`mp_grad`), the values' rounding term ``VE`` of the module docstring of
:mod:`attnsvm.model._grad` evaluated in mpmath, exact constructions, the documented error texts, and the
independence of the instances of a batch. The fused CPU kernel is the default on the CPU; every engine here is
built with ``kernel="eager"``.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from _mp_oracle import mp_grad

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.gd import run_gd, run_gd_batch
from attnsvm.model import Loss, LossAssumptions
from attnsvm.model._grad import CANCELLATION_FACTOR, CANCELLED_MESSAGE

torch = pytest.importorskip("torch")

EPS = float(np.finfo(np.float64).eps)
#: Normwise accuracy of a direction against mpmath: nT(d+T)·eps ≤ 80·eps for the instances here (n·T ≤ 8,
#: d + T ≤ 10; each weight a product of a few log-sum-exp terms, each entry of G a sum of nT products);
#: 256·eps leaves a factor 3 for the logits' rounding; times κ = Σ|w||x||z|/||∇L|| (from the oracle) where
#: the terms cancel.
DIR_TOL = 256 * EPS
#: ``log||∇L||`` to eps·|log||∇L||| (a sum of logs of that size; ≤ 4·eps·3000 ≈ 2.7e-12 here) plus the
#: direction's relative accuracy (256·eps ≈ 5.7e-14); 1e-10 leaves a factor 35.
LOG_NORM_ATOL = 1e-10


def _engine(
    instances: list[A.Instance], Ws: np.ndarray, *, loss: str = "logistic", path: str = "auto"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, A.BatchEngine]:
    """``(directions, log||∇L||, cancelled, engine)`` of the eager engine at ``Ws`` (user's scale), per instance."""
    eng = A.BatchEngine.from_instances(instances, loss=loss, path=path, kernel="eager")
    assert eng.kernel == "eager"
    G, inv, log_norm, cancelled = eng.gradient(eng.to_engine_scale(torch.as_tensor(Ws).clone()))
    D = (G * inv.view(-1, 1, 1)).numpy().copy()
    ln = log_norm.numpy() + eng.scale_exponents * math.log(2.0)
    flags = np.zeros(len(instances), dtype=bool) if cancelled is None else cancelled.numpy().copy()
    return D, ln, flags, eng


def _assert_matches_mpmath(inst: A.Instance, W: np.ndarray, D: np.ndarray, log_norm: float) -> None:
    """``D`` and ``log_norm`` against ∇L in mpmath (DIR_TOL·κ normwise, LOG_NORM_ATOL plus 4·eps relative)."""
    mp_log, mp_dir, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, "logistic", None)
    assert mp_dir is not None
    assert np.linalg.norm(D - mp_dir) <= DIR_TOL * kappa
    assert abs(log_norm - float(mp_log)) <= 4 * EPS * abs(float(mp_log)) + LOG_NORM_ATOL


# ------------------------------------------------------------ a mixed-magnitude instance in a subset
#: Sequence 1's keys are 2^−100 times sequence 0's: 2^−100 is below the engine's 2^−64 (SEQ_MODERATE), so
#: the instance is "mixed" (each sequence scaled on its own, the log-domain path only).
_TINY_KEYS = 2.0**-100
_MIXED = A.Instance(
    np.array([[[1.0, 0.5], [-0.5, 1.0], [0.25, -0.75]], [[1.0, -0.75], [0.25, 0.5], [-1.0, 0.125]]])
    * np.array([1.0, _TINY_KEYS])[:, None, None],
    np.array([1.0, -1.0]),
    np.array([1.0, -0.5]),
    np.array([[0.5, -1.0], [1.0, 0.25]]),
)


def test_a_mixed_magnitude_instance_recomputed_as_a_subset_matches_mpmath() -> None:
    """Two ordinary instances take the fast path and the mixed-magnitude one is recomputed alone by the
    log-domain path (a "mixed" call: one of three instances); each direction and log||∇L|| matches 400-digit
    mpmath."""
    ordinary = [A.random_instance(2, 3, 2, seed=s) for s in (3, 4)]
    batch = [*ordinary, _MIXED]
    Ws = np.array([[[0.4, -0.2], [0.1, 0.3]], [[-0.5, 0.2], [0.3, 0.1]], [[0.7, -0.3], [0.2, 0.9]]])
    D, ln, cancelled, eng = _engine(batch, Ws)
    assert eng._mixed is not None and eng._mixed.tolist() == [False, False, True]  # the premise
    assert eng.stats["mixed"] == 1 and eng.log_path.tolist() == [False, False, True]
    assert not cancelled.any() and eng.undetermined is None
    for b, inst in enumerate(batch):
        _assert_matches_mpmath(inst, Ws[b], D[b], float(ln[b]))


# ------------------------------------------------------------ log weights by parts, per instance
#: Instance A: two sequences with the same logits 2^56 (token 0) and 0 (token 1), so the same log weight
#: m = −2^56, but margins 2^−11 and 2^−12 (values v·x_r): log|ℓ'| differs by ≈ 2^−13 between them, far below
#: ulp(2^56) = 16, so both log weights log|ℓ'| + m round to the same double and the first sequence (the smaller
#: |ℓ'|) is taken as the largest; combined by parts, the second one's factor is e^{+2^−13} relative to it.
#: Sequence 1's keys differ from sequence 0's in the second feature only, which W z = (2^56, 0) does not see.
_BIG = 2.0**56
_SPLIT_A = A.Instance(
    np.array([[[1.0, 2.0**-12], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]]),
    np.array([1.0, 1.0]),
    np.array([2.0**-12, 1.0]),
    np.array([[1.0, 0.0], [1.0, 0.0]]),
)
_W_SPLIT_A = np.array([[_BIG, 0.0], [0.0, 0.0]])
#: Instance B: two copies of one sequence with a logit gap of 3000 (> LOG_WEIGHT_SPLIT = 2048: combined by
#: parts as well), log||∇L|| ≈ −3000, a double with ulp 4.5e-13: known to LOG_NORM_ATOL.
_SPLIT_B = A.Instance(
    np.array([[[1.0, 0.0], [0.0, 1.0]]] * 2),
    np.array([1.0, 1.0]),
    np.array([1.0, 2.0]),
    np.array([[1.0, 0.0]] * 2),
)
_W_SPLIT_B = np.array([[3000.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("path", ["auto", "log"])
def test_an_instance_log_norm_is_not_moved_by_another_instance_log_weights(path: str) -> None:
    """Instance B's log||∇L|| and direction match 400-digit mpmath alone and beside instance A, whose own
    log weights are combined by parts with a largest factor e^{2^−13} above the rounded choice (above); A's
    direction matches mpmath too (its log||∇L|| ≈ −2^56 is known only to its ulp, 16: not compared)."""
    for batch, Ws in (
        ([_SPLIT_B], _W_SPLIT_B[None]),
        ([_SPLIT_A, _SPLIT_B], np.array([_W_SPLIT_A, _W_SPLIT_B])),
    ):
        D, ln, cancelled, eng = _engine(batch, Ws, path=path)
        assert not cancelled.any() and eng.undetermined is None and eng.log_path.all()
        _assert_matches_mpmath(_SPLIT_B, _W_SPLIT_B, D[-1], float(ln[-1]))
    _, mp_dir, kappa = mp_grad(_SPLIT_A.X, _SPLIT_A.Y, _SPLIT_A.z, _SPLIT_A.v, _W_SPLIT_A, "logistic", None)
    assert mp_dir is not None and np.linalg.norm(D[0] - mp_dir) <= DIR_TOL * kappa


# ------------------------------------------------------------ an exactly zero gradient, alone or not
#: Every token scores alike (v·x = 1 for both keys): f = a_t for every weight, ∇L = 0 exactly.
_ALIKE = A.Instance(
    np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 1.0]), np.array([[1.0, 0.0]])
)
_NONZERO = A.Instance(
    np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 2.0]), np.array([[1.0, 0.0]])
)


@pytest.mark.parametrize("path", ["auto", "log"])
def test_an_exactly_zero_gradient_is_reported_alike_alone_and_beside_a_nonzero_one(path: str) -> None:
    """Oracle: the construction (∇L = 0 exactly; mpmath agrees) and the independence of a batch's instances.
    The zero gradient is reported as log||∇L|| = −inf and cancelled, with the same direction bits alone and
    beside an instance whose gradient is not 0 (whose own direction matches mpmath)."""
    W = np.array([[0.3, 0.1], [0.2, -0.4]])
    assert mp_grad(_ALIKE.X, _ALIKE.Y, _ALIKE.z, _ALIKE.v, W, "logistic", None)[0] == -mpmath.inf
    D_alone, ln_alone, c_alone, _ = _engine([_ALIKE], W[None], path=path)
    D, ln, cancelled, _ = _engine([_NONZERO, _ALIKE], np.array([W, W]), path=path)
    assert ln_alone[0] == -math.inf and ln[1] == -math.inf
    assert c_alone.tolist() == [True] and cancelled.tolist() == [False, True]
    np.testing.assert_array_equal(D[1], D_alone[0])  # NaN (0/0) in both: equal_nan
    _assert_matches_mpmath(_NONZERO, W, D[0], float(ln[0]))


# ------------------------------------------------------------ the values' rounding: every distinct pair
#: Eight keys (p_t, q_t) at W = 0 (weights 1/8), v = (1, 1): p_t = ½ + t/16 and q_t = 1 − p_t (value 1 exactly,
#: t = 1..7), and x_0 = (½, ½ + h) (value 1 + h). No two keys share a feature value, so every pair of tokens
#: is charged in VE. ∇L ∝ h; its ratio to the refusal bound 8·(nT·eps·M + VE) is computed in mpmath below:
#: ≈ 0.44 for h = 2^−44 (refused), ≈ 113 for h = 2^−36 (accepted).
def _pairs_instance(h: float) -> A.Instance:
    p = np.array([0.5] + [0.5 + t / 16 for t in range(1, 8)])
    q = 1.0 - p
    q[0] = 0.5 + h
    return A.Instance(
        np.stack([p, q], axis=-1)[None], np.array([1.0]), np.array([1.0, 1.0]), np.array([[1.0, 0.0]])
    )


def _refusal_ratio(inst: A.Instance) -> float:
    """``||∇L|| / (8·(nT·eps·M + VE))`` at W = 0 in mpmath, ``M = Σ_it |w_it| ||x_it|| ||z_i||`` and
    ``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (|a|_it + |a|_iu)·||x_it||·||z_i||/n``
    (``|a|_it = Σ_k |v_k x_itk|``; the definitions of the module docstring of attnsvm.model._grad)."""
    n, T, d = inst.shape
    W = np.zeros((d, d))
    log_norm, _, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, "logistic", None)
    with mpmath.workdps(60):
        mpf = mpmath.mpf
        grad = mpmath.exp(log_norm)
        M = mpf(kappa) * grad
        VE = mpf(0)
        for i in range(n):
            s = mpf(1) / T  # W = 0
            a = [
                mpmath.fsum(mpf(float(v)) * mpf(float(x)) for v, x in zip(inst.v, inst.X[i, t], strict=True))
                for t in range(T)
            ]
            mag = [
                mpmath.fsum(
                    abs(mpf(float(v)) * mpf(float(x))) for v, x in zip(inst.v, inst.X[i, t], strict=True)
                )
                for t in range(T)
            ]
            u = float(inst.Y[i]) * mpmath.fsum(s * at for at in a)
            dl = 1 / (1 + mpmath.exp(u))  # |ℓ'(u)|, logistic
            zn = mpmath.norm([mpf(float(c)) for c in inst.z[i]])
            for t in range(T):
                xn = mpmath.norm([mpf(float(c)) for c in inst.X[i, t]])
                mix = mpmath.fsum(
                    s * (mag[t] + mag[q]) for q in range(T) if not np.array_equal(inst.X[i, q], inst.X[i, t])
                )
                VE += dl * s * d * EPS * mix * xn * zn / n
        return float(grad / (CANCELLATION_FACTOR * (n * T * EPS * M + VE)))


@pytest.mark.parametrize("path", ["auto", "log"])
def test_values_rounding_charges_every_pair_of_tokens_with_different_keys(path: str) -> None:
    """Oracle: the refusal ratio in mpmath (0.44 < 1: refused; 113: accepted), and run_gd, which agrees.
    The refused instance is refused by the batch under its index, the accepted one's direction matches
    mpmath."""
    refused, accepted = _pairs_instance(2.0**-44), _pairs_instance(2.0**-36)
    assert 0.3 < _refusal_ratio(refused) < 0.6 and _refusal_ratio(accepted) > 50  # the premise
    with pytest.raises(NumericalError, match="cancel to rounding level"):
        run_gd(refused, 1, 0.1)
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([accepted, refused], 1, 0.1, fast_path=path == "auto", kernel="eager")
    assert str(exc.value) == f"normalized GD at step 0: instance 1: {CANCELLED_MESSAGE}"
    W = np.zeros((2, 2))
    D, ln, cancelled, _ = _engine([accepted, refused], np.array([W, W]), path=path)
    assert cancelled.tolist() == [False, True]
    _assert_matches_mpmath(accepted, W, D[0], float(ln[0]))


# ------------------------------------------------------------ a custom loss overflowing in logs
def _exp_neg(u: object) -> object:
    """``e^{−u}`` for NumPy arrays and torch tensors (``+inf`` beyond the range, no warning)."""
    if isinstance(u, torch.Tensor):
        return torch.exp(-u)
    with np.errstate(over="ignore"):
        return np.exp(-np.asarray(u, dtype=np.float64))


def _log_by_exp(u: object) -> object:
    """``log(−ℓ'(u)) = log(e^{−u})`` computed by exponentiating: ``+inf`` where ``e^{−u}`` overflows (u < −709.8)."""
    e = _exp_neg(u)
    return torch.log(e) if isinstance(e, torch.Tensor) else np.log(e)


#: ``ℓ(u) = e^{−u}`` with its log derivative formed by exponentiating (tests/test_grad_overflowing_loss.py).
_LOG_INF_LOSS = Loss(
    "exp-by-exp", _exp_neg, lambda u: -_exp_neg(u), LossAssumptions(True, False, True, True), _log_by_exp
)
#: At W = 0 (weights ½): margin (−790 − 810)/2 = −800, where e^{800} overflows; the companion's margin is 1.5.
_OVERFLOWING = A.Instance(
    np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([-790.0, -810.0]), np.array([[0.3, -0.2]])
)


@pytest.mark.parametrize("order", ["second", "third"])
def test_an_overflowing_loss_derivative_is_refused_under_the_instance_index(order: str) -> None:
    """Oracle: the documented refusal (attnsvm.model._grad._check_log_derivative: log(−ℓ'(u)) = +inf at the
    margin u = −800) naming the instance's index in the batch. The fast path cannot take that instance (ℓ' =
    −inf there) and the log-domain path recomputes it alone: its index in that subset is 0."""
    batch = [_NONZERO, _OVERFLOWING] if order == "second" else [_NONZERO, _NONZERO, _OVERFLOWING]
    b = len(batch) - 1
    with pytest.raises(NumericalError) as exc:
        run_gd_batch(batch, 1, 0.1, loss=_LOG_INF_LOSS, kernel="eager")
    assert str(exc.value).startswith(
        f"normalized GD at step 0: instance {b}: the loss derivative is not finite at the margin u = Y_0 f_0 = "
        "-800: the loss's log_neg_derivative_fn gives log(−ℓ'(u)) = +inf"
    )


# ------------------------------------------------------------ logits beyond float64 at W_0
#: Keys (0, 1), (2, 1), (2, 0), query e₁, W_0 = −1e308·e₁e₁ᵀ: logits 0, −2e308 and −2e308, i.e. 0, −inf, −inf
#: (beyond the logit bound FLOAT_MAX/(4d²)); v = (0, 1): the first two tokens score alike (1, 1), the third 0.
_OVERFLOW_LOGITS = A.Instance(
    np.array([[[0.0, 1.0], [2.0, 1.0], [2.0, 0.0]]]),
    np.array([1.0]),
    np.array([0.0, 1.0]),
    np.array([[1.0, 0.0]]),
)
_W_OVERFLOW = np.array([[-1e308, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("fast_path", [True, False])
def test_logits_beyond_float64_at_w0_are_refused_at_step_0(normalized: bool, fast_path: bool) -> None:
    """Oracle: the construction (x ᵀ W_0 z = 2·(−1e308) overflows) and the documented refusal of the logits'
    range naming the iterate at fault, W_0: refused at step 0 by normalized and plain GD alike, recorded or
    not (never a zero gradient taken for a stationary point, to be refused only at a later record)."""
    with pytest.raises(NumericalError) as exc:
        run_gd_batch(
            [_OVERFLOW_LOGITS],
            3,
            0.1,
            W0=_W_OVERFLOW,
            normalized=normalized,
            fast_path=fast_path,
            kernel="eager",
            record_at=[3],
        )
    assert str(exc.value).startswith("step 0: instance 0: the logits x_itᵀ W_0 z_i")


# ------------------------------------------------------------ the undetermined-ℓ' refusal, per instance
#: Values ±1e16 and 0 at W = 0 (weights ⅓): f = 0, known only to ±(T+d)·eps·Σ_t s_t|a_t| = 4·eps·⅔·1e16 ≈ 5.92,
#: so ℓ'(f) is undetermined (logistic κ = σ(5.92) ≈ 0.997, κ·δf > 1) and this sequence carries ∇L: refused.
_UNDETERMINED = A.Instance(
    np.array([[[1.0], [-1.0], [0.0]]]), np.array([1.0]), np.array([1e16]), np.array([[1.0]])
)
#: Values −1e16, 1e16 and −5e15: f ≈ −1.67e15 is as uncertain (δf ≈ 6.7), but ℓ' ≈ −1 there is not
#: (κ = σ(f + δf) ≈ e^{−1.67e15}): determined, and the cheap screen sends it to the exact test too.
_DETERMINED_BIG = A.Instance(
    np.array([[[1.0], [-1.0], [0.5]]]), np.array([1.0]), np.array([-1e16]), np.array([[1.0]])
)


def test_undetermined_loss_derivative_is_decided_per_instance_in_a_batch() -> None:
    """Two instances need the exact undetermined-ℓ' test (both have values of 1e16): the one whose ℓ' is
    undetermined (δf ≈ 5.92 by hand, above) is refused under its index with run_gd's text; the determined one
    is not, and its direction matches 400-digit mpmath."""
    with pytest.raises(NumericalError, match="undetermined") as single:
        run_gd(_UNDETERMINED, 1, 0.1)
    with pytest.raises(NumericalError) as batched:
        run_gd_batch([_DETERMINED_BIG, _UNDETERMINED], 1, 0.1, kernel="eager")
    prefix = "normalized GD at step 0: instance 1: "
    assert str(batched.value) == prefix + str(single.value).split(": ", 1)[1]
    assert "known only to ±5.92" in str(batched.value)
    W = np.zeros((1, 1))
    D, ln, cancelled, eng = _engine([_DETERMINED_BIG, _UNDETERMINED], np.array([W, W]))
    assert eng.undetermined is not None and eng.undetermined.tolist() == [False, True]
    assert not cancelled[0]
    _assert_matches_mpmath(_DETERMINED_BIG, W, D[0], float(ln[0]))


#: Exponential loss, W = diag(800, 0), v = (0, 2^43). Sequence 0 (query (0, 1): logits 0, weights ⅓): values
#: −250, −300, −350, so f = −300, |ℓ'| = e^{300} and δf ≈ 5·eps·300: determined; its largest term
#: |ℓ'|·s·|a − f|·||x|| ||z|| ≈ e^{300}·⅓·50 ≈ e^{302.8}. Sequence 1 (query (1, 0)): two keys with logit 800 and
#: values ±2^43, one with logit 0 (weight e^{−800}) and value 2^42: f ≈ 0 known only to ±δf ≈ 12.3 (the logits'
#: rounding 2δl = 8·eps·800 times Σ s|a| = 2^43): undetermined, but its largest term, ½·2^43·√2 ≈ e^{29.5},
#: grown by e^{δf}, is e^{−261} of sequence 0's, far beyond NEGLIGIBLE_LOG = 46: negligible, not refused. (The
#: weight-e^{−800} token's term is e^{−800} smaller still.)
_NEGLIGIBLE_UNDETERMINED = A.Instance(
    np.array(
        [
            [[1.0, -250 * 2.0**-43], [1.0, -300 * 2.0**-43], [1.0, -350 * 2.0**-43]],
            [[1.0, 1.0], [1.0, -1.0], [0.0, 0.5]],
        ]
    ),
    np.array([1.0, 1.0]),
    np.array([0.0, 2.0**43]),
    np.array([[0.0, 1.0], [1.0, 0.0]]),
)
_W_NEGLIGIBLE = np.array([[800.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("path", ["auto", "log"])
def test_an_undetermined_sequence_with_a_negligible_term_is_not_refused(path: str) -> None:
    """Oracle: the sizes by hand (above: the undetermined sequence's terms are e^{−261} of the determined
    one's), run_gd (which accepts it), and 400-digit mpmath for the direction and log||∇L||."""
    inst, W = _NEGLIGIBLE_UNDETERMINED, _W_NEGLIGIBLE
    run_gd(inst, 1, 0.1, loss="exponential", W0=W)  # the single form does not refuse
    D, ln, cancelled, eng = _engine([inst], W[None], loss="exponential", path=path)
    assert eng.undetermined is None and not cancelled[0]
    mp_log, mp_dir, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, "exponential", None)
    assert mp_dir is not None
    assert np.linalg.norm(D[0] - mp_dir) <= DIR_TOL * kappa
    assert abs(float(ln[0]) - float(mp_log)) <= 4 * EPS * abs(float(mp_log)) + LOG_NORM_ATOL


# ------------------------------------------------------------ a gradient sum just above G_TINY
#: n = 2. Sequence 0: keys (±1, 0), values 0 and 0 (v = (0, 1)): weights exactly 0, but its query (1, 0) and
#: keys set the instance's scale (1: no rescaling). Sequence 1: keys (0, 2^−63) and 0, query (0, 2^−63),
#: W = diag(0, 809·ln2·2^126): logits 809·ln2 and 0, so the second token's weight is 2^−809 and the first
#: token's gradient weight |ℓ'(u)|·s_2·(a_1 − a_2) ≈ ½·2^−809·2^−63 = 2^−873 (far above FAST_MIN_WEIGHT = 1e-280);
#: the gradient sum G = Σ_it w_it x_it z_iᵀ is that weight times x z = 2^−126: n·||∇L|| = ||G|| ≈ 2^−999,
#: twice G_TINY = 2^−1000, every factor and product a normal double.
_JUST_ABOVE = A.Instance(
    np.array([[[1.0, 0.0], [-1.0, 0.0]], [[0.0, 2.0**-63], [0.0, 0.0]]]),
    np.array([1.0, 1.0]),
    np.array([0.0, 1.0]),
    np.array([[1.0, 0.0], [0.0, 2.0**-63]]),
)
_W_JUST_ABOVE = np.array([[0.0, 0.0], [0.0, 809 * math.log(2.0) * 2.0**126]])


def test_a_gradient_sum_just_above_g_tiny_stays_on_the_fast_path() -> None:
    """Oracle: 400-digit mpmath (n·||∇L|| ≈ 2·G_TINY, checked below, and the direction). The engine's threshold
    is on the gradient sum G = n·∇L (class docstring: an instance whose gradient sum comes out below G_TINY may
    have lost terms to underflow and goes to the log-domain path or the single form); above it, where every
    term is a normal double, the fast path's answer stands (log_path False) and matches mpmath."""
    inst, W = _JUST_ABOVE, _W_JUST_ABOVE
    mp_log, _, _ = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, "logistic", None)
    g_sum = float(mpmath.exp(mp_log) * inst.n)  # ||G|| = n·||∇L||
    assert 1.5 * 2.0**-1000 < g_sum < 2.5 * 2.0**-1000  # the premise: between G_TINY and n²·G_TINY
    D, ln, cancelled, eng = _engine([inst], W[None], path="auto")
    assert eng.scale_exponents.tolist() == [0] and eng._mixed is None and not eng._spread_idx
    assert eng.log_path.tolist() == [False] and eng.stats["fast"] == 1
    assert not cancelled[0] and eng.undetermined is None
    _assert_matches_mpmath(inst, W, D[0], float(ln[0]))


# ------------------------------------------------------------ a key row below 2^−512, not split
#: Sequence 0: keys (±1, 0), values 0 (v = (0, 1)): weights exactly 0, but it keeps the instance's largest key
#: and query at 1 (no rescaling). Sequence 1: keys 2^−63·(1, ½) and 2^−520·(1, −1), 2^−457 apart: within the
#: split criterion's 2^−511 (not spread), and its largest key 2^−63 ≥ 2^−64 (not mixed); so the engine's own
#: paths take it, with the second key's norm formed from the row scaled by a power of two (NORM_TINY). Sequence 1
#: carries all of ∇L (its first key's term; the second key's is 2^−457 smaller).
_TINY_ROW = A.Instance(
    np.array([[[1.0, 0.0], [-1.0, 0.0]], [[2.0**-63, 2.0**-64], [2.0**-520, -(2.0**-520)]]]),
    np.array([1.0, -1.0]),
    np.array([0.0, 1.0]),
    np.array([[1.0, 0.0], [0.5, 1.0]]),
)


@pytest.mark.parametrize("path", ["auto", "log"])
def test_a_key_row_below_2_to_the_minus_512_keeps_its_sequence_live(path: str) -> None:
    """Oracle: 400-digit mpmath. The sequence with the tiny key row is the only one with a gradient; the engine
    (neither spread nor mixed here, checked) answers it with mpmath's direction and log||∇L||, not as a dead
    sequence (a zero or cancelled gradient)."""
    W = np.array([[0.5, -0.25], [0.75, 0.125]])
    D, ln, cancelled, eng = _engine([_TINY_ROW], W[None], path=path)
    assert eng.scale_exponents.tolist() == [0] and eng._mixed is None and not eng._spread_idx  # the premise
    assert not cancelled[0] and eng.undetermined is None
    _assert_matches_mpmath(_TINY_ROW, W, D[0], float(ln[0]))


# ------------------------------------------------------------ the kernel's name
@pytest.mark.parametrize("kernel", ["numba", "Eager", 1])
def test_an_unknown_kernel_name_is_refused_with_the_valid_names(kernel: object) -> None:
    """Oracle: the documented text of an unknown name (attnsvm.errors.unknown_name, as for loss and path)."""
    from attnsvm.errors import UnknownNameError

    with pytest.raises(UnknownNameError) as exc:
        A.BatchEngine.from_instances([_NONZERO], kernel=kernel)  # type: ignore[arg-type]
    assert str(exc.value) == f"unknown kernel {kernel!r}; expected one of 'auto', 'fused', 'eager'"
