"""``reproduce`` experiment ``saturation``: Gradient accuracy at saturation.

Measures, along rays ``W = r·U`` (``||U||_F = 1``) from moderate to fully saturated softmax, the
max-entry error of the closed-form (cancellation-free) logistic-risk gradient, of the log-domain
normalized direction and of the textbook formula ``∂L/∂W = (1/n) Σ_i ℓ'_i Y_i Σ_t s_it (vᵀx_it − f_i)
x_it z_iᵀ`` against a 40-digit mpmath oracle, each over its float64 rounding bound.

Claims: ``stable-gradient-exact`` (error ≤ bound wherever the gradient is representable),
``direction-exact`` (the direction within its bound at every scale, also where the gradient underflows),
finding ``textbook-loses-digits`` (the textbook formula leaves its bound at saturation).
References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (the gradient); the error analysis of
``tests/test_grad.py``.
"""

from __future__ import annotations

from ..._deps import require

require("mpmath", feature="the saturation experiment")  # pragma: no mutate

import math
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from ...model._attention import log_softmax
from ...model._grad import normalized_risk_grad, risk_grad, risk_grad_textbook
from ...model._instance import Instance, random_instance
from ..results import ExperimentClaim, ExperimentResult, Figure, Panel, Series
from ..runner import ProgressFn, no_progress, register_experiment
from ._common import EPS, FloatArray, _fmt, _quantiles, experiment_result

__all__ = [
    "SATURATION_SIZES",
    "SaturationPoint",
    "SaturationResult",
    "SaturationSummary",
    "compute_saturation",
    "summarise_saturation",
    "check_saturation",
    "tables_saturation",
    "numbers_saturation",
    "figures_saturation",
    "saturation_experiment",
]


# ================================================================ sizes and constants
#: Per size: the instance shape ``(n, T, d)``, the number of seeds and the radii ``r = ||W||_F``.
SATURATION_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"shape": (2, 3, 3), "seeds": 1, "scales": [1.0, 30.0, 300.0, 1e4]},
    "small": {"shape": (4, 6, 8), "seeds": 3, "scales": np.geomspace(1.0, 1e4, 12).tolist()},
    "paper": {"shape": (6, 8, 10), "seeds": 10, "scales": np.geomspace(1.0, 1e4, 16).tolist()},
}


#: Below this the float64 gradient entries are subnormal or zero (underflow), so only the
#: normalized direction (computed from log-magnitudes) is compared with the oracle there.
_UNDERFLOW = 1e-280


