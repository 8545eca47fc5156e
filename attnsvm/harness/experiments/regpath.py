"""``reproduce`` experiment ``regpath``: Regularization path against GD.

Stationary points ``W_R`` of ``min L(W) s.t. ||W||_F ≤ R`` (warm-started projected normalized GD,
logistic loss) against normalized GD (lr 0.1) on unit-norm instances: at each radius ``R`` the gap
``1 − corr`` of each to the Att-SVM direction of its own selected tokens, the GD iterate taken at
``||W|| ≈ R``, and the gap between the two. The risk is not convex, so the path found is a path of
stationary points (its KKT residual is tabulated).

Claims (findings at size ``tiny``): ``path-converges`` (the median path gap at the largest radius is
below the one at the smallest) and finding ``path-and-gd-agree`` (GD and the path select the same
tokens at the largest radius on every seed). Reference: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv
2308.16898 (regularization path and GD).

Structure: :func:`compute_regpath` → :class:`RegpathResult` → :func:`check_regpath`,
:func:`figures_regpath`, :func:`tables_regpath` → :func:`regpath_experiment`.
"""

from __future__ import annotations

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
    tokens_text,
)

__all__ = [
    "REGPATH_SIZES",
    "REGPATH_GD_LR",
    "RegpathSeedRun",
    "RegpathResult",
    "compute_regpath",
    "check_regpath",
    "tables_regpath",
    "numbers_regpath",
    "figures_regpath",
    "regpath_experiment",
]


# ================================================================ sizes and constants
#: Per size: the instance shape ``(n, T, d)``, the number of seeds, the radii ``R``, the GD steps and the
#: projected-GD step budget per radius of the path (``max_steps``).
REGPATH_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"shape": (3, 4, 5), "seeds": 1, "radii": [0.5, 2.0, 8.0], "gd_steps": 100, "max_steps": 300},
    "small": {
        "shape": (6, 8, 10),
        "seeds": 6,
        "radii": np.geomspace(0.5, 64, 8).tolist(),
        "gd_steps": 700,
        "max_steps": 1000,
    },
    "paper": {
        "shape": (6, 8, 10),
        "seeds": 20,
        "radii": np.geomspace(0.5, 256, 10).tolist(),
        "gd_steps": 2600,
        "max_steps": 2000,
    },
}


#: The step size of normalized GD (the published lr of arXiv 2306.13596).
REGPATH_GD_LR = 0.1


# ================================================================ typed results
@dataclass(frozen=True)
class RegpathSeedRun:
    """The path and GD on the instance of ``seed``, at each of the ``R`` radii: the gaps of the path point
    (``path_gap``) and of the GD iterate of norm closest to the radius (``gd_gap``) to the Att-SVM of
    their own tokens, and between them (``path_vs_gd_gap``), all ``(R,)``, NaN where undefined; that GD
    iterate's norm ``gd_norm`` and step ``gd_step`` ``(R,)``; the path point's KKT residual
    ``path_kkt_residual`` ``(R,)``; the selected tokens ``path_tokens``, ``gd_tokens`` ``(R, n)``;
    whether the path and GD end on the same tokens (``same_final_tokens``) and the path on the global
    choice (``path_final_is_opt``)."""

    seed: int
    path_gap: FloatArray
    gd_gap: FloatArray
    path_vs_gd_gap: FloatArray
    gd_norm: FloatArray
    gd_step: Int64Array
    path_kkt_residual: FloatArray
    path_tokens: Int64Array
    gd_tokens: Int64Array
    same_final_tokens: bool
    path_final_is_opt: bool


@dataclass(frozen=True)
class RegpathResult:
    """The instance ``shape`` ``(n, T, d)``, the ``radii`` (``R`` of them) and one :class:`RegpathSeedRun`
    per seed (``S`` of them); ``path_gaps``, ``gd_gaps``, ``path_vs_gd_gaps``: the gaps stacked ``(S, R)``."""

    shape: tuple[int, int, int]
    radii: tuple[float, ...]
    seeds: tuple[RegpathSeedRun, ...]

    @property
    def path_gaps(self) -> FloatArray:
        """``(S, R)``: each seed's path gaps."""
        return np.array([s.path_gap for s in self.seeds]).reshape(len(self.seeds), len(self.radii))

    @property
    def gd_gaps(self) -> FloatArray:
        """``(S, R)``: each seed's GD gaps."""
        return np.array([s.gd_gap for s in self.seeds]).reshape(len(self.seeds), len(self.radii))

    @property
    def path_vs_gd_gaps(self) -> FloatArray:
        """``(S, R)``: each seed's gaps between the path and GD."""
        return np.array([s.path_vs_gd_gap for s in self.seeds]).reshape(len(self.seeds), len(self.radii))


