"""Beyond one machine: families as Dask tasks, and a Hypothesis example database every worker reaches.

Oracles: the serial run (a Dask run's results.json equals it exactly except timing fields; its
families' results are bitwise the serial ones), and the database itself (a counterexample saved by
one process is in the redis keys / the folder, and a fresh process running *only* Hypothesis's reuse
phase fails on it — a run that did not share the database would have nothing to replay).

These tests start a real ``distributed.LocalCluster`` and a real ``redis-server``. Where the redis
server binary is missing they skip loudly, except under ``CI=true`` (``.ci/run`` installs it), where a
missing binary or module fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attnsvm import experiments as E
from attnsvm.checkpoint import encode_result
from attnsvm.cli import main
from attnsvm.distributed import DistributedError, check_scheduler

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"
#: Two families that take well under a second at size tiny.
CHEAP = ("saturation", "convergence")
#: Seconds to wait for the test's redis-server to answer.
REDIS_START_S = 10


def need(module: str) -> Any:
    """Import ``module``; skip loudly where it is missing, fail under CI (the test extra installs it)."""
    try:
        return __import__(module)
    except ImportError:
        if IN_CI:
            pytest.fail(f"{module} is missing under CI=true: the test extra must install it")
        pytest.skip(
            f"SKIPPED (not tested here): {module} is not installed: pip install 'attnsvm[distributed]'"
        )


def cli(
    *args: str, env_extra: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "attnsvm.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """results.json without timing fields and the run's scheduling settings."""
    doc = json.loads(json.dumps(doc))
    for k in ("created", "elapsed_s", "jobs", "scheduler"):
        doc["meta"].pop(k, None)
    for fam in doc["families"].values():
        fam.pop("elapsed_s")
    for row in doc["summary"]:
        row.pop("time_s")
    return doc


def exact(res: E.FamilyResult) -> str:
    """A family's result with every float's bits (the checkpoint encoding), timing set to 0."""
    res.elapsed_s = 0.0
    return encode_result(res)


# --------------------------------------------------------------------------------- Dask
def test_reproduce_on_dask_gives_the_serial_report(tmp_path: Path) -> None:
    """``reproduce --scheduler dask --jobs 2`` (a real LocalCluster of 2 processes) writes the
    results.json of the serial run, except timing fields (oracle: the serial run), with one completion
    line per family."""
    need("distributed")
    only = ",".join(CHEAP)
    serial = cli("reproduce", "--size", "tiny", "--only", only, "--seed", "4", "--out", str(tmp_path / "s"))
    assert serial.returncode == 0, serial.stderr
    dask = cli(
        "reproduce",
        *("--size", "tiny", "--only", only, "--seed", "4", "--out", str(tmp_path / "d")),
        *("--scheduler", "dask", "--jobs", "2"),
    )
    assert dask.returncode == 0, dask.stderr
    for name in CHEAP:
        title = E.FAMILY_REGISTRY[name].title
        assert f"{title}: done" in " ".join(dask.stderr.split()), dask.stderr
    s_doc = json.loads((tmp_path / "s" / "results.json").read_text())
    d_doc = json.loads((tmp_path / "d" / "results.json").read_text())
    assert d_doc["meta"]["scheduler"] == "dask" and d_doc["meta"]["jobs"] == 2
    assert comparable(d_doc) == comparable(s_doc)
    assert list(d_doc["families"]) == list(CHEAP)
    # checkpointed as they finished, as in a local run
    assert sorted(json.loads((tmp_path / "d" / "manifest.json").read_text())["finished"]) == sorted(CHEAP)


def test_existing_scheduler_gives_bitwise_serial_results() -> None:
    """``scheduler="tcp://..."`` against a running cluster: each family's result is bitwise the serial
    one (oracle: the serial run, compared through every float's exact decimal); the task's progress
    reaches this process through the Dask queue, and the bar ends complete."""
    distributed = need("distributed")
    serial = [exact(r) for r in E.run_families("tiny", 1, names=["saturation"])]
    calls: list[tuple[int, int]] = []

    def factory(spec: E.FamilySpec) -> E.ProgressFn:
        return lambda done, total: calls.append((done, total))

    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as c:
        got = E.run_families(
            "tiny", 1, names=["saturation"], scheduler=c.scheduler_address, progress_factory=factory
        )
    assert [exact(r) for r in got] == serial
    assert calls[-1] == (1, 1) and len(calls) >= 2, calls  # ≥ 1 message from the task, then completion


