"""Edges of the GD engines' exact rescaling, records and fused-kernel build (attnsvm.gd).

Each test pins one behaviour with an independent oracle: mpmath at 400 digits (tests/_mp_oracle.py), an
exact construction (products of powers of two, a symmetry that makes a risk exactly 0), scale
equivariance by exact powers of two, the documented wording of an error, or the library a fresh build
leaves in an empty cache.

* The rescaling (``gd._scaled``): token values carried by ``v·2^c`` at the exponent that makes the smallest
  ``|v_k|`` normal, where ``v·2^ex`` rounds entries that carry a whole value.
* (K, Q) GD (``gd._kq``): a product ``K Qᵀ`` whose largest entry is exactly ``FLOAT_TINY`` or ``FLOAT_MAX``.
* ``run_gd`` (``gd._single``): a zero iterate is never "settled"; a plain run that takes every step.
* ``run_gd_batch`` (``gd._batch``): norms at the edge of the direct range, the exact risk of a masked
  instance, the step named by a refusal, ``_fro_batch``'s default ``m``.
* The fused kernel (``gd._fused``): the cache folder, a fresh build, an unwritable cache, a failing
  compiler, the Python-thread split of a library built without OpenMP, the contiguity guard.
* ``regularization_path`` (``gd._paths``): the names in its refusals.
"""

from __future__ import annotations

import ctypes
import math
import os
import shlex
import shutil
import sysconfig
import tempfile
from pathlib import Path

import mpmath
import numpy as np
import pytest
from _mp_oracle import mp_grad

import attnsvm as A
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.gd import BatchEngine, _fused, regularization_path, run_gd_batch, run_gd_kq
from attnsvm.gd._batch import _fro_batch
from attnsvm.gd._single import GDRecord, _settled

torch = pytest.importorskip("torch")

EPS = float(np.finfo(np.float64).eps)
FLOAT_TINY = float(np.finfo(np.float64).tiny)
FLOAT_MAX = float(np.finfo(np.float64).max)
#: Normwise accuracy of a unit direction with exact logits and values (as tests/test_fused_kernel.py): each
#: weight a product of a few log-sum-exp terms, each entry of G a sum of nT products; nT(d + T)·eps ≤ 32·eps
#: at n = 2, T = 2, d = 4, and 256·eps leaves a factor 8 for the exp and log.
DIR_TOL_EXACT = 256 * EPS
#: The logits' rounding: l = xᵀ(W z) to ±2·d·eps·|x|ᵀ|W||z| (two dot products of length d); each weight
#: e^{l_t − l_u} then moves by a factor e^{±2δl}, the direction by ≤ 4·δl·κ.
DOT_FACTOR = 2


#: A recorded Frobenius norm of a d×d matrix (d = 3): a scaled sum of d² squares (≤ d² roundings) and a sqrt.
NORM_RTOL_D3 = (3 * 3 + 1) * EPS
#: The recorded risk of an exactly-zero correlation risk −(u_0 + u_1)/2: each margin u_i = Y_i Σ_t s_it a_it carries
#: its rounding (T + d)·eps·Σ_t s_it|a_it| with T + d = 5 and |a_it| ≤ 0.5 (the values 0.5 and −0.25).
RISK_ZERO_TOL = 5 * EPS * 0.5


def _step_rounding(W0: np.ndarray, W1: np.ndarray, lr: float) -> float:
    """Normwise error of the direction read back as ``(W0 − W1)/lr`` (``lr`` a power of two): ``W1`` rounds each
    entry by ≤ eps/2·|W1_jk| and the subtraction each by ≤ eps/2·|W0_jk − W1_jk| ≤ eps/2·(|W0_jk| + |W1_jk|)."""
    return EPS * (float(np.linalg.norm(W0)) + float(np.linalg.norm(W1))) / lr


def _logit_error(inst: A.Instance, W: np.ndarray) -> float:
    mag = np.einsum("itk,kj,ij->it", np.abs(inst.X), np.abs(W), np.abs(inst.z))
    return float(DOT_FACTOR * inst.d * EPS * mag.max())