# ================================================================ compute
def _seed_run(
    inst: Instance, s: int, seed: int, radii: list[float], cfg: dict[str, Any], svm: _SVMCache
) -> RegpathSeedRun:
    """The path and GD on one instance (``s``: its index in ``svm``), compared at every radius."""
    from ...gd import direction_gap, regularization_path, run_gd

    path = regularization_path(inst, radii, max_steps=cfg["max_steps"])
    # GD iterates recorded every step, so the iterate of norm ≈ R is found for each radius.
    traj = run_gd(inst, steps=cfg["gd_steps"], lr=REGPATH_GD_LR, record_at=1, keep_iterates=True)
    gd_norms = traj.norms
    path_gap = np.full(len(radii), np.nan)
    gd_gap = np.full(len(radii), np.nan)
    cross = np.full(len(radii), np.nan)
    recs, js = [], []
    for k, (R, p) in enumerate(zip(radii, path.points, strict=True)):
        ref = svm.get(s, p.tokens)
        if ref is not None:
            path_gap[k] = direction_gap(p.W, ref)
        js.append(int(np.argmin(np.abs(gd_norms - R))))
        rec = traj.record[js[-1]]
        ref_g = svm.get(s, rec.tokens)
        if rec.W is not None and np.any(rec.W != 0):
            if ref_g is not None:
                gd_gap[k] = direction_gap(rec.W, ref_g)
            cross[k] = direction_gap(rec.W, p.W)
        recs.append(rec)
    return RegpathSeedRun(
        seed=seed,
        path_gap=path_gap,
        gd_gap=gd_gap,
        path_vs_gd_gap=cross,
        gd_norm=np.array([float(gd_norms[j]) for j in js]),
        gd_step=np.array([int(rec.step) for rec in recs], dtype=np.int64),
        path_kkt_residual=np.array([p.kkt_residual for p in path.points], dtype=float),
        path_tokens=np.array([p.tokens for p in path.points]),
        gd_tokens=np.array([rec.tokens for rec in recs]),
        same_final_tokens=bool(np.array_equal(path.points[-1].tokens, traj.final_tokens)),
        path_final_is_opt=bool(np.array_equal(path.points[-1].tokens, inst.optimal_tokens())),
    )