def test_scheduler_errors_name_the_cause(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad --scheduler, a missing dask (named with the extra to install) and an address where no
    scheduler answers are one-line errors (exit 2), before any family runs."""
    with pytest.raises(DistributedError, match="local, dask or tcp://host:port"):
        check_scheduler("spark")
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    with pytest.raises(DistributedError, match=r"pip install 'attnsvm\[distributed\]'"):
        check_scheduler("dask")
    monkeypatch.delitem(sys.modules, "distributed")
    need("distributed")
    import attnsvm.distributed as D

    monkeypatch.setattr(D, "CONNECT_TIMEOUT_S", 1)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DistributedError, match="no Dask scheduler answers"):
        E.run_families("tiny", 0, names=["saturation"], scheduler=f"tcp://127.0.0.1:{port}")


# ------------------------------------------------------------------- example database
FAILING_PROPERTY = """
import os
from hypothesis import Phase, given, settings, strategies as st

# Second run: replay only (no generation), so a failure can come from the example database alone.
PHASES = [Phase.reuse] if os.environ.get("REPLAY_ONLY") else list(Phase)


@settings(phases=PHASES)
@given(st.integers(min_value=0))
def test_below_a_thousand(x):
    assert x < 1000
"""


def sweep_run(project: Path, db: str, *, replay_only: bool) -> subprocess.CompletedProcess[str]:
    """One pytest process running the failing property under the real properties/conftest.py (a copy),
    in the sweep profile with ATTNSVM_EXAMPLE_DB=db."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSVM_", "HYPOTHESIS_", "PYTEST_"))}
    env.update(
        {
            "ATTNSVM_HYPOTHESIS_PROFILE": "sweep",
            "ATTNSVM_EXAMPLE_DB": db,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    if replay_only:
        env["REPLAY_ONLY"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_prop.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        timeout=300,
    )


def make_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("conftest.py", "_discards.py"):
        shutil.copy(ROOT / "properties" / name, project / name)
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_prop.py").write_text(FAILING_PROPERTY)
    return project


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real redis-server on a free local port, no persistence; stopped after the test."""
    exe = shutil.which("redis-server")
    if exe is None:
        if IN_CI:
            pytest.fail("redis-server is missing under CI=true (.ci/run installs it with apt-get)")
        pytest.skip("SKIPPED (not tested here): redis-server is not installed (apt-get install redis-server)")
    redis = need("redis")
    for _ in range(5):  # a free port can be taken between the probe and the server's bind: try again
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + REDIS_START_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if proc.poll() is None:
            break
    else:
        pytest.fail("redis-server did not start on a free port in 5 tries")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_example_database_shares_a_counterexample(tmp_path: Path, redis_url: str) -> None:
    """ATTNSVM_EXAMPLE_DB=redis://... in the sweep profile: a failing property's counterexample is saved
    in the redis server (its keys) and a fresh process replays it first (oracle: the reuse phase alone
    fails with the same minimal example)."""
    import redis

    project = make_project(tmp_path)
    client = redis.Redis.from_url(redis_url)
    assert client.keys("hypothesis-example:*") == []
    first = sweep_run(project, redis_url, replay_only=False)
    assert first.returncode == 1 and "x=1000" in first.stdout, first.stdout + first.stderr
    assert "RedisExampleDatabase" in first.stdout
    assert client.keys("hypothesis-example:*"), "the counterexample was not saved in redis"
    second = sweep_run(project, redis_url, replay_only=True)
    assert second.returncode == 1 and "x=1000" in second.stdout, second.stdout + second.stderr
    assert not (project / ".hypothesis" / "examples").exists()


def test_directory_example_database_shares_a_counterexample(tmp_path: Path) -> None:
    """ATTNSVM_EXAMPLE_DB=dir:PATH: the counterexample is saved under PATH and replayed first by a
    fresh process (oracle: the reuse phase alone fails with the same minimal example)."""
    project = make_project(tmp_path)
    shared = tmp_path / "shared-db"
    first = sweep_run(project, f"dir:{shared}", replay_only=False)
    assert first.returncode == 1 and "x=1000" in first.stdout, first.stdout + first.stderr
    assert "DirectoryBasedExampleDatabase" in first.stdout and str(shared) in first.stdout
    assert any(p.is_file() for p in shared.rglob("*")), "the counterexample was not saved in the folder"
    second = sweep_run(project, f"dir:{shared}", replay_only=True)
    assert second.returncode == 1 and "x=1000" in second.stdout, second.stdout + second.stderr
    assert not (project / ".hypothesis" / "examples").exists()


def test_a_wrong_example_database_is_a_usage_error(tmp_path: Path) -> None:
    """An unknown scheme, and a redis URL where nothing answers, stop the run before any test."""
    project = make_project(tmp_path)
    bad = sweep_run(project, "ftp://somewhere", replay_only=False)
    assert bad.returncode == 4 and "use redis://host:port/db" in bad.stderr, bad.stdout + bad.stderr
    need("redis")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = sweep_run(project, f"redis://127.0.0.1:{port}/0", replay_only=False)
    assert down.returncode == 4 and "does not answer" in down.stderr, down.stdout + down.stderr


def test_reproduce_rejects_a_bad_scheduler_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["reproduce", "--size", "tiny", "--scheduler", "tcp://nohost", "--out", str(tmp_path / "r")])
        == 2
    )
    assert "tcp://host:port" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
