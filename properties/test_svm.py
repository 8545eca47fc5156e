"""Att-SVM solutions: KKT certificates, raw conic accuracy, optimality, symmetries, infeasibility.

``W_mm(α) = argmin ||W||_F  s.t.  (x_iα_i − x_it)ᵀ W z_i ≥ 1`` (arXiv 2308.16898). Instances come
from :func:`attnsvm.strategies.feasible_instances`, which guarantees feasibility for every α
(independent queries, affinely independent tokens) with well-conditioned constraint rows.

Tolerances. Solutions are certified by the solver to ``CERTIFY_RTOL = 1e-9`` relative (first-order
error bound ``cond(K_S)·eps`` and relative KKT residuals, :mod:`attnsvm.svm`). Quantities this
file recomputes from ``W`` add dot-product rounding ``d²·EPS`` relative, negligible next to it.
So ``KKT_RTOL = 10·CERTIFY_RTOL`` (one order of headroom for the recomputation) and two certified
solutions of the same problem differ by at most ``AGREE_RTOL = 2·KKT_RTOL`` relative.

Masks (issue 15 §2). Each property has a ``*_masked`` twin running the same body on masked feasible
instances (:func:`attnsvm.strategies.feasible_instances` with ``masked=True``: the optimal tokens stay
allowed, which keeps the feasibility guarantee exactly) and on sequence-to-sequence instances
(:meth:`attnsvm.Instance.from_sequences`, causal or not, padded or not) of a size where generic data
make every Att-SVM(α) feasible (``n·T ≤ d`` queries, ``T ≤ d + 1`` tokens: ``n = 1, T ≤ 3, d ≥ 3`` or
``n = 2, T = 2, d ≥ 4``). The references enumerate the constraint rows from the mask themselves (allowed
``t ≠ α_i`` only). A mask that leaves every sequence one allowed token leaves no constraint: there the
claim is the documented refusal (``AttnSVMError``, "no constraint"), asserted, not set aside.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.model._instance import Instance
from attnsvm.svm import CERTIFY_RTOL, is_locally_optimal, solve_svm
from attnsvm.svm._constants import NUC_SUPPORT_TOL

KKT_RTOL = 10 * CERTIFY_RTOL
AGREE_RTOL = 2 * KKT_RTOL

feasible = S.feasible_instances(n=(1, 3), T=(2, 4))
cross = S.feasible_instances(n=(1, 3), T=(2, 4), attention="cross")
costly = settings(max_examples=max(5, settings.default.max_examples // 4))
#: Sequence-to-sequence instances of a generically feasible size (module docstring).
SEQ = S.sequence_instances(n=(1, 1), T=(2, 3), d=(3, 4)) | S.sequence_instances(
    n=(2, 2), T=(2, 2), d=(4, 5), padding=True
)
feasible_masked = S.feasible_instances(n=(1, 3), T=(2, 4), masked=True) | SEQ
cross_masked = S.feasible_instances(n=(1, 3), T=(2, 4), attention="cross", masked=True) | SEQ


def _rows_of(inst: Instance, alpha: np.ndarray) -> list[tuple[int, int]]:
    """The constraint rows ``(i, t)``: allowed ``t ≠ α_i``, by sequence then token (from the mask)."""
    ok = inst.allowed
    return [(i, t) for i in range(inst.n) for t in range(inst.T) if t != alpha[i] and ok[i, t]]


def _refused_without_rows(inst: Instance, alpha: np.ndarray | None = None) -> bool:
    """Event the kind; where the mask leaves no constraint assert ``solve_svm``'s refusal and say so."""
    event(f"instance: {S.instance_kind(inst)}")
    if np.any(inst.allowed.sum(axis=1) >= 2):
        return False
    with pytest.raises(A.AttnSVMError, match="no constraint"):
        solve_svm(inst, alpha)
    event("no constraint (every sequence keeps one token): refusal asserted")
    return True


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))


