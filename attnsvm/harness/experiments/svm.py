"""``reproduce`` experiment ``svm``: Att-SVM solvers: accuracy and time.

Att-SVM(opt) on Gaussian cross-attention instances of growing ``d``, solved by each method of
:func:`attnsvm.svm.solve_svm`: the cvxpy matrix program (``primal``), the tensor-trick vector
program (``vector``), the factorised dual (``dual``) — each finished by the exact active-set step — and
the nuclear-norm program (``nuc``). Accuracy: relative KKT residuals and the distance to the dual's
certified ``W``; time per repeat call (each method's first call reported apart).

Claims (checks): ``methods-agree`` (primal, vector and dual give the same W to
:data:`~attnsvm.harness.experiments._common.SVM_AGREE_RTOL`), ``certified`` (every Frobenius solution is
certified), ``nuclear-feasible`` and ``nuclear-vs-frobenius`` (the nuclear solution is feasible and the
two norms order as each solution's feasibility for the other problem implies).

Reference: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (Att-SVM).

Structure: :func:`compute_svm` → :class:`SvmResult` → :func:`check_svm`, :func:`figures_svm`,
:func:`tables_svm`, :func:`numbers_svm` → :func:`svm_experiment`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model._instance import Instance, random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import SVM_AGREE_RTOL, _fmt, experiment_result

__all__ = [
    "SVM_SIZES",
    "SVM_NUC_FEAS_TOL",
    "SVM_METHODS",
    "SvmSolve",
    "SvmResult",
    "compute_svm",
    "check_svm",
    "figures_svm",
    "tables_svm",
    "numbers_svm",
    "svm_experiment",
]


# ================================================================= sizes and constants
#: ``n``, ``T``, the dimensions ``ds`` solved by each method, and seeds per ``d``, per size.
SVM_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"n": 3, "T": 4, "ds": {"dual": [4, 8], "vector": [4, 8], "primal": [4], "nuc": [4]}, "seeds": 1},
    "small": {
        "n": 6,
        "T": 8,
        "ds": {
            "dual": [8, 16, 32, 64, 128, 256],
            "vector": [8, 16, 32, 64],
            "primal": [8, 16, 32, 64],
            "nuc": [4, 8, 16],
        },
        "seeds": 2,
    },
    "paper": {
        "n": 6,
        "T": 8,
        "ds": {
            "dual": [8, 16, 32, 64, 128, 256, 512, 1024],
            "vector": [8, 16, 32, 64, 128],
            "primal": [8, 16, 32, 64, 128],
            "nuc": [4, 8, 16, 32],
        },
        "seeds": 3,
    },
}


#: The nuclear-norm solution is rescaled to exact feasibility; margins ≥ 1 − this (svm.NUC_FEAS_TOL).
SVM_NUC_FEAS_TOL = 1e-7

#: The methods, in table, legend and colour order (``nuc``: the nuclear-norm program).
SVM_METHODS = ("dual", "vector", "primal", "nuc")

#: The dual takes milliseconds: its time is the best of this many calls, so timer noise does not dominate.
SVM_DUAL_REPEATS = 3

#: The certification threshold on the relative KKT residuals drawn in the figure (svm.CERTIFY_RTOL).
SVM_CERTIFY_RTOL = 1e-9

#: Each method's colour in every panel.
_COLORS = {"dual": "C0", "vector": "C1", "primal": "C2", "nuc": "C3"}


# ================================================================= typed results
@dataclass(frozen=True)
class SvmSolve:
    """One solve: ``method``, dimension ``d`` and instance ``seed``; ``time_s`` (a repeat call; the dual's
    best of :data:`SVM_DUAL_REPEATS`); ``objective``; ``min_margin`` (smallest SVM margin of the returned
    W); ``certified``, ``error_bound``; ``kkt_max`` (largest relative KKT residual, NaN if none);
    ``raw_rel_error`` (the conic solver's W_raw against the certified W, NaN if none);
    ``rel_diff_to_dual`` (``||W − W_dual||/||W_dual||``, NaN for ``nuc``); ``support_size``. For ``nuc``
    only (``None`` otherwise): ``fro_solution_nuclear_norm`` (``||W_fro||_*``), ``nuc_solution_fro_norm``
    (``||W_nuc||_F``) and ``fro_objective`` (``||W_fro||_F``)."""

    method: str
    d: int
    seed: int
    time_s: float
    objective: float
    min_margin: float
    certified: bool
    error_bound: float
    kkt_max: float
    raw_rel_error: float
    rel_diff_to_dual: float
    support_size: int
    fro_solution_nuclear_norm: float | None = None
    nuc_solution_fro_norm: float | None = None
    fro_objective: float | None = None


@dataclass(frozen=True)
class SvmResult:
    """All solves: ``n``, ``T``, ``seeds`` per d, ``ds`` (method → the dimensions it solves),
    ``first_call_s`` (method → seconds of its first, untimed-in-the-curves call) and ``solves`` (one
    :class:`SvmSolve` per (seed, d, method) solved, seed-major, then d, then :data:`SVM_METHODS` order)."""

    n: int
    T: int
    seeds: int
    ds: dict[str, tuple[int, ...]]
    first_call_s: dict[str, float]
    solves: tuple[SvmSolve, ...]

    def of(self, method: str, d: int | None = None) -> list[SvmSolve]:
        """The solves of ``method`` (at dimension ``d`` if given)."""
        return [r for r in self.solves if r.method == method and (d is None or r.d == d)]


# ================================================================= compute
def _solve(inst: Instance, method: str) -> Any:
    from ...svm import solve_svm

    if method == "nuc":
        return solve_svm(inst, norm="nuc", method="primal")
    return solve_svm(inst, method=method)


def _first_calls(n: int, T: int, ds: dict[str, list[int]], seed: int) -> dict[str, float]:
    """Each method's first call pays one-off costs (imports, cvxpy's solver set-up): measured once,
    untimed in the curves, on an instance of the method's smallest d, and reported apart."""
    first_call: dict[str, float] = {}
    for method in SVM_METHODS:
        warm = random_instance(n, T, min(ds[method]), seed=seed)
        t0 = time.perf_counter()
        _solve(warm, method)
        first_call[method] = time.perf_counter() - t0
    return first_call


