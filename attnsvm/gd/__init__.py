"""Gradient descent on W: the single-run engine, the batched torch engine, regularization paths, the K-Q model."""

from __future__ import annotations

from ._batch import BatchTrajectory, run_gd_batch
from ._kq import KQTrajectory, run_gd_kq
from ._metrics import RateFit, direction_corr, direction_gap, fit_rate
from ._paths import PathPoint, PathStep, RegularizationPath, projected_path, regularization_path
from ._single import GDRecord, GDTrajectory, default_record_steps, run_gd
from ._torch_engine import BatchEngine

__all__ = [
    "GDRecord",
    "GDTrajectory",
    "BatchTrajectory",
    "BatchEngine",
    "PathPoint",
    "RegularizationPath",
    "KQTrajectory",
    "RateFit",
    "run_gd",
    "run_gd_batch",
    "run_gd_kq",
    "regularization_path",
    "direction_corr",
    "direction_gap",
    "fit_rate",
    "default_record_steps",
    "projected_path",
    "PathStep",
]
