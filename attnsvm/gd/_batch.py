""":func:`run_gd_batch`: many equal-shaped instances in one torch float64 computation (CPU or CUDA).

Closed-form gradients, a linear-domain fast path while the weights are representable and the same
cancellation-free, log-domain direction as :func:`attnsvm.gd.run_gd` after (per instance); token masks
as :func:`run_gd` (different masks per instance, masked and unmasked mixed). Data are rescaled by exact
powers of two as in every engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._deps import require
from .._types import FloatArray
from .._validation import as_real_array, check_int, check_positive
from ..errors import InvalidInstanceError, NumericalError
from ..model._grad import (
    CANCELLED_MESSAGE,
    risk_of,
)
from ..model._instance import Instance
from ..model._losses import LossLike
from ..scaling import (
    FLOAT_MAX,
    FLOAT_TINY,
    LOG_FLOAT_MAX,
)
from ._metrics import _fro, direction_corr, direction_gap
from ._scaled import _LN2, _TINY, _check_iterate, _logit_bound, _rescale, _to_logit_scale
from ._single import _loss_name, record_steps
from ._torch_engine import BatchEngine, _InstanceRefusal


# ===================================================================== batched engine
@dataclass
class BatchTrajectory:
    """Result of :func:`run_gd_batch`; arrays have a leading record axis ``k`` and batch axis ``B``.

    Attributes:
      W: final iterates, shape ``(B, d, d)``.
      steps: recorded steps, shape ``(k,)``.
      norms, risks, log10_grad_norms: shape ``(k, B)``.
      tokens: selected tokens (``argmax`` of the logits over the allowed tokens), shape ``(k, B, n)``.
      corrs, gaps: shape ``(k, B)`` when a reference was given, else ``None``.
      saturated_at: first step at which plain GD's gradient norm fell below the smallest normal
        float64 (its update is then inexact), ``−1`` if never (always ``−1`` for normalized GD),
        shape ``(B,)``.
      device: the torch device the run used.
    """

    W: FloatArray
    steps: NDArray[np.int64]
    norms: FloatArray
    risks: FloatArray
    tokens: NDArray[np.intp]
    log10_grad_norms: FloatArray
    corrs: FloatArray | None
    gaps: FloatArray | None
    saturated_at: NDArray[np.int64]
    normalized: bool
    lr: float
    loss: str
    device: str

    @property
    def final_tokens(self) -> NDArray[np.intp]:
        """Selected tokens of the final iterates, shape ``(B, n)``."""
        return self.tokens[-1]


def _batch_matrices(arg: ArrayLike | None, B: int, d: int, name: str) -> FloatArray | None:
    if arg is None:
        return None
    arr = as_real_array(arg, name)
    if arr.shape == (d, d):
        arr = np.broadcast_to(arr, (B, d, d))
    if arr.shape != (B, d, d):
        raise InvalidInstanceError(
            f"{name} must have shape (d, d) = ({d}, {d}) or (B, d, d) = ({B}, {d}, {d}); got {arr.shape}"
        )
    return np.array(arr)


def _max_abs(Wn: FloatArray) -> FloatArray:
    """``max |W_b|`` per matrix of a ``(B, d, d)`` array, shape ``(B,)``."""
    return np.max(np.abs(Wn), axis=(1, 2), initial=0.0)


def _check_iterates(Wn: FloatArray, what: str, *, m: FloatArray | None = None) -> None:
    """:func:`_check_iterate` of every ``Wn[b]`` (``what`` formatted with ``b``), vectorised: the scalar check
    runs only on the matrices whose largest entry is not 0 or a normal double (it raises there). ``m``: the
    ``_max_abs(Wn)`` already at hand."""
    m = _max_abs(Wn) if m is None else m
    ok = (m == 0.0) | ((m >= FLOAT_TINY) & (m <= FLOAT_MAX))  # _check_iterate's acceptance; NaN fails
    for b in map(int, np.flatnonzero(~ok)):
        _check_iterate(Wn[b], what.format(b=b))


def _first_argmax(logits: Any) -> Any:
    """``argmax_t l_it``, the first maximiser, of ``(T, B, n)`` logits: shape ``(B, n)``. As ``argmax(dim=0)``
    (the first maximal index), in three passes over contiguous slabs (torch's strided ``argmax`` over the
    leading dimension takes ~100× longer); a sequence whose logits hold a NaN gives ``T`` (never recorded: a
    record step refuses non-finite logits first)."""
    import torch

    T = logits.shape[0]
    rank = torch.arange(T, 0, -1, dtype=logits.dtype, device=logits.device).view(
        T, 1, 1
    )  # first ranks highest
    return T - (logits == logits.amax(dim=0)).to(logits.dtype).mul_(rank).amax(dim=0).to(torch.int64)


def _fro_batch(Wn: FloatArray, *, m: FloatArray | None = None, work: FloatArray | None = None) -> FloatArray:
    """``[_fro(W_b) for b]`` of a C-contiguous ``(B, d, d)`` array, bit for bit, in a few vectorised passes.

    The same operations as :func:`attnsvm.gd._metrics._fro` per matrix: ``m = max|W_b|`` (or the given
    ``m``), ``e`` its ``frexp`` exponent, ``r = sqrt(Σ (W_b·2^−e)²)`` (NumPy's summation over the ``d²``
    contiguous entries of each matrix is the one it applies to a single matrix) and ``r·2^e``; matrices that
    are 0 or not finite give ``m``, and those whose norm may leave the range (within ``1e-9`` of
    ``LOG_FLOAT_MAX``) go through :func:`_fro` itself (which raises the contract's error where the norm is
    no double). Each ``max|W_b|`` is 0, not finite or at least ``FLOAT_TINY`` (the records refuse an iterate
    whose largest entry is subnormal first), so ``2^−e`` is a double and ``W_b·2^−e`` is a product by it (the
    correctly rounded result, as ``ldexp`` gives, in a third of its time). ``work``: a scratch array of
    ``Wn``'s shape for the scaled squares (a record reuses one: fresh arrays of that size cost page faults
    comparable to the arithmetic).
    """
    m = _max_abs(Wn) if m is None else m
    out = m.copy()
    live = (m > 0.0) & np.isfinite(m)
    e = np.frexp(np.where(live, m, 1.0))[1]  # ≥ −1021: 2^−e ≤ 2^1021
    with np.errstate(divide="ignore", invalid="ignore"):  # the entries not live are unused
        Ws = np.multiply(Wn, np.ldexp(1.0, -e)[:, None, None], out=work)
        r = np.sqrt(np.sum(np.multiply(Ws, Ws, out=Ws), axis=(1, 2)))
        near = live & ~(np.log(r) + e * _LN2 <= LOG_FLOAT_MAX - 1e-9)
    fine = live & ~near
    out[fine] = np.ldexp(r[fine], e[fine])
    for b in map(int, np.flatnonzero(near)):
        out[b] = _fro(Wn[b])
    return out


def _start_and_reference(
    W0: ArrayLike | None, reference: ArrayLike | None, B: int, d: int
) -> tuple[FloatArray | None, FloatArray | None]:
    """The validated ``(W0, reference)`` of :func:`run_gd_batch`, each ``(B, d, d)`` or ``None``.

    Contract: ``(d, d)`` arguments are broadcast to ``(B, d, d)``; refuses (:class:`InvalidInstanceError`)
    a wrong shape (``W0`` first), a zero reference matrix ``reference[b] = 0`` (it has no direction), then
    (:func:`_check_iterates`) a ``W0[b]`` whose largest entry ``max|W0_b|`` is neither 0 nor a normal double.
    """
    W0a = _batch_matrices(W0, B, d, "W0")
    ref = _batch_matrices(reference, B, d, "reference")
    if ref is not None:
        zero = np.flatnonzero(~np.any(ref.reshape(B, -1) != 0, axis=1))
        if zero.size:
            raise InvalidInstanceError(f"reference[{zero[0]}] is the zero matrix; it has no direction")
    if W0a is not None:
        _check_iterates(W0a, "W0[{b}]")
    return W0a, ref


@dataclass(frozen=True)
class _LogitCheck:
    """The contract's error for logits out of range (else a NaN would read as a cancellation).

    ``check(W, t)``: for every instance ``b`` with ``max|W_b| > 0`` not clear of its bound,
    ``¬(log max|W_b| + k_data_b·ln 2 ≤ log_bound − 1e-9)``, the scalar check
    (:func:`_to_logit_scale` of the instance's :func:`_rescale`) runs and its :class:`NumericalError`
    is raised as ``"step t: instance b: <message>"``.
    """

    #: the user's instances (rescaled by :func:`_rescale` only where a check needs it: rare)
    items: list[Instance]
    #: the true data scale of each instance (its ``_Scaled.k = ex + ez``), shape ``(B,)``
    k_data: NDArray[np.int64]
    #: ``log _logit_bound(d)``
    log_bound: float

    def __call__(self, Wc: Any, t: int, *, m: FloatArray | None = None) -> None:
        """Refuse ``Wc`` (the iterate ``W_t``) as above; ``m``: its ``max|W_b|`` when already at hand."""
        Wn_ = Wc.cpu().numpy()
        m = _max_abs(Wn_) if m is None else m
        with np.errstate(divide="ignore", invalid="ignore"):
            near = (m > 0) & ~(np.log(m) + self.k_data * _LN2 <= self.log_bound - 1e-9)
        for b in map(int, np.flatnonzero(near)):
            try:
                _to_logit_scale(_rescale(self.items[b]), Wn_[b], f"W_{t}")
            except NumericalError as exc:
                raise NumericalError(f"step {t}: instance {b}: {exc}") from exc


def _logit_check(eng: BatchEngine, instances: Sequence[Instance]) -> _LogitCheck:
    """The :class:`_LogitCheck` of the engine's batch.

    ``k_data_b = k_b + e(max|X'_b|) + e(max|z'_b|)``: the engine's exponent ``k_b`` plus the ``frexp``
    exponents of the data it holds (in ``[½, 1)`` where it rescaled, the raw keys and queries where it
    did not; ``frexp(0) = (0, 0)``, as ``pow2_exponent``).
    """
    items = list(instances)
    k_data = eng.scale_exponents + np.frexp(eng._key_max)[1] + np.frexp(eng._query_max)[1]
    return _LogitCheck(items, k_data, math.log(_logit_bound(eng.d)))


class _Recorder:
    """The records of :func:`run_gd_batch` and its :class:`BatchTrajectory`.

    :meth:`record` at a record step ``t`` appends ``||W_b||_F``, ``L(W_b)``, the selected tokens
    ``argmax_t l_it``, ``log10||∇L(W_b)||`` and (with a reference ``R_b``) ``corr(W_b, R_b)`` and
    ``gap(W_b, R_b)``, after the record-step refusals: a non-finite ``W``, a zero or non-finite gradient
    norm, logits out of range, an iterate that is no double, a non-finite risk.
    """

    def __init__(
        self,
        eng: BatchEngine,
        check_logits: _LogitCheck,
        logit_scale: Any,
        ref: FloatArray | None,
        normalized: bool,
    ) -> None:
        self.eng, self.check_logits, self.logit_scale = eng, check_logits, logit_scale
        self.ref, self.normalized = ref, normalized
        self._work: FloatArray | None = None  # _fro_batch's scratch, (B, d, d)
        self.rec: dict[str, list[Any]] = {
            k: [] for k in ("steps", "norms", "risks", "tokens", "lg", "corrs", "gaps")
        }

    def check(self, W: Any, t: int, log_norm: Any) -> None:
        """Refuse a gradient norm ``log||∇L||`` that is not finite (normalized GD) or NaN/+inf (plain GD).

        The direction ``G·inv`` is finite iff ``log||∇L||`` is: a NaN/Inf gradient or a zero one shows
        there (plain GD takes no step at a zero gradient and reports it in ``saturated_at`` instead).
        """
        import torch

        bad = ~torch.isfinite(log_norm) if self.normalized else torch.isnan(log_norm) | (log_norm == math.inf)
        if bool(bad.any()):
            self.check_logits(W, t)
            i = int(torch.nonzero(bad)[0])
            raise NumericalError(
                f"instance {i}: the risk gradient is exactly zero or not finite at or before step {t} "
                "(stationary W or a custom loss that overflows); its normalized direction is undefined"
            )

    def _risks(self, risk: Any, Wn: FloatArray, t: int) -> FloatArray:
        """``L(W_b)`` per instance from the engine's ``risk`` at ``W'``; where it reads below ``FLOAT_TINY``, the
        single form's exact (log-domain) value ``risk_of`` of the rescaled instance."""
        eng = self.eng
        if not bool(self.eng.torch.isfinite(risk).all()):
            raise NumericalError(f"the risk is not finite at step {t}; check the loss")
        risk_np: FloatArray = risk.cpu().numpy()
        # A risk that reads 0 or subnormal may have underflowed in the engine's exp: take the
        # single form's exact value there (log-domain, refusing a risk below the normal range
        # as run_gd does) instead of recording a 0 whose truth is not 0.
        for b in map(int, np.flatnonzero(np.abs(risk_np) < FLOAT_TINY)):
            sc = _rescale(self.check_logits.items[b])
            try:
                Wb = _to_logit_scale(sc, Wn[b], f"W_{t}")
                risk_np[b] = risk_of(sc.X, sc.Y, sc.z, sc.v, Wb, eng.lo, **sc.mask_kw)
            except NumericalError as exc:
                raise NumericalError(f"step {t}: instance {b}: {exc}") from exc
        return risk_np

    #: Where every ``max|W_b|`` is 0 or within ``2^±NORM_DIRECT``, ``||W_b||_F`` is torch's plain ``sqrt(Σ w²)``:
    #: no square overflows (``≤ d²·2^800``), and the squares that underflow (entries below ``2^−538``) add
    #: ``≤ d²·2^−1074`` to a sum ``≥ 2^−800``, far below its rounding. Elsewhere :func:`_fro_batch` scales first.
    NORM_DIRECT = 400

    def _norms(self, W: Any, Wn: FloatArray, m: FloatArray) -> FloatArray:
        """``||W_b||_F`` per instance (``Wn`` is ``W`` in NumPy, ``m`` its ``max|W_b|``): one pass of torch's norm
        (to its rounding, ``≤ (d² + 1)·eps`` relative; the same bits in any batch) where :data:`NORM_DIRECT` allows,
        else :func:`_fro_batch` (bit for bit ``_fro`` of each matrix; it refuses a norm that is no double)."""
        lo, hi = math.ldexp(1.0, -self.NORM_DIRECT), math.ldexp(1.0, self.NORM_DIRECT)
        if bool(np.all((m == 0.0) | ((m >= lo) & (m <= hi)))):
            torch = self.eng.torch
            norms: FloatArray = torch.linalg.vector_norm(W.reshape(W.shape[0], -1), dim=1).cpu().numpy()
            return norms
        if self._work is None:
            self._work = np.empty_like(Wn)
        return _fro_batch(Wn, m=m, work=self._work)

    def _margins_and_tokens(self, W: Any, gradient_at_W: bool) -> tuple[Any, Any]:
        """The margins ``Y_i f_i`` and the selected tokens ``argmax_t l_it`` at ``W``, ``(B, n)`` each.

        With ``gradient_at_W`` (the engine's last gradient call was at this ``W``), the fused kernel's own
        (:meth:`BatchEngine._last_margins`) where it made that call, the others' from its logits
        (:meth:`BatchEngine._last_logits`); else from the logits formed anew."""
        import torch

        eng = self.eng
        logits = eng._last_logits() if gradient_at_W else None
        if logits is None:
            logits = eng.logits(self.logit_scale(W))
        fused = eng._last_margins() if gradient_at_W else None
        if fused is None:
            return eng._margins_of_log_s(torch.log_softmax(logits, dim=0)), _first_argmax(logits)
        u, r, held = fused
        rest = torch.nonzero(~held).squeeze(1)
        if rest.numel() == 0:
            return u, r
        u, r = u.clone(), r.clone()
        l_rest = logits.index_select(1, rest)
        u[rest] = eng._margins_of_log_s(torch.log_softmax(l_rest, dim=0), rest)
        r[rest] = _first_argmax(l_rest)
        return u, r

    def record(self, W: Any, t: int, log_norm: Any, *, gradient_at_W: bool = False) -> None:
        """Check and record the iterate ``W_t`` (user's scale) and its ``log||∇L(W_t)||``; with
        ``gradient_at_W`` the engine's last gradient call was at this ``W`` and its logits are reused."""
        import torch

        eng, rec, ref, B = self.eng, self.rec, self.ref, self.eng.B
        # max|W_b| once, as max(max W_b, −min W_b) in torch (NaN and ±inf carry through both reductions)
        m_t = torch.maximum(W.amax(dim=(1, 2)), W.amin(dim=(1, 2)).neg())
        if not bool(torch.isfinite(m_t).all()):  # first: a diverged W also makes the gradient non-finite
            self.check_logits(W, t)
            raise NumericalError(f"plain GD diverged by step {t}: W became non-finite; lower lr")
        m = m_t.cpu().numpy()
        self.check(W, t, log_norm)
        self.check_logits(W, t, m=m)  # the logit bound of run_gd, at every record (the last step included)
        Wn = W.cpu().numpy()  # read only here (W's own memory on the CPU)
        _check_iterates(Wn, f"the iterate W_{t} of instance {{b}}", m=m)
        margins, tokens = self._margins_and_tokens(W, gradient_at_W)
        rec["steps"].append(t)
        rec["norms"].append(self._norms(W, Wn, m))
        rec["risks"].append(self._risks(eng._risk_of_margins(margins), Wn, t))
        rec["tokens"].append(tokens.cpu().numpy().astype(np.intp))
        rec["lg"].append(log_norm.cpu().numpy() / math.log(10.0))
        if ref is not None:
            nz = [bool(np.any(Wn[b] != 0)) for b in range(B)]
            rec["corrs"].append(
                np.array([direction_corr(Wn[b], ref[b]) if nz[b] else math.nan for b in range(B)])
            )
            rec["gaps"].append(
                np.array([direction_gap(Wn[b], ref[b]) if nz[b] else math.nan for b in range(B)])
            )

    def trajectory(self, W: Any, sat: Any, *, normalized: bool, lr: float) -> BatchTrajectory:
        """The :class:`BatchTrajectory` of the final iterate ``W``, ``saturated_at = sat`` and the records."""
        rec, ref, lo = self.rec, self.ref, self.eng.lo
        return BatchTrajectory(
            W=W.cpu().numpy(),
            steps=np.array(rec["steps"], dtype=np.int64),
            norms=np.array(rec["norms"]),
            risks=np.array(rec["risks"]),
            tokens=np.array(rec["tokens"]),
            log10_grad_norms=np.array(rec["lg"]),
            corrs=np.array(rec["corrs"]) if ref is not None else None,
            gaps=np.array(rec["gaps"]) if ref is not None else None,
            saturated_at=sat.cpu().numpy(),
            normalized=bool(normalized),
            lr=lr,
            loss=_loss_name(lo),
            device=str(self.eng.device),
        )


def _undetermined_message(i: int, df: float) -> str:
    """The single form's undetermined-ℓ' message (grad._refuse_undetermined), for sequence ``i``."""
    return (
        f"the output f_{i} = Σ_t s_it vᵀx_it is known only to ±{df:.3g} (values of both signs "
        "cancel under rounded weights): the loss derivative ℓ'(Y_i f_i) is undetermined in float64 "
        "(its relative error e^{δf} − 1 exceeds 1). Rescale v, or use the correlation loss"
    )


def run_gd_batch(
    instances: Sequence[Instance],
    steps: int,
    lr: float,
    *,
    normalized: bool = True,
    loss: "str | LossLike" = "logistic",
    device: Any = None,
    W0: ArrayLike | None = None,
    record_at: int | Sequence[int] | ArrayLike | None = None,
    reference: ArrayLike | None = None,
    fast_path: bool = True,
    kernel: str = "auto",
) -> BatchTrajectory:
    """Run GD on ``B`` equal-shaped instances at once, in one torch float64 computation.

    Each instance follows exactly the update of :func:`run_gd` (normalized
    ``W ← W − η∇L/||∇L||_F`` or plain ``W ← W − η∇L``), with closed-form gradients (no autograd)
    in cancellation-free form, so results equal :func:`run_gd` to ~1e-8 relative or better. Each
    step uses a linear-domain fast path for the instances whose weights are all representable and
    the log-domain form of the core for the others (chosen per step and per instance; the two
    agree to ~1e-14), so the direction stays exact after the gradient underflows. Plain GD whose
    gradient underflows keeps stepping (the update is then inexact) and reports the first such
    step in ``saturated_at``.

    References: Tarzanagh, Li, Thrampoulidis, Oymak, arXiv 2308.16898.

    Token masks (:attr:`Instance.mask`) are supported, as in :func:`run_gd`: a masked token takes no
    part (weight exactly 0, never selected in ``tokens``, no part in any scale, bound or refusal), so
    each instance runs as the instance with its masked tokens deleted. Instances of one batch may have
    different masks, or none (masked and unmasked instances mix, e.g. the causal and the plain
    :meth:`Instance.from_sequences` instances of one ``(n, T, d)``); the engine reads the keys
    (:attr:`Instance.keys`) and sets the masked logits to ``−inf``. A batch without any mask runs the
    unmasked engine unchanged.

    Args:
      instances: a sequence of ``B`` :class:`Instance` of one shape ``(n, T, d)``, masked or not.
      steps, lr, normalized, loss: as :func:`run_gd`.
      device: ``None``/``"cpu"`` or ``"cuda"`` (raises if CUDA is unavailable).
      W0: initial matrices, shape ``(d, d)`` (shared) or ``(B, d, d)``; default zeros.
      record_at: as :func:`run_gd`.
      reference: reference directions, ``(d, d)`` or ``(B, d, d)``.
      fast_path: ``False`` forces the log-domain path at every step (the two paths agree; this
        is for testing and timing them separately).
      kernel: ``"auto"`` (default: the fused CPU kernel where it applies — CPU, no token masks, the
        logistic or exponential loss, a C compiler found — else the eager paths), ``"fused"`` (refused
        where it cannot run) or ``"eager"`` (the eager paths only); see :class:`BatchEngine`. The fused
        kernel computes the log-domain direction of every instance (``fast_path`` does not apply to it).

    Returns:
      :class:`BatchTrajectory` (NumPy arrays; ``W`` has shape ``(B, d, d)``).

    Refusals: the single form's, per instance and step. At a step whose direction is refused —
    its contributions cancel to the rounding level of their own sum or of the token values
    (normalized GD), or ``ℓ'(Y_i f_i)`` is undetermined (either update) — raises
    :class:`~attnsvm.NumericalError` ``"<normalized|plain> GD at step t: instance b: <the single form's
    message>"``, ``t`` the iterate whose gradient was refused (:func:`run_gd` numbers it ``t + 1``, the
    iterate it was building).

    Scale: as :func:`run_gd` (each instance rescaled by its own powers of two; the same errors, per
    instance, at record steps and where a step fails); an instance whose sequences differ wildly in size
    (keys or query below 2^−64, or terms ``a·x zᵀ`` beyond 2^±800) runs the log-domain path on each
    sequence scaled by its own powers of two, as the single form does (``BatchEngine._init_mixed``); one whose
    data span the range within one sequence (a key or an entry of ``v`` 2^−511 below its sequence's largest),
    or whose gradient sum falls below 2^−1000 in the engine's units at a step, takes the single form itself
    for that instance (``BatchEngine._init_spread``); agrees with :func:`run_gd` to ~1e-8 relative
    (measured ≤ 1e-13) at every scale where float64 determines the direction (the rounding of the
    values and logits moves it by less than 1e-11), and refuses where :func:`run_gd` does.

    Conditioning: the agreement of whole trajectories also needs an iteration that does not amplify
    rounding. The two engines' directions at the same ``W`` agree to ~1e-13 at every step, but at large
    ``lr`` normalized GD can amplify a 1-ulp difference of an iterate exponentially: on 4×6×8 random
    instances at ``lr = 2`` (and on some at ``lr = 0.5``), :func:`run_gd` itself started from ``W_10``
    and from ``W_10·(1 + 2^−52)`` ends 1e-3 … 1e-2 apart after 300 steps, and the batched and single runs
    separate likewise. There, compare directions at given ``W`` (:func:`attnsvm.normalized_risk_grad`), not runs.
    """
    require("torch", feature="run_gd_batch (the batched torch engine)")  # pragma: no mutate
    import torch

    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr", meaning="the step size η")
    # validation, stacking, masks and the exact power-of-two rescaling (W'_b = W_b·2^k_b): the engine's
    eng = BatchEngine.from_instances(
        instances, loss=loss, device=device, path="auto" if fast_path else "log", kernel=kernel
    )
    dev, kb = eng.device, eng.scale_exponents
    B, d = eng.B, eng.d
    W0a, ref = _start_and_reference(W0, reference, B, d)
    at = record_steps(record_at, steps)
    rec_set = {int(s) for s in at}
    # The engine runs on the rescaled data (see _Scaled): instance b's logits are x'ᵀ W'_b z' with
    # W'_b = W_b·2^k_b. The iterate stays in the user's scale (W_b: representable whenever the answer
    # is) and W' is formed from it before each step by exact powers of two (skipped when every k_b = 0).
    W = (
        torch.zeros((B, d, d), dtype=torch.float64, device=dev)
        if W0a is None
        else torch.as_tensor(W0a, device=dev)
    )
    k_shift = torch.as_tensor(kb * _LN2, dtype=torch.float64, device=dev)  # log of 2^k_b
    Wp = torch.empty((B, d, d), dtype=torch.float64, device=dev) if kb.any() else None
    check_logits = _logit_check(eng, instances)

    def logit_scale(Wc: Any) -> Any:
        return eng.to_engine_scale(Wc, out=Wp)  # W' = W·2^k into one reused buffer (W itself if k = 0)

    sat = torch.full((B,), -1, dtype=torch.int64, device=dev)
    log_tiny = math.log(_TINY)
    rec = _Recorder(eng, check_logits, logit_scale, ref, normalized)
    kind = "normalized" if normalized else "plain"

    W = W.clone()  # the iterate, updated in place (W0 stays untouched)
    for t in range(0, steps + 1):
        if t < steps or t in rec_set:
            try:
                parts = eng.gradient(logit_scale(W))  # at W_t: direction G·inv, log||∇_{W'} L(W'_t)||
            except _InstanceRefusal as exc:  # the single form's refusal of an instance it computed
                check_logits(W, t)
                raise NumericalError(f"{kind} GD at step {t}: instance {exc.instance}: {exc.cause}") from exc
            log_norm1 = parts[2]  # of the rescaled problem: scale-free (saturation test)
            log_norm = log_norm1 + k_shift  # log||∇L(W_t)|| = log||∇_{W'}L|| + k log 2
            cancelled = parts[3]
            if eng.undetermined is not None and bool(eng.undetermined.any()):
                # the single form's refusal (grad._refuse_undetermined), for either update
                check_logits(W, t)
                b = int(torch.nonzero(eng.undetermined)[0])
                i, df = eng.undetermined_detail[b]
                raise NumericalError(f"{kind} GD at step {t}: instance {b}: {_undetermined_message(i, df)}")
            if normalized and cancelled is not None and bool(cancelled.any()):
                check_logits(W, t)
                i = int(torch.nonzero(cancelled)[0])
                raise NumericalError(f"normalized GD at step {t}: instance {i}: {CANCELLED_MESSAGE}")
        if t in rec_set:
            rec.record(W, t, log_norm, gradient_at_W=True)  # the gradient above was at this W
        if t < steps:
            if not normalized:
                # scale-free, as run_gd: the rescaled problem's gradient left the normal range
                newly = (log_norm1 < log_tiny) & (sat < 0)
                sat = torch.where(newly, torch.full_like(sat, t + 1), sat)
            # W_{t+1} in the user's scale (∇_W L = 2^k ∇_{W'} L); recording (above) does not touch G
            eng.update_(W, (parts[0], parts[1], log_norm), lr, normalized)
    return rec.trajectory(W, sat, normalized=normalized, lr=lr)
