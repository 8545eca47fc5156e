"""The batched GD engine computes the single-instance direction, on both of its paths.

``run_gd_batch`` stacks instances and takes, per step and per instance, either a linear-domain
fast path or a log-domain path (:class:`attnsvm.gd.BatchEngine`); both must give the direction and
log-norm of :func:`attnsvm.model._grad.normalized_risk_grad_of`, the single-instance O(T²) form, from
``W = 0`` (every token tied) to saturation far past the underflow of ``∇L``, including exactly
duplicated tokens (the selected token's twin). Where the single-instance form refuses the
direction — its gradient cancels to the rounding level of its own sum or of the token values
``a = vᵀx``, or ``ℓ'(Y f)`` is undetermined — the batched one must flag the instance too
(``cancelled`` or ``undetermined``).

Error model. Both forms are cancellation-free: every weight is a product of O(1) factors and one
exponential of a log-magnitude, each with a few ulps of relative error, and each entry of the
unit gradient is a sum of nT such terms divided by ``||G||``. The two forms round differently, so
their unit directions differ by at most ``ULPS·nT·eps·κ`` with ``κ = Σ_it |w_it| ||x_it|| ||z_i||
/ ||G||`` ≥ 1, the amplification of the sum — plus what the rounding of their inputs carries: the
values ``a = vᵀx`` (``±d·eps·Σ|v_k x_k|`` each, relative error ``VE/||∇L||`` of the gradient) and the
logits (``±d²·eps·|x||W||z|``, which moves the weights at ``||W|| ≳ 1e5``). Where these exceed
``SCREEN`` float64 does not determine the answer to ``RTOL_DIRECTION`` and the case is skipped —
counted with ``event`` and bounded (``MAX_SCREENED_FRACTION``, asserted by
``test_screen_discards_are_rare``). Three screens: the values' sensitivity ``VE/||∇L||`` and the
single form's distance from the exact gradient, both from mpmath at 80 digits, and the single
form with its sequences and tokens in reverse order (the same mathematics rounded differently;
κ ≳ SCREEN/eps). Elsewhere the batched direction must agree to ``RTOL_DIRECTION``. Where the
batched engine flags a refusal the single form does not, the true gradient (mpmath) must be within
``FLAG_FACTOR`` of the cancellation threshold.

Strategy: ``W = c·U`` with ``c`` solved for a drawn runner-up attention weight (``RUNNER_UP``, and
``LOG_RUNNER_UP_BEYOND`` below float64), so saturated cases are the majority (~93 % in the ci
profile, against ``||W|| = 0`` in ~46 % before); ``target`` pushes towards the largest direction error.
Cases found by sweeps are pinned with ``@example`` (and, through the public API, in
``tests/test_gd_batch_refusals.py``).

Masks (issue 15 §2). ``test_batched_direction_equals_single_instance_direction_masked`` is the property's
twin (the plain test keeps its strategy, source and derandomized examples) on masked instances (masks
aimed at the score maximiser, its runner-up, a tie partner, the largest token, the query; a single
allowed token; feasible ones keep their optimal tokens) and sequence-to-sequence instances
(:meth:`attnsvm.Instance.from_sequences`, causal or not, right-padded with exact duplicate tokens), with
the same saturation regimes and exact duplicates of the top *allowed* token. The engine takes the data
as ``run_gd_batch`` gives it: rescaled to unit size with the masked tokens zeroed
(``BatchEngine.from_instances``, ``engine_instance``), and the masks; the
oracles read the same arrays at the iterate ``W·2^k`` the rescaling maps ``W`` to: the single form with
the mask (``normalized_risk_grad_of(..., mask=...)``), and the 80-digit mpmath conditioning with weight
exactly 0 at a masked token (no term in ``∇L``, ``Σ|w||x||z|`` or ``VE``). The same three screens set
cases aside, counted with ``event`` and bounded by ``bounded_discards`` (``MAX_SCREENED_FRACTION``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mpmath
import numpy as np
import pytest
import torch
from _discards import Tally, bounded_discards, too_many_discards
from hypothesis import event, example, given, note, settings, target
from hypothesis import strategies as st

import attnsvm as A
from attnsvm import strategies as S
from attnsvm.errors import NumericalError
from attnsvm.gd import BatchEngine, run_gd, run_gd_batch
from attnsvm.model._grad import CANCELLATION_FACTOR, normalized_risk_grad_of
from attnsvm.model._instance import Instance
from attnsvm.model._losses import get_loss

#: Agreement of the batched and single-instance unit directions: measured ≤ 7e-14 (tests/test_gd.py,
#: RTOL_FAST_PATH) where κ is O(1); 1e-10 leaves room for κ up to ~1e3.
RTOL_DIRECTION = 1e-10
#: Rounding-sensitivity screen: a case whose single-form direction moves by more than this when
#: its sequences and tokens are reversed has κ ≳ 1e4 (RTOL_DIRECTION/10: such a case could fail
#: the assertion through rounding alone).
SCREEN = RTOL_DIRECTION / 10
LOSSES = ("logistic", "exponential", "correlation")


def _duplicate_top(inst: Instance, W: np.ndarray, copies: int) -> Instance:
    """Copy each sequence's highest-logit token over ``copies`` other tokens (exact duplicates).

    With a mask: the highest-logit *allowed* token over allowed others (a copy in a masked slot would be
    no copy); the mask is kept. Without one this is the unmasked construction, unchanged."""
    X = np.array(inst.X)
    ok = inst.allowed
    logits = np.einsum("ntd,de,ne->nt", X, W, inst.z)
    if inst.mask is not None:
        logits = np.where(ok, logits, -np.inf)
    for i in range(inst.n):
        r = int(np.argmax(logits[i]))
        others = [t for t in range(inst.T) if t != r and ok[i, t]][:copies]
        X[i, others] = X[i, r]
    return A.Instance(X=X, Y=inst.Y, z=inst.z, v=inst.v, mask=inst.mask)


#: Saturation, in terms of the runner-up attention weight ρ (the largest non-top weight of the most
#: saturated sequence): ``log10 ρ`` log-uniform over [−300, −1] (the fast path's range, down to where
#: weights leave float64), and ``log ρ`` in [−1e5, −700] (beyond it: only the log-domain path is exact).
RUNNER_UP = (1e-300, 1e-1)
LOG_RUNNER_UP_BEYOND = (-1e5, -700.0)


def _log10_runner_up(inst: Instance, W: np.ndarray) -> float:
    """``log10`` of the largest non-top attention weight in the most saturated sequence (log-sum-exp)."""
    L = np.einsum("ntk,kj,nj->nt", inst.X, W, inst.z)
    Ls = -np.sort(-L, axis=1)
    i = int(np.argmax(Ls[:, 0] - Ls[:, 1]))
    lse = Ls[i, 0] + np.log(np.sum(np.exp(Ls[i] - Ls[i, 0])))
    return float((Ls[i, 1] - lse) / np.log(10.0))


#: The masked twin's data (module docstring): masked instances (feasible ones keep their optimal tokens)
#: and sequence-to-sequence ones, causal or not, right-padded with exact duplicates.
MASKED_BASE = (
    S.feasible_instances(n=(1, 3), T=(2, 4), masked=True)
    | S.instances(n=(1, 3), T=(2, 4), d=(1, 4), family="gaussian", bound=3.0, masked=True)
    | S.sequence_instances(n=(1, 2), T=(2, 3), d=(1, 4), bound=3.0)
    | S.sequence_instances(
        n=(1, 2), T=(2, 3), d=(1, 3), family="uniform", bound=3.0, padding=True, duplicates=True
    )
)


@st.composite
def cases(
    draw: st.DrawFn, base_strategy: st.SearchStrategy[Instance] | None = None
) -> tuple[Instance, np.ndarray, str]:
    base = draw(
        S.feasible_instances(n=(1, 3), T=(2, 4))
        | S.instances(n=(1, 3), T=(2, 4), d=(1, 4), family="gaussian", bound=3.0)
        if base_strategy is None
        else base_strategy
    )
    # W = c·U with c solving for the drawn runner-up weight: saturated cases are the majority (two
    # regimes of three, ~85 % in the ci profile); W = 0 (every token tied) the rest. The draw
    # shrinks towards ρ = 0.1.
    regime = draw(st.sampled_from(["saturated", "beyond float64", "W = 0"]))
    if regime == "saturated":
        W = draw(S.saturated_weights(base, runner_up=RUNNER_UP))
    elif regime == "beyond float64":
        W = draw(S.saturated_weights(base, log_runner_up=LOG_RUNNER_UP_BEYOND))
    else:
        W = np.zeros((base.d, base.d))
    if np.any(W != 0):
        # masked: the runner-up among the allowed tokens (−inf where every sequence keeps one token)
        lr = (
            _log10_runner_up(base, W) if base.mask is None else S.log_runner_up_weight(base, W) / np.log(10.0)
        )
        event(
            f"log10 runner-up weight in {'[-1, 0)' if lr >= -1 else '[-300, -1)' if lr >= -300 else '< -300'}"
        )
    event(f"regime: {regime}")
    copies = draw(st.integers(0, base.T - 1))
    inst = _duplicate_top(base, W if np.any(W != 0) else np.eye(base.d), copies) if copies else base
    event(f"duplicates of the top token: {copies}")
    return inst, W, draw(st.sampled_from(LOSSES))


def _single(inst: Instance, W: np.ndarray, loss: str):  # noqa: ANN202
    """The single-instance form (with the instance's mask, when it has one)."""
    mk = {} if inst.mask is None else {"mask": inst.mask}
    return normalized_risk_grad_of(
        np.array(inst.X), np.array(inst.Y), np.array(inst.z), np.array(inst.v), W, get_loss(loss), **mk
    )


def _reversed(inst: Instance, W: np.ndarray, loss: str):  # noqa: ANN202
    """The single-form direction with the sequences and the tokens in reverse order (the mask with them)."""
    mask = None if inst.mask is None else inst.mask[::-1, ::-1]
    rev = A.Instance(
        X=np.array(inst.X)[::-1, ::-1],
        Y=np.array(inst.Y)[::-1],
        z=np.array(inst.z)[::-1],
        v=inst.v,
        mask=mask,
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


#: Sweep (2026-12-01): the single form refuses (VE/||∇L|| ≈ 33); the fast path returned a direction 0.93 from the exact one.
_FOUND_FAST = (
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
        ],
        Y=[1.0],
        v=[
            0.6624217530826939,
            0.5582824333421912,
            0.09149868610710357,
            -0.4543631690038379,
            0.11900716800050722,
            0.1433092485582661,
        ],
        z=[
            [
                -0.3589232573906625,
                -0.8024770702062034,
                -0.42008690578156666,
                -0.2861792420413759,
                -0.1744526678214021,
                0.4869151856705379,
            ]
        ],
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
    ),
    "exponential",
)

