"""Scale sweep of the Lipschitz bounds, estimates and Jacobian norms (issue 13 §2).

Data: :func:`attnsvm.strategies.scaled_instances` over every instance family (gaussian, unit,
uniform): ``X``, ``z``, ``v`` multiplied exactly by ``2^jx``, ``2^jz``, ``2^jv``, the three exponents
drawn independently over the whole float64 range and shrinking towards 0, so a failure shrinks to
the smallest scale that breaks.

Oracle: the equivariance of the maps (attnsvm.lipschitz module docstring). With
``l_it = x_itᵀ W z_i``, scaling ``X → 2^jx X``, ``z → 2^jz z`` and ``W → 2^-(jx+jz) W`` keeps every
logit, so the weights map's constant on the ball ``2^-(jx+jz) R`` is ``2^(jx+jz)`` times the constant
on the ball ``R`` at scale 1; ``v → 2^jv v`` scales the values, so the output map's constant gains
``2^(jx+jv)``:

    k_weights = jx + jz,        k_output = 2jx + jz + jv.

The answer at the scaled data must be ``2^k`` times the answer at scale 1 when that is a normal
double, and a NumericalError naming float64's normal range exactly when it is not. attnsvm carries
every scale as an integer exponent, so the equivariance holds *exactly* (bit for bit); the tests
assert equality, which is stronger than a comparison in log space. Independently of attnsvm's code,
soundness is checked at scale 1 against the Jacobian of an independent torch implementation
(``torch.func.jacrev`` of torch softmax/elu), which with the equivariance is soundness at every scale
(in log space: ``log J_s = log J_1 + k ln 2 ≤ log B_1 + k ln 2 = log B_s``).

Radii and points. A radius ``r`` (or point ``W_u``) is put at the scaled data as ``r·2^t`` and at
scale 1 as ``r·2^(t + jx + jz)``, with ``t`` the shift closest to ``−(jx + jz)`` (logits of order one
at the scaled data) for which both are exact normal doubles; such a ``t`` exists unless
``|jx + jz| ≳ 2040``. The linear maps do not depend on the radius or the point: they keep ``r``.

References and discards. Where the answer at scale 1 is not representable (uniform draws made only
of tiny entries), the reference becomes the same data rescaled exactly to largest entries in
``[½, 1)`` (with the exponents taken relative to it; an event). An example is set aside
(``hypothesis.event``, counted, at most ``_discards.MAX_DISCARD_FRACTION`` = 5 % per property,
asserted) only when no reference is representable, when the radius or point has no representable pair
(``|jx + jz| ≳ 2040``), or when the estimate's Jacobian at the reference is below its float64
rounding level.

Masks (issue 15 §2). Each property has a ``*_masked`` twin on the same sweep over masked instances (every
family; masks aimed at the hard cases: the score maximiser, a tie partner, the largest token, the query
token, a single allowed token) and sequence-to-sequence instances
(:meth:`attnsvm.Instance.from_sequences`, causal or not, right-padded or not), so the plain examples stay
those of before. A twin runs the plain property's own body (``inner_test``: the same claims and tally) on
that data. The scaling keeps the mask and scales the masked tokens with the others
(:func:`attnsvm.strategies.scaled`); the equivariance is the same (a masked token is never read), and the
oracles apply the mask themselves: the torch maps (``_torch_jac``) give a masked token weight 0 (a torch
softmax of the logits, or of ``log φ``, with the masked entries ``−inf``; ``linear``: 0), ``||𝓛||₂`` is
the SVD of the allowed tokens' Kronecker rows (deletion), the tolerances read the keys (masked tokens 0),
and the O(1) reference is the keys rescaled by their own exponent (a masked token sets no scale). The kind
drawn is counted with ``hypothesis.event`` (:func:`attnsvm.strategies.instance_kind`). One property has no
plain counterpart: masked tokens of any size (``2^j`` times, ``j`` over the whole range) change no result
bit (``test_masked_tokens_of_any_size_change_nothing_masked``; oracle: the masked tokens set to 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _discards import Tally, bounded_discards
from hypothesis import event, given, settings
from hypothesis import strategies as st

from attnsvm import strategies as S
from attnsvm.errors import NumericalError
from attnsvm.lipschitz import jacobian_norm, lipschitz_bound, lipschitz_estimate, logit_norm
from attnsvm.model._instance import Instance

EPS = float(np.finfo(np.float64).eps)
KINDS = ("softmax", "linear", "normalized_linear")
OFS = ("weights", "output")
#: Message of the scale contract's range error (attnsvm.scaling.range_error).
RANGE_MESSAGE = "float64's normal range [2.2e-308, 1.8e308]"
#: A singular value from a backward-stable SVD of an ``m × p`` matrix is within ``~(m + p)·eps``
#: relative of exact; 8 ulps of headroom per dimension (as in properties/test_lipschitz.py).
SVD_ULPS = 8.0
#: Absolute rounding of a float64 Jacobian norm at O(1) logits, in units of ``eps·||𝓛||_F·(1 + max|a|)``
#: (each entry a T-term sum of products of weights with ``z_j x_k``; 8 ulps per term of headroom).
JAC_ULPS = 8.0

small = {"n": (1, 2), "T": (2, 3), "d": (1, 3)}
bases = st.sampled_from(S.INSTANCE_FAMILIES).flatmap(lambda f: S.instances(family=f, **small))
sweeps = S.scaled_instances(bases)
#: The ``*_masked`` twins' data: masked instances of every family and sequence-to-sequence ones (``n·T``
#: query rows: ``n ≤ 2, T ≤ 3``), causal or not, right-padded or not, swept over the same scales.
bases_masked = st.sampled_from(S.INSTANCE_FAMILIES).flatmap(
    lambda f: S.instances(family=f, masked=True, **small)
) | st.sampled_from(S.INSTANCE_FAMILIES).flatmap(
    lambda f: S.sequence_instances(n=(1, 2), T=(2, 3), d=(1, 3), family=f, padding=True)
)
sweeps_masked = S.scaled_instances(bases_masked)
#: Data of the masked-token test: as ``bases_masked`` with the sequence-to-sequence instances causal (a
#: mask on every one; the masked instances still shrink to no mask).
sweeps_junk = S.scaled_instances(
    st.sampled_from(S.INSTANCE_FAMILIES).flatmap(lambda f: S.instances(family=f, masked=True, **small))
    | st.sampled_from(S.INSTANCE_FAMILIES).flatmap(
        lambda f: S.sequence_instances(n=(1, 2), T=(2, 3), d=(1, 3), family=f, causal=True, padding=True)
    )
)
radii = st.floats(0.05, 8.0)


def unit_points(d: int) -> st.SearchStrategy[np.ndarray]:
    """Points ``W_u``: entries in ``{−1, −7/8, …, 1}`` (exact under every shift that stays normal)."""
    return st.lists(st.integers(-8, 8), min_size=d * d, max_size=d * d).map(
        lambda v: np.array(v, dtype=np.float64).reshape(d, d) / 8.0
    )


costly = settings(max_examples=max(20, settings.default.max_examples // 4))


def _pow2(a: np.ndarray) -> int:
    m = float(np.max(np.abs(a)))
    return math.frexp(m)[1] if m > 0 else 0


def _references(si: S.ScaledInstance) -> list[S.ScaledInstance]:
    """The references to try, in order: the drawn data at scale 1, then (where that answer is not
    representable, e.g. uniform draws made only of tiny entries) the same data rescaled exactly to
    largest entries in ``[½, 1)``, with the exponents relative to it (only when that rescaling is exact).
    Masked: the keys (masked tokens 0, never read) with an explicit ``z`` set the exponents and make the
    reference, and the exactness is that of the keys."""
    if si.inst.mask is not None:
        return _references_masked(si)
    inst = si.inst
    eX, ev = _pow2(inst.X), _pow2(inst.v)
    ez = eX if inst.self_attention else _pow2(inst.z)
    ref = S.scaled(inst, -eX, -ez, -ev)
    back = S.scaled(ref, eX, ez, ev)
    exact = all(np.array_equal(a, b) for a, b in ((back.X, inst.X), (back.z, inst.z), (back.v, inst.v)))
    return [si, S.ScaledInstance(inst, ref, eX, ez, ev)] if exact else [si]


def _references_masked(si: S.ScaledInstance) -> list[S.ScaledInstance]:
    """:func:`_references` of a masked instance: the O(1) reference is the keys (masked tokens 0: the
    maps never read them, so they set no exponent and cannot overflow the rescaling) and ``z`` rescaled by
    their own exponents; a masked query token ``x_i0`` stays the query (``z`` explicit)."""
    inst = si.inst
    eX, ez, ev = _pow2(inst.keys), _pow2(inst.z), _pow2(inst.v)
    keys = Instance(inst.keys, inst.Y, inst.v, inst.z, mask=inst.mask)
    with np.errstate(under="ignore"):
        ref = S.scaled(keys, -eX, -ez, -ev)
    back = S.scaled(ref, eX, ez, ev)
    exact = all(np.array_equal(a, b) for a, b in ((back.X, keys.X), (back.z, keys.z), (back.v, keys.v)))
    return [si, S.ScaledInstance(inst, ref, eX, ez, ev)] if exact else [si]


def _kind(si: S.ScaledInstance) -> None:
    event(f"instance: {S.instance_kind(si.original)}")


def _run(tally: Tally, si: S.ScaledInstance, check: Callable[[S.ScaledInstance], str | None]) -> None:
    """Run ``check`` against each reference until one is representable; else set the example aside."""
    tally.run += 1
    why = "no reference"
    for k, ref in enumerate(_references(si)):
        if k:
            event("scale-1 answer not representable: reference = the data rescaled to O(1)")
        res = check(ref)
        if res is None:
            return
        why = res
    tally.discard(why)


def _k(si: S.ScaledInstance, of: str) -> int:
    return si.jx + si.jz + (si.jx + si.jv if of == "output" else 0)


def _ld(x: float, k: int) -> float:
    """``x·2^k`` (0 or inf outside the range; math.ldexp would raise on overflow)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(x, k))


