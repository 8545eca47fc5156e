"""Group 1 of the claims, the tensor trick: ``vec``/Kronecker identities (column- and row-major),
the bilinear form, ``unvec``, and the Att-SVM's rows and factorised Gram.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ..model import _tensor as _ten
from ..model._instance import Instance
from ._exact import Obligation
from ._helpers import (
    _col,
    _instance,
    _kron,
    _lamb,
    _mat,
    _rel,
    _unvec,
    _unvec_r,
    _vec,
    _vec_r,
    _zero,
)
from ._tolerances import EVAL_TOL


@cache
def _vec_colmajor_sym(p: int, q: int, r: int, s: int) -> tuple[Any, ...]:
    A, M, B = _mat("A", p, q), _mat("M", q, r), _mat("B", r, s)
    return A, M, B, _vec(A * M * B), _kron(B.T, A) * _vec(M)


def _ob_vec_colmajor(p: int, q: int, r: int, s: int) -> list[Obligation]:
    _, _, _, lhs, rhs = _vec_colmajor_sym(p, q, r, s)
    return [_zero(lhs - rhs, "vec(AMB) − (Bᵀ⊗A)vec(M)")]


def _ck_vec_colmajor(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for p, q, r, s in ((2, 3, 2, 2), (3, 2, 3, 2)):
        A, M, B, lhs, rhs = _vec_colmajor_sym(p, q, r, s)
        a, m, b = rng.uniform(-1, 1, (p, q)), rng.uniform(-1, 1, (q, r)), rng.uniform(-1, 1, (r, s))
        kr = _lamb([A, M, B], rhs)(a, m, b).ravel()
        out.append(
            (f"(Bᵀ⊗A)vec(M) vs attnsvm.vec(AMB) {p}x{q}x{r}x{s}", _rel(kr, _ten.vec(a @ m @ b)), EVAL_TOL)
        )
        out.append(("vec(M) vs attnsvm.vec(M)", _rel(_ten.vec(m), _lamb([M], _vec(M))(m).ravel()), EVAL_TOL))
    return out


@cache
def _vec_rowmajor_sym(p: int, q: int, r: int, s: int) -> tuple[Any, ...]:
    A1, X, A2 = _mat("A1", p, q), _mat("X", q, r), _mat("A2", s, r)
    return A1, X, A2, _vec_r(A1 * X * A2.T), _kron(A1, A2) * _vec_r(X)


def _ob_vec_rowmajor(p: int, q: int, r: int, s: int) -> list[Obligation]:
    _, _, _, lhs, rhs = _vec_rowmajor_sym(p, q, r, s)
    return [_zero(lhs - rhs, "vec_r(A₁XA₂ᵀ) − (A₁⊗A₂)vec_r(X)")]


def _ck_vec_rowmajor(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for p, q, r, s in ((2, 3, 2, 3), (3, 2, 3, 2)):
        A1, X, A2, lhs, rhs = _vec_rowmajor_sym(p, q, r, s)
        a1, x, a2 = rng.uniform(-1, 1, (p, q)), rng.uniform(-1, 1, (q, r)), rng.uniform(-1, 1, (s, r))
        kr = _lamb([A1, X, A2], rhs)(a1, x, a2).ravel()
        out.append(
            (
                f"(A₁⊗A₂)vec_r(X) vs attnsvm.vec_rowmajor {p}x{q}x{r}x{s}",
                _rel(kr, _ten.vec_rowmajor(a1 @ x @ a2.T)),
                EVAL_TOL,
            )
        )
    return out


@cache
def _bilinear_sym(d: int, e: int) -> tuple[Any, ...]:
    x, W, z = _col("x", d), _mat("W", d, e), _col("z", e)
    return x, W, z, (x.T * W * z)[0, 0], _kron(z, x)


def _ob_bilinear(d: int, e: int) -> list[Obligation]:
    _, W, _, lhs, kzx = _bilinear_sym(d, e)
    return [_zero(lhs - (kzx.T * _vec(W))[0, 0], "xᵀWz − (z⊗x)ᵀvec(W)")]


def _ck_bilinear(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for d, e in ((2, 3), (3, 3)):
        x, W, z, lhs, kzx = _bilinear_sym(d, e)
        xn, wn, zn = rng.uniform(-1, 1, d), rng.uniform(-1, 1, (d, e)), rng.uniform(-1, 1, e)
        k = _lamb([z, x], kzx)(zn, xn).ravel()
        out.append((f"(z⊗x)·attnsvm.vec(W) vs xᵀWz {d}x{e}", _rel(k @ _ten.vec(wn), xn @ wn @ zn), EVAL_TOL))
    return out


def _ob_frobenius(p: int, q: int) -> list[Obligation]:
    W = _mat("W", p, q)
    fro = sum((w**2 for w in W), sp.Integer(0))
    return [
        _zero(fro - (_vec(W).T * _vec(W))[0, 0], "||W||_F² − ||vec W||²"),
        _zero(fro - (_vec_r(W).T * _vec_r(W))[0, 0], "||W||_F² − ||vec_r W||²"),
    ]


def _ck_frobenius(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    out = []
    for p, q in ((2, 3), (3, 3)):
        W = _mat("W", p, q)
        f = _lamb([W], sp.sqrt(sum((w**2 for w in W), sp.Integer(0))))
        wn = rng.uniform(-1, 1, (p, q))
        out.append(
            (f"||attnsvm.vec(W)|| vs ||W||_F {p}x{q}", _rel(np.linalg.norm(_ten.vec(wn)), f(wn)), EVAL_TOL)
        )
        out.append(
            (
                "||attnsvm.vec_rowmajor(W)|| vs ||W||_F",
                _rel(np.linalg.norm(_ten.vec_rowmajor(wn)), f(wn)),
                EVAL_TOL,
            )
        )
    return out


def _ob_unvec(p: int, q: int) -> list[Obligation]:
    M, w = _mat("M", p, q), _col("w", p * q)
    return [
        _zero(_unvec(_vec(M), p, q) - M, "unvec(vec M) − M"),
        _zero(_vec(_unvec(w, p, q)) - w, "vec(unvec w) − w"),
        _zero(_unvec_r(_vec_r(M), p, q) - M, "unvec_r(vec_r M) − M"),
        _zero(_vec_r(M.T) - _vec(M), "vec_r(Mᵀ) − vec(M)"),
    ]


def _ck_unvec(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    # Pure index permutations: the code must agree bit for bit (tolerance 0).
    out = []
    for p, q in ((2, 3), (3, 2)):
        w = _col("w", p * q)
        mn, wn = rng.uniform(-1, 1, (p, q)), rng.uniform(-1, 1, p * q)
        sym_unvec = _lamb([w], _unvec(w, p, q))(wn)
        out.append(
            (f"attnsvm.unvec(w) vs symbolic unvec {p}x{q}", _rel(_ten.unvec(wn, (p, q)), sym_unvec), 0.0)
        )
        out.append(("attnsvm.unvec(attnsvm.vec(M)) vs M", _rel(_ten.unvec(_ten.vec(mn), (p, q)), mn), 0.0))
        out.append(
            (
                "attnsvm.unvec_rowmajor(w) vs symbolic",
                _rel(_ten.unvec_rowmajor(wn, (p, q)), _lamb([w], _unvec_r(w, p, q))(wn)),
                0.0,
            )
        )
        out.append(
            ("attnsvm.vec_rowmajor(Mᵀ) vs attnsvm.vec(M)", _rel(_ten.vec_rowmajor(mn.T), _ten.vec(mn)), 0.0)
        )
    return out


@cache
def _gram_sym(e: int, d: int) -> tuple[Any, ...]:
    z1, z2, D1, D2 = _col("z", e), _col("zp", e), _col("D", d), _col("Dp", d)
    lhs = (_kron(z1, D1).T * _kron(z2, D2))[0, 0]
    rhs = (z1.T * z2)[0, 0] * (D1.T * D2)[0, 0]
    return z1, z2, D1, D2, lhs, rhs


def _ob_gram(e: int, d: int) -> list[Obligation]:
    *_, lhs, rhs = _gram_sym(e, d)
    return [_zero(lhs - rhs, "⟨z⊗Δ, z'⊗Δ'⟩ − (z·z')(Δ·Δ')")]


def _ck_gram(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    # An n = 2, T = 2 instance with x_i1 = 0 and α = (0, 0) has rows a_i = z_i ⊗ Δ_i, Δ_i = x_i0.
    out = []
    for d in (2, 3):
        z1, z2, D1, D2, lhs, _ = _gram_sym(d, d)
        zn, Dn = rng.uniform(-1, 1, (2, d)), rng.uniform(-1, 1, (2, d))
        X = np.stack([np.stack([Dn[i], np.zeros(d)]) for i in range(2)])
        inst = Instance(X, np.array([1.0, -1.0]), rng.uniform(-1, 1, d), zn)
        alpha = np.array([0, 0])
        K = _ten.svm_gram(inst, alpha)
        f = _lamb([z1, z2, D1, D2], lhs)
        ref = np.array([[f(zn[i], zn[j], Dn[i], Dn[j]) for j in range(2)] for i in range(2)])
        out.append((f"attnsvm.svm_gram vs ⟨z_i⊗Δ_i, z_j⊗Δ_j⟩ d={d}", _rel(K, ref), EVAL_TOL))
        kz = _lamb([z1, D1], _kron(z1, D1))
        rows = np.stack([kz(zn[i], Dn[i]).ravel() for i in range(2)])
        out.append(("attnsvm.svm_rows vs z_i⊗Δ_i", _rel(_ten.svm_rows(inst, alpha), rows), EVAL_TOL))
    return out


@cache
def _svm_sym(n: int, T: int, d: int) -> tuple[Any, ...]:
    X = [_mat(f"x{i}", T, d) for i in range(n)]  # row t of X[i] is x_itᵀ
    Z = _mat("z", n, d)
    W = _mat("W", d, d)
    alpha = [i % T for i in range(n)]
    rows, margins, deltas, queries = [], [], [], []
    for i in range(n):
        zi = Z[i, :].T
        for t in range(T):
            if t == alpha[i]:
                continue
            Di = (X[i][alpha[i], :] - X[i][t, :]).T
            rows.append(_kron(zi, Di).T)
            margins.append((Di.T * W * zi)[0, 0])
            deltas.append(Di)
            queries.append(zi)
    A = sp.Matrix.vstack(*rows)
    m = len(rows)
    G = sp.Matrix(m, m, lambda r, c: (queries[r].T * queries[c])[0, 0] * (deltas[r].T * deltas[c])[0, 0])
    return X, Z, W, alpha, A, sp.Matrix(margins), G


def _ob_svm_rows(n: int, T: int, d: int) -> list[Obligation]:
    _, _, W, _, A, margins, _ = _svm_sym(n, T, d)
    return [_zero(A * _vec(W) - margins, "A vec(W) − [(x_iα − x_it)ᵀ W z_i]")]


def _ck_svm_rows(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    n, T, d = 2, 3, 2
    X, Z, W, alpha, A, margins, _ = _svm_sym(n, T, d)
    inst, Wn = _instance(rng, n, T, d)
    a = np.array(alpha)
    args = [*X, Z]
    vals = [*inst.X, inst.z]
    R = _ten.svm_rows(inst, a)
    return [
        ("attnsvm.svm_rows vs rows z_i⊗(x_iα − x_it)", _rel(R, _lamb(args, A)(*vals)), EVAL_TOL),
        (
            "attnsvm.svm_margins vs (x_iα − x_it)ᵀWz_i",
            _rel(_ten.svm_margins(inst, Wn, a), _lamb([*args, W], margins)(*vals, Wn).ravel()),
            EVAL_TOL,
        ),
        (
            "attnsvm.svm_rows @ attnsvm.vec(W) vs margins",
            _rel(R @ _ten.vec(Wn), _lamb([*args, W], margins)(*vals, Wn).ravel()),
            EVAL_TOL,
        ),
    ]


def _ob_svm_gram(n: int, T: int, d: int) -> list[Obligation]:
    _, _, _, _, A, _, G = _svm_sym(n, T, d)
    return [_zero(A * A.T - G, "A Aᵀ − [(z_i·z_j)(Δ_it·Δ_ju)]")]


def _ck_svm_gram(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    n, T, d = 2, 3, 2
    X, Z, _, alpha, A, _, G = _svm_sym(n, T, d)
    inst, _ = _instance(rng, n, T, d)
    a = np.array(alpha)
    g = _lamb([*X, Z], G)(*inst.X, inst.z)
    R = _ten.svm_rows(inst, a)
    return [
        ("attnsvm.svm_gram vs factorised Gram", _rel(_ten.svm_gram(inst, a), g), EVAL_TOL),
        ("attnsvm.svm_rows Rᵀ-Gram vs factorised Gram", _rel(R @ R.T, g), EVAL_TOL),
    ]