@given(S.instances_and_alphas(feasible))
def test_kkt_certificate_holds(pair: tuple[Instance, np.ndarray]) -> None:
    """Recomputed independently from ``W`` and the duals: feasibility, ``λ ≥ 0``, stationarity
    ``W = Σ λ_it Δ_it z_iᵀ``, complementary slackness, and the support = active rows."""
    inst, alpha = pair
    sol = solve_svm(inst, alpha)
    assert sol.certified
    assert sol.duals is not None
    assert np.array_equal(sol.alpha, alpha)
    pairs = _rows_of(inst, alpha)
    assert [tuple(p) for p in sol.pairs.tolist()] == pairs
    D = np.array([inst.X[i, alpha[i]] - inst.X[i, t] for i, t in pairs])
    Z = np.array([inst.z[i] for i, _ in pairs])
    margins = np.einsum("rk,kj,rj->r", D, sol.W, Z)
    scale = 1.0 + np.linalg.norm(D, axis=1) * np.linalg.norm(Z, axis=1) * np.linalg.norm(sol.W)
    assert np.all(margins >= 1 - KKT_RTOL * scale)  # primal feasibility
    lam = sol.duals
    assert np.all(lam >= -KKT_RTOL * np.max(np.abs(lam)))  # dual feasibility
    Wl = np.einsum("r,rk,rj->kj", lam, D, Z)
    assert _rel(Wl, sol.W) <= KKT_RTOL  # stationarity
    assert np.all(
        np.abs(lam) / np.max(np.abs(lam)) * np.abs(margins - 1) <= KKT_RTOL * scale
    )  # compl. slackness
    active = {p for p, m, s in zip(pairs, margins, scale, strict=True) if abs(m - 1) <= KKT_RTOL * s}
    assert set(map(tuple, sol.support)) == active
    # the vectorised form agrees: svm_rowsᵀ·duals = vec(W)
    assert _rel(A.svm_rows(inst, alpha).T @ lam, A.vec(sol.W)) <= KKT_RTOL


#: Clarabel's default stopping tolerances (tol_gap_abs = tol_gap_rel = tol_feas = 1e-8).
CLARABEL_TOL = 1e-8


def raw_rtol(d: int) -> float:
    """Accuracy of a conic solver's raw ``W`` (before the exact finish), relative in Frobenius norm.

    The solvers work on the unit-row problem (``max β ∈ [1/d, 4]``, so ``||Ŵ|| ≥ 1/d``): absolute
    tolerances are ≤ ``g = CLARABEL_TOL·d`` relative. A feasible ``w`` with ``||w|| ≤ (1 + g)||w*||`` is
    within ``√(2g + g²)·||w*||`` of ``w*`` (``w*`` is the projection of 0 onto the convex feasible set:
    ``||w||² ≥ ||w*||² + ||w − w*||²``), and an infeasibility ``δ ≤ g`` is undone by the factor
    ``1/(1 − δ)``: ``√(2(g + δ)) + δ ≤ 2√g + g``. For d ≤ 8 that is ≤ 5.7e-4; measured on 150 examples of
    this strategy (n ≤ 3, T ≤ 4, d ≤ 8): max 3.8e-5, median 3.3e-9; 500 ``sweep`` examples with
    ``hypothesis.target`` maximising it: max 8.8e-5.
    """
    g = CLARABEL_TOL * d
    return 2.0 * np.sqrt(g) + g


def _kron_kkt(inst: Instance, alpha: np.ndarray, W: np.ndarray, lam: np.ndarray) -> None:
    """KKT of ``min ½||w||² s.t. A w ≥ 1`` from scratch, with explicit Kronecker rows ``a_it = z_i ⊗ Δ_it``
    (numpy's ``kron``, column-major ``vec``): primal feasibility, ``λ ≥ 0``, ``vec(W) = Aᵀλ``,
    complementary slackness and a zero duality gap, each to ``KKT_RTOL`` relative."""
    rows = [np.kron(inst.z[i], inst.X[i, alpha[i]] - inst.X[i, t]) for i, t in _rows_of(inst, alpha)]
    Am = np.array(rows)
    w = W.reshape(-1, order="F")  # vec: columns stacked, so a_it·vec(W) = Δ_itᵀ W z_i
    margins = Am @ w
    scale = 1.0 + np.linalg.norm(Am, axis=1) * np.linalg.norm(w)
    assert np.all(margins >= 1.0 - KKT_RTOL * scale)  # primal feasibility
    lmax = float(np.max(np.abs(lam)))
    assert np.all(lam >= -KKT_RTOL * lmax)  # dual feasibility
    assert _rel(Am.T @ lam, w) <= KKT_RTOL  # stationarity
    assert np.all(np.abs(lam) / lmax * np.abs(margins - 1.0) <= KKT_RTOL * scale)  # complementary slackness
    primal, dual = 0.5 * (w @ w), float(lam.sum()) - 0.5 * float((Am.T @ lam) @ (Am.T @ lam))
    assert abs(primal - dual) <= KKT_RTOL * primal  # strong duality


