"""Benchmark of the Att-SVM solvers (cvxpy primal and vector against the factorised dual): a thin wrapper over :mod:`attnsvm.harness.bench`.

Sizes, targets and row keys are documented in :func:`attnsvm.harness.bench.bench_svm`;
``attnsvm bench --only svm`` runs the same code. On shared machines set
``OPENBLAS_NUM_THREADS=1`` (``attnsvm bench`` does): oversubscribed BLAS threads slow the small
dense factorisations by 10–100×.

With ``--scale quick|full`` it also runs the scale rows of :func:`attnsvm.harness.bench.bench_svm_scale`: the
certified working-set solver at ``m = 1984, 7936, 31744`` constraints beside the dense dual (``m ≤ 1984``)
and ``sklearn.svm.LinearSVC`` on the explicit features (``m ≤ 7936``; "not installed" without
scikit-learn); the full scale rows take about two minutes and 3.5 GB (sklearn's copy of the features).

Run: ``python benchmarks/bench_svm.py [--quick] [--seed S] [--repeats R] [--scale none|quick|full] [--json]``.
"""

from __future__ import annotations

from typing import Any

from attnsvm.harness.bench import bench_svm, script_main
from attnsvm.harness.bench import svm_table as table  # noqa: F401 - the former name of the table helper


def run(quick: bool = False, seed: int = 0, repeats: int = 5) -> list[dict[str, Any]]:
    """One dict per ``(method, d)``; see :func:`attnsvm.harness.bench.bench_svm`."""
    return bench_svm(quick=quick, seed=seed, repeats=repeats)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: the rows as a table (or JSON with ``--json``)."""
    return script_main("svm", argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
