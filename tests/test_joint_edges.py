"""`attnsvm.peers._joint` at its edges: boundary cases, exact small instances and documented messages.

Each test pins one documented behaviour of :mod:`attnsvm.peers._joint` against an independent oracle (an exact
value for a hand-built instance, mpmath, scale equivariance by powers of two, an exact certificate, or
the documented error text).
"""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import InfeasibleSVMError, NumericalError
from attnsvm.peers import _joint as J
from attnsvm.svm import CERTIFY_RTOL

#: The scale contract's refusals all end with float64's normal range (attnsvm.scaling.range_error).
RANGE = "float64's normal range [2.2e-308, 1.8e308]"
#: The certified min-norm solver's documented relative accuracy (attnsvm.svm.min_norm_dual).
SOLVER_RTOL = CERTIFY_RTOL


def line(tokens: list[float]) -> A.Instance:
    """One sequence of scalar tokens (d = 1), label +1, head v = 1: the v-SVM row is the token itself and
    the relaxed p-SVM rows are ``W·(x_α − x_t)``."""
    X = np.array([[[float(t)] for t in tokens]])
    return A.Instance(X, np.array([1.0]), np.array([1.0]), np.ones((1, 1)))


def test_v_svm_scale_follows_the_selected_token_not_the_largest():
    """Hand-derived (d = 1, tokens 1, −8, v = 1 selects token 0, W = 1): v_mm = 1 (1·v ≥ 1), its multiplier
    1, the only input is a support input; the relaxed p-SVM row is 1 − (−8) = 9, so p_relax = 1/9 with
    multiplier 1/81. The largest token (−8) is not the selected one, which the power-of-two scaling of
    the v-SVM rows must not confuse."""
    sol = J.solve_joint_svm(line([1.0, -8.0]), np.eye(1))
    assert sol.alpha.tolist() == [0] and sol.support_inputs.tolist() == [0]
    assert sol.v == pytest.approx([1.0], rel=SOLVER_RTOL)
    assert sol.v_duals == pytest.approx([1.0], rel=SOLVER_RTOL)
    assert sol.p == pytest.approx([1.0 / 9.0], rel=SOLVER_RTOL)
    assert sol.p_duals == pytest.approx([1.0 / 81.0], rel=SOLVER_RTOL)


@pytest.mark.parametrize(
    ("x", "w", "message"),
    [
        (2.0**1023, 1.0, "the v-SVM solution v_mm is about 1e-308: it underflows "),
        (2.0**600, 1.0, "the v-SVM multipliers is about 1e-361: it underflows "),
        (1.0, 2.0**-1040, "the relaxed p-SVM solution p_relax is about 1e+313: it overflows "),
        (1.0, 2.0**1023, "the relaxed p-SVM solution p_relax is about 1e-308: it underflows "),
        (1.0, 2.0**600, "the relaxed p-SVM multipliers is about 1e-361: it underflows "),
    ],
)
def test_unrepresentable_svm_answers_are_refused_by_name(x, w, message):
    """Oracle: hand-computed sizes (d = 1, tokens x, 0, W = w): v_mm = 1/x with multiplier 1/x², and
    p_relax = 1/(w·x) with multiplier 1/(w·x)². x = 2¹⁰²³: v_mm = 2⁻¹⁰²³ ≈ 1e-308 (subnormal); x = 2⁶⁰⁰:
    v_mm = 2⁻⁶⁰⁰ is normal but its multiplier 2⁻¹²⁰⁰ ≈ 1e-361 is not; w = 2⁻¹⁰⁴⁰: p_relax = 2¹⁰⁴⁰ ≈ 1e313;
    w = 2¹⁰²³: p_relax = 2⁻¹⁰²³; w = 2⁶⁰⁰: p_relax = 2⁻⁶⁰⁰ is normal, its multiplier 2⁻¹²⁰⁰ is not."""
    with pytest.raises(NumericalError) as exc:
        J.solve_joint_svm(line([x, 0.0]), np.array([[w]]))
    assert str(exc.value) == message + RANGE


def test_zero_selected_token_makes_the_v_svm_infeasible():
    """Documented (Raises: a zero selected token): with α = 1 and x_1 = 0 the v-SVM row Y·x_α is 0 and
    cannot reach margin 1; the error names the v-SVM, the sequence and the token (hand-derived)."""
    with pytest.raises(InfeasibleSVMError) as exc:
        J.solve_joint_svm(line([1.0, 0.0]), np.eye(1), alpha=[1])
    assert str(exc.value).startswith("the v-SVM is infeasible: sequence 0, token 1 ")


