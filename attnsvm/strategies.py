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

Token masks and sequence-to-sequence instances (:attr:`attnsvm.Instance.mask`,
:meth:`attnsvm.Instance.from_sequences`):

* :func:`token_masks` — boolean ``(n, T)`` masks with ≥ 1 allowed token per row, shrinking to
  all-True (no mask); rows are unmasked, random subsets, or a single allowed token; ``padding=True``
  gives right-padding (prefix) masks.
* :func:`instance_masks` — masks aimed at an instance's hard cases (:data:`MASK_TARGETS`): its score
  maximiser, runner-up, a tied or copied token, its largest token, the query token.
* ``masked=True`` on :func:`instances` and :func:`feasible_instances` adds such a mask (its draws are
  made only then, so ``masked=False`` draws are unchanged); :func:`feasible_instances` keeps its optimal
  tokens allowed, which keeps its feasibility and uniqueness guarantee exactly.
* :func:`instance_kind` names what a property drew (plain, masked, seq2seq, causal, padded), for
  ``hypothesis.event``.
* :func:`sequence_instances` — :meth:`~attnsvm.Instance.from_sequences` instances, causal or not,
  optionally with right padding.

:func:`token_choices`, :func:`saturated_weights`, :func:`log_runner_up_weight` and :func:`scaled`
honour a mask (allowed tokens only; the runner-up among allowed tokens).

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
from ._types import FloatArray
from ._validation import check_int, check_positive

require("hypothesis", feature="attnsvm.strategies (the Hypothesis strategies)")  # pragma: no mutate

import math
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray
from scipy.special import ndtri

from .errors import InvalidInstanceError, unknown_name
from .model._instance import Instance

__all__ = [
    "INSTANCE_FAMILIES",
    "ATTENTION_KINDS",
    "bounded_floats",
    "seeds",
    "gaussian_arrays",
    "shapes",
    "instances",
    "feasible_instances",
    "MASK_TARGETS",
    "token_masks",
    "instance_masks",
    "sequence_instances",
    "instance_kind",
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
    check_positive(bound, "bound", error=InvalidInstanceError)
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
def gaussian_arrays(draw: Any, shape: tuple[int, ...], *, bound: float = 8.0) -> FloatArray:
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
    *,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 5),
    generic_feasible: bool = False,
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
    *,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 5),
    family: str = "gaussian",
    attention: str = "either",
    bound: float = 4.0,
    shape: tuple[int, int, int] | None = None,
    duplicates: bool = False,
    near_parallel: bool = False,
    masked: bool = False,
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
      masked: add a token mask, as :func:`instance_masks` draws it (its row kinds drawn right after the
        shape, the rest after the data); ``masked=False`` draws exactly what it drew before masks
        existed. It shrinks to no mask.

    Returns:
      An :class:`attnsvm.Instance`, entries finite with ``|entry| ≤ bound`` (``+ 0.1`` with
      ``near_parallel``).
    """
    if family not in INSTANCE_FAMILIES:
        raise unknown_name("instance family", family, INSTANCE_FAMILIES)
    self_attn = _self_or_cross(draw, attention)
    nn, TT, dd = shape if shape is not None else draw(shapes(n=n, T=T, d=d))
    kinds = _row_kinds(draw, nn) if masked else None
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
        g = draw(gaussian_arrays((sum(sizes),), bound=bound))
        X = g[: sizes[0]].reshape(nn, TT, dd).copy()
        zg = g[sizes[0] : sizes[0] + sizes[1]].reshape(nn, dd)
        v = g[sizes[0] + sizes[1] :]
        _make_ties(draw, X, duplicates, near_parallel)
        if family == "unit":
            X, zg, v = _unit_rows(X), _unit_rows(zg), _unit_rows(v[None])[0]
        z = None if self_attn else zg
    inst = Instance(X, _labels(draw, nn), v, z)  # type: ignore[arg-type]  # z=None: self-attention
    if not masked:
        return inst
    return _with_mask(inst, _instance_mask(draw, inst, None, kinds))


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
    *,
    n: _SizeRange = (1, 3),
    T: _SizeRange = (2, 4),
    extra_d: _SizeRange = (0, 1),
    attention: str = "either",
    min_gap: float = 0.1,
    equal_nonoptimal_scores: bool = False,
    masked: bool = False,
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
      masked: add a token mask (as :func:`instance_masks` with ``keep`` = the optimal tokens draws it;
        ``masked=False`` draws are unchanged; it shrinks to no mask). The guarantee is kept
        exactly: masking removes tokens other than ``opt_i``, and a subset of affinely independent
        tokens is affinely independent (the remaining differences ``x_iα − x_it`` are a subset of
        linearly independent vectors), the queries are unchanged (also a masked query token,
        ``z_i = x_i0``, stays the query), and the best score still leads every remaining one by
        at least ``min_gap``. So every Att-SVM(α) over the allowed tokens is feasible and
        ``optimal_tokens()`` is the constructed ``opt``. (A mask that leaves every sequence one token
        leaves Att-SVM without a constraint, which ``solve_svm`` refuses: ``W_mm = 0``.)

    Returns:
      An :class:`attnsvm.Instance` whose ``optimal_tokens()`` never raises.
    """
    check_positive(min_gap, "min_gap", error=InvalidInstanceError)
    self_attn = _self_or_cross(draw, attention)
    nn = draw(st.integers(*_check_range("n", n, 1)))
    TT = draw(st.integers(*_check_range("T", T, 2)))
    kinds = _row_kinds(draw, nn) if masked else None
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
        inst = Instance(X, Y, v)
    else:
        Q = _orthonormal(draw, dd)[:, :nn]
        s = _float_array(draw, nn, 0.5, 2.0)
        inst = Instance(X, Y, v, (Q * s[None, :]).T)
    if not masked:
        return inst
    return _with_mask(inst, _instance_mask(draw, inst, opt.astype(np.intp), kinds))