#: Sweep (2026-12-01): shrunk; the single form refuses (VE/||∇L|| ≈ 29); both batched paths returned a direction.
_FOUND_SHRUNK = (
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
        ],
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
        ],
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
    ),
    "logistic",
)

#: Sweep (2026-12-01): ||W|| ≈ 3e7: the logits' rounding moves both forms by ~1e-10 from the exact gradient (screened).
_FOUND_LOGITS = (
    A.Instance(
        X=[
            [
                [
                    0.37745287107968456,
                    -0.22830471075808362,
                    0.0829272990112762,
                    0.2970706626276745,
                    -0.2239374379934158,
                ],
                [
                    0.37745287107968456,
                    -0.22830471075808362,
                    0.0829272990112762,
                    0.2970706626276745,
                    -0.2239374379934158,
                ],
                [
                    0.37745287107968456,
                    -0.22830471075808362,
                    0.0829272990112762,
                    0.2970706626276745,
                    -0.2239374379934158,
                ],
                [
                    -0.164335073944327,
                    0.02223768451668298,
                    0.3192924894343163,
                    -0.13168468963218422,
                    -0.35611422810335247,
                ],
            ]
        ],
        Y=[-1.0],
        v=[
            0.7228134577944552,
            0.3886506946531612,
            -0.3895008793467959,
            -1.3306718602144423,
            -0.16645363007341055,
        ],
        z=[
            [
                -0.6339984613973687,
                -0.6015900805356902,
                0.5966720202817087,
                0.6428692033612751,
                0.17128051123643473,
            ]
        ],
    ),
    np.array(
        [
            [
                -10356514.310924724,
                4213117.191896059,
                595320.3260007697,
                -53588.342337930255,
                -4600807.783380415,
            ],
            [8036670.60671396, 10156781.90080314, 5830117.165038304, 3274399.3667858676, 257201.54288375308],
            [
                1749324.1770997066,
                1386991.8413933467,
                -4246216.217045089,
                8424946.742372902,
                -2970778.424373259,
            ],
            [
                -8453985.89370094,
                2866718.712163149,
                -4452947.257738028,
                -87557.29882352418,
                15625262.657764176,
            ],
            [
                -1707029.328844878,
                8499796.349846363,
                1726613.7876714056,
                1482044.3624869538,
                -2515523.7053847443,
            ],
        ]
    ),
    "logistic",
)

