"""Lipschitz constants of attention with respect to ``W``: certified bounds and attained estimates.

The maps (DESIGN.md): on the ball ``B_R = {W : ||W||_F ≤ R}``, Frobenius norm in, ℓ2 norm out,

* ``of="weights"``: ``W ↦ s(W) ∈ R^{nT}`` (all attention weights, flattened);
* ``of="output"``:  ``W ↦ f(W) ∈ R^n``, ``f_i = Σ_t s_it a_it``, ``a_it = vᵀx_it``;

for the kinds ``softmax``, ``linear`` and ``normalized_linear`` (``φ = elu + 1`` on the logits).

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

from .attention import KINDS
from .errors import AttnSVMError, NumericalError, unknown_name
from .instance import Instance

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

FloatArray = NDArray[np.float64]

OFS = ("weights", "output")
WRTS = ("W",)

_EPS = float(np.finfo(np.float64).eps)

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
    """
    m = inst.n * inst.T
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


def _check_positive_int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise AttnSVMError(f"{name} must be an integer ≥ {low}; got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- the logit map
def logit_gram(inst: Instance) -> FloatArray:
    """Gram matrix of the logit map's rows, ``G[(i,t),(j,u)] = (z_i·z_j)(x_it·x_ju)``, shape ``(nT, nT)``.

    ``l_it = ⟨z_i ⊗ x_it, vec W⟩`` (column-major ``vec``), so ``G = 𝓛 𝓛ᵀ`` and
    ``||𝓛||₂ = λ_max(G)^{1/2}``; the factorised form costs ``O((nT)² d)``, never ``d²``-long rows.

    References: Gao, Song, Xie, arXiv 2307.02419 (tensor trick).

    Args:
      inst: the data (``n, T, d``).

    Returns:
      ``G``, shape ``(n·T, n·T)``, rows ordered by sequence then token.
    """
    return _logit_gram_of(inst.X, inst.z)


def _logit_gram_of(X: FloatArray, z: FloatArray) -> FloatArray:
    n, T, _ = X.shape
    zz = z @ z.T  # (n, n)
    xx = np.einsum("itd,jud->itju", X, X)
    return np.asarray((zz[:, None, :, None] * xx).reshape(n * T, n * T))


def _unit_scale(a: FloatArray) -> float:
    """``max|a|`` (1 for an all-zero array): dividing by it keeps Gram entries away from under/overflow."""
    m = float(np.max(np.abs(a))) if a.size else 0.0
    return m if m > 0 else 1.0


def _lam_max(G: FloatArray) -> float:
    if G.size == 0:
        return 0.0
    lam = float(np.linalg.eigvalsh(G)[-1])
    # A PSD Gram matrix can give λ_max = −tiny from rounding when it is ~0: clip to 0.
    return max(lam, 0.0)


def logit_norm(inst: Instance) -> float:
    """Operator norm ``||𝓛||₂`` of ``W ↦ (x_itᵀ W z_i)_{i,t}`` (Frobenius in, ℓ2 out).

    ``||𝓛||₂ = λ_max(G)^{1/2}`` with ``G`` from :func:`logit_gram`.

    References: Gao, Song, Xie, arXiv 2307.02419.

    Args:
      inst: the data.

    Returns:
      ``||𝓛||₂ ≥ 0`` (a float).
    """
    return math.sqrt(_lam_max(logit_gram(inst)))


def _scaled_norm(G: FloatArray, kappa_rows: FloatArray) -> float:
    """``||K 𝓛||₂`` from ``G = 𝓛𝓛ᵀ``: ``λ_max(K G K)^{1/2}``, ``K = diag(kappa_rows)``."""
    return math.sqrt(_lam_max(kappa_rows[:, None] * G * kappa_rows[None, :]))


def _max_weight_bound(inst: Instance, kind: str, radius: float) -> FloatArray:
    """Upper bound ``p_i ≥ max_t s_it(W)`` over the ball, per sequence, shape ``(n,)``.

    On ``||W||_F ≤ R``: ``|aᵀ W b| ≤ ||W||₂ ||a|| ||b|| ≤ R ||a|| ||b||``.

    * softmax: ``s_it = 1 / (1 + Σ_{u≠t} e^{l_iu − l_it})`` and ``l_iu − l_it = (x_iu − x_it)ᵀ W z_i
      ≥ −R ||x_iu − x_it|| ||z_i||``, so ``s_it ≤ σ(−q_it)``, ``q_it = logsumexp_{u≠t}(−R δ_itu)``.
    * normalized_linear: ``φ`` is increasing and ``|l_it| ≤ R c_it``, ``c_it = ||x_it|| ||z_i||``, so
      ``s_it = φ_t / Σ_u φ_u ≤ 1 / (1 + Σ_{u≠t} φ(−R c_iu)/φ(R c_it))``, with
      ``log φ(−R c) = −R c`` and ``log φ(R c) = log1p(R c)``.

    Both are computed in the log domain: ``σ(−q) = exp(−logaddexp(0, q))`` never overflows.
    """
    n, T, _ = inst.shape
    znorm = np.linalg.norm(inst.z, axis=1)  # (n,)
    if kind == "softmax":
        diff = inst.X[:, :, None, :] - inst.X[:, None, :, :]  # (n, T, T, d): x_it − x_iu
        expo = -radius * np.linalg.norm(diff, axis=-1) * znorm[:, None, None]  # (n, t, u)
    else:
        c = np.linalg.norm(inst.X, axis=-1) * znorm[:, None]  # (n, T)
        expo = -radius * c[:, None, :] - np.log1p(radius * c)[:, :, None]
    mask = np.eye(T, dtype=bool)[None, :, :]
    expo = np.where(mask, -np.inf, expo)
    m = np.max(expo, axis=-1, keepdims=True)
    # log-sum-exp over u ≠ t (stable: shift by the max, which is finite since T ≥ 2).
    q = m[..., 0] + np.log(np.sum(np.exp(expo - m), axis=-1))
    # s ≤ 1/(1 + e^q) computed as exp(−log(1 + e^q)) = exp(−logaddexp(0, q)): no overflow for large q.
    p = np.exp(-np.logaddexp(0.0, q))
    return np.asarray(np.max(p, axis=1))


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
    inst: Instance, kind: str = "softmax", wrt: str = "W", radius: float = 1.0, of: str = "weights"
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
      the ½ of DESIGN.md holds (checked by adversarial search in the tests). ``κ_i = min(½, p_i)``
      with ``p_i`` the normalized-linear max-weight bound.
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

    Returns:
      :class:`LipschitzBound` (``float()`` gives the bound).
    """
    _check_common(kind, of, wrt)
    R = _check_radius(radius)
    n, T, _ = inst.shape
    rtol = bound_rounding_rtol(inst)
    # Every norm below is homogeneous in X and z: form the Gram matrices from X/sx and z/sz and
    # multiply the scale back after the square root, so data of size 1e-160 (Gram entries 1e-640)
    # or 1e+160 neither underflows to 0 nor overflows.
    sx, sz = _unit_scale(inst.X), _unit_scale(inst.z)
    Xs, zs = inst.X / sx, inst.z / sz
    G = _logit_gram_of(Xs, zs)
    Lnorm = sx * sz * math.sqrt(_lam_max(G))
    cands: dict[str, float]
    if kind == "linear":
        if of == "weights":
            kappa = np.ones(n)
            cands = {"||L||_2 (exact)": Lnorm}
        else:
            a = inst.values()
            sa = _unit_scale(a)
            xa = np.einsum("itd,it->id", Xs, a / sa)  # X_iᵀ a_i / (sx·sa), (n, d)
            H = (zs @ zs.T) * (xa @ xa.T)
            kappa = np.ones(n)
            cands = {
                "||A L||_2 (exact, Gram (z_i·z_j)(X_i^T a_i·X_j^T a_j))": sx
                * sz
                * sa
                * math.sqrt(_lam_max(H))
            }
        jf = 1.0
    else:
        p = _max_weight_bound(inst, kind, R)
        if of == "weights":
            kappa = np.minimum(0.5, p)
            cap = 0.5
            cap_name = "1/2 ||L||_2"
        else:
            a = inst.values()
            spread = np.max(a, axis=1) - np.min(a, axis=1)
            kappa = np.minimum(SPREAD_FACTOR, 0.5 * np.sqrt(p)) * spread
            cap = float(np.max(kappa))
            cap_name = "max_i kappa_i ||L||_2"
        kappa_rows = np.repeat(kappa, T)
        cands = {
            cap_name: cap * Lnorm,
            "||K L||_2": sx * sz * _scaled_norm(G, kappa_rows),
        }
        jf = float(np.max(kappa))
    formula = min(cands, key=lambda k: cands[k])
    nominal = cands[formula]
    if not math.isfinite(nominal):
        raise NumericalError(
            f"the {kind} {of} Lipschitz bound is not finite in float64 (got {nominal}); rescale the data"
        )
    return LipschitzBound(
        value=nominal * (1.0 + rtol),
        nominal=nominal,
        kind=kind,
        of=of,
        wrt=wrt,
        radius=R,
        logit_norm=Lnorm,
        jacobian_factor=jf,
        kappa=kappa,
        formula=formula,
        candidates=cands,
        rounding_rtol=rtol,
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


def _torch_full_map(inst: Instance, kind: str, of: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``w ↦ s(W)`` (flattened) or ``f(W)`` in torch float64, ``W = w.reshape(d, d)``."""
    import torch

    X = torch.as_tensor(np.array(inst.X), dtype=torch.float64)
    z = torch.as_tensor(np.array(inst.z), dtype=torch.float64)
    a = torch.as_tensor(np.array(inst.values()), dtype=torch.float64)
    head = torch.func.vmap(_torch_head(kind, of))
    d = inst.d

    def F(w: torch.Tensor) -> torch.Tensor:
        l = torch.einsum("ntd,nd->nt", X, z @ w.reshape(d, d).T)
        return head(l, a).reshape(-1)

    return F


def _fro(w: FloatArray) -> float:
    # math.hypot scales internally: no overflow of the sum of squares for entries near 1e300.
    return math.hypot(*(float(x) for x in np.ravel(w)))


def _project(w: FloatArray, R: float) -> FloatArray:
    nrm = _fro(w)
    return w * (R / nrm) if nrm > R else w


def lipschitz_estimate(
    inst: Instance,
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
    the full autograd Jacobian (``torch.func.jacrev`` of ``W ↦ s``) and its largest singular
    value, an independent path.

    Candidates: ``W = 0``; ``t R V₁`` for ``t ∈ {±¼, ±½, ±1}``, ``V₁`` the top right singular
    vector of the logit map (the linear maximiser); ``samples`` random points (Gaussian direction,
    radius ``R`` for even draws and ``R U^{1/d²}`` for odd ones). From the ``starts`` best,
    projected ascent on ``||J(W)||₂`` (gradient by autograd through ``jacrev`` and ``eigvalsh``):
    normalised steps of length ``η``, from ``η = R/4``, halved on every non-improving step,
    projected back onto the ball. Deterministic: all randomness comes from
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

    Returns:
      :class:`LipschitzEstimate`; ``.W`` (shape ``(d, d)``) attains ``.value``.

    Raises:
      NumericalError: the Jacobian is not finite at some point of the ball (radius too large for
        float64 logits).
    """
    import torch

    _check_common(kind, of, wrt)
    R = _check_radius(radius)
    samples = _check_positive_int(samples, "samples", 0)
    steps = _check_positive_int(steps, "steps", 0)
    starts = _check_positive_int(starts, "starts", 1)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AttnSVMError(f"seed must be an integer; got {seed!r}")
    n, T, d = inst.shape
    X = torch.as_tensor(np.array(inst.X), dtype=torch.float64)
    z = torch.as_tensor(np.array(inst.z), dtype=torch.float64)
    a = torch.as_tensor(np.array(inst.values()), dtype=torch.float64)
    G_np = logit_gram(inst)
    G4 = torch.as_tensor(G_np.reshape(n, T, n, T), dtype=torch.float64)
    # ∂(head)/∂l per sequence: (n, T, T) for weights, (n, 1, T) for the output.
    dhead = torch.func.vmap(torch.func.jacrev(_torch_head(kind, of), argnums=0))

    def sigma(w: torch.Tensor) -> torch.Tensor:
        l = torch.einsum("ntd,nd->nt", X, z @ w.reshape(d, d).T)
        D = dhead(l, a)  # (n, k, T)
        M = torch.einsum("iab,ibjc,jdc->iajd", D, G4, D).reshape(n * D.shape[1], n * D.shape[1])
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
    if G_np.size and _lam_max(G_np) > 0.0:
        _, vecs = np.linalg.eigh(G_np)
        u = vecs[:, -1].reshape(n, T)
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
    scales = np.concatenate([c.ravel(), dif.ravel()])
    scales = scales[scales > 0]
    lo_r = 0.1 / float(np.max(scales)) if scales.size else R
    hi_r = 10.0 / float(np.min(scales)) if scales.size else R
    for k in range(samples):
        g = rng.standard_normal(d * d)
        g /= np.linalg.norm(g)
        if k % 2 == 0:
            rad = R * rng.random() ** (1.0 / (d * d))  # uniform in the ball
        else:
            rad = min(R, math.exp(rng.uniform(math.log(lo_r), math.log(max(hi_r, lo_r)))))
        cands.append(rad * g)
    vals = [value(c) for c in cands]
    order = np.argsort(vals, kind="stable")[::-1][:starts]
    best_i = int(np.argmax(vals))
    best_val, best_w = vals[best_i], cands[best_i]
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
            if cur > best_val:
                best_val, best_w = cur, w
    # Independent recomputation at the attaining point: full autograd Jacobian, largest singular value.
    full = _full_jacobian_norm(inst, kind, of, best_w)
    return LipschitzEstimate(
        value=full,
        W=np.asarray(best_w.reshape(d, d)),
        kind=kind,
        of=of,
        wrt=wrt,
        radius=R,
        seed=int(seed),
        samples=samples,
        steps=steps,
        evaluations=count,
        search_value=float(best_val),
    )


def jacobian_norm(inst: Instance, W: ArrayLike, kind: str = "softmax", of: str = "weights") -> float:
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

    Returns:
      ``||J(W)||₂`` (a float).

    Raises:
      NumericalError: the Jacobian is not finite at ``W`` (logits beyond float64 range).
    """
    _check_common(kind, of, "W")
    Wa = inst.check_weights(W)
    return _full_jacobian_norm(inst, kind, of, Wa.reshape(-1))


def _full_jacobian_norm(inst: Instance, kind: str, of: str, w: FloatArray) -> float:
    import torch

    J = torch.func.jacrev(_torch_full_map(inst, kind, of))(torch.tensor(np.array(w), dtype=torch.float64))
    J = J.detach()
    finite = bool(torch.isfinite(J).all())
    val = float(torch.linalg.svdvals(J)[0]) if finite and J.numel() else (0.0 if finite else math.nan)
    if not math.isfinite(val):
        raise NumericalError(
            f"the {kind} {of} Jacobian is not finite at a point with ||W||_F = {_fro(w):.3g} "
            "(logits beyond float64 range); use a smaller radius or rescale the data"
        )
    return val


# --------------------------------------------------------------------------- comparison
def compare_lipschitz(
    instances: Sequence[Instance],
    radii: Sequence[float],
    of: str = "weights",
    seed: int = 0,
    samples: int = 32,
    steps: int = 20,
) -> list[dict[str, Any]]:
    """Bound and estimate per kind for every (instance, radius), with the softmax ratios.

    One row per ``(instance index, radius)`` with, for each kind ``k``, ``bound_k``, ``estimate_k``
    and ``gap_k = bound_k / estimate_k`` (``inf`` when the estimate is 0), and the ratios
    ``softmax/linear`` and ``softmax/normalized_linear`` of bounds (``bound_ratio_*``) and of
    estimates (``estimate_ratio_*``). An estimate ratio above 1 means softmax is *less* stable
    than the other kind on that ball, as attained (not just bounded).

    References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710.

    Args:
      instances: the data sets.
      radii: ball radii ``R > 0``.
      of: ``"weights"`` or ``"output"``.
      seed, samples, steps: passed to :func:`lipschitz_estimate`.

    Returns:
      A list of dicts (table rows), ``len(instances) · len(radii)`` of them.
    """
    if of not in OFS:
        raise unknown_name("Lipschitz map 'of'", of, OFS)
    rs = [_check_radius(r) for r in radii]

    def ratio(x: float, y: float) -> float:
        return x / y if y > 0 else (math.inf if x > 0 else math.nan)

    rows: list[dict[str, Any]] = []
    for idx, inst in enumerate(instances):
        if not isinstance(inst, Instance):
            raise AttnSVMError(f"instances[{idx}] must be an attnsvm.Instance; got {type(inst).__name__}")
        for R in rs:
            row: dict[str, Any] = {"instance": idx, "shape": inst.shape, "radius": R, "of": of}
            for kind in KINDS:
                b = float(lipschitz_bound(inst, kind, radius=R, of=of))
                e = float(
                    lipschitz_estimate(inst, kind, radius=R, of=of, seed=seed, samples=samples, steps=steps)
                )
                row[f"bound_{kind}"] = b
                row[f"estimate_{kind}"] = e
                row[f"gap_{kind}"] = ratio(b, e)
            for other in ("linear", "normalized_linear"):
                row[f"bound_ratio_softmax/{other}"] = ratio(row["bound_softmax"], row[f"bound_{other}"])
                row[f"estimate_ratio_softmax/{other}"] = ratio(
                    row["estimate_softmax"], row[f"estimate_{other}"]
                )
            rows.append(row)
    return rows