# ---------------------------------------------------------------- token masks
#: The instance-dependent hard cases of :func:`instance_masks`: which token of a sequence is masked on
#: purpose. ``"top score"``: the score maximiser ``argmax_t Y_i vᵀx_it`` (the optimal token moves);
#: ``"runner-up score"``: the second best (the score gap widens); ``"tie partner"``: one token of a pair
#: that ties in score (to the tie level of :meth:`attnsvm.Instance.optimal_tokens`) or is an exact copy
#: (masking it resolves the tie); ``"largest norm"``: the token of largest ``||x_it||`` (it sets the scale of
#: the sequence); ``"query"``: token 0 of a self-attention instance (its query ``z_i = x_i0``, which stays
#: the query: a query need not be a key).
MASK_TARGETS = ("top score", "runner-up score", "tie partner", "largest norm", "query")
#: The structural row kinds of :func:`token_masks` (``"all"``, the shrink target, masks nothing).
_ROW_KINDS = ("all", "random", "single")
#: A score tie as :meth:`attnsvm.Instance.optimal_tokens` defines it: within 64 eps of ``Σ_k|v_k x_itk|``.
_TIE_RTOL = 64 * float(np.finfo(np.float64).eps)


def _with_mask(inst: Instance, mask: NDArray[np.bool_]) -> Instance:
    """``inst`` with ``mask`` (an all-True mask gives the unmasked instance, ``mask = None``)."""
    z = None if inst.self_attention else inst.z
    return Instance(inst.X, inst.Y, inst.v, z, mask=mask)  # type: ignore[arg-type]  # z=None: self-attention


def _check_keep(keep: Any, n: int, T: int) -> NDArray[np.intp] | None:
    if keep is None:
        return None
    arr = np.asarray(keep)
    if arr.shape != (n,) or arr.dtype.kind not in "iu" or np.any((arr < 0) | (arr >= T)):
        raise InvalidInstanceError(
            f"keep must hold one token index in [0, {T - 1}] per sequence, shape ({n},); got {keep!r}"
        )
    return arr.astype(np.intp)


