"""The public batched engine :class:`attnsvm.BatchEngine` (issue 14 §1: tests use public APIs).

Oracles (each independent of the engine's code):

* **the single form** :func:`attnsvm.normalized_risk_grad` (NumPy, the core's log-domain direction, on the
  user's data at the user's ``W``) and :func:`attnsvm.risk` / :func:`attnsvm.logits`: the engine's
  direction, log-norm, risk and logits, read back into the user's scale;
* **run_gd** (one instance, NumPy): normalized GD driven through the public methods in the user's scale;
* **exact constructions**: the exponents ``k_b = ex + ez`` from the binary exponents of the largest key
  and query entry (``frexp``), the maps ``W ↔ W·2^k`` (powers of two, bit for bit);
* **the fast path's documented range**: an instance whose gradient norm (single form) is far below
  ``FAST_MIN_WEIGHT`` cannot be certified there, one at ``W = 0`` (weights O(1)) always is.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

import attnsvm as A
from attnsvm import AttnSVMError, BatchEngine, NumericalError, UnknownNameError

#: Direction and log-norm of the engine against the single form at the same W (unit directions): the two
#: round differently, measured ≤ 7e-14 up to ||W|| = 1000 (tests/test_gd.py's RTOL_FAST_PATH, the contract of
#: the switch), ≤ 3.1e-13 at ||W'|| = 1e4 below (the logits' rounding, ∝ ||W||, moves the weights).
RTOL_DIRECTION = 1e-12
#: Whole normalized-GD runs, step for step, against run_gd: the engines' agreement contract
#: (tests/test_gd.py's RTOL_ENGINES; each step adds a unit matrix computed two ways, a few ulps apart).
RTOL_ENGINES = 1e-8
#: One risk or logit, formed two ways (the mean of n terms of a few roundings each; logits are d-term dot
#: products): 1e-12 relative is ample for 4×6×8 data.
RTOL_VALUE = 1e-12
#: Below this log-norm of ∇L (single form) no weight of an instance reaches the fast path's acceptance
#: threshold FAST_MIN_WEIGHT = 1e-280 (each weight is bounded by ||∇L||·n/(||x|| ||z||) up to O(1)
#: factors of unit data; 1e-300 leaves 20 orders of margin).
LOG_SATURATED = math.log(1e-300)


def _far(inst: A.Instance, ex: int, ez: int) -> A.Instance:
    """The instance with keys ×2^ex, queries ×2^ez and values ×2^−ex (the token values unchanged)."""
    return A.Instance(np.ldexp(inst.X, ex), inst.Y, np.ldexp(inst.v, -ex), np.ldexp(inst.z, ez))


def _exponent(a: np.ndarray) -> int:
    """The binary exponent e of the largest |entry| (= m·2^e, m in [½, 1))."""
    return int(np.frexp(np.max(np.abs(a)))[1])


# ------------------------------------------------------------------ construction and its refusals
def test_from_instances_refuses_what_is_not_a_batch_of_instances() -> None:
    """Each refusal is an AttnSVMError whose message says how to fix the call."""
    a, b = A.random_instance(4, 6, 8, seed=0), A.random_instance(4, 5, 8, seed=1)
    cases = [
        ([], "instances is empty; pass at least one Instance"),
        (a, "instances must be a sequence of Instance; wrap a single Instance in a list"),
        (3, "instances must be a sequence of Instance; got int"),
        ([a, "a"], "instances[1] is a str, not an attnsvm Instance"),
        (
            [a, b],
            "instances must share one shape (n, T, d) to be batched; instances[0] has (4, 6, 8), "
            "instances[1] has (4, 5, 8). Group the instances by shape and batch each group on its own.",
        ),
    ]
    for arg, message in cases:
        with pytest.raises(AttnSVMError) as ei:
            BatchEngine.from_instances(arg)  # type: ignore[arg-type]
        assert str(ei.value) == message


def test_from_instances_refuses_unknown_names_and_devices() -> None:
    inst = A.random_instance(2, 3, 2, seed=0)
    with pytest.raises(UnknownNameError) as ei:
        BatchEngine.from_instances([inst], loss="hinge")
    assert str(ei.value) == "unknown loss 'hinge'; expected one of 'logistic', 'exponential', 'correlation'"
    for path in ("fast", "Log", 1):
        with pytest.raises(UnknownNameError) as ei:
            BatchEngine.from_instances([inst], path=path)  # type: ignore[arg-type]
        assert str(ei.value) == f"unknown path {path!r}; expected one of 'auto', 'log'"
    with pytest.raises(AttnSVMError, match="is not supported; use 'cpu' or 'cuda'"):
        BatchEngine.from_instances([inst], device="meta")
    with pytest.raises(AttnSVMError, match="not a torch device name"):
        BatchEngine.from_instances([inst], device="gpu0")
    with pytest.raises(TypeError):
        BatchEngine.from_instances([inst], "logistic")  # type: ignore[misc]  # options are keyword-only


def test_from_instances_refuses_token_values_out_of_range_like_run_gd() -> None:
    """Oracle: run_gd's refusal (NumericalError naming the range) for values vᵀx below the normal range."""
    base = A.random_instance(2, 3, 2, seed=0)
    tiny = A.Instance(base.X, base.Y, base.v * 1e-300, base.z * 1e-20)
    tiny = A.Instance(tiny.X * 1e-20, tiny.Y, tiny.v, tiny.z)
    with pytest.raises(NumericalError) as single:
        A.run_gd(tiny, 1, 0.1)
    with pytest.raises(NumericalError) as batched:
        BatchEngine.from_instances([tiny])
    assert "normal range" in str(single.value) and "normal range" in str(batched.value)