def _has_compiler() -> bool:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0]) is not None


needs_cc = pytest.mark.skipif(not _has_compiler(), reason="no C compiler: the fused kernel is not built here")


# ------------------------------------------------------------------------------- the rescaling (_scaled)
def _subnormal_carried_values(e4: int = 100) -> A.Instance:
    """Keys ``≈ 2^−100`` (``ex = −100``) and ``v = (v_0, v_1, v_2, 2^e4)`` with ``v_k ≈ 0.4·2^−922`` (53-bit
    mantissas, last bit set). ``v·2^ex`` puts ``v_0..v_2`` at ``≈ 0.4·2^−1022``: subnormal, each rounded.
    Token (0, 0) reads all three with keys ``0.9375·2^−100``: its value ``≈ 1.13·2^−1022`` is normal, but the
    rounding (``≤ 2^−1075`` per entry) is larger than the value's own (``eps·Σ|x v|``), so ``v·2^ex`` cannot
    carry it; ``v·2^−98`` can (smallest ``|v_k|·2^−98 ≈ 0.8·2^−1021``, normal; the largest ``2^(e4−98)``). With
    ``e4 = 930`` the values reach 2^830 and ``v·2^+98`` (the other direction) would overflow."""
    c, s = 0.9375, 2.0**-100
    tiny = np.array([np.nextafter(0.4, 1.0), np.nextafter(0.41, 1.0), np.nextafter(0.43, 1.0)])
    v = np.array([*np.ldexp(tiny, -922), 2.0**e4])
    X = np.zeros((2, 2, 4))
    X[0, 0, :3] = c * s
    X[0, 1, 3] = c * s
    X[1, 0, 3] = 0.5 * s
    X[1, 1, :3] = [c * s, 0.875 * s, 0.75 * s]
    z = np.array([[1.0, -0.5, 0.25, 0.75], [-0.5, 1.0, 0.5, -0.25]])
    return A.Instance(X, np.array([1.0, -1.0]), v, z)


@pytest.mark.parametrize("e4", [100, 930])
def test_values_carried_where_v_at_the_keys_exponent_rounds_them_follow_mpmath(e4: int) -> None:
    """Oracle: ∇L in 400-digit mpmath from the exact inputs. The instance's values are normal doubles
    (1.1e-308 … 0.94) although ``v·2^ex`` rounds the entries that carry the smallest one: run_gd carries
    ``v`` at the exponent that makes its smallest entry normal and takes one normalized step from ``W0``
    (logits O(1): ``W0 ~ 2^100`` on keys ``~ 2^−100``) whose direction ``(W0 − W1)/lr`` is the oracle's."""
    inst = _subnormal_carried_values(e4)
    base = np.array(
        [[1.0, 0.5, -0.25, 0.5], [0.25, -1.0, 0.5, 0.0], [0.5, 0.25, 1.0, -0.5], [-0.5, 0.75, 0.0, 1.0]]
    )
    _check_one_step_against_mpmath(inst, np.ldexp(base, 100))


def _check_one_step_against_mpmath(inst: A.Instance, W0: np.ndarray) -> None:
    """One normalized ``run_gd`` step of ``lr = 2^97`` from ``W0`` (``~ 2^100``): its direction ``(W0 − W1)/lr`` is
    mpmath's to ``κ·(DIR_TOL_EXACT + 4·δl)`` plus the step's own rounding."""
    lr = 2.0**97
    W1 = A.run_gd(inst, 1, lr, W0=W0).W
    D = (W0 - W1) / lr
    _, ref, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W0, "logistic", None)
    assert ref is not None
    tol = kappa * (DIR_TOL_EXACT + 4 * _logit_error(inst, W0)) + _step_rounding(W0, W1, lr)
    assert np.linalg.norm(D - ref) <= tol, (np.linalg.norm(D - ref), tol)


