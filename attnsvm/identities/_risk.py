"""Group 3 of the claims: the losses' derivatives and the risk gradient ``∂L/∂W``."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ..model import _grad, _losses
from ..model import _tensor as _ten
from ..model._instance import Instance
from ._exact import Obligation, PosExp
from ._helpers import (
    _col,
    _fd_jac,
    _instance,
    _lamb,
    _mat,
    _pos,
    _rel,
    _to_numeric,
    _zero,
)
from ._tolerances import EVAL_TOL, FD_TOL


def _loss_sym(name: str, u: Any) -> tuple[Any, Any]:
    """``ℓ(u)`` with :class:`PosExp`, and ``ℓ'(u)`` written with ``Q = PosExp(−u)``."""
    Q = PosExp(-u)
    if name == "logistic":
        return sp.log(1 + Q), -Q / (1 + Q)
    if name == "exponential":
        return Q, -Q
    return -u, sp.Integer(-1)


def _code_derivative_sym(name: str, u: Any) -> Any:
    """The derivative in the form attnsvm.model._losses documents."""
    if name == "logistic":
        return -1 / (1 + sp.exp(u))
    if name == "exponential":
        return -sp.exp(-u)
    return sp.Integer(-1)


def _exp_to_symbol(expr: Any, u: Any, q: Any) -> Any:
    """Replace ``exp(k·u)`` (integer ``k``) by ``q^k`` with ``q = e^u > 0``."""

    def rep(e: Any) -> Any:
        k = sp.cancel(e.args[0] / u)
        if not (k.is_Integer):
            raise ValueError(f"cannot express {e} as a power of e^u")
        return q**k

    return expr.replace(lambda e: isinstance(e, sp.exp), rep)


def _ob_loss(name: str) -> Callable[[int], list[Obligation]]:
    def obs(_: int) -> list[Obligation]:
        u = sp.Symbol("u", real=True)
        q = sp.Symbol("q", positive=True)  # q = e^u
        ell, dl_grad = _loss_sym(name, u)
        ell_n, dl_grad_n = _to_numeric(ell), _to_numeric(dl_grad)
        auto = sp.diff(ell_n, u)
        code = _code_derivative_sym(name, u)
        return [
            _zero(_exp_to_symbol(auto - code, u, q), f"d/du ℓ − attnsvm's ℓ' ({name})"),
            _zero(_exp_to_symbol(dl_grad_n - code, u, q), f"ℓ' in e^(−u) form − attnsvm's ℓ' ({name})"),
            _pos(_exp_to_symbol(-code, u, q), f"−ℓ' > 0 ({name})"),
        ]

    return obs


def _ck_loss(name: str) -> Callable[[np.random.Generator], list[tuple[str, float, float]]]:
    def ck(rng: np.random.Generator) -> list[tuple[str, float, float]]:
        u = sp.Symbol("u", real=True)
        ell, dl = _loss_sym(name, u)
        fv, fd = _lamb([u], ell), _lamb([u], dl)
        us = rng.uniform(-20, 20, 25)
        loss = _losses.get_loss(name)
        val = np.array([fv(np.array([x])) for x in us]).ravel()
        der = np.array([fd(np.array([x])) for x in us]).ravel()
        # relative per point: values span e^{±20}
        rel_v = float(np.max(np.abs(loss.value(us) - val) / np.maximum(1.0, np.abs(val))))
        rel_d = float(np.max(np.abs(loss.derivative(us) - der) / np.maximum(1.0, np.abs(der))))
        return [(f"{name} ℓ(u) vs attnsvm", rel_v, EVAL_TOL), (f"{name} ℓ'(u) vs attnsvm", rel_d, EVAL_TOL)]

    return ck


@cache
def _risk_sym(loss: str, n: int, T: int, d: int) -> tuple[Any, ...]:
    X = [_mat(f"x{i}", T, d) for i in range(n)]
    Z = _mat("z", n, d)
    v = _col("v", d)
    Y = _col("Y", n)
    W = _mat("W", d, d)
    E = [[sp.Symbol(f"E_{i}_{t}", positive=True) for t in range(T)] for i in range(n)]
    Qs = [sp.Symbol(f"Q_{i}", positive=True) for i in range(n)]
    sub: dict[Any, Any] = {}
    L = sp.Integer(0)
    G = sp.zeros(d, d)
    for i in range(n):
        zi = Z[i, :].T
        logit = [(X[i][t, :] * W * zi)[0, 0] for t in range(T)]
        den = sum((PosExp(g) for g in logit), sp.Integer(0))
        s = [PosExp(g) / den for g in logit]
        a = [(X[i][t, :] * v)[0, 0] for t in range(T)]
        f = sum((s[t] * a[t] for t in range(T)), sp.Integer(0))
        ell, dl = _loss_sym(loss, Y[i] * f)
        L += ell / n
        for t in range(T):
            G += dl * Y[i] * s[t] * (a[t] - f) * X[i][t, :].T * zi.T / n
            sub[PosExp(logit[t])] = E[i][t]
        sub[PosExp(-Y[i] * f)] = Qs[i]
    grad_auto = sp.Matrix(d, d, lambda j, k: sp.diff(L, W[j, k]))
    return X, Z, v, Y, W, L, G, grad_auto, sub


def _ob_risk(loss: str) -> Callable[[int, int, int], list[Obligation]]:
    def obs(n: int, T: int, d: int) -> list[Obligation]:
        *_, G, grad_auto, sub = _risk_sym(loss, n, T, d)
        return [_zero((grad_auto - G).xreplace(sub), f"∂L/∂W_jk − ∇L formula ({loss})")]

    return obs


def _risk_map(inst: Instance, loss: str) -> Callable[[np.ndarray], np.ndarray]:
    """``vec(W) ↦ [attnsvm.risk(inst, W)]``, for finite differences."""
    d = inst.d
    return lambda w: np.array([_grad.risk(inst, _ten.unvec(w, (d, d)), loss=loss)])


def _ck_risk(loss: str) -> Callable[[np.random.Generator], list[tuple[str, float, float]]]:
    def ck(rng: np.random.Generator) -> list[tuple[str, float, float]]:
        n, T, d = 2, 2, 2
        X, Z, v, Y, W, L, G, _, _ = _risk_sym(loss, n, T, d)
        args = [*X, Z, v, Y, W]
        fL, fG = _lamb(args, L), _lamb(args, G)
        out = []
        for _ in range(3):
            inst, Wn = _instance(rng, n, T, d)
            vals = [*inst.X, inst.z, inst.v, inst.Y, Wn]
            gcode = _grad.risk_grad(inst, Wn, loss=loss)
            out.append((f"∇L formula vs attnsvm.risk_grad ({loss})", _rel(gcode, fG(*vals)), EVAL_TOL))
            out.append(
                (f"L vs attnsvm.risk ({loss})", _rel(_grad.risk(inst, Wn, loss=loss), fL(*vals)), EVAL_TOL)
            )
            fd = _fd_jac(_risk_map(inst, loss), _ten.vec(Wn))
            out.append(
                (
                    "∇L formula vs central differences of attnsvm.risk",
                    _rel(fd.ravel(), _ten.vec(fG(*vals))),
                    FD_TOL,
                )
            )
        return out

    return ck
