"""Benchmarks behind ``attnsvm bench`` (and ``benchmarks/bench_*.py``): Att-SVM solvers and the batched GD engine.

This module is the single home of the benchmark logic; the scripts in ``benchmarks/`` are thin
command-line wrappers over it. Two groups, each measured side by side within one run so that the
ratios compare like with like:

* ``svm`` — for ``n = 6`` sequences of ``T = 8`` tokens (``m = 42`` constraints): the matrix
  primal (cvxpy + Clarabel, ``d²`` variables) at ``d = 32, 128, 256``, the vectorised program at
  ``d = 32, 128`` and the exact factorised dual at ``d = 32 … 1024``, with the relative error of
  the conic solver's own answer and of the final (active-set polished) answer against the
  certified dual solution. The dual is timed ``repeats`` times (median and range); each conic
  program once (seconds to a minute each). Targets (issue 3): dual at ``d = 1024`` in ≤ 0.1 s;
  ≥ 50× faster than the primal at ``d = 128``. The primal at ``d ≥ 512`` takes minutes and
  gigabytes and is never run.
  Scale rows (issue 16 §1, :func:`bench_svm_scale`, run with the group): the certified working-set
  solver (:func:`attnsvm.svm._working_set.solve_svm_working_set`) at ``m = 1984, 7936, 31744``
  constraints (gaussian, ``T = 32``, ``d = 64, 128, 128``), beside the dense dual where it fits in time
  (``m ≤ 1984``) and ``sklearn.svm.LinearSVC`` on the explicit ``m × d²`` features where they fit in
  memory (``m ≤ 7936``; "not installed" without scikit-learn): time and peak memory (each solve in a
  fresh process: the growth of its peak resident set), certificate, and each answer's error against
  the certified one. Targets: ≤ 10 s at ``m = 7936``, ≤ 60 s and
  ≤ 4 GiB at ``m = 31744``. The full scale rows take about two minutes; ``--quick`` runs
  ``m = 480, 1984``.
* ``gd`` — instance-steps per second of the batched engine's step
  (:class:`attnsvm.gd.BatchEngine`, the step of :func:`attnsvm.gd.run_gd_batch`) against a
  per-instance torch autograd + SGD loop (normalized GD, the way published experiments run
  it), same torch thread count (2), batch 4096. Two loops: :func:`autograd_loop_rate`, lean
  (no module, an einsum, a stable softplus: the stricter baseline, the headline ratio), and
  :func:`published_loop_rate`, an ``nn.Module`` loop with the structure of the seed papers'
  public code (reported beside it). The two are measured in alternating rounds
  (each batched figure the best of 3 runs of a few steps, each loop figure one run of many
  steps); the ratio reported is the median of the per-round ratios with their range, so a load
  burst on a shared machine hits both sides of a round. Also: the same step with the
  log-domain path forced (``path="log"``, what a saturated run pays), the public entry point end
  to end, the distance to the memory-bandwidth floor (each step streams ``X`` at least twice)
  and the fraction of the machine's dense float64 GEMM rate the step reaches. Target (issue 4):
  ≥ 200× at ``B = 4096`` on 2 cores. Issue 16 §2: both paths ≥ 400× at ``B = 4096``, the log-domain
  step ≤ 1.25× the fast step (``log_over_fast``, per-round ratio), and the public entry point within
  1.2× of the engine's step (``api_over_step``: :func:`~attnsvm.gd.run_gd_batch` over ``api_steps``
  steps with its default 25 records against the engine's ``step_`` over the same trajectory, from
  ``W = 0``, alternating rounds; its fixed set-up, :meth:`~attnsvm.gd.BatchEngine.from_instances`, is
  reported as ``api_setup_ms``, and the short run of the earlier figure, ``batch_steps`` steps with the
  set-up included, as ``api_step_ms``). Fusing the step's passes with ``torch.compile`` was measured
  separately (``benchmarks/bench_fusion.py``, docs/benchmarks.md) and is not used.

Environment: the 1-min load average before and after each group, the torch thread count and the
thread variables are recorded with the results. Both engines run with the process's OpenMP
settings (the default spinning wait measured fastest for both on a quiet machine, with the
previous engine: loop 0.23 ms, batched 4.97 ms; with ``OMP_WAIT_POLICY=PASSIVE`` 0.55 ms and
8.6 ms, a flattering 262× that comes from slowing the loop). On an oversubscribed machine spinning workers steal the main
thread's CPU (loop 0.2 → 2.3 ms/step at load 5): run the benchmark on a quiet machine, or set
``OMP_WAIT_POLICY=PASSIVE`` for both sides and read the ratio as such. This module changes no
process-wide setting except the torch thread count during :func:`bench_gd`, restored afterwards.

``--quick`` sizes take about ten seconds; ``tiny`` (tests) runs toy sizes whose numbers mean
nothing; the full sizes take minutes and gigabytes and never run in CI.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, normalized GD);
Gao, Song, Xie, arXiv 2307.02419 (tensor trick).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model._instance import require_unmasked

__all__ = [
    "SVM_FULL",
    "SVM_QUICK",
    "SVM_TINY",
    "bench_svm",
    "bench_svm_scale",
    "bench_gd",
    "run_benchmarks",
    "median_ratio",
    "environment",
    "svm_table",
    "svm_scale_table",
    "gd_table",
    "script_main",
]

N, T = 6, 8
SVM_FULL = {"primal": (32, 128, 256), "vector": (32, 128), "dual": (32, 128, 256, 512, 1024)}
SVM_QUICK = {"primal": (32,), "vector": (32,), "dual": (32, 128, 1024)}
SVM_TINY = {"primal": (8,), "vector": (8,), "dual": (8, 16)}  # the test suite's size
#: Never run the cvxpy programs above this dimension (minutes, gigabytes).
MAX_CONIC_D = 256
#: GD sizes: batch, loop steps per round, batched steps per timing, rounds, warm-up loop steps, and the
#: steps of the long public-API run timed in each round (``run_gd_batch`` with its default 25 records).
GD_SIZES = {
    "full": {
        "batch": 4096,
        "loop_steps": 500,
        "batch_steps": 20,
        "repeat": 5,
        "warmup": 20,
        "api_steps": 200,
    },
    "quick": {"batch": 512, "loop_steps": 100, "batch_steps": 5, "repeat": 3, "warmup": 20, "api_steps": 200},
    "tiny": {"batch": 16, "loop_steps": 10, "batch_steps": 2, "repeat": 2, "warmup": 2, "api_steps": 3},
}
#: Machine probes per size: bytes of the bandwidth copy, GEMM matrix size.
GD_PROBES = {"full": (2**28, 2048), "quick": (2**26, 1024), "tiny": (2**20, 128)}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")


# ------------------------------------------------------------------------------- helpers
def _times(f: Callable[[], Any], repeat: int) -> list[float]:
    """Wall times of ``repeat`` calls of ``f``."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return out


