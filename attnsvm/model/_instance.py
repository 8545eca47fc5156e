"""Validated attention data: the :class:`Instance` and random instance families.

An instance holds ``n`` sequences of ``T`` tokens in ``R^d`` (``X``, shape
``(n, T, d)``), labels ``Y ∈ {-1, +1}^n``, a value head ``v ∈ R^d`` and one
query per sequence ``z`` (shape ``(n, d)``). Logits are ``l_it = x_itᵀ W z_i``.
When ``z`` is not given it is the first token, ``z_i = x_i0`` (self-attention read
at token 0) and :attr:`Instance.self_attention` is ``True``.

Token masks. ``mask`` (boolean, shape ``(n, T)``, ``True`` = the token takes part) removes tokens
from their sequence: a masked token gets attention weight exactly 0 (log weight and logit ``−inf``),
and takes no part in the optimal tokens, ties, the Att-SVM constraints, the outputs, the risk or its
gradient. The masked instance is the unmasked instance with the masked tokens deleted, sequence by
sequence (``T_i = Σ_t mask_it`` allowed tokens, ``T_i ≥ 1``; a sequence with one allowed token has no
Att-SVM constraint). :meth:`Instance.from_sequences` builds the sequence-to-sequence (every token a
query) instance, causal or not, from such masks.

Validation happens once, here; every other module trusts an ``Instance``.
The arrays are stored as read-only float64 copies, so the caller's arrays are
never modified and the instance cannot be changed behind the library's back.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (token scores, optimal
tokens); Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898 (Att-SVM data model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray
from .._validation import as_real_array, check_int
from ..errors import InvalidInstanceError, TiedScoresError, unknown_name
from ..scaling import FLOAT_TINY, range_error
from ..scaling import pow2_split as pow2_split  # re-exported: its home is attnsvm.scaling

__all__ = ["Instance", "random_instance", "FAMILIES", "TIE_RTOL", "as_real_array", "require_unmasked"]


FAMILIES = ("gaussian", "unit", "self_attention")

#: Two best scores that differ by at most ``TIE_RTOL · max_t Σ_k |v_k x_itk|`` (``≤``, so an exact
#: tie always counts) are a tie.
#: ``γ_it = Y_i vᵀx_it`` is a length-``d`` dot product whose float64 rounding error is
#: at most ``d·eps·Σ_k|v_k x_itk|`` (Higham 2002, §3.1); 64 eps covers ``d`` up to 64, and the
#: tolerance scales with the data (``X → cX`` or ``v → cv`` leaves the test unchanged). Exact ties
#: (duplicated tokens) are always flagged, which is what the check is for.
TIE_RTOL = 64 * np.finfo(np.float64).eps
#: Smallest positive (subnormal) double, ``2^−1074``: the absolute rounding error of a product
#: that underflows in the rescaled data.
_TRUE_MIN = 2.0**-1074
_LN2 = math.log(2.0)


def split_rows(a: ArrayLike, lead: int = 1) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Per-block power-of-two scaling: ``(a', e)`` with ``a = a' · 2^e`` blockwise.

    ``e`` has the shape of the first ``lead`` axes of ``a``; each block (the remaining axes) is
    divided by the power of two that brings its largest entry into ``[½, 1)`` (an all-zero block
    keeps ``e = 0``). Exact for every normal entry. Scaling each row (sequence, query, token
    difference) on its own, rather than the whole array, keeps rows of very different size
    from underflowing against the largest one.
    """
    arr = np.asarray(a, dtype=np.float64)
    axes = tuple(range(lead, arr.ndim))
    m = np.max(np.abs(arr), axis=axes, initial=0.0) if axes else np.abs(arr)
    _, e = np.frexp(np.where(m > 0, m, 1.0))
    e = np.where(m > 0, e, 0).astype(np.int64)
    return np.ldexp(arr, -e.reshape(e.shape + (1,) * len(axes))), e


