"""The verification harness: the experiments, the report, benchmarks, checkpoints, the command line."""

from __future__ import annotations
