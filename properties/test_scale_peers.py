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
from typing import Any

import numpy as np
from _discards import Tally, bounded_discards
from hypothesis import event, given, settings
from hypothesis import strategies as st

from attnsvm import strategies as S
from attnsvm.errors import AttnSVMError, NumericalError
from attnsvm.model._instance import Instance
from attnsvm.peer_strategies import heads, p_norms, prompt_instances
from attnsvm.peers import _joint as J
from attnsvm.peers import _mirror as M
from attnsvm.peers import _multitoken as MT
from attnsvm.peers import _prompt as P

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
    shifts: list[float],
    *,
    rtol: float = EQUI_RTOL,
    entrywise: bool = False,
) -> None:
    """Run both calls and check the equivariance ``parts(scaled()) = parts(base())·2^shifts``."""
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
    status = [_status(x, s, entrywise) for x, s in zip(pb, shifts, strict=True)]
    try:
        g = scaled()
    except NumericalError as exc:
        assert RANGE_MESSAGE in str(exc), f"{name}: refusal does not name the range: {exc}"
        assert any(s != "in" for s in status), f"{name}: refused although every part is representable: {exc}"
        event(f"{name}: refused (out of range)")
        return
    assert all(s != "out" for s in status), f"{name}: returned a value where the answer is not a double"
    for x, s, y in zip(pb, shifts, parts(g), strict=True):
        want = ld(x, s)
        y = np.asarray(y, dtype=np.float64)
        assert np.all(np.isfinite(y)), f"{name}: non-finite entries"
        scale = float(np.max(np.abs(want), initial=0.0))
        err = float(np.max(np.abs(y - want), initial=0.0))
        tol = rtol + (0.0 if float(s).is_integer() else EXPONENT_ULPS * EPS * abs(s) * math.log(2))
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
        [a * (p - 1)],
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
        [a / (p - 1)],
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


@settings(max_examples=25)
@given(mt_cases(), st.data())
def test_run_multitoken_gd(case, data):
    """Five plain steps on (2^a X, 2^a z, 2^−a V) with lr·2^−4a give 2^−2a W_t (∇ scales by 2^2a)."""
    inst, _, V = case
    rV = S.exponent_range(V)
    a = free(data.draw, np.concatenate([inst.X.ravel(), inst.z.ravel()]), max(-rV[1], -250), min(-rV[0], 250))
    sweep(
        "run_multitoken_gd",
        lambda: MT.run_multitoken_gd(inst, V, 5, 1.0, record_at=[5]),
        lambda: MT.run_multitoken_gd(S.scaled(inst, a, a, 0), ld(V, -a), 5, 2.0 ** (-4 * a), record_at=[5]),
        lambda tr: [tr.W, np.array([tr.record[-1].risk])],
        [-2 * a, 0],
        rtol=ENGINE_RTOL,
    )


@settings(max_examples=15)
@given(mt_cases(), st.data())
def test_predict_multitoken(case, data):
    """W_dir, W_fin, the prediction scale by 2^−2a with W_gd; R and the relative error are invariant."""
    inst, W, V = case
    Wg = MT.run_multitoken_gd(inst, V, 30, 2.0, W0=W).W
    a, b, _ = _mt_exps(data, inst, Wg, V, False)
    sweep(
        "predict_multitoken",
        lambda: MT.predict_multitoken(inst, Wg),
        lambda: MT.predict_multitoken(S.scaled(inst, a, a, 0), ld(Wg, b)),
        lambda r: [r.W_dir, r.W_fin, r.prediction, np.array([r.R, r.rel_error])],
        [-2 * a, -2 * a, -2 * a, 0],
        rtol=1e-12,  # the min-norm solves on identical mantissas; R divides two sums of d² terms
    )