#: Sweep (2026-12-01): z_0 = 0 (a dead sequence) beside one saturated beyond float64: the log path
#: factored out the dead sequence's weight and flagged the live gradient (underflowed to 0) as cancelled.
_FOUND_ZERO_QUERY = (
    A.Instance(
        X=[[[0.0], [-0.9276984509258305]], [[-0.5859492679359279], [0.5270293125002685]]],
        Y=[1.0, 1.0],
        v=[0.3293358698539904],
        z=[[0.0], [-0.5859492679359279]],
    ),
    np.array([[20956.455126986522]]),
    "logistic",
)


#: The single form accepts a gradient iff ||∇L|| > CANCELLATION_FACTOR·nT·eps·Σ|w||x||z| as *computed*;
#: each computed ||∇L|| is off from the true one by at most ~nT·eps·Σ|w||x||z| (its own rounding),
#: so where the batched engine flags a gradient the single form accepts, the true ratio
#: ||∇L|| / (nT·eps·Σ|w||x||z|) is at most CANCELLATION_FACTOR + 1 (+ the rounding of Σ itself);
#: factor 2 is the stated margin.
FLAG_FACTOR = 2.0
#: A range decision made from rounded log-magnitudes may go either way within this factor of the range's
#: ends (properties/test_scale_core.py's RANGE_SLACK).
RANGE_SLACK = 4.0
FLOAT_TINY = float(np.finfo(np.float64).tiny)
FLOAT_MAX = float(np.finfo(np.float64).max)
#: The reversed-order screen may discard at most this fraction of the examples (the rest are
#: asserted); checked by test_screen_discards_are_rare.
MAX_SCREENED_FRACTION = 0.05
_screen = {"screened": 0, "all": 0}