#: The values are formed as products of the rescaled data (``X'_i v'``, each sequence's keys and ``v`` scaled
#: to largest entry in ``[½, 1)``) only while every product of two nonzero rescaled entries is a normal
#: double: their binary exponents (relative to the largest, from ``frexp``) sum to at least this (a product
#: ``≥ ¼·2^−1020 = 2^−1022``). The common case, bit for bit as before. Otherwise an entry of ``v'`` (or of a
#: key) fell below the normal range against the largest one (``v`` spanning more than 2^1074 was flushed to
#: 0: values 0.75 came out 0): :func:`token_values` forms each value from per-entry exponents instead.
PRODUCTS_EXACT_EXPONENT = -1020


def _products_exact(X: ArrayLike, v: ArrayLike, ex: NDArray[np.int64], ev: int) -> bool:
    """Every product ``x'_itk·v'_k`` of the rescaled data (``x' = x·2^−ex_i``, ``v' = v·2^−ev``) whose entries
    are nonzero is a normal double (:data:`PRODUCTS_EXACT_EXPONENT`), whatever was rounded in forming
    ``x'`` or ``v'``: decided on the exponents of ``X`` and ``v`` themselves."""
    Xa, va = np.asarray(X, dtype=np.float64), np.asarray(v, dtype=np.float64)
    big = np.iinfo(np.int64).max
    px = np.frexp(Xa)[1].astype(np.int64)
    lead = tuple(range(1, Xa.ndim))
    qx = np.min(np.where(Xa != 0, px, big), axis=lead, initial=big)  # per sequence
    if not np.any(qx < big) or not np.any(va != 0):
        return True  # no nonzero product
    rel_x = int(np.min(np.where(qx < big, qx - ex, 0)))
    rel_v = int(np.min(np.frexp(va[va != 0])[1])) - int(ev)
    return rel_x + rel_v >= PRODUCTS_EXACT_EXPONENT


