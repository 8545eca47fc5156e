"""``reproduce`` experiment ``local_global``: Local vs global token selection.

Normalized GD (lr 0.1, logistic loss, from ``W = 0``) on random unit-norm instances of growing dimension
``d``; for each run, whether the final selected tokens ``α_final = argmax_t s_it`` are the globally optimal
ones (``opt_i = argmax_t Y_i vᵀx_it``), whether they are locally optimal (Att-SVM(α_final) feasible and
every support token scores below the selected one), whether they settled (the same at half-way) and
whether ``||W||`` diverges (grew over the second half by ≥ :data:`DIVERGING_FRACTION` of what normalized GD
can add). A settled, diverging run whose tokens are not locally optimal is continued
:data:`CONFIRM_FACTOR` times as long before it counts as a counterexample.

Claims: ``global-is-locally-optimal`` (check: a feasible global choice is locally optimal); findings
``gd-diverges`` (every run diverges), ``final-tokens-locally-optimal`` (the conjecture of arXiv
2308.16898: no confirmed counterexample) and ``global-share-grows-with-d`` (the share of global choices
at the largest ``d`` is at least the share at the smallest). References: Tarzanagh, Li, Thrampoulidis,
Oymak, arXiv 2308.16898 (local optimality, overparameterisation).

Structure: :func:`compute_local_global` → :class:`LocalGlobalResult` → :func:`check_local_global`,
:func:`figures_local_global`, :func:`tables_local_global` → :func:`local_global_experiment`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...model._instance import Instance, random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import FloatArray, Int64Array, _fmt, experiment_result, segmented_batch, tokens_text

__all__ = [
    "LOCAL_GLOBAL_SIZES",
    "LOCAL_GLOBAL_LR",
    "CONFIRM_FACTOR",
    "DIVERGING_FRACTION",
    "LocalGlobalRun",
    "Counterexample",
    "CandidateRun",
    "LocalGlobalResult",
    "DimShares",
    "LocalGlobalSummary",
    "compute_local_global",
    "shares_by_d",
    "summarise_local_global",
    "check_local_global",
    "tables_local_global",
    "numbers_local_global",
    "figures_local_global",
    "local_global_experiment",
]


# ============================================================== sizes and constants
#: Per size: ``n``, ``T``, the dimensions ``ds``, runs per ``d``, normalized-GD steps and the instance family.
LOCAL_GLOBAL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"n": 3, "T": 4, "ds": [2, 4], "runs": 6, "steps": 200, "family": "unit"},
    "small": {"n": 6, "T": 8, "ds": [2, 4, 6, 8, 10, 16], "runs": 64, "steps": 1000, "family": "unit"},
    "paper": {"n": 6, "T": 8, "ds": [2, 4, 6, 8, 10, 16, 32], "runs": 200, "steps": 2000, "family": "unit"},
}


#: A candidate counterexample to "α_final is locally optimal" is continued for this many times the
#: run's steps; it is reported only if its tokens stay, ||W|| keeps growing and α stays non-local.
CONFIRM_FACTOR = 10


#: Diverging: ||W|| grew over the second half by ≥ this fraction of the maximum η·steps/2.
DIVERGING_FRACTION = 0.5


#: The step size of normalized GD (the published lr of arXiv 2306.13596); ``||W||`` grows by ≤ η a step.
LOCAL_GLOBAL_LR = 0.1


# ============================================================== typed results
@dataclass(frozen=True)
class LocalGlobalRun:
    """One GD run at dimension ``d`` on the instance of ``seed``: whether ``alpha_final`` (``(n,)``, the
    final tokens) ``is_global`` (equals ``opt``, ``(n,)``), ``settled`` (the same tokens at half-way),
    ``diverging`` (``norm_growth_second_half`` ≥ :data:`DIVERGING_FRACTION` · η · steps/2), ``feasible``
    (Att-SVM(α_final)) and ``locally_optimal``; ``final_gap``: ``1 − corr(W, W_mm(α_final))`` (NaN if
    infeasible); ``reason``: why α_final is not locally optimal (the local-optimality report's)."""

    d: int
    seed: int
    is_global: bool
    settled: bool
    diverging: bool
    norm_growth_second_half: float
    final_gap: float
    locally_optimal: bool
    feasible: bool
    alpha_final: Int64Array
    opt: Int64Array
    reason: str | None


@dataclass(frozen=True)
class CandidateRun:
    """A run to continue (:func:`_confirm_counterexamples`): its instance, final iterate ``W`` ``(d, d)``,
    final tokens ``alpha`` ``(n,)`` and whether it ``settled`` and is ``diverging`` (only those are
    continued)."""

    inst: Instance
    W: FloatArray
    alpha: Int64Array
    settled: bool
    diverging: bool


@dataclass(frozen=True)
class Counterexample:
    """A run whose final tokens are not locally optimal (``d``, ``seed``, ``settled``, ``diverging`` and
    ``reason`` as in :class:`LocalGlobalRun`); ``confirmed``: it was settled and diverging and, continued
    :data:`CONFIRM_FACTOR` times as long, kept its tokens and kept diverging."""

    d: int
    seed: int
    settled: bool
    diverging: bool
    confirmed: bool
    reason: str | None


@dataclass(frozen=True)
class LocalGlobalResult:
    """``n``, ``T``, ``runs_per_d``, GD ``steps``, the dimensions ``ds``, the ``runs`` (one
    :class:`LocalGlobalRun` per (d, run), ``d``-major: ``len(ds) · runs_per_d``) and the
    ``counterexamples`` (one :class:`Counterexample` per run that is not locally optimal, same order)."""

    n: int
    T: int
    runs_per_d: int
    steps: int
    ds: tuple[int, ...]
    runs: tuple[LocalGlobalRun, ...]
    counterexamples: tuple[Counterexample, ...]


@dataclass(frozen=True)
class DimShares:
    """The runs at one ``d``: how many (``runs``) and the shares of global, locally optimal, infeasible
    and settled final choices."""

    d: int
    runs: int
    share_global: float
    share_locally_optimal: float
    share_infeasible: float
    share_settled: float


@dataclass(frozen=True)
class LocalGlobalSummary:
    """Counts and shares over all runs: ``runs``; the shares of locally optimal and global choices;
    ``diverging_runs``/``bounded_runs``; ``candidates_not_confirmed`` (settled, diverging, not locally
    optimal, but not confirmed when continued); the median final gaps of the settled diverging runs that
    are locally optimal and that are not (NaN if none); ``settled_runs`` (settled and diverging);
    ``settled_not_locally_optimal`` (confirmed counterexamples); ``global_runs``;
    ``settled_locally_optimal``; ``locally_optimal_runs``; the ``first_confirmed`` counterexample."""

    runs: int
    share_locally_optimal: float
    share_global: float
    diverging_runs: int
    bounded_runs: int
    candidates_not_confirmed: int
    median_final_gap_locally_optimal: float
    median_final_gap_not_locally_optimal: float
    settled_runs: int
    settled_not_locally_optimal: int
    global_runs: int
    settled_locally_optimal: int
    locally_optimal_runs: int
    first_confirmed: Counterexample | None


# ============================================================== compute
def _confirm_counterexamples(cands: Sequence[CandidateRun], steps: int, *, device: str) -> list[bool]:
    """Continue each settled, diverging candidate ``CONFIRM_FACTOR × steps`` more; whether it is confirmed.

    Confirmed (``True``) when the tokens do not change and ``||W||`` keeps growing (by at least
    ``DIVERGING_FRACTION`` of ``η`` per step): only then is it a counterexample to the conjecture rather
    than a finite-horizon artefact. A candidate that is not settled and diverging is not continued
    (``False``).
    """
    flags = [False] * len(cands)
    idx = [i for i, c in enumerate(cands) if c.settled and c.diverging]
    if not idx:
        return flags
    todo = [cands[i] for i in idx]
    more = CONFIRM_FACTOR * steps
    # One batch for every d: zero-padding x, z, v (and W) to the largest d leaves the logits,
    # the values and the gradient's original block unchanged and its padded block exactly 0,
    # so each padded trajectory is the original one.
    D = max(c.inst.d for c in todo)

    def pad(a: Any, axis: int) -> Any:
        width = [(0, 0)] * np.ndim(a)
        width[axis] = (0, D - np.shape(a)[axis])
        return np.pad(a, width)

    insts = [Instance(pad(c.inst.X, 2), c.inst.Y, pad(c.inst.v, 0), pad(c.inst.z, 1)) for c in todo]
    W0 = np.stack([pad(pad(c.W, 0), 1) for c in todo])
    # one segment: the run_gd_batch call of the experiment's runs (chunked on Dask when the batch is large)
    ((_, W_end, tok_end),) = segmented_batch(insts, [more], LOCAL_GLOBAL_LR, True, "logistic", device, W0=W0)
    for i, W, tokens in zip(idx, W_end, tok_end, strict=True):
        growth = float(np.linalg.norm(W) - np.linalg.norm(cands[i].W))
        flags[i] = bool(
            np.array_equal(tokens, cands[i].alpha) and growth >= DIVERGING_FRACTION * LOCAL_GLOBAL_LR * more
        )
    return flags


def _one_run(
    inst: Instance,
    d: int,
    seed: int,
    W_half: Any,
    tok_half: Any,
    W_end: Any,
    tok_end: Any,
    growth_needed: float,
) -> LocalGlobalRun:
    """Classify one run from its iterate and tokens at half-way and at the end."""
    from ...gd import direction_gap
    from ...svm import local_optimality_report, solve_svm

    alpha = np.array(tok_end)
    growth = float(np.linalg.norm(W_end) - np.linalg.norm(W_half))
    opt = inst.optimal_tokens()
    rep = local_optimality_report(inst, alpha)
    return LocalGlobalRun(
        d=d,
        seed=seed,
        is_global=bool(np.array_equal(alpha, opt)),
        settled=bool(np.array_equal(alpha, tok_half)),
        diverging=growth >= growth_needed,
        norm_growth_second_half=growth,
        final_gap=direction_gap(W_end, solve_svm(inst, alpha=alpha).W) if rep.feasible else math.nan,
        locally_optimal=bool(rep.locally_optimal),
        feasible=bool(rep.feasible),
        alpha_final=alpha,
        opt=opt,
        reason=rep.reason,
    )


def _runs_at_d(
    d: int, seed: int, cfg: dict[str, Any], *, device: str
) -> tuple[list[LocalGlobalRun], list[CandidateRun]]:
    """Every run at dimension ``d`` (instances of seeds ``seed + 10000·d + r``) and the candidate
    counterexamples among them (the runs that are not locally optimal, in the same order)."""
    n, T, steps = cfg["n"], cfg["T"], cfg["steps"]
    seeds = [seed + 10_000 * d + r for r in range(cfg["runs"])]
    insts = [random_instance(n, T, d, seed=s, family=cfg["family"]) for s in seeds]
    # Tokens at the half-way step and at the end: a run is "settled" when they agree.
    (_, W_half, tok_half), (_, W_end, tok_end) = segmented_batch(
        insts, [steps // 2, steps], LOCAL_GLOBAL_LR, True, "logistic", device
    )
    growth_needed = DIVERGING_FRACTION * LOCAL_GLOBAL_LR * (steps - steps // 2)
    runs, cands = [], []
    for r, inst in enumerate(insts):
        run = _one_run(inst, d, seeds[r], W_half[r], tok_half[r], W_end[r], tok_end[r], growth_needed)
        runs.append(run)
        if not run.locally_optimal:
            cands.append(
                CandidateRun(
                    inst=inst, W=W_end[r], alpha=run.alpha_final, settled=run.settled, diverging=run.diverging
                )
            )
    return runs, cands


def compute_local_global(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> LocalGlobalResult:
    """Every run of :data:`LOCAL_GLOBAL_SIZES` [size], and the continuation of the candidate
    counterexamples."""
    cfg = LOCAL_GLOBAL_SIZES[size]
    runs: list[LocalGlobalRun] = []
    cands: list[CandidateRun] = []
    for k, d in enumerate(cfg["ds"]):
        runs_d, cands_d = _runs_at_d(d, seed, cfg, device=device)
        runs += runs_d
        cands += cands_d
        progress(k + 1, len(cfg["ds"]))
    confirmed = _confirm_counterexamples(cands, cfg["steps"], device=device)
    bad = [r for r in runs if not r.locally_optimal]
    counter = [
        Counterexample(
            d=r.d, seed=r.seed, settled=r.settled, diverging=r.diverging, confirmed=ok, reason=r.reason
        )
        for r, ok in zip(bad, confirmed, strict=True)
    ]
    return LocalGlobalResult(
        n=cfg["n"],
        T=cfg["T"],
        runs_per_d=cfg["runs"],
        steps=cfg["steps"],
        ds=tuple(cfg["ds"]),
        runs=tuple(runs),
        counterexamples=tuple(counter),
    )


# ============================================================== checks
def shares_by_d(result: LocalGlobalResult) -> list[DimShares]:
    """One :class:`DimShares` per ``d`` of ``result.ds``."""
    out = []
    R = result.runs_per_d
    for d in result.ds:
        part = [r for r in result.runs if r.d == d]
        out.append(
            DimShares(
                d=d,
                runs=R,
                share_global=sum(r.is_global for r in part) / R,
                share_locally_optimal=sum(r.locally_optimal for r in part) / R,
                share_infeasible=sum(not r.feasible for r in part) / R,
                share_settled=float(np.mean([r.settled for r in part])),
            )
        )
    return out


def summarise_local_global(result: LocalGlobalResult) -> LocalGlobalSummary:
    """The counts, shares and median gaps of :class:`LocalGlobalSummary`."""
    runs = result.runs
    total = len(runs)
    diverging = [r for r in runs if r.diverging]
    settled = [r for r in diverging if r.settled]
    confirmed = [c for c in result.counterexamples if c.confirmed]
    gaps_bad = [r.final_gap for r in settled if not r.locally_optimal]
    gaps_good = [r.final_gap for r in settled if r.locally_optimal]
    n_loc = sum(r.locally_optimal for r in runs)
    return LocalGlobalSummary(
        runs=total,
        share_locally_optimal=n_loc / total,
        share_global=sum(r.is_global for r in runs) / total,
        diverging_runs=len(diverging),
        bounded_runs=total - len(diverging),
        candidates_not_confirmed=sum(
            1 for c in result.counterexamples if c.settled and c.diverging and not c.confirmed
        ),
        median_final_gap_locally_optimal=float(np.nanmedian(gaps_good)) if gaps_good else math.nan,
        median_final_gap_not_locally_optimal=float(np.nanmedian(gaps_bad)) if gaps_bad else math.nan,
        settled_runs=len(settled),
        settled_not_locally_optimal=len(confirmed),
        global_runs=sum(1 for r in runs if r.is_global),
        settled_locally_optimal=sum(r.locally_optimal for r in settled),
        locally_optimal_runs=n_loc,
        first_confirmed=confirmed[0] if confirmed else None,
    )


def _share_trend(result: LocalGlobalResult) -> tuple[bool, list[str]]:
    """Whether the global share at the largest ``d`` is ≥ the one at the smallest, and where it dips."""
    # The finding "share grows with d" compares the two ends only (not every step): said in the
    # claim's statement and drawn in the figure.
    rows = shares_by_d(result)
    grows = rows[-1].share_global >= rows[0].share_global
    dips = [f"d={b.d}" for a, b in zip(rows, rows[1:], strict=False) if b.share_global < a.share_global]
    return grows, dips


def check_local_global(result: LocalGlobalResult, *, size: str) -> list[ExperimentClaim]:
    """``global-is-locally-optimal`` (check) and the findings ``gd-diverges``,
    ``final-tokens-locally-optimal`` and ``global-share-grows-with-d``."""
    s = summarise_local_global(result)
    grows, dips = _share_trend(result)
    first = s.first_confirmed
    return [
        ExperimentClaim(
            name="global-is-locally-optimal",
            statement="the globally optimal choice opt is locally optimal whenever GD selects it",
            passed=all(r.locally_optimal for r in result.runs if r.is_global and r.feasible),
            message=f"{s.global_runs} global finals checked",
            severity="check",
        ),
        ExperimentClaim(
            name="gd-diverges",
            statement="normalized GD drives ||W|| → ∞ (the regime of the Att-SVM theory)",
            passed=s.diverging_runs == s.runs,
            message=f"{s.diverging_runs}/{s.runs} runs diverging; the other {s.runs - s.diverging_runs} "
            "sit at a finite stationary point (||W|| stopped growing), mostly at small d, where the theory "
            "makes no claim",
            severity="finding",
        ),
        ExperimentClaim(
            name="final-tokens-locally-optimal",
            statement="GD's final tokens α_final are locally optimal whenever ||W|| → ∞ and the tokens have "
            "settled (conjecture of arXiv 2308.16898; settled = the same tokens at half-way and at the end; "
            f"a counterexample must survive {CONFIRM_FACTOR}× more steps)",
            passed=first is None,
            message=f"{s.settled_locally_optimal}/{s.settled_runs} settled diverging runs locally optimal; "
            f"{s.candidates_not_confirmed} apparent counterexamples changed tokens or stopped diverging when "
            f"continued ({s.locally_optimal_runs}/{s.runs} of all runs); median final gap to "
            f"W_mm(α_final): {_fmt(s.median_final_gap_locally_optimal)} (locally optimal) vs "
            f"{_fmt(s.median_final_gap_not_locally_optimal)} (not)"
            + (f"; first counterexample d={first.d}, seed {first.seed}: {first.reason}" if first else ""),
            severity="finding",
        ),
        ExperimentClaim(
            name="global-share-grows-with-d",
            statement="the share of runs that select the globally optimal tokens grows with d overall "
            "(overparameterisation); criterion: the share at the largest d is at least the share at the "
            "smallest d — not monotone growth at every d",
            passed=grows,
            message=" → ".join(f"d={r.d}: {r.share_global:.2f}" for r in shares_by_d(result))
            + (f" (dips at {', '.join(dips)})" if dips else " (monotone)"),
            severity="finding",
        ),
    ]


# ============================================================== tables, numbers, figures
def tables_local_global(result: LocalGlobalResult) -> dict[str, list[dict[str, Any]]]:
    """``by_d`` (shares per d), ``runs`` (one row per run) and ``not_locally_optimal`` (the
    counterexample candidates and whether each was confirmed)."""
    runs = [
        {
            "d": r.d,
            "seed": r.seed,
            "global": r.is_global,
            "settled": r.settled,
            "diverging": r.diverging,
            "norm_growth_second_half": r.norm_growth_second_half,
            "final_gap": r.final_gap,
            "locally_optimal": r.locally_optimal,
            "feasible": r.feasible,
            "alpha_final": tokens_text(r.alpha_final),
            "opt": tokens_text(r.opt),
        }
        for r in result.runs
    ]
    return {
        "by_d": [dict(vars(b)) for b in shares_by_d(result)],
        "runs": runs,
        "not_locally_optimal": [dict(vars(c)) for c in result.counterexamples],
    }


def numbers_local_global(result: LocalGlobalResult) -> dict[str, Any]:
    """The counts, shares and median gaps of :func:`summarise_local_global`."""
    s = summarise_local_global(result)
    return {
        "runs": s.runs,
        "share_locally_optimal": s.share_locally_optimal,
        "share_global": s.share_global,
        "diverging_runs": s.diverging_runs,
        "bounded_runs": s.bounded_runs,
        "candidates_not_confirmed": s.candidates_not_confirmed,
        "median_final_gap_locally_optimal": s.median_final_gap_locally_optimal,
        "median_final_gap_not_locally_optimal": s.median_final_gap_not_locally_optimal,
        "settled_runs": s.settled_runs,
        "settled_not_locally_optimal": s.settled_not_locally_optimal,
    }


def figures_local_global(result: LocalGlobalResult) -> list[Figure]:
    """``shares``: the shares of global, locally optimal and settled choices against ``d``, with the
    criterion of ``global-share-grows-with-d`` and its outcome."""
    rows = shares_by_d(result)
    grows, dips = _share_trend(result)
    ds: list[Any] = [r.d for r in rows]  # ints (as the tables give them)
    note = (
        "finding 'global share grows with d' checks only the ends:\n"
        f"share at d={ds[-1]} ({rows[-1].share_global:.2f}) ≥ share at d={ds[0]} "
        f"({rows[0].share_global:.2f}): {'holds' if grows else 'refuted'}"
        + (f"\n(not monotone: it dips at {', '.join(dips)})" if dips else "")
    )
    panel = Panel(
        f"unit-norm n={result.n}, T={result.T}; {result.runs_per_d} runs per d, {result.steps} steps",
        "d",
        "share of runs",
        [
            Series("α_final = opt (global)", ds, [r.share_global for r in rows]),
            Series("α_final locally optimal", ds, [r.share_locally_optimal for r in rows], style="--s"),
            Series("tokens settled (same at half-way)", ds, [r.share_settled for r in rows], style=":^"),
        ],
        ylim=(0.0, 1.05),
        xticks=[float(d) for d in ds],
        legend="lower right",
        note_loc="below",
        note=note,
    )
    return [
        Figure(
            "shares",
            "Final token choice of normalized GD against d",
            [panel],
            caption="A finding compares the share of global choices at the largest and the smallest d only; "
            "dips in between do not refute it.",
        )
    ]


# ============================================================== the experiment
@register_experiment(
    "local_global",
    "Local vs global token selection",
    "Normalized GD (lr 0.1, logistic loss, from W = 0) on random unit-norm instances of growing "
    "dimension d; for each run, whether the final selected tokens α_final = argmax_t s_it are the "
    "globally optimal ones (opt_i = argmax_t Y_i vᵀx_it) and whether they are locally optimal "
    "(Att-SVM(α_final) feasible and every support token scores below the selected one). "
    "Att-SVM(α_final) is always feasible: the final iterate itself separates its selected tokens. "
    "The Att-SVM theory is about ||W|| → ∞: a run counts as diverging when ||W|| grew over the "
    "second half by at least half of what normalized GD can add (½·η per step); the others sit at a "
    "finite stationary point, where the theory says nothing. A settled, diverging run whose tokens are "
    f"not locally optimal is continued for {CONFIRM_FACTOR} times as many steps before it is reported "
    "as a counterexample (finite-horizon artefacts change their tokens when continued).",
    order=30,
)
def local_global_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Share of global and of locally optimal final token choices against ``d``."""
    result = compute_local_global(size, seed, device=device, progress=progress)
    return experiment_result(
        "local_global",
        config=dict(LOCAL_GLOBAL_SIZES[size]),
        tables=tables_local_global(result),
        numbers=numbers_local_global(result),
        claims=check_local_global(result, size=size),
        figures=figures_local_global(result),
    )