def _loss_derivative_mp(loss: str, u: mpmath.mpf) -> mpmath.mpf:
    if loss == "logistic":
        return -1 / (1 + mpmath.exp(u))
    if loss == "exponential":
        return -mpmath.exp(-u)
    return mpmath.mpf(-1)


class _MpRatios(NamedTuple):
    cancellation: (
        float  # ||∇L|| / (nT·eps·Σ|w||x||z| + VE): the single form refuses below CANCELLATION_FACTOR
    )
    values: float  # VE / ||∇L||: the direction's sensitivity to the rounding of the values a = vᵀx
    direction: np.ndarray | None  # the exact unit direction (None for ∇L = 0)
    log_norm: float  # the exact log||∇L||


def _mp_ratios(inst: Instance, W: np.ndarray, loss: str) -> _MpRatios:
    """The float64 conditioning of ``∇L`` at 80 digits (mpmath oracle: softmax with an unbounded
    exponent range, the centred values ``Σ_u s_u (a_t − a_u)``, no float64 anywhere).

    ``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (m_it + m_iu) ||x_it|| ||z_i|| / n`` with
    ``m_it = Σ_k |v_k x_itk|``: each value ``vᵀx`` rounds by up to ``d·eps·m``, and a difference
    ``a_t − a_u`` carries both roundings (exact copies of a token round alike and charge nothing).

    Token masks: a masked token's weight is exactly 0 (its logit ``−inf``): it adds no term to ``∇L``,
    ``Σ|w||x||z|`` or ``VE``, and the softmax runs over the allowed tokens.
    """
    with mpmath.workdps(80):
        X = [[[mpmath.mpf(float(x)) for x in tok] for tok in seq] for seq in np.asarray(inst.X)]
        z = [[mpmath.mpf(float(x)) for x in q] for q in np.asarray(inst.z)]
        v = [mpmath.mpf(float(x)) for x in np.asarray(inst.v)]
        Wm = [[mpmath.mpf(float(x)) for x in row] for row in W]
        n, T, d = inst.n, inst.T, inst.d
        G = [[mpmath.mpf(0)] * d for _ in range(d)]
        mag = mpmath.mpf(0)
        ve = mpmath.mpf(0)
        eps = mpmath.mpf(2) ** -52
        ok = inst.allowed  # all True without a mask
        for i in range(n):
            Wz = [mpmath.fsum(Wm[k][j] * z[i][j] for j in range(d)) for k in range(d)]
            logit = [mpmath.fsum(X[i][t][k] * Wz[k] for k in range(d)) for t in range(T)]
            top = max(lt for lt, keep in zip(logit, ok[i], strict=True) if keep)
            e = [
                mpmath.exp(lt - top) if keep else mpmath.mpf(0) for lt, keep in zip(logit, ok[i], strict=True)
            ]
            S_ = mpmath.fsum(e)
            s = [x / S_ for x in e]
            a = [mpmath.fsum(X[i][t][k] * v[k] for k in range(d)) for t in range(T)]
            m = [mpmath.fsum(abs(X[i][t][k] * v[k]) for k in range(d)) for t in range(T)]
            f = mpmath.fsum(s[t] * a[t] for t in range(T))
            y = mpmath.mpf(float(inst.Y[i]))
            dl = _loss_derivative_mp(loss, y * f)
            zn = mpmath.sqrt(mpmath.fsum(q * q for q in z[i]))
            for t in range(T):
                c = mpmath.fsum(s[u] * (a[t] - a[u]) for u in range(T))
                w = dl * y * s[t] * c / n
                xn = mpmath.sqrt(mpmath.fsum(x * x for x in X[i][t]))
                mag += abs(w) * xn * zn
                mix = mpmath.fsum(s[u] * (m[t] + m[u]) for u in range(T) if X[i][u] != X[i][t])
                ve += d * eps * abs(dl) * s[t] * mix * xn * zn / n
                for k in range(d):
                    for j in range(d):
                        G[k][j] += w * X[i][t][k] * z[i][j]
        gn = mpmath.sqrt(mpmath.fsum(g * g for row in G for g in row))
        level = n * T * eps * mag + ve
        return _MpRatios(
            float(gn / level) if level > 0 else 0.0,
            float(ve / gn) if gn > 0 else float("inf"),
            np.array([[float(g / gn) for g in row] for row in G]) if gn > 0 else None,
            float(mpmath.log(gn)) if gn > 0 else -float("inf"),
        )


