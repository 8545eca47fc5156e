"""The batched engine's fused CPU kernel (attnsvm.gd._fused): direction and log-norm against 400-digit
mpmath at every ``||W||`` (saturated included, where it hands instances to the eager path), the
instances it hands back, determinism (threads, batch composition), where it applies, and a machine
without a C compiler."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from _mp_oracle import mp_grad, mp_risk_and_tokens

import attnsvm as A
from attnsvm.errors import AttnSVMError, UnknownNameError
from attnsvm.gd import BatchEngine, run_gd_batch

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EPS = float(np.finfo(np.float64).eps)
#: Normwise accuracy of a direction with exact logits: each weight a product of a few log-sum-exp terms, each
#: entry of G a sum of nT products, nT(d+T)·eps ≤ 135·eps at n = 3, T = 5, d = 4; 256·eps leaves a factor 2.
DIR_TOL_EXACT = 256 * EPS
#: The logits' own rounding: l = xᵀ(W z) is computed to ±DOT_FACTOR·d·eps·|x|ᵀ|W||z| (two dot products of
#: length d), which moves each weight e^{l_t − l_u} by a factor e^{±2δl}: the direction by ≤ 4·δl·κ.
DOT_FACTOR = 2
#: log||∇L|| to eps·|log||∇L||| (a sum of logs of that size) plus the direction's relative accuracy.
LOG_NORM_TOL = 4 * EPS
#: The fused and the eager engines' iterates after 5 normalized steps of 0.1 from W = 0: their directions
#: agree to ≤ 1.2e-13 at each step (this file's mpmath checks bound each by ~1e-13), so the iterates (norm
#: ≤ 0.5) to ≤ 5·0.1·1.2e-13·2; 1e-12 relative leaves a factor 10.
ENGINE_AGREEMENT = 1e-12


def _instances(count: int, seed: int = 0) -> list[A.Instance]:
    return [A.random_instance(3, 5, 4, seed=seed + s) for s in range(count)]


def _logit_error(inst: A.Instance, W: np.ndarray) -> float:
    """``max_it DOT_FACTOR·d·eps·|x_it|ᵀ|W||z_i|``: the rounding of the float64 logits."""
    mag = np.einsum("itk,kj,ij->it", np.abs(inst.X), np.abs(W), np.abs(inst.z))
    return float(DOT_FACTOR * inst.d * EPS * mag.max())


def _check_against_mpmath(inst: A.Instance, W: np.ndarray, D: np.ndarray, log_norm: float, loss: str) -> None:
    ref_log, ref_dir, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W, loss, None)
    assert ref_dir is not None
    tol = kappa * (DIR_TOL_EXACT + 4 * _logit_error(inst, W))
    assert np.linalg.norm(D - ref_dir) <= tol, (np.linalg.norm(D - ref_dir), tol)
    assert abs(log_norm - float(ref_log)) <= LOG_NORM_TOL * abs(float(ref_log)) + tol


def _has_compiler() -> bool:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0]) is not None


def test_the_kernel_runs_where_a_c_compiler_is_found() -> None:
    """The default engine takes the fused kernel on the CPU for unmasked batches of the logistic and
    exponential losses when a C compiler is found (CI's machines have one), and says which ran."""
    eng = BatchEngine.from_instances(_instances(2))
    if _has_compiler():
        assert eng.kernel == "fused", eng.kernel_detail
        assert eng.kernel_detail.startswith("fused kernel: ")
    else:  # pragma: no cover - machines without a compiler
        assert eng.kernel == "eager" and "compiler" in eng.kernel_detail


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
def test_direction_and_log_norm_match_mpmath_from_zero_to_saturation(loss: str) -> None:
    """Oracle: ∇L in 400-digit mpmath from the exact float64 inputs. 6 instances at ||W|| from 0 to far
    past the underflow of ∇L (1e4: log weights beyond 2^11, combined by parts): the direction to
    κ·(256·eps + 4·δl) and log||∇L|| to 4·eps·|log||∇L||| plus that; the kernel itself decides every
    instance (none handed back to the eager path)."""
    insts = _instances(6)
    eng = BatchEngine.from_instances(insts, loss=loss, kernel="fused")
    rng = np.random.default_rng(1)
    U = rng.standard_normal((len(insts), 4, 4))
    U /= np.linalg.norm(U, axis=(1, 2), keepdims=True)
    for scale in (0.0, 1.0, 30.0, 1e4):
        W = scale * U
        D, log_norm = eng.direction(torch.as_tensor(W))
        flagged = eng._fused.flag.numpy().astype(bool)  # white-box: which instances the kernel handed back
        assert not flagged.any(), scale
        for b, inst in enumerate(insts):
            _check_against_mpmath(inst, W[b], D[b].numpy(), float(log_norm[b]), loss)


def test_instances_the_kernel_hands_back_are_still_exact() -> None:
    """Oracle: 400-digit mpmath. An instance whose token 1 is an exact copy of token 0 in every sequence
    (where one of them is selected, a token ties with the selected one in score: the kernel hands the
    instance to the eager log-domain path) and one with a dead sequence (z_i = 0, which the kernel decides
    itself), beside an ordinary one: every direction and log-norm is the oracle's."""
    base = _instances(3, seed=20)
    tie = base[0]
    X = tie.X.copy()
    X[:, 1] = X[:, 0]  # token 1 is an exact copy of token 0 in every sequence: tied scores
    tie = A.Instance(X, tie.Y, tie.v, tie.z)
    dead = base[1]
    z = dead.z.copy()
    z[1] = 0.0
    dead = A.Instance(dead.X, dead.Y, dead.v, z)
    insts = [tie, dead, base[2]]
    eng = BatchEngine.from_instances(insts, kernel="fused")
    W = np.stack([np.eye(4), 3 * np.eye(4), -np.eye(4)])
    D, log_norm = eng.direction(torch.as_tensor(W))
    flagged = eng._fused.flag.numpy().astype(bool).tolist()
    assert flagged[1:] == [False, False]
    for b, inst in enumerate(insts):
        _check_against_mpmath(inst, W[b], D[b].numpy(), float(log_norm[b]), "logistic")
    # the tie is handed back where the selected token has a copy (the argmax is token 0 or 1)
    assert flagged[0] == bool(np.isin(A.logits(tie, W[0]).argmax(axis=1), (0, 1)).any())


def test_a_stationary_instance_is_refused_as_by_the_eager_engine() -> None:
    """Every token of a sequence alike in every sequence: ∇L = 0 exactly. The kernel hands it back and the
    engine refuses it with the eager engine's message (oracle: the eager run's error, word for word), as
    W stationary (run_gd says so too; the batched engine words every refused zero-or-noise gradient as a
    cancellation: it cannot tell a zero from exactly cancelling sequences)."""
    inst = _instances(1, seed=30)[0]
    X = np.repeat(inst.X[:, :1, :], inst.T, axis=1)
    flat = A.Instance(X, inst.Y, inst.v, inst.z)
    batch = [_instances(1)[0], flat]
    errors = []
    for kernel in ("eager", "fused"):
        with pytest.raises(A.NumericalError) as exc:
            run_gd_batch(batch, 2, 0.1, kernel=kernel)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and "instance 1:" in errors[1] and "stationary" in errors[1]
    with pytest.raises(A.NumericalError, match="stationary"):
        A.run_gd(flat, 2, 0.1)


def test_results_do_not_depend_on_threads_or_on_aligned_batch_mates() -> None:
    """Each instance is computed by one thread in one fixed order, in blocks of 16 from instance 0: one or
    two threads give bitwise the same directions, and the aligned sub-batch [0, 32) of a batch of 40 gives
    bitwise the batch's (oracle: the other run)."""
    insts = _instances(40, seed=40)
    W = torch.as_tensor(np.random.default_rng(2).standard_normal((40, 4, 4)))
    old = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            eng = BatchEngine.from_instances(insts, kernel="fused")
            D, ln = eng.direction(W)
            out.append((D.clone(), ln.clone()))
        sub = BatchEngine.from_instances(insts[:32], kernel="fused")
        Ds, lns = sub.direction(W[:32].clone())
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert torch.equal(out[0][0][:32], Ds) and torch.equal(out[0][1][:32], lns)


def test_where_the_kernel_does_not_apply_auto_runs_eager_and_fused_is_refused() -> None:
    """Masked batches, the correlation loss and unknown kernel names: kernel="auto" runs the eager paths
    and says why; kernel="fused" is refused naming the reason."""
    insts = _instances(2)
    masked = A.Instance(
        insts[0].X, insts[0].Y, insts[0].v, insts[0].z, mask=np.array([[True] * 4 + [False]] * 3)
    )
    eng = BatchEngine.from_instances([masked, insts[1]])
    assert eng.kernel == "eager" and "token masks" in eng.kernel_detail
    with pytest.raises(AttnSVMError, match="kernel='fused' cannot run: the batch has token masks"):
        BatchEngine.from_instances([masked, insts[1]], kernel="fused")
    eng = BatchEngine.from_instances(insts, loss="correlation")
    assert eng.kernel == "eager" and "logistic and exponential" in eng.kernel_detail
    with pytest.raises(AttnSVMError, match="logistic and exponential"):
        run_gd_batch(insts, 1, 0.1, loss="correlation", kernel="fused")
    assert BatchEngine.from_instances(insts, kernel="eager").kernel == "eager"
    with pytest.raises(UnknownNameError, match="kernel"):
        BatchEngine.from_instances(insts, kernel="numba")


def test_without_a_compiler_the_engine_runs_eager_and_says_why(tmp_path: Path) -> None:
    """A fresh process whose CC names no compiler and whose cache is empty: the kernel is unavailable,
    kernel="auto" runs the eager paths (the same trajectory to the engines' agreement, oracle: this
    process's fused run), kernel="fused" is refused naming the cause."""
    insts = _instances(3, seed=50)
    fused = run_gd_batch(insts, 5, 0.1, kernel="fused")
    code = (
        "import json, numpy as np, attnsvm as A\n"
        "from attnsvm.gd import BatchEngine, run_gd_batch\n"
        "from attnsvm.errors import AttnSVMError\n"
        "insts = [A.random_instance(3, 5, 4, seed=50 + s) for s in range(3)]\n"
        "eng = BatchEngine.from_instances(insts)\n"
        "try:\n"
        "    BatchEngine.from_instances(insts, kernel='fused')\n"
        "    refused = ''\n"
        "except AttnSVMError as exc:\n"
        "    refused = str(exc)\n"
        "W = run_gd_batch(insts, 5, 0.1).W\n"
        "print(json.dumps({'kernel': eng.kernel, 'detail': eng.kernel_detail, 'refused': refused,"
        " 'W': W.tolist()}))\n"
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), ATTNSVM_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["kernel"] == "eager" and "no C compiler found" in got["detail"]
    assert got["refused"].startswith(
        "kernel='fused' cannot run: fused kernel unavailable: no C compiler found"
    )
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    W_eager = np.array(got["W"])
    assert np.linalg.norm(W_eager - fused.W) <= ENGINE_AGREEMENT * np.linalg.norm(fused.W)


#: The recorded risk's accuracy: each margin u_i = Y_i f_i is known to ±δu_i = [(T+d)·eps + 2·δl]·Σ_t s_it|a_it|
#: (the values' and the logits' rounding, δl of _logit_error), and ℓ(u) moves by |ℓ'(u)/ℓ(u)|·δu ≤ δu
#: relative (logistic and exponential losses); 8·eps for the loss's own evaluation and the mean.
RISK_EPS = 8 * EPS


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
@pytest.mark.parametrize("scale", [0.0, 1.0, 30.0, 1e3])
def test_records_take_the_kernels_margins_and_tokens_against_mpmath(loss: str, scale: float) -> None:
    """Oracle: the risk and the selected tokens in 400-digit mpmath at the final iterate. ``run_gd_batch``
    records from the fused kernel's own margins and tokens, and from the logits for an instance the kernel
    hands back (a tie, at index 1): every recorded risk within δu relative, every token the exact argmax;
    from ``W0 = scale·U`` (saturated at 1e3) after one normalized step."""
    insts = _instances(4, seed=60)
    tie = insts[1]
    X = tie.X.copy()
    X[:, 1] = X[:, 0]  # the kernel hands this instance back wherever token 0 or 1 is selected
    insts[1] = A.Instance(X, tie.Y, tie.v, tie.z)
    U = np.random.default_rng(3).standard_normal((len(insts), 4, 4))
    U /= np.linalg.norm(U, axis=(1, 2), keepdims=True)
    tr = run_gd_batch(insts, 1, 0.1, loss=loss, W0=scale * U, record_at=[1], kernel="fused")
    eng = BatchEngine.from_instances(insts, loss=loss, kernel="fused")
    eng.gradient(torch.as_tensor(tr.W))
    held = eng._last_margins()[2].tolist()  # white-box: the logits path ran for the tie where ‖W‖ ≥ 30
    assert held[0] and held[2] and held[3] and (scale < 30 or not held[1]), held
    for b, inst in enumerate(insts):
        risk, tokens, mag = mp_risk_and_tokens(inst.X, inst.Y, inst.z, inst.v, tr.W[b], loss)
        du = ((inst.T + inst.d) * EPS + 2 * _logit_error(inst, tr.W[b])) * mag
        assert abs(tr.risks[-1, b] - risk) <= (du + RISK_EPS) * risk, (b, tr.risks[-1, b], risk)
        # a tie of exact copies: the first of them is the argmax, in float64 as in mpmath
        assert tr.tokens[-1, b].tolist() == tokens, b