def test_from_instances_reports_its_shape_path_device_and_masks() -> None:
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    eng = BatchEngine.from_instances(insts, path="log")
    assert (eng.B, eng.n, eng.T, eng.d) == (3, 4, 6, 8)
    assert eng.path == "log" and BatchEngine.from_instances(insts).path == "auto"
    assert eng.device == torch.device("cpu")
    assert eng.scale_exponents.tolist() == [0, 0, 0] and not eng.scale_exponents.flags.writeable
    for b, inst in enumerate(insts):  # unit-size data are held as given
        held = eng.engine_instance(b)
        assert np.array_equal(held.X, inst.X) and np.array_equal(held.z, inst.z)
        assert np.array_equal(held.v, inst.v) and np.array_equal(held.Y, inst.Y) and held.mask is None
    for bad in (-1, 3, 1.0):
        with pytest.raises(AttnSVMError, match=r"instance index must be an integer in \[0, 3\)"):
            eng.engine_instance(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the user's scale and the engine's
def test_scale_exponents_and_the_maps_are_exact() -> None:
    """Oracle: exact construction. Keys ×2^600, queries ×2^−300 (one instance), keys ×2^−200 (another),
    a unit-size third (rescaled too: the batch is not all of unit size): k_b = ex + ez from the largest
    entries' binary exponents; to_engine_scale is W·2^k bit for bit (numpy ldexp), to_user_scale its
    inverse, and the identity (the same tensor) for a batch of unit-size data (k = 0)."""
    base = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    insts = [_far(base[0], 600, -300), _far(base[1], -200, 0), base[2]]
    eng = BatchEngine.from_instances(insts)
    assert eng.scale_exponents.tolist() == [_exponent(i.X) + _exponent(i.z) for i in insts]
    assert eng.scale_exponents[2] != 0
    W = np.random.default_rng(0).standard_normal((3, 8, 8)) * np.array([1e-300, 1e200, 1.0])[:, None, None]
    Wt = torch.as_tensor(W)
    Wp = eng.to_engine_scale(Wt)
    for b in range(3):
        assert np.array_equal(Wp[b].numpy(), np.ldexp(W[b], int(eng.scale_exponents[b])))
    assert torch.equal(eng.to_user_scale(Wp), Wt)
    out = torch.empty_like(Wt)
    assert eng.to_engine_scale(Wt, out=out) is out and torch.equal(out, Wp)
    unit = BatchEngine.from_instances(base)
    assert unit.to_engine_scale(Wt) is Wt and unit.to_user_scale(Wt) is Wt
    for b, inst in enumerate(insts):  # the held instance's logits at W' are the user's at W
        np.testing.assert_allclose(
            A.logits(eng.engine_instance(b), Wp[b].numpy()), A.logits(inst, W[b]), rtol=RTOL_VALUE
        )


@pytest.mark.parametrize("kernel", ["eager", "fused"])
@pytest.mark.parametrize("path", BatchEngine.PATHS)
def test_direction_in_the_users_scale_equals_the_single_form(path: str, kernel: str) -> None:
    """Oracle: normalized_risk_grad on the user's data at the user's W. Data 2^±600 away from unit scale
    (||x||² alone overflows), W from moderate to saturated (||W'|| = 1e4: every instance on the log-domain
    path): the engine's direction at to_engine_scale(W) is the user's, log||∇L|| = the engine's + k ln 2,
    and the risk is scale-free. The eager paths and the fused kernel (the log-domain form everywhere)."""
    base = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    insts = [_far(base[0], 600, 0), _far(base[1], -500, 300), _far(base[2], 0, -600)]
    eng = BatchEngine.from_instances(insts, path=path, kernel=kernel)
    assert eng.kernel == kernel
    k = eng.scale_exponents
    assert np.all(k != 0)
    U = np.stack([A.solve_svm(i).W for i in base])
    U /= np.linalg.norm(U, axis=(1, 2), keepdims=True)
    for scale in (0.0, 1.0, 30.0, 1000.0, 1e4):
        # W in the user's scale: the unit-data direction U·scale mapped back by 2^−k
        W = np.stack([np.ldexp(scale * U[b], -int(k[b])) for b in range(3)])
        D, log_norm = eng.direction(eng.to_engine_scale(torch.as_tensor(W)))
        on_log = kernel == "fused" or path == "log" or scale == 1e4
        assert eng.log_path.all() if on_log else not eng.log_path.any()
        risk = eng.risk(eng.to_engine_scale(torch.as_tensor(W)))
        for b, inst in enumerate(insts):
            ref = A.normalized_risk_grad(inst, W[b])
            assert np.linalg.norm(D[b].numpy() - ref.direction) <= RTOL_DIRECTION, (scale, b)
            user_log_norm = float(log_norm[b]) + int(k[b]) * math.log(2.0)
            assert abs(user_log_norm - ref.log_norm) <= RTOL_DIRECTION * max(1.0, abs(ref.log_norm))
            if scale <= 30.0:  # the single risk is refused below the normal range (saturated W)
                assert float(risk[b]) == pytest.approx(A.risk(inst, W[b]), rel=RTOL_VALUE)


def test_normalized_gd_in_the_users_scale_equals_run_gd() -> None:
    """Oracle: run_gd. The loop a caller writes with the public methods — the iterate in the user's scale,
    the direction at W' = W·2^k, W ← W − η D — equals run_gd's iterates on far-scale data (and the
    engine's logits there select run_gd's tokens)."""
    base = [A.random_instance(4, 6, 8, seed=s) for s in range(2)]
    insts = [_far(base[0], 400, -100), _far(base[1], -300, 0)]
    lrs = [math.ldexp(0.1, -300), math.ldexp(0.1, 300)]  # steps of the size of the user's W
    eng = BatchEngine.from_instances(insts)
    W = torch.zeros((2, 8, 8), dtype=torch.float64)
    eta = torch.as_tensor(lrs, dtype=torch.float64).view(2, 1, 1)
    for _ in range(60):
        D, _ = eng.direction(eng.to_engine_scale(W))
        W = W - eta * D
    logits, _ = eng.log_s(eng.to_engine_scale(W))
    for b, inst in enumerate(insts):
        tr = A.run_gd(inst, 60, lrs[b])
        assert np.linalg.norm(W[b].numpy() - tr.W) <= RTOL_ENGINES * np.linalg.norm(tr.W)
        np.testing.assert_array_equal(logits[:, b].argmax(dim=0).numpy(), A.logits(inst, tr.W).argmax(axis=1))


# ------------------------------------------------------------------ which path ran
def test_log_path_reports_saturated_and_moderate_instances() -> None:
    """Oracle: the fast path's documented range. One batch, W = 0 for instances 0 and 2 (weights O(1):
    the fast path certifies them) and a saturated W (||W|| = 1000 along W_mm: the single form's
    ||∇L|| < 1e-300, no weight reaches FAST_MIN_WEIGHT) for instance 1: only instance 1 takes the
    log-domain path with path="auto"; every instance with path="log"; asked before any call, refused."""
    insts = [A.random_instance(4, 6, 8, seed=s) for s in range(3)]
    Wmm = A.solve_svm(insts[1]).W
    W = np.zeros((3, 8, 8))
    W[1] = 1000.0 * Wmm / np.linalg.norm(Wmm)
    assert A.normalized_risk_grad(insts[1], W[1]).log_norm < LOG_SATURATED
    auto = BatchEngine.from_instances(insts, kernel="eager")  # the eager paths' choice
    log = BatchEngine.from_instances(insts, path="log", kernel="eager")
    with pytest.raises(AttnSVMError, match="call one first"):
        _ = auto.log_path
    auto.direction(torch.as_tensor(W))
    assert auto.log_path.tolist() == [False, True, False]
    assert auto.stats == {"fast": 0, "log": 0, "mixed": 1, "fused": 0}
    log.gradient(torch.as_tensor(W))
    assert log.log_path.tolist() == [True, True, True]
    Wt = torch.zeros((3, 8, 8), dtype=torch.float64)
    auto.step_(Wt, 0.1)  # every instance at W = 0: the whole batch on the fast path
    assert auto.log_path.tolist() == [False, False, False]


def test_from_instances_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched engine is an extra: without torch, MissingDependencyError naming ``attnsvm[torch]``."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(A.MissingDependencyError, match=r"pip install 'attnsvm\[torch\]'"):
        BatchEngine.from_instances([A.random_instance(2, 3, 2, seed=0)])
