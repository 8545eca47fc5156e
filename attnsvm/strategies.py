"""Hypothesis strategies for attention instances, token choices and weight matrices.

Users import these to property-test their own attention code against attnsvm, and the
``properties/`` suites of this package are built on them. Every strategy *constructs* valid
data (no ``assume``, no filtering), keeps sizes small so that properties run fast, and draws
only finite float64 values of bounded magnitude.

Instances:

* :func:`instances` — general data: ``"gaussian"`` (standard normal, clipped to ``±bound``),
  ``"unit"`` (Gaussian rows scaled to unit length) or ``"uniform"`` (Hypothesis floats in
  ``[−bound, bound]``, which shrink to simple values and include zeros, repeats and exact ties);
  self-attention (``z = first token``) or cross-attention (``z`` given).
* :func:`feasible_instances` — instances *constructed* so that every Att-SVM(α) is feasible
  and the optimal token of every sequence is unique with a score gap of at least ``min_gap``.

  Sufficient condition used (and guaranteed exactly, not with probability one): the
  queries ``z_1, …, z_n`` are linearly independent and, in every sequence, the tokens are
  affinely independent (the differences ``x_iα − x_it``, ``t ≠ α``, are linearly
  independent for every ``α``). Then for any α there are ``u_i`` with
  ``(x_iα − x_it)ᵀ u_i = 1`` for all ``t ≠ α``, and a ``W`` with ``W z_i = u_i`` for all
  ``i``, so Att-SVM(α) is feasible. (For generic data this holds with probability one when
  ``d ≥ n`` and ``d ≥ T − 1``; the construction below makes it certain and well
  conditioned at the price of ``d ≥ T + 1`` for cross-attention and ``d ≥ n + T`` for
  self-attention.)

  Construction. Draw a random orthonormal basis ``e_0, …, e_{d−1}``; ``v = c e_0``. Token
  ``x_it = g_it e_0 + r_it p_it + m_i``: ``g_it`` sets the score ``γ_it = Y_i c g_it``
  exactly (so the top score leads the second by ``gap ≥ min_gap``), ``p_it`` are
  orthonormal and orthogonal to ``e_0`` (so the differences are independent, with singular
  values ≥ ``min(r) > 0``), ``r_it ∈ [½, 2]``, and ``m_i ⟂ p_i·`` a common offset that
  changes neither the differences nor the gaps. Cross-attention: ``z_i = s_i q_i`` with
  ``q_i`` orthonormal, ``s_i ∈ [½, 2]``. Self-attention: ``p_i0 = e_{1+i}`` is reserved to
  sequence ``i`` so that the queries ``z_i = x_i0`` are independent.

  With ``equal_nonoptimal_scores=True`` every non-optimal token of a sequence has the same
  score: the global-convergence condition of Tarzanagh et al. (arXiv 2308.16898), under
  which GD selects the optimal tokens.

Token choices and weights:

* :func:`token_choices` — one token index per sequence.
* :func:`directions`, :func:`weight_matrices` — ``W = scale · U`` with ``||U||_F = 1`` and a
  log-uniform scale, from moderate (``||W|| ~ 1``) to saturated (softmax weights within
  ``e^{−100}`` of one-hot).

Example::

    from hypothesis import given
    import numpy as np
    import attnsvm as A
    from attnsvm import strategies as S

    @given(S.instances_and_weights(scale=(1e-2, 1e3)))
    def test_softmax_rows_sum_to_one(pair):
        inst, W = pair
        s = A.attention(inst, W)
        assert np.abs(s.sum(axis=1) - 1).max() <= 1e-12

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Tarzanagh, Li, Thrampoulidis,
Oymak, arXiv 2308.16898 (Att-SVM, feasibility, global-convergence condition).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from .errors import InvalidInstanceError, unknown_name
from .instance import Instance

__all__ = [
    "INSTANCE_FAMILIES",
    "ATTENTION_KINDS",
    "bounded_floats",
    "seeds",
    "shapes",
    "instances",
    "feasible_instances",
    "token_choices",
    "instances_and_alphas",
    "directions",
    "weight_matrices",
    "instances_and_weights",
    "ScaledInstance",
    "exponent_range",
    "scaled",
    "scaled_instances",
]

FloatArray = NDArray[np.float64]

#: Families of :func:`instances`.
INSTANCE_FAMILIES = ("gaussian", "unit", "uniform")
#: Values of the ``attention`` argument: queries from the first token, given queries, or either.
ATTENTION_KINDS = ("self", "cross", "either")

_SizeRange = tuple[int, int]


def _check_range(name: str, rng: _SizeRange, low: int) -> _SizeRange:
    lo, hi = rng
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo < low or hi < lo:
        raise InvalidInstanceError(
            f"{name} must be a range (lo, hi) of integers with {low} ≤ lo ≤ hi; got {rng!r}"
        )
    return lo, hi


def bounded_floats(bound: float = 4.0) -> st.SearchStrategy[float]:
    """Finite float64 values in ``[−bound, bound]`` (no NaN, no Inf, no subnormals)."""
    if not (np.isfinite(bound) and bound > 0):
        raise InvalidInstanceError(f"bound must be a positive finite number; got {bound!r}")
    return st.floats(-bound, bound, allow_nan=False, allow_infinity=False, allow_subnormal=False, width=64)


def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``numpy.random.default_rng``; they shrink towards 0."""
    return st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def shapes(
    draw: Any,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 5),
    generic_feasible: bool = False,
) -> tuple[int, int, int]:
    """A shape ``(n, T, d)`` with sizes in the given inclusive ranges.

    ``generic_feasible=True`` raises ``d`` to at least ``max(n, T − 1)``, the size at which
    generic data makes every Att-SVM(α) feasible (the upper bound of ``d`` is raised too
    when needed).
    """
    n_lo, n_hi = _check_range("n", n, 1)
    T_lo, T_hi = _check_range("T", T, 2)
    d_lo, d_hi = _check_range("d", d, 1)
    nn = draw(st.integers(n_lo, n_hi))
    TT = draw(st.integers(T_lo, T_hi))
    if generic_feasible:
        need = max(nn, TT - 1)
        d_lo, d_hi = max(d_lo, need), max(d_hi, need)
    dd = draw(st.integers(d_lo, d_hi))
    return nn, TT, dd


