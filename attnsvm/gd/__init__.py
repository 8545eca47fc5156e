"""Gradient descent on W: the single-run engine, the batched torch engine, regularization paths, the K-Q model."""

from __future__ import annotations

from ._engine import (
    BatchTrajectory,
    GDRecord,
    GDTrajectory,
    KQTrajectory,
    PathPoint,
    PathStep,
    RateFit,
    RegularizationPath,
    default_record_steps,
    direction_corr,
    direction_gap,
    fit_rate,
    projected_path,
    regularization_path,
    run_gd,
    run_gd_batch,
    run_gd_kq,
)

__all__ = [
    "GDRecord",
    "GDTrajectory",
    "BatchTrajectory",
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
