"""Scale sweep of the peer models (issue 13 §2): prompt, joint, ℓp mirror descent, multi-token.

One property per public numeric function of :mod:`attnsvm.peers._prompt`, :mod:`attnsvm.peers._joint`,
:mod:`attnsvm.peers._mirror` and :mod:`attnsvm.peers._multitoken`. Data: the peer strategies
(:func:`attnsvm.peer_strategies.prompt_instances`, :func:`~attnsvm.peer_strategies.heads`,
:func:`~attnsvm.peer_strategies.p_norms`) and the core ones (:func:`attnsvm.strategies.instances`
over every family, :func:`~attnsvm.strategies.feasible_instances`,
:func:`~attnsvm.strategies.scaled_instances`), with ``X``, ``z``, ``v``, ``W``, ``p``, ``V``
multiplied by exact powers of two ``2^j``; every exponent is drawn over the whole range that keeps
the array's entries normal doubles (:func:`attnsvm.strategies.exponent_range`) and shrinks towards
0, so a failure shrinks to the smallest scale that breaks. Where a model is equivariant only when
the logits (and the loss margins) are kept, the exponents are drawn *tied* (e.g. ``X·2^a``,
``W·2^b``, ``p·2^c`` with ``a + b + c = 0``), constructively: no example is discarded.

Oracle: the model's scale equivariance — the answer on the scaled data must be the answer at
scale 1 moved by the known power of two (``p_mm(2^a X, 2^b W) = 2^−(a+b) p_mm``, ``∇ψ(2^a W) =
2^{a(p−1)} ∇ψ(W)``, ``||2^a W||_p = 2^a ||W||_p``, ...); the unscaled answers are themselves
checked against mpmath, finite differences and certificates in ``tests/``. Each example is one
of: *returned* (to :data:`EQUI_RTOL` relative to the largest entry, and only where the moved
answer is a normal double), *refused* (a ``NumericalError`` naming float64's range, allowed only
where some moved part is outside the range, :data:`RANGE_SLACK_BITS` at the edges), or *refused at
scale 1 as well* (the same error class at both scales: equivariance of the refusal). Outcomes are
counted with ``hypothesis.event``; nothing is skipped, and the one case set aside (the ``log_norm``
comparison of a prompt direction refused at scale 1) is counted and bounded (``_discards``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
from _discards import Tally, bounded_discards
from hypothesis import event, given, settings
from hypothesis import strategies as st

from attnsvm import strategies as S
from attnsvm.errors import AttnSVMError, NumericalError, SolverError
from attnsvm.model._instance import Instance
from attnsvm.peer_strategies import heads, p_norms, prompt_instances
from attnsvm.peers import _joint as J
from attnsvm.peers import _mirror as M
from attnsvm.peers import _multitoken as MT
from attnsvm.peers import _prompt as P
from attnsvm.svm import CERTIFY_RTOL, SUPPORT_RTOL

EPS = float(np.finfo(np.float64).eps)
#: Scaled and unscaled calls run on the same power-of-two mantissas; they differ by the rounding of
#: the final put-back (and of a non-dyadic real exponent such as 2^{a(p−1)}): 64 eps relative to the
#: largest entry covers a few such roundings and a different summation order.
EQUI_RTOL = 64 * EPS
#: Engines: the learning rate ``lr·2^{…}`` is rounded once when the exponent is not an integer,
#: and that perturbation is carried through the steps: 1e-12 relative.
ENGINE_RTOL = 1e-12
#: A real shift ``s`` (``a(p−1)``, ``a/(p−1)``, ``−sp``) is itself rounded: ``2^s`` then carries a
#: relative error ``≤ |s|·ln2·eps`` per rounding (the product and the function's own ``pow``); 4 covers both.
EXPONENT_ULPS = 4
#: An answer's size decides refusal from rounded log-magnitudes: within this many bits of the
#: range's ends either outcome is right.
RANGE_SLACK_BITS = 2
#: log2 of the ends of float64's normal range.
LOG2_MAX, LOG2_TINY = 1024, -1022
#: Every scale-contract error names the range.
RANGE_MESSAGE = "float64's normal range"

PROMPT = prompt_instances(n=(1, 2), T=(2, 3), extra_d=1)
FAMILIES = st.sampled_from(S.INSTANCE_FAMILIES).flatmap(lambda f: S.instances(family=f))


# ============================================================================== helpers
def ld(a: Any, j: float) -> np.ndarray:
    """``a·2^j``; a real ``j`` is split into an exact ``ldexp`` and one rounded factor."""
    k = math.floor(j)
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(np.asarray(a, dtype=np.float64) * 2.0 ** (j - k), k)


def vectors(d: int, bound: float = 2.0) -> st.SearchStrategy[np.ndarray]:
    """A nonzero vector of ``d`` floats in ``[−bound, bound]`` (shrinks towards ``e_0``)."""
    return st.lists(st.floats(-bound, bound), min_size=d, max_size=d).map(
        lambda xs: np.array(xs) if any(xs) else np.eye(d)[0]
    )


def tied(
    draw: Any, arrays: list[Any], total: int = 0, bounds: list[tuple[int, int]] | None = None
) -> list[int]:
    """Exponents ``e_i`` (one per array, each keeping it normal, within ``bounds``) with ``Σ e_i = total``.

    Drawn in order, each from the interval that still lets the rest reach the total, so the
    draw is constructive (0 is always admissible when ``total = 0``) and shrinks towards 0.
    """
    rng = [S.exponent_range(a) for a in arrays]
    if bounds is not None:
        rng = [(max(lo, b0), min(hi, b1)) for (lo, hi), (b0, b1) in zip(rng, bounds, strict=True)]
    out: list[int] = []
    for i, (lo, hi) in enumerate(rng):
        rest_lo = sum(r[0] for r in rng[i + 1 :])
        rest_hi = sum(r[1] for r in rng[i + 1 :])
        need = total - sum(out)
        if i == len(rng) - 1:
            out.append(need)
            break
        out.append(draw(st.integers(max(lo, need - rest_hi), min(hi, need - rest_lo))))
    return out


def free(draw: Any, a: Any, lo: int = -(10**6), hi: int = 10**6) -> int:
    """One exponent keeping ``a`` normal, within ``[lo, hi]`` (which must meet the range)."""
    r0, r1 = S.exponent_range(a)
    return draw(st.integers(max(r0, lo), min(r1, hi)))


def _log2max(a: np.ndarray) -> float:
    m = float(np.max(np.abs(a), initial=0.0))
    return -math.inf if m == 0 else math.log2(m)


def _status(a: np.ndarray, shift: float, entrywise: bool) -> str:
    """``in`` / ``edge`` / ``out``: where ``a·2^shift`` lies w.r.t. float64's normal range."""
    nz = np.abs(a[a != 0]) if entrywise else np.array([float(np.max(np.abs(a), initial=0.0))])
    nz = nz[nz > 0]
    if nz.size == 0:
        return "in"
    hi = math.log2(float(np.max(nz))) + shift
    lo = math.log2(float(np.min(nz))) + shift
    if lo >= LOG2_TINY + RANGE_SLACK_BITS and hi <= LOG2_MAX - RANGE_SLACK_BITS:
        return "in"
    if lo < LOG2_TINY - RANGE_SLACK_BITS or hi > LOG2_MAX + RANGE_SLACK_BITS:
        return "out"
    return "edge"


Part = tuple[Any, float]  # (array at scale 1, log2 of its factor) or (array on scaled data, 0)


