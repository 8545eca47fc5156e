"""Exact ``mantissa · 2^E`` arithmetic: power-of-two splits of the data, the Kronecker Gram and its norm.

Every quantity of the certified bound is a product of norms of ``X``, ``z``, ``v``, radii and factors
``κ``; each is carried as an exact pair ``m · 2^e`` so that no Gram entry, ``κ_i`` or ``κ_i²`` under- or
overflows and power-of-two rescaling of the data only moves integer exponents. Also the overflow-free
Frobenius norm ``_fro`` (``math.hypot``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._types import FloatArray, Int64Array
from ..model._instance import Instance

# --------------------------------------------------------------------------- power-of-two splits
# Every quantity of the bound is a product of norms of X, z, v, radii and factors κ. To keep data of
# any size (1e-300 … 1e300, and arrays of very different sizes) free of under- and overflow, each
# vector is split exactly as ``m · 2^e`` (``max|m| ∈ [½, 1)``, :func:`_split`), the mantissas are
# combined in float64 (they are O(1)), and the exponents are added as integers. Scaling X, z, v or R
# by a power of two then changes only the integer exponents: the bound is exactly equivariant.
_LN2 = math.log(2.0)


def _split(a: ArrayLike) -> tuple[FloatArray, Int64Array]:
    """Rows (last axis) of ``a`` as ``m · 2^e``: ``max|m_row| ∈ [½, 1)`` (``m = 0, e = 0`` for a zero row).

    Exact (power-of-two scaling) for every entry of ``m`` that is a normal double; an entry below
    ``2^−1022`` relative to its row's largest is rounded in the subnormal band (normwise negligible).
    """
    arr = np.asarray(a, dtype=np.float64)
    _, e = np.frexp(np.max(np.abs(arr), axis=-1))
    e = e.astype(np.int64)
    return np.ldexp(arr, -e[..., None]), e


def _norm_split(m: FloatArray, e: Int64Array) -> tuple[FloatArray, Int64Array]:
    """``||m_row|| · 2^e`` as a normalised pair (the mantissas of a row are ≤ 1: no overflow)."""
    mm, ee = _split(m)  # re-split first: a row of tiny mantissas would underflow when squared
    nm, ne = np.frexp(np.linalg.norm(mm, axis=-1))
    return nm, (e + ee + ne).astype(np.int64)


def _pair_log(m: Any, e: Any) -> Any:
    """Natural log of ``m · 2^e`` (``−inf`` where ``m = 0``)."""
    with np.errstate(divide="ignore"):
        return np.log(np.abs(m)) + np.asarray(e, dtype=np.float64) * _LN2


def _pair_from_log(lg: Any) -> tuple[FloatArray, Int64Array]:
    """``exp(lg)`` as a pair ``m · 2^e`` without under/overflow (``lg = −inf`` gives ``m = 0``)."""
    lg = np.asarray(lg, dtype=np.float64)
    fin = np.isfinite(lg)
    e = np.where(fin, np.floor(np.where(fin, lg, 0.0) / _LN2), 0.0).astype(np.int64)
    m = np.where(fin, np.exp(np.where(fin, lg, 0.0) - e * _LN2), 0.0)
    mm, me = np.frexp(m)
    return mm, (e + me).astype(np.int64)


def _pair_key(m: float, e: int) -> tuple[int, float]:
    """Exact order of positive pairs (normalised ``m ∈ [½, 1)`` or 0)."""
    mm, me = math.frexp(m)
    return (-(2**62), 0.0) if mm == 0.0 else (e + me, mm)


def _pair_value(m: float, e: int) -> float:
    """``m · 2^e`` as a float (0 or ±inf outside the range: diagnostic attributes only)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(m, e))


def _lam_max(G: FloatArray) -> float:
    # (G is never empty: an Instance has n ≥ 1 sequences and T ≥ 2 tokens.)
    lam = float(np.linalg.eigvalsh(G)[-1])
    # A PSD Gram matrix can give λ_max = −tiny from rounding when it is ~0: clip to 0.
    return max(lam, 0.0)


