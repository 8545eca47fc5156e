"""Group 2 of the claims, softmax calculus: the Jacobian ``diag(s) − ssᵀ``, the cancellation-free
centring, the ½ spectral bound (Gershgorin and exact PSD certificates), ``φ = elu + 1`` and the
normalized-linear Jacobian with its ½ bound.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ..model import _attention as _att
from ..model import _grad
from ..model._instance import Instance
from ._exact import DPhi, Obligation, Phi, PosExp
from ._helpers import (
    _col,
    _fd_jac,
    _instance,
    _lamb,
    _nonneg,
    _pos,
    _rel,
    _zero,
)
from ._tolerances import EVAL_TOL, FD_TOL

HALF = sp.Rational(1, 2)


@cache
def _softmax_sym(T: int) -> tuple[Any, ...]:
    """Logit symbols ``l``, softmax ``s(l)``, its autodiff Jacobian, and the substitution to ``E``."""
    l = _col("l", T)
    E = _col("E", T, positive=True)
    den = sum((PosExp(li) for li in l), sp.Integer(0))
    s = sp.Matrix([PosExp(li) / den for li in l])
    J_auto = s.jacobian(l)
    sub = {PosExp(li): Ei for li, Ei in zip(l, E, strict=True)}
    return l, E, s, J_auto, sub


def _jac_formula(s: sp.Matrix) -> sp.Matrix:
    return sp.diag(*s) - s * s.T


def _ob_softmax_jac(T: int) -> list[Obligation]:
    _, _, s, J_auto, sub = _softmax_sym(T)
    return [_zero((J_auto - _jac_formula(s)).xreplace(sub), "∂softmax(l)/∂l − (diag(s) − ssᵀ)")]


def _logits_grid(rng: np.random.Generator, T: int, scale: float) -> np.ndarray:
    return rng.uniform(-scale, scale, T)


def _ck_softmax_jac(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for T in (3, 4):
        l, _, s, _, _ = _softmax_sym(T)
        fs, fJ = _lamb([l], s), _lamb([l], _jac_formula(s))
        for _ in range(3):
            ln = _logits_grid(rng, T, 3.0)
            out.append(
                (
                    f"softmax s(l) vs attnsvm T={T}",
                    _rel(_att.attention_of(ln, "softmax"), fs(ln).ravel()),
                    EVAL_TOL,
                )
            )
            Jfd = _fd_jac(lambda x: _att.attention_of(x, "softmax"), ln)
            out.append(("diag(s) − ssᵀ vs central differences of attnsvm", _rel(Jfd, fJ(ln)), FD_TOL))
    return out


def _ob_centring(T: int) -> list[Obligation]:
    sf = _col("s", T - 1, positive=True)
    s = sp.Matrix([*sf, 1 - sum(sf, sp.Integer(0))])  # on the simplex: Σ s = 1
    a = _col("a", T)
    f = (s.T * a)[0, 0]
    res = sp.Matrix(
        [a[t] - f - sum((s[u] * (a[t] - a[u]) for u in range(T)), sp.Integer(0)) for t in range(T)]
    )
    return [_zero(res, "a_t − Σ_u s_u a_u − Σ_u s_u (a_t − a_u), Σ s = 1")]


#: Digits of the mpmath oracle of :func:`_ck_centring` (float64 inputs are exact at 40 digits
#: for the products used; every exp/log adds 1e-40 relative, far below EVAL_TOL).
_CENTRING_DPS = 40
#: Saturated points of :func:`_ck_centring` (one sequence): ``W`` is scaled so that the top logit
#: leads the runner-up by 40 (runner-up weight ~e^{−40}: the textbook ``a_t − f`` keeps ~0 of its
#: digits for the top token there, while every term of the centred form stays exact), among draws
#: whose scaled logits stay within ``±_CENTRING_MAX_LOGIT``.
_CENTRING_GAP = 40.0
_CENTRING_MAX_LOGIT = 200.0


def _ck_centring(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    """The proved centred form, evaluated by an independent oracle, against ``attnsvm.risk_grad``.

    Oracle: the right side ``Σ_u s_u (a_t − a_u)`` of the proved identity, lambdified to mpmath
    and evaluated at ``_CENTRING_DPS`` digits with the softmax weights, token values and loss
    derivative computed in mpmath from the exact float64 inputs, assembled into
    ``∇L = (1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it c_it x_it z_iᵀ``. (The left side ``a_t − Σ_u s_u a_u``
    is evaluated the same way against ``risk_grad_textbook`` at moderate ``W``.) Error measure:
    ``max_kj |G − G*| / M_kj``, ``M_kj = Σ_it |ℓ'_i| s_it m_it |x_itk z_ij| / n`` the sum of the terms'
    magnitudes (``m_it = Σ_(u≠t) s_iu (|a_it − a_iu| + |a_it| + |a_iu|)``, which carries the rounding
    of the values; the textbook form's ``m_it = |a_it| + Σ_u s_iu |a_iu|``). Each float64 term is
    within ~(10 + 4d·max|l|)·eps of exact relative to ``M``: ≤ 330 eps at ``|l| ≤ 80``, so
    ``EVAL_TOL`` = 4096 eps holds at saturation, where the textbook form misses it by ~10¹².
    """
    import mpmath

    T, d = 3, 2
    s_sym, a_sym = _col("s", T), _col("a", T)
    right = sp.lambdify(
        [*s_sym, *a_sym],
        [sum((s_sym[u] * (a_sym[t] - a_sym[u]) for u in range(T)), sp.Integer(0)) for t in range(T)],
        modules="mpmath",
    )
    left = sp.lambdify(
        [*s_sym, *a_sym],
        [a_sym[t] - sum((s_sym[u] * a_sym[u] for u in range(T)), sp.Integer(0)) for t in range(T)],
        modules="mpmath",
    )

    def oracle(inst: Instance, W: np.ndarray, textbook: bool) -> tuple[np.ndarray, np.ndarray]:
        n = inst.n
        with mpmath.workdps(_CENTRING_DPS):
            mpf = mpmath.mpf
            G = [[mpf(0)] * d for _ in range(d)]
            M = [[mpf(0)] * d for _ in range(d)]
            for i in range(n):
                x = [[mpf(float(c)) for c in inst.X[i, t]] for t in range(T)]
                z = [mpf(float(c)) for c in inst.z[i]]
                v = [mpf(float(c)) for c in inst.v]
                lg = [
                    mpmath.fsum(x[t][k] * mpf(float(W[k, j])) * z[j] for k in range(d) for j in range(d))
                    for t in range(T)
                ]
                a = [mpmath.fsum(x[t][k] * v[k] for k in range(d)) for t in range(T)]
                top = max(lg)
                e = [mpmath.exp(li - top) for li in lg]
                s = [ei / mpmath.fsum(e) for ei in e]
                f = mpmath.fsum(s[t] * a[t] for t in range(T))
                u = mpf(float(inst.Y[i])) * f
                dl = -1 / (1 + mpmath.exp(u))  # logistic ℓ'(u)
                c = (left if textbook else right)(*s, *a)
                for t in range(T):
                    if textbook:
                        m = abs(a[t]) + mpmath.fsum(s[w] * abs(a[w]) for w in range(T))
                    else:
                        # u = t adds exactly 0 (a_t − a_t = 0 with no rounding): left out.
                        m = mpmath.fsum(
                            s[w] * (abs(a[t] - a[w]) + abs(a[t]) + abs(a[w])) for w in range(T) if w != t
                        )
                    wt = dl * mpf(float(inst.Y[i])) * s[t] * c[t] / n
                    mt = abs(dl) * s[t] * m / n
                    for k in range(d):
                        for j in range(d):
                            G[k][j] += wt * x[t][k] * z[j]
                            M[k][j] += mt * abs(x[t][k] * z[j])
            return (
                np.array([[float(g) for g in row] for row in G]),
                np.array([[float(m) for m in row] for row in M]),
            )

    def err(code: np.ndarray, ref: np.ndarray, mag: np.ndarray) -> float:
        if not np.all(np.isfinite(code)):
            return float("inf")
        return float(np.max(np.abs(code - ref) / np.where(mag > 0, mag, 1.0)))

    def saturated() -> tuple[Instance, np.ndarray]:
        while True:  # a few rng draws: most have a top-two gap ≥ 40·max|l| / _CENTRING_MAX_LOGIT
            inst, W = _instance(rng, 1, T, d)
            lg = np.sort(_att.logits(inst, W)[0])
            gap = float(lg[-1] - lg[-2])
            c = _CENTRING_GAP / gap if gap > 0 else np.inf
            if c * float(np.max(np.abs(lg))) <= _CENTRING_MAX_LOGIT:
                return inst, c * W

    out = []
    for where in ("moderate W, n = 3", "moderate W, n = 3", "saturated W, n = 1", "saturated W, n = 1"):
        inst, W = _instance(rng, 3, T, d) if where.startswith("moderate") else saturated()
        G, M = oracle(inst, W, textbook=False)
        out.append(
            (
                f"Σ_u s_iu(a_it − a_iu) (mpmath) vs attnsvm.risk_grad, {where}",
                err(_grad.risk_grad(inst, W), G, M),
                EVAL_TOL,
            )
        )
    inst, W = _instance(rng, 3, T, d)
    G, M = oracle(inst, W, textbook=True)
    out.append(
        (
            "a_it − Σ_u s_iu a_iu (mpmath) vs attnsvm.risk_grad_textbook, moderate W",
            err(_grad.risk_grad_textbook(inst, W), G, M),
            EVAL_TOL,
        )
    )
    return out


def _ob_gershgorin(T: int) -> list[Obligation]:
    _, E, s_pe, J_auto, sub = _softmax_sym(T)
    J = J_auto.xreplace(sub)
    s = s_pe.xreplace(sub)
    den = sum(E, sp.Integer(0))
    obs = [_zero(J - J.T, "J − Jᵀ (symmetric, so ||J||₂ = ρ(J) ≤ max Gershgorin radius)")]
    for t in range(T):
        others = sum((E[u] for u in range(T) if u != t), sp.Integer(0))
        diag_cert = E[t] * others / den**2  # s_t(1 − s_t), manifestly positive
        obs.append(_zero(J[t, t] - diag_cert, f"J_{t}{t} − s_t Σ_(u≠t) s_u"))
        obs.append(_pos(diag_cert, f"J_{t}{t} > 0"))
        obs.append(_pos(sp.Matrix([E[t] * E[u] / den**2 for u in range(T) if u != t]), f"−J_{t}u > 0 (u≠t)"))
        obs.append(
            _zero(
                sp.Matrix([J[t, u] + E[t] * E[u] / den**2 for u in range(T) if u != t]), f"J_{t}u + s_t s_u"
            )
        )
        absrow = J[t, t] - sum((J[t, u] for u in range(T) if u != t), sp.Integer(0))  # signs proved above
        obs.append(_zero(absrow - 2 * s[t] * (1 - s[t]), f"Σ_u |J_{t}u| − 2 s_t(1 − s_t)"))
        cert = 2 * (s[t] - HALF) ** 2
        obs.append(_zero(HALF - 2 * s[t] * (1 - s[t]) - cert, "½ − 2s_t(1 − s_t) − 2(s_t − ½)²"))
        obs.append(_nonneg(cert, f"2(s_{t} − ½)² ≥ 0"))
    return obs


def _weights_map(kind: str) -> Callable[[np.ndarray], np.ndarray]:
    """``l ↦ s(l)`` through attnsvm's array form, for finite differences."""
    return lambda x: _att.attention_of(x, kind)


def _jac_spectral_checks(rng: np.random.Generator, kind: str, what: str) -> list[tuple[str, float, float]]:
    # A T×T difference Jacobian with entrywise error ≤ FD_TOL has spectral-norm (and row-sum)
    # error ≤ ||E||_F ≤ T·FD_TOL, hence the tolerance FD_TOL·T; logits up to ±30 saturate s.
    out = []
    for T in (2, 3, 5):
        worst = 0.0
        for scale in (0.5, 3.0, 30.0):
            for _ in range(4):
                ln = _logits_grid(rng, T, scale)
                if kind == "normalized_linear":
                    ln = _away_from_zero(ln)
                Jfd = _fd_jac(_weights_map(kind), ln)
                worst = max(worst, float(np.linalg.norm(Jfd, 2)) - 0.5)
        out.append((f"{what}: max(0, ||J_fd(attnsvm {kind})||₂ − ½), T={T}", max(worst, 0.0), FD_TOL * T))
    return out


def _ck_gershgorin(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for T in (3, 4):
        l, _, s, _, _ = _softmax_sym(T)
        rs = _lamb([l], sp.Matrix([2 * si * (1 - si) for si in s]))
        for _ in range(3):
            ln = _logits_grid(rng, T, 3.0)
            Jfd = _fd_jac(lambda x: _att.attention_of(x, "softmax"), ln)
            out.append(
                (
                    f"abs row sums of attnsvm Jacobian vs 2s(1−s), T={T}",
                    _rel(np.abs(Jfd).sum(axis=1), rs(ln).ravel()),
                    FD_TOL * T,
                )
            )
    return out + _jac_spectral_checks(rng, "softmax", "Gershgorin bound")


def _psd_certificates(s: sp.Matrix) -> tuple[sp.Matrix, sp.Matrix]:
    T = s.rows
    lo = sp.zeros(T, T)
    hi = sp.diag(*[2 * (s[t] - HALF) ** 2 for t in range(T)])
    for t in range(T):
        for u in range(t + 1, T):
            e_minus = sp.zeros(T, 1)
            e_minus[t], e_minus[u] = 1, -1
            e_plus = sp.zeros(T, 1)
            e_plus[t], e_plus[u] = 1, 1
            lo += s[t] * s[u] * e_minus * e_minus.T
            hi += s[t] * s[u] * e_plus * e_plus.T
    return lo, hi


def _ob_psd(T: int) -> list[Obligation]:
    _, _, s_pe, J_auto, sub = _softmax_sym(T)
    s = s_pe.xreplace(sub)
    J = J_auto.xreplace(sub)
    lo, hi = _psd_certificates(s)
    coeffs = [s[t] * s[u] for t in range(T) for u in range(t + 1, T)]
    return [
        _zero(J - lo, "J − Σ_(t<u) s_t s_u (e_t − e_u)(e_t − e_u)ᵀ  (so J ≽ 0)"),
        _zero(
            HALF * sp.eye(T) - J - hi,
            "½I − J − [Σ_(t<u) s_t s_u (e_t + e_u)(e_t + e_u)ᵀ + diag(2(s_t − ½)²)]",
        ),
        _pos(coeffs, "s_t s_u > 0"),
        _nonneg([2 * (s[t] - HALF) ** 2 for t in range(T)], "2(s_t − ½)² ≥ 0"),
    ]


def _ck_psd(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for T in (3, 4):
        worst_lo, worst_hi = 0.0, 0.0
        for scale in (0.5, 3.0, 30.0):
            for _ in range(3):
                ln = _logits_grid(rng, T, scale)
                ev = np.linalg.eigvalsh(_fd_jac(lambda x: _att.attention_of(x, "softmax"), ln))
                worst_lo = max(worst_lo, -float(ev.min()))
                worst_hi = max(worst_hi, float(ev.max()) - 0.5)
        out.append((f"−λ_min(J_fd attnsvm softmax), T={T}", max(worst_lo, 0.0), FD_TOL * T))
        out.append((f"λ_max(J_fd attnsvm softmax) − ½, T={T}", max(worst_hi, 0.0), FD_TOL * T))
    return out


def _ob_phi(_: int) -> list[Obligation]:
    x = sp.Symbol("x", real=True)
    p = sp.Symbol("p", positive=True)
    q = sp.Symbol("q", nonnegative=True)
    pos_phi, neg_phi = x + 1, sp.exp(x)
    d_pos = sp.diff(pos_phi, x).subs(x, p)
    d_neg = sp.diff(neg_phi, x).subs(x, -q)
    r_pos = d_pos / pos_phi.subs(x, p)
    r_neg = d_neg / neg_phi.subs(x, -q)
    return [
        _zero(pos_phi.subs(x, 0) - neg_phi.subs(x, 0), "φ continuous at 0"),
        _zero(sp.diff(pos_phi, x).subs(x, 0) - sp.diff(neg_phi, x).subs(x, 0), "φ' continuous at 0 (φ ∈ C¹)"),
        _pos([pos_phi.subs(x, p), neg_phi.subs(x, -q), d_pos, d_neg], "φ > 0 and φ' > 0 on both branches"),
        _zero(pos_phi.subs(x, p) - d_pos - p, "x > 0: φ − φ' = x"),
        _nonneg(p, "x > 0: φ − φ' ≥ 0"),
        _zero(neg_phi.subs(x, -q) - d_neg, "x ≤ 0: φ − φ' = 0"),
        _zero(r_pos - 1 / (1 + p), "x > 0: r = φ'/φ = 1/(1 + x)"),
        _zero(1 - r_pos - p / (1 + p), "x > 0: 1 − r = x/(1 + x)"),
        _pos([1 / (1 + p), p / (1 + p)], "x > 0: 0 < r < 1"),
        _zero(r_neg - 1, "x ≤ 0: r = 1"),
    ]


def _ck_phi(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    x = sp.Symbol("xx", real=True)
    fphi = _lamb([x], Phi(x))
    xs = np.concatenate([rng.uniform(-5, 5, 20), [-1e-3, 1e-3]])
    phi_code = np.exp(_att.log_phi(xs))
    ref = np.array([fphi(np.array([xi])) for xi in xs]).ravel()
    return [("exp(attnsvm.log_phi) vs elu + 1", _rel(phi_code, ref), EVAL_TOL)]


@cache
def _nl_sym(T: int) -> tuple[Any, ...]:
    l = _col("l", T)
    P = _col("P", T, positive=True)
    D = _col("Dp", T, positive=True)
    den = sum((Phi(li) for li in l), sp.Integer(0))
    s = sp.Matrix([Phi(li) / den for li in l])
    J_auto = s.jacobian(l)
    r = sp.Matrix([DPhi(li) / Phi(li) for li in l])
    sr = sp.Matrix([s[t] * r[t] for t in range(T)])
    formula = sp.diag(*sr) - s * sr.T
    sub: dict[Any, Any] = {
        **{Phi(li): Pi for li, Pi in zip(l, P, strict=True)},
        **{DPhi(li): Di for li, Di in zip(l, D, strict=True)},
    }
    return l, s, J_auto, r, formula, sub


def _ob_nl_jac(T: int) -> list[Obligation]:
    _, s, J_auto, r, formula, sub = _nl_sym(T)
    return [
        _zero((J_auto - formula).xreplace(sub), "∂s/∂l − (diag(s∘r) − s(s∘r)ᵀ)"),
        _zero(
            (formula - _jac_formula(s) * sp.diag(*r)).xreplace(sub),
            "diag(s∘r) − s(s∘r)ᵀ − (diag(s) − ssᵀ)diag(r)",
        ),
    ]


def _away_from_zero(x: np.ndarray, gap: float = 1e-3) -> np.ndarray:
    # φ'' jumps at 0, so a central difference straddling 0 has O(h) truncation error.
    return np.where(np.abs(x) < gap, np.where(x < 0, -gap, gap), x)


def _ck_nl_jac(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for T in (3, 4):
        l, s, _, _, formula, _ = _nl_sym(T)
        fs, fJ = _lamb([l], s), _lamb([l], formula)
        for scale in (0.5, 3.0):
            ln = _away_from_zero(_logits_grid(rng, T, scale))
            out.append(
                (
                    f"φ/1ᵀφ vs attnsvm normalized_linear T={T}",
                    _rel(_att.attention_of(ln, "normalized_linear"), fs(ln).ravel()),
                    EVAL_TOL,
                )
            )
            Jfd = _fd_jac(lambda x: _att.attention_of(x, "normalized_linear"), ln)
            out.append(("diag(s∘r) − s(s∘r)ᵀ vs central differences of attnsvm", _rel(Jfd, fJ(ln)), FD_TOL))
    return out


def _ob_nl_bound(T: int) -> list[Obligation]:
    """Per sign pattern of the logits, with φ = elu + 1 substituted branch by branch."""
    obs: list[Obligation] = []
    for mask in range(2**T):
        pos = [(mask >> t) & 1 == 1 for t in range(T)]
        l = [
            sp.Symbol(f"l_{t}", positive=True) if pos[t] else sp.Symbol(f"l_{t}", nonpositive=True)
            for t in range(T)
        ]
        E = [sp.Symbol(f"E_{t}", positive=True) for t in range(T)]
        phi = [l[t] + 1 if pos[t] else PosExp(l[t]) for t in range(T)]
        sub = {PosExp(l[t]): E[t] for t in range(T) if not pos[t]}
        den = sum(phi, sp.Integer(0))
        s = sp.Matrix([ph / den for ph in phi])
        J = s.jacobian(sp.Matrix(l)).xreplace(sub)
        r = [1 / (1 + l[t]) if pos[t] else sp.Integer(1) for t in range(T)]
        sx = s.xreplace(sub)
        tag = "".join("+" if p_ else "−" for p_ in pos)
        obs.append(_zero(J - _jac_formula(sx) * sp.diag(*r), f"signs {tag}: J_nl − (diag(s) − ssᵀ)diag(r)"))
        obs.append(_pos(r, f"signs {tag}: r > 0"))
        obs.append(_nonneg([1 - ri for ri in r if ri != 1] + [sp.Integer(0)], f"signs {tag}: r ≤ 1"))
        obs.append(
            _nonneg([l[t] / (1 + l[t]) for t in range(T) if pos[t]], f"signs {tag}: 1 − r = l/(1 + l) ≥ 0")
        )
        obs.append(
            _zero(
                sp.Matrix([1 - r[t] - l[t] / (1 + l[t]) for t in range(T) if pos[t]] or [0]),
                f"signs {tag}: 1 − r − l/(1 + l)",
            )
        )
        obs.append(_pos(list(sx), f"signs {tag}: s on the open simplex"))
        lo, hi = _psd_certificates(sx)
        obs.append(
            _zero(HALF * sp.eye(T) - _jac_formula(sx) - hi, f"signs {tag}: ½I − (diag(s) − ssᵀ) certificate")
        )
        obs.append(_zero(_jac_formula(sx) - lo, f"signs {tag}: diag(s) − ssᵀ ≽ 0 certificate"))
    return obs


def _ck_nl_bound(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    return _jac_spectral_checks(rng, "normalized_linear", "normalized_linear bound")
