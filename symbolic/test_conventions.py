"""A wrong convention in the code fails the suite: each test patches one plausible mistake into
``attnsvm`` and asserts that the code check of the claims that cover it reports a failure.

The mistakes: a row-major ``vec`` (or column-major ``vec_rowmajor``), a row-major ``unvec``,
swapped Kronecker factors in the Att-SVM rows, logits with ``Wᵀ``, a gradient with
``z_i x_itᵀ`` instead of ``x_it z_iᵀ`` or without the ``1/n``, the textbook loss derivative of
the wrong sign, and ``φ = exp`` (softmax) in place of ``elu + 1``.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm import identities as I
from attnsvm.model import _attention as att
from attnsvm.model import _grad as grad
from attnsvm.model import _losses as losses
from attnsvm.model import _tensor as ten

pytestmark = pytest.mark.timeout(120)


def _fails(name: str) -> bool:
    return not I.get_claim(name).check_code(np.random.default_rng(0)).ok


def test_the_unpatched_code_passes() -> None:
    for name in (
        "vec_kron_colmajor",
        "svm_rows_constraints",
        "risk_grad_logistic",
        "normalized_linear_jacobian",
    ):
        assert not _fails(name)


def test_row_major_vec_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ten, "vec", lambda M: np.asarray(M, dtype=float).reshape(-1, order="C"))
    for name in ("vec_kron_colmajor", "bilinear_kron", "vec_unvec_inverse"):
        assert _fails(name), name


def test_column_major_vec_rowmajor_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ten, "vec_rowmajor", lambda M: np.asarray(M, dtype=float).reshape(-1, order="F"))
    for name in ("vec_kron_rowmajor", "softreg_matrix_kron"):
        assert _fails(name), name


def test_row_major_unvec_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ten, "unvec", lambda w, shape: np.asarray(w, dtype=float).reshape(shape, order="C"))
    for name in ("vec_unvec_inverse", "linear_weights_jacobian", "softmax_weights_jacobian_W", "softreg_df"):
        assert _fails(name), name


def test_swapped_kronecker_factors_in_svm_rows_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def rows_swapped(inst, alpha=None):  # Δ ⊗ z instead of z ⊗ Δ
        c = ten.svm_constraints(inst, alpha)
        return np.einsum("rj,rk->rjk", c.deltas, c.queries).reshape(len(c.pairs), -1)

    monkeypatch.setattr(ten, "svm_rows", rows_swapped)
    assert _fails("svm_rows_constraints")
    assert _fails("kron_gram_factorised")


def test_transposed_logits_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def logits_t(X, z, W):  # x_itᵀ Wᵀ z_i
        return np.einsum("ntd,nd->nt", X, z @ W)

    monkeypatch.setattr(att, "logits_of", logits_t)
    monkeypatch.setattr(grad, "logits_of", logits_t)
    for name in (
        "risk_grad_logistic",
        "softmax_weights_jacobian_W",
        "softmax_output_jacobian_W",
        "linear_weights_jacobian",
        "softreg_grad",
        "softreg_matrix_kron",
    ):
        assert _fails(name), name


def test_transposed_gradient_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = grad.risk_grad_of
    monkeypatch.setattr(grad, "risk_grad_of", lambda *a: real(*a).T)
    for name in ("risk_grad_logistic", "risk_grad_exponential", "risk_grad_correlation"):
        assert _fails(name), name


def test_gradient_without_one_over_n_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = grad.risk_grad_of
    monkeypatch.setattr(grad, "risk_grad_of", lambda X, *a: real(X, *a) * X.shape[0])
    assert _fails("risk_grad_exponential")


def test_wrong_loss_derivative_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    good = losses.LOSSES["logistic"]
    bad = losses.Loss("logistic", good.value_fn, lambda u: 1 / (1 + np.exp(u)), good.assumptions)
    monkeypatch.setitem(losses.LOSSES, "logistic", bad)
    assert _fails("loss_derivative_logistic")
    assert _fails("risk_grad_logistic")


def test_softmax_in_place_of_elu_plus_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(att, "log_phi", lambda l: np.asarray(l, dtype=float))
    for name in ("elu_feature_map", "normalized_linear_jacobian", "normalized_linear_weights_jacobian_W"):
        assert _fails(name), name
