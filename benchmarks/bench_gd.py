"""Throughput of the batched GD engine against a per-instance autograd loop: a thin wrapper over :mod:`attnsvm.harness.bench`.

The methodology (alternating rounds, median per-round ratio with its range, load average before
and after, the log-domain step and its ratio to the fast step, the public entry point's overhead, bandwidth
floor, GEMM fraction, issue 16's targets) is documented in
:func:`attnsvm.harness.bench.bench_gd`; ``attnsvm bench --only gd`` runs the same code.

Run: ``python benchmarks/bench_gd.py [--quick] [--batch B] [--threads K] [--repeat R] [--json]``.
"""

from __future__ import annotations

from typing import Any

from attnsvm.harness.bench import bench_gd, script_main


def bench(
    batch: int | None = None,
    n: int = 6,
    T: int = 8,
    d: int = 10,
    threads: int = 2,
    quick: bool = False,
    repeat: int | None = None,
) -> list[dict[str, Any]]:
    """The rows (``name``, ``value``, ``range``, ``unit``, ``note``); see :func:`attnsvm.harness.bench.bench_gd`."""
    return bench_gd(quick=quick, batch=batch, n=n, T=T, d=d, threads=threads, repeat=repeat)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: the figures as a table (or JSON with ``--json``)."""
    return script_main("gd", argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main())
