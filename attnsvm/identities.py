"""The identities behind the theory, as named claims proved exactly with SymPy and tied to the code.

Each :class:`Claim` states one identity or bound (with its equation), the sizes it is proved
at, and two procedures:

* :meth:`Claim.prove` decides the statement **exactly**: every obligation is either an
  expression that must reduce to 0 (``cancel``/``expand`` of a rational function, entrywise,
  then ``is_zero_matrix``) or a certificate that SymPy's assumption system sees as positive or
  nonnegative from its structure (a square, a product of positive symbols). Exponentials are
  handled by :class:`PosExp`, an unevaluated ``exp`` with ``exp' = exp`` that SymPy never
  merges or rewrites; after differentiation each ``PosExp(g)`` is replaced by an independent
  positive symbol, so an identity proved for all positive values holds in particular at
  ``exp(g)``. No numeric ``equals`` is ever used.
* :meth:`Claim.check_code` lambdifies the proved expression and compares it with the
  corresponding ``attnsvm`` function at random float64 points, returning the largest error and
  the tolerance it is held to (named constants below, each justified). Functions are looked
  up on their modules at call time, so a wrong convention (a transposed ``W``, a row-major
  ``vec``, swapped Kronecker factors) monkeypatched into ``attnsvm`` makes the check fail.

The ordered registry :data:`CLAIMS` and :func:`prove_all` serve ``symbolic/`` (one test per
claim) and ``attnsvm check`` / ``attnsvm reproduce``.

Conventions (the package's, see ``docs/theory.md``): ``vec`` stacks columns, ``vec(M)[j·p + k] = M[k, j]``; Kronecker
``(A ⊗ B)[i·p + k, j·q + l] = A[i, j] B[k, l]``; logits ``l_it = x_itᵀ W z_i``.

References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick, softmax regression and its
Hessian); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, risk gradient);
Kim, Papamakarios, Mnih, ICML 2021 (Lipschitz constants of attention); Katharopoulos et al.,
ICML 2020 (``φ = elu + 1``).
"""

from __future__ import annotations

from ._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import sympy as sp

from .errors import unknown_name
from .model import _attention as _att
from .model import _grad, _losses
from .model import _tensor as _ten
from .model._instance import Instance

__all__ = [
    "PosExp",
    "Phi",
    "DPhi",
    "Obligation",
    "ProofResult",
    "CodeCheck",
    "Claim",
    "ClaimReport",
    "CLAIMS",
    "claim_names",
    "get_claim",
    "prove_all",
    "decide",
    "EVAL_TOL",
    "FD_STEP",
    "FD_TOL",
    "FD2_STEP",
    "FD2_TOL",
]

EPS = float(np.finfo(np.float64).eps)

#: Closed form (lambdified SymPy) against attnsvm's vectorised NumPy, relative to
#: ``max(1, max|reference|)``. Both evaluate the same O(1)-sized expression (data drawn from
#: ``U[−1, 1]``, logits ``|l| ≤ d² ≤ 9``) with at most ~100 flops per entry; each flop adds
#: ≤ eps relative error to a partial sum bounded by the scale, and ``exp``/``log`` add
#: ≤ eps·|argument|, so each side is within ~200 eps of the exact value. 4096 eps (9.1e-13)
#: is a 10× margin, and still ~10¹² below the O(1) change a wrong convention makes.
EVAL_TOL = 2.0**12 * EPS

#: Central-difference step ``h = eps^{1/3}`` (6.1e-6), which balances truncation and rounding.
FD_STEP = EPS ** (1.0 / 3.0)

#: Central differences of attnsvm code against the proved derivative, relative to
#: ``max(1, max|reference|)``. Truncation ``≤ h²/6·|f'''|``: in ``vec(W)`` coordinates every
#: logit moves at rate ``|x_itk z_ij| ≤ 1`` (data in ``U[−1, 1]``) and third derivatives of the
#: softmax/loss compositions here are ≤ 10 per unit rate, so ≤ 6.2e-11; rounding
#: ``≤ 2·eps·|f|/(2h) ≈ 3.6e-11·|f|``. 1e-8 is a ~100× margin.
FD_TOL = 1e-8

#: Second-difference step ``h = eps^{1/4}`` (1.2e-4) for Hessians.
FD2_STEP = EPS**0.25