def _mask_row(
    draw: Any, T: int, keep_t: int | None, targets: dict[str, int], kind: str | None = None
) -> NDArray[np.bool_]:
    """One row of a mask: a drawn kind (``"all"`` first, so rows shrink to nothing masked), ≥ 1 token
    allowed, ``keep_t`` (when given) always allowed, a target token (``targets``) always masked; every kind
    but ``"all"`` masks at least one token. A ``kind`` drawn beforehand is used instead (a target the row
    does not have becomes ``"random"``)."""
    if kind is None:
        kind = draw(st.sampled_from(_ROW_KINDS + tuple(targets)))
    elif kind not in _ROW_KINDS and kind not in targets:
        kind = "random"
    row = np.ones(T, dtype=bool)
    if kind == "all":
        return row
    if kind == "single":
        k = keep_t if keep_t is not None else int(draw(st.integers(0, T - 1)))
        row[:] = False
        row[k] = True
        return row
    # "random" or a target: every token may be dropped (each a draw shrinking to "kept")
    row = ~np.array(draw(st.lists(st.booleans(), min_size=T, max_size=T)), dtype=bool)
    masked = targets.get(kind)
    if masked is not None:
        row[masked] = False
    if keep_t is not None:
        row[keep_t] = True
    elif not row.any():
        others = [t for t in range(T) if t != masked]
        row[int(draw(st.sampled_from(others)))] = True
    if row.all():  # "random" masks at least one token (only "all" leaves the row whole)
        row[int(draw(st.sampled_from([t for t in range(T) if t != keep_t])))] = False
    return row


@st.composite
def token_masks(draw: Any, n: int, T: int, *, keep: Any = None, padding: bool = False) -> NDArray[np.bool_]:
    """Boolean ``(n, T)`` token masks (``True`` = the token takes part) with ≥ 1 allowed token per row.

    Each row is one of: nothing masked (the shrink target, so a failure shrinks to fewer masked
    rows), a random subset (each token a draw that shrinks to "kept"), or a single allowed token
    (the hard case: no Att-SVM constraint, weight exactly 1). For masks aimed at an instance's
    own hard cases (its score maximiser, a tie partner, the largest token) use
    :func:`instance_masks`.

    Args:
      n, T: the shape.
      keep: optional ``(n,)`` token indices that stay allowed (e.g. a token choice α).
      padding: right-padding masks instead: row ``i`` allows a prefix ``t < L_i``, ``L_i`` drawn in
        ``[1, T]`` (shrinking to ``T``); with ``keep`` the prefix covers ``keep_i``.
    """
    for name, val, low in (("n", n, 1), ("T", T, 2)):
        check_int(val, name, low=low, error=InvalidInstanceError)
    kp = _check_keep(keep, n, T)
    mask = np.ones((n, T), dtype=bool)
    for i in range(n):
        if padding:
            lo = 1 if kp is None else int(kp[i]) + 1
            mask[i, T - int(draw(st.integers(0, T - lo))) :] = False
        else:
            mask[i] = _mask_row(draw, T, None if kp is None else int(kp[i]), {})
    return mask


def _mask_targets(inst: Instance, i: int, keep_t: int | None) -> dict[str, int]:
    """The hard-case tokens of sequence ``i`` (:data:`MASK_TARGETS`), other than ``keep_t``."""
    x = np.asarray(inst.X[i])
    with np.errstate(all="ignore"):  # any finite data: an overflowing score or norm only picks an index
        gam = np.nan_to_num(inst.Y[i] * (x @ inst.v))
        level = np.nan_to_num(np.abs(x) @ np.abs(inst.v))
        m = np.max(np.abs(x), axis=1)  # ||x_t|| = m·||x_t/m||: no overflow of the squares
        norms = m * np.linalg.norm(x / np.where(m > 0, m, 1.0)[:, None], axis=1)
    order = np.argsort(-gam, kind="stable")
    found = {
        "top score": int(order[0]),
        "runner-up score": int(order[1]),
        "largest norm": int(np.argmax(norms)),
    }
    tol = _TIE_RTOL * float(np.max(level))
    T = inst.T
    for t in range(1, T):  # the later token of the first tied (or copied) pair
        if any(abs(gam[t] - gam[u]) <= tol or np.array_equal(x[t], x[u]) for u in range(t)):
            partner = next(u for u in range(t) if abs(gam[t] - gam[u]) <= tol or np.array_equal(x[t], x[u]))
            found["tie partner"] = t if t != keep_t else partner
            break
    if inst.self_attention:
        found["query"] = 0
    return {k: found[k] for k in MASK_TARGETS if k in found and found[k] != keep_t}


