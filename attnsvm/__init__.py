"""attnsvm: a checked reference implementation of attention as a max-margin token selector.

Softmax attention trained by gradient descent converges in direction to the solution of
a hard-margin SVM over tokens (Att-SVM); this package computes both exactly enough to be a
reference, and checks the claims. See ``DESIGN.md`` for the conventions.
"""

from __future__ import annotations

from .attention import KINDS, attention, log_attention, logits, output
from .errors import (
    AttnSVMError,
    InfeasibleSVMError,
    InvalidInstanceError,
    NumericalError,
    SolverError,
    TiedScoresError,
    UnknownNameError,
)
from .grad import GradDirection, normalized_risk_grad, risk, risk_grad, risk_grad_textbook
from .instance import FAMILIES, Instance, random_instance
from .lipschitz import (
    LipschitzBound,
    LipschitzEstimate,
    compare_lipschitz,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
)
from .losses import LOSSES, Loss, LossAssumptions, get_loss
from .svm import (
    SVM_METHODS,
    SVM_NORMS,
    InfeasibleMinNormError,
    KKTResiduals,
    LocalOptimalityReport,
    MinNormSolution,
    SVMSolution,
    is_locally_optimal,
    local_optimality_report,
    min_norm_dual,
    solve_svm,
)
from .tensor import svm_constraints, svm_gram, svm_margins, svm_rows, unvec, unvec_rowmajor, vec, vec_rowmajor

__version__ = "0.1.0"

__all__ = [
    "LipschitzBound",
    "LipschitzEstimate",
    "compare_lipschitz",
    "jacobian_norm",
    "lipschitz_bound",
    "lipschitz_estimate",
    "SVM_METHODS",
    "SVM_NORMS",
    "InfeasibleMinNormError",
    "KKTResiduals",
    "LocalOptimalityReport",
    "MinNormSolution",
    "SVMSolution",
    "is_locally_optimal",
    "local_optimality_report",
    "min_norm_dual",
    "solve_svm",
    "AttnSVMError",
    "FAMILIES",
    "GradDirection",
    "InfeasibleSVMError",
    "Instance",
    "InvalidInstanceError",
    "KINDS",
    "LOSSES",
    "Loss",
    "LossAssumptions",
    "NumericalError",
    "SolverError",
    "TiedScoresError",
    "UnknownNameError",
    "attention",
    "get_loss",
    "log_attention",
    "logits",
    "normalized_risk_grad",
    "output",
    "random_instance",
    "risk",
    "risk_grad",
    "risk_grad_textbook",
    "svm_constraints",
    "svm_gram",
    "svm_margins",
    "svm_rows",
    "unvec",
    "unvec_rowmajor",
    "vec",
    "vec_rowmajor",
]
