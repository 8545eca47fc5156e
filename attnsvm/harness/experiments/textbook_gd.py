"""``reproduce`` experiment ``textbook_gd``: Normalized GD: stable gradient against the textbook formula.

Normalized GD (lr 0.1, logistic loss, from ``W = 0``) on Gaussian 4×6×8 instances, once with the
package's log-domain direction and once with the textbook gradient ``vᵀx_it − f_i`` divided by its norm;
at each recorded step, the gap ``1 − corr(W(t), W_mm(α(t)))`` to the Att-SVM solution of the currently
selected tokens ``α(t) = argmax_t s_it``. The textbook run stops when its gradient underflows to 0.

Claims (findings at size ``tiny``): ``stable-keeps-converging`` (the median gap of the log-domain run
falls over the last three records) and finding ``textbook-loses-direction`` (the textbook run ends
further from Att-SVM, or stopped on underflow). References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596.

Structure: :func:`compute_textbook_gd` → :class:`TextbookGDResult` → :func:`check_textbook_gd`,
:func:`figures_textbook_gd`, :func:`tables_textbook_gd` → :func:`textbook_gd_experiment`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model._grad import risk_grad_textbook
from ...model._instance import Instance, random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import FloatArray, Int64Array, _fmt, _quantiles, _SVMCache, check_severity, experiment_result

__all__ = [
    "TEXTBOOK_GD_SIZES",
    "TEXTBOOK_GD_LR",
    "TextbookGDResult",
    "TextbookGDSummary",
    "compute_textbook_gd",
    "summarise_textbook_gd",
    "check_textbook_gd",
    "tables_textbook_gd",
    "numbers_textbook_gd",
    "figures_textbook_gd",
    "textbook_gd_experiment",
]


# ================================================================ sizes and constants
#: Per size: the instance shape ``(n, T, d)``, the number of seeds and the recorded steps ``marks``.
TEXTBOOK_GD_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"shape": (4, 6, 8), "seeds": 1, "marks": [10, 100, 300]},
    "small": {"shape": (4, 6, 8), "seeds": 6, "marks": [10, 30, 100, 200, 400, 700, 1000, 1500, 2000]},
    "paper": {
        "shape": (4, 6, 8),
        "seeds": 20,
        "marks": [10, 30, 100, 200, 400, 700, 1000, 2000, 5000, 10000],
    },
}

#: The step size of both runs: the published normalized-GD lr (arXiv 2306.13596).
TEXTBOOK_GD_LR = 0.1


# ================================================================ typed results
@dataclass(frozen=True)
class TextbookGDResult:
    """The instance ``shape`` ``(n, T, d)``, the instance ``seeds`` (``S`` of them), the recorded steps
    ``marks`` (``M``); the gaps ``1 − corr(W(t), W_mm(α(t)))`` of the log-domain run (``stable_gap``) and
    of the textbook run (``textbook_gap``), both ``(S, M)``, NaN where Att-SVM(α(t)) is infeasible or the
    textbook run had stopped; ``textbook_stopped_at`` ``(S,)``: the step at which the textbook gradient
    underflowed to 0 (0: it never did)."""

    shape: tuple[int, int, int]
    seeds: tuple[int, ...]
    marks: tuple[int, ...]
    stable_gap: FloatArray
    textbook_gap: FloatArray
    textbook_stopped_at: Int64Array


@dataclass(frozen=True)
class TextbookGDSummary:
    """Median and 10–90 % band over the seeds of each run's gap at each mark (``stable_*``,
    ``textbook_*``, length ``M``), the final and best medians, and how many textbook runs stopped."""

    stable_median: list[float]
    stable_lo: list[float]
    stable_hi: list[float]
    textbook_median: list[float]
    textbook_lo: list[float]
    textbook_hi: list[float]
    median_final_gap_stable: float
    median_final_gap_textbook: float
    best_median_gap_textbook: float
    textbook_runs_stopped: int


# ================================================================ compute
def _textbook_run(inst: Instance, b: int, marks: list[int], svm: _SVMCache) -> tuple[FloatArray, int]:
    """Normalized GD with ``−∇L_textbook / ||∇L_textbook||``: its gaps at ``marks`` and the step at
    which its gradient underflowed (0: never)."""
    from ...gd import direction_gap

    gaps = np.full(len(marks), np.nan)
    W = np.zeros((inst.d, inst.d))
    k = 0
    for t in range(1, marks[-1] + 1):
        g = risk_grad_textbook(inst, W)
        gn = float(np.linalg.norm(g))
        if not (gn > 0 and np.isfinite(gn)):
            return gaps, t
        W = W - TEXTBOOK_GD_LR * g / gn
        if t == marks[k]:
            ref = svm.get(b, np.argmax(np.einsum("ntd,nd->nt", inst.X, inst.z @ W.T), axis=1))
            if ref is not None:
                gaps[k] = direction_gap(W, ref)
            k += 1
    return gaps, 0


def _stable_run(inst: Instance, b: int, marks: list[int], svm: _SVMCache) -> FloatArray:
    """Normalized GD with the package's log-domain direction: its gaps at ``marks``."""
    from ...gd import direction_gap, run_gd

    tr = run_gd(inst, steps=marks[-1], lr=TEXTBOOK_GD_LR, record_at=marks, keep_iterates=True)
    by_step = {r.step: r for r in tr.record}
    gaps = np.full(len(marks), np.nan)
    for k, m in enumerate(marks):
        rec = by_step[m]
        ref = svm.get(b, rec.tokens)
        if ref is not None and rec.W is not None:
            gaps[k] = direction_gap(rec.W, ref)
    return gaps