def _measure(inst: Instance, ref: Any, method: str, d: int, seed: int) -> SvmSolve:
    """Solve ``inst`` by ``method`` (a repeat call, timed) and compare with the dual's ``ref``."""
    from ...model._tensor import svm_margins

    elapsed = math.inf
    for _ in range(SVM_DUAL_REPEATS if method == "dual" else 1):
        t0 = time.perf_counter()
        sol = _solve(inst, method)
        elapsed = min(elapsed, time.perf_counter() - t0)
    margins = svm_margins(inst, sol.W, sol.alpha)
    nuc = method == "nuc"
    return SvmSolve(
        method=method,
        d=d,
        seed=seed,
        time_s=elapsed,
        objective=float(sol.objective),
        min_margin=float(margins.min()),
        certified=bool(sol.certified),
        error_bound=float(sol.error_bound),
        kkt_max=float(sol.kkt.max()) if sol.kkt is not None else math.nan,
        raw_rel_error=float(sol.raw_rel_error) if sol.raw_rel_error is not None else math.nan,
        rel_diff_to_dual=math.nan if nuc else float(np.linalg.norm(sol.W - ref.W) / np.linalg.norm(ref.W)),
        support_size=len(sol.support),
        fro_solution_nuclear_norm=float(np.linalg.norm(ref.W, "nuc")) if nuc else None,
        nuc_solution_fro_norm=float(np.linalg.norm(sol.W)) if nuc else None,
        fro_objective=float(ref.objective) if nuc else None,
    )


