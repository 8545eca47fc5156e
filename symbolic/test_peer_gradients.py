"""SymPy proofs of the peer models' gradient formulas and of the ℓp mirror map, tied to the code.

Each statement is decided exactly: a difference of two expressions is reduced to 0 by
``sympy.cancel`` / ``simplify`` over symbols with declared signs (no floating point). The
softmax exponentials ``e^{l_t}`` are differentiated as such and then replaced by positive
symbols ``E_t``, which turns every obligation into a rational identity; the loss is an undefined
function ``ℓ``, so the gradient formulas are proved for every differentiable loss at once.
Then the proved expression, lambdified, is compared with the ``attnsvm`` function at random
float64 points (tolerance named below).

Statements:

1. prompt gradient: ``∂L/∂p = ℓ'(Y f) Y Σ_t s_t (a_t − f) k_t`` for ``f = Σ_t s_t a_t``,
   ``s = softmax(K p)`` (one sequence; the risk is a mean over sequences, so this is the
   general case term by term), sizes ``T = 3, d = 2`` and ``T = 2, d = 3``;
2. cancellation-free form: ``a_t − f = Σ_u s_u (a_t − a_u)``;
3. reparametrisation: the core gradient on ``x'_t = (k_t, a_t)``, ``z' = e_0``, ``v' = e_D``,
   ``W' = [p; 0] e_0ᵀ`` has column 0 equal to ``(∂L/∂p, Σ_t w_t a_t)``, and the core logits and
   values are ``k_tᵀ p`` and ``a_t``;
4. joint head gradient: ``∂L/∂v = ℓ'(Y f) Y Xᵀ s``;
5. mirror map: ``∂/∂w (|w|^p / p) = sign(w)|w|^{p−1}`` (both signs of ``w``), its inverse
   ``sign(u)|u|^{1/(p−1)}`` composes to the identity both ways, and ``1/(p−1) = q − 1`` for
   ``q = p/(p−1)``;
6. Bregman: ``ψ(a) − ψ(b) − ⟨∇ψ(b), a − b⟩`` equals the issue's
   ``(1/p)||a||_p^p + ((p−1)/p)||b||_p^p − ⟨sign(b)|b|^{p−1}, a⟩``, and for ``p = 2`` with unit
   ``a, b`` it is ``1 − ⟨a, b⟩``.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (prompt and joint gradients);
Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (mirror map, Bregman metric).
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import attnsvm as A
from attnsvm.peers import _joint as J
from attnsvm.peers import _mirror as M
from attnsvm.peers import _prompt as P

pytestmark = pytest.mark.timeout(120)

#: Lambdified proved formula vs the code, both float64 on O(1) data: sums of ≤ T·d terms,
#: each exact to a few ulps; 1e-13 relative to the largest entry.
EVAL_RTOL = 1e-13

ell = sp.Function("ell")


def _softmax_setup(T: int, d: int):
    K = sp.Matrix(T, d, lambda t, j: sp.Symbol(f"k{t}{j}", real=True))
    a = sp.Matrix(T, 1, lambda t, _: sp.Symbol(f"a{t}", real=True))
    p = sp.Matrix(d, 1, lambda j, _: sp.Symbol(f"p{j}", real=True))
    Y = sp.Symbol("Y", real=True)
    logits = K * p
    ex = [sp.exp(logits[t]) for t in range(T)]
    Z = sum(ex)
    s = [e / Z for e in ex]
    f = sum(s[t] * a[t] for t in range(T))
    E = [sp.Symbol(f"E{t}", positive=True) for t in range(T)]
    to_E = {ex[t]: E[t] for t in range(T)}
    return K, a, p, Y, s, f, E, to_E


def _rational_zero(expr, to_E) -> bool:
    return sp.cancel(sp.together(expr.subs(to_E))) == 0


@pytest.mark.parametrize("T,d", [(3, 2), (2, 3)])
def test_prompt_gradient_formula(T, d):
    K, a, p, Y, s, f, E, to_E = _softmax_setup(T, d)
    L = ell(Y * f)
    dl = sp.Subs(sp.Derivative(ell(sp.Symbol("u")), sp.Symbol("u")), sp.Symbol("u"), Y * f)
    for j in range(d):
        lhs = sp.diff(L, p[j])
        rhs = dl * Y * sum(s[t] * (a[t] - f) * K[t, j] for t in range(T))
        diff = (lhs - rhs).doit()
        # Both sides hold ℓ' at the one argument Y·f only: name it ``dl`` (sound because it is the
        # same number everywhere), leaving a rational identity in the E_t.
        derivs = diff.atoms(sp.Subs) | diff.atoms(sp.Derivative)
        assert len({sp.srepr(e) for e in diff.atoms(sp.Subs)}) == 1
        diff = diff.replace(lambda e: isinstance(e, (sp.Subs, sp.Derivative)), lambda e: sp.Symbol("dl"))
        assert derivs and _rational_zero(diff, to_E)
        wrong = diff + sp.Symbol("dl") * Y * s[0] * f * K[0, j]  # a dropped term must be caught
        assert not _rational_zero(wrong, to_E)


def test_cancellation_free_identity():
    T = 4
    _, a, _, _, s, f, _, to_E = _softmax_setup(T, 1)
    for t in range(T):
        assert _rational_zero(a[t] - f - sum(s[u] * (a[t] - a[u]) for u in range(T)), to_E)


def test_reparametrisation_to_core_gradient():
    T, D = 3, 2
    K, a, p, Y, s, f, E, to_E = _softmax_setup(T, D)
    dl = sp.Symbol("dl")  # ℓ'(Y f), the same number on both sides once f' = f is shown
    Xp = [sp.Matrix(list(K.row(t)) + [a[t]]) for t in range(T)]  # x'_t = (k_t, a_t)
    zp = sp.Matrix([1] + [0] * D)
    vp = sp.Matrix([0] * D + [1])
    Wp = sp.zeros(D + 1, D + 1)
    for j in range(D):
        Wp[j, 0] = p[j]
    for t in range(T):
        assert sp.expand((Xp[t].T * Wp * zp)[0] - (K.row(t) * p)[0]) == 0  # logits
        assert sp.expand((vp.T * Xp[t])[0] - a[t]) == 0  # values
    core = sp.zeros(D + 1, D + 1)
    for t in range(T):
        core += dl * Y * s[t] * (a[t] - f) * Xp[t] * zp.T
    for j in range(D):
        prompt_j = dl * Y * sum(s[t] * (a[t] - f) * K[t, j] for t in range(T))
        assert _rational_zero(core[j, 0] - prompt_j, to_E)
    assert all(core[i, k] == 0 for i in range(D + 1) for k in range(1, D + 1))  # other columns vanish


def test_joint_head_gradient():
    T, d = 3, 2
    X = sp.Matrix(T, d, lambda t, j: sp.Symbol(f"x{t}{j}", real=True))
    v = sp.Matrix(d, 1, lambda j, _: sp.Symbol(f"v{j}", real=True))
    lg = sp.Matrix(T, 1, lambda t, _: sp.Symbol(f"l{t}", real=True))  # logits do not depend on v
    Y = sp.Symbol("Y", real=True)
    ex = [sp.exp(lg[t]) for t in range(T)]
    s = [e / sum(ex) for e in ex]
    f = sum(s[t] * (X.row(t) * v)[0] for t in range(T))
    to_E = {ex[t]: sp.Symbol(f"E{t}", positive=True) for t in range(T)}
    for j in range(d):
        lhs = sp.diff(ell(Y * f), v[j]).doit()
        lhs = lhs.replace(lambda e: isinstance(e, (sp.Subs, sp.Derivative)), lambda e: sp.Symbol("dl"))
        rhs = sp.Symbol("dl") * Y * sum(s[t] * X[t, j] for t in range(T))
        assert _rational_zero(lhs - rhs, to_E)


# --------------------------------------------------------------------- mirror map
p_ = sp.Symbol("p", positive=True)
r_ = sp.Symbol("r", positive=True)  # r = p − 1 > 0
u_ = sp.Symbol("u", positive=True)


def test_mirror_map_is_gradient_of_potential_both_signs():
    p = 1 + r_
    # w > 0: w = u
    assert sp.simplify(sp.diff(u_**p / p, u_) - u_ ** (p - 1)) == 0
    # w < 0: w = −u, |w| = u, d/dw = −d/du, sign(w) = −1
    assert sp.simplify(-sp.diff(u_**p / p, u_) - (-1) * u_ ** (p - 1)) == 0


def test_inverse_mirror_map_and_dual_exponent():
    p = 1 + r_
    q = p / (p - 1)
    assert sp.simplify(q - 1 - 1 / (p - 1)) == 0
    assert sp.simplify(1 / p + 1 / q - 1) == 0
    # positive branch; the negative one is its odd reflection sign(u)|u|^e
    assert sp.simplify((u_ ** (p - 1)) ** (1 / (p - 1)) - u_) == 0
    assert sp.simplify((u_ ** (1 / (p - 1))) ** (p - 1) - u_) == 0


def test_bregman_forms_agree():
    p = 1 + r_
    n = 2
    a = [sp.Symbol(f"a{i}", positive=True) for i in range(n)]  # |a_i|; signs enter as σ_i below
    b = [sp.Symbol(f"b{i}", positive=True) for i in range(n)]
    for sa in (1, -1):
        for sb in (1, -1):
            A_ = [sa * a[0], a[1]]
            B_ = [sb * b[0], b[1]]
            absA, absB = [a[0], a[1]], [b[0], b[1]]
            grad_b = [sb * b[0] ** (p - 1), b[1] ** (p - 1)]  # sign(b)|b|^{p−1}
            psi_a = sum(x**p for x in absA) / p
            psi_b = sum(x**p for x in absB) / p
            breg = psi_a - psi_b - sum(g * (x - y) for g, x, y in zip(grad_b, A_, B_, strict=True))
            issue = (
                sum(x**p for x in absA) / p
                + (p - 1) / p * sum(x**p for x in absB)
                - sum(g * x for g, x in zip(grad_b, A_, strict=True))
            )
            assert sp.simplify(sp.expand(breg - issue)) == 0
    # p = 2, unit vectors: D = 1 − ⟨a, b⟩
    x = sp.symbols("x0:3", real=True)
    y = sp.symbols("y0:3", real=True)
    D2 = sum(t**2 for t in x) / 2 + sum(t**2 for t in y) / 2 - sum(s * t for s, t in zip(y, x, strict=True))
    unit = {x[2] ** 2: 1 - x[0] ** 2 - x[1] ** 2, y[2] ** 2: 1 - y[0] ** 2 - y[1] ** 2}
    assert sp.expand(D2.subs(unit) - (1 - sum(s * t for s, t in zip(x, y, strict=True)))) == 0


# ---------------------------------------------------------------- the code agrees
def test_code_agrees_with_proved_prompt_gradient():
    rng = np.random.default_rng(20240501)
    T, d = 3, 2
    K, a, p, Y, s, f, _, _ = _softmax_setup(T, d)
    u = sp.Symbol("u")
    logistic_dl = (-1 / (1 + sp.exp(u))).subs(u, Y * f)
    grad = [logistic_dl * Y * sum(s[t] * (a[t] - f) * K[t, j] for t in range(T)) for j in range(d)]
    fn = sp.lambdify([list(K), list(a), list(p), Y], grad, "numpy")
    for _ in range(5):
        X = rng.standard_normal((1, T, d))
        v = rng.standard_normal(d)
        W = rng.standard_normal((d, d))
        pv = rng.standard_normal(d)
        Yv = float(rng.choice([-1.0, 1.0]))
        inst = A.Instance(X, np.array([Yv]), v, None)
        keys = X[0] @ W
        ref = np.array(fn(list(keys.reshape(-1)), list(X[0] @ v), list(pv), Yv), dtype=float)
        got = P.prompt_grad(inst, W, pv)
        assert np.max(np.abs(got - ref)) <= EVAL_RTOL * max(1e-300, np.max(np.abs(ref)))
        # joint head gradient ∂L/∂v = ℓ'(Yf) Y Xᵀ s at the same point
        gv, _ = J.joint_grads(inst, W, v, pv)
        l = keys @ pv
        sm = np.exp(l - l.max()) / np.exp(l - l.max()).sum()
        fv = float(sm @ (X[0] @ v))
        ref_v = -1 / (1 + np.exp(Yv * fv)) * Yv * (X[0].T @ sm)
        assert np.max(np.abs(gv - ref_v)) <= EVAL_RTOL * np.max(np.abs(ref_v))


def test_code_agrees_with_proved_mirror_map():
    rng = np.random.default_rng(20240501)
    for pv in (1.5, 2.0, 3.0):
        W = rng.standard_normal((3, 3))
        w = sp.Symbol("w", real=True)
        fwd = sp.lambdify([w], sp.sign(w) * sp.Abs(w) ** (pv - 1), "numpy")
        assert np.max(np.abs(M.mirror_map(W, pv) - fwd(W))) <= EVAL_RTOL * np.max(np.abs(fwd(W)))
        U = M.mirror_map(W, pv)
        assert np.max(np.abs(M.inverse_mirror_map(U, pv) - W)) <= 64 * np.finfo(float).eps * np.max(np.abs(W))