#: Second differences against the proved Hessian: rounding ``≤ 4·eps·|L|/h² ≈ 6e-8·|L|``,
#: truncation ``≤ h²/12·|f''''| ≈ 1.2e-9·|f''''|`` with ``|f''''| ≤ 100`` here: ≤ 2e-7;
#: 1e-5 is a ~50× margin (and ~10⁵ below the O(1) change of a wrong Hessian entry).
FD2_TOL = 1e-5

HALF = sp.Rational(1, 2)


# ============================================================== exact machinery
class PosExp(sp.Function):
    """An unevaluated ``exp``: positive, ``d/dx PosExp(x) = PosExp(x)``, never merged by SymPy.

    (``sympy.exp`` rewrites ``exp(a)²`` as ``exp(2a)``, which defeats substitution by symbols.)
    """

    is_real = True
    is_positive = True

    def fdiff(self, argindex: int = 1) -> Any:
        return self


class DPhi(sp.Function):
    """``φ'`` of a generic positive feature map (positive, as for ``φ = elu + 1``)."""

    is_real = True
    is_positive = True


class Phi(sp.Function):
    """A generic differentiable positive feature map ``φ`` with ``φ' = DPhi``."""

    is_real = True
    is_positive = True

    def fdiff(self, argindex: int = 1) -> Any:
        return DPhi(self.args[0])


def _elu1(a: Any) -> Any:
    """``φ = elu + 1``: ``a + 1`` for ``a > 0``, ``exp(a)`` for ``a ≤ 0``."""
    return sp.Piecewise((a + 1, a > 0), (sp.exp(a), True))


def _delu1(a: Any) -> Any:
    """``φ' = 1`` for ``a > 0``, ``exp(a)`` for ``a ≤ 0``."""
    return sp.Piecewise((sp.Integer(1), a > 0), (sp.exp(a), True))


def _to_numeric(expr: Any) -> Any:
    """Replace the unevaluated functions by their concrete forms (``φ = elu + 1``) for lambdify."""
    return expr.replace(PosExp, sp.exp).replace(DPhi, _delu1).replace(Phi, _elu1)


@dataclass(frozen=True)
class Obligation:
    """One exact proof obligation.

    ``kind`` is ``"zero"`` (``expr`` must reduce to 0, entrywise for a matrix), ``"pos"`` or
    ``"nonneg"`` (SymPy's assumptions must decide ``expr > 0`` / ``≥ 0`` from its structure, as
    written, without simplification).
    """

    kind: str
    expr: Any
    what: str


def _reduce(e: Any) -> Any:
    # cancel brings a rational function to p/q with expanded coprime p, q: zero iff p = 0.
    return sp.cancel(sp.together(sp.expand(e)))


def decide(ob: Obligation) -> tuple[bool, Any]:
    """Decide one obligation exactly, with no numeric evaluation.

    ``zero``: ``cancel(together(expand(e))) = 0`` entrywise (a rational function is zero iff
    the numerator of its reduced form is the zero polynomial). ``pos``/``nonneg``: SymPy's
    assumption system must answer ``True`` for each expression *as written*; ``None``
    (undecided) counts as not proved, so a certificate has to be manifest (a square, a
    product of positive symbols).

    Args:
      ob: the obligation.

    Returns:
      ``(holds, residual)``: the reduced expression (0 when it holds) or the certificate
      that could not be decided.
    """
    if ob.kind == "zero":
        if isinstance(ob.expr, sp.MatrixBase):
            red = ob.expr.applyfunc(_reduce)
            return bool(red.is_zero_matrix), red
        red = _reduce(ob.expr)
        return bool(red == 0), red
    exprs = list(ob.expr) if isinstance(ob.expr, (sp.MatrixBase, list, tuple)) else [ob.expr]
    for e in exprs:
        ok = e.is_positive if ob.kind == "pos" else e.is_nonnegative
        if ok is not True:
            return False, e
    return True, sp.Integer(0)


@dataclass(frozen=True)
class ProofResult:
    """Outcome of :meth:`Claim.prove`: ``proved`` and the first nonzero residual (``"0"`` if none)."""

    name: str
    proved: bool
    residual: str
    failed: str
    sizes: tuple[str, ...]
    obligations: int
    seconds: float


