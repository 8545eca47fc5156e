"""The batched closed-form direction in torch: stacked data on a device, no autograd.

The engine behind :func:`attnsvm.gd.run_gd_batch`: a linear-domain fast path while the weights are
representable and the same cancellation-free, log-domain direction as the single form after (per
instance), with token masks (different masks per instance, masked and unmasked mixed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._deps import require
from .._types import FloatArray
from ..errors import AttnSVMError, InvalidInstanceError, NumericalError, unknown_name
from ..model._grad import (
    CANCELLATION_FACTOR,
    CANCELLED_MESSAGE,
    DATA_SPLIT_BELOW,
    NEGLIGIBLE_LOG,
    _check_log_derivative,
    normalized_risk_grad_of,
)
from ..model._instance import Instance
from ..model._losses import Loss, LossLike, _logistic_derivative, correlation, exponential, get_loss, logistic
from ..scaling import (
    EPS as _EPS,
)
from ._fused import FusedLogDirection, kernel_status
from ._fused import _load as _fused_library
from ._scaled import _LN2, _TINY, _pow2_factors
from ._stack import _stack_instances, _torch_device


class _InstanceRefusal(NumericalError):
    """The single form's refusal of instance ``instance`` of a batch (:meth:`BatchEngine._spread_parts`):
    ``"instance b: <the single form's message>"``; ``cause`` is the single form's error."""

    def __init__(self, instance: int, cause: NumericalError) -> None:
        super().__init__(f"instance {instance}: {cause}")
        self.instance = instance
        self.cause = cause