@example(case=(_TRIPLE, 1000.0 * np.eye(3) / np.sqrt(3.0), "logistic"))
@example(case=_FOUND_FAST)
@example(case=_FOUND_SHRUNK)
@example(case=_FOUND_LOGITS)
@example(case=_FOUND_ZERO_QUERY)
@given(cases())
def test_batched_direction_equals_single_instance_direction(case: tuple[Instance, np.ndarray, str]) -> None:
    """Oracles: the single-instance O(T²) form (numpy) for the direction and log-norm; mpmath (80
    digits) for the conditioning where the two forms may legitimately differ (see the module doc)."""
    inst, W, loss = case
    try:
        ref = _single(inst, W, loss)
    except NumericalError as exc:
        ref = None  # refused (cancellation, exact 0, undetermined ℓ'): the batched engine must flag it
        why = "undetermined ℓ'" if "undetermined" in str(exc) else "cancellation"
    lo = get_loss(loss)
    try:
        engines = [BatchEngine.from_instances([inst], loss=lo, path=p) for p in ("auto", "log")]
    except NumericalError as exc:
        _assert_values_out_of_range(inst, exc)
        return
    # the engine computes at W' = W·2^k (its data rescaled by exact powers of two; k = 0 for unit-size
    # data): the direction is the same, log||∇_W L|| = log||∇_W' L|| + k ln 2
    k = int(engines[0].scale_exponents[0])
    if k:
        event("data rescaled to unit size")
    mp: list[_MpRatios] = []

    def ratios() -> _MpRatios:
        if not mp:
            mp.append(_mp_ratios(inst, W, loss))
        return mp[0]

    for eng in engines:
        fast = eng.path == "auto"
        G, inv, log_norm, cancelled = eng.gradient(eng.to_engine_scale(torch.as_tensor(W[None])))
        log_norm = log_norm + k * math.log(2.0)
        flagged = (cancelled is not None and bool(cancelled[0])) or (
            eng.undetermined is not None and bool(eng.undetermined[0])
        )
        event(f"fast={fast}: path {max(eng.stats, key=eng.stats.get)}")
        if ref is None:
            event(f"single form refuses ({why})")
            assert flagged, "the single-instance form refuses this gradient; the batched one must flag it"
            continue
        if flagged:
            # the two forms may disagree about a refusal only at the threshold itself: check that the
            # true gradient is within FLAG_FACTOR of it (mpmath oracle), then nothing to compare
            ratio = ratios().cancellation
            event("batched flags a gradient the single form accepts (asserted: at the threshold)")
            note(f"true ||∇L|| / (nT·eps·Σ|w||x||z| + VE) = {ratio:.3g}")
            assert ratio <= FLAG_FACTOR * CANCELLATION_FACTOR, ratio
            continue
        _screen["all"] += 1
        if ratios().values > SCREEN:
            # the values' rounding alone moves the direction by up to VE/||∇L|| > SCREEN (both forms
            # round a = vᵀx in their own order): counted, bounded below
            _screen["screened"] += 1
            event("screened: values at their rounding level (mpmath VE/||∇L|| > SCREEN)")
            continue
        exact = ratios()
        if (
            exact.direction is None
            or np.linalg.norm(ref.direction - exact.direction) > SCREEN
            or abs(ref.log_norm - exact.log_norm) > SCREEN * max(1.0, abs(exact.log_norm))
        ):
            # the reference itself is further than SCREEN from the exact gradient (the rounding of the
            # logits, ≈ d²·eps·|x||W||z| absolute, moves the weights at ||W|| ≳ 1e5): float64 does not
            # determine the answer to RTOL_DIRECTION here. Counted, bounded below.
            _screen["screened"] += 1
            event("screened: the single form is > SCREEN from the exact (mpmath) gradient")
            continue
        if np.linalg.norm(_reversed(inst, W, loss).direction - ref.direction) > SCREEN:
            _screen["screened"] += 1  # rounding-sensitive (κ ≳ 1e4): counted, bounded below
            event("screened: rounding-sensitive (reversed order moves the direction > SCREEN)")
            continue
        D = (G[0] * inv[0]).numpy()
        err = float(np.linalg.norm(D - ref.direction))
        target(err, label=f"direction error, fast={fast}")
        assert err <= RTOL_DIRECTION, (fast, err)
        assert abs(float(log_norm[0]) - ref.log_norm) <= RTOL_DIRECTION * max(1.0, abs(ref.log_norm))


def test_screen_discards_are_rare() -> None:
    """Runs after the property (file order): the rounding-sensitivity screen discarded at most
    MAX_SCREENED_FRACTION of the compared cases."""
    if _screen["all"] == 0:
        pytest.skip("selected alone: the property did not run in this session")
    if settings.get_current_profile_name() == "mutation":
        # The bound measures the suite's power at the ci profile's 100 examples; the mutation
        # profile runs 25 (there one discarded example is already 4 %), so the rate is not checked
        # there: a mutant is judged by the assertions on the examples that were compared.
        pytest.skip("discard rate not checked in the mutation profile (25 examples)")
    assert not too_many_discards(_screen["screened"], _screen["all"], MAX_SCREENED_FRACTION), _screen


