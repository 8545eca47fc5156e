"""Running the groups side by side (``attnsvm bench``) and the ``benchmarks/bench_*.py`` scripts' entry point."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._gd import bench_gd
from ._svm import bench_svm, bench_svm_scale
from ._tables import _env_line, gd_table, svm_scale_table, svm_table, targets
from ._timing import _load, environment


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
