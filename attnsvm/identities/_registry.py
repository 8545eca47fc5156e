"""The ordered registry of claims (each built by keyword) and the functions that look them up and
prove them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import unknown_name
from ._exact import Claim, ClaimReport
from ._jacobians import (
    _ck_lin_output,
    _ck_lin_weights,
    _ck_W,
    _ob_lin_output,
    _ob_lin_weights,
    _ob_W_output,
    _ob_W_weights,
)
from ._regression import _ck_sr, _ck_sr_matrix, _ob_sr_df, _ob_sr_du, _ob_sr_grad, _ob_sr_hess, _ob_sr_matrix
from ._risk import _ck_loss, _ck_risk, _ob_loss, _ob_risk
from ._seq2seq import _ck_s2s, _ob_s2s
from ._softmax import (
    _ck_centring,
    _ck_gershgorin,
    _ck_nl_bound,
    _ck_nl_jac,
    _ck_phi,
    _ck_psd,
    _ck_softmax_jac,
    _ob_centring,
    _ob_gershgorin,
    _ob_nl_bound,
    _ob_nl_jac,
    _ob_phi,
    _ob_psd,
    _ob_softmax_jac,
)
from ._tensor_trick import (
    _ck_bilinear,
    _ck_frobenius,
    _ck_gram,
    _ck_svm_gram,
    _ck_svm_rows,
    _ck_unvec,
    _ck_vec_colmajor,
    _ck_vec_rowmajor,
    _ob_bilinear,
    _ob_frobenius,
    _ob_gram,
    _ob_svm_gram,
    _ob_svm_rows,
    _ob_unvec,
    _ob_vec_colmajor,
    _ob_vec_rowmajor,
)

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
        name="vec_kron_colmajor",
        group=_TENSOR,
        statement="vec(AMB) = (Bᵀ ⊗ A) vec(M), vec stacking columns (attnsvm.vec); A: p×q, M: q×r, B: r×s",
        sizes=((2, 2, 2, 2), (2, 3, 2, 1), (3, 2, 3, 2)),
        size_names="p,q,r,s",
        obligations=_ob_vec_colmajor,
        check=_ck_vec_colmajor,
        justification=_EVAL,
    ),
    Claim(
        name="vec_kron_rowmajor",
        group=_TENSOR,
        statement=(
            "vec_r(A₁ X A₂ᵀ) = (A₁ ⊗ A₂) vec_r(X), vec_r stacking rows (attnsvm.vec_rowmajor; Gao–Song–Xie); "
            "A₁: p×q, X: q×r, A₂: s×r"
        ),
        sizes=((2, 2, 2, 2), (2, 3, 2, 3), (3, 2, 3, 2)),
        size_names="p,q,r,s",
        obligations=_ob_vec_rowmajor,
        check=_ck_vec_rowmajor,
        justification=_EVAL,
    ),
    Claim(
        name="bilinear_kron",
        group=_TENSOR,
        statement="xᵀ W z = (z ⊗ x)ᵀ vec(W); x ∈ R^d, W: d×e, z ∈ R^e",
        sizes=((2, 2), (3, 2), (3, 3)),
        size_names="d,e",
        obligations=_ob_bilinear,
        check=_ck_bilinear,
        justification=_EVAL,
    ),
    Claim(
        name="frobenius_vec",
        group=_TENSOR,
        statement="||W||_F² = ||vec W||₂² = ||vec_r W||₂²; W: p×q",
        sizes=((2, 2), (2, 3), (3, 3)),
        size_names="p,q",
        obligations=_ob_frobenius,
        check=_ck_frobenius,
        justification=_EVAL,
    ),
    Claim(
        name="vec_unvec_inverse",
        group=_TENSOR,
        statement="unvec(vec M) = M, vec(unvec w) = w, unvec_r(vec_r M) = M, vec_r(Mᵀ) = vec(M); M: p×q",
        sizes=((2, 3), (3, 2)),
        size_names="p,q",
        obligations=_ob_unvec,
        check=_ck_unvec,
        justification="tolerance 0: index permutations must agree bit for bit",
    ),
    Claim(
        name="kron_gram_factorised",
        group=_TENSOR,
        statement="⟨z ⊗ Δ, z' ⊗ Δ'⟩ = (z·z')(Δ·Δ') (the dual Gram of the Att-SVM costs nothing in d²); z ∈ R^e, Δ ∈ R^d",
        sizes=((2, 2), (2, 3), (3, 3)),
        size_names="e,d",
        obligations=_ob_gram,
        check=_ck_gram,
        justification=_EVAL,
    ),
    Claim(
        name="svm_rows_constraints",
        group=_TENSOR,
        statement=(
            "Att-SVM(α) rows a_it = z_i ⊗ (x_iα − x_it) satisfy a_it·vec(W) = (x_iα − x_it)ᵀ W z_i: "
            "the vectorised constraints A vec(W) ≥ 1 are the matrix ones (α_i = i mod T)"
        ),
        sizes=((1, 2, 2), (2, 3, 2), (2, 2, 3)),
        size_names="n,T,d",
        obligations=_ob_svm_rows,
        check=_ck_svm_rows,
        justification=_EVAL,
    ),
    Claim(
        name="svm_gram_instance",
        group=_TENSOR,
        statement="A Aᵀ[(i,t),(j,u)] = (z_i·z_j)(Δ_it·Δ_ju) for the Att-SVM rows of an instance (attnsvm.svm_gram)",
        sizes=((1, 3, 2), (2, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_svm_gram,
        check=_ck_svm_gram,
        justification=_EVAL,
    ),
    Claim(
        name="softmax_jacobian",
        group=_SOFT,
        statement="∂softmax(l)/∂l = diag(s) − s sᵀ",
        sizes=((2,), (3,), (4,), (5,)),
        size_names="T",
        obligations=_ob_softmax_jac,
        check=_ck_softmax_jac,
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="cancellation_free_centring",
        group=_SOFT,
        statement="a_t − Σ_u s_u a_u = Σ_u s_u (a_t − a_u) whenever Σ_u s_u = 1 (the form attnsvm.risk_grad uses)",
        sizes=((2,), (3,), (4,)),
        size_names="T",
        obligations=_ob_centring,
        check=_ck_centring,
        justification=_EVAL,
    ),
    Claim(
        name="softmax_gershgorin",
        group=_SOFT,
        statement=(
            "J = diag(s) − ssᵀ is symmetric with J_tt > 0 > J_tu, so Σ_u |J_tu| = 2 s_t (1 − s_t) "
            "= ½ − 2(s_t − ½)² ≤ ½ for every s on the open simplex (s = E/1ᵀE, E > 0); by Gershgorin's "
            "theorem (not re-proved) ||J||₂ = ρ(J) ≤ ½"
        ),
        sizes=((2,), (3,), (4,), (5,)),
        size_names="T",
        obligations=_ob_gershgorin,
        check=_ck_gershgorin,
        justification=_FD,
    ),
    Claim(
        name="softmax_psd_certificate",
        group=_SOFT,
        statement=(
            "0 ≼ J ≼ ½I for J = diag(s) − ssᵀ, s on the open simplex, by exact certificates "
            "J = Σ_(t<u) s_t s_u (e_t − e_u)(e_t − e_u)ᵀ and "
            "½I − J = Σ_(t<u) s_t s_u (e_t + e_u)(e_t + e_u)ᵀ + diag(2(s_t − ½)²); hence ||J||₂ ≤ ½"
        ),
        sizes=((2,), (3,), (4,), (5,)),
        size_names="T",
        obligations=_ob_psd,
        check=_ck_psd,
        justification=_FD,
    ),
    Claim(
        name="elu_feature_map",
        group=_SOFT,
        statement=(
            "φ = elu + 1 is C¹ with φ > 0, φ' > 0 and φ − φ' ≥ 0, so r = φ'/φ ∈ (0, 1]: r = 1/(1 + x) for x > 0, "
            "r = 1 for x ≤ 0 (proved branch by branch)"
        ),
        sizes=((2,),),
        size_names="branches",
        obligations=_ob_phi,
        check=_ck_phi,
        justification=_EVAL,
    ),
    Claim(
        name="normalized_linear_jacobian",
        group=_SOFT,
        statement=(
            "for s = φ(l)/1ᵀφ(l) with any positive differentiable φ: ∂s/∂l = diag(s∘r) − s(s∘r)ᵀ "
            "= (diag(s) − ssᵀ) diag(r), r = φ'/φ"
        ),
        sizes=((2,), (3,), (4,)),
        size_names="T",
        obligations=_ob_nl_jac,
        check=_ck_nl_jac,
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="normalized_linear_half_bound",
        group=_SOFT,
        statement=(
            "for φ = elu + 1: J_nl = (diag(s) − ssᵀ) diag(r) with 0 < r ≤ 1 and 0 ≼ diag(s) − ssᵀ ≼ ½I, proved "
            "exactly per sign pattern of the logits (2^T cases); with ||diag(r)||₂ ≤ 1 and submultiplicativity "
            "(not re-proved) ||J_nl||₂ ≤ ½ — the same bound as softmax"
        ),
        sizes=((2,), (3,)),
        size_names="T",
        obligations=_ob_nl_bound,
        check=_ck_nl_bound,
        justification=_FD,
    ),
    *(
        Claim(
            name=f"loss_derivative_{name}",
            group=_RISK,
            statement=(
                f"d/du ℓ(u) equals attnsvm's ℓ'(u) for the {name} loss, also in the e^(−u) form the gradient claims use, "
                "and ℓ' < 0"
            ),
            sizes=((1,),),
            size_names="dim u",
            obligations=_ob_loss(name),
            check=_ck_loss(name),
            justification=_EVAL + " (per point, values up to e^20)",
        )
        for name in ("logistic", "exponential", "correlation")
    ),
    *(
        Claim(
            name=f"risk_grad_{name}",
            group=_RISK,
            statement=(
                f"∂L/∂W_jk of L(W) = (1/n) Σ_i ℓ(Y_i f_i) ({name}) equals "
                "[(1/n) Σ_i ℓ'(Y_i f_i) Y_i Σ_t s_it (vᵀx_it − f_i) x_it z_iᵀ]_jk, symbolic X, z, v, Y, W"
            ),
            sizes=((2, 2, 2), (1, 3, 2), (2, 3, 2)),
            size_names="n,T,d",
            obligations=_ob_risk(name),
            check=_ck_risk(name),
            justification=_EVAL + "; " + _FD,
            quick=name == "logistic",
        )
        for name in ("logistic", "exponential", "correlation")
    ),
    *(
        Claim(
            name=f"seq2seq_flattening_{'causal' if causal else 'full'}",
            group=_RISK,
            statement=(
                "the sequence-to-sequence risk (1/(nT)) Σ_ik ℓ(Y_ik f_ik), f_ik = Σ_{t∈A_k} s_ikt vᵀx_it over "
                + ("A_k = {t ≤ k} (causal)" if causal else "every t")
                + ", and its gradient ∂/∂W equal the risk and the masked ∇L formula of the flattened instance "
                "(row i·T + k: tokens X_i, query x_ik, label Y_ik, mask [t ∈ A_k]; Instance.from_sequences), "
                "symbolic X, v, Y, W (logistic loss)"
            ),
            sizes=((1, 2, 2), (1, 3, 2), (2, 2, 2)),
            size_names="n,T,d",
            obligations=_ob_s2s("logistic", causal),
            check=_ck_s2s("logistic", causal),
            justification=_EVAL + "; " + _FD,
            quick=False,
        )
        for causal in (False, True)
    ),
    Claim(
        name="softreg_du",
        group=_SREG,
        statement="u = exp(Ax): du/dx_i = u ∘ A_(*,i)",
        sizes=((2, 2), (3, 4)),
        size_names="m,k",
        obligations=_ob_sr_du,
        check=_ck_sr("du"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="softreg_df",
        group=_SREG,
        statement="f = ⟨u, 1⟩⁻¹ u: df/dx_i = f ∘ A_(*,i) − ⟨f, A_(*,i)⟩ f",
        sizes=((2, 2), (3, 4)),
        size_names="m,k",
        obligations=_ob_sr_df,
        check=_ck_sr("df"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="softreg_grad",
        group=_SREG,
        statement="L = ½||f − b||²: ∇L = Aᵀ (diag(f) − ffᵀ) c, c = f − b",
        sizes=((2, 2), (3, 4)),
        size_names="m,k",
        obligations=_ob_sr_grad,
        check=_ck_sr("grad"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="softreg_hessian",
        group=_SREG,
        statement=(
            "∇²L = Aᵀ B(x) A with B = ⟨3f − 2b, f⟩ffᵀ + diag(2f∘f − b∘f) + (⟨f,b⟩ − ⟨f,f⟩)diag(f) "
            "− (2f∘f − b∘f)fᵀ − f(2f∘f − b∘f)ᵀ (symmetric)"
        ),
        sizes=((2, 2), (3, 2), (3, 4)),
        size_names="m,k",
        obligations=_ob_sr_hess,
        check=_ck_sr("hess"),
        justification=_EVAL + "; " + _FD2,
        quick=False,
    ),
    Claim(
        name="softreg_matrix_kron",
        group=_SREG,
        statement=(
            "row j of D(X)⁻¹ exp(A₁XA₂ᵀ), D = diag(exp(A₁XA₂ᵀ)1), is softmax of block j of (A₁ ⊗ A₂) vec_r(X); "
            "attention rows are this with A₁ = [z_i], A₂ = tokens, X = Wᵀ"
        ),
        sizes=((2, 2, 2), (2, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_sr_matrix,
        check=_ck_sr_matrix,
        justification=_EVAL,
    ),
    Claim(
        name="linear_weights_jacobian",
        group=_LIP,
        statement=(
            "linear attention l(W) = K vec(W) with K the rows (z_i ⊗ x_it)ᵀ: ∂l/∂vec(W) = K, exactly linear, "
            "so its Lipschitz constant (Frobenius in, ℓ2 out) is exactly ||K||₂"
        ),
        sizes=((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_lin_weights,
        check=_ck_lin_weights,
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="linear_output_jacobian",
        group=_LIP,
        statement="linear output f_i = Σ_t l_it a_it: ∂f_i/∂vec(W) = Σ_t a_it (z_i ⊗ x_it)ᵀ = (z_i ⊗ X_iᵀX_i v)ᵀ, exactly linear",
        sizes=((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_lin_output,
        check=_ck_lin_output,
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="softmax_weights_jacobian_W",
        group=_LIP,
        statement=(
            "∂s/∂vec(W) = blockdiag_i(diag(s_i) − s_i s_iᵀ) · K, K = ∂l/∂vec(W) the linear-attention Jacobian "
            "(rows (z_i ⊗ x_it)ᵀ): the softmax Jacobian factors through the linear one, so with "
            "||diag(s_i) − s_i s_iᵀ||₂ ≤ ½ (softmax_psd_certificate) ||∂s/∂vec W||₂ ≤ ½||K||₂ at every W"
        ),
        sizes=((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_W_weights("softmax"),
        check=_ck_W("softmax", "weights"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="softmax_output_jacobian_W",
        group=_LIP,
        statement="∂f_i/∂vec(W) = a_iᵀ(diag(s_i) − s_i s_iᵀ)K_i = Σ_t s_it (a_it − f_i)(z_i ⊗ x_it)ᵀ",
        sizes=((1, 2, 2), (2, 2, 2), (1, 3, 2)),
        size_names="n,T,d",
        obligations=_ob_W_output("softmax"),
        check=_ck_W("softmax", "output"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="normalized_linear_weights_jacobian_W",
        group=_LIP,
        statement=(
            "for s_i = φ(l_i)/1ᵀφ(l_i): ∂s/∂vec(W) = blockdiag_i(diag(s_i∘r_i) − s_i(s_i∘r_i)ᵀ) · K, r = φ'/φ "
            "(any positive differentiable φ; checked against attnsvm with φ = elu + 1, where "
            "normalized_linear_half_bound gives ||∂s/∂vec W||₂ ≤ ½||K||₂ as for softmax)"
        ),
        sizes=((1, 2, 2), (2, 2, 2)),
        size_names="n,T,d",
        obligations=_ob_W_weights("normalized_linear"),
        check=_ck_W("normalized_linear", "weights"),
        justification=_EVAL + "; " + _FD,
    ),
    Claim(
        name="normalized_linear_output_jacobian_W",
        group=_LIP,
        statement=(
            "for s_i = φ(l_i)/1ᵀφ(l_i): ∂f_i/∂vec(W) = a_iᵀ(diag(s_i∘r_i) − s_i(s_i∘r_i)ᵀ)K_i "
            "= Σ_t s_it r_it (a_it − f_i)(z_i ⊗ x_it)ᵀ, r = φ'/φ (checked with φ = elu + 1)"
        ),
        sizes=((1, 2, 2), (2, 2, 2)),
        size_names="n,T,d",
        obligations=_ob_W_output("normalized_linear"),
        check=_ck_W("normalized_linear", "output"),
        justification=_EVAL + "; " + _FD,
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
    names: Sequence[str] | None = None, *, quick: bool = False, check_code: bool = True, seed: int = 0
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
        out.append(ClaimReport(name=c.name, group=c.group, statement=c.statement, proof=proof, code=code))
    return out
