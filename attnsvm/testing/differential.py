"""Differential testing of attention implementations against attnsvm's float64 reference.

Hand a callable ``fn(inst, W)`` that returns attention weights ``(n, T)``, outputs ``(n,)`` or a
gradient ``(d, d)`` (a numpy array, a torch tensor, anything array-like) to :func:`compare_attention`,
:func:`compare_output` or :func:`compare_gradient`; each compares it with the reference
(:func:`attnsvm.model._attention`, :func:`attnsvm.output`, :func:`attnsvm.normalized_risk_grad`) and returns a
:class:`DifferentialReport`: the largest error and where it is, the bound there, and whether every
entry is within its bound. :func:`gradient_saturation_sweep` scales ``W`` up and says at which
runner-up attention weight the implementation's gradient leaves its bound.

The bound is the error any *stable* implementation in the user's precision (unit roundoff ``u``,
from the returned array's dtype or the ``dtype``/``eps`` keywords) may make, not a fixed rtol:

* logits ``l_it = x_itᵀ W z_i``, formed by a sum of ``k`` rounded products (``k = 2d + 3`` by
  default: ``q = W z``, ``xᵀq`` and the conversion of ``X``, ``W``, ``z``; :func:`head_logit_magnitude`
  for a real head's ``c·(W_K x)ᵀ(W_Q z)``), err by ``δ_t ≤ γ_k(u)·M_t`` with ``γ_k = k·u/(1 − k·u)``
  and ``M_t = |x_t|ᵀ|W||z|`` (the magnitude of the terms, not of the sum), plus the reference's
  own ``γ_{2d+k}(eps64)·M_t``;
* softmax weights (Jensen on ``s̃_t/s_t = e^{Δ_t}/Σ_u s_u e^{Δ_u}``)

      |s̃_t − s_t| ≤ s_t·expm1(δ'_t + Σ_u s_u expm1(δ'_u) + (T + 3)u) + tiny,

  with ``δ'_t = δ_t + u·|l_t − max_u l_u|`` (the shift's rounding) and ``tiny`` the smallest normal
  number of the user's dtype (a weight below it may be flushed to 0). The bound is relative to each
  weight: a weight of 1e-30 is checked to ~30 digits' worth of its own size, and tokens whose logits
  are nearly equal get the absolute bound they need (no rtol on a difference of nearly equal
  numbers). ``normalized_linear`` uses the same form on ``log φ(l)`` (``|d log φ/dl| ≤ 1``),
  ``linear`` the logit bound itself;
* outputs ``f = Σ_t s_t a_t``, ``a_t = vᵀx_t`` (``k_v = d + 2`` terms):
  ``|Δf| ≤ Σ_t |Δs_t||a_t| + (γ_{k_v}(u) + γ_{T+1}(u) + (d + T)·eps64)·Σ_t s_t m_t + tiny``,
  ``m_t = Σ_j |v_j x_tj|``;
* gradient directions (``∇L = (1/n) Σ_it c_i s_it Σ_u s_iu (a_it − a_iu) x_it z_iᵀ``,
  ``c_i = ℓ'(Y_i f_i) Y_i``): every pair term ``(i, t, u ≠ t)`` may move by
  ``|c_i| s_t s_u [ |a_t − a_u|(ε_t + ε_u + ρ_i + γ_{nT+T+3}(u)) + γ_{k_v}(u)(m_t + m_u) ]·|x_t||z|``
  (``ε`` the weights' relative bound, ``ρ_i = expm1(|Δf_i|) + 2u`` that of ``ℓ'``, ``|ℓ''/ℓ'| ≤ 1``
  for the built-in losses) plus ``s·tiny`` for weights flushed to 0; the unit direction then moves
  by ``≤ 2·Σ/||∇L|| + nT(d+T)·eps64`` (the reference's own), at most 2. The sum is formed in the log
  domain, so it is right at any saturation. The pair form matters: ``a_t − a_t = 0`` exactly, so a
  stable implementation's error scales with the runner-up weight, while forming ``a_top − f`` as a
  difference (autograd through softmax) loses ``eps·|a|`` absolutely, ``eps/r`` relatively.

Scale: inputs any finite instance and ``W`` for which the reference is representable (the
reference functions raise :class:`~attnsvm.NumericalError` naming the quantity otherwise);
magnitudes that overflow make the bound its trivial cap (1 for weights, 2 for directions), never
NaN. Accuracy: the bounds are first-order-free (``expm1``) upper bounds under the stated model.

References: Higham, *Accuracy and Stability of Numerical Algorithms* (2nd ed., 2002), §3.1
(``γ_k``); Blanchard, Higham, Higham, "Accurately computing the log-sum-exp and softmax
functions", IMA J. Numer. Anal. 41 (2021).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .._types import FloatArray
from ..errors import AttnSVMError, unknown_name
from ..model._attention import KINDS, attention, log_attention, log_phi, logits
from ..model._grad import normalized_risk_grad, signed_log_derivative
from ..model._instance import Instance, require_unmasked
from ..model._losses import LOSSES, get_loss

__all__ = [
    "DifferentialError",
    "DifferentialReport",
    "SweepRow",
    "SaturationSweep",
    "compare_attention",
    "compare_output",
    "compare_gradient",
    "gradient_saturation_sweep",
    "head_logit_magnitude",
    "runner_up_log10",
    "DEFAULT_SWEEP_SCALES",
]


EPS64 = float(np.finfo(np.float64).eps)
#: Smallest positive double: the reference's own absolute floor per weight.
_TRUE_MIN = 2.0**-1074
#: Relative error factors are clipped here before multiplying a weight ≤ 1 (an infinite factor
#: times a weight that is 0 would be NaN); any clipped bound exceeds the trivial cap anyway.
_CLIP = 1e300
#: Default factors of :func:`gradient_saturation_sweep`: ``W`` scaled by 10^(k/4), k = 0 … 16.
DEFAULT_SWEEP_SCALES: tuple[float, ...] = tuple(10.0 ** (k / 4) for k in range(17))


class DifferentialError(AttnSVMError):
    """The implementation under test cannot be compared: ``fn`` is not callable, returned the wrong
    shape or type, or returned NaN/Inf (the message says where)."""


# ------------------------------------------------------------------------------ the report
@dataclass(frozen=True, eq=False)
class DifferentialReport:
    """One quantity of an implementation compared with the reference.

    Attributes:
      quantity: ``"attention weights"``, ``"outputs"`` or ``"gradient direction"``.
      passed: every entry within its bound (``worst_ratio ≤ 1``).
      max_error: the largest absolute error (for the direction: ``||ĝ/||ĝ|| − D||_F``).
      where: its index — ``(sequence, token)`` for weights, ``(sequence,)`` for outputs, the entry
        ``(j, k)`` of ``W`` with the largest error for a direction.
      bound: the bound at ``where`` (normwise for a direction).
      worst_ratio, worst_at: the largest error/bound and its index (the entry that decides).
      eps, dtype: the unit roundoff of the model and the dtype it came from.
      errors, bounds: the entrywise errors and bounds (the direction's normwise error and bound as
        0-d arrays).
      note: anything the numbers do not say (e.g. ``fn`` returned an exactly zero gradient).
    """

    quantity: str
    passed: bool
    max_error: float
    where: tuple[int, ...]
    bound: float
    worst_ratio: float
    worst_at: tuple[int, ...]
    eps: float
    dtype: str
    errors: FloatArray
    bounds: FloatArray
    note: str = ""

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"{self.quantity}: {verdict} (float model: {self.dtype}, unit roundoff {self.eps:.3g})",
            f"  max error {self.max_error:.3g} at {_where(self.quantity, self.where)}, "
            f"bound there {self.bound:.3g}",
            f"  worst error/bound {self.worst_ratio:.3g} at {_where(self.quantity, self.worst_at)}",
        ]
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _where(quantity: str, idx: tuple[int, ...]) -> str:
    if quantity == "gradient direction":
        return f"W[{idx[0]}, {idx[1]}]" if len(idx) == 2 else "(normwise)"
    names = ("sequence", "token")
    return ", ".join(f"{nm} {i}" for nm, i in zip(names, idx, strict=False)) or "(scalar)"


def _report(
    quantity: str, err: FloatArray, bnd: FloatArray, u: float, dtype: str, note: str = ""
) -> DifferentialReport:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0.0, 0.0, err / bnd)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    at_max = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
    at_worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    worst = float(np.max(ratio))
    return DifferentialReport(
        quantity=quantity,
        passed=bool(worst <= 1.0),
        max_error=float(err[at_max]),
        where=at_max,
        bound=float(bnd[at_max]),
        worst_ratio=worst,
        worst_at=at_worst,
        eps=u,
        dtype=dtype,
        errors=err,
        bounds=bnd,
        note=note,
    )


# ------------------------------------------------------------------------------ inputs
def _check_fn(fn: object) -> None:
    if not callable(fn):
        raise DifferentialError(
            f"fn must be a callable fn(inst, W) returning an array; got {type(fn).__name__}. "
            "Wrap your module: fn = lambda inst, W: my_attention(inst.X, inst.z)"
        )


def _precision(dtype: Any, eps: float | None, returned: Any) -> tuple[float, float, str]:
    """``(u, tiny, name)``: the user's unit roundoff, smallest normal number and dtype name."""
    name, fin_eps, fin_tiny = "float64", EPS64, float(np.finfo(np.float64).tiny)
    src = dtype if dtype is not None else getattr(returned, "dtype", None)
    if src is not None:
        try:  # a torch dtype (bfloat16 has no numpy equivalent)
            import torch

            if isinstance(src, torch.dtype):
                if not src.is_floating_point:
                    raise DifferentialError(
                        f"fn returned a {src} tensor; attention results must be floating point"
                    )
                fi = torch.finfo(src)
                name, fin_eps, fin_tiny = str(src).replace("torch.", ""), float(fi.eps), float(fi.tiny)
                src = None
        except ImportError:  # pragma: no cover - torch is a core dependency
            pass
    if src is not None:
        try:
            dt: np.dtype[Any] = np.dtype(src)  # type: ignore[arg-type]
        except TypeError as exc:
            raise DifferentialError(f"dtype must be a numpy or torch floating dtype; got {src!r}") from exc
        if dt.kind != "f":
            raise DifferentialError(
                f"fn returned dtype {dt}; attention results must be floating point (pass dtype= to "
                "name the precision your implementation computes in)"
            )
        fi2 = np.finfo(dt)
        name, fin_eps, fin_tiny = str(dt), float(fi2.eps), float(fi2.tiny)
    if eps is not None:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < float(eps) < 1.0:
            raise DifferentialError(f"eps must be a float in (0, 1), the machine epsilon; got {eps!r}")
        fin_eps = float(eps)
        name = f"{name}, eps={fin_eps:.3g}"
    return fin_eps, fin_tiny, name


