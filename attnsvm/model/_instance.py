"""Validated attention data: the :class:`Instance` and random instance families.

An instance holds ``n`` sequences of ``T`` tokens in ``R^d`` (``X``, shape
``(n, T, d)``), labels ``Y ∈ {-1, +1}^n``, a value head ``v ∈ R^d`` and one
query per sequence ``z`` (shape ``(n, d)``). Logits are ``l_it = x_itᵀ W z_i``.
When ``z`` is not given it is the first token, ``z_i = x_i0`` (self-attention read
at token 0) and :attr:`Instance.self_attention` is ``True``.

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

from ..errors import InvalidInstanceError, TiedScoresError, unknown_name
from ..scaling import FLOAT_TINY, range_error
from ..scaling import pow2_split as pow2_split  # re-exported: its home is attnsvm.scaling

__all__ = ["Instance", "random_instance", "FAMILIES", "TIE_RTOL", "as_real_array"]

FloatArray = NDArray[np.float64]

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


def values_split(X: ArrayLike, v: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``(a', e)`` with ``vᵀx_it = a'_it · 2^e_i``, ``a' = X'_i v'`` from per-sequence rescaled ``X``.

    ``|a'| ≤ d``: no product overflows, whatever the size of ``X`` and ``v``; each sequence is
    scaled on its own, so a sequence far smaller than another keeps its digits. Products that
    underflow in the rescaled data lose at most ``2^−1074`` relative to ``max|x_i·|·max|v|``.
    """
    Xs, ex = split_rows(X, 1)
    vs, ev = pow2_split(v)
    return Xs @ vs, ex + ev


def as_real_array(value: ArrayLike, name: str, ndim: int | None = None) -> FloatArray:
    """Return a validated float64 copy of ``value``.

    Raises :class:`InvalidInstanceError` naming ``name`` when the value is not a real
    numeric array (complex, object, string and boolean data are refused), has the
    wrong rank, or holds NaN or Inf.
    """
    try:
        arr = np.array(value, copy=True)
    except Exception as exc:  # ragged lists and the like
        raise InvalidInstanceError(
            f"{name} must be a real numeric array; could not convert it ({exc})"
        ) from exc
    if arr.dtype.kind not in "iuf":
        raise InvalidInstanceError(
            f"{name} must hold real numbers (int or float); got dtype {arr.dtype}"
            + (" (complex values are not supported)" if arr.dtype.kind == "c" else "")
        )
    if ndim is not None and arr.ndim != ndim:
        raise InvalidInstanceError(f"{name} must have {ndim} dimension(s); got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise InvalidInstanceError(
            f"{name} must be finite; found {arr[tuple(bad)]} at index {tuple(int(b) for b in bad)}. "
            "Remove or impute NaN/Inf entries first."
        )
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Instance:
    """Validated data for one attention problem.

    Args:
      X: tokens, shape ``(n, T, d)``, ``n ≥ 1``, ``T ≥ 2``.
      Y: labels, shape ``(n,)``, every entry ``+1`` or ``-1``.
      v: value head, shape ``(d,)``.
      z: queries, shape ``(n, d)``; ``None`` means the first token of each sequence.

    Attributes ``X, Y, v, z`` are read-only float64 arrays; ``n, T, d`` the sizes;
    ``self_attention`` is ``True`` when ``z`` was taken from the first token.
    """

    X: FloatArray
    Y: FloatArray
    v: FloatArray
    z: FloatArray = field(default=None)  # type: ignore[arg-type]
    self_attention: bool = field(init=False)

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

    def __repr__(self) -> str:
        kind = "self-attention (z = first token)" if self.self_attention else "cross-attention (z given)"
        return f"Instance(n={self.n}, T={self.T}, d={self.d}, {kind})"

    # ------------------------------------------------------------- token scores
    def values(self) -> FloatArray:
        """Token values ``a_it = vᵀx_it``, shape ``(n, T)``.

        Scale: any finite data; each value to absolute error ``≲ d·eps·Σ_k|v_k x_itk|`` (plus
        ``d·2^−1074·max|x_i··|·max|v|``, products lost against the sequence's largest). Raises
        :class:`~attnsvm.NumericalError` when a value exceeds 1.8e308, or when a nonzero
        ``Σ_k|v_k x_itk|`` is below 2.2e-308 (the value would lose its digits to underflow).
        """
        Xs, ex = split_rows(self.X, 1)
        vs, ev = pow2_split(self.v)
        a = Xs @ vs
        mag = np.abs(Xs) @ np.abs(vs)
        e = (ex + ev)[:, None]
        with np.errstate(over="ignore", under="ignore"):
            out = np.ldexp(a, e)
            m = np.ldexp(mag, e)
        if not np.all(np.isfinite(out)):
            r = np.argwhere(~np.isfinite(out))[0]
            raise range_error(
                "the token values vᵀx_it", math.log(abs(float(a[tuple(r)]))) + float(e[r[0], 0]) * _LN2
            )
        low = (mag > 0) & (m < FLOAT_TINY)
        if np.any(low):
            r = np.argwhere(low)[0]
            raise range_error(
                "the token values vᵀx_it (the size Σ_k|v_k x_itk| of a nonzero one)",
                math.log(float(mag[tuple(r)])) + float(e[r[0], 0]) * _LN2,
                remedy="Scale v or X up (optimal_tokens does not need the values themselves)",
            )
        return out

    def scores(self) -> FloatArray:
        """Token scores ``γ_it = Y_i vᵀx_it``, shape ``(n, T)``.

        Scale: as :meth:`values`.
        """
        return self.Y[:, None] * self.values()

    def optimal_tokens(self) -> NDArray[np.intp]:
        """``opt_i = argmax_t γ_it``, shape ``(n,)``.

        Raises :class:`TiedScoresError` naming the first sequence whose two best scores
        agree to ``TIE_RTOL · max_t Σ_k|v_k x_itk|`` (their rounding level), since the optimal
        token is then undefined.

        Scale: any finite data, never over/underflows: the scores of each sequence are formed from
        its tokens and ``v`` rescaled by powers of two (argmax and ties are invariant under
        ``X → cX``, ``v → cv``, ``c > 0``), so the answer is the same at every scale.
        """
        Xs, _ = split_rows(self.X, 1)  # each sequence on its own: argmax and ties are per sequence
        vs, _ = pow2_split(self.v)
        gamma = self.Y[:, None] * (Xs @ vs)  # γ_i· · 2^−(ex_i+ev): |γ'| ≤ d
        # Rounding level of each score, Σ_k|v_k x_itk| (scale-equivariant, unlike max(1, |γ|)), and,
        # outside the relative factor (inside it 2^−46 would round it away), the d products that may
        # have underflowed in the rescaled data: two scores closer than that are not told apart.
        level = np.max(np.abs(Xs) @ np.abs(vs), axis=1)
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
        """Validate a token choice: one integer index in ``[0, T)`` per sequence.

        ``None`` means the optimal tokens (:meth:`optimal_tokens`).
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
        arr.setflags(write=False)
        return arr


def _unit_rows(a: FloatArray) -> FloatArray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def random_instance(
    n: int, T: int, d: int, seed: int | np.random.Generator = 0, family: str = "gaussian"
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
        if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < low:
            raise InvalidInstanceError(f"{name} must be an integer ≥ {low}; got {val!r}")
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