def _kron_gram(
    zm: FloatArray, ze: Int64Array, ym: FloatArray, ye: Int64Array, km: FloatArray, ke: Int64Array
) -> tuple[FloatArray, int]:
    """Gram ``M · 2^(2E)`` of the rows ``r_ir = κ_i z_i ⊗ y_ir`` (``z_i = zm_i 2^ze_i``, ``y_ir = ym_ir 2^ye_ir``,
    ``κ_i = km_i 2^ke_i``): ``⟨r_ir, r_js⟩ = κ_iκ_j (z_i·z_j)(y_ir·y_js)``, shape ``(nR, nR)``.

    Row ``a`` carries the exponent ``E_a = ke_i + ze_i + ye_ir``; with ``E = max_a E_a`` the entries are
    ``ldexp(κ̂κ̂(ẑ·ẑ)(ŷ·ŷ), E_a + E_b − 2E)``: mantissa products are O(1) (no under/overflow) and the
    largest diagonal entry is ``≥ 1/64`` (each normalised factor is ``≥ ½`` on it), so an entry that
    underflows is ``2^−1022``-negligible against ``λ_max``. ``E = 0`` and ``M = 0`` when every row is 0.
    """
    n, R, _ = ym.shape
    alive = (km != 0)[:, None] & np.any(zm != 0, axis=1)[:, None] & np.any(ym != 0, axis=-1)
    rowe = (ke + ze)[:, None] + ye  # (n, R)
    if not alive.any():
        return np.zeros((n * R, n * R)), 0
    E = int(np.max(rowe[alive]))
    sh = np.where(alive, rowe - E, 0)
    M = (km[:, None] * km[None, :] * (zm @ zm.T))[:, None, :, None] * np.einsum("ird,jsd->irjs", ym, ym)
    M = np.ldexp(M, sh[:, :, None, None] + sh[None, None, :, :])
    return np.asarray(M.reshape(n * R, n * R)), E


def _kron_norm(
    zm: FloatArray,
    ze: Int64Array,
    ym: FloatArray,
    ye: Int64Array,
    km: FloatArray,
    ke: Int64Array,
    rows: NDArray[np.intp] | None = None,
) -> tuple[float, int]:
    """``||K 𝓡||₂ = λ_max(M)^½ · 2^E`` (see :func:`_kron_gram`) as a normalised pair ``(m, e)``.

    ``rows``: the flat indices ``i·R + r`` of the rows that exist (the allowed tokens of a masked
    instance, whose other rows are 0); the eigenproblem is solved on those rows only, the Gram of the
    instance with the masked tokens deleted (``None``: every row)."""
    M, E = _kron_gram(zm, ze, ym, ye, km, ke)
    if rows is not None:
        M = M[np.ix_(rows, rows)]
    m, e = math.frexp(math.sqrt(_lam_max(M)))
    return m, e + E


class _Split:
    """The data of an instance split into mantissas and power-of-two exponents (per token, per query)."""

    def __init__(self, inst: Instance) -> None:
        # Masks: the keys (masked tokens zeroed) are read, so a masked token sets no exponent, norm or
        # value; ``allowed`` is the mask (``None`` when unmasked) and ``rows`` the flat indices
        # ``i·T + t`` of the allowed tokens, the rows of the logit map that exist.
        self.allowed: NDArray[np.bool_] | None = inst.mask
        self.rows: NDArray[np.intp] | None = None if inst.mask is None else np.flatnonzero(inst.mask)
        self.xm, self.xe = _split(inst.keys)  # (n, T, d), (n, T)
        self.zm, self.ze = _split(inst.z)  # (n, d), (n,)
        vm, ve = _split(inst.v[None, :])
        self.vm: FloatArray = vm[0]
        self.ve: int = int(ve[0])
        self.xn = _norm_split(self.xm, self.xe)  # ||x_it|| as pairs
        self.zn = _norm_split(self.zm, self.ze)  # ||z_i|| as pairs
        n, T, _ = inst.shape
        # Per sequence, the exponent of its largest token: tokens on that common scale (underflow of
        # an entry is 2^−1022-negligible against the sequence's largest token).
        nonzero = np.any(self.xm != 0, axis=-1)
        self.se = np.max(np.where(nonzero, self.xe, np.iinfo(np.int64).min // 4), axis=1)
        self.se = np.where(np.any(nonzero, axis=1), self.se, 0).astype(np.int64)  # (n,)
        self.xs = np.ldexp(self.xm, (self.xe - self.se[:, None])[..., None])  # (n, T, d), x_it / 2^se_i
        # values a_it = vᵀx_it on the sequence's scale: a_it = as_it · 2^(se_i + ve), |as| ≤ d
        self.as_ = self.xs @ self.vm
        self.ones = (np.ones(n), np.zeros(n, dtype=np.int64))


def _fro(w: FloatArray) -> float:
    # math.hypot scales internally: no overflow of the sum of squares for entries near 1e300.
    return math.hypot(*(float(x) for x in np.ravel(w)))