def _result(value: Any, shape: tuple[int, ...], what: str) -> FloatArray:
    """``fn``'s result as a float64 array of ``shape`` (singleton axes may differ)."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        if getattr(value, "is_complex", lambda: False)():
            raise DifferentialError(f"fn returned a complex tensor for the {what}; expected real numbers")
        value = value.double().numpy()
    try:
        arr = np.array(value, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise DifferentialError(
            f"fn must return an array of {what}; could not convert {type(value).__name__} ({exc})"
        ) from exc
    if [s for s in arr.shape if s != 1] != [s for s in shape if s != 1]:
        raise DifferentialError(
            f"fn returned shape {arr.shape} for the {what}; expected {shape} "
            "(singleton axes may be added or dropped)"
        )
    arr = arr.reshape(shape)
    if not np.all(np.isfinite(arr)):
        bad = tuple(int(b) for b in np.argwhere(~np.isfinite(arr))[0])
        raise DifferentialError(
            f"fn returned {arr[bad]} in the {what} at index {bad}; the reference is finite there. "
            "A softmax without max-subtraction overflows (exp of a logit above ~709 in float64, ~88 in "
            "float32) or divides 0 by 0 when every exp underflows"
        )
    return arr


def _gamma(k: int | float, u: float) -> float:
    """``γ_k = k·u/(1 − k·u)`` (Higham §3.1); ``inf`` when ``k·u ≥ 1``."""
    ku = float(k) * u
    return ku / (1.0 - ku) if ku < 1.0 else math.inf


def _magnitude(arr: ArrayLike | None, default: FloatArray, name: str) -> FloatArray:
    if arr is None:
        return default
    a = np.array(arr, dtype=np.float64, copy=True)
    if a.shape != default.shape or not np.all(a >= 0.0):
        raise DifferentialError(
            f"{name} must be a nonnegative array of shape {default.shape} (one magnitude per "
            f"sequence and token); got shape {a.shape}"
        )
    return a


def _terms(k: int | None, default: int, name: str) -> int:
    if k is None:
        return default
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise DifferentialError(f"{name} must be a positive int (the number of rounded terms); got {k!r}")
    return int(k)


def _abs_logit_magnitude(inst: Instance, W: FloatArray) -> FloatArray:
    """``M_it = Σ_jk |x_itj||W_jk||z_ik|`` (``inf`` where it overflows)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.einsum("ntj,nj->nt", np.abs(inst.X), np.abs(inst.z) @ np.abs(W).T)