def _normal(x: float) -> bool:
    return math.isfinite(x) and x != 0.0 and -1021 <= math.frexp(x)[1] <= 1024


def _pair(si: S.ScaledInstance, a: Any) -> tuple[Any, Any] | None:
    """``(a at the scaled data, a at scale 1)`` = ``(a·2^t, a·2^(t + jx + jz))`` with ``t`` the shift
    closest to ``−(jx + jz)`` (logits of order one at the scaled data) for which both keep every
    nonzero entry a normal double (module docstring); None when no such ``t`` exists."""
    shift = si.jx + si.jz
    mag = np.abs(np.asarray(a, dtype=np.float64))
    nz = mag[mag > 0]
    if nz.size == 0:
        return a, a
    e_hi, e_lo = math.frexp(float(np.max(nz)))[1], math.frexp(float(np.min(nz)))[1]
    lo, hi = -1021 - e_lo, 1024 - e_hi  # a·2^t keeps every entry normal iff lo ≤ t ≤ hi
    t_lo, t_hi = max(lo, lo - shift), min(hi, hi - shift)
    if t_lo > t_hi:
        return None
    t = max(t_lo, min(t_hi, -shift))
    a_s, a_1 = np.ldexp(a, t), np.ldexp(a, t + shift)
    if np.ndim(a) == 0:
        return float(a_s), float(a_1)
    return a_s, a_1


