"""The attained lower estimate: :func:`lipschitz_estimate`, a search of ``max ||J(W)||₂`` over the ball."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from .._deps import require
from .._types import FloatArray
from .._validation import check_int
from ..errors import AttnSVMError, NumericalError
from ..model._instance import Instance
from ..scaling import FLOAT_MAX, check_log_representable, pow2_exponent
from ._checks import _check_common, _check_radius
from ._heads import _torch_head, _torch_masked_head
from ._jacobian import _jacobian_pair, _scaled_back, _structurally_zero
from ._pairs import _LN2, _fro, _kron_gram, _lam_max, _pair_value, _Split
from ._results import LipschitzEstimate

if TYPE_CHECKING:  # torch is imported where it is used: `import attnsvm` stays light (~1 s less)
    import torch


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
    R, samples, steps, starts = _estimate_options(kind, of, wrt, radius, seed, samples, steps, starts)
    if _structurally_zero(inst, kind, of):
        # The map is constant (decided exactly on the ORIGINAL data): the constant is exactly 0, attained
        # at W = 0. Returned before any rescaling or search, whose intermediates (z·Wᵀ before it meets
        # X = 0) can overflow at radii near 1.8e308 and used to be reported as "logits beyond float64".
        return _zero_estimate(
            inst, kind=kind, of=of, wrt=wrt, radius=R, seed=seed, samples=samples, steps=steps
        )
    # Scale: the search runs on the data rescaled by exact powers of two (X/2^eX, z/2^ez, v/2^ev, all
    # O(1)) on the ball of radius R·2^(eX+ez): the same map up to the factor 2^k of the Jacobian
    # (k = eX + ez for the weights, 2eX + ez + ev for the output), put back at the end.
    orig, R_orig = inst, R
    inst, eX, ez, ev = _normalized(orig)
    shift, k_out = _jacobian_shift(eX, ez, ev, of)
    R = _search_radius(inst, R_orig, shift)
    d = inst.d
    # The search needs the logit Gram G only up to a positive factor (it compares values and follows
    # normalised gradients), so it uses the scaled Gram M = G·2^(−2E) of ``_kron_gram``, whose largest
    # diagonal entry is ≥ 1/64: no refusal when G itself leaves float64's range (logit_gram would
    # refuse, e.g. when every sequence's ||z_i||·||x_it|| is tiny although X and z are not).
    # σ(W) below is therefore ||J̃(W)||₂·2^(−E); the returned value is recomputed independently.
    sp = _Split(inst)
    G_np, E_gram = _kron_gram(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones)
    objective = _SearchObjective(inst, orig.mask, kind, of, G_np)
    rng = np.random.default_rng(seed)
    cands = _structured_candidates(inst, sp.rows, G_np, R)
    lo_r, hi_r = _sampling_radii(inst, R)
    cands += _random_candidates(rng, samples, d, R, lo_r, hi_r)
    vals = [objective.value(c) for c in cands]
    found = list(zip(vals, cands, strict=True))  # every point searched, with its search value
    if kind != "linear":  # the linear Jacobian is constant: nothing to ascend
        found += _ascend(objective, cands, vals, starts=starts, steps=steps, R=R, hi_r=hi_r)
    best_val, best_w, (full_m, full_e) = _attained(orig, kind, of, found, shift)
    est_value = _scaled_back(full_m, full_e, f"the {kind} {of} Lipschitz estimate (radius {R_orig:.3g})")
    W_back = _attaining_point(best_w, shift)
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
        evaluations=objective.count,
        search_value=_pair_value(float(best_val), k_out + E_gram),
    )


def _estimate_options(
    kind: str, of: str, wrt: str, radius: Any, seed: Any, samples: Any, steps: Any, starts: Any
) -> tuple[float, int, int, int]:
    """The validated request ``(R, samples, steps, starts)``: ``kind``, ``of``, ``wrt`` known, ``R > 0``
    finite, ``samples ≥ 0``, ``steps ≥ 0``, ``starts ≥ 1`` integers and ``seed`` an integer (not a bool);
    otherwise the AttnSVMError naming the argument, checked in that order."""
    _check_common(kind, of, wrt)
    R = _check_radius(radius)
    samples = check_int(samples, "samples", low=0)
    steps = check_int(steps, "steps", low=0)
    starts = check_int(starts, "starts", low=1)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AttnSVMError(f"seed must be an integer; got {seed!r}")
    return R, samples, steps, starts


def _zero_estimate(
    inst: Instance, *, kind: str, of: str, wrt: str, radius: float, seed: int, samples: int, steps: int
) -> LipschitzEstimate:
    """The estimate of a constant map (``_structurally_zero``): ``value = 0`` attained at ``W = 0``, no
    evaluation."""
    return LipschitzEstimate(
        value=0.0,
        W=np.zeros((inst.d, inst.d)),
        kind=kind,
        of=of,
        wrt=wrt,
        radius=radius,
        seed=int(seed),
        samples=samples,
        steps=steps,
        evaluations=0,
        search_value=0.0,
    )


class _SearchObjective:
    """The search's objective on rescaled data: ``σ(W) = λ_max(D M Dᵀ)^{1/2}``, ``D = blockdiag_i ∂s_i/∂l_i``
    (torch ``vmap(jacrev)`` of the head at ``l_it = x_itᵀ W z_i``) and ``M`` the scaled logit Gram
    (``G·2^(−2E)``, ``_kron_gram``), so ``σ(W) = ||J̃(W)||₂·2^(−E)``; ``value`` counts its evaluations
    (``count``) and refuses a non-finite one, ``grad`` is ``∇σ`` by autograd (through ``eigvalsh``).

    Masks (``mask`` not ``None``): the masked head (0 rows and columns at masked tokens) and, for the
    weights, the eigenproblem on the allowed rows only, as for the deleted instance.
    """

    def __init__(
        self, inst: Instance, mask: NDArray[np.bool_] | None, kind: str, of: str, G_np: FloatArray
    ) -> None:
        import torch

        n, T, d = inst.shape
        self.kind, self.of, self.d, self.n = kind, of, d, n
        self.count = 0
        self.X = torch.as_tensor(np.array(inst.X), dtype=torch.float64)
        self.z = torch.as_tensor(np.array(inst.z), dtype=torch.float64)
        self.a = torch.as_tensor(_values(inst), dtype=torch.float64)
        self.G4 = torch.as_tensor(G_np.reshape(n, T, n, T), dtype=torch.float64)
        # ∂(head)/∂l per sequence: (n, T, T) for weights, (n, 1, T) for the output.
        # Masks: the masked head (0 rows and columns at masked tokens, ``_torch_masked_head``); the weights'
        # eigenproblem keeps the allowed rows only (``keep``), as for the deleted instance.
        self.keep: torch.Tensor | None = None
        self.dhead: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
        if mask is None:
            self.dhead = torch.func.vmap(torch.func.jacrev(_torch_head(kind, of), argnums=0))
        else:
            mt = torch.as_tensor(np.array(mask))
            dmask = torch.func.vmap(torch.func.jacrev(_torch_masked_head(kind, of), argnums=0))

            def dhead(l: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
                return dmask(l, a, mt)

            self.dhead = dhead
            if of == "weights":
                self.keep = torch.as_tensor(np.flatnonzero(mask))

    def sigma(self, w: torch.Tensor) -> torch.Tensor:
        """``σ(W)`` (``w`` row-major ``vec W``, a torch scalar); NaN when ``M`` is not finite."""
        import torch

        n, d, keep = self.n, self.d, self.keep
        l = torch.einsum("ntd,nd->nt", self.X, self.z @ w.reshape(d, d).T)
        D = self.dhead(l, self.a)  # (n, k, T)
        M = torch.einsum("iab,ibjc,jdc->iajd", D, self.G4, D).reshape(n * D.shape[1], n * D.shape[1])
        if keep is not None:
            M = M[keep][:, keep]
        if not bool(torch.isfinite(M).all()):  # logits beyond float64: reported by value()
            return torch.full((), math.nan, dtype=torch.float64)
        lam = torch.linalg.eigvalsh(M)[-1]
        return torch.sqrt(torch.clamp(lam, min=0.0))

    def value(self, w: FloatArray) -> float:
        """``σ(W)`` as a float, counted; NumericalError when it is not finite (logits beyond float64)."""
        import torch

        self.count += 1
        with torch.no_grad():
            val = float(self.sigma(torch.as_tensor(w, dtype=torch.float64)))
        if not math.isfinite(val):
            raise NumericalError(
                f"the {self.kind} {self.of} Jacobian is not finite at a point with ||W||_F = {_fro(w):.3g}; "
                "the radius is too large for float64 logits, use a smaller radius"
            )
        return val

    def grad(self, w: FloatArray) -> FloatArray:
        """``∇σ(W)`` by autograd (not counted)."""
        import torch

        wt = torch.as_tensor(w, dtype=torch.float64).clone().requires_grad_(True)
        (g,) = torch.autograd.grad(self.sigma(wt), wt)
        return np.asarray(g.detach().numpy())


def _structured_candidates(
    inst: Instance, rows: NDArray[np.intp] | None, G_np: FloatArray, R: float
) -> list[FloatArray]:
    """The origin and ``t R V₁``, ``t ∈ (¼, ½, 1, −¼, −½, −1)``, ``V₁ ∝ 𝓛ᵀu = Σ u_it x_it z_iᵀ`` the top right
    singular vector of the logit map (``u`` the top eigenvector of its Gram; of the allowed ``rows`` only
    when masked), row-major; only the origin when the Gram or ``V₁`` is 0."""
    n, T, d = inst.shape
    # Structured candidates: the origin and the top right singular vector of the logit map.
    cands: list[FloatArray] = [np.zeros(d * d)]
    if _lam_max(G_np) > 0.0:
        if rows is None:
            _, vecs = np.linalg.eigh(G_np)
            u = vecs[:, -1].reshape(n, T)
        else:  # the allowed rows' Gram (the deleted instance's), its eigenvector put back with 0s
            _, vecs = np.linalg.eigh(G_np[np.ix_(rows, rows)])
            uf = np.zeros(n * T)
            uf[rows] = vecs[:, -1]
            u = uf.reshape(n, T)
        V1 = np.einsum("it,itd,ie->de", u, inst.X, inst.z)  # Σ u_it x_it z_iᵀ ∝ 𝓛ᵀu
        nv = float(np.linalg.norm(V1))
        if nv > 0.0:
            v1 = (V1 / nv).reshape(-1)  # row-major, matching w.reshape(d, d) in sigma
            for t in (0.25, 0.5, 1.0, -0.25, -0.5, -1.0):
                cands.append(t * R * v1)
    return cands


def _sampling_radii(inst: Instance, R: float) -> tuple[float, float]:
    """``(lo_r, hi_r) = (0.1/max c, min(10/min c, max(R, lo_r)))`` over the positive logit scales ``c``
    (``||x_it||·||z_i||`` and ``||x_it − x_iu||·||z_i||``); ``(R, R)`` when there is none."""
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
    return lo_r, hi_r


def _random_candidates(
    rng: np.random.Generator, samples: int, d: int, R: float, lo_r: float, hi_r: float
) -> list[FloatArray]:
    """``samples`` points ``ρ·g`` (``g`` uniform on the sphere of ``R^{d²}``): the ``k``-th uniform in the
    ball (``ρ = R U^{1/d²}``) for even ``k`` (or when ``lo_r ≤ 0``), log-uniform ``ρ = min(R, e^u)``,
    ``u ~ U[log lo_r, log max(hi_r, lo_r)]``, for odd ``k``; drawn from ``rng`` in that order."""
    cands: list[FloatArray] = []
    for k in range(samples):
        g = rng.standard_normal(d * d)
        g /= np.linalg.norm(g)
        if k % 2 == 0 or not lo_r > 0.0:  # (lo_r = R = 0: R·2^(eX+ez) underflowed, the ball is {0})
            rad = R * rng.random() ** (1.0 / (d * d))  # uniform in the ball
        else:
            rad = min(R, math.exp(rng.uniform(math.log(lo_r), math.log(max(hi_r, lo_r)))))
        cands.append(rad * g)
    return cands


def _ascend(
    objective: _SearchObjective,
    cands: list[FloatArray],
    vals: list[float],
    *,
    starts: int,
    steps: int,
    R: float,
    hi_r: float,
) -> list[tuple[float, FloatArray]]:
    """Projected ascent on ``σ`` from the ``starts`` best candidates (stable order), ``(σ, W)`` of each end.

    Normalised steps ``W ← Π_R(W + η ∇σ/||∇σ||)`` from ``η = min(R, hi_r)/4``, kept when ``σ`` increases,
    else ``η`` halved; at most ``steps`` steps, stopping at a zero or non-finite gradient or ``η < 10⁻⁹·R``.
    """
    order = np.argsort(vals, kind="stable")[::-1][:starts]
    found: list[tuple[float, FloatArray]] = []
    for idx in order:
        w = cands[int(idx)].copy()
        cur = vals[int(idx)]
        eta = min(R, hi_r) / 4.0
        for _ in range(steps):
            g = objective.grad(w)
            gn = float(np.linalg.norm(g))
            if not math.isfinite(gn) or gn == 0.0:
                break
            trial = _project(w + eta * g / gn, R)
            tv = objective.value(trial)
            if tv > cur:
                w, cur = trial, tv
            else:
                eta *= 0.5
                if eta < 1e-9 * R:
                    break
        found.append((cur, w))
    return found


def _attained(
    orig: Instance, kind: str, of: str, found: list[tuple[float, FloatArray]], shift: int
) -> tuple[float, FloatArray, tuple[float, int]]:
    """``(search value, W̃, ||J(W̃·2^−shift)||₂ as (m, e))`` of the searched point of largest search value
    whose Jacobian resolves above its rounding floor (``_jacobian_pair``); raises that floor's
    NumericalError, at the point of largest search value, when none does."""
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
    return best_val, best_w, pair


def _attaining_point(best_w: FloatArray, shift: int) -> FloatArray:
    """``W = W̃·2^−shift`` (flat), the attaining point on the original data; NumericalError when ``||W||_F``
    is not a normal double (``check_log_representable``)."""
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
    return np.asarray(W_back)


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