def _keys_need_one_exponent_less() -> A.Instance:
    """As :func:`_subnormal_carried_values`, with two more coordinates: ``v_3 = 2^−1070`` (subnormal: the smallest
    ``|v_k|``, so ``v·2^c`` makes it normal from ``c = 48`` on) read by no token, and ``v_4 = 2^900`` read by
    one token per sequence through keys ``(1 + j·2^−52)·2^−976``. Every value is a normal double (2.4e-308 …
    1.3e-23). At ``c = 48`` those keys times ``2^−48`` lie in ``[2^−1024, 2^−1023)``: subnormal, each rounded by
    more than its value's own rounding; at ``c = 47`` they lie in ``[2^−1023, 2^−1022)`` and round harmlessly
    (``v_3·2^47 = 2^−1023`` is exact)."""
    c, s = 0.9375, 2.0**-100
    tiny = np.array([np.nextafter(0.4, 1.0), np.nextafter(0.41, 1.0), np.nextafter(0.43, 1.0)])
    v = np.array([*np.ldexp(tiny, -922), 2.0**-1070, 2.0**900])
    X = np.zeros((2, 2, 5))
    X[0, 0, :3] = c * s
    X[0, 1, 4] = np.ldexp(1 + 2.0**-52, -976)
    X[1, 0, 4] = np.ldexp(1 + 3 * 2.0**-52, -976)
    X[1, 1, :3] = [c * s, 0.875 * s, 0.75 * s]
    z = np.array([[1.0, -0.5, 0.25, 0.75, 0.5], [-0.5, 1.0, 0.5, -0.25, 0.5]])
    return A.Instance(X, np.array([1.0, -1.0]), v, z)


def test_values_whose_keys_round_at_the_smallest_v_exponent_are_carried_one_exponent_lower() -> None:
    """Oracle: ∇L in 400-digit mpmath. Every token value is a normal double, so the scale contract asks for the
    right answer: one normalized step from ``W0 ~ 2^100`` whose direction is the oracle's (as
    :func:`test_values_carried_where_v_at_the_keys_exponent_rounds_them_follow_mpmath`)."""
    inst = _keys_need_one_exponent_less()
    assert np.all(np.abs(inst.values()) >= FLOAT_TINY)  # every value normal: no refusal is due
    base = np.eye(5) + np.ldexp(np.arange(25.0).reshape(5, 5) % 3 - 1.0, -2)
    _check_one_step_against_mpmath(inst, np.ldexp(base, 100))


def test_a_refused_value_names_the_entry_of_v_that_leaves_the_range() -> None:
    """The scale contract's error names the cause: ``v = (1, 2^−1000)`` on keys ``≈ 2^−100``; token 1 reads only
    ``v_1``, so its value ``0.5·2^−1100`` is no normal double (≈ 1e-331, an underflow), while ``v_0`` (values
    ≈ 2^−100) is fine: the refusal names ``|v_1| = 9.33e-302`` and the size 1e-331 (``2^−1000·2^−100``)."""
    X = np.zeros((1, 2, 2))
    X[0, 0] = [0.75 * 2.0**-100, 0.0]
    X[0, 1] = [0.0, 0.5 * 2.0**-100]
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 2.0**-1000]), np.array([[1.0, 0.5]]))
    with pytest.raises(
        NumericalError, match=r"\(\|v_1\| = 9\.33e-302 times .* is about 1e-331: it underflows"
    ):
        A.run_gd(inst, 1, 0.1)


# --------------------------------------------------------------------------------------- (K, Q) GD (_kq)
#: ||W||_F and ||W||_* of a product with one or two nonzero entries: a scaled sum of ≤ 4 squares and a sqrt, or
#: the singular values of a diagonal matrix (exact up to the SVD's few roundings): 4·eps.
KQ_NORM_RTOL = 4 * EPS


def _kq_instance(shift: int = 0) -> A.Instance:
    inst = A.random_instance(2, 3, 2, seed=5)
    return A.Instance(np.ldexp(inst.X, -shift), inst.Y, np.ldexp(inst.v, shift), np.ldexp(inst.z, -shift))