def sweep(
    name: str,
    base: Callable[[], Any],
    scaled: Callable[[], Any],
    parts: Callable[[Any], list[Any]],
    shifts: list[float | Fraction],
    *,
    rtol: float = EQUI_RTOL,
    entrywise: bool = False,
) -> None:
    """Run both calls and check the equivariance ``parts(scaled()) = parts(base())·2^shifts``.

    A shift is exact (an integer, or a ``Fraction`` for a real exponent such as ``a·(p − 1)``): only an exact
    integer shift is an exact power of two, so only then is the comparison exact (``a·(p − 1)`` may round to
    an integer in float64 while the computed power is ``|W|^(p−1)`` with the float ``p − 1``)."""
    try:
        b = base()
    except AttnSVMError as exc:
        event(f"{name}: refused at scale 1 ({type(exc).__name__}), and scaled")
        try:
            scaled()
        except type(exc):
            return
        raise AssertionError(
            f"{name}: scale 1 raised {type(exc).__name__} ({exc}); the scaled call did not"
        ) from exc
    pb = [np.asarray(x, dtype=np.float64) for x in parts(b)]
    status = [_status(x, float(s), entrywise) for x, s in zip(pb, shifts, strict=True)]
    try:
        g = scaled()
    except NumericalError as exc:
        assert RANGE_MESSAGE in str(exc), f"{name}: refusal does not name the range: {exc}"
        assert any(s != "in" for s in status), f"{name}: refused although every part is representable: {exc}"
        event(f"{name}: refused (out of range)")
        return
    assert all(s != "out" for s in status), f"{name}: returned a value where the answer is not a double"
    for x, s, y in zip(pb, shifts, parts(g), strict=True):
        want = ld(x, float(s))
        y = np.asarray(y, dtype=np.float64)
        assert np.all(np.isfinite(y)), f"{name}: non-finite entries"
        scale = float(np.max(np.abs(want), initial=0.0))
        err = float(np.max(np.abs(y - want), initial=0.0))
        exact = Fraction(s).denominator == 1
        tol = rtol + (0.0 if exact else EXPONENT_ULPS * EPS * abs(float(s)) * math.log(2))
        assert err <= tol * scale + 2.0**-1074 * max(1, y.size), f"{name}: error {err:.3g} vs {scale:.3g}"
    event(f"{name}: returned" + (" (edge)" if "edge" in status else ""))


def _inst(X: np.ndarray, Y: np.ndarray, v: np.ndarray, z: np.ndarray | None = None) -> Instance:
    return Instance(X, Y, v) if z is None else Instance(X, Y, v, z)


# ============================================================================== prompt
@given(PROMPT, st.data())
def test_prompt_keys(case, data):
    """keys(2^a X, 2^b W) = 2^(a+b) keys (oracle: bilinearity)."""
    inst, W = case
    a, b = free(data.draw, inst.X), free(data.draw, W)
    sweep(
        "prompt_keys",
        lambda: P.prompt_keys(inst, W),
        lambda: P.prompt_keys(_inst(ld(inst.X, a), inst.Y, inst.v), ld(W, b)),
        lambda k: [k],
        [a + b],
    )


@given(PROMPT, st.data())
def test_prompt_logits(case, data):
    """logits(2^a X, 2^b W, 2^c p) = 2^(a+b+c) logits (oracle: trilinearity)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c = free(data.draw, inst.X), free(data.draw, W), free(data.draw, p)
    sweep(
        "prompt_logits",
        lambda: P.prompt_logits(inst, W, p),
        lambda: P.prompt_logits(_inst(ld(inst.X, a), inst.Y, inst.v), ld(W, b), ld(p, c)),
        lambda x: [x],
        [a + b + c],
    )


def _prompt_tied(
    data: Any, inst: Instance, W: np.ndarray, p: np.ndarray, tie_v: bool
) -> tuple[int, int, int, int]:
    """``(a, b, c, e)`` with ``a + b + c = 0`` (logits kept) and, if ``tie_v``, ``e = −a`` (values kept)."""
    rv = S.exponent_range(inst.v)
    bounds = [(-rv[1], -rv[0]) if tie_v else (-(10**6), 10**6), (-(10**6), 10**6), (-(10**6), 10**6)]
    a, b, c = tied(data.draw, [inst.X, W, p], 0, bounds)
    e = -a if tie_v else free(data.draw, inst.v)
    return a, b, c, e


@given(PROMPT, st.data())
def test_prompt_attention(case, data):
    """attention(2^a X, 2^b W, 2^c p) with a + b + c = 0 is unchanged (oracle: same logits)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c, _ = _prompt_tied(data, inst, W, p, False)
    sweep(
        "prompt_attention",
        lambda: P.prompt_attention(inst, W, p),
        lambda: P.prompt_attention(_inst(ld(inst.X, a), inst.Y, inst.v), ld(W, b), ld(p, c)),
        lambda s: [s],
        [0],
    )


@given(PROMPT, st.data())
def test_prompt_output(case, data):
    """output(2^a X, 2^b W, 2^c p, 2^e v), a + b + c = 0, is 2^(a+e) output (oracle: values vᵀx)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c, e = _prompt_tied(data, inst, W, p, False)
    sweep(
        "prompt_output",
        lambda: P.prompt_output(inst, W, p),
        lambda: P.prompt_output(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), ld(p, c)),
        lambda f: [f],
        [a + e],
    )


@given(PROMPT, st.data(), st.sampled_from(["logistic", "exponential", "correlation"]))
def test_prompt_risk(case, data, loss):
    """risk is invariant under (2^a X, 2^b W, 2^c p, 2^−a v), a + b + c = 0 (same margins)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c, e = _prompt_tied(data, inst, W, p, True)
    sweep(
        f"prompt_risk[{loss}]",
        lambda: P.prompt_risk(inst, W, p, loss=loss),
        lambda: P.prompt_risk(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), ld(p, c), loss=loss),
        lambda r: [np.array([r])],
        [0],
    )


