"""Resumable ``attnsvm reproduce``: exact checkpoints, the manifest, and a run killed mid-way.

Oracles: the original objects (a checkpoint decodes to values equal in type and bits, compared by a
strict structural walk that is not the codec), and an uninterrupted run of the same settings (the
resumed report's ``results.json`` equals it except for timing fields).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnsvm.harness import results as R
from attnsvm.harness import runner as E
from attnsvm.harness.checkpoint import (
    EXPERIMENTS_DIR,
    MANIFEST_FILE,
    CheckpointError,
    RunCheckpoint,
    decode_result,
    encode_result,
    run_settings,
)
from attnsvm.harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
#: Two experiments that take well under a second at size tiny.
CHEAP = ("saturation", "convergence")
#: The timing fields of results.json (everything else must be equal between equivalent runs).
TIMING_META = ("created", "elapsed_s")
#: Seconds to wait for the killed run to finish its cheap experiments (each takes < 1 s).
KILL_WAIT_S = 120

# An extra experiment (registered through ATTNSVM_EXTRA_EXPERIMENTS) that waits for a gate file before it
# finishes: the run is killed while it waits, i.e. after the cheap experiments and before the end.
GATE_EXPERIMENT = """
import os, time
from attnsvm.harness.results import ExperimentResult
from attnsvm.harness.runner import register_experiment

@register_experiment("gated", "Gated", "waits for $ATTNSVM_TEST_GATE", order=10_000)
def gated(size, seed, jobs, device, progress):
    while not os.path.exists(os.environ["ATTNSVM_TEST_GATE"]):
        time.sleep(0.05)
    r = ExperimentResult("gated", "Gated", "waits for $ATTNSVM_TEST_GATE")
    r.numbers["seed"] = seed
    r.claim("gate", "the gate opened", True, "opened")
    return r
"""


def same(a: Any, b: Any, path: str = "") -> None:
    """Assert ``a`` and ``b`` are equal in type and value, floats bitwise (NaN = NaN, 0.0 ≠ -0.0)."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, (float, np.floating)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"{path}: {a!r} vs {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}/{i}")
    elif hasattr(a, "__dataclass_fields__"):
        for f in a.__dataclass_fields__:
            same(getattr(a, f), getattr(b, f), f"{path}.{f}")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """results.json without timing fields (and without the run's scheduling settings)."""
    doc = json.loads(json.dumps(doc))
    for k in (*TIMING_META, "jobs", "scheduler"):
        doc["meta"].pop(k, None)
    for entry in doc["experiments"].values():
        entry.pop("elapsed_s")
    for row in doc["summary"]:
        row.pop("time_s")
    return doc


def cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "attnsvm.harness.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


# ------------------------------------------------------------------------------ codec
def test_checkpoint_round_trip_is_exact_for_every_kind_of_value() -> None:
    """Oracle: the original object, compared by a strict walk (types, dtypes, shapes, float bits)."""
    r = R.ExperimentResult("fam", "Fam", "desc")
    r.numbers = {
        "nan": float("nan"),
        "inf": -math.inf,
        "negzero": -0.0,
        "tiny": 5e-324,
        "third": 1 / 3,
        "big": 2**80,
        "np64": np.float64(0.1),
        "np32": np.float32(1 / 3),
        "npint": np.int64(-7),
        "npbool": np.bool_(True),
        "arr": np.array([[1.0, np.nan], [np.inf, -0.0]]),
        "iarr": np.arange(6, dtype=np.int32).reshape(2, 3, 1),
        "empty": np.zeros((0, 3)),
        "tup": (1, (2.5, "x"), [None, True]),
        "keys": {1: "int key", (2, 3): "tuple key", "__nd__": "a tag-like key"},
    }
    r.tables = {"t": [{"a": 1.5, "b": np.float64(np.nan), "c": "s"}]}
    r.figures = [
        R.Figure(
            "f",
            "F",
            [
                R.Panel(
                    "p", "x", "y", [R.Series("s", [1.0, 2.0], [3.0, float("nan")], lo=[0.0, 0.0], hi=[4, 5])]
                )
            ],
        )
    ]
    r.figures[0].panels[0].ylim = (0.0, None)
    r.figures[0].panels[0].hlines = [(1.0, "one")]
    r.claim("c", "statement", True, "message", severity="finding")
    r.elapsed_s = 1.25
    same(decode_result(encode_result(r)), r)


