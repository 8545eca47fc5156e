"""Hypothesis strategies for attention instances, token choices and weight matrices.

Users import these to property-test their own attention code against attnsvm, and the
``properties/`` suites of this package are built on them. Every strategy *constructs* valid
data (no ``assume``, no filtering), keeps sizes small so that properties run fast, and draws
only finite float64 values of bounded magnitude. Every value comes from a Hypothesis draw (no
seeded generator), so a failure shrinks and a property can steer the draw
(``hypothesis.target``).

Shrinkable Gaussian values. A standard normal entry is ``g = Φ⁻¹(frac(½ + h(k)·2⁻⁶⁴))``
(``Φ⁻¹`` = :func:`scipy.special.ndtri`, ``h`` the SplitMix64 finaliser shifted so that
``h(0) = 0``) for a Hypothesis integer ``k ≥ 0``: ``h`` scatters even the small ``k`` that
Hypothesis favours, so ``g`` is standard normal; ``k = 0`` gives ``g = 0``. The ``k`` of one array are distinct
by construction (see :func:`gaussian_arrays`), so no two entries are equal by accident: the
Gaussian families stay *generic* (no ties, no repeated tokens), ties are made on purpose with
the options below, and failures shrink to a fixed reference array (first entry 0).

Instances:

* :func:`instances` — general data: ``"gaussian"`` (standard normal, clipped to ``±bound``),
  ``"unit"`` (Gaussian rows scaled to unit length) or ``"uniform"`` (Hypothesis floats in
  ``[−bound, bound]``, which shrink to simple values and include zeros, repeats and exact ties);
  self-attention (``z = first token``) or cross-attention (``z`` given). Hard cases on purpose:
  ``duplicates=True`` copies tokens exactly (equal logits and equal values in a sequence),
  ``near_parallel=True`` sets ``x_iu = x_it + δ·e`` with ``log10 δ`` drawn in ``[−15, −1]``
  (``e`` a unit basis vector); both shrink to "no tie".
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

  Construction. An orthonormal basis ``e_0, …, e_{d−1}`` is the ``Q`` of a QR factorisation
  of a Hypothesis-drawn Gaussian matrix (Householder QR returns an orthogonal ``Q`` for any
  matrix, so the guarantee does not depend on the draw); ``v = c e_0``. Token
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

Shapes: :func:`shapes` with ``generic_feasible=True`` keeps ``d ≥ max(n, T − 1)``;
``below_n=True`` drops the ``d ≥ n`` part, so ``d < n`` — where Att-SVM(α) can be infeasible
for generic data — is drawn too (for properties that assert the claim's true condition there).

Token choices and weights:

* :func:`token_choices` — one token index per sequence.
* :func:`directions`, :func:`weight_matrices` — ``W = scale · U`` with ``||U||_F = 1`` and a
  log-uniform scale, from moderate (``||W|| ~ 1``) to saturated.
* :func:`saturated_weights` — saturation stated in the quantity that matters: the
  *runner-up* attention weight. ``W = c·U`` with ``c`` solved so that, in the sequence
  whose top two logits of ``U`` are furthest apart, the largest non-top weight is the drawn
  value ``ρ`` (log-uniform, e.g. ``runner_up=(1e-300, 1e-1)``, or ``log_runner_up=(−1e5, −2)``
  for weights far below the float64 range); it shrinks towards the moderate end.
  :func:`instances_and_weights` takes the same ``runner_up``/``log_runner_up`` options.

Example::

    from hypothesis import given
    import numpy as np
    import attnsvm as A
    from attnsvm import strategies as S

    @given(S.instances_and_weights(runner_up=(1e-200, 1e-1)))
    def test_softmax_rows_sum_to_one(pair):
        inst, W = pair
        s = A.attention(inst, W)
        assert np.abs(s.sum(axis=1) - 1).max() <= 1e-12

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596; Tarzanagh, Li, Thrampoulidis,
Oymak, arXiv 2308.16898 (Att-SVM, feasibility, global-convergence condition); Steele, Lea, Flood,
OOPSLA 2014 (SplitMix64); Weyl (1916), equidistribution of ``k·φ mod 1`` (:func:`_unit_interval`).
"""

from __future__ import annotations

