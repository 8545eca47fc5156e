"""``reproduce`` experiment ``convergence``: Convergence in direction to Att-SVM.

Normalized GD (lr 0.1) and plain GD (lr 1), for each loss, on unit-norm instances; at each recorded step
the gap ``1 − corr(W(t), W_mm(α(t)))`` (computed as ``½||Ŵ − Ŵ_mm||²``, no cancellation) between the
iterate and the Att-SVM solution of its own currently selected tokens ``α(t) = argmax_t s_it``, against
steps and against ``||W||_F``; the log-log rate is fitted on the last :data:`RATE_FIT_FRACTION` of the
record points.

Claims ``converges/<loss>/<mode>`` (findings at size ``tiny``): normalized GD's median gap falls ≥ 10×
over the fitted second half with a negative slope against ``||W||`` (the theorem: gap → 0 as
``||W|| → ∞``); plain GD, whose ``||W||`` grows only logarithmically, needs only to decrease.
References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Tarzanagh, Li, Thrampoulidis, Oymak,
arXiv 2308.16898 (rates).

Structure: :func:`compute_convergence` → :class:`ConvergenceResult` → :func:`check_convergence`,
:func:`figures_convergence`, :func:`tables_convergence` → :func:`convergence_experiment`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model._instance import Instance, random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import (
    FloatArray,
    Int64Array,
    _fmt,
    _quantiles,
    _SVMCache,
    check_severity,
    experiment_result,
    segmented_batch,
    tokens_text,
)

__all__ = [
    "CONVERGENCE_SIZES",
    "CONVERGENCE_LR",
    "CONVERGENCE_MODES",
    "RATE_FIT_FRACTION",
    "ConvergenceRun",
    "ConvergenceRate",
    "ConvergenceResult",
    "compute_convergence",
    "check_convergence",
    "tables_convergence",
    "numbers_convergence",
    "figures_convergence",
    "convergence_experiment",
]


# =============================================================== sizes and constants
#: Per size: the instance shape ``(n, T, d)`` and instance family, the number of seeds, the recorded steps
#: ``marks`` and the losses.
CONVERGENCE_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "shape": (3, 4, 5),
        "family": "unit",
        "seeds": 4,
        "marks": [5, 20, 50, 100],
        "losses": ["logistic"],
    },
    "small": {
        "shape": (6, 8, 10),
        "family": "unit",
        "seeds": 32,
        "marks": [1, 3, 10, 30, 60, 100, 200, 400, 700, 1000],
        "losses": ["logistic", "exponential", "correlation"],
    },
    "paper": {
        "shape": (6, 8, 10),
        "family": "unit",
        "seeds": 100,
        "marks": [1, 3, 10, 30, 60, 100, 200, 400, 700, 1000, 1400, 2000],
        "losses": ["logistic", "exponential", "correlation"],
    },
}


#: Step sizes: normalized GD at the published lr 0.1; plain GD at lr 1 (its ||W|| grows only
#: logarithmically in t, so a smaller step shows nothing in a few thousand steps).
CONVERGENCE_LR = {"normalized": 0.1, "plain": 1.0}


#: The rate is fitted on the last half of the record points (after the selected tokens settle).
RATE_FIT_FRACTION = 0.5


#: The GD variants, in the order they run: ``(mode, normalized)``.
CONVERGENCE_MODES = (("normalized", True), ("plain", False))


def _halfway(marks: tuple[int, ...] | list[int]) -> int:
    """Index of the first record point of the rate fit (the last :data:`RATE_FIT_FRACTION` of them)."""
    return int(len(marks) * (1 - RATE_FIT_FRACTION))


# =============================================================== typed results
@dataclass(frozen=True)
class ConvergenceRun:
    """One batch of ``B`` runs of one ``loss`` and ``mode`` (``normalized`` GD or plain) at step size
    ``lr``: at each recorded step of ``steps`` (``M`` of them), the ``gaps`` ``(M, B)`` to
    ``W_mm(α(t))`` (NaN where Att-SVM(α(t)) is infeasible or ``W = 0``), the ``norms`` ``||W(t)||_F``
    ``(M, B)`` and the selected ``tokens`` ``α(t)`` ``(M, B, n)``."""

    loss: str
    mode: str
    normalized: bool
    lr: float
    steps: tuple[int, ...]
    gaps: FloatArray
    norms: FloatArray
    tokens: Int64Array


@dataclass(frozen=True)
class ConvergenceRate:
    """The rate of one :class:`ConvergenceRun` (the row of table ``rates``): ``loss``, ``mode``,
    ``lr``, the last step ``steps``; the median and the max over the seeds of the final gap, the median
    final ``||W||``; the log-log slopes and ``R²`` of the median gap against steps and against the median
    ``||W||`` over the last :data:`RATE_FIT_FRACTION` of the records (NaN with fewer than 3 positive
    gaps); the median gap at the first fitted record (``median_gap_halfway``) and the number of runs
    whose final Att-SVM is infeasible."""

    loss: str
    mode: str
    lr: float
    steps: int
    median_final_gap: float
    max_final_gap: float
    median_final_norm: float
    slope_vs_steps: float
    r2_vs_steps: float
    slope_vs_norm: float
    r2_vs_norm: float
    median_gap_halfway: float
    runs_infeasible_final: int

    @property
    def shrink(self) -> float:
        """How many times the median gap fell over the fitted second half (``inf`` if it reached 0)."""
        final = self.median_final_gap
        return self.median_gap_halfway / final if final > 0 else math.inf


@dataclass(frozen=True)
class ConvergenceResult:
    """The instance ``shape`` ``(n, T, d)``, the instance ``seeds`` (``B``), the recorded steps ``marks``,
    the ``runs`` (one :class:`ConvergenceRun` per (loss, mode), loss-major, modes in
    :data:`CONVERGENCE_MODES` order) with their ``rates`` (same order), the number of distinct Att-SVM
    problems solved (``svm_solves``) and how many of them were infeasible."""

    shape: tuple[int, int, int]
    seeds: tuple[int, ...]
    marks: tuple[int, ...]
    runs: tuple[ConvergenceRun, ...]
    rates: tuple[ConvergenceRate, ...]
    svm_solves: int
    infeasible_token_choices_seen: int


# =============================================================== compute
def _one_batch(
    insts: list[Instance],
    svm: _SVMCache,
    loss: str,
    mode: str,
    normalized: bool,
    marks: list[int],
    *,
    device: str,
    on_mark: Callable[[int], None],
) -> ConvergenceRun:
    """GD on every instance (:func:`segmented_batch`, ``on_mark`` at each mark) and its gaps."""
    from ...gd import direction_gap

    traj = segmented_batch(insts, marks, CONVERGENCE_LR[mode], normalized, loss, device, on_mark)
    B = len(insts)
    gaps = np.full((len(marks), B), np.nan)
    norms = np.zeros((len(marks), B))
    for k, (_, W, toks) in enumerate(traj):
        for b in range(B):
            norms[k, b] = float(np.linalg.norm(W[b]))
            ref = svm.get(b, toks[b])
            if ref is not None and norms[k, b] > 0:
                gaps[k, b] = direction_gap(W[b], ref)
    return ConvergenceRun(
        loss=loss,
        mode=mode,
        normalized=normalized,
        lr=CONVERGENCE_LR[mode],
        steps=tuple(step for step, _, _ in traj),
        gaps=gaps,
        norms=norms,
        tokens=np.stack([toks for _, _, toks in traj]),
    )


def _rate(run: ConvergenceRun, marks: list[int]) -> ConvergenceRate:
    """Fit the log-log rate of the median gap over the last :data:`RATE_FIT_FRACTION` of the records."""
    from ...gd import fit_rate

    med, _, _ = _quantiles(run.gaps, axis=1)
    med_norm = np.median(run.norms, axis=1)
    k0 = _halfway(marks)
    xs, ys, ns = np.array(marks[k0:], float), np.array(med[k0:]), med_norm[k0:]
    ok = np.isfinite(ys) & (ys > 0)
    rs = fit_rate(xs[ok], ys[ok]) if ok.sum() >= 3 else None
    rn = fit_rate(ns[ok], ys[ok]) if ok.sum() >= 3 else None
    final = run.gaps[-1]
    return ConvergenceRate(
        loss=run.loss,
        mode=run.mode,
        lr=run.lr,
        steps=marks[-1],
        median_final_gap=float(np.nanmedian(final)) if np.any(np.isfinite(final)) else math.nan,
        max_final_gap=float(np.nanmax(final)) if np.any(np.isfinite(final)) else math.nan,
        median_final_norm=float(med_norm[-1]),
        slope_vs_steps=rs.slope if rs else math.nan,
        r2_vs_steps=rs.r2 if rs else math.nan,
        slope_vs_norm=rn.slope if rn else math.nan,
        r2_vs_norm=rn.r2 if rn else math.nan,
        median_gap_halfway=float(med[k0]),
        runs_infeasible_final=int(np.sum(~np.isfinite(final))),
    )


def compute_convergence(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> ConvergenceResult:
    """Every (loss, mode) batch of :data:`CONVERGENCE_SIZES` [size] on the instances of seeds
    ``seed + b``, and its rate."""
    cfg = CONVERGENCE_SIZES[size]
    n, T, d = cfg["shape"]
    B = cfg["seeds"]
    insts = [random_instance(n, T, d, seed=seed + b, family=cfg["family"]) for b in range(B)]
    svm = _SVMCache(insts)
    marks = list(cfg["marks"])
    total = len(cfg["losses"]) * len(CONVERGENCE_MODES) * len(marks)
    done = 0

    def tick(_: int) -> None:
        nonlocal done
        done += 1
        progress(done, total)

    runs = [
        _one_batch(insts, svm, loss, mode, normalized, marks, device=device, on_mark=tick)
        for loss in cfg["losses"]
        for mode, normalized in CONVERGENCE_MODES
    ]
    return ConvergenceResult(
        shape=(n, T, d),
        seeds=tuple(seed + b for b in range(B)),
        marks=tuple(marks),
        runs=tuple(runs),
        rates=tuple(_rate(run, marks) for run in runs),
        svm_solves=len(svm.cache),
        infeasible_token_choices_seen=svm.infeasible,
    )


# =============================================================== checks
def check_convergence(result: ConvergenceResult, *, size: str) -> list[ExperimentClaim]:
    """``converges/<loss>/<mode>`` per rate (findings at size tiny): normalized GD's median gap falls
    ≥ 10× over the fitted second half with a negative slope against ``||W||``; plain GD's falls (> 1×)
    with a negative slope."""
    # Normalized GD: the gap must shrink (the theorem: gap → 0 as ||W|| → ∞); we check that the
    # median gap fell by 10× between the halfway record and the end and that the fitted log-log slope
    # against ||W|| is negative. Plain GD moves ||W|| only logarithmically, so for it we only require
    # that the gap decreases.
    marks = result.marks
    claims = []
    for r in result.rates:
        shrink = r.shrink
        if r.mode == "normalized":
            passed = bool(shrink >= 10 and r.slope_vs_norm < 0)
            need = "fell ≥ 10× over the second half with a negative slope"
        else:
            passed = bool(shrink > 1 and r.slope_vs_norm < 0)
            need = "decreased over the second half"
        claims.append(
            ExperimentClaim(
                name=f"converges/{r.loss}/{r.mode}",
                statement=f"{r.mode} GD with {r.loss} loss converges in direction to W_mm(α(t)): "
                f"the median gap {need}",
                passed=passed,
                message=f"median gap {_fmt(r.median_gap_halfway)} at step {marks[_halfway(marks)]} → "
                f"{_fmt(r.median_final_gap)} at step {marks[-1]} ({_fmt(shrink)}×); slope vs ||W|| "
                f"{_fmt(r.slope_vs_norm)} (R² {_fmt(r.r2_vs_norm)}), vs steps {_fmt(r.slope_vs_steps)}",
                severity=check_severity(size),
            )
        )
    return claims


# =============================================================== tables, numbers, figures
def tables_convergence(result: ConvergenceResult) -> dict[str, list[dict[str, Any]]]:
    """``runs``: one row per (loss, mode, step, seed); ``rates``: one per (loss, mode)."""
    rows = [
        {
            "loss": run.loss,
            "mode": run.mode,
            "seed": sd,
            "step": step,
            "norm_W": run.norms[k, b],
            "gap": run.gaps[k, b],
            "tokens": tokens_text(run.tokens[k, b]),
        }
        for run in result.runs
        for k, step in enumerate(run.steps)
        for b, sd in enumerate(result.seeds)
    ]
    return {"runs": rows, "rates": [dict(vars(r)) for r in result.rates]}


def numbers_convergence(result: ConvergenceResult) -> dict[str, Any]:
    """The SVM solve counts, and each (loss, mode)'s median final gap and slope against ``||W||``."""
    out: dict[str, Any] = {
        "svm_solves": result.svm_solves,
        "infeasible_token_choices_seen": result.infeasible_token_choices_seen,
    }
    for r in result.rates:
        out[f"{r.loss}/{r.mode}/median_final_gap"] = r.median_final_gap
        out[f"{r.loss}/{r.mode}/slope_vs_norm"] = r.slope_vs_norm
    return out