def head_logit_magnitude(inst: Instance, projections: Any) -> tuple[FloatArray, int]:
    """Logit magnitudes and term count of a real head: ``(M, k)`` for ``logit_magnitude=M,
    logit_terms=k``.

    ``M_it = |c|·(|W_K||x_it| + |b_k|)ᵀ(|W_Q||z_i| + |b_q|)`` — the module forms ``c·kᵀq`` from its
    projections, whose rounding is relative to these magnitudes, not to ``|x|ᵀ|c W_KᵀW_Q||z|`` —
    and ``k = d + d_head + 5`` (projection, dot product, scale, and the conversion of the inputs).
    ``projections`` is :func:`attnsvm.adapters.head_projections`'s result. When the instance's
    tokens carry one more coordinate than the head (tokens augmented with a constant 1 for a query
    bias, ``attention_matrix(..., augment=True)``), that coordinate is left out.

    Scale: any finite data; a magnitude that overflows is ``inf`` (the bound is then its cap).
    """
    require_unmasked(inst, "attnsvm.testing.head_logit_magnitude")
    W_Q = np.asarray(projections.W_Q, dtype=np.float64)
    W_K = np.asarray(projections.W_K, dtype=np.float64)
    dq, dk = W_Q.shape[1], W_K.shape[1]
    if inst.d not in (dk, dk + 1) or dq != dk:
        raise DifferentialError(
            f"the instance has token dimension {inst.d}; this head's projections take {dk} "
            f"(or {dk + 1} with the constant coordinate of augment=True)"
        )
    X, z = inst.X[..., :dk], inst.z[:, :dq]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        kmag = np.abs(X) @ np.abs(W_K).T + np.abs(projections.b_k)
        qmag = np.abs(z) @ np.abs(W_Q).T + np.abs(projections.b_q)
        M = abs(float(projections.scale)) * np.einsum("nth,nh->nt", kmag, qmag)
    return M, inst.d + W_Q.shape[0] + 5


