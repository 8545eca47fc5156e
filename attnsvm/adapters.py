"""Map a real attention head onto the key–query matrix ``W`` of the Att-SVM model.

attnsvm scores key token ``x`` for query token ``z`` by ``xᵀ W z``. A transformer head with query
and key projections ``W_Q``, ``W_K`` (shape ``(d_head, d)``, as stored in ``nn.Linear(d, d_head)``),
biases ``b_q``, ``b_k`` and score scale ``c`` (``1/√d_head`` in the standard layers) computes
``q = W_Q z + b_q``, ``k = W_K x + b_k`` and the score

    kᵀq·c = c·xᵀ W_Kᵀ W_Q z  +  c·xᵀ W_Kᵀ b_q  +  c·b_kᵀ(W_Q z + b_q),

so (the last term does not depend on the key ``x``: a per-query constant, which softmax ignores
exactly and which is dropped)

    W = c · W_Kᵀ W_Q                                     (shape (d_k, d_q)),

and, when ``b_q ≠ 0``, the score is affine in ``x``: with tokens augmented by a constant
coordinate, ``x̃ = (x, 1)``, ``z̃ = (z, 1)``,

    W̃ = c · [W_K  0]ᵀ [W_Q  b_q] = [[c·W_KᵀW_Q, c·W_Kᵀb_q], [0ᵀ, 0]]     (shape (d_k+1, d_q+1)),

whose top-right column carries the ``x``-dependent bias term and whose bottom row (the per-query
constant ``c·b_kᵀ(W_Q z + b_q)``) is zero. ``W_Qᵀ W_K`` (the order a row-vector reading suggests)
is the transpose and wrong unless ``W`` is symmetric.

Supported modules (detected by their public attributes; torch and transformers are not imported
here, any object with these attributes and array-like tensors works):

* ``torch.nn.MultiheadAttention``: ``in_proj_weight`` (packed, rows ``[W_Q; W_K; W_V]``) or
  ``q_proj_weight``/``k_proj_weight`` (separate, when ``kdim``/``vdim`` differ from ``embed_dim``),
  ``in_proj_bias``, ``num_heads``, ``head_dim``; ``c = 1/√head_dim``. Head ``h`` owns rows
  ``h·head_dim … (h+1)·head_dim − 1`` of each projection.
* HuggingFace ``BertSelfAttention``-style: ``query``/``key`` linear layers, ``num_attention_heads``,
  ``attention_head_size``; ``c = scaling`` when the module has it, else ``1/√attention_head_size``.
* GPT-2-style attention: fused ``c_attn`` ``Conv1D`` with weight ``(d, 3d)`` applied as
  ``x @ weight + bias`` (the transpose of ``nn.Linear``), columns ``[Q | K | V]``; ``num_heads``,
  ``head_dim``; ``c = 1/√head_dim`` when ``scale_attn_weights`` (else 1), divided by
  ``layer_idx + 1`` when ``scale_attn_by_inverse_layer_idx``.

The causal mask of a decoder (GPT-2) is not part of ``W``: query ``k`` attends over the tokens
``t ≤ k``, i.e. the instance holds the prefix ``x_0 … x_k`` and ``z = x_k``.

Scale: any finite weights; ``W`` is formed from power-of-two mantissas of ``W_K`` and ``[W_Q b_q]``
(exact rescaling, :func:`attnsvm.scaling.pow2_split`), so no intermediate over- or underflows; each
entry to absolute error ``≲ d_head·eps·c·(|W_K|ᵀ|[W_Q b_q]|)_jk`` plus ``2^−1074`` relative to
``max|W|``. Raises :class:`~attnsvm.NumericalError` when ``max|W|`` exceeds 1.8e308 or, nonzero,
falls below 2.2e-308 (it would lose its digits).

References: Vaswani et al., NeurIPS 2017 (scaled dot-product attention); Tarzanagh, Li,
Thrampoulidis, Oymak, arXiv 2308.16898 (``W = K Qᵀ``, the model attnsvm checks).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._types import FloatArray
from .errors import AttnSVMError, InvalidInstanceError
from .scaling import pow2_split, range_error

__all__ = ["UnsupportedModuleError", "attention_matrix", "head_projections", "HeadProjections"]


_SUPPORTED = (
    "torch.nn.MultiheadAttention, HuggingFace BertSelfAttention-style modules (query/key linear "
    "layers, num_attention_heads, attention_head_size) and GPT-2-style attention (fused c_attn Conv1D, "
    "num_heads, head_dim)"
)


class UnsupportedModuleError(AttnSVMError):
    """The module is not an attention layer attnsvm can map onto ``W``, or uses a feature that
    makes its score not of the form ``xᵀ W z`` (a query bias without ``augment=True``, extra
    learned keys, relative position scores, cross-attention)."""


class HeadProjections:
    """One head's key/query projections: ``q = W_Q z + b_q``, ``k = W_K x + b_k``, score ``c·kᵀq``.

    Attributes: ``W_Q`` ``(d_head, d_q)``, ``W_K`` ``(d_head, d_k)``, ``b_q``, ``b_k`` ``(d_head,)``
    (zeros when the module has no bias), ``scale`` the score scale ``c``, ``kind`` the module type.
    """

    __slots__ = ("W_Q", "W_K", "b_q", "b_k", "scale", "kind")

    def __init__(
        self, W_Q: FloatArray, W_K: FloatArray, b_q: FloatArray, b_k: FloatArray, scale: float, kind: str
    ) -> None:
        self.W_Q, self.W_K, self.b_q, self.b_k, self.scale, self.kind = W_Q, W_K, b_q, b_k, scale, kind


# --------------------------------------------------------------------------- conversion helpers
def _array(value: Any, name: str, kind: str) -> FloatArray:
    """A float64 copy of a tensor or array, refusing non-real and non-finite values."""
    if hasattr(value, "detach"):  # a torch tensor (or parameter): leave the module untouched
        value = value.detach().cpu()
        if getattr(value, "is_complex", lambda: False)():
            raise InvalidInstanceError(f"{kind}: {name} is complex; attnsvm maps real attention heads only")
        value = value.double().numpy()
    arr = np.array(value, dtype=np.float64, copy=True)
    if not np.all(np.isfinite(arr)):
        bad = tuple(int(b) for b in np.argwhere(~np.isfinite(arr))[0])
        raise InvalidInstanceError(
            f"{kind}: {name} must be finite; found {arr[bad]} at index {bad}. "
            "The module's weights are NaN/Inf: reinitialise or reload them."
        )
    return arr


def _bias(value: Any, name: str, kind: str, size: int) -> FloatArray:
    if value is None:
        return np.zeros(size)
    arr = _array(value, name, kind)
    if arr.shape != (size,):
        raise UnsupportedModuleError(f"{kind}: {name} has shape {arr.shape}, expected ({size},)")
    return arr


def _check_head(head: object, num_heads: int, kind: str) -> int:
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)):
        raise InvalidInstanceError(f"head must be an int in [0, {num_heads}); got {head!r}")
    if not 0 <= int(head) < num_heads:
        raise InvalidInstanceError(
            f"head {int(head)} is out of range: this {kind} has {num_heads} heads, numbered 0 to {num_heads - 1}"
        )
    return int(head)


def _int_attr(module: Any, name: str, kind: str) -> int:
    val = getattr(module, name)
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or int(val) < 1:
        raise UnsupportedModuleError(f"{kind}: {name} must be a positive int; got {val!r}")
    return int(val)


# --------------------------------------------------------------------------- per-module readers
def _mha(module: Any, head: int) -> HeadProjections:
    kind = "torch.nn.MultiheadAttention"
    if getattr(module, "bias_k", None) is not None or getattr(module, "bias_v", None) is not None:
        raise UnsupportedModuleError(
            f"{kind} with add_bias_kv=True appends a learned key that is not a projected token, so its "
            "score is not of the form xᵀ W z; build the module with add_bias_kv=False"
        )
    if getattr(module, "add_zero_attn", False):
        raise UnsupportedModuleError(
            f"{kind} with add_zero_attn=True appends a zero key (score 0) that is not a projected token; "
            "build the module with add_zero_attn=False"
        )
    H = _int_attr(module, "num_heads", kind)
    dh = _int_attr(module, "head_dim", kind)
    h = _check_head(head, H, kind)
    E = H * dh
    rows = slice(h * dh, (h + 1) * dh)
    if getattr(module, "in_proj_weight", None) is not None:
        Win = _array(module.in_proj_weight, "in_proj_weight", kind)
        if Win.ndim != 2 or Win.shape[0] != 3 * E:
            raise UnsupportedModuleError(f"{kind}: in_proj_weight has shape {Win.shape}, expected (3·{E}, d)")
        W_Q, W_K = Win[:E][rows], Win[E : 2 * E][rows]
    else:
        W_Q = _array(module.q_proj_weight, "q_proj_weight", kind)[rows]
        W_K = _array(module.k_proj_weight, "k_proj_weight", kind)[rows]
    bias = getattr(module, "in_proj_bias", None)
    if bias is None:
        b_q = b_k = np.zeros(dh)
    else:
        b = _bias(bias, "in_proj_bias", kind, 3 * E)
        b_q, b_k = b[:E][rows], b[E : 2 * E][rows]
    # F.multi_head_attention_forward scales q by sqrt(1/head_dim) before q·k.
    return HeadProjections(W_Q, W_K, b_q, b_k, math.sqrt(1.0 / dh), kind)


def _bert(module: Any, head: int) -> HeadProjections:
    kind = "BertSelfAttention-style module"
    pos = getattr(module, "position_embedding_type", "absolute")
    if pos not in (None, "absolute"):
        raise UnsupportedModuleError(
            f"{kind} with position_embedding_type={pos!r} adds position-dependent scores, which are not "
            "of the form xᵀ W z; only 'absolute' (positions added to the tokens) is supported"
        )
    H = _int_attr(module, "num_attention_heads", kind)
    dh = _int_attr(module, "attention_head_size", kind)
    h = _check_head(head, H, kind)
    rows = slice(h * dh, (h + 1) * dh)
    Wq = _array(module.query.weight, "query.weight", kind)
    Wk = _array(module.key.weight, "key.weight", kind)
    if Wq.ndim != 2 or Wk.ndim != 2 or Wq.shape[0] != H * dh or Wk.shape[0] != H * dh:
        raise UnsupportedModuleError(
            f"{kind}: query.weight {Wq.shape} and key.weight {Wk.shape} must have {H}·{dh} rows"
        )
    b_q = _bias(getattr(module.query, "bias", None), "query.bias", kind, H * dh)[rows]
    b_k = _bias(getattr(module.key, "bias", None), "key.bias", kind, H * dh)[rows]
    scale = getattr(module, "scaling", None)
    c = (
        float(scale)
        if isinstance(scale, (int, float)) and not isinstance(scale, bool)
        else 1.0 / math.sqrt(dh)
    )
    return HeadProjections(Wq[rows], Wk[rows], b_q, b_k, c, kind)


def _gpt2(module: Any, head: int) -> HeadProjections:
    kind = "GPT-2-style attention"
    if getattr(module, "is_cross_attention", False) or hasattr(module, "q_attn"):
        raise UnsupportedModuleError(
            f"{kind} built with is_cross_attention=True takes queries from q_attn and keys from another "
            "sequence; only self-attention (fused c_attn) is supported"
        )
    H = _int_attr(module, "num_heads", kind)
    dh = _int_attr(module, "head_dim", kind)
    h = _check_head(head, H, kind)
    E = H * dh
    Wc = _array(module.c_attn.weight, "c_attn.weight", kind)
    if Wc.ndim != 2 or Wc.shape[1] != 3 * E:
        raise UnsupportedModuleError(f"{kind}: c_attn.weight has shape {Wc.shape}, expected (d, 3·{E})")
    b = _bias(getattr(module.c_attn, "bias", None), "c_attn.bias", kind, 3 * E)
    cols_q = slice(h * dh, (h + 1) * dh)
    cols_k = slice(E + h * dh, E + (h + 1) * dh)
    # Conv1D computes x @ weight + bias: the projection matrices are the transposed column blocks.
    W_Q, W_K = Wc[:, cols_q].T, Wc[:, cols_k].T
    c = 1.0
    if getattr(module, "scale_attn_weights", True):
        c = dh**-0.5  # as GPT2Attention: head_dim ** -0.5
    if getattr(module, "scale_attn_by_inverse_layer_idx", False):
        li = getattr(module, "layer_idx", None)
        if isinstance(li, bool) or not isinstance(li, (int, np.integer)) or int(li) < 0:
            raise UnsupportedModuleError(
                f"{kind} with scale_attn_by_inverse_layer_idx=True divides the scores by layer_idx + 1, "
                f"but layer_idx is {li!r}; build the module with its layer index (GPT2Attention(config, "
                "layer_idx=i))"
            )
        c /= float(int(li) + 1)
    return HeadProjections(W_Q, W_K, b[cols_q], b[cols_k], c, kind)


def _kind_of(module: Any) -> str:
    if hasattr(module, "c_attn") and hasattr(module, "num_heads") and hasattr(module, "head_dim"):
        return "gpt2"
    if all(hasattr(module, a) for a in ("query", "key", "num_attention_heads", "attention_head_size")):
        return "bert"
    if hasattr(module, "num_heads") and hasattr(module, "head_dim") and hasattr(module, "in_proj_weight"):
        return "mha"
    raise UnsupportedModuleError(
        f"cannot map a {type(module).__name__} onto W: supported are {_SUPPORTED}. For another layer, "
        "form W = c·W_Kᵀ W_Q from its key/query projections yourself (see docs/guide/adapters.md)"
    )


def head_projections(module: Any, head: int = 0) -> HeadProjections:
    """The key/query projections, biases and score scale of one head of ``module``.

    Raises :class:`UnsupportedModuleError` for an unknown module or feature and
    :class:`~attnsvm.InvalidInstanceError` for a bad ``head`` or non-finite weights.
    """
    reader = {"mha": _mha, "bert": _bert, "gpt2": _gpt2}[_kind_of(module)]
    return reader(module, head)


def attention_matrix(module: Any, head: int = 0, *, augment: bool = False) -> FloatArray:
    """The ``W`` with ``score(key x, query z) = xᵀ W z`` for one head of ``module`` (scale included).

    ``W = c · W_Kᵀ W_Q`` of shape ``(d_k, d_q)`` (square for self-attention); the key bias only adds
    a per-query constant, which softmax ignores, and is dropped exactly. With ``augment=True``,
    ``W̃ = [[c·W_KᵀW_Q, c·W_Kᵀb_q], [0ᵀ, 0]]`` of shape ``(d_k+1, d_q+1)`` for tokens augmented with a
    constant coordinate 1 (``x̃ = (x, 1)``, ``z̃ = (z, 1)``).

    Args:
      module: ``torch.nn.MultiheadAttention``, a HuggingFace ``BertSelfAttention``-style module or a
        GPT-2-style attention module (see the module docstring for the attributes read).
      head: the head, ``0 ≤ head < num_heads``.
      augment: return the augmented ``W̃`` (required when the head's query bias is nonzero).

    Returns:
      A new float64 array; the module is not modified.

    Raises:
      UnsupportedModuleError: unknown module, a feature whose scores are not ``xᵀ W z`` (extra
        learned or zero keys, relative positions, cross-attention), or a nonzero query bias
        without ``augment=True``.
      InvalidInstanceError: ``head`` out of range or non-finite weights.
      NumericalError: ``max|W|`` overflows or underflows float64.

    Scale: any finite weights (power-of-two mantissas, no intermediate over/underflow); each entry
    to ``≲ d_head·eps·c·(|W_K|ᵀ|[W_Q b_q]|)_jk`` absolute, plus ``2^−1074·max|W|``; raises
    NumericalError when ``max|W|`` is above 1.8e308 or, nonzero, below 2.2e-308.
    """
    p = head_projections(module, head)
    if p.W_Q.shape[0] != p.W_K.shape[0]:
        raise UnsupportedModuleError(
            f"{p.kind}: the query and key projections have {p.W_Q.shape[0]} and {p.W_K.shape[0]} rows"
        )
    if not augment and np.any(p.b_q != 0.0):
        raise UnsupportedModuleError(
            f"{p.kind} head {head} has a nonzero query bias b_q, which makes the score affine in the key "
            "token x (a term c·xᵀW_Kᵀb_q), not of the form xᵀ W z. Call attention_matrix(module, head, "
            "augment=True) and append a constant coordinate 1 to every token and query"
        )
    Q = np.concatenate([p.W_Q, p.b_q[:, None]], axis=1) if augment else p.W_Q
    # Exact power-of-two mantissas: W_K = mK·2^eK, Q = mQ·2^eQ, c = mc·2^ec with max| · | ∈ [½, 1),
    # so the product below is O(d_head) and neither overflows nor loses normal digits; the
    # exponent is put back once, by ldexp, after the range check.
    mK, eK = pow2_split(p.W_K)
    mQ, eQ = pow2_split(Q)
    mc, ec = math.frexp(p.scale)
    M = (mK.T @ mQ) * mc
    e = eK + eQ + ec
    top = float(np.max(np.abs(M), initial=0.0))
    if top > 0.0:
        # max|W| = f·2^k with f ∈ [½, 1): finite iff k ≤ 1024, normal iff k ≥ −1021 (2^−1022 = FLOAT_TINY).
        f, k = math.frexp(top)
        if not -1021 <= k + e <= 1024:
            log_top = math.log(f) + (k + e) * math.log(2.0)
            raise range_error(
                f"the attention matrix W of this {p.kind} (head {head})",
                log_top,
                remedy="Rescale the module's key/query weights (W scales with their product)",
            )
    W = np.ldexp(M, e)
    if augment:
        W = np.concatenate([W, np.zeros((1, W.shape[1]))], axis=0)
    return W