def _loss_panels(result: ConvergenceResult, loss: str) -> tuple[Panel, Panel]:
    """The panels of one loss: the gap against steps (with the claim's criterion) and against ``||W||``."""
    marks: list[Any] = list(result.marks)  # the steps, ints (as the tables give them)
    ser_steps, ser_norm = [], []
    for run in (r for r in result.runs if r.loss == loss):
        med, lo, hi = _quantiles(run.gaps, axis=1)
        med_norm = np.median(run.norms, axis=1)
        style = "-o" if run.normalized else "--s"
        ser_steps.append(Series(f"{run.mode} GD (lr {run.lr:g})", marks, med, lo=lo, hi=hi, style=style))
        ser_norm.append(Series(f"{run.mode} GD", med_norm.tolist(), med, lo=lo, hi=hi, style=style))
    shrinks = {r.mode: r.shrink for r in result.rates if r.loss == loss}
    ylabel = "1 − corr(W(t), W_mm(α(t)))"
    steps = Panel(
        f"{loss} loss",
        "step t",
        ylabel,
        ser_steps,
        xlog=True,
        ylog=True,
        note=f"claim: from step {marks[_halfway(marks)]} to {marks[-1]} the median gap falls\n"
        f"≥ 10× (normalized; measured {_fmt(shrinks['normalized'])}×) and falls "
        f"(plain; {_fmt(shrinks['plain'])}×)",
    )
    return steps, Panel(f"{loss} loss", "||W(t)||_F", ylabel, ser_norm, xlog=True, ylog=True)