# ---------------------------------------------------------------- masked and sequence-to-sequence twin
_MASKED_TALLY = Tally()


def _screened(inst: Instance, W: np.ndarray, loss: str, ref: object, ratios: _MpRatios) -> str | None:
    """Why float64 does not determine this direction to ``RTOL_DIRECTION`` (the plain property's three
    screens, in its order), or None."""
    if ratios.values > SCREEN:
        return "values at their rounding level (mpmath VE/||∇L|| > SCREEN)"
    if (
        ratios.direction is None
        or np.linalg.norm(ref.direction - ratios.direction) > SCREEN  # type: ignore[attr-defined]
        or abs(ref.log_norm - ratios.log_norm) > SCREEN * max(1.0, abs(ratios.log_norm))  # type: ignore[attr-defined]
    ):
        return "the single form is > SCREEN from the exact (mpmath) gradient"
    if np.linalg.norm(_reversed(inst, W, loss).direction - ref.direction) > SCREEN:  # type: ignore[attr-defined]
        return "rounding-sensitive (reversed order moves the direction > SCREEN)"
    return None


def _assert_values_out_of_range(inst: Instance, exc: NumericalError) -> None:
    """``run_gd_batch``'s documented input refusal: the token values ``vᵀx`` leave float64's range at every
    rescaling (their products are off by ``2^±1000``). Allowed only where the bound ``d·max|v|·max|x|``
    (allowed tokens) is below the normal range, or ``max|v|·max|x|`` above it (oracle: the logs of the
    exact float64 inputs, by a factor ``RANGE_SLACK``)."""
    assert "normal range" in str(exc), str(exc)
    mv, mx = float(np.max(np.abs(inst.v))), float(np.max(np.abs(inst.keys)))
    assert mv > 0 and mx > 0, f"refused although every value is exactly 0: {exc}"
    lv = math.log(mv) + math.log(mx)
    tiny, big = math.log(FLOAT_TINY), math.log(FLOAT_MAX)
    assert lv + math.log(inst.d) < tiny + math.log(RANGE_SLACK) or lv > big - math.log(RANGE_SLACK), exc
    event("refused: token values out of float64's range (asserted)")


def _pinned_masked() -> tuple[tuple[Instance, np.ndarray], tuple[Instance, np.ndarray]]:
    """Two hard cases the few generated examples may miss: a causal sequence-to-sequence instance (2
    sequences × 4 positions, an exact duplicate token, first queries with one allowed token) and a masked
    3×4×4 instance (sequence 0's score maximiser, sequence 1's largest token, two tokens of sequence 2
    masked), each with a unit direction ``U`` to scale from moderate to far beyond float64 (||∇L|| from
    e^−0.4 to e^−1346 at the scales pinned below)."""
    rng = np.random.default_rng(15)
    Xs = rng.standard_normal((2, 4, 3))
    Xs[1, 2] = Xs[1, 0]
    Y = np.where(rng.random((2, 4)) < 0.5, -1.0, 1.0)
    seq = A.Instance.from_sequences(Xs, Y, rng.standard_normal(3), causal=True)
    U1 = rng.standard_normal((3, 3))
    base = A.random_instance(3, 4, 4, seed=15)
    mask = np.ones((3, 4), dtype=bool)
    mask[0, int(np.argmax(base.scores()[0]))] = False
    mask[1, int(np.argmax(np.linalg.norm(base.X[1], axis=1)))] = False
    mask[2, [0, 2]] = False
    masked = A.Instance(base.X, base.Y, base.v, base.z, mask=mask)
    U2 = rng.standard_normal((4, 4))
    return (seq, U1 / np.linalg.norm(U1)), (masked, U2 / np.linalg.norm(U2))


_SEQ_CAUSAL, _MASKED_TARGETS = _pinned_masked()