@costly
@given(S.instances_and_alphas(feasible))
def test_conic_raw_answer_is_within_solver_accuracy_of_the_certified_one(
    pair: tuple[Instance, np.ndarray],
) -> None:
    """Each conic method's RAW answer (``SVMSolution.W_raw``, before the exact active-set finish) is within
    the conic solver's own accuracy :func:`raw_rtol` of the certified ``W``, and that certified ``W`` (with
    its duals) satisfies the KKT conditions recomputed from scratch with explicit Kronecker rows.
    Oracle: the KKT conditions (an exact optimality certificate of the convex program), computed
    independently of the package's factored rows; the raw bound from Clarabel's tolerances."""
    inst, alpha = pair
    for method in ("primal", "vector"):
        sol = solve_svm(inst, alpha, method=method)
        assert sol.certified and sol.duals is not None and sol.W_raw is not None, method
        _kron_kkt(inst, alpha, np.asarray(sol.W), np.asarray(sol.duals))
        err = _rel(np.asarray(sol.W_raw), np.asarray(sol.W))
        target(err, label=f"raw {method} error")
        assert err <= raw_rtol(inst.d), (method, err)
        assert sol.raw_rel_error == pytest.approx(err, rel=1e-6, abs=1e-15)


@given(S.instances_and_alphas(feasible), S.seeds(), st.floats(1e-6, 1.0))
def test_no_feasible_point_of_smaller_norm(pair: tuple[Instance, np.ndarray], seed: int, t: float) -> None:
    """Perturb ``W_mm`` and rescale to feasibility: the result is never shorter.

    ``W' = (W + tE)/min_r margin_r(W + tE)`` is feasible whenever that minimum is positive; its norm
    must be ``≥ ||W_mm||·(1 − KKT_RTOL)`` (W_mm certified optimal to ``CERTIFY_RTOL``)."""
    inst, alpha = pair
    sol = solve_svm(inst, alpha)
    E = np.random.default_rng(seed).standard_normal(sol.W.shape)
    Wp = sol.W + t * np.linalg.norm(sol.W) * E / np.linalg.norm(E)
    mmin = float(np.min(A.svm_margins(inst, Wp, alpha)))
    if mmin > 0:  # otherwise W' cannot be rescaled to feasibility: nothing to compare
        assert np.linalg.norm(Wp / mmin) >= np.linalg.norm(sol.W) * (1 - KKT_RTOL)


@given(S.instances_and_alphas(cross), st.floats(1e-2, 1e2), st.booleans())
def test_scaling_queries_scales_solution_inversely(
    pair: tuple[Instance, np.ndarray], c: float, neg: bool
) -> None:
    """Cross-attention: ``z → c z`` maps the constraints ``Δᵀ W z ≥ 1`` to ``Δᵀ (cW) z ≥ 1``, so
    ``W_mm(cz) = W_mm(z)/c`` (also for ``c < 0``)."""
    inst, alpha = pair
    c = -c if neg else c
    scaled = A.Instance(inst.X, inst.Y, inst.v, c * inst.z, mask=inst.mask)
    W1, Wc = solve_svm(inst, alpha).W, solve_svm(scaled, alpha).W
    assert _rel(Wc, W1 / c) <= AGREE_RTOL


