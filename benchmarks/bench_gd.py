"""Throughput of the batched GD engine against a per-instance autograd loop, measured in one run.

What is measured (all float64, same torch thread count for both engines):

* ``loop``: the way published experiments run GD: torch SGD on one instance, the loss through
  autograd, the gradient divided by its norm before ``opt.step()`` (normalized GD), one
  instance at a time. Reported in instance-steps per second.
* ``batched``: :func:`attnsvm.gd.run_gd_batch`'s step (closed-form log-domain direction and the
  update) on ``B`` instances at once.
* ``ratio``: batched / loop instance-steps per second (target ≥ 200 at ``B = 4096`` on 2 cores).
* ``bandwidth floor``: each step must stream ``X`` at least twice (logits and gradient); the
  floor is ``2 · X.nbytes / bandwidth`` with the bandwidth of a large NumPy copy (read + write).
* ``GEMM fraction``: the step's useful flops (``2nd² + 2nTd`` for the logits,
  ``2nTd + 2nd²`` for the gradient, per instance) per second over the machine's dense float64
  ``torch.matmul`` rate on large matrices.

Run: ``python benchmarks/bench_gd.py [--quick] [--batch B] [--threads K] [--repeat R] [--json]``.

References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (normalized GD).
"""

from __future__ import annotations

import os

# Before torch loads: OpenMP workers that spin while waiting (the default) take the CPU from the
# main thread on a shared, oversubscribed machine, and both engines then run several times
# slower and erratically at 2 threads (measured: loop 0.2 → 2.3 ms/step at load 5). Passive
# waiting measures the engines, not the spin policy; an explicit setting in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import math
import time
from typing import Any

import numpy as np
import torch

import attnsvm as A
from attnsvm.gd import _stack_instances, _TorchBatch, run_gd_batch
from attnsvm.losses import get_loss


