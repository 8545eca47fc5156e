"""The logit map ``𝓛: W ↦ (x_itᵀ W z_i)_{i,t}``: its Gram matrix and operator norm (tensor trick)."""

from __future__ import annotations

import math

import numpy as np

from .._types import FloatArray
from ..model._instance import Instance
from ..scaling import check_log_representable
from ._pairs import _LN2, _kron_gram, _kron_norm, _Split


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