class BatchEngine:
    """The batched engine: ``B`` equal-shaped instances on one torch device and the normalized direction of
    each one's risk gradient, in closed form (no autograd), float64.

    What it computes. For instance ``b`` (keys ``x_it``, labels ``Y_i``, queries ``z_i``, value head ``v``)
    and a ``d × d`` matrix ``W_b``: logits ``l_it = x_itᵀ W_b z_i`` (:meth:`logits`), attention
    ``s_i = softmax_t(l_i·)``, outputs ``f_i = Σ_t s_it a_it`` with token values ``a_it = vᵀx_it``, the
    risk ``L(W_b) = (1/n) Σ_i ℓ(Y_i f_i)`` (:meth:`risk`) and

        ∇L(W_b) = (1/n) Σ_i Σ_t w_it x_it z_iᵀ,    w_it = ℓ'(Y_i f_i) Y_i s_it (a_it − f_i),
        D_b = ∇L(W_b) / ||∇L(W_b)||_F   and   log||∇L(W_b)||_F        (:meth:`direction`),

    the quantities of :func:`attnsvm.normalized_risk_grad`, for every instance at once; one GD step
    ``W_b ← W_b − η D_b`` (normalized) or ``W_b ← W_b − η ∇L(W_b)`` (plain) is :meth:`step_`. The weights
    are formed without cancellation (``a_it − f_i`` as ``Σ_u s_iu (a_it − a_iu)`` around a selected token).

    Two paths to ``D``, chosen per call and per instance; they agree to ~1e-14 (measured ≤ 7e-14 from
    ``||W|| = 0`` to far past the underflow of ``∇L``), so the choice does not show in the iterates:

    * the fast path (linear domain, about half the passes; :meth:`_direction_fast`): ``E_it = e^{l_it −
      max_u l_iu}`` and ``w_it = E_it (α_i δ_it − α_i ψ_i/S_i)`` with ``α_i = ℓ'_i/S_i``, accepted for an
      instance whose largest weight is finite, ``≥ FAST_MIN_WEIGHT`` and far above what a subnormal factor
      could contribute;
    * the log-domain path (:meth:`_direction_log`), exact at any ``||W||``: ``w_it = −sign(ℓ'_i) A_i c_it``
      with ``A_i = |ℓ'_i| e^{m_i}`` (the factor that underflows) kept as a logarithm and each instance's
      largest factored out before it is exponentiated (by parts beyond ``LOG_WEIGHT_SPLIT``: the O(1)
      parts of the logs are not added to log weights of size 1e14 and rounded away).

    Data spanning the range within one sequence (a key or an entry of ``v`` ``2^−511`` below its sequence's
    largest, values whose products leave the normal range: :meth:`_init_spread`), and an instance whose
    gradient sum comes out below ``G_TINY`` (terms that matter may have underflowed), take the single form,
    :func:`attnsvm.model._grad.normalized_risk_grad_of`, for that instance (:meth:`_spread_parts`): the
    engine's shared scales cannot hold a value of 5.5e-378 next to one of 1e-150, nor a term of 1e-323.

    ``path="auto"`` (``fast=True``) tries the fast path and recomputes by the log-domain path the instances
    it cannot certify; once more than ``LOG_FRACTION`` of the batch needed that, the next calls use the
    log-domain path for the whole batch, retrying the fast path every ``LOG_RETRY`` calls. Instances whose
    sequences differ wildly in size always take the log-domain path (:meth:`_init_mixed`). ``path="log"``
    (``fast=False``) takes the log-domain path at every call (for testing and timing the two). After each
    call :attr:`log_path` says which instances took the log-domain path; :attr:`stats` counts the calls by
    path ("fast": whole batch, "log": whole batch, "mixed": fast path with a log-domain subset).

    Scale. :meth:`from_instances` gives the engine each instance rescaled by exact powers of two, as every
    engine computes (:mod:`attnsvm.gd._scaled`): ``X' = X·2^−ex``, ``z' = z·2^−ez``, ``v' = v·2^ex``, so that
    ``x'ᵀ W' z' = xᵀ W z`` with ``W'_b = W_b·2^k_b``, ``k_b = ex + ez`` (:attr:`scale_exponents`; 0 for every
    instance when all keys and queries lie within ``2^±64``: the two scales then coincide). Every method
    takes and returns ``W`` in the engine's scale ``W'``; :meth:`to_engine_scale` and :meth:`to_user_scale`
    map iterates exactly (powers of two). The direction is the same in both scales, the logits, risk and
    refusals are scale-free, and ``log||∇_W L(W_b)|| = log||∇_{W'} L(W'_b)|| + k_b ln 2``: a GD step in the
    user's scale is ``W_b ← W_b − η D_b`` with ``D`` computed at ``W' = to_engine_scale(W)`` (what
    :func:`attnsvm.gd.run_gd_batch` does). :meth:`engine_instance` is instance ``b`` as the engine holds it.

    Construction. :meth:`from_instances` (validated; the way in for users). The constructor
    ``BatchEngine(X, Y, z, v, lo, device, fast=True, *, mask=None)`` takes stacked arrays as they are
    (``X`` ``(B, n, T, d)``, ``Y`` ``(B, n)``, ``z`` ``(B, n, d)``, ``v`` ``(B, d)``, a resolved loss, a
    ``torch.device``; ``mask`` below): it checks only the mask and does not rescale
    (:attr:`scale_exponents` = 0), for callers that hold stacked float64 data of moderate size.

    Layout is token-major and feature-major: ``Xt[t, k, b, i] = X_b[i, t, k]`` (shape
    ``(T, d, B, n)``), per-token arrays ``(T, B, n)``. Reductions over tokens are then
    elementwise operations on contiguous ``(B, n)`` slabs, the two contractions with ``X``
    (logits and gradient) stream it once each, without temporaries of its size, and
    ``y_b = (Σ_t w_it x_it)_i`` is a ``(d, n)`` matrix with unit inner stride that the final
    batched product reads in place (no layout copy).

    Everything that does not depend on ``W`` is computed once here: the token values
    ``a_it = x_itᵀ v_i``, the scores ``γ_it = Y_i a_it`` and, per instance, the bound
    ``Δ_b = 2 max |γ|`` used by the fast path's underflow test.

    Two ways to the same direction (see :meth:`_parts`): a linear-domain fast path (about
    half the passes) used while no weight that matters is below the normal range, and the
    log-domain path, taken automatically, per step and per instance, for the instances where
    the fast path could lose digits. ``fast=False`` forces the log-domain path everywhere.

    A GD step is :meth:`gradient` then :meth:`update_` (or :meth:`step_`, both): the iterate is
    updated in place by one fused pass, the unit direction never materialised;
    :meth:`direction` returns it for callers that need it.

    Refusals, per instance, as :func:`attnsvm.model._grad.normalized_risk_grad_of`: ``cancelled`` where
    ``||G|| ≤ CANCELLATION_FACTOR·(nT·eps·Σ|w_it| ||x_it|| ||z_i|| + VE)``, ``VE`` the rounding of the
    token values carried into ``G`` (:meth:`_value_error`; exact copies of a token charge nothing),
    and :attr:`undetermined` where ``ℓ'(Y_i f_i)`` is (:meth:`_check_undetermined`). Each is decided
    by a cheap bound first (a few passes over ``(T, B, n)``, vectorised); the exact ``O(T²)`` terms
    are formed only for the instances the bound does not clear.

    Token masks: ``mask`` (keyword, boolean ``(B, n, T)``, ``True`` = the token takes part, ≥ 1 per
    sequence; ``None`` or all ``True``: no mask, and no pass below does any mask work). A masked token
    is stored as a zero key (value, score, norm and value magnitude 0: it sets no scale, bound or
    maximum — ``Δ_b``, ``||x|| ||z||``, the rounding levels, the undetermined-ℓ' screen) and its logit is
    ``−inf`` (:meth:`logits`), so its weight ``e^{l − max l}`` is exactly 0 and it is never a maximiser.
    The passes that form ``l_t − l_u`` are safe for it: the fast path subtracts the (finite) largest
    logit only; the log-domain path keeps masked tokens out of the tied set ``Z`` and, for a sequence
    with one allowed token (no runner-up, ``l' = −inf``), shifts by 0 instead of ``−inf`` (then ``E = 0``,
    ``ψ = 0``, ``m = −inf``: weights exactly 0, no ``−inf − (−inf)``); ``log_softmax`` gives ``−inf`` log
    weights, which only meet finite terms or other ``−inf`` (``−inf + −inf``) and products with 0 weights.
    Exact-duplicate classes count allowed tokens only (a zeroed key is nobody's copy).
    """

    #: Fast-path acceptance: the largest weight |w_it| of an instance must be ≥ this (its
    #: weights down to 1e-16·max are then ≥ 1e-296, normal, hence exact to a few ulps; the
    #: smaller ones are below the rounding error of the sum they enter).
    FAST_MIN_WEIGHT = 1e-280
    #: When more than this fraction of a batch needed the log-domain path, the next steps use
    #: it for the whole batch (retrying the fast path every ``LOG_RETRY`` steps): once
    #: saturated, an instance stays saturated as ``||W||`` grows, and a failed fast attempt
    #: costs half a step.
    LOG_FRACTION = 0.5
    LOG_RETRY = 16
    #: The fast path's gradient norm is taken unscaled when every accepted ``||G_b||`` lies in
    #: ``[1/NORM_SAFE, NORM_SAFE]`` (no overflow of ``Σ G²``, underflow below 1e-26 relative).
    NORM_SAFE = 1e140
    _LOG_NORM_SAFE = math.log(NORM_SAFE)
    #: The cheap bound on the values' rounding error (:meth:`_value_bound_log`) is scaled by this, so
    #: that its own rounding (≤ (T+d)·eps relative) cannot make it fall below the exact term.
    VALUE_SAFETY = 1.01

    def __init__(
        self,
        X: FloatArray,
        Y: FloatArray,
        z: FloatArray,
        v: FloatArray,
        lo: Any,
        device: Any,
        fast: bool = True,
        *,
        mask: NDArray[np.bool_] | None = None,
        kernel: str = "auto",
    ):
        import torch

        self.torch = torch
        kw: dict[str, Any] = {"dtype": torch.float64, "device": device}
        allowed = self._check_mask(mask, np.shape(X))
        if allowed is not None:
            # a masked token is a zero key (no value, no norm: it sets no scale, bound or maximum) whose
            # logit is −inf (logits() fills it in); the caller's X is not modified
            X = np.where(allowed[..., None], np.asarray(X, dtype=np.float64), 0.0)
        vt = self._init_data(X, Y, z, v, allowed, kw)
        B, n, T = self.B, self.n, self.T
        self.lo = lo
        self.log_n = math.log(n)
        self._log_fn = lo.log_neg_derivative_fn if isinstance(lo, Loss) else None
        self._init_buffers(kw)
        self._init_scales(lo, fast, kw)
        self._log_streak = 0
        #: calls of :meth:`direction` by path: "fast" (whole batch), "log" (whole batch),
        #: "mixed" (fast path with a log-domain subset).
        self.stats = {"fast": 0, "log": 0, "mixed": 0, "fused": 0}
        self._init_refusal_bounds(vt)
        cls = self._duplicate_classes(X, allowed)
        self._has_dup = bool(np.any(cls != np.arange(T)))
        self._cls = torch.as_tensor(np.ascontiguousarray(cls.transpose(2, 0, 1)), **kw)  # (T, B, n)
        # ℓ'(Y f) is undetermined where κ·δf > 1 (grad._output_spread); not for the correlation loss.
        self._check_output = lo is not correlation
        #: instances whose ℓ' is undetermined at the last call of :meth:`gradient` (``None``: none),
        #: and ``(sequence, δf)`` of the first such instance, for the error message.
        self.undetermined: Any | None = None
        self.undetermined_detail: dict[int, tuple[int, float]] = {}
        self._init_mixed(np.asarray(X, dtype=np.float64), np.asarray(z, dtype=np.float64), np.asarray(v), kw)
        #: the torch device the data live on, as requested (``cuda`` stays ``cuda`` in run_gd_batch's record)
        self.device = torch.device(device)
        self._v = np.array(v, dtype=np.float64)  # (B, d), for engine_instance
        self._set_scale(np.zeros(B, dtype=np.int64))  # stacked data as given: no rescaling
        self._last_log: Any = None  # the last call's log-domain instances (see log_path)
        self._init_spread(np.asarray(X, dtype=np.float64), np.asarray(v, dtype=np.float64))
        # the fast path's log||G|| − log n below which its G is below G_TINY (see _parts_engine)
        self._log_g_tiny = math.log(self.G_TINY) - self.log_n
        self._under: list[int] = []  # instances whose G came out below G_TINY at this call
        self._last_core: list[int] = []  # instances that took the single form at the last call
        self._fused = self._init_fused(kernel, X)
        del self._Xd  # the constant data are formed: no reference to the caller's X is kept
        self._last_l: Any | None = None  # the logits of the last gradient call (see _last_logits)
        self._last_fused = False  # the last gradient call was the fused kernel's (see _last_margins)

    def _init_data(
        self, X: Any, Y: Any, z: Any, v: Any, allowed: NDArray[np.bool_] | None, kw: dict[str, Any]
    ) -> Any:
        """The constant data in the engine's layout; returns ``vt = vᵀ`` ``(d, B)``.

        Sets ``B, n, T, d``, the masks ``_allowed``/``_masked`` ``(T, B, n)`` (``None`` without a mask),
        ``Xt[t, k, b, i] = X_b[i, t, k]``, ``zB`` ``(B, n, d)``, ``zT`` ``(B, d, n)``, ``Y`` ``(B, n)``,
        the token values ``a_it = x_itᵀ v_b``, the scores ``γ_it = Y_i a_it`` and
        ``Δ_b = max(2 max|γ|, _TINY)`` (``X`` has its masked keys zeroed already).
        """
        torch = self.torch
        Xd = torch.as_tensor(X, **kw)
        B, n, T, d = Xd.shape
        self.B, self.n, self.T, self.d = B, n, T, d
        #: (T, B, n) boolean: True at the masked tokens; ``None`` when every token takes part (every
        #: mask-only pass is then skipped: the unmasked batch runs the unmasked code)
        self._masked: Any | None = None
        self._allowed: Any | None = None
        if allowed is not None:
            self._allowed = torch.as_tensor(
                np.ascontiguousarray(allowed.transpose(2, 0, 1)), device=kw["device"]
            )
            self._masked = (~self._allowed).contiguous()
        self.Xt = Xd.permute(2, 3, 0, 1).contiguous()  # (T, d, B, n)
        self.zB = torch.as_tensor(z, **kw).contiguous()  # (B, n, d)
        self.zT = self.zB.transpose(1, 2).contiguous()  # (B, d, n)
        self.Y = torch.as_tensor(Y, **kw).contiguous()  # (B, n)
        vt = torch.as_tensor(v, **kw).T.contiguous()  # (d, B)
        self._Xd = Xd  # (B, n, T, d), for the constant data below (deleted at the end of the constructor)
        self.a = self._values_of(vt)  # token values a_it = x_itᵀ v_b, (T, B, n)
        self.gamma = (self.a * self.Y).contiguous()  # token scores γ_it = Y_i a_it, constant
        # Δ_b = 2 max|γ| bounds |δ_it| = |γ_it − γ_ir| (fast-path underflow test); ≥ tiny so 0·Δ = 0.
        self.delta_bound = (2 * self.gamma.abs().amax(dim=0).amax(dim=-1)).clamp_min(_TINY)
        return vt

    def _values_of(self, vt: Any, *, magnitude: bool = False) -> Any:
        """``a_it = Σ_k x_itk v_k`` (``magnitude``: ``m_it = Σ_k |x_itk| |v_k|``) as ``(T, B, n)``, from ``Xt``.

        Summed over ``k = 0, …, d−1`` in that order, one multiply-add per feature over the contiguous slab
        ``Xt[:, k]`` (``vt`` is ``vᵀ``, ``(d, B)``): error ``≤ d·eps·m_it``, and each entry depends on its own
        token alone (the same bits in any batch). A batched matrix product of ``(n·T, d)`` by ``(d, 1)`` blocks
        took ten times longer for these shapes."""
        T, d, B, n = self.Xt.shape
        torch = self.torch
        w = vt.abs() if magnitude else vt
        slab = torch.empty((T, B, n), dtype=vt.dtype, device=vt.device) if magnitude else None

        def feature(k: int) -> Any:
            return torch.abs(self.Xt[:, k], out=slab) if magnitude else self.Xt[:, k]

        out = torch.mul(feature(0), w[0].view(B, 1))
        for k in range(1, d):
            out.addcmul_(feature(k), w[k].view(B, 1))
        return out

    def _init_scales(self, lo: Any, fast: bool, kw: dict[str, Any]) -> None:
        """The scales of the rounding tests and the fast path's acceptance constants.

        ``_xz_it = ||x_it|| ||z_i||`` and its max over tokens, ``_live_i = [max_t _xz_it > 0]``,
        ``_cancel_rtol = CANCELLATION_FACTOR·n·T·eps``, ``κ = 1e18·T·_TINY``, ``κ·Δ_b`` and, for the
        logistic loss with every ``Δ_b ≤ 1e300``, the bounded threshold ``max(κ·Δ_b, FAST_MIN_WEIGHT)``.
        """
        torch = self.torch
        n, T = self.n, self.T
        # ||x_it|| ||z_i|| (T, B, n) and its max over tokens: the scale of the rounding error of G. A norm
        # squares its entries: rows below ~1e-154 would read 0 (a live sequence taken for dead), so those
        # rows' norms are formed from the row scaled by a power of two (exact; the others unchanged).
        # over X's own layout (contiguous rows: a tenth of the time of the strided norm over Xt; the norms
        # enter only the rounding levels, which are bounds)
        x_norm = self._row_norm(self._Xd, 3).permute(2, 0, 1).contiguous()  # (T, B, n)
        z_norm = self._row_norm(self.zB, 2)  # (B, n)
        self._xz = (x_norm * z_norm).contiguous()
        self._xz_max = self._xz.amax(dim=0)
        # A sequence with z_i = 0 (or x_i· = 0) contributes nothing to G, however large its weights: it
        # must not set the scale of an instance (its weights would mask the others' underflow).
        self._live = (self._xz_max > 0).to(torch.float64)  # (B, n)
        self._any_dead = not bool(self._live.all())
        self._cancel_rtol = CANCELLATION_FACTOR * n * T * float(np.finfo(np.float64).eps)
        self._neg_inf = torch.tensor(-math.inf, **kw)
        self.fast = bool(fast)
        # κ: a weight below κ·Δ_b·max|α| could come from a subnormal factor (E_it or ψ_i); the
        # fast path is accepted only when the largest weight is far above that (≥ 1e18 × it).
        self._kappa = 1e18 * T * _TINY
        self._kappa_delta = self.delta_bound * self._kappa
        self._logistic = isinstance(lo, Loss) and lo.derivative_fn is _logistic_derivative
        # Logistic loss: |ℓ'| = σ(−u) ≤ 1 and S ≥ 1, so |α| ≤ 1, and the fast path's acceptance
        # threshold max(max|α| κ Δ_b, FAST_MIN_WEIGHT) is at most this constant, per instance
        # (Δ_b ≤ 1e300 keeps |w| ≤ 2|α|Δ_b finite without a per-step test).
        self._thr_bounded = (
            self._kappa_delta.clamp_min(self.FAST_MIN_WEIGHT)
            if self._logistic and bool((self.delta_bound <= 1e300).all())
            else None
        )

    def _init_buffers(self, kw: dict[str, Any]) -> None:
        """The reused per-call buffers (contents undefined until a call writes them) and the per-feature /
        per-token slabs of the constant data and of the buffers: ``_l, _E, _F, _w, _P`` ``(T, B, n)``,
        ``_y, _q`` ``(d, B, n)``, ``_qB`` ``(B, d, n)``, ``_G`` ``(B, d, d)``; ``_X_feat[k] = Xt[:, k]``,
        ``_X_tok[t] = Xt[t]``, ``_q_feat[k] = _q[k]``, ``_w_tok[t] = _w[t]`` (views) and ``_Bn = B·n``."""
        torch = self.torch
        B, n, T, d = self.B, self.n, self.T, self.d
        self._l = torch.empty((T, B, n), **kw)
        self._E = torch.empty((T, B, n), **kw)
        self._F = torch.empty((T, B, n), **kw)
        self._w = torch.empty((T, B, n), **kw)
        self._y = torch.empty((d, B, n), **kw)
        self._P = torch.empty((T, B, n), **kw)  # products reduced over tokens
        self._qB = torch.empty((B, d, n), **kw)  # W z_i, bmm layout
        self._q = torch.empty((d, B, n), **kw)  # W z_i, X's layout
        # The full-batch gradient (and the returned direction): a reused buffer, valid until the next
        # call; fresh (B, d, d) tensors each step cost page faults comparable to a pass over X.
        self._G = torch.empty((B, d, d), **kw)
        # Per-feature / per-token slabs of the constant data and of the reused buffers, taken once:
        # slicing them anew each step costs more dispatch time than the small reductions it feeds.
        self._X_feat = [self.Xt[:, k] for k in range(d)]  # (T, B, n) each
        self._X_tok = [self.Xt[t] for t in range(T)]  # (d, B, n) each
        self._q_feat = [self._q[k] for k in range(d)]  # (B, n) each
        self._w_tok = [self._w[t] for t in range(T)]  # (B, n) each
        self._Bn = B * n

    def _init_refusal_bounds(self, vt: Any) -> None:
        """The constants of the single form's refusals (grad.normalized_risk_grad_of), per instance.

        ``amag_it = m_it = Σ_k |v_k x_itk|`` (``a_it`` is known to ``±d·eps·m_it``), its max over tokens,
        ``_ve_const = 4·d·eps·VALUE_SAFETY·max_t m_it·max_t ||x_it|| ||z_i||`` and its log, and the
        undetermined-ℓ' screen's ``_df_c0 = max_i (T+d)·eps·max_t|a_it|``,
        ``_df_c1 = max_i 2d²·eps·max_t ||x_it|| ||z_i||·max_t|a_it|`` and ``_d_eps = d·eps``.
        """
        torch = self.torch
        T, d = self.T, self.d
        # The values' own rounding: a_it = vᵀx_it is known to ±d·eps·m_it, m_it = Σ_k |v_k x_itk|.
        self.amag = self._values_of(vt, magnitude=True)  # m_it
        self._amag_max = self.amag.amax(dim=0)  # (B, n)
        # constant factor of the cheap value bound (see _value_bound_log): 4·d·eps·max m·max||x|| ||z||
        # per sequence, and its log (−inf for a sequence with no value or no query: it adds nothing)
        self._ve_const = self._amag_max * self._xz_max * (4.0 * d * _EPS * self.VALUE_SAFETY)
        self._log_ve_const = torch.log(self._ve_const)
        # the undetermined-ℓ' screen, per instance: δf_i ≤ [(T+d)·eps + 2d²·eps·||W||_F·max||x|| ||z||]·max|a|
        a_abs_max = self.a.abs().amax(dim=0)  # (B, n): bounds Σ_t s_it |a_it|
        self._df_c0 = ((T + d) * _EPS * a_abs_max).amax(dim=-1)  # (B,)
        self._df_c1 = (2.0 * d * d * _EPS * self._xz_max * a_abs_max).amax(dim=-1)  # (B,)
        self._d_eps = d * _EPS

    def _duplicate_classes(self, X: FloatArray, allowed: NDArray[np.bool_] | None) -> NDArray[np.intp]:
        """``cls_it`` = the first token ``u`` of sequence ``i`` with ``x_iu = x_it`` bitwise (after ``+ 0.0``),
        shape ``(B, n, T)``; a masked token (``allowed`` False) is its own class only."""
        T, d = self.T, self.d
        # Exact-duplicate classes (constant): cls_it = the first token u with x_iu = x_it bitwise. A token
        # and its copy have bitwise equal values, so their difference is exact (no rounding charged).
        # Rows compared as d·8 raw bytes ((B, n, T, T), not (…, d)); + 0.0 turns −0 into +0, so that the
        # test is the single form's X_t == X_u.
        X = np.asarray(X, dtype=np.float64)
        # Equal first features are necessary for equal rows (finite data: bitwise equality after + 0.0 is
        # float equality): where no two tokens of a sequence share it (the usual case, one cheap pass),
        # every token is its own class, as the full test below would find (masked or not).
        x0 = X[..., 0]  # (B, n, T)
        if int(np.count_nonzero(x0[:, :, :, None] == x0[:, :, None, :])) == x0.size:
            cls = np.broadcast_to(np.arange(T), x0.shape).copy()  # only t == u matched
        else:
            Xn = np.ascontiguousarray(X + 0.0)
            rows = Xn.view(np.dtype((np.void, 8 * d)))[..., 0]  # (B, n, T)
            same = rows[:, :, :, None] == rows[:, :, None, :]  # (B, n, T, T)
            if allowed is not None:
                # a masked token is no token of its sequence: its zeroed key is nobody's copy (its own class)
                same &= allowed[:, :, :, None] & allowed[:, :, None, :]
                same |= np.eye(T, dtype=bool)
            cls = np.argmax(same, axis=-1)  # (B, n, T): first equal token
        return cls

    #: The values of ``path`` (:meth:`from_instances`): "auto" (fast path where it is exact, log-domain
    #: path elsewhere) and "log" (log-domain path everywhere).
    PATHS = ("auto", "log")
    #: The values of ``kernel``: "auto" (the fused CPU kernel where it applies, else the eager paths),
    #: "fused" (the fused kernel, refused where it cannot run) and "eager" (the eager paths only).
    KERNELS = ("auto", "fused", "eager")

    @classmethod
    def from_instances(
        cls,
        instances: Sequence[Instance],
        *,
        loss: str | LossLike = "logistic",
        device: Any = None,
        path: str = "auto",
        kernel: str = "auto",
    ) -> BatchEngine:
        """The engine of ``instances``, validated, stacked and rescaled as in :func:`attnsvm.gd.run_gd_batch`.

        Each instance is rescaled by exact powers of two (``x'ᵀ W' z' = xᵀ W z`` with ``W'_b = W_b·2^k_b``,
        :attr:`scale_exponents`; ``k = 0`` for the whole batch when every key and query lies within
        ``2^±64``), its masked keys zeroed and its mask kept (instances of one batch may have different
        masks, or none).

        Args:
          instances: a non-empty sequence of :class:`~attnsvm.Instance` of one shape ``(n, T, d)``.
          loss: ``"logistic"``, ``"exponential"``, ``"correlation"`` or a loss object (as in
            :func:`attnsvm.gd.run_gd`).
          device: ``None``/``"cpu"``, ``"cuda"`` or ``"cuda:i"`` (refused when CUDA or the index is missing).
          path: ``"auto"`` (the fast path where it is exact, the log-domain path elsewhere) or ``"log"``
            (the log-domain path at every call); see the class docstring.
          kernel: ``"auto"`` (the fused CPU kernel where it applies, :attr:`kernel` says which ran),
            ``"fused"`` (required: refused where it cannot run) or ``"eager"`` (the eager paths only).

        Raises:
          AttnSVMError: not a non-empty sequence of instances of one shape, or a device torch cannot use.
          UnknownNameError: an unknown loss, path or kernel name.
          AttnSVMError: ``kernel="fused"`` where the fused kernel cannot run (the reason is named).
          NumericalError: an instance whose token values are not normal doubles (as in
            :func:`attnsvm.gd.run_gd`).
          MissingDependencyError: torch is not installed (the ``torch`` extra).
        """
        require("torch", feature="BatchEngine (the batched torch engine)")  # pragma: no mutate
        lo = get_loss(loss)
        if not isinstance(path, str) or path not in cls.PATHS:
            raise unknown_name("path", path, cls.PATHS)
        dev = _torch_device(device)
        X, Y, z, v, k, allowed = _stack_instances(instances)
        eng = cls(X, Y, z, v, lo, dev, fast=path == "auto", mask=allowed, kernel=kernel)
        eng._set_scale(k)
        return eng

    def _set_scale(self, k: NDArray[np.int64]) -> None:
        """Record the exponents ``k_b`` (``W'_b = W_b·2^k_b``) and the powers of two that map ``W``."""
        torch = self.torch
        k = np.array(k, dtype=np.int64)
        k.setflags(write=False)
        self._scale_exponents = k

        def factors(e: NDArray[np.int64]) -> list[Any]:
            kw: dict[str, Any] = {"dtype": torch.float64, "device": self.device}
            return [torch.as_tensor(f, **kw).view(self.B, 1, 1) for f in _pow2_factors(e)]

        self._up, self._down = factors(k), factors(-k)

    @property
    def scale_exponents(self) -> NDArray[np.int64]:
        """``k_b`` per instance, shape ``(B,)``, read-only: the engine's iterate is ``W'_b = W_b·2^k_b``."""
        return self._scale_exponents

    @property
    def path(self) -> str:
        """``"auto"`` or ``"log"`` (see :meth:`from_instances`)."""
        return "auto" if self.fast else "log"

    def to_engine_scale(self, W: Any, *, out: Any | None = None) -> Any:
        """``W'_b = W_b·2^k_b`` (``(B, d, d)`` float64 tensor on :attr:`device`), by exact powers of two.

        Returns ``W`` itself when every ``k_b = 0`` (no copy, no cost); otherwise a new tensor, or ``out``
        (a ``(B, d, d)`` buffer, reused across steps). Exact while ``W'`` is a normal double.
        """
        if not self._up:
            return W
        out = self.torch.mul(W, self._up[0], out=out)
        for f in self._up[1:]:
            out.mul_(f)
        return out

    def to_user_scale(self, W: Any) -> Any:
        """``W_b = W'_b·2^−k_b``, the inverse of :meth:`to_engine_scale` (``W'`` itself if every k_b = 0)."""
        if not self._down:
            return W
        out = W * self._down[0]
        for f in self._down[1:]:
            out.mul_(f)
        return out

    def engine_instance(self, b: int) -> Instance:
        """Instance ``b`` as the engine holds it: ``X'`` (masked keys zeroed), ``Y``, ``v'``, ``z'`` and its
        mask; its logits at ``W'_b`` are the user's instance's at ``W_b``, its token values the same."""
        if not isinstance(b, (int, np.integer)) or not 0 <= int(b) < self.B:
            raise AttnSVMError(f"instance index must be an integer in [0, {self.B}); got {b!r}")
        b = int(b)
        X = self.Xt[:, :, b].permute(2, 0, 1).cpu().numpy()  # (n, T, d)
        mask = None
        if self._allowed is not None:
            allowed = self._allowed[:, b].T.cpu().numpy()
            mask = None if allowed.all() else allowed
        z, Y = self.zB[b].cpu().numpy(), self.Y[b].cpu().numpy()
        return Instance(X, Y, self._v[b], z, mask=mask)

    @property
    def log_path(self) -> NDArray[np.bool_]:
        """Which instances took the log-domain path at the last call of :meth:`direction`,
        :meth:`gradient` or :meth:`step_`: a boolean ``(B,)`` array (``True``: log-domain path)."""
        last = self._last_log
        if last is None:
            raise AttnSVMError(
                "log_path is known after a call of direction, gradient or step_; call one first"
            )
        out = np.full(self.B, last is True)
        if not isinstance(last, bool):
            out[last.cpu().numpy()] = True  # the log-domain subset of a mixed call
        out[self._last_core] = True  # the single form's log-domain direction (see _spread_parts)
        return out

    #: Mixed-magnitude data (see :meth:`_init_mixed`): a live sequence whose keys or query have their
    #: largest entry below ``2^−SEQ_MODERATE``, or whose terms ``c·x zᵀ`` (``c`` of the size of its values,
    #: ``≤ d·2^(kx+kv)``) have the scale ``2^(2kx + kz + kv)`` outside ``2^±TERM_MODERATE``, makes its instance
    #: "mixed". Otherwise a sequence's largest term is within 2^±800 and those that matter (≥ 2^−60 of it)
    #: are normal doubles (≥ 2^−860 > 2^−1022): the engine's per-instance scaling is exact there, as before.
    #: (The data of every instance of the existing tests are of this kind: they run bit for bit as before.)
    SEQ_MODERATE = 64
    TERM_MODERATE = 800

    def _init_mixed(self, X: FloatArray, z: FloatArray, v: FloatArray, kw: dict[str, Any]) -> None:
        """Per-sequence power-of-two scaling for instances whose sequences differ wildly in size.

        Each term of ``G`` is ``A_i c_it x_it z_iᵀ`` (:meth:`_direction_log`); the engine factors out the
        largest ``A_i`` only, so with keys, queries or values of very different size per sequence (a query
        of 1e-274, values of 3e-237) the products ``c x z`` underflow — a whole live sequence lost, or read
        as dead — although ``∇L`` is well determined (the single form scales each row on its own,
        ``split_rows``). For such an instance ("mixed", ``_mixed``, (B,) bool) every sequence is scaled as
        the single form does: ``x' = x·2^−kx_i``, ``z' = z·2^−kz_i``, ``v' = v·2^−kv`` (largest entries in
        ``[½, 1)``, exact), scores ``γ'_it = Y_i x'ᵀv'`` (``γ = 2^kg γ'``, ``kg_i = kx_i + kv``), and the
        log-domain path runs on them with ``log A_i`` raised by ``σ_i = (kg_i + kx_i + kz_i)·ln 2``, so that
        the largest term of the whole instance is O(1) before the sum. The fast path does not take a mixed
        instance (its weights are absolute). Every other instance keeps its data (exponents 0, the arrays
        below equal to the plain ones bit for bit), so ordinary data run the unchanged engine.
        """
        torch = self.torch
        self._mixed: Any | None = None
        self._all_mixed = False
        # the exact logs of ||x|| ||z||, (T, B, n), and of its max, (B, n); which sequences are live
        self._log_xz = torch.log(self._xz)
        self._log_xz_max = torch.log(self._xz_max)
        Xd = self._Xd  # X as a tensor: max(max x, −min x) per sequence, without a temporary of X's size
        ax = self.torch.maximum(Xd.amax(dim=(2, 3)), Xd.amin(dim=(2, 3)).neg()).cpu().numpy()  # (B, n)
        az = np.max(np.abs(z), axis=2)  # (B, n)
        #: each instance's largest key and query entry, ``max|x|`` and ``max|z|``, as the engine holds them: (B,)
        self._key_max, self._query_max = ax.max(axis=1), az.max(axis=1)
        av = np.max(np.abs(v), axis=1)  # (B,)
        kx = np.frexp(np.where(ax > 0, ax, 1.0))[1].astype(np.int64)
        kz = np.frexp(np.where(az > 0, az, 1.0))[1].astype(np.int64)
        kv = np.frexp(np.where(av > 0, av, 1.0))[1].astype(np.int64)
        live = (ax > 0) & (az > 0)
        odd = live & (
            (kx < -self.SEQ_MODERATE)
            | (kz < -self.SEQ_MODERATE)
            | (np.abs(2 * kx + kz + kv[:, None]) > self.TERM_MODERATE)
        )
        mixed = odd.any(axis=1)  # (B,)
        if not mixed.any():
            return
        kx = np.where(mixed[:, None], kx, 0)
        kz = np.where(mixed[:, None], kz, 0)
        kv = np.where(mixed, kv, 0)
        kg = kx + kv[:, None]  # (B, n): γ = 2^kg γ'
        Xs = np.ldexp(X, -kx[:, :, None, None])  # (B, n, T, d)
        zs = np.ldexp(z, -kz[:, :, None])
        vs = np.ldexp(v, -kv[:, None])
        m_t = torch.as_tensor(mixed, device=kw["device"])
        mb = m_t.view(-1, 1)  # (B, 1)
        self._mixed = m_t
        self._all_mixed = bool(mixed.all())
        Xst = torch.as_tensor(Xs, **kw).permute(2, 3, 0, 1)  # (T, d, B, n)
        self._Xs = torch.where(mb, Xst, self.Xt).contiguous()
        self._Xs_tok = [self._Xs[t] for t in range(self.T)]
        self._zs = torch.where(mb.unsqueeze(-1), torch.as_tensor(zs, **kw), self.zB).contiguous()
        vst = torch.as_tensor(vs, **kw).T.contiguous()  # (d, B)
        gam = torch.einsum("tkbi,kb->tbi", self._Xs, vst) * self.Y
        self._gamma_s = torch.where(mb, gam, self.gamma).contiguous()
        # γ = 2^kg γ' applied as two factors (2^kg alone may not be a double); 1·1 elsewhere
        h = kg // 2
        self._kg_f1 = torch.as_tensor(np.ldexp(1.0, h), **kw)
        self._kg_f2 = torch.as_tensor(np.ldexp(1.0, kg - h), **kw)
        self._sigma = torch.as_tensor((kg + kx + kz) * _LN2, **kw)  # (B, n), 0 off the mixed instances
        # the norms of the scaled rows, and the exact logs in the true units
        xz_s = self._row_norm(self._Xs, 1) * self._row_norm(self._zs, 2)
        self._xz_s = torch.where(mb, xz_s, self._xz).contiguous()
        log_xz = torch.log(xz_s) + torch.as_tensor((kx + kz) * _LN2, **kw)
        self._log_xz = torch.where(mb, log_xz, self._log_xz).contiguous()
        self._log_xz_max = self._log_xz.amax(dim=0)
        amag_s = torch.einsum("tkbi,kb->tbi", self._Xs.abs(), vst.abs()).amax(dim=0)
        log_amag = torch.log(amag_s) + torch.as_tensor((kx + kv[:, None]) * _LN2, **kw)
        log_ve = log_amag + self._log_xz_max + math.log(4.0 * self.d * _EPS * self.VALUE_SAFETY)
        self._log_ve_const = torch.where(mb, log_ve, self._log_ve_const)
        live_t = torch.as_tensor(live, device=kw["device"])
        self._live_bn = torch.where(mb, live_t, self._xz_max > 0)
        self._live = self._live_bn.to(torch.float64)
        self._any_dead = not bool(self._live_bn.all())

    #: Log weights (``log s``, ``|l_r|`` for the selected logit) beyond this are combined with the O(1) parts
    #: of the log-domain path by parts (logit differences first, then the O(1) logs; across sequences
    #: ``(m_i − m_j) + (log|ℓ'_i| − log|ℓ'_j|)``), as the single form does (``grad.LOG_WEIGHT_SPLIT``): below it
    #: a plain sum keeps the O(1) part to ``2^11·eps`` ≈ 5e-13 relative (the form of ordinary data, bit for bit
    #: as before), above it a sum with a log of size 1e14 rounded it to ±0.02.
    LOG_WEIGHT_SPLIT = 2.0**11

    #: A gradient sum ``G`` below this (the fast path's ``Σ w x zᵀ``, the log-domain path's ``G`` in the
    #: units of its largest ``A``) may have lost terms that matter to underflow: its terms are products of
    #: normal factors (a value difference, a key, a query, a weight) that can each be far below 1, and
    #: above it the largest term is ≥ 2^−1000/(nTd) while a product that underflows errs by ≤ 2^−1075
    #: absolutely (≤ nTd·2^−75 of ``||G||`` in all, far below the 1e-8 the engine is held to). Such an
    #: instance takes the single form at that call (:meth:`_spread_parts`); ordinary data never come near.
    G_TINY = 2.0**-1000

    #: A product ``x_itk·v_k`` of the data as the engine holds them (an instance that is not mixed) is a
    #: normal double when the frexp exponents of its factors sum to at least this (``|x| ≥ 2^(ex−1)``,
    #: ``|v| ≥ 2^(ev−1)``: the product is ``≥ 2^(ex+ev−2) ≥ 2^−1022``).
    VALUE_EXPONENT_MIN = -1020

    def _init_fused(self, kernel: str, X: FloatArray) -> FusedLogDirection | None:
        """The fused CPU kernel bound to this engine's data (:mod:`attnsvm.gd._fused`), or ``None`` for the
        eager paths; sets :attr:`kernel_detail`. It applies on the CPU, without token masks or
        mixed-magnitude instances, for the logistic and exponential losses, where a C compiler is found."""
        if not isinstance(kernel, str) or kernel not in self.KERNELS:
            raise unknown_name("kernel", kernel, self.KERNELS)
        reason = None
        if kernel == "eager":
            reason = "kernel='eager' was asked for"
        elif self.device.type != "cpu":
            reason = f"it runs on the CPU only (device {self.device})"
        elif self._masked is not None:
            reason = "the batch has token masks (the eager paths hold them)"
        elif self._mixed is not None:
            reason = "the batch has mixed-magnitude instances (the eager log-domain path scales them)"
        elif self.lo is not logistic and self.lo is not exponential:
            reason = f"it knows the logistic and exponential losses only (loss {getattr(self.lo, 'name', self.lo)!r})"
        else:
            available, detail = kernel_status(self.d)
            if not available:
                reason = detail
        if reason is not None:
            if kernel == "fused":
                raise AttnSVMError(
                    f"kernel='fused' cannot run: {reason}; use kernel='auto' to take the eager paths where it "
                    "cannot run"
                )
            self.kernel_detail = f"eager: {reason}"
            return None
        torch = self.torch
        arrays = {
            "X": torch.tensor(np.asarray(X, dtype=np.float64)),  # a copy: the caller's array may change
            "z": self.zB,
            "gammaT": self.gamma,
            "xzT": self._xz,
            "xz_max": self._xz_max,
            "log_ve": self._log_ve_const,
            "ve_c": self._ve_const,
        }
        scalars = {
            "cancel_rtol": self._cancel_rtol,
            "cancel_factor": float(CANCELLATION_FACTOR),
            "log_n": self.log_n,
            "g_tiny": self.G_TINY,
            "split": self.LOG_WEIGHT_SPLIT,
        }
        self.kernel_detail = detail  # the library, from kernel_status above (it loaded and cached it)
        return FusedLogDirection(_fused_library(self.d), arrays, 0 if self.lo is logistic else 1, scalars)

    @property
    def kernel(self) -> str:
        """``"fused"`` when the fused CPU kernel computes the directions, else ``"eager"``
        (:attr:`kernel_detail` says why)."""
        return "eager" if self._fused is None else "fused"

    @staticmethod
    def _spread_rows(A: FloatArray) -> NDArray[np.bool_]:
        """Per row of ``A`` (2-D): some nonzero entry is below ``DATA_SPLIT_BELOW`` (2^−511) of the row's largest,
        scaled to ``[½, 1)``: ``frexp`` exponents ``p − p_max ≤ −511``, exact for entries of any size."""
        nz = A != 0
        p = np.frexp(A)[1].astype(np.int64)
        top = np.max(np.where(nz, p, np.iinfo(np.int64).min // 2), axis=1, keepdims=True)
        return np.any(nz & (p - top <= math.log2(DATA_SPLIT_BELOW)), axis=1)

    def _init_spread(self, X: FloatArray, v: FloatArray) -> None:
        """Mark the instances whose data span the range within one sequence; they take the single form.

        The engine forms each token value ``a_it = x_itᵀv`` in one scale per instance (per sequence on mixed
        data, :meth:`_init_mixed`). A key entry ``2^−511`` below its sequence's largest, or an entry of
        ``v`` ``2^−511`` below ``v``'s largest, makes products ``x_itk v_k`` underflow there: a value comes
        out 0 or a subnormal with few digits, while ``∇L`` may depend on it alone (two tied maximisers with
        values 0 and 5.5e-378: the engine took them for exact copies, dropped the term of size ~1e-606 that
        dominates ``∇L`` and returned the runner-up's ``e^{−7e26}`` instead, a direction 2 off). The single
        form rescales each token on its own and keeps each term's exponent apart from its O(1) parts
        (:func:`attnsvm.model._grad._split_parts`). Such an instance ("spread": the single form's own split
        criterion on its data, ``DATA_SPLIT_BELOW``, or, on an instance that is not mixed, a token whose
        every product ``x_itk v_k`` in the engine's units is below the normal range, ``VALUE_EXPONENT_MIN``)
        takes its direction, ``log||∇L||`` and refusals from
        :func:`attnsvm.model._grad.normalized_risk_grad_of` at every call (:meth:`_spread_parts`); the
        other instances of its batch run the engine as before (an instance whose ``G`` comes out below
        :data:`G_TINY` takes the single form at that call only, :meth:`_parts`).
        """
        B = X.shape[0]
        spread = np.zeros(B, dtype=bool)
        cand = np.flatnonzero(~self._plainly_unspread(v))
        if cand.size:
            split, low = self._spread_exact(X[cand], v[cand])
            if self._mixed is not None:
                low &= ~self._mixed.cpu().numpy()[cand]  # a mixed instance scales each sequence on its own
            spread[cand] = split | low
        self._spread: Any | None = None
        self._spread_idx: list[int] = [int(b) for b in np.flatnonzero(spread)]
        #: the engine's arrays of an instance that took the single form (masked keys zeroed), and its mask
        self._core_data: dict[int, tuple[FloatArray, FloatArray, FloatArray, FloatArray, Any]] = {}
        if self._spread_idx:
            self._spread = self.torch.as_tensor(spread, device=self.Xt.device)

    #: The cheap screen of :meth:`_plainly_unspread` holds within ``SPREAD_SCREEN`` = 2^−509 of each row's largest
    #: entry (2 below the split criterion's 2^−511: an entry ``≥ max·2^−509`` has a ``frexp`` exponent at most 509
    #: below the maximum's) and, for the values, on entries ``≥ 2^−510`` (a product of two such entries has
    #: exponents summing to at least ``−1018 ≥ VALUE_EXPONENT_MIN``).
    SPREAD_SCREEN = 2.0**-509
    _VALUE_SCREEN = 2.0**-510

    def _plainly_unspread(self, v: FloatArray) -> NDArray[np.bool_]:
        """Per instance, ``True`` where :meth:`_spread_exact` is surely ``False``, from each sequence's largest and
        smallest nonzero ``|x|`` and ``v``'s (a few passes over ``X``, instead of the exponents of every entry).

        Not spread where, in each sequence and in ``v``, the smallest nonzero entry is at least
        :data:`SPREAD_SCREEN` times the largest, the largest being 0 or at least 2^−500 (so that the product is
        exact: a smaller row goes to the exact test), and every nonzero entry of ``X`` and ``v`` is at least
        ``2^−510`` (no product of them leaves the normal range)."""
        B, n, T, d = self._Xd.shape
        A = self._Xd.abs().reshape(B * n, T * d)
        big = A.amax(dim=1)
        small = A.masked_fill_(A == 0, math.inf).amin(dim=1)  # +inf for a sequence of zeros
        ok_x = ((big == 0) | ((big >= 2.0**-500) & (small >= big * self.SPREAD_SCREEN))).view(B, n).all(dim=1)
        low_x = small.view(B, n).amin(dim=1)
        va = np.abs(v)
        v_big = va.max(axis=1)
        v_small = np.where(va > 0, va, np.inf).min(axis=1)
        ok_v = (v_big == 0) | ((v_big >= 2.0**-500) & (v_small >= v_big * self.SPREAD_SCREEN))
        values = (low_x >= self._VALUE_SCREEN).cpu().numpy() & (v_small >= self._VALUE_SCREEN)
        return ok_x.cpu().numpy() & ok_v & values

    def _spread_exact(self, X: FloatArray, v: FloatArray) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """The two tests of :meth:`_init_spread` on instances ``X`` ``(k, n, T, d)``, ``v`` ``(k, d)``, from every
        entry's own exponent: ``(split, low)``, the split criterion and a token value below the normal range."""
        k, n, T, d = X.shape
        # an entry 2^−511 below its row's largest (each sequence's keys, each instance's v), from the entries'
        # own exponents: split_rows would flush entries 2^1074 below the largest to 0 and hide them
        split = self._spread_rows(X.reshape(k * n, T * d)).reshape(k, n).any(axis=1) | self._spread_rows(v)
        # the values as the engine forms them (instances that are not mixed: X and v as held), per token:
        # the largest product's exponent bound; smaller products lose ≤ 2^−1075 each, within d·eps·m
        with np.errstate(divide="ignore"):
            ex = np.where(X != 0, np.frexp(X)[1], -(1 << 20)).astype(np.int64)  # (k, n, T, d)
            ev = np.where(v != 0, np.frexp(v)[1], -(1 << 20)).astype(np.int64)  # (k, d)
        top = np.max(ex + ev[:, None, None, :], axis=3)  # (k, n, T); ≤ −2^20 for a token without a product
        low = np.any((top > -(1 << 19)) & (top < self.VALUE_EXPONENT_MIN), axis=(1, 2))
        return split, low

    def _core_arrays(self, b: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, Any]:
        """``(X', Y, z', v', mask)`` of instance ``b`` as the engine holds it, NumPy (kept once formed)."""
        if b not in self._core_data:
            X = self.Xt[:, :, b].permute(2, 0, 1).cpu().numpy()  # (n, T, d)
            mask = None
            if self._allowed is not None:
                allowed = self._allowed[:, b].T.cpu().numpy()
                mask = None if allowed.all() else np.ascontiguousarray(allowed)
            z, Y = self.zB[b].cpu().numpy(), self.Y[b].cpu().numpy()
            self._core_data[b] = (np.ascontiguousarray(X), Y, z, self._v[b], mask)
        return self._core_data[b]

    _UNDETERMINED = re.compile(r"the output f_(\d+) = .*? known only to ±(\S+) \(values")

    def _spread_parts(
        self, W: Any, core: list[int], G: Any, inv: Any, log_norm: Any, cancelled: Any | None
    ) -> tuple[Any, Any, Any, Any]:
        """:meth:`_parts` with the entries of the instances ``core`` (the spread ones, :meth:`_init_spread`,
        and those whose ``G`` came out below :data:`G_TINY` at this call) replaced by the single
        form's: ``normalized_risk_grad_of`` on the instance as the engine holds it at ``W'_b`` (direction,
        ``inv = 1``, ``log||∇_{W'} L||``). Its refusals become the engine's: cancelled, or an exactly zero
        gradient (``cancelled``, ``G = 0``, ``log_norm = −inf``: no plain step), an undetermined ``ℓ'``
        (:attr:`undetermined`); any other (a gradient below every double, an output beyond float64) is
        raised as :class:`~attnsvm.NumericalError` naming the instance."""
        torch = self.torch
        if cancelled is None:
            cancelled = torch.zeros(self.B, dtype=torch.bool, device=G.device)
        Wn = W.index_select(0, torch.as_tensor(core, device=W.device)).cpu().numpy()
        und = torch.zeros(self.B, dtype=torch.bool, device=G.device)
        if self.undetermined is not None:
            und |= self.undetermined
        for j, b in enumerate(core):
            if not np.all(np.isfinite(Wn[j])):
                continue  # a diverged iterate: the engine's NaN stands (run_gd_batch reports the divergence)
            X, Y, z, v, mask = self._core_arrays(b)
            und[b] = False
            self.undetermined_detail.pop(b, None)
            try:
                gd = normalized_risk_grad_of(X, Y, z, v, Wn[j], self.lo, mask=mask)
            except NumericalError as exc:
                msg = str(exc)
                found = self._UNDETERMINED.search(msg)
                if found is not None:
                    und[b] = True
                    self.undetermined_detail[b] = (int(found.group(1)), float(found.group(2)))
                elif msg == CANCELLED_MESSAGE or msg.startswith("the risk gradient is exactly zero"):
                    G[b] = 0.0
                    inv[b] = 1.0
                    log_norm[b] = -math.inf
                    cancelled[b] = True
                    continue
                else:
                    raise _InstanceRefusal(b, exc) from exc
            else:
                G[b] = torch.as_tensor(gd.direction, dtype=G.dtype, device=G.device)
                inv[b] = 1.0
                log_norm[b] = gd.log_norm
                cancelled[b] = False
        self.undetermined = und if bool(und.any()) else None
        return G, inv, log_norm, cancelled

    #: Rows whose largest entry is below this have their norm formed from the row scaled by a power of
    #: two: their squares (≤ 1e-300) would lose digits or underflow (the norm of a larger row is exact).
    NORM_TINY = 1e-150

    def _row_norm(self, A: Any, dim: int) -> Any:
        """``||A||`` along ``dim``, exact (to rounding) for rows of any size: ``vector_norm`` where the row's
        largest entry is ≥ ``NORM_TINY`` (bit-for-bit the plain norm), ``2^e ||A·2^−e||`` for smaller rows."""
        torch = self.torch
        nrm = torch.linalg.vector_norm(A, dim=dim)
        # max|A| as max(max A, −min A): the same number, without a temporary of A's size
        big = torch.maximum(A.amax(dim=dim), A.amin(dim=dim).neg_())
        tiny = (big > 0) & (big < self.NORM_TINY)
        if bool(tiny.any()):
            # 2^−e in two factors (e ≥ −1073: 2^−e alone may not be a double); 2^e is one (≥ 2^−1073)
            e = torch.where(tiny, torch.frexp(big).exponent, 0).to(A.dtype)
            h = torch.floor(-e / 2)
            up = A * torch.pow(2.0, h).unsqueeze(dim) * torch.pow(2.0, -e - h).unsqueeze(dim)
            nrm = torch.where(tiny, torch.linalg.vector_norm(up, dim=dim) * torch.pow(2.0, e), nrm)
        return nrm

    @staticmethod
    def _check_mask(mask: Any, shape: tuple[int, ...]) -> NDArray[np.bool_] | None:
        """The token mask as a boolean ``(B, n, T)`` array (``True`` = the token takes part), or ``None``
        when there is none or every token takes part; refuses a wrong shape or a sequence with no token."""
        if mask is None:
            return None
        allowed = np.asarray(mask)
        if allowed.dtype != np.bool_ or allowed.shape != tuple(shape[:3]):
            raise InvalidInstanceError(
                f"mask must be a boolean array of shape (B, n, T) = {tuple(shape[:3])}; got dtype "
                f"{allowed.dtype}, shape {allowed.shape}"
            )
        if bool(allowed.all()):
            return None
        empty = np.argwhere(~allowed.any(axis=2))
        if empty.size:
            b, i = (int(c) for c in empty[0])
            raise InvalidInstanceError(
                f"mask masks every token of sequence {i} of instance {b}: each sequence keeps at least one"
            )
        return allowed

    def logits(self, W: Any) -> Any:
        """Logits ``l_it = x_itᵀ (W z_i)``, shape ``(T, B, n)`` (a reused buffer); ``−inf`` at a masked token."""
        self._last_l = None  # the buffer below is overwritten
        self._last_fused = False
        self._q.copy_(self.torch.bmm(W, self.zT, out=self._qB).transpose(0, 1))  # (d, B, n): q_i = W z_i
        l, Xk, qk = self._l, self._X_feat, self._q_feat
        self.torch.mul(Xk[0], qk[0], out=l)
        for k in range(1, self.d):
            l.addcmul_(Xk[k], qk[k])
        if self._masked is not None:
            l.masked_fill_(self._masked, -math.inf)  # weight e^{−inf} = 0; never a maximum (≥ 1 allowed)
        return l

    def log_s(self, W: Any) -> tuple[Any, Any]:
        """Logits and ``log s`` (log-sum-exp), shapes ``(T, B, n)``."""
        logits = self.logits(W).clone()
        return logits, self.torch.log_softmax(logits, dim=0)

    def _signed_log_dl(self, u: Any, idx: Any | None = None) -> tuple[Any, Any]:
        """``(sign ℓ'(u), log|ℓ'(u)|)`` (sign ``None`` for a loss with ``log_neg_derivative_fn``: −1), ``u``
        ``(k, n)`` of the instances ``idx`` (``None``: the whole batch). A log that is ``+inf`` or NaN is the
        single form's refusal (grad._check_log_derivative), for the first such instance: never a zero or
        cancelled gradient."""
        torch = self.torch
        if self._log_fn is not None:
            log_d = self._log_fn(u)  # ℓ' < 0: sign −1
            bad = torch.isnan(log_d) | torch.isposinf(log_d)
            if bool(bad.any()):
                j = int(torch.nonzero(bad)[0][0])
                try:
                    _check_log_derivative(log_d[j].cpu().numpy(), u[j].cpu().numpy())
                except NumericalError as exc:
                    raise _InstanceRefusal(j if idx is None else int(idx[j]), exc) from None
            return None, log_d
        d = self.lo.derivative(u)
        if not bool(torch.isfinite(d).all()):
            raise NumericalError("the loss derivative is not finite (NaN or Inf); check the custom loss")
        return torch.sign(d), torch.log(torch.abs(d))

    def _gradient_sum(self, w: Any, Xt: Any, zB: Any, y: Any | None = None) -> Any:
        """``Σ_i (Σ_t w_it x_it) z_iᵀ``, shape ``(B, d, d)``: one stream of ``X`` and one bmm.

        With ``y`` given (the whole batch) the result is written to the reused buffer ``_G``.
        """
        torch = self.torch
        out = None
        if y is None:
            y = torch.empty(Xt.shape[1:], dtype=Xt.dtype, device=Xt.device)
            xs = [Xt[t] for t in range(self.T)]
        else:
            # the whole batch: Xt is self.Xt, or its per-sequence scaled copy (mixed data, _init_mixed)
            out, xs = self._G, (self._X_tok if Xt is self.Xt else self._Xs_tok)
        ws = self._w_tok if w is self._w else [w[t] for t in range(self.T)]
        torch.mul(xs[0], ws[0], out=y)
        for t in range(1, self.T):
            y.addcmul_(xs[t], ws[t])  # y_i = Σ_t w_it x_it, shape (d, B, n)
        return torch.bmm(y.transpose(0, 1), zB, out=out)  # (B, d, d): Σ_i y_i z_iᵀ (strided view, no copy)

    def _rounding_level(self, w: Any, xz: Any) -> Any:
        """``C·nT·eps·Σ_it |w_it| ||x_it|| ||z_i||`` per instance, the rounding level of ``G = Σ w x zᵀ``
        (as :func:`attnsvm.model._grad.normalized_risk_grad_of`); overwrites ``w``."""
        return w.abs_().mul_(xz).sum(dim=(0, 2)).mul_(self._cancel_rtol)

    @staticmethod
    def _abs_max(w: Any) -> Any:
        """``max_{t,i} |w_it|`` per instance, shape ``(B,)`` (NaN propagates)."""
        return w.amax(dim=0).amax(dim=-1).maximum(w.amin(dim=0).amin(dim=-1).neg_())

    def _direction_fast(self, l: Any) -> tuple[Any, Any, Any, Any | None, Any | None]:
        """Linear-domain gradient: ``(G, inv, log_norm, ok, cancelled)``, direction ``G·inv``.

        ``ok`` (B,) says where the result is exact, ``None`` meaning everywhere; ``cancelled``
        (B,) marks the accepted instances whose gradient cancels to the rounding level of its own
        sum (a noise direction; see :data:`attnsvm.model._grad.CANCELLATION_FACTOR`), ``None`` meaning
        none (the common case, known from a cheap bound).

        With ``E_it = e^{l_it − max_u l_iu}`` (``= 1`` at the selected token, exactly),
        ``S_i = Σ_t E_it``, a reference score ``c_i`` = the score of a selected token (the largest
        over exactly tied maximisers), ``δ_it = γ_it − c_i`` and ``ψ_i = Σ_t E_it δ_it``:
        ``Y_i f_i = c_i + ψ_i/S_i`` and ``w_it = ℓ'_i s_it (γ_it − Y_i f_i) = E_it (α_i δ_it − α_i ψ_i/S_i)``
        with ``α_i = ℓ'_i/S_i``. The selected token's weight ``−α_i ψ_i/S_i`` is formed from
        ``ψ`` (no ``γ_ir − Y_i f_i`` cancellation). Every factor is exact to a few ulps unless
        it leaves the normal range; ``ok`` is false for instances whose largest weight is
        below ``FAST_MIN_WEIGHT`` or not far above what a subnormal ``E_it``/``ψ_i`` could
        contribute, or is not finite (the log-domain path then takes over).
        """
        torch = self.torch
        B = l.shape[1]
        lmax = l.amax(dim=0)  # (B, n)
        E = torch.sub(l, lmax, out=self._E).exp_()  # ≤ 1; exactly 1 at the maximisers
        S = E.sum(dim=0)  # ≥ 1
        # c_i = the exact score of one selected token, so that δ = 0 exactly at a token with E = 1.
        # F = 1 exactly at the maximisers (E < 1 elsewhere; a logit within 1e-16 of the top also
        # gives E = 1 and counts as tied, harmlessly). Without ties c = Σ_t F γ is that score; each
        # sequence has ≥ 1 maximiser, so Σ F = B·n exactly iff no sequence has a tie (one reduction).
        # With ties, the largest tied score. (Not their mean: fl(fl(3γ)/3) ≠ γ for ~14% of doubles,
        # and ±1 ulp of δ swamps a saturated weight.)
        F = torch.floor(E, out=self._F)
        # N_i S_i = Σ_{u ∉ dup(r)} E_iu for a maximiser r (the weight outside r's duplicates, for the
        # bound on the values' rounding): a sum of positive terms, no cancellation. Without exact
        # duplicates, E − F is E off the maximisers and 0 on them, and the other maximisers add ΣF − 1.
        if self._has_dup:
            cls_r = torch.mul(self._cls, F).amax(dim=0)  # the class of one maximiser
            nsum = torch.where(self._cls != cls_r, E, 0.0).sum(dim=0)
        else:
            nsum = torch.sub(E, F).sum(dim=0).add_(F.sum(dim=0).sub_(1.0))  # ΣF − 1 first: an integer
        c = torch.mul(F, self.gamma, out=self._P).sum(dim=0)
        if bool(F.sum() != self._Bn):
            c = torch.where(F == 1.0, self.gamma, self._neg_inf, out=self._P).amax(dim=0)
        delta = torch.sub(self.gamma, c, out=self._F)  # δ_it = γ_it − c_i
        psi_s = torch.mul(E, delta, out=self._P).sum(dim=0).div_(S)  # ψ_i/S_i = Σ_t s_it δ_it
        # Cancellation-free margin: Y_i f_i = c_i + Σ_t s_it δ_it.
        u = c.add_(psi_s)
        if self._logistic:
            # ℓ'(u) = −σ(−u) in one kernel (σ(x) = 1/(1 + e^{−x}), a few ulps; 0 where e^{−x} overflows,
            # i.e. |ℓ'| < 1e-307: the weights are then below FAST_MIN_WEIGHT and the log path takes over)
            dl = torch.sigmoid(u.neg_()).neg_()
        else:
            dl = self.lo.derivative(u)
        alpha = dl.div_(S) if self._logistic else dl / S  # a custom ℓ' may return a read-only view
        # w = E·(α δ − α ψ/S): the selected token's weight is −α ψ/S (δ = 0 there), no cancellation.
        a_psi = alpha * psi_s
        w = torch.addcmul(-a_psi, delta, alpha, out=self._w).mul_(E)
        if self._any_dead:  # dead sequences (z_i = 0) neither contribute nor certify (see __init__)
            w.mul_(self._live)
            a_psi.mul_(self._live)
        # ok ⇔ wmax = max|w| finite, ≥ FAST_MIN_WEIGHT and ≥ κ Δ max|α| (NaN fails every comparison;
        # for the logistic loss the threshold is the constant upper bound of that, see _thr_bounded).
        # Shortcut (two passes saved): the token with E = 1 and δ = 0 has weight exactly −fl(α ψ/S),
        # so wmax ≥ |α ψ/S|; and |w| ≤ 2 |α| Δ is finite when |α| Δ ≤ 1e300. If that lower bound
        # passes for every instance, ok is all true, as the exact test would say.
        lower = a_psi.abs_().amax(dim=-1)
        if self._thr_bounded is not None:  # logistic: |α| ≤ 1, a constant threshold bounds the exact one
            thr = self._thr_bounded
            sure = lower >= thr
        else:
            amax_alpha = alpha.abs().amax(dim=-1)
            thr = torch.mul(amax_alpha, self._kappa_delta).clamp_min_(self.FAST_MIN_WEIGHT)
            sure = (lower >= thr) & (amax_alpha.mul_(self.delta_bound) <= 1e300)
        wmax = None
        if bool(sure.all()):
            ok = None  # every instance certified
        else:
            wmax = self._abs_max(w)
            ok = (wmax >= thr) & (wmax < math.inf)
        if self._mixed is not None:  # mixed-magnitude instances: the log-domain path only (_init_mixed)
            ok = ~self._mixed if ok is None else ok & ~self._mixed
        G = self._gradient_sum(w, self.Xt, self.zB, self._y)
        nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
        # Σ G² is exact to rounding when ||G|| is in [NORM_SAFE⁻¹, NORM_SAFE] (squares ≤ 1e280 cannot
        # overflow; the squares that underflow are < 1e-308 each, < 1e-26 relative to ||G||² ≥ 1e-280):
        # the common case, one pass over G. Otherwise the scaled norm below (instances not ``ok`` are
        # recomputed by the log-domain path and do not count). NaN fails the test.
        log_nrm = torch.log(nrm)
        in_range = log_nrm.abs() <= self._LOG_NORM_SAFE
        # Cancellation (as grad.normalized_risk_grad_of): ||G|| must exceed the rounding level of its
        # own sum, C·nT·eps·Σ_it |w_it| ||x_it|| ||z_i||. Cheap sufficient test first, on (B, n)
        # arrays: Σ_t |w_it| ≤ |α_i| (S_i Δ_b + |ψ_i|) = |α_i| S_i (Δ_b + |ψ_i/S_i|).
        bound = (alpha.abs() * S).mul_(psi_s.abs().add_(self.delta_bound.view(B, 1)))
        # ... plus the values' rounding (grad.py's value-error term), bounded by
        # 4·d·eps·Σ_i |ℓ'_i| N_i max_t m_it max_t ||x_it|| ||z_i||, |ℓ'_i| N_i = |α_i| nsum_i
        # (see _value_bound_log for the derivation).
        ve_ub = (alpha.abs() * nsum).mul_(self._ve_const).sum(dim=-1).mul_(CANCELLATION_FACTOR)  # 8·VE bound
        clear = nrm > self._cancel_rtol * bound.mul_(self._xz_max).sum(dim=-1) + ve_ub
        good = in_range & clear
        if bool((good if ok is None else good | ~ok).all()):
            return G, nrm.reciprocal_(), log_nrm.sub_(self.log_n), ok, None
        log2_scale = torch.zeros_like(nrm)
        if not bool((in_range if ok is None else in_range | ~ok).all()):
            # Scale G by 2^−e (exact) with wmax = m·2^e before the norm: Σ G² would underflow for
            # weights below ~1e-154 (and overflow above ~1e154); the scaled G is O(1).
            if wmax is None:
                wmax = self._abs_max(w)
            e = torch.frexp(wmax if ok is None else torch.where(ok, wmax, torch.ones_like(wmax))).exponent
            G.mul_(torch.ldexp(torch.ones_like(wmax), -e).view(B, 1, 1))
            nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
            log2_scale = e.to(nrm.dtype)
            log_nrm = torch.log(nrm)
        # the exact rounding level, in the same scale as G (w is not needed any more)
        e2 = -log2_scale.to(torch.int32)
        level = torch.ldexp(self._rounding_level(w, self._xz), e2)
        cancelled = ~(nrm > level + torch.ldexp(ve_ub, e2))
        if ok is not None:
            cancelled &= ok
        if bool(cancelled.any()):
            # the cheap value bound does not clear: the exact value-rounding term, O(T²), for those only
            idx = torch.nonzero(cancelled).squeeze(1)
            ve = self._value_error(
                l.index_select(1, idx),
                idx,
                torch.log(alpha.abs() * S).index_select(0, idx),
                log2_scale.index_select(0, idx) * math.log(2.0),
            )
            cancelled[idx] = ~(nrm[idx] > level[idx] + CANCELLATION_FACTOR * ve)
        return G, nrm.reciprocal(), log_nrm + log2_scale * math.log(2.0) - self.log_n, ok, cancelled

    def _direction_log(self, l: Any, idx: Any | None = None, y: Any | None = None) -> tuple[Any, Any, Any]:
        """Log-domain direction of the instances in ``l`` (``(T, k, n)``), exact under underflow.

        ``idx`` (``(k,)``): the instances of the batch that ``l`` holds, ``None`` for all of them.
        Returns ``(D, log_norm, cancelled)`` (``cancelled`` as in :meth:`_direction_fast`).

        Organised around a selected token ``r_i = argmax_t l_it`` so that it costs ``O(T)`` per
        sequence instead of ``O(T²)``. With scores ``γ_it = Y_i a_it``, ``δ_it = γ_it − γ_ir``, the
        set ``Z_i = {t : δ_it = 0}`` of tokens scoring exactly like the selected one (``r`` and its
        exact duplicates), the runner-up logit among the others ``l'_i = max_{u∉Z} l_iu``,
        ``E_iu = e^{l_iu − l'_i}`` (``u ∉ Z``), ``ψ_i = Σ_{u∉Z} E_iu δ_iu`` and
        ``m_i = l'_i − lse_i = log s_i at l'``:

            Y_i (a_it − f_i) = Σ_u s_iu (γ_it − γ_iu) = δ_it − e^{m_i} ψ_i     (t ∉ Z)
            Y_i (a_it − f_i) = −e^{m_i} ψ_i   (t ∈ Z),      Y_i f_i = γ_ir + e^{m_i} ψ_i,

        and ``w_it = ℓ'_i Y_i s_it (a_it − f_i) = −sign(ℓ'_i) A_i c_it`` with
        ``A_i = |ℓ'_i| e^{m_i}`` and ``c_it = E_it (e^{m_i} ψ_i − δ_it)`` (``t ∉ Z``),
        ``c_it = s_it ψ_i`` (``t ∈ Z``): the factor that underflows, ``A_i``, is kept as a
        logarithm and the largest of each instance is factored out before it is exponentiated;
        ``c`` is O(δ), or negligible where ``E_it`` underflows. (Taking the runner-up among all ``u ≠ r``
        would pick an exact duplicate of ``r``, whose ``δ = 0``, and lose every other weight to
        underflow: a zero gradient where the true one is ~e^{−(l_r − l')}.) ``lse`` uses the
        runner-up among all ``u ≠ r``. If every token scores alike, ``ψ = 0`` and the gradient is
        exactly 0.
        """
        torch = self.torch
        B = l.shape[1]
        mixed = self._mixed is not None  # per-sequence scaled data (see _init_mixed)
        if idx is None:
            Xt, gamma, zB, xz = self.Xt, self.gamma, self.zB, self._xz
            log_ve_const, xz_max, cls = self._log_ve_const, self._xz_max, self._cls
            if mixed:
                Xt, gamma, zB, xz = self._Xs, self._gamma_s, self._zs, self._xz_s
                live, sigma, kg1, kg2 = self._live_bn, self._sigma, self._kg_f1, self._kg_f2
                on = self._mixed
        else:
            Xt, gamma, zB = self.Xt.index_select(2, idx), self.gamma.index_select(1, idx), self.zB[idx]
            xz, log_ve_const, xz_max = (
                self._xz.index_select(1, idx),
                self._log_ve_const[idx],
                self._xz_max[idx],
            )
            cls = self._cls.index_select(1, idx)
            if mixed:
                Xt, gamma, zB = (
                    self._Xs.index_select(2, idx),
                    self._gamma_s.index_select(1, idx),
                    self._zs[idx],
                )
                xz = self._xz_s.index_select(1, idx)
                live, sigma = self._live_bn[idx], self._sigma[idx]
                kg1, kg2 = self._kg_f1[idx], self._kg_f2[idx]
                on = self._mixed.index_select(0, idx)  # type: ignore[union-attr]  # not None: mixed
        lr, r = torch.max(l, dim=0)  # selected token r (a first maximiser) and its logit
        r0 = r.unsqueeze(0)  # (1, B, n): index of the selected token, for scatter/gather
        g_r = gamma.gather(0, r0)  # (1, B, n): score of the selected token
        delta = gamma - g_r  # exactly 0 on Z
        in_z = delta == 0
        allowed = self._allowed
        masked = allowed is not None
        if allowed is not None:
            # a masked token (logit −inf, zero key: γ = 0) is not in Z even where γ_ir = 0; a sequence with
            # one allowed token has no runner-up (l' = −inf): its reference is shifted by 0, not by −inf
            # (−inf − (−inf) = NaN), so that E = 0, ψ = 0, m = −inf and its weights are exactly 0
            in_z &= allowed if idx is None else allowed.index_select(1, idx)
        # Z = {r} in every sequence (the usual case, one reduction to know): scatter at r instead of
        # masks over (T, B, n), fewer passes; otherwise the masked form below.
        single = bool(in_z.sum() == in_z[0].numel())
        lm = l.scatter(0, r0, -math.inf)  # the logits of u ≠ r
        if single:
            l1 = lm.amax(dim=0)  # runner-up (outside Z = {r})
            Z = lm.sub_(torch.where(torch.isfinite(l1), l1, 0.0) if masked else l1)  # l_u − l' ≤ 0, −inf at r
            E = Z.exp_()  # the runner-up's is 1: the weights that matter do not underflow (Z is spent)
            sum_nr = E.sum(dim=0)  # Σ_{u≠r} e^{l_u − l'} ≥ 1
            lse = torch.log1p(torch.exp(l1 - lr) * sum_nr)  # lse_i − l_ir = log Σ_t e^{l_t − l_r}
            # log N_i = log Σ_{u ∉ dup(r)} s_iu: Z = {r}, so r has no duplicate (a copy scores alike)
            log_nd = (l1 - lr - lse) + torch.log(sum_nr)
        else:
            l2 = lm.amax(dim=0)  # runner-up among all u ≠ r, for lse (Σ ≥ 1: no underflow)
            sum_nr = lm.sub_(torch.where(torch.isfinite(l2), l2, 0.0) if masked else l2).exp_().sum(dim=0)
            lse = torch.log1p(torch.exp(l2 - lr) * sum_nr)
            if self._has_dup:  # the weight outside r's exact duplicates, as a log-sum-exp
                outside = torch.where(cls != cls.gather(0, r0), l, -math.inf)
                log_nd = torch.logsumexp(outside, dim=0) - lr - lse
            else:
                log_nd = (l2 - lr - lse) + torch.log(sum_nr)
            lo = torch.where(in_z, -math.inf, l)  # the logits outside Z
            l1 = lo.amax(dim=0)  # −inf when every token scores alike
            Z = lo.sub_(torch.where(torch.isfinite(l1), l1, torch.zeros_like(l1)))  # −inf on Z
            E = Z.exp_()
        # Σ_{u∉Z} E_u δ_u (the whole batch: the product in the reused scratch buffer, no allocation)
        psi = (torch.mul(E, delta, out=self._P) if idx is None else E * delta).sum(dim=0)
        m = l1 - lr - lse  # log s at l' (−inf when every token scores alike: ψ = 0 then)
        em = torch.exp(m)
        # Cancellation-free margin: Y_i f_i = γ_ir + Σ_u s_iu δ_iu = γ_ir + e^{m_i} ψ_i.
        u = g_r.squeeze(0) + em * psi
        if mixed:
            u = u * kg1 * kg2  # in the true units: γ = 2^kg γ' (exact; 1·1 off the mixed instances)
        sign_l, log_l = self._signed_log_dl(u, idx)
        # w_it = −sign(ℓ'_i) A_i c_it with A_i = |ℓ'_i| e^{m_i}, the only factor that can underflow
        # (kept as its log, the instance scaled by its largest A: e^{log A_i − top_b} ≤ 1), and
        # c_it = E_it (e^{m_i} ψ_i − δ_it) off Z (s_it = E_it e^{m_i}), c_it = s_it ψ_i on Z (s ≤ 1,
        # e^{−lse} at r). Each c is O(Δ) or negligible (an E_u that underflows is below 1e-300 of the
        # runner-up's and of the rounding of the sum it enters).
        log_a = log_l + m
        p_a = log_l  # log A_i without the log weight m_i: its O(1) parts (see the split below)
        wsc = torch.sub(em * psi, delta, out=delta).mul_(E)  # E (e^{m} ψ − δ), 0 on Z (E = 0 there)
        if single:
            wsc.scatter_(0, r0, (torch.exp(-lse) * psi).unsqueeze(0))  # s_r ψ
        else:
            s_z = torch.exp(l - (lr + lse).unsqueeze(0))  # s_t, needed on Z only
            big_l = lr.abs() > self.LOG_WEIGHT_SPLIT
            if bool(big_l.any()):
                # (l_t − l_r) − lse: the logit difference first (0 on Z), then the O(1) lse; l_t − (l_r + lse)
                # rounded lse to ulp(l_r) (1e-9 at logits of 4e6: a direction 1.4e-10 off)
                s_split = torch.exp((l - lr.unsqueeze(0)).sub_(lse.unsqueeze(0)))
                s_z = torch.where(big_l.unsqueeze(0), s_split, s_z)
            wsc = torch.where(in_z, s_z.mul_(psi), wsc)
        if mixed:
            # each sequence's data scale 2^(kg + kx + kz) (0 off the mixed instances), and the size of its
            # largest term c'·||x'|| ||z'|| (a sequence's weight may sit on tokens far smaller than its
            # largest): the largest term, not the largest A, is factored out, so no term that matters
            # underflows. c' is scaled by 2^−k (k ≥ −MIXED_UP: c'·2^−k stays finite), log A raised by k ln 2.
            ts = self._term_scale_(wsc, xz, on)
            log_a = log_a + sigma + ts
            p_a = p_a + sigma + ts
        if self._any_dead:  # dead sequences (z_i = 0) do not set the scale (see __init__)
            log_a = torch.where(live if mixed else xz_max > 0, log_a, -math.inf)
        top = log_a.amax(dim=-1)  # (B,)
        top_safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        fac = torch.exp(log_a - top_safe.unsqueeze(-1))  # (B, n), ≤ 1
        # |log|ℓ'_i|| + |m_i| beyond LOG_WEIGHT_SPLIT (finite: a sequence without a term, m = −inf, has none)
        size = log_l.abs().sub_(m).nan_to_num_(posinf=0.0)  # (B, n)
        if float(size.amax()) > self.LOG_WEIGHT_SPLIT:
            big = size > self.LOG_WEIGHT_SPLIT
            # those instances only: log A_i − top by parts. The plain sum log|ℓ'_i| + m_i rounds the O(1)
            # part to the ulp of the larger: two sequences sharing a log weight of −7e13 (the same logits)
            # kept their relative size only to e^{±0.02}, and where their terms nearly cancel the direction
            # came out 1.2 off. Here (m_i − m_j) + (p_i − p_j) around a largest sequence j (differences of
            # log weights: exact where they are equal, else the logits' own rounding), then the largest of
            # these subtracted (j was chosen on rounded sums), so the top sequence's factor is 1.
            j = log_a.argmax(dim=-1, keepdim=True)
            rel = (m - m.gather(-1, j)).add_(p_a - p_a.gather(-1, j))
            rel = torch.where(torch.isfinite(log_a), rel, -math.inf)
            top_rel = rel.amax(dim=-1, keepdim=True)
            rel.sub_(torch.where(torch.isfinite(top_rel), top_rel, 0.0))
            fac = torch.where(big.any(dim=-1, keepdim=True), rel.exp_(), fac)  # ≤ 1
        if sign_l is not None:
            fac.mul_(-sign_l)  # the minus sign is sign(ℓ') = −1 of a decreasing loss
        wsc.mul_(fac)
        G = self._gradient_sum(wsc, Xt, zB, y)
        # c is O(δ), the size of the token values: tiny values (≲ 1e-154) would underflow Σ G² to 0
        # and read as a cancellation. Scale G by 2^−e with max|G| = m·2^e first (exact), and the
        # rounding level with it; e = 0 where G = 0.
        # (max|G| as max(max G, −min G): the same number, without a temporary of G's size)
        gmax = torch.maximum(G.amax(dim=(1, 2)), G.amin(dim=(1, 2)).neg_())
        e = torch.frexp(gmax).exponent
        # G below G_TINY in these units (its largest term ~ c·||x|| ||z|| of the largest A, ≤ 1 elsewhere),
        # or 0, or NaN: terms that matter may have underflowed (a value of 1e-182 times a key of 1e-142):
        # the single form decides (see _parts)
        if not float(gmax.amin()) >= self.G_TINY:  # (NaN: not ≥)
            under = ~(gmax >= self.G_TINY)
            # ... unless every weight is exactly 0 (every token of every sequence scores alike, or ℓ' = 0):
            # ∇L = 0 exactly, as the single form finds too (NaN weights do not compare equal to 0)
            under &= ~(wsc.abs().amax(dim=2).amax(dim=0) == 0)
            # ... or a loss derivative beyond float64 (log|ℓ'| = +inf, a custom loss): the engine's non-finite
            # gradient stands, refused as such (run_gd_batch: "exactly zero or not finite")
            under &= ~torch.isposinf(log_l).any(dim=-1)
            u = torch.nonzero(under).squeeze(1)
            self._under.extend((u if idx is None else idx[u]).tolist())
        G.mul_(torch.ldexp(torch.ones_like(top), -e).view(B, 1, 1))
        nrm = torch.linalg.vector_norm(G.view(B, -1), dim=1)
        # below the rounding level of its own sum (scaled as G): noise, not a direction; G's units are
        # e^{−offset} times the true ones (the values' rounding term is formed in the same units)
        offset = top_safe + e.to(top.dtype) * math.log(2.0)
        level = torch.ldexp(self._rounding_level(wsc, xz), -e)
        ve_ub = self._value_bound_log(log_l, log_nd, log_ve_const, offset)
        cancelled = ~(nrm > level + CANCELLATION_FACTOR * ve_ub)
        if bool(cancelled.any()):
            # the cheap value bound does not clear: the exact value-rounding term, O(T²), for those only
            sub = torch.nonzero(cancelled).squeeze(1)
            ve = self._value_error(
                l.index_select(1, sub),
                sub if idx is None else idx[sub],
                log_l.index_select(0, sub),
                offset.index_select(0, sub),
            )
            cancelled[sub] = ~(nrm[sub] > level[sub] + CANCELLATION_FACTOR * ve)
        D = G.mul_(nrm.reciprocal().view(B, 1, 1))  # NaN only for a zero gradient (reported as cancelled)
        return D, top + torch.log(nrm) + e.to(nrm.dtype) * math.log(2.0) - self.log_n, cancelled

    #: Largest upward scaling of a mixed sequence's ``c'`` (:meth:`_term_scale_`): ``|c'| ≤ 2d``, so
    #: ``c'·2^MIXED_UP`` ≤ 2d·1e301 is finite.
    MIXED_UP = 1000

    def _term_scale_(self, c: Any, xz: Any, on: Any) -> Any:
        """Scale ``c`` (``(T, k, n)``, the log path's ``c'`` on mixed data) in place by ``2^−k_i`` per
        sequence, ``k_i = ⌊log2 max_t |c'_it| ||x'_it|| ||z'_i||⌋`` (clipped to ``[−MIXED_UP, 0]``; 0 for a
        sequence without a term, and on the instances that are not mixed, ``on`` (k,) false: those run as
        in a batch without mixed data, bit for bit), so that its largest term is in ``[1, 2)``; returns
        ``k_i ln 2``, ``(k, n)``. Formed from logarithms (the product may underflow); exact (powers of two)."""
        torch = self.torch
        lt = (torch.log(c.abs()) + torch.log(xz)).amax(dim=0)  # −inf where the sequence has no term
        ok = torch.isfinite(lt) & on.view(-1, 1)
        k = torch.where(ok, torch.floor(lt / _LN2), 0.0).clamp_(-self.MIXED_UP, 0.0)
        c.mul_(torch.pow(2.0, -k).unsqueeze(0))
        return k * _LN2

    def _value_bound_log(self, log_dl: Any, log_nd: Any, log_ve_const: Any, offset: Any) -> Any:
        """Upper bound of the values' rounding term, per instance, in units of ``e^offset``: ``(k,)``.

        The single form's term (grad._log_grad) is ``VE = d·eps·Σ_it |ℓ'_i| s_it Σ_{u∉dup(t)} s_iu
        (m_it + m_iu) ||x_it|| ||z_i||`` (``dup(t)``: the exact copies of token t, itself included).
        With ``N_i = Σ_{u∉dup(r)} s_iu`` for any token r: ``Σ_t s_t Σ_{u∉dup(t)} s_u ≤ 2 N_i`` (the
        tokens of dup(r) carry ≤ 1 of weight, each with N_i outside; the others carry N_i, each
        with ≤ 1 outside), so ``VE ≤ 4·d·eps·Σ_i |ℓ'_i| N_i max_t m_it max_t ||x_it|| ||z_i||``
        (``log_ve_const`` holds the logarithm of everything but ``|ℓ'_i| N_i``). Formed from
        logarithms (``N_i`` underflows once saturated; no term is ``+inf``, so no NaN); ``inf`` reads
        as "not clear".
        """
        return self.torch.exp(log_dl + log_nd + log_ve_const - offset.unsqueeze(-1)).sum(dim=-1)

    def _value_error(self, l: Any, idx: Any, log_dl: Any, offset: Any) -> Any:
        """The values' rounding term of grad._log_grad, exactly (``O(T²)``), in units of ``e^offset``.

        ``VE_b = d·eps·Σ_it |ℓ'_i| s_it Σ_{u: x_iu ≠ x_it} s_iu (m_it + m_iu) ||x_it|| ||z_i||`` for the
        instances ``idx`` (logits ``l``, ``(T, k, n)``; ``log_dl = log|ℓ'_i|``, ``(k, n)``): the error
        that the rounding of each value ``a = vᵀx`` (``±d·eps·m``) carries into ``G``. A token and its
        exact copy have bitwise equal values and charge nothing. Overflow gives ``inf`` (refused).
        """
        torch = self.torch
        k = l.shape[1]
        Xt = self.Xt.index_select(2, idx)  # (T, d, k, n)
        amag = self.amag.index_select(1, idx)
        log_xz = self._log_xz.index_select(1, idx)  # exact for rows of any size (log(xz) where ordinary)
        log_s = torch.log_softmax(l, dim=0)
        different = (Xt.unsqueeze(1) != Xt.unsqueeze(0)).any(dim=2)  # (T, T, k, n): [t, u]
        pair = log_s.unsqueeze(0) + torch.log(amag.unsqueeze(1) + amag.unsqueeze(0))  # log s_u (m_t + m_u)
        log_mix = torch.logsumexp(pair.masked_fill(~different, -math.inf), dim=1)  # (T, k, n)
        lg = log_dl.unsqueeze(0) + log_s + log_mix + log_xz - offset.view(1, k, 1)
        lg = torch.nan_to_num(lg, nan=-math.inf)
        return torch.exp(lg).sum(dim=(0, 2)).mul_(self._d_eps)

    def _check_undetermined(self, W: Any, l: Any) -> None:
        """Set :attr:`undetermined`: the instances where the single form refuses ``ℓ'(Y_i f_i)``.

        As grad._output_spread / grad._refuse_undetermined: ``f_i`` is known only to ``±δf_i``,
        ``δf_i = [(T+d)·eps + 2δl_i]·Σ_t s_it |a_it|`` with the logits' rounding
        ``δl_i = d²·eps·max_t |x_it|ᵀ|W||z_i|``; ``ℓ'`` is undetermined where ``κ·δf_i > 1``
        (``κ = σ(u + δf)`` for the logistic loss, 1 otherwise), and the instance is refused when such a
        sequence's term, grown by ``e^{δf}``, is within ``e^{−NEGLIGIBLE_LOG}`` of the largest determined one.
        Cheap test first: ``δl_i ≤ d²·eps·||W||_F max_t ||x_it|| ||z_i||`` and ``Σ s|a| ≤ max|a|``; where that
        bound keeps ``δf ≤ ½`` (the common case, one small pass) nothing more is computed.
        """
        self.undetermined = None
        self.undetermined_detail = {}
        if not self._check_output:
            return
        torch = self.torch
        T, d = self.T, self.d
        wn = torch.linalg.vector_norm(W.reshape(W.shape[0], -1), dim=1)  # (B,)
        maybe = ~(torch.addcmul(self._df_c0, wn, self._df_c1) <= 0.5)  # δf ≤ ½ for sure; NaN: maybe
        if not bool(maybe.any()):
            return
        idx = torch.nonzero(maybe).squeeze(1)
        ls = l.index_select(1, idx)  # (T, k, n)
        Xt = self.Xt.index_select(2, idx)  # (T, d, k, n)
        zB, a, Y = self.zB[idx], self.a.index_select(1, idx), self.Y[idx]
        log_xz = self._log_xz.index_select(1, idx)  # exact for rows of any size (log(xz) where ordinary)
        log_s = torch.log_softmax(ls, dim=0)
        s = torch.exp(log_s)
        u = Y * (s * a).sum(dim=0)  # Y_i f_i (k, n)
        q = torch.bmm(W[idx].abs(), zB.abs().transpose(1, 2))  # |W||z_i|: (k, d, n)
        lmag = torch.einsum("tdki,kdi->tki", Xt.abs(), q).amax(dim=0)  # max_t |x_it|ᵀ|W||z_i|
        log_dl = torch.log(d * d * _EPS * lmag)
        log_m = torch.log((s * a.abs()).sum(dim=0))
        log_df = log_m + torch.logaddexp(
            torch.full_like(log_m, math.log((T + d) * _EPS)), math.log(2.0) + log_dl
        )
        df = torch.exp(log_df.clamp(max=700.0))
        if self.lo is logistic:
            log_k = -torch.logaddexp(torch.zeros_like(u), -(u + df))  # κ = σ(u + δf) ≤ 1
        else:
            log_k = torch.zeros_like(u)
        # each sequence's largest term log(|ℓ'_i| s_it |c_it| ||x_it|| ||z_i||), c_it = Σ_u s_iu (a_it − a_iu)
        # from its positive and negative parts (log-sum-exp: nothing underflows)
        diff = a.unsqueeze(1) - a.unsqueeze(0)  # [t, u]: a_t − a_u
        with torch.no_grad():
            terms = log_s.unsqueeze(0) + torch.log(diff.abs())
            log_p = torch.logsumexp(terms.masked_fill(~(diff > 0), -math.inf), dim=1)
            log_n = torch.logsumexp(terms.masked_fill(~(diff < 0), -math.inf), dim=1)
            hi, lo = torch.maximum(log_p, log_n), torch.minimum(log_p, log_n)
            log_c = torch.where(torch.isneginf(hi), hi, hi + torch.log1p(-torch.exp(lo - hi)))
            # NaN (−inf − −inf: c = 0 exactly) is −inf; so stays −inf (nan_to_num's default would turn it into
            # −1.8e308, a finite size: a sequence without a term taken for live, and refused as undetermined)
            log_c = torch.nan_to_num(log_c, nan=-math.inf, neginf=-math.inf)
            _, log_l = self._signed_log_dl(u, idx)
            size = (log_l.unsqueeze(0) + log_s + log_c + log_xz).amax(dim=0)  # (k, n)
        live = torch.isfinite(size)
        bad = (log_df + log_k > 0.0) & live
        if not bool(bad.any()):
            return
        best_ok = torch.where(live & ~bad, size, -math.inf).amax(dim=-1, keepdim=True)
        matter = bad & (size + df >= best_ok - NEGLIGIBLE_LOG)
        hit = matter.any(dim=-1)
        if not bool(hit.any()):
            return
        self.undetermined = torch.zeros(self.B, dtype=torch.bool, device=l.device)
        self.undetermined[idx[hit]] = True
        for j in torch.nonzero(hit).squeeze(1).tolist():
            i = int(torch.nonzero(matter[j])[0])
            self.undetermined_detail[int(idx[j])] = (i, float(df[j, i]))

    def _parts(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """``(G, inv, log_norm, cancelled)``: the direction of ``∇L(W_b)`` is ``G_b·inv_b`` (``G`` a reused buffer).

        The engine's paths (:meth:`_parts_engine`) for every instance, then the single form's direction for
        the instances whose data span the range within one sequence (:meth:`_init_spread`) and those whose
        ``G`` came out below :data:`G_TINY` at this call, where terms that matter may have underflowed
        (:meth:`_spread_parts`; none on ordinary data, which run the engine alone, bit for bit)."""
        self._under = []
        parts = self._parts_engine(W)
        core = self._spread_idx if not self._under else sorted(set(self._spread_idx).union(self._under))
        self._last_core = core
        if core:
            return self._spread_parts(W, core, *parts)
        return parts

    def _last_logits(self) -> Any | None:
        """The logits ``(T, B, n)`` of the last :meth:`gradient` call (at its ``W``), or ``None`` before one:
        a buffer of this engine, valid until the next call of :meth:`gradient`, :meth:`logits` or
        :meth:`log_s` (:func:`attnsvm.gd.run_gd_batch` records from it right after the gradient)."""
        return self._last_l

    def _last_margins(self) -> tuple[Any, Any, Any] | None:
        """``(u, r, held)`` of the last :meth:`gradient` call where the fused kernel made it, else ``None``: the
        margins ``u_i = Y_i f_i`` (cancellation-free) and the selected tokens ``r_i`` (first maximisers of the
        logits), ``(B, n)`` buffers valid until the next call of :meth:`gradient`, and the ``(B,)`` bool of the
        instances they hold for (the kernel's own: not handed back, not taken by the single form); the others'
        come from :meth:`_last_logits` (:meth:`_margins_of_log_s`, ``_first_argmax``)."""
        if not self._last_fused or self._fused is None:
            return None
        held = self._fused.flag == 0
        if self._last_core:
            held[self._last_core] = False
        return self._fused.margin, self._fused.token, held

    def _parts_fused(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """:meth:`_parts_engine` by the fused kernel (:mod:`attnsvm.gd._fused`): the log-domain direction of
        every instance in one pass over ``X``; the instances it hands back (ties in score with the selected
        token, log weights beyond ``LOG_WEIGHT_SPLIT``, ``G`` below ``G_TINY`` or not clearing the cheap
        cancellation bound) are recomputed by :meth:`_direction_log`, which decides them exactly."""
        torch = self.torch
        fused = self._fused
        assert fused is not None
        W = W.contiguous()
        G = self._G
        log_norm = fused(W, G)
        l = fused.logits  # (T, B, n), as logits() gives
        self._last_l = l
        self._last_fused = True
        self._check_undetermined(W, l)
        self.stats["fused"] += 1
        self._last_log = True
        flagged = torch.nonzero(fused.flag).squeeze(1)
        if flagged.numel() == 0:
            return G, torch.ones_like(log_norm), log_norm, None
        D_s, ln_s, c_s = self._direction_log(l.index_select(1, flagged), flagged)
        G[flagged] = D_s
        log_norm[flagged] = ln_s
        cancelled = torch.zeros(self.B, dtype=torch.bool)
        cancelled[flagged] = c_s
        return G, torch.ones_like(log_norm), log_norm, cancelled

    def _parts_engine(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """:meth:`_parts` by the engine's own paths (the spread instances' entries are overwritten after).

        The linear-domain fast path (:meth:`_direction_fast`) is tried first; the instances it
        cannot certify (a weight that matters left the normal range: ``||W||`` large, the
        gradient near or below underflow) are recomputed by the log-domain path
        (:meth:`_direction_log`, already normalized: ``inv = 1`` there), exact at any ``||W||``.
        Both agree to a few ulps wherever the fast path is accepted, so the switch, made per step
        and per instance, does not show in the iterates.
        """
        if self._fused is not None:
            return self._parts_fused(W)
        torch = self.torch
        B = self.B
        l = self.logits(W)
        self._last_l = l
        use_log = not self.fast or self._all_mixed  # mixed data: log-domain only (see _init_mixed)
        if self.fast and self._log_streak > 0:
            self._log_streak -= 1
            use_log = True  # most of the batch was saturated a moment ago (see LOG_FRACTION)
        self._check_undetermined(W, l)  # the single form's undetermined-ℓ' refusal, per instance
        if use_log:
            self.stats["log"] += 1
            self._last_log = True
            D, log_norm, cancelled = self._direction_log(l, None, self._y)
            return D, torch.ones_like(log_norm), log_norm, cancelled
        G, inv, log_norm, ok, cancelled = self._direction_fast(l)
        # ||G|| below G_TINY (or 0, or NaN) in the fast path's absolute units: terms that matter may have
        # underflowed (a weight ≥ FAST_MIN_WEIGHT times a key of 1e-142): the log-domain path decides.
        # (cancelled is None: every accepted ||G|| was in [1/NORM_SAFE, NORM_SAFE], far above G_TINY.)
        if cancelled is not None:
            low = ~(log_norm >= self._log_g_tiny)
            if bool(low.any()):
                ok = ~low if ok is None else ok & ~low
        if ok is not None and self._spread is not None:
            ok = ok | self._spread  # no log-domain recomputation: the single form's direction replaces it
        if ok is None or bool(ok.all()):
            self.stats["fast"] += 1
            self._last_log = False
            return G, inv, log_norm, cancelled
        n_bad = B - int(ok.sum())
        if n_bad > self.LOG_FRACTION * B:
            self._log_streak = self.LOG_RETRY - 1
            self.stats["log"] += 1
            self._last_log = True
            D, log_norm, cancelled = self._direction_log(l, None, self._y)
            return D, torch.ones_like(log_norm), log_norm, cancelled
        self.stats["mixed"] += 1
        idx = torch.nonzero(~ok).squeeze(1)
        self._last_log = idx
        D_s, ln_s, c_s = self._direction_log(l.index_select(1, idx), idx)
        G[idx] = D_s
        inv[idx] = 1.0
        log_norm[idx] = ln_s
        if cancelled is None:
            cancelled = torch.zeros_like(ok)
        cancelled[idx] = c_s
        return G, inv, log_norm, cancelled

    def direction(self, W: Any) -> tuple[Any, Any]:
        """Unit direction of ``∇L(W_b)`` and ``log||∇L(W_b)||``, shapes ``(B, d, d)`` and ``(B,)``.

        Same quantity as :func:`attnsvm.model._grad.normalized_risk_grad_of` (see :meth:`_parts` for
        the two paths), without its cancellation test (see :meth:`gradient`). The returned
        direction is a buffer of this engine, overwritten by the next call: use it (or copy it)
        before then.
        """
        G, inv, log_norm, _ = self._parts(W)
        return G.mul_(inv.view(self.B, 1, 1)), log_norm

    def gradient(self, W: Any) -> tuple[Any, Any, Any, Any | None]:
        """``(G, inv, log_norm, cancelled)``: the direction is ``G·inv``, ``log_norm = log||∇L(W)||``.

        ``cancelled`` (B,) bool, or ``None`` for none: instances whose gradient is below the
        rounding level of its own sum or of the token values, where the direction is noise
        (``run_gd_batch`` raises, as :func:`run_gd` does). :attr:`undetermined` is set alongside:
        the instances whose loss derivative is undetermined (``run_gd_batch`` raises for those too).
        """
        return self._parts(W)

    def update_(self, W: Any, parts: tuple[Any, ...], lr: float, normalized: bool = True) -> Any:
        """Apply one GD step in place to ``W`` from ``parts = gradient(W)``; returns ``W``.

        Normalized: ``W ← W − η ∇L/||∇L||``; plain: ``W ← W − η ∇L`` (``∇L`` rebuilt from the
        direction and ``e^{log||∇L||}``, 0 once it underflows). One fused in-place pass over
        ``(B, d, d)``: the direction is never materialised and nothing of that size is allocated.
        """
        G, inv, log_norm = parts[:3]
        if normalized:
            scale = inv.mul_(-lr)
        else:
            # η·||∇L|| as one exponential (e^{log||∇L|| + log η}): neither factor alone may be a
            # double when the data are far from unit scale (||∇L|| ~ 2^k), their product is
            scale = inv.mul_(self.torch.exp(log_norm + math.log(lr)).neg_())
            zero = log_norm == -math.inf  # ∇L = 0 exactly: no step (its "direction" 0·∞ is NaN)
            if bool(zero.any()):
                G[zero] = 0.0
                scale[zero] = 0.0
        return W.addcmul_(G, scale.view(self.B, 1, 1))

    def step_(self, W: Any, lr: float, normalized: bool = True) -> Any:
        """One GD step of every instance, in place on ``W``; returns ``log||∇L(W_b)||`` before the step."""
        parts = self._parts(W)
        self.update_(W, parts, lr, normalized)
        return parts[2]

    def risk(self, W: Any) -> Any:
        """``L(W_b) = (1/n) Σ_i ℓ(Y_i f_i)``, ``f_i = Σ_t s_it a_it``, per instance: shape ``(B,)``, a new tensor.

        Formed from ``log s`` (log-sum-exp, no overflow); a risk below the normal range may read 0 (its
        ``e^{log s}`` underflows): :func:`attnsvm.gd.run_gd_batch` takes the single form's exact value there.
        """
        return self._risk_of_log_s(self.log_s(W)[1])

    def _risk_of_log_s(self, log_s: Any) -> Any:
        """:meth:`risk` from ``log s`` (the second element of :meth:`log_s` at the same ``W``)."""
        return self._risk_of_margins(self._margins_of_log_s(log_s))

    def _margins_of_log_s(self, log_s: Any, idx: Any | None = None) -> Any:
        """``u_i = Y_i f_i``, ``f_i = Σ_t s_it a_it``, ``(B, n)`` from ``log s`` ``(T, B, n)``; with ``idx``, ``log s``
        holds those instances only ``(T, k, n)`` and so does the result."""
        a, Y = (self.a, self.Y) if idx is None else (self.a.index_select(1, idx), self.Y[idx])
        return Y * (self.torch.exp(log_s) * a).sum(dim=0)

    def _risk_of_margins(self, u: Any) -> Any:
        """``L = (1/n) Σ_i ℓ(u_i)`` per instance from the margins ``u`` ``(B, n)``."""
        return self.lo.value(u).mean(dim=-1)
