"""Group 3 of the claims, continued: the sequence-to-sequence model is the flattened masked instance.

``Instance.from_sequences`` turns ``n`` sequences of ``T`` tokens into ``n·T`` single-query rows with
shared tokens and masks; these claims prove that the flattened instance's risk and gradient equal
the sequence-to-sequence ones, causal and not.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ..model import _grad
from ..model import _tensor as _ten
from ..model._instance import Instance
from ._exact import Obligation, PosExp
from ._helpers import _col, _fd_jac, _lamb, _mat, _rel, _zero
from ._risk import _loss_sym, _risk_map
from ._tolerances import EVAL_TOL, FD_TOL


@cache
def _s2s_sym(loss: str, causal: bool, n: int, T: int, d: int) -> tuple[Any, ...]:
    """The sequence-to-sequence risk written directly, and the flattened masked instance's risk and gradient.

    Direct: ``L_s2s = (1/(nT)) Σ_ik ℓ(Y_ik f_ik)``, ``f_ik = Σ_{t∈A_k} s_ikt vᵀx_it``,
    ``s_ikt = e^{x_itᵀ W x_ik} / Σ_{u∈A_k} e^{x_iuᵀ W x_ik}``, ``A_k = {t ≤ k}`` (causal) or all ``t``.
    Flattened (:meth:`attnsvm.Instance.from_sequences`): row ``r = i·T + k`` has tokens ``X'_r = X_i``, query
    ``z'_r = x_ik``, label ``Y'_r = Y_ik`` and 0/1 mask ``m_rt = [t ∈ A_k]``; its masked model (masked weight 0)
    is ``s'_rt = m_rt e^{l'_rt} / Σ_u m_ru e^{l'_ru}``, ``L_flat = (1/N) Σ_r ℓ(Y'_r f'_r)`` with ``N = nT`` and
    ``∇L_flat = (1/N) Σ_r ℓ'(Y'_r f'_r) Y'_r Σ_t s'_rt (vᵀx'_rt − f'_r) x'_rt z'_rᵀ`` (``risk_grad``'s formula).
    """
    X = [_mat(f"x{i}", T, d) for i in range(n)]
    v = _col("v", d)
    Y = _mat("Y", n, T)
    W = _mat("W", d, d)
    allowed = [[(t <= k) if causal else True for t in range(T)] for k in range(T)]
    sub: dict[Any, Any] = {}
    # the sequence-to-sequence model, directly
    L = sp.Integer(0)
    for i in range(n):
        for k in range(T):
            ts = [t for t in range(T) if allowed[k][t]]
            lg = {t: (X[i][t, :] * W * X[i][k, :].T)[0, 0] for t in ts}
            den = sum((PosExp(lg[t]) for t in ts), sp.Integer(0))
            f = sum((PosExp(lg[t]) / den * (X[i][t, :] * v)[0, 0] for t in ts), sp.Integer(0))
            L += _loss_sym(loss, Y[i, k] * f)[0] / (n * T)
            for t in ts:
                sub[PosExp(lg[t])] = sp.Symbol(f"E_{i}_{k}_{t}", positive=True)
            sub[PosExp(-Y[i, k] * f)] = sp.Symbol(f"Q_{i}_{k}", positive=True)
    # the flattened instance by its index map, with the mask as a 0/1 factor
    N = n * T
    Xf = [X[r // T] for r in range(N)]
    Zf = [X[r // T][r % T, :].T for r in range(N)]
    Yf = [Y[r // T, r % T] for r in range(N)]
    Mf = [[sp.Integer(1 if allowed[r % T][t] else 0) for t in range(T)] for r in range(N)]
    Lf = sp.Integer(0)
    G = sp.zeros(d, d)
    for r in range(N):
        lf = [(Xf[r][t, :] * W * Zf[r])[0, 0] for t in range(T)]
        den = sum((Mf[r][t] * PosExp(lf[t]) for t in range(T)), sp.Integer(0))
        s = [Mf[r][t] * PosExp(lf[t]) / den for t in range(T)]
        a = [(Xf[r][t, :] * v)[0, 0] for t in range(T)]
        f = sum((s[t] * a[t] for t in range(T)), sp.Integer(0))
        ell, dl = _loss_sym(loss, Yf[r] * f)
        Lf += ell / N
        for t in range(T):
            G += dl * Yf[r] * s[t] * (a[t] - f) * Xf[r][t, :].T * Zf[r].T / N
    grad_auto = sp.Matrix(d, d, lambda j, k: sp.diff(L, W[j, k]))
    return X, v, Y, W, L, Lf, G, grad_auto, sub


def _ob_s2s(loss: str, causal: bool) -> Callable[[int, int, int], list[Obligation]]:
    def obs(n: int, T: int, d: int) -> list[Obligation]:
        *_, L, Lf, G, grad_auto, sub = _s2s_sym(loss, causal, n, T, d)
        kind = "causal" if causal else "full"
        return [
            _zero((L - Lf).xreplace(sub), f"L_s2s − L of the flattened masked instance ({kind}, {loss})"),
            _zero(
                (grad_auto - G).xreplace(sub),
                f"∂L_s2s/∂W_jk − the flattened masked ∇L formula ({kind}, {loss})",
            ),
        ]

    return obs


def _ck_s2s(loss: str, causal: bool) -> Callable[[np.random.Generator], list[tuple[str, float, float]]]:
    def ck(rng: np.random.Generator) -> list[tuple[str, float, float]]:
        n, T, d = 1, 3, 2
        X, v, Y, W, L, _, G, _, _ = _s2s_sym(loss, causal, n, T, d)
        args = [*X, v, Y, W]
        fL, fG = _lamb(args, L), _lamb(args, G)
        out = []
        for _ in range(3):
            Xn, vn = rng.uniform(-1, 1, (n, T, d)), rng.uniform(-1, 1, d)
            Yn = rng.choice(np.array([-1.0, 1.0]), size=(n, T))
            Wn = rng.uniform(-1, 1, (d, d))
            inst = Instance.from_sequences(Xn, Yn, vn, causal=causal)
            vals = [*Xn, vn, Yn, Wn]
            out.append(
                (
                    f"L_s2s vs attnsvm.risk(from_sequences) ({loss})",
                    _rel(_grad.risk(inst, Wn, loss=loss), fL(*vals)),
                    EVAL_TOL,
                )
            )
            out.append(
                (
                    f"∇L_s2s vs attnsvm.risk_grad(from_sequences) ({loss})",
                    _rel(_grad.risk_grad(inst, Wn, loss=loss), fG(*vals)),
                    EVAL_TOL,
                )
            )
            fd = _fd_jac(_risk_map(inst, loss), _ten.vec(Wn))
            out.append(
                (
                    "∇L_s2s vs central differences of attnsvm.risk",
                    _rel(fd.ravel(), _ten.vec(fG(*vals))),
                    FD_TOL,
                )
            )
        return out

    return ck
