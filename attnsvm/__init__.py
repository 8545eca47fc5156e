"""attnsvm: a checked reference implementation of attention as a max-margin token selector.

Softmax attention trained by gradient descent converges in direction to the solution of
a hard-margin SVM over tokens (Att-SVM); this package computes both exactly enough to be a
reference, and checks the claims. Conventions (the model, the ``vec`` order, how a key/query
projection maps onto ``W``) are in the documentation's "Theory and conventions" page
(``docs/theory.md``).
"""

from __future__ import annotations

from .attention import KINDS, attention, log_attention, logits, output
from .errors import (
    AttnSVMError,
    InfeasibleSVMError,
    InvalidInstanceError,
    MissingDependencyError,
    NumericalError,
    SolverError,
    TiedScoresError,
    UnknownNameError,
)
from .gd import (
    BatchTrajectory,
    GDRecord,
    GDTrajectory,
    KQTrajectory,
    PathPoint,
    RateFit,
    RegularizationPath,
    direction_corr,
    direction_gap,
    fit_rate,
    regularization_path,
    run_gd,
    run_gd_batch,
    run_gd_kq,
)
from .grad import GradDirection, normalized_risk_grad, risk, risk_grad, risk_grad_textbook
from .instance import FAMILIES, Instance, random_instance
from .joint import run_joint_gd, solve_joint_svm
from .lipschitz import (
    LipschitzBound,
    LipschitzEstimate,
    compare_lipschitz,
    jacobian_norm,
    lipschitz_bound,
    lipschitz_estimate,
)
from .losses import LOSSES, Loss, LossAssumptions, get_loss
from .mirror import bregman_divergence, run_mirror_descent, solve_lp_svm
from .multitoken import predict_multitoken, run_multitoken_gd, selected_sets
from .prompt import prompt_regularization_path, run_prompt_gd, solve_prompt_svm
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
from .svm_working_set import solve_svm_working_set
from .tensor import svm_constraints, svm_gram, svm_margins, svm_rows, unvec, unvec_rowmajor, vec, vec_rowmajor

__version__ = "0.1.0"

__all__ = [
    "BatchTrajectory",
    "GDRecord",
    "GDTrajectory",
    "KQTrajectory",
    "PathPoint",
    "RateFit",
    "RegularizationPath",
    "direction_corr",
    "direction_gap",
    "fit_rate",
    "regularization_path",
    "run_gd",
    "run_gd_batch",
    "run_gd_kq",
    "run_joint_gd",
    "solve_joint_svm",
    "bregman_divergence",
    "run_mirror_descent",
    "solve_lp_svm",
    "predict_multitoken",
    "run_multitoken_gd",
    "selected_sets",
    "prompt_regularization_path",
    "run_prompt_gd",
    "solve_prompt_svm",
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
    "solve_svm_working_set",
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
    "MissingDependencyError",
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
