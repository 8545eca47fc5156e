"""Helpers for testing your own attention code against attnsvm's float64 reference.

:mod:`attnsvm.testing.differential` compares a callable ``fn(inst, W)`` that returns attention
weights, outputs or a risk gradient with the reference, under a float64 (or the implementation's
own precision) error model, and reports the largest error, where it is and the bound there. See
``docs/guide/differential.md``.
"""

from __future__ import annotations

from .differential import (
    DEFAULT_SWEEP_SCALES,
    DifferentialError,
    DifferentialReport,
    SaturationSweep,
    SweepRow,
    compare_attention,
    compare_gradient,
    compare_output,
    gradient_saturation_sweep,
    head_logit_magnitude,
    runner_up_log10,
)

__all__ = [
    "DEFAULT_SWEEP_SCALES",
    "DifferentialError",
    "DifferentialReport",
    "SaturationSweep",
    "SweepRow",
    "compare_attention",
    "compare_gradient",
    "compare_output",
    "gradient_saturation_sweep",
    "head_logit_magnitude",
    "runner_up_log10",
]
