"""The attention heads in torch, per sequence, from logits to weights or output (plain and masked)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: `import attnsvm` stays light (~1 s less)
    import torch


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


def _torch_masked_head(
    kind: str, of: str
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`_torch_head` of a masked sequence: ``head(l, a, m)`` with ``m`` boolean ``(T,)`` (``True`` =
    allowed, at least one). A masked token gets weight exactly 0 for every logit (``linear``: ``s_t = 0``;
    the normalised kinds: its base ``−inf`` before the softmax, which subtracts the finite max of the
    allowed ones, so ``e^−inf = 0`` and never ``−inf − (−inf)``), hence a 0 row and column of ``∂s/∂l``:
    the head of the sequence with the masked tokens deleted, padded with zeros."""
    import torch

    def head(l: torch.Tensor, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        if kind == "linear":
            s = torch.where(m, l, torch.zeros_like(l))
        else:
            base = (
                l
                if kind == "softmax"
                else torch.where(l > 0, torch.log1p(torch.clamp(l, min=0.0)), torch.clamp(l, max=0.0))
            )
            # (torch.where routes no gradient to the constant branch: the masked logits get none)
            s = torch.softmax(torch.where(m, base, torch.full_like(base, -math.inf)), dim=-1)
        return s if of == "weights" else (s * a).sum(dim=-1, keepdim=True)

    return head
