"""The Att-SVM of an instance in unit-row form: rows, their exact factor, margins, and the way back to data scale.

Every solver divides each row ``a_it = z_i ⊗ Δ_it`` by its norm ``||Δ_it||·||z_i||`` (an exact
reformulation, kept as mantissa·2^E so nothing of the size of the data is squared or multiplied out),
solves the unit-row problem and puts the scale back as a power of two
(``W_mm(aX, bz) = W_mm(X, z)/(ab)``, multipliers by ``1/(ab)²``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import scaling
from .._types import FloatArray, IntArray
from ..errors import AttnSVMError, InfeasibleSVMError
from ..model._instance import Instance
from ..model._tensor import SVMConstraints, constraint_pairs
from ._constants import MAX_FACTOR_ENTRIES, MULTIPLIER_RTOL
from ._dual import _factor_from_gram, _pow2_str
from ._results import InfeasibleMinNormError, Pairs


# ============================================================================ Att-SVM
@dataclass(frozen=True)
class _SVMFactor:
    """Exact compressed factor of the Att-SVM rows: ``a_r = (Q_z ⊗ Q_Δ)(c^z_r ⊗ c^Δ_r)``.

    ``Q_Δ`` (``d × p_Δ``) and ``Q_z`` (``d × p_z``) are orthonormal bases of the spans of the ``Δ``'s and
    the queries, so ``a_r = P l_r`` with ``P = Q_z ⊗ Q_Δ`` orthonormal and ``l_r = (Q_zᵀz_r) ⊗ (Q_Δᵀ Δ_r)``,
    of length ``p_Δ·p_z ≤ min(d, m)·min(d, n)``; a second QR compresses it to width ``≤ m``. The least-norm
    ``W`` lies in ``span(Δ) ⊗ span(z)``, so ``W = Q_Δ U Q_zᵀ`` with ``vec(U) = Q₂ u``.
    """

    L: FloatArray
    Qd: FloatArray | None
    Qz: FloatArray | None
    Q2: FloatArray | None

    def to_W(self, u: FloatArray) -> FloatArray | None:
        if self.Qd is None or self.Qz is None:
            return None
        uc = self.Q2 @ u if self.Q2 is not None else u
        U = uc.reshape((self.Qd.shape[1], self.Qz.shape[1]), order="F")
        return np.asarray(self.Qd @ U @ self.Qz.T, dtype=np.float64)


def _svm_factor(zhat: FloatArray, c: SVMConstraints) -> _SVMFactor:
    """The exact compressed factor of the (unit-row) Att-SVM rows ``c``; ``zhat`` the ``(n, d)`` queries."""
    m = c.pairs.shape[0]
    Qd, _ = np.linalg.qr(c.deltas.T)  # d × min(d, m), orthonormal columns spanning the Δ's
    Qz, _ = np.linalg.qr(zhat.T)  # d × min(d, n)
    pd, pz = Qd.shape[1], Qz.shape[1]
    if m * pd * pz > MAX_FACTOR_ENTRIES:
        K = (c.queries @ c.queries.T) * (c.deltas @ c.deltas.T)
        return _SVMFactor(_factor_from_gram(K), None, None, None)
    cd = c.deltas @ Qd
    cz = c.queries @ Qz
    # row r is kron(cz_r, cd_r): index j·p_Δ + k ↔ U[k, j], i.e. column-major vec(U)
    Lc = (cz[:, :, None] * cd[:, None, :]).reshape(m, pz * pd)
    if Lc.shape[1] <= m:
        return _SVMFactor(Lc, Qd, Qz, None)
    Q2, R2 = np.linalg.qr(Lc.T)  # Lc = R2ᵀ Q2ᵀ: an exact (orthogonal) compression to width m
    return _SVMFactor(np.ascontiguousarray(R2.T), Qd, Qz, Q2)


@dataclass(frozen=True)
class _UnitSVM:
    """The Att-SVM(α) rows at unit length, with exact power-of-two bookkeeping of their scale.

    Row ``r = (i, t)`` is ``Δ_rᵀ W z_i ≥ 1`` with ``Δ_r = x_iα_i − x_it``. Write ``Δ_r = D_r·2^{e_r}`` and
    ``z_i = Z_i·2^{f_i}`` with ``max|D_r|, max|Z_i| ∈ [½, 1)`` (exact: powers of two), and
    ``ρ_r = ||Δ_r||·||z_i|| = ||D_r||·||Z_i||·2^{E_r}``, ``E_r = e_r + f_i``. Dividing row ``r`` by ``ρ_r`` is
    an exact reformulation (same feasible set): ``Δ̂_rᵀ W ẑ_i ≥ 1/ρ_r``. With ``G = max_r(−E_r)`` the
    right-hand sides are ``1/ρ_r = 2^G·β_r``, ``β_r = 2^{−E_r−G}/(||D_r||·||Z_i||) ∈ (0, 4]``, so

        W_mm = 2^G·Ŵ,   λ_r = 2^{G−E_r}·λ̂_r/(||D_r||·||Z_i||),   margin_r = 2^{E_r+G}·||D_r||·||Z_i||·m̂_r,

    where ``Ŵ``, ``λ̂``, ``m̂`` solve ``min ½||W||² s.t. Δ̂_rᵀ W ẑ_i ≥ β_r`` (unit rows, ``max β = O(1)``).
    (Derivation of ``λ``: ``vec(W) = Σ λ_r a_r = Σ λ_r ρ_r â_r`` and ``vec(W) = 2^G Σ λ̂_r â_r``.) Scaling
    ``X`` by ``2^jx`` and ``z`` by ``2^jz`` shifts every ``E_r`` by ``jx + jz`` and nothing else: the
    normalised problem is bitwise the same, so the equivariance ``W_mm(aX, bz) = W_mm(X, z)/(ab)`` holds
    exactly and nothing of the size of ``Δ`` or ``z`` is ever squared in floating point.
    """

    c: SVMConstraints  # unit Δ̂ (deltas), unit ẑ per row (queries), pairs, alpha
    zhat: FloatArray  # (n, d) unit queries
    beta: FloatArray  # (m,) right-hand sides of the normalised problem
    mant: FloatArray  # (m,) ||D_r||·||Z_i||
    E: NDArray[np.int64]  # (m,) e_r + f_i
    G: int


def _frexp_exponent(a: FloatArray) -> NDArray[np.int64]:
    """Per row, the exponent ``e`` with ``max|a_r|·2^−e ∈ [½, 1)`` (0 for an all-zero row)."""
    return np.asarray(np.frexp(np.max(np.abs(a), axis=1))[1], dtype=np.int64)


def _pairs_alpha(inst: Instance, alpha: ArrayLike | None) -> tuple[IntArray, IntArray]:
    a = inst.check_alpha(alpha)
    return constraint_pairs(inst, a), a  # masked tokens have no row


def _unit_svm(inst: Instance, pairs: IntArray, a: IntArray) -> _UnitSVM:
    """Build :class:`_UnitSVM` without forming anything that can overflow or underflow."""
    i = pairs[:, 0]
    xa, xt = inst.X[i, a[i]], inst.X[i, pairs[:, 1]]
    with np.errstate(over="ignore", invalid="ignore"):
        raw = xa - xt  # ±inf only where |x| ≥ 2^1022
    big = ~np.all(np.isfinite(raw), axis=1)
    e = _frexp_exponent(np.where(np.isfinite(raw), raw, 0.0))
    D = np.ldexp(raw, -e[:, None])
    if np.any(big):
        # Rows with an overflowed difference: halving is exact for the entries that matter (|x| ≥ 2^1022);
        # what a tiny entry loses in its last bit is below 2^-2000 of the row's size.
        half = 0.5 * xa[big] - 0.5 * xt[big]
        eb = _frexp_exponent(half) + 1
        e[big] = eb
        D[big] = np.ldexp(half, 1 - eb[:, None])
    z = inst.z
    f = _frexp_exponent(z)
    Z = np.ldexp(z, -f[:, None])
    nD = np.linalg.norm(D, axis=1)  # entries of D in (−1, 1), the largest ≥ ½: no overflow/underflow
    nZ = np.linalg.norm(Z, axis=1)
    # A zero query only where its sequence has no row (one allowed token; _check_trivially_infeasible
    # refuses the others): its unit query is 0, never 0/0 (which would reach W through Bᵀ Z).
    zhat = Z / np.where(nZ > 0, nZ, 1.0)[:, None]
    E = e + f[i]
    G = int(np.max(-E)) if E.size else 0
    mant = nD * nZ[i]
    beta = np.ldexp(1.0 / mant, (-E - G).astype(np.int64))  # max ∈ [1/d, 4]; tiny rows may be subnormal
    c = SVMConstraints(D / nD[:, None], np.array(zhat[i]), pairs, a)
    return _UnitSVM(c, zhat, beta, mant, E, G)


def _pairs_of(c: SVMConstraints, rows: IntArray) -> Pairs:
    return tuple((int(c.pairs[r, 0]), int(c.pairs[r, 1])) for r in rows)


def _require_rows(pairs: IntArray) -> None:
    """Refuse an Att-SVM without any constraint (a mask that leaves every sequence one token)."""
    if not pairs.size:
        raise AttnSVMError(
            "Att-SVM(alpha) has no constraint: the mask leaves every sequence one allowed token, so "
            "W_mm = 0 and its direction is undefined. Allow at least two tokens in some sequence."
        )


def _check_trivially_infeasible(inst: Instance, pairs: IntArray, a: IntArray) -> None:
    """Zero queries and tokens equal to the selected one make a constraint read ``0 ≥ 1``."""
    # only sequences with a constraint (with a mask, a sequence with one allowed token has none)
    has_row = np.zeros(inst.n, dtype=bool)
    has_row[pairs[:, 0]] = True
    zero_q = np.flatnonzero(np.all(inst.z == 0.0, axis=1) & has_row)
    if zero_q.size:
        i = int(zero_q[0])
        raise InfeasibleSVMError(
            f"Att-SVM(alpha) is infeasible: sequence {i} has a zero query z_{i} = 0, so every constraint "
            f"(x_{i},alpha - x_{i},t)^T W z_{i} = 0 < 1 whatever W. Give sequence {i} a nonzero query or drop it."
        )
    # x_iα = x_it exactly (comparing, not subtracting: no overflow at any scale)
    same = np.all(inst.X[pairs[:, 0], a[pairs[:, 0]]] == inst.X[pairs[:, 0], pairs[:, 1]], axis=1)
    zero_d = np.flatnonzero(same)
    if zero_d.size:
        i, t = (int(v) for v in pairs[zero_d[0]])
        ai = int(a[i])
        raise InfeasibleSVMError(
            f"Att-SVM(alpha) is infeasible: in sequence {i}, token {t} equals the selected token alpha_{i} = {ai} "
            f"(Delta = x_{i},{ai} - x_{i},{t} = 0), so its constraint reads 0 >= 1 for every W. "
            f"Select a different token for sequence {i} or remove the duplicate."
        )


def _raise_infeasible(c: SVMConstraints, err: InfeasibleMinNormError, G: int = 0) -> None:
    """Re-raise a Farkas certificate of the unit-row problem as an Att-SVM message (``||W|| ≥ 2^G·bound``)."""
    rows = err.rows
    seqs = sorted({int(c.pairs[r, 0]) for r in rows})
    weights = ", ".join(
        f"({int(c.pairs[r, 0])},{int(c.pairs[r, 1])}): {err.certificate[r]:.3g}" for r in rows[:12]
    )
    bound = "no W at all" if not np.isfinite(err.norm_bound) else f"||W||_F >= {_pow2_str(err.norm_bound, G)}"
    raise InfeasibleSVMError(
        f"Att-SVM(alpha) is infeasible: the constraints of sequence(s) {seqs} contradict each other. "
        f"The combination with weights c >= 0 {{{weights}}} of the unit-normalised rows "
        f"Delta_it^T W z_i / (||Delta_it|| ||z_i||) vanishes for every "
        f"W, yet its right-hand side is > 0 (Farkas certificate; a solution would need {bound}). "
        "Typical causes: a selected token that is a convex combination of the others, or sequences with "
        "parallel queries that ask for opposite orders of the same tokens. Choose a different alpha "
        f"for sequence {seqs[0]}."
    ) from None


def _fro_margins(zhat: FloatArray, c: SVMConstraints, W: FloatArray) -> FloatArray:
    """``Δ_rᵀ W z_i(r)`` for every row, as ``Δ_rᵀ (W Zᵀ)[:, i(r)]``: ``O(n d²)``, not ``O(m d²)``."""
    WZ = W @ zhat.T  # (d, n)
    return np.asarray(np.einsum("rk,rk->r", c.deltas, WZ.T[c.pairs[:, 0]]), dtype=np.float64)


def _weighted_sum(zhat: FloatArray, c: SVMConstraints, lam: FloatArray) -> FloatArray:
    """``Σ_r λ_r Δ_r z_i(r)ᵀ = Σ_i (Σ_t λ_it Δ_it) z_iᵀ = Bᵀ Z``: the factored ``Aᵀλ``, ``O(n d²)``."""
    B = np.zeros(zhat.shape)
    np.add.at(B, c.pairs[:, 0], lam[:, None] * c.deltas)
    return np.asarray(B.T @ zhat, dtype=np.float64)


_RESCALE_REMEDY = (
    "W_mm(aX, bz) = W_mm(X, z)/(ab): rescale X or z (e.g. by a power of two) and scale the answer back"
)


def _back_to_data_scale(
    u: _UnitSVM, W_hat: FloatArray, wnorm_hat: float, margins_hat: FloatArray, lam_hat: FloatArray | None
) -> tuple[FloatArray, float, FloatArray, tuple[FloatArray | None, FloatArray, int] | None]:
    """``W = 2^G Ŵ``, ``||W||``, the margins and the multipliers at the data's scale (see :class:`_UnitSVM`).

    The multipliers come as ``(λ or None, mantissa, k)`` with ``λ = mantissa·2^k``; ``λ`` is ``None`` when
    a non-negligible one (``> MULTIPLIER_RTOL·max``) is not a normal double. Raises the scale contract's
    :class:`NumericalError` when ``||W||`` is not a normal double or a margin overflows.
    """
    log2 = math.log(2.0)
    scaling.check_log_representable(
        "the Att-SVM solution ||W_mm||_F", math.log(wnorm_hat) + u.G * log2, remedy=_RESCALE_REMEDY
    )
    with np.errstate(over="ignore"):
        W = np.ldexp(W_hat, u.G)  # exact (entries below 2^-1022 lose digits: ≤ d·2^-53 of ||W||_F)
        wnorm = float(np.ldexp(wnorm_hat, u.G))
    # The log-domain check above cannot resolve the last ulp of the range (log 2^1024 and log FLOAT_MAX are
    # the same double): decide on the values themselves.
    if not (scaling.FLOAT_TINY <= wnorm <= scaling.FLOAT_MAX) or not np.all(np.isfinite(W)):
        # at the edge itself: name the side the value fell on (its log is within an ulp of the bound)
        lg = math.log(wnorm_hat) + u.G * log2
        lg = math.nextafter(scaling.LOG_FLOAT_MAX, math.inf) if wnorm > 1.0 else lg
        lg = math.nextafter(scaling.LOG_FLOAT_TINY, -math.inf) if wnorm < 1.0 else lg
        raise scaling.range_error("the Att-SVM solution ||W_mm||_F", lg, remedy=_RESCALE_REMEDY)
    with np.errstate(over="ignore"):
        margins = np.ldexp(margins_hat * u.mant, u.E + u.G)  # = m̂_r / β_r, never 1/β_r formed
    if not np.all(np.isfinite(margins)):
        r = int(np.flatnonzero(~np.isfinite(margins))[0])
        lg = math.log(abs(margins_hat[r] * u.mant[r])) + float(u.E[r] + u.G) * log2
        i, t = (int(v) for v in u.c.pairs[r])
        raise scaling.range_error(f"the margin Δ_itᵀ W_mm z_i of constraint (i, t) = ({i}, {t})", lg)
    if lam_hat is None:
        return W, wnorm, margins, None
    # λ_r = 2^{G−E_r}·λ̂_r/(||D_r||·||Z_i||): multipliers of rows scaled by c scale by 1/c². Kept as
    # mantissa·2^k (exact) and returned as plain doubles only when every non-negligible one is normal.
    rel = lam_hat / u.mant
    lam_w = lam_hat * u.beta  # ∝ λ (the common factor 2^{2G} left out)
    significant = lam_w > MULTIPLIER_RTOL * float(np.max(lam_w, initial=0.0))
    ex = np.frexp(rel)[1].astype(np.int64) + (u.G - u.E)
    k = int(np.max(ex[significant])) if np.any(significant) else 0
    mantissa = np.ldexp(rel, u.G - u.E - k)  # max ∈ [½, 1); rows 2^-1074 below the largest flush to 0
    with np.errstate(over="ignore"):
        lam = np.ldexp(mantissa, k)
    ok = (lam >= scaling.FLOAT_TINY) & (lam <= scaling.FLOAT_MAX)
    # a multiplier below MULTIPLIER_RTOL·max counts as 0 (weakly active) anyway: no subnormal noise returned
    lam = np.where(ok, lam, 0.0)
    return W, wnorm, margins, (lam if bool(np.all(ok | ~significant)) else None, mantissa, k)