def _best(f: Any, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bandwidth(n_bytes: int = 2**28, repeat: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted) of a large NumPy float64 copy."""
    a = np.ones(n_bytes // 8)
    b = np.empty_like(a)
    t = _best(lambda: np.copyto(b, a), repeat)
    return 2 * a.nbytes / t


def gemm_rate(size: int = 2048, repeat: int = 3) -> float:
    """Dense float64 GEMM rate of ``torch.matmul`` on ``size × size`` matrices, flop/s."""
    x = torch.randn(size, size, dtype=torch.float64)
    y = torch.randn(size, size, dtype=torch.float64)
    torch.matmul(x, y)
    t = _best(lambda: torch.matmul(x, y), repeat)
    return 2.0 * size**3 / t


def autograd_loop_rate(inst: A.Instance, steps: int, lr: float = 0.1) -> float:
    """Instance-steps/s of per-instance normalized GD with torch autograd and SGD."""
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

    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def _r(name: str, value: Any, unit: str, note: str) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "note": note}


def bench(
    batch: int = 4096,
    n: int = 6,
    T: int = 8,
    d: int = 10,
    threads: int = 2,
    quick: bool = False,
    repeat: int = 5,
) -> list[dict[str, Any]]:
    """Run the benchmark; returns one dict per figure (``name``, ``value``, ``unit``, ``note``).

    The loop and the batched step are measured alternately ``repeat`` times in one process (each
    batched figure is the best of 3 runs of ``batch_steps`` steps; each loop figure one run of
    ``loop_steps`` steps); the ratio reported is the median of the per-round ratios, so a load
    burst on a shared machine hits both sides of a round.
    """
    load0 = os.getloadavg()[0]
    torch.set_num_threads(threads)
    if quick:
        batch = min(batch, 512)
        repeat = min(repeat, 3)
    loop_steps = 100 if quick else 500
    batch_steps = 5 if quick else 20
    insts = [A.random_instance(n, T, d, seed=s) for s in range(batch)]

    X, Y, z, v = _stack_instances(insts)
    lo = get_loss("logistic")
    eng = _TorchBatch(X, Y, z, v, lo, torch.device("cpu"))
    eng_log = _TorchBatch(X, Y, z, v, lo, torch.device("cpu"), fast=False)
    W = torch.as_tensor(np.random.default_rng(0).standard_normal((batch, d, d)) / d)

    def steps_of(e: Any) -> Any:
        def f() -> None:
            Wc = W
            for _ in range(batch_steps):
                D, _ = e.direction(Wc)
                Wc = Wc - 0.1 * D

        return f

    fast_fn, log_fn = steps_of(eng), steps_of(eng_log)
    fast_fn()
    log_fn()
    loops, fasts, logs = [], [], []
    for _ in range(repeat):
        loops.append(1.0 / autograd_loop_rate(insts[0], loop_steps))
        fasts.append(_best(fast_fn, 3) / batch_steps)
        logs.append(_best(log_fn, 3) / batch_steps)
    ratios = [batch * lp / t for lp, t in zip(loops, fasts, strict=True)]
    ratios_log = [batch * lp / t for lp, t in zip(loops, logs, strict=True)]
    t_loop, t_step, t_log = (float(np.median(a)) for a in (loops, fasts, logs))
    batched = batch / t_step
    # the public entry point, end to end (stacking, transfers, one record at the end)
    t0 = time.perf_counter()
    run_gd_batch(insts, batch_steps, 0.1, record_at=[batch_steps])
    t_api = (time.perf_counter() - t0) / batch_steps

    bw = memory_bandwidth(2**26 if quick else 2**28)
    floor = 2 * X.nbytes / bw
    flops = batch * (2 * n * d * d + 2 * n * T * d + 2 * n * T * d + 2 * n * d * d)
    gemm = gemm_rate(1024 if quick else 2048)
    load1 = os.getloadavg()[0]
    out = [
        _r(
            "load_avg",
            f"{load0:.1f} -> {load1:.1f}",
            "",
            f"1-min load at start and end on {os.cpu_count()} cores: share the CPU, share the figures",
        ),
        _r("threads", threads, "", "torch.set_num_threads, both engines"),
        _r("batch", batch, "instances", f"n={n}, T={T}, d={d}, float64"),
        _r("rounds", repeat, "", "loop and batched measured alternately; medians below"),
        _r("loop_rate", 1.0 / t_loop, "instance-steps/s", "autograd + SGD, one instance"),
        _r("loop_step_ms", 1e3 * t_loop, "ms", "per-instance step"),
        _r("batched_rate", batched, "instance-steps/s", "closed-form batched step (fast path)"),
        _r("batched_step_ms", 1e3 * t_step, "ms", f"one step of {batch} instances"),
        _r("log_step_ms", 1e3 * t_log, "ms", "same step, log-domain path forced (saturated regime)"),
        _r("api_step_ms", 1e3 * t_api, "ms", "run_gd_batch end to end, per step"),
        _r("ratio", float(np.median(ratios)), "x", "median per-round ratio; target >= 200 at batch 4096"),
        _r("ratio_range", f"{min(ratios):.0f}..{max(ratios):.0f}", "x", "per-round ratios"),
        _r("ratio_log_path", float(np.median(ratios_log)), "x", "median ratio with the log-domain path"),
        _r("bandwidth", bw / 1e9, "GB/s", "large numpy copy, read+write"),
        _r("floor_step_ms", 1e3 * floor, "ms", "2 * X.nbytes / bandwidth"),
        _r("step_over_floor", t_step / floor, "x", "1 = at the bandwidth floor"),
        _r("gemm_rate", gemm / 1e9, "GFLOP/s", "torch.matmul float64"),
        _r("step_gflops", flops / t_step / 1e9, "GFLOP/s", "useful flops of the step"),
        _r("gemm_fraction", flops / t_step / gemm, "", "step rate / GEMM rate"),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: print the figures as a table (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="small batch and few steps (seconds)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="alternating measurement rounds (median)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res = bench(batch=args.batch, threads=args.threads, quick=args.quick, repeat=args.repeat)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for r in res:
            val = r["value"]
            sval = f"{val:.4g}" if isinstance(val, float) else str(val)
            print(f"{r['name']:>16}  {sval:>12} {r['unit']:<17} {r['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
