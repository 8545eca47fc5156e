"""``reproduce`` family ``convergence``: Convergence in direction to Att-SVM."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...model._instance import random_instance
from ..experiments import FAMILY_REGISTRY, FamilyResult, Figure, Panel, ProgressFn, Series, register_family
from ._common import _fmt, _quantiles, _shrink, _SVMCache, segmented_batch

__all__ = ["CONVERGENCE_SIZES", "CONVERGENCE_LR", "RATE_FIT_FRACTION", "convergence_family"]


# =============================================================== family: convergence
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


@register_family(
    "convergence",
    "Convergence in direction to Att-SVM",
    "Gap 1 − corr(W(t), W_mm(α(t))) (computed as ½||Ŵ − Ŵ_mm||², no cancellation) between the GD "
    "iterate and the Att-SVM solution of its own currently selected tokens α(t) = argmax_t s_it, "
    "against steps and against ||W||_F; median and 10–90% band over seeds; normalized GD (lr 0.1) "
    "and plain GD (lr 1) for each loss; unit-norm data. The log-log rate is fitted on the last half "
    "of the record points.",
    order=20,
)
def convergence_family(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> FamilyResult:
    """Direction gap of GD to ``W_mm(α(t))`` against steps and ``||W||``."""
    from ...gd._engine import direction_gap, fit_rate

    cfg = CONVERGENCE_SIZES[size]
    spec = FAMILY_REGISTRY["convergence"]
    res = FamilyResult(spec.name, spec.title, spec.description, config={**cfg, "lr": CONVERGENCE_LR})
    n, T, d = cfg["shape"]
    B = cfg["seeds"]
    insts = [random_instance(n, T, d, seed=seed + b, family=cfg["family"]) for b in range(B)]
    svm = _SVMCache(insts)
    marks = list(cfg["marks"])
    modes = [("normalized", True), ("plain", False)]
    total = len(cfg["losses"]) * len(modes) * len(marks)
    done = 0
    rows: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    panels_steps: list[Panel] = []
    panels_norm: list[Panel] = []
    for loss in cfg["losses"]:
        ser_steps, ser_norm = [], []
        for mode, normalized in modes:

            def tick(_: int) -> None:
                nonlocal done
                done += 1
                progress(done, total)

            traj = segmented_batch(insts, marks, CONVERGENCE_LR[mode], normalized, loss, device, tick)
            gaps = np.full((len(marks), B), np.nan)
            norms = np.zeros((len(marks), B))
            for k, (step, W, toks) in enumerate(traj):
                for b in range(B):
                    norms[k, b] = float(np.linalg.norm(W[b]))
                    ref = svm.get(b, toks[b])
                    if ref is not None and norms[k, b] > 0:
                        gaps[k, b] = direction_gap(W[b], ref)
                    rows.append(
                        {
                            "loss": loss,
                            "mode": mode,
                            "seed": seed + b,
                            "step": step,
                            "norm_W": norms[k, b],
                            "gap": gaps[k, b],
                            "tokens": " ".join(map(str, toks[b])),
                        }
                    )
            med, lo, hi = _quantiles(gaps, axis=1)
            med_norm = np.median(norms, axis=1)
            k0 = int(len(marks) * (1 - RATE_FIT_FRACTION))
            xs, ys, ns = np.array(marks[k0:], float), np.array(med[k0:]), med_norm[k0:]
            ok = np.isfinite(ys) & (ys > 0)
            rs = fit_rate(xs[ok], ys[ok]) if ok.sum() >= 3 else None
            rn = fit_rate(ns[ok], ys[ok]) if ok.sum() >= 3 else None
            final = gaps[-1]
            rates.append(
                {
                    "loss": loss,
                    "mode": mode,
                    "lr": CONVERGENCE_LR[mode],
                    "steps": marks[-1],
                    "median_final_gap": float(np.nanmedian(final))
                    if np.any(np.isfinite(final))
                    else math.nan,
                    "max_final_gap": float(np.nanmax(final)) if np.any(np.isfinite(final)) else math.nan,
                    "median_final_norm": float(med_norm[-1]),
                    "slope_vs_steps": rs.slope if rs else math.nan,
                    "r2_vs_steps": rs.r2 if rs else math.nan,
                    "slope_vs_norm": rn.slope if rn else math.nan,
                    "r2_vs_norm": rn.r2 if rn else math.nan,
                    "median_gap_halfway": float(med[k0]),
                    "runs_infeasible_final": int(np.sum(~np.isfinite(final))),
                }
            )
            style = "-o" if normalized else "--s"
            ser_steps.append(Series(f"{mode} GD (lr {CONVERGENCE_LR[mode]:g})", marks, med, lo, hi, style))
            ser_norm.append(Series(f"{mode} GD", med_norm.tolist(), med, lo, hi, style))
        k0 = int(len(marks) * (1 - RATE_FIT_FRACTION))
        shrinks = {r["mode"]: _shrink(r) for r in rates[-len(modes) :]}
        panels_steps.append(
            Panel(
                f"{loss} loss",
                "step t",
                "1 − corr(W(t), W_mm(α(t)))",
                ser_steps,
                True,
                True,
                note=f"claim: from step {marks[k0]} to {marks[-1]} the median gap falls\n"
                f"≥ 10× (normalized; measured {_fmt(shrinks['normalized'])}×) and falls "
                f"(plain; {_fmt(shrinks['plain'])}×)",
            )
        )
        panels_norm.append(
            Panel(f"{loss} loss", "||W(t)||_F", "1 − corr(W(t), W_mm(α(t)))", ser_norm, True, True)
        )
    res.tables["runs"] = rows
    res.tables["rates"] = rates
    res.figures.append(
        Figure(
            "steps",
            f"Direction gap to Att-SVM against steps: unit-norm n={n}, T={T}, d={d}; "
            f"median and 10–90% band over {B} seeds",
            panels_steps,
            "Each run is compared with the Att-SVM of its own currently selected tokens α(t).",
        )
    )
    res.figures.append(
        Figure(
            "norm",
            f"Direction gap to Att-SVM against ||W||_F: unit-norm n={n}, T={T}, d={d}; "
            f"median and 10–90% band over {B} seeds",
            panels_norm,
            "x: the median ||W|| over the seeds at each recorded step.",
        )
    )
    res.numbers["svm_solves"] = len(svm.cache)
    res.numbers["infeasible_token_choices_seen"] = svm.infeasible
    for r in rates:
        res.numbers[f"{r['loss']}/{r['mode']}/median_final_gap"] = r["median_final_gap"]
        res.numbers[f"{r['loss']}/{r['mode']}/slope_vs_norm"] = r["slope_vs_norm"]
    # Claims. Normalized GD: the gap must shrink (the theorem: gap → 0 as ||W|| → ∞); we check
    # that the median gap fell by 10× between the halfway record and the end and that the fitted
    # log-log slope against ||W|| is negative. Plain GD moves ||W|| only logarithmically, so for
    # it we only require that the gap decreases.
    for r in rates:
        tag = f"{r['loss']}/{r['mode']}"
        shrink = _shrink(r)
        if r["mode"] == "normalized":
            passed = bool(shrink >= 10 and r["slope_vs_norm"] < 0)
            need = "fell ≥ 10× over the second half with a negative slope"
        else:
            passed = bool(shrink > 1 and r["slope_vs_norm"] < 0)
            need = "decreased over the second half"
        res.claim(
            f"converges/{tag}",
            f"{r['mode']} GD with {r['loss']} loss converges in direction to W_mm(α(t)): the median gap {need}",
            passed,
            f"median gap {_fmt(r['median_gap_halfway'])} at step {marks[int(len(marks) * (1 - RATE_FIT_FRACTION))]} → "
            f"{_fmt(r['median_final_gap'])} at step {marks[-1]} ({_fmt(shrink)}×); slope vs ||W|| "
            f"{_fmt(r['slope_vs_norm'])} (R² {_fmt(r['r2_vs_norm'])}), vs steps {_fmt(r['slope_vs_steps'])}",
            severity="check" if size != "tiny" else "finding",
        )
    return res