def test_kq_product_whose_largest_entry_is_float_tiny_is_accepted() -> None:
    """Oracle: the exact product. ``K0 = Q0 = 2^−511·I``: ``W_0 = K0 Q0ᵀ = 2^−1022·I``, whose largest entry is
    FLOAT_TINY itself, the smallest normal double: inside the documented range, so no refusal; the record of
    step 0 has ``||W_0||_F = √2·2^−1022`` and ``||W_0||_* = 2·2^−1022``."""
    K0 = np.ldexp(np.eye(2), -511)
    tr = run_gd_kq(_kq_instance(), 1, 0.1, K0=K0, Q0=K0.copy(), record_at=[0])
    assert tr.record[0].step == 0
    np.testing.assert_allclose(
        tr.record[0].norm, math.ldexp(math.sqrt(2.0), -1022), rtol=KQ_NORM_RTOL, atol=0
    )
    np.testing.assert_allclose(tr.nuclear_norms[0], 2 * FLOAT_TINY, rtol=KQ_NORM_RTOL, atol=0)


def test_kq_product_whose_largest_entry_is_float_max_is_accepted() -> None:
    """Oracle: the exact product. ``K0[0, 0] = FLOAT_MAX``, ``Q0[0, 0] = 1`` (other entries 0): ``W_0`` has the
    single entry FLOAT_MAX, the largest double; the data ``X·2^−540``, ``z·2^−540`` keep its logits of order
    ``2^−56``, so ``W_0`` is inside the range: recorded with ``||W_0||_F = ||W_0||_* = FLOAT_MAX``. (A step of
    2^−60 moves ``Q[0, 0] = 1`` by less than half its ulp, so ``W_1`` stays a double.)"""
    K0 = np.zeros((2, 2))
    K0[0, 0] = FLOAT_MAX
    Q0 = np.zeros((2, 2))
    Q0[0, 0] = 1.0
    tr = run_gd_kq(_kq_instance(540), 1, 2.0**-60, K0=K0, Q0=Q0, record_at=[0])
    assert tr.record[0].step == 0
    np.testing.assert_allclose(tr.record[0].norm, FLOAT_MAX, rtol=KQ_NORM_RTOL, atol=0)
    np.testing.assert_allclose(tr.nuclear_norms[0], FLOAT_MAX, rtol=KQ_NORM_RTOL, atol=0)


# ------------------------------------------------------------------------------------------ run_gd (_single)
def _record(W: np.ndarray) -> GDRecord:
    return GDRecord(0, 0.0, 0.0, np.array([0], dtype=np.intp), math.nan, math.nan, 0.0, W)


def test_a_zero_iterate_among_the_first_two_records_is_not_settled() -> None:
    """A zero iterate has no direction (direction_gap refuses it): three records with the same tokens whose
    first (or second) iterate is 0 are not settled, whatever the tolerance."""
    W = np.eye(2)
    assert not _settled([_record(np.zeros((2, 2))), _record(W), _record(W)], 2.0)
    assert not _settled([_record(W), _record(np.zeros((2, 2))), _record(W)], 2.0)


def test_early_stop_passes_through_a_zero_iterate() -> None:
    """Oracle: the same run without early stop (early stop only ends a run; it never changes an iterate).
    d = 1, one sequence with tokens ±1, values ±1 and label −1: the risk increases with w everywhere, so
    normalized GD moves w by exactly −0.1 per step: 0.2, 0.1, 0.0 (exactly: 0.1 − 0.1), −0.1, −0.2. The
    third record is the zero iterate, which has no direction: not settled, the run goes on."""
    inst = A.Instance(np.array([[[1.0], [-1.0]]]), np.array([-1.0]), np.array([1.0]), np.array([[1.0]]))
    W0 = np.array([[0.2]])
    plain = A.run_gd(inst, 4, 0.1, W0=W0, record_at=list(range(5)))
    assert [float(r.norm) for r in plain.record][2] == 0.0  # the zero iterate is recorded
    early = A.run_gd(inst, 4, 0.1, W0=W0, record_at=list(range(5)), early_stop=1e-3)
    assert np.array_equal(early.W, plain.W)


