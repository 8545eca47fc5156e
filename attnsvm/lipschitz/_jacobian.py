"""The attained Jacobian norm ``||J(W)||₂`` at one point: per-sequence rescaling, rounding floors and
structural zeros."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._deps import require
from .._types import FloatArray, Int64Array
from ..errors import NumericalError
from ..model._instance import Instance
from ..scaling import EPS as _EPS
from ..scaling import pow2_exponent, range_error
from ._checks import _check_common
from ._heads import _torch_head, _torch_masked_head
from ._pairs import _LN2, _fro, _pair_value

if TYPE_CHECKING:  # torch is imported where it is used: `import attnsvm` stays light (~1 s less)
    import torch


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
    d = inst.d
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
    Wh = _sequence_points(kind, of, w, a, b, wshift, live, d)
    J = _jacobian_blocks(inst, kind, of, Wh, Xh, zh, ah)
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


def _sequence_points(
    kind: str,
    of: str,
    w: FloatArray,
    a: Int64Array,
    b: Int64Array,
    wshift: int,
    live: NDArray[np.bool_],
    d: int,
) -> FloatArray:
    """Each sequence's point ``Ŵ_i = W̃·2^(a_i + b_i − wshift)``, flat, shape ``(n, d²)``; 0 for a sequence
    whose block is 0 at every ``W`` (not ``live``) and for every sequence of the linear kind (its Jacobian
    does not depend on ``W``). Raises the scale contract's error (``range_error``) when an entry overflows (the
    logits beyond float64), naming the size ``W·max|x|·max|z|``."""
    n = live.shape[0]
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
    return np.asarray(Wh)


def _jacobian_blocks(
    inst: Instance, kind: str, of: str, Wh: FloatArray, Xh: FloatArray, zh: FloatArray, ah: FloatArray
) -> FloatArray:
    """The blocks ``Ĵ_i = ∂ head(X̂_i Ŵ_i ẑ_i, â_i) / ∂Ŵ_i`` (row-major ``Ŵ``), shape ``(n, r, d²)``
    (``r = T`` for weights, 1 for the output), by torch ``vmap(jacrev)`` in float64; with ``inst``'s mask, the masked
    head (0 rows and columns at masked tokens)."""
    import torch

    d = inst.d
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
    return np.asarray(J)
