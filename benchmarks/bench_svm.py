"""Benchmark of the Att-SVM solvers: cvxpy primal (and vector) against the factorised dual.

For ``n = 6`` sequences of ``T = 8`` tokens (``m = 42`` constraints) it times, side by side in one run,
the matrix primal (cvxpy + Clarabel, ``d² `` variables) at ``d = 32, 128, 256``, the vectorised program
at ``d = 32, 128`` and the exact dual at ``d = 32 … 1024``, and reports for each the relative error
of the conic solver's own answer and of the final (active-set polished) answer against the
certified dual solution. Targets (issue 3): dual at ``d = 1024`` in ≤ 0.1 s; ≥ 50× faster than the
primal at ``d = 128``. The primal at ``d ≥ 512`` takes minutes and gigabytes and is never run here.

Usage::

    python benchmarks/bench_svm.py            # full: primal up to d = 256
    python benchmarks/bench_svm.py --quick    # primal at d = 32 only, dual at 32, 128, 1024

``run(quick=...)`` returns the rows as a list of dicts (for ``attnsvm bench``).
On shared machines set ``OPENBLAS_NUM_THREADS=1``: oversubscribed BLAS threads slow the small dense
factorisations by 10–100×.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

import attnsvm as A
from attnsvm.svm import solve_svm

N, T = 6, 8
FULL = {"primal": (32, 128, 256), "vector": (32, 128), "dual": (32, 128, 256, 512, 1024)}
QUICK = {"primal": (32,), "vector": (32,), "dual": (32, 128, 1024)}
#: Never run the cvxpy programs above this dimension automatically (minutes, gigabytes).
MAX_CONIC_D = 256


def _time_dual(inst: A.Instance, repeats: int) -> tuple[float, Any]:
    """Best-of-``repeats`` wall time of the dual (after one warm-up call)."""
    sol = solve_svm(inst, method="dual")
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        sol = solve_svm(inst, method="dual")
        best = min(best, time.perf_counter() - t0)
    return float(best), sol


def run(quick: bool = False, seed: int = 0, repeats: int = 5) -> list[dict[str, Any]]:
    """Run the benchmark and return one dict per (method, d).

    Keys: ``bench``, ``method``, ``n``, ``T``, ``d``, ``time_s`` (total), ``solver_time_s`` (conic solver
    only), ``raw_rel_error`` (conic answer vs the certified dual ``W``; ``None`` for the dual),
    ``rel_error`` (final answer vs the certified dual ``W``), ``certified``, ``error_bound``,
    ``speedup_vs_dual`` (method time / dual time at the same d).
    """
    dims = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    ref: dict[int, tuple[float, Any]] = {}
    for d in sorted(set(dims["dual"]) | set(dims["primal"]) | set(dims["vector"])):
        inst = A.random_instance(N, T, d, seed=seed + d)
        ref[d] = _time_dual(inst, repeats)
        t_dual, dual = ref[d]
        if d in dims["dual"]:
            rows.append(
                dict(
                    bench="svm",
                    method="dual",
                    n=N,
                    T=T,
                    d=d,
                    time_s=t_dual,
                    solver_time_s=None,
                    raw_rel_error=None,
                    rel_error=0.0,
                    certified=dual.certified,
                    error_bound=dual.error_bound,
                    speedup_vs_dual=1.0,
                )
            )
        for method in ("primal", "vector"):
            if d not in dims[method] or d > MAX_CONIC_D:
                continue
            t0 = time.perf_counter()
            sol = solve_svm(inst, method=method)
            elapsed = time.perf_counter() - t0
            rows.append(
                dict(
                    bench="svm",
                    method=method,
                    n=N,
                    T=T,
                    d=d,
                    time_s=elapsed,
                    solver_time_s=sol.timings["solver"],
                    raw_rel_error=sol.raw_rel_error,
                    rel_error=float(np.linalg.norm(sol.W - dual.W) / np.linalg.norm(dual.W)),
                    certified=sol.certified,
                    error_bound=sol.error_bound,
                    speedup_vs_dual=elapsed / t_dual,
                )
            )
    return rows


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`run`'s rows."""
    cols = [
        "method",
        "d",
        "time_s",
        "solver_time_s",
        "speedup_vs_dual",
        "raw_rel_error",
        "rel_error",
        "certified",
    ]
    head = ["method", "d", "time [s]", "solver [s]", "time / dual", "raw err", "final err", "certified"]
    body = [[_fmt(r[c]) for c in cols] for r in sorted(rows, key=lambda r: (r["d"], r["method"]))]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, seed=args.seed)
    print(
        f"Att-SVM solvers, n={N}, T={T} (m={N * (T - 1)}), OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    )
    print(table(rows))
    dual_1024 = [r for r in rows if r["method"] == "dual" and r["d"] == 1024]
    if dual_1024:
        print(f"target dual d=1024 <= 0.1 s: {dual_1024[0]['time_s']:.3g} s")
    p128 = [r for r in rows if r["method"] == "primal" and r["d"] == 128]
    if p128:
        print(f"target primal/dual at d=128 >= 50x: {p128[0]['speedup_vs_dual']:.3g}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