def _unit_rows(a: FloatArray) -> FloatArray:
    """Rows scaled to unit length; an all-zero row becomes the first basis vector."""
    norm = np.linalg.norm(a, axis=-1, keepdims=True)
    e0 = np.zeros(a.shape[-1])
    e0[0] = 1.0
    return np.where(norm > 0, a / np.where(norm > 0, norm, 1.0), e0)


def _labels(draw: Any, n: int) -> FloatArray:
    return np.array(draw(st.lists(st.sampled_from([1.0, -1.0]), min_size=n, max_size=n)), dtype=np.float64)


def _self_or_cross(draw: Any, attention: str) -> bool:
    if attention not in ATTENTION_KINDS:
        raise unknown_name("attention", attention, ATTENTION_KINDS)
    if attention == "either":
        return bool(draw(st.booleans()))
    return attention == "self"


@st.composite
def instances(
    draw: Any,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 5),
    family: str = "gaussian",
    attention: str = "either",
    bound: float = 4.0,
    shape: tuple[int, int, int] | None = None,
) -> Instance:
    """General instances (no feasibility or uniqueness guarantee).

    Args:
      n, T, d: inclusive size ranges (ignored when ``shape`` is given).
      family: ``"gaussian"`` (seeded standard normal, clipped to ``±bound``), ``"unit"``
        (Gaussian rows of ``X``, ``z`` and ``v`` scaled to unit length) or ``"uniform"``
        (every entry a Hypothesis float in ``[−bound, bound]``: shrinks well, and covers
        zeros, repeated tokens and ties).
      attention: ``"self"`` (``z = first token``), ``"cross"`` (``z`` drawn) or ``"either"``.
      bound: largest magnitude of any entry.
      shape: a fixed ``(n, T, d)``.

    Returns:
      An :class:`attnsvm.Instance`, entries finite with ``|entry| ≤ bound``.
    """
    if family not in INSTANCE_FAMILIES:
        raise unknown_name("instance family", family, INSTANCE_FAMILIES)
    self_attn = _self_or_cross(draw, attention)
    nn, TT, dd = shape if shape is not None else draw(shapes(n, T, d))
    z: FloatArray | None
    if family == "uniform":
        el = bounded_floats(bound)
        X = draw(hnp.arrays(np.float64, (nn, TT, dd), elements=el))
        v = draw(hnp.arrays(np.float64, (dd,), elements=el))
        z = None if self_attn else draw(hnp.arrays(np.float64, (nn, dd), elements=el))
    else:
        rng = np.random.default_rng(draw(seeds()))
        X = np.clip(rng.standard_normal((nn, TT, dd)), -bound, bound)
        zg = np.clip(rng.standard_normal((nn, dd)), -bound, bound)
        v = np.clip(rng.standard_normal(dd), -bound, bound)
        if family == "unit":
            X, zg, v = _unit_rows(X), _unit_rows(zg), _unit_rows(v[None])[0]
        z = None if self_attn else zg
    return Instance(X, _labels(draw, nn), v, z)  # type: ignore[arg-type]  # z=None: self-attention