def test_equal_keys_make_the_relaxed_p_svm_infeasible():
    """Hand-derived: W = diag(1, 0) maps tokens (1, 0) and (1, 3) to the same key (1, 0); the input is a
    support input of the v-SVM (its only one), so its p-row (k_α − k_1 = 0) must reach margin 1:
    infeasible, and the error names the relaxed p-SVM and the pair (sequence 0, token 1)."""
    X = np.array([[[1.0, 0.0], [1.0, 3.0]]])
    inst = A.Instance(X, np.array([1.0]), np.array([1.0, 0.0]), np.ones((1, 2)))
    with pytest.raises(InfeasibleSVMError) as exc:
        J.solve_joint_svm(inst, np.diag([1.0, 0.0]), alpha=[0])
    assert str(exc.value).startswith(
        "the relaxed p-SVM is infeasible: sequence 0, token 1 has the same key as the selected token"
    )


def _masked_pair() -> tuple[A.Instance, np.ndarray]:
    """n = 2, T = 2, d = 2 with one token masked out, and a W (the refusals below come first)."""
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [1.0, -1.0]]])
    inst = A.Instance(
        X,
        np.array([1.0, -1.0]),
        np.array([1.0, 0.0]),
        np.array([[1.0, 0.0], [0.0, 1.0]]),
        mask=np.array([[True, True], [True, False]]),
    )
    return inst, np.eye(2)


_JOINT_CALLS = {
    "joint_risk": lambda inst, W: A.peers.joint_risk(inst, W, np.ones(2), np.ones(2)),
    "joint_grads": lambda inst, W: A.peers.joint_grads(inst, W, np.ones(2), np.ones(2)),
    "normalized_joint_grads": lambda inst, W: A.peers.normalized_joint_grads(inst, W, np.ones(2), np.ones(2)),
    "solve_joint_svm": lambda inst, W: A.peers.solve_joint_svm(inst, W),
    "run_joint_gd": lambda inst, W: A.peers.run_joint_gd(inst, W, 2, 0.1),
}


@pytest.mark.parametrize("name", sorted(_JOINT_CALLS))
def test_joint_functions_refuse_masks_naming_themselves(name: str) -> None:
    """Each joint peer refuses a masked instance (it does not support masks yet) with the documented
    message naming the function by its public path and counting the masked tokens.

    Oracle: the documented refusal text of ``require_unmasked`` (one masked token here).
    """
    inst, W = _masked_pair()
    with pytest.raises(A.InvalidInstanceError) as info:
        _JOINT_CALLS[name](inst, W)
    assert str(info.value).startswith(
        f"attnsvm.peers.{name} does not support token masks yet: this instance masks 1 token(s). "
    )


@pytest.mark.parametrize("name", ["joint_grads", "normalized_joint_grads"])
def test_joint_gradients_name_a_misshapen_v(name: str) -> None:
    """A ``v`` of the wrong shape is refused naming ``v`` and its documented shape ``(d,)``.

    Oracle: the documented message of the shape check (``v must have shape (d,) = (2,)…; got (3,)``).
    """
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]])
    )
    with pytest.raises(A.InvalidInstanceError) as info:
        getattr(A.peers, name)(inst, np.eye(2), np.ones(3), np.ones(2))
    assert str(info.value).startswith("v must have shape (d,) = (2,)")
    assert str(info.value).endswith("; got (3,)")


def test_run_joint_gd_names_bad_steps_and_step_size() -> None:
    """``steps`` and ``lr`` are refused by name, ``lr`` with its meaning (the step size η).

    Oracle: the documented messages of the integer and positivity checks.
    """
    inst = A.Instance(
        np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([1.0]), np.array([1.0, 0.0]), np.array([[1.0, 0.0]])
    )
    with pytest.raises(A.AttnSVMError) as info:
        A.peers.run_joint_gd(inst, np.eye(2), 0, 0.1)
    assert str(info.value) == "steps must be an integer ≥ 1; got 0"
    with pytest.raises(A.AttnSVMError) as info:
        A.peers.run_joint_gd(inst, np.eye(2), 2, -1.0)
    assert str(info.value) == "lr must be a positive finite number (the step size η); got -1.0"