def compute_svm(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> SvmResult:
    """Solve every (seed, d) instance (seed ``seed + 100·s + d``) by each method that covers ``d``."""
    from ...svm import solve_svm

    cfg = SVM_SIZES[size]
    n, T = cfg["n"], cfg["T"]
    all_d = sorted({d for ds in cfg["ds"].values() for d in ds})
    total = sum(len(v) for v in cfg["ds"].values()) * cfg["seeds"]
    first_call = _first_calls(n, T, cfg["ds"], seed)
    solves: list[SvmSolve] = []
    for s in range(cfg["seeds"]):
        for d in all_d:
            inst = random_instance(n, T, d, seed=seed + 100 * s + d)
            ref = solve_svm(inst, method="dual")
            for method in SVM_METHODS:
                if d in cfg["ds"][method]:
                    solves.append(_measure(inst, ref, method, d, seed + 100 * s + d))
                    progress(len(solves), total)
    return SvmResult(
        n=n,
        T=T,
        seeds=cfg["seeds"],
        ds={m: tuple(cfg["ds"][m]) for m in SVM_METHODS},
        first_call_s=first_call,
        solves=tuple(solves),
    )


# ================================================================= checks
def _check_nuclear(result: SvmResult) -> list[ExperimentClaim]:
    """``nuclear-feasible`` and ``nuclear-vs-frobenius`` (none without nuclear solves)."""
    nuc = result.of("nuc")
    if not nuc:
        return []
    worst_feas = min(r.min_margin for r in nuc)
    # W_fro is feasible for the nuclear problem, so ||W_nuc||_* ≤ ||W_fro||_*; and W_nuc is
    # feasible for the Frobenius problem, so ||W_nuc||_F ≥ ||W_fro||_F (both up to the solvers'
    # certified accuracy, NUC_FEAS_TOL relative).
    order_ok = all(
        r.fro_solution_nuclear_norm is not None
        and r.nuc_solution_fro_norm is not None
        and r.fro_objective is not None
        and r.objective <= r.fro_solution_nuclear_norm * (1 + SVM_NUC_FEAS_TOL)
        and r.nuc_solution_fro_norm >= r.fro_objective * (1 - SVM_NUC_FEAS_TOL)
        for r in nuc
    )
    return [
        ExperimentClaim(
            name="nuclear-feasible",
            statement=f"the nuclear-norm solution is feasible to {SVM_NUC_FEAS_TOL:g}",
            passed=worst_feas >= 1 - SVM_NUC_FEAS_TOL,
            message=f"worst margin {worst_feas!r} over {len(nuc)} solves",
            severity="check",
        ),
        ExperimentClaim(
            name="nuclear-vs-frobenius",
            statement="||W_nuc||_* ≤ ||W_fro||_* and ||W_nuc||_F ≥ ||W_fro||_F (each is feasible for the "
            "other problem)",
            passed=order_ok,
            message=f"{len(nuc)} instances, d up to {max(result.ds['nuc'])}",
            severity="check",
        ),
    ]


def check_svm(result: SvmResult, *, size: str) -> list[ExperimentClaim]:
    """``methods-agree`` and ``certified`` over the Frobenius solves, then the nuclear checks."""
    fro = [r for r in result.solves if r.method != "nuc"]
    worst_diff = max(r.rel_diff_to_dual for r in fro)
    uncert = [r for r in fro if not r.certified]
    return [
        ExperimentClaim(
            name="methods-agree",
            statement=f"primal, vector and dual give the same W to {SVM_AGREE_RTOL:g} relative",
            passed=worst_diff <= SVM_AGREE_RTOL,
            message=f"worst ||W − W_dual||/||W_dual|| = {_fmt(worst_diff)} over {len(fro)} solves",
            severity="check",
        ),
        ExperimentClaim(
            name="certified",
            statement="every Frobenius solution is certified (KKT residuals and cond(K_S)·eps ≤ 1e-9)",
            passed=not uncert,
            message=f"{len(fro) - len(uncert)}/{len(fro)} certified; worst KKT residual "
            f"{_fmt(max(r.kkt_max for r in fro))}",
            severity="check",
        ),
        *_check_nuclear(result),
    ]


# ================================================================= tables and numbers
def _row(r: SvmSolve) -> dict[str, Any]:
    row: dict[str, Any] = {
        "method": r.method,
        "d": r.d,
        "seed": r.seed,
        "time_s": r.time_s,
        "objective": r.objective,
        "min_margin": r.min_margin,
        "certified": r.certified,
        "error_bound": r.error_bound,
        "kkt_max": r.kkt_max,
        "raw_rel_error": r.raw_rel_error,
        "rel_diff_to_dual": r.rel_diff_to_dual,
        "support_size": r.support_size,
    }
    if r.method == "nuc":
        row["fro_solution_nuclear_norm"] = r.fro_solution_nuclear_norm
        row["nuc_solution_fro_norm"] = r.nuc_solution_fro_norm
        row["fro_objective"] = r.fro_objective
    return row


def tables_svm(result: SvmResult) -> dict[str, list[dict[str, Any]]]:
    """``solves``: one row per solve (the nuclear rows with the three norms of the comparison)."""
    return {"solves": [_row(r) for r in result.solves]}


def _median_time(result: SvmResult, method: str, d: int) -> float:
    return float(np.median([r.time_s for r in result.of(method, d)]))


def numbers_svm(result: SvmResult) -> dict[str, Any]:
    """First-call times, the worst agreement and KKT residual, and the dual's speed-ups."""
    fro = [r for r in result.solves if r.method != "nuc"]
    dmax_dual = max(result.ds["dual"])
    out: dict[str, Any] = {f"first_call_s/{m}": result.first_call_s[m] for m in SVM_METHODS}
    out.update(
        worst_rel_diff_to_dual=max(r.rel_diff_to_dual for r in fro),
        worst_kkt=max(r.kkt_max for r in fro),
        uncertified=sum(1 for r in fro if not r.certified),
        largest_dual_d=dmax_dual,
        dual_time_at_largest_d=_median_time(result, "dual", dmax_dual),
    )
    for m in ("vector", "primal"):
        common = [d for d in result.ds[m] if d in result.ds["dual"]]
        if common:
            dmax = max(common)
            tm = np.median([r.time_s for r in result.of(m, dmax)])
            td = np.median([r.time_s for r in result.of("dual", dmax)])
            out[f"speedup_dual_vs_{m}_at_d{dmax}"] = float(tm / td)
    return out


# ================================================================= figures
def _worst(result: SvmResult, m: str, key: str) -> list[float]:
    """The largest ``key`` over seeds at each d of method ``m``."""
    return [float(np.max([getattr(r, key) for r in result.of(m, d)])) for d in result.ds[m]]


def _method_series(result: SvmResult) -> tuple[list[Series], list[Series], list[Series]]:
    """The time, KKT and raw-error series of each method."""
    series_t, series_k, series_raw = [], [], []
    for m in SVM_METHODS:
        ds: list[float] = [d for d in result.ds[m]]  # the ints themselves (figure data keeps them as ints)
        t_med = [_median_time(result, m, d) for d in result.ds[m]]
        series_t.append(Series(m, ds, t_med, color=_COLORS[m]))
        if m == "nuc":
            continue
        # vector and primal return the dual's W, so their KKT curves coincide with the dual's: the
        # dual is drawn as large hollow markers under them.
        style = {"dual": "-o", "vector": "--s", "primal": ":^"}[m]
        series_k.append(
            Series(
                m,
                ds,
                _worst(result, m, "kkt_max"),
                style=style,
                color=_COLORS[m],
                ms=9 if m == "dual" else None,
                zorder=2 if m == "dual" else 3,
            )
        )
        if m != "dual":
            series_raw.append(
                Series(m, ds, _worst(result, m, "raw_rel_error"), style=style, color=_COLORS[m])
            )
    return series_t, series_k, series_raw


def _warm_text(result: SvmResult) -> str:
    return ", ".join(f"{m} {result.first_call_s[m]:.2g} s" for m in SVM_METHODS)


def figures_svm(result: SvmResult) -> list[Figure]:
    """``methods``: time per solve, KKT residual and the conic solvers' raw error against d."""
    series_t, series_k, series_raw = _method_series(result)
    ds = result.ds
    d_all = sorted({d for v in ds.values() for d in v})
    warm_txt = _warm_text(result)
    panels = [
        Panel(
            "time per solve (median over seeds; repeat calls)",
            "d",
            "seconds",
            series_t,
            xlog=True,
            ylog=True,
            xticks=[float(d) for d in d_all],
            note=f"first call of each method excluded (warm-up:\n{warm_txt})",
            note_loc="below",
        ),
        Panel(
            "KKT residual of the returned W (worst over seeds)",
            "d",
            "max relative KKT residual",
            series_k,
            xlog=True,
            ylog=True,
            xticks=[float(d) for d in d_all if d in ds["dual"]],
            hlines=[(SVM_CERTIFY_RTOL, "certification threshold 1e-9")],
            note="vector and primal return the dual's W:\ntheir curves lie on the dual's",
            note_loc="below",
        ),
        Panel(
            "conic solver's answer W_raw vs the certified W",
            "d",
            "||W_raw − W||_F / ||W||_F (worst)",
            series_raw,
            xlog=True,
            ylog=True,
            xticks=[float(d) for d in d_all if d in ds["vector"] or d in ds["primal"]],
        ),
    ]
    return [
        Figure(
            "methods",
            f"Att-SVM solvers on Gaussian instances, n={result.n}, T={result.T}; {result.seeds} seed(s) per d",
            panels,
            caption="Primal and vector end with the same exact active-set step as the dual and return its W "
            "(the table's column `rel_diff_to_dual`). Times: each method's first call (imports, solver "
            f"set-up) is excluded and reported apart ({warm_txt}); the dual's time is the best of 3 calls.",
        )
    ]


# ================================================================= the experiment
@register_experiment(
    "svm",
    "Att-SVM solvers: accuracy and time",
    "Att-SVM(opt) on Gaussian cross-attention instances (n=6, T=8) of growing d, solved by each "
    "method: the cvxpy matrix program (primal), the tensor-trick vector program (vector), the "
    "factorised dual (dual) — each finished by the exact active-set step — and the nuclear-norm "
    "program (nuc). Accuracy: relative KKT residuals and the distance to the dual's certified W.",
    order=50,
)
def svm_experiment(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> ExperimentResult:
    """Solver accuracy (KKT residuals) and time against ``d``, per method."""
    result = compute_svm(size, seed, device=device, progress=progress)
    return experiment_result(
        "svm",
        config=dict(SVM_SIZES[size]),
        tables=tables_svm(result),
        figures=figures_svm(result),
        numbers=numbers_svm(result),
        claims=check_svm(result, size=size),
    )
