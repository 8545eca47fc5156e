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
  the tolerance it is held to (the named constants :data:`EVAL_TOL`, :data:`FD_TOL`,
  :data:`FD2_TOL`, each justified where it is defined). Functions are looked up on their modules
  (``attnsvm.model._tensor.vec``, ...) at call time, so a wrong convention (a transposed ``W``, a row-major
  ``vec``, swapped Kronecker factors) monkeypatched into ``attnsvm`` makes the check fail.

The ordered registry :data:`CLAIMS` and :func:`prove_all` serve ``symbolic/`` (one test per
claim) and ``attnsvm check`` / ``attnsvm reproduce``.

Layout (import from ``attnsvm.identities``; the modules below are private): ``_exact`` holds the
machinery (:class:`PosExp`, :class:`Phi`, :class:`DPhi`, :class:`Obligation`, :func:`decide`,
:class:`Claim` and its result types), ``_tolerances`` the named tolerances, ``_helpers`` the
shared symbolic and numeric helpers (index-formula ``vec``/Kronecker, lambdify, finite
differences, random instances); one module per group of claims, each claim an obligations
function and a code check: ``_tensor_trick`` (1), ``_softmax`` (2, softmax calculus), ``_risk``
(3, losses and the risk gradient), ``_regression`` (4, softmax regression), ``_jacobians`` (5,
the Jacobians behind the Lipschitz constants); and ``_registry`` (:data:`CLAIMS`, each claim
built by keyword, with :func:`claim_names`, :func:`get_claim`, :func:`prove_all`).

Conventions (the package's, see ``docs/theory.md``): ``vec`` stacks columns, ``vec(M)[j·p + k] = M[k, j]``; Kronecker
``(A ⊗ B)[i·p + k, j·q + l] = A[i, j] B[k, l]``; logits ``l_it = x_itᵀ W z_i``.

References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick, softmax regression and its
Hessian); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM, risk gradient);
Kim, Papamakarios, Mnih, ICML 2021 (Lipschitz constants of attention); Katharopoulos et al.,
ICML 2020 (``φ = elu + 1``).
"""

from __future__ import annotations

from .._deps import require

require("sympy", feature="attnsvm.identities (the SymPy proofs)")  # pragma: no mutate

from ._exact import (
    Claim,
    ClaimReport,
    CodeCheck,
    DPhi,
    Obligation,
    Phi,
    PosExp,
    ProofResult,
    decide,
)
from ._registry import CLAIMS, claim_names, get_claim, prove_all
from ._tolerances import EVAL_TOL, FD2_STEP, FD2_TOL, FD_STEP, FD_TOL

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
