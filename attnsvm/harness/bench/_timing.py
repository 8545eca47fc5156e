"""Timing side by side and the machine: medians and ranges of repeated runs, the load average, the environment,
the memory-bandwidth and GEMM probes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

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
