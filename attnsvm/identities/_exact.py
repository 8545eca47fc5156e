"""The exact proof machinery: unevaluated positive functions (``PosExp``, ``Phi``, ``DPhi``), proof
obligations and their decision procedure, and the claim with its result types.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

import numpy as np
import sympy as sp

from ._tolerances import EPS


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


@dataclass(frozen=True, kw_only=True)
class ProofResult:
    """Outcome of :meth:`Claim.prove`: ``proved`` and the first nonzero residual (``"0"`` if none)."""

    name: str
    proved: bool
    residual: str
    failed: str
    sizes: tuple[str, ...]
    obligations: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A named statement with its exact proof and its numeric tie to attnsvm (built by keyword).

    ``obligations(*size)`` gives the obligations at one of ``sizes`` (named by ``size_names``);
    ``check(rng)`` gives the code check's comparisons ``(what, error, tolerance)``, and
    ``justification`` says why those tolerances hold. ``quick``: part of the quick subset.
    """

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

    def prove(self, *, quick: bool = False) -> ProofResult:
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
                        name=self.name,
                        proved=False,
                        residual=str(res),
                        failed=f"{label}: {ob.what}",
                        sizes=labels,
                        obligations=count,
                        seconds=time.perf_counter() - t0,
                    )
        return ProofResult(
            name=self.name,
            proved=True,
            residual="0",
            failed="",
            sizes=labels,
            obligations=count,
            seconds=time.perf_counter() - t0,
        )

    def check_code(self, rng: np.random.Generator | int | None = 0) -> CodeCheck:
        """Compare the lambdified proved expressions with attnsvm at random float64 points.

        Args:
          rng: a generator or a seed (same seed, same points, same result).

        Returns:
          :class:`CodeCheck` with every comparison ``(what, max_error, tolerance)``; errors are
          relative to ``max(1, max|reference|)``; tolerances: ``EVAL_TOL``, ``FD_TOL``, ``FD2_TOL``.
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
        return CodeCheck(
            name=self.name,
            max_error=worst[1],
            tolerance=worst[2],
            justification=self.justification,
            comparisons=tuple(comps),
        )


@dataclass(frozen=True, kw_only=True)
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