def test_a_plain_run_that_takes_every_step_is_not_saturated() -> None:
    """Oracle: ∇L in 400-digit mpmath. Plain GD for one step from W0 (no underflow, no stall): the run reports
    ``saturated=False`` and ``stop_reason="steps"``, records step 0 and the last step (as every run), and ``W_1 = W0 − η∇L(W0)``."""
    inst = A.random_instance(2, 3, 3, seed=11)
    W0 = 0.5 * np.eye(3)
    lr = 0.25
    tr = A.run_gd(inst, 1, lr, normalized=False, W0=W0, record_at=[0])
    assert tr.saturated is False and tr.stop_reason == "steps"
    assert [r.step for r in tr.record] == [0, 1]  # the requested step and the last
    log_norm, D, kappa = mp_grad(inst.X, inst.Y, inst.z, inst.v, W0, "logistic", None)
    assert D is not None
    G = math.exp(float(log_norm)) * D
    # the step's direction to κ·(DIR_TOL_EXACT + 4δl) (its size e^{log||∇L||}, to a few eps, inside the factor 8
    # DIR_TOL_EXACT leaves), each entry of W1 rounded once: normwise ≤ lr·||G||·(that) + eps·||W1||
    tol = lr * float(np.linalg.norm(G)) * kappa * (DIR_TOL_EXACT + 4 * _logit_error(inst, W0)) + EPS * float(
        np.linalg.norm(tr.W)
    )
    assert np.linalg.norm(tr.W - (W0 - lr * G)) <= tol