@given(S.instances_and_alphas(cross), S.seeds())
def test_permuting_tokens_and_sequences_leaves_solution(pair: tuple[Instance, np.ndarray], seed: int) -> None:
    """Permuting the tokens within sequences (α follows its token) and the sequences themselves
    only reorders the constraints: ``W_mm`` is unchanged, the support maps accordingly."""
    inst, alpha = pair
    rng = np.random.default_rng(seed)
    seq = rng.permutation(inst.n)
    tok = np.array([rng.permutation(inst.T) for _ in range(inst.n)])  # new token u is old tok[i, u]
    Xp = np.stack([inst.X[seq[k], tok[k]] for k in range(inst.n)])
    inv = np.argsort(tok, axis=1)
    alpha_p = np.array([inv[k, alpha[seq[k]]] for k in range(inst.n)])
    mask = None if inst.mask is None else np.stack([inst.mask[seq[k], tok[k]] for k in range(inst.n)])
    p = A.Instance(Xp, inst.Y[seq], inst.v, inst.z[seq], mask=mask)
    s0, s1 = solve_svm(inst, alpha), solve_svm(p, alpha_p)
    assert _rel(s1.W, s0.W) <= AGREE_RTOL
    mapped = {(int(seq[k]), int(tok[k, u])) for k, u in s1.support}
    assert mapped == set(s0.support)


@given(S.instances_and_alphas(feasible), st.data())
def test_duplicating_the_selected_token_is_infeasible(
    pair: tuple[Instance, np.ndarray], data: st.DataObject
) -> None:
    """A token equal to the selected one gives the constraint ``0 ≥ 1``."""
    inst, alpha = pair
    if inst.mask is None:
        i = data.draw(st.integers(0, inst.n - 1))
        t = data.draw(st.sampled_from([u for u in range(inst.T) if u != alpha[i]]))
    else:  # the copy must be an allowed token (a masked one has no constraint); such a sequence exists
        i, t = data.draw(st.sampled_from(_rows_of(inst, alpha)))
    X = np.array(inst.X)
    X[i, t] = X[i, alpha[i]]
    dup = A.Instance(X, inst.Y, inst.v, None if inst.self_attention else inst.z, mask=inst.mask)
    with pytest.raises(A.InfeasibleSVMError):
        solve_svm(dup, alpha)


@given(feasible)
def test_optimal_tokens_are_locally_optimal(inst: Instance) -> None:
    """``α = opt`` scores above every other token, so it is locally optimal whenever feasible."""
    assert is_locally_optimal(inst, inst.optimal_tokens())
    assert np.array_equal(solve_svm(inst).alpha, inst.optimal_tokens())


@costly
@given(S.instances_and_alphas(S.feasible_instances(n=(1, 2), T=(2, 3), extra_d=(0, 0))))
def test_nuclear_norm_solution_is_feasible_and_no_worse_than_frobenius(
    pair: tuple[Instance, np.ndarray],
) -> None:
    """``min ||W||_*`` under the same constraints: feasible (margins ≥ 1 to rounding after the
    solver's rescaling), its objective is ``||W||_*`` and at most that of the Frobenius solution
    (a feasible point) up to the certified relative gap ``error_bound``; the support is the rows
    with margin 1 to ``NUC_SUPPORT_TOL``."""
    inst, alpha = pair
    nuc = solve_svm(inst, alpha, norm="nuc")
    fro = solve_svm(inst, alpha)
    margins = A.svm_margins(inst, nuc.W, alpha)
    rows = [tuple(p) for p in A.svm_constraints(inst, alpha).pairs.tolist()]
    assert [tuple(p) for p in nuc.pairs.tolist()] == rows
    assert np.all(np.abs(nuc.margins - margins) <= KKT_RTOL * (1 + np.abs(margins)))
    assert np.min(margins) >= 1 - KKT_RTOL
    nuc_norm = float(np.sum(np.linalg.svd(nuc.W, compute_uv=False)))
    assert abs(nuc.objective - nuc_norm) <= KKT_RTOL * nuc_norm
    fro_nuc = float(np.sum(np.linalg.svd(fro.W, compute_uv=False)))
    assert nuc_norm <= fro_nuc * (1 + nuc.error_bound + KKT_RTOL)
    assert set(map(tuple, nuc.support)) == {
        p for p, m in zip(rows, margins, strict=True) if m - 1 <= NUC_SUPPORT_TOL
    }
    assert nuc.norm == "nuc" and nuc.duals is None and not nuc.certified