class _Model:
    """The reference's quantities and the error model shared by the three comparisons."""

    def __init__(
        self,
        inst: Instance,
        W: FloatArray,
        kind: str,
        u: float,
        tiny: float,
        logit_magnitude: ArrayLike | None,
        logit_terms: int | None,
    ) -> None:
        n, T, d = inst.shape
        self.inst, self.W, self.kind, self.u, self.tiny = inst, W, kind, u, tiny
        l = logits(inst, W)
        base = np.abs(_abs_logit_magnitude(inst, W))
        M = _magnitude(logit_magnitude, base, "logit_magnitude")
        k = _terms(logit_terms, 2 * d + 3, "logit_terms")
        with np.errstate(over="ignore", invalid="ignore"):
            # The user's rounding of its logits, and the reference's own (W itself may be a rounded
            # product: its error is covered by the user's k terms at eps64).
            self.delta = _gamma(k, u) * M + _gamma(2 * d + k, EPS64) * np.maximum(M, base)
        self.logits = l
        if kind == "linear":
            self.log_s = None
            self.s = np.array(l)
            self.rel = None
            return
        self.log_s = log_attention(inst, W, kind=kind)
        with np.errstate(under="ignore"):
            self.s = np.exp(self.log_s)
        b = l if kind == "softmax" else log_phi(l)
        shift = np.abs(b - np.max(b, axis=1, keepdims=True))
        with np.errstate(over="ignore", invalid="ignore"):
            dl = self.delta + (u + EPS64) * shift + (0.0 if kind == "softmax" else u)
            em = np.minimum(np.expm1(np.minimum(dl, 700.0)), _CLIP)
            mean = np.sum(self.s * em, axis=1, keepdims=True)
            # Relative bound of each weight (Jensen, see the module docstring).
            self.rel = np.minimum(np.expm1(np.minimum(dl + mean + (T + 3) * (u + EPS64), 700.0)), _CLIP)

    def weight_bound(self) -> FloatArray:
        if self.rel is None:  # linear: the weights are the logits
            return self.delta + self.tiny
        return np.minimum(1.0, self.s * self.rel + self.tiny + _TRUE_MIN)


