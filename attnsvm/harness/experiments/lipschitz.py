"""``reproduce`` experiment ``lipschitz``: Lipschitz constants: softmax, linear, normalized linear.

For the maps ``W ↦ s(W)`` (all attention weights) and ``W ↦ f(W)`` (outputs) on the ball
``||W||_F ≤ R`` (Frobenius in, ℓ2 out) and the three attention kinds (softmax, linear, normalized
linear ``φ = elu + 1``), the certified upper bound (:func:`attnsvm.lipschitz.lipschitz_bound`) and an
attained lower estimate (sampling + projected ascent on the Jacobian norm,
:func:`attnsvm.lipschitz.lipschitz_estimate`), against ``R``, on Gaussian data.

Claims: ``bounds-sound`` and ``softmax-half-linear-weights`` (checks: no estimate above its bound;
attained softmax constant ≤ ½ · linear constant for the weights map), and the findings
``softmax-more-stable-weights``, ``softmax-more-stable-output``,
``softmax-more-stable-than-normalized-linear``.

Reference: Kim, Papamakarios, Mnih, "The Lipschitz constant of self-attention", ICML 2021,
arXiv 2006.04710.

Structure: :func:`compute_lipschitz` → :class:`LipschitzResult` → :func:`check_lipschitz`,
:func:`figures_lipschitz`, :func:`tables_lipschitz`, :func:`numbers_lipschitz` →
:func:`lipschitz_experiment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...model._instance import random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import _fmt, _quantiles, experiment_result

__all__ = [
    "LIPSCHITZ_SIZES",
    "LIPSCHITZ_KINDS",
    "LIPSCHITZ_ESTIMATE_RTOL",
    "KindConstant",
    "LipschitzPoint",
    "LipschitzResult",
    "compute_lipschitz",
    "check_lipschitz",
    "figures_lipschitz",
    "tables_lipschitz",
    "numbers_lipschitz",
    "lipschitz_experiment",
]


# ================================================================== sizes and constants
#: ``(n, T, d)``, instances (seeds), radii, and the estimate's samples and ascent steps per size.
LIPSCHITZ_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"shape": (2, 3, 3), "seeds": 1, "radii": [0.5, 4.0], "samples": 4, "steps": 2},
    "small": {
        "shape": (3, 4, 4),
        "seeds": 3,
        "radii": [0.25, 1.0, 4.0, 16.0, 64.0],
        "samples": 16,
        "steps": 10,
    },
    "paper": {
        "shape": (4, 6, 6),
        "seeds": 5,
        "radii": [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
        "samples": 64,
        "steps": 40,
    },
}

#: The attention kinds compared, in table and legend order.
LIPSCHITZ_KINDS = ("softmax", "linear", "normalized_linear")

#: Relative slack of the comparisons of attained estimates: each estimate is an SVD of a full Jacobian,
#: ~(nT + d²)·eps relative rounding, so 1e-12 covers two of them at these sizes (the bounds already
#: include their own allowance).
LIPSCHITZ_ESTIMATE_RTOL = 1e-12


# ================================================================== typed results
@dataclass(frozen=True)
class KindConstant:
    """One kind's constant on one ball: ``bound`` (certified upper), ``estimate`` (attained, a lower
    bound) and ``gap = bound / estimate`` (compare_lipschitz's conventions at 0)."""

    bound: float
    estimate: float
    gap: float


@dataclass(frozen=True)
class LipschitzPoint:
    """One (map, instance, radius): ``of`` (``"weights"`` or ``"output"``), ``instance`` (its index),
    ``radius`` ``R``; the constants of each kind (``softmax``, ``linear``, ``normalized_linear``); and the
    softmax ratios ``softmax/linear`` and ``softmax/normalized_linear`` of bounds and of estimates."""

    of: str
    instance: int
    radius: float
    softmax: KindConstant
    linear: KindConstant
    normalized_linear: KindConstant
    bound_ratio_linear: float
    estimate_ratio_linear: float
    bound_ratio_normalized_linear: float
    estimate_ratio_normalized_linear: float

    def kind(self, kind: str) -> KindConstant:
        """The constants of ``kind`` (one of :data:`LIPSCHITZ_KINDS`)."""
        out: KindConstant = getattr(self, kind)
        return out


@dataclass(frozen=True)
class LipschitzResult:
    """Everything measured: the instance ``shape`` ``(n, T, d)``, ``radii``, the number of ``instances``,
    and the points of each map, instance-major then by radius (``instances · len(radii)`` each)."""

    shape: tuple[int, int, int]
    radii: tuple[float, ...]
    instances: int
    weights: tuple[LipschitzPoint, ...]
    output: tuple[LipschitzPoint, ...]

    def points(self, of: str) -> tuple[LipschitzPoint, ...]:
        """The points of the map ``of`` (``"weights"`` or ``"output"``)."""
        return self.weights if of == "weights" else self.output


# ================================================================== compute
def _point(row: dict[str, Any], instance: int) -> LipschitzPoint:
    """A :func:`attnsvm.lipschitz.compare_lipschitz` row as a :class:`LipschitzPoint`."""
    consts = {
        k: KindConstant(row[f"bound_{k}"], row[f"estimate_{k}"], row[f"gap_{k}"]) for k in LIPSCHITZ_KINDS
    }
    return LipschitzPoint(
        of=row["of"],
        instance=instance,
        radius=row["radius"],
        softmax=consts["softmax"],
        linear=consts["linear"],
        normalized_linear=consts["normalized_linear"],
        bound_ratio_linear=row["bound_ratio_softmax/linear"],
        estimate_ratio_linear=row["estimate_ratio_softmax/linear"],
        bound_ratio_normalized_linear=row["bound_ratio_softmax/normalized_linear"],
        estimate_ratio_normalized_linear=row["estimate_ratio_softmax/normalized_linear"],
    )


def compute_lipschitz(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> LipschitzResult:
    """Bounds and estimates of both maps on Gaussian instances of seeds ``seed + s``, every radius."""
    from ...lipschitz import compare_lipschitz

    cfg = LIPSCHITZ_SIZES[size]
    n, T, d = cfg["shape"]
    insts = [random_instance(n, T, d, seed=seed + s) for s in range(cfg["seeds"])]
    radii = list(cfg["radii"])
    points: dict[str, list[LipschitzPoint]] = {"weights": [], "output": []}
    step = 0
    for of in ("weights", "output"):
        for i, inst in enumerate(insts):
            part = compare_lipschitz(
                [inst], radii, of=of, seed=seed, samples=cfg["samples"], steps=cfg["steps"]
            )
            points[of] += [_point(r, i) for r in part]
            step += 1
            progress(step, 2 * len(insts))
    return LipschitzResult(
        shape=(n, T, d),
        radii=tuple(radii),
        instances=len(insts),
        weights=tuple(points["weights"]),
        output=tuple(points["output"]),
    )


# ================================================================== checks
def _check_sound(result: LipschitzResult) -> ExperimentClaim:
    """``bounds-sound``: every estimate (attained) ≤ its bound (certified), per kind, both maps."""
    allpts = [*result.weights, *result.output]
    sound = [
        (p, k)
        for p in allpts
        for k in LIPSCHITZ_KINDS
        if p.kind(k).estimate > p.kind(k).bound * (1 + LIPSCHITZ_ESTIMATE_RTOL)
    ]
    return ExperimentClaim(
        name="bounds-sound",
        statement="no attained estimate exceeds the certified bound (all kinds, both maps, all radii)",
        passed=not sound,
        message=f"{len(allpts) * len(LIPSCHITZ_KINDS)} comparisons; "
        + (
            f"first violation: {sound[0][0].of}, {sound[0][1]}, R={sound[0][0].radius}"
            if sound
            else "none violated"
        ),
        severity="check",
    )


def _check_half(result: LipschitzResult) -> ExperimentClaim:
    """``softmax-half-linear-weights``, on ATTAINED constants (the bounds satisfy it by construction:
    the cap ½||𝓛|| is one of their candidates). The linear estimate is the exact ||𝓛||₂ (constant
    Jacobian). Compared as products, not through the ratio: two zero constants give the ratio 1 (0/0 = 1
    by compare_lipschitz's convention) although ½·0 ≥ 0 holds."""
    half = [
        p
        for p in result.weights
        if p.softmax.estimate > 0.5 * p.linear.estimate * (1 + LIPSCHITZ_ESTIMATE_RTOL)
    ]
    return ExperimentClaim(
        name="softmax-half-linear-weights",
        statement="weights map: attained softmax constant ≤ ½ · linear constant (from ||diag(s) − ssᵀ||₂ ≤ ½)",
        passed=not half,
        message="largest attained ratio softmax/linear = "
        f"{_fmt(max(p.estimate_ratio_linear for p in result.weights))}",
        severity="check",
    )


def _check_findings(result: LipschitzResult) -> list[ExperimentClaim]:
    """The three "softmax is more stable, as attained" findings (largest estimate ratio < 1)."""
    est_w = max(p.estimate_ratio_linear for p in result.weights)
    worst_o = max(result.output, key=lambda p: p.estimate_ratio_linear)
    worst_nl = max(result.weights, key=lambda p: p.estimate_ratio_normalized_linear)
    est_o, est_nl = worst_o.estimate_ratio_linear, worst_nl.estimate_ratio_normalized_linear
    return [
        ExperimentClaim(
            name="softmax-more-stable-weights",
            statement="weights map: softmax is more stable than linear attention, as attained (estimate ratio < 1)",
            passed=est_w < 1,
            message=f"largest estimate ratio softmax/linear = {_fmt(est_w)}",
            severity="finding",
        ),
        ExperimentClaim(
            name="softmax-more-stable-output",
            statement="output map: softmax is more stable than linear attention, as attained (estimate ratio < 1)",
            passed=est_o < 1,
            message=f"largest estimate ratio softmax/linear = {_fmt(est_o)} (instance {worst_o.instance}, "
            f"R={worst_o.radius:g})",
            severity="finding",
        ),
        ExperimentClaim(
            name="softmax-more-stable-than-normalized-linear",
            statement="weights map: softmax is more stable than normalized linear attention (φ = elu + 1), "
            "as attained",
            passed=est_nl < 1,
            message=f"largest estimate ratio softmax/normalized_linear = {_fmt(est_nl)} "
            f"(instance {worst_nl.instance}, R={worst_nl.radius:g})",
            severity="finding",
        ),
    ]


def check_lipschitz(result: LipschitzResult, *, size: str) -> list[ExperimentClaim]:
    """The two checks (soundness, the ½ factor) and the three stability findings."""
    return [_check_sound(result), _check_half(result), *_check_findings(result)]


# ================================================================== tables, numbers, figures
def _row(p: LipschitzPoint) -> dict[str, Any]:
    """A point as a table row (compare_lipschitz's columns, without ``shape``)."""
    row: dict[str, Any] = {"instance": p.instance, "radius": p.radius, "of": p.of}
    for k in LIPSCHITZ_KINDS:
        c = p.kind(k)
        row.update({f"bound_{k}": c.bound, f"estimate_{k}": c.estimate, f"gap_{k}": c.gap})
    row["bound_ratio_softmax/linear"] = p.bound_ratio_linear
    row["estimate_ratio_softmax/linear"] = p.estimate_ratio_linear
    row["bound_ratio_softmax/normalized_linear"] = p.bound_ratio_normalized_linear
    row["estimate_ratio_softmax/normalized_linear"] = p.estimate_ratio_normalized_linear
    return row


def tables_lipschitz(result: LipschitzResult) -> dict[str, list[dict[str, Any]]]:
    """``weights`` and ``output``: one row per (instance, radius)."""
    return {of: [_row(p) for p in result.points(of)] for of in ("weights", "output")}


def numbers_lipschitz(result: LipschitzResult) -> dict[str, Any]:
    """The largest bound/estimate gap of softmax and linear, per map."""
    out: dict[str, Any] = {}
    for of in ("weights", "output"):
        pts = result.points(of)
        out[f"{of}/max_bound_over_estimate_softmax"] = max(p.softmax.gap for p in pts)
        out[f"{of}/max_bound_over_estimate_linear"] = max(p.linear.gap for p in pts)
    return out


def _panel(result: LipschitzResult, of: str) -> Panel:
    """Median bound and estimate per kind against the radius, for the map ``of``."""
    radii = list(result.radii)
    pts = result.points(of)
    series = []
    for kind, style, color in zip(LIPSCHITZ_KINDS, ("o", "s", "^"), ("C0", "C1", "C2"), strict=True):
        mb, _, _ = _quantiles([[p.kind(kind).bound for p in pts if p.radius == R] for R in radii], axis=1)
        me, _, _ = _quantiles([[p.kind(kind).estimate for p in pts if p.radius == R] for R in radii], axis=1)
        # Bounds: thin lines with hollow markers, underneath; estimates: filled markers drawn on
        # top, so an estimate equal to its bound (linear: the constant Jacobian makes it exact)
        # stays visible.
        series.append(
            Series(
                f"{kind}: certified bound",
                radii,
                mb,
                style="-" + style,
                color=color,
                ms=8,
                zorder=2,
                hollow=True,
            )
        )
        series.append(
            Series(f"{kind}: attained estimate", radii, me, style=":" + style, color=color, zorder=4)
        )
    return Panel(
        f"W ↦ {'s(W)' if of == 'weights' else 'f(W)'}",
        "radius R",
        "Lipschitz constant",
        series,
        xlog=True,
        ylog=True,
        xticks=[float(R) for R in radii],
    )


def figures_lipschitz(result: LipschitzResult) -> list[Figure]:
    """``radius``: both maps' median bound and estimate per kind against ``R``."""
    n, T, d = result.shape
    return [
        Figure(
            "radius",
            f"Lipschitz constants on ||W||_F ≤ R: Gaussian n={n}, T={T}, d={d}; median over "
            f"{result.instances} instance(s)",
            [_panel(result, "weights"), _panel(result, "output")],
            caption="Solid with large markers: certified upper bound; dotted with small filled markers (drawn "
            "on top): attained estimate, a lower bound. The linear estimate is exact and equals its bound.",
            legend="below",
        )
    ]


# ================================================================== the experiment
@register_experiment(
    "lipschitz",
    "Lipschitz constants: softmax, linear, normalized linear",
    "Certified upper bound and attained lower estimate (sampling + projected ascent on the Jacobian "
    "norm) of the Lipschitz constant of W ↦ s(W) (all attention weights) and of W ↦ f(W) (outputs) "
    "on the ball ||W||_F ≤ R, Frobenius in, ℓ2 out, for the three attention kinds; Gaussian data.",
    order=60,
)
def lipschitz_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Bounds and estimates against the radius, per kind."""
    result = compute_lipschitz(size, seed, device=device, progress=progress)
    return experiment_result(
        "lipschitz",
        config=dict(LIPSCHITZ_SIZES[size]),
        tables=tables_lipschitz(result),
        figures=figures_lipschitz(result),
        claims=check_lipschitz(result, size=size),
        numbers=numbers_lipschitz(result),
    )