def median_ratio(
    num: Sequence[float], den: Sequence[float], scale: float = 1.0
) -> tuple[float, float, float]:
    """Median and range of the per-round ratios ``scale · num_k / den_k``.

    Each round measures both sides back to back, so a load burst shifts both; the median of the
    per-round ratios is therefore more robust than the ratio of the medians.

    Args:
      num, den: per-round figures of equal length ``R ≥ 1``, ``den_k > 0``.
      scale: a constant factor (e.g. the batch size for instance-steps).

    Returns:
      ``(median, min, max)`` of the ``R`` ratios.
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"median_ratio needs two equal, non-empty sequences; got {len(num)} and {len(den)}")
    r = [scale * a / b for a, b in zip(num, den, strict=True)]
    return float(np.median(r)), float(min(r)), float(max(r))


def _load() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # not available on this platform
        return None


def environment() -> dict[str, Any]:
    """Where the figures were measured: cores, 1-min load, torch threads and version, thread variables."""
    import torch

    return {
        "cpus": os.cpu_count(),
        "load_avg_1min": _load(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **{v: os.environ.get(v) for v in THREAD_VARS},
    }


# ------------------------------------------------------------------------------------ SVM
def bench_svm(
    quick: bool = False, seed: int = 0, repeats: int = 5, tiny: bool = False
) -> list[dict[str, Any]]:
    """Time the Att-SVM methods side by side; one row per ``(method, d)``.

    Keys: ``bench`` (``"svm"``), ``method``, ``n``, ``T``, ``d``, ``time_s`` (median wall time:
    over ``repeats`` calls after a warm-up for the dual, one call for a conic program),
    ``time_range_s`` (``[min, max]``), ``runs``, ``solver_time_s`` (conic solver only),
    ``raw_rel_error`` (conic answer against the certified dual ``W``; ``None`` for the dual),
    ``rel_error`` (final answer against it, ``||W − W_dual||_F / ||W_dual||_F``), ``certified``,
    ``error_bound``, ``time_over_dual`` (method time / median dual time at the same ``d``).
    """
    from ..model._instance import random_instance
    from ..svm import solve_svm

    dims = SVM_TINY if tiny else SVM_QUICK if quick else SVM_FULL
    rows: list[dict[str, Any]] = []

    def row(method: str, d: int, times: list[float], sol: Any, dual: Any, t_dual: float) -> dict[str, Any]:
        t = float(np.median(times))
        return {
            "bench": "svm",
            "method": method,
            "n": N,
            "T": T,
            "d": d,
            "time_s": t,
            "time_range_s": [min(times), max(times)],
            "runs": len(times),
            "solver_time_s": sol.timings.get("solver") if method != "dual" else None,
            "raw_rel_error": sol.raw_rel_error if method != "dual" else None,
            "rel_error": float(np.linalg.norm(sol.W - dual.W) / np.linalg.norm(dual.W)),
            "certified": bool(sol.certified),
            "error_bound": sol.error_bound,
            "time_over_dual": t / t_dual,
        }

    for d in sorted(set(dims["dual"]) | set(dims["primal"]) | set(dims["vector"])):
        inst = random_instance(N, T, d, seed=seed + d)
        dual = solve_svm(inst, method="dual")  # warm-up and reference
        t_duals = _times(lambda: solve_svm(inst, method="dual"), repeats)  # noqa: B023 - called at once
        t_dual = float(np.median(t_duals))
        if d in dims["dual"]:
            rows.append(row("dual", d, t_duals, dual, dual, t_dual))
        for method in ("primal", "vector"):
            if d not in dims[method] or d > MAX_CONIC_D:
                continue
            t0 = time.perf_counter()
            sol = solve_svm(inst, method=method)
            rows.append(row(method, d, [time.perf_counter() - t0], sol, dual, t_dual))
    return rows


# ------------------------------------------------------------------------ SVM at scale
#: Scale rows (issue 16 §1): ``(n, T, d)`` of gaussian instances, ``m = n(T − 1)`` constraints.
SVM_SCALE_SIZES = {
    "full": ((64, 32, 64), (256, 32, 128), (1024, 32, 128)),  # m = 1984, 7936, 31744
    "quick": ((16, 31, 32), (64, 32, 64)),  # m = 480, 1984
    "tiny": ((6, 8, 8),),  # m = 42 (the test suite's size)
}
#: The dense dual is run beside the working set only up to this many constraints (issue 16 measured it
#: at 10.9 s for m = 1984, 117 s for m = 3968 and 545 s for m = 7936 on this machine).
SVM_SCALE_DENSE_MAX_M = {"full": 1984, "quick": 480, "tiny": 42}
#: sklearn's LinearSVC needs the explicit tensor-trick features, ``m × d²`` doubles (liblinear keeps a
#: second copy, about as large): run only while the features take at most this many bytes
#: (m = 7936, d = 128: 1.0 GiB runs; m = 31744, d = 128: 4.2 GB does not).
SKLEARN_MAX_FEATURE_BYTES = 2**31


def _rss_mib(field: str) -> float | None:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last :func:`_reset_peak_rss`) of this process, MiB, from
    ``/proc/self/status``; where that is missing, the lifetime peak ``ru_maxrss`` (``None`` without it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    import sys

    rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _reset_peak_rss() -> None:
    """Reset the peak resident set size (Linux ≥ 4.0: ``5`` to ``/proc/self/clear_refs``); else a no-op."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def _sklearn_linearsvc(inst: Any, C: float) -> tuple[Any, int]:
    """``LinearSVC(dual=True, loss="hinge", fit_intercept=False, C)`` on the explicit rows ``a_r = z_i ⊗ Δ_it``.

    LinearSVC needs two classes: row ``r`` enters as ``(y_r a_r, y_r)`` with ``y_r = ±1`` alternating, and
    ``y_r·wᵀ(y_r a_r) = wᵀa_r``, so the constraints are exactly ``wᵀa_r ≥ 1``. Returns ``W`` (column-major
    unvec of ``coef_``) and the number of liblinear iterations.
    """
    from sklearn.svm import LinearSVC

    from ..model._tensor import svm_rows

    rows = svm_rows(inst)
    y = np.where(np.arange(rows.shape[0]) % 2 == 0, 1.0, -1.0)
    rows *= y[:, None]
    clf = LinearSVC(dual=True, C=C, loss="hinge", fit_intercept=False, max_iter=100_000)
    clf.fit(rows, y)
    return np.asarray(clf.coef_).reshape((inst.d, inst.d), order="F"), int(np.max(clf.n_iter_))