def _mp_gradient(inst: Instance, W: Any, dps: int = 40) -> tuple[Any, Any, float]:
    """Logistic-risk gradient in ``dps``-digit arithmetic (the oracle).

    Uses the cancellation-free form ``a_t − f = Σ_u s_u (a_t − a_u)`` (an exact algebraic
    identity, proved in ``symbolic/``), so ``dps`` digits suffice at any saturation; mpmath
    numbers have an unbounded exponent, so nothing underflows.

    Returns ``(G, S, log_norm)``: ``G / ||G||`` as float64 (a direction, finite even when
    ``||G||`` underflows float64), ``S / ||G||`` (the sum of the absolute values of the terms
    of each entry, the scale of its rounding error) and ``log ||G||``.
    """
    n, T, d = inst.shape
    with mpmath.workdps(dps):
        G = [[mpmath.mpf(0)] * d for _ in range(d)]
        S = [[mpmath.mpf(0)] * d for _ in range(d)]
        v = [mpmath.mpf(float(c)) for c in inst.v]
        for i in range(n):
            x = [[mpmath.mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
            zi = [mpmath.mpf(float(c)) for c in inst.z[i]]
            q = [mpmath.fsum(mpmath.mpf(float(W[j, k])) * zi[k] for k in range(d)) for j in range(d)]
            lg = [mpmath.fsum(x[t][j] * q[j] for j in range(d)) for t in range(T)]
            m = max(lg)
            e = [mpmath.exp(c - m) for c in lg]
            tot = mpmath.fsum(e)
            s = [c / tot for c in e]
            a = [mpmath.fsum(v[j] * x[t][j] for j in range(d)) for t in range(T)]
            f = mpmath.fsum(s[t] * a[t] for t in range(T))
            u = float(inst.Y[i]) * f
            dl = -1 / (1 + mpmath.exp(u))
            for t in range(T):
                centred = mpmath.fsum(s[w] * (a[t] - a[w]) for w in range(T))
                w_t = dl * float(inst.Y[i]) * s[t] * centred / n
                for j in range(d):
                    for k in range(d):
                        G[j][k] += w_t * x[t][j] * zi[k]
                        S[j][k] += abs(w_t * x[t][j] * zi[k])
        norm = mpmath.sqrt(mpmath.fsum(G[j][k] ** 2 for j in range(d) for k in range(d)))
        Gd = np.array([[float(G[j][k] / norm) for k in range(d)] for j in range(d)])
        Sd = np.array([[float(S[j][k] / norm) for k in range(d)] for j in range(d)])
        return Gd, Sd, float(mpmath.log(norm))


def _logit_error(inst: Instance, W: Any) -> float:
    """First-order rounding bound on the float64 logits: ``2d·eps·max Σ|x||W||z|``."""
    mag = np.einsum("ntj,jk,nk->nt", np.abs(inst.X), np.abs(W), np.abs(inst.z))
    return 2 * inst.d * EPS * float(mag.max())


# ================================================================ typed results
@dataclass(frozen=True)
class SaturationPoint:
    """One (seed, radius) point. ``seed``: the instance's seed; ``radius``: ``r = ||W||_F``;
    ``norm_W``: ``||W||_F`` as computed; ``logit_spread``: ``max_i (max_t − min_t)`` of the logits;
    ``log10_grad_norm``: ``log₁₀ ||∇L||`` (oracle); ``max_weight_gap``: ``max_i (1 − max_t s_it)``.
    The errors against the oracle, NaN where the gradient underflows float64 (below ``_UNDERFLOW``):
    ``stable_rel_err``/``textbook_rel_err`` (max entry error / max ``|∇L|``) and
    ``stable_err_over_bound``/``textbook_err_over_bound`` (max entry error / its rounding bound).
    At every point: ``direction_err`` (max entry error of the log-domain direction),
    ``direction_err_over_bound``, ``log_norm_err`` (``|log||∇L||`` error) and
    ``textbook_direction_err`` (the textbook gradient over its norm; ``inf`` where that is 0/0)."""

    seed: int
    radius: float
    norm_W: float
    logit_spread: float
    log10_grad_norm: float
    max_weight_gap: float
    stable_rel_err: float
    textbook_rel_err: float
    stable_err_over_bound: float
    textbook_err_over_bound: float
    direction_err: float
    direction_err_over_bound: float
    log_norm_err: float
    textbook_direction_err: float


@dataclass(frozen=True)
class SaturationResult:
    """The instance ``shape`` ``(n, T, d)``, the number of ``seeds``, the radii ``scales`` and the
    ``points`` (one :class:`SaturationPoint` per (seed, radius), seed-major: ``seeds · len(scales)``)."""

    shape: tuple[int, int, int]
    seeds: int
    scales: tuple[float, ...]
    points: tuple[SaturationPoint, ...]


@dataclass(frozen=True)
class SaturationSummary:
    """The worst ratios and errors over the points: the stable gradient's (``worst_stable_*``, over the
    ``representable`` points, NaN if none), the direction's (all points), the textbook formula's; the
    number of ``points`` and of those whose gradient underflowed."""

    worst_stable_err_over_bound: float
    worst_direction_err_over_bound: float
    worst_textbook_err_over_bound: float
    worst_textbook_rel_err: float
    worst_stable_rel_err: float
    points: int
    points_gradient_underflowed: int
    representable: int


# ================================================================ compute
@dataclass(frozen=True)
class _GradientErrors:
    """The gradient errors of one :class:`SaturationPoint` (fields of the same names)."""

    stable_rel_err: float = math.nan
    textbook_rel_err: float = math.nan
    stable_err_over_bound: float = math.nan
    textbook_err_over_bound: float = math.nan


def _gradient_errors(inst: Instance, W: Any, Gdir: Any, Srel: Any, norm: float, dl: float) -> _GradientErrors:
    """The four gradient errors of :class:`SaturationPoint` (NaN when ``norm`` underflowed to 0)."""
    if not norm > 0:
        return _GradientErrors()
    T, d = inst.T, inst.d
    # Both float64 forms sum O(T + 2d) rounded terms; the stable form's small weights
    # carry the logits' relative rounding δl as well (error analysis of tests/test_grad.py):
    # |g − G| ≤ 4(δl + (T + 2d)eps)·S entrywise.
    rel_bound = 4 * (dl + (T + 2 * d) * EPS)
    G = Gdir * norm
    S = Srel * norm
    tol = rel_bound * S
    g = risk_grad(inst, W)
    tb = risk_grad_textbook(inst, W)
    return _GradientErrors(
        stable_rel_err=float(np.max(np.abs(g - G)) / np.max(np.abs(G))),
        textbook_rel_err=float(np.max(np.abs(tb - G)) / np.max(np.abs(G))),
        stable_err_over_bound=float(np.max(np.abs(g - G) / tol)),
        textbook_err_over_bound=float(np.max(np.abs(tb - G) / tol)),
    )


def _saturation_point(inst: Instance, W: Any, seed: int, r: float) -> SaturationPoint:
    """Every error of :class:`SaturationPoint` at ``W`` against the 40-digit oracle."""
    T, d = inst.T, inst.d
    dl = _logit_error(inst, W)
    lg = np.einsum("ntd,nd->nt", inst.X, inst.z @ W.T)
    Gdir, Srel, log_norm = _mp_gradient(inst, W)
    norm = math.exp(log_norm) if log_norm > math.log(_UNDERFLOW) else 0.0
    nd = normalized_risk_grad(inst, W)
    # Directions: the log-domain weights carry δl, the factored sums (T + 2d)eps.
    dir_tol = 8 * (dl + (T + 2 * d) * EPS)
    direction_err = float(np.max(np.abs(nd.direction - Gdir)))
    tbg = risk_grad_textbook(inst, W)
    tbn = float(np.linalg.norm(tbg))
    ge = _gradient_errors(inst, W, Gdir, Srel, norm, dl)
    return SaturationPoint(
        seed=seed,
        radius=float(r),
        norm_W=float(np.linalg.norm(W)),
        logit_spread=float(np.ptp(lg, axis=1).max()),
        log10_grad_norm=log_norm / math.log(10),
        # max_i (1 − max_t s_it): how saturated the softmax is
        max_weight_gap=float(max(0.0, float(np.max(-np.expm1(np.max(log_softmax(lg), axis=1)))))),
        stable_rel_err=ge.stable_rel_err,
        textbook_rel_err=ge.textbook_rel_err,
        stable_err_over_bound=ge.stable_err_over_bound,
        textbook_err_over_bound=ge.textbook_err_over_bound,
        direction_err=direction_err,
        direction_err_over_bound=direction_err / dir_tol,
        log_norm_err=abs(nd.log_norm - log_norm),
        textbook_direction_err=(
            float(np.max(np.abs(tbg / tbn - Gdir))) if tbn > 0 and np.isfinite(tbn) else math.inf
        ),
    )


def compute_saturation(
    size: str, seed: int, *, device: str = "cpu", progress: ProgressFn = no_progress
) -> SaturationResult:
    """Every point of the rays ``W = r·U`` of :data:`SATURATION_SIZES` [size]: Gaussian instance of seed
    ``seed + k``, ``U`` of seed ``seed + 1000 + k`` normalised to ``||U||_F = 1``."""
    cfg = SATURATION_SIZES[size]
    n, T, d = cfg["shape"]
    scales = list(cfg["scales"])
    total = cfg["seeds"] * len(scales)
    points: list[SaturationPoint] = []
    for k in range(cfg["seeds"]):
        inst = random_instance(n, T, d, seed=seed + k)
        U = np.random.default_rng(seed + 1000 + k).standard_normal((d, d))
        U /= np.linalg.norm(U)
        for r in scales:
            points.append(_saturation_point(inst, r * U, seed + k, r))
            progress(len(points), total)
    return SaturationResult(shape=(n, T, d), seeds=cfg["seeds"], scales=tuple(scales), points=tuple(points))


# ================================================================ checks
def summarise_saturation(result: SaturationResult) -> SaturationSummary:
    """The worst ratios over ``result.points`` (the stable gradient's over the representable points)."""
    pts = result.points
    fin = [p for p in pts if np.isfinite(p.stable_err_over_bound)]
    return SaturationSummary(
        worst_stable_err_over_bound=max(p.stable_err_over_bound for p in fin) if fin else math.nan,
        worst_direction_err_over_bound=max(p.direction_err_over_bound for p in pts),
        worst_textbook_err_over_bound=max((p.textbook_err_over_bound for p in fin), default=math.nan),
        worst_textbook_rel_err=max((p.textbook_rel_err for p in fin), default=math.nan),
        worst_stable_rel_err=max((p.stable_rel_err for p in fin), default=math.nan),
        points=len(pts),
        points_gradient_underflowed=sum(1 for p in pts if not np.isfinite(p.stable_err_over_bound)),
        representable=len(fin),
    )


def check_saturation(result: SaturationResult, *, size: str) -> list[ExperimentClaim]:
    """``stable-gradient-exact``, ``direction-exact`` (checks: error / bound ≤ 1) and
    ``textbook-loses-digits`` (finding: the textbook error / bound exceeds 1 somewhere)."""
    s = summarise_saturation(result)
    worst_tb = s.worst_textbook_err_over_bound
    return [
        ExperimentClaim(
            name="stable-gradient-exact",
            statement="the cancellation-free gradient is within its float64 rounding bound of the oracle "
            "at every scale where it is representable",
            passed=bool(s.worst_stable_err_over_bound <= 1.0),
            message=f"worst error / bound = {_fmt(s.worst_stable_err_over_bound)} over {s.representable} "
            f"points (worst relative error {_fmt(s.worst_stable_rel_err)})",
            severity="check",
        ),
        ExperimentClaim(
            name="direction-exact",
            statement="the log-domain normalized direction is within its rounding bound of the oracle at "
            "every scale, including where the gradient underflows float64",
            passed=bool(s.worst_direction_err_over_bound <= 1.0),
            message=f"worst error / bound = {_fmt(s.worst_direction_err_over_bound)} over {s.points} "
            f"points, {s.points_gradient_underflowed} with an underflowed gradient",
            severity="check",
        ),
        ExperimentClaim(
            name="textbook-loses-digits",
            statement="the textbook formula leaves its rounding bound at saturation (the reason for the "
            "stable form)",
            passed=bool(np.isfinite(worst_tb) and worst_tb > 1.0),
            message=f"worst textbook error / bound = {_fmt(worst_tb)}, worst relative error "
            f"{_fmt(s.worst_textbook_rel_err)}",
            severity="finding",
        ),
    ]


# ================================================================ tables, numbers, figures
def tables_saturation(result: SaturationResult) -> dict[str, list[dict[str, Any]]]:
    """``errors``: one row per point (the fields of :class:`SaturationPoint`)."""
    return {"errors": [dict(vars(p)) for p in result.points]}


def numbers_saturation(result: SaturationResult) -> dict[str, Any]:
    """The worst ratios and the point counts of :func:`summarise_saturation`."""
    s = summarise_saturation(result)
    return {
        "worst_stable_err_over_bound": s.worst_stable_err_over_bound,
        "worst_direction_err_over_bound": s.worst_direction_err_over_bound,
        "worst_textbook_err_over_bound": s.worst_textbook_err_over_bound,
        "worst_textbook_rel_err": s.worst_textbook_rel_err,
        "worst_stable_rel_err": s.worst_stable_rel_err,
        "points": s.points,
        "points_gradient_underflowed": s.points_gradient_underflowed,
    }


def _band(result: SaturationResult, field: str) -> tuple[list[float], list[float], list[float]]:
    """Median and 10–90 % band of ``field`` over the seeds at each radius (non-finite values dropped)."""
    mat: FloatArray = np.array(
        [[getattr(p, field) for p in result.points if p.radius == xx] for xx in result.scales], dtype=float
    )
    with np.errstate(all="ignore"):
        mat = np.where(np.isfinite(mat), mat, np.nan)
    return _quantiles(mat.T, axis=0)


def figures_saturation(result: SaturationResult) -> list[Figure]:
    """``accuracy``: the gradient's relative error and the direction's error against ``||W||_F``."""
    n, T, d = result.shape
    x = [float(r) for r in result.scales]  # ||W||_F = r since ||U||_F = 1

    def ser(label: str, field: str, style: str) -> Series:
        m, lo, hi = _band(result, field)
        return Series(label, x, m, lo=lo, hi=hi, style=style)

    gradient = Panel(
        "risk gradient: max error / max |∇L|",
        "||W||_F",
        "relative error",
        [ser("cancellation-free", "stable_rel_err", "-o"), ser("textbook", "textbook_rel_err", "-s")],
        xlog=True,
        ylog=True,
    )
    direction = Panel(
        "normalized direction: max entry error",
        "||W||_F",
        "error",
        [
            ser("log-domain", "direction_err", "-o"),
            ser("textbook / its norm", "textbook_direction_err", "-s"),
        ],
        xlog=True,
        ylog=True,
    )
    return [
        Figure(
            "accuracy",
            f"Gradient accuracy against ||W||_F: Gaussian n={n}, T={T}, d={d}; "
            f"median and 10–90% band over {result.seeds} seed(s)",
            [gradient, direction],
            caption="Oracle: the gradient in mpmath at 40 digits. Missing textbook points: "
            "the float64 gradient underflowed to 0 and its direction is 0/0.",
        )
    ]


# ================================================================ the experiment
@register_experiment(
    "saturation",
    "Gradient accuracy at saturation",
    "The closed-form risk gradient (cancellation-free) and the log-domain normalized direction "
    "against a 40-digit mpmath oracle along rays W = r·U, from moderate to fully saturated "
    "softmax, next to the textbook formula `vᵀx_it − f_i` that cancels once s_iα ≈ 1. "
    "Logistic loss.",
    order=10,
)
def saturation_experiment(
    size: str, seed: int, jobs: int, device: str, progress: ProgressFn
) -> ExperimentResult:
    """Gradient accuracy of the stable and textbook formulas against ``||W||``."""
    result = compute_saturation(size, seed, device=device, progress=progress)
    return experiment_result(
        "saturation",
        config=dict(SATURATION_SIZES[size]),
        tables=tables_saturation(result),
        numbers=numbers_saturation(result),
        claims=check_saturation(result, size=size),
        figures=figures_saturation(result),
    )