def token_values(
    X: ArrayLike, v: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """``(a', m', e)`` per token: ``vᵀx_t = a'_t·2^e_t`` and ``Σ_k|v_k x_tk| = m'_t·2^e_t`` (shape ``X[..., 0]``).

    Each product from the exact per-entry split ``v_k = μ_k·2^p_k``, ``x_tk = ν_tk·2^q_tk`` (``frexp``,
    ``μ, ν ∈ [½, 1)``): ``v_k x_tk = (μ_k ν_tk)·2^(p_k + q_tk)`` (one rounding, as ``v_k·x_tk``, never an
    under- or overflow), the terms aligned on the token's largest, ``e_t = max_k (p_k + q_tk)``, and summed:
    ``m'_t ∈ [¼, d]`` and ``|a'_t| ≤ m'_t`` (``a' = m' = e = 0`` for a token with no nonzero term). A term
    more than 2^1074 below its token's largest is lost (≤ ``2^−1075·2^e_t`` each, below ``eps·m'_t·2^e_t``):
    each value to ``≲ d·eps·Σ_k|v_k x_tk|`` however far apart the entries of ``v`` and ``x_t`` are.
    """
    mv, pv = np.frexp(np.asarray(v, dtype=np.float64))
    mx, px = np.frexp(np.asarray(X, dtype=np.float64))
    prod = mx * mv
    pe = px.astype(np.int64) + pv.astype(np.int64)
    nz = prod != 0
    e = np.max(np.where(nz, pe, np.iinfo(np.int64).min), axis=-1, initial=np.iinfo(np.int64).min)
    e = np.where(np.any(nz, axis=-1), e, 0).astype(np.int64)
    with np.errstate(under="ignore"):
        terms = np.ldexp(prod, np.where(nz, pe - e[..., None], 0))
    return np.sum(terms, axis=-1), np.sum(np.abs(terms), axis=-1), e


def values_split_mag(
    X: ArrayLike, v: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """``(a', m', e)`` with ``vᵀx_it = a'_it·2^e_i`` and ``Σ_k|v_k x_itk| = m'_it·2^e_i``: one exponent per sequence.

    ``|a'| ≤ m' ≤ d``. Where every product of the rescaled data is normal (:func:`_products_exact`),
    ``a' = X'_i v'`` with per-sequence rescaled ``X`` and ``v`` (``e = ex_i + ev``, as always); otherwise the
    values of :func:`token_values`, aligned on each sequence's largest ``e_t``: a value more than 2^1074 below
    its sequence's largest ``Σ_k|v_k x_k|`` rounds on the subnormal grid (absolute ``≤ 2^−1075·2^e_i``).
    """
    Xs, ex = split_rows(X, 1)
    vs, ev = pow2_split(v)
    if _products_exact(X, v, ex, ev):
        return Xs @ vs, np.abs(Xs) @ np.abs(vs), ex + ev
    a, m, et = token_values(X, v)
    live = m > 0
    lead = tuple(range(1, et.ndim))
    e = np.max(np.where(live, et, np.iinfo(np.int64).min), axis=lead, initial=np.iinfo(np.int64).min)
    e = np.where(np.any(live, axis=lead), e, 0).astype(np.int64)
    shift = np.where(live, et - e.reshape(e.shape + (1,) * len(lead)), 0)
    with np.errstate(under="ignore"):
        return np.ldexp(a, shift), np.ldexp(m, shift), e


def values_split(X: ArrayLike, v: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``(a', e)`` with ``vᵀx_it = a'_it · 2^e_i``: :func:`values_split_mag` without the magnitudes.

    ``|a'| ≤ d``: no product overflows, whatever the size of ``X`` and ``v``; each sequence is
    scaled on its own, so a sequence far smaller than another keeps its digits, and each value is formed
    from per-entry exponents where the rescaled products would leave the normal range (``v`` or a key
    spanning more than float64's range), so a value loses at most ``2^−1075·2^e_i`` (its sequence's largest).
    """
    a, _, e = values_split_mag(X, v)
    return a, e


def _check_mask(mask: Any, n: int, T: int) -> NDArray[np.bool_] | None:
    """Validate a token mask: ``(n, T)``, boolean or 0/1 integers, ≥ 1 allowed token per sequence.

    Returns a read-only boolean copy, or ``None`` when every token is allowed (the unmasked instance).
    Floating-point masks are refused: an additive mask (``0`` / ``−inf``, as torch's ``attn_mask``)
    means the opposite of a 0/1 keep-mask, and a float cannot say which one it is.
    """
    try:
        arr = np.array(mask, copy=True)
    except Exception as exc:  # ragged lists and the like
        raise InvalidInstanceError(
            f"mask must be a boolean array of shape (n, T) = ({n}, {T}); could not convert it ({exc})"
        ) from exc
    if arr.dtype.kind in "iu":
        bad = np.argwhere((arr != 0) & (arr != 1))
        if bad.size:
            idx = tuple(int(b) for b in bad[0])
            raise InvalidInstanceError(
                f"mask must be boolean (or 0/1 integers, 1 = the token takes part); mask{list(idx)} = "
                f"{int(arr[idx])}. Pass mask.astype(bool) of a keep-mask"
            )
        arr = arr.astype(bool)
    elif arr.dtype.kind != "b":
        raise InvalidInstanceError(
            f"mask must be boolean (True = the token takes part) or 0/1 integers; got dtype {arr.dtype}. "
            "An additive float mask (0 / -inf) means the opposite: pass np.isfinite(additive_mask)"
        )
    if arr.shape != (n, T):
        raise InvalidInstanceError(f"mask must have shape (n, T) = ({n}, {T}) to match X; got {arr.shape}")
    empty = np.flatnonzero(~np.any(arr, axis=1))
    if empty.size:
        i = int(empty[0])
        raise InvalidInstanceError(
            f"mask masks every token of sequence {i}: each sequence must keep at least one token "
            f"(mask[{i}] needs a True entry); drop sequence {i} instead"
        )
    if np.all(arr):
        return None
    arr.setflags(write=False)
    return arr


def mask_kw(inst: "Instance") -> dict[str, Any]:
    """``{"mask": inst.mask}`` for a masked instance, ``{}`` otherwise: the keyword the array forms
    (``logits_of``, ``risk_grad_of``, ...) take, passed only when there is a mask, so that an unmasked call
    is the call it always was (``symbolic/`` substitutes array forms without the keyword)."""
    return {} if inst.mask is None else {"mask": inst.mask}


def require_unmasked(inst: "Instance", feature: str) -> None:
    """Refuse a masked instance in a function that does not support token masks yet.

    Raises :class:`InvalidInstanceError` naming ``feature``; a masked instance would otherwise be read
    as if every token took part (a silently wrong answer).
    """
    mask = getattr(inst, "mask", None)  # not an Instance: the caller's own type check reports it
    if mask is not None:
        raise InvalidInstanceError(
            f"{feature} does not support token masks yet: this instance masks "
            f"{int(np.size(mask) - np.count_nonzero(mask))} token(s). Build an instance without "
            "the masked tokens (they can be deleted when every sequence keeps the same number), or use the "
            "model functions (attention, output, risk, risk_grad, normalized_risk_grad), svm_* and solve_svm, "
            "which support masks"
        )


@dataclass(frozen=True, eq=False)
class Instance:
    """Validated data for one attention problem.

    Args:
      X: tokens, shape ``(n, T, d)``, ``n ≥ 1``, ``T ≥ 2``.
      Y: labels, shape ``(n,)``, every entry ``+1`` or ``-1``.
      v: value head, shape ``(d,)``.
      z: queries, shape ``(n, d)``; ``None`` means the first token of each sequence (also when that
        token is masked: a query need not be a key).
      mask: keyword-only, shape ``(n, T)``, boolean (or integers 0/1), ``True`` (1) where the token takes
        part; every sequence keeps at least one token. ``None`` (default): every token takes part.
        Masked tokens must still be finite numbers (pad with 0); they are ignored by every computation.

    Attributes ``X, Y, v, z`` are read-only float64 arrays (``X`` as given, masked tokens included);
    ``n, T, d`` the sizes; ``self_attention`` is ``True`` when ``z`` was taken from the first token.
    ``mask`` is ``None`` when every token takes part (also when an all-True mask was given: the
    instance is then the unmasked one, bit for bit), else a read-only boolean ``(n, T)`` array with at
    least one ``False``. :attr:`allowed` is the mask as an array in both cases.
    """

    X: FloatArray
    Y: FloatArray
    v: FloatArray
    z: FloatArray = field(default=None)  # type: ignore[arg-type]
    mask: NDArray[np.bool_] | None = field(default=None, kw_only=True)
    self_attention: bool = field(init=False)
    #: ``X`` with the masked tokens set to 0 (``X`` itself when unmasked): the keys every computation reads.
    keys: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        X = as_real_array(self.X, "X", ndim=3)
        n, T, d = X.shape
        if n == 0:
            raise InvalidInstanceError("X must hold at least one sequence (n ≥ 1); got n = 0")
        if T < 2:
            raise InvalidInstanceError(
                f"X must hold at least two tokens per sequence (T ≥ 2) for attention to select one; got T = {T}"
            )
        if d == 0:
            raise InvalidInstanceError("X must have token dimension d ≥ 1; got d = 0")
        Y = as_real_array(self.Y, "Y", ndim=1)
        if Y.shape != (n,):
            raise InvalidInstanceError(f"Y must have shape (n,) = ({n},) to match X; got {Y.shape}")
        bad = np.flatnonzero(np.abs(Y) != 1.0)
        if bad.size:
            raise InvalidInstanceError(
                f"Y must hold labels +1 or -1; Y[{bad[0]}] = {float(Y[bad[0]])!r}. Map {{0, 1}} labels with 2*y - 1."
            )
        v = as_real_array(self.v, "v", ndim=1)
        if v.shape != (d,):
            raise InvalidInstanceError(f"v must have shape (d,) = ({d},) to match X; got {v.shape}")
        if self.z is None:
            z = np.array(X[:, 0, :], copy=True)
            z.setflags(write=False)
            self_attention = True
        else:
            z = as_real_array(self.z, "z", ndim=2)
            if z.shape != (n, d):
                raise InvalidInstanceError(f"z must have shape (n, d) = ({n}, {d}) to match X; got {z.shape}")
            self_attention = False
        mask = None if self.mask is None else _check_mask(self.mask, n, T)
        if mask is None:
            keys = X
        else:
            keys = np.where(mask[:, :, None], X, 0.0)
            keys.setflags(write=False)
        object.__setattr__(self, "mask", mask)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "Y", Y)
        object.__setattr__(self, "v", v)
        object.__setattr__(self, "z", z)
        object.__setattr__(self, "self_attention", self_attention)

    # ------------------------------------------------------------------ sizes
    @property
    def n(self) -> int:
        """Number of sequences."""
        return int(self.X.shape[0])

    @property
    def T(self) -> int:
        """Tokens per sequence."""
        return int(self.X.shape[1])

    @property
    def d(self) -> int:
        """Token dimension."""
        return int(self.X.shape[2])

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n, T, d)``."""
        return (self.n, self.T, self.d)

    @property
    def allowed(self) -> NDArray[np.bool_]:
        """The token mask as a boolean ``(n, T)`` array (all ``True`` when :attr:`mask` is ``None``)."""
        return np.ones((self.n, self.T), dtype=bool) if self.mask is None else np.array(self.mask)

    def __repr__(self) -> str:
        kind = "self-attention (z = first token)" if self.self_attention else "cross-attention (z given)"
        masked = (
            ""
            if self.mask is None
            else f", {int(self.mask.size - np.count_nonzero(self.mask))} tokens masked"
        )
        return f"Instance(n={self.n}, T={self.T}, d={self.d}, {kind}{masked})"

    @classmethod
    def from_sequences(cls, X: ArrayLike, Y: ArrayLike, v: ArrayLike, *, causal: bool = False) -> "Instance":
        """The sequence-to-sequence instance: every token of every sequence is a query.

        ``X`` has shape ``(n, T, d)``, ``Y`` shape ``(n, T)`` (labels ±1, one per position). Query
        ``(i, k)`` is row ``i·T + k`` of the returned ``(n·T)``-query instance: tokens ``X_i``, query
        ``z = x_ik``, label ``Y_ik``, and mask all-True (``mask = None``), or ``t ≤ k`` when ``causal``.
        Its outputs are ``f_ik = Σ_t s_ikt vᵀx_it`` with ``s_ik = softmax_t(x_itᵀ W x_ik)`` over the allowed
        ``t``, and its risk is ``(1/(nT)) Σ_ik ℓ(Y_ik f_ik)``, the sequence-to-sequence risk.

        Memory: ``X_i`` is stored once per query, ``n·T²·d`` doubles (twice that with a causal mask,
        which also stores the zeroed keys), against ``n·T·d`` for ``X``.
        """
        if not isinstance(causal, (bool, np.bool_)):
            raise InvalidInstanceError(f"causal must be True or False; got {causal!r}")
        Xa = as_real_array(X, "X", ndim=3)
        n, T, d = Xa.shape
        Ya = as_real_array(Y, "Y", ndim=2)
        if Ya.shape != (n, T):
            raise InvalidInstanceError(
                f"Y must have shape (n, T) = ({n}, {T}) to match X (one label per position); got {Ya.shape}"
            )
        Xq = np.repeat(Xa, T, axis=0)  # row i·T + k holds X_i
        z = Xa.reshape(n * T, d)  # row i·T + k is x_ik
        mask = np.tile(np.tril(np.ones((T, T), dtype=bool)), (n, 1)) if causal else None  # t ≤ k
        return cls(Xq, Ya.reshape(n * T), as_real_array(v, "v", ndim=1), z, mask=mask)

    # ------------------------------------------------------------- token scores
    def values(self) -> FloatArray:
        """Token values ``a_it = vᵀx_it``, shape ``(n, T)``.

        Scale: any finite data; each value to absolute error ``≲ d·eps·Σ_k|v_k x_itk|``, however far apart
        the entries of ``v`` and ``x_it`` are (where the products of the rescaled data would leave the normal
        range, each value is formed from per-entry exponents, :func:`token_values`: ``v`` spanning more than
        2^1074 made values 0.75 come out 0). Raises
        :class:`~attnsvm.NumericalError` when a value exceeds 1.8e308, or when a nonzero
        ``Σ_k|v_k x_itk|`` is below 2.2e-308 (the value would lose its digits to underflow).

        Masked tokens: their entries are 0 (they are not values of the instance; :attr:`mask` says which).
        """
        Xs, ex = split_rows(self.keys, 1)
        vs, ev = pow2_split(self.v)
        if _products_exact(self.keys, self.v, ex, ev):  # every product of the rescaled data normal: as always
            a = Xs @ vs
            mag = np.abs(Xs) @ np.abs(vs)
            e = (ex + ev)[:, None]
        else:  # v or a key spans beyond the range: each value from per-entry exponents (token_values)
            a, mag, e = token_values(self.keys, self.v)
        with np.errstate(over="ignore", under="ignore"):
            out = np.ldexp(a, e)
            m = np.ldexp(mag, e)
        if not np.all(np.isfinite(out)):
            r = np.argwhere(~np.isfinite(out))[0]
            raise range_error(
                "the token values vᵀx_it",
                math.log(abs(float(a[tuple(r)]))) + float(np.broadcast_to(e, a.shape)[tuple(r)]) * _LN2,
            )
        low = (mag > 0) & (m < FLOAT_TINY)
        if np.any(low):
            r = np.argwhere(low)[0]
            raise range_error(
                "the token values vᵀx_it (the size Σ_k|v_k x_itk| of a nonzero one)",
                math.log(float(mag[tuple(r)])) + float(np.broadcast_to(e, a.shape)[tuple(r)]) * _LN2,
                remedy="Scale v or X up (optimal_tokens does not need the values themselves)",
            )
        return out

    def scores(self) -> FloatArray:
        """Token scores ``γ_it = Y_i vᵀx_it``, shape ``(n, T)``.

        Scale: as :meth:`values`. Masked tokens: 0, as in :meth:`values`.
        """
        return self.Y[:, None] * self.values()

    def optimal_tokens(self) -> NDArray[np.intp]:
        """``opt_i = argmax_t γ_it``, shape ``(n,)``, over the allowed tokens ``t`` (:attr:`mask`).

        Raises :class:`TiedScoresError` naming the first sequence whose two best scores
        agree to ``TIE_RTOL · max_t Σ_k|v_k x_itk|`` (their rounding level), since the optimal
        token is then undefined. Masked tokens take no part (a sequence with one allowed token has no tie).

        Scale: any finite data, never over/underflows: the scores of each sequence are formed from
        its tokens and ``v`` rescaled by powers of two (argmax and ties are invariant under
        ``X → cX``, ``v → cv``, ``c > 0``), so the answer is the same at every scale; from per-entry
        exponents where ``v`` or a key spans beyond the range (:func:`values_split_mag`: with ``v`` flushed
        to 0 a sequence's scores were all 0, a false tie).
        """
        # each sequence on its own (argmax and ties are per sequence), its values formed as values_split_mag
        # gives them (from per-entry exponents where v or a key spans beyond the range)
        a, amag, _ = values_split_mag(self.keys, self.v)
        gamma = self.Y[:, None] * a  # γ_i· · 2^−e_i: |γ'| ≤ d
        if self.mask is not None:
            gamma = np.where(self.mask, gamma, -np.inf)  # finite − (−inf) = inf: never a tie, never NaN
        # Rounding level of each score, Σ_k|v_k x_itk| (scale-equivariant, unlike max(1, |γ|)), and,
        # outside the relative factor (inside it 2^−46 would round it away), the d products that may
        # have underflowed in the rescaled data: two scores closer than that are not told apart.
        level = np.max(amag, axis=1)
        opt = np.argmax(gamma, axis=1)
        top2 = np.sort(gamma, axis=1)[:, -2:]
        tol = TIE_RTOL * level + self.d * _TRUE_MIN
        tied = np.flatnonzero(top2[:, 1] - top2[:, 0] <= tol)
        if tied.size:
            i = int(tied[0])
            best = np.flatnonzero(gamma[i] >= top2[i, 1] - tol[i])
            raise TiedScoresError(
                f"sequence {i} has a tie for the best token score: tokens {best.tolist()} score "
                f"within the rounding level {TIE_RTOL:.3g}·Σ_k|v_k x_itk| of each other; the optimal "
                "token is undefined. Pass an explicit alpha, or perturb the data."
            )
        return opt

    # ------------------------------------------------------- argument checking
    def check_weights(self, W: ArrayLike, name: str = "W") -> FloatArray:
        """Validate an attention matrix: a finite real ``(d, d)`` array (returns a float64 copy)."""
        Wa = as_real_array(W, name, ndim=2)
        if Wa.shape != (self.d, self.d):
            raise InvalidInstanceError(
                f"{name} must have shape (d, d) = ({self.d}, {self.d}) for this instance; got {Wa.shape}"
            )
        return Wa

    def check_alpha(self, alpha: ArrayLike | None) -> NDArray[np.intp]:
        """Validate a token choice: one integer index in ``[0, T)`` per sequence, an allowed token.

        ``None`` means the optimal tokens (:meth:`optimal_tokens`). A masked token is refused.
        """
        if alpha is None:
            return self.optimal_tokens()
        arr = np.array(alpha, copy=True)
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.intp)
        if arr.dtype.kind not in "iu":
            raise InvalidInstanceError(f"alpha must hold integer token indices; got dtype {arr.dtype}")
        if arr.shape != (self.n,):
            raise InvalidInstanceError(
                f"alpha must have shape (n,) = ({self.n},), one token index per sequence; got {arr.shape}"
            )
        out = np.flatnonzero((arr < 0) | (arr >= self.T))
        if out.size:
            i = int(out[0])
            raise InvalidInstanceError(
                f"alpha[{i}] = {int(arr[i])} is out of range; token indices must lie in [0, {self.T - 1}]"
            )
        arr = arr.astype(np.intp)
        if self.mask is not None:
            masked = np.flatnonzero(~self.mask[np.arange(self.n), arr])
            if masked.size:
                i = int(masked[0])
                raise InvalidInstanceError(
                    f"alpha[{i}] = {int(arr[i])} selects a masked token of sequence {i}; choose one of its "
                    f"allowed tokens {np.flatnonzero(self.mask[i]).tolist()}"
                )
        arr.setflags(write=False)
        return arr


def _unit_rows(a: FloatArray) -> FloatArray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def random_instance(
    n: int, T: int, d: int, *, seed: int | np.random.Generator = 0, family: str = "gaussian"
) -> Instance:
    """Draw a random instance.

    Families (all draws from ``numpy.random.default_rng(seed)``, in the order listed):

    * ``"gaussian"``: ``X``, ``z`` and ``v`` with i.i.d. standard normal entries;
      labels ``Y_i = ±1`` with probability ½ each (cross-attention, ``z`` given).
    * ``"unit"``: as ``"gaussian"``, then every token ``x_it``, every query ``z_i`` and
      ``v`` normalised to unit Euclidean length (cross-attention).
    * ``"self_attention"``: ``X``, ``v``, ``Y`` as ``"gaussian"``; ``z`` is the first
      token, ``z_i = x_i0``.

    Continuous draws make ties and degenerate constraints happen with probability 0;
    with ``d ≥ n`` and ``d ≥ T − 1`` the Att-SVM constraint rows are then linearly
    independent, so every Att-SVM(α) is feasible.
    """
    for name, val, low in (("n", n, 1), ("T", T, 2), ("d", d, 1)):
        check_int(val, name, low=low, error=InvalidInstanceError)
    if family not in FAMILIES:
        raise unknown_name("instance family", family, FAMILIES)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    v = rng.standard_normal(d)
    Y = rng.choice(np.array([-1.0, 1.0]), size=n)
    zz: Any = z
    if family == "unit":
        X, zz, v = _unit_rows(X), _unit_rows(z), v / np.linalg.norm(v)
    elif family == "self_attention":
        zz = None
    return Instance(X, Y, v, zz)