# ------------------------------------------------------------------------------ comparisons
def compare_attention(
    fn: Callable[[Instance, FloatArray], Any],
    inst: Instance,
    W: ArrayLike,
    *,
    kind: str = "softmax",
    dtype: Any = None,
    eps: float | None = None,
    logit_magnitude: ArrayLike | None = None,
    logit_terms: int | None = None,
) -> DifferentialReport:
    """Compare ``fn(inst, W)`` (attention weights, shape ``(n, T)``) with :func:`attnsvm.model._attention`.

    Bound per weight ``|s̃_t − s_t| ≤ s_t·expm1(δ'_t + Σ_u s_u expm1(δ'_u) + (T+3)u) + tiny`` (module
    docstring), ``δ'_t = γ_k(u)·M_t + u·|l_t − max l|``; ``u`` and ``tiny`` from the returned dtype
    unless ``dtype``/``eps`` (machine epsilon) are given. ``logit_magnitude``/``logit_terms``
    describe how the implementation forms its logits (default ``|x|ᵀ|W||z|``, ``2d + 3`` terms; see
    :func:`head_logit_magnitude` for a real head).

    Raises :class:`DifferentialError` for a non-callable ``fn``, a result of the wrong shape or
    type, or NaN/Inf in it (naming the index); ``UnknownNameError`` for an unknown ``kind``.

    Scale: any finite data whose logits are representable (else ``NumericalError`` from the
    reference); bounds capped at 1 per weight; accurate to the model's first-order-free form.
    """
    require_unmasked(inst, "attnsvm.testing.compare_attention")
    _check_fn(fn)
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    Wa = inst.check_weights(W)
    got = fn(inst, Wa.copy())
    u, tiny, name = _precision(dtype, eps, got)
    arr = _result(got, (inst.n, inst.T), "attention weights")
    model = _Model(inst, Wa, kind, u, tiny, logit_magnitude, logit_terms)
    ref = attention(inst, Wa, kind=kind)
    return _report("attention weights", np.abs(arr - ref), model.weight_bound(), u, name)


def _values(inst: Instance) -> tuple[FloatArray, FloatArray]:
    """Token values ``a = Xv`` and their magnitudes ``m = |X||v|``."""
    a = inst.values()
    with np.errstate(over="ignore", under="ignore"):
        m = np.abs(inst.X) @ np.abs(inst.v)
    return a, m


def _output_bound(model: _Model, a: FloatArray, m: FloatArray, kv: int) -> FloatArray:
    inst, u = model.inst, model.u
    wb = model.weight_bound()
    with np.errstate(over="ignore", invalid="ignore"):
        per = (_gamma(kv, u) + _gamma(inst.T + 1, u) + (inst.d + inst.T) * EPS64) * np.abs(model.s) * m
        out = np.sum(wb * np.abs(a) + per, axis=1) + model.tiny
        cap = 2.0 * np.max(np.abs(a), axis=1) + model.tiny if model.kind != "linear" else np.inf
    return np.minimum(np.where(np.isnan(out), np.inf, out), cap)


