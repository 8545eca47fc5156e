"""Lipschitz constants of attention with respect to ``W``: certified bounds and attained estimates.

The maps. The model's logits are ``l_it = x_itᵀ W z_i`` (token ``x_it`` of sequence ``i``, query
``z_i``, ``W ∈ R^{d×d}``), its weights ``s_i = softmax(l_i)`` (or ``φ(l_i)/Σ_t φ(l_it)``) and its
output ``f_i = Σ_t s_it a_it`` with the values ``a_it = vᵀx_it``. Lipschitz constants here are with
respect to ``W`` on the ball ``B_R = {W : ||W||_F ≤ R}``, Frobenius norm in, ℓ2 norm out, of

* ``of="weights"``: ``W ↦ s(W) ∈ R^{nT}`` (all attention weights, flattened);
* ``of="output"``:  ``W ↦ f(W) ∈ R^n``;

for the kinds ``softmax``, ``linear`` (``s_i = l_i``) and ``normalized_linear`` (``φ = elu + 1`` on the
logits). Below, ``vec W`` stacks the columns of ``W`` (column-major ``vec``).

Structure. Every kind acts on the logits ``l = 𝓛(W)``, ``l_it = x_itᵀ W z_i = ⟨z_i ⊗ x_it, vec W⟩``,
a linear map whose operator norm ``||𝓛||₂`` is computed exactly from its factorised Gram matrix
``⟨z_i ⊗ x_it, z_j ⊗ x_ju⟩ = (z_i·z_j)(x_it·x_ju)``, an ``(nT) × (nT)`` eigenproblem that never
forms a ``d²``-long row. By the chain rule the Jacobian of each map is ``D(W) 𝓛`` with ``D``
block diagonal over sequences, so on the convex ball (mean-value theorem; every map is C¹, also
``φ = elu + 1``, whose derivative is continuous at 0)

    Lip_R ≤ sup_{W ∈ B_R} ||D(W) 𝓛||₂ ≤ ||K 𝓛||₂,     K = blockdiag(κ_i I_T),  κ_i ≥ sup ||D_i||₂,

because ``||D 𝓛 x||² = Σ_i ||D_i 𝓛_i x||² ≤ Σ_i κ_i² ||𝓛_i x||² = ||K 𝓛 x||²``; ``||K 𝓛||₂`` comes from
the scaled Gram ``K G K``. The bound is also capped by ``max_i κ_i · ||𝓛||₂`` (never smaller in
exact arithmetic; it makes ``softmax ≤ ½ · linear`` hold exactly in floating point).
The per-sequence factors ``κ_i`` and their proofs are in :func:`lipschitz_bound`.

The estimate (:func:`lipschitz_estimate`) maximises ``||J(W)||₂`` over the ball (torch autograd
Jacobian, float64): random and structured starting points, then projected ascent. Any value it
returns is attained (a lower bound on the true constant); the bound is an upper bound, so
``estimate ≤ Lip_R ≤ bound`` and ``bound / estimate`` measures how tight the bound is.

Masks (:attr:`~attnsvm.Instance.mask`). A masked token has weight exactly 0 for every ``W``, so its
entry of ``s`` is constant and it takes no part in its sequence's weights, output or logits: sequence
``i`` acts on its ``T_i`` allowed tokens. Every function here equals the same function on the instance
with the masked tokens deleted, sequence by sequence, combined as above (the rows of ``𝓛`` and ``J`` are
those of the allowed tokens, ``Σ_i T_i`` of them; ``κ_i`` from sequence ``i``'s allowed tokens; a
sequence with one allowed token has constant weight 1 and output ``a_it`` for the normalised kinds, so
``κ_i = 0`` and its Jacobian block is 0). Masked tokens are never read (every function reads
:attr:`~attnsvm.Instance.keys`, with the masked tokens zeroed, and restricts maxima, spreads and
log-sum-exps to the allowed tokens), so their size sets no scale, norm, factor or search cap, and no
``−inf`` logit enters an arithmetic operation (the torch heads put ``−inf`` only into a softmax, after
the finite max of the allowed logits). :meth:`~attnsvm.Instance.from_sequences` instances (causal or
not) are masked instances.

Scale (issue 13's contract). Scaling ``X → 2^a X``, ``z → 2^b z`` with ``R → 2^-(a+b) R`` keeps every
logit, so the weights constant scales by ``2^(a+b)``; ``v → 2^c v`` scales the values, so the output
constant scales by ``2^(2a+b+c)``. Every function here uses this instead of refusing: the bound
carries each norm and factor as an exact pair ``m·2^e`` (no Gram entry, ``κ_i`` or ``κ_i²``
under- or overflows, and the bound is exactly — bit for bit — equivariant under power-of-two
rescaling), the estimate's search runs on the data rescaled by exact powers of two to O(1), and the
Jacobian norm (also the estimate's returned value) rescales each sequence on its own and puts the
powers of two back. A result that is not a normal double raises
:class:`~attnsvm.NumericalError` (``scaling.range_error``) naming it and float64's range; never
0, inf, NaN or a numpy ``LinAlgError``.

References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710 (Lipschitz constant of
self-attention); Katharopoulos, Vyas, Pappas, Fleuret, ICML 2020, arXiv 2006.16236 (``φ = elu + 1``);
Gao, Song, Xie, arXiv 2307.02419 (tensor trick); Tarzanagh, Li, Thrampoulidis, Oymak,
arXiv 2308.16898 (the model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:  # torch is imported where it is used: `import attnsvm` stays light (~1 s less)
    import torch

from ._deps import require
from ._types import FloatArray, Int64Array
from ._validation import check_instance, check_int
from .errors import AttnSVMError, NumericalError, unknown_name
from .model._attention import KINDS
from .model._instance import Instance
from .scaling import EPS as _EPS
from .scaling import FLOAT_MAX, FLOAT_TINY, check_log_representable, pow2_exponent, range_error

__all__ = [
    "OFS",
    "WRTS",
    "LipschitzBound",
    "LipschitzEstimate",
    "lipschitz_bound",
    "lipschitz_estimate",
    "compare_lipschitz",
    "jacobian_norm",
    "logit_gram",
    "logit_norm",
    "bound_rounding_rtol",
]


OFS = ("weights", "output")
WRTS = ("W",)


#: ``||s∘(a − f)||₂ ≤ (√2/4)(max a − min a)`` for ``s`` in the simplex, ``f = sᵀa`` (proof in
#: :func:`lipschitz_bound`); tight for ``T = 2``, ``s = (½, ½)``.
SPREAD_FACTOR = math.sqrt(2.0) / 4.0


def bound_rounding_rtol(inst: Instance) -> float:
    """Relative float64 rounding allowance folded into every certified bound of ``inst``.

    ``λ_max`` of an ``m × m`` symmetric Gram matrix from a backward-stable eigensolver is within
    ``c·m·eps·||G||₂`` of the exact value (Weyl), and each Gram entry, a product of two length-``d``
    dot products, is within ``(2d + 2)·eps`` of exact relative to ``|G_ab| ≤ ||G||₂``, i.e. at most
    ``m·(2d + 2)·eps·||G||₂`` in norm (Gershgorin). Taking ``c = 8`` and halving nothing for the
    square root (the root halves a relative error) gives ``rtol = (8m + m(2d + 2))·eps`` with
    ``m = nT``; the factors ``κ_i`` (a handful of correctly-rounded operations) are covered by it.

    Masks: ``m = Σ_i T_i``, the number of allowed tokens (the rows of the logit map and of the Gram
    eigenproblem, from which the masked rows are removed): the allowance of the instance with the
    masked tokens deleted.
    """
    m = inst.n * inst.T if inst.mask is None else int(np.count_nonzero(inst.mask))
    return float((8 * m + m * (2 * inst.d + 2)) * _EPS)


# --------------------------------------------------------------------------- checks
def _check_common(kind: str, of: str, wrt: str) -> None:
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    if of not in OFS:
        raise unknown_name("Lipschitz map 'of'", of, OFS)
    if wrt not in WRTS:
        raise AttnSVMError(
            f"wrt={wrt!r} is not supported: only Lipschitz constants with respect to the attention "
            "matrix W (wrt='W') are implemented. Pass wrt='W'."
        )


def _check_radius(radius: Any) -> float:
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)):
        raise AttnSVMError(
            f"radius must be a real number > 0; got {radius!r} of type {type(radius).__name__}"
        )
    r = float(radius)
    if not math.isfinite(r) or r <= 0.0:
        raise AttnSVMError(
            f"radius must be finite and > 0 (the ball ||W||_F ≤ radius); got {radius!r}. "
            "The linear bound is radius-free; for the others pass a positive finite radius."
        )
    return r


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


# --------------------------------------------------------------------------- the logit map
def logit_gram(inst: Instance) -> FloatArray:
    """Gram matrix of the logit map's rows, ``G[(i,t),(j,u)] = (z_i·z_j)(x_it·x_ju)``, shape ``(nT, nT)``.

    ``l_it = ⟨z_i ⊗ x_it, vec W⟩`` (column-major ``vec``), so ``G = 𝓛 𝓛ᵀ`` and
    ``||𝓛||₂ = λ_max(G)^{1/2}``; the factorised form costs ``O((nT)² d)``, never ``d²``-long rows.

    Scale: any finite data; formed from power-of-two rescaled rows, so it is normwise accurate to
    ``~(2d + 2)·eps·||G||₂`` whenever its largest entry ``max_a G_aa`` is a normal double; raises
    :class:`~attnsvm.NumericalError` (``scaling.range_error``) when that entry is beyond
    ``[2.2e-308, 1.8e308]`` (entries ``2^−1022`` below it may be subnormal or 0: normwise negligible).

    Masks: a masked token has no logit (weight 0 for every ``W``), so its row of ``𝓛`` is absent: its
    row and column of ``G`` are exactly 0 and the allowed rows and columns, ``G[allowed][:, allowed]``
    (``allowed = inst.allowed.ravel()``), are the Gram of the instance with the masked tokens deleted
    (sequence by sequence, in the same order). A masked token sets no scale (its size is never read).

    References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick).

    Args:
      inst: the data (``n, T, d``).

    Returns:
      ``G``, shape ``(n·T, n·T)``, rows ordered by sequence then token.
    """
    sp = _Split(inst)
    M, E = _kron_gram(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones)
    if not np.any(M):
        return M
    big = float(np.max(np.diag(M)))  # PSD: the largest entry is on the diagonal
    what = "the largest entry max ||z_i||²||x_it||² of the logit Gram matrix"
    check_log_representable(what, math.log(big) + 2 * E * _LN2, remedy="rescale X or z")
    with np.errstate(under="ignore"):
        return np.asarray(np.ldexp(M, 2 * E))


def logit_norm(inst: Instance) -> float:
    """Operator norm ``||𝓛||₂`` of ``W ↦ (x_itᵀ W z_i)_{i,t}`` (Frobenius in, ℓ2 out).

    ``||𝓛||₂ = λ_max(G)^{1/2}`` with ``G`` from :func:`logit_gram`.

    Scale: any finite data (the Gram is formed from power-of-two rescaled rows and the scale put back
    exactly); relative accuracy ``~(8m + m(2d + 2))·eps``, ``m = nT``; 0 exactly when ``X`` or ``z`` is 0;
    raises :class:`~attnsvm.NumericalError` when ``||𝓛||₂`` is outside ``[2.2e-308, 1.8e308]``.

    Masks: the map ``W ↦ (x_itᵀ W z_i)`` over the allowed tokens only (``m = Σ_i T_i`` rows): the norm of
    the instance with the masked tokens deleted; the eigenproblem is solved on the allowed rows of
    :func:`logit_gram`. Masked tokens are never read (any finite size).

    References: Gao, Song, Xie, arXiv 2307.02419.

    Args:
      inst: the data.

    Returns:
      ``||𝓛||₂ ≥ 0`` (a float).
    """
    sp = _Split(inst)
    m, e = _kron_norm(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones, rows=sp.rows)
    if m == 0.0:
        return 0.0
    check_log_representable("the logit-map norm ||L||_2", math.log(m) + e * _LN2, remedy="rescale X or z")
    return float(np.ldexp(m, e))


#: Rounding allowance of a max-weight bound's log, per unit of the largest exponent magnitude it
#: combines (see ``_log_max_weight``): relative rounding of the norms (d + 3 roundings each), of the
#: products (3), and of log-sum-exp/logaddexp (T + 4), doubled.
def _log_weight_ulps(d: int, T: Any) -> Any:
    # (``T`` an int, or the per-sequence counts ``T_i`` of a masked instance as an array)
    return 2.0 * (2 * d + T + 16)


def _log_max_weight(sp: _Split, kind: str, radius: float, *, rounded_up: bool) -> FloatArray:
    """``log p_i`` with ``p_i ≥ max_t s_it(W)`` over the ball, per sequence, shape ``(n,)``.

    On ``||W||_F ≤ R``: ``|aᵀ W b| ≤ ||W||₂ ||a|| ||b|| ≤ R ||a|| ||b||``.

    * softmax: ``s_it = 1 / (1 + Σ_{u≠t} e^{l_iu − l_it})`` and ``l_iu − l_it = (x_iu − x_it)ᵀ W z_i
      ≥ −R ||x_iu − x_it|| ||z_i||``, so ``s_it ≤ σ(−q_it)``, ``q_it = logsumexp_{u≠t}(−R δ_itu)``.
    * normalized_linear: ``φ`` is increasing and ``|l_it| ≤ R c_it``, ``c_it = ||x_it|| ||z_i||``, so
      ``s_it = φ_t / Σ_u φ_u ≤ 1 / (1 + Σ_{u≠t} φ(−R c_iu)/φ(R c_it))``, with
      ``log φ(−R c) = −R c`` and ``log φ(R c) = log1p(R c)``.

    All in the log domain: ``log σ(−q) = −logaddexp(0, q)`` never underflows (a weight bound of
    ``e^−10⁶`` stays ``−10⁶``). The products ``R·||z_i||·δ_itu`` are formed from power-of-two pairs
    (exact under power-of-two rescaling of ``X``, ``z`` and ``R``); ``R·||z||·δ`` beyond 1.8e308 is
    ``+inf`` and its term ``e^−inf = 0`` is then exact to float64. ``rounded_up=True`` adds the
    rounding allowance ``_log_weight_ulps·eps·(1 + max|exponent| + |q|)`` (the absolute error of
    the log) and caps at ``log 1 = 0``, so that the returned ``p`` is an upper bound after rounding.

    Masks: the sums run over the allowed ``u ≠ t`` and the max over the allowed ``t`` only (a masked
    token has weight 0): the bound of the sequence with its masked tokens deleted. A sequence with one
    allowed token gets ``p_i = 1`` (its weight), exactly.
    """
    n, T, d = sp.xm.shape
    mR, eR = math.frexp(radius)
    zn_m, zn_e = sp.zn
    with np.errstate(over="ignore", under="ignore"):
        if kind == "softmax":
            # δ_itu = ||x_it − x_iu|| with both tokens on the pair's common scale 2^max(e_t, e_u).
            ep = np.maximum(sp.xe[:, :, None], sp.xe[:, None, :])  # (n, T, T)
            xt = np.ldexp(sp.xm[:, :, None, :], (sp.xe[:, :, None] - ep)[..., None])
            xu = np.ldexp(sp.xm[:, None, :, :], (sp.xe[:, None, :] - ep)[..., None])
            dm, de = _norm_split(xt - xu, ep)
            prod = np.ldexp(mR * zn_m[:, None, None] * dm, eR + zn_e[:, None, None] + de)
            expo = -prod  # (n, t, u)
        else:
            cm = sp.xn[0] * zn_m[:, None]  # ||x_it|| ||z_i|| mantissa, (n, T)
            Rc = np.ldexp(mR * cm, eR + sp.xn[1] + zn_e[:, None])  # R c_it, +inf beyond 1.8e308
            expo = -Rc[:, None, :] - np.log1p(Rc)[:, :, None]
    mask = np.eye(T, dtype=bool)[None, :, :]
    if sp.allowed is not None:  # a masked u is no term of the sum (its weight is 0 for every W)
        mask = mask | ~sp.allowed[:, None, :]
    expo = np.where(mask, -np.inf, expo)
    m = np.max(expo, axis=-1, keepdims=True)
    # log-sum-exp over u ≠ t, shifted by the max; every term −inf (all beyond float64) gives q = −inf.
    safe_m = np.where(np.isfinite(m), m, 0.0)
    # (only log 0 = −inf of an all-−inf row is possible: every exponent is ≤ 0 and never NaN, being
    # −(a product of finite mantissas and a power of two), so no inf − inf or 0·inf arises)
    with np.errstate(divide="ignore", under="ignore"):  # a term e^(−10⁶) is 0 to float64: exact enough
        q = np.where(
            np.isfinite(m[..., 0]), safe_m[..., 0] + np.log(np.sum(np.exp(expo - safe_m), axis=-1)), -np.inf
        )
    # s ≤ 1/(1 + e^q): log s ≤ −log(1 + e^q) = −logaddexp(0, q), exact in the log domain.
    with np.errstate(
        under="ignore"
    ):  # log(1 + e^q) for q ≪ 0 is e^q, and below 2^-1074 it is 0: exact enough
        logp = -np.logaddexp(0.0, q)  # (n, T)
    if rounded_up:
        fin = np.where(np.isfinite(expo), np.abs(expo), 0.0)
        # Exponents near 1.8e308 (R·c at the top of the range) make the sum overflow to inf: the
        # allowance is then inf and the cap log 1 = 0 binds, which is still an upper bound (p = 1).
        with np.errstate(over="ignore"):
            size = 1.0 + np.max(fin, axis=-1) + np.where(np.isfinite(q), np.abs(q), 0.0)
        # (a masked instance: the rounding of each sequence's T_i-term log-sum-exp)
        Tw = T if sp.allowed is None else np.count_nonzero(sp.allowed, axis=1)[:, None]
        logp = np.minimum(0.0, logp + _log_weight_ulps(d, Tw) * _EPS * size)
    if sp.allowed is not None:  # the max over the allowed t only (every sequence has one)
        logp = np.where(sp.allowed, logp, -np.inf)
    return np.asarray(np.max(logp, axis=1))


def _max_weight_bound(inst: Instance, kind: str, radius: float) -> FloatArray:
    """``p_i ≥ max_t s_it(W)`` over the ball (formula of ``_log_max_weight``, no rounding allowance)."""
    return np.asarray(np.exp(_log_max_weight(_Split(inst), kind, radius, rounded_up=False)))


# --------------------------------------------------------------------------- result objects
@dataclass(frozen=True)
class LipschitzBound:
    """A certified upper bound on a Lipschitz constant; ``float(bound)`` is the bound.

    Attributes:
      value: the certified bound, rounding allowance included (``nominal · (1 + rounding_rtol)``).
      nominal: the formula evaluated in float64, before the rounding allowance.
      kind, of, wrt, radius: what it bounds.
      logit_norm: ``||𝓛||₂``.
      jacobian_factor: ``max_i κ_i``, the bound on the Jacobian with respect to the logits
        (``1`` for linear weights; for linear outputs the exact norm uses its own Gram).
      kappa: per-sequence factors ``κ_i``, shape ``(n,)``.
      formula: which formula gave ``nominal``.
      candidates: every certified candidate computed (name → value); ``nominal`` is their minimum.
      rounding_rtol: see :func:`bound_rounding_rtol`.
      log_value: ``ln(value)``, exact also where the diagnostics below leave the float64 range.
      log_candidates: ``ln`` of each candidate (``−inf`` for 0).
      log_kappa: ``ln κ_i`` (``−inf`` for 0), shape ``(n,)``.
      log_logit_norm: ``ln ||𝓛||₂``.

    ``value`` and ``nominal`` are always normal doubles (or exactly 0); the diagnostics
    ``logit_norm``, ``jacobian_factor``, ``kappa`` and ``candidates`` are rounded to float64 and read
    0 or inf where the quantity itself is outside ``[2.2e-308, 1.8e308]`` (their ``log_*`` are exact).
    """

    value: float
    nominal: float
    kind: str
    of: str
    wrt: str
    radius: float
    logit_norm: float
    jacobian_factor: float
    kappa: FloatArray = field(repr=False)
    formula: str
    candidates: dict[str, float] = field(repr=False)
    rounding_rtol: float = field(repr=False)
    log_value: float = field(repr=False, default=math.nan)
    log_candidates: dict[str, float] = field(repr=False, default_factory=dict)
    log_kappa: FloatArray = field(repr=False, default_factory=lambda: np.zeros(0))
    log_logit_norm: float = field(repr=False, default=math.nan)

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True)
class LipschitzEstimate:
    """An attained lower estimate: ``value = ||J(W)||₂`` at the returned point ``W`` of the ball.

    Attributes:
      value: the largest Jacobian spectral norm found.
      W: the point attaining it, shape ``(d, d)``, ``||W||_F ≤ radius``.
      kind, of, wrt, radius, seed, samples, steps: the request.
      evaluations: how many Jacobians were evaluated.
      search_value: ``||J(W)||₂`` at ``W`` by the factorised path used in the search
        (``λ_max(D G Dᵀ)^{1/2}``); ``value`` is the full-Jacobian SVD at the same point.
    """

    value: float
    W: FloatArray = field(repr=False)
    kind: str
    of: str
    wrt: str
    radius: float
    seed: int
    samples: int
    steps: int
    evaluations: int
    search_value: float = field(repr=False, default=math.nan)

    def __float__(self) -> float:
        return self.value


# --------------------------------------------------------------------------- the bound
def lipschitz_bound(
    inst: Instance, *, kind: str = "softmax", wrt: str = "W", radius: float = 1.0, of: str = "weights"
) -> LipschitzBound:
    """Certified upper bound on the Lipschitz constant of ``W ↦ s(W)`` or ``W ↦ f(W)`` on ``||W||_F ≤ R``.

    ``Lip_R ≤ ||K 𝓛||₂`` with ``K = blockdiag(κ_i I)`` and ``κ_i ≥ sup_{B_R} ||D_i||₂``, ``D_i`` the
    Jacobian of sequence ``i``'s weights (or output) with respect to its logits (module docstring).
    Factors and their proofs (``s = s_i``, ``a = a_i``, ``f = f_i``, ``p_i ≥ max_t s_it`` on the
    ball from the logit bound ``|aᵀWb| ≤ R||a|| ||b||``, see ``_max_weight_bound``):

    * linear, weights: ``s = 𝓛 W`` is linear, ``Lip = ||𝓛||₂`` exactly, for every ``R``.
    * linear, output: ``f_i = Σ_t a_it l_it = (X_iᵀ a_i)ᵀ W z_i`` is linear; ``Lip`` is the exact
      norm ``λ_max(H)^{1/2}``, ``H_ij = (z_i·z_j)(X_iᵀa_i · X_jᵀa_j)``.
    * softmax, weights: ``D_i = diag(s) − ssᵀ`` is PSD (it is the covariance of a one-hot draw
      from ``s``) and ``D_i ≼ diag(s)``, so ``||D_i||₂ ≤ max_t s_t ≤ p_i``; and by Gershgorin
      (row ``t``: ``s_t − s_t² + s_t Σ_{u≠t} s_u = 2 s_t (1 − s_t)``) ``||D_i||₂ ≤ ½``.
      ``κ_i = min(½, p_i)``; hence ``bound ≤ ½ ||𝓛||₂ = ½ · linear`` for every ``R``.
    * normalized_linear, weights: ``s = φ(l)/1ᵀφ(l)``, ``∂s_t/∂l_u = δ_tu s_t r_t − s_t s_u r_u`` with
      ``r = φ'/φ``; for ``φ = elu + 1``, ``r = 1`` on ``l ≤ 0`` and ``1/(1 + l)`` on ``l > 0``, so
      ``r ∈ (0, 1]``. The Jacobian ``diag(s∘r) − s(s∘r)ᵀ = (diag(s) − ssᵀ) diag(r)`` is not
      symmetric, but it factors, so ``||D_i||₂ ≤ ||diag(s) − ssᵀ||₂ ||diag(r)||₂ ≤ min(½, max_t s_t)``:
      the softmax factor ½ holds for ``φ = elu + 1`` too (checked by adversarial search in the tests).
      ``κ_i = min(½, p_i)`` with ``p_i`` the normalized-linear max-weight bound.
    * softmax / normalized_linear, output: ``∂f_i/∂l_i = D_iᵀ a = w∘(a − f)`` with ``w = s`` (softmax)
      or ``w = s∘r ≤ s`` (normalized_linear), so ``||D_i||₂ ≤ ||s∘(a − f)||₂``. With
      ``u_t = s_t(a_t − f)``, ``Σ_t u_t = 0``; let ``P = Σ_{u_t>0} u_t = Σ_{u_t<0} |u_t|``. Then
      ``||u||² ≤ (Σ_{u_t>0} u_t)² + (Σ_{u_t<0} |u_t|)² = 2P²``, and with ``q = Σ_{a_t>f} s_t``,
      ``P ≤ q (max a − f)`` and ``P ≤ (1 − q)(f − min a)``; one side decreases and the other
      increases in ``f``, so ``P ≤ q(1 − q)(max a − min a) ≤ ¼(max a − min a)``. Hence
      ``||s∘(a − f)||₂ ≤ (√2/4)(max a − min a)`` (tight: ``T = 2``, ``s = (½, ½)``; sharper than the
      ``½ (max a − min a)`` of the issue). Also ``||u||² ≤ max_t s_t · Σ_t s_t (a_t − f)² ≤
      p_i (max a − min a)²/4`` (Popoviciu). ``κ_i = min(√2/4, √p_i / 2) · (max_t a_it − min_t a_it)``.

    The nominal bound is the smaller of the certified candidates ``||K𝓛||₂`` and ``max_i κ_i ||𝓛||₂``
    (equal or larger in exact arithmetic, but computed as an exact multiple of ``||𝓛||₂``); ``value`` multiplies it by
    ``1 + rounding_rtol`` (:func:`bound_rounding_rtol`) so that ``float(bound)`` is an upper bound
    also after float64 rounding. The allowance depends only on the instance's sizes, so the
    ordering ``softmax ≤ ½ · linear`` (weights) holds exactly for the returned values.

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710; Katharopoulos et al.,
    arXiv 2006.16236; Gao, Song, Xie, arXiv 2307.02419.

    Args:
      inst: the data (``n, T, d``).
      kind: ``"softmax"``, ``"linear"`` or ``"normalized_linear"``.
      wrt: only ``"W"``.
      radius: ``R > 0``, finite (the linear bounds do not depend on it but it is still checked).
      of: ``"weights"`` (``W ↦ s ∈ R^{nT}``) or ``"output"`` (``W ↦ f ∈ R^n``).

    Scale: any finite data and radius; ``value`` is returned when it is a normal double (equivariant
    bit for bit under power-of-two rescaling, see the module docstring), otherwise
    :class:`~attnsvm.NumericalError` names the bound and float64's range; 0 only when the true
    constant is 0 (``X``, ``z`` or, for outputs of the linear kind, the values all 0). Accuracy: an
    upper bound on the exact constant after rounding (``rounding_rtol``; the output factors use the spread
    ``(max_t a_it − min_t a_it)·(1 + 2 eps) + 4(d + 2)·eps·max||x||·||v||``: the computed difference
    rounded up for its own rounding, plus the values' rounding, and ``p_i`` is rounded up by
    ``_log_weight_ulps·eps·(1 + |exponent|)`` in the log); the linear output bound is exact to
    ``rounding_rtol`` relative plus the values' rounding ``~d·eps·|x|·|v|`` absolute.

    Masks: a masked token has weight 0 for every ``W``, so its row of ``s`` is constant (it adds nothing
    to the constant) and it takes no part in sequence ``i``'s weights, output or logits: sequence ``i``
    acts on its ``T_i`` allowed tokens. The bound is that of the instance with the masked tokens deleted,
    sequence by sequence, combined as above: ``κ_i`` from the allowed tokens of sequence ``i`` (``p_i`` and
    the spread ``max_t a_it − min_t a_it`` over them), ``𝓛`` and ``K𝓛`` with the allowed rows only
    (``Σ_i T_i`` of them, also in ``rounding_rtol``). A sequence with one allowed token has weight 1 and
    output ``a_it`` for every ``W`` (softmax and normalized_linear): ``κ_i = 0`` exactly. A masked token is
    never read, so its size (any finite number) changes nothing.

    Returns:
      :class:`LipschitzBound` (``float()`` gives the bound).

    Raises:
      NumericalError: the bound (``value`` or ``nominal``) is outside ``[2.2e-308, 1.8e308]``.
    """
    _check_common(kind, of, wrt)
    R = _check_radius(radius)
    n, T, d = inst.shape
    rtol = bound_rounding_rtol(inst)
    # Scale: every candidate is a product of norms of X, z, v, R and factors κ_i. Each is carried
    # as an exact pair m·2^e (``_Split``, ``_kron_norm``): no Gram entry under- or overflows, whatever
    # the sizes of X, z and v (the naive form squared κ_i and lost 1e-149-sized bounds to 0), the
    # candidates are compared exactly, and only the returned value must be a normal double.
    sp = _Split(inst)
    rows = sp.rows  # None, or the allowed tokens' rows (masks: the deleted instance's rows)
    Lm, Le = _kron_norm(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones, rows=rows)
    # sequences whose normalised weights are constant (one allowed token): κ_i = 0 exactly
    single = None if sp.allowed is None else np.count_nonzero(sp.allowed, axis=1) == 1
    cands: dict[str, tuple[float, int]]
    if kind == "linear":
        km, ke = sp.ones
        if of == "weights":
            cands = {"||L||_2 (exact)": (Lm, Le)}
        else:
            # f_i = (X_iᵀ a_i)ᵀ W z_i: rows z_i ⊗ y_i, y_i = Σ_t a_it x_it on the sequence's scale
            # (a_it = as_it 2^(se_i + ve), x_it = xs_it 2^se_i), then re-split.
            y = np.einsum("it,itd->id", sp.as_, sp.xs)[:, None, :]
            ym, ye = _split(y)
            ye = ye + (2 * sp.se + sp.ve)[:, None]
            name = "||A L||_2 (exact, Gram (z_i·z_j)(X_i^T a_i·X_j^T a_j))"
            cands = {name: _kron_norm(sp.zm, sp.ze, ym, ye, km, ke)}
        log_kappa = np.zeros(n)
    else:
        logp = _log_max_weight(sp, kind, R, rounded_up=True)
        if of == "weights":
            log_kappa = np.minimum(math.log(0.5), logp)
            if single is not None:
                log_kappa = np.where(single, -np.inf, log_kappa)
            # where the cap binds, _pair_from_log(log ½) is exactly (0.5, 0): floor(log ½ / ln 2) = −1
            # (log ½ = −ln 2 exactly in float64), exp(0) = 1, frexp(1) = (½, 1)
            km, ke = _pair_from_log(log_kappa)
            cap = (0.5, 0)
            cap_name = "1/2 ||L||_2"
        else:
            # spread_i = max_t a_it − min_t a_it on the sequence's scale 2^(se_i + ve), plus the absolute
            # rounding of the values a = Xv (a d-term dot product: ≤ γ_d Σ|x||v| ≤ 1.01·d·eps·||x||·||v||
            # each, twice for a difference, and the subtraction itself), so κ_i is an upper bound also
            # where the values nearly cancel.
            xsn = np.linalg.norm(sp.xs, axis=-1)  # ≤ √d (a masked token's is 0: no part in the max)
            if sp.allowed is None:
                hi, lo = np.max(sp.as_, axis=1), np.min(sp.as_, axis=1)
            else:  # the spread of the allowed values (a masked token's 0 is no value of the sequence)
                hi = np.max(np.where(sp.allowed, sp.as_, -np.inf), axis=1)
                lo = np.min(np.where(sp.allowed, sp.as_, np.inf), axis=1)
            spread = (hi - lo) * (1 + 2 * _EPS) + (
                4 * (d + 2) * _EPS * np.max(xsn, axis=1) * float(np.linalg.norm(sp.vm))
            )
            # κ_i = min(√2/4, √p_i/2) · spread_i as a product of pairs: the factor is scale-free, the
            # spread carries the exponent se_i + ve, so rescaling X or v only moves exponents.
            fm, fe = _pair_from_log(np.minimum(math.log(SPREAD_FACTOR), 0.5 * logp - math.log(2.0)))
            sm, s_e = np.frexp(spread)
            km, k2 = np.frexp(fm * sm)
            ke = (fe + s_e + k2 + sp.se + sp.ve).astype(np.int64)
            if single is not None:
                km, ke = np.where(single, 0.0, km), np.where(single, 0, ke)
            log_kappa = _pair_log(km, ke)
            i_max = int(np.argmax(log_kappa))
            cap = (float(km[i_max]), int(ke[i_max]))
            cap_name = "max_i kappa_i ||L||_2"
        cm, ce = math.frexp(cap[0] * Lm)
        cands = {
            cap_name: (cm, ce + cap[1] + Le),
            "||K L||_2": _kron_norm(sp.zm, sp.ze, sp.xm, sp.xe, km, ke, rows=rows),
        }
    formula = min(cands, key=lambda k: _pair_key(*cands[k]))
    nm, ne = cands[formula]
    vm, ve = math.frexp(nm * (1.0 + rtol))
    ve += ne
    what = f"the {kind} {of} Lipschitz bound (radius {R:.3g})"
    log_value = _pair_log(vm, ve) if vm else -math.inf
    if vm != 0.0:
        _, nfe = math.frexp(nm)
        # normal doubles are [2^−1022, 2^1024): frexp exponents in [−1021, 1024], for value and nominal
        if not (-1021 <= ve <= 1024 and -1021 <= ne + nfe):
            raise range_error(
                what,
                float(log_value),
                remedy="Rescale X, z or v by a power of two: the bound scales by the same factors",
            )
    with np.errstate(over="ignore", under="ignore"):  # diagnostics: 0/inf outside the range
        kappa = np.exp(log_kappa)
    return LipschitzBound(
        value=float(np.ldexp(vm, ve)),
        nominal=float(np.ldexp(nm, ne)),
        kind=kind,
        of=of,
        wrt=wrt,
        radius=R,
        logit_norm=_pair_value(Lm, Le),
        jacobian_factor=float(np.max(kappa)),
        kappa=kappa,
        formula=formula,
        candidates={k: _pair_value(*c) for k, c in cands.items()},
        rounding_rtol=rtol,
        log_value=float(log_value),
        log_candidates={k: float(_pair_log(*c)) if c[0] else -math.inf for k, c in cands.items()},
        log_kappa=np.asarray(log_kappa, dtype=np.float64),
        log_logit_norm=float(_pair_log(Lm, Le)) if Lm else -math.inf,
    )


# --------------------------------------------------------------------------- the estimate
def _torch_head(kind: str, of: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-sequence map from logits ``l_i`` (shape ``(T,)``) and values ``a_i`` to ``s_i`` or ``f_i``, torch."""
    import torch

    def head(l: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        if kind == "linear":
            s = l
        elif kind == "softmax":
            # torch.softmax subtracts the max (log-sum-exp form): no overflow for large logits.
            s = torch.softmax(l, dim=-1)
        else:
            # log φ(l) for φ = elu + 1: log1p(l) on l > 0, l on l ≤ 0 (the clamps keep the unused
            # branch finite so that autograd never multiplies 0 by inf); then a stable softmax.
            logphi = torch.where(l > 0, torch.log1p(torch.clamp(l, min=0.0)), torch.clamp(l, max=0.0))
            s = torch.softmax(logphi, dim=-1)
        return s if of == "weights" else (s * a).sum(dim=-1, keepdim=True)

    return head


def _torch_masked_head(
    kind: str, of: str
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`_torch_head` of a masked sequence: ``head(l, a, m)`` with ``m`` boolean ``(T,)`` (``True`` =
    allowed, at least one). A masked token gets weight exactly 0 for every logit (``linear``: ``s_t = 0``;
    the normalised kinds: its base ``−inf`` before the softmax, which subtracts the finite max of the
    allowed ones, so ``e^−inf = 0`` and never ``−inf − (−inf)``), hence a 0 row and column of ``∂s/∂l``:
    the head of the sequence with the masked tokens deleted, padded with zeros."""
    import torch

    def head(l: torch.Tensor, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        if kind == "linear":
            s = torch.where(m, l, torch.zeros_like(l))
        else:
            base = (
                l
                if kind == "softmax"
                else torch.where(l > 0, torch.log1p(torch.clamp(l, min=0.0)), torch.clamp(l, max=0.0))
            )
            # (torch.where routes no gradient to the constant branch: the masked logits get none)
            s = torch.softmax(torch.where(m, base, torch.full_like(base, -math.inf)), dim=-1)
        return s if of == "weights" else (s * a).sum(dim=-1, keepdim=True)

    return head


def _fro(w: FloatArray) -> float:
    # math.hypot scales internally: no overflow of the sum of squares for entries near 1e300.
    return math.hypot(*(float(x) for x in np.ravel(w)))


def _project(w: FloatArray, R: float) -> FloatArray:
    nrm = _fro(w)
    return w * (R / nrm) if nrm > R else w


def lipschitz_estimate(
    inst: Instance,
    *,
    kind: str = "softmax",
    wrt: str = "W",
    radius: float = 1.0,
    of: str = "weights",
    seed: int = 0,
    samples: int = 64,
    steps: int = 40,
    starts: int = 4,
) -> LipschitzEstimate:
    """Attained lower estimate ``max ||J(W)||₂`` over sampled and ascended points of ``||W||_F ≤ R``.

    ``J(W) = ∂ vec s(W) / ∂ W`` (or ``∂f/∂W``), an ``(nT) × d²`` (or ``n × d²``) matrix. The search
    evaluates ``||J(W)||₂ = λ_max(D G Dᵀ)^{1/2}`` with ``D = blockdiag_i(∂s_i/∂l_i)`` from torch
    autograd (``vmap(jacrev)`` over sequences, float64) and ``G`` the logit Gram
    (:func:`logit_gram`), since ``J = D 𝓛`` and ``J Jᵀ = D G Dᵀ``: an ``(nT) × (nT)`` problem
    instead of a ``d²``-wide SVD. The returned ``value`` is recomputed at the final point from
    the explicit autograd Jacobian (``torch.func.jacrev`` of each sequence's ``W ↦ s_i``, the blocks
    stacked into ``J``) and its largest singular value, an independent path (:func:`jacobian_norm`).

    Candidates: ``W = 0``; ``t R V₁`` for ``t ∈ {±¼, ±½, ±1}``, ``V₁`` the top right singular
    vector of the logit map (the linear maximiser); ``samples`` random points ``ρ·g`` (``g`` a uniform
    random direction, ``k``-th draw): for even ``k`` uniform in the ball, ``ρ = R U^{1/d²}`` (``U``
    uniform on ``[0, 1)``); for odd ``k`` log-uniform in the logits' scale, ``ρ = min(R, e^u)`` with
    ``u`` uniform between ``log(0.1/max c)`` and ``log(10/min c)`` (``10/min c`` capped at ``R``, or at
    ``0.1/max c`` when that is larger; ``c`` ranges over the positive ``||x_it||·||z_i||`` and
    ``||x_it − x_iu||·||z_i||``, the sizes on which the weights vary). From the ``starts`` best,
    projected ascent on ``||J(W)||₂`` (gradient by autograd through ``jacrev`` and ``eigvalsh``):
    normalised steps of length ``η``, from ``η = R/4``, halved on every non-improving step (an
    ascent stops when ``η < 10⁻⁹·R``), projected back onto the ball. Deterministic: all randomness comes from
    ``numpy.random.default_rng(seed)``.

    Every candidate lies in the ball and ``||J(W)||₂ ≤ Lip_R`` at each, so the result is a lower
    bound on the true constant up to the SVD's rounding (``~ (nT + d²)·eps`` relative); for
    ``linear`` the Jacobian is constant and the estimate is ``||𝓛||₂``.

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710.

    Args:
      inst: the data.
      kind, wrt, radius, of: as :func:`lipschitz_bound`.
      seed: seed of the sampler.
      samples: random points drawn (≥ 0).
      steps: ascent steps per start (≥ 0).
      starts: how many of the best candidates are ascended (≥ 1).

    Scale: any finite data and radius. The search runs on the data rescaled to O(1) by exact powers
    of two, on the ball ``R·2^(eX+ez)`` capped where the logits reach ``2^SATURATION_LOG2`` (beyond, the
    Jacobian is 0 to float64, so the capped search searches the whole ball); the value is put back
    exactly (``2^(eX+ez)``, outputs ``2^(2eX+ez+ev)``), so the estimate is exactly equivariant.
    Accuracy: ``value`` is ``||J(W)||₂`` at the returned ``W`` (:func:`jacobian_norm`, each sequence on
    its own O(1) scale, so sequences of any relative size are resolved) to ``~(nT + d²)·eps`` relative
    plus the Jacobian's absolute rounding (``_jacobian_floors``); below that floor it raises rather than
    returning an unresolved number. Exactly 0, with ``W = 0`` and no search, when the map is constant
    for the data (``_structurally_zero``, decided on the original data). The search itself runs on one
    common rescaling of ``X`` and ``z`` (separately, also for self-attention); where sequences' sizes
    differ by more than ~``2^1000`` it sees their logits only approximately, and the returned value is
    still attained (a lower bound).

    Masks: the map of the instance with the masked tokens deleted (module docstring): the search's
    Jacobian uses the masked head (weight 0 at masked tokens) and the allowed rows of the logit Gram,
    the candidate ``V₁`` is the top singular vector of the allowed rows, and the sampling scales and the
    search cap come from the allowed tokens; the returned value is :func:`jacobian_norm` of the masked
    instance at ``W``, which equals that of the deleted data. Masked tokens of any finite size change
    nothing.

    Returns:
      :class:`LipschitzEstimate`; ``.W`` (shape ``(d, d)``) attains ``.value``.

    Raises:
      NumericalError: the estimate is outside ``[2.2e-308, 1.8e308]``, or ``||W||_F`` of its attaining
        point is (the data so large that the point underflows), or no point searched, down to
        ``W = 0``, has a Jacobian above its float64 rounding level (every sequence's tokens nearly
        coincide). A point whose Jacobian is below that level (saturated: two tied tokens at huge
        logits) is passed over for the next largest one that resolves.
    """
    require("torch", feature="lipschitz_estimate")  # pragma: no mutate
    import torch

    _check_common(kind, of, wrt)
    R = _check_radius(radius)
    samples = check_int(samples, "samples", low=0)
    steps = check_int(steps, "steps", low=0)
    starts = check_int(starts, "starts", low=1)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AttnSVMError(f"seed must be an integer; got {seed!r}")
    if _structurally_zero(inst, kind, of):
        # The map is constant (decided exactly on the ORIGINAL data): the constant is exactly 0, attained
        # at W = 0. Returned before any rescaling or search, whose intermediates (z·Wᵀ before it meets
        # X = 0) can overflow at radii near 1.8e308 and used to be reported as "logits beyond float64".
        return LipschitzEstimate(
            value=0.0,
            W=np.zeros((inst.d, inst.d)),
            kind=kind,
            of=of,
            wrt=wrt,
            radius=R,
            seed=int(seed),
            samples=samples,
            steps=steps,
            evaluations=0,
            search_value=0.0,
        )
    # Scale: the search runs on the data rescaled by exact powers of two (X/2^eX, z/2^ez, v/2^ev, all
    # O(1)) on the ball of radius R·2^(eX+ez): the same map up to the factor 2^k of the Jacobian
    # (k = eX + ez for the weights, 2eX + ez + ev for the output), put back at the end.
    orig, R_orig = inst, R
    inst, eX, ez, ev = _normalized(orig)
    shift, k_out = _jacobian_shift(eX, ez, ev, of)
    R = _search_radius(inst, R_orig, shift)
    n, T, d = inst.shape
    X = torch.as_tensor(np.array(inst.X), dtype=torch.float64)
    z = torch.as_tensor(np.array(inst.z), dtype=torch.float64)
    a = torch.as_tensor(_values(inst), dtype=torch.float64)
    # The search needs the logit Gram G only up to a positive factor (it compares values and follows
    # normalised gradients), so it uses the scaled Gram M = G·2^(−2E) of ``_kron_gram``, whose largest
    # diagonal entry is ≥ 1/64: no refusal when G itself leaves float64's range (logit_gram would
    # refuse, e.g. when every sequence's ||z_i||·||x_it|| is tiny although X and z are not).
    # σ(W) below is therefore ||J̃(W)||₂·2^(−E); the returned value is recomputed independently.
    sp = _Split(inst)
    G_np, E_gram = _kron_gram(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones)
    G4 = torch.as_tensor(G_np.reshape(n, T, n, T), dtype=torch.float64)
    # ∂(head)/∂l per sequence: (n, T, T) for weights, (n, 1, T) for the output.
    # Masks: the masked head (0 rows and columns at masked tokens, ``_torch_masked_head``); the weights'
    # eigenproblem keeps the allowed rows only (``keep``), as for the deleted instance.
    keep = None
    if orig.mask is None:
        dhead = torch.func.vmap(torch.func.jacrev(_torch_head(kind, of), argnums=0))
    else:
        mt = torch.as_tensor(np.array(orig.mask))
        dmask = torch.func.vmap(torch.func.jacrev(_torch_masked_head(kind, of), argnums=0))

        def dhead(l: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
            return dmask(l, a, mt)

        if of == "weights":
            keep = torch.as_tensor(np.flatnonzero(orig.mask))

    def sigma(w: torch.Tensor) -> torch.Tensor:
        l = torch.einsum("ntd,nd->nt", X, z @ w.reshape(d, d).T)
        D = dhead(l, a)  # (n, k, T)
        M = torch.einsum("iab,ibjc,jdc->iajd", D, G4, D).reshape(n * D.shape[1], n * D.shape[1])
        if keep is not None:
            M = M[keep][:, keep]
        if not bool(torch.isfinite(M).all()):  # logits beyond float64: reported by value()
            return torch.full((), math.nan, dtype=torch.float64)
        lam = torch.linalg.eigvalsh(M)[-1]
        return torch.sqrt(torch.clamp(lam, min=0.0))

    count = 0

    def value(w: FloatArray) -> float:
        nonlocal count
        count += 1
        with torch.no_grad():
            val = float(sigma(torch.as_tensor(w, dtype=torch.float64)))
        if not math.isfinite(val):
            raise NumericalError(
                f"the {kind} {of} Jacobian is not finite at a point with ||W||_F = {_fro(w):.3g}; "
                "the radius is too large for float64 logits, use a smaller radius"
            )
        return val

    def grad(w: FloatArray) -> FloatArray:
        wt = torch.as_tensor(w, dtype=torch.float64).clone().requires_grad_(True)
        (g,) = torch.autograd.grad(sigma(wt), wt)
        return np.asarray(g.detach().numpy())

    rng = np.random.default_rng(seed)
    # Structured candidates: the origin and the top right singular vector of the logit map.
    cands: list[FloatArray] = [np.zeros(d * d)]
    if _lam_max(G_np) > 0.0:
        if sp.rows is None:
            _, vecs = np.linalg.eigh(G_np)
            u = vecs[:, -1].reshape(n, T)
        else:  # the allowed rows' Gram (the deleted instance's), its eigenvector put back with 0s
            _, vecs = np.linalg.eigh(G_np[np.ix_(sp.rows, sp.rows)])
            uf = np.zeros(n * T)
            uf[sp.rows] = vecs[:, -1]
            u = uf.reshape(n, T)
        V1 = np.einsum("it,itd,ie->de", u, inst.X, inst.z)  # Σ u_it x_it z_iᵀ ∝ 𝓛ᵀu
        nv = float(np.linalg.norm(V1))
        if nv > 0.0:
            v1 = (V1 / nv).reshape(-1)  # row-major, matching w.reshape(d, d) in sigma
            for t in (0.25, 0.5, 1.0, -0.25, -0.5, -1.0):
                cands.append(t * R * v1)
    # Logit scales: |l_it| ≤ ||W||_F c_it with c_it = ||x_it|| ||z_i||, and logit differences
    # |l_it − l_iu| ≤ ||W||_F ||x_it − x_iu|| ||z_i||; the weights vary on ||W|| ~ 1/scale, so half
    # the samples are log-uniform in radius over [0.1/max scale, 10/min scale] ∩ (0, R].
    zn = np.linalg.norm(inst.z, axis=1)
    c = np.linalg.norm(inst.X, axis=-1) * zn[:, None]
    dif = np.linalg.norm(inst.X[:, :, None, :] - inst.X[:, None, :, :], axis=-1) * zn[:, None, None]
    # (masks: a masked token is 0 here, so its scales are 0, dropped, or ||x_it − 0||·||z_i|| = c_it,
    # already among the scales: the deleted instance's lo_r and hi_r, and no scale of the masked token)
    scales = np.concatenate([c.ravel(), dif.ravel()])
    scales = scales[scales > 0]
    lo_r = 0.1 / float(np.max(scales)) if scales.size else R
    # tokens far below the largest ones (1e-300 next to 1) would give hi_r = inf: cap at the ball
    hi_r = min(10.0 / float(np.min(scales)), max(R, lo_r)) if scales.size else R
    for k in range(samples):
        g = rng.standard_normal(d * d)
        g /= np.linalg.norm(g)
        if k % 2 == 0 or not lo_r > 0.0:  # (lo_r = R = 0: R·2^(eX+ez) underflowed, the ball is {0})
            rad = R * rng.random() ** (1.0 / (d * d))  # uniform in the ball
        else:
            rad = min(R, math.exp(rng.uniform(math.log(lo_r), math.log(max(hi_r, lo_r)))))
        cands.append(rad * g)
    vals = [value(c) for c in cands]
    order = np.argsort(vals, kind="stable")[::-1][:starts]
    found = list(zip(vals, cands, strict=True))  # every point searched, with its search value
    if kind != "linear":  # the linear Jacobian is constant: nothing to ascend
        for idx in order:
            w = cands[int(idx)].copy()
            cur = vals[int(idx)]
            eta = min(R, hi_r) / 4.0
            for _ in range(steps):
                g = grad(w)
                gn = float(np.linalg.norm(g))
                if not math.isfinite(gn) or gn == 0.0:
                    break
                trial = _project(w + eta * g / gn, R)
                tv = value(trial)
                if tv > cur:
                    w, cur = trial, tv
                else:
                    eta *= 0.5
                    if eta < 1e-9 * R:
                        break
            found.append((cur, w))
    # Independent recomputation at the attaining point: full autograd Jacobian, largest singular value.
    # The point of largest search value may be one whose Jacobian is below its own rounding floor (e.g.
    # a candidate t·R·V₁ that keeps two tokens tied at huge logits: the floor grows like eps·|l|): then
    # the next point is tried, in decreasing search value, down to W = 0; only when none resolves does
    # the estimate refuse (every sequence's tokens nearly coincide).
    pair = None
    for val, w in sorted(found, key=lambda vw: vw[0], reverse=True):
        pair = _jacobian_pair(orig, kind, of, w, shift, unresolved="none")
        if pair is not None:
            best_val, best_w = val, w
            break
    if pair is None:
        best_val, best_w = max(found, key=lambda vw: vw[0])
        pair = _jacobian_pair(orig, kind, of, best_w, shift)  # raises, naming the rounding floor
    assert pair is not None  # (for mypy: the call above raises when it would be None)
    full_m, full_e = pair
    est_value = _scaled_back(full_m, full_e, f"the {kind} {of} Lipschitz estimate (radius {R_orig:.3g})")
    W_back = np.ldexp(best_w, -shift)  # exact unless an entry falls below 2^-1022 (checked next)
    nrm = _fro(best_w)
    if nrm > 0.0:
        # ||W|| = ||W̃||·2^-shift must be a normal double for W to be the attaining point
        log_w = math.log(nrm) - shift * _LN2
        check_log_representable(
            "the norm ||W||_F of the estimate's attaining point W",
            log_w,
            remedy="Rescale X or z by a power of two (W scales inversely)",
        )
    return LipschitzEstimate(
        value=est_value,
        W=np.asarray(W_back.reshape(d, d)),
        kind=kind,
        of=of,
        wrt=wrt,
        radius=R_orig,
        seed=int(seed),
        samples=samples,
        steps=steps,
        evaluations=count,
        search_value=_pair_value(float(best_val), k_out + E_gram),
    )


def jacobian_norm(inst: Instance, W: ArrayLike, *, kind: str = "softmax", of: str = "weights") -> float:
    """Spectral norm ``||J(W)||₂`` of the Jacobian of ``W ↦ s(W)`` (or ``f(W)``) at one point.

    ``J = ∂ vec s / ∂ W``, shape ``(nT, d²)`` (``(n, d²)`` for ``of="output"``), from
    ``torch.func.jacrev`` in float64; its largest singular value. ``||J(W)||₂ ≤ Lip_R`` for every
    ``||W||_F ≤ R``, so this is the local quantity that :func:`lipschitz_estimate` maximises.

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710.

    Args:
      inst: the data.
      W: the point, shape ``(d, d)``, finite.
      kind: ``"softmax"``, ``"linear"`` or ``"normalized_linear"``.
      of: ``"weights"`` or ``"output"``.

    Scale: any finite data. Each sequence is evaluated on its own O(1) rescaling by exact powers of
    two, ``x_it/2^a_i``, ``z_i/2^b_i``, ``v/2^ev``, at ``W·2^(a_i+b_i)`` (the same logits), giving its
    block ``J_i/2^(a_i+b_i)`` (outputs ``/2^(2a_i+b_i+ev)``); the blocks are stacked on the scale of the
    largest and the power of two put back exactly, so the value is exactly equivariant and sequences of
    any relative size are resolved (``J`` is not block diagonal: the sequences share ``W``, so
    ``||J||₂`` is neither the max nor the root-sum of the blocks' norms but lies between them).
    Accuracy: ``~(nT + d²)·eps`` relative plus an absolute floor (``_jacobian_floors``: the autograd
    Jacobian's rounding, which grows with the logits, summed in quadrature over the sequences); a
    value at or below that floor raises (the attention is saturated at ``W``: the true value cannot be
    resolved), except that a Jacobian identically 0 for the data (``_structurally_zero``, decided
    exactly on the original data, before any rescaling) returns 0.

    Masks: ``J`` has the rows of the allowed weights only (``Σ_i T_i`` rows; outputs ``n``), each
    sequence's block the Jacobian of its allowed tokens' map (masked weights are 0 for every ``W``), and
    the per-sequence scale, floor and structural-zero test read the allowed tokens only: the value of
    the instance with the masked tokens deleted. A sequence with one allowed token has a 0 block (its
    normalised weight is the constant 1).

    Returns:
      ``||J(W)||₂`` (a float).

    Raises:
      NumericalError: the value is outside ``[2.2e-308, 1.8e308]``; ``W`` on a sequence's scale (the
        logits) overflows; or the value is below the rounding level of its computation.
    """
    _check_common(kind, of, "W")
    Wa = inst.check_weights(W)
    # Structural zero is decided on the ORIGINAL data (on rescaled data an underflowed sequence looks
    # like a zero one: the "silent 0" of issue 13).
    if _structurally_zero(inst, kind, of):
        return 0.0
    # Scale: each sequence is evaluated on its own O(1) rescaling at the same logits and the blocks are
    # combined on the scale of the largest (``_jacobian_pair``); the power of two is put back at the end.
    pair = _jacobian_pair(inst, kind, of, Wa, 0)
    assert pair is not None  # (for mypy: unresolved="raise" raises instead of returning None)
    m, e = pair
    return _scaled_back(m, e, f"the {kind} {of} Jacobian norm ||J(W)||_2")


def _values(inst: Instance) -> FloatArray:
    """``a_it = vᵀx_it`` of O(1) (normalised) data; a value below 2^-1022 is negligible here."""
    with np.errstate(under="ignore"):
        return np.asarray(inst.X @ inst.v)


def _normalized(inst: Instance) -> tuple[Instance, int, int, int]:
    """``(inst with X/2^eX, z/2^ez, v/2^ev, eX, ez, ev)``: exact rescaling, largest entries in ``[½, 1)``.

    ``X``, ``z`` and ``v`` each get their own exponent, also for self-attention: the maps depend on
    the data only through ``x_it``, ``z_i`` and ``v`` (the logits ``x_itᵀ W z_i`` and the values
    ``vᵀx_it``), never on ``z_i`` being a copy of ``x_i0``, so the result is a cross-attention instance
    with ``z̃ = z/2^ez``. (Giving ``z = x_i0`` the exponent of ``X`` left ``z̃`` tiny when the first
    tokens are far smaller than the others — ``2^−600`` next to tokens of size 1 — and the logit Gram
    ``||z̃||²||x̃||²`` of the rescaled data underflowed although the constant is representable.)
    A masked instance keeps its mask; its masked tokens become 0 (the keys), so they set no exponent.
    Entries more than ``2^1022`` below their array's largest land in the subnormal band (normwise
    negligible).
    """
    eX = pow2_exponent(inst.keys)  # masks: the keys (masked tokens 0) set the scale, and are kept
    ez = pow2_exponent(inst.z)
    ev = pow2_exponent(inst.v)
    with np.errstate(under="ignore"):
        X = np.ldexp(inst.keys, -eX)
        v = np.ldexp(inst.v, -ev)
        z = np.ldexp(inst.z, -ez)
    return Instance(X, inst.Y, v, z, mask=inst.mask), eX, ez, ev


def _jacobian_shift(eX: int, ez: int, ev: int, of: str) -> tuple[int, int]:
    """``(shift, k)``: ``W = W̃·2^-shift`` and ``||J|| = ||J̃||·2^k`` for the rescaled data.

    Logits ``xᵀWz = x̃ᵀW̃z̃`` with ``W̃ = W·2^(eX+ez)``; the weights Jacobian ``∂s/∂W = 2^(eX+ez) ∂s̃/∂W̃``;
    the output ``f = 2^(eX+ev) f̃`` adds ``eX + ev``.
    """
    shift = eX + ez
    return shift, shift + (eX + ev if of == "output" else 0)


#: The search is confined to the logits ``|l| ≤ 2^SATURATION_LOG2``: far beyond the point (``|l|`` of a
#: few thousand) where every weight other than the largest is below float64's range, so the Jacobian
#: there is 0 to float64 and the confined search is still a search of the whole ball.
SATURATION_LOG2 = 900


def _search_radius(inst: Instance, R: float, shift: int) -> float:
    """The ball ``R·2^shift`` of the rescaled data, capped where the logits reach ``2^SATURATION_LOG2``
    and where the search's intermediates ``W z_i`` and ``x_itᵀ(W z_i)`` would leave float64.

    ``||𝓛||_F`` bounds every logit, so ``||W|| ≤ 2^SATURATION_LOG2/||𝓛||_F`` keeps them below
    ``2^SATURATION_LOG2``; when sequences have reciprocal scales (large tokens with a small query in one,
    the reverse in another) ``||𝓛||_F`` is tiny although ``max||x||`` and ``max||z||`` are O(1), and that cap
    exceeds float64 (it read ``inf`` and the search failed with "radius too large"): the second cap
    ``2^(SATURATION_LOG2+100)/(max||x||·max||z||)`` keeps ``|W z_i| ≤ ||W||·max||z||`` and every logit finite.
    """
    finite_log2 = SATURATION_LOG2 + 100  # 2^1000: finite with room for the d-term sums of the products
    with np.errstate(over="ignore", under="ignore"):
        Rn = float(np.ldexp(R, shift))
        xn = np.linalg.norm(inst.X, axis=-1)
        zn = np.linalg.norm(inst.z, axis=1)
    lf = float(np.linalg.norm(xn * zn[:, None]))
    big = float(np.max(xn)) * float(np.max(zn))
    # (a quotient beyond 1.8e308 is inf, never an exception, and the min discards it)
    cap = min(
        math.ldexp(1.0, SATURATION_LOG2) / lf if lf > 0 else math.inf,
        math.ldexp(1.0, finite_log2) / big if big > 0 else math.inf,
        FLOAT_MAX,
    )
    return min(Rn, cap)


def _scaled_back(val: float, k: int, what: str) -> float:
    """``val · 2^k`` when it is a normal double (or exactly 0); otherwise the scale contract's error."""
    if val == 0.0:
        return 0.0
    m, e = math.frexp(val)
    if not -1021 <= e + k <= 1024:
        raise range_error(what, math.log(m) + (e + k) * _LN2, remedy="Rescale X, z or v by a power of two")
    return math.ldexp(m, e + k)


#: Absolute rounding of the autograd Jacobian of one sequence on its own O(1) scale, in units of
#: ``eps·||𝓛_i||_F`` (weights) or ``eps·||𝓛_i||_F·T·max_t |x_t|·|v|`` (outputs, ``|·|`` entrywise): each
#: entry is a T-term sum of products of weights with ``z_j x_k`` (``T + 2`` roundings), the weights carry
#: the logits' rounding (``≤ 2d·eps·(1 + |l|)`` relative, and their derivative is at most ½ per logit),
#: and the SVD adds ``(nT + d²)·eps·||J||``; 4 ulps of headroom per term.
JACOBIAN_ULPS = 4.0


def _jacobian_floors(
    Xh: FloatArray,
    zh: FloatArray,
    vh: FloatArray,
    Wh: FloatArray,
    kind: str,
    of: str,
    counts: Int64Array | None = None,
) -> FloatArray:
    """Absolute error bound of each sequence's computed Jacobian block on its own O(1) scale, ``(n,)``.

    ``Xh``, ``zh``, ``vh``: the data rescaled per sequence (largest entries in ``[½, 1)``); ``Wh``: each
    sequence's point on that scale, ``(n, d²)``. The ``nT`` of the SVD term counts every row of ``J``.
    ``counts``: a masked instance's allowed tokens per sequence ``T_i`` (``Xh`` its keys, masked tokens
    0): ``T_i`` replaces ``T`` and ``Σ_i T_i`` replaces ``nT``, the floors of the deleted instance.
    """
    n, T, d = Xh.shape
    if counts is not None:
        return _jacobian_floors_counts(Xh, zh, vh, Wh, kind, of, counts)
    with np.errstate(under="ignore"):  # entries 2^1022 below their sequence's largest: negligible here
        xn = np.linalg.norm(Xh, axis=-1)
        zn = np.linalg.norm(zh, axis=1)
        c = xn * zn[:, None]  # (n, T): ||x_it||·||z_i||
        lf = np.linalg.norm(c, axis=1)  # ||𝓛_i||_F
        lam = np.max(c, axis=1) * np.array([_fro(w) for w in Wh])  # max |logit| of each sequence
    # output: ∂f/∂l_t = s_t(a_t − f) (or a_t for linear) is of the size of the values, whose own
    # rounding is ≤ d·eps·|x_t|·|v| (absolute products): the scale is max_t |x_t|·|v|, T terms
    with np.errstate(under="ignore"):
        a = np.ones(n) if of == "weights" else T * np.max(np.abs(Xh) @ np.abs(vh), axis=1)
    return np.asarray(JACOBIAN_ULPS * (n * T + d * d + T + 2 + 2 * d * (1.0 + lam)) * _EPS * lf * a)


def _jacobian_floors_counts(
    Xh: FloatArray, zh: FloatArray, vh: FloatArray, Wh: FloatArray, kind: str, of: str, counts: Int64Array
) -> FloatArray:
    """:func:`_jacobian_floors` with ``T_i`` allowed tokens per sequence (masked keys are 0)."""
    n, _, d = Xh.shape
    Ti = counts.astype(np.float64)
    with np.errstate(under="ignore"):
        xn = np.linalg.norm(Xh, axis=-1)
        zn = np.linalg.norm(zh, axis=1)
        c = xn * zn[:, None]
        lf = np.linalg.norm(c, axis=1)
        lam = np.max(c, axis=1) * np.array([_fro(w) for w in Wh])
    with np.errstate(under="ignore"):
        a = np.ones(n) if of == "weights" else Ti * np.max(np.abs(Xh) @ np.abs(vh), axis=1)
    m = float(np.sum(Ti))
    return np.asarray(JACOBIAN_ULPS * (m + d * d + Ti + 2 + 2 * d * (1.0 + lam)) * _EPS * lf * a)


def _zero_sequences(inst: Instance, kind: str, of: str) -> NDArray[np.bool_]:
    """Per sequence, whether its Jacobian block ``J_i(W)`` is 0 at every ``W``, decided exactly on the data.

    Sequence ``i`` contributes nothing when ``z_i = 0`` or all its tokens are equal (the weights
    Jacobian is ``D_i 𝓛_i`` with ``D_i 1 = 0``); for the output also when all its values ``vᵀx_it``
    are equal, which holds exactly when ``v_k = 0`` or ``x_itk = x_i0k`` for every coordinate ``k``
    (for linear outputs: all values 0, i.e. every token orthogonal to ``v`` term by term, or ``v = 0``).

    Masks: over the allowed tokens only (the masked ones have weight 0 for every ``W``): compared with
    the sequence's first allowed token, so a sequence with one allowed token is constant for the
    normalised kinds; for linear, the keys (masked tokens read as 0) decide it.
    """
    if inst.mask is not None:
        return _zero_sequences_masked(inst, kind, of)
    X, z, v = inst.X, inst.z, inst.v
    zero_z = ~np.any(z != 0, axis=1)
    if kind == "linear":
        if of == "weights":
            return np.asarray(zero_z | ~np.any(X != 0, axis=(1, 2)))
        return np.asarray(zero_z | np.all((v[None, None, :] == 0) | (X == 0), axis=(1, 2)))
    same_x = np.all(X == X[:, :1, :], axis=(1, 2))
    if of == "weights":
        return np.asarray(zero_z | same_x)
    same_a = np.all((v[None, None, :] == 0) | (X == X[:, :1, :]), axis=(1, 2))
    return np.asarray(zero_z | same_x | same_a)


def _zero_sequences_masked(inst: Instance, kind: str, of: str) -> NDArray[np.bool_]:
    """:func:`_zero_sequences` of a masked instance: the allowed tokens of each sequence only."""
    X, z, v = inst.keys, inst.z, inst.v
    zero_z = ~np.any(z != 0, axis=1)
    if kind == "linear":  # (a masked token is a zero key: it never makes the block nonzero)
        if of == "weights":
            return np.asarray(zero_z | ~np.any(X != 0, axis=(1, 2)))
        return np.asarray(zero_z | np.all((v[None, None, :] == 0) | (X == 0), axis=(1, 2)))
    allowed = inst.allowed[:, :, None]
    first = X[np.arange(inst.n), np.argmax(inst.allowed, axis=1)][:, None, :]  # the first allowed token
    same = X == first
    same_x = np.all(same | ~allowed, axis=(1, 2))
    if of == "weights":
        return np.asarray(zero_z | same_x)
    same_a = np.all((v[None, None, :] == 0) | same | ~allowed, axis=(1, 2))
    return np.asarray(zero_z | same_x | same_a)


def _structurally_zero(inst: Instance, kind: str, of: str) -> bool:
    """``J(W) = 0`` at every ``W`` (every sequence's block, ``_zero_sequences``), on the ORIGINAL data."""
    return bool(np.all(_zero_sequences(inst, kind, of)))


def _jacobian_pair(
    inst: Instance, kind: str, of: str, W: FloatArray, wshift: int, *, unresolved: str = "raise"
) -> tuple[float, int] | None:
    """``||J(W·2^−wshift)||₂ = m·2^e`` on the ORIGINAL data ``inst``, as ``(m, e)`` with ``m ≥ ½``.

    ``J`` stacks the sequences' blocks ``J_i = ∂s_i/∂W`` (rows of sequence ``i``), which share ``W`` but
    not their scale. Scale: each sequence is rescaled on its own, ``X̂_i = X_i/2^a_i``, ``ẑ_i = z_i/2^b_i``,
    ``v̂ = v/2^ev`` (exact), and evaluated at ``Ŵ_i = W_true·2^(a_i+b_i)`` (the same logits, formed by
    ``ldexp``: no intermediate factor under- or overflows), so ``J_i = 2^k_i Ĵ_i`` with
    ``k_i = a_i + b_i`` (outputs add ``a_i + ev``). The blocks are then put on the common scale ``2^E`` of
    the largest (``Ĵ_i·2^(k_i−E)``, entries ``≤ 1``; an entry more than ``2^1022`` below the largest entry
    of ``J`` is normwise negligible) and ``||J||₂ = σ_max·2^E``. (A common rescaling of all sequences, as
    before, underflowed every block to 0 when one sequence has the largest tokens and another the
    largest query: the "silent 0" of issue 13.) Blocks of sequences that are 0 for every ``W``
    (``_zero_sequences``) are exactly 0.

    Raises NumericalError when ``Ŵ_i`` or the Jacobian is not finite (logits beyond float64), or when
    the norm is at or below the combined rounding floor ``(Σ_i (floor_i·2^k_i)²)^½`` (``_jacobian_floors``);
    with ``unresolved="none"`` the latter returns ``None`` instead (the estimate then tries its next point).

    Masks: the keys (masked tokens 0) set each sequence's scale, the masked head gives masked tokens
    weight 0 (0 rows and columns of the block), the floors use ``T_i`` and ``Σ_i T_i``, and the SVD runs on
    the allowed rows of the weights Jacobian: the deleted instance's ``J``.
    """
    require("torch", feature="the attained Jacobian (jacobian_norm, lipschitz_estimate)")  # pragma: no mutate
    import torch

    n, T, d = inst.shape
    live = ~_zero_sequences(inst, kind, of)
    # (masks: the keys, masked tokens 0: a masked token sets no sequence's scale)
    a = np.frexp(np.max(np.abs(inst.keys), axis=(1, 2)))[1].astype(np.int64)
    b = np.frexp(np.max(np.abs(inst.z), axis=1))[1].astype(np.int64)
    ev = pow2_exponent(inst.v)
    w = np.asarray(W, dtype=np.float64).reshape(-1)
    with np.errstate(under="ignore"):  # entries 2^1022 below their sequence's largest: negligible
        Xh = np.ldexp(inst.keys, -a[:, None, None])
        zh = np.ldexp(inst.z, -b[:, None])
        vh = np.ldexp(inst.v, -ev)
        ah = Xh @ vh
    if kind == "linear":
        Wh = np.zeros((n, d * d))  # the linear Jacobian does not depend on W
    else:
        with np.errstate(over="ignore", under="ignore"):
            # Ŵ_i = W·2^(a_i+b_i−wshift) by ldexp (a subnormal or 0 entry is a logit error ≤ d·2^-1074)
            Wh = np.where(live[:, None], np.ldexp(w[None, :], (a + b - wshift)[:, None]), 0.0)
        if not np.all(np.isfinite(Wh)):
            i = int(np.argmax(~np.all(np.isfinite(Wh), axis=1)))
            big = float(np.max(np.abs(w)))
            raise range_error(
                f"the {kind} {of} Jacobian is not finite: the largest entry of W on the data's scale, "
                "W·max|x|·max|z| (the logits' size),",
                math.log(big) + (int(a[i] + b[i]) - wshift) * _LN2,
                remedy="Use a smaller W or rescale the data",
            )
    tens = [torch.as_tensor(np.array(t), dtype=torch.float64) for t in (Wh, Xh, zh, ah)]
    if inst.mask is None:
        head = _torch_head(kind, of)

        def block(wi: torch.Tensor, Xi: torch.Tensor, zi: torch.Tensor, ai: torch.Tensor) -> torch.Tensor:
            return head(Xi @ (wi.reshape(d, d) @ zi), ai)  # logits l_t = x̂_tᵀ Ŵ ẑ (row-major Ŵ)

        J = torch.func.vmap(torch.func.jacrev(block, argnums=0))(*tens).detach().numpy()  # (n, r, d²)
    else:
        mhead = _torch_masked_head(kind, of)

        def mblock(
            wi: torch.Tensor, Xi: torch.Tensor, zi: torch.Tensor, ai: torch.Tensor, mi: torch.Tensor
        ) -> torch.Tensor:
            return mhead(Xi @ (wi.reshape(d, d) @ zi), ai, mi)

        tens.append(torch.as_tensor(np.array(inst.mask)))
        J = torch.func.vmap(torch.func.jacrev(mblock, argnums=0))(*tens).detach().numpy()
    if not np.all(np.isfinite(J)):
        nrm_m, nrm_e = math.frexp(_fro(w))
        raise NumericalError(
            f"the {kind} {of} Jacobian is not finite at a point with ||W||_F = "
            f"{_pair_value(nrm_m, nrm_e - wshift):.3g} "
            "(logits beyond float64 range); use a smaller radius or rescale the data"
        )
    J = np.where(live[:, None, None], J, 0.0)
    k = a + b + ((a + ev) if of == "output" else 0)
    mx = np.max(np.abs(J), axis=(1, 2))
    nz = mx > 0
    counts = None if inst.mask is None else np.count_nonzero(inst.mask, axis=1)
    floors = np.where(live, _jacobian_floors(Xh, zh, vh, Wh, kind, of, counts), 0.0)
    # E: the exponent of the largest block entry or floor (live sequences have a positive floor), so
    # both are ≤ 1 on the common scale (no overflow of the floor's sum of squares)
    E = int(np.max((k + np.frexp(np.maximum(mx, floors))[1])[live]))
    with np.errstate(under="ignore"):
        # Scale: the blocks on the common scale 2^E of the largest (entries ≤ 1), not one rescaling for all
        Js = np.ldexp(J, (k - E)[:, None, None])
        floor = math.sqrt(float(np.sum(np.ldexp(floors, k - E) ** 2)))
    Jf = Js.reshape(-1, d * d)
    if inst.mask is not None and of == "weights":
        Jf = Jf[np.flatnonzero(inst.mask)]  # the rows of the allowed weights: the deleted instance's J
    val = float(np.linalg.svd(Jf, compute_uv=False)[0]) if nz.any() else 0.0
    if val > floor:
        m, e = math.frexp(val)
        return m, e + E
    if unresolved == "none":
        return None
    raise NumericalError(
        f"the {kind} {of} Jacobian norm at this W is below the rounding level of its float64 "
        f"computation ({val:.3g} ≤ {floor:.3g} on the sequences rescaled to O(1)): the attention is "
        "saturated there (logit gaps beyond ~36) or the tokens (for outputs: the values vᵀx_it) nearly "
        "coincide, and its value cannot be resolved. Use lipschitz_bound for a certified upper bound, or a point with smaller logits"
    )


# --------------------------------------------------------------------------- comparison
def _ratio(x: float, y: float, what: str) -> float:
    """``x / y`` of two numbers ``≥ 0`` with the conventions of :func:`compare_lipschitz`:
    ``0/0 = 1`` (both constants 0: equal), ``x/0 = inf`` (``x > 0``), ``0/y = 0``; a quotient of
    positive numbers that leaves float64's normal range raises the scale contract's error."""
    if y == 0.0:
        return 1.0 if x == 0.0 else math.inf
    if x == 0.0:
        return 0.0
    r = x / y  # Python floats: inf on overflow, 0 or a subnormal on underflow (checked next)
    if not FLOAT_TINY <= r <= FLOAT_MAX:  # an overflow to inf or a (subnormal) underflow
        raise range_error(what, math.log(x) - math.log(y), remedy="Compare the logarithms of the two numbers")
    return r


def _gap(b: float, e: float) -> float:
    """``bound / estimate`` with the conventions of :func:`_ratio` (``0/0 = 1``, ``b/0 = inf``).

    Never out of range, so no range check: the bound is certified (``b ≥ e``, never below 2^-1022·e), and
    a returned estimate exceeds its rounding floor ``≥ JACOBIAN_ULPS·(nT + d²)·eps`` times the scale that
    also bounds the bound (``||𝓛_i||_F``, times the values' size for outputs; ``_jacobian_floors``), so
    ``b/e ≲ 1/eps``, far below 1.8e308.
    """
    if e == 0.0:
        return 1.0 if b == 0.0 else math.inf
    return b / e


def compare_lipschitz(
    instances: Sequence[Instance],
    radii: Sequence[float],
    *,
    of: str = "weights",
    seed: int = 0,
    samples: int = 32,
    steps: int = 20,
) -> list[dict[str, Any]]:
    """Bound and estimate per kind for every (instance, radius), with the softmax ratios.

    One row per ``(instance index, radius)`` with, for each kind ``k``, ``bound_k``, ``estimate_k``
    and ``gap_k = bound_k / estimate_k``, and the ratios ``softmax/linear`` and
    ``softmax/normalized_linear`` of bounds (``bound_ratio_*``) and of estimates (``estimate_ratio_*``).
    An estimate ratio above 1 means softmax is *less* stable than the other kind on that ball, as
    attained (not just bounded).

    Ratios at 0 (every ratio ``x / y`` of the row, never NaN):

    * ``0 / 0 = 1``: both numbers are exactly 0 only when both constants are 0 (a bound of 0 certifies
      the constant 0, an estimate of 0 is returned only for a Jacobian identically 0), so the bound is
      exact (gap 1) and the two kinds are equally stable (ratio 1);
    * ``x / 0 = inf`` for ``x > 0``: the estimate is 0 (the Jacobian identically 0) while the bound is
      positive, or the other kind's constant is 0 while softmax's is not: the exact ratio is unbounded;
    * ``0 / y = 0`` for ``y > 0``, exactly.

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710.

    Args:
      instances: the data sets.
      radii: ball radii ``R > 0``.
      of: ``"weights"`` or ``"output"``.
      seed, samples, steps: passed to :func:`lipschitz_estimate`.

    Scale: as :func:`lipschitz_bound` and :func:`lipschitz_estimate` (it raises what they raise);
    each ratio of two positive numbers is their correctly rounded quotient when that is a normal
    double, otherwise :class:`~attnsvm.NumericalError` names it (never a silent ``inf`` or 0).

    Returns:
      A list of dicts (table rows), ``len(instances) · len(radii)`` of them.
    """
    if of not in OFS:
        raise unknown_name("Lipschitz map 'of'", of, OFS)
    rs = [_check_radius(r) for r in radii]

    rows: list[dict[str, Any]] = []
    for idx, inst in enumerate(instances):
        check_instance(inst, f"instances[{idx}]")
        for R in rs:
            row: dict[str, Any] = {"instance": idx, "shape": inst.shape, "radius": R, "of": of}
            for kind in KINDS:
                b = float(lipschitz_bound(inst, kind=kind, radius=R, of=of))
                e = float(
                    lipschitz_estimate(
                        inst, kind=kind, radius=R, of=of, seed=seed, samples=samples, steps=steps
                    )
                )
                row[f"bound_{kind}"] = b
                row[f"estimate_{kind}"] = e
                row[f"gap_{kind}"] = _gap(b, e)
            for other in ("linear", "normalized_linear"):
                for what in ("bound", "estimate"):
                    row[f"{what}_ratio_softmax/{other}"] = _ratio(
                        row[f"{what}_softmax"],
                        row[f"{what}_{other}"],
                        f"the {what} ratio softmax/{other} (radius {R:.3g})",
                    )
            rows.append(row)
    return rows