@st.composite
def instance_masks(draw: Any, inst: Instance, *, keep: Any = None) -> NDArray[np.bool_]:
    """Token masks for ``inst`` that reach its hard cases on purpose.

    As :func:`token_masks` (rows shrink to nothing masked; random subsets; a single allowed token),
    and, per row, masks aimed at the sequence's own tokens (:data:`MASK_TARGETS`): its score
    maximiser, its runner-up, one token of a tied or copied pair, its largest token, or (self-attention)
    the query token ``x_i0``. The aimed token is masked, the other tokens are random draws, and at least
    one token stays allowed. ``inst``'s own mask is ignored (the result replaces it).

    Args:
      inst: the instance (its scores and tokens define the targets).
      keep: optional ``(n,)`` token indices that stay allowed (never a target), e.g. the optimal tokens
        of :func:`feasible_instances`, which keeps its feasibility guarantee under such masks.
    """
    return _instance_mask(draw, inst, _check_keep(keep, inst.n, inst.T), None)


def _row_kinds(draw: Any, n: int) -> list[str]:
    """Row kinds drawn up front by ``masked=True`` (before the data: draws made last are more often the
    simplest ones, which would leave most masks all-True)."""
    return list(draw(st.lists(st.sampled_from(_ROW_KINDS + MASK_TARGETS), min_size=n, max_size=n)))


def _instance_mask(
    draw: Any, inst: Instance, kp: NDArray[np.intp] | None, kinds: list[str] | None
) -> NDArray[np.bool_]:
    mask = np.ones((inst.n, inst.T), dtype=bool)
    for i in range(inst.n):
        keep_t = None if kp is None else int(kp[i])
        kind = None if kinds is None else kinds[i]
        mask[i] = _mask_row(draw, inst.T, keep_t, _mask_targets(inst, i, keep_t), kind)
    return mask


@st.composite
def sequence_instances(
    draw: Any,
    *,
    n: _SizeRange = (1, 2),
    T: _SizeRange = (2, 4),
    d: _SizeRange = (1, 4),
    family: str = "gaussian",
    bound: float = 4.0,
    causal: bool | None = None,
    padding: bool = False,
    duplicates: bool = False,
    near_parallel: bool = False,
) -> Instance:
    """Sequence-to-sequence instances, :meth:`attnsvm.Instance.from_sequences` (``n·T`` queries).

    ``X`` and ``v`` are those of an :func:`instances` draw (``family``, ``bound``, ``duplicates``,
    ``near_parallel`` as there); the labels ``Y`` are ``(n, T)`` draws of ±1. Query ``(i, k)`` is row
    ``i·T + k``: tokens ``X_i``, query ``x_ik``, mask ``t ≤ k`` when causal.

    Args:
      n, T, d: inclusive size ranges (the instance has ``n·T`` rows: keep them small).
      causal: ``True``/``False``, or ``None`` (default) to draw it (shrinking to non-causal).
      padding: also mask right padding: sequence ``i`` has ``L_i`` real tokens (``L_i`` drawn in
        ``[1, T]``, shrinking to ``T``), and every query of it attends to ``t < L_i`` only (and
        ``t ≤ k`` when causal; ``t = 0`` is always allowed). The padded positions stay queries.
    """
    base = draw(
        instances(
            n=n,
            T=T,
            d=d,
            family=family,
            attention="self",
            bound=bound,
            duplicates=duplicates,
            near_parallel=near_parallel,
        )
    )
    nn, TT = base.n, base.T
    Y = _labels(draw, nn * TT).reshape(nn, TT)
    c = bool(draw(st.booleans())) if causal is None else bool(causal)
    inst = Instance.from_sequences(base.X, Y, base.v, causal=c)
    if not padding:
        return inst
    lengths = [TT - int(draw(st.integers(0, TT - 1))) for _ in range(nn)]
    pad = np.repeat(np.arange(TT)[None, :] < np.array(lengths)[:, None], TT, axis=0)  # row i·T + k: t < L_i
    return _with_mask(inst, inst.allowed & pad)