@bounded_discards(_MASKED_TALLY, MAX_SCREENED_FRACTION)
@example(case=(_SEQ_CAUSAL[0], 3000.0 * _SEQ_CAUSAL[1], "logistic"))
@example(case=(_SEQ_CAUSAL[0], 30.0 * _SEQ_CAUSAL[1], "correlation"))
@example(case=(_MASKED_TARGETS[0], 3e4 * _MASKED_TARGETS[1], "exponential"))
@example(case=(_MASKED_TARGETS[0], 300.0 * _MASKED_TARGETS[1], "logistic"))
@given(cases(MASKED_BASE))
def test_batched_direction_equals_single_instance_direction_masked(
    case: tuple[Instance, np.ndarray, str],
) -> None:
    """The plain property on masked and sequence-to-sequence instances (module docstring). Oracles: the
    single-instance O(T²) form with the mask (direction and log-norm); mpmath at 80 digits with weight 0
    at the masked tokens (conditioning, and the threshold where only one form refuses). The engine reads
    the data rescaled, keys zeroed, as ``run_gd_batch`` gives it; every selected token is allowed."""
    inst0, W0, loss = case
    event(f"instance: {S.instance_kind(inst0)}")
    _MASKED_TALLY.run += 1
    lo = get_loss(loss)
    try:
        engines = [BatchEngine.from_instances([inst0], loss=lo, path=p) for p in ("auto", "log")]
    except NumericalError as exc:
        _assert_values_out_of_range(inst0, exc)
        return
    inst = engines[0].engine_instance(0)  # the engine's data (rescaled, masked keys zeroed), as an instance
    assert (inst.mask is None) == (inst0.mask is None or bool(inst0.mask.all()))
    kb = engines[0].scale_exponents
    W = np.ldexp(W0, int(kb[0]))  # the iterate the rescaling maps W0 to (exact: a power of two)
    if kb[0]:
        event("data rescaled to unit size")
    try:
        ref = _single(inst, W, loss)
    except NumericalError as exc:
        ref = None  # refused (cancellation, exact 0, undetermined ℓ'): the batched engine must flag it
        why = (
            "undetermined ℓ'"
            if "undetermined" in str(exc)
            else "exactly zero"
            if "zero" in str(exc)
            else "cancellation"
        )
    mp: list[_MpRatios] = []

    def ratios() -> _MpRatios:
        if not mp:
            mp.append(_mp_ratios(inst, W, loss))
        return mp[0]

    compared = False
    for eng in engines:
        fast = eng.path == "auto"
        G, inv, log_norm, cancelled = eng.gradient(torch.as_tensor(W[None]))
        flagged = (cancelled is not None and bool(cancelled[0])) or (
            eng.undetermined is not None and bool(eng.undetermined[0])
        )
        logits, _ = eng.log_s(torch.as_tensor(W[None]))
        assert inst.allowed[
            np.arange(inst.n), logits[:, 0].argmax(dim=0).numpy()
        ].all()  # never a masked token
        event(f"fast={fast}: path {max(eng.stats, key=eng.stats.get)}")  # type: ignore[arg-type]
        if ref is None:
            event(f"single form refuses ({why})")
            assert flagged, "the single-instance form refuses this gradient; the batched one must flag it"
            continue
        if flagged:
            ratio = ratios().cancellation  # only at the threshold itself (mpmath), as in the plain property
            event("batched flags a gradient the single form accepts (asserted: at the threshold)")
            note(f"true ||∇L|| / (nT·eps·Σ|w||x||z| + VE) = {ratio:.3g}")
            assert ratio <= FLAG_FACTOR * CANCELLATION_FACTOR, ratio
            continue
        if not compared:
            why_screened = _screened(inst, W, loss, ref, ratios())
            if why_screened is not None:
                _MASKED_TALLY.discard(f"screened: {why_screened}")
                return
            compared = True
        D = (G[0] * inv[0]).numpy()
        assert np.all(np.isfinite(D))
        err = float(np.linalg.norm(D - ref.direction))
        target(err, label=f"direction error, fast={fast}")
        assert err <= RTOL_DIRECTION, (fast, err)
        assert abs(float(log_norm[0]) - ref.log_norm) <= RTOL_DIRECTION * max(1.0, abs(ref.log_norm))


#: Found by the masked twin in a random run (dev profile, 800 examples, 2026-12-02); no mask is involved: a
#: non-causal sequence-to-sequence instance (mask None) of the uniform family, one sequence of three tokens
#: (9.68e-275, 0), (0, 1), (0, 0), every position a query (the third a zero query), with a large W. The data's
#: largest entry is 1, so run_gd_batch does not rescale it (moderate branch), but x·z products reach 1e-549.
_MIXED_X = np.array([[9.68302956e-275, 0.0], [0.0, 1.0], [0.0, 0.0]])
_MIXED_W = np.array([[0.0, 2.03113637e274], [2.14751130e274, -1.00331680e272]])


def _mixed(v: float) -> Instance:
    return A.Instance(np.stack([_MIXED_X] * 3), np.ones(3), np.array([v, v]), _MIXED_X.copy())


