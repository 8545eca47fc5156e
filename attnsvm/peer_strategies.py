"""Hypothesis strategies for the peer papers' models: prompt / joint instances, ℓp exponents, heads.

Every strategy *constructs* valid data (no ``assume``):

* :func:`prompt_instances` — ``(inst, W)`` for the prompt model whose p-SVM(α) is feasible for
  **every** token choice α and whose optimal tokens are unique with a score gap ≥ ``min_gap``.
  Sufficient condition used, exactly: all ``n·T`` tokens are linearly independent (so the
  differences ``x_iα_i − x_it`` over all ``(i, t ≠ α_i)`` are independent for any α) and ``W`` is
  invertible (so the key differences ``Wᵀ(x_iα_i − x_it)`` are too); independent rows make
  ``Δk p ≥ 1`` solvable. Construction: ``x_it = r_it q_it + g_it e`` with orthonormal
  ``q_it ⟂ e`` (needs ``d ≥ nT + 1``), radii ``r_it ∈ [½, 2]``, head ``v = e`` so the score is
  ``γ_it = Y_i g_it``, set exactly; ``W = U diag(σ) Vᵀ`` with random orthogonal ``U, V`` and
  ``σ ∈ [½, 2]``. (The token ``x_it`` lies in span``(q_it, e)``; the family ``{x_it}`` stays
  independent because the ``q_it`` are.)
* :func:`joint_instances` — the same data; the v-SVM ``Y_i vᵀx_iα_i ≥ 1`` is feasible for every α
  because the selected tokens are independent.
* :func:`p_norms` — exponents ``p ∈ [1 + δ, p_max]`` for ℓp mirror descent (never ``≤ 1``).
* :func:`heads` — ``V ∈ ℝ^{d×k}`` with bounded Gaussian entries for the multi-token head.

References: Tarzanagh, Li, Zhang, Oymak, arXiv 2306.13596 (prompt and joint models);
Julistiono, Tarzanagh, Azizan, arXiv 2410.14581 (ℓp); Tarzanagh, Li, Thrampoulidis, Oymak,
arXiv 2308.16898 (multi-token heads).
"""

from __future__ import annotations

from ._deps import require
from ._types import FloatArray

require("hypothesis", feature="attnsvm.peer_strategies (the Hypothesis strategies)")  # pragma: no mutate

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .errors import InvalidInstanceError
from .model._instance import Instance

__all__ = ["prompt_instances", "joint_instances", "p_norms", "heads"]


def _orthogonal(rng: np.random.Generator, d: int) -> FloatArray:
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    return Q * np.sign(np.diag(R))


@st.composite
def prompt_instances(
    draw: Any,
    n: tuple[int, int] = (1, 3),
    T: tuple[int, int] = (2, 4),
    extra_d: int = 2,
    min_gap: float = 0.1,
) -> tuple[Instance, FloatArray]:
    """``(inst, W)`` with every p-SVM(α) feasible and a unique optimal token per sequence (gap ≥ ``min_gap``).

    ``d = nT + 1 + j``, ``j ∈ [0, extra_d]``; see the module docstring for the construction.
    """
    if not (isinstance(min_gap, (int, float)) and 0 < min_gap <= 1):
        raise InvalidInstanceError(f"min_gap must lie in (0, 1]; got {min_gap!r}")
    nn = draw(st.integers(*n))
    TT = draw(st.integers(*T))
    d = nn * TT + 1 + draw(st.integers(0, extra_d))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    B = _orthogonal(rng, d)
    e = B[:, 0]
    Q = B[:, 1 : 1 + nn * TT].T.reshape(nn, TT, d)
    r = rng.uniform(0.5, 2.0, size=(nn, TT))
    Y = rng.choice(np.array([-1.0, 1.0]), size=nn)
    # scores: a random order with consecutive gaps ≥ min_gap, so the optimum is unique
    g = np.zeros((nn, TT))
    for i in range(nn):
        levels = np.cumsum(rng.uniform(min_gap, 1.0, size=TT))
        g[i] = Y[i] * rng.permutation(levels - levels.mean())
    X = r[:, :, None] * Q + g[:, :, None] * e
    sig = rng.uniform(0.5, 2.0, size=d)
    W = _orthogonal(rng, d) @ np.diag(sig) @ _orthogonal(rng, d).T
    return Instance(X, Y, e.copy()), W


def joint_instances(**kwargs: Any) -> st.SearchStrategy[tuple[Instance, FloatArray]]:
    """``(inst, W)`` for joint ``(v, p)`` training: :func:`prompt_instances` data (every v-SVM(α) and
    relaxed p-SVM(α) feasible, since all tokens are independent and ``W`` invertible)."""
    return prompt_instances(**kwargs)


def p_norms(low: float = 1.1, high: float = 5.0) -> st.SearchStrategy[float]:
    """Exponents ``p ∈ [low, high]`` with ``low > 1`` (ℓp mirror descent needs ``p > 1``)."""
    if not (1 < low <= high < np.inf):
        raise InvalidInstanceError(f"need 1 < low ≤ high < inf; got low={low!r}, high={high!r}")
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


@st.composite
def heads(draw: Any, d: int, k: tuple[int, int] = (1, 6), bound: float = 3.0) -> FloatArray:
    """A head ``V ∈ ℝ^{d×k}``: Gaussian entries clipped to ``±bound``, seeded by Hypothesis."""
    if d < 1:
        raise InvalidInstanceError(f"d must be ≥ 1; got {d!r}")
    kk = draw(st.integers(*k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return np.clip(rng.standard_normal((d, kk)), -bound, bound)
