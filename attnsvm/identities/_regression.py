"""Group 4 of the claims, softmax regression (Gao–Song–Xie): ``du``, ``df``, the gradient, the Hessian
``AᵀB(x)A``, and attention rows as softmax of ``(A₁ ⊗ A₂) vec_r(X)``.
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
from ..model import _tensor as _ten
from ..model._instance import Instance
from ._exact import Obligation, PosExp
from ._helpers import (
    _col,
    _fd_hess,
    _fd_jac,
    _instance,
    _kron,
    _lamb,
    _mat,
    _rel,
    _vec_r,
    _zero,
)
from ._softmax import _jac_formula
from ._tolerances import EVAL_TOL, FD2_TOL, FD_TOL


@cache
def _sr_sym(m: int, k: int) -> tuple[Any, ...]:
    A, x, b = _mat("A", m, k), _col("x", k), _col("b", m)
    U = _col("U", m, positive=True)
    y = A * x
    u = sp.Matrix([PosExp(yi) for yi in y])
    alpha = sum(u, sp.Integer(0))
    f = u / alpha
    c = f - b
    L = (c.T * c)[0, 0] / 2
    sub = {PosExp(yi): Ui for yi, Ui in zip(y, U, strict=True)}
    J = _jac_formula(f)
    grad = A.T * J * c
    fc, ff = (f.T * c)[0, 0], (f.T * f)[0, 0]
    p = sp.Matrix([f[t] * (c[t] + f[t]) for t in range(m)])  # p = f∘(2f − b)
    # B(x) = diag(p) − ⟨f,c⟩diag(f) − p fᵀ − f pᵀ + (2⟨f,c⟩ + ⟨f,f⟩) ffᵀ
    #      = ⟨3f − 2b, f⟩ffᵀ + diag(2f∘f − b∘f) + (⟨f,b⟩ − ⟨f,f⟩)diag(f)
    #        − (2f∘f − b∘f)fᵀ − f(2f∘f − b∘f)ᵀ
    B = sp.diag(*p) - fc * sp.diag(*f) - p * f.T - f * p.T + (2 * fc + ff) * f * f.T
    return A, x, b, u, f, c, L, J, grad, B, sub


def _ob_sr_du(m: int, k: int) -> list[Obligation]:
    A, x, _, u, *_, sub = _sr_sym(m, k)
    Ju = u.jacobian(x)
    return [
        _zero(
            (Ju[:, i] - sp.matrix_multiply_elementwise(u, A[:, i])).xreplace(sub), f"du/dx_{i} − u∘A_(*,{i})"
        )
        for i in range(k)
    ]


def _ob_sr_df(m: int, k: int) -> list[Obligation]:
    A, x, _, _, f, *_, sub = _sr_sym(m, k)
    Jf = f.jacobian(x)
    return [
        _zero(
            (Jf[:, i] - sp.matrix_multiply_elementwise(f, A[:, i]) + (f.T * A[:, i])[0, 0] * f).xreplace(sub),
            f"df/dx_{i} − (f∘A_(*,{i}) − ⟨f, A_(*,{i})⟩f)",
        )
        for i in range(k)
    ]


def _ob_sr_grad(m: int, k: int) -> list[Obligation]:
    _, x, _, _, _, _, L, _, grad, _, sub = _sr_sym(m, k)
    auto = sp.Matrix([sp.diff(L, xi) for xi in x])
    return [_zero((auto - grad).xreplace(sub), "∇L − Aᵀ(diag(f) − ffᵀ)c")]


def _ob_sr_hess(m: int, k: int) -> list[Obligation]:
    A, x, b, _, f, _, L, _, _, B, sub = _sr_sym(m, k)
    H = sp.hessian(L, x)
    fb = sp.matrix_multiply_elementwise(f, b)
    q = 2 * sp.matrix_multiply_elementwise(f, f) - fb
    stated = (
        ((3 * f - 2 * b).T * f)[0, 0] * f * f.T
        + sp.diag(*q)
        + ((f.T * b)[0, 0] - (f.T * f)[0, 0]) * sp.diag(*f)
        - q * f.T
        - f * q.T
    )
    return [
        _zero((H - A.T * B * A).xreplace(sub), "∇²L − AᵀB(x)A"),
        _zero((B - stated).xreplace(sub), "B − (the closed form stated)"),
        _zero((B - B.T).xreplace(sub), "B − Bᵀ"),
    ]


def _sr_code(inst: Instance, x: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Softmax regression through attnsvm: ``f(x) = attention(inst, unvec(x))[0]``, ``L = ½||f − b||²``."""
    d = inst.d
    f = _att.attention(inst, _ten.unvec(x, (d, d)))[0]
    return f, 0.5 * float(np.sum((f - b) ** 2))


def _sr_setup(
    rng: np.random.Generator, T: int, d: int
) -> tuple[Instance, np.ndarray, np.ndarray, np.ndarray]:
    # Sequence 0's logits are A x with A the rows (z ⊗ x_t)ᵀ and x = vec(W) (column-major).
    inst, W = _instance(rng, 1, T, d)
    A = np.stack([np.kron(inst.z[0], inst.X[0, t]) for t in range(T)])
    return inst, A, _ten.vec(W), rng.uniform(0, 1, T)


