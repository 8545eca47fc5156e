"""Group 5 of the claims: the Jacobians with respect to ``W`` behind the Lipschitz constants (linear
attention exactly linear; softmax and normalized-linear factor through the linear Jacobian).
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
from ._exact import DPhi, Obligation, Phi, PosExp
from ._helpers import (
    _col,
    _fd_jac,
    _instance,
    _kron,
    _lamb,
    _mat,
    _rel,
    _unvec,
    _zero,
)
from ._softmax import _jac_formula
from ._tolerances import EVAL_TOL, FD_TOL


@cache
def _lip_sym(n: int, T: int, d: int) -> tuple[Any, ...]:
    X = [_mat(f"x{i}", T, d) for i in range(n)]
    Z = _mat("z", n, d)
    v = _col("v", d)
    w = _col("w", d * d)  # w = vec(W)
    W = _unvec(w, d, d)
    logit, K, a = [], [], []
    for i in range(n):
        zi = Z[i, :].T
        logit.append(sp.Matrix([(X[i][t, :] * W * zi)[0, 0] for t in range(T)]))
        K.append(sp.Matrix.vstack(*[_kron(zi, X[i][t, :].T).T for t in range(T)]))
        a.append(sp.Matrix([(X[i][t, :] * v)[0, 0] for t in range(T)]))
    return X, Z, v, w, logit, K, a


def _ob_lin_weights(n: int, T: int, d: int) -> list[Obligation]:
    _, _, _, w, logit, K, _ = _lip_sym(n, T, d)
    l = sp.Matrix.vstack(*logit)
    Kall = sp.Matrix.vstack(*K)
    return [
        _zero(l.jacobian(w) - Kall, "∂l/∂vec(W) − [(z_i⊗x_it)ᵀ]"),
        _zero(l - Kall * w, "l − K vec(W) (exactly linear: the Lipschitz constant is ||K||₂)"),
    ]


def _lip_setup(
    rng: np.random.Generator, n: int, T: int, d: int
) -> tuple[Instance, np.ndarray, list[Any], list[Any]]:
    X, Z, v, w, *_ = _lip_sym(n, T, d)
    inst, W = _instance(rng, n, T, d)
    return inst, W, [*X, Z, v, w], [*inst.X, inst.z, inst.v, _ten.vec(W)]


def _code_map(inst: Instance, what: str, kind: str) -> Callable[[np.ndarray], np.ndarray]:
    d = inst.d
    if what == "weights":
        return lambda w: _att.attention(inst, _ten.unvec(w, (d, d)), kind=kind).ravel()
    return lambda w: _att.output(inst, _ten.unvec(w, (d, d)), kind=kind)


def _ck_lin_weights(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    n, T, d = 2, 2, 2
    *_, logit, K, _ = _lip_sym(n, T, d)
    inst, W, args, vals = _lip_setup(rng, n, T, d)
    Kn = _lamb(args, sp.Matrix.vstack(*K))(*vals)
    fd = _fd_jac(_code_map(inst, "weights", "linear"), _ten.vec(W))
    return [
        (
            "K vec(W) vs attnsvm.model._attention(kind='linear')",
            _rel(_att.attention(inst, W, kind="linear").ravel(), Kn @ _ten.vec(W)),
            EVAL_TOL,
        ),
        ("K vs central differences of attnsvm linear weights", _rel(fd, Kn), FD_TOL),
    ]


def _lin_output_formula(logit: list[Any], K: list[Any], a: list[Any]) -> tuple[Any, Any]:
    f = sp.Matrix([(logit[i].T * a[i])[0, 0] for i in range(len(logit))])
    Jf = sp.Matrix.vstack(*[a[i].T * K[i] for i in range(len(logit))])
    return f, Jf


def _ob_lin_output(n: int, T: int, d: int) -> list[Obligation]:
    X, Z, v, w, logit, K, a = _lip_sym(n, T, d)
    f, Jf = _lin_output_formula(logit, K, a)
    alt = sp.Matrix.vstack(*[_kron(Z[i, :].T, X[i].T * X[i] * v).T for i in range(n)])
    return [
        _zero(f.jacobian(w) - Jf, "∂f_i/∂vec(W) − Σ_t a_it (z_i⊗x_it)ᵀ"),
        _zero(Jf - alt, "Σ_t a_it (z_i⊗x_it)ᵀ − (z_i⊗X_iᵀX_i v)ᵀ"),
        _zero(f - Jf * w, "f − J_f vec(W) (exactly linear)"),
    ]


def _ck_lin_output(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    n, T, d = 2, 2, 2
    *_, logit, K, a = _lip_sym(n, T, d)
    inst, W, args, vals = _lip_setup(rng, n, T, d)
    f, Jf = _lin_output_formula(logit, K, a)
    fd = _fd_jac(_code_map(inst, "output", "linear"), _ten.vec(W))
    return [
        (
            "f vs attnsvm.output(kind='linear')",
            _rel(_att.output(inst, W, kind="linear"), _lamb(args, f)(*vals).ravel()),
            EVAL_TOL,
        ),
        ("J_f vs central differences of attnsvm", _rel(fd, _lamb(args, Jf)(*vals)), FD_TOL),
    ]


@cache
def _soft_W_sym(n: int, T: int, d: int, kind: str) -> tuple[Any, ...]:
    X, Z, v, w, logit, K, a = _lip_sym(n, T, d)
    blocks_s, blocks_J, fs, Jfs = [], [], [], []
    sub: dict[Any, Any] = {}
    for i in range(n):
        if kind == "softmax":
            den = sum((PosExp(g) for g in logit[i]), sp.Integer(0))
            s = sp.Matrix([PosExp(g) / den for g in logit[i]])
            r = sp.ones(T, 1)
            Jl = _jac_formula(s)
            for t, g in enumerate(logit[i]):
                sub[PosExp(g)] = sp.Symbol(f"E_{i}_{t}", positive=True)
        else:
            den = sum((Phi(g) for g in logit[i]), sp.Integer(0))
            s = sp.Matrix([Phi(g) / den for g in logit[i]])
            r = sp.Matrix([DPhi(g) / Phi(g) for g in logit[i]])
            sr = sp.Matrix([s[t] * r[t] for t in range(T)])
            Jl = sp.diag(*sr) - s * sr.T
            for t, g in enumerate(logit[i]):
                sub[Phi(g)] = sp.Symbol(f"P_{i}_{t}", positive=True)
                sub[DPhi(g)] = sp.Symbol(f"D_{i}_{t}", positive=True)
        blocks_s.append(s)
        blocks_J.append(Jl)
        f = (s.T * a[i])[0, 0]
        fs.append(f)
        Jfs.append(sum(((s[t] * r[t] * (a[i][t] - f)) * K[i][t, :] for t in range(T)), sp.zeros(1, d * d)))
    return (
        X,
        Z,
        v,
        w,
        sp.Matrix.vstack(*blocks_s),
        sp.diag(*blocks_J) * sp.Matrix.vstack(*K),
        sp.Matrix(fs),
        sp.Matrix.vstack(*Jfs),
        sub,
    )


def _ob_W_weights(kind: str) -> Callable[[int, int, int], list[Obligation]]:
    def obs(n: int, T: int, d: int) -> list[Obligation]:
        _, _, _, w, s, J, _, _, sub = _soft_W_sym(n, T, d, kind)
        what = "(diag(s_i) − s_i s_iᵀ)" if kind == "softmax" else "(diag(s_i∘r_i) − s_i(s_i∘r_i)ᵀ)"
        return [_zero((s.jacobian(w) - J).xreplace(sub), f"∂s/∂vec(W) − blockdiag_i {what} · K")]

    return obs


def _ob_W_output(kind: str) -> Callable[[int, int, int], list[Obligation]]:
    def obs(n: int, T: int, d: int) -> list[Obligation]:
        _, _, _, w, _, _, f, Jf, sub = _soft_W_sym(n, T, d, kind)
        what = "s_it" if kind == "softmax" else "s_it r_it"
        return [
            _zero((f.jacobian(w) - Jf).xreplace(sub), f"∂f_i/∂vec(W) − Σ_t {what}(a_it − f_i)(z_i⊗x_it)ᵀ")
        ]

    return obs


def _ck_W(kind: str, what: str) -> Callable[[np.random.Generator], list[tuple[str, float, float]]]:
    def ck(rng: np.random.Generator) -> list[tuple[str, float, float]]:
        n, T, d = 2, 2, 2
        X, Z, v, w, s, J, f, Jf, _ = _soft_W_sym(n, T, d, kind)
        args = [*X, Z, v, w]
        value, jac = (s, J) if what == "weights" else (f, Jf)
        f_value, f_jac = _lamb(args, value), _lamb(args, jac)
        code_name = "attention" if what == "weights" else "output"
        out = []
        for _ in range(3):
            inst, W = _instance(rng, n, T, d)
            if kind == "normalized_linear" and np.min(np.abs(_att.logits(inst, W))) < 1e-3:
                continue  # φ'' jumps at 0: a difference straddling it has O(h) error
            vals = [*inst.X, inst.z, inst.v, _ten.vec(W)]
            code = _code_map(inst, what, kind)
            out.append(
                (
                    f"{what} vs attnsvm.{code_name}({kind})",
                    _rel(code(_ten.vec(W)), f_value(*vals).ravel()),
                    EVAL_TOL,
                )
            )
            fd = _fd_jac(code, _ten.vec(W))
            out.append(
                (f"∂{what}/∂vec(W) formula vs central differences ({kind})", _rel(fd, f_jac(*vals)), FD_TOL)
            )
        return out

    return ck
