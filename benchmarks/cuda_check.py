"""The batched engine on a GPU: agreement with the CPU to the 1e-8 contract, and throughput at batch 65 536.

One prepared script for a machine with CUDA (issue 16 §2); until it has run there, the docs say the CUDA
path is untested. It

1. builds ``--batch`` instances ``random_instance(n, T, d, seed=s)`` (default 65 536 of 6 × 8 × 10);
2. compares, on the first ``--compare`` of them, the device's directions and ``log||∇L||`` with the
   CPU's (the fused kernel where it runs, and the eager paths) at ``W = 0``, a moderate and a saturated
   ``W`` (``||W|| ≈ 1000``), and ``run_gd_batch``'s iterates after ``--steps`` steps: each relative
   difference against the contract's ``1e-8`` (``CONTRACT``);
3. times the engine's ``step_`` on the device over the whole batch (``torch.cuda.synchronize`` around
   each timing, best of 3) and the CPU's at the same batch, and reports instance-steps per second;
4. prints the rows and writes them as JSON (``--json FILE``); exits 1 when a comparison exceeds the
   contract, 2 when the device is not available (nothing measured).

``--device cpu`` runs the same pipeline with the CPU as the "device" (the eager paths against the fused
kernel): a check of the script itself, made by the test suite on small sizes.

Run: ``python benchmarks/cuda_check.py [--device cuda] [--batch 65536] [--compare 4096] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

#: The engines' agreement contract (run_gd_batch's docstring: equal to run_gd to ~1e-8 relative).
CONTRACT = 1e-8


def _instances(count: int, n: int, T: int, d: int) -> list[Any]:
    from attnsvm.model._instance import random_instance

    return [random_instance(n, T, d, seed=s) for s in range(count)]


def _rel(a: Any, b: Any) -> float:
    """``max_b ||a_b − b_b|| / max(||b_b||, 1e-300)`` over the leading dimension (float64 numpy arrays)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = np.linalg.norm((a - b).reshape(len(a), -1), axis=1)
    ref = np.maximum(np.linalg.norm(b.reshape(len(b), -1), axis=1), 1e-300)
    return float(np.max(diff / ref))


def compare(insts: list[Any], device: str, steps: int) -> list[dict[str, Any]]:
    """Rows of the device-against-CPU comparisons (see the module docstring, item 2)."""
    import torch

    from attnsvm.gd import BatchEngine, run_gd_batch

    B, d = len(insts), insts[0].d
    rows = []
    dev_eng = BatchEngine.from_instances(insts, device=device, kernel="eager")
    cpu_engs = {
        "fused": BatchEngine.from_instances(insts),
        "eager": BatchEngine.from_instances(insts, kernel="eager"),
    }
    U = np.random.default_rng(0).standard_normal((B, d, d)) / d
    for label, W in (("W=0", np.zeros((B, d, d))), ("moderate", U), ("saturated", 1000.0 * U)):
        D_dev, ln_dev = dev_eng.direction(torch.as_tensor(W, device=device))
        D_dev, ln_dev = D_dev.cpu().numpy().copy(), ln_dev.cpu().numpy().copy()
        for name, eng in cpu_engs.items():
            D, ln = eng.direction(torch.as_tensor(W))
            err_dir = _rel(D_dev, D.numpy())
            err_log = float(np.max(np.abs(ln_dev - ln.numpy()) / np.maximum(np.abs(ln.numpy()), 1.0)))
            rows.append(_row(f"direction_{label}_vs_{name}", max(err_dir, err_log), "rel", CONTRACT))
    W_dev = run_gd_batch(insts, steps, 0.1, device=device, kernel="eager").W
    W_cpu = run_gd_batch(insts, steps, 0.1).W
    rows.append(_row(f"run_gd_batch_{steps}_steps", _rel(W_dev, W_cpu), "rel", CONTRACT))
    return rows


def throughput(insts: list[Any], device: str, steps: int) -> list[dict[str, Any]]:
    """Rows of the engine's step on the device and on the CPU over the whole batch (item 3)."""
    import torch

    from attnsvm.gd import BatchEngine

    B, d = len(insts), insts[0].d
    rows = []
    W0 = np.random.default_rng(1).standard_normal((B, d, d)) / d
    for where, eng in (
        (device, BatchEngine.from_instances(insts, device=device)),
        ("cpu", BatchEngine.from_instances(insts)),
    ):
        W = torch.as_tensor(W0, device=where)
        eng.step_(W.clone(), 0.1)  # warm-up (and the kernel's compile on the CPU)
        best = math.inf
        for _ in range(3):
            Wc = W.clone()
            if where.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                eng.step_(Wc, 0.1)
            if where.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / steps)
        rows.append(_row(f"step_ms_{where}_{eng.kernel}", 1e3 * best, "ms", None, f"batch {B}"))
        rows.append(_row(f"rate_{where}_{eng.kernel}", B / best, "instance-steps/s", None, f"batch {B}"))
    return rows


def _row(name: str, value: float, unit: str, limit: float | None, note: str = "") -> dict[str, Any]:
    ok = None if limit is None else bool(value <= limit)
    return {"name": name, "value": value, "unit": unit, "limit": limit, "ok": ok, "note": note}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--compare", type=int, default=4096, help="instances compared with the CPU")
    p.add_argument("--steps", type=int, default=20, help="GD steps compared and timed")
    p.add_argument("--shape", type=int, nargs=3, default=(6, 8, 10), metavar=("n", "T", "d"))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}): nothing measured", file=sys.stderr)
        return 2
    n, T, d = args.shape
    insts = _instances(args.batch, n, T, d)
    rows = compare(insts[: args.compare], args.device, args.steps) + throughput(
        insts, args.device, args.steps
    )
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "batch": args.batch,
        "compare": args.compare,
        "shape": [n, T, d],
    }
    for r in rows:
        flag = "" if r["ok"] is None else ("ok" if r["ok"] else "EXCEEDS")
        print(f"{r['name']:42s} {r['value']:12.4g} {r['unit']:18s} {flag} {r['note']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "rows": rows}, fh, indent=1)
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
