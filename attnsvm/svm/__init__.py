"""The Att-SVM: the exact dual core with its certificate, the conic methods, the working-set solver, local optimality."""

from __future__ import annotations

from ._constants import (
    CERTIFY_RTOL,
    MULTIPLIER_RTOL,
    NUC_FEAS_TOL,
    ROUNDING_RTOL,
    SUPPORT_RTOL,
    SVM_METHODS,
    SVM_NORMS,
)
from ._dual import min_norm_dual
from ._optimality import LocalOptimalityReport, is_locally_optimal, local_optimality_report
from ._results import InfeasibleMinNormError, KKTResiduals, MinNormSolution, SVMSolution
from ._solve import solve_svm
from ._working_set import (
    CHUNK_MIN,
    EXACT_COND_MAX,
    FAST_COND_MAX,
    LANCZOS_TOL,
    solve_svm_working_set,
)

__all__ = [
    "SVM_METHODS",
    "SVM_NORMS",
    "CERTIFY_RTOL",
    "SUPPORT_RTOL",
    "MULTIPLIER_RTOL",
    "ROUNDING_RTOL",
    "NUC_FEAS_TOL",
    "KKTResiduals",
    "MinNormSolution",
    "InfeasibleMinNormError",
    "min_norm_dual",
    "SVMSolution",
    "solve_svm",
    "LocalOptimalityReport",
    "local_optimality_report",
    "is_locally_optimal",
    "EXACT_COND_MAX",
    "FAST_COND_MAX",
    "CHUNK_MIN",
    "LANCZOS_TOL",
    "solve_svm_working_set",
]