def _orthonormal(rng: np.random.Generator, d: int) -> FloatArray:
    """A random ``d × d`` orthogonal matrix (QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


@st.composite
def feasible_instances(
    draw: Any,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    extra_d: _SizeRange = (0, 1),
    attention: str = "either",
    min_gap: float = 0.1,
    equal_nonoptimal_scores: bool = False,
) -> Instance:
    """Instances constructed so that every Att-SVM(α) is feasible and ``opt`` is unique.

    See the module docstring for the construction and the sufficient condition it
    guarantees (independent queries, affinely independent tokens in every sequence).

    Args:
      n, T: inclusive size ranges.
      extra_d: ``d`` is the smallest dimension the construction needs (``T + 1`` for
        cross-attention, ``n + T`` for self-attention) plus a draw from this range.
      attention: ``"self"``, ``"cross"`` or ``"either"``.
      min_gap: the best token score of every sequence exceeds the second best by at least
        this much.
      equal_nonoptimal_scores: give all non-optimal tokens of a sequence the same score
        (the global-convergence condition of arXiv 2308.16898).

    Returns:
      An :class:`attnsvm.Instance` whose ``optimal_tokens()`` never raises.
    """
    if not (np.isfinite(min_gap) and min_gap > 0):
        raise InvalidInstanceError(f"min_gap must be a positive finite number; got {min_gap!r}")
    self_attn = _self_or_cross(draw, attention)
    nn = draw(st.integers(*_check_range("n", n, 1)))
    TT = draw(st.integers(*_check_range("T", T, 2)))
    dd = (nn + TT if self_attn else TT + 1) + draw(st.integers(*_check_range("extra_d", extra_d, 0)))
    rng = np.random.default_rng(draw(seeds()))
    Y = _labels(draw, nn)
    c = draw(st.floats(0.5, 2.0)) * draw(st.sampled_from([1.0, -1.0]))
    opt = draw(hnp.arrays(np.intp, (nn,), elements=st.integers(0, TT - 1)))
    gaps = draw(hnp.arrays(np.float64, (nn,), elements=st.floats(min_gap, min_gap + 1.0)))
    basis = _orthonormal(rng, dd)  # columns e_0 … e_{d−1}
    e0 = basis[:, 0]
    X = np.empty((nn, TT, dd))
    for i in range(nn):
        # Desired scores: the non-optimal ones in [−1, 1], the optimal one `gap` above their max.
        if equal_nonoptimal_scores:
            gam = np.full(TT, rng.uniform(-1.0, 1.0))
        else:
            gam = rng.uniform(-1.0, 1.0, size=TT)
        gam[opt[i]] = np.max(np.delete(gam, opt[i])) + gaps[i]
        g = gam / (Y[i] * c)  # γ_it = Y_i vᵀx_it = Y_i c g_it
        r = rng.uniform(0.5, 2.0, size=TT)
        if self_attn:
            # p_i0 = e_{1+i} reserved to sequence i; p_it (t ≥ 1) orthonormal in span(e_{1+n} …).
            rest = basis[:, 1 + nn :]
            rot = _orthonormal(rng, rest.shape[1])[:, : TT - 1]
            P = np.concatenate([basis[:, 1 + i : 2 + i], rest @ rot], axis=1)
            offset = rng.uniform(-1.0, 1.0) * e0  # along e_0 only: keeps z_i = x_i0 independent
        else:
            rest = basis[:, 1:]
            P = rest @ _orthonormal(rng, rest.shape[1])[:, :TT]
            # Offset orthogonal to the tokens' own directions: shifts every token alike.
            m = rng.standard_normal(dd)
            offset = m - P @ (P.T @ m) - e0 * (e0 @ m)
        X[i] = g[:, None] * e0[None, :] + (r[None, :] * P).T + offset[None, :]
    v = c * e0
    if self_attn:
        return Instance(X, Y, v)
    Q = _orthonormal(rng, dd)[:, :nn]
    s = rng.uniform(0.5, 2.0, size=nn)
    return Instance(X, Y, v, (Q * s[None, :]).T)


@st.composite
def token_choices(draw: Any, inst: Instance) -> NDArray[np.intp]:
    """A token choice α for ``inst``: one index in ``[0, T)`` per sequence, shape ``(n,)``."""
    return np.array(draw(hnp.arrays(np.intp, (inst.n,), elements=st.integers(0, inst.T - 1))), dtype=np.intp)


@st.composite
def instances_and_alphas(draw: Any, base: st.SearchStrategy[Instance] | None = None) -> tuple[Instance, Any]:
    """Pairs ``(inst, α)`` with α a :func:`token_choices` draw (default base: :func:`feasible_instances`)."""
    inst = draw(base if base is not None else feasible_instances())
    return inst, draw(token_choices(inst))


@st.composite
def directions(draw: Any, d: int) -> FloatArray:
    """A ``(d, d)`` matrix of unit Frobenius norm (a seeded Gaussian matrix, normalised)."""
    rng = np.random.default_rng(draw(seeds()))
    U = rng.standard_normal((d, d))
    return U / np.linalg.norm(U)


@st.composite
def weight_matrices(draw: Any, d: int, scale: tuple[float, float] = (1e-2, 1e2)) -> FloatArray:
    """``W = s · U``: ``U`` from :func:`directions`, ``s`` log-uniform in ``scale``, so ``||W||_F = s``.

    ``scale=(1e-2, 1)`` gives moderate weights; ``(1e2, 1e3)`` saturated ones (logits of
    unit-size data differ by tens to hundreds, so the softmax is one-hot to
    ``e^{−10}``–``e^{−100}`` or beyond).
    """
    lo, hi = scale
    if not (0 < lo <= hi and np.isfinite(hi)):
        raise InvalidInstanceError(f"scale must be a range (lo, hi) with 0 < lo ≤ hi < inf; got {scale!r}")
    e = draw(st.floats(np.log10(lo), np.log10(hi))) if hi > lo else np.log10(lo)
    return float(10.0**e) * draw(directions(d))


@st.composite
def instances_and_weights(
    draw: Any, base: st.SearchStrategy[Instance] | None = None, scale: tuple[float, float] = (1e-2, 1e2)
) -> tuple[Instance, FloatArray]:
    """Pairs ``(inst, W)`` with ``W`` a :func:`weight_matrices` draw of the instance's ``d``."""
    inst = draw(base if base is not None else instances())
    return inst, draw(weight_matrices(inst.d, scale))