def compare_output(
    fn: Callable[[Instance, FloatArray], Any],
    inst: Instance,
    W: ArrayLike,
    *,
    kind: str = "softmax",
    dtype: Any = None,
    eps: float | None = None,
    logit_magnitude: ArrayLike | None = None,
    logit_terms: int | None = None,
    value_magnitude: ArrayLike | None = None,
    value_terms: int | None = None,
) -> DifferentialReport:
    """Compare ``fn(inst, W)`` (outputs ``f_i = Σ_t s_it vᵀx_it``, shape ``(n,)``) with :func:`attnsvm.output`.

    Bound ``|Δf_i| ≤ Σ_t |Δs_it||a_it| + (γ_{k_v}(u) + γ_{T+1}(u) + (d+T)·eps64)·Σ_t s_it m_it + tiny``
    (``|Δs|`` the weight bound of :func:`compare_attention`), ``m_it`` = ``value_magnitude`` (default
    ``Σ_j |v_j x_itj|``), ``k_v`` = ``value_terms`` (default ``d + 2``): for a real head whose values
    come out of ``W_O W_V x``, pass ``value_magnitude = |w_O||W_V||x|`` and the longer sum.

    Raises as :func:`compare_attention`. Scale: as :func:`compare_attention`; the values and outputs
    must be representable (else the reference's ``NumericalError``); bound capped at ``2·max|a_i|``.
    """
    require_unmasked(inst, "attnsvm.testing.compare_output")
    _check_fn(fn)
    if kind not in KINDS:
        raise unknown_name("attention kind", kind, KINDS)
    Wa = inst.check_weights(W)
    got = fn(inst, Wa.copy())
    u, tiny, name = _precision(dtype, eps, got)
    arr = _result(got, (inst.n,), "outputs")
    from ..model._attention import output

    ref = output(inst, Wa, kind=kind)
    model = _Model(inst, Wa, kind, u, tiny, logit_magnitude, logit_terms)
    a, m0 = _values(inst)
    m = _magnitude(value_magnitude, m0, "value_magnitude")
    kv = _terms(value_terms, inst.d + 2, "value_terms")
    return _report("outputs", np.abs(arr - ref), _output_bound(model, a, m, kv), u, name)


def _unit(g: FloatArray) -> FloatArray | None:
    top = float(np.max(np.abs(g)))
    if top == 0.0:
        return None
    h = g / top  # normalise by max|g| first: ||g|| squares the entries, which may underflow
    return h / float(np.linalg.norm(h))


def _log_sum(vals: FloatArray) -> float:
    """``log Σ exp(vals)`` over all entries (``−inf`` for none)."""
    fin = vals[np.isfinite(vals) | (vals > 0)]
    if fin.size == 0:
        return -math.inf
    top = float(np.max(fin))
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.sum(np.exp(fin - top))))


