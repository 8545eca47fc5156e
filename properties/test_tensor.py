"""The tensor trick: matrix and vectorised forms agree for logits, risk and the Att-SVM constraints.

``vec`` is column-major: ``vec(A M B) = (Bᵀ ⊗ A) vec(M)`` and ``xᵀ W z = (z ⊗ x)ᵀ vec(W)``;
the row-major ``vec_r(A₁ X A₂ᵀ) = (A₁ ⊗ A₂) vec_r(X)`` (arXiv 2307.02419).

Tolerances. A length-``m`` dot product of float64 numbers is exact to
``γ_m Σ|terms|`` with ``γ_m = m·EPS/(1 − m·EPS)`` (Higham, Thm 3.1); both sides of each
identity are such sums over the same ``m`` products in different orders, so they differ by at
most ``2 γ_m Σ|terms|``. ``DOT_ULPS`` turns this into ``DOT_ULPS · m · EPS · Σ|terms|``.
That bound is relative; where products fall below the smallest normal double (the uniform family
draws values like 1e-277) each rounding is instead an absolute ``≤ TINY·EPS`` — amplified by at
most the largest later factor — so every comparison adds ``DOT_ULPS · m · TINY · Π(1 + max|factor|)``.

Masks (issue 15 §2). Each instance property has a ``*_masked`` twin on masked instances (masks aimed at
the hard cases) and sequence-to-sequence ones (:meth:`attnsvm.Instance.from_sequences`, causal or not,
padded), running the same body; the references apply the mask themselves (Kronecker-form logits only
at allowed tokens, ``−inf`` elsewhere; constraint rows only for allowed ``t ≠ α_i``, enumerated here
from the mask), so the plain examples stay those of before. The kind is counted with ``hypothesis.event``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, target
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.model._instance import Instance

EPS = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)
#: Two evaluation orders of one sum of m products: ≤ 2γ_m each way; 4 covers both sides.
DOT_ULPS = 4.0

#: General instances plus exact copies and near-parallel tokens (δ down to 1e-15) on purpose.
with_ties = S.instances(attention="either") | S.instances(
    attention="either", duplicates=True, near_parallel=True
)
pairs = S.instances_and_weights(
    S.instances(family="gaussian") | S.instances(family="uniform", bound=8.0), scale=(1e-2, 1e2)
)
#: The masked twins' data: masked instances (ties on purpose too) and sequence-to-sequence ones.
SEQ = S.sequence_instances() | S.sequence_instances(
    family="uniform", bound=8.0, padding=True, duplicates=True
)
with_ties_masked = (
    S.instances(attention="either", masked=True)
    | S.instances(attention="either", duplicates=True, near_parallel=True, masked=True)
    | SEQ
)
pairs_masked = S.instances_and_weights(
    S.instances(family="gaussian", masked=True) | S.instances(family="uniform", bound=8.0, masked=True) | SEQ,
    scale=(1e-2, 1e2),
)


def _kind(inst: Instance) -> None:
    event(f"instance: {S.instance_kind(inst)}")


def _amp(*factors: np.ndarray) -> float:
    """``Π (1 + max|factor|)``: how much later factors can amplify an underflowed product (an empty
    factor, e.g. no constraint row when every sequence keeps one token, amplifies nothing)."""
    return float(np.prod([1.0 + float(np.max(np.abs(f), initial=0.0)) for f in factors]))


def _mats(p: int, q: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float64, (p, q), elements=S.bounded_floats(8.0))


dims = st.integers(1, 4)


@given(dims, dims, dims, dims, st.data())
def test_vec_kron_identity_column_major(p: int, q: int, r: int, s: int, data: st.DataObject) -> None:
    Am, M, B = data.draw(_mats(p, q)), data.draw(_mats(q, r)), data.draw(_mats(r, s))
    lhs = A.vec(Am @ M @ B)
    rhs = np.kron(B.T, Am) @ A.vec(M)
    scale = A.vec(np.abs(Am) @ np.abs(M) @ np.abs(B))
    floor = DOT_ULPS * q * r * TINY * _amp(Am, M, B)
    assert np.all(np.abs(lhs - rhs) <= DOT_ULPS * q * r * EPS * scale + floor)


@given(dims, dims, dims, dims, st.data())
def test_vec_kron_identity_row_major(p: int, q: int, r: int, s: int, data: st.DataObject) -> None:
    A1, Xm, A2 = data.draw(_mats(p, q)), data.draw(_mats(q, r)), data.draw(_mats(s, r))
    lhs = A.vec_rowmajor(A1 @ Xm @ A2.T)
    rhs = np.kron(A1, A2) @ A.vec_rowmajor(Xm)
    scale = A.vec_rowmajor(np.abs(A1) @ np.abs(Xm) @ np.abs(A2).T)
    floor = DOT_ULPS * q * r * TINY * _amp(A1, Xm, A2)
    assert np.all(np.abs(lhs - rhs) <= DOT_ULPS * q * r * EPS * scale + floor)


@given(dims, dims, st.data())
def test_vec_roundtrips_and_orders(p: int, q: int, data: st.DataObject) -> None:
    M = data.draw(_mats(p, q))
    assert np.array_equal(A.unvec(A.vec(M), (p, q)), M)
    assert np.array_equal(A.unvec_rowmajor(A.vec_rowmajor(M), (p, q)), M)
    # column-major: entry (k, j) sits at j·p + k; row-major: at k·q + j
    for k in range(p):
        for j in range(q):
            assert A.vec(M)[j * p + k] == M[k, j]
            assert A.vec_rowmajor(M)[k * q + j] == M[k, j]
    assert np.array_equal(A.vec(M), A.vec_rowmajor(M.T))


@given(pairs)
def test_logits_matrix_equals_kronecker_form(pair: tuple[Instance, np.ndarray]) -> None:
    inst, W = pair
    ok = inst.allowed
    lg = A.logits(inst, W)
    assert np.all(np.isneginf(lg[~ok]))  # a masked token's logit is −inf
    w = A.vec(W)
    kr = np.array([[np.kron(inst.z[i], inst.X[i, t]) @ w for t in range(inst.T)] for i in range(inst.n)])
    scale = np.einsum("ntk,kj,nj->nt", np.abs(inst.X), np.abs(W), np.abs(inst.z))
    floor = DOT_ULPS * inst.d**2 * TINY * _amp(inst.X, W, inst.z)
    assert np.all(np.abs(lg[ok] - kr[ok]) <= DOT_ULPS * inst.d**2 * EPS * scale[ok] + floor)


@given(pairs, st.sampled_from(("logistic", "correlation")))
def test_risk_from_vectorised_logits(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """``L(W)`` recomputed from Kronecker-form logits ``(z_i ⊗ x_it)·vec(W)`` agrees with :func:`risk`.

    The logits differ by ``δl ≤ DOT_ULPS·d²·EPS·Λ`` (Λ = Σ|x||W||z|); softmax weights then move by
    a relative ``≤ 2 δl``, ``f`` by ``≤ 2 δl · Σ|a|`` and ``ℓ`` (1-Lipschitz for these losses) as much;
    plus ``DOT_ULPS·T·EPS`` rounding of the sums.
    """
    inst, W = pair
    w = A.vec(W)
    rows = np.einsum("nj,ntk->ntjk", inst.z, inst.X).reshape(inst.n, inst.T, -1)  # z_i ⊗ x_it
    lg = np.where(inst.allowed, rows @ w, -np.inf)  # the mask as an additive −inf (weight 0)
    s = np.exp(lg - lg.max(axis=1, keepdims=True))
    s /= s.sum(axis=1, keepdims=True)
    a = inst.X @ inst.v
    u = inst.Y * np.sum(s * a, axis=1)
    ref = float(np.mean(np.logaddexp(0.0, -u) if loss == "logistic" else -u))
    lam = float(np.max(np.einsum("ntk,kj,nj->nt", np.abs(inst.keys), np.abs(W), np.abs(inst.z))))
    amax = float(np.max(np.abs(inst.keys) @ np.abs(inst.v)))
    tol = DOT_ULPS * EPS * ((inst.d**2) * lam * 4 * inst.T * amax + (inst.T + inst.d) * (1 + amax) + abs(ref))
    tol += DOT_ULPS * inst.d**2 * TINY * _amp(inst.X, W, inst.z, inst.v)
    assert abs(A.risk(inst, W, loss=loss) - ref) <= tol


@given(S.instances_and_alphas(with_ties), S.seeds())
def test_svm_constraints_three_forms_agree(pair: tuple[Instance, np.ndarray], seed: int) -> None:
    inst, alpha = pair
    W = np.random.default_rng(seed).standard_normal((inst.d, inst.d))
    rows = A.svm_rows(inst, alpha)
    c = A.svm_constraints(inst, alpha)
    margins = A.svm_margins(inst, W, alpha)
    n, T, d = inst.shape
    ok = inst.allowed
    # rows are ordered by sequence, then token, skipping t = α_i and the masked tokens
    expected_pairs = [(i, t) for i in range(n) for t in range(T) if t != alpha[i] and ok[i, t]]
    assert rows.shape == (len(expected_pairs), d * d)
    assert [tuple(p) for p in c.pairs.tolist()] == expected_pairs
    assert np.array_equal(c.alpha, alpha)
    direct = np.array([(inst.X[i, alpha[i]] - inst.X[i, t]) @ W @ inst.z[i] for i, t in expected_pairs])
    scale = np.array(
        [
            (np.abs(inst.X[i, alpha[i]]) + np.abs(inst.X[i, t])) @ np.abs(W) @ np.abs(inst.z[i])
            for i, t in expected_pairs
        ]
    )
    tol = DOT_ULPS * (d * d + 1) * EPS * scale + DOT_ULPS * (d * d + 1) * TINY * _amp(inst.X, W, inst.z)
    err = np.maximum(np.abs(rows @ A.vec(W) - direct), np.abs(margins - direct))
    target(float(np.max(err / tol)) if err.size else 0.0, label="constraint error / bound")
    assert np.all(np.abs(rows @ A.vec(W) - direct) <= tol)
    assert np.all(np.abs(margins - direct) <= tol)
    for r, (i, t) in enumerate(expected_pairs):
        assert np.array_equal(c.deltas[r], inst.X[i, alpha[i]] - inst.X[i, t])
        assert np.array_equal(c.queries[r], inst.z[i])
        assert np.array_equal(rows[r], np.kron(inst.z[i], inst.X[i, alpha[i]] - inst.X[i, t]))


@given(S.instances_and_alphas(with_ties))
def test_svm_gram_factorises(pair: tuple[Instance, object]) -> None:
    inst, alpha = pair
    rows = A.svm_rows(inst, alpha)
    K = A.svm_gram(inst, alpha)
    absr = np.abs(rows)
    floor = DOT_ULPS * inst.d**2 * TINY * _amp(rows, rows)
    assert np.all(np.abs(K - rows @ rows.T) <= DOT_ULPS * inst.d**2 * EPS * (absr @ absr.T) + floor)
    assert np.array_equal(K, K.T)


@given(S.feasible_instances())
def test_default_alpha_is_optimal_tokens(inst: Instance) -> None:
    opt = inst.optimal_tokens()
    assert np.array_equal(A.svm_rows(inst), A.svm_rows(inst, opt))
    assert np.array_equal(A.svm_constraints(inst).alpha, opt)


# ---------------------------------------------------------------- masked and sequence-to-sequence twins
@given(pairs_masked)
def test_logits_matrix_equals_kronecker_form_masked(pair: tuple[Instance, np.ndarray]) -> None:
    """Oracle: ``(z_i ⊗ x_it)·vec(W)`` at the allowed tokens; ``−inf`` at the masked ones."""
    _kind(pair[0])
    test_logits_matrix_equals_kronecker_form.hypothesis.inner_test(pair)


@given(pairs_masked, st.sampled_from(("logistic", "correlation")))
def test_risk_from_vectorised_logits_masked(pair: tuple[Instance, np.ndarray], loss: str) -> None:
    """Oracle: the risk from Kronecker-form logits with the mask as an additive ``−inf``."""
    _kind(pair[0])
    test_risk_from_vectorised_logits.hypothesis.inner_test(pair, loss)


@given(S.instances_and_alphas(with_ties_masked), S.seeds())
def test_svm_constraints_three_forms_agree_masked(pair: tuple[Instance, np.ndarray], seed: int) -> None:
    """Oracle: the direct ``(x_iα − x_it)ᵀ W z_i`` over the allowed ``t ≠ α_i`` (enumerated from the mask;
    ``Σ_i (T_i − 1)`` rows, none for a sequence with one allowed token); α drawn among allowed tokens."""
    _kind(pair[0])
    test_svm_constraints_three_forms_agree.hypothesis.inner_test(pair, seed)


@given(S.instances_and_alphas(with_ties_masked))
def test_svm_gram_factorises_masked(pair: tuple[Instance, object]) -> None:
    """``K = R Rᵀ`` (exact identity up to rounding), also with no row at all (every sequence single)."""
    _kind(pair[0])
    test_svm_gram_factorises.hypothesis.inner_test(pair)


@given(S.feasible_instances(masked=True))
def test_default_alpha_is_optimal_tokens_masked(inst: Instance) -> None:
    """The default α is ``optimal_tokens()`` over the allowed tokens (feasible masked instances keep opt)."""
    _kind(inst)
    test_default_alpha_is_optimal_tokens.hypothesis.inner_test(inst)
