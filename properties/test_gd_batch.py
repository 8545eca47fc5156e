"""The batched GD engine computes the single-instance direction, on both of its paths.

``run_gd_batch`` stacks instances and takes, per step and per instance, either a linear-domain
fast path or a log-domain path (``attnsvm.gd._TorchBatch``); both must give the direction and
log-norm of :func:`attnsvm.grad.normalized_risk_grad_of`, the single-instance O(T²) form, from
``W = 0`` (every token tied) to saturation far past the underflow of ``∇L``, including exactly
duplicated tokens (the selected token's twin). Where the single-instance form refuses the
direction (its gradient cancels to the rounding level of its own sum) the batched one must flag
the instance too.

Error model. Both forms are cancellation-free: every weight is a product of O(1) factors and one
exponential of a log-magnitude, each with a few ulps of relative error, and each entry of the
unit gradient is a sum of nT such terms divided by ``||G||``. The two forms round differently, so
their unit directions differ by at most ``ULPS·nT·eps·κ`` with ``κ = Σ_it |w_it| ||x_it|| ||z_i||
/ ||G||`` ≥ 1, the amplification of the sum. κ is not observable from outside the engines, and
where the gradient nearly cancels (κ up to ~1/(8·nT·eps), which the single form still accepts) the
two forms may legitimately differ by far more than for κ = O(1). The property therefore screens
each case with the single form itself: the same instance with its sequences and tokens in reverse
order is the same mathematics rounded differently; where its direction moves by more than
``SCREEN`` the case is rounding-sensitive (κ ≳ SCREEN/eps) and is skipped. Elsewhere the batched
direction must agree to ``RTOL_DIRECTION``.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import assume, event, example, given, note
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.errors import NumericalError
from attnsvm.gd import _stack_instances, _TorchBatch
from attnsvm.grad import normalized_risk_grad_of
from attnsvm.instance import Instance
from attnsvm.losses import get_loss

#: Agreement of the batched and single-instance unit directions: measured ≤ 7e-14 (tests/test_gd.py,
#: RTOL_FAST_PATH) where κ is O(1); 1e-10 leaves room for κ up to ~1e3.
RTOL_DIRECTION = 1e-10
#: Rounding-sensitivity screen: a case whose single-form direction moves by more than this when
#: its sequences and tokens are reversed has κ ≳ 1e4 (RTOL_DIRECTION/10: such a case could fail
#: the assertion through rounding alone).
SCREEN = RTOL_DIRECTION / 10
LOSSES = ("logistic", "exponential", "correlation")


def _duplicate_top(inst: Instance, W: np.ndarray, copies: int) -> Instance:
    """Copy each sequence's highest-logit token over ``copies`` other tokens (exact duplicates)."""
    X = np.array(inst.X)
    logits = np.einsum("ntd,de,ne->nt", X, W, inst.z)
    for i in range(inst.n):
        r = int(np.argmax(logits[i]))
        others = [t for t in range(inst.T) if t != r][:copies]
        X[i, others] = X[i, r]
    return A.Instance(X=X, Y=inst.Y, z=inst.z, v=inst.v)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Instance, np.ndarray, str]:
    base = draw(
        S.feasible_instances(n=(1, 3), T=(2, 4))
        | S.instances(n=(1, 3), T=(2, 4), d=(1, 4), family="gaussian", bound=3.0)
    )
    direction = draw(S.directions(base.d))
    scale = draw(st.sampled_from([0.0, 1e-2, 1.0, 10.0, 100.0, 1e3, 1e4]))
    W = scale * direction
    copies = draw(st.integers(0, base.T - 1))
    inst = _duplicate_top(base, direction, copies) if copies else base
    event(f"||W|| = {scale:g}")
    event(f"duplicates of the top token: {copies}")
    return inst, W, draw(st.sampled_from(LOSSES))


def _single(inst: Instance, W: np.ndarray, loss: str):  # noqa: ANN202
    return normalized_risk_grad_of(
        np.array(inst.X), np.array(inst.Y), np.array(inst.z), np.array(inst.v), W, get_loss(loss)
    )


def _reversed(inst: Instance, W: np.ndarray, loss: str):  # noqa: ANN202
    """The single-form direction with the sequences and the tokens in reverse order."""
    rev = A.Instance(
        X=np.array(inst.X)[::-1, ::-1], Y=np.array(inst.Y)[::-1], z=np.array(inst.z)[::-1], v=inst.v
    )
    return _single(rev, W, loss)


#: Regression: three exact copies of the selected token at ||W|| = 1000 (the fast path's reference
#: score was the mean of the tied scores, off by an ulp; the log path took the twin as runner-up).
_TRIPLE = A.Instance(
    X=[[[1.0, 0.5, 0.0], [1.0, 0.5, 0.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.3]]],
    Y=[1.0],
    v=[0.3, -1.0, 0.7],
    z=[[1.0, 0.0, 0.0]],
)


@example(case=(_TRIPLE, 1000.0 * np.eye(3) / np.sqrt(3.0), "logistic"))
@given(cases())
def test_batched_direction_equals_single_instance_direction(case: tuple[Instance, np.ndarray, str]) -> None:
    inst, W, loss = case
    try:
        ref = _single(inst, W, loss)
    except NumericalError:
        ref = None  # the gradient cancels (or is exactly 0): the batched engine must flag it
    X, Y, z, v = _stack_instances([inst])
    lo = get_loss(loss)
    for fast in (True, False):
        eng = _TorchBatch(X, Y, z, v, lo, torch.device("cpu"), fast=fast)
        G, inv, log_norm, cancelled = eng.gradient(torch.as_tensor(W[None]))
        flagged = cancelled is not None and bool(cancelled[0])
        event(f"fast={fast}: path {max(eng.stats, key=eng.stats.get)}")
        if ref is None:
            event("single form refuses (cancellation)")
            assert flagged, "the single-instance form refuses this gradient; the batched one must flag it"
            continue
        if flagged:
            # only at the threshold itself may the two forms disagree about cancellation
            note("batched flags a gradient the single form accepts: near the cancellation threshold")
            assume(False)
        assume(np.linalg.norm(_reversed(inst, W, loss).direction - ref.direction) <= SCREEN)
        D = (G[0] * inv[0]).numpy()
        assert np.linalg.norm(D - ref.direction) <= RTOL_DIRECTION, (fast, np.linalg.norm(D - ref.direction))
        assert abs(float(log_norm[0]) - ref.log_norm) <= RTOL_DIRECTION * max(1.0, abs(ref.log_norm))