def test_checkpoint_round_trip_of_real_experiment_results() -> None:
    """The cheap experiments' real results survive the checkpoint exactly (oracle: the originals)."""
    for res in E.run_experiments("tiny", 0, names=CHEAP):
        same(decode_result(encode_result(res)), res)


def test_checkpoint_refuses_a_value_it_cannot_store_exactly() -> None:
    r = R.ExperimentResult("fam", "Fam", "desc")
    r.numbers["obj"] = object()
    with pytest.raises(CheckpointError, match=r"fam/numbers/obj: a value of type object"):
        encode_result(r)
    r.numbers["obj"] = np.array([1 + 2j])
    with pytest.raises(CheckpointError, match="complex128"):
        encode_result(r)


# ---------------------------------------------------------------------------- manifest
def test_manifest_with_other_settings_is_refused_naming_each_difference(tmp_path: Path) -> None:
    settings = run_settings(size="tiny", seed=0, device="cpu", experiments=list(CHEAP))
    ck = RunCheckpoint(tmp_path, settings)
    ck.start()
    res = R.ExperimentResult("saturation", "S", "d")
    assert ck.save(res)
    other = run_settings(size="small", seed=1, device="cpu", experiments=list(CHEAP))
    with pytest.raises(CheckpointError) as info:
        RunCheckpoint(tmp_path, other).resume()
    msg = str(info.value)
    assert "size: 'tiny' there, 'small' now" in msg and "seed: 0 there, 1 now" in msg and "--force" in msg
    assert "device" not in msg
    # The same settings resume, with the saved experiment.
    done = RunCheckpoint(tmp_path, settings).resume()
    assert list(done) == ["saturation"]


def test_crashed_or_unavailable_experiments_are_not_saved(tmp_path: Path) -> None:
    ck = RunCheckpoint(tmp_path, run_settings(size="tiny", seed=0, device="cpu", experiments=["a", "b"]))
    ck.start()
    crashed = R.ExperimentResult("a", "A", "d")
    crashed.claim("ran", "the experiment runs to completion", False, "MemoryError")
    assert not ck.save(crashed)
    assert not ck.save(R.ExperimentResult("b", "B", "d", available=False, reason="no module"))
    assert json.loads((tmp_path / MANIFEST_FILE).read_text())["finished"] == []


def test_cli_resume_and_force_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--resume needs the same settings; a non-empty folder is refused without --resume or --force;
    --force clears an interrupted run (manifest and checkpoint folder); --resume with --force is refused."""
    out = tmp_path / "r"
    args = ["reproduce", "--size", "tiny", "--only", "saturation", "--quiet", "--out", str(out)]
    assert main(args) == 0
    assert (out / EXPERIMENTS_DIR / "saturation.json").is_file()
    first = json.loads((out / "results.json").read_text())
    assert main([*args, "--resume"]) == 0  # a finished run: nothing recomputed, the same report
    assert comparable(json.loads((out / "results.json").read_text())) == comparable(first)
    capsys.readouterr()
    assert main(args) == 2
    assert "--resume continues it" in capsys.readouterr().err
    assert main([*args, "--resume", "--seed", "5"]) == 2
    assert "seed: 0 there, 5 now" in capsys.readouterr().err
    assert main([*args, "--resume", "--force"]) == 2
    assert "pass one of them" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["reproduce", "--size", "tiny", "--only", "saturation", "--out", str(other), "--resume"]) == 2
    assert f"holds no {MANIFEST_FILE}" in capsys.readouterr().err
    assert (other / "notes.txt").read_text() == "mine"
    (out / "results.json").unlink()  # an interrupted run: a manifest, no report
    assert main([*args, "--force"]) == 0
    assert json.loads((out / MANIFEST_FILE).read_text())["finished"] == ["saturation"]


def test_a_format_1_run_is_refused_by_resume_and_cleared_by_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run folder of checkpoint format 1 (before the reproduce "families" were renamed "experiments":
    folder ``families/``, settings key ``"families"``, class ``FamilyResult``), written here literally as
    that version laid it out, with this version's settings otherwise: ``--resume`` refuses it with a
    message saying what to do and touches nothing; ``--force`` clears it, old folder included."""
    from attnsvm import __version__

    out = tmp_path / "old"
    (out / "families").mkdir(parents=True)
    settings = {
        "size": "tiny",
        "seed": 0,
        "device": "cpu",
        "attnsvm": __version__,
        "families": ["saturation"],
    }
    manifest = {"format": 1, "settings": settings, "finished": ["saturation"]}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest))
    old_result = {
        "__dc__": "FamilyResult",
        "fields": {"name": "saturation", "title": "S", "description": "d"},
    }
    (out / "families" / "saturation.json").write_text(json.dumps(old_result))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["reproduce", "--size", "tiny", "--only", "saturation", "--quiet", "--out", str(out)]
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "a run of checkpoint format 1" in err and "renamed 'experiments'" in err, err
    assert "start again there with --force" in err, err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    with pytest.raises(CheckpointError, match="format 1"):
        RunCheckpoint(
            out, run_settings(size="tiny", seed=0, device="cpu", experiments=["saturation"])
        ).resume()
    assert main([*args, "--force"]) == 0
    assert not (out / "families").exists()
    doc = json.loads((out / MANIFEST_FILE).read_text())
    assert doc["format"] == 2 and doc["finished"] == ["saturation"]
    assert doc["settings"]["experiments"] == ["saturation"] and "families" not in doc["settings"]
    assert (out / EXPERIMENTS_DIR / "saturation.json").is_file()
    assert EXPERIMENTS_DIR == "experiments"


