"""Helpers shared by the claims: concrete forms of the unevaluated functions for lambdify, symbolic
matrices, ``vec``/Kronecker by their index formulas, lambdify over symbol groups, the relative
error, finite differences, random instances, and the obligation constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ..model._instance import Instance
from ._exact import DPhi, Obligation, Phi, PosExp
from ._tolerances import FD2_STEP, FD_STEP


def _elu1(a: Any) -> Any:
    """``φ = elu + 1``: ``a + 1`` for ``a > 0``, ``exp(a)`` for ``a ≤ 0``."""
    return sp.Piecewise((a + 1, a > 0), (sp.exp(a), True))


def _delu1(a: Any) -> Any:
    """``φ' = 1`` for ``a > 0``, ``exp(a)`` for ``a ≤ 0``."""
    return sp.Piecewise((sp.Integer(1), a > 0), (sp.exp(a), True))


def _to_numeric(expr: Any) -> Any:
    """Replace the unevaluated functions by their concrete forms (``φ = elu + 1``) for lambdify."""
    return expr.replace(PosExp, sp.exp).replace(DPhi, _delu1).replace(Phi, _elu1)


def _mat(name: str, r: int, c: int, **assume: Any) -> sp.Matrix:
    assume = assume or {"real": True}
    return sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{name}_{i}_{j}", **assume))


def _col(name: str, r: int, **assume: Any) -> sp.Matrix:
    assume = assume or {"real": True}
    return sp.Matrix(r, 1, lambda i, j: sp.Symbol(f"{name}_{i}", **assume))


def _vec(M: sp.Matrix) -> sp.Matrix:
    """Column-major ``vec``: ``vec(M)[j·p + k] = M[k, j]`` (defined by its index formula)."""
    p, q = M.shape
    return sp.Matrix(p * q, 1, lambda r, _: M[r % p, r // p])


def _vec_r(M: sp.Matrix) -> sp.Matrix:
    """Row-major ``vec_r``: ``vec_r(M)[k·q + j] = M[k, j]``."""
    p, q = M.shape
    return sp.Matrix(p * q, 1, lambda r, _: M[r // q, r % q])


def _unvec(w: sp.Matrix, p: int, q: int) -> sp.Matrix:
    return sp.Matrix(p, q, lambda k, j: w[j * p + k])


def _unvec_r(w: sp.Matrix, p: int, q: int) -> sp.Matrix:
    return sp.Matrix(p, q, lambda k, j: w[k * q + j])


def _kron(A: sp.Matrix, B: sp.Matrix) -> sp.Matrix:
    """``(A ⊗ B)[i·p + k, j·q + l] = A[i, j] B[k, l]`` for ``B`` of shape ``(p, q)``."""
    p, q = B.shape
    return sp.Matrix(A.rows * p, A.cols * q, lambda r, c: A[r // p, c // q] * B[r % p, c % q])


def _flat(*ms: Any) -> list[Any]:
    out: list[Any] = []
    for m in ms:
        out.extend(list(m) if isinstance(m, (sp.MatrixBase, list, tuple)) else [m])
    return out


def _lamb(args: Sequence[Any], expr: Any) -> Callable[..., np.ndarray]:
    """Lambdify ``expr`` in the symbol groups ``args``; the result takes one array per group
    (flattened in C order, matching SymPy's row-major iteration of a Matrix)."""
    groups = [_flat(a) for a in args]
    f = sp.lambdify(_flat(*groups), _to_numeric(expr), modules="numpy")

    def call(*arrays: Any) -> np.ndarray:
        vals: list[float] = []
        for g, a in zip(groups, arrays, strict=True):
            flat = np.ravel(np.asarray(a, dtype=np.float64))
            assert flat.size == len(g), (flat.size, len(g))
            vals.extend(flat.tolist())
        return np.array(f(*vals), dtype=np.float64)

    return call


def _rel(a: Any, b: Any) -> float:
    """``max|a − b| / max(1, max|b|)``; ``inf`` on shape mismatch or non-finite values."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        a = a.reshape(-1)
        b = b.reshape(-1)
        if a.shape != b.shape:
            return float("inf")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def _fd_jac(fun: Callable[[np.ndarray], np.ndarray], x: np.ndarray, h: float = FD_STEP) -> np.ndarray:
    """Central-difference Jacobian ``∂fun/∂x``, shape ``(len(fun(x)), len(x))``."""
    cols = []
    for j in range(x.size):
        e = np.zeros_like(x)
        e[j] = h
        cols.append((np.ravel(fun(x + e)) - np.ravel(fun(x - e))) / (2 * h))
    return np.stack(cols, axis=1)


def _fd_hess(fun: Callable[[np.ndarray], float], x: np.ndarray, h: float = FD2_STEP) -> np.ndarray:
    """Second-difference Hessian of a scalar function."""
    k = x.size
    H = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            ei = np.zeros(k)
            ej = np.zeros(k)
            ei[i] = h
            ej[j] = h
            H[i, j] = (fun(x + ei + ej) - fun(x + ei - ej) - fun(x - ei + ej) + fun(x - ei - ej)) / (
                4 * h * h
            )
    return H


def _instance(rng: np.random.Generator, n: int, T: int, d: int) -> tuple[Instance, np.ndarray]:
    """Cross-attention instance and a ``W`` with entries in ``U[−1, 1]`` (labels ±1)."""
    X = rng.uniform(-1, 1, (n, T, d))
    z = rng.uniform(-1, 1, (n, d))
    v = rng.uniform(-1, 1, d)
    Y = rng.choice(np.array([-1.0, 1.0]), size=n)
    W = rng.uniform(-1, 1, (d, d))
    return Instance(X, Y, v, z), W


def _zero(expr: Any, what: str) -> Obligation:
    return Obligation("zero", expr, what)


def _pos(expr: Any, what: str) -> Obligation:
    return Obligation("pos", expr, what)


def _nonneg(expr: Any, what: str) -> Obligation:
    return Obligation("nonneg", expr, what)
