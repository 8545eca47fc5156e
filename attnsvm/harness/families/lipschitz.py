"""``reproduce`` family ``lipschitz``: Lipschitz constants: softmax, linear, normalized linear."""

from __future__ import annotations

from typing import Any

from ...model._instance import random_instance
from ..experiments import FAMILY_REGISTRY, FamilyResult, Figure, Panel, ProgressFn, Series, register_family
from ._common import _fmt, _quantiles

__all__ = ["LIPSCHITZ_SIZES", "lipschitz_family"]


# ================================================================== family: Lipschitz
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


@register_family(
    "lipschitz",
    "Lipschitz constants: softmax, linear, normalized linear",
    "Certified upper bound and attained lower estimate (sampling + projected ascent on the Jacobian "
    "norm) of the Lipschitz constant of W ↦ s(W) (all attention weights) and of W ↦ f(W) (outputs) "
    "on the ball ||W||_F ≤ R, Frobenius in, ℓ2 out, for the three attention kinds; Gaussian data.",
    order=60,
)
def lipschitz_family(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> FamilyResult:
    """Bounds and estimates against the radius, per kind."""
    from ...lipschitz import compare_lipschitz

    cfg = LIPSCHITZ_SIZES[size]
    spec = FAMILY_REGISTRY["lipschitz"]
    res = FamilyResult(spec.name, spec.title, spec.description, config=dict(cfg))
    n, T, d = cfg["shape"]
    insts = [random_instance(n, T, d, seed=seed + s) for s in range(cfg["seeds"])]
    kinds = ("softmax", "linear", "normalized_linear")
    radii = list(cfg["radii"])
    panels = []
    tables: dict[str, list[dict[str, Any]]] = {}
    step = 0
    for of in ("weights", "output"):
        rows: list[dict[str, Any]] = []
        for i, inst in enumerate(insts):
            part = compare_lipschitz(
                [inst], radii, of=of, seed=seed, samples=cfg["samples"], steps=cfg["steps"]
            )
            for r in part:
                r["instance"] = i
                r.pop("shape", None)
            rows += part
            step += 1
            progress(step, 2 * len(insts))
        tables[of] = rows
        series = []
        for kind, style, color in zip(kinds, ("o", "s", "^"), ("C0", "C1", "C2"), strict=True):
            mb, _, _ = _quantiles(
                [[r[f"bound_{kind}"] for r in rows if r["radius"] == R] for R in radii], axis=1
            )
            me, _, _ = _quantiles(
                [[r[f"estimate_{kind}"] for r in rows if r["radius"] == R] for R in radii], axis=1
            )
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
        panels.append(
            Panel(
                f"W ↦ {'s(W)' if of == 'weights' else 'f(W)'}",
                "radius R",
                "Lipschitz constant",
                series,
                True,
                True,
                xticks=[float(R) for R in radii],
            )
        )
    res.tables.update(tables)
    res.figures.append(
        Figure(
            "radius",
            f"Lipschitz constants on ||W||_F ≤ R: Gaussian n={n}, T={T}, d={d}; median over "
            f"{len(insts)} instance(s)",
            panels,
            "Solid with large markers: certified upper bound; dotted with small filled markers (drawn on "
            "top): attained estimate, a lower bound. The linear estimate is exact and equals its bound.",
            legend="below",
        )
    )
    allrows = [(of, r) for of, rows in tables.items() for r in rows]
    # Soundness: every estimate (attained) ≤ its bound (certified), per kind. The estimate's SVD
    # carries ~(nT + d²)·eps relative rounding; the bound already includes its own allowance.
    sound = [
        (of, r, k) for of, r in allrows for k in kinds if r[f"estimate_{k}"] > r[f"bound_{k}"] * (1 + 1e-12)
    ]
    res.claim(
        "bounds-sound",
        "no attained estimate exceeds the certified bound (all kinds, both maps, all radii)",
        not sound,
        f"{len(allrows) * len(kinds)} comparisons; "
        + (
            f"first violation: {sound[0][0]}, {sound[0][2]}, R={sound[0][1]['radius']}"
            if sound
            else "none violated"
        ),
    )
    # Checked on ATTAINED constants (the bounds satisfy it by construction: the cap ½||𝓛|| is one of
    # their candidates). The linear estimate is the exact ||𝓛||₂ (constant Jacobian); each estimate is
    # an SVD of a full Jacobian, ~(nT + d²)·eps relative: 1e-12 covers two of them at these sizes.
    # Compared as products, not through the ratio: two zero constants give the ratio 1 (0/0 = 1 by
    # compare_lipschitz's convention) although ½·0 ≥ 0 holds.
    half = [r for r in tables["weights"] if r["estimate_softmax"] > 0.5 * r["estimate_linear"] * (1 + 1e-12)]
    res.claim(
        "softmax-half-linear-weights",
        "weights map: attained softmax constant ≤ ½ · linear constant (from ||diag(s) − ssᵀ||₂ ≤ ½)",
        not half,
        "largest attained ratio softmax/linear = "
        f"{_fmt(max(r['estimate_ratio_softmax/linear'] for r in tables['weights']))}",
    )
    est_w = max(r["estimate_ratio_softmax/linear"] for r in tables["weights"])
    res.claim(
        "softmax-more-stable-weights",
        "weights map: softmax is more stable than linear attention, as attained (estimate ratio < 1)",
        est_w < 1,
        f"largest estimate ratio softmax/linear = {_fmt(est_w)}",
        severity="finding",
    )
    est_o = max(r["estimate_ratio_softmax/linear"] for r in tables["output"])
    worst_o = max(tables["output"], key=lambda r: r["estimate_ratio_softmax/linear"])
    res.claim(
        "softmax-more-stable-output",
        "output map: softmax is more stable than linear attention, as attained (estimate ratio < 1)",
        est_o < 1,
        f"largest estimate ratio softmax/linear = {_fmt(est_o)} (instance {worst_o['instance']}, "
        f"R={worst_o['radius']:g})",
        severity="finding",
    )
    est_nl = max(r["estimate_ratio_softmax/normalized_linear"] for r in tables["weights"])
    worst_nl = max(tables["weights"], key=lambda r: r["estimate_ratio_softmax/normalized_linear"])
    res.claim(
        "softmax-more-stable-than-normalized-linear",
        "weights map: softmax is more stable than normalized linear attention (φ = elu + 1), as attained",
        est_nl < 1,
        f"largest estimate ratio softmax/normalized_linear = {_fmt(est_nl)} (instance {worst_nl['instance']}, "
        f"R={worst_nl['radius']:g})",
        severity="finding",
    )
    for of in ("weights", "output"):
        rs = tables[of]
        res.numbers[f"{of}/max_bound_over_estimate_softmax"] = max(r["gap_softmax"] for r in rs)
        res.numbers[f"{of}/max_bound_over_estimate_linear"] = max(r["gap_linear"] for r in rs)
    return res