# ---------------------------------------------------------------- scale sweeps
class ScaledInstance(NamedTuple):
    """An instance with ``X``, ``z``, ``v`` multiplied by ``2^jx``, ``2^jz``, ``2^jv`` (exactly).

    ``original`` is the unscaled instance: the oracle of a scale-sweep property is what the
    answer must be at scale 1 (an equivariance), so a property compares ``f(inst)`` with the
    rescaled ``f(original)``.
    """

    inst: Instance
    original: Instance
    jx: int
    jz: int
    jv: int


def exponent_range(*arrays: Any, headroom_bits: int = 0) -> tuple[int, int]:
    """The powers of two ``j`` for which ``a · 2^j`` keeps every nonzero entry of every array normal.

    Every entry stays a normal double (no rounding, no overflow), so scaling by ``2^j`` is
    exact. ``headroom_bits`` keeps the largest entry below ``FLOAT_MAX · 2^−headroom_bits``.
    Returns ``(lo, hi)`` with ``lo ≤ 0 ≤ hi``.
    """
    lo, hi = -1074, 1074
    for a in arrays:
        mag = np.abs(np.asarray(a, dtype=np.float64))
        nz = mag[mag > 0]
        if nz.size == 0:
            continue
        # frexp: x = m·2^e, m ∈ [½, 1). Normal doubles are 2^−1022 ≤ |x| < 2^1024.
        e_max = int(np.frexp(float(np.max(nz)))[1])
        e_min = int(np.frexp(float(np.min(nz)))[1])
        hi = min(hi, 1024 - e_max - headroom_bits)
        lo = max(lo, -1021 - e_min)
    return min(lo, 0), max(hi, 0)


