"""Benchmarks behind ``attnsvm bench``: Att-SVM solvers and the batched GD engine, side by side.

Two groups, each measured within one run so that the ratios compare like with like:

* ``svm`` — for ``n = 6`` sequences of ``T = 8`` tokens (``m = 42`` constraints): the matrix
  primal (cvxpy + Clarabel, ``d²`` variables), the vectorised program and the exact factorised
  dual, with the relative error of the conic solver's own answer and of the final (active-set
  polished) answer against the certified dual solution. Targets (issue 3): dual at ``d = 1024``
  in ≤ 0.1 s; ≥ 50× faster than the primal at ``d = 128``. The primal at ``d ≥ 512`` takes
  minutes and gigabytes and is never run.
* ``gd`` — instance-steps per second of :func:`attnsvm.gd.run_gd_batch`'s step against a
  per-instance torch autograd + SGD loop (normalized GD, the way published experiments run
  it), same thread count; the distance to the memory-bandwidth floor (each step streams ``X``
  at least twice) and the fraction of the machine's dense float64 GEMM rate the step reaches.
  Target (issue 4): ≥ 200× at ``B = 4096`` on 2 cores.

``--quick`` sizes take seconds; the full sizes take minutes and never run in CI.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, normalized GD);
Gao, Song, Xie, arXiv 2307.02419 (tensor trick).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SVM_FULL", "SVM_QUICK", "bench_svm", "bench_gd", "run_benchmarks"]

N, T = 6, 8
SVM_FULL = {"primal": (32, 128, 256), "vector": (32, 128), "dual": (32, 128, 256, 512, 1024)}
SVM_QUICK = {"primal": (32,), "vector": (32,), "dual": (32, 128, 1024)}
SVM_TINY = {"primal": (8,), "vector": (8,), "dual": (8, 16)}  # the test suite's size
#: Never run the cvxpy programs above this dimension (minutes, gigabytes).
MAX_CONIC_D = 256


def _best(f: Callable[[], Any], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------------------ SVM
def bench_svm(
    quick: bool = False, seed: int = 0, repeats: int = 5, tiny: bool = False
) -> list[dict[str, Any]]:
    """Time the Att-SVM methods side by side; one row per ``(method, d)``.

    Keys: ``method``, ``d``, ``time_s`` (total; best of ``repeats`` for the dual),
    ``solver_time_s`` (conic solver only), ``raw_rel_error`` (conic answer against the
    certified dual ``W``), ``rel_error`` (final answer against it), ``certified``,
    ``time_over_dual`` (method time / dual time at the same ``d``).
    """
    from .instance import random_instance
    from .svm import solve_svm

    dims = SVM_TINY if tiny else SVM_QUICK if quick else SVM_FULL
    rows: list[dict[str, Any]] = []
    for d in sorted(set(dims["dual"]) | set(dims["primal"]) | set(dims["vector"])):
        inst = random_instance(N, T, d, seed=seed + d)
        dual = solve_svm(inst, method="dual")  # warm-up and reference
        t_dual = _best(lambda: solve_svm(inst, method="dual"), repeats)  # noqa: B023 - called at once
        if d in dims["dual"]:
            rows.append(
                {
                    "method": "dual",
                    "d": d,
                    "time_s": t_dual,
                    "solver_time_s": None,
                    "raw_rel_error": None,
                    "rel_error": 0.0,
                    "certified": bool(dual.certified),
                    "time_over_dual": 1.0,
                }
            )
        for method in ("primal", "vector"):
            if d not in dims[method] or d > MAX_CONIC_D:
                continue
            t0 = time.perf_counter()
            sol = solve_svm(inst, method=method)
            elapsed = time.perf_counter() - t0
            rows.append(
                {
                    "method": method,
                    "d": d,
                    "time_s": elapsed,
                    "solver_time_s": sol.timings.get("solver"),
                    "raw_rel_error": sol.raw_rel_error,
                    "rel_error": float(np.linalg.norm(sol.W - dual.W) / np.linalg.norm(dual.W)),
                    "certified": bool(sol.certified),
                    "time_over_dual": elapsed / t_dual,
                }
            )
    return rows


# ------------------------------------------------------------------------------------- GD
def memory_bandwidth(n_bytes: int = 2**28, repeat: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted) of a large NumPy float64 copy."""
    a = np.ones(n_bytes // 8)
    b = np.empty_like(a)
    t = _best(lambda: np.copyto(b, a), repeat)
    return 2 * a.nbytes / t


def gemm_rate(size: int = 2048, repeat: int = 3) -> float:
    """Dense float64 GEMM rate of ``torch.matmul`` on ``size × size`` matrices, flop/s."""
    import torch

    x = torch.randn(size, size, dtype=torch.float64)
    y = torch.randn(size, size, dtype=torch.float64)
    torch.matmul(x, y)
    t = _best(lambda: torch.matmul(x, y), repeat)
    return 2.0 * size**3 / t


def _autograd_loop_rate(inst: Any, steps: int, lr: float = 0.1, warmup: int = 20) -> float:
    """Instance-steps/s of per-instance normalized GD with torch autograd and SGD."""
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
        loss = torch.nn.functional.softplus(-Y * f).mean()  # logistic loss
        loss.backward()
        with torch.no_grad():
            assert W.grad is not None
            W.grad /= W.grad.norm()
        opt.step()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def bench_gd(
    quick: bool = False,
    batch: int = 4096,
    n: int = 6,
    T: int = 8,
    d: int = 10,
    threads: int = 2,
    tiny: bool = False,
) -> list[dict[str, Any]]:
    """Batched GD against the per-instance autograd loop; one row per figure (``name``, ``value``, ``unit``, ``note``)."""
    import torch

    from .gd import _stack_instances, _TorchBatch, run_gd_batch
    from .instance import random_instance
    from .losses import get_loss

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if quick or tiny:
            batch = min(batch, 16 if tiny else 512)
        loop_steps = 10 if tiny else 100 if quick else 500
        batch_steps = 2 if tiny else 5 if quick else 20
        insts = [random_instance(n, T, d, seed=s) for s in range(batch)]
        loop = _autograd_loop_rate(insts[0], loop_steps, warmup=2 if tiny else 20)
        X, Y, z, v = _stack_instances(insts)
        eng = _TorchBatch(X, Y, z, v, get_loss("logistic"), torch.device("cpu"))
        W = torch.as_tensor(np.random.default_rng(0).standard_normal((batch, d, d)) / d)

        def steps_fn() -> None:
            Wc = W
            for _ in range(batch_steps):
                D, _ = eng.direction(Wc)
                Wc = Wc - 0.1 * D

        steps_fn()
        t_step = _best(steps_fn, 3) / batch_steps
        batched = batch / t_step
        t0 = time.perf_counter()
        run_gd_batch(insts, batch_steps, 0.1, record_at=[batch_steps])
        t_api = (time.perf_counter() - t0) / batch_steps
        bw = memory_bandwidth(2**20 if tiny else 2**26 if quick else 2**28)
        floor = 2 * X.nbytes / bw
        flops = batch * (2 * n * d * d + 2 * n * T * d + 2 * n * T * d + 2 * n * d * d)
        gemm = gemm_rate(128 if tiny else 1024 if quick else 2048)
    finally:
        torch.set_num_threads(old_threads)
    return [
        {"name": "threads", "value": threads, "unit": "", "note": "torch threads, both engines"},
        {"name": "batch", "value": batch, "unit": "instances", "note": f"n={n}, T={T}, d={d}, float64"},
        {"name": "loop_step_ms", "value": 1e3 / loop, "unit": "ms", "note": "autograd + SGD, one instance"},
        {
            "name": "batched_step_ms",
            "value": 1e3 * t_step,
            "unit": "ms",
            "note": f"one step of {batch} instances",
        },
        {
            "name": "api_step_ms",
            "value": 1e3 * t_api,
            "unit": "ms",
            "note": "run_gd_batch end to end, per step",
        },
        {
            "name": "ratio",
            "value": batched / loop,
            "unit": "x",
            "note": "instance-steps/s, target >= 200 at 4096",
        },
        {"name": "bandwidth", "value": bw / 1e9, "unit": "GB/s", "note": "large numpy copy, read+write"},
        {
            "name": "step_over_floor",
            "value": t_step / floor,
            "unit": "x",
            "note": "1 = at the bandwidth floor",
        },
        {"name": "gemm_rate", "value": gemm / 1e9, "unit": "GFLOP/s", "note": "torch.matmul float64"},
        {
            "name": "gemm_fraction",
            "value": flops / t_step / gemm,
            "unit": "",
            "note": "step flop rate / GEMM rate",
        },
    ]


# ---------------------------------------------------------------------------------- both
def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def run_benchmarks(
    quick: bool = False, only: str | None = None, echo: bool = True, tiny: bool = False
) -> dict[str, Any]:
    """Run the ``svm`` and ``gd`` groups (or ``only`` one), print tables, return the results.

    ``tiny`` (for the test suite) runs toy sizes whose numbers mean nothing.

    Returns ``{"quick": ..., "environment": {...}, "svm": [rows], "gd": [rows]}``.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console(quiet=not echo)
    doc: dict[str, Any] = {
        "quick": quick,
        "tiny": tiny,
        "environment": {
            "cpus": os.cpu_count(),
            "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
    }
    if only in (None, "svm"):
        rows = bench_svm(quick=quick, tiny=tiny)
        doc["svm"] = rows
        tab = Table(title=f"Att-SVM solvers, n={N}, T={T} (m={N * (T - 1)} constraints)")
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
        heads = ("method", "d", "time [s]", "solver [s]", "× dual", "raw err", "final err", "cert.")
        for h in heads:
            tab.add_column(h, justify="right", no_wrap=True)
        for r in sorted(rows, key=lambda r: (r["d"], r["method"])):
            tab.add_row(*(_fmt(r[c]) for c in cols))
        console.print(tab)
    if only in (None, "gd"):
        rows = bench_gd(quick=quick, tiny=tiny)
        doc["gd"] = rows
        tab = Table(title="Batched GD engine against a per-instance autograd loop (normalized GD)")
        for c in ("name", "value", "unit", "note"):
            tab.add_column(c)
        for r in rows:
            tab.add_row(r["name"], _fmt(r["value"]), r["unit"], r["note"])
        console.print(tab)
    return doc