# ------------------------------------------------------------------------------------ run_gd_batch (_batch)
def test_fro_batch_by_default_takes_each_matrix_largest_entry_itself() -> None:
    """Oracle: ``||W_b||_F`` in 60-digit mpmath from the exact entries. Without ``m`` the function finds each
    matrix's largest entry itself: matrices at 2^±1000 and 1 (squares far outside the range), a zero matrix
    (its norm 0), each within (d² + 1)·eps of the exact norm (the scaled sum of d² squares and a sqrt)."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 3, 3))
    Wn = np.ascontiguousarray(
        np.stack([np.ldexp(base[0], 1000), base[1], np.ldexp(base[2], -1000), 0 * base[3]])
    )
    got = _fro_batch(Wn)
    with mpmath.workdps(60):
        exact = [float(mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(w)) ** 2 for w in W.ravel()))) for W in Wn]
    np.testing.assert_allclose(got, exact, rtol=NORM_RTOL_D3, atol=0)


def test_recorded_norms_scale_exactly_at_the_edge_of_the_direct_range() -> None:
    """Oracle: scale equivariance by an exact power of two. Twenty matrices with largest entry exactly 1
    and the same matrices times 2^−400 (largest entry exactly 2^−NORM_DIRECT, the edge of the direct range,
    where no square underflows: ≥ 2^−800): ``||2^−400·M||_F`` is recorded as exactly 2^−400 times
    ``||M||_F`` (the same sums, every intermediate scaled by the power of two)."""
    insts = [A.random_instance(2, 3, 3, seed=60 + s) for s in range(20)]
    rng = np.random.default_rng(0)
    M = rng.standard_normal((20, 3, 3))
    M /= np.max(np.abs(M), axis=(1, 2), keepdims=True)
    assert np.all(np.max(np.abs(M), axis=(1, 2)) == 1.0)
    one = run_gd_batch(insts, 1, 0.1, W0=M, record_at=[0]).norms[0]
    small = run_gd_batch(insts, 1, 0.1, W0=np.ldexp(M, -400), record_at=[0]).norms[0]
    assert np.array_equal(small, np.ldexp(one, -400))


def test_a_masked_instance_whose_risk_is_exactly_zero_records_zero() -> None:
    """Oracle: an exact symmetry. Correlation loss ``ℓ(u) = −u``; sequence 1's allowed logits are sequence 0's
    plus 1 (the softmax over the allowed tokens is the same), the values are the same and the labels
    opposite, so ``L = −(f_0 − f_0)/2 = 0`` exactly; token 2 of each sequence is masked out (its weight is 0,
    as if deleted: the oracle sums over the allowed tokens in 60-digit mpmath). The engine reads 0 and
    takes the single form's value of the masked instance: 0 (a masked token counted in would weigh
    differently in the two sequences, its logit being 0 in both)."""
    X = np.zeros((2, 3, 2))
    X[:, 0] = [0.5, 1.0]
    X[:, 1] = [-0.25, 1.0]
    X[:, 2] = [0.75, -0.5]  # masked out
    z = np.array(
        [[1.0, 0.0], [1.0, 1.0]]
    )  # logit x_0 + x_1·z_1: sequence 1's allowed logits are sequence 0's + 1
    v = np.array([1.0, 0.0])
    Y = np.array([1.0, -1.0])
    mask = np.array([[True, True, False], [True, True, False]])
    inst = A.Instance(X, Y, v, z, mask=mask)
    W0 = np.eye(2)
    with mpmath.workdps(60):
        f = []
        for i in range(2):
            lg = [mpmath.mpf(float(X[i, t] @ W0 @ z[i])) for t in range(2)]
            s = [mpmath.exp(l - max(lg)) for l in lg]
            f.append(mpmath.fsum(si * float(X[i, t] @ v) for t, si in enumerate(s)) / mpmath.fsum(s))
        exact = float(-(Y[0] * f[0] + Y[1] * f[1]) / 2)
    assert exact == 0.0
    tr = run_gd_batch([inst, inst], 1, 0.1, loss="correlation", W0=W0, record_at=[0], kernel="eager")
    assert np.all(np.abs(tr.risks[0]) <= RISK_ZERO_TOL), tr.risks[0]


# ------------------------------------------------------------------------------------ the fused kernel build
def test_the_cache_folder_is_attnsvm_cache_dir_when_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Documented (module docstring of attnsvm.gd._fused): the library's cache folder is $ATTNSVM_CACHE_DIR,
    else $XDG_CACHE_HOME/attnsvm."""
    monkeypatch.setenv("ATTNSVM_CACHE_DIR", str(tmp_path / "mine"))
    assert _fused._cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("ATTNSVM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _fused._cache_dir() == tmp_path / "xdg" / "attnsvm"


def _library_d(path: Path) -> int:
    lib = ctypes.CDLL(str(path))
    return int(lib.attnsvm_fused_d())


@needs_cc
def test_a_fresh_build_leaves_exactly_the_library_in_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A build into an empty cache: the library is written in the cache folder (atomically: from a temporary
    file beside it, so no system temp folder is needed: here it does not exist), declares the requested
    ``d``, and is the only file left there; a second build returns the same path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    cache = tmp_path / "cache"
    lib = _fused._build(_fused._SOURCE.read_bytes(), cache, 3)
    assert lib.parent == cache and lib.name.startswith("attnsvm_fused_d3_") and lib.suffix == ".so"
    assert sorted(p.name for p in cache.iterdir()) == [lib.name]
    assert _library_d(lib) == 3
    assert _fused._build(_fused._SOURCE.read_bytes(), cache, 3) == lib


@needs_cc
@pytest.mark.skipif(not Path("/sys").is_dir(), reason="needs /sys, a folder nobody may create entries in")
def test_an_unwritable_cache_falls_back_to_the_temp_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cache folder that cannot be created (under /sys: PermissionError, even for root): the library is
    built in ``<tempdir>/attnsvm-<uid>`` instead and the kernel runs (kernel_status says which library)."""
    monkeypatch.setenv("ATTNSVM_CACHE_DIR", "/sys/attnsvm-no-cache/here")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_fused, "_libs", {})
    monkeypatch.setattr(_fused, "_errors", {})
    ok, detail = _fused.kernel_status(2)
    assert ok, detail
    fallback = tmp_path / f"attnsvm-{os.getuid()}"
    assert [p.name for p in fallback.iterdir()] == [Path(detail.split(": ", 1)[1]).name]


def test_a_failing_compiler_is_reported_with_every_flag_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that exists but fails (``false``): the documented OSError "the C compiler failed: " with one
    entry per flag set tried, and nothing left in the cache."""
    false = shutil.which("false")
    if false is None:  # pragma: no cover - every POSIX system has false
        pytest.skip("no `false` command")
    monkeypatch.setenv("CC", false)
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match=r"^the C compiler failed: ") as exc:
        _fused._build(_fused._SOURCE.read_bytes(), cache, 2)
    assert str(exc.value).count(" | ") == len(_fused._FLAG_SETS) - 1
    assert not any(cache.iterdir())


