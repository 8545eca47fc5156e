"""The verification harness: experiment families, the report, benchmarks, checkpoints, the command line."""

from __future__ import annotations
