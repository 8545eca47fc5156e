"""The mpmath oracle of the risk gradient shared by the unit tests (registered by tests/conftest.py).

``mp_grad`` forms ``∇L`` from the exact float64 inputs at ``ORACLE_DPS`` digits, term by term, in the
centred form ``a_it − f_i = Σ_u s_iu (a_it − a_iu)``; it shares no code with the package.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

#: Digits of the oracle: weights e^−6e95 and values 5.5e-378 are exact in mpmath at any precision (its
#: exponents are unbounded), and the logits (products of doubles of sizes 1e-228 … 1e96) are exact at 400
#: digits, so the sums of terms 1e-600 apart keep > 100 digits.
ORACLE_DPS = 400


def mp_grad(
    X: np.ndarray,
    Y: np.ndarray,
    z: np.ndarray,
    v: np.ndarray,
    W: np.ndarray,
    loss: str,
    mask: np.ndarray | None,
) -> tuple[mpmath.mpf, np.ndarray | None, float]:
    """``(log||∇L||_F, ∇L/||∇L||_F, κ)`` in mpmath from the exact float64 inputs (``(−inf, None, inf)`` for
    ∇L = 0), ``κ = Σ_it |w_it| ||x_it|| ||z_i|| / ||∇L||`` the cancellation of the terms (1 without any).

    ``∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (a_it − f_i) x_it z_iᵀ`` over the allowed tokens (a masked token
    is deleted), ``a_it − f_i`` as ``Σ_u s_iu (a_it − a_iu)`` (exact at any saturation)."""
    n, T, d = X.shape
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        Wm = [[mpf(float(W[j, k])) for k in range(d)] for j in range(d)]
        vm = [mpf(float(c)) for c in v]
        G = [[mpf(0)] * d for _ in range(d)]
        mag = mpf(0)
        for i in range(n):
            toks = [t for t in range(T) if mask is None or mask[i, t]]
            xs = {t: [mpf(float(c)) for c in X[i, t]] for t in toks}
            zi = [mpf(float(c)) for c in z[i]]
            Wz = [mpmath.fsum(Wm[j][k] * zi[k] for k in range(d)) for j in range(d)]
            lg = {t: mpmath.fsum(xs[t][j] * Wz[j] for j in range(d)) for t in toks}
            top = max(lg.values())
            tot = mpmath.fsum(mpmath.exp(lg[t] - top) for t in toks)
            s = {t: mpmath.exp(lg[t] - top) / tot for t in toks}
            a = {t: mpmath.fsum(vm[k] * xs[t][k] for k in range(d)) for t in toks}
            u = float(Y[i]) * mpmath.fsum(s[t] * a[t] for t in toks)
            dl = {
                "logistic": -1 / (1 + mpmath.exp(u)),
                "exponential": -mpmath.exp(-u),
                "correlation": mpf(-1),
            }[loss]
            for t in toks:
                c = mpmath.fsum(s[q] * (a[t] - a[q]) for q in toks)
                w = dl * float(Y[i]) * s[t] * c / n
                mag += abs(w) * mpmath.norm(xs[t]) * mpmath.norm(zi)
                for j in range(d):
                    for k in range(d):
                        G[j][k] += w * xs[t][j] * zi[k]
        nrm = mpmath.sqrt(mpmath.fsum(G[j][k] ** 2 for j in range(d) for k in range(d)))
        if nrm == 0:
            return mpf("-inf"), None, math.inf
        direction = np.array([[float(G[j][k] / nrm) for k in range(d)] for j in range(d)])
        return mpmath.log(nrm), direction, float(mag / nrm)


def mp_risk_and_tokens(
    X: np.ndarray, Y: np.ndarray, z: np.ndarray, v: np.ndarray, W: np.ndarray, loss: str
) -> tuple[float, list[int], float]:
    """``(L(W), r, δu)`` in mpmath from the exact float64 inputs (no mask): the risk ``(1/n) Σ_i ℓ(Y_i f_i)``
    rounded once, the selected tokens ``r_i`` (the first maximiser of the exact logits) and the largest
    ``|Y_i f_i|`` bound ``max_i Σ_t s_it |a_it|`` (the scale of the margins' rounding in float64)."""
    n, T, d = X.shape
    with mpmath.workdps(ORACLE_DPS):
        mpf = mpmath.mpf
        Wm = [[mpf(float(W[j, k])) for k in range(d)] for j in range(d)]
        vm = [mpf(float(c)) for c in v]
        total, tokens, scale = mpf(0), [], mpf(0)
        for i in range(n):
            xs = [[mpf(float(c)) for c in X[i, t]] for t in range(T)]
            zi = [mpf(float(c)) for c in z[i]]
            Wz = [mpmath.fsum(Wm[j][k] * zi[k] for k in range(d)) for j in range(d)]
            lg = [mpmath.fsum(xs[t][j] * Wz[j] for j in range(d)) for t in range(T)]
            top = max(lg)
            tokens.append(lg.index(top))
            tot = mpmath.fsum(mpmath.exp(l - top) for l in lg)
            s = [mpmath.exp(l - top) / tot for l in lg]
            a = [mpmath.fsum(vm[k] * xs[t][k] for k in range(d)) for t in range(T)]
            u = float(Y[i]) * mpmath.fsum(st * at for st, at in zip(s, a, strict=True))
            scale = max(scale, mpmath.fsum(st * abs(at) for st, at in zip(s, a, strict=True)))
            total += {"logistic": mpmath.log1p(mpmath.exp(-u)), "exponential": mpmath.exp(-u)}[loss]
        return float(total / n), tokens, float(scale)