@dataclass(frozen=True)
class CodeCheck:
    """Outcome of :meth:`Claim.check_code`: the worst comparison, its tolerance, and all of them.

    ``comparisons`` holds ``(what, max_error, tolerance)``; ``max_error``/``tolerance`` are those
    of the comparison with the largest ratio ``error / tolerance``.
    """

    name: str
    max_error: float
    tolerance: float
    justification: str
    comparisons: tuple[tuple[str, float, float], ...]

    @property
    def ok(self) -> bool:
        """Every comparison within its tolerance (NaN counts as a failure)."""
        return all(bool(err <= tol) for _, err, tol in self.comparisons)


@dataclass(frozen=True)
class Claim:
    """A named statement with its exact proof and its numeric tie to attnsvm."""

    name: str
    group: str
    statement: str
    sizes: tuple[tuple[int, ...], ...]
    size_names: str
    obligations: Callable[..., list[Obligation]]
    check: Callable[[np.random.Generator], list[tuple[str, float, float]]]
    justification: str
    quick: bool = True

    def size_labels(self) -> tuple[str, ...]:
        """Human labels of the sizes, e.g. ``("n,T,d=2,2,2",)``."""
        return tuple(f"{self.size_names}=" + ",".join(map(str, s)) for s in self.sizes)

    def prove(self, quick: bool = False) -> ProofResult:
        """Decide every obligation at every size (only the smallest when ``quick``).

        Returns:
          :class:`ProofResult`; on failure it names the size and obligation and gives the residual.
        """
        t0 = time.perf_counter()
        sizes = self.sizes[:1] if quick else self.sizes
        labels = self.size_labels()[: len(sizes)]
        count = 0
        for size, label in zip(sizes, labels, strict=True):
            for ob in self.obligations(*size):
                count += 1
                ok, res = decide(ob)
                if not ok:
                    return ProofResult(
                        self.name,
                        False,
                        str(res),
                        f"{label}: {ob.what}",
                        labels,
                        count,
                        time.perf_counter() - t0,
                    )
        return ProofResult(self.name, True, "0", "", labels, count, time.perf_counter() - t0)

    def check_code(self, rng: np.random.Generator | int | None = 0) -> CodeCheck:
        """Compare the lambdified proved expressions with attnsvm at random float64 points.

        Args:
          rng: a generator or a seed (same seed, same points, same result).

        Returns:
          :class:`CodeCheck` with every comparison ``(what, max_error, tolerance)``; errors are
          relative to ``max(1, max|reference|)`` and tolerances are the named constants above.
        """
        g = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        comps = [(w, float(e), float(t)) for w, e, t in self.check(g)]
        if not comps:  # a check that compared nothing must not pass
            comps = [("no comparison was made", float("inf"), 0.0)]

        def ratio(c: tuple[str, float, float]) -> float:
            if not np.isfinite(c[1]) or c[1] > c[2]:
                return np.inf if not np.isfinite(c[1]) else 1.0 + c[1] / max(c[2], EPS * EPS)
            return c[1] / c[2] if c[2] > 0 else 0.0

        worst = max(comps, key=ratio)
        return CodeCheck(self.name, worst[1], worst[2], self.justification, tuple(comps))


@dataclass(frozen=True)
class ClaimReport:
    """A claim's proof and code check together."""

    name: str
    group: str
    statement: str
    proof: ProofResult
    code: CodeCheck | None

    @property
    def ok(self) -> bool:
        """Proved exactly and, when checked, the code agrees."""
        return self.proof.proved and (self.code is None or self.code.ok)


# ============================================================== symbolic helpers
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


# ============================================================== 1. tensor trick
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


# ============================================================== 2. softmax calculus
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


# ============================================================== 3. losses and the risk gradient
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
    return lambda w: np.array([_grad.risk(inst, _ten.unvec(w, (d, d)), loss)])


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
            gcode = _grad.risk_grad(inst, Wn, loss)
            out.append((f"∇L formula vs attnsvm.risk_grad ({loss})", _rel(gcode, fG(*vals)), EVAL_TOL))
            out.append((f"L vs attnsvm.risk ({loss})", _rel(_grad.risk(inst, Wn, loss), fL(*vals)), EVAL_TOL))
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