def compute_textbook_gd(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> TextbookGDResult:
    """Both runs on the Gaussian instances of seeds ``seed + s`` of :data:`TEXTBOOK_GD_SIZES` [size]."""
    cfg = TEXTBOOK_GD_SIZES[size]
    n, T, d = cfg["shape"]
    marks = list(cfg["marks"])
    insts = [random_instance(n, T, d, seed=seed + s) for s in range(cfg["seeds"])]
    svm = _SVMCache(insts)
    stable = np.full((len(insts), len(marks)), np.nan)
    textbook = np.full((len(insts), len(marks)), np.nan)
    stopped = np.zeros(len(insts), dtype=np.int64)
    for b, inst in enumerate(insts):
        stable[b] = _stable_run(inst, b, marks, svm)
        textbook[b], stopped[b] = _textbook_run(inst, b, marks, svm)
        progress(b + 1, len(insts))
    return TextbookGDResult(
        shape=(n, T, d),
        seeds=tuple(seed + b for b in range(len(insts))),
        marks=tuple(marks),
        stable_gap=stable,
        textbook_gap=textbook,
        textbook_stopped_at=stopped,
    )


# ================================================================ checks
def summarise_textbook_gd(result: TextbookGDResult) -> TextbookGDSummary:
    """The medians and bands over the seeds, and the final and best medians."""
    stable, textbook = result.stable_gap, result.textbook_gap
    ms, ls, hs = _quantiles(stable, axis=0)
    mt, lt, ht = _quantiles(textbook, axis=0)
    last_t = textbook[:, -1]
    return TextbookGDSummary(
        stable_median=ms,
        stable_lo=ls,
        stable_hi=hs,
        textbook_median=mt,
        textbook_lo=lt,
        textbook_hi=ht,
        median_final_gap_stable=float(np.nanmedian(stable[:, -1])),
        median_final_gap_textbook=float(np.nanmedian(last_t)) if np.any(np.isfinite(last_t)) else math.nan,
        best_median_gap_textbook=float(np.nanmin(np.nanmedian(textbook, axis=0)))
        if np.any(np.isfinite(textbook))
        else math.nan,
        textbook_runs_stopped=int(sum(1 for s in result.textbook_stopped_at if s)),
    )


def check_textbook_gd(result: TextbookGDResult, *, size: str) -> list[ExperimentClaim]:
    """``stable-keeps-converging`` (the median gap falls between each of the last three records; a
    finding at size tiny) and finding ``textbook-loses-direction`` (the textbook run's final median gap
    exceeds the stable one's, or is NaN: every textbook run stopped or ended infeasible)."""
    s = summarise_textbook_gd(result)
    fs, ft = s.median_final_gap_stable, s.median_final_gap_textbook
    return [
        ExperimentClaim(
            name="stable-keeps-converging",
            statement="with the log-domain direction the gap keeps shrinking to the last step",
            passed=bool(np.all(np.diff(np.array(s.stable_median)[-3:]) < 0)),
            message="median gaps at the last three records: "
            + ", ".join(_fmt(x) for x in s.stable_median[-3:]),
            severity=check_severity(size),
        ),
        ExperimentClaim(
            name="textbook-loses-direction",
            statement="with the textbook gradient the direction stops improving (expected: corr about 0.54 "
            "at step 1000)",
            passed=bool(not np.isfinite(ft) or ft > fs),
            message=f"final median gap: stable {_fmt(fs)}, textbook {_fmt(ft)} (best textbook median "
            f"{_fmt(s.best_median_gap_textbook)}; {s.textbook_runs_stopped} runs stopped on underflow)",
            severity="finding",
        ),
    ]


# ================================================================ tables, numbers, figures
def tables_textbook_gd(result: TextbookGDResult) -> dict[str, list[dict[str, Any]]]:
    """``gaps``: one row per (seed, mark) with both gaps and the textbook run's stopping step."""
    rows = [
        {
            "seed": sd,
            "step": m,
            "stable_gap": result.stable_gap[b, k],
            "textbook_gap": result.textbook_gap[b, k],
            "textbook_stopped_at": int(result.textbook_stopped_at[b]),
        }
        for b, sd in enumerate(result.seeds)
        for k, m in enumerate(result.marks)
    ]
    return {"gaps": rows}


def numbers_textbook_gd(result: TextbookGDResult) -> dict[str, Any]:
    """The final and best medians and the number of textbook runs that stopped on underflow."""
    s = summarise_textbook_gd(result)
    return {
        "median_final_gap_stable": s.median_final_gap_stable,
        "median_final_gap_textbook": s.median_final_gap_textbook,
        "best_median_gap_textbook": s.best_median_gap_textbook,
        "textbook_runs_stopped": s.textbook_runs_stopped,
    }


def figures_textbook_gd(result: TextbookGDResult) -> list[Figure]:
    """``gap``: both runs' median gap and band against the step."""
    n, T, d = result.shape
    s = summarise_textbook_gd(result)
    marks: list[Any] = list(result.marks)  # the steps, ints (as the tables give them)
    panel = Panel(
        "lr 0.1; median and 10–90% band over the seeds",
        "step t",
        "1 − corr(W(t), W_mm(α(t)))",
        [
            Series("log-domain direction (attnsvm)", marks, s.stable_median, lo=s.stable_lo, hi=s.stable_hi),
            Series(
                "textbook gradient / its norm",
                marks,
                s.textbook_median,
                lo=s.textbook_lo,
                hi=s.textbook_hi,
                style="--s",
            ),
        ],
        xlog=True,
        ylog=True,
    )
    return [
        Figure(
            "gap",
            "Normalized GD, stable vs textbook gradient: Gaussian "
            f"n={n}, T={T}, d={d}; {len(result.seeds)} seed(s)",
            [panel],
            caption="Missing textbook points: its gradient underflowed to 0 and the run stopped.",
        )
    ]


# ================================================================ the experiment
@register_experiment(
    "textbook_gd",
    "Normalized GD: stable gradient against the textbook formula",
    "Normalized GD (lr 0.1, logistic loss, from W = 0) on Gaussian 4×6×8 instances, once with the "
    "package's log-domain direction and once with the textbook gradient `vᵀx_it − f_i` divided by "
    "its norm; gap to W_mm(α(t)) of the currently selected tokens. The textbook run stops when its "
    "gradient underflows to 0 (its direction is then 0/0).",
    order=15,
)
def textbook_gd_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Direction gap of normalized GD with the stable and with the textbook gradient."""
    result = compute_textbook_gd(size, seed, device=device, progress=progress)
    return experiment_result(
        "textbook_gd",
        config=dict(TEXTBOOK_GD_SIZES[size]),
        tables=tables_textbook_gd(result),
        numbers=numbers_textbook_gd(result),
        claims=check_textbook_gd(result, size=size),
        figures=figures_textbook_gd(result),
    )
