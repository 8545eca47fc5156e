"""Helpers shared by several ``reproduce`` experiments: summaries, formatting, cached SVM solutions.

An experiment module is laid out as: its size table and named constants; its typed results (frozen
dataclasses); ``compute_<name>`` (the numerics); ``check_<name>`` (the claims, a pure function of the
typed result); ``figures_<name>`` (and ``tables_<name>``/``numbers_<name>``); and the registered experiment
function that wires them into a :class:`~attnsvm.harness.experiments.ExperimentResult` with
:func:`experiment_result`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._types import FloatArray, Int64Array
from ...model._instance import Instance
from ...scaling import EPS
from ..results import ExperimentClaim, ExperimentResult, Figure
from ..runner import EXPERIMENT_REGISTRY

__all__ = [
    "EPS",
    "SVM_AGREE_RTOL",
    "FloatArray",
    "Int64Array",
    "segmented_batch",
    "experiment_result",
    "check_severity",
    "tokens_text",
]


#: Float64 arrays of the experiments' typed results (shapes in each result class's docstring).
#: Integer arrays (token indices, steps) of the experiments' typed results.


def experiment_result(
    name: str,
    *,
    config: dict[str, Any],
    tables: dict[str, list[dict[str, Any]]],
    numbers: dict[str, Any],
    claims: list[ExperimentClaim],
    figures: list[Figure],
) -> ExperimentResult:
    """The :class:`ExperimentResult` of the registered experiment ``name`` (title and description from its
    spec)."""
    spec = EXPERIMENT_REGISTRY[name]
    return ExperimentResult(
        spec.name,
        spec.title,
        spec.description,
        numbers=numbers,
        tables=tables,
        figures=figures,
        claims=claims,
        config=config,
    )


def check_severity(size: str) -> str:
    """``"check"``, or ``"finding"`` at size ``tiny`` (too few steps or seeds to guarantee a rate)."""
    return "check" if size != "tiny" else "finding"


def tokens_text(tokens: Any) -> str:
    """Token indices as the tables print them: ``"0 3 1"``."""
    return " ".join(map(str, tokens))


def _quantiles(a: Any, axis: int = 0) -> tuple[list[float], list[float], list[float]]:
    """Median and the 10%/90% quantiles along ``axis`` (NaN-aware), as lists."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.size == 0 or np.all(np.isnan(arr)):
        nan = np.full(np.delete(arr.shape, axis), np.nan)
        return nan.tolist(), nan.tolist(), nan.tolist()
    with warnings.catch_warnings():  # columns that are all NaN (e.g. underflowed) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(arr, axis=axis)
        lo = np.nanquantile(arr, 0.1, axis=axis)
        hi = np.nanquantile(arr, 0.9, axis=axis)
    return med.tolist(), lo.tolist(), hi.tolist()


def _fmt(x: float) -> str:
    return f"{x:.3g}"


# ============================================================= shared GD/SVM helpers
def segmented_batch(
    instances: list[Instance],
    marks: Sequence[int],
    lr: float,
    normalized: bool,
    loss: str,
    device: str,
    on_mark: Callable[[int], None] | None = None,
    *,
    W0: Any | None = None,
) -> list[tuple[int, Any, Any]]:
    """Run batched GD and return ``(step, W (B,d,d), tokens (B,n))`` at each step of ``marks``.

    :func:`attnsvm.gd.run_gd_batch` is called once per segment with ``W0`` = the previous end
    point (the first from ``W0``, default 0); a GD update depends only on the current iterate, so
    this is the same trajectory. ``on_mark(k)`` is called when every instance has reached ``marks[k]``.

    Inside an experiment's Dask task (``reproduce --scheduler dask``) a batch of at least two
    :data:`attnsvm.harness.distributed.GD_CHUNK` chunks runs as Dask tasks, chunk by chunk, with bitwise
    the iterates and tokens of this serial loop (see :mod:`attnsvm.harness.distributed` for the condition);
    a local run never imports dask.
    """
    from ...gd import run_gd_batch
    from ..distributed import gd_batch_runner

    runner = gd_batch_runner(len(instances))
    if runner is not None:
        return runner(instances, marks, lr, normalized, loss, device, on_mark, W0=W0)
    out = []
    W = W0
    prev = 0
    for k, m in enumerate(marks):
        tr = run_gd_batch(
            instances,
            steps=int(m - prev),
            lr=lr,
            normalized=normalized,
            loss=loss,
            device=None if device == "cpu" else device,
            W0=W,
            record_at=[int(m - prev)],
        )
        W = tr.W
        prev = m
        out.append((int(m), np.array(W), np.array(tr.final_tokens)))
        if on_mark is not None:
            on_mark(k)
    return out


class _SVMCache:
    """``W_mm(α)`` per (instance, α), ``None`` when Att-SVM(α) is infeasible."""

    def __init__(self, instances: Sequence[Instance]) -> None:
        self.instances = instances
        self.cache: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.infeasible = 0

    def get(self, b: int, alpha: Any) -> Any:
        from ...errors import InfeasibleSVMError
        from ...svm import solve_svm

        key = (b, tuple(int(a) for a in alpha))
        if key not in self.cache:
            try:
                self.cache[key] = solve_svm(self.instances[b], alpha=np.asarray(alpha)).W
            except InfeasibleSVMError:
                self.cache[key] = None
                self.infeasible += 1
        return self.cache[key]


#: Every Frobenius method ends with the exact active-set step and is certified to this
#: relative accuracy (issue 3, svm.CERTIFY_RTOL); methods must agree with the dual to it.
SVM_AGREE_RTOL = 1e-9
