"""``reproduce`` experiment ``toys``: The peer papers' toy examples.

Runs the published toy examples (:func:`attnsvm.peers._toys.toy_figures_data`):

* prompt attention (arXiv 2306.13596): one input, ``W = diag(1,1,0)``, ``v = (0,0,1)``, tokens
  ``(−0.1,1,1)``, ``(1,0,0.9)``, ``(0,0,c)``; normalized GD on ``p`` from ``p₀ = (0,y,0)``, lr 0.1;
* global convergence (arXiv 2308.16898): three inputs sharing one optimal token;
* joint ``(v, p)`` training;
* ℓp mirror descent (arXiv 2410.14581) on unit-norm data, with the Bregman divergence to the
  ℓp'-SVM of each ``p'``.

Claims: ``prompt-second-token-local-iff-c0`` (check); the findings ``prompt-gd-to-p-mm``,
``global-toy-converges``, ``joint-toy-converges`` and ``mirror-descent-to-own-lp-svm`` (each run reaches
correlation :data:`TOY_CORR` with its reference direction, or ends closest to its own ℓp-SVM).

Structure: :func:`compute_toys` → :class:`ToysResult` → :func:`check_toys`, :func:`figures_toys`,
:func:`tables_toys` → :func:`toys_experiment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import EPS, FloatArray, Int64Array, experiment_result

__all__ = [
    "TOY_SIZES",
    "TOY_CORR",
    "TOY_COINCIDE",
    "PromptRun",
    "PromptToy",
    "GlobalToy",
    "JointToy",
    "LpRun",
    "ToysResult",
    "compute_toys",
    "check_toys",
    "figures_toys",
    "tables_toys",
    "toys_experiment",
]


# ======================================================================= sizes and constants
#: Steps of each toy's run, per size.
TOY_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"prompt_steps": 100, "global_steps": 100, "joint_steps": 200, "lp_steps": 200},
    "small": {"prompt_steps": 1000, "global_steps": 1000, "joint_steps": 2000, "lp_steps": 2000},
    "paper": {"prompt_steps": 1000, "global_steps": 1000, "joint_steps": 2000, "lp_steps": 2000},
}


#: A run "converges to" a reference direction here when its final correlation is at least this:
#: the published figures show correlations approaching 1 over these step counts.
TOY_CORR = 0.99

#: Two prompt-toy trajectories are drawn as one line when no recorded point differs by more than
#: this (in units of the unit disk they are drawn in: ≈ 1/4 pixel at the report's 110 dpi).
TOY_COINCIDE = 1e-3


# ======================================================================= typed results
@dataclass(frozen=True)
class PromptRun:
    """One prompt-toy GD run: ``y0`` (start ``p₀ = (0, y0, 0)``), ``final_token`` (the token selected at
    the end), ``corr`` (``corr(p_T, p_mm(final token))``) and ``direction`` (the recorded ``p_t/||p_t||``,
    first two coordinates, shape ``(records, 2)``)."""

    y0: float
    final_token: int
    corr: float
    direction: FloatArray


@dataclass(frozen=True)
class PromptToy:
    """The prompt toy at one ``c`` (``key`` ``"c=<c>"``): its ``runs`` (one per ``y0``), ``p_mm[a]`` (the
    prompt-SVM solution selecting token ``a``, shape ``(d,)``) and ``locally_optimal[a]``, per token."""

    key: str
    runs: tuple[PromptRun, ...]
    p_mm: tuple[FloatArray, ...]
    locally_optimal: tuple[bool, ...]


@dataclass(frozen=True)
class GlobalToy:
    """The global-convergence toy: recorded ``steps`` and ``corr(W_t, W_mm(opt))`` (shape ``(records,)``),
    ``final_tokens`` and ``optimal_tokens`` (shape ``(n,)``), and the cancellation-free gap
    ``½||Ŵ − Ŵ_mm||²`` (``gap``) at ``gap_steps``."""

    steps: Int64Array
    corr: FloatArray
    final_tokens: Int64Array
    optimal_tokens: Int64Array
    gap_steps: tuple[float, ...]
    gap: tuple[float, ...]


@dataclass(frozen=True)
class JointToy:
    """Joint ``(v, p)`` training at one ``c`` (``key``): recorded ``steps``, ``corr(v_t, v_mm)``
    (``v_corr``) and ``corr(p_t, p_relax)`` (``p_corr``), each shape ``(records,)``."""

    key: str
    steps: Int64Array
    v_corr: FloatArray
    p_corr: FloatArray


@dataclass(frozen=True)
class LpRun:
    """ℓp mirror descent at one ``p`` (``key`` ``"p=<p>"``): recorded ``steps``, and per ℓp'-SVM
    (``svm_keys[j]`` ``"p'=<p'>"``, ``svm_ps[j]`` its ``p'``) the Bregman divergence along the run
    (``bregman[j]``, shape ``(records,)``)."""

    key: str
    p: float
    steps: Int64Array
    svm_keys: tuple[str, ...]
    svm_ps: tuple[float, ...]
    bregman: tuple[FloatArray, ...]

    def final(self, j: int) -> float:
        """The final divergence to the ``j``-th ℓp'-SVM."""
        return float(np.asarray(self.bregman[j])[-1])


@dataclass(frozen=True)
class ToysResult:
    """Every toy: ``prompt_steps``, ``prompt`` (one :class:`PromptToy` per ``c``), ``global_toy``,
    ``joint`` (one :class:`JointToy` per ``c``) and ``lp`` (one :class:`LpRun` per ``p``)."""

    prompt_steps: int
    prompt: tuple[PromptToy, ...]
    global_toy: GlobalToy
    joint: tuple[JointToy, ...]
    lp: tuple[LpRun, ...]


# ======================================================================= compute
def _lst(a: Any) -> list[float]:
    return [float(x) for x in np.asarray(a, dtype=float).ravel()]


def _global_toy_gap(steps: int, record: Any) -> tuple[list[float], list[float]]:
    """``1 − corr(W_t, W_mm)`` of the global toy at the ``record`` steps, cancellation-free.

    :func:`attnsvm.peers._toys.toy_figures_data` returns ``corr`` only, and ``1 − corr`` as a difference is
    exactly 0 at every record; the figure reruns the same normalized GD (same instance, lr 0.1,
    same records) and takes :func:`attnsvm.gd.direction_gap` = ``½||Ŵ − Ŵ_mm||²`` of its iterates.
    """
    from ...gd import direction_gap, run_gd
    from ...peers._toys import global_toy
    from ...svm import solve_svm

    inst = global_toy()
    W_mm = solve_svm(inst).W
    tr = run_gd(inst, steps, 0.1, record_at=np.asarray(record), keep_iterates=True)
    pts = [(float(r.step), direction_gap(r.W, W_mm)) for r in tr.record if r.W is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _prompt_toys(data: dict[str, Any]) -> tuple[PromptToy, ...]:
    """The prompt toys of :func:`attnsvm.peers._toys.toy_figures_data`'s ``"prompt"`` entry."""
    out = []
    for key, entry in data.items():
        runs = tuple(
            PromptRun(
                y0=y, final_token=run["final_token"], corr=run["corr"], direction=np.asarray(run["direction"])
            )
            for y, run in entry["runs"].items()
        )
        tokens = sorted(entry["p_mm"])
        out.append(
            PromptToy(
                key=key,
                runs=runs,
                p_mm=tuple(np.asarray(entry["p_mm"][a], dtype=float) for a in tokens),
                locally_optimal=tuple(bool(entry["locally_optimal"][a]) for a in tokens),
            )
        )
    return tuple(out)


def _lp_runs(data: dict[str, Any]) -> tuple[LpRun, ...]:
    """The mirror-descent runs of :func:`attnsvm.peers._toys.toy_figures_data`'s ``"lp"`` entry."""
    return tuple(
        LpRun(
            key=key,
            p=float(key.split("=")[1]),
            steps=np.asarray(e["steps"]),
            svm_keys=tuple(e["bregman"]),
            svm_ps=tuple(float(kk.split("=")[1]) for kk in e["bregman"]),
            bregman=tuple(np.asarray(b) for b in e["bregman"].values()),
        )
        for key, e in data.items()
    )


def compute_toys(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> ToysResult:
    """Run every toy (the ℓp toy's data from ``seed``) and the global toy's cancellation-free gap."""
    from ...peers._toys import toy_figures_data

    cfg = TOY_SIZES[size]
    progress(0, 1)
    data = toy_figures_data(lp_seed=seed, **cfg)
    progress(1, 1)
    g = data["global"]
    g_steps, g_gap = _global_toy_gap(cfg["global_steps"], g["steps"])
    return ToysResult(
        prompt_steps=cfg["prompt_steps"],
        prompt=_prompt_toys(data["prompt"]),
        global_toy=GlobalToy(
            steps=np.asarray(g["steps"]),
            corr=np.asarray(g["corr"]),
            final_tokens=np.asarray(g["final_tokens"]),
            optimal_tokens=np.asarray(g["optimal_tokens"]),
            gap_steps=tuple(g_steps),
            gap=tuple(g_gap),
        ),
        joint=tuple(
            JointToy(
                key=k,
                steps=np.asarray(e["steps"]),
                v_corr=np.asarray(e["v_corr"]),
                p_corr=np.asarray(e["p_corr"]),
            )
            for k, e in data["joint"].items()
        ),
        lp=_lp_runs(data["lp"]),
    )


# ======================================================================= checks
def _locally_optimal(result: ToysResult, key: str, token: int) -> bool | None:
    """Whether ``token`` is locally optimal in the prompt toy ``key`` (``None``: no such toy or token)."""
    for toy in result.prompt:
        if toy.key == key and 0 <= token < len(toy.locally_optimal):
            return toy.locally_optimal[token]
    return None


def _check_prompt(result: ToysResult) -> list[ExperimentClaim]:
    """The prompt toy: local optimality of the second token (check) and GD to p_mm (finding)."""
    lo9, lo0 = _locally_optimal(result, "c=0.9", 1), _locally_optimal(result, "c=0.0", 1)
    runs = [(toy.key, run) for toy in result.prompt for run in toy.runs]
    worst_prompt = min(run.corr for _, run in runs)
    return [
        ExperimentClaim(
            name="prompt-second-token-local-iff-c0",
            statement="prompt toy: the second token is a locally optimal choice only when c = 0 (arXiv 2306.13596)",
            passed=lo0 is True and lo9 is False,
            message=f"locally optimal: c=0.9 → {lo9}, c=0 → {lo0}",
            severity="check",
        ),
        ExperimentClaim(
            name="prompt-gd-to-p-mm",
            statement=f"prompt toy: every GD run ends with corr(p, p_mm(final token)) ≥ {TOY_CORR}",
            passed=worst_prompt >= TOY_CORR,
            message=f"worst corr {worst_prompt:.6f}; final tokens "
            + ", ".join(f"{key} y₀={run.y0:g}: {run.final_token}" for key, run in runs),
            severity="finding",
        ),
    ]


def _check_convergence(result: ToysResult) -> list[ExperimentClaim]:
    """The global, joint and ℓp toys (findings)."""
    g = result.global_toy
    gc = float(g.corr[-1])
    jc = {e.key: (float(e.v_corr[-1]), float(e.p_corr[-1])) for e in result.joint}
    own_best = []
    for run in result.lp:
        best = min(range(len(run.svm_ps)), key=run.final)
        own_best.append(run.svm_ps[best] == run.p)
    return [
        ExperimentClaim(
            name="global-toy-converges",
            statement=f"global toy: GD selects the optimal tokens and corr(W, W_mm(opt)) ≥ {TOY_CORR}",
            passed=bool(np.array_equal(g.final_tokens, g.optimal_tokens)) and gc >= TOY_CORR,
            message=f"final corr {gc:.6f}, final tokens {list(map(int, g.final_tokens))}",
            severity="finding",
        ),
        ExperimentClaim(
            name="joint-toy-converges",
            statement=f"joint toy: v → v_mm and p → p_relax in direction (corr ≥ {TOY_CORR})",
            passed=all(min(v) >= TOY_CORR for v in jc.values()),
            message="; ".join(f"{k}: corr v {v:.6f}, p {p:.6f}" for k, (v, p) in jc.items()),
            severity="finding",
        ),
        ExperimentClaim(
            name="mirror-descent-to-own-lp-svm",
            statement="ℓp mirror descent ends closest (Bregman) to the ℓp-SVM of its own p",
            passed=all(own_best),
            message=f"{sum(own_best)}/{len(own_best)} runs",
            severity="finding",
        ),
    ]


def check_toys(result: ToysResult, *, size: str) -> list[ExperimentClaim]:
    """The prompt check and the four convergence findings (see the module docstring)."""
    return [*_check_prompt(result), *_check_convergence(result)]


# ======================================================================= tables
def tables_toys(result: ToysResult) -> dict[str, list[dict[str, Any]]]:
    """``prompt`` (one row per run), ``prompt_local_optimality`` (per toy and token) and ``lp`` (the final
    divergence of each run to each ℓp'-SVM)."""
    return {
        "prompt": [
            {"toy": toy.key, "y0": run.y0, "final_token": run.final_token, "corr_p_mm": run.corr}
            for toy in result.prompt
            for run in toy.runs
        ],
        "prompt_local_optimality": [
            {"toy": toy.key, "token": a, "locally_optimal": ok}
            for toy in result.prompt
            for a, ok in enumerate(toy.locally_optimal)
        ],
        "lp": [
            {"run": run.key, "svm": kk, "final_bregman": run.final(j)}
            for run in result.lp
            for j, kk in enumerate(run.svm_keys)
        ],
    }


# ======================================================================= figures
def _coinciding(runs: Sequence[PromptRun]) -> list[list[PromptRun]]:
    """Group prompt-toy runs whose drawn trajectories coincide (within :data:`TOY_COINCIDE`)."""
    groups: list[list[PromptRun]] = []
    for run in runs:
        d = np.asarray(run.direction)
        for grp in groups:
            d0 = np.asarray(grp[0].direction)
            if d0.shape == d.shape and float(np.max(np.abs(d0 - d))) <= TOY_COINCIDE:
                grp.append(run)
                break
        else:
            groups.append([run])
    return groups


def _run_series(toy: PromptToy) -> list[Series]:
    """Runs whose whole drawn trajectories coincide are drawn once and labelled with their count."""
    series = []
    for group in _coinciding(toy.runs):
        ys = [r.y0 for r in group]
        run = group[0]
        y0 = (
            f"p₀ = (0, {ys[0]:g}, 0)"
            if len(ys) == 1
            else "p₀ = (0, y, 0), y ∈ {" + ", ".join(f"{y:g}" for y in ys) + "}"
        )
        label = f"{y0} → token {run.final_token}" + (f" ({len(ys)} runs coincide)" if len(ys) > 1 else "")
        series.append(
            Series(label, _lst(run.direction[:, 0]), _lst(run.direction[:, 1]), style="-", mark_ends=True)
        )
    return series


def _target_series(toy: PromptToy) -> list[Series]:
    """The target of each run: p_mm of its final token, as a direction (first two coordinates of
    p_mm/||p_mm||, the same projection as the trajectories), with the dashed ray to it."""
    series = []
    for tok in sorted({run.final_token for run in toy.runs}):
        pm = toy.p_mm[tok]
        u = pm / np.linalg.norm(pm)
        # A label starting with "_" keeps the ray out of the legend (matplotlib's convention).
        series.append(Series(f"_ray {tok}", [0.0, float(u[0])], [0.0, float(u[1])], style="k--", zorder=5))
        series.append(
            Series(
                f"target p_mm(token {tok}) / ||p_mm||",
                [float(u[0])],
                [float(u[1])],
                style="k*",
                ms=15,
                zorder=1.8,  # under the runs' end markers, which sit on it when a run arrives
            )
        )
    return series


def _prompt_panel(toy: PromptToy) -> Panel:
    """One prompt toy: trajectories, targets, and a note on where runs end together."""
    ends: dict[int, list[np.ndarray]] = {}
    for run in toy.runs:
        ends.setdefault(run.final_token, []).append(np.asarray(run.direction)[-1])

    def end_text(tok: int, pts: list[np.ndarray]) -> str:
        if len(pts) == 1:
            return f"1 run ends at token {tok}"
        spread = max(float(np.max(np.abs(a - b))) for a in pts for b in pts)
        return f"{len(pts)} runs end at token {tok} (ends within {spread:.1g})"

    return Panel(
        f"prompt toy, {toy.key}: {len(toy.runs)} runs",
        "p₁/||p||",
        "p₂/||p||",
        _run_series(toy) + _target_series(toy),
        ylim=(-1.15, 1.15),
        legend="outside",
        note_loc="outside",
        note="○ start (first record, step 1), ■ end; ★ target\n"
        + "\n".join(end_text(t, pts) for t, pts in sorted(ends.items()))
        + f"\nworst corr(p, p_mm) at the end: {min(r.corr for r in toy.runs):.4f}",
    )


def _prompt_figure(result: ToysResult) -> Figure:
    return Figure(
        "prompt",
        "Prompt toy: direction of p along normalized GD (first two coordinates of p/||p||), "
        f"{result.prompt_steps} steps",
        [_prompt_panel(toy) for toy in result.prompt],
        caption="Each run should end on the dashed ray to the target p_mm of its final token "
        f"(finding: corr ≥ {TOY_CORR}).",
    )


def _lp_panels(result: ToysResult) -> list[Panel]:
    """The divergence to the own ℓp-SVM along each run, and each run's final divergence to every one."""
    along = [
        Series(f"{run.key}: D to own ℓp-SVM", _lst(run.steps), _lst(run.bregman[j]))
        for run in result.lp
        for j, pp in enumerate(run.svm_ps)
        if pp == run.p
    ]
    # Final divergence of each run to every ℓp'-SVM: the finding is that the minimum is at its own p.
    final = [
        Series(
            f"run {run.key}",
            list(run.svm_ps),
            [run.final(j) for j in range(len(run.svm_ps))],
            point_labels=["own" if x == run.p else "" for x in run.svm_ps],
        )
        for run in result.lp
    ]
    return [
        Panel("ℓp mirror descent: Bregman divergence", "step", "D_ψ", along, xlog=True, ylog=True),
        Panel(
            "final D_ψ to each ℓp'-SVM (finding: lowest at 'own')",
            "p' of the ℓp'-SVM",
            "final D_ψ",
            final,
            xlog=False,
            ylog=True,
            xticks=sorted(run.p for run in result.lp),
        ),
    ]


def _convergence_figure(result: ToysResult) -> Figure:
    g = result.global_toy
    threshold = [(1 - TOY_CORR, f"finding's threshold: corr ≥ {TOY_CORR}")]
    joint = [Series(f"v, {e.key}", _lst(e.steps), _lst(1 - e.v_corr)) for e in result.joint] + [
        Series(f"p, {e.key}", _lst(e.steps), _lst(1 - e.p_corr), style="--s") for e in result.joint
    ]
    return Figure(
        "convergence",
        "Global toy, joint (v, p) training and ℓp mirror descent",
        columns=2,
        caption="Global toy: 1 − corr computed cancellation-free as ½||Ŵ − Ŵ_mm||² (1 − corr as a "
        "difference is exactly 0 in float64 at every record): it sits at the float64 rounding scale "
        "from the first step on — with every non-optimal token scoring alike, the first gradient step "
        "already points along W_mm on this instance.",
        panels=[
            Panel(
                "global toy: 1 − corr(W, W_mm(opt))",
                "step",
                "½||Ŵ − Ŵ_mm||²  (= 1 − corr)",
                [Series("normalized GD", list(g.gap_steps), list(g.gap))],
                xlog=True,
                ylog=True,
                hlines=[*threshold, (EPS**2, "eps² (float64 rounding scale)")],
                note="at rounding level from step 1:\nthe first step already points along W_mm",
                note_loc="upper right",
                legend="center right",
            ),
            Panel(
                "joint toy: 1 − corr to v_mm and p_relax",
                "step",
                "1 − corr",
                joint,
                xlog=True,
                ylog=True,
                hlines=threshold,
            ),
            *_lp_panels(result),
        ],
    )


def figures_toys(result: ToysResult) -> list[Figure]:
    """``prompt`` (the prompt toys' trajectories) and ``convergence`` (global, joint, ℓp)."""
    return [_prompt_figure(result), _convergence_figure(result)]


# ======================================================================= the experiment
@register_experiment(
    "toys",
    "The peer papers' toy examples",
    "Prompt attention (arXiv 2306.13596): one input, W = diag(1,1,0), v = (0,0,1), tokens (−0.1,1,1), "
    "(1,0,0.9), (0,0,c); normalized GD on p from p₀ = (0,y,0), lr 0.1. Global convergence "
    "(arXiv 2308.16898): three inputs sharing one optimal token. Joint (v, p) training. ℓp mirror "
    "descent (arXiv 2410.14581) on unit-norm data, n=6, T=8, d=10, with the Bregman divergence to "
    "the ℓp'-SVM of each p'.",
    order=90,
)
def toys_experiment(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> ExperimentResult:
    """Run the published toy examples (:func:`attnsvm.peers._toys.toy_figures_data`)."""
    result = compute_toys(size, seed, device=device, progress=progress)
    return experiment_result(
        "toys",
        config=dict(TOY_SIZES[size]),
        tables=tables_toys(result),
        figures=figures_toys(result),
        claims=check_toys(result, size=size),
        numbers={},
    )