def _expect_scaled(ref: float, k: int, call: Callable[[], float], *extra_ok: float) -> None:
    """The scaled answer is ``ref·2^k`` exactly when that is a normal double (and every ``extra_ok``
    condition value is), else a NumericalError naming float64's normal range."""
    expected = math.ldexp(ref, k) if ref != 0.0 and -1021 <= math.frexp(ref)[1] + k <= 1024 else None
    if ref == 0.0:
        assert call() == 0.0
    elif expected is not None and all(_normal(x) for x in extra_ok):
        assert call() == expected
    else:
        with pytest.raises(NumericalError, match=r"float64's normal range \[2\.2e-308, 1\.8e308\]"):
            call()


def _torch_jac(inst: Instance, kind: str, of: str, W: np.ndarray) -> float:
    """Independent ``||J(W)||₂`` (torch softmax / elu + 1 on the raw data, jacrev, SVD).

    Masked: the normalised kinds are a torch softmax of ``l`` (softmax) or of ``log φ(l)`` (``φ/Σφ``,
    ``log φ = l`` below 0 and ``log1p(l)`` above) whose masked entries are filled with ``−inf``, and the
    linear weight of a masked token is 0: its entry of ``s`` is the constant 0 (no gradient) and it adds
    nothing to the output. A sequence with one allowed token then has an exactly 0 block (weight
    ``exp(0)/1 = 1``), as the bound's ``κ_i = 0`` says."""
    X, z, v = (torch.tensor(np.asarray(a), dtype=torch.float64) for a in (inst.X, inst.z, inst.v))
    masked = None if inst.mask is None else ~torch.tensor(np.array(inst.mask))

    def m(Wt: torch.Tensor) -> torch.Tensor:
        lg = torch.einsum("ntd,de,ne->nt", X, Wt, z)
        if masked is not None:
            if kind == "linear":
                s = lg.masked_fill(masked, 0.0)
            else:  # softmax of l, or of log φ(l) = l (l < 0), log1p(l) (l ≥ 0): φ/Σφ for elu + 1
                lw = lg if kind == "softmax" else torch.where(lg < 0, lg, torch.log1p(lg.clamp(min=0.0)))
                s = torch.softmax(lw.masked_fill(masked, -torch.inf), dim=1)
            return s.reshape(-1) if of == "weights" else (s * (X @ v)).sum(dim=1)
        if kind == "softmax":
            s = torch.softmax(lg, dim=1)
        elif kind == "linear":
            s = lg
        else:
            phi = torch.nn.functional.elu(lg) + 1.0
            s = phi / phi.sum(dim=1, keepdim=True)
        return s.reshape(-1) if of == "weights" else (s * (X @ v)).sum(dim=1)

    J = torch.func.jacrev(m)(torch.tensor(W, dtype=torch.float64))
    return float(torch.linalg.svdvals(J.reshape(J.shape[0], -1))[0])