def _instances(count: int, seed: int) -> list[A.Instance]:
    return [A.random_instance(3, 5, 4, seed=seed + s) for s in range(count)]


@needs_cc
def test_a_library_without_openmp_splits_the_batch_over_threads_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Built without OpenMP (the flag sets without ``-fopenmp``), the kernel splits a batch of 40 (three blocks
    of 16) between two Python threads in whole blocks: the directions and log-norms are bitwise those of one
    thread (documented: results do not depend on the threads), and instance 0's is mpmath's."""
    monkeypatch.setenv("ATTNSVM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_fused, "_FLAG_SETS", tuple(f for f in _fused._FLAG_SETS if "-fopenmp" not in f[0]))
    monkeypatch.setattr(_fused, "_libs", {})
    monkeypatch.setattr(_fused, "_errors", {})
    insts = _instances(40, seed=70)
    W = torch.as_tensor(np.random.default_rng(4).standard_normal((40, 4, 4)))
    old = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            eng = BatchEngine.from_instances(insts, kernel="fused")
            assert eng._fused is not None and not eng._fused._openmp  # white-box: the library built here
            D, ln = eng.direction(W)
            out.append((D.clone(), ln.clone(), eng._fused.flag.clone()))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert not bool(out[1][2][0])  # instance 0 decided by the kernel itself
    log_norm, ref, kappa = mp_grad(
        insts[0].X, insts[0].Y, insts[0].z, insts[0].v, W[0].numpy(), "logistic", None
    )
    assert ref is not None
    tol = kappa * (DIR_TOL_EXACT + 4 * _logit_error(insts[0], W[0].numpy()))
    assert np.linalg.norm(out[1][0][0].numpy() - ref) <= tol


@needs_cc
def test_the_kernel_refuses_non_contiguous_arrays() -> None:
    """The kernel reads ``W`` and writes ``D`` through raw pointers: a transposed (non-contiguous) view is
    refused by name rather than read in the wrong order."""
    insts = _instances(2, seed=80)
    eng = BatchEngine.from_instances(insts, kernel="fused")
    assert eng._fused is not None
    W = torch.zeros((2, 4, 4), dtype=torch.float64)
    D = torch.empty((2, 4, 4), dtype=torch.float64)
    with pytest.raises(ValueError, match="the fused kernel takes contiguous W and D"):
        eng._fused(W.transpose(1, 2), D)


# ------------------------------------------------------------------------------ regularization_path (_paths)
def test_regularization_path_names_lr_and_w0_in_its_refusals() -> None:
    """Documented refusals name the argument: a negative lr as "the step size η", a start whose largest entry
    is subnormal (2^−1060) as W0 (the contract's range error)."""
    inst = A.random_instance(2, 3, 2, seed=9)
    with pytest.raises(AttnSVMError, match=r"^lr must be a positive finite number \(the step size η\)"):
        regularization_path(inst, [1.0], lr=-1.0)
    with pytest.raises(NumericalError, match=r"^W0 is about 1e-319"):
        regularization_path(inst, [1.0], W0=np.ldexp(np.eye(2), -1060))