from ._deps import require

require("hypothesis", feature="attnsvm.strategies (the Hypothesis strategies)")  # pragma: no mutate

import math
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray
from scipy.special import ndtri

from .errors import InvalidInstanceError, unknown_name
from .model._instance import Instance, require_unmasked

__all__ = [
    "INSTANCE_FAMILIES",
    "ATTENTION_KINDS",
    "bounded_floats",
    "seeds",
    "gaussian_arrays",
    "shapes",
    "instances",
    "feasible_instances",
    "token_choices",
    "instances_and_alphas",
    "directions",
    "weight_matrices",
    "saturated_weights",
    "log_runner_up_weight",
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
#: Golden-ratio conjugate: ``frac(½ + k·φ)`` is equidistributed in ``[0, 1)`` (Weyl).
_PHI = (math.sqrt(5.0) - 1.0) / 2.0
#: Range of the integers behind a Gaussian entry.
_K_MAX = 2**31 - 1
#: Smallest ``log10 δ`` of a near-parallel pair (δ = 1e-15 is ~7 ulps of a unit entry).
NEAR_PARALLEL_LOG10 = (-15.0, -1.0)
#: :func:`saturated_weights` keeps every logit magnitude ``Σ_kj |x_k W_kj z_j|`` below this.
LOGIT_CAP = 1e300

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
    """Seeds for ``numpy.random.default_rng``; they shrink towards 0.

    Kept for users' own properties; the strategies of this module no longer use a seeded
    generator (see :func:`gaussian_arrays`).
    """
    return st.integers(min_value=0, max_value=2**32 - 1)


def _mix(k: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64-bit integers.

    Integer arithmetic on arrays (0-d included) wraps modulo 2⁶⁴ without consulting
    ``np.errstate``, so no overflow guard is needed.
    """
    z = k + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _gauss_of(k: NDArray[np.uint64]) -> FloatArray:
    """``Φ⁻¹(u(k))``, ``u(k) = frac(½ + h(k)·2⁻⁶⁴)`` with ``h(k) = mix(k) ⊕ mix(0)`` (a bijection, ``h(0) = 0``).

    Distinct ``k`` give distinct, pseudo-random ``u`` (no lattice structure among neighbouring
    ``k``), so the result is standard normal; ``k = 0`` gives exactly 0. ``k`` is a uint64 array.
    """
    h = _mix(k) ^ _mix(np.zeros_like(k))
    u = np.mod(0.5 + (h >> np.uint64(11)).astype(np.float64) * 2.0**-53, 1.0)
    # u = 0 → −inf (scipy.special reports no warning), clipped by the caller; float64 in, float64 out.
    result: FloatArray = ndtri(u)
    return result


def _unit_interval(draw: Any) -> float:
    """An equidistributed draw in ``[0, 1)``, ``frac(k·φ)``, shrinking to 0 (``k = 0``).

    (Hypothesis floats in ``[0, 1]`` put much of their mass on the end points.)
    """
    return float(np.mod(_PHI * float(draw(st.integers(0, _K_MAX))), 1.0))


@st.composite
def gaussian_arrays(draw: Any, shape: tuple[int, ...], bound: float = 8.0) -> FloatArray:
    """A standard-normal array of ``shape`` (clipped to ``±bound``) from Hypothesis integers.

    Entry ``e`` (C order, ``N`` entries) is ``Φ⁻¹(frac(½ + k_e·φ))`` with ``k_e = e + N·m_e`` and
    ``m_e ≥ 0`` a Hypothesis integer: the ``k_e`` are distinct by construction (distinct residues
    mod ``N``), so no two entries are equal (except through the clip) and nothing is filtered;
    failures shrink to ``m = 0``, the fixed reference array ``k_e = e`` (its first entry 0).
    """
    size = int(np.prod(shape, dtype=np.int64))
    m = draw(st.lists(st.integers(0, _K_MAX // max(size, 1)), min_size=size, max_size=size))
    k = np.arange(size, dtype=np.uint64) + np.uint64(size) * np.array(m, dtype=np.uint64)
    return np.clip(_gauss_of(k), -bound, bound).reshape(shape)


@st.composite
def shapes(
    draw: Any,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 5),
    generic_feasible: bool = False,
    *,
    below_n: bool = False,
) -> tuple[int, int, int]:
    """A shape ``(n, T, d)`` with sizes in the given inclusive ranges.

    ``generic_feasible=True`` raises ``d`` to at least ``max(n, T − 1)``, the size at which
    generic data makes every Att-SVM(α) feasible (the upper bound of ``d`` is raised too
    when needed). With ``below_n=True`` it raises ``d`` only to ``T − 1`` (affinely
    independent tokens), so ``d < n`` is drawn too: there the queries are dependent and
    Att-SVM(α) may be infeasible, and a property must assert the claim's true condition
    (feasibility decided by the solver) rather than assume it.
    """
    n_lo, n_hi = _check_range("n", n, 1)
    T_lo, T_hi = _check_range("T", T, 2)
    d_lo, d_hi = _check_range("d", d, 1)
    nn = draw(st.integers(n_lo, n_hi))
    TT = draw(st.integers(T_lo, T_hi))
    if generic_feasible:
        need = TT - 1 if below_n else max(nn, TT - 1)
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


def _make_ties(draw: Any, X: FloatArray, duplicates: bool, near_parallel: bool) -> None:
    """In place: exact copies and near-parallel pairs of tokens, per sequence, each a shrinkable draw.

    Self-attention keeps token 0 (the query) as drawn; it may be the *source* of a copy.
    """
    n, T, d = X.shape
    for i in range(n):
        for t in range(1, T):
            # Each later token may copy an earlier one exactly, or sit δ away from it along e_k.
            if duplicates and draw(st.booleans()):
                X[i, t] = X[i, draw(st.integers(0, t - 1))]
            elif near_parallel and draw(st.booleans()):
                u = draw(st.integers(0, t - 1))
                lo, hi = NEAR_PARALLEL_LOG10
                # w = 0 (the shrink target) is the moderate end, δ = 10^hi.
                delta = 10.0 ** (hi - (hi - lo) * _unit_interval(draw))
                k = draw(st.integers(0, d - 1))
                X[i, t] = X[i, u]
                X[i, t, k] += delta


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
    *,
    duplicates: bool = False,
    near_parallel: bool = False,
) -> Instance:
    """General instances (no feasibility or uniqueness guarantee).

    Args:
      n, T, d: inclusive size ranges (ignored when ``shape`` is given).
      family: ``"gaussian"`` (standard normal from :func:`gaussian_arrays`, clipped to
        ``±bound``; generic: no equal entries), ``"unit"`` (Gaussian rows of ``X``, ``z`` and
        ``v`` scaled to unit length) or ``"uniform"`` (every entry a Hypothesis float in
        ``[−bound, bound]``: shrinks well, and covers zeros, repeated tokens and ties).
      attention: ``"self"`` (``z = first token``), ``"cross"`` (``z`` drawn) or ``"either"``.
      bound: largest magnitude of any entry.
      shape: a fixed ``(n, T, d)``.
      duplicates: let tokens be exact copies of earlier tokens of their sequence (equal logits
        and values for every ``W``: exact ties); each copy is a draw that shrinks to "no copy".
      near_parallel: let tokens be ``x_iu = x_it + δ e_k`` (``t < u``) with ``log10 δ`` drawn in
        ``NEAR_PARALLEL_LOG10 = [−15, −1]`` (shrinking to ``δ = 0.1``); at ``δ`` below the
        rounding of ``x_it`` the pair is an exact copy. Applied before ``"unit"`` scaling.

    Returns:
      An :class:`attnsvm.Instance`, entries finite with ``|entry| ≤ bound`` (``+ 0.1`` with
      ``near_parallel``).
    """
    if family not in INSTANCE_FAMILIES:
        raise unknown_name("instance family", family, INSTANCE_FAMILIES)
    self_attn = _self_or_cross(draw, attention)
    nn, TT, dd = shape if shape is not None else draw(shapes(n, T, d))
    z: FloatArray | None
    if family == "uniform":
        el = bounded_floats(bound)
        X = np.array(draw(hnp.arrays(np.float64, (nn, TT, dd), elements=el)), dtype=np.float64)
        v = draw(hnp.arrays(np.float64, (dd,), elements=el))
        z = None if self_attn else draw(hnp.arrays(np.float64, (nn, dd), elements=el))
        _make_ties(draw, X, duplicates, near_parallel)
    else:
        # One draw of distinct integers for X, z and v together: no equal entries across them.
        sizes = (nn * TT * dd, nn * dd, dd)
        g = draw(gaussian_arrays((sum(sizes),), bound))
        X = g[: sizes[0]].reshape(nn, TT, dd).copy()
        zg = g[sizes[0] : sizes[0] + sizes[1]].reshape(nn, dd)
        v = g[sizes[0] + sizes[1] :]
        _make_ties(draw, X, duplicates, near_parallel)
        if family == "unit":
            X, zg, v = _unit_rows(X), _unit_rows(zg), _unit_rows(v[None])[0]
        z = None if self_attn else zg
    return Instance(X, _labels(draw, nn), v, z)  # type: ignore[arg-type]  # z=None: self-attention


def _orthonormal(draw: Any, d: int) -> FloatArray:
    """A ``d × d`` orthogonal matrix: QR of a Hypothesis-drawn Gaussian matrix, signs fixed.

    Householder QR returns an orthogonal ``Q`` for *any* matrix (even a singular one), so the
    result is orthogonal whatever the draw; a generic draw makes it a random rotation.
    """
    q, r = np.linalg.qr(draw(gaussian_arrays((d, d))))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _float_array(draw: Any, size: int, lo: float, hi: float) -> FloatArray:
    """``size`` Hypothesis floats in ``[lo, hi]`` (shrinking to simple values)."""
    return np.array(draw(st.lists(st.floats(lo, hi), min_size=size, max_size=size)), dtype=np.float64)


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
    guarantees (independent queries, affinely independent tokens in every sequence). Every
    random quantity (basis, scores, radii, offsets, query scales) is a Hypothesis draw.

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
    Y = _labels(draw, nn)
    c = draw(st.floats(0.5, 2.0)) * draw(st.sampled_from([1.0, -1.0]))
    opt = draw(hnp.arrays(np.intp, (nn,), elements=st.integers(0, TT - 1)))
    gaps = draw(hnp.arrays(np.float64, (nn,), elements=st.floats(min_gap, min_gap + 1.0)))
    basis = _orthonormal(draw, dd)  # columns e_0 … e_{d−1}
    e0 = basis[:, 0]
    X = np.empty((nn, TT, dd))
    for i in range(nn):
        # Desired scores: the non-optimal ones in [−1, 1], the optimal one `gap` above their max.
        if equal_nonoptimal_scores:
            gam = np.full(TT, draw(st.floats(-1.0, 1.0)))
        else:
            gam = _float_array(draw, TT, -1.0, 1.0)
        gam[opt[i]] = np.max(np.delete(gam, opt[i])) + gaps[i]
        g = gam / (Y[i] * c)  # γ_it = Y_i vᵀx_it = Y_i c g_it
        r = _float_array(draw, TT, 0.5, 2.0)
        if self_attn:
            # p_i0 = e_{1+i} reserved to sequence i; p_it (t ≥ 1) orthonormal in span(e_{1+n} …).
            rest = basis[:, 1 + nn :]
            rot = _orthonormal(draw, rest.shape[1])[:, : TT - 1]
            P = np.concatenate([basis[:, 1 + i : 2 + i], rest @ rot], axis=1)
            offset = draw(st.floats(-1.0, 1.0)) * e0  # along e_0 only: keeps z_i = x_i0 independent
        else:
            rest = basis[:, 1:]
            P = rest @ _orthonormal(draw, rest.shape[1])[:, :TT]
            # Offset orthogonal to the tokens' own directions: shifts every token alike.
            m = draw(gaussian_arrays((dd,)))
            offset = m - P @ (P.T @ m) - e0 * (e0 @ m)
        X[i] = g[:, None] * e0[None, :] + (r[None, :] * P).T + offset[None, :]
    v = c * e0
    if self_attn:
        return Instance(X, Y, v)
    Q = _orthonormal(draw, dd)[:, :nn]
    s = _float_array(draw, nn, 0.5, 2.0)
    return Instance(X, Y, v, (Q * s[None, :]).T)


@st.composite
def token_choices(draw: Any, inst: Instance) -> NDArray[np.intp]:
    """A token choice α for ``inst``: one index in ``[0, T)`` per sequence, shape ``(n,)``."""
    require_unmasked(inst, "attnsvm.strategies.token_choices")
    return np.array(draw(hnp.arrays(np.intp, (inst.n,), elements=st.integers(0, inst.T - 1))), dtype=np.intp)


@st.composite
def instances_and_alphas(draw: Any, base: st.SearchStrategy[Instance] | None = None) -> tuple[Instance, Any]:
    """Pairs ``(inst, α)`` with α a :func:`token_choices` draw (default base: :func:`feasible_instances`)."""
    inst = draw(base if base is not None else feasible_instances())
    return inst, draw(token_choices(inst))


@st.composite
def directions(draw: Any, d: int) -> FloatArray:
    """A ``(d, d)`` matrix of unit Frobenius norm: a :func:`gaussian_arrays` matrix, normalised.

    (The only all-zero Gaussian draw is ``d = 1`` with ``k = 0``; it gives ``[[1]]``.)
    """
    U = draw(gaussian_arrays((d, d)))
    norm = float(np.linalg.norm(U))
    if norm == 0.0:
        return np.ones((d, d)) / d
    return U / norm


@st.composite
def weight_matrices(draw: Any, d: int, scale: tuple[float, float] = (1e-2, 1e2)) -> FloatArray:
    """``W = s · U``: ``U`` from :func:`directions`, ``s`` log-uniform in ``scale``, so ``||W||_F = s``.

    ``scale=(1e-2, 1)`` gives moderate weights; ``(1e2, 1e3)`` saturated ones (logits of
    unit-size data differ by tens to hundreds, so the softmax is one-hot to
    ``e^{−10}``–``e^{−100}`` or beyond). To state saturation by the weights themselves, use
    :func:`saturated_weights`.
    """
    lo, hi = scale
    if not (0 < lo <= hi and np.isfinite(hi)):
        raise InvalidInstanceError(f"scale must be a range (lo, hi) with 0 < lo ≤ hi < inf; got {scale!r}")
    e = draw(st.floats(np.log10(lo), np.log10(hi))) if hi > lo else np.log10(lo)
    return float(10.0**e) * draw(directions(d))


def _log_runner_up_at(c: float, l: FloatArray) -> float:
    """``log`` of the largest non-top softmax weight of logits ``c·l`` (``l`` sorted descending)."""
    cl = c * l
    m = cl[0]
    return float(cl[1] - (m + np.log(np.sum(np.exp(cl - m)))))


def log_runner_up_weight(inst: Instance, W: Any) -> float:
    """``log`` of the runner-up weight of :func:`saturated_weights`: in the sequence whose top two
    logits of ``W`` are furthest apart, the log of the largest weight other than the top one.

    Computed in log form (log-sum-exp), so it is exact far below the float64 range.
    """
    require_unmasked(inst, "attnsvm.strategies.log_runner_up_weight")
    L = np.einsum("ntk,kj,nj->nt", inst.X, np.asarray(W, dtype=np.float64), inst.z)
    Ls = -np.sort(-L, axis=1)
    i = int(np.argmax(Ls[:, 0] - Ls[:, 1]))
    return _log_runner_up_at(1.0, Ls[i])


def _check_log_range(name: str, lo: float, hi: float, top: float) -> None:
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi < top):
        raise InvalidInstanceError(
            f"{name} must be a range (lo, hi) with lo ≤ hi < {top:g} (a runner-up weight is below ½)"
        )


@st.composite
def saturated_weights(
    draw: Any,
    inst: Instance,
    *,
    runner_up: tuple[float, float] | None = None,
    log_runner_up: tuple[float, float] | None = None,
) -> FloatArray:
    """``W = c·U`` whose runner-up attention weight is a log-uniform draw ``ρ``.

    ``U`` is a :func:`directions` draw. In the sequence ``i*`` whose two largest logits of
    ``U`` are furthest apart (gap ``g``: the most saturated sequence at large ``c``), the
    largest non-top weight is ``ρ(c) = exp(c·l_2 − LSE(c·l_i*))``, which decreases from
    ``1/T``-ish at ``c = 0`` to 0; ``c`` is solved by bisection on ``[0, −log ρ / g]``
    (``ρ(c) ≤ e^{−c g}``) to ``|log ρ(c) − log ρ| ≤ 1e-9·|log ρ|``, before the rounding of
    ``W = c·U``. See :func:`log_runner_up_weight` for the value actually reached.

    Args:
      inst: the instance (its logits define the gaps).
      runner_up: range ``(lo, hi)`` of ``ρ`` (``0 < lo ≤ hi < ½``), e.g. ``(1e-300, 1e-1)``.
      log_runner_up: range of ``log ρ`` instead, for weights below the float64 range (e.g.
        ``(−1e5, −2)``); exactly one of the two must be given.

    The draw shrinks towards the moderate end (``hi``). Limits: when ``ρ`` is above the
    runner-up weight at ``W = 0`` the result is ``W = 0``; when ``U`` gives every sequence tied
    top logits (no saturation is possible along ``U``) ``W = U``; ``c`` is capped so that every
    logit magnitude ``Σ_kj |x_k W_kj z_j|`` stays ≤ ``LOGIT_CAP = 1e300`` (then ``ρ`` is not
    reached).
    """
    require_unmasked(inst, "attnsvm.strategies.saturated_weights")
    if (runner_up is None) == (log_runner_up is None):
        raise InvalidInstanceError("give exactly one of runner_up=(lo, hi) and log_runner_up=(lo, hi)")
    if runner_up is not None:
        lo, hi = runner_up
        if not (0 < lo <= hi < 0.5):
            raise InvalidInstanceError(
                f"runner_up must be a range (lo, hi) with 0 < lo ≤ hi < ½; got {runner_up!r}"
            )
        llo, lhi = math.log(lo), math.log(hi)
    else:
        assert log_runner_up is not None
        llo, lhi = float(log_runner_up[0]), float(log_runner_up[1])
        _check_log_range("log_runner_up", llo, lhi, math.log(0.5))
    # w = 0 is the shrink target: the moderate end.
    target = lhi - (lhi - llo) * _unit_interval(draw)
    U = draw(directions(inst.d))
    L = np.einsum("ntk,kj,nj->nt", inst.X, U, inst.z)
    Ls = -np.sort(-L, axis=1)
    gaps = Ls[:, 0] - Ls[:, 1]
    i = int(np.argmax(gaps))
    g = float(gaps[i])
    if not g > 0:
        return U
    lam = float(np.max(np.einsum("ntk,kj,nj->nt", np.abs(inst.X), np.abs(U), np.abs(inst.z))))
    c_cap = min(LOGIT_CAP / lam if lam > 0 else LOGIT_CAP, LOGIT_CAP)
    if _log_runner_up_at(0.0, Ls[i]) <= target:
        return np.zeros_like(U)
    lo_c, hi_c = 0.0, min(-target / g, c_cap)
    if _log_runner_up_at(hi_c, Ls[i]) > target:  # capped: the most saturated W allowed
        return hi_c * U
    for _ in range(200):  # bisection: log ρ(c) is decreasing in c
        mid = 0.5 * (lo_c + hi_c)
        if _log_runner_up_at(mid, Ls[i]) > target:
            lo_c = mid
        else:
            hi_c = mid
        if hi_c - lo_c <= 1e-12 * hi_c:
            break
    return hi_c * U


@st.composite
def instances_and_weights(
    draw: Any,
    base: st.SearchStrategy[Instance] | None = None,
    scale: tuple[float, float] = (1e-2, 1e2),
    *,
    runner_up: tuple[float, float] | None = None,
    log_runner_up: tuple[float, float] | None = None,
) -> tuple[Instance, FloatArray]:
    """Pairs ``(inst, W)``: ``W`` a :func:`weight_matrices` draw of the instance's ``d``, or, with
    ``runner_up``/``log_runner_up``, a :func:`saturated_weights` draw (``scale`` is then unused)."""
    inst = draw(base if base is not None else instances())
    if runner_up is not None or log_runner_up is not None:
        return inst, draw(saturated_weights(inst, runner_up=runner_up, log_runner_up=log_runner_up))
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
    require_unmasked(inst, "attnsvm.strategies.scaled")
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