# ---------------------------------------------------------------- masked and sequence-to-sequence twins
@given(S.instances_and_alphas(feasible_masked))
def test_kkt_certificate_holds_masked(pair: tuple[Instance, np.ndarray]) -> None:
    """The KKT certificate recomputed from ``W`` and the duals over the allowed rows (from the mask)."""
    if not _refused_without_rows(*pair):
        test_kkt_certificate_holds.hypothesis.inner_test(pair)


@costly
@given(S.instances_and_alphas(feasible_masked))
def test_conic_raw_answer_is_within_solver_accuracy_of_the_certified_one_masked(
    pair: tuple[Instance, np.ndarray],
) -> None:
    """Oracle: the KKT conditions with explicit Kronecker rows of the allowed tokens."""
    if not _refused_without_rows(*pair):
        test_conic_raw_answer_is_within_solver_accuracy_of_the_certified_one.hypothesis.inner_test(pair)


@given(S.instances_and_alphas(feasible_masked), S.seeds(), st.floats(1e-6, 1.0))
def test_no_feasible_point_of_smaller_norm_masked(
    pair: tuple[Instance, np.ndarray], seed: int, t: float
) -> None:
    """No perturbed, rescaled feasible point is shorter than ``W_mm`` (masked constraints)."""
    if not _refused_without_rows(*pair):
        test_no_feasible_point_of_smaller_norm.hypothesis.inner_test(pair, seed, t)


@given(S.instances_and_alphas(cross_masked), st.floats(1e-2, 1e2), st.booleans())
def test_scaling_queries_scales_solution_inversely_masked(
    pair: tuple[Instance, np.ndarray], c: float, neg: bool
) -> None:
    """``W_mm(cz) = W_mm(z)/c`` (an exact symmetry), the mask kept."""
    if not _refused_without_rows(*pair):
        test_scaling_queries_scales_solution_inversely.hypothesis.inner_test(pair, c, neg)


@given(S.instances_and_alphas(cross_masked), S.seeds())
def test_permuting_tokens_and_sequences_leaves_solution_masked(
    pair: tuple[Instance, np.ndarray], seed: int
) -> None:
    """Permuting tokens (with their mask entries) and sequences leaves ``W_mm`` (an exact symmetry)."""
    if not _refused_without_rows(*pair):
        test_permuting_tokens_and_sequences_leaves_solution.hypothesis.inner_test(pair, seed)


@given(S.instances_and_alphas(feasible_masked), st.data())
def test_duplicating_the_selected_token_is_infeasible_masked(
    pair: tuple[Instance, np.ndarray], data: st.DataObject
) -> None:
    """An allowed token equal to the selected one gives the constraint ``0 ≥ 1``."""
    if not _refused_without_rows(*pair):
        test_duplicating_the_selected_token_is_infeasible.hypothesis.inner_test(pair, data)


@given(feasible_masked)
def test_optimal_tokens_are_locally_optimal_masked(inst: Instance) -> None:
    """``α = opt`` over the allowed tokens is locally optimal (masked tokens take no part)."""
    if not _refused_without_rows(inst):
        test_optimal_tokens_are_locally_optimal.hypothesis.inner_test(inst)


@costly
@given(S.instances_and_alphas(S.feasible_instances(n=(1, 2), T=(2, 3), extra_d=(0, 0), masked=True) | SEQ))
def test_nuclear_norm_solution_is_feasible_and_no_worse_than_frobenius_masked(
    pair: tuple[Instance, np.ndarray],
) -> None:
    """The nuclear-norm solution on the allowed rows: feasible, no worse than the Frobenius one."""
    if not _refused_without_rows(*pair):
        test_nuclear_norm_solution_is_feasible_and_no_worse_than_frobenius.hypothesis.inner_test(pair)