@given(PROMPT, st.data())
def test_prompt_grad(case, data):
    """∇_p L(2^a X, 2^b W, 2^c p, 2^−a v) = 2^(a+b) ∇_p L, a + b + c = 0 (oracle: chain rule)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c, e = _prompt_tied(data, inst, W, p, True)
    sweep(
        "prompt_grad",
        lambda: P.prompt_grad(inst, W, p),
        lambda: P.prompt_grad(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), ld(p, c)),
        lambda g: [g],
        [a + b],
    )


_PROMPT_DIR_TALLY = Tally()


@bounded_discards(_PROMPT_DIR_TALLY)
@given(PROMPT, st.data())
def test_normalized_prompt_grad(case, data):
    """The unit direction is unchanged and ``log||∇_p L||`` moves by (a+b)·log 2 (never refused for range).

    Where the direction is refused at scale 1 (a stationary or rounding-level prompt gradient) the
    scaled call must refuse alike (asserted by ``sweep``); the ``log_norm`` comparison is then set aside,
    counted and bounded by ``_discards.MAX_DISCARD_FRACTION`` (5 %)."""
    inst, W = case
    p = data.draw(vectors(inst.d))
    a, b, c, e = _prompt_tied(data, inst, W, p, True)
    sweep(
        "normalized_prompt_grad",
        lambda: P.normalized_prompt_grad(inst, W, p),
        lambda: P.normalized_prompt_grad(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), ld(p, c)),
        lambda G: [G.direction],
        [0],
    )
    _PROMPT_DIR_TALLY.run += 1
    try:
        G1 = P.normalized_prompt_grad(inst, W, p)
    except NumericalError:
        # The refusal itself was checked above (sweep: the scaled call refuses alike); only the
        # log_norm comparison has no value at scale 1 to compare with. Counted and bounded.
        _PROMPT_DIR_TALLY.discard("log_norm not compared: the direction is refused at scale 1")
        return
    G2 = P.normalized_prompt_grad(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), ld(p, c))
    assert abs(G2.log_norm - G1.log_norm - (a + b) * math.log(2)) <= EQUI_RTOL * max(1.0, abs(G2.log_norm))


@settings(max_examples=40)
@given(PROMPT, st.data())
def test_solve_prompt_svm(case, data):
    """p_mm(2^a X, 2^b W) = 2^−(a+b) p_mm, multipliers 2^−2(a+b), rows 2^(a+b) (min-norm homogeneity)."""
    inst, W = case
    a, b = free(data.draw, inst.X), free(data.draw, W)
    sweep(
        "solve_prompt_svm",
        lambda: P.solve_prompt_svm(inst, W),
        lambda: P.solve_prompt_svm(_inst(ld(inst.X, a), inst.Y, inst.v), ld(W, b)),
        lambda s: [s.p, s.duals, s.rows, s.margins],
        [-(a + b), -2 * (a + b), a + b, 0],
    )


@settings(max_examples=40)
@given(PROMPT, st.data())
def test_prompt_local_optimality(case, data):
    """Invariant under 2^a X, 2^b W, 2^e v (independent exponents; never refused)."""
    inst, W = case
    a, b, e = free(data.draw, inst.X), free(data.draw, W), free(data.draw, inst.v)
    alpha = data.draw(S.token_choices(inst))
    sweep(
        "prompt_local_optimality",
        lambda: P.prompt_local_optimality(inst, W, alpha),
        lambda: P.prompt_local_optimality(_inst(ld(inst.X, a), inst.Y, ld(inst.v, e)), ld(W, b), alpha),
        lambda x: [np.array([float(x)])],
        [0],
        rtol=0.0,
    )


LR_EXP = 1000  # keep lr·2^{−(a+b)} a normal double (lr = 0.1)


@settings(max_examples=25)
@given(PROMPT, st.data(), st.booleans())
def test_run_prompt_gd(case, data, normalized):
    """Five steps of GD on (2^a X, 2^b W, 2^−a v) with lr·2^−(a+b)²ⁿ give 2^−(a+b) p_t (equivariance;
    plain GD: ∇ scales by 2^(a+b), so lr by 2^−2(a+b))."""
    inst, W = case
    k = 1 if normalized else 2
    rv = S.exponent_range(inst.v)
    a = free(data.draw, inst.X, -rv[1], -rv[0])
    b = free(data.draw, W, -LR_EXP // k - a, LR_EXP // k - a)
    lr = 0.1 * 2.0 ** (-k * (a + b))
    sweep(
        f"run_prompt_gd[{'normalized' if normalized else 'plain'}]",
        lambda: P.run_prompt_gd(inst, W, 5, 0.1, normalized=normalized, record_at=[5]),
        lambda: P.run_prompt_gd(
            _inst(ld(inst.X, a), inst.Y, ld(inst.v, -a)),
            ld(W, b),
            5,
            lr,
            normalized=normalized,
            record_at=[5],
        ),
        lambda tr: [tr.p, np.array([tr.record[-1].risk])],
        [-(a + b), 0],
        rtol=ENGINE_RTOL,
    )


@settings(max_examples=15)
@given(PROMPT, st.data())
def test_prompt_regularization_path(case, data):
    """p_R(2^a X, 2^b W, 2^−a v; radii·2^−(a+b)) = 2^−(a+b) p_R (the engine runs in logit units)."""
    inst, W = case
    rv = S.exponent_range(inst.v)
    radii = np.array([1.0, 2.0])
    a = free(data.draw, inst.X, -rv[1], -rv[0])
    b = free(data.draw, W, -LR_EXP - a, LR_EXP - a)
    sweep(
        "prompt_regularization_path",
        lambda: P.prompt_regularization_path(inst, W, radii, max_steps=20),
        lambda: P.prompt_regularization_path(
            _inst(ld(inst.X, a), inst.Y, ld(inst.v, -a)), ld(W, b), ld(radii, -(a + b)), max_steps=20
        ),
        lambda pts: [np.stack([q.p for q in pts]), np.array([q.risk for q in pts])],
        [-(a + b), 0],
    )


# =============================================================================== joint
def _joint_exps(data: Any, inst: Instance, W: np.ndarray, v: np.ndarray, p: np.ndarray) -> tuple[int, int]:
    """``(a, b)``: X·2^a, W·2^b, with v·2^−a and p·2^−(a+b) still normal (same logits and margins)."""
    rv, rp = S.exponent_range(v), S.exponent_range(p)
    a = free(data.draw, inst.X, -rv[1], -rv[0])
    b = free(data.draw, W, -rp[1] - a, -rp[0] - a)
    return a, b


@given(PROMPT, st.data())
def test_joint_risk(case, data):
    """L(2^a X, 2^b W, 2^−a v, 2^−(a+b) p) = L(X, W, v, p) (same logits and outputs)."""
    inst, W = case
    v, p = data.draw(vectors(inst.d)), data.draw(vectors(inst.d))
    a, b = _joint_exps(data, inst, W, v, p)
    sc = _inst(ld(inst.X, a), inst.Y, inst.v)
    sweep(
        "joint_risk",
        lambda: J.joint_risk(inst, W, v, p),
        lambda: J.joint_risk(sc, ld(W, b), ld(v, -a), ld(p, -(a + b))),
        lambda r: [np.array([r])],
        [0],
    )


@given(PROMPT, st.data())
def test_joint_grads(case, data):
    """(∇_v, ∇_p) at the scaled point = (2^a ∇_v, 2^(a+b) ∇_p) (chain rule)."""
    inst, W = case
    v, p = data.draw(vectors(inst.d)), data.draw(vectors(inst.d))
    a, b = _joint_exps(data, inst, W, v, p)
    sc = _inst(ld(inst.X, a), inst.Y, inst.v)
    sweep(
        "joint_grads",
        lambda: J.joint_grads(inst, W, v, p),
        lambda: J.joint_grads(sc, ld(W, b), ld(v, -a), ld(p, -(a + b))),
        lambda g: [g[0], g[1]],
        [a, a + b],
    )


@given(PROMPT, st.data())
def test_normalized_joint_grads(case, data):
    """Both unit directions are unchanged at the scaled point (never refused for range)."""
    inst, W = case
    v, p = data.draw(vectors(inst.d)), data.draw(vectors(inst.d))
    a, b = _joint_exps(data, inst, W, v, p)
    sc = _inst(ld(inst.X, a), inst.Y, inst.v)
    sweep(
        "normalized_joint_grads",
        lambda: J.normalized_joint_grads(inst, W, v, p),
        lambda: J.normalized_joint_grads(sc, ld(W, b), ld(v, -a), ld(p, -(a + b))),
        lambda g: [g[0].direction, g[1].direction],
        [0, 0],
    )


@settings(max_examples=40)
@given(PROMPT, st.data())
def test_solve_joint_svm(case, data):
    """v_mm(2^a X) = 2^−a v_mm, p_relax(2^a X, 2^b W) = 2^−(a+b) p_relax; multipliers 2^−2a, 2^−2(a+b)."""
    inst, W = case
    a, b = free(data.draw, inst.X), free(data.draw, W)
    sweep(
        "solve_joint_svm",
        lambda: J.solve_joint_svm(inst, W),
        lambda: J.solve_joint_svm(_inst(ld(inst.X, a), inst.Y, inst.v), ld(W, b)),
        lambda s: [s.v, s.v_duals, s.p, s.p_duals, s.p_rows],
        [-a, -2 * a, -(a + b), -2 * (a + b), a + b],
    )


@settings(max_examples=25)
@given(PROMPT, st.data())
def test_run_joint_gd(case, data):
    """Five normalized steps on 2^a X with v0·2^−a, lr·2^−a give 2^−a (v_t, p_t) (W unscaled: one lr
    serves both blocks only when they scale alike)."""
    inst, W = case
    v0 = data.draw(vectors(inst.d))
    rv = S.exponent_range(v0)
    a = free(data.draw, inst.X, max(-rv[1], -LR_EXP), min(-rv[0], LR_EXP))
    sweep(
        "run_joint_gd",
        lambda: J.run_joint_gd(inst, W, 5, 0.1, v0=v0, record_at=[5]),
        lambda: J.run_joint_gd(
            _inst(ld(inst.X, a), inst.Y, inst.v), W, 5, 0.1 * 2.0**-a, v0=ld(v0, -a), record_at=[5]
        ),
        lambda tr: [tr.v, tr.p, np.array([tr.record[-1].risk])],
        [-a, -a, 0],
        rtol=ENGINE_RTOL,
    )


# ================================================================================== ℓp
#: Entries 0 or of size in [1/16, 4] (shrinking towards 0 and ±1/16): at scale 1 every power stays
#: a normal double, so the sweep's only source of over/underflow is the scale.
ENTRIES = st.one_of(st.just(0.0), st.floats(1 / 16, 4.0), st.floats(-4.0, -1 / 16))


@st.composite
def matrices(draw: Any) -> np.ndarray:
    """A nonzero ``d×d`` matrix, ``d ∈ [1, 3]`` (``I`` when every drawn entry is 0)."""
    d = draw(st.integers(1, 3))
    M_ = np.array(draw(st.lists(ENTRIES, min_size=d * d, max_size=d * d))).reshape(d, d)
    return M_ if np.any(M_) else np.eye(d)


MATRICES = matrices()


@given(MATRICES, p_norms(1.1, 8.0), st.data())
def test_mirror_map(W, p, data):
    """∇ψ(2^a W) = 2^{a(p−1)} ∇ψ(W) (homogeneity); refused exactly when a nonzero entry leaves the range."""
    a = free(data.draw, W)
    sweep(
        "mirror_map",
        lambda: M.mirror_map(W, p),
        lambda: M.mirror_map(ld(W, a), p),
        lambda U: [U],
        [Fraction(a) * (Fraction(p) - 1)],  # exact: p − 1 is a double for 1 ≤ p < 2^53
        entrywise=True,
    )


@given(MATRICES, p_norms(1.1, 8.0), st.data())
def test_inverse_mirror_map(U, p, data):
    """(∇ψ)^{-1}(2^a U) = 2^{a/(p−1)} (∇ψ)^{-1}(U) (homogeneity), entrywise range as above."""
    a = free(data.draw, U)
    sweep(
        "inverse_mirror_map",
        lambda: M.inverse_mirror_map(U, p),
        lambda: M.inverse_mirror_map(ld(U, a), p),
        lambda W: [W],
        [Fraction(a) / (Fraction(p) - 1)],
        entrywise=True,
    )


@given(MATRICES, p_norms(1.1, 8.0), st.data())
def test_lp_norm(W, p, data):
    """||2^a W||_p = 2^a ||W||_p (homogeneity of degree 1)."""
    a = free(data.draw, W)
    sweep("lp_norm", lambda: M.lp_norm(W, p), lambda: M.lp_norm(ld(W, a), p), lambda x: [np.array([x])], [a])


@given(
    MATRICES.flatmap(lambda A_: st.tuples(st.just(A_), st.just(A_[::-1, ::-1].copy() + 0.5))),
    p_norms(1.1, 8.0),
    st.data(),
)
def test_bregman_divergence(pair, p, data):
    """D_ψ(2^a A, 2^b B) = D_ψ(A, B): it compares ℓp-unit directions (scale-invariant; never refused)."""
    A_, B = pair
    a, b = free(data.draw, A_), free(data.draw, B)
    sweep(
        "bregman_divergence",
        lambda: M.bregman_divergence(A_, B, p),
        lambda: M.bregman_divergence(ld(A_, a), ld(B, b), p),
        lambda x: [np.array([x])],
        [0],
        rtol=1e-13,  # absolute ~1e-16 per entry (docstring) relative to D of order 1e-3..1
    )


@settings(max_examples=10)
@given(S.scaled_instances(S.feasible_instances(n=(1, 2), T=(2, 3))), st.sampled_from([1.5, 2.0, 3.0]))
def test_solve_lp_svm(si, p):
    """W_p(2^jx X, 2^jz z) = 2^−(jx+jz) W_p, objective likewise, multipliers 2^−(jx+jz)p; v's scale is
    irrelevant (the tokens are chosen by the sign-invariant argmax).

    The multipliers are part of the answer (``duals``, moved by ``2^−(jx+jz)p``): where they leave the
    normal range the refusal is right, so they are compared (and their range decides) like ``W``. Found
    by the ci run: μ ≈ 1e-309 refused while only W, objective and gap were checked."""
    s = si.jx + si.jz
    sweep(
        "solve_lp_svm",
        lambda: M.solve_lp_svm(si.original, p),
        lambda: M.solve_lp_svm(si.inst, p),
        lambda sol: [sol.W, np.array([sol.objective]), np.array([sol.gap]), sol.duals],
        [-s, -s, 0, -s * p],
        rtol=1e-9,  # Clarabel on bitwise-identical mantissas; the gap is a difference of ~1e-9
    )


def mirror_rtol(p: float) -> float:
    """Accuracy of a mirror-descent iterate ``W = sign(U)|U|^{1/(p−1)}`` relative to ``max|W|``.

    The dual iterate ``U`` is accurate to ``ENGINE_RTOL`` relative to ``max|U|``; an entry of ``W``
    whose true value is 0 then carries ``(ENGINE_RTOL·max|U|)^{1/(p−1)} = ENGINE_RTOL^{1/(p−1)}·max|W|``.
    For ``p > 2`` the root amplifies that rounding (p = 3: 1e-6), at scale 1 as at any other scale,
    so two runs agree only to it (found: tokens whose true gradient entries are exactly 0)."""
    return ENGINE_RTOL ** min(1.0, 1.0 / (p - 1.0))


@settings(max_examples=20)
@given(FAMILIES, st.sampled_from([1.5, 2.0, 3.0]), st.data())
def test_run_mirror_descent(inst, p, data):
    """Five normalized steps on (2^a X, 2^a z, 2^−a v) with lr·2^{−2a(p−1)} give 2^−2a W_t
    (to :func:`mirror_rtol`: the p−1 root of the dual iterate's rounding)."""
    rv = S.exponent_range(inst.v)
    bound = int(LR_EXP / (2 * (p - 1)))
    jx = free(
        data.draw, np.concatenate([inst.X.ravel(), inst.z.ravel()]), max(-bound, -rv[1]), min(bound, -rv[0])
    )
    inst_s = S.scaled(inst, jx, jx, -jx)
    sweep(
        f"run_mirror_descent[p={p}]",
        lambda: M.run_mirror_descent(inst, p, 5, 0.1, record_at=[5]),
        lambda: M.run_mirror_descent(inst_s, p, 5, 0.1 * 2.0 ** (-2 * jx * (p - 1)), record_at=[5]),
        lambda tr: [tr.W, np.array([tr.record[-1].risk])],
        [-2 * jx, 0],
        rtol=mirror_rtol(p),
    )


# ========================================================================= multi-token
@st.composite
def mt_cases(draw: Any) -> tuple[Instance, np.ndarray, np.ndarray]:
    inst = draw(FAMILIES)
    V = draw(heads(inst.d, k=(1, 3)))
    W = draw(S.weight_matrices(inst.d, scale=(1e-1, 1e1)))
    return inst, W, V


def _mt_exps(data: Any, inst: Instance, W: np.ndarray, V: np.ndarray, tie_v: bool) -> tuple[int, int, int]:
    """``(a, b, e)``: X, z by 2^a (z = x_i0 when self-attention), W by 2^b = 2^−2a, V by 2^e (= 2^−a)."""
    rW, rV = S.exponent_range(W), S.exponent_range(V)
    lo, hi = math.ceil(-rW[1] / 2), math.floor(-rW[0] / 2)
    if tie_v:
        lo, hi = max(lo, -rV[1]), min(hi, -rV[0])
    a = free(data.draw, np.concatenate([inst.X.ravel(), inst.z.ravel()]), lo, hi)
    return a, -2 * a, (-a if tie_v else free(data.draw, V))


@given(mt_cases(), st.data())
def test_multitoken_output(case, data):
    """out(2^a X, 2^a z, 2^−2a W, 2^e V) = 2^(a+e) out (same logits; ReLU is positively homogeneous)."""
    inst, W, V = case
    a, b, e = _mt_exps(data, inst, W, V, False)
    sweep(
        "multitoken_output",
        lambda: MT.multitoken_output(inst, W, V),
        lambda: MT.multitoken_output(S.scaled(inst, a, a, 0), ld(W, b), ld(V, e)),
        lambda o: [o],
        [a + e],
    )


@given(mt_cases(), st.data())
def test_multitoken_risk(case, data):
    """L(2^a X, 2^a z, 2^−2a W, 2^−a V) = L (same logits and outputs)."""
    inst, W, V = case
    a, b, e = _mt_exps(data, inst, W, V, True)
    sweep(
        "multitoken_risk",
        lambda: MT.multitoken_risk(inst, W, V),
        lambda: MT.multitoken_risk(S.scaled(inst, a, a, 0), ld(W, b), ld(V, e)),
        lambda r: [np.array([r])],
        [0],
    )


@given(mt_cases(), st.data())
def test_multitoken_grad(case, data):
    """∇L at the scaled point = 2^2a ∇L (∇ = Σ w x zᵀ with the weights w unchanged)."""
    inst, W, V = case
    a, b, e = _mt_exps(data, inst, W, V, True)
    sweep(
        "multitoken_grad",
        lambda: MT.multitoken_grad(inst, W, V),
        lambda: MT.multitoken_grad(S.scaled(inst, a, a, 0), ld(W, b), ld(V, e)),
        lambda g: [g],
        [2 * a],
    )


@given(mt_cases(), st.data())
def test_normalized_multitoken_grad(case, data):
    """The unit direction is unchanged at the scaled point (never refused for range)."""
    inst, W, V = case
    a, b, e = _mt_exps(data, inst, W, V, True)
    sweep(
        "normalized_multitoken_grad",
        lambda: MT.normalized_multitoken_grad(inst, W, V),
        lambda: MT.normalized_multitoken_grad(S.scaled(inst, a, a, 0), ld(W, b), ld(V, e)),
        lambda g: [g.direction],
        [0],
    )


@given(mt_cases(), st.data())
def test_selected_sets(case, data):
    """O_i(2^a X, 2^a z, 2^−2a W) = O_i (same attention; never refused).

    The exponents are drawn for the matrix actually scaled, ``4W`` (drawing them for ``W`` let
    ``4W·2^b`` overflow to inf by 2 bits: "W must be finite"), so every scaled entry is a normal
    double by construction."""
    inst, W, V = case
    W4 = 4 * W  # exact: a power of two
    a, b, _ = _mt_exps(data, inst, W4, V, False)
    sweep(
        "selected_sets",
        lambda: MT.selected_sets(inst, W4),
        lambda: MT.selected_sets(S.scaled(inst, a, a, 0), ld(W4, b)),
        lambda sets: [np.concatenate([np.append(s, -1) for s in sets]).astype(float)],
        [0],
        rtol=0.0,
    )


_MT_GD_TALLY = Tally()


@bounded_discards(_MT_GD_TALLY)
@settings(max_examples=25)
@given(mt_cases(), st.data())
def test_run_multitoken_gd(case, data):
    """Five plain steps on (2^a X, 2^a z, 2^−a V) with lr·2^−4a give 2^−2a W_t (∇ scales by 2^2a).

    The claim is about ``W_t``; plain GD also refuses, by the contract, a gradient outside float64's range,
    and the gradient scales by ``2^2a`` while ``W_t`` scales by ``2^−2a``: where the gradient leaves the range
    at one of the two scales (e.g. ~1e-308 on data with tiny entries) the two runs need not agree on a
    refusal. Such draws are set aside, counted and bounded, the refusal asserted to name the gradient's range."""
    inst, _, V = case
    rV = S.exponent_range(V)
    a = free(data.draw, np.concatenate([inst.X.ravel(), inst.z.ravel()]), max(-rV[1], -250), min(-rV[0], 250))
    _MT_GD_TALLY.run += 1

    def base() -> Any:
        return MT.run_multitoken_gd(inst, V, 5, 1.0, record_at=[5])

    def scaled() -> Any:
        return MT.run_multitoken_gd(S.scaled(inst, a, a, 0), ld(V, -a), 5, 2.0 ** (-4 * a), record_at=[5])

    for call in (base, scaled):
        try:
            call()
        except NumericalError as exc:
            if "multi-token gradient ∇L(W)" in str(exc):
                assert RANGE_MESSAGE in str(exc), exc
                _MT_GD_TALLY.discard("the plain gradient leaves float64's range at one of the two scales")
                return
    sweep(
        "run_multitoken_gd",
        base,
        scaled,
        lambda tr: [tr.W, np.array([tr.record[-1].risk])],
        [-2 * a, 0],
        rtol=ENGINE_RTOL,
    )


_MT_PREDICT_TALLY = Tally()


@bounded_discards(_MT_PREDICT_TALLY)
@settings(max_examples=15)
@given(mt_cases(), st.data())
def test_predict_multitoken(case, data):
    """W_dir, W_fin, the prediction scale by 2^−2a with W_gd; R and the relative error are invariant.

    ``W_gd`` comes from 30 plain multi-token GD steps; where that run refuses (its gradient leaves float64's
    range, e.g. ~1e-364 at step 2 with a zero head), there is no ``W_gd`` to predict from: set aside,
    counted and bounded."""
    inst, W, V = case
    _MT_PREDICT_TALLY.run += 1
    try:
        Wg = MT.run_multitoken_gd(inst, V, 30, 2.0, W0=W).W
    except NumericalError as exc:
        assert "float64" in str(exc) or "double" in str(exc), exc  # the scale contract's refusal, named
        _MT_PREDICT_TALLY.discard("the plain multi-token GD run giving W_gd refused (range)")
        return
    a, b, _ = _mt_exps(data, inst, Wg, V, False)
    sweep(
        "predict_multitoken",
        lambda: MT.predict_multitoken(inst, Wg),
        lambda: MT.predict_multitoken(S.scaled(inst, a, a, 0), ld(Wg, b)),
        lambda r: [r.W_dir, r.W_fin, r.prediction, np.array([r.R, r.rel_error])],
        [-2 * a, -2 * a, -2 * a, 0],
        rtol=1e-12,  # the min-norm solves on identical mantissas; R divides two sums of d² terms
    )


# ================================ rows far apart: one scale per block (issue 16, per-row exponents)
#: The block-spread answer and the two one-block answers come from different active-set solves; each is
#: within its own ``error_bound`` (first order, relative to the norm) of the exact answer, so they differ by
#: at most the sum; this factor covers the second-order remainder and the final put-backs' roundings.
BLOCK_BOUND_FACTOR = 4.0
_BLOCK_TALLY = Tally()
#: How far apart (in binades) the two blocks' exponents are drawn: past the ~2^537 where a shared exponent
#: read the smaller block's rows as zero, short of the ~2^1000 where every multiplier leaves the range.
SPREAD_BITS = 700


def _block_case(data: Any) -> tuple[list[tuple[Instance, np.ndarray, int]], list[int], list[int]]:
    """Two one-sequence prompt instances with the same ``T`` (each with its optimal token), and one exponent
    of ``X`` and one of ``W`` per block, each keeping that block's data normal (block 1's within
    :data:`SPREAD_BITS` of block 0's, so their rows may be up to ~2^1400 apart)."""
    T = data.draw(st.integers(2, 3))
    blocks = []
    for _ in range(2):
        inst, W = data.draw(prompt_instances(n=(1, 1), T=(T, T), extra_d=1))
        blocks.append((inst, W, int(P.scaled_alpha(inst, None)[0])))
    # block 0 anywhere; block 1 within SPREAD_BITS of it (beyond ~2^537 a shared exponent lost a block, and
    # multipliers scale as 2^−2(a+b), so spreads past ~2^1000 are refusals only)
    a0, b0 = free(data.draw, blocks[0][0].X), free(data.draw, blocks[0][1])
    a1 = free(data.draw, blocks[1][0].X, a0 - SPREAD_BITS, a0 + SPREAD_BITS)
    b1 = free(data.draw, blocks[1][1], b0 - SPREAD_BITS, b0 + SPREAD_BITS)
    return blocks, [a0, a1], [b0, b1]


def _block_instance(blocks: list[tuple[Instance, np.ndarray, int]], a: list[int], b: list[int]):
    """The two blocks side by side: sequence ``i`` in coordinates of block ``i`` (scaled by ``2^a_i``),
    ``W = blockdiag(2^b_0 W_0, 2^b_1 W_1)``, so the keys, rows, SVMs and their solutions decouple."""
    d = [inst.d for inst, _, _ in blocks]
    T = blocks[0][0].T
    X = np.zeros((2, T, sum(d)))
    W = np.zeros((sum(d), sum(d)))
    off = [0, d[0]]
    for i, (inst, Wi, _) in enumerate(blocks):
        X[i, :, off[i] : off[i] + d[i]] = ld(inst.X[0], a[i])
        W[off[i] : off[i] + d[i], off[i] : off[i] + d[i]] = ld(Wi, b[i])
    Y = np.array([blocks[0][0].Y[0], blocks[1][0].Y[0]])
    return Instance(X, Y, np.ones(sum(d))), W, [al for _, _, al in blocks], off


def _block_parts(
    parts: list[list[np.ndarray]],
    shifts: list[list[int]],
    layout: list[Callable[[list[np.ndarray]], np.ndarray]],
):
    """The oracle of each part: the one-block parts moved by their own power of two and laid side by side;
    with ``hi``, log2 of its largest entry (the answer's size, which decides refusal)."""
    out = []
    for k, lay in enumerate(layout):
        his = [_log2max(parts[i][k]) + shifts[i][k] for i in range(2)]
        out.append((lay([ld(parts[i][k], shifts[i][k]) for i in range(2)]), max(his)))
    return out


def _check_blocks(name: str, got: Any, want: list[tuple[np.ndarray, float]], getters, bound: float) -> None:
    for (w, hi), g in zip(want, getters, strict=True):
        assert (
            hi <= LOG2_MAX + RANGE_SLACK_BITS and hi >= LOG2_TINY - RANGE_SLACK_BITS or not np.isfinite(hi)
        ), f"{name}: returned a value where the answer is not a double"
        y = np.asarray(g(got), dtype=np.float64)
        assert np.all(np.isfinite(y)), f"{name}: non-finite entries"
        # norms of the parts divided by their largest entry (entries near 1e308 would overflow when squared)
        m = float(max(np.max(np.abs(w), initial=0.0), np.max(np.abs(y), initial=0.0)))
        if m == 0.0:
            continue
        err = float(np.linalg.norm(y / m - w / m))
        tol = (bound + EQUI_RTOL) * float(np.linalg.norm(w / m)) + 2.0**-1074 * y.size / m
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol:.3g} (largest entry {m:.3g})"


