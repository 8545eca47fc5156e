"""``reproduce`` family ``saturation``: Gradient accuracy at saturation."""

from __future__ import annotations

from ..._deps import require

require("mpmath", feature="the saturation family")  # pragma: no mutate

import math
from typing import Any

import mpmath
import numpy as np

from ...model._attention import log_softmax
from ...model._grad import normalized_risk_grad, risk_grad, risk_grad_textbook
from ...model._instance import Instance, random_instance
from ..experiments import FAMILY_REGISTRY, FamilyResult, Figure, Panel, ProgressFn, Series, register_family
from ._common import EPS, _fmt, _quantiles

__all__ = ["SATURATION_SIZES", "saturation_family"]


# ================================================================ family: saturation
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


@register_family(
    "saturation",
    "Gradient accuracy at saturation",
    "The closed-form risk gradient (cancellation-free) and the log-domain normalized direction "
    "against a 40-digit mpmath oracle along rays W = r·U, from moderate to fully saturated "
    "softmax, next to the textbook formula `vᵀx_it − f_i` that cancels once s_iα ≈ 1. "
    "Logistic loss.",
    order=10,
)
def saturation_family(size: str, seed: int, jobs: int, device: str, progress: ProgressFn) -> FamilyResult:
    """Gradient accuracy of the stable and textbook formulas against ``||W||``."""
    cfg = SATURATION_SIZES[size]
    spec = FAMILY_REGISTRY["saturation"]
    res = FamilyResult(spec.name, spec.title, spec.description, config=dict(cfg))
    n, T, d = cfg["shape"]
    scales = list(cfg["scales"])
    total = cfg["seeds"] * len(scales)
    rows: list[dict[str, Any]] = []
    done = 0
    for k in range(cfg["seeds"]):
        inst = random_instance(n, T, d, seed=seed + k)
        U = np.random.default_rng(seed + 1000 + k).standard_normal((d, d))
        U /= np.linalg.norm(U)
        for r in scales:
            W = r * U
            dl = _logit_error(inst, W)
            lg = np.einsum("ntd,nd->nt", inst.X, inst.z @ W.T)
            spread = float(np.ptp(lg, axis=1).max())
            Gdir, Srel, log_norm = _mp_gradient(inst, W)
            norm = math.exp(log_norm) if log_norm > math.log(_UNDERFLOW) else 0.0
            # Both float64 forms sum O(T + 2d) rounded terms; the stable form's small weights
            # carry the logits' relative rounding δl as well (error analysis of tests/test_grad.py):
            # |g − G| ≤ 4(δl + (T + 2d)eps)·S entrywise.
            rel_bound = 4 * (dl + (T + 2 * d) * EPS)
            row: dict[str, Any] = {
                "seed": seed + k,
                "radius": float(r),
                "norm_W": float(np.linalg.norm(W)),
                "logit_spread": spread,
                "log10_grad_norm": log_norm / math.log(10),
                # max_i (1 − max_t s_it): how saturated the softmax is
                "max_weight_gap": float(max(0.0, float(np.max(-np.expm1(np.max(log_softmax(lg), axis=1)))))),
            }
            if norm > 0:
                G = Gdir * norm
                S = Srel * norm
                tol = rel_bound * S
                g = risk_grad(inst, W)
                tb = risk_grad_textbook(inst, W)
                row["stable_rel_err"] = float(np.max(np.abs(g - G)) / np.max(np.abs(G)))
                row["textbook_rel_err"] = float(np.max(np.abs(tb - G)) / np.max(np.abs(G)))
                row["stable_err_over_bound"] = float(np.max(np.abs(g - G) / tol))
                row["textbook_err_over_bound"] = float(np.max(np.abs(tb - G) / tol))
            else:
                row.update(
                    stable_rel_err=math.nan,
                    textbook_rel_err=math.nan,
                    stable_err_over_bound=math.nan,
                    textbook_err_over_bound=math.nan,
                )
            nd = normalized_risk_grad(inst, W)
            # Directions: the log-domain weights carry δl, the factored sums (T + 2d)eps.
            dir_tol = 8 * (dl + (T + 2 * d) * EPS)
            row["direction_err"] = float(np.max(np.abs(nd.direction - Gdir)))
            row["direction_err_over_bound"] = row["direction_err"] / dir_tol
            row["log_norm_err"] = abs(nd.log_norm - log_norm)
            tbg = risk_grad_textbook(inst, W)
            tbn = float(np.linalg.norm(tbg))
            row["textbook_direction_err"] = (
                float(np.max(np.abs(tbg / tbn - Gdir))) if tbn > 0 and np.isfinite(tbn) else math.inf
            )
            rows.append(row)
            done += 1
            progress(done, total)
    res.tables["errors"] = rows
    fin = [r for r in rows if np.isfinite(r["stable_err_over_bound"])]
    worst_stable = max(r["stable_err_over_bound"] for r in fin) if fin else math.nan
    worst_dir = max(r["direction_err_over_bound"] for r in rows)
    worst_tb = max((r["textbook_err_over_bound"] for r in fin), default=math.nan)
    worst_tb_rel = max((r["textbook_rel_err"] for r in fin), default=math.nan)
    underflow = sum(1 for r in rows if not np.isfinite(r["stable_err_over_bound"]))
    res.numbers.update(
        worst_stable_err_over_bound=worst_stable,
        worst_direction_err_over_bound=worst_dir,
        worst_textbook_err_over_bound=worst_tb,
        worst_textbook_rel_err=worst_tb_rel,
        worst_stable_rel_err=max((r["stable_rel_err"] for r in fin), default=math.nan),
        points=len(rows),
        points_gradient_underflowed=underflow,
    )
    res.claim(
        "stable-gradient-exact",
        "the cancellation-free gradient is within its float64 rounding bound of the oracle at every "
        "scale where it is representable",
        worst_stable <= 1.0,
        f"worst error / bound = {_fmt(worst_stable)} over {len(fin)} points "
        f"(worst relative error {_fmt(res.numbers['worst_stable_rel_err'])})",
    )
    res.claim(
        "direction-exact",
        "the log-domain normalized direction is within its rounding bound of the oracle at every scale, "
        "including where the gradient underflows float64",
        worst_dir <= 1.0,
        f"worst error / bound = {_fmt(worst_dir)} over {len(rows)} points, "
        f"{underflow} with an underflowed gradient",
    )
    res.claim(
        "textbook-loses-digits",
        "the textbook formula leaves its rounding bound at saturation (the reason for the stable form)",
        bool(np.isfinite(worst_tb) and worst_tb > 1.0),
        f"worst textbook error / bound = {_fmt(worst_tb)}, worst relative error {_fmt(worst_tb_rel)}",
        severity="finding",
    )
    x = [float(r) for r in scales]  # ||W||_F = r since ||U||_F = 1

    def agg(key: str) -> tuple[list[float], list[float], list[float]]:
        mat = np.array([[r[key] for r in rows if r["radius"] == xx] for xx in x], dtype=float)
        with np.errstate(all="ignore"):
            mat = np.where(np.isfinite(mat), mat, np.nan)
        return _quantiles(mat.T, axis=0)

    def ser(label: str, key: str, style: str) -> Series:
        m, lo, hi = agg(key)
        return Series(label, x, m, lo, hi, style)

    res.figures.append(
        Figure(
            "accuracy",
            f"Gradient accuracy against ||W||_F: Gaussian n={n}, T={T}, d={d}; "
            f"median and 10–90% band over {cfg['seeds']} seed(s)",
            [
                Panel(
                    "risk gradient: max error / max |∇L|",
                    "||W||_F",
                    "relative error",
                    [
                        ser("cancellation-free", "stable_rel_err", "-o"),
                        ser("textbook", "textbook_rel_err", "-s"),
                    ],
                    xlog=True,
                    ylog=True,
                ),
                Panel(
                    "normalized direction: max entry error",
                    "||W||_F",
                    "error",
                    [
                        ser("log-domain", "direction_err", "-o"),
                        ser("textbook / its norm", "textbook_direction_err", "-s"),
                    ],
                    xlog=True,
                    ylog=True,
                ),
            ],
            caption="Oracle: the gradient in mpmath at 40 digits. Missing textbook points: "
            "the float64 gradient underflowed to 0 and its direction is 0/0.",
        )
    )
    return res