def _direction_bound(
    model: _Model, inst: Instance, loss: Any, kv: int, m: FloatArray, log_norm: float
) -> float:
    """Normwise bound on the unit direction (module docstring), from log-domain pair terms."""
    n, T, d = inst.shape
    u, tiny = model.u, model.tiny
    a, _ = _values(inst)
    lo = get_loss(loss)
    from ..model._attention import output

    f = output(inst, model.W)
    _, log_c = signed_log_derivative(lo, inst.Y * f)
    log_c = log_c - math.log(n)
    df = _output_bound(model, a, m, kv)
    with np.errstate(over="ignore", invalid="ignore"):
        rho = np.minimum(np.expm1(np.minimum(df, 700.0)), _CLIP) + 2 * u
        eps_w = model.rel
        assert eps_w is not None and model.log_s is not None
        ls = model.log_s
        diff = np.abs(a[:, :, None] - a[:, None, :])  # |a_t − a_u|, (n, T, T)
        acc = _gamma(n * T + T + 3, u)
        inner = diff * (eps_w[:, :, None] + eps_w[:, None, :] + rho[:, None, None] + acc) + _gamma(kv, u) * (
            m[:, :, None] + m[:, None, :]
        )
        # A weight flushed to 0 in the user's precision: its terms are lost, ≤ tiny·(|a_t − a_u| + …).
        flushed = tiny * (diff + _gamma(kv, u) * (m[:, :, None] + m[:, None, :]))
        nx = np.linalg.norm(inst.X, axis=2)
        nz = np.linalg.norm(inst.z, axis=1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lead = log_c[:, None, None] + np.log(nx)[:, :, None] + np.log(nz)[:, None, None]
        pair = lead + ls[:, :, None] + ls[:, None, :] + np.log(inner)
        lost = lead + np.logaddexp(ls[:, :, None], ls[:, None, :]) + np.log(flushed)
    off = ~np.eye(T, dtype=bool)[None].repeat(n, axis=0)
    total = np.logaddexp(_log_sum(pair[off]), _log_sum(lost[off]))
    rel = math.exp(min(total - log_norm, 700.0)) if math.isfinite(total) else (math.inf if total > 0 else 0.0)
    return min(2.0, 2.0 * rel + n * T * (d + T) * EPS64)


def compare_gradient(
    fn: Callable[[Instance, FloatArray], Any],
    inst: Instance,
    W: ArrayLike,
    *,
    loss: str = "logistic",
    dtype: Any = None,
    eps: float | None = None,
    logit_magnitude: ArrayLike | None = None,
    logit_terms: int | None = None,
    value_magnitude: ArrayLike | None = None,
    value_terms: int | None = None,
) -> DifferentialReport:
    """Compare the direction of ``fn(inst, W)`` (a risk gradient ``∇L(W)``, shape ``(d, d)``, any
    positive scale) with :func:`attnsvm.normalized_risk_grad`.

    Error: ``||ĝ/||ĝ|| − D||_F``. Bound: ``2·Σ_pairs/||∇L|| + nT(d+T)·eps64`` (at most 2), the pair
    terms of the module docstring formed in the log domain, so it is meaningful at any saturation.
    A stable float64 implementation stays within it; one that forms ``a_top − f`` as a difference
    leaves it once the runner-up weight is below ~``eps``/bound. An exactly zero ``ĝ`` (the reference
    is never zero: it raises then) has error 1, the distance from 0 to a unit vector, and a note: it
    fails unless the bound is its cap 2 (the precision cannot resolve the direction at all, e.g.
    every term flushed to 0). ``where`` is the entry of ``W`` with the largest error.

    Args:
      loss: a built-in loss name (``"logistic"``, ``"exponential"``, ``"correlation"``);
        ``|ℓ''/ℓ'| ≤ 1`` is what the bound uses.
      dtype, eps, logit_magnitude, logit_terms, value_magnitude, value_terms: as
        :func:`compare_output`.

    Raises as :func:`compare_attention`; ``NumericalError`` from the reference when the gradient is
    exactly 0 or cancels to rounding (its direction is then undefined).

    Scale: any finite data with representable logits and outputs; the bound is formed from
    log-magnitudes (exact at any saturation), capped at 2.
    """
    require_unmasked(inst, "attnsvm.testing.compare_gradient")
    _check_fn(fn)
    if not isinstance(loss, str) or loss not in LOSSES:
        raise unknown_name("loss for compare_gradient", loss, tuple(LOSSES))
    Wa = inst.check_weights(W)
    got = fn(inst, Wa.copy())
    u, tiny, name = _precision(dtype, eps, got)
    g = _result(got, (inst.d, inst.d), "gradient")
    ref = normalized_risk_grad(inst, Wa, loss=loss)
    model = _Model(inst, Wa, "softmax", u, tiny, logit_magnitude, logit_terms)
    _, m0 = _values(inst)
    m = _magnitude(value_magnitude, m0, "value_magnitude")
    kv = _terms(value_terms, inst.d + 2, "value_terms")
    bound = _direction_bound(model, inst, loss, kv, m, ref.log_norm)
    unit = _unit(g)
    note = ""
    if unit is None:
        unit = np.zeros_like(g)
        # ||0 − D|| = 1: it fails unless the bound is its cap (the precision cannot resolve the
        # direction at all, e.g. every term flushed to 0, which a stable implementation may do too).
        note = "fn returned an exactly zero gradient: it has no direction (the reference's is nonzero)"
    entry = np.abs(unit - ref.direction)
    err = float(np.linalg.norm(unit - ref.direction))
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(entry)), entry.shape))
    ratio = err / bound if err > 0 else 0.0
    return DifferentialReport(
        quantity="gradient direction",
        passed=bool(ratio <= 1.0),
        max_error=err,
        where=at,
        bound=bound,
        worst_ratio=ratio,
        worst_at=at,
        eps=u,
        dtype=name,
        errors=np.array(err),
        bounds=np.array(bound),
        note=note,
    )