def figures_convergence(result: ConvergenceResult) -> list[Figure]:
    """``steps`` and ``norm``: the median gap and band against steps and against ``||W||``, per loss."""
    n, T, d = result.shape
    B = len(result.seeds)
    losses = list(dict.fromkeys(r.loss for r in result.runs))
    panels = [_loss_panels(result, loss) for loss in losses]
    what = f"unit-norm n={n}, T={T}, d={d}; median and 10–90% band over {B} seeds"
    return [
        Figure(
            "steps",
            f"Direction gap to Att-SVM against steps: {what}",
            [p for p, _ in panels],
            caption="Each run is compared with the Att-SVM of its own currently selected tokens α(t).",
        ),
        Figure(
            "norm",
            f"Direction gap to Att-SVM against ||W||_F: {what}",
            [p for _, p in panels],
            caption="x: the median ||W|| over the seeds at each recorded step.",
        ),
    ]


# =============================================================== the experiment
@register_experiment(
    "convergence",
    "Convergence in direction to Att-SVM",
    "Gap 1 − corr(W(t), W_mm(α(t))) (computed as ½||Ŵ − Ŵ_mm||², no cancellation) between the GD "
    "iterate and the Att-SVM solution of its own currently selected tokens α(t) = argmax_t s_it, "
    "against steps and against ||W||_F; median and 10–90% band over seeds; normalized GD (lr 0.1) "
    "and plain GD (lr 1) for each loss; unit-norm data. The log-log rate is fitted on the last half "
    "of the record points.",
    order=20,
)
def convergence_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Direction gap of GD to ``W_mm(α(t))`` against steps and ``||W||``."""
    result = compute_convergence(size, seed, device=device, progress=progress)
    return experiment_result(
        "convergence",
        config={**CONVERGENCE_SIZES[size], "lr": CONVERGENCE_LR},
        tables=tables_convergence(result),
        numbers=numbers_convergence(result),
        claims=check_convergence(result, size=size),
        figures=figures_convergence(result),
    )
