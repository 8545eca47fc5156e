"""Fusing the batched engine's per-step passes with ``torch.compile`` (CPU, inductor): a measured trial.

Issue 16 §2 asked whether fusing the passes of :class:`attnsvm.gd.BatchEngine`'s step brings it near its
memory-bandwidth floor. This script compiles the step's two contractions with ``X`` and the fast path's
whole arithmetic as plain tensor expressions (inductor generates one C++ loop nest per fused group) and
times them against the engine's own passes, in alternating rounds (median of the per-round ratios, as
``attnsvm bench``), with the compile time and the largest difference from the engine (the compiled
kernels sum in another order: rounding-level differences, nothing more). It is a measurement, not a code
path: the engine does not use ``torch.compile`` (docs/benchmarks.md, "Fusing the passes", says why).

Run: ``python benchmarks/bench_fusion.py [--batch B] [--threads K] [--rounds R] [--json]``
(about a minute, most of it compiling; the compiled code is cached by torch under ``/tmp``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np


def _logits(W: Any, Xt: Any, zT: Any) -> Any:
    """``l[t, b, i] = x_{b,i,t}ᵀ W_b z_{b,i}``: ``q = W z`` and the contraction with ``X`` in one expression."""
    q = (W.unsqueeze(-1) * zT.unsqueeze(1)).sum(2)  # (B, d, n)
    return (Xt * q.permute(1, 0, 2).unsqueeze(0)).sum(1)  # (T, B, n)


def _gradient_sum(w: Any, Xt: Any, zB: Any) -> Any:
    """``G_b = Σ_i (Σ_t w_it x_it) z_iᵀ``, shape ``(B, d, d)``."""
    y = (Xt * w.unsqueeze(1)).sum(0)  # (d, B, n)
    return (y.permute(1, 0, 2).unsqueeze(-1) * zB.unsqueeze(1)).sum(2)


def _fast_core(W: Any, Xt: Any, zT: Any, zB: Any, gamma: Any) -> tuple[Any, Any]:
    """The fast path's arithmetic for the logistic loss without ties (the common step): ``(G, ||G||)``."""
    import torch

    l = _logits(W, Xt, zT)
    E = torch.exp(l - l.amax(0))
    S = E.sum(0)
    c = (torch.floor(E) * gamma).sum(0)
    delta = gamma - c
    psi_s = (E * delta).sum(0) / S
    alpha = -torch.sigmoid(-(c + psi_s)) / S
    w = (delta * alpha - alpha * psi_s) * E
    G = _gradient_sum(w, Xt, zB)
    return G, torch.linalg.vector_norm(G.reshape(G.shape[0], -1), dim=1)


def trial(
    batch: int = 4096, threads: int = 2, rounds: int = 5, n: int = 6, T: int = 8, d: int = 10
) -> dict[str, Any]:
    """Compile the three expressions, time them against the engine's passes; one dict of figures."""
    import torch

    from attnsvm.gd import BatchEngine
    from attnsvm.model._instance import random_instance

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        insts = [random_instance(n, T, d, seed=s) for s in range(batch)]
        eng = BatchEngine.from_instances(insts)
        W = torch.as_tensor(np.random.default_rng(0).standard_normal((batch, d, d)) / d)
        w = torch.as_tensor(np.random.default_rng(1).standard_normal((T, batch, n)))
        t0 = time.perf_counter()
        c_logits = torch.compile(_logits, dynamic=False)
        c_grad = torch.compile(_gradient_sum, dynamic=False)
        c_core = torch.compile(_fast_core, dynamic=False)
        c_logits(W, eng.Xt, eng.zT)
        c_grad(w, eng.Xt, eng.zB)
        c_core(W, eng.Xt, eng.zT, eng.zB, eng.gamma)
        compile_s = time.perf_counter() - t0
        pairs = {
            "logits": (lambda: eng.logits(W), lambda: c_logits(W, eng.Xt, eng.zT)),
            "gradient_sum": (
                lambda: eng._gradient_sum(w, eng.Xt, eng.zB, eng._y),
                lambda: c_grad(w, eng.Xt, eng.zB),
            ),
            "fast_direction": (lambda: eng.gradient(W), lambda: c_core(W, eng.Xt, eng.zT, eng.zB, eng.gamma)),
        }

        def best(f: Any, k: int = 10) -> float:
            f()
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                for _ in range(k):
                    f()
                ts.append((time.perf_counter() - t) / k)
            return min(ts)

        out: dict[str, Any] = {
            "batch": batch,
            "shape": [n, T, d],
            "threads": threads,
            "rounds": rounds,
            "cpus": os.cpu_count(),
            "load_avg_start": os.getloadavg()[0],
            "torch": torch.__version__,
            "compile_s": compile_s,
        }
        for name, (eager, compiled) in pairs.items():
            te, tc = [], []
            for _ in range(rounds):
                te.append(best(eager))
                tc.append(best(compiled))
            r = [a / b for a, b in zip(te, tc, strict=True)]
            out[name] = {
                "eager_ms": 1e3 * float(np.median(te)),
                "compiled_ms": 1e3 * float(np.median(tc)),
                "speedup": float(np.median(r)),
                "speedup_range": [float(min(r)), float(max(r))],
            }
        G_e = eng.gradient(W)[0].clone()
        G_c = c_core(W, eng.Xt, eng.zT, eng.zB, eng.gamma)[0]
        out["fast_direction"]["max_rel_diff"] = float((G_c - G_e).abs().max() / G_e.abs().max())
        l_e = eng.logits(W).clone()
        out["logits"]["max_abs_diff"] = float((c_logits(W, eng.Xt, eng.zT) - l_e).abs().max())
        out["load_avg_end"] = os.getloadavg()[0]
        return out
    finally:
        torch.set_num_threads(old)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: the figures as text (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res = trial(batch=args.batch, threads=args.threads, rounds=args.rounds)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
