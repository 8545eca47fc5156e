"""The Att-SVM solvers' method and norm names and their tolerances, each with its justification."""

from __future__ import annotations

SVM_METHODS = ("auto", "primal", "vector", "dual")
SVM_NORMS = ("fro", "nuc")

#: A Farkas combination ``Σ c_r L_r`` within this many times its rounding bound
#: ``(m + 1)·eps·Σ|c_r|·||L_r||`` of zero is taken as exactly zero: the constraints then admit no
#: ``W`` at all (``norm_bound = inf``) rather than one of norm ~1/eps.
FARKAS_ZERO_FACTOR = 10.0

#: Target accuracy: a Frobenius solution is *certified* when ``cond(K_S)·eps`` (the first-order
#: bound on the relative error of the least-norm solve on the support) and every relative KKT
#: residual are at most this.
CERTIFY_RTOL = 1e-9

#: A row is *active* (a support constraint) when ``|a_rᵀw − b_r| ≤ SUPPORT_RTOL·(|b_r| + ||a_r||·||w||)``.
#: Justification: the solution is certified to 1e-9 relative, so no slack below that is
#: distinguishable from 0, while inactive slacks of generic instances are O(1).
SUPPORT_RTOL = 1e-9

#: A multiplier with ``λ_r ≤ MULTIPLIER_RTOL·max λ`` counts as 0 (a *weakly active* row when its
#: slack is also 0); a negative one above ``−MULTIPLIER_RTOL·max λ`` is rounding, not a wrong
#: active set. Multipliers are computed to ``cond(K_S)·eps`` relative, which certification caps at 1e-9.
MULTIPLIER_RTOL = 1e-9

#: Rounding level of a margin ``a_rᵀw`` relative to ``|b_r| + ||a_r||·||w||``: dot products of
#: length ``k`` and a backward-stable least-norm solve have relative error ``≤ k·eps``, which
#: is ``≤ 1e-12`` for factor widths ``k ≤ 4500`` (the exact factor has width ``≤ m``, the row count).
#: Slacks above ``−ROUNDING_RTOL`` are feasible to working precision.
ROUNDING_RTOL = 1e-12

#: Declare infeasibility when the least-norm solution of the row-normalised problem (unit rows,
#: ``max|b| = 1``) would exceed this norm: then ``cond(K_S) ≥ INFEASIBLE_NORM²/m ≈ 1e14/m``, beyond what
#: float64 can certify, and the NNLS residual that separates the two cases (``1/(1+||w||²)``) is at
#: the rounding level. The error message then quotes the certified lower bound on any feasible norm.
INFEASIBLE_NORM = 1e7

#: Inequality rows (unit length) with right-hand side below ``−VACUOUS_RHS`` (after scaling the binding
#: right-hand sides to ``max = 1``) are clamped there: they cannot bind unless ``||u|| ≥ 2^64``, far beyond
#: ``INFEASIBLE_NORM`` and any norm whose solve ``cond(K_S)·eps`` could certify.
VACUOUS_RHS = 2.0**64

#: The nuclear-norm solution is feasible to this (its minimum margin is ``≥ 1 − NUC_FEAS_TOL``);
#: rescaling by the minimum margin makes it ``1`` up to rounding.
NUC_FEAS_TOL = 1e-7

#: Support of the nuclear-norm solution: margins within this of 1. Clarabel's default
#: feasibility and gap tolerances are 1e-8; margins of the rescaled solution carry errors of that order
#: times the conditioning, so 1e-6 separates active from inactive (O(1) slack) rows.
NUC_SUPPORT_TOL = 1e-6

#: Rows whose raw conic-solver margin is within this of 1 seed the active-set step. Conic solvers
#: here are accurate to ~1e-4 relative (Clarabel, d = 128: 3.7e-4); a wrong seed costs extra
#: active-set iterations, never correctness (the final KKT check decides).
HINT_SLACK = 1e-3

#: Beyond this many entries the compressed exact factor (``m × rank(Δ)·rank(z)``) is not formed and
#: the Gram matrix is factorised by an eigendecomposition instead (accuracy ``cond(K)·eps`` instead
#: of ``cond(A)·eps``).
MAX_FACTOR_ENTRIES = 2**23

#: Symmetry / PSD checks of a user Gram matrix: entries are inner products with rounding
#: ``≤ k·eps·||a||·||b||``; 1e-10 relative admits inner products of length up to ~4e5.
GRAM_RTOL = 1e-10
