"""Lipschitz constants of attention with respect to ``W``: certified bounds and attained estimates.

The maps. The model's logits are ``l_it = x_itᵀ W z_i`` (token ``x_it`` of sequence ``i``, query
``z_i``, ``W ∈ R^{d×d}``), its weights ``s_i = softmax(l_i)`` (or ``φ(l_i)/Σ_t φ(l_it)``) and its
output ``f_i = Σ_t s_it a_it`` with the values ``a_it = vᵀx_it``. Lipschitz constants here are with
respect to ``W`` on the ball ``B_R = {W : ||W||_F ≤ R}``, Frobenius norm in, ℓ2 norm out, of

* ``of="weights"``: ``W ↦ s(W) ∈ R^{nT}`` (all attention weights, flattened);
* ``of="output"``:  ``W ↦ f(W) ∈ R^n``;

for the kinds ``softmax``, ``linear`` (``s_i = l_i``) and ``normalized_linear`` (``φ = elu + 1`` on the
logits). Below, ``vec W`` stacks the columns of ``W`` (column-major ``vec``).

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

Masks (:attr:`~attnsvm.Instance.mask`). A masked token has weight exactly 0 for every ``W``, so its
entry of ``s`` is constant and it takes no part in its sequence's weights, output or logits: sequence
``i`` acts on its ``T_i`` allowed tokens. Every function here equals the same function on the instance
with the masked tokens deleted, sequence by sequence, combined as above (the rows of ``𝓛`` and ``J`` are
those of the allowed tokens, ``Σ_i T_i`` of them; ``κ_i`` from sequence ``i``'s allowed tokens; a
sequence with one allowed token has constant weight 1 and output ``a_it`` for the normalised kinds, so
``κ_i = 0`` and its Jacobian block is 0). Masked tokens are never read (every function reads
:attr:`~attnsvm.Instance.keys`, with the masked tokens zeroed, and restricts maxima, spreads and
log-sum-exps to the allowed tokens), so their size sets no scale, norm, factor or search cap, and no
``−inf`` logit enters an arithmetic operation (the torch heads put ``−inf`` only into a softmax, after
the finite max of the allowed logits). :meth:`~attnsvm.Instance.from_sequences` instances (causal or
not) are masked instances.

Scale (issue 13's contract). Scaling ``X → 2^a X``, ``z → 2^b z`` with ``R → 2^-(a+b) R`` keeps every
logit, so the weights constant scales by ``2^(a+b)``; ``v → 2^c v`` scales the values, so the output
constant scales by ``2^(2a+b+c)``. Every function here uses this instead of refusing: the bound
carries each norm and factor as an exact pair ``m·2^e`` (no Gram entry, ``κ_i`` or ``κ_i²``
under- or overflows, and the bound is exactly — bit for bit — equivariant under power-of-two
rescaling), the estimate's search runs on the data rescaled by exact powers of two to O(1), and the
Jacobian norm (also the estimate's returned value) rescales each sequence on its own and puts the
powers of two back. A result that is not a normal double raises
:class:`~attnsvm.NumericalError` (``scaling.range_error``) naming it and float64's range; never
0, inf, NaN or a numpy ``LinAlgError``.

References: Kim, Papamakarios, Mnih, ICML 2021, arXiv 2006.04710 (Lipschitz constant of
self-attention); Katharopoulos, Vyas, Pappas, Fleuret, ICML 2020, arXiv 2006.16236 (``φ = elu + 1``);
Gao, Song, Xie, arXiv 2307.02419 (tensor trick); Tarzanagh, Li, Thrampoulidis, Oymak,
arXiv 2308.16898 (the model).
"""

from __future__ import annotations

from ._bound import SPREAD_FACTOR as SPREAD_FACTOR  # public constants outside __all__, importable as before
from ._bound import bound_rounding_rtol, lipschitz_bound
from ._checks import OFS, WRTS
from ._compare import compare_lipschitz
from ._estimate import SATURATION_LOG2 as SATURATION_LOG2
from ._estimate import lipschitz_estimate
from ._jacobian import JACOBIAN_ULPS as JACOBIAN_ULPS
from ._jacobian import jacobian_norm
from ._logit import logit_gram, logit_norm
from ._results import LipschitzBound, LipschitzEstimate

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
