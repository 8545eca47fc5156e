"""The batched GD engine refuses exactly where the single-run form does (public API).

:func:`attnsvm.gd.run_gd_batch` applies, per instance and per step, the refusals of
:func:`attnsvm.model._grad.normalized_risk_grad_of` (the direction behind :func:`attnsvm.gd.run_gd`):

* the gradient's contributions cancel to rounding level — now including the rounding of the token
  values ``a = vᵀx`` (``±d·eps·Σ_k|v_k x_k|`` each; exact copies of a token charge nothing): a
  normalized run raises ``NumericalError(CANCELLED_MESSAGE)`` naming the instance and the step;
* ``ℓ'(Y_i f_i)`` is undetermined (``f_i`` known only to ``±δf_i`` with ``κ·δf_i > 1``): both
  normalized and plain runs raise, naming the instance, the step and the sequence.

Oracles: hand-computed error terms (stated per test), exact directions in closed form, and the
single-run form :func:`run_gd` (an independent O(T²) NumPy implementation). The two cases pinned
from the property suite (``properties/test_gd_batch.py``) are the ones the batched engine used to
answer with a wrong direction: 0.93 (and 2.0) away from the exact one.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnsvm as A
from attnsvm.errors import NumericalError
from attnsvm.gd import run_gd, run_gd_batch
from attnsvm.model._grad import CANCELLED_MESSAGE

EPS = float(np.finfo(np.float64).eps)
#: The closed-form direction of a two-token instance at W = 0 against the batched one: one step of
#: lr = 1 from W0 = 0 gives W_1 = −D exactly; D is a unit matrix formed from a few products and one
#: norm (≤ 8 eps per entry).
RTOL_CLOSED_FORM = 8 * EPS

#: Two tokens x_1 = e_1, x_2 = e_2, query e_1 at W = 0 (s = ½ each). With v = (1, 1 + h):
#: ∇L = ℓ'(f)·¼·(a_1 − a_2)(x_1 − x_2) z_1ᵀ, ||∇L|| = |ℓ'|·¼·h·√2, while the values' rounding term is
#: VE = d·eps·|ℓ'|·Σ_t s_t s_u (m_t + m_u)·||x_t||·||z|| = 2·eps·|ℓ'|·½·(2 + h) ≈ 2·eps·|ℓ'|.
#: For h = 2^−52 = eps: ||∇L|| / (CANCELLATION_FACTOR·VE) = (√2/4)/16 ≈ 0.022 — refused by both
#: forms; for h = 2^−20 the ratio is 2^32 times larger — accepted.
_GAP_REFUSED = 2.0**-52
_GAP_ACCEPTED = 2.0**-20


def _two_tokens(h: float) -> A.Instance:
    return A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[1.0, 1.0 + h], z=[[1.0, 0.0]])


#: A well-conditioned companion instance (same shape), so that the refused one is not instance 0.
_GOOD = A.Instance(X=[[[1.0, 0.0], [0.0, 1.0]]], Y=[1.0], v=[1.0, 2.0], z=[[1.0, 0.0]])


@pytest.mark.parametrize("fast_path", [True, False])
def test_values_at_their_rounding_level_are_refused_like_run_gd(fast_path: bool) -> None:
    """Oracle: the hand-computed ratio above (0.022 < 1: refused) and run_gd, which refuses too."""
    bad = _two_tokens(_GAP_REFUSED)
    with pytest.raises(NumericalError, match="normalized GD at step 1: .*cancel to rounding level"):
        run_gd(bad, 1, 0.1)
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([_GOOD, bad], 1, 0.1, fast_path=fast_path)
    assert str(exc.value) == f"normalized GD at step 0: instance 1: {CANCELLED_MESSAGE}"


@pytest.mark.parametrize("fast_path", [True, False])
def test_values_above_their_rounding_level_give_the_closed_form_direction(fast_path: bool) -> None:
    """Oracle: the closed form D = sign·(e_1 − e_2) e_1ᵀ/√2 (a_1 < a_2 and ℓ' < 0: ∇L points along
    (x_1 − x_2) z_1ᵀ·(+1)); the same data with the gap at 2^−20 is accepted by both forms."""
    inst = _two_tokens(_GAP_ACCEPTED)
    traj = run_gd_batch([_GOOD, inst], 1, 1.0, fast_path=fast_path, record_at=[1])
    D = -traj.W[1]  # W_1 = W_0 − 1·D with W_0 = 0
    expected = np.array([[1.0, 0.0], [-1.0, 0.0]]) / np.sqrt(2.0)
    np.testing.assert_allclose(D, expected, rtol=0, atol=RTOL_CLOSED_FORM)
    np.testing.assert_allclose(run_gd(inst, 1, 1.0).W, traj.W[1], rtol=0, atol=RTOL_CLOSED_FORM)


#: Values ±1e16 on two tied tokens (W = 0): f = 0 but f is known only to ±(T+d)·eps·Σ_t s_t|a_t| =
#: 3·eps·1e16 ≈ 6.66 (the single form's δf), so ℓ'(f) is undetermined (κ·δf > 1 for the exponential
#: loss, κ = 1, and for the logistic one, κ = σ(δf) ≈ 0.999), and this sequence carries the gradient.
_UNDETERMINED = A.Instance(X=[[[1.0], [-1.0]]], Y=[1.0], v=[1e16], z=[[1.0]])
_UNDETERMINED_OK = A.Instance(X=[[[1.0], [-1.0]]], Y=[1.0], v=[1.0], z=[[1.0]])


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("fast_path", [True, False])
def test_undetermined_loss_derivative_is_refused_like_run_gd(
    loss: str, normalized: bool, fast_path: bool
) -> None:
    """Oracle: δf = 3·eps·1e16 ≈ 6.66 by hand (see above), and run_gd, which refuses with the same text."""
    with pytest.raises(NumericalError, match=r"undetermined") as single:
        run_gd(_UNDETERMINED, 1, 0.1, normalized=normalized, loss=loss)
    with pytest.raises(NumericalError) as batched:
        run_gd_batch(
            [_UNDETERMINED_OK, _UNDETERMINED], 1, 0.1, normalized=normalized, loss=loss, fast_path=fast_path
        )
    kind = "normalized" if normalized else "plain"
    prefix = f"{kind} GD at step 0: instance 1: "
    assert str(batched.value).startswith(prefix)
    # the same message as the single form's (after its own "<kind> GD at step 1: " prefix)
    assert str(batched.value)[len(prefix) :] == str(single.value).split(": ", 1)[1]
    assert "known only to ±6.66" in str(batched.value)


def test_correlation_loss_has_no_undetermined_derivative() -> None:
    """Oracle: ℓ' = −1 whatever f, so nothing is refused; at W = 0 the closed form is
    ∇L = −Σ_t ½·a_t x_t z = −½·(1e16 + 1e16) = −1e16, so D = −1 and W_1 = 0 − 1·D = 1."""
    traj = run_gd_batch([_UNDETERMINED], 1, 1.0, loss="correlation", record_at=[1])
    np.testing.assert_allclose(-traj.W[0], [[-1.0]], rtol=0, atol=RTOL_CLOSED_FORM)


# ------------------------------------------------------ cases found by the property suite
#: properties/test_gd_batch.py (sweep, 2026-12-01): the single form refuses (values at their rounding
#: level, VE/||∇L|| ≈ 33: the exact direction is 0.93 away from the computed one); the batched fast
#: path used to return that direction (its cheap bound missed the value term, and the weight outside
#: the selected token, 1 + 2e-122 − 1, was summed to 0).
FOUND_FAST = (
    A.Instance(
        X=[
            [
                [
                    -0.3589232573906625,
                    -0.8024770702062034,
                    -0.42008690578156666,
                    -0.2861792420413759,
                    -0.1744526678214021,
                    0.4869151856705379,
                ],
                [
                    -0.9565949148825111,
                    0.05070367433551942,
                    -0.473579322220497,
                    -0.17464049547064378,
                    0.5818979364383152,
                    -0.31402153172435904,
                ],
                [
                    -0.7568850514475851,
                    0.027551975638982262,
                    0.34929138161381623,
                    0.410141811752903,
                    0.020829236642167667,
                    0.6476482927522645,
                ],
                [
                    -0.07601043001073154,
                    0.646967735573275,
                    0.08841836928439256,
                    -0.6438902673764935,
                    -0.8396503315085759,
                    -0.14263142216180313,
                ],
            ]
        ],  # noqa: E501
        Y=[1.0],
        v=[
            0.6624217530826939,
            0.5582824333421912,
            0.09149868610710357,
            -0.4543631690038379,
            0.11900716800050722,
            0.1433092485582661,
        ],  # noqa: E501
        z=[
            [
                -0.3589232573906625,
                -0.8024770702062034,
                -0.42008690578156666,
                -0.2861792420413759,
                -0.1744526678214021,
                0.4869151856705379,
            ]
        ],  # noqa: E501
    ),
    np.array(
        [
            [
                333.26183438706727,
                -9.125979376805464,
                294.9376112624096,
                -95.77727363990832,
                -48.608037731245595,
                -129.21125052825775,
            ],
            [
                280.8697434464656,
                -161.37731694959916,
                -36.67582386613773,
                53.72045251551614,
                206.28460069097332,
                -60.63610957252571,
            ],
            [
                46.032636812054065,
                -115.1494115088475,
                55.11106765958502,
                -129.0245936489416,
                -34.16936735798798,
                -302.2654677690015,
            ],
            [
                -228.5883615317162,
                -157.3822663550293,
                -88.82195898896116,
                172.3205802816358,
                -5.997604786387142,
                -164.8112885405153,
            ],
            [
                59.872048175489,
                -35.44270448781275,
                -271.94517096192783,
                -167.80725133379514,
                187.82183185154076,
                102.79861220730346,
            ],
            [
                72.0983313680489,
                171.5641219913421,
                251.82401182131912,
                200.85032749064945,
                82.52622804963825,
                38.58400152930813,
            ],
        ]
    ),  # noqa: E501
    "exponential",
)
#: properties/test_gd_batch.py (sweep, 2026-12-01), shrunk: the single form refuses (VE/||∇L|| ≈ 29, a
#: token whose value differs from the selected one's only through the rounding of vᵀx); both batched
#: paths used to return a direction.
FOUND_SHRUNK = (
    A.Instance(
        X=[
            [
                [
                    -0.4005096022028539,
                    -0.06550596827161252,
                    -0.09047826498901713,
                    0.25251242250476624,
                    -0.23098092282580876,
                ],
                [
                    -0.06847562791080505,
                    -0.1568101543237338,
                    0.13565285347679243,
                    -0.3542381493867191,
                    -0.2771918121912412,
                ],
                [
                    0.27542418138458447,
                    0.14010712831185276,
                    -0.15094630949788246,
                    0.09995449220929961,
                    -0.3489066122058846,
                ],
                [
                    0.09510345542704746,
                    -0.059592810441326326,
                    0.4265390955372962,
                    0.22522400045054353,
                    -0.06886638736581686,
                ],
            ]
        ],  # noqa: E501
        Y=[-1.0],
        v=[0.0, 0.4362869929953702, 0.161916078854384, -0.17432481734166355, 0.05520598889861735],
        z=[
            [
                0.2594871596153454,
                0.24431580604333902,
                -0.30113650830104344,
                -0.15863347483045562,
                -0.08443000025834801,
            ]
        ],  # noqa: E501
    ),
    np.array(
        [
            [
                -1012.5169261650442,
                5251.338264949782,
                2436.8940203008365,
                -73.5379794026751,
                -7109.536485487716,
            ],
            [
                3480.388461547873,
                7562.875435746921,
                -1012.4016296473982,
                4406.470533252586,
                2484.7708420820845,
            ],
            [
                -900.0438869902773,
                -3979.8430995829112,
                2549.8826540364644,
                775.1079111039971,
                -3394.4491498292377,
            ],
            [-2518.0862042780477, -5271.696917144297, 679.579482964624, 979.8665431631781, 2162.85774079],
            [
                2129.0780555270007,
                -1147.2675687769536,
                3408.274583188646,
                -1439.217500278831,
                2222.2445303980385,
            ],
        ]
    ),  # noqa: E501
    "logistic",
)


@pytest.mark.parametrize("case", [FOUND_FAST, FOUND_SHRUNK], ids=["fast-path", "shrunk"])
@pytest.mark.parametrize("fast_path", [True, False])
def test_property_cases_are_refused_like_run_gd(
    case: tuple[A.Instance, np.ndarray, str], fast_path: bool
) -> None:
    """Oracle: run_gd from the same W0 (the single form) refuses at its first step; so must the batch."""
    inst, W, loss = case
    with pytest.raises(NumericalError, match="normalized GD at step 1: .*cancel to rounding level"):
        run_gd(inst, 1, 0.1, loss=loss, W0=W)
    with pytest.raises(NumericalError) as exc:
        run_gd_batch([inst], 1, 0.1, loss=loss, W0=W, fast_path=fast_path)
    assert str(exc.value) == f"normalized GD at step 0: instance 0: {CANCELLED_MESSAGE}"


#: properties/test_gd_batch.py (sweep, 2026-12-01): sequence 0 has z_0 = 0 (it contributes nothing) and
#: sequence 1 is saturated beyond float64 (logit gap ≈ 13669). The log-domain path factored out the
#: dead sequence's weight, so the live one underflowed to G = 0 and the instance was flagged as
#: cancelled (the fast path was certified by the dead sequence's weights, with the same result).
ZERO_QUERY = (
    A.Instance(
        X=[[[0.0], [-0.9276984509258305]], [[-0.5859492679359279], [0.5270293125002685]]],
        Y=[1.0, 1.0],
        v=[0.3293358698539904],
        z=[[0.0], [-0.5859492679359279]],
    ),
    np.array([[20956.455126986522]]),
)
#: W_1 = W_0 − D with |W_0| ≈ 2.1e4: the two runs' D agree to a few ulps (both log-domain, well
#: conditioned: d = 1, so D = ±1), and the subtraction rounds by ≤ eps/2·|W_0|: 4 ulps of |W_0|.
ATOL_ZERO_QUERY = 4 * EPS * 20956.455126986522


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_sequence_with_zero_query_does_not_hide_the_others(fast_path: bool) -> None:
    """Oracle: run_gd (the single form weighs each term with ||x_it||·||z_i|| before choosing the largest)
    and the closed form: with d = 1 the unit direction is ±1, so W_1 = W_0 ∓ 1."""
    inst, W = ZERO_QUERY
    single = run_gd(inst, 1, 1.0, W0=W)
    batched = run_gd_batch([inst], 1, 1.0, W0=W, fast_path=fast_path)
    assert abs(abs(float(single.W[0, 0] - W[0, 0])) - 1.0) <= ATOL_ZERO_QUERY
    np.testing.assert_allclose(batched.W[0], single.W, rtol=0, atol=ATOL_ZERO_QUERY)