# ------------------------------------------------------------------------------ saturation sweep
def runner_up_log10(inst: Instance, W: ArrayLike) -> float:
    """``log10`` of the largest runner-up softmax weight over the sequences, ``max_i s_i(2)``.

    From :func:`attnsvm.log_attention`, so it is exact far below float64's range (a runner-up of
    1e-400 gives −400). Scale: as :func:`attnsvm.log_attention`.
    """
    require_unmasked(inst, "attnsvm.testing.runner_up_log10")
    ls = log_attention(inst, W)
    return float(np.max(np.sort(ls, axis=1)[:, -2])) / math.log(10.0)


@dataclass(frozen=True)
class SweepRow:
    """One point of a saturation sweep: ``W`` scaled by ``scale``."""

    scale: float
    log10_runner_up: float
    error: float
    bound: float
    passed: bool
    note: str = ""


@dataclass(frozen=True)
class SaturationSweep:
    """Rows in the order of the scales swept, and the first one whose gradient leaves the bound.

    ``first_failure`` is that row (``None`` when every row passes); ``first_failing_runner_up`` its
    runner-up weight as ``log10`` (``None`` likewise).
    """

    rows: tuple[SweepRow, ...]
    first_failure: SweepRow | None

    @property
    def first_failing_runner_up(self) -> float | None:
        """``log10`` of the runner-up weight at the first failing row."""
        return None if self.first_failure is None else self.first_failure.log10_runner_up

    def __str__(self) -> str:
        head = f"{'scale':>10} {'runner-up':>10} {'dir. error':>11} {'bound':>10}  verdict"
        lines = [head]
        for r in self.rows:
            err = f"{r.error:11.3g}" if math.isfinite(r.error) else f"{'none':>11}"
            lines.append(
                f"{r.scale:10.4g} {f'1e{r.log10_runner_up:+.1f}':>10} {err} {r.bound:10.3g}  "
                + ("ok" if r.passed else "FAIL")
                + (f" ({r.note})" if r.note else "")
            )
        if self.first_failure is None:
            lines.append("the gradient stays within its bound at every runner-up weight swept")
        else:
            lines.append(
                f"the gradient leaves its bound at runner-up weight 1e{self.first_failure.log10_runner_up:+.1f} "
                f"(scale {self.first_failure.scale:.4g})"
            )
        return "\n".join(lines)


def gradient_saturation_sweep(
    fn: Callable[[Instance, FloatArray], Any],
    inst: Instance,
    W: ArrayLike,
    *,
    scales: Sequence[float] = DEFAULT_SWEEP_SCALES,
    loss: str = "logistic",
    dtype: Any = None,
    eps: float | None = None,
) -> SaturationSweep:
    """:func:`compare_gradient` at ``c·W`` for each ``c`` in ``scales``, against the runner-up weight.

    Saturation is measured by the runner-up weight ``r = max_i s_i(2)`` (:func:`runner_up_log10`),
    not by ``||W||``: a float64 implementation that forms ``a_top − f`` by subtraction errs by
    ``~eps/r``. A point where ``fn`` returns NaN/Inf is a failing row with a note (not an
    exception), one with an exactly zero gradient a row with a note (failing unless the bound is
    its cap); a point where the reference direction itself is undefined
    (the gradient cancels to rounding) raises the reference's ``NumericalError``.

    Scale: as :func:`compare_gradient` at each point.
    """
    require_unmasked(inst, "attnsvm.testing.gradient_saturation_sweep")
    _check_fn(fn)
    Wa = inst.check_weights(W)
    cs = [float(c) for c in scales]
    if not cs or not all(math.isfinite(c) and c > 0 for c in cs):
        raise DifferentialError(
            f"scales must be a nonempty sequence of positive finite factors; got {scales!r}"
        )
    rows = []
    for c in cs:
        Wc = c * Wa
        lr = runner_up_log10(inst, Wc)
        try:
            rep = compare_gradient(fn, inst, Wc, loss=loss, dtype=dtype, eps=eps)
            rows.append(SweepRow(c, lr, rep.max_error, rep.bound, rep.passed, rep.note))
        except DifferentialError as exc:
            if "returned" not in str(exc) or "shape" in str(exc):
                raise
            rows.append(SweepRow(c, lr, math.inf, math.nan, False, "fn returned NaN/Inf"))
    first = next((r for r in rows if not r.passed), None)
    return SaturationSweep(tuple(rows), first)