def scaled(inst: Instance, jx: int = 0, jz: int = 0, jv: int = 0) -> Instance:
    """``inst`` with ``X → 2^jx X``, ``z → 2^jz z``, ``v → 2^jv v`` (self-attention: ``jz`` must be ``jx``)."""
    X = np.ldexp(inst.X, jx)
    v = np.ldexp(inst.v, jv)
    if inst.self_attention:
        if jz != jx:
            raise InvalidInstanceError(
                f"a self-attention instance has z = X[:, 0]: jz must equal jx; got {jz} ≠ {jx}"
            )
        return Instance(X, inst.Y, v)
    return Instance(X, inst.Y, v, np.ldexp(inst.z, jz))


@st.composite
def scaled_instances(
    draw: Any,
    base: st.SearchStrategy[Instance] | None = None,
    *,
    scale_X: bool = True,
    scale_z: bool = True,
    scale_v: bool = True,
    tied: bool = False,
    headroom_bits: int = 0,
) -> ScaledInstance:
    """Instances with ``X``, ``z``, ``v`` scaled by powers of two over the whole exponent range.

    Each exponent is drawn from :func:`exponent_range` of its array (every scaled entry stays
    a normal double, so the scaling is exact) and shrinks towards 0: a failure shrinks to the
    smallest scale that breaks. ``tied=True`` gives ``z`` the exponent of ``X`` (so
    ``W_mm(2^j X, 2^j z) = W_mm(X, z)/4^j`` is the property's oracle); self-attention
    instances always tie them (``z = x_i0``).

    Args:
      base: the unscaled instances (default :func:`instances` over every family).
      scale_X, scale_z, scale_v: which arrays to scale (the others keep exponent 0).
      tied: one exponent for ``X`` and ``z``.
      headroom_bits: keep every scaled entry below ``FLOAT_MAX · 2^−headroom_bits``.
    """
    inst = draw(
        base
        if base is not None
        else st.sampled_from(INSTANCE_FAMILIES).flatmap(lambda f: instances(family=f))
    )

    def exponent(on: bool, *arrays: Any) -> int:
        if not on:
            return 0
        lo, hi = exponent_range(*arrays, headroom_bits=headroom_bits)
        return int(draw(st.integers(lo, hi)))

    if tied or inst.self_attention:
        jx = exponent(scale_X or scale_z, inst.X, inst.z)
        jz = jx
    else:
        jx = exponent(scale_X, inst.X)
        jz = exponent(scale_z, inst.z)
    jv = exponent(scale_v, inst.v)
    return ScaledInstance(scaled(inst, jx, jz, jv), inst, jx, jz, jv)