def _ck_sr(part: str) -> Callable[[np.random.Generator], list[tuple[str, float, float]]]:
    def ck(rng: np.random.Generator) -> list[tuple[str, float, float]]:
        T, d = 3, 2
        As, xs, bs, u, f, c, L, J, grad, B, _ = _sr_sym(T, d * d)
        inst, A, x, b = _sr_setup(rng, T, d)
        out = [
            (
                "f = α⁻¹u vs attnsvm.model._attention(inst, unvec(x))",
                _rel(_sr_code(inst, x, b)[0], _lamb([As, xs], f)(A, x).ravel()),
                EVAL_TOL,
            )
        ]
        if part == "du":
            # u = exp(Ax) with Ax the logits of attnsvm: du/dx by differences of exp(attnsvm.logits)
            fd = _fd_jac(lambda w: np.exp(_att.logits(inst, _ten.unvec(w, (d, d)))[0]), x)
            ref = _lamb([As, xs], u)(A, x).ravel()[:, None] * A
            out.append(("u∘A_(*,i) vs central differences of exp(attnsvm.logits)", _rel(fd, ref), FD_TOL))
        elif part == "df":
            fd = _fd_jac(lambda w: _sr_code(inst, w, b)[0], x)
            fn = _lamb([As, xs], f)(A, x).ravel()
            ref = fn[:, None] * A - np.outer(fn, fn @ A)
            out.append(("f∘A_(*,i) − ⟨f,A_(*,i)⟩f vs central differences of attnsvm", _rel(fd, ref), FD_TOL))
        elif part == "grad":
            fd = _fd_jac(lambda w: np.array([_sr_code(inst, w, b)[1]]), x).ravel()
            out.append(
                (
                    "Aᵀ(diag f − ffᵀ)c vs central differences of attnsvm",
                    _rel(fd, _lamb([As, xs, bs], grad)(A, x, b).ravel()),
                    FD_TOL,
                )
            )
        else:
            fd = _fd_hess(lambda w: _sr_code(inst, w, b)[1], x)
            ref = A.T @ _lamb([As, xs, bs], B)(A, x, b) @ A
            out.append(("AᵀB(x)A vs second differences of attnsvm", _rel(fd, ref), FD2_TOL))
        return out

    return ck


@cache
def _sr_matrix_sym(n: int, T: int, d: int) -> tuple[Any, ...]:
    A1, A2, X = _mat("A1", n, d), _mat("A2", T, d), _mat("X", d, d)
    xr = _col("xr", d * d)  # stands for vec_r(X)
    M = A1 * X * A2.T
    S = sp.Matrix(
        n, T, lambda j, t: PosExp(M[j, t]) / sum((PosExp(M[j, u]) for u in range(T)), sp.Integer(0))
    )
    y = _kron(A1, A2) * xr
    S_kron = sp.Matrix(
        n, T, lambda j, t: PosExp(y[j * T + t]) / sum((PosExp(y[j * T + u]) for u in range(T)), sp.Integer(0))
    )
    return A1, A2, X, xr, M, S, y, S_kron


def _canon_exp(expr: Any, table: dict[Any, Any]) -> Any:
    """Replace each ``PosExp(g)`` by the positive symbol keyed by ``expand(g)`` (created on demand)."""

    def rep(e: Any) -> Any:
        key = sp.expand(e.args[0])
        if key not in table:
            table[key] = sp.Symbol(f"E_{len(table)}", positive=True)
        return table[key]

    return expr.replace(lambda e: isinstance(e, PosExp), rep)


def _ob_sr_matrix(n: int, T: int, d: int) -> list[Obligation]:
    A1, A2, X, xr, M, S, y, S_kron = _sr_matrix_sym(n, T, d)
    sub = dict(zip(xr, _vec_r(X), strict=True))
    table: dict[Any, Any] = {}
    return [
        _zero(_vec_r(M) - y.xreplace(sub), "vec_r(A₁XA₂ᵀ) − (A₁⊗A₂)vec_r(X)"),
        _zero(
            _canon_exp(S, table) - _canon_exp(S_kron.xreplace(sub), table),
            "row j of D⁻¹exp(A₁XA₂ᵀ) − softmax((A₁⊗A₂)_(block j) vec_r X)",
        ),
    ]


def _ck_sr_matrix(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    # Sequences sharing tokens K (T×d) with queries z_i: attention row i = row i of
    # D⁻¹exp(Z Wᵀ Kᵀ), i.e. A₁ = Z, A₂ = K, X = Wᵀ, and vec_r(Wᵀ) = vec(W).
    n, T, d = 2, 3, 2
    A1, A2, _, xr, _, _, _, S_kron = _sr_matrix_sym(n, T, d)
    K, Z, W = rng.uniform(-1, 1, (T, d)), rng.uniform(-1, 1, (n, d)), rng.uniform(-1, 1, (d, d))
    inst = Instance(np.stack([K] * n), np.ones(n), rng.uniform(-1, 1, d), Z)
    ref = _lamb([A1, A2, xr], S_kron)(Z, K, _ten.vec_rowmajor(W.T))
    return [
        (
            "softmax((Z⊗K) vec_r(Wᵀ)) row by row vs attnsvm.model._attention",
            _rel(_att.attention(inst, W), ref),
            EVAL_TOL,
        )
    ]