# -------------------------------------------------------------- sequence to sequence (issue 15 §2)
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
                    _rel(_grad.risk(inst, Wn, loss), fL(*vals)),
                    EVAL_TOL,
                )
            )
            out.append(
                (
                    f"∇L_s2s vs attnsvm.risk_grad(from_sequences) ({loss})",
                    _rel(_grad.risk_grad(inst, Wn, loss), fG(*vals)),
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


# ============================================================== 4. softmax regression (Gao–Song–Xie)
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


# ============================================================== 5. Jacobians w.r.t. W (Lipschitz)
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
        return lambda w: _att.attention(inst, _ten.unvec(w, (d, d)), kind).ravel()
    return lambda w: _att.output(inst, _ten.unvec(w, (d, d)), kind)


def _ck_lin_weights(rng: np.random.Generator) -> list[tuple[str, float, float]]:
    n, T, d = 2, 2, 2
    *_, logit, K, _ = _lip_sym(n, T, d)
    inst, W, args, vals = _lip_setup(rng, n, T, d)
    Kn = _lamb(args, sp.Matrix.vstack(*K))(*vals)
    fd = _fd_jac(_code_map(inst, "weights", "linear"), _ten.vec(W))
    return [
        (
            "K vec(W) vs attnsvm.model._attention(kind='linear')",
            _rel(_att.attention(inst, W, "linear").ravel(), Kn @ _ten.vec(W)),
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
            _rel(_att.output(inst, W, "linear"), _lamb(args, f)(*vals).ravel()),
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


# ============================================================== registry
_EVAL = "EVAL_TOL = 4096 eps, relative: closed form vs vectorised numpy on U[−1,1] data"
_FD = "FD_TOL = 1e-8 relative: central differences with h = eps^(1/3), truncation ≤ 6e-11, rounding ≤ 4e-11"
_FD2 = "FD2_TOL = 1e-5 relative: second differences with h = eps^(1/4)"
_TENSOR = "1 tensor trick"
_SOFT = "2 softmax calculus"
_RISK = "3 risk gradient"
_SREG = "4 softmax regression"
_LIP = "5 Jacobians for the Lipschitz constants"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "vec_kron_colmajor",
        _TENSOR,
        "vec(AMB) = (Bᵀ ⊗ A) vec(M), vec stacking columns (attnsvm.vec); A: p×q, M: q×r, B: r×s",
        ((2, 2, 2, 2), (2, 3, 2, 1), (3, 2, 3, 2)),
        "p,q,r,s",
        _ob_vec_colmajor,
        _ck_vec_colmajor,
        _EVAL,
    ),
    Claim(
        "vec_kron_rowmajor",
        _TENSOR,
        "vec_r(A₁ X A₂ᵀ) = (A₁ ⊗ A₂) vec_r(X), vec_r stacking rows (attnsvm.vec_rowmajor; Gao–Song–Xie); "
        "A₁: p×q, X: q×r, A₂: s×r",
        ((2, 2, 2, 2), (2, 3, 2, 3), (3, 2, 3, 2)),
        "p,q,r,s",
        _ob_vec_rowmajor,
        _ck_vec_rowmajor,
        _EVAL,
    ),
    Claim(
        "bilinear_kron",
        _TENSOR,
        "xᵀ W z = (z ⊗ x)ᵀ vec(W); x ∈ R^d, W: d×e, z ∈ R^e",
        ((2, 2), (3, 2), (3, 3)),
        "d,e",
        _ob_bilinear,
        _ck_bilinear,
        _EVAL,
    ),
    Claim(
        "frobenius_vec",
        _TENSOR,
        "||W||_F² = ||vec W||₂² = ||vec_r W||₂²; W: p×q",
        ((2, 2), (2, 3), (3, 3)),
        "p,q",
        _ob_frobenius,
        _ck_frobenius,
        _EVAL,
    ),
    Claim(
        "vec_unvec_inverse",
        _TENSOR,
        "unvec(vec M) = M, vec(unvec w) = w, unvec_r(vec_r M) = M, vec_r(Mᵀ) = vec(M); M: p×q",
        ((2, 3), (3, 2)),
        "p,q",
        _ob_unvec,
        _ck_unvec,
        "tolerance 0: index permutations must agree bit for bit",
    ),
    Claim(
        "kron_gram_factorised",
        _TENSOR,
        "⟨z ⊗ Δ, z' ⊗ Δ'⟩ = (z·z')(Δ·Δ') (the dual Gram of the Att-SVM costs nothing in d²); z ∈ R^e, Δ ∈ R^d",
        ((2, 2), (2, 3), (3, 3)),
        "e,d",
        _ob_gram,
        _ck_gram,
        _EVAL,
    ),
    Claim(
        "svm_rows_constraints",
        _TENSOR,
        "Att-SVM(α) rows a_it = z_i ⊗ (x_iα − x_it) satisfy a_it·vec(W) = (x_iα − x_it)ᵀ W z_i: "
        "the vectorised constraints A vec(W) ≥ 1 are the matrix ones (α_i = i mod T)",
        ((1, 2, 2), (2, 3, 2), (2, 2, 3)),
        "n,T,d",
        _ob_svm_rows,
        _ck_svm_rows,
        _EVAL,
    ),
    Claim(
        "svm_gram_instance",
        _TENSOR,
        "A Aᵀ[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju) for the Att-SVM rows of an instance (attnsvm.svm_gram)",
        ((1, 3, 2), (2, 3, 2)),
        "n,T,d",
        _ob_svm_gram,
        _ck_svm_gram,
        _EVAL,
    ),
    Claim(
        "softmax_jacobian",
        _SOFT,
        "∂softmax(l)/∂l = diag(s) − s sᵀ",
        ((2,), (3,), (4,), (5,)),
        "T",
        _ob_softmax_jac,
        _ck_softmax_jac,
        _EVAL + "; " + _FD,
    ),
    Claim(
        "cancellation_free_centring",
        _SOFT,
        "a_t − Σ_u s_u a_u = Σ_u s_u (a_t − a_u) whenever Σ_u s_u = 1 (the form attnsvm.risk_grad uses)",
        ((2,), (3,), (4,)),
        "T",
        _ob_centring,
        _ck_centring,
        _EVAL,
    ),
    Claim(
        "softmax_gershgorin",
        _SOFT,
        "J = diag(s) − ssᵀ is symmetric with J_tt > 0 > J_tu, so Σ_u |J_tu| = 2 s_t (1 − s_t) "
        "= ½ − 2(s_t − ½)² ≤ ½ for every s on the open simplex (s = E/1ᵀE, E > 0); by Gershgorin's "
        "theorem (not re-proved) ||J||₂ = ρ(J) ≤ ½",
        ((2,), (3,), (4,), (5,)),
        "T",
        _ob_gershgorin,
        _ck_gershgorin,
        _FD,
    ),
    Claim(
        "softmax_psd_certificate",
        _SOFT,
        "0 ≼ J ≼ ½I for J = diag(s) − ssᵀ, s on the open simplex, by exact certificates "
        "J = Σ_(t<u) s_t s_u (e_t − e_u)(e_t − e_u)ᵀ and "
        "½I − J = Σ_(t<u) s_t s_u (e_t + e_u)(e_t + e_u)ᵀ + diag(2(s_t − ½)²); hence ||J||₂ ≤ ½",
        ((2,), (3,), (4,), (5,)),
        "T",
        _ob_psd,
        _ck_psd,
        _FD,
    ),
    Claim(
        "elu_feature_map",
        _SOFT,
        "φ = elu + 1 is C¹ with φ > 0, φ' > 0 and φ − φ' ≥ 0, so r = φ'/φ ∈ (0, 1]: r = 1/(1 + x) for x > 0, "
        "r = 1 for x ≤ 0 (proved branch by branch)",
        ((2,),),
        "branches",
        _ob_phi,
        _ck_phi,
        _EVAL,
    ),
    Claim(
        "normalized_linear_jacobian",
        _SOFT,
        "for s = φ(l)/1ᵀφ(l) with any positive differentiable φ: ∂s/∂l = diag(s∘r) − s(s∘r)ᵀ "
        "= (diag(s) − ssᵀ) diag(r), r = φ'/φ",
        ((2,), (3,), (4,)),
        "T",
        _ob_nl_jac,
        _ck_nl_jac,
        _EVAL + "; " + _FD,
    ),
    Claim(
        "normalized_linear_half_bound",
        _SOFT,
        "for φ = elu + 1: J_nl = (diag(s) − ssᵀ) diag(r) with 0 < r ≤ 1 and 0 ≼ diag(s) − ssᵀ ≼ ½I, proved "
        "exactly per sign pattern of the logits (2^T cases); with ||diag(r)||₂ ≤ 1 and submultiplicativity "
        "(not re-proved) ||J_nl||₂ ≤ ½ — the same bound as softmax",
        ((2,), (3,)),
        "T",
        _ob_nl_bound,
        _ck_nl_bound,
        _FD,
    ),
    *(
        Claim(
            f"loss_derivative_{name}",
            _RISK,
            f"d/du ℓ(u) equals attnsvm's ℓ'(u) for the {name} loss, also in the e^(−u) form the gradient claims use, "
            "and ℓ' < 0",
            ((1,),),
            "dim u",
            _ob_loss(name),
            _ck_loss(name),
            _EVAL + " (per point, values up to e^20)",
        )
        for name in ("logistic", "exponential", "correlation")
    ),
    *(
        Claim(
            f"risk_grad_{name}",
            _RISK,
            f"∂L/∂W_jk of L(W) = (1/n) Σ_i ℓ(Y_i f_i) ({name}) equals "
            "[(1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) x_it z_iᵀ]_jk, symbolic X, z, v, Y, W",
            ((2, 2, 2), (1, 3, 2), (2, 3, 2)),
            "n,T,d",
            _ob_risk(name),
            _ck_risk(name),
            _EVAL + "; " + _FD,
            quick=name == "logistic",
        )
        for name in ("logistic", "exponential", "correlation")
    ),
    *(
        Claim(
            f"seq2seq_flattening_{'causal' if causal else 'full'}",
            _RISK,
            "the sequence-to-sequence risk (1/(nT)) Σ_ik ℓ(Y_ik f_ik), f_ik = Σ_{t∈A_k} s_ikt vᵀx_it over "
            + ("A_k = {t ≤ k} (causal)" if causal else "every t")
            + ", and its gradient ∂/∂W equal the risk and the masked ∇L formula of the flattened instance "
            "(row i·T + k: tokens X_i, query x_ik, label Y_ik, mask [t ∈ A_k]; Instance.from_sequences), "
            "symbolic X, v, Y, W (logistic loss)",
            ((1, 2, 2), (1, 3, 2), (2, 2, 2)),
            "n,T,d",
            _ob_s2s("logistic", causal),
            _ck_s2s("logistic", causal),
            _EVAL + "; " + _FD,
            quick=False,
        )
        for causal in (False, True)
    ),
    Claim(
        "softreg_du",
        _SREG,
        "u = exp(Ax): du/dx_i = u ∘ A_(*,i)",
        ((2, 2), (3, 4)),
        "m,k",
        _ob_sr_du,
        _ck_sr("du"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "softreg_df",
        _SREG,
        "f = ⟨u, 1⟩⁻¹ u: df/dx_i = f ∘ A_(*,i) − ⟨f, A_(*,i)⟩ f",
        ((2, 2), (3, 4)),
        "m,k",
        _ob_sr_df,
        _ck_sr("df"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "softreg_grad",
        _SREG,
        "L = ½||f − b||²: ∇L = Aᵀ (diag(f) − ffᵀ) c, c = f − b",
        ((2, 2), (3, 4)),
        "m,k",
        _ob_sr_grad,
        _ck_sr("grad"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "softreg_hessian",
        _SREG,
        "∇²L = Aᵀ B(x) A with B = ⟨3f − 2b, f⟩ffᵀ + diag(2f∘f − b∘f) + (⟨f,b⟩ − ⟨f,f⟩)diag(f) "
        "− (2f∘f − b∘f)fᵀ − f(2f∘f − b∘f)ᵀ (symmetric)",
        ((2, 2), (3, 2), (3, 4)),
        "m,k",
        _ob_sr_hess,
        _ck_sr("hess"),
        _EVAL + "; " + _FD2,
        quick=False,
    ),
    Claim(
        "softreg_matrix_kron",
        _SREG,
        "row j of D(X)⁻¹ exp(A₁XA₂ᵀ), D = diag(exp(A₁XA₂ᵀ)1), is softmax of block j of (A₁ ⊗ A₂) vec_r(X); "
        "attention rows are this with A₁ = [z_i], A₂ = tokens, X = Wᵀ",
        ((2, 2, 2), (2, 3, 2)),
        "n,T,d",
        _ob_sr_matrix,
        _ck_sr_matrix,
        _EVAL,
    ),
    Claim(
        "linear_weights_jacobian",
        _LIP,
        "linear attention l(W) = K vec(W) with K the rows (z_i ⊗ x_it)ᵀ: ∂l/∂vec(W) = K, exactly linear, "
        "so its Lipschitz constant (Frobenius in, ℓ2 out) is exactly ||K||₂",
        ((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        "n,T,d",
        _ob_lin_weights,
        _ck_lin_weights,
        _EVAL + "; " + _FD,
    ),
    Claim(
        "linear_output_jacobian",
        _LIP,
        "linear output f_i = Σ_t l_it a_it: ∂f_i/∂vec(W) = Σ_t a_it (z_i ⊗ x_it)ᵀ = (z_i ⊗ X_iᵀX_i v)ᵀ, exactly linear",
        ((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        "n,T,d",
        _ob_lin_output,
        _ck_lin_output,
        _EVAL + "; " + _FD,
    ),
    Claim(
        "softmax_weights_jacobian_W",
        _LIP,
        "∂s/∂vec(W) = blockdiag_i(diag(s_i) − s_i s_iᵀ) · K, K = ∂l/∂vec(W) the linear-attention Jacobian "
        "(rows (z_i ⊗ x_it)ᵀ): the softmax Jacobian factors through the linear one, so with "
        "||diag(s_i) − s_i s_iᵀ||₂ ≤ ½ (softmax_psd_certificate) ||∂s/∂vec W||₂ ≤ ½||K||₂ at every W",
        ((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        "n,T,d",
        _ob_W_weights("softmax"),
        _ck_W("softmax", "weights"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "softmax_output_jacobian_W",
        _LIP,
        "∂f_i/∂vec(W) = a_iᵀ(diag(s_i) − s_i s_iᵀ)K_i = Σ_t s_it (a_it − f_i)(z_i ⊗ x_it)ᵀ",
        ((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        "n,T,d",
        _ob_W_output("softmax"),
        _ck_W("softmax", "output"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "normalized_linear_weights_jacobian_W",
        _LIP,
        "for s_i = φ(l_i)/1ᵀφ(l_i): ∂s/∂vec(W) = blockdiag_i(diag(s_i∘r_i) − s_i(s_i∘r_i)ᵀ) · K, r = φ'/φ "
        "(any positive differentiable φ; checked against attnsvm with φ = elu + 1, where "
        "normalized_linear_half_bound gives ||∂s/∂vec W||₂ ≤ ½||K||₂ as for softmax)",
        ((1, 2, 2), (2, 2, 2)),
        "n,T,d",
        _ob_W_weights("normalized_linear"),
        _ck_W("normalized_linear", "weights"),
        _EVAL + "; " + _FD,
    ),
    Claim(
        "normalized_linear_output_jacobian_W",
        _LIP,
        "for s_i = φ(l_i)/1ᵀφ(l_i): ∂f_i/∂vec(W) = a_iᵀ(diag(s_i∘r_i) − s_i(s_i∘r_i)ᵀ)K_i "
        "= Σ_t s_it r_it (a_it − f_i)(z_i ⊗ x_it)ᵀ, r = φ'/φ (checked with φ = elu + 1)",
        ((1, 2, 2), (2, 2, 2)),
        "n,T,d",
        _ob_W_output("normalized_linear"),
        _ck_W("normalized_linear", "output"),
        _EVAL + "; " + _FD,
    ),
)

_BY_NAME = {c.name: c for c in CLAIMS}


def claim_names() -> tuple[str, ...]:
    """Names of the registered claims, in order."""
    return tuple(_BY_NAME)


def get_claim(name: str) -> Claim:
    """The claim called ``name`` (raises :class:`~attnsvm.errors.UnknownNameError` otherwise)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise unknown_name("claim", name, claim_names()) from None


def prove_all(
    names: Sequence[str] | None = None, quick: bool = False, check_code: bool = True, seed: int = 0
) -> list[ClaimReport]:
    """Prove the claims (all, or ``names``) exactly and check the code against each.

    Args:
      names: claim names (see :func:`claim_names`); ``None`` means all, or with ``quick`` the
        fast subset (``Claim.quick``) at their smallest size.
      quick: prove only at the smallest size, and (when ``names`` is None) only the quick claims.
      check_code: also run :meth:`Claim.check_code` (seeded by ``seed``).
      seed: seed of the random points of the code checks.

    Returns:
      One :class:`ClaimReport` per claim, in registry order.
    """
    if names is None:
        chosen = [c for c in CLAIMS if c.quick or not quick]
    else:
        chosen = [get_claim(n) for n in names]
    out = []
    for c in chosen:
        proof = c.prove(quick=quick)
        code = c.check_code(np.random.default_rng(seed)) if check_code else None
        out.append(ClaimReport(c.name, c.group, c.statement, proof, code))
    return out
