"""The certified bound ``Lip_R ≤ ||K 𝓛||₂``: the per-sequence factors ``κ_i``, the max-weight bound
``p_i`` (in the log domain) and :func:`lipschitz_bound`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray, Int64Array
from ..model._instance import Instance
from ..scaling import EPS as _EPS
from ..scaling import range_error
from ._checks import _check_common, _check_radius
from ._pairs import _kron_norm, _norm_split, _pair_from_log, _pair_key, _pair_log, _pair_value, _Split, _split
from ._results import LipschitzBound

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
    rtol = bound_rounding_rtol(inst)
    # Scale: every candidate is a product of norms of X, z, v, R and factors κ_i. Each is carried
    # as an exact pair m·2^e (``_Split``, ``_kron_norm``): no Gram entry under- or overflows, whatever
    # the sizes of X, z and v (the naive form squared κ_i and lost 1e-149-sized bounds to 0), the
    # candidates are compared exactly, and only the returned value must be a normal double.
    sp = _Split(inst)
    # (sp.rows: None, or the allowed tokens' rows (masks: the deleted instance's rows))
    Lm, Le = _kron_norm(sp.zm, sp.ze, sp.xm, sp.xe, *sp.ones, rows=sp.rows)
    if kind == "linear":
        cands, log_kappa = _linear_candidates(sp, of, Lm, Le)
    else:
        cands, log_kappa = _factor_candidates(sp, kind, of, R, Lm, Le)
    formula = min(cands, key=lambda k: _pair_key(*cands[k]))
    nm, ne = cands[formula]
    vm, ve, log_value = _certified(nm, ne, rtol, f"the {kind} {of} Lipschitz bound (radius {R:.3g})")
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


#: A candidate bound as an exact pair ``(m, e)``, value ``m·2^e``, keyed by its formula's name.
_Candidates = dict[str, tuple[float, int]]


def _linear_candidates(sp: _Split, of: str, Lm: float, Le: int) -> tuple[_Candidates, FloatArray]:
    """The linear kind's exact constant, ``({name: (m, e)}, log κ = 0)``.

    Weights: ``Lip = ||𝓛||₂ = Lm·2^Le``. Output: ``f_i = (X_iᵀ a_i)ᵀ W z_i``, so ``Lip = ||A 𝓛||₂ =
    λ_max(H)^{1/2}`` with ``H_ij = (z_i·z_j)(y_i·y_j)``, ``y_i = X_iᵀ a_i = Σ_t a_it x_it``.
    """
    n = sp.zm.shape[0]
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
    return cands, log_kappa


def _factor_candidates(
    sp: _Split, kind: str, of: str, R: float, Lm: float, Le: int
) -> tuple[_Candidates, FloatArray]:
    """The softmax / normalized_linear candidates ``max_i κ_i ||𝓛||₂`` and ``||K 𝓛||₂``, and ``log κ``.

    ``κ_i`` from ``p_i ≥ max_t s_it`` (``_log_max_weight``, rounded up): ``min(½, p_i)`` for the weights
    (``_weights_factors``), ``min(√2/4, √p_i/2)·spread_i`` for the output (``_output_factors``); a
    sequence with one allowed token has ``κ_i = 0`` exactly (its normalised weights are constant).
    """
    # sequences whose normalised weights are constant (one allowed token): κ_i = 0 exactly
    single = None if sp.allowed is None else np.count_nonzero(sp.allowed, axis=1) == 1
    logp = _log_max_weight(sp, kind, R, rounded_up=True)
    if of == "weights":
        km, ke, log_kappa, cap, cap_name = _weights_factors(logp, single)
    else:
        km, ke, log_kappa, cap, cap_name = _output_factors(sp, logp, single)
    cm, ce = math.frexp(cap[0] * Lm)
    cands = {
        cap_name: (cm, ce + cap[1] + Le),
        "||K L||_2": _kron_norm(sp.zm, sp.ze, sp.xm, sp.xe, km, ke, rows=sp.rows),
    }
    return cands, log_kappa


#: ``(κ mantissas, κ exponents, log κ, the cap's pair, the cap candidate's name)``
_Factors = tuple[FloatArray, Int64Array, FloatArray, tuple[float, int], str]


def _weights_factors(logp: FloatArray, single: NDArray[np.bool_] | None) -> _Factors:
    """The weights' ``κ_i = min(½, p_i)`` as pairs, with the cap ``½`` of ``½ ||𝓛||₂``."""
    log_kappa = np.minimum(math.log(0.5), logp)
    if single is not None:
        log_kappa = np.where(single, -np.inf, log_kappa)
    # where the cap binds, _pair_from_log(log ½) is exactly (0.5, 0): floor(log ½ / ln 2) = −1
    # (log ½ = −ln 2 exactly in float64), exp(0) = 1, frexp(1) = (½, 1)
    km, ke = _pair_from_log(log_kappa)
    cap = (0.5, 0)
    cap_name = "1/2 ||L||_2"
    return km, ke, log_kappa, cap, cap_name


def _output_factors(sp: _Split, logp: FloatArray, single: NDArray[np.bool_] | None) -> _Factors:
    """The output's ``κ_i = min(√2/4, √p_i/2) · spread_i`` as pairs, with the cap ``max_i κ_i``.

    ``spread_i = (max_t a_it − min_t a_it)·(1 + 2 eps) + 4(d + 2)·eps·max_t||x_it||·||v||`` over the
    allowed tokens, on the sequence's scale ``2^(se_i + ve)``.
    """
    d = sp.xm.shape[2]
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
    return km, ke, log_kappa, cap, cap_name


def _certified(nm: float, ne: int, rtol: float, what: str) -> tuple[float, int, Any]:
    """``value = nominal·(1 + rtol)`` as a pair ``(vm, ve)`` and its log, the nominal being ``nm·2^ne``.

    Raises the scale contract's error (``range_error``) naming ``what`` when the value or the nominal is
    nonzero and not a normal double (frexp exponents in ``[−1021, 1024]``).
    """
    vm, ve = math.frexp(nm * (1.0 + rtol))
    ve += ne
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
    return vm, ve, log_value