def instance_kind(inst: Instance) -> str:
    """What kind of instance ``inst`` is, for ``hypothesis.event`` (counting the kinds a property drew).

    ``"plain"`` (no mask), ``"masked"`` (a mask on a one-query-per-sequence instance), or, for an
    instance of :meth:`~attnsvm.Instance.from_sequences` shape (``n = m·T`` rows, row ``i·T + k`` holding
    the tokens ``X_i`` and the query ``x_ik``, recognised from the data), ``"seq2seq"``, ``"seq2seq causal"``
    (every row's mask within ``t ≤ k``), with ``" padded"`` appended when the mask masks more than that.
    A ``" (single token)"`` suffix says that some row has exactly one allowed token.
    """
    n, T, d = inst.shape
    single = " (single token)" if inst.mask is not None and np.any(inst.mask.sum(axis=1) == 1) else ""
    seq = False
    if not inst.self_attention and n % T == 0:
        blocks = inst.X.reshape(n // T, T, T, d)
        seq = bool(np.array_equal(blocks, np.broadcast_to(blocks[:, :1], blocks.shape))) and bool(
            np.array_equal(inst.z.reshape(n // T, T, d), blocks[:, 0])
        )
    if not seq:
        return ("plain" if inst.mask is None else "masked") + single
    if inst.mask is None:
        return "seq2seq"
    tril = np.tril(np.ones((T, T), dtype=bool))
    m = inst.mask.reshape(n // T, T, T)
    causal = not np.any(m & ~tril)
    padded = not np.array_equal(m, np.broadcast_to(tril if causal else np.ones((T, T), dtype=bool), m.shape))
    return "seq2seq" + (" causal" if causal else "") + (" padded" if padded else "") + single


@st.composite
def token_choices(draw: Any, inst: Instance) -> NDArray[np.intp]:
    """A token choice α for ``inst``: one index in ``[0, T)`` per sequence, shape ``(n,)``.

    With a token mask (:attr:`attnsvm.Instance.mask`) each index is one of the sequence's allowed tokens
    (a draw from them, shrinking to the first allowed one).
    """
    if inst.mask is None:
        return np.array(
            draw(hnp.arrays(np.intp, (inst.n,), elements=st.integers(0, inst.T - 1))), dtype=np.intp
        )
    return np.array([draw(st.sampled_from(np.flatnonzero(row).tolist())) for row in inst.mask], dtype=np.intp)


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
def weight_matrices(draw: Any, d: int, *, scale: tuple[float, float] = (1e-2, 1e2)) -> FloatArray:
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

    With a token mask the logits, the top two and the weights are those of the allowed tokens; a
    sequence with one allowed token has no runner-up and is skipped. When no sequence has two
    allowed tokens the result is ``−inf`` (there is no runner-up weight: every weight is 0 or 1).
    """
    L = np.einsum("ntk,kj,nj->nt", inst.keys, np.asarray(W, dtype=np.float64), inst.z)
    if inst.mask is None:
        Ls = -np.sort(-L, axis=1)
        i = int(np.argmax(Ls[:, 0] - Ls[:, 1]))
        return _log_runner_up_at(1.0, Ls[i])
    Ls, counts, gaps = _allowed_sorted(inst, L)
    if not np.any(counts >= 2):
        return -math.inf
    i = int(np.argmax(gaps))
    return _log_runner_up_at(1.0, Ls[i, : counts[i]])


def _allowed_sorted(inst: Instance, L: FloatArray) -> tuple[FloatArray, NDArray[np.intp], FloatArray]:
    """Masked logits: each row's allowed logits sorted descending (then ``−inf``), the allowed counts,
    and the top-two gaps (``−inf`` for a row with one allowed token, never chosen as the most saturated)."""
    assert inst.mask is not None
    Ls = -np.sort(-np.where(inst.mask, L, -np.inf), axis=1)
    counts = np.count_nonzero(inst.mask, axis=1)
    two = counts >= 2
    gaps = np.full(inst.n, -np.inf)
    gaps[two] = Ls[two, 0] - Ls[two, 1]  # both finite where two tokens are allowed
    return Ls, counts, gaps


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

    Token masks: the logits, gaps and weights are those of the allowed tokens (a sequence with one
    allowed token has no runner-up and is skipped); when no sequence has two allowed tokens every
    ``W`` gives the same weights, and the result is ``W = U``.
    """
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
    L = np.einsum("ntk,kj,nj->nt", inst.keys, U, inst.z)  # keys: X itself when unmasked
    if inst.mask is None:
        Ls = -np.sort(-L, axis=1)
        gaps = Ls[:, 0] - Ls[:, 1]
        i = int(np.argmax(gaps))
        row = Ls[i]
    else:
        Ls, counts, gaps = _allowed_sorted(inst, L)
        i = int(np.argmax(gaps))
        row = Ls[i, : counts[i]]  # the allowed logits only (0·(−inf) would be NaN at c = 0)
    g = float(gaps[i])
    if not g > 0:
        return U
    lam = float(np.max(np.einsum("ntk,kj,nj->nt", np.abs(inst.keys), np.abs(U), np.abs(inst.z))))
    c_cap = min(LOGIT_CAP / lam if lam > 0 else LOGIT_CAP, LOGIT_CAP)
    if _log_runner_up_at(0.0, row) <= target:
        return np.zeros_like(U)
    lo_c, hi_c = 0.0, min(-target / g, c_cap)
    if _log_runner_up_at(hi_c, row) > target:  # capped: the most saturated W allowed
        return hi_c * U
    for _ in range(200):  # bisection: log ρ(c) is decreasing in c
        mid = 0.5 * (lo_c + hi_c)
        if _log_runner_up_at(mid, row) > target:
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
    *,
    scale: tuple[float, float] = (1e-2, 1e2),
    runner_up: tuple[float, float] | None = None,
    log_runner_up: tuple[float, float] | None = None,
) -> tuple[Instance, FloatArray]:
    """Pairs ``(inst, W)``: ``W`` a :func:`weight_matrices` draw of the instance's ``d``, or, with
    ``runner_up``/``log_runner_up``, a :func:`saturated_weights` draw (``scale`` is then unused)."""
    inst = draw(base if base is not None else instances())
    if runner_up is not None or log_runner_up is not None:
        return inst, draw(saturated_weights(inst, runner_up=runner_up, log_runner_up=log_runner_up))
    return inst, draw(weight_matrices(inst.d, scale=scale))


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
    """``inst`` with ``X → 2^jx X``, ``z → 2^jz z``, ``v → 2^jv v`` (self-attention: ``jz`` must be ``jx``).

    The token mask (if any) is kept: the masked tokens are scaled with the others.
    """
    X = np.ldexp(inst.X, jx)
    v = np.ldexp(inst.v, jv)
    if inst.self_attention:
        if jz != jx:
            raise InvalidInstanceError(
                f"a self-attention instance has z = X[:, 0]: jz must equal jx; got {jz} ≠ {jx}"
            )
        return Instance(X, inst.Y, v, mask=inst.mask)
    return Instance(X, inst.Y, v, np.ldexp(inst.z, jz), mask=inst.mask)


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
