"""benchmarks/cuda_check.py, the prepared GPU check: its pipeline on the CPU (the eager paths as the
"device" against the fused kernel, every comparison within the 1e-8 contract), and its refusal to measure
anything without a CUDA device."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cuda_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_runs_on_the_cpu_and_every_comparison_meets_the_contract(tmp_path: Path) -> None:
    """Oracle: the contract (1e-8 relative) between two engines that share no step code (eager and fused)."""
    out = tmp_path / "rows.json"
    args = ["--device", "cpu", "--batch", "40", "--compare", "24", "--steps", "3", "--shape", "3", "4", "5"]
    assert _script().main([*args, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    compared = [r for r in rows if r["limit"] is not None]
    assert len(compared) == 7  # three W × two CPU engines, and the GD run
    assert all(r["ok"] and r["value"] <= 1e-8 for r in compared)
    assert {r["name"] for r in rows} >= {"step_ms_cpu_fused", "rate_cpu_fused"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would measure")
def test_without_cuda_nothing_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert _script().main(["--batch", "8"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