# ------------------------------------------------------------------------ killed run
def test_run_killed_midway_resumes_to_the_uninterrupted_report(tmp_path: Path) -> None:
    """Kill (SIGKILL) a run after its cheap experiments finished, resume it: the finished experiments are
    not recomputed (their elapsed_s is the saved one) and results.json equals an uninterrupted run's
    except for timing fields (oracle: the uninterrupted run)."""
    (tmp_path / "gate_experiment.py").write_text(GATE_EXPERIMENT)
    gate = tmp_path / "gate"
    env = {
        "ATTNSVM_EXTRA_EXPERIMENTS": "gate_experiment",
        "ATTNSVM_TEST_GATE": str(gate),
        "PYTHONPATH": str(ROOT) + os.pathsep + str(tmp_path),
    }
    only = ",".join((*CHEAP, "gated"))
    killed, ref = tmp_path / "killed", tmp_path / "ref"
    common = ["reproduce", "--size", "tiny", "--only", only, "--quiet", "--seed", "2"]
    proc = cli(*common, "--out", str(killed), env_extra=env)
    try:
        deadline = time.monotonic() + KILL_WAIT_S
        finished: list[str] = []
        while time.monotonic() < deadline and sorted(finished) != sorted(CHEAP):
            assert proc.poll() is None, proc.communicate()
            try:
                finished = json.loads((killed / MANIFEST_FILE).read_text())["finished"]
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        assert sorted(finished) == sorted(CHEAP), "the cheap experiments did not finish in time"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "results.json").exists()
    saved = {n: decode_result((killed / EXPERIMENTS_DIR / f"{n}.json").read_text()).elapsed_s for n in CHEAP}

    gate.write_text("")
    resumed = cli(*common, "--out", str(killed), "--resume", env_extra=env)
    r_out, r_err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, r_err
    assert f"{len(CHEAP)} of 3 experiments already finished" in r_err
    uninterrupted = cli(*common, "--out", str(ref), env_extra=env)
    _, u_err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, u_err

    doc = json.loads((killed / "results.json").read_text())
    for n in CHEAP:
        assert doc["experiments"][n]["elapsed_s"] == saved[n]  # taken from the checkpoint, not rerun
    assert comparable(doc) == comparable(json.loads((ref / "results.json").read_text()))
    assert sorted(p.name for p in killed.glob("*.csv")) == sorted(p.name for p in ref.glob("*.csv"))
    for p in ref.glob("*.csv"):
        assert (killed / p.name).read_text() == p.read_text(), p.name