def compute_regpath(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> RegpathResult:
    """The path and GD on the unit-norm instances of seeds ``seed + s`` of :data:`REGPATH_SIZES` [size]."""
    cfg = REGPATH_SIZES[size]
    n, T, d = cfg["shape"]
    radii = list(cfg["radii"])
    insts = [random_instance(n, T, d, seed=seed + s, family="unit") for s in range(cfg["seeds"])]
    svm = _SVMCache(insts)
    runs = []
    for s, inst in enumerate(insts):
        runs.append(_seed_run(inst, s, seed + s, radii, cfg, svm))
        progress(s + 1, len(insts))
    return RegpathResult(shape=(n, T, d), radii=tuple(radii), seeds=tuple(runs))


# ================================================================ checks
def check_regpath(result: RegpathResult, *, size: str) -> list[ExperimentClaim]:
    """``path-converges`` (the median path gap at the largest radius < at the smallest; a finding at
    size tiny) and finding ``path-and-gd-agree`` (the same final tokens on every seed)."""
    path_gaps = result.path_gaps
    first, last = float(np.nanmedian(path_gaps[:, 0])), float(np.nanmedian(path_gaps[:, -1]))
    radii = result.radii
    same = sum(r.same_final_tokens for r in result.seeds)
    return [
        ExperimentClaim(
            name="path-converges",
            statement="the regularization path's direction approaches Att-SVM of its selected tokens as R "
            "grows",
            passed=bool(last < first),
            message=f"median gap {_fmt(first)} at R={radii[0]:.3g} → {_fmt(last)} at R={radii[-1]:.3g}",
            severity=check_severity(size),
        ),
        ExperimentClaim(
            name="path-and-gd-agree",
            statement="GD and the regularization path select the same tokens at the largest radius "
            "(arXiv 2308.16898)",
            passed=same == len(result.seeds),
            message=f"{same}/{len(result.seeds)} seeds; median 1 − corr(W_R, W_GD) at the largest R "
            f"{_fmt(float(np.nanmedian(result.path_vs_gd_gaps[:, -1])))}",
            severity="finding",
        ),
    ]


# ================================================================ tables, numbers, figures
def tables_regpath(result: RegpathResult) -> dict[str, list[dict[str, Any]]]:
    """``points``: one row per (seed, radius); ``per_seed``: the final tokens and gaps of each seed."""
    points = [
        {
            "seed": r.seed,
            "radius": R,
            "path_gap": r.path_gap[k],
            "gd_norm": float(r.gd_norm[k]),
            "gd_step": int(r.gd_step[k]),
            "gd_gap": r.gd_gap[k],
            "path_vs_gd_gap": r.path_vs_gd_gap[k],
            "path_kkt_residual": float(r.path_kkt_residual[k]),
            "path_tokens": tokens_text(r.path_tokens[k]),
            "gd_tokens": tokens_text(r.gd_tokens[k]),
        }
        for r in result.seeds
        for k, R in enumerate(result.radii)
    ]
    per_seed = [
        {
            "seed": r.seed,
            "same_final_tokens": r.same_final_tokens,
            "path_final_is_opt": r.path_final_is_opt,
            "final_path_gap": r.path_gap[-1],
            "final_gd_gap": r.gd_gap[-1],
        }
        for r in result.seeds
    ]
    return {"points": points, "per_seed": per_seed}


def numbers_regpath(result: RegpathResult) -> dict[str, Any]:
    """The median final gaps over the seeds and how many seeds end on the same tokens."""
    return {
        "median_final_path_gap": float(np.nanmedian(result.path_gaps[:, -1])),
        "median_final_gd_gap": float(np.nanmedian(result.gd_gaps[:, -1])),
        "median_final_path_vs_gd": float(np.nanmedian(result.path_vs_gd_gaps[:, -1])),
        "same_final_tokens": sum(r.same_final_tokens for r in result.seeds),
    }


def figures_regpath(result: RegpathResult) -> list[Figure]:
    """``gaps``: the path's and GD's gap against ``R``, and the gap between them."""
    n, T, d = result.shape
    radii = list(result.radii)
    mp, lp, hp = _quantiles(result.path_gaps, axis=0)
    mg, lg, hg = _quantiles(result.gd_gaps, axis=0)
    mc, lc, hc = _quantiles(result.path_vs_gd_gaps, axis=0)
    ticks = [float(R) for R in radii]
    to_svm = Panel(
        "gap to the Att-SVM of the selected tokens",
        "R = ||W||_F",
        "1 − corr",
        [
            Series("regularization path W_R", radii, mp, lo=lp, hi=hp),
            Series("normalized GD at ||W|| ≈ R", radii, mg, lo=lg, hi=hg, style="--s"),
        ],
        xlog=True,
        ylog=True,
        xticks=ticks,
    )
    between = Panel(
        "path against GD",
        "R = ||W||_F",
        "1 − corr(W_R, W_GD)",
        [Series("median over seeds", radii, mc, lo=lc, hi=hc)],
        xlog=True,
        ylog=True,
        xticks=ticks,
    )
    return [
        Figure(
            "gaps",
            f"Regularization path and GD at equal ||W||_F: unit-norm n={n}, T={T}, d={d}; "
            f"{len(result.seeds)} seed(s), median and 10–90% band",
            [to_svm, between],
        )
    ]


# ================================================================ the experiment
@register_experiment(
    "regpath",
    "Regularization path against GD",
    "Stationary points W_R of min L(W) s.t. ||W||_F ≤ R (warm-started projected normalized GD, "
    "logistic loss) against normalized GD (lr 0.1): the gap of each to the Att-SVM direction of its "
    "own selected tokens, at equal norms. The risk is not convex, so the path found is a path of "
    "stationary points (its KKT residual is tabulated).",
    order=40,
)
def regpath_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Regularization path and GD: direction gaps at equal ``||W||``."""
    result = compute_regpath(size, seed, device=device, progress=progress)
    return experiment_result(
        "regpath",
        config=dict(REGPATH_SIZES[size]),
        tables=tables_regpath(result),
        numbers=numbers_regpath(result),
        claims=check_regpath(result, size=size),
        figures=figures_regpath(result),
    )