def test_finding_engine_direction_on_mixed_magnitude_data() -> None:
    """Regression (was a strict xfail): with v = 3e-237 both engine paths returned the direction e_11 with
    log||∇L|| = −1.0e272 where the single form gives e_10 at −1179 (log10 ||∇L|| −4.4e11 against −512.0).
    Cause: ``torch.linalg.vector_norm`` of the query (9.68e-275, 0) squares to 0, so sequence 0 read as dead
    and the scale came from sequence 1 (weight e^−1e272); and the products c·x·z ≈ 3e-237·1e-274 of the live
    sequence underflowed (the engine factored out the largest loss factor, not the largest term). Now
    the norms of tiny rows are formed scaled, and such "mixed" instances run the log-domain path on
    per-sequence power-of-two scaled data (``BatchEngine._init_mixed``).

    Oracle: run_gd (the single form) on the same data. At ``W = 1e-260·_MIXED_W`` (||W|| ≈ 3e14) one
    normalized step of run_gd_batch must equal run_gd's to RTOL_DIRECTION and record the same log10 ||∇L||."""
    inst, W = _mixed(2.99877753e-237), 1e-260 * _MIXED_W
    tr = run_gd(inst, 1, 0.1, W0=W, record_at=1)
    for fast_path in (True, False):
        bt = run_gd_batch([inst], 1, 0.1, W0=W[None], fast_path=fast_path, record_at=1)
        assert np.linalg.norm(bt.W[0] - tr.W) <= RTOL_DIRECTION * 0.1, fast_path
        assert abs(bt.log10_grad_norms[-1, 0] - tr.log10_grad_norms[-1]) <= RTOL_DIRECTION * 512, fast_path


def test_finding_engine_refuses_a_clear_gradient_on_mixed_magnitude_data() -> None:
    """Regression (was a strict xfail): with v = 1 both engine paths flagged the gradient as cancelled
    (NumericalError) where run_gd steps. Cause: the query norm ||(9.68e-275, 0)|| underflowed to 0 in
    ``vector_norm``, so the one sequence that carries ∇L (≈ e^−635) read as dead and G was 0.

    Oracle: run_gd (the single form), and mpmath: ||∇L|| / (nT·eps·Σ|w||x||z| + VE) = 4.1e14, far above
    the refusal threshold CANCELLATION_FACTOR = 8. run_gd takes the step; run_gd_batch must too, and record
    the same log10 ||∇L|| (run_gd's, and mpmath's exact one, ≈ −275.8). A step of 0.1 does not show on entries
    of 2e274, so the iterates are compared entrywise (max-abs: ||W||_F of such entries overflows in numpy)."""
    inst = _mixed(1.0)
    exact = _mp_ratios(inst, _MIXED_W, "logistic")
    assert exact.cancellation > 1e14
    tr = run_gd(inst, 1, 0.1, W0=_MIXED_W, record_at=[0])
    lg_exact = exact.log_norm / math.log(10.0)
    assert abs(tr.log10_grad_norms[0] - lg_exact) <= RTOL_DIRECTION * abs(lg_exact)
    for fast_path in (True, False):
        bt = run_gd_batch([inst], 1, 0.1, W0=_MIXED_W[None], fast_path=fast_path, record_at=[0])
        assert np.max(np.abs(bt.W[0] - tr.W)) <= RTOL_DIRECTION * np.max(np.abs(tr.W)), fast_path
        assert abs(bt.log10_grad_norms[0, 0] - lg_exact) <= RTOL_DIRECTION * abs(lg_exact), fast_path


def _tiny_component() -> Instance:
    """Found by the masked twin in a random run (dev, seed 7, 2026-12-02), made generic: every entry of X
    and z about 2e-182, ``v = (1, 2.3e-182)``. The token values ``vᵀx ≈ 2e-182`` are normal doubles
    (``Instance.values()`` returns them; ``A.normalized_risk_grad`` gives the direction, log-norm −1255.7);
    only the term ``v_1 x_1 ≈ 1e-363`` underflows, 1e-182 of the value."""
    x = 2.32477421e-182
    rng = np.random.default_rng(0)
    X, z = x * rng.standard_normal((2, 3, 2)), x * rng.standard_normal((2, 2))
    return A.Instance(X, np.array([1.0, -1.0]), np.array([1.0, x]), z)


def test_gd_takes_normal_token_values_with_a_tiny_component_of_v() -> None:
    """Regression (found by a masked twin, 2026-12-02: run_gd and run_gd_batch refused "the token values
    ... about 1e-363: it underflows" although every value is ≈ 2e-182: v·2^ex rounded v_1 to 0, harmless
    for the values). Oracle: ``A.normalized_risk_grad`` at ``W = 0`` (the core, which accepts the data): one
    normalized step from 0 is ``−lr·D(0)``, for run_gd and run_gd_batch."""
    inst = _tiny_component()
    assert np.all(np.abs(inst.values()) > 1e-183)  # normal values (the documented range test passes)
    D = A.normalized_risk_grad(inst, np.zeros((2, 2))).direction
    bt = run_gd_batch([inst], 1, 0.1)
    assert np.linalg.norm(bt.W[0] + 0.1 * D) <= RTOL_DIRECTION * 0.1
    tr = A.run_gd(inst, 1, 0.1)
    assert np.linalg.norm(tr.W + 0.1 * D) <= RTOL_DIRECTION * 0.1