def _norm(a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """2-norm taken on ``a`` scaled by its largest entry: np.linalg.norm squares the entries, and the squares of
    entries below ~1e-154 underflow (‖𝓛‖_F of tokens 3.6e-124 came out 0, and the Jacobian's floor with it)."""
    m = np.max(np.abs(a), axis=axis, keepdims=True)
    safe = np.where(m > 0, m, 1.0)
    out = np.squeeze(safe, axis=axis) * np.linalg.norm(a / safe, axis=axis)
    return np.where(np.squeeze(m, axis=axis) > 0, out, 0.0)


def _logit_frobenius(inst: Instance) -> float:
    """``||𝓛||_F`` over the allowed tokens (keys: masked tokens 0; ``X`` itself when unmasked), without
    underflow."""
    return float(_norm(_norm(inst.keys, axis=-1) * _norm(inst.z, axis=1)[:, None]))


def _jac_floor(inst: Instance, of: str) -> float:
    """Absolute rounding allowance of the torch Jacobian norm at logits of order one (JAC_ULPS)."""
    n, T, d = inst.shape
    with np.errstate(under="ignore"):
        a = 1.0 if of == "weights" else 1.0 + T * float(np.max(np.abs(inst.keys @ inst.v)))
    return JAC_ULPS * (n * T + d * d + 4 * d + T) * EPS * _logit_frobenius(inst) * a


# ----------------------------------------------------------------------------- the bound
_BOUND = Tally()


@pytest.mark.parametrize("of", OFS)
@pytest.mark.parametrize("kind", KINDS)
@bounded_discards(_BOUND)
@given(si=sweeps, r=radii)
def test_bound_scale_sweep(kind: str, of: str, si: S.ScaledInstance, r: float) -> None:
    """``lipschitz_bound`` at ``(2^jx X, 2^jz z, 2^jv v)`` on the ball ``2^-(jx+jz) R`` is ``2^k`` times the
    bound at scale 1 on ``R``, or raises the named range error exactly when that is not a normal
    double; and the bound at scale 1 dominates the independent torch Jacobian at ``W = 0`` and at a
    point of the ball with O(1) logits (soundness, hence at every scale by equivariance)."""
    _run(_BOUND, si, lambda ref: _check_bound(kind, of, ref, r))


def _check_bound(kind: str, of: str, si: S.ScaledInstance, r: float) -> str | None:
    radius = (r, r) if kind == "linear" else _pair(si, r)
    if radius is None:
        return "radius not representable at one of the two scales"
    R_s, R_1 = radius
    try:
        b1 = lipschitz_bound(si.original, kind=kind, radius=R_1, of=of)
    except NumericalError as exc:
        assert RANGE_MESSAGE in str(exc)
        return "reference outside float64's range"
    k = _k(si, of)
    nominal_ok = _ld(b1.nominal, k) if b1.nominal else 1.0
    _expect_scaled(
        b1.value, k, lambda: lipschitz_bound(si.inst, kind=kind, radius=R_s, of=of).value, nominal_ok
    )
    # soundness at scale 1, against the independent Jacobian
    inst = si.original
    lf = _logit_frobenius(inst)
    d = inst.d
    U = np.eye(d) / math.sqrt(d)
    tol = SVD_ULPS * (inst.n * inst.T + d * d) * EPS + b1.rounding_rtol
    for W in (np.zeros((d, d)), min(R_1, 1.0 / lf if lf > 0 else R_1) * U):
        J = _torch_jac(inst, kind, of, W)
        assert J <= b1.value * (1 + tol) + _jac_floor(inst, of)
    return None


# ----------------------------------------------------------------------------- the estimate
_EST = Tally()


@pytest.mark.parametrize(
    ("kind", "of"), [("softmax", "weights"), ("normalized_linear", "output"), ("linear", "output")]
)
@bounded_discards(_EST)
@costly
@given(si=sweeps, r=radii)
def test_estimate_scale_sweep(kind: str, of: str, si: S.ScaledInstance, r: float) -> None:
    """``lipschitz_estimate`` (4 samples, 2 steps) at the scaled data is ``2^k`` times the scale-1 estimate,
    at the point ``2^-(jx+jz) W``, or raises the named range error exactly when the value or ``||W||``
    is not a normal double; at scale 1 it is attained (independent torch Jacobian at its point)."""
    _run(_EST, si, lambda ref: _check_estimate(kind, of, ref, r))


def _check_estimate(kind: str, of: str, si: S.ScaledInstance, r: float) -> str | None:
    radius = (r, r) if kind == "linear" else _pair(si, r)
    if radius is None:
        return "radius not representable at one of the two scales"
    R_s, R_1 = radius
    opts = {"samples": 4, "steps": 2, "starts": 1}
    try:
        e1 = lipschitz_estimate(si.original, kind=kind, radius=R_1, of=of, **opts)
    except NumericalError as exc:
        assert "rounding level" in str(exc) or RANGE_MESSAGE in str(exc)
        if "rounding level" in str(exc):
            # the search at the scaled data is the same computation on exactly scaled numbers (its points are
            # 2^-(jx+jz) times these, asserted below where representable): the same refusal
            with pytest.raises(NumericalError, match="rounding level"):
                lipschitz_estimate(si.inst, kind=kind, radius=R_s, of=of, **opts)
            event("estimate below its rounding level: refusal at both scales asserted")
            return None
        return "reference estimate outside float64's range"
    shift = si.jx + si.jz
    nw = float(np.linalg.norm(e1.W))
    w_norm_ok = _ld(nw, -shift) if nw > 0 else 1.0
    _expect_scaled(
        e1.value,
        _k(si, of),
        lambda: lipschitz_estimate(si.inst, kind=kind, radius=R_s, of=of, **opts).value,
        w_norm_ok,
    )
    if _normal(_ld(e1.value, _k(si, of))) and _normal(w_norm_ok):
        e_s = lipschitz_estimate(si.inst, kind=kind, radius=R_s, of=of, **opts)
        np.testing.assert_array_equal(e_s.W, np.ldexp(e1.W, -shift))
    lf = _logit_frobenius(si.original)
    if nw * lf <= 16.0:  # logits of order one: the independent torch Jacobian resolves the value
        J = _torch_jac(si.original, kind, of, e1.W)
        rtol = SVD_ULPS * (si.original.n * si.original.T + si.original.d**2) * EPS
        assert abs(J - e1.value) <= rtol * J + 2 * _jac_floor(si.original, of)
    return None


# ----------------------------------------------------------------------------- the Jacobian norm
_JAC = Tally()


@pytest.mark.parametrize("of", OFS)
@pytest.mark.parametrize("kind", KINDS)
@bounded_discards(_JAC)
@given(si=sweeps, data=st.data())
def test_jacobian_norm_scale_sweep(kind: str, of: str, si: S.ScaledInstance, data: st.DataObject) -> None:
    """``jacobian_norm`` at the scaled data and ``2^-(jx+jz)`` times a point is ``2^k`` times the scale-1
    value (or raises the named range error exactly when that is not a normal double; a point where the
    scale-1 value is below its rounding level raises the same at both scales); at scale 1 it agrees
    with the independent torch Jacobian where the logits are of order one."""
    Wu = data.draw(unit_points(si.inst.d), label="W_u")
    _run(_JAC, si, lambda ref: _check_jacobian(kind, of, ref, Wu))


def _check_jacobian(kind: str, of: str, si: S.ScaledInstance, Wu: np.ndarray) -> str | None:
    d = si.original.d
    pts = (Wu, Wu) if kind == "linear" else _pair(si, Wu)
    if pts is None:
        return "point not representable at one of the two scales"
    W_s, W_1 = pts
    try:
        j1 = jacobian_norm(si.original, W_1, kind=kind, of=of)
    except NumericalError as exc:
        msg = str(exc)
        assert "rounding level" in msg or RANGE_MESSAGE in msg or "not finite" in msg
        if "rounding level" in msg:
            # the computation is the same at both scales: the same refusal
            with pytest.raises(NumericalError, match="rounding level"):
                jacobian_norm(si.inst, W_s, kind=kind, of=of)
            event("saturated point: refusal at both scales asserted")
            return None
        return "reference Jacobian outside float64's range"
    _expect_scaled(j1, _k(si, of), lambda: jacobian_norm(si.inst, W_s, kind=kind, of=of))
    lf = _logit_frobenius(si.original)
    with np.errstate(over="ignore"):  # a point of size ~2^1000 at scale 1: its norm is inf, no check
        w_norm = float(np.linalg.norm(W_1))
    if w_norm * lf <= 16.0:
        J = _torch_jac(si.original, kind, of, W_1)
        rtol = SVD_ULPS * (si.original.n * si.original.T + d * d) * EPS
        assert abs(J - j1) <= rtol * J + 2 * _jac_floor(si.original, of)
    return None


# ----------------------------------------------------------------------------- the logit norm
_LOGIT = Tally()


@bounded_discards(_LOGIT)
@given(si=sweeps)
def test_logit_norm_scale_sweep(si: S.ScaledInstance) -> None:
    """``||𝓛||₂`` is bilinear in ``(X, z)``: ``2^(jx+jz)`` times its scale-1 value, or the named range error.
    Oracle at scale 1: SVD of the explicit Kronecker rows ``z_i ⊗ x_it`` (numpy)."""
    _run(_LOGIT, si, _check_logit_norm)


def _check_logit_norm(si: S.ScaledInstance) -> str | None:
    inst = si.original
    try:
        L1 = logit_norm(inst)
    except NumericalError as exc:
        assert RANGE_MESSAGE in str(exc)
        return "reference logit norm outside float64's range"
    _expect_scaled(L1, si.jx + si.jz, lambda: logit_norm(si.inst))
    rows = np.einsum("nj,ntk->ntjk", inst.z, inst.X).reshape(inst.n * inst.T, -1)
    if inst.mask is not None:  # a masked token has no logit: its row is deleted
        rows = rows[inst.mask.reshape(-1)]
    with np.errstate(under="ignore"):
        sv = float(np.linalg.svd(rows, compute_uv=False)[0])
    # the explicit rows underflow where the data are tiny: compare where they are normal
    if sv > 1e-150:
        assert abs(L1 - sv) <= SVD_ULPS * (inst.n * inst.T + inst.d**2) * EPS * sv
    return None


# ----------------------------------------------------------------------------- masked and seq2seq twins
# Each runs the plain property's own body (``inner_test``: the same claims, references and tally, all of
# which apply the mask) on the sweep of masked and sequence-to-sequence instances, counting the kind
# drawn. The tally is the plain property's: ``bounded_discards`` resets it before the twin's run and
# bounds it after.
@pytest.mark.parametrize("of", OFS)
@pytest.mark.parametrize("kind", KINDS)
@bounded_discards(_BOUND)
@given(si=sweeps_masked, r=radii)
def test_bound_scale_sweep_masked(kind: str, of: str, si: S.ScaledInstance, r: float) -> None:
    """Exact equivariance of the masked bound (a masked token, scaled with the others, is never read);
    soundness at scale 1 against the torch Jacobian of the masked maps (``−inf`` masked logits)."""
    _kind(si)
    test_bound_scale_sweep.hypothesis.inner_test(kind=kind, of=of, si=si, r=r)


@pytest.mark.parametrize(
    ("kind", "of"), [("softmax", "weights"), ("normalized_linear", "output"), ("linear", "output")]
)
@bounded_discards(_EST)
@costly
@given(si=sweeps_masked, r=radii)
def test_estimate_scale_sweep_masked(kind: str, of: str, si: S.ScaledInstance, r: float) -> None:
    """Exact equivariance of the masked estimate and its point; attained at scale 1 (torch Jacobian of
    the masked maps at its point)."""
    _kind(si)
    test_estimate_scale_sweep.hypothesis.inner_test(kind=kind, of=of, si=si, r=r)


@pytest.mark.parametrize("of", OFS)
@pytest.mark.parametrize("kind", KINDS)
@bounded_discards(_JAC)
@given(si=sweeps_masked, data=st.data())
def test_jacobian_norm_scale_sweep_masked(
    kind: str, of: str, si: S.ScaledInstance, data: st.DataObject
) -> None:
    """Exact equivariance of the masked Jacobian norm; at scale 1 it agrees with the torch Jacobian of the
    masked maps where the logits are of order one."""
    _kind(si)
    test_jacobian_norm_scale_sweep.hypothesis.inner_test(kind=kind, of=of, si=si, data=data)


@bounded_discards(_LOGIT)
@given(si=sweeps_masked)
def test_logit_norm_scale_sweep_masked(si: S.ScaledInstance) -> None:
    """``||𝓛||₂`` of the allowed tokens is bilinear in ``(X, z)``; oracle at scale 1: SVD of the allowed
    tokens' Kronecker rows (the masked tokens' rows deleted)."""
    _kind(si)
    test_logit_norm_scale_sweep.hypothesis.inner_test(si=si)


# ----------------------------------------------------------------------------- masked tokens of any size
def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """``("value", result)``, or ``("raises", message)`` for a NumericalError (compared as such)."""
    try:
        return "value", call()
    except NumericalError as exc:
        return "raises", str(exc)


@pytest.mark.parametrize("of", OFS)
@pytest.mark.parametrize("kind", KINDS)
@given(si=sweeps_junk, r=radii, data=st.data())
def test_masked_tokens_of_any_size_change_nothing_masked(
    kind: str, of: str, si: S.ScaledInstance, r: float, data: st.DataObject
) -> None:
    """A masked token is never read, at every scale of the sweep: with every masked token multiplied by
    ``2^j`` (``j`` drawn over the whole range that keeps its entries normal, independently of the sweep's
    exponents), ``lipschitz_bound`` (value, nominal, allowance), ``jacobian_norm``, ``logit_norm`` and
    ``lipschitz_estimate`` (value and point) are bit-identical to those of the same instance with the
    masked tokens set to 0, or both raise the same NumericalError. Oracle: that construction (the zeroed
    instance has nothing at a masked token to read; ``z`` explicit, so a masked query token stays the
    query). A draw without a mask (the strategy shrinks to it) is compared with itself (an event)."""
    inst = si.inst
    _kind(si)
    if inst.mask is None:
        event("no mask drawn: junk = zeroed = the instance")
    masked = ~inst.allowed
    lo, hi = S.exponent_range(inst.X[masked])
    j = data.draw(st.integers(lo, hi), label="j: masked tokens times 2^j")
    junk_X = np.array(inst.X)
    junk_X[masked] = np.ldexp(inst.X[masked], j)  # (only the masked entries: they stay normal)
    junk = Instance(junk_X, inst.Y, inst.v, inst.z, mask=inst.mask)
    zero = Instance(inst.keys, inst.Y, inst.v, inst.z, mask=inst.mask)
    Wu = data.draw(unit_points(inst.d), label="W_u")
    pts = _pair(si, Wu)
    W = Wu if pts is None else pts[0]  # logits of order one where representable
    opts = {"samples": 4, "steps": 2, "starts": 1}

    def calls(x: Instance) -> list[tuple[str, Any]]:
        def bound() -> tuple[float, float, float]:
            b = lipschitz_bound(x, kind=kind, radius=r, of=of)
            return b.value, b.nominal, b.rounding_rtol

        def estimate() -> tuple[float, bytes]:
            e = lipschitz_estimate(x, kind=kind, radius=r, of=of, **opts)
            return e.value, np.asarray(e.W).tobytes()

        return [
            _outcome(bound),
            _outcome(lambda: jacobian_norm(x, W, kind=kind, of=of)),
            _outcome(lambda: logit_norm(x)),
            _outcome(estimate),
        ]

    assert calls(junk) == calls(zero)
