"""The named tolerances of the code checks, each with the float64 error analysis that justifies it.

Errors are relative to ``max(1, max|reference|)``; the registry's claims cite these by name.
"""

from __future__ import annotations

from ..scaling import EPS

#: Closed form (lambdified SymPy) against attnsvm's vectorised NumPy, relative to
#: ``max(1, max|reference|)``. Both evaluate the same O(1)-sized expression (data drawn from
#: ``U[−1, 1]``, logits ``|l| ≤ d² ≤ 9``) with at most ~100 flops per entry; each flop adds
#: ≤ eps relative error to a partial sum bounded by the scale, and ``exp``/``log`` add
#: ≤ eps·|argument|, so each side is within ~200 eps of the exact value. 4096 eps (9.1e-13)
#: is a 10× margin, and still ~10¹² below the O(1) change a wrong convention makes.
EVAL_TOL = 2.0**12 * EPS

#: Central-difference step ``h = eps^{1/3}`` (6.1e-6), which balances truncation and rounding.
FD_STEP = EPS ** (1.0 / 3.0)

#: Central differences of attnsvm code against the proved derivative, relative to
#: ``max(1, max|reference|)``. Truncation ``≤ h²/6·|f'''|``: in ``vec(W)`` coordinates every
#: logit moves at rate ``|x_itk z_ij| ≤ 1`` (data in ``U[−1, 1]``) and third derivatives of the
#: softmax/loss compositions here are ≤ 10 per unit rate, so ≤ 6.2e-11; rounding
#: ``≤ 2·eps·|f|/(2h) ≈ 3.6e-11·|f|``. 1e-8 is a ~100× margin.
FD_TOL = 1e-8

#: Second-difference step ``h = eps^{1/4}`` (1.2e-4) for Hessians.
FD2_STEP = EPS**0.25

#: Second differences against the proved Hessian: rounding ``≤ 4·eps·|L|/h² ≈ 6e-8·|L|``,
#: truncation ``≤ h²/12·|f''''| ≈ 1.2e-9·|f''''|`` with ``|f''''| ≤ 100`` here: ≤ 2e-7;
#: 1e-5 is a ~50× margin (and ~10⁵ below the O(1) change of a wrong Hessian entry).
FD2_TOL = 1e-5