def _refusal_allowed(name: str, exc: NumericalError, want: list[tuple[Any, float]]) -> None:
    assert RANGE_MESSAGE in str(exc), f"{name}: refusal does not name the range: {exc}"
    assert any(
        not (LOG2_TINY + RANGE_SLACK_BITS <= hi <= LOG2_MAX - RANGE_SLACK_BITS)
        for _, hi in want
        if np.isfinite(hi)
    ), f"{name}: refused although every part is representable: {exc}"
    event(f"{name}: refused (out of range)")


def _side_by_side_vec(off: list[int], dim: int) -> Callable[[list[np.ndarray]], np.ndarray]:
    def lay(xs: list[np.ndarray]) -> np.ndarray:
        out = np.zeros(dim)
        for i, x in enumerate(xs):
            out[off[i] : off[i] + x.size] = x
        return out

    return lay


def _side_by_side_rows(off: list[int], dim: int) -> Callable[[list[np.ndarray]], np.ndarray]:
    def lay(xs: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((sum(x.shape[0] for x in xs), dim))
        r = 0
        for i, x in enumerate(xs):
            out[r : r + x.shape[0], off[i] : off[i] + x.shape[1]] = x
            r += x.shape[0]
        return out

    return lay


def _stacked(xs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(xs)


@bounded_discards(_BLOCK_TALLY)
@settings(max_examples=40)
@given(st.data())
def test_solve_prompt_svm_blocks_of_any_scale(data):
    """Two sequences in orthogonal coordinate blocks, each block's ``X`` and ``W`` scaled by its own power of
    two (``2^a_i``, ``2^b_i``): the p-SVM decouples, so ``p_mm`` is the two one-block solutions moved by
    ``2^−(a_i+b_i)`` side by side, the multipliers by ``2^−2(a_i+b_i)``, the rows by ``2^(a_i+b_i)`` (oracle:
    the one-block solves at scale 1 and the exact equivariance). Returned within the solves' error bounds
    (relative to the norm), or refused exactly when the largest entry of a part is not a double; never
    InfeasibleSVMError (every block is feasible). A one-block solve refused at scale 1 is set aside, counted."""
    _BLOCK_TALLY.run += 1
    blocks, a, b = _block_case(data)
    try:
        base = [P.solve_prompt_svm(inst, W, [al]) for inst, W, al in blocks]
    except AttnSVMError as exc:
        _BLOCK_TALLY.discard(f"a one-block p-SVM refused at scale 1 ({type(exc).__name__})")
        return
    inst, W, alpha, off = _block_instance(blocks, a, b)
    s = [a[i] + b[i] for i in range(2)]
    want = _block_parts(
        [[x.p, x.duals, x.rows] for x in base],
        [[-s[i], -2 * s[i], s[i]] for i in range(2)],
        [_side_by_side_vec(off, inst.d), _stacked, _side_by_side_rows(off, inst.d)],
    )
    try:
        got = P.solve_prompt_svm(inst, W, alpha)
    except NumericalError as exc:
        _refusal_allowed("solve_prompt_svm (blocks)", exc, want)
        return
    bound = BLOCK_BOUND_FACTOR * (got.error_bound + max(x.error_bound for x in base))
    _check_blocks(
        "solve_prompt_svm (blocks)", got, want, [lambda g: g.p, lambda g: g.duals, lambda g: g.rows], bound
    )
    event(f"solve_prompt_svm (blocks): returned, certified={got.certified}")


_JOINT_BLOCK_TALLY = Tally()


@bounded_discards(_JOINT_BLOCK_TALLY)
@settings(max_examples=40)
@given(st.data())
def test_solve_joint_svm_blocks_of_any_scale(data):
    """As :func:`test_solve_prompt_svm_blocks_of_any_scale` for the joint SVMs: the v-SVM rows ``Y_i x_iα`` lie
    in different blocks, so both inputs are support inputs, the relaxed p-SVM is the p-SVM, and ``v_mm`` is the
    one-block ``v`` moved by ``2^−a_i`` (multipliers ``2^−2a_i``), ``p_relax`` as the p-SVM's."""
    _JOINT_BLOCK_TALLY.run += 1
    blocks, a, b = _block_case(data)
    try:
        base = [J.solve_joint_svm(inst, W, [al]) for inst, W, al in blocks]
    except AttnSVMError as exc:
        _JOINT_BLOCK_TALLY.discard(f"a one-block joint SVM refused at scale 1 ({type(exc).__name__})")
        return
    inst, W, alpha, off = _block_instance(blocks, a, b)
    s = [a[i] + b[i] for i in range(2)]
    vec, rows = _side_by_side_vec(off, inst.d), _side_by_side_rows(off, inst.d)
    want = _block_parts(
        [[x.v, x.v_duals, x.p, x.p_duals, x.p_rows] for x in base],
        [[-a[i], -2 * a[i], -s[i], -2 * s[i], s[i]] for i in range(2)],
        [vec, _stacked, vec, _stacked, rows],
    )
    try:
        got = J.solve_joint_svm(inst, W, alpha)
    except NumericalError as exc:
        _refusal_allowed("solve_joint_svm (blocks)", exc, want)
        return
    np.testing.assert_array_equal(got.support_inputs, [0, 1])
    # JointSVMSolution carries no error bound: its relaxed p-SVM is here the p-SVM, whose bound
    # solve_prompt_svm reports (a tolerance only; the oracle is the one-block answers); the v-SVM has one
    # row per block, orthogonal rows, so cond(K_S) = 1 and the same bound covers it
    bound = BLOCK_BOUND_FACTOR * (
        P.solve_prompt_svm(inst, W, alpha).error_bound
        + max(P.solve_prompt_svm(bi, Wi, [al]).error_bound for bi, Wi, al in blocks)
    )
    getters = [lambda g: g.v, lambda g: g.v_duals, lambda g: g.p, lambda g: g.p_duals, lambda g: g.p_rows]
    _check_blocks("solve_joint_svm (blocks)", got, want, getters, bound)
    event(f"solve_joint_svm (blocks): returned, certified={got.certified}")


# ======================= multi-token rows far apart: one scale per block (issue 16, predict_multitoken)
_MT_BLOCK_TALLY = Tally()
#: How far apart (in binades) the two blocks' ``X`` and ``z`` exponents are drawn. The rows ``z_i ⊗ (x_it −
#: x_iτ)`` scale as ``2^{2a_i}``, so they are up to 2^800 apart: past the ~2^537 where one shared exponent read the
#: smaller block's rows as zero. Kept below 511: the selected sets come from logits formed on mantissas of ``X``,
#: ``z``, ``W_gd`` shared by all sequences, where the smaller block's factors (``2^{−2|a_1 − a_0|}``) would fall
#: below 2^−1022 and lose digits (a known gap of ``selected_sets``, docs/scale-contract.md).
MT_SPREAD_BITS = 400
#: ``|a_1 − a_0|`` of the examples aimed past the old failure: rows ``2^{2·270} = 2^540`` apart and more.
MT_FAR_BITS = 270
#: ``W_dir`` of each certified solve is within ``κ·eps ≤ CERTIFY_RTOL`` of the exact one relative to its norm
#: (first order); the spread and the one-block solves differ by at most the sum; 2× covers the second order.
MT_DIR_RTOL = 4 * CERTIFY_RTOL
#: ``W_fin`` is within ``(κ + √m·d²·√κ)·eps·||W_gd||`` of the exact projection; certified (``κ·eps ≤ CERTIFY_RTOL``)
#: with ``m ≤ 2T ≤ 6`` rows and ``d ≤ 8``: ``≤ CERTIFY_RTOL + √6·64·√(CERTIFY_RTOL·eps) < 2·CERTIFY_RTOL``; two solves,
#: 2× for the second order.
MT_FIN_RTOL = 8 * CERTIFY_RTOL
#: A support row is unresolved (or a rounding-level row enters the error bound) only when its ``||a_r||·||W_dir||``
#: reaches ``1/SUPPORT_RTOL − 1`` (``4d·eps`` resolution for the bound, far above); half that leaves room for the
#: rounding of the computed norms.
MT_UNRESOLVED_LOG2 = math.log2(0.5 / SUPPORT_RTOL)


def _mt_block(seed: int, T: int, d: int, c: float) -> tuple[Instance, np.ndarray]:
    """One sequence of ``T`` Gaussian tokens in ``d ≥ T`` dimensions (independent, so every multi-token SVM is
    feasible), a Gaussian query and ``W_gd = c·G`` (``c`` sets how many tokens are selected)."""
    rng = np.random.default_rng(seed)
    inst = Instance(rng.standard_normal((1, T, d)), np.ones(1), np.ones(d), rng.standard_normal((1, d)))
    return inst, c * rng.standard_normal((d, d))


def _block_diag(off: list[int], dim: int) -> Callable[[list[np.ndarray]], np.ndarray]:
    def lay(xs: list[np.ndarray]) -> np.ndarray:
        out = np.zeros((dim, dim))
        for i, x in enumerate(xs):
            out[off[i] : off[i] + x.shape[0], off[i] : off[i] + x.shape[1]] = x
        return out

    return lay


def _log2_norm(parts: list[np.ndarray], shifts: list[int]) -> float:
    """``log2 ||blockdiag(parts_i·2^shift_i)||_F`` from the parts' mantissas (nothing over- or underflows)."""
    logs = []
    for p, s in zip(parts, shifts, strict=True):
        m = float(np.max(np.abs(p), initial=0.0))
        if m > 0:
            logs.append(2 * (math.log2(m) + s) + math.log2(float(np.sum((p / m) ** 2))))
    if not logs:
        return -math.inf
    top = max(logs)
    return 0.5 * (top + math.log2(sum(2.0 ** (g - top) for g in logs)))


@bounded_discards(_MT_BLOCK_TALLY)
@settings(max_examples=60)
@given(st.data())
def test_predict_multitoken_blocks_of_any_scale(data):
    """Two sequences in orthogonal coordinate blocks, block ``i``'s ``X`` and ``z`` scaled by ``2^a_i`` and its
    ``W_gd`` by ``2^−2a_i`` (same logits, so the same selected sets): both min-norm problems decouple, so ``W_dir``
    and ``W_fin`` are the one-block solutions moved by ``2^−2a_i``, block-diagonal (oracle: the one-block solves at
    scale 1 and the exact equivariance). Returned within the certified bounds (``W_dir`` relative to its norm,
    ``W_fin`` relative to ``||W_gd||``); refused with SolverError only where a row's ``||a_r||·||W_dir||`` reaches the
    unresolved level at the blocks' spread; a range refusal only where the fitted ``R`` is not a double; never
    InfeasibleSVMError (every block is feasible). A one-block prediction refused at scale 1 is set aside, counted."""
    _MT_BLOCK_TALLY.run += 1
    T = data.draw(st.integers(2, 3))
    blocks = [
        _mt_block(
            data.draw(st.integers(0, 2**32 - 1)),
            T,
            T + data.draw(st.integers(0, 1)),
            data.draw(st.sampled_from([0.5, 3.0, 20.0])),
        )
        for _ in range(2)
    ]
    try:
        base = [MT.predict_multitoken(inst, Wg) for inst, Wg in blocks]
    except AttnSVMError as exc:
        _MT_BLOCK_TALLY.discard(f"a one-block prediction refused at scale 1 ({type(exc).__name__})")
        return
    # a_i keeps X_i, z_i (·2^a_i) and W_gd, W_dir, W_fin, W_mm of block i (·2^−2a_i) normal
    rng_a = []
    for (inst, Wg), b in zip(blocks, base, strict=True):
        lo, hi = S.exponent_range(inst.X, inst.z)
        wl, wh = S.exponent_range(Wg, b.W_dir, b.W_fin, *([] if b.W_mm is None else [b.W_mm]))
        rng_a.append((max(lo, -(wh // 2)), min(hi, (-wl) // 2)))
    a0 = data.draw(st.integers(*rng_a[0]))
    # half the examples aim past the old failure (rows 2^{2|a_1 − a_0|} ≥ 2^537 apart), half anywhere within
    far = data.draw(st.booleans())
    step = data.draw(st.integers(MT_FAR_BITS if far else 0, MT_SPREAD_BITS)) * data.draw(
        st.sampled_from([1, -1])
    )
    a1 = min(max(a0 + step, rng_a[1][0]), rng_a[1][1])
    a = [a0, a1]
    d = [inst.d for inst, _ in blocks]
    off, dim = [0, d[0]], sum(d)
    X = np.zeros((2, T, dim))
    z = np.zeros((2, dim))
    for i, (inst, _) in enumerate(blocks):
        X[i, :, off[i] : off[i] + d[i]] = ld(inst.X[0], a[i])
        z[i, off[i] : off[i] + d[i]] = ld(inst.z[0], a[i])
    lay = _block_diag(off, dim)
    Wg = lay([ld(Wi, -2 * a[i]) for i, (_, Wi) in enumerate(blocks)])
    inst = Instance(X, np.ones(2), np.ones(dim), z)
    shifts = [-2 * a[i] for i in range(2)]
    # the oracle parts and log2 of their largest entries
    (want_dir, hi_dir), (want_fin, hi_fin) = _block_parts(
        [[b.W_dir, b.W_fin] for b in base], [[s, s] for s in shifts], [lay, lay]
    )
    log2_dir = _log2_norm([b.W_dir for b in base], shifts)
    try:
        got = MT.predict_multitoken(inst, Wg)
    except SolverError as exc:
        # ||a_r|| = ||z_i||·||x_it − x_iτ||·4^{a_i} over every token pair of a block with a direction part
        reach = max(
            (
                math.log2(float(np.linalg.norm(bi.z[0]) * np.linalg.norm(bi.X[0, t] - bi.X[0, u]))) + 2 * a[i]
                for i, (bi, _) in enumerate(blocks)
                if np.any(base[i].W_dir)
                for t in range(T)
                for u in range(T)
                if t != u and np.any(bi.X[0, t] != bi.X[0, u])
            ),
            default=-math.inf,
        )
        assert reach + log2_dir >= MT_UNRESOLVED_LOG2, f"refused although every row is resolved: {exc}"
        event("predict_multitoken (blocks): refused (rows too far apart to certify)")
        return
    except NumericalError as exc:
        num = sum(
            mpmath.ldexp(float(np.sum((Wi - b.W_fin) * b.W_dir)), 2 * s)
            for (_, Wi), b, s in zip(blocks, base, shifts, strict=True)
        )
        den = sum(mpmath.ldexp(float(np.sum(b.W_dir**2)), 2 * s) for b, s in zip(base, shifts, strict=True))
        R = num / den if den else mpmath.mpf(0)
        log2_R = float(mpmath.log(abs(R), 2)) if R else -math.inf
        assert RANGE_MESSAGE in str(exc) and not (
            LOG2_TINY + RANGE_SLACK_BITS <= log2_R <= LOG2_MAX - RANGE_SLACK_BITS
        ), f"refused although every part is a double: {exc}"
        event("predict_multitoken (blocks): refused (R out of range)")
        return
    assert [s.tolist() for s in got.sets] == [b.sets[0].tolist() for b in base]
    _check_blocks(
        "predict_multitoken W_dir (blocks)", got, [(want_dir, hi_dir)], [lambda g: g.W_dir], MT_DIR_RTOL
    )
    # W_fin's bound is relative to ||W_gd||: as a bound relative to ||W_fin||, scaled by their ratio
    log2_fin = _log2_norm([b.W_fin for b in base], shifts)
    ratio = (
        2.0 ** min(_log2_norm([Wi for _, Wi in blocks], shifts) - log2_fin, 1000.0)
        if np.any(want_fin)
        else 1.0
    )
    _check_blocks(
        "predict_multitoken W_fin (blocks)",
        got,
        [(want_fin, hi_fin)],
        [lambda g: g.W_fin],
        MT_FIN_RTOL * ratio,
    )
    event(
        f"predict_multitoken (blocks): returned, blocks' rows moved ≥ 2^537 apart = {2 * abs(a[1] - a[0]) >= 537}"
    )


# ============================ ℓp-SVM rows far apart: one scale per block (Clarabel's false infeasibility)
_LP_BLOCK_TALLY = Tally()
#: Block 1's exponent is drawn within this many binades of block 0's: its rows z ⊗ Δ then lie up to 2^(2·120)
#: from block 0's, far past the ~2^40 where Clarabel called the shared-exponent problem infeasible, while every
#: answer stays a double (|a_i| ≤ 150, so μ ~ 2^(−2p·a_i) stays in range for p ≤ 3).
LP_SPREAD_BITS = 120
#: Polished answers solve the active KKT equations to NEWTON_TOL = 1e-13 per block (the Newton system is block
#: diagonal, LU keeps its blocks); 1e-9 relative per block also covers cond(J) of the small random blocks, as the
#: existing scale property of solve_lp_svm (Clarabel on identical mantissas) allows.
LP_BLOCK_RTOL = 1e-9
#: solve_lp_svm divides W by its smallest margin m and recomputes the margins: (A·w)/m rounds, so the returned
#: min_margin is 1 to a few ulps (found: 1 − 2^−53 at scale 1, on the ordinary path), not ≥ 1 exactly.
LP_MARGIN_ATOL = 4 * EPS


def _lp_block(seed: int, T: int, d: int) -> Instance:
    from attnsvm.model._instance import random_instance

    return random_instance(1, T, d, seed=seed, family="unit")


@bounded_discards(_LP_BLOCK_TALLY)
@settings(max_examples=25)
@given(st.data())
def test_solve_lp_svm_blocks_far_apart(data):
    """Two sequences in orthogonal coordinate blocks (tokens and query of sequence i in block i, scaled by 2^a_i):
    the ℓp objective Σ|W_jk|^p separates over the blocks W[B_i, B_i], so W_p is the two one-block solutions moved
    by 2^−2a_i side by side, the objective (Σ_i 2^−2a_i·p ||W_i||_p^p)^{1/p}, the multipliers 2^−2a_i·p μ_i (oracle:
    the one-block solves at scale 1, the exact equivariance and the separability). Never InfeasibleSVMError (each
    block is feasible). Polished: each block within LP_BLOCK_RTOL of its own size; unpolished: feasible, and the
    objective within the certified gaps of the oracle's. A one-block solve refused at scale 1 is set aside, counted."""
    _LP_BLOCK_TALLY.run += 1
    p = data.draw(st.sampled_from([1.5, 2.0, 3.0]))
    T = data.draw(st.integers(2, 3))
    dims = [data.draw(st.integers(2, 3)) for _ in range(2)]  # d = 1: unit tokens ±1 may coincide (infeasible)
    blocks = [_lp_block(data.draw(st.integers(0, 10**6)), T, dims[i]) for i in range(2)]
    a0 = data.draw(st.integers(-30, 30))
    a = [a0, a0 + data.draw(st.integers(-LP_SPREAD_BITS, LP_SPREAD_BITS))]
    alphas = [0, 0]  # any token: the SVM needs no optimal one (generic tokens, T − 1 ≤ d: feasible)
    try:
        base = [M.solve_lp_svm(b, p, [al]) for b, al in zip(blocks, alphas, strict=True)]
    except AttnSVMError as exc:
        _LP_BLOCK_TALLY.discard(f"a one-block ℓp-SVM refused at scale 1 ({type(exc).__name__})")
        return
    d, off = sum(dims), [0, dims[0]]
    X, z = np.zeros((2, T, d)), np.zeros((2, d))
    for i, b in enumerate(blocks):
        X[i, :, off[i] : off[i] + dims[i]] = ld(b.X[0], a[i])
        z[i, off[i] : off[i] + dims[i]] = ld(b.z[0], a[i])
    inst = Instance(X, np.ones(2), np.ones(d), z)
    got = M.solve_lp_svm(inst, p, alphas)  # every block feasible: any InfeasibleSVMError fails the property
    event(f"solve_lp_svm (blocks, p = {p}): returned, polished={got.polished}")
    assert got.min_margin >= 1.0 - LP_MARGIN_ATOL
    with mpmath.workdps(40):
        opt = sum(mpmath.mpf(x.objective) ** p * mpmath.mpf(2) ** (-2 * a[i] * p) for i, x in enumerate(base))
        opt = opt ** (1 / mpmath.mpf(p))
        # relative to the larger of the two, as the gaps are (gap = (obj − lb)/obj): obj ≥ opt gives
        # (obj − opt)/obj ≤ gap; opt > obj gives (opt − opt*)/opt ≤ max gap_i (opt from the blocks' objectives,
        # each ≤ its optimum/(1 − gap_i)). Relative to opt alone the first is gap·obj/opt: gap + gap² (a case
        # of gap 8.0772e-5 read 8.0779e-5).
        slack = float(abs(mpmath.mpf(got.objective) - opt) / max(mpmath.mpf(got.objective), opt))
    assert slack <= got.gap + max(x.gap for x in base) + LP_BLOCK_RTOL, (slack, got.gap)
    if got.polished and all(x.polished for x in base):
        for i, x in enumerate(base):
            Wi = got.W[off[i] : off[i] + dims[i], off[i] : off[i] + dims[i]]
            want = ld(x.W, -2 * a[i])
            err = float(np.max(np.abs(Wi - want))) / float(np.max(np.abs(want)))
            assert err <= LP_BLOCK_RTOL, (i, err)
        # the other entries of W touch no row: 0 at the optimum
        Wc = np.array(got.W)
        for i in range(2):
            Wc[off[i] : off[i] + dims[i], off[i] : off[i] + dims[i]] = 0.0
        assert not np.any(Wc != 0.0)