def _scale_child(method: str, n: int, T: int, d: int, seed: int, C: float, w_path: str) -> dict[str, Any]:
    """One scale measurement, meant to run in a fresh process (:func:`_measure`): time and peak memory of
    one solve, ``W`` saved to ``w_path``. Memory: the peak resident set size during the solve (its high-water
    mark reset just before) minus the resident set before it: everything the solve allocates, C libraries
    included, over the process after imports and set-up."""
    from ..model._instance import random_instance
    from ..svm import solve_svm
    from ..svm._working_set import solve_svm_working_set

    inst = random_instance(n, T, d, seed=seed)
    out: dict[str, Any] = {}
    if method == "sklearn-linearsvc":
        import sklearn.svm  # noqa: F401 - imported before the timing

        def run() -> Any:
            W, iters = _sklearn_linearsvc(inst, C)
            out["iterations"] = iters
            return W
    else:
        solver = solve_svm_working_set if method == "working-set" else solve_svm
        kw: dict[str, Any] = {} if method == "working-set" else {"method": "dual"}
        solver(random_instance(3, 3, 4), **kw)  # warm-up: imports, first BLAS calls

        def run() -> Any:
            sol = solver(inst, **kw)
            out.update(
                certified=bool(sol.certified),
                error_bound=float(sol.error_bound),
                kkt_max=None if sol.kkt is None else float(sol.kkt.max()),
                support=len(sol.support),
                max_dual=None if sol.duals is None else float(np.max(sol.duals)),
                solver=sol.solver,
            )
            return sol.W

    _reset_peak_rss()
    rss0 = _rss_mib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    W = run()
    out["time_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0  # below time_s when other processes share the cores
    rss1 = _rss_mib("VmHWM")
    out["peak_mib"] = None if rss0 is None or rss1 is None else max(0.0, rss1 - rss0)
    np.save(w_path, W)
    return out


def _measure(
    method: str, shape: tuple[int, int, int], seed: int, C: float = 0.0
) -> tuple[dict[str, Any], Any]:
    """Run :func:`_scale_child` in a fresh Python process (its memory peak is its own; the parent's heap and
    earlier rows do not count); returns its dict and ``W``. The child inherits the environment (BLAS threads)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        w_path = os.path.join(tmp, "W.npy")
        code = (
            "import json, sys; from attnsvm.harness.bench import _scale_child; "
            "print(json.dumps(_scale_child(*json.loads(sys.argv[1]))))"
        )
        args = json.dumps([method, *shape, seed, C, w_path])
        proc = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"bench child ({method}, {shape}) failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(w_path)


def bench_svm_scale(size: str = "full", seed: int = 0) -> list[dict[str, Any]]:
    """The working-set Att-SVM at scale, beside the dense dual and sklearn's LinearSVC; one row per
    ``(method, m)``, each solve run once, each in a fresh process (:func:`_measure`).

    Keys: ``bench`` (``"svm_scale"``), ``method`` (``"working-set"``, ``"dense-dual"``,
    ``"sklearn-linearsvc"``), ``n``, ``T``, ``d``, ``m``, ``time_s`` (``None`` when not run), ``peak_mib``
    (growth of the process's peak resident memory during the solve), ``certified``, ``error_bound``,
    ``kkt_max``, ``support``, ``rel_error`` (``||W − W_ws||_F/||W_ws||_F`` against the certified
    working-set answer; ``None`` for it), ``note`` (why a row was not run; the solver's rounds; sklearn's
    settings).

    sklearn runs with ``C = 10·max λ`` (the certified multipliers at the data's scale): the soft-margin
    dual's box ``λ ≤ C`` is then inactive, so its exact optimum *is* ``W_mm``, and its error is
    liblinear's own (``tol = 1e-4``).
    """
    rows: list[dict[str, Any]] = []

    def row(method: str, shape: tuple[int, int, int], **kw: Any) -> dict[str, Any]:
        n, T, d = shape
        out = {"bench": "svm_scale", "method": method, "n": n, "T": T, "d": d, "m": n * (T - 1)}
        out.update(
            {
                k: None
                for k in ("time_s", "cpu_s", "peak_mib", "certified", "error_bound", "kkt_max", "support")
            }
        )
        out.update({"rel_error": None, "note": ""})
        out.update(kw)
        return out

    def measured(r: dict[str, Any]) -> dict[str, Any]:
        keys = ("time_s", "cpu_s", "peak_mib", "certified", "error_bound", "kkt_max", "support")
        return {k: r.get(k) for k in keys}

    for shape in SVM_SCALE_SIZES[size]:
        n, T, d = shape
        m = n * (T - 1)
        ws, W_ws = _measure("working-set", shape, seed)
        rows.append(row("working-set", shape, **measured(ws), note=ws["solver"].split("(", 1)[1].rstrip(")")))

        def err(W: Any) -> float:
            return float(np.linalg.norm(W - W_ws) / np.linalg.norm(W_ws))  # noqa: B023 - called at once

        if m <= SVM_SCALE_DENSE_MAX_M[size]:
            dense, W = _measure("dense-dual", shape, seed)
            note = f"solve_svm(method='dual'), run up to m = {SVM_SCALE_DENSE_MAX_M[size]}"
            rows.append(row("dense-dual", shape, **measured(dense), rel_error=err(W), note=note))
        else:
            note = f"not run: m > {SVM_SCALE_DENSE_MAX_M[size]} (issue 16: 117 s at m=3968, 545 s at m=7936)"
            rows.append(row("dense-dual", shape, note=note))
        feature_bytes = 8 * m * d * d
        try:
            import sklearn.svm  # noqa: F401 - only whether it is there
        except ImportError:
            rows.append(row("sklearn-linearsvc", shape, note="not installed (pip install scikit-learn)"))
            continue
        if feature_bytes > SKLEARN_MAX_FEATURE_BYTES or ws["max_dual"] is None:
            why = f"features m*d^2 = {feature_bytes / 1e9:.2g} GB > {SKLEARN_MAX_FEATURE_BYTES / 2**30:g} GiB"
            rows.append(row("sklearn-linearsvc", shape, note=f"not run: {why}"))
            continue
        C = 10.0 * float(ws["max_dual"])
        sk, W = _measure("sklearn-linearsvc", shape, seed, C)
        note = f"dual=True, hinge, C=10*max(lambda)={C:.3g}, tol=1e-4, {sk['iterations']} iterations"
        rows.append(
            row(
                "sklearn-linearsvc",
                shape,
                time_s=sk["time_s"],
                cpu_s=sk["cpu_s"],
                peak_mib=sk["peak_mib"],
                rel_error=err(W),
                note=note,
            )
        )
    return rows


# ------------------------------------------------------------------------------------- GD
def memory_bandwidth(n_bytes: int = 2**28, repeat: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted) of a large NumPy float64 copy (best of ``repeat``)."""
    a = np.ones(n_bytes // 8)
    b = np.empty_like(a)
    return 2 * a.nbytes / min(_times(lambda: np.copyto(b, a), repeat))


def gemm_rate(size: int = 2048, repeat: int = 3) -> float:
    """Dense float64 GEMM rate of ``torch.matmul`` on ``size × size`` matrices, flop/s (best of ``repeat``)."""
    import torch

    x = torch.randn(size, size, dtype=torch.float64)
    y = torch.randn(size, size, dtype=torch.float64)
    torch.matmul(x, y)
    return 2.0 * size**3 / min(_times(lambda: torch.matmul(x, y), repeat))


def lean_autograd_loop(inst: Any, lr: float = 0.1) -> tuple[Callable[[], None], Any]:
    """Per-instance normalized GD with torch autograd and SGD (logistic loss), lean: ``(step, W)``.

    No module: an ``einsum`` for the logits, a stable ``softplus`` loss, the gradient divided by
    its norm, ``torch.optim.SGD``. ``W`` (a leaf tensor, ``requires_grad``) is updated in place
    by each ``step()`` call, from zeros.
    """
    require_unmasked(inst, "attnsvm.harness.bench.lean_autograd_loop")
    import torch

    X = torch.tensor(inst.X)
    Y = torch.tensor(inst.Y)
    z = torch.tensor(inst.z)
    a = X @ torch.tensor(inst.v)
    W = torch.zeros(inst.d, inst.d, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([W], lr=lr)

    def step() -> None:
        opt.zero_grad()
        logits = torch.einsum("ntd,de,ne->nt", X, W, z)
        f = (torch.softmax(logits, dim=-1) * a).sum(-1)
        loss = torch.nn.functional.softplus(-Y * f).mean()  # logistic loss, log(1 + e^{-u}) stably
        loss.backward()
        with torch.no_grad():
            assert W.grad is not None
            W.grad /= W.grad.norm()
        opt.step()

    return step, W


def published_autograd_loop(inst: Any, lr: float = 0.1) -> tuple[Callable[[], None], Any]:
    """Per-instance normalized GD written the way the seed papers' code is: ``(step, W)``.

    The public experiments of Tarzanagh et al. (github.com/ucr-optml/max_margin_attention) train
    an ``nn.Module`` whose key-query weights are bias-free ``nn.Linear`` layers, with the loss
    ``log(1 + e^{−Y f})`` averaged over the sequences, ``loss.backward()``, each parameter's
    gradient divided by ``||grad|| + 1e-12`` and ``torch.optim.SGD``. This is that structure for
    ``W`` (one ``nn.Linear``, float64, from zeros), without the per-step recording those notebooks
    also do. The ``+1e-12`` makes its steps shorter than normalized GD's by a relative
    ``1e-12/||∇L||``.
    """
    require_unmasked(inst, "attnsvm.harness.bench.published_autograd_loop")
    import torch

    class WAttention(torch.nn.Module):
        """``f_i = vᵀ X_iᵀ softmax(X_i W z_i)``, ``W`` the weight of a bias-free ``nn.Linear``."""

        def __init__(self, d: int) -> None:
            super().__init__()
            self.key_query = torch.nn.Linear(d, d, bias=False, dtype=torch.float64)
            torch.nn.init.zeros_(self.key_query.weight)

        def forward(self, X: Any, z: Any, v: Any) -> Any:
            scores = (X @ self.key_query(z).unsqueeze(-1)).squeeze(-1)  # x_itᵀ W z_i
            weights = torch.softmax(scores, dim=-1)
            return (weights.unsqueeze(1) @ X).squeeze(1) @ v

    X, Y, z, v = (torch.tensor(arr) for arr in (inst.X, inst.Y, inst.z, inst.v))
    model = WAttention(inst.d)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad()
        loss = torch.log(1 + torch.exp(-Y * model(X, z, v))).mean()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            p.grad /= p.grad.norm() + 1e-12
        opt.step()

    return step, model.key_query.weight


def _loop_rate(step: Callable[[], None], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def autograd_loop_rate(inst: Any, steps: int, lr: float = 0.1, warmup: int = 20) -> float:
    """Instance-steps/s of :func:`lean_autograd_loop` (the headline baseline)."""
    require_unmasked(inst, "attnsvm.harness.bench.autograd_loop_rate")
    return _loop_rate(lean_autograd_loop(inst, lr)[0], steps, warmup)


def published_loop_rate(inst: Any, steps: int, lr: float = 0.1, warmup: int = 20) -> float:
    """Instance-steps/s of :func:`published_autograd_loop`."""
    require_unmasked(inst, "attnsvm.harness.bench.published_loop_rate")
    return _loop_rate(published_autograd_loop(inst, lr)[0], steps, warmup)


def _r(name: str, value: Any, unit: str, note: str, rng: Sequence[float] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "range": None if rng is None else list(rng),
        "unit": unit,
        "note": note,
    }


@dataclass(frozen=True)
class _GDPlan:
    """The sizes of one :func:`bench_gd` run.

    ``batch`` instances of ``n × T × d`` (float64), ``repeat`` alternating rounds, the torch thread count
    ``threads``; per round ``loop_steps`` loop steps (after ``warmup`` ones), ``batch_steps`` batched
    steps per timing and the ``api_steps`` of the long public-API run; the probes' ``bw_bytes`` (bandwidth
    copy) and ``gemm_size`` (GEMM matrix side). ``batch`` and ``repeat`` are the size's
    (:data:`GD_SIZES`) unless given; the rest of the steps and the probes (:data:`GD_PROBES`) always are.
    """

    batch: int
    repeat: int
    n: int
    T: int
    d: int
    threads: int
    loop_steps: int
    batch_steps: int
    api_steps: int
    warmup: int
    bw_bytes: int
    gemm_size: int


@dataclass(frozen=True)
class _GDWorkloads:
    """The four timed batched workloads of a round (each a no-argument callable).

    ``fast``/``log``: ``batch_steps`` steps ``W ← W − η ∇̂L(W)`` (``η = 0.1``) of the fast and the
    log-domain engine from the same random ``W``; ``engine_run``: the fast engine's ``step_`` over
    ``api_steps`` steps from ``W = 0`` (the trajectory the long API run takes); ``api_run``:
    ``run_gd_batch(insts, api_steps, 0.1)`` with its default records.
    """

    fast: Callable[[], None]
    log: Callable[[], None]
    engine_run: Callable[[], None]
    api_run: Callable[[], None]


@dataclass(frozen=True)
class _GDRounds:
    """Per-round figures in seconds per step, one entry per round: ``loops`` (lean autograd loop,
    one instance), ``fasts`` and ``logs`` (one batched step, best of 3 timings), ``pubs`` (the
    ``nn.Module`` loop), ``engs`` and ``apis`` (the long engine and API runs, one timing each)."""

    loops: list[float]
    pubs: list[float]
    fasts: list[float]
    logs: list[float]
    engs: list[float]
    apis: list[float]


@dataclass(frozen=True)
class _GDMedians:
    """The medians of :class:`_GDRounds` (``t_* = median``, seconds per step) and the per-round ratios as
    ``(median, min, max)`` (:func:`median_ratio`): ``ratio = batch·loop/fast``, ``ratio_pub =
    batch·pub/fast``, ``ratio_log = batch·loop/log``, ``log_over_fast = log/fast``, ``api_over_step =
    api/eng``."""

    ratio: tuple[float, float, float]
    ratio_pub: tuple[float, float, float]
    ratio_log: tuple[float, float, float]
    log_over_fast: tuple[float, float, float]
    api_over_step: tuple[float, float, float]
    t_loop: float
    t_pub: float
    t_step: float
    t_log: float
    t_eng_long: float
    t_api_long: float


@dataclass(frozen=True)
class _GDCosts:
    """Figures measured once after the rounds: ``t_setup`` (``BatchEngine.from_instances``, best of 3,
    seconds), ``t_api`` (``run_gd_batch`` over ``batch_steps`` steps and one record, set-up included,
    seconds per step), the copy bandwidth ``bw`` (bytes/s) and the GEMM rate ``gemm`` (flop/s)."""

    t_setup: float
    t_api: float
    bw: float
    gemm: float


@dataclass(frozen=True)
class _GDMeasured:
    """Everything :func:`_gd_measure` timed: the ``rounds``, their ``medians`` and the one-off ``costs``."""

    rounds: _GDRounds
    medians: _GDMedians
    costs: _GDCosts


def _gd_plan(
    quick: bool, tiny: bool, batch: int | None, repeat: int | None, n: int, T: int, d: int, threads: int
) -> _GDPlan:
    """The :class:`_GDPlan` of size ``tiny`` / ``quick`` / ``full`` (the first that applies)."""
    size = "tiny" if tiny else "quick" if quick else "full"
    cfg = GD_SIZES[size]
    bw_bytes, gemm_size = GD_PROBES[size]
    return _GDPlan(
        batch=cfg["batch"] if batch is None else batch,
        repeat=cfg["repeat"] if repeat is None else repeat,
        n=n,
        T=T,
        d=d,
        threads=threads,
        loop_steps=cfg["loop_steps"],
        batch_steps=cfg["batch_steps"],
        api_steps=cfg["api_steps"],
        warmup=cfg["warmup"],
        bw_bytes=bw_bytes,
        gemm_size=gemm_size,
    )


def _gd_workloads(insts: list[Any], plan: _GDPlan) -> _GDWorkloads:
    """The fast and log-domain engines (logistic loss, CPU) on ``insts``, a random start
    ``W ~ N(0, 1)/d`` (seed 0) and the four workloads of :class:`_GDWorkloads` over them."""
    import torch

    from ..gd import BatchEngine, run_gd_batch

    batch, d, batch_steps, api_steps = plan.batch, plan.d, plan.batch_steps, plan.api_steps
    eng = BatchEngine.from_instances(insts, loss="logistic", device="cpu")
    eng_log = BatchEngine.from_instances(insts, loss="logistic", device="cpu", path="log")
    W = torch.as_tensor(np.random.default_rng(0).standard_normal((batch, d, d)) / d)

    def steps_of(e: Any) -> Callable[[], None]:
        # the loop of run_gd_batch: gradient, then one fused in-place update per step
        Wc = W.clone()

        def f() -> None:
            Wc.copy_(W)
            for _ in range(batch_steps):
                e.step_(Wc, 0.1)

        return f

    def engine_run() -> None:
        # the engine's own steps over the trajectory the long API run takes (from W = 0, same lr)
        Wz = torch.zeros((batch, d, d), dtype=torch.float64)
        for _ in range(api_steps):
            eng.step_(Wz, 0.1)

    def api_run() -> None:
        run_gd_batch(insts, api_steps, 0.1)  # what users call: default records (25 points)

    return _GDWorkloads(fast=steps_of(eng), log=steps_of(eng_log), engine_run=engine_run, api_run=api_run)


def _gd_rounds(insts: list[Any], work: _GDWorkloads, plan: _GDPlan) -> _GDRounds:
    """One warm-up call of ``fast``, ``log`` and ``api_run``, then ``repeat`` alternating rounds, each:
    lean loop, fast step, ``nn.Module`` loop, log-domain step, long engine run, long API run (seconds
    per step; a loop's is ``1 / rate`` on ``insts[0]``, a batched step's the best of 3 over ``batch_steps``)."""
    batch_steps, api_steps = plan.batch_steps, plan.api_steps
    work.fast()  # warm-up
    work.log()
    work.api_run()
    loops, pubs, fasts, logs, engs, apis = [], [], [], [], [], []
    for _ in range(plan.repeat):  # alternating rounds: a load burst hits both sides of a round
        loops.append(1.0 / autograd_loop_rate(insts[0], plan.loop_steps, warmup=plan.warmup))
        fasts.append(min(_times(work.fast, 3)) / batch_steps)
        pubs.append(1.0 / published_loop_rate(insts[0], plan.loop_steps, warmup=plan.warmup))
        logs.append(min(_times(work.log, 3)) / batch_steps)
        engs.append(_times(work.engine_run, 1)[0] / api_steps)
        apis.append(_times(work.api_run, 1)[0] / api_steps)
    return _GDRounds(loops=loops, pubs=pubs, fasts=fasts, logs=logs, engs=engs, apis=apis)


def _gd_medians(r: _GDRounds, batch: int) -> _GDMedians:
    """The medians and per-round ratios of :class:`_GDMedians` (``ValueError`` with no rounds)."""
    ratio = median_ratio(r.loops, r.fasts, scale=batch)
    ratio_pub = median_ratio(r.pubs, r.fasts, scale=batch)
    ratio_log = median_ratio(r.loops, r.logs, scale=batch)
    log_over_fast = median_ratio(r.logs, r.fasts)
    api_over_step = median_ratio(r.apis, r.engs)
    t_loop, t_pub, t_step, t_log = (float(np.median(a)) for a in (r.loops, r.pubs, r.fasts, r.logs))
    return _GDMedians(
        ratio=ratio,
        ratio_pub=ratio_pub,
        ratio_log=ratio_log,
        log_over_fast=log_over_fast,
        api_over_step=api_over_step,
        t_loop=t_loop,
        t_pub=t_pub,
        t_step=t_step,
        t_log=t_log,
        t_eng_long=float(np.median(r.engs)),
        t_api_long=float(np.median(r.apis)),
    )


def _gd_costs(insts: list[Any], plan: _GDPlan) -> _GDCosts:
    """The one-off figures of :class:`_GDCosts`, in that order."""
    from ..gd import BatchEngine, run_gd_batch

    batch_steps = plan.batch_steps
    t_setup = min(_times(lambda: BatchEngine.from_instances(insts), 3))  # stacking, checks, constants
    # the public entry point, end to end (stacking, transfers, one record at the end)
    t0 = time.perf_counter()
    run_gd_batch(insts, batch_steps, 0.1, record_at=[batch_steps])
    t_api = (time.perf_counter() - t0) / batch_steps
    return _GDCosts(
        t_setup=t_setup, t_api=t_api, bw=memory_bandwidth(plan.bw_bytes), gemm=gemm_rate(plan.gemm_size)
    )


def _gd_measure(plan: _GDPlan) -> _GDMeasured:
    """With torch's thread count set to ``plan.threads`` (restored afterwards, also on error): the
    ``batch`` instances ``random_instance(n, T, d, seed=s)``, ``s = 0 … batch − 1``, their workloads,
    the rounds, their medians and ratios, then the one-off costs."""
    import torch

    from ..model._instance import random_instance

    old_threads = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        insts = [random_instance(plan.n, plan.T, plan.d, seed=s) for s in range(plan.batch)]
        work = _gd_workloads(insts, plan)
        rounds = _gd_rounds(insts, work, plan)
        medians = _gd_medians(rounds, plan.batch)
        costs = _gd_costs(insts, plan)
    finally:
        torch.set_num_threads(old_threads)
    return _GDMeasured(rounds=rounds, medians=medians, costs=costs)


def _gd_context_rows(plan: _GDPlan, load0: float | None) -> list[dict[str, Any]]:
    """Rows ``load_avg_start`` (``load0``), ``load_avg_end`` (read now), ``threads``, ``batch``, ``rounds``."""
    n, T, d = plan.n, plan.T, plan.d
    return [
        _r("load_avg_start", load0, "", f"1-min load average on {os.cpu_count()} cores, before"),
        _r("load_avg_end", _load(), "", "after; load shares the CPU and the figures"),
        _r("threads", plan.threads, "", "torch.set_num_threads, both engines"),
        _r("batch", plan.batch, "instances", f"n={n}, T={T}, d={d}, float64"),
        _r("rounds", plan.repeat, "", "loop and batched measured alternately; medians and ranges"),
    ]


def _gd_step_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows of the loops' and the batched step's times and rates (ms = 10³·s, rates = 1/t or batch/t) and
    ``log_over_fast``; ranges over the rounds."""
    r, md, batch = m.rounds, m.medians, plan.batch
    ms = (1e3 * min(r.loops), 1e3 * max(r.loops))
    return [
        _r("loop_rate", 1.0 / md.t_loop, "instance-steps/s", "autograd + SGD, one instance"),
        _r("batch", batch, "instances", "instances per batched step"),
        _r("loop_step_ms", 1e3 * md.t_loop, "ms", "per-instance step", ms),
        _r(
            "published_loop_step_ms",
            1e3 * md.t_pub,
            "ms",
            "nn.Module loop written as the seed papers' code",
            (1e3 * min(r.pubs), 1e3 * max(r.pubs)),
        ),
        _r("batched_rate", batch / md.t_step, "instance-steps/s", "closed-form batched step (fast path)"),
        _r(
            "batched_step_ms",
            1e3 * md.t_step,
            "ms",
            f"one step of {batch} instances",
            (1e3 * min(r.fasts), 1e3 * max(r.fasts)),
        ),
        _r(
            "log_step_ms",
            1e3 * md.t_log,
            "ms",
            "same step, log-domain path forced (saturated regime)",
            (1e3 * min(r.logs), 1e3 * max(r.logs)),
        ),
        _r(
            "log_over_fast",
            md.log_over_fast[0],
            "x",
            "log-domain step / fast step, median per-round ratio; target <= 1.25 at batch 4096",
            md.log_over_fast[1:],
        ),
    ]


def _gd_api_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows of the public entry point: ``api_step_ms``, ``api_setup_ms``, the long runs' per-step times
    and their ratio ``api_over_step``."""
    r, md, c = m.rounds, m.medians, m.costs
    batch_steps, api_steps = plan.batch_steps, plan.api_steps
    return [
        _r(
            "api_step_ms",
            1e3 * c.t_api,
            "ms",
            f"run_gd_batch end to end, {batch_steps} steps and one record, per step (one run; set-up included)",
        ),
        _r(
            "api_setup_ms",
            1e3 * c.t_setup,
            "ms",
            "BatchEngine.from_instances: stacking, checks, constant data",
        ),
        _r(
            "engine_long_step_ms",
            1e3 * md.t_eng_long,
            "ms",
            f"the engine's step_ over {api_steps} steps from W = 0 (the API run's trajectory)",
            (1e3 * min(r.engs), 1e3 * max(r.engs)),
        ),
        _r(
            "api_long_step_ms",
            1e3 * md.t_api_long,
            "ms",
            f"run_gd_batch end to end, {api_steps} steps, its default records (up to 25), per step",
            (1e3 * min(r.apis), 1e3 * max(r.apis)),
        ),
        _r(
            "api_over_step",
            md.api_over_step[0],
            "x",
            f"api_long / engine_long, median per-round ratio ({api_steps} steps); target <= 1.2 at batch 4096",
            md.api_over_step[1:],
        ),
    ]


def _gd_ratio_rows(md: _GDMedians) -> list[dict[str, Any]]:
    """Rows of the headline ratios (batched over loop, per round): ``ratio``, ``ratio_published``,
    ``ratio_log_path``."""
    return [
        _r(
            "ratio",
            md.ratio[0],
            "x",
            "median per-round ratio; targets >= 200 (issue 4), >= 400 (issue 16)",
            md.ratio[1:],
        ),
        _r("ratio_published", md.ratio_pub[0], "x", "against the nn.Module loop", md.ratio_pub[1:]),
        _r(
            "ratio_log_path",
            md.ratio_log[0],
            "x",
            "median per-round ratio, log-domain path; target >= 400 at batch 4096",
            md.ratio_log[1:],
        ),
    ]


def _gd_machine_rows(plan: _GDPlan, m: _GDMeasured) -> list[dict[str, Any]]:
    """Rows against the machine: the bandwidth floor ``2·(8·batch·n·T·d)/bw`` (``X`` streamed twice per
    step) and the step's useful flops ``batch·(4·n·d² + 4·n·T·d)`` against the GEMM rate."""
    batch, n, T, d = plan.batch, plan.n, plan.T, plan.d
    t_step, t_log, bw, gemm = m.medians.t_step, m.medians.t_log, m.costs.bw, m.costs.gemm
    floor = 2 * (8 * batch * n * T * d) / bw  # X: batch·n·T·d doubles, streamed twice per step
    flops = batch * (2 * n * d * d + 2 * n * T * d + 2 * n * T * d + 2 * n * d * d)
    return [
        _r("bandwidth", bw / 1e9, "GB/s", "large numpy copy, read+write"),
        _r("floor_step_ms", 1e3 * floor, "ms", "2 * X.nbytes / bandwidth"),
        _r("step_over_floor", t_step / floor, "x", "1 = at the bandwidth floor"),
        _r("log_step_over_floor", t_log / floor, "x", "log-domain step / bandwidth floor"),
        _r("gemm_rate", gemm / 1e9, "GFLOP/s", "torch.matmul float64"),
        _r("step_gflops", flops / t_step / 1e9, "GFLOP/s", "useful flops of the step"),
        _r("gemm_fraction", flops / t_step / gemm, "", "step flop rate / GEMM rate"),
        _r("log_gemm_fraction", flops / t_log / gemm, "", "log-domain step flop rate / GEMM rate"),
    ]


def bench_gd(
    quick: bool = False,
    batch: int | None = None,
    n: int = 6,
    T: int = 8,
    d: int = 10,
    threads: int = 2,
    tiny: bool = False,
    repeat: int | None = None,
) -> list[dict[str, Any]]:
    """Batched GD step against the per-instance autograd loop, alternating rounds; one row per figure.

    Rows: ``{"name", "value", "range", "unit", "note"}``; ``range`` is ``[min, max]`` over the
    rounds for the medians, else ``None``. ``batch`` and ``repeat`` default to the size's
    (4096 and 5 rounds full; 512 and 3 quick; 16 and 2 tiny). The torch thread count is set to
    ``threads`` for both engines and restored afterwards.
    """
    plan = _gd_plan(quick, tiny, batch, repeat, n, T, d, threads)
    load0 = _load()
    m = _gd_measure(plan)
    return (
        _gd_context_rows(plan, load0)
        + _gd_step_rows(plan, m)
        + _gd_api_rows(plan, m)
        + _gd_ratio_rows(m.medians)
        + _gd_machine_rows(plan, m)
    )


# --------------------------------------------------------------------------- formatting
def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _grid(head: Sequence[str], body: Sequence[Sequence[str]], left: Sequence[int] = ()) -> str:
    """Plain aligned table; the columns numbered in ``left`` left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(head), *(line(b) for b in body)])


def svm_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of :func:`bench_svm`'s rows, with the issue's targets when measured."""
    cols = (
        "method",
        "d",
        "time_s",
        "solver_time_s",
        "time_over_dual",
        "raw_rel_error",
        "rel_error",
        "certified",
    )
    head = ["method", "d", "time [s]", "range [s]", "solver [s]", "x dual", "raw err", "final err", "cert."]
    body = []
    for r in sorted(rows, key=lambda r: (r["d"], r["method"])):
        cells = [_fmt(r[c]) for c in cols]
        lo, hi = r["time_range_s"]
        cells.insert(3, f"{lo:.3g}..{hi:.3g}" if r["runs"] > 1 else "1 run")
        body.append(cells)
    out = [f"Att-SVM solvers, n={N}, T={T} (m={N * (T - 1)} constraints)", _grid(head, body, left=(0,))]
    out += [_target_line(t) for t in targets({"svm": list(rows)})]
    return "\n".join(out)


def svm_scale_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of :func:`bench_svm_scale`'s rows, with the issue's targets when measured."""
    head = [
        "method",
        "m",
        "n,T,d",
        "time [s]",
        "cpu [s]",
        "peak [MiB]",
        "cert.",
        "error bound",
        "KKT",
        "support",
        "err vs WS",
        "note",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r["method"],
                str(r["m"]),
                f"{r['n']},{r['T']},{r['d']}",
                *(
                    _fmt(r[k])
                    for k in ("time_s", "cpu_s", "peak_mib", "certified", "error_bound", "kkt_max", "support")
                ),
                _fmt(r.get("rel_error")),
                r["note"],
            ]
        )
    out = [
        "Att-SVM at scale (gaussian instances): working set vs dense dual vs sklearn LinearSVC",
        _grid(head, body, left=(0, 2, 11)),
    ]
    out += [_target_line(t) for t in targets({"svm_scale": list(rows)})]
    return "\n".join(out)


#: The performance targets the benchmarks are held to, each measured only at its own size:
#: (group, name, what, comparison, threshold).
TARGETS = (
    ("svm", "dual_d1024_time_s", "dual Att-SVM at d=1024, median time [s]", "<=", 0.1),
    ("svm", "primal_over_dual_d128", "primal/dual time ratio at d=128", ">=", 50.0),
    ("gd", "batched_over_loop_b4096", "batched GD over the autograd loop at batch 4096", ">=", 200.0),
    (
        "gd",
        "both_paths_over_loop_b4096",
        "both paths over the autograd loop at batch 4096, the smaller ratio (issue 16)",
        ">=",
        400.0,
    ),
    ("gd", "log_over_fast_b4096", "log-domain step / fast step at batch 4096", "<=", 1.25),
    (
        "gd",
        "api_over_step_b4096",
        "run_gd_batch end to end / the engine's step at batch 4096 (long run)",
        "<=",
        1.2,
    ),
    (
        "svm",
        "ws_m7936_time_s",
        "certified working-set Att-SVM at m=7936 (n=256, T=32, d=128), time [s]",
        "<=",
        10.0,
    ),
    (
        "svm",
        "ws_m31744_time_s",
        "certified working-set Att-SVM at m=31744 (n=1024, T=32, d=128), time [s]",
        "<=",
        60.0,
    ),
    (
        "svm",
        "ws_m31744_peak_gib",
        "working-set Att-SVM at m=31744, peak memory (resident-set growth) [GiB]",
        "<=",
        4.0,
    ),
)


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The :data:`TARGETS` measured in ``doc`` (``{"svm": rows, "svm_scale": rows, "gd": rows}``, any may be absent):
    ``{"name", "what", "target", "value", "met"}`` for each target whose size was run."""
    values: dict[str, float] = {}
    for r in doc.get("svm", []):
        if r["method"] == "dual" and r["d"] == 1024:
            values["dual_d1024_time_s"] = r["time_s"]
        if r["method"] == "primal" and r["d"] == 128 and r.get("time_over_dual") is not None:
            values["primal_over_dual_d128"] = r["time_over_dual"]
    for r in doc.get("svm_scale", []):
        if (
            r["method"] == "working-set"
            and r["time_s"] is not None
            and (r["n"], r["T"], r["d"])
            in (
                (256, 32, 128),
                (1024, 32, 128),
            )
        ):
            # a time counts only for a certified answer: an uncertified one misses the target
            values[f"ws_m{r['m']}_time_s"] = r["time_s"] if r["certified"] else float("inf")
            if r["m"] == 31744:
                values["ws_m31744_peak_gib"] = r["peak_mib"] / 1024
    gd = {r["name"]: r["value"] for r in doc.get("gd", [])}
    if gd.get("batch") == 4096:
        for target, row in (
            ("batched_over_loop_b4096", "ratio"),
            ("log_over_fast_b4096", "log_over_fast"),
            ("api_over_step_b4096", "api_over_step"),
        ):
            if gd.get(row) is not None:
                values[target] = gd[row]
        if gd.get("ratio") is not None and gd.get("ratio_log_path") is not None:
            values["both_paths_over_loop_b4096"] = min(gd["ratio"], gd["ratio_log_path"])
    out = []
    for _group, name, what, op, threshold in TARGETS:
        if name in values:
            v = float(values[name])
            met = v <= threshold if op == "<=" else v >= threshold
            out.append({"name": name, "what": what, "target": f"{op} {threshold:g}", "value": v, "met": met})
    return out


def _target_line(t: dict[str, Any]) -> str:
    return f"target {t['what']} {t['target']}: {t['value']:.3g} — {'met' if t['met'] else 'MISSED'}"


def gd_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of :func:`bench_gd`'s rows."""
    body = []
    for r in rows:
        rng = "" if r["range"] is None else f"{r['range'][0]:.3g}..{r['range'][1]:.3g}"
        body.append([r["name"], _fmt(r["value"]), rng, r["unit"], r["note"]])
    title = "Batched GD engine against a per-instance autograd loop (normalized GD)"
    lines = [title, _grid(["name", "value", "range", "unit", "note"], body, left=(0, 3, 4))]
    lines += [_target_line(t) for t in targets({"gd": list(rows)})]
    return "\n".join(lines)


def _env_line(env: dict[str, Any]) -> str:
    return "environment: " + ", ".join(f"{k}={_fmt(v)}" for k, v in env.items())


# ---------------------------------------------------------------------------------- both
def run_benchmarks(
    quick: bool = False, only: str | None = None, echo: bool = True, tiny: bool = False
) -> dict[str, Any]:
    """Run the ``svm`` and ``gd`` groups (or ``only`` one), print tables, return the results.

    ``tiny`` (for the test suite) runs toy sizes whose numbers mean nothing.

    Returns ``{"quick", "tiny", "environment", "load_avg_end", "svm": [rows], "svm_scale": [rows],
    "gd": [rows]}`` (``svm_scale``: :func:`bench_svm_scale`, run with the ``svm`` group).
    """
    doc: dict[str, Any] = {"quick": quick, "tiny": tiny, "environment": environment()}
    if echo:
        print(_env_line(doc["environment"]), flush=True)
    if only in (None, "svm"):
        doc["svm"] = bench_svm(quick=quick, tiny=tiny)
        if echo:
            print(svm_table(doc["svm"]), flush=True)
        doc["svm_scale"] = bench_svm_scale("tiny" if tiny else "quick" if quick else "full")
        if echo:
            print(svm_scale_table(doc["svm_scale"]), flush=True)
    if only in (None, "gd"):
        doc["gd"] = bench_gd(quick=quick, tiny=tiny)
        if echo:
            print(gd_table(doc["gd"]), flush=True)
    doc["load_avg_end"] = _load()
    doc["targets"] = targets(doc)
    return doc


def script_main(group: str, argv: list[str] | None = None, description: str | None = None) -> int:
    """Command-line entry point of ``benchmarks/bench_{svm,gd}.py``: one group, as a table or JSON."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    if group == "svm":
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--repeats", type=int, default=5, help="dual timings (median)")
        p.add_argument(
            "--scale",
            choices=("none", "quick", "full"),
            default="none",
            help="also the working-set scale rows (full: m up to 31744, about two minutes)",
        )
    else:
        p.add_argument("--batch", type=int, default=None, help="default 4096 (512 with --quick)")
        p.add_argument("--threads", type=int, default=2)
        p.add_argument(
            "--repeat", type=int, default=None, help="alternating rounds (default 5; 3 with --quick)"
        )
    args = p.parse_args(argv)
    env = environment()
    scale_rows: list[dict[str, Any]] = []
    if group == "svm":
        rows = bench_svm(quick=args.quick, seed=args.seed, repeats=args.repeats)
        if args.scale != "none":
            scale_rows = bench_svm_scale(args.scale, seed=args.seed)
    else:
        rows = bench_gd(quick=args.quick, batch=args.batch, threads=args.threads, repeat=args.repeat)
    if args.json:
        print(json.dumps({"environment": env, "rows": rows, "scale_rows": scale_rows}, indent=1))
    else:
        print(_env_line(env))
        print(svm_table(rows) if group == "svm" else gd_table(rows))
        if scale_rows:
            print(svm_scale_table(scale_rows))
    return 0
